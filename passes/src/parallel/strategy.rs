//! Strategy assignment: every op of the training graph gets a strategy, and every parameter
//! (data input or weight) a layout.
//!
//! Sources, in order of authority:
//! 1. the user's annotation (`in_strategy`);
//! 2. in `semi_auto_parallel` (and `data_parallel`), the default for unannotated forward ops:
//!    split the batch ([`rules::default_strategy`]);
//! 3. an optimizer update or `Assign` of a weight follows the weight's layout exactly;
//! 4. **sharding propagation** for everything else (the backward pass, and in
//!    `auto_parallel` every unannotated op): from the settled ops outward, forward in program
//!    order (an op waits until every input's layout is known) and backward in reverse order
//!    (an op waits until every user is settled), each op takes the candidate strategy with the
//!    least redistribution cost to its settled neighbours plus its share of the compute; ties
//!    go to the earlier candidate in [`rules::candidates`]' fixed order.
//!
//! A weight takes the layout its first settled user needs; a data input the layout of the
//! `dataset_strategy`. Every decision is recorded with its source and the costs of the
//! candidates that were weighed, for the dumps and `shardc explain`.

use super::redistribute::greedy_plan;
use super::rules::{self, candidates, dims_of, sharding, OpSharding};
use super::search::{self, problem::Problem, SearchReport};
use super::{DatasetLayout, Mode, ParallelError, ParallelOptions, SearchMode};
use shardc_ir::{
    Graph, Node, NodeId, OpClass, OpKind, Operand, ParamKind, ReduceOp, Strategy, TensorLayout,
};

/// Where an op's strategy came from.
#[derive(Clone, Debug, PartialEq)]
pub enum Source {
    /// The user's `in_strategy`.
    User,
    /// The semi-auto default for an unannotated op (split the batch).
    SemiAutoDefault,
    /// An optimizer update or Assign follows the layout of the weight it updates.
    FollowsWeight(String),
    /// A searcher chose it ([`super::search`]).
    Searched {
        /// The searcher (`recursive_programming`, ...).
        searcher: &'static str,
        /// The op's own predicted seconds: compute plus the communication it takes part in.
        seconds: f64,
    },
    /// Sharding propagation completed the plan around the fixed ops by solving the cost
    /// graph (see [`assign`]): the op's choice is part of the least predicted step.
    Completed {
        /// Whether the solver proved the whole plan optimal under the cost model.
        exact: bool,
        /// The op's own predicted seconds: compute plus the communication it takes part in.
        seconds: f64,
        /// The neighbour and edge that decided it (where its best alternative would cost the
        /// most more), for `shardc explain`.
        decided_by: Option<String>,
    },
    /// Breadth-first sharding propagation chose it: the least cost to the named settled
    /// neighbours.
    Propagated {
        /// The settled neighbours it was weighed against (instance names).
        from: Vec<String>,
        /// Its cost (bytes-equivalent).
        cost: f64,
    },
    /// No neighbour was settled: the default.
    Unconstrained,
    /// `data_parallel` split the batch and ignored the user's `in_strategy` (as MindSpore
    /// does: `shard` takes effect only in `semi_auto_parallel` and `auto_parallel`).
    AnnotationIgnored {
        /// The annotation that was ignored, as written.
        annotation: String,
    },
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::User => f.write_str("user annotation"),
            Source::SemiAutoDefault => f.write_str("semi_auto_parallel default (batch split)"),
            Source::FollowsWeight(w) => write!(f, "follows the layout of weight {w}"),
            Source::Propagated { from, cost } => write!(
                f,
                "sharding propagation from {} at cost {} (bytes-equivalent)",
                if from.is_empty() {
                    "nothing settled".to_string()
                } else {
                    from.join(", ")
                },
                cost.round()
            ),
            Source::Completed {
                exact,
                seconds,
                decided_by,
            } => {
                write!(
                    f,
                    "sharding propagation, solved {} with the fixed ops kept: {:.3} us \
                     predicted (compute + communication)",
                    if *exact {
                        "exactly"
                    } else {
                        "by dynamic programming (not proven optimal)"
                    },
                    seconds * 1e6
                )?;
                match decided_by {
                    Some(d) => write!(f, "; decided by {d}"),
                    None => Ok(()),
                }
            }
            Source::Searched { searcher, seconds } => write!(
                f,
                "searched by {searcher}: {:.3} us predicted (compute + communication)",
                seconds * 1e6
            ),
            Source::Unconstrained => f.write_str("no settled neighbour: batch-split default"),
            Source::AnnotationIgnored { annotation } => write!(
                f,
                "data_parallel default (batch split); the annotation {annotation} was ignored \
                 because parallel_mode is data_parallel (shard takes effect only in \
                 semi_auto_parallel and auto_parallel)"
            ),
        }
    }
}

