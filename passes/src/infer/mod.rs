//! Shape and dtype inference: the result [`Type`] of every op from its operands and attributes.
//!
//! The contract of each op (operands, attributes with defaults, result) is the doc comment of
//! its [`OpKind`] variant; this module implements exactly those contracts. [`infer_node`]
//! types one node, [`infer_graph`] fills every node's type in order.
//!
//! Every error names the op, its instance, the operand (by position and name, as in
//! `input 1 (b)`), the shapes involved and the reason.
//!
//! Where the contracts leave a choice, these rules decide:
//!
//! - arithmetic, activations, contractions, reductions, norms, pools, losses, optimizer
//!   updates and gradient kernels need a float element type; `Cast`, `Equal`, the movement
//!   ops and the collectives take any (`AllReduce` / `ReduceScatter` any but Bool);
//! - a `Float` / `Int` constant operand of a binary op is a rank-0 tensor of the other
//!   operand's element type (two constants are an error: nothing gives the type);
//! - `ReduceSum` / `ReduceMean` / `ReduceMax` may omit `axes` (all axes, MindSpore's default);
//! - `MatMul` / `BatchMatMul` read `transpose_a` / `transpose_b` or MindSpore's older
//!   `transpose_x1` / `transpose_x2` (both are printed in dumps; they must agree);
//! - `OneHot`'s result is Float32, or the element type of `on_value` when that is a tensor;
//! - scalar hyper-parameters (learning rates, momenta, betas, `on_value`) are number
//!   constants or one-element tensors of the result's element type;
//! - `StridedSlice` has Python semantics (negative bounds count from the end, bounds clamp,
//!   strides positive, missing trailing dims are whole);
//! - `BroadcastTo` accepts `-1` for "keep this input dim";
//! - collectives take their group from `rank_list` (or an integer `rank_size`); `AllGather`
//!   and `ReduceScatter` need one, `AlltoAll` takes `split_count` or the group size;
//! - `Send` returns its input's type (so later nodes can depend on it); `Receive` takes no
//!   operand and returns `<Tensor[dtype], shape>` from its `shape` and `dtype` attributes;
//! - `Assign` returns the parameter's type.
//!
//! Small helpers shared with autodiff and the kernels live here too: [`normalize_axis`],
//! [`broadcast_shapes`], [`reduce_axes`], [`softmax_axis`], the [`signature`] of every op and
//! the convolution / pooling [`geometry`].

use shardc_ir::{
    Attr, Const, DType, Graph, Node, OpKind, Operand, ParamKind, ShapeDisplay, TensorType, Type,
};

mod comm;
mod contraction;
mod elementwise;
pub use shardc_ir::geometry;

impl From<geometry::GeometryError> for InferError {
    fn from(e: geometry::GeometryError) -> Self {
        InferError {
            op: e.op,
            instance: e.instance,
            reason: e.reason,
        }
    }
}
mod gradient;
mod loss;
mod movement;
mod optimizer;
mod plumbing;
mod reduction;

#[cfg(test)]
mod tests;

pub use geometry::{
    conv2d_geometry, conv2d_output_hw, pool2d_geometry, Conv2dGeometry, Pool2dGeometry,
};

/// Why the result type of a node cannot be inferred: a user mistake in its operands or
/// attributes. Names the op, its instance name and the reason.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
#[error("{op} '{instance}': {reason}")]
pub struct InferError {
    /// The op.
    pub op: OpKind,
    /// The node's instance name (may be empty).
    pub instance: String,
    /// What is wrong, naming the operand, the shapes and why.
    pub reason: String,
}

impl InferError {
    /// An error about `node`.
    pub fn new(node: &Node, reason: impl Into<String>) -> Self {
        InferError {
            op: node.op,
            instance: node.instance.clone(),
            reason: reason.into(),
        }
    }
}

/// The result type of `node`, whose operands refer to `graph` (the node need not be in the
/// graph yet). Every node operand must refer to a node of `graph`; its stored type is used.
pub fn infer_node(graph: &Graph, node: &Node) -> Result<Type, InferError> {
    let cx = Cx {
        graph,
        node,
        limit: graph.nodes.len(),
    };
    infer_cx(&cx)
}

