//! Shape rules of the reductions and normalisations: `ReduceSum` / `ReduceMean` /
//! `ReduceMax`, `Softmax` / `LogSoftmax`, `BatchNorm`, `LayerNorm`, `MaxPool` / `AvgPool`.

use super::context::Cx;
use super::error::InferError;
use super::shapes::{normalize_axis, reduce_axes, softmax_axis};
use super::text::sh;
use shardc_ir::geometry::pool2d_geometry;
use shardc_ir::{OpKind, TensorType, Type};

pub(super) fn infer(cx: &Cx<'_>) -> Result<Type, InferError> {
    use OpKind::*;
    match cx.op() {
        ReduceSum | ReduceMean | ReduceMax => reduce(cx),
        Softmax | LogSoftmax => {
            let x = cx.float_tensor(0)?;
            softmax_axis(cx.node, x.rank())?;
            Ok(Type::Tensor(x.clone()))
        }
        BatchNorm => batch_norm(cx),
        BNTrainingReduce => {
            let x = cx.float_tensor(0)?;
            let c = channels(cx, 0)?;
            let stat = TensorType::new(x.dtype, vec![c]);
            Ok(Type::Tuple(vec![stat.clone(), stat]))
        }
        BNTrainingUpdate => {
            let x = cx.float_tensor(0)?;
            let c = channels(cx, 0)?;
            let why = format!("x of shape {} ({c} channels)", sh(&x.shape));
            for i in 1..5 {
                cx.same_dtype(0, i)?;
                cx.expect_shape(i, &[c], &why)?;
            }
            let eps = cx.attr_float("epsilon", 1e-5)?;
            if eps.is_nan() || eps < 0.0 {
                return Err(cx.err(format!("attribute `epsilon` must be >= 0, got {eps}")));
            }
            bn_count(cx)?;
            let stat = TensorType::new(x.dtype, vec![c]);
            Ok(Type::Tuple(vec![
                x.clone(),
                stat.clone(),
                stat.clone(),
                stat.clone(),
                stat,
            ]))
        }
        LayerNorm => layer_norm(cx),
        MaxPool | AvgPool => {
            let x = cx.float_tensor(0)?;
            let g = pool2d_geometry(cx.node, &x.shape)?;
            Ok(Type::Tensor(TensorType::new(x.dtype, g.output_shape())))
        }
        _ => Err(cx.misrouted()),
    }
}

fn reduce(cx: &Cx<'_>) -> Result<Type, InferError> {
    let x = cx.float_tensor(0)?;
    let axes = reduce_axes(cx.node, x.rank())?;
    let keep = cx.attr_bool("keep_dims", false)?;
    let shape = x
        .shape
        .iter()
        .enumerate()
        .filter_map(|(i, &d)| match (axes.contains(&i), keep) {
            (false, _) => Some(d),
            (true, true) => Some(1),
            (true, false) => None,
        })
        .collect::<Vec<_>>();
    Ok(Type::Tensor(TensorType::new(x.dtype, shape)))
}

/// The channel count of a BatchNorm-like input `(N, C, ...)` (operand `i`).
pub(crate) fn channels(cx: &Cx<'_>, i: usize) -> Result<usize, InferError> {
    let x = cx.expect_min_rank(i, 2, "(N, C, ...)")?;
    Ok(x.shape[1])
}

/// The `count` attribute of the synchronised BatchNorm ops: required, at least 1.
pub(crate) fn bn_count(cx: &Cx<'_>) -> Result<usize, InferError> {
    let n = cx.attr_int_req("count")?;
    if n < 1 {
        return Err(cx.err(format!(
            "attribute `count` must be >= 1 (the global number of elements per channel), got {n}"
        )));
    }
    Ok(n as usize)
}

fn batch_norm(cx: &Cx<'_>) -> Result<Type, InferError> {
    let x = cx.float_tensor(0)?;
    let c = channels(cx, 0)?;
    let why = format!("x of shape {} ({c} channels)", sh(&x.shape));
    for i in 1..5 {
        cx.same_dtype(0, i)?;
        cx.expect_shape(i, &[c], &why)?;
    }
    cx.attr_bool("is_training", true)?;
    let eps = cx.attr_float("epsilon", 1e-5)?;
    if eps.is_nan() || eps < 0.0 {
        return Err(cx.err(format!("attribute `epsilon` must be >= 0, got {eps}")));
    }
    cx.attr_float("momentum", 0.1)?;
    let stat = TensorType::new(x.dtype, vec![c]);
    Ok(Type::Tuple(vec![
        x.clone(),
        stat.clone(),
        stat.clone(),
        stat.clone(),
        stat,
    ]))
}

/// The layout of a LayerNorm-like node for input shape `x`:
/// `(begin_norm_axis, begin_params_axis, shape of mean / rstd)`.
pub(crate) fn layer_norm_layout(
    cx: &Cx<'_>,
    x: &[usize],
) -> Result<(usize, usize, Vec<usize>), InferError> {
    let rank = x.len();
    if rank == 0 {
        return Err(cx.err("x must have rank >= 1, got a scalar"));
    }
    let axis = |key: &str| -> Result<usize, InferError> {
        let a = cx.attr_int(key, -1)?;
        normalize_axis(a, rank).ok_or_else(|| {
            cx.err(format!(
                "attribute `{key}` {a} is out of range for x of shape {}",
                sh(x)
            ))
        })
    };
    let bna = axis("begin_norm_axis")?;
    let bpa = axis("begin_params_axis")?;
    let eps = cx.attr_float("epsilon", 1e-7)?;
    if eps.is_nan() || eps < 0.0 {
        return Err(cx.err(format!("attribute `epsilon` must be >= 0, got {eps}")));
    }
    let mut stats = x.to_vec();
    for d in &mut stats[bna..] {
        *d = 1;
    }
    Ok((bna, bpa, stats))
}

fn layer_norm(cx: &Cx<'_>) -> Result<Type, InferError> {
    let x = cx.float_tensor(0)?;
    let (_, bpa, stats) = layer_norm_layout(cx, &x.shape)?;
    let why = format!("x of shape {} with begin_params_axis {bpa}", sh(&x.shape));
    for i in 1..3 {
        cx.same_dtype(0, i)?;
        cx.expect_shape(i, &x.shape[bpa..], &why)?;
    }
    let stat = TensorType::new(x.dtype, stats);
    Ok(Type::Tuple(vec![x.clone(), stat.clone(), stat]))
}
