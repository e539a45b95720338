//! Recomputation (MindSpore's `cell.recompute()` / `primitive.recompute()`): forward nodes
//! marked `recompute: true` are replayed in the backward pass instead of keeping their results
//! alive from the forward pass to the backward pass.
//!
//! On the training step (after `autodiff`), every marked forward node whose result a backward
//! node reads (scope `Gradients*`) is cloned just before its first backward reader, and every
//! backward reader reads the clone, so the original's result dies at the end of the forward
//! pass. A clone reads the clones of its marked producers (cloned first, recursively) and the
//! unmarked producers as they are: those are the checkpoints kept. A `TupleGetItem` of a
//! marked node is replayed with it.
//!
//! A clone is the same op with the same attributes and strategy annotation (so a replayed
//! Dropout, whose mask depends on its seeds, the step and the element index, draws the same
//! mask) but `recompute`, plus MindSpore's `duplicated: true`, in
//! scope `Gradients/<scope>` (MindSpore puts recomputed nodes in the backward; the schedulers
//! treat `Gradients*` as backward), with instance name `<instance>_recompute` (made unique) and
//! a comment naming what it replays. Forward nodes that no backward node reads, and graphs
//! without marks, are left as they are.
//!
//! Refused: a mark that is not a Bool, and a marked node that writes state (an optimizer
//! update or `Assign`) or communicates — replaying those would change what the step does.

use shardc_ir::{Attr, Graph, Node, NodeId, OpClass, OpKind, Operand};
use std::collections::HashSet;
use thiserror::Error;

/// The attribute that marks a node for recomputation.
pub const RECOMPUTE_ATTR: &str = "recompute";

/// The attribute MindSpore gives a recomputed node (`duplicated: true`); strategy assignment
/// treats such a node as the forward op it replays (same default, same annotation), so that
/// it computes its blocks as the original does.
pub const DUPLICATED_ATTR: &str = "duplicated";

/// Suffix of a clone's instance name.
pub const RECOMPUTE_SUFFIX: &str = "_recompute";

/// Why a graph cannot be recomputed as marked.
#[derive(Debug, Error, Clone, PartialEq)]
#[error("recompute: {op} '{instance}': {reason}")]
pub struct RecomputeError {
    /// The marked node's instance name.
    pub instance: String,
    /// Its op.
    pub op: OpKind,
    /// Why.
    pub reason: String,
}

/// Whether `node` runs in the backward pass (autodiff's scope).
pub fn is_backward(node: &Node) -> bool {
    node.scope.starts_with("Gradients")
}

/// Whether `node` belongs to the forward pass (neither backward nor the optimizer's update).
fn is_forward(node: &Node) -> bool {
    !is_backward(node) && !node.scope.starts_with("Default/optimizer")
}

/// Whether `node` carries `recompute: true` (an error for a mark that is not a Bool).
pub fn is_marked(node: &Node) -> Result<bool, RecomputeError> {
    match node.attrs.get(RECOMPUTE_ATTR) {
        None => Ok(false),
        Some(Attr::Bool(b)) => Ok(*b),
        Some(other) => Err(RecomputeError {
            instance: node.instance.clone(),
            op: node.op,
            reason: format!("attribute recompute must be true or false, found {other:?}"),
        }),
    }
}

/// Whether any node of `g` is marked for recomputation.
pub fn any_marked(g: &Graph) -> bool {
    g.nodes.iter().any(|n| is_marked(n).unwrap_or(true))
}

/// The nodes that are replayed when read by the backward pass: marked forward nodes, and the
/// `TupleGetItem`s of replayed nodes.
fn replayable(g: &Graph) -> Result<Vec<bool>, RecomputeError> {
    let mut out = vec![false; g.nodes.len()];
    for (i, node) in g.nodes.iter().enumerate() {
        let marked = is_marked(node)?;
        if marked {
            let refused = match node.op.class() {
                OpClass::Optimizer => Some("it updates a weight"),
                OpClass::Communication => Some("it communicates"),
                _ if node.op == OpKind::Assign => Some("it writes a parameter"),
                _ => None,
            };
            if let Some(why) = refused {
                return Err(RecomputeError {
                    instance: node.instance.clone(),
                    op: node.op,
                    reason: format!("{why}; only forward computations can be recomputed"),
                });
            }
        }
        out[i] = is_forward(node)
            && (marked
                || (node.op == OpKind::TupleGetItem
                    && matches!(node.inputs.first(), Some(Operand::Node(s)) if out[s.index()])));
    }
    Ok(out)
}

