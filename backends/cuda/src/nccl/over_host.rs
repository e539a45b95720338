//! NCCL emulated between the emulated devices of *separate processes* (launched workers,
//! `mpirun` ranks): each call carried out through the cluster's host communicator, the one
//! that hands out the NCCL ids. [`super::emulated::EmulatedNccl`] connects the threads of
//! one process only; with this, a job of one process per rank, as on GPUs, runs everything
//! above the NCCL calls (the ids over the cluster, communicators per group, the watchdog,
//! buckets on the communication stream, collectives inside replayed steps) in CI.
//!
//! Each call becomes the host collective of the communicator's members (global ranks, which
//! [`NcclLibrary::init_group`] gives), on the bytes of the emulated device: AllReduce,
//! Broadcast, AllGather and ReduceScatter on flat buffers, sends and receives under one tag
//! (the host communicator keeps messages of one pair and tag in order, as NCCL pairs sends
//! and receives between two members in order). Sends are posted before a group's receives
//! wait. Work is ordered on the device's streams, and recorded and replayed, as the
//! in-process emulation's.
//!
//! Less strict than the in-process emulation: an ungrouped send returns before it is
//! received (the host communicator buffers it), and members whose calls disagree get the
//! host communicator's error (every member, naming both tensors' types, where they differ). Every wait is bounded by the host communicator's
//! timeout (`SHARDC_COMM_TIMEOUT`).

use super::emulated::{submit_on, OpenGroup};
use super::library::{CommHandle, NcclCall, NcclLibrary, Stream, UniqueId, ID_BYTES};
use crate::emulator::{EmulatedDevice, HostWork};
use crate::error::{CudaError, CudaResult};
use crate::kernels::DevPtr;
use shardc_ir::{DType, TensorType};
use shardc_runtime::{CommError, Communicator, Tensor};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The host tag of every NCCL send and receive (far from the graph's tags and the NCCL ids').
const P2P_TAG: i64 = i64::MAX - (1 << 36);

fn emu(reason: String) -> CudaError {
    CudaError::Emulator(format!("NCCL emulated over the host: {reason}"))
}

/// One member's view of a communicator.
#[derive(Clone)]
struct Member {
    /// The members' global ranks, in communicator order.
    group: Arc<Vec<usize>>,
    /// This member's index.
    me: usize,
    /// Set by `ncclCommAbort`.
    aborted: Arc<AtomicBool>,
}

/// NCCL for one rank on its [`EmulatedDevice`], carried out over a host communicator (see the
/// module doc).
pub struct HostNccl {
    device: Arc<EmulatedDevice>,
    host: Arc<dyn Communicator>,
    comms: Mutex<Vec<Option<Member>>>,
    group: OpenGroup<Member>,
}

impl HostNccl {
    /// NCCL for the rank of `host` on `device`.
    pub fn new(device: Arc<EmulatedDevice>, host: Arc<dyn Communicator>) -> HostNccl {
        HostNccl {
            device,
            host,
            comms: Mutex::new(Vec::new()),
            group: OpenGroup::new(),
        }
    }

    fn member(&self, comm: CommHandle) -> CudaResult<Member> {
        self.comms
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(comm)
            .cloned()
            .flatten()
            .ok_or_else(|| emu(format!("communicator {comm} does not exist (destroyed?)")))
    }

    fn submit(&self, calls: Vec<(Member, NcclCall)>, stream: Stream) -> CudaResult<()> {
        let host = self.host.clone();
        let work: HostWork =
            Arc::new(move |dev: &EmulatedDevice| carry_out(dev, host.as_ref(), &calls));
        submit_on(&self.device, work, stream)
    }
}

impl NcclLibrary for HostNccl {
    fn description(&self) -> String {
        "NCCL emulated over the cluster's host communicator".into()
    }

    fn unique_id(&self) -> CudaResult<UniqueId> {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let mut id = [0u8; ID_BYTES];
        id[..8].copy_from_slice(&NEXT.fetch_add(1, Ordering::Relaxed).to_le_bytes());
        id[8..12].copy_from_slice(&std::process::id().to_le_bytes());
        id[12..20].copy_from_slice(&(self.host.rank() as u64).to_le_bytes());
        Ok(id)
    }

    fn init_rank(&self, nranks: usize, _: &UniqueId, rank: usize) -> CudaResult<CommHandle> {
        Err(emu(format!(
            "ncclCommInitRank (rank {rank} of {nranks}) needs the members' global ranks here: use init_group"
        )))
    }