/// Fills every node's `ty` in order (used after parsing a file with no type lines). A node
/// may only use parameters and earlier nodes.
pub fn infer_graph(graph: &mut Graph) -> Result<(), InferError> {
    for i in 0..graph.nodes.len() {
        let ty = infer_at(graph, i)?;
        graph.nodes[i].ty = ty;
    }
    Ok(())
}

/// The result type of node `index` of `graph`, seeing only the nodes before it.
pub(crate) fn infer_at(graph: &Graph, index: usize) -> Result<Type, InferError> {
    let cx = Cx {
        graph,
        node: &graph.nodes[index],
        limit: index,
    };
    infer_cx(&cx)
}

fn infer_cx(cx: &Cx<'_>) -> Result<Type, InferError> {
    cx.check_signature()?;
    use shardc_ir::OpClass::*;
    match cx.node.op.class() {
        Contraction => contraction::infer(cx),
        Elementwise => elementwise::infer(cx),
        Reduction => reduction::infer(cx),
        Movement => movement::infer(cx),
        Loss => loss::infer(cx),
        Optimizer => optimizer::infer(cx),
        Gradient => gradient::infer(cx),
        Communication => comm::infer(cx),
        Plumbing => plumbing::infer(cx),
    }
}

// ---------------------------------------------------------------------------------------------
// Public helpers
// ---------------------------------------------------------------------------------------------

/// Normalizes a possibly negative `axis` for a tensor of rank `rank`: `-rank <= axis < rank`
/// gives `Some(axis mod rank)`, anything else `None`.
pub fn normalize_axis(axis: i64, rank: usize) -> Option<usize> {
    let r = i64::try_from(rank).ok()?;
    let a = if axis < 0 { axis.checked_add(r)? } else { axis };
    (0..r).contains(&a).then_some(a as usize)
}

/// The broadcast of two shapes by numpy rules: shapes are aligned at their last dimension,
/// and each pair of sizes must be equal or contain a 1. `None` when they do not broadcast.
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let rank = a.len().max(b.len());
    let mut out = vec![0; rank];
    for (i, o) in out.iter_mut().enumerate() {
        let da = (i + a.len()).checked_sub(rank).map_or(1, |j| a[j]);
        let db = (i + b.len()).checked_sub(rank).map_or(1, |j| b[j]);
        *o = if da == db || db == 1 {
            da
        } else if da == 1 {
            db
        } else {
            return None;
        };
    }
    Some(out)
}

/// The axes a `ReduceSum` / `ReduceMean` / `ReduceMax` node reduces, for an input of rank
/// `rank`: normalized, sorted and unique. A missing `axes` operand or an empty tuple means all
/// axes. Errors on an axis out of range, a repeated axis or a non-constant `axes`.
pub fn reduce_axes(node: &Node, rank: usize) -> Result<Vec<usize>, InferError> {
    let axes = match node.inputs.get(1) {
        None => Vec::new(),
        Some(Operand::Const(c)) => c.as_ints().ok_or_else(|| {
            InferError::new(
                node,
                format!(
                    "input 1 (axes) must be an integer or a tuple of integers, got {}",
                    const_text(c)
                ),
            )
        })?,
        Some(_) => {
            return Err(InferError::new(
                node,
                "input 1 (axes) must be a constant, got a tensor",
            ))
        }
    };
    if axes.is_empty() {
        return Ok((0..rank).collect());
    }
    let mut seen = vec![false; rank];
    for &a in &axes {
        let n = normalize_axis(a, rank).ok_or_else(|| {
            InferError::new(
                node,
                format!(
                    "axis {a} in axes {} is out of range for rank {rank}",
                    ints_text(&axes)
                ),
            )
        })?;
        if seen[n] {
            return Err(InferError::new(
                node,
                format!("axes {} name axis {n} more than once", ints_text(&axes)),
            ));
        }
        seen[n] = true;
    }
    Ok((0..rank).filter(|&i| seen[i]).collect())
}

/// The `axis` attribute of `Softmax`, `LogSoftmax`, `SoftmaxGrad` and `LogSoftmaxGrad`
/// (default -1; an Int or a one-element tuple or list), normalized for rank `rank`.
pub fn softmax_axis(node: &Node, rank: usize) -> Result<usize, InferError> {
    let axis = match node.attrs.get("axis") {
        None => -1,
        Some(a) => match a.as_ints().as_deref() {
            Some([v]) => *v,
            _ => {
                return Err(InferError::new(
                    node,
                    format!(
                        "attribute `axis` must be one integer (or a one-element tuple), got {}",
                        a
                    ),
                ))
            }
        },
    };
    normalize_axis(axis, rank).ok_or_else(|| {
        InferError::new(
            node,
            format!("attribute `axis` {axis} is out of range for rank {rank}"),
        )
    })
}

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

