//! Ops without an aclnn operator of their own, as exact compositions of aclnn calls on the
//! node's temporaries: the softmax cross-entropies and the optimizer updates (MindSpore's
//! formulas, as the CPU backend computes them).

use super::call::{host, not_f32, Lowered, OpCall};
use crate::aclnn::{self, TensorDesc};
use crate::error::AscendResult;
use shardc_ir::{DType, TensorType};

/// Binary and unary aclnn steps on descriptors, for the compositions.
struct Ops<'c, 'a> {
    call: &'c OpCall<'a>,
    dtype: DType,
}

impl Ops<'_, '_> {
    fn add(&self, a: &TensorDesc, b: &TensorDesc, out: &TensorDesc) -> AscendResult<()> {
        let one = aclnn::scalar(self.call.api(), 1.0, self.dtype)?;
        crate::aclnn!(
            &self.call.runner(),
            aclnnAdd,
            aclnnAddGetWorkspaceSize(a.ptr(), b.ptr(), one.ptr(), out.ptr())
        )
    }

    fn sub(&self, a: &TensorDesc, b: &TensorDesc, out: &TensorDesc) -> AscendResult<()> {
        let one = aclnn::scalar(self.call.api(), 1.0, self.dtype)?;
        crate::aclnn!(
            &self.call.runner(),
            aclnnSub,
            aclnnSubGetWorkspaceSize(a.ptr(), b.ptr(), one.ptr(), out.ptr())
        )
    }

    fn mul(&self, a: &TensorDesc, b: &TensorDesc, out: &TensorDesc) -> AscendResult<()> {
        crate::aclnn!(
            &self.call.runner(),
            aclnnMul,
            aclnnMulGetWorkspaceSize(a.ptr(), b.ptr(), out.ptr())
        )
    }

    fn div(&self, a: &TensorDesc, b: &TensorDesc, out: &TensorDesc) -> AscendResult<()> {
        crate::aclnn!(
            &self.call.runner(),
            aclnnDiv,
            aclnnDivGetWorkspaceSize(a.ptr(), b.ptr(), out.ptr())
        )
    }

    fn muls(&self, a: &TensorDesc, v: f64, out: &TensorDesc) -> AscendResult<()> {
        let s = aclnn::scalar(self.call.api(), v, self.dtype)?;
        crate::aclnn!(
            &self.call.runner(),
            aclnnMuls,
            aclnnMulsGetWorkspaceSize(a.ptr(), s.ptr(), out.ptr())
        )
    }

    /// `out = a + v`.
    fn adds(&self, a: &TensorDesc, v: f64, out: &TensorDesc) -> AscendResult<()> {
        let s = aclnn::scalar(self.call.api(), v, self.dtype)?;
        let one = aclnn::scalar(self.call.api(), 1.0, self.dtype)?;
        crate::aclnn!(
            &self.call.runner(),
            aclnnAdds,
            aclnnAddsGetWorkspaceSize(a.ptr(), s.ptr(), one.ptr(), out.ptr())
        )
    }

    fn sqrt(&self, a: &TensorDesc, out: &TensorDesc) -> AscendResult<()> {
        crate::aclnn!(
            &self.call.runner(),
            aclnnSqrt,
            aclnnSqrtGetWorkspaceSize(a.ptr(), out.ptr())
        )
    }

    fn neg(&self, a: &TensorDesc, out: &TensorDesc) -> AscendResult<()> {
        crate::aclnn!(
            &self.call.runner(),
            aclnnNeg,
            aclnnNegGetWorkspaceSize(a.ptr(), out.ptr())
        )
    }

    /// `out = 1 - a` (as `-a + 1`, exact), through `scratch`.
    fn one_minus(
        &self,
        a: &TensorDesc,
        scratch: &TensorDesc,
        out: &TensorDesc,
    ) -> AscendResult<()> {
        self.neg(a, scratch)?;
        self.adds(scratch, 1.0, out)
    }

    fn log_softmax(&self, x: &TensorDesc, axis: i64, out: &TensorDesc) -> AscendResult<()> {
        crate::aclnn!(
            &self.call.runner(),
            aclnnLogSoftmax,
            aclnnLogSoftmaxGetWorkspaceSize(x.ptr(), axis, out.ptr())
        )
    }

