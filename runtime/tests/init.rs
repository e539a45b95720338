//! Weight initializers: determinism, statistics, fans, dtype conversion and slices.

#![allow(clippy::single_range_in_vec_init)]

use shardc_ir::{DType, Init, TensorType};
use shardc_runtime::init::{fans, init_slice, init_tensor};
use shardc_runtime::Tensor;

fn ty(dtype: DType, shape: &[usize]) -> TensorType {
    TensorType::new(dtype, shape.to_vec())
}

fn mean_std(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
    (mean, var.sqrt())
}

#[test]
fn deterministic_per_seed() {
    let t = ty(DType::Float32, &[32, 16]);
    for init in [
        Init::Normal {
            sigma: 0.02,
            mean: 0.0,
            seed: 7,
        },
        Init::Uniform {
            scale: 0.5,
            seed: 7,
        },
        Init::XavierUniform { gain: 1.0, seed: 7 },
        Init::HeNormal { seed: 7 },
    ] {
        let a = init_tensor(&init, &t).unwrap();
        let b = init_tensor(&init, &t).unwrap();
        assert_eq!(a, b, "{init:?}");
        let mut other = init.clone();
        match &mut other {
            Init::Normal { seed, .. }
            | Init::Uniform { seed, .. }
            | Init::XavierUniform { seed, .. }
            | Init::HeNormal { seed } => *seed = 8,
            _ => unreachable!(),
        }
        let c = init_tensor(&other, &t).unwrap();
        assert_ne!(a, c, "{init:?}: another seed gives other numbers");
        // Not constant.
        let v = a.to_f64_vec();
        assert!(v.iter().any(|&x| x != v[0]));
    }
}

#[test]
fn normal_statistics() {
    let init = Init::Normal {
        sigma: 0.5,
        mean: 2.0,
        seed: 1,
    };
    let t = init_tensor(&init, &ty(DType::Float64, &[200, 500])).unwrap();
    let (mean, std) = mean_std(&t.to_f64_vec());
    // n = 1e5: the standard error of the mean is 0.5 / 316 = 0.0016.
    assert!((mean - 2.0).abs() < 0.01, "mean {mean}");
    assert!((std - 0.5).abs() < 0.01, "std {std}");
}

#[test]
fn uniform_and_xavier_bounds() {
    let t = init_tensor(
        &Init::Uniform {
            scale: 0.3,
            seed: 2,
        },
        &ty(DType::Float64, &[100, 1000]),
    )
    .unwrap();
    let v = t.to_f64_vec();
    assert!(v.iter().all(|x| x.abs() <= 0.3));
    let max = v.iter().cloned().fold(f64::MIN, f64::max);
    let min = v.iter().cloned().fold(f64::MAX, f64::min);
    assert!(max > 0.299 && min < -0.299, "{min} {max}");
    let (mean, std) = mean_std(&v);
    assert!(mean.abs() < 0.005, "{mean}");
    assert!((std - 0.3 / 3f64.sqrt()).abs() < 0.005, "{std}");

    // Xavier on a (fan_out=400, fan_in=100) matrix, gain 2: bound = 2 * sqrt(6 / 500).
    let shape = [400, 100];
    let bound = 2.0 * (6.0f64 / 500.0).sqrt();
    let t = init_tensor(
        &Init::XavierUniform { gain: 2.0, seed: 3 },
        &ty(DType::Float64, &shape),
    )
    .unwrap();
    let v = t.to_f64_vec();
    assert!(v.iter().all(|x| x.abs() <= bound));
    let max_abs = v.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    assert!(max_abs > 0.99 * bound, "{max_abs} vs {bound}");
    let (_, std) = mean_std(&v);
    assert!((std - bound / 3f64.sqrt()).abs() < 0.01 * bound, "{std}");

    // Convolution fans: (O=16, C=8, 3, 3): fan_in 72, fan_out 144.
    assert_eq!(fans(&[16, 8, 3, 3]), (72, 144));
    let bound = (6.0f64 / 216.0).sqrt();
    let t = init_tensor(
        &Init::XavierUniform { gain: 1.0, seed: 4 },
        &ty(DType::Float32, &[16, 8, 3, 3]),
    )
    .unwrap();
    assert!(t.to_f64_vec().iter().all(|x| x.abs() <= bound + 1e-7));
}

#[test]
fn he_normal_std() {
    // Conv weight (64, 32, 3, 3): fan_in = 288, std = sqrt(2 / 288).
    let t = init_tensor(
        &Init::HeNormal { seed: 5 },
        &ty(DType::Float64, &[64, 32, 3, 3]),
    )
    .unwrap();
    let (mean, std) = mean_std(&t.to_f64_vec());
    let want = (2.0f64 / 288.0).sqrt();
    assert!(mean.abs() < 0.01 * want * 10.0, "{mean}");
    assert!((std - want).abs() < 0.02 * want, "{std} vs {want}");
    // Dense (out=50, in=800): std = sqrt(2 / 800).
    let t = init_tensor(&Init::HeNormal { seed: 6 }, &ty(DType::Float64, &[50, 800])).unwrap();
    let (_, std) = mean_std(&t.to_f64_vec());
    let want = (2.0f64 / 800.0).sqrt();
    assert!((std - want).abs() < 0.02 * want, "{std} vs {want}");
}

