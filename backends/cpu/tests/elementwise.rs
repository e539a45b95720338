//! Elementwise ops, Cast, Equal, Dropout and the elementwise gradients.

mod common;

/// A unary reference function.
type UnaryRef = fn(f64) -> f64;
/// A binary reference function.
type BinaryRef = fn(f64, f64) -> f64;

use common::*;
use shardc_backend_cpu::CpuBackend;
use shardc_ir::{Attr, Const, DType, OpKind};
use shardc_runtime::{Data, Tensor};

fn gelu(x: f64) -> f64 {
    0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
}

/// Numpy broadcasting of a and b into `out`.
fn ref_broadcast(
    a: (&[usize], &[f64]),
    b: (&[usize], &[f64]),
    out: &[usize],
    f: fn(f64, f64) -> f64,
) -> Vec<f64> {
    let pick = |shape: &[usize], idx: &[usize]| {
        let lead = out.len() - shape.len();
        let i: Vec<usize> = shape
            .iter()
            .enumerate()
            .map(|(d, &s)| if s == 1 { 0 } else { idx[lead + d] })
            .collect();
        ravel(&i, shape)
    };
    (0..numel(out))
        .map(|i| {
            let idx = unravel(i, out);
            f(a.1[pick(a.0, &idx)], b.1[pick(b.0, &idx)])
        })
        .collect()
}

#[test]
fn unary_ops() {
    let mut rng = Rng::new(10);
    let shape = [3, 5, 7];
    let x = rand64(&mut rng, &shape, -3.0, 3.0);
    let pos = rand64(&mut rng, &shape, 0.1, 4.0);
    let cases: Vec<(OpKind, &Tensor, UnaryRef)> = vec![
        (OpKind::Neg, &x, |v| -v),
        (OpKind::Square, &x, |v| v * v),
        (OpKind::Sqrt, &pos, f64::sqrt),
        (OpKind::Exp, &x, f64::exp),
        (OpKind::Log, &pos, f64::ln),
        (OpKind::ReLU, &x, |v| v.max(0.0)),
        (OpKind::GeLU, &x, gelu),
        (OpKind::Sigmoid, &x, |v| 1.0 / (1.0 + (-v).exp())),
        (OpKind::SiLU, &x, |v| v / (1.0 + (-v).exp())),
        (OpKind::Tanh, &x, f64::tanh),
        (OpKind::Erf, &x, erf_series),
    ];
    for (kind, input, f) in cases {
        let want: Vec<f64> = input.to_f64_vec().into_iter().map(f).collect();
        let case = op(kind).t(input.clone()).out(DType::Float64, &shape);
        check_tol(&case, &[want], 1e-12, 1e-5);
    }
    // Sigmoid stays finite at the extremes.
    let case = op(OpKind::Sigmoid)
        .t(t64(&[2], vec![-800.0, 800.0]))
        .out(DType::Float64, &[2]);
    assert_eq!(case.run()[0].to_f64_vec(), vec![0.0, 1.0]);
    // So does SiLU: x * sigmoid(x) is 0 far left, x far right.
    let case = op(OpKind::SiLU)
        .t(t64(&[2], vec![-800.0, 800.0]))
        .out(DType::Float64, &[2]);
    assert_eq!(case.run()[0].to_f64_vec(), vec![-0.0, 800.0]);
    // Erf at known values (Abramowitz and Stegun, table 7.1) and its limits.
    let case = op(OpKind::Erf)
        .t(t64(&[5], vec![0.0, 0.5, 1.0, -2.0, 30.0]))
        .out(DType::Float64, &[5]);
    check_tol(
        &case,
        &[vec![
            0.0,
            0.520_499_877_813_046_5,
            0.842_700_792_949_714_9,
            -0.995_322_265_018_952_7,
            1.0,
        ]],
        1e-15,
        1e-7,
    );
}

/// `erf(x)` by its Maclaurin series `2/sqrt(pi) * sum (-1)^n x^(2n+1) / (n! (2n+1))`, summed
/// until the terms vanish (|x| <= 3 here: the alternating terms stay well within f64).
fn erf_series(x: f64) -> f64 {
    let (mut term, mut sum, mut n) = (x, x, 0.0);
    while term.abs() > 1e-17 * sum.abs().max(1e-300) {
        n += 1.0;
        term *= -x * x / n;
        sum += term / (2.0 * n + 1.0);
    }
    std::f64::consts::FRAC_2_SQRT_PI * sum
}

