//! aclnn's two-phase calls as the lowerings use them: tensor, scalar and array descriptors
//! that destroy themselves (nnopbase's `aclCreate*` / `aclDestroy*`), and [`Runner::launch`]:
//! `aclnnXxxGetWorkspaceSize`, the workspace from the executor's [`Arena`], then `aclnnXxx` on
//! the compute stream, the descriptors destroyed after the launch.

use crate::acl::{with_recent, Api, AscendDevice, DevPtr};
use crate::error::{AscendError, AscendResult};
use shardc_ascend_sys::{self as sys};
use shardc_ir::DType;
use std::ffi::c_void;
use std::sync::Mutex;

/// The launch phase of every aclnn operator (`aclnnXxx(workspace, workspaceSize, executor,
/// stream)`): one C signature for all of them.
pub type LaunchFn = unsafe extern "C" fn(
    workspace: *mut c_void,
    workspace_size: u64,
    executor: *mut sys::aclOpExecutor,
    stream: sys::aclrtStream,
) -> sys::aclnnStatus;

/// The `aclDataType` of `d`.
pub fn acl_dtype(d: DType) -> sys::aclDataType {
    match d {
        DType::Float32 => sys::ACL_FLOAT,
        DType::Float64 => sys::ACL_DOUBLE,
        DType::Float16 => sys::ACL_FLOAT16,
        DType::BFloat16 => sys::ACL_BF16,
        DType::Int32 => sys::ACL_INT32,
        DType::Int64 => sys::ACL_INT64,
        DType::Bool => sys::ACL_BOOL,
    }
}

/// Row-major strides (in elements) of `shape`.
pub fn contiguous_strides(shape: &[usize]) -> Vec<i64> {
    let mut st = vec![0i64; shape.len()];
    let mut acc = 1i64;
    for i in (0..shape.len()).rev() {
        st[i] = acc;
        acc *= shape[i].max(1) as i64;
    }
    st
}

/// A tensor descriptor (`aclCreateTensor`), destroyed on drop.
pub struct TensorDesc {
    api: &'static Api,
    raw: *mut sys::aclTensor,
}

impl TensorDesc {
    /// The descriptor, for an aclnn call.
    pub fn ptr(&self) -> *mut sys::aclTensor {
        self.raw
    }
}

impl Drop for TensorDesc {
    fn drop(&mut self) {
        // SAFETY: made by aclCreateTensor, destroyed once.
        unsafe { (self.api.aclDestroyTensor)(self.raw) };
    }
}

/// A view of device memory: `shape`, element `strides` and `offset` over the buffer at
/// `data`, of `dtype`, as aclCreateTensor takes it (storage: the flat extent the view spans).
pub fn tensor_view(
    api: &'static Api,
    data: DevPtr,
    dtype: DType,
    shape: &[usize],
    strides: &[i64],
    offset: i64,
    format: sys::aclFormat,
) -> AscendResult<TensorDesc> {
    let dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
    let mut extent = offset + 1;
    for (&d, &s) in shape.iter().zip(strides) {
        if d == 0 {
            extent = 0;
            break;
        }
        extent += (d as i64 - 1) * s.max(0);
    }
    let storage = [extent.max(0)];
    // SAFETY: the arrays outlive the call (nnopbase copies them).
    let raw = unsafe {
        (api.aclCreateTensor)(
            dims.as_ptr(),
            dims.len() as u64,
            acl_dtype(dtype),
            strides.as_ptr(),
            offset,
            format,
            storage.as_ptr(),
            1,
            data as *mut c_void,
        )
    };
    if raw.is_null() {
        return Err(AscendError::Aclnn {
            call: "aclCreateTensor",
            code: -1,
            message: with_recent(
                api,
                &format!("a {dtype} view {shape:?} strides {strides:?} offset {offset}"),
            ),
        });
    }
    Ok(TensorDesc { api, raw })
}

/// A contiguous tensor of `shape` at `data` (format ND).
pub fn tensor(
    api: &'static Api,
    data: DevPtr,
    dtype: DType,
    shape: &[usize],
) -> AscendResult<TensorDesc> {
    tensor_view(
        api,
        data,
        dtype,
        shape,
        &contiguous_strides(shape),
        0,
        sys::ACL_FORMAT_ND,
    )
}

/// A scalar descriptor (`aclCreateScalar`), destroyed on drop.
pub struct ScalarDesc {
    api: &'static Api,
    raw: *mut sys::aclScalar,
}

impl ScalarDesc {
    /// The descriptor.
    pub fn ptr(&self) -> *mut sys::aclScalar {
        self.raw
    }
}

