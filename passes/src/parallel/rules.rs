//! The parallel rule of every op: from a strategy to the layouts the op needs and produces.
//!
//! [`sharding`] checks a strategy against the op's loop view ([`crate::ops::op_dims`]) and
//! returns an [`OpSharding`]: the op's device matrix (MindSpore's: one axis per loop, split
//! counts in loop order, a leading repeat axis when the strategy uses fewer devices than there
//! are), the layout each tensor input must have, the layout of each result — partial over the
//! axes of split loops the result lacks (a split contraction gives partial sums that an
//! AllReduce, or a ReduceScatter, completes) — and the scale a local mean needs.
//! [`default_strategy`] is the semi-auto default (split the batch) and [`candidates`] the
//! strategies a search may consider.

use super::dims::{Dim, OpDims};
use super::ParallelError;
use crate::ops::op_dims;
use shardc_ir::{Graph, Node, OpKind, ReduceOp, Strategy, TensorLayout};

/// What one op does under one strategy.
#[derive(Clone, Debug, PartialEq)]
pub struct OpSharding {
    /// The strategy, one tuple per tensor operand.
    pub strategy: Strategy,
    /// The split count of each loop.
    pub loop_splits: Vec<usize>,
    /// The op's device matrix.
    pub dev_matrix: Vec<usize>,
    /// The layout each operand must have (`None` for constants).
    pub inputs: Vec<Option<TensorLayout>>,
    /// The layout of each result.
    pub outputs: Vec<TensorLayout>,
    /// Multiply every result by this after the local op (a mean over a split loop), if any.
    pub scale: Option<f64>,
    /// The results' strategy (one tuple per result) when the op splits a loop that no input
    /// carries — UnsortedSegmentSum's segments, chosen by its `out_strategy`; `None` when it
    /// splits none.
    pub out_strategy: Option<Strategy>,
}

fn node_name(node: &Node) -> String {
    if node.instance.is_empty() {
        node.op.name().to_string()
    } else {
        node.instance.clone()
    }
}

fn invalid(node: &Node, strategy: &Strategy, reason: String) -> ParallelError {
    ParallelError::InvalidStrategy {
        instance: node_name(node),
        op: node.op,
        strategy: strategy.to_string(),
        reason,
    }
}

/// The loop view of `node`, or an error naming it.
pub fn dims_of(g: &Graph, node: &Node) -> Result<OpDims, ParallelError> {
    op_dims(g, node).map_err(|e| ParallelError::NoRule {
        instance: node_name(node),
        op: node.op,
        reason: e.0,
    })
}

/// Tensor operands' shapes (None for constants).
fn operand_shapes(g: &Graph, node: &Node) -> Vec<Option<Vec<usize>>> {
    node.inputs
        .iter()
        .map(|o| g.operand_tensor_type(o).map(|t| t.shape.clone()))
        .collect()
}

/// Checks `strategy` for `node` on `device_num` devices and derives its layouts.
pub fn sharding(
    g: &Graph,
    node: &Node,
    strategy: &Strategy,
    device_num: usize,
) -> Result<OpSharding, ParallelError> {
    let dims = dims_of(g, node)?;
    sharding_with(g, node, &dims, strategy, device_num)
}

/// As [`sharding`], with the loop view already computed. Loops that no input carries take
/// their split from the node's `out_strategy`.
pub fn sharding_with(
    g: &Graph,
    node: &Node,
    dims: &OpDims,
    strategy: &Strategy,
    device_num: usize,
) -> Result<OpSharding, ParallelError> {
    sharding_in_out(
        g,
        node,
        dims,
        strategy,
        node.out_strategy.as_ref(),
        device_num,
    )
}

/// The sharding that splits loop `l` by `splits[l]` (a candidate of a search), with the
/// strategy and, when a loop no input carries is split, the out strategy that say so.
pub fn sharding_of_loops(
    g: &Graph,
    node: &Node,
    dims: &OpDims,
    splits: &[usize],
    device_num: usize,
) -> Result<OpSharding, ParallelError> {
    let strategy = strategy_from_loops(g, node, dims, splits);
    let out = out_strategy_from_loops(dims, splits);
    sharding_in_out(g, node, dims, &strategy, out.as_ref(), device_num)
}

