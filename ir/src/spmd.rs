//! The program every rank runs, written once (SPMD): one rank's graph, the **template**, and
//! the few things that differ from rank to rank, each as a [`Patch`] that computes its value
//! from the rank id.
//!
//! A partitioned training step is the same on every rank but for:
//! - the members of each communication group ([`Patch::Group`]: `group`, `rank_list`,
//!   `group_ranks`, from the group's prime axes);
//! - the block each slice keeps ([`Patch::Slice`]: `StridedSlice`'s begin and end, from one's
//!   coordinates on the slice's axes);
//! - where a weight's block sits in the logical weight ([`Patch::ParamBlock`]: the
//!   initializer's `offset`), and where an op's block sits ([`Patch::NodeBlock`]: the
//!   `global_shape` / `offset` attributes of [`crate::block`]);
//! - the windows of convolutions and pools whose output rows or columns are split, whose
//!   padding (and so some shapes) depend on where the block is ([`Patch::Variants`]: whole
//!   nodes, one variant per distinct block).
//!
//! [`SpmdProgram::materialize`] applies the patches to a copy of the template: the result is
//! the graph the per-rank partition gives that rank, for every rank, in time that grows with
//! the graph, not with the device count. An artifact holds the program once
//! ([`crate::artifact`]); each worker materializes its own rank when it loads.
//!
//! Ranks are numbered row-major over **prime axes**: the device matrix's axes factored into
//! primes, as the redistribution planner writes groups ([`coords`], [`group`]).

use crate::graph::{Graph, Init, Node, ParamKind};
use crate::{block, Attr, Attrs, Const, Operand, TensorLayout};
use serde::{Deserialize, Serialize};

/// One rank's value of something that differs between ranks.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Patch {
    /// Communication node `node`'s group: the ranks that share this rank's coordinates over
    /// the prime axes `primes` except on `axes` (its `group`, `rank_list`, `group_ranks`).
    Group {
        /// The node's index in the template.
        node: u32,
        /// The prime axes of the device space, major first.
        primes: Vec<usize>,
        /// The axes the group varies over, major first.
        axes: Vec<usize>,
    },
    /// `StridedSlice` node `node` keeps one's own block along `dim` (of a value of local
    /// shape `shape`) by one's coordinates on `axes`: its begin and end operands.
    Slice {
        /// The node's index in the template.
        node: u32,
        /// The prime axes of the device space.
        primes: Vec<usize>,
        /// The axes the block is chosen by, major first.
        axes: Vec<usize>,
        /// The dimension sliced.
        dim: usize,
        /// The local shape being sliced.
        shape: Vec<usize>,
    },
    /// Parameter `param`'s initializer is the block of `layout` this rank holds
    /// ([`Init::Block`]'s `offset`).
    ParamBlock {
        /// The parameter's index.
        param: u32,
        /// Its layout.
        layout: TensorLayout,
    },
    /// Node `node` is marked with the block of `layout` this rank holds (the `global_shape`
    /// and `offset` attributes of [`crate::block`]).
    NodeBlock {
        /// The node's index in the template.
        node: u32,
        /// The layout whose block it marks.
        layout: TensorLayout,
    },
    /// Nodes `nodes` differ with the block of `layout` a rank holds along `dims`: a rank whose
    /// block ranges there are `keys[k]` runs `variants[k]` (one node per entry of `nodes`).
    Variants {
        /// The nodes' indices in the template.
        nodes: Vec<u32>,
        /// The layout whose block decides.
        layout: TensorLayout,
        /// The dimensions of that block that decide.
        dims: Vec<usize>,
        /// Per variant: the block's `(start, end)` along `dims`.
        keys: Vec<Vec<(usize, usize)>>,
        /// Per variant: the nodes.
        variants: Vec<Vec<Node>>,
    },
    /// Point-to-point node `node` (a pipeline stage's `Send` or `Receive`) talks to the rank
    /// `rank + delta`: its `dest_rank` (Send) or `src_rank` (Receive).
    Peer {
        /// The node's index in the template.
        node: u32,
        /// The peer's rank minus this rank (`± k · ranks_per_stage`).
        delta: i64,
    },
}

impl Patch {
    /// The template node the patch rewrites, if it rewrites one node.
    pub fn node(&self) -> Option<u32> {
        match self {
            Patch::Group { node, .. }
            | Patch::Slice { node, .. }
            | Patch::NodeBlock { node, .. }
            | Patch::Peer { node, .. } => Some(*node),
            Patch::ParamBlock { .. } | Patch::Variants { .. } => None,
        }
    }