/// A short text for an operand: `%3`, `%para4_w2`, or the constant (`(0, 1)`, `0.5`).
pub fn operand_text(graph: &Graph, operand: &Operand) -> String {
    match operand {
        Operand::Node(n) => format!("%{}", n.index() + 1),
        Operand::Param(p) => match graph.params.get(p.index()) {
            Some(param) => format!("%para{}_{}", p.index() + 1, param.name),
            None => format!("%para{}", p.index() + 1),
        },
        Operand::Const(c) => const_text(c),
    }
}

/// A constant as written in the IR: `3`, `0.5`, `true`, `(0, 1)`.
pub fn const_text(c: &Const) -> String {
    match c {
        Const::Int(i) => i.to_string(),
        Const::Float(f) => format!("{f:?}"),
        Const::Bool(b) => b.to_string(),
        Const::Ints(v) => ints_text(v),
    }
}

/// Integers as a tuple: `(0, 1)`, `(3)`.
pub(crate) fn ints_text(v: &[i64]) -> String {
    let parts: Vec<String> = v.iter().map(i64::to_string).collect();
    format!("({})", parts.join(", "))
}

/// A shape as MindSpore prints it: `(8, 16)`.
pub(crate) fn sh(s: &[usize]) -> ShapeDisplay<'_> {
    ShapeDisplay(s)
}

/// Converts integers that must be sizes (>= 0) to `usize`.
pub(crate) fn to_sizes(v: &[i64]) -> Option<Vec<usize>> {
    v.iter().map(|&d| usize::try_from(d).ok()).collect()
}

// ---------------------------------------------------------------------------------------------
// The inference context shared by the op families
// ---------------------------------------------------------------------------------------------

/// One node being typed: its graph, which nodes it may see, and accessors that turn every
/// malformed operand or attribute into an [`InferError`].
pub(crate) struct Cx<'a> {
    pub graph: &'a Graph,
    pub node: &'a Node,
    /// Nodes with an index below `limit` are visible.
    pub limit: usize,
}

impl<'a> Cx<'a> {
    /// The op.
    pub fn op(&self) -> OpKind {
        self.node.op
    }

    /// An error about this node.
    pub fn err(&self, reason: impl Into<String>) -> InferError {
        InferError::new(self.node, reason)
    }

    /// `input 1 (b)`.
    pub fn name(&self, i: usize) -> String {
        format!("input {i} ({})", signature(self.node.op).name(i))
    }

    /// Checks the operand count and the kind of every operand against the op's signature.
    fn check_signature(&self) -> Result<(), InferError> {
        let sig = signature(self.op());
        let n = self.node.inputs.len();
        let names: Vec<&str> = sig.operands.iter().map(|o| o.0).collect();
        if sig.variadic {
            if n < sig.required {
                return Err(self.err(format!(
                    "expects at least {} operand(s), got {n}",
                    sig.required
                )));
            }
        } else if n < sig.required || n > sig.operands.len() {
            let expected = if sig.required == sig.operands.len() {
                format!("{}", sig.required)
            } else {
                format!("{} to {}", sig.required, sig.operands.len())
            };
            if names.is_empty() {
                return Err(self.err(format!("expects no operands, got {n}")));
            }
            return Err(self.err(format!(
                "expects {expected} operand(s) ({}), got {n}",
                names.join(", ")
            )));
        }
        for (i, operand) in self.node.inputs.iter().enumerate() {
            let spec = sig.spec(i).unwrap_or(OperandSpec::Tensor);
            self.check_kind(i, operand, spec)?;
        }
        Ok(())
    }

