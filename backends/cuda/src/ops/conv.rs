//! Conv2D, Conv2DBackpropInput and Conv2DBackpropFilter (NCHW) as im2col / col2im kernels
//! (`kernels/conv.cu`) around [`Device::gemm`], with the CPU backend's semantics: the geometry
//! of `shardc_ir::geometry` (`valid` / `same` / `pad`, stride, dilation, groups).
//!
//! The batch is cut into chunks of images whose column matrices fit one scratch buffer
//! (the executor's workspace, kept from call to call: no allocation, so no synchronisation,
//! in a step):
//!
//! - forward: the chunk's column matrices stacked `(nb, C·kh·kw, P)`, then per group one GEMM
//!   batched over the images, `Y_b,g (og, P) = W_g (og, k) · cols_b,g (k, P)`, straight into
//!   the NCHW result (batched over the groups instead, per image, when there are more groups
//!   than images); a 1x1 stride-1 unpadded convolution reads x itself;
//! - input gradient: `dcols_b,g = W_g^T · dY_b,g` the same way, then col2im (a gather, no
//!   atomics) into dx; a pointwise convolution's GEMM writes dx directly;
//! - filter gradient: the chunk's column matrices side by side `(C·kh·kw, nb·P)` and dY
//!   gathered to `(O, nb·P)`, so one GEMM per chunk batched over the groups contracts every
//!   pixel of the chunk, `dW_g += dY_g · cols_g^T` (beta 1 after the first chunk).
//!
//! Where the device has a convolution library (cuDNN, [`Device::library_conv`]) that takes the
//! geometry, the three ops go there instead (`Lowered::Library`). cuDNN pads both sides of a
//! dimension alike; a convolution padded unevenly (a strided `same` one, say: 0 rows above, 1
//! below) goes there too, as the unpadded convolution of its input with the zeros written in
//! (a copy in the scratch memory; the input gradient is computed padded, then cropped).
//!
//! An empty convolution (a zero size anywhere) runs on the host.

use super::call::{host, out_float, Lowered, OpCall, Val};
use super::movement::copy_kernel;
use crate::device::{ConvDirection, Device, Gemm, LibraryConv};
use crate::error::CudaResult;
use crate::kernels::{DevPtr, KernelArg};
use shardc_ir::geometry::{conv2d_geometry, Conv2dGeometry};
use shardc_ir::{DType, TensorType};
use KernelArg::{Ptr, F64, I64};

/// Most elements of the scratch memory (column matrices and gathered gradients) of one call
/// (16 MiB of Float32), unless a single image needs more.
const SCRATCH_ELEMS: usize = 1 << 22;

/// Scratch memory of one call: the executor's workspace, at least `bytes` long.
struct Scratch {
    ptr: DevPtr,
}

impl Scratch {
    fn new(call: &OpCall<'_>, bytes: usize) -> CudaResult<Scratch> {
        Ok(Scratch {
            ptr: call.workspace.get(call.dev, bytes)?,
        })
    }
}

/// The sizes the kernels and GEMMs use.
struct Dims {
    g: Conv2dGeometry,
    dtype: DType,
    /// Bytes per element.
    esz: u64,
    /// Output channels per group.
    og: usize,
    /// Rows of one group's column matrix, `cg·kh·kw`.
    k: usize,
    /// Rows of the whole column matrix, `C·kh·kw`.
    rows: usize,
    /// Output pixels per image.
    p: usize,
    /// Elements of one input / output image.
    img_in: usize,
    img_out: usize,
}

impl Dims {
    fn new(g: Conv2dGeometry, dtype: DType) -> Dims {
        let (cg, og) = (g.c_in / g.group, g.c_out / g.group);
        let p = g.out_h * g.out_w;
        Dims {
            g,
            dtype,
            esz: dtype.size_bytes() as u64,
            og,
            k: cg * g.kh * g.kw,
            rows: g.c_in * g.kh * g.kw,
            p,
            img_in: g.c_in * g.h * g.w,
            img_out: g.c_out * p,
        }
    }

