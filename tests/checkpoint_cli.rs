//! Checkpoints through the `shardc` binary: saving every K steps and pruning, resuming with
//! bit-identical losses (one device, all ranks in one process, and a cluster of worker
//! processes), falling back past a corrupt file with a warning, refusing another model's
//! checkpoint, and merging the ranks' files into one that equals the single device's weights
//! and resumes a single-device run.

use shardc_runtime::checkpoint;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn exe() -> &'static str {
    env!("CARGO_BIN_EXE_shardc")
}

fn shardc(args: &[&str]) -> Output {
    Command::new(exe())
        .args(args)
        .output()
        .expect("the shardc binary runs")
}

fn ok(args: &[&str]) -> Output {
    let o = shardc(args);
    assert!(o.status.success(), "shardc {args:?} failed:\n{}", text(&o));
    o
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn losses(o: &Output) -> Vec<String> {
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| l.contains(", loss is "))
        .map(str::to_string)
        .collect()
}

fn tmp(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("shardc-ckpt-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The quickstart net with a 4-device annotation (`matmul` split ((2, 2), (2, 1))).
fn model4(dir: &Path) -> PathBuf {
    let src =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("models/quickstart.ir"))
            .unwrap();
    let four = src.replace(
        "in_strategy: ((2, 4), (4, 1))",
        "in_strategy: ((2, 2), (2, 1))",
    );
    assert_ne!(four, src, "the quickstart model's annotation changed");
    let p = dir.join("quickstart4.ir");
    std::fs::write(&p, four).unwrap();
    p
}

/// Compiles the 4-device quickstart for `devices` (1 or 4) with Adam (the most state).
fn compile(dir: &Path, devices: u32, optimizer: &str) -> PathBuf {
    let out = dir.join(format!("art{devices}_{optimizer}"));
    let model = model4(dir);
    let mut args = vec![
        "compile",
        s(&model),
        "-o",
        s(&out),
        "--optimizer",
        optimizer,
        "--learning-rate",
        "0.05",
    ]
    .into_iter()
    .map(String::from)
    .collect::<Vec<_>>();
    if devices > 1 {
        for a in [
            "--device-num",
            "4",
            "--parallel-mode",
            "semi_auto_parallel",
            "--gradients-mean",
            "true",
        ] {
            args.push(a.into());
        }
    }
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    ok(&refs);
    out
}

fn files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

fn flip_last_byte(p: &Path) {
    let mut b = std::fs::read(p).unwrap();
    let i = b.len() - 1;
    b[i] ^= 0x01;
    std::fs::write(p, b).unwrap();
}

#[test]
fn single_device_saves_prunes_and_resumes_bit_identically_past_a_corrupt_file() {
    let dir = tmp("single");
    let art = compile(&dir, 1, "adam");
    let ck = dir.join("ck");
    let common = ["--steps-per-epoch", "4"];
    let full = ok(&[&["run", s(&art), "--steps", "10"], &common[..]].concat());
    let want = losses(&full);
    assert_eq!(want.len(), 10);
    assert!(want[9].starts_with("epoch: 3 step: 2,"), "{}", want[9]);
    // Steps 2, 4, 6 saved; only the newest two kept.
    let first = ok(&[
        &[
            "run",
            s(&art),
            "--steps",
            "6",
            "--save-steps",
            "2",
            "--keep-checkpoint-max",
            "2",
            "--checkpoint-dir",
            s(&ck),
        ],
        &common[..],
    ]
    .concat());
    assert_eq!(losses(&first), want[..6]);
    assert_eq!(
        files(&ck.join("0")),
        [
            "checkpoint_Net-1_4.safetensors",
            "checkpoint_Net-2_2.safetensors"
        ]
    );
    assert!(ck.join("strategy.json").is_file());
    // Resume: the step-6 file (epoch 2 step 2) is corrupt, so step 4 it is, with a warning.
    flip_last_byte(&ck.join("0/checkpoint_Net-2_2.safetensors"));
    let resumed = ok(&[
        &["run", s(&art), "--steps", "10", "--resume-from", s(&ck)],
        &common[..],
    ]
    .concat());
    let err = String::from_utf8_lossy(&resumed.stderr);
    assert!(
        err.contains("checkpoint_Net-2_2.safetensors") && err.contains("checksum mismatch"),
        "{err}"
    );
    assert!(err.contains("resuming from step 4"), "{err}");
    assert_eq!(losses(&resumed), want[4..]);
    // A checkpoint of another optimizer's training graph is refused, naming file and reason.
    let other = compile(&dir, 1, "momentum");
    let o = shardc(&["run", s(&other), "--steps", "10", "--resume-from", s(&ck)]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let t = text(&o);
    assert!(
        t.contains("checkpoint_Net-1_4.safetensors") && t.contains("does not fit"),
        "{t}"
    );
    // Inspect prints the metadata and the tensors.
    let i = ok(&[
        "ckpt",
        "inspect",
        s(&ck.join("0/checkpoint_Net-1_4.safetensors")),
    ]);
    let it = String::from_utf8_lossy(&i.stdout);
    for want in [
        "model: Net",
        "rank: 0 of 1",
        "step: 4",
        "epoch: 1",
        "moment1.w  Float32  [32, 16]",
    ] {
        assert!(it.contains(want), "{want} not in:\n{it}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn max_rel(a: &shardc_runtime::Tensor, b: &shardc_runtime::Tensor) -> f64 {
    let (a, b) = (a.to_f64_vec(), b.to_f64_vec());
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(1e-4f64, |m, x| m.max(x.abs()));
    a.iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs() / scale)
        .fold(0.0, f64::max)
}

fn only_file(dir: &Path) -> PathBuf {
    let f = files(dir);
    assert_eq!(f.len(), 1, "{f:?}");
    dir.join(&f[0])
}

#[test]
fn four_ranks_in_process_resume_bit_identically_and_merge_to_the_single_device() {
    let dir = tmp("ranks");
    let art4 = compile(&dir, 4, "adam");
    let art1 = compile(&dir, 1, "adam");
    let (ck, ck2, single) = (dir.join("ck"), dir.join("ck2"), dir.join("single"));
    let want = losses(&ok(&["run", s(&art4), "--steps", "10"]));
    assert_eq!(want.len(), 10);
    let first = ok(&[
        "run",
        s(&art4),
        "--steps",
        "5",
        "--save-steps",
        "5",
        "--checkpoint-dir",
        s(&ck),
    ]);
    assert_eq!(losses(&first), want[..5]);
    for r in 0..4 {
        assert_eq!(
            files(&ck.join(r.to_string())),
            ["checkpoint_Net-1_5.safetensors"],
            "rank {r}"
        );
    }
    let resumed = ok(&[
        "run",
        s(&art4),
        "--steps",
        "10",
        "--resume-from",
        s(&ck),
        "--checkpoint-dir",
        s(&ck2),
    ]);
    assert_eq!(losses(&resumed), want[5..], "{}", text(&resumed));
    // Merge step 10 of the four ranks; compare with the single device's weights after 10
    // steps on the same data (the invariant).
    let merged = dir.join("merged/0/merged.safetensors");
    let m = ok(&[
        "ckpt",
        "merge",
        "--strategy",
        s(&ck2.join("strategy.json")),
        "--input",
        s(&ck2),
        "-o",
        s(&merged),
    ]);
    assert!(
        text(&m).contains("merged step 10 of 4 rank(s)"),
        "{}",
        text(&m)
    );
    ok(&[
        "run",
        s(&art1),
        "--steps",
        "10",
        "--checkpoint-dir",
        s(&single),
    ]);
    let one = checkpoint::load(&only_file(&single.join("0"))).unwrap();
    let mer = checkpoint::load(&merged).unwrap();
    assert_eq!(mer.meta.step, 10);
    assert_eq!(mer.meta.identity, one.meta.identity);
    let names: Vec<&str> = one.tensors.iter().map(|(n, _)| n.as_str()).collect();
    let mnames: Vec<&str> = mer.tensors.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, mnames);
    for (n, t) in &one.tensors {
        let d = max_rel(mer.tensor(n).unwrap(), t);
        assert!(
            d < 1e-5,
            "{n}: merged differs from the single device by {d}"
        );
    }
    // The merged file resumes the single-device artifact from step 10.
    let cont = ok(&[
        "run",
        s(&art1),
        "--steps",
        "12",
        "--resume-from",
        s(&dir.join("merged")),
    ]);
    let cl = losses(&cont);
    let single12 = losses(&ok(&["run", s(&art1), "--steps", "12"]));
    assert_eq!(cl.len(), 2, "{}", text(&cont));
    for (a, b) in cl.iter().zip(&single12[10..]) {
        let (pa, pb) = (a.rsplit_once(' ').unwrap(), b.rsplit_once(' ').unwrap());
        assert_eq!(pa.0, pb.0);
        let (x, y): (f64, f64) = (pa.1.parse().unwrap(), pb.1.parse().unwrap());
        assert!(((x - y) / y).abs() < 1e-4, "{a} vs {b}");
    }
    // A 4-rank artifact cannot resume from a single device's directory.
    let o = shardc(&[
        "run",
        s(&art4),
        "--steps",
        "12",
        "--resume-from",
        s(&single),
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).contains("no complete checkpoint"), "{}", text(&o));
    // Disagreeing replicas of a replicated weight are refused by merge: rank 3's copy of
    // `beta1_power` (a scalar every rank holds) is changed in a well-formed file.
    let sf: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(ck2.join("strategy.json")).unwrap()).unwrap();
    assert_eq!(sf["device_num"], 4);
    assert_eq!(
        sf["parameters"]["beta1_power"]["tensor_shape"],
        serde_json::json!([])
    );
    let r3 = only_file(&ck2.join("3"));
    let mut cp = checkpoint::load(&r3).unwrap();
    let b = cp
        .tensors
        .iter_mut()
        .find(|(n, _)| n == "beta1_power")
        .unwrap();
    b.1.as_f32_mut().unwrap()[0] += 0.5;
    checkpoint::save(&r3, &cp).unwrap();
    let o = shardc(&[
        "ckpt",
        "merge",
        "--strategy",
        s(&ck2.join("strategy.json")),
        "--input",
        s(&ck2),
        "-o",
        s(&dir.join("bad.safetensors")),
    ]);
    assert_eq!(o.status.code(), Some(1));
    let t = text(&o);
    assert!(
        t.contains("parameter beta1_power") && t.contains("ranks 0 and 3"),
        "{t}"
    );
    assert!(!dir.join("bad.safetensors").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_cluster_stopped_at_step_10_resumes_with_the_same_losses() {
    let dir = tmp("cluster");
    let art = compile(&dir, 4, "momentum");
    let (ck, log1, log2) = (dir.join("ck"), dir.join("log1"), dir.join("log2"));
    let want = losses(&ok(&["run", s(&art), "--steps", "12"]));
    let launch = |log: &Path, extra: &[&str]| {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
            .to_string();
        let mut args = vec![
            "launch",
            "--worker-num",
            "4",
            "--local-worker-num",
            "4",
            "--master-port",
            &port,
            "--log-dir",
            s(log),
            "--join",
            "--",
            exe(),
            "run",
            s(&art),
            "--checkpoint-dir",
            s(&ck),
        ];
        args.extend_from_slice(extra);
        let o = shardc(&args);
        let stderr0 = std::fs::read_to_string(log.join("1/rank.0/stderr")).unwrap_or_default();
        assert!(o.status.success(), "{}\n{stderr0}", text(&o));
        (0..4)
            .map(|r| {
                std::fs::read_to_string(log.join(format!("1/rank.{r}/stdout")))
                    .unwrap()
                    .lines()
                    .filter(|l| l.contains(", loss is "))
                    .map(str::to_string)
                    .collect::<Vec<_>>()
            })
            .collect::<Vec<_>>()
    };
    let first = launch(&log1, &["--steps", "10", "--save-steps", "5"]);
    for (r, l) in first.iter().enumerate() {
        assert_eq!(l[..], want[..10], "rank {r}");
        assert_eq!(
            files(&ck.join(r.to_string())),
            [
                "checkpoint_Net-1_5.safetensors",
                "checkpoint_Net-2_2.safetensors"
            ],
            "rank {r}"
        );
    }
    let second = launch(&log2, &["--steps", "12", "--resume-from", s(&ck)]);
    for (r, l) in second.iter().enumerate() {
        assert_eq!(l[..], want[10..], "rank {r}");
        let err = std::fs::read_to_string(log2.join(format!("1/rank.{r}/stderr"))).unwrap();
        assert!(err.contains("resuming from step 10"), "rank {r}: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_cluster_whose_worker_is_killed_after_step_10_resumes_with_the_uninterrupted_losses() {
    let dir = tmp("killed");
    // A net slow enough to kill mid-run: ResNet-50's structure at 1/16 width, 32x32 images,
    // data parallel over 4 ranks.
    let model = dir.join("resnet.ir");
    ok(&[
        "zoo",
        "resnet50",
        "--batch",
        "8",
        "--image-size",
        "32",
        "--width-divisor",
        "16",
        "-o",
        s(&model),
    ]);
    let art = dir.join("art");
    ok(&[
        "compile",
        s(&model),
        "-o",
        s(&art),
        "--device-num",
        "4",
        "--parallel-mode",
        "data_parallel",
        "--gradients-mean",
        "true",
    ]);
    let want = losses(&ok(&["run", s(&art), "--steps", "30"]));
    assert_eq!(want.len(), 30);
    let ck = dir.join("ck");
    let port = |_: ()| {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
            .to_string()
    };
    let launch_args = |log: &Path, port: &str, extra: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = [
            "launch",
            "--worker-num",
            "4",
            "--local-worker-num",
            "4",
            "--master-port",
            port,
            "--log-dir",
            s(log),
            "--join",
            "--",
            exe(),
            "run",
            s(&art),
            "--threads",
            "1",
            "--checkpoint-dir",
            s(&ck),
        ]
        .iter()
        .map(|a| a.to_string())
        .collect();
        v.extend(extra.iter().map(|a| a.to_string()));
        v
    };
    let log1 = dir.join("log1");
    let launcher_err = dir.join("launcher.stderr");
    let mut job = Command::new(exe())
        .args(launch_args(
            &log1,
            &port(()),
            &["--steps", "30", "--save-steps", "5"],
        ))
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&launcher_err).unwrap())
        .spawn()
        .unwrap();
    // Once every rank has saved step 10, kill -9 rank 2's worker.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let saved_10 = |r: usize| {
        std::fs::read_dir(ck.join(r.to_string()))
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .filter(|e| e.file_name().to_string_lossy().ends_with(".safetensors"))
                    .filter_map(|e| checkpoint::read_meta(&e.path()).ok())
                    .any(|m| m.step >= 10)
            })
            .unwrap_or(false)
    };
    while !(0..4).all(saved_10) {
        assert!(
            std::time::Instant::now() < deadline,
            "no step-10 checkpoint within 60 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    // The launcher says `launch: started rank 2 (pid N)`.
    let started = std::fs::read_to_string(&launcher_err).unwrap();
    let pid = started
        .lines()
        .find(|l| l.contains("started rank 2 "))
        .and_then(|l| l.rsplit_once("(pid "))
        .and_then(|(_, p)| p.trim_end_matches(')').parse::<u32>().ok())
        .unwrap_or_else(|| panic!("no pid of rank 2 in: {started}"));
    let killed = Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    // The job ends non-zero (no hang), naming the lost rank.
    let status = job.wait().unwrap();
    assert!(!status.success(), "the killed job must fail");
    let stopped_at = (0..4)
        .map(|r| {
            std::fs::read_to_string(log1.join(format!("1/rank.{r}/stdout")))
                .unwrap_or_default()
                .lines()
                .filter(|l| l.contains(", loss is "))
                .count()
        })
        .max()
        .unwrap();
    assert!(
        stopped_at < 30,
        "the job was killed before its end ({stopped_at} steps)"
    );
    // Resume: every rank continues from the newest step all four saved completely.
    let log2 = dir.join("log2");
    let o = shardc(
        &launch_args(
            &log2,
            &port(()),
            &["--steps", "30", "--resume-from", s(&ck)],
        )
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>(),
    );
    assert!(o.status.success(), "{}", text(&o));
    for r in 0..4 {
        let out = std::fs::read_to_string(log2.join(format!("1/rank.{r}/stdout"))).unwrap();
        let lines: Vec<&str> = out.lines().filter(|l| l.contains(", loss is ")).collect();
        let from = 30 - lines.len();
        assert!(
            from >= 10 && from % 5 == 0,
            "rank {r} resumed from step {from}"
        );
        assert_eq!(
            lines,
            want[from..],
            "rank {r}: the resumed losses are the uninterrupted ones"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
