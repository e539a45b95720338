//! The explicit training loop of MindSpore's data-parallel tutorial:
//!
//! ```text
//! grad_fn = ms.value_and_grad(forward_fn, None, net.trainable_params())
//! grad_reducer = nn.DistributedGradReducer(optimizer.parameters)
//! for data, label in data_set:
//!     loss, grads = grad_fn(data, label)
//!     grads = grad_reducer(grads)
//!     optimizer(grads)
//! ```
//!
//! Here: [`value_and_grad`] compiles the forward graph with its loss and the backward pass
//! into one graph that returns the loss and the gradient of every trainable weight;
//! [`DistributedGradReducer`] sums the gradients over the ranks in one fused AllReduce (and
//! divides by the rank count when `mean`); [`OptimizerCell`] is the optimizer as its own graph
//! (its state beside it), applied to the reduced gradients, after which the weights are
//! handed back to the gradient graph.

use super::TrainError;
use crate::communication::Communication;
use shardc_backend_cpu::CpuBackend;
use shardc_compiler::builder::GraphBuilder;
use shardc_compiler::loss::LossFn;
use shardc_compiler::model::build_network_with;
use shardc_compiler::nn::Cell;
use shardc_compiler::optim::OptimizerSpec;
use shardc_compiler::pipeline::{self, CompileOptions};
use shardc_ir::ReduceOp;
use shardc_ir::{DType, Graph, Operand, Param, ParamKind};
use shardc_passes::autodiff;
use shardc_runtime::comm::Communicator;
use shardc_runtime::{Data, Executor, Tensor};
use std::sync::Arc;

/// The loss and the gradients of a network with its loss (MindSpore's `value_and_grad`).
pub struct GradFn {
    exec: Executor,
    inputs: Vec<String>,
    /// The trainable weights, in the order of the gradients.
    weights: Vec<Param>,
}

/// Builds and compiles `net` followed by `loss` for inputs `inputs` (name, dtype, shape: the
/// network's input, then the label) with builder seed `seed`, and the backward pass of every
/// trainable weight. Each call returns the loss and the gradients, in
/// [`GradFn::trainable_params`] order.
pub fn value_and_grad(
    net: &dyn Cell,
    loss: &dyn LossFn,
    inputs: &[(&str, DType, &[usize])],
    seed: u64,
    threads: usize,
) -> Result<GradFn, TrainError> {
    let name = net.class_name().to_string();
    let forward = build_network_with(GraphBuilder::new(&name).with_seed(seed), net, loss, inputs)?;
    // Types and verification through the pipeline (no optimizer: the forward graph).
    let forward = pipeline::compile(forward, &CompileOptions::default())?.graph;
    let (mut g, grads) = autodiff::gradients(&forward).map_err(|e| {
        TrainError::Mismatch(format!("value_and_grad({name}): the backward pass: {e}"))
    })?;
    let weights: Vec<Param> = grads
        .iter()
        .map(|(p, _)| g.params[p.index()].clone())
        .collect();
    let loss_out = g.outputs.first().cloned().ok_or_else(|| {
        TrainError::Mismatch(format!(
            "value_and_grad({name}): the network returns no loss"
        ))
    })?;
    g.outputs = std::iter::once(loss_out)
        .chain(grads.into_iter().map(|(_, o)| o))
        .collect();
    let threads = if threads == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        threads
    };
    let exec = Executor::new(g, Arc::new(CpuBackend::with_threads(threads)))?;
    Ok(GradFn {
        exec,
        inputs: inputs.iter().map(|(n, _, _)| n.to_string()).collect(),
        weights,
    })
}

impl GradFn {
    /// `loss, grads = grad_fn(data, label)`: one tensor per input, in order.
    pub fn call(&mut self, inputs: &[Tensor]) -> Result<(f64, Vec<Tensor>), TrainError> {
        if inputs.len() != self.inputs.len() {
            return Err(TrainError::Mismatch(format!(
                "value_and_grad: {} input(s) given, the network takes {} ({:?})",
                inputs.len(),
                self.inputs.len(),
                self.inputs
            )));
        }
        let feeds: Vec<(&str, Tensor)> = self
            .inputs
            .iter()
            .map(String::as_str)
            .zip(inputs.iter().cloned())
            .collect();
        let mut out = self.exec.step(&feeds)?.into_iter();
        let loss = out.next().and_then(|t| t.scalar_value()).ok_or_else(|| {
            TrainError::Mismatch("value_and_grad: the loss is not a scalar".into())
        })?;
        Ok((loss, out.collect()))
    }

    /// The trainable weights' names, in the order of the gradients.
    pub fn trainable_params(&self) -> Vec<String> {
        self.weights.iter().map(|p| p.name.clone()).collect()
    }

    /// The executor (every weight, including BatchNorm's moving statistics).
    pub fn executor(&self) -> &Executor {
        &self.exec
    }
}

/// Sums gradients over every rank in one AllReduce of a flat buffer per dtype (MindSpore's
/// `nn.DistributedGradReducer`), then divides by the rank count when `mean`. On one device it
/// returns the gradients as they are.
pub struct DistributedGradReducer {
    comm: Option<Arc<dyn Communicator>>,
    mean: bool,
}

impl DistributedGradReducer {
    /// A reducer over every rank of `comm`; `mean` is MindSpore's `gradients_mean`.
    pub fn new(comm: &Communication, mean: bool) -> Self {
        DistributedGradReducer {
            comm: comm.communicator().cloned(),
            mean,
        }
    }

