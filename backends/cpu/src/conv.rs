//! Conv2D and its two gradients: im2col / col2im + gemm, NCHW.
//!
//! 3×3 stride-1 `same` convolutions with one group and at least 8 input channels go to
//! [`crate::conv_winograd`] (Winograd F(2×2, 3×3)) instead; everything else comes here.
//!
//! The batch is cut into blocks of images whose size depends only on the shapes. A block's
//! im2col matrices sit side by side in one `(C·kh·kw) × (B·P)` matrix, so each group needs one
//! large GEMM per block instead of one skinny GEMM per image (late ResNet stages have only 16
//! output pixels per image). Blocks run in parallel when there are enough of them, otherwise
//! the GEMMs use every thread; either way no float sum is split in a thread-dependent way, so
//! results are bit-identical for every thread count.

use crate::conv_winograd;
use crate::matmul::{gemm_checked, gemm_par, Dst, Src};
use crate::real::Real;
use crate::util::{for_chunks, give_vec, take_vec, Ctx, KResult};
use rayon::prelude::*;
use shardc_ir::geometry::{conv2d_geometry, Conv2dGeometry};
use shardc_runtime::{Arg, Tensor};

/// Columns (images × output pixels) a forward / input-gradient block aims for.
const BLOCK_COLS: usize = 1024;
/// Columns a filter-gradient block aims for (the columns are its GEMM's contraction).
const FILTER_BLOCK_COLS: usize = 4096;
/// Most elements of one block's im2col matrix.
const BLOCK_ELEMS: usize = 1 << 22;

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
    /// Rows of the im2col matrix of every group: `c_in * kh * kw`.
    fn rows(&self) -> usize;
    /// Output pixels per image.
    fn p(&self) -> usize;
    /// Whether im2col is the identity (1x1 kernel, stride 1, no padding).
    fn pointwise(&self) -> bool;
    /// Images per block, for blocks aiming at `target` columns (depends on shapes only).
    fn block(&self, target: usize) -> usize;
}

impl ConvDims for Conv2dGeometry {
    fn cg(&self) -> usize {
        self.c_in / self.group
    }
    fn og(&self) -> usize {
        self.c_out / self.group
    }
    fn kdim(&self) -> usize {
        self.cg() * self.kh * self.kw
    }
    fn rows(&self) -> usize {
        self.c_in * self.kh * self.kw
    }
    fn p(&self) -> usize {
        self.out_h * self.out_w
    }
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
    fn block(&self, target: usize) -> usize {
        let p = self.p().max(1);
        let by_cols = target.div_ceil(p);
        let by_mem = BLOCK_ELEMS / (self.rows() * p).max(1);
        by_cols.min(by_mem).clamp(1, self.n.max(1))
    }
}

/// Zeroes a slice that is usually one or two elements long (a padding border) without a
/// call to `memset`.
#[inline(always)]
fn zero_small<T: Real>(r: &mut [T]) {
    match r.len() {
        0 => {}
        1 => r[0] = T::ZERO,
        2 => {
            r[0] = T::ZERO;
            r[1] = T::ZERO;
        }
        _ => r.fill(T::ZERO),
    }
}

