//! Training as MindSpore users write it.
//!
//! Two styles, the same numbers:
//! - [`Model`]: `Model::new(net, loss, optimizer).train(epochs, &dataset, callbacks)`, as
//!   `mindspore.train.Model`. The training step (forward, backward, optimizer update) is one
//!   compiled graph; under a parallel context it is compiled for every rank and this process
//!   runs its own rank's graph, with the gradient reduction (fused into buckets) inside it.
//! - The explicit loop of MindSpore's newer data-parallel tutorial ([`value_and_grad`],
//!   [`DistributedGradReducer`], [`OptimizerCell`]): a graph that returns the loss and the
//!   gradients of the local batch, one fused AllReduce of the gradients (the mean over ranks
//!   with `gradients_mean`), then the optimizer.
//!
//! Callbacks ([`LossMonitor`], [`TimeMonitor`], [`ProgressBar`], [`ModelCheckpoint`]) see
//! every step. [`load_checkpoint`], [`load_param_into_net`] and [`save_checkpoint`] read and
//! write MindSpore's `.ckpt` (and safetensors) for a built model.

mod callbacks;
mod grad;
mod model;
mod serialization;

pub use callbacks::{
    Callback, CheckpointConfig, LossMonitor, ModelCheckpoint, ProgressBar, StepInfo, TimeMonitor,
};
pub use grad::{value_and_grad, DistributedGradReducer, GradFn, OptimizerCell};
pub use model::{Model, TrainSummary};
pub use serialization::{load_checkpoint, load_param_into_net, save_checkpoint};
pub use shardc_runtime::DeviceTarget;

use shardc_compiler::builder::BuildError;
use shardc_compiler::pipeline::CompileError;

use shardc_runtime::checkpoint::CheckpointError;
use shardc_runtime::data::DataError;
use shardc_runtime::RuntimeError;

/// Why training could not go on: the data set, the compiler, a step, the cluster, a
/// checkpoint, or a mismatch between them (named in the message).
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// The data set failed (the file and the reason).
    #[error(transparent)]
    Data(#[from] DataError),
    /// Building the network failed.
    #[error(transparent)]
    Build(#[from] BuildError),
    /// Compiling the training step failed.
    #[error(transparent)]
    Compile(#[from] CompileError),
    /// A training step failed.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// A checkpoint could not be written or read.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// Joining or leaving the cluster failed.
    #[error("cluster: {0}")]
    Cluster(String),
    /// The data, the network and the parallel context do not fit together.
    #[error("{0}")]
    Mismatch(String),
}

impl From<shardc_runtime::StepFailed> for TrainError {
    /// A failed step of the training loop is the runtime's error (the callbacks already name
    /// the step).
    fn from(f: shardc_runtime::StepFailed) -> TrainError {
        TrainError::Runtime(f.source)
    }
}

impl From<shardc_runtime::device_target::DeviceTargetError> for TrainError {
    /// A device target name that is not one (`Ascend` while its backend is not built).
    fn from(e: shardc_runtime::device_target::DeviceTargetError) -> TrainError {
        TrainError::Mismatch(e.to_string())
    }
}
