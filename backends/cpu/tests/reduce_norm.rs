//! Reductions, softmax family, BatchNorm, LayerNorm, losses and optimizers.

mod common;

use common::*;
use shardc_backend_cpu::CpuBackend;
use shardc_ir::{Attr, Const, DType, OpKind};
use shardc_runtime::{Data, Tensor};

/// Reduces over `axes` (empty: all) with `f` (sum / mean / max), keep_dims as given.
fn ref_reduce(shape: &[usize], x: &[f64], axes: &[usize], kind: OpKind) -> (Vec<usize>, Vec<f64>) {
    let all = axes.is_empty();
    let red = |d: usize| all || axes.contains(&d);
    let out_shape: Vec<usize> = (0..shape.len())
        .map(|d| if red(d) { 1 } else { shape[d] })
        .collect();
    let n = numel(&out_shape);
    let init = if kind == OpKind::ReduceMax {
        f64::NEG_INFINITY
    } else {
        0.0
    };
    let mut out = vec![init; n];
    let mut count = vec![0usize; n];
    for (i, &v) in x.iter().enumerate() {
        let mut idx = unravel(i, shape);
        for (d, ix) in idx.iter_mut().enumerate() {
            if red(d) {
                *ix = 0;
            }
        }
        let o = ravel(&idx, &out_shape);
        out[o] = if kind == OpKind::ReduceMax {
            out[o].max(v)
        } else {
            out[o] + v
        };
        count[o] += 1;
    }
    if kind == OpKind::ReduceMean {
        for (o, c) in out.iter_mut().zip(count) {
            *o /= c as f64;
        }
    }
    (out_shape, out)
}

#[test]
fn reductions_over_axis_sets() {
    let mut rng = Rng::new(20);
    let shape = [3, 4, 5, 6];
    let x = rand64(&mut rng, &shape, -1.0, 1.0);
    let xv = x.to_f64_vec();
    let axis_sets: &[&[i64]] = &[
        &[],
        &[0],
        &[3],
        &[-1],
        &[1, 2],
        &[0, 2],
        &[0, 3],
        &[1, 3],
        &[0, 1, 2, 3],
        &[0, 1],
    ];
    for kind in [OpKind::ReduceSum, OpKind::ReduceMean, OpKind::ReduceMax] {
        for &axes in axis_sets {
            let pos: Vec<usize> = axes
                .iter()
                .map(|&a| if a < 0 { (a + 4) as usize } else { a as usize })
                .collect();
            let (keep_shape, want) = ref_reduce(&shape, &xv, &pos, kind);
            for keep in [false, true] {
                let out_shape: Vec<usize> = if keep {
                    keep_shape.clone()
                } else {
                    (0..4)
                        .filter(|d| !(pos.is_empty() || pos.contains(d)))
                        .map(|d| shape[d])
                        .collect()
                };
                let case = op(kind)
                    .attr("keep_dims", Attr::Bool(keep))
                    .t(x.clone())
                    .c(ints(axes))
                    .out(DType::Float64, &out_shape);
                check(&case, std::slice::from_ref(&want));
            }
        }
    }
    // A single Int axis, and a result shape that does not match.
    let (_, want) = ref_reduce(&shape, &xv, &[2], OpKind::ReduceSum);
    check(
        &op(OpKind::ReduceSum)
            .t(x.clone())
            .c(Const::Int(2))
            .out(DType::Float64, &[3, 4, 6]),
        &[want],
    );
    let bad = op(OpKind::ReduceSum)
        .t(x)
        .c(Const::Int(2))
        .out(DType::Float64, &[3, 4, 5]);
    assert!(bad.run_on(&CpuBackend::with_threads(1)).is_err());
}

#[test]
fn bias_add_grad_sums_all_but_axis_1() {
    let mut rng = Rng::new(21);
    for shape in [vec![7, 3], vec![2, 3, 4, 5]] {
        let dy = rand64(&mut rng, &shape, -1.0, 1.0);
        let axes: Vec<usize> = (0..shape.len()).filter(|&d| d != 1).collect();
        let (_, want) = ref_reduce(&shape, &dy.to_f64_vec(), &axes, OpKind::ReduceSum);
        check(
            &op(OpKind::BiasAddGrad).t(dy).out(DType::Float64, &[3]),
            &[want],
        );
    }
}

