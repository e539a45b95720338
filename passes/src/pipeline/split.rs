//! `pipeline_split`: the program partitioned over one stage's intra-op mesh (`device_num / S`
//! devices) becomes the program of all `device_num` devices, one graph per stage.
//!
//! - **Lift**: every layout gets `S` prepended to its device matrix (its tensor map and
//!   partial axes count from the right, so they do not change), every patch the prime factors
//!   of `S` prepended to its prime axes (its axes shifted): applied for a *global* rank, a
//!   patch gives the groups (within the rank's stage), slices and blocks of that rank.
//! - **Split**: stage `k` keeps its nodes (the forward nodes' `pipeline_stage`, their
//!   gradients', an optimizer update its weight's; a node the partition inserted takes the
//!   smallest stage of its readers, or the largest of its producers when it has none) and
//!   only the parameters they read. A value made on stage `a` and read on stage `b` is a
//!   `Send` on `a` (`dest_rank`, `sr_tag`) and a `Receive` on `b` (`src_rank`, `sr_tag`,
//!   `shape`, `dtype`), the peer `rank ± |b - a| · device_num / S` ([`Patch::Peer`]), the tag
//!   unique per value and reader stage (and so per micro-batch).
//! - **Reduce once**: the micro-batches' gradient terms, each reduced by the partition, are
//!   summed first and reduced once ([`super::accumulate::reduce_once`]: `Add(R(a), R(b))` →
//!   `R(Add(a, b))`; with `gradient_accumulation_shard` the ReduceScatters into the parallel
//!   optimizer's shards stay per micro-batch). This alone is done on one stage.
//! - **Schedule**: each stage's nodes in a priority topological order: a node's slot is the
//!   position of its (phase, micro-batch) in its stage's sequence ([`sequence`]: 1F1B or
//!   GPipe; the backward phase is the scope `Gradients...`), a node without `micro_batch` the
//!   largest slot of its operands; ties keep the original order. Program order stays a
//!   schedule, and as `Send` never blocks and `Receive` does, the 1F1B order does not deadlock.
//!   A `Send` whose next transfer is a `Receive` then goes just before it
//!   (`send_beside_next_receive`), so that a communicator whose sends do block until
//!   received (NCCL, HCCL) issues the two as one group and does not deadlock either.
//!
//! A `OnesLike` (the gradient seed) reads only its operand's type: it is rewired to the start
//! of the chain of same-typed first operands (the first micro-batch's loss rather than the
//! global batch's), so the last stage's first backward does not wait for every forward.

use super::accumulate::reduce_once;
use super::{int_attr, PipelineError, PipelineOptions, Scheduler, MICRO_ATTR, STAGE_ATTR};
use shardc_ir::spmd::{Patch, SpmdProgram, StageProgram};
use shardc_ir::{
    Attr, Graph, Node, NodeId, OpKind, Operand, Param, ParamId, ParamKind, TensorLayout, Type,
};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, HashSet};

fn err(instance: String, reason: String) -> PipelineError {
    PipelineError {
        pass: "pipeline_split",
        instance,
        reason,
    }
}

/// The prime factors of `n`, ascending (none for 1).
pub fn prime_factors(mut n: usize) -> Vec<usize> {
    let mut out = Vec::new();
    let mut p = 2;
    while n > 1 && p * p <= n {
        while n % p == 0 {
            out.push(p);
            n /= p;
        }
        p += 1;
    }
    if n > 1 {
        out.push(n);
    }
    out
}

/// `l` over `stages` times its devices, the stage axis major.
pub fn lift_layout(l: &TensorLayout, stages: usize) -> TensorLayout {
    if stages <= 1 {
        return l.clone();
    }
    let mut out = l.clone();
    out.dev_matrix.insert(0, stages);
    out
}

