//! Gradient fusion: moves every gradient AllReduce (the `mirror_grad_*` ones the partitioner
//! inserts) to just after its gradient is produced, and groups them into buckets, MindSpore's
//! `comm_fusion={"allreduce": {...}}`; and prefetches the parallel optimizer's weight
//! gathers (`parallel_optimizer_allgather_*`), MindSpore's `comm_fusion={"allgather": ...}`.
//!
//! The partitioner places a weight's gradient AllReduce just before the weight's optimizer
//! update, after the whole backward pass, so nothing could overlap it. This pass:
//!
//! 1. **Hoists** each gradient AllReduce, with the `mirror_grad_*` nodes that feed it (a
//!    ReduceScatter, a scale), to just after the last node it reads. Nodes that read the
//!    AllReduce's result (the `mirror_grad_sum_*` scale, the optimizer update) stay where they
//!    are. Every other node keeps its relative order, so the graph stays a schedule.
//! 2. **Buckets** the gradient AllReduces in production order (the backward order). Only
//!    AllReduces with the same group (`rank_list`), the same `op` and the same dtype share a
//!    bucket. The mode ([`GradFusion`]):
//!    - [`GradFusion::Auto`]: buckets of up to 64 MB (MindSpore's `"auto"`);
//!    - [`GradFusion::SizeMb`]: buckets of up to this many MB (`"size"`): a gradient that
//!      would make the bucket exceed the size starts a new one (a single larger gradient is a
//!      bucket of its own);
//!    - [`GradFusion::Index`]: the trainable parameters (in parameter order) are split before
//!      each listed index (`"index"`, `[20, 35]` = parameters 0–19, 20–34, 35–end); gradients
//!      of one part share a bucket;
//!    - [`GradFusion::Each`]: no `comm_fusion`: every gradient is its own bucket (still given
//!      a bucket id, so that the runtime overlaps it with the rest of the backward pass).
//!
//!    A bucket is also closed before a gradient whose position comes after a node that
//!    already reads a member's result (the runtime launches a bucket when its last member's
//!    input exists, so no member may be needed before that).
//! 3. Writes the bucket id into each member's `fusion` attribute (`fusion: k`, k > 0; 0 = not
//!    fused), numbered from 1 in the order buckets open, and a comment saying which bucket and
//!    why.
//!
//! 4. **Prefetches** the weight gathers ([`is_weight_gather`]: AllGathers along axis 0 of a
//!    parameter, which the parallel optimizer's split weights need before their readers):
//!    they move to the start of the step, in their order, and are bucketed (`fusion: k`
//!    after the gradient buckets' ids) by the cell of their first reader, up to the mode's
//!    size. The runtime launches every bucket as the step starts and waits for one only at
//!    its first reader, so a cell's weights arrive while the cells before it compute
//!    (FSDP's prefetch; MindSpore's parallel optimizer fuses its AllGathers likewise).
//!
//! The pass is deterministic and depends only on the graph's structure and types, so every
//! rank of a data-parallel job gets the same buckets in the same order.

use shardc_ir::spmd::{Patch, SpmdProgram};
use shardc_ir::{Attr, Graph, Node, NodeId, OpKind, Operand};
use std::collections::HashMap;
use thiserror::Error;

/// The prefix of the gradient reducers the partitioner inserts.
pub const MIRROR_PREFIX: &str = "mirror_grad_";

/// Bytes in one MB of a fusion size (MindSpore's MB are MiB).
const MB: f64 = 1024.0 * 1024.0;

/// How gradient AllReduces are grouped into buckets (MindSpore's `comm_fusion.allreduce`).
#[derive(Clone, Debug, PartialEq)]
pub enum GradFusion {
    /// `"auto"`: buckets of up to [`GradFusion::AUTO_BUCKET_MB`] MB.
    Auto,
    /// `"size"`: buckets of up to this many MB (finite, > 0).
    SizeMb(f64),
    /// `"index"`: split the trainable parameter list before each of these strictly increasing
    /// indices.
    Index(Vec<usize>),
    /// No `comm_fusion`: every gradient its own bucket.
    Each,
}

