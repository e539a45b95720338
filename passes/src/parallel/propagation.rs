//! Breadth-first sharding propagation: annotations and semi-auto defaults first, then every
//! other op from its settled neighbours, forward in program order (an op waits until every
//! input's layout is known) and backward in reverse order (an op waits until every user is
//! settled), each op taking the candidate strategy with the least redistribution cost to its
//! settled neighbours plus its share of the compute (ties to the earlier candidate in
//! [`rules::candidates`]' fixed order). An optimizer update or `Assign` of a weight follows
//! the weight's layout exactly; a weight takes the layout its first settled user needs.
//!
//! `propagate` is the whole breadth-first plan; `propagate_around` settles the rest of a
//! plan whose ops a searcher or the exact completion decided.

use super::assignment::{Assignment, Candidate, Decision, SearchReport, Source};
use super::redistribute::greedy_plan;
use super::roles::{is_generated, like_weight, updated_weight};
use super::rules::{self, candidates, dims_of, sharding, OpSharding, MAX_SPLIT_LOOPS};
use super::{Mode, ParallelError, ParallelOptions};
use shardc_ir::{Graph, Node, NodeId, OpKind, Operand, Strategy, TensorLayout};

/// A plan being settled: the decisions and parameter layouts so far.
struct State<'g> {
    /// Redistribution costs already planned, by (from, to).
    plan_costs: std::cell::RefCell<std::collections::HashMap<u64, f64>>,
    g: &'g Graph,
    opts: &'g ParallelOptions,
    users: Vec<Vec<NodeId>>,
    decisions: Vec<Option<Decision>>,
    params: Vec<Option<TensorLayout>>,
}

impl<'g> State<'g> {
    /// The layout of an operand if known: (layout, settled-by name).
    fn operand_layout(&self, o: &Operand) -> Option<(TensorLayout, String)> {
        match o {
            Operand::Param(p) => self.params[p.index()]
                .clone()
                .map(|l| (l, self.g.param(*p).name.clone())),
            Operand::Node(n) => self.node_output(*n),
            Operand::Const(_) => None,
        }
    }

    fn node_output(&self, n: NodeId) -> Option<(TensorLayout, String)> {
        let node = self.g.node(n);
        if node.op == OpKind::TupleGetItem {
            let src = match node.inputs.first() {
                Some(Operand::Node(s)) => *s,
                _ => return None,
            };
            let idx = node
                .inputs
                .get(1)
                .and_then(Operand::as_const)
                .and_then(|c| c.as_int())
                .unwrap_or(0) as usize;
            let d = self.decisions[src.index()].as_ref()?;
            return d
                .sharding
                .outputs
                .get(idx)
                .cloned()
                .map(|l| (l, self.g.node(src).instance.clone()));
        }
        let d = self.decisions[n.index()].as_ref()?;
        d.sharding
            .outputs
            .first()
            .cloned()
            .map(|l| (l, node.instance.clone()))
    }

    /// Users of node `n`'s value, looking through TupleGetItem: (user, operand index, output
    /// index of `n`).
    fn value_users(&self, n: NodeId) -> Vec<(NodeId, usize, usize)> {
        let mut out = Vec::new();
        for &u in &self.users[n.index()] {
            let un = self.g.node(u);
            if un.op == OpKind::TupleGetItem {
                let idx = un
                    .inputs
                    .get(1)
                    .and_then(Operand::as_const)
                    .and_then(|c| c.as_int())
                    .unwrap_or(0) as usize;
                for &v in &self.users[u.index()] {
                    for (j, o) in self.g.node(v).inputs.iter().enumerate() {
                        if *o == Operand::Node(u) {
                            out.push((v, j, idx));
                        }
                    }
                }
            } else {
                for (j, o) in un.inputs.iter().enumerate() {
                    if *o == Operand::Node(n) {
                        out.push((u, j, 0));
                    }
                }
            }
        }
        out
    }

    fn settle(&mut self, n: NodeId, d: Decision) {
        let node = self.g.node(n);
        for (i, o) in node.inputs.iter().enumerate() {
            if let Operand::Param(p) = o {
                if self.params[p.index()].is_none() {
                    self.params[p.index()] = d.sharding.inputs[i].clone();
                }
            }
        }
        self.decisions[n.index()] = Some(d);
    }

    fn updated_weight(&self, node: &Node) -> Option<usize> {
        updated_weight(self.g, node)
    }

