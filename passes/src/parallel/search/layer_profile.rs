//! Folding repeated layers: what one layer of each kind costs under one intra-op plan, so
//! that the stage planner ([`super::stage_plan`]) sees one layer of each kind, not all of
//! them.
//!
//! A layered model's training graph is built with `P = min(L, 3)` layers at one micro-batch
//! size: layer 0 (the first: it reads the data and computes no input gradient), layer 1 (a
//! middle layer: its input comes from a layer and its input gradient goes back to one) and
//! layer 2 (the last, with the loss head). An intra-op searcher ([`super::run`]) plans that
//! graph on the stage's `d` devices; the **middle layer's plan** is then given to every layer
//! (each op takes the sharding of the op of the same role in the middle layer; the head keeps
//! its own), and that replicated plan is priced with the prediction's own terms
//! ([`Problem::counted_term_seconds`], [`Problem::compute_seconds`]). Every op and every term
//! is attributed to one layer: an op to the layer its scope names (the head's ops to the
//! last), a term to the latest layer among its ops. So the L-layer model's prediction under
//! the replicated plan is `first + (L − 2) · middle + last` exactly (test
//! `folding_prices_what_the_unfolded_graph_predicts`), because a middle layer's ops and terms,
//! the boundary with the layer before included, are the same in every middle layer.
//!
//! Per layer kind, a [`LayerCost`] splits the prediction as the pipeline needs it: the
//! forward and backward seconds of one micro-batch (compute and the layer's own
//! communication), the gradient synchronisation (the terms that write a gradient into its
//! weight: data parallelism's AllReduce) and the optimizer update per step, and the bytes:
//! weights, gradients and optimizer state per device, the activations the backward pass
//! reads per micro-batch, the layer's input and output per device. The gradient
//! synchronisation is also split into its bandwidth part and its collectives' fixed part, so
//! that the pipeline prices it fused into buckets, as `grad_fusion` emits it.

use super::super::completion::Weighing;
use super::super::dataset::data_input_layouts;
use super::super::roles::is_generated;
use super::super::rules::OpSharding;
use super::super::{ParallelError, ParallelOptions, SearchMode};
use super::problem::{Converted, Problem, Term};
use crate::parallel::cost::elem_bytes;
use shardc_ir::{Graph, Node, Operand, TensorLayout};
use std::collections::{HashMap, HashSet};

/// What one layer costs on one stage's devices under one intra-op plan, for one micro-batch
/// (seconds, bytes per device).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LayerCost {
    /// Forward compute and communication of one micro-batch.
    pub forward: f64,
    /// Backward compute and communication of one micro-batch.
    pub backward: f64,
    /// The gradient synchronisation, once per step (gradients into their weights' layouts:
    /// the AllReduce over a weight's replicas, or with ZeRO its ReduceScatter + AllGather,
    /// which a ring moves as many bytes in).
    pub grad_sync: f64,
    /// Collectives in [`LayerCost::grad_sync`] (one per gradient that needs one); ZeRO runs
    /// two where the AllReduce was one, each with the machine's fixed overhead.
    pub grad_collectives: f64,
    /// The bandwidth part of [`LayerCost::grad_sync`] (its seconds less each collective's
    /// fixed overhead and latency): what the gradients cost once fused into buckets.
    pub grad_sync_bandwidth: f64,
    /// The fixed part of the layer's costliest gradient collective (overhead and latency
    /// steps): what one fused bucket pays on top of its bytes.
    pub grad_sync_latency: f64,
    /// The optimizer update of the layer's weights, once per step, unsharded.
    pub optimizer: f64,
    /// The optimizer update with ZeRO-1: each weight's update on `1 / replicas` of it.
    pub optimizer_zero: f64,
    /// Weight slices.
    pub weight_bytes: f64,
    /// Gradient slices.
    pub grad_bytes: f64,
    /// Optimizer state.
    pub state_bytes: f64,
    /// Optimizer state with ZeRO-1 (each weight's state over its replicas).
    pub state_bytes_zero: f64,
    /// Activations the backward pass reads, one micro-batch.
    pub activation_bytes: f64,
    /// The layer's input, one micro-batch (what recompute keeps).
    pub input_bytes: f64,
    /// The layer's output, one micro-batch (what goes to the next stage).
    pub output_bytes: f64,
}