fn ref_softmax(shape: &[usize], x: &[f64], axis: usize, log: bool) -> Vec<f64> {
    let (outer, len, inner) = (
        numel(&shape[..axis]),
        shape[axis],
        numel(&shape[axis + 1..]),
    );
    let mut y = vec![0.0; x.len()];
    for o in 0..outer {
        for i in 0..inner {
            let at = |a: usize| (o * len + a) * inner + i;
            let m = (0..len).map(|a| x[at(a)]).fold(f64::NEG_INFINITY, f64::max);
            let s: f64 = (0..len).map(|a| (x[at(a)] - m).exp()).sum();
            for a in 0..len {
                y[at(a)] = if log {
                    x[at(a)] - m - s.ln()
                } else {
                    (x[at(a)] - m).exp() / s
                };
            }
        }
    }
    y
}

#[test]
fn softmax_log_softmax_and_gradients_along_any_axis() {
    let mut rng = Rng::new(22);
    let shape = [3, 4, 5];
    let x = rand64(&mut rng, &shape, -3.0, 3.0);
    let dy = rand64(&mut rng, &shape, -1.0, 1.0);
    let (xv, dyv) = (x.to_f64_vec(), dy.to_f64_vec());
    for (axis_attr, axis) in [(Attr::Int(-1), 2), (Attr::Int(0), 0), (Attr::ints(&[1]), 1)] {
        for (kind, grad_kind, log) in [
            (OpKind::Softmax, OpKind::SoftmaxGrad, false),
            (OpKind::LogSoftmax, OpKind::LogSoftmaxGrad, true),
        ] {
            let y = ref_softmax(&shape, &xv, axis, log);
            let case = op(kind)
                .attr("axis", axis_attr.clone())
                .t(x.clone())
                .out(DType::Float64, &shape);
            check(&case, std::slice::from_ref(&y));
            // The gradient kernel against finite differences of the forward reference.
            let num = numeric_grad(&xv, &dyv, 1e-6, |v| ref_softmax(&shape, v, axis, log));
            let case = op(grad_kind)
                .attr("axis", axis_attr.clone())
                .t(t64(&shape, y))
                .t(dy.clone())
                .out(DType::Float64, &shape);
            check_tol(&case, &[num], 1e-7, 1e-4);
        }
    }
    // Large logits stay finite (max subtraction).
    let case = op(OpKind::Softmax)
        .t(t64(&[1, 3], vec![1000.0, 1001.0, 1002.0]))
        .out(DType::Float64, &[1, 3]);
    let got = case.run()[0].to_f64_vec();
    assert!(got.iter().all(|v| v.is_finite()));
}

/// BatchNorm forward reference: (y, mean, unbiased var, rstd).
fn ref_bn(shape: &[usize], x: &[f64], scale: &[f64], bias: &[f64], eps: f64) -> [Vec<f64>; 4] {
    let c = shape[1];
    let s = numel(&shape[2..]);
    let m = (shape[0] * s) as f64;
    let ch = |i: usize| (i / s) % c;
    let mut mean = vec![0.0; c];
    for (i, &v) in x.iter().enumerate() {
        mean[ch(i)] += v / m;
    }
    let mut var = vec![0.0; c];
    for (i, &v) in x.iter().enumerate() {
        var[ch(i)] += (v - mean[ch(i)]).powi(2) / m;
    }
    let rstd: Vec<f64> = var.iter().map(|v| 1.0 / (v + eps).sqrt()).collect();
    let y = x
        .iter()
        .enumerate()
        .map(|(i, &v)| (v - mean[ch(i)]) * rstd[ch(i)] * scale[ch(i)] + bias[ch(i)])
        .collect();
    let unbiased = var.iter().map(|v| v * m / (m - 1.0)).collect();
    [y, mean, unbiased, rstd]
}

