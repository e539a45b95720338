//! `shardc import` of MindSpore's MindIR, with fixtures MindSpore 2.10 exported itself
//! (`tests/data/mindspore/make_mindir.py`, versions in `VERSIONS`):
//!
//! - every fixture imports, and `shardc predict` on the imported model and weights gives
//!   MindSpore's own output on the exported input (1e-5 relative);
//! - wrapped with a loss, each compiles for 8 devices in every parallel mode and search mode,
//!   passes `shardc verify` and trains;
//! - the imported tutorial network, started from the `.ckpt` MindSpore trained, prints
//!   MindSpore's next losses (1e-6 relative);
//! - names, scopes and `.shard()` strategies are kept;
//! - unmapped primitives (every one listed) and damaged files are errors that say so.

mod cli_common;

use cli_common::{
    losses, made_tmp, mindspore_fixture, mindspore_losses, path_str as s, run_shardc as shardc,
    text, EVERY_MODE,
};
use shardc::runtime::data::numpy::read_arrays;
use shardc::runtime::Tensor;
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> PathBuf {
    mindspore_fixture(name)
}

/// Imports fixture `name.mindir` into `dir`: the model and its weights.
fn import(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let model = dir.join(format!("{name}.ir"));
    let weights = dir.join(format!("{name}.safetensors"));
    let o = shardc(&[
        "import",
        s(&fixture(&format!("{name}.mindir"))),
        "-o",
        s(&model),
        "--weights",
        s(&weights),
    ]);
    assert!(o.status.success(), "import {name}: {}", text(&o));
    (model, weights)
}

fn array(path: &Path, name: &str) -> Tensor {
    read_arrays(path)
        .expect("reads")
        .into_iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("{} has no `{name}`", path.display()))
        .1
}

/// Largest |a - b| over largest |b|.
fn max_rel(a: &Tensor, b: &Tensor) -> f64 {
    let a = a.to_f64_vec();
    let b = b.to_f64_vec();
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0f64, |m, v| m.max(v.abs()));
    let diff = a
        .iter()
        .zip(&b)
        .fold(0f64, |m, (x, y)| m.max((x - y).abs()));
    diff / scale
}

