//! Shape and axis arithmetic shared by the shape rules, autodiff and the parallel passes:
//! normalizing an axis, broadcasting two shapes, the axes of a reduction or a softmax.

use super::error::InferError;
use super::text::{const_text, ints_text};
use shardc_ir::{Node, Operand};

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

/// Converts integers that must be sizes (>= 0) to `usize`.
pub(crate) fn to_sizes(v: &[i64]) -> Option<Vec<usize>> {
    v.iter().map(|&d| usize::try_from(d).ok()).collect()
}