#[test]
fn batch_norm_training_inference_and_gradient() {
    let mut rng = Rng::new(23);
    for shape in [vec![4, 3, 5, 2], vec![6, 3]] {
        let c = 3;
        let x = rand64(&mut rng, &shape, -2.0, 2.0);
        let scale = rand64(&mut rng, &[c], 0.5, 1.5);
        let bias = rand64(&mut rng, &[c], -1.0, 1.0);
        let rmean = rand64(&mut rng, &[c], -0.5, 0.5);
        let rvar = rand64(&mut rng, &[c], 0.5, 1.5);
        let (xv, sv, bv) = (x.to_f64_vec(), scale.to_f64_vec(), bias.to_f64_vec());
        let eps = 1e-3;
        let [y, mean, unbiased, rstd] = ref_bn(&shape, &xv, &sv, &bv, eps);
        let bn = |training: bool| {
            op(OpKind::BatchNorm)
                .attr("is_training", Attr::Bool(training))
                .attr("epsilon", Attr::Float(eps))
                .t(x.clone())
                .t(scale.clone())
                .t(bias.clone())
                .t(rmean.clone())
                .t(rvar.clone())
                .out(DType::Float64, &shape)
                .out(DType::Float64, &[c])
                .out(DType::Float64, &[c])
                .out(DType::Float64, &[c])
                .out(DType::Float64, &[c])
        };
        check(
            &bn(true),
            &[y, mean.clone(), unbiased, mean.clone(), rstd.clone()],
        );
        // Inference: the given statistics.
        let (rm, rv) = (rmean.to_f64_vec(), rvar.to_f64_vec());
        let s = numel(&shape[2..]);
        let yi: Vec<f64> = xv
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                let ch = (i / s) % c;
                (v - rm[ch]) / (rv[ch] + eps).sqrt() * sv[ch] + bv[ch]
            })
            .collect();
        let irstd: Vec<f64> = rv.iter().map(|v| 1.0 / (v + eps).sqrt()).collect();
        check(&bn(false), &[yi, rm.clone(), rv.clone(), rm.clone(), irstd]);
        // Gradients: dx against finite differences of the training forward; dscale, dbias exact.
        let dy = rng.vec(xv.len(), -1.0, 1.0);
        let dx = numeric_grad(&xv, &dy, 1e-5, |v| {
            ref_bn(&shape, v, &sv, &bv, eps)[0].clone()
        });
        let dscale = numeric_grad(&sv, &dy, 1e-5, |v| {
            ref_bn(&shape, &xv, v, &bv, eps)[0].clone()
        });
        let dbias = numeric_grad(&bv, &dy, 1e-5, |v| {
            ref_bn(&shape, &xv, &sv, v, eps)[0].clone()
        });
        let grad = op(OpKind::BatchNormGrad)
            .attr("epsilon", Attr::Float(eps))
            .t(t64(&shape, dy))
            .t(x.clone())
            .t(scale.clone())
            .t(t64(&[c], mean))
            .t(t64(&[c], rstd))
            .out(DType::Float64, &shape)
            .out(DType::Float64, &[c])
            .out(DType::Float64, &[c]);
        check_tol(&grad, &[dx, dscale, dbias], 1e-7, 1e-3);
    }
}

fn ref_ln(
    shape: &[usize],
    x: &[f64],
    gamma: &[f64],
    beta: &[f64],
    bna: usize,
    eps: f64,
) -> [Vec<f64>; 3] {
    let d = numel(&shape[bna..]);
    let p = gamma.len();
    let rows = x.len() / d;
    let mut y = vec![0.0; x.len()];
    let mut means = vec![0.0; rows];
    let mut rstds = vec![0.0; rows];
    for r in 0..rows {
        let row = &x[r * d..][..d];
        let m = row.iter().sum::<f64>() / d as f64;
        let v = row.iter().map(|t| (t - m).powi(2)).sum::<f64>() / d as f64;
        let rs = 1.0 / (v + eps).sqrt();
        means[r] = m;
        rstds[r] = rs;
        for j in 0..d {
            let i = r * d + j;
            y[i] = (x[i] - m) * rs * gamma[i % p] + beta[i % p];
        }
    }
    [y, means, rstds]
}

