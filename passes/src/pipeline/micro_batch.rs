//! Micro-batches in the logical graph (MindSpore's `PipelineCell(net, micro_size)`).
//!
//! Every data input has the batch as dimension 0 (`B`). As MindSpore's `PipelineCell` slices
//! each rank's own batch, micro-batch `m` is the `m`-th of `M = micro_size` contiguous chunks
//! of each data-parallel block (the `d` contiguous blocks the dataset strategy splits
//! dimension 0 into; `B` divisible by `d·M`). Each input is reshaped once `[B, ...] -> [d, M,
//! B/(d·M), ...]` (`[M, B/M, ...]` when `d` is 1; `micro_reshape_<input>`); micro-batch `m`
//! is `StridedSlice` of index `m` along the `M` axis, then `Reshape [B/M, ...]`
//! (`micro_slice_<input>_micro{m}`, `micro_input_<input>_micro{m}`). The data-parallel split
//! of dimension 0 carries to the leading `d` axis, so every slice is local; and chunks are
//! contiguous, so a sample of several rows (a sequence's tokens, flattened) stays whole in one
//! micro-batch when its rows divide `B/(d·M)`.
//!
//! Every forward node that depends on a data input is cloned `M` times, clone `m` with the
//! attribute `micro_batch: m` and the instance name `<instance>_micro{m}`; a node depending on
//! no data input (weight-only computation) is kept once. The loss becomes
//! `(l_0 + ... + l_{M-1}) / M` when it is a mean over the batch (`ReduceMean`,
//! `SparseSoftmaxCrossEntropyWithLogits`, or one of them scaled by a constant), the plain sum
//! when it is a sum (`ReduceSum`): the micro-batched step computes the global batch's loss
//! (`micro_loss_sum`, `micro_loss_mean`). Autodiff then sums the weights' gradients over the
//! micro-batches by itself (gradient accumulation).

use super::{node_name, PipelineError, MICRO_ATTR, STAGE_ATTR};
use crate::infer::infer_node;
use shardc_ir::{Attr, Const, Graph, Node, NodeId, OpKind, Operand, ParamId, ParamKind, Type};

fn err(instance: String, reason: String) -> PipelineError {
    PipelineError {
        pass: "micro_batch",
        instance,
        reason,
    }
}

/// Whether the scalar loss computed by node `i` is a mean over the batch (`Ok(true)`) or a sum
/// (`Ok(false)`); anything else is an error naming the op and why.
fn loss_is_mean(g: &Graph, i: usize) -> Result<bool, PipelineError> {
    let n = &g.nodes[i];
    let scalar = |o: &Operand| {
        g.operand_tensor_type(o)
            .is_some_and(|t| t.shape.iter().product::<usize>() == 1)
    };
    match n.op {
        OpKind::ReduceMean => Ok(true),
        OpKind::ReduceSum => Ok(false),
        OpKind::SparseSoftmaxCrossEntropyWithLogits
            if !n
                .attrs
                .get("is_grad")
                .and_then(Attr::as_bool)
                .unwrap_or(false) =>
        {
            Ok(true)
        }
        OpKind::Mul | OpKind::RealDiv => {
            // A loss scaled by a constant: the scaled value decides.
            match (n.inputs.first(), n.inputs.get(1)) {
                (Some(Operand::Node(x)), Some(Operand::Const(_))) if scalar(&n.inputs[0]) => {
                    loss_is_mean(g, x.index())
                }
                (Some(Operand::Const(_)), Some(Operand::Node(x)))
                    if n.op == OpKind::Mul && scalar(&n.inputs[1]) =>
                {
                    loss_is_mean(g, x.index())
                }
                _ => Err(not_a_batch_reduction(g, i)),
            }
        }
        _ => Err(not_a_batch_reduction(g, i)),
    }
}

fn not_a_batch_reduction(g: &Graph, i: usize) -> PipelineError {
    err(
        node_name(g, i),
        format!(
            "computes the loss with {}: micro-batching needs the loss to be a mean or a sum over the batch (ReduceMean, ReduceSum, SparseSoftmaxCrossEntropyWithLogits, or one of them scaled by a constant)",
            g.nodes[i].op
        ),
    )
}

/// Appends `node` to `out`, typed by its shape rule.
fn push(out: &mut Graph, mut node: Node) -> Result<NodeId, PipelineError> {
    node.ty = infer_node(out, &node).map_err(|e| err(node.instance.clone(), e.to_string()))?;
    Ok(out.push_node(node))
}

