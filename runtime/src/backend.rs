//! The contract between the executor and a backend's kernels.

use crate::tensor::Tensor;
use shardc_ir::{Const, Node, OpKind};

/// One operand as a kernel sees it: a tensor, or a constant written in place in the graph.
#[derive(Clone, Copy, Debug)]
pub enum Arg<'a> {
    /// A tensor (a node result or a parameter).
    Tensor(&'a Tensor),
    /// A constant operand (axes, shapes, scalars).
    Const(&'a Const),
}

impl<'a> Arg<'a> {
    /// The tensor, if this operand is one.
    pub fn tensor(&self) -> Option<&'a Tensor> {
        match self {
            Arg::Tensor(t) => Some(t),
            Arg::Const(_) => None,
        }
    }

    /// The constant, if this operand is one.
    pub fn constant(&self) -> Option<&'a Const> {
        match self {
            Arg::Const(c) => Some(c),
            Arg::Tensor(_) => None,
        }
    }
}

/// What a kernel may know about the step it runs in.
#[derive(Clone, Copy, Debug, Default)]
pub struct KernelContext {
    /// The training step, counted from 0 (seeds per-step randomness such as Dropout).
    pub step: u64,
    /// This process's rank (0 on one device).
    pub rank: u32,
}

/// A kernel failure: the op, its instance name and the reason.
#[derive(Debug, thiserror::Error)]
#[error("{op} '{instance}': {reason}")]
pub struct KernelError {
    /// The op kind.
    pub op: OpKind,
    /// The node's instance name.
    pub instance: String,
    /// What went wrong.
    pub reason: String,
}

impl KernelError {
    /// An error for `node` with `reason`.
    pub fn new(node: &Node, reason: impl Into<String>) -> Self {
        KernelError {
            op: node.op,
            instance: node.instance.clone(),
            reason: reason.into(),
        }
    }
}

/// A compute backend: runs one node at a time.
///
/// The executor hands every kernel its operands and its outputs already allocated with the
/// node's result types (one tensor per element of a tuple result). Contents of `outputs` on
/// entry are unspecified (buffers are reused): a kernel writes every element.
/// `TupleGetItem` and `Assign` are handled by the executor and never reach a backend;
/// communication ops go through the communicator.
pub trait Backend: Send + Sync {
    /// A short name (`cpu`).
    fn name(&self) -> &str;

    /// Runs `node`.
    fn run(
        &self,
        node: &Node,
        inputs: &[Arg<'_>],
        outputs: &mut [Tensor],
        ctx: &KernelContext,
    ) -> Result<(), KernelError>;

    /// Runs `step` (a whole training step: every kernel and the executor's bookkeeping) in
    /// the backend's threading context. A backend with its own worker threads runs the step on
    /// one of them, so that the kernels it keeps serial run on a thread of its team rather
    /// than on a further thread that competes with idle workers for the cores. The default
    /// runs `step` on the calling thread.
    fn in_context(&self, step: &mut (dyn FnMut() + Send)) {
        step()
    }
}
