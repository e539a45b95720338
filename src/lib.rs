//! shardc: an auto-parallel graph compiler and runtime.
//!
//! This facade re-exports the workspace crates under short names.

pub use shardc_backend_cpu as cpu;
pub use shardc_compiler as compiler;
pub use shardc_ir as ir;
pub use shardc_passes as passes;
pub use shardc_runtime as runtime;
