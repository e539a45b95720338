//! The collectives' rules: `AllReduce`, `AllGather`, `ReduceScatter`, `AlltoAll`,
//! `Broadcast`, `Send`, `Receive`.
//!
//! The group of a collective is its `rank_list` attribute (a tuple of distinct ranks >= 0);
//! where a group size is needed and `rank_list` is absent, an integer `rank_size` is accepted.
//! `Send` returns its input's type (the value it sent, so that later nodes can be ordered
//! after it); `Receive` takes no operand and returns `<Tensor[dtype], shape>` from its
//! attributes. `AllGather` and `ReduceScatter` take an optional `axis` (default 0, negative
//! counts from the end): the dimension they concatenate along or split (MindSpore's always
//! use axis 0; shardc adds `axis` so that the partitioner need not transpose).
//!
//! A collective has no strategy of its own (the parallel passes insert it) and costs one
//! add per element in the search's compute model (its communication is priced apart).

use super::elementwise::{parse_dtype, X};
use super::rule::{Cost, Dims, Gradient, OpRule, Operands, Window};
use crate::autodiff::rules::{Grads, Rule};
use crate::infer::context::Cx;
use crate::infer::error::InferError;
use crate::infer::shapes::{normalize_axis, to_sizes};
use crate::infer::signatures::Signature;
use crate::infer::text::{ints_text, sh};
use shardc_ir::OpKind::*;
use shardc_ir::{Attr, DType, TensorType, Type};

/// Why a collective has no strategy of its own.
pub(super) const NO_STRATEGY: &str = "it is plumbing or communication";
const P2P_NO_GRADIENT: &str =
    "point-to-point and broadcast communication have no gradient rule yet";

/// `AllReduce(x)`; its gradient is the AllReduce of dy (sum only).
pub(super) static ALL_REDUCE: OpRule = OpRule {
    op: AllReduce,
    signature: X,
    infer: all_reduce,
    gradient: Gradient::Rule(all_reduce_grad),
    differentiable: Operands::All,
    dims: Dims::NoStrategy(NO_STRATEGY),
    cost: Cost::Vector(1.0),
    window: Window::None,
};

/// `AllGather(x)`; its gradient is a ReduceScatter.
pub(super) static ALL_GATHER: OpRule = OpRule {
    op: AllGather,
    signature: X,
    infer: all_gather,
    gradient: Gradient::Rule(all_gather_grad),
    differentiable: Operands::All,
    dims: Dims::NoStrategy(NO_STRATEGY),
    cost: Cost::Vector(1.0),
    window: Window::None,
};

/// `ReduceScatter(x)`; its gradient is an AllGather (sum only).
pub(super) static REDUCE_SCATTER: OpRule = OpRule {
    op: ReduceScatter,
    signature: X,
    infer: reduce_scatter,
    gradient: Gradient::Rule(reduce_scatter_grad),
    differentiable: Operands::All,
    dims: Dims::NoStrategy(NO_STRATEGY),
    cost: Cost::Vector(1.0),
    window: Window::None,
};

/// `AlltoAll(x)`; its gradient is the AlltoAll back.
pub(super) static ALL_TO_ALL: OpRule = OpRule {
    op: AllToAll,
    signature: X,
    infer: all_to_all,
    gradient: Gradient::Rule(all_to_all_grad),
    differentiable: Operands::All,
    dims: Dims::NoStrategy(NO_STRATEGY),
    cost: Cost::Vector(1.0),
    window: Window::None,
};

/// `Broadcast(x)` from `root_rank`.
pub(super) static BROADCAST: OpRule = OpRule {
    op: Broadcast,
    signature: X,
    infer: broadcast,
    gradient: Gradient::None(P2P_NO_GRADIENT),
    differentiable: Operands::All,
    dims: Dims::NoStrategy(NO_STRATEGY),
    cost: Cost::Vector(1.0),
    window: Window::None,
};

/// `Send(x)` to `dest_rank`.
pub(super) static SEND: OpRule = OpRule {
    op: Send,
    signature: X,
    infer: send,
    gradient: Gradient::None(P2P_NO_GRADIENT),
    differentiable: Operands::All,
    dims: Dims::NoStrategy(NO_STRATEGY),
    cost: Cost::Vector(1.0),
    window: Window::None,
};

/// `Receive()` from `src_rank`.
pub(super) static RECEIVE: OpRule = OpRule {
    op: Receive,
    signature: Signature::fixed(&[]),
    infer: receive,
    gradient: Gradient::None(P2P_NO_GRADIENT),
    differentiable: Operands::All,
    dims: Dims::NoStrategy(NO_STRATEGY),
    cost: Cost::Vector(1.0),
    window: Window::None,
};

// ---- shapes ----

