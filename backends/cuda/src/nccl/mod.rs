//! NCCL collectives: MindSpore's `init("nccl")`.
//!
//! [`NcclComm`] implements the runtime's [`Communicator`] for one rank per GPU. The world's
//! NCCL communicator is created from a unique id that rank 0 makes and hands to the others
//! over the *bootstrap* communicator, the one the cluster already has (the scheduler's
//! rendezvous + TCP or shared memory, or MPI under `mpirun`); each sub-group gets its own NCCL
//! communicator the first time it is used, its id sent by its lowest member to the others
//! over the bootstrap, so only members take part. Collectives along an axis other than 0 are
//! rearranged on the device (NCCL concatenates and scatters flat buffers). Collectives of
//! host [`Tensor`]s (the trait) are staged through device memory, after the members have
//! compared their calls over the bootstrap (NCCL cannot tell a disagreement: it hangs or
//! reads past a buffer); host sends and receives go over the bootstrap, which matches tags.
//! The executor calls [`NcclComm::run_on_device`] on its buffers directly.
//!
//! Whatever waits for NCCL on the host (a step's end, a staged collective) runs under the
//! rank's [`watchdog::Watchdog`]: past `SHARDC_COMM_TIMEOUT` (300 s by default, as the CPU's
//! communicators wait) the rank's communicators are aborted and the wait fails, naming what
//! was in flight, where NCCL alone would wait for ever for a member that never comes.
//!
//! The NCCL calls themselves go through an [`library::NcclLibrary`]: NCCL on a GPU
//! ([`library::SystemNccl`]), or its emulation between the emulated devices of one process
//! ([`emulated::EmulatedNccl`]), where CI runs everything above the calls with several ranks,
//! or between emulated devices of separate processes over the cluster's host communicator
//! ([`over_host::HostNccl`]: launched workers on the emulated GPU).
//! NCCL reduces in its algorithms' order, which with three ranks or more need not be member
//! order: floating-point results may then differ from the host communicators' in the last
//! bits (the emulation reduces in member order).

pub mod emulated;
pub mod library;
pub mod over_host;
pub mod watchdog;

pub use watchdog::{abort_every_communicator, abort_every_communicator_within};

use crate::cuda::CudaDevice;
use crate::device::Device;
use crate::error::{CudaError, CudaResult};
use crate::kernels::{contiguous_strides, DevPtr, KernelArg, Strided};
use crate::probe::{self, Library};
use library::{CommHandle, NcclCall, NcclLibrary, Stream, SystemNccl, UniqueId, ID_BYTES};
use shardc_ir::{DType, ReduceOp, TensorType};
use shardc_runtime::comm::{arguments, check_group, Collective};
use shardc_runtime::executor::CommCall;
use shardc_runtime::{CommError, Communicator, Tensor};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use watchdog::{Armed, Watchdog};

/// The bootstrap tags NCCL ids travel under: this base plus 32 bits of a hash of the group
/// (far from the graph's own tags). Derived from the group, not from how many communicators
/// a rank has made, because members of one group may have made different numbers before.
const ID_TAG_BASE: i64 = i64::MAX - (1 << 33);

/// The bootstrap tag of `group`'s NCCL id (see [`ID_TAG_BASE`]).
fn id_tag(group: &[usize]) -> i64 {
    let h = group.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &r| {
        (h ^ r as u64).wrapping_mul(0x0100_0000_01b3)
    });
    ID_TAG_BASE + (h & 0xFFFF_FFFF) as i64
}

/// NCCL for one rank (see the module doc).
pub struct NcclComm {
    device: Arc<dyn Device>,
    library: Arc<dyn NcclLibrary>,
    bootstrap: Arc<dyn Communicator>,
    /// Each group's communicator (sorted global ranks -> handle), made on first use.
    comms: Mutex<HashMap<Vec<usize>, CommHandle>>,
    /// Aborts the communicators when a wait outlasts the timeout.
    watchdog: Watchdog,
    rank: usize,
    size: usize,
}

impl std::fmt::Debug for NcclComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "NcclComm(rank {} of {}, {})",
            self.rank,
            self.size,
            self.library.description()
        )
    }
}

