//! The executor: runs a graph step after step on a [`Backend`], with its weights kept between
//! steps and its intermediate values in the buffers of a [`MemoryPlan`].
//!
//! Written once for every device: the step's plan ([`schedule`]), the device trait
//! ([`device::ExecDevice`]) and the run loop ([`run::run_nodes`]); [`Executor`] is the CPU's
//! device (host tensors, kernels through a [`Backend`], the communication thread as its
//! communication stream), the CUDA backend's `GpuExecutor` another.
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
//!
//! **Overlap.** Compute runs on the calling thread; every collective runs on one
//! communication thread per executor, in program order (so all ranks issue their collectives
//! in the same order, and the communicator is never called from two threads at once). An
//! ordinary communication node is submitted and waited for right away. The AllReduces of a
//! gradient bucket (`fusion: k`, k > 0, written by `passes::grad_fusion`) are packed, as their
//! inputs appear, into one flat buffer per bucket; when the last member is packed, ONE
//! AllReduce of the flat buffer is submitted and compute goes on. A parameter-gather bucket
//! (the parallel optimizer's weight AllGathers, which `grad_fusion` puts at the start of the
//! step) is packed and launched the same way and runs ONE AllGather
//! ([`schedule::BucketCollective`]). The first node that reads a
//! member's result waits for that bucket (and only then) and unpacks the member. A bucket that
//! the last step found with little to hide behind (less than `INLINE_BUCKET_BELOW` of
//! compute between its launch and its first reader, or of its own time) runs on the main
//! thread instead, when the communication thread is idle: the hand-off would cost more than
//! the overlap wins. So does every bucket whose communicator says it would take turns with
//! the compute rather than overlap it ([`Communicator::overlaps_compute`]: shared memory on a
//! host with no core to spare; measured with 4 thread ranks on 2 cores, a 2-layer
//! transformer's data-parallel step took 6.5 ms with its 32 buckets on communication threads
//! and 4.8 ms with them on the main threads). Packing does
//! not change the per-element reduction order, so the results are bit-identical to unfused
//! AllReduces. [`ExecStats::gradient_comm`] records the buckets' communication time and how
//! much of it the main thread spent waiting.

use crate::backend::{Arg, Backend, KernelContext, KernelError};
use crate::comm::Communicator;
use crate::error::RuntimeError;
use crate::init::{describe, init_tensor};
use crate::memory::{node_text, plan_with, Allocator, Location, MemoryPlan};
use crate::tensor::{Data, Tensor};
use shardc_ir::{Graph, OpKind, Operand, ParamKind, ReduceOp, TensorType};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod comm_call;
mod comm_thread;
pub mod device;
pub mod replay;
pub mod run;
pub mod schedule;
pub use comm_call::{comm_call, run_comm, CommCall, CommFailure};
use comm_thread::{CommThread, Job, Reply};
use device::ExecDevice;
use run::{run_nodes, LoopState};
use schedule::{bind_feeds, BucketCollective, BucketSpec, MemberSpec, NodeStep, Schedule};

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
    /// The weight takes `value`; `swap` when the value's buffer can be moved.
    Assign { value: Src, swap: bool },
    /// A communication node: its collective, its tensor operand (none for `Receive`), its
    /// output buffer and type.
    Comm {
        call: Arc<CommCall>,
        input: Option<Src>,
        out: usize,
        ty: Arc<TensorType>,
    },
    /// A member of a gradient bucket: its input is packed into the bucket's flat buffer; the
    /// bucket's last member submits the bucket's AllReduce.
    Pack { input: Src },
}

