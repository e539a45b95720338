//! AscendCL runtime exports (`libascendcl.so`): init, devices, memory, copies, streams and
//! events, and the thread's recent error message.
//!
//! # Safety
//!
//! Every export is an `unsafe extern "C" fn` called from C: each pointer argument must be
//! null or valid for the reads and writes the C API documents for it (`shardc_ascend_sys::sig`);
//! handles are checked against the emulator's registries, so a stale one is an error code.
#![allow(clippy::missing_safety_doc)]

use crate::diag::EmuResult;
use crate::mem::{self, engine, AccessReq, Accessor};
use crate::stream::{self, Event, Stream};
use crate::{bail, check_sigs, ffi};
use shardc_ascend_sys::{self as sys, aclError, aclrtEvent, aclrtStream};
use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::{c_char, c_void};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

static INITIALIZED: AtomicBool = AtomicBool::new(false);

/// Bytes of HBM each emulated device reports (aclrtGetMemInfo).
pub const HBM_BYTES: u64 = 64 << 30;

thread_local! {
    static CURRENT: Cell<Option<i32>> = const { Cell::new(None) };
}

/// Fails with `Uninitialized` unless `aclInit` was called.
pub fn need_init(api: &str) -> EmuResult<()> {
    if !INITIALIZED.load(Ordering::Acquire) {
        bail!(Uninitialized, "{api}: aclInit has not been called");
    }
    Ok(())
}

/// The calling thread's current device (`aclrtSetDevice`), if any.
pub fn current_device() -> Option<i32> {
    CURRENT.with(|c| c.get())
}

/// The calling thread's current device, or `ContextNull`.
pub fn need_device(api: &str) -> EmuResult<i32> {
    need_init(api)?;
    match current_device() {
        Some(d) => Ok(d),
        None => bail!(
            ContextNull,
            "{api}: the calling thread has no current device (call aclrtSetDevice first)"
        ),
    }
}

fn default_streams() -> &'static Mutex<HashMap<i32, usize>> {
    static D: OnceLock<Mutex<HashMap<i32, usize>>> = OnceLock::new();
    D.get_or_init(Default::default)
}

/// The stream behind handle `h`, or the current device's default stream when `h` is null.
/// Work on a stream of another device than the thread's current one is refused.
pub fn stream_or_default(api: &str, h: usize) -> EmuResult<Arc<Stream>> {
    let dev = need_device(api)?;
    if h == 0 {
        let mut m = default_streams().lock().unwrap_or_else(|e| e.into_inner());
        let h = match m.get(&dev) {
            Some(&h) => h,
            None => {
                let h = Stream::create(dev)?;
                m.insert(dev, h);
                h
            }
        };
        return Stream::get(api, h);
    }
    let s = Stream::get(api, h)?;
    if s.device != dev {
        bail!(
            WrongDevice,
            "{api}: stream #{} belongs to device {} but the calling thread's current device is {dev}",
            s.id,
            s.device
        );
    }
    Ok(s)
}

/// `aclInit`.
#[no_mangle]
pub unsafe extern "C" fn aclInit(_config_path: *const c_char) -> aclError {
    ffi::acl("aclInit", || {
        if INITIALIZED.swap(true, Ordering::AcqRel) {
            bail!(RepeatInit, "aclInit: already initialised in this process");
        }
        Ok(())
    })
}

/// `aclFinalize`: the emulator keeps its state (devices, memory) so a process may go on; it
/// only checks that `aclInit` was called.
#[no_mangle]
pub unsafe extern "C" fn aclFinalize() -> aclError {
    ffi::acl("aclFinalize", || need_init("aclFinalize"))
}

/// `aclrtSetDevice`.
#[no_mangle]
pub unsafe extern "C" fn aclrtSetDevice(device_id: i32) -> aclError {
    ffi::acl("aclrtSetDevice", || {
        need_init("aclrtSetDevice")?;
        mem::check_device("aclrtSetDevice", device_id)?;
        CURRENT.with(|c| c.set(Some(device_id)));
        Ok(())
    })
}

/// `aclrtResetDevice`: drains the device's streams; the thread loses its current device if
/// it was this one. Memory stays (other threads of the process may still use the device).
#[no_mangle]
pub unsafe extern "C" fn aclrtResetDevice(device_id: i32) -> aclError {
    ffi::acl("aclrtResetDevice", || {
        need_init("aclrtResetDevice")?;
        mem::check_device("aclrtResetDevice", device_id)?;
        for (_, s) in stream::all_streams() {
            if s.device == device_id {
                let _ = s.synchronize("aclrtResetDevice", None);
            }
        }
        CURRENT.with(|c| {
            if c.get() == Some(device_id) {
                c.set(None)
            }
        });
        Ok(())
    })
}

