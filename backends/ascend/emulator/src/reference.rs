//! Plain reference math on dense row-major arrays: the emulator's own implementation of each
//! aclnn op (never shardc's CPU kernels, so tests of the backend against it are not circular).
//!
//! Values are f32; sums (matmul, convolution, reductions, normalisation statistics) accumulate
//! in f64 and round once. Shapes are `&[i64]`.

use crate::tensor::numel;

/// numpy broadcast of two shapes, or None when they do not broadcast.
pub fn broadcast_shape(a: &[i64], b: &[i64]) -> Option<Vec<i64>> {
    let r = a.len().max(b.len());
    let mut out = vec![0; r];
    for i in 0..r {
        let x = if i + a.len() >= r {
            a[i + a.len() - r]
        } else {
            1
        };
        let y = if i + b.len() >= r {
            b[i + b.len() - r]
        } else {
            1
        };
        out[i] = if x == y || y == 1 {
            x
        } else if x == 1 {
            y
        } else {
            return None;
        };
    }
    Some(out)
}

/// Materialises `vals` of shape `from` broadcast to shape `to` (which it must broadcast to).
pub fn expand(vals: &[f32], from: &[i64], to: &[i64]) -> Vec<f32> {
    if from == to {
        return vals.to_vec();
    }
    let r = to.len();
    let mut strides = vec![0i64; r];
    let cs = crate::tensor::contiguous_strides(from);
    for i in 0..from.len() {
        let j = i + r - from.len();
        strides[j] = if from[i] == 1 { 0 } else { cs[i] };
    }
    let n = numel(to);
    let mut out = Vec::with_capacity(n);
    let mut idx = vec![0i64; r];
    let mut off = 0i64;
    for _ in 0..n {
        out.push(vals[off as usize]);
        for k in (0..r).rev() {
            idx[k] += 1;
            off += strides[k];
            if idx[k] < to[k] {
                break;
            }
            off -= strides[k] * to[k];
            idx[k] = 0;
        }
    }
    out
}

/// Element-wise binary op with numpy broadcasting; returns values of shape `out`.
pub fn binary(
    a: &[f32],
    ash: &[i64],
    b: &[f32],
    bsh: &[i64],
    out: &[i64],
    f: impl Fn(f32, f32) -> f32,
) -> Vec<f32> {
    let a = expand(a, ash, out);
    let b = expand(b, bsh, out);
    a.iter().zip(&b).map(|(&x, &y)| f(x, y)).collect()
}

/// Shape of `torch.matmul(a, b)`, or None when the shapes do not fit.
pub fn matmul_shape(a: &[i64], b: &[i64]) -> Option<Vec<i64>> {
    if a.is_empty() || b.is_empty() {
        return None;
    }
    let (a2, b2) = (pad_mat(a, true), pad_mat(b, false));
    let (m, k) = (a2[a2.len() - 2], a2[a2.len() - 1]);
    let (k2, n) = (b2[b2.len() - 2], b2[b2.len() - 1]);
    if k != k2 {
        return None;
    }
    let batch = broadcast_shape(&a2[..a2.len() - 2], &b2[..b2.len() - 2])?;
    let mut out = batch;
    if a.len() > 1 {
        out.push(m);
    }
    if b.len() > 1 {
        out.push(n);
    }
    Some(out)
}

fn pad_mat(s: &[i64], left: bool) -> Vec<i64> {
    match (s.len(), left) {
        (1, true) => vec![1, s[0]],
        (1, false) => vec![s[0], 1],
        _ => s.to_vec(),
    }
}

