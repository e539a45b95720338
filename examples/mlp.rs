//! The data-parallel tutorial's MLP (Dense 784-512-512-10 with ReLU), trained on one device on
//! MNIST idx files with SGD and sparse softmax cross-entropy.
//!
//! `cargo run --release --example mlp -- [MNIST_DIR] [--steps N] [--batch B]`
//!
//! `MNIST_DIR` holds `train-images-idx3-ubyte` and `train-labels-idx1-ubyte` (the real
//! files, uncompressed). Without it, a small seeded synthetic set is written in that format
//! first (into a temporary directory) and read back through the same reader.

use shardc::compiler::optim::SGD;
use shardc::compiler::pipeline::{compile, CompileOptions};
use shardc::compiler::zoo;
use shardc::cpu::CpuBackend;
use shardc::runtime::data::{write_synthetic_mnist, MnistData};
use shardc::runtime::executor::Executor;
use std::path::PathBuf;
use std::sync::Arc;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut dir: Option<PathBuf> = None;
    let mut steps: u64 = 60;
    let mut batch: usize = 32;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--steps" => steps = args.next().ok_or("--steps needs a value")?.parse()?,
            "--batch" => batch = args.next().ok_or("--batch needs a value")?.parse()?,
            _ if a.starts_with("--") => return Err(format!("unknown option {a}").into()),
            _ => dir = Some(PathBuf::from(a)),
        }
    }
    let dir = match dir {
        Some(d) => d,
        None => {
            let d =
                std::env::temp_dir().join(format!("shardc-mnist-synthetic-{}", std::process::id()));
            write_synthetic_mnist(&d, 2048, 42)?;
            println!(
                "no MNIST directory given: wrote a synthetic set to {}",
                d.display()
            );
            d
        }
    };
    let data = MnistData::load_dir(&dir)?;
    let forward = zoo::mlp(batch, &[784, 512, 512, 10])?;
    let opts = CompileOptions {
        optimizer: Some(SGD::new(0.01).momentum(0.9).to_spec()),
        dump_dir: None,
        ..Default::default()
    };
    let train = compile(forward, &opts)?.graph;
    let mut exec = Executor::new(train, Arc::new(CpuBackend::new()))?;
    let per_epoch = data.num_batches(batch).max(1) as u64;
    let (mut first, mut last) = (None, 0.0);
    for step in 0..steps {
        let (x, y) = data.batch(step as usize, batch)?;
        let out = exec.step(&[("x", x), ("label", y)])?;
        let loss = out
            .first()
            .and_then(|t| t.scalar_value())
            .ok_or("no scalar loss")?;
        if step % 10 == 0 || step + 1 == steps {
            println!(
                "epoch: {} step: {}, loss is {}",
                step / per_epoch + 1,
                step % per_epoch + 1,
                loss as f32
            );
        }
        first.get_or_insert(loss);
        last = loss;
    }
    if let Some(f) = first {
        println!("loss {f:.7} -> {last:.7} over {steps} steps");
    }
    println!("{}", exec.memory_plan().summary());
    Ok(())
}
