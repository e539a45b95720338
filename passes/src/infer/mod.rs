//! Shape and dtype inference: the result [`Type`] of every op from its operands and attributes.
//!
//! The contract of each op (operands, attributes with defaults, result) is the doc comment of
//! its [`OpKind`] variant; each op's shape rule implements exactly that contract and lives
//! with the op's other rules in its family module of [`crate::ops`]. This module holds what
//! they share (the context `Cx`, [`InferError`], the axis and broadcast helpers) and the entry
//! points: [`infer_node`] types one node, [`infer_graph`] fills every node's type in order.
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
//!
//! [`OpKind`]: shardc_ir::OpKind

pub(crate) mod context;
pub(crate) mod error;
pub(crate) mod shapes;
pub(crate) mod signatures;
pub(crate) mod text;

#[cfg(test)]
mod tests;

pub use crate::ops::signature;
pub use error::InferError;
pub use shapes::{broadcast_shapes, normalize_axis, reduce_axes, softmax_axis};
pub use shardc_ir::geometry;
pub use shardc_ir::geometry::{
    conv2d_geometry, conv2d_output_hw, pool2d_geometry, Conv2dGeometry, Pool2dGeometry,
};
pub use signatures::{OperandSpec, Signature};
pub use text::{const_text, operand_text};

use context::Cx;
use shardc_ir::{Graph, Node, Type};

/// The result type of `node`, whose operands refer to `graph` (the node need not be in the
/// graph yet). Every node operand must refer to a node of `graph`; its stored type is used.
pub fn infer_node(graph: &Graph, node: &Node) -> Result<Type, InferError> {
    let cx = Cx {
        graph,
        node,
        limit: graph.nodes.len(),
        sig: signature(node.op),
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
    let node = &graph.nodes[index];
    let cx = Cx {
        graph,
        node,
        limit: index,
        sig: signature(node.op),
    };
    infer_cx(&cx)
}

fn infer_cx(cx: &Cx<'_>) -> Result<Type, InferError> {
    cx.check_signature()?;
    crate::ops::infer(cx)
}
