//! HCCL exports (`libhccl.so`): communicators over the shared-memory transport
//! ([`crate::shm`]) and collectives enqueued on streams ([`crate::collective`]).
//!
//! # Safety
//!
//! Every export is an `unsafe extern "C" fn` called from C: each pointer argument must be
//! null or valid for the reads and writes the C API documents for it (`shardc_ascend_sys::sig`);
//! handles are checked against the emulator's registries, so a stale one is an error code.
#![allow(clippy::missing_safety_doc)]

use crate::acl;
use crate::collective::{self as coll, HType, ROp};
use crate::diag::EmuResult;
use crate::mem::{self, AccessReq};
use crate::shm::{self, Segment};
use crate::stream::{self, Stream};
use crate::{bail, check_sigs, emu_err, ffi};
use shardc_ascend_sys::{
    self as sys, aclrtStream, HcclComm, HcclDataType, HcclReduceOp, HcclResult, HcclRootInfo,
    HcclSendRecvItem,
};
use std::collections::HashMap;
use std::ffi::{c_char, c_void};
use std::sync::{Arc, Mutex, OnceLock};

/// An emulated communicator: this rank's mapping of the segment and its device.
pub struct Comm {
    /// The shared segment.
    pub seg: Arc<Segment>,
    /// The device of the rank (current device at init).
    pub device: i32,
}

const COMM_TAG: usize = 0x7c00_0000_0000;
/// Magic prefix of the root info bytes.
const ROOT_MAGIC: &[u8] = b"SHARDC-EMU-HCCL:";

fn comms() -> std::sync::MutexGuard<'static, HashMap<usize, Arc<Comm>>> {
    static C: OnceLock<Mutex<HashMap<usize, Arc<Comm>>>> = OnceLock::new();
    C.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

fn comm(api: &str, h: HcclComm) -> EmuResult<Arc<Comm>> {
    if h.is_null() {
        bail!(NullPtr, "{api}: comm is null");
    }
    comms().get(&(h as usize)).cloned().ok_or_else(|| {
        emu_err!(
            BadHandle,
            "{api}: comm {:#x} is not a live communicator (destroyed, or never made)",
            h as usize
        )
    })
}

/// `HcclGetRootInfo`: writes a fresh rendezvous token (`pid`, time, counter) into the bytes.
#[no_mangle]
pub unsafe extern "C" fn HcclGetRootInfo(root_info: *mut HcclRootInfo) -> HcclResult {
    let api = "HcclGetRootInfo";
    ffi::hccl(api, || {
        if root_info.is_null() {
            bail!(NullPtr, "{api}: rootInfo is null");
        }
        let token = shm::new_token();
        let mut bytes = ROOT_MAGIC.to_vec();
        bytes.extend_from_slice(token.as_bytes());
        bytes.push(0);
        let out = &mut (*root_info).internal;
        out.fill(0);
        for (o, b) in out.iter_mut().zip(&bytes) {
            *o = *b as c_char;
        }
        Ok(())
    })
}

fn token_of(api: &str, info: &HcclRootInfo) -> EmuResult<String> {
    let bytes: Vec<u8> = info.internal.iter().map(|&c| c as u8).collect();
    let Some(rest) = bytes.strip_prefix(ROOT_MAGIC) else {
        bail!(
            InvalidParam,
            "{api}: the root info was not made by HcclGetRootInfo of this emulator"
        );
    };
    let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
    String::from_utf8(rest[..end].to_vec())
        .map_err(|_| emu_err!(InvalidParam, "{api}: the root info is corrupt"))
}

/// `HcclCommInitRootInfo`: joins the segment named by the root info and waits for every rank
/// (at most `HCCL_CONNECT_TIMEOUT` seconds).
#[no_mangle]
pub unsafe extern "C" fn HcclCommInitRootInfo(
    n_ranks: u32,
    root_info: *const HcclRootInfo,
    rank: u32,
    comm_out: *mut HcclComm,
) -> HcclResult {
    let api = "HcclCommInitRootInfo";
    ffi::hccl(api, || {
        if root_info.is_null() || comm_out.is_null() {
            bail!(NullPtr, "{api}: rootInfo or comm is null");
        }
        let device = acl::need_device(api)?;
        let token = token_of(api, &*root_info)?;
        let seg = Segment::join(api, &token, n_ranks as usize, rank as usize)?;
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1);
        let h = COMM_TAG + NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) * 64;
        comms().insert(
            h,
            Arc::new(Comm {
                seg: Arc::new(seg),
                device,
            }),
        );
        *comm_out = h as HcclComm;
        Ok(())
    })
}

