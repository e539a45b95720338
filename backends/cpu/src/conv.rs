//! Conv2D and its two gradients: im2col / col2im + gemm, NCHW, parallel over the batch.

use crate::matmul::{gemm_checked, gemm_par, Dst, Src};
use crate::real::Real;
use crate::util::{for_chunks, Ctx, KResult};
use rayon::prelude::*;
use shardc_ir::geometry::{conv2d_geometry, Conv2dGeometry};
use shardc_runtime::{Arg, Tensor};

/// Images per partial sum of the filter gradient (fixed, so results do not depend on threads).
const FILTER_GRAD_BATCH_CHUNK: usize = 4;

/// The `ow` range `[lo, hi)` with `0 <= ow * s + off < w`, clamped to `[0, n)`.
fn valid_range(off: isize, s: usize, w: usize, n: usize) -> (usize, usize) {
    let s = s as isize;
    let lo = if off >= 0 { 0 } else { ((-off) + s - 1) / s };
    let last = w as isize - 1 - off;
    let hi = if last < 0 { 0 } else { last / s + 1 };
    let hi = (hi.max(0) as usize).min(n);
    let lo = (lo as usize).min(hi);
    (lo, hi)
}

/// Derived sizes of a convolution used by the im2col kernels.
trait ConvDims {
    /// Channels per group.
    fn cg(&self) -> usize;
    /// Output channels per group.
    fn og(&self) -> usize;
    /// Rows of the im2col matrix of one group: `cg * kh * kw`.
    fn kdim(&self) -> usize;
    /// Output pixels per image.
    fn p(&self) -> usize;
    /// Whether im2col is the identity (1x1 kernel, stride 1, no padding).
    fn pointwise(&self) -> bool;
}

impl ConvDims for Conv2dGeometry {
    /// Channels per group.
    fn cg(&self) -> usize {
        self.c_in / self.group
    }
    /// Output channels per group.
    fn og(&self) -> usize {
        self.c_out / self.group
    }
    /// Rows of the im2col matrix of one group: `cg * kh * kw`.
    fn kdim(&self) -> usize {
        self.cg() * self.kh * self.kw
    }
    /// Output pixels per image.
    fn p(&self) -> usize {
        self.out_h * self.out_w
    }
    /// Whether im2col is the identity (1x1 kernel, stride 1, no padding).
    fn pointwise(&self) -> bool {
        self.kh == 1
            && self.kw == 1
            && self.stride_h == 1
            && self.stride_w == 1
            && self.pad_top == 0
            && self.pad_left == 0
            && self.out_h == self.h
            && self.out_w == self.w
    }
}

/// Writes the im2col matrix `(cg * kh * kw, out_h * out_w)` of channels `c0..c0 + cg` of one
/// image `x` `(C, H, W)` into `col`.
fn im2col<T: Real>(g: &Conv2dGeometry, x: &[T], c0: usize, col: &mut [T]) {
    let (h, w, p) = (g.h, g.w, g.p());
    for c in 0..g.cg() {
        let plane = &x[(c0 + c) * h * w..][..h * w];
        for i in 0..g.kh {
            for j in 0..g.kw {
                let row = &mut col[((c * g.kh + i) * g.kw + j) * p..][..p];
                let off = (j * g.dil_w) as isize - g.pad_left as isize;
                let (lo, hi) = valid_range(off, g.stride_w, w, g.out_w);
                for oh in 0..g.out_h {
                    let ih = (oh * g.stride_h + i * g.dil_h) as isize - g.pad_top as isize;
                    let r = &mut row[oh * g.out_w..][..g.out_w];
                    if ih < 0 || ih >= h as isize {
                        r.fill(T::ZERO);
                        continue;
                    }
                    let src = &plane[ih as usize * w..][..w];
                    r[..lo].fill(T::ZERO);
                    r[hi..].fill(T::ZERO);
                    if g.stride_w == 1 {
                        let start = (lo as isize + off) as usize;
                        r[lo..hi].copy_from_slice(&src[start..start + (hi - lo)]);
                    } else {
                        for (ow, v) in r.iter_mut().enumerate().take(hi).skip(lo) {
                            *v = src[((ow * g.stride_w) as isize + off) as usize];
                        }
                    }
                }
            }
        }
    }
}