/// `torch.matmul(a, b)` with batch broadcasting; `out` is [`matmul_shape`]'s result.
pub fn matmul(a: &[f32], ash: &[i64], b: &[f32], bsh: &[i64]) -> Vec<f32> {
    let (a2, b2) = (pad_mat(ash, true), pad_mat(bsh, false));
    let (m, k) = (a2[a2.len() - 2] as usize, a2[a2.len() - 1] as usize);
    let n = b2[b2.len() - 1] as usize;
    let batch = broadcast_shape(&a2[..a2.len() - 2], &b2[..b2.len() - 2]).unwrap_or_default();
    let mut afull = batch.clone();
    afull.extend([m as i64, k as i64]);
    let mut bfull = batch.clone();
    bfull.extend([k as i64, n as i64]);
    let a = expand(a, &a2, &afull);
    let b = expand(b, &b2, &bfull);
    let nb = numel(&batch);
    let mut out = vec![0f32; nb * m * n];
    // Each output element is Σ_p a[i,p]·b[p,j] in increasing p, accumulated in f64 (the row
    // is accumulated p-outer for the cache; the order per element is the same).
    let mut acc = vec![0f64; n];
    for bi in 0..nb {
        let (ao, bo, oo) = (bi * m * k, bi * k * n, bi * m * n);
        for i in 0..m {
            acc.iter_mut().for_each(|x| *x = 0.0);
            for p in 0..k {
                let av = a[ao + i * k + p] as f64;
                let brow = &b[bo + p * n..bo + (p + 1) * n];
                for (x, &bv) in acc.iter_mut().zip(brow) {
                    *x += av * bv as f64;
                }
            }
            for (o, &x) in out[oo + i * n..oo + (i + 1) * n].iter_mut().zip(&acc) {
                *o = x as f32;
            }
        }
    }
    out
}

/// How a reduction combines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reduce {
    /// Sum.
    Sum,
    /// Mean.
    Mean,
    /// Maximum.
    Max,
    /// Minimum.
    Min,
}

/// Normalises possibly negative `dims` against rank `r`; None when one is out of range.
pub fn norm_dims(dims: &[i64], r: usize) -> Option<Vec<usize>> {
    let mut out = Vec::new();
    for &d in dims {
        let d = if d < 0 { d + r as i64 } else { d };
        if d < 0 || (d as usize >= r && !(r == 0 && d == 0)) {
            return None;
        }
        if !out.contains(&(d as usize)) {
            out.push(d as usize);
        }
    }
    Some(out)
}

/// Reduces `vals` of shape `sh` over `dims` (all when empty); returns values and the output
/// shape (reduced dims kept as 1 when `keep`).
pub fn reduce(
    vals: &[f32],
    sh: &[i64],
    dims: &[usize],
    keep: bool,
    op: Reduce,
) -> (Vec<f32>, Vec<i64>) {
    let all: Vec<usize> = if dims.is_empty() {
        (0..sh.len()).collect()
    } else {
        dims.to_vec()
    };
    let kept: Vec<i64> = sh
        .iter()
        .enumerate()
        .map(|(i, &d)| if all.contains(&i) { 1 } else { d })
        .collect();
    let n_out = numel(&kept);
    let cnt = (numel(sh) / n_out.max(1)).max(1);
    let init = match op {
        Reduce::Sum | Reduce::Mean => 0.0,
        Reduce::Max => f64::NEG_INFINITY,
        Reduce::Min => f64::INFINITY,
    };
    let mut acc = vec![init; n_out];
    let ks = crate::tensor::contiguous_strides(&kept);
    let r = sh.len();
    let mut idx = vec![0i64; r];
    for &v in vals {
        let mut o = 0i64;
        for k in 0..r {
            if kept[k] != 1 {
                o += idx[k] * ks[k];
            }
        }
        let a = &mut acc[o as usize];
        let v = v as f64;
        match op {
            Reduce::Sum | Reduce::Mean => *a += v,
            Reduce::Max => {
                if v > *a || v.is_nan() {
                    *a = v
                }
            }
            Reduce::Min => {
                if v < *a || v.is_nan() {
                    *a = v
                }
            }
        }
        for k in (0..r).rev() {
            idx[k] += 1;
            if idx[k] < sh[k] {
                break;
            }
            idx[k] = 0;
        }
    }
    if op == Reduce::Mean {
        for a in &mut acc {
            *a /= cnt as f64;
        }
    }
    let out_shape = if keep {
        kept
    } else {
        sh.iter()
            .enumerate()
            .filter(|(i, _)| !all.contains(i))
            .map(|(_, &d)| d)
            .collect()
    };
    (acc.into_iter().map(|v| v as f32).collect(), out_shape)
}

