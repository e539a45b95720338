//! A rank's graph on an Ascend device: weights resident in device memory, every intermediate
//! value in a buffer of the runtime's liveness-based memory plan (with a `Reshape` of a
//! node's result that result in place), one sequence of aclnn launches per step in the
//! graph's order on the device's compute stream.
//!
//! The step is the runtime's, written once for every device: its plan
//! ([`Schedule`]: step kinds, communication calls, gradient buckets and their readers, feeds)
//! and its loop ([`run_nodes`]). This executor is the loop's Ascend device (`AscendStep`
//! implements [`ExecDevice`]): per node, `TupleGetItem` and such a `Reshape` are aliases;
//! `Assign` copies the new value into the parameter's device memory; a communication op goes
//! to the communicator through the runtime's [`DeviceComm`], which chooses in one place
//! between HCCL on device memory ([`HcclComm`]) and staging through host tensors (any shardc
//! communicator) over `AscendBuffers`; gradient buckets are packed into one flat device buffer
//! each and, with HCCL, reduced on the communication stream, joined to the compute stream by
//! events, so the backward pass goes on meanwhile; every other op is lowered to aclnn
//! operators (`crate::ops`), and an op no lowering covers runs on the host backend on copies
//! of its operands, counted in [`AscendStats::host_ops`] with its reason; so does a node
//! whose aclnn operator the CANN found lacks, or refuses in `aclnnXxxGetWorkspaceSize` (an
//! older toolkit, a shape or type a chip does not support).
//!
//! Graph replay: not offered. [`ExecDevice::begin_capture`] keeps its default (`Ok(false)`),
//! so every step is issued node by node (an `aclmdlRI` capture of the step is future work).

use crate::acl::{AscendDevice, DevPtr, Event};
use crate::aclnn::Arena;
use crate::error::{AscendError, AscendResult};
use crate::hccl::HcclComm;
use crate::ops::{self, Lowered, OpCall, Val};
use shardc_ir::{Graph, Operand, ParamKind, TensorType, Type};
use shardc_runtime::executor::device::{CommBuffers, DeviceComm, ExecDevice, Transfer};
use shardc_runtime::executor::run::{run_nodes, LoopState};
use shardc_runtime::executor::schedule::{
    bind_feeds, launched_together, BucketCollective, BucketSpec, MemberSpec, Schedule,
};
use shardc_runtime::executor::CommCall;
use shardc_runtime::init::init_tensor;
use shardc_runtime::memory::{plan_aliasing_reshapes, Location, MemoryPlan};
use shardc_runtime::{Arg, Backend, Communicator, KernelContext, RuntimeError, Tensor};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

/// What ran where, cumulative over steps.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AscendStats {
    /// Node executions lowered to aclnn (or AscendCL copies) on the device.
    pub device_ops: u64,
    /// Node executions run by the host backend, per op kind, with the reason.
    pub host_ops: BTreeMap<String, (u64, String)>,
    /// Communication node executions (and gradient buckets).
    pub comm_ops: u64,
    /// With profiling on ([`AscendExecutor::set_profiling`]): per op kind (`(host)` after a
    /// kind that ran on the host), the executions and the seconds from issuing the node to
    /// the compute stream having run it.
    pub op_seconds: BTreeMap<String, (u64, f64)>,
    /// Steps run.
    pub steps: u64,
    /// Steps run with profiling on.
    pub profiled_steps: u64,
}

