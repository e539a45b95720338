//! Pipeline stages through the `shardc` binary with real processes: the 2-layer transformer
//! on 4 workers under `shardc launch` as 2 stages × 2-way data parallel, 1F1B over 4
//! micro-batches, with and without optimizer sharding, prints the single device's losses;
//! `--stats` puts each rank's measured bubble beside the predicted one; the checkpoints of
//! the stages merge into the single device's weights; a killed worker of a stage ends the job
//! naming it.

mod cli_common;

use cli_common::{
    free_port, gen_transformer, launch_four as launch, losses, rank_stdout, same_losses, text, tmp,
    PIPELINE,
};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use shardc::runtime::checkpoint::{self, Checkpoint};

/// The checkpoint of the highest step in `dir`.
fn newest_checkpoint(dir: &Path) -> Checkpoint {
    std::fs::read_dir(dir)
        .expect("checkpoints")
        .map(|e| e.expect("entry").path())
        .filter_map(|p| checkpoint::load(&p).ok())
        .max_by_key(|c| c.meta.step)
        .expect("a checkpoint")
}

fn exe() -> &'static str {
    env!("CARGO_BIN_EXE_shardc")
}

fn shardc(args: &[&str]) -> Output {
    Command::new(exe())
        .args(args)
        .output()
        .expect("the shardc binary runs")
}

