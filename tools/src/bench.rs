//! `shardc bench`: shardc against numpy and PyTorch, measured in the same run on the same
//! machine.
//!
//! The benchmarks:
//!
//! - `gemm`: f32 GEMM throughput (GFLOP/s) of [`shardc_backend_cpu::sgemm`] at each size and
//!   thread count, against `numpy.matmul` and `torch.matmul`. Target: at least 1.0× PyTorch on
//!   one thread.
//! - `train`: the median wall time of one full training step (forward, backward, optimizer
//!   update; the best of `--rounds` rounds that alternate the two sides) of the quickstart net (batch 16, its `x[16, 32]`), the MLP (784-512-512-10) and
//!   ResNet-18 for CIFAR (`--batch`, default 32), compiled by the pipeline and run by the
//!   executor on a [`CpuBackend`] with the thread count, against the same model in PyTorch CPU
//!   eager with the same thread count. Targets: quickstart at most 0.5× PyTorch's step time,
//!   MLP and ResNet-18 at most 1.0×.
//! - `compile`: the parallel compiler's compile time on a 24-layer transformer, shardc only
//!   (see [`bench_compile`]). Goal: the whole pipeline within 1 s.
//! - `search`: the strategy searchers on the 24-layer transformer at 8 to 4096 devices and on
//!   a generated 10⁵-op graph (see [`bench_search`]), and the whole `shardc compile` of the
//!   24-layer transformer as users run it, in a child process. Goals: 512 devices within 2 s
//!   whole (the command line: 2 s, 1 GiB peak RSS, 64 MiB of artifact; 4096 devices within
//!   4 s), 10⁵ ops at 4096 devices within 60 s, under 2 GiB.
//! - `strategies`: the cost model's predicted step time of candidate strategies (data
//!   parallel, model-parallel annotations, searched) against their measured step time on
//!   in-process ranks, with Spearman's rank correlation per case (see [`bench_strategies`]).
//!   Goal: at least 0.8 everywhere.
//!
//! The reference side is `bench/reference.py`, run by the interpreter of `bench/.venv`; when
//! the virtual environment is missing, `bench/setup_venv.sh` creates it first (unless
//! `--no-setup`, which skips the reference instead). The script runs as one long-lived
//! process (`reference.py serve`) so that every case is measured by shardc and then at once
//! by the reference, both under the same machine load.
//!
//! Each case prints one line on stdout, for example
//!
//! ```text
//! gemm n=512 threads=1 shardc=150.2 GFLOP/s numpy=140.1 torch=160.3 ratio_vs_torch=0.94 (target >= 1.0: missed)
//! train mlp batch=32 threads=1 shardc=1.23 ms torch=2.34 ms ratio=0.53 (target <= 1.0: met)
//! ```

