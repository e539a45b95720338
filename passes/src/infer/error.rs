//! The error of shape inference: a user mistake in a node's operands or attributes.

use shardc_ir::geometry::GeometryError;
use shardc_ir::{Node, OpKind};

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

impl From<GeometryError> for InferError {
    fn from(e: GeometryError) -> Self {
        InferError {
            op: e.op,
            instance: e.instance,
            reason: e.reason,
        }
    }
}