/// A gradient bucket (`fusion: id`) at run time.
#[derive(Debug)]
struct BucketRt {
    /// The `fusion` id.
    id: i64,
    /// Its group, collective and reduction, and one rank's elements.
    group: Arc<[usize]>,
    collective: BucketCollective,
    op: ReduceOp,
    per_rank: usize,
    /// The flat buffer; `None` while the communication thread has it.
    flat: Option<Tensor>,
    /// The ticket of the bucket's AllReduce while it is in flight.
    ticket: Option<u64>,
    /// Whether its AllReduce overlaps compute on the communication thread
    /// ([`Communicator::overlaps_compute`]); if not, the main thread runs it.
    overlaps: bool,
    /// The reply of an AllReduce the main thread ran at the launch, kept for the first
    /// reader (which takes it as it would take the communication thread's, errors included).
    done: Option<Reply>,
    /// When this step's AllReduce was launched (until its first reader comes).
    launched: Option<Instant>,
    /// The last step's time from the launch to the first reader (the compute the AllReduce
    /// can hide behind) and the AllReduce's own time: see [`INLINE_BUCKET_BELOW`].
    last_window: Option<Duration>,
    last_comm: Option<Duration>,
}

/// A bucket whose AllReduce could hide behind less than this (the last step's compute
/// between its launch and its first reader, or its own time, whichever is less) runs on the
/// main thread when the communication thread is idle: handing it over costs a wake-up of
/// the communication thread and one of the main thread at the reader, each tens of
/// microseconds when the thread slept (measured: 8-13 us waited per step for buckets of
/// 8-12 us on the quickstart net, 2 ranks), more than the overlap can win back.
const INLINE_BUCKET_BELOW: Duration = Duration::from_micros(50);

impl BucketRt {
    /// Whether it runs on the main thread (when the communication thread is idle): it does
    /// not overlap compute, or the last step said that overlapping it does not pay.
    fn better_inline(&self) -> bool {
        if !self.overlaps {
            return true;
        }
        match (self.last_window, self.last_comm) {
            (Some(w), Some(c)) => w.min(c) < INLINE_BUCKET_BELOW,
            _ => false,
        }
    }
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
    /// Per node of the graph, by index: the same calls and time as `per_op`, node by node
    /// (what `shardc run --stats` writes into the artifact for `shardc report`).
    pub per_node: Vec<OpStats>,
    /// Steps run.
    pub steps: u64,
    /// Total time of the steps (feeds checking, kernels, copies, outputs).
    pub total: Duration,
    /// Buffer allocations: one per plan buffer when the executor is created, plus one for
    /// every time a step had to allocate a buffer (which a correct plan never does).
    pub buffer_allocations: u64,
    /// Gradient buckets: their communication time and how much of it was not hidden.
    pub gradient_comm: GradCommStats,
}

/// Communication of the gradient buckets (`fusion: k`), cumulative over steps, with the last
/// step's numbers.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GradCommStats {
    /// Buckets in the graph (one AllReduce each per step).
    pub buckets: usize,
    /// Steps that ran every bucket.
    pub steps: u64,
    /// Time the communication thread spent in the buckets' AllReduces, all steps.
    pub comm: Duration,
    /// Time the main thread spent blocked waiting for buckets, all steps.
    pub wait: Duration,
    /// The last step's bucket communication time.
    pub last_comm: Duration,
    /// The last step's waiting time.
    pub last_wait: Duration,
}

impl GradCommStats {
    /// The fraction of the buckets' communication hidden behind compute: 1 − wait / comm,
    /// clamped to [0, 1] (0 when nothing was communicated).
    pub fn hidden_fraction(&self) -> f64 {
        hidden(self.comm, self.wait)
    }

    /// The last step's hidden fraction.
    pub fn last_hidden_fraction(&self) -> f64 {
        hidden(self.last_comm, self.last_wait)
    }

    /// Mean bucket communication time per step.
    pub fn comm_per_step(&self) -> Duration {
        per_step(self.comm, self.steps)
    }

    /// Mean waiting time per step.
    pub fn wait_per_step(&self) -> Duration {
        per_step(self.wait, self.steps)
    }
}

fn hidden(comm: Duration, wait: Duration) -> f64 {
    if comm.is_zero() {
        return 0.0;
    }
    (1.0 - wait.as_secs_f64() / comm.as_secs_f64()).clamp(0.0, 1.0)
}

