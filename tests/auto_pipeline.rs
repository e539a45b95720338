//! `auto_pipeline` through the `shardc` binary: a 4-layer transformer compiled with
//! `--parallel-mode auto_parallel --auto-pipeline --device-num 4` under a `max_device_memory`
//! that one stage cannot hold (the least one-stage plan needs 278,660 bytes:
//! `compiler::auto_pipeline`'s test
//! `under_a_limit_one_stage_cannot_hold_the_plan_has_stages_and_marks_them`) is pipelined as
//! the stage planner chose, the manifest records the choice, and the job trains under
//! `shardc launch` printing the single device's losses. The errors: `--auto-pipeline` with
//! another mode, with an explicit pipeline, and a limit no plan fits (with its numbers).

mod cli_common;

use cli_common::{
    gen_transformer_layers, launch_four, losses, rank_stdout, same_losses, shardc_ok, text, tmp,
};
use std::path::Path;
use std::process::{Command, Output};

fn shardc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_shardc"))
        .args(args)
        .output()
        .expect("the shardc binary runs")
}

fn s(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 path")
}

/// The flags of auto_parallel with auto_pipeline on 4 devices.
const AUTO: &[&str] = &[
    "--parallel-mode",
    "auto_parallel",
    "--auto-pipeline",
    "--device-num",
    "4",
    "--gradients-mean",
];

/// 270 KiB: below the 278,660 bytes the least one-stage plan needs.
const LIMIT: &str = "270KB";

#[test]
fn the_planners_pipeline_is_compiled_and_trains_to_the_single_device_losses() {
    let dir = tmp("auto-pipeline", "train");
    let model = gen_transformer_layers(&dir, 4);
    let one = dir.join("one");
    shardc_ok(&["compile", s(&model), "-o", s(&one)]);
    let reference = losses(&shardc_ok(&["run", s(&one), "--steps", "3"]));
    assert_eq!(reference.len(), 3);

    let art = dir.join("auto");
    let mut args = vec!["compile", s(&model), "-o", s(&art)];
    args.extend_from_slice(AUTO);
    args.extend_from_slice(&["--max-device-memory", LIMIT]);
    let out = shardc_ok(&args);
    let line = out
        .lines()
        .find(|l| l.starts_with("auto pipeline: stages="))
        .unwrap_or_else(|| panic!("no summary line: {out}"));
    assert!(
        line.contains("predicted step=") && line.contains("bubble="),
        "{line}"
    );

    let manifest: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(art.join("manifest.json")).expect("manifest"),
    )
    .expect("manifest JSON");
    let auto = &manifest["extra"]["auto_pipeline"];
    let pipe = &manifest["extra"]["pipeline"];
    let stages = auto["stages"].as_u64().expect("stages") as usize;
    assert!(stages > 1, "one stage cannot hold the model: {auto}");
    assert_eq!(pipe["stages"], auto["stages"], "{pipe} vs {auto}");
    assert_eq!(pipe["micro_size"], auto["micro_size"], "{pipe} vs {auto}");
    assert_eq!(pipe["ranks_per_stage"].as_u64(), Some(4 / stages as u64));
    assert_eq!(
        auto["split"]
            .as_array()
            .expect("split")
            .iter()
            .map(|v| v.as_u64().unwrap_or(0))
            .sum::<u64>(),
        4
    );
    assert!(line.contains(&format!("stages={stages} ")), "{line}");
    assert!(
        line.contains(&format!("micro_size={} ", auto["micro_size"])),
        "{line}"
    );
    assert!(auto["peak_memory_bytes"].as_f64().expect("peak") <= (270 << 10) as f64);
    assert_eq!(
        auto["memory_limit_bytes"].as_f64(),
        Some((270 << 10) as f64)
    );
    // Recompute where the plan says so: the compile's recompute line reports the replays.
    let recomputes = auto["recompute"]
        .as_array()
        .expect("recompute")
        .iter()
        .any(|v| v.as_bool() == Some(true));
    assert_eq!(
        out.contains("nodes replayed in the backward pass"),
        recomputes,
        "{out}"
    );

    let rank_out = launch(&art, &dir.join("log"));
    let last = 3;
    same_losses(
        &losses(&rank_out(last)),
        &reference,
        "the last stage's rank",
    );
    assert!(
        rank_out(last).contains(&format!("pipeline stage {} of {stages}", stages - 1)),
        "{}",
        rank_out(last)
    );
    assert!(
        losses(&rank_out(0)).is_empty(),
        "the first stage prints no loss"
    );
}

