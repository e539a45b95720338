//! The NCCL calls [`super::NcclComm`] makes, behind one trait: [`SystemNccl`] makes them
//! through cudarc on a [`CudaDevice`]; [`super::emulated::EmulatedNccl`] carries them out
//! between [`crate::emulator::EmulatedDevice`]s of one process, so that everything above the
//! calls (communicators per group, the ids over the bootstrap, rearrangements, grouped
//! sends and receives) runs in CI with several ranks.

use crate::cuda::CudaDevice;
use crate::error::{CudaError, CudaResult};
use crate::kernels::DevPtr;
use cudarc::nccl::result as nccl;
use cudarc::nccl::sys as nccl_sys;
use shardc_ir::{DType, ReduceOp};
use std::ffi::c_void;
use std::sync::Arc;

/// The bytes of an NCCL unique id (`ncclUniqueId`).
pub const ID_BYTES: usize = 128;

/// An NCCL unique id: made by one member of a communicator, handed to the others.
pub type UniqueId = [u8; ID_BYTES];

/// Which of the device's streams an operation is ordered on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    /// After the kernels issued so far (the compute stream).
    Compute,
    /// The communication stream, which overlaps the kernels.
    Comm,
}

/// One NCCL operation on a communicator, with device buffers and counts in elements; peers
/// and roots are ranks of the communicator (not of the world).
#[derive(Clone, Debug, PartialEq)]
pub enum NcclCall {
    /// `ncclAllReduce`: `count` elements from `send` reduced into `recv` (may be `send`).
    AllReduce {
        /// Source.
        send: DevPtr,
        /// Destination.
        recv: DevPtr,
        /// Elements.
        count: usize,
        /// Element type.
        dtype: DType,
        /// Reduction.
        op: ReduceOp,
    },
    /// `ncclBroadcast`: `root`'s `count` elements of `send` into every member's `recv`.
    Broadcast {
        /// Source (read on the root only).
        send: DevPtr,
        /// Destination.
        recv: DevPtr,
        /// Elements.
        count: usize,
        /// Element type.
        dtype: DType,
        /// The communicator rank whose data everyone gets.
        root: usize,
    },
    /// `ncclAllGather`: every member's `count` elements, in rank order, into `recv`.
    AllGather {
        /// Source.
        send: DevPtr,
        /// Destination (members × `count` elements).
        recv: DevPtr,
        /// Elements each member contributes.
        count: usize,
        /// Element type.
        dtype: DType,
    },
    /// `ncclReduceScatter`: members × `count` elements reduced; part `rank` into `recv`.
    ReduceScatter {
        /// Source (members × `count` elements).
        send: DevPtr,
        /// Destination.
        recv: DevPtr,
        /// Elements each member receives.
        count: usize,
        /// Element type.
        dtype: DType,
        /// Reduction.
        op: ReduceOp,
    },
    /// `ncclSend` of `count` elements to `peer`.
    Send {
        /// Source.
        buf: DevPtr,
        /// Elements.
        count: usize,
        /// Element type.
        dtype: DType,
        /// The receiving member.
        peer: usize,
        /// The graph's tag, which NCCL does not carry (it pairs sends and receives between
        /// two members in order); the emulation checks that the pairs agree on it.
        tag: Option<i64>,
    },
    /// `ncclRecv` of `count` elements from `peer`.
    Recv {
        /// Destination.
        buf: DevPtr,
        /// Elements.
        count: usize,
        /// Element type.
        dtype: DType,
        /// The sending member.
        peer: usize,
        /// As for [`NcclCall::Send`].
        tag: Option<i64>,
    },
}

impl NcclCall {
    /// NCCL's name of the call.
    pub fn name(&self) -> &'static str {
        match self {
            NcclCall::AllReduce { .. } => "ncclAllReduce",
            NcclCall::Broadcast { .. } => "ncclBroadcast",
            NcclCall::AllGather { .. } => "ncclAllGather",
            NcclCall::ReduceScatter { .. } => "ncclReduceScatter",
            NcclCall::Send { .. } => "ncclSend",
            NcclCall::Recv { .. } => "ncclRecv",
        }
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            NcclCall::AllReduce { dtype, .. }
            | NcclCall::Broadcast { dtype, .. }
            | NcclCall::AllGather { dtype, .. }
            | NcclCall::ReduceScatter { dtype, .. }
            | NcclCall::Send { dtype, .. }
            | NcclCall::Recv { dtype, .. } => *dtype,
        }
    }
}