impl Drop for ScalarDesc {
    fn drop(&mut self) {
        // SAFETY: made by aclCreateScalar, destroyed once.
        unsafe { (self.api.aclDestroyScalar)(self.raw) };
    }
}

/// A host scalar `v` of `dtype` (floats and integers; a bool is 0/1).
pub fn scalar(api: &'static Api, v: f64, dtype: DType) -> AscendResult<ScalarDesc> {
    let mut bytes = [0u8; 8];
    match dtype {
        DType::Float64 => bytes.copy_from_slice(&v.to_ne_bytes()),
        DType::Int64 => bytes.copy_from_slice(&(v as i64).to_ne_bytes()),
        DType::Int32 => bytes[..4].copy_from_slice(&(v as i32).to_ne_bytes()),
        DType::Bool => bytes[0] = u8::from(v != 0.0),
        // Float32, and the 16-bit floats described as Float32 scalars.
        _ => bytes[..4].copy_from_slice(&(v as f32).to_ne_bytes()),
    }
    let acl = match dtype {
        DType::Float16 | DType::BFloat16 => sys::ACL_FLOAT,
        d => acl_dtype(d),
    };
    // SAFETY: nnopbase copies the value.
    let raw = unsafe { (api.aclCreateScalar)(bytes.as_mut_ptr() as *mut c_void, acl) };
    if raw.is_null() {
        return Err(AscendError::Aclnn {
            call: "aclCreateScalar",
            code: -1,
            message: with_recent(api, &format!("the {dtype} scalar {v}")),
        });
    }
    Ok(ScalarDesc { api, raw })
}

/// An int array (`aclCreateIntArray`), destroyed on drop.
pub struct IntArray {
    api: &'static Api,
    raw: *mut sys::aclIntArray,
}

impl IntArray {
    /// The descriptor.
    pub fn ptr(&self) -> *mut sys::aclIntArray {
        self.raw
    }
}

impl Drop for IntArray {
    fn drop(&mut self) {
        // SAFETY: made by aclCreateIntArray, destroyed once.
        unsafe { (self.api.aclDestroyIntArray)(self.raw) };
    }
}

/// The int array `v`.
pub fn int_array(api: &'static Api, v: &[i64]) -> AscendResult<IntArray> {
    // SAFETY: nnopbase copies the values.
    let raw = unsafe { (api.aclCreateIntArray)(v.as_ptr(), v.len() as u64) };
    if raw.is_null() {
        return Err(AscendError::Aclnn {
            call: "aclCreateIntArray",
            code: -1,
            message: with_recent(api, &format!("{v:?}")),
        });
    }
    Ok(IntArray { api, raw })
}

/// A bool array (`aclCreateBoolArray`), destroyed on drop.
pub struct BoolArray {
    api: &'static Api,
    raw: *mut sys::aclBoolArray,
}

impl BoolArray {
    /// The descriptor.
    pub fn ptr(&self) -> *mut sys::aclBoolArray {
        self.raw
    }
}

impl Drop for BoolArray {
    fn drop(&mut self) {
        // SAFETY: made by aclCreateBoolArray, destroyed once.
        unsafe { (self.api.aclDestroyBoolArray)(self.raw) };
    }
}

/// The bool array `v`.
pub fn bool_array(api: &'static Api, v: &[bool]) -> AscendResult<BoolArray> {
    // SAFETY: nnopbase copies the values.
    let raw = unsafe { (api.aclCreateBoolArray)(v.as_ptr(), v.len() as u64) };
    if raw.is_null() {
        return Err(AscendError::Aclnn {
            call: "aclCreateBoolArray",
            code: -1,
            message: with_recent(api, &format!("{v:?}")),
        });
    }
    Ok(BoolArray { api, raw })
}

/// A tensor list (`aclCreateTensorList`), which owns its tensors; destroyed on drop.
pub struct TensorList {
    api: &'static Api,
    raw: *mut sys::aclTensorList,
}

impl TensorList {
    /// The descriptor.
    pub fn ptr(&self) -> *mut sys::aclTensorList {
        self.raw
    }
}

impl Drop for TensorList {
    fn drop(&mut self) {
        // SAFETY: made by aclCreateTensorList, destroyed once (with its tensors).
        unsafe { (self.api.aclDestroyTensorList)(self.raw) };
    }
}

