//! A rank's graph on a [`Device`]: weights resident on the device, every intermediate value
//! in a buffer of the runtime's liveness-based memory plan (the CPU executor's, with one more
//! alias: a `Reshape` of a node's result is that result in place, no copy), one kernel
//! sequence per step in the graph's order.
//!
//! The step is the runtime's, written once for every device: its plan
//! ([`shardc_runtime::executor::schedule::Schedule`]: step kinds, communication calls,
//! gradient buckets and their readers, feeds), its loop
//! ([`shardc_runtime::executor::run::run_nodes`]) and its replay state machine ([`Replay`]:
//! warm-up, recording, replay, the reasons it is off). This executor is the loop's GPU device (`GpuStep` implements
//! [`ExecDevice`]): what it adds is the device's own: per node `TupleGetItem` and such a
//! `Reshape` are aliases (the plan gives them the buffer of the value they name);
//! `Assign` copies the new value into the parameter's device memory; a communication op goes
//! to the communicator through the runtime's [`DeviceComm`], which chooses in one place
//! between NCCL on device memory (the communicator is an [`crate::nccl::NcclComm`]) and
//! staging through host tensors ([`shardc_runtime::executor::run_comm`], so any shardc
//! communicator works: threads, shared memory, TCP, MPI) over `CudaBuffers`; every
//! other op is lowered to kernels (`ops.rs`; fused elementwise runs and grouped optimizer
//! updates launched at their first node), and an op no device kernel covers runs on the host
//! backend on copies of its operands, counted in [`GpuStats::host_ops`]. Kernels that meet
//! bad data (a label out of range) set a status word that is read with the step's outputs
//! and reported with the op's name.

use crate::device::Device;
use crate::error::{CudaError, CudaResult};
use crate::kernels::{DevPtr, KernelArg};
use crate::nccl::NcclComm;
use crate::ops::{self, Lowered, OpCall, Val};
use shardc_ir::{DType, Graph, OpKind, Operand, ParamKind, TensorType, Type};
use shardc_runtime::executor::device::{CommBuffers, DeviceComm, ExecDevice, Transfer};
use shardc_runtime::executor::replay::{replay_blocker, Ran, Replay, Replayable};
use shardc_runtime::executor::run::LoopState;
use shardc_runtime::executor::schedule::{
    bind_feeds, launched_together, BucketCollective, BucketSpec, MemberSpec, Schedule,
};
use shardc_runtime::executor::CommCall;
use shardc_runtime::init::init_tensor;
use shardc_runtime::memory::{plan_aliasing_reshapes, Location, MemoryPlan};
use shardc_runtime::{Arg, Backend, Communicator, KernelContext, RuntimeError, Tensor};
use std::collections::BTreeMap;
use std::sync::Arc;

/// What ran where, cumulative over steps.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuStats {
    /// Node executions lowered to device kernels.
    pub device_ops: u64,
    /// Node executions run by the host backend, per op kind, with the reason.
    pub host_ops: BTreeMap<String, (u64, String)>,
    /// Communication node executions.
    pub comm_ops: u64,
    /// Launches of fused elementwise kernels (each covers several of `device_ops`).
    pub fused_kernels: u64,
    /// Of `device_ops`, those run through the device's convolution library (cuDNN on a GPU).
    pub library_ops: u64,
    /// With profiling on ([`GpuExecutor::set_profiling`]): per op kind (`fused elementwise`
    /// for fused kernels, `gradient buckets` for their packing and reductions, `(host)` after
    /// a kind that ran on the host), the executions and the seconds of the compute stream
    /// between the marks before and after them.
    pub op_seconds: BTreeMap<String, (u64, f64)>,
    /// Steps run.
    pub steps: u64,
    /// Steps run with profiling on.
    pub profiled_steps: u64,
    /// `Assign`s whose value an optimizer update had already written into the weight
    /// (`crate::in_place`): device copies saved.
    pub in_place_updates: u64,
    /// Steps whose work was one replay of a recorded graph (see [`GpuExecutor`]).
    pub replayed_steps: u64,
    /// Why steps do not replay a recorded graph, once that is known.
    pub no_replay: Option<String>,
}

/// The counts one step adds to [`GpuStats`] (what a replayed step adds, as recorded).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct StepCounts {
    device_ops: u64,
    comm_ops: u64,
    fused_kernels: u64,
    library_ops: u64,
    in_place_updates: u64,
}

impl StepCounts {
    /// What was added since `before`.
    fn since(self, before: StepCounts) -> StepCounts {
        StepCounts {
            device_ops: self.device_ops - before.device_ops,
            comm_ops: self.comm_ops - before.comm_ops,
            fused_kernels: self.fused_kernels - before.fused_kernels,
            library_ops: self.library_ops - before.library_ops,
            in_place_updates: self.in_place_updates - before.in_place_updates,
        }
    }
}

/// What issuing a step adds besides its work, kept with a recording and added again by
/// each replay: the counts, and the nodes whose kernels report bad data through the status
/// word.
#[derive(Clone, Debug, Default)]
struct Tally {
    counts: StepCounts,
    status_users: Vec<usize>,
}

impl GpuStats {
    fn counts(&self) -> StepCounts {
        StepCounts {
            device_ops: self.device_ops,
            comm_ops: self.comm_ops,
            fused_kernels: self.fused_kernels,
            library_ops: self.library_ops,
            in_place_updates: self.in_place_updates,
        }
    }

    fn set_counts(&mut self, c: StepCounts) {
        self.device_ops = c.device_ops;
        self.comm_ops = c.comm_ops;
        self.fused_kernels = c.fused_kernels;
        self.library_ops = c.library_ops;
        self.in_place_updates = c.in_place_updates;
    }

    fn add_counts(&mut self, c: StepCounts) {
        let now = self.counts();
        self.set_counts(StepCounts {
            device_ops: now.device_ops + c.device_ops,
            comm_ops: now.comm_ops + c.comm_ops,
            fused_kernels: now.fused_kernels + c.fused_kernels,
            library_ops: now.library_ops + c.library_ops,
            in_place_updates: now.in_place_updates + c.in_place_updates,
        });
    }

    /// One line: device / host / communication counts and the host ops.
    pub fn summary(&self) -> String {
        let host: u64 = self.host_ops.values().map(|(n, _)| n).sum();
        let mut s = format!(
            "{} steps: {} ops on the device ({} fused kernels{}), {} on the host, {} collectives",
            self.steps,
            self.device_ops,
            self.fused_kernels,
            if self.library_ops > 0 {
                format!(", {} through the convolution library", self.library_ops)
            } else {
                String::new()
            },
            host,
            self.comm_ops
        );
        for (op, (n, why)) in &self.host_ops {
            s.push_str(&format!("\n  host: {op} x{n} ({why})"));
        }
        if self.in_place_updates > 0 {
            s.push_str(&format!(
                "\n  in place: {} results Assigned to parameters written straight into them (optimizer updates, moving statistics)",
                self.in_place_updates
            ));
        }
        if self.replayed_steps > 0 {
            s.push_str(&format!(
                "\n  graph replay: {} of {} steps ran as one replay of the recorded step",
                self.replayed_steps, self.steps
            ));
        }
        if let Some(why) = &self.no_replay {
            s.push_str(&format!("\n  graph replay: off ({why})"));
        }
        let total: f64 = self.op_seconds.values().map(|v| v.1).sum();
        if total > 0.0 {
            let mut kinds: Vec<(&String, &(u64, f64))> = self.op_seconds.iter().collect();
            kinds.sort_by(|a, b| b.1 .1.total_cmp(&a.1 .1));
            s.push_str(&format!(
                "\n  device time: {:.3} ms per step, by op kind:",
                total * 1e3 / self.profiled_steps.max(1) as f64
            ));
            for (op, (n, secs)) in kinds.iter().take(12) {
                s.push_str(&format!(
                    "\n    {op:<28} x{n:<6} {:>9.3} ms per step  {:>5.1} %",
                    secs * 1e3 / self.profiled_steps.max(1) as f64,
                    100.0 * secs / total
                ));
            }
        }
        s
    }
}

