//! `shardc import model.onnx`: models exported by PyTorch's own ONNX exporter
//! (`tests/data/onnx`, made by `make_onnx.py`) read into shardc, whose forward output equals
//! the exporter's (onnxruntime's) on the fixed input, and which compile for 8 devices in
//! every parallel mode and search mode, pass `shardc verify` and train.
//!
//! - `mlp.onnx`: the MindSpore tutorial's 64 -> 32 -> 32 -> 10 network, batch 16;
//! - `resnet18_narrow.onnx`: ResNet-18's topology at reduced width (4/8/16/32 channels),
//!   input (2, 3, 32, 32), BatchNorm in inference mode;
//! - `gpt2_tiny.onnx`: a one-layer Hugging Face GPT-2 (32 wide, 2 heads, vocabulary 64),
//!   input ids (2, 8), the logits as output; also exported at opsets 13 and 20
//!   (`gpt2_tiny_opset13.onnx`, `gpt2_tiny_opset20.onnx`), whose forward output is checked.
//!
//! - `masked_softmax.onnx`: `Where(constant causal mask, computed scores, min or -inf)`
//!   then softmax.
//!
//! The batches of 2 do not split over 8 devices, so the two small models compile with
//! `--dataset-strategy full_batch` (every rank reads the whole batch).

mod cli_common;

use cli_common::{losses, made_tmp, path_str as s, run_shardc as shardc, text, EVERY_MODE};
use shardc::runtime::data::numpy::{read_npz, read_safetensors};
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/onnx")
        .join(name)
}

/// The largest |a - b| over the largest |b|.
fn max_rel(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len(), "output sizes differ");
    let diff = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max);
    let scale = b.iter().map(|y| y.abs()).fold(0.0, f64::max);
    diff / scale
}

/// `shardc import NAME.onnx`, then `shardc predict` on the fixture's input: the model's
/// `.ir` and weights, and the largest relative difference from the exporter's output.
fn import_and_predict(dir: &Path, name: &str, output: &str) -> (PathBuf, PathBuf, f64) {
    let ir = dir.join(format!("{name}.ir"));
    let w = dir.join(format!("{name}.safetensors"));
    let o = shardc(&[
        "import",
        s(&fixture(&format!("{name}.onnx"))),
        "-o",
        s(&ir),
        "--weights",
        s(&w),
    ]);
    assert!(o.status.success(), "import {name}: {}", text(&o));
    assert!(text(&o).contains("(ONNX)"), "{}", text(&o));
    let npz = fixture(&format!("{name}.npz"));
    let out = dir.join(format!("{name}.out.safetensors"));
    let o = shardc(&[
        "predict",
        s(&ir),
        "--init-from",
        s(&w),
        "--data",
        s(&npz),
        "-o",
        s(&out),
    ]);
    assert!(o.status.success(), "predict {name}: {}", text(&o));
    let got = read_safetensors(&out).expect("the predictions");
    let (key, got) = got.into_iter().next().expect("one output");
    assert_eq!(key, output, "the output is named after the ONNX graph's");
    let want = read_npz(&npz)
        .expect("the fixture")
        .into_iter()
        .find(|(k, _)| k == "expected")
        .expect("the exporter's output")
        .1;
    assert_eq!(got.shape, want.shape, "{name}: output shape");
    (ir, w, max_rel(&got.to_f64_vec(), &want.to_f64_vec()))
}

/// Compiles `ir` with `loss` for 8 devices under semi_auto_parallel and auto_parallel with
/// every search mode; verifies it (`verify --loss`) under semi_auto_parallel and
/// auto_parallel; trains the semi_auto_parallel artifact 3 steps from the imported weights.
fn compile_verify_train(dir: &Path, ir: &Path, w: &Path, loss: &str, full_batch: bool) {
    let mut common = vec!["--loss", loss, "--device-num", "8", "--init-from", s(w)];
    if full_batch {
        common.extend(["--dataset-strategy", "full_batch"]);
    }
    // Every mode but data_parallel, which splits the batch whatever the dataset strategy.
    let modes = &EVERY_MODE[1..];
    for (i, mode) in modes.iter().enumerate() {
        let art = dir.join(format!("art{i}"));
        let mut args = vec!["compile", s(ir), "-o", s(&art)];
        args.extend(&common);
        args.extend(mode.iter());
        let o = shardc(&args);
        assert!(o.status.success(), "{args:?}: {}", text(&o));
    }
    for mode in &modes[..2] {
        let mut args = vec!["verify", s(ir), "--loss", loss, "--device-num", "8"];
        if full_batch {
            args.extend(["--dataset-strategy", "full_batch"]);
        }
        args.extend(mode.iter());
        let o = shardc(&args);
        assert!(o.status.success(), "{args:?}: {}", text(&o));
        assert!(text(&o).contains("PASS"), "{}", text(&o));
    }
    let art = dir.join("art0");
    let o = shardc(&["run", s(&art), "--steps", "3", "--init-from", s(w)]);
    assert!(o.status.success(), "run: {}", text(&o));
    let l = losses(&String::from_utf8_lossy(&o.stdout));
    assert_eq!(l.len(), 3, "{}", text(&o));
    assert!(l.iter().all(|x| x.is_finite()), "losses {l:?}");
}

