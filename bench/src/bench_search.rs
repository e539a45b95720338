//! `shardc bench search`: how fast the strategy searchers are, and what they find, on large
//! models and device counts (shardc only; MindSpore's figures on this machine class are in
//! the issue: 129 s to compile a 24-layer transformer for 512 devices with
//! `recursive_programming`).
//!
//! Cases: the 24-layer transformer (hidden 1024, 16 heads, sequence 512, batch 8) at 8, 64,
//! 512 and 4096 devices, and a generated graph of about 10⁵ training-step ops
//! ([`shardc_compiler::generated::generated_network`]) at 4096 devices, each with
//! `recursive_programming` (and `dynamic_programming` at 8 devices). No op is annotated:
//! `auto_parallel` decides everything. Per case, one line:
//!
//! - `train_step`: the single-device training step (types, autodiff), before any parallel
//!   stage;
//! - `search`: strategy assignment, the searcher included (the pipeline's `sync_bn` and
//!   `step_parallel_begin` passes; `search_only`: the searcher's own time as it reports it);
//! - `whole`: search + the program of every rank (the redistribution plan of every edge),
//!   gradient fusion and rank 0's graph materialized (the pipeline's passes to `execute`);
//! - `peak_rss`: the process's peak resident memory so far (`VmHWM`);
//! - op counts (training-step ops, rank 0's ops, rank 0's communication by kind), the
//!   predicted step (compute / communication, memory per device) and the goals: the
//!   24-layer / 512-device whole compile under 2 s, the 10⁵-op / 4096-device search under
//!   60 s, memory under 2 GiB.
//!
//! The machine is the `8xh100` preset (8 devices per host, NVLink within, InfiniBand
//! between), so that large device counts cross hosts as they would.
//!
//! Then the same through the command line users run ([`cli_compile`]): the 24-layer
//! transformer written as IR text, and `shardc compile FILE --device-num N --parallel-mode
//! auto_parallel --search-mode recursive_programming -o DIR` run as a child process at 512 and
//! 4096 devices (the CLI's default machine, the `cpu` preset), measuring its wall time (every
//! rank's program: search, partition, gradient fusion, artifact writing), its peak RSS and the
//! artifact's size on disk, against the goals: 512 devices under 2 s, 1 GiB and 64 MiB; 4096
//! devices under 4 s.

use crate::args::BenchArgs;
use anyhow::{Context, Result};
use shardc_compiler::optim::Momentum;
use shardc_compiler::pipeline::{compile, CompileOptions, Materialize};
use shardc_compiler::transformer::{transformer, TransformerConfig};
use shardc_ir::Graph;
use shardc_passes::parallel::{DatasetLayout, Mode, ParallelOptions, SearchMode, SearchOptions};
use std::collections::BTreeMap;
use std::time::Instant;

/// The goal for the 24-layer transformer at 512 devices, whole compile, seconds.
pub const GOAL_TRANSFORMER_512_SECONDS: f64 = 2.0;
/// The goal for the 10⁵-op graph at 4096 devices, search, seconds.
pub const GOAL_GENERATED_SECONDS: f64 = 60.0;
/// The memory goal, bytes.
pub const GOAL_MEMORY_BYTES: f64 = 2.0 * (1u64 << 30) as f64;
/// The goals of the command-line compile of the 24-layer transformer: (devices, seconds,
/// peak RSS bytes, artifact bytes); `None` where the issue sets none.
pub const GOAL_CLI: [(usize, f64, Option<f64>, Option<f64>); 2] = [
    (
        512,
        2.0,
        Some((1u64 << 30) as f64),
        Some((64u64 << 20) as f64),
    ),
    (4096, 4.0, None, None),
];

/// The process's peak resident set (`VmHWM`), bytes; 0 where `/proc` is missing.
pub fn peak_rss() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb * 1024.0)
}

/// The options of one case.
pub fn options(devices: usize, mode: SearchMode) -> ParallelOptions {
    ParallelOptions {
        mode: Mode::AutoParallel,
        device_num: devices,
        dataset: DatasetLayout::DataParallel,
        gradients_mean: true,
        enable_alltoall: false,
        search: SearchOptions {
            mode,
            machine: shardc_compiler::device::DeviceDescription::preset("8xh100")
                .map(|d| d.machine())
                .unwrap_or_default(),
            max_device_memory: None,
        },
        parallel_optimizer: None,
    }
}

/// The single-device training step of `forward` with `Momentum(0.01, 0.9)`.
pub fn training_step(forward: Graph) -> Result<Graph> {
    Ok(compile(
        forward,
        &CompileOptions {
            optimizer: Some(Momentum::new(0.01, 0.9).to_spec()),
            ..Default::default()
        },
    )
    .context("compiling the single-device training step")?
    .graph)
}

/// One case's figures.
#[derive(Clone, Debug)]
pub struct SearchCase {
    /// Assignment (with the search), seconds.
    pub search: f64,
    /// Search + edges + rank 0's graph, seconds.
    pub whole: f64,
    /// The line printed.
    pub line: String,
}

