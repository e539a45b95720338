//! The runtime's error type.

use crate::backend::KernelError;
use crate::comm::CommError;
use shardc_ir::{OpKind, TensorType};

/// Everything that can go wrong while preparing or running a graph. Every message names the
/// op instance, parameter or input concerned, and the reason.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// A kernel failed.
    #[error("%{} {error}", node + 1)]
    Kernel {
        /// Index of the failing node.
        node: usize,
        /// The kernel's error (op, instance, reason).
        error: KernelError,
    },
    /// A kernel returned outputs that do not have the node's result type.
    #[error("%{} {op} '{instance}': {reason}", node + 1)]
    KernelOutput {
        /// Index of the node.
        node: usize,
        /// The op kind.
        op: OpKind,
        /// The node's instance name.
        instance: String,
        /// Which backend, which output, what it left and what the node's type says.
        reason: String,
    },
    /// A data input of the graph was not fed.
    #[error("input '{input}' was not fed; it expects {expected}")]
    MissingFeed {
        /// The input's name.
        input: String,
        /// Its type.
        expected: TensorType,
    },
    /// A fed tensor does not have its input's type.
    #[error("input '{input}' expects {expected} but was fed {got}")]
    FeedMismatch {
        /// The input's name.
        input: String,
        /// Its declared type.
        expected: TensorType,
        /// The fed tensor's type.
        got: TensorType,
    },
    /// A feed names no data input of the graph (a typo, or a weight).
    #[error("feed '{name}' is not a data input of @{graph}: {reason}")]
    UnknownFeed {
        /// The feed's name.
        name: String,
        /// The graph's name.
        graph: String,
        /// Why (the known inputs, or that it is a weight).
        reason: String,
    },
    /// The same input was fed twice in one step.
    #[error("input '{input}' was fed more than once in one step")]
    DuplicateFeed {
        /// The input's name.
        input: String,
    },
    /// No weight parameter has this name.
    #[error("@{graph} has no weight parameter '{name}'{hint}")]
    UnknownParam {
        /// The name asked for.
        name: String,
        /// The graph's name.
        graph: String,
        /// Extra explanation (empty, or why: e.g. it is a data input).
        hint: String,
    },
    /// A value given for a weight does not have the weight's type.
    #[error("parameter '{param}' is {expected} but the new value is {got}")]
    ParamMismatch {
        /// The parameter's name.
        param: String,
        /// Its declared type.
        expected: TensorType,
        /// The given tensor's type.
        got: TensorType,
    },
    /// A communication op in a graph run without a communicator.
    #[error("op {op} '{instance}' needs a communicator; run under shardc launch or shardc verify")]
    NeedsCommunicator {
        /// The op kind.
        op: OpKind,
        /// The node's instance name.
        instance: String,
    },
    /// A communication node failed in the communicator.
    #[error("%{} {op} '{instance}': {error}", node + 1)]
    Comm {
        /// Index of the failing node.
        node: usize,
        /// The op kind.
        op: OpKind,
        /// The node's instance name.
        instance: String,
        /// The communicator's error (collective, group, reason).
        error: CommError,
    },
    /// The graph is malformed in a way the executor cannot run (a dangling operand, a tuple
    /// read as a tensor, ...).
    #[error("graph @{graph}: {location}: {reason}")]
    Graph {
        /// The graph's name.
        graph: String,
        /// Where: `%3 MatMul 'matmul2'`, `output 0`, `parameter 'w'`.
        location: String,
        /// What is wrong.
        reason: String,
    },
    /// An initializer cannot produce the requested tensor.
    #[error("cannot initialise {target}: {reason}")]
    Init {
        /// What was being initialised: `parameter 'w' <Tensor[Float32], (4, 8)>` or the
        /// initializer and type.
        target: String,
        /// Why.
        reason: String,
    },
    /// An executor on another device failed (a GPU's error, with the op where there is one).
    #[error("{device}: {reason}")]
    Device {
        /// The device (`GPU 0`, `emulated GPU`).
        device: String,
        /// What went wrong.
        reason: String,
    },
}
