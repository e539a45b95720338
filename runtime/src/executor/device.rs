//! The device trait: what the one run loop ([`super::run::run_nodes`]) asks of a device, so
//! that the schedule, the gradient buckets and their overlap with compute, the order of the
//! collectives and graph capture are written once, and a device brings only its memory, its
//! kernels, its streams and its communicator.
//!
//! # For the implementer of a new device (Ascend: AscendCL, aclnn, HCCL)
//!
//! The executor of a device is a type that owns the device's state for one graph and
//! implements [`ExecDevice`]; its `step` binds the feeds, calls [`super::run::run_nodes`]
//! (or, where the device records and replays whole steps, [`super::replay::Replay::step`],
//! which also implements [`super::replay::Replayable`]: the runtime decides when to warm up,
//! record, replay or stay off, the device brings the capture hooks, its counts and its
//! ops placed on the host), then reads the outputs. It never walks the graph itself: the
//! walk, what waits for what, when a bucket is launched and when a step is recorded are the
//! runtime's. What it builds once, at creation:
//!
//! - **The schedule** ([`super::schedule::Schedule::new`]): per node a
//!   [`super::schedule::NodeStep`], the communication nodes' calls (attributes checked), the
//!   gradient buckets (members, offsets in the flat buffer, the launching last member) and,
//!   per node, the members it reads. A device that launches several nodes as one (fused
//!   elementwise chains, grouped optimizer updates, grouped point-to-point transfers) merges
//!   the members the later nodes read into the first's
//!   ([`super::schedule::launched_together`]), so the loop waits before the launch.
//! - **Memory** from the runtime's liveness plan ([`crate::memory::plan`], or
//!   [`crate::memory::plan_aliasing_reshapes`] where a `Reshape` can be a view): one device
//!   allocation per plan buffer (`aclrtMalloc`), one per weight (uploaded from its
//!   initializer, [`crate::init::init_tensor`]), one flat buffer per gradient bucket
//!   ([`super::schedule::BucketSpec::elements`] of its dtype). Every address is then fixed for
//!   the executor's life, which is what lets a recorded step be replayed.
//! - **Kernels by `OpKind`**: a lowering per node, decided at its first run or at creation: a
//!   device kernel (on Ascend an aclnn operator: `aclnnXxxGetWorkspaceSize` once for the
//!   node's shapes, then `aclnnXxx` on the compute stream with the workspace), or the host
//!   fallback: the CPU backend's kernel ([`crate::Backend::run`]) on copies of the operands,
//!   counted and reported with its reason.
//! - **Two streams**: a compute stream (every kernel, copy, pack and unpack, in the loop's
//!   order) and a communication stream for the gradient buckets, joined by events (`aclrtEvent`,
//!   `aclrtRecordEvent` / `aclrtStreamWaitEvent`). A device with one stream and a host
//!   thread for collectives (the CPU) is the same shape: its communication thread is its
//!   communication stream, a ticket its event.
//! - **A communicator**: device-native (NCCL, HCCL: collectives on device memory on the
//!   communication stream) or any runtime [`crate::Communicator`] staged through host
//!   tensors ([`super::comm_call::run_comm`], the one host implementation of a communication
//!   node), held as one [`DeviceComm`] decided at construction (the caller's choice of
//!   constructor); the loop only sees [`ExecDevice::collective`] and the bucket hooks.
//!   The choice between native and staged is made in one place, [`DeviceComm`]'s
//!   [`DeviceComm::run`], [`DeviceComm::launch_bucket`] and [`DeviceComm::transfers`]: the
//!   device's hooks call them with a [`CommBuffers`] (its native calls on device buffers,
//!   and a download and an upload for the staged path) and never branch themselves.
//!
//! # What the loop calls, per step
//!
//! For each node `i` in program order: for each member `m` it reads whose result is not yet
//! unpacked this step, [`ExecDevice::wait_bucket`] once per bucket, then
//! [`ExecDevice::unpack`]; then [`ExecDevice::before_node`], the node's own hook by its
//! [`super::schedule::NodeStep`] (`Compute` → [`ExecDevice::compute`], `Assign` →
//! [`ExecDevice::assign`], `Collective` → [`ExecDevice::collective`], `Pack` →
//! [`ExecDevice::pack`] and, at the bucket's last member, [`ExecDevice::launch_bucket`];
//! `Alias` → nothing), then [`ExecDevice::after_node`]. After the last node: the members the
//! outputs read are unpacked, every launched bucket not yet waited for is waited for (a
//! device stream that forked for a bucket is joined again), and [`ExecDevice::nodes_done`].
//!
//! Collectives are issued in program order by every rank (the loop never reorders them), so
//! every rank's communicator sees the same sequence; a bucket reduces its members exactly
//! as their separate AllReduces would.