/// Runs `art` for 3 steps on 4 workers under `shardc launch` (logs in `log`), which must
/// succeed: each rank's stdout.
fn launch(art: &Path, log: &Path) -> impl Fn(usize) -> String {
    let o = launch_four(log, art, &["--steps", "3"]);
    let log = log.to_path_buf();
    let rank_out = move |r: usize| rank_stdout(&log, r);
    assert!(
        o.status.success(),
        "{}{}",
        text(&o),
        (0..4).map(&rank_out).collect::<String>()
    );
    rank_out
}

#[test]
fn without_a_limit_the_plan_shards_the_optimizer_as_priced_and_trains_to_the_same_losses() {
    let dir = tmp("auto-pipeline", "zero");
    let model = gen_transformer_layers(&dir, 4);
    let one = dir.join("one");
    shardc_ok(&["compile", s(&model), "-o", s(&one)]);
    let reference = losses(&shardc_ok(&["run", s(&one), "--steps", "3"]));
    let art = dir.join("auto");
    let mut args = vec!["compile", s(&model), "-o", s(&art)];
    args.extend_from_slice(AUTO);
    let out = shardc_ok(&args);
    let manifest: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(art.join("manifest.json")).expect("manifest"),
    )
    .expect("manifest JSON");
    let auto = &manifest["extra"]["auto_pipeline"];
    assert_eq!(
        auto["zero"], true,
        "the cpu preset's plan shards the state: {auto}"
    );
    // Every weight the planner priced as split is split: none is under a threshold.
    let line = out
        .lines()
        .find(|l| l.starts_with("parallel optimizer: "))
        .unwrap_or_else(|| panic!("no parallel optimizer line: {out}"));
    let split: usize = line["parallel optimizer: ".len()..]
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    assert!(split > 0, "{line}");
    let stages = auto["stages"].as_u64().expect("stages") as usize;
    let rank_out = launch(&art, &dir.join("log"));
    same_losses(&losses(&rank_out(3)), &reference, "the last stage's rank");
    assert!(rank_out(3).contains(&format!("pipeline stage {} of {stages}", stages - 1)));
}

fn compile_err(model: &Path, out: &Path, extra: &[&str]) -> String {
    let mut args = vec!["compile", s(model), "-o", s(out)];
    args.extend_from_slice(extra);
    let o = shardc(&args);
    assert!(!o.status.success(), "{extra:?} compiled: {}", text(&o));
    text(&o)
}

#[test]
fn auto_pipeline_errors_name_the_keys_and_values() {
    let dir = tmp("auto-pipeline", "errors");
    let model = gen_transformer_layers(&dir, 2);
    let out = dir.join("out");
    let e = compile_err(
        &model,
        &out,
        &[
            "--parallel-mode",
            "semi_auto_parallel",
            "--auto-pipeline",
            "--device-num",
            "4",
        ],
    );
    assert!(
        e.contains("invalid auto_pipeline `true`: needs parallel_mode `auto_parallel`, not `semi_auto_parallel`"),
        "{e}"
    );
    let mut with_stages = AUTO.to_vec();
    with_stages.extend_from_slice(&["--pipeline-stages", "2"]);
    let e = compile_err(&model, &out, &with_stages);
    assert!(
        e.contains("invalid auto_pipeline `true`: the stage planner chooses pipeline_stages, so pipeline_stages must be left at 1, not 2"),
        "{e}"
    );
    let mut with_zero = AUTO.to_vec();
    with_zero.push("--enable-parallel-optimizer");
    let e = compile_err(&model, &out, &with_zero);
    assert!(
        e.contains("enable_parallel_optimizer must be left false"),
        "{e}"
    );
    let mut tiny = AUTO.to_vec();
    tiny.extend_from_slice(&["--max-device-memory", "16KB"]);
    let e = compile_err(&model, &out, &tiny);
    assert!(
        e.contains("no pipeline plan fits")
            && e.contains("in bytes: max_device_memory 16384, the least any plan needs"),
        "{e}"
    );
}

#[test]
fn a_model_of_one_layer_compiles_as_plain_auto_parallel_and_says_so() {
    let dir = tmp("auto-pipeline", "one-layer");
    let model = gen_transformer_layers(&dir, 1);
    let art = dir.join("art");
    let mut args = vec!["compile", s(&model), "-o", s(&art)];
    args.extend_from_slice(AUTO);
    let o = shardc(&args);
    assert!(o.status.success(), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("compiled as plain auto_parallel, no pipeline"),
        "{err}"
    );
    let manifest = std::fs::read_to_string(art.join("manifest.json")).expect("manifest");
    assert!(!manifest.contains("auto_pipeline"), "{manifest}");
}
