//! `shardc run --device-target Ascend` end to end on the emulated CANN (the project's
//! `shardc-ascend-emulator` staged under CANN's library names and named by
//! `SHARDC_ASCEND_LIB_DIRS`; the binary cannot tell it from CANN): the clear error of a
//! machine without CANN, `shardc device info`, training on one NPU, on 8 in-process ranks
//! with HCCL, on 8 launched workers with HCCL (the CPU's losses), a job started by hand from
//! MindSpore's rank table, and a killed worker ending the job.

mod ascend_common;

mod cli_common;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use cli_common::{compile_quickstart, free_port, losses, same_losses, text, tmp};

/// `shardc ARGS` with the emulated CANN findable.
fn shardc_cmd(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_shardc"));
    c.args(args);
    if let Some(dir) = ascend_common::cann_dir() {
        c.env("SHARDC_ASCEND_LIB_DIRS", dir)
            .env_remove("ASCEND_HOME_PATH")
            .env_remove("ASCEND_TOOLKIT_HOME");
    }
    c
}

fn shardc(args: &[&str]) -> Output {
    shardc_cmd(args).output().expect("the shardc binary runs")
}

/// `shardc run ART --steps N` on the CPU: the reference losses.
fn cpu_losses(art: &Path, steps: &str) -> Vec<f64> {
    let o = shardc(&["run", art.to_str().unwrap(), "--steps", steps]);
    assert!(o.status.success(), "{}", text(&o));
    losses(&text(&o))
}