/// Splits `sh` around axis `d`: (outer, len, inner).
pub fn around(sh: &[i64], d: usize) -> (usize, usize, usize) {
    let outer = numel(&sh[..d]);
    let len = sh[d].max(0) as usize;
    let inner = numel(&sh[d + 1..]);
    (outer, len, inner)
}

/// Softmax (or log-softmax) along axis `d`.
pub fn softmax(x: &[f32], sh: &[i64], d: usize, log: bool) -> Vec<f32> {
    let (o, l, i) = around(sh, d);
    let mut y = vec![0f32; x.len()];
    for a in 0..o {
        for c in 0..i {
            let at = |k: usize| a * l * i + k * i + c;
            let m = (0..l).map(|k| x[at(k)]).fold(f32::NEG_INFINITY, f32::max);
            let s: f64 = (0..l).map(|k| ((x[at(k)] - m) as f64).exp()).sum();
            for k in 0..l {
                let z = (x[at(k)] - m) as f64;
                y[at(k)] = if log {
                    (z - s.ln()) as f32
                } else {
                    (z.exp() / s) as f32
                };
            }
        }
    }
    y
}

/// Gradient of softmax (or log-softmax) along `d` given the forward output `y`.
pub fn softmax_backward(g: &[f32], y: &[f32], sh: &[i64], d: usize, log: bool) -> Vec<f32> {
    let (o, l, i) = around(sh, d);
    let mut dx = vec![0f32; g.len()];
    for a in 0..o {
        for c in 0..i {
            let at = |k: usize| a * l * i + k * i + c;
            if log {
                let s: f64 = (0..l).map(|k| g[at(k)] as f64).sum();
                for k in 0..l {
                    dx[at(k)] = (g[at(k)] as f64 - (y[at(k)] as f64).exp() * s) as f32;
                }
            } else {
                let s: f64 = (0..l).map(|k| g[at(k)] as f64 * y[at(k)] as f64).sum();
                for k in 0..l {
                    dx[at(k)] = (y[at(k)] as f64 * (g[at(k)] as f64 - s)) as f32;
                }
            }
        }
    }
    dx
}

/// Layer norm over the trailing `inner` elements of each of `outer` rows: (y, mean, rstd).
pub fn layer_norm(
    x: &[f32],
    outer: usize,
    inner: usize,
    w: Option<&[f32]>,
    b: Option<&[f32]>,
    eps: f64,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let mut y = vec![0f32; x.len()];
    let mut mean = vec![0f32; outer];
    let mut rstd = vec![0f32; outer];
    for r in 0..outer {
        let row = &x[r * inner..(r + 1) * inner];
        let m: f64 = row.iter().map(|&v| v as f64).sum::<f64>() / inner as f64;
        let var: f64 = row.iter().map(|&v| (v as f64 - m).powi(2)).sum::<f64>() / inner as f64;
        let rs = 1.0 / (var + eps).sqrt();
        mean[r] = m as f32;
        rstd[r] = rs as f32;
        for j in 0..inner {
            let mut v = (row[j] as f64 - m) * rs;
            if let Some(w) = w {
                v *= w[j] as f64;
            }
            if let Some(b) = b {
                v += b[j] as f64;
            }
            y[r * inner + j] = v as f32;
        }
    }
    (y, mean, rstd)
}

