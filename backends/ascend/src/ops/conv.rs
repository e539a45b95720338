//! Convolutions and pooling through aclnn (NCHW), with the CPU's geometry
//! (`shardc_ir::geometry`): `aclnnConvolution` / `aclnnConvolutionBackward`,
//! `aclnnMaxPool2dWithIndices` (+ backward, the indices recomputed from x) and
//! `aclnnAvgPool2d` (+ backward, padding excluded from the average). aclnn pads symmetrically:
//! a convolution whose geometry pads one side more than the other (`same` with an odd total)
//! is padded explicitly; such a pooling runs on the host.

use super::call::{host, not_f32, Lowered, OpCall};
use crate::aclnn::{self, TensorDesc};
use crate::error::AscendResult;
use shardc_ascend_sys as sys;
use shardc_ir::geometry::{conv2d_geometry, pool2d_geometry};
use shardc_ir::{DType, OpKind, TensorType};

const ASYMMETRIC: &str =
    "padding differs between the two sides (pad_mode `same` with an odd total): aclnn pads symmetrically, and a pool's padding is never inside a window on the CPU";

fn nchw(call: &OpCall<'_>, p: u64, shape: &[usize]) -> AscendResult<TensorDesc> {
    aclnn::tensor_view(
        call.api(),
        p,
        DType::Float32,
        shape,
        &aclnn::contiguous_strides(shape),
        0,
        sys::ACL_FORMAT_NCHW,
    )
}

fn shape_const(call: &OpCall<'_>, i: usize) -> AscendResult<Vec<usize>> {
    let v = call
        .constant(i)?
        .as_ints()
        .ok_or_else(|| call.err(format!("operand {i} must be a constant shape")))?;
    v.iter()
        .map(|&d| usize::try_from(d).map_err(|_| call.err(format!("shape {v:?} is negative"))))
        .collect()
}

/// The interior of a padded `(n, c, h + top + bottom, w + left + right)` tensor at `p`: the
/// view of shape `x` at rows `top..`, columns `left..`.
fn interior(
    call: &OpCall<'_>,
    p: u64,
    padded: &[usize],
    x: &[usize],
    (top, left): (usize, usize),
) -> AscendResult<TensorDesc> {
    let st = aclnn::contiguous_strides(padded);
    aclnn::tensor_view(
        call.api(),
        p,
        DType::Float32,
        x,
        &st,
        top as i64 * st[2] + left as i64,
        sys::ACL_FORMAT_NCHW,
    )
}

/// `dst = src` (`aclnnInplaceCopy`).
fn copy(call: &OpCall<'_>, dst: &TensorDesc, src: &TensorDesc) -> AscendResult<()> {
    crate::aclnn!(
        &call.runner(),
        aclnnInplaceCopy,
        aclnnInplaceCopyGetWorkspaceSize(dst.ptr(), src.ptr())
    )
}