/// Measures one case on the training step `step`.
pub fn measure(name: &str, step: &Graph, devices: usize, mode: SearchMode) -> Result<SearchCase> {
    let opts = options(devices, mode);
    // The one pipeline on the training step (no optimizer: it is one already), rank 0
    // materialized; the times are the passes' own records.
    let compiled = compile(
        step.clone(),
        &CompileOptions {
            parallel: Some(opts),
            materialize: Materialize::Ranks(vec![0]),
            ..Default::default()
        },
    )
    .with_context(|| format!("{name}: {} on {devices} devices", mode.name()))?;
    let seconds = |names: &[&str]| -> f64 {
        compiled
            .stages
            .iter()
            .filter(|r| names.contains(&r.name))
            .map(|r| r.seconds)
            .sum()
    };
    let search = seconds(&["sync_bn", "step_parallel_begin"]);
    let whole = search + seconds(&["step_parallel_end", "grad_fusion", "execute"]);
    let p = compiled
        .parallel
        .as_ref()
        .context("a parallel compile has its plan")?;
    let (a, rank0) = (&p.assignment, &p.ranks[0]);
    let mut comm_rank0 = BTreeMap::new();
    for n in rank0.nodes.iter().filter(|n| n.op.is_communication()) {
        *comm_rank0.entry(n.op.name().to_string()).or_insert(0) += 1;
    }
    let r = a.search.as_ref().context("no search report")?;
    let comm: Vec<String> = comm_rank0
        .iter()
        .map(|(k, v)| format!("{k}: {v}"))
        .collect();
    let rss = peak_rss();
    let line = format!(
        "search {name} searcher={} devices={devices} ops={} rank0_ops={} comm_rank0={{{}}} \
         search={:.3} s (searcher {:.3} s) whole={:.3} s peak_rss={:.0} MiB predicted_step={:.3} ms \
         (compute {:.3} + communication {:.3}) memory/device={:.1} MiB exact={}{}",
        r.searcher,
        step.nodes.len(),
        rank0.nodes.len(),
        comm.join(", "),
        search,
        r.search_seconds,
        whole,
        rss / (1u64 << 20) as f64,
        r.predicted.seconds() * 1e3,
        r.predicted.compute * 1e3,
        r.predicted.communication * 1e3,
        r.predicted.memory / (1u64 << 20) as f64,
        r.exact,
        if r.notes.is_empty() {
            String::new()
        } else {
            format!(" notes: {}", r.notes.join("; "))
        }
    );
    Ok(SearchCase {
        search,
        whole,
        line,
    })
}

/// What one command-line compile took.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CliCompile {
    /// Wall time of the child process, seconds.
    pub seconds: f64,
    /// The child's peak resident set, bytes.
    pub peak_rss: f64,
    /// The artifact directory's size on disk, bytes.
    pub artifact_bytes: f64,
}

/// Runs `shardc compile ir --device-num devices --parallel-mode auto_parallel --search-mode
/// recursive_programming -o out` as a child process of this executable (`shardc`), and measures
/// it (wall time, peak RSS from `wait4`, the size of what it wrote).
pub fn cli_compile(
    ir: &std::path::Path,
    devices: usize,
    out: &std::path::Path,
) -> Result<CliCompile> {
    let exe = std::env::current_exe().context("finding the shardc executable")?;
    let _ = std::fs::remove_dir_all(out);
    let t = Instant::now();
    let child = std::process::Command::new(&exe)
        .arg("compile")
        .arg(ir)
        .args(["--device-num", &devices.to_string()])
        .args(["--parallel-mode", "auto_parallel"])
        .args(["--search-mode", "recursive_programming"])
        .arg("-o")
        .arg(out)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {} compile", exe.display()))?;
    let pid = child.id() as libc::pid_t;
    let mut stderr = child.stderr;
    let mut status = 0;
    // SAFETY: an all-zero `rusage` is a valid value of the plain C struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // The child's own usage (its peak RSS, not the largest of every child so far). Its
    // stderr is short (the error, if any), so waiting before reading it cannot block.
    // SAFETY: `pid` is our child, not yet waited for; `status` and `usage` are valid.
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    let seconds = t.elapsed().as_secs_f64();
    if r != pid {
        anyhow::bail!(
            "waiting for shardc compile ({devices} devices): {}",
            std::io::Error::last_os_error()
        );
    }
    if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
        let mut msg = String::new();
        if let Some(e) = stderr.as_mut() {
            use std::io::Read;
            let _ = e.read_to_string(&mut msg);
        }
        anyhow::bail!("shardc compile on {devices} devices failed (status {status}): {msg}");
    }
    Ok(CliCompile {
        seconds,
        peak_rss: usage.ru_maxrss as f64 * 1024.0,
        artifact_bytes: dir_bytes(out)? as f64,
    })
}

/// A directory under the system's temporary directory, removed when dropped.
struct ScratchDir(std::path::PathBuf);

