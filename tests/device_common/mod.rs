//! What every device backend's tests share (the CUDA backend's `gpu_common`, the Ascend
//! backend's tests): training steps of a graph on a device's executor against the CPU
//! executor, the tolerance check, the training step of a model, and a small ResNet-18.

#![allow(dead_code)]

use shardc::compiler::builder::{BuildError, GraphBuilder, Value};
use shardc::compiler::loss::SoftmaxCrossEntropyWithLogits;
use shardc::compiler::model::build_network;
use shardc::compiler::nn::{call_cell, BatchNorm2d, Cell, Conv2d, Dense, ReLU};
use shardc::compiler::pipeline::{compile, CompileOptions};
use shardc::compiler::zoo::BasicBlock;
use shardc::cpu::CpuBackend;
use shardc::ir::{DType, Graph};
use shardc::passes::autodiff::Optimizer;
use shardc::runtime::data::synthetic::SyntheticData;
use shardc::runtime::{Executor, StepExecutor, Tensor};
use std::sync::Arc;

/// The training step of `g` with `optimizer`.
pub fn train(g: Graph, optimizer: Optimizer) -> Graph {
    let opts = CompileOptions {
        optimizer: Some(optimizer),
        ..Default::default()
    };
    compile(g, &opts).expect("compiles").graph
}

/// Momentum(0.05, 0.9).
pub fn momentum() -> Optimizer {
    Optimizer::Momentum {
        learning_rate: 0.05,
        momentum: 0.9,
        use_nesterov: false,
    }
}

/// Whether `a` and `b` agree to `tol` relative to max(|a|, |b|, 1), NaN where the other is.
pub fn close(a: &Tensor, b: &Tensor, tol: f64) -> Result<(), String> {
    if a.shape != b.shape {
        return Err(format!("shapes {:?} and {:?}", a.shape, b.shape));
    }
    let (x, y) = (a.to_f64_vec(), b.to_f64_vec());
    for (i, (u, v)) in x.iter().zip(&y).enumerate() {
        let scale = u.abs().max(v.abs()).max(1.0);
        if (u - v).abs() > tol * scale || u.is_nan() != v.is_nan() {
            return Err(format!("element {i}: {u} vs {v}"));
        }
    }
    Ok(())
}

/// Runs `steps` steps of `g` on the CPU executor and on `device` (an executor of the same
/// graph) on the same seeded batches; compares every output of every step (to `tol`) and
/// every weight after the last (to `weight_tol`). With `resync`, before each step after the
/// first the CPU takes the device's weights (and optimizer state), so every step is compared
/// from the same start (for nets too badly conditioned to train side by side). Prints the
/// largest weight difference.
pub fn compare_steps_on(
    device: &mut dyn StepExecutor,
    g: &Graph,
    steps: u64,
    tol: f64,
    weight_tol: f64,
    resync: bool,
) {
    let data = SyntheticData::new(g, 7, 2).expect("synthetic data");
    let cpu_backend = Arc::new(CpuBackend::with_threads(1));
    let mut cpu = Executor::new(g.clone(), cpu_backend).expect("cpu executor");
    for s in 0..steps {
        if resync && s > 0 {
            for (name, w) in device.weight_values().expect("weights") {
                cpu.set_param(&name, w)
                    .expect("the cpu takes the device's weight");
            }
        }
        let feeds = data.feeds(s);
        let a = cpu.step(&feeds).expect("cpu step");
        let b = device.step(&feeds).expect("device step");
        assert_eq!(a.len(), b.len());
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            if let Err(e) = close(x, y, tol) {
                panic!("{}: step {s}, output {i}: {e}", g.name);
            }
        }
    }
    let dw = device.weight_values().expect("weights");
    let mut worst = 0f64;
    for (name, w) in &dw {
        let c = cpu.param(name).expect("the cpu has the weight");
        for (u, v) in c.to_f64_vec().iter().zip(w.to_f64_vec()) {
            worst = worst.max((u - v).abs() / u.abs().max(v.abs()).max(1.0));
        }
        if let Err(e) = close(c, w, weight_tol) {
            panic!("{}: weight {name} after {steps} steps: {e}", g.name);
        }
    }
    assert!(!dw.is_empty());
    println!("{}: largest weight difference {worst:.1e}", g.name);
}

/// `zoo::resnet18_cifar`'s structure (a 3x3 stem, four stages of two BasicBlocks, strides 2
/// with 1x1 down-sampling shortcuts, global average pooling) on CIFAR's 32x32 images at
/// widths 8, 8, 16, 24, 32: the zoo's net has no width option, and at full width the
/// emulated GEMMs take minutes.
pub struct SmallResNet18;

impl Cell for SmallResNet18 {
    fn class_name(&self) -> &str {
        "ResNet"
    }

    fn construct(&self, b: &mut GraphBuilder, x: Value) -> Result<Value, BuildError> {
        let mut y = call_cell(b, "conv1", &Conv2d::new(3, 8, 3), x)?;
        y = call_cell(b, "bn1", &BatchNorm2d::new(8), y)?;
        y = call_cell(b, "relu", &ReLU, y)?;
        let mut in_channels = 8;
        for (i, &width) in [8usize, 16, 24, 32].iter().enumerate() {
            let stride = if i == 0 { 1 } else { 2 };
            for (k, (cin, st)) in [(in_channels, stride), (width, 1)].into_iter().enumerate() {
                let block = BasicBlock {
                    in_channels: cin,
                    out_channels: width,
                    stride: st,
                };
                y = call_cell(b, &format!("layer{}.{k}", i + 1), &block, y)?;
            }
            in_channels = width;
        }
        let pooled = shardc::compiler::ops::ReduceMean::new()
            .keep_dims(false)
            .instance("mean")
            .call(b, y, &[2, 3])?;
        call_cell(b, "end_point", &Dense::new(in_channels, 10), pooled)
    }
}

/// [`SmallResNet18`] with its loss, on `batch` CIFAR images.
pub fn small_resnet18(batch: usize) -> Graph {
    build_network(
        "ResNet",
        &SmallResNet18,
        &SoftmaxCrossEntropyWithLogits::new(true, "mean"),
        &[
            ("x", DType::Float32, &[batch, 3, 32, 32]),
            ("label", DType::Int32, &[batch]),
        ],
    )
    .expect("small resnet18")
}