#[test]
fn binary_ops_broadcast_and_take_scalars() {
    let mut rng = Rng::new(11);
    let shapes: &[(&[usize], &[usize], &[usize])] = &[
        (&[4, 5], &[4, 5], &[4, 5]),
        (&[4, 5], &[5], &[4, 5]),
        (&[4, 1], &[1, 5], &[4, 5]),
        (&[2, 3, 4, 5], &[3, 1, 1], &[2, 3, 4, 5]),
        (&[1, 3, 1, 5], &[2, 1, 4, 1], &[2, 3, 4, 5]),
        (&[], &[6, 7], &[6, 7]),
        (&[7, 1, 300], &[7, 40, 1], &[7, 40, 300]),
    ];
    let ops: [(OpKind, BinaryRef); 4] = [
        (OpKind::Add, |a, b| a + b),
        (OpKind::Sub, |a, b| a - b),
        (OpKind::Mul, |a, b| a * b),
        (OpKind::RealDiv, |a, b| a / b),
    ];
    for &(sa, sb, so) in shapes {
        let a = rand64(&mut rng, sa, 0.5, 2.0);
        let b = rand64(&mut rng, sb, 0.5, 2.0);
        for (kind, f) in ops {
            let want = ref_broadcast((sa, &a.to_f64_vec()), (sb, &b.to_f64_vec()), so, f);
            check(
                &op(kind).t(a.clone()).t(b.clone()).out(DType::Float64, so),
                &[want],
            );
        }
    }
    // Constants as scalars, on either side.
    let x = rand64(&mut rng, &[3, 4], 0.5, 2.0);
    let xv = x.to_f64_vec();
    let case = op(OpKind::Mul)
        .t(x.clone())
        .c(Const::Float(0.5))
        .out(DType::Float64, &[3, 4]);
    check(&case, &[xv.iter().map(|v| v * 0.5).collect()]);
    let case = op(OpKind::Sub)
        .c(Const::Int(1))
        .t(x.clone())
        .out(DType::Float64, &[3, 4]);
    check(&case, &[xv.iter().map(|v| 1.0 - v).collect()]);
    // A shape that does not broadcast is an error.
    let bad = op(OpKind::Add)
        .t(t64(&[3, 4], vec![0.0; 12]))
        .t(t64(&[3], vec![0.0; 3]))
        .out(DType::Float64, &[3, 4]);
    let e = bad.run_on(&CpuBackend::with_threads(1)).unwrap_err();
    assert!(e.to_string().contains("broadcast"), "{e}");
}

#[test]
fn elementwise_gradients() {
    let mut rng = Rng::new(12);
    let shape = [4, 6];
    let dy = rand64(&mut rng, &shape, -1.0, 1.0);
    let x = rand64(&mut rng, &shape, -2.0, 2.0);
    let y = rand64(&mut rng, &shape, 0.1, 0.9);
    let (dyv, xv, yv) = (dy.to_f64_vec(), x.to_f64_vec(), y.to_f64_vec());
    let zip = |f: &dyn Fn(f64, f64) -> f64, a: &[f64], b: &[f64]| -> Vec<f64> {
        a.iter().zip(b).map(|(&p, &q)| f(p, q)).collect()
    };
    // ReluGrad(dy, y) with y from x (negative half zeroed).
    let relu_y: Vec<f64> = xv.iter().map(|v| v.max(0.0)).collect();
    let case = op(OpKind::ReluGrad)
        .t(dy.clone())
        .t(t64(&shape, relu_y.clone()))
        .out(DType::Float64, &shape);
    check(
        &case,
        &[zip(&|d, r| if r > 0.0 { d } else { 0.0 }, &dyv, &relu_y)],
    );
    let case = op(OpKind::SigmoidGrad)
        .t(y.clone())
        .t(dy.clone())
        .out(DType::Float64, &shape);
    check(&case, &[zip(&|y, d| d * y * (1.0 - y), &yv, &dyv)]);
    // SiLUGrad(dy, x) = dy * s * (1 + x * (1 - s)), s = sigmoid(x); checked against a central
    // difference of x * sigmoid(x) too.
    let silu = |v: f64| v / (1.0 + (-v).exp());
    let silu_grad = |d: f64, v: f64| {
        let s = 1.0 / (1.0 + (-v).exp());
        d * s * (1.0 + v * (1.0 - s))
    };
    let case = op(OpKind::SiLUGrad)
        .t(dy.clone())
        .t(x.clone())
        .out(DType::Float64, &shape);
    check(&case, &[zip(&silu_grad, &dyv, &xv)]);
    for &v in &xv {
        let h = 1e-5;
        let fd = (silu(v + h) - silu(v - h)) / (2.0 * h);
        assert!((silu_grad(1.0, v) - fd).abs() < 1e-8, "SiLU'({v})");
    }
    let case = op(OpKind::TanhGrad)
        .t(y.clone())
        .t(dy.clone())
        .out(DType::Float64, &shape);
    check(&case, &[zip(&|y, d| d * (1.0 - y * y), &yv, &dyv)]);
    let case = op(OpKind::SqrtGrad)
        .t(y.clone())
        .t(dy.clone())
        .out(DType::Float64, &shape);
    check(&case, &[zip(&|y, d| d / (2.0 * y), &yv, &dyv)]);
    let case = op(OpKind::DropoutGrad)
        .t(dy.clone())
        .t(y.clone())
        .out(DType::Float64, &shape);
    check(&case, &[zip(&|d, m| d * m, &dyv, &yv)]);
    // GeLUGrad against finite differences of GeLU.
    let num = numeric_grad(&xv, &dyv, 1e-6, |v| v.iter().map(|&t| gelu(t)).collect());
    let gy: Vec<f64> = xv.iter().map(|&t| gelu(t)).collect();
    let case = op(OpKind::GeLUGrad)
        .t(dy.clone())
        .t(x.clone())
        .t(t64(&shape, gy))
        .out(DType::Float64, &shape);
    check_tol(&case, &[num], 1e-8, 1e-4);
}

