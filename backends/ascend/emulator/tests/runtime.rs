//! The AscendCL runtime of the emulator: init, devices, memory misuse, streams, events,
//! timeouts and asynchronous errors, each through the exported C functions.
#![allow(clippy::macro_metavars_in_unsafe)]

mod common;

use common::*;
use shardc_ascend_emulator::acl::*;
use shardc_ascend_emulator::aclnn::*;
use shardc_ascend_emulator::ffi::{
    ACLNN_ERR_PARAM_INVALID, ACLNN_ERR_RUNTIME_ERROR, ACL_ERROR_RT_CONTEXT_NULL,
};
use shardc_ascend_emulator::nnopbase::*;
use shardc_ascend_sys as sys;
use std::ffi::{c_void, CStr};
use std::ptr::null_mut;

fn recent() -> String {
    let p = unsafe { aclGetRecentErrMsg() };
    assert!(!p.is_null(), "no recent error message");
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

fn stream() -> sys::aclrtStream {
    let mut s = null_mut();
    assert_eq!(unsafe { aclrtCreateStream(&mut s) }, 0);
    s
}

#[test]
fn second_init_is_repeat_initialize_and_devices_are_counted() {
    unsafe {
        aclInit(std::ptr::null());
        assert_eq!(aclInit(std::ptr::null()), sys::ACL_ERROR_REPEAT_INITIALIZE);
        let mut n = 0u32;
        assert_eq!(aclrtGetDeviceCount(&mut n), 0);
        let want = std::env::var("SHARDC_ASCEND_EMU_DEVICES")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(8);
        assert_eq!(n, want);
        assert_eq!(aclrtSetDevice(n as i32), sys::ACL_ERROR_INVALID_DEVICE);
        assert_eq!(aclrtSetDevice(1), 0);
        let mut d = -1;
        assert_eq!(aclrtGetDevice(&mut d), 0);
        assert_eq!(d, 1);
        assert!(!aclrtGetSocName().is_null());
    }
}

#[test]
fn device_count_follows_the_environment() {
    if std::env::var("EMU_CHILD").is_ok() {
        return;
    }
    let c = child(
        "second_init_is_repeat_initialize_and_devices_are_counted",
        &[
            ("SHARDC_ASCEND_EMU_DEVICES", "3".into()),
            ("EMU_CHILD", "1".into()),
        ],
    );
    let out = c.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_thread_without_a_device_has_no_context() {
    setup(0);
    std::thread::spawn(|| unsafe {
        let mut p = null_mut();
        assert_eq!(aclrtMalloc(&mut p, 64, 0), ACL_ERROR_RT_CONTEXT_NULL);
        assert!(recent().contains("aclrtSetDevice"));
        // The current device is per thread.
        assert_eq!(aclrtSetDevice(2), 0);
        assert_eq!(aclrtMalloc(&mut p, 64, 0), 0);
    })
    .join()
    .unwrap();
}

#[test]
fn device_memory_is_not_host_memory_and_round_trips() {
    setup(0);
    let p = malloc(1000);
    assert!(
        p as u64 >= 0x1_0000_0000_0000,
        "device addresses are in the device range: {p:?}"
    );
    h2d(p, &[7u8; 1000]);
    assert_eq!(d2h(p, 1000), vec![7u8; 1000]);
    unsafe {
        assert_eq!(aclrtMemset(p, 1000, 3, 10), 0);
    }
    let b = d2h(p, 12);
    assert_eq!(&b[..], &[3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 7, 7]);
    let mut free = 0usize;
    let mut total = 0usize;
    assert_eq!(
        unsafe { aclrtGetMemInfo(sys::ACL_HBM_MEM, &mut free, &mut total) },
        0
    );
    assert!(free < total);
}

#[test]
fn use_after_free_is_refused() {
    setup(0);
    let p = malloc(256);
    assert_eq!(unsafe { aclrtFree(p) }, 0);
    let src = [1u8; 16];
    let r = unsafe {
        aclrtMemcpy(
            p,
            16,
            src.as_ptr() as *const c_void,
            16,
            sys::ACL_MEMCPY_HOST_TO_DEVICE,
        )
    };
    assert_eq!(r, sys::ACL_ERROR_RT_PARAM_INVALID);
    let m = recent();
    assert!(
        m.contains("aclrtMemcpy") && m.contains("use after free"),
        "{m}"
    );
    assert_eq!(
        unsafe { aclrtFree(p) },
        sys::ACL_ERROR_RT_PARAM_INVALID,
        "double free"
    );
    assert!(recent().contains("already freed"));
}

#[test]
fn pointers_outside_allocations_are_refused() {
    setup(0);
    let p = malloc(100);
    // Past the end of the allocation.
    let src = [0u8; 200];
    let r = unsafe {
        aclrtMemcpy(
            p,
            200,
            src.as_ptr() as *const c_void,
            200,
            sys::ACL_MEMCPY_HOST_TO_DEVICE,
        )
    };
    assert_eq!(r, sys::ACL_ERROR_RT_PARAM_INVALID);
    assert!(recent().contains("past the end"), "{}", recent());
    // In the device range but in no allocation.
    let stray = (p as u64 + (1 << 30)) as *mut c_void;
    let r = unsafe {
        aclrtMemcpy(
            stray,
            4,
            src.as_ptr() as *const c_void,
            4,
            sys::ACL_MEMCPY_HOST_TO_DEVICE,
        )
    };
    assert_eq!(r, sys::ACL_ERROR_RT_PARAM_INVALID);
    assert!(recent().contains("in no allocation"));
    // A host pointer where a device pointer is due.
    let mut host = [0u8; 4];
    let r = unsafe {
        aclrtMemcpy(
            host.as_mut_ptr() as *mut c_void,
            4,
            src.as_ptr() as *const c_void,
            4,
            sys::ACL_MEMCPY_DEVICE_TO_HOST,
        )
    };
    assert_eq!(r, sys::ACL_ERROR_RT_PARAM_INVALID);
    assert!(recent().contains("not a device address"));
    // count > destMax, and freeing the middle of an allocation.
    let r = unsafe {
        aclrtMemcpy(
            p,
            4,
            src.as_ptr() as *const c_void,
            8,
            sys::ACL_MEMCPY_HOST_TO_DEVICE,
        )
    };
    assert_eq!(r, sys::ACL_ERROR_INVALID_PARAM);
    assert_eq!(
        unsafe { aclrtFree((p as u64 + 8) as *mut c_void) },
        sys::ACL_ERROR_INVALID_PARAM
    );
}

#[test]
fn another_devices_buffer_is_refused() {
    setup(3);
    let a = dev(&[1.0, 2.0], &[2]);
    let out = zeros(&[2]);
    std::thread::spawn(move || {
        let (a, out) = (a, out);
        setup(4);
        let s = stream();
        let mut h = [0u8; 8];
        let r = unsafe {
            aclrtMemcpyAsync(
                h.as_mut_ptr() as *mut c_void,
                8,
                a.ptr,
                8,
                sys::ACL_MEMCPY_DEVICE_TO_HOST,
                s,
            )
        };
        assert_eq!(r, sys::ACL_ERROR_RT_PARAM_INVALID);
        assert!(
            recent().contains("belongs to device 3 but is used from device 4"),
            "{}",
            recent()
        );
        let mut size = 0;
        let mut ex = null_mut();
        assert_eq!(
            unsafe { aclnnReluGetWorkspaceSize(a.t, out.t, &mut size, &mut ex) },
            0
        );
        assert_eq!(
            unsafe { aclnnRelu(null_mut(), 0, ex, s) },
            ACLNN_ERR_RUNTIME_ERROR
        );
        assert!(recent().contains("aclnnRelu"));
    })
    .join()
    .unwrap();
}

#[test]
fn an_unsynchronised_read_of_an_async_copy_is_refused() {
    setup(0);
    let s = stream();
    let p = malloc(64);
    let src = vec![9u8; 64];
    assert_eq!(
        unsafe {
            aclrtMemcpyAsync(
                p,
                64,
                src.as_ptr() as *const c_void,
                64,
                sys::ACL_MEMCPY_HOST_TO_DEVICE,
                s,
            )
        },
        0
    );
    let mut back = vec![0u8; 64];
    let r = unsafe {
        aclrtMemcpy(
            back.as_mut_ptr() as *mut c_void,
            64,
            p,
            64,
            sys::ACL_MEMCPY_DEVICE_TO_HOST,
        )
    };
    assert_eq!(r, sys::ACL_ERROR_RT_PARAM_INVALID);
    let m = recent();
    assert!(
        m.contains("not ordered before it") && m.contains("aclrtMemcpyAsync"),
        "{m}"
    );
    // Writing it from the host is a race too.
    let r = unsafe { aclrtMemset(p, 64, 0, 64) };
    assert_eq!(r, sys::ACL_ERROR_RT_PARAM_INVALID);
    // After synchronising the stream the read is fine and sees the copy.
    assert_eq!(unsafe { aclrtSynchronizeStream(s) }, 0);
    assert_eq!(d2h(p, 64), src);
    // An event synchronisation orders it as well.
    let mut e = null_mut();
    assert_eq!(unsafe { aclrtCreateEvent(&mut e) }, 0);
    let src2 = vec![5u8; 64];
    assert_eq!(
        unsafe {
            aclrtMemcpyAsync(
                p,
                64,
                src2.as_ptr() as *const c_void,
                64,
                sys::ACL_MEMCPY_HOST_TO_DEVICE,
                s,
            )
        },
        0
    );
    assert_eq!(unsafe { aclrtRecordEvent(e, s) }, 0);
    assert_eq!(unsafe { aclrtSynchronizeEvent(e) }, 0);
    assert_eq!(d2h(p, 64), src2);
    assert_eq!(unsafe { aclrtDestroyEvent(e) }, 0);
    assert_eq!(unsafe { aclrtDestroyStream(s) }, 0);
}

/// A matmul big enough to keep a stream busy for a while.
fn busy(n: i64) -> (Dev, Dev, Dev) {
    let v: Vec<f32> = (0..n * n).map(|i| (i % 7) as f32).collect();
    (dev(&v, &[n, n]), dev(&v, &[n, n]), zeros(&[n, n]))
}

fn launch_matmul(a: &Dev, b: &Dev, c: &Dev, s: sys::aclrtStream) {
    let mut size = 0;
    let mut ex = null_mut();
    assert_eq!(
        unsafe { aclnnMatmulGetWorkspaceSize(a.t, b.t, c.t, 0, &mut size, &mut ex) },
        0
    );
    let w = malloc(size as usize);
    assert_eq!(unsafe { aclnnMatmul(w, size, ex, s) }, 0);
}

#[test]
fn events_order_two_streams() {
    setup(1);
    let (a, b, c) = busy(160);
    let (s1, s2) = (stream(), stream());
    launch_matmul(&a, &b, &c, s1);
    let copy = malloc(c.bytes);
    // Without an event, reading c on s2 races with the matmul on s1.
    let r = unsafe {
        aclrtMemcpyAsync(
            copy,
            c.bytes,
            c.ptr,
            c.bytes,
            sys::ACL_MEMCPY_DEVICE_TO_DEVICE,
            s2,
        )
    };
    assert_eq!(r, sys::ACL_ERROR_RT_PARAM_INVALID);
    assert!(recent().contains("stream #"));
    let mut e = null_mut();
    assert_eq!(unsafe { aclrtCreateEvent(&mut e) }, 0);
    assert_eq!(unsafe { aclrtRecordEvent(e, s1) }, 0);
    assert_eq!(unsafe { aclrtStreamWaitEvent(s2, e) }, 0);
    let r = unsafe {
        aclrtMemcpyAsync(
            copy,
            c.bytes,
            c.ptr,
            c.bytes,
            sys::ACL_MEMCPY_DEVICE_TO_DEVICE,
            s2,
        )
    };
    assert_eq!(r, 0);
    assert_eq!(unsafe { aclrtSynchronizeStream(s2) }, 0);
    // s2 waited for s1: the copy holds the matmul's result, and the host may read it.
    let got = bf32(&d2h(copy, c.bytes));
    let row0: f32 = (0..160)
        .map(|k| ((k % 7) as f32) * (((k * 160) % 7) as f32))
        .sum();
    assert_eq!(got[0], row0);
    assert!(got.iter().any(|&v| v != 0.0));
    // The host has not synchronised with s1 itself, but s2's wait on the event ordered s1's
    // matmul before s2, and the host synchronised with s2.
    assert_eq!(bf32(&d2h(c.ptr, c.bytes)), got);
    for s in [s1, s2] {
        assert_eq!(unsafe { aclrtDestroyStream(s) }, 0);
    }
}

#[test]
fn one_stream_runs_in_order() {
    setup(2);
    let s = stream();
    let p = malloc(4);
    let vals: Vec<[u8; 4]> = (0..50u32).map(|i| i.to_le_bytes()).collect();
    for v in &vals {
        assert_eq!(
            unsafe {
                aclrtMemcpyAsync(
                    p,
                    4,
                    v.as_ptr() as *const c_void,
                    4,
                    sys::ACL_MEMCPY_HOST_TO_DEVICE,
                    s,
                )
            },
            0
        );
    }
    let mut out = [0u8; 4];
    assert_eq!(
        unsafe {
            aclrtMemcpyAsync(
                out.as_mut_ptr() as *mut c_void,
                4,
                p,
                4,
                sys::ACL_MEMCPY_DEVICE_TO_HOST,
                s,
            )
        },
        0
    );
    assert_eq!(unsafe { aclrtSynchronizeStream(s) }, 0);
    assert_eq!(u32::from_le_bytes(out), 49);
}

#[test]
fn a_stream_that_has_not_drained_times_out() {
    setup(5);
    let (a, b, c) = busy(384);
    let s = stream();
    launch_matmul(&a, &b, &c, s);
    launch_matmul(&a, &b, &c, s);
    assert_eq!(
        unsafe { aclrtSynchronizeStreamWithTimeout(s, 1) },
        sys::ACL_ERROR_RT_STREAM_SYNC_TIMEOUT
    );
    assert!(recent().contains("did not drain"));
    assert_eq!(unsafe { aclrtSynchronizeStreamWithTimeout(s, -1) }, 0);
}

#[test]
fn an_error_of_queued_work_is_reported_by_the_next_synchronize() {
    setup(6);
    let x = dev(&[1.0, 2.0, 3.0], &[3]);
    let idx = dev_i64(&[0, 7], &[2]);
    let out = zeros(&[2]);
    let s = stream();
    let mut size = 0;
    let mut ex = null_mut();
    assert_eq!(
        unsafe { aclnnIndexSelectGetWorkspaceSize(x.t, 0, idx.t, out.t, &mut size, &mut ex) },
        0
    );
    // The index values live in device memory: only the "kernel" sees 7 is out of range.
    assert_eq!(unsafe { aclnnIndexSelect(null_mut(), 0, ex, s) }, 0);
    let r = unsafe { aclrtSynchronizeStream(s) };
    assert_eq!(r, sys::ACL_ERROR_INVALID_PARAM);
    let m = recent();
    assert!(
        m.contains("aclnnIndexSelect") && m.contains("index[1] = 7"),
        "{m}"
    );
    // Reported once.
    assert_eq!(unsafe { aclrtSynchronizeStream(s) }, 0);
}

#[test]
fn a_workspace_smaller_than_asked_is_refused() {
    setup(0);
    let a = dev(&[1.0, 2.0, 3.0, 4.0], &[2, 2]);
    let c = zeros(&[2, 2]);
    let mut size = 0;
    let mut ex = null_mut();
    assert_eq!(
        unsafe { aclnnMatmulGetWorkspaceSize(a.t, a.t, c.t, 0, &mut size, &mut ex) },
        0
    );
    assert!(size > 0, "matmul asks for a workspace");
    let w = malloc(size as usize);
    assert_eq!(
        unsafe { aclnnMatmul(w, size - 1, ex, null_mut()) },
        ACLNN_ERR_PARAM_INVALID
    );
    assert!(recent().contains("smaller than"));
    // A workspace pointer smaller than its declared size is an access past its end.
    assert_eq!(
        unsafe { aclnnMatmulGetWorkspaceSize(a.t, a.t, c.t, 0, &mut size, &mut ex) },
        0
    );
    let small = malloc(16);
    assert_eq!(
        unsafe { aclnnMatmul(small, size, ex, null_mut()) },
        ACLNN_ERR_RUNTIME_ERROR
    );
    assert!(recent().contains("past the end"));
    // Null workspace.
    assert_eq!(
        unsafe { aclnnMatmulGetWorkspaceSize(a.t, a.t, c.t, 0, &mut size, &mut ex) },
        0
    );
    assert_eq!(
        unsafe { aclnnMatmul(null_mut(), size, ex, null_mut()) },
        ACLNN_ERR_PARAM_INVALID
    );
}

#[test]
fn a_launched_or_foreign_executor_is_refused() {
    setup(0);
    let a = dev(&[1.0, -2.0], &[2]);
    let o = zeros(&[2]);
    let mut size = 0;
    let mut ex = null_mut();
    assert_eq!(
        unsafe { aclnnReluGetWorkspaceSize(a.t, o.t, &mut size, &mut ex) },
        0
    );
    // Another op's launch with this executor.
    assert_eq!(
        unsafe { aclnnNeg(null_mut(), 0, ex, null_mut()) },
        ACLNN_ERR_PARAM_INVALID
    );
    assert!(
        recent().contains("made by aclnnReluGetWorkspaceSize"),
        "{}",
        recent()
    );
    assert_eq!(unsafe { aclnnRelu(null_mut(), 0, ex, null_mut()) }, 0);
    // One-shot: a second launch is refused.
    assert_eq!(
        unsafe { aclnnRelu(null_mut(), 0, ex, null_mut()) },
        ACLNN_ERR_PARAM_INVALID
    );
    assert!(recent().contains("not live"));
    assert_eq!(o.f32(), vec![1.0, 0.0]);
}

#[test]
fn descriptors_are_validated() {
    setup(0);
    let p = malloc(64);
    unsafe {
        // A view reaching past its storage.
        let t = aclCreateTensor(
            [4i64, 4].as_ptr(),
            2,
            sys::ACL_FLOAT,
            [4i64, 1].as_ptr(),
            0,
            sys::ACL_FORMAT_ND,
            [15i64].as_ptr(),
            1,
            p,
        );
        assert!(t.is_null());
        assert!(recent().contains("storage"));
        // Null dims with a nonzero count; an unknown dtype.
        assert!(aclCreateTensor(
            std::ptr::null(),
            2,
            sys::ACL_FLOAT,
            [1i64, 1].as_ptr(),
            0,
            sys::ACL_FORMAT_ND,
            [4i64].as_ptr(),
            1,
            p
        )
        .is_null());
        assert!(aclCreateTensor(
            [2i64].as_ptr(),
            1,
            99,
            [1i64].as_ptr(),
            0,
            sys::ACL_FORMAT_ND,
            [4i64].as_ptr(),
            1,
            p
        )
        .is_null());
        // A 0-d tensor is fine; destroying twice is not.
        let t = aclCreateTensor(
            std::ptr::null(),
            0,
            sys::ACL_FLOAT,
            std::ptr::null(),
            0,
            sys::ACL_FORMAT_ND,
            [1i64].as_ptr(),
            1,
            p,
        );
        assert!(!t.is_null());
        assert_eq!(aclDestroyTensor(t), 0);
        assert_ne!(aclDestroyTensor(t), 0);
        // A destroyed tensor given to an op.
        let o = zeros(&[1]);
        let mut size = 0;
        let mut ex = null_mut();
        assert_eq!(
            aclnnReluGetWorkspaceSize(t, o.t, &mut size, &mut ex),
            ACLNN_ERR_PARAM_INVALID
        );
        assert!(recent().contains("not a live aclnn object"));
        // Shapes that do not match.
        let a = dev(&[1.0, 2.0, 3.0], &[3]);
        let b = dev(&[1.0, 2.0], &[2]);
        let out = zeros(&[3]);
        assert_eq!(
            aclnnMulGetWorkspaceSize(a.t, b.t, out.t, &mut size, &mut ex),
            ACLNN_ERR_PARAM_INVALID
        );
        let m = recent();
        assert!(
            m.contains("aclnnMul") && m.contains("[3]") && m.contains("[2]"),
            "{m}"
        );
    }
}

#[test]
fn destroyed_handles_are_invalid_resources() {
    setup(0);
    let s = stream();
    assert_eq!(unsafe { aclrtDestroyStream(s) }, 0);
    assert_eq!(
        unsafe { aclrtSynchronizeStream(s) },
        sys::ACL_ERROR_INVALID_RESOURCE_HANDLE
    );
    let mut e = null_mut();
    assert_eq!(unsafe { aclrtCreateEvent(&mut e) }, 0);
    assert_eq!(unsafe { aclrtDestroyEvent(e) }, 0);
    assert_eq!(
        unsafe { aclrtSynchronizeEvent(e) },
        sys::ACL_ERROR_INVALID_RESOURCE_HANDLE
    );
}

#[test]
fn a_strided_write_then_read_on_another_stream_needs_an_event() {
    // Two streams writing disjoint halves of one allocation do not conflict; reading the
    // whole from a third stream needs both ordered before it.
    setup(7);
    let p = malloc(16);
    let (s1, s2, s3) = (stream(), stream(), stream());
    let lo = [1u8; 8];
    let hi = [2u8; 8];
    unsafe {
        assert_eq!(
            aclrtMemcpyAsync(
                p,
                8,
                lo.as_ptr() as *const c_void,
                8,
                sys::ACL_MEMCPY_HOST_TO_DEVICE,
                s1
            ),
            0
        );
        let p8 = (p as u64 + 8) as *mut c_void;
        assert_eq!(
            aclrtMemcpyAsync(
                p8,
                8,
                hi.as_ptr() as *const c_void,
                8,
                sys::ACL_MEMCPY_HOST_TO_DEVICE,
                s2
            ),
            0
        );
        let q = malloc(16);
        let mut e1 = null_mut();
        aclrtCreateEvent(&mut e1);
        aclrtRecordEvent(e1, s1);
        aclrtStreamWaitEvent(s3, e1);
        // Only s1 is ordered: the upper half written by s2 is a race.
        assert_eq!(
            aclrtMemcpyAsync(q, 16, p, 16, sys::ACL_MEMCPY_DEVICE_TO_DEVICE, s3),
            sys::ACL_ERROR_RT_PARAM_INVALID
        );
        let mut e2 = null_mut();
        aclrtCreateEvent(&mut e2);
        aclrtRecordEvent(e2, s2);
        aclrtStreamWaitEvent(s3, e2);
        assert_eq!(
            aclrtMemcpyAsync(q, 16, p, 16, sys::ACL_MEMCPY_DEVICE_TO_DEVICE, s3),
            0
        );
        assert_eq!(aclrtSynchronizeStream(s3), 0);
        assert_eq!(d2h(q, 16), [lo, hi].concat());
    }
}

#[test]
fn device_memory_is_bounded_and_nonempty() {
    setup(0);
    let mut p = null_mut();
    assert_eq!(
        unsafe { aclrtMalloc(&mut p, 65 << 30, 0) },
        sys::ACL_ERROR_RT_MEMORY_ALLOCATION
    );
    assert_eq!(
        unsafe { aclrtMalloc(&mut p, 0, 0) },
        sys::ACL_ERROR_INVALID_PARAM
    );
    assert_eq!(
        unsafe { aclrtMalloc(&mut p, 16, 7) },
        sys::ACL_ERROR_INVALID_PARAM
    );
}
