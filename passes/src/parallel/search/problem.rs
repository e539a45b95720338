//! The search problem of one training graph: which ops are decided, what each may do, and
//! every cost term between them — the bridge from the IR to a [`CostGraph`].
//!
//! The **searched ops** are every op except `TupleGetItem` (an alias) and the ops that write a
//! weight (optimizer updates, `Assign`), which follow the weight's layout. A weight takes the
//! layout its first searched user (in program order) needs, as [`super::super::strategy`]
//! settles it. The **terms** of the predicted step time are:
//! - each op's compute time ([`super::super::cost::Machine::compute_seconds`]);
//! - [`Term::Flow`]: a result of one op read by another (through `TupleGetItem`), priced as
//!   the redistribution from the producer's result layout to the layout the reader needs;
//! - [`Term::SharedWeight`]: a weight read by an op other than its first user;
//! - [`Term::IntoWeight`]: a value written into a weight by its update (the gradient), which
//!   must arrive in the weight's layout (the gradient AllReduce of data parallelism is this
//!   term);
//! - [`Term::FromInput`]: a data input, whose layout the dataset strategy fixes.
//!
//! The partition converts a value to one placement once, however many readers need it there;
//! the prediction ([`Problem::step_seconds`]) counts such a shared conversion once too, so
//! that its communication is what the ranks run. The searchers' objective
//! ([`Problem::objective_seconds`], the [`CostGraph`]'s total) counts it once per reader: an
//! edge of the cost graph joins two ops, and sharing depends on all the readers at once.
//!
//! Memory per device ([`Problem::memory_bytes`]): the slices of the weights an op is first
//! user of, with their optimizer state and gradient (the parallel optimizer's split counted),
//! and the results the backward pass reads (not those of recomputed nodes, which the backward
//! replays).

pub use super::super::cost::Breakdown;

use super::super::assignment::Candidate;
use super::super::cost::{elem_bytes, CommCost, Machine};
use super::super::optimizer_shard::shard_layout;
use super::super::redistribute::{placement, Placement};
use super::super::roles::{is_generated, like_weight, updated_weight};
use super::super::rules::{self, candidates, dims_of, sharding, OpSharding, MAX_SPLIT_LOOPS};
use super::super::{ParallelError, ParallelOptions};
use super::cost_graph::{CostGraph, SearchEdge, SearchNode};
use crate::ops::{rule, Cost};
use shardc_ir::{Graph, NodeId, OpKind, Operand, TensorLayout};
use std::collections::{HashMap, HashSet};

/// Candidate lists longer than this keep only the strategies that use every device (as
/// MindSpore's `fully_use_devices`), and then at most this many, in [`rules::candidates`]'
/// order.
pub const MAX_CANDIDATES: usize = 64;

/// A term of the predicted step time that joins two searched ops (or one op and a fixed
/// layout).
#[derive(Clone, Debug, PartialEq)]
pub enum Term {
    /// Result `out` of op `from` is operand `operand` of op `to`.
    Flow {
        /// Producer (searched-op index).
        from: usize,
        /// Which result of the producer.
        out: usize,
        /// Reader (searched-op index).
        to: usize,
        /// Which operand of the reader.
        operand: usize,
        /// Bytes per element.
        elem: usize,
    },
    /// A weight whose layout op `first` sets (its operand `first_operand`) is also operand
    /// `operand` of op `to`.
    SharedWeight {
        /// The weight's first user.
        first: usize,
        /// The weight's operand index there.
        first_operand: usize,
        /// Another reader.
        to: usize,
        /// Its operand index.
        operand: usize,
        /// Bytes per element.
        elem: usize,
    },
    /// Result `out` of op `from` is written into a weight (operand of its update) whose
    /// layout op `first` sets (its operand `first_operand`; `None`: no searched op reads the
    /// weight, so it stays replicated). `shape` is the written value's shape.
    IntoWeight {
        /// Producer (searched-op index).
        from: usize,
        /// Which result of the producer.
        out: usize,
        /// The weight's first user and its operand index there.
        first: Option<(usize, usize)>,
        /// The weight's shape.
        weight_shape: Vec<usize>,
        /// The written value's shape.
        shape: Vec<usize>,
        /// Bytes per element.
        elem: usize,
    },
    /// Data input `param` (fixed layout) is operand `operand` of op `to`.
    FromInput {
        /// The parameter index.
        param: usize,
        /// Reader (searched-op index).
        to: usize,
        /// Which operand.
        operand: usize,
        /// Bytes per element.
        elem: usize,
    },
}

