//! The operator set. Names are MindSpore's; the doc of each variant gives its operands
//! (in order), its attributes (with defaults) and its result.
//!
//! Conventions: a "const" operand is an [`crate::Const`] written in place; every other operand
//! is a tensor (a node result or a parameter). Binary elementwise ops broadcast by numpy rules,
//! and accept a `Float`/`Int` constant as a rank-0 tensor. Axes may be negative (counted from
//! the end).

use serde::{Deserialize, Serialize};

macro_rules! ops {
    ($( $(#[$doc:meta])* $variant:ident => $name:literal, $class:ident; )*) => {
        /// An operator kind.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
        pub enum OpKind {
            $( $(#[$doc])* $variant, )*
        }

        impl OpKind {
            /// Every op kind, in declaration order.
            pub const ALL: &'static [OpKind] = &[ $( OpKind::$variant, )* ];

            /// MindSpore's name of the op, as printed in the IR.
            pub fn name(self) -> &'static str {
                match self { $( OpKind::$variant => $name, )* }
            }

            /// The op kind of a name as printed in the IR.
            pub fn from_name(name: &str) -> Option<OpKind> {
                match name { $( $name => Some(OpKind::$variant), )* _ => None }
            }

            /// Which family the op belongs to.
            pub fn class(self) -> OpClass {
                match self { $( OpKind::$variant => OpClass::$class, )* }
            }
        }
    };
}

/// The family of an op: what kind of work it does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum OpClass {
    /// Elementwise arithmetic or activation.
    Elementwise,
    /// Contractions (MatMul, BatchMatMul, Conv2D and their gradients).
    Contraction,
    /// Reductions and normalisations.
    Reduction,
    /// Data movement: reshape, transpose, slice, gather, concat.
    Movement,
    /// Losses.
    Loss,
    /// Optimizer updates (read parameters and gradients, produce new values).
    Optimizer,
    /// Gradient kernels emitted by autodiff.
    Gradient,
    /// Collective communication between ranks.
    Communication,
    /// Graph plumbing (`TupleGetItem`, `Assign`).
    Plumbing,
}

ops! {
    // ---- contractions ----
    /// `MatMul(a, b)`; attrs `transpose_a`, `transpose_b` (false). `(m,k)x(k,n) -> (m,n)`.
    MatMul => "MatMul", Contraction;
    /// `BatchMatMul(a, b)`; attrs `transpose_a`, `transpose_b`. Leading dims broadcast.
    BatchMatMul => "BatchMatMul", Contraction;
    /// `Conv2D(x, w)`; x `(N,C,H,W)`, w `(O,C/group,kh,kw)`; attrs `out_channel`, `kernel_size`,
    /// `stride` (1), `pad_mode` (`valid` | `same` | `pad`), `pad` ((0,0,0,0): top, bottom,
    /// left, right), `dilation` (1), `group` (1), `data_format` (`NCHW`).
    Conv2D => "Conv2D", Contraction;

    // ---- elementwise ----
    /// `BiasAdd(x, b)`: adds `b` (C) along axis 1 (the channel of NCHW, the feature of (N, C)).
    BiasAdd => "BiasAdd", Elementwise;
    /// `Add(a, b)`, broadcasting.
    Add => "Add", Elementwise;
    /// `Sub(a, b)`, broadcasting.
    Sub => "Sub", Elementwise;
    /// `Mul(a, b)`, broadcasting.
    Mul => "Mul", Elementwise;
    /// `RealDiv(a, b)`, broadcasting.
    RealDiv => "RealDiv", Elementwise;
    /// `Neg(x)`.
    Neg => "Neg", Elementwise;
    /// `Square(x)`.
    Square => "Square", Elementwise;
    /// `Sqrt(x)`.
    Sqrt => "Sqrt", Elementwise;
    /// `Exp(x)`.
    Exp => "Exp", Elementwise;
    /// `Log(x)`.
    Log => "Log", Elementwise;
    /// `ReLU(x)`.
    ReLU => "ReLU", Elementwise;
    /// `GeLU(x)`, the tanh approximation as MindSpore's.
    GeLU => "GeLU", Elementwise;
    /// `Sigmoid(x)`.
    Sigmoid => "Sigmoid", Elementwise;
    /// `Tanh(x)`.
    Tanh => "Tanh", Elementwise;
    /// `Cast(x)`; attr `dst_type` (a dtype name such as `Float16`).
    Cast => "Cast", Elementwise;
    /// `Equal(a, b)` -> Bool, broadcasting.
    Equal => "Equal", Elementwise;
    /// `Dropout(x)`; attrs `keep_prob` (0.5), `seed0` (0), `seed1` (0). Result `(y, mask)`:
    /// `mask` has x's shape and dtype and holds `0` or `1/keep_prob`, and `y = x * mask`.
    /// The mask depends only on the seeds, the step number and the element index: same
    /// seeds, same masks. Optional `global_shape` and `offset` (Ints) say the tensor is the
    /// block at `offset` of a `global_shape` tensor (a rank's slice): masks are then drawn by
    /// global index, as on one device.
    Dropout => "Dropout", Elementwise;

    // ---- reductions / normalisation ----
    /// `ReduceSum(x, axes)`; const `axes` (Int or Ints; empty = all); attr `keep_dims` (false).
    ReduceSum => "ReduceSum", Reduction;
    /// `ReduceMean(x, axes)`; as ReduceSum.
    ReduceMean => "ReduceMean", Reduction;
    /// `ReduceMax(x, axes)`; as ReduceSum.
    ReduceMax => "ReduceMax", Reduction;
    /// `Softmax(x)`; attr `axis` (-1; Int or a one-element tuple).
    Softmax => "Softmax", Reduction;
    /// `LogSoftmax(x)`; attr `axis` (-1).
    LogSoftmax => "LogSoftmax", Reduction;
    /// `BatchNorm(x, scale, bias, mean, variance)`; attrs `is_training` (true), `epsilon`
    /// (1e-5), `momentum` (0.1). Result `(y, batch_mean, batch_variance, saved_mean,
    /// saved_rstd)`, all but y of shape (C). In training mode y uses the batch statistics
    /// (biased variance) and `batch_variance` is the unbiased one (for the moving average);
    /// in inference mode y uses `mean`/`variance`. The moving averages are updated by
    /// separate ops and `Assign` (see the frontend's BatchNorm2d).
    BatchNorm => "BatchNorm", Reduction;
    /// `LayerNorm(x, gamma, beta)`; attrs `begin_norm_axis` (-1), `begin_params_axis` (-1),
    /// `epsilon` (1e-7). Result `(y, mean, rstd)`, mean and rstd of x's shape with the
    /// normalised axes set to 1.
    LayerNorm => "LayerNorm", Reduction;
    /// `MaxPool(x)`; attrs `kernel_size`, `strides`, `pad_mode` (`valid` | `same`),
    /// `data_format` (`NCHW`).
    MaxPool => "MaxPool", Reduction;
    /// `AvgPool(x)`; as MaxPool (padding excluded from the average).
    AvgPool => "AvgPool", Reduction;

    // ---- movement ----
    /// `Reshape(x, shape)`; const `shape` (Ints, at most one -1).
    Reshape => "Reshape", Movement;
    /// `Transpose(x, perm)`; const `perm` (Ints).
    Transpose => "Transpose", Movement;
    /// `OneHot(indices, depth, on_value, off_value)`; consts `depth` (Int), `on_value`,
    /// `off_value` (Float); attr `axis` (-1). Result Float32 of indices' shape + (depth).
    OneHot => "OneHot", Movement;
    /// `Gather(params, indices, axis)`; const `axis` (Int). Result
    /// `params.shape[..axis] ++ indices.shape ++ params.shape[axis+1..]`.
    Gather => "Gather", Movement;
    /// `Concat(x1, x2, ...)`; attr `axis` (0).
    Concat => "Concat", Movement;
    /// `Split(x)`; attrs `axis` (0), `output_num` (1). Result a tuple of equal parts.
    Split => "Split", Movement;
    /// `StridedSlice(x, begin, end, strides)`; consts (Ints); attrs `begin_mask`, `end_mask`,
    /// `ellipsis_mask`, `new_axis_mask`, `shrink_axis_mask` (0; only 0 is supported).
    StridedSlice => "StridedSlice", Movement;
    /// `BroadcastTo(x, shape)`; const `shape` (Ints).
    BroadcastTo => "BroadcastTo", Movement;
    /// `ZerosLike(x)`.
    ZerosLike => "ZerosLike", Movement;
    /// `OnesLike(x)`.
    OnesLike => "OnesLike", Movement;

    // ---- losses ----
    /// `SoftmaxCrossEntropyWithLogits(logits, labels)`; logits and labels `(N, C)`, labels
    /// dense probabilities. Result `(loss (N), backprop (N, C))` with
    /// `backprop = softmax(logits) - labels`.
    SoftmaxCrossEntropyWithLogits => "SoftmaxCrossEntropyWithLogits", Loss;
    /// `SparseSoftmaxCrossEntropyWithLogits(logits, labels)`; logits `(N, C)`, labels `(N)`
    /// Int32/Int64; attr `is_grad` (false). Result: the mean loss (scalar), or with
    /// `is_grad: true` the gradient of that mean w.r.t. logits, `(softmax - onehot) / N`.
    SparseSoftmaxCrossEntropyWithLogits => "SparseSoftmaxCrossEntropyWithLogits", Loss;

    // ---- optimizers (functional: they return new values; `Assign` stores them) ----
    /// `ApplyMomentum(variable, accumulation, learning_rate, gradient, momentum)`; attr
    /// `use_nesterov` (false). `acc' = acc * momentum + grad`; `var' = var - lr * acc'`
    /// (nesterov: `var' = var - lr * (grad + momentum * acc')`). Result `(var', acc')`.
    ApplyMomentum => "ApplyMomentum", Optimizer;
    /// `SGD(parameters, gradient, learning_rate, accum, momentum, stat)`; attrs `dampening`
    /// (0), `weight_decay` (0), `nesterov` (false) as MindSpore's SGD op. Result
    /// `(parameters', accum', stat')`.
    SGD => "SGD", Optimizer;
    /// `ApplyGradientDescent(var, alpha, delta)`: `var' = var - alpha * delta`, plain SGD
    /// (what `SGD` with no momentum, dampening or weight decay reduces to, without its state).
    /// `alpha` is a rank-0 tensor or a const. Result `var'`.
    ApplyGradientDescent => "ApplyGradientDescent", Optimizer;
    /// `Adam(var, m, v, beta1_power, beta2_power, lr, beta1, beta2, epsilon, gradient)`; attr
    /// `use_nesterov` (false). `m' = b1 m + (1-b1) g`, `v' = b2 v + (1-b2) g^2`,
    /// `var' = var - lr * sqrt(1-b2p)/(1-b1p) * m' / (sqrt(v') + eps)`. beta powers, lr, betas
    /// and eps are rank-0 tensors or consts. Result `(var', m', v')`.
    Adam => "Adam", Optimizer;

    // ---- gradient kernels ----
    /// `ReluGrad(dy, y)`.
    ReluGrad => "ReluGrad", Gradient;
    /// `GeLUGrad(dy, x, y)`.
    GeLUGrad => "GeLUGrad", Gradient;
    /// `SigmoidGrad(y, dy)`.
    SigmoidGrad => "SigmoidGrad", Gradient;
    /// `TanhGrad(y, dy)`.
    TanhGrad => "TanhGrad", Gradient;
    /// `SqrtGrad(y, dy)`: `dy / (2 y)`.
    SqrtGrad => "SqrtGrad", Gradient;
    /// `BiasAddGrad(dy)`: sums all axes but 1.
    BiasAddGrad => "BiasAddGrad", Gradient;
    /// `SoftmaxGrad(y, dy)` along attr `axis`: `y * (dy - sum(dy * y))`.
    SoftmaxGrad => "SoftmaxGrad", Gradient;
    /// `LogSoftmaxGrad(y, dy)` along attr `axis`: `dy - exp(y) * sum(dy)`.
    LogSoftmaxGrad => "LogSoftmaxGrad", Gradient;
    /// `Conv2DBackpropInput(dy, w, input_size)`; const `input_size` (Ints); Conv2D's attrs.
    Conv2DBackpropInput => "Conv2DBackpropInput", Gradient;
    /// `Conv2DBackpropFilter(dy, x, filter_size)`; const `filter_size` (Ints); Conv2D's attrs.
    Conv2DBackpropFilter => "Conv2DBackpropFilter", Gradient;
    /// `MaxPoolGrad(x, y, dy)`; MaxPool's attrs. Gradient to the first maximum of each window.
    MaxPoolGrad => "MaxPoolGrad", Gradient;
    /// `AvgPoolGrad(x, y, dy)`; AvgPool's attrs.
    AvgPoolGrad => "AvgPoolGrad", Gradient;
    /// `BatchNormGrad(dy, x, scale, saved_mean, saved_rstd)`; attrs as BatchNorm. Result
    /// `(dx, dscale, dbias)` (training mode).
    BatchNormGrad => "BatchNormGrad", Gradient;
    /// `LayerNormGrad(x, dy, rstd, mean, gamma)`; attrs as LayerNorm. Result
    /// `(dx, dgamma, dbeta)`.
    LayerNormGrad => "LayerNormGrad", Gradient;
    /// `DropoutGrad(dy, mask)`: `dy * mask`.
    DropoutGrad => "DropoutGrad", Gradient;
    /// `StridedSliceGrad(dy, shape, begin, end, strides)`: scatters dy into zeros of `shape`.
    StridedSliceGrad => "StridedSliceGrad", Gradient;
    /// `UnsortedSegmentSum(x, segment_ids, num_segments)`; const `num_segments` (Int). Sums
    /// the slices of x with equal id: result `(num_segments) ++ x.shape[ids.rank..]`.
    UnsortedSegmentSum => "UnsortedSegmentSum", Gradient;

    // ---- synchronised BatchNorm (a batch split over devices; see passes::parallel::sync_bn) ----
    /// `BNTrainingReduce(x)`; x `(N, C, ...)`. Result `(sum, square_sum)`, both `(C)`: the
    /// per-channel sums of `x` and of `x * x` over every axis but 1. Over a split batch each
    /// device's result is a partial sum (completed by an AllReduce).
    BNTrainingReduce => "BNTrainingReduce", Reduction;
    /// `BNTrainingUpdate(x, sum, square_sum, scale, bias)`; attrs `epsilon` (1e-5), `count`
    /// (required: the GLOBAL number of elements per channel, N·H·W of the logical shape, which
    /// the partitioner never localises). With `mean = sum / count` and the biased
    /// `var = square_sum / count - mean^2`: the same 5-tuple as training-mode BatchNorm,
    /// `(y, batch_mean, batch_variance, saved_mean, saved_rstd)`, `y = (x - mean) * rstd *
    /// scale + bias`, `rstd = (var + epsilon)^(-1/2)`, `batch_variance` the unbiased
    /// `var * count / (count - 1)`.
    BNTrainingUpdate => "BNTrainingUpdate", Reduction;
    /// `BNTrainingUpdateGrad(dy, x, saved_mean, saved_rstd)`. Result `(dscale, dbias)`, both
    /// `(C)`: `dscale = sum(dy * (x - saved_mean) * saved_rstd)`, `dbias = sum(dy)` over every
    /// axis but 1 (partial sums over a split batch).
    BNTrainingUpdateGrad => "BNTrainingUpdateGrad", Gradient;
    /// `BNTrainingReduceGrad(dy, x, dscale, dbias, scale, saved_mean, saved_rstd)`; attr
    /// `count` (required, global as BNTrainingUpdate's). Result dx of x's shape:
    /// `scale * rstd * (dy - dbias / count - xhat * dscale / count)` with
    /// `xhat = (x - saved_mean) * rstd` (BatchNormGrad's dx, from the global sums).
    BNTrainingReduceGrad => "BNTrainingReduceGrad", Gradient;

    // ---- communication (inserted by the parallel passes) ----
    /// `AllReduce(x)`; attrs `op` (sum | max | min | prod), `group`, `rank_list`, `fusion`.
    AllReduce => "AllReduce", Communication;
    /// `AllGather(x)`; attrs `rank_list`, `axis` (0; shardc's addition, negative allowed):
    /// concatenates the members' tensors along `axis` in ascending rank order.
    AllGather => "AllGather", Communication;
    /// `ReduceScatter(x)`; attrs `op` (sum), `rank_list`, `axis` (0; shardc's addition):
    /// reduces over `rank_list`, then member i keeps block i along `axis`.
    ReduceScatter => "ReduceScatter", Communication;
    /// `AlltoAll(x)`; attrs `split_dim`, `concat_dim`, `split_count`, `rank_list`.
    AllToAll => "AlltoAll", Communication;
    /// `Broadcast(x)`; attr `root_rank`.
    Broadcast => "Broadcast", Communication;
    /// `Send(x)`; attrs `dest_rank`, `sr_tag`.
    Send => "Send", Communication;
    /// `Receive()`; attrs `src_rank`, `sr_tag`, `shape`, `dtype`.
    Receive => "Receive", Communication;

    // ---- plumbing ----
    /// `TupleGetItem(t, index)`; const `index` (Int).
    TupleGetItem => "TupleGetItem", Plumbing;
    /// `Assign(param, value)`: at this point of the step the parameter takes `value`. Later
    /// nodes may not read the parameter (the verifier checks).
    Assign => "Assign", Plumbing;

    // ---- added since: appended, because the binary format numbers variants by position ----
    /// `SiLU(x)`: `x * sigmoid(x)` (MindSpore's `ops.SiLU`, also called Swish).
    SiLU => "SiLU", Elementwise;
    /// `SiLUGrad(dy, x)`: `dy * s * (1 + x * (1 - s))` with `s = sigmoid(x)`, SiLU's gradient.
    SiLUGrad => "SiLUGrad", Gradient;
    /// `Erf(x)`: the error function `2/sqrt(pi) * integral_0^x exp(-t^2) dt` (MindSpore's
    /// `ops.Erf`; the exact GeLU is `x/2 * (1 + erf(x/sqrt(2)))`).
    Erf => "Erf", Elementwise;
}

impl OpKind {
    /// Whether the op runs collective communication.
    pub fn is_communication(self) -> bool {
        self.class() == OpClass::Communication
    }
}

impl std::fmt::Display for OpKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_round_trip() {
        let mut seen = std::collections::HashSet::new();
        for &op in OpKind::ALL {
            assert!(seen.insert(op.name()), "duplicate name {}", op.name());
            assert_eq!(OpKind::from_name(op.name()), Some(op));
        }
        assert_eq!(OpKind::from_name("NoSuchOp"), None);
    }
}
