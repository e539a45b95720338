//! MatMul, BatchMatMul, Conv2D and its gradients, pools: against naive f64 references.

mod common;

use common::*;
use shardc_backend_cpu::{dgemm, sgemm, CpuBackend, GemmError, MatRef};
use shardc_ir::{Attr, DType, OpKind};

/// `op(a) op(b)` with a stored `(m, k)` (or `(k, m)` when `ta`), b `(k, n)` (or `(n, k)`).
fn ref_matmul(
    a: &[f64],
    b: &[f64],
    (m, k, n): (usize, usize, usize),
    ta: bool,
    tb: bool,
) -> Vec<f64> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut s = 0.0;
            for p in 0..k {
                let av = if ta { a[p * m + i] } else { a[i * k + p] };
                let bv = if tb { b[j * k + p] } else { b[p * n + j] };
                s += av * bv;
            }
            c[i * n + j] = s;
        }
    }
    c
}

#[test]
fn matmul_all_transposes_and_odd_sizes() {
    let mut rng = Rng::new(1);
    for &(m, k, n) in &[
        (1, 1, 1),
        (3, 5, 2),
        (7, 13, 5),
        (33, 65, 17),
        (130, 70, 90),
    ] {
        for &(ta, tb) in &[(false, false), (true, false), (false, true), (true, true)] {
            let sa = if ta { [k, m] } else { [m, k] };
            let sb = if tb { [n, k] } else { [k, n] };
            let a = rand64(&mut rng, &sa, -1.0, 1.0);
            let b = rand64(&mut rng, &sb, -1.0, 1.0);
            let want = ref_matmul(&a.to_f64_vec(), &b.to_f64_vec(), (m, k, n), ta, tb);
            let case = op(OpKind::MatMul)
                .attr("transpose_a", Attr::Bool(ta))
                .attr("transpose_b", Attr::Bool(tb))
                .t(a)
                .t(b)
                .out(DType::Float64, &[m, n]);
            check_tol(&case, &[want], 1e-12, 1e-4 * (k as f64).sqrt());
        }
    }
}

#[test]
fn matmul_shape_mismatch_is_an_error() {
    let case = op(OpKind::MatMul)
        .t(t64(&[2, 3], vec![0.0; 6]))
        .t(t64(&[4, 2], vec![0.0; 8]))
        .out(DType::Float64, &[2, 2]);
    let err = case.run_on(&CpuBackend::with_threads(1)).unwrap_err();
    assert!(err.to_string().contains("inner dimensions"), "{err}");
    assert_eq!(err.instance, "matmul-test");
}

#[test]
fn batch_matmul_broadcasts_batch_dims() {
    let mut rng = Rng::new(2);
    // (a batch, b batch, out batch)
    let cases: &[(&[usize], &[usize], &[usize])] = &[
        (&[2, 3], &[2, 3], &[2, 3]),
        (&[2, 3], &[3], &[2, 3]),
        (&[2, 1], &[1, 4], &[2, 4]),
        (&[5], &[], &[5]),
        (&[], &[], &[]),
        (&[40], &[40], &[40]),
    ];
    for &(ab, bb, ob) in cases {
        for &(ta, tb) in &[(false, false), (true, true), (false, true)] {
            let (m, k, n) = (4, 6, 5);
            let mut sa = ab.to_vec();
            sa.extend(if ta { [k, m] } else { [m, k] });
            let mut sb = bb.to_vec();
            sb.extend(if tb { [n, k] } else { [k, n] });
            let mut so = ob.to_vec();
            so.extend([m, n]);
            let a = rand64(&mut rng, &sa, -1.0, 1.0);
            let b = rand64(&mut rng, &sb, -1.0, 1.0);
            let (av, bv) = (a.to_f64_vec(), b.to_f64_vec());
            let nb = numel(ob);
            let mut want = Vec::new();
            for bi in 0..nb {
                let idx = unravel(bi, ob);
                let pick = |batch: &[usize]| {
                    let lead = ob.len() - batch.len();
                    let bidx: Vec<usize> = batch
                        .iter()
                        .enumerate()
                        .map(|(d, &s)| if s == 1 { 0 } else { idx[lead + d] })
                        .collect();
                    ravel(&bidx, batch)
                };
                let (ai, bj) = (pick(ab), pick(bb));
                want.extend(ref_matmul(
                    &av[ai * m * k..][..m * k],
                    &bv[bj * k * n..][..k * n],
                    (m, k, n),
                    ta,
                    tb,
                ));
            }
            let case = op(OpKind::BatchMatMul)
                .attr("transpose_a", Attr::Bool(ta))
                .attr("transpose_b", Attr::Bool(tb))
                .t(a)
                .t(b)
                .out(DType::Float64, &so);
            check(&case, &[want]);
        }
    }
}