use super::comm_call::CommCall;
use super::schedule::{BucketSpec, MemberSpec, Schedule};
use crate::error::RuntimeError;
use crate::tensor::Tensor;
use shardc_ir::{Graph, TensorType};

/// A device as the run loop drives it (see the module doc). Every hook issues its work in
/// stream order and may return before the work is done, except where its doc says it waits.
pub trait ExecDevice {
    /// The device's error (the runtime's errors convert into it).
    type Error: From<RuntimeError>;

    /// Runs compute node `i`: its kernel by `OpKind` (or, for a node launched with others,
    /// the group's launch at the first node and nothing at the others), or the host fallback.
    /// Outputs go to the node's planned buffers; the operands are the plan's buffers, the
    /// weights, the fed inputs and the node's constants.
    fn compute(&mut self, i: usize) -> Result<(), Self::Error>;

    /// `Assign` node `i`: weight `param` takes the node's value (a copy, a buffer swap on
    /// the host, or nothing where an update already wrote into the weight).
    fn assign(&mut self, i: usize, param: usize) -> Result<(), Self::Error>;

    /// Communication node `i` on its own (not a bucket member): `call` from its operand
    /// into its result buffer, finished (in stream order) before the next node.
    fn collective(&mut self, i: usize, call: &CommCall) -> Result<(), Self::Error>;

    /// Copies member `m`'s operand into its bucket's flat buffer at its offset.
    fn pack(&mut self, m: usize, member: &MemberSpec) -> Result<(), Self::Error>;

    /// Launches bucket `b`'s AllReduce over its flat buffer (every member packed): on the
    /// communication stream after the compute stream's packs, so compute goes on; a device
    /// may run it at once where overlapping would not pay.
    fn launch_bucket(&mut self, b: usize, bucket: &BucketSpec) -> Result<(), Self::Error>;

    /// Orders what follows after bucket `b`'s AllReduce (the compute stream waits for its
    /// event; the host thread waits for its ticket). `node` is the member whose result is
    /// needed first (errors name it). Called once per launched bucket per step.
    fn wait_bucket(
        &mut self,
        b: usize,
        bucket: &BucketSpec,
        node: usize,
    ) -> Result<(), Self::Error>;

    /// Copies member `m`'s reduced elements from its bucket into the member's result buffer
    /// (after [`ExecDevice::wait_bucket`] of its bucket).
    fn unpack(&mut self, m: usize, member: &MemberSpec) -> Result<(), Self::Error>;

    /// Before node `i`'s hook; `waited` says whether buckets were waited for and unpacked
    /// for it (a profiler's mark). The default does nothing.
    fn before_node(&mut self, i: usize, waited: bool) -> Result<(), Self::Error> {
        let _ = (i, waited);
        Ok(())
    }

    /// After node `i`'s hook (a profiler's mark). The default does nothing.
    fn after_node(&mut self, i: usize) -> Result<(), Self::Error> {
        let _ = i;
        Ok(())
    }

    /// After the last node, its buckets waited for. The default does nothing.
    fn nodes_done(&mut self) -> Result<(), Self::Error> {
        Ok(())
    }

    /// Starts recording the work issued until [`ExecDevice::end_capture`] instead of running
    /// it (a CUDA Graph; on Ascend an `aclmdlRI` model capture), with every argument's value
    /// of now. `Ok(false)`: the device does not record (the default), and steps are issued
    /// node by node.
    fn begin_capture(&mut self) -> Result<bool, Self::Error> {
        Ok(false)
    }

    /// Ends the recording and returns its number; an error discards it (none of it ran).
    fn end_capture(&mut self) -> Result<usize, Self::Error> {
        Err(RuntimeError::Device {
            device: "this device".into(),
            reason: "it cannot record steps".into(),
        }
        .into())
    }

    /// Runs recorded step `graph` (the same work on the same addresses).
    fn replay(&mut self, graph: usize) -> Result<(), Self::Error> {
        Err(RuntimeError::Device {
            device: "this device".into(),
            reason: format!("it has no recorded step {graph}"),
        }
        .into())
    }

    /// Frees recorded step `graph`.
    fn drop_capture(&mut self, graph: usize) {
        let _ = graph;
    }
}

