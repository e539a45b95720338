//! Synchronised BatchNorm (MindSpore's SyncBatchNorm design): before strategies are assigned,
//! every training-mode `BatchNorm` / `BatchNormGrad` of a graph compiled for several devices is
//! replaced by a pair of ops whose batch and spatial loops may be split:
//!
//! - `BatchNorm(x, scale, bias, mean, variance)` becomes `BNTrainingReduce(x)` (per-channel
//!   `sum`, `square_sum`: partial sums over a split batch, completed by one AllReduce) and
//!   `BNTrainingUpdate(x, sum, square_sum, scale, bias)` (elementwise given the sums; attr
//!   `count` the GLOBAL number of elements per channel), the same 5-tuple as BatchNorm's;
//! - `BatchNormGrad(dy, x, scale, saved_mean, saved_rstd)` becomes
//!   `BNTrainingUpdateGrad(dy, x, saved_mean, saved_rstd)` (`dscale`, `dbias`: partial sums)
//!   and `BNTrainingReduceGrad(dy, x, dscale, dbias, scale, saved_mean, saved_rstd)` (dx).
//!
//! So a batch-split BatchNorm computes the global batch statistics with small per-channel
//! AllReduces instead of gathering its activations. Instance names stay readable (`bn1` gives
//! `bn1_reduce`, `bn1_update`) and scopes are kept. A user's BatchNorm annotation
//! `((x), (c), (c), (c), (c))` becomes `((x))` on the reduce and `((x), (c), (c), (c), (c))` on
//! the update; an annotation of another shape leaves the BatchNorm as it is, so that its own
//! rule reports the mistake. A `BatchNormGrad` whose result is used other than through
//! `TupleGetItem` is left as it is too (it stays correct, with gathered activations).

use super::ParallelError;
use crate::infer::infer_node;
use shardc_ir::{Attr, Attrs, Const, Graph, Node, NodeId, OpKind, Operand, Strategy};

/// The graph with every training-mode BatchNorm / BatchNormGrad replaced by the synchronised
/// pairs (types inferred). A graph without them comes back unchanged.
pub fn sync_batch_norm(g: &Graph) -> Result<Graph, ParallelError> {
    use OpKind::*;
    let users = g.users();
    let mut out = Graph {
        name: g.name.clone(),
        params: g.params.clone(),
        nodes: Vec::with_capacity(g.nodes.len()),
        outputs: Vec::new(),
    };
    // Old node -> its operand in the new graph.
    let mut map: Vec<Operand> = Vec::with_capacity(g.nodes.len());
    // Old BatchNormGrad -> the operands of its (dx, dscale, dbias).
    let mut grad_items: std::collections::HashMap<usize, [Operand; 3]> = Default::default();
    for (i, node) in g.nodes.iter().enumerate() {
        let remap = |o: &Operand, map: &[Operand]| match o {
            Operand::Node(n) => map[n.index()].clone(),
            other => other.clone(),
        };
        let inputs: Vec<Operand> = node.inputs.iter().map(|o| remap(o, &map)).collect();
        if node.op == TupleGetItem {
            if let (Some(Operand::Node(t)), Some(k)) = (
                node.inputs.first(),
                node.inputs
                    .get(1)
                    .and_then(Operand::as_const)
                    .and_then(Const::as_int),
            ) {
                if let Some(items) = grad_items.get(&t.index()) {
                    let o = usize::try_from(k)
                        .ok()
                        .and_then(|k| items.get(k))
                        .cloned()
                        .ok_or_else(|| no_rule(node, format!("BatchNormGrad has no item {k}")))?;
                    map.push(o);
                    continue;
                }
            }
        }
        let rewritten = match node.op {
            BatchNorm if is_training(node) => bn_forward(&mut out, node, &inputs)?,
            BatchNormGrad
                if is_training(node)
                    && !g.outputs.contains(&Operand::Node(NodeId(i as u32)))
                    && users[i].iter().all(|u| g.node(*u).op == TupleGetItem) =>
            {
                let items = bn_backward(&mut out, node, &inputs)?;
                grad_items.insert(i, items.clone());
                items[0].clone()
            }
            _ => {
                let mut n = node.clone();
                n.inputs = inputs;
                Operand::Node(out.push_node(n))
            }
        };
        map.push(rewritten);
    }
    out.outputs = g
        .outputs
        .iter()
        .map(|o| match o {
            Operand::Node(n) => map[n.index()].clone(),
            other => other.clone(),
        })
        .collect();
    Ok(out)
}

fn is_training(node: &Node) -> bool {
    node.attrs.bool_or("is_training", true)
}

fn no_rule(node: &Node, reason: String) -> ParallelError {
    ParallelError::NoRule {
        instance: node.instance.clone(),
        op: node.op,
        reason,
    }
}