/// Adds the im2col-shaped `col` back into channels `c0..c0 + cg` of one image `dx`.
fn col2im<T: Real>(g: &Conv2dGeometry, col: &[T], c0: usize, dx: &mut [T]) {
    let (h, w, p) = (g.h, g.w, g.p());
    for c in 0..g.cg() {
        let plane = &mut dx[(c0 + c) * h * w..][..h * w];
        for i in 0..g.kh {
            for j in 0..g.kw {
                let row = &col[((c * g.kh + i) * g.kw + j) * p..][..p];
                let off = (j * g.dil_w) as isize - g.pad_left as isize;
                let (lo, hi) = valid_range(off, g.stride_w, w, g.out_w);
                for oh in 0..g.out_h {
                    let ih = (oh * g.stride_h + i * g.dil_h) as isize - g.pad_top as isize;
                    if ih < 0 || ih >= h as isize {
                        continue;
                    }
                    let r = &row[oh * g.out_w..][..g.out_w];
                    let dst = &mut plane[ih as usize * w..][..w];
                    for (ow, &v) in r.iter().enumerate().take(hi).skip(lo) {
                        dst[((ow * g.stride_w) as isize + off) as usize] += v;
                    }
                }
            }
        }
    }
}

fn geometry(ctx: &Ctx<'_>, x: &[usize], w: &[usize]) -> KResult<Conv2dGeometry> {
    conv2d_geometry(ctx.node, x, w).map_err(|e| ctx.err(e.reason))
}

fn shape_operand(ctx: &Ctx<'_>, inputs: &[Arg<'_>], i: usize, what: &str) -> KResult<Vec<usize>> {
    let v = ctx.ints(inputs, i)?;
    ctx.ensure(v.len() == 4 && v.iter().all(|&d| d >= 0), || {
        format!("{what} must be 4 non-negative sizes, got {v:?}")
    })?;
    Ok(v.iter().map(|&d| d as usize).collect())
}

/// Forward pass of one image: `y_n (O, P) = W_g · im2col(x_n)` per group.
fn conv_image<T: Real>(
    ctx: &Ctx<'_>,
    g: &Conv2dGeometry,
    x: &[T],
    w: &[T],
    y: &mut [T],
    col: &mut [T],
    par: gemm::Parallelism,
) -> KResult {
    let (k, p, og) = (g.kdim(), g.p(), g.og());
    for gi in 0..g.group {
        let b = if g.pointwise() {
            &x[gi * g.cg() * p..][..k * p]
        } else {
            im2col(g, x, gi * g.cg(), col);
            &col[..k * p]
        };
        gemm_checked(
            ctx,
            (og, p, k),
            Dst {
                data: &mut y[gi * og * p..][..og * p],
                rs: p,
                cs: 1,
                accumulate: false,
            },
            Src {
                data: &w[gi * og * k..][..og * k],
                rs: k,
                cs: 1,
            },
            Src {
                data: b,
                rs: p,
                cs: 1,
            },
            par,
        )?;
    }
    Ok(())
}