/// `HcclCommDestroy`: leaves the communicator (peers waiting for this rank fail at once); the
/// mapping goes when the last queued collective using it is done.
#[no_mangle]
pub unsafe extern "C" fn HcclCommDestroy(c: HcclComm) -> HcclResult {
    let api = "HcclCommDestroy";
    ffi::hccl(api, || {
        let cm = comm(api, c)?;
        comms().remove(&(c as usize));
        // Let queued work of this rank finish first: leave only when no other reference
        // (a queued collective) holds the segment.
        if Arc::strong_count(&cm.seg) == 1 {
            cm.seg.leave();
        }
        Ok(())
    })
}

/// `HcclGetRankSize`.
#[no_mangle]
pub unsafe extern "C" fn HcclGetRankSize(c: HcclComm, rank_size: *mut u32) -> HcclResult {
    let api = "HcclGetRankSize";
    ffi::hccl(api, || {
        if rank_size.is_null() {
            bail!(NullPtr, "{api}: rankSize is null");
        }
        *rank_size = comm(api, c)?.seg.n as u32;
        Ok(())
    })
}

/// `HcclGetRankId`.
#[no_mangle]
pub unsafe extern "C" fn HcclGetRankId(c: HcclComm, rank: *mut u32) -> HcclResult {
    let api = "HcclGetRankId";
    ffi::hccl(api, || {
        if rank.is_null() {
            bail!(NullPtr, "{api}: rank is null");
        }
        *rank = comm(api, c)?.seg.rank as u32;
        Ok(())
    })
}

/// `HcclGetCommAsyncError`: the code of the communicator's failed call, if any.
#[no_mangle]
pub unsafe extern "C" fn HcclGetCommAsyncError(
    c: HcclComm,
    async_error: *mut HcclResult,
) -> HcclResult {
    let api = "HcclGetCommAsyncError";
    ffi::hccl(api, || {
        if async_error.is_null() {
            bail!(NullPtr, "{api}: asyncError is null");
        }
        *async_error = match comm(api, c)?.seg.failure() {
            Some(e) => ffi::hccl_code(e.kind),
            None => sys::HCCL_SUCCESS,
        };
        Ok(())
    })
}

/// `HcclGetErrorString`.
#[no_mangle]
pub unsafe extern "C" fn HcclGetErrorString(code: HcclResult) -> *const c_char {
    let s: &'static std::ffi::CStr = match code {
        sys::HCCL_SUCCESS => c"success",
        sys::HCCL_E_PARA => c"parameter error",
        sys::HCCL_E_PTR => c"empty pointer",
        sys::HCCL_E_MEMORY => c"memory error",
        sys::HCCL_E_INTERNAL => c"internal error",
        sys::HCCL_E_NOT_SUPPORT => c"not support feature",
        sys::HCCL_E_NOT_FOUND => c"not found specific resource",
        sys::HCCL_E_UNAVAIL => c"resource unavailable",
        sys::HCCL_E_TIMEOUT => c"timeout",
        sys::HCCL_E_RUNTIME => c"call runtime api fail",
        sys::HCCL_E_REMOTE => c"error cqe",
        _ => c"unknown error",
    };
    s.as_ptr()
}

/// Common preparation of a collective: the communicator, its stream (of the comm's device),
/// the element type.
fn prep(
    api: &str,
    c: HcclComm,
    stream: aclrtStream,
    dt: HcclDataType,
) -> EmuResult<(Arc<Comm>, Arc<Stream>, HType)> {
    let cm = comm(api, c)?;
    let s = acl::stream_or_default(api, stream as usize)?;
    if s.device != cm.device {
        bail!(
            WrongDevice,
            "{api}: stream #{} is on device {} but rank {}'s communicator is on device {}",
            s.id,
            s.device,
            cm.seg.rank,
            cm.device
        );
    }
    let t = HType::parse(api, dt as i64)?;
    Ok((cm, s, t))
}

