//! The synchronised BatchNorm kernels (`BNTrainingReduce`, `BNTrainingUpdate`,
//! `BNTrainingUpdateGrad`, `BNTrainingReduceGrad`) against BatchNorm / BatchNormGrad: on one
//! device the composition equals them (f64 within 1e-12, f32 within 1e-5); over a batch split
//! in two, summing the parts' sums (what the AllReduce does) gives the whole batch's results;
//! the thread count changes no bit; bad attributes are errors, not panics.

mod common;

use common::*;
use shardc_backend_cpu::CpuBackend;
use shardc_ir::{Attr, DType, OpKind};
use shardc_runtime::Tensor;

const EPS: f64 = 1e-3;

fn reduce(x: &Tensor, c: usize, dt: DType) -> Vec<Tensor> {
    op(OpKind::BNTrainingReduce)
        .t(x.clone())
        .out(dt, &[c])
        .out(dt, &[c])
        .run()
}

fn update(x: &Tensor, sums: &[Tensor], sb: &[Tensor], count: usize, dt: DType) -> Case {
    let c = sb[0].shape[0];
    op(OpKind::BNTrainingUpdate)
        .attr("epsilon", Attr::Float(EPS))
        .attr("count", Attr::Int(count as i64))
        .t(x.clone())
        .t(sums[0].clone())
        .t(sums[1].clone())
        .t(sb[0].clone())
        .t(sb[1].clone())
        .out(dt, &x.shape)
        .out(dt, &[c])
        .out(dt, &[c])
        .out(dt, &[c])
        .out(dt, &[c])
}

fn batch_norm(x: &Tensor, sb: &[Tensor], dt: DType) -> Vec<Tensor> {
    let c = sb[0].shape[0];
    op(OpKind::BatchNorm)
        .attr("epsilon", Attr::Float(EPS))
        .t(x.clone())
        .t(sb[0].clone())
        .t(sb[1].clone())
        .t(sb[0].clone())
        .t(sb[1].clone())
        .out(dt, &x.shape)
        .out(dt, &[c])
        .out(dt, &[c])
        .out(dt, &[c])
        .out(dt, &[c])
        .run()
}

fn update_grad(dy: &Tensor, x: &Tensor, stats: &[Tensor], dt: DType) -> Vec<Tensor> {
    let c = stats[0].shape[0];
    op(OpKind::BNTrainingUpdateGrad)
        .t(dy.clone())
        .t(x.clone())
        .t(stats[0].clone())
        .t(stats[1].clone())
        .out(dt, &[c])
        .out(dt, &[c])
        .run()
}

#[allow(clippy::too_many_arguments)]
fn reduce_grad(
    dy: &Tensor,
    x: &Tensor,
    sums: &[Tensor],
    scale: &Tensor,
    stats: &[Tensor],
    count: usize,
    dt: DType,
) -> Case {
    op(OpKind::BNTrainingReduceGrad)
        .attr("count", Attr::Int(count as i64))
        .t(dy.clone())
        .t(x.clone())
        .t(sums[0].clone())
        .t(sums[1].clone())
        .t(scale.clone())
        .t(stats[0].clone())
        .t(stats[1].clone())
        .out(dt, &x.shape)
}

/// Rows `lo..hi` of the batch (dimension 0).
fn batch_rows(t: &Tensor, lo: usize, hi: usize) -> Tensor {
    let row = numel(&t.shape[1..]);
    let v = t.to_f64_vec()[lo * row..hi * row].to_vec();
    let mut shape = t.shape.clone();
    shape[0] = hi - lo;
    t64(&shape, v)
}

fn cast(t: &Tensor, dt: DType) -> Tensor {
    if dt == DType::Float32 {
        to_f32(t)
    } else {
        t.clone()
    }
}

fn add(a: &Tensor, b: &Tensor) -> Tensor {
    let v = a
        .to_f64_vec()
        .iter()
        .zip(b.to_f64_vec())
        .map(|(x, y)| x + y)
        .collect();
    t64(&a.shape, v)
}