fn all_reduce(cx: &Cx<'_>) -> Result<Type, InferError> {
    let x = reducible(cx)?;
    group(cx, false)?;
    Ok(Type::Tensor(x.clone()))
}

fn all_gather(cx: &Cx<'_>) -> Result<Type, InferError> {
    let (x, axis) = gather_axis(cx)?;
    let n = group(cx, true)?.unwrap_or(1);
    let mut shape = x.shape.clone();
    shape[axis] *= n;
    Ok(Type::Tensor(TensorType::new(x.dtype, shape)))
}

fn reduce_scatter(cx: &Cx<'_>) -> Result<Type, InferError> {
    reducible(cx)?;
    let (x, axis) = gather_axis(cx)?;
    let n = group(cx, true)?.unwrap_or(1);
    if x.shape[axis] % n != 0 {
        return Err(cx.err(format!(
            "the group of {n} ranks does not divide dim {axis} of {} of shape {}",
            cx.name(0),
            sh(&x.shape)
        )));
    }
    let mut shape = x.shape.clone();
    shape[axis] /= n;
    Ok(Type::Tensor(TensorType::new(x.dtype, shape)))
}

fn broadcast(cx: &Cx<'_>) -> Result<Type, InferError> {
    let x = cx.tensor(0)?;
    group(cx, false)?;
    rank_attr(cx, "root_rank", Some(0))?;
    Ok(Type::Tensor(x.clone()))
}

fn send(cx: &Cx<'_>) -> Result<Type, InferError> {
    let x = cx.tensor(0)?;
    rank_attr(cx, "dest_rank", None)?;
    cx.attr_int("sr_tag", 0)?;
    Ok(Type::Tensor(x.clone()))
}

/// The input of a reducing collective: not Bool; checks the `op` attribute.
fn reducible<'a>(cx: &Cx<'a>) -> Result<&'a TensorType, InferError> {
    let x = cx.tensor(0)?;
    if x.dtype == DType::Bool {
        return Err(cx.err(format!(
            "{} must have a numeric element type, got {x}",
            cx.name(0)
        )));
    }
    let op = cx.attr_str("op", "sum")?;
    if !matches!(op, "sum" | "max" | "min" | "prod") {
        return Err(cx.err(format!(
            "attribute `op` {op} is not a reduction (expected sum, max, min or prod)"
        )));
    }
    Ok(x)
}

/// The input of a collective along an axis (rank >= 1) and its `axis` attribute (default 0),
/// normalised.
fn gather_axis<'a>(cx: &Cx<'a>) -> Result<(&'a TensorType, usize), InferError> {
    let x = cx.expect_min_rank(0, 1, "(it is split or gathered along an axis)")?;
    let a = cx.attr_int("axis", 0)?;
    let axis = normalize_axis(a, x.rank()).ok_or_else(|| {
        cx.err(format!(
            "attribute `axis` {a} is out of range for {} of shape {}",
            cx.name(0),
            sh(&x.shape)
        ))
    })?;
    Ok((x, axis))
}

/// A rank attribute (>= 0); `default` None makes it required.
fn rank_attr(cx: &Cx<'_>, key: &str, default: Option<i64>) -> Result<i64, InferError> {
    let r = match default {
        Some(d) => cx.attr_int(key, d)?,
        None => cx.attr_int_req(key)?,
    };
    if r < 0 {
        return Err(cx.err(format!("attribute `{key}` must be >= 0, got {r}")));
    }
    Ok(r)
}

/// The group size from `rank_list` (or `rank_size`), validated; `required` makes a missing
/// group an error. Also checks `fusion` (>= 0) when present.
fn group(cx: &Cx<'_>, required: bool) -> Result<Option<usize>, InferError> {
    let fusion = cx.attr_int("fusion", 0)?;
    if fusion < 0 {
        return Err(cx.err(format!("attribute `fusion` must be >= 0, got {fusion}")));
    }
    if let Some(list) = cx.attr_ints("rank_list")? {
        if list.is_empty() {
            return Err(cx.err("attribute `rank_list` is empty"));
        }
        let mut seen = std::collections::HashSet::new();
        for &r in &list {
            if r < 0 || !seen.insert(r) {
                return Err(cx.err(format!(
                    "attribute `rank_list` {} must hold distinct ranks >= 0",
                    ints_text(&list)
                )));
            }
        }
        return Ok(Some(list.len()));
    }
    match cx.node.attrs.get("rank_size") {
        Some(Attr::Int(n)) if *n >= 1 => Ok(Some(*n as usize)),
        Some(other) => Err(cx.err(format!(
            "attribute `rank_size` must be an integer >= 1, got {}",
            other
        ))),
        None if required => Err(cx.err("attribute `rank_list` is missing")),
        None => Ok(None),
    }
}