/// Why rank `local_rank` of its host, on the GPU the default mapping gives it (its local
/// rank modulo the host's `gpus`), cannot use NCCL with the `world` ranks of its job, or
/// None: where a host runs more ranks than it has GPUs, two ranks share one, and NCCL
/// refuses that ("Duplicate GPU detected").
pub fn shared_gpu(local_rank: usize, gpus: usize, world: usize) -> Option<String> {
    (world > 1 && local_rank >= gpus).then(|| {
        format!(
            "local rank {local_rank} shares GPU {} with local rank {} ({gpus} GPU(s) on this host); NCCL needs a GPU per rank",
            local_rank % gpus.max(1),
            local_rank % gpus.max(1)
        )
    })
}

/// Whether every rank of `comm`'s world can use NCCL, given this rank's own obstacle
/// (`mine`, from [`shared_gpu`]): they must all decide alike, or the ones that join NCCL wait
/// for the others forever. None where all can; else why not (this rank's reason, or that
/// another rank has one). Every rank must call it, at the same point.
pub fn why_not_nccl(comm: &dyn Communicator, mine: Option<String>) -> CudaResult<Option<String>> {
    shardc_runtime::comm::why_not_all(comm, mine, "another rank of the job shares a GPU")
        .map_err(|e| CudaError::Other(format!("agreeing on NCCL: {e}")))
}

/// One send or receive of a grouped run ([`NcclComm::run_transfers`]), on device memory.
pub type Transfer = shardc_runtime::executor::device::Transfer<DevPtr>;

/// The dims of `shape` around `axis` split into `parts`: (pre, d / parts, post).
fn around(shape: &[usize], axis: usize, parts: usize) -> (usize, usize, usize) {
    let pre: usize = shape[..axis].iter().product();
    let post: usize = shape[axis + 1..].iter().product();
    (pre, shape[axis] / parts.max(1), post)
}

impl NcclComm {
    /// Joins the world of `bootstrap` with NCCL on `device`: rank 0's unique id goes to
    /// every rank over the bootstrap. Every rank must call it.
    pub fn new(device: Arc<CudaDevice>, bootstrap: Arc<dyn Communicator>) -> CudaResult<NcclComm> {
        probe::require(Library::Nccl)?;
        let library = Arc::new(SystemNccl::new(device.clone()));
        NcclComm::with_library(device, library, bootstrap)
    }

    /// As [`NcclComm::new`] with the NCCL calls made by `library` (on an emulated device:
    /// [`emulated::EmulatedNccl`]).
    pub fn with_library(
        device: Arc<dyn Device>,
        library: Arc<dyn NcclLibrary>,
        bootstrap: Arc<dyn Communicator>,
    ) -> CudaResult<NcclComm> {
        let (rank, size) = (bootstrap.rank(), bootstrap.size());
        let timeout = shardc_runtime::comm::comm_timeout_from_env().map_err(CudaError::Other)?;
        let c = NcclComm {
            device,
            watchdog: Watchdog::new(library.clone(), timeout),
            library,
            bootstrap,
            comms: Mutex::new(HashMap::new()),
            rank,
            size,
        };
        c.comm_for(&(0..size).collect::<Vec<_>>())?;
        Ok(c)
    }

    /// The same, waiting at most `timeout` for NCCL (instead of `SHARDC_COMM_TIMEOUT`).
    pub fn with_timeout(mut self, timeout: Duration) -> NcclComm {
        self.watchdog.set_timeout(timeout);
        self
    }

