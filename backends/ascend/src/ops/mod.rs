//! Each op of a rank's graph as aclnn operators on the compute stream.
//!
//! `lower` either runs a node on the device or answers `Lowered::Host` with the reason,
//! without issuing anything, when no aclnn lowering covers the node as typed (an op listed in
//! [`HOST_FALLBACKS`], a dtype other than Float32 for the float math, an attribute case an
//! aclnn operator cannot express): the executor then runs the host backend's kernel on copies,
//! counted. The decision depends only on the node and its types, so it is the same at every
//! step. Every lowering computes what the CPU backend computes for the op (MindSpore's
//! semantics); an op without an aclnn operator of its own is an exact composition of aclnn
//! calls on temporaries (the optimizers, the losses).

use crate::aclnn::{self, contiguous_strides};
use crate::error::AscendResult;
use shardc_ascend_sys as sys;
use shardc_ir::{DType, OpKind};

mod batch_norm;
mod call;
mod compose;
mod conv;

pub(crate) use call::{host, not_f32, Lowered, OpCall, Val};

/// The ops the Ascend lowering runs on the host, each with the reason: `lower` answers
/// `Lowered::Host(reason)` for them (the executor runs the host backend's kernel on copies,
/// or runs the op itself). [`has_kernel`] is false exactly for these ops.
pub const HOST_FALLBACKS: &[(OpKind, &str)] = &[
    (
        OpKind::TupleGetItem,
        "plumbing: the executor aliases the tuple's element, no kernel runs",
    ),
    (
        OpKind::Assign,
        "plumbing: the executor stores the value into the parameter, no kernel runs",
    ),
    (
        OpKind::AllReduce,
        "a collective: the executor runs it through the communicator (HCCL)",
    ),
    (
        OpKind::AllGather,
        "a collective: the executor runs it through the communicator (HCCL)",
    ),
    (
        OpKind::ReduceScatter,
        "a collective: the executor runs it through the communicator (HCCL)",
    ),
    (
        OpKind::AllToAll,
        "a collective: the executor runs it through the communicator (HCCL)",
    ),
    (
        OpKind::Broadcast,
        "a collective: the executor runs it through the communicator (HCCL)",
    ),
    (
        OpKind::Send,
        "point-to-point: the executor runs it through the communicator",
    ),
    (
        OpKind::Receive,
        "point-to-point: the executor runs it through the communicator",
    ),
    (
        OpKind::Dropout,
        "its mask is shardc's counter-based hash of (seeds, step, index) (ir::dropout), which no aclnn operator draws",
    ),
];

/// A device lowering of one op.
type LowerFn = for<'a, 'b> fn(&'a OpCall<'b>) -> AscendResult<Lowered>;

/// Where an op runs: its aclnn lowering, or the host (listed in [`HOST_FALLBACKS`]).
#[derive(Clone, Copy)]
enum Route {
    Kernel(LowerFn),
    Host,
}

/// The device lowering of every op: one exhaustive match (a new `OpKind` does not compile
/// until it is routed), which [`lower`] dispatches by and [`has_kernel`] reports.
fn route(op: OpKind) -> Route {
    use OpKind::*;
    use Route::*;
    match op {
        MatMul | BatchMatMul => Kernel(matmul),
        Add | Sub | Mul | RealDiv => Kernel(arithmetic),
        DropoutGrad => Kernel(arithmetic),
        ReluGrad | SigmoidGrad | TanhGrad | SqrtGrad | GeLUGrad | SiLUGrad => Kernel(gradient),
        Neg | Square | Sqrt | Exp | Log | ReLU | GeLU | Sigmoid | Tanh | SiLU | Erf => {
            Kernel(unary)
        }
        BiasAdd => Kernel(bias_add),
        BiasAddGrad => Kernel(bias_add_grad),
        Cast => Kernel(cast),
        Equal => Kernel(equal),
        ZerosLike | OnesLike => Kernel(fill),
        Reshape => Kernel(reshape),
        Transpose => Kernel(transpose),
        BroadcastTo => Kernel(broadcast_to),
        OneHot => Kernel(one_hot),
        Concat => Kernel(concat),
        Split => Kernel(split),
        Gather => Kernel(gather),
        ReduceSum | ReduceMean | ReduceMax => Kernel(reduce),
        Softmax | LogSoftmax => Kernel(softmax),
        SoftmaxGrad | LogSoftmaxGrad => Kernel(softmax_grad),
        LayerNorm => Kernel(layer_norm),
        LayerNormGrad => Kernel(layer_norm_grad),
        SoftmaxCrossEntropyWithLogits => Kernel(compose::softmax_ce),
        SparseSoftmaxCrossEntropyWithLogits => Kernel(compose::sparse_softmax_ce),
        ApplyMomentum => Kernel(compose::apply_momentum),
        ApplyGradientDescent => Kernel(compose::apply_gradient_descent),
        Adam => Kernel(compose::adam),
        Conv2D | Conv2DBackpropInput | Conv2DBackpropFilter => Kernel(conv::conv),
        MaxPool | AvgPool | MaxPoolGrad | AvgPoolGrad => Kernel(conv::pool),
        BatchNorm => Kernel(batch_norm::batch_norm),
        BatchNormGrad => Kernel(batch_norm::batch_norm_grad),
        StridedSlice | StridedSliceGrad => Kernel(strided_slice),
        UnsortedSegmentSum => Kernel(unsorted_segment_sum),
        BNTrainingReduce => Kernel(batch_norm::bn_training_reduce),
        BNTrainingUpdate => Kernel(batch_norm::bn_training_update),
        BNTrainingUpdateGrad => Kernel(batch_norm::bn_training_update_grad),
        BNTrainingReduceGrad => Kernel(batch_norm::bn_training_reduce_grad),
        SGD => Kernel(compose::sgd),
        Dropout => Host,
        TupleGetItem | Assign | AllReduce | AllGather | ReduceScatter | AllToAll | Broadcast
        | Send | Receive => Host,
    }
}