/// Runs a graph on a device, step after step (see the module doc).
///
/// Graph replay: where every launch argument is the same from step to step (every address
/// is fixed for the executor's life, and what changes from step to step, Dropout's keys, is
/// written to device memory before each step; no op on the host, no collective staged
/// through the host or through temporary buffers), the first
/// step runs as it is (the libraries make their plans and workspaces), the second is
/// recorded ([`Device::begin_capture`]) and replayed, and every later step is one replay:
/// one driver call instead of one per kernel, as CUDA Graphs in PyTorch. A recording that
/// fails leaves the executor launching kernel by kernel, with the reason in
/// [`GpuStats::no_replay`]; `SHARDC_CUDA_GRAPHS=0` turns replay off. Profiled steps run
/// kernel by kernel.
pub struct GpuExecutor {
    graph: Arc<Graph>,
    device: Arc<dyn Device>,
    host: Arc<dyn Backend>,
    /// NCCL on device memory, or staged through the host, or none: decided once.
    comm: DeviceComm<NcclComm>,
    plan: MemoryPlan,
    buffers: Vec<DevPtr>,
    params: Vec<DevPtr>,
    status: DevPtr,
    placement: Vec<Option<Lowered>>,
    /// Gradient buckets (`fusion: k` AllReduces) and, per node, its member index.
    buckets: Vec<Bucket>,
    /// The step's plan (the runtime's, shared with every executor), each node's reads
    /// merged into the first of the nodes launched with it.
    schedule: Arc<Schedule>,
    /// What the run loop tracks within a step.
    loop_state: LoopState,
    /// Scratch memory the ops share (im2col columns).
    workspace: ops::Workspace,
    /// Fused elementwise runs, and per node its run and whether it launches it (the first).
    runs: Vec<crate::fusion::FusedRun>,
    fused: Vec<Option<(usize, bool)>>,
    step_count: u64,
    stats: GpuStats,
    /// Whether steps time their ops ([`GpuExecutor::set_profiling`]).
    profiling: bool,
    /// Per node and result element, the weight an optimizer update writes in place.
    in_place: Vec<Vec<Option<usize>>>,
    /// Momentum updates launched together, and per node its group and whether it launches
    /// it (the first member).
    groups: Vec<UpdateGroup>,
    group_of: Vec<Option<(usize, bool)>>,
    /// With NCCL: runs of adjacent sends and receives issued as one NCCL group (see
    /// [`Schedule::p2p_runs`]), and per node its run and whether it issues it (the first).
    p2p_runs: Vec<Vec<usize>>,
    p2p_of: Vec<Option<(usize, bool)>>,
    /// Whether steps replay a recorded graph (the runtime's state machine).
    replay: Replay<Tally>,
    /// One device word per Dropout node, its key for the running step (written before each
    /// step, so that a replayed step draws its own masks), and per node its word's number.
    dropout_keys: DevPtr,
    key_slot: Vec<Option<usize>>,
}

/// One launch of several in-place updates (`in_place::update_groups`).
struct UpdateGroup {
    op: OpKind,
    kernel: String,
    /// Per weight its tensors' addresses (ApplyMomentum: var, accum, grad; Adam: var, m, v,
    /// grad), elements and start, as i64, on the device.
    table: DevPtr,
    count: usize,
    total: usize,
    /// The shared scalars (a pointer for a tensor, else 0, and a constant's value), then
    /// `use_nesterov`.
    args: Vec<KernelArg>,
}

/// A gradient bucket: its members' gradients packed in one flat device buffer and reduced by
/// one AllReduce when the last member exists (on NCCL's stream, overlapping the rest of the
/// backward pass); unpacked before the first node that reads a member.
#[derive(Debug)]
struct Bucket {
    /// The schedule's bucket.
    flat: DevPtr,
    /// Its AllReduce is on NCCL's stream, not yet waited for.
    in_flight: bool,
}

impl std::fmt::Debug for GpuExecutor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuExecutor")
            .field("graph", &self.graph.name)
            .field("device", &self.device.description())
            .field("buffers", &self.buffers.len())
            .finish()
    }
}

impl Drop for GpuExecutor {
    fn drop(&mut self) {
        let _ = self.device.synchronize();
        for &p in self.buffers.iter().chain(&self.params) {
            self.device.free(p);
        }
        for b in &self.buckets {
            self.device.free(b.flat);
        }
        for g in &self.groups {
            self.device.free(g.table);
        }
        if let Some(graph) = self.replay.recorded() {
            self.device.drop_graph(graph);
        }
        self.workspace.release(self.device.as_ref());
        self.device.free(self.status);
        if self.dropout_keys != 0 {
            self.device.free(self.dropout_keys);
        }
    }
}

fn byte_len(ty: &TensorType) -> usize {
    ty.num_elements() * ty.dtype.size_bytes()
}

impl GpuExecutor {
    /// Plans `graph` on `device`: allocates the plan's buffers, uploads every weight from its
    /// initializer. `host` runs the ops no device kernel covers.
    pub fn new(
        graph: Graph,
        device: Arc<dyn Device>,
        host: Arc<dyn Backend>,
    ) -> CudaResult<GpuExecutor> {
        GpuExecutor::build(graph, device, host, DeviceComm::Alone)
    }

    /// As [`GpuExecutor::new`], with the communicator the graph's collectives use (staged
    /// through the host).
    pub fn with_communicator(
        graph: Graph,
        device: Arc<dyn Device>,
        host: Arc<dyn Backend>,
        comm: Arc<dyn Communicator>,
    ) -> CudaResult<GpuExecutor> {
        GpuExecutor::build(graph, device, host, DeviceComm::Staged(comm))
    }

    /// As [`GpuExecutor::new`], collectives through NCCL on device memory.
    pub fn with_nccl(
        graph: Graph,
        device: Arc<dyn Device>,
        host: Arc<dyn Backend>,
        nccl: Arc<NcclComm>,
    ) -> CudaResult<GpuExecutor> {
        GpuExecutor::build(graph, device, host, DeviceComm::Native(nccl))
    }