    /// Starts a host wait for NCCL under the watchdog (see the module doc); once the
    /// returned arming says it [`Armed::fired`], the wait's error is
    /// [`NcclComm::timed_out`].
    pub fn arm(&self) -> Armed<'_> {
        self.watchdog.arm()
    }

    /// The error of a wait the watchdog ended: `what` names what was in flight.
    pub fn timed_out(&self, what: &str) -> CudaError {
        CudaError::Nccl {
            call: "a wait for the collectives",
            reason: format!(
                "rank {} waited more than {:?} (SHARDC_COMM_TIMEOUT) for {what}: a member never issued them, or issued others or in another order; the rank's NCCL communicators were aborted",
                self.rank,
                self.watchdog.timeout()
            ),
        }
    }

    /// Creates the communicators of `groups` now (each sorted, holding this rank), in one
    /// order every rank shares (sorted), so that no rank waits in one group's creation for a
    /// member that waits in another's: the executor's groups before its first step, not in
    /// the middle of one.
    pub fn prepare(&self, groups: &[Vec<usize>]) -> CudaResult<()> {
        let mut groups: Vec<&Vec<usize>> =
            groups.iter().filter(|g| g.contains(&self.rank)).collect();
        groups.sort();
        groups.dedup();
        for g in groups {
            self.comm_for(g)?;
        }
        Ok(())
    }

    /// NCCL's version (`2.28.3` as 22803).
    pub fn version() -> CudaResult<i32> {
        probe::require(Library::Nccl)?;
        cudarc::nccl::result::get_nccl_version().map_err(|e| CudaError::Nccl {
            call: "ncclGetVersion",
            reason: format!("{e:?}"),
        })
    }

    /// The NCCL communicator of `group` (sorted global ranks holding this rank), created on
    /// first use: the lowest member makes the id and sends it, with the group, to the others
    /// over the bootstrap.
    fn comm_for(&self, group: &[usize]) -> CudaResult<CommHandle> {
        if self.watchdog.aborted() {
            return Err(CudaError::Nccl {
                call: "a collective",
                reason: format!(
                    "rank {}'s NCCL communicators were aborted after an earlier wait outlasted {:?} (SHARDC_COMM_TIMEOUT)",
                    self.rank,
                    self.watchdog.timeout()
                ),
            });
        }
        let mut comms = self.comms.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(&c) = comms.get(group) {
            return Ok(c);
        }
        let me = group.iter().position(|&r| r == self.rank).ok_or_else(|| {
            CudaError::Other(format!("rank {} is not in group {group:?}", self.rank))
        })?;
        let leader = group[0];
        let tag = id_tag(group);
        let words = ID_BYTES / 4 + 1 + group.len();
        let id_ty = TensorType::new(DType::Int32, vec![words]);
        let boot = |e: CommError| {
            CudaError::Other(format!("handing out the NCCL id of group {group:?}: {e}"))
        };
        let id: UniqueId = if me == 0 {
            let id = self.library.unique_id()?;
            let mut message: Vec<i32> = id
                .chunks(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            message.push(group.len() as i32);
            message.extend(group.iter().map(|&r| r as i32));
            let t = Tensor::from_i32(vec![words], message)
                .ok_or_else(|| CudaError::Other("the NCCL id message is malformed".into()))?;
            for &r in &group[1..] {
                self.bootstrap.send(r, tag, &t).map_err(boot)?;
            }
            id
        } else {
            let t = self.bootstrap.recv(leader, tag, &id_ty).map_err(boot)?;
            let shardc_runtime::Data::I32(message) = &t.data else {
                return Err(CudaError::Other(format!(
                    "the NCCL id of group {group:?} from rank {leader} is not Int32"
                )));
            };
            let sent_group: Vec<usize> = message[ID_BYTES / 4 + 1..]
                .iter()
                .map(|&r| r as usize)
                .collect();
            if sent_group != group {
                return Err(CudaError::Other(format!(
                    "rank {leader} sent the NCCL id of group {sent_group:?} where rank {} expected group {group:?}",
                    self.rank
                )));
            }
            let mut id = [0u8; ID_BYTES];
            for (i, w) in message[..ID_BYTES / 4].iter().enumerate() {
                id[i * 4..i * 4 + 4].copy_from_slice(&w.to_le_bytes());
            }
            id
        };
        let comm = self.library.init_group(group, &id, me)?;
        self.watchdog.register(comm);
        comms.insert(group.to_vec(), comm);
        Ok(comm)
    }

    /// Copies `src` (shape `(pre, parts, d, post)` read as `(parts, pre, d, post)`) into
    /// `dst`: `to_parts` makes each part contiguous (before a scatter), otherwise the
    /// reverse (after a gather).
    #[allow(clippy::too_many_arguments)]
    fn rearrange(
        &self,
        dtype: DType,
        src: DevPtr,
        dst: DevPtr,
        (pre, parts, d, post): (usize, usize, usize, usize),
        to_parts: bool,
    ) -> CudaResult<()> {
        let s = crate::ops::copy_suffix(dtype)
            .ok_or_else(|| CudaError::Other(format!("cannot rearrange {dtype} on the GPU")))?;
        let n = pre * parts * d * post;
        let (out, strides) = if to_parts {
            // dst (parts, pre, d, post) from src (pre, parts, d, post)
            let st = contiguous_strides(&[pre, parts, d, post]);
            (vec![parts, pre, d, post], vec![st[1], st[0], st[2], st[3]])
        } else {
            // dst (pre, parts, d, post) from src (parts, pre, d, post)
            let st = contiguous_strides(&[parts, pre, d, post]);
            (vec![pre, parts, d, post], vec![st[1], st[0], st[2], st[3]])
        };
        let st = Strided::single(&out, &strides)
            .ok_or_else(|| CudaError::Other("rearrangement of more than 8 dims".into()))?;
        let grid = (n.div_ceil(256).max(1) as u64).min(self.device.max_grid() as u64) as u32;
        self.device.launch(
            &format!("strided_copy_{s}"),
            grid,
            self.device.block_size(),
            &[
                KernelArg::Ptr(src),
                KernelArg::Ptr(dst),
                KernelArg::I64(n as i64),
                KernelArg::Strided(Box::new(st)),
            ],
        )
    }

    /// An in-place AllReduce of `count` elements at `buf` over `group` on the device's
    /// communication stream (a gradient bucket), after the kernels issued so far; the caller
    /// records an event after it and orders the readers after that event.
    pub fn all_reduce_on_comm_stream(
        &self,
        group: &[usize],
        op: ReduceOp,
        buf: DevPtr,
        count: usize,
        dtype: DType,
    ) -> CudaResult<()> {
        let c = self.comm_for(group)?;
        self.device.comm_after_compute()?;
        let call = NcclCall::AllReduce {
            send: buf,
            recv: buf,
            count,
            dtype,
            op,
        };
        self.library.issue(c, &call, Stream::Comm)
    }

    /// An AllGather of `count` elements at `send` from every member of `group` into `recv`
    /// (members × `count`, in group order) on the device's communication stream (a
    /// parameter-gather bucket), after the kernels issued so far; the caller records an event
    /// after it and orders the readers after that event.
    pub fn all_gather_on_comm_stream(
        &self,
        group: &[usize],
        send: DevPtr,
        recv: DevPtr,
        count: usize,
        dtype: DType,
    ) -> CudaResult<()> {
        let c = self.comm_for(group)?;
        self.device.comm_after_compute()?;
        let call = NcclCall::AllGather {
            send,
            recv,
            count,
            dtype,
        };
        self.library.issue(c, &call, Stream::Comm)
    }

    /// Runs a resolved collective on device memory: `input` (absent for Receive) into `out`
    /// of type `out_ty`, ordered on the device's stream after the kernels before it. The
    /// rearrangements around NCCL (axes other than 0, AllToAll) use temporary buffers,
    /// allocated and freed here.
    pub fn run_on_device(
        &self,
        call: &CommCall,
        input: Option<(DevPtr, &TensorType)>,
        out: (DevPtr, &TensorType),
    ) -> CudaResult<()> {
        self.run_on_device_in(call, input, out, None)
    }

    /// [`NcclComm::run_on_device`] with the rearrangements' buffers in `scratch` (the
    /// executor's, reused in stream order): nothing allocated, freed or waited for, so a step
    /// with these collectives can be recorded and replayed.
    pub(crate) fn run_on_device_in(
        &self,
        call: &CommCall,
        input: Option<(DevPtr, &TensorType)>,
        (out, out_ty): (DevPtr, &TensorType),
        scratch: Option<&crate::ops::Workspace>,
    ) -> CudaResult<()> {
        let dtype = out_ty.dtype;
        library::check_dtype(dtype)?;
        let count = out_ty.num_elements();
        let need = || input.ok_or_else(|| CudaError::Other("the collective has no operand".into()));
        let elem = dtype.size_bytes();
        let issue = |c: CommHandle, call: NcclCall| self.library.issue(c, &call, Stream::Compute);
        // Temporary buffers: in the scratch memory, or allocated and freed once the stream
        // has passed their use.
        let with_temps = |sizes: &[usize], f: &dyn Fn(&[DevPtr]) -> CudaResult<()>| {
            if let Some(ws) = scratch {
                let aligned: Vec<usize> = sizes.iter().map(|b| b.next_multiple_of(256)).collect();
                let base = ws.get(self.device.as_ref(), aligned.iter().sum())?;
                let mut at = base;
                let mut temps = Vec::with_capacity(sizes.len());
                for b in aligned {
                    temps.push(at);
                    at += b as u64;
                }
                return f(&temps);
            }
            let mut temps = Vec::new();
            let mut r = Ok(());
            for &bytes in sizes {
                match self.device.alloc(bytes) {
                    Ok(p) => temps.push(p),
                    Err(e) => {
                        r = Err(e);
                        break;
                    }
                }
            }
            if r.is_ok() {
                r = f(&temps);
            }
            let synced = self.device.synchronize();
            for t in temps {
                self.device.free(t);
            }
            r.and(synced)
        };
        match call {
            CommCall::AllReduce { group, op } => {
                let (x, _) = need()?;
                let c = self.comm_for(group)?;
                issue(
                    c,
                    NcclCall::AllReduce {
                        send: x,
                        recv: out,
                        count,
                        dtype,
                        op: *op,
                    },
                )?;
            }
            CommCall::Broadcast { group, root } => {
                let (x, _) = need()?;
                let root = group.iter().position(|g| g == root).ok_or_else(|| {
                    CudaError::Other(format!("Broadcast root {root} is not in group {group:?}"))
                })?;
                let c = self.comm_for(group)?;
                issue(
                    c,
                    NcclCall::Broadcast {
                        send: x,
                        recv: out,
                        count,
                        dtype,
                        root,
                    },
                )?;
            }
            CommCall::AllGather { group, axis } => {
                let (x, tx) = need()?;
                let c = self.comm_for(group)?;
                let g = group.len();
                let n = tx.num_elements();
                let gather = |recv: DevPtr| {
                    issue(
                        c,
                        NcclCall::AllGather {
                            send: x,
                            recv,
                            count: n,
                            dtype,
                        },
                    )
                };
                if *axis == 0 {
                    gather(out)?;
                } else {
                    let (pre, d, post) = around(&tx.shape, *axis, 1);
                    with_temps(&[g * n * elem], &|t| {
                        gather(t[0])?;
                        self.rearrange(dtype, t[0], out, (pre, g, d, post), false)
                    })?;
                }
            }
            CommCall::ReduceScatter { group, op, axis } => {
                let (x, tx) = need()?;
                let c = self.comm_for(group)?;
                let g = group.len();
                let scatter = |send: DevPtr| {
                    issue(
                        c,
                        NcclCall::ReduceScatter {
                            send,
                            recv: out,
                            count,
                            dtype,
                            op: *op,
                        },
                    )
                };
                if *axis == 0 {
                    scatter(x)?;
                } else {
                    let (pre, d, post) = around(&tx.shape, *axis, g);
                    with_temps(&[tx.num_elements() * elem], &|t| {
                        self.rearrange(dtype, x, t[0], (pre, g, d, post), true)?;
                        scatter(t[0])
                    })?;
                }
            }
            CommCall::AllToAll {
                group,
                split_dim,
                concat_dim,
            } => {
                let (x, tx) = need()?;
                let c = self.comm_for(group)?;
                let g = group.len();
                let n = tx.num_elements();
                let part = n / g.max(1);
                let (pre, d, post) = around(&tx.shape, *split_dim, g);
                // The received parts (g, part) concatenate along concat_dim of the part's shape.
                let mut part_shape = tx.shape.clone();
                part_shape[*split_dim] /= g.max(1);
                let (cpre, cd, cpost) = around(&part_shape, *concat_dim, 1);
                with_temps(&[n * elem, n * elem], &|t| {
                    let (send, recv) = (t[0], t[1]);
                    self.rearrange(dtype, x, send, (pre, g, d, post), true)?;
                    self.library.group_start()?;
                    let mut r = Ok(());
                    for j in 0..g {
                        let at = |p: DevPtr| p + (j * part * elem) as u64;
                        r = r
                            .and_then(|_| {
                                issue(
                                    c,
                                    NcclCall::Send {
                                        buf: at(send),
                                        count: part,
                                        dtype,
                                        peer: j,
                                        tag: None,
                                    },
                                )
                            })
                            .and_then(|_| {
                                issue(
                                    c,
                                    NcclCall::Recv {
                                        buf: at(recv),
                                        count: part,
                                        dtype,
                                        peer: j,
                                        tag: None,
                                    },
                                )
                            });
                    }
                    // The group is closed even when a call failed, so NCCL is usable after.
                    let ended = self.library.group_end();
                    r.and(ended)?;
                    self.rearrange(dtype, recv, out, (cpre, g, cd, cpost), false)
                })?;
            }
            CommCall::Send { dest, tag } => {
                let (x, tx) = need()?;
                let world: Vec<usize> = (0..self.size).collect();
                let c = self.comm_for(&world)?;
                issue(
                    c,
                    NcclCall::Send {
                        buf: x,
                        count: tx.num_elements(),
                        dtype,
                        peer: *dest,
                        tag: Some(*tag),
                    },
                )?;
                self.device.copy(out, x, tx.num_elements() * elem)?;
            }
            CommCall::Receive { src, tag } => {
                let world: Vec<usize> = (0..self.size).collect();
                let c = self.comm_for(&world)?;
                issue(
                    c,
                    NcclCall::Recv {
                        buf: out,
                        count,
                        dtype,
                        peer: *src,
                        tag: Some(*tag),
                    },
                )?;
            }
        }
        Ok(())
    }

    /// Issues `transfers` (sends and receives, none reading another's result) as one NCCL
    /// group, so that transfers each rank posts in another order pair up: receives land in
    /// temporary buffers and every result is written once the group is done, in order, as
    /// if one after another (a result may take the buffer of a send's input).
    pub fn run_transfers(&self, transfers: &[Transfer]) -> CudaResult<()> {
        let world: Vec<usize> = (0..self.size).collect();
        let c = self.comm_for(&world)?;
        let mut temps: Vec<Option<DevPtr>> = Vec::with_capacity(transfers.len());
        let mut r = Ok(());
        for t in transfers {
            let temp = match (&t.call, r.is_ok()) {
                (CommCall::Receive { .. }, true) => {
                    let bytes = t.out.1.num_elements() * t.out.1.dtype.size_bytes();
                    match self.device.alloc(bytes) {
                        Ok(p) => Some(p),
                        Err(e) => {
                            r = Err(e);
                            None
                        }
                    }
                }
                _ => None,
            };
            temps.push(temp);
        }
        if r.is_ok() {
            r = self.library.group_start();
        }
        if r.is_ok() {
            for (t, temp) in transfers.iter().zip(&temps) {
                let (ty, dtype) = (&t.out.1, t.out.1.dtype);
                let call = match (&t.call, &t.input, temp) {
                    (CommCall::Send { dest, tag }, Some((x, tx)), _) => NcclCall::Send {
                        buf: *x,
                        count: tx.num_elements(),
                        dtype: tx.dtype,
                        peer: *dest,
                        tag: Some(*tag),
                    },
                    (CommCall::Receive { src, tag }, _, Some(buf)) => NcclCall::Recv {
                        buf: *buf,
                        count: ty.num_elements(),
                        dtype,
                        peer: *src,
                        tag: Some(*tag),
                    },
                    (other, ..) => {
                        r = Err(CudaError::Other(format!(
                            "{other:?} is not a send with its tensor or a receive"
                        )));
                        break;
                    }
                };
                r = library::check_dtype(call.dtype())
                    .and_then(|_| self.library.issue(c, &call, Stream::Compute));
                if r.is_err() {
                    break;
                }
            }
            // Closed even when a call failed, so NCCL is usable after.
            let ended = self.library.group_end();
            r = r.and(ended);
        }
        if r.is_ok() {
            for (t, temp) in transfers.iter().zip(&temps) {
                let bytes = t.out.1.num_elements() * t.out.1.dtype.size_bytes();
                let src = match (temp, &t.input) {
                    (Some(p), _) => *p,
                    (None, Some((x, _))) => *x,
                    (None, None) => continue,
                };
                r = self.device.copy(t.out.0, src, bytes);
                if r.is_err() {
                    break;
                }
            }
        }
        let synced = self.device.synchronize();
        for p in temps.into_iter().flatten() {
            self.device.free(p);
        }
        r.and(synced)
    }

    /// Stages a host collective through device memory.
    fn staged(
        &self,
        collective: Collective,
        group: &[usize],
        call: CommCall,
        input: Option<&Tensor>,
        out_ty: TensorType,
    ) -> Result<Tensor, CommError> {
        check_group(collective, group, self.rank, self.size)?;
        shardc_runtime::comm::agree_on_call(
            self.bootstrap.as_ref(),
            collective,
            group,
            input.map(Tensor::ty).as_ref(),
            &call.params(),
        )?;
        let fail = |e: CudaError| CommError::Transport {
            collective,
            group: group.to_vec(),
            rank: self.rank,
            reason: e.to_string(),
        };
        let armed = self.arm();
        let run = || -> CudaResult<Tensor> {
            let inp = match input {
                Some(t) => {
                    let p = self.device.alloc(t.size_bytes())?;
                    self.device.upload(p, &t.to_le_bytes())?;
                    Some((p, t.ty()))
                }
                None => None,
            };
            let out = self
                .device
                .alloc(out_ty.num_elements() * out_ty.dtype.size_bytes())?;
            let r = self.run_on_device(&call, inp.as_ref().map(|(p, t)| (*p, t)), (out, &out_ty));
            let mut bytes = vec![0u8; out_ty.num_elements() * out_ty.dtype.size_bytes()];
            let d = r.and_then(|_| self.device.download(out, &mut bytes));
            if let Some((p, _)) = inp {
                self.device.free(p);
            }
            self.device.free(out);
            d?;
            Ok(Tensor::from_le_bytes(&out_ty, &bytes))
        };
        let r = run();
        if armed.fired() {
            return Err(fail(
                self.timed_out(&format!("{collective} on group {group:?}")),
            ));
        }
        r.map_err(fail)
    }

    /// `InvalidArgument` for `collective` on `group` where `reason` says why (the
    /// runtime's [`arguments`] checks, worded as every communicator words them).
    fn invalid_if(
        &self,
        collective: Collective,
        group: &[usize],
        reason: Option<String>,
    ) -> Result<(), CommError> {
        arguments::invalid_if(collective, group, self.rank, reason)
    }

    /// Stages a collective whose result replaces its input (AllReduce, Broadcast).
    fn staged_in_place(
        &self,
        collective: Collective,
        group: &[usize],
        call: CommCall,
        tensor: &mut Tensor,
    ) -> Result<(), CommError> {
        let ty = tensor.ty();
        *tensor = self.staged(collective, group, call, Some(tensor), ty)?;
        Ok(())
    }
}