/// `N·H·W` of the logical `(N, C, ...)` operand `o` of `g`.
fn count_of(g: &Graph, node: &Node, o: &Operand) -> Result<i64, ParallelError> {
    let t = g
        .operand_tensor_type(o)
        .ok_or_else(|| no_rule(node, "x is not a tensor".into()))?;
    if t.shape.len() < 2 {
        return Err(no_rule(
            node,
            format!("x must be (N, C, ...), got shape {:?}", t.shape),
        ));
    }
    let n: usize = t.shape[0] * t.shape[2..].iter().product::<usize>();
    Ok(n as i64)
}

/// Appends `op(inputs)` named `{base}_{suffix}` in `like`'s scope, typed by the shape rules.
fn emit(
    g: &mut Graph,
    like: &Node,
    op: OpKind,
    inputs: Vec<Operand>,
    attrs: Attrs,
    suffix: &str,
) -> Result<Operand, ParallelError> {
    let mut n = Node::new(op, inputs);
    n.attrs = attrs;
    n.name = like.name.clone();
    n.scope = like.scope.clone();
    n.instance = if suffix.is_empty() {
        String::new()
    } else if like.instance.is_empty() {
        format!("{}_{suffix}", like.op.name())
    } else {
        format!("{}_{suffix}", like.instance)
    };
    n.ty = infer_node(g, &n).map_err(|e| no_rule(like, format!("rewriting it: {e}")))?;
    Ok(Operand::Node(g.push_node(n)))
}

fn item(g: &mut Graph, like: &Node, t: &Operand, k: i64) -> Result<Operand, ParallelError> {
    let mut n = Node::new(
        OpKind::TupleGetItem,
        vec![t.clone(), Operand::Const(Const::Int(k))],
    );
    n.name = like.name.clone();
    n.scope = like.scope.clone();
    n.ty = infer_node(g, &n).map_err(|e| no_rule(like, format!("rewriting it: {e}")))?;
    Ok(Operand::Node(g.push_node(n)))
}

/// The annotations of the pair for a BatchNorm annotation, if it has BatchNorm's shape
/// (`None` when there is none; `Err(())` when it is malformed).
#[allow(clippy::result_unit_err)]
fn split_annotation(node: &Node, x_rank: usize) -> Result<Option<(Strategy, Strategy)>, ()> {
    let Some(s) = &node.in_strategy else {
        return Ok(None);
    };
    if s.0.len() != 5 || s.0[0].len() != x_rank || x_rank < 2 {
        return Err(());
    }
    let c = s.0[0][1];
    if s.0[1..].iter().any(|t| t.as_slice() != [c]) {
        return Err(());
    }
    let x = s.0[0].clone();
    Ok(Some((
        Strategy(vec![x.clone()]),
        Strategy(vec![x, vec![c], vec![c], vec![c], vec![c]]),
    )))
}

fn bn_forward(g: &mut Graph, node: &Node, inputs: &[Operand]) -> Result<Operand, ParallelError> {
    let x = inputs[0].clone();
    let x_rank = g.operand_tensor_type(&x).map_or(0, |t| t.shape.len());
    let Ok(annotation) = split_annotation(node, x_rank) else {
        let mut n = node.clone();
        n.inputs = inputs.to_vec();
        return Ok(Operand::Node(g.push_node(n)));
    };
    let count = count_of(g, node, &x)?;
    let reduce = emit(
        g,
        node,
        OpKind::BNTrainingReduce,
        vec![x.clone()],
        Attrs::new(),
        "reduce",
    )?;
    let sum = item(g, node, &reduce, 0)?;
    let square_sum = item(g, node, &reduce, 1)?;
    let attrs = Attrs::new()
        .with("epsilon", Attr::Float(node.attrs.float_or("epsilon", 1e-5)))
        .with("count", Attr::Int(count));
    let update = emit(
        g,
        node,
        OpKind::BNTrainingUpdate,
        vec![x, sum, square_sum, inputs[1].clone(), inputs[2].clone()],
        attrs,
        "update",
    )?;
    if let Some((r, u)) = annotation {
        if let (Operand::Node(rn), Operand::Node(un)) = (&reduce, &update) {
            g.nodes[rn.index()].in_strategy = Some(r);
            g.nodes[un.index()].in_strategy = Some(u);
        }
    }
    Ok(update)
}

