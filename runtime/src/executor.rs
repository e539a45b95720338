//! The executor: runs a graph step after step on a [`Backend`], with its weights kept between
//! steps and its intermediate values in the buffers of a [`MemoryPlan`].
//!
//! Nodes run in graph order (the static schedule). Each compute node gets its operands as
//! [`Arg`]s (weights, fed inputs, earlier results, constants) and its outputs as the plan's
//! buffers, shaped to the node's result type. `TupleGetItem` is an alias resolved at planning
//! time (no copy). `Assign(param, value)` gives the parameter the value: by swapping the
//! buffer with the parameter's storage when the value has no later use, by copying
//! otherwise. All buffers are allocated when the executor is created; steps reuse them.
//!
//! Communication nodes run through a [`Communicator`] (see [`Executor::with_communicator`]);
//! their attributes are read and checked when the executor is created, and their results
//! live in ordinary plan buffers.

use crate::backend::{Arg, Backend, KernelContext, KernelError};
use crate::comm::{CommError, Communicator};
use crate::error::RuntimeError;
use crate::init::{describe, init_tensor};
use crate::memory::{node_text, plan_with, Allocator, Location, MemoryPlan};
use crate::tensor::{Data, Tensor};
use shardc_ir::{Attr, Const, Graph, OpKind, Operand, ParamKind, ReduceOp, TensorType, Type};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where an operand's tensor comes from at run time.
#[derive(Clone, Copy, Debug)]
enum Src {
    /// An intermediate buffer.
    Buffer(usize),
    /// A weight parameter (by parameter index).
    Weight(usize),
    /// A data input (by parameter index).
    Input(usize),
    /// The node's constant operand at the same position.
    Const,
}

/// What the executor does at one node.
#[derive(Debug)]
enum Step {
    /// Run the backend kernel.
    Compute {
        args: Vec<Src>,
        outs: Vec<usize>,
        types: Vec<TensorType>,
    },
    /// Nothing at run time (a `TupleGetItem`: its users read the tuple element's buffer).
    Alias,
    /// The weight `param` takes `value`; `swap` when the value's buffer can be moved.
    Assign {
        param: usize,
        value: Src,
        swap: bool,
    },
    /// A communication node: its collective, its tensor operand (none for `Receive`), its
    /// output buffer and type.
    Comm {
        call: CommCall,
        input: Option<Src>,
        out: usize,
        ty: TensorType,
    },
}

/// A communication node's call, its attributes resolved (groups sorted, axes normalised).
#[derive(Debug, Clone)]
enum CommCall {
    AllReduce {
        group: Vec<usize>,
        op: ReduceOp,
    },
    AllGather {
        group: Vec<usize>,
        axis: usize,
    },
    ReduceScatter {
        group: Vec<usize>,
        op: ReduceOp,
        axis: usize,
    },
    AllToAll {
        group: Vec<usize>,
        split_dim: usize,
        concat_dim: usize,
    },
    Broadcast {
        group: Vec<usize>,
        root: usize,
    },
    Send {
        dest: usize,
        tag: i64,
    },
    Receive {
        src: usize,
        tag: i64,
    },
}

/// Cumulative time and count of one op kind.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct OpStats {
    /// Number of kernel calls.
    pub count: u64,
    /// Total time in those calls.
    pub time: Duration,
}

/// Execution statistics, cumulative over all steps.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ExecStats {
    /// Per op kind: calls and time (kernels, and `Assign` copies).
    pub per_op: BTreeMap<OpKind, OpStats>,
    /// Steps run.
    pub steps: u64,
    /// Total time of the steps (feeds checking, kernels, copies, outputs).
    pub total: Duration,
    /// Buffer allocations: one per plan buffer when the executor is created, plus one for
    /// every time a step had to allocate a buffer (which a correct plan never does).
    pub buffer_allocations: u64,
}