/// Whether the Ascend backend lowers `op` to aclnn (it may still fall back to the host for
/// some types or attributes, saying why); `false` exactly for the ops of [`HOST_FALLBACKS`].
pub fn has_kernel(op: OpKind) -> bool {
    matches!(route(op), Route::Kernel(_))
}

/// The reason [`HOST_FALLBACKS`] gives for `op`, if it lists it.
pub fn host_fallback(op: OpKind) -> Option<&'static str> {
    HOST_FALLBACKS
        .iter()
        .find(|(o, _)| *o == op)
        .map(|(_, why)| *why)
}

/// Runs `call.node` on the device, or says why it cannot (see the module doc).
pub(crate) fn lower(call: &OpCall<'_>) -> AscendResult<Lowered> {
    let op = call.node.op;
    match route(op) {
        Route::Kernel(f) => f(call),
        Route::Host => host(host_fallback(op).unwrap_or("no aclnn lowering")),
    }
}

macro_rules! f32_or_host {
    ($call:expr) => {
        if let Some(why) = not_f32($call) {
            return host(why);
        }
    };
}

/// The view of a matmul operand: its last two axes swapped when transposed.
fn operand_view(shape: &[usize], transposed: bool) -> (Vec<usize>, Vec<i64>) {
    let mut s = shape.to_vec();
    let mut st = contiguous_strides(shape);
    if transposed {
        let r = s.len();
        s.swap(r - 1, r - 2);
        st.swap(r - 1, r - 2);
    }
    (s, st)
}

fn matmul(call: &OpCall<'_>) -> AscendResult<Lowered> {
    f32_or_host!(call);
    let (a, ta) = call.tensor(0)?;
    let (b, tb) = call.tensor(1)?;
    let (y, ty) = call.out(0)?;
    let tr_a = call.node.attrs.bool_or("transpose_a", false);
    let tr_b = call.node.attrs.bool_or("transpose_b", false);
    if ta.shape.len() < 2 || tb.shape.len() < 2 || ty.shape.len() < 2 {
        return Err(call.err(format!(
            "operands of rank >= 2 expected, got {:?} and {:?}",
            ta.shape, tb.shape
        )));
    }
    if ty.num_elements() == 0 {
        return Ok(Lowered::Device);
    }
    let (sa, sta) = operand_view(&ta.shape, tr_a);
    let k = sa[sa.len() - 1];
    if k == 0 {
        call.dev.zero(y, ty.size_bytes())?;
        return Ok(Lowered::Device);
    }
    let (sb, stb) = operand_view(&tb.shape, tr_b);
    let va = call.view(a, ta.dtype, &sa, &sta, 0)?;
    let vb = call.view(b, tb.dtype, &sb, &stb, 0)?;
    let vy = call.desc(y, ty)?;
    crate::aclnn!(
        &call.runner(),
        aclnnMatmul,
        aclnnMatmulGetWorkspaceSize(va.ptr(), vb.ptr(), vy.ptr(), sys::CUBE_MATH_KEEP_DTYPE)
    )?;
    Ok(Lowered::Device)
}

/// A binary operand as a tensor: a tensor as it is, a constant written into `slot` as a
/// 0-d tensor of `dtype`.
fn binary_operand(
    call: &OpCall<'_>,
    i: usize,
    dtype: DType,
    slot: DevPtrSlot,
) -> AscendResult<(u64, Vec<usize>)> {
    match call.inputs.get(i) {
        Some(Val::Tensor { ptr, ty }) => Ok((*ptr, ty.shape.clone())),
        Some(Val::Const(c)) => {
            let v = c
                .as_f64()
                .ok_or_else(|| call.err(format!("operand {i} must be a number, got {c:?}")))?;
            call.fill(slot, dtype, &[], v)?;
            Ok((slot, Vec::new()))
        }
        None => Err(call.err(format!("operand {i} is missing"))),
    }
}

type DevPtrSlot = u64;

/// `Add`, `Sub`, `Mul`, `RealDiv` (broadcasting; a constant operand is a 0-d tensor) and
/// `DropoutGrad(dy, mask) = dy * mask`.
fn arithmetic(call: &OpCall<'_>) -> AscendResult<Lowered> {
    use OpKind::*;
    f32_or_host!(call);
    let (y, ty) = call.out(0)?;
    let dtype = ty.dtype;
    let consts = call
        .inputs
        .iter()
        .filter(|v| matches!(v, Val::Const(_)))
        .count();
    if consts == 2 {
        return host("two constant operands");
    }
    let slots = if consts > 0 {
        call.temps(&[8])?
    } else {
        vec![0]
    };
    let (a, sa) = binary_operand(call, 0, dtype, slots[0])?;
    let (b, sb) = binary_operand(call, 1, dtype, slots[0])?;
    let da = call.desc_shape(a, dtype, &sa)?;
    let db = call.desc_shape(b, dtype, &sb)?;
    let dy = call.desc(y, ty)?;
    let r = call.runner();
    match call.node.op {
        Add | Sub => {
            let one = aclnn::scalar(call.api(), 1.0, dtype)?;
            if call.node.op == Add {
                crate::aclnn!(
                    &r,
                    aclnnAdd,
                    aclnnAddGetWorkspaceSize(da.ptr(), db.ptr(), one.ptr(), dy.ptr())
                )?
            } else {
                crate::aclnn!(
                    &r,
                    aclnnSub,
                    aclnnSubGetWorkspaceSize(da.ptr(), db.ptr(), one.ptr(), dy.ptr())
                )?
            }
        }
        Mul | DropoutGrad => crate::aclnn!(
            &r,
            aclnnMul,
            aclnnMulGetWorkspaceSize(da.ptr(), db.ptr(), dy.ptr())
        )?,
        RealDiv => crate::aclnn!(
            &r,
            aclnnDiv,
            aclnnDivGetWorkspaceSize(da.ptr(), db.ptr(), dy.ptr())
        )?,
        op => return Err(call.err(format!("{op} is not an arithmetic op"))),
    }
    Ok(Lowered::Device)
}