/// The forward graph `g` (typed) with `micro_size` micro-batches; see the module
/// documentation. `batch_splits[p]` is how many contiguous blocks the dataset strategy splits
/// data input `p`'s dimension 0 into (its data-parallel ranks; missing or 0: 1): each block
/// is cut into `micro_size` chunks, and micro-batch `m` is every block's `m`-th chunk.
/// `micro_size` 1 returns `g` unchanged.
pub fn micro_batch(
    g: &Graph,
    micro_size: usize,
    batch_splits: &[usize],
) -> Result<Graph, PipelineError> {
    let m_count = micro_size;
    if m_count <= 1 {
        return Ok(g.clone());
    }
    // Which nodes depend on a data input.
    let is_input = |p: &ParamId| matches!(g.params[p.index()].kind, ParamKind::Input);
    let mut data = vec![false; g.nodes.len()];
    for (i, n) in g.nodes.iter().enumerate() {
        data[i] = n.inputs.iter().any(|o| match o {
            Operand::Param(p) => is_input(p),
            Operand::Node(id) => data[id.index()],
            Operand::Const(_) => false,
        });
    }
    let Some(Operand::Node(loss)) = g.loss().cloned() else {
        return Err(err(
            g.name.clone(),
            "micro-batching needs the graph's first output to be the loss, computed by a node"
                .into(),
        ));
    };
    let scalar = matches!(&g.nodes[loss.index()].ty, Type::Tensor(t) if t.shape.iter().product::<usize>() == 1);
    if !scalar || !data[loss.index()] {
        return Err(err(
            node_name(g, loss.index()),
            format!(
                "the loss {:?} must be a scalar computed from the data inputs to be split into micro-batches",
                g.nodes[loss.index()].ty
            ),
        ));
    }
    let mean = loss_is_mean(g, loss.index())?;
    for (k, o) in g.outputs.iter().enumerate().skip(1) {
        if let Operand::Node(id) = o {
            if data[id.index()] {
                return Err(err(
                    node_name(g, id.index()),
                    format!("output {k} depends on the batch: a micro-batched step returns the loss only (and values of the weights)"),
                ));
            }
        }
    }
    let mut out = Graph::new(g.name.clone());
    out.params = g.params.clone();
    // Weight-only nodes, once, in order.
    let mut once: Vec<Option<NodeId>> = vec![None; g.nodes.len()];
    for (i, n) in g.nodes.iter().enumerate() {
        if !data[i] {
            let mut c = n.clone();
            for o in &mut c.inputs {
                if let Operand::Node(id) = o {
                    *id = once[id.index()]
                        .ok_or_else(|| err(node_name(g, i), "reads a later node".into()))?;
                }
            }
            once[i] = Some(out.push_node(c));
        }
    }
    // The data inputs' micro-batches: per input read, per micro-batch, the operand.
    let stage_of_readers = |p: usize| -> Option<i64> {
        g.nodes
            .iter()
            .filter(|n| {
                n.inputs
                    .iter()
                    .any(|o| matches!(o, Operand::Param(q) if q.index() == p))
            })
            .filter_map(|n| n.attrs.get(STAGE_ATTR).and_then(Attr::as_int))
            .min()
    };
    let mut slices: Vec<Vec<Operand>> = vec![Vec::new(); g.params.len()];
    for (p, prm) in g.params.iter().enumerate() {
        let read = g.nodes.iter().any(|n| {
            n.inputs
                .iter()
                .any(|o| matches!(o, Operand::Param(q) if q.index() == p))
        });
        if !read || !matches!(prm.kind, ParamKind::Input) {
            continue;
        }
        let shape = &prm.ty.shape;
        let b = shape.first().copied().unwrap_or(0);
        let d = batch_splits.get(p).copied().unwrap_or(1).max(1);
        if shape.is_empty() || b % (d * m_count) != 0 {
            return Err(err(
                prm.name.clone(),
                format!(
                    "data input of shape {shape:?}: its batch dimension 0 ({b}) is not divisible by micro_size {m_count}{}",
                    if d > 1 {
                        format!(" times the {d} data-parallel blocks the dataset strategy splits it into")
                    } else {
                        String::new()
                    }
                ),
            ));
        }
        let rest: Vec<i64> = shape[1..].iter().map(|&x| x as i64).collect();
        let per = (b / m_count) as i64;
        let chunk = (b / (d * m_count)) as i64;
        let stage = stage_of_readers(p);
        let mark = |n: &mut Node, micro: Option<usize>| {
            if let Some(k) = stage {
                n.attrs.set(STAGE_ATTR, Attr::Int(k));
            }
            if let Some(m) = micro {
                n.attrs.set(MICRO_ATTR, Attr::Int(m as i64));
            }
        };
        // [B, ...] -> [d, M, B/(d M), ...] (the data-parallel blocks leading, so that their
        // split carries to dimension 0 and the micro-batch axis stays whole), or [M, B/M, ...]
        // on one block.
        let (mut wide, axis) = if d > 1 {
            (vec![d as i64, m_count as i64, chunk], 1)
        } else {
            (vec![m_count as i64, per], 0)
        };
        wide.extend(&rest);
        let mut r = Node::new(
            OpKind::Reshape,
            vec![
                Operand::Param(ParamId(p as u32)),
                Operand::Const(Const::Ints(wide.clone())),
            ],
        );
        r.instance = format!("micro_reshape_{}", prm.name);
        r.comments.push(if d > 1 {
            format!(
                "micro-batches of `{}`: [B, ...] -> [{d}, {m_count}, B/{}, ...]; micro-batch m is the m-th of {m_count} contiguous chunks of each of the {d} data-parallel blocks",
                prm.name,
                d * m_count
            )
        } else {
            format!(
                "micro-batches of `{}`: [B, ...] -> [{m_count}, B/{m_count}, ...]; micro-batch m is the m-th of {m_count} contiguous chunks",
                prm.name
            )
        });
        mark(&mut r, None);
        let wide_id = push(&mut out, r)?;
        for m in 0..m_count {
            let mut begin = vec![0i64; wide.len()];
            begin[axis] = m as i64;
            let mut end = wide.clone();
            end[axis] = m as i64 + 1;
            let mut s = Node::new(
                OpKind::StridedSlice,
                vec![
                    Operand::Node(wide_id),
                    Operand::Const(Const::Ints(begin)),
                    Operand::Const(Const::Ints(end)),
                    Operand::Const(Const::Ints(vec![1; wide.len()])),
                ],
            );
            s.instance = format!("micro_slice_{}_micro{m}", prm.name);
            mark(&mut s, Some(m));
            let s_id = push(&mut out, s)?;
            let mut narrow = vec![per];
            narrow.extend(&rest);
            let mut r = Node::new(
                OpKind::Reshape,
                vec![Operand::Node(s_id), Operand::Const(Const::Ints(narrow))],
            );
            r.instance = format!("micro_input_{}_micro{m}", prm.name);
            mark(&mut r, Some(m));
            slices[p].push(Operand::Node(push(&mut out, r)?));
        }
    }
    // The clones, micro-batch by micro-batch.
    let mut losses = Vec::with_capacity(m_count);
    for m in 0..m_count {
        let mut clone_of: Vec<Option<NodeId>> = vec![None; g.nodes.len()];
        for (i, n) in g.nodes.iter().enumerate() {
            if !data[i] {
                continue;
            }
            let mut c = n.clone();
            for o in &mut c.inputs {
                let new = match &*o {
                    Operand::Node(id) => Operand::Node(
                        clone_of[id.index()]
                            .or(once[id.index()])
                            .ok_or_else(|| err(node_name(g, i), "reads a later node".into()))?,
                    ),
                    Operand::Param(p) if is_input(p) => slices[p.index()]
                        .get(m)
                        .cloned()
                        .ok_or_else(|| err(node_name(g, i), "reads an unsliced input".into()))?,
                    other => other.clone(),
                };
                *o = new;
            }
            // A batch-major reshape names the batch in its leading size: a micro-batch's is
            // `1/M` of it.
            if c.op == OpKind::Reshape {
                if let Some(Operand::Const(Const::Ints(shape))) = c.inputs.get_mut(1) {
                    if let Some(d) = shape.first_mut().filter(|d| **d > 0) {
                        if *d % m_count as i64 == 0 {
                            *d /= m_count as i64;
                        }
                    }
                }
            }
            if !c.instance.is_empty() {
                c.instance = format!("{}_micro{m}", c.instance);
            }
            c.attrs.set(MICRO_ATTR, Attr::Int(m as i64));
            // Types change with the batch: retyped by the shape rules.
            clone_of[i] = Some(push(&mut out, c)?);
        }
        losses
            .push(clone_of[loss.index()].ok_or_else(|| {
                err(node_name(g, loss.index()), "the loss was not cloned".into())
            })?);
    }
    let loss_node = &g.nodes[loss.index()];
    let stage = loss_node.attrs.get(STAGE_ATTR).cloned();
    let mut total = Operand::Node(losses[0]);
    for (m, l) in losses.iter().enumerate().skip(1) {
        let mut a = Node::new(OpKind::Add, vec![total, Operand::Node(*l)]);
        a.instance = format!("micro_loss_sum_{m}");
        a.scope.clone_from(&loss_node.scope);
        if let Some(k) = &stage {
            a.attrs.set(STAGE_ATTR, k.clone());
        }
        total = Operand::Node(push(&mut out, a)?);
    }
    if mean {
        let mut d = Node::new(
            OpKind::RealDiv,
            vec![total, Operand::Const(Const::Float(m_count as f64))],
        );
        d.instance = "micro_loss_mean".into();
        d.scope.clone_from(&loss_node.scope);
        d.comments.push(format!(
            "the loss of the global batch: the mean of the {m_count} micro-batches' mean losses"
        ));
        if let Some(k) = &stage {
            d.attrs.set(STAGE_ATTR, k.clone());
        }
        total = Operand::Node(push(&mut out, d)?);
    }
    out.outputs = g
        .outputs
        .iter()
        .enumerate()
        .map(|(k, o)| match o {
            _ if k == 0 => Ok(total.clone()),
            Operand::Node(id) => once[id.index()]
                .map(Operand::Node)
                .ok_or_else(|| err(node_name(g, id.index()), "output not kept".into())),
            other => Ok(other.clone()),
        })
        .collect::<Result<_, _>>()?;
    Ok(out)
}

