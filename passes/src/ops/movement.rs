//! The data movement ops' rules: `Reshape`, `Transpose`, `OneHot`, `Gather`, `Concat`,
//! `Split`, `StridedSlice`, `BroadcastTo`, `ZerosLike`, `OnesLike`.

use super::elementwise::{elementwise_dims, X};
use super::rule::{Cost, Dims, Gradient, OpRule, Operands, Window};
use crate::autodiff::emitter::ints;
use crate::autodiff::rules::{Grads, Rule};
use crate::infer::context::Cx;
use crate::infer::error::InferError;
use crate::infer::shapes::normalize_axis;
use crate::infer::signatures::{OperandSpec::*, Signature};
use crate::infer::text::{ints_text, sh};
use crate::parallel::dims::{broadcast_dims, Dim, DimsCx, DimsError, OpDims};
use shardc_ir::OpKind::{self, *};
use shardc_ir::{Attr, Attrs, Const, DType, Operand, ReduceOp, TensorType, Type};

/// Why an op whose result does not vary continuously has no gradient.
pub(super) const NOT_CONTINUOUS: &str = "its result does not vary continuously with its operands";

/// `Reshape(x, shape)`.
pub(super) static RESHAPE: OpRule = OpRule {
    op: Reshape,
    signature: Signature::fixed(&[("x", Tensor), ("shape", Ints)]),
    infer: reshape,
    gradient: Gradient::Rule(reshape_broadcast_grad),
    differentiable: Operands::All,
    dims: Dims::Rule(|c| Ok(reshape_dims(&c.in_shape(0)?, &c.out0, c.ins.len()))),
    cost: Cost::Vector(1.0),
    window: Window::None,
};

/// `Transpose(x, perm)`.
pub(super) static TRANSPOSE: OpRule = OpRule {
    op: Transpose,
    signature: Signature::fixed(&[("x", Tensor), ("perm", Ints)]),
    infer: transpose,
    gradient: Gradient::Rule(|r| r.transpose()),
    differentiable: Operands::All,
    dims: Dims::Rule(transpose_dims),
    cost: Cost::Vector(1.0),
    window: Window::None,
};

/// `OneHot(indices, depth, on_value, off_value)`.
pub(super) static ONE_HOT: OpRule = OpRule {
    op: OneHot,
    signature: Signature::fixed(&[
        ("indices", Tensor),
        ("depth", Int),
        ("on_value", Scalar),
        ("off_value", Scalar),
    ]),
    infer: one_hot,
    gradient: Gradient::None(NOT_CONTINUOUS),
    differentiable: Operands::NoneOf,
    dims: Dims::Rule(one_hot_dims),
    cost: Cost::Vector(1.0),
    window: Window::None,
};

/// `Gather(params, indices, axis)`.
pub(super) static GATHER: OpRule = OpRule {
    op: Gather,
    signature: Signature::fixed(&[("params", Tensor), ("indices", Tensor), ("axis", Int)]),
    infer: gather,
    gradient: Gradient::Rule(|r| r.gather()),
    differentiable: Operands::First,
    dims: Dims::Rule(gather_dims),
    cost: Cost::Vector(1.0),
    window: Window::None,
};

/// `Concat(x1, x2, ...)`.
pub(super) static CONCAT: OpRule = OpRule {
    op: Concat,
    signature: Signature {
        operands: &[("x", Tensor)],
        required: 1,
        variadic: true,
    },
    infer: concat,
    gradient: Gradient::Rule(|r| r.concat()),
    differentiable: Operands::All,
    dims: Dims::Rule(concat_split_dims),
    cost: Cost::Vector(1.0),
    window: Window::None,
};

/// `Split(x)`.
pub(super) static SPLIT: OpRule = OpRule {
    op: Split,
    signature: X,
    infer: split,
    gradient: Gradient::Rule(|r| r.split()),
    differentiable: Operands::All,
    dims: Dims::Rule(concat_split_dims),
    cost: Cost::Vector(1.0),
    window: Window::None,
};

