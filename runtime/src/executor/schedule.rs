//! The device-independent plan of a step, written once for every executor: what happens at
//! each node of the static schedule (the graph's node order), the communication nodes'
//! calls, the gradient buckets and which nodes wait for them.
//!
//! [`Schedule::new`] checks what the run loop relies on (operands refer to earlier nodes or
//! existing parameters, only `TupleGetItem` reads a tuple, `Assign` writes a weight with a
//! value of its type, outputs exist, a communicator for every communication node), reads
//! every communication node's attributes once ([`comm_call`]), and plans the buckets: the
//! AllReduces (gradients) or AllGathers along axis 0 (the parallel optimizer's weights) with
//! `fusion: k` (k > 0, written by `passes::grad_fusion`) of one bucket are packed, in
//! program order, into one flat buffer of the bucket's dtype, and the bucket's last member
//! launches ONE AllReduce or AllGather of it ([`BucketSpec`]); a node that reads a member's
//! result waits for that bucket first (and a reader before the last member is an error).
//!
//! Every executor (the CPU [`super::Executor`], the CUDA backend's) runs this schedule; what
//! differs between devices (where a buffer lives, how a kernel is launched, how a bucket's
//! AllReduce overlaps compute) is theirs.

use super::comm_call::{comm_call, CommCall};
use crate::comm::Communicator;
use crate::error::RuntimeError;
use crate::memory::node_text;
use crate::tensor::Tensor;
use shardc_ir::{
    Attr, Const, DType, Graph, OpKind, Operand, ParamKind, ReduceOp, TensorType, Type,
};
use std::sync::Arc;

/// What the run loop does at one node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeStep {
    /// Runs the node's kernel (the device's lowering of it).
    Compute,
    /// Nothing at run time: a `TupleGetItem`, whose readers read the tuple element's buffer.
    Alias,
    /// `Assign(param, value)`: the weight `param` (a parameter index) takes the value.
    Assign {
        /// The assigned weight's parameter index.
        param: usize,
    },
    /// A communication node run on its own ([`Schedule::calls`] holds its call).
    Collective,
    /// A member of a gradient bucket (an index into [`Schedule::members`]): its operand is
    /// packed into the bucket's flat buffer; the bucket's last member launches the bucket.
    Pack {
        /// The member.
        member: usize,
    },
}

/// The one collective a bucket runs over its flat buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BucketCollective {
    /// A gradient bucket: an in-place AllReduce of the packed members
    /// ([`BucketSpec::op`]).
    AllReduce,
    /// A parameter-gather bucket (the parallel optimizer's weight AllGathers along axis 0):
    /// the flat buffer holds every rank's blocks in group order (`ranks` ×
    /// [`BucketSpec::per_rank`] elements) followed by this rank's own, which the members pack
    /// ([`BucketSpec::send_region`]); one AllGather fills the first part from the second.
    AllGather {
        /// The group's size.
        ranks: usize,
    },
}

/// A bucket (`fusion: id`): one collective over its members, packed into one flat buffer.
#[derive(Clone, Debug, PartialEq)]
pub struct BucketSpec {
    /// The `fusion` id.
    pub id: i64,
    /// The sorted global ranks of its group.
    pub group: Arc<[usize]>,
    /// Its collective.
    pub collective: BucketCollective,
    /// Its reduction (an AllReduce bucket's; `sum` for a gather).
    pub op: ReduceOp,
    /// The members' dtype.
    pub dtype: DType,
    /// The node of its last member (which launches it).
    pub last: usize,
    /// The members' operands' total elements (one rank's contribution).
    pub per_rank: usize,
    /// The flat buffer's elements: [`BucketSpec::per_rank`] for an AllReduce, `(ranks + 1)`
    /// times it for an AllGather.
    pub elements: usize,
    /// Its members (indices into [`Schedule::members`]), in program order.
    pub members: Vec<usize>,
}

impl BucketSpec {
    /// Where member `m`'s operand is packed in the flat buffer.
    pub fn pack_offset(&self, m: &MemberSpec) -> usize {
        match self.collective {
            BucketCollective::AllReduce => m.offset,
            BucketCollective::AllGather { ranks } => ranks * self.per_rank + m.offset,
        }
    }

    /// The copies `(from, to, len)`, in elements, that make member `m`'s result from the
    /// flat buffer once the collective ran: its reduced elements, or every rank's block of
    /// it, concatenated along axis 0 in group order.
    pub fn unpack_copies(&self, m: &MemberSpec) -> Vec<(usize, usize, usize)> {
        match self.collective {
            BucketCollective::AllReduce => vec![(m.offset, 0, m.len)],
            BucketCollective::AllGather { ranks } => (0..ranks)
                .map(|r| (r * self.per_rank + m.offset, r * m.len, m.len))
                .collect(),
        }
    }