/// `aclrtGetDevice`.
#[no_mangle]
pub unsafe extern "C" fn aclrtGetDevice(device_id: *mut i32) -> aclError {
    ffi::acl("aclrtGetDevice", || {
        if device_id.is_null() {
            bail!(NullPtr, "aclrtGetDevice: deviceId is null");
        }
        let d = need_device("aclrtGetDevice")?;
        *device_id = d;
        Ok(())
    })
}

/// `aclrtGetDeviceCount`.
#[no_mangle]
pub unsafe extern "C" fn aclrtGetDeviceCount(count: *mut u32) -> aclError {
    ffi::acl("aclrtGetDeviceCount", || {
        if count.is_null() {
            bail!(NullPtr, "aclrtGetDeviceCount: count is null");
        }
        *count = mem::device_count() as u32;
        Ok(())
    })
}

/// `aclrtCreateStream`.
#[no_mangle]
pub unsafe extern "C" fn aclrtCreateStream(stream: *mut aclrtStream) -> aclError {
    ffi::acl("aclrtCreateStream", || {
        if stream.is_null() {
            bail!(NullPtr, "aclrtCreateStream: stream is null");
        }
        let dev = need_device("aclrtCreateStream")?;
        *stream = Stream::create(dev)? as aclrtStream;
        Ok(())
    })
}

/// `aclrtDestroyStream`: drains the stream first.
#[no_mangle]
pub unsafe extern "C" fn aclrtDestroyStream(stream: aclrtStream) -> aclError {
    ffi::acl("aclrtDestroyStream", || {
        need_init("aclrtDestroyStream")?;
        if stream.is_null() {
            bail!(NullPtr, "aclrtDestroyStream: stream is null");
        }
        Stream::destroy("aclrtDestroyStream", stream as usize)
    })
}

/// `aclrtSynchronizeStream`.
#[no_mangle]
pub unsafe extern "C" fn aclrtSynchronizeStream(stream: aclrtStream) -> aclError {
    let api = "aclrtSynchronizeStream";
    ffi::acl(api, || {
        stream_or_default(api, stream as usize)?.synchronize(api, None)
    })
}

/// `aclrtSynchronizeStreamWithTimeout` (`timeout` in ms, -1: forever).
#[no_mangle]
pub unsafe extern "C" fn aclrtSynchronizeStreamWithTimeout(
    stream: aclrtStream,
    timeout: i32,
) -> aclError {
    let api = "aclrtSynchronizeStreamWithTimeout";
    ffi::acl(api, || {
        let t = match timeout {
            -1 => None,
            t if t < -1 => bail!(InvalidParam, "{api}: timeout {t} ms"),
            t => Some(Duration::from_millis(t as u64)),
        };
        stream_or_default(api, stream as usize)?.synchronize(api, t)
    })
}

/// `aclrtCreateEvent`.
#[no_mangle]
pub unsafe extern "C" fn aclrtCreateEvent(event: *mut aclrtEvent) -> aclError {
    ffi::acl("aclrtCreateEvent", || {
        if event.is_null() {
            bail!(NullPtr, "aclrtCreateEvent: event is null");
        }
        let dev = need_device("aclrtCreateEvent")?;
        *event = Event::create(dev) as aclrtEvent;
        Ok(())
    })
}

/// `aclrtDestroyEvent`.
#[no_mangle]
pub unsafe extern "C" fn aclrtDestroyEvent(event: aclrtEvent) -> aclError {
    ffi::acl("aclrtDestroyEvent", || {
        need_init("aclrtDestroyEvent")?;
        if event.is_null() {
            bail!(NullPtr, "aclrtDestroyEvent: event is null");
        }
        Event::destroy("aclrtDestroyEvent", event as usize)
    })
}

/// `aclrtRecordEvent`.
#[no_mangle]
pub unsafe extern "C" fn aclrtRecordEvent(event: aclrtEvent, stream: aclrtStream) -> aclError {
    let api = "aclrtRecordEvent";
    ffi::acl(api, || {
        let s = stream_or_default(api, stream as usize)?;
        Event::get(api, event as usize)?.record(api, &s)
    })
}