/// `StridedSlice(x, begin, end, strides)`.
pub(super) static STRIDED_SLICE: OpRule = OpRule {
    op: StridedSlice,
    signature: Signature::fixed(&[
        ("x", Tensor),
        ("begin", Ints),
        ("end", Ints),
        ("strides", Ints),
    ]),
    infer: strided_slice,
    gradient: Gradient::Rule(strided_slice_grad),
    differentiable: Operands::All,
    dims: Dims::Rule(strided_slice_dims),
    cost: Cost::Vector(1.0),
    window: Window::None,
};

/// `BroadcastTo(x, shape)`.
pub(super) static BROADCAST_TO: OpRule = OpRule {
    op: BroadcastTo,
    signature: Signature::fixed(&[("x", Tensor), ("shape", Ints)]),
    infer: broadcast_to,
    gradient: Gradient::Rule(reshape_broadcast_grad),
    differentiable: Operands::All,
    dims: Dims::Rule(broadcast_to_dims),
    cost: Cost::Vector(1.0),
    window: Window::None,
};

/// `ZerosLike(x)`.
pub(super) static ZEROS_LIKE: OpRule = OpRule {
    op: ZerosLike,
    signature: X,
    infer: like,
    gradient: Gradient::None(NOT_CONTINUOUS),
    differentiable: Operands::NoneOf,
    dims: Dims::Rule(elementwise_dims),
    cost: Cost::Vector(1.0),
    window: Window::None,
};

/// `OnesLike(x)`.
pub(super) static ONES_LIKE: OpRule = OpRule {
    op: OnesLike,
    signature: X,
    infer: like,
    gradient: Gradient::None(NOT_CONTINUOUS),
    differentiable: Operands::NoneOf,
    dims: Dims::Rule(elementwise_dims),
    cost: Cost::Vector(1.0),
    window: Window::None,
};

// ---- shapes ----

fn strided_slice(cx: &Cx<'_>) -> Result<Type, InferError> {
    let x = cx.tensor(0)?;
    let shape = slice_shape(cx, &x.shape, 1)?;
    Ok(Type::Tensor(TensorType::new(x.dtype, shape)))
}

