//! A transformer encoder stack, parallelised by strategy search alone: no op is annotated,
//! `auto_parallel` with the chosen `search_mode` decides every op's strategy, then every rank
//! trains in a thread of this process (the in-process communicator) and prints the loss of
//! each step, which is the loss of the whole batch, the same on every rank and the same as on
//! one device.
//!
//! Per layer: Q, K, V dense (MatMul and Add), reshape and transpose to heads,
//! BatchMatMul(q, kᵀ) times a scale, Softmax, BatchMatMul(p, v), dense out, residual and
//! LayerNorm, the FFN (dense H→4H, GeLU, dense 4H→H), residual and LayerNorm; MSE loss;
//! Momentum (the model of `shardc gen transformer`).
//!
//! ```sh
//! cargo run --release --example transformer -- --layers 2 --hidden 128 --heads 4 --seq 32 \
//!     --batch 16 --device-num 4 --search-mode dynamic_programming --steps 3
//! ```

use shardc::compiler::optim::Momentum;
use shardc::compiler::pipeline::{compile, CompileOptions};
use shardc::compiler::transformer::{transformer, TransformerConfig};
use shardc::ir::TensorLayout;
use shardc::passes::parallel::{DatasetLayout, Mode, ParallelOptions, SearchMode, SearchOptions};
use shardc::runtime::data::SyntheticData;
use shardc::runtime::Tensor;
use shardc_tools::in_process::run_ranks;

fn arg(args: &[String], name: &str, default: usize) -> Result<usize, String> {
    match args.iter().position(|a| a == name) {
        Some(i) => args
            .get(i + 1)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("{name} needs a positive number")),
        None => Ok(default),
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let cfg = TransformerConfig::new(
        arg(&args, "--layers", 2)?,
        arg(&args, "--hidden", 128)?,
        arg(&args, "--heads", 4)?,
        arg(&args, "--seq", 32)?,
        arg(&args, "--batch", 16)?,
    );
    let device_num = arg(&args, "--device-num", 4)?;
    let steps = arg(&args, "--steps", 3)? as u64;
    let mode = match args.iter().position(|a| a == "--search-mode") {
        None => SearchMode::RecursiveProgramming,
        Some(i) => match args.get(i + 1).map(String::as_str) {
            Some("sharding_propagation") => SearchMode::ShardingPropagation,
            Some("recursive_programming") => SearchMode::RecursiveProgramming,
            Some("dynamic_programming") => SearchMode::DynamicProgramming,
            Some("ilp") => SearchMode::Ilp,
            other => {
                return Err(format!(
                    "--search-mode {other:?}: one of sharding_propagation, \
                     recursive_programming, dynamic_programming, ilp"
                )
                .into())
            }
        },
    };
    let forward = transformer(&cfg)?;
    let compiled = compile(
        forward,
        &CompileOptions {
            optimizer: Some(Momentum::new(0.01, 0.9).to_spec()),
            parallel: Some(ParallelOptions {
                mode: Mode::AutoParallel,
                device_num,
                dataset: DatasetLayout::DataParallel,
                gradients_mean: true,
                enable_alltoall: false,
                search: SearchOptions {
                    mode,
                    ..Default::default()
                },
                parallel_optimizer: None,
            }),
            ..Default::default()
        },
    )?;
    let p = compiled
        .parallel
        .ok_or("no per-rank graphs (device_num 1?)")?;
    if let Some(r) = &p.assignment.search {
        println!(
            "{}: {} ops searched in {:.3} s; predicted step {:.3} ms (compute {:.3} + \
             communication {:.3}), {:.1} MiB per device{}",
            r.searcher,
            r.searched_ops,
            r.search_seconds,
            r.predicted.seconds() * 1e3,
            r.predicted.compute * 1e3,
            r.predicted.communication * 1e3,
            r.predicted.memory / (1u64 << 20) as f64,
            if r.exact { ", proven optimal" } else { "" }
        );
        for n in &r.notes {
            println!("  note: {n}");
        }
    }
    for (node, d) in p.begin.nodes.iter().zip(&p.assignment.decisions) {
        if let (Some(d), true) = (d, node.instance.starts_with("layer0_")) {
            if node.op.name().contains("MatMul") {
                println!("  {:<32} {}", node.instance, d.sharding.strategy);
            }
        }
    }
    let data = SyntheticData::new(&compiled.graph, 1, steps as usize)?;
    let feeds = |step: u64| -> Vec<(String, Tensor)> {
        data.feeds(step)
            .into_iter()
            .map(|(n, t)| (n.to_string(), t))
            .collect()
    };
    let inputs: Vec<(String, TensorLayout)> = p
        .begin
        .params
        .iter()
        .zip(&p.assignment.param_layouts)
        .filter(|(param, _)| !param.is_weight())
        .map(|(param, l)| (param.name.clone(), l.clone()))
        .collect();
    let res = run_ranks(p.ranks, &inputs, &feeds, steps, 1)?;
    for (k, outs) in res.outputs[0].iter().enumerate() {
        let loss = outs[0].scalar_value().unwrap_or(f64::NAN);
        println!("epoch: 1 step: {}, loss is {loss}", k + 1);
    }
    Ok(())
}