    /// An AllGather bucket's own blocks `(offset, len)`: what it sends.
    pub fn send_region(&self) -> (usize, usize) {
        match self.collective {
            BucketCollective::AllReduce => (0, self.per_rank),
            BucketCollective::AllGather { ranks } => (ranks * self.per_rank, self.per_rank),
        }
    }
}

/// One member of a bucket: an AllReduce of a gradient bucket, or an AllGather of a
/// parameter-gather bucket.
#[derive(Clone, Debug, PartialEq)]
pub struct MemberSpec {
    /// Its node.
    pub node: usize,
    /// Its bucket (an index into [`Schedule::buckets`]).
    pub bucket: usize,
    /// Where its operand's elements start among one rank's ([`BucketSpec::pack_offset`]
    /// places them in the flat buffer).
    pub offset: usize,
    /// How many elements its operand has.
    pub len: usize,
    /// Its result type (an AllReduce's operand's; an AllGather's, the group's size times
    /// along axis 0).
    pub ty: TensorType,
}

/// The step's plan (see the module doc).
#[derive(Clone, Debug)]
pub struct Schedule {
    /// Per node: what the run loop does there.
    pub steps: Vec<NodeStep>,
    /// Per node: a communication node's call (bucket members included).
    pub calls: Vec<Option<Arc<CommCall>>>,
    /// The gradient buckets, by first member.
    pub buckets: Vec<BucketSpec>,
    /// The buckets' members, in program order.
    pub members: Vec<MemberSpec>,
    /// Per node: the members whose results it reads (each once; every one after its
    /// bucket's last member).
    pub reads: Vec<Vec<usize>>,
    /// The members the graph's outputs read.
    pub output_reads: Vec<usize>,
}

impl Schedule {
    /// Checks `graph` and plans its step, the communication nodes' attributes read for
    /// `comm`'s rank and world (none: a communication node is an error).
    pub fn new(graph: &Graph, comm: Option<&dyn Communicator>) -> Result<Schedule, RuntimeError> {
        check(graph, comm.is_some())?;
        let n = graph.nodes.len();
        let mut steps = Vec::with_capacity(n);
        let mut calls = Vec::with_capacity(n);
        for (i, node) in graph.nodes.iter().enumerate() {
            let (step, call) = match node.op {
                OpKind::TupleGetItem => (NodeStep::Alias, None),
                OpKind::Assign => match node.inputs.first() {
                    Some(Operand::Param(p)) => (NodeStep::Assign { param: p.index() }, None),
                    _ => {
                        return Err(graph_error(
                            graph,
                            i,
                            "Assign's first operand must be a weight parameter",
                        ))
                    }
                },
                op if op.is_communication() => {
                    let Some(comm) = comm else {
                        return Err(RuntimeError::NeedsCommunicator {
                            op: node.op,
                            instance: node.instance.clone(),
                        });
                    };
                    if node.ty.as_tensor().is_none() {
                        return Err(graph_error(
                            graph,
                            i,
                            "a communication op must have a tensor result",
                        ));
                    }
                    (
                        NodeStep::Collective,
                        Some(Arc::new(comm_call(graph, i, comm)?)),
                    )
                }
                _ => (NodeStep::Compute, None),
            };
            steps.push(step);
            calls.push(call);
        }
        let (buckets, members) = plan_buckets(graph, &calls)?;
        for (m, mem) in members.iter().enumerate() {
            steps[mem.node] = NodeStep::Pack { member: m };
        }
        let member_of = |o: &Operand| match o {
            Operand::Node(s) => match steps[s.index()] {
                NodeStep::Pack { member } => Some(member),
                _ => None,
            },
            _ => None,
        };
        let mut reads: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (i, node) in graph.nodes.iter().enumerate() {
            for o in &node.inputs {
                let Some(m) = member_of(o) else { continue };
                if reads[i].contains(&m) {
                    continue;
                }
                let bk = &buckets[members[m].bucket];
                if i <= bk.last {
                    return Err(graph_error(
                        graph,
                        i,
                        &format!(
                            "it reads {}, a member of gradient bucket fusion {}, before the \
                             bucket's last member {} (a bucket is reduced only once all its \
                             members exist)",
                            node_text(graph, members[m].node),
                            bk.id,
                            node_text(graph, bk.last)
                        ),
                    ));
                }
                reads[i].push(m);
            }
        }
        let mut output_reads = Vec::new();
        for o in &graph.outputs {
            if let Some(m) = member_of(o) {
                if !output_reads.contains(&m) {
                    output_reads.push(m);
                }
            }
        }
        Ok(Schedule {
            steps,
            calls,
            buckets,
            members,
            reads,
            output_reads,
        })
    }