    /// Renumbers the template nodes the patch refers to (after the template's nodes were
    /// reordered: `new_index[old]`).
    pub fn renumber(&mut self, new_index: &[u32]) {
        match self {
            Patch::Group { node, .. }
            | Patch::Slice { node, .. }
            | Patch::NodeBlock { node, .. }
            | Patch::Peer { node, .. } => {
                *node = new_index[*node as usize];
            }
            Patch::ParamBlock { .. } => {}
            Patch::Variants {
                nodes, variants, ..
            } => {
                for n in nodes.iter_mut() {
                    *n = new_index[*n as usize];
                }
                for v in variants.iter_mut().flatten() {
                    for o in &mut v.inputs {
                        if let Operand::Node(id) = o {
                            id.0 = new_index[id.index()];
                        }
                    }
                }
            }
        }
    }
}

/// Why a program could not be materialized (a malformed program: it names the patch).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("SPMD program `{program}`, rank {rank}: {reason}")]
pub struct SpmdError {
    /// The program's graph name.
    pub program: String,
    /// The rank asked for.
    pub rank: usize,
    /// What is wrong.
    pub reason: String,
}

/// One pipeline stage of a pipelined program: the ranks
/// `first_rank .. first_rank + rank_count` run it (the stage axis is the device matrix's major
/// axis, so a stage's ranks are contiguous).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StageProgram {
    /// The stage's first (global) rank.
    pub first_rank: usize,
    /// How many ranks run the stage (the intra-op mesh: `device_num / stages`).
    pub rank_count: usize,
    /// The stage's first rank's graph: the stage's nodes, only the parameters they read, and
    /// `Send` / `Receive` to the other stages.
    pub template: Graph,
    /// What differs between the stage's ranks, each a function of the **global** rank.
    pub patches: Vec<Patch>,
}

/// The program every rank runs, once: see the module documentation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SpmdProgram {
    /// The number of ranks.
    pub device_num: usize,
    /// Rank 0's graph; when pipelined, the whole (unsplit) step of rank 0's intra-op
    /// position, every parameter and input kept, for code that reads the logical program.
    pub template: Graph,
    /// What differs from rank to rank (of `template`).
    pub patches: Vec<Patch>,
    /// The pipeline stages, in stage order (empty when the program is not pipelined: every
    /// rank then runs `template` patched). When not empty, [`SpmdProgram::materialize`] and
    /// [`SpmdProgram::weights_of`] give a rank its stage's graph.
    pub stages: Vec<StageProgram>,
}

impl SpmdProgram {
    /// The program of one graph that every rank runs unchanged (one device, or a graph with
    /// nothing rank-dependent).
    pub fn uniform(graph: Graph, device_num: usize) -> SpmdProgram {
        SpmdProgram {
            device_num,
            template: graph,
            patches: Vec::new(),
            stages: Vec::new(),
        }
    }

    /// The number of pipeline stages (1 when the program is not pipelined).
    pub fn stage_count(&self) -> usize {
        self.stages.len().max(1)
    }

    /// Whether the program is split into pipeline stages.
    pub fn is_pipelined(&self) -> bool {
        !self.stages.is_empty()
    }

    /// The pipeline stage rank `rank` runs (0 when the program is not pipelined), or an error
    /// when no stage holds it.
    pub fn stage_of(&self, rank: usize) -> Result<usize, SpmdError> {
        self.check_rank(rank)?;
        if self.stages.is_empty() {
            return Ok(0);
        }
        self.stages
            .iter()
            .position(|s| (s.first_rank..s.first_rank + s.rank_count).contains(&rank))
            .ok_or_else(|| self.error(rank, "no pipeline stage holds this rank".into()))
    }

    /// The graph and patches rank `rank` materializes from: its stage's, or the program's.
    fn source_of(&self, rank: usize) -> Result<(&Graph, &[Patch], usize), SpmdError> {
        if self.stages.is_empty() {
            return Ok((&self.template, &self.patches, 0));
        }
        let s = &self.stages[self.stage_of(rank)?];
        Ok((&s.template, &s.patches, s.first_rank))
    }

    /// An error of this program for `rank`.
    fn error(&self, rank: usize, reason: String) -> SpmdError {
        SpmdError {
            program: self.template.name.clone(),
            rank,
            reason,
        }
    }

    /// `rank` is one of the program's ranks.
    fn check_rank(&self, rank: usize) -> Result<(), SpmdError> {
        if rank >= self.device_num {
            return Err(self.error(
                rank,
                format!(
                    "no such rank: the program runs on {} ranks",
                    self.device_num
                ),
            ));
        }
        Ok(())
    }

    /// Rank `rank`'s graph: the template with every patch applied for `rank`.
    pub fn materialize(&self, rank: usize) -> Result<Graph, SpmdError> {
        let fail = |reason: String| self.error(rank, reason);
        self.check_rank(rank)?;
        let (template, patches, first) = self.source_of(rank)?;
        let mut g = template.clone();
        if rank == first {
            return Ok(g);
        }
        for (k, p) in patches.iter().enumerate() {
            self.apply(&mut g, p, rank)
                .map_err(|e| fail(format!("patch {k}: {e}")))?;
        }
        Ok(g)
    }