impl fmt::Display for ExecStats {
    /// A table of op kinds by total time, then the step totals.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut rows: Vec<(&OpKind, &OpStats)> = self.per_op.iter().collect();
        rows.sort_by(|a, b| b.1.time.cmp(&a.1.time).then(a.0.cmp(b.0)));
        let kernel_total: Duration = rows.iter().map(|r| r.1.time).sum();
        writeln!(
            f,
            "{:<36} {:>8} {:>12} {:>12} {:>7}",
            "op", "calls", "total ms", "mean us", "share"
        )?;
        for (op, s) in rows {
            let ms = s.time.as_secs_f64() * 1e3;
            let mean_us = if s.count > 0 {
                s.time.as_secs_f64() * 1e6 / s.count as f64
            } else {
                0.0
            };
            let share = if kernel_total > Duration::ZERO {
                100.0 * s.time.as_secs_f64() / kernel_total.as_secs_f64()
            } else {
                0.0
            };
            writeln!(
                f,
                "{:<36} {:>8} {:>12.3} {:>12.1} {:>6.1}%",
                op.name(),
                s.count,
                ms,
                mean_us,
                share
            )?;
        }
        let per_step = if self.steps > 0 {
            self.total.as_secs_f64() * 1e3 / self.steps as f64
        } else {
            0.0
        };
        write!(
            f,
            "{} steps in {:.3} ms ({:.3} ms per step; kernels {:.3} ms); {} buffer allocations",
            self.steps,
            self.total.as_secs_f64() * 1e3,
            per_step,
            kernel_total.as_secs_f64() * 1e3,
            self.buffer_allocations
        )
    }
}

/// Runs a graph, step after step (see the module doc).
pub struct Executor {
    graph: Graph,
    backend: Arc<dyn Backend>,
    comm: Option<Arc<dyn Communicator>>,
    plan: MemoryPlan,
    steps: Vec<Step>,
    outputs: Vec<Src>,
    /// Per parameter: its value when it is a weight.
    weights: Vec<Option<Tensor>>,
    /// The plan's buffers.
    pool: Vec<Tensor>,
    /// Per parameter: the index of its feed in the current step.
    feed_index: Vec<usize>,
    /// Output tensors of the running node, moved out of the pool for the kernel call.
    scratch: Vec<Tensor>,
    step_count: u64,
    stats: ExecStats,
}

impl fmt::Debug for Executor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Executor")
            .field("graph", &self.graph.name)
            .field("backend", &self.backend.name())
            .field("buffers", &self.pool.len())
            .field("step_count", &self.step_count)
            .finish()
    }
}

/// A tensor with no storage (a placeholder while a buffer is lent out).
fn empty_tensor() -> Tensor {
    Tensor {
        shape: Vec::new(),
        data: Data::F32(Vec::new()),
    }
}

/// Capacity in elements of a tensor's storage.
fn capacity(t: &Tensor) -> usize {
    match &t.data {
        Data::F32(v) => v.capacity(),
        Data::F64(v) => v.capacity(),
        Data::F16(v) => v.capacity(),
        Data::BF16(v) => v.capacity(),
        Data::I32(v) => v.capacity(),
        Data::I64(v) => v.capacity(),
        Data::Bool(v) => v.capacity(),
    }
}

/// Gives `t` the type `ty` within its storage. Returns whether the storage had to grow (an
/// allocation). A buffer whose dtype differs is replaced (also an allocation).
fn shape_buffer(t: &mut Tensor, ty: &TensorType) -> bool {
    let len = ty.num_elements();
    if t.shape != ty.shape {
        t.shape.clear();
        t.shape.extend_from_slice(&ty.shape);
    }
    if t.dtype() != ty.dtype {
        t.data = Data::zeros(ty.dtype, len);
        return true;
    }
    let grew = len > capacity(t);
    match &mut t.data {
        Data::F32(v) => v.resize(len, 0.0),
        Data::F64(v) => v.resize(len, 0.0),
        Data::F16(v) => v.resize(len, half::f16::ZERO),
        Data::BF16(v) => v.resize(len, half::bf16::ZERO),
        Data::I32(v) => v.resize(len, 0),
        Data::I64(v) => v.resize(len, 0),
        Data::Bool(v) => v.resize(len, false),
    }
    grew
}

/// Copies `src`'s elements into `dst` (same dtype and length, checked by the caller's
/// planning). Returns false when they do not match.
fn copy_into(dst: &mut Tensor, src: &Tensor) -> bool {
    let ok = match (&mut dst.data, &src.data) {
        (Data::F32(d), Data::F32(s)) if d.len() == s.len() => {
            d.copy_from_slice(s);
            true
        }
        (Data::F64(d), Data::F64(s)) if d.len() == s.len() => {
            d.copy_from_slice(s);
            true
        }
        (Data::F16(d), Data::F16(s)) if d.len() == s.len() => {
            d.copy_from_slice(s);
            true
        }
        (Data::BF16(d), Data::BF16(s)) if d.len() == s.len() => {
            d.copy_from_slice(s);
            true
        }
        (Data::I32(d), Data::I32(s)) if d.len() == s.len() => {
            d.copy_from_slice(s);
            true
        }
        (Data::I64(d), Data::I64(s)) if d.len() == s.len() => {
            d.copy_from_slice(s);
            true
        }
        (Data::Bool(d), Data::Bool(s)) if d.len() == s.len() => {
            d.copy_from_slice(s);
            true
        }
        _ => false,
    };
    if ok && dst.shape != src.shape {
        dst.shape.clone_from(&src.shape);
    }
    ok
}