/// `p` over `stages` times its devices, the stage axes major.
pub fn lift_patch(p: &Patch, stages: usize) -> Patch {
    let f = prime_factors(stages);
    let lift = |primes: &[usize], axes: &[usize]| {
        let mut ps = f.clone();
        ps.extend_from_slice(primes);
        let ax = axes.iter().map(|a| a + f.len()).collect::<Vec<_>>();
        (ps, ax)
    };
    match p {
        Patch::Group { node, primes, axes } => {
            let (primes, axes) = lift(primes, axes);
            Patch::Group {
                node: *node,
                primes,
                axes,
            }
        }
        Patch::Slice {
            node,
            primes,
            axes,
            dim,
            shape,
        } => {
            let (primes, axes) = lift(primes, axes);
            Patch::Slice {
                node: *node,
                primes,
                axes,
                dim: *dim,
                shape: shape.clone(),
            }
        }
        Patch::ParamBlock { param, layout } => Patch::ParamBlock {
            param: *param,
            layout: lift_layout(layout, stages),
        },
        Patch::NodeBlock { node, layout } => Patch::NodeBlock {
            node: *node,
            layout: lift_layout(layout, stages),
        },
        Patch::Variants {
            nodes,
            layout,
            dims,
            keys,
            variants,
        } => Patch::Variants {
            nodes: nodes.clone(),
            layout: lift_layout(layout, stages),
            dims: dims.clone(),
            keys: keys.clone(),
            variants: variants.clone(),
        },
        Patch::Peer { node, delta } => Patch::Peer {
            node: *node,
            delta: *delta,
        },
    }
}

/// Stage `stage` of `stages`' sequence of (backward?, micro-batch) with `micro` micro-batches.
pub fn sequence(
    scheduler: Scheduler,
    stage: usize,
    stages: usize,
    micro: usize,
) -> Vec<(bool, usize)> {
    let micro = micro.max(1);
    match scheduler {
        Scheduler::GPipe => (0..micro)
            .map(|m| (false, m))
            .chain((0..micro).map(|m| (true, m)))
            .collect(),
        Scheduler::OneFOneB => {
            let warm = stages.saturating_sub(stage + 1).min(micro);
            let mut seq: Vec<(bool, usize)> = (0..warm).map(|m| (false, m)).collect();
            for i in 0..micro - warm {
                seq.push((false, warm + i));
                seq.push((true, i));
            }
            seq.extend((micro - warm..micro).map(|m| (true, m)));
            seq
        }
    }
}

/// Whether a node belongs to the backward phase (its scope is `Gradients...`).
fn is_backward(n: &Node) -> bool {
    n.scope.starts_with("Gradients")
}

/// The stage of every node of the (lifted) template; see the module documentation.
fn node_stages(t: &Graph, stages: usize) -> Result<Vec<usize>, PipelineError> {
    let n = t.nodes.len();
    let mut stage: Vec<Option<usize>> = Vec::with_capacity(n);
    for (i, node) in t.nodes.iter().enumerate() {
        let k = match int_attr(node, STAGE_ATTR) {
            None => None,
            Some(k) if k >= 0 && (k as usize) < stages => Some(k as usize),
            Some(k) => {
                return Err(err(
                    super::node_name(t, i),
                    format!("pipeline_stage {k} is not a stage of pipeline_stages {stages}"),
                ))
            }
        };
        stage.push(k);
    }
    // A weight's stage: its staged readers'.
    let mut weight: Vec<Option<usize>> = vec![None; t.params.len()];
    for (i, node) in t.nodes.iter().enumerate() {
        if let Some(k) = stage[i] {
            for o in &node.inputs {
                if let Operand::Param(p) = o {
                    if t.params[p.index()].is_weight() {
                        let w = &mut weight[p.index()];
                        *w = Some(w.map_or(k, |x: usize| x.min(k)));
                    }
                }
            }
        }
    }
    for (i, node) in t.nodes.iter().enumerate() {
        if stage[i].is_none() {
            stage[i] = node
                .inputs
                .iter()
                .filter_map(|o| match o {
                    Operand::Param(p) => weight[p.index()],
                    _ => None,
                })
                .min();
        }
    }
    let users = t.users();
    for i in (0..n).rev() {
        if stage[i].is_none() {
            stage[i] = users[i].iter().filter_map(|u| stage[u.index()]).min();
        }
    }
    for i in 0..n {
        if stage[i].is_none() {
            stage[i] = t.nodes[i]
                .inputs
                .iter()
                .filter_map(|o| match o {
                    Operand::Node(id) => stage[id.index()],
                    _ => None,
                })
                .max();
        }
    }
    Ok(stage.into_iter().map(|k| k.unwrap_or(0)).collect())
}