/// A communicator handle of an [`NcclLibrary`] (NCCL's `ncclComm_t` as a number).
pub type CommHandle = usize;

/// The NCCL calls of one rank (see the module doc). Calls between [`NcclLibrary::group_start`]
/// and [`NcclLibrary::group_end`] are issued together, as NCCL's groups are.
pub trait NcclLibrary: Send + Sync {
    /// What carries the calls (`NCCL 2.28.9`, `emulated`).
    fn description(&self) -> String;

    /// `ncclGetUniqueId`.
    fn unique_id(&self) -> CudaResult<UniqueId>;

    /// `ncclCommInitRank`: joins the communicator of `nranks` members named by `id` as
    /// member `rank`; returns once every member has joined.
    fn init_rank(&self, nranks: usize, id: &UniqueId, rank: usize) -> CudaResult<CommHandle>;

    /// [`NcclLibrary::init_rank`] for the communicator of `group` (the members' global
    /// ranks, sorted) as member `me`. NCCL needs only the size; a library that carries the
    /// calls over another communicator needs the members.
    fn init_group(&self, group: &[usize], id: &UniqueId, me: usize) -> CudaResult<CommHandle> {
        self.init_rank(group.len(), id, me)
    }

    /// Issues `call` on `comm`, ordered on `stream`.
    fn issue(&self, comm: CommHandle, call: &NcclCall, stream: Stream) -> CudaResult<()>;

    /// `ncclGroupStart`.
    fn group_start(&self) -> CudaResult<()>;

    /// `ncclGroupEnd`: issues the calls made since [`NcclLibrary::group_start`].
    fn group_end(&self) -> CudaResult<()>;

    /// `ncclCommDestroy`.
    fn destroy(&self, comm: CommHandle);

    /// `ncclCommAbort`: ends whatever `comm`'s kernels wait for, and frees it (it is not
    /// destroyed afterwards). Called from another thread than the one that waits.
    fn abort(&self, comm: CommHandle);
}

fn nccl_err(call: &'static str) -> impl Fn(nccl::NcclError) -> CudaError {
    move |e| CudaError::Nccl {
        call,
        reason: format!("{e:?}"),
    }
}

/// NCCL's element type of `d`.
pub(crate) fn nccl_dtype(d: DType) -> CudaResult<nccl_sys::ncclDataType_t> {
    use nccl_sys::ncclDataType_t::*;
    Ok(match d {
        DType::Float32 => ncclFloat32,
        DType::Float64 => ncclFloat64,
        DType::Float16 => ncclFloat16,
        DType::Int32 => ncclInt32,
        DType::Int64 => ncclInt64,
        DType::Bool => ncclUint8,
        other => return Err(CudaError::Other(format!("NCCL cannot carry {other}"))),
    })
}

/// An error unless NCCL can carry `d`.
pub(crate) fn check_dtype(d: DType) -> CudaResult<()> {
    nccl_dtype(d).map(drop)
}

fn nccl_op(op: ReduceOp) -> nccl_sys::ncclRedOp_t {
    use nccl_sys::ncclRedOp_t::*;
    match op {
        ReduceOp::Sum => ncclSum,
        ReduceOp::Max => ncclMax,
        ReduceOp::Min => ncclMin,
        ReduceOp::Prod => ncclProd,
    }
}

/// NCCL itself (`libnccl.so.2`, probed before use) on a GPU.
pub struct SystemNccl {
    device: Arc<CudaDevice>,
}

impl SystemNccl {
    /// NCCL on `device` (probe [`crate::probe::Library::Nccl`] first: cudarc panics where the
    /// library is missing).
    pub fn new(device: Arc<CudaDevice>) -> SystemNccl {
        SystemNccl { device }
    }

