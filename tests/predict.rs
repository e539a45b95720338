//! `shardc predict`: a forward network's outputs on the samples of a data file, with its
//! weights from a checkpoint, on one device and on 4 ranks (data parallel and auto
//! parallel), equal the same network computed by hand; the tutorial network's loss and
//! forward output from MindSpore's checkpoint are MindSpore's (`tests/data/mindspore`).

mod cli_common;

use cli_common::{made_tmp, path_str as s, run_shardc as shardc, text};
use shardc::runtime::data::numpy::write_npz;
use shardc::runtime::mindspore_ckpt::{read_weights, write};
use shardc::runtime::Tensor;
use std::path::Path;

const NET: &str = "\
%para1_x : <Tensor[Float32], (16, 32)>
%para2_w : <Ref[Tensor(F32)], (32, 16), ref_key=:w>  :  has_default  init: normal(sigma=0.01, seed=1)
%para3_w2 : <Ref[Tensor(F32)], (16, 8), ref_key=:w2>  :  has_default  init: normal(sigma=0.01, seed=2)

subgraph @Net(%para1_x, %para2_w, %para3_w2) {
  %1(out) = MatMul(%para1_x, %para2_w) {instance name: matmul} primitive_attrs: {transpose_a: false, transpose_b: false}
  %2(out) = ReLU(%1) {instance name: relu}
  %3(logits) = MatMul(%2, %para3_w2) {instance name: logits} primitive_attrs: {transpose_a: false, transpose_b: false}
  Return(%3)
}
";

fn values(n: usize, k: f32) -> Vec<f32> {
    (0..n).map(|i| (i as f32 * k).sin() * 0.5).collect()
}

/// `relu(x @ w) @ w2`, row by row.
fn by_hand(x: &[f32], w: &[f32], w2: &[f32], rows: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(rows * 8);
    for r in 0..rows {
        let h: Vec<f32> = (0..16)
            .map(|j| {
                (0..32)
                    .map(|i| x[r * 32 + i] * w[i * 16 + j])
                    .sum::<f32>()
                    .max(0.0)
            })
            .collect();
        for c in 0..8 {
            out.push((0..16).map(|j| h[j] * w2[j * 8 + c]).sum());
        }
    }
    out
}

