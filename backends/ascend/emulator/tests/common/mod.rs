//! Helpers shared by the emulator's tests: they drive the exported `extern "C"` functions
//! exactly as the backend does through the loaded library.
#![allow(dead_code)]

use shardc_ascend_emulator::acl::*;
use shardc_ascend_emulator::nnopbase::*;
use shardc_ascend_sys as sys;
use std::ffi::c_void;
use std::ptr::null_mut;

/// aclInit (a repeat is fine) and aclrtSetDevice(dev) on this thread.
pub fn setup(dev: i32) {
    unsafe {
        let r = aclInit(std::ptr::null());
        assert!(
            r == 0 || r == sys::ACL_ERROR_REPEAT_INITIALIZE,
            "aclInit {r}"
        );
        assert_eq!(aclrtSetDevice(dev), 0);
    }
}

/// Device memory of `bytes` on the current device.
pub fn malloc(bytes: usize) -> *mut c_void {
    let mut p = null_mut();
    assert_eq!(unsafe { aclrtMalloc(&mut p, bytes, 0) }, 0);
    p
}

/// Copies host bytes to the device (synchronous).
pub fn h2d(dst: *mut c_void, src: &[u8]) {
    let r = unsafe {
        aclrtMemcpy(
            dst,
            src.len(),
            src.as_ptr() as *const c_void,
            src.len(),
            sys::ACL_MEMCPY_HOST_TO_DEVICE,
        )
    };
    assert_eq!(r, 0);
}

/// Copies device bytes to the host (synchronous).
pub fn d2h(src: *const c_void, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    let r = unsafe {
        aclrtMemcpy(
            v.as_mut_ptr() as *mut c_void,
            n,
            src,
            n,
            sys::ACL_MEMCPY_DEVICE_TO_HOST,
        )
    };
    assert_eq!(r, 0, "aclrtMemcpy D2H");
    v
}