#[test]
fn without_cann_the_ascend_target_fails_naming_the_library_and_how_to_find_it() {
    if ascend_common::on_hardware() {
        eprintln!("SKIP: this machine has CANN");
        return;
    }
    let dir = tmp("ascend-cli", "nocann");
    let art = dir.join("art");
    compile_quickstart(&art, &[]);
    let empty = dir.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_shardc"))
            .args(args)
            .env("SHARDC_ASCEND_LIB_DIRS", &empty)
            .env_remove("ASCEND_HOME_PATH")
            .env_remove("ASCEND_TOOLKIT_HOME")
            .env_remove("LD_LIBRARY_PATH")
            .output()
            .expect("the shardc binary runs")
    };
    let o = run(&[
        "run",
        art.to_str().unwrap(),
        "--steps",
        "1",
        "--device-target",
        "Ascend",
    ]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    for want in [
        "error: --device-target Ascend",
        "libascendcl.so",
        "ASCEND_HOME_PATH",
        "SHARDC_ASCEND_LIB_DIRS",
    ] {
        assert!(t.contains(want), "{want}: {t}");
    }
    assert!(!t.contains("panicked"), "{t}");
    let o = run(&["device", "info"]);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    for want in [
        "== CUDA",
        "== Ascend",
        "libascendcl.so",
        "libhccl.so",
        "AscendCL not usable",
    ] {
        assert!(t.contains(want), "{want}: {t}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn device_info_lists_the_emulated_cann_and_its_npus() {
    let o = shardc(&["device", "info"]);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    if ascend_common::cann_dir().is_some() {
        assert!(t.contains("8 device(s)"), "{t}");
    }
    assert!(!t.contains("libascendcl.so   missing"), "{t}");
}

fn run_ascend(art: &Path, steps: &str, extra: &[&str]) -> Output {
    let mut args = vec![
        "run",
        art.to_str().unwrap(),
        "--steps",
        steps,
        "--device-target",
        "Ascend",
    ];
    args.extend_from_slice(extra);
    shardc(&args)
}

#[test]
fn one_npu_and_eight_in_process_ranks_with_hccl_train_as_the_cpu() {
    let dir = tmp("ascend-cli", "inproc");
    let one = dir.join("one");
    compile_quickstart(&one, &[]);
    let o = run_ascend(&one, "4", &["--stats"]);
    assert!(o.status.success(), "{}", text(&o));
    same_losses(&cpu_losses(&one, "4"), &losses(&text(&o)), "one NPU");

    let eight = dir.join("eight");
    compile_quickstart(
        &eight,
        &["--device-num", "8", "--parallel-mode", "semi_auto_parallel"],
    );
    let o = run_ascend(&eight, "3", &[]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("8 ranks, an NPU each, collectives through HCCL"),
        "{}",
        text(&o)
    );
    same_losses(
        &cpu_losses(&eight, "3"),
        &losses(&text(&o)),
        "8 ranks with HCCL",
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `shardc launch` of `workers` local workers, logs under `log`, each running `shardc run
/// ART --steps STEPS --device-target Ascend EXTRA...`.
fn launch_ascend(workers: usize, log: &Path, art: &Path, steps: &str, extra: &[&str]) -> Command {
    let n = workers.to_string();
    let port = free_port().to_string();
    let mut c = shardc_cmd(&["launch", "--worker-num", &n, "--local-worker-num", &n]);
    c.args(["--master-port", &port])
        .args(["--log-dir", log.to_str().unwrap(), "--join", "--"])
        .args(["shardc", "run", art.to_str().unwrap(), "--steps", steps])
        .args(["--device-target", "Ascend"])
        .args(extra);
    c
}

#[test]
fn eight_launched_workers_with_hccl_print_the_cpu_losses() {
    let dir = tmp("ascend-cli", "launch");
    let eight = dir.join("eight");
    compile_quickstart(
        &eight,
        &["--device-num", "8", "--parallel-mode", "semi_auto_parallel"],
    );
    let log = dir.join("log");
    let o = launch_ascend(8, &log, &eight, "3", &[])
        .output()
        .expect("the launcher runs");
    let rank0 = std::fs::read_to_string(log.join("1/rank.0/stdout")).unwrap_or_default();
    let err0 = std::fs::read_to_string(log.join("1/rank.0/stderr")).unwrap_or_default();
    assert!(o.status.success(), "{}\n{rank0}\n{err0}", text(&o));
    assert!(err0.contains("8 ranks on"), "{err0}");
    assert!(err0.contains("collectives through HCCL"), "{err0}");
    same_losses(
        &cpu_losses(&eight, "3"),
        &losses(&rank0),
        "8 launched workers with HCCL",
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// MindSpore's Ascend tutorials start one process per NPU by hand: `RANK_TABLE_FILE`,
/// `RANK_ID`, `RANK_SIZE` and `DEVICE_ID` per process (and here the cluster token); rank 0
/// runs the scheduler on its table server, every rank takes the table's NPU.
#[test]
fn processes_started_from_a_rank_table_train_as_the_cpu() {
    let dir = tmp("ascend-cli", "table");
    let art = dir.join("art");
    compile_quickstart(
        &art,
        &["--device-num", "2", "--parallel-mode", "data_parallel"],
    );
    std::fs::create_dir_all(&dir).unwrap();
    let table = dir.join("rank_table_2pcs.json");
    std::fs::write(
        &table,
        r#"{"version": "1.0", "server_count": "1", "server_list": [
            {"server_id": "127.0.0.1", "device": [
                {"device_id": "3", "device_ip": "192.98.92.100", "rank_id": "0"},
                {"device_id": "5", "device_ip": "192.98.93.100", "rank_id": "1"}],
             "host_nic_ip": "reserve"}], "status": "completed"}"#,
    )
    .unwrap();
    let port = free_port().to_string();
    let children: Vec<_> = (0..2)
        .map(|rank| {
            shardc_cmd(&[
                "run",
                art.to_str().unwrap(),
                "--steps",
                "3",
                "--device-target",
                "Ascend",
            ])
            .env("RANK_TABLE_FILE", &table)
            .env("RANK_ID", rank.to_string())
            .env("RANK_SIZE", "2")
            .env("MS_SCHED_PORT", &port)
            .env("SHARDC_CLUSTER_TOKEN", "rank-table-test")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("a rank starts")
        })
        .collect();
    let outs: Vec<Output> = children
        .into_iter()
        .map(|c| c.wait_with_output().expect("a rank ends"))
        .collect();
    for (r, o) in outs.iter().enumerate() {
        assert!(o.status.success(), "rank {r}: {}", text(o));
    }
    let t0 = text(&outs[0]);
    assert!(
        t0.contains("(device 3,"),
        "rank 0 takes the table's NPU 3: {t0}"
    );
    same_losses(
        &cpu_losses(&art, "3"),
        &losses(&t0),
        "2 ranks from a rank table",
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_killed_hccl_worker_ends_the_job_naming_its_rank() {
    let dir = tmp("ascend-cli", "kill");
    let art = dir.join("art");
    compile_quickstart(
        &art,
        &["--device-num", "4", "--parallel-mode", "data_parallel"],
    );
    let log = dir.join("log");
    let launcher = launch_ascend(4, &log, &art, "100000000", &[])
        .env("SHARDC_HEARTBEAT_TIMEOUT", "5")
        .stderr(Stdio::piped())
        .spawn()
        .expect("the launcher starts");
    cli_common::killed_worker_ends_the_job(launcher, &log, 4, "collectives through HCCL");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_pipelined_artifact_runs_on_npus_with_hccl_pairing_sends_and_receives() {
    let dir = tmp("ascend-cli", "pipeline");
    std::fs::create_dir_all(&dir).unwrap();
    let (one, pipe) = cli_common::compile_pipelined_transformer(&dir, &[]);
    let o = run_ascend(&pipe, "3", &[]);
    assert!(o.status.success(), "{}", text(&o));
    // HCCL's sends wait for their receiver: each stage's send goes out beside its next
    // receive as one group (pipeline_split puts them side by side), so 1F1B runs on HCCL
    // itself, not staged through the host.
    assert!(
        text(&o).contains("collectives through HCCL")
            && !text(&o).contains("staged through the host"),
        "{}",
        text(&o)
    );
    same_losses(
        &cpu_losses(&one, "3"),
        &losses(&text(&o)),
        "2 pipeline stages x 2 data parallel on NPUs",
    );
    let _ = std::fs::remove_dir_all(&dir);
}