fn all_to_all(cx: &Cx<'_>) -> Result<Type, InferError> {
    let x = cx.tensor(0)?;
    let rank = x.rank();
    let axis = |key: &str| -> Result<usize, InferError> {
        let a = cx.attr_int_req(key)?;
        normalize_axis(a, rank).ok_or_else(|| {
            cx.err(format!(
                "attribute `{key}` {a} is out of range for {} of shape {}",
                cx.name(0),
                sh(&x.shape)
            ))
        })
    };
    let split_dim = axis("split_dim")?;
    let concat_dim = axis("concat_dim")?;
    let group = group(cx, false)?;
    let count = match (cx.node.attrs.get("split_count"), group) {
        (None, Some(n)) => n,
        (None, None) => return Err(cx.err("attribute `split_count` is missing")),
        (Some(_), g) => {
            let c = cx.attr_int_req("split_count")?;
            let c = usize::try_from(c)
                .ok()
                .filter(|&c| c >= 1)
                .ok_or_else(|| cx.err(format!("attribute `split_count` must be >= 1, got {c}")))?;
            if let Some(n) = g.filter(|&n| n != c) {
                return Err(cx.err(format!(
                    "attribute `split_count` {c} differs from the group size {n} of `rank_list`"
                )));
            }
            c
        }
    };
    if x.shape[split_dim] % count != 0 {
        return Err(cx.err(format!(
            "split_count {count} does not divide dim {split_dim} of {} of shape {}",
            cx.name(0),
            sh(&x.shape)
        )));
    }
    let mut shape = x.shape.clone();
    shape[split_dim] /= count;
    shape[concat_dim] = shape[concat_dim].checked_mul(count).ok_or_else(|| {
        cx.err(format!(
            "split_count {count} times dim {concat_dim} of {} of shape {} overflows a size",
            cx.name(0),
            sh(&x.shape)
        ))
    })?;
    Ok(Type::Tensor(TensorType::new(x.dtype, shape)))
}

fn receive(cx: &Cx<'_>) -> Result<Type, InferError> {
    rank_attr(cx, "src_rank", None)?;
    cx.attr_int("sr_tag", 0)?;
    let shape = cx
        .attr_ints("shape")?
        .ok_or_else(|| cx.err("attribute `shape` is missing"))?;
    let dims = to_sizes(&shape).ok_or_else(|| {
        cx.err(format!(
            "attribute `shape` {} must hold sizes >= 0",
            ints_text(&shape)
        ))
    })?;
    let dtype = match cx.node.attrs.get("dtype") {
        None => return Err(cx.err("attribute `dtype` is missing")),
        Some(Attr::Str(s)) => parse_dtype(s)
            .ok_or_else(|| cx.err(format!("attribute `dtype` {s} is not an element type")))?,
        Some(other) => {
            return Err(cx.err(format!(
                "attribute `dtype` must be an element type name, got {}",
                other
            )))
        }
    };
    Ok(Type::Tensor(TensorType::new(dtype, dims)))
}

// ---- gradients ----

fn all_reduce_grad(r: &mut Rule<'_>) -> Grads {
    let op = r.node.attrs.str_or("op", "sum");
    if op != "sum" {
        return Err(r.em.no_gradient(format!(
            "only AllReduce with op: sum has a gradient, this one has op: {op}"
        )));
    }
    r.unary(|r, dy| {
        let attrs = r.copied_attrs();
        r.emit(AllReduce, vec![dy], attrs, "")
    })
}

fn all_gather_grad(r: &mut Rule<'_>) -> Grads {
    r.unary(|r, dy| {
        let attrs = r.copied_attrs().with("op", Attr::Str("sum".into()));
        r.emit(ReduceScatter, vec![dy], attrs, "")
    })
}

fn reduce_scatter_grad(r: &mut Rule<'_>) -> Grads {
    let op = r.node.attrs.str_or("op", "sum");
    if op != "sum" {
        return Err(r.em.no_gradient(format!(
            "only ReduceScatter with op: sum has a gradient, this one has op: {op}"
        )));
    }
    r.unary(|r, dy| {
        let mut attrs = r.copied_attrs();
        attrs.remove("op");
        r.emit(AllGather, vec![dy], attrs, "")
    })
}

fn all_to_all_grad(r: &mut Rule<'_>) -> Grads {
    r.unary(|r, dy| {
        let mut attrs = r.copied_attrs();
        let split = r.node.attrs.get("split_dim").cloned();
        let concat = r.node.attrs.get("concat_dim").cloned();
        match (split, concat) {
            (Some(s), Some(c)) => {
                attrs.set("split_dim", c);
                attrs.set("concat_dim", s);
            }
            _ => return Err(r.em.bad_node("AlltoAll needs `split_dim` and `concat_dim`")),
        }
        r.emit(AllToAll, vec![dy], attrs, "")
    })
}
