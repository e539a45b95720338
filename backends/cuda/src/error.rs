//! The CUDA backend's errors.

use shardc_ir::OpKind;

/// What went wrong on the GPU side, in words a user can act on.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// A CUDA library could not be opened (see [`crate::probe`]).
    #[error("{0}")]
    LibraryMissing(#[from] crate::probe::MissingLibrary),
    /// The driver is there but there is no usable device.
    #[error("no CUDA device: {0}")]
    NoDevice(String),
    /// A driver call failed.
    #[error("CUDA driver: {call} failed: {reason}")]
    Driver {
        /// The call (`cuMemAlloc`, `cuLaunchKernel`).
        call: &'static str,
        /// The driver's error.
        reason: String,
    },
    /// cuBLAS failed.
    #[error("cuBLAS: {call} failed: {reason}")]
    Cublas {
        /// The call.
        call: &'static str,
        /// cuBLAS's error.
        reason: String,
    },
    /// cuDNN failed.
    #[error("cuDNN: {call} failed: {reason}")]
    Cudnn {
        /// The call.
        call: &'static str,
        /// cuDNN's error.
        reason: String,
    },
    /// NCCL failed.
    #[error("NCCL: {call} failed: {reason}")]
    Nccl {
        /// The call.
        call: &'static str,
        /// NCCL's error.
        reason: String,
    },
    /// NVRTC could not compile a kernel source (the log says where).
    #[error("NVRTC could not compile {source_name}: {log}")]
    Compile {
        /// The kernel source file.
        source_name: String,
        /// The compiler's log.
        log: String,
    },
    /// The host-emulated device could not be built or run.
    #[error("kernel emulator: {0}")]
    Emulator(String),
    /// A kernel the backend asked for does not exist in the sources.
    #[error("no kernel named `{0}` in the CUDA sources")]
    UnknownKernel(String),
    /// Device memory ran out.
    #[error("out of device memory: {requested} bytes requested ({context})")]
    OutOfMemory {
        /// The request.
        requested: usize,
        /// What it was for.
        context: String,
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

/// Shorthand for results of this crate.
pub type CudaResult<T> = Result<T, CudaError>;

impl From<shardc_runtime::RuntimeError> for CudaError {
    /// A runtime error met on a device's step (the run loop's, the schedule's).
    fn from(e: shardc_runtime::RuntimeError) -> Self {
        CudaError::Other(e.to_string())
    }
}