/// `aclrtStreamWaitEvent`.
#[no_mangle]
pub unsafe extern "C" fn aclrtStreamWaitEvent(stream: aclrtStream, event: aclrtEvent) -> aclError {
    let api = "aclrtStreamWaitEvent";
    ffi::acl(api, || {
        let s = stream_or_default(api, stream as usize)?;
        Event::get(api, event as usize)?.wait_on(api, &s)
    })
}

/// `aclrtSynchronizeEvent`: also returns the pending error of the stream the event was
/// recorded on.
#[no_mangle]
pub unsafe extern "C" fn aclrtSynchronizeEvent(event: aclrtEvent) -> aclError {
    let api = "aclrtSynchronizeEvent";
    let r = ffi::acl(api, || {
        need_init(api)?;
        Event::get(api, event as usize)?.synchronize(api, None)
    });
    if r == sys::ACL_ERROR_RT_STREAM_SYNC_TIMEOUT {
        sys::ACL_ERROR_RT_EVENT_SYNC_TIMEOUT
    } else {
        r
    }
}

/// `aclrtMalloc`: on the current device; the address is not host-dereferenceable.
#[no_mangle]
pub unsafe extern "C" fn aclrtMalloc(
    dev_ptr: *mut *mut c_void,
    size: usize,
    policy: sys::aclrtMemMallocPolicy,
) -> aclError {
    let api = "aclrtMalloc";
    ffi::acl(api, || {
        if dev_ptr.is_null() {
            bail!(NullPtr, "{api}: devPtr is null");
        }
        if !(0..=2).contains(&policy) {
            bail!(InvalidParam, "{api}: aclrtMemMallocPolicy {policy}");
        }
        let dev = need_device(api)?;
        let used = engine().used(dev);
        if used + size as u64 > HBM_BYTES {
            bail!(
                BadAlloc,
                "{api}: {size} bytes requested on device {dev} with {used} of {HBM_BYTES} in use"
            );
        }
        *dev_ptr = engine().alloc(api, dev, size as u64)? as *mut c_void;
        Ok(())
    })
}

/// `aclrtFree`: the address must be the start of a live allocation. Work still queued that
/// uses it keeps its backing alive (the card would fault or read garbage; the emulator's
/// ordering checks flag any later use).
#[no_mangle]
pub unsafe extern "C" fn aclrtFree(dev_ptr: *mut c_void) -> aclError {
    let api = "aclrtFree";
    ffi::acl(api, || {
        need_init(api)?;
        if dev_ptr.is_null() {
            bail!(NullPtr, "{api}: devPtr is null");
        }
        engine().free(api, dev_ptr as u64)
    })
}

/// Where a copy's two ends are.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum End {
    Host,
    Device,
}

fn ends(api: &str, kind: sys::aclrtMemcpyKind, dst: u64, src: u64) -> EmuResult<(End, End)> {
    let infer = |a: u64| {
        if mem::device_of_addr(a).is_some() {
            End::Device
        } else {
            End::Host
        }
    };
    let (d, s) = match kind {
        sys::ACL_MEMCPY_HOST_TO_HOST => (End::Host, End::Host),
        sys::ACL_MEMCPY_HOST_TO_DEVICE => (End::Device, End::Host),
        sys::ACL_MEMCPY_DEVICE_TO_HOST => (End::Host, End::Device),
        sys::ACL_MEMCPY_DEVICE_TO_DEVICE => (End::Device, End::Device),
        sys::ACL_MEMCPY_DEFAULT => (infer(dst), infer(src)),
        k => bail!(InvalidParam, "{api}: aclrtMemcpyKind {k}"),
    };
    for (end, addr, role) in [(d, dst, "dst"), (s, src, "src")] {
        if end == End::Host && mem::device_of_addr(addr).is_some() {
            bail!(
                InvalidParam,
                "{api}: {role} {addr:#x} is a device address but the copy kind {kind} says host"
            );
        }
    }
    Ok((d, s))
}

/// Checks a copy's arguments; returns the two ends.
fn copy_args(
    api: &str,
    dst: u64,
    dest_max: usize,
    src: u64,
    count: usize,
    kind: sys::aclrtMemcpyKind,
) -> EmuResult<(End, End)> {
    if dst == 0 || src == 0 {
        bail!(NullPtr, "{api}: dst {dst:#x} / src {src:#x} is null");
    }
    if count > dest_max {
        bail!(
            InvalidParam,
            "{api}: count {count} is larger than destMax {dest_max}"
        );
    }
    ends(api, kind, dst, src)
}