/// Rewires every `OnesLike` to the start of its operand's chain of same-typed first operands.
fn rewire_seeds(t: &mut Graph) {
    for i in 0..t.nodes.len() {
        if t.nodes[i].op != OpKind::OnesLike {
            continue;
        }
        let Some(Operand::Node(mut v)) = t.nodes[i].inputs.first().cloned() else {
            continue;
        };
        loop {
            let node = &t.nodes[v.index()];
            match node.inputs.first() {
                Some(Operand::Node(u)) if t.nodes[u.index()].ty == node.ty => v = *u,
                _ => break,
            }
        }
        t.nodes[i].inputs[0] = Operand::Node(v);
    }
}

/// An item's order key: (slot, original index, 0 for a Receive / 1 for a node / 2 for a Send).
type Key = (usize, usize, usize);

/// What a stage runs, before ordering.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Item {
    /// The `Receive` of template node `.0` (made on stage `.1`).
    Receive(usize, usize),
    /// Template node `.0`.
    Node(usize),
    /// The `Send` of template node `.0` to stage `.1`.
    Send(usize, usize),
}

/// Per stage: the nodes it runs as a replica of a shared state's update. A parameter that
/// nodes of several stages read and that an `Assign` updates from weight-only values (Adam's
/// `beta1_power` / `beta2_power`: scalars every stage's updates read, multiplied by a
/// constant each step) is kept by every stage that reads it, each running its own copy of
/// the update, as every rank of a data-parallel group does; a trainable weight shared by
/// stages is refused before this (`stages::check`).
fn shared_state_replicas(t: &Graph, stage: &[usize], stages: usize) -> Vec<HashSet<usize>> {
    let mut replicas = vec![HashSet::new(); stages];
    for (a, node) in t.nodes.iter().enumerate() {
        let (OpKind::Assign, Some(Operand::Param(p))) = (node.op, node.inputs.first()) else {
            continue;
        };
        // The update's chain: the Assign and every node it depends on, which must read
        // only parameters that are not data inputs, constants, and each other.
        let mut chain = vec![a];
        let mut k = 0;
        let mut weight_only = true;
        while k < chain.len() && weight_only {
            for o in &t.nodes[chain[k]].inputs {
                match o {
                    Operand::Node(id) => {
                        if !chain.contains(&id.index()) {
                            chain.push(id.index());
                        }
                    }
                    Operand::Param(q) => {
                        weight_only &= !matches!(t.params[q.index()].kind, ParamKind::Input);
                    }
                    Operand::Const(_) => {}
                }
            }
            k += 1;
            weight_only &= chain.len() <= 16;
        }
        if !weight_only {
            continue;
        }
        let readers: HashSet<usize> = t
            .nodes
            .iter()
            .enumerate()
            .filter(|(i, n)| {
                !chain.contains(i)
                    && n.inputs
                        .iter()
                        .any(|o| matches!(o, Operand::Param(q) if q == p))
            })
            .map(|(i, _)| stage[i])
            .collect();
        for k in readers {
            if k != stage[a] {
                replicas[k].extend(chain.iter().copied());
            }
        }
    }
    replicas
}