    /// Whether im2col is the identity (1x1 kernel, stride 1, no padding).
    fn pointwise(&self) -> bool {
        let g = &self.g;
        g.kh == 1
            && g.kw == 1
            && g.stride_h == 1
            && g.stride_w == 1
            && g.pad_top == 0
            && g.pad_left == 0
            && g.out_h == g.h
            && g.out_w == g.w
    }

    fn empty(&self) -> bool {
        let g = &self.g;
        g.n == 0 || g.c_in == 0 || g.c_out == 0 || self.p == 0 || g.h == 0 || g.w == 0
    }

    /// The column matrix of im2col / col2im: elements per image (0 when pointwise), images per
    /// chunk, and the scratch that holds one chunk (none when pointwise).
    fn columns(&self, call: &OpCall<'_>) -> CudaResult<(usize, usize, Option<Scratch>)> {
        if self.pointwise() {
            return Ok((0, self.chunk(0), None));
        }
        let per_image = self.rows * self.p;
        let b = self.chunk(per_image);
        let scratch = Scratch::new(call, b * per_image * self.esz as usize)?;
        Ok((per_image, b, Some(scratch)))
    }

    /// Images per chunk when one image needs `per_image` scratch elements.
    fn chunk(&self, per_image: usize) -> usize {
        (SCRATCH_ELEMS / per_image.max(1)).clamp(1, self.g.n.max(1))
    }

    /// `base` advanced by `elems` elements.
    fn at(&self, base: DevPtr, elems: usize) -> DevPtr {
        base + elems as u64 * self.esz
    }

    /// The geometry arguments of `conv_im2col` / `conv_col2im` after the two pointers.
    fn kernel_args(&self, nb: usize, img_stride: usize, row_stride: usize) -> [KernelArg; 16] {
        let g = &self.g;
        [
            I64(nb as i64),
            I64(g.c_in as i64),
            I64(g.h as i64),
            I64(g.w as i64),
            I64(g.kh as i64),
            I64(g.kw as i64),
            I64(g.stride_h as i64),
            I64(g.stride_w as i64),
            I64(g.pad_top as i64),
            I64(g.pad_left as i64),
            I64(g.dil_h as i64),
            I64(g.dil_w as i64),
            I64(g.out_h as i64),
            I64(g.out_w as i64),
            I64(img_stride as i64),
            I64(row_stride as i64),
        ]
    }

    /// The row-major GEMMs `C_b,g = op(A_g) · B_b,g` of `nb` images and every group, where
    /// image b's group g of A, B and C start at `b * img_* + g * grp_*` elements (A's image
    /// stride is 0: the weight), as strided batched GEMMs over the images (one per group) or
    /// over the groups (one per image), whichever makes fewer calls.
    #[allow(clippy::too_many_arguments)]
    fn grouped_gemms(
        &self,
        dev: &dyn Device,
        (m, n, k): (usize, usize, usize),
        (a, trans_a, grp_a): (DevPtr, bool, usize),
        (b, img_b, grp_b): (DevPtr, usize, usize),
        (c, img_c, grp_c): (DevPtr, usize, usize),
        nb: usize,
    ) -> CudaResult<()> {
        let groups = self.g.group;
        if groups <= nb {
            for gi in 0..groups {
                dev.gemm(&Gemm::row_major(
                    self.dtype,
                    (m, n, k),
                    self.at(a, gi * grp_a),
                    trans_a,
                    self.at(b, gi * grp_b),
                    false,
                    self.at(c, gi * grp_c),
                    nb,
                    (0, img_b, img_c),
                ))?;
            }
        } else {
            for bi in 0..nb {
                dev.gemm(&Gemm::row_major(
                    self.dtype,
                    (m, n, k),
                    a,
                    trans_a,
                    self.at(b, bi * img_b),
                    false,
                    self.at(c, bi * img_c),
                    groups,
                    (grp_a, grp_b, grp_c),
                ))?;
            }
        }
        Ok(())
    }
}

