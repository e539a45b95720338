//! Shape rules of data movement: `Reshape`, `Transpose`, `OneHot`, `Gather`, `Concat`,
//! `Split`, `StridedSlice`, `BroadcastTo`, `ZerosLike`, `OnesLike`.

use super::context::Cx;
use super::error::InferError;
use super::shapes::normalize_axis;
use super::text::{ints_text, sh};
use shardc_ir::{DType, OpKind, TensorType, Type};

pub(super) fn infer(cx: &Cx<'_>) -> Result<Type, InferError> {
    use OpKind::*;
    match cx.op() {
        Reshape => reshape(cx),
        Transpose => transpose(cx),
        OneHot => one_hot(cx),
        Gather => gather(cx),
        Concat => concat(cx),
        Split => split(cx),
        StridedSlice => {
            let x = cx.tensor(0)?;
            let shape = slice_shape(cx, &x.shape, 1)?;
            Ok(Type::Tensor(TensorType::new(x.dtype, shape)))
        }
        BroadcastTo => broadcast_to(cx),
        ZerosLike | OnesLike => Ok(Type::Tensor(cx.tensor(0)?.clone())),
        _ => Err(cx.misrouted()),
    }
}

fn reshape(cx: &Cx<'_>) -> Result<Type, InferError> {
    let x = cx.tensor(0)?;
    let target = cx.ints(1)?;
    let count = x.num_elements();
    let mut infer_at = None;
    let mut known: usize = 1;
    for (i, &d) in target.iter().enumerate() {
        if d == -1 {
            if infer_at.replace(i).is_some() {
                return Err(cx.err(format!("shape {} has more than one -1", ints_text(&target))));
            }
        } else if d < 0 {
            return Err(cx.err(format!(
                "shape {} has the negative size {d} (only one -1 is allowed)",
                ints_text(&target)
            )));
        } else {
            known = known.saturating_mul(d as usize);
        }
    }
    let mut shape: Vec<usize> = target.iter().map(|&d| d.max(0) as usize).collect();
    if let Some(i) = infer_at {
        if known == 0 || count % known != 0 {
            return Err(cx.err(format!(
                "cannot reshape {} of shape {} ({count} elements) into {}: the -1 cannot be resolved",
                cx.name(0),
                sh(&x.shape),
                ints_text(&target)
            )));
        }
        shape[i] = count / known;
    } else if known != count {
        return Err(cx.err(format!(
            "cannot reshape {} of shape {} ({count} elements) into {} ({known} elements)",
            cx.name(0),
            sh(&x.shape),
            ints_text(&target)
        )));
    }
    Ok(Type::Tensor(TensorType::new(x.dtype, shape)))
}

fn transpose(cx: &Cx<'_>) -> Result<Type, InferError> {
    let x = cx.tensor(0)?;
    let perm = cx.ints(1)?;
    let rank = x.rank();
    let bad = || {
        cx.err(format!(
            "perm {} is not a permutation of the {rank} axes of {} (shape {})",
            ints_text(&perm),
            cx.name(0),
            sh(&x.shape)
        ))
    };
    if perm.len() != rank {
        return Err(bad());
    }
    let mut seen = vec![false; rank];
    let mut shape = Vec::with_capacity(rank);
    for &p in &perm {
        let a = normalize_axis(p, rank).ok_or_else(bad)?;
        if std::mem::replace(&mut seen[a], true) {
            return Err(bad());
        }
        shape.push(x.shape[a]);
    }
    Ok(Type::Tensor(TensorType::new(x.dtype, shape)))
}

fn one_hot(cx: &Cx<'_>) -> Result<Type, InferError> {
    let idx = cx.int_tensor(0)?;
    let depth = cx.int(1)?;
    let depth = usize::try_from(depth)
        .map_err(|_| cx.err(format!("{} must be >= 0, got {depth}", cx.name(1))))?;
    // The result's element type: that of on_value when it is a tensor, else Float32.
    let dtype = if cx.is_const(2) {
        DType::Float32
    } else {
        cx.float_tensor(2)?.dtype
    };
    for i in [2, 3] {
        cx.scalar(i, dtype)?;
    }
    let rank = idx.rank();
    let axis = cx.attr_int("axis", -1)?;
    let at = if axis == -1 {
        rank
    } else {
        usize::try_from(axis)
            .ok()
            .filter(|&a| a <= rank)
            .ok_or_else(|| {
                cx.err(format!(
                    "attribute `axis` {axis} is out of range for indices of rank {rank} (expected -1 to {rank})"
                ))
            })?
    };
    let mut shape = idx.shape[..at].to_vec();
    shape.push(depth);
    shape.extend_from_slice(&idx.shape[at..]);
    Ok(Type::Tensor(TensorType::new(dtype, shape)))
}

fn gather(cx: &Cx<'_>) -> Result<Type, InferError> {
    let params = cx.tensor(0)?;
    let idx = cx.int_tensor(1)?;
    let axis = cx.int(2)?;
    let a = normalize_axis(axis, params.rank()).ok_or_else(|| {
        cx.err(format!(
            "{} {axis} is out of range for {} of shape {}",
            cx.name(2),
            cx.name(0),
            sh(&params.shape)
        ))
    })?;
    let mut shape = params.shape[..a].to_vec();
    shape.extend_from_slice(&idx.shape);
    shape.extend_from_slice(&params.shape[a + 1..]);
    Ok(Type::Tensor(TensorType::new(params.dtype, shape)))
}