#[test]
fn public_gemm_checks_bounds_and_computes() {
    let mut rng = Rng::new(3);
    let (m, k, n) = (9, 11, 7);
    // a stored transposed with padding (ld 10 >= m 9).
    let a: Vec<f64> = rng.vec(k * 10, -1.0, 1.0);
    let b: Vec<f64> = rng.vec(k * n, -1.0, 1.0);
    let mut c = vec![f64::NAN; m * n];
    dgemm(
        m,
        n,
        k,
        MatRef::transposed(&a, 10),
        MatRef::new(&b, n),
        &mut c,
        1,
    )
    .unwrap();
    let a_dense: Vec<f64> = (0..k)
        .flat_map(|p| a[p * 10..p * 10 + m].to_vec())
        .collect();
    assert_close(
        "dgemm",
        &c,
        &ref_matmul(&a_dense, &b, (m, k, n), true, false),
        1e-12,
    );
    let a32: Vec<f32> = a.iter().map(|&v| v as f32).collect();
    let b32: Vec<f32> = b.iter().map(|&v| v as f32).collect();
    let mut c32 = vec![0f32; m * n];
    sgemm(
        m,
        n,
        k,
        MatRef::transposed(&a32, 10),
        MatRef::new(&b32, n),
        &mut c32,
        2,
    )
    .unwrap();
    let c32: Vec<f64> = c32.iter().map(|&v| v as f64).collect();
    assert_close("sgemm", &c32, &c, 1e-5);
    // Too short / bad leading dimension.
    let e = sgemm(
        m,
        n,
        k,
        MatRef::new(&a32[..10], k),
        MatRef::new(&b32, n),
        &mut [0.0; 63],
        1,
    );
    assert!(
        matches!(e, Err(GemmError::TooShort { operand: "a", .. })),
        "{e:?}"
    );
    let e = sgemm(
        m,
        n,
        k,
        MatRef::new(&a32, 3),
        MatRef::new(&b32, n),
        &mut [0.0; 63],
        1,
    );
    assert!(matches!(e, Err(GemmError::LeadingDim { .. })), "{e:?}");
    let e = sgemm(
        m,
        n,
        k,
        MatRef::new(&a32, k),
        MatRef::new(&b32, n),
        &mut [0.0; 10],
        1,
    );
    assert!(
        matches!(e, Err(GemmError::TooShort { operand: "c", .. })),
        "{e:?}"
    );
}

/// Conv geometry computed independently in the test.
#[derive(Clone, Copy, Debug)]
struct G {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    o: usize,
    kh: usize,
    kw: usize,
    sh: usize,
    sw: usize,
    dh: usize,
    dw: usize,
    pt: usize,
    pl: usize,
    oh: usize,
    ow: usize,
    group: usize,
}

fn ref_conv(x: &[f64], w: &[f64], g: &G) -> Vec<f64> {
    let (cg, og) = (g.c / g.group, g.o / g.group);
    let mut y = vec![0.0; g.n * g.o * g.oh * g.ow];
    for n in 0..g.n {
        for o in 0..g.o {
            let grp = o / og;
            for oh in 0..g.oh {
                for ow in 0..g.ow {
                    let mut s = 0.0;
                    for c in 0..cg {
                        for i in 0..g.kh {
                            for j in 0..g.kw {
                                let ih = (oh * g.sh + i * g.dh) as isize - g.pt as isize;
                                let iw = (ow * g.sw + j * g.dw) as isize - g.pl as isize;
                                if ih < 0 || iw < 0 || ih >= g.h as isize || iw >= g.w as isize {
                                    continue;
                                }
                                let ci = grp * cg + c;
                                s += x[((n * g.c + ci) * g.h + ih as usize) * g.w + iw as usize]
                                    * w[((o * cg + c) * g.kh + i) * g.kw + j];
                            }
                        }
                    }
                    y[((n * g.o + o) * g.oh + oh) * g.ow + ow] = s;
                }
            }
        }
    }
    y
}