/// The forward of one of `pieces` micro-batches of `g` (typed) as a standalone graph: `g`
/// rebatched to `1 / pieces` of its batch. It is [`micro_batch`]'s micro-batch 0 (the first
/// contiguous chunk of every data input, one data-parallel block) with its slices replaced by
/// the data inputs themselves, now `[B / pieces, ...]`: the same batch-major `Reshape`s
/// divided, the same instance names without the `_micro0` suffix, no `micro_batch`
/// attribute, the loss of that micro-batch as the first output. `pieces` 1 returns `g`.
/// Errors as [`micro_batch`] (a batch not divisible by `pieces`, a loss that is no mean or
/// sum over the batch).
pub fn one_micro_batch(g: &Graph, pieces: usize) -> Result<Graph, PipelineError> {
    if pieces <= 1 {
        return Ok(g.clone());
    }
    let split = micro_batch(g, pieces, &[])?;
    let is_input = |p: &ParamId| matches!(split.params[p.index()].kind, ParamKind::Input);
    let mut out = Graph::new(g.name.clone());
    out.params = g.params.clone();
    for prm in &mut out.params {
        if matches!(prm.kind, ParamKind::Input) {
            if let Some(b) = prm.ty.shape.first_mut() {
                *b /= pieces;
            }
        }
    }
    // What each node of `split` is in `out`: a data input (the micro-batch's reshape, slice
    // and narrowing of it), a kept node, or nothing (another micro-batch, the loss sum).
    let mut now: Vec<Option<Operand>> = vec![None; split.nodes.len()];
    let suffix = "_micro0";
    for (i, n) in split.nodes.iter().enumerate() {
        let micro = n.attrs.get(MICRO_ATTR).and_then(Attr::as_int);
        let reads_input = n.inputs.iter().find_map(|o| match o {
            Operand::Param(p) if is_input(p) => Some(o.clone()),
            _ => None,
        });
        let slicing = n.instance.starts_with("micro_reshape_")
            || n.instance.starts_with("micro_slice_")
            || n.instance.starts_with("micro_input_");
        if slicing {
            // The chain reshape -> slice -> narrowing of one data input.
            now[i] = match (reads_input, n.inputs.first()) {
                (Some(p), _) => Some(p),
                (None, Some(Operand::Node(id))) => now[id.index()].clone(),
                _ => None,
            };
            if micro.is_some_and(|m| m != 0) {
                now[i] = None;
            }
            continue;
        }
        if micro.is_some_and(|m| m != 0)
            || (micro.is_none() && n.instance.starts_with("micro_loss_"))
        {
            continue;
        }
        let mut c = n.clone();
        for o in &mut c.inputs {
            if let Operand::Node(id) = o {
                *o = now[id.index()].clone().ok_or_else(|| {
                    err(
                        node_name(&split, i),
                        "reads a node of another micro-batch".into(),
                    )
                })?;
            }
        }
        if micro.is_some() {
            c.attrs.remove(MICRO_ATTR);
            if let Some(base) = c.instance.strip_suffix(suffix) {
                c.instance = base.to_string();
            }
        }
        now[i] = Some(Operand::Node(out.push_node(c)));
    }
    // Micro-batch 0's loss is the first term of the micro-batches' sum.
    let sum = split
        .nodes
        .iter()
        .find(|n| n.instance == "micro_loss_sum_1")
        .ok_or_else(|| {
            err(
                g.name.clone(),
                "the micro-batches' loss sum not found".into(),
            )
        })?;
    let first = match sum.inputs.first() {
        Some(Operand::Node(id)) => now[id.index()].clone(),
        _ => None,
    }
    .ok_or_else(|| err(g.name.clone(), "micro-batch 0's loss was not kept".into()))?;
    out.outputs = std::iter::once(Ok(first))
        .chain(split.outputs.iter().skip(1).map(|o| {
            match o {
                Operand::Node(id) => now[id.index()]
                    .clone()
                    .ok_or_else(|| err(node_name(&split, id.index()), "output not kept".into())),
                other => Ok(other.clone()),
            }
        }))
        .collect::<Result<_, _>>()?;
    crate::infer::infer_graph(&mut out)
        .map_err(|e| err(g.name.clone(), format!("rebatched to 1/{pieces}: {e}")))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mlp() -> Graph {
        let mut g = shardc_ir::text::parse_graph(
            &crate::pipeline::stages::tests::MLP.replace("ReduceMean", "ReduceMax"),
            "mlp.ir",
        )
        .unwrap();
        crate::infer::infer_graph(&mut g).unwrap();
        g
    }

    #[test]
    fn micro_batches_clone_the_forward_and_average_the_loss() {
        let g = crate::pipeline::stages::tests::mlp();
        let m = micro_batch(&g, 4, &[]).unwrap();
        crate::verify::verify(&m).unwrap();
        for k in 0..4 {
            let inst = format!("matmul_micro{k}");
            let n = &m.nodes[m.node_by_instance(&inst).unwrap().index()];
            assert_eq!(n.attrs.get(MICRO_ATTR), Some(&Attr::Int(k as i64)));
            assert!(
                matches!(&n.ty, Type::Tensor(t) if t.shape == [4, 16]),
                "{:?}",
                n.ty
            );
        }
        let Some(Operand::Node(l)) = m.loss() else {
            panic!("no loss")
        };
        assert_eq!(m.nodes[l.index()].instance, "micro_loss_mean");
    }

    #[test]
    fn one_micro_batch_is_the_graph_at_a_smaller_batch() {
        let g = crate::pipeline::stages::tests::mlp();
        let one = one_micro_batch(&g, 4).unwrap();
        crate::verify::verify(&one).unwrap();
        assert_eq!(one.nodes.len(), g.nodes.len());
        for (a, b) in g.nodes.iter().zip(&one.nodes) {
            assert_eq!((a.op, &a.instance), (b.op, &b.instance));
            assert_eq!(b.attrs.get(MICRO_ATTR), None);
            let (Type::Tensor(ta), Type::Tensor(tb)) = (&a.ty, &b.ty) else {
                continue;
            };
            if ta.shape.first() == Some(&16) {
                assert_eq!(tb.shape[0], 4, "{}", b.instance);
            }
        }
        assert_eq!(one.params[0].ty.shape[0] * 4, g.params[0].ty.shape[0]);
        let e = one_micro_batch(&g, 3).unwrap_err().to_string();
        assert!(e.contains("micro_size 3"), "{e}");
    }

    #[test]
    fn a_loss_that_is_no_batch_mean_or_sum_is_an_error_naming_it() {
        let e = micro_batch(&mlp(), 2, &[]).unwrap_err().to_string();
        assert!(
            e.contains("`reduce_mean`") && e.contains("ReduceMax") && e.contains("mean or a sum"),
            "{e}"
        );
        let g = crate::pipeline::stages::tests::mlp();
        let e = micro_batch(&g, 3, &[]).unwrap_err().to_string();
        assert!(e.contains("`x`") && e.contains("micro_size 3"), "{e}");
    }
}