    /// Rank `rank`'s parameters alone, in a graph of the program's name with no nodes: what a
    /// checkpoint of the rank is checked against (names, types, blocks), without copying the
    /// nodes.
    pub fn weights_of(&self, rank: usize) -> Result<Graph, SpmdError> {
        let fail = |reason: String| self.error(rank, reason);
        self.check_rank(rank)?;
        let (template, patches, _) = self.source_of(rank)?;
        let mut g = Graph::new(template.name.clone());
        g.params = template.params.clone();
        for (k, p) in patches.iter().enumerate() {
            if matches!(p, Patch::ParamBlock { .. }) {
                self.apply(&mut g, p, rank)
                    .map_err(|e| fail(format!("patch {k}: {e}")))?;
            }
        }
        Ok(g)
    }

    /// Applies patch `p` for `rank` to `g` (`g` is the template the patch was made for).
    pub fn apply(&self, g: &mut Graph, p: &Patch, rank: usize) -> Result<(), String> {
        match p {
            Patch::Peer { node, delta } => {
                let peer = rank as i64 + delta;
                if peer < 0 || peer >= self.device_num as i64 {
                    return Err(format!(
                        "node {node}'s peer rank {peer} is outside the {} ranks",
                        self.device_num
                    ));
                }
                let n = g
                    .nodes
                    .get_mut(*node as usize)
                    .ok_or_else(|| format!("node {node} is not in the template"))?;
                let key = match n.op {
                    crate::OpKind::Send => "dest_rank",
                    crate::OpKind::Receive => "src_rank",
                    other => {
                        return Err(format!("node {node} is a {other}, not a Send or Receive"))
                    }
                };
                n.attrs.set(key, Attr::Int(peer));
            }
            Patch::Group { node, primes, axes } => {
                check_space(primes, axes, self.device_num)?;
                let (ranks, _) = group(primes, axes, rank);
                let n = g
                    .nodes
                    .get_mut(*node as usize)
                    .ok_or_else(|| format!("node {node} is not in the template"))?;
                for (k, v) in comm_attrs(&ranks).iter() {
                    n.attrs.set(k, v.clone());
                }
            }
            Patch::Slice {
                node,
                primes,
                axes,
                dim,
                shape,
            } => {
                check_space(primes, axes, self.device_num)?;
                let (begin, end) = slice_bounds(primes, axes, *dim, shape, rank)?;
                let n = g
                    .nodes
                    .get_mut(*node as usize)
                    .ok_or_else(|| format!("node {node} is not in the template"))?;
                if n.inputs.len() < 3 {
                    return Err(format!("node {node} is not a StridedSlice with bounds"));
                }
                n.inputs[1] = Operand::Const(Const::Ints(begin));
                n.inputs[2] = Operand::Const(Const::Ints(end));
            }
            Patch::ParamBlock { param, layout } => {
                let offset: Vec<usize> = layout.block(rank).iter().map(|r| r.start).collect();
                let prm = g
                    .params
                    .get_mut(*param as usize)
                    .ok_or_else(|| format!("parameter {param} is not in the template"))?;
                match &mut prm.kind {
                    ParamKind::Weight {
                        init: Init::Block { offset: o, .. },
                        ..
                    } => *o = offset,
                    _ => {
                        return Err(format!(
                            "parameter {} has no block initializer to place",
                            prm.name
                        ))
                    }
                }
            }
            Patch::NodeBlock { node, layout } => {
                let n = g
                    .nodes
                    .get_mut(*node as usize)
                    .ok_or_else(|| format!("node {node} is not in the template"))?;
                block::Block {
                    global_shape: layout.tensor_shape.clone(),
                    offset: layout.block(rank).iter().map(|r| r.start).collect(),
                }
                .set_on(&mut n.attrs);
            }
            Patch::Variants {
                nodes,
                layout,
                dims,
                keys,
                variants,
            } => {
                let block = layout.block(rank);
                let key: Vec<(usize, usize)> = dims
                    .iter()
                    .map(|&d| block.get(d).map_or((0, 0), |r| (r.start, r.end)))
                    .collect();
                let k = keys
                    .iter()
                    .position(|x| *x == key)
                    .ok_or_else(|| format!("no variant for the block {key:?}"))?;
                let variant = variants
                    .get(k)
                    .filter(|v| v.len() == nodes.len())
                    .ok_or_else(|| format!("variant {k} does not have {} nodes", nodes.len()))?;
                for (&i, n) in nodes.iter().zip(variant) {
                    let slot = g
                        .nodes
                        .get_mut(i as usize)
                        .ok_or_else(|| format!("node {i} is not in the template"))?;
                    *slot = n.clone();
                }
            }
        }
        Ok(())
    }
}