/// The loops that some result carries and no input does (created by the op).
fn output_only_loops(dims: &OpDims) -> Vec<usize> {
    (0..dims.loop_sizes.len())
        .filter(|&l| {
            !dims
                .inputs
                .iter()
                .flatten()
                .any(|ds| ds.iter().any(|d| d.loop_of() == Some(l)))
                && dims.outputs.iter().any(|ds| ds.contains(&Dim::Loop(l)))
        })
        .collect()
}

/// The out strategy that splits the output-only loops as `splits` says, or `None` when none
/// of them is split.
pub fn out_strategy_from_loops(dims: &OpDims, splits: &[usize]) -> Option<Strategy> {
    if !output_only_loops(dims).iter().any(|&l| splits[l] > 1) {
        return None;
    }
    Some(Strategy(
        dims.outputs
            .iter()
            .map(|ds| {
                ds.iter()
                    .map(|d| match d {
                        Dim::Loop(l) => splits[*l] as i64,
                        Dim::Whole | Dim::Window(_) => 1,
                    })
                    .collect()
            })
            .collect(),
    ))
}

fn sharding_in_out(
    g: &Graph,
    node: &Node,
    dims: &OpDims,
    strategy: &Strategy,
    out_strategy: Option<&Strategy>,
    device_num: usize,
) -> Result<OpSharding, ParallelError> {
    let bad = |reason: String| invalid(node, strategy, reason);
    let shapes = operand_shapes(g, node);
    let tensor_inputs: Vec<usize> = (0..shapes.len()).filter(|&i| shapes[i].is_some()).collect();
    if strategy.0.len() != tensor_inputs.len() {
        return Err(bad(format!(
            "the strategy has {} tuple(s) but the op has {} tensor input(s); give one tuple per \
             input",
            strategy.0.len(),
            tensor_inputs.len()
        )));
    }
    let nloops = dims.loop_sizes.len();
    // (split, input, dim) that set each loop first.
    let mut loop_split: Vec<Option<(usize, usize, usize)>> = vec![None; nloops];
    for (k, &i) in tensor_inputs.iter().enumerate() {
        let shape = shapes[i].as_ref().expect("tensor input");
        let s = &strategy.0[k];
        if s.len() != shape.len() {
            return Err(bad(format!(
                "input {i} has rank {} (shape {:?}) but its strategy {:?} has {} entries",
                shape.len(),
                shape,
                s,
                s.len()
            )));
        }
        let in_dims = dims.inputs.get(i).cloned().flatten().unwrap_or_default();
        for (j, &split) in s.iter().enumerate() {
            if split < 1 {
                return Err(bad(format!(
                    "input {i} dimension {j} has split {split}; a split count must be >= 1"
                )));
            }
            let split = split as usize;
            if split > device_num {
                return Err(bad(format!(
                    "input {i} dimension {j} is split {split}, more than device_num {device_num}"
                )));
            }
            let dim = in_dims.get(j).copied().unwrap_or(Dim::Whole);
            if dim == Dim::Whole && split != 1 {
                let why = if shape[j] == 1 {
                    "it is broadcast (size 1)".to_string()
                } else {
                    format!("{} needs it whole", node.op.name())
                };
                return Err(bad(format!(
                    "input {i} dimension {j} cannot be split ({why}), strategy has {split}"
                )));
            }
            // A windowed dimension is gathered whole: its size need not divide.
            if !matches!(dim, Dim::Window(_)) && shape[j] % split != 0 {
                return Err(bad(format!(
                    "input {i} dimension {j} of size {} is not divisible by {split}",
                    shape[j]
                )));
            }
            match dim {
                Dim::Whole => {}
                Dim::Loop(l) | Dim::Window(l) => match loop_split[l] {
                    None => loop_split[l] = Some((split, i, j)),
                    Some((s0, i0, j0)) if s0 != split => {
                        let contracted = dims.combine[l].is_some()
                            && !dims.outputs.iter().any(|o| o.contains(&Dim::Loop(l)));
                        return Err(bad(format!(
                            "input {i} dimension {j} is split {split} but input {i0} dimension \
                             {j0}, {} dimension, is split {s0}; they must be split alike",
                            if contracted {
                                "the same contracted"
                            } else {
                                "the same"
                            }
                        )));
                    }
                    Some(_) => {}
                },
            }
        }
    }
    // Loops no input carries: from the out strategy (ignored by ops that have none).
    let output_only = output_only_loops(dims);
    let mut splits_out = false;
    if let (false, Some(out)) = (output_only.is_empty(), out_strategy) {
        let bad_out = |reason: String| bad(format!("out_strategy {out}: {reason}"));
        if out.0.len() != dims.outputs.len() {
            return Err(bad_out(format!(
                "it has {} tuple(s) but the op has {} result(s)",
                out.0.len(),
                dims.outputs.len()
            )));
        }
        for (o, (ds, t)) in dims.outputs.iter().zip(&out.0).enumerate() {
            if t.len() != ds.len() {
                return Err(bad_out(format!(
                    "result {o} has rank {} but its tuple has {} entries",
                    ds.len(),
                    t.len()
                )));
            }
            for (j, (d, &split)) in ds.iter().zip(t).enumerate() {
                if split < 1 {
                    return Err(bad_out(format!(
                        "result {o} dimension {j} has split {split}; a split count must be >= 1"
                    )));
                }
                let split = split as usize;
                match *d {
                    Dim::Loop(l) if output_only.contains(&l) => {
                        if let (Some(why), true) = (&dims.fixed[l], split > 1) {
                            return Err(bad_out(format!(
                                "result {o} dimension {j} cannot be split: {why}"
                            )));
                        }
                        match loop_split[l] {
                            Some((s0, _, _)) if s0 != split => {
                                return Err(bad_out(format!(
                                    "result {o} dimension {j} is split {split} but another \
                                     result splits the same dimension {s0}"
                                )))
                            }
                            _ => loop_split[l] = Some((split, o, j)),
                        }
                        splits_out |= split > 1;
                    }
                    _ => {
                        let from_inputs = match *d {
                            Dim::Loop(l) => loop_split[l].map_or(1, |(v, _, _)| v),
                            Dim::Whole | Dim::Window(_) => 1,
                        };
                        if split != from_inputs {
                            return Err(bad_out(format!(
                                "result {o} dimension {j} is split {split} but the input \
                                 strategy splits it {from_inputs}"
                            )));
                        }
                    }
                }
            }
        }
    }
    let splits: Vec<usize> = loop_split
        .iter()
        .map(|s| s.map(|(v, _, _)| v).unwrap_or(1))
        .collect();
    for (l, &s) in splits.iter().enumerate() {
        if s == 1 {
            continue;
        }
        let (_, i, j) = loop_split[l].expect("split loop has a source");
        if let Some(why) = &dims.fixed[l] {
            return Err(bad(format!(
                "input {i} dimension {j} cannot be split: {why}"
            )));
        }
        for (o, out) in dims.outputs.iter().enumerate() {
            if !out.contains(&Dim::Loop(l)) && dims.combine[l].is_none() && !dims.uniform[l] {
                return Err(bad(format!(
                    "input {i} dimension {j} cannot be split: result {o} does not have it and \
                     cannot be completed from parts"
                )));
            }
        }
    }
    let used = splits
        .iter()
        .try_fold(1usize, |acc, &s| acc.checked_mul(s))
        .unwrap_or(usize::MAX);
    if used > device_num {
        return Err(bad(format!(
            "the strategy uses {used} devices (the product of its splits) but device_num is \
             {device_num}"
        )));
    }
    if device_num % used != 0 {
        return Err(bad(format!(
            "the strategy uses {used} devices, which does not divide device_num {device_num}"
        )));
    }
    // Output divisibility (a reshape maps a split onto a dimension of another size).
    let out_shapes: Vec<Vec<usize>> = node.ty.tensors().iter().map(|t| t.shape.clone()).collect();
    for (o, out) in dims.outputs.iter().enumerate() {
        for (j, d) in out.iter().enumerate() {
            if let Dim::Loop(l) = d {
                let n = out_shapes
                    .get(o)
                    .and_then(|s| s.get(j))
                    .copied()
                    .unwrap_or(1);
                if n % splits[*l] != 0 {
                    return Err(bad(format!(
                        "result {o} dimension {j} of size {n} is not divisible by {}",
                        splits[*l]
                    )));
                }
            }
        }
    }
    let repeat = device_num / used;
    let mut dev_matrix = Vec::with_capacity(nloops + 1);
    if repeat > 1 || nloops == 0 {
        dev_matrix.push(repeat);
    }
    dev_matrix.extend(&splits);
    let axis_of = |l: usize| (nloops - 1 - l) as i64;
    let layout_of = |ds: &[Dim], shape: &[usize], partial: Vec<usize>, op: ReduceOp| TensorLayout {
        dev_matrix: dev_matrix.clone(),
        tensor_map: ds
            .iter()
            .map(|d| match d {
                Dim::Loop(l) => axis_of(*l),
                Dim::Whole | Dim::Window(_) => -1,
            })
            .collect(),
        tensor_shape: shape.to_vec(),
        partial,
        partial_op: op,
    };
    let inputs = shapes
        .iter()
        .enumerate()
        .map(|(i, s)| {
            s.as_ref().map(|s| {
                let ds = dims.inputs.get(i).cloned().flatten().unwrap_or_default();
                layout_of(&ds, s, Vec::new(), ReduceOp::Sum)
            })
        })
        .collect();
    let mut outputs = Vec::with_capacity(dims.outputs.len());
    for (o, out) in dims.outputs.iter().enumerate() {
        let mut partial = Vec::new();
        let mut op = ReduceOp::Sum;
        for (l, &split) in splits.iter().enumerate() {
            if split > 1 && !out.contains(&Dim::Loop(l)) && !dims.uniform[l] {
                partial.push(axis_of(l) as usize);
                op = dims.combine[l].unwrap_or(ReduceOp::Sum);
            }
        }
        partial.sort_unstable();
        let shape = out_shapes.get(o).cloned().unwrap_or_default();
        outputs.push(layout_of(out, &shape, partial, op));
    }
    let mean_div: usize = dims.mean_loops.iter().map(|&l| splits[l]).product();
    Ok(OpSharding {
        strategy: strategy.clone(),
        loop_splits: splits,
        dev_matrix,
        inputs,
        outputs,
        scale: (mean_div > 1).then(|| 1.0 / mean_div as f64),
        out_strategy: splits_out.then(|| out_strategy.cloned()).flatten(),
    })
}