#[test]
fn imported_models_predict_mindspores_outputs() {
    let dir = made_tmp("import-mindir", "predict");
    for name in ["tutorial", "lenet", "block", "sharded"] {
        let (model, weights) = import(&dir, name);
        let forward = fixture(&format!("{name}_forward.npz"));
        let out = dir.join(format!("{name}.out.safetensors"));
        let o = shardc(&[
            "predict",
            s(&model),
            "--init-from",
            s(&weights),
            "--data",
            s(&forward),
            "-o",
            s(&out),
        ]);
        assert!(o.status.success(), "predict {name}: {}", text(&o));
        // The one output, named after its node (`bias_add3`).
        let outputs = read_arrays(&out).expect("reads");
        assert_eq!(outputs.len(), 1, "{name}");
        let got = outputs[0].1.clone();
        let want = array(&forward, "logits");
        assert_eq!(got.shape, want.shape, "{name}");
        let rel = max_rel(&got, &want);
        eprintln!("{name}: max relative difference to MindSpore {rel:.3e}");
        assert!(rel <= 1e-5, "{name}: {rel}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The loss flags each fixture trains with (its output against a `label` input).
fn loss_of(name: &str) -> Vec<&'static str> {
    match name {
        "block" => vec!["--loss", "mse"],
        _ => vec!["--loss", "sparse_softmax_cross_entropy"],
    }
}

#[test]
fn imported_models_compile_for_8_devices_in_every_mode_and_verify() {
    let dir = made_tmp("import-mindir", "modes");
    for name in ["tutorial", "lenet", "block"] {
        let (model, _) = import(&dir, name);
        for mode in EVERY_MODE {
            let art = dir.join(format!("{name}-art"));
            let mut args = vec!["compile", s(&model), "-o", s(&art), "--device-num", "8"];
            args.extend(loss_of(name));
            args.extend_from_slice(mode);
            let o = shardc(&args);
            assert!(o.status.success(), "{name} {mode:?}: {}", text(&o));
            assert!(art.join("manifest.json").exists(), "{name} {mode:?}");
        }
        // The invariant: 8 ranks of the default plan train as one device does.
        let mut args = vec!["verify", s(&model), "--device-num", "8", "--steps", "2"];
        args.extend(loss_of(name));
        let o = shardc(&args);
        assert!(o.status.success(), "verify {name}: {}", text(&o));
        assert!(
            String::from_utf8_lossy(&o.stdout).contains("PASS"),
            "{}",
            text(&o)
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn imported_tutorial_network_continues_mindspores_training() {
    let want = mindspore_losses();
    let dir = made_tmp("import-mindir", "continue");
    let (model, _) = import(&dir, "tutorial");
    for (name, parallel) in [
        ("one", &[][..]),
        (
            "four",
            &[
                "--device-num",
                "4",
                "--parallel-mode",
                "semi_auto_parallel",
                "--gradients-mean",
            ][..],
        ),
    ] {
        let art = dir.join(name);
        let mut args = vec![
            "compile",
            s(&model),
            "-o",
            s(&art),
            "--loss",
            "sparse_softmax_cross_entropy",
            "--optimizer",
            "momentum",
            "--learning-rate",
            "0.1",
            "--momentum",
            "0.9",
        ];
        args.extend_from_slice(parallel);
        let o = shardc(&args);
        assert!(o.status.success(), "compile {name}: {}", text(&o));
        let o = shardc(&[
            "run",
            s(&art),
            "--steps",
            "3",
            "--threads",
            "1",
            "--data",
            s(&fixture("batch.npz")),
            "--init-from",
            s(&fixture("tutorial.ckpt")),
        ]);
        assert!(o.status.success(), "run {name}: {}", text(&o));
        let got = losses(&String::from_utf8_lossy(&o.stdout));
        eprintln!("{name}: {got:?} (MindSpore: {want:?})");
        assert_eq!(got.len(), want.len(), "{}", text(&o));
        for (g, w) in got.iter().zip(&want) {
            assert!(
                (g - w).abs() <= 1e-6 * w.abs(),
                "{name}: {got:?} vs {want:?}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn imported_models_train_from_their_weights() {
    let dir = made_tmp("import-mindir", "train");
    for name in ["lenet", "block"] {
        let (model, weights) = import(&dir, name);
        let art = dir.join(format!("{name}-art"));
        let mut args = vec![
            "compile",
            s(&model),
            "-o",
            s(&art),
            "--device-num",
            "8",
            "--parallel-mode",
            "auto_parallel",
        ];
        args.extend(loss_of(name));
        let o = shardc(&args);
        assert!(o.status.success(), "compile {name}: {}", text(&o));
        let o = shardc(&[
            "run",
            s(&art),
            "--steps",
            "3",
            "--threads",
            "1",
            "--init-from",
            s(&weights),
        ]);
        assert!(o.status.success(), "run {name}: {}", text(&o));
        let got = losses(&String::from_utf8_lossy(&o.stdout));
        assert_eq!(got.len(), 3, "{name}: {}", text(&o));
        assert!(got.iter().all(|l| l.is_finite()), "{name}: {got:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn names_scopes_and_shard_strategies_are_kept() {
    let dir = made_tmp("import-mindir", "names");
    let (model, _) = import(&dir, "sharded");
    let ir = std::fs::read_to_string(&model).expect("ir");
    assert!(
        ir.contains("{instance name: matmul} primitive_attrs: {transpose_a: false, transpose_b: false, in_strategy: ((2, 1), (1, 1))}"),
        "{ir}"
    );
    assert!(
        ir.contains("{instance name: relu} primitive_attrs: {in_strategy: ((2, 1))}"),
        "{ir}"
    );
    let (model, _) = import(&dir, "lenet");
    let ir = std::fs::read_to_string(&model).expect("ir");
    for want in [
        "%para2_conv1.weight : <Ref[Tensor(F32)], (6, 1, 5, 5)",
        "# scope: (Default/conv2-Conv2d)",
        "# scope: (Default/bn-BatchNorm2d)",
        "%para6_bn.moving_mean : <Ref[Tensor(F32)], (16), ref_key=:bn.moving_mean>  :  has_default  init: zeros  requires_grad: false",
    ] {
        assert!(ir.contains(want), "`{want}` not in\n{ir}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn every_unmapped_primitive_is_listed_with_its_node_and_scope() {
    let dir = made_tmp("import-mindir", "unmapped");
    let o = shardc(&[
        "import",
        s(&fixture("unmapped.mindir")),
        "-o",
        s(&dir.join("m.ir")),
    ]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("2 op(s) have no mapping to shardc"), "{err}");
    assert!(
        err.contains("Sin (node `CNode_") && err.contains("scope Default/Sin-op0"),
        "{err}"
    );
    assert!(
        err.contains("Erfinv (node `CNode_") && err.contains("scope Default/Erfinv-op0"),
        "{err}"
    );
    assert!(!dir.join("m.ir").exists(), "nothing is written on an error");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_damaged_or_foreign_file_is_an_error_naming_it() {
    let dir = made_tmp("import-mindir", "damaged");
    let bytes = std::fs::read(fixture("tutorial.mindir")).expect("fixture");
    let cut = dir.join("cut.mindir");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).expect("write");
    let o = shardc(&["import", s(&cut), "-o", s(&dir.join("m.ir"))]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("cut.mindir: not a MindIR model:"), "{err}");

    let foreign = dir.join("batch.mindir");
    std::fs::copy(fixture("batch.npz"), &foreign).expect("copy");
    let o = shardc(&["import", s(&foreign), "-o", s(&dir.join("m.ir"))]);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("batch.mindir: not a MindIR model"),
        "{}",
        text(&o)
    );

    let o = shardc(&[
        "import",
        s(&fixture("batch.npz")),
        "-o",
        s(&dir.join("m.ir")),
    ]);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("unknown model format"),
        "{}",
        text(&o)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_artifact_predicts_with_its_own_plan_and_weights() {
    let dir = made_tmp("import-mindir", "predict-art");
    let (model, weights) = import(&dir, "lenet");
    let forward = fixture("lenet_forward.npz");
    let want = array(&forward, "logits");
    // 8 ranks, auto_parallel, the weights baked in: predict reads the forward graph, the
    // parallel context, the plan and the weights from the artifact.
    let art = dir.join("art8");
    let o = shardc(&[
        "compile",
        s(&model),
        "-o",
        s(&art),
        "--loss",
        "sparse_softmax_cross_entropy",
        "--device-num",
        "8",
        "--parallel-mode",
        "auto_parallel",
        "--init-from",
        s(&weights),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    for file in ["forward.ir", "parallel.toml", "strategy.json"] {
        assert!(art.join(file).exists(), "{file}");
    }
    let out = dir.join("out8.safetensors");
    let o = shardc(&["predict", s(&art), "--data", s(&forward), "-o", s(&out)]);
    assert!(o.status.success(), "{}", text(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        stdout.contains("on 8 device(s) with the plan of") && stdout.contains("strategy.json"),
        "{stdout}"
    );
    let got = read_arrays(&out).expect("outputs").remove(0).1;
    assert!(max_rel(&got, &want) <= 1e-5);

    // A pipeline's artifact predicts on one device, and says so.
    let art = dir.join("pipeline");
    let o = shardc(&[
        "compile",
        s(&model),
        "-o",
        s(&art),
        "--loss",
        "sparse_softmax_cross_entropy",
        "--device-num",
        "4",
        "--pipeline-stages",
        "2",
        "--micro-size",
        "2",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let out = dir.join("out-pipeline.safetensors");
    let o = shardc(&[
        "predict",
        s(&art),
        "--data",
        s(&forward),
        "--init-from",
        s(&weights),
        "-o",
        s(&out),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr)
            .contains("trains as a pipeline; its forward graph runs on one device"),
        "{}",
        text(&o)
    );
    let got = read_arrays(&out).expect("outputs").remove(0).1;
    assert!(max_rel(&got, &want) <= 1e-5);

    // An artifact without its forward graph says what to do.
    let manifest = art.join("manifest.json");
    let json = std::fs::read_to_string(&manifest).expect("manifest");
    std::fs::write(
        &manifest,
        json.replace("\"forward_model\"", "\"was_forward_model\""),
    )
    .expect("write");
    let o = shardc(&["predict", s(&art), "--data", s(&forward), "-o", s(&out)]);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains(
            "the artifact has no forward graph (compiled by an older shardc): recompile it"
        ),
        "{}",
        text(&o)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_name_map_and_the_conventions_match_renamed_weights() {
    use shardc::runtime::checkpoint::{self, Checkpoint};
    let dir = made_tmp("import-mindir", "name-map");
    let (model, weights) = import(&dir, "lenet");
    let forward = fixture("lenet_forward.npz");
    // The weights as a PyTorch state dict under a `backbone.` prefix would name them.
    let pytorch = |n: &str| {
        let n = n
            .replace("bn.gamma", "bn.weight")
            .replace("bn.beta", "bn.bias")
            .replace("moving_mean", "running_mean")
            .replace("moving_variance", "running_var");
        format!("backbone.{n}")
    };
    let renamed: Vec<(String, Tensor)> = read_arrays(&weights)
        .expect("weights")
        .into_iter()
        .map(|(n, t)| (pytorch(&n), t))
        .collect();
    let file = dir.join("torch.safetensors");
    checkpoint::save(&file, &Checkpoint::whole("LeNet", renamed)).expect("save");
    let map = dir.join("names.txt");
    std::fs::write(
        &map,
        "# PyTorch's module tree had the net under `backbone`\nbackbone.* = *\n",
    )
    .expect("map");
    let out = dir.join("out.safetensors");
    let predict = |extra: &[&str]| {
        let mut args = vec![
            "predict",
            s(&model),
            "--data",
            s(&forward),
            "-o",
            s(&out),
            "--init-from",
            s(&file),
        ];
        args.extend_from_slice(extra);
        shardc(&args)
    };
    let o = predict(&["--name-map", s(&map)]);
    assert!(o.status.success(), "{}", text(&o));
    let got = read_arrays(&out).expect("outputs").remove(0).1;
    assert!(max_rel(&got, &array(&forward, "logits")) <= 1e-5);

    // Without the map, every missing weight and every foreign tensor is listed.
    let o = predict(&[]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("the model's weight conv1.weight Float32 [6, 1, 5, 5] is missing"),
        "{err}"
    );
    assert!(
        err.contains("10 tensor(s) of the file are not parameters of the model: backbone.bn.bias"),
        "{err}"
    );

    // A rule that matches nothing is named.
    std::fs::write(&map, "backbone.* = *\nhead.* = fc.*\n").expect("map");
    let o = predict(&["--name-map", s(&map)]);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr)
            .contains("name map line 2: `head.* = fc.*` matches no tensor of the checkpoint"),
        "{}",
        text(&o)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
