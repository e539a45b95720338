//! The operand signature of every op: the names and kinds of its operands by position, from
//! its contract in `shardc_ir::op`.

use shardc_ir::OpKind;

/// What an operand position of an op accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OperandSpec {
    /// A tensor: a node result or a parameter.
    Tensor,
    /// A constant integer tuple (a single integer reads as a one-element tuple).
    Ints,
    /// A constant integer.
    Int,
    /// A constant number (Float or Int).
    Number,
    /// A tensor, or a Float / Int constant acting as a rank-0 tensor of the other operand's
    /// element type.
    TensorOrNumber,
    /// A scalar hyper-parameter: a Float / Int constant or a one-element float tensor.
    Scalar,
    /// A weight parameter (a `Ref`).
    Weight,
}

/// The operands an op takes: names and kinds by position.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Signature {
    /// Name and kind of each operand, in order. For a variadic op, the one repeated operand.
    pub operands: &'static [(&'static str, OperandSpec)],
    /// How many leading operands are required (the rest are optional).
    pub required: usize,
    /// Whether the op takes any number (at least `required`) of operands like the first.
    pub variadic: bool,
}

impl Signature {
    const fn fixed(operands: &'static [(&'static str, OperandSpec)]) -> Self {
        Signature {
            operands,
            required: operands.len(),
            variadic: false,
        }
    }

    /// The name of operand `i` (`x1`, `x2`, ... for a variadic op).
    pub fn name(&self, i: usize) -> String {
        if self.variadic {
            let base = self.operands.first().map_or("x", |o| o.0);
            format!("{base}{}", i + 1)
        } else {
            self.operands
                .get(i)
                .map_or_else(|| format!("extra{i}"), |o| o.0.to_string())
        }
    }

    /// The kind of operand `i`.
    pub fn spec(&self, i: usize) -> Option<OperandSpec> {
        if self.variadic {
            self.operands.first().map(|o| o.1)
        } else {
            self.operands.get(i).map(|o| o.1)
        }
    }
}