/// Layer norm backward: (dx, dw, db).
pub fn layer_norm_backward(
    g: &[f32],
    x: &[f32],
    outer: usize,
    inner: usize,
    mean: &[f32],
    rstd: &[f32],
    w: Option<&[f32]>,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let mut dx = vec![0f32; x.len()];
    let mut dw = vec![0f64; inner];
    let mut db = vec![0f64; inner];
    for r in 0..outer {
        let (m, rs) = (mean[r] as f64, rstd[r] as f64);
        let mut s1 = 0f64;
        let mut s2 = 0f64;
        for j in 0..inner {
            let xh = (x[r * inner + j] as f64 - m) * rs;
            let gy = g[r * inner + j] as f64;
            dw[j] += gy * xh;
            db[j] += gy;
            let gw = gy * w.map_or(1.0, |w| w[j] as f64);
            s1 += gw;
            s2 += gw * xh;
        }
        for j in 0..inner {
            let xh = (x[r * inner + j] as f64 - m) * rs;
            let gw = g[r * inner + j] as f64 * w.map_or(1.0, |w| w[j] as f64);
            dx[r * inner + j] = (rs * (gw - s1 / inner as f64 - xh * s2 / inner as f64)) as f32;
        }
    }
    (
        dx,
        dw.into_iter().map(|v| v as f32).collect(),
        db.into_iter().map(|v| v as f32).collect(),
    )
}

/// Per-channel statistics of `x` of shape `[N, C, *]`: (mean, biased variance).
pub fn channel_stats(x: &[f32], n: usize, c: usize, hw: usize) -> (Vec<f64>, Vec<f64>) {
    let cnt = (n * hw).max(1) as f64;
    let mut mean = vec![0f64; c];
    let mut var = vec![0f64; c];
    for ch in 0..c {
        let mut s = 0f64;
        for b in 0..n {
            for p in 0..hw {
                s += x[(b * c + ch) * hw + p] as f64;
            }
        }
        let m = s / cnt;
        let mut v = 0f64;
        for b in 0..n {
            for p in 0..hw {
                v += (x[(b * c + ch) * hw + p] as f64 - m).powi(2);
            }
        }
        mean[ch] = m;
        var[ch] = v / cnt;
    }
    (mean, var)
}

/// Convolution geometry of one spatial axis.
#[derive(Clone, Copy, Debug)]
pub struct Axis {
    /// Input length.
    pub input: usize,
    /// Kernel length.
    pub kernel: usize,
    /// Stride.
    pub stride: usize,
    /// Padding before (and after).
    pub pad: usize,
    /// Dilation.
    pub dilation: usize,
}

impl Axis {
    /// Output length (floor), or None when the kernel does not fit.
    pub fn out(&self) -> Option<usize> {
        let span = self.dilation * (self.kernel.max(1) - 1) + 1;
        let full = self.input + 2 * self.pad;
        (full >= span && self.stride > 0).then(|| (full - span) / self.stride + 1)
    }

    /// Output length of a pooling window with `ceil` mode (PyTorch's rule: the last window
    /// must start inside the input or the left padding).
    pub fn pool_out(&self, ceil: bool) -> Option<usize> {
        let span = self.dilation * (self.kernel.max(1) - 1) + 1;
        let full = self.input + 2 * self.pad;
        if full < span || self.stride == 0 {
            return None;
        }
        let num = full - span;
        let mut o = if ceil {
            num.div_ceil(self.stride)
        } else {
            num / self.stride
        } + 1;
        if ceil && (o - 1) * self.stride >= self.input + self.pad {
            o -= 1;
        }
        Some(o)
    }
}

/// 2-d convolution geometry: batch, channels, groups and the two spatial axes.
#[derive(Clone, Copy, Debug)]
pub struct Conv {
    /// Batch.
    pub n: usize,
    /// Input channels.
    pub c: usize,
    /// Output channels.
    pub o: usize,
    /// Groups.
    pub groups: usize,
    /// Height axis.
    pub h: Axis,
    /// Width axis.
    pub w: Axis,
}

impl Conv {
    fn dims(&self) -> (usize, usize, usize, usize, usize, usize) {
        let oh = self.h.out().unwrap_or(0);
        let ow = self.w.out().unwrap_or(0);
        (
            self.c / self.groups,
            self.o / self.groups,
            oh,
            ow,
            self.h.kernel,
            self.w.kernel,
        )
    }

    /// For output position `(oy, ky)` on axis `a`, the input index if inside.
    fn at(a: &Axis, o: usize, k: usize) -> Option<usize> {
        let p = (o * a.stride + k * a.dilation) as i64 - a.pad as i64;
        (p >= 0 && (p as usize) < a.input).then_some(p as usize)
    }