/// The decision for one op.
#[derive(Clone, Debug)]
pub struct Decision {
    /// The chosen sharding.
    pub sharding: OpSharding,
    /// Where it came from.
    pub source: Source,
    /// The candidates weighed, in the order considered.
    pub candidates: Vec<Candidate>,
}

/// One strategy weighed: by sharding propagation in bytes-equivalent, by a searcher in
/// seconds (compute, communication) and bytes (memory).
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    /// The strategy.
    pub strategy: Strategy,
    /// The out strategy, when it splits a loop no input carries.
    pub out_strategy: Option<Strategy>,
    /// Redistribution to and from the settled neighbours (bytes sent per rank, plus a latency
    /// term per collective).
    pub communication: f64,
    /// The op's own work on one device ([`COMPUTE_BYTES_PER_ELEMENT`] per element).
    pub compute: f64,
    /// Bytes it keeps on one device (searched ops only; propagation leaves 0).
    pub memory: f64,
}

impl Candidate {
    /// Communication plus compute.
    pub fn total(&self) -> f64 {
        self.communication + self.compute
    }
}

/// The result of strategy assignment.
#[derive(Clone, Debug)]
pub struct Assignment {
    /// Per node: its decision (`None` for TupleGetItem, which has no strategy of its own).
    pub decisions: Vec<Option<Decision>>,
    /// Per parameter: its layout.
    pub param_layouts: Vec<TensorLayout>,
    /// What the searcher decided, when one ran (`auto_parallel` with a search mode other than
    /// sharding propagation).
    pub search: Option<SearchReport>,
}

impl Assignment {
    /// The layout a logical operand of `g` has under this assignment: a parameter's, a node's
    /// first result's, or the chosen result of a `TupleGetItem`; `None` for a constant or an
    /// op without a decision.
    pub fn operand_layout(&self, g: &Graph, o: &Operand) -> Option<TensorLayout> {
        let decision = |n: NodeId| self.decisions[n.index()].as_ref();
        match o {
            Operand::Param(p) => Some(self.param_layouts[p.index()].clone()),
            Operand::Node(n) => {
                let node = g.node(*n);
                if node.op == OpKind::TupleGetItem {
                    let Some(Operand::Node(src)) = node.inputs.first() else {
                        return None;
                    };
                    let idx = node.inputs.get(1)?.as_const()?.as_int()? as usize;
                    decision(*src)?.sharding.outputs.get(idx).cloned()
                } else {
                    decision(*n)?.sharding.outputs.first().cloned()
                }
            }
            Operand::Const(_) => None,
        }
    }
}

/// Whether `node` was made by autodiff or the optimizer (not written by the user).
pub fn is_generated(node: &Node) -> bool {
    node.scope.starts_with("Gradients") || node.scope.starts_with("Default/optimizer")
}

/// The weight an optimizer update or Assign writes, if its first operand is one.
pub fn updated_weight(g: &Graph, node: &Node) -> Option<usize> {
    if node.op.class() != OpClass::Optimizer && node.op != OpKind::Assign {
        return None;
    }
    match node.inputs.first() {
        Some(Operand::Param(p)) if g.param(*p).is_weight() => Some(p.index()),
        _ => None,
    }
}

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

/// Bytes-equivalent cost of one element of local work.
pub const COMPUTE_BYTES_PER_ELEMENT: f64 = 0.25;
/// Propagation considers splitting at most this many loops of one op.
pub const MAX_SPLIT_LOOPS: usize = 4;

/// The layout an operand of `shape` of a weight's update takes when the weight is laid out as
/// `w`: the same map for the same rank, else replicated under the same device matrix.
pub fn like_weight(w: &TensorLayout, shape: &[usize]) -> TensorLayout {
    if shape.len() == w.tensor_shape.len() {
        TensorLayout {
            tensor_shape: shape.to_vec(),
            partial: Vec::new(),
            partial_op: ReduceOp::Sum,
            ..w.clone()
        }
    } else {
        TensorLayout {
            dev_matrix: w.dev_matrix.clone(),
            tensor_map: vec![-1; shape.len()],
            tensor_shape: shape.to_vec(),
            partial: Vec::new(),
            partial_op: ReduceOp::Sum,
        }
    }
}

