//! What the device command-line suites (`gpu_cli`, `ascend_cli`) share: reading the loss
//! lines, comparing them, a free port, and a launched job whose worker is killed.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

/// A fresh temporary folder for test `tag` of suite `suite` (removed if left over, not made).
pub fn tmp(suite: &str, tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("shardc-{suite}-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// `shardc compile models/quickstart.ir -o ART EXTRA...`, which must succeed.
pub fn compile_quickstart(art: &Path, extra: &[&str]) {
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/quickstart.ir");
    let c = Command::new(env!("CARGO_BIN_EXE_shardc"))
        .arg("compile")
        .arg(&model)
        .arg("-o")
        .arg(art)
        .args(extra)
        .output()
        .expect("the shardc binary runs");
    assert!(c.status.success(), "{}", text(&c));
}

/// `shardc ARGS...`, as it ended.
pub fn run_shardc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_shardc"))
        .args(args)
        .output()
        .expect("the shardc binary runs")
}

/// A path as the `&str` an argument list takes.
pub fn path_str(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 path")
}

/// A fresh temporary folder for test `tag` of suite `suite`, made.
pub fn made_tmp(suite: &str, tag: &str) -> PathBuf {
    let d = tmp(suite, tag);
    std::fs::create_dir_all(&d).expect("the test folder");
    d
}

/// `shardc ARGS...`, which must succeed: its stdout.
pub fn shardc_ok(args: &[&str]) -> String {
    let o = Command::new(env!("CARGO_BIN_EXE_shardc"))
        .args(args)
        .output()
        .expect("the shardc binary runs");
    assert!(o.status.success(), "{args:?}: {}", text(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The 2-layer transformer as text IR in `dir` ([`gen_transformer_layers`]).
pub fn gen_transformer(dir: &Path) -> PathBuf {
    gen_transformer_layers(dir, 2)
}

/// A transformer of `layers` layers as text IR in `dir` (made if missing; `shardc gen
/// transformer`), small enough for 2 cores: 8 sequences of 8 tokens, hidden 32, 2 heads.
pub fn gen_transformer_layers(dir: &Path, layers: usize) -> PathBuf {
    std::fs::create_dir_all(dir).expect("the test folder");
    let model = dir.join(format!("transformer{layers}.ir"));
    shardc_ok(&[
        "gen",
        "transformer",
        "--layers",
        &layers.to_string(),
        "--hidden",
        "32",
        "--heads",
        "2",
        "--seq",
        "8",
        "--batch",
        "8",
        "-o",
        model.to_str().expect("a UTF-8 path"),
    ]);
    model
}

/// `shardc launch` of 4 local workers running `shardc run ART ARGS...` with logs in `log`,
/// joined: its output.
pub fn launch_four(log: &Path, art: &Path, args: &[&str]) -> Output {
    let port = free_port().to_string();
    let mut all = vec![
        "launch",
        "--worker-num",
        "4",
        "--local-worker-num",
        "4",
        "--master-port",
        &port,
        "--log-dir",
        log.to_str().expect("a UTF-8 path"),
        "--join",
        "--",
        "shardc",
        "run",
        art.to_str().expect("a UTF-8 path"),
    ];
    all.extend_from_slice(args);
    Command::new(env!("CARGO_BIN_EXE_shardc"))
        .args(&all)
        .output()
        .expect("the shardc binary runs")
}

/// Rank `r`'s stdout in the log folder of a launch (empty while there is none).
pub fn rank_stdout(log: &Path, r: usize) -> String {
    std::fs::read_to_string(log.join(format!("1/rank.{r}/stdout"))).unwrap_or_default()
}

/// The flags of 2 pipeline stages × 2-way data parallel on 4 devices, 4 micro-batches.
pub const PIPELINE: &[&str] = &[
    "--device-num",
    "4",
    "--parallel-mode",
    "semi_auto_parallel",
    "--gradients-mean",
    "--pipeline-stages",
    "2",
    "--micro-size",
    "4",
];

/// [`gen_transformer`] compiled in `dir` for one device (`one`) and with [`PIPELINE`] and
/// `extra` (`pipe`): the artifacts' paths.
pub fn compile_pipelined_transformer(dir: &Path, extra: &[&str]) -> (PathBuf, PathBuf) {
    let model = gen_transformer(dir);
    let m = model.to_str().expect("a UTF-8 path");
    let (one, pipe) = (dir.join("one"), dir.join("pipe"));
    shardc_ok(&["compile", m, "-o", one.to_str().expect("a UTF-8 path")]);
    let mut args = vec!["compile", m, "-o", pipe.to_str().expect("a UTF-8 path")];
    args.extend_from_slice(PIPELINE);
    args.extend_from_slice(extra);
    shardc_ok(&args);
    (one, pipe)
}

/// A process's stdout then stderr.
pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The `epoch: E step: S, loss is L` values of a run's output.
pub fn losses(stdout: &str) -> Vec<f64> {
    stdout
        .lines()
        .filter_map(|l| l.split(", loss is ").nth(1))
        .map(|v| v.trim().parse::<f64>().expect("a loss value"))
        .collect()
}

/// The same losses to 1e-5 relative to max(|x|, 1).
pub fn same_losses(a: &[f64], b: &[f64], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: {a:?} vs {b:?}");
    assert!(!a.is_empty(), "{what}: no losses");
    for (x, y) in a.iter().zip(b) {
        assert!(
            (x - y).abs() <= 1e-5 * x.abs().max(1.0),
            "{what}: {a:?} vs {b:?}"
        );
    }
}

/// A TCP port free now on 127.0.0.1.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A `shardc launch --join` of `workers` workers (its stderr piped, logs under `log`):
/// once every rank printed 3 losses and rank 0's stderr says `ready`, rank 1 is killed
/// (SIGKILL); the job must end within 30 s with a failure, every other rank's stderr naming
/// rank 1.
pub fn killed_worker_ends_the_job(mut launcher: Child, log: &Path, workers: usize, ready: &str) {
    let mut err = BufReader::new(launcher.stderr.take().expect("stderr"));
    let mut victim = None;
    let mut seen = String::new();
    while victim.is_none() {
        let mut line = String::new();
        if err.read_line(&mut line).unwrap_or(0) == 0 {
            break;
        }
        seen += &line;
        if let Some(pid) = line.trim().strip_prefix("launch: started rank 1 (pid ") {
            victim = pid.trim_end_matches(')').parse::<i32>().ok();
        }
    }
    let victim = victim.unwrap_or_else(|| panic!("no pid for rank 1 in: {seen}"));
    let stdout = |r: usize| {
        std::fs::read_to_string(log.join(format!("1/rank.{r}/stdout"))).unwrap_or_default()
    };
    let stderr = |r: usize| {
        std::fs::read_to_string(log.join(format!("1/rank.{r}/stderr"))).unwrap_or_default()
    };
    // Training under way on every rank.
    let t0 = Instant::now();
    while (0..workers).any(|r| losses(&stdout(r)).len() < 3) {
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "training never started: {}",
            stderr(0)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(stderr(0).contains(ready), "{ready}: {}", stderr(0));
    let killed_at = Instant::now();
    assert!(Command::new("kill")
        .args(["-9", &victim.to_string()])
        .status()
        .expect("kill runs")
        .success());
    let limit = Duration::from_secs(60);
    let status = loop {
        if let Some(st) = launcher.try_wait().expect("waits") {
            break st;
        }
        if killed_at.elapsed() > limit {
            let _ = launcher.kill();
            let _ = launcher.wait();
            panic!("the job still ran {limit:?} after rank 1 was killed");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let took = killed_at.elapsed();
    assert!(!status.success());
    assert!(
        took < Duration::from_secs(30),
        "the job took {took:?} to end"
    );
    for r in (0..workers).filter(|&r| r != 1) {
        let e = stderr(r);
        assert!(e.contains("rank 1"), "rank {r}: {e}");
    }
}

/// A fixture of `tests/data/mindspore` (MindSpore 2.10's files: `make_ckpt.py`,
/// `make_mindir.py`).
pub fn mindspore_fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/mindspore")
        .join(name)
}

/// The losses MindSpore printed for steps 4-6 of the tutorial network
/// (`tests/data/mindspore/losses.txt`, one per line).
pub fn mindspore_losses() -> Vec<f64> {
    std::fs::read_to_string(mindspore_fixture("losses.txt"))
        .expect("losses.txt")
        .lines()
        .map(|l| l.trim().parse().expect("a loss"))
        .collect()
}

/// Every parallel mode and search mode `shardc compile` offers, as flags (data_parallel
/// first).
pub const EVERY_MODE: [&[&str]; 6] = [
    &["--parallel-mode", "data_parallel"],
    &["--parallel-mode", "semi_auto_parallel"],
    &[
        "--parallel-mode",
        "auto_parallel",
        "--search-mode",
        "sharding_propagation",
    ],
    &[
        "--parallel-mode",
        "auto_parallel",
        "--search-mode",
        "dynamic_programming",
    ],
    &[
        "--parallel-mode",
        "auto_parallel",
        "--search-mode",
        "recursive_programming",
    ],
    &["--parallel-mode", "auto_parallel", "--search-mode", "ilp"],
];