#[test]
fn mlp_predicts_the_exporters_output_and_trains_in_parallel() {
    let dir = made_tmp("import_onnx", "mlp");
    let (ir, w, rel) = import_and_predict(&dir, "mlp", "expected");
    assert!(rel <= 1e-5, "mlp: max relative error {rel:e}");
    compile_verify_train(&dir, &ir, &w, "sparse_softmax_cross_entropy", false);
}

#[test]
fn resnet18_narrow_predicts_the_exporters_output_and_trains_in_parallel() {
    let dir = made_tmp("import_onnx", "resnet");
    let (ir, w, rel) = import_and_predict(&dir, "resnet18_narrow", "expected");
    assert!(rel <= 1e-5, "resnet: max relative error {rel:e}");
    compile_verify_train(&dir, &ir, &w, "sparse_softmax_cross_entropy", true);
}

#[test]
fn gpt2_tiny_predicts_the_exporters_logits_and_trains_in_parallel() {
    let dir = made_tmp("import_onnx", "gpt2");
    let (ir, w, rel) = import_and_predict(&dir, "gpt2_tiny", "logits");
    assert!(rel <= 1e-5, "gpt2: max relative error {rel:e}");
    compile_verify_train(&dir, &ir, &w, "mse", true);
}

#[test]
fn gpt2_tiny_at_opsets_13_and_20_predicts_the_exporters_logits() {
    // Opset 13 writes LayerNorm as ReduceMean/Sub/Pow/Sqrt/Div, opset 20 GeLU as one node.
    for name in ["gpt2_tiny_opset13", "gpt2_tiny_opset20"] {
        let dir = made_tmp("import_onnx", name);
        let (_, _, rel) = import_and_predict(&dir, name, "logits");
        assert!(rel <= 1e-5, "{name}: max relative error {rel:e}");
    }
}

#[test]
fn the_exact_gelu_predicts_the_exporters_output_at_opsets_17_and_20() {
    // Opset 17 writes nn.GELU() with an Erf node, opset 20 as Gelu(approximate="none"):
    // both become shardc's Erf inside x/2 (1 + erf(x/sqrt 2)).
    for name in ["gelu_exact_opset17", "gelu_exact_opset20"] {
        let dir = made_tmp("import_onnx", name);
        let (ir, w, rel) = import_and_predict(&dir, name, "expected");
        assert!(rel <= 1e-5, "{name}: max relative error {rel:e}");
        let text = std::fs::read_to_string(&ir).expect("ir");
        assert!(text.contains(" = Erf("), "{name}: no Erf in\n{text}");
        if name.ends_with("17") {
            compile_verify_train(&dir, &ir, &w, "mse", false);
        }
    }
}

#[test]
fn a_where_with_constant_mask_stays_exact_through_softmax() {
    // Scores of a computed tensor masked with float32's min and with -inf, then softmax:
    // the rewrite must give exactly 0 for the masked entries, never NaN.
    let dir = made_tmp("import_onnx", "masked");
    let (ir, w, rel) = import_and_predict(&dir, "masked_softmax", "expected");
    assert!(rel <= 1e-5, "masked softmax: max relative error {rel:e}");
    compile_verify_train(&dir, &ir, &w, "mse", true);
}

/// `shardc import FILE`, which must fail: its output.
fn import_fails(file: &str) -> String {
    let dir = made_tmp("import_onnx", file);
    let o = shardc(&["import", s(&fixture(file)), "-o", s(&dir.join("m.ir"))]);
    assert!(!o.status.success(), "{file} imported");
    text(&o)
}

#[test]
fn every_unmapped_op_is_named() {
    let t = import_fails("unmapped.onnx");
    assert!(t.contains("2 op(s) have no mapping"), "{t}");
    assert!(t.contains("Sin (node `/Sin`)"), "{t}");
    assert!(t.contains("Cos (node `/Cos`)"), "{t}");
}

#[test]
fn bad_files_are_named_errors() {
    let t = import_fails("truncated.onnx");
    assert!(t.contains("truncated.onnx: not an ONNX model"), "{t}");
    let t = import_fails("opset9.onnx");
    assert!(t.contains("opset 9 is not supported"), "{t}");
    let t = import_fails("symbolic.onnx");
    assert!(
        t.contains("graph input `x`") && t.contains("dimension 0 is symbolic (`batch`)"),
        "{t}"
    );
}