/// The layout a whole op keeps when it updates a weight of layout `w`: every operand of the
/// weight's shape in `w`, scalars replicated under the same device matrix.
fn follow_weight(g: &Graph, node: &Node, w: &TensorLayout) -> OpSharding {
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

/// The layout of data input `shape` under the dataset strategy.
fn dataset_layout(
    name: &str,
    shape: &[usize],
    k: usize,
    opts: &ParallelOptions,
) -> Result<TensorLayout, ParallelError> {
    let n = opts.device_num;
    let splits: Vec<usize> = match &opts.dataset {
        DatasetLayout::FullBatch => vec![1; shape.len()],
        DatasetLayout::DataParallel => {
            let mut v = vec![1; shape.len()];
            if let Some(first) = v.first_mut() {
                if shape[0] % n != 0 {
                    return Err(ParallelError::Dataset {
                        input: name.to_string(),
                        reason: format!(
                            "dataset_strategy data_parallel splits dimension 0 of size {} over \
                             {n} devices, which does not divide it (use full_batch or a batch \
                             size divisible by {n})",
                            shape[0]
                        ),
                    });
                }
                *first = n;
            }
            v
        }
        DatasetLayout::Explicit(s) => {
            let row = s.0.get(k).ok_or_else(|| ParallelError::Dataset {
                input: name.to_string(),
                reason: format!(
                    "the dataset strategy {s} has no entry for data input {k} (one tuple per \
                     data input)"
                ),
            })?;
            if row.len() != shape.len() || row.iter().any(|&x| x < 1) {
                return Err(ParallelError::Dataset {
                    input: name.to_string(),
                    reason: format!(
                        "its strategy {row:?} does not fit its shape {shape:?} (one split >= 1 \
                         per dimension)"
                    ),
                });
            }
            row.iter().map(|&x| x as usize).collect()
        }
    };
    let used = splits
        .iter()
        .try_fold(1usize, |acc, &s| acc.checked_mul(s))
        .unwrap_or(0);
    if used == 0 || used > n || n % used != 0 {
        return Err(ParallelError::Dataset {
            input: name.to_string(),
            reason: format!("its splits {splits:?} use {used} devices, which does not divide {n}"),
        });
    }
    for (d, (&s, &size)) in splits.iter().zip(shape).enumerate() {
        if size % s != 0 {
            return Err(ParallelError::Dataset {
                input: name.to_string(),
                reason: format!("dimension {d} of size {size} is not divisible by {s}"),
            });
        }
    }
    let r = shape.len();
    let mut dev = Vec::new();
    if n / used > 1 || r == 0 {
        dev.push(n / used);
    }
    dev.extend(&splits);
    Ok(TensorLayout {
        dev_matrix: dev,
        tensor_map: (0..r).map(|d| (r - 1 - d) as i64).collect(),
        tensor_shape: shape.to_vec(),
        partial: Vec::new(),
        partial_op: ReduceOp::Sum,
    })
}

/// Assigns a strategy to every op of `g` (types inferred) and a layout to every parameter.
///
/// In `data_parallel` every user annotation is ignored (MindSpore applies `shard` only in
/// `semi_auto_parallel` and `auto_parallel`): every forward op splits the batch over all
/// devices, weights stay replicated, and the decision's source says which annotation was
/// ignored ([`Source::AnnotationIgnored`]).
///
/// In `semi_auto_parallel`, and in `auto_parallel` with `sharding_propagation`, the plan is
/// **completed exactly**: the ops the user fixed (annotations; in
/// `semi_auto_parallel` also the batch-split defaults of the forward ops the user wrote) stay
/// as they are, and every other op (the backward pass, the loss's gradient, and in
/// `auto_parallel` the unannotated forward ops) is solved by dynamic programming over the
/// cost graph, so that a backward op takes its forward op's layout where that is cheaper, as
/// MindSpore's bprop of a distributed operator does. The breadth-first propagation is the
/// fallback for cost graphs too large to solve ([`COMPLETION_BUDGET`]) and a baseline: the
/// plan kept is never predicted slower than it (nor, in `auto_parallel`, than the
/// `semi_auto_parallel` plan of the same annotations).
pub fn assign(g: &Graph, opts: &ParallelOptions) -> Result<Assignment, ParallelError> {
    assign_weighed(g, opts, Weighing::Explained)
}

/// Whether an assignment weighs every op's candidates for `shardc explain`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Weighing {
    /// Each op's candidates and the term that decided it are priced (the plan that is kept).
    Explained,
    /// Only the plan (a baseline that a search prices and may discard).
    PlanOnly,
}