/// The elementwise gradients, each its aclnn backward operator (`SqrtGrad`: `dy / (2 y)`).
fn gradient(call: &OpCall<'_>) -> AscendResult<Lowered> {
    use OpKind::*;
    f32_or_host!(call);
    let (y, ty) = call.out(0)?;
    let (p0, t0) = call.tensor(0)?;
    let (p1, t1) = call.tensor(1)?;
    if t0.shape != ty.shape || t1.shape != ty.shape {
        return host("operands of different shapes (a broadcasting gradient)");
    }
    let d0 = call.desc(p0, t0)?;
    let d1 = call.desc(p1, t1)?;
    let dy = call.desc(y, ty)?;
    let r = call.runner();
    match call.node.op {
        // ReluGrad(dy, y): dy where y > 0.
        ReluGrad => {
            let zero = aclnn::scalar(call.api(), 0.0, ty.dtype)?;
            crate::aclnn!(
                &r,
                aclnnThresholdBackward,
                aclnnThresholdBackwardGetWorkspaceSize(d0.ptr(), d1.ptr(), zero.ptr(), dy.ptr())
            )?
        }
        // SigmoidGrad(y, dy), TanhGrad(y, dy).
        SigmoidGrad => crate::aclnn!(
            &r,
            aclnnSigmoidBackward,
            aclnnSigmoidBackwardGetWorkspaceSize(d1.ptr(), d0.ptr(), dy.ptr())
        )?,
        TanhGrad => crate::aclnn!(
            &r,
            aclnnTanhBackward,
            aclnnTanhBackwardGetWorkspaceSize(d1.ptr(), d0.ptr(), dy.ptr())
        )?,
        // GeLUGrad(dy, x, y): the tanh approximation's derivative at x.
        GeLUGrad => {
            let mut approximate = *b"tanh\0";
            crate::aclnn!(
                &r,
                aclnnGeluBackwardV2,
                aclnnGeluBackwardV2GetWorkspaceSize(
                    d0.ptr(),
                    d1.ptr(),
                    approximate.as_mut_ptr() as *mut std::ffi::c_char,
                    dy.ptr()
                )
            )?
        }
        // SiLUGrad(dy, x).
        SiLUGrad => crate::aclnn!(
            &r,
            aclnnSiluBackward,
            aclnnSiluBackwardGetWorkspaceSize(d0.ptr(), d1.ptr(), dy.ptr())
        )?,
        // SqrtGrad(y, dy) = dy / (2 y).
        SqrtGrad => {
            let t = call.temps(&[ty.size_bytes()])?;
            let dt = call.desc(t[0], ty)?;
            let two = aclnn::scalar(call.api(), 2.0, ty.dtype)?;
            crate::aclnn!(
                &r,
                aclnnMuls,
                aclnnMulsGetWorkspaceSize(d0.ptr(), two.ptr(), dt.ptr())
            )?;
            crate::aclnn!(
                &r,
                aclnnDiv,
                aclnnDivGetWorkspaceSize(d1.ptr(), dt.ptr(), dy.ptr())
            )?
        }
        op => return Err(call.err(format!("{op} is not an elementwise gradient"))),
    }
    Ok(Lowered::Device)
}

fn unary(call: &OpCall<'_>) -> AscendResult<Lowered> {
    use OpKind::*;
    f32_or_host!(call);
    let (x, tx) = call.tensor(0)?;
    let (y, ty) = call.out(0)?;
    let dx = call.desc(x, tx)?;
    let dy = call.desc(y, ty)?;
    let r = call.runner();
    match call.node.op {
        Neg => crate::aclnn!(&r, aclnnNeg, aclnnNegGetWorkspaceSize(dx.ptr(), dy.ptr()))?,
        Square => crate::aclnn!(
            &r,
            aclnnMul,
            aclnnMulGetWorkspaceSize(dx.ptr(), dx.ptr(), dy.ptr())
        )?,
        Sqrt => crate::aclnn!(&r, aclnnSqrt, aclnnSqrtGetWorkspaceSize(dx.ptr(), dy.ptr()))?,
        Exp => crate::aclnn!(&r, aclnnExp, aclnnExpGetWorkspaceSize(dx.ptr(), dy.ptr()))?,
        Log => crate::aclnn!(&r, aclnnLog, aclnnLogGetWorkspaceSize(dx.ptr(), dy.ptr()))?,
        ReLU => crate::aclnn!(&r, aclnnRelu, aclnnReluGetWorkspaceSize(dx.ptr(), dy.ptr()))?,
        // MindSpore's GeLU is the tanh approximation (approximate = 1).
        GeLU => crate::aclnn!(
            &r,
            aclnnGeluV2,
            aclnnGeluV2GetWorkspaceSize(dx.ptr(), 1, dy.ptr())
        )?,
        Sigmoid => crate::aclnn!(
            &r,
            aclnnSigmoid,
            aclnnSigmoidGetWorkspaceSize(dx.ptr(), dy.ptr())
        )?,
        Tanh => crate::aclnn!(&r, aclnnTanh, aclnnTanhGetWorkspaceSize(dx.ptr(), dy.ptr()))?,
        SiLU => crate::aclnn!(&r, aclnnSilu, aclnnSiluGetWorkspaceSize(dx.ptr(), dy.ptr()))?,
        Erf => crate::aclnn!(&r, aclnnErf, aclnnErfGetWorkspaceSize(dx.ptr(), dy.ptr()))?,
        op => return Err(call.err(format!("{op} is not a unary elementwise op"))),
    }
    Ok(Lowered::Device)
}