impl GradFusion {
    /// The bucket size of [`GradFusion::Auto`], in MB.
    pub const AUTO_BUCKET_MB: f64 = 64.0;

    /// Checks the configuration: a size must be finite and > 0, indices strictly increasing
    /// and non-empty.
    pub fn validate(&self) -> Result<(), GradFusionError> {
        match self {
            GradFusion::SizeMb(mb) if !(mb.is_finite() && *mb > 0.0) => {
                Err(GradFusionError::Config {
                    value: format!("size {mb}"),
                    reason: "the fusion size in MB must be finite and greater than 0".into(),
                })
            }
            GradFusion::Index(ix) if ix.is_empty() => Err(GradFusionError::Config {
                value: "index []".into(),
                reason: "index mode needs at least one parameter index".into(),
            }),
            GradFusion::Index(ix) => match ix.windows(2).find(|w| w[1] <= w[0]) {
                Some(w) => Err(GradFusionError::Config {
                    value: format!("index {ix:?}"),
                    reason: format!(
                        "parameter indices must be strictly increasing, but {} follows {}",
                        w[1], w[0]
                    ),
                }),
                None => Ok(()),
            },
            _ => Ok(()),
        }
    }

    /// How the mode reads in a dump comment.
    fn describe(&self) -> String {
        match self {
            GradFusion::Auto => format!("comm_fusion auto: {} MB buckets", Self::AUTO_BUCKET_MB),
            GradFusion::SizeMb(mb) => format!("comm_fusion size: {mb} MB buckets"),
            GradFusion::Index(ix) => format!("comm_fusion index: parameters split at {ix:?}"),
            GradFusion::Each => "no comm_fusion: one bucket per gradient".into(),
        }
    }
}

/// An error of the gradient fusion pass.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum GradFusionError {
    /// The fusion configuration is unusable.
    #[error("comm_fusion `{value}`: {reason}")]
    Config {
        /// The configuration, as text.
        value: String,
        /// Why.
        reason: String,
    },
    /// A gradient AllReduce that cannot be fused (no tensor type, an unreadable attribute).
    #[error("grad_fusion: AllReduce '{instance}': {reason}")]
    Node {
        /// The node's instance name.
        instance: String,
        /// Why.
        reason: String,
    },
}

/// One bucket of the result: its id and members, in production order.
#[derive(Clone, Debug, PartialEq)]
pub struct Bucket {
    /// The `fusion` id (> 0).
    pub id: i64,
    /// The member nodes (in the returned graph), in production order.
    pub members: Vec<NodeId>,
    /// The bytes of all members together.
    pub bytes: usize,
}

/// The prefix of the parallel optimizer's weight gathers the partitioner inserts.
pub const GATHER_PREFIX: &str = "parallel_optimizer_allgather_";

/// Whether `node` is a weight gather this pass prefetches: the parallel optimizer's
/// AllGather of a parameter along axis 0.
pub fn is_weight_gather(node: &Node) -> bool {
    node.op == OpKind::AllGather
        && node.instance.starts_with(GATHER_PREFIX)
        && matches!(node.inputs.as_slice(), [Operand::Param(_)])
        && node.attrs.get("axis").and_then(Attr::as_int).unwrap_or(0) == 0
}

/// Whether `g`'s node is a gradient AllReduce this pass fuses.
pub fn is_gradient_all_reduce(node: &shardc_ir::Node) -> bool {
    node.op == OpKind::AllReduce && node.instance.starts_with(MIRROR_PREFIX)
}

/// Runs the pass (see the module doc); returns the new graph and its buckets.
pub fn fuse(g: &Graph, mode: &GradFusion) -> Result<(Graph, Vec<Bucket>), GradFusionError> {
    fuse_owned(g.clone(), mode)
}