fn bytes(api: &str, count: u64, t: HType) -> EmuResult<u64> {
    count
        .checked_mul(t.size() as u64)
        .filter(|&b| b < (1 << 40))
        .ok_or_else(|| emu_err!(InvalidParam, "{api}: count {count} is too large"))
}

fn root_ok(api: &str, root: u32, n: usize) -> EmuResult<usize> {
    if root as usize >= n {
        bail!(
            InvalidParam,
            "{api}: root {root} is not a rank of the {n}-rank communicator"
        );
    }
    Ok(root as usize)
}

/// `HcclAllReduce`.
#[no_mangle]
pub unsafe extern "C" fn HcclAllReduce(
    send_buf: *mut c_void,
    recv_buf: *mut c_void,
    count: u64,
    data_type: HcclDataType,
    op: HcclReduceOp,
    c: HcclComm,
    stream: aclrtStream,
) -> HcclResult {
    let api = "HcclAllReduce";
    ffi::hccl(api, || {
        let (cm, s, t) = prep(api, c, stream, data_type)?;
        let r = ROp::parse(api, op as i64)?;
        let len = bytes(api, count, t)?;
        let reqs = [
            AccessReq::read(send_buf as u64, len, "sendBuf"),
            AccessReq::write(recv_buf as u64, len, "recvBuf"),
        ];
        let seg = cm.seg.clone();
        stream::submit(api, "HcclAllReduce", &s, &reqs, move |res| {
            Box::new(move || {
                let input = mem::read_bytes(&res[0]);
                let out = coll::all_reduce(&seg, "HcclAllReduce", t, r, &input)?;
                mem::write_bytes(&res[1], &out);
                Ok(())
            })
        })
    })
}

/// `HcclBroadcast`.
#[no_mangle]
pub unsafe extern "C" fn HcclBroadcast(
    buf: *mut c_void,
    count: u64,
    data_type: HcclDataType,
    root: u32,
    c: HcclComm,
    stream: aclrtStream,
) -> HcclResult {
    let api = "HcclBroadcast";
    ffi::hccl(api, || {
        let (cm, s, t) = prep(api, c, stream, data_type)?;
        let root = root_ok(api, root, cm.seg.n)?;
        let len = bytes(api, count, t)?;
        let reqs = [AccessReq::write(buf as u64, len, "buf")];
        let seg = cm.seg.clone();
        stream::submit(api, "HcclBroadcast", &s, &reqs, move |res| {
            Box::new(move || {
                let mut b = mem::read_bytes(&res[0]);
                coll::broadcast(&seg, "HcclBroadcast", t, root, &mut b)?;
                mem::write_bytes(&res[0], &b);
                Ok(())
            })
        })
    })
}

/// `HcclReduceScatter`.
#[no_mangle]
pub unsafe extern "C" fn HcclReduceScatter(
    send_buf: *mut c_void,
    recv_buf: *mut c_void,
    recv_count: u64,
    data_type: HcclDataType,
    op: HcclReduceOp,
    c: HcclComm,
    stream: aclrtStream,
) -> HcclResult {
    let api = "HcclReduceScatter";
    ffi::hccl(api, || {
        let (cm, s, t) = prep(api, c, stream, data_type)?;
        let r = ROp::parse(api, op as i64)?;
        let len = bytes(api, recv_count, t)?;
        let n = cm.seg.n as u64;
        let reqs = [
            AccessReq::read(send_buf as u64, len * n, "sendBuf"),
            AccessReq::write(recv_buf as u64, len, "recvBuf"),
        ];
        let seg = cm.seg.clone();
        stream::submit(api, "HcclReduceScatter", &s, &reqs, move |res| {
            Box::new(move || {
                let input = mem::read_bytes(&res[0]);
                let out = coll::reduce_scatter(
                    &seg,
                    "HcclReduceScatter",
                    t,
                    r,
                    recv_count as usize,
                    &input,
                )?;
                mem::write_bytes(&res[1], &out);
                Ok(())
            })
        })
    })
}