impl AscendStats {
    /// One line: device / host / communication counts, then the host ops with their reasons
    /// (and, profiled, where the time went).
    pub fn summary(&self) -> String {
        let host: u64 = self.host_ops.values().map(|(n, _)| n).sum();
        let mut s = format!(
            "{} steps: {} ops on the device (aclnn), {} on the host, {} collectives",
            self.steps, self.device_ops, host, self.comm_ops
        );
        for (op, (n, why)) in &self.host_ops {
            s.push_str(&format!("\n  host: {op} x{n} ({why})"));
        }
        s.push_str(
            "\n  graph replay: off (not offered on Ascend yet: steps are issued node by node)",
        );
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

/// A gradient bucket: its members' gradients packed in one flat device buffer, reduced by one
/// AllReduce when the last member is packed (with HCCL on the communication stream, after the
/// `packed` event of the compute stream; `done` recorded after it); unpacked before the first
/// node that reads a member.
struct Bucket {
    flat: DevPtr,
    packed: Event,
    done: Event,
    in_flight: bool,
}

/// Runs a graph on an Ascend device, step after step (see the module doc).
pub struct AscendExecutor {
    graph: Arc<Graph>,
    dev: Arc<AscendDevice>,
    host: Arc<dyn Backend>,
    /// HCCL on device memory, or staged through the host, or none: decided once.
    comm: DeviceComm<HcclComm>,
    plan: MemoryPlan,
    buffers: Vec<DevPtr>,
    params: Vec<DevPtr>,
    placement: Vec<Option<Lowered>>,
    buckets: Vec<Bucket>,
    /// The step's plan (the runtime's), each node's reads merged into the first of the
    /// nodes launched with it.
    schedule: Arc<Schedule>,
    loop_state: LoopState,
    /// The aclnn workspace and the composite lowerings' temporaries (compute-stream order).
    workspace: Arena,
    temps: Arena,
    /// With HCCL: runs of adjacent sends and receives issued as one `HcclBatchSendRecv`, and
    /// per node its run and whether it issues it (the first).
    p2p_runs: Vec<Vec<usize>>,
    p2p_of: Vec<Option<(usize, bool)>>,
    step_count: u64,
    stats: AscendStats,
    profiling: bool,
}

impl std::fmt::Debug for AscendExecutor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AscendExecutor")
            .field("graph", &self.graph.name)
            .field("device", &self.dev.description())
            .field("buffers", &self.buffers.len())
            .finish()
    }
}

impl Drop for AscendExecutor {
    fn drop(&mut self) {
        let _ = self.dev.bind();
        let drained = self.dev.synchronize().is_ok()
            && self.dev.synchronize_stream(self.dev.comm_stream()).is_ok();
        if !drained {
            // Work held up by a lost peer may still use the memory: left to the process's
            // end rather than freed under it.
            return;
        }
        for &p in self.buffers.iter().chain(&self.params) {
            self.dev.free(p);
        }
        for b in &self.buckets {
            self.dev.free(b.flat);
            self.dev.destroy_event(b.packed);
            self.dev.destroy_event(b.done);
        }
        self.workspace.release(&self.dev);
        self.temps.release(&self.dev);
    }
}

fn byte_len(ty: &TensorType) -> usize {
    ty.num_elements() * ty.dtype.size_bytes()
}

impl AscendExecutor {
    /// Plans `graph` on `dev`: allocates the plan's buffers, uploads every weight from its
    /// initializer. `host` runs the ops no aclnn lowering covers.
    pub fn new(
        graph: Graph,
        dev: Arc<AscendDevice>,
        host: Arc<dyn Backend>,
    ) -> AscendResult<AscendExecutor> {
        AscendExecutor::build(graph, dev, host, DeviceComm::Alone)
    }

    /// As [`AscendExecutor::new`], with the communicator the graph's collectives use (staged
    /// through the host).
    pub fn with_communicator(
        graph: Graph,
        dev: Arc<AscendDevice>,
        host: Arc<dyn Backend>,
        comm: Arc<dyn Communicator>,
    ) -> AscendResult<AscendExecutor> {
        AscendExecutor::build(graph, dev, host, DeviceComm::Staged(comm))
    }

    /// As [`AscendExecutor::new`], collectives through HCCL on device memory.
    pub fn with_hccl(
        graph: Graph,
        dev: Arc<AscendDevice>,
        host: Arc<dyn Backend>,
        hccl: Arc<HcclComm>,
    ) -> AscendResult<AscendExecutor> {
        AscendExecutor::build(graph, dev, host, DeviceComm::Native(hccl))
    }

