//! Training-mode `BatchNorm` and `BatchNormGrad` through `aclnnBatchNorm` /
//! `aclnnBatchNormBackward`. MindSpore's BatchNorm returns the batch statistics instead of
//! updating running ones: the running-statistics operands of aclnnBatchNorm are the
//! `batch_mean` and `batch_variance` results themselves, zeroed, with momentum 1, so they
//! receive exactly the batch mean and the unbiased batch variance. Inference mode runs on the
//! host. The synchronised BatchNorm ops (`BNTrainingReduce`, `BNTrainingUpdate` and their
//! gradients) are compositions of elementwise aclnn calls over per-channel views.

use super::call::{host, not_f32, Lowered, OpCall};
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

/// Per-channel steps of the synchronised BatchNorm compositions.
struct Steps<'c, 'a> {
    call: &'c OpCall<'a>,
}

impl Steps<'_, '_> {
    fn r(&self) -> crate::aclnn::Runner<'_> {
        self.call.runner()
    }

    fn bin(&self, op: BinOp, a: &TensorDesc, b: &TensorDesc, out: &TensorDesc) -> AscendResult<()> {
        let r = self.r();
        match op {
            BinOp::Add | BinOp::Sub => {
                let one = aclnn::scalar(self.call.api(), 1.0, shardc_ir::DType::Float32)?;
                if op == BinOp::Add {
                    crate::aclnn!(
                        &r,
                        aclnnAdd,
                        aclnnAddGetWorkspaceSize(a.ptr(), b.ptr(), one.ptr(), out.ptr())
                    )
                } else {
                    crate::aclnn!(
                        &r,
                        aclnnSub,
                        aclnnSubGetWorkspaceSize(a.ptr(), b.ptr(), one.ptr(), out.ptr())
                    )
                }
            }
            BinOp::Mul => crate::aclnn!(
                &r,
                aclnnMul,
                aclnnMulGetWorkspaceSize(a.ptr(), b.ptr(), out.ptr())
            ),
            BinOp::Div => crate::aclnn!(
                &r,
                aclnnDiv,
                aclnnDivGetWorkspaceSize(a.ptr(), b.ptr(), out.ptr())
            ),
        }
    }

    /// The sum over every axis but 1.
    fn channel_sum(&self, x: &TensorDesc, rank: usize, out: &TensorDesc) -> AscendResult<()> {
        let axes: Vec<i64> = (0..rank as i64).filter(|&a| a != 1).collect();
        let dims = aclnn::int_array(self.call.api(), &axes)?;
        crate::aclnn!(
            &self.r(),
            aclnnReduceSum,
            aclnnReduceSumGetWorkspaceSize(x.ptr(), dims.ptr(), false, sys::ACL_FLOAT, out.ptr())
        )
    }
}

#[derive(Clone, Copy, PartialEq)]
enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
}

/// A `(C)` vector at `p` seen with `shape` (stride 1 on axis 1, 0 elsewhere).
fn channel_view(call: &OpCall<'_>, p: u64, shape: &[usize]) -> AscendResult<TensorDesc> {
    let mut st = vec![0i64; shape.len()];
    st[1] = 1;
    call.view(p, shardc_ir::DType::Float32, shape, &st, 0)
}

/// The checks every synchronised BatchNorm op shares: Float32, x of rank >= 2 and not empty.
fn sync_bn_input<'a>(
    call: &OpCall<'a>,
    i: usize,
) -> AscendResult<Result<(u64, &'a TensorType), String>> {
    if let Some(why) = not_f32(call) {
        return Ok(Err(why));
    }
    let (x, tx) = call.tensor(i)?;
    if tx.shape.len() < 2 || tx.num_elements() == 0 {
        return Ok(Err("an empty or rank-1 input".into()));
    }
    Ok(Ok((x, tx)))
}

fn count(call: &OpCall<'_>) -> AscendResult<f64> {
    let n = call.node.attrs.int_or("count", 0);
    if n < 1 {
        return Err(call.err(format!(
            "attribute `count` must be >= 1 (the global number of elements per channel), got {n}"
        )));
    }
    Ok(n as f64)
}

/// `BNTrainingReduce(x)` -> `(sum, square_sum)` per channel.
pub(super) fn bn_training_reduce(call: &OpCall<'_>) -> AscendResult<Lowered> {
    let (x, tx) = match sync_bn_input(call, 0)? {
        Ok(v) => v,
        Err(why) => return host(why),
    };
    let (s, ts) = call.out(0)?;
    let (q, tq) = call.out(1)?;
    let t = call.temps(&[tx.size_bytes()])?;
    let st = Steps { call };
    let (dx, dsq) = (call.desc(x, tx)?, call.desc(t[0], tx)?);
    st.bin(BinOp::Mul, &dx, &dx, &dsq)?;
    st.channel_sum(&dx, tx.shape.len(), &call.desc(s, ts)?)?;
    st.channel_sum(&dsq, tx.shape.len(), &call.desc(q, tq)?)?;
    Ok(Lowered::Device)
}

