//! HCCL collectives: MindSpore's `init("hccl")`.
//!
//! [`HcclComm`] implements the runtime's [`Communicator`] for one rank per Ascend device. The
//! world's HCCL communicator is made from the root info rank 0 makes (`HcclGetRootInfo`) and
//! hands to the others over the *bootstrap* communicator (the cluster's rendezvous + TCP or
//! shared memory, or MPI under `mpirun`), then `HcclCommInitRootInfo` on every rank; each
//! sub-group of the strategy gets its own communicator the same way, its root info made by
//! its lowest member and sent only to the members (under a bootstrap tag derived from the
//! group). Collectives along an axis other than 0 are rearranged on the device with
//! `aclnnInplaceCopy` of strided views (HCCL concatenates and scatters flat buffers).
//!
//! Collectives of host [`Tensor`]s (the trait) are staged through device memory after the
//! members have compared their calls over the bootstrap (HCCL cannot tell a disagreement: it
//! would wait or read past a buffer); host sends and receives go over the bootstrap, which
//! matches tags. The executor calls [`HcclComm::run_on_device`] and
//! [`HcclComm::all_reduce_on`] on its device buffers directly.
//!
//! Every host wait on HCCL work is bounded by `SHARDC_COMM_TIMEOUT` (300 s by default, as the
//! NCCL watchdog): `aclrtSynchronizeStreamWithTimeout`, and on expiry an error naming what
//! was in flight, the group and the rank, where HCCL alone would wait for ever for a member
//! that never comes.

use crate::acl::{find, AscendDevice, DevPtr, Stream};
use crate::aclnn::{self, Arena, Runner};
use crate::error::{AscendError, AscendResult};
use crate::probe::{self, Library};
use shardc_ascend_sys::{self as sys, sig};
use shardc_ir::{DType, ReduceOp, TensorType};
use shardc_runtime::comm::{arguments, check_group, Collective};
use shardc_runtime::executor::device::Transfer;
use shardc_runtime::executor::CommCall;
use shardc_runtime::{CommError, Communicator, Tensor};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, OnceLock};

macro_rules! hccl_api {
    ($($name:ident),* $(,)?) => {
        /// The HCCL functions shardc calls, resolved once ([`hccl_api`]).
        #[allow(non_snake_case)]
        pub struct HcclApi {
            $(
                #[doc = concat!("`", stringify!($name), "`.")]
                pub $name: sig::$name,
            )*
            /// The opened library.
            pub libraries: Vec<(Library, probe::Opened)>,
        }

        impl HcclApi {
            fn resolve(libraries: Vec<(Library, probe::Opened)>) -> AscendResult<HcclApi> {
                Ok(HcclApi {
                    $(
                        // SAFETY: the symbol has the C signature of `sig::$name` (the sys
                        // crate's, from CANN's headers).
                        $name: unsafe {
                            std::mem::transmute::<*mut c_void, sig::$name>(find(
                                &libraries,
                                stringify!($name),
                            )?)
                        },
                    )*
                    libraries,
                })
            }
        }
    };
}

hccl_api! {
    HcclGetRootInfo, HcclCommInitRootInfo, HcclCommDestroy, HcclGetRankSize, HcclGetRankId,
    HcclGetCommAsyncError, HcclGetErrorString, HcclAllReduce, HcclBroadcast, HcclReduceScatter,
    HcclAllGather, HcclSend, HcclRecv, HcclAlltoAll, HcclBatchSendRecv,
}

static HCCL: OnceLock<Result<HcclApi, String>> = OnceLock::new();

/// HCCL, opened and resolved once per process (a missing `libhccl.so` is an error naming it).
pub fn hccl_api() -> AscendResult<&'static HcclApi> {
    let r = HCCL.get_or_init(|| {
        let load = || -> AscendResult<HcclApi> {
            let libs = probe::open(Library::Hccl)?
                .into_iter()
                .map(|o| (Library::Hccl, o))
                .collect();
            HcclApi::resolve(libs)
        };
        load().map_err(|e| e.to_string())
    });
    match r {
        Ok(a) => Ok(a),
        Err(e) => Err(AscendError::Other(e.clone())),
    }
}