impl LayerCost {
    /// Forward + backward of one micro-batch.
    pub fn seconds(&self) -> f64 {
        self.forward + self.backward
    }
}

/// How the planner asks a model for its layers.
pub trait LayeredModel: Sync {
    /// The number of layers `L`.
    fn layers(&self) -> usize;
    /// The training graph (types inferred, backward and optimizer appended) of the model's
    /// first `layers` layers with its head, at `micro_batch` samples; with
    /// `tensor_parallel = Some((tp, dp))`, annotated with Megatron-LM's strategies for a
    /// `tp × dp` mesh. `Ok(None)` when that annotation does not apply (`tp` does not divide
    /// the heads, `dp` the micro-batch).
    fn layer_graph(
        &self,
        layers: usize,
        micro_batch: usize,
        tensor_parallel: Option<(usize, usize)>,
    ) -> Result<Option<Graph>, String>;
    /// The layer `node` belongs to (its backward and its weights' too); `None` for the head.
    fn layer_of(&self, node: &Node) -> Option<usize>;
    /// The op's role, the same in every layer (its instance name without the layer index).
    fn role(&self, node: &Node) -> String;
}

/// The layer kinds of an `L`-layer model: how many layers its profile graph has.
pub fn profile_layers(layers: usize) -> usize {
    layers.clamp(1, 3)
}

/// The kind (the layer of the profile graph) of layer `i` of `L`: the first, the last, or a
/// middle one.
pub fn kind_of(i: usize, layers: usize) -> usize {
    let p = profile_layers(layers);
    if i == 0 {
        0
    } else if i + 1 == layers {
        p - 1
    } else {
        1.min(p - 1)
    }
}

/// The data inputs' layouts of `g` under `opts`' dataset strategy (by parameter index;
/// `None` for weights): what a [`Problem`] of `g` starts from.
pub fn inputs_of(
    g: &Graph,
    opts: &ParallelOptions,
) -> Result<Vec<Option<TensorLayout>>, ParallelError> {
    data_input_layouts(g, opts)
}

/// One intra-op plan of the layers, priced per layer kind.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerProfile {
    /// Per kind ([`kind_of`]): the layer's cost.
    pub kinds: Vec<LayerCost>,
    /// Tensor-parallel degree: devices a weight is split over (the largest weight's).
    pub tp: usize,
    /// Data-parallel degree: replicas of that weight (`devices / tp`).
    pub dp: usize,
}

/// The local search's budget of a profile's `dynamic_programming` search
/// ([`super::dynamic::search_within`]): a twentieth of a compile's, as the planner searches
/// at dozens of points.
pub const PROFILE_BUDGET: usize = super::dynamic::IMPROVE_BUDGET / 20;

/// The searcher `mode`'s choice on `p`, without the explanations and baselines
/// [`super::run`] adds for `shardc explain`: the planner runs it at every (stage devices,
/// micro-batch) point. `dynamic_programming` runs elimination with a reduced local search
/// ([`PROFILE_BUDGET`], no cut-set conditioning, no memory weight: the planner checks memory
/// per stage itself); the others run as in a compile (memory limited by the machine).
pub fn search_choice(p: &Problem, mode: SearchMode) -> Result<Vec<OpSharding>, ParallelError> {
    let limit = p.opts.search.memory_limit();
    match mode {
        SearchMode::RecursiveProgramming | SearchMode::ShardingPropagation => {
            Ok(super::recursive::search(p, limit)?.shardings)
        }
        SearchMode::DynamicProgramming | SearchMode::Ilp => {
            let cands = p.all_candidates()?;
            let cg = p.cost_graph(&cands);
            let choice = if mode == SearchMode::Ilp {
                super::ilp::search(&cg, Some(limit))
                    .map_err(super::recursive::search_error)?
                    .choice
            } else {
                super::dynamic::search_within(&cg, PROFILE_BUDGET)
                    .map_err(super::recursive::search_error)?
                    .0
            };
            Ok(choice
                .iter()
                .zip(cands)
                .map(|(&c, mut cs)| cs.swap_remove(c))
                .collect())
        }
    }
}

