//! `shardc compile --loss`: a forward network (its output the logits) wrapped with a loss,
//! as MindSpore's `WithLossCell`. The wrapped network trains to the same losses as the same
//! network written with its loss by hand, on one device and on 4 ranks; the label's default
//! type follows the loss; a model that already ends in a loss is refused, saying so.

mod cli_common;

use cli_common::{losses, made_tmp, path_str as s, run_shardc as shardc, same_losses, text};
use shardc::runtime::data::numpy::write_npz;
use shardc::runtime::Tensor;
use std::path::Path;

/// The forward network: `relu(x @ w) @ w2`, logits (16, 8).
const NET: &str = "\
%para1_x : <Tensor[Float32], (16, 32)>
%para2_w : <Ref[Tensor(F32)], (32, 16), ref_key=:w>  :  has_default  init: normal(sigma=0.1, seed=1)
%para3_w2 : <Ref[Tensor(F32)], (16, 8), ref_key=:w2>  :  has_default  init: normal(sigma=0.1, seed=2)

subgraph @Net(%para1_x, %para2_w, %para3_w2) {
  %1(out) = MatMul(%para1_x, %para2_w) {instance name: matmul} primitive_attrs: {transpose_a: false, transpose_b: false}
  %2(out) = ReLU(%1) {instance name: relu}
  %3(logits) = MatMul(%2, %para3_w2) {instance name: logits} primitive_attrs: {transpose_a: false, transpose_b: false}
  Return(%3)
}
";

/// The same network with MindSpore's MSELoss written by hand.
const NET_MSE: &str = "\
%para1_x : <Tensor[Float32], (16, 32)>
%para2_label : <Tensor[Float32], (16, 8)>
%para3_w : <Ref[Tensor(F32)], (32, 16), ref_key=:w>  :  has_default  init: normal(sigma=0.1, seed=1)
%para4_w2 : <Ref[Tensor(F32)], (16, 8), ref_key=:w2>  :  has_default  init: normal(sigma=0.1, seed=2)

subgraph @Net(%para1_x, %para2_label, %para3_w, %para4_w2) {
  %1(out) = MatMul(%para1_x, %para3_w) {instance name: matmul} primitive_attrs: {transpose_a: false, transpose_b: false}
  %2(out) = ReLU(%1) {instance name: relu}
  %3(logits) = MatMul(%2, %para4_w2) {instance name: logits} primitive_attrs: {transpose_a: false, transpose_b: false}
  %4(diff) = Sub(%3, %para2_label) {instance name: sub}
  %5(sq) = Square(%4) {instance name: square}
  %6(loss) = ReduceMean(%5, (0, 1)) {instance name: reduce_mean} primitive_attrs: {keep_dims: false}
  Return(%6)
}
";

fn values(n: usize, k: f32) -> Vec<f32> {
    (0..n).map(|i| (i as f32 * k).sin() * 0.5).collect()
}

fn compile(dir: &Path, model: &str, name: &str, extra: &[&str]) -> std::process::Output {
    let file = dir.join(format!("{name}.ir"));
    std::fs::write(&file, model).expect("model");
    let art = dir.join(name);
    let mut args = vec!["compile", s(&file), "-o", s(&art)];
    args.extend_from_slice(extra);
    shardc(&args)
}

fn run(dir: &Path, name: &str, data: &Path) -> Vec<f64> {
    let o = shardc(&[
        "run",
        s(&dir.join(name)),
        "--steps",
        "4",
        "--threads",
        "1",
        "--data",
        s(data),
    ]);
    assert!(o.status.success(), "{name}: {}", text(&o));
    losses(&String::from_utf8_lossy(&o.stdout))
}

#[test]
fn a_wrapped_forward_network_trains_as_the_network_written_with_its_loss() {
    let dir = made_tmp("with-loss", "mse");
    let data = dir.join("d.npz");
    let x = Tensor::from_f32(vec![32, 32], values(32 * 32, 0.37)).expect("x");
    let label = Tensor::from_f32(vec![32, 8], values(32 * 8, 0.11)).expect("label");
    write_npz(&data, &[("x", &x), ("label", &label)]).expect("npz");
    let dp4 = [
        "--device-num",
        "4",
        "--parallel-mode",
        "data_parallel",
        "--gradients-mean",
    ];
    for (name, model, extra) in [
        ("hand", NET_MSE, vec![]),
        ("wrapped", NET, vec!["--loss", "mse"]),
        ("wrapped4", NET, [&["--loss", "mse"][..], &dp4].concat()),
    ] {
        let o = compile(&dir, model, name, &extra);
        assert!(o.status.success(), "{name}: {}", text(&o));
    }
    let hand = run(&dir, "hand", &data);
    assert_eq!(hand.len(), 4);
    same_losses(&run(&dir, "wrapped", &data), &hand, "--loss mse vs by hand");
    same_losses(
        &run(&dir, "wrapped4", &data),
        &hand,
        "--loss mse on 4 ranks",
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_labels_type_follows_the_loss_and_a_model_with_a_loss_is_refused() {
    let dir = made_tmp("with-loss", "label");
    let o = compile(
        &dir,
        NET,
        "sparse",
        &["--loss", "sparse_softmax_cross_entropy"],
    );
    assert!(o.status.success(), "{}", text(&o));
    let printed = shardc(&["print", s(&dir.join("sparse"))]);
    let ir = String::from_utf8_lossy(&printed.stdout);
    assert!(ir.contains("_label : <Tensor[Int32], (16)>"), "{ir}");
    assert!(
        ir.contains("_loss_fn-SoftmaxCrossEntropyWithLogits"),
        "{ir}"
    );
    // Class indices train.
    let data = dir.join("d.npz");
    let x = Tensor::from_f32(vec![16, 32], values(16 * 32, 0.3)).expect("x");
    let label = Tensor::from_i32(vec![16], (0..16).map(|i| i % 8).collect()).expect("label");
    write_npz(&data, &[("x", &x), ("label", &label)]).expect("npz");
    let l = run(&dir, "sparse", &data);
    assert!(l[3] < l[0], "{l:?}");
    let o = compile(
        &dir,
        NET,
        "soft",
        &[
            "--loss",
            "softmax_cross_entropy",
            "--label-dtype",
            "float64",
        ],
    );
    assert!(
        !o.status.success(),
        "a float64 label for float32 logits compiles"
    );
    let o = compile(&dir, NET_MSE, "twice", &["--loss", "mse"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("already a scalar") && err.contains("without a loss"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