/// As [`fuse`], on a graph it may take apart (no node is copied).
pub fn fuse_owned(g: Graph, mode: &GradFusion) -> Result<(Graph, Vec<Bucket>), GradFusionError> {
    mode.validate()?;
    let (g, _) = prefetch(g);
    let (out, _) = hoist(g);
    bucket_and_mark(out, mode, &|_| None)
}

/// The gradient buckets, then the weight-gather buckets (ids after them), of `out` (already
/// prefetched and hoisted), written into their members; `group_of` as in [`bucket`].
fn bucket_and_mark(
    out: Graph,
    mode: &GradFusion,
    group_of: &dyn Fn(usize) -> Option<String>,
) -> Result<(Graph, Vec<Bucket>), GradFusionError> {
    let mut buckets = bucket(&out, mode, group_of)?;
    let gathers = gather_buckets(&out, mode, group_of, buckets.len() as i64 + 1)?;
    let out = mark(
        mark(out, &buckets, mode, Members::Gradients),
        &gathers,
        mode,
        Members::Gathers,
    );
    buckets.extend(gathers);
    Ok((out, buckets))
}

/// The pass on the program every rank runs ([`SpmdProgram`]): its template is fused, the
/// patches follow their nodes, and only AllReduces over the same group *on every rank* (the
/// same prime axes of the same device space) share a bucket, so that every materialized rank
/// has the buckets fusing its own graph would give.
pub fn fuse_program(
    p: SpmdProgram,
    mode: &GradFusion,
) -> Result<(SpmdProgram, Vec<Bucket>), GradFusionError> {
    mode.validate()?;
    let SpmdProgram {
        device_num,
        template,
        patches,
        stages,
    } = p;
    let (mut fused, buckets) = fuse_one(device_num, template, patches, mode)?;
    // A pipelined program: each stage's graph is fused on its own (its ranks run it).
    for s in stages {
        let (f, _) = fuse_one(device_num, s.template, s.patches, mode)?;
        fused.stages.push(shardc_ir::spmd::StageProgram {
            template: f.template,
            patches: f.patches,
            ..s
        });
    }
    Ok((fused, buckets))
}

/// [`fuse_program`] on one template and its patches.
fn fuse_one(
    device_num: usize,
    template: Graph,
    mut patches: Vec<Patch>,
    mode: &GradFusion,
) -> Result<(SpmdProgram, Vec<Bucket>), GradFusionError> {
    let (g, prefetched) = prefetch(template);
    let (out, hoisted) = hoist(g);
    for new_index in [prefetched, hoisted].iter().flatten() {
        for patch in &mut patches {
            patch.renumber(new_index);
        }
    }
    let mut spec: HashMap<usize, String> = HashMap::new();
    for patch in &patches {
        if let Patch::Group { node, primes, axes } = patch {
            spec.insert(*node as usize, format!("{primes:?}/{axes:?}"));
        }
    }
    let (template, buckets) = bucket_and_mark(out, mode, &|i| spec.get(&i).cloned())?;
    Ok((
        SpmdProgram {
            device_num,
            template,
            patches,
            stages: Vec::new(),
        },
        buckets,
    ))
}

/// Moves every weight gather ([`is_weight_gather`]) to the start of `g`, in their order:
/// each reads only its parameter, so it can run as the step begins, and its bucket's
/// AllGather overlaps the compute before its first reader; with the new index of every old
/// node, when any moved.
fn prefetch(g: Graph) -> (Graph, Option<Vec<u32>>) {
    let gathers: Vec<usize> = (0..g.nodes.len())
        .filter(|&i| is_weight_gather(&g.nodes[i]))
        .collect();
    if gathers.iter().enumerate().all(|(k, &i)| k == i) {
        return (g, None);
    }
    let mut order = gathers.clone();
    order.extend((0..g.nodes.len()).filter(|i| gathers.binary_search(i).is_err()));
    let (g, new_index) = reordered(g, &order);
    (g, Some(new_index))
}