/// `BiasAdd(x, b)`: `b` (C) seen with x's shape (stride 1 on axis 1, 0 elsewhere), added.
fn bias_add(call: &OpCall<'_>) -> AscendResult<Lowered> {
    f32_or_host!(call);
    let (x, tx) = call.tensor(0)?;
    let (b, tb) = call.tensor(1)?;
    let (y, ty) = call.out(0)?;
    if tx.shape.len() < 2 || tb.shape != [tx.shape[1]] {
        return Err(call.err(format!(
            "x of rank >= 2 and a bias of shape (C) expected, got {:?} and {:?}",
            tx.shape, tb.shape
        )));
    }
    let mut strides = vec![0i64; tx.shape.len()];
    strides[1] = 1;
    let dx = call.desc(x, tx)?;
    let db = call.view(b, tb.dtype, &tx.shape, &strides, 0)?;
    let dy = call.desc(y, ty)?;
    let one = aclnn::scalar(call.api(), 1.0, ty.dtype)?;
    crate::aclnn!(
        &call.runner(),
        aclnnAdd,
        aclnnAddGetWorkspaceSize(dx.ptr(), db.ptr(), one.ptr(), dy.ptr())
    )?;
    Ok(Lowered::Device)
}

/// `BiasAddGrad(dy)`: the sum over every axis but 1.
fn bias_add_grad(call: &OpCall<'_>) -> AscendResult<Lowered> {
    f32_or_host!(call);
    let (x, tx) = call.tensor(0)?;
    let (y, ty) = call.out(0)?;
    if tx.shape.len() < 2 {
        return Err(call.err(format!("dy of rank >= 2 expected, got {:?}", tx.shape)));
    }
    let axes: Vec<i64> = (0..tx.shape.len() as i64).filter(|&a| a != 1).collect();
    reduce_sum(call, (x, tx), (y, ty), &axes, false)?;
    Ok(Lowered::Device)
}

fn reduce_sum(
    call: &OpCall<'_>,
    (x, tx): (u64, &shardc_ir::TensorType),
    (y, ty): (u64, &shardc_ir::TensorType),
    axes: &[i64],
    keep: bool,
) -> AscendResult<()> {
    let dx = call.desc(x, tx)?;
    let dy = call.desc(y, ty)?;
    let dims = aclnn::int_array(call.api(), axes)?;
    crate::aclnn!(
        &call.runner(),
        aclnnReduceSum,
        aclnnReduceSumGetWorkspaceSize(
            dx.ptr(),
            dims.ptr(),
            keep,
            aclnn::acl_dtype(ty.dtype),
            dy.ptr()
        )
    )
}

fn cast(call: &OpCall<'_>) -> AscendResult<Lowered> {
    let (x, tx) = call.tensor(0)?;
    let (y, ty) = call.out(0)?;
    if tx.dtype == ty.dtype {
        call.dev.copy(y, x, ty.size_bytes())?;
        return Ok(Lowered::Device);
    }
    let dx = call.desc(x, tx)?;
    let dy = call.desc(y, ty)?;
    crate::aclnn!(
        &call.runner(),
        aclnnCast,
        aclnnCastGetWorkspaceSize(dx.ptr(), aclnn::acl_dtype(ty.dtype), dy.ptr())
    )?;
    Ok(Lowered::Device)
}

/// `Equal(a, b)` -> Bool (a constant operand is a 0-d tensor of the other's dtype).
fn equal(call: &OpCall<'_>) -> AscendResult<Lowered> {
    let (y, ty) = call.out(0)?;
    let dtype = match (call.inputs.first(), call.inputs.get(1)) {
        (Some(Val::Tensor { ty, .. }), _) | (_, Some(Val::Tensor { ty, .. })) => ty.dtype,
        _ => return host("two constant operands"),
    };
    if let (Some(Val::Tensor { ty: a, .. }), Some(Val::Tensor { ty: b, .. })) =
        (call.inputs.first(), call.inputs.get(1))
    {
        if a.dtype != b.dtype {
            return host("operands of different element types");
        }
    }
    let slots = call.temps(&[8])?;
    let (a, sa) = binary_operand(call, 0, dtype, slots[0])?;
    let (b, sb) = binary_operand(call, 1, dtype, slots[0])?;
    let da = call.desc_shape(a, dtype, &sa)?;
    let db = call.desc_shape(b, dtype, &sb)?;
    let dy = call.desc(y, ty)?;
    crate::aclnn!(
        &call.runner(),
        aclnnEqTensor,
        aclnnEqTensorGetWorkspaceSize(da.ptr(), db.ptr(), dy.ptr())
    )?;
    Ok(Lowered::Device)
}

/// `ZerosLike` (a memset) and `OnesLike` (`aclnnInplaceFillScalar`).
fn fill(call: &OpCall<'_>) -> AscendResult<Lowered> {
    let (y, ty) = call.out(0)?;
    if call.node.op == OpKind::ZerosLike {
        call.dev.zero(y, ty.size_bytes())?;
    } else if ty.num_elements() > 0 {
        call.fill(y, ty.dtype, &ty.shape, 1.0)?;
    }
    Ok(Lowered::Device)
}