    /// The member node `i` is, if it is one.
    pub fn member_of(&self, i: usize) -> Option<usize> {
        match self.steps.get(i) {
            Some(NodeStep::Pack { member }) => Some(*member),
            _ => None,
        }
    }

    /// The buckets whose members node `i` reads, ascending.
    pub fn buckets_read(&self, i: usize) -> Vec<usize> {
        let mut b: Vec<usize> = self.reads[i]
            .iter()
            .map(|&m| self.members[m].bucket)
            .collect();
        b.sort_unstable();
        b.dedup();
        b
    }

    /// Every group the step communicates in (each bucket's, each collective's; the whole
    /// world of `world` ranks for a point-to-point transfer), for a communicator that sets
    /// its groups up before the first step (NCCL).
    pub fn groups(&self, world: usize) -> Vec<Vec<usize>> {
        let mut groups: Vec<Vec<usize>> = self.buckets.iter().map(|b| b.group.to_vec()).collect();
        groups.extend(self.calls.iter().flatten().map(|c| match &**c {
            CommCall::AllReduce { group, .. }
            | CommCall::Broadcast { group, .. }
            | CommCall::AllGather { group, .. }
            | CommCall::ReduceScatter { group, .. }
            | CommCall::AllToAll { group, .. } => group.clone(),
            CommCall::Send { .. } | CommCall::Receive { .. } => (0..world).collect(),
        }));
        groups
    }

    /// Runs of two or more adjacent Send and Receive nodes of which none reads another's
    /// result. A device communicator that pairs a send with its receive only when both are
    /// posted (NCCL, HCCL) would wait forever on a ring of sends each followed by a receive
    /// issued one by one; issued as one group, every transfer of the run proceeds together.
    pub fn p2p_runs(&self, graph: &Graph) -> Vec<Vec<usize>> {
        let p2p = |i: usize| {
            matches!(
                self.calls[i].as_deref(),
                Some(CommCall::Send { .. } | CommCall::Receive { .. })
            )
        };
        let mut runs: Vec<Vec<usize>> = Vec::new();
        let mut run: Vec<usize> = Vec::new();
        for i in 0..graph.nodes.len() {
            let reads_run = graph.nodes[i]
                .inputs
                .iter()
                .any(|o| matches!(o, Operand::Node(id) if run.contains(&id.index())));
            if !p2p(i) || reads_run {
                if run.len() > 1 {
                    runs.push(std::mem::take(&mut run));
                }
                run.clear();
            }
            if p2p(i) {
                run.push(i);
            }
        }
        if run.len() > 1 {
            runs.push(run);
        }
        runs
    }
}

/// Nodes launched together: per node, the set (of `sets`, each in program order) it belongs
/// to and whether it launches it (the first). The first member then waits for everything
/// any member waits for: `needs` (per node, what it waits for) is merged into the first's.
pub fn launched_together<'s>(
    sets: impl Iterator<Item = &'s [usize]>,
    needs: &mut [Vec<usize>],
) -> Vec<Option<(usize, bool)>> {
    let mut of = vec![None; needs.len()];
    for (k, nodes) in sets.enumerate() {
        let Some(&first) = nodes.first() else {
            continue;
        };
        for &n in nodes {
            of[n] = Some((k, n == first));
            if n != first {
                let extra = needs[n].clone();
                needs[first].extend(extra);
            }
        }
        needs[first].sort_unstable();
        needs[first].dedup();
    }
    of
}