/// [`assign`], weighing the candidates for `explain` or not.
pub(crate) fn assign_weighed(
    g: &Graph,
    opts: &ParallelOptions,
    weighing: Weighing,
) -> Result<Assignment, ParallelError> {
    let n = g.nodes.len();
    let ignored: Vec<Option<String>> = if opts.mode == Mode::DataParallel {
        g.nodes
            .iter()
            .map(|node| node.in_strategy.as_ref().map(|s| s.to_string()))
            .collect()
    } else {
        vec![None; n]
    };
    let stripped;
    let g = if ignored.iter().any(Option::is_some) {
        let mut c = g.clone();
        for node in &mut c.nodes {
            node.in_strategy = None;
        }
        stripped = c;
        &stripped
    } else {
        g
    };
    // Data inputs.
    let mut inputs = vec![None; g.params.len()];
    let mut k = 0;
    for (i, p) in g.params.iter().enumerate() {
        if matches!(p.kind, ParamKind::Input) {
            inputs[i] = Some(dataset_layout(&p.name, &p.ty.shape, k, opts)?);
            k += 1;
        }
    }
    match opts.mode {
        Mode::AutoParallel if opts.search.mode != SearchMode::ShardingPropagation => {
            searched(g, opts, inputs)
        }
        Mode::DataParallel => propagate(g, opts, inputs, &ignored),
        _ => {
            let bfs = propagate(g, opts, inputs.clone(), &ignored)?;
            complete(g, opts, inputs, bfs, weighing)
        }
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

/// `auto_parallel` with a searcher: it decides every op but the weight updates (annotations
/// stay fixed); the updates then follow their weights.
fn searched(
    g: &Graph,
    opts: &ParallelOptions,
    inputs: Vec<Option<TensorLayout>>,
) -> Result<Assignment, ParallelError> {
    let mut st = State::new(g, opts, inputs);
    let problem = Problem::new(g, opts, st.params.clone())?;
    let found = search::run(&problem, opts.search.mode)?;
    for (k, (sh, weighed)) in found.shardings.into_iter().zip(found.weighed).enumerate() {
        let own = weighed
            .iter()
            .find(|c| c.strategy == sh.strategy && c.out_strategy == sh.out_strategy)
            .map_or(0.0, |c| c.compute + c.communication);
        let source = if problem.fixed[k].is_some() {
            Source::User
        } else {
            Source::Searched {
                searcher: found.report.searcher,
                seconds: own,
            }
        };
        st.settle(
            problem.ops[k],
            Decision {
                sharding: sh,
                source,
                candidates: weighed,
            },
        );
    }
    finish(st, Some(found.report))
}

/// The breadth-first sharding propagation: annotations and semi-auto defaults first, in
/// program order, then every other op from its settled neighbours (see the module
/// documentation).
fn propagate(
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
    })
}

/// The exact completion solves a cost graph of at most this many entries (candidate pairs of
/// its edges plus candidates of its nodes); a larger one keeps the breadth-first plan, and
/// the report says so.
pub const COMPLETION_BUDGET: usize = 4_000_000;

/// The name sharding propagation reports as its searcher.
const PROPAGATION: &str = "sharding_propagation";

