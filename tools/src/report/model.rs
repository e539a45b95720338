//! The report's graph: the ops of a rank's training step (forward, backward, optimizer
//! update) with the edges between them, the communication the partition inserted on each
//! edge, how each op is split, and the repeated layers folded.
//!
//! Every op with a recorded decision is a node; the other nodes of the rank's graph
//! (inserted collectives, slices, `TupleGetItem`) are looked through: an edge joins two ops
//! and carries the communication nodes found on the way between them.

use crate::explain::CommEdge;
use serde_json::Value;
use shardc_compiler::graph_layers::{find_repeated_cell, RepeatedCell};
use shardc_ir::{Graph, OpClass, OpKind, Operand};
use std::collections::{BTreeMap, HashMap};

/// How an op is split over the devices (the colour of its box).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Split {
    /// Every device runs the whole op.
    Replicated,
    /// Only the batch (dimension 0 of the data, never a weight) is split.
    DataParallel,
    /// Only weights or non-batch dimensions are split.
    ModelParallel,
    /// Both the batch and the model are split.
    Mixed,
    /// Its result is a partial sum (a reduction loop is split; completed by a collective).
    Partial,
    /// No recorded strategy to read (an op without a decision).
    Unknown,
}

impl Split {
    /// Every kind, in legend order.
    pub const ALL: [Split; 6] = [
        Split::Replicated,
        Split::DataParallel,
        Split::ModelParallel,
        Split::Mixed,
        Split::Partial,
        Split::Unknown,
    ];

    /// The legend's name.
    pub fn name(self) -> &'static str {
        match self {
            Split::Replicated => "replicated",
            Split::DataParallel => "data-parallel",
            Split::ModelParallel => "model-parallel",
            Split::Mixed => "mixed (data + model)",
            Split::Partial => "partial sums",
            Split::Unknown => "no strategy",
        }
    }

    /// The fill colour.
    pub fn colour(self) -> &'static str {
        match self {
            Split::Replicated => "#d9d9d9",
            Split::DataParallel => "#9ecae1",
            Split::ModelParallel => "#fdae6b",
            Split::Mixed => "#c994c7",
            Split::Partial => "#fb6a4a",
            Split::Unknown => "#ffffff",
        }
    }

    /// The CSS class name.
    pub fn class(self) -> &'static str {
        match self {
            Split::Replicated => "replicated",
            Split::DataParallel => "dp",
            Split::ModelParallel => "mp",
            Split::Mixed => "mixed",
            Split::Partial => "partial",
            Split::Unknown => "unknown",
        }
    }
}

/// The strategy text `((2, 4), (4, 1))` as splits per input; `None` when it is not that form.
pub fn parse_strategy(s: &str) -> Option<Vec<Vec<usize>>> {
    let s = s.split(" out ").next()?.trim();
    let inner = s.strip_prefix('(')?.strip_suffix(')')?;
    let mut out = Vec::new();
    let mut rest = inner.trim();
    while !rest.is_empty() {
        let open = rest.strip_prefix('(')?;
        let close = open.find(')')?;
        let dims: Vec<usize> = open[..close]
            .split(',')
            .map(str::trim)
            .filter(|x| !x.is_empty())
            .map(|x| x.parse().ok())
            .collect::<Option<_>>()?;
        out.push(dims);
        rest = open[close + 1..]
            .trim_start()
            .trim_start_matches(',')
            .trim_start();
    }
    Some(out)
}

/// How an op with strategy `strategy` is split, `weights[k]` saying whether input `k` is a
/// weight (or optimizer state), `partial` whether a result is a partial sum.
pub fn classify(strategy: &str, weights: &[bool], partial: bool) -> Split {
    let Some(splits) = parse_strategy(strategy) else {
        return Split::Unknown;
    };
    if partial {
        return Split::Partial;
    }
    let (mut batch, mut model) = (false, false);
    for (k, dims) in splits.iter().enumerate() {
        let weight = weights.get(k).copied().unwrap_or(false);
        for (d, &n) in dims.iter().enumerate() {
            if n <= 1 {
                continue;
            }
            if weight || d > 0 {
                model = true;
            } else {
                batch = true;
            }
        }
    }
    match (batch, model) {
        (false, false) => Split::Replicated,
        (true, false) => Split::DataParallel,
        (false, true) => Split::ModelParallel,
        (true, true) => Split::Mixed,
    }
}

