//! The error of autodiff: why the backward pass or the training step cannot be built.

use crate::infer::error::InferError;
use shardc_ir::OpKind;

/// Why the backward pass or the training step cannot be built. Every variant about a node
/// names its op and instance.
#[derive(Debug, thiserror::Error)]
pub enum AutodiffError {
    /// The graph returns nothing, so there is no loss.
    #[error("autodiff: graph '{graph}' returns no value; its first output must be the loss")]
    NoLoss {
        /// The graph's name.
        graph: String,
    },
    /// The loss is not a scalar float tensor.
    #[error("autodiff: the loss {loss} must be a scalar float tensor, got {ty}")]
    BadLoss {
        /// The loss operand as text (`%6`, `%para3_w`, a constant).
        loss: String,
        /// Its type as text.
        ty: String,
    },
    /// The loss depends, through a differentiable path, on an op that has no gradient.
    #[error("autodiff: {op} '{instance}' has no gradient rule, but the loss depends on it through a differentiable path: {reason}")]
    NoGradient {
        /// The op.
        op: OpKind,
        /// Its instance name (or `%N` when it has none).
        instance: String,
        /// Why there is no gradient.
        reason: String,
    },
    /// A forward node is malformed in a way its gradient rule cannot work with (the forward
    /// graph was not verified).
    #[error("autodiff: {op} '{instance}': {reason}")]
    BadNode {
        /// The op.
        op: OpKind,
        /// Its instance name (or `%N`).
        instance: String,
        /// What is wrong.
        reason: String,
    },
    /// A node emitted for the gradient of a forward node failed shape inference.
    #[error("autodiff: differentiating {op} '{instance}': the emitted {emitted} '{emitted_instance}' is ill-typed: {source}")]
    Emit {
        /// The forward op being differentiated.
        op: OpKind,
        /// Its instance name.
        instance: String,
        /// The op that was emitted.
        emitted: OpKind,
        /// The emitted node's instance name.
        emitted_instance: String,
        /// The shape-inference error.
        #[source]
        source: InferError,
    },
    /// The optimizer cannot be added.
    #[error("autodiff: optimizer {optimizer}: {reason}")]
    Optimizer {
        /// The optimizer (`Momentum`, `SGD`, `Adam`).
        optimizer: &'static str,
        /// What is wrong (a state name already taken, a weight of a non-float type).
        reason: String,
    },
}