#[path = "bench_calibrate.rs"]
pub mod bench_calibrate;
#[path = "bench_collectives.rs"]
pub mod bench_collectives;
#[path = "bench_compile.rs"]
pub mod bench_compile;
#[path = "bench_ddp.rs"]
pub mod bench_ddp;
#[path = "bench_gpu.rs"]
pub mod bench_gpu;
#[path = "bench_plans.rs"]
pub mod bench_plans;
#[path = "bench_search.rs"]
pub mod bench_search;
#[path = "bench_strategies.rs"]
pub mod bench_strategies;

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, ValueEnum};
use shardc_backend_cpu::{sgemm, CpuBackend, MatRef};
use shardc_compiler::optim::{Momentum, SGD};
use shardc_compiler::pipeline::{compile, CompileOptions};
use shardc_compiler::zoo;
use shardc_ir::Graph;
use shardc_runtime::data::SyntheticData;
use shardc_runtime::executor::Executor;
use shardc_runtime::Tensor;
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Which benchmark `shardc bench` runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BenchWhat {
    /// f32 GEMM GFLOP/s against numpy and PyTorch.
    Gemm,
    /// One training step of each model against PyTorch CPU eager.
    Train,
    /// `gemm` and `train` (not `compile`).
    All,
    /// The parallel compiler's compile time on a 24-layer transformer (shardc only; see
    /// [`bench_compile`]).
    Compile,
    /// Measure this machine for the cost model and write a device description (TOML,
    /// `--device-file`; see [`bench_calibrate`]).
    Calibrate,
    /// The strategy searchers' speed on a 24-layer transformer at 8 to 4096 devices and on a
    /// generated 10^5-op graph (shardc only; see [`bench_search`]).
    Search,
    /// The CUDA backend against PyTorch on the same GPU: GEMM TFLOP/s (f32, TF32, BF16) and
    /// training steps of the MLP, ResNet-18 and a transformer (see [`bench_gpu`]).
    Gpu,
    /// Whether the cost model ranks candidate strategies as measured step times do, on the
    /// quickstart net, the MLP and a 2-layer transformer at 2, 4, 8 ranks (see
    /// [`bench_strategies`]).
    Strategies,
    /// The default modes' plans (semi-auto, sharding propagation) against the full searcher
    /// and MindSpore's rules, on the quickstart net at two sizes (see [`bench_plans`]).
    Plans,
}

/// A model of the training-step benchmark.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum TrainModel {
    /// MindSpore's parallel quickstart net with MSELoss, `Momentum(0.2, 0.1)`, batch 16.
    Quickstart,
    /// Dense 784-512-512-10 with ReLU, sparse softmax cross-entropy, `SGD(0.01)`.
    Mlp,
    /// ResNet-18 for CIFAR (32×32 input), sparse softmax cross-entropy, `Momentum(0.01, 0.9)`.
    Resnet18,
}

impl TrainModel {
    /// Every model, in the order they are measured.
    pub const ALL: [TrainModel; 3] = [
        TrainModel::Quickstart,
        TrainModel::Mlp,
        TrainModel::Resnet18,
    ];

    /// The name used on the command line, in the output and by `reference.py`.
    pub fn name(self) -> &'static str {
        match self {
            TrainModel::Quickstart => "quickstart",
            TrainModel::Mlp => "mlp",
            TrainModel::Resnet18 => "resnet18",
        }
    }

    /// The largest ratio of shardc's step time to PyTorch's that meets the issue's target.
    pub fn target_ratio(self) -> f64 {
        match self {
            TrainModel::Quickstart => 0.5,
            TrainModel::Mlp | TrainModel::Resnet18 => 1.0,
        }
    }

    /// The batch size measured: the quickstart net's own 16, `batch` for the others.
    pub fn batch(self, batch: usize) -> usize {
        match self {
            TrainModel::Quickstart => 16,
            TrainModel::Mlp | TrainModel::Resnet18 => batch,
        }
    }

    /// (untimed warm-up steps, timed steps) by default.
    fn default_steps(self, quick: bool) -> (usize, usize) {
        match (self, quick) {
            (TrainModel::Quickstart, false) => (20, 200),
            (TrainModel::Quickstart, true) => (5, 50),
            (TrainModel::Mlp, false) => (5, 50),
            (TrainModel::Mlp, true) => (2, 10),
            (TrainModel::Resnet18, false) => (2, 10),
            (TrainModel::Resnet18, true) => (1, 3),
        }
    }

    /// The zoo's forward graph (with its loss) at `batch` and the model's optimizer.
    pub fn forward_and_optimizer(
        self,
        batch: usize,
    ) -> Result<(Graph, shardc_passes::autodiff::Optimizer)> {
        Ok(match self {
            TrainModel::Quickstart => (zoo::quickstart(16)?, Momentum::new(0.2, 0.1).to_spec()),
            TrainModel::Mlp => (
                zoo::mlp(batch, &[784, 512, 512, 10])?,
                SGD::new(0.01).to_spec(),
            ),
            TrainModel::Resnet18 => (
                zoo::resnet18_cifar(batch)?,
                Momentum::new(0.01, 0.9).to_spec(),
            ),
        })
    }

    /// The training graph: the zoo's forward graph compiled with the model's optimizer.
    pub fn training_graph(self, batch: usize) -> Result<Graph> {
        let (forward, optimizer) = self.forward_and_optimizer(batch)?;
        let opts = CompileOptions {
            optimizer: Some(optimizer),
            dump_dir: None,
            ..Default::default()
        };
        Ok(compile(forward, &opts)
            .with_context(|| format!("compiling the {} training step", self.name()))?
            .graph)
    }
}