    fn softmax(&self, x: &TensorDesc, axis: i64, out: &TensorDesc) -> AscendResult<()> {
        crate::aclnn!(
            &self.call.runner(),
            aclnnSoftmax,
            aclnnSoftmaxGetWorkspaceSize(x.ptr(), axis, out.ptr())
        )
    }

    fn sum(&self, x: &TensorDesc, axes: &[i64], out: &TensorDesc) -> AscendResult<()> {
        let dims = aclnn::int_array(self.call.api(), axes)?;
        crate::aclnn!(
            &self.call.runner(),
            aclnnReduceSum,
            aclnnReduceSumGetWorkspaceSize(
                x.ptr(),
                dims.ptr(),
                false,
                aclnn::acl_dtype(self.dtype),
                out.ptr()
            )
        )
    }
}

fn nc(call: &OpCall<'_>, t: &TensorType) -> AscendResult<(usize, usize)> {
    match t.shape.as_slice() {
        [n, c] => Ok((*n, *c)),
        s => Err(call.err(format!("logits of shape (N, C) expected, got {s:?}"))),
    }
}

/// `SoftmaxCrossEntropyWithLogits(logits, labels)` -> `(loss, backprop)`:
/// `loss = -Σ_c labels · log_softmax(logits)`, `backprop = softmax(logits) - labels`.
pub(super) fn softmax_ce(call: &OpCall<'_>) -> AscendResult<Lowered> {
    if let Some(why) = not_f32(call) {
        return host(why);
    }
    let (x, tx) = call.tensor(0)?;
    let (l, tl) = call.tensor(1)?;
    let (n, c) = nc(call, tx)?;
    if tl.shape != tx.shape {
        return Err(call.err(format!("labels {tl} differ from logits {tx}")));
    }
    if n * c == 0 {
        return host("an empty batch or no classes");
    }
    let (loss, tloss) = call.out(0)?;
    let (bp, tbp) = call.out(1)?;
    let bytes = tx.size_bytes();
    let t = call.temps(&[bytes, bytes, n * tx.dtype.size_bytes()])?;
    let ops = Ops {
        call,
        dtype: tx.dtype,
    };
    let (dx, dl) = (call.desc(x, tx)?, call.desc(l, tl)?);
    let (t0, t1) = (call.desc(t[0], tx)?, call.desc(t[1], tx)?);
    let rows = call.desc_shape(t[2], tx.dtype, &[n])?;
    let (dloss, dbp) = (call.desc(loss, tloss)?, call.desc(bp, tbp)?);
    ops.log_softmax(&dx, 1, &t0)?;
    ops.mul(&dl, &t0, &t1)?;
    ops.sum(&t1, &[1], &rows)?;
    ops.neg(&rows, &dloss)?;
    ops.softmax(&dx, 1, &t0)?;
    ops.sub(&t0, &dl, &dbp)?;
    Ok(Lowered::Device)
}