/// Splits `program` (partitioned over `device_num / S` devices) into its pipeline stages;
/// see the module documentation.
///
/// `accumulate_shards` is the parallel optimizer's `gradient_accumulation_shard`: keep each
/// micro-batch's gradient ReduceScatter and accumulate only the shard
/// ([`super::accumulate::reduce_once`]). On one stage with micro-batches only the accumulation is
/// reduced once.
pub fn pipeline_split(
    mut program: SpmdProgram,
    opts: &PipelineOptions,
    accumulate_shards: bool,
) -> Result<SpmdProgram, PipelineError> {
    let stages = opts.stages;
    if stages <= 1 {
        if opts.micro_size > 1 {
            let (t, patches) = reduce_once(program.template, program.patches, accumulate_shards);
            program.template = t;
            program.patches = patches;
        }
        return Ok(program);
    }
    let per = program.device_num;
    let device_num = per * stages;
    let patches: Vec<Patch> = program
        .patches
        .iter()
        .map(|p| lift_patch(p, stages))
        .collect();
    let (mut t, patches) = reduce_once(program.template, patches, accumulate_shards);
    rewire_seeds(&mut t);
    let stage = node_stages(&t, stages)?;
    let replicas = shared_state_replicas(&t, &stage, stages);
    // Node `i` runs on stage `k`: its own stage, or a replica of a shared state's update.
    let member = |i: usize, k: usize| stage[i] == k || replicas[k].contains(&i);
    for k in 0..stages {
        if !stage.contains(&k) {
            return Err(err(
                String::new(),
                format!("pipeline stage {k} of {stages} has no node"),
            ));
        }
    }
    let seqs: Vec<HashMap<(bool, usize), usize>> = (0..stages)
        .map(|s| {
            sequence(opts.scheduler, s, stages, opts.micro_size)
                .into_iter()
                .enumerate()
                .map(|(i, x)| (x, i))
                .collect()
        })
        .collect();
    let micro = |n: &Node| int_attr(n, MICRO_ATTR).and_then(|m| usize::try_from(m).ok());
    // Each node's (phase, micro-batch): its own, or, for a node without a micro-batch (one
    // the partition inserted, a weight-only computation), the latest of its operands' by its
    // own stage's sequence: a redistribution of a forward value belongs to that forward. A
    // value sent to another stage is received at its label's place in the receiver's
    // sequence, and sent as soon as it is made, so 1F1B's sends always precede the receives
    // that wait for them.
    let pos = |s: usize, l: (bool, usize)| seqs[s].get(&l).copied().unwrap_or(0);
    let mut label: Vec<Option<(bool, usize)>> = vec![None; t.nodes.len()];
    for (i, n) in t.nodes.iter().enumerate() {
        label[i] = match micro(n) {
            Some(m) => Some((is_backward(n), m)),
            None => n
                .inputs
                .iter()
                .filter_map(|o| match o {
                    Operand::Node(id) => label[id.index()],
                    _ => None,
                })
                .max_by_key(|&l| pos(stage[i], l)),
        };
    }
    let slot_on = |s: usize, i: usize| label[i].map(|l| pos(s, l));
    let slot: Vec<usize> = (0..t.nodes.len())
        .map(|i| slot_on(stage[i], i).unwrap_or(0))
        .collect();
    // Cross-stage values: (producer, reader stage) -> tag, in order.
    let mut tags: BTreeMap<(usize, usize), i64> = BTreeMap::new();
    for (i, n) in t.nodes.iter().enumerate() {
        for o in &n.inputs {
            if let Operand::Node(id) = o {
                if !member(id.index(), stage[i]) {
                    let next = tags.len() as i64;
                    tags.entry((id.index(), stage[i])).or_insert(next);
                }
            }
        }
    }
    // Renumber the tags in producer order, so that they read in program order.
    for (k, v) in tags.values_mut().enumerate() {
        *v = k as i64;
    }
    let scratch = SpmdProgram {
        device_num,
        template: Graph::new(t.name.clone()),
        patches: Vec::new(),
        stages: Vec::new(),
    };
    let mut out_stages = Vec::with_capacity(stages);
    for s in 0..stages {
        let first = s * per;
        // The items and their order keys.
        let mut items: Vec<(Item, Key)> = Vec::new();
        let mut first_reader: HashMap<usize, usize> = HashMap::new();
        for (i, n) in t.nodes.iter().enumerate() {
            if !member(i, s) {
                continue;
            }
            items.push((Item::Node(i), (slot[i], i, 1)));
            for o in &n.inputs {
                if let Operand::Node(id) = o {
                    if !member(id.index(), s) {
                        first_reader.entry(id.index()).or_insert(i);
                    }
                }
            }
        }
        for (&(p, b), _) in tags.iter() {
            if stage[p] == s {
                items.push((Item::Send(p, b), (slot[p], p, 2)));
            }
        }
        for (&p, &r) in &first_reader {
            let sl = slot_on(s, p).unwrap_or(0);
            items.push((Item::Receive(p, stage[p]), (sl, r, 0)));
        }
        // Dependencies between items of this stage.
        let index: HashMap<Item, usize> = items
            .iter()
            .enumerate()
            .map(|(k, (it, _))| (*it, k))
            .collect();
        let dep_of = |id: usize| -> Option<usize> {
            if member(id, s) {
                index.get(&Item::Node(id)).copied()
            } else {
                index.get(&Item::Receive(id, stage[id])).copied()
            }
        };
        let mut deps: Vec<Vec<usize>> = vec![Vec::new(); items.len()];
        for (k, (it, _)) in items.iter().enumerate() {
            match *it {
                Item::Node(i) => {
                    for o in &t.nodes[i].inputs {
                        if let Operand::Node(id) = o {
                            if let Some(d) = dep_of(id.index()) {
                                deps[k].push(d);
                            }
                        }
                    }
                    // `Assign(param, v)` writes the parameter after every other read of it.
                    if let (OpKind::Assign, Some(Operand::Param(p))) =
                        (t.nodes[i].op, t.nodes[i].inputs.first())
                    {
                        for (r, (other, _)) in items.iter().enumerate() {
                            if let Item::Node(j) = *other {
                                if j != i
                                    && t.nodes[j]
                                        .inputs
                                        .iter()
                                        .any(|o| matches!(o, Operand::Param(q) if q == p))
                                {
                                    deps[k].push(r);
                                }
                            }
                        }
                    }
                }
                Item::Send(p, _) => deps[k].extend(index.get(&Item::Node(p))),
                Item::Receive(..) => {}
            }
        }
        let order = send_beside_next_receive(priority_order(&items, &deps)?, &items);
        // Emit.
        let mut g = Graph::new(t.name.clone());
        let mut param_map: Vec<Option<ParamId>> = vec![None; t.params.len()];
        for (p, prm) in t.params.iter().enumerate() {
            let read = items.iter().any(|(it, _)| match it {
                Item::Node(i) => t.nodes[*i]
                    .inputs
                    .iter()
                    .any(|o| matches!(o, Operand::Param(q) if q.index() == p)),
                _ => false,
            });
            if read {
                param_map[p] = Some(g.add_param(Param {
                    name: prm.name.clone(),
                    ty: prm.ty.clone(),
                    kind: prm.kind.clone(),
                }));
            }
        }
        let mut node_map: Vec<Option<u32>> = vec![None; t.nodes.len()];
        let mut recv_map: HashMap<usize, NodeId> = HashMap::new();
        let mut peers: Vec<Patch> = Vec::new();
        let map_operand = |o: &Operand,
                           node_map: &[Option<u32>],
                           recv_map: &HashMap<usize, NodeId>|
         -> Result<Operand, PipelineError> {
            Ok(match o {
                Operand::Node(id) if member(id.index(), s) => {
                    Operand::Node(NodeId(node_map[id.index()].ok_or_else(|| {
                        err(
                            super::node_name(&t, id.index()),
                            "is read before it is made".into(),
                        )
                    })?))
                }
                Operand::Node(id) => {
                    Operand::Node(*recv_map.get(&id.index()).ok_or_else(|| {
                        err(
                            super::node_name(&t, id.index()),
                            "is read before it is received".into(),
                        )
                    })?)
                }
                Operand::Param(p) => Operand::Param(param_map[p.index()].ok_or_else(|| {
                    err(
                        t.params[p.index()].name.clone(),
                        "parameter not kept".into(),
                    )
                })?),
                c => c.clone(),
            })
        };
        for k in order {
            match items[k].0 {
                Item::Node(i) => {
                    let mut n = t.nodes[i].clone();
                    n.inputs = n
                        .inputs
                        .iter()
                        .map(|o| map_operand(o, &node_map, &recv_map))
                        .collect::<Result<_, _>>()?;
                    node_map[i] = Some(g.push_node(n).0);
                }
                Item::Send(p, b) => {
                    let src = &t.nodes[p];
                    let x = map_operand(&Operand::Node(NodeId(p as u32)), &node_map, &recv_map)?;
                    let mut n = Node::new(OpKind::Send, vec![x]);
                    n.instance = format!("send_{}_to_stage{b}", src.instance);
                    n.name = "Send".into();
                    n.scope.clone_from(&src.scope);
                    n.ty = src.ty.clone();
                    n.attrs.set("dest_rank", Attr::Int((b * per) as i64));
                    n.attrs.set("sr_tag", Attr::Int(tags[&(p, b)]));
                    n.attrs.set(STAGE_ATTR, Attr::Int(s as i64));
                    if let Some(m) = micro(src) {
                        n.attrs.set(MICRO_ATTR, Attr::Int(m as i64));
                    }
                    let id = g.push_node(n);
                    peers.push(Patch::Peer {
                        node: id.0,
                        delta: (b as i64 - s as i64) * per as i64,
                    });
                }
                Item::Receive(p, a) => {
                    let src = &t.nodes[p];
                    let Type::Tensor(ty) = &src.ty else {
                        return Err(err(
                            super::node_name(&t, p),
                            format!("its tuple value crosses from stage {a} to stage {s}: only tensors are sent between stages"),
                        ));
                    };
                    let mut n = Node::new(OpKind::Receive, Vec::new());
                    n.instance = format!("receive_{}_from_stage{a}", src.instance);
                    n.name = "Receive".into();
                    n.scope.clone_from(&src.scope);
                    n.ty = src.ty.clone();
                    n.attrs.set("src_rank", Attr::Int((a * per) as i64));
                    n.attrs.set("sr_tag", Attr::Int(tags[&(p, s)]));
                    let shape: Vec<i64> = ty.shape.iter().map(|&d| d as i64).collect();
                    n.attrs.set("shape", Attr::ints(&shape));
                    n.attrs.set("dtype", Attr::Str(ty.dtype.name().into()));
                    n.attrs.set(STAGE_ATTR, Attr::Int(s as i64));
                    if let Some(m) = micro(src) {
                        n.attrs.set(MICRO_ATTR, Attr::Int(m as i64));
                    }
                    let id = g.push_node(n);
                    recv_map.insert(p, id);
                    peers.push(Patch::Peer {
                        node: id.0,
                        delta: (a as i64 - s as i64) * per as i64,
                    });
                }
            }
        }
        g.outputs = t
            .outputs
            .iter()
            .filter_map(|o| match o {
                Operand::Node(id) if stage[id.index()] == s => {
                    node_map[id.index()].map(|x| Operand::Node(NodeId(x)))
                }
                _ => None,
            })
            .collect();
        // The patches of this stage's nodes and parameters, renumbered.
        let mut stage_patches = Vec::new();
        for p in &patches {
            let kept = match p {
                Patch::ParamBlock { param, layout } => {
                    param_map[*param as usize].map(|q| Patch::ParamBlock {
                        param: q.0,
                        layout: layout.clone(),
                    })
                }
                Patch::Variants {
                    nodes,
                    layout,
                    dims,
                    keys,
                    variants,
                } => {
                    let mapped: Option<Vec<u32>> =
                        nodes.iter().map(|&i| node_map[i as usize]).collect();
                    match mapped {
                        None => None,
                        Some(new_nodes) => {
                            let mut vs = variants.clone();
                            for n in vs.iter_mut().flatten() {
                                n.inputs = n
                                    .inputs
                                    .iter()
                                    .map(|o| map_operand(o, &node_map, &recv_map))
                                    .collect::<Result<_, _>>()?;
                            }
                            Some(Patch::Variants {
                                nodes: new_nodes,
                                layout: layout.clone(),
                                dims: dims.clone(),
                                keys: keys.clone(),
                                variants: vs,
                            })
                        }
                    }
                }
                other => match other.node().and_then(|i| node_map[i as usize]) {
                    Some(_) => {
                        let mut q = other.clone();
                        let table: Vec<u32> =
                            node_map.iter().map(|x| x.unwrap_or(u32::MAX)).collect();
                        q.renumber(&table);
                        Some(q)
                    }
                    None => None,
                },
            };
            stage_patches.extend(kept);
        }
        stage_patches.extend(peers);
        // The template is the stage's first rank's graph.
        for (k, p) in stage_patches.iter().enumerate() {
            scratch
                .apply(&mut g, p, first)
                .map_err(|e| err(String::new(), format!("stage {s}, patch {k}: {e}")))?;
        }
        out_stages.push(StageProgram {
            first_rank: first,
            rank_count: per,
            template: g,
            patches: stage_patches,
        });
    }
    Ok(SpmdProgram {
        device_num,
        template: t,
        patches,
        stages: out_stages,
    })
}

