//! shardc: an auto-parallel graph compiler and runtime.
//!
//! This facade re-exports the workspace crates under short names, and holds what a user's
//! training program calls, in MindSpore's words: [`communication::init`] (join the cluster,
//! `get_rank`, `get_group_size`) and [`train`] (`Model::train` with callbacks, and the explicit
//! `value_and_grad` / `DistributedGradReducer` loop).

pub mod communication;
pub mod train;

pub use shardc_backend_ascend as ascend;
pub use shardc_backend_cpu as cpu;
pub use shardc_backend_cuda as cuda;
pub use shardc_collectives as collectives;
pub use shardc_compiler as compiler;
pub use shardc_ir as ir;
pub use shardc_passes as passes;
pub use shardc_runtime as runtime;