impl Term {
    /// The searched ops the term depends on: one or two (sorted, distinct).
    pub fn ops(&self) -> Vec<usize> {
        let mut v = match self {
            Term::Flow { from, to, .. } => vec![*from, *to],
            Term::SharedWeight { first, to, .. } => vec![*first, *to],
            Term::IntoWeight { from, first, .. } => match first {
                Some((f, _)) => vec![*from, *f],
                None => vec![*from],
            },
            Term::FromInput { to, .. } => vec![*to],
        };
        v.sort_unstable();
        v.dedup();
        v
    }
}

/// A value whose conversion readers may share ([`Problem::conversion`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Converted {
    /// Result `.1` of searched op `.0`.
    Result(usize, usize),
    /// The weight that is operand `.1` of its first user, searched op `.0`.
    Weight(usize, usize),
    /// Data input (parameter index).
    Input(usize),
}

/// The search problem of a training graph.
pub struct Problem<'g> {
    /// The graph.
    pub g: &'g Graph,
    /// The options.
    pub opts: &'g ParallelOptions,
    /// Redistribution times.
    pub comm: CommCost,
    /// The searched ops, in program order.
    pub ops: Vec<NodeId>,
    /// Per node: its index among the searched ops.
    pub index_of: Vec<Option<usize>>,
    /// Per searched op: the sharding the search keeps (the user's strategy, or in
    /// `semi_auto_parallel` the default of an op the user wrote); `None` for a searched one.
    pub fixed: Vec<Option<OpSharding>>,
    /// Every term.
    pub terms: Vec<Term>,
    /// Per searched op: the terms it takes part in.
    pub op_terms: Vec<Vec<usize>>,
    /// The data inputs' layouts (by parameter index).
    pub input_layouts: Vec<Option<TensorLayout>>,
    /// Per searched op: (operand, copies, updated copies) of the weights it is first user of;
    /// `copies` counts the weight, its optimizer state and its gradient, `updated copies` the
    /// weight and its state when an optimizer updates it (what the parallel optimizer splits).
    owned_weights: Vec<Vec<(usize, f64, f64)>>,
    /// Per searched op: which results the backward pass reads.
    kept_results: Vec<Vec<usize>>,
    /// Per searched op: FLOPs per loop iteration (2 for a multiply-add) and whether at the
    /// GEMM rate.
    flops_per_iter: Vec<(f64, bool)>,
}

fn const_index(o: Option<&Operand>) -> usize {
    o.and_then(Operand::as_const)
        .and_then(|c| c.as_int())
        .unwrap_or(0) as usize
}

/// What one element of a non-contraction `op` costs relative to an add, at the machine's
/// vector rate (the op's `Cost::Vector` in its rules, `crate::ops`); `None` for a contraction,
/// which runs at the GEMM rate.
pub fn vector_weight(op: OpKind) -> Option<f64> {
    match rule(op).cost {
        Cost::Vector(w) => Some(w),
        Cost::Gemm(_) => None,
    }
}

/// FLOPs of one iteration of `op`'s loops, and whether they run at the GEMM rate (a
/// contraction) or the vector rate (weighted by [`vector_weight`]): the op's cost in its
/// rules (`crate::ops`).
fn flops_per_iteration(g: &Graph, node: &shardc_ir::Node) -> (f64, bool) {
    match rule(node.op).cost {
        Cost::Vector(w) => (w, false),
        Cost::Gemm(flops) => (flops(g, node), true),
    }
}

