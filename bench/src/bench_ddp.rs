//! `shardc bench train --ranks N`: data-parallel training in N worker processes against
//! PyTorch DDP over gloo in N processes (`bench/train/ddp.py`), the same models, batch per rank,
//! optimizer and step counts, measured the same way.
//!
//! shardc's side: the model is compiled for `data_parallel` over N devices (global batch N ×
//! the batch per rank, `gradients_mean`, the gradients fused into buckets of `--bucket-mb`
//! MB, DDP's `bucket_cap_mb` on the reference side, 25 by default); a scheduler and N workers are started as `shardc launch` starts them (shared-memory
//! collectives), each worker being this executable again in worker mode
//! (`--worker-artifact`). Each worker runs its rank's graph with one kernel thread on its own
//! synthetic batch. Every step is timed on every rank; a step's figure is the slowest rank's
//! (an AllReduce MAX after the loop); the step time is the median. Rank 0 also reports how much
//! of the gradient communication was hidden behind the backward pass.
//!
//! Output, one line per model:
//!
//! ```text
//! train-dp mlp ranks=2 batch=32/rank shardc=4.10 ms torch-ddp=10.74 ms ratio=0.38 (target <= 1.0: met) gradient comm 0.61 ms/step, 83% hidden
//! ```

use crate::args::{BenchArgs, TrainModel};
use crate::measure::ms;
use crate::reference::{bench_dir, reference_python};
use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use shardc_backend_cpu::CpuBackend;
use shardc_compiler::pipeline::{compile, CompileOptions};
use shardc_ir::artifact::{Artifact, Manifest};
use shardc_ir::ReduceOp;
use shardc_passes::grad_fusion::GradFusion;
use shardc_passes::parallel::{DatasetLayout, Mode, ParallelOptions};
use shardc_runtime::data::SyntheticData;
use shardc_runtime::executor::Executor;
use shardc_runtime::launcher::{self, LaunchOptions};
use shardc_runtime::Tensor;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What a worker reports (rank 0's line on stdout).
#[derive(Debug, Serialize, Deserialize)]
struct WorkerReport {
    impl_: String,
    model: String,
    ranks: usize,
    batch: usize,
    steps: usize,
    step_ms: f64,
    loss: f64,
    buckets: usize,
    grad_comm_ms: f64,
    grad_wait_ms: f64,
    hidden_fraction: f64,
}

/// The reference's line.
#[derive(Debug, Deserialize)]
struct DdpReport {
    step_ms: f64,
}

/// `shardc bench train --ranks N` (N ≥ 2).
pub fn run(args: &BenchArgs) -> Result<()> {
    if let Some(artifact) = &args.worker_artifact {
        return worker(args, artifact);
    }
    let ranks = args.ranks;
    if !(args.bucket_mb.is_finite() && args.bucket_mb > 0.0) {
        bail!(
            "--bucket-mb {}: a bucket size in MB must be positive",
            args.bucket_mb
        );
    }
    let models: Vec<TrainModel> = if args.models.is_empty() {
        vec![TrainModel::Mlp, TrainModel::Resnet18]
    } else {
        args.models.clone()
    };
    let python = if args.no_reference {
        None
    } else {
        let dir = bench_dir(args)?;
        let py = reference_python(args, &dir);
        if args.python.is_some() || py.is_file() {
            Some((py, dir.join("train/ddp.py")))
        } else {
            eprintln!(
                "{} is missing: measuring shardc only (run {} for the PyTorch DDP side)",
                py.display(),
                dir.join("setup_venv.sh").display()
            );
            None
        }
    };
    let exe = std::env::current_exe().context("locating the shardc executable")?;
    for model in models {
        if model == TrainModel::Quickstart {
            bail!("--ranks {ranks}: the data-parallel benchmark measures mlp and resnet18 (the quickstart net is the auto-parallel example)");
        }
        let batch = args.batch;
        let (warmup, steps) = match (model, args.quick) {
            (TrainModel::Resnet18, false) => (2, 8),
            (TrainModel::Resnet18, true) => (1, 3),
            (_, false) => (5, 50),
            (_, true) => (2, 10),
        };
        let steps = args.steps.unwrap_or(steps);
        let dir = std::env::temp_dir().join(format!(
            "shardc-bench-train-{}-{}",
            model.name(),
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        eprintln!(
            "compiling {} data parallel over {ranks} ranks (batch {batch} per rank) ...",
            model.name()
        );
        let art = dir.join("artifact");
        write_artifact(model, batch, ranks, args.bucket_mb, &art)?;
        eprintln!(
            "measuring {} on {ranks} worker processes ({warmup} warm-up + {steps} steps) ...",
            model.name()
        );
        let ours = launch_workers(&exe, &art, &dir, ranks, warmup, steps, model, batch)?;
        let torch = match &python {
            Some((py, script)) => Some(ddp(
                py,
                script,
                model,
                (ranks, batch, args.bucket_mb),
                warmup,
                steps,
            )?),
            None => None,
        };
        let mut line = format!(
            "train-dp {} ranks={ranks} batch={batch}/rank shardc={} ms",
            model.name(),
            ms(ours.step_ms)
        );
        match torch {
            Some(t) if t > 0.0 => {
                let ratio = ours.step_ms / t;
                let verdict = if ratio <= 1.0 { "met" } else { "missed" };
                line.push_str(&format!(
                    " torch-ddp={} ms ratio={ratio:.2} (target <= 1.0: {verdict})",
                    ms(t)
                ));
            }
            _ => line.push_str(" torch-ddp=n/a"),
        }
        line.push_str(&format!(
            " gradient comm {} buckets {} ms/step, {:.0}% hidden",
            ours.buckets,
            ms(ours.grad_comm_ms),
            ours.hidden_fraction * 100.0
        ));
        println!("{line}");
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}

/// Compiles `model` for data parallel over `ranks` devices into an artifact at `dir`.
fn write_artifact(
    model: TrainModel,
    batch: usize,
    ranks: usize,
    bucket_mb: f64,
    dir: &Path,
) -> Result<()> {
    let (forward, optimizer) = model.forward_and_optimizer(batch * ranks)?;
    let opts = CompileOptions {
        optimizer: Some(optimizer),
        parallel: Some(ParallelOptions {
            mode: Mode::DataParallel,
            device_num: ranks,
            dataset: DatasetLayout::DataParallel,
            gradients_mean: true,
            enable_alltoall: false,
            search: Default::default(),
            parallel_optimizer: None,
        }),
        grad_fusion: Some(GradFusion::SizeMb(bucket_mb)),
        ..Default::default()
    };
    let compiled = compile(forward, &opts)
        .with_context(|| format!("compiling {} for {ranks} ranks", model.name()))?;
    let program = compiled
        .parallel
        .map(|p| p.program)
        .ok_or_else(|| anyhow!("compiling for {ranks} ranks gave one graph"))?;
    let manifest = Manifest {
        format_version: shardc_ir::artifact::FORMAT_VERSION,
        shardc_version: env!("CARGO_PKG_VERSION").to_string(),
        model: model.name().to_string(),
        device_num: ranks as u32,
        parallel_mode: "data_parallel".into(),
        program: shardc_ir::artifact::PROGRAM_FILE.into(),
        ranks: Vec::new(),
        inputs: Vec::new(),
        outputs: vec!["loss".into()],
        optimizer: None,
        extra: serde_json::Map::new(),
    };
    Artifact { manifest, program }.write(dir, &[])?;
    Ok(())
}

/// Starts a scheduler and `ranks` workers on this host and returns rank 0's report.
#[allow(clippy::too_many_arguments)]
fn launch_workers(
    exe: &Path,
    art: &Path,
    dir: &Path,
    ranks: usize,
    warmup: usize,
    steps: usize,
    model: TrainModel,
    batch: usize,
) -> Result<WorkerReport> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .context("finding a free port for the scheduler")?
        .port();
    let token: String = (0..32)
        .map(|i| {
            format!(
                "{:02x}",
                (std::process::id() as u64 ^ (port as u64) << i).wrapping_mul(0x9E37_79B9_7F4A_7C15)
                    as u8
            )
        })
        .collect();
    let log = dir.join("log");
    let opts = LaunchOptions {
        worker_num: ranks,
        local_worker_num: ranks,
        master_addr: "127.0.0.1".into(),
        master_port: port,
        node_rank: None,
        log_dir: log.clone(),
        join: true,
        cluster_time_out: 60,
        scheduler_command: vec![exe.into(), "scheduler".into()],
        program: vec![
            exe.into(),
            "bench".into(),
            "train".into(),
            "--ranks".into(),
            ranks.to_string().into(),
            "--models".into(),
            model.name().into(),
            "--batch".into(),
            batch.to_string().into(),
            "--steps".into(),
            steps.to_string().into(),
            "--warmup".into(),
            warmup.to_string().into(),
            "--worker-artifact".into(),
            art.into(),
        ],
        env: vec![("SHARDC_CLUSTER_TOKEN".into(), token)],
    };
    let launched = launcher::start(&opts)?;
    let outcome = launcher::wait(
        launched,
        &launcher::WaitOptions {
            grace: Duration::from_secs(5),
            ..launcher::WaitOptions::default()
        },
    );
    if outcome.status != 0 {
        bail!(
            "the shardc workers failed (status {}):\n{}",
            outcome.status,
            outcome.summary.join("\n")
        );
    }
    let out = std::fs::read_to_string(launcher::rank_log_dir(&log, 0).join("stdout"))
        .context("reading rank 0's report")?;
    let line = out
        .lines()
        .find(|l| l.starts_with('{'))
        .ok_or_else(|| anyhow!("rank 0 printed no report:\n{out}"))?;
    Ok(serde_json::from_str(line)?)
}

/// Runs `bench/train/ddp.py` and returns its step time in ms.
fn ddp(
    python: &Path,
    script: &Path,
    model: TrainModel,
    (ranks, batch, bucket_mb): (usize, usize, f64),
    warmup: usize,
    steps: usize,
) -> Result<f64> {
    eprintln!(
        "measuring {} with PyTorch DDP (gloo) on {ranks} processes ...",
        model.name()
    );
    let out = Command::new(python)
        .arg(script)
        .args(["--model", model.name()])
        .args(["--ranks", &ranks.to_string()])
        .args(["--batch", &batch.to_string()])
        .args(["--steps", &steps.to_string()])
        .args(["--warmup", &warmup.to_string()])
        .args(["--threads", "1"])
        .args(["--bucket-mb", &bucket_mb.to_string()])
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().find(|l| l.starts_with('{')).ok_or_else(|| {
        anyhow!(
            "{} printed no result ({}):\n{}",
            script.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    let r: DdpReport = serde_json::from_str(line)?;
    Ok(r.step_ms)
}

/// One worker of the benchmark (started by [`launch_workers`] through the launcher).
fn worker(args: &BenchArgs, artifact: &Path) -> Result<()> {
    let role = shardc_tools::cluster_run::role_from_env(shardc_tools::run_args::CommKind::Native)?
        .ok_or_else(|| anyhow!("--worker-artifact: not started by the launcher (no MS_ROLE)"))?;
    if let shardc_tools::cluster_run::ClusterRole::Scheduler(_) = role {
        return shardc_tools::cluster_run::scheduler_main();
    }
    let joined = shardc_tools::cluster_run::join(role)?;
    let result = measure(args, artifact, &joined);
    let status = i32::from(result.is_err());
    let finished = joined.finish(status);
    let report = result?;
    finished?;
    if let Some(r) = report {
        println!("{}", serde_json::to_string(&r)?);
    }
    Ok(())
}

fn measure(
    args: &BenchArgs,
    artifact: &Path,
    joined: &shardc_tools::cluster_run::Joined,
) -> Result<Option<WorkerReport>> {
    let (rank, size) = (joined.rank, joined.size);
    let art = Artifact::read(artifact)?;
    let graph = art.rank_graph(rank)?;
    let data = SyntheticData::new(&graph, 1 + rank as u64, 1)?;
    let mut exec = Executor::with_communicator(
        graph,
        Arc::new(CpuBackend::with_threads(1)),
        joined.comm.clone(),
    )?;
    let warmup = args.warmup;
    let steps = args.steps.unwrap_or(10);
    let mut samples = Vec::with_capacity(steps);
    let mut loss = f64::NAN;
    let mut comm_before = Default::default();
    for step in 0..warmup + steps {
        if step == warmup {
            comm_before = exec.stats().gradient_comm.clone();
        }
        let feeds = data.feeds(0);
        let t = Instant::now();
        let out = exec.step(&feeds)?;
        if step >= warmup {
            samples.push(t.elapsed().as_secs_f64());
        }
        loss = out
            .first()
            .and_then(Tensor::scalar_value)
            .unwrap_or(f64::NAN);
    }
    // The slowest rank's time of every step.
    let mut worst = Tensor::from_f64(vec![samples.len()], samples)
        .ok_or_else(|| anyhow!("packing the step times"))?;
    let group: Vec<usize> = (0..size).collect();
    joined.comm.all_reduce(&group, ReduceOp::Max, &mut worst)?;
    let mut times = worst.to_f64_vec();
    times.sort_by(f64::total_cmp);
    let median = if times.is_empty() {
        f64::NAN
    } else if times.len() % 2 == 1 {
        times[times.len() / 2]
    } else {
        (times[times.len() / 2 - 1] + times[times.len() / 2]) / 2.0
    };
    if rank != 0 {
        return Ok(None);
    }
    let g = &exec.stats().gradient_comm;
    let timed = (g.steps - comm_before.steps).max(1) as f64;
    let comm = (g.comm - comm_before.comm).as_secs_f64();
    let wait = (g.wait - comm_before.wait).as_secs_f64();
    Ok(Some(WorkerReport {
        impl_: "shardc".into(),
        model: art.manifest.model.clone(),
        ranks: size,
        batch: args.batch,
        steps,
        step_ms: median * 1e3,
        loss,
        buckets: g.buckets,
        grad_comm_ms: comm / timed * 1e3,
        grad_wait_ms: wait / timed * 1e3,
        hidden_fraction: if comm > 0.0 {
            (1.0 - wait / comm).clamp(0.0, 1.0)
        } else {
            0.0
        },
    }))
}