/// `Reshape`: the same bytes (nothing where the plan aliases them).
fn reshape(call: &OpCall<'_>) -> AscendResult<Lowered> {
    let (x, tx) = call.tensor(0)?;
    let (y, ty) = call.out(0)?;
    if tx.dtype != ty.dtype || tx.num_elements() != ty.num_elements() {
        return Err(call.err(format!("{tx} cannot be reshaped to {ty}")));
    }
    call.dev.copy(y, x, ty.size_bytes())?;
    Ok(Lowered::Device)
}

fn transpose(call: &OpCall<'_>) -> AscendResult<Lowered> {
    let (x, tx) = call.tensor(0)?;
    let (y, ty) = call.out(0)?;
    let perm = call
        .constant(1)?
        .as_ints()
        .ok_or_else(|| call.err("the permutation must be a constant tuple"))?;
    if perm.len() != tx.shape.len() {
        return Err(call.err(format!(
            "permutation {perm:?} does not fit rank {}",
            tx.shape.len()
        )));
    }
    if ty.num_elements() == 0 {
        return Ok(Lowered::Device);
    }
    let dx = call.desc(x, tx)?;
    let dy = call.desc(y, ty)?;
    let dims = aclnn::int_array(call.api(), &perm)?;
    crate::aclnn!(
        &call.runner(),
        aclnnPermute,
        aclnnPermuteGetWorkspaceSize(dx.ptr(), dims.ptr(), dy.ptr())
    )?;
    Ok(Lowered::Device)
}

fn broadcast_to(call: &OpCall<'_>) -> AscendResult<Lowered> {
    let (x, tx) = call.tensor(0)?;
    let (y, ty) = call.out(0)?;
    if ty.num_elements() == 0 {
        return Ok(Lowered::Device);
    }
    let dx = call.desc(x, tx)?;
    let dy = call.desc(y, ty)?;
    let shape: Vec<i64> = ty.shape.iter().map(|&d| d as i64).collect();
    let size = aclnn::int_array(call.api(), &shape)?;
    crate::aclnn!(
        &call.runner(),
        aclnnExpand,
        aclnnExpandGetWorkspaceSize(dx.ptr(), size.ptr(), dy.ptr())
    )?;
    Ok(Lowered::Device)
}

/// `OneHot(indices, depth, on_value, off_value)`; attr `axis`.
fn one_hot(call: &OpCall<'_>) -> AscendResult<Lowered> {
    let (idx, ti) = call.tensor(0)?;
    let (y, ty) = call.out(0)?;
    if !matches!(ti.dtype, DType::Int32 | DType::Int64) {
        return host(format!("{} indices", ti.dtype));
    }
    if ty.dtype != DType::Float32 {
        return host(format!("a {} one-hot", ty.dtype));
    }
    let depth = call
        .constant(1)?
        .as_int()
        .ok_or_else(|| call.err("depth must be a constant integer"))?;
    let value = |i: usize| -> AscendResult<f64> {
        call.constant(i)?
            .as_f64()
            .ok_or_else(|| call.err(format!("operand {i} must be a constant number")))
    };
    let (on, off) = (value(2)?, value(3)?);
    let axis = call.node.attrs.int_or("axis", -1);
    if ty.num_elements() == 0 {
        return Ok(Lowered::Device);
    }
    let t = call.temps(&[4, 4])?;
    call.fill(t[0], ty.dtype, &[1], on)?;
    call.fill(t[1], ty.dtype, &[1], off)?;
    let don = call.desc_shape(t[0], ty.dtype, &[1])?;
    let doff = call.desc_shape(t[1], ty.dtype, &[1])?;
    let di = call.desc(idx, ti)?;
    let dy = call.desc(y, ty)?;
    let classes =
        i32::try_from(depth).map_err(|_| call.err(format!("depth {depth} is too large")))?;
    crate::aclnn!(
        &call.runner(),
        aclnnOneHot,
        aclnnOneHotGetWorkspaceSize(di.ptr(), classes, don.ptr(), doff.ptr(), axis, dy.ptr())
    )?;
    Ok(Lowered::Device)
}

/// `Concat(x1, x2, ...)` along attr `axis`.
fn concat(call: &OpCall<'_>) -> AscendResult<Lowered> {
    let (y, ty) = call.out(0)?;
    let axis = call.axis(call.node.attrs.int_or("axis", 0), ty.shape.len())?;
    let mut descs = Vec::with_capacity(call.inputs.len());
    for i in 0..call.inputs.len() {
        let (p, t) = call.tensor(i)?;
        if t.dtype != ty.dtype {
            return host("operands of different element types");
        }
        descs.push(call.desc(p, t)?);
    }
    if ty.num_elements() == 0 {
        return Ok(Lowered::Device);
    }
    let list = aclnn::tensor_list(call.api(), descs)?;
    let dy = call.desc(y, ty)?;
    crate::aclnn!(
        &call.runner(),
        aclnnCat,
        aclnnCatGetWorkspaceSize(list.ptr(), axis as i64, dy.ptr())
    )?;
    Ok(Lowered::Device)
}

/// `Split(x)` along attr `axis` into `output_num` equal parts: each part a strided view of x
/// copied into its result (`aclnnInplaceCopy`).
fn split(call: &OpCall<'_>) -> AscendResult<Lowered> {
    let (x, tx) = call.tensor(0)?;
    let axis = call.axis(call.node.attrs.int_or("axis", 0), tx.shape.len())?;
    let strides = contiguous_strides(&tx.shape);
    let mut at = 0i64;
    for j in 0..call.outputs.len() {
        let (y, ty) = call.out(j)?;
        if ty.dtype != tx.dtype || ty.shape.len() != tx.shape.len() {
            return Err(call.err(format!("part {j} is {ty}, x is {tx}")));
        }
        if ty.num_elements() > 0 {
            let src = call.view(x, tx.dtype, &ty.shape, &strides, at * strides[axis])?;
            let dst = call.desc(y, ty)?;
            crate::aclnn!(
                &call.runner(),
                aclnnInplaceCopy,
                aclnnInplaceCopyGetWorkspaceSize(dst.ptr(), src.ptr())
            )?;
        }
        at += ty.shape[axis] as i64;
    }
    Ok(Lowered::Device)
}

