//! `shardc bench gemm`, `train` and `all`: shardc on the CPU against numpy and PyTorch, each
//! case measured by shardc and then at once by the reference process
//! ([`reference.py serve`](crate::reference)), both under the same machine load.

use crate::args::{BenchArgs, BenchWhat, TrainModel};
use crate::measure::{median, ms, shardc_gemm};
use crate::reference::{start_reference, Reference};
use anyhow::{anyhow, bail, Result};
use shardc_backend_cpu::CpuBackend;
use shardc_ir::Graph;
use shardc_runtime::data::SyntheticData;
use shardc_runtime::executor::Executor;
use shardc_runtime::Tensor;
use std::sync::Arc;
use std::time::Instant;

/// Runs `gemm`, `train` or both (`all`): prints the reference's description of itself and
/// this machine's, then one line per case with the ratio and whether it meets the target.
pub fn run(args: &BenchArgs) -> Result<()> {
    let mut reference = if args.no_reference {
        None
    } else {
        start_reference(args)?
    };
    if let Some(r) = reference.as_mut() {
        for line in r.query("info")? {
            println!("reference: {}", line.raw.trim_start_matches("ref=info "));
        }
    }
    println!(
        "shardc: gemm crate (x86-v4 kernels), rayon; {} logical CPUs",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    if matches!(args.what, BenchWhat::Gemm | BenchWhat::All) {
        bench_gemm(args, reference.as_mut())?;
    }
    if matches!(args.what, BenchWhat::Train | BenchWhat::All) {
        bench_train(args, reference.as_mut())?;
    }
    if let Some(r) = reference {
        r.finish()?;
    }
    Ok(())
}

/// The GEMM cases: every size at every thread count, one line each.
fn bench_gemm(args: &BenchArgs, mut reference: Option<&mut Reference>) -> Result<()> {
    for &n in &args.sizes {
        for &threads in &args.threads {
            eprintln!("measuring gemm n={n} threads={threads} ...");
            let ours = shardc_gemm(n, threads, args.quick)?;
            let (mut numpy, mut torch) = (None, None);
            if let Some(r) = reference.as_deref_mut() {
                let quick = if args.quick { " --quick" } else { "" };
                for line in r.query(&format!("gemm --sizes {n} --threads {threads}{quick}"))? {
                    let gflops = line.number("gflops")?;
                    match line.field("ref") {
                        Some("numpy") => numpy = Some(gflops),
                        Some("torch") => torch = Some(gflops),
                        _ => {}
                    }
                }
            }
            println!("{}", gemm_line(n, threads, ours, numpy, torch));
        }
    }
    Ok(())
}

/// One result line of the GEMM benchmark.
fn gemm_line(
    n: usize,
    threads: usize,
    ours: f64,
    numpy: Option<f64>,
    torch: Option<f64>,
) -> String {
    let fmt = |v: Option<f64>| v.map_or_else(|| "n/a".to_string(), |v| format!("{v:.1}"));
    let mut line = format!(
        "gemm n={n} threads={threads} shardc={ours:.1} GFLOP/s numpy={} torch={}",
        fmt(numpy),
        fmt(torch)
    );
    if let Some(t) = torch.filter(|t| *t > 0.0) {
        let ratio = ours / t;
        line.push_str(&format!(" ratio_vs_torch={ratio:.2}"));
        if threads == 1 {
            let verdict = if ratio >= 1.0 { "met" } else { "missed" };
            line.push_str(&format!(" (target >= 1.0: {verdict})"));
        }
    }
    line
}

/// Median step time of `graph` on `threads` threads and the loss of the last step; with
/// `stats`, prints the executor's per-op statistics on stderr.
fn shardc_train(
    graph: &Graph,
    threads: usize,
    warmup: usize,
    steps: usize,
    stats: bool,
) -> Result<(f64, f64)> {
    let data = SyntheticData::new(graph, 1, 4)?;
    let mut exec = Executor::new(graph.clone(), Arc::new(CpuBackend::with_threads(threads)))?;
    let mut samples = Vec::with_capacity(steps);
    let mut loss = f64::NAN;
    for step in 0..warmup + steps {
        let feeds: Vec<(&str, Tensor)> = data.feeds(step as u64);
        let t = Instant::now();
        let out = exec.step(&feeds)?;
        let d = t.elapsed();
        if step >= warmup {
            samples.push(d);
        }
        loss = out
            .first()
            .and_then(Tensor::scalar_value)
            .ok_or_else(|| anyhow!("the training step's first output is not a scalar loss"))?;
    }
    if !loss.is_finite() {
        bail!(
            "the loss is {loss} after {} steps: the measured steps are not a sound training run",
            warmup + steps
        );
    }
    if stats {
        eprintln!("{}\n{}", exec.memory_plan().summary(), exec.stats());
    }
    Ok((median(&mut samples).as_secs_f64() * 1e3, loss))
}

/// The training cases: every model at every thread count, in rounds that alternate the two
/// sides, one line each.
fn bench_train(args: &BenchArgs, mut reference: Option<&mut Reference>) -> Result<()> {
    let models: &[TrainModel] = if args.models.is_empty() {
        &TrainModel::ALL
    } else {
        &args.models
    };
    for &model in models {
        let batch = model.batch(args.batch);
        eprintln!(
            "compiling the {} training step (batch {batch}) ...",
            model.name()
        );
        let graph = model.training_graph(batch)?;
        let (warmup, default_steps) = model.default_steps(args.quick);
        let steps = args.steps.unwrap_or(default_steps);
        for &threads in &args.threads {
            eprintln!(
                "measuring train {} batch={batch} threads={threads} ({warmup} warm-up + {steps} steps) ...",
                model.name()
            );
            let rounds = args.rounds.unwrap_or(if args.quick { 1 } else { 3 });
            let (mut ours, mut torch) = (f64::INFINITY, None::<f64>);
            let mut seen = Vec::new();
            for round in 0..rounds {
                let stats = args.stats && round + 1 == rounds;
                let (o, _) = shardc_train(&graph, threads, warmup, steps, stats)?;
                ours = ours.min(o);
                let mut t = None;
                if let Some(r) = reference.as_deref_mut() {
                    let cmd = format!(
                        "train --model {} --batch {batch} --threads {threads} --steps {steps} --warmup {warmup}",
                        model.name()
                    );
                    for line in r.query(&cmd)? {
                        if line.field("ref") == Some("torch") {
                            t = Some(line.number("step_ms")?);
                        }
                    }
                }
                if let Some(t) = t {
                    torch = Some(torch.map_or(t, |b| b.min(t)));
                }
                seen.push(format!(
                    "{}/{}",
                    ms(o),
                    t.map_or_else(|| "n/a".to_string(), ms)
                ));
            }
            if rounds > 1 {
                eprintln!(
                    "rounds (shardc/torch ms, median each): {}; best of each below",
                    seen.join(", ")
                );
            }
            println!("{}", train_line(model, batch, threads, ours, torch));
        }
    }
    Ok(())
}

/// One result line of the training benchmark.
fn train_line(
    model: TrainModel,
    batch: usize,
    threads: usize,
    ours: f64,
    torch: Option<f64>,
) -> String {
    let mut line = format!(
        "train {} batch={batch} threads={threads} shardc={} ms",
        model.name(),
        ms(ours)
    );
    match torch.filter(|t| *t > 0.0) {
        Some(t) => {
            let ratio = ours / t;
            let target = model.target_ratio();
            let verdict = if ratio <= target { "met" } else { "missed" };
            line.push_str(&format!(
                " torch={} ms ratio={ratio:.2} (target <= {target:.1}: {verdict})",
                ms(t)
            ));
        }
        None => line.push_str(" torch=n/a"),
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn result_lines_carry_ratio_and_verdict() {
        let g = gemm_line(512, 1, 150.2, Some(140.1), Some(160.3));
        assert_eq!(
            g,
            "gemm n=512 threads=1 shardc=150.2 GFLOP/s numpy=140.1 torch=160.3 ratio_vs_torch=0.94 (target >= 1.0: missed)"
        );
        assert_eq!(
            gemm_line(512, 2, 150.0, None, None),
            "gemm n=512 threads=2 shardc=150.0 GFLOP/s numpy=n/a torch=n/a"
        );
        assert_eq!(
            train_line(TrainModel::Mlp, 32, 1, 1.23, Some(2.34)),
            "train mlp batch=32 threads=1 shardc=1.23 ms torch=2.34 ms ratio=0.53 (target <= 1.0: met)"
        );
        assert_eq!(
            train_line(TrainModel::Quickstart, 16, 1, 0.1, Some(0.15)),
            "train quickstart batch=16 threads=1 shardc=0.100 ms torch=0.150 ms ratio=0.67 (target <= 0.5: missed)"
        );
    }

    #[test]
    fn every_model_compiles_and_the_quickstart_step_trains() {
        for model in TrainModel::ALL {
            let g = model
                .training_graph(model.batch(2))
                .unwrap_or_else(|e| panic!("{}: {e:#}", model.name()));
            assert!(!g.nodes.is_empty());
        }
        let g = TrainModel::Quickstart
            .training_graph(16)
            .expect("the quickstart step compiles");
        for threads in [1, 2] {
            let (ms, loss) =
                shardc_train(&g, threads, 1, 3, false).expect("the quickstart step runs");
            assert!(ms > 0.0 && ms.is_finite(), "{ms}");
            assert!(loss.is_finite() && loss > 0.0, "{loss}");
        }
    }
}
