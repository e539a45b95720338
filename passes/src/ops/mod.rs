//! Every op's rules, together: one module per op family ([`OpClass`]), and in it, for each op,
//! one [`OpRule`]: its operand [`Signature`], its shape and dtype rule, its gradient rule (or
//! why it has none), its parallel rule (the op as loops, from which `parallel::rules` derives
//! its valid strategies and the communication they need; or why it has no strategy of its
//! own), its cost in the search's model, and, for a windowed op, the window geometry it
//! follows.
//!
//! [`rule`] is one exhaustive `match` on [`OpKind`]: a new variant does not compile until it
//! has an entry, and an entry is a struct literal, so every field must be given: no rule is
//! left to a default. The shared machinery stays below this module: the inference context
//! (`infer::context`), the gradient emitter (`autodiff::emitter`, `autodiff::rules`), the
//! loop types (`parallel::dims`); the public entry points (`infer::infer_node`,
//! `autodiff::gradients`, [`op_dims`], `parallel::search::problem::vector_weight`) dispatch
//! here.
//!
//! To add an op: its `OpKind` variant (`ir/src/op.rs`), its entry in its family module here
//! and its arm in [`rule`], the builder call (`compiler/src/ops.rs`, `compiler/src/builder.rs`)
//! and one kernel per backend (`backends/cpu`, `backends/cuda`). `tests/op_registry.rs` walks
//! [`OpKind::ALL`] and checks that each op has every rule and a kernel or a listed fallback.

mod communication;
mod contraction;
mod elementwise;
mod gradient;
mod loss;
mod movement;
mod optimizer;
mod plumbing;
mod reduction;

mod rule;

pub use rule::{Cost, Dims, Gradient, OpRule, Operands, Window};

use crate::infer::context::Cx;
use crate::infer::error::InferError;
use crate::infer::signatures::Signature;
use crate::parallel::dims::{DimsCx, DimsError, OpDims};
use shardc_ir::{Graph, Node, OpClass, OpKind};