/// `HcclAllGather`.
#[no_mangle]
pub unsafe extern "C" fn HcclAllGather(
    send_buf: *mut c_void,
    recv_buf: *mut c_void,
    send_count: u64,
    data_type: HcclDataType,
    c: HcclComm,
    stream: aclrtStream,
) -> HcclResult {
    let api = "HcclAllGather";
    ffi::hccl(api, || {
        let (cm, s, t) = prep(api, c, stream, data_type)?;
        let len = bytes(api, send_count, t)?;
        let n = cm.seg.n as u64;
        let reqs = [
            AccessReq::read(send_buf as u64, len, "sendBuf"),
            AccessReq::write(recv_buf as u64, len * n, "recvBuf"),
        ];
        let seg = cm.seg.clone();
        stream::submit(api, "HcclAllGather", &s, &reqs, move |res| {
            Box::new(move || {
                let input = mem::read_bytes(&res[0]);
                let out = coll::all_gather(&seg, "HcclAllGather", t, &input)?;
                mem::write_bytes(&res[1], &out);
                Ok(())
            })
        })
    })
}

/// `HcclSend`: matched with the peer's `HcclRecv` from this rank, in issue order.
#[no_mangle]
pub unsafe extern "C" fn HcclSend(
    send_buf: *mut c_void,
    count: u64,
    data_type: HcclDataType,
    dest_rank: u32,
    c: HcclComm,
    stream: aclrtStream,
) -> HcclResult {
    let api = "HcclSend";
    ffi::hccl(api, || {
        let (cm, s, t) = prep(api, c, stream, data_type)?;
        let peer = peer_ok(api, dest_rank, &cm)?;
        let len = bytes(api, count, t)?;
        let reqs = [AccessReq::read(send_buf as u64, len, "sendBuf")];
        let seg = cm.seg.clone();
        stream::submit(api, "HcclSend", &s, &reqs, move |res| {
            Box::new(move || {
                let data = mem::read_bytes(&res[0]);
                seg.send("HcclSend", peer, t.code(), count, &data)
            })
        })
    })
}

fn peer_ok(api: &str, peer: u32, cm: &Comm) -> EmuResult<usize> {
    let (n, me) = (cm.seg.n, cm.seg.rank);
    if peer as usize >= n || peer as usize == me {
        bail!(
            InvalidParam,
            "{api}: rank {me} names peer {peer} (communicator of {n} ranks)"
        );
    }
    Ok(peer as usize)
}

/// `HcclRecv`.
#[no_mangle]
pub unsafe extern "C" fn HcclRecv(
    recv_buf: *mut c_void,
    count: u64,
    data_type: HcclDataType,
    src_rank: u32,
    c: HcclComm,
    stream: aclrtStream,
) -> HcclResult {
    let api = "HcclRecv";
    ffi::hccl(api, || {
        let (cm, s, t) = prep(api, c, stream, data_type)?;
        let peer = peer_ok(api, src_rank, &cm)?;
        let len = bytes(api, count, t)?;
        let reqs = [AccessReq::write(recv_buf as u64, len, "recvBuf")];
        let seg = cm.seg.clone();
        stream::submit(api, "HcclRecv", &s, &reqs, move |res| {
            Box::new(move || {
                let mut out = vec![0u8; len as usize];
                seg.recv("HcclRecv", peer, t.code(), count, &mut out)?;
                mem::write_bytes(&res[0], &out);
                Ok(())
            })
        })
    })
}

/// `HcclAlltoAll` (equal blocks; `sendCount` must equal `recvCount` and the types agree).
#[no_mangle]
pub unsafe extern "C" fn HcclAlltoAll(
    send_buf: *const c_void,
    send_count: u64,
    send_type: HcclDataType,
    recv_buf: *const c_void,
    recv_count: u64,
    recv_type: HcclDataType,
    c: HcclComm,
    stream: aclrtStream,
) -> HcclResult {
    let api = "HcclAlltoAll";
    ffi::hccl(api, || {
        let (cm, s, t) = prep(api, c, stream, send_type)?;
        if send_type != recv_type || send_count != recv_count {
            bail!(
                InvalidParam,
                "{api}: sendCount {send_count} / sendType {send_type} must equal recvCount {recv_count} / recvType {recv_type}"
            );
        }
        let len = bytes(api, send_count, t)? * cm.seg.n as u64;
        let reqs = [
            AccessReq::read(send_buf as u64, len, "sendBuf"),
            AccessReq::write(recv_buf as u64, len, "recvBuf"),
        ];
        let seg = cm.seg.clone();
        stream::submit(api, "HcclAlltoAll", &s, &reqs, move |res| {
            Box::new(move || {
                let input = mem::read_bytes(&res[0]);
                let out = coll::all_to_all(&seg, "HcclAlltoAll", t, send_count as usize, &input)?;
                mem::write_bytes(&res[1], &out);
                Ok(())
            })
        })
    })
}