#[test]
fn composition_equals_batch_norm_on_one_device() {
    let mut rng = Rng::new(41);
    for shape in [vec![4usize, 3, 5, 2], vec![6, 3], vec![2, 5, 3, 3]] {
        let c = shape[1];
        let count = shape[0] * numel(&shape[2..]);
        let x64 = rand64(&mut rng, &shape, -2.0, 3.0);
        let sb64 = [
            rand64(&mut rng, &[c], 0.5, 1.5),
            rand64(&mut rng, &[c], -1.0, 1.0),
        ];
        let dy64 = rand64(&mut rng, &shape, -1.0, 1.0);
        for (dt, tol) in [(DType::Float64, 1e-12), (DType::Float32, 1e-5)] {
            let x = cast(&x64, dt);
            let dy = cast(&dy64, dt);
            let sb = [cast(&sb64[0], dt), cast(&sb64[1], dt)];
            let want = batch_norm(&x, &sb, dt);
            let got = update(&x, &reduce(&x, c, dt), &sb, count, dt).run();
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_close(
                    &format!("{dt:?} {shape:?} forward result {i}"),
                    &g.to_f64_vec(),
                    &w.to_f64_vec(),
                    tol,
                );
            }
            // Backward from BatchNorm's saved statistics.
            let stats = [want[3].clone(), want[4].clone()];
            let bng = op(OpKind::BatchNormGrad)
                .attr("epsilon", Attr::Float(EPS))
                .t(dy.clone())
                .t(x.clone())
                .t(sb[0].clone())
                .t(stats[0].clone())
                .t(stats[1].clone())
                .out(dt, &shape)
                .out(dt, &[c])
                .out(dt, &[c])
                .run();
            let sums = update_grad(&dy, &x, &stats, dt);
            // The same folds as BatchNormGrad: bit for bit.
            assert_eq!(sums[0].to_f64_vec(), bng[1].to_f64_vec(), "dscale");
            assert_eq!(sums[1].to_f64_vec(), bng[2].to_f64_vec(), "dbias");
            let dx = reduce_grad(&dy, &x, &sums, &sb[0], &stats, count, dt).run();
            assert_eq!(dx[0].to_f64_vec(), bng[0].to_f64_vec(), "dx");
        }
    }
}

#[test]
fn a_split_batch_with_summed_parts_gives_the_whole_batch() {
    let mut rng = Rng::new(42);
    let shape = [6usize, 4, 3, 2];
    let c = 4;
    let count = 6 * 3 * 2;
    let x = rand64(&mut rng, &shape, -1.0, 2.0);
    let dy = rand64(&mut rng, &shape, -1.0, 1.0);
    let sb = [
        rand64(&mut rng, &[c], 0.5, 1.5),
        rand64(&mut rng, &[c], -1.0, 1.0),
    ];
    let dt = DType::Float64;
    let whole = batch_norm(&x, &sb, dt);
    let stats = [whole[3].clone(), whole[4].clone()];
    let parts = [batch_rows(&x, 0, 2), batch_rows(&x, 2, 6)];
    let dys = [batch_rows(&dy, 0, 2), batch_rows(&dy, 2, 6)];
    // Forward: the parts' sums, added (the AllReduce), then each part's update.
    let (r0, r1) = (reduce(&parts[0], c, dt), reduce(&parts[1], c, dt));
    let sums = [add(&r0[0], &r1[0]), add(&r0[1], &r1[1])];
    let mut y = Vec::new();
    for p in &parts {
        let got = update(p, &sums, &sb, count, dt).run();
        for (i, (g, w)) in got.iter().zip(&whole).enumerate().skip(1) {
            assert_close(
                &format!("statistic {i}"),
                &g.to_f64_vec(),
                &w.to_f64_vec(),
                1e-12,
            );
        }
        y.extend(got[0].to_f64_vec());
    }
    assert_close("y", &y, &whole[0].to_f64_vec(), 1e-12);
    // Backward.
    let bng = op(OpKind::BatchNormGrad)
        .attr("epsilon", Attr::Float(EPS))
        .t(dy.clone())
        .t(x.clone())
        .t(sb[0].clone())
        .t(stats[0].clone())
        .t(stats[1].clone())
        .out(dt, &shape)
        .out(dt, &[c])
        .out(dt, &[c])
        .run();
    let (g0, g1) = (
        update_grad(&dys[0], &parts[0], &stats, dt),
        update_grad(&dys[1], &parts[1], &stats, dt),
    );
    let gsums = [add(&g0[0], &g1[0]), add(&g0[1], &g1[1])];
    assert_close(
        "dscale",
        &gsums[0].to_f64_vec(),
        &bng[1].to_f64_vec(),
        1e-12,
    );
    assert_close("dbias", &gsums[1].to_f64_vec(), &bng[2].to_f64_vec(), 1e-12);
    let mut dx = Vec::new();
    for (p, d) in parts.iter().zip(&dys) {
        dx.extend(reduce_grad(d, p, &gsums, &sb[0], &stats, count, dt).run()[0].to_f64_vec());
    }
    assert_close("dx", &dx, &bng[0].to_f64_vec(), 1e-12);
}