    /// The cost of converting `from` into `to` (f32 elements), memoised.
    fn plan_cost(&self, from: &TensorLayout, to: &TensorLayout) -> f64 {
        use std::hash::{Hash, Hasher};
        // A fixed-key hash of the pair (no clones on the hot path); a collision could only
        // misprice a candidate, never change what a chosen strategy computes.
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (from, to).hash(&mut h);
        let key = h.finish();
        if let Some(&c) = self.plan_costs.borrow().get(&key) {
            return c;
        }
        let c = greedy_plan(from, to, 4, self.opts.enable_alltoall).cost;
        self.plan_costs.borrow_mut().insert(key, c);
        c
    }

    /// Cost of candidate sharding `c` for node `n` against its known neighbours:
    /// (communication, compute, whether an operand must be redistributed to reach `c`).
    fn cost(
        &self,
        n: NodeId,
        c: &OpSharding,
        local_iterations: f64,
        from: &mut Vec<String>,
    ) -> (f64, f64, bool) {
        let node = self.g.node(n);
        let eb = |l: &TensorLayout| -> usize {
            let _ = l;
            4
        };
        let mut cost = 0.0;
        let mut moves_operands = false;
        for (i, o) in node.inputs.iter().enumerate() {
            if let (Some((l, who)), Some(want)) = (self.operand_layout(o), c.inputs[i].as_ref()) {
                let plan = self.plan_cost(&l, want);
                moves_operands |= plan > 0.0;
                cost += plan * eb(&l) as f64 / 4.0;
                if !from.contains(&who) {
                    from.push(who);
                }
            }
        }
        for (u, j, k) in self.value_users(n) {
            // A weight's update whose weight is laid out already will follow it: its layouts
            // are known before it is settled (a gradient pays for reaching its weight's layout).
            let user = self.g.node(u);
            let followed = match &self.decisions[u.index()] {
                Some(_) => None,
                None => self
                    .updated_weight(user)
                    .and_then(|w| self.params[w].as_ref())
                    .map(|l| follow_weight(self.g, user, l)),
            };
            let sharding = self.decisions[u.index()]
                .as_ref()
                .map(|d| &d.sharding)
                .or(followed.as_ref());
            if let Some(sh) = sharding {
                if let (Some(want), Some(have)) = (sh.inputs[j].as_ref(), c.outputs.get(k)) {
                    cost += self.plan_cost(have, want);
                    let who = self.g.node(u).instance.clone();
                    if !from.contains(&who) {
                        from.push(who);
                    }
                }
            }
        }
        // Compute: the local iteration count, in bytes-equivalent (a flop is cheap next to a
        // byte on the wire). The largest local tensor is a floor: an op whose loops are fewer
        // than its elements still writes every element.
        let largest: f64 = c
            .outputs
            .iter()
            .chain(c.inputs.iter().flatten())
            .map(|l| l.slice_shape().iter().product::<usize>() as f64)
            .fold(0.0, f64::max);
        (
            cost,
            local_iterations.max(largest) * COMPUTE_BYTES_PER_ELEMENT,
            moves_operands,
        )
    }

    fn choose(&self, n: NodeId) -> Result<Decision, ParallelError> {
        let node = self.g.node(n);
        let dims = dims_of(self.g, node)?;
        let cands = candidates(self.g, node, &dims, self.opts.device_num, MAX_SPLIT_LOOPS);
        let mut best: Option<(f64, OpSharding, Vec<String>)> = None;
        // In data_parallel every op takes its operands as they come (split along the batch)
        // and only the partial sums of the weight gradients are reduced, as MindSpore's data
        // parallelism does: a candidate that redistributes an operand is taken only when no
        // candidate avoids it.
        let pure_data_parallel = self.opts.mode == Mode::DataParallel;
        let mut best_in_place: Option<(f64, OpSharding, Vec<String>)> = None;
        let mut weighed = Vec::with_capacity(cands.len());
        for splits in cands {
            let Ok(c) =
                rules::sharding_of_loops(self.g, node, &dims, &splits, self.opts.device_num)
            else {
                continue;
            };
            let mut from = Vec::new();
            // Every loop, contractions included: a weight gradient that gathers the batch
            // instead of splitting it does the whole batch's multiply-adds on every device.
            let local_iterations: f64 = dims
                .loop_sizes
                .iter()
                .zip(&splits)
                .map(|(&size, &split)| (size / split.max(1)).max(1) as f64)
                .product();
            let (communication, compute, moves_operands) =
                self.cost(n, &c, local_iterations, &mut from);
            let cost = communication + compute;
            weighed.push(Candidate {
                strategy: c.strategy.clone(),
                out_strategy: c.out_strategy.clone(),
                communication,
                compute,
                memory: 0.0,
            });
            let slot = if pure_data_parallel && !moves_operands {
                &mut best_in_place
            } else {
                &mut best
            };
            if slot.as_ref().is_none_or(|(b, _, _)| cost < *b - 1e-9) {
                *slot = Some((cost, c, from));
            }
        }
        let (cost, sh, from) = best_in_place
            .or(best)
            .ok_or_else(|| ParallelError::NoRule {
                instance: node.instance.clone(),
                op: node.op,
                reason: "no strategy is valid on this device count".into(),
            })?;
        Ok(Decision {
            sharding: sh,
            source: Source::Propagated { from, cost },
            candidates: weighed,
        })
    }
}

