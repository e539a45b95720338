//! `shardc-compiler`: the frontend that builds logical graphs and the pipeline that compiles
//! them.
//!
//! - [`builder`]: [`builder::GraphBuilder`], the typed way to add parameters and nodes, with
//!   MindSpore-style instance names (`matmul`, `matmul2`) and scopes;
//! - [`ops`]: op primitives with `shard`, `ops::MatMul::new().shard(((2, 4), (4, 1)))`;
//! - [`strategy`]: strategies written as nested tuples ([`strategy::IntoStrategy`]);
//! - [`nn`]: cells (`Dense`, `Conv2d`, `BatchNorm2d`, `SequentialCell`, ...);
//! - [`loss`]: `MSELoss`, `SoftmaxCrossEntropyWithLogits`, the tutorials'
//!   `SoftmaxCrossEntropyExpand`;
//! - [`optim`]: `Momentum`, `SGD`, `Adam`;
//! - [`init`]: initializers by their MindSpore names;
//! - [`model`]: network + loss as one forward graph, and its training step;
//! - [`pipeline`]: the list of passes, run in order, with `NN_name_NNNN.ir` dumps;
//! - [`parallel_context`]: MindSpore's `set_auto_parallel_context` options, from TOML or flags;
//! - [`strategy_file`]: the strategy file (save, load, reproduce the per-rank graphs);
//! - [`zoo`]: ready-made networks (the quickstart net, MLP, LeNet-5, ResNet-18).
//!
//! ```
//! use shardc_compiler::{loss::MSELoss, model, nn::{Dense, SequentialCell, ReLU}, optim::Momentum};
//! use shardc_ir::DType;
//!
//! let net = SequentialCell::new(vec![
//!     Box::new(Dense::new(32, 16)),
//!     Box::new(ReLU),
//!     Box::new(Dense::new(16, 16)),
//! ]);
//! let forward = model::build_network(
//!     "Net",
//!     &net,
//!     &MSELoss::new(),
//!     &[("x", DType::Float32, &[16, 32]), ("label", DType::Float32, &[16, 16])],
//! )?;
//! let step = model::train_graph(&forward, &Momentum::new(0.2, 0.1))?;
//! assert!(step.nodes.len() > forward.nodes.len());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![warn(missing_docs)]

pub mod auto_pipeline;
pub mod builder;
pub mod device;
pub mod generated;
pub mod graph_layers;
pub mod init;
pub mod loss;
pub mod model;
pub mod nn;
pub mod ops;
pub mod optim;
pub mod parallel_context;
pub mod pipeline;
pub mod strategy;
pub mod strategy_file;
pub mod transformer;
pub mod transformer_layers;
pub mod zoo;

pub use builder::{BuildError, GraphBuilder, Value};
pub use pipeline::{compile, CompileError, CompileOptions, Compiled, PassRecord};
pub use strategy::IntoStrategy;