/// The bootstrap tags root infos travel under: this base plus 32 bits of a hash of the group
/// (far from the graph's own tags, and from NCCL's). Derived from the group, not from how
/// many communicators a rank has made, because members of one group may have made different
/// numbers before.
const ROOT_TAG_BASE: i64 = i64::MAX - (1 << 34);

fn root_tag(group: &[usize]) -> i64 {
    let h = group.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &r| {
        (h ^ r as u64).wrapping_mul(0x0100_0000_01b3)
    });
    ROOT_TAG_BASE + (h & 0xFFFF_FFFF) as i64
}

/// HCCL's element type of `d`: Bool moves as bytes (it is never reduced).
pub fn hccl_dtype(d: DType) -> sys::HcclDataType {
    match d {
        DType::Float32 => sys::HCCL_DATA_TYPE_FP32,
        DType::Float64 => sys::HCCL_DATA_TYPE_FP64,
        DType::Float16 => sys::HCCL_DATA_TYPE_FP16,
        DType::BFloat16 => sys::HCCL_DATA_TYPE_BFP16,
        DType::Int32 => sys::HCCL_DATA_TYPE_INT32,
        DType::Int64 => sys::HCCL_DATA_TYPE_INT64,
        DType::Bool => sys::HCCL_DATA_TYPE_UINT8,
    }
}

/// HCCL's reduction of `op`.
pub fn hccl_op(op: ReduceOp) -> sys::HcclReduceOp {
    match op {
        ReduceOp::Sum => sys::HCCL_REDUCE_SUM,
        ReduceOp::Max => sys::HCCL_REDUCE_MAX,
        ReduceOp::Min => sys::HCCL_REDUCE_MIN,
        ReduceOp::Prod => sys::HCCL_REDUCE_PROD,
    }
}

/// The dims of `shape` around `axis` split into `parts`: (pre, d / parts, post).
fn around(shape: &[usize], axis: usize, parts: usize) -> (usize, usize, usize) {
    let pre: usize = shape[..axis].iter().product();
    let post: usize = shape[axis + 1..].iter().product();
    (pre, shape[axis] / parts.max(1), post)
}

/// HCCL for one rank (see the module doc).
pub struct HcclComm {
    dev: Arc<AscendDevice>,
    api: &'static HcclApi,
    bootstrap: Arc<dyn Communicator>,
    /// Each group's communicator (sorted global ranks -> `HcclComm` handle), made on first
    /// use.
    comms: Mutex<HashMap<Vec<usize>, usize>>,
    /// The rearrangements' temporaries and their copies' workspace (compute-stream order).
    temps: Arena,
    workspace: Arena,
    rank: usize,
    size: usize,
}

impl std::fmt::Debug for HcclComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "HcclComm(rank {} of {}, {})",
            self.rank,
            self.size,
            self.dev.description()
        )
    }
}

impl HcclComm {
    /// Joins the world of `bootstrap` with HCCL on `dev`: rank 0's root info goes to every
    /// rank over the bootstrap. Every rank must call it.
    pub fn new(dev: Arc<AscendDevice>, bootstrap: Arc<dyn Communicator>) -> AscendResult<HcclComm> {
        let api = hccl_api()?;
        dev.bind()?;
        let c = HcclComm {
            rank: bootstrap.rank(),
            size: bootstrap.size(),
            dev,
            api,
            bootstrap,
            comms: Mutex::new(HashMap::new()),
            temps: Arena::default(),
            workspace: Arena::default(),
        };
        c.comm_for(&(0..c.size).collect::<Vec<_>>())?;
        Ok(c)
    }

    /// The device.
    pub fn device(&self) -> &Arc<AscendDevice> {
        &self.dev
    }

    /// Creates the communicators of `groups` now (each sorted, holding this rank), in one
    /// order every rank shares (sorted), so that no rank waits in one group's creation for a
    /// member that waits in another's: the executor's groups before its first step.
    pub fn prepare(&self, groups: &[Vec<usize>]) -> AscendResult<()> {
        let mut groups: Vec<&Vec<usize>> =
            groups.iter().filter(|g| g.contains(&self.rank)).collect();
        groups.sort();
        groups.dedup();
        for g in groups {
            self.comm_for(g)?;
        }
        Ok(())
    }

