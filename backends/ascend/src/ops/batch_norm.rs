//! Training-mode `BatchNorm` and `BatchNormGrad` through `aclnnBatchNorm` /
//! `aclnnBatchNormBackward`. MindSpore's BatchNorm returns the batch statistics instead of
//! updating running ones: the running-statistics operands of aclnnBatchNorm are the
//! `batch_mean` and `batch_variance` results themselves, zeroed, with momentum 1, so they
//! receive exactly the batch mean and the unbiased batch variance. Inference mode runs on the
//! host.

use super::call::{host, Lowered, OpCall};
use super::not_f32;
use crate::aclnn::{self, TensorDesc};
use crate::error::AscendResult;
use shardc_ascend_sys as sys;
use shardc_ir::TensorType;

fn desc(call: &OpCall<'_>, p: u64, ty: &TensorType) -> AscendResult<TensorDesc> {
    let format = if ty.shape.len() == 4 {
        sys::ACL_FORMAT_NCHW
    } else {
        sys::ACL_FORMAT_ND
    };
    aclnn::tensor_view(
        call.api(),
        p,
        ty.dtype,
        &ty.shape,
        &aclnn::contiguous_strides(&ty.shape),
        0,
        format,
    )
}

/// `BatchNorm(x, scale, bias, mean, variance)` -> `(y, batch_mean, batch_variance,
/// saved_mean, saved_rstd)` in training mode.
pub(super) fn batch_norm(call: &OpCall<'_>) -> AscendResult<Lowered> {
    if let Some(why) = not_f32(call) {
        return host(why);
    }
    if !call.node.attrs.bool_or("is_training", true) {
        return host("inference mode (the statistics come from the operands)");
    }
    let (x, tx) = call.tensor(0)?;
    if tx.shape.len() < 2 || tx.num_elements() == 0 {
        return host("an empty or rank-1 input");
    }
    let (s, ts) = call.tensor(1)?;
    let (b, tb) = call.tensor(2)?;
    let eps = call.node.attrs.float_or("epsilon", 1e-5);
    let outs: Vec<(u64, &TensorType)> = (0..5).map(|i| call.out(i)).collect::<AscendResult<_>>()?;
    for &(p, t) in &outs[1..3] {
        call.dev.zero(p, t.size_bytes())?;
    }
    let (dx, ds, db) = (desc(call, x, tx)?, desc(call, s, ts)?, desc(call, b, tb)?);
    let d: Vec<TensorDesc> = outs
        .iter()
        .map(|&(p, t)| desc(call, p, t))
        .collect::<AscendResult<_>>()?;
    crate::aclnn!(
        &call.runner(),
        aclnnBatchNorm,
        aclnnBatchNormGetWorkspaceSize(
            dx.ptr(),
            ds.ptr(),
            db.ptr(),
            d[1].ptr(),
            d[2].ptr(),
            true,
            1.0,
            eps,
            d[0].ptr(),
            d[3].ptr(),
            d[4].ptr()
        )
    )?;
    Ok(Lowered::Device)
}

/// `BatchNormGrad(dy, x, scale, saved_mean, saved_rstd)` -> `(dx, dscale, dbias)` in training
/// mode.
pub(super) fn batch_norm_grad(call: &OpCall<'_>) -> AscendResult<Lowered> {
    if let Some(why) = not_f32(call) {
        return host(why);
    }
    if !call.node.attrs.bool_or("is_training", true) {
        return host("inference mode");
    }
    let eps = call.node.attrs.float_or("epsilon", 1e-5);
    let ins: Vec<(u64, &TensorType)> = (0..5)
        .map(|i| call.tensor(i))
        .collect::<AscendResult<_>>()?;
    if ins[1].1.shape.len() < 2 || ins[1].1.num_elements() == 0 {
        return host("an empty or rank-1 input");
    }
    let outs: Vec<(u64, &TensorType)> = (0..3).map(|i| call.out(i)).collect::<AscendResult<_>>()?;
    let di: Vec<TensorDesc> = ins
        .iter()
        .map(|&(p, t)| desc(call, p, t))
        .collect::<AscendResult<_>>()?;
    let dout: Vec<TensorDesc> = outs
        .iter()
        .map(|&(p, t)| desc(call, p, t))
        .collect::<AscendResult<_>>()?;
    let mask = aclnn::bool_array(call.api(), &[true, true, true])?;
    crate::aclnn!(
        &call.runner(),
        aclnnBatchNormBackward,
        aclnnBatchNormBackwardGetWorkspaceSize(
            di[0].ptr(),
            di[1].ptr(),
            di[2].ptr(),
            std::ptr::null(),
            std::ptr::null(),
            di[3].ptr(),
            di[4].ptr(),
            true,
            eps,
            mask.ptr(),
            dout[0].ptr(),
            dout[1].ptr(),
            dout[2].ptr()
        )
    )?;
    Ok(Lowered::Device)
}