/// `StridedSlice(x, begin, end, strides)` (a strided view of x copied out) and
/// `StridedSliceGrad(dy, shape, begin, end, strides)` (zeros with dy copied into the view), the
/// elements the CPU's `slice_spec` names.
fn strided_slice(call: &OpCall<'_>) -> AscendResult<Lowered> {
    let grad = call.node.op == OpKind::StridedSliceGrad;
    let (a, ta) = call.tensor(0)?;
    let (y, ty) = call.out(0)?;
    let consts = |i: usize| -> AscendResult<Vec<i64>> {
        call.constant(i)?
            .as_ints()
            .ok_or_else(|| call.err(format!("operand {i} must be constant integers")))
    };
    let k = usize::from(grad);
    let (begin, end, steps) = (consts(1 + k)?, consts(2 + k)?, consts(3 + k)?);
    for m in [
        "begin_mask",
        "end_mask",
        "ellipsis_mask",
        "new_axis_mask",
        "shrink_axis_mask",
    ] {
        if call.node.attrs.int_or(m, 0) != 0 {
            return host(format!("a non-zero {m}"));
        }
    }
    let full = if grad { &ty.shape } else { &ta.shape };
    let spec =
        shardc_ir::geometry::slice_spec(full, &begin, &end, &steps).map_err(|e| call.err(e))?;
    let own = contiguous_strides(full);
    let shape: Vec<usize> = spec.iter().map(|s| s.2).collect();
    let strides: Vec<i64> = spec
        .iter()
        .zip(&own)
        .map(|(s, &o)| o * s.1 as i64)
        .collect();
    let offset: i64 = spec.iter().zip(&own).map(|(s, &o)| o * s.0 as i64).sum();
    if grad {
        call.dev.zero(y, ty.size_bytes())?;
    }
    if shape.iter().product::<usize>() == 0 {
        return Ok(Lowered::Device);
    }
    let r = call.runner();
    if grad {
        let dst = call.view(y, ty.dtype, &shape, &strides, offset)?;
        let src = call.desc_shape(a, ta.dtype, &shape)?;
        crate::aclnn!(
            &r,
            aclnnInplaceCopy,
            aclnnInplaceCopyGetWorkspaceSize(dst.ptr(), src.ptr())
        )?;
    } else {
        let src = call.view(a, ta.dtype, &shape, &strides, offset)?;
        let dst = call.desc_shape(y, ty.dtype, &shape)?;
        crate::aclnn!(
            &r,
            aclnnInplaceCopy,
            aclnnInplaceCopyGetWorkspaceSize(dst.ptr(), src.ptr())
        )?;
    }
    Ok(Lowered::Device)
}

/// `UnsortedSegmentSum(x, segment_ids, num_segments)`: `aclnnIndexAdd` of x's rows (ids
/// flattened, x seen as `(ids, rest)`) into zeros, rows added in index order as on the CPU.
/// The ids are checked on the host first: one not below `num_segments` is an error naming
/// its position (as on the CPU); negative ids (which MindSpore drops) and blocks of a split
/// result (`global_shape`) run on the host.
fn unsorted_segment_sum(call: &OpCall<'_>) -> AscendResult<Lowered> {
    if call.node.attrs.get("global_shape").is_some() {
        return host("a block of a split result (global_shape/offset): ids outside the block are skipped, which aclnnIndexAdd cannot express");
    }
    let (x, tx) = call.tensor(0)?;
    let (ids, tids) = call.tensor(1)?;
    let (y, ty) = call.out(0)?;
    if tx.dtype != DType::Float32 || ty.dtype != DType::Float32 {
        return host("only Float32 sums run through aclnn");
    }
    if !matches!(tids.dtype, DType::Int32 | DType::Int64) {
        return host(format!("{} segment ids", tids.dtype));
    }
    let num = call
        .constant(2)?
        .as_int()
        .ok_or_else(|| call.err("num_segments must be a constant integer"))?;
    let k = tids.shape.len();
    if tx.shape.len() < k || tx.shape[..k] != tids.shape[..] {
        return Err(call.err(format!(
            "segment_ids shape {:?} is not a prefix of x's shape {:?}",
            tids.shape, tx.shape
        )));
    }
    let mut bytes = vec![0u8; tids.size_bytes()];
    call.dev.download(ids, &mut bytes)?;
    let t = shardc_runtime::Tensor::from_le_bytes(tids, &bytes);
    for i in 0..tids.num_elements() {
        let v = t.data.get_f64(i) as i64;
        if v >= num {
            return Err(call.err(format!(
                "segment id {v} (position {i}) is not below num_segments {num}"
            )));
        }
        if v < 0 {
            return host("negative segment ids (dropped, as MindSpore's)");
        }
    }
    call.dev.zero(y, ty.size_bytes())?;
    let n = tids.num_elements();
    if n == 0 || ty.num_elements() == 0 {
        return Ok(Lowered::Device);
    }
    let mut rows = vec![n];
    rows.extend_from_slice(&tx.shape[k..]);
    let tmp = call.temps(&[ty.size_bytes()])?;
    call.dev.zero(tmp[0], ty.size_bytes())?;
    let (dzero, dsrc, didx, dy) = (
        call.desc(tmp[0], ty)?,
        call.desc_shape(x, tx.dtype, &rows)?,
        call.desc_shape(ids, tids.dtype, &[n])?,
        call.desc(y, ty)?,
    );
    let one = aclnn::scalar(call.api(), 1.0, ty.dtype)?;
    crate::aclnn!(
        &call.runner(),
        aclnnIndexAdd,
        aclnnIndexAddGetWorkspaceSize(dzero.ptr(), 0, didx.ptr(), dsrc.ptr(), one.ptr(), dy.ptr())
    )?;
    Ok(Lowered::Device)
}