    fn build(
        graph: Graph,
        device: Arc<dyn Device>,
        host: Arc<dyn Backend>,
        comm: DeviceComm<NcclComm>,
    ) -> CudaResult<GpuExecutor> {
        let plan = plan_aliasing_reshapes(&graph);
        let schedule =
            Schedule::new(&graph, comm.communicator().as_deref()).map_err(|e| match e {
                RuntimeError::NeedsCommunicator { op, instance } => CudaError::Op {
                    op,
                    instance,
                    reason: "a communication op needs a communicator (this executor has none)"
                        .into(),
                },
                e => CudaError::Other(e.to_string()),
            })?;
        let buckets: Vec<Bucket> = schedule
            .buckets
            .iter()
            .map(|_| Bucket {
                flat: 0,
                in_flight: false,
            })
            .collect();
        // Elementwise runs (not through a collective's buckets); SHARDC_CUDA_FUSION=0 turns
        // fusion off (to compare).
        let excluded: Vec<bool> = (0..graph.nodes.len())
            .map(|i| schedule.member_of(i).is_some() || schedule.calls[i].is_some())
            .collect();
        let mut runs = if std::env::var("SHARDC_CUDA_FUSION").as_deref() == Ok("0") {
            Vec::new()
        } else {
            crate::fusion::plan(&graph, &excluded)
        };
        let mut schedule = schedule;
        let p2p_runs = comm.p2p_runs(&schedule, &graph);
        let needs = &mut schedule.reads;
        let fused = launched_together(runs.iter().map(|r| r.nodes.as_slice()), needs);
        if !runs.is_empty() {
            let text = crate::fusion::source(&mut runs);
            let mut names: Vec<String> = runs.iter().map(|r| r.kernel.clone()).collect();
            names.sort();
            names.dedup();
            device.load_kernels("fused.cu", &text, &names)?;
        }
        let in_place = crate::in_place::in_place_updates(&graph);
        // Runs of momentum or Adam updates launched together at their first member, which waits for
        // the buckets any member reads.
        let group_members = crate::in_place::update_groups(&graph, &in_place);
        let group_of = launched_together(group_members.iter().map(Vec::as_slice), needs);
        let p2p_of = launched_together(p2p_runs.iter().map(Vec::as_slice), needs);
        let replay = Replay::new(replay_blocker(&graph, &schedule.calls, comm.staged()));
        let mut key_slot = vec![None; graph.nodes.len()];
        let mut keys = 0;
        for (i, n) in graph.nodes.iter().enumerate() {
            if n.op == OpKind::Dropout {
                key_slot[i] = Some(keys);
                keys += 1;
            }
        }
        if let Some(n) = comm.native() {
            n.prepare(&schedule.groups(n.size()))?;
        }
        let mut ex = GpuExecutor {
            replay,
            dropout_keys: 0,
            key_slot,
            runs,
            fused,
            buckets,
            loop_state: LoopState::new(&schedule),
            schedule: Arc::new(schedule),
            placement: vec![None; graph.nodes.len()],
            buffers: Vec::with_capacity(plan.buffers.len()),
            params: Vec::with_capacity(graph.params.len()),
            status: 0,
            graph: Arc::new(graph),
            device,
            host,
            comm,
            plan,
            workspace: ops::Workspace::default(),
            step_count: 0,
            stats: GpuStats::default(),
            profiling: false,
            in_place,
            groups: Vec::new(),
            group_of,
            p2p_runs,
            p2p_of,
        };
        if keys > 0 {
            ex.dropout_keys = ex.device.alloc(keys * 8)?;
        }
        ex.status = ex.device.alloc(4)?;
        ex.device.upload(ex.status, &[0; 4])?;
        for b in &ex.plan.buffers {
            let p = ex.device.alloc(b.bytes())?;
            ex.buffers.push(p);
        }
        for i in 0..ex.buckets.len() {
            let spec = &ex.schedule.buckets[i];
            let bytes = spec.elements * spec.dtype.size_bytes();
            ex.buckets[i].flat = ex.device.alloc(bytes)?;
        }
        for i in 0..ex.graph.params.len() {
            let p = &ex.graph.params[i];
            let ptr = ex.device.alloc(byte_len(&p.ty))?;
            ex.params.push(ptr);
            if let ParamKind::Weight { init, .. } = &p.kind {
                let t = init_tensor(init, &p.ty).map_err(|e| CudaError::Other(e.to_string()))?;
                ex.device.upload(ptr, &t.to_le_bytes())?;
            }
        }
        for members in group_members {
            let group = ex.update_group(members)?;
            ex.groups.push(group);
        }
        Ok(ex)
    }

    /// The table and arguments of one launch for `members` (update nodes of
    /// `in_place::update_groups`): every address is fixed for the executor's life (weights
    /// resident, gradients in planned buffers), so the table is uploaded once.
    fn update_group(&self, members: Vec<usize>) -> CudaResult<UpdateGroup> {
        let graph = self.graph.clone();
        let first = &graph.nodes[members[0]];
        let err = |reason: String| CudaError::Op {
            op: first.op,
            instance: first.instance.clone(),
            reason,
        };
        // The tensor operands of each row: the updated ones, then the gradient.
        let (tensors, family): (&[usize], &str) = match first.op {
            OpKind::ApplyMomentum => (&[0, 1, 3], "apply_momentum_multi"),
            OpKind::Adam => (&[0, 1, 2, 9], "adam_multi"),
            other => return Err(err(format!("{other} updates are not launched together"))),
        };
        let mut table: Vec<i64> = Vec::with_capacity(members.len() * (tensors.len() + 2));
        let mut total = 0usize;
        let mut dtype = DType::Float32;
        for &m in &members {
            let node = &graph.nodes[m];
            let mut elements = 0;
            for (slot, &operand) in tensors.iter().enumerate() {
                match node
                    .inputs
                    .get(operand)
                    .map(|o| self.operand(&graph, o))
                    .transpose()?
                {
                    Some(Val::Tensor { ptr, ty }) => {
                        if slot == 0 {
                            elements = ty.num_elements();
                            dtype = ty.dtype;
                        } else if ty.num_elements() != elements || ty.dtype != dtype {
                            return Err(err(format!(
                                "'{}': operand {operand} is {ty}, unlike the weight",
                                node.instance
                            )));
                        }
                        table.push(ptr as i64);
                    }
                    _ => {
                        return Err(err(format!(
                            "'{}': operand {operand} must be a tensor",
                            node.instance
                        )))
                    }
                }
            }
            table.extend([elements as i64, total as i64]);
            total += elements;
        }
        let mut args = Vec::new();
        for &i in crate::in_place::shared_scalars(first.op) {
            match first
                .inputs
                .get(i)
                .map(|o| self.operand(&graph, o))
                .transpose()?
            {
                Some(Val::Const(c)) => {
                    let v = c
                        .as_f64()
                        .ok_or_else(|| err(format!("operand {i} must be a number, got {c:?}")))?;
                    args.extend([KernelArg::Ptr(0), KernelArg::F64(v)]);
                }
                Some(Val::Tensor { ptr, ty }) if ty.num_elements() == 1 && ty.dtype == dtype => {
                    args.extend([KernelArg::Ptr(ptr), KernelArg::F64(0.0)]);
                }
                _ => {
                    return Err(err(format!(
                        "operand {i} must be a number or a one-element {dtype} tensor"
                    )))
                }
            }
        }
        args.push(KernelArg::I32(i32::from(
            first.attrs.bool_or("use_nesterov", false),
        )));
        let bytes: Vec<u8> = table.iter().flat_map(|v| v.to_ne_bytes()).collect();
        let ptr = self.device.alloc(bytes.len())?;
        self.device.upload(ptr, &bytes)?;
        Ok(UpdateGroup {
            op: first.op,
            kernel: format!(
                "{family}_{}",
                if dtype == DType::Float64 {
                    "f64"
                } else {
                    "f32"
                }
            ),
            table: ptr,
            count: members.len(),
            total,
            args,
        })
    }