/// Arguments of `shardc bench`.
#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// What to measure.
    #[arg(value_enum, default_value_t = BenchWhat::All)]
    pub what: BenchWhat,
    /// Thread counts, comma-separated: each case runs once per count, on both sides.
    #[arg(long, value_delimiter = ',', value_parser = parse_positive, default_value = "1,2")]
    pub threads: Vec<usize>,
    /// Fewer repetitions and steps (a smoke run; figures are noisier).
    #[arg(long)]
    pub quick: bool,
    /// GEMM sizes n (n×n times n×n), comma-separated.
    #[arg(long, value_delimiter = ',', value_parser = parse_positive, default_value = "256,512,1024,2048")]
    pub sizes: Vec<usize>,
    /// Models of the training benchmark, comma-separated (default: all).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub models: Vec<TrainModel>,
    /// Batch size of the MLP and ResNet-18 (the quickstart net keeps its batch of 16).
    #[arg(long, value_parser = parse_positive, default_value_t = 32)]
    pub batch: usize,
    /// Timed training steps per case (default: 200 quickstart, 50 MLP, 10 ResNet-18; fewer
    /// with --quick).
    #[arg(long, value_parser = parse_positive)]
    pub steps: Option<usize>,
    /// After each training case, print where shardc's time went (per op kind, on stderr).
    #[arg(long)]
    pub stats: bool,
    /// Training cases (CPU and `bench gpu`): rounds of both sides, alternating (shardc, then
    /// the reference); each
    /// side's figure is its best round's median (default 3; 1 with --quick). This machine's
    /// speed drifts over seconds, and one round may catch one side in a slow phase.
    #[arg(long, value_parser = parse_positive)]
    pub rounds: Option<usize>,
    /// Measure shardc only, without numpy and PyTorch.
    #[arg(long)]
    pub no_reference: bool,
    /// Never create the reference's virtual environment: without it, measure shardc only.
    #[arg(long)]
    pub no_setup: bool,
    /// The directory holding `reference.py` and `setup_venv.sh` (default: `bench/` of the
    /// checkout containing the current directory, else of the one shardc was built from).
    #[arg(long)]
    pub bench_dir: Option<PathBuf>,
    /// The Python interpreter of the reference side (default: `.venv/bin/python` of the bench
    /// directory, made by `setup_venv.sh`); e.g. `--python python3` on a machine whose system
    /// Python already has PyTorch.
    #[arg(long)]
    pub python: Option<PathBuf>,
    /// `train` with more than one rank: data-parallel training in this many worker processes
    /// against PyTorch DDP (gloo) in as many (models mlp and resnet18; `--batch` per rank).
    #[arg(long, value_parser = parse_positive, default_value_t = 1)]
    pub ranks: usize,
    /// Gradient bucket size of the data-parallel benchmark in MB, on both sides (shardc's
    /// `comm_fusion` size mode, DDP's `bucket_cap_mb`; DDP's default 25).
    #[arg(long, default_value_t = 25.0)]
    pub bucket_mb: f64,
    /// `calibrate`: where to write the device description.
    /// `bench plans`: the machine the plans are priced on, a preset (cpu, 8xh100,
    /// ascend910) or a device description file (default: cpu, as `shardc compile`).
    #[arg(long)]
    pub device: Option<String>,
    #[arg(long, default_value = "device.toml")]
    pub device_file: PathBuf,
    /// Untimed warm-up steps of a data-parallel worker (set by the parent).
    #[arg(long, hide = true, default_value_t = 0)]
    pub warmup: usize,
    /// Run as one worker of the data-parallel benchmark on this artifact (set by the parent).
    #[arg(long, hide = true)]
    pub worker_artifact: Option<PathBuf>,
    /// `shardc bench collectives`: AllReduce between processes against gloo and Open MPI
    /// (its own options: `shardc bench collectives --help`).
    #[command(subcommand)]
    pub sub: Option<bench_collectives::BenchSubcommand>,
}