    fn check_kind(&self, i: usize, operand: &Operand, spec: OperandSpec) -> Result<(), InferError> {
        use OperandSpec::*;
        let wanted = match spec {
            Tensor => "a tensor",
            Ints => "a constant tuple of integers",
            Int => "a constant integer",
            Number => "a constant number",
            TensorOrNumber => "a tensor or a number constant",
            Scalar => "a number constant or a one-element float tensor",
            Weight => "a weight parameter",
        };
        let ok = match (spec, operand) {
            (Tensor, Operand::Const(_)) => false,
            (Tensor | TensorOrNumber | Scalar, _) => match operand {
                Operand::Const(c) => matches!(c, Const::Int(_) | Const::Float(_)),
                _ => true,
            },
            (Ints, Operand::Const(Const::Ints(_) | Const::Int(_))) => true,
            (Int, Operand::Const(Const::Int(_))) => true,
            (Number, Operand::Const(Const::Int(_) | Const::Float(_))) => true,
            (Weight, Operand::Param(p)) => {
                let param = self.graph.params.get(p.index()).ok_or_else(|| {
                    self.err(format!(
                        "{} refers to parameter #{}, which does not exist",
                        self.name(i),
                        p.index() + 1
                    ))
                })?;
                if !matches!(param.kind, ParamKind::Weight { .. }) {
                    return Err(self.err(format!(
                        "{} must be a weight parameter, got the data input {}",
                        self.name(i),
                        operand_text(self.graph, operand)
                    )));
                }
                true
            }
            _ => false,
        };
        if ok {
            return Ok(());
        }
        let got = match operand {
            Operand::Const(c) => format!("the constant {}", const_text(c)),
            other => format!("the tensor {}", operand_text(self.graph, other)),
        };
        Err(self.err(format!("{} must be {wanted}, got {got}", self.name(i))))
    }

