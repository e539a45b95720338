//! The tutorials' examples as their users run them, at small sizes, with real processes: the
//! MNIST MLP data parallel on 4 ranks under `shardc launch` (both training styles) against one
//! device on the global batch; the CPU tutorial's `run_cpu_dp.sh` (ResNet-50 on CIFAR-10, a
//! scheduler and workers from the `MS_*` variables); the parallel quickstart on 8 ranks under
//! auto_parallel with its dumps and checkpoints.

use shardc::runtime::checkpoint;
use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn shardc_exe() -> &'static str {
    env!("CARGO_BIN_EXE_shardc")
}

/// An example binary built beside this test (`cargo test` / `cargo nextest` build them).
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test path");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps/..");
    let path = dir.join("examples").join(name);
    assert!(
        path.exists(),
        "{} is missing: build the examples (`cargo build --examples`)",
        path.display()
    );
    path
}

fn tmp(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("shardc-examples-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("tmp dir");
    d
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `shardc launch` of `workers` local workers with logs in `log`, joined; the program and its
/// arguments follow with `.arg`.
fn launch(workers: usize, log: &Path) -> Command {
    let mut c = Command::new(shardc_exe());
    let n = workers.to_string();
    c.args([
        "launch",
        "--worker-num",
        &n,
        "--local-worker-num",
        &n,
        "--join",
    ])
    .args(["--master-port", &free_port().to_string()])
    .arg("--log-dir")
    .arg(log)
    .arg("--");
    c
}

fn run(cmd: &mut Command) -> String {
    let o = cmd.output().expect("runs");
    let t = text(&o);
    assert!(o.status.success(), "{cmd:?} failed:\n{t}");
    t
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

fn losses(s: &str) -> Vec<f64> {
    s.lines()
        .filter_map(|l| l.split_once(", loss is ").map(|(_, v)| v))
        .map(|v| v.trim().parse().expect("a loss"))
        .collect()
}

/// The tensors of the only checkpoint file in `dir`.
fn tensors(dir: &Path) -> BTreeMap<String, Vec<f64>> {
    let files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    assert_eq!(files.len(), 1, "{}: {files:?}", dir.display());
    let cp = checkpoint::load(&files[0]).expect("a valid checkpoint");
    cp.tensors
        .into_iter()
        .map(|(n, t)| (n, t.to_f64_vec()))
        .collect()
}

/// `shardc ckpt merge` of the ranks' newest checkpoints in `ckpt` (with the strategy file
/// beside them), loaded.
fn merge(ckpt: &Path) -> checkpoint::Checkpoint {
    let merged = ckpt.with_extension("merged.safetensors");
    run(Command::new(shardc_exe())
        .args(["ckpt", "merge", "--strategy"])
        .arg(ckpt.join("strategy.json"))
        .arg("--input")
        .arg(ckpt)
        .arg("-o")
        .arg(&merged));
    checkpoint::load(&merged).expect("a merged checkpoint")
}

#[test]
fn mnist_data_parallel_on_4_processes_equals_one_device_in_both_styles() {
    let dir = tmp("mnist");
    let data = dir.join("mnist");
    run(Command::new(shardc_exe())
        .args(["data", "synth", "--format", "mnist", "--images", "700"])
        .arg("--out")
        .arg(&data));
    let bin = example("mnist_data_parallel");
    for style in ["loop", "model"] {
        let one = dir.join(format!("one-{style}"));
        let out = run(Command::new(&bin)
            .args([
                "--epochs",
                "1",
                "--batch-size",
                "32",
                "--num-samples",
                "640",
                "--print-every",
                "1",
                "--style",
                style,
            ])
            .arg("--data-path")
            .arg(&data)
            .arg("--checkpoint-dir")
            .arg(&one));
        let single = losses(&out);
        assert_eq!(single.len(), 20, "{out}");
        let four = dir.join(format!("four-{style}"));
        let log = dir.join(format!("log-{style}"));
        run(launch(4, &log)
            .arg(&bin)
            .args([
                "--epochs",
                "1",
                "--batch-size",
                "8",
                "--num-samples",
                "160",
                "--print-every",
                "1",
                "--style",
                style,
            ])
            .arg("--data-path")
            .arg(&data)
            .arg("--checkpoint-dir")
            .arg(&four));
        let want = tensors(&one.join("0"));
        for r in 0..4 {
            let stdout = read(&log.join(format!("1/rank.{r}/stdout")));
            assert_eq!(losses(&stdout).len(), 20, "{style} rank {r}: {stdout}");
            let got = tensors(&four.join(r.to_string()));
            let mut compared = 0;
            for (name, w) in &want {
                let Some(g) = got.get(name) else { continue };
                let d = w
                    .iter()
                    .zip(g)
                    .map(|(a, b)| (a - b).abs() / (1.0 + a.abs()))
                    .fold(0.0, f64::max);
                assert!(
                    d <= 1e-5,
                    "{style} rank {r}: {name} differs from one device by {d}"
                );
                compared += 1;
            }
            assert!(
                compared >= 6,
                "{style} rank {r}: compared {compared} tensors of {:?}",
                got.keys()
            );
        }
        if style == "model" {
            // Model.train prints the global batch's loss on every rank: the single device's.
            let rank0 = losses(&read(&log.join("1/rank.0/stdout")));
            for (a, b) in rank0.iter().zip(&single) {
                assert!((a - b).abs() <= 1e-5 * (1.0 + b.abs()), "{a} vs {b}");
            }
            assert!(rank0[19] < rank0[0], "the loss falls: {rank0:?}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn resnet50_tutorial_script_trains_with_a_scheduler_and_workers_from_ms_variables() {
    let dir = tmp("resnet");
    let data = dir.join("cifar-10-batches-bin");
    run(Command::new(shardc_exe())
        .args(["data", "synth", "--format", "cifar10", "--images", "16"])
        .arg("--out")
        .arg(&data));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/run_cpu_dp.sh");
    let out = run(Command::new("bash")
        .arg(&script)
        .arg(&data)
        .args([
            "--epochs",
            "2",
            "--batch-size",
            "2",
            "--image-size",
            "32",
            "--width-divisor",
            "16",
            "--num-samples",
            "6",
        ])
        .env("MS_WORKER_NUM", "2")
        .env("MS_SCHED_PORT", free_port().to_string())
        .env("LOG_DIR", &dir)
        .env(
            "SHARDC_EXAMPLE_BIN",
            example("resnet50_distributed_training"),
        ));
    assert!(out.contains("scheduler start success!"), "{out}");
    let w0 = read(&dir.join("worker_0.txt"));
    let w1 = read(&dir.join("worker_1.txt"));
    // 6 images per rank, batches of 2: 3 steps per epoch, two epochs; the same global loss
    // on both workers.
    let l0 = losses(&w0);
    assert_eq!(l0.len(), 6, "{w0}");
    assert_eq!(l0, losses(&w1), "{w0}\n{w1}");
    assert!(w0.contains("epoch: 2 step: 3, loss is "), "{w0}");
    assert!(l0.iter().all(|l| l.is_finite()), "{l0:?}");
    assert!(w0.contains("per step time"), "TimeMonitor: {w0}");
    assert!(
        read(&dir.join("scheduler.txt")).contains("finished"),
        "scheduler log"
    );
    // A missing data set is a clear error, and the scheduler and the other worker end too.
    let bad = Command::new("bash")
        .arg(&script)
        .arg(dir.join("nowhere"))
        .env("MS_WORKER_NUM", "2")
        .env("MS_SCHED_PORT", free_port().to_string())
        .env("LOG_DIR", dir.join("bad"))
        .env(
            "SHARDC_EXAMPLE_BIN",
            example("resnet50_distributed_training"),
        )
        .output()
        .expect("runs");
    assert!(!bad.status.success());
    // Both workers fail on the missing file, or one does and the other is stopped, told
    // which rank was lost.
    let w = read(&dir.join("bad/worker_0.txt")) + &read(&dir.join("bad/worker_1.txt"));
    assert!(
        w.contains("nowhere") && w.contains("data_batch_1.bin"),
        "{w}"
    );
    // A learning rate that is not a finite number >= 0 is named.
    let lr = Command::new(example("resnet50_distributed_training"))
        .arg("--data-path")
        .arg(&data)
        .args(["--learning-rate", "-0.5"])
        .output()
        .expect("runs");
    assert!(!lr.status.success());
    assert!(
        text(&lr).contains("--learning-rate -0.5: expected a finite number >= 0"),
        "{}",
        text(&lr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn quickstart_parallel_example_trains_8_ranks_under_auto_parallel_with_dumps_and_checkpoints() {
    let dir = tmp("quickstart");
    let log = dir.join("device");
    run(launch(8, &log)
        .arg(example("quickstart_parallel"))
        .args(["--epochs", "3"])
        .arg("--save-graphs-path")
        .arg(dir.join("saved_graph"))
        .arg("--checkpoint-dir")
        .arg(dir.join("ckpt")));
    let rank0 = read(&log.join("1/rank.0/stdout"));
    let l0 = losses(&rank0);
    assert_eq!(l0.len(), 12, "{rank0}");
    assert!(rank0.contains("epoch: 3 step: 4, loss is "), "{rank0}");
    assert!(l0[11] < l0[0], "the loss falls: {l0:?}");
    for r in 1..8 {
        assert_eq!(
            losses(&read(&log.join(format!("1/rank.{r}/stdout")))),
            l0,
            "rank {r}"
        );
        let ck = dir.join(format!("ckpt/{r}/checkpoint_Net-3_4.safetensors"));
        assert!(ck.exists(), "{}", ck.display());
    }
    let begin: Vec<PathBuf> = std::fs::read_dir(dir.join("saved_graph/rank_0"))
        .expect("dumps")
        .map(|e| e.expect("entry").path())
        .collect();
    let text: String = begin
        .iter()
        .filter(|p| p.to_string_lossy().contains("step_parallel_begin"))
        .map(|p| read(p))
        .collect();
    assert!(text.contains("in_strategy: ((2, 4), (4, 1))"), "{begin:?}");
    assert!(
        begin
            .iter()
            .any(|p| p.to_string_lossy().contains("09_execute_")),
        "{begin:?}"
    );
    // ModelCheckpoint wrote the strategy file beside the ranks' files: they merge into one
    // single-device checkpoint with the logical shapes.
    let cp = merge(&dir.join("ckpt"));
    assert_eq!(cp.tensor("w").expect("w").shape, [32, 16]);
    assert_eq!(cp.tensor("w2").expect("w2").shape, [16, 16]);
    assert_eq!(cp.meta.step, 12);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn quickstart_on_8_processes_with_gradients_mean_equals_one_device() {
    // Every rank yields the tutorial's fixed batch, so the 8-rank global batch is 8 copies of
    // it: with gradients_mean the step is exactly one device's on that batch.
    let dir = tmp("quickstart-mean");
    let bin = example("quickstart_parallel");
    let one = dir.join("one");
    let single = run(Command::new(&bin)
        .args(["--epochs", "2", "--gradients-mean", "true"])
        .arg("--save-graphs-path")
        .arg(dir.join("g1"))
        .arg("--checkpoint-dir")
        .arg(&one));
    let log = dir.join("device");
    run(launch(8, &log)
        .arg(&bin)
        .args(["--epochs", "2", "--gradients-mean", "true"])
        .arg("--save-graphs-path")
        .arg(dir.join("g8"))
        .arg("--checkpoint-dir")
        .arg(dir.join("ckpt")));
    let want = losses(&single);
    let got = losses(&read(&log.join("1/rank.0/stdout")));
    assert_eq!(got.len(), 8);
    for (a, b) in got.iter().zip(&want) {
        assert!(
            (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
            "{got:?} vs {want:?}"
        );
    }
    let m = merge(&dir.join("ckpt"));
    assert_eq!(m.meta.step, 8);
    // The single device's newest checkpoint (step 8).
    let newest = std::fs::read_dir(one.join("0"))
        .expect("single-device checkpoints")
        .map(|e| e.expect("entry").path())
        .filter_map(|p| checkpoint::load(&p).ok())
        .max_by_key(|c| c.meta.step)
        .expect("a checkpoint");
    assert_eq!(newest.meta.step, 8);
    for name in ["w", "w2"] {
        let a = m.tensor(name).expect("merged weight").to_f64_vec();
        let b = newest.tensor(name).expect("single weight").to_f64_vec();
        let d = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs() / (1.0 + y.abs()))
            .fold(0.0, f64::max);
        assert!(
            d <= 1e-5,
            "{name}: the 8 ranks' gathered weights differ from one device by {d}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The transformer example: every op searched (here by the ILP, proven optimal), the ranks'
/// losses those of one device (`shardc verify` on the same model holds the invariant; here
/// the loss lines and the report are checked).
#[test]
fn transformer_example_searches_and_trains() {
    let out = run(Command::new(example("transformer")).args([
        "--layers",
        "1",
        "--hidden",
        "32",
        "--heads",
        "4",
        "--seq",
        "8",
        "--batch",
        "8",
        "--device-num",
        "4",
        "--search-mode",
        "ilp",
        "--steps",
        "2",
    ]));
    assert!(out.contains("ilp: "), "{out}");
    assert!(out.contains("proven optimal"), "{out}");
    let l = losses(&out);
    assert_eq!(l.len(), 2, "{out}");
    assert!(l.iter().all(|x| x.is_finite() && *x > 0.0), "{out}");
}

#[test]
fn nccl_allgather_prints_every_rank_id_on_every_rank() {
    let bin = example("nccl_allgather");
    let dir = tmp("allgather");
    let log = dir.join("log");
    // Without GPUs the cluster's own communicator stands in for NCCL; on the emulated GPU,
    // NCCL is emulated over it (one process per rank, as on GPUs).
    let emulated = shardc::cuda::emulator::EmulatedDevice::new(64).is_ok();
    for (k, target) in [
        &["--device-target", "CPU"][..],
        &["--device-target", "GPU", "--gpu", "emulator"][..],
    ]
    .into_iter()
    .enumerate()
    {
        if k == 1 && !emulated {
            eprintln!("SKIP: no emulated GPU here");
            continue;
        }
        let log = log.join(k.to_string());
        run(launch(4, &log).arg(&bin).args(target));
        for r in 0..4 {
            let out = read(&log.join(format!("1/rank.{r}/stdout")));
            assert_eq!(
                out.trim(),
                "[[0.], [1.], [2.], [3.]]",
                "{target:?}, rank {r}"
            );
        }
    }
    if !shardc::cuda::probe::Library::Driver.present() {
        let o = Command::new(&bin).output().expect("runs");
        let t = text(&o);
        assert_eq!(o.status.code(), Some(1), "{t}");
        assert!(t.contains("CUDA not found: libcuda.so"), "{t}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Under mpirun without the `mpi` feature, a rank without a token says how to give one (or
/// to build with MPI) before it tries to join; `tests/cluster_mpi.rs` starts the example
/// under mpirun in a build with the feature.
#[cfg(not(feature = "mpi"))]
#[test]
fn under_mpirun_without_mpi_or_a_token_the_example_says_what_to_do() {
    let o = Command::new(example("nccl_allgather"))
        .args(["--device-target", "CPU"])
        .env("OMPI_COMM_WORLD_SIZE", "2")
        .env("OMPI_COMM_WORLD_RANK", "1")
        .env_remove("SHARDC_CLUSTER_TOKEN")
        .env_remove("SHARDC_CLUSTER_TOKEN_FILE")
        .env_remove("MS_ROLE")
        .output()
        .expect("runs");
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(
        t.contains("mpirun -x SHARDC_CLUSTER_TOKEN=") && t.contains("--features mpi"),
        "{t}"
    );
}