    fn build(
        graph: Graph,
        dev: Arc<AscendDevice>,
        host: Arc<dyn Backend>,
        comm: DeviceComm<HcclComm>,
    ) -> AscendResult<AscendExecutor> {
        dev.bind()?;
        let plan = plan_aliasing_reshapes(&graph);
        let mut schedule =
            Schedule::new(&graph, comm.communicator().as_deref()).map_err(|e| match e {
                RuntimeError::NeedsCommunicator { op, instance } => AscendError::Op {
                    op,
                    instance,
                    reason: "a communication op needs a communicator (this executor has none)"
                        .into(),
                },
                e => AscendError::Other(e.to_string()),
            })?;
        let p2p_runs = comm.p2p_runs(&schedule, &graph);
        let p2p_of = launched_together(p2p_runs.iter().map(Vec::as_slice), &mut schedule.reads);
        if let Some(n) = comm.native() {
            n.prepare(&schedule.groups(n.size()))?;
        }
        let mut ex = AscendExecutor {
            loop_state: LoopState::new(&schedule),
            placement: vec![None; graph.nodes.len()],
            buffers: Vec::with_capacity(plan.buffers.len()),
            params: Vec::with_capacity(graph.params.len()),
            buckets: Vec::with_capacity(schedule.buckets.len()),
            schedule: Arc::new(schedule),
            graph: Arc::new(graph),
            dev,
            host,
            comm,
            plan,
            workspace: Arena::default(),
            temps: Arena::default(),
            p2p_runs,
            p2p_of,
            step_count: 0,
            stats: AscendStats::default(),
            profiling: false,
        };
        for i in 0..ex.plan.buffers.len() {
            let p = ex.dev.malloc(ex.plan.buffers[i].bytes())?;
            ex.buffers.push(p);
        }
        for i in 0..ex.schedule.buckets.len() {
            let spec = &ex.schedule.buckets[i];
            let flat = ex.dev.malloc(spec.elements * spec.dtype.size_bytes())?;
            let (packed, done) = (ex.dev.event()?, ex.dev.event()?);
            ex.buckets.push(Bucket {
                flat,
                packed,
                done,
                in_flight: false,
            });
        }
        for i in 0..ex.graph.params.len() {
            let p = &ex.graph.params[i];
            let ptr = ex.dev.malloc(byte_len(&p.ty))?;
            ex.params.push(ptr);
            if let ParamKind::Weight { init, .. } = &p.kind {
                let t = init_tensor(init, &p.ty).map_err(|e| {
                    AscendError::Other(format!("initialising weight {}: {e}", p.name))
                })?;
                ex.dev.upload(ptr, &t.to_le_bytes())?;
            }
        }
        Ok(ex)
    }

    /// The device.
    pub fn device(&self) -> &Arc<AscendDevice> {
        &self.dev
    }

    /// The graph.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// The memory plan of the intermediate values (the runtime's).
    pub fn memory_plan(&self) -> &MemoryPlan {
        &self.plan
    }

    /// Whether the graph's collectives run through HCCL on device memory (else they are
    /// staged through the host, or there are none).
    pub fn uses_hccl(&self) -> bool {
        self.comm.native().is_some()
    }

    /// What ran where so far.
    pub fn stats(&self) -> &AscendStats {
        &self.stats
    }

    /// Times every op of the following steps (the compute stream synchronized after each node)
    /// into [`AscendStats::op_seconds`]. Slows the steps down: measure without it, then
    /// profile.
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

    fn weight_index(&self, name: &str) -> AscendResult<usize> {
        self.graph
            .params
            .iter()
            .position(|p| p.name == name && p.is_weight())
            .ok_or_else(|| AscendError::Other(format!("the graph has no weight named {name}")))
    }

    /// A weight's current value, copied to the host.
    pub fn param(&self, name: &str) -> AscendResult<Tensor> {
        let i = self.weight_index(name)?;
        self.download_param(i)
    }

    fn download_param(&self, i: usize) -> AscendResult<Tensor> {
        let ty = &self.graph.params[i].ty;
        let mut bytes = vec![0u8; byte_len(ty)];
        self.dev.download(self.params[i], &mut bytes)?;
        Ok(Tensor::from_le_bytes(ty, &bytes))
    }

    /// Every weight, by name, copied to the host.
    pub fn weights(&self) -> AscendResult<Vec<(String, Tensor)>> {
        (0..self.graph.params.len())
            .filter(|&i| self.graph.params[i].is_weight())
            .map(|i| Ok((self.graph.params[i].name.clone(), self.download_param(i)?)))
            .collect()
    }

    /// Replaces a weight's value (a checkpoint being loaded).
    pub fn set_param(&mut self, name: &str, value: &Tensor) -> AscendResult<()> {
        let i = self.weight_index(name)?;
        let ty = &self.graph.params[i].ty;
        if value.ty() != *ty {
            return Err(AscendError::Other(format!(
                "weight {name} is {ty}, the value is {}",
                value.ty()
            )));
        }
        self.dev.upload(self.params[i], &value.to_le_bytes())
    }

