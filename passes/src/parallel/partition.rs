//! Partition: one graph per rank.
//!
//! Every parameter becomes its rank's block (a weight's initializer becomes an
//! [`Init::Block`] of the logical initializer, so the blocks of all ranks assemble to the
//! single-device weight); every op runs on its local blocks; wherever a value's layout differs
//! from the one its user needs, the [`plan`]'s collectives and slices are inserted with this
//! rank's concrete groups (`rank_list`, `group_ranks`, `group` = size and a hash of the
//! list). Every returned value is made whole on every rank (the loss first).
//!
//! Inserted ops are named for why they exist: `forward_op_<producer>_*` completes an op's own
//! partial result, `mirror_grad_<weight>_*` sums a weight's gradient over the devices that saw
//! different parts of the batch, `redistribution_op_<producer>_<user>_*` converts between two
//! layouts; each carries a comment naming the edge and the rule.

use super::redistribute::{group, plan, Plan, Step};
use super::simplify::simplify;
use super::strategy::{Assignment, Decision};
use super::{ParallelError, ParallelOptions};
use crate::infer;
use shardc_ir::{
    Attr, Attrs, Const, Graph, Init, Node, NodeId, OpClass, OpKind, Operand, Param, ParamKind,
    TensorLayout, TensorType,
};

/// The group name MindSpore prints: the size, a dash, and a hash of the rank list.
pub fn group_name(ranks: &[usize]) -> String {
    // FNV-1a over the decimal rank list: stable across runs and platforms.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in ranks
        .iter()
        .map(|r| r.to_string())
        .collect::<Vec<_>>()
        .join("-")
        .bytes()
    {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{}-{}", ranks.len(), h >> 1)
}

fn comm_attrs(ranks: &[usize]) -> Attrs {
    let list: Vec<i64> = ranks.iter().map(|&r| r as i64).collect();
    Attrs::new()
        .with("group", Attr::Str(group_name(ranks)))
        .with("rank_list", Attr::ints(&list))
        .with(
            "group_ranks",
            Attr::Str(
                ranks
                    .iter()
                    .map(|r| r.to_string())
                    .collect::<Vec<_>>()
                    .join("-"),
            ),
        )
}

fn shape_const(s: &[usize]) -> Operand {
    Operand::Const(Const::Ints(s.iter().map(|&x| x as i64).collect()))
}

/// Why a redistribution exists (for its name and comment).
struct Edge {
    producer: String,
    user: String,
    input: usize,
    /// The weight whose gradient this is, when the user is that weight's optimizer update.
    mirror_of: Option<String>,
}

/// Plans by (source layout, target layout, element bytes): a plan does not depend on the
/// rank, so every rank's graph reuses it.
pub type PlanCache = std::collections::HashMap<(TensorLayout, TensorLayout, usize), Plan>;

struct RankBuilder<'a> {
    cache: &'a mut PlanCache,
    g: &'a Graph,
    a: &'a Assignment,
    opts: &'a ParallelOptions,
    rank: usize,
    out: Graph,
    /// Per logical node: its value in the rank graph.
    values: Vec<Option<Operand>>,
    counter: usize,
    /// The scope of the logical node being partitioned (inserted ops take it).
    scope: String,
    /// Redistributions already made: (logical operand, target layout) -> value. A value two
    /// users need in the same layout is converted once.
    converted: Vec<(Operand, TensorLayout, Operand)>,
}