/// A device's communicator, decided once when its executor is built (see the module doc):
/// device-native collectives on device buffers on the communication stream (`N`: NCCL,
/// HCCL, which is also a runtime [`crate::Communicator`]), or any runtime communicator
/// staged through host tensors ([`super::comm_call::run_comm`]), or none (one rank).
///
/// For the Ascend implementer: build `Native` with the HCCL communicator where every rank
/// has its own device and HCCL is found, `Staged` with the caller's communicator otherwise;
/// a staged communicator blocks graph replay ([`super::replay::replay_blocker`]).
pub enum DeviceComm<N> {
    /// One rank: no collectives.
    Alone,
    /// Device-native collectives on device memory, on the communication stream.
    Native(std::sync::Arc<N>),
    /// A runtime communicator, staged through host tensors.
    Staged(std::sync::Arc<dyn crate::Communicator>),
}

impl<N: crate::Communicator + 'static> DeviceComm<N> {
    /// The communicator as the runtime's (the schedule's checks, ranks, the host fallback).
    pub fn communicator(&self) -> Option<std::sync::Arc<dyn crate::Communicator>> {
        match self {
            DeviceComm::Alone => None,
            DeviceComm::Native(n) => Some(n.clone()),
            DeviceComm::Staged(c) => Some(c.clone()),
        }
    }

    /// The device-native communicator, if that is the choice.
    pub fn native(&self) -> Option<&std::sync::Arc<N>> {
        match self {
            DeviceComm::Native(n) => Some(n),
            _ => None,
        }
    }

    /// Whether collectives are staged through the host.
    pub fn staged(&self) -> bool {
        matches!(self, DeviceComm::Staged(_))
    }

    /// This rank (0 alone).
    pub fn rank(&self) -> usize {
        match self {
            DeviceComm::Alone => 0,
            DeviceComm::Native(n) => n.rank(),
            DeviceComm::Staged(c) => c.rank(),
        }
    }

    /// The runs of sends and receives issued as one group ([`Schedule::p2p_runs`]): only a
    /// device-native communicator groups them; staged, each transfer runs on its own.
    pub fn p2p_runs(&self, schedule: &Schedule, graph: &Graph) -> Vec<Vec<usize>> {
        match self {
            DeviceComm::Native(_) => schedule.p2p_runs(graph),
            _ => Vec::new(),
        }
    }

    /// Runs communication node `call` from `input` into `out`: natively on the device's
    /// buffers ([`CommBuffers::native_collective`]), or staged: the operand downloaded, the
    /// call run by [`super::comm_call::run_comm`], the result uploaded. A failure of the
    /// collective itself is named by `fail` (the reason's text); the device's own errors
    /// (a copy) pass as they are.
    pub fn run<D: CommBuffers<N>>(
        &self,
        dev: &mut D,
        call: &CommCall,
        input: Option<(D::Buffer, &TensorType)>,
        out: (D::Buffer, &TensorType),
        fail: impl Fn(String) -> D::Error,
    ) -> Result<(), D::Error> {
        let comm = match self {
            DeviceComm::Native(n) => {
                return dev
                    .native_collective(n, call, input, out)
                    .map_err(|e| fail(e.to_string()))
            }
            DeviceComm::Staged(c) => c,
            DeviceComm::Alone => return Err(fail("no communicator".into())),
        };
        let host_in = match input {
            Some((p, t)) => Some(dev.download(p, t)?),
            None => None,
        };
        let mut result = Tensor::zeros(out.1);
        super::comm_call::run_comm(comm.as_ref(), call, host_in.as_ref(), &mut result, out.1)
            .map_err(|f| fail(f.to_string()))?;
        dev.upload(out.0, &result)
    }

    /// Launches `bucket`'s collective over its flat buffer `flat` ([`BucketSpec`]: an
    /// AllReduce in place, or an AllGather of its tail into its head): natively on the
    /// communication stream after the compute stream's packs
    /// ([`CommBuffers::native_bucket`]; `Ok(true)`: in flight, the device records its
    /// event), or staged through the host at once (`Ok(false)`). Failures as in
    /// [`DeviceComm::run`].
    pub fn launch_bucket<D: CommBuffers<N>>(
        &self,
        dev: &mut D,
        bucket: &BucketSpec,
        flat: D::Buffer,
        fail: impl Fn(String) -> D::Error,
    ) -> Result<bool, D::Error> {
        let comm = match self {
            DeviceComm::Native(n) => {
                dev.native_bucket(n, bucket, flat)
                    .map_err(|e| fail(e.to_string()))?;
                return Ok(true);
            }
            DeviceComm::Staged(c) => c,
            DeviceComm::Alone => return Err(fail("no communicator".into())),
        };
        let ty = TensorType::new(bucket.dtype, vec![bucket.elements]);
        let mut t = dev.download(flat, &ty)?;
        super::comm_thread::run_bucket(
            comm.as_ref(),
            &bucket.group,
            bucket.collective,
            bucket.op,
            bucket.per_rank,
            &mut t,
        )
        .map_err(|e| fail(e.to_string()))?;
        dev.upload(flat, &t)?;
        Ok(false)
    }

    /// Issues a run of sends and receives ([`DeviceComm::p2p_runs`]) as one native group
    /// ([`CommBuffers::native_transfers`]); failures as in [`DeviceComm::run`]. Only a
    /// device-native communicator has runs; otherwise `fail` names that.
    pub fn transfers<D: CommBuffers<N>>(
        &self,
        dev: &mut D,
        transfers: &[Transfer<D::Buffer>],
        fail: impl Fn(String) -> D::Error,
    ) -> Result<(), D::Error> {
        match self {
            DeviceComm::Native(n) => dev
                .native_transfers(n, transfers)
                .map_err(|e| fail(e.to_string())),
            _ => Err(fail(
                "grouped transfers need a device-native communicator".into(),
            )),
        }
    }
}