#[test]
fn layer_norm_and_gradient() {
    let mut rng = Rng::new(24);
    let shape = [2, 3, 4];
    // (begin_norm_axis, begin_params_axis)
    for (bna, bpa) in [(2i64, 2i64), (1, 1), (1, 2), (-1, -1), (0, 0)] {
        let pos = |a: i64| if a < 0 { (a + 3) as usize } else { a as usize };
        let (bna_u, bpa_u) = (pos(bna), pos(bpa));
        let x = rand64(&mut rng, &shape, -2.0, 2.0);
        let gamma = rand64(&mut rng, &shape[bpa_u..], 0.5, 1.5);
        let beta = rand64(&mut rng, &shape[bpa_u..], -1.0, 1.0);
        let (xv, gv, bv) = (x.to_f64_vec(), gamma.to_f64_vec(), beta.to_f64_vec());
        let eps = 1e-5;
        let [y, mean, rstd] = ref_ln(&shape, &xv, &gv, &bv, bna_u, eps);
        let mut stats_shape = shape.to_vec();
        for d in &mut stats_shape[bna_u..] {
            *d = 1;
        }
        let as_attr = Attr::Int;
        let fwd = op(OpKind::LayerNorm)
            .attr("begin_norm_axis", as_attr(bna))
            .attr("begin_params_axis", as_attr(bpa))
            .attr("epsilon", Attr::Float(eps))
            .t(x.clone())
            .t(gamma.clone())
            .t(beta.clone())
            .out(DType::Float64, &shape)
            .out(DType::Float64, &stats_shape)
            .out(DType::Float64, &stats_shape);
        check(&fwd, &[y, mean.clone(), rstd.clone()]);
        let dy = rng.vec(xv.len(), -1.0, 1.0);
        let dx = numeric_grad(&xv, &dy, 1e-5, |v| {
            ref_ln(&shape, v, &gv, &bv, bna_u, eps)[0].clone()
        });
        let dg = numeric_grad(&gv, &dy, 1e-5, |v| {
            ref_ln(&shape, &xv, v, &bv, bna_u, eps)[0].clone()
        });
        let db = numeric_grad(&bv, &dy, 1e-5, |v| {
            ref_ln(&shape, &xv, &gv, v, bna_u, eps)[0].clone()
        });
        let grad = op(OpKind::LayerNormGrad)
            .attr("begin_norm_axis", as_attr(bna))
            .attr("begin_params_axis", as_attr(bpa))
            .t(x.clone())
            .t(t64(&shape, dy))
            .t(t64(&stats_shape, rstd))
            .t(t64(&stats_shape, mean))
            .t(gamma.clone())
            .out(DType::Float64, &shape)
            .out(DType::Float64, gamma.shape.as_slice())
            .out(DType::Float64, gamma.shape.as_slice());
        check_tol(&grad, &[dx, dg, db], 1e-7, 1e-3);
    }
}