/// `BNTrainingUpdate(x, sum, square_sum, scale, bias)` -> `(y, batch_mean, batch_variance,
/// saved_mean, saved_rstd)`: `mean = sum / count`, `var = max(square_sum / count - mean²,
/// 0)`, `rstd = 1 / sqrt(var + eps)`, `y = (x - mean) · (rstd · scale) + bias`,
/// `batch_variance = var · count / (count - 1)`.
pub(super) fn bn_training_update(call: &OpCall<'_>) -> AscendResult<Lowered> {
    let (x, tx) = match sync_bn_input(call, 0)? {
        Ok(v) => v,
        Err(why) => return host(why),
    };
    let n = count(call)?;
    let eps = call.node.attrs.float_or("epsilon", 1e-5);
    let c = tx.shape[1];
    let ins: Vec<(u64, &TensorType)> = (1..5)
        .map(|i| call.tensor(i))
        .collect::<AscendResult<_>>()?;
    for (i, (_, t)) in ins.iter().enumerate() {
        if t.shape != [c] {
            return Err(call.err(format!("operand {} must have shape ({c}), got {t}", i + 1)));
        }
    }
    let outs: Vec<(u64, &TensorType)> = (0..5).map(|i| call.out(i)).collect::<AscendResult<_>>()?;
    let cb = c * 4;
    // cnt, cnt - 1, one (0-d); five (C) temporaries; one of x's size.
    let t = call.temps(&[8, 8, 8, cb, cb, cb, cb, cb, tx.size_bytes()])?;
    let f32t = shardc_ir::DType::Float32;
    call.fill(t[0], f32t, &[], n)?;
    call.fill(t[1], f32t, &[], n - 1.0)?;
    call.fill(t[2], f32t, &[], 1.0)?;
    let s0 = |p: u64| call.desc_shape(p, f32t, &[]);
    let v = |p: u64| call.desc_shape(p, f32t, &[c]);
    let (cnt, cnt1, one) = (s0(t[0])?, s0(t[1])?, s0(t[2])?);
    let (t0, t1, t2, t3, t4) = (v(t[3])?, v(t[4])?, v(t[5])?, v(t[6])?, v(t[7])?);
    let (sum, sq, scale) = (v(ins[0].0)?, v(ins[1].0)?, v(ins[2].0)?);
    let (mean, bvar, rstd) = (v(outs[1].0)?, v(outs[2].0)?, v(outs[4].0)?);
    let st = Steps { call };
    use BinOp::*;
    st.bin(Div, &sum, &cnt, &mean)?;
    st.bin(Div, &sq, &cnt, &t0)?;
    st.bin(Mul, &mean, &mean, &t1)?;
    st.bin(Sub, &t0, &t1, &t2)?;
    crate::aclnn!(
        &st.r(),
        aclnnRelu,
        aclnnReluGetWorkspaceSize(t2.ptr(), t3.ptr())
    )?;
    // t3 = var
    if n > 1.0 {
        st.bin(Mul, &t3, &cnt, &t0)?;
        st.bin(Div, &t0, &cnt1, &bvar)?;
    } else {
        call.dev.copy(outs[2].0, t[6], cb)?;
    }
    let e = aclnn::scalar(call.api(), eps, f32t)?;
    let onec = aclnn::scalar(call.api(), 1.0, f32t)?;
    crate::aclnn!(
        &st.r(),
        aclnnAdds,
        aclnnAddsGetWorkspaceSize(t3.ptr(), e.ptr(), onec.ptr(), t0.ptr())
    )?;
    crate::aclnn!(
        &st.r(),
        aclnnSqrt,
        aclnnSqrtGetWorkspaceSize(t0.ptr(), t1.ptr())
    )?;
    st.bin(Div, &one, &t1, &rstd)?;
    call.dev.copy(outs[3].0, outs[1].0, cb)?;
    // y = (x - mean) · (rstd · scale) + bias
    st.bin(Mul, &rstd, &scale, &t4)?;
    let shape = &tx.shape;
    let (dx, full) = (call.desc(x, tx)?, call.desc(t[8], tx)?);
    let dy = call.desc(outs[0].0, outs[0].1)?;
    st.bin(Sub, &dx, &channel_view(call, outs[1].0, shape)?, &dy)?;
    st.bin(Mul, &dy, &channel_view(call, t[7], shape)?, &full)?;
    st.bin(Add, &full, &channel_view(call, ins[3].0, shape)?, &dy)?;
    Ok(Lowered::Device)
}