/// Builds the recomputed graph (see the module documentation).
struct Rewriter<'g> {
    g: &'g Graph,
    replay: Vec<bool>,
    out: Graph,
    /// Per original node: its id in `out`.
    map: Vec<Option<NodeId>>,
    /// Per original node: its clone in `out`, once made.
    clones: Vec<Option<NodeId>>,
    taken: HashSet<String>,
}

impl Rewriter<'_> {
    fn mapped(&self, o: &Operand) -> Operand {
        match o {
            Operand::Node(n) => self.map[n.index()].map_or(o.clone(), Operand::Node),
            other => other.clone(),
        }
    }

    /// A unique instance name for the clone of `instance`.
    fn clone_name(&mut self, instance: &str) -> String {
        let base = format!("{instance}{RECOMPUTE_SUFFIX}");
        let mut name = base.clone();
        let mut k = 2;
        while self.taken.contains(&name) {
            name = format!("{base}{k}");
            k += 1;
        }
        self.taken.insert(name.clone());
        name
    }

    /// The clone of replayed node `n`, made (with its replayed producers) if not yet.
    fn clone_of(&mut self, n: NodeId) -> NodeId {
        if let Some(c) = self.clones[n.index()] {
            return c;
        }
        let g = self.g;
        let orig = &g.nodes[n.index()];
        let inputs = orig
            .inputs
            .iter()
            .map(|o| match o {
                Operand::Node(p) if self.replay[p.index()] => Operand::Node(self.clone_of(*p)),
                other => self.mapped(other),
            })
            .collect();
        let mut node = orig.clone();
        node.inputs = inputs;
        node.attrs.remove(RECOMPUTE_ATTR);
        node.attrs.set(DUPLICATED_ATTR, Attr::Bool(true));
        node.scope = format!("Gradients/{}", orig.scope);
        node.comments = vec![format!(
            "recomputed: replays {} for the backward pass",
            orig.instance
        )];
        node.instance = self.clone_name(&orig.instance);
        let id = self.out.push_node(node);
        self.clones[n.index()] = Some(id);
        id
    }
}

/// Replays the marked forward nodes that the backward pass reads (see the module
/// documentation). A graph without marks is returned unchanged.
pub fn recompute(g: &Graph) -> Result<Graph, RecomputeError> {
    let replay = replayable(g)?;
    if !replay.iter().any(|&r| r) {
        return Ok(g.clone());
    }
    let mut out = g.clone();
    out.nodes = Vec::with_capacity(g.nodes.len() * 2);
    let mut rw = Rewriter {
        g,
        replay,
        out,
        map: vec![None; g.nodes.len()],
        clones: vec![None; g.nodes.len()],
        taken: g.nodes.iter().map(|n| n.instance.clone()).collect(),
    };
    for (i, node) in g.nodes.iter().enumerate() {
        let backward = is_backward(node);
        let inputs: Vec<Operand> = node
            .inputs
            .iter()
            .map(|o| match o {
                Operand::Node(p) if backward && rw.replay[p.index()] => {
                    Operand::Node(rw.clone_of(*p))
                }
                other => rw.mapped(other),
            })
            .collect();
        let mut n = node.clone();
        n.inputs = inputs;
        if backward {
            // A gradient rule may copy its forward node's attributes: the mark is the
            // forward's.
            n.attrs.remove(RECOMPUTE_ATTR);
        }
        rw.map[i] = Some(rw.out.push_node(n));
    }
    let outputs: Vec<Operand> = g.outputs.iter().map(|o| rw.mapped(o)).collect();
    rw.out.outputs = outputs;
    Ok(rw.out)
}

/// How many nodes of `g` are replays made by [`recompute`] (backward nodes with its
/// `recomputed:` comment).
pub fn replayed_count(g: &Graph) -> usize {
    g.nodes
        .iter()
        .filter(|n| is_backward(n) && n.comments.iter().any(|c| c.starts_with("recomputed:")))
        .count()
}