    /// Forward: x `[N,C,H,W]`, w `[O,C/g,KH,KW]` → `[N,O,OH,OW]`.
    pub fn forward(&self, x: &[f32], w: &[f32], bias: Option<&[f32]>) -> Vec<f32> {
        let (cg, og, oh, ow, kh, kw) = self.dims();
        let (ih, iw) = (self.h.input, self.w.input);
        let mut y = vec![0f32; self.n * self.o * oh * ow];
        for b in 0..self.n {
            for oc in 0..self.o {
                let g = oc / og;
                for oy in 0..oh {
                    for ox in 0..ow {
                        let mut s = bias.map_or(0.0, |bb| bb[oc] as f64);
                        for ic in 0..cg {
                            let c = g * cg + ic;
                            for ky in 0..kh {
                                let Some(iy) = Self::at(&self.h, oy, ky) else {
                                    continue;
                                };
                                for kx in 0..kw {
                                    let Some(ix) = Self::at(&self.w, ox, kx) else {
                                        continue;
                                    };
                                    s += x[((b * self.c + c) * ih + iy) * iw + ix] as f64
                                        * w[((oc * cg + ic) * kh + ky) * kw + kx] as f64;
                                }
                            }
                        }
                        y[((b * self.o + oc) * oh + oy) * ow + ox] = s as f32;
                    }
                }
            }
        }
        y
    }

    /// Backward: (dx, dw, db) from the output gradient `gy`.
    pub fn backward(&self, gy: &[f32], x: &[f32], w: &[f32]) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let (cg, og, oh, ow, kh, kw) = self.dims();
        let (ih, iw) = (self.h.input, self.w.input);
        let mut dx = vec![0f64; x.len()];
        let mut dw = vec![0f64; w.len()];
        let mut db = vec![0f64; self.o];
        for b in 0..self.n {
            for oc in 0..self.o {
                let g = oc / og;
                for oy in 0..oh {
                    for ox in 0..ow {
                        let gv = gy[((b * self.o + oc) * oh + oy) * ow + ox] as f64;
                        db[oc] += gv;
                        for ic in 0..cg {
                            let c = g * cg + ic;
                            for ky in 0..kh {
                                let Some(iy) = Self::at(&self.h, oy, ky) else {
                                    continue;
                                };
                                for kx in 0..kw {
                                    let Some(ix) = Self::at(&self.w, ox, kx) else {
                                        continue;
                                    };
                                    let xi = ((b * self.c + c) * ih + iy) * iw + ix;
                                    let wi = ((oc * cg + ic) * kh + ky) * kw + kx;
                                    dx[xi] += gv * w[wi] as f64;
                                    dw[wi] += gv * x[xi] as f64;
                                }
                            }
                        }
                    }
                }
            }
        }
        let f = |v: Vec<f64>| v.into_iter().map(|x| x as f32).collect::<Vec<f32>>();
        (f(dx), f(dw), f(db))
    }
}

/// 2-d pooling geometry over `[N*C, H, W]` planes.
#[derive(Clone, Copy, Debug)]
pub struct Pool {
    /// Number of planes (N·C).
    pub planes: usize,
    /// Height axis.
    pub h: Axis,
    /// Width axis.
    pub w: Axis,
    /// Output height.
    pub oh: usize,
    /// Output width.
    pub ow: usize,
}

impl Pool {
    /// Max pooling: values and flat `h*W+w` indices of the maxima within each plane.
    pub fn max(&self, x: &[f32]) -> (Vec<f32>, Vec<i64>) {
        let (ih, iw) = (self.h.input, self.w.input);
        let n = self.planes * self.oh * self.ow;
        let mut y = vec![0f32; n];
        let mut idx = vec![0i64; n];
        for p in 0..self.planes {
            for oy in 0..self.oh {
                for ox in 0..self.ow {
                    let mut best = f32::NEG_INFINITY;
                    let mut bi = -1i64;
                    for ky in 0..self.h.kernel {
                        let Some(iy) = Conv::at(&self.h, oy, ky) else {
                            continue;
                        };
                        for kx in 0..self.w.kernel {
                            let Some(ix) = Conv::at(&self.w, ox, kx) else {
                                continue;
                            };
                            let v = x[(p * ih + iy) * iw + ix];
                            if v > best || v.is_nan() || bi < 0 {
                                best = v;
                                bi = (iy * iw + ix) as i64;
                            }
                        }
                    }
                    let o = (p * self.oh + oy) * self.ow + ox;
                    y[o] = best;
                    idx[o] = bi;
                }
            }
        }
        (y, idx)
    }