/// `SparseSoftmaxCrossEntropyWithLogits(logits, labels)`: with `onehot` of the labels, the
/// mean over rows of `-Σ_c onehot · log_softmax(logits)`, or (`is_grad`) `(softmax(logits) -
/// onehot) / N`. The labels are checked on the host first (a label out of range is an error
/// naming its row, as on the CPU).
pub(super) fn sparse_softmax_ce(call: &OpCall<'_>) -> AscendResult<Lowered> {
    let (x, tx) = call.tensor(0)?;
    let (l, tl) = call.tensor(1)?;
    let (y, ty) = call.out(0)?;
    if tx.dtype != DType::Float32 || ty.dtype != DType::Float32 {
        return host("only Float32 logits run through aclnn");
    }
    if !matches!(tl.dtype, DType::Int32 | DType::Int64) {
        return host(format!("{} labels", tl.dtype));
    }
    let (n, c) = nc(call, tx)?;
    if tl.shape != [n] {
        return Err(call.err(format!("labels of shape ({n}) expected, got {tl}")));
    }
    if n * c == 0 {
        return host("an empty batch or no classes");
    }
    check_labels(call, l, tl, c)?;
    let is_grad = call.node.attrs.bool_or("is_grad", false);
    let bytes = tx.size_bytes();
    let t = call.temps(&[bytes, bytes, bytes, 8, 8, n * 4])?;
    let ops = Ops {
        call,
        dtype: tx.dtype,
    };
    // The one-hot rows of the labels.
    call.fill(t[3], tx.dtype, &[1], 1.0)?;
    call.fill(t[4], tx.dtype, &[1], 0.0)?;
    let (on, off) = (
        call.desc_shape(t[3], tx.dtype, &[1])?,
        call.desc_shape(t[4], tx.dtype, &[1])?,
    );
    let (dx, dl) = (call.desc(x, tx)?, call.desc(l, tl)?);
    let (t0, t1, oh) = (
        call.desc(t[0], tx)?,
        call.desc(t[1], tx)?,
        call.desc(t[2], tx)?,
    );
    let classes = i32::try_from(c).map_err(|_| call.err(format!("{c} classes are too many")))?;
    crate::aclnn!(
        &call.runner(),
        aclnnOneHot,
        aclnnOneHotGetWorkspaceSize(dl.ptr(), classes, on.ptr(), off.ptr(), -1, oh.ptr())
    )?;
    let dy = call.desc(y, ty)?;
    if is_grad {
        if ty.shape != tx.shape {
            return Err(call.err(format!("the gradient {ty} differs from the logits {tx}")));
        }
        ops.softmax(&dx, 1, &t0)?;
        ops.sub(&t0, &oh, &t1)?;
        ops.muls(&t1, 1.0 / n as f64, &dy)?;
    } else {
        if ty.num_elements() != 1 {
            return Err(call.err(format!("the loss must be a scalar, the result is {ty}")));
        }
        ops.log_softmax(&dx, 1, &t0)?;
        ops.mul(&oh, &t0, &t1)?;
        let rows = call.desc_shape(t[5], tx.dtype, &[n])?;
        ops.sum(&t1, &[1], &rows)?;
        let dims = aclnn::int_array(call.api(), &[0])?;
        let mean = call.desc_shape(t[3], tx.dtype, &[])?;
        crate::aclnn!(
            &call.runner(),
            aclnnMean,
            aclnnMeanGetWorkspaceSize(
                rows.ptr(),
                dims.ptr(),
                false,
                aclnn::acl_dtype(tx.dtype),
                mean.ptr()
            )
        )?;
        let out = call.desc_shape(y, ty.dtype, &[])?;
        ops.neg(&mean, &out)?;
    }
    Ok(Lowered::Device)
}

/// The labels downloaded and checked: each in `0..c`.
fn check_labels(call: &OpCall<'_>, l: u64, tl: &TensorType, c: usize) -> AscendResult<()> {
    let mut bytes = vec![0u8; tl.size_bytes()];
    call.dev.download(l, &mut bytes)?;
    let t = shardc_runtime::Tensor::from_le_bytes(tl, &bytes);
    for i in 0..tl.num_elements() {
        let v = t.data.get_f64(i) as i64;
        if v < 0 || v as usize >= c {
            return Err(call.err(format!(
                "label {v} (row {i}) is out of range for {c} classes"
            )));
        }
    }
    Ok(())
}

/// The tensor operands of an update, each of the weight's type.
fn same_type(call: &OpCall<'_>, idx: &[usize]) -> AscendResult<Vec<(u64, TensorType)>> {
    let (_, t0) = call.tensor(idx[0])?;
    idx.iter()
        .map(|&i| {
            let (p, t) = call.tensor(i)?;
            if t != t0 {
                return Err(call.err(format!("operand {i} is {t}, the weight is {t0}")));
            }
            Ok((p, t.clone()))
        })
        .collect()
}