/// `order` with every `Send` whose next transfer is a `Receive` moved down to just before
/// that `Receive`, so that the two are adjacent. Nothing reads a `Send`'s result, and no
/// transfer lies between its two places, so the order stays a schedule that waits on nothing
/// new. A device communicator whose sends wait for their receiver (NCCL, HCCL) issues adjacent
/// transfers as one group (`runtime::executor::schedule::Schedule::p2p_runs`): 1F1B's "send
/// the activation, receive the gradient" on one stage then pairs with "send the gradient,
/// receive the next activation" on the next, as Megatron-LM's batched send / receive pairs
/// them, where issued one by one each stage's send would wait for the other's.
fn send_beside_next_receive(order: Vec<usize>, items: &[(Item, Key)]) -> Vec<usize> {
    let transfers: Vec<usize> = order
        .iter()
        .copied()
        .filter(|&k| !matches!(items[k].0, Item::Node(_)))
        .collect();
    // Receive item -> the Send that goes just before it.
    let mut before: HashMap<usize, usize> = HashMap::new();
    for w in transfers.windows(2) {
        if let (Item::Send(..), Item::Receive(..)) = (&items[w[0]].0, &items[w[1]].0) {
            before.insert(w[1], w[0]);
        }
    }
    let moved: HashSet<usize> = before.values().copied().collect();
    let mut out = Vec::with_capacity(order.len());
    for k in order {
        if moved.contains(&k) {
            continue;
        }
        if let Some(&send) = before.get(&k) {
            out.push(send);
        }
        out.push(k);
    }
    out
}

