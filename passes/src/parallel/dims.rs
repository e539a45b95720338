//! The loop-dimension view of every op: which dimensions of its inputs and outputs are the
//! same iteration space, which may be split, and how results combine when a dimension that an
//! output lacks is split (a contraction gives partial sums).
//!
//! This module holds the types and helpers of that view; each op's dims are part of its rules
//! in its family module of [`crate::ops`] (`crate::ops::op_dims` describes the op as loops,
//! like an einsum: MatMul is `(i, k) x (k, j) -> (i, j)` over loops `i, k, j`), and `rules`
//! turns a strategy into layouts from them.

use shardc_ir::{Graph, Node, Operand, ReduceOp};

/// What one tensor dimension is in the op's iteration space.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dim {
    /// The dimension runs over loop `l`.
    Loop(usize),
    /// The dimension must stay whole (a broadcast size-1 dimension, or one the op needs whole).
    Whole,
    /// An input dimension read through windows that follow loop `l` (a convolution's input
    /// rows, for the output rows `l`): the strategy's split of this dimension splits loop `l`,
    /// but each part reads a window that can reach anywhere, so the operand is whole along it
    /// (gathered) and the local op slices its window.
    Window(usize),
}

impl Dim {
    /// The loop the dimension follows, if any (`Loop` and `Window`).
    pub fn loop_of(self) -> Option<usize> {
        match self {
            Dim::Loop(l) | Dim::Window(l) => Some(l),
            Dim::Whole => None,
        }
    }
}

/// An op as loops.
#[derive(Clone, Debug, Default)]
pub struct OpDims {
    /// The extent of each loop (informative; divisibility is checked per tensor dimension).
    pub loop_sizes: Vec<usize>,
    /// Per operand: its dimensions, or `None` for a constant operand.
    pub inputs: Vec<Option<Vec<Dim>>>,
    /// Per result (one for a tensor result, one per element of a tuple result).
    pub outputs: Vec<Vec<Dim>>,
    /// Per loop: how a result that lacks the loop combines over its split (a contraction sums).
    pub combine: Vec<Option<ReduceOp>>,
    /// Per loop: why it may not be split, if it may not.
    pub fixed: Vec<Option<String>>,
    /// Loops whose split count also divides the results (a mean computed over a local block
    /// must be scaled by `1/split` to be a term of the global mean).
    pub mean_loops: Vec<usize>,
    /// Per loop: a result that lacks the loop is the same on every part of its split (it is
    /// computed from per-channel inputs that are already complete), so it is replicated, not
    /// partial (BNTrainingUpdate's statistics).
    pub uniform: Vec<bool>,
}

impl OpDims {
    /// Dims with one loop per size, nothing combined, fixed, mean or uniform yet.
    pub(crate) fn with_loops(sizes: Vec<usize>) -> OpDims {
        let n = sizes.len();
        OpDims {
            loop_sizes: sizes,
            inputs: Vec::new(),
            outputs: Vec::new(),
            combine: vec![None; n],
            fixed: vec![None; n],
            mean_loops: Vec::new(),
            uniform: vec![false; n],
        }
    }

    /// Marks loop `l` as not splittable (the first reason given is kept).
    pub(crate) fn fix(&mut self, l: usize, why: impl Into<String>) {
        if self.fixed[l].is_none() {
            self.fixed[l] = Some(why.into());
        }
    }

    /// `Loop(0), .., Loop(rank - 1)`.
    pub(crate) fn identity(rank: usize) -> Vec<Dim> {
        (0..rank).map(Dim::Loop).collect()
    }
}

/// Why the dims of an op cannot be described.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DimsError(pub String);

fn shape_of(g: &Graph, o: &Operand) -> Option<Vec<usize>> {
    g.operand_tensor_type(o).map(|t| t.shape.clone())
}

/// The shapes of the node's operands (`None` for constants) and results.
fn shapes(g: &Graph, node: &Node) -> (Vec<Option<Vec<usize>>>, Vec<Vec<usize>>) {
    let ins = node.inputs.iter().map(|o| shape_of(g, o)).collect();
    let outs = node.ty.tensors().iter().map(|t| t.shape.clone()).collect();
    (ins, outs)
}

/// Dims of a tensor of `shape` broadcast against an output of rank `out_rank`: aligned from
/// the right; a size-1 dimension where the output is larger stays whole.
pub(crate) fn broadcast_dims(shape: &[usize], out: &[usize]) -> Vec<Dim> {
    let off = out.len() - shape.len().min(out.len());
    shape
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let l = off + i;
            if n == 1 && out.get(l).copied().unwrap_or(1) != 1 {
                Dim::Whole
            } else {
                Dim::Loop(l)
            }
        })
        .collect()
}

/// The loop view of `node` (types inferred).
/// The node whose dims are being described, with the shapes of its operands and results.
pub struct DimsCx<'a> {
    /// The node (types inferred).
    pub(crate) node: &'a Node,
    /// Operand shapes (`None` for constants).
    pub(crate) ins: Vec<Option<Vec<usize>>>,
    /// Result shapes (one per tensor of the result).
    pub(crate) outs: Vec<Vec<usize>>,
    /// The first result's shape (empty when there is none).
    pub(crate) out0: Vec<usize>,
}

impl<'a> DimsCx<'a> {
    /// The context of `node` in `g`.
    pub(crate) fn new(g: &Graph, node: &'a Node) -> DimsCx<'a> {
        let (ins, outs) = shapes(g, node);
        let out0 = outs.first().cloned().unwrap_or_default();
        DimsCx {
            node,
            ins,
            outs,
            out0,
        }
    }

    /// The shape of operand `i`, which must be a tensor.
    pub(crate) fn in_shape(&self, i: usize) -> Result<Vec<usize>, DimsError> {
        self.ins
            .get(i)
            .cloned()
            .flatten()
            .ok_or_else(|| DimsError(format!("operand {i} is not a tensor")))
    }

    /// Every tensor operand broadcast against the first result; constants `None`.
    pub(crate) fn consts_as_none(&self, d: &mut OpDims) {
        d.inputs = self
            .ins
            .iter()
            .map(|s| s.as_ref().map(|s| broadcast_dims(s, &self.out0)))
            .collect();
    }
}