/// Which part of the training step an op belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Phase {
    /// The model.
    Forward,
    /// The gradients (scope `Gradients/…`).
    Backward,
    /// The optimizer's update.
    Update,
}

impl Phase {
    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Forward => "forward",
            Phase::Backward => "backward",
            Phase::Update => "update",
        }
    }
}

/// One op of the step.
#[derive(Clone, Debug, PartialEq)]
pub struct Op {
    /// Its instance name.
    pub name: String,
    /// Its kind.
    pub kind: OpKind,
    /// Its scope.
    pub scope: String,
    /// The chosen strategy.
    pub strategy: String,
    /// How it is split.
    pub split: Split,
    /// Its part of the step.
    pub phase: Phase,
    /// Its repeated layer, if any.
    pub layer: Option<usize>,
    /// Its index in the rank's graph.
    pub node: usize,
}

/// An edge between two ops and the communication on it.
#[derive(Clone, Debug, PartialEq)]
pub struct Edge {
    /// The producing op (index into [`StepGraph::ops`]).
    pub from: usize,
    /// The reading op.
    pub to: usize,
    /// The communication nodes on it (indices into [`StepGraph::comms`]).
    pub comms: Vec<usize>,
}

/// The ops of a rank's step and the edges between them.
#[derive(Clone, Debug, PartialEq)]
pub struct StepGraph {
    /// The ops, in graph order.
    pub ops: Vec<Op>,
    /// The edges, each (from, to) once.
    pub edges: Vec<Edge>,
    /// The communication nodes of the rank's graph on an edge between two ops.
    pub comms: Vec<CommEdge>,
    /// The repeated cell of the scopes, if any.
    pub cell: Option<RepeatedCell>,
}

/// The phase of node `i` of `g`.
fn phase_of(g: &Graph, i: usize) -> Phase {
    let n = &g.nodes[i];
    if n.op.class() == OpClass::Optimizer || n.op == OpKind::Assign {
        Phase::Update
    } else if n.scope.starts_with("Gradients") || n.scope.contains("/Gradients") {
        Phase::Backward
    } else {
        Phase::Forward
    }
}

impl StepGraph {
    /// The step of rank graph `g` with the compile's `decisions` (`extra.decisions`) and the
    /// graph's communication nodes `comms` ([`crate::explain::comm_edges`]).
    pub fn of(
        g: &Graph,
        decisions: &serde_json::Map<String, Value>,
        comms: Vec<CommEdge>,
    ) -> StepGraph {
        let cell = find_repeated_cell(g);
        let mut op_of = vec![None; g.nodes.len()];
        let mut ops = Vec::new();
        // Whether an operand reaches a weight parameter through looked-through nodes.
        let mut weightish = vec![false; g.nodes.len()];
        for (i, n) in g.nodes.iter().enumerate() {
            let Some(d) = decisions.get(&n.instance) else {
                weightish[i] = n.inputs.first().is_some_and(|o| match o {
                    Operand::Param(p) => g.params[p.index()].is_weight(),
                    Operand::Node(id) => weightish[id.index()],
                    Operand::Const(_) => false,
                });
                continue;
            };
            let strategy = match d.get("out_strategy").and_then(Value::as_str) {
                Some(o) => format!(
                    "{} out {o}",
                    d.get("strategy").and_then(Value::as_str).unwrap_or("")
                ),
                None => d
                    .get("strategy")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
            };
            let weights: Vec<bool> = n
                .inputs
                .iter()
                .map(|o| match o {
                    Operand::Param(p) => g.params[p.index()].is_weight(),
                    Operand::Node(id) => weightish[id.index()],
                    Operand::Const(_) => false,
                })
                .collect();
            let partial = d.get("outputs").and_then(Value::as_array).is_some_and(|v| {
                v.iter()
                    .any(|l| l.as_str().is_some_and(|s| s.contains("partial:")))
            });
            op_of[i] = Some(ops.len());
            ops.push(Op {
                name: n.instance.clone(),
                kind: n.op,
                scope: n.scope.clone(),
                split: classify(&strategy, &weights, partial),
                strategy,
                phase: phase_of(g, i),
                layer: cell.as_ref().and_then(|c| c.layer_in_scope(&n.scope)),
                node: i,
            });
        }
        let comm_at: HashMap<usize, usize> =
            comms.iter().enumerate().map(|(k, c)| (c.node, k)).collect();
        // For every looked-through node: the ops it comes from, with the comms on the way.
        let mut sources: Vec<Vec<(usize, Vec<usize>)>> = vec![Vec::new(); g.nodes.len()];
        let mut edges: BTreeMap<(usize, usize), Vec<usize>> = BTreeMap::new();
        for (i, n) in g.nodes.iter().enumerate() {
            let mut reached: Vec<(usize, Vec<usize>)> = Vec::new();
            for o in &n.inputs {
                let Operand::Node(id) = o else { continue };
                let j = id.index();
                match op_of[j] {
                    Some(k) => reached.push((k, Vec::new())),
                    None => reached.extend(sources[j].iter().cloned()),
                }
            }
            match op_of[i] {
                Some(to) => {
                    for (from, cs) in reached {
                        if from == to {
                            continue;
                        }
                        let e = edges.entry((from, to)).or_default();
                        for c in cs {
                            if !e.contains(&c) {
                                e.push(c);
                            }
                        }
                    }
                }
                None => {
                    if let Some(&c) = comm_at.get(&i) {
                        for r in &mut reached {
                            r.1.push(c);
                        }
                    }
                    // Bound what a long chain of looked-through nodes carries.
                    reached.sort_by(|a, b| a.0.cmp(&b.0));
                    reached.dedup_by(|a, b| {
                        if a.0 == b.0 {
                            for c in a.1.drain(..) {
                                if !b.1.contains(&c) {
                                    b.1.push(c);
                                }
                            }
                            true
                        } else {
                            false
                        }
                    });
                    sources[i] = reached;
                }
            }
        }
        StepGraph {
            ops,
            edges: edges
                .into_iter()
                .map(|((from, to), comms)| Edge { from, to, comms })
                .collect(),
            comms,
            cell,
        }
    }
}

