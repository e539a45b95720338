//! MindSpore's `.ckpt` checkpoints, with a fixture MindSpore 2.10 wrote itself
//! (`tests/data/mindspore/make_ckpt.py`, versions in `VERSIONS`): the tutorial's network
//! (narrowed to 64 -> 32 -> 32 -> 10) trained 3 steps with Momentum, saved with its optimizer
//! state, then 3 more steps on the same batch (`losses.txt`).
//!
//! - The file reads as MindSpore's `load_checkpoint` lists it.
//! - `shardc run --init-from tutorial.ckpt --data batch.npz` continues from it and prints
//!   MindSpore's next losses (1e-6 relative), on one device and on 4 data-parallel ranks;
//!   so does an artifact compiled with `--init-from`, run without it.
//! - A checkpoint that does not fit the model is an error listing every fault.
//! - The weights shardc saves after training go back to `.ckpt` and load as they were.

mod cli_common;

use cli_common::{
    losses, made_tmp, mindspore_fixture, mindspore_losses, path_str as s, run_shardc as shardc,
    text,
};
use shardc::compiler::zoo;
use shardc::ir::text::print_graph;
use shardc::runtime::checkpoint;
use shardc::runtime::mindspore_ckpt;
use shardc::runtime::Tensor;
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> PathBuf {
    mindspore_fixture(name)
}

/// The tutorial network as text IR (batch 16), compiled as MindSpore trained it: Momentum
/// 0.1 / 0.9, on `extra`'s devices.
fn compile(dir: &Path, name: &str, extra: &[&str]) -> PathBuf {
    let g = zoo::mlp(16, &[64, 32, 32, 10]).expect("the tutorial network");
    let model = dir.join("network.ir");
    std::fs::write(&model, print_graph(&g)).expect("model");
    let art = dir.join(name);
    let mut args = vec![
        "compile",
        s(&model),
        "-o",
        s(&art),
        "--optimizer",
        "momentum",
        "--learning-rate",
        "0.1",
        "--momentum",
        "0.9",
    ];
    args.extend_from_slice(extra);
    let o = shardc(&args);
    assert!(o.status.success(), "compile: {}", text(&o));
    art
}

#[test]
fn mindspores_checkpoint_reads_as_load_checkpoint_lists_it() {
    let t = mindspore_ckpt::read(&fixture("tutorial.ckpt")).expect("reads");
    let names: Vec<&str> = t.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names.len(), 15, "{names:?}");
    let shape = |n: &str| t.iter().find(|(m, _)| m == n).expect(n).1.shape.clone();
    assert_eq!(shape("dense_relu_sequential.0.weight"), [32, 64]);
    assert_eq!(shape("moments.dense_relu_sequential.4.bias"), [10]);
    assert_eq!(shape("global_step"), [1]);
    assert!(shape("learning_rate").is_empty());
    let step = &t.iter().find(|(n, _)| n == "global_step").expect("step").1;
    assert_eq!(step, &Tensor::from_i32(vec![1], vec![3]).expect("t"));
}