/// `Gather(params, indices, axis)`: `aclnnIndexSelect` with the indices flattened (the result
/// is the same memory seen as `params.shape[..axis] ++ (n) ++ params.shape[axis+1..]`).
fn gather(call: &OpCall<'_>) -> AscendResult<Lowered> {
    if call.node.attrs.get("global_shape").is_some() {
        return host("a block of a split table (global_shape/offset): indices outside the block give zeros, which aclnnIndexSelect cannot express");
    }
    let (p, tp) = call.tensor(0)?;
    let (i, ti) = call.tensor(1)?;
    let (y, ty) = call.out(0)?;
    if !matches!(ti.dtype, DType::Int32 | DType::Int64) {
        return host(format!("{} indices", ti.dtype));
    }
    let axis = call
        .constant(2)?
        .as_int()
        .ok_or_else(|| call.err("axis must be a constant integer"))?;
    let axis = call.axis(axis, tp.shape.len())?;
    let n = ti.num_elements();
    if ty.num_elements() == 0 {
        return Ok(Lowered::Device);
    }
    let mut flat = tp.shape[..axis].to_vec();
    flat.push(n);
    flat.extend_from_slice(&tp.shape[axis + 1..]);
    let dp = call.desc(p, tp)?;
    let di = call.desc_shape(i, ti.dtype, &[n])?;
    let dy = call.desc_shape(y, ty.dtype, &flat)?;
    crate::aclnn!(
        &call.runner(),
        aclnnIndexSelect,
        aclnnIndexSelectGetWorkspaceSize(dp.ptr(), axis as i64, di.ptr(), dy.ptr())
    )?;
    Ok(Lowered::Device)
}

/// `ReduceSum` / `ReduceMean` / `ReduceMax(x, axes)`; attr `keep_dims`. The axes are always
/// given explicitly (an empty tuple is every axis).
fn reduce(call: &OpCall<'_>) -> AscendResult<Lowered> {
    f32_or_host!(call);
    let (x, tx) = call.tensor(0)?;
    let (y, ty) = call.out(0)?;
    let rank = tx.shape.len();
    let given: Vec<i64> = match call.inputs.get(1) {
        None => Vec::new(),
        Some(Val::Const(c)) => c
            .as_ints()
            .ok_or_else(|| call.err(format!("axes must be integers, got {c:?}")))?,
        Some(Val::Tensor { .. }) => return host("axes given as a tensor"),
    };
    let mut axes: Vec<i64> = if given.is_empty() {
        (0..rank as i64).collect()
    } else {
        given
            .iter()
            .map(|&a| call.axis(a, rank).map(|a| a as i64))
            .collect::<AscendResult<_>>()?
    };
    axes.sort_unstable();
    axes.dedup();
    let keep = call.node.attrs.bool_or("keep_dims", false);
    if axes.is_empty() {
        call.dev.copy(y, x, ty.size_bytes())?;
        return Ok(Lowered::Device);
    }
    if tx.num_elements() == 0 || ty.num_elements() == 0 {
        return host("an empty reduction");
    }
    let dx = call.desc(x, tx)?;
    let dy = call.desc(y, ty)?;
    let dims = aclnn::int_array(call.api(), &axes)?;
    let dt = aclnn::acl_dtype(ty.dtype);
    let r = call.runner();
    match call.node.op {
        OpKind::ReduceSum => crate::aclnn!(
            &r,
            aclnnReduceSum,
            aclnnReduceSumGetWorkspaceSize(dx.ptr(), dims.ptr(), keep, dt, dy.ptr())
        )?,
        OpKind::ReduceMean => crate::aclnn!(
            &r,
            aclnnMean,
            aclnnMeanGetWorkspaceSize(dx.ptr(), dims.ptr(), keep, dt, dy.ptr())
        )?,
        OpKind::ReduceMax => crate::aclnn!(
            &r,
            aclnnAmax,
            aclnnAmaxGetWorkspaceSize(dx.ptr(), dims.ptr(), keep, dy.ptr())
        )?,
        op => return Err(call.err(format!("{op} is not a reduction"))),
    }
    Ok(Lowered::Device)
}

fn softmax(call: &OpCall<'_>) -> AscendResult<Lowered> {
    f32_or_host!(call);
    let (x, tx) = call.tensor(0)?;
    let (y, ty) = call.out(0)?;
    let axis = call.axis(call.int_attr("axis", -1)?, tx.shape.len())? as i64;
    if ty.num_elements() == 0 {
        return Ok(Lowered::Device);
    }
    let dx = call.desc(x, tx)?;
    let dy = call.desc(y, ty)?;
    let r = call.runner();
    if call.node.op == OpKind::Softmax {
        crate::aclnn!(
            &r,
            aclnnSoftmax,
            aclnnSoftmaxGetWorkspaceSize(dx.ptr(), axis, dy.ptr())
        )?
    } else {
        crate::aclnn!(
            &r,
            aclnnLogSoftmax,
            aclnnLogSoftmaxGetWorkspaceSize(dx.ptr(), axis, dy.ptr())
        )?
    }
    Ok(Lowered::Device)
}