/// The strategy that gives loop `l` split `splits[l]`, written per tensor operand.
pub fn strategy_from_loops(g: &Graph, node: &Node, dims: &OpDims, splits: &[usize]) -> Strategy {
    let shapes = operand_shapes(g, node);
    Strategy(
        shapes
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                s.as_ref().map(|s| {
                    let ds = dims.inputs.get(i).cloned().flatten().unwrap_or_default();
                    (0..s.len())
                        .map(|j| match ds.get(j) {
                            Some(Dim::Loop(l)) | Some(Dim::Window(l)) => splits[*l] as i64,
                            _ => 1,
                        })
                        .collect()
                })
            })
            .collect(),
    )
}

/// Whether loop `l` may be split by `s` for this node (not fixed, completable, divisible).
pub fn loop_admits(g: &Graph, node: &Node, dims: &OpDims, l: usize, s: usize) -> bool {
    if s == 1 {
        return true;
    }
    if dims.fixed[l].is_some() {
        return false;
    }
    if dims.outputs.iter().any(|o| !o.contains(&Dim::Loop(l)))
        && dims.combine[l].is_none()
        && !dims.uniform[l]
    {
        return false;
    }
    let shapes = operand_shapes(g, node);
    let ins_ok = shapes.iter().enumerate().all(|(i, sh)| match sh {
        None => true,
        Some(sh) => {
            let ds = dims.inputs.get(i).cloned().flatten().unwrap_or_default();
            ds.iter()
                .zip(sh)
                .all(|(d, &n)| *d != Dim::Loop(l) || n % s == 0)
        }
    });
    let outs_ok = node.ty.tensors().iter().zip(&dims.outputs).all(|(t, ds)| {
        ds.iter()
            .zip(&t.shape)
            .all(|(d, &n)| *d != Dim::Loop(l) || n % s == 0)
    });
    // A loop that no tensor carries cannot be split (a loop only results carry is split
    // through the out strategy).
    let carried = dims
        .inputs
        .iter()
        .flatten()
        .chain(&dims.outputs)
        .any(|ds| ds.iter().any(|d| d.loop_of() == Some(l)));
    ins_ok && outs_ok && carried
}