/// `ZerosLike` / `OnesLike`: x's type.
fn like(cx: &Cx<'_>) -> Result<Type, InferError> {
    Ok(Type::Tensor(cx.tensor(0)?.clone()))
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

// ---- gradients ----

/// Reshape: dy reshaped back; BroadcastTo: dy summed back to x's shape.
fn reshape_broadcast_grad(r: &mut Rule<'_>) -> Grads {
    let shape = r.ty(0)?.shape;
    let is_reshape = r.node.op == Reshape;
    r.unary(|r, dy| {
        if is_reshape {
            r.em.reshape(dy, &shape, "")
        } else {
            r.em.unbroadcast(dy, &shape, "")
        }
    })
}

fn strided_slice_grad(r: &mut Rule<'_>) -> Grads {
    r.unary(|r, dy| {
        let shape = r.ty(0)?.shape;
        let mut inputs = vec![dy, ints(&shape)];
        inputs.extend(r.node.inputs[1..4].iter().cloned());
        let attrs = r.copied_attrs();
        r.emit(StridedSliceGrad, inputs, attrs, "")
    })
}

impl Rule<'_> {
    fn transpose(&mut self) -> Grads {
        let rank = self.ty(0)?.rank();
        let perm = self
            .node
            .inputs
            .get(1)
            .and_then(Operand::as_const)
            .and_then(Const::as_ints)
            .ok_or_else(|| self.em.bad_node("input 1 (perm) must be a constant tuple"))?;
        let mut inv = vec![0i64; rank];
        for (i, &p) in perm.iter().enumerate() {
            let a = normalize_axis(p, rank)
                .ok_or_else(|| self.em.bad_node(format!("perm entry {p} is out of range")))?;
            inv[a] = i as i64;
        }
        self.unary(|r, dy| {
            r.emit(
                OpKind::Transpose,
                vec![dy, Operand::Const(Const::Ints(inv))],
                Attrs::new(),
                "",
            )
        })
    }

    /// `UnsortedSegmentSum` of dy by the indices, along the gathered axis.
    fn gather(&mut self) -> Grads {
        let ps = self.ty(0)?.shape;
        let ri = self.ty(1)?.rank();
        let axis = self
            .node
            .inputs
            .get(2)
            .and_then(Operand::as_const)
            .and_then(Const::as_int)
            .ok_or_else(|| {
                self.em
                    .bad_node("input 2 (axis) must be a constant integer")
            })?;
        let a = normalize_axis(axis, ps.len())
            .ok_or_else(|| self.em.bad_node(format!("axis {axis} is out of range")))?;
        let rank_dy = ps.len() - 1 + ri;
        self.unary(|r, dy| {
            let mut g = dy;
            if a > 0 {
                // Bring the index dims to the front: (idx..., p[..a], p[a+1..]).
                let perm: Vec<i64> = (a..a + ri)
                    .chain(0..a)
                    .chain(a + ri..rank_dy)
                    .map(|d| d as i64)
                    .collect();
                g = r.emit(
                    Transpose,
                    vec![g, Operand::Const(Const::Ints(perm))],
                    Attrs::new(),
                    "_front",
                )?;
            }
            let mut s = r.emit(
                UnsortedSegmentSum,
                vec![g, r.x(1), Operand::Const(Const::Int(ps[a] as i64))],
                Attrs::new(),
                if a > 0 { "_segments" } else { "" },
            )?;
            if a > 0 {
                // (p[a], p[..a], p[a+1..]) -> p.
                let perm: Vec<i64> = (1..=a)
                    .chain(std::iter::once(0))
                    .chain(a + 1..ps.len())
                    .map(|d| d as i64)
                    .collect();
                s = r.emit(
                    Transpose,
                    vec![s, Operand::Const(Const::Ints(perm))],
                    Attrs::new(),
                    "",
                )?;
            }
            Ok(s)
        })
    }

    fn concat(&mut self) -> Grads {
        let dy = self.dy()?;
        let shape = self.em.operand_type(&dy)?.shape;
        let axis = self.node.attrs.int_or("axis", 0);
        let a = normalize_axis(axis, shape.len())
            .ok_or_else(|| self.em.bad_node(format!("axis {axis} is out of range")))?;
        let mut out = Vec::with_capacity(self.node.inputs.len());
        let mut offset = 0usize;
        for i in 0..self.node.inputs.len() {
            let size = self.ty(i)?.shape.get(a).copied().ok_or_else(|| {
                self.em
                    .bad_node(format!("input {i} has no axis {a} to concatenate along"))
            })?;
            if self.need(i) {
                let mut begin = vec![0usize; shape.len()];
                let mut end = shape.clone();
                begin[a] = offset;
                end[a] = offset + size;
                let strides = vec![1usize; shape.len()];
                let g = self.emit(
                    OpKind::StridedSlice,
                    vec![dy.clone(), ints(&begin), ints(&end), ints(&strides)],
                    Attrs::new(),
                    &format!("_{i}"),
                )?;
                out.push(Some(g));
            } else {
                out.push(None);
            }
            offset += size;
        }
        Ok(out)
    }

    fn split(&mut self) -> Grads {
        let present = self.dys.iter().flatten().next().cloned().ok_or_else(|| {
            self.em
                .bad_node("internal error: no gradient reaches Split")
        })?;
        if !self.need(0) {
            return Ok(vec![None]);
        }
        if self.dys.len() == 1 {
            return Ok(vec![Some(present)]);
        }
        let mut parts = Vec::with_capacity(self.dys.len());
        for (k, d) in self.dys.clone().into_iter().enumerate() {
            parts.push(match d {
                Some(d) => d,
                None => self.emit(
                    OpKind::ZerosLike,
                    vec![present.clone()],
                    Attrs::new(),
                    &format!("_zeros{k}"),
                )?,
            });
        }
        let axis = self.node.attrs.get("axis").cloned().unwrap_or(Attr::Int(0));
        let dx = self.emit(OpKind::Concat, parts, Attrs::new().with("axis", axis), "")?;
        Ok(vec![Some(dx)])
    }
}