/// The tensor of a source, borrowing from the pool, the weights or the feeds.
fn fetch<'a>(
    src: Src,
    pool: &'a [Tensor],
    weights: &'a [Option<Tensor>],
    feeds: &'a [(&str, Tensor)],
    feed_index: &[usize],
) -> Option<&'a Tensor> {
    match src {
        Src::Buffer(b) => pool.get(b),
        Src::Weight(p) => weights.get(p).and_then(Option::as_ref),
        Src::Input(p) => feed_index
            .get(p)
            .and_then(|&k| feeds.get(k))
            .map(|(_, t)| t),
        Src::Const => None,
    }
}

impl Executor {
    /// Plans and prepares `graph` (types already verified by the compiler). Weights are
    /// initialised from their `Init`; all intermediate buffers are allocated.
    ///
    /// Errors: a communication op (no communicator here), an initializer that cannot produce
    /// its weight, or a malformed graph (dangling operand, a tuple read as a tensor, an
    /// `Assign` to a data input or of a mistyped value, a constant output).
    pub fn new(graph: Graph, backend: Arc<dyn Backend>) -> Result<Executor, RuntimeError> {
        Executor::with_allocator(graph, backend, Allocator::Best)
    }

    /// As [`Executor::new`], with the memory plan's buffers packed by `allocator`.
    pub fn with_allocator(
        graph: Graph,
        backend: Arc<dyn Backend>,
        allocator: Allocator,
    ) -> Result<Executor, RuntimeError> {
        Executor::build(graph, backend, allocator, None)
    }

    /// As [`Executor::new`], for a per-rank graph whose communication nodes run through
    /// `comm` (kernels see `comm.rank()` as [`KernelContext::rank`]).
    ///
    /// Attributes read (checked here; errors name the node, the value and the reason):
    /// `rank_list` (tuple of global ranks; absent: the whole world; sorted, so member order
    /// is ascending rank; must hold this rank) on every collective; `op` (sum | max | min |
    /// prod, default sum) on `AllReduce` and `ReduceScatter`; `axis` (default 0, negative
    /// counts from the end) on `AllGather` and `ReduceScatter`; `split_dim`, `concat_dim`
    /// and `split_count` (must equal the group size when present) on `AlltoAll`;
    /// `root_rank` (a global rank in the group, default 0) on `Broadcast`; `dest_rank` and
    /// `sr_tag` (default 0) on `Send`; `src_rank` and `sr_tag` on `Receive` (whose
    /// shape and dtype are its result type).
    pub fn with_communicator(
        graph: Graph,
        backend: Arc<dyn Backend>,
        comm: Arc<dyn Communicator>,
    ) -> Result<Executor, RuntimeError> {
        Executor::build(graph, backend, Allocator::Best, Some(comm))
    }

    /// As [`Executor::with_communicator`], with the memory plan's buffers packed by
    /// `allocator`.
    pub fn with_communicator_and_allocator(
        graph: Graph,
        backend: Arc<dyn Backend>,
        comm: Arc<dyn Communicator>,
        allocator: Allocator,
    ) -> Result<Executor, RuntimeError> {
        Executor::build(graph, backend, allocator, Some(comm))
    }