#[test]
fn predictions_equal_the_network_by_hand_on_one_device_and_four_ranks() {
    let dir = made_tmp("predict", "net");
    let model = dir.join("net.ir");
    std::fs::write(&model, NET).expect("model");
    // 40 samples: 2 whole batches of 16, 8 dropped.
    let (x, w, w2) = (
        values(40 * 32, 0.37),
        values(32 * 16, 0.11),
        values(16 * 8, 0.23),
    );
    let data = dir.join("x.npz");
    let xt = Tensor::from_f32(vec![40, 32], x.clone()).expect("x");
    write_npz(&data, &[("x", &xt)]).expect("npz");
    let weights = dir.join("w.ckpt");
    write(
        &weights,
        &[
            (
                "w".into(),
                Tensor::from_f32(vec![32, 16], w.clone()).expect("w"),
            ),
            (
                "w2".into(),
                Tensor::from_f32(vec![16, 8], w2.clone()).expect("w2"),
            ),
        ],
    )
    .expect("ckpt");
    let want = by_hand(&x, &w, &w2, 32);
    for (tag, extra) in [
        ("one", vec![]),
        (
            "dp4",
            vec!["--device-num", "4", "--parallel-mode", "data_parallel"],
        ),
        (
            "auto4",
            vec!["--device-num", "4", "--parallel-mode", "auto_parallel"],
        ),
    ] {
        let out = dir.join(format!("{tag}.safetensors"));
        let mut args = vec![
            "predict",
            s(&model),
            "--init-from",
            s(&weights),
            "--data",
            s(&data),
            "-o",
            s(&out),
        ];
        args.extend_from_slice(&extra);
        let o = shardc(&args);
        assert!(o.status.success(), "{tag}: {}", text(&o));
        let said = String::from_utf8_lossy(&o.stdout);
        assert!(
            said.contains("predicted 32 sample(s) in 2 batch(es) of 16")
                && said.contains("8 last sample(s) of the file dropped"),
            "{tag}: {said}"
        );
        let got = read_weights(&out).expect("the outputs");
        assert_eq!(got.len(), 1, "{tag}: {got:?}");
        assert_eq!(got[0].0, "logits");
        assert_eq!(got[0].1.shape, [32, 8]);
        for (a, b) in got[0].1.to_f64_vec().iter().zip(&want) {
            assert!(
                (a - *b as f64).abs() <= 1e-5 * (1.0 + a.abs()),
                "{tag}: {a} vs {b}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_tutorial_networks_loss_from_mindspores_checkpoint_is_mindspores() {
    let dir = made_tmp("predict", "tutorial");
    let fixture = |n: &str| {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/mindspore")
            .join(n)
    };
    let g = shardc::compiler::zoo::mlp(16, &[64, 32, 32, 10]).expect("network");
    let model = dir.join("network.ir");
    std::fs::write(&model, shardc::ir::text::print_graph(&g)).expect("model");
    let out = dir.join("loss.safetensors");
    let o = shardc(&[
        "predict",
        s(&model),
        "--init-from",
        s(&fixture("tutorial.ckpt")),
        "--data",
        s(&fixture("batch.npz")),
        "-o",
        s(&out),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let got = read_weights(&out).expect("outputs");
    // The loss before MindSpore's 4th step: the first line of losses.txt.
    let want: f64 = std::fs::read_to_string(fixture("losses.txt"))
        .expect("losses")
        .lines()
        .next()
        .expect("a loss")
        .parse()
        .expect("a number");
    let loss = got[0].1.to_f64_vec();
    assert_eq!(loss.len(), 1, "{got:?}");
    assert!(
        (loss[0] - want).abs() <= 1e-6 * want,
        "{} vs MindSpore's {want}",
        loss[0]
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn predict_names_what_is_missing() {
    let dir = made_tmp("predict", "errors");
    let model = dir.join("net.ir");
    std::fs::write(&model, NET).expect("model");
    let data = dir.join("x.npz");
    let xt = Tensor::from_f32(vec![16, 32], values(16 * 32, 0.3)).expect("x");
    write_npz(&data, &[("x", &xt)]).expect("npz");
    let weights = dir.join("w.ckpt");
    write(
        &weights,
        &[(
            "w".into(),
            Tensor::from_f32(vec![32, 16], values(512, 0.1)).expect("w"),
        )],
    )
    .expect("ckpt");
    let o = shardc(&[
        "predict",
        s(&model),
        "--init-from",
        s(&weights),
        "--data",
        s(&data),
        "-o",
        s(&dir.join("o.safetensors")),
    ]);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("w2 Float32 [16, 8] is missing"),
        "{}",
        text(&o)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The tutorial network's forward output, as MindSpore computed it on the exported network
/// (`tests/data/mindspore/make_mindir.py`: `tutorial_forward.npz`), is what `shardc predict`
/// computes from `tutorial.ckpt` on the same input (1e-5 relative).
#[test]
fn predict_gives_mindspores_forward_output_for_its_weights() {
    use shardc::compiler::nn::Cell;
    use shardc::compiler::GraphBuilder;
    let dir = made_tmp("predict", "forward");
    let fixture = |n: &str| {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/mindspore")
            .join(n)
    };
    // The network alone (no loss): x (16, 64) -> logits (16, 10).
    let mut b = GraphBuilder::new("Network");
    let x = b
        .input("x", shardc::ir::DType::Float32, &[16, 64])
        .expect("x");
    let logits = shardc::compiler::zoo::MlpNetwork::new(&[64, 32, 32, 10])
        .construct(&mut b, x)
        .expect("network");
    let g = b.finish(&[logits]).expect("graph");
    let model = dir.join("network.ir");
    std::fs::write(&model, shardc::ir::text::print_graph(&g)).expect("model");
    let out = dir.join("logits.safetensors");
    let o = shardc(&[
        "predict",
        s(&model),
        "--init-from",
        s(&fixture("tutorial.ckpt")),
        "--data",
        s(&fixture("tutorial_forward.npz")),
        "-o",
        s(&out),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let got = read_weights(&out).expect("outputs");
    let want = shardc::runtime::data::numpy::read_npz(&fixture("tutorial_forward.npz"))
        .expect("reference");
    let want = &want.iter().find(|(n, _)| n == "logits").expect("logits").1;
    assert_eq!(got[0].1.shape, want.shape);
    for (a, b) in got[0].1.to_f64_vec().iter().zip(want.to_f64_vec()) {
        assert!(
            (a - b).abs() <= 1e-5 * b.abs().max(1e-3),
            "{a} vs MindSpore's {b}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