/// `Conv2D(x, w)`.
pub(crate) fn conv2d<T: Real>(
    ctx: &Ctx<'_>,
    inputs: &[Arg<'_>],
    outputs: &mut [Tensor],
) -> KResult {
    let (sx, x) = ctx.data::<T>(inputs, 0)?;
    let (sw, w) = ctx.data::<T>(inputs, 1)?;
    let g = geometry(ctx, sx, sw)?;
    let out_shape = ctx.out_shape(outputs, 0)?;
    ctx.check_shape("the result", &out_shape, &[g.n, g.c_out, g.out_h, g.out_w])?;
    let y = ctx.out::<T>(outputs, 0)?;
    let (img_in, img_out) = (g.c_in * g.h * g.w, g.c_out * g.p());
    if img_out == 0 {
        return Ok(());
    }
    let col_len = if g.pointwise() { 0 } else { g.kdim() * g.p() };
    let work = g.n * img_out * g.kdim();
    if g.n > 1 && ctx.par.parallel(work) {
        y.par_chunks_mut(img_out).enumerate().try_for_each_init(
            || vec![T::ZERO; col_len],
            |col, (n, yn)| {
                conv_image(
                    ctx,
                    &g,
                    &x[n * img_in..][..img_in],
                    w,
                    yn,
                    col,
                    gemm::Parallelism::None,
                )
            },
        )
    } else {
        let mut col = vec![T::ZERO; col_len];
        let par = gemm_par(ctx.par, work);
        for (n, yn) in y.chunks_mut(img_out).enumerate() {
            conv_image(ctx, &g, &x[n * img_in..][..img_in], w, yn, &mut col, par)?;
        }
        Ok(())
    }
}

/// Input gradient of one image: `dcol = W_g^T · dy_n`, then col2im.
fn conv_input_grad_image<T: Real>(
    ctx: &Ctx<'_>,
    g: &Conv2dGeometry,
    dy: &[T],
    w: &[T],
    dx: &mut [T],
    col: &mut [T],
    par: gemm::Parallelism,
) -> KResult {
    let (k, p, og) = (g.kdim(), g.p(), g.og());
    let pointwise = g.pointwise();
    if !pointwise {
        dx.fill(T::ZERO);
    }
    for gi in 0..g.group {
        let a = Src {
            data: &w[gi * og * k..][..og * k],
            rs: 1,
            cs: k,
        };
        let b = Src {
            data: &dy[gi * og * p..][..og * p],
            rs: p,
            cs: 1,
        };
        if pointwise {
            let dst = &mut dx[gi * g.cg() * p..][..k * p];
            gemm_checked(
                ctx,
                (k, p, og),
                Dst {
                    data: dst,
                    rs: p,
                    cs: 1,
                    accumulate: false,
                },
                a,
                b,
                par,
            )?;
        } else {
            gemm_checked(
                ctx,
                (k, p, og),
                Dst {
                    data: &mut col[..k * p],
                    rs: p,
                    cs: 1,
                    accumulate: false,
                },
                a,
                b,
                par,
            )?;
            col2im(g, col, gi * g.cg(), dx);
        }
    }
    Ok(())
}

/// `Conv2DBackpropInput(dy, w, input_size)`.
pub(crate) fn conv2d_backprop_input<T: Real>(
    ctx: &Ctx<'_>,
    inputs: &[Arg<'_>],
    outputs: &mut [Tensor],
) -> KResult {
    let (sdy, dy) = ctx.data::<T>(inputs, 0)?;
    let (sw, w) = ctx.data::<T>(inputs, 1)?;
    let x_shape = shape_operand(ctx, inputs, 2, "input_size")?;
    let g = geometry(ctx, &x_shape, sw)?;
    ctx.check_shape("dy", sdy, &[g.n, g.c_out, g.out_h, g.out_w])?;
    let out_shape = ctx.out_shape(outputs, 0)?;
    ctx.check_shape("the result", &out_shape, &x_shape)?;
    let dx = ctx.out::<T>(outputs, 0)?;
    let (img_in, img_out) = (g.c_in * g.h * g.w, g.c_out * g.p());
    if img_in == 0 {
        return Ok(());
    }
    let col_len = if g.pointwise() { 0 } else { g.kdim() * g.p() };
    let work = g.n * img_out * g.kdim();
    if g.n > 1 && ctx.par.parallel(work) {
        dx.par_chunks_mut(img_in).enumerate().try_for_each_init(
            || vec![T::ZERO; col_len],
            |col, (n, dxn)| {
                conv_input_grad_image(
                    ctx,
                    &g,
                    &dy[n * img_out..][..img_out],
                    w,
                    dxn,
                    col,
                    gemm::Parallelism::None,
                )
            },
        )
    } else {
        let mut col = vec![T::ZERO; col_len];
        let par = gemm_par(ctx.par, work);
        for (n, dxn) in dx.chunks_mut(img_in).enumerate() {
            conv_input_grad_image(
                ctx,
                &g,
                &dy[n * img_out..][..img_out],
                w,
                dxn,
                &mut col,
                par,
            )?;
        }
        Ok(())
    }
}

/// Filter gradient summed over images `n0..n1` into `dw` (overwritten).
#[allow(clippy::too_many_arguments)]
fn conv_filter_grad_range<T: Real>(
    ctx: &Ctx<'_>,
    g: &Conv2dGeometry,
    dy: &[T],
    x: &[T],
    (n0, n1): (usize, usize),
    dw: &mut [T],
    col: &mut [T],
    par: gemm::Parallelism,
) -> KResult {
    let (k, p, og) = (g.kdim(), g.p(), g.og());
    let (img_in, img_out) = (g.c_in * g.h * g.w, g.c_out * p);
    if n0 == n1 {
        dw.fill(T::ZERO);
    }
    for n in n0..n1 {
        let xn = &x[n * img_in..][..img_in];
        let dyn_ = &dy[n * img_out..][..img_out];
        for gi in 0..g.group {
            let b_data = if g.pointwise() {
                &xn[gi * g.cg() * p..][..k * p]
            } else {
                im2col(g, xn, gi * g.cg(), col);
                &col[..k * p]
            };
            gemm_checked(
                ctx,
                (og, k, p),
                Dst {
                    data: &mut dw[gi * og * k..][..og * k],
                    rs: k,
                    cs: 1,
                    accumulate: n > n0,
                },
                Src {
                    data: &dyn_[gi * og * p..][..og * p],
                    rs: p,
                    cs: 1,
                },
                Src {
                    data: b_data,
                    rs: 1,
                    cs: p,
                },
                par,
            )?;
        }
    }
    Ok(())
}

/// `Conv2DBackpropFilter(dy, x, filter_size)`.
pub(crate) fn conv2d_backprop_filter<T: Real>(
    ctx: &Ctx<'_>,
    inputs: &[Arg<'_>],
    outputs: &mut [Tensor],
) -> KResult {
    let (sdy, dy) = ctx.data::<T>(inputs, 0)?;
    let (sx, x) = ctx.data::<T>(inputs, 1)?;
    let w_shape = shape_operand(ctx, inputs, 2, "filter_size")?;
    let g = geometry(ctx, sx, &w_shape)?;
    ctx.check_shape("dy", sdy, &[g.n, g.c_out, g.out_h, g.out_w])?;
    let out_shape = ctx.out_shape(outputs, 0)?;
    ctx.check_shape("the result", &out_shape, &w_shape)?;
    let dw = ctx.out::<T>(outputs, 0)?;
    let wlen = dw.len();
    if wlen == 0 {
        return Ok(());
    }
    let col_len = if g.pointwise() { 0 } else { g.kdim() * g.p() };
    let work = g.n * g.c_out * g.p() * g.kdim();
    let chunks = g.n.div_ceil(FILTER_GRAD_BATCH_CHUNK).max(1);
    let range = |c: usize| {
        let n0 = c * FILTER_GRAD_BATCH_CHUNK;
        (n0.min(g.n), (n0 + FILTER_GRAD_BATCH_CHUNK).min(g.n))
    };
    if chunks == 1 {
        let mut col = vec![T::ZERO; col_len];
        return conv_filter_grad_range(
            ctx,
            &g,
            dy,
            x,
            range(0),
            dw,
            &mut col,
            gemm_par(ctx.par, work),
        );
    }
    // One partial sum per fixed chunk of images, then the partials summed in order.
    let mut partials = vec![T::ZERO; chunks * wlen];
    if ctx.par.parallel(work) {
        partials
            .par_chunks_mut(wlen)
            .enumerate()
            .try_for_each_init(
                || vec![T::ZERO; col_len],
                |col, (c, part)| {
                    conv_filter_grad_range(
                        ctx,
                        &g,
                        dy,
                        x,
                        range(c),
                        part,
                        col,
                        gemm::Parallelism::None,
                    )
                },
            )?;
    } else {
        let mut col = vec![T::ZERO; col_len];
        for (c, part) in partials.chunks_mut(wlen).enumerate() {
            conv_filter_grad_range(
                ctx,
                &g,
                dy,
                x,
                range(c),
                part,
                &mut col,
                gemm::Parallelism::None,
            )?;
        }
    }
    let parts = &partials;
    for_chunks(
        ctx.par,
        dw,
        crate::util::ELEMWISE_CHUNK,
        wlen * chunks,
        |ci, out| {
            let base = ci * crate::util::ELEMWISE_CHUNK;
            for (j, o) in out.iter_mut().enumerate() {
                let mut s = parts[base + j];
                for c in 1..chunks {
                    s += parts[c * wlen + base + j];
                }
                *o = s;
            }
        },
    );
    Ok(())
}