/// `ApplyMomentum(var, acc, lr, grad, momentum)` -> `(var', acc')`: `acc' = acc · momentum +
/// grad`; `var' = var - lr · acc'` (nesterov: `var - lr · (grad + momentum · acc')`).
pub(super) fn apply_momentum(call: &OpCall<'_>) -> AscendResult<Lowered> {
    if let Some(why) = not_f32(call) {
        return host(why);
    }
    let ops = same_type(call, &[0, 1, 3])?;
    let ty = ops[0].1.clone();
    let dtype = ty.dtype;
    let (var_out, tv) = call.out(0)?;
    let (acc_out, ta) = call.out(1)?;
    let bytes = ty.size_bytes();
    let t = call.temps(&[bytes, bytes, 8, 8])?;
    let lr = call.scalar_tensor(2, dtype, t[2])?;
    let mom = call.scalar_tensor(4, dtype, t[3])?;
    let o = Ops { call, dtype };
    let (var, acc, grad) = (
        call.desc(ops[0].0, &ty)?,
        call.desc(ops[1].0, &ty)?,
        call.desc(ops[2].0, &ty)?,
    );
    let (dlr, dmom) = (
        call.desc_shape(lr, dtype, &[])?,
        call.desc_shape(mom, dtype, &[])?,
    );
    let (t0, t1) = (call.desc(t[0], &ty)?, call.desc(t[1], &ty)?);
    let (dvar, dacc) = (call.desc(var_out, tv)?, call.desc(acc_out, ta)?);
    o.mul(&acc, &dmom, &t0)?;
    o.add(&t0, &grad, &dacc)?;
    if call.node.attrs.bool_or("use_nesterov", false) {
        o.mul(&dmom, &dacc, &t0)?;
        o.add(&grad, &t0, &t1)?;
        o.mul(&dlr, &t1, &t0)?;
    } else {
        o.mul(&dlr, &dacc, &t0)?;
    }
    o.sub(&var, &t0, &dvar)?;
    Ok(Lowered::Device)
}

/// `ApplyGradientDescent(var, alpha, delta)` -> `var - alpha · delta`.
pub(super) fn apply_gradient_descent(call: &OpCall<'_>) -> AscendResult<Lowered> {
    if let Some(why) = not_f32(call) {
        return host(why);
    }
    let ops = same_type(call, &[0, 2])?;
    let ty = ops[0].1.clone();
    let dtype = ty.dtype;
    let (out, to) = call.out(0)?;
    let t = call.temps(&[ty.size_bytes(), 8])?;
    let alpha = call.scalar_tensor(1, dtype, t[1])?;
    let o = Ops { call, dtype };
    let (var, delta) = (call.desc(ops[0].0, &ty)?, call.desc(ops[1].0, &ty)?);
    let da = call.desc_shape(alpha, dtype, &[])?;
    let t0 = call.desc(t[0], &ty)?;
    let dout = call.desc(out, to)?;
    o.mul(&da, &delta, &t0)?;
    o.sub(&var, &t0, &dout)?;
    Ok(Lowered::Device)
}