/// One send or receive of a group issued together ([`DeviceComm::transfers`]), on device
/// buffers `B`.
#[derive(Debug, Clone)]
pub struct Transfer<B> {
    /// `CommCall::Send` or `CommCall::Receive`.
    pub call: CommCall,
    /// A send's tensor.
    pub input: Option<(B, TensorType)>,
    /// Where the result goes (a send's is its input, as on the CPU).
    pub out: (B, TensorType),
}

/// What a device brings so that [`DeviceComm`] chooses between native and staged
/// collectives in one place: its native calls on device buffers (`N`: NCCL, HCCL) and, for
/// the staged path, a copy of a buffer to a host tensor and back.
///
/// # For the Ascend implementer (HCCL)
///
/// Implement it on a small view of the executor (the device handle, its scratch), with
/// `Buffer` the device address type and `N` the HCCL communicator:
///
/// - [`CommBuffers::native_collective`]: the node's collective (`HcclAllReduce`,
///   `HcclAllGather`, `HcclReduceScatter`, `HcclAlltoAll`, `HcclBroadcast`, `HcclSend` /
///   `HcclRecv`) from the operand's buffer into the result's, ordered in the compute stream
///   (finished, in stream order, before the next node).
/// - [`CommBuffers::native_bucket`]: the bucket's collective on its flat buffer
///   ([`BucketSpec::collective`]: an AllReduce in place, or an AllGather from the buffer's
///   [`BucketSpec::send_region`] into its head), on the communication stream after the
///   compute stream's packs (the device records the
///   bucket's event when [`DeviceComm::launch_bucket`] returns `Ok(true)`).
/// - [`CommBuffers::native_transfers`]: a run of sends and receives as one group
///   (`HcclGroupStart` / `HcclGroupEnd`, or HCCL's batched send/receive).
/// - [`CommBuffers::download`] / [`CommBuffers::upload`]: `aclrtMemcpy` device to host and
///   back, in stream order (a download waits for the work before it).
///
/// The hooks return the device's errors; [`DeviceComm`] wraps a native call's failure with
/// the caller's naming (the node, the bucket) and passes a copy's error on unchanged.
pub trait CommBuffers<N> {
    /// A device buffer's address.
    type Buffer: Copy;
    /// The device's error.
    type Error: From<RuntimeError> + std::fmt::Display;

    /// Runs `call` natively from `input` into `out` (device buffers), in stream order.
    fn native_collective(
        &mut self,
        comm: &N,
        call: &CommCall,
        input: Option<(Self::Buffer, &TensorType)>,
        out: (Self::Buffer, &TensorType),
    ) -> Result<(), Self::Error>;

    /// Launches `bucket`'s collective on `flat` ([`BucketSpec::collective`]) on the
    /// communication stream, after the compute stream's work so far.
    fn native_bucket(
        &mut self,
        comm: &N,
        bucket: &BucketSpec,
        flat: Self::Buffer,
    ) -> Result<(), Self::Error>;

    /// Issues `transfers` (sends and receives) as one native group.
    fn native_transfers(
        &mut self,
        comm: &N,
        transfers: &[Transfer<Self::Buffer>],
    ) -> Result<(), Self::Error>;

    /// Copies `buf`, holding a tensor of type `ty`, to the host.
    fn download(&mut self, buf: Self::Buffer, ty: &TensorType) -> Result<Tensor, Self::Error>;

    /// Copies `t` into `buf`.
    fn upload(&mut self, buf: Self::Buffer, t: &Tensor) -> Result<(), Self::Error>;
}