    fn value_ptr(&self, node: usize, elem: usize) -> AscendResult<DevPtr> {
        match self.plan.location(node, elem) {
            Some(Location::Buffer(b)) => Ok(self.buffers[b]),
            Some(Location::Param(p)) => Ok(self.params[p.index()]),
            None => Err(AscendError::Other(format!(
                "node %{node} has no planned value {elem}"
            ))),
        }
    }

    fn operand<'g>(&self, graph: &'g Graph, o: &'g Operand) -> AscendResult<Val<'g>> {
        match o {
            Operand::Param(p) => Ok(Val::Tensor {
                ptr: self.params[p.index()],
                ty: &graph.params[p.index()].ty,
            }),
            Operand::Node(id) => {
                let ty = match &graph.nodes[id.index()].ty {
                    Type::Tensor(t) => t,
                    Type::Tuple(_) => {
                        return Err(AscendError::Other(format!(
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
    /// outputs copied to the host. Every host wait is bounded by `SHARDC_COMM_TIMEOUT`; with
    /// HCCL, a wait that outlasts it fails naming the step's collectives, their groups and
    /// this rank.
    pub fn step(&mut self, feeds: &[(&str, Tensor)]) -> AscendResult<Vec<Tensor>> {
        self.dev.bind()?;
        let r = self.run_step(feeds);
        match (r, self.comm.native()) {
            (Err(AscendError::Timeout { .. }), Some(hccl)) => {
                Err(hccl.timed_out(&self.collectives_named()))
            }
            (r, _) => r,
        }
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

    fn run_step(&mut self, feeds: &[(&str, Tensor)]) -> AscendResult<Vec<Tensor>> {
        let mut feed_index = vec![usize::MAX; self.graph.params.len()];
        bind_feeds(&self.graph, feeds, &mut feed_index)?;
        for (i, &k) in feed_index.iter().enumerate() {
            if let Some((_, t)) = feeds.get(k) {
                self.dev.upload(self.params[i], &t.to_le_bytes())?;
            }
        }
        for b in &mut self.buckets {
            b.in_flight = false;
        }
        let graph = self.graph.clone();
        let schedule = Arc::clone(&self.schedule);
        let mut state = std::mem::take(&mut self.loop_state);
        let profiling = self.profiling;
        let mut dev = AscendStep {
            ex: self,
            graph: &graph,
            profiling,
            started: None,
        };
        let ran = run_nodes(&mut dev, &graph, &schedule, &mut state);
        self.loop_state = state;
        ran?;
        let mut outs = Vec::with_capacity(graph.outputs.len());
        for o in &graph.outputs {
            match self.operand(&graph, o)? {
                Val::Tensor { ptr, ty } => {
                    let mut bytes = vec![0u8; byte_len(ty)];
                    self.dev.download(ptr, &mut bytes)?;
                    outs.push(Tensor::from_le_bytes(ty, &bytes));
                }
                Val::Const(c) => {
                    return Err(AscendError::Other(format!(
                        "graph output {c:?} is a constant"
                    )))
                }
            }
        }
        if profiling {
            self.stats.profiled_steps += 1;
        }
        self.step_count += 1;
        self.stats.steps += 1;
        Ok(outs)
    }

    /// `Assign` node `i`: a device copy into the weight.
    fn assign_node(&mut self, graph: &Graph, i: usize) -> AscendResult<()> {
        let node = &graph.nodes[i];
        let op_err = |reason: &str| AscendError::Op {
            op: node.op,
            instance: node.instance.clone(),
            reason: reason.into(),
        };
        let dst = match node.inputs.first() {
            Some(Operand::Param(p)) => self.params[p.index()],
            _ => return Err(op_err("operand 0 must be a parameter")),
        };
        let (src, ty) = match node
            .inputs
            .get(1)
            .map(|o| self.operand(graph, o))
            .transpose()?
        {
            Some(Val::Tensor { ptr, ty }) => (ptr, ty),
            _ => return Err(op_err("operand 1 must be a tensor")),
        };
        self.dev.copy(dst, src, byte_len(ty))
    }

    /// Communication node `i`: its grouped transfers at the run's first node (HCCL), or the
    /// node on its own.
    fn collective_node(&mut self, graph: &Graph, i: usize, call: &CommCall) -> AscendResult<()> {
        self.stats.comm_ops += 1;
        if let Some((r, first)) = self.p2p_of[i] {
            return if first {
                self.run_p2p(graph, r)
            } else {
                Ok(())
            };
        }
        let node = &graph.nodes[i];
        let ty = match &node.ty {
            Type::Tensor(t) => t.clone(),
            Type::Tuple(_) => {
                return Err(AscendError::Other(format!("{} returns a tuple", node.op)))
            }
        };
        let out = self.value_ptr(i, 0)?;
        let input = match node.inputs.first() {
            Some(o) => match self.operand(graph, o)? {
                Val::Tensor { ptr, ty } => Some((ptr, ty.clone())),
                Val::Const(_) => None,
            },
            None => None,
        };
        let op_err = |reason: String| AscendError::Op {
            op: node.op,
            instance: node.instance.clone(),
            reason,
        };
        let mut bufs = AscendBuffers {
            dev: &self.dev,
            packed: None,
        };
        self.comm.run(
            &mut bufs,
            call,
            input.as_ref().map(|(p, t)| (*p, t)),
            (out, &ty),
            op_err,
        )
    }

    /// Issues the sends and receives of run `r` as one HCCL batch.
    fn run_p2p(&mut self, graph: &Graph, r: usize) -> AscendResult<()> {
        let mut items = Vec::with_capacity(self.p2p_runs[r].len());
        for &i in &self.p2p_runs[r] {
            let node = &graph.nodes[i];
            let call = self.schedule.calls[i]
                .as_deref()
                .cloned()
                .ok_or_else(|| AscendError::Other(format!("node %{i} has no transfer")))?;
            let out_ty = match &node.ty {
                Type::Tensor(t) => t.clone(),
                Type::Tuple(_) => {
                    return Err(AscendError::Other(format!("{} returns a tuple", node.op)))
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
        let mut bufs = AscendBuffers {
            dev: &self.dev,
            packed: None,
        };
        self.comm.transfers(&mut bufs, &items, |e| AscendError::Op {
            op: first.op,
            instance: first.instance.clone(),
            reason: format!("with the {after} sends and receives after it, as one HCCL batch: {e}"),
        })
    }

    /// Compute node `i`: its aclnn lowering, or the host backend.
    fn compute_node(&mut self, graph: &Graph, i: usize) -> AscendResult<()> {
        let node = &graph.nodes[i];
        let inputs: Vec<Val<'_>> = node
            .inputs
            .iter()
            .map(|o| self.operand(graph, o))
            .collect::<AscendResult<_>>()?;
        let outputs: Vec<(DevPtr, TensorType)> = self
            .result_types(i)
            .into_iter()
            .enumerate()
            .map(|(e, t)| Ok((self.value_ptr(i, e)?, t)))
            .collect::<AscendResult<_>>()?;
        let placed = match &self.placement[i] {
            Some(Lowered::Host(why)) => Lowered::Host(why.clone()),
            _ => {
                let call = OpCall {
                    dev: &self.dev,
                    node,
                    inputs: &inputs,
                    outputs: &outputs,
                    workspace: &self.workspace,
                    temps: &self.temps,
                };
                match ops::lower(&call) {
                    Ok(p) => p,
                    // The CANN found lacks the operator, or refuses this node's shapes or
                    // types before launching anything of it: the host runs it (a lowering
                    // never writes its operands, so what it issued before is overwritten).
                    Err(e @ AscendError::MissingSymbol { .. }) => Lowered::Host(e.to_string()),
                    Err(AscendError::Aclnn {
                        call,
                        code,
                        message,
                    }) if call.ends_with("GetWorkspaceSize") => Lowered::Host(format!(
                        "{call} refused it (status {code}{})",
                        if message.is_empty() {
                            String::new()
                        } else {
                            format!(": {message}")
                        }
                    )),
                    Err(e) => return Err(e),
                }
            }
        };
        match &placed {
            Lowered::Device => self.stats.device_ops += 1,
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

    fn run_on_host(
        &self,
        i: usize,
        inputs: &[Val<'_>],
        outputs: &[(DevPtr, TensorType)],
    ) -> AscendResult<()> {
        let node = &self.graph.nodes[i];
        let host_inputs: Vec<Option<Tensor>> = inputs
            .iter()
            .map(|v| match v {
                Val::Tensor { ptr, ty } => {
                    let mut bytes = vec![0u8; byte_len(ty)];
                    self.dev.download(*ptr, &mut bytes)?;
                    Ok(Some(Tensor::from_le_bytes(ty, &bytes)))
                }
                Val::Const(_) => Ok(None),
            })
            .collect::<AscendResult<_>>()?;
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
            .map_err(|e| AscendError::Op {
                op: e.op,
                instance: e.instance,
                reason: format!("on the host: {}", e.reason),
            })?;
        for ((ptr, _), t) in outputs.iter().zip(&outs) {
            self.dev.upload(*ptr, &t.to_le_bytes())?;
        }
        Ok(())
    }

    /// Copies member `m`'s gradient into its bucket's flat buffer.
    fn pack(&mut self, graph: &Graph, m: &MemberSpec) -> AscendResult<()> {
        let elem = self.schedule.buckets[m.bucket].dtype.size_bytes();
        let node = &graph.nodes[m.node];
        let src = match node.inputs.first().map(|o| self.operand(graph, o)) {
            Some(Ok(Val::Tensor { ptr, .. })) => ptr,
            Some(Err(e)) => return Err(e),
            _ => {
                return Err(AscendError::Op {
                    op: node.op,
                    instance: node.instance.clone(),
                    reason: "operand 0 must be a tensor".into(),
                })
            }
        };
        let at = self.schedule.buckets[m.bucket].pack_offset(m);
        self.dev.copy(
            self.buckets[m.bucket].flat + (at * elem) as u64,
            src,
            m.len * elem,
        )
    }

    /// Launches bucket `b`'s AllReduce (every member packed): with HCCL on the communication
    /// stream after the packs, its `done` event recorded; else staged through the host.
    fn launch_bucket(&mut self, graph: &Graph, b: usize, bk: &BucketSpec) -> AscendResult<()> {
        let node = bk.last;
        self.stats.comm_ops += 1;
        let flat = self.buckets[b].flat;
        let packed = self.buckets[b].packed;
        let op_err = |reason: String| AscendError::Op {
            op: graph.nodes[node].op,
            instance: graph.nodes[node].instance.clone(),
            reason: format!("gradient bucket fusion {}: {reason}", bk.id),
        };
        let mut bufs = AscendBuffers {
            dev: &self.dev,
            packed: Some(packed),
        };
        if self.comm.launch_bucket(&mut bufs, bk, flat, op_err)? {
            self.dev
                .record(self.buckets[b].done, self.dev.comm_stream())?;
            self.buckets[b].in_flight = true;
        }
        Ok(())
    }

    /// Orders the compute stream after bucket `b`'s AllReduce (its `done` event).
    fn wait_bucket(&mut self, b: usize) -> AscendResult<()> {
        if self.buckets[b].in_flight {
            self.dev.wait(self.dev.stream(), self.buckets[b].done)?;
            self.buckets[b].in_flight = false;
        }
        Ok(())
    }

    /// Copies member `m`'s reduced gradient from its bucket into its result buffer.
    fn unpack(&mut self, m: &MemberSpec) -> AscendResult<()> {
        let spec = &self.schedule.buckets[m.bucket];
        let elem = spec.dtype.size_bytes();
        let dst = self.value_ptr(m.node, 0)?;
        let flat = self.buckets[m.bucket].flat;
        for (from, to, len) in spec.unpack_copies(m) {
            self.dev.copy(
                dst + (to * elem) as u64,
                flat + (from * elem) as u64,
                len * elem,
            )?;
        }
        Ok(())
    }

    fn profile_label(&self, graph: &Graph, i: usize) -> Option<String> {
        let node = &graph.nodes[i];
        match (&self.placement[i], node.op) {
            (_, shardc_ir::OpKind::TupleGetItem) => None,
            (Some(Lowered::Host(_)), op) => Some(format!("{op} (host)")),
            (_, op) => Some(op.to_string()),
        }
    }
}

/// The executor's device memory as the runtime's [`DeviceComm`] moves it: HCCL's calls on
/// device addresses, or copies to and from host tensors for the staged path.
struct AscendBuffers<'a> {
    dev: &'a Arc<AscendDevice>,
    /// A bucket's event for "the packs are issued" (launching a bucket).
    packed: Option<Event>,
}

impl CommBuffers<HcclComm> for AscendBuffers<'_> {
    type Buffer = DevPtr;
    type Error = AscendError;

    fn native_collective(
        &mut self,
        hccl: &HcclComm,
        call: &CommCall,
        input: Option<(DevPtr, &TensorType)>,
        out: (DevPtr, &TensorType),
    ) -> AscendResult<()> {
        hccl.run_on_device(call, input, out)
    }

    /// The bucket's AllReduce on the communication stream after the compute stream's packs
    /// (their event recorded on the compute stream, waited for by the communication stream).
    fn native_bucket(
        &mut self,
        hccl: &HcclComm,
        bk: &BucketSpec,
        flat: DevPtr,
    ) -> AscendResult<()> {
        let packed = self.packed.ok_or_else(|| {
            AscendError::Other(format!("gradient bucket {} has no packs' event", bk.id))
        })?;
        self.dev.record(packed, self.dev.stream())?;
        self.dev.wait(self.dev.comm_stream(), packed)?;
        match bk.collective {
            BucketCollective::AllReduce => hccl.all_reduce_on(
                self.dev.comm_stream(),
                &bk.group,
                bk.op,
                flat,
                bk.elements,
                bk.dtype,
            ),
            BucketCollective::AllGather { .. } => {
                let (own, count) = bk.send_region();
                let send = flat + (own * bk.dtype.size_bytes()) as u64;
                hccl.all_gather_on(
                    self.dev.comm_stream(),
                    &bk.group,
                    send,
                    flat,
                    count,
                    bk.dtype,
                )
            }
        }
    }

    fn native_transfers(
        &mut self,
        hccl: &HcclComm,
        transfers: &[Transfer<DevPtr>],
    ) -> AscendResult<()> {
        hccl.run_transfers(transfers)
    }

    fn download(&mut self, buf: DevPtr, ty: &TensorType) -> AscendResult<Tensor> {
        let mut bytes = vec![0u8; byte_len(ty)];
        self.dev.download(buf, &mut bytes)?;
        Ok(Tensor::from_le_bytes(ty, &bytes))
    }

    fn upload(&mut self, buf: DevPtr, t: &Tensor) -> AscendResult<()> {
        self.dev.upload(buf, &t.to_le_bytes())
    }
}

/// An [`AscendExecutor`] during one step, as the runtime's run loop drives it.
struct AscendStep<'a> {
    ex: &'a mut AscendExecutor,
    graph: &'a Graph,
    profiling: bool,
    started: Option<Instant>,
}

impl ExecDevice for AscendStep<'_> {
    type Error = AscendError;

    fn compute(&mut self, i: usize) -> AscendResult<()> {
        self.ex.compute_node(self.graph, i)
    }

    fn assign(&mut self, i: usize, _param: usize) -> AscendResult<()> {
        self.ex.assign_node(self.graph, i)
    }

    fn collective(&mut self, i: usize, call: &CommCall) -> AscendResult<()> {
        self.ex.collective_node(self.graph, i, call)
    }

    fn pack(&mut self, _m: usize, member: &MemberSpec) -> AscendResult<()> {
        self.ex.pack(self.graph, member)
    }

    fn launch_bucket(&mut self, b: usize, bucket: &BucketSpec) -> AscendResult<()> {
        self.ex.launch_bucket(self.graph, b, bucket)
    }

    fn wait_bucket(&mut self, b: usize, _bucket: &BucketSpec, _node: usize) -> AscendResult<()> {
        self.ex.wait_bucket(b)
    }

    fn unpack(&mut self, _m: usize, member: &MemberSpec) -> AscendResult<()> {
        self.ex.unpack(member)
    }

    fn before_node(&mut self, _i: usize, _waited: bool) -> AscendResult<()> {
        if self.profiling {
            self.ex.dev.synchronize()?;
            self.started = Some(Instant::now());
        }
        Ok(())
    }

    fn after_node(&mut self, i: usize) -> AscendResult<()> {
        if let Some(t0) = self.started.take() {
            self.ex.dev.synchronize()?;
            if let Some(what) = self.ex.profile_label(self.graph, i) {
                let e = self.ex.stats.op_seconds.entry(what).or_insert((0, 0.0));
                e.0 += 1;
                e.1 += t0.elapsed().as_secs_f64();
            }
        }
        Ok(())
    }
}

fn runtime_err(dev: &AscendDevice) -> impl Fn(AscendError) -> RuntimeError + '_ {
    move |e| RuntimeError::Device {
        device: dev.description(),
        reason: e.to_string(),
    }
}

impl shardc_runtime::StepExecutor for AscendExecutor {
    fn graph(&self) -> &Graph {
        &self.graph
    }

    fn step(&mut self, feeds: &[(&str, Tensor)]) -> Result<Vec<Tensor>, RuntimeError> {
        let dev = self.dev.clone();
        AscendExecutor::step(self, feeds).map_err(runtime_err(&dev))
    }

    fn weight_values(&self) -> Result<Vec<(String, Tensor)>, RuntimeError> {
        self.weights().map_err(runtime_err(&self.dev))
    }

    fn weight_value(&self, name: &str) -> Result<Tensor, RuntimeError> {
        self.param(name).map_err(runtime_err(&self.dev))
    }

    fn set_param(&mut self, name: &str, value: Tensor) -> Result<(), RuntimeError> {
        let dev = self.dev.clone();
        AscendExecutor::set_param(self, name, &value).map_err(runtime_err(&dev))
    }

    fn step_count(&self) -> u64 {
        self.step_count
    }

    fn set_step_count(&mut self, n: u64) {
        self.step_count = n;
    }

    fn device(&self) -> String {
        self.dev.description()
    }

    fn report(&self) -> String {
        format!("{}\n{}", self.plan.summary(), self.stats.summary())
    }
}

/// A rank's executor on an Ascend device, as a training program needs it: device
/// `device_id` (`DEVICE_ID`), or else the rank on its host (`local_rank`, else the rank)
/// modulo the devices AscendCL sees; collectives through HCCL bootstrapped over `comm` when
/// `hccl` and there are several ranks (every rank must call this at the same point: the ranks
/// first agree over `comm` that every one of them can load HCCL, else all stage their
/// collectives through the host), else staged through `comm`. A missing CANN library is an
/// error naming it.
pub fn ascend_executor(
    graph: Graph,
    host: Arc<dyn Backend>,
    comm: Option<Arc<dyn Communicator>>,
    hccl: bool,
    device_id: Option<usize>,
    local_rank: Option<usize>,
) -> AscendResult<AscendExecutor> {
    let count = crate::acl::device_count()?;
    if count == 0 {
        return Err(AscendError::Other(
            "AscendCL sees no Ascend device on this host".into(),
        ));
    }
    let rank = comm.as_ref().map_or(0, |c| c.rank());
    let id = device_id.unwrap_or(local_rank.unwrap_or(rank) % count);
    let dev = AscendDevice::open(id)?;
    match comm {
        Some(c) if hccl && c.size() > 1 => {
            let mine = crate::hccl::hccl_api().err().map(|e| e.to_string());
            match why_not_hccl(c.as_ref(), mine)? {
                None => {
                    let h = HcclComm::new(dev.clone(), c)?;
                    AscendExecutor::with_hccl(graph, dev, host, Arc::new(h))
                }
                Some(why) => {
                    eprintln!("rank {rank}: {why}: collectives staged through the host");
                    AscendExecutor::with_communicator(graph, dev, host, c)
                }
            }
        }
        Some(c) => AscendExecutor::with_communicator(graph, dev, host, c),
        None => AscendExecutor::new(graph, dev, host),
    }
}

/// Why the ranks of `comm`'s world cannot all use HCCL (this rank's own reason `mine`, or
/// that another rank has one), or None: they must decide alike, or the ones that join HCCL
/// wait for the others. Every rank must call it at the same point.
pub fn why_not_hccl(comm: &dyn Communicator, mine: Option<String>) -> AscendResult<Option<String>> {
    shardc_runtime::comm::why_not_all(comm, mine, "another rank of the job cannot load HCCL")
        .map_err(|e| AscendError::Other(format!("agreeing on HCCL: {e}")))
}