// ---- loops ----

/// Reshape: dimensions are matched in groups of equal running products; the leading non-1
/// dimension of each input group may be split, and carries its split to the leading non-1
/// dimension of the matching output group.
fn reshape_dims(x: &[usize], out: &[usize], n_inputs: usize) -> OpDims {
    let mut d = OpDims::with_loops(x.to_vec());
    let mut out_dims = vec![Dim::Whole; out.len()];
    let (mut i, mut j) = (0usize, 0usize);
    while i < x.len() || j < out.len() {
        // One group: advance both sides until the products match (and are non-trivial).
        let (gi, gj) = (i, j);
        let (mut pi, mut pj) = (1usize, 1usize);
        loop {
            if pi <= pj && i < x.len() {
                pi *= x[i];
                i += 1;
            } else if j < out.len() {
                pj *= out[j];
                j += 1;
            } else if i < x.len() {
                pi *= x[i];
                i += 1;
            } else {
                break;
            }
            if pi == pj
                && (i == x.len() || x[i] != 1 || pi != 1)
                && (j == out.len() || out[j] != 1 || pj != 1)
            {
                break;
            }
        }
        let head_in = (gi..i).find(|&k| x[k] != 1);
        let head_out = (gj..j).find(|&k| out[k] != 1);
        for k in gi..i {
            if Some(k) != head_in || head_out.is_none() {
                d.fix(
                    k,
                    format!(
                        "dimension {k} is not the leading dimension of its group in the reshape"
                    ),
                );
            }
        }
        if let (Some(hi), Some(ho)) = (head_in, head_out) {
            out_dims[ho] = Dim::Loop(hi);
        }
        if i == gi && j == gj {
            break;
        }
    }
    d.inputs = vec![Some(OpDims::identity(x.len()))];
    d.inputs.extend((1..n_inputs).map(|_| None));
    d.outputs = vec![out_dims];
    d
}

fn transpose_dims(c: &DimsCx<'_>) -> Result<OpDims, DimsError> {
    let node = c.node;
    let x = c.in_shape(0)?;
    let perm = node
        .inputs
        .get(1)
        .and_then(Operand::as_const)
        .and_then(|c| c.as_ints())
        .ok_or_else(|| DimsError("Transpose needs a constant perm".into()))?;
    let mut d = OpDims::with_loops(x.clone());
    d.inputs = vec![Some(OpDims::identity(x.len())), None];
    d.outputs = vec![perm
        .iter()
        .map(|&p| Dim::Loop(normalize_axis(p, x.len()).unwrap_or(0)))
        .collect()];
    Ok(d)
}

fn one_hot_dims(c: &DimsCx<'_>) -> Result<OpDims, DimsError> {
    let (node, out0) = (c.node, &c.out0);
    let idx = c.in_shape(0)?;
    let r = out0.len();
    let axis = normalize_axis(node.attrs.int_or("axis", -1), r).unwrap_or(r - 1);
    let mut sizes = idx.clone();
    sizes.push(out0[axis]);
    let depth = idx.len();
    let mut d = OpDims::with_loops(sizes);
    d.inputs = vec![Some(OpDims::identity(idx.len()))];
    d.inputs.extend((1..c.ins.len()).map(|_| None));
    let mut out: Vec<Dim> = OpDims::identity(idx.len());
    out.insert(axis, Dim::Loop(depth));
    d.outputs = vec![out];
    d.fix(depth, "the depth dimension is created by the op");
    Ok(d)
}

