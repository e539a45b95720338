//! Results do not depend on the thread count: 1, 2 and 3 threads (and the global pool) give
//! bit-identical results on cases big enough to take every parallel path.

mod common;

use common::*;
use shardc_backend_cpu::{sgemm, CpuBackend, MatRef};
use shardc_ir::{Attr, Const, DType, OpKind};
use shardc_runtime::{Data, Tensor};

fn cases() -> Vec<Case> {
    let mut rng = Rng::new(99);
    let mut r = |shape: &[usize]| rand64(&mut rng, shape, -1.0, 1.0);
    let mut v = Vec::new();
    v.push(
        op(OpKind::MatMul)
            .t(r(&[200, 300]))
            .t(r(&[150, 300]))
            .attr("transpose_b", Attr::Bool(true))
            .out(DType::Float64, &[200, 150]),
    );
    // Few rows: the product is computed column-major from a column-major `a` (both
    // transposes) or a copied one.
    for ta in [false, true] {
        v.push(
            op(OpKind::MatMul)
                .t(if ta { r(&[300, 24]) } else { r(&[24, 300]) })
                .t(r(&[400, 300]))
                .attr("transpose_a", Attr::Bool(ta))
                .attr("transpose_b", Attr::Bool(true))
                .out(DType::Float64, &[24, 400]),
        );
    }
    v.push(
        op(OpKind::MatMul)
            .t(r(&[517, 263]))
            .t(r(&[263, 391]))
            .out(DType::Float64, &[517, 391]),
    );
    v.push(
        op(OpKind::BatchMatMul)
            .t(r(&[8, 64, 48]))
            .t(r(&[48, 80]))
            .out(DType::Float64, &[8, 64, 80]),
    );
    let conv = |c: Case| c.attr("pad_mode", word("same"));
    for n in [1usize, 9] {
        let (x, w, dy) = (r(&[n, 16, 16, 16]), r(&[32, 16, 3, 3]), r(&[n, 32, 16, 16]));
        v.push(
            conv(op(OpKind::Conv2D))
                .t(x.clone())
                .t(w.clone())
                .out(DType::Float64, &[n, 32, 16, 16]),
        );
        v.push(
            conv(op(OpKind::Conv2DBackpropInput))
                .t(dy.clone())
                .t(w)
                .c(ints(&[n as i64, 16, 16, 16]))
                .out(DType::Float64, &[n, 16, 16, 16]),
        );
        v.push(
            conv(op(OpKind::Conv2DBackpropFilter))
                .t(dy)
                .t(x)
                .c(ints(&[32, 16, 3, 3]))
                .out(DType::Float64, &[32, 16, 3, 3]),
        );
    }
    let big = r(&[300, 400]);
    for (axes, shape) in [
        (vec![0i64], vec![400usize]),
        (vec![1], vec![300]),
        (vec![], vec![]),
    ] {
        for kind in [OpKind::ReduceSum, OpKind::ReduceMean, OpKind::ReduceMax] {
            v.push(
                op(kind)
                    .t(big.clone())
                    .c(ints(&axes))
                    .out(DType::Float64, &shape),
            );
        }
    }
    v.push(
        op(OpKind::Softmax)
            .attr("axis", Attr::Int(0))
            .t(big.clone())
            .out(DType::Float64, &[300, 400]),
    );
    v.push(
        op(OpKind::LogSoftmax)
            .t(big.clone())
            .out(DType::Float64, &[300, 400]),
    );
    v.push(
        op(OpKind::Transpose)
            .t(big.clone())
            .c(ints(&[1, 0]))
            .out(DType::Float64, &[400, 300]),
    );
    v.push(
        op(OpKind::Add)
            .t(big.clone())
            .t(r(&[400]))
            .out(DType::Float64, &[300, 400]),
    );
    v.push(
        op(OpKind::Dropout)
            .attr("keep_prob", Attr::Float(0.7))
            .attr("seed0", Attr::Int(5))
            .t(big.clone())
            .out(DType::Float64, &[300, 400])
            .out(DType::Float64, &[300, 400])
            .step(11),
    );
    let x = r(&[8, 16, 32, 32]);
    let c = 16;
    let bn_out = |c0: Case| {
        c0.out(DType::Float64, &[8, 16, 32, 32])
            .out(DType::Float64, &[c])
            .out(DType::Float64, &[c])
            .out(DType::Float64, &[c])
            .out(DType::Float64, &[c])
    };
    v.push(bn_out(
        op(OpKind::BatchNorm)
            .t(x.clone())
            .t(r(&[c]))
            .t(r(&[c]))
            .t(r(&[c]))
            .t(r(&[c])),
    ));
    v.push(
        op(OpKind::BatchNormGrad)
            .t(r(&[8, 16, 32, 32]))
            .t(x.clone())
            .t(r(&[c]))
            .t(r(&[c]))
            .t(r(&[c]))
            .out(DType::Float64, &[8, 16, 32, 32])
            .out(DType::Float64, &[c])
            .out(DType::Float64, &[c]),
    );
    v.push(
        op(OpKind::MaxPool)
            .attr("kernel_size", Attr::Int(3))
            .attr("strides", Attr::Int(2))
            .attr("pad_mode", word("same"))
            .t(x.clone())
            .out(DType::Float64, &[8, 16, 16, 16]),
    );
    let ln = r(&[256, 512]);
    v.push(
        op(OpKind::LayerNorm)
            .t(ln.clone())
            .t(r(&[512]))
            .t(r(&[512]))
            .out(DType::Float64, &[256, 512])
            .out(DType::Float64, &[256, 1])
            .out(DType::Float64, &[256, 1]),
    );
    v.push(
        op(OpKind::LayerNormGrad)
            .t(ln)
            .t(r(&[256, 512]))
            .t(rand64(&mut Rng::new(3), &[256, 1], 0.5, 2.0))
            .t(r(&[256, 1]))
            .t(r(&[512]))
            .out(DType::Float64, &[256, 512])
            .out(DType::Float64, &[512])
            .out(DType::Float64, &[512]),
    );
    let ids: Vec<i64> = (0..3000).map(|i| (i * 7919 % 50) as i64).collect();
    v.push(
        op(OpKind::UnsortedSegmentSum)
            .t(r(&[3000, 64]))
            .t(Tensor {
                shape: vec![3000],
                data: Data::I64(ids),
            })
            .c(Const::Int(50))
            .out(DType::Float64, &[50, 64]),
    );
    let labels: Vec<i32> = (0..1000i32).map(|i| i * 31 % 100).collect();
    v.push(
        op(OpKind::SparseSoftmaxCrossEntropyWithLogits)
            .t(r(&[1000, 100]))
            .t(Tensor {
                shape: vec![1000],
                data: Data::I32(labels),
            })
            .out(DType::Float64, &[]),
    );
    v
}

