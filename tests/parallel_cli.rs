//! The parallel compiler through the `shardc` binary: per-rank dumps that parse back, the
//! strategy file reproducing the same per-rank graphs, `verify`, `explain` and `run` on a
//! multi-rank artifact.

use shardc::ir::artifact::Artifact;
use shardc::ir::text::parse_graph;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn shardc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_shardc"))
        .args(args)
        .output()
        .expect("the shardc binary runs")
}

fn tmp(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("shardc-pcli-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn model() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("models/quickstart.ir")
        .display()
        .to_string()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn per_rank_dumps_parse_back_and_the_strategy_file_reproduces_the_graphs() {
    let dir = tmp("dumps");
    let (dumps, out, out2, sfile) = (
        dir.join("saved_graph"),
        dir.join("art"),
        dir.join("art2"),
        dir.join("strategy.json"),
    );
    let c = shardc(&[
        "compile",
        &model(),
        "-o",
        out.to_str().unwrap(),
        "--device-num",
        "8",
        "--parallel-mode",
        "semi_auto_parallel",
        "--save-graphs-path",
        dumps.to_str().unwrap(),
        "--strategy-ckpt-save-file",
        sfile.to_str().unwrap(),
        "--ranks",
        "all",
    ]);
    assert!(c.status.success(), "{}", text(&c));
    for r in 0..8 {
        let rd = dumps.join(format!("rank_{r}"));
        let mut names: Vec<String> = std::fs::read_dir(&rd)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .collect();
        names.sort();
        assert_eq!(names.len(), 3, "{names:?}");
        assert!(names[0].starts_with("09_execute_"), "{names:?}");
        assert!(names[1].starts_with("step_parallel_begin_"), "{names:?}");
        assert!(names[2].starts_with("step_parallel_end_"), "{names:?}");
        for n in &names {
            let src = std::fs::read_to_string(rd.join(n)).unwrap();
            let mut g = parse_graph(&src, n).unwrap_or_else(|e| panic!("{n}: {e}"));
            shardc::passes::infer::infer_graph(&mut g).unwrap_or_else(|e| panic!("{n}: {e}"));
            shardc::passes::verify::verify(&g).unwrap_or_else(|e| panic!("{n}: {e}"));
            if n.starts_with("step_parallel_begin") {
                assert!(src.contains("{in_strategy: ((2, 4), (4, 1))}"), "{n}");
                assert!(src.contains("# strategy from: user annotation"), "{n}");
            }
        }
    }
    let sf = std::fs::read_to_string(&sfile).unwrap();
    let json: serde_json::Value = serde_json::from_str(&sf).unwrap();
    assert_eq!(json["device_num"], 8);
    assert_eq!(
        json["parameters"]["w"]["dev_matrix"],
        serde_json::json!([2, 4, 1])
    );
    assert_eq!(
        json["parameters"]["w"]["tensor_map"],
        serde_json::json!([1, 0])
    );
    assert_eq!(
        json["ops"]["matmul"]["strategy"],
        serde_json::json!([[2, 4], [4, 1]])
    );
    // The loss gradient's BroadcastTo makes each rank's block of its result directly: a split
    // of a dimension no input has, recorded as its out strategy (and reloaded below).
    assert_eq!(
        json["ops"]["grad_reduce_mean"]["out_strategy"],
        serde_json::json!([[8, 1]])
    );

    // Loading the file under auto_parallel (which would otherwise search) gives the same
    // per-rank graphs.
    let c = shardc(&[
        "compile",
        &model(),
        "-o",
        out2.to_str().unwrap(),
        "--device-num",
        "8",
        "--parallel-mode",
        "auto_parallel",
        "--strategy-ckpt-load-file",
        sfile.to_str().unwrap(),
    ]);
    assert!(c.status.success(), "{}", text(&c));
    let a = Artifact::read(&out).unwrap();
    let b = Artifact::read(&out2).unwrap();
    assert_eq!(a.device_num(), 8);
    let (ga, gb) = (a.rank_graphs().unwrap(), b.rank_graphs().unwrap());
    for (r, (x, y)) in ga.iter().zip(&gb).enumerate() {
        let strip = |g: &shardc::ir::Graph| {
            let mut g = g.clone();
            g.nodes.iter_mut().for_each(|n| n.comments.clear());
            shardc::ir::text::print_graph(&g)
        };
        assert_eq!(strip(x), strip(y), "rank {r}");
    }

    // A strategy file for another device count is refused with its name.
    let c = shardc(&[
        "compile",
        &model(),
        "-o",
        dir.join("art3").to_str().unwrap(),
        "--device-num",
        "4",
        "--parallel-mode",
        "semi_auto_parallel",
        "--strategy-ckpt-load-file",
        sfile.to_str().unwrap(),
    ]);
    assert_eq!(c.status.code(), Some(1));
    let t = text(&c);
    assert!(
        t.contains("strategy.json") && t.contains("written for 8 devices"),
        "{t}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn verify_explain_and_run_on_eight_ranks() {
    let v = shardc(&[
        "verify",
        &model(),
        "--device-num",
        "8",
        "--parallel-mode",
        "auto_parallel",
        "--steps",
        "2",
    ]);
    let t = text(&v);
    assert!(v.status.success(), "{t}");
    assert!(t.contains("PASS"), "{t}");
    assert!(t.contains("moments.w2"), "{t}");

    let dir = tmp("explain");
    let out = dir.join("art");
    let c = shardc(&[
        "compile",
        &model(),
        "-o",
        out.to_str().unwrap(),
        "--device-num",
        "8",
        "--parallel-mode",
        "auto_parallel",
    ]);
    assert!(c.status.success(), "{}", text(&c));
    let e = shardc(&["explain", out.to_str().unwrap(), "--op", "relu"]);
    let t = text(&e);
    assert!(e.status.success(), "{t}");
    // Propagation completed the plan exactly and names the edge that decided the op.
    assert!(t.contains("sharding propagation, solved exactly"), "{t}");
    assert!(t.contains("decided by "), "{t}");
    assert!(t.contains("<- chosen"), "{t}");
    assert!(t.contains("bytes/step"), "{t}");
    let e = shardc(&["explain", out.to_str().unwrap(), "--op", "rel"]);
    assert_eq!(e.status.code(), Some(1));
    assert!(
        text(&e).contains("similar name: grad_relu, relu"),
        "{}",
        text(&e)
    );

    let r = shardc(&["run", out.to_str().unwrap(), "--steps", "3"]);
    let t = text(&r);
    assert!(r.status.success(), "{t}");
    assert_eq!(t.matches(", loss is ").count(), 3, "{t}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn verify_needs_a_parallel_context() {
    let v = shardc(&["verify", &model()]);
    assert_eq!(v.status.code(), Some(1));
    assert!(text(&v).contains("nothing to verify"), "{}", text(&v));
}

#[test]
fn a_config_file_sets_the_parallel_context_and_flags_override_it() {
    let cfg = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/parallel_8.toml");
    let v = shardc(&[
        "verify",
        &model(),
        "--config",
        cfg.to_str().unwrap(),
        "--steps",
        "1",
    ]);
    let t = text(&v);
    assert!(v.status.success(), "{t}");
    assert!(t.contains("semi_auto_parallel on 8 devices"), "{t}");
    let v = shardc(&[
        "verify",
        &model(),
        "--config",
        cfg.to_str().unwrap(),
        "--device-num",
        "4",
        "--dataset-strategy",
        "full_batch",
        "--steps",
        "1",
    ]);
    let t = text(&v);
    // The file's matmul strategy ((2, 4), (4, 1)) needs 8 devices: on 4 it is refused by name.
    assert_eq!(v.status.code(), Some(1), "{t}");
    assert!(
        t.contains("'matmul'") && t.contains("device_num is 4"),
        "{t}"
    );
    let bad = std::env::temp_dir().join(format!("shardc-pcli-bad-{}.toml", std::process::id()));
    std::fs::write(&bad, "device_num = 8\ndevce_num = 4\n").unwrap();
    let v = shardc(&["verify", &model(), "--config", bad.to_str().unwrap()]);
    let t = text(&v);
    assert_eq!(v.status.code(), Some(1), "{t}");
    assert!(
        t.contains(":2: unknown key `devce_num` (did you mean `device_num`?)"),
        "{t}"
    );
    assert_eq!(t.matches("unknown key").count(), 1, "printed once: {t}");
    let _ = std::fs::remove_file(&bad);
}

/// Every searcher from the command line: the artifact and strategy file record the searcher
/// and its predicted step, `explain` shows the searched candidates' costs, verify passes.
#[test]
fn searched_strategies_are_explained_recorded_and_verified() {
    let dir = tmp("search");
    for mode in ["recursive_programming", "dynamic_programming", "ilp"] {
        let out = dir.join(mode);
        let sf = dir.join(format!("{mode}.json"));
        let c = shardc(&[
            "compile",
            &model(),
            "-o",
            out.to_str().unwrap(),
            "--device-num",
            "8",
            "--parallel-mode",
            "auto_parallel",
            "--search-mode",
            mode,
            "--device",
            "8xh100",
            "--strategy-ckpt-save-file",
            sf.to_str().unwrap(),
        ]);
        assert!(c.status.success(), "{mode}: {}", text(&c));
        let e = shardc(&["explain", out.to_str().unwrap(), "--op", "relu"]);
        let t = text(&e);
        assert!(e.status.success(), "{t}");
        assert!(t.contains(&format!("searched by {mode}")), "{t}");
        assert!(t.contains("memory KiB"), "{t}");
        assert!(t.contains("<- chosen"), "{t}");
        let file: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&sf).unwrap()).unwrap();
        assert_eq!(file["searcher"], mode, "{file}");
        assert!(
            file["predicted"]["step_seconds"].as_f64().unwrap() > 0.0,
            "{file}"
        );
        let m: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("manifest.json")).unwrap())
                .unwrap();
        assert_eq!(m["extra"]["search"]["searcher"], mode, "{m}");
        let v = shardc(&[
            "verify",
            &model(),
            "--device-num",
            "8",
            "--parallel-mode",
            "auto_parallel",
            "--search-mode",
            mode,
            "--steps",
            "2",
        ]);
        assert!(v.status.success(), "{mode}: {}", text(&v));
        assert!(text(&v).contains("PASS"), "{}", text(&v));
    }
    let bad = shardc(&[
        "compile",
        &model(),
        "-o",
        dir.join("x").to_str().unwrap(),
        "--device-num",
        "8",
        "--parallel-mode",
        "auto_parallel",
        "--search-mode",
        "recursive_programming",
        "--device",
        "nosuch",
    ]);
    assert_eq!(bad.status.code(), Some(1), "{}", text(&bad));
    assert!(
        text(&bad).contains(
            "--device nosuch: neither a preset (cpu, 8xh100, ascend910) nor an existing file"
        ),
        "{}",
        text(&bad)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `shardc gen`: every model prints text IR that parses and compiles under a searcher; a bad
/// value is a clear error.
#[test]
fn generated_models_parse_and_compile_under_a_searcher() {
    let dir = tmp("gen");
    std::fs::create_dir_all(&dir).unwrap();
    for (name, args) in [
        (
            "transformer",
            vec![
                "transformer",
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
            ],
        ),
        (
            "wrn",
            vec![
                "wide-resnet",
                "--depth",
                "10",
                "--widen",
                "1",
                "--batch",
                "8",
            ],
        ),
        (
            "emb",
            vec![
                "embedding",
                "--vocab",
                "1000",
                "--embed",
                "8",
                "--seq",
                "4",
                "--batch",
                "8",
            ],
        ),
        (
            "random",
            vec!["random", "--ops", "120", "--width", "32", "--batch", "32"],
        ),
    ] {
        let file = dir.join(format!("{name}.ir"));
        let mut a = vec!["gen"];
        a.extend(&args);
        a.extend(["-o", file.to_str().unwrap()]);
        let g = shardc(&a);
        assert!(g.status.success(), "{name}: {}", text(&g));
        let src = std::fs::read_to_string(&file).unwrap();
        parse_graph(&src, &file.display().to_string()).unwrap_or_else(|e| panic!("{name}: {e}"));
        let c = shardc(&[
            "compile",
            file.to_str().unwrap(),
            "-o",
            dir.join(name).to_str().unwrap(),
            "--device-num",
            "4",
            "--parallel-mode",
            "auto_parallel",
            "--search-mode",
            "dynamic_programming",
        ]);
        assert!(c.status.success(), "{name}: {}", text(&c));
    }
    let bad = shardc(&["gen", "transformer", "--hidden", "30", "--heads", "4"]);
    assert_eq!(bad.status.code(), Some(1), "{}", text(&bad));
    assert!(text(&bad).contains("30"), "{}", text(&bad));
    let _ = std::fs::remove_dir_all(&dir);
}