fn ok(o: Output, what: &str) -> String {
    assert!(o.status.success(), "{what}: {}", text(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// `shardc compile MODEL -o ART ARGS...` with Adam (the optimizer whose sharded state shows).
fn compile(model: &Path, art: &Path, args: &[&str]) {
    let mut all = vec![
        "compile",
        model.to_str().unwrap(),
        "-o",
        art.to_str().unwrap(),
        "--optimizer",
        "adam",
    ];
    all.extend_from_slice(args);
    ok(shardc(&all), "compile");
}

/// The single device's losses over `steps` steps.
fn one_device(dir: &Path, model: &Path, steps: &str) -> Vec<f64> {
    let art = dir.join("one");
    compile(model, &art, &[]);
    losses(&ok(
        shardc(&["run", art.to_str().unwrap(), "--steps", steps]),
        "one device",
    ))
}

/// 1F1B, named.
const SCHEDULE: &[&str] = &["--pipeline-scheduler", "1f1b"];

fn logs(log: &Path) -> String {
    (0..4)
        .map(|r| {
            format!(
                "\n--- rank {r}\n{}{}",
                rank_stdout(log, r),
                read(&log.join(format!("1/rank.{r}/stderr")))
            )
        })
        .collect()
}

/// Every rank says its stage; the last stage's ranks print the single device's losses, the
/// first stage's none.
fn check_stages(log: &Path, reference: &[f64], what: &str) {
    for r in 0..4 {
        let out = rank_stdout(log, r);
        let stage = r / 2;
        assert!(
            out.contains(&format!("rank {r}: pipeline stage {stage} of 2")),
            "{what}: rank {r} does not say its stage{}",
            logs(log)
        );
        if stage == 1 {
            same_losses(&losses(&out), reference, &format!("{what}, rank {r}"));
        } else {
            assert!(losses(&out).is_empty(), "{what}: rank {r} printed a loss");
        }
    }
}

#[test]
fn two_stages_by_two_data_parallel_print_the_single_device_losses() {
    let dir = tmp("pipeline", "1f1b");
    std::fs::create_dir_all(&dir).unwrap();
    let model = gen_transformer(&dir);
    let reference = one_device(&dir, &model, "4");
    assert_eq!(reference.len(), 4);

    let art = dir.join("pipe");
    compile(&model, &art, &[PIPELINE, SCHEDULE].concat());
    let log = dir.join("log");
    let ck = dir.join("ck");
    let o = launch(
        &log,
        &art,
        &[
            "--steps",
            "4",
            "--stats",
            "--checkpoint-dir",
            ck.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}{}", text(&o), logs(&log));
    check_stages(&log, &reference, "1F1B");
    // --stats: each rank's measured bubble beside the schedule's predicted one.
    for r in 0..4 {
        let out = rank_stdout(&log, r);
        let line = out
            .lines()
            .find(|l| l.contains("measured bubble"))
            .unwrap_or_else(|| panic!("rank {r}: no bubble line{}", logs(&log)));
        assert!(
            line.contains("predicted bubble 20.0 %"),
            "rank {r}: (2 - 1) / (4 + 2 - 1) is 20 %: {line}"
        );
    }

    // The stages' checkpoints merge into the single device's: each stage saved its own
    // weights, and the merged file has every weight of the model, equal to the single
    // device's after the same steps.
    let merged = dir.join("merged.safetensors");
    let m = ok(
        shardc(&[
            "ckpt",
            "merge",
            "--strategy",
            ck.join("strategy.json").to_str().unwrap(),
            "--input",
            ck.to_str().unwrap(),
            "-o",
            merged.to_str().unwrap(),
        ]),
        "ckpt merge",
    );
    assert!(m.contains("merged step 4 of 4 rank(s)"), "{m}");
    let one_ck = dir.join("one-ck");
    ok(
        shardc(&[
            "run",
            dir.join("one").to_str().unwrap(),
            "--steps",
            "4",
            "--checkpoint-dir",
            one_ck.to_str().unwrap(),
        ]),
        "one device with checkpoints",
    );
    let merged = checkpoint::load(&merged).expect("the merged checkpoint loads");
    let single = newest_checkpoint(&one_ck.join("0"));
    assert_eq!(merged.meta.step, single.meta.step);
    let names =
        |c: &Checkpoint| -> Vec<String> { c.tensors.iter().map(|(n, _)| n.clone()).collect() };
    assert_eq!(names(&merged), names(&single));
    for (name, want) in &single.tensors {
        let got = merged.tensor(name).expect("merged has it");
        assert_eq!(got.shape, want.shape, "{name}");
        let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
        // f32 sums in another order (micro-batches, two ranks): Adam's normalised step turns
        // a rounding difference of a near-zero gradient into up to a few ulps of lr, so the
        // bound is absolute below 1e-5.
        let scale = w.iter().fold(0f64, |m, x| m.max(x.abs()));
        for (x, y) in g.iter().zip(&w) {
            assert!((x - y).abs() <= 1e-5 + 1e-4 * scale, "{name}: {x} vs {y}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn gpipe_and_optimizer_sharding_print_the_single_device_losses() {
    let dir = tmp("pipeline", "zero");
    std::fs::create_dir_all(&dir).unwrap();
    let model = gen_transformer(&dir);
    let reference = one_device(&dir, &model, "3");
    for (tag, extra) in [
        ("gpipe", vec!["--pipeline-scheduler", "gpipe"]),
        ("zero", vec!["--enable-parallel-optimizer"]),
    ] {
        let art = dir.join(tag);
        let mut flags = PIPELINE.to_vec();
        flags.extend(extra);
        compile(&model, &art, &flags);
        let log = dir.join(format!("log-{tag}"));
        let o = launch(&log, &art, &["--steps", "3"]);
        assert!(o.status.success(), "{tag}: {}{}", text(&o), logs(&log));
        check_stages(&log, &reference, tag);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_killed_worker_of_a_stage_ends_the_job_naming_it() {
    let dir = tmp("pipeline", "kill");
    std::fs::create_dir_all(&dir).unwrap();
    let model = gen_transformer(&dir);
    let art = dir.join("pipe");
    compile(&model, &art, PIPELINE);
    let log = dir.join("log");
    let port = free_port().to_string();
    let mut launcher = Command::new(exe())
        .args(["launch", "--worker-num", "4", "--local-worker-num", "4"])
        .args(["--master-port", &port, "--join", "--log-dir"])
        .arg(&log)
        .args(["--", "shardc", "run", art.to_str().unwrap()])
        .args(["--steps", "100000"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("launch starts");
    // Training under way: the last stage printed losses.
    let t0 = Instant::now();
    while losses(&rank_stdout(&log, 2)).len() < 3 {
        if t0.elapsed() > Duration::from_secs(120) {
            let _ = launcher.kill();
            panic!("training never started{}", logs(&log));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // Rank 1 runs stage 0; kill it (the launcher names each rank's pid on its stderr).
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
            victim = Some(pid.trim_end_matches(')').to_string());
        }
    }
    let Some(victim) = victim else {
        let _ = launcher.kill();
        let _ = launcher.wait();
        panic!("no pid for rank 1 in: {seen}");
    };
    assert!(Command::new("kill")
        .args(["-9", &victim])
        .status()
        .expect("kill runs")
        .success());
    let killed = Instant::now();
    let status = loop {
        if let Some(s) = launcher.try_wait().expect("waits") {
            break s;
        }
        if killed.elapsed() > Duration::from_secs(60) {
            let _ = launcher.kill();
            let _ = launcher.wait();
            panic!("the job still ran 60 s after rank 1 (stage 0) was killed");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(!status.success());
    assert!(killed.elapsed() < Duration::from_secs(30));
    for r in [0, 2, 3] {
        let e = read(&log.join(format!("1/rank.{r}/stderr")));
        assert!(e.contains("rank 1"), "rank {r}: {e}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