impl Default for BenchArgs {
    fn default() -> Self {
        BenchArgs {
            what: BenchWhat::All,
            threads: vec![1, 2],
            quick: false,
            sizes: vec![256, 512, 1024, 2048],
            models: Vec::new(),
            batch: 32,
            steps: None,
            stats: false,
            rounds: None,
            no_reference: false,
            no_setup: false,
            bench_dir: None,
            python: None,
            ranks: 1,
            bucket_mb: 25.0,
            device: None,
            device_file: PathBuf::from("device.toml"),
            warmup: 0,
            worker_artifact: None,
            sub: None,
        }
    }
}

/// A positive integer argument.
fn parse_positive(s: &str) -> std::result::Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(v) => Ok(v),
        Err(e) => Err(format!("'{s}' is not a positive integer: {e}")),
    }
}

/// Runs `shardc bench`: measures each case on shardc's side and then on the reference's,
/// printing one line per case with the ratio and whether it meets the issue's target.
pub fn run_bench(args: &BenchArgs) -> Result<()> {
    if let Some(bench_collectives::BenchSubcommand::Collectives(c)) = &args.sub {
        return bench_collectives::run(c);
    }
    if args.what == BenchWhat::Train && (args.ranks > 1 || args.worker_artifact.is_some()) {
        return bench_ddp::run(args);
    }
    if args.what == BenchWhat::Calibrate {
        return bench_calibrate::run(args);
    }
    if args.what == BenchWhat::Search {
        return bench_search::run(args);
    }
    if args.what == BenchWhat::Compile {
        return bench_compile::run(&bench_compile::CompileBench::standard(args.quick)).map(drop);
    }
    if args.what == BenchWhat::Strategies {
        return bench_strategies::run(args);
    }
    if args.what == BenchWhat::Plans {
        return bench_plans::run(args);
    }
    if args.what == BenchWhat::Gpu {
        return bench_gpu::run(args);
    }
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

// --- measurement ------------------------------------------------------------------------------

/// The median of `samples` (which must not be empty).
fn median(samples: &mut [Duration]) -> Duration {
    samples.sort_unstable();
    let n = samples.len();
    if n % 2 == 1 {
        samples[n / 2]
    } else {
        (samples[n / 2 - 1] + samples[n / 2]) / 2
    }
}

/// Median wall time of `f` after one warm-up call, and the number of timed runs: at least 5
/// runs and 0.5 s in all (`quick`: 3 runs and 0.1 s) — the same rule as `reference.py`.
fn repeat(quick: bool, mut f: impl FnMut() -> Result<()>) -> Result<(Duration, usize)> {
    f()?;
    let (min_runs, min_total) = if quick {
        (3, Duration::from_millis(100))
    } else {
        (5, Duration::from_millis(500))
    };
    let mut samples = Vec::new();
    let mut total = Duration::ZERO;
    while samples.len() < min_runs || total < min_total {
        let t = Instant::now();
        f()?;
        let d = t.elapsed();
        samples.push(d);
        total += d;
    }
    let runs = samples.len();
    Ok((median(&mut samples), runs))
}

/// Deterministic pseudo-random values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            ((s.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

// --- gemm -------------------------------------------------------------------------------------

/// shardc's GFLOP/s for an n×n×n f32 product on `threads` threads.
pub(crate) fn shardc_gemm(n: usize, threads: usize, quick: bool) -> Result<f64> {
    let a = values(n * n, 1);
    let b = values(n * n, 2);
    let mut c = vec![0f32; n * n];
    let mut run = || -> Result<(Duration, usize)> {
        repeat(quick, || {
            sgemm(
                n,
                n,
                n,
                MatRef::new(&a, n),
                MatRef::new(&b, n),
                &mut c,
                threads,
            )
            .with_context(|| format!("sgemm n={n}"))
        })
    };
    let (t, _) = if threads == 1 {
        run()?
    } else {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .with_context(|| format!("starting a rayon pool of {threads} threads"))?
            .install(run)?
    };
    Ok(2.0 * (n as f64).powi(3) / t.as_secs_f64() / 1e9)
}

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

// --- training steps ---------------------------------------------------------------------------

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

/// Milliseconds with three significant digits at least.
pub(crate) fn ms(v: f64) -> String {
    if v < 1.0 {
        format!("{v:.3}")
    } else {
        format!("{v:.2}")
    }
}

// --- the reference process --------------------------------------------------------------------

/// One `ref=...` line of `reference.py`.
#[derive(Debug, Clone, PartialEq)]
struct RefLine {
    /// The line as printed.
    raw: String,
    /// Its `key=value` words.
    fields: HashMap<String, String>,
}

impl RefLine {
    fn parse(raw: &str) -> RefLine {
        let fields = raw
            .split_whitespace()
            .filter_map(|w| w.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        RefLine {
            raw: raw.to_string(),
            fields,
        }
    }

    fn field(&self, key: &str) -> Option<&str> {
        self.fields.get(key).map(String::as_str)
    }

    fn number(&self, key: &str) -> Result<f64> {
        let v = self
            .field(key)
            .ok_or_else(|| anyhow!("reference.py printed no `{key}=` in `{}`", self.raw))?;
        v.parse()
            .with_context(|| format!("reference.py printed `{key}={v}` in `{}`", self.raw))
    }
}

/// `reference.py serve`, running.
struct Reference {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl Reference {
    /// Sends one command and collects its result lines (up to `ref=done`).
    fn query(&mut self, command: &str) -> Result<Vec<RefLine>> {
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| anyhow!("the reference process's input is closed"))?;
        writeln!(stdin, "{command}")
            .and_then(|()| stdin.flush())
            .context("sending a command to reference.py (did it exit? see its messages above)")?;
        let mut lines = Vec::new();
        let mut error = None;
        loop {
            let mut buf = String::new();
            let read = self
                .stdout
                .read_line(&mut buf)
                .context("reading reference.py's output")?;
            if read == 0 {
                bail!("reference.py exited while answering `{command}` (see its messages above)");
            }
            let text = buf.trim_end();
            if text == "ref=done" {
                // Every answer ends here, an error's too: the next query starts clean.
                return match error {
                    Some(msg) => Err(anyhow!("reference.py failed on `{command}`: {msg}")),
                    None => Ok(lines),
                };
            }
            if let Some(msg) = text.strip_prefix("ref=error message=") {
                error = Some(msg.to_string());
            } else if text.starts_with("ref=") {
                lines.push(RefLine::parse(text));
            } else if !text.is_empty() {
                eprintln!("reference.py: {text}");
            }
        }
    }

    /// Closes the input and waits for the process to end.
    fn finish(mut self) -> Result<()> {
        drop(self.stdin.take());
        let status = self.child.wait().context("waiting for reference.py")?;
        if !status.success() {
            bail!("reference.py ended with {status}");
        }
        Ok(())
    }
}

impl Drop for Reference {
    fn drop(&mut self) {
        // Only reached without `finish` (on an error): do not leave the process behind.
        if self.stdin.take().is_some() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The `bench/` directory: `--bench-dir`, else `bench/` of the nearest ancestor of the current
/// directory that has `bench/reference.py`, else the one next to this crate's sources.
pub(crate) fn bench_dir(args: &BenchArgs) -> Result<PathBuf> {
    if let Some(dir) = &args.bench_dir {
        if dir.join("reference.py").is_file() {
            return Ok(dir.clone());
        }
        bail!("--bench-dir {}: no reference.py there", dir.display());
    }
    if let Ok(cwd) = std::env::current_dir() {
        for dir in cwd.ancestors() {
            let candidate = dir.join("bench");
            if candidate.join("reference.py").is_file() {
                return Ok(candidate);
            }
        }
    }
    let built = Path::new(env!("CARGO_MANIFEST_DIR")).join("../bench");
    if built.join("reference.py").is_file() {
        return Ok(built);
    }
    bail!(
        "no bench/reference.py found above the current directory or at {}; pass --bench-dir, or --no-reference to measure shardc only",
        built.display()
    )
}

/// The reference side's Python: `--python`, else the bench directory's `.venv/bin/python`.
pub(crate) fn reference_python(args: &BenchArgs, dir: &Path) -> PathBuf {
    args.python
        .clone()
        .unwrap_or_else(|| dir.join(".venv/bin/python"))
}

/// Starts `reference.py serve` in the virtual environment, creating it first if needed
/// (`None` when it is missing and `--no-setup` forbids creating it).
fn start_reference(args: &BenchArgs) -> Result<Option<Reference>> {
    let dir = bench_dir(args)?;
    let python = reference_python(args, &dir);
    if args.python.is_none() && !python.is_file() {
        if args.no_setup {
            eprintln!(
                "{} is missing and --no-setup is given: measuring shardc only (run {} to compare against numpy and PyTorch)",
                python.display(),
                dir.join("setup_venv.sh").display()
            );
            return Ok(None);
        }
        let script = dir.join("setup_venv.sh");
        eprintln!(
            "the reference side (numpy, PyTorch) is not installed yet: running {} (creates {}, downloads about 5.5 GB once) ...",
            script.display(),
            dir.join(".venv").display()
        );
        let status = Command::new("bash")
            .arg(&script)
            .stdout(Stdio::from(std::io::stderr()))
            .status()
            .with_context(|| format!("running {}", script.display()))?;
        if !status.success() || !python.is_file() {
            bail!(
                "{} failed ({status}); pass --no-reference to measure shardc only",
                script.display()
            );
        }
    }
    let max_threads = args.threads.iter().copied().max().unwrap_or(1);
    let mut command = Command::new(&python);
    command
        .arg(dir.join("reference.py"))
        .arg("serve")
        .arg("--threads")
        .arg(max_threads.to_string())
        // Set on some machines; they make OpenBLAS pick slower kernels (reference.py removes
        // them as well, for direct use).
        .env_remove("OPENBLAS_CORETYPE")
        .env_remove("OPENBLAS_L2_SIZE");
    let what = format!(
        "{} {}",
        python.display(),
        dir.join("reference.py").display()
    );
    Reference::spawn(command, &what).map(Some)
}

impl Reference {
    /// Starts `command` (a `reference.py serve` process) with piped input and output.
    fn spawn(mut command: Command, what: &str) -> Result<Reference> {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting {what}"))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            let _ = child.wait();
            bail!("{what} started without its pipes");
        };
        Ok(Reference {
            child,
            stdin: Some(stdin),
            stdout: BufReader::new(stdout),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchArgs,
    }

    #[test]
    fn arguments_parse_and_reject_zero_threads() {
        let cli =
            Cli::try_parse_from(["x", "train", "--threads", "1,4", "--models", "mlp,resnet18"])
                .expect("valid arguments");
        assert_eq!(cli.bench.what, BenchWhat::Train);
        assert_eq!(cli.bench.threads, vec![1, 4]);
        assert_eq!(
            cli.bench.models,
            vec![TrainModel::Mlp, TrainModel::Resnet18]
        );
        let cli = Cli::try_parse_from(["x"]).expect("defaults");
        assert_eq!(cli.bench.what, BenchWhat::All);
        assert_eq!(cli.bench.threads, vec![1, 2]);
        assert_eq!(cli.bench.sizes, vec![256, 512, 1024, 2048]);
        let err = Cli::try_parse_from(["x", "gemm", "--threads", "0"])
            .err()
            .expect("zero threads is refused");
        assert_eq!(err.exit_code(), 2);
        assert!(Cli::try_parse_from(["x", "gemm", "--sizes", "12a"]).is_err());
    }

    #[test]
    fn reference_lines_parse() {
        let l = RefLine::parse("ref=torch gemm f32 n=512 threads=1 gflops=160.3 ms=1.675 runs=299");
        assert_eq!(l.field("ref"), Some("torch"));
        assert_eq!(l.number("gflops").expect("a number"), 160.3);
        assert!(l.number("step_ms").is_err());
        let bad = RefLine::parse("ref=torch gflops=fast");
        assert!(bad.number("gflops").is_err());
    }

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
    fn median_of_odd_and_even_counts() {
        let ms = Duration::from_millis;
        assert_eq!(median(&mut [ms(3), ms(1), ms(2)]), ms(2));
        assert_eq!(
            median(&mut [ms(4), ms(1), ms(2), ms(3)]),
            Duration::from_micros(2500)
        );
    }

    #[test]
    fn our_gemm_measures_a_positive_rate() {
        let rate = shardc_gemm(64, 1, true).expect("sgemm runs");
        assert!(rate.is_finite() && rate > 0.0);
        let rate = shardc_gemm(64, 2, true).expect("sgemm runs on a pool");
        assert!(rate.is_finite() && rate > 0.0);
    }

    /// A stand-in for `reference.py serve`: answers `gemm` with one torch line, anything
    /// else with an error, and exits on `quit` without answering.
    fn fake_reference() -> Reference {
        let script = r#"
while IFS= read -r line; do
  case "$line" in
    gemm*) echo "note: not a result line"; echo "ref=torch gemm f32 n=8 threads=1 gflops=12.5 ms=0.1 runs=5";;
    quit) exit 3;;
    *) echo "ref=error message=unknown command: $line";;
  esac
  echo ref=done
done
"#;
        let mut command = Command::new("sh");
        command.arg("-c").arg(script);
        Reference::spawn(command, "a fake reference").expect("sh starts")
    }

    #[test]
    fn the_serve_protocol_collects_lines_and_reports_errors() {
        let mut r = fake_reference();
        let lines = r.query("gemm --sizes 8 --threads 1").expect("an answer");
        assert_eq!(lines.len(), 1);
        assert_eq!(lines[0].number("gflops").expect("gflops"), 12.5);
        let err = r.query("train --model x").expect_err("an error line");
        assert!(
            err.to_string().contains("unknown command: train --model x"),
            "{err}"
        );
        // Still usable after an error; a clean end of input is a clean exit.
        assert_eq!(r.query("gemm").expect("an answer").len(), 1);
        r.finish().expect("exit status 0");

        let mut r = fake_reference();
        let err = r
            .query("quit")
            .expect_err("the process exits without answering");
        assert!(
            err.to_string().contains("exited while answering `quit`"),
            "{err}"
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

    #[test]
    fn a_missing_bench_dir_is_an_error() {
        let args = BenchArgs {
            bench_dir: Some(PathBuf::from("/nonexistent/bench")),
            ..BenchArgs::default()
        };
        let err = bench_dir(&args).expect_err("no reference.py there");
        assert!(err.to_string().contains("/nonexistent/bench"), "{err}");
    }
}
