//! What trains a rank's graph, whichever device runs it.
//!
//! Training loops, callbacks and checkpoints see a [`StepExecutor`]: the CPU [`Executor`]
//! here, or another backend's executor (the CUDA backend's `GpuExecutor`), so a model trains,
//! saves and resumes the same way on every device. [`train_steps`] is the loop: `shardc run`
//! (one process, in-process ranks, a cluster rank, a GPU) runs it, its differences (the
//! executor, the data each step is fed, what follows a step) given as arguments.

use crate::error::RuntimeError;
use crate::executor::Executor;
use crate::tensor::Tensor;
use shardc_ir::Graph;
use std::ops::Range;

/// Runs a graph step after step on some device (see the module doc).
pub trait StepExecutor: Send {
    /// The graph it runs.
    fn graph(&self) -> &Graph;

    /// Runs one step with `feeds` (by data input name); returns the graph's outputs.
    fn step(&mut self, feeds: &[(&str, Tensor)]) -> Result<Vec<Tensor>, RuntimeError>;

    /// Every weight (`Ref` parameter), by name, in parameter order, as host tensors.
    fn weight_values(&self) -> Result<Vec<(String, Tensor)>, RuntimeError>;

    /// One weight's current value as a host tensor.
    fn weight_value(&self, name: &str) -> Result<Tensor, RuntimeError>;

    /// Replaces a weight's value (a checkpoint being loaded).
    fn set_param(&mut self, name: &str, value: Tensor) -> Result<(), RuntimeError>;

    /// Steps completed.
    fn step_count(&self) -> u64;

    /// Sets the step counter (a resumed run continues from it).
    fn set_step_count(&mut self, n: u64);

    /// The device, in words (`cpu`, `NVIDIA H100 (GPU 0, sm_90, 132 SMs)`).
    fn device(&self) -> String;

    /// What the executor has to say after a run (memory plan, where time or ops went).
    fn report(&self) -> String;
}

impl StepExecutor for Executor {
    fn graph(&self) -> &Graph {
        Executor::graph(self)
    }

    fn step(&mut self, feeds: &[(&str, Tensor)]) -> Result<Vec<Tensor>, RuntimeError> {
        Executor::step(self, feeds)
    }

    fn weight_values(&self) -> Result<Vec<(String, Tensor)>, RuntimeError> {
        Ok(self
            .weights()
            .map(|(n, t)| (n.to_string(), t.clone()))
            .collect())
    }

    fn weight_value(&self, name: &str) -> Result<Tensor, RuntimeError> {
        self.param(name)
            .cloned()
            .ok_or_else(|| RuntimeError::UnknownParam {
                graph: Executor::graph(self).name.clone(),
                name: name.to_string(),
                hint: String::new(),
            })
    }

    fn set_param(&mut self, name: &str, value: Tensor) -> Result<(), RuntimeError> {
        Executor::set_param(self, name, value)
    }

    fn step_count(&self) -> u64 {
        Executor::step_count(self)
    }

    fn set_step_count(&mut self, n: u64) {
        Executor::set_step_count(self, n)
    }

    fn device(&self) -> String {
        self.backend().name().to_string()
    }

    fn report(&self) -> String {
        format!("{}\n{}", self.memory_plan().summary(), self.stats())
    }
}

/// A training step that failed: which one (0-based) and the runtime's error (its source).
#[derive(Debug, thiserror::Error)]
#[error("step {}", .step + 1)]
pub struct StepFailed {
    /// The step, counted from 0 (the message counts from 1, as the loss lines do).
    pub step: u64,
    /// Why it failed.
    #[source]
    pub source: RuntimeError,
}

/// The training loop: for each step of `steps`, the executor runs `feed(step)` (each data
/// input's tensor, by name; `None` when the data ends, which ends the loop), then
/// `after_step(step, outputs, exec)` sees the graph's outputs (the loss first) and the
/// executor (for checkpoints and callbacks). Returns the number of steps run. A failed step
/// is a [`StepFailed`] naming it; an error of `feed` or `after_step` ends the loop as it is.
pub fn train_steps<E, N, Err>(
    exec: &mut E,
    steps: Range<u64>,
    mut feed: impl FnMut(u64) -> Result<Option<Vec<(N, Tensor)>>, Err>,
    mut after_step: impl FnMut(u64, Vec<Tensor>, &E) -> Result<(), Err>,
) -> Result<u64, Err>
where
    E: StepExecutor + ?Sized,
    N: AsRef<str>,
    Err: From<StepFailed>,
{
    let mut ran = 0;
    for step in steps {
        let Some(fed) = feed(step)? else {
            break;
        };
        let (names, tensors): (Vec<N>, Vec<Tensor>) = fed.into_iter().unzip();
        let feeds: Vec<(&str, Tensor)> = names.iter().map(AsRef::as_ref).zip(tensors).collect();
        let outputs = exec
            .step(&feeds)
            .map_err(|source| StepFailed { step, source })?;
        after_step(step, outputs, exec)?;
        ran += 1;
    }
    Ok(ran)
}