/// The geometry of a Conv2D-like node, or the reason it runs on the host.
fn dims(
    call: &OpCall<'_>,
    x: &[usize],
    w: &[usize],
    dtype: DType,
) -> CudaResult<Result<Dims, String>> {
    let g = conv2d_geometry(call.node, x, w).map_err(|e| call.err(e.reason))?;
    let d = Dims::new(g, dtype);
    if d.empty() {
        return Ok(Err("an empty convolution".into()));
    }
    Ok(Ok(d))
}

/// A constant shape operand (`input_size`, `filter_size`) of 4 sizes.
fn shape_operand(call: &OpCall<'_>, i: usize, what: &str) -> CudaResult<Option<Vec<usize>>> {
    let v = match call.inputs.get(i) {
        Some(Val::Const(c)) => c.as_ints(),
        _ => return Ok(None),
    };
    match v {
        Some(v) if v.len() == 4 && v.iter().all(|&d| d >= 0) => {
            Ok(Some(v.iter().map(|&d| d as usize).collect()))
        }
        _ => Err(call.err(format!("{what} must be 4 non-negative sizes, got {v:?}"))),
    }
}

fn check_shape(call: &OpCall<'_>, what: &str, t: &TensorType, want: &[usize]) -> CudaResult<()> {
    if t.shape != want {
        return Err(call.err(format!("{what} has shape {:?}, expected {want:?}", t.shape)));
    }
    Ok(())
}

/// Runs the convolution of `geometry` (`d.g`, or its padded form) through the device's
/// library when it takes it.
fn library(
    call: &OpCall<'_>,
    d: &Dims,
    geometry: &Conv2dGeometry,
    direction: ConvDirection,
    (x, w, y): (DevPtr, DevPtr, DevPtr),
) -> CudaResult<bool> {
    call.dev.library_conv(&LibraryConv {
        direction,
        dtype: d.dtype,
        geometry: *geometry,
        x,
        w,
        y,
    })
}

/// The geometry of `d`'s convolution over its input with the padding written in (no padding of
/// its own), where the device's library refuses `d.g` for its uneven padding and takes that.
fn padded_geometry(call: &OpCall<'_>, d: &Dims) -> Option<Conv2dGeometry> {
    let g = &d.g;
    if !call.dev.has_conv_library() || crate::cudnn::unsupported(g).is_none() {
        return None;
    }
    let padded = Conv2dGeometry {
        h: g.h + g.pad_top + g.pad_bottom,
        w: g.w + g.pad_left + g.pad_right,
        pad_top: 0,
        pad_bottom: 0,
        pad_left: 0,
        pad_right: 0,
        ..*g
    };
    crate::cudnn::unsupported(&padded)
        .is_none()
        .then_some(padded)
}

/// Where the input (unpadded) lies in the padded one of `padded`: the first element's offset,
/// the dims (N, C, H, W) and the padded strides.
fn interior(d: &Dims, padded: &Conv2dGeometry) -> (usize, [usize; 4], [i64; 4]) {
    let g = &d.g;
    let (hp, wp) = (padded.h, padded.w);
    let strides = [(g.c_in * hp * wp) as i64, (hp * wp) as i64, wp as i64, 1];
    (
        g.pad_top * wp + g.pad_left,
        [g.n, g.c_in, g.h, g.w],
        strides,
    )
}

/// Scratch memory for the padded input (or its gradient) of `padded`.
fn padded_buffer(call: &OpCall<'_>, d: &Dims, padded: &Conv2dGeometry) -> CudaResult<DevPtr> {
    let elems = padded.n * padded.c_in * padded.h * padded.w;
    Ok(Scratch::new(call, elems * d.esz as usize)?.ptr)
}

/// `x` with its padding written in (zeros around it), in the scratch memory.
fn pad_input(
    call: &OpCall<'_>,
    d: &Dims,
    padded: &Conv2dGeometry,
    x: DevPtr,
    s: &str,
) -> CudaResult<DevPtr> {
    let xp = padded_buffer(call, d, padded)?;
    let elems = padded.n * padded.c_in * padded.h * padded.w;
    call.launch(
        &format!("fill_{s}"),
        call.grid(elems),
        &[Ptr(xp), I64(elems as i64), F64(0.0)],
    )?;
    let (base, dims, strides) = interior(d, padded);
    copy_kernel(
        call,
        "strided_scatter",
        x,
        d.at(xp, base),
        &dims,
        &strides,
        d.dtype,
    )?;
    Ok(xp)
}