    /// Launches group `g`'s updates (at its first member).
    fn run_group(&mut self, g: usize) -> CudaResult<()> {
        let group = &self.groups[g];
        let block = self.device.block_size();
        let grid = (group.total.div_ceil(block as usize).max(1) as u64)
            .min(self.device.max_grid() as u64) as u32;
        let mut args = vec![
            KernelArg::Ptr(group.table),
            KernelArg::I64(group.count as i64),
            KernelArg::I64(group.total as i64),
        ];
        args.extend(group.args.iter().cloned());
        self.device.launch(&group.kernel, grid, block, &args)
    }

    /// Makes every later step launch its kernels one by one instead of replaying a recorded
    /// graph (to compare the two; `SHARDC_CUDA_GRAPHS=0` does it for every executor).
    pub fn disable_graph_replay(&mut self) {
        if let Some(graph) = self
            .replay
            .turn_off("turned off by disable_graph_replay".into())
        {
            self.device.drop_graph(graph);
        }
    }

    /// The device.
    pub fn device(&self) -> &Arc<dyn Device> {
        &self.device
    }

    /// The graph.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// The memory plan of the intermediate values (the runtime's).
    pub fn memory_plan(&self) -> &MemoryPlan {
        &self.plan
    }

    /// What ran where so far.
    pub fn stats(&self) -> &GpuStats {
        &self.stats
    }

    /// Times every op of the following steps on the device's compute stream (events between
    /// the ops; on the emulator, the host's clock) into [`GpuStats::op_seconds`]. Costs a
    /// little per op: measure steps without it, then profile. The marks are the device's:
    /// profile one executor per device (not ranks that share a GPU).
    pub fn set_profiling(&mut self, on: bool) {
        self.profiling = on;
    }

    /// Steps run so far.
    pub fn step_count(&self) -> u64 {
        self.step_count
    }

    /// Sets the step counter (a resumed run).
    pub fn set_step_count(&mut self, n: u64) {
        self.step_count = n;
    }

    /// A weight's current value, copied to the host.
    pub fn param(&self, name: &str) -> CudaResult<Tensor> {
        let i = self
            .graph
            .params
            .iter()
            .position(|p| p.name == name && p.is_weight())
            .ok_or_else(|| CudaError::Other(format!("the graph has no weight named {name}")))?;
        self.download_param(i)
    }

    fn download_param(&self, i: usize) -> CudaResult<Tensor> {
        let ty = &self.graph.params[i].ty;
        let mut bytes = vec![0u8; byte_len(ty)];
        self.device.download(self.params[i], &mut bytes)?;
        Ok(Tensor::from_le_bytes(ty, &bytes))
    }

    /// Every weight, by name, copied to the host.
    pub fn weights(&self) -> CudaResult<Vec<(String, Tensor)>> {
        (0..self.graph.params.len())
            .filter(|&i| self.graph.params[i].is_weight())
            .map(|i| Ok((self.graph.params[i].name.clone(), self.download_param(i)?)))
            .collect()
    }

    /// Replaces a weight's value (a checkpoint being loaded).
    pub fn set_param(&mut self, name: &str, value: &Tensor) -> CudaResult<()> {
        let i = self
            .graph
            .params
            .iter()
            .position(|p| p.name == name && p.is_weight())
            .ok_or_else(|| CudaError::Other(format!("the graph has no weight named {name}")))?;
        let ty = &self.graph.params[i].ty;
        if value.ty() != *ty {
            return Err(CudaError::Other(format!(
                "weight {name} is {ty}, the value is {}",
                value.ty()
            )));
        }
        self.device.upload(self.params[i], &value.to_le_bytes())
    }

    fn value_ptr(&self, node: usize, elem: usize) -> CudaResult<DevPtr> {
        if let Some(&Some(q)) = self.in_place.get(node).and_then(|v| v.get(elem)) {
            return Ok(self.params[q]);
        }
        match self.plan.location(node, elem) {
            Some(Location::Buffer(b)) => Ok(self.buffers[b]),
            Some(Location::Param(p)) => Ok(self.params[p.index()]),
            None => Err(CudaError::Other(format!(
                "node %{node} has no planned value {elem}"
            ))),
        }
    }

    fn operand<'g>(&self, graph: &'g Graph, o: &'g Operand) -> CudaResult<Val<'g>> {
        match o {
            Operand::Param(p) => Ok(Val::Tensor {
                ptr: self.params[p.index()],
                ty: &graph.params[p.index()].ty,
            }),
            Operand::Node(id) => {
                let ty = match &graph.nodes[id.index()].ty {
                    Type::Tensor(t) => t,
                    Type::Tuple(_) => {
                        return Err(CudaError::Other(format!(
                            "node %{} is a tuple read as a tensor",
                            id.index()
                        )))
                    }
                };
                Ok(Val::Tensor {
                    ptr: self.value_ptr(id.index(), 0)?,
                    ty,
                })
            }
            Operand::Const(c) => Ok(Val::Const(c)),
        }
    }

    fn result_types(&self, i: usize) -> Vec<TensorType> {
        match &self.graph.nodes[i].ty {
            Type::Tensor(t) => vec![t.clone()],
            Type::Tuple(ts) => ts.clone(),
        }
    }

    /// Runs one step: uploads the feeds (by input name), runs every node, returns the graph's
    /// outputs copied to the host. With NCCL the step runs under its watchdog: where it waits
    /// past the communicator's timeout for a member that never comes, the communicators are
    /// aborted and the step fails, naming its collectives ([`NcclComm::arm`]).
    pub fn step(&mut self, feeds: &[(&str, Tensor)]) -> CudaResult<Vec<Tensor>> {
        let Some(nccl) = self.comm.native().cloned() else {
            return self.run_step(feeds);
        };
        let armed = nccl.arm();
        let r = self.run_step(feeds);
        if armed.fired() {
            return Err(nccl.timed_out(&self.collectives_named()));
        }
        r
    }

    /// The step's collectives, in graph order (the first eight), for an error.
    fn collectives_named(&self) -> String {
        let named: Vec<String> = self
            .schedule
            .calls
            .iter()
            .enumerate()
            .filter_map(|(i, c)| {
                let n = &self.graph.nodes[i];
                let whom = match c.as_deref()? {
                    CommCall::AllReduce { group, .. }
                    | CommCall::AllGather { group, .. }
                    | CommCall::ReduceScatter { group, .. }
                    | CommCall::AllToAll { group, .. }
                    | CommCall::Broadcast { group, .. } => format!("on ranks {group:?}"),
                    CommCall::Send { dest, .. } => format!("to rank {dest}"),
                    CommCall::Receive { src, .. } => format!("from rank {src}"),
                };
                Some(format!("{} '{}' {whom}", n.op, n.instance))
            })
            .collect();
        match named.len() {
            0 => "the step's collectives".into(),
            k if k <= 8 => format!("the step's collectives ({})", named.join(", ")),
            k => format!(
                "the step's {k} collectives ({}, ...)",
                named[..8].join(", ")
            ),
        }
    }