/// Groups the weight gathers at the start of `g` ([`prefetch`]) into buckets, ids from
/// `next_id`: consecutive gathers over the same group and dtype whose first readers are in
/// the same cell (scope) share one, up to the mode's size (`auto`: 64 MB of gathered
/// weights; `index`: within one segment of the parameter list; no `comm_fusion`: one per
/// gather). A cell's weights then arrive together, and the next cells' while it computes.
fn gather_buckets(
    g: &Graph,
    mode: &GradFusion,
    group_of: &dyn Fn(usize) -> Option<String>,
    next_id: i64,
) -> Result<Vec<Bucket>, GradFusionError> {
    let users = g.users();
    let limit = match mode {
        GradFusion::SizeMb(mb) => mb * MB,
        _ => GradFusion::AUTO_BUCKET_MB * MB,
    };
    let mut done: Vec<Bucket> = Vec::new();
    let mut open: Option<(String, Bucket)> = None;
    for (i, node) in g.nodes.iter().enumerate() {
        if !is_weight_gather(node) {
            break;
        }
        let ty = node.ty.as_tensor().ok_or_else(|| GradFusionError::Node {
            instance: node.instance.clone(),
            reason: "its result is not a tensor".into(),
        })?;
        let group = group_of(i).unwrap_or_else(|| {
            node.attrs
                .get("rank_list")
                .map_or_else(|| "world".to_string(), |a| a.to_string())
        });
        let reader_scope = users[i]
            .iter()
            .map(|u| u.index())
            .min()
            .map_or("", |u| g.nodes[u].scope.as_str());
        let segment = match mode {
            GradFusion::Index(ix) => weight_index(g, &node.instance)
                .map_or(usize::MAX - i, |w| ix.iter().filter(|&&s| s <= w).count()),
            _ => 0,
        };
        let key = format!("{group}|{}|{reader_scope}|{segment}", ty.dtype);
        let bytes = ty.size_bytes();
        let joins = open.as_ref().is_some_and(|(k, b)| {
            *k == key && !matches!(mode, GradFusion::Each) && (b.bytes + bytes) as f64 <= limit
        });
        if !joins {
            if let Some((_, b)) = open.take() {
                done.push(b);
            }
            let id = next_id + done.len() as i64;
            open = Some((
                key,
                Bucket {
                    id,
                    members: Vec::new(),
                    bytes: 0,
                },
            ));
        }
        if let Some((_, b)) = open.as_mut() {
            b.members.push(NodeId(i as u32));
            b.bytes += bytes;
        }
    }
    done.extend(open.map(|(_, b)| b));
    Ok(done)
}

/// What a bucket's members are, for their comments.
#[derive(Clone, Copy)]
enum Members {
    Gradients,
    Gathers,
}

/// Writes each bucket's id into its members (`fusion: k`) with a comment saying which bucket
/// and why.
fn mark(mut out: Graph, buckets: &[Bucket], mode: &GradFusion, what: Members) -> Graph {
    let how = mode.describe();
    let (kind, held) = match what {
        Members::Gradients => ("gradient fusion:", "in the bucket"),
        Members::Gathers => (
            "parameter prefetch: gathered as the step starts,",
            "gathered in the bucket",
        ),
    };
    for b in buckets {
        for (k, m) in b.members.iter().enumerate() {
            let node = &mut out.nodes[m.index()];
            node.attrs.set("fusion", Attr::Int(b.id));
            node.comments.push(format!(
                "{kind} bucket {} member {} of {} ({} bytes {held}; {how})",
                b.id,
                k + 1,
                b.members.len(),
                b.bytes
            ));
        }
    }
    out
}

/// The new order [`hoist`] builds: nodes placed so far, and the hoisted nodes whose inputs
/// are all placed (`ready`) or how many are not yet (`missing`).
struct Schedule {
    order: Vec<usize>,
    placed: Vec<bool>,
    ready: std::collections::BTreeSet<usize>,
    missing: Vec<usize>,
    hoisted_users: Vec<Vec<usize>>,
}

