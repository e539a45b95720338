//! A closed standard output is the end of the output: every printing subcommand, its stdout
//! read for one line and then closed (as `| head -1` does), exits quietly with status 0 or
//! 141 and never panics.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn exe() -> &'static str {
    env!("CARGO_BIN_EXE_shardc")
}

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn tmp() -> PathBuf {
    let d = std::env::temp_dir().join(format!("shardc-closed-stdout-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn ok(args: &[&str]) {
    let o = Command::new(exe()).args(args).output().unwrap();
    assert!(
        o.status.success(),
        "shardc {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Runs `shardc args`, reads one line of its stdout, closes the pipe, and returns the exit
/// status and standard error.
fn head_1(args: &[&str]) -> (Option<i32>, String, String) {
    let mut child = Command::new(exe())
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    let _ = out.read_line(&mut first);
    drop(out);
    let mut err = String::new();
    let mut stderr = child.stderr.take().unwrap();
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if t0.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            panic!("shardc {args:?} kept running after its stdout was closed");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let _ = stderr.read_to_string(&mut err);
    (status.code(), first, err)
}

#[test]
fn every_printing_subcommand_ends_quietly_when_its_stdout_closes() {
    let dir = tmp();
    let s = |p: &Path| p.to_str().unwrap().to_string();
    let model = s(&root().join("models/quickstart.ir"));
    let config = s(&root().join("models/parallel_8.toml"));
    let art = dir.join("art");
    ok(&["compile", &model, "-o", &s(&art), "--config", &config]);
    let single = dir.join("single");
    ok(&["compile", &model, "-o", &s(&single)]);
    let ck = dir.join("ck");
    ok(&[
        "run",
        &s(&single),
        "--steps",
        "1",
        "--checkpoint-dir",
        &s(&ck),
    ]);
    let ckpt = std::fs::read_dir(ck.join("0"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .expect("a checkpoint");
    let cases: Vec<Vec<String>> = vec![
        vec!["run".into(), s(&single), "--steps".into(), "500".into()],
        vec!["run".into(), s(&art), "--steps".into(), "200".into()],
        vec!["zoo".into(), "resnet18".into()],
        vec!["gen".into(), "transformer".into()],
        vec!["print".into(), model.clone()],
        vec!["print".into(), s(&art), "--rank".into(), "3".into()],
        vec![
            "verify".into(),
            model.clone(),
            "--config".into(),
            config.clone(),
        ],
        vec!["explain".into(), s(&art), "--op".into(), "matmul".into()],
        vec!["ckpt".into(), "inspect".into(), s(&ckpt)],
        vec!["gpu".into(), "info".into()],
        vec!["device".into(), "info".into()],
        vec!["--help".into()],
        vec!["run".into(), "--help".into()],
    ];
    let mut report = Vec::new();
    for args in &cases {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, first, err) = head_1(&refs);
        report.push(format!("shardc {}: {code:?}", args.join(" ")));
        assert!(
            !err.contains("panicked") && !err.contains("Broken pipe"),
            "shardc {args:?} panicked or complained on a closed stdout: {err}"
        );
        assert!(
            matches!(code, Some(0) | Some(141)),
            "shardc {args:?} exited with {code:?} (first line {first:?}): {err}"
        );
        assert!(!first.is_empty(), "shardc {args:?} printed nothing: {err}");
    }
    eprintln!("{}", report.join("\n"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_closed_stdout_is_not_mistaken_for_other_failures() {
    // A real error, stdout closed or not, still fails with its message and status 1.
    let (code, _, err) = head_1(&["print", "/nonexistent/model.ir"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("/nonexistent/model.ir"), "{err}");
}