    fn run_step(&mut self, feeds: &[(&str, Tensor)]) -> CudaResult<Vec<Tensor>> {
        let mut feed_index = vec![usize::MAX; self.graph.params.len()];
        bind_feeds(&self.graph, feeds, &mut feed_index)?;
        for (i, &k) in feed_index.iter().enumerate() {
            if let Some((_, t)) = feeds.get(k) {
                self.device.upload(self.params[i], &t.to_le_bytes())?;
            }
        }
        let graph = self.graph.clone();
        if self.dropout_keys != 0 {
            let keys: Vec<u8> = graph
                .nodes
                .iter()
                .filter(|n| n.op == OpKind::Dropout)
                .flat_map(|n| {
                    let (a, b) = (n.attrs.int_or("seed0", 0), n.attrs.int_or("seed1", 0));
                    shardc_ir::dropout::key(a, b, self.step_count).to_ne_bytes()
                })
                .collect();
            self.device.upload(self.dropout_keys, &keys)?;
        }
        let mut status_users = Vec::new();
        // Profiling: (mark after, what ran since the previous mark).
        let mut marks: Vec<(usize, String)> = Vec::new();
        let mut first_mark = None;
        if self.profiling {
            self.device.reset_marks();
            first_mark = self.device.mark()?;
        }
        let profile = first_mark.is_some().then_some(&mut marks);
        let ran = self.issue_step(&graph, &mut status_users, profile)?;
        if ran.replayed() {
            self.stats.replayed_steps += 1;
        }
        if let Ran::RecordingFailed(why) = &ran {
            eprintln!(
                "shardc: the step of '{}' could not be recorded as one CUDA graph, so its kernels are launched one by one: {why}",
                graph.name
            );
        }
        if let Some(why) = self.replay.off() {
            self.stats.no_replay = Some(why.to_string());
        }
        let mut outs = Vec::with_capacity(graph.outputs.len());
        for o in &graph.outputs {
            match self.operand(&graph, o)? {
                Val::Tensor { ptr, ty } => {
                    let mut bytes = vec![0u8; byte_len(ty)];
                    self.device.download(ptr, &mut bytes)?;
                    outs.push(Tensor::from_le_bytes(ty, &bytes));
                }
                Val::Const(c) => {
                    return Err(CudaError::Other(format!(
                        "graph output {c:?} is a constant"
                    )))
                }
            }
        }
        let mut status = [0u8; 4];
        self.device.download(self.status, &mut status)?;
        let bad = i32::from_ne_bytes(status);
        if bad != 0 {
            self.device.upload(self.status, &[0; 4])?;
            let node = status_users.first().map(|&i: &usize| &self.graph.nodes[i]);
            return Err(match node {
                Some(n) => CudaError::Op {
                    op: n.op,
                    instance: n.instance.clone(),
                    reason: if n.op == OpKind::Gather {
                        format!(
                            "the index at position {} is out of range for the gathered axis",
                            bad - 1
                        )
                    } else if n.op == OpKind::UnsortedSegmentSum {
                        format!(
                            "the segment id at position {} is not below num_segments",
                            bad - 1
                        )
                    } else {
                        format!(
                            "the label of row {} is out of range for the classes",
                            bad - 1
                        )
                    },
                },
                None => CudaError::Other(format!("a kernel reported bad data (code {bad})")),
            });
        }
        if let Some(mut prev) = first_mark {
            // The outputs' download waited for the stream: every mark is passed.
            self.device.synchronize()?;
            for (m, what) in marks {
                let secs = self.device.seconds_between(prev, m)?;
                let e = self.stats.op_seconds.entry(what).or_insert((0, 0.0));
                e.0 += 1;
                e.1 += secs;
                prev = m;
            }
            self.stats.profiled_steps += 1;
        }
        self.step_count += 1;
        self.stats.steps += 1;
        Ok(outs)
    }

    /// Issues one step's work through the runtime's replay state machine and run loop:
    /// replayed, recorded, or node by node (always when `marks`: profile it).
    fn issue_step(
        &mut self,
        graph: &Graph,
        status_users: &mut Vec<usize>,
        marks: Option<&mut Vec<(usize, String)>>,
    ) -> CudaResult<Ran> {
        for b in &mut self.buckets {
            b.in_flight = false;
        }
        let profiled = marks.is_some();
        let schedule = Arc::clone(&self.schedule);
        let mut state = std::mem::take(&mut self.loop_state);
        let mut replay = std::mem::take(&mut self.replay);
        let mut dev = GpuStep {
            ex: self,
            graph,
            status_users,
            marks,
        };
        let ran = replay.step(&mut dev, graph, &schedule, &mut state, profiled);
        self.loop_state = state;
        self.replay = replay;
        ran
    }

    /// The first op placed on the host, as a reason not to replay (after the first step).
    fn placed_on_host(&self) -> Option<String> {
        self.placement
            .iter()
            .enumerate()
            .find_map(|(i, p)| match p {
                Some(Lowered::Host(why)) => {
                    let n = &self.graph.nodes[i];
                    Some(format!(
                        "{} '{}' runs on the host ({why})",
                        n.op, n.instance
                    ))
                }
                _ => None,
            })
    }

    /// Records a mark after `what` (profiling).
    fn mark_after(&self, marks: &mut Vec<(usize, String)>, what: String) -> CudaResult<()> {
        if let Some(m) = self.device.mark()? {
            marks.push((m, what));
        }
        Ok(())
    }

    /// What node `i` is called in a profile, or None when it launches nothing of its own
    /// (a member of a fused run after the first, a tuple projection).
    fn profile_label(&self, graph: &Graph, i: usize) -> Option<String> {
        let node = &graph.nodes[i];
        match self.fused[i] {
            Some((_, true)) => return Some("fused elementwise".into()),
            Some((_, false)) => return None,
            None => {}
        }
        match self.group_of[i] {
            Some((g, true)) => {
                return Some(format!(
                    "{} ({} weights, one launch)",
                    self.groups[g].op, self.groups[g].count
                ))
            }
            Some((_, false)) => return None,
            None => {}
        }
        match (&self.placement[i], node.op) {
            (_, OpKind::TupleGetItem) => None,
            (Some(Lowered::Host(_)), op) => Some(format!("{op} (host)")),
            (Some(Lowered::Library), op) => Some(format!("{op} (cuDNN)")),
            (_, op) => Some(op.to_string()),
        }
    }

    /// `Assign` node `i`: a device copy into the weight, or nothing where an update wrote it
    /// in place.
    fn assign_node(&mut self, graph: &Graph, i: usize) -> CudaResult<()> {
        let node = &graph.nodes[i];
        let dst = match node.inputs.first() {
            Some(Operand::Param(p)) => self.params[p.index()],
            _ => {
                return Err(CudaError::Op {
                    op: node.op,
                    instance: node.instance.clone(),
                    reason: "operand 0 must be a parameter".into(),
                })
            }
        };
        let (src, ty) = match node
            .inputs
            .get(1)
            .map(|o| self.operand(graph, o))
            .transpose()?
        {
            Some(Val::Tensor { ptr, ty }) => (ptr, ty),
            _ => {
                return Err(CudaError::Op {
                    op: node.op,
                    instance: node.instance.clone(),
                    reason: "operand 1 must be a tensor".into(),
                })
            }
        };
        if src != dst {
            self.device.copy(dst, src, byte_len(ty))?;
        } else {
            self.stats.in_place_updates += 1;
        }
        Ok(())
    }

    /// Communication node `i`: its p2p group at the group's first node (NCCL), or the node
    /// on its own.
    fn collective_node(&mut self, graph: &Graph, i: usize, call: &CommCall) -> CudaResult<()> {
        self.stats.comm_ops += 1;
        if let Some((r, first)) = self.p2p_of[i] {
            return if first {
                self.run_p2p(graph, r)
            } else {
                Ok(())
            };
        }
        self.run_comm(graph, i, call)
    }