/// `Adam(var, m, v, beta1_power, beta2_power, lr, beta1, beta2, epsilon, gradient)` ->
/// `(var', m', v')`: `m' = b1 m + (1-b1) g`, `v' = b2 v + (1-b2) g g`, `lr_t = lr ·
/// sqrt(1-b2p) / (1-b1p)`, `var' = var - lr_t · m' / (sqrt(v') + eps)` (nesterov: `m' b1 +
/// (1-b1) g` in place of `m'`).
pub(super) fn adam(call: &OpCall<'_>) -> AscendResult<Lowered> {
    if let Some(why) = not_f32(call) {
        return host(why);
    }
    let ops = same_type(call, &[0, 1, 2, 9])?;
    let ty = ops[0].1.clone();
    let dtype = ty.dtype;
    let (var_out, tv) = call.out(0)?;
    let (m_out, tm) = call.out(1)?;
    let (v_out, tvv) = call.out(2)?;
    let bytes = ty.size_bytes();
    // Four full temporaries, six scalar operands, eight scalar temporaries.
    let mut sizes = vec![bytes; 4];
    sizes.extend([8; 14]);
    let t = call.temps(&sizes)?;
    let sc = |i: usize, slot: usize| call.scalar_tensor(i, dtype, t[slot]);
    let (b1p, b2p, lr) = (sc(3, 4)?, sc(4, 5)?, sc(5, 6)?);
    let (b1, b2, eps) = (sc(6, 7)?, sc(7, 8)?, sc(8, 9)?);
    let o = Ops { call, dtype };
    let s = |p: u64| call.desc_shape(p, dtype, &[]);
    let (db1p, db2p, dlr) = (s(b1p)?, s(b2p)?, s(lr)?);
    let (db1, db2, deps) = (s(b1)?, s(b2)?, s(eps)?);
    let (s0, omb1, omb2, s1) = (s(t[10])?, s(t[11])?, s(t[12])?, s(t[13])?);
    let (s2, s3, s4, lr_t) = (s(t[14])?, s(t[15])?, s(t[16])?, s(t[17])?);
    let (var, m, v, g) = (
        call.desc(ops[0].0, &ty)?,
        call.desc(ops[1].0, &ty)?,
        call.desc(ops[2].0, &ty)?,
        call.desc(ops[3].0, &ty)?,
    );
    let (t0, t1, t2, t3) = (
        call.desc(t[0], &ty)?,
        call.desc(t[1], &ty)?,
        call.desc(t[2], &ty)?,
        call.desc(t[3], &ty)?,
    );
    let (dvar, dm, dv) = (
        call.desc(var_out, tv)?,
        call.desc(m_out, tm)?,
        call.desc(v_out, tvv)?,
    );
    o.one_minus(&db1, &s0, &omb1)?;
    o.one_minus(&db2, &s0, &omb2)?;
    // m' = b1 m + (1 - b1) g
    o.mul(&db1, &m, &t0)?;
    o.mul(&omb1, &g, &t1)?;
    o.add(&t0, &t1, &dm)?;
    // v' = b2 v + ((1 - b2) g) g
    o.mul(&db2, &v, &t0)?;
    o.mul(&omb2, &g, &t1)?;
    o.mul(&t1, &g, &t2)?;
    o.add(&t0, &t2, &dv)?;
    // lr_t = lr sqrt(1 - b2p) / (1 - b1p)
    o.one_minus(&db2p, &s0, &s1)?;
    o.sqrt(&s1, &s2)?;
    o.mul(&dlr, &s2, &s3)?;
    o.one_minus(&db1p, &s0, &s4)?;
    o.div(&s3, &s4, &lr_t)?;
    // num = m' (nesterov: m' b1 + (1 - b1) g)
    let num = if call.node.attrs.bool_or("use_nesterov", false) {
        o.mul(&dm, &db1, &t0)?;
        o.mul(&omb1, &g, &t1)?;
        o.add(&t0, &t1, &t3)?;
        &t3
    } else {
        &dm
    };
    // var' = var - (lr_t num) / (sqrt(v') + eps)
    o.mul(&lr_t, num, &t0)?;
    o.sqrt(&dv, &t1)?;
    o.add(&t1, &deps, &t2)?;
    o.div(&t0, &t2, &t1)?;
    o.sub(&var, &t1, &dvar)?;
    Ok(Lowered::Device)
}

/// Operand `i`'s number on the host: a constant's value, or a one-element tensor downloaded.
fn host_scalar(call: &OpCall<'_>, i: usize) -> AscendResult<f64> {
    match call.inputs.get(i) {
        Some(super::call::Val::Const(c)) => c
            .as_f64()
            .ok_or_else(|| call.err(format!("operand {i} must be a number, got {c:?}"))),
        Some(super::call::Val::Tensor { ptr, ty }) if ty.num_elements() == 1 => {
            let mut bytes = vec![0u8; ty.size_bytes()];
            call.dev.download(*ptr, &mut bytes)?;
            Ok(shardc_runtime::Tensor::from_le_bytes(ty, &bytes)
                .data
                .get_f64(0))
        }
        _ => Err(call.err(format!(
            "operand {i} must be a number or a one-element tensor"
        ))),
    }
}