#[test]
fn bias_add_on_nchw_and_nc() {
    let mut rng = Rng::new(13);
    for shape in [vec![5, 3], vec![2, 3, 4, 5]] {
        let x = rand64(&mut rng, &shape, -1.0, 1.0);
        let b = rand64(&mut rng, &[3], -1.0, 1.0);
        let (xv, bv) = (x.to_f64_vec(), b.to_f64_vec());
        let want: Vec<f64> = (0..xv.len())
            .map(|i| xv[i] + bv[unravel(i, &shape)[1]])
            .collect();
        check(
            &op(OpKind::BiasAdd).t(x).t(b).out(DType::Float64, &shape),
            &[want],
        );
    }
}

#[test]
fn cast_between_all_dtypes() {
    let vals = [-2.75, -1.0, 0.0, 0.5, 1.0, 3.25, 100.0];
    let src: Vec<Tensor> = vec![
        Tensor {
            shape: vec![7],
            data: Data::F32(vals.iter().map(|&v| v as f32).collect()),
        },
        t64(&[7], vals.to_vec()),
        Tensor {
            shape: vec![7],
            data: Data::F16(vals.iter().map(|&v| half::f16::from_f64(v)).collect()),
        },
        Tensor {
            shape: vec![7],
            data: Data::BF16(vals.iter().map(|&v| half::bf16::from_f64(v)).collect()),
        },
        Tensor {
            shape: vec![7],
            data: Data::I32(vec![-2, -1, 0, 0, 1, 3, 100]),
        },
        Tensor {
            shape: vec![7],
            data: Data::I64(vec![-2, -1, 0, 0, 1, 3, 100]),
        },
        Tensor {
            shape: vec![7],
            data: Data::Bool(vec![true, true, false, true, true, true, true]),
        },
    ];
    for s in &src {
        let sv = s.to_f64_vec();
        for dst in DType::ALL {
            let case = op(OpKind::Cast)
                .attr("dst_type", Attr::Str(dst.name().into()))
                .t(s.clone())
                .out(dst, &[7]);
            let got = case.run();
            assert_eq!(got[0].dtype(), dst);
            let want: Vec<f64> = sv
                .iter()
                .map(|&v| match dst {
                    DType::Int32 | DType::Int64 => v.trunc(),
                    DType::Bool => (v != 0.0) as u8 as f64,
                    _ => v,
                })
                .collect();
            assert_close(
                &format!("cast {} -> {dst}", s.dtype()),
                &got[0].to_f64_vec(),
                &want,
                0.0,
            );
        }
    }
    // Large Int64 values survive Int64 -> Int64 exactly (no trip through f64).
    let big = Tensor {
        shape: vec![1],
        data: Data::I64(vec![(1 << 60) + 1]),
    };
    let got = op(OpKind::Cast).t(big).out(DType::Int64, &[1]).run();
    assert_eq!(got[0].data, Data::I64(vec![(1 << 60) + 1]));
    // dst_type disagreeing with the result type is an error.
    let bad = op(OpKind::Cast)
        .attr("dst_type", Attr::Str("Float16".into()))
        .t(t64(&[1], vec![1.0]))
        .out(DType::Float32, &[1]);
    assert!(bad.run_on(&CpuBackend::with_threads(1)).is_err());
}

