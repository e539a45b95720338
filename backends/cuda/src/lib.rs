//! The shardc CUDA backend.
//!
//! Per-rank graphs run on an NVIDIA GPU: kernels written in CUDA C (`kernels/`) compiled by
//! NVRTC when first used, MatMul and BatchMatMul through cuBLAS (TF32 off), collectives
//! through NCCL or, staged through the host, any shardc communicator. Nothing of CUDA is
//! needed to build: the libraries are opened at run time, each probed first
//! ([`probe`]), so a machine without a driver gets an error that names the missing library
//! instead of a panic.
//!
//! - [`device`]: the [`device::Device`] trait (memory, launches, GEMM); [`cuda::CudaDevice`]
//!   on a GPU, [`emulator::EmulatedDevice`] on the host for tests.
//! - [`kernels`]: the sources and the launch arguments.
//! - [`executor`]: [`executor::GpuExecutor`], a rank's graph on a device with the runtime's
//!   liveness memory plan; ops without a device kernel run on a host backend, counted.
//! - [`nccl`]: the NCCL communicator.
//! - [`cudnn`]: convolutions through cuDNN where it is found (else im2col + cuBLAS).

#![warn(missing_docs)]

pub mod cuda;
pub mod cudnn;
pub mod device;
pub mod emulator;
pub mod error;
pub mod executor;
pub mod fusion;
pub mod in_place;
pub mod kernels;
pub mod nccl;
mod ops;
pub mod probe;

pub use device::{Device, Gemm};
pub use error::{CudaError, CudaResult};
pub use executor::GpuExecutor;
pub use ops::{has_kernel, host_fallback, HOST_FALLBACKS};
pub use probe::{Library, MissingLibrary};