#[test]
fn constants_and_dtypes() {
    let z = init_tensor(&Init::Zeros, &ty(DType::Int32, &[3])).unwrap();
    assert_eq!(z, Tensor::from_i32(vec![3], vec![0; 3]).unwrap());
    let o = init_tensor(&Init::Ones, &ty(DType::Float16, &[2, 2])).unwrap();
    assert_eq!(o.to_f64_vec(), vec![1.0; 4]);
    let c = init_tensor(&Init::Constant { value: -3.0 }, &ty(DType::Int64, &[2])).unwrap();
    assert_eq!(c, Tensor::from_i64(vec![2], vec![-3, -3]).unwrap());
    let s = init_tensor(
        &Init::Constant { value: 0.25 },
        &TensorType::scalar(DType::Float32),
    )
    .unwrap();
    assert_eq!(s.scalar_value(), Some(0.25));

    // f32 and f64 start from the same numbers up to rounding.
    let init = Init::Normal {
        sigma: 1.0,
        mean: 0.0,
        seed: 9,
    };
    let a = init_tensor(&init, &ty(DType::Float32, &[10, 10])).unwrap();
    let b = init_tensor(&init, &ty(DType::Float64, &[10, 10])).unwrap();
    for (x, y) in a.to_f64_vec().iter().zip(b.to_f64_vec()) {
        assert!((x - y).abs() <= 1e-6 * (1.0 + y.abs()));
    }
    let h = init_tensor(&init, &ty(DType::BFloat16, &[10, 10])).unwrap();
    for (x, y) in h.to_f64_vec().iter().zip(b.to_f64_vec()) {
        assert!((x - y).abs() <= 1e-2 * (1.0 + y.abs()));
    }
}

#[test]
fn bad_initializers_are_errors() {
    let err = init_tensor(&Init::HeNormal { seed: 0 }, &ty(DType::Int32, &[2])).unwrap_err();
    assert!(err.to_string().contains("float dtype"), "{err}");
    let err = init_tensor(
        &Init::Normal {
            sigma: -1.0,
            mean: 0.0,
            seed: 0,
        },
        &ty(DType::Float32, &[2]),
    )
    .unwrap_err();
    assert!(err.to_string().contains("sigma is -1"), "{err}");
    let err = init_tensor(&Init::Constant { value: 0.5 }, &ty(DType::Int64, &[2])).unwrap_err();
    assert!(err.to_string().contains("not an integer"), "{err}");
    let err = init_tensor(&Init::Constant { value: 2.0 }, &ty(DType::Bool, &[2])).unwrap_err();
    assert!(err.to_string().contains("Bool"), "{err}");
    let err = init_tensor(
        &Init::Uniform {
            scale: f64::NAN,
            seed: 0,
        },
        &ty(DType::Float32, &[2]),
    )
    .unwrap_err();
    assert!(err.to_string().contains("scale"), "{err}");
}

/// The block of the global tensor, by brute force.
fn block(full: &Tensor, ranges: &[std::ops::Range<usize>]) -> Vec<f64> {
    let v = full.to_f64_vec();
    let shape = &full.shape;
    let mut out = Vec::new();
    for (flat, x) in v.iter().enumerate() {
        let mut rem = flat;
        let mut idx = vec![0; shape.len()];
        for d in (0..shape.len()).rev() {
            idx[d] = rem % shape[d];
            rem /= shape[d];
        }
        if idx.iter().zip(ranges).all(|(i, r)| r.contains(i)) {
            out.push(*x);
        }
    }
    out
}

#[test]
fn slices_are_blocks_of_the_global_tensor() {
    let init = Init::XavierUniform {
        gain: 1.0,
        seed: 11,
    };
    let cases: Vec<(Vec<usize>, Vec<std::ops::Range<usize>>)> = vec![
        (vec![8, 6], vec![2..6, 0..3]),
        (vec![8, 6], vec![0..8, 3..6]),
        (vec![8, 6], vec![4..4, 0..6]),
        (vec![12], vec![3..9]),
        (vec![4, 3, 5, 2], vec![1..3, 0..3, 2..5, 1..2]),
        (vec![], vec![]),
    ];
    for dtype in [DType::Float32, DType::Float64] {
        for (shape, ranges) in &cases {
            let global = ty(dtype, shape);
            let full = init_tensor(&init, &global).unwrap();
            let part = init_slice(&init, &global, ranges).unwrap();
            let want_shape: Vec<usize> = ranges.iter().map(|r| r.end - r.start).collect();
            assert_eq!(part.shape, want_shape);
            assert_eq!(part.dtype(), dtype);
            assert_eq!(
                part.to_f64_vec(),
                block(&full, ranges),
                "{shape:?} {ranges:?}"
            );
        }
    }
    // Slices of constants too.
    let part = init_slice(&Init::Ones, &ty(DType::Float32, &[4, 4]), &[0..2, 1..4]).unwrap();
    assert_eq!(part.shape, vec![2, 3]);
    assert_eq!(part.to_f64_vec(), vec![1.0; 6]);

    // Bad ranges.
    let g = ty(DType::Float32, &[4, 4]);
    let err = init_slice(&init, &g, &[0..2]).unwrap_err();
    assert!(err.to_string().contains("needs 2 ranges"), "{err}");
    let err = init_slice(&init, &g, &[0..2, 3..5]).unwrap_err();
    assert!(err.to_string().contains("dimension 1"), "{err}");
    #[allow(clippy::reversed_empty_ranges)]
    let err = init_slice(&init, &g, &[3..2, 0..4]).unwrap_err();
    assert!(err.to_string().contains("dimension 0"), "{err}");
}