/// `Conv2D(x, w)`.
pub(super) fn conv2d(call: &OpCall<'_>) -> CudaResult<Lowered> {
    let (x, tx) = call.tensor(0)?;
    let (w, tw) = call.tensor(1)?;
    let (y, ty, s) = or_host!(out_float(call)?, "only Float32 and Float64 run on the GPU");
    if tx.dtype != ty.dtype || tw.dtype != ty.dtype {
        return host("mixed element types");
    }
    let d = match dims(call, &tx.shape, &tw.shape, ty.dtype)? {
        Ok(d) => d,
        Err(why) => return host(why),
    };
    check_shape(call, "the result", ty, &d.g.output_shape())?;
    if library(call, &d, &d.g, ConvDirection::Forward, (x, w, y))? {
        return Ok(Lowered::Library);
    }
    if let Some(p) = padded_geometry(call, &d) {
        let xp = pad_input(call, &d, &p, x, s)?;
        if library(call, &d, &p, ConvDirection::Forward, (xp, w, y))? {
            return Ok(Lowered::Library);
        }
    }
    let (per_image, b, scratch) = d.columns(call)?;
    for n0 in (0..d.g.n).step_by(b) {
        let nb = b.min(d.g.n - n0);
        let xc = d.at(x, n0 * d.img_in);
        let yc = d.at(y, n0 * d.img_out);
        let (src, img_src) = match &scratch {
            None => (xc, d.img_in),
            Some(col) => {
                let mut args = vec![Ptr(xc), Ptr(col.ptr)];
                args.extend(d.kernel_args(nb, per_image, d.p));
                call.launch(
                    &format!("conv_im2col_{s}"),
                    call.grid(nb * per_image),
                    &args,
                )?;
                (col.ptr, per_image)
            }
        };
        d.grouped_gemms(
            call.dev,
            (d.og, d.p, d.k),
            (w, false, d.og * d.k),
            (src, img_src, d.k * d.p),
            (yc, d.img_out, d.og * d.p),
            nb,
        )?;
    }
    Ok(Lowered::Device)
}

/// `Conv2DBackpropInput(dy, w, input_size)`.
pub(super) fn conv2d_backprop_input(call: &OpCall<'_>) -> CudaResult<Lowered> {
    let (dy, tdy) = call.tensor(0)?;
    let (w, tw) = call.tensor(1)?;
    let (dx, tdx, s) = or_host!(out_float(call)?, "only Float32 and Float64 run on the GPU");
    if tdy.dtype != tdx.dtype || tw.dtype != tdx.dtype {
        return host("mixed element types");
    }
    let x_shape = or_host!(
        shape_operand(call, 2, "input_size")?,
        "input_size from a tensor"
    );
    let d = match dims(call, &x_shape, &tw.shape, tdx.dtype)? {
        Ok(d) => d,
        Err(why) => return host(why),
    };
    check_shape(call, "dy", tdy, &d.g.output_shape())?;
    check_shape(call, "the result", tdx, &x_shape)?;
    if library(call, &d, &d.g, ConvDirection::BackwardData, (dx, w, dy))? {
        return Ok(Lowered::Library);
    }
    if let Some(p) = padded_geometry(call, &d) {
        // The padded input's gradient, then its interior.
        let dxp = padded_buffer(call, &d, &p)?;
        if library(call, &d, &p, ConvDirection::BackwardData, (dxp, w, dy))? {
            let (base, dims, strides) = interior(&d, &p);
            copy_kernel(
                call,
                "strided_copy",
                d.at(dxp, base),
                dx,
                &dims,
                &strides,
                d.dtype,
            )?;
            return Ok(Lowered::Library);
        }
    }
    let (per_image, b, scratch) = d.columns(call)?;
    for n0 in (0..d.g.n).step_by(b) {
        let nb = b.min(d.g.n - n0);
        let dyc = d.at(dy, n0 * d.img_out);
        let dxc = d.at(dx, n0 * d.img_in);
        let (dst, img_dst) = match &scratch {
            None => (dxc, d.img_in),
            Some(col) => (col.ptr, per_image),
        };
        // dcols_b,g (k, P) = W_g^T (k, og) · dY_b,g (og, P).
        d.grouped_gemms(
            call.dev,
            (d.k, d.p, d.og),
            (w, true, d.og * d.k),
            (dyc, d.img_out, d.og * d.p),
            (dst, img_dst, d.k * d.p),
            nb,
        )?;
        if let Some(col) = &scratch {
            let mut args = vec![Ptr(col.ptr), Ptr(dxc)];
            args.extend(d.kernel_args(nb, per_image, d.p));
            call.launch(&format!("conv_col2im_{s}"), call.grid(nb * d.img_in), &args)?;
        }
    }
    Ok(Lowered::Device)
}