/// The semi-auto default for an unannotated op: split the batch (loop 0; for Gather the
/// indices' first dimension, for UnsortedSegmentSum x's) over as many devices as divide it
/// (all of them when possible); an op whose batch cannot be split runs whole on every device.
pub fn default_strategy(
    g: &Graph,
    node: &Node,
    device_num: usize,
) -> Result<Strategy, ParallelError> {
    let dims = dims_of(g, node)?;
    let mut splits = vec![1usize; dims.loop_sizes.len()];
    // The batch loop: loop 0, but for the ops that number the loops of a weight or of their
    // result first, the loop of their data's first dimension: Gather's indices (the table's
    // rows are split only when the user asks) and UnsortedSegmentSum's x.
    let data = match node.op {
        OpKind::Gather => Some(1),
        OpKind::UnsortedSegmentSum => Some(0),
        _ => None,
    };
    let batch = match data {
        None => Some(0),
        Some(k) => match dims.inputs.get(k).cloned().flatten().as_deref() {
            Some([Dim::Loop(l), ..]) => Some(*l),
            _ => None,
        },
    };
    if let Some(b) = batch.filter(|&b| b < splits.len()) {
        let mut s = device_num;
        while s > 1 && !loop_admits(g, node, &dims, b, s) {
            s = (1..s).rev().find(|d| device_num % d == 0).unwrap_or(1);
        }
        splits[b] = s;
    }
    Ok(strategy_from_loops(g, node, &dims, &splits))
}