    /// The type of the value operand `i` refers to: a tensor or a tuple.
    pub fn value_type(&self, i: usize) -> Result<&'a Type, InferError> {
        self.value_type_of(i).map(|(t, _)| t)
    }

    /// `(type, producing node)` of operand `i`, which must be a node or a parameter.
    fn value_type_of(&self, i: usize) -> Result<(&'a Type, Option<&'a Node>), InferError> {
        let graph: &'a Graph = self.graph;
        let operand = self
            .node
            .inputs
            .get(i)
            .ok_or_else(|| self.err(format!("{} is missing", self.name(i))))?;
        match operand {
            Operand::Node(id) => {
                let idx = id.index();
                if idx >= self.limit {
                    let why = if idx < graph.nodes.len() {
                        "which is not computed before this node"
                    } else {
                        "which does not exist"
                    };
                    return Err(self.err(format!(
                        "{} refers to %{}, {why}",
                        self.name(i),
                        idx + 1
                    )));
                }
                let n = &graph.nodes[idx];
                Ok((&n.ty, Some(n)))
            }
            Operand::Param(p) => Err(self.err(format!(
                "{} must be the result of a node, got the parameter {}",
                self.name(i),
                operand_text(graph, &Operand::Param(*p))
            ))),
            Operand::Const(c) => Err(self.err(format!(
                "{} must be a tensor, got the constant {}",
                self.name(i),
                const_text(c)
            ))),
        }
    }

    /// Operand `i` as a tensor type (a parameter or a node with a single-tensor result).
    pub fn tensor(&self, i: usize) -> Result<&'a TensorType, InferError> {
        let graph: &'a Graph = self.graph;
        match self.node.inputs.get(i) {
            Some(Operand::Param(p)) => {
                graph.params.get(p.index()).map(|p| &p.ty).ok_or_else(|| {
                    self.err(format!(
                        "{} refers to parameter #{}, which does not exist",
                        self.name(i),
                        p.index() + 1
                    ))
                })
            }
            _ => {
                let (ty, producer) = self.value_type_of(i)?;
                match ty {
                    Type::Tensor(t) => Ok(t),
                    Type::Tuple(ts) => {
                        let what = producer.map_or_else(String::new, |n| {
                            if n.instance.is_empty() {
                                format!(" ({})", n.op)
                            } else {
                                format!(" ({} '{}')", n.op, n.instance)
                            }
                        });
                        Err(self.err(format!(
                            "{} is the {}-element tuple result of {}{what}; take one element with TupleGetItem",
                            self.name(i),
                            ts.len(),
                            operand_text(graph, &self.node.inputs[i]),
                        )))
                    }
                }
            }
        }
    }

    /// Operand `i` as a tensor of a float element type.
    pub fn float_tensor(&self, i: usize) -> Result<&'a TensorType, InferError> {
        let t = self.tensor(i)?;
        if !t.dtype.is_float() {
            return Err(self.err(format!(
                "{} must have a float element type, got {t}",
                self.name(i)
            )));
        }
        Ok(t)
    }

    /// Operand `i` as a tensor of an integer element type (Int32 or Int64).
    pub fn int_tensor(&self, i: usize) -> Result<&'a TensorType, InferError> {
        let t = self.tensor(i)?;
        if !t.dtype.is_int() {
            return Err(self.err(format!(
                "{} must have an integer element type (Int32 or Int64), got {t}",
                self.name(i)
            )));
        }
        Ok(t)
    }

    /// Checks that operands `i` and `j` (both tensors) have the same element type.
    pub fn same_dtype(&self, i: usize, j: usize) -> Result<(), InferError> {
        let (a, b) = (self.tensor(i)?, self.tensor(j)?);
        if a.dtype != b.dtype {
            return Err(self.err(format!(
                "mixed element types: {} is {} but {} is {}",
                self.name(i),
                a.dtype,
                self.name(j),
                b.dtype
            )));
        }
        Ok(())
    }

    /// Checks that tensor operand `j` has exactly the type (dtype and shape) of operand `i`.
    pub fn same_type(&self, i: usize, j: usize) -> Result<(), InferError> {
        self.same_dtype(i, j)?;
        let (a, b) = (self.tensor(i)?, self.tensor(j)?);
        if a.shape != b.shape {
            return Err(self.err(format!(
                "{} has shape {} but {} has shape {}; they must be equal",
                self.name(j),
                sh(&b.shape),
                self.name(i),
                sh(&a.shape)
            )));
        }
        Ok(())
    }

    /// Checks that tensor operand `i` has shape `expected` (`why` says where it comes from).
    pub fn expect_shape(&self, i: usize, expected: &[usize], why: &str) -> Result<(), InferError> {
        let t = self.tensor(i)?;
        if t.shape != expected {
            return Err(self.err(format!(
                "{} has shape {} but {why} requires {}",
                self.name(i),
                sh(&t.shape),
                sh(expected)
            )));
        }
        Ok(())
    }

    /// Checks that tensor operand `i` has rank `rank` (`what` describes the layout).
    pub fn expect_rank(
        &self,
        i: usize,
        rank: usize,
        what: &str,
    ) -> Result<&'a TensorType, InferError> {
        let t = self.tensor(i)?;
        if t.rank() != rank {
            return Err(self.err(format!(
                "{} must have rank {rank} {what}, got shape {}",
                self.name(i),
                sh(&t.shape)
            )));
        }
        Ok(t)
    }

    /// Checks that tensor operand `i` has rank at least `rank`.
    pub fn expect_min_rank(
        &self,
        i: usize,
        rank: usize,
        what: &str,
    ) -> Result<&'a TensorType, InferError> {
        let t = self.tensor(i)?;
        if t.rank() < rank {
            return Err(self.err(format!(
                "{} must have rank >= {rank} {what}, got shape {}",
                self.name(i),
                sh(&t.shape)
            )));
        }
        Ok(t)
    }

    /// Constant operand `i`.
    pub fn constant(&self, i: usize) -> Result<&'a Const, InferError> {
        let node: &'a Node = self.node;
        match node.inputs.get(i) {
            Some(Operand::Const(c)) => Ok(c),
            Some(other) => Err(self.err(format!(
                "{} must be a constant, got the tensor {}",
                self.name(i),
                operand_text(self.graph, other)
            ))),
            None => Err(self.err(format!("{} is missing", self.name(i)))),
        }
    }

    /// Constant operand `i` as integers.
    pub fn ints(&self, i: usize) -> Result<Vec<i64>, InferError> {
        let c = self.constant(i)?;
        c.as_ints().ok_or_else(|| {
            self.err(format!(
                "{} must be a tuple of integers, got {}",
                self.name(i),
                const_text(c)
            ))
        })
    }

    /// Constant operand `i` as sizes (integers >= 0).
    pub fn sizes(&self, i: usize) -> Result<Vec<usize>, InferError> {
        let v = self.ints(i)?;
        to_sizes(&v).ok_or_else(|| {
            self.err(format!(
                "{} must hold sizes (integers >= 0), got {}",
                self.name(i),
                ints_text(&v)
            ))
        })
    }

    /// Constant operand `i` as one integer.
    pub fn int(&self, i: usize) -> Result<i64, InferError> {
        let c = self.constant(i)?;
        c.as_int().ok_or_else(|| {
            self.err(format!(
                "{} must be an integer, got {}",
                self.name(i),
                const_text(c)
            ))
        })
    }

    /// Whether operand `i` is a constant.
    pub fn is_const(&self, i: usize) -> bool {
        matches!(self.node.inputs.get(i), Some(Operand::Const(_)))
    }

    /// Checks a scalar hyper-parameter operand: a number constant, or a one-element tensor
    /// with element type `dtype`.
    pub fn scalar(&self, i: usize, dtype: DType) -> Result<(), InferError> {
        if self.is_const(i) {
            let c = self.constant(i)?;
            return match c {
                Const::Int(_) | Const::Float(_) => Ok(()),
                other => Err(self.err(format!(
                    "{} must be a number, got {}",
                    self.name(i),
                    const_text(other)
                ))),
            };
        }
        let t = self.tensor(i)?;
        if t.num_elements() != 1 {
            return Err(self.err(format!(
                "{} must be a scalar (one element), got shape {}",
                self.name(i),
                sh(&t.shape)
            )));
        }
        if t.dtype != dtype {
            return Err(self.err(format!(
                "mixed element types: {} is {} but the result is {dtype}",
                self.name(i),
                t.dtype
            )));
        }
        Ok(())
    }

    // ---- attributes ----

    fn bad_attr(&self, key: &str, wanted: &str, got: &Attr) -> InferError {
        self.err(format!("attribute `{key}` must be {wanted}, got {}", got))
    }

    /// A boolean attribute (default when absent).
    pub fn attr_bool(&self, key: &str, default: bool) -> Result<bool, InferError> {
        match self.node.attrs.get(key) {
            None => Ok(default),
            Some(a) => a
                .as_bool()
                .ok_or_else(|| self.bad_attr(key, "true or false", a)),
        }
    }

    /// An integer attribute (default when absent).
    pub fn attr_int(&self, key: &str, default: i64) -> Result<i64, InferError> {
        match self.node.attrs.get(key) {
            None => Ok(default),
            Some(a) => a
                .as_int()
                .ok_or_else(|| self.bad_attr(key, "an integer", a)),
        }
    }

    /// A required integer attribute.
    pub fn attr_int_req(&self, key: &str) -> Result<i64, InferError> {
        match self.node.attrs.get(key) {
            None => Err(self.err(format!("attribute `{key}` is missing"))),
            Some(a) => a
                .as_int()
                .ok_or_else(|| self.bad_attr(key, "an integer", a)),
        }
    }

    /// A float attribute (integers convert; default when absent).
    pub fn attr_float(&self, key: &str, default: f64) -> Result<f64, InferError> {
        match self.node.attrs.get(key) {
            None => Ok(default),
            Some(a) => a
                .as_float()
                .ok_or_else(|| self.bad_attr(key, "a number", a)),
        }
    }

    /// A word attribute (default when absent).
    pub fn attr_str(&self, key: &str, default: &'a str) -> Result<&'a str, InferError> {
        let node: &'a Node = self.node;
        match node.attrs.get(key) {
            None => Ok(default),
            Some(a) => a.as_str().ok_or_else(|| self.bad_attr(key, "a word", a)),
        }
    }

    /// An integer tuple attribute, if present.
    pub fn attr_ints(&self, key: &str) -> Result<Option<Vec<i64>>, InferError> {
        match self.node.attrs.get(key) {
            None => Ok(None),
            Some(a) => a
                .as_ints()
                .map(Some)
                .ok_or_else(|| self.bad_attr(key, "an integer or a tuple of integers", a)),
        }
    }

    /// The single result type of float ops that keep their first operand's type.
    pub fn keep(&self, i: usize) -> Result<Type, InferError> {
        Ok(Type::Tensor(self.float_tensor(i)?.clone()))
    }

    /// An internal routing error (an op sent to the wrong family): never a user mistake.
    pub fn misrouted(&self) -> InferError {
        self.err(format!(
            "internal error: no shape rule for {} in this family",
            self.op()
        ))
    }
}