fn per_step(d: Duration, steps: u64) -> Duration {
    match u32::try_from(steps) {
        Ok(0) => Duration::ZERO,
        Ok(n) => d / n,
        Err(_) => Duration::from_secs_f64(d.as_secs_f64() / steps as f64),
    }
}

impl fmt::Display for GradCommStats {
    /// `gradient communication: 4 buckets, 12.3 ms/step, 9.1 ms hidden (74%)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let comm = self.comm_per_step().as_secs_f64() * 1e3;
        let hidden_ms = (comm - self.wait_per_step().as_secs_f64() * 1e3).max(0.0);
        write!(
            f,
            "gradient communication: {} bucket{}, {:.1} ms/step, {:.1} ms hidden ({:.0}%)",
            self.buckets,
            if self.buckets == 1 { "" } else { "s" },
            comm,
            hidden_ms,
            100.0 * self.hidden_fraction()
        )
    }
}

impl ExecStats {
    /// Adds `calls` calls taking `dt` to node `i`'s tally (a node past the table is ignored:
    /// the table is sized by the graph when the executor is created).
    fn add_node(&mut self, i: usize, dt: Duration, calls: u64) {
        if let Some(s) = self.per_node.get_mut(i) {
            s.count += calls;
            s.time += dt;
        }
    }
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
        )?;
        if self.gradient_comm.buckets > 0 {
            write!(f, "\n{}", self.gradient_comm)?;
        }
        Ok(())
    }
}

/// Runs a graph, step after step (see the module doc).
pub struct Executor {
    graph: Arc<Graph>,
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
    /// The communication thread (with a communicator).
    comm_thread: Option<CommThread>,
    /// The step's plan (shared with every executor: [`schedule`]).
    schedule: Arc<Schedule>,
    /// What the run loop tracks within a step.
    loop_state: LoopState,
    /// Per gradient bucket member: its result buffer.
    member_out: Vec<usize>,
    /// Gradient buckets, by first member: their run-time state.
    buckets: Vec<BucketRt>,
    /// Per node: a buffer for a communication node's data-input operand (the communication
    /// thread gets its own copy of a feed).
    staging: Vec<Option<Tensor>>,
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