/// A list of `tensors` (the list takes them over).
pub fn tensor_list(api: &'static Api, tensors: Vec<TensorDesc>) -> AscendResult<TensorList> {
    let raws: Vec<*const sys::aclTensor> = tensors.iter().map(|t| t.raw as *const _).collect();
    // SAFETY: nnopbase takes the tensors over.
    let raw = unsafe { (api.aclCreateTensorList)(raws.as_ptr(), raws.len() as u64) };
    if raw.is_null() {
        return Err(AscendError::Aclnn {
            call: "aclCreateTensorList",
            code: -1,
            message: with_recent(api, &format!("{} tensors", raws.len())),
        });
    }
    // The list destroys them now.
    for t in tensors {
        std::mem::forget(t);
    }
    Ok(TensorList { api, raw })
}

/// Device memory reused in the compute stream's order (the aclnn workspace, the composite
/// lowerings' temporaries): grown on demand, the old block freed after the stream drains.
#[derive(Default)]
pub struct Arena {
    block: Mutex<(DevPtr, usize)>,
}

impl Arena {
    /// At least `bytes` of it (its start).
    pub fn get(&self, dev: &AscendDevice, bytes: usize) -> AscendResult<DevPtr> {
        let mut b = self.block.lock().unwrap_or_else(|p| p.into_inner());
        if b.1 >= bytes && b.0 != 0 {
            return Ok(b.0);
        }
        if b.0 != 0 {
            // Work in flight may still use the old block.
            dev.synchronize()?;
            dev.free(b.0);
            *b = (0, 0);
        }
        let size = bytes.max(1).next_power_of_two().max(4096);
        let p = dev.malloc(size)?;
        *b = (p, size);
        Ok(p)
    }

    /// Frees it (the caller has synchronized).
    pub fn release(&self, dev: &AscendDevice) {
        let mut b = self.block.lock().unwrap_or_else(|p| p.into_inner());
        dev.free(b.0);
        *b = (0, 0);
    }
}

/// Launches aclnn operators on a device's compute stream.
pub struct Runner<'a> {
    /// The device.
    pub dev: &'a AscendDevice,
    /// The workspace arena.
    pub workspace: &'a Arena,
}

impl Runner<'_> {
    /// One two-phase call: `prepare(&mut size, &mut executor)` (the operator's
    /// `GetWorkspaceSize` with its descriptors), then `run` (its launch) with a workspace of
    /// that size on the compute stream. `name` is the operator (`aclnnAdd`).
    pub fn launch(
        &self,
        name: &'static str,
        prepare: impl FnOnce(*mut u64, *mut *mut sys::aclOpExecutor) -> sys::aclnnStatus,
        run: LaunchFn,
    ) -> AscendResult<()> {
        let api = self.dev.api();
        let mut size = 0u64;
        let mut executor: *mut sys::aclOpExecutor = std::ptr::null_mut();
        let status = prepare(&mut size, &mut executor);
        if status != 0 || executor.is_null() {
            return Err(AscendError::Aclnn {
                call: ws_name(name),
                code: status,
                message: with_recent(api, ""),
            });
        }
        let ws = if size > 0 {
            self.workspace.get(self.dev, size as usize)?
        } else {
            0
        };
        // SAFETY: the executor was just made for this launch; the workspace holds `size`
        // bytes and is only reused in this stream's order.
        let status = unsafe { run(ws as *mut c_void, size, executor, self.dev.stream().raw()) };
        if status != 0 {
            return Err(AscendError::Aclnn {
                call: name,
                code: status,
                message: with_recent(api, "the launch"),
            });
        }
        Ok(())
    }
}

fn ws_name(name: &'static str) -> &'static str {
    // The GetWorkspaceSize names, for the errors (a small closed set: the operators in use).
    match shardc_ascend_sys::SYMBOLS
        .iter()
        .map(|(_, n)| *n)
        .find(|n| n.strip_suffix("GetWorkspaceSize") == Some(name))
    {
        Some(n) => n,
        None => name,
    }
}

/// Calls aclnn operator `$op` of `$runner` with `$ws`'s arguments (the descriptors; the
/// workspace size and executor are appended): an error names a symbol the libraries lack.
#[macro_export]
#[doc(hidden)]
macro_rules! aclnn {
    ($runner:expr, $op:ident, $ws:ident ( $($arg:expr),* $(,)? )) => {{
        let r: &$crate::aclnn::Runner<'_> = $runner;
        let api = r.dev.api();
        match (api.$ws, api.$op) {
            (Some(prepare), Some(run)) => r.launch(
                stringify!($op),
                // SAFETY: the descriptors are alive for the call; their device memory is the
                // executor's.
                |size, ex| unsafe { prepare($($arg,)* size, ex) },
                run,
            ),
            _ => Err($crate::error::AscendError::MissingSymbol {
                symbol: stringify!($op),
                library: "libopapi.so",
                path: String::new(),
                hint: "the CANN toolkit found lacks this aclnn operator; a newer CANN has it",
            }),
        }
    }};
}