    /// Compute node `i`: its fused run or update group at the first member, else its
    /// lowering (a device kernel, the convolution library, or the host backend).
    fn compute_node(
        &mut self,
        graph: &Graph,
        i: usize,
        status_users: &mut Vec<usize>,
    ) -> CudaResult<()> {
        let node = &graph.nodes[i];
        if let Some((r, first)) = self.fused[i] {
            self.stats.device_ops += 1;
            return if first {
                self.run_fused(graph, r)
            } else {
                Ok(())
            };
        }
        if let Some((g, first)) = self.group_of[i] {
            self.stats.device_ops += 1;
            return if first { self.run_group(g) } else { Ok(()) };
        }
        let inputs: Vec<Val<'_>> = node
            .inputs
            .iter()
            .map(|o| self.operand(graph, o))
            .collect::<CudaResult<_>>()?;
        let types = self.result_types(i);
        let outputs: Vec<(DevPtr, TensorType)> = types
            .into_iter()
            .enumerate()
            .map(|(e, t)| Ok((self.value_ptr(i, e)?, t)))
            .collect::<CudaResult<_>>()?;
        let placed = match &self.placement[i] {
            Some(Lowered::Host(why)) => Lowered::Host(why.clone()),
            _ => {
                let call = OpCall {
                    dev: self.device.as_ref(),
                    node,
                    inputs: &inputs,
                    outputs: &outputs,
                    status: self.status,
                    dropout_key: self.key_slot[i].map_or(0, |k| self.dropout_keys + 8 * k as u64),
                    workspace: &self.workspace,
                };
                ops::lower(&call)?
            }
        };
        if matches!(
            node.op,
            OpKind::SparseSoftmaxCrossEntropyWithLogits
                | OpKind::Gather
                | OpKind::UnsortedSegmentSum
        ) && placed == Lowered::Device
        {
            status_users.push(i);
        }
        match &placed {
            Lowered::Device => self.stats.device_ops += 1,
            Lowered::Library => {
                self.stats.device_ops += 1;
                self.stats.library_ops += 1;
            }
            Lowered::Host(why) => {
                self.run_on_host(i, &inputs, &outputs)?;
                let e = self
                    .stats
                    .host_ops
                    .entry(node.op.to_string())
                    .or_insert((0, why.clone()));
                e.0 += 1;
            }
        }
        self.placement[i] = Some(placed);
        Ok(())
    }

    fn download_val(&self, v: &Val<'_>) -> CudaResult<Option<Tensor>> {
        match v {
            Val::Tensor { ptr, ty } => {
                let mut bytes = vec![0u8; byte_len(ty)];
                self.device.download(*ptr, &mut bytes)?;
                Ok(Some(Tensor::from_le_bytes(ty, &bytes)))
            }
            Val::Const(_) => Ok(None),
        }
    }

    fn run_on_host(
        &self,
        i: usize,
        inputs: &[Val<'_>],
        outputs: &[(DevPtr, TensorType)],
    ) -> CudaResult<()> {
        let node = &self.graph.nodes[i];
        let host_inputs: Vec<Option<Tensor>> = inputs
            .iter()
            .map(|v| self.download_val(v))
            .collect::<CudaResult<_>>()?;
        // A tensor operand was downloaded; a constant passes as it is.
        let args: Vec<Arg<'_>> = inputs
            .iter()
            .zip(&host_inputs)
            .filter_map(|(v, t)| match (v, t) {
                (_, Some(t)) => Some(Arg::Tensor(t)),
                (Val::Const(c), None) => Some(Arg::Const(c)),
                (Val::Tensor { .. }, None) => None,
            })
            .collect();
        let mut outs: Vec<Tensor> = outputs.iter().map(|(_, t)| Tensor::zeros(t)).collect();
        let ctx = KernelContext {
            step: self.step_count,
            rank: self.comm.rank() as u32,
        };
        self.host
            .run(node, &args, &mut outs, &ctx)
            .map_err(|e| CudaError::Op {
                op: e.op,
                instance: e.instance,
                reason: format!("on the host: {}", e.reason),
            })?;
        for ((ptr, _), t) in outputs.iter().zip(&outs) {
            self.device.upload(*ptr, &t.to_le_bytes())?;
        }
        Ok(())
    }

    /// Launches fused run `r` (its first node's turn; the others do nothing).
    fn run_fused(&mut self, graph: &Graph, r: usize) -> CudaResult<()> {
        let run = &self.runs[r];
        let mut args = Vec::with_capacity(run.inputs.len() + run.outputs.len() + 1);
        for o in &run.inputs {
            match self.operand(graph, o)? {
                Val::Tensor { ptr, .. } => args.push(KernelArg::Ptr(ptr)),
                Val::Const(c) => {
                    return Err(CudaError::Other(format!(
                        "fused kernel {}: constant {c:?} given as a memory operand",
                        run.kernel
                    )))
                }
            }
        }
        for &n in &run.outputs {
            args.push(KernelArg::Ptr(self.value_ptr(n, 0)?));
        }
        let shape = match &graph.nodes[run.nodes[0]].ty {
            Type::Tensor(t) => t.shape.clone(),
            Type::Tuple(_) => Vec::new(),
        };
        for st in run.strides.iter().flatten() {
            let s = crate::kernels::Strided::single(&shape, st).ok_or_else(|| {
                CudaError::Other(format!("fused kernel {}: more than 8 dims", run.kernel))
            })?;
            args.push(KernelArg::Strided(Box::new(s)));
        }
        args.push(KernelArg::I64(run.elements as i64));
        let block = self.device.block_size();
        let grid = (run.elements.div_ceil(block as usize).max(1) as u64)
            .min(self.device.max_grid() as u64) as u32;
        self.stats.fused_kernels += 1;
        self.device.launch(&run.kernel, grid, block, &args)
    }

    /// Copies member `m`'s gradient into its bucket's flat buffer.
    fn pack(&mut self, graph: &Graph, m: &MemberSpec) -> CudaResult<()> {
        let (node, b, len) = (m.node, m.bucket, m.len);
        let elem = self.schedule.buckets[b].dtype.size_bytes();
        let src = match graph.nodes[node]
            .inputs
            .first()
            .map(|o| self.operand(graph, o))
        {
            Some(Ok(Val::Tensor { ptr, .. })) => ptr,
            Some(Err(e)) => return Err(e),
            _ => {
                return Err(CudaError::Op {
                    op: graph.nodes[node].op,
                    instance: graph.nodes[node].instance.clone(),
                    reason: "operand 0 must be a tensor".into(),
                })
            }
        };
        let at = self.schedule.buckets[b].pack_offset(m);
        self.device
            .copy(self.buckets[b].flat + (at * elem) as u64, src, len * elem)
    }

    /// Launches bucket `b`'s AllReduce (every member packed): with NCCL on its stream after
    /// the packs, recorded in event `b`; else staged through the host, at once.
    fn launch_bucket(&mut self, graph: &Graph, b: usize, bk: &BucketSpec) -> CudaResult<()> {
        let node = bk.last;
        self.stats.comm_ops += 1;
        let flat = self.buckets[b].flat;
        let op_err = |reason: String| CudaError::Op {
            op: graph.nodes[node].op,
            instance: graph.nodes[node].instance.clone(),
            reason: format!("gradient bucket fusion {}: {reason}", bk.id),
        };
        let mut bufs = CudaBuffers {
            device: self.device.as_ref(),
            workspace: &self.workspace,
        };
        if self.comm.launch_bucket(&mut bufs, bk, flat, op_err)? {
            self.device.comm_record(b)?;
            self.buckets[b].in_flight = true;
        }
        Ok(())
    }

    /// Orders the compute stream after bucket `b`'s AllReduce (its event).
    fn wait_bucket(&mut self, b: usize) -> CudaResult<()> {
        if self.buckets[b].in_flight {
            self.device.compute_after_comm(b)?;
            self.buckets[b].in_flight = false;
        }
        Ok(())
    }

    /// Copies member `m`'s reduced gradient from its bucket into its result buffer.
    fn unpack(&mut self, m: &MemberSpec) -> CudaResult<()> {
        let spec = &self.schedule.buckets[m.bucket];
        let elem = spec.dtype.size_bytes();
        let dst = self.value_ptr(m.node, 0)?;
        let flat = self.buckets[m.bucket].flat;
        for (from, to, len) in spec.unpack_copies(m) {
            self.device.copy(
                dst + (to * elem) as u64,
                flat + (from * elem) as u64,
                len * elem,
            )?;
        }
        Ok(())
    }

    /// Issues the sends and receives of run `r` ([`Schedule::p2p_runs`]) as one NCCL group.
    fn run_p2p(&mut self, graph: &Graph, r: usize) -> CudaResult<()> {
        let mut items = Vec::with_capacity(self.p2p_runs[r].len());
        for &i in &self.p2p_runs[r] {
            let node = &graph.nodes[i];
            let call = self.schedule.calls[i]
                .as_deref()
                .cloned()
                .ok_or_else(|| CudaError::Other(format!("node %{i} has no transfer")))?;
            let out_ty = match &node.ty {
                Type::Tensor(t) => t.clone(),
                Type::Tuple(_) => {
                    return Err(CudaError::Other(format!("{} returns a tuple", node.op)))
                }
            };
            let input = match node.inputs.first() {
                Some(o) => match self.operand(graph, o)? {
                    Val::Tensor { ptr, ty } => Some((ptr, ty.clone())),
                    Val::Const(_) => None,
                },
                None => None,
            };
            items.push(Transfer {
                call,
                input,
                out: (self.value_ptr(i, 0)?, out_ty),
            });
        }
        let first = &graph.nodes[self.p2p_runs[r][0]];
        let after = self.p2p_runs[r].len() - 1;
        let mut bufs = CudaBuffers {
            device: self.device.as_ref(),
            workspace: &self.workspace,
        };
        self.comm.transfers(&mut bufs, &items, |e| CudaError::Op {
            op: first.op,
            instance: first.instance.clone(),
            reason: format!("with the {after} sends and receives after it, as one NCCL group: {e}"),
        })
    }

    fn run_comm(&mut self, graph: &Graph, i: usize, call: &CommCall) -> CudaResult<()> {
        let node = &graph.nodes[i];
        let ty = match &node.ty {
            Type::Tensor(t) => t.clone(),
            Type::Tuple(_) => return Err(CudaError::Other(format!("{} returns a tuple", node.op))),
        };
        let out = self.value_ptr(i, 0)?;
        let input = match node.inputs.first() {
            Some(o) => match self.operand(graph, o)? {
                Val::Tensor { ptr, ty } => Some((ptr, ty.clone())),
                Val::Const(_) => None,
            },
            None => None,
        };
        let op_err = |reason: String| CudaError::Op {
            op: node.op,
            instance: node.instance.clone(),
            reason,
        };
        let mut bufs = CudaBuffers {
            device: self.device.as_ref(),
            workspace: &self.workspace,
        };
        self.comm.run(
            &mut bufs,
            call,
            input.as_ref().map(|(p, t)| (*p, t)),
            (out, &ty),
            op_err,
        )
    }
}

/// The executor's device memory as the runtime's [`DeviceComm`] moves it: NCCL's calls on
/// device pointers, or copies to and from host tensors for the staged path.
struct CudaBuffers<'a> {
    device: &'a dyn Device,
    workspace: &'a ops::Workspace,
}