/// Completes a plan exactly: the ops the user fixed stay (annotations; in
/// `semi_auto_parallel` also the batch-split defaults of the forward ops the user wrote), the
/// others are solved by dynamic programming over the cost graph ([`search::dynamic`]). The
/// breadth-first plan `bfs` is the fallback when the cost graph exceeds
/// [`COMPLETION_BUDGET`] and a baseline; in `auto_parallel` so is the `semi_auto_parallel`
/// plan. The plan predicted fastest within the memory limit is kept, and the report says
/// which and why.
fn complete(
    g: &Graph,
    opts: &ParallelOptions,
    inputs: Vec<Option<TensorLayout>>,
    bfs: Assignment,
    weighing: Weighing,
) -> Result<Assignment, ParallelError> {
    let start = std::time::Instant::now();
    let n = opts.device_num;
    let semi_auto = opts.mode == Mode::SemiAutoParallel;
    let problem = Problem::with_fixed(g, opts, inputs.clone(), |node| match &node.in_strategy {
        Some(s) => sharding(g, node, s, n).map(Some),
        None if semi_auto && !is_generated(node) => {
            let s = rules::default_strategy(g, node, n)?;
            sharding(g, node, &s, n).map(Some)
        }
        None => Ok(None),
    })?;
    let limit = opts.search.memory_limit();
    let mut notes = Vec::new();
    let of = |a: &Assignment| -> Option<Vec<OpSharding>> {
        problem
            .ops
            .iter()
            .map(|id| a.decisions[id.index()].as_ref().map(|d| d.sharding.clone()))
            .collect()
    };
    // The exact completion, where the cost graph fits the budget.
    let open = problem.fixed.iter().filter(|f| f.is_none()).count();
    let mut exact_plan: Option<(Vec<OpSharding>, bool, Vec<Vec<OpSharding>>)> = None;
    if open > 0 {
        let cands = problem.all_candidates()?;
        let size: usize = cands.iter().map(Vec::len).sum::<usize>()
            + problem
                .terms
                .iter()
                .map(|t| t.ops().iter().map(|&k| cands[k].len()).product::<usize>())
                .sum::<usize>();
        if size > COMPLETION_BUDGET {
            notes.push(format!(
                "fell back to breadth-first propagation: the cost graph of the {open} open ops \
                 has {size} entries, over the exact completion's budget of {COMPLETION_BUDGET}"
            ));
        } else {
            let cg = problem.cost_graph(&cands);
            match search::dynamic::search(&cg, Some(limit)) {
                Ok(r) => {
                    notes.extend(r.notes);
                    let plan = r
                        .choice
                        .iter()
                        .zip(&cands)
                        .map(|(&c, cs)| cs[c].clone())
                        .collect();
                    exact_plan = Some((plan, r.exact, cands));
                }
                Err(e) => notes.push(format!(
                    "the exact completion found no plan ({e}); breadth-first propagation kept"
                )),
            }
        }
    }
    // The baselines.
    let semi = (opts.mode == Mode::AutoParallel
        && problem.ops.len().saturating_mul(n) <= search::SEMI_AUTO_BASELINE_BUDGET)
        .then(|| {
            let o = ParallelOptions {
                mode: Mode::SemiAutoParallel,
                ..opts.clone()
            };
            assign_weighed(g, &o, Weighing::PlanOnly).ok()
        })
        .flatten();
    enum Kept {
        Exact,
        BreadthFirst,
        SemiAuto,
    }
    let price = |plan: &[OpSharding]| problem.step_seconds(&plan.iter().collect::<Vec<_>>());
    let mut options: Vec<(Kept, Vec<OpSharding>, search::problem::Breakdown)> = Vec::new();
    if let Some((plan, _, _)) = &exact_plan {
        let b = price(plan);
        options.push((Kept::Exact, plan.clone(), b));
    }
    if let Some(plan) = of(&bfs) {
        let b = price(&plan);
        options.push((Kept::BreadthFirst, plan, b));
    }
    if let Some(plan) = semi.as_ref().and_then(of) {
        let b = price(&plan);
        options.push((Kept::SemiAuto, plan, b));
    }
    let fits = options.iter().any(|(_, _, b)| b.memory <= limit);
    if !fits && !options.is_empty() {
        notes.push(format!(
            "no plan fits the memory limit of {limit:.0} bytes per device; the fastest is kept"
        ));
    }
    // The fastest that fits; on a tie the earlier (the exact completion first).
    let best = options
        .iter()
        .enumerate()
        .filter(|(_, (_, _, b))| !fits || b.memory <= limit)
        .min_by(|(i, (_, _, a)), (j, (_, _, b))| {
            let (ta, tb) = (a.seconds(), b.seconds());
            if (ta - tb).abs() <= 1e-12 * ta.abs().max(tb.abs()) {
                i.cmp(j)
            } else {
                ta.total_cmp(&tb)
            }
        })
        .map(|(i, _)| i);
    let Some(best) = best else {
        return Ok(bfs);
    };
    let exact_seconds = options
        .iter()
        .find(|(k, _, _)| matches!(k, Kept::Exact))
        .map(|(_, _, b)| b.seconds());
    let (kept, plan, predicted) = options.swap_remove(best);
    let mut report = SearchReport {
        searcher: PROPAGATION,
        predicted,
        memory_limit: limit,
        exact: false,
        notes,
        search_seconds: 0.0,
        searched_ops: open,
    };
    let describe = |what: &str| match exact_seconds {
        Some(e) => format!(
            "the {what} plan is predicted faster ({:.6} ms) than the exact completion \
             ({:.6} ms, which counts a conversion that several readers share once per reader) \
             and was kept",
            predicted.seconds() * 1e3,
            e * 1e3
        ),
        None => format!("the {what} plan was kept"),
    };
    let mut assignment = match kept {
        Kept::BreadthFirst => {
            if exact_plan.is_some() {
                report.notes.push(describe("breadth-first"));
            }
            bfs
        }
        Kept::SemiAuto => {
            report.notes.push(describe("semi_auto_parallel"));
            semi.expect("the semi-auto plan was priced")
        }
        Kept::Exact => {
            let (_, exact, cands) = exact_plan.expect("the exact plan was priced");
            report.exact = exact;
            let refs: Vec<&OpSharding> = plan.iter().collect();
            let explained = weighing == Weighing::Explained;
            let weighed = search::weigh(&problem, explained.then_some(&cands[..]), &refs);
            let mut st = State::new(g, opts, inputs);
            for (k, (sh, weighed)) in plan.iter().zip(weighed).enumerate() {
                let node = g.node(problem.ops[k]);
                let source = match &problem.fixed[k] {
                    Some(_) if node.in_strategy.is_some() => Source::User,
                    Some(_) => Source::SemiAutoDefault,
                    None => {
                        let own = problem.op_breakdown(k, sh, &refs).seconds();
                        Source::Completed {
                            exact,
                            seconds: own,
                            decided_by: explained
                                .then(|| deciding_term(&problem, k, &cands[k], &refs))
                                .flatten(),
                        }
                    }
                };
                st.settle(
                    problem.ops[k],
                    Decision {
                        sharding: sh.clone(),
                        source,
                        candidates: weighed,
                    },
                );
            }
            finish(st, None)?
        }
    };
    report.search_seconds = start.elapsed().as_secs_f64();
    assignment.search = Some(report);
    Ok(assignment)
}