/// Propagation considers splitting at most this many loops of one op (the `max_loops` of
/// [`candidates`], in the search too).
pub const MAX_SPLIT_LOOPS: usize = 4;

/// Every strategy worth considering for `node` on `device_num` devices: each loop split by a
/// divisor, the product dividing `device_num`, in a fixed order (fewest devices last, so that
/// ties between equal costs go to the strategy using more devices). Loops beyond the first
/// `max_loops` splittable ones stay whole, which bounds the count.
pub fn candidates(
    g: &Graph,
    node: &Node,
    dims: &OpDims,
    device_num: usize,
    max_loops: usize,
) -> Vec<Vec<usize>> {
    let nloops = dims.loop_sizes.len();
    let divisors: Vec<usize> = (1..=device_num).filter(|d| device_num % d == 0).collect();
    // Which divisor each loop admits, decided once per loop (the odometer below visits every
    // combination).
    let admits: Vec<Vec<bool>> = (0..nloops)
        .map(|l| {
            divisors
                .iter()
                .map(|&d| loop_admits(g, node, dims, l, d))
                .collect()
        })
        .collect();
    let free: Vec<usize> = (0..nloops)
        .filter(|&l| admits[l].iter().skip(1).any(|&a| a))
        .take(max_loops)
        .collect();
    // Odometer over the divisors of each free loop.
    let mut out = Vec::new();
    let mut idx = vec![0usize; free.len()];
    'outer: loop {
        let mut cur = vec![1usize; nloops];
        let mut used = 1usize;
        let mut ok = true;
        for (k, &l) in free.iter().enumerate() {
            let d = divisors[idx[k]];
            used *= d;
            if used > device_num || device_num % used != 0 || !admits[l][idx[k]] {
                ok = false;
                break;
            }
            cur[l] = d;
        }
        if ok {
            out.push(cur);
        }
        for k in (0..free.len()).rev() {
            idx[k] += 1;
            if idx[k] < divisors.len() {
                continue 'outer;
            }
            idx[k] = 0;
        }
        break;
    }
    // More devices first; then lexicographic (deterministic).
    out.sort_by(|a, b| {
        let pa: usize = a.iter().product();
        let pb: usize = b.iter().product();
        pb.cmp(&pa).then_with(|| b.cmp(a))
    });
    out
}
