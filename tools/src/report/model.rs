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

/// The layer an instance name names, `<prefix><i>` not inside a longer word or number
/// (`apply_momentum_layer3.attn_q.weight` → 3 for the prefix `layer`): the optimizer's
/// updates are scoped by the optimizer, not by the layer of their weight.
pub fn layer_in_name(prefix: &str, name: &str) -> Option<usize> {
    if prefix.is_empty() {
        return None;
    }
    let mut from = 0;
    while let Some(at) = name[from..].find(prefix).map(|a| a + from) {
        let after = &name[at + prefix.len()..];
        let digits = after.len() - after.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        let before_ok = !name[..at].ends_with(|c: char| c.is_ascii_alphanumeric());
        let after_ok = !after[digits..].starts_with(|c: char| c.is_ascii_alphanumeric());
        if digits > 0 && before_ok && after_ok {
            return after[..digits].parse().ok();
        }
        from = at + prefix.len();
    }
    None
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
                layer: cell.as_ref().and_then(|c| {
                    c.layer_in_scope(&n.scope)
                        .or_else(|| layer_in_name(&c.prefix, &n.instance).filter(|&l| l < c.count))
                }),
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
                    reached.sort_by_key(|a| a.0);
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

/// What a folded box stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FoldKind {
    /// Repeated layers with the same plan.
    Layers,
    /// The optimizer's updates of one layer's weights (`None`: of the weights outside the
    /// layers), each following its weight's layout.
    Updates(Option<usize>),
}

/// Ops folded into one box: repeated layers (the same ops with the same strategies as
/// their run's first layer), or one layer's optimizer updates.
#[derive(Clone, Debug, PartialEq)]
pub struct Fold {
    /// What it stands for.
    pub kind: FoldKind,
    /// The first and last layer folded.
    pub layers: (usize, usize),
    /// The part of the step.
    pub phase: Phase,
    /// The ops folded (indices into [`StepGraph::ops`]).
    pub ops: Vec<usize>,
    /// The box's colour: the most common split of its ops.
    pub split: Split,
}

impl Fold {
    /// `TransformerEncoderLayer layers 1–23 ×23 (same plan) · forward`, or
    /// `updates of layer 0`.
    pub fn label(&self, cell: Option<&RepeatedCell>) -> String {
        let (a, b) = self.layers;
        match self.kind {
            FoldKind::Layers => {
                let what = cell.map_or("layers".to_string(), |c| format!("{} layers", c.cell));
                format!(
                    "{what} {a}–{b} ×{} (same plan) · {}",
                    b - a + 1,
                    self.phase.name()
                )
            }
            FoldKind::Updates(Some(l)) => format!("updates of layer {l}"),
            FoldKind::Updates(None) => "updates of the other weights".to_string(),
        }
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

/// Folds the repeated layers of `s`, phase by phase (forward, backward, update):
/// consecutive layers whose ops of the phase are the same kinds in the same order form a
/// run. The phase's first layer is drawn expanded (when it starts a run, the rest of the run
/// folds); a later run of two layers or more folds whole; a layer that matches neither
/// neighbour stays expanded. A layer's op folds only when its strategy is that of the run's
/// first layer's op at its place, so an op whose plan differs stays its own box. The
/// optimizer's updates left over (of an expanded layer, or outside the layers) are one box
/// per layer, each update following its weight. With `fold` false every op is its own box.
pub fn fold(s: &StepGraph, fold: bool) -> Folded {
    // (phase, layer) -> ops, in graph order.
    let mut by_layer: BTreeMap<(Phase, usize), Vec<usize>> = BTreeMap::new();
    if fold {
        for (k, op) in s.ops.iter().enumerate() {
            if let Some(l) = op.layer {
                by_layer.entry((op.phase, l)).or_default().push(k);
            }
        }
    }
    let structure = |l: &[usize]| -> Vec<OpKind> { l.iter().map(|&k| s.ops[k].kind).collect() };
    // op -> the key of its box: (phase, first layer folded).
    let mut folded_into: HashMap<usize, (Phase, usize)> = HashMap::new();
    // (phase, first layer folded) -> last layer.
    let mut last_of: HashMap<(Phase, usize), usize> = HashMap::new();
    for phase in [Phase::Forward, Phase::Backward, Phase::Update] {
        let layers: Vec<(usize, &Vec<usize>)> = by_layer
            .iter()
            .filter(|((p, _), _)| *p == phase)
            .map(|((_, l), ops)| (*l, ops))
            .collect();
        let mut expanded_seen = false;
        let mut i = 0;
        while i < layers.len() {
            let (_, ref_ops) = layers[i];
            let shape = structure(ref_ops);
            let mut j = i + 1;
            while j < layers.len()
                && layers[j].0 == layers[j - 1].0 + 1
                && structure(layers[j].1) == shape
            {
                j += 1;
            }
            if j - i >= 2 {
                let from = if expanded_seen { i } else { i + 1 };
                let key = (phase, layers[from].0);
                last_of.insert(key, layers[j - 1].0);
                for (_, ops) in &layers[from..j] {
                    for (p, &k) in ops.iter().enumerate() {
                        if s.ops[k].strategy == s.ops[ref_ops[p]].strategy {
                            folded_into.insert(k, key);
                        }
                    }
                }
            }
            expanded_seen = true;
            i = j;
        }
    }
    let mut shown = Vec::new();
    let mut box_of = vec![0; s.ops.len()];
    let mut box_at: HashMap<(Phase, usize), usize> = HashMap::new();
    let mut updates_at: HashMap<Option<usize>, usize> = HashMap::new();
    for (k, op) in s.ops.iter().enumerate() {
        let b = match folded_into.get(&k) {
            Some(&key) => *box_at.entry(key).or_insert_with(|| {
                shown.push(Shown::Folded(Fold {
                    kind: FoldKind::Layers,
                    layers: (key.1, last_of.get(&key).copied().unwrap_or(key.1)),
                    phase: key.0,
                    ops: Vec::new(),
                    split: op.split,
                }));
                shown.len() - 1
            }),
            None if fold && op.phase == Phase::Update => {
                *updates_at.entry(op.layer).or_insert_with(|| {
                    let l = op.layer.unwrap_or(0);
                    shown.push(Shown::Folded(Fold {
                        kind: FoldKind::Updates(op.layer),
                        layers: (l, l),
                        phase: Phase::Update,
                        ops: Vec::new(),
                        split: op.split,
                    }));
                    shown.len() - 1
                })
            }
            None => {
                shown.push(Shown::Op(k));
                shown.len() - 1
            }
        };
        if let Shown::Folded(f) = &mut shown[b] {
            f.ops.push(k);
        }
        box_of[k] = b;
    }
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