impl Schedule {
    fn place(&mut self, i: usize) {
        self.order.push(i);
        self.placed[i] = true;
        for &u in &self.hoisted_users[i] {
            self.missing[u] -= 1;
            if self.missing[u] == 0 {
                self.ready.insert(u);
            }
        }
    }

    /// Places the ready hoisted nodes, in passes over their old order.
    fn flush(&mut self) {
        while !self.ready.is_empty() {
            let mut cursor = 0;
            while let Some(&i) = self.ready.range(cursor..).next() {
                self.ready.remove(&i);
                self.place(i);
                cursor = i + 1;
            }
        }
    }
}

/// Moves every gradient AllReduce, and the `mirror_grad_*` nodes feeding it, to just after the
/// last node it reads; with the new index of every old node, when any moved.
fn hoist(g: Graph) -> (Graph, Option<Vec<u32>>) {
    let n = g.nodes.len();
    let mut hoisted = vec![false; n];
    let mut stack: Vec<usize> = (0..n)
        .filter(|&i| is_gradient_all_reduce(&g.nodes[i]))
        .collect();
    while let Some(i) = stack.pop() {
        if hoisted[i] {
            continue;
        }
        hoisted[i] = true;
        for o in &g.nodes[i].inputs {
            if let Operand::Node(s) = o {
                if g.nodes[s.index()].instance.starts_with(MIRROR_PREFIX) && !hoisted[s.index()] {
                    stack.push(s.index());
                }
            }
        }
    }
    if !hoisted.iter().any(|&h| h) {
        return (g, None);
    }
    // New order: the other nodes in their order; each hoisted node as soon as every node it
    // reads is placed. Ready hoisted nodes are placed in passes over their old order (a node
    // that an earlier one of the same pass makes ready joins the pass if it comes later, the
    // next pass otherwise), counting each one's unplaced inputs so that nothing is rescanned.
    let mut missing = vec![0usize; n];
    let mut hoisted_users: Vec<Vec<usize>> = vec![Vec::new(); n];
    for i in (0..n).filter(|&i| hoisted[i]) {
        let mut srcs: Vec<usize> = g.nodes[i]
            .inputs
            .iter()
            .filter_map(|o| match o {
                Operand::Node(s) => Some(s.index()),
                _ => None,
            })
            .collect();
        srcs.sort_unstable();
        srcs.dedup();
        missing[i] = srcs.len();
        for s in srcs {
            hoisted_users[s].push(i);
        }
    }
    let mut s = Schedule {
        order: Vec::with_capacity(n),
        placed: vec![false; n],
        ready: (0..n).filter(|&i| hoisted[i] && missing[i] == 0).collect(),
        missing,
        hoisted_users,
    };
    s.flush();
    for (i, &h) in hoisted.iter().enumerate() {
        if !h {
            s.place(i);
            s.flush();
        }
    }
    // Every hoisted node becomes ready by the end (the old order was a schedule).
    let left: Vec<usize> = (0..n).filter(|&i| hoisted[i] && !s.placed[i]).collect();
    let mut order = s.order;
    order.extend(left);
    let (graph, new_index) = reordered(g, &order);
    (graph, Some(new_index))
}

/// `g` with its nodes in `order` (old indices, each once), operands and outputs renumbered;
/// with the new index of every old node.
fn reordered(g: Graph, order: &[usize]) -> (Graph, Vec<u32>) {
    let n = g.nodes.len();
    let mut new_index = vec![0u32; n];
    for (new, &old) in order.iter().enumerate() {
        new_index[old] = new as u32;
    }
    let remap = |o: &Operand| match o {
        Operand::Node(s) => Operand::Node(NodeId(new_index[s.index()])),
        other => other.clone(),
    };
    let Graph {
        name,
        params,
        nodes,
        outputs,
    } = g;
    // Each old index appears once in `order`: every node moves exactly once.
    let mut slots: Vec<Option<Node>> = nodes.into_iter().map(Some).collect();
    let nodes = order
        .iter()
        .filter_map(|&old| slots[old].take())
        .map(|mut node| {
            for o in &mut node.inputs {
                *o = remap(o);
            }
            node
        })
        .collect();
    let graph = Graph {
        name,
        params,
        nodes,
        outputs: outputs.iter().map(remap).collect(),
    };
    (graph, new_index)
}