impl ScratchDir {
    fn new() -> Result<ScratchDir> {
        let p = std::env::temp_dir().join(format!("shardc-bench-search-{}", std::process::id()));
        std::fs::create_dir_all(&p).with_context(|| format!("creating {}", p.display()))?;
        Ok(ScratchDir(p))
    }
    fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The bytes of every file under `dir`.
fn dir_bytes(dir: &std::path::Path) -> Result<u64> {
    let mut total = 0;
    for e in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let e = e?;
        let m = e.metadata()?;
        total += if m.is_dir() {
            dir_bytes(&e.path())?
        } else {
            m.len()
        };
    }
    Ok(total)
}

/// The command-line compiles of the 24-layer transformer ([`GOAL_CLI`]), one line each.
fn run_cli(cfg: &TransformerConfig) -> Result<()> {
    let dir = ScratchDir::new()?;
    let ir = dir.path().join("t24.ir");
    std::fs::write(&ir, shardc_ir::text::print_graph(&transformer(cfg)?))
        .with_context(|| format!("writing {}", ir.display()))?;
    let mib = |b: f64| b / (1u64 << 20) as f64;
    for (devices, secs, rss, size) in GOAL_CLI {
        let c = cli_compile(&ir, devices, &dir.path().join(format!("out{devices}")))?;
        let mut goals = vec![format!(
            "{:.3} s <= {secs} s: {}",
            c.seconds,
            verdict(c.seconds <= secs)
        )];
        if let Some(r) = rss {
            goals.push(format!(
                "peak_rss {:.0} MiB <= {:.0} MiB: {}",
                mib(c.peak_rss),
                mib(r),
                verdict(c.peak_rss <= r)
            ));
        }
        if let Some(a) = size {
            goals.push(format!(
                "artifact {:.1} MiB <= {:.0} MiB: {}",
                mib(c.artifact_bytes),
                mib(a),
                verdict(c.artifact_bytes <= a)
            ));
        }
        let mindspore = if devices == 512 {
            format!(
                " (MindSpore 2.10 recursive_programming: 129 s, ratio {:.1}x faster)",
                129.0 / c.seconds.max(1e-9)
            )
        } else {
            String::new()
        };
        println!(
            "cli shardc compile transformer_L{} devices={devices} --parallel-mode auto_parallel \
             --search-mode recursive_programming: whole={:.3} s peak_rss={:.0} MiB \
             artifact={:.1} MiB{mindspore}; goal {}",
            cfg.layers,
            c.seconds,
            mib(c.peak_rss),
            mib(c.artifact_bytes),
            goals.join(", ")
        );
    }
    Ok(())
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "missed"
    }
}

/// Runs `shardc bench search`.
pub fn run(args: &BenchArgs) -> Result<()> {
    let cfg = if args.quick {
        TransformerConfig::new(4, 1024, 16, 512, 8)
    } else {
        TransformerConfig::new(24, 1024, 16, 512, 8)
    };
    if cfg.layers == 24 {
        // First, while this process is small: a child's peak RSS starts from its parent's at
        // the fork.
        run_cli(&cfg)?;
    }
    let t = Instant::now();
    let step = training_step(transformer(&cfg)?)?;
    let name = format!("transformer_L{}_H1024_A16_S512_B8", cfg.layers);
    println!(
        "build {name}: {} training-step ops in {:.3} s (types, autodiff)",
        step.nodes.len(),
        t.elapsed().as_secs_f64()
    );
    for devices in [8usize, 64, 512, 4096] {
        let mut modes = vec![SearchMode::RecursiveProgramming];
        if devices <= 8 {
            modes.push(SearchMode::DynamicProgramming);
        }
        for mode in modes {
            let c = measure(&name, &step, devices, mode)?;
            println!("{}", c.line);
            if devices == 512 && mode == SearchMode::RecursiveProgramming && cfg.layers == 24 {
                println!(
                    "goal transformer_L24 512 devices whole compile {:.3} s <= {GOAL_TRANSFORMER_512_SECONDS} s: {} (MindSpore 2.10 recursive_programming: 129 s, ratio {:.1}x faster)",
                    c.whole,
                    verdict(c.whole <= GOAL_TRANSFORMER_512_SECONDS),
                    129.0 / c.whole.max(1e-9)
                );
            }
        }
    }
    let ops = if args.quick { 10_000 } else { 100_000 };
    let t = Instant::now();
    let forward = shardc_compiler::generated::generated_network(ops / 6, 256, 4096, 1)?;
    let step = training_step(forward)?;
    let name = format!("generated_{}ops", step.nodes.len());
    println!(
        "build {name}: {} training-step ops in {:.3} s",
        step.nodes.len(),
        t.elapsed().as_secs_f64()
    );
    let c = measure(&name, &step, 4096, SearchMode::RecursiveProgramming)?;
    println!("{}", c.line);
    println!(
        "goal generated {} ops 4096 devices search {:.3} s <= {GOAL_GENERATED_SECONDS} s: {}",
        step.nodes.len(),
        c.search,
        verdict(c.search <= GOAL_GENERATED_SECONDS)
    );
    let rss = peak_rss();
    println!(
        "goal peak memory {:.0} MiB <= 2048 MiB: {}",
        rss / (1u64 << 20) as f64,
        verdict(rss <= GOAL_MEMORY_BYTES)
    );
    Ok(())
}