impl Communicator for NcclComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn all_reduce(
        &self,
        group: &[usize],
        op: ReduceOp,
        tensor: &mut Tensor,
    ) -> Result<(), CommError> {
        let call = CommCall::AllReduce {
            group: group.to_vec(),
            op,
        };
        self.staged_in_place(Collective::AllReduce, group, call, tensor)
    }

    fn all_gather(
        &self,
        group: &[usize],
        axis: usize,
        input: &Tensor,
    ) -> Result<Tensor, CommError> {
        let mut ty = input.ty();
        self.invalid_if(
            Collective::AllGather,
            group,
            arguments::all_gather(&ty, axis),
        )?;
        ty.shape[axis] *= group.len();
        let call = CommCall::AllGather {
            group: group.to_vec(),
            axis,
        };
        self.staged(Collective::AllGather, group, call, Some(input), ty)
    }

    fn reduce_scatter(
        &self,
        group: &[usize],
        op: ReduceOp,
        axis: usize,
        input: &Tensor,
    ) -> Result<Tensor, CommError> {
        let mut ty = input.ty();
        let invalid = arguments::axis_out_of_range(&ty, axis, "axis")
            .or_else(|| arguments::not_divisible(&ty, axis, group.len(), "axis"));
        self.invalid_if(Collective::ReduceScatter, group, invalid)?;
        ty.shape[axis] /= group.len();
        let call = CommCall::ReduceScatter {
            group: group.to_vec(),
            op,
            axis,
        };
        self.staged(Collective::ReduceScatter, group, call, Some(input), ty)
    }

    fn all_to_all(
        &self,
        group: &[usize],
        split_dim: usize,
        concat_dim: usize,
        input: &Tensor,
    ) -> Result<Tensor, CommError> {
        let mut ty = input.ty();
        let g = group.len().max(1);
        let invalid = arguments::all_to_all(&ty, split_dim, concat_dim, group.len());
        self.invalid_if(Collective::AllToAll, group, invalid)?;
        ty.shape[split_dim] /= g;
        ty.shape[concat_dim] *= g;
        let call = CommCall::AllToAll {
            group: group.to_vec(),
            split_dim,
            concat_dim,
        };
        self.staged(Collective::AllToAll, group, call, Some(input), ty)
    }

    fn broadcast(
        &self,
        group: &[usize],
        root: usize,
        tensor: &mut Tensor,
    ) -> Result<(), CommError> {
        let call = CommCall::Broadcast {
            group: group.to_vec(),
            root,
        };
        self.staged_in_place(Collective::Broadcast, group, call, tensor)
    }

    /// Host tensors go over the bootstrap, which matches tags (NCCL pairs a send with the
    /// next receive, whatever the tags); the executor's device transfers use NCCL.
    fn send(&self, dest: usize, tag: i64, tensor: &Tensor) -> Result<(), CommError> {
        self.bootstrap.send(dest, tag, tensor)
    }

    fn recv(&self, src: usize, tag: i64, ty: &TensorType) -> Result<Tensor, CommError> {
        self.bootstrap.recv(src, tag, ty)
    }

    fn barrier(&self, group: &[usize]) -> Result<(), CommError> {
        let mut t = Tensor::zeros(&TensorType::new(DType::Float32, vec![1]));
        self.all_reduce(group, ReduceOp::Sum, &mut t)
    }
}