    /// An HCCL failure of `call` with `code`, naming `what` (the group, the rank).
    fn fail(&self, call: &'static str, code: sys::HcclResult, what: &str) -> AscendError {
        // SAFETY: returns a static string or null.
        let text = crate::acl::c_text(unsafe { (self.api.HcclGetErrorString)(code) });
        AscendError::Hccl {
            call,
            reason: format!(
                "error {code}{} ({what}, rank {})",
                if text.is_empty() {
                    String::new()
                } else {
                    format!(": {text}")
                },
                self.rank
            ),
        }
    }

    /// The HCCL communicator of `group` (sorted global ranks holding this rank), made on first
    /// use: the lowest member makes the root info and sends it, with the group, to the
    /// others over the bootstrap.
    fn comm_for(&self, group: &[usize]) -> AscendResult<sys::HcclComm> {
        let mut comms = self.comms.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(&c) = comms.get(group) {
            return Ok(c as sys::HcclComm);
        }
        let me = group.iter().position(|&r| r == self.rank).ok_or_else(|| {
            AscendError::Other(format!("rank {} is not in group {group:?}", self.rank))
        })?;
        self.dev.bind()?;
        const WORDS: usize = sys::HCCL_ROOT_INFO_BYTES / 4;
        let words = WORDS + 1 + group.len();
        let boot = |e: CommError| {
            AscendError::Other(format!(
                "handing out the HCCL root info of group {group:?}: {e}"
            ))
        };
        let mut root = sys::HcclRootInfo::default();
        if me == 0 {
            // SAFETY: writes one HcclRootInfo.
            let code = unsafe { (self.api.HcclGetRootInfo)(&mut root) };
            if code != sys::HCCL_SUCCESS {
                return Err(self.fail("HcclGetRootInfo", code, &format!("group {group:?}")));
            }
            let mut message: Vec<i32> = root
                .internal
                .chunks(4)
                .map(|c| i32::from_le_bytes([c[0] as u8, c[1] as u8, c[2] as u8, c[3] as u8]))
                .collect();
            message.push(group.len() as i32);
            message.extend(group.iter().map(|&r| r as i32));
            let t = Tensor::from_i32(vec![words], message)
                .ok_or_else(|| AscendError::Other("the root info message is malformed".into()))?;
            for &r in &group[1..] {
                self.bootstrap.send(r, root_tag(group), &t).map_err(boot)?;
            }
        } else {
            let ty = TensorType::new(DType::Int32, vec![words]);
            let t = self
                .bootstrap
                .recv(group[0], root_tag(group), &ty)
                .map_err(boot)?;
            let shardc_runtime::Data::I32(message) = &t.data else {
                return Err(AscendError::Other(format!(
                    "the HCCL root info of group {group:?} from rank {} is not Int32",
                    group[0]
                )));
            };
            let sent: Vec<usize> = message[WORDS + 1..].iter().map(|&r| r as usize).collect();
            if sent != group {
                return Err(AscendError::Other(format!(
                    "rank {} sent the HCCL root info of group {sent:?} where rank {} expected group {group:?}",
                    group[0], self.rank
                )));
            }
            for (i, w) in message[..WORDS].iter().enumerate() {
                for (j, b) in w.to_le_bytes().iter().enumerate() {
                    root.internal[i * 4 + j] = *b as std::ffi::c_char;
                }
            }
        }
        let mut comm: sys::HcclComm = std::ptr::null_mut();
        // SAFETY: `root` holds the group's root info; writes one handle.
        let code = unsafe {
            (self.api.HcclCommInitRootInfo)(group.len() as u32, &root, me as u32, &mut comm)
        };
        if code != sys::HCCL_SUCCESS {
            return Err(self.fail(
                "HcclCommInitRootInfo",
                code,
                &format!("group {group:?} as member {me}"),
            ));
        }
        comms.insert(group.to_vec(), comm as usize);
        Ok(comm)
    }