    /// Max pooling backward: scatters `gy` to the recorded indices.
    pub fn max_backward(&self, gy: &[f32], idx: &[i64]) -> Vec<f32> {
        let plane = self.h.input * self.w.input;
        let mut dx = vec![0f32; self.planes * plane];
        for p in 0..self.planes {
            for o in 0..self.oh * self.ow {
                let k = p * self.oh * self.ow + o;
                let i = idx[k];
                if i >= 0 && (i as usize) < plane {
                    dx[p * plane + i as usize] += gy[k];
                }
            }
        }
        dx
    }

    fn window(
        &self,
        oy: usize,
        ox: usize,
        include_pad: bool,
        divisor: Option<i64>,
    ) -> (Vec<(usize, usize)>, f64) {
        let (a, b) = (&self.h, &self.w);
        let y0 = (oy * a.stride) as i64 - a.pad as i64;
        let x0 = (ox * b.stride) as i64 - b.pad as i64;
        let y1 = (y0 + a.kernel as i64).min((a.input + a.pad) as i64);
        let x1 = (x0 + b.kernel as i64).min((b.input + b.pad) as i64);
        let pool_size = (y1 - y0) * (x1 - x0);
        let (ys, xs) = (y0.max(0), x0.max(0));
        let (ye, xe) = (y1.min(a.input as i64), x1.min(b.input as i64));
        let mut cells = Vec::new();
        for y in ys..ye {
            for x in xs..xe {
                cells.push((y as usize, x as usize));
            }
        }
        let div = match divisor {
            Some(d) if d != 0 => d as f64,
            _ if include_pad => pool_size as f64,
            _ => ((ye - ys) * (xe - xs)) as f64,
        };
        (cells, div)
    }

    /// Average pooling (PyTorch's rules for padding, ceil mode and divisor override).
    pub fn avg(&self, x: &[f32], include_pad: bool, divisor: Option<i64>) -> Vec<f32> {
        let (ih, iw) = (self.h.input, self.w.input);
        let mut y = vec![0f32; self.planes * self.oh * self.ow];
        for p in 0..self.planes {
            for oy in 0..self.oh {
                for ox in 0..self.ow {
                    let (cells, div) = self.window(oy, ox, include_pad, divisor);
                    let s: f64 = cells
                        .iter()
                        .map(|&(a, b)| x[(p * ih + a) * iw + b] as f64)
                        .sum();
                    y[(p * self.oh + oy) * self.ow + ox] = (s / div) as f32;
                }
            }
        }
        y
    }

    /// Average pooling backward.
    pub fn avg_backward(&self, gy: &[f32], include_pad: bool, divisor: Option<i64>) -> Vec<f32> {
        let (ih, iw) = (self.h.input, self.w.input);
        let mut dx = vec![0f64; self.planes * ih * iw];
        for p in 0..self.planes {
            for oy in 0..self.oh {
                for ox in 0..self.ow {
                    let (cells, div) = self.window(oy, ox, include_pad, divisor);
                    let g = gy[(p * self.oh + oy) * self.ow + ox] as f64 / div;
                    for (a, b) in cells {
                        dx[(p * ih + a) * iw + b] += g;
                    }
                }
            }
        }
        dx.into_iter().map(|v| v as f32).collect()
    }
}