/// Checks a step's feeds (every data input exactly once, by name, of its type; no weight)
/// and records in `feed_index` (one entry per parameter) the position of each input's feed;
/// `usize::MAX` for weights. Every device binds its feeds through here.
pub fn bind_feeds(
    graph: &Graph,
    feeds: &[(&str, Tensor)],
    feed_index: &mut [usize],
) -> Result<(), RuntimeError> {
    feed_index.fill(usize::MAX);
    for (k, (name, t)) in feeds.iter().enumerate() {
        let Some(pid) = graph.param_by_name(name) else {
            let inputs: Vec<&str> = graph
                .params
                .iter()
                .filter(|p| p.kind == ParamKind::Input)
                .map(|p| p.name.as_str())
                .collect();
            return Err(RuntimeError::UnknownFeed {
                name: name.to_string(),
                graph: graph.name.clone(),
                reason: format!("its inputs are {}", inputs.join(", ")),
            });
        };
        let p = &graph.params[pid.index()];
        if p.is_weight() {
            return Err(RuntimeError::UnknownFeed {
                name: name.to_string(),
                graph: graph.name.clone(),
                reason: "it is a weight; set it with set_param".into(),
            });
        }
        let Some(slot) = feed_index.get_mut(pid.index()) else {
            return Err(RuntimeError::UnknownFeed {
                name: name.to_string(),
                graph: graph.name.clone(),
                reason: "the feed table is shorter than the parameters".into(),
            });
        };
        if *slot != usize::MAX {
            return Err(RuntimeError::DuplicateFeed {
                input: name.to_string(),
            });
        }
        if t.shape != p.ty.shape || t.dtype() != p.ty.dtype || t.len() != p.ty.num_elements() {
            return Err(RuntimeError::FeedMismatch {
                input: p.name.clone(),
                expected: p.ty.clone(),
                got: t.ty(),
            });
        }
        *slot = k;
    }
    for (i, p) in graph.params.iter().enumerate() {
        if p.kind == ParamKind::Input && feed_index.get(i).is_none_or(|&k| k == usize::MAX) {
            return Err(RuntimeError::MissingFeed {
                input: p.name.clone(),
                expected: p.ty.clone(),
            });
        }
    }
    Ok(())
}

fn graph_error(graph: &Graph, i: usize, reason: &str) -> RuntimeError {
    RuntimeError::Graph {
        graph: graph.name.clone(),
        location: node_text(graph, i),
        reason: reason.to_string(),
    }
}

/// The structural checks the run loop relies on (see the module doc).
fn check(graph: &Graph, has_comm: bool) -> Result<(), RuntimeError> {
    let graph_err = |location: String, reason: String| RuntimeError::Graph {
        graph: graph.name.clone(),
        location,
        reason,
    };
    for (i, node) in graph.nodes.iter().enumerate() {
        let loc = || node_text(graph, i);
        if node.op.is_communication() && !has_comm {
            return Err(RuntimeError::NeedsCommunicator {
                op: node.op,
                instance: node.instance.clone(),
            });
        }
        for (j, operand) in node.inputs.iter().enumerate() {
            match operand {
                Operand::Node(src) => {
                    let s = src.index();
                    if s >= i {
                        return Err(graph_err(
                            loc(),
                            format!(
                                "operand {j} refers to %{}, which is not an earlier node",
                                s + 1
                            ),
                        ));
                    }
                    let tuple = matches!(graph.nodes[s].ty, Type::Tuple(_));
                    if tuple && !(node.op == OpKind::TupleGetItem && j == 0) {
                        return Err(graph_err(
                            loc(),
                            format!(
                                "operand {j} reads the tuple result of {}; only TupleGetItem may read a tuple",
                                node_text(graph, s)
                            ),
                        ));
                    }
                    if !tuple && node.op == OpKind::TupleGetItem && j == 0 {
                        return Err(graph_err(
                            loc(),
                            format!(
                                "TupleGetItem reads {}, which is not a tuple",
                                node_text(graph, s)
                            ),
                        ));
                    }
                }
                Operand::Param(p) => {
                    if p.index() >= graph.params.len() {
                        return Err(graph_err(
                            loc(),
                            format!(
                                "operand {j} refers to parameter #{}, which does not exist",
                                p.index() + 1
                            ),
                        ));
                    }
                }
                Operand::Const(_) => {}
            }
        }
        match node.op {
            OpKind::TupleGetItem => {
                let ok = match (node.inputs.first(), node.inputs.get(1)) {
                    (Some(Operand::Node(s)), Some(Operand::Const(Const::Int(k)))) => {
                        usize::try_from(*k)
                            .ok()
                            .and_then(|k| graph.nodes[s.index()].ty.tensors().get(k))
                            .is_some_and(|t| Some(t) == node.ty.as_tensor())
                    }
                    _ => false,
                };
                if !ok || node.inputs.len() != 2 {
                    return Err(graph_err(
                        loc(),
                        "TupleGetItem needs a tuple node and an in-range Int index, and its type must be that element's".into(),
                    ));
                }
            }
            OpKind::Assign => {
                let param = match node.inputs.first() {
                    Some(Operand::Param(p)) if graph.params[p.index()].is_weight() => p,
                    _ => {
                        return Err(graph_err(
                            loc(),
                            "Assign's first operand must be a weight parameter".into(),
                        ))
                    }
                };
                let pty = &graph.params[param.index()].ty;
                let vty = node
                    .inputs
                    .get(1)
                    .and_then(|o| graph.operand_tensor_type(o));
                if node.inputs.len() != 2 || vty != Some(pty) {
                    return Err(graph_err(
                        loc(),
                        format!(
                            "Assign's value must be a tensor of the parameter '{}''s type {pty}",
                            graph.params[param.index()].name
                        ),
                    ));
                }
            }
            _ => {}
        }
    }
    for (k, out) in graph.outputs.iter().enumerate() {
        let bad = match out {
            Operand::Node(n) => n.index() >= graph.nodes.len(),
            Operand::Param(p) => p.index() >= graph.params.len(),
            Operand::Const(_) => true,
        };
        if bad {
            return Err(graph_err(
                format!("output {k}"),
                "must refer to an existing node or parameter".into(),
            ));
        }
    }
    Ok(())
}

