//! The `shardc` binary end to end: compile a model file, train it, check the loss lines.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn shardc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_shardc"))
        .args(args)
        .output()
        .expect("the shardc binary runs")
}

fn tmp(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("shardc-cli-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn model() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("models/quickstart.ir")
        .display()
        .to_string()
}

/// Parses `epoch: E step: S, loss is L` lines.
fn losses(stdout: &str) -> Vec<f64> {
    stdout
        .lines()
        .filter_map(|l| l.split(", loss is ").nth(1))
        .map(|v| v.trim().parse::<f64>().expect("a loss value"))
        .collect()
}

#[test]
fn compile_then_run_trains_the_quickstart_net() {
    let out = tmp("train");
    let art = out.join("art");
    let a = art.to_str().unwrap();
    let c = shardc(&[
        "compile",
        &model(),
        "-o",
        a,
        "--optimizer",
        "momentum",
        "--learning-rate",
        "0.2",
        "--momentum",
        "0.1",
    ]);
    assert!(c.status.success(), "{}", String::from_utf8_lossy(&c.stderr));
    assert!(art.join("manifest.json").exists());
    let r = shardc(&["run", a, "--steps", "200", "--stats"]);
    let stdout = String::from_utf8_lossy(&r.stdout);
    assert!(
        r.status.success(),
        "{}\n{}",
        stdout,
        String::from_utf8_lossy(&r.stderr)
    );
    assert!(stdout.contains("epoch: 1 step: 1, loss is "), "{stdout}");
    let l = losses(&stdout);
    assert_eq!(l.len(), 200);
    assert!(l.iter().all(|x| x.is_finite()));
    // The data pool cycles 8 batches: compare the mean loss of the first and last epochs.
    let first: f64 = l[..8].iter().sum::<f64>() / 8.0;
    let last: f64 = l[192..].iter().sum::<f64>() / 8.0;
    assert!(
        last < 0.8 * first,
        "loss did not fall: first epoch {first}, last {last}"
    );
    assert!(
        stdout.contains("peak"),
        "--stats prints the memory plan: {stdout}"
    );
    // Same seed, same numbers.
    let r2 = shardc(&["run", a, "--steps", "200"]);
    assert_eq!(losses(&String::from_utf8_lossy(&r2.stdout)), l);
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn bad_inputs_get_clear_errors_and_status() {
    let out = tmp("bad");
    std::fs::create_dir_all(&out).unwrap();
    let bad = out.join("bad.ir");
    std::fs::write(&bad, "#IR entry : @Net\n%para1_x : <Tensor[Float32], (4, 4)>\nsubgraph @Net(%para1_x) {\n  %1(out) = ReLU(%para9_y)\n  Return(%1)\n}\n").unwrap();
    let c = shardc(&[
        "compile",
        bad.to_str().unwrap(),
        "-o",
        out.join("o").to_str().unwrap(),
    ]);
    assert_eq!(c.status.code(), Some(1));
    let err = String::from_utf8_lossy(&c.stderr);
    assert!(err.contains("bad.ir:4:"), "{err}");
    let missing = shardc(&["run", out.join("nothing").to_str().unwrap()]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("nothing"));
    let usage = shardc(&["compile"]);
    assert_eq!(usage.status.code(), Some(2));
    let help = shardc(&["run", "--help"]);
    assert!(help.status.success());
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn bench_calibrate_writes_a_device_description_the_cost_model_reads() {
    let dir = std::env::temp_dir().join(format!("shardc-calibrate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("device.toml");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_shardc"))
        .args(["bench", "calibrate", "--quick", "--device-file"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let d = shardc::compiler::device::DeviceDescription::load(&file).unwrap();
    assert_eq!(
        d.devices_per_host,
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    assert!(d.flops > 1e8 && d.intra_host.bandwidth_gbs > 0.0, "{d:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("inter_host cannot be measured"));
    // The point-to-point link is measured, and the stage planner prices with it.
    let p2p = d.point_to_point().expect("a measured point-to-point link");
    assert!(p2p.intra_host.bandwidth > 0.0, "{p2p:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Asserts that `out` succeeded and its stdout holds every line of `wants`: the stdout.
fn succeeds_printing(out: &std::process::Output, wants: &[&str]) -> String {
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for want in wants {
        assert!(text.contains(want), "no {want:?} in:\n{text}");
    }
    text
}

#[test]
fn bench_plan_quick_prints_the_auto_and_3d_plans_and_weak_scaling() {
    let out = shardc(&["bench", "plan", "--quick"]);
    let text = succeeds_printing(
        &out,
        &[
            "plan: cost model assumptions",
            "plan model=tiny",
            "  auto: stages=",
            "  3d:   stages=",
            "ratio auto/3d throughput=",
            "MFU=",
            "plan weak scaling at 16 devices",
        ],
    );
    // Auto is never predicted slower than 3D under the same model.
    assert!(text.contains("(goal >= 1: met)"), "{text}");
}

#[test]
fn explain_plan_pipeline_shows_the_stages_their_memory_and_the_bubble() {
    let out = shardc(&[
        "explain",
        "--plan-pipeline",
        "4,64,4,16",
        "--devices",
        "8",
        "--batch",
        "8",
    ]);
    succeeds_printing(
        &out,
        &[
            "pipeline plan of the transformer layers=4",
            "stage 0: layers 0..",
            "memory=",
            "predicted bubble",
            "best Megatron-LM 3D plan",
        ],
    );
    // A hopeless memory limit is an error naming what any plan needs.
    let out = shardc(&[
        "explain",
        "--plan-pipeline",
        "4,64,4,16",
        "--devices",
        "8",
        "--batch",
        "8",
        "--max-device-memory",
        "0.000001",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("the least any plan needs"), "{err}");
}

/// `shardc export --mlir`: this binary is built without the `mlir` feature (the suite's), so it
/// compiles the model, then says how to get MLIR and writes nothing; a model that does not
/// parse is still reported first. (With the feature, the output is checked by MLIR's verifier
/// in `mlir/tests/mlir_oracle.rs`.)
#[test]
#[cfg(not(feature = "mlir"))]
fn export_mlir_without_the_feature_says_how_to_enable_it() {
    let out = tmp("export-mlir");
    let o = shardc(&[
        "export",
        &model(),
        "--mlir",
        "-o",
        out.to_str().unwrap(),
        "--device-num",
        "8",
        "--parallel-mode",
        "semi_auto_parallel",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(
        err.contains("built without MLIR")
            && err.contains("--features mlir")
            && err.contains("scripts/install-mlir.sh"),
        "{err}"
    );
    assert!(!out.exists(), "nothing is written without MLIR");
    let o = shardc(&[
        "export",
        "/nonexistent.ir",
        "--mlir",
        "-o",
        out.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("/nonexistent.ir"),
        "{err}"
    );
    let o = shardc(&["export", &model(), "-o", out.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("--mlir"), "{err}");
}