impl RankBuilder<'_> {
    fn emit(&mut self, mut node: Node) -> Result<Operand, ParallelError> {
        let ty = infer::infer_node(&self.out, &node).map_err(|e| ParallelError::Partition {
            rank: self.rank,
            instance: node.instance.clone(),
            reason: e.to_string(),
        })?;
        node.ty = ty;
        Ok(Operand::Node(self.out.push_node(node)))
    }

    fn map_operand(&self, o: &Operand) -> Operand {
        match o {
            Operand::Node(n) => self.values[n.index()].clone().expect("earlier node mapped"),
            other => other.clone(),
        }
    }

    /// The layout of a logical operand.
    fn layout(&self, o: &Operand) -> Option<TensorLayout> {
        match o {
            Operand::Param(p) => Some(self.a.param_layouts[p.index()].clone()),
            Operand::Node(n) => {
                let node = self.g.node(*n);
                if node.op == OpKind::TupleGetItem {
                    let Some(Operand::Node(src)) = node.inputs.first() else {
                        return None;
                    };
                    let idx = node.inputs.get(1)?.as_const()?.as_int()? as usize;
                    self.decision(*src)?.sharding.outputs.get(idx).cloned()
                } else {
                    self.decision(*n)?.sharding.outputs.first().cloned()
                }
            }
            Operand::Const(_) => None,
        }
    }

    fn decision(&self, n: NodeId) -> Option<&Decision> {
        self.a.decisions[n.index()].as_ref()
    }

    fn producer_name(&self, o: &Operand) -> String {
        match o {
            Operand::Param(p) => self.g.param(*p).name.clone(),
            Operand::Node(n) => {
                let node = self.g.node(*n);
                if node.op == OpKind::TupleGetItem {
                    if let Some(Operand::Node(src)) = node.inputs.first() {
                        return self.g.node(*src).instance.clone();
                    }
                }
                node.instance.clone()
            }
            Operand::Const(_) => String::new(),
        }
    }

    fn redistribute(
        &mut self,
        x: Operand,
        from: &TensorLayout,
        to: &TensorLayout,
        dtype_bytes: usize,
        edge: &Edge,
    ) -> Result<Operand, ParallelError> {
        let key = (from.clone(), to.clone(), dtype_bytes);
        let p = match self.cache.get(&key) {
            Some(p) => p.clone(),
            None => {
                let direct = plan(from, to, dtype_bytes, self.opts.enable_alltoall);
                let p = simplify(direct, &from.slice_shape(), dtype_bytes);
                self.cache.insert(key, p.clone());
                p
            }
        };
        let mut x = x;
        let edge_text = format!(
            "edge: {} -> {} input {}: {} -> {}",
            edge.producer, edge.user, edge.input, from, to
        );
        for (k, step) in p.steps.iter().enumerate() {
            self.counter += 1;
            let c = self.counter;
            let space = match step {
                Step::AllReduce { space, .. }
                | Step::ReduceScatter { space, .. }
                | Step::AllGather { space, .. }
                | Step::Slice { space, .. }
                | Step::AllToAll { space, .. } => *space,
            };
            let primes = &p.spaces[space];
            let before: Vec<usize> = if k == 0 {
                self.out_shape(&x)
            } else {
                p.shapes[k - 1].clone()
            };
            let completes = matches!(step, Step::AllReduce { .. } | Step::ReduceScatter { .. });
            let name = |what: &str| -> String {
                if completes {
                    match &edge.mirror_of {
                        Some(w) => format!("mirror_grad_{w}_{what}{c}"),
                        None => format!("forward_op_{}_{what}{c}", edge.producer),
                    }
                } else {
                    format!(
                        "redistribution_op_{}_{}_{what}{c}",
                        edge.producer, edge.user
                    )
                }
            };
            let (node, group_size, rule) = match step {
                Step::AllReduce { axes, op, .. } => {
                    let (ranks, _) = group(primes, axes, self.rank);
                    let mut n = Node::new(OpKind::AllReduce, vec![x.clone()]);
                    n.attrs = comm_attrs(&ranks)
                        .with("op", Attr::Str(op.name().into()))
                        .with("fusion", Attr::Int(0));
                    n.instance = name("AllReduce");
                    (
                        n,
                        ranks.len(),
                        "the value is partial over these devices (a split contraction): sum the terms",
                    )
                }
                Step::ReduceScatter { dim, axes, op, .. } => {
                    let (ranks, _) = group(primes, axes, self.rank);
                    let mut n = Node::new(OpKind::ReduceScatter, vec![x.clone()]);
                    n.attrs = comm_attrs(&ranks)
                        .with("op", Attr::Str(op.name().into()))
                        .with("axis", Attr::Int(*dim as i64));
                    n.instance = name("ReduceScatter");
                    (
                        n,
                        ranks.len(),
                        "partial over the devices that the user splits this dimension by: reduce and keep one's own block",
                    )
                }
                Step::AllGather { dim, axes, .. } => {
                    let (ranks, _) = group(primes, axes, self.rank);
                    let mut n = Node::new(OpKind::AllGather, vec![x.clone()]);
                    n.attrs = comm_attrs(&ranks).with("axis", Attr::Int(*dim as i64));
                    n.instance = name("AllGather");
                    (
                        n,
                        ranks.len(),
                        "the user needs this dimension less split: gather the blocks",
                    )
                }
                Step::AllToAll {
                    split_dim,
                    concat_dim,
                    axes,
                    ..
                } => {
                    let (ranks, _) = group(primes, axes, self.rank);
                    let mut n = Node::new(OpKind::AllToAll, vec![x.clone()]);
                    n.attrs = comm_attrs(&ranks)
                        .with("split_dim", Attr::Int(*split_dim as i64))
                        .with("concat_dim", Attr::Int(*concat_dim as i64))
                        .with("split_count", Attr::Int(ranks.len() as i64));
                    n.instance = name("AlltoAll");
                    (
                        n,
                        ranks.len(),
                        "the split moves from one dimension to another: exchange blocks",
                    )
                }
                Step::Slice { dim, axes, .. } => {
                    let (ranks, own) = group(primes, axes, self.rank);
                    let parts = ranks.len();
                    let sub = before[*dim] / parts;
                    let begin: Vec<i64> = (0..before.len())
                        .map(|d| if d == *dim { (own * sub) as i64 } else { 0 })
                        .collect();
                    let end: Vec<i64> = (0..before.len())
                        .map(|d| {
                            if d == *dim {
                                ((own + 1) * sub) as i64
                            } else {
                                before[d] as i64
                            }
                        })
                        .collect();
                    let n = Node::new(
                        OpKind::StridedSlice,
                        vec![
                            x.clone(),
                            Operand::Const(Const::Ints(begin)),
                            Operand::Const(Const::Ints(end)),
                            Operand::Const(Const::Ints(vec![1; before.len()])),
                        ],
                    );
                    let mut n = n;
                    n.instance = name("StridedSlice");
                    (
                        n,
                        1,
                        "the user needs this dimension more split: keep one's own block (no communication)",
                    )
                }
            };
            let mut node = node;
            if matches!(step, Step::Slice { .. }) || group_size > 1 {
                node.comments.push(edge_text.clone());
                node.comments.push(format!("rule: {rule}"));
                node.scope = self.scope.clone();
                x = self.emit(node)?;
                if completes && edge.mirror_of.is_some() && !self.opts.gradients_mean {
                    let mut m = Node::new(
                        OpKind::Mul,
                        vec![x, Operand::Const(Const::Float(group_size as f64))],
                    );
                    m.instance = format!("mirror_grad_sum_{c}");
                    m.comments.push(
                        "gradients_mean is false: the sum of the replicas' gradients, each of its own local-mean loss (MindSpore's convention)"
                            .into(),
                    );
                    m.scope = self.scope.clone();
                    x = self.emit(m)?;
                }
            }
        }
        Ok(x)
    }

    fn out_shape(&self, x: &Operand) -> Vec<usize> {
        self.out
            .operand_tensor_type(x)
            .map(|t| t.shape.clone())
            .unwrap_or_default()
    }
}