/// `SGD(parameters, gradient, learning_rate, accum, momentum, stat)` -> `(parameters',
/// accum', stat')`, MindSpore's SGD kernel as the CPU runs it: `g = grad + weight_decay ·
/// param` (when weight_decay > 0); with momentum > 0, where `stat > 0` `accum = g, stat = 0`,
/// elsewhere `accum = accum · momentum + (1 - dampening) · g` (the choice is a 0/1 mask,
/// `Relu(stat) == 0`, blended exactly); `g = nesterov ? g + accum · momentum : accum`;
/// `param = param - lr · g`. The momentum's value decides the branch on the host (a tensor
/// operand is downloaded).
pub(super) fn sgd(call: &OpCall<'_>) -> AscendResult<Lowered> {
    if let Some(why) = not_f32(call) {
        return host(why);
    }
    let ops = same_type(call, &[0, 1, 3, 5])?;
    let ty = ops[0].1.clone();
    let dtype = ty.dtype;
    let mom_v = host_scalar(call, 4)?;
    let damp = call.node.attrs.float_or("dampening", 0.0);
    let wd = call.node.attrs.float_or("weight_decay", 0.0);
    let nesterov = call.node.attrs.bool_or("nesterov", false);
    let (p_out, tp) = call.out(0)?;
    let (a_out, ta) = call.out(1)?;
    let (s_out, ts) = call.out(2)?;
    let bytes = ty.size_bytes();
    let n = ty.num_elements();
    // t0..t4 full; lr, mom, d, 1 - d, zero, scratch scalars; a bool mask.
    let mut sizes = vec![bytes; 5];
    sizes.extend([8; 6]);
    sizes.push(n);
    let t = call.temps(&sizes)?;
    let lr = call.scalar_tensor(2, dtype, t[5])?;
    let mom = call.scalar_tensor(4, dtype, t[6])?;
    let o = Ops { call, dtype };
    let full = |p: u64| call.desc(p, &ty);
    let s0 = |p: u64| call.desc_shape(p, dtype, &[]);
    let (param, grad, accum, stat) = (
        full(ops[0].0)?,
        full(ops[1].0)?,
        full(ops[2].0)?,
        full(ops[3].0)?,
    );
    let (t0, t1, t2, t3, t4) = (
        full(t[0])?,
        full(t[1])?,
        full(t[2])?,
        full(t[3])?,
        full(t[4])?,
    );
    let (dlr, dmom) = (s0(lr)?, s0(mom)?);
    let (dp, da, ds) = (
        call.desc(p_out, tp)?,
        call.desc(a_out, ta)?,
        call.desc(s_out, ts)?,
    );
    if mom_v <= 0.0 && wd <= 0.0 {
        o.mul(&dlr, &grad, &t0)?;
        o.sub(&param, &t0, &dp)?;
        call.dev.copy(a_out, ops[2].0, bytes)?;
        call.dev.copy(s_out, ops[3].0, bytes)?;
        return Ok(Lowered::Device);
    }
    // g (with weight decay) in t1, or the gradient itself.
    let g = if wd > 0.0 {
        o.muls(&param, wd, &t0)?;
        o.add(&grad, &t0, &t1)?;
        &t1
    } else {
        &grad
    };
    // The step's g in t4 (or the accumulation's output).
    let step_g: &TensorDesc = if mom_v > 0.0 {
        // mask (1 where stat <= 0: the momentum branch) in t0, 1 - mask in t2.
        let (zero, dval, omd, sc) = (s0(t[7])?, s0(t[8])?, s0(t[9])?, s0(t[10])?);
        call.fill(t[7], dtype, &[], 0.0)?;
        call.fill(t[8], dtype, &[], damp)?;
        o.one_minus(&dval, &sc, &omd)?;
        let mask_b = call.desc_shape(t[11], DType::Bool, &ty.shape)?;
        crate::aclnn!(
            &call.runner(),
            aclnnRelu,
            aclnnReluGetWorkspaceSize(stat.ptr(), t3.ptr())
        )?;
        crate::aclnn!(
            &call.runner(),
            aclnnEqTensor,
            aclnnEqTensorGetWorkspaceSize(t3.ptr(), zero.ptr(), mask_b.ptr())
        )?;
        crate::aclnn!(
            &call.runner(),
            aclnnCast,
            aclnnCastGetWorkspaceSize(mask_b.ptr(), aclnn::acl_dtype(dtype), t0.ptr())
        )?;
        o.one_minus(&t0, &t3, &t2)?;
        // accum' = mask · (accum · mom + (1 - d) · g) + (1 - mask) · g
        o.mul(&accum, &dmom, &t3)?;
        o.mul(&omd, g, &t4)?;
        let blended = call.desc(p_out, tp)?; // scratch: the parameter's output comes last
        o.add(&t3, &t4, &blended)?;
        o.mul(&t0, &blended, &t3)?;
        o.mul(&t2, g, &t4)?;
        o.add(&t3, &t4, &da)?;
        // stat' = mask · stat
        o.mul(&t0, &stat, &ds)?;
        if nesterov {
            o.mul(&da, &dmom, &t3)?;
            o.add(g, &t3, &t4)?;
            &t4
        } else {
            &da
        }
    } else {
        call.dev.copy(a_out, ops[2].0, bytes)?;
        call.dev.copy(s_out, ops[3].0, bytes)?;
        g
    };
    o.mul(&dlr, step_g, &t0)?;
    o.sub(&param, &t0, &dp)?;
    Ok(Lowered::Device)
}