fn concat(cx: &Cx<'_>) -> Result<Type, InferError> {
    let first = cx.tensor(0)?;
    let rank = first.rank();
    let axis = cx.attr_int("axis", 0)?;
    let a = normalize_axis(axis, rank).ok_or_else(|| {
        cx.err(format!(
            "attribute `axis` {axis} is out of range for {} of shape {}",
            cx.name(0),
            sh(&first.shape)
        ))
    })?;
    let mut shape = first.shape.clone();
    for i in 1..cx.node.inputs.len() {
        let t = cx.tensor(i)?;
        cx.same_dtype(0, i)?;
        let compatible =
            t.rank() == rank && (0..rank).all(|d| d == a || t.shape[d] == first.shape[d]);
        if !compatible {
            return Err(cx.err(format!(
                "{} of shape {} does not match {} of shape {} off axis {a}",
                cx.name(i),
                sh(&t.shape),
                cx.name(0),
                sh(&first.shape)
            )));
        }
        shape[a] += t.shape[a];
    }
    Ok(Type::Tensor(TensorType::new(first.dtype, shape)))
}

fn split(cx: &Cx<'_>) -> Result<Type, InferError> {
    let x = cx.tensor(0)?;
    let axis = cx.attr_int("axis", 0)?;
    let a = normalize_axis(axis, x.rank()).ok_or_else(|| {
        cx.err(format!(
            "attribute `axis` {axis} is out of range for {} of shape {}",
            cx.name(0),
            sh(&x.shape)
        ))
    })?;
    let n = cx.attr_int("output_num", 1)?;
    let parts = usize::try_from(n)
        .ok()
        .filter(|&p| p >= 1)
        .ok_or_else(|| cx.err(format!("attribute `output_num` must be >= 1, got {n}")))?;
    // A dim of size 0 splits into any number of empty parts; past this many the node's
    // result tuple itself would not fit in memory.
    if parts > MAX_RESULTS {
        return Err(cx.err(format!(
            "attribute `output_num` {parts} is more than the {MAX_RESULTS} results a node may have"
        )));
    }
    if x.shape[a] % parts != 0 {
        return Err(cx.err(format!(
            "output_num {parts} does not divide dim {a} (size {}) of {} of shape {}",
            x.shape[a],
            cx.name(0),
            sh(&x.shape)
        )));
    }
    let mut shape = x.shape.clone();
    shape[a] /= parts;
    Ok(Type::Tuple(vec![TensorType::new(x.dtype, shape); parts]))
}

/// The most results one node may produce (`Split`'s `output_num`).
const MAX_RESULTS: usize = 1 << 16;

/// The result shape of slicing `shape` with the constant `begin`, `end`, `strides` operands at
/// positions `first`, `first + 1`, `first + 2` (Python semantics: negative bounds count from
/// the end, bounds are clamped; strides must be positive; missing trailing dims are whole).
pub(crate) fn slice_shape(
    cx: &Cx<'_>,
    shape: &[usize],
    first: usize,
) -> Result<Vec<usize>, InferError> {
    for mask in [
        "begin_mask",
        "end_mask",
        "ellipsis_mask",
        "new_axis_mask",
        "shrink_axis_mask",
    ] {
        let v = cx.attr_int(mask, 0)?;
        if v != 0 {
            return Err(cx.err(format!("attribute `{mask}` {v} is not supported (only 0)")));
        }
    }
    let (begin, end, steps) = (cx.ints(first)?, cx.ints(first + 1)?, cx.ints(first + 2)?);
    if begin.len() != end.len() || end.len() != steps.len() || begin.len() > shape.len() {
        return Err(cx.err(format!(
            "begin {}, end {} and strides {} must have equal lengths of at most the rank {} of shape {}",
            ints_text(&begin),
            ints_text(&end),
            ints_text(&steps),
            shape.len(),
            sh(shape)
        )));
    }
    let mut out = shape.to_vec();
    for d in 0..begin.len() {
        let st = steps[d];
        if st <= 0 {
            return Err(cx.err(format!(
                "stride {st} of dim {d} in strides {} is not positive",
                ints_text(&steps)
            )));
        }
        let n = shape[d] as i64;
        let clamp = |v: i64| -> i64 {
            let v = if v < 0 { v.saturating_add(n) } else { v };
            v.clamp(0, n)
        };
        let (b, e) = (clamp(begin[d]), clamp(end[d]));
        out[d] = if e > b {
            ((e - b - 1) / st + 1) as usize
        } else {
            0
        };
    }
    Ok(out)
}

fn broadcast_to(cx: &Cx<'_>) -> Result<Type, InferError> {
    let x = cx.tensor(0)?;
    let target = cx.ints(1)?;
    let bad = |why: &str| {
        cx.err(format!(
            "cannot broadcast {} of shape {} to {}: {why}",
            cx.name(0),
            sh(&x.shape),
            ints_text(&target)
        ))
    };
    if target.len() < x.rank() {
        return Err(bad("the target has a lower rank"));
    }
    let lead = target.len() - x.rank();
    let mut shape = Vec::with_capacity(target.len());
    for (i, &t) in target.iter().enumerate() {
        let src = i.checked_sub(lead).map(|j| x.shape[j]);
        let d = match (t, src) {
            (-1, Some(s)) => s,
            (-1, None) => return Err(bad("-1 in a new leading dimension")),
            (t, _) if t < 0 => return Err(bad("negative size")),
            (t, Some(s)) if s != t as usize && s != 1 => {
                return Err(bad(&format!("dim {i} is {s}, neither {t} nor 1")))
            }
            (t, _) => t as usize,
        };
        shape.push(d);
    }
    Ok(Type::Tensor(TensorType::new(x.dtype, shape)))
}
