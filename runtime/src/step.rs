//! What trains a rank's graph, whichever device runs it.
//!
//! Training loops, callbacks and checkpoints see a [`StepExecutor`]: the CPU [`Executor`]
//! here, or another backend's executor (the CUDA backend's `GpuExecutor`), so a model trains,
//! saves and resumes the same way on every device.

use crate::error::RuntimeError;
use crate::executor::Executor;
use crate::tensor::Tensor;
use shardc_ir::Graph;

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