    /// A launcher of the rearranging copies on the compute stream.
    fn runner(&self) -> Runner<'_> {
        Runner {
            dev: &self.dev,
            workspace: &self.workspace,
        }
    }

    /// Copies `src` (shape `(pre, parts, d, post)` read as `(parts, pre, d, post)`) into
    /// `dst`: `to_parts` makes each part contiguous (before a scatter), otherwise the
    /// reverse (after a gather). An `aclnnInplaceCopy` of a strided view.
    fn rearrange(
        &self,
        dtype: DType,
        src: DevPtr,
        dst: DevPtr,
        (pre, parts, d, post): (usize, usize, usize, usize),
        to_parts: bool,
    ) -> AscendResult<()> {
        if pre * parts * d * post == 0 {
            return Ok(());
        }
        let api = self.dev.api();
        let (shape, strides) = if to_parts {
            let st = aclnn::contiguous_strides(&[pre, parts, d, post]);
            (vec![parts, pre, d, post], vec![st[1], st[0], st[2], st[3]])
        } else {
            let st = aclnn::contiguous_strides(&[parts, pre, d, post]);
            (vec![pre, parts, d, post], vec![st[1], st[0], st[2], st[3]])
        };
        let view = aclnn::tensor_view(api, src, dtype, &shape, &strides, 0, sys::ACL_FORMAT_ND)?;
        let out = aclnn::tensor(api, dst, dtype, &shape)?;
        let r = self.runner();
        crate::aclnn!(
            &r,
            aclnnInplaceCopy,
            aclnnInplaceCopyGetWorkspaceSize(out.ptr(), view.ptr())
        )
    }

    /// Temporaries of `sizes` bytes from the communicator's block (compute-stream order).
    fn temps(&self, sizes: &[usize]) -> AscendResult<Vec<DevPtr>> {
        let aligned: Vec<usize> = sizes
            .iter()
            .map(|&b| b.max(1).next_multiple_of(512))
            .collect();
        let mut at = self.temps.get(&self.dev, aligned.iter().sum())?;
        let mut out = Vec::with_capacity(sizes.len());
        for b in aligned {
            out.push(at);
            at += b as u64;
        }
        Ok(out)
    }

    fn check(
        &self,
        call: &'static str,
        code: sys::HcclResult,
        what: impl Fn() -> String,
    ) -> AscendResult<()> {
        if code == sys::HCCL_SUCCESS {
            Ok(())
        } else {
            Err(self.fail(call, code, &what()))
        }
    }

    /// An in-place AllReduce of `count` elements at `buf` over `group` on `stream` (a
    /// gradient bucket on the communication stream; the caller orders it after the packs
    /// and records the bucket's event after it).
    pub fn all_reduce_on(
        &self,
        stream: Stream,
        group: &[usize],
        op: ReduceOp,
        buf: DevPtr,
        count: usize,
        dtype: DType,
    ) -> AscendResult<()> {
        let c = self.comm_for(group)?;
        // SAFETY: `buf` holds `count` elements of `dtype` on this device.
        let code = unsafe {
            (self.api.HcclAllReduce)(
                buf as *mut c_void,
                buf as *mut c_void,
                count as u64,
                hccl_dtype(dtype),
                hccl_op(op),
                c,
                stream.raw(),
            )
        };
        self.check("HcclAllReduce", code, || {
            format!("a gradient bucket on group {group:?}")
        })
    }

    /// `HcclAllGather` of `count` elements at `send` from every member of `group` into `recv`
    /// (members × `count`, in group order) on `stream` (a parameter-gather bucket, on the
    /// communication stream).
    pub fn all_gather_on(
        &self,
        stream: Stream,
        group: &[usize],
        send: DevPtr,
        recv: DevPtr,
        count: usize,
        dtype: DType,
    ) -> AscendResult<()> {
        let c = self.comm_for(group)?;
        // SAFETY: `send` holds `count` elements of `dtype` on this device and `recv`
        // `group.len() * count`; the two do not overlap.
        let code = unsafe {
            (self.api.HcclAllGather)(
                send as *mut c_void,
                recv as *mut c_void,
                count as u64,
                hccl_dtype(dtype),
                c,
                stream.raw(),
            )
        };
        self.check("HcclAllGather", code, || {
            format!("a parameter-gather bucket on group {group:?}")
        })
    }

    /// Runs a resolved collective on device memory: `input` (absent for Receive) into `out` of
    /// type `out_ty`, ordered on the compute stream after the work before it.
    pub fn run_on_device(
        &self,
        call: &CommCall,
        input: Option<(DevPtr, &TensorType)>,
        (out, out_ty): (DevPtr, &TensorType),
    ) -> AscendResult<()> {
        let dtype = out_ty.dtype;
        let hd = hccl_dtype(dtype);
        let count = out_ty.num_elements();
        let elem = dtype.size_bytes();
        let stream = self.dev.stream().raw();
        let need = || input.ok_or_else(|| AscendError::Other(format!("{call:?} has no operand")));
        let p = |x: DevPtr| x as *mut c_void;
        match call {
            CommCall::AllReduce { group, op } => {
                let (x, _) = need()?;
                if dtype == DType::Bool {
                    return Err(AscendError::Other("AllReduce of Bool tensors".into()));
                }
                let c = self.comm_for(group)?;
                // SAFETY: device buffers of `count` elements.
                let code = unsafe {
                    (self.api.HcclAllReduce)(
                        p(x),
                        p(out),
                        count as u64,
                        hd,
                        hccl_op(*op),
                        c,
                        stream,
                    )
                };
                self.check("HcclAllReduce", code, || format!("group {group:?}"))
            }
            CommCall::Broadcast { group, root } => {
                let (x, _) = need()?;
                let r = group.iter().position(|g| g == root).ok_or_else(|| {
                    AscendError::Other(format!("Broadcast root {root} is not in group {group:?}"))
                })?;
                let c = self.comm_for(group)?;
                self.dev.copy(out, x, count * elem)?;
                // SAFETY: `out` holds `count` elements.
                let code = unsafe {
                    (self.api.HcclBroadcast)(p(out), count as u64, hd, r as u32, c, stream)
                };
                self.check("HcclBroadcast", code, || {
                    format!("group {group:?}, root {root}")
                })
            }
            CommCall::AllGather { group, axis } => {
                let (x, tx) = need()?;
                let c = self.comm_for(group)?;
                let g = group.len();
                let n = tx.num_elements();
                let gather = |recv: DevPtr| {
                    // SAFETY: `recv` holds `g * n` elements.
                    let code =
                        unsafe { (self.api.HcclAllGather)(p(x), p(recv), n as u64, hd, c, stream) };
                    self.check("HcclAllGather", code, || format!("group {group:?}"))
                };
                if *axis == 0 {
                    gather(out)
                } else {
                    let (pre, d, post) = around(&tx.shape, *axis, 1);
                    let t = self.temps(&[g * n * elem])?;
                    gather(t[0])?;
                    self.rearrange(dtype, t[0], out, (pre, g, d, post), false)
                }
            }
            CommCall::ReduceScatter { group, op, axis } => {
                let (x, tx) = need()?;
                let c = self.comm_for(group)?;
                let g = group.len();
                let scatter = |send: DevPtr| {
                    // SAFETY: `send` holds `g * count` elements, `out` `count`.
                    let code = unsafe {
                        (self.api.HcclReduceScatter)(
                            p(send),
                            p(out),
                            count as u64,
                            hd,
                            hccl_op(*op),
                            c,
                            stream,
                        )
                    };
                    self.check("HcclReduceScatter", code, || format!("group {group:?}"))
                };
                if *axis == 0 {
                    scatter(x)
                } else {
                    let (pre, d, post) = around(&tx.shape, *axis, g);
                    let t = self.temps(&[tx.num_elements() * elem])?;
                    self.rearrange(dtype, x, t[0], (pre, g, d, post), true)?;
                    scatter(t[0])
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
                let mut part_shape = tx.shape.clone();
                part_shape[*split_dim] /= g.max(1);
                let (cpre, cd, cpost) = around(&part_shape, *concat_dim, 1);
                let t = self.temps(&[n * elem, n * elem])?;
                let (send, recv) = (t[0], t[1]);
                self.rearrange(dtype, x, send, (pre, g, d, post), true)?;
                // SAFETY: both hold `g * part` elements.
                let code = unsafe {
                    (self.api.HcclAlltoAll)(
                        send as *const c_void,
                        part as u64,
                        hd,
                        recv as *const c_void,
                        part as u64,
                        hd,
                        c,
                        stream,
                    )
                };
                self.check("HcclAlltoAll", code, || format!("group {group:?}"))?;
                self.rearrange(dtype, recv, out, (cpre, g, cd, cpost), false)
            }
            CommCall::Send { dest, .. } => {
                let (x, tx) = need()?;
                let world: Vec<usize> = (0..self.size).collect();
                let c = self.comm_for(&world)?;
                // SAFETY: `x` holds the tensor.
                let code = unsafe {
                    (self.api.HcclSend)(p(x), tx.num_elements() as u64, hd, *dest as u32, c, stream)
                };
                self.check("HcclSend", code, || format!("to rank {dest}"))?;
                self.dev.copy(out, x, tx.num_elements() * elem)
            }
            CommCall::Receive { src, .. } => {
                let world: Vec<usize> = (0..self.size).collect();
                let c = self.comm_for(&world)?;
                // SAFETY: `out` holds `count` elements.
                let code = unsafe {
                    (self.api.HcclRecv)(p(out), count as u64, hd, *src as u32, c, stream)
                };
                self.check("HcclRecv", code, || format!("from rank {src}"))
            }
        }
    }

    /// Issues `transfers` (sends and receives, none reading another's result) as one
    /// `HcclBatchSendRecv`, so that transfers each rank posts in another order pair up:
    /// receives land in temporaries and every result is written after, in order (a result may
    /// take the buffer of a send's input).
    pub fn run_transfers(&self, transfers: &[Transfer<DevPtr>]) -> AscendResult<()> {
        let world: Vec<usize> = (0..self.size).collect();
        let c = self.comm_for(&world)?;
        let sizes: Vec<usize> = transfers
            .iter()
            .map(|t| match t.call {
                CommCall::Receive { .. } => t.out.1.num_elements() * t.out.1.dtype.size_bytes(),
                _ => 0,
            })
            .collect();
        let temps = self.temps(&sizes)?;
        let mut items = Vec::with_capacity(transfers.len());
        for (t, &temp) in transfers.iter().zip(&temps) {
            let item = match (&t.call, &t.input) {
                (CommCall::Send { dest, .. }, Some((x, tx))) => sys::HcclSendRecvItem {
                    sendRecvType: sys::HCCL_SEND,
                    buf: *x as *mut c_void,
                    count: tx.num_elements() as u64,
                    dataType: hccl_dtype(tx.dtype),
                    remoteRank: *dest as u32,
                },
                (CommCall::Receive { src, .. }, _) => sys::HcclSendRecvItem {
                    sendRecvType: sys::HCCL_RECV,
                    buf: temp as *mut c_void,
                    count: t.out.1.num_elements() as u64,
                    dataType: hccl_dtype(t.out.1.dtype),
                    remoteRank: *src as u32,
                },
                (other, _) => {
                    return Err(AscendError::Other(format!(
                        "{other:?} is not a send with its tensor or a receive"
                    )))
                }
            };
            items.push(item);
        }
        // SAFETY: the items describe device buffers of this device.
        let code = unsafe {
            (self.api.HcclBatchSendRecv)(
                items.as_mut_ptr(),
                items.len() as u32,
                c,
                self.dev.stream().raw(),
            )
        };
        self.check("HcclBatchSendRecv", code, || {
            format!("{} sends and receives", items.len())
        })?;
        for (t, &temp) in transfers.iter().zip(&temps) {
            let bytes = t.out.1.num_elements() * t.out.1.dtype.size_bytes();
            let src = match (&t.call, &t.input) {
                (CommCall::Receive { .. }, _) => temp,
                (_, Some((x, _))) => *x,
                _ => continue,
            };
            self.dev.copy(t.out.0, src, bytes)?;
        }
        Ok(())
    }

    /// The communicators' asynchronous errors, in words (empty when none).
    pub fn async_errors(&self) -> String {
        let comms = self.comms.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = Vec::new();
        for (g, &c) in comms.iter() {
            let mut e = sys::HCCL_SUCCESS;
            // SAFETY: a live communicator; writes one result.
            let code = unsafe { (self.api.HcclGetCommAsyncError)(c as sys::HcclComm, &mut e) };
            if code == sys::HCCL_SUCCESS && e != sys::HCCL_SUCCESS {
                // SAFETY: returns a static string or null.
                let text = crate::acl::c_text(unsafe { (self.api.HcclGetErrorString)(e) });
                out.push(format!("group {g:?}: error {e} {text}"));
            }
        }
        out.join("; ")
    }

    /// The error of a host wait that outlasted the timeout: `what` names what was in flight.
    pub fn timed_out(&self, what: &str) -> AscendError {
        let asynchronous = self.async_errors();
        AscendError::Hccl {
            call: "a wait for the collectives",
            reason: format!(
                "rank {} (device {}) waited more than {:?} (SHARDC_COMM_TIMEOUT) for {what}: a member never issued them, or issued others or in another order{}",
                self.rank,
                self.dev.id(),
                self.dev.timeout(),
                if asynchronous.is_empty() {
                    String::new()
                } else {
                    format!(" (HCCL reports {asynchronous})")
                }
            ),
        }
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
        let fail = |e: AscendError| CommError::Transport {
            collective,
            group: group.to_vec(),
            rank: self.rank,
            reason: e.to_string(),
        };
        let run = || -> AscendResult<Tensor> {
            self.dev.bind()?;
            let out_bytes = out_ty.num_elements() * out_ty.dtype.size_bytes();
            let inp = match input {
                Some(t) => {
                    let p = self.dev.malloc(t.size_bytes())?;
                    let up = self.dev.upload(p, &t.to_le_bytes());
                    if let Err(e) = up {
                        self.dev.free(p);
                        return Err(e);
                    }
                    Some((p, t.ty()))
                }
                None => None,
            };
            let out = match self.dev.malloc(out_bytes) {
                Ok(o) => o,
                Err(e) => {
                    if let Some((p, _)) = inp {
                        self.dev.free(p);
                    }
                    return Err(e);
                }
            };
            let r = self.run_on_device(&call, inp.as_ref().map(|(p, t)| (*p, t)), (out, &out_ty));
            let mut bytes = vec![0u8; out_bytes];
            let d = r.and_then(|_| self.dev.download(out, &mut bytes));
            let timed_out = matches!(d, Err(AscendError::Timeout { .. }));
            if !timed_out {
                // Work in flight would still use them after a timeout: leaked then.
                if let Some((p, _)) = inp {
                    self.dev.free(p);
                }
                self.dev.free(out);
            }
            match d {
                Err(AscendError::Timeout { .. }) => {
                    Err(self.timed_out(&format!("{collective} on group {group:?}")))
                }
                Err(e) => Err(e),
                Ok(()) => Ok(Tensor::from_le_bytes(&out_ty, &bytes)),
            }
        };
        run().map_err(fail)
    }

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

impl Communicator for HcclComm {
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
        arguments::invalid_if(
            Collective::AllGather,
            group,
            self.rank,
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
        arguments::invalid_if(Collective::ReduceScatter, group, self.rank, invalid)?;
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
        arguments::invalid_if(Collective::AllToAll, group, self.rank, invalid)?;
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

    /// Host tensors go over the bootstrap, which matches tags (HCCL pairs a send with the next
    /// receive, whatever the tags); the executor's device transfers use HCCL.
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

impl Drop for HcclComm {
    fn drop(&mut self) {
        if self.dev.synchronize().is_err() {
            // A collective is still held up (a lost peer): its communicator and temporaries
            // are left to the process's end rather than destroyed under it.
            return;
        }
        let comms = std::mem::take(&mut *self.comms.lock().unwrap_or_else(|p| p.into_inner()));
        let _ = self.dev.bind();
        for (_, c) in comms {
            // SAFETY: a communicator made here, destroyed once.
            unsafe { (self.api.HcclCommDestroy)(c as sys::HcclComm) };
        }
        self.temps.release(&self.dev);
        self.workspace.release(&self.dev);
    }
}