        // Checks, communication calls, gradient buckets: the shared schedule.
        let schedule = Schedule::new(&graph, comm.as_deref())?;

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
        for (i, (node, kind)) in graph.nodes.iter().zip(&schedule.steps).enumerate() {
            let out0 = || match plan.values[i].first().map(|v| v.location) {
                Some(Location::Buffer(b)) => b,
                _ => usize::MAX,
            };
            let step = match *kind {
                NodeStep::Alias => Step::Alias,
                NodeStep::Assign { param } => {
                    let value = src_of(&node.inputs[1]);
                    let swap = match (&node.inputs[1], value) {
                        (Operand::Node(n), Src::Buffer(b)) => {
                            let v = &plan.values[n.index()][0];
                            v.last_use == i && plan.buffers[b].elements == pty_elems(&graph, param)
                        }
                        _ => false,
                    };
                    Step::Assign { value, swap }
                }
                NodeStep::Collective => {
                    let (Some(call), Some(ty)) = (&schedule.calls[i], node.ty.as_tensor()) else {
                        return Err(graph_err(
                            node_text(&graph, i),
                            "a communication op must have a tensor result".into(),
                        ));
                    };
                    let input = match node.op {
                        OpKind::Receive => None,
                        _ => Some(src_of(&node.inputs[0])),
                    };
                    Step::Comm {
                        call: call.clone(),
                        input,
                        out: out0(),
                        ty: Arc::new(ty.clone()),
                    }
                }
                NodeStep::Pack { .. } => {
                    if out0() == usize::MAX {
                        return Err(graph_err(
                            node_text(&graph, i),
                            "the result has no buffer".into(),
                        ));
                    }
                    Step::Pack {
                        input: node.inputs.first().map_or(Src::Const, src_of),
                    }
                }
                NodeStep::Compute => {
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

        // Gradient buckets: the schedule's, with their run-time state.
        let member_out: Vec<usize> = schedule
            .members
            .iter()
            .map(|m| match plan.values[m.node].first().map(|v| v.location) {
                Some(Location::Buffer(b)) => b,
                _ => usize::MAX,
            })
            .collect();
        let buckets: Vec<BucketRt> = schedule
            .buckets
            .iter()
            .map(|b| BucketRt {
                id: b.id,
                group: b.group.clone(),
                collective: b.collective,
                op: b.op,
                per_rank: b.per_rank,
                flat: Some(Tensor {
                    shape: vec![b.elements],
                    data: Data::zeros(b.dtype, b.elements),
                }),
                ticket: None,
                overlaps: comm.as_ref().is_none_or(|c| c.overlaps_compute(&b.group)),
                done: None,
                launched: None,
                last_window: None,
                last_comm: None,
            })
            .collect();
        let staging: Vec<Option<Tensor>> = steps
            .iter()
            .map(|st| match st {
                Step::Comm {
                    input: Some(Src::Input(p)),
                    ..
                } => {
                    let ty = &graph.params[*p].ty;
                    Some(Tensor {
                        shape: ty.shape.clone(),
                        data: Data::zeros(ty.dtype, ty.num_elements()),
                    })
                }
                _ => None,
            })
            .collect();
        let comm_thread = match &comm {
            Some(c) => Some(
                CommThread::start(c.clone()).map_err(|e| RuntimeError::Graph {
                    graph: gname.clone(),
                    location: "communication thread".into(),
                    reason: format!("cannot start it: {e}"),
                })?,
            ),
            None => None,
        };

        let pool: Vec<Tensor> = plan
            .buffers
            .iter()
            .map(|b| Tensor {
                shape: vec![b.elements],
                data: Data::zeros(b.dtype, b.elements),
            })
            .collect();
        let stats = ExecStats {
            per_node: vec![OpStats::default(); graph.nodes.len()],
            buffer_allocations: (pool.len() + buckets.len()) as u64,
            gradient_comm: GradCommStats {
                buckets: buckets.len(),
                ..GradCommStats::default()
            },
            ..ExecStats::default()
        };
        let nparams = graph.params.len();
        let loop_state = LoopState::new(&schedule);
        Ok(Executor {
            graph: Arc::new(graph),
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
            comm_thread,
            schedule: Arc::new(schedule),
            loop_state,
            member_out,
            buckets,
            staging,
        })
    }

    /// Runs one step: `feeds` give every data input by name (type checked). Returns the
    /// graph's outputs in order, the loss first; a tuple-typed output contributes each of its
    /// elements. Weights persist across steps; `Assign` nodes update them.
    ///
    /// A step that fails in a kernel may have updated some weights already (those assigned
    /// before the failing node). A failing step first waits for every gradient bucket still in
    /// flight (each ends, at the latest, in the communicator's timeout), so the executor stays
    /// usable.
    pub fn step(&mut self, feeds: &[(&str, Tensor)]) -> Result<Vec<Tensor>, RuntimeError> {
        let start = Instant::now();
        self.bind_feeds(feeds)?;
        let backend = Arc::clone(&self.backend);
        let mut result = Ok(Vec::new());
        backend.in_context(&mut || result = self.run_step(feeds));
        if result.is_err() {
            self.drain();
        } else {
            self.step_count += 1;
            self.stats.steps += 1;
            self.stats.total += start.elapsed();
        }
        result
    }

    /// Takes back every bucket still with the communication thread (or run on the main thread
    /// and not yet read).
    fn drain(&mut self) {
        let mut tickets: Vec<(u64, usize)> = self
            .buckets
            .iter_mut()
            .enumerate()
            .filter_map(|(b, bk)| bk.ticket.take().map(|t| (t, b)))
            .collect();
        tickets.sort_unstable();
        for (t, b) in tickets {
            if let Some(r) = self.comm_thread.as_mut().and_then(|c| c.wait(t)) {
                self.buckets[b].flat = Some(r.dst);
            }
        }
        for bk in &mut self.buckets {
            if let Some(r) = bk.done.take() {
                bk.flat = Some(r.dst);
            }
            bk.launched = None;
        }
    }

    fn run_step(&mut self, feeds: &[(&str, Tensor)]) -> Result<Vec<Tensor>, RuntimeError> {
        let ctx = KernelContext {
            step: self.step_count,
            rank: self
                .comm
                .as_ref()
                .map_or(0, |c| u32::try_from(c.rank()).unwrap_or(u32::MAX)),
        };
        let graph = Arc::clone(&self.graph);
        let schedule = Arc::clone(&self.schedule);
        let mut state = std::mem::take(&mut self.loop_state);
        let mut host = HostStep {
            ex: self,
            graph: &graph,
            feeds,
            ctx,
            time: BucketTime::default(),
        };
        let ran = run_nodes(&mut host, &graph, &schedule, &mut state);
        let bucket_time = host.time;
        self.loop_state = state;
        ran?;
        let g = &mut self.stats.gradient_comm;
        if g.buckets > 0 {
            g.steps += 1;
            g.comm += bucket_time.comm;
            g.wait += bucket_time.wait;
            g.last_comm = bucket_time.comm;
            g.last_wait = bucket_time.wait;
        }
        let mut result = Vec::with_capacity(self.outputs.len());
        for &src in self.outputs.iter() {
            if let Some(t) = fetch(src, &self.pool, &self.weights, feeds, &self.feed_index) {
                result.push(t.clone());
            }
        }
        Ok(result)
    }

    /// Checks the feeds and records where each input's tensor is.
    fn bind_feeds(&mut self, feeds: &[(&str, Tensor)]) -> Result<(), RuntimeError> {
        bind_feeds(&self.graph, feeds, &mut self.feed_index)
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

/// The CPU executor during one step, as the run loop drives it: host tensors, kernels
/// through [`Backend::run`], the communication thread as its communication stream.
struct HostStep<'a, 'f> {
    ex: &'a mut Executor,
    graph: &'a Graph,
    feeds: &'a [(&'f str, Tensor)],
    ctx: KernelContext,
    time: BucketTime,
}

impl HostStep<'_, '_> {
    fn graph_error(&self, i: usize, reason: String) -> RuntimeError {
        RuntimeError::Graph {
            graph: self.graph.name.clone(),
            location: node_text(self.graph, i),
            reason,
        }
    }

    fn count(&mut self, i: usize, op: OpKind, t0: Instant) {
        let dt = t0.elapsed();
        let entry = self.ex.stats.per_op.entry(op).or_default();
        entry.count += 1;
        entry.time += dt;
        self.ex.stats.add_node(i, dt, 1);
    }
}

impl ExecDevice for HostStep<'_, '_> {
    type Error = RuntimeError;

    fn compute(&mut self, i: usize) -> Result<(), RuntimeError> {
        let node = &self.graph.nodes[i];
        let feeds = self.feeds;
        let Executor {
            backend,
            steps,
            weights,
            pool,
            feed_index,
            scratch,
            stats,
            ..
        } = &mut *self.ex;
        let Step::Compute { args, outs, types } = &steps[i] else {
            return Err(self.graph_error(i, "not a compute node".into()));
        };
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
                None => backend.run(node, &inputs, scratch, &self.ctx),
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
        stats.add_node(i, dt, 1);
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
        Ok(())
    }

    fn assign(&mut self, i: usize, param: usize) -> Result<(), RuntimeError> {
        let t0 = Instant::now();
        let feeds = self.feeds;
        let Executor {
            steps,
            weights,
            pool,
            feed_index,
            ..
        } = &mut *self.ex;
        let Step::Assign { value, swap } = &steps[i] else {
            return Err(self.graph_error(i, "not an Assign node".into()));
        };
        let mut dst = weights[param].take().unwrap_or_else(empty_tensor);
        let ok = match value {
            Src::Buffer(b) if *swap && capacity(&dst) >= capacity(&pool[*b]) => {
                std::mem::swap(&mut dst, &mut pool[*b]);
                true
            }
            Src::Weight(p) if *p == param => true,
            _ => match fetch(*value, pool, weights, feeds, feed_index) {
                Some(src) => dst.copy_from(src),
                None => false,
            },
        };
        weights[param] = Some(dst);
        self.count(i, OpKind::Assign, t0);
        if !ok {
            return Err(
                self.graph_error(i, "the assigned value does not match the parameter".into())
            );
        }
        Ok(())
    }

    fn collective(&mut self, i: usize, _call: &CommCall) -> Result<(), RuntimeError> {
        let node = &self.graph.nodes[i];
        let t0 = Instant::now();
        let feeds = self.feeds;
        let Executor {
            comm,
            steps,
            weights,
            pool,
            feed_index,
            stats,
            comm_thread,
            staging,
            ..
        } = &mut *self.ex;
        let graph_error = |reason: String| RuntimeError::Graph {
            graph: self.graph.name.clone(),
            location: node_text(self.graph, i),
            reason,
        };
        let Step::Comm {
            call,
            input,
            out,
            ty,
        } = &steps[i]
        else {
            return Err(graph_error("not a communication node".into()));
        };
        if comm.is_none() {
            return Err(RuntimeError::NeedsCommunicator {
                op: node.op,
                instance: node.instance.clone(),
            });
        }
        let Some(thread) = comm_thread.as_mut() else {
            return Err(graph_error(
                "the communication thread is not running".into(),
            ));
        };
        let Some(slot) = pool.get_mut(*out) else {
            return Err(graph_error("the result has no buffer".into()));
        };
        let mut dst = std::mem::replace(slot, empty_tensor());
        if shape_buffer(&mut dst, ty) {
            stats.buffer_allocations += 1;
        }
        // The communication thread gets the operand by value and gives it back.
        let (operand, taken) = match input {
            Some(Src::Buffer(b)) if *b == *out => (Some(dst.clone()), Taken::Nothing),
            Some(Src::Buffer(b)) if *b < pool.len() => (
                Some(std::mem::replace(&mut pool[*b], empty_tensor())),
                Taken::Buffer(*b),
            ),
            Some(Src::Weight(p)) => match weights.get_mut(*p).and_then(Option::take) {
                Some(t) => (Some(t), Taken::Weight(*p)),
                None => (None, Taken::Nothing),
            },
            Some(Src::Input(p)) => {
                let feed = fetch(Src::Input(*p), pool, weights, feeds, feed_index);
                match (staging[i].take(), feed) {
                    (Some(mut st), Some(f)) => {
                        if st.copy_from(f) {
                            (Some(st), Taken::Staging)
                        } else {
                            staging[i] = Some(st);
                            (None, Taken::Nothing)
                        }
                    }
                    (st, _) => {
                        staging[i] = st;
                        (None, Taken::Nothing)
                    }
                }
            }
            _ => (None, Taken::Nothing),
        };
        let job = Job::Node {
            call: call.clone(),
            input: operand,
            dst,
            ty: ty.clone(),
        };
        let reply = thread.run(job);
        let Some(reply) = reply else {
            return Err(graph_error(
                "the communication thread ended during the collective".into(),
            ));
        };
        pool[*out] = reply.dst;
        match (taken, reply.input) {
            (Taken::Buffer(b), Some(t)) => pool[b] = t,
            (Taken::Weight(p), Some(t)) => weights[p] = Some(t),
            (Taken::Staging, Some(t)) => staging[i] = Some(t),
            _ => {}
        }
        let dt = t0.elapsed();
        let entry = stats.per_op.entry(node.op).or_default();
        entry.count += 1;
        entry.time += dt;
        stats.add_node(i, dt, 1);
        match reply.result {
            Ok(()) => Ok(()),
            Err(CommFailure::Comm(error)) => Err(RuntimeError::Comm {
                node: i,
                op: node.op,
                instance: node.instance.clone(),
                error,
            }),
            Err(CommFailure::Local(reason)) => Err(graph_error(reason)),
        }
    }

    fn pack(&mut self, _m: usize, member: &MemberSpec) -> Result<(), RuntimeError> {
        let t0 = Instant::now();
        let i = member.node;
        let feeds = self.feeds;
        let Executor {
            steps,
            weights,
            pool,
            feed_index,
            buckets,
            schedule,
            ..
        } = &mut *self.ex;
        let at = schedule.buckets[member.bucket].pack_offset(member);
        let bk = &mut buckets[member.bucket];
        let input = match &steps[i] {
            Step::Pack { input } => Some(*input),
            _ => None,
        };
        let Some(flat) = bk.flat.as_mut() else {
            let reason = format!(
                "the buffer of gradient bucket fusion {} was lost with the communication thread",
                bk.id
            );
            return Err(self.graph_error(i, reason));
        };
        let packed = match input.and_then(|s| fetch(s, pool, weights, feeds, feed_index)) {
            Some(t) if t.len() == member.len => flat.copy_elements(at, t, 0, member.len),
            _ => false,
        };
        if !packed {
            let reason = format!(
                "the executor has no {} value for operand 0 to pack into gradient bucket \
                 fusion {}",
                member.ty, bk.id
            );
            return Err(self.graph_error(i, reason));
        }
        let op = self.graph.nodes[i].op;
        self.count(i, op, t0);
        Ok(())
    }

    fn launch_bucket(&mut self, b: usize, bucket: &BucketSpec) -> Result<(), RuntimeError> {
        let t0 = Instant::now();
        let i = bucket.last;
        let Executor {
            comm_thread,
            buckets,
            ..
        } = &mut *self.ex;
        let Some(thread) = comm_thread.as_mut() else {
            return Err(self.graph_error(i, "the communication thread is not running".into()));
        };
        let bk = &mut buckets[b];
        let flat = bk.flat.take().unwrap_or_else(empty_tensor);
        let job = Job::Bucket {
            group: bk.group.clone(),
            collective: bk.collective,
            op: bk.op,
            per_rank: bk.per_rank,
            flat,
        };
        let job = if bk.better_inline() {
            match thread.run_if_idle(job) {
                Ok(reply) => {
                    // The main thread ran it: all of it is waited for.
                    self.time.wait += reply.elapsed;
                    bk.done = Some(reply);
                    None
                }
                Err(job) => Some(*job),
            }
        } else {
            Some(job)
        };
        if let Some(job) = job {
            match thread.submit(job) {
                Ok(ticket) => bk.ticket = Some(ticket),
                Err(job) => {
                    if let Job::Bucket { flat, .. } = *job {
                        bk.flat = Some(flat);
                    }
                    return Err(self.graph_error(i, "the communication thread has ended".into()));
                }
            }
        }
        bk.launched = Some(Instant::now());
        // The launch is the last member's: its time joins the member's packing.
        let op = self.graph.nodes[i].op;
        let dt = t0.elapsed();
        let entry = self.ex.stats.per_op.entry(op).or_default();
        entry.time += dt;
        self.ex.stats.add_node(i, dt, 0);
        Ok(())
    }

    fn wait_bucket(
        &mut self,
        b: usize,
        _bucket: &BucketSpec,
        node: usize,
    ) -> Result<(), RuntimeError> {
        wait_bucket(
            b,
            node,
            self.graph,
            &mut self.ex.buckets,
            &mut self.ex.comm_thread,
            &mut self.time,
        )
    }

    fn unpack(&mut self, m: usize, mem: &MemberSpec) -> Result<(), RuntimeError> {
        let Executor {
            pool,
            stats,
            buckets,
            member_out,
            schedule,
            ..
        } = &mut *self.ex;
        let copies = schedule.buckets[mem.bucket].unpack_copies(mem);
        let bk = &buckets[mem.bucket];
        let err = |reason: String| RuntimeError::Graph {
            graph: self.graph.name.clone(),
            location: node_text(self.graph, mem.node),
            reason,
        };
        let Some(flat) = bk.flat.as_ref() else {
            return Err(err(format!(
                "gradient bucket fusion {} was never submitted",
                bk.id
            )));
        };
        let Some(dst) = pool.get_mut(member_out[m]) else {
            return Err(err("the result has no buffer".into()));
        };
        if shape_buffer(dst, &mem.ty) {
            stats.buffer_allocations += 1;
        }
        if !copies
            .into_iter()
            .all(|(from, to, len)| dst.copy_elements(to, flat, from, len))
        {
            return Err(err(format!(
                "gradient bucket fusion {} does not hold this member's {} elements",
                bk.id, mem.len
            )));
        }
        Ok(())
    }
}

/// What a communication node lent the communication thread.
enum Taken {
    Nothing,
    Buffer(usize),
    Weight(usize),
    Staging,
}

/// Bucket times of one step.
#[derive(Default)]
struct BucketTime {
    /// In the communicator.
    comm: Duration,
    /// The main thread blocked.
    wait: Duration,
}

/// Waits for bucket `b` if it is in flight (timing the wait); errors name `node`. The first
/// call after the bucket's launch also records how long the compute since the launch took
/// (see [`INLINE_BUCKET_BELOW`]).
fn wait_bucket(
    b: usize,
    node: usize,
    graph: &Graph,
    buckets: &mut [BucketRt],
    comm_thread: &mut Option<CommThread>,
    time: &mut BucketTime,
) -> Result<(), RuntimeError> {
    let bk = &mut buckets[b];
    let t0 = Instant::now();
    if let Some(launched) = bk.launched.take() {
        bk.last_window = Some(t0 - launched);
    }
    if let Some(reply) = bk.done.take() {
        return finish_bucket(b, node, graph, buckets, reply, time);
    }
    let Some(ticket) = bk.ticket.take() else {
        return Ok(());
    };
    let reply = comm_thread.as_mut().and_then(|c| c.wait(ticket));
    time.wait += t0.elapsed();
    let Some(reply) = reply else {
        return Err(RuntimeError::Graph {
            graph: graph.name.clone(),
            location: node_text(graph, node),
            reason: format!(
                "the communication thread ended during gradient bucket fusion {}",
                bk.id
            ),
        });
    };
    finish_bucket(b, node, graph, buckets, reply, time)
}

/// Takes bucket `b`'s AllReduce back from `reply` (its buffer, its time); errors name `node`.
fn finish_bucket(
    b: usize,
    node: usize,
    graph: &Graph,
    buckets: &mut [BucketRt],
    reply: Reply,
    time: &mut BucketTime,
) -> Result<(), RuntimeError> {
    let bk = &mut buckets[b];
    let n = &graph.nodes[node];
    time.comm += reply.elapsed;
    bk.last_comm = Some(reply.elapsed);
    bk.flat = Some(reply.dst);
    match reply.result {
        Ok(()) => Ok(()),
        Err(CommFailure::Comm(error)) => Err(RuntimeError::Comm {
            node,
            op: n.op,
            instance: n.instance.clone(),
            error,
        }),
        Err(CommFailure::Local(reason)) => Err(RuntimeError::Graph {
            graph: graph.name.clone(),
            location: node_text(graph, node),
            reason,
        }),
    }
}

/// Number of elements of parameter `p`.
fn pty_elems(graph: &Graph, p: usize) -> usize {
    graph.params[p].ty.num_elements()
}
