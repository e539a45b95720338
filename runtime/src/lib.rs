//! `shardc-runtime`: executes compiled graphs.
//!
//! Host [`Tensor`]s, the [`Backend`] trait that kernels implement, and the executor with its
//! liveness-based memory plan. The runtime never compiles: it runs a graph it is given.

pub mod backend;
pub mod checkpoint;
pub mod cluster;
pub mod comm;
pub mod data;
pub mod device_target;
pub mod error;
pub mod executor;
pub mod init;
pub mod launcher;
pub mod memory;
pub mod mindspore_ckpt;
pub mod name_map;
pub mod step;
pub mod tensor;

pub use backend::{Arg, Backend, KernelContext, KernelError};
pub use comm::{CommError, Communicator, InProcessWorld};
pub use device_target::DeviceTarget;
pub use error::RuntimeError;
pub use executor::{ExecStats, Executor};
pub use memory::MemoryPlan;
pub use step::{train_steps, StepExecutor, StepFailed};
pub use tensor::{Data, Tensor};