impl CommBuffers<NcclComm> for CudaBuffers<'_> {
    type Buffer = DevPtr;
    type Error = CudaError;

    fn native_collective(
        &mut self,
        nccl: &NcclComm,
        call: &CommCall,
        input: Option<(DevPtr, &TensorType)>,
        out: (DevPtr, &TensorType),
    ) -> CudaResult<()> {
        nccl.run_on_device_in(call, input, out, Some(self.workspace))
    }

    fn native_bucket(&mut self, nccl: &NcclComm, bk: &BucketSpec, flat: DevPtr) -> CudaResult<()> {
        match bk.collective {
            BucketCollective::AllReduce => {
                nccl.all_reduce_on_comm_stream(&bk.group, bk.op, flat, bk.elements, bk.dtype)
            }
            BucketCollective::AllGather { .. } => {
                let (own, count) = bk.send_region();
                let send = flat + (own * bk.dtype.size_bytes()) as u64;
                nccl.all_gather_on_comm_stream(&bk.group, send, flat, count, bk.dtype)
            }
        }
    }

    fn native_transfers(
        &mut self,
        nccl: &NcclComm,
        transfers: &[Transfer<DevPtr>],
    ) -> CudaResult<()> {
        nccl.run_transfers(transfers)
    }

    fn download(&mut self, buf: DevPtr, ty: &TensorType) -> CudaResult<Tensor> {
        let mut bytes = vec![0u8; byte_len(ty)];
        self.device.download(buf, &mut bytes)?;
        Ok(Tensor::from_le_bytes(ty, &bytes))
    }

    fn upload(&mut self, buf: DevPtr, t: &Tensor) -> CudaResult<()> {
        self.device.upload(buf, &t.to_le_bytes())
    }
}

/// A [`GpuExecutor`] during one step, as the runtime's run loop drives it: device
/// pointers, kernels lowered per node (fused runs, grouped updates and grouped transfers
/// launched at their first node), buckets on NCCL's stream or staged through the host.
struct GpuStep<'a> {
    ex: &'a mut GpuExecutor,
    graph: &'a Graph,
    status_users: &'a mut Vec<usize>,
    /// Profiling: (mark after, what ran since the previous mark).
    marks: Option<&'a mut Vec<(usize, String)>>,
}