#[test]
fn equal_on_floats_and_ints() {
    let a = t64(&[2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let b = t64(&[3], vec![1.0, 5.0, 6.0]);
    let got = op(OpKind::Equal)
        .t(a.clone())
        .t(b)
        .out(DType::Bool, &[2, 3])
        .run();
    assert_eq!(
        got[0].data,
        Data::Bool(vec![true, false, false, false, true, true])
    );
    let got = op(OpKind::Equal)
        .t(to_f32(&a))
        .c(Const::Float(3.0))
        .out(DType::Bool, &[2, 3])
        .run();
    assert_eq!(
        got[0].data,
        Data::Bool(vec![false, false, true, false, false, false])
    );
    for labels in [
        Tensor {
            shape: vec![4],
            data: Data::I32(vec![0, 2, 1, 2]),
        },
        Tensor {
            shape: vec![4],
            data: Data::I64(vec![0, 2, 1, 2]),
        },
    ] {
        let pred = match &labels.data {
            Data::I32(_) => Tensor {
                shape: vec![4],
                data: Data::I32(vec![0, 1, 1, 2]),
            },
            _ => Tensor {
                shape: vec![4],
                data: Data::I64(vec![0, 1, 1, 2]),
            },
        };
        let got = op(OpKind::Equal)
            .t(pred)
            .t(labels)
            .out(DType::Bool, &[4])
            .run();
        assert_eq!(got[0].data, Data::Bool(vec![true, false, true, true]));
    }
}

#[test]
fn dropout_masks_are_deterministic_and_scaled() {
    let mut rng = Rng::new(14);
    let shape = [64, 100];
    let x = rand64(&mut rng, &shape, -1.0, 1.0);
    let xv = x.to_f64_vec();
    let case = |seed0: i64, step: u64| {
        op(OpKind::Dropout)
            .attr("keep_prob", Attr::Float(0.8))
            .attr("seed0", Attr::Int(seed0))
            .attr("seed1", Attr::Int(7))
            .t(x.clone())
            .out(DType::Float64, &shape)
            .out(DType::Float64, &shape)
            .step(step)
    };
    let r = case(1, 3).run();
    let (y, mask) = (r[0].to_f64_vec(), r[1].to_f64_vec());
    let kept = mask.iter().filter(|&&m| m != 0.0).count() as f64 / mask.len() as f64;
    assert!((kept - 0.8).abs() < 0.02, "kept fraction {kept}");
    for i in 0..xv.len() {
        assert!(mask[i] == 0.0 || (mask[i] - 1.25).abs() < 1e-12);
        assert_eq!(y[i], xv[i] * mask[i]);
    }
    // Same seeds and step: same mask, whatever the thread count; the f32 mask agrees.
    let again = case(1, 3).run_on(&CpuBackend::with_threads(2)).unwrap();
    assert_eq!(again[1].to_f64_vec(), mask);
    let m32 = case(1, 3).as_f32().run()[1].to_f64_vec();
    assert_eq!(
        m32,
        mask.iter().map(|&m| m as f32 as f64).collect::<Vec<_>>()
    );
    // Another step or seed: another mask.
    assert_ne!(case(1, 4).run()[1].to_f64_vec(), mask);
    assert_ne!(case(2, 3).run()[1].to_f64_vec(), mask);
    // keep_prob 1 keeps everything.
    let all = op(OpKind::Dropout)
        .attr("keep_prob", Attr::Float(1.0))
        .t(x.clone())
        .out(DType::Float64, &shape)
        .out(DType::Float64, &shape)
        .run();
    assert_eq!(all[0].to_f64_vec(), xv);
    // keep_prob 0 is refused.
    let bad = op(OpKind::Dropout)
        .attr("keep_prob", Attr::Float(0.0))
        .t(x)
        .out(DType::Float64, &shape)
        .out(DType::Float64, &shape);
    assert!(bad.run_on(&CpuBackend::with_threads(1)).is_err());
}

#[test]
fn zeros_like_and_ones_like() {
    let x = Tensor {
        shape: vec![2, 2],
        data: Data::I32(vec![5, 6, 7, 8]),
    };
    let z = op(OpKind::ZerosLike)
        .t(x.clone())
        .out(DType::Int32, &[2, 2])
        .run();
    assert_eq!(z[0].data, Data::I32(vec![0; 4]));
    let o = op(OpKind::OnesLike)
        .t(t64(&[3], vec![9.0; 3]))
        .out(DType::Float64, &[3])
        .run();
    assert_eq!(o[0].to_f64_vec(), vec![1.0; 3]);
}

#[test]
fn non_compute_ops_are_refused() {
    for kind in [
        OpKind::AllReduce,
        OpKind::TupleGetItem,
        OpKind::Assign,
        OpKind::Send,
    ] {
        let case = op(kind)
            .t(t64(&[2], vec![1.0, 2.0]))
            .out(DType::Float64, &[2]);
        let e = case.run_on(&CpuBackend::with_threads(1)).unwrap_err();
        assert_eq!(e.op, kind);
    }
    // Integer tensors into a float-only kernel: an error, not a panic.
    let case = op(OpKind::Exp)
        .t(Tensor {
            shape: vec![2],
            data: Data::I32(vec![1, 2]),
        })
        .out(DType::Int32, &[2]);
    assert!(case.run_on(&CpuBackend::with_threads(1)).is_err());
}
