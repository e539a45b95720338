//! `shardc run --device-target GPU` end to end: the clear error on a machine without CUDA,
//! and training on the GPU backend's emulated device (its kernels compiled for the host)
//! with the same losses as the CPU, on one device, on ranks in one process, and on a
//! cluster of worker processes under `shardc launch`.

mod cli_common;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use cli_common::{compile_quickstart, free_port, losses, same_losses, text, tmp};

fn shardc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_shardc"))
        .args(args)
        .output()
        .expect("the shardc binary runs")
}

/// Whether the emulated GPU can be built here (a C++20 compiler).
fn emulator_available() -> bool {
    match shardc_backend_cuda_probe() {
        Ok(()) => true,
        Err(e) => {
            eprintln!("SKIP: no emulated GPU here: {e}");
            false
        }
    }
}

fn shardc_backend_cuda_probe() -> Result<(), String> {
    shardc::cuda::emulator::EmulatedDevice::new(64)
        .map(drop)
        .map_err(|e| e.to_string())
}

#[test]
fn without_cuda_the_gpu_target_fails_with_the_missing_library() {
    if shardc::cuda::probe::Library::Driver.present() {
        eprintln!("SKIP: this machine has a CUDA driver");
        return;
    }
    let dir = tmp("gpu-cli", "nocuda");
    let art = dir.join("art");
    compile_quickstart(&art, &[]);
    let o = shardc(&[
        "run",
        art.to_str().unwrap(),
        "--steps",
        "1",
        "--device-target",
        "GPU",
    ]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(
        t.contains("error: --device-target GPU: CUDA not found: libcuda.so"),
        "{t}"
    );
    assert!(!t.contains("panicked"), "{t}");
    let o = shardc(&["gpu", "info"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("libcuda.so       missing"),
        "{}",
        text(&o)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `shardc run ART --steps N --device-target GPU --gpu emulator EXTRA...`.
fn run_emulated(art: &Path, steps: &str, extra: &[&str]) -> Output {
    let mut args = vec![
        "run",
        art.to_str().unwrap(),
        "--steps",
        steps,
        "--device-target",
        "GPU",
        "--gpu",
        "emulator",
    ];
    args.extend_from_slice(extra);
    shardc(&args)
}

#[test]
fn the_emulated_gpu_trains_one_device_and_in_process_ranks_as_the_cpu() {
    if !emulator_available() {
        return;
    }
    let dir = tmp("gpu-cli", "emulated");
    let one = dir.join("one");
    compile_quickstart(&one, &[]);
    let cpu = shardc(&["run", one.to_str().unwrap(), "--steps", "4"]);
    let gpu = run_emulated(&one, "4", &["--stats"]);
    assert!(gpu.status.success(), "{}", text(&gpu));
    assert!(
        text(&gpu).contains("fused kernels), 0 on the host"),
        "{}",
        text(&gpu)
    );
    same_losses(&losses(&text(&cpu)), &losses(&text(&gpu)), "one device");

    let four = dir.join("eight");
    compile_quickstart(
        &four,
        &["--device-num", "8", "--parallel-mode", "semi_auto_parallel"],
    );
    let cpu = shardc(&["run", four.to_str().unwrap(), "--steps", "3"]);
    let gpu = run_emulated(&four, "3", &["--stats"]);
    assert!(gpu.status.success(), "{}", text(&gpu));
    assert!(text(&gpu).contains("collectives"), "{}", text(&gpu));
    // A device per rank, NCCL (emulated) between them: the steps replay, collectives in them.
    for want in [
        "8 ranks, a device each, collectives through NCCL",
        "graph replay: 2 of 3 steps ran as one replay",
    ] {
        assert!(text(&gpu).contains(want), "{want}: {}", text(&gpu));
    }
    same_losses(
        &losses(&text(&cpu)),
        &losses(&text(&gpu)),
        "8 ranks in process",
    );
    // NCCL's watchdog takes its bound from SHARDC_COMM_TIMEOUT, which must be seconds.
    let bad = Command::new(env!("CARGO_BIN_EXE_shardc"))
        .args([
            "run",
            four.to_str().unwrap(),
            "--steps",
            "1",
            "--device-target",
            "GPU",
            "--gpu",
            "emulator",
        ])
        .env("SHARDC_COMM_TIMEOUT", "soon")
        .output()
        .expect("the shardc binary runs");
    assert!(!bad.status.success(), "{}", text(&bad));
    assert!(
        text(&bad).contains("SHARDC_COMM_TIMEOUT = soon: expected a positive number of seconds"),
        "{}",
        text(&bad)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `shardc launch` of `workers` local workers, logs under `log`, each running `shardc run
/// ART --steps STEPS --device-target GPU --gpu emulator EXTRA...`.
fn launch_emulated(workers: usize, log: &Path, art: &Path, steps: &str, extra: &[&str]) -> Command {
    let n = workers.to_string();
    let mut c = Command::new(env!("CARGO_BIN_EXE_shardc"));
    c.args(["launch", "--worker-num", &n, "--local-worker-num", &n])
        .args(["--master-port", &free_port().to_string()])
        .args(["--log-dir", log.to_str().unwrap(), "--join", "--"])
        .args(["shardc", "run", art.to_str().unwrap(), "--steps", steps])
        .args(["--device-target", "GPU", "--gpu", "emulator"])
        .args(extra);
    c
}

#[test]
fn launched_workers_on_the_emulated_gpu_print_the_cpu_losses() {
    if !emulator_available() {
        return;
    }
    let dir = tmp("gpu-cli", "launch");
    let art = dir.join("art");
    compile_quickstart(
        &art,
        &["--device-num", "2", "--parallel-mode", "data_parallel"],
    );
    let reference = shardc(&["run", art.to_str().unwrap(), "--steps", "3"]);
    let log = dir.join("log");
    let o = launch_emulated(2, &log, &art, "3", &["--gpu-comm", "host"])
        .output()
        .expect("the launcher runs");
    let rank0 = std::fs::read_to_string(log.join("1/rank.0/stdout")).unwrap_or_default();
    let err0 = std::fs::read_to_string(log.join("1/rank.0/stderr")).unwrap_or_default();
    assert!(o.status.success(), "{}\n{rank0}\n{err0}", text(&o));
    same_losses(
        &losses(&text(&reference)),
        &losses(&rank0),
        "2 launched workers",
    );

    // NCCL (the default) between 8 worker processes, emulated over the cluster's
    // communicator: model-parallel collectives on sub-groups, the CPU's losses.
    let eight = dir.join("eight");
    compile_quickstart(
        &eight,
        &["--device-num", "8", "--parallel-mode", "semi_auto_parallel"],
    );
    let reference = shardc(&["run", eight.to_str().unwrap(), "--steps", "3"]);
    let log = dir.join("log8");
    let o = launch_emulated(8, &log, &eight, "3", &[])
        .output()
        .expect("the launcher runs");
    let rank0 = std::fs::read_to_string(log.join("1/rank.0/stdout")).unwrap_or_default();
    let err0 = std::fs::read_to_string(log.join("1/rank.0/stderr")).unwrap_or_default();
    assert!(o.status.success(), "{}\n{rank0}\n{err0}", text(&o));
    assert!(
        err0.contains(
            "8 ranks, collectives through NCCL (emulated over the cluster's communicator)"
        ),
        "{err0}"
    );
    same_losses(
        &losses(&text(&reference)),
        &losses(&rank0),
        "8 launched workers with NCCL",
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_killed_nccl_worker_on_the_emulated_gpu_ends_the_job_naming_its_rank() {
    if !emulator_available() {
        return;
    }
    let dir = tmp("gpu-cli", "kill");
    let art = dir.join("art");
    compile_quickstart(
        &art,
        &["--device-num", "4", "--parallel-mode", "data_parallel"],
    );
    let log = dir.join("log");
    let launcher = launch_emulated(4, &log, &art, "100000000", &[])
        .env("SHARDC_HEARTBEAT_TIMEOUT", "5")
        .stderr(Stdio::piped())
        .spawn()
        .expect("the launcher starts");
    cli_common::killed_worker_ends_the_job(launcher, &log, 4, "collectives through NCCL");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Compiles the quickstart net with `compile_flags` and runs it on the emulated GPU: 6
/// steps at once, then 3 saving checkpoints and a resume to 6, whose losses must be the
/// uninterrupted run's steps 4-6; every one of `ranks` must have saved a file.
fn saves_and_resumes_as_uninterrupted(tag: &str, compile_flags: &[&str], ranks: usize) {
    if !emulator_available() {
        return;
    }
    let dir = tmp("gpu-cli", tag);
    let art = dir.join("art");
    compile_quickstart(&art, compile_flags);
    let ck = dir.join("ck");
    let ck = ck.to_str().unwrap();
    let whole = run_emulated(&art, "6", &[]);
    assert!(whole.status.success(), "{}", text(&whole));
    let o = run_emulated(&art, "3", &["--checkpoint-dir", ck]);
    assert!(o.status.success(), "{}", text(&o));
    for rank in 0..ranks {
        let files = std::fs::read_dir(Path::new(ck).join(rank.to_string()))
            .map(|d| d.count())
            .unwrap_or(0);
        assert!(files > 0, "rank {rank} saved nothing: {}", text(&o));
    }
    let o = run_emulated(&art, "6", &["--resume-from", ck]);
    assert!(o.status.success(), "{}", text(&o));
    let all = losses(&text(&whole));
    let resumed = losses(&text(&o));
    assert_eq!(all.len(), 6, "{}", text(&whole));
    assert_eq!(resumed.len(), 3, "{}", text(&o));
    assert_eq!(
        &all[3..],
        &resumed[..],
        "{ranks} rank(s): resumed steps 4-6 equal the uninterrupted run's"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_emulated_gpu_saves_and_resumes_with_the_uninterrupted_losses() {
    saves_and_resumes_as_uninterrupted("resume", &[], 1);
}

#[test]
fn in_process_ranks_on_the_emulated_gpu_save_and_resume_with_the_uninterrupted_losses() {
    saves_and_resumes_as_uninterrupted(
        "resume-ranks",
        &["--device-num", "8", "--parallel-mode", "semi_auto_parallel"],
        8,
    );
}

#[test]
fn a_pipelined_artifact_runs_on_the_emulated_gpu_with_nccl_pairing_sends_and_receives() {
    if !emulator_available() {
        return;
    }
    let dir = tmp("gpu-cli", "pipeline");
    std::fs::create_dir_all(&dir).unwrap();
    let (one, pipe) = cli_common::compile_pipelined_transformer(&dir, &[]);
    let reference = run_emulated(&one, "3", &[]);
    assert!(reference.status.success(), "{}", text(&reference));
    let o = run_emulated(&pipe, "3", &[]);
    assert!(o.status.success(), "{}", text(&o));
    // NCCL's sends wait for their receiver: each stage's send goes out beside its next
    // receive as one group (pipeline_split puts them side by side), so 1F1B runs on NCCL
    // itself, not staged through the host.
    assert!(
        text(&o).contains("collectives through NCCL")
            && !text(&o).contains("staged through the host"),
        "{}",
        text(&o)
    );
    same_losses(
        &losses(&text(&reference)),
        &losses(&text(&o)),
        "2 pipeline stages x 2 data parallel on the emulated GPU",
    );
    // GPipe: every forward's send before the first receive; the last goes out with it.
    let gpipe_dir = dir.join("gpipe");
    std::fs::create_dir_all(&gpipe_dir).unwrap();
    let (_, gpipe) =
        cli_common::compile_pipelined_transformer(&gpipe_dir, &["--pipeline-scheduler", "gpipe"]);
    // One step: every step issues the same transfers (point-to-point steps are not replayed).
    let o = run_emulated(&gpipe, "1", &[]);
    assert!(o.status.success(), "{}", text(&o));
    same_losses(
        &losses(&text(&reference))[..1],
        &losses(&text(&o)),
        "2 pipeline stages x 2 data parallel, GPipe, on the emulated GPU",
    );
    // 3 stages: the middle one sends and receives both ways.
    let t3 = cli_common::gen_transformer_layers(&gpipe_dir, 3);
    let (one3, p3) = (gpipe_dir.join("one3"), gpipe_dir.join("p3"));
    let path = |p: &Path| p.to_str().unwrap().to_string();
    cli_common::shardc_ok(&["compile", &path(&t3), "-o", &path(&one3)]);
    cli_common::shardc_ok(&[
        "compile",
        &path(&t3),
        "-o",
        &path(&p3),
        "--parallel-mode",
        "semi_auto_parallel",
        "--device-num",
        "3",
        "--pipeline-stages",
        "3",
        "--micro-size",
        "4",
        "--gradients-mean",
    ]);
    let want = losses(&cli_common::shardc_ok(&[
        "run",
        &path(&one3),
        "--steps",
        "1",
    ]));
    let o = run_emulated(&p3, "1", &[]);
    assert!(o.status.success(), "{}", text(&o));
    same_losses(
        &want,
        &losses(&text(&o)),
        "3 pipeline stages, 1F1B, on the emulated GPU",
    );
    let _ = std::fs::remove_dir_all(&dir);
}