impl ExecDevice for GpuStep<'_> {
    type Error = CudaError;

    fn compute(&mut self, i: usize) -> CudaResult<()> {
        self.ex.compute_node(self.graph, i, self.status_users)
    }

    fn assign(&mut self, i: usize, _param: usize) -> CudaResult<()> {
        self.ex.assign_node(self.graph, i)
    }

    fn collective(&mut self, i: usize, call: &CommCall) -> CudaResult<()> {
        self.ex.collective_node(self.graph, i, call)
    }

    fn pack(&mut self, _m: usize, member: &MemberSpec) -> CudaResult<()> {
        self.ex.pack(self.graph, member)
    }

    fn launch_bucket(&mut self, b: usize, bucket: &BucketSpec) -> CudaResult<()> {
        self.ex.launch_bucket(self.graph, b, bucket)
    }

    fn wait_bucket(&mut self, b: usize, _bucket: &BucketSpec, _node: usize) -> CudaResult<()> {
        self.ex.wait_bucket(b)
    }

    fn unpack(&mut self, _m: usize, member: &MemberSpec) -> CudaResult<()> {
        self.ex.unpack(member)
    }

    fn before_node(&mut self, _i: usize, waited: bool) -> CudaResult<()> {
        match self.marks.as_deref_mut() {
            Some(m) if waited => self.ex.mark_after(m, "gradient buckets".into()),
            _ => Ok(()),
        }
    }

    fn after_node(&mut self, i: usize) -> CudaResult<()> {
        if let Some(m) = self.marks.as_deref_mut() {
            if let Some(what) = self.ex.profile_label(self.graph, i) {
                self.ex.mark_after(m, what)?;
            }
        }
        Ok(())
    }

    fn begin_capture(&mut self) -> CudaResult<bool> {
        self.ex.device.begin_capture()
    }

    fn end_capture(&mut self) -> CudaResult<usize> {
        self.ex.device.end_capture()
    }

    fn replay(&mut self, graph: usize) -> CudaResult<()> {
        self.ex.device.replay(graph)
    }

    fn drop_capture(&mut self, graph: usize) {
        self.ex.device.drop_graph(graph)
    }

    fn nodes_done(&mut self) -> CudaResult<()> {
        match self.marks.as_deref_mut() {
            Some(m) if !self.ex.buckets.is_empty() => {
                self.ex.mark_after(m, "gradient buckets".into())
            }
            _ => Ok(()),
        }
    }
}

impl Replayable for GpuStep<'_> {
    type Tally = Tally;

    fn tally(&self) -> Tally {
        Tally {
            counts: self.ex.stats.counts(),
            status_users: self.status_users.clone(),
        }
    }

    fn tally_since(&self, before: &Tally) -> Tally {
        Tally {
            counts: self.ex.stats.counts().since(before.counts),
            status_users: self
                .status_users
                .get(before.status_users.len()..)
                .unwrap_or_default()
                .to_vec(),
        }
    }

    fn rewind(&mut self, before: &Tally) {
        self.ex.stats.set_counts(before.counts);
        self.status_users.truncate(before.status_users.len());
        for b in &mut self.ex.buckets {
            b.in_flight = false;
        }
    }

    fn replayed(&mut self, added: &Tally) {
        self.ex.stats.add_counts(added.counts);
        self.status_users.extend_from_slice(&added.status_users);
    }

    fn placed_on_host(&self) -> Option<String> {
        self.ex.placed_on_host()
    }
}

fn runtime_err(device: &dyn Device) -> impl Fn(CudaError) -> shardc_runtime::RuntimeError + '_ {
    move |e| shardc_runtime::RuntimeError::Device {
        device: device.description(),
        reason: e.to_string(),
    }
}

impl shardc_runtime::StepExecutor for GpuExecutor {
    fn graph(&self) -> &Graph {
        &self.graph
    }

    fn step(
        &mut self,
        feeds: &[(&str, Tensor)],
    ) -> Result<Vec<Tensor>, shardc_runtime::RuntimeError> {
        let dev = self.device.clone();
        GpuExecutor::step(self, feeds).map_err(runtime_err(dev.as_ref()))
    }

    fn weight_values(&self) -> Result<Vec<(String, Tensor)>, shardc_runtime::RuntimeError> {
        self.weights().map_err(runtime_err(self.device.as_ref()))
    }

    fn weight_value(&self, name: &str) -> Result<Tensor, shardc_runtime::RuntimeError> {
        self.param(name).map_err(runtime_err(self.device.as_ref()))
    }

    fn set_param(&mut self, name: &str, value: Tensor) -> Result<(), shardc_runtime::RuntimeError> {
        let dev = self.device.clone();
        GpuExecutor::set_param(self, name, &value).map_err(runtime_err(dev.as_ref()))
    }

    fn step_count(&self) -> u64 {
        self.step_count
    }

    fn set_step_count(&mut self, n: u64) {
        self.step_count = n;
    }

    fn device(&self) -> String {
        self.device.description()
    }

    fn report(&self) -> String {
        format!("{}\n{}", self.plan.summary(), self.stats.summary())
    }
}

/// Which device a [`gpu_executor`] runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuChoice {
    /// A real GPU: `ordinal`, or (None) the rank on its host modulo the GPUs.
    Cuda {
        /// The GPU, when fixed.
        ordinal: Option<usize>,
    },
    /// The kernels emulated on the host (tests on machines without a GPU).
    Emulated,
}

/// A rank's executor on a GPU, as a training program needs it: the device opened (probed
/// first: a missing library is an error naming it), collectives through NCCL bootstrapped
/// over `comm` when `nccl` and there are several ranks (on the emulated GPU, NCCL emulated
/// over `comm`: [`crate::nccl::over_host::HostNccl`]), else staged through `comm`.
/// `local_rank` picks the GPU when the choice does not.
pub fn gpu_executor(
    choice: GpuChoice,
    graph: Graph,
    host: Arc<dyn Backend>,
    comm: Option<Arc<dyn Communicator>>,
    nccl: bool,
    local_rank: Option<usize>,
) -> CudaResult<GpuExecutor> {
    match choice {
        GpuChoice::Emulated => {
            let emulated = Arc::new(crate::emulator::EmulatedDevice::new(64)?);
            let dev: Arc<dyn Device> = emulated.clone();
            match comm {
                Some(c) if nccl && c.size() > 1 => {
                    let lib = Arc::new(crate::nccl::over_host::HostNccl::new(emulated, c.clone()));
                    let n = NcclComm::with_library(dev.clone(), lib, c)?;
                    GpuExecutor::with_nccl(graph, dev, host, Arc::new(n))
                }
                Some(c) => GpuExecutor::with_communicator(graph, dev, host, c),
                None => GpuExecutor::new(graph, dev, host),
            }
        }
        GpuChoice::Cuda { ordinal } => {
            let count = crate::cuda::device_count()?;
            if count == 0 {
                return Err(CudaError::NoDevice(
                    "the CUDA driver sees no GPU on this host".into(),
                ));
            }
            let rank = comm.as_ref().map_or(0, |c| c.rank());
            let local = local_rank.unwrap_or(rank);
            // With the default mapping, more ranks than GPUs on a host share GPUs.
            let mut shared = match (ordinal, &comm) {
                (None, Some(c)) => crate::nccl::shared_gpu(local, count, c.size()),
                _ => None,
            };
            if let (true, Some(c)) = (nccl, &comm) {
                if c.size() > 1 {
                    shared = crate::nccl::why_not_nccl(c.as_ref(), shared)?;
                }
            }
            let ordinal = ordinal.unwrap_or(local % count);
            let cuda = Arc::new(crate::cuda::CudaDevice::new(ordinal)?);
            let dev: Arc<dyn Device> = cuda.clone();
            if let (true, Some(why)) = (nccl, &shared) {
                eprintln!("rank {rank}: {why}: collectives staged through the host");
            }
            match comm {
                Some(c) if nccl && c.size() > 1 && shared.is_none() => {
                    let n = NcclComm::new(cuda, c)?;
                    GpuExecutor::with_nccl(graph, dev, host, Arc::new(n))
                }
                Some(c) => GpuExecutor::with_communicator(graph, dev, host, c),
                None => GpuExecutor::new(graph, dev, host),
            }
        }
    }
}