fn bn_backward(
    g: &mut Graph,
    node: &Node,
    inputs: &[Operand],
) -> Result<[Operand; 3], ParallelError> {
    let (dy, x, scale, mean, rstd) = (
        inputs[0].clone(),
        inputs[1].clone(),
        inputs[2].clone(),
        inputs[3].clone(),
        inputs[4].clone(),
    );
    let count = count_of(g, node, &x)?;
    let ug = emit(
        g,
        node,
        OpKind::BNTrainingUpdateGrad,
        vec![dy.clone(), x.clone(), mean.clone(), rstd.clone()],
        Attrs::new(),
        "update_grad",
    )?;
    let dscale = item(g, node, &ug, 0)?;
    let dbias = item(g, node, &ug, 1)?;
    let dx = emit(
        g,
        node,
        OpKind::BNTrainingReduceGrad,
        vec![dy, x, dscale.clone(), dbias.clone(), scale, mean, rstd],
        Attrs::new().with("count", Attr::Int(count)),
        "reduce_grad",
    )?;
    Ok([dx, dscale, dbias])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::autodiff::{training_graph, Optimizer};
    use crate::parallel::{partition, strategy, DatasetLayout, Mode, ParallelOptions};
    use shardc_ir::text::parse_graph;

    /// x -> BatchNorm -> ReLU -> mean, training with Momentum.
    fn model(annotation: &str) -> Graph {
        let src = format!(
            "#IR entry      : @Net\n\
%para1_x : <Tensor[Float32], (8, 4, 3, 3)>\n\
%para2_scale : <Ref[Tensor(F32)], (4), ref_key=:scale>  :  has_default  init: ones\n\
%para3_bias : <Ref[Tensor(F32)], (4), ref_key=:bias>  :  has_default  init: zeros\n\
%para4_mean : <Ref[Tensor(F32)], (4), ref_key=:mean>  :  has_default  init: zeros\n\
%para5_var : <Ref[Tensor(F32)], (4), ref_key=:var>  :  has_default  init: ones\n\
subgraph @Net(%para1_x, %para2_scale, %para3_bias, %para4_mean, %para5_var) {{\n\
  %1(out) = BatchNorm(%para1_x, %para2_scale, %para3_bias, %para4_mean, %para5_var) {{instance name: bn1}} primitive_attrs: {{is_training: true, epsilon: 0.001{annotation}}}\n\
      # scope: (Default/network-Net)\n\
  %2(y) = TupleGetItem(%1, 0)\n\
  %3(r) = ReLU(%2) {{instance name: relu}}\n\
      # scope: (Default/network-Net)\n\
  %4(loss) = ReduceMean(%3, ()) {{instance name: mean}} primitive_attrs: {{keep_dims: false}}\n\
      # scope: (Default/network-Net)\n\
  Return(%4)\n\
}}\n"
        );
        let mut g = parse_graph(&src, "model.ir").unwrap();
        crate::infer::infer_graph(&mut g).unwrap();
        let opt = Optimizer::Momentum {
            learning_rate: 0.1,
            momentum: 0.9,
            use_nesterov: false,
        };
        training_graph(&g, &opt).unwrap()
    }

    fn ops(g: &Graph, op: OpKind) -> Vec<&Node> {
        g.nodes.iter().filter(|n| n.op == op).collect()
    }

    fn opts(mode: Mode) -> ParallelOptions {
        ParallelOptions {
            mode,
            device_num: 2,
            dataset: DatasetLayout::DataParallel,
            gradients_mean: true,
            enable_alltoall: false,
            search: Default::default(),
            parallel_optimizer: None,
        }
    }

    #[test]
    fn batch_norm_and_its_gradient_become_the_pairs() {
        let t = model("");
        assert_eq!(ops(&t, OpKind::BatchNormGrad).len(), 1);
        let s = sync_batch_norm(&t).unwrap();
        crate::verify::verify(&s).unwrap();
        for gone in [OpKind::BatchNorm, OpKind::BatchNormGrad] {
            assert!(ops(&s, gone).is_empty(), "{gone} left");
        }
        let reduce = ops(&s, OpKind::BNTrainingReduce);
        let update = ops(&s, OpKind::BNTrainingUpdate);
        assert_eq!(reduce[0].instance, "bn1_reduce");
        assert_eq!(update[0].instance, "bn1_update");
        assert_eq!(update[0].scope, "Default/network-Net");
        assert_eq!(update[0].attrs.get("count"), Some(&Attr::Int(8 * 3 * 3)));
        assert_eq!(update[0].attrs.float_or("epsilon", 0.0), 1e-3);
        let ug = ops(&s, OpKind::BNTrainingUpdateGrad);
        let rg = ops(&s, OpKind::BNTrainingReduceGrad);
        assert_eq!(ug.len(), 1);
        assert_eq!(rg[0].attrs.get("count"), Some(&Attr::Int(72)));
        assert!(ug[0].scope.starts_with("Gradients"), "{}", ug[0].scope);
        // Idempotent: nothing left to rewrite.
        let again = sync_batch_norm(&s).unwrap();
        assert_eq!(again, s);
        // The text form round-trips the new ops.
        let text = shardc_ir::text::print_graph(&s);
        let mut back = parse_graph(&text, "synced.ir").unwrap();
        crate::infer::infer_graph(&mut back).unwrap();
        assert_eq!(shardc_ir::text::print_graph(&back), text);
    }

    #[test]
    fn shape_rules_name_a_missing_or_bad_count() {
        let s = sync_batch_norm(&model("")).unwrap();
        for op in [OpKind::BNTrainingUpdate, OpKind::BNTrainingReduceGrad] {
            let i = s.nodes.iter().position(|n| n.op == op).unwrap();
            for (count, want) in [(None, "attribute `count` is missing"), (Some(0), "got 0")] {
                let mut n = s.nodes[i].clone();
                match count {
                    None => {
                        n.attrs.remove("count");
                    }
                    Some(c) => n.attrs.set("count", Attr::Int(c)),
                }
                let e = infer_node(&s, &n).unwrap_err().to_string();
                assert!(e.contains(want) && e.contains(&n.instance), "{op}: {e}");
            }
        }
        // A per-channel operand of the wrong length.
        let i = s
            .nodes
            .iter()
            .position(|n| n.op == OpKind::BNTrainingUpdate)
            .unwrap();
        let mut n = s.nodes[i].clone();
        n.inputs[1] = n.inputs[0].clone();
        let e = infer_node(&s, &n).unwrap_err().to_string();
        assert!(e.contains("sum"), "{e}");
    }

    #[test]
    fn data_parallel_needs_per_channel_all_reduces_only() {
        let s = sync_batch_norm(&model("")).unwrap();
        let o = opts(Mode::DataParallel);
        let a = strategy::assign(&s, &o).unwrap();
        let rg = partition::rank_graph(&s, &a, &o, 1).unwrap();
        crate::verify::verify(&rg).unwrap();
        assert!(ops(&rg, OpKind::AllGather).is_empty());
        // No BatchNorm input is sliced back from a gathered batch.
        for n in ops(&rg, OpKind::StridedSlice) {
            assert!(!n.instance.contains("bn1"), "{}", n.instance);
        }
        // The local batch, the global count.
        let update = ops(&rg, OpKind::BNTrainingUpdate)[0];
        assert_eq!(update.attrs.get("count"), Some(&Attr::Int(72)));
        let x = rg.operand_tensor_type(&update.inputs[0]).unwrap();
        assert_eq!(x.shape, vec![4, 4, 3, 3]);
        // Every AllReduce is of a per-channel vector: the forward sums (2), the backward sums
        // (2), the gradients of scale and bias for their updates (2 mirrors), and the scalar
        // loss.
        let all_reduces = ops(&rg, OpKind::AllReduce);
        assert!(!all_reduces.is_empty());
        for n in &all_reduces {
            let t = n.ty.tensors()[0].clone();
            assert!(t.shape == vec![4] || t.shape.is_empty(), "{:?}", t.shape);
        }
        let channel = all_reduces
            .iter()
            .filter(|n| n.ty.tensors()[0].shape == vec![4])
            .count();
        assert_eq!(channel, 6, "two forward and two backward sums, two mirrors");
        let mirrors = all_reduces
            .iter()
            .filter(|n| n.instance.starts_with("mirror_grad_"))
            .count();
        assert_eq!(mirrors, 2);
    }

    #[test]
    fn a_batch_norm_annotation_is_carried_and_a_malformed_one_kept() {
        let s =
            sync_batch_norm(&model(", in_strategy: ((2, 1, 1, 1), (1), (1), (1), (1))")).unwrap();
        let reduce = ops(&s, OpKind::BNTrainingReduce)[0];
        let update = ops(&s, OpKind::BNTrainingUpdate)[0];
        assert_eq!(
            reduce.in_strategy.as_ref().unwrap().to_string(),
            "((2, 1, 1, 1))"
        );
        assert_eq!(
            update.in_strategy.as_ref().unwrap().to_string(),
            "((2, 1, 1, 1), (1), (1), (1), (1))"
        );
        let o = opts(Mode::SemiAutoParallel);
        strategy::assign(&s, &o).unwrap();
        // Scale split unlike the channel: BatchNorm stays, and its rule names the mistake.
        let s =
            sync_batch_norm(&model(", in_strategy: ((1, 2, 1, 1), (1), (2), (2), (2))")).unwrap();
        assert_eq!(ops(&s, OpKind::BatchNorm).len(), 1);
        let e = strategy::assign(&s, &o).unwrap_err().to_string();
        assert!(
            e.contains("BatchNorm 'bn1'") && e.contains("split alike"),
            "{e}"
        );
    }
}