#[test]
fn results_do_not_depend_on_threads() {
    let backends = [
        CpuBackend::with_threads(1),
        CpuBackend::with_threads(2),
        CpuBackend::with_threads(3),
        CpuBackend::new(),
    ];
    assert_eq!(backends[0].threads(), 1);
    assert_eq!(backends[1].threads(), 2);
    for case in cases() {
        for c in [case.clone(), case.as_f32()] {
            let reference = c.run_on(&backends[0]).unwrap();
            for b in &backends[1..] {
                let got = c.run_on(b).unwrap();
                for (i, (g, r)) in got.iter().zip(&reference).enumerate() {
                    assert!(
                        g.data == r.data,
                        "{} result {i} ({}) differs with {} threads",
                        c.node.op,
                        g.dtype(),
                        b.threads()
                    );
                }
            }
        }
    }
}

#[test]
fn sgemm_is_thread_count_independent() {
    let mut rng = Rng::new(7);
    for &(m, n, k) in &[(256, 256, 256), (301, 157, 433)] {
        let a: Vec<f32> = rng
            .vec(m * k, -1.0, 1.0)
            .iter()
            .map(|&v| v as f32)
            .collect();
        let b: Vec<f32> = rng
            .vec(k * n, -1.0, 1.0)
            .iter()
            .map(|&v| v as f32)
            .collect();
        let mut c1 = vec![0f32; m * n];
        let mut c2 = vec![0f32; m * n];
        sgemm(m, n, k, MatRef::new(&a, k), MatRef::new(&b, n), &mut c1, 1).unwrap();
        sgemm(m, n, k, MatRef::new(&a, k), MatRef::new(&b, n), &mut c2, 2).unwrap();
        assert_eq!(c1, c2);
    }
}