impl Drop for NcclComm {
    fn drop(&mut self) {
        let comms = std::mem::take(&mut *self.comms.lock().unwrap_or_else(|p| p.into_inner()));
        if self.watchdog.aborted() {
            // ncclCommAbort freed them.
            return;
        }
        for (_, c) in comms {
            self.library.destroy(c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardc_runtime::InProcessWorld;

    #[test]
    fn ranks_beyond_the_gpus_of_their_host_share_one() {
        assert_eq!(shared_gpu(3, 4, 8), None);
        assert_eq!(shared_gpu(0, 1, 1), None, "a world of one needs no NCCL");
        let why = shared_gpu(5, 4, 8).expect("local rank 5 of 4 GPUs");
        assert!(why.contains("shares GPU 1 with local rank 1"), "{why}");
    }

    #[test]
    fn every_rank_stages_through_the_host_when_one_rank_cannot_use_nccl() {
        let decisions: Vec<Option<String>> = std::thread::scope(|s| {
            let hs: Vec<_> = InProcessWorld::new(4)
                .into_iter()
                .enumerate()
                .map(|(rank, c)| {
                    s.spawn(move || {
                        let mine = shared_gpu(rank + 1, 4, 4);
                        why_not_nccl(c.as_ref(), mine).expect("agrees")
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().expect("joins")).collect()
        });
        // Only rank 3 (local rank 4 of 4 GPUs) shares one; all four stage.
        assert!(decisions.iter().all(Option::is_some), "{decisions:?}");
        assert!(decisions[3]
            .as_deref()
            .is_some_and(|w| w.contains("shares GPU 0")));
        assert_eq!(
            decisions[0].as_deref(),
            Some("another rank of the job shares a GPU")
        );
        let all_fine: Vec<Option<String>> = std::thread::scope(|s| {
            let hs: Vec<_> = InProcessWorld::new(2)
                .into_iter()
                .map(|c| s.spawn(move || why_not_nccl(c.as_ref(), None).expect("agrees")))
                .collect();
            hs.into_iter().map(|h| h.join().expect("joins")).collect()
        });
        assert_eq!(all_fine, vec![None, None]);
    }
}
