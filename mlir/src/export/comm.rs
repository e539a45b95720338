//! shardc's collectives in a rank's graph as `shard` dialect collectives.
//!
//! A collective's `rank_list` (its communication group) becomes the grid axes along which
//! the ranks of the group differ from this rank ([`Grid::group_axes`]); shardc's groups are
//! always such sets of axes of the plan's grid, and ascending rank order is shard's order of
//! the group's multi-index, so `AllGather`'s concatenation order agrees. Point-to-point ops
//! address the whole grid by multi-index.

use super::emit::{tensor_ty, Emitter, Val};
use crate::grid::{list_text, Grid};
use shardc_ir::{DType, Node, OpKind, ReduceOp, TensorType};

/// The rank whose graph is being written, on its grid.
pub struct RankCx<'a> {
    /// The rank.
    pub rank: usize,
    /// The grid.
    pub grid: &'a Grid,
}

/// shard's name of a reduction.
fn reduction(op: ReduceOp) -> &'static str {
    match op {
        ReduceOp::Sum => "sum",
        ReduceOp::Max => "max",
        ReduceOp::Min => "min",
        ReduceOp::Prod => "product",
    }
}

/// The grid axes of the node's `rank_list`.
fn axes(node: &Node, cx: &RankCx<'_>) -> Result<Vec<usize>, String> {
    let list = node
        .attrs
        .ints("rank_list")
        .ok_or_else(|| "no rank_list attribute".to_string())?;
    let ranks: Vec<usize> = list
        .iter()
        .map(|&r| usize::try_from(r).map_err(|_| format!("rank_list {list:?} has a negative rank")))
        .collect::<Result<_, _>>()?;
    cx.grid.group_axes(cx.rank, &ranks).ok_or_else(|| {
        format!(
            "rank_list {list:?} of rank {} is no set of axes of the grid {}",
            cx.rank,
            cx.grid.text_shape()
        )
    })
}

/// A tensor axis attribute, normalised.
fn axis(node: &Node, key: &str, rank: usize) -> Result<usize, String> {
    let a = node.attrs.int_or(key, 0);
    let n = if a < 0 { a + rank as i64 } else { a };
    usize::try_from(n)
        .ok()
        .filter(|&n| n < rank)
        .ok_or_else(|| format!("{key} {a} is outside a rank-{rank} tensor"))
}

/// The coordinates of `rank` as shard's static index list.
fn coords(cx: &RankCx<'_>, rank: i64) -> Result<String, String> {
    let r = usize::try_from(rank)
        .ok()
        .filter(|&r| r < cx.grid.device_num())
        .ok_or_else(|| {
            format!(
                "rank {rank} is outside the {} devices",
                cx.grid.device_num()
            )
        })?;
    Ok(list_text(&cx.grid.coords(r)))
}