fn gather_dims(c: &DimsCx<'_>) -> Result<OpDims, DimsError> {
    let node = c.node;
    let p = c.in_shape(0)?;
    let idx = c.in_shape(1)?;
    let axis = node
        .inputs
        .get(2)
        .and_then(Operand::as_const)
        .and_then(|c| c.as_int())
        .and_then(|a| normalize_axis(a, p.len()))
        .ok_or_else(|| DimsError("Gather needs a constant axis".into()))?;
    // loops: params dims (0..p.len()), then indices dims.
    let mut sizes = p.clone();
    sizes.extend(&idx);
    let mut d = OpDims::with_loops(sizes);
    let il: Vec<Dim> = (0..idx.len()).map(|i| Dim::Loop(p.len() + i)).collect();
    d.inputs = vec![Some(OpDims::identity(p.len())), Some(il.clone()), None];
    let mut out: Vec<Dim> = (0..axis).map(Dim::Loop).collect();
    out.extend(il);
    out.extend((axis + 1..p.len()).map(Dim::Loop));
    d.outputs = vec![out];
    // A table split along the gathered axis (a vocabulary split): each part looks up
    // the indices that fall in its rows and gives zeros for the others, so the parts'
    // results sum to the lookup (the partition marks the local Gather with its rows).
    d.combine[axis] = Some(ReduceOp::Sum);
    Ok(d)
}

fn concat_split_dims(c: &DimsCx<'_>) -> Result<OpDims, DimsError> {
    let (node, ins, outs) = (c.node, &c.ins, &c.outs);
    let x = c.in_shape(0)?;
    let axis = normalize_axis(node.attrs.int_or("axis", 0), x.len())
        .ok_or_else(|| DimsError("axis out of range".into()))?;
    let mut d = OpDims::with_loops(x.clone());
    let dims: Vec<Dim> = (0..x.len())
        .map(|l| if l == axis { Dim::Whole } else { Dim::Loop(l) })
        .collect();
    // The inputs carry the axis loop (fixed below, so that a split is refused with its
    // reason); the results keep the axis whole.
    let carried = OpDims::identity(x.len());
    d.inputs = ins
        .iter()
        .map(|s| s.as_ref().map(|_| carried.clone()))
        .collect();
    d.outputs = outs.iter().map(|_| dims.clone()).collect();
    d.fix(
        axis,
        format!("dimension {axis} is the {} axis", node.op.name()),
    );
    Ok(d)
}

/// The loops of StridedSlice and of StridedSliceGrad: the sliced dimensions stay whole.
pub(super) fn strided_slice_dims(c: &DimsCx<'_>) -> Result<OpDims, DimsError> {
    let (node, ins, out0) = (c.node, &c.ins, &c.out0);
    // Dimensions the slice does not touch may be split.
    let (full, sliced) = if node.op == StridedSlice {
        (c.in_shape(0)?, out0.clone())
    } else {
        (out0.clone(), c.in_shape(0)?)
    };
    let mut d = OpDims::with_loops(full.clone());
    let dims: Vec<Dim> = (0..full.len())
        .map(|l| {
            if full[l] == sliced[l] {
                Dim::Loop(l)
            } else {
                Dim::Whole
            }
        })
        .collect();
    // The full-size side carries every loop (the sliced ones fixed below, so that a
    // split is refused with its reason).
    if node.op == StridedSlice {
        d.inputs = vec![Some(OpDims::identity(full.len()))];
        d.inputs.extend((1..c.ins.len()).map(|_| None));
        d.outputs = vec![dims.clone()];
    } else {
        d.inputs = ins
            .iter()
            .map(|s| s.as_ref().map(|_| dims.clone()))
            .collect();
        d.outputs = vec![OpDims::identity(full.len())];
    }
    for l in 0..full.len() {
        if full[l] != sliced[l] {
            d.fix(l, format!("dimension {l} is sliced"));
        }
    }
    Ok(d)
}

fn broadcast_to_dims(c: &DimsCx<'_>) -> Result<OpDims, DimsError> {
    let out0 = &c.out0;
    let x = c.in_shape(0)?;
    let mut d = OpDims::with_loops(out0.clone());
    d.inputs = vec![Some(broadcast_dims(&x, out0)), None];
    d.outputs = vec![OpDims::identity(out0.len())];
    Ok(d)
}