/// A box of the drawn graph.
#[derive(Clone, Debug, PartialEq)]
pub enum Shown {
    /// One op (index into [`StepGraph::ops`]).
    Op(usize),
    /// Ops of repeated layers folded into one box.
    Folded(Fold),
}

/// Layers folded into one box: the same ops with the same strategies as their run's first
/// layer, which is drawn expanded.
#[derive(Clone, Debug, PartialEq)]
pub struct Fold {
    /// The first and last layer folded.
    pub layers: (usize, usize),
    /// The part of the step.
    pub phase: Phase,
    /// The ops folded (indices into [`StepGraph::ops`]).
    pub ops: Vec<usize>,
    /// How the first layer's ops are split (the box's colour: the most common).
    pub split: Split,
}

impl Fold {
    /// `layers 1–23 ×23 (same plan) · forward`.
    pub fn label(&self, cell: Option<&RepeatedCell>) -> String {
        let (a, b) = self.layers;
        let what = cell.map_or("layers".to_string(), |c| format!("{} layers", c.cell));
        format!(
            "{what} {a}–{b} ×{} (same plan) · {}",
            b - a + 1,
            self.phase.name()
        )
    }
}

/// The graph as drawn: the boxes and, per op, the box that shows it.
#[derive(Clone, Debug, PartialEq)]
pub struct Folded {
    /// The boxes.
    pub shown: Vec<Shown>,
    /// Per op of the step: its box.
    pub box_of: Vec<usize>,
}