/// `Conv2D(x, w)`, `Conv2DBackpropInput(dy, w, input_size)` and
/// `Conv2DBackpropFilter(dy, x, filter_size)`. Symmetric padding is aclnn's own; padding that
/// differs between the sides (`same` with an odd total) is made explicit: x copied into a
/// zeroed padded temporary (the input's gradient taken on that temporary and its interior
/// copied out), then an unpadded convolution, which is the same arithmetic.
pub(super) fn conv(call: &OpCall<'_>) -> AscendResult<Lowered> {
    if let Some(why) = not_f32(call) {
        return host(why);
    }
    let (a, ta) = call.tensor(0)?;
    let (b, tb) = call.tensor(1)?;
    let (y, ty) = call.out(0)?;
    let (x_shape, w_shape) = match call.node.op {
        OpKind::Conv2D => (ta.shape.clone(), tb.shape.clone()),
        OpKind::Conv2DBackpropInput => (shape_const(call, 2)?, tb.shape.clone()),
        _ => (tb.shape.clone(), shape_const(call, 2)?),
    };
    let g = conv2d_geometry(call.node, &x_shape, &w_shape).map_err(|e| call.err(e.reason))?;
    if ty.num_elements() == 0 {
        return Ok(Lowered::Device);
    }
    let asym = g.pad_top != g.pad_bottom || g.pad_left != g.pad_right;
    let xp_shape = if asym {
        vec![
            g.n,
            g.c_in,
            g.h + g.pad_top + g.pad_bottom,
            g.w + g.pad_left + g.pad_right,
        ]
    } else {
        x_shape.clone()
    };
    let corner = (g.pad_top, g.pad_left);
    let xp_bytes = xp_shape.iter().product::<usize>() * 4;
    let w_bytes = w_shape.iter().product::<usize>() * 4;
    let api = call.api();
    let stride = aclnn::int_array(api, &[g.stride_h as i64, g.stride_w as i64])?;
    let pads = if asym {
        [0, 0]
    } else {
        [g.pad_top as i64, g.pad_left as i64]
    };
    let padding = aclnn::int_array(api, &pads)?;
    let dilation = aclnn::int_array(api, &[g.dil_h as i64, g.dil_w as i64])?;
    let out_pad = aclnn::int_array(api, &[0, 0])?;
    let r = call.runner();
    // x as the convolution sees it: padded into `slot` where the padding is asymmetric.
    let padded_x = |x: u64, slot: u64| -> AscendResult<u64> {
        if !asym {
            return Ok(x);
        }
        call.dev.zero(slot, xp_bytes)?;
        let src = nchw(call, x, &x_shape)?;
        copy(
            call,
            &interior(call, slot, &xp_shape, &x_shape, corner)?,
            &src,
        )?;
        Ok(slot)
    };
    match call.node.op {
        OpKind::Conv2D => {
            let t = call.temps(&[if asym { xp_bytes } else { 0 }])?;
            let xin = padded_x(a, t[0])?;
            let (dx, dw, dy) = (
                nchw(call, xin, &xp_shape)?,
                nchw(call, b, &tb.shape)?,
                nchw(call, y, &ty.shape)?,
            );
            crate::aclnn!(
                &r,
                aclnnConvolution,
                aclnnConvolutionGetWorkspaceSize(
                    dx.ptr(),
                    dw.ptr(),
                    std::ptr::null(),
                    stride.ptr(),
                    padding.ptr(),
                    dilation.ptr(),
                    false,
                    out_pad.ptr(),
                    g.group as i64,
                    dy.ptr(),
                    sys::CUBE_MATH_KEEP_DTYPE
                )
            )?;
        }
        op => {
            // The operand whose values the wanted gradient does not need (x for the input's
            // gradient, w for the filter's) is a zeroed temporary of its shape.
            let input_grad = op == OpKind::Conv2DBackpropInput;
            let t = if input_grad {
                call.temps(&[xp_bytes, if asym { xp_bytes } else { 0 }])?
            } else {
                call.temps(&[w_bytes, if asym { xp_bytes } else { 0 }])?
            };
            call.dev
                .zero(t[0], if input_grad { xp_bytes } else { w_bytes })?;
            let (x_ptr, w_ptr) = if input_grad {
                (t[0], b)
            } else {
                (padded_x(b, t[1])?, t[0])
            };
            let (ddy, dx, dw) = (
                nchw(call, a, &ta.shape)?,
                nchw(call, x_ptr, &xp_shape)?,
                nchw(call, w_ptr, &w_shape)?,
            );
            let grad_at = if input_grad && asym { t[1] } else { y };
            let grad_shape = if input_grad { &xp_shape } else { &ty.shape };
            let out = nchw(call, grad_at, grad_shape)?;
            let mask = aclnn::bool_array(api, &[input_grad, !input_grad, false])?;
            let (gi, gw) = if input_grad {
                (out.ptr(), std::ptr::null_mut())
            } else {
                (std::ptr::null_mut(), out.ptr())
            };
            let groups = i32::try_from(g.group).map_err(|_| call.err("too many groups"))?;
            crate::aclnn!(
                &r,
                aclnnConvolutionBackward,
                aclnnConvolutionBackwardGetWorkspaceSize(
                    ddy.ptr(),
                    dx.ptr(),
                    dw.ptr(),
                    std::ptr::null(),
                    stride.ptr(),
                    padding.ptr(),
                    dilation.ptr(),
                    false,
                    out_pad.ptr(),
                    groups,
                    mask.ptr(),
                    sys::CUBE_MATH_KEEP_DTYPE,
                    gi,
                    gw,
                    std::ptr::null_mut()
                )
            )?;
            if input_grad && asym {
                let src = interior(call, t[1], &xp_shape, &x_shape, corner)?;
                copy(call, &nchw(call, y, &ty.shape)?, &src)?;
            }
        }
    }
    Ok(Lowered::Device)
}