/// The rules of `op`: one exhaustive match, so that a new op does not compile without them.
pub fn rule(op: OpKind) -> &'static OpRule {
    use OpKind::*;
    match op {
        // contraction
        MatMul => &contraction::MAT_MUL,
        BatchMatMul => &contraction::BATCH_MAT_MUL,
        Conv2D => &contraction::CONV2D,
        // elementwise
        BiasAdd => &elementwise::BIAS_ADD,
        Add => &elementwise::ADD,
        Sub => &elementwise::SUB,
        Mul => &elementwise::MUL,
        RealDiv => &elementwise::REAL_DIV,
        Neg => &elementwise::NEG,
        Square => &elementwise::SQUARE,
        Sqrt => &elementwise::SQRT,
        Exp => &elementwise::EXP,
        Log => &elementwise::LOG,
        ReLU => &elementwise::RELU,
        GeLU => &elementwise::GELU,
        Sigmoid => &elementwise::SIGMOID,
        Tanh => &elementwise::TANH,
        SiLU => &elementwise::SILU,
        Erf => &elementwise::ERF,
        Cast => &elementwise::CAST,
        Equal => &elementwise::EQUAL,
        Dropout => &elementwise::DROPOUT,
        // reduction
        ReduceSum => &reduction::REDUCE_SUM,
        ReduceMean => &reduction::REDUCE_MEAN,
        ReduceMax => &reduction::REDUCE_MAX,
        Softmax => &reduction::SOFTMAX,
        LogSoftmax => &reduction::LOG_SOFTMAX,
        BatchNorm => &reduction::BATCH_NORM,
        LayerNorm => &reduction::LAYER_NORM,
        MaxPool => &reduction::MAX_POOL,
        AvgPool => &reduction::AVG_POOL,
        BNTrainingReduce => &reduction::BN_TRAINING_REDUCE,
        BNTrainingUpdate => &reduction::BN_TRAINING_UPDATE,
        // movement
        Reshape => &movement::RESHAPE,
        Transpose => &movement::TRANSPOSE,
        OneHot => &movement::ONE_HOT,
        Gather => &movement::GATHER,
        Concat => &movement::CONCAT,
        Split => &movement::SPLIT,
        StridedSlice => &movement::STRIDED_SLICE,
        BroadcastTo => &movement::BROADCAST_TO,
        ZerosLike => &movement::ZEROS_LIKE,
        OnesLike => &movement::ONES_LIKE,
        // loss
        SoftmaxCrossEntropyWithLogits => &loss::SOFTMAX_CROSS_ENTROPY_WITH_LOGITS,
        SparseSoftmaxCrossEntropyWithLogits => &loss::SPARSE_SOFTMAX_CROSS_ENTROPY_WITH_LOGITS,
        // optimizer
        ApplyMomentum => &optimizer::APPLY_MOMENTUM,
        SGD => &optimizer::SGD_RULE,
        ApplyGradientDescent => &optimizer::APPLY_GRADIENT_DESCENT,
        Adam => &optimizer::ADAM,
        // gradient
        ReluGrad => &gradient::RELU_GRAD,
        GeLUGrad => &gradient::GELU_GRAD,
        SiLUGrad => &gradient::SILU_GRAD,
        SigmoidGrad => &gradient::SIGMOID_GRAD,
        TanhGrad => &gradient::TANH_GRAD,
        SqrtGrad => &gradient::SQRT_GRAD,
        BiasAddGrad => &gradient::BIAS_ADD_GRAD,
        SoftmaxGrad => &gradient::SOFTMAX_GRAD,
        LogSoftmaxGrad => &gradient::LOG_SOFTMAX_GRAD,
        Conv2DBackpropInput => &gradient::CONV2D_BACKPROP_INPUT,
        Conv2DBackpropFilter => &gradient::CONV2D_BACKPROP_FILTER,
        MaxPoolGrad => &gradient::MAX_POOL_GRAD,
        AvgPoolGrad => &gradient::AVG_POOL_GRAD,
        BatchNormGrad => &gradient::BATCH_NORM_GRAD,
        LayerNormGrad => &gradient::LAYER_NORM_GRAD,
        DropoutGrad => &gradient::DROPOUT_GRAD,
        StridedSliceGrad => &gradient::STRIDED_SLICE_GRAD,
        UnsortedSegmentSum => &gradient::UNSORTED_SEGMENT_SUM,
        BNTrainingUpdateGrad => &gradient::BN_TRAINING_UPDATE_GRAD,
        BNTrainingReduceGrad => &gradient::BN_TRAINING_REDUCE_GRAD,
        // communication
        AllReduce => &communication::ALL_REDUCE,
        AllGather => &communication::ALL_GATHER,
        ReduceScatter => &communication::REDUCE_SCATTER,
        AllToAll => &communication::ALL_TO_ALL,
        Broadcast => &communication::BROADCAST,
        Send => &communication::SEND,
        Receive => &communication::RECEIVE,
        // plumbing
        TupleGetItem => &plumbing::TUPLE_GET_ITEM,
        Assign => &plumbing::ASSIGN,
    }
}

/// The family module an op's rules live in (its [`OpClass`]), as a path for messages.
pub fn family_module(class: OpClass) -> &'static str {
    match class {
        OpClass::Contraction => "passes/src/ops/contraction.rs",
        OpClass::Elementwise => "passes/src/ops/elementwise.rs",
        OpClass::Reduction => "passes/src/ops/reduction.rs",
        OpClass::Movement => "passes/src/ops/movement.rs",
        OpClass::Loss => "passes/src/ops/loss.rs",
        OpClass::Optimizer => "passes/src/ops/optimizer.rs",
        OpClass::Gradient => "passes/src/ops/gradient.rs",
        OpClass::Communication => "passes/src/ops/communication.rs",
        OpClass::Plumbing => "passes/src/ops/plumbing.rs",
    }
}

/// The operand signature of `op`, from its contract in `shardc_ir::op`.
pub fn signature(op: OpKind) -> Signature {
    rule(op).signature
}

/// The loop view of `node` (types inferred): its parallel rule.
pub fn op_dims(g: &Graph, node: &Node) -> Result<OpDims, DimsError> {
    match rule(node.op).dims {
        Dims::Rule(f) => f(&DimsCx::new(g, node)),
        Dims::NoStrategy(why) => Err(DimsError(format!(
            "{} has no strategy of its own ({why})",
            node.op.name()
        ))),
    }
}

/// The shape and dtype rule of the node in `cx` (its signature checked already).
pub(crate) fn infer(cx: &Cx<'_>) -> Result<shardc_ir::Type, InferError> {
    (rule(cx.op()).infer)(cx)
}