/// One im2col row `(out_h * out_w)` of kernel tap `(i, ·)` with horizontal offset `off` and
/// valid output columns `lo..hi`, for unit strides and `out_w == w`: the valid part is one
/// shifted copy of the input plane, then the columns that fall in the left or right padding
/// are zeroed.
fn im2col_row_unit_stride<T: Real>(
    g: &Conv2dGeometry,
    plane: &[T],
    row: &mut [T],
    i: usize,
    off: isize,
    (lo, hi): (usize, usize),
) {
    let w = g.w;
    let dy = (i * g.dil_h) as isize - g.pad_top as isize;
    let oh_lo = (-dy).clamp(0, g.out_h as isize) as usize;
    let oh_hi = (g.h as isize - dy).clamp(oh_lo as isize, g.out_h as isize) as usize;
    row[..oh_lo * w].fill(T::ZERO);
    row[oh_hi * w..].fill(T::ZERO);
    let valid = &mut row[oh_lo * w..oh_hi * w];
    if valid.is_empty() {
        return;
    }
    if lo >= hi {
        valid.fill(T::ZERO);
        return;
    }
    // Output element `d` of the row reads input element `d + shift` of the plane.
    let shift = dy * w as isize + off;
    let base = (oh_lo * w) as isize;
    let d0 = (-shift - base).max(0) as usize;
    let d1 = ((plane.len() as isize - shift - base).max(0) as usize).min(valid.len());
    if d0 < d1 {
        let s0 = (base + d0 as isize + shift) as usize;
        valid[d0..d1].copy_from_slice(&plane[s0..s0 + (d1 - d0)]);
        // Anything outside d0..d1 lies in the padding columns, zeroed below.
    } else {
        valid.fill(T::ZERO);
    }
    if lo > 0 || hi < w {
        for r in valid.chunks_exact_mut(w) {
            zero_small(&mut r[..lo]);
            zero_small(&mut r[hi..]);
        }
    }
}

/// Writes the im2col matrix `(c_in * kh * kw, out_h * out_w)` of one image `x` `(C, H, W)`
/// into `col`, whose rows are `ld` apart.
fn im2col<T: Real>(g: &Conv2dGeometry, x: &[T], col: &mut [T], ld: usize) {
    let (h, w, p) = (g.h, g.w, g.p());
    let unit = g.stride_h == 1 && g.stride_w == 1 && g.out_w == w;
    for c in 0..g.c_in {
        let plane = &x[c * h * w..][..h * w];
        for i in 0..g.kh {
            for j in 0..g.kw {
                let row = &mut col[((c * g.kh + i) * g.kw + j) * ld..][..p];
                let off = (j * g.dil_w) as isize - g.pad_left as isize;
                let (lo, hi) = valid_range(off, g.stride_w, w, g.out_w);
                if unit {
                    im2col_row_unit_stride(g, plane, row, i, off, (lo, hi));
                    continue;
                }
                for oh in 0..g.out_h {
                    let ih = (oh * g.stride_h + i * g.dil_h) as isize - g.pad_top as isize;
                    let r = &mut row[oh * g.out_w..][..g.out_w];
                    if ih < 0 || ih >= h as isize {
                        r.fill(T::ZERO);
                        continue;
                    }
                    let src = &plane[ih as usize * w..][..w];
                    zero_small(&mut r[..lo]);
                    zero_small(&mut r[hi..]);
                    if g.stride_w == 1 {
                        let start = (lo as isize + off) as usize;
                        r[lo..hi].copy_from_slice(&src[start..start + (hi - lo)]);
                    } else {
                        let s = g.stride_w;
                        let start = (lo as isize * s as isize + off) as usize;
                        for (v, &e) in r[lo..hi].iter_mut().zip(src[start..].iter().step_by(s)) {
                            *v = e;
                        }
                    }
                }
            }
        }
    }
}