/// Permutes `x` of shape `sh` by `perm` (output dim `i` is input dim `perm[i]`).
pub fn permute(x: &[f32], sh: &[i64], perm: &[usize]) -> Vec<f32> {
    let cs = crate::tensor::contiguous_strides(sh);
    let dims: Vec<i64> = perm.iter().map(|&p| sh[p]).collect();
    let strides: Vec<i64> = perm.iter().map(|&p| cs[p]).collect();
    let t = crate::tensor::TensorDesc {
        dims,
        strides,
        offset: 0,
        dtype: crate::dtype::DType::F32,
        format: 2,
        storage: sh.to_vec(),
        data: 0,
    };
    t.offsets().into_iter().map(|o| x[o]).collect()
}

/// tanh-approximated GELU.
pub fn gelu_tanh(x: f32) -> f32 {
    let x = x as f64;
    let k = (2.0 / std::f64::consts::PI).sqrt();
    (0.5 * x * (1.0 + (k * (x + 0.044715 * x * x * x)).tanh())) as f32
}

/// Derivative of the tanh-approximated GELU.
pub fn gelu_tanh_grad(x: f32) -> f32 {
    let x = x as f64;
    let k = (2.0 / std::f64::consts::PI).sqrt();
    let u = k * (x + 0.044715 * x * x * x);
    let t = u.tanh();
    let du = k * (1.0 + 3.0 * 0.044715 * x * x);
    (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du) as f32
}

/// Exact (erf) GELU.
pub fn gelu_erf(x: f32) -> f32 {
    let x = x as f64;
    (0.5 * x * (1.0 + erf(x / std::f64::consts::SQRT_2))) as f32
}

/// Derivative of the exact GELU.
pub fn gelu_erf_grad(x: f32) -> f32 {
    let x = x as f64;
    let cdf = 0.5 * (1.0 + erf(x / std::f64::consts::SQRT_2));
    let pdf = (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt();
    (cdf + x * pdf) as f32
}

/// erf to double precision (Abramowitz–Stegun 7.1.26 is too coarse; this uses a series /
/// continued fraction split).
pub fn erf(x: f64) -> f64 {
    if x < 0.0 {
        return -erf(-x);
    }
    if x < 2.5 {
        // Maclaurin series.
        let mut sum = x;
        let mut term = x;
        let x2 = x * x;
        let mut n = 0.0;
        loop {
            n += 1.0;
            term *= -x2 / n;
            let add = term / (2.0 * n + 1.0);
            sum += add;
            if add.abs() < 1e-17 * sum.abs() {
                break;
            }
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    } else {
        // Continued fraction for erfc.
        let mut f = 0.0;
        for k in (1..60).rev() {
            f = (k as f64 / 2.0) / (x + f);
        }
        1.0 - (-x * x).exp() / std::f64::consts::PI.sqrt() / (x + f)
    }
}

/// The logistic function.
pub fn sigmoid(x: f32) -> f32 {
    (1.0 / (1.0 + (-(x as f64)).exp())) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matmul_batch_broadcast() {
        // [2,1,2] x [2,1] -> [2,1,1]
        let a = [1., 2., 3., 4.];
        let b = [10., 1.];
        assert_eq!(matmul_shape(&[2, 1, 2], &[2, 1]).unwrap(), vec![2, 1, 1]);
        assert_eq!(matmul(&a, &[2, 1, 2], &b, &[2, 1]), vec![12., 34.]);
        assert!(matmul_shape(&[2, 3], &[2, 3]).is_none());
    }

    #[test]
    fn reduce_and_softmax() {
        let x = [1., 2., 3., 4., 5., 6.];
        let (s, sh) = reduce(&x, &[2, 3], &[1], false, Reduce::Sum);
        assert_eq!((s, sh), (vec![6., 15.], vec![2]));
        let (m, sh) = reduce(&x, &[2, 3], &[0], true, Reduce::Max);
        assert_eq!((m, sh), (vec![4., 5., 6.], vec![1, 3]));
        let y = softmax(&[0., 0.], &[2], 0, false);
        assert_eq!(y, vec![0.5, 0.5]);
    }

    #[test]
    fn erf_values() {
        assert!((erf(0.5) - 0.520_499_877_813_046_5).abs() < 1e-14);
        assert!((erf(3.0) - 0.999_977_909_503_001_4).abs() < 1e-14);
    }
}