impl<'g> Problem<'g> {
    /// The problem of `g` (types inferred) under `opts`, with `input_layouts` the data
    /// inputs' layouts (by parameter index; `None` for weights).
    pub fn new(
        g: &'g Graph,
        opts: &'g ParallelOptions,
        input_layouts: Vec<Option<TensorLayout>>,
    ) -> Result<Problem<'g>, ParallelError> {
        Problem::with_fixed(g, opts, input_layouts, |node| match &node.in_strategy {
            Some(s) => sharding(g, node, s, opts.device_num).map(Some),
            None => Ok(None),
        })
    }

    /// As [`Problem::new`], with `fix` saying which ops the search keeps as they are (and
    /// with which sharding): the user's annotations, and in `semi_auto_parallel` the
    /// batch-split defaults of the ops the user wrote.
    pub fn with_fixed(
        g: &'g Graph,
        opts: &'g ParallelOptions,
        input_layouts: Vec<Option<TensorLayout>>,
        fix: impl Fn(&shardc_ir::Node) -> Result<Option<OpSharding>, ParallelError>,
    ) -> Result<Problem<'g>, ParallelError> {
        let mut ops = Vec::new();
        let mut index_of = vec![None; g.nodes.len()];
        for (i, node) in g.nodes.iter().enumerate() {
            if node.op == OpKind::TupleGetItem || updated_weight(g, node).is_some() {
                continue;
            }
            index_of[i] = Some(ops.len());
            ops.push(NodeId(i as u32));
        }
        let mut fixed = Vec::with_capacity(ops.len());
        for &n in &ops {
            fixed.push(fix(g.node(n))?);
        }
        let users = g.users();
        // Weights: first searched user, other readers, updates.
        let mut first_user: Vec<Option<(usize, usize)>> = vec![None; g.params.len()];
        let mut terms = Vec::new();
        let elem_of = |o: &Operand| {
            g.operand_tensor_type(o)
                .map(|t| elem_bytes(t.dtype))
                .unwrap_or(4)
        };
        for (k, &n) in ops.iter().enumerate() {
            let node = g.node(n);
            for (j, o) in node.inputs.iter().enumerate() {
                let Operand::Param(p) = o else { continue };
                let param = g.param(*p);
                if param.is_weight() {
                    match first_user[p.index()] {
                        None => first_user[p.index()] = Some((k, j)),
                        Some((f, fj)) => terms.push(Term::SharedWeight {
                            first: f,
                            first_operand: fj,
                            to: k,
                            operand: j,
                            elem: elem_bytes(param.ty.dtype),
                        }),
                    }
                } else if input_layouts.get(p.index()).is_some_and(Option::is_some) {
                    terms.push(Term::FromInput {
                        param: p.index(),
                        to: k,
                        operand: j,
                        elem: elem_bytes(param.ty.dtype),
                    });
                }
            }
        }
        // Values: producer result -> reader (looking through TupleGetItem).
        let mut kept_results = vec![Vec::new(); ops.len()];
        for (k, &n) in ops.iter().enumerate() {
            // A recomputed forward node (`duplicated`) runs in the backward pass: its results
            // live there briefly, not from the forward pass on.
            let replay = matches!(
                g.node(n).attrs.get(crate::recompute::DUPLICATED_ATTR),
                Some(shardc_ir::Attr::Bool(true))
            );
            let producer_generated = is_generated(g.node(n)) || replay;
            let mut readers: Vec<(NodeId, usize)> = Vec::new(); // (reader, result index)
            for &u in &users[n.index()] {
                let un = g.node(u);
                if un.op == OpKind::TupleGetItem {
                    let idx = const_index(un.inputs.get(1));
                    for &v in &users[u.index()] {
                        readers.push((v, idx));
                    }
                } else {
                    readers.push((u, 0));
                }
            }
            readers.sort_unstable_by_key(|&(v, idx)| (v.0, idx));
            readers.dedup();
            for (v, out) in readers {
                let vn = g.node(v);
                let via = |o: &Operand| -> bool {
                    match o {
                        Operand::Node(x) if *x == n => true,
                        Operand::Node(x) => {
                            let xn = g.node(*x);
                            xn.op == OpKind::TupleGetItem
                                && xn.inputs.first() == Some(&Operand::Node(n))
                                && const_index(xn.inputs.get(1)) == out
                        }
                        _ => false,
                    }
                };
                if !producer_generated && is_generated(vn) && !kept_results[k].contains(&out) {
                    kept_results[k].push(out);
                }
                for (j, o) in vn.inputs.iter().enumerate() {
                    if !via(o) {
                        continue;
                    }
                    let elem = g
                        .node(n)
                        .ty
                        .tensors()
                        .get(out)
                        .map(|t| elem_bytes(t.dtype))
                        .unwrap_or(4);
                    if let Some(to) = index_of[v.index()] {
                        terms.push(Term::Flow {
                            from: k,
                            out,
                            to,
                            operand: j,
                            elem,
                        });
                    } else if let Some(w) = updated_weight(g, vn) {
                        if j == 0 {
                            continue;
                        }
                        let shape = g
                            .operand_tensor_type(o)
                            .map(|t| t.shape.clone())
                            .unwrap_or_default();
                        terms.push(Term::IntoWeight {
                            from: k,
                            out,
                            first: first_user[w],
                            weight_shape: g.params[w].ty.shape.clone(),
                            shape,
                            elem: elem_of(o),
                        });
                    }
                }
            }
        }
        // Weight copies: the weight, its optimizer state (other weights of its shape that its
        // updates write alongside), its gradient.
        let mut owned_weights = vec![Vec::new(); ops.len()];
        let mut state_copies = vec![0usize; g.params.len()];
        let mut optimized = vec![false; g.params.len()];
        for node in &g.nodes {
            if let Some(w) = updated_weight(g, node) {
                optimized[w] |= node.op.class() == shardc_ir::OpClass::Optimizer;
                for o in node.inputs.iter().skip(1) {
                    if let Operand::Param(p) = o {
                        let q = g.param(*p);
                        if q.is_weight() && q.ty.shape == g.params[w].ty.shape && p.index() != w {
                            state_copies[w] += 1;
                        }
                    }
                }
            }
        }
        for (w, fu) in first_user.iter().enumerate() {
            if let Some((k, j)) = fu {
                let grad = if g.params[w].requires_grad() { 1 } else { 0 };
                let updated = if optimized[w] { 1 + state_copies[w] } else { 0 };
                owned_weights[*k].push((*j, (1 + state_copies[w] + grad) as f64, updated as f64));
            }
        }
        let mut op_terms = vec![Vec::new(); ops.len()];
        for (t, term) in terms.iter().enumerate() {
            for k in term.ops() {
                op_terms[k].push(t);
            }
        }
        let flops_per_iter = ops
            .iter()
            .map(|&n| flops_per_iteration(g, g.node(n)))
            .collect();
        Ok(Problem {
            g,
            opts,
            comm: CommCost::new(opts.search.machine, opts.enable_alltoall),
            ops,
            index_of,
            fixed,
            terms,
            op_terms,
            input_layouts,
            owned_weights,
            kept_results,
            flops_per_iter,
        })
    }

    /// The machine.
    pub fn machine(&self) -> &Machine {
        self.comm.machine()
    }

    /// The instance name of searched op `k`.
    pub fn name(&self, k: usize) -> &str {
        &self.g.node(self.ops[k]).instance
    }

    /// The strategies searched op `k` may take: the user's, or [`rules::candidates`] that are
    /// valid (see [`MAX_CANDIDATES`]). Never empty for a graph the rules cover.
    pub fn candidates(&self, k: usize) -> Result<Vec<OpSharding>, ParallelError> {
        if let Some(f) = &self.fixed[k] {
            return Ok(vec![f.clone()]);
        }
        let node = self.g.node(self.ops[k]);
        let dims = dims_of(self.g, node)?;
        let n = self.opts.device_num;
        let mut splits = candidates(self.g, node, &dims, n, MAX_SPLIT_LOOPS);
        if splits.len() > MAX_CANDIDATES {
            let full: Vec<Vec<usize>> = splits
                .iter()
                .filter(|s| s.iter().product::<usize>() == n)
                .cloned()
                .collect();
            if !full.is_empty() {
                splits = full;
            }
            splits.truncate(MAX_CANDIDATES);
        }
        let out: Vec<OpSharding> = splits
            .iter()
            .filter_map(|s| rules::sharding_of_loops(self.g, node, &dims, s, n).ok())
            .collect();
        if out.is_empty() {
            return Err(ParallelError::NoRule {
                instance: node.instance.clone(),
                op: node.op,
                reason: format!("no strategy is valid on {n} devices"),
            });
        }
        Ok(out)
    }

    /// Seconds of op `k`'s local work under `s`.
    pub fn compute_seconds(&self, k: usize, s: &OpSharding) -> f64 {
        let node = self.g.node(self.ops[k]);
        let Ok(dims) = dims_of(self.g, node) else {
            return 0.0;
        };
        let iters: f64 = dims
            .loop_sizes
            .iter()
            .zip(s.loop_splits.iter().chain(std::iter::repeat(&1)))
            .map(|(&n, &p)| n as f64 / p.max(1) as f64)
            .product();
        let eb = |l: &TensorLayout, e: usize| l.slice_shape().iter().product::<usize>() * e;
        let mut bytes = 0usize;
        for (o, l) in node.inputs.iter().zip(&s.inputs) {
            if let (Some(l), Some(t)) = (l, self.g.operand_tensor_type(o)) {
                bytes += eb(l, elem_bytes(t.dtype));
            }
        }
        for (t, l) in node.ty.tensors().iter().zip(&s.outputs) {
            bytes += eb(l, elem_bytes(t.dtype));
        }
        let (w, contraction) = self.flops_per_iter[k];
        let m = self.machine();
        let mut t = if contraction {
            m.compute_seconds(iters * w, bytes as f64)
        } else {
            m.vector_seconds(iters * w, bytes as f64)
        };
        // The optimizer updates of the weights this op is first user of, on their slices:
        // read the weight, its gradient and state, write the weight and state.
        for &(j, copies, _) in &self.owned_weights[k] {
            if let (Some(Some(l)), Some(ty)) = (
                s.inputs.get(j),
                node.inputs
                    .get(j)
                    .and_then(|o| self.g.operand_tensor_type(o)),
            ) {
                let el = l.slice_shape().iter().product::<usize>() as f64;
                let eb = elem_bytes(ty.dtype) as f64;
                t += m.vector_seconds(4.0 * el, el * eb * (2.0 * copies));
            }
        }
        t
    }

    /// Bytes op `k` keeps on one device under `s`.
    pub fn memory_bytes(&self, k: usize, s: &OpSharding) -> f64 {
        let node = self.g.node(self.ops[k]);
        let slice = |l: &TensorLayout| l.slice_shape().iter().product::<usize>() as f64;
        let mut m = 0.0;
        for &(j, copies, updated) in &self.owned_weights[k] {
            if let (Some(Some(l)), Some(t)) = (
                s.inputs.get(j),
                node.inputs
                    .get(j)
                    .and_then(|o| self.g.operand_tensor_type(o)),
            ) {
                // The parallel optimizer keeps 1/n of the weight and its state on a device.
                let n = match &self.opts.parallel_optimizer {
                    Some(cfg) if updated > 0.0 => shard_layout(l, t.size_bytes(), "", cfg)
                        .ok()
                        .flatten()
                        .map_or(1.0, |(_, _, n)| n as f64),
                    _ => 1.0,
                };
                m += slice(l) * elem_bytes(t.dtype) as f64 * (copies - updated + updated / n);
            }
        }
        let tys = node.ty.tensors();
        for &r in &self.kept_results[k] {
            if let (Some(l), Some(t)) = (s.outputs.get(r), tys.get(r)) {
                m += slice(l) * elem_bytes(t.dtype) as f64;
            }
        }
        m
    }

    /// Seconds of term `t` when every op it depends on has the sharding `of` gives, its
    /// conversion priced as the partition makes it ([`CommCost::seconds`]).
    pub fn term_seconds<'a>(&self, t: &Term, of: impl Fn(usize) -> &'a OpSharding) -> f64 {
        self.term_priced(t, of, true)
    }

    /// As [`Problem::term_seconds`], priced by the planner's fast greedy order
    /// ([`CommCost::estimate`]): what the searchers weigh their many candidates by.
    pub fn term_estimate<'a>(&self, t: &Term, of: impl Fn(usize) -> &'a OpSharding) -> f64 {
        self.term_priced(t, of, false)
    }

    fn term_priced<'a>(&self, t: &Term, of: impl Fn(usize) -> &'a OpSharding, exact: bool) -> f64 {
        let seconds = |have: &TensorLayout, want: &TensorLayout, elem: usize| {
            if exact {
                self.comm.seconds(have, want, elem)
            } else {
                self.comm.estimate(have, want, elem)
            }
        };
        match t {
            Term::Flow {
                from,
                out,
                to,
                operand,
                elem,
            } => match (of(*from).outputs.get(*out), of(*to).inputs.get(*operand)) {
                (Some(have), Some(Some(want))) => seconds(have, want, *elem),
                _ => 0.0,
            },
            Term::SharedWeight {
                first,
                first_operand,
                to,
                operand,
                elem,
            } => match (
                of(*first).inputs.get(*first_operand),
                of(*to).inputs.get(*operand),
            ) {
                (Some(Some(have)), Some(Some(want))) => seconds(have, want, *elem),
                _ => 0.0,
            },
            Term::IntoWeight {
                from,
                out,
                first,
                weight_shape,
                shape,
                elem,
            } => {
                let Some(have) = of(*from).outputs.get(*out) else {
                    return 0.0;
                };
                let w = match first {
                    Some((f, j)) => match of(*f).inputs.get(*j) {
                        Some(Some(l)) => l.clone(),
                        _ => return 0.0,
                    },
                    None => TensorLayout::replicated(weight_shape, self.opts.device_num),
                };
                seconds(have, &like_weight(&w, shape), *elem)
            }
            Term::FromInput {
                param,
                to,
                operand,
                elem,
            } => match (
                self.input_layouts.get(*param).and_then(Option::as_ref),
                of(*to).inputs.get(*operand),
            ) {
                (Some(have), Some(Some(want))) => seconds(have, want, *elem),
                _ => 0.0,
            },
        }
    }

    /// The cost graph over the candidate lists `cands` (one list per searched op); the
    /// nodes' and edges' costs are tabulated in parallel.
    pub fn cost_graph(&self, cands: &[Vec<OpSharding>]) -> CostGraph {
        use rayon::prelude::*;
        let mut nodes: Vec<SearchNode> = cands
            .par_iter()
            .enumerate()
            .map(|(k, cs)| SearchNode {
                name: self.name(k).to_string(),
                unary: cs.iter().map(|s| self.compute_seconds(k, s)).collect(),
                memory: cs.iter().map(|s| self.memory_bytes(k, s)).collect(),
            })
            .collect();
        let tabulated: Vec<(Vec<usize>, Vec<f64>)> = self
            .terms
            .par_iter()
            .map(|t| {
                let ops = t.ops();
                let cost = match ops[..] {
                    [k] => cands[k]
                        .iter()
                        .map(|s| self.term_estimate(t, |_| s))
                        .collect(),
                    [a, b] => {
                        let mut cost = Vec::with_capacity(cands[a].len() * cands[b].len());
                        for sa in &cands[a] {
                            for sb in &cands[b] {
                                cost.push(self.term_estimate(t, |x| if x == a { sa } else { sb }));
                            }
                        }
                        cost
                    }
                    _ => Vec::new(),
                };
                (ops, cost)
            })
            .collect();
        let mut edges = Vec::new();
        for (ops, cost) in tabulated {
            match ops[..] {
                [k] => {
                    for (u, c) in nodes[k].unary.iter_mut().zip(cost) {
                        *u += c;
                    }
                }
                [a, b] => edges.push(SearchEdge { a, b, cost }),
                _ => {}
            }
        }
        CostGraph { nodes, edges }
    }

    /// Every searched op's candidates ([`Problem::candidates`]), computed in parallel.
    pub fn all_candidates(&self) -> Result<Vec<Vec<OpSharding>>, ParallelError> {
        use rayon::prelude::*;
        (0..self.ops.len())
            .into_par_iter()
            .map(|k| self.candidates(k))
            .collect()
    }

    /// The predicted step time of a choice (one sharding per searched op): compute plus every
    /// term, a value's conversion to one placement counted once however many readers need it
    /// there ([`Problem::conversion`]), as the partition makes it once.
    pub fn step_seconds(&self, choice: &[&OpSharding]) -> Breakdown {
        let communication = self.counted_term_seconds(choice).iter().sum();
        self.breakdown(choice, communication)
    }

    /// What each term (in [`Problem::terms`]' order) adds to [`Problem::step_seconds`] of
    /// `choice`: a conversion several readers share counts at its first reader only, 0 at
    /// the others (the stage planner attributes the terms to layers with it).
    pub fn counted_term_seconds(&self, choice: &[&OpSharding]) -> Vec<f64> {
        let mut converted = HashSet::new();
        // A partial result is completed once, for its first reader; the other readers convert
        // from the layout that completion gave (as the partition does, so that every reader
        // sees the same sums).
        let mut completed: HashMap<(usize, usize), TensorLayout> = HashMap::new();
        self.terms
            .iter()
            .map(|t| {
                let s = match *t {
                    Term::Flow {
                        from,
                        out,
                        to,
                        operand,
                        elem,
                    } => match (
                        choice[from].outputs.get(out),
                        choice[to].inputs.get(operand),
                    ) {
                        (Some(have), Some(Some(want))) if have.is_partial() => {
                            match completed.get(&(from, out)) {
                                Some(done) => self.comm.seconds(done, want, elem),
                                None => {
                                    let s = self.comm.seconds(have, want, elem);
                                    if s > 0.0 {
                                        completed.insert((from, out), want.clone());
                                    }
                                    s
                                }
                            }
                        }
                        _ => self.term_seconds(t, |k| choice[k]),
                    },
                    _ => self.term_seconds(t, |k| choice[k]),
                };
                // A term that costs nothing needs no key: every reader sharing its conversion
                // would cost nothing too (one value, one placement, one plan).
                let first = s == 0.0
                    || self
                        .conversion(t, |k| choice[k])
                        .is_none_or(|c| converted.insert(c));
                if first {
                    s
                } else {
                    0.0
                }
            })
            .collect()
    }

    /// The searchers' objective for a choice, the total of the [`CostGraph`] they search:
    /// as [`Problem::step_seconds`], but every term on its own, so that a conversion several
    /// readers share is counted once per reader (a cost graph's edges join two ops, and
    /// sharing is a property of all the readers of a value at once), and priced by the fast
    /// estimate ([`Problem::term_estimate`]).
    pub fn objective_seconds(&self, choice: &[&OpSharding]) -> Breakdown {
        let communication = self
            .terms
            .iter()
            .map(|t| self.term_estimate(t, |k| choice[k]))
            .sum();
        self.breakdown(choice, communication)
    }

    /// A choice's compute and memory, with `communication`.
    fn breakdown(&self, choice: &[&OpSharding], communication: f64) -> Breakdown {
        let compute: f64 = choice
            .iter()
            .enumerate()
            .map(|(k, s)| self.compute_seconds(k, s))
            .sum();
        let memory: f64 = choice
            .iter()
            .enumerate()
            .map(|(k, s)| self.memory_bytes(k, s))
            .sum();
        Breakdown {
            compute,
            communication,
            memory,
        }
    }

    /// The conversion term `t` prices, as the partition shares it among readers: the value
    /// converted and the placement it must reach. `None` for a term whose conversion is not
    /// shared (a gradient written into its weight, completed apart from ordinary readers) or
    /// whose reader takes no layout.
    pub fn conversion<'a>(
        &self,
        t: &Term,
        of: impl Fn(usize) -> &'a OpSharding,
    ) -> Option<(Converted, Placement)> {
        let (value, to, operand) = match *t {
            Term::Flow {
                from,
                out,
                to,
                operand,
                ..
            } => (Converted::Result(from, out), to, operand),
            Term::SharedWeight {
                first,
                first_operand,
                to,
                operand,
                ..
            } => (Converted::Weight(first, first_operand), to, operand),
            Term::FromInput {
                param, to, operand, ..
            } => (Converted::Input(param), to, operand),
            Term::IntoWeight { .. } => return None,
        };
        let want = of(to).inputs.get(operand)?.as_ref()?;
        Some((value, placement(want)))
    }

    /// Op `k`'s share of a choice: its compute, the terms it takes part in (both ends
    /// counted), its memory.
    pub fn op_breakdown(&self, k: usize, s: &OpSharding, choice: &[&OpSharding]) -> Breakdown {
        let communication = self.op_terms[k]
            .iter()
            .map(|&t| self.term_seconds(&self.terms[t], |x| if x == k { s } else { choice[x] }))
            .sum();
        Breakdown {
            compute: self.compute_seconds(k, s),
            communication,
            memory: self.memory_bytes(k, s),
        }
    }
}