/// f32 values to bytes.
pub fn f32b(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Bytes to f32 values.
pub fn bf32(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// A device buffer with a tensor descriptor over it.
pub struct Dev {
    pub ptr: *mut c_void,
    pub t: *mut sys::aclTensor,
    pub bytes: usize,
    pub dtype: sys::aclDataType,
    pub dims: Vec<i64>,
}

// SAFETY: handles and device addresses are plain values; the emulator may be called from
// any thread.
unsafe impl Send for Dev {}

fn esize(dt: sys::aclDataType) -> usize {
    match dt {
        sys::ACL_FLOAT | sys::ACL_INT32 => 4,
        sys::ACL_INT64 | sys::ACL_DOUBLE => 8,
        sys::ACL_FLOAT16 | sys::ACL_BF16 => 2,
        _ => 1,
    }
}

/// Contiguous strides of `dims`.
pub fn strides(dims: &[i64]) -> Vec<i64> {
    let mut s = vec![1i64; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * dims[i + 1];
    }
    s
}

/// A descriptor over `ptr` with explicit view and a 1-d storage of `storage` elements.
pub fn tensor(
    ptr: *mut c_void,
    dims: &[i64],
    st: &[i64],
    offset: i64,
    dt: sys::aclDataType,
    storage: i64,
) -> *mut sys::aclTensor {
    let t = unsafe {
        aclCreateTensor(
            dims.as_ptr(),
            dims.len() as u64,
            dt,
            st.as_ptr(),
            offset,
            sys::ACL_FORMAT_ND,
            [storage].as_ptr(),
            1,
            ptr,
        )
    };
    assert!(!t.is_null(), "aclCreateTensor {dims:?} {st:?}");
    t
}

/// A device tensor holding raw bytes of dtype `dt` with shape `dims`.
pub fn dev_raw(bytes: &[u8], dims: &[i64], dt: sys::aclDataType) -> Dev {
    let n: i64 = dims.iter().product();
    let nb = (n as usize * esize(dt)).max(1);
    let ptr = malloc(nb);
    if !bytes.is_empty() {
        h2d(ptr, bytes);
    }
    let t = tensor(ptr, dims, &strides(dims), 0, dt, n.max(1));
    Dev {
        ptr,
        t,
        bytes: nb,
        dtype: dt,
        dims: dims.to_vec(),
    }
}

/// An f32 device tensor.
pub fn dev(vals: &[f32], dims: &[i64]) -> Dev {
    assert_eq!(vals.len() as i64, dims.iter().product::<i64>());
    dev_raw(&f32b(vals), dims, sys::ACL_FLOAT)
}

/// A zeroed f32 device tensor.
pub fn zeros(dims: &[i64]) -> Dev {
    let n: i64 = dims.iter().product();
    dev(&vec![0.0; n as usize], dims)
}

/// An int64 device tensor.
pub fn dev_i64(vals: &[i64], dims: &[i64]) -> Dev {
    dev_raw(
        &vals
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect::<Vec<u8>>(),
        dims,
        sys::ACL_INT64,
    )
}

/// An int32 device tensor.
pub fn dev_i32(vals: &[i32], dims: &[i64]) -> Dev {
    dev_raw(
        &vals
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect::<Vec<u8>>(),
        dims,
        sys::ACL_INT32,
    )
}

/// A zeroed device tensor of dtype `dt`.
pub fn zeros_of(dims: &[i64], dt: sys::aclDataType) -> Dev {
    let n: i64 = dims.iter().product();
    dev_raw(&vec![0u8; n as usize * esize(dt)], dims, dt)
}

impl Dev {
    /// Reads back as f32 (after synchronising the default stream).
    pub fn f32(&self) -> Vec<f32> {
        sync();
        bf32(&d2h(self.ptr, self.bytes))
    }
    /// Reads back as i64.
    pub fn i64(&self) -> Vec<i64> {
        sync();
        d2h(self.ptr, self.bytes)
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }
    /// Reads back as i32.
    pub fn i32(&self) -> Vec<i32> {
        sync();
        d2h(self.ptr, self.bytes)
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }
    /// Reads back raw bytes.
    pub fn raw(&self) -> Vec<u8> {
        sync();
        d2h(self.ptr, self.bytes)
    }
}

/// Synchronises the current device's default stream and asserts success.
pub fn sync() {
    assert_eq!(
        unsafe { aclrtSynchronizeStream(null_mut()) },
        0,
        "aclrtSynchronizeStream"
    );
}

/// An f32 scalar.
pub fn scalar(v: f32) -> *mut sys::aclScalar {
    let mut x = v;
    unsafe { aclCreateScalar(&mut x as *mut f32 as *mut c_void, sys::ACL_FLOAT) }
}

/// An int array.
pub fn ints(v: &[i64]) -> *mut sys::aclIntArray {
    unsafe { aclCreateIntArray(v.as_ptr(), v.len() as u64) }
}

/// A bool array.
pub fn bools(v: &[bool]) -> *mut sys::aclBoolArray {
    unsafe { aclCreateBoolArray(v.as_ptr(), v.len() as u64) }
}

/// Runs an aclnn op on the default stream: `$ws(args.., &mut size, &mut exec)` then
/// `$op(workspace, size, exec, null)`; asserts both succeed and returns the workspace size.
#[macro_export]
macro_rules! run_op {
    ($op:ident, $ws:ident ( $($arg:expr),* $(,)? )) => {{
        let mut size = 0u64;
        let mut exec = std::ptr::null_mut();
        let r = unsafe { shardc_ascend_emulator::aclnn::$ws($($arg,)* &mut size, &mut exec) };
        assert_eq!(r, 0, "{}", stringify!($ws));
        let w = if size > 0 { common::malloc(size as usize) } else { std::ptr::null_mut() };
        let r = unsafe { shardc_ascend_emulator::aclnn::$op(w, size, exec, std::ptr::null_mut()) };
        assert_eq!(r, 0, "{}", stringify!($op));
        common::sync();
        size
    }};
}

/// The status of `$ws(args.., &mut size, &mut exec)` alone.
#[macro_export]
macro_rules! prep_status {
    ($ws:ident ( $($arg:expr),* $(,)? )) => {{
        let mut size = 0u64;
        let mut exec = std::ptr::null_mut();
        unsafe { shardc_ascend_emulator::aclnn::$ws($($arg,)* &mut size, &mut exec) }
    }};
}

/// Asserts two f32 slices are equal within `tol` (absolute + relative).
pub fn close(got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "length: got {got:?} want {want:?}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "element {i}: got {g} want {w}\n got {got:?}\nwant {want:?}"
        );
    }
}

/// Runs this test binary again as a child running only `test` with `envs` set (for tests
/// that need environment variables such as short HCCL timeouts, or a separate process).
pub fn child(test: &str, envs: &[(&str, String)]) -> std::process::Child {
    let exe = std::env::current_exe().unwrap();
    let mut c = std::process::Command::new(exe);
    c.args([test, "--exact", "--nocapture", "--test-threads=1"]);
    for (k, v) in envs {
        c.env(k, v);
    }
    c.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    c.spawn().unwrap()
}