fn localize(node: &mut Node, d: &Decision, rank: usize) {
    let out_local = d
        .sharding
        .outputs
        .first()
        .map(TensorLayout::slice_shape)
        .unwrap_or_default();
    match node.op {
        OpKind::Reshape | OpKind::BroadcastTo | OpKind::StridedSliceGrad
            if node.inputs.len() > 1 =>
        {
            node.inputs[1] = shape_const(&out_local);
        }
        OpKind::Conv2D | OpKind::Conv2DBackpropFilter | OpKind::Conv2DBackpropInput => {
            // `out_channel` counts the local output channels of the convolution.
            let local = match node.op {
                OpKind::Conv2D => out_local.get(1).copied(),
                OpKind::Conv2DBackpropFilter => out_local.first().copied(),
                _ => d
                    .sharding
                    .inputs
                    .first()
                    .cloned()
                    .flatten()
                    .and_then(|l| l.slice_shape().get(1).copied()),
            };
            if let Some(c) = local {
                node.attrs.set("out_channel", Attr::Int(c as i64));
            }
            if node.op != OpKind::Conv2D && node.inputs.len() > 2 {
                node.inputs[2] = shape_const(&out_local);
            }
        }
        OpKind::Dropout => {
            if let Some(l) = d.sharding.outputs.first() {
                if l.splits().iter().any(|&s| s > 1) {
                    let g: Vec<i64> = l.tensor_shape.iter().map(|&x| x as i64).collect();
                    let off: Vec<i64> = l.block(rank).iter().map(|r| r.start as i64).collect();
                    node.attrs.set("global_shape", Attr::ints(&g));
                    node.attrs.set("offset", Attr::ints(&off));
                }
            }
        }
        _ => {}
    }
    // Full-range bounds of a split dimension shrink to the local size.
    let bounds = match node.op {
        OpKind::StridedSlice => Some((1, 2, d.sharding.inputs.first().cloned().flatten())),
        OpKind::StridedSliceGrad => Some((2, 3, d.sharding.outputs.first().cloned())),
        _ => None,
    };
    if let Some((bi, ei, Some(full))) = bounds {
        let splits = full.splits();
        let local = full.slice_shape();
        if let Some(Operand::Const(Const::Ints(end))) = node.inputs.get(ei).cloned() {
            let end: Vec<i64> = end
                .iter()
                .enumerate()
                .map(|(k, &e)| {
                    if splits.get(k).copied().unwrap_or(1) > 1 {
                        local[k] as i64
                    } else {
                        e
                    }
                })
                .collect();
            node.inputs[ei] = Operand::Const(Const::Ints(end));
        }
        debug_assert!(bi < ei);
    }
}