/// Which op of the middle layer each searched op copies its sharding from: the op of the
/// same role in the middle layer, itself where there is none (the head, or a model of one
/// layer).
fn replicated_plan(p: &Problem, model: &dyn LayeredModel, mid: usize) -> Vec<usize> {
    let mut of_role: HashMap<String, usize> = HashMap::new();
    for (k, &n) in p.ops.iter().enumerate() {
        let node = p.g.node(n);
        if model.layer_of(node) == Some(mid) {
            of_role.entry(model.role(node)).or_insert(k);
        }
    }
    p.ops
        .iter()
        .enumerate()
        .map(|(k, &n)| {
            let node = p.g.node(n);
            match model.layer_of(node) {
                Some(_) => of_role.get(&model.role(node)).copied().unwrap_or(k),
                None => k,
            }
        })
        .collect()
}

/// The bytes of one device's block of `l` with `elem` bytes per element.
fn slice_bytes(l: &TensorLayout, elem: usize) -> f64 {
    l.slice_shape().iter().product::<usize>() as f64 * elem as f64
}

/// Prices `choice` (one sharding per searched op of `p`) per layer of the profile graph:
/// returns one [`LayerCost`] per layer (`layers` of them; the head's ops and terms go to the
/// last).
///
/// `fixed_part`, when given, is the same problem on a machine whose links have infinite
/// bandwidth: its price of a gradient's collective is that collective's fixed part
/// ([`LayerCost::grad_sync_latency`]).
pub fn price_layers(
    p: &Problem,
    fixed_part: Option<&Problem>,
    model: &dyn LayeredModel,
    layers: usize,
    choice: &[&OpSharding],
) -> Vec<LayerCost> {
    let g = p.g;
    let m = *p.machine();
    let last = layers.saturating_sub(1);
    let layer_of: Vec<usize> = p
        .ops
        .iter()
        .map(|&n| model.layer_of(g.node(n)).map_or(last, |i| i.min(last)))
        .collect();
    let backward: Vec<bool> = p.ops.iter().map(|&n| is_generated(g.node(n))).collect();
    let mut out = vec![LayerCost::default(); layers];
    let d = p.opts.device_num.max(1) as f64;
    // Compute, the optimizer update split out, weights and activations.
    for (k, s) in choice.iter().enumerate() {
        let node = g.node(p.ops[k]);
        let c = &mut out[layer_of[k]];
        let mut update = 0.0;
        for (j, copies) in p.owned_weights_of(k) {
            let (Some(Some(l)), Some(ty)) = (
                s.inputs.get(j),
                node.inputs.get(j).and_then(|o| g.operand_tensor_type(o)),
            ) else {
                continue;
            };
            let el = l.slice_shape().iter().product::<usize>() as f64;
            let eb = elem_bytes(ty.dtype) as f64;
            // As `Problem::compute_seconds` prices it.
            let t = m.vector_seconds(4.0 * el, el * eb * (2.0 * copies));
            update += t;
            let whole = ty.shape.iter().product::<usize>().max(1) as f64;
            let replicas = (d * el / whole).max(1.0);
            let grad = if copies >= 2.0 { 1.0 } else { 0.0 };
            let state = (copies - 1.0 - grad).max(0.0);
            c.weight_bytes += el * eb;
            c.grad_bytes += grad * el * eb;
            c.state_bytes += state * el * eb;
            c.state_bytes_zero += state * el * eb / replicas;
            c.optimizer += t;
            c.optimizer_zero += t / replicas;
        }
        let t = p.compute_seconds(k, s) - update;
        if backward[k] {
            c.backward += t;
        } else {
            c.forward += t;
        }
        let tys = node.ty.tensors();
        for &r in p.kept_results_of(k) {
            if let (Some(l), Some(t)) = (s.outputs.get(r), tys.get(r)) {
                c.activation_bytes += slice_bytes(l, elem_bytes(t.dtype));
            }
        }
    }
    // Terms: the latest layer among their ops; gradients into weights are the sync.
    let counted = p.counted_term_seconds(choice);
    let mut inputs_seen: HashSet<Converted> = HashSet::new();
    let mut outputs_seen: HashSet<(usize, usize)> = HashSet::new();
    for (t, &secs) in p.terms.iter().zip(&counted) {
        let ops = t.ops();
        let Some(&at) = ops.iter().map(|&k| &layer_of[k]).max() else {
            continue;
        };
        let c = &mut out[at];
        match t {
            Term::IntoWeight { .. } => {
                c.grad_sync += secs;
                if secs > 0.0 {
                    c.grad_collectives += 1.0;
                    let fixed = fixed_part.map_or(0.0, |q| q.term_seconds(t, |k| choice[k]));
                    c.grad_sync_bandwidth += (secs - fixed).max(0.0);
                    c.grad_sync_latency = c.grad_sync_latency.max(fixed.min(secs));
                }
            }
            _ if ops.iter().all(|&k| !backward[k]) => c.forward += secs,
            _ => c.backward += secs,
        }
        // A forward value entering a layer from outside it: that layer's input, the
        // producer layer's output.
        let entering = match *t {
            Term::Flow { from, out, to, .. }
                if !backward[from] && !backward[to] && layer_of[from] != layer_of[to] =>
            {
                Some((
                    Converted::Result(from, out),
                    layer_of[to],
                    Some((from, out)),
                ))
            }
            Term::FromInput { param, to, .. } if !backward[to] => {
                Some((Converted::Input(param), layer_of[to], None))
            }
            _ => None,
        };
        let Some((value, into, produced)) = entering else {
            continue;
        };
        let bytes = match value {
            Converted::Result(from, out) => {
                let node = g.node(p.ops[from]);
                match (choice[from].outputs.get(out), node.ty.tensors().get(out)) {
                    (Some(l), Some(ty)) => slice_bytes(l, elem_bytes(ty.dtype)),
                    _ => 0.0,
                }
            }
            Converted::Input(param) => {
                let pr = &g.params[param];
                match p.input_layouts.get(param).and_then(Option::as_ref) {
                    Some(l) => slice_bytes(l, elem_bytes(pr.ty.dtype)),
                    None => 0.0,
                }
            }
            Converted::Weight(..) => 0.0,
        };
        // Only the layers' activation input counts, not the head's labels.
        let is_activation = match *t {
            Term::FromInput { to, .. } => model.layer_of(g.node(p.ops[to])).is_some(),
            _ => true,
        };
        if is_activation && inputs_seen.insert(value) {
            out[into].input_bytes += bytes;
        }
        if let Some((from, o)) = produced {
            if outputs_seen.insert((from, o)) {
                out[layer_of[from]].output_bytes += bytes;
            }
        }
    }
    // The last layer's output goes to the head on its own stage: no transfer; give it the
    // size of its input, the boundary activation of a layer (for a stage ending there, which
    // sends nothing).
    if let Some(l) = out.last_mut() {
        if l.output_bytes == 0.0 {
            l.output_bytes = l.input_bytes;
        }
    }
    out
}