/// The operand signature of `op`, from its contract in `shardc_ir::op`.
pub fn signature(op: OpKind) -> Signature {
    use OpKind::*;
    use OperandSpec::*;
    const X: &[(&str, OperandSpec)] = &[("x", Tensor)];
    const AB: &[(&str, OperandSpec)] = &[("a", Tensor), ("b", Tensor)];
    const AB_NUM: &[(&str, OperandSpec)] = &[("a", TensorOrNumber), ("b", TensorOrNumber)];
    const Y_DY: &[(&str, OperandSpec)] = &[("y", Tensor), ("dy", Tensor)];
    const REDUCE: &[(&str, OperandSpec)] = &[("x", Tensor), ("axes", Ints)];
    const POOL_GRAD: &[(&str, OperandSpec)] = &[("x", Tensor), ("y", Tensor), ("dy", Tensor)];
    match op {
        MatMul | BatchMatMul => Signature::fixed(AB),
        Conv2D => Signature::fixed(&[("x", Tensor), ("w", Tensor)]),
        BiasAdd => Signature::fixed(&[("x", Tensor), ("b", Tensor)]),
        Add | Sub | Mul | RealDiv | Equal => Signature::fixed(AB_NUM),
        Neg | Square | Sqrt | Exp | Log | ReLU | GeLU | Sigmoid | Tanh | Cast | Dropout
        | Softmax | LogSoftmax | MaxPool | AvgPool | ZerosLike | OnesLike | Split | AllReduce
        | AllGather | ReduceScatter | AllToAll | Broadcast | Send => Signature::fixed(X),
        ReduceSum | ReduceMean | ReduceMax => Signature {
            operands: REDUCE,
            required: 1,
            variadic: false,
        },
        BatchNorm => Signature::fixed(&[
            ("x", Tensor),
            ("scale", Tensor),
            ("bias", Tensor),
            ("mean", Tensor),
            ("variance", Tensor),
        ]),
        LayerNorm => Signature::fixed(&[("x", Tensor), ("gamma", Tensor), ("beta", Tensor)]),
        Reshape => Signature::fixed(&[("x", Tensor), ("shape", Ints)]),
        Transpose => Signature::fixed(&[("x", Tensor), ("perm", Ints)]),
        OneHot => Signature::fixed(&[
            ("indices", Tensor),
            ("depth", Int),
            ("on_value", Scalar),
            ("off_value", Scalar),
        ]),
        Gather => Signature::fixed(&[("params", Tensor), ("indices", Tensor), ("axis", Int)]),
        Concat => Signature {
            operands: &[("x", Tensor)],
            required: 1,
            variadic: true,
        },
        StridedSlice => Signature::fixed(&[
            ("x", Tensor),
            ("begin", Ints),
            ("end", Ints),
            ("strides", Ints),
        ]),
        BroadcastTo => Signature::fixed(&[("x", Tensor), ("shape", Ints)]),
        SoftmaxCrossEntropyWithLogits | SparseSoftmaxCrossEntropyWithLogits => {
            Signature::fixed(&[("logits", Tensor), ("labels", Tensor)])
        }
        ApplyMomentum => Signature::fixed(&[
            ("variable", Tensor),
            ("accumulation", Tensor),
            ("learning_rate", Scalar),
            ("gradient", Tensor),
            ("momentum", Scalar),
        ]),
        ApplyGradientDescent => {
            Signature::fixed(&[("var", Tensor), ("alpha", Scalar), ("delta", Tensor)])
        }
        SGD => Signature::fixed(&[
            ("parameters", Tensor),
            ("gradient", Tensor),
            ("learning_rate", Scalar),
            ("accum", Tensor),
            ("momentum", Scalar),
            ("stat", Tensor),
        ]),
        Adam => Signature::fixed(&[
            ("var", Tensor),
            ("m", Tensor),
            ("v", Tensor),
            ("beta1_power", Scalar),
            ("beta2_power", Scalar),
            ("lr", Scalar),
            ("beta1", Scalar),
            ("beta2", Scalar),
            ("epsilon", Scalar),
            ("gradient", Tensor),
        ]),
        ReluGrad => Signature::fixed(&[("dy", Tensor), ("y", Tensor)]),
        GeLUGrad => Signature::fixed(&[("dy", Tensor), ("x", Tensor), ("y", Tensor)]),
        SigmoidGrad | TanhGrad | SqrtGrad | SoftmaxGrad | LogSoftmaxGrad => Signature::fixed(Y_DY),
        BiasAddGrad => Signature::fixed(&[("dy", Tensor)]),
        Conv2DBackpropInput => {
            Signature::fixed(&[("dy", Tensor), ("w", Tensor), ("input_size", Ints)])
        }
        Conv2DBackpropFilter => {
            Signature::fixed(&[("dy", Tensor), ("x", Tensor), ("filter_size", Ints)])
        }
        MaxPoolGrad | AvgPoolGrad => Signature::fixed(POOL_GRAD),
        BatchNormGrad => Signature::fixed(&[
            ("dy", Tensor),
            ("x", Tensor),
            ("scale", Tensor),
            ("saved_mean", Tensor),
            ("saved_rstd", Tensor),
        ]),
        BNTrainingReduce => Signature::fixed(X),
        BNTrainingUpdate => Signature::fixed(&[
            ("x", Tensor),
            ("sum", Tensor),
            ("square_sum", Tensor),
            ("scale", Tensor),
            ("bias", Tensor),
        ]),
        BNTrainingUpdateGrad => Signature::fixed(&[
            ("dy", Tensor),
            ("x", Tensor),
            ("saved_mean", Tensor),
            ("saved_rstd", Tensor),
        ]),
        BNTrainingReduceGrad => Signature::fixed(&[
            ("dy", Tensor),
            ("x", Tensor),
            ("dscale", Tensor),
            ("dbias", Tensor),
            ("scale", Tensor),
            ("saved_mean", Tensor),
            ("saved_rstd", Tensor),
        ]),
        LayerNormGrad => Signature::fixed(&[
            ("x", Tensor),
            ("dy", Tensor),
            ("rstd", Tensor),
            ("mean", Tensor),
            ("gamma", Tensor),
        ]),
        DropoutGrad => Signature::fixed(&[("dy", Tensor), ("mask", Tensor)]),
        StridedSliceGrad => Signature::fixed(&[
            ("dy", Tensor),
            ("shape", Ints),
            ("begin", Ints),
            ("end", Ints),
            ("strides", Ints),
        ]),
        UnsortedSegmentSum => Signature::fixed(&[
            ("x", Tensor),
            ("segment_ids", Tensor),
            ("num_segments", Int),
        ]),
        Receive => Signature::fixed(&[]),
        TupleGetItem => Signature::fixed(&[("t", Tensor), ("index", Int)]),
        Assign => Signature::fixed(&[("param", Weight), ("value", Tensor)]),
    }
}