/// What decided op `k`'s choice in a completed plan: among the terms it takes part in, the
/// one where its best alternative candidate would cost the most more; `None` where the choice
/// is its own compute's (or it had no alternative).
fn deciding_term(
    p: &Problem<'_>,
    k: usize,
    cands: &[OpSharding],
    choice: &[&OpSharding],
) -> Option<String> {
    if cands.len() < 2 || p.ops.len().saturating_mul(cands.len()) > search::EXPLAIN_BUDGET {
        return None;
    }
    let chosen = choice[k];
    let total = |s: &OpSharding| p.op_breakdown(k, s, choice).seconds();
    let runner_up = cands
        .iter()
        .filter(|s| s.strategy != chosen.strategy || s.out_strategy != chosen.out_strategy)
        .min_by(|a, b| total(a).total_cmp(&total(b)))?;
    let with = |s: &OpSharding, t: &search::problem::Term| {
        p.term_seconds(t, |x| if x == k { s } else { choice[x] })
    };
    let (delta, t) = p.op_terms[k]
        .iter()
        .map(|&t| {
            let t = &p.terms[t];
            (with(runner_up, t) - with(chosen, t), t)
        })
        .max_by(|a, b| a.0.total_cmp(&b.0))?;
    let compute = p.compute_seconds(k, runner_up) - p.compute_seconds(k, chosen);
    if delta <= 0.0 || compute > delta {
        return Some(format!(
            "its own compute: the runner-up {} would compute {:.3} us longer",
            runner_up.strategy,
            compute * 1e6
        ));
    }
    use search::problem::Term;
    let edge = match t {
        Term::Flow {
            from,
            out,
            to,
            operand,
            ..
        } => format!(
            "the edge {} result {out} -> {} input {operand}",
            p.name(*from),
            p.name(*to)
        ),
        Term::SharedWeight { first, to, .. } => format!(
            "the weight {} shares with {}",
            if *first == k { "it" } else { p.name(*first) },
            if *to == k { "it" } else { p.name(*to) }
        ),
        Term::IntoWeight { from, first, .. } => match first {
            Some((f, _)) => format!(
                "the gradient {} writes into the weight {} lays out",
                p.name(*from),
                p.name(*f)
            ),
            None => format!("the gradient {} writes into a whole weight", p.name(*from)),
        },
        Term::FromInput { param, .. } => {
            format!("the data input {}", p.g.params[*param].name)
        }
    };
    Some(format!(
        "{edge}: the runner-up {} would spend {:.3} us more there",
        runner_up.strategy,
        delta * 1e6
    ))
}