/// The tensor-parallel and data-parallel degrees of a plan: over how many devices the
/// largest weight is split, and how many replicas of its blocks there are.
fn mesh_of(p: &Problem, choice: &[&OpSharding]) -> (usize, usize) {
    let g = p.g;
    let mut best = (0usize, 1usize); // (elements, shards)
    for (k, s) in choice.iter().enumerate() {
        let node = g.node(p.ops[k]);
        for (j, o) in node.inputs.iter().enumerate() {
            let Operand::Param(pid) = o else { continue };
            if !g.param(*pid).is_weight() {
                continue;
            }
            let Some(Some(l)) = s.inputs.get(j) else {
                continue;
            };
            let whole: usize = l.tensor_shape.iter().product();
            let block: usize = l.slice_shape().iter().product();
            if whole > best.0 {
                best = (whole, whole / block.max(1));
            }
        }
    }
    let d = p.opts.device_num.max(1);
    let tp = best.1.clamp(1, d);
    (tp, d / tp)
}

/// The sharding of every searched op of `p` (the problem of `g`) when `g`'s annotations are
/// kept and the rest is completed as `sharding_propagation` completes them.
fn annotated_choice(
    g: &Graph,
    p: &Problem,
    opts: &ParallelOptions,
) -> Result<Vec<OpSharding>, ParallelError> {
    let completing = ParallelOptions {
        mode: super::super::Mode::AutoParallel,
        search: super::super::SearchOptions {
            mode: SearchMode::ShardingPropagation,
            ..opts.search
        },
        ..opts.clone()
    };
    // The plan only: what `strategy::assign` adds for `shardc explain` (every candidate of
    // every op weighed) took half of a Megatron profile's time and changes no choice.
    let a = super::super::completion::assign_by_propagation(g, &completing, Weighing::PlanOnly)?;
    p.ops
        .iter()
        .map(|id| {
            a.decisions[id.index()]
                .as_ref()
                .map(|d| d.sharding.clone())
                .ok_or_else(|| {
                    ParallelError::Search(format!(
                        "op '{}' has no decision after completion",
                        g.node(*id).instance
                    ))
                })
        })
        .collect()
}

