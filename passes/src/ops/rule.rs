//! The types of an op's rules: [`OpRule`] and the kinds of each rule.

use crate::autodiff::rules::{Grads, Rule};
use crate::infer::context::Cx;
use crate::infer::error::InferError;
use crate::infer::signatures::Signature;
use crate::parallel::dims::{DimsCx, DimsError, OpDims};
use shardc_ir::{Graph, Node, OpKind};

/// The shape and dtype rule of an op: the result type of the node in `Cx` (its signature is
/// already checked).
pub(crate) type InferFn = for<'a, 'b> fn(&'a Cx<'b>) -> Result<shardc_ir::Type, InferError>;

/// A gradient rule: the gradients of the forward node's operands from those of its results.
pub(crate) type GradientFn = for<'a, 'e> fn(&'a mut Rule<'e>) -> Grads;

/// A parallel rule: the op as loops.
pub(crate) type DimsFn = for<'a, 'b> fn(&'a DimsCx<'b>) -> Result<OpDims, DimsError>;

/// An op's gradient rule, or why it has none.
#[derive(Clone, Copy)]
pub enum Gradient {
    /// The rule that emits the gradients of the operands.
    Rule(GradientFn),
    /// The op has no gradient, for this reason (reported as "has no gradient: reason").
    None(&'static str),
    /// The autodiff driver handles the op itself (`TupleGetItem` routes its gradient to the
    /// tuple's element); the rule is never asked.
    Driver(&'static str),
}

/// Which operands of an op can carry a gradient (before looking at dtypes and at what depends
/// on what; a constant operand never does). An op with no gradient rule counts its tensor
/// operands as differentiable, so that a loss depending on them through it is reported.
#[derive(Clone, Copy)]
pub enum Operands {
    /// Every tensor operand.
    All,
    /// Only the first (the others are indices, segment ids, masks or labels).
    First,
    /// None: the result is integer-valued or constant, no gradient flows through it.
    NoneOf,
    /// Those for which the function says so, given the node and the operand's position.
    Some(fn(&Node, usize) -> bool),
}

/// An op's parallel rule, or why it has no strategy of its own.
#[derive(Clone, Copy)]
pub enum Dims {
    /// The op as loops.
    Rule(DimsFn),
    /// The op has no strategy of its own, for this reason (it is plumbing or communication,
    /// inserted or routed by the parallel passes).
    NoStrategy(&'static str),
}

/// What an op costs in the strategy search's compute model (`parallel::search::problem`).
#[derive(Clone, Copy)]
pub enum Cost {
    /// Runs at the machine's vector rate; the number is one iteration's (element's) work
    /// relative to an add: a transcendental function tens of operations, a normalisation or
    /// a softmax its several passes over the row.
    Vector(f64),
    /// A contraction at the GEMM rate: the FLOPs of one iteration of its loops.
    Gemm(fn(&Graph, &Node) -> f64),
}

/// The window geometry an op follows (`shardc_ir::geometry`, shared with the backends'
/// kernels so that they agree on where each window sits).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Window {
    /// Not a windowed op.
    None,
    /// A 2-D convolution's windows (`shardc_ir::geometry::conv2d_geometry`).
    Conv2d,
    /// A 2-D pooling's windows (`shardc_ir::geometry::pool2d_geometry`).
    Pool2d,
}

/// Every rule of one op. All fields are given in each entry: there are no defaults.
pub struct OpRule {
    /// The op.
    pub op: OpKind,
    /// Its operands: names and kinds by position.
    pub signature: Signature,
    /// Its shape and dtype rule.
    pub(crate) infer: InferFn,
    /// Its gradient rule, or why it has none.
    pub gradient: Gradient,
    /// Which of its operands can carry a gradient.
    pub differentiable: Operands,
    /// Its parallel rule, or why it has no strategy of its own.
    pub dims: Dims,
    /// Its cost.
    pub cost: Cost,
    /// The window geometry it follows.
    pub window: Window,
}
