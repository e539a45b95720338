//! Errors of the emulator: what went wrong (an [`ErrorKind`]), the message logged on stderr,
//! and the thread's most recent error message (`aclGetRecentErrMsg`).
//!
//! The engine speaks in kinds; each family of exports (AscendCL runtime, aclnn, HCCL) maps a kind
//! to the numeric code its real library returns for that failure (see `codes`).

use std::cell::RefCell;
use std::ffi::CString;
use std::fmt;

/// What kind of failure an emulated call hit. Each API family turns it into its own code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// A null pointer where one is required.
    NullPtr,
    /// A parameter out of range, a shape or dtype the op does not accept, a bad handle.
    InvalidParam,
    /// `aclInit` was not called.
    Uninitialized,
    /// `aclInit` was called twice.
    RepeatInit,
    /// A stream, event, communicator or other handle that does not exist (any more).
    BadHandle,
    /// A device id outside `0..SHARDC_ASCEND_EMU_DEVICES`.
    InvalidDevice,
    /// The calling thread has no current device (no `aclrtSetDevice`).
    ContextNull,
    /// A stream, event or buffer of one device used from another device.
    WrongDevice,
    /// Device memory could not be allocated.
    BadAlloc,
    /// A device address that is in no live allocation, freed, or accessed past its end.
    IllegalAddress,
    /// Two accesses to the same device memory not ordered by stream order, events or a host
    /// synchronisation (one of them a write).
    Race,
    /// A workspace smaller than `GetWorkspaceSize` asked for.
    Workspace,
    /// An executor that was freed, already launched, or made by another op.
    BadExecutor,
    /// A wait that ran past its bound.
    Timeout,
    /// Queued work that waited past its bound (reported by a later synchronisation, which
    /// itself did not time out).
    QueuedTimeout,
    /// A collective call that disagrees with a peer's call.
    Mismatch,
    /// A peer rank that died or left the communicator.
    RemoteLost,
    /// A symbol that the emulator exports but does not implement for these arguments.
    NotSupported,
    /// A failure of the emulator itself (a panic, a system call).
    Internal,
}

/// An emulated failure: its kind and the message that names the API, the addresses and why.
#[derive(Clone, Debug)]
pub struct EmuError {
    /// What failed.
    pub kind: ErrorKind,
    /// A human-readable explanation (logged on stderr once, kept as the recent message).
    pub msg: String,
}

impl EmuError {
    /// An error of `kind` with message `msg`.
    pub fn new(kind: ErrorKind, msg: impl Into<String>) -> Self {
        EmuError {
            kind,
            msg: msg.into(),
        }
    }
}

impl fmt::Display for EmuError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.kind, self.msg)
    }
}

impl std::error::Error for EmuError {}

/// Shorthand for results of the engine.
pub type EmuResult<T> = Result<T, EmuError>;

/// Returns `Err(EmuError)` of the given kind with a formatted message.
#[macro_export]
macro_rules! bail {
    ($kind:ident, $($arg:tt)*) => {
        return Err($crate::diag::EmuError::new($crate::diag::ErrorKind::$kind, format!($($arg)*)))
    };
}

/// Builds an `EmuError` of the given kind with a formatted message.
#[macro_export]
macro_rules! emu_err {
    ($kind:ident, $($arg:tt)*) => {
        $crate::diag::EmuError::new($crate::diag::ErrorKind::$kind, format!($($arg)*))
    };
}

thread_local! {
    static RECENT: RefCell<Option<CString>> = const { RefCell::new(None) };
}

/// Logs `err` on stderr, prefixed with the API that failed, and makes it the calling thread's
/// recent error message.
pub fn report(api: &str, err: &EmuError) {
    let line = if err.msg.starts_with(api) {
        format!("[ascend-emu] {}", err.msg)
    } else {
        format!("[ascend-emu] {api}: {}", err.msg)
    };
    // A repeated aclInit is routine (callers treat it as success): not worth a log line.
    if err.kind != ErrorKind::RepeatInit {
        eprintln!("{line}");
    }
    set_recent(&line);
}

/// Makes `line` the calling thread's recent error message without logging it (an async error
/// was logged on the stream's thread when it happened).
pub fn set_recent(line: &str) {
    let c = CString::new(line.replace('\0', " ")).unwrap_or_default();
    RECENT.with(|r| *r.borrow_mut() = Some(c));
}

/// The calling thread's most recent error message as a C string that stays valid until the
/// thread's next failing call, or null when there is none. Reading it clears nothing (ACL's
/// `aclGetRecentErrMsg` returns the same message until a new error).
pub fn recent_ptr() -> *const std::ffi::c_char {
    RECENT.with(|r| match &*r.borrow() {
        Some(c) => c.as_ptr(),
        None => std::ptr::null(),
    })
}
