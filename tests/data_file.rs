//! `shardc run --data FILE`: a model trained on the arrays of an `.npz` file (one per input,
//! named after it, the first dimension the sample) prints the same losses on one device and
//! on 4 data-parallel ranks (each feeding its block of the same global batches), different
//! from the synthetic data's; a file that does not fit the model is an error naming the
//! array, what it is and what the input takes.

mod cli_common;

use cli_common::{
    compile_quickstart, losses, made_tmp, path_str as s, run_shardc as shardc, same_losses, text,
};
use shardc::runtime::data::numpy::write_npz;
use shardc::runtime::Tensor;
use std::path::Path;

/// 48 samples (3 batches of the quickstart's 16): `x` (48, 32) and `label` (48, 16), a fixed
/// function of the sample and column.
fn samples() -> (Tensor, Tensor) {
    let v = |n: usize, cols: usize, k: f32| -> Vec<f32> {
        (0..n * cols)
            .map(|i| (i as f32 * k).sin() * 0.5 + (i % 7) as f32 * 0.01)
            .collect()
    };
    (
        Tensor::from_f32(vec![48, 32], v(48, 32, 0.37)).expect("x"),
        Tensor::from_f32(vec![48, 16], v(48, 16, 0.11)).expect("label"),
    )
}

#[test]
fn a_data_file_trains_alike_on_one_device_and_four_ranks() {
    let dir = made_tmp("data-file", "train");
    let (x, label) = samples();
    let data = dir.join("d.npz");
    write_npz(&data, &[("x", &x), ("label", &label)]).expect("npz");
    let one = dir.join("one");
    compile_quickstart(&one, &[]);
    let four = dir.join("four");
    compile_quickstart(
        &four,
        &[
            "--device-num",
            "4",
            "--parallel-mode",
            "data_parallel",
            "--gradients-mean",
        ],
    );
    let run = |art: &Path, extra: &[&str]| -> Vec<f64> {
        let mut args = vec!["run", s(art), "--steps", "6", "--threads", "1"];
        args.extend_from_slice(extra);
        let o = shardc(&args);
        assert!(o.status.success(), "{args:?}: {}", text(&o));
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        // The file's 3 batches are one epoch.
        assert!(
            extra.is_empty() || out.contains("epoch: 2 step: 3,"),
            "{out}"
        );
        losses(&out)
    };
    let single = run(&one, &["--data", s(&data)]);
    assert_eq!(single.len(), 6);
    // The batches cycle: steps 4-6 see steps 1-3's samples with trained weights.
    assert!(single[3] < single[0], "{single:?}");
    let ranks = run(&four, &["--data", s(&data)]);
    same_losses(&ranks, &single, "4 ranks vs one device on the file");
    let synthetic = run(&one, &[]);
    assert!(
        (synthetic[0] - single[0]).abs() > 1e-6,
        "the file's data is what trained: {synthetic:?} vs {single:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_data_file_that_does_not_fit_the_model_is_an_error_naming_the_array() {
    let dir = made_tmp("data-file", "errors");
    let one = dir.join("one");
    compile_quickstart(&one, &[]);
    let (x, _) = samples();
    let wrong_cols = Tensor::from_f32(vec![48, 8], vec![0.0; 48 * 8]).expect("t");
    let ints = Tensor::from_i32(vec![48, 16], vec![0; 48 * 16]).expect("t");
    let few = Tensor::from_f32(vec![8, 32], vec![0.0; 8 * 32]).expect("t");
    let few_labels = Tensor::from_f32(vec![8, 16], vec![0.0; 8 * 16]).expect("t");
    type Case<'a> = (Vec<(&'a str, &'a Tensor)>, Vec<&'a str>);
    let cases: Vec<Case> = vec![
        (
            vec![("x", &x)],
            vec!["no array for the model's input \"label\"", "[\"x\"]"],
        ),
        (
            vec![("x", &x), ("label", &wrong_cols)],
            vec!["array \"label\"", "[48, 8]", "shape [16]"],
        ),
        (
            vec![("x", &x), ("label", &ints)],
            vec!["array \"label\" is Int32", "Float32"],
        ),
        (
            vec![("x", &few), ("label", &few_labels)],
            vec!["8 samples, fewer than one batch of 16"],
        ),
    ];
    for (k, (arrays, wants)) in cases.into_iter().enumerate() {
        let path = dir.join(format!("bad{k}.npz"));
        write_npz(&path, &arrays).expect("npz");
        let o = shardc(&["run", s(&one), "--steps", "1", "--data", s(&path)]);
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(!o.status.success(), "case {k} ran");
        for w in wants {
            assert!(
                err.contains(w) && err.contains(s(&path)),
                "case {k}: want {w:?} in {err}"
            );
        }
    }
    // Not a data file at all.
    let o = shardc(&[
        "run",
        s(&one),
        "--steps",
        "1",
        "--data",
        s(&dir.join("x.csv")),
    ]);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains(".npz, .npy or .safetensors"),
        "{}",
        text(&o)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