    fn stream(&self, s: Stream) -> nccl_sys::cudaStream_t {
        (match s {
            Stream::Compute => self.device.stream_handle(),
            Stream::Comm => self.device.comm_stream_handle(),
        }) as nccl_sys::cudaStream_t
    }
}

impl NcclLibrary for SystemNccl {
    fn description(&self) -> String {
        match nccl::get_nccl_version() {
            Ok(v) => format!("NCCL {}.{}.{}", v / 10000, v / 100 % 100, v % 100),
            Err(e) => format!("NCCL (version unknown: {e:?})"),
        }
    }

    fn unique_id(&self) -> CudaResult<UniqueId> {
        let id = nccl::get_uniqueid().map_err(nccl_err("ncclGetUniqueId"))?;
        Ok(id.internal.map(|b| b as u8))
    }

    fn init_rank(&self, nranks: usize, id: &UniqueId, rank: usize) -> CudaResult<CommHandle> {
        self.device.bind()?;
        let id = nccl_sys::ncclUniqueId {
            internal: id.map(|b| b as _),
        };
        let mut comm: nccl_sys::ncclComm_t = std::ptr::null_mut();
        // SAFETY: `comm` is written by NCCL; every member calls with the same id and size.
        unsafe { nccl::comm_init_rank(&mut comm, nranks as i32, id, rank as i32) }
            .map_err(nccl_err("ncclCommInitRank"))?;
        Ok(comm as CommHandle)
    }

    fn issue(&self, comm: CommHandle, call: &NcclCall, stream: Stream) -> CudaResult<()> {
        self.device.bind()?;
        let c = comm as nccl_sys::ncclComm_t;
        let st = self.stream(stream);
        let dt = nccl_dtype(call.dtype())?;
        let ptr = |p: DevPtr| p as *const c_void;
        let mptr = |p: DevPtr| p as *mut c_void;
        let name = call.name();
        // SAFETY: the buffers are device allocations of the counts the caller computed from
        // the tensors' types (the executor's plan or the staged copies).
        unsafe {
            match *call {
                NcclCall::AllReduce {
                    send,
                    recv,
                    count,
                    op,
                    ..
                } => nccl::all_reduce(ptr(send), mptr(recv), count, dt, nccl_op(op), c, st),
                NcclCall::Broadcast {
                    send,
                    recv,
                    count,
                    root,
                    ..
                } => nccl::broadcast(ptr(send), mptr(recv), count, dt, root as i32, c, st),
                NcclCall::AllGather {
                    send, recv, count, ..
                } => nccl::all_gather(ptr(send), mptr(recv), count, dt, c, st),
                NcclCall::ReduceScatter {
                    send,
                    recv,
                    count,
                    op,
                    ..
                } => nccl::reduce_scatter(ptr(send), mptr(recv), count, dt, nccl_op(op), c, st),
                NcclCall::Send {
                    buf, count, peer, ..
                } => nccl::send(ptr(buf), count, dt, peer as i32, c, st),
                NcclCall::Recv {
                    buf, count, peer, ..
                } => nccl::recv(mptr(buf), count, dt, peer as i32, c, st),
            }
        }
        .map(drop)
        .map_err(nccl_err(name))
    }

    fn group_start(&self) -> CudaResult<()> {
        nccl::group_start()
            .map(drop)
            .map_err(nccl_err("ncclGroupStart"))
    }

    fn group_end(&self) -> CudaResult<()> {
        nccl::group_end()
            .map(drop)
            .map_err(nccl_err("ncclGroupEnd"))
    }

    fn destroy(&self, comm: CommHandle) {
        if self.device.bind().is_ok() {
            // SAFETY: a communicator from `init_rank`, destroyed once.
            let _ = unsafe { nccl::comm_destroy(comm as nccl_sys::ncclComm_t) };
        }
    }

    fn abort(&self, comm: CommHandle) {
        // Not `bind`: the thread waiting for NCCL's kernels holds the device's lock.
        if self.device.bind_from_another_thread().is_ok() {
            // SAFETY: a communicator from `init_rank`, aborted once and never used or
            // destroyed afterwards (the watchdog's contract).
            let _ = unsafe { nccl::comm_abort(comm as nccl_sys::ncclComm_t) };
        }
    }
}