/// `Conv2DBackpropFilter(dy, x, filter_size)`.
pub(super) fn conv2d_backprop_filter(call: &OpCall<'_>) -> CudaResult<Lowered> {
    let (dy, tdy) = call.tensor(0)?;
    let (x, tx) = call.tensor(1)?;
    let (dw, tdw, s) = or_host!(out_float(call)?, "only Float32 and Float64 run on the GPU");
    if tdy.dtype != tdw.dtype || tx.dtype != tdw.dtype {
        return host("mixed element types");
    }
    let w_shape = or_host!(
        shape_operand(call, 2, "filter_size")?,
        "filter_size from a tensor"
    );
    let d = match dims(call, &tx.shape, &w_shape, tdw.dtype)? {
        Ok(d) => d,
        Err(why) => return host(why),
    };
    check_shape(call, "dy", tdy, &d.g.output_shape())?;
    check_shape(call, "the result", tdw, &w_shape)?;
    if library(call, &d, &d.g, ConvDirection::BackwardFilter, (x, dw, dy))? {
        return Ok(Lowered::Library);
    }
    if let Some(p) = padded_geometry(call, &d) {
        let xp = pad_input(call, &d, &p, x, s)?;
        if library(call, &d, &p, ConvDirection::BackwardFilter, (xp, dw, dy))? {
            return Ok(Lowered::Library);
        }
    }
    let b = d.chunk((d.rows + d.g.c_out) * d.p);
    // One allocation: the column matrix, then (from a 256-byte boundary) dY side by side.
    let col_bytes = (b * d.rows * d.p * d.esz as usize).next_multiple_of(256);
    let scratch = Scratch::new(call, col_bytes + b * d.img_out * d.esz as usize)?;
    let col = scratch.ptr;
    let gathered = col + col_bytes as u64;
    for (chunk, n0) in (0..d.g.n).step_by(b).enumerate() {
        let nb = b.min(d.g.n - n0);
        let cols = nb * d.p;
        let mut args = vec![Ptr(d.at(x, n0 * d.img_in)), Ptr(col)];
        args.extend(d.kernel_args(nb, d.p, cols));
        call.launch(
            &format!("conv_im2col_{s}"),
            call.grid(nb * d.rows * d.p),
            &args,
        )?;
        let dyc = d.at(dy, n0 * d.img_out);
        let lhs = if nb > 1 {
            call.launch(
                &format!("conv_side_by_side_{s}"),
                call.grid(nb * d.img_out),
                &[
                    Ptr(dyc),
                    Ptr(gathered),
                    I64(nb as i64),
                    I64(d.g.c_out as i64),
                    I64(d.p as i64),
                ],
            )?;
            gathered
        } else {
            dyc
        };
        // dW_g (og, k) (+)= dY_g (og, cols) · cols_g^T, cols_g stored (k, cols).
        let mut gemm = Gemm::row_major(
            d.dtype,
            (d.og, d.k, cols),
            lhs,
            false,
            col,
            true,
            dw,
            d.g.group,
            (d.og * cols, d.k * cols, d.og * d.k),
        );
        if chunk > 0 {
            gemm.beta = 1.0;
        }
        call.dev.gemm(&gemm)?;
    }
    Ok(Lowered::Device)
}