impl<'g> State<'g> {
    fn new(g: &'g Graph, opts: &'g ParallelOptions, inputs: Vec<Option<TensorLayout>>) -> Self {
        State {
            plan_costs: Default::default(),
            g,
            opts,
            users: g.users(),
            decisions: vec![None; g.nodes.len()],
            params: inputs,
        }
    }
}

/// Bytes-equivalent cost of one element of local work.
pub const COMPUTE_BYTES_PER_ELEMENT: f64 = 0.25;

/// The layout a whole op keeps when it updates a weight of layout `w`: every operand of the
/// weight's shape in `w`, scalars replicated under the same device matrix.
pub(crate) fn follow_weight(g: &Graph, node: &Node, w: &TensorLayout) -> OpSharding {
    let like = |shape: &[usize]| like_weight(w, shape);
    let inputs: Vec<Option<TensorLayout>> = node
        .inputs
        .iter()
        .map(|o| g.operand_tensor_type(o).map(|t| like(&t.shape)))
        .collect();
    let outputs = node.ty.tensors().iter().map(|t| like(&t.shape)).collect();
    let splits = w.splits();
    let strategy = Strategy(
        inputs
            .iter()
            .flatten()
            .map(|l| {
                if l.tensor_shape.len() == splits.len() {
                    splits.iter().map(|&s| s as i64).collect()
                } else {
                    vec![1; l.tensor_shape.len()]
                }
            })
            .collect(),
    );
    OpSharding {
        strategy,
        loop_splits: splits,
        dev_matrix: w.dev_matrix.clone(),
        inputs,
        outputs,
        scale: None,
        out_strategy: None,
    }
}

/// A user's strategy on an op that writes a weight must keep the weight's layout.
fn check_follows(
    g: &Graph,
    node: &Node,
    weight: &str,
    layout: &TensorLayout,
    follow: &OpSharding,
    opts: &ParallelOptions,
) -> Result<(), ParallelError> {
    let Some(user) = &node.in_strategy else {
        return Ok(());
    };
    let theirs = sharding(g, node, user, opts.device_num)?;
    let same = match (theirs.inputs.first(), follow.inputs.first()) {
        (Some(Some(a)), Some(Some(b))) => super::redistribute::is_noop(a, b),
        _ => true,
    };
    if same {
        return Ok(());
    }
    Err(ParallelError::InvalidStrategy {
        instance: node.instance.clone(),
        op: node.op,
        strategy: user.to_string(),
        reason: format!(
            "it writes weight {weight}, whose slices are laid out as {layout} by the weight's \
             first user; an update must keep that layout: use {} or leave the op unannotated",
            follow.strategy
        ),
    })
}

/// The breadth-first sharding propagation: annotations and semi-auto defaults first, in
/// program order, then every other op from its settled neighbours (see the module
/// documentation).
pub(crate) fn propagate(
    g: &Graph,
    opts: &ParallelOptions,
    inputs: Vec<Option<TensorLayout>>,
    ignored: &[Option<String>],
) -> Result<Assignment, ParallelError> {
    let mut st = State::new(g, opts, inputs);
    // 1./2. Annotations and semi-auto defaults, in program order.
    for i in 0..g.nodes.len() {
        let node = &g.nodes[i];
        if node.op == OpKind::TupleGetItem || st.decisions[i].is_some() {
            continue;
        }
        let (strategy, source) = match &node.in_strategy {
            Some(s) => (s.clone(), Source::User),
            None if opts.mode != Mode::AutoParallel && !is_generated(node) => (
                rules::default_strategy(g, node, opts.device_num)?,
                match ignored.get(i) {
                    Some(Some(annotation)) => Source::AnnotationIgnored {
                        annotation: annotation.clone(),
                    },
                    _ => Source::SemiAutoDefault,
                },
            ),
            None => continue,
        };
        if st.updated_weight(node).is_some() {
            // Settled when the weight's layout is known (it follows the weight).
            continue;
        }
        let sh = sharding(g, node, &strategy, opts.device_num)?;
        st.settle(
            NodeId(i as u32),
            Decision {
                sharding: sh,
                source,
                candidates: Vec::new(),
            },
        );
    }
    finish(st, None)
}

