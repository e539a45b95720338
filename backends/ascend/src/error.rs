//! The Ascend backend's errors: each names the call or the op, the value and the reason.

use shardc_ir::OpKind;

/// What went wrong on the Ascend side, in words a user can act on.
#[derive(Debug, thiserror::Error)]
pub enum AscendError {
    /// A CANN library could not be opened (see [`crate::probe`]).
    #[error("{0}")]
    LibraryMissing(#[from] crate::probe::MissingLibrary),
    /// A library opened but lacks a symbol shardc calls.
    #[error("{library} has no symbol {symbol} (found at {path}): {hint}")]
    MissingSymbol {
        /// The C symbol.
        symbol: &'static str,
        /// The library's file name.
        library: &'static str,
        /// Where the library was opened from.
        path: String,
        /// What to do about it.
        hint: &'static str,
    },
    /// An AscendCL call failed.
    #[error("AscendCL: {call} failed with error {code}{}", detail(.message))]
    Acl {
        /// The call (`aclrtMalloc`).
        call: &'static str,
        /// The `aclError` it returned.
        code: i32,
        /// What the call was for, and `aclGetRecentErrMsg`'s text.
        message: String,
    },
    /// An aclnn operator failed (its `GetWorkspaceSize` or its launch).
    #[error("aclnn: {call} failed with status {code}{}", detail(.message))]
    Aclnn {
        /// The call (`aclnnAddGetWorkspaceSize`).
        call: &'static str,
        /// The `aclnnStatus` it returned.
        code: i32,
        /// What the call was for, and `aclGetRecentErrMsg`'s text.
        message: String,
    },
    /// An HCCL call failed.
    #[error("HCCL: {call} failed: {reason}")]
    Hccl {
        /// The call (`HcclAllReduce`).
        call: &'static str,
        /// HCCL's error and what was in flight.
        reason: String,
    },
    /// A host wait for a stream outlasted `SHARDC_COMM_TIMEOUT` (the work stays queued).
    #[error("{what} did not finish within {:.3} s (SHARDC_COMM_TIMEOUT)", timeout.as_secs_f64())]
    Timeout {
        /// The stream and device waited for.
        what: String,
        /// The bound.
        timeout: std::time::Duration,
    },
    /// An op of the graph failed on the device.
    #[error("{op} '{instance}': {reason}")]
    Op {
        /// The op kind.
        op: OpKind,
        /// The node's instance name.
        instance: String,
        /// Why.
        reason: String,
    },
    /// Anything else about the graph or the run.
    #[error("{0}")]
    Other(String),
}

fn detail(message: &str) -> String {
    if message.is_empty() {
        String::new()
    } else {
        format!(": {message}")
    }
}

/// Shorthand for results of this crate.
pub type AscendResult<T> = Result<T, AscendError>;

impl From<shardc_runtime::RuntimeError> for AscendError {
    /// A runtime error met on a device's step (the run loop's, the schedule's).
    fn from(e: shardc_runtime::RuntimeError) -> Self {
        AscendError::Other(e.to_string())
    }
}