#[test]
fn softmax_cross_entropy_dense_and_sparse() {
    let mut rng = Rng::new(25);
    let (n, c) = (5, 7);
    let logits = rand64(&mut rng, &[n, c], -3.0, 3.0);
    let lv = logits.to_f64_vec();
    let sm = ref_softmax(&[n, c], &lv, 1, false);
    let lsm = ref_softmax(&[n, c], &lv, 1, true);
    // Dense labels: rows of probabilities.
    let mut labels = rng.vec(n * c, 0.0, 1.0);
    for r in 0..n {
        let s: f64 = labels[r * c..][..c].iter().sum();
        labels[r * c..][..c].iter_mut().for_each(|v| *v /= s);
    }
    let loss: Vec<f64> = (0..n)
        .map(|r| {
            -(0..c)
                .map(|j| labels[r * c + j] * lsm[r * c + j])
                .sum::<f64>()
        })
        .collect();
    let back: Vec<f64> = (0..n * c).map(|i| sm[i] - labels[i]).collect();
    let case = op(OpKind::SoftmaxCrossEntropyWithLogits)
        .t(logits.clone())
        .t(t64(&[n, c], labels))
        .out(DType::Float64, &[n])
        .out(DType::Float64, &[n, c]);
    check(&case, &[loss, back]);
    // Sparse labels, Int32 and Int64: the mean loss and its gradient.
    let lab: Vec<usize> = (0..n).map(|_| rng.below(c)).collect();
    let mean_loss = -(0..n).map(|r| lsm[r * c + lab[r]]).sum::<f64>() / n as f64;
    let mut grad = sm.clone();
    for r in 0..n {
        grad[r * c + lab[r]] -= 1.0;
    }
    grad.iter_mut().for_each(|g| *g /= n as f64);
    for labels in [
        Tensor {
            shape: vec![n],
            data: Data::I32(lab.iter().map(|&v| v as i32).collect()),
        },
        Tensor {
            shape: vec![n],
            data: Data::I64(lab.iter().map(|&v| v as i64).collect()),
        },
    ] {
        let case = op(OpKind::SparseSoftmaxCrossEntropyWithLogits)
            .t(logits.clone())
            .t(labels.clone())
            .out(DType::Float64, &[]);
        check(&case, &[vec![mean_loss]]);
        let case = op(OpKind::SparseSoftmaxCrossEntropyWithLogits)
            .attr("is_grad", Attr::Bool(true))
            .t(logits.clone())
            .t(labels)
            .out(DType::Float64, &[n, c]);
        check(&case, std::slice::from_ref(&grad));
    }
    // An out-of-range label is an error naming the label.
    let bad = op(OpKind::SparseSoftmaxCrossEntropyWithLogits)
        .t(logits)
        .t(Tensor {
            shape: vec![n],
            data: Data::I32(vec![0, 1, 7, 2, 3]),
        })
        .out(DType::Float64, &[]);
    let e = bad.run_on(&CpuBackend::with_threads(1)).unwrap_err();
    assert!(e.to_string().contains("label 7"), "{e}");
}

