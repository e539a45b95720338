//! MindSpore's parallel-training quickstart net, trained on one device.
//!
//! ```python
//! class Net(nn.Cell):
//!     def __init__(self):
//!         self.weight = Parameter(initializer("normal", [32, 16]), "w")
//!         self.weight2 = Parameter(initializer("normal", [16, 16]), "w2")
//!         self.matmul = ops.MatMul().shard(((2, 4), (4, 1)))
//!         self.relu = ops.ReLU()
//!         self.matmul2 = ops.MatMul()
//!     def construct(self, x):
//!         return self.matmul2(self.relu(self.matmul(x, self.weight)), self.weight2)
//! ```
//!
//! The same net in shardc's frontend, with `MSELoss` and `Momentum(lr 0.2, momentum 0.1)`,
//! trained for 25 epochs of 8 steps on a seeded synthetic regression set of 8 batches
//! `x[16, 32]`, `label[16, 16]` (the label a fixed linear function of x plus noise). On one device the `shard` annotation is recorded but changes nothing.
//!
//! `cargo run --release --example quickstart [-- --steps N]`

use shardc::compiler::builder::{BuildError, GraphBuilder, Value};
use shardc::compiler::loss::MSELoss;
use shardc::compiler::model::build_network;
use shardc::compiler::nn::Cell;
use shardc::compiler::optim::Momentum;
use shardc::compiler::pipeline::{compile, CompileOptions};
use shardc::compiler::{init, ops};
use shardc::cpu::CpuBackend;
use shardc::ir::DType;
use shardc::runtime::data::SyntheticData;
use shardc::runtime::executor::Executor;
use std::sync::Arc;

/// The tutorial's `Net`.
struct Net;

impl Cell for Net {
    fn class_name(&self) -> &str {
        "Net"
    }

    fn construct(&self, b: &mut GraphBuilder, x: Value) -> Result<Value, BuildError> {
        let w = b.weight("w", DType::Float32, &[32, 16], init::normal(0.01))?;
        let w2 = b.weight("w2", DType::Float32, &[16, 16], init::normal(0.01))?;
        let out = ops::MatMul::new().shard(((2, 4), (4, 1))).call(b, x, w)?;
        let out = ops::ReLU::new().call(b, out)?;
        ops::MatMul::new().call(b, out, w2)
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let steps: u64 = match args.iter().position(|a| a == "--steps") {
        Some(i) => args.get(i + 1).ok_or("--steps needs a value")?.parse()?,
        None => 200,
    };
    let forward = build_network(
        "Net",
        &Net,
        &MSELoss::new(),
        &[
            ("x", DType::Float32, &[16, 32]),
            ("label", DType::Float32, &[16, 16]),
        ],
    )?;
    let opts = CompileOptions {
        optimizer: Some(Momentum::new(0.2, 0.1).to_spec()),
        dump_dir: None,
        ..Default::default()
    };
    let train = compile(forward, &opts)?.graph;
    let data = SyntheticData::new(&train, 1, 8)?;
    let mut exec = Executor::new(train, Arc::new(CpuBackend::new()))?;
    let mut epoch_means = Vec::new();
    let mut sum = 0.0;
    for step in 0..steps {
        let out = exec.step(&data.feeds(step))?;
        let loss = out
            .first()
            .and_then(|t| t.scalar_value())
            .ok_or("no scalar loss")?;
        println!(
            "epoch: {} step: {}, loss is {}",
            step / 8 + 1,
            step % 8 + 1,
            loss as f32
        );
        sum += loss;
        if step % 8 == 7 {
            epoch_means.push(sum / 8.0);
            sum = 0.0;
        }
    }
    if let (Some(first), Some(last)) = (epoch_means.first(), epoch_means.last()) {
        println!(
            "mean loss of epoch 1: {first:.7}, of epoch {}: {last:.7}",
            epoch_means.len()
        );
    }
    Ok(())
}