/// `SoftmaxGrad(y, dy)` / `LogSoftmaxGrad(y, dy)` along attr `axis`.
fn softmax_grad(call: &OpCall<'_>) -> AscendResult<Lowered> {
    f32_or_host!(call);
    let (y, ty) = call.tensor(0)?;
    let (g, tg) = call.tensor(1)?;
    let (o, to) = call.out(0)?;
    if ty.shape != tg.shape {
        return Err(call.err(format!("y {ty} and dy {tg} differ")));
    }
    let axis = call.axis(call.int_attr("axis", -1)?, ty.shape.len())? as i64;
    if to.num_elements() == 0 {
        return Ok(Lowered::Device);
    }
    let dy = call.desc(y, ty)?;
    let dg = call.desc(g, tg)?;
    let dout = call.desc(o, to)?;
    let r = call.runner();
    if call.node.op == OpKind::SoftmaxGrad {
        crate::aclnn!(
            &r,
            aclnnSoftmaxBackward,
            aclnnSoftmaxBackwardGetWorkspaceSize(dg.ptr(), dy.ptr(), axis, dout.ptr())
        )?
    } else {
        crate::aclnn!(
            &r,
            aclnnLogSoftmaxBackward,
            aclnnLogSoftmaxBackwardGetWorkspaceSize(dg.ptr(), dy.ptr(), axis, dout.ptr())
        )?
    }
    Ok(Lowered::Device)
}

/// LayerNorm's normalized axes from attr `begin_norm_axis`, when `begin_params_axis` is the
/// same (aclnn's weight has the normalized shape); else the reason it is not.
fn norm_axes(call: &OpCall<'_>, rank: usize) -> AscendResult<Result<usize, String>> {
    let bna = call.axis(call.node.attrs.int_or("begin_norm_axis", -1), rank)?;
    let bpa = call.axis(call.node.attrs.int_or("begin_params_axis", -1), rank)?;
    Ok(if bna == bpa {
        Ok(bna)
    } else {
        Err(format!(
            "begin_params_axis {bpa} differs from begin_norm_axis {bna}: aclnnLayerNorm's weight has the normalized shape"
        ))
    })
}

/// `LayerNorm(x, gamma, beta)` -> `(y, mean, rstd)`.
fn layer_norm(call: &OpCall<'_>) -> AscendResult<Lowered> {
    f32_or_host!(call);
    let (x, tx) = call.tensor(0)?;
    let (g, tg) = call.tensor(1)?;
    let (b, tb) = call.tensor(2)?;
    let bna = match norm_axes(call, tx.shape.len())? {
        Ok(a) => a,
        Err(why) => return host(why),
    };
    if tx.num_elements() == 0 {
        return host("an empty tensor");
    }
    let eps = call.node.attrs.float_or("epsilon", 1e-7);
    let (y, ty) = call.out(0)?;
    let (m, tm) = call.out(1)?;
    let (rs, trs) = call.out(2)?;
    let shape: Vec<i64> = tx.shape[bna..].iter().map(|&d| d as i64).collect();
    let norm = aclnn::int_array(call.api(), &shape)?;
    let (dx, dg, db) = (call.desc(x, tx)?, call.desc(g, tg)?, call.desc(b, tb)?);
    let (dy, dm, dr) = (call.desc(y, ty)?, call.desc(m, tm)?, call.desc(rs, trs)?);
    crate::aclnn!(
        &call.runner(),
        aclnnLayerNorm,
        aclnnLayerNormGetWorkspaceSize(
            dx.ptr(),
            norm.ptr(),
            dg.ptr(),
            db.ptr(),
            eps,
            dy.ptr(),
            dm.ptr(),
            dr.ptr()
        )
    )?;
    Ok(Lowered::Device)
}

/// `LayerNormGrad(x, dy, rstd, mean, gamma)` -> `(dx, dgamma, dbeta)`.
fn layer_norm_grad(call: &OpCall<'_>) -> AscendResult<Lowered> {
    f32_or_host!(call);
    let (x, tx) = call.tensor(0)?;
    let (dy, tdy) = call.tensor(1)?;
    let (rs, trs) = call.tensor(2)?;
    let (m, tm) = call.tensor(3)?;
    let (g, tg) = call.tensor(4)?;
    let bna = match norm_axes(call, tx.shape.len())? {
        Ok(a) => a,
        Err(why) => return host(why),
    };
    if tx.num_elements() == 0 {
        return host("an empty tensor");
    }
    let (o0, t0) = call.out(0)?;
    let (o1, t1) = call.out(1)?;
    let (o2, t2) = call.out(2)?;
    let shape: Vec<i64> = tx.shape[bna..].iter().map(|&d| d as i64).collect();
    let norm = aclnn::int_array(call.api(), &shape)?;
    let mask = aclnn::bool_array(call.api(), &[true, true, true])?;
    let (dx_in, ddy, drs, dm, dg) = (
        call.desc(x, tx)?,
        call.desc(dy, tdy)?,
        call.desc(rs, trs)?,
        call.desc(m, tm)?,
        call.desc(g, tg)?,
    );
    let (d0, d1, d2) = (call.desc(o0, t0)?, call.desc(o1, t1)?, call.desc(o2, t2)?);
    crate::aclnn!(
        &call.runner(),
        aclnnLayerNormBackward,
        aclnnLayerNormBackwardGetWorkspaceSize(
            ddy.ptr(),
            dx_in.ptr(),
            norm.ptr(),
            dm.ptr(),
            drs.ptr(),
            dg.ptr(),
            std::ptr::null(),
            mask.ptr(),
            d0.ptr(),
            d1.ptr(),
            d2.ptr()
        )
    )?;
    Ok(Lowered::Device)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_op_is_routed_and_the_fallbacks_are_exactly_the_host_routes() {
        for &op in OpKind::ALL {
            assert_eq!(
                has_kernel(op),
                host_fallback(op).is_none(),
                "{op}: HOST_FALLBACKS and route() disagree"
            );
        }
    }
}