/// The plan that keeps `settled` (each op's decision, settled in order) and settles every op
/// still open as [`propagate`] does: weight updates follow their weights, the rest propagates
/// from its settled neighbours; `report` is the search's that decided `settled`.
pub(crate) fn propagate_around(
    g: &Graph,
    opts: &ParallelOptions,
    inputs: Vec<Option<TensorLayout>>,
    settled: impl IntoIterator<Item = (NodeId, Decision)>,
    report: Option<SearchReport>,
) -> Result<Assignment, ParallelError> {
    let mut st = State::new(g, opts, inputs);
    for (n, d) in settled {
        st.settle(n, d);
    }
    finish(st, report)
}

/// Settles every op still open: weight updates follow their weights, the rest propagates
/// from its settled neighbours; then every parameter without a layout stays whole.
fn finish(mut st: State<'_>, report: Option<SearchReport>) -> Result<Assignment, ParallelError> {
    let (g, opts) = (st.g, st.opts);
    let n = g.nodes.len();
    // 3./4. Propagation.
    loop {
        let mut changed = false;
        for i in 0..n {
            if st.decisions[i].is_some() || g.nodes[i].op == OpKind::TupleGetItem {
                continue;
            }
            let node = &g.nodes[i];
            if let Some(w) = st.updated_weight(node) {
                if let Some(l) = st.params[w].clone() {
                    let sh = follow_weight(g, node, &l);
                    check_follows(g, node, &g.params[w].name, &l, &sh, opts)?;
                    st.settle(
                        NodeId(i as u32),
                        Decision {
                            sharding: sh,
                            source: Source::FollowsWeight(g.params[w].name.clone()),
                            candidates: Vec::new(),
                        },
                    );
                    changed = true;
                }
                continue;
            }
            let mut known = 0;
            let mut all = true;
            for o in &node.inputs {
                match o {
                    Operand::Const(_) => {}
                    Operand::Param(p)
                        if g.param(*p).is_weight() && st.params[p.index()].is_none() => {}
                    _ => {
                        if st.operand_layout(o).is_some() {
                            known += 1;
                        } else {
                            all = false;
                        }
                    }
                }
            }
            if all && known > 0 {
                let d = st.choose(NodeId(i as u32))?;
                st.settle(NodeId(i as u32), d);
                changed = true;
            }
        }
        for i in (0..n).rev() {
            if st.decisions[i].is_some() || g.nodes[i].op == OpKind::TupleGetItem {
                continue;
            }
            if st.updated_weight(&g.nodes[i]).is_some() {
                continue;
            }
            let users = st.value_users(NodeId(i as u32));
            if !users.is_empty()
                && users
                    .iter()
                    .all(|(u, _, _)| st.decisions[u.index()].is_some())
            {
                let d = st.choose(NodeId(i as u32))?;
                st.settle(NodeId(i as u32), d);
                changed = true;
            }
        }
        if changed {
            continue;
        }
        // Nothing is ready: settle the first unsettled op with what is known.
        let Some(i) =
            (0..n).find(|&i| st.decisions[i].is_none() && g.nodes[i].op != OpKind::TupleGetItem)
        else {
            break;
        };
        let node = &g.nodes[i];
        let d = if let Some(w) = st.updated_weight(node) {
            // The weight has no layout yet: it stays whole.
            let l = TensorLayout::replicated(&g.params[w].ty.shape, opts.device_num);
            st.params[w] = Some(l.clone());
            Decision {
                sharding: follow_weight(g, node, &l),
                source: Source::FollowsWeight(g.params[w].name.clone()),
                candidates: Vec::new(),
            }
        } else {
            let mut d = st.choose(NodeId(i as u32))?;
            if matches!(&d.source, Source::Propagated { from, .. } if from.is_empty()) {
                d.source = Source::Unconstrained;
            }
            d
        };
        st.settle(NodeId(i as u32), d);
    }
    let param_layouts = st
        .params
        .into_iter()
        .zip(&g.params)
        .map(|(l, p)| l.unwrap_or_else(|| TensorLayout::replicated(&p.ty.shape, opts.device_num)))
        .collect();
    Ok(Assignment {
        decisions: st.decisions,
        param_layouts,
        search: report,
        optimizer_shards: Vec::new(),
    })
}
