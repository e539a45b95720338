//! `shardc-passes`: shape rules, the verifier and every graph-to-graph transformation.
//!
//! A pass is a function from graph to graph in its own module. This crate knows no runtime, no
//! backend and no file system.

pub mod autodiff;
pub mod grad_fusion;
pub mod infer;
pub mod ops;
pub mod parallel;
pub mod pipeline;
pub mod recompute;
pub mod verify;