/// Lowers the collective `node`; `None` when it is not one.
pub fn lower(
    e: &mut Emitter,
    node: &Node,
    ins: &[Option<Val>],
    cx: &RankCx<'_>,
) -> Result<Option<Vec<Val>>, String> {
    if !node.op.is_communication() {
        return Ok(None);
    }
    let all = list_text(&(0..cx.grid.shape.len()).collect::<Vec<_>>());
    let x = ins.first().and_then(|v| v.as_ref());
    let input = || x.ok_or_else(|| "the operand is not a tensor".to_string());
    let out = || {
        node.ty
            .as_tensor()
            .cloned()
            .ok_or_else(|| "the result is not one tensor".to_string())
    };
    let name = e.fresh();
    let (text, ty) = match node.op {
        OpKind::AllReduce => {
            let x = input()?;
            let op = ReduceOp::from_name(node.attrs.str_or("op", "sum"))
                .ok_or_else(|| format!("unknown op {}", node.attrs.str_or("op", "sum")))?;
            let ty = x.ty.clone();
            let t = tensor_ty(&ty);
            (
                format!(
                    "shard.all_reduce {} on @grid0 grid_axes = {} reduction = {} : {t} -> {t}",
                    x.name,
                    list_text(&axes(node, cx)?),
                    reduction(op)
                ),
                ty,
            )
        }
        OpKind::AllGather => {
            let x = input()?;
            let ty = out()?;
            (
                format!(
                    "shard.all_gather {} on @grid0 grid_axes = {} gather_axis = {} : {} -> {}",
                    x.name,
                    list_text(&axes(node, cx)?),
                    axis(node, "axis", x.ty.shape.len())?,
                    tensor_ty(&x.ty),
                    tensor_ty(&ty)
                ),
                ty,
            )
        }
        OpKind::ReduceScatter => {
            let x = input()?;
            let ty = out()?;
            let op = ReduceOp::from_name(node.attrs.str_or("op", "sum"))
                .ok_or_else(|| format!("unknown op {}", node.attrs.str_or("op", "sum")))?;
            (
                format!(
                    "shard.reduce_scatter {} on @grid0 grid_axes = {} reduction = {} scatter_axis = {} : {} -> {}",
                    x.name,
                    list_text(&axes(node, cx)?),
                    reduction(op),
                    axis(node, "axis", x.ty.shape.len())?,
                    tensor_ty(&x.ty),
                    tensor_ty(&ty)
                ),
                ty,
            )
        }
        OpKind::AllToAll => {
            let x = input()?;
            let ty = out()?;
            let r = x.ty.shape.len();
            (
                format!(
                    "shard.all_to_all {} on @grid0 grid_axes = {} split_axis = {} concat_axis = {} : {} -> {}",
                    x.name,
                    list_text(&axes(node, cx)?),
                    axis(node, "split_dim", r)?,
                    axis(node, "concat_dim", r)?,
                    tensor_ty(&x.ty),
                    tensor_ty(&ty)
                ),
                ty,
            )
        }
        OpKind::Broadcast => {
            let x = input()?;
            let ty = x.ty.clone();
            let t = tensor_ty(&ty);
            (
                format!(
                    "shard.broadcast {} on @grid0 grid_axes = {all} root = {} : ({t}) -> {t}",
                    x.name,
                    coords(cx, node.attrs.int_or("root_rank", 0))?
                ),
                ty,
            )
        }
        OpKind::Send => {
            let x = input()?;
            let ty = x.ty.clone();
            let t = tensor_ty(&ty);
            let dest = node
                .attrs
                .get("dest_rank")
                .and_then(|a| a.as_int())
                .ok_or_else(|| "no dest_rank attribute".to_string())?;
            (
                format!(
                    "shard.send {} on @grid0 grid_axes = {all} destination = {} : ({t}) -> {t}",
                    x.name,
                    coords(cx, dest)?
                ),
                ty,
            )
        }
        OpKind::Receive => {
            let ty = match node.ty.as_tensor() {
                Some(t) => t.clone(),
                None => {
                    let shape = node
                        .attrs
                        .ints("shape")
                        .ok_or_else(|| "no shape attribute".to_string())?;
                    let dtype = DType::from_name(node.attrs.str_or("dtype", "Float32"))
                        .ok_or_else(|| "unknown dtype attribute".to_string())?;
                    TensorType::new(
                        dtype,
                        shape.iter().map(|&s| s.max(0) as usize).collect::<Vec<_>>(),
                    )
                }
            };
            let src = node
                .attrs
                .get("src_rank")
                .and_then(|a| a.as_int())
                .ok_or_else(|| "no src_rank attribute".to_string())?;
            let buf = e.empty(&ty);
            let t = tensor_ty(&ty);
            (
                format!(
                    "shard.recv {} on @grid0 grid_axes = {all} source = {} : ({t}) -> {t}",
                    buf.name,
                    coords(cx, src)?
                ),
                ty,
            )
        }
        other => return Err(format!("{other} has no shard collective")),
    };
    e.line(format!("{name} = {text}"));
    Ok(Some(vec![Val { name, ty }]))
}