/// (dx, dw) of `sum(dy * conv(x, w))`.
fn ref_conv_grads(x: &[f64], w: &[f64], dy: &[f64], g: &G) -> (Vec<f64>, Vec<f64>) {
    let (cg, og) = (g.c / g.group, g.o / g.group);
    let mut dx = vec![0.0; x.len()];
    let mut dwv = vec![0.0; w.len()];
    for n in 0..g.n {
        for o in 0..g.o {
            let grp = o / og;
            for oh in 0..g.oh {
                for ow in 0..g.ow {
                    let d = dy[((n * g.o + o) * g.oh + oh) * g.ow + ow];
                    for c in 0..cg {
                        for i in 0..g.kh {
                            for j in 0..g.kw {
                                let ih = (oh * g.sh + i * g.dh) as isize - g.pt as isize;
                                let iw = (ow * g.sw + j * g.dw) as isize - g.pl as isize;
                                if ih < 0 || iw < 0 || ih >= g.h as isize || iw >= g.w as isize {
                                    continue;
                                }
                                let xi = ((n * g.c + grp * cg + c) * g.h + ih as usize) * g.w
                                    + iw as usize;
                                let wi = ((o * cg + c) * g.kh + i) * g.kw + j;
                                dx[xi] += d * w[wi];
                                dwv[wi] += d * x[xi];
                            }
                        }
                    }
                }
            }
        }
    }
    (dx, dwv)
}