#[test]
fn optimizers_follow_their_formulas() {
    let mut rng = Rng::new(26);
    let shape = [3, 4];
    let n = 12;
    let var = rand64(&mut rng, &shape, -1.0, 1.0);
    let acc = rand64(&mut rng, &shape, -1.0, 1.0);
    let grad = rand64(&mut rng, &shape, -1.0, 1.0);
    let (v, a, g) = (var.to_f64_vec(), acc.to_f64_vec(), grad.to_f64_vec());
    let (lr, mom) = (0.1, 0.9);
    for nesterov in [false, true] {
        let na: Vec<f64> = (0..n).map(|i| a[i] * mom + g[i]).collect();
        let nv: Vec<f64> = (0..n)
            .map(|i| {
                if nesterov {
                    v[i] - lr * (g[i] + mom * na[i])
                } else {
                    v[i] - lr * na[i]
                }
            })
            .collect();
        let case = op(OpKind::ApplyMomentum)
            .attr("use_nesterov", Attr::Bool(nesterov))
            .t(var.clone())
            .t(acc.clone())
            .t(Tensor::from_f64(vec![], vec![lr]).unwrap())
            .t(grad.clone())
            .c(Const::Float(mom))
            .out(DType::Float64, &shape)
            .out(DType::Float64, &shape);
        check_tol(&case, &[nv, na], 1e-12, 1e-6);
    }
    // Plain gradient descent: var - alpha * delta.
    let nv: Vec<f64> = (0..n).map(|i| v[i] - lr * g[i]).collect();
    let case = op(OpKind::ApplyGradientDescent)
        .t(var.clone())
        .c(Const::Float(lr))
        .t(grad.clone())
        .out(DType::Float64, &shape);
    check_tol(&case, &[nv], 1e-12, 1e-6);
    // SGD: stat 1 on the first half (first step: accum = g), 0 on the rest.
    let stat: Vec<f64> = (0..n).map(|i| if i < n / 2 { 1.0 } else { 0.0 }).collect();
    for (dampening, wd, nesterov, momentum) in [
        (0.0, 0.0, false, 0.9),
        (0.1, 0.01, true, 0.9),
        (0.0, 0.05, false, 0.0),
    ] {
        let mut p_out = vec![0.0; n];
        let mut a_out = vec![0.0; n];
        let mut s_out = vec![0.0; n];
        for i in 0..n {
            let mut gi = g[i] + if wd > 0.0 { v[i] * wd } else { 0.0 };
            let (mut ai, mut si) = (a[i], stat[i]);
            if momentum > 0.0 {
                if si > 0.0 {
                    ai = gi;
                    si = 0.0;
                } else {
                    ai = ai * momentum + (1.0 - dampening) * gi;
                }
                gi = if nesterov { gi + ai * momentum } else { ai };
            }
            p_out[i] = v[i] - lr * gi;
            a_out[i] = ai;
            s_out[i] = si;
        }
        let case = op(OpKind::SGD)
            .attr("dampening", Attr::Float(dampening))
            .attr("weight_decay", Attr::Float(wd))
            .attr("nesterov", Attr::Bool(nesterov))
            .t(var.clone())
            .t(grad.clone())
            .c(Const::Float(lr))
            .t(acc.clone())
            .c(Const::Float(momentum))
            .t(t64(&shape, stat.clone()))
            .out(DType::Float64, &shape)
            .out(DType::Float64, &shape)
            .out(DType::Float64, &shape);
        check_tol(&case, &[p_out, a_out, s_out], 1e-12, 1e-6);
    }
    // Adam.
    let m = rand64(&mut rng, &shape, -0.1, 0.1);
    let vv = rand64(&mut rng, &shape, 0.0, 0.1);
    let (mv, vvv) = (m.to_f64_vec(), vv.to_f64_vec());
    let (b1, b2, eps, b1p, b2p) = (0.9, 0.999, 1e-8, 0.9f64.powi(3), 0.999f64.powi(3));
    for nesterov in [false, true] {
        let lr_t = lr * (1.0 - b2p).sqrt() / (1.0 - b1p);
        let nm: Vec<f64> = (0..n).map(|i| b1 * mv[i] + (1.0 - b1) * g[i]).collect();
        let nvv: Vec<f64> = (0..n)
            .map(|i| b2 * vvv[i] + (1.0 - b2) * g[i] * g[i])
            .collect();
        let nvar: Vec<f64> = (0..n)
            .map(|i| {
                let num = if nesterov {
                    nm[i] * b1 + (1.0 - b1) * g[i]
                } else {
                    nm[i]
                };
                v[i] - lr_t * num / (nvv[i].sqrt() + eps)
            })
            .collect();
        let scalar = |x: f64| Tensor::from_f64(vec![], vec![x]).unwrap();
        let case = op(OpKind::Adam)
            .attr("use_nesterov", Attr::Bool(nesterov))
            .t(var.clone())
            .t(m.clone())
            .t(vv.clone())
            .t(scalar(b1p))
            .t(scalar(b2p))
            .c(Const::Float(lr))
            .c(Const::Float(b1))
            .c(Const::Float(b2))
            .c(Const::Float(eps))
            .t(grad.clone())
            .out(DType::Float64, &shape)
            .out(DType::Float64, &shape)
            .out(DType::Float64, &shape);
        check_tol(&case, &[nvar, nm, nvv], 1e-12, 1e-5);
    }
}

/// A long float32 sum does not drift: the mean of 6 M elements of 1.1 (GPT-2 small's MSE
/// is a mean over 6.4 M squares) is 1.1 to float32's precision, over all axes and over the
/// outer axis alike. A float32 accumulator loses most of it past 2^24 / 1.1 elements.
#[test]
fn long_float32_sums_do_not_drift() {
    let n = 6_000_000;
    let x = Tensor::from_f32(vec![3, n / 3], vec![1.1f32; n]).expect("x");
    let mean_all = op(OpKind::ReduceMean)
        .attr("keep_dims", Attr::Bool(false))
        .t(x.clone())
        .c(ints(&[]))
        .out(DType::Float32, &[]);
    let sum_outer = op(OpKind::ReduceSum)
        .attr("keep_dims", Attr::Bool(false))
        .t(Tensor::from_f32(vec![n / 2, 2], vec![1.1f32; n]).expect("x"))
        .c(ints(&[0]))
        .out(DType::Float32, &[2]);
    let mean = mean_all.run()[0].to_f64_vec()[0];
    assert!((mean - 1.1).abs() <= 1e-6, "mean {mean}");
    for s in sum_outer.run()[0].to_f64_vec() {
        let want = 1.1f32 as f64 * (n / 2) as f64;
        assert!((s - want).abs() <= 1e-6 * want, "sum {s}, want {want}");
    }
}