/// The trainable-parameter index of the weight whose gradient `instance` reduces
/// (`mirror_grad_<weight>_AllReduce<c>`) or that it gathers
/// (`parallel_optimizer_allgather_<weight>_AllGather<c>`), the longest matching name winning.
fn weight_index(g: &Graph, instance: &str) -> Option<usize> {
    let rest = instance
        .strip_prefix(MIRROR_PREFIX)
        .or_else(|| instance.strip_prefix(GATHER_PREFIX))?;
    g.params
        .iter()
        .filter(|p| p.requires_grad())
        .enumerate()
        .filter(|(_, p)| {
            rest.strip_prefix(p.name.as_str())
                .and_then(|r| r.strip_prefix('_'))
                .is_some()
        })
        .max_by_key(|(_, p)| p.name.len())
        .map(|(k, _)| k)
}

/// An open bucket while walking the gradients.
struct Open {
    id: i64,
    members: Vec<NodeId>,
    bytes: usize,
    /// The earliest position of a node reading a member's result.
    first_use: usize,
    /// The index-mode segment.
    segment: Option<usize>,
}

/// Groups the gradient AllReduces of `g` (already hoisted) into buckets; `group_of` names a
/// node's group where its `rank_list` alone does not say it for every rank.
fn bucket(
    g: &Graph,
    mode: &GradFusion,
    group_of: &dyn Fn(usize) -> Option<String>,
) -> Result<Vec<Bucket>, GradFusionError> {
    let users = g.users();
    let n = g.nodes.len();
    let mut open: HashMap<(String, String, String), Open> = HashMap::new();
    let mut order_of_keys: Vec<(String, String, String)> = Vec::new();
    let mut done: Vec<Open> = Vec::new();
    let mut next_id = 1i64;
    for (i, node) in g.nodes.iter().enumerate() {
        if !is_gradient_all_reduce(node) {
            continue;
        }
        let err = |reason: String| GradFusionError::Node {
            instance: node.instance.clone(),
            reason,
        };
        let ty = node
            .ty
            .as_tensor()
            .ok_or_else(|| err("its result is not a tensor".into()))?;
        let group = group_of(i).unwrap_or_else(|| {
            node.attrs
                .get("rank_list")
                .map_or_else(|| "world".to_string(), |a| a.to_string())
        });
        let op = match node.attrs.get("op") {
            None => "sum".to_string(),
            Some(Attr::Str(s)) => s.clone(),
            Some(other) => return Err(err(format!("attribute `op` {other} is not a name"))),
        };
        let key = (group, op, ty.dtype.to_string());
        let bytes = ty.size_bytes();
        let first_use = users[i].iter().map(|u| u.index()).min().unwrap_or(n);
        let segment = match mode {
            GradFusion::Index(ix) => Some(match weight_index(g, &node.instance) {
                Some(w) => ix.iter().filter(|&&s| s <= w).count(),
                // Not a weight's gradient: a segment of its own.
                None => usize::MAX - i,
            }),
            _ => None,
        };
        let limit = match mode {
            GradFusion::Auto => Some(GradFusion::AUTO_BUCKET_MB * MB),
            GradFusion::SizeMb(mb) => Some(mb * MB),
            _ => None,
        };
        let close = match open.get(&key) {
            None => false,
            Some(b) => {
                b.first_use < i
                    || matches!(mode, GradFusion::Each)
                    || limit.is_some_and(|l| (b.bytes + bytes) as f64 > l)
                    || b.segment != segment
            }
        };
        if close {
            if let Some(b) = open.remove(&key) {
                done.push(b);
            }
        }
        let b = open.entry(key.clone()).or_insert_with(|| {
            let id = next_id;
            next_id += 1;
            Open {
                id,
                members: Vec::new(),
                bytes: 0,
                first_use: n,
                segment,
            }
        });
        b.members.push(NodeId(i as u32));
        b.bytes += bytes;
        b.first_use = b.first_use.min(first_use);
        if !order_of_keys.contains(&key) {
            order_of_keys.push(key);
        }
    }
    for key in order_of_keys {
        if let Some(b) = open.remove(&key) {
            done.push(b);
        }
    }
    done.sort_by_key(|b| b.id);
    Ok(done
        .into_iter()
        .map(|b| Bucket {
            id: b.id,
            members: b.members,
            bytes: b.bytes,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardc_ir::Node;

    #[test]
    fn invalid_configs_are_errors_naming_the_value() {
        let e = GradFusion::SizeMb(0.0).validate().unwrap_err();
        assert!(e.to_string().contains("size 0"), "{e}");
        let e = GradFusion::SizeMb(f64::NAN).validate().unwrap_err();
        assert!(e.to_string().contains("finite"), "{e}");
        let e = GradFusion::Index(vec![3, 2]).validate().unwrap_err();
        assert!(e.to_string().contains("2 follows 3"), "{e}");
        assert!(GradFusion::Index(vec![]).validate().is_err());
        assert!(GradFusion::Index(vec![1, 5]).validate().is_ok());
        assert!(GradFusion::Auto.validate().is_ok());
    }

    use shardc_ir::{Const, DType, Param, ParamKind, TensorType, Type};

    /// `x -> grad<k> = x*2 -> AllReduce` per gradient, named `mirror_grad_w<k>_AllReduce<k>`;
    /// with `reader_after_first`, a node reading the first AllReduce right after it.
    /// Outputs: the reader and every AllReduce.
    fn graph(grads: usize, reader_after_first: bool) -> Graph {
        let mut g = Graph::new("t");
        let t = TensorType::new(DType::Float32, vec![4]);
        let x = Operand::Param(g.add_param(Param {
            name: "x".into(),
            ty: t.clone(),
            kind: ParamKind::Input,
        }));
        let mut outs = Vec::new();
        for k in 0..grads {
            let mut m = Node::new(
                OpKind::Mul,
                vec![x.clone(), Operand::Const(Const::Float(2.0))],
            );
            m.ty = Type::Tensor(t.clone());
            m.instance = format!("grad{k}");
            let m = Operand::Node(g.push_node(m));
            let mut a = Node::new(OpKind::AllReduce, vec![m]);
            a.ty = Type::Tensor(t.clone());
            a.instance = format!("{MIRROR_PREFIX}w{k}_AllReduce{k}");
            a.attrs.set("fusion", Attr::Int(0));
            let a = Operand::Node(g.push_node(a));
            if k == 0 && reader_after_first {
                let mut r = Node::new(
                    OpKind::Mul,
                    vec![a.clone(), Operand::Const(Const::Float(3.0))],
                );
                r.ty = Type::Tensor(t.clone());
                r.instance = "reader".into();
                outs.push(Operand::Node(g.push_node(r)));
            }
            outs.push(a);
        }
        g.outputs = outs;
        g
    }

    fn ids(g: &Graph) -> Vec<i64> {
        g.nodes
            .iter()
            .filter(|n| is_gradient_all_reduce(n))
            .map(|n| match n.attrs.get("fusion") {
                Some(Attr::Int(k)) => *k,
                _ => -1,
            })
            .collect()
    }

    /// Weight gathers of `w0`, `w1` (axis 0) and `w2` (axis 1), each read by a Mul in scope
    /// `cell<k>` placed after the gradients: the axis-0 ones move to the start, in one bucket
    /// per reading cell after the gradient buckets; the axis-1 one stays where it was.
    #[test]
    fn weight_gathers_move_to_the_start_and_bucket_by_reading_cell() {
        let mut g = graph(2, false);
        let whole = TensorType::new(DType::Float32, vec![8]);
        for (k, (axis, cell)) in [(0, "cell0"), (0, "cell0"), (1, "cell1")]
            .into_iter()
            .enumerate()
        {
            let w = g.add_param(Param {
                name: format!("w{k}"),
                ty: TensorType::new(DType::Float32, vec![4]),
                kind: ParamKind::Weight {
                    requires_grad: true,
                    init: shardc_ir::Init::Zeros,
                },
            });
            let mut a = Node::new(OpKind::AllGather, vec![Operand::Param(w)]);
            a.ty = Type::Tensor(whole.clone());
            a.instance = format!("{GATHER_PREFIX}w{k}_AllGather{k}");
            a.attrs.set("axis", Attr::Int(axis));
            let a = g.push_node(a);
            let mut r = Node::new(OpKind::Neg, vec![Operand::Node(a)]);
            r.ty = Type::Tensor(whole.clone());
            r.instance = format!("reader{k}");
            r.scope = cell.into();
            let r = g.push_node(r);
            g.outputs.push(Operand::Node(r));
        }
        let (out, buckets) = fuse(&g, &GradFusion::Auto).unwrap();
        let at = |name: &str| out.nodes.iter().position(|n| n.instance.starts_with(name));
        let fusion = |i: usize| out.nodes[i].attrs.get("fusion").and_then(Attr::as_int);
        let (w0, w1, w2) = (
            at(&format!("{GATHER_PREFIX}w0")).unwrap(),
            at(&format!("{GATHER_PREFIX}w1")).unwrap(),
            at(&format!("{GATHER_PREFIX}w2")).unwrap(),
        );
        assert_eq!((w0, w1), (0, 1), "the axis-0 gathers lead the step");
        assert!(w2 > at("reader1").unwrap(), "the axis-1 gather stays put");
        // The gradients share bucket 1; both gathers of cell0 bucket 2.
        assert_eq!(ids(&out), [1, 1]);
        assert_eq!(
            (fusion(w0), fusion(w1), fusion(w2)),
            (Some(2), Some(2), None)
        );
        assert_eq!(buckets.len(), 2);
        // Every operand still comes before its reader.
        for (i, n) in out.nodes.iter().enumerate() {
            for o in &n.inputs {
                if let Operand::Node(x) = o {
                    assert!(x.index() < i, "{}", n.instance);
                }
            }
        }
    }

    #[test]
    fn buckets_by_mode() {
        let g = graph(4, false);
        assert_eq!(ids(&fuse(&g, &GradFusion::Auto).unwrap().0), [1, 1, 1, 1]);
        assert_eq!(ids(&fuse(&g, &GradFusion::Each).unwrap().0), [1, 2, 3, 4]);
        // 16 bytes each; 40 bytes per bucket: two gradients fit, the third opens a new one.
        let mb = 40.0 / MB;
        let (out, buckets) = fuse(&g, &GradFusion::SizeMb(mb)).unwrap();
        assert_eq!(ids(&out), [1, 1, 2, 2]);
        assert_eq!(
            buckets.iter().map(|b| b.bytes).collect::<Vec<_>>(),
            [32, 32]
        );
        // No trainable weights are named: every gradient is a segment of its own.
        assert_eq!(
            ids(&fuse(&g, &GradFusion::Index(vec![1])).unwrap().0),
            [1, 2, 3, 4]
        );
    }

    #[test]
    fn a_bucket_closes_before_a_gradient_produced_after_a_reader_of_a_member() {
        let g = graph(3, true);
        let (out, buckets) = fuse(&g, &GradFusion::Auto).unwrap();
        assert_eq!(ids(&out), [1, 2, 2]);
        assert_eq!(buckets.len(), 2);
        crate::verify::verify(&out).unwrap_or_else(|e| panic!("{e}"));
    }

    #[test]
    fn a_graph_without_gradients_is_unchanged() {
        let g = Graph::new("empty");
        let (out, buckets) = fuse(&g, &GradFusion::Auto).unwrap();
        assert_eq!(out, g);
        assert!(buckets.is_empty());
    }
}