    fn init_group(&self, group: &[usize], _: &UniqueId, me: usize) -> CudaResult<CommHandle> {
        if group.get(me) != Some(&self.host.rank()) {
            return Err(emu(format!(
                "ncclCommInitRank: member {me} of {group:?} is not this rank ({})",
                self.host.rank()
            )));
        }
        // Returns once every member has joined, as ncclCommInitRank does.
        self.host
            .barrier(group)
            .map_err(|e| emu(format!("ncclCommInitRank of {group:?}: {e}")))?;
        let mut comms = self.comms.lock().unwrap_or_else(|p| p.into_inner());
        comms.push(Some(Member {
            group: Arc::new(group.to_vec()),
            me,
            aborted: Arc::new(AtomicBool::new(false)),
        }));
        Ok(comms.len() - 1)
    }

    fn issue(&self, comm: CommHandle, call: &NcclCall, stream: Stream) -> CudaResult<()> {
        let m = self.member(comm)?;
        let members = m.group.len();
        match self.group.add(m, call, members)? {
            Some(now) => self.submit(now, stream),
            None => Ok(()),
        }
    }

    fn group_start(&self) -> CudaResult<()> {
        self.group.start()
    }

    fn group_end(&self) -> CudaResult<()> {
        let calls = self.group.end()?;
        if calls.is_empty() {
            return Ok(());
        }
        self.submit(calls, Stream::Compute)
    }

    fn destroy(&self, comm: CommHandle) {
        if let Some(slot) = self
            .comms
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(comm)
        {
            *slot = None;
        }
    }

    /// Marks the communicator aborted: its later calls fail. A host wait already under way
    /// ends at the host communicator's own timeout.
    fn abort(&self, comm: CommHandle) {
        if let Ok(m) = self.member(comm) {
            m.aborted.store(true, Ordering::SeqCst);
        }
    }
}

/// `count` elements of `dtype` at `ptr` as a host tensor.
fn read(dev: &EmulatedDevice, ptr: DevPtr, count: usize, dtype: DType) -> CudaResult<Tensor> {
    let ty = TensorType::new(dtype, vec![count]);
    let bytes = dev.read_bytes(ptr, count * dtype.size_bytes())?;
    Ok(Tensor::from_le_bytes(&ty, &bytes))
}

/// Carries out one call or one group's calls for one member: sends first, then the
/// collectives and receives in order.
fn carry_out(
    dev: &EmulatedDevice,
    host: &dyn Communicator,
    calls: &[(Member, NcclCall)],
) -> CudaResult<()> {
    let failed = |call: &NcclCall, m: &Member, e: CommError| {
        emu(format!(
            "{} on the communicator of ranks {:?} at member {}: {e}",
            call.name(),
            m.group,
            m.me
        ))
    };
    for (m, call) in calls {
        if m.aborted.load(Ordering::SeqCst) {
            return Err(emu(format!(
                "{}: the communicator of ranks {:?} was aborted (ncclCommAbort)",
                call.name(),
                m.group
            )));
        }
    }
    for (m, call) in calls {
        if let NcclCall::Send {
            buf,
            count,
            dtype,
            peer,
            ..
        } = *call
        {
            let t = read(dev, buf, count, dtype)?;
            host.send(m.group[peer], P2P_TAG, &t)
                .map_err(|e| failed(call, m, e))?;
        }
    }
    for (m, call) in calls {
        let group = m.group.as_slice();
        let (out, t) = match *call {
            NcclCall::Send { .. } => continue,
            NcclCall::Recv {
                buf,
                count,
                dtype,
                peer,
                ..
            } => {
                let ty = TensorType::new(dtype, vec![count]);
                let t = host
                    .recv(group[peer], P2P_TAG, &ty)
                    .map_err(|e| failed(call, m, e))?;
                (buf, t)
            }
            NcclCall::AllReduce {
                send,
                recv,
                count,
                dtype,
                op,
            } => {
                let mut t = read(dev, send, count, dtype)?;
                host.all_reduce(group, op, &mut t)
                    .map_err(|e| failed(call, m, e))?;
                (recv, t)
            }
            NcclCall::Broadcast {
                send,
                recv,
                count,
                dtype,
                root,
            } => {
                // The root's source; the others' values are replaced.
                let from = if m.me == root { send } else { recv };
                let mut t = read(dev, from, count, dtype)?;
                host.broadcast(group, group[root], &mut t)
                    .map_err(|e| failed(call, m, e))?;
                (recv, t)
            }
            NcclCall::AllGather {
                send,
                recv,
                count,
                dtype,
            } => {
                let t = read(dev, send, count, dtype)?;
                let t = host
                    .all_gather(group, 0, &t)
                    .map_err(|e| failed(call, m, e))?;
                (recv, t)
            }
            NcclCall::ReduceScatter {
                send,
                recv,
                count,
                dtype,
                op,
            } => {
                let t = read(dev, send, count * group.len(), dtype)?;
                let t = host
                    .reduce_scatter(group, op, 0, &t)
                    .map_err(|e| failed(call, m, e))?;
                (recv, t)
            }
        };
        dev.write_bytes(out, &t.to_le_bytes())?;
    }
    Ok(())
}