/// `BNTrainingUpdateGrad(dy, x, saved_mean, saved_rstd)` -> `(dscale, dbias)`: per channel
/// `sum(dy · (x - mean) · rstd)` and `sum(dy)`.
pub(super) fn bn_training_update_grad(call: &OpCall<'_>) -> AscendResult<Lowered> {
    let (x, tx) = match sync_bn_input(call, 1)? {
        Ok(v) => v,
        Err(why) => return host(why),
    };
    let (g, tg) = call.tensor(0)?;
    let (m, _) = call.tensor(2)?;
    let (r, _) = call.tensor(3)?;
    let (ds, tds) = call.out(0)?;
    let (db, tdb) = call.out(1)?;
    let t = call.temps(&[tx.size_bytes(), tx.size_bytes()])?;
    let shape = &tx.shape;
    let st = Steps { call };
    let (dx, dg, t0, t1) = (
        call.desc(x, tx)?,
        call.desc(g, tg)?,
        call.desc(t[0], tx)?,
        call.desc(t[1], tx)?,
    );
    st.bin(BinOp::Sub, &dx, &channel_view(call, m, shape)?, &t0)?;
    st.bin(BinOp::Mul, &t0, &channel_view(call, r, shape)?, &t1)?;
    st.bin(BinOp::Mul, &dg, &t1, &t0)?;
    st.channel_sum(&t0, shape.len(), &call.desc(ds, tds)?)?;
    st.channel_sum(&dg, shape.len(), &call.desc(db, tdb)?)?;
    Ok(Lowered::Device)
}

/// `BNTrainingReduceGrad(dy, x, dscale, dbias, scale, saved_mean, saved_rstd)` -> dx:
/// `(scale · rstd / count) · (count · dy - dbias - xhat · dscale)`, `xhat = (x - mean) ·
/// rstd`.
pub(super) fn bn_training_reduce_grad(call: &OpCall<'_>) -> AscendResult<Lowered> {
    let (x, tx) = match sync_bn_input(call, 1)? {
        Ok(v) => v,
        Err(why) => return host(why),
    };
    let n = count(call)?;
    let (g, tg) = call.tensor(0)?;
    let ch: Vec<u64> = (2..7)
        .map(|i| call.tensor(i).map(|(p, _)| p))
        .collect::<AscendResult<_>>()?;
    let (dscale, dbias, scale, mean, rstd) = (ch[0], ch[1], ch[2], ch[3], ch[4]);
    let (out, tout) = call.out(0)?;
    let c = tx.shape[1];
    let bytes = tx.size_bytes();
    let t = call.temps(&[bytes, bytes, bytes, 8, c * 4, c * 4])?;
    let f32t = shardc_ir::DType::Float32;
    call.fill(t[3], f32t, &[], n)?;
    let shape = &tx.shape;
    let st = Steps { call };
    use BinOp::*;
    let (dx, dg) = (call.desc(x, tx)?, call.desc(g, tg)?);
    let (t0, t1, t2) = (
        call.desc(t[0], tx)?,
        call.desc(t[1], tx)?,
        call.desc(t[2], tx)?,
    );
    let cnt = call.desc_shape(t[3], f32t, &[])?;
    let v = |p: u64| call.desc_shape(p, f32t, &[c]);
    // xhat in t1
    st.bin(Sub, &dx, &channel_view(call, mean, shape)?, &t0)?;
    st.bin(Mul, &t0, &channel_view(call, rstd, shape)?, &t1)?;
    // count · dy - dbias - xhat · dscale in t0
    st.bin(Mul, &cnt, &dg, &t0)?;
    st.bin(Sub, &t0, &channel_view(call, dbias, shape)?, &t2)?;
    st.bin(Mul, &t1, &channel_view(call, dscale, shape)?, &t0)?;
    st.bin(Sub, &t2, &t0, &t1)?;
    // coef = scale · rstd / count
    st.bin(Mul, &v(scale)?, &v(rstd)?, &v(t[4])?)?;
    st.bin(Div, &v(t[4])?, &cnt, &v(t[5])?)?;
    st.bin(
        Mul,
        &channel_view(call, t[5], shape)?,
        &t1,
        &call.desc(out, tout)?,
    )?;
    Ok(Lowered::Device)
}