impl Problem<'_> {
    /// The weights searched op `k` is first user of, as (operand index, copies): the weight,
    /// its optimizer state and its gradient (what [`Problem::memory_bytes`] charges to `k`).
    pub fn owned_weights_of(&self, k: usize) -> Vec<(usize, f64)> {
        self.owned_weights[k]
            .iter()
            .map(|&(j, copies, _)| (j, copies))
            .collect()
    }

    /// The results of searched op `k` that the backward pass reads (what
    /// [`Problem::memory_bytes`] keeps for it).
    pub fn kept_results_of(&self, k: usize) -> &[usize] {
        &self.kept_results[k]
    }
}

/// Candidate lists are explained per op only up to this many searched ops times candidates.
pub const EXPLAIN_BUDGET: usize = 200_000;

/// Per searched op of `p`: its candidates (`cands`, when given and within
/// [`EXPLAIN_BUDGET`]; else only the chosen one) weighed against the neighbours of `choice`,
/// with the seconds and bytes of each (for `shardc explain`).
pub fn weigh(
    p: &Problem,
    cands: Option<&[Vec<OpSharding>]>,
    choice: &[&OpSharding],
) -> Vec<Vec<Candidate>> {
    let weigh_one = |k: usize, s: &OpSharding| {
        let b = p.op_breakdown(k, s, choice);
        Candidate {
            strategy: s.strategy.clone(),
            out_strategy: s.out_strategy.clone(),
            communication: b.communication,
            compute: b.compute,
            memory: b.memory,
        }
    };
    let total_cands: usize = cands.map_or(usize::MAX, |c| c.iter().map(Vec::len).sum());
    match cands {
        Some(cands) if total_cands <= EXPLAIN_BUDGET => cands
            .iter()
            .enumerate()
            .map(|(k, cs)| cs.iter().map(|s| weigh_one(k, s)).collect())
            .collect(),
        _ => choice
            .iter()
            .enumerate()
            .map(|(k, s)| vec![weigh_one(k, s)])
            .collect(),
    }
}