/// Writes the sum of the im2col-shaped `col` (rows `ld` apart) into one image `dx`
/// (overwritten).
fn col2im<T: Real>(g: &Conv2dGeometry, col: &[T], ld: usize, dx: &mut [T]) {
    let (h, w, p) = (g.h, g.w, g.p());
    dx.fill(T::ZERO);
    for c in 0..g.c_in {
        let plane = &mut dx[c * h * w..][..h * w];
        for i in 0..g.kh {
            for j in 0..g.kw {
                let row = &col[((c * g.kh + i) * g.kw + j) * ld..][..p];
                let off = (j * g.dil_w) as isize - g.pad_left as isize;
                let (lo, hi) = valid_range(off, g.stride_w, w, g.out_w);
                if lo >= hi {
                    continue;
                }
                for oh in 0..g.out_h {
                    let ih = (oh * g.stride_h + i * g.dil_h) as isize - g.pad_top as isize;
                    if ih < 0 || ih >= h as isize {
                        continue;
                    }
                    let r = &row[oh * g.out_w..][lo..hi];
                    let dst = &mut plane[ih as usize * w..][..w];
                    let s = g.stride_w;
                    let start = (lo as isize * s as isize + off) as usize;
                    if s == 1 {
                        for (d, &v) in dst[start..start + r.len()].iter_mut().zip(r) {
                            *d += v;
                        }
                    } else {
                        for (d, &v) in dst[start..].iter_mut().step_by(s).zip(r) {
                            *d += v;
                        }
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

/// Scratch buffers of one worker: an im2col matrix and an `(O, B·P)` matrix. Their contents
/// are unspecified (reused between calls): every user overwrites what it reads.
struct Scratch<T: Real> {
    col: Vec<T>,
    mat: Vec<T>,
}

impl<T: Real> Scratch<T> {
    fn new(g: &Conv2dGeometry, b: usize) -> Self {
        let cols = b * g.p();
        let batched = b > 1;
        let col_len = if g.pointwise() && !batched {
            0
        } else {
            g.rows() * cols
        };
        let mat_len = if batched { g.c_out * cols } else { 0 };
        Scratch {
            col: if col_len > 0 {
                take_vec(col_len)
            } else {
                Vec::new()
            },
            mat: if mat_len > 0 {
                take_vec(mat_len)
            } else {
                Vec::new()
            },
        }
    }
}

impl<T: Real> Drop for Scratch<T> {
    fn drop(&mut self) {
        give_vec(std::mem::take(&mut self.col));
        give_vec(std::mem::take(&mut self.mat));
    }
}

/// Copies the `(O, P)` matrices of the images in `src` (consecutive `(O, P)` blocks) side by
/// side into `mat` `(O, B·P)`.
fn gather<T: Real>(src: &[T], o: usize, p: usize, mat: &mut [T]) {
    let b = src.len() / (o * p).max(1);
    let cols = b * p;
    for (bi, img) in src.chunks(o * p).enumerate() {
        for (oi, row) in img.chunks(p).enumerate() {
            mat[oi * cols + bi * p..][..p].copy_from_slice(row);
        }
    }
}

/// Runs `f(first_image, block_slice, scratch)` over the blocks of `b` images, cutting `data`
/// into blocks of `b * unit` elements; in parallel (serial GEMMs) when there are enough
/// blocks, otherwise serially with `par` for the GEMMs.
fn for_blocks<T: Real, F>(
    ctx: &Ctx<'_>,
    g: &Conv2dGeometry,
    data: &mut [T],
    unit: usize,
    b: usize,
    work: usize,
    f: F,
) -> KResult
where
    F: Fn(usize, &mut [T], &mut Scratch<T>, gemm::Parallelism) -> KResult + Sync + Send,
{
    let blocks = g.n.div_ceil(b);
    if ctx.par.parallel(work) && blocks >= ctx.par.threads {
        data.par_chunks_mut(b * unit).enumerate().try_for_each_init(
            || Scratch::new(g, b),
            |s, (bi, d)| f(bi * b, d, s, gemm::Parallelism::None),
        )
    } else {
        let mut s = Scratch::new(g, b);
        let par = gemm_par(ctx.par, work);
        for (bi, d) in data.chunks_mut(b * unit).enumerate() {
            f(bi * b, d, &mut s, par)?;
        }
        Ok(())
    }
}

/// Forward pass of the images `n0..n0 + y.len() / img_out`: `Y (O, B·P) = W_g · cols`.
#[allow(clippy::too_many_arguments)]
fn conv_block<T: Real>(
    ctx: &Ctx<'_>,
    g: &Conv2dGeometry,
    x: &[T],
    w: &[T],
    n0: usize,
    y: &mut [T],
    s: &mut Scratch<T>,
    par: gemm::Parallelism,
) -> KResult {
    let (k, p, og, cg) = (g.kdim(), g.p(), g.og(), g.cg());
    let (img_in, img_out) = (g.c_in * g.h * g.w, g.c_out * p);
    let b = y.len() / img_out;
    let cols = b * p;
    let xb = &x[n0 * img_in..][..b * img_in];
    let direct_x = g.pointwise() && b == 1;
    if !direct_x {
        for (bi, xn) in xb.chunks(img_in).enumerate() {
            im2col(g, xn, &mut s.col[bi * p..], cols);
        }
    }
    let (rhs, rhs_group): (&[T], usize) = if direct_x {
        (xb, cg * p)
    } else {
        (&s.col[..g.rows() * cols], k * cols)
    };
    let dst: &mut [T] = if b == 1 { &mut *y } else { &mut s.mat[..] };
    for gi in 0..g.group {
        gemm_checked(
            ctx,
            (og, cols, k),
            Dst {
                data: &mut dst[gi * og * cols..][..og * cols],
                rs: cols,
                cs: 1,
                accumulate: false,
            },
            Src {
                data: &w[gi * og * k..][..og * k],
                rs: k,
                cs: 1,
            },
            Src {
                data: &rhs[gi * rhs_group..][..k * cols],
                rs: cols,
                cs: 1,
            },
            par,
        )?;
    }
    if b > 1 {
        for (bi, yn) in y.chunks_mut(img_out).enumerate() {
            for (oi, row) in yn.chunks_mut(p).enumerate() {
                row.copy_from_slice(&s.mat[oi * cols + bi * p..][..p]);
            }
        }
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
    let img_out = g.c_out * g.p();
    if img_out == 0 || g.n == 0 {
        return Ok(());
    }
    if conv_winograd::applies(&g) {
        return conv_winograd::forward(ctx, &g, x, w, y);
    }
    let work = g.n * img_out * g.kdim();
    let b = g.block(BLOCK_COLS);
    for_blocks(ctx, &g, y, img_out, b, work, |n0, yb, s, par| {
        conv_block(ctx, &g, x, w, n0, yb, s, par)
    })
}

/// Input gradient of the images `n0..n0 + dx.len() / img_in`: `dcols = W_g^T · dY`, then
/// col2im.
#[allow(clippy::too_many_arguments)]
fn input_grad_block<T: Real>(
    ctx: &Ctx<'_>,
    g: &Conv2dGeometry,
    dy: &[T],
    w: &[T],
    n0: usize,
    dx: &mut [T],
    s: &mut Scratch<T>,
    par: gemm::Parallelism,
) -> KResult {
    let (k, p, og, cg) = (g.kdim(), g.p(), g.og(), g.cg());
    let (img_in, img_out) = (g.c_in * g.h * g.w, g.c_out * p);
    let b = dx.len() / img_in;
    let cols = b * p;
    let dyb = &dy[n0 * img_out..][..b * img_out];
    let rhs: &[T] = if b == 1 {
        dyb
    } else {
        gather(dyb, g.c_out, p, &mut s.mat);
        &s.mat[..g.c_out * cols]
    };
    let direct_dx = g.pointwise() && b == 1;
    for gi in 0..g.group {
        let a = Src {
            data: &w[gi * og * k..][..og * k],
            rs: 1,
            cs: k,
        };
        let bm = Src {
            data: &rhs[gi * og * cols..][..og * cols],
            rs: cols,
            cs: 1,
        };
        let dst: &mut [T] = if direct_dx {
            &mut dx[gi * cg * p..][..k * p]
        } else {
            &mut s.col[gi * k * cols..][..k * cols]
        };
        gemm_checked(
            ctx,
            (k, cols, og),
            Dst {
                data: dst,
                rs: cols,
                cs: 1,
                accumulate: false,
            },
            a,
            bm,
            par,
        )?;
    }
    if !direct_dx {
        for (bi, dxn) in dx.chunks_mut(img_in).enumerate() {
            col2im(g, &s.col[bi * p..], cols, dxn);
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
    if img_in == 0 || g.n == 0 {
        return Ok(());
    }
    if conv_winograd::applies(&g) {
        return conv_winograd::backprop_input(ctx, &g, dy, w, dx);
    }
    let work = g.n * img_out * g.kdim();
    let b = g.block(BLOCK_COLS);
    for_blocks(ctx, &g, dx, img_in, b, work, |n0, dxb, s, par| {
        input_grad_block(ctx, &g, dy, w, n0, dxb, s, par)
    })
}

/// Filter gradient of the images `n0..n1` into `dw` (overwritten): one GEMM per group,
/// `dW_g = dY_g (og, B·P) · cols_g^T`, the images' pixels forming the contraction.
#[allow(clippy::too_many_arguments)]
fn filter_grad_block<T: Real>(
    ctx: &Ctx<'_>,
    g: &Conv2dGeometry,
    dy: &[T],
    x: &[T],
    (n0, n1): (usize, usize),
    dw: &mut [T],
    s: &mut Scratch<T>,
    par: gemm::Parallelism,
) -> KResult {
    let (k, p, og, cg) = (g.kdim(), g.p(), g.og(), g.cg());
    let (img_in, img_out) = (g.c_in * g.h * g.w, g.c_out * p);
    let b = n1 - n0;
    let cols = b * p;
    let dyb = &dy[n0 * img_out..][..b * img_out];
    let xb = &x[n0 * img_in..][..b * img_in];
    let lhs: &[T] = if b == 1 {
        dyb
    } else {
        gather(dyb, g.c_out, p, &mut s.mat);
        &s.mat[..g.c_out * cols]
    };
    let direct_x = g.pointwise() && b == 1;
    if !direct_x {
        for (bi, xn) in xb.chunks(img_in).enumerate() {
            im2col(g, xn, &mut s.col[bi * p..], cols);
        }
    }
    let (rhs, rhs_group): (&[T], usize) = if direct_x {
        (xb, cg * p)
    } else {
        (&s.col[..g.rows() * cols], k * cols)
    };
    for gi in 0..g.group {
        gemm_checked(
            ctx,
            (og, k, cols),
            Dst {
                data: &mut dw[gi * og * k..][..og * k],
                rs: k,
                cs: 1,
                accumulate: false,
            },
            Src {
                data: &lhs[gi * og * cols..][..og * cols],
                rs: cols,
                cs: 1,
            },
            Src {
                data: &rhs[gi * rhs_group..][..k * cols],
                rs: 1,
                cs: cols,
            },
            par,
        )?;
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
    if g.n == 0 || g.p() == 0 {
        dw.fill(T::ZERO);
        return Ok(());
    }
    if conv_winograd::applies(&g) {
        return conv_winograd::backprop_filter(ctx, &g, dy, x, dw);
    }
    let work = g.n * g.c_out * g.p() * g.kdim();
    let b = g.block(FILTER_BLOCK_COLS);
    let chunks = g.n.div_ceil(b);
    let range = |c: usize| (c * b, ((c + 1) * b).min(g.n));
    if chunks == 1 {
        let mut s = Scratch::new(&g, b);
        return filter_grad_block(
            ctx,
            &g,
            dy,
            x,
            range(0),
            dw,
            &mut s,
            gemm_par(ctx.par, work),
        );
    }
    // One partial sum per fixed block of images, then the partials summed in order.
    let mut partials = vec![T::ZERO; chunks * wlen];
    if ctx.par.parallel(work) && chunks >= ctx.par.threads {
        partials
            .par_chunks_mut(wlen)
            .enumerate()
            .try_for_each_init(
                || Scratch::new(&g, b),
                |s, (c, part)| {
                    filter_grad_block(ctx, &g, dy, x, range(c), part, s, gemm::Parallelism::None)
                },
            )?;
    } else {
        let mut s = Scratch::new(&g, b);
        let par = gemm_par(ctx.par, work);
        for (c, part) in partials.chunks_mut(wlen).enumerate() {
            filter_grad_block(ctx, &g, dy, x, range(c), part, &mut s, par)?;
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
