//! The shard collectives, run across every rank's values at once, and the bytes they move.
//!
//! Bytes are counted per rank with the ring algorithms' volumes and summed over the ranks:
//! an all-reduce of `S` bytes in a group of `g` moves `2 (g-1)/g S`; an all-gather `(g-1)/g`
//! of its result; a reduce-scatter and an all-to-all `(g-1)/g` of their input; a broadcast
//! `(g-1)/g S`; a send `S`; an all-slice none (it is local). [`bytes`] is the one formula, used
//! for shardc's collectives too.

use super::array::{strides, Arr};
use super::attr;
use super::exec::{attr_of, tensor, Env, Val};
use super::ir::Op;

/// The bytes one rank's collective moves (module doc): `kind` is shard's op name without the
/// dialect (`all_reduce`), `g` the group size, `input` and `output` that rank's tensor bytes.
pub fn bytes(kind: &str, g: usize, input: usize, output: usize) -> f64 {
    if g <= 1 {
        return 0.0;
    }
    let f = (g - 1) as f64 / g as f64;
    match kind {
        "all_reduce" => 2.0 * f * input as f64,
        "all_gather" => f * output as f64,
        "reduce_scatter" | "all_to_all" | "broadcast" => f * input as f64,
        "send" => input as f64,
        _ => 0.0,
    }
}

/// Whether `name` is a shard op that needs other ranks' values.
pub fn is_collective(name: &str) -> bool {
    matches!(
        name,
        "shard.all_reduce"
            | "shard.all_gather"
            | "shard.all_slice"
            | "shard.reduce_scatter"
            | "shard.all_to_all"
            | "shard.broadcast"
            | "shard.shift"
            | "shard.send"
            | "shard.recv"
            | "shard.gather"
            | "shard.scatter"
            | "shard.reduce"
    )
}

/// The members of `rank`'s group along `axes` (in shard's order: the multi-index along the
/// axes as listed, row-major), and `rank`'s position in it.
fn group(grid: &[usize], rank: usize, axes: &[usize]) -> (Vec<usize>, usize) {
    let st = strides(grid);
    let coords: Vec<usize> = grid
        .iter()
        .zip(&st)
        .map(|(&n, &s)| (rank / s) % n.max(1))
        .collect();
    let sizes: Vec<usize> = axes.iter().map(|&a| grid[a]).collect();
    let mut members = Vec::new();
    let mut me = 0;
    super::array::for_each_index(&sizes, |idx| {
        let mut c = coords.clone();
        for (&a, &i) in axes.iter().zip(idx) {
            c[a] = i;
        }
        let r: usize = c.iter().zip(&st).map(|(x, s)| x * s).sum();
        if r == rank {
            me = members.len();
        }
        members.push(r);
    });
    (members, me)
}

/// Runs collective `op` for every rank (`envs[r]` is rank `r`'s values); returns each rank's
/// results and the bytes moved over all ranks.
pub fn run(op: &Op, grid: &[usize], envs: &[Env]) -> Result<(Vec<Vec<Val>>, f64), String> {
    let kind = op.name.trim_start_matches("shard.");
    let axes: Vec<usize> = match op.attrs.get("grid_axes") {
        Some(a) => attr::ints(a)
            .ok_or("unreadable grid_axes")?
            .into_iter()
            .map(|x| usize::try_from(x).map_err(|_| "negative grid axis".to_string()))
            .collect::<Result<_, _>>()?,
        None => Vec::new(),
    };
    if axes.iter().any(|&a| a >= grid.len()) {
        return Err(format!("grid_axes {axes:?} outside the grid {grid:?}"));
    }
    let inputs: Vec<&Arr> = envs
        .iter()
        .map(|e| tensor(e, op, 0))
        .collect::<Result<_, _>>()?;
    let axis_attr = |key: &str| -> Result<usize, String> {
        attr::int(attr_of(op, key)?)
            .and_then(|v| usize::try_from(v).ok())
            .ok_or_else(|| format!("unreadable {key}"))
    };
    let mut outs = Vec::with_capacity(envs.len());
    let mut moved = 0.0;
    for rank in 0..envs.len() {
        let (members, me) = group(grid, rank, &axes);
        let g = members.len();
        let mine = inputs[rank];
        let parts: Vec<&Arr> = members.iter().map(|&m| inputs[m]).collect();
        if parts.iter().any(|p| p.shape != mine.shape) {
            return Err(format!(
                "the group {members:?} holds tensors of different shapes"
            ));
        }
        let reduce = || -> Result<Arr, String> {
            let red = attr::reduction(op.attrs.get("reduction").map(String::as_str));
            let mut acc = mine.clone();
            for (i, x) in acc.data.iter_mut().enumerate() {
                let vals = parts.iter().map(|p| p.data[i]);
                *x = match red {
                    "sum" => vals.sum(),
                    "average" => vals.sum::<f64>() / g as f64,
                    "product" => vals.product(),
                    "max" => vals.fold(f64::NEG_INFINITY, f64::max),
                    "min" => vals.fold(f64::INFINITY, f64::min),
                    other => return Err(format!("reduction {other}")),
                };
            }
            for x in acc.data.iter_mut() {
                *x = acc.elem.round(*x);
            }
            Ok(acc)
        };
        let bytes_of = |a: &Arr| a.data.len() * a.elem.bytes();
        let out = match kind {
            "all_reduce" => reduce()?,
            "all_gather" => Arr::concat(&parts, axis_attr("gather_axis")?)
                .ok_or("gather of mismatched shapes")?,
            "all_slice" => mine
                .chunk(axis_attr("slice_axis")?, g, me)
                .ok_or("slice axis not divisible by the group")?,
            "reduce_scatter" => reduce()?
                .chunk(axis_attr("scatter_axis")?, g, me)
                .ok_or("scatter axis not divisible by the group")?,
            "all_to_all" => {
                let split = axis_attr("split_axis")?;
                let cat = axis_attr("concat_axis")?;
                let chunks: Vec<Arr> = parts
                    .iter()
                    .map(|p| p.chunk(split, g, me).ok_or("split axis not divisible"))
                    .collect::<Result<_, _>>()?;
                let refs: Vec<&Arr> = chunks.iter().collect();
                Arr::concat(&refs, cat).ok_or("concat of mismatched shapes")?
            }
            "broadcast" => {
                let root = attr::ints(attr_of(op, "root")?).ok_or("unreadable root")?;
                let sizes: Vec<usize> = axes.iter().map(|&a| grid[a]).collect();
                let at: usize = root
                    .iter()
                    .zip(strides(&sizes))
                    .map(|(&c, s)| c.max(0) as usize * s)
                    .sum();
                (*parts.get(at).ok_or("root outside the group")?).clone()
            }
            other => return Err(format!("the evaluator does not implement shard.{other}")),
        };
        moved += bytes(kind, g, bytes_of(mine), bytes_of(&out));
        outs.push(vec![Val::T(out)]);
    }
    Ok((outs, moved))
}