    /// `grads = grad_reducer(grads)`.
    pub fn reduce(&self, mut grads: Vec<Tensor>) -> Result<Vec<Tensor>, TrainError> {
        let Some(comm) = &self.comm else {
            return Ok(grads);
        };
        let size = comm.size();
        let group: Vec<usize> = (0..size).collect();
        for dtype in [DType::Float32, DType::Float64] {
            let members: Vec<usize> = (0..grads.len())
                .filter(|&i| grads[i].dtype() == dtype)
                .collect();
            if members.is_empty() {
                continue;
            }
            let total: usize = members.iter().map(|&i| grads[i].len()).sum();
            let mut flat = match dtype {
                DType::Float32 => {
                    let mut v = Vec::with_capacity(total);
                    for &i in &members {
                        v.extend_from_slice(grads[i].as_f32().unwrap_or(&[]));
                    }
                    Tensor::from_f32(vec![total], v)
                }
                _ => {
                    let mut v = Vec::with_capacity(total);
                    for &i in &members {
                        v.extend_from_slice(grads[i].as_f64().unwrap_or(&[]));
                    }
                    Tensor::from_f64(vec![total], v)
                }
            }
            .ok_or_else(|| TrainError::Mismatch("DistributedGradReducer: packing".into()))?;
            comm.all_reduce(&group, ReduceOp::Sum, &mut flat)
                .map_err(|e| {
                    TrainError::Cluster(format!(
                        "DistributedGradReducer: AllReduce of {total} gradient values: {e}"
                    ))
                })?;
            let scale = if self.mean { 1.0 / size as f64 } else { 1.0 };
            let mut at = 0;
            for &i in &members {
                let n = grads[i].len();
                match (&mut grads[i].data, &flat.data) {
                    (Data::F32(dst), Data::F32(src)) => {
                        for (d, s) in dst.iter_mut().zip(&src[at..at + n]) {
                            *d = if self.mean { s * scale as f32 } else { *s };
                        }
                    }
                    (Data::F64(dst), Data::F64(src)) => {
                        for (d, s) in dst.iter_mut().zip(&src[at..at + n]) {
                            *d = s * scale;
                        }
                    }
                    _ => {}
                }
                at += n;
            }
        }
        if let Some(g) = grads
            .iter()
            .find(|g| !matches!(g.dtype(), DType::Float32 | DType::Float64))
        {
            return Err(TrainError::Mismatch(format!(
                "DistributedGradReducer: a gradient of dtype {} cannot be reduced (Float32 or Float64 only)",
                g.dtype().name()
            )));
        }
        Ok(grads)
    }
}

/// The optimizer as its own graph over the trainable weights of a [`GradFn`] (MindSpore's
/// `optimizer(grads)`): its state (moments, Adam's powers) lives here; after each update the
/// new weights are handed back to the gradient graph.
pub struct OptimizerCell {
    exec: Executor,
    names: Vec<String>,
}

impl OptimizerCell {
    /// The optimizer `spec` over `grad_fn`'s trainable weights, starting from their current
    /// values.
    pub fn new(spec: &dyn OptimizerSpec, grad_fn: &GradFn) -> Result<OptimizerCell, TrainError> {
        let mut g = Graph::new("optimizer");
        let mut pairs = Vec::new();
        for w in &grad_fn.weights {
            let pid = g.add_param(w.clone());
            pairs.push(pid);
        }
        let mut grads = Vec::new();
        for (w, pid) in grad_fn.weights.iter().zip(&pairs) {
            let gid = g.add_param(Param {
                name: format!("grad.{}", w.name),
                ty: w.ty.clone(),
                kind: ParamKind::Input,
            });
            grads.push((*pid, Operand::Param(gid)));
        }
        let g = autodiff::append_update(g, &grads, &spec.to_spec())
            .map_err(|e| TrainError::Mismatch(format!("optimizer: {e}")))?;
        let g = pipeline::compile(g, &CompileOptions::default())?.graph;
        let mut exec = Executor::new(g, Arc::new(CpuBackend::with_threads(1)))?;
        for w in &grad_fn.weights {
            if let Some(t) = grad_fn.exec.param(&w.name) {
                exec.set_param(&w.name, t.clone())?;
            }
        }
        Ok(OptimizerCell {
            exec,
            names: grad_fn.weights.iter().map(|w| w.name.clone()).collect(),
        })
    }

    /// `optimizer(grads)`: updates every weight (and the state) from `grads` (in
    /// [`GradFn::trainable_params`] order), then gives `grad_fn` the new weights.
    pub fn apply(&mut self, grad_fn: &mut GradFn, grads: Vec<Tensor>) -> Result<(), TrainError> {
        if grads.len() != self.names.len() {
            return Err(TrainError::Mismatch(format!(
                "optimizer: {} gradient(s) given for {} trainable weight(s)",
                grads.len(),
                self.names.len()
            )));
        }
        let feed_names: Vec<String> = self.names.iter().map(|n| format!("grad.{n}")).collect();
        let feeds: Vec<(&str, Tensor)> = feed_names.iter().map(String::as_str).zip(grads).collect();
        self.exec.step(&feeds)?;
        for n in &self.names {
            if let Some(t) = self.exec.param(n) {
                grad_fn.exec.set_param(n, t.clone())?;
            }
        }
        Ok(())
    }
}