/// Folds the repeated layers of `s`: consecutive layers whose ops are the same kinds in the
/// same order form a run; the run's first layer is drawn expanded, and every later layer's op
/// with the same strategy as the first layer's op at its place joins a box per phase; an op
/// whose strategy differs stays a box of its own. With `fold` false, or no repeated layers,
/// every op is its own box.
pub fn fold(s: &StepGraph, fold: bool) -> Folded {
    let mut by_layer: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    if fold {
        for (k, op) in s.ops.iter().enumerate() {
            if let Some(l) = op.layer {
                by_layer.entry(l).or_default().push(k);
            }
        }
    }
    let structure = |l: &[usize]| -> Vec<(OpKind, Phase)> {
        l.iter().map(|&k| (s.ops[k].kind, s.ops[k].phase)).collect()
    };
    // op -> (run's first layer, last layer of the run) for ops folded into a box.
    let mut folded_into: HashMap<usize, (usize, Phase)> = HashMap::new();
    let mut runs: Vec<(usize, usize)> = Vec::new();
    let layers: Vec<(usize, Vec<usize>)> = by_layer.into_iter().collect();
    let mut i = 0;
    while i < layers.len() {
        let (first, ref_ops) = &layers[i];
        let shape = structure(ref_ops);
        let mut j = i + 1;
        while j < layers.len()
            && layers[j].0 == layers[j - 1].0 + 1
            && structure(&layers[j].1) == shape
        {
            j += 1;
        }
        if j - i >= 2 {
            let last = layers[j - 1].0;
            runs.push((*first, last));
            for (_, ops) in &layers[i + 1..j] {
                for (p, &k) in ops.iter().enumerate() {
                    if s.ops[k].strategy == s.ops[ref_ops[p]].strategy {
                        folded_into.insert(k, (*first, s.ops[k].phase));
                    }
                }
            }
        }
        i = j;
    }
    let mut shown = Vec::new();
    let mut box_of = vec![0; s.ops.len()];
    let mut box_at: HashMap<(usize, Phase), usize> = HashMap::new();
    for (k, op) in s.ops.iter().enumerate() {
        match folded_into.get(&k) {
            Some(&(first, phase)) => {
                let b = *box_at.entry((first, phase)).or_insert_with(|| {
                    let last = runs.iter().find(|r| r.0 == first).map_or(first, |r| r.1);
                    shown.push(Shown::Folded(Fold {
                        layers: (first + 1, last),
                        phase,
                        ops: Vec::new(),
                        split: op.split,
                    }));
                    shown.len() - 1
                });
                if let Shown::Folded(f) = &mut shown[b] {
                    f.ops.push(k);
                    f.layers.0 = f.layers.0.min(op.layer.unwrap_or(f.layers.0));
                }
                box_of[k] = b;
            }
            None => {
                shown.push(Shown::Op(k));
                box_of[k] = shown.len() - 1;
            }
        }
    }
    // A box's colour: the most common split of its ops.
    for b in &mut shown {
        if let Shown::Folded(f) = b {
            let mut count: BTreeMap<Split, usize> = BTreeMap::new();
            for &k in &f.ops {
                *count.entry(s.ops[k].split).or_default() += 1;
            }
            if let Some((sp, _)) = count
                .into_iter()
                .max_by_key(|(sp, c)| (*c, std::cmp::Reverse(*sp)))
            {
                f.split = sp;
            }
        }
    }
    Folded { shown, box_of }
}

/// An edge between two boxes, with the communication of every op edge it stands for.
#[derive(Clone, Debug, PartialEq)]
pub struct BoxEdge {
    /// The producing box.
    pub from: usize,
    /// The reading box.
    pub to: usize,
    /// Communication nodes on it (indices into [`StepGraph::comms`]).
    pub comms: Vec<usize>,
}

impl BoxEdge {
    /// Bytes sent per step by the rank over this edge.
    pub fn bytes(&self, s: &StepGraph) -> f64 {
        self.comms.iter().map(|&c| s.comms[c].bytes).sum()
    }

    /// `AllReduce 4.0 MiB` (per collective kind, `×N` when several): the edge's label.
    pub fn label(&self, s: &StepGraph) -> String {
        let mut by: BTreeMap<&'static str, (usize, f64)> = BTreeMap::new();
        for &c in &self.comms {
            let e = by.entry(s.comms[c].op.name()).or_default();
            e.0 += 1;
            e.1 += s.comms[c].bytes;
        }
        by.into_iter()
            .map(|(op, (n, b))| {
                let times = if n > 1 {
                    format!(" ×{n}")
                } else {
                    String::new()
                };
                format!("{op}{times} {}", human_bytes(b))
            })
            .collect::<Vec<_>>()
            .join(" + ")
    }
}

/// The edges between boxes: every op edge mapped to its boxes' (inside one box dropped).
pub fn box_edges(s: &StepGraph, f: &Folded) -> Vec<BoxEdge> {
    let mut m: BTreeMap<(usize, usize), Vec<usize>> = BTreeMap::new();
    for e in &s.edges {
        let (a, b) = (f.box_of[e.from], f.box_of[e.to]);
        if a == b {
            continue;
        }
        let v = m.entry((a, b)).or_default();
        for &c in &e.comms {
            if !v.contains(&c) {
                v.push(c);
            }
        }
    }
    m.into_iter()
        .map(|((from, to), comms)| BoxEdge { from, to, comms })
        .collect()
}

/// `4.0 MiB`, `512 B`.
pub fn human_bytes(b: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{v:.0} {}", UNITS[u])
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}