/// `MaxPool(x)` / `AvgPool(x)` and their gradients `MaxPoolGrad(x, y, dy)` /
/// `AvgPoolGrad(x, y, dy)`.
pub(super) fn pool(call: &OpCall<'_>) -> AscendResult<Lowered> {
    use OpKind::*;
    if let Some(why) = not_f32(call) {
        return host(why);
    }
    let (x, tx) = call.tensor(0)?;
    let (y, ty) = call.out(0)?;
    let g = pool2d_geometry(call.node, &tx.shape).map_err(|e| call.err(e.reason))?;
    if g.pad_top != g.pad_bottom || g.pad_left != g.pad_right {
        return host(ASYMMETRIC);
    }
    if ty.num_elements() == 0 || g.out_h == 0 || g.out_w == 0 {
        return host("an empty pooling");
    }
    let api = call.api();
    let kernel = aclnn::int_array(api, &[g.kh as i64, g.kw as i64])?;
    let stride = aclnn::int_array(api, &[g.stride_h as i64, g.stride_w as i64])?;
    let padding = aclnn::int_array(api, &[g.pad_top as i64, g.pad_left as i64])?;
    let dilation = aclnn::int_array(api, &[1, 1])?;
    let out_shape = [g.n, g.c, g.out_h, g.out_w];
    let dx = nchw(call, x, &tx.shape)?;
    let r = call.runner();
    match call.node.op {
        MaxPool | MaxPoolGrad => {
            let pooled = TensorType::new(DType::Float32, out_shape.to_vec());
            let idx = TensorType::new(DType::Int32, out_shape.to_vec());
            let t = call.temps(&[pooled.size_bytes(), idx.size_bytes()])?;
            let di = aclnn::tensor_view(
                api,
                t[1],
                DType::Int32,
                &out_shape,
                &aclnn::contiguous_strides(&out_shape),
                0,
                sys::ACL_FORMAT_NCHW,
            )?;
            let dout = if call.node.op == MaxPool {
                nchw(call, y, &ty.shape)?
            } else {
                nchw(call, t[0], &out_shape)?
            };
            crate::aclnn!(
                &r,
                aclnnMaxPool2dWithIndices,
                aclnnMaxPool2dWithIndicesGetWorkspaceSize(
                    dx.ptr(),
                    kernel.ptr(),
                    stride.ptr(),
                    padding.ptr(),
                    dilation.ptr(),
                    false,
                    dout.ptr(),
                    di.ptr()
                )
            )?;
            if call.node.op == MaxPoolGrad {
                let (dyp, tdy) = call.tensor(2)?;
                let ddy = nchw(call, dyp, &tdy.shape)?;
                let dgrad = nchw(call, y, &ty.shape)?;
                crate::aclnn!(
                    &r,
                    aclnnMaxPool2dWithIndicesBackward,
                    aclnnMaxPool2dWithIndicesBackwardGetWorkspaceSize(
                        ddy.ptr(),
                        dx.ptr(),
                        di.ptr(),
                        kernel.ptr(),
                        stride.ptr(),
                        padding.ptr(),
                        dilation.ptr(),
                        false,
                        dgrad.ptr()
                    )
                )?;
            }
        }
        AvgPool => {
            let dy = nchw(call, y, &ty.shape)?;
            crate::aclnn!(
                &r,
                aclnnAvgPool2d,
                aclnnAvgPool2dGetWorkspaceSize(
                    dx.ptr(),
                    kernel.ptr(),
                    stride.ptr(),
                    padding.ptr(),
                    false,
                    false,
                    0,
                    sys::CUBE_MATH_KEEP_DTYPE,
                    dy.ptr()
                )
            )?;
        }
        AvgPoolGrad => {
            let (dyp, tdy) = call.tensor(2)?;
            let ddy = nchw(call, dyp, &tdy.shape)?;
            let dgrad = nchw(call, y, &ty.shape)?;
            crate::aclnn!(
                &r,
                aclnnAvgPool2dBackward,
                aclnnAvgPool2dBackwardGetWorkspaceSize(
                    ddy.ptr(),
                    dx.ptr(),
                    kernel.ptr(),
                    stride.ptr(),
                    padding.ptr(),
                    false,
                    false,
                    0,
                    sys::CUBE_MATH_KEEP_DTYPE,
                    dgrad.ptr()
                )
            )?;
        }
        op => return Err(call.err(format!("{op} is not a pooling op"))),
    }
    Ok(Lowered::Device)
}
