//! Shape rules of the contractions: `MatMul`, `BatchMatMul`, `Conv2D`.

use super::context::Cx;
use super::error::InferError;
use super::shapes::broadcast_shapes;
use super::text::sh;
use shardc_ir::geometry::conv2d_geometry;
use shardc_ir::{OpKind, TensorType, Type};

pub(super) fn infer(cx: &Cx<'_>) -> Result<Type, InferError> {
    match cx.op() {
        OpKind::MatMul => matmul(cx, false),
        OpKind::BatchMatMul => matmul(cx, true),
        OpKind::Conv2D => conv2d(cx),
        _ => Err(cx.misrouted()),
    }
}

/// A transpose flag: `transpose_a` (MindSpore's newer name) or `transpose_x1` (the older one;
/// dumps print both). When both are present they must agree.
pub(crate) fn transpose_flag(cx: &Cx<'_>, new: &str, old: &str) -> Result<bool, InferError> {
    let a = cx
        .node
        .attrs
        .get(new)
        .map(|_| cx.attr_bool(new, false))
        .transpose()?;
    let b = cx
        .node
        .attrs
        .get(old)
        .map(|_| cx.attr_bool(old, false))
        .transpose()?;
    match (a, b) {
        (Some(x), Some(y)) if x != y => Err(cx.err(format!(
            "attributes `{new}` ({x}) and `{old}` ({y}) disagree"
        ))),
        (Some(x), _) | (None, Some(x)) => Ok(x),
        (None, None) => Ok(false),
    }
}

fn matmul(cx: &Cx<'_>, batched: bool) -> Result<Type, InferError> {
    let a = cx.float_tensor(0)?;
    let b = cx.float_tensor(1)?;
    cx.same_dtype(0, 1)?;
    let ta = transpose_flag(cx, "transpose_a", "transpose_x1")?;
    let tb = transpose_flag(cx, "transpose_b", "transpose_x2")?;
    if batched {
        cx.expect_min_rank(0, 2, "(..., m, k)")?;
        cx.expect_min_rank(1, 2, "(..., k, n)")?;
    } else {
        cx.expect_rank(0, 2, "(m, k)")?;
        cx.expect_rank(1, 2, "(k, n)")?;
    }
    let (ra, rb) = (a.rank(), b.rank());
    let (m, k) = if ta {
        (a.shape[ra - 1], a.shape[ra - 2])
    } else {
        (a.shape[ra - 2], a.shape[ra - 1])
    };
    let (k2, n) = if tb {
        (b.shape[rb - 1], b.shape[rb - 2])
    } else {
        (b.shape[rb - 2], b.shape[rb - 1])
    };
    if k != k2 {
        return Err(cx.err(format!(
            "contracted dimensions differ: {} has shape {} with transpose_a {ta} (k = {k}) but {} has shape {} with transpose_b {tb} (k = {k2})",
            cx.name(0),
            sh(&a.shape),
            cx.name(1),
            sh(&b.shape)
        )));
    }
    let mut shape = if batched {
        broadcast_shapes(&a.shape[..ra - 2], &b.shape[..rb - 2]).ok_or_else(|| {
            cx.err(format!(
                "batch dimensions do not broadcast: {} has shape {} and {} has shape {}",
                cx.name(0),
                sh(&a.shape),
                cx.name(1),
                sh(&b.shape)
            ))
        })?
    } else {
        Vec::new()
    };
    shape.extend([m, n]);
    Ok(Type::Tensor(TensorType::new(a.dtype, shape)))
}

fn conv2d(cx: &Cx<'_>) -> Result<Type, InferError> {
    let x = cx.float_tensor(0)?;
    let w = cx.float_tensor(1)?;
    cx.same_dtype(0, 1)?;
    let g = conv2d_geometry(cx.node, &x.shape, &w.shape)?;
    Ok(Type::Tensor(TensorType::new(x.dtype, g.output_shape())))
}