/// The graph of one rank.
pub fn rank_graph(
    g: &Graph,
    a: &Assignment,
    opts: &ParallelOptions,
    rank: usize,
) -> Result<Graph, ParallelError> {
    rank_graph_with(g, a, opts, rank, &mut PlanCache::new())
}

/// As [`rank_graph`], reusing (and filling) `cache`.
pub fn rank_graph_with(
    g: &Graph,
    a: &Assignment,
    opts: &ParallelOptions,
    rank: usize,
    cache: &mut PlanCache,
) -> Result<Graph, ParallelError> {
    let mut out = Graph::new(g.name.clone());
    for (p, l) in g.params.iter().zip(&a.param_layouts) {
        let local = TensorType::new(p.ty.dtype, l.slice_shape());
        let kind = match &p.kind {
            ParamKind::Input => ParamKind::Input,
            ParamKind::Weight {
                init,
                requires_grad,
            } => {
                let init = if l.splits().iter().all(|&s| s == 1) {
                    init.clone()
                } else {
                    Init::Block {
                        of: Box::new(init.clone()),
                        global_shape: p.ty.shape.clone(),
                        offset: l.block(rank).iter().map(|r| r.start).collect(),
                    }
                };
                ParamKind::Weight {
                    init,
                    requires_grad: *requires_grad,
                }
            }
        };
        out.add_param(Param {
            name: p.name.clone(),
            ty: local,
            kind,
        });
    }
    let mut b = RankBuilder {
        cache,
        g,
        a,
        opts,
        rank,
        out,
        values: vec![None; g.nodes.len()],
        counter: 0,
        scope: String::new(),
        converted: Vec::new(),
    };
    for (i, node) in g.nodes.iter().enumerate() {
        b.scope = node.scope.clone();
        if node.op == OpKind::TupleGetItem {
            let mut n = node.clone();
            n.inputs = node.inputs.iter().map(|o| b.map_operand(o)).collect();
            b.values[i] = Some(b.emit(n)?);
            continue;
        }
        let d = b.a.decisions[i]
            .clone()
            .ok_or_else(|| ParallelError::Partition {
                rank,
                instance: node.instance.clone(),
                reason: "the op has no strategy".into(),
            })?;
        let mirror_of = if node.op.class() == OpClass::Optimizer {
            match node.inputs.first() {
                Some(Operand::Param(p)) => Some(g.param(*p).name.clone()),
                _ => None,
            }
        } else {
            None
        };
        let mut inputs = Vec::with_capacity(node.inputs.len());
        for (j, o) in node.inputs.iter().enumerate() {
            let x = b.map_operand(o);
            let (Some(have), Some(want)) = (b.layout(o), d.sharding.inputs[j].clone()) else {
                inputs.push(x);
                continue;
            };
            if super::redistribute::is_noop(&have, &want) {
                inputs.push(x);
                continue;
            }
            if let Some((_, _, v)) = b
                .converted
                .iter()
                .find(|(o2, l, _)| o2 == o && super::redistribute::is_noop(l, &want))
            {
                inputs.push(v.clone());
                continue;
            }
            let bytes = g
                .operand_tensor_type(o)
                .map(|t| t.dtype.size_bytes())
                .unwrap_or(4);
            let edge = Edge {
                producer: b.producer_name(o),
                user: node.instance.clone(),
                input: j,
                mirror_of: if have.is_partial() {
                    mirror_of.clone()
                } else {
                    None
                },
            };
            let v = b.redistribute(x, &have, &want, bytes, &edge)?;
            b.converted.push((o.clone(), want, v.clone()));
            inputs.push(v);
        }
        let mut n = node.clone();
        n.inputs = inputs;
        n.in_strategy = Some(d.sharding.strategy.clone());
        n.comments.push(format!("strategy from: {}", d.source));
        localize(&mut n, &d, rank);
        let mut v = b.emit(n)?;
        if let Some(scale) = d.sharding.scale {
            let mut m = Node::new(OpKind::Mul, vec![v, Operand::Const(Const::Float(scale))]);
            m.instance = format!("forward_op_{}_mean_scale", node.instance);
            m.scope = node.scope.clone();
            m.comments.push(format!(
                "rule: a mean over a split dimension is a term of the global mean after x{scale}"
            ));
            v = b.emit(m)?;
        }
        b.values[i] = Some(v);
    }
    // Every returned value whole on every rank.
    let mut outputs = Vec::with_capacity(g.outputs.len());
    for o in &g.outputs {
        let x = b.map_operand(o);
        let Some(have) = b.layout(o) else {
            outputs.push(x);
            continue;
        };
        let want = TensorLayout::replicated(&have.tensor_shape, opts.device_num);
        if super::redistribute::is_noop(&have, &want) {
            outputs.push(x);
            continue;
        }
        if let Some((_, _, v)) = b
            .converted
            .iter()
            .find(|(o2, l, _)| o2 == o && super::redistribute::is_noop(l, &want))
        {
            outputs.push(v.clone());
            continue;
        }
        let bytes = g
            .operand_tensor_type(o)
            .map(|t| t.dtype.size_bytes())
            .unwrap_or(4);
        let edge = Edge {
            producer: b.producer_name(o),
            user: "Return".into(),
            input: outputs.len(),
            mirror_of: None,
        };
        outputs.push(b.redistribute(x, &have, &want, bytes, &edge)?);
    }
    b.out.outputs = outputs;
    Ok(b.out)
}

/// The graphs of all ranks, `0..device_num`.
pub fn partition(
    g: &Graph,
    a: &Assignment,
    opts: &ParallelOptions,
) -> Result<Vec<Graph>, ParallelError> {
    let mut cache = PlanCache::new();
    (0..opts.device_num)
        .map(|r| rank_graph_with(g, a, opts, r, &mut cache))
        .collect()
}