/// `HcclBatchSendRecv`: every item is posted together (one thread per peer and direction),
/// so two ranks may exchange both ways at once.
#[no_mangle]
pub unsafe extern "C" fn HcclBatchSendRecv(
    items: *mut HcclSendRecvItem,
    item_num: u32,
    c: HcclComm,
    stream: aclrtStream,
) -> HcclResult {
    let api = "HcclBatchSendRecv";
    ffi::hccl(api, || {
        if item_num > 0 && items.is_null() {
            bail!(NullPtr, "{api}: sendRecvInfo is null with {item_num} items");
        }
        let list: Vec<HcclSendRecvItem> = if item_num == 0 {
            Vec::new()
        } else {
            std::slice::from_raw_parts(items, item_num as usize).to_vec()
        };
        let (cm, s, _) = prep(api, c, stream, sys::HCCL_DATA_TYPE_INT8)?;
        let mut reqs = Vec::new();
        let mut plan = Vec::new();
        for (i, it) in list.iter().enumerate() {
            let t = HType::parse(api, it.dataType as i64)?;
            let peer = peer_ok(api, it.remoteRank, &cm)?;
            let len = bytes(api, it.count, t)?;
            let send = match it.sendRecvType {
                sys::HCCL_SEND => true,
                sys::HCCL_RECV => false,
                k => bail!(InvalidParam, "{api}: item {i} has HcclSendRecvType {k}"),
            };
            let role = format!("item {i} buf");
            reqs.push(if send {
                AccessReq::read(it.buf as u64, len, role)
            } else {
                AccessReq::write(it.buf as u64, len, role)
            });
            plan.push((send, peer, t, it.count, len));
        }
        let seg = cm.seg.clone();
        stream::submit(api, "HcclBatchSendRecv", &s, &reqs, move |res| {
            Box::new(move || {
                // Group by (direction, peer), keeping issue order inside a group.
                let mut groups: Vec<((bool, usize), Vec<usize>)> = Vec::new();
                for (i, &(send, peer, ..)) in plan.iter().enumerate() {
                    match groups.iter_mut().find(|(k, _)| *k == (send, peer)) {
                        Some((_, v)) => v.push(i),
                        None => groups.push(((send, peer), vec![i])),
                    }
                }
                let results: Vec<EmuResult<()>> = std::thread::scope(|sc| {
                    let hs: Vec<_> = groups
                        .iter()
                        .map(|(_, idx)| {
                            let (seg, plan, res) = (&seg, &plan, &res);
                            sc.spawn(move || -> EmuResult<()> {
                                for &i in idx {
                                    let (send, peer, t, count, len) = plan[i];
                                    if send {
                                        let d = mem::read_bytes(&res[i]);
                                        seg.send("HcclBatchSendRecv", peer, t.code(), count, &d)?;
                                    } else {
                                        let mut out = vec![0u8; len as usize];
                                        seg.recv(
                                            "HcclBatchSendRecv",
                                            peer,
                                            t.code(),
                                            count,
                                            &mut out,
                                        )?;
                                        mem::write_bytes(&res[i], &out);
                                    }
                                }
                                Ok(())
                            })
                        })
                        .collect();
                    hs.into_iter()
                        .map(|h| {
                            h.join().unwrap_or_else(|_| {
                                Err(emu_err!(Internal, "HcclBatchSendRecv: a transfer panicked"))
                            })
                        })
                        .collect()
                });
                results.into_iter().collect()
            })
        })
    })
}

check_sigs!(
    HcclGetRootInfo,
    HcclCommInitRootInfo,
    HcclCommDestroy,
    HcclGetRankSize,
    HcclGetRankId,
    HcclGetCommAsyncError,
    HcclGetErrorString,
    HcclAllReduce,
    HcclBroadcast,
    HcclReduceScatter,
    HcclAllGather,
    HcclSend,
    HcclRecv,
    HcclAlltoAll,
    HcclBatchSendRecv,
);