/// `aclrtMemcpy`: synchronous; not ordered with any stream, so it is refused when it reads
/// (or writes) device memory that queued work writes (or reads) and the host has not
/// synchronised with that work.
#[no_mangle]
pub unsafe extern "C" fn aclrtMemcpy(
    dst: *mut c_void,
    dest_max: usize,
    src: *const c_void,
    count: usize,
    kind: sys::aclrtMemcpyKind,
) -> aclError {
    let api = "aclrtMemcpy";
    ffi::acl(api, || {
        need_init(api)?;
        let (dst, src) = (dst as u64, src as u64);
        let (de, se) = copy_args(api, dst, dest_max, src, count, kind)?;
        if count == 0 {
            return Ok(());
        }
        let dev = current_device();
        let mut reqs = Vec::new();
        if se == End::Device {
            reqs.push(AccessReq::read(src, count as u64, "src"));
        }
        if de == End::Device {
            reqs.push(AccessReq::write(dst, count as u64, "dst"));
        }
        let res = engine().access(api, "aclrtMemcpy", &Accessor::Host, dev, &reqs)?;
        let mut it = res.into_iter();
        let bytes = match se {
            End::Device => mem::read_bytes(&region(it.next(), api, "src")?),
            End::Host => std::slice::from_raw_parts(src as *const u8, count).to_vec(),
        };
        match de {
            End::Device => mem::write_bytes(&region(it.next(), api, "dst")?, &bytes),
            End::Host => std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst as *mut u8, count),
        }
        Ok(())
    })
}

/// The resolved region of a copy's device side (`which`: src or dst), as the checks made it.
fn region(r: Option<mem::Resolved>, api: &str, which: &str) -> EmuResult<mem::Resolved> {
    r.ok_or_else(|| crate::emu_err!(Internal, "{api}: the {which} region was not resolved"))
}

/// A host pointer that queued work may use (the caller keeps it valid until the stream is
/// synchronised, as ACL requires).
#[derive(Clone, Copy)]
struct HostPtr(u64);
// SAFETY: only an address; the caller guarantees validity until synchronisation.
unsafe impl Send for HostPtr {}

/// `aclrtMemcpyAsync`: ordered on `stream`; host memory is read / written when the stream
/// reaches the copy.
#[no_mangle]
pub unsafe extern "C" fn aclrtMemcpyAsync(
    dst: *mut c_void,
    dest_max: usize,
    src: *const c_void,
    count: usize,
    kind: sys::aclrtMemcpyKind,
    stream: aclrtStream,
) -> aclError {
    let api = "aclrtMemcpyAsync";
    ffi::acl(api, || {
        let s = stream_or_default(api, stream as usize)?;
        let (dst, src) = (dst as u64, src as u64);
        let (de, se) = copy_args(api, dst, dest_max, src, count, kind)?;
        let mut reqs = Vec::new();
        if se == End::Device {
            reqs.push(AccessReq::read(src, count as u64, "src"));
        }
        if de == End::Device {
            reqs.push(AccessReq::write(dst, count as u64, "dst"));
        }
        let (hs, hd) = (HostPtr(src), HostPtr(dst));
        stream::submit(api, "aclrtMemcpyAsync", &s, &reqs, move |res| {
            Box::new(move || {
                let hs = hs;
                let hd = hd;
                let mut it = res.into_iter();
                let bytes = match se {
                    End::Device => mem::read_bytes(&region(it.next(), "aclrtMemcpyAsync", "src")?),
                    // SAFETY: the caller keeps the host source valid until synchronisation.
                    End::Host => unsafe {
                        std::slice::from_raw_parts(hs.0 as *const u8, count).to_vec()
                    },
                };
                match de {
                    End::Device => mem::write_bytes(&region(it.next(), api, "dst")?, &bytes),
                    // SAFETY: as above, for the host destination.
                    End::Host => unsafe {
                        std::ptr::copy_nonoverlapping(bytes.as_ptr(), hd.0 as *mut u8, count)
                    },
                }
                Ok(())
            })
        })
    })
}