/// Finds the buckets (`fusion: k`, k > 0: gradient AllReduces, and the parallel
/// optimizer's AllGathers along axis 0) and checks that each bucket's members agree on
/// collective, group, reduction and dtype.
fn plan_buckets(
    graph: &Graph,
    calls: &[Option<Arc<CommCall>>],
) -> Result<(Vec<BucketSpec>, Vec<MemberSpec>), RuntimeError> {
    let mut members: Vec<MemberSpec> = Vec::new();
    let mut buckets: Vec<BucketSpec> = Vec::new();
    for (i, node) in graph.nodes.iter().enumerate() {
        let err = |reason: String| graph_error(graph, i, &reason);
        let id = match node.attrs.get("fusion") {
            None => continue,
            Some(Attr::Int(k)) if *k > 0 => *k,
            Some(Attr::Int(k)) if *k == 0 => continue,
            Some(other) => {
                return Err(err(format!(
                    "attribute `fusion` must be 0 (not fused) or a bucket id > 0, got {other}"
                )))
            }
        };
        let not_fusable = || {
            err(format!(
                "attribute `fusion` {id}: only AllReduce nodes and AllGather nodes along axis 0 \
                 can be fused, this is {}",
                node.op
            ))
        };
        let Some(ty) = node.ty.as_tensor() else {
            return Err(not_fusable());
        };
        let (group, collective, op, len) = match calls[i].as_deref() {
            Some(CommCall::AllReduce { group, op }) => {
                (group, BucketCollective::AllReduce, *op, ty.num_elements())
            }
            Some(CommCall::AllGather { group, axis: 0 }) if !group.is_empty() => (
                group,
                BucketCollective::AllGather { ranks: group.len() },
                ReduceOp::Sum,
                ty.num_elements() / group.len(),
            ),
            _ => return Err(not_fusable()),
        };
        let b = match buckets.iter().position(|b| b.id == id) {
            Some(b) => {
                let bk = &buckets[b];
                if *bk.group != **group
                    || bk.collective != collective
                    || bk.op != op
                    || bk.dtype != ty.dtype
                {
                    return Err(err(format!(
                        "it is in bucket fusion {id} with {}, but their collectives, groups, \
                         reductions or dtypes differ ({:?} {} {} {} vs. {:?} {} {} {})",
                        node_text(graph, bk.last),
                        bk.collective,
                        crate::comm::RankList(&bk.group),
                        bk.op.name(),
                        bk.dtype,
                        collective,
                        crate::comm::RankList(group),
                        op.name(),
                        ty.dtype
                    )));
                }
                b
            }
            None => {
                buckets.push(BucketSpec {
                    id,
                    group: group.as_slice().into(),
                    collective,
                    op,
                    dtype: ty.dtype,
                    last: i,
                    per_rank: 0,
                    elements: 0,
                    members: Vec::new(),
                });
                buckets.len() - 1
            }
        };
        let bk = &mut buckets[b];
        members.push(MemberSpec {
            node: i,
            bucket: b,
            offset: bk.per_rank,
            len,
            ty: ty.clone(),
        });
        bk.per_rank += len;
        bk.elements = match collective {
            BucketCollective::AllReduce => bk.per_rank,
            BucketCollective::AllGather { ranks } => (ranks + 1) * bk.per_rank,
        };
        bk.last = i;
        bk.members.push(members.len() - 1);
    }
    Ok((buckets, members))
}