#[test]
fn thread_count_changes_no_bit() {
    let mut rng = Rng::new(43);
    let shape = [8usize, 16, 32, 32];
    let c = 16;
    let count = 8 * 32 * 32;
    let x = rand64(&mut rng, &shape, -1.0, 1.0);
    let dy = rand64(&mut rng, &shape, -1.0, 1.0);
    let v = |rng: &mut Rng| rand64(rng, &[c], 0.5, 1.5);
    let sb = [v(&mut rng), v(&mut rng)];
    let sums = [v(&mut rng), v(&mut rng)];
    let stats = [v(&mut rng), v(&mut rng)];
    let dt = DType::Float64;
    let cases = [
        op(OpKind::BNTrainingReduce)
            .t(x.clone())
            .out(dt, &[c])
            .out(dt, &[c]),
        update(&x, &sums, &sb, count, dt),
        op(OpKind::BNTrainingUpdateGrad)
            .t(dy.clone())
            .t(x.clone())
            .t(stats[0].clone())
            .t(stats[1].clone())
            .out(dt, &[c])
            .out(dt, &[c]),
        reduce_grad(&dy, &x, &sums, &sb[0], &stats, count, dt),
    ];
    for case in &cases {
        let one = case.run_on(&CpuBackend::with_threads(1)).unwrap();
        for threads in [2, 3] {
            let many = case.run_on(&CpuBackend::with_threads(threads)).unwrap();
            for (a, b) in one.iter().zip(&many) {
                assert_eq!(
                    a.to_f64_vec(),
                    b.to_f64_vec(),
                    "{} with {threads} threads",
                    case.node.op
                );
            }
        }
    }
}

#[test]
fn a_missing_or_bad_count_is_an_error() {
    let mut rng = Rng::new(44);
    let x = rand64(&mut rng, &[2, 3, 2, 2], -1.0, 1.0);
    let v = |rng: &mut Rng| rand64(rng, &[3], 0.5, 1.5);
    let sb = [v(&mut rng), v(&mut rng)];
    let sums = [v(&mut rng), v(&mut rng)];
    let e = update(&x, &sums, &sb, 0, DType::Float64)
        .run_on(&CpuBackend::with_threads(1))
        .unwrap_err()
        .to_string();
    assert!(e.contains("count") && e.contains(">= 1"), "{e}");
    let mut no_count = update(&x, &sums, &sb, 8, DType::Float64);
    no_count.node.attrs = shardc_ir::Attrs::new();
    let e = no_count
        .run_on(&CpuBackend::with_threads(1))
        .unwrap_err()
        .to_string();
    assert!(e.contains("count"), "{e}");
}