    fn build(
        graph: Graph,
        backend: Arc<dyn Backend>,
        allocator: Allocator,
        comm: Option<Arc<dyn Communicator>>,
    ) -> Result<Executor, RuntimeError> {
        let gname = graph.name.clone();
        let graph_err = |location: String, reason: String| RuntimeError::Graph {
            graph: gname.clone(),
            location,
            reason,
        };

        // Weights.
        let mut weights = Vec::with_capacity(graph.params.len());
        for p in &graph.params {
            match &p.kind {
                ParamKind::Input => weights.push(None),
                ParamKind::Weight { init, .. } => {
                    let t = init_tensor(init, &p.ty).map_err(|e| match e {
                        RuntimeError::Init { reason, .. } => RuntimeError::Init {
                            target: format!(
                                "parameter '{}' {} with {}",
                                p.name,
                                p.ty,
                                describe(init)
                            ),
                            reason,
                        },
                        other => other,
                    })?;
                    weights.push(Some(t));
                }
            }
        }

        // Structural checks the plan relies on.
        for (i, node) in graph.nodes.iter().enumerate() {
            let loc = || node_text(&graph, i);
            if node.op.is_communication() && comm.is_none() {
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
                                    node_text(&graph, s)
                                ),
                            ));
                        }
                        if !tuple && node.op == OpKind::TupleGetItem && j == 0 {
                            return Err(graph_err(
                                loc(),
                                format!(
                                    "TupleGetItem reads {}, which is not a tuple",
                                    node_text(&graph, s)
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

        let plan = plan_with(&graph, allocator);

        // Resolve every operand to its run-time source.
        let src_of = |operand: &Operand| -> Src {
            match operand {
                Operand::Node(n) => match plan.location(n.index(), 0) {
                    Some(Location::Param(p)) => Src::Weight(p.index()),
                    Some(Location::Buffer(b)) => Src::Buffer(b),
                    None => Src::Buffer(usize::MAX),
                },
                Operand::Param(p) => {
                    if graph.params[p.index()].is_weight() {
                        Src::Weight(p.index())
                    } else {
                        Src::Input(p.index())
                    }
                }
                Operand::Const(_) => Src::Const,
            }
        };
        let mut steps = Vec::with_capacity(graph.nodes.len());
        for (i, node) in graph.nodes.iter().enumerate() {
            let step = match node.op {
                OpKind::TupleGetItem => Step::Alias,
                OpKind::Assign => {
                    let param = match node.inputs[0] {
                        Operand::Param(p) => p.index(),
                        _ => unreachable!("checked above"),
                    };
                    let value = src_of(&node.inputs[1]);
                    let swap = match (&node.inputs[1], value) {
                        (Operand::Node(n), Src::Buffer(b)) => {
                            let v = &plan.values[n.index()][0];
                            v.last_use == i && plan.buffers[b].elements == pty_elems(&graph, param)
                        }
                        _ => false,
                    };
                    Step::Assign { param, value, swap }
                }
                op if op.is_communication() => {
                    let comm = comm
                        .as_deref()
                        .ok_or_else(|| RuntimeError::NeedsCommunicator {
                            op: node.op,
                            instance: node.instance.clone(),
                        })?;
                    let call = comm_call(&graph, i, comm)?;
                    let input = match node.op {
                        OpKind::Receive => None,
                        _ => Some(src_of(&node.inputs[0])),
                    };
                    let out = match plan.values[i].first().map(|v| v.location) {
                        Some(Location::Buffer(b)) => b,
                        _ => usize::MAX,
                    };
                    let ty = node.ty.as_tensor().cloned().ok_or_else(|| {
                        graph_err(
                            node_text(&graph, i),
                            "a communication op must have a tensor result".into(),
                        )
                    })?;
                    Step::Comm {
                        call,
                        input,
                        out,
                        ty,
                    }
                }
                _ => {
                    let args = node.inputs.iter().map(src_of).collect();
                    let outs = plan.values[i]
                        .iter()
                        .map(|v| match v.location {
                            Location::Buffer(b) => b,
                            Location::Param(_) => usize::MAX,
                        })
                        .collect();
                    let types = node.ty.tensors().to_vec();
                    Step::Compute { args, outs, types }
                }
            };
            steps.push(step);
        }
        let mut outputs = Vec::new();
        for out in &graph.outputs {
            match out {
                Operand::Node(n) => {
                    for v in &plan.values[n.index()] {
                        outputs.push(match v.location {
                            Location::Buffer(b) => Src::Buffer(b),
                            Location::Param(p) => Src::Weight(p.index()),
                        });
                    }
                }
                other => outputs.push(src_of(other)),
            }
        }

        let pool: Vec<Tensor> = plan
            .buffers
            .iter()
            .map(|b| Tensor {
                shape: vec![b.elements],
                data: Data::zeros(b.dtype, b.elements),
            })
            .collect();
        let stats = ExecStats {
            buffer_allocations: pool.len() as u64,
            ..ExecStats::default()
        };
        let nparams = graph.params.len();
        Ok(Executor {
            graph,
            backend,
            comm,
            plan,
            steps,
            outputs,
            weights,
            pool,
            feed_index: vec![usize::MAX; nparams],
            scratch: Vec::new(),
            step_count: 0,
            stats,
        })
    }

    /// Runs one step: `feeds` give every data input by name (type checked). Returns the
    /// graph's outputs in order, the loss first; a tuple-typed output contributes each of its
    /// elements. Weights persist across steps; `Assign` nodes update them.
    ///
    /// A step that fails in a kernel may have updated some weights already (those assigned
    /// before the failing node).
    pub fn step(&mut self, feeds: &[(&str, Tensor)]) -> Result<Vec<Tensor>, RuntimeError> {
        let start = Instant::now();
        self.bind_feeds(feeds)?;
        let ctx = KernelContext {
            step: self.step_count,
            rank: self
                .comm
                .as_ref()
                .map_or(0, |c| u32::try_from(c.rank()).unwrap_or(u32::MAX)),
        };
        let Executor {
            graph,
            backend,
            comm,
            steps,
            weights,
            pool,
            feed_index,
            scratch,
            stats,
            outputs,
            ..
        } = self;
        for (i, (node, step)) in graph.nodes.iter().zip(steps.iter()).enumerate() {
            match step {
                Step::Alias => {}
                Step::Compute { args, outs, types } => {
                    scratch.clear();
                    for (&b, ty) in outs.iter().zip(types) {
                        let mut t = std::mem::replace(&mut pool[b], empty_tensor());
                        if shape_buffer(&mut t, ty) {
                            stats.buffer_allocations += 1;
                        }
                        scratch.push(t);
                    }
                    let t0 = Instant::now();
                    let result = {
                        let mut inputs: Vec<Arg<'_>> = Vec::with_capacity(args.len());
                        let mut missing = None;
                        for (k, &src) in args.iter().enumerate() {
                            let arg = match (src, &node.inputs[k]) {
                                (Src::Const, Operand::Const(c)) => Some(Arg::Const(c)),
                                _ => fetch(src, pool, weights, feeds, feed_index).map(Arg::Tensor),
                            };
                            match arg {
                                Some(a) => inputs.push(a),
                                None => missing = missing.or(Some(k)),
                            }
                        }
                        match missing {
                            None => backend.run(node, &inputs, scratch, &ctx),
                            Some(k) => Err(KernelError::new(
                                node,
                                format!("the executor has no value for operand {k}"),
                            )),
                        }
                    };
                    let dt = t0.elapsed();
                    let entry = stats.per_op.entry(node.op).or_default();
                    entry.count += 1;
                    entry.time += dt;
                    // Give the buffers back before reporting any error.
                    let mut bad_output = None;
                    for (k, (&b, ty)) in outs.iter().zip(types).enumerate() {
                        let t = std::mem::replace(&mut scratch[k], empty_tensor());
                        if bad_output.is_none() && (t.shape != ty.shape || t.dtype() != ty.dtype) {
                            bad_output = Some((k, t.ty()));
                        }
                        pool[b] = t;
                    }
                    scratch.clear();
                    if let Err(error) = result {
                        return Err(RuntimeError::Kernel { node: i, error });
                    }
                    if let Some((index, got)) = bad_output {
                        return Err(RuntimeError::KernelOutput {
                            node: i,
                            op: node.op,
                            instance: node.instance.clone(),
                            reason: format!(
                                "the {} kernel left output {index} as {got}, but the node's type says {}",
                                backend.name(),
                                types[index]
                            ),
                        });
                    }
                }
                Step::Comm {
                    call,
                    input,
                    out,
                    ty,
                } => {
                    let t0 = Instant::now();
                    let comm_err = |error: CommError| RuntimeError::Comm {
                        node: i,
                        op: node.op,
                        instance: node.instance.clone(),
                        error,
                    };
                    let graph_error = |reason: String| RuntimeError::Graph {
                        graph: graph.name.clone(),
                        location: node_text(graph, i),
                        reason,
                    };
                    let Some(comm) = comm.as_deref() else {
                        return Err(RuntimeError::NeedsCommunicator {
                            op: node.op,
                            instance: node.instance.clone(),
                        });
                    };
                    let Some(slot) = pool.get_mut(*out) else {
                        return Err(graph_error("the result has no buffer".into()));
                    };
                    let mut dst = std::mem::replace(slot, empty_tensor());
                    if shape_buffer(&mut dst, ty) {
                        stats.buffer_allocations += 1;
                    }
                    let src = match input {
                        Some(s) => fetch(*s, pool, weights, feeds, feed_index),
                        None => None,
                    };
                    let result = run_comm(comm, call, src, &mut dst, ty);
                    pool[*out] = dst;
                    let entry = stats.per_op.entry(node.op).or_default();
                    entry.count += 1;
                    entry.time += t0.elapsed();
                    match result {
                        Ok(()) => {}
                        Err(CommFailure::Comm(e)) => return Err(comm_err(e)),
                        Err(CommFailure::Local(reason)) => return Err(graph_error(reason)),
                    }
                }
                Step::Assign { param, value, swap } => {
                    let t0 = Instant::now();
                    let mut dst = weights[*param].take().unwrap_or_else(empty_tensor);
                    let ok = match value {
                        Src::Buffer(b) if *swap && capacity(&dst) >= capacity(&pool[*b]) => {
                            std::mem::swap(&mut dst, &mut pool[*b]);
                            true
                        }
                        Src::Weight(p) if *p == *param => true,
                        _ => match fetch(*value, pool, weights, feeds, feed_index) {
                            Some(src) => copy_into(&mut dst, src),
                            None => false,
                        },
                    };
                    weights[*param] = Some(dst);
                    let entry = stats.per_op.entry(OpKind::Assign).or_default();
                    entry.count += 1;
                    entry.time += t0.elapsed();
                    if !ok {
                        return Err(RuntimeError::Graph {
                            graph: graph.name.clone(),
                            location: node_text(graph, i),
                            reason: "the assigned value does not match the parameter".into(),
                        });
                    }
                }
            }
        }
        let mut result = Vec::with_capacity(outputs.len());
        for &src in outputs.iter() {
            if let Some(t) = fetch(src, pool, weights, feeds, feed_index) {
                result.push(t.clone());
            }
        }
        self.step_count += 1;
        self.stats.steps += 1;
        self.stats.total += start.elapsed();
        Ok(result)
    }

    /// Checks the feeds and records where each input's tensor is.
    fn bind_feeds(&mut self, feeds: &[(&str, Tensor)]) -> Result<(), RuntimeError> {
        self.feed_index.fill(usize::MAX);
        for (k, (name, t)) in feeds.iter().enumerate() {
            let Some(pid) = self.graph.param_by_name(name) else {
                let inputs: Vec<&str> = self
                    .graph
                    .params
                    .iter()
                    .filter(|p| p.kind == ParamKind::Input)
                    .map(|p| p.name.as_str())
                    .collect();
                return Err(RuntimeError::UnknownFeed {
                    name: name.to_string(),
                    graph: self.graph.name.clone(),
                    reason: format!("its inputs are {}", inputs.join(", ")),
                });
            };
            let p = &self.graph.params[pid.index()];
            if p.is_weight() {
                return Err(RuntimeError::UnknownFeed {
                    name: name.to_string(),
                    graph: self.graph.name.clone(),
                    reason: "it is a weight; set it with set_param".into(),
                });
            }
            if self.feed_index[pid.index()] != usize::MAX {
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
            self.feed_index[pid.index()] = k;
        }
        for (i, p) in self.graph.params.iter().enumerate() {
            if p.kind == ParamKind::Input && self.feed_index[i] == usize::MAX {
                return Err(RuntimeError::MissingFeed {
                    input: p.name.clone(),
                    expected: p.ty.clone(),
                });
            }
        }
        Ok(())
    }

    /// The graph being run.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// The communicator the communication nodes run through, if any.
    pub fn communicator(&self) -> Option<&Arc<dyn Communicator>> {
        self.comm.as_ref()
    }

    /// The backend the kernels run on.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// The current value of the weight `name` (`None` for data inputs and unknown names).
    pub fn param(&self, name: &str) -> Option<&Tensor> {
        let pid = self.graph.param_by_name(name)?;
        self.weights.get(pid.index())?.as_ref()
    }

    /// Replaces the value of the weight `name` (checkpoint loading, tests). The tensor must
    /// have the parameter's type.
    pub fn set_param(&mut self, name: &str, value: Tensor) -> Result<(), RuntimeError> {
        let unknown = |hint: &str| RuntimeError::UnknownParam {
            name: name.to_string(),
            graph: self.graph.name.clone(),
            hint: hint.to_string(),
        };
        let Some(pid) = self.graph.param_by_name(name) else {
            return Err(unknown(""));
        };
        let p = &self.graph.params[pid.index()];
        if !p.is_weight() {
            return Err(unknown(" (it is a data input: feed it to step)"));
        }
        if value.shape != p.ty.shape
            || value.dtype() != p.ty.dtype
            || value.len() != p.ty.num_elements()
        {
            return Err(RuntimeError::ParamMismatch {
                param: p.name.clone(),
                expected: p.ty.clone(),
                got: value.ty(),
            });
        }
        self.weights[pid.index()] = Some(value);
        Ok(())
    }

    /// The weights, in parameter order, with their names.
    pub fn weights(&self) -> impl Iterator<Item = (&str, &Tensor)> {
        self.graph
            .params
            .iter()
            .zip(&self.weights)
            .filter_map(|(p, w)| w.as_ref().map(|t| (p.name.as_str(), t)))
    }

    /// Steps run so far (passed to kernels as [`KernelContext::step`]).
    pub fn step_count(&self) -> u64 {
        self.step_count
    }

    /// Sets the step counter (when resuming from a checkpoint).
    pub fn set_step_count(&mut self, n: u64) {
        self.step_count = n;
    }

    /// The memory plan.
    pub fn memory_plan(&self) -> &MemoryPlan {
        &self.plan
    }

    /// Cumulative execution statistics.
    pub fn stats(&self) -> &ExecStats {
        &self.stats
    }
}

/// Number of elements of parameter `p`.
fn pty_elems(graph: &Graph, p: usize) -> usize {
    graph.params[p].ty.num_elements()
}

/// Why a communication node failed: in the communicator, or before reaching it.
enum CommFailure {
    Comm(CommError),
    Local(String),
}

/// Runs one communication node: `input` is its operand (none for `Receive`), `dst` its
/// output buffer, already of type `ty`.
fn run_comm(
    comm: &dyn Communicator,
    call: &CommCall,
    input: Option<&Tensor>,
    dst: &mut Tensor,
    ty: &TensorType,
) -> Result<(), CommFailure> {
    let need_input = || {
        input.ok_or_else(|| CommFailure::Local("the executor has no value for operand 0".into()))
    };
    let store = |dst: &mut Tensor, t: &Tensor| -> Result<(), CommFailure> {
        if t.shape != ty.shape || t.dtype() != ty.dtype || !copy_into(dst, t) {
            return Err(CommFailure::Local(format!(
                "the communicator returned {} but the node's type is {ty}",
                t.ty()
            )));
        }
        Ok(())
    };
    match call {
        CommCall::AllReduce { group, op } => {
            store(dst, need_input()?)?;
            comm.all_reduce(group, *op, dst).map_err(CommFailure::Comm)
        }
        CommCall::Broadcast { group, root } => {
            store(dst, need_input()?)?;
            comm.broadcast(group, *root, dst).map_err(CommFailure::Comm)
        }
        CommCall::AllGather { group, axis } => {
            let t = comm
                .all_gather(group, *axis, need_input()?)
                .map_err(CommFailure::Comm)?;
            store(dst, &t)
        }
        CommCall::ReduceScatter { group, op, axis } => {
            let t = comm
                .reduce_scatter(group, *op, *axis, need_input()?)
                .map_err(CommFailure::Comm)?;
            store(dst, &t)
        }
        CommCall::AllToAll {
            group,
            split_dim,
            concat_dim,
        } => {
            let t = comm
                .all_to_all(group, *split_dim, *concat_dim, need_input()?)
                .map_err(CommFailure::Comm)?;
            store(dst, &t)
        }
        CommCall::Send { dest, tag } => {
            let x = need_input()?;
            comm.send(*dest, *tag, x).map_err(CommFailure::Comm)?;
            store(dst, x)
        }
        CommCall::Receive { src, tag } => {
            let t = comm.recv(*src, *tag, ty).map_err(CommFailure::Comm)?;
            store(dst, &t)
        }
    }
}

/// Reads and checks the attributes of communication node `i` for `comm`'s rank and world.
fn comm_call(graph: &Graph, i: usize, comm: &dyn Communicator) -> Result<CommCall, RuntimeError> {
    let node = &graph.nodes[i];
    let err = |reason: String| RuntimeError::Graph {
        graph: graph.name.clone(),
        location: node_text(graph, i),
        reason,
    };
    let (rank, size) = (comm.rank(), comm.size());
    let int_attr = |key: &str, default: Option<i64>| -> Result<i64, RuntimeError> {
        match (node.attrs.get(key), default) {
            (Some(Attr::Int(v)), _) => Ok(*v),
            (Some(other), _) => Err(err(format!(
                "attribute `{key}` must be an integer, got {other}"
            ))),
            (None, Some(d)) => Ok(d),
            (None, None) => Err(err(format!("attribute `{key}` is missing"))),
        }
    };
    let global_rank = |key: &str, default: Option<i64>| -> Result<usize, RuntimeError> {
        let r = int_attr(key, default)?;
        usize::try_from(r)
            .ok()
            .filter(|&r| r < size)
            .ok_or_else(|| {
                err(format!(
                    "attribute `{key}` {r} is not a rank of the world of {size} ranks"
                ))
            })
    };
    let group = || -> Result<Vec<usize>, RuntimeError> {
        let Some(attr) = node.attrs.get("rank_list") else {
            return Ok((0..size).collect());
        };
        let list = attr.as_ints().ok_or_else(|| {
            err(format!(
                "attribute `rank_list` must be a tuple of ranks, got {attr}"
            ))
        })?;
        let mut group = Vec::with_capacity(list.len());
        for &r in &list {
            match usize::try_from(r).ok().filter(|&r| r < size) {
                Some(r) => group.push(r),
                None => {
                    return Err(err(format!(
                        "attribute `rank_list` {attr} holds {r}, which is not a rank of the world of {size} ranks"
                    )))
                }
            }
        }
        group.sort_unstable();
        if group.is_empty() || group.windows(2).any(|w| w[0] == w[1]) {
            return Err(err(format!(
                "attribute `rank_list` {attr} must hold distinct ranks"
            )));
        }
        if !group.contains(&rank) {
            return Err(err(format!(
                "attribute `rank_list` {attr} does not hold this rank {rank}"
            )));
        }
        Ok(group)
    };
    let reduce_op = || -> Result<ReduceOp, RuntimeError> {
        match node.attrs.get("op") {
            None => Ok(ReduceOp::Sum),
            Some(Attr::Str(s)) => ReduceOp::from_name(s).ok_or_else(|| {
                err(format!(
                    "attribute `op` {s} is not a reduction (expected sum, max, min or prod)"
                ))
            }),
            Some(other) => Err(err(format!(
                "attribute `op` must be sum, max, min or prod, got {other}"
            ))),
        }
    };
    let input_rank = || -> usize {
        node.inputs
            .first()
            .and_then(|o| graph.operand_tensor_type(o))
            .map_or(0, |t| t.shape.len())
    };
    let axis = |key: &str, default: Option<i64>| -> Result<usize, RuntimeError> {
        let a = int_attr(key, default)?;
        let r = input_rank();
        let norm = if a < 0 {
            a.checked_add(r as i64)
        } else {
            Some(a)
        };
        norm.and_then(|a| usize::try_from(a).ok())
            .filter(|&a| a < r)
            .ok_or_else(|| {
                err(format!(
                    "attribute `{key}` {a} is out of range for an operand of rank {r}"
                ))
            })
    };
    let has_input = || -> Result<(), RuntimeError> {
        match node.inputs.first() {
            Some(o) if node.inputs.len() == 1 && graph.operand_tensor_type(o).is_some() => Ok(()),
            _ => Err(err(format!(
                "{} takes one tensor operand, got {} operands",
                node.op,
                node.inputs.len()
            ))),
        }
    };
    Ok(match node.op {
        OpKind::AllReduce => {
            has_input()?;
            CommCall::AllReduce {
                group: group()?,
                op: reduce_op()?,
            }
        }
        OpKind::AllGather => {
            has_input()?;
            CommCall::AllGather {
                group: group()?,
                axis: axis("axis", Some(0))?,
            }
        }
        OpKind::ReduceScatter => {
            has_input()?;
            CommCall::ReduceScatter {
                group: group()?,
                op: reduce_op()?,
                axis: axis("axis", Some(0))?,
            }
        }
        OpKind::AllToAll => {
            has_input()?;
            let group = group()?;
            if node.attrs.get("split_count").is_some() {
                let c = int_attr("split_count", None)?;
                if usize::try_from(c).ok() != Some(group.len()) {
                    return Err(err(format!(
                        "attribute `split_count` {c} differs from the group size {}",
                        group.len()
                    )));
                }
            }
            CommCall::AllToAll {
                split_dim: axis("split_dim", None)?,
                concat_dim: axis("concat_dim", None)?,
                group,
            }
        }
        OpKind::Broadcast => {
            has_input()?;
            let group = group()?;
            let root = global_rank("root_rank", Some(0))?;
            if !group.contains(&root) {
                return Err(err(format!(
                    "attribute `root_rank` {root} is not in the group {}",
                    crate::comm::RankList(&group)
                )));
            }
            CommCall::Broadcast { group, root }
        }
        OpKind::Send => {
            has_input()?;
            CommCall::Send {
                dest: global_rank("dest_rank", None)?,
                tag: int_attr("sr_tag", Some(0))?,
            }
        }
        OpKind::Receive => {
            if !node.inputs.is_empty() {
                return Err(err(format!(
                    "Receive takes no operand, got {}",
                    node.inputs.len()
                )));
            }
            CommCall::Receive {
                src: global_rank("src_rank", None)?,
                tag: int_attr("sr_tag", Some(0))?,
            }
        }
        other => {
            return Err(err(format!("{other} is not a communication op")));
        }
    })
}
