//! `shardc-mlir`: shardc programs as MLIR, and MLIR's own `shard-partition` as an
//! independent oracle for shardc's partitioner.
//!
//! - [`export`] (pure Rust): the logical graph with its plan as `func`/`linalg`/`tensor`/
//!   `arith` ops annotated with `shard` shardings, and every rank's graph with `shard`
//!   collectives, as MLIR text.
//! - [`grid`]: the `shard.grid` of a plan and the translation of layouts and groups to grid
//!   axes.
//! - `mlir` (feature `mlir`, melior): `verify` and `partition` (MLIR's `sharding-propagation`
//!   and `shard-partition` through melior's `PassManager`).
//! - [`eval`]: a small interpreter of the partitioned per-rank MLIR (the ops
//!   `shard-partition` emits), every rank at once with the shard collectives simulated.
//! - `oracle` (feature `mlir`): shardc's partition run on the CPU backend against MLIR's
//!   partition run by [`eval`]; values and collective bytes compared.
//!
//! See `docs/mlir.md`.

pub mod error;
pub mod eval;
pub mod export;
pub mod grid;
// Not in the lib's own unit-test build: that binary then links no MLIR (every test that
// does is in `tests/mlir_oracle.rs`, one ~230 MB binary).
#[cfg(all(feature = "mlir", not(test)))]
pub mod mlir;
#[cfg(all(feature = "mlir", not(test)))]
pub mod oracle;

pub use error::{EvalError, ExportError};
pub use grid::Grid;