/// Conv cases: (geometry, attrs).
fn conv_cases() -> Vec<(G, Vec<(&'static str, Attr)>)> {
    let base = G {
        n: 2,
        c: 3,
        h: 7,
        w: 6,
        o: 4,
        kh: 3,
        kw: 3,
        sh: 1,
        sw: 1,
        dh: 1,
        dw: 1,
        pt: 0,
        pl: 0,
        oh: 5,
        ow: 4,
        group: 1,
    };
    let mut v = vec![(base, vec![])];
    // same, stride 2: out = ceil(7/2)=4, total = 3*2+3-7 = 2 (1, 1); ceil(6/2)=3, total=2*2+3-6=1 (0,1)
    v.push((
        G {
            sh: 2,
            sw: 2,
            pt: 1,
            pl: 0,
            oh: 4,
            ow: 3,
            ..base
        },
        vec![("pad_mode", word("same")), ("stride", Attr::Int(2))],
    ));
    // pad mode with asymmetric pads, dilation, 4-tuple stride.
    // h: (7 + 1 + 2 - 5) / 2 + 1 = 3; w: (6 + 2 + 0 - 3) / 1 + 1 = 6
    v.push((
        G {
            sh: 2,
            dh: 2,
            pt: 1,
            pl: 2,
            oh: 3,
            ow: 6,
            ..base
        },
        vec![
            ("pad_mode", word("pad")),
            ("pad", attr_ints(&[1, 2, 2, 0])),
            ("stride", attr_ints(&[1, 1, 2, 1])),
            ("dilation", attr_ints(&[2, 1])),
        ],
    ));
    // groups: c 4, o 6, group 2; kernel 2x3, same, dilation 2 -> out 7 x 6;
    // h total = 6 + 3 - 7 = 2 (1, 1); w total = 5 + 5 - 6 = 4 (2, 2)
    v.push((
        G {
            c: 4,
            o: 6,
            group: 2,
            kh: 2,
            kw: 3,
            dh: 2,
            dw: 2,
            pt: 1,
            pl: 2,
            oh: 7,
            ow: 6,
            ..base
        },
        vec![
            ("pad_mode", word("same")),
            ("dilation", Attr::Int(2)),
            ("group", Attr::Int(2)),
        ],
    ));
    // 1x1 pointwise, and depthwise 3x3.
    v.push((
        G {
            kh: 1,
            kw: 1,
            oh: 7,
            ow: 6,
            ..base
        },
        vec![],
    ));
    v.push((
        G {
            c: 4,
            o: 4,
            group: 4,
            pt: 1,
            pl: 1,
            oh: 7,
            ow: 6,
            ..base
        },
        vec![
            ("pad_mode", word("pad")),
            ("pad", Attr::Int(1)),
            ("group", Attr::Int(4)),
        ],
    ));
    // Big enough for the parallel paths: batch 5, 8 -> 16 channels, 12x12.
    v.push((
        G {
            n: 5,
            c: 8,
            o: 16,
            h: 12,
            w: 12,
            pt: 1,
            pl: 1,
            oh: 12,
            ow: 12,
            ..base
        },
        vec![("pad_mode", word("same"))],
    ));
    v
}

#[test]
fn conv2d_forward_and_both_gradients() {
    let mut rng = Rng::new(4);
    for (g, attrs) in conv_cases() {
        let xs = [g.n, g.c, g.h, g.w];
        let ws = [g.o, g.c / g.group, g.kh, g.kw];
        let ys = [g.n, g.o, g.oh, g.ow];
        let x = rand64(&mut rng, &xs, -1.0, 1.0);
        let w = rand64(&mut rng, &ws, -1.0, 1.0);
        let dy = rand64(&mut rng, &ys, -1.0, 1.0);
        let (xv, wv, dyv) = (x.to_f64_vec(), w.to_f64_vec(), dy.to_f64_vec());
        let with_attrs = |mut c: Case| {
            c = c.attr("out_channel", Attr::Int(g.o as i64));
            for (k, v) in &attrs {
                c = c.attr(k, v.clone());
            }
            c
        };
        let fwd = with_attrs(op(OpKind::Conv2D))
            .t(x.clone())
            .t(w.clone())
            .out(DType::Float64, &ys);
        check(&fwd, &[ref_conv(&xv, &wv, &g)]);
        let (dx, dwv) = ref_conv_grads(&xv, &wv, &dyv, &g);
        let xs_i: Vec<i64> = xs.iter().map(|&d| d as i64).collect();
        let ws_i: Vec<i64> = ws.iter().map(|&d| d as i64).collect();
        let bi = with_attrs(op(OpKind::Conv2DBackpropInput))
            .t(dy.clone())
            .t(w.clone())
            .c(ints(&xs_i))
            .out(DType::Float64, &xs);
        check(&bi, &[dx]);
        let bf = with_attrs(op(OpKind::Conv2DBackpropFilter))
            .t(dy.clone())
            .t(x.clone())
            .c(ints(&ws_i))
            .out(DType::Float64, &ws);
        check_tol(&bf, &[dwv], 1e-10, 1e-3);
    }
}

#[test]
fn conv2d_gradient_matches_finite_differences() {
    let mut rng = Rng::new(5);
    let (g, attrs) = conv_cases().swap_remove(2);
    let xs = [g.n, g.c, g.h, g.w];
    let ws = [g.o, g.c, g.kh, g.kw];
    let ys = [g.n, g.o, g.oh, g.ow];
    let x = rand64(&mut rng, &xs, -1.0, 1.0).to_f64_vec();
    let w = rand64(&mut rng, &ws, -1.0, 1.0);
    let dy = rng.vec(numel(&ys), -1.0, 1.0);
    let mut fwd = op(OpKind::Conv2D);
    for (k, v) in &attrs {
        fwd = fwd.attr(k, v.clone());
    }
    let f = |xv: &[f64]| {
        let mut c = fwd
            .clone()
            .t(t64(&xs, xv.to_vec()))
            .t(w.clone())
            .out(DType::Float64, &ys);
        c.node.op = OpKind::Conv2D;
        c.run()[0].to_f64_vec()
    };
    let num = numeric_grad(&x, &dy, 1e-5, f);
    let mut bi = op(OpKind::Conv2DBackpropInput);
    for (k, v) in &attrs {
        bi = bi.attr(k, v.clone());
    }
    let got = bi
        .t(t64(&ys, dy.clone()))
        .t(w)
        .c(ints(&[g.n as i64, g.c as i64, g.h as i64, g.w as i64]))
        .out(DType::Float64, &xs)
        .run();
    assert_close(
        "conv dx vs finite differences",
        &got[0].to_f64_vec(),
        &num,
        1e-6,
    );
}

#[test]
fn conv2d_bad_geometry_is_an_error() {
    let case = op(OpKind::Conv2D)
        .t(t64(&[1, 3, 2, 2], vec![0.0; 12]))
        .t(t64(&[4, 3, 3, 3], vec![0.0; 108]))
        .out(DType::Float64, &[1, 4, 1, 1]);
    assert!(case.run_on(&CpuBackend::with_threads(1)).is_err());
    let case = op(OpKind::Conv2D)
        .t(t64(&[1, 3, 5, 5], vec![0.0; 75]))
        .t(t64(&[4, 3, 3, 3], vec![0.0; 108]))
        .out(DType::Float64, &[1, 4, 5, 5]);
    let e = case.run_on(&CpuBackend::with_threads(1)).unwrap_err();
    assert!(e.to_string().contains("shape"), "{e}");
}

/// Pool geometry: (h, w, kh, kw, sh, sw, pad_top, pad_left, oh, ow, attrs).
/// (h, w, kh, kw, sh, sw, pad_top, pad_left, oh, ow, attrs).
type PoolCase = (
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    Vec<(&'static str, Attr)>,
);

fn pool_cases() -> Vec<PoolCase> {
    vec![
        (
            6,
            6,
            2,
            2,
            2,
            2,
            0,
            0,
            3,
            3,
            vec![("kernel_size", Attr::Int(2)), ("strides", Attr::Int(2))],
        ),
        // valid 3x3 stride 2 on 7x8: (7-3)/2+1 = 3, (8-3)/2+1 = 3
        (
            7,
            8,
            3,
            3,
            2,
            2,
            0,
            0,
            3,
            3,
            vec![("kernel_size", Attr::Int(3)), ("strides", Attr::Int(2))],
        ),
        // same 3x2 stride (1,1,2,3) on 7x8: out 4 x 3; h total = 3*2+3-7 = 2 (1); w total = 2*3+2-8 = 0
        (
            7,
            8,
            3,
            2,
            2,
            3,
            1,
            0,
            4,
            3,
            vec![
                ("kernel_size", attr_ints(&[1, 1, 3, 2])),
                ("strides", attr_ints(&[1, 1, 2, 3])),
                ("pad_mode", word("SAME")),
            ],
        ),
        // same 3x3 stride 1 on 5x5: pads 1 each side
        (
            5,
            5,
            3,
            3,
            1,
            1,
            1,
            1,
            5,
            5,
            vec![("kernel_size", Attr::Int(3)), ("pad_mode", word("same"))],
        ),
    ]
}

#[test]
fn pools_and_their_gradients() {
    let mut rng = Rng::new(6);
    for (h, w, kh, kw, sh, sw, pt, pl, oh, ow, attrs) in pool_cases() {
        let (n, c) = (2, 3);
        let x = rand64(&mut rng, &[n, c, h, w], -1.0, 1.0);
        let dy = rand64(&mut rng, &[n, c, oh, ow], -1.0, 1.0);
        let (xv, dyv) = (x.to_f64_vec(), dy.to_f64_vec());
        let mut ymax = vec![0.0; n * c * oh * ow];
        let mut yavg = ymax.clone();
        let mut dmax = vec![0.0; xv.len()];
        let mut davg = vec![0.0; xv.len()];
        for p in 0..n * c {
            for i in 0..oh {
                for j in 0..ow {
                    let (mut best, mut arg, mut s, mut cnt) = (f64::NEG_INFINITY, 0, 0.0, 0);
                    let mut cells = Vec::new();
                    for a in 0..kh {
                        for b in 0..kw {
                            let ih = (i * sh + a) as isize - pt as isize;
                            let iw = (j * sw + b) as isize - pl as isize;
                            if ih < 0 || iw < 0 || ih >= h as isize || iw >= w as isize {
                                continue;
                            }
                            let xi = (p * h + ih as usize) * w + iw as usize;
                            cells.push(xi);
                            if xv[xi] > best {
                                best = xv[xi];
                                arg = xi;
                            }
                            s += xv[xi];
                            cnt += 1;
                        }
                    }
                    let yi = (p * oh + i) * ow + j;
                    ymax[yi] = best;
                    yavg[yi] = s / cnt as f64;
                    dmax[arg] += dyv[yi];
                    for xi in cells {
                        davg[xi] += dyv[yi] / cnt as f64;
                    }
                }
            }
        }
        for (kind, grad_kind, y, dx) in [
            (OpKind::MaxPool, OpKind::MaxPoolGrad, &ymax, &dmax),
            (OpKind::AvgPool, OpKind::AvgPoolGrad, &yavg, &davg),
        ] {
            let mut fwd = op(kind);
            let mut bwd = op(grad_kind);
            for (k, v) in &attrs {
                fwd = fwd.attr(k, v.clone());
                bwd = bwd.attr(k, v.clone());
            }
            let fwd = fwd.t(x.clone()).out(DType::Float64, &[n, c, oh, ow]);
            check(&fwd, std::slice::from_ref(y));
            let bwd = bwd
                .t(x.clone())
                .t(t64(&[n, c, oh, ow], y.clone()))
                .t(dy.clone())
                .out(DType::Float64, &[n, c, h, w]);
            check(&bwd, std::slice::from_ref(dx));
        }
    }
}

#[test]
fn max_pool_grad_routes_to_the_first_maximum() {
    // All equal: every window's gradient goes to its top-left element.
    let x = t64(&[1, 1, 2, 4], vec![1.0; 8]);
    let case = op(OpKind::MaxPoolGrad)
        .attr("kernel_size", Attr::Int(2))
        .attr("strides", Attr::Int(2))
        .t(x)
        .t(t64(&[1, 1, 1, 2], vec![1.0, 1.0]))
        .t(t64(&[1, 1, 1, 2], vec![3.0, 5.0]))
        .out(DType::Float64, &[1, 1, 2, 4]);
    let got = case.run()[0].to_f64_vec();
    assert_eq!(got, vec![3.0, 0.0, 5.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
}