/// Plans the model's profile graph at `micro_batch` on `opts.device_num` devices with the
/// searcher `mode` (annotated with Megatron-LM's strategies for `(tp, dp)` when given: the
/// searcher then decides the other ops), gives every layer the middle layer's plan, and
/// prices it per layer kind. `Ok(None)` when the model has no such annotation.
pub fn profile(
    model: &dyn LayeredModel,
    opts: &ParallelOptions,
    mode: SearchMode,
    micro_batch: usize,
    tensor_parallel: Option<(usize, usize)>,
) -> Result<Option<LayerProfile>, ParallelError> {
    let layers = profile_layers(model.layers());
    let Some(g) = model
        .layer_graph(layers, micro_batch, tensor_parallel)
        .map_err(ParallelError::Search)?
    else {
        return Ok(None);
    };
    let inputs = data_input_layouts(&g, opts)?;
    let p = Problem::new(&g, opts, inputs.clone())?;
    let found = match tensor_parallel {
        // Megatron's annotations fixed, every other op completed as `sharding_propagation`
        // completes annotations (exactly on the cost graph where it fits, else propagation).
        Some(_) => annotated_choice(&g, &p, opts)?,
        None => search_choice(&p, mode)?,
    };
    let mid = 1.min(layers - 1);
    let from = replicated_plan(&p, model, mid);
    let choice: Vec<&OpSharding> = from.iter().map(|&k| &found[k]).collect();
    let mut unbounded = opts.clone();
    for link in [
        &mut unbounded.search.machine.intra_host,
        &mut unbounded.search.machine.inter_host,
    ] {
        link.bandwidth = f64::INFINITY;
    }
    let fixed = Problem::new(&g, &unbounded, inputs)?;
    let kinds = price_layers(&p, Some(&fixed), model, layers, &choice);
    let (tp, dp) = mesh_of(&p, &choice);
    Ok(Some(LayerProfile { kinds, tp, dp }))
}

/// Prices the plan the profile graph's middle layer takes under `mode` (or, `annotated`,
/// completed around its annotations, as [`profile`] does for Megatron's) on the whole
/// `graph` of a model (every layer given the middle layer's plan, searched on `profile_graph`):
/// the unfolded prediction, `(compute + communication, memory)`, that folding must equal.
pub fn predict_unfolded(
    model: &dyn LayeredModel,
    opts: &ParallelOptions,
    profile_graph: &Graph,
    graph: &Graph,
    mode: SearchMode,
    annotated: bool,
) -> Result<f64, ParallelError> {
    let layers = model.layers();
    let mid = 1.min(profile_layers(layers) - 1);
    let pp = Problem::new(
        profile_graph,
        opts,
        data_input_layouts(profile_graph, opts)?,
    )?;
    let found = if annotated {
        annotated_choice(profile_graph, &pp, opts)?
    } else {
        search_choice(&pp, mode)?
    };
    let mut by_role: HashMap<String, &OpSharding> = HashMap::new();
    let mut head: HashMap<String, &OpSharding> = HashMap::new();
    for (k, &n) in pp.ops.iter().enumerate() {
        let node = pp.g.node(n);
        match model.layer_of(node) {
            Some(i) if i == mid => {
                by_role.entry(model.role(node)).or_insert(&found[k]);
            }
            Some(_) => {}
            None => {
                head.insert(node.instance.clone(), &found[k]);
            }
        }
    }
    let p = Problem::new(graph, opts, data_input_layouts(graph, opts)?)?;
    let choice: Vec<&OpSharding> = p
        .ops
        .iter()
        .map(|&n| {
            let node = graph.node(n);
            let got = match model.layer_of(node) {
                Some(_) => by_role.get(&model.role(node)).copied(),
                None => head.get(&node.instance).copied(),
            };
            got.ok_or_else(|| {
                ParallelError::Search(format!(
                    "op '{}' has no counterpart in the profile graph",
                    node.instance
                ))
            })
        })
        .collect::<Result<_, _>>()?;
    Ok(p.step_seconds(&choice).seconds())
}