/// `aclrtMemset`: synchronous, checked like `aclrtMemcpy`.
#[no_mangle]
pub unsafe extern "C" fn aclrtMemset(
    dev_ptr: *mut c_void,
    max_count: usize,
    value: i32,
    count: usize,
) -> aclError {
    let api = "aclrtMemset";
    ffi::acl(api, || {
        need_init(api)?;
        if count > max_count {
            bail!(InvalidParam, "{api}: count {count} > maxCount {max_count}");
        }
        if count == 0 {
            return Ok(());
        }
        let req = [AccessReq::write(dev_ptr as u64, count as u64, "devPtr")];
        let res = engine().access(api, "aclrtMemset", &Accessor::Host, current_device(), &req)?;
        mem::write_bytes(&res[0], &vec![value as u8; count]);
        Ok(())
    })
}

/// `aclrtMemsetAsync`.
#[no_mangle]
pub unsafe extern "C" fn aclrtMemsetAsync(
    dev_ptr: *mut c_void,
    max_count: usize,
    value: i32,
    count: usize,
    stream: aclrtStream,
) -> aclError {
    let api = "aclrtMemsetAsync";
    ffi::acl(api, || {
        let s = stream_or_default(api, stream as usize)?;
        if count > max_count {
            bail!(InvalidParam, "{api}: count {count} > maxCount {max_count}");
        }
        let req = [AccessReq::write(dev_ptr as u64, count as u64, "devPtr")];
        stream::submit(api, "aclrtMemsetAsync", &s, &req, move |res| {
            Box::new(move || {
                mem::write_bytes(&res[0], &vec![value as u8; count]);
                Ok(())
            })
        })
    })
}

/// `aclrtGetMemInfo`: [`HBM_BYTES`] total per device, minus what is allocated.
#[no_mangle]
pub unsafe extern "C" fn aclrtGetMemInfo(
    attr: sys::aclrtMemAttr,
    free: *mut usize,
    total: *mut usize,
) -> aclError {
    let api = "aclrtGetMemInfo";
    ffi::acl(api, || {
        if free.is_null() || total.is_null() {
            bail!(NullPtr, "{api}: free / total is null");
        }
        if attr != sys::ACL_DDR_MEM && attr != sys::ACL_HBM_MEM {
            bail!(InvalidParam, "{api}: aclrtMemAttr {attr}");
        }
        let dev = need_device(api)?;
        let used = engine().used(dev);
        *total = HBM_BYTES as usize;
        *free = HBM_BYTES.saturating_sub(used) as usize;
        Ok(())
    })
}

/// `aclrtGetSocName`: `Ascend910B1-emulated` (a real SoC name with a suffix, so that what a
/// user reads, `shardc device info` included, says it is the emulator), or null before
/// `aclInit`.
#[no_mangle]
pub unsafe extern "C" fn aclrtGetSocName() -> *const c_char {
    if INITIALIZED.load(Ordering::Acquire) {
        c"Ascend910B1-emulated".as_ptr()
    } else {
        std::ptr::null()
    }
}

/// `aclrtGetVersion`: 1.0.0.
#[no_mangle]
pub unsafe extern "C" fn aclrtGetVersion(
    major: *mut i32,
    minor: *mut i32,
    patch: *mut i32,
) -> aclError {
    ffi::acl("aclrtGetVersion", || {
        if major.is_null() || minor.is_null() || patch.is_null() {
            bail!(NullPtr, "aclrtGetVersion: a version pointer is null");
        }
        (*major, *minor, *patch) = (1, 0, 0);
        Ok(())
    })
}

/// `aclGetRecentErrMsg`.
#[no_mangle]
pub unsafe extern "C" fn aclGetRecentErrMsg() -> *const c_char {
    crate::diag::recent_ptr()
}

check_sigs!(
    aclInit,
    aclFinalize,
    aclrtSetDevice,
    aclrtResetDevice,
    aclrtGetDevice,
    aclrtGetDeviceCount,
    aclrtCreateStream,
    aclrtDestroyStream,
    aclrtSynchronizeStream,
    aclrtSynchronizeStreamWithTimeout,
    aclrtCreateEvent,
    aclrtDestroyEvent,
    aclrtRecordEvent,
    aclrtStreamWaitEvent,
    aclrtSynchronizeEvent,
    aclrtMalloc,
    aclrtFree,
    aclrtMemcpy,
    aclrtMemcpyAsync,
    aclrtMemset,
    aclrtMemsetAsync,
    aclrtGetMemInfo,
    aclrtGetSocName,
    aclrtGetVersion,
    aclGetRecentErrMsg,
);
