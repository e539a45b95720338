//! The Winograd F(2×2, 3×3) path of the convolution kernels (3×3, stride 1, `same` padding,
//! one group, at least 8 input channels): the convolution and both gradients against a naive
//! reference, on odd and even planes, planes smaller than a tile, and batches spanning
//! several blocks of images; and bit-identical results for every thread count.

mod common;

use common::*;
use shardc_backend_cpu::CpuBackend;
use shardc_ir::{Attr, DType, OpKind};

/// `(n, c, o, h, w)` of a 3×3 `same` convolution.
type Shape = (usize, usize, usize, usize, usize);

fn shapes() -> Vec<Shape> {
    vec![
        (2, 8, 5, 5, 7),   // odd height and width: partial tiles on both edges
        (3, 9, 4, 8, 6),   // even planes
        (2, 8, 3, 1, 1),   // a plane smaller than one tile
        (2, 8, 2, 1, 2),   // one row
        (2, 8, 2, 3, 1),   // one column
        (5, 8, 4, 32, 32), // 256 tiles per image: two blocks of images
        (33, 16, 8, 4, 4), // the last ResNet stage's planes: several blocks
    ]
}

/// `y = conv(x, w)`, `dx` and `dw` of `sum(dy * y)`, naively.
fn reference(
    (n, c, o, h, w): Shape,
    x: &[f64],
    wt: &[f64],
    dy: &[f64],
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let mut y = vec![0.0; n * o * h * w];
    let mut dx = vec![0.0; n * c * h * w];
    let mut dw = vec![0.0; o * c * 9];
    for ni in 0..n {
        for oi in 0..o {
            for r in 0..h {
                for q in 0..w {
                    let yi = ((ni * o + oi) * h + r) * w + q;
                    let mut s = 0.0;
                    for ci in 0..c {
                        for i in 0..3 {
                            for j in 0..3 {
                                let (ih, iw) =
                                    (r as isize + i as isize - 1, q as isize + j as isize - 1);
                                if ih < 0 || iw < 0 || ih >= h as isize || iw >= w as isize {
                                    continue;
                                }
                                let xi = ((ni * c + ci) * h + ih as usize) * w + iw as usize;
                                let wi = ((oi * c + ci) * 3 + i) * 3 + j;
                                s += x[xi] * wt[wi];
                                dx[xi] += dy[yi] * wt[wi];
                                dw[wi] += dy[yi] * x[xi];
                            }
                        }
                    }
                    y[yi] = s;
                }
            }
        }
    }
    (y, dx, dw)
}

/// The three cases of one shape: forward, input gradient, filter gradient.
fn cases(shape: Shape, seed: u64) -> ([Case; 3], [Vec<f64>; 3]) {
    let (n, c, o, h, w) = shape;
    let mut rng = Rng::new(seed);
    let x = rand64(&mut rng, &[n, c, h, w], -1.0, 1.0);
    let wt = rand64(&mut rng, &[o, c, 3, 3], -1.0, 1.0);
    let dy = rand64(&mut rng, &[n, o, h, w], -1.0, 1.0);
    let (y, dx, dw) = reference(shape, &x.to_f64_vec(), &wt.to_f64_vec(), &dy.to_f64_vec());
    let conv = |k: OpKind| {
        op(k)
            .attr("out_channel", Attr::Int(o as i64))
            .attr("pad_mode", word("same"))
    };
    let fwd = conv(OpKind::Conv2D)
        .t(x.clone())
        .t(wt.clone())
        .out(DType::Float64, &[n, o, h, w]);
    let bi = conv(OpKind::Conv2DBackpropInput)
        .t(dy.clone())
        .t(wt)
        .c(ints(&[n as i64, c as i64, h as i64, w as i64]))
        .out(DType::Float64, &[n, c, h, w]);
    let bf = conv(OpKind::Conv2DBackpropFilter)
        .t(dy)
        .t(x)
        .c(ints(&[o as i64, c as i64, 3, 3]))
        .out(DType::Float64, &[o, c, 3, 3]);
    ([fwd, bi, bf], [y, dx, dw])
}

#[test]
fn conv_winograd_matches_the_naive_convolution_and_gradients() {
    for (i, shape) in shapes().into_iter().enumerate() {
        let ([fwd, bi, bf], [y, dx, dw]) = cases(shape, 100 + i as u64);
        check_tol(&fwd, &[y], 1e-10, 2e-4);
        check_tol(&bi, &[dx], 1e-10, 2e-4);
        // The filter gradient sums n·h·w products: f32 rounding grows with it.
        check_tol(&bf, &[dw], 1e-10, 1e-3);
    }
}

#[test]
fn conv_winograd_results_do_not_depend_on_threads() {
    let serial = CpuBackend::with_threads(1);
    let (cases, _) = cases((5, 16, 12, 12, 10), 7);
    for case in cases.iter().flat_map(|c| [c.clone(), c.as_f32()]) {
        let want = case.run_on(&serial).expect("serial run");
        for threads in [2, 3] {
            let got = case
                .run_on(&CpuBackend::with_threads(threads))
                .expect("parallel run");
            for (g, w) in got.iter().zip(&want) {
                assert_eq!(g.data, w.data, "{} with {threads} threads", case.node.op);
            }
        }
    }
}

/// Times the convolution and its gradients at the shapes of CIFAR ResNet-18's 3×3 layers
/// (batch 32, f32, 2 threads; the fastest of 10 runs each). A benchmark, not a test: run with
/// `cargo test --release -p shardc-backend-cpu --test conv_winograd -- --ignored --nocapture`.
#[test]
#[ignore = "a benchmark: run with --ignored --nocapture in release"]
fn resnet18_layer_timings() {
    let backend = CpuBackend::with_threads(2);
    let mut total = 0.0;
    for (c, hw) in [(64, 32), (128, 16), (256, 8), (512, 4)] {
        let (cases, _) = cases((32, c, c, hw, hw), 1);
        let mut line = format!("C={c:>3} H=W={hw:>2}:");
        for case in cases.iter().map(Case::as_f32) {
            case.run_on(&backend).expect("warm-up");
            // The fastest of several runs: this machine's noise only ever adds time.
            let ms = (0..10)
                .map(|_| {
                    let t0 = std::time::Instant::now();
                    case.run_on(&backend).expect("run");
                    t0.elapsed().as_secs_f64() * 1e3
                })
                .fold(f64::INFINITY, f64::min);
            total += ms;
            line += &format!(" {} {ms:7.2} ms", case.node.op);
        }
        println!("{line}");
    }
    println!("total {total:.1} ms");
}
