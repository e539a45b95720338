//! The FFI boundary: every export runs inside a guard that catches panics, logs errors on
//! stderr with the API's name, and turns an [`ErrorKind`] into the numeric code the real
//! library returns for that failure.

use crate::diag::{report, EmuError, EmuResult, ErrorKind};
use shardc_ascend_sys as sys;
use std::panic::{catch_unwind, AssertUnwindSafe};

pub use sys::{
    ACLNN_ERR_INNER, ACLNN_ERR_PARAM_INVALID, ACLNN_ERR_PARAM_NULLPTR, ACLNN_ERR_RUNTIME_ERROR,
    ACL_ERROR_RT_CONTEXT_NULL,
};

/// The aclError AscendCL returns for `kind`.
pub fn acl_code(kind: ErrorKind) -> sys::aclError {
    use ErrorKind::*;
    match kind {
        NullPtr | InvalidParam | Workspace | BadExecutor => sys::ACL_ERROR_INVALID_PARAM,
        Uninitialized => sys::ACL_ERROR_UNINITIALIZE,
        RepeatInit => sys::ACL_ERROR_REPEAT_INITIALIZE,
        InvalidDevice => sys::ACL_ERROR_INVALID_DEVICE,
        ContextNull => ACL_ERROR_RT_CONTEXT_NULL,
        BadHandle => sys::ACL_ERROR_INVALID_RESOURCE_HANDLE,
        WrongDevice | IllegalAddress | Race => sys::ACL_ERROR_RT_PARAM_INVALID,
        BadAlloc => sys::ACL_ERROR_RT_MEMORY_ALLOCATION,
        Timeout => sys::ACL_ERROR_RT_STREAM_SYNC_TIMEOUT,
        NotSupported => sys::ACL_ERROR_FEATURE_UNSUPPORTED,
        Mismatch | RemoteLost | QueuedTimeout => sys::ACL_ERROR_FAILURE,
        Internal => sys::ACL_ERROR_INTERNAL_ERROR,
    }
}

/// The aclnnStatus nnopbase / aclnn return for `kind`.
pub fn nn_code(kind: ErrorKind) -> sys::aclnnStatus {
    use ErrorKind::*;
    match kind {
        NullPtr => ACLNN_ERR_PARAM_NULLPTR,
        InvalidParam | Workspace | BadExecutor | BadHandle | NotSupported | InvalidDevice => {
            ACLNN_ERR_PARAM_INVALID
        }
        Uninitialized | RepeatInit | ContextNull | WrongDevice | IllegalAddress | Race
        | BadAlloc | Timeout | QueuedTimeout | Mismatch | RemoteLost => ACLNN_ERR_RUNTIME_ERROR,
        Internal => ACLNN_ERR_INNER,
    }
}

/// The HcclResult HCCL returns for `kind`.
pub fn hccl_code(kind: ErrorKind) -> sys::HcclResult {
    use ErrorKind::*;
    match kind {
        NullPtr => sys::HCCL_E_PTR,
        InvalidParam | Mismatch | BadHandle | InvalidDevice | Workspace | BadExecutor => {
            sys::HCCL_E_PARA
        }
        Timeout | QueuedTimeout => sys::HCCL_E_TIMEOUT,
        RemoteLost => sys::HCCL_E_REMOTE,
        NotSupported => sys::HCCL_E_NOT_SUPPORT,
        BadAlloc => sys::HCCL_E_MEMORY,
        Uninitialized | RepeatInit | ContextNull | WrongDevice | IllegalAddress | Race => {
            sys::HCCL_E_RUNTIME
        }
        Internal => sys::HCCL_E_INTERNAL,
    }
}

fn run<T>(api: &str, f: impl FnOnce() -> EmuResult<T>) -> Result<T, EmuError> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => {
            let what = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            Err(EmuError::new(
                ErrorKind::Internal,
                format!("{api}: the emulator panicked: {what}"),
            ))
        }
    }
}

/// Runs an AscendCL export: `ACL_SUCCESS` or the error's aclError.
pub fn acl(api: &str, f: impl FnOnce() -> EmuResult<()>) -> sys::aclError {
    match run(api, f) {
        Ok(()) => sys::ACL_SUCCESS,
        Err(e) => {
            report(api, &e);
            acl_code(e.kind)
        }
    }
}

/// Runs an nnopbase / aclnn export: 0 or the error's aclnnStatus.
pub fn nn(api: &str, f: impl FnOnce() -> EmuResult<()>) -> sys::aclnnStatus {
    match run(api, f) {
        Ok(()) => 0,
        Err(e) => {
            report(api, &e);
            nn_code(e.kind)
        }
    }
}

/// Runs an HCCL export: `HCCL_SUCCESS` or the error's HcclResult.
pub fn hccl(api: &str, f: impl FnOnce() -> EmuResult<()>) -> sys::HcclResult {
    match run(api, f) {
        Ok(()) => sys::HCCL_SUCCESS,
        Err(e) => {
            report(api, &e);
            hccl_code(e.kind)
        }
    }
}

/// Runs an export that returns a pointer: the pointer, or null after logging the error.
pub fn ptr<T>(api: &str, f: impl FnOnce() -> EmuResult<*mut T>) -> *mut T {
    match run(api, f) {
        Ok(p) => p,
        Err(e) => {
            report(api, &e);
            std::ptr::null_mut()
        }
    }
}

/// Checks each export against its type in `shardc_ascend_sys::sig` at compile time.
#[macro_export]
macro_rules! check_sigs {
    ($($name:ident),* $(,)?) => {
        $( const _: shardc_ascend_sys::sig::$name = $name; )*
    };
}