#[test]
fn a_run_from_mindspores_checkpoint_prints_mindspores_next_losses() {
    let want = mindspore_losses();
    let dir = made_tmp("ms-ckpt", "losses");
    let one = compile(&dir, "one", &[]);
    let four = compile(
        &dir,
        "four",
        &[
            "--device-num",
            "4",
            "--parallel-mode",
            "data_parallel",
            "--gradients-mean",
        ],
    );
    // `shardc compile --init-from` keeps the weights in the artifact instead.
    let ckpt = fixture("tutorial.ckpt");
    let batch = fixture("batch.npz");
    let baked = compile(&dir, "baked", &["--init-from", s(&ckpt)]);
    let baked4 = compile(
        &dir,
        "baked4",
        &[
            "--init-from",
            s(&ckpt),
            "--device-num",
            "4",
            "--parallel-mode",
            "data_parallel",
            "--gradients-mean",
        ],
    );
    for (art, flag) in [
        (&one, true),
        (&four, true),
        (&baked, false),
        (&baked4, false),
    ] {
        let mut args = vec![
            "run",
            s(art),
            "--steps",
            "3",
            "--threads",
            "1",
            "--data",
            s(&batch),
        ];
        if flag {
            args.extend(["--init-from", s(&ckpt)]);
        }
        let o = shardc(&args);
        assert!(o.status.success(), "{}", text(&o));
        let got = losses(&String::from_utf8_lossy(&o.stdout));
        eprintln!("{}: {got:?} (MindSpore: {want:?})", art.display());
        assert_eq!(got.len(), want.len(), "{}", text(&o));
        for (g, w) in got.iter().zip(&want) {
            assert!(
                (g - w).abs() <= 1e-6 * w.abs(),
                "{}: {got:?} vs MindSpore's {want:?}",
                art.display()
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_checkpoint_that_does_not_fit_is_an_error_listing_every_fault() {
    let dir = made_tmp("ms-ckpt", "faults");
    let one = compile(&dir, "one", &[]);
    let mut t = mindspore_ckpt::read(&fixture("tutorial.ckpt")).expect("reads");
    // One weight missing, one of another shape, one unknown tensor.
    t.retain(|(n, _)| n != "dense_relu_sequential.2.bias");
    for (n, v) in &mut t {
        if n == "dense_relu_sequential.4.weight" {
            *v = Tensor::from_f32(vec![32, 10], vec![0.0; 320]).expect("t");
        }
    }
    t.push((
        "head.weight".into(),
        Tensor::from_f32(vec![2], vec![1.0, 2.0]).expect("t"),
    ));
    let bad = dir.join("bad.ckpt");
    mindspore_ckpt::write(&bad, &t).expect("writes");
    let o = shardc(&["run", s(&one), "--steps", "1", "--init-from", s(&bad)]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    for want in [
        "bad.ckpt",
        "dense_relu_sequential.2.bias Float32 [32] is missing",
        "dense_relu_sequential.4.weight is Float32 [32, 10] in the file but Float32 [10, 32] in the model",
        "not parameters of the model: head.weight",
    ] {
        assert!(err.contains(want), "want {want:?} in {err}");
    }
    // A truncated file is an error naming it.
    let bytes = std::fs::read(fixture("tutorial.ckpt")).expect("fixture");
    let cut = dir.join("cut.ckpt");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).expect("cut");
    let o = shardc(&["run", s(&one), "--steps", "1", "--init-from", s(&cut)]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("cut.ckpt") && err.contains("checkpoint.proto"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn shardcs_weights_go_back_to_a_mindspore_checkpoint() {
    let dir = made_tmp("ms-ckpt", "back");
    let one = compile(&dir, "one", &[]);
    let ck = dir.join("ck");
    let o = shardc(&[
        "run",
        s(&one),
        "--steps",
        "2",
        "--init-from",
        s(&fixture("tutorial.ckpt")),
        "--data",
        s(&fixture("batch.npz")),
        "--checkpoint-dir",
        s(&ck),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let file = std::fs::read_dir(ck.join("0"))
        .expect("rank 0's checkpoints")
        .map(|e| e.expect("entry").path())
        .find(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .expect("a checkpoint");
    let saved = checkpoint::load(&file).expect("loads");
    let back = dir.join("back.ckpt");
    let o = shardc(&["ckpt", "export", s(&file), "-o", s(&back)]);
    assert!(o.status.success(), "{}", text(&o));
    let read = mindspore_ckpt::read(&back).expect("reads");
    assert_eq!(read.len(), saved.tensors.len());
    for ((a, x), (b, y)) in read.iter().zip(&saved.tensors) {
        assert_eq!((a, x), (b, y));
    }
    // And the exported file starts a run as the MindSpore one did.
    let o = shardc(&["run", s(&one), "--steps", "1", "--init-from", s(&back)]);
    assert!(o.status.success(), "{}", text(&o));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The Rust API, as MindSpore's: `load_checkpoint` + `load_param_into_net` into a built
/// `Model` of the tutorial network, then `Model::train` on the numpy batch prints MindSpore's
/// next losses; `save_checkpoint` writes a `.ckpt` that loads back to the trained weights.
#[test]
fn load_param_into_net_continues_mindspores_training_in_model() {
    use shardc::compiler::loss::SoftmaxCrossEntropyWithLogits;
    use shardc::compiler::optim::Momentum;
    use shardc::compiler::zoo::MlpNetwork;
    use shardc::runtime::data::{NumpySlicesDataset, SourceOptions};
    use shardc::train::{load_checkpoint, load_param_into_net, save_checkpoint, Model};
    let want = mindspore_losses();
    let data = NumpySlicesDataset::from_file(
        &fixture("batch.npz"),
        Some(&["x", "label"]),
        SourceOptions::default(),
    )
    .expect("data")
    .batch(16, true)
    .expect("batch");
    let mut model = Model::new(
        MlpNetwork::new(&[64, 32, 32, 10]),
        SoftmaxCrossEntropyWithLogits::new(true, "mean"),
        &Momentum::new(0.1, 0.9),
    )
    .with_threads(1);
    // Not built yet: loading says so.
    let params = load_checkpoint(&fixture("tutorial.ckpt")).expect("load_checkpoint");
    let e = load_param_into_net(&mut model, &params, true).expect_err("not built");
    assert!(e.to_string().contains("not built yet"), "{e}");
    let first = data
        .iter(0)
        .expect("iter")
        .next()
        .expect("a batch")
        .expect("batch");
    model.build(&first, &data.column_names()).expect("build");
    let (param_not_load, ckpt_not_load) =
        load_param_into_net(&mut model, &params, true).expect("load_param_into_net");
    assert!(param_not_load.is_empty(), "{param_not_load:?}");
    assert_eq!(ckpt_not_load, ["global_step", "learning_rate", "momentum"]);
    let got = model.train(3, &data, &mut []).expect("train").losses;
    eprintln!("Model: {got:?} (MindSpore: {want:?})");
    for (g, w) in got.iter().zip(&want) {
        assert!(
            (g - w).abs() <= 1e-6 * w.abs(),
            "{got:?} vs MindSpore's {want:?}"
        );
    }
    // A transposed weight is an error naming it.
    let mut bad = params.clone();
    bad.insert(
        "dense_relu_sequential.4.weight".into(),
        Tensor::from_f32(vec![32, 10], vec![0.0; 320]).expect("t"),
    );
    let e = load_param_into_net(&mut model, &bad, false).expect_err("wrong shape");
    assert!(
        e.to_string()
            .contains("dense_relu_sequential.4.weight is Float32 [32, 10]"),
        "{e}"
    );
    // save_checkpoint -> .ckpt -> the same weights.
    let dir = made_tmp("ms-ckpt", "save");
    let file = dir.join("trained.ckpt");
    save_checkpoint(&model, &file).expect("save_checkpoint");
    let back = load_checkpoint(&file).expect("reads back");
    let now = model
        .executor()
        .expect("built")
        .weight_values()
        .expect("weights");
    assert_eq!(back.len(), now.len());
    for (n, t) in now {
        assert_eq!(back.get(&n), Some(&t), "{n}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