/// A topological order of `items` (each after its `deps`), the ready item with the smallest
/// key first.
fn priority_order(items: &[(Item, Key)], deps: &[Vec<usize>]) -> Result<Vec<usize>, PipelineError> {
    let mut missing: Vec<usize> = deps.iter().map(Vec::len).collect();
    let mut users: Vec<Vec<usize>> = vec![Vec::new(); items.len()];
    for (k, ds) in deps.iter().enumerate() {
        for &d in ds {
            users[d].push(k);
        }
    }
    let mut ready: BinaryHeap<Reverse<(Key, usize)>> = BinaryHeap::new();
    for (k, m) in missing.iter().enumerate() {
        if *m == 0 {
            ready.push(Reverse((items[k].1, k)));
        }
    }
    let mut order = Vec::with_capacity(items.len());
    while let Some(Reverse((_, k))) = ready.pop() {
        order.push(k);
        for &u in &users[k] {
            missing[u] -= 1;
            if missing[u] == 0 {
                ready.push(Reverse((items[u].1, u)));
            }
        }
    }
    if order.len() != items.len() {
        return Err(err(
            String::new(),
            "a stage's nodes do not form an acyclic graph".into(),
        ));
    }
    Ok(order)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_f_one_b_and_gpipe_sequences() {
        let f = |m| (false, m);
        let b = |m| (true, m);
        assert_eq!(
            sequence(Scheduler::OneFOneB, 0, 2, 4),
            vec![f(0), f(1), b(0), f(2), b(1), f(3), b(2), b(3)]
        );
        assert_eq!(
            sequence(Scheduler::OneFOneB, 1, 2, 4),
            vec![f(0), b(0), f(1), b(1), f(2), b(2), f(3), b(3)]
        );
        assert_eq!(
            sequence(Scheduler::GPipe, 1, 2, 2),
            vec![f(0), f(1), b(0), b(1)]
        );
        // More stages than micro-batches: every forward is warm-up.
        assert_eq!(
            sequence(Scheduler::OneFOneB, 0, 4, 2),
            vec![f(0), f(1), b(0), b(1)]
        );
    }

    #[test]
    fn a_send_whose_next_transfer_is_a_receive_goes_just_before_it() {
        // Stage 0 of 1F1B: send a0, compute, send a1, compute, receive g0, send a2, receive g1.
        let k = (0, 0, 0);
        let items = vec![
            (Item::Node(0), k),
            (Item::Send(0, 1), k),
            (Item::Node(1), k),
            (Item::Send(1, 1), k),
            (Item::Node(2), k),
            (Item::Receive(9, 1), k),
            (Item::Node(3), k),
            (Item::Send(3, 1), k),
            (Item::Receive(8, 1), k),
            (Item::Node(4), k),
        ];
        let order = send_beside_next_receive((0..items.len()).collect(), &items);
        // a0 is followed by another send and stays; a1 moves past node 2 to the receive.
        assert_eq!(order, vec![0, 1, 2, 4, 3, 5, 6, 7, 8, 9]);
        // A receive first, or sends with no receive after them, stay where they are.
        let tail = vec![
            (Item::Receive(9, 1), k),
            (Item::Node(0), k),
            (Item::Send(0, 1), k),
            (Item::Node(1), k),
        ];
        assert_eq!(
            send_beside_next_receive(vec![0, 1, 2, 3], &tail),
            vec![0, 1, 2, 3]
        );
    }

    #[test]
    fn lifting_keeps_blocks_within_the_stage() {
        let l = TensorLayout {
            dev_matrix: vec![2, 1],
            tensor_map: vec![1, -1],
            tensor_shape: vec![8, 4],
            partial: vec![],
            partial_op: shardc_ir::ReduceOp::Sum,
        };
        let lifted = lift_layout(&l, 2);
        assert_eq!(lifted.dev_matrix, vec![2, 2, 1]);
        for r in 0..4 {
            assert_eq!(lifted.block(r), l.block(r % 2), "rank {r}");
        }
        let p = lift_patch(
            &Patch::Group {
                node: 3,
                primes: vec![2],
                axes: vec![0],
            },
            4,
        );
        assert_eq!(
            p,
            Patch::Group {
                node: 3,
                primes: vec![2, 2, 2],
                axes: vec![2]
            }
        );
        let Patch::Group { primes, axes, .. } = p else {
            unreachable!()
        };
        assert_eq!(shardc_ir::spmd::group(&primes, &axes, 5).0, vec![4, 5]);
        assert_eq!(prime_factors(12), vec![2, 2, 3]);
    }
}