/// `axes` must be axes of `primes`, whose product must be the device count.
fn check_space(primes: &[usize], axes: &[usize], device_num: usize) -> Result<(), String> {
    if primes.iter().product::<usize>() != device_num {
        return Err(format!(
            "the prime axes {primes:?} do not multiply to the {device_num} ranks"
        ));
    }
    if let Some(a) = axes.iter().find(|&&a| a >= primes.len()) {
        return Err(format!("axis {a} is not one of the prime axes {primes:?}"));
    }
    Ok(())
}

/// The begin and end of the block along `dim` that `rank` keeps, of a value of local shape
/// `shape` sliced by its coordinates on `axes`.
pub fn slice_bounds(
    primes: &[usize],
    axes: &[usize],
    dim: usize,
    shape: &[usize],
    rank: usize,
) -> Result<(Vec<i64>, Vec<i64>), String> {
    let (members, own) = group(primes, axes, rank);
    let parts = members.len().max(1);
    let Some(&len) = shape.get(dim) else {
        return Err(format!("dimension {dim} is not in the shape {shape:?}"));
    };
    let sub = len / parts;
    let begin = (0..shape.len())
        .map(|d| if d == dim { (own * sub) as i64 } else { 0 })
        .collect();
    let end = (0..shape.len())
        .map(|d| {
            if d == dim {
                ((own + 1) * sub) as i64
            } else {
                shape[d] as i64
            }
        })
        .collect();
    Ok((begin, end))
}

/// The coordinates of `rank` over the prime axes `primes` (row-major).
pub fn coords(primes: &[usize], rank: usize) -> Vec<usize> {
    let mut c = vec![0; primes.len()];
    let mut r = rank;
    for i in (0..primes.len()).rev() {
        c[i] = r % primes[i];
        r /= primes[i];
    }
    c
}

/// The ranks that share `rank`'s coordinates except on `axes`, in the order of their
/// coordinates over `axes` (major first; ascending when `axes` is); and `rank`'s index among
/// them.
pub fn group(primes: &[usize], axes: &[usize], rank: usize) -> (Vec<usize>, usize) {
    let c = coords(primes, rank);
    let size: usize = axes.iter().map(|&a| primes[a]).product();
    let mut strides = vec![1usize; primes.len()];
    for i in (0..primes.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * primes[i + 1];
    }
    let base: usize = c
        .iter()
        .enumerate()
        .filter(|(i, _)| !axes.contains(i))
        .map(|(i, &x)| x * strides[i])
        .sum();
    let mut ranks = Vec::with_capacity(size);
    for k in 0..size {
        // Mixed-radix digits of k over axes (major first).
        let mut rem = k;
        let mut r = base;
        for &a in axes.iter().rev() {
            r += (rem % primes[a]) * strides[a];
            rem /= primes[a];
        }
        ranks.push(r);
    }
    let mut own = 0;
    for &a in axes {
        own = own * primes[a] + c[a];
    }
    (ranks, own)
}

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

/// The attributes naming a communication group: `group`, `rank_list`, `group_ranks`.
pub fn comm_attrs(ranks: &[usize]) -> Attrs {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_are_row_major() {
        let primes = vec![2, 2, 2];
        assert_eq!(group(&primes, &[1, 2], 0), (vec![0, 1, 2, 3], 0));
        assert_eq!(group(&primes, &[1, 2], 6), (vec![4, 5, 6, 7], 2));
        assert_eq!(group(&primes, &[0], 5), (vec![1, 5], 1));
    }

    #[test]
    fn a_slice_keeps_ones_own_block() {
        let (b, e) = slice_bounds(&[2, 2], &[1], 1, &[4, 8], 3).unwrap();
        assert_eq!((b, e), (vec![0, 4], vec![4, 8]));
        assert!(slice_bounds(&[2, 2], &[1], 2, &[4, 8], 3).is_err());
    }

    #[test]
    fn a_malformed_program_is_an_error_naming_the_patch() {
        let p = SpmdProgram {
            device_num: 4,
            template: Graph::new("Net"),
            patches: vec![Patch::Group {
                node: 7,
                primes: vec![2, 2],
                axes: vec![0],
            }],
            stages: Vec::new(),
        };
        let e = p.materialize(1).unwrap_err().to_string();
        assert!(
            e.contains("rank 1") && e.contains("patch 0") && e.contains("node 7"),
            "{e}"
        );
        assert!(p
            .materialize(4)
            .unwrap_err()
            .to_string()
            .contains("no such rank"));
        let bad = SpmdProgram {
            patches: vec![Patch::Group {
                node: 0,
                primes: vec![2, 3],
                axes: vec![0],
            }],
            ..p
        };
        let e = bad.materialize(1).unwrap_err().to_string();
        assert!(e.contains("do not multiply"), "{e}");
    }
}
