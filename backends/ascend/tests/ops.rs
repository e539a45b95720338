//! Each aclnn lowering against the CPU backend: per op a small graph (random weights, every
//! result an output), run on the emulated Ascend device and on the CPU, compared to 1e-5 and
//! required to have run on the device (not the host fallback). The table covers every op
//! `ops::has_kernel` says is lowered.

mod common;

use shardc_backend_ascend::{ops, AscendExecutor};
use shardc_backend_cpu::CpuBackend;
use shardc_compiler::builder::{GraphBuilder, Value};
use shardc_ir::{Attr, Attrs, Const, DType, Init, OpKind, Operand};
use shardc_runtime::{Executor, Tensor};
use std::collections::BTreeSet;
use std::sync::Arc;

/// Builds a case's graph: its results.
type Build = Box<dyn Fn(&mut GraphBuilder) -> Vec<Value>>;

/// One case: its name, the ops it must run on the device, the graph, and its feeds.
struct Case {
    name: &'static str,
    ops: Vec<OpKind>,
    build: Build,
    feeds: Vec<(&'static str, Tensor)>,
}

fn w(b: &mut GraphBuilder, name: &str, shape: &[usize], seed: u64) -> Value {
    b.weight(
        name,
        DType::Float32,
        shape,
        Init::Normal {
            sigma: 1.0,
            mean: 0.0,
            seed,
        },
    )
    .expect("weight")
}

fn op(b: &mut GraphBuilder, kind: OpKind, inputs: &[Operand], attrs: Attrs) -> Value {
    b.op(kind, inputs, attrs)
        .unwrap_or_else(|e| panic!("{kind}: {e}"))
}

fn ints(v: &[i64]) -> Operand {
    Operand::Const(Const::Ints(v.to_vec()))
}

fn float(v: f64) -> Operand {
    Operand::Const(Const::Float(v))
}

fn no() -> Attrs {
    Attrs::new()
}

fn case(
    name: &'static str,
    ops: &[OpKind],
    build: impl Fn(&mut GraphBuilder) -> Vec<Value> + 'static,
) -> Case {
    Case {
        name,
        ops: ops.to_vec(),
        build: Box::new(build),
        feeds: Vec::new(),
    }
}

fn run(c: &Case) -> String {
    let mut b = GraphBuilder::new(c.name);
    let outs = (c.build)(&mut b);
    let g = b
        .finish(&outs)
        .unwrap_or_else(|e| panic!("{}: {e}", c.name));
    let host = Arc::new(CpuBackend::with_threads(1));
    let mut cpu = Executor::new(g.clone(), host.clone()).expect("cpu executor");
    let mut asc = AscendExecutor::new(g.clone(), common::device(0), host)
        .unwrap_or_else(|e| panic!("{}: {e}", c.name));
    let feeds: Vec<(&str, Tensor)> = c.feeds.iter().map(|(n, t)| (*n, t.clone())).collect();
    for step in 0..2 {
        let want = cpu
            .step(&feeds)
            .unwrap_or_else(|e| panic!("{}: cpu: {e}", c.name));
        let got = asc
            .step(&feeds)
            .unwrap_or_else(|e| panic!("{}: ascend step {step}: {e}", c.name));
        for (i, (x, y)) in want.iter().zip(&got).enumerate() {
            if let Err(e) = common::close(x, y, 1e-5) {
                panic!("{}: step {step}, output {i}: {e}", c.name);
            }
        }
    }
    let s = asc.stats().summary();
    for o in &c.ops {
        assert!(
            !asc.stats().host_ops.contains_key(&o.to_string()),
            "{}: {o} ran on the host: {s}",
            c.name
        );
    }
    s
}

fn cases() -> Vec<Case> {
    use OpKind::*;
    let mut v = vec![
        case("matmul", &[MatMul], |b| {
            let x = w(b, "x", &[3, 5], 1);
            let y = w(b, "y", &[5, 4], 2);
            let yt = w(b, "yt", &[4, 5], 3);
            let xt = w(b, "xt", &[5, 3], 4);
            let t = |a: bool, c: bool| {
                Attrs::new()
                    .with("transpose_a", Attr::Bool(a))
                    .with("transpose_b", Attr::Bool(c))
            };
            vec![
                op(b, MatMul, &[x.into(), y.into()], t(false, false)),
                op(b, MatMul, &[x.into(), yt.into()], t(false, true)),
                op(b, MatMul, &[xt.into(), y.into()], t(true, false)),
                op(b, MatMul, &[xt.into(), yt.into()], t(true, true)),
            ]
        }),
        case("batch_matmul", &[BatchMatMul], |b| {
            let x = w(b, "x", &[2, 3, 3, 5], 1);
            let y = w(b, "y", &[2, 3, 5, 4], 2);
            let y1 = w(b, "y1", &[5, 4], 3);
            let yt = w(b, "yt", &[2, 3, 4, 5], 4);
            vec![
                op(b, BatchMatMul, &[x.into(), y.into()], no()),
                op(b, BatchMatMul, &[x.into(), y1.into()], no()),
                op(
                    b,
                    BatchMatMul,
                    &[x.into(), yt.into()],
                    Attrs::new().with("transpose_b", Attr::Bool(true)),
                ),
            ]
        }),
        case("arithmetic", &[Add, Sub, Mul, RealDiv], |b| {
            let x = w(b, "x", &[4, 6], 1);
            let y = w(b, "y", &[4, 6], 2);
            let r = w(b, "r", &[6], 3);
            let c = w(b, "c", &[4, 1], 4);
            let mut out = Vec::new();
            for k in [Add, Sub, Mul, RealDiv] {
                out.push(op(b, k, &[x.into(), y.into()], no()));
                out.push(op(b, k, &[x.into(), r.into()], no()));
                out.push(op(b, k, &[c.into(), r.into()], no()));
                out.push(op(b, k, &[x.into(), float(0.5)], no()));
                out.push(op(b, k, &[float(3.0), x.into()], no()));
            }
            out
        }),
        case(
            "unary",
            &[
                Neg, Square, Sqrt, Exp, Log, ReLU, GeLU, Sigmoid, Tanh, SiLU, Erf,
            ],
            |b| {
                let x = w(b, "x", &[3, 7], 1);
                let e = op(b, Exp, &[x.into()], no());
                let mut out = vec![e];
                for k in [Neg, Square, ReLU, GeLU, Sigmoid, Tanh, SiLU, Erf] {
                    out.push(op(b, k, &[x.into()], no()));
                }
                out.push(op(b, Sqrt, &[e.into()], no()));
                out.push(op(b, Log, &[e.into()], no()));
                out
            },
        ),
        case(
            "elementwise_gradients",
            &[
                ReluGrad,
                SigmoidGrad,
                TanhGrad,
                SqrtGrad,
                GeLUGrad,
                SiLUGrad,
                DropoutGrad,
            ],
            |b| {
                let x = w(b, "x", &[3, 7], 1);
                let dy = w(b, "dy", &[3, 7], 2);
                let relu = op(b, ReLU, &[x.into()], no());
                let sig = op(b, Sigmoid, &[x.into()], no());
                let th = op(b, Tanh, &[x.into()], no());
                let e = op(b, Exp, &[x.into()], no());
                let sq = op(b, Sqrt, &[e.into()], no());
                let ge = op(b, GeLU, &[x.into()], no());
                vec![
                    op(b, ReluGrad, &[dy.into(), relu.into()], no()),
                    op(b, SigmoidGrad, &[sig.into(), dy.into()], no()),
                    op(b, TanhGrad, &[th.into(), dy.into()], no()),
                    op(b, SqrtGrad, &[sq.into(), dy.into()], no()),
                    op(b, GeLUGrad, &[dy.into(), x.into(), ge.into()], no()),
                    op(b, SiLUGrad, &[dy.into(), x.into()], no()),
                    op(b, DropoutGrad, &[dy.into(), x.into()], no()),
                ]
            },
        ),
        case("bias_add", &[BiasAdd, BiasAddGrad], |b| {
            let x = w(b, "x", &[4, 3], 1);
            let x4 = w(b, "x4", &[2, 3, 2, 2], 2);
            let bias = w(b, "b", &[3], 3);
            vec![
                op(b, BiasAdd, &[x.into(), bias.into()], no()),
                op(b, BiasAdd, &[x4.into(), bias.into()], no()),
                op(b, BiasAddGrad, &[x.into()], no()),
                op(b, BiasAddGrad, &[x4.into()], no()),
            ]
        }),
        case(
            "cast_equal_fill",
            &[Cast, Equal, ZerosLike, OnesLike],
            |b| {
                let x = w(b, "x", &[3, 4], 1);
                let i = op(
                    b,
                    Cast,
                    &[x.into()],
                    Attrs::new().with("dst_type", Attr::Str("Int32".into())),
                );
                let back = op(
                    b,
                    Cast,
                    &[i.into()],
                    Attrs::new().with("dst_type", Attr::Str("Float32".into())),
                );
                let eq = op(b, Equal, &[back.into(), float(0.0)], no());
                vec![
                    i,
                    back,
                    eq,
                    op(b, ZerosLike, &[x.into()], no()),
                    op(b, OnesLike, &[x.into()], no()),
                ]
            },
        ),
        case(
            "movement",
            &[Reshape, Transpose, BroadcastTo, Concat, Split],
            |b| {
                let x = w(b, "x", &[2, 3, 4], 1);
                let y = w(b, "y", &[2, 1, 4], 2);
                let r = op(b, Reshape, &[x.into(), ints(&[6, 4])], no());
                let sp = op(
                    b,
                    Split,
                    &[x.into()],
                    Attrs::new()
                        .with("axis", Attr::Int(2))
                        .with("output_num", Attr::Int(2)),
                );
                let s0 = b.tuple_get_item(sp, 0).expect("part");
                let s1 = b.tuple_get_item(sp, 1).expect("part");
                vec![
                    r,
                    op(b, Transpose, &[x.into(), ints(&[2, 0, 1])], no()),
                    op(b, BroadcastTo, &[y.into(), ints(&[3, 2, 3, 4])], no()),
                    op(
                        b,
                        Concat,
                        &[x.into(), y.into(), x.into()],
                        Attrs::new().with("axis", Attr::Int(1)),
                    ),
                    s0,
                    s1,
                ]
            },
        ),
        case(
            "sync_batch_norm",
            &[
                BNTrainingReduce,
                BNTrainingUpdate,
                BNTrainingUpdateGrad,
                BNTrainingReduceGrad,
            ],
            |b| {
                let x = w(b, "x", &[4, 3, 2, 2], 1);
                let dy = w(b, "dy", &[4, 3, 2, 2], 2);
                let scale = w(b, "scale", &[3], 3);
                let bias = w(b, "bias", &[3], 4);
                let at = Attrs::new()
                    .with("count", Attr::Int(16))
                    .with("epsilon", Attr::Float(1e-5));
                let red = op(b, BNTrainingReduce, &[x.into()], no());
                let sum = b.tuple_get_item(red, 0).expect("sum");
                let sq = b.tuple_get_item(red, 1).expect("square_sum");
                let up = op(
                    b,
                    BNTrainingUpdate,
                    &[x.into(), sum.into(), sq.into(), scale.into(), bias.into()],
                    at.clone(),
                );
                let mut out = vec![sum, sq];
                for k in 0..5 {
                    out.push(b.tuple_get_item(up, k).expect("update result"));
                }
                let (mean, rstd) = (out[5], out[6]);
                let ug = op(
                    b,
                    BNTrainingUpdateGrad,
                    &[dy.into(), x.into(), mean.into(), rstd.into()],
                    no(),
                );
                let ds = b.tuple_get_item(ug, 0).expect("dscale");
                let db = b.tuple_get_item(ug, 1).expect("dbias");
                let dx = op(
                    b,
                    BNTrainingReduceGrad,
                    &[
                        dy.into(),
                        x.into(),
                        ds.into(),
                        db.into(),
                        scale.into(),
                        mean.into(),
                        rstd.into(),
                    ],
                    at,
                );
                out.extend([ds, db, dx]);
                out
            },
        ),
        case("sgd", &[SGD], |b| {
            let p = w(b, "p", &[3, 4], 1);
            let g = w(b, "g", &[3, 4], 2);
            let acc = w(b, "acc", &[3, 4], 3);
            let ones = b
                .weight("ones", DType::Float32, &[3, 4], Init::Ones)
                .expect("stat");
            let zeros = b
                .weight("zeros", DType::Float32, &[3, 4], Init::Zeros)
                .expect("stat");
            let mixed = w(b, "mixed", &[3, 4], 4);
            let lr = w(b, "lr", &[], 5);
            let mut out = Vec::new();
            let cases: Vec<(Value, f64, Attrs)> = vec![
                (ones, 0.9, Attrs::new().with("dampening", Attr::Float(0.1))),
                (
                    zeros,
                    0.9,
                    Attrs::new()
                        .with("nesterov", Attr::Bool(true))
                        .with("weight_decay", Attr::Float(0.01)),
                ),
                (mixed, 0.5, Attrs::new().with("dampening", Attr::Float(0.3))),
                (ones, 0.0, Attrs::new()),
                (
                    zeros,
                    0.0,
                    Attrs::new().with("weight_decay", Attr::Float(0.1)),
                ),
            ];
            for (stat, m, at) in cases {
                let r = op(
                    b,
                    SGD,
                    &[
                        p.into(),
                        g.into(),
                        lr.into(),
                        acc.into(),
                        float(m),
                        stat.into(),
                    ],
                    at,
                );
                for k in 0..3 {
                    out.push(b.tuple_get_item(r, k).expect("sgd result"));
                }
            }
            out
        }),
        case("strided_slice", &[StridedSlice, StridedSliceGrad], |b| {
            let x = w(b, "x", &[5, 6, 3], 1);
            let a = op(
                b,
                StridedSlice,
                &[x.into(), ints(&[1, -5]), ints(&[5, 6]), ints(&[2, 2])],
                no(),
            );
            let c = op(
                b,
                StridedSlice,
                &[
                    x.into(),
                    ints(&[0, 0, 1]),
                    ints(&[9, 3, 3]),
                    ints(&[1, 1, 1]),
                ],
                no(),
            );
            let ga = op(
                b,
                StridedSliceGrad,
                &[
                    a.into(),
                    ints(&[5, 6, 3]),
                    ints(&[1, -5]),
                    ints(&[5, 6]),
                    ints(&[2, 2]),
                ],
                no(),
            );
            vec![a, c, ga]
        }),
        case("reductions", &[ReduceSum, ReduceMean, ReduceMax], |b| {
            let x = w(b, "x", &[3, 4, 5], 1);
            let mut out = Vec::new();
            for k in [ReduceSum, ReduceMean, ReduceMax] {
                out.push(op(b, k, &[x.into(), ints(&[])], no()));
                out.push(op(b, k, &[x.into(), ints(&[1])], no()));
                out.push(op(
                    b,
                    k,
                    &[x.into(), ints(&[0, -1])],
                    Attrs::new().with("keep_dims", Attr::Bool(true)),
                ));
            }
            out
        }),
        case(
            "softmax",
            &[Softmax, LogSoftmax, SoftmaxGrad, LogSoftmaxGrad],
            |b| {
                let x = w(b, "x", &[3, 4, 5], 1);
                let dy = w(b, "dy", &[3, 4, 5], 2);
                let ax = |a: i64| Attrs::new().with("axis", Attr::Int(a));
                let s = op(b, Softmax, &[x.into()], no());
                let s1 = op(b, Softmax, &[x.into()], ax(1));
                let l = op(b, LogSoftmax, &[x.into()], no());
                vec![
                    s,
                    s1,
                    l,
                    op(b, SoftmaxGrad, &[s.into(), dy.into()], no()),
                    op(b, SoftmaxGrad, &[s1.into(), dy.into()], ax(1)),
                    op(b, LogSoftmaxGrad, &[l.into(), dy.into()], no()),
                ]
            },
        ),
        case("layer_norm", &[LayerNorm, LayerNormGrad], |b| {
            let x = w(b, "x", &[4, 3, 8], 1);
            let g = w(b, "gamma", &[8], 2);
            let beta = w(b, "beta", &[8], 3);
            let dy = w(b, "dy", &[4, 3, 8], 4);
            let at = Attrs::new()
                .with("begin_norm_axis", Attr::Int(-1))
                .with("begin_params_axis", Attr::Int(-1))
                .with("epsilon", Attr::Float(1e-5));
            let ln = op(b, LayerNorm, &[x.into(), g.into(), beta.into()], at.clone());
            let y = b.tuple_get_item(ln, 0).expect("y");
            let mean = b.tuple_get_item(ln, 1).expect("mean");
            let rstd = b.tuple_get_item(ln, 2).expect("rstd");
            let grad = op(
                b,
                LayerNormGrad,
                &[x.into(), dy.into(), rstd.into(), mean.into(), g.into()],
                at,
            );
            let dx = b.tuple_get_item(grad, 0).expect("dx");
            let dg = b.tuple_get_item(grad, 1).expect("dgamma");
            let db = b.tuple_get_item(grad, 2).expect("dbeta");
            vec![y, mean, rstd, dx, dg, db]
        }),
        case("softmax_ce", &[SoftmaxCrossEntropyWithLogits], |b| {
            let x = w(b, "x", &[4, 5], 1);
            let l = w(b, "l", &[4, 5], 2);
            let p = op(b, Softmax, &[l.into()], no());
            let ce = op(
                b,
                SoftmaxCrossEntropyWithLogits,
                &[x.into(), p.into()],
                no(),
            );
            vec![
                b.tuple_get_item(ce, 0).expect("loss"),
                b.tuple_get_item(ce, 1).expect("backprop"),
            ]
        }),
        case(
            "optimizers",
            &[ApplyMomentum, ApplyGradientDescent, Adam],
            |b| {
                let var = w(b, "var", &[3, 4], 1);
                let acc = w(b, "acc", &[3, 4], 2);
                let m = w(b, "m", &[3, 4], 3);
                let vv = b
                    .weight(
                        "v",
                        DType::Float32,
                        &[3, 4],
                        Init::Uniform {
                            scale: 1.0,
                            seed: 4,
                        },
                    )
                    .expect("v");
                let v2 = op(b, Square, &[vv.into()], no());
                let g = w(b, "g", &[3, 4], 5);
                let lr = w(b, "lr", &[], 6);
                let mom = op(
                    b,
                    ApplyMomentum,
                    &[var.into(), acc.into(), float(0.05), g.into(), float(0.9)],
                    no(),
                );
                let nest = op(
                    b,
                    ApplyMomentum,
                    &[var.into(), acc.into(), lr.into(), g.into(), float(0.9)],
                    Attrs::new().with("use_nesterov", Attr::Bool(true)),
                );
                let gd = op(
                    b,
                    ApplyGradientDescent,
                    &[var.into(), float(0.1), g.into()],
                    no(),
                );
                let adam_in = |b: &mut GraphBuilder| -> Vec<Operand> {
                    let _ = b;
                    vec![
                        var.into(),
                        m.into(),
                        v2.into(),
                        float(0.81),
                        float(0.998),
                        float(0.01),
                        float(0.9),
                        float(0.999),
                        float(1e-8),
                        g.into(),
                    ]
                };
                let a_in = adam_in(b);
                let adam = op(b, Adam, &a_in, no());
                let adam_n = op(
                    b,
                    Adam,
                    &a_in,
                    Attrs::new().with("use_nesterov", Attr::Bool(true)),
                );
                let mut out = Vec::new();
                for t in [mom, nest] {
                    out.push(b.tuple_get_item(t, 0).expect("var'"));
                    out.push(b.tuple_get_item(t, 1).expect("acc'"));
                }
                out.push(gd);
                for t in [adam, adam_n] {
                    for k in 0..3 {
                        out.push(b.tuple_get_item(t, k).expect("adam result"));
                    }
                }
                out
            },
        ),
        case(
            "convolution",
            &[Conv2D, Conv2DBackpropInput, Conv2DBackpropFilter],
            |b| {
                let x = w(b, "x", &[2, 4, 7, 7], 1);
                let k = w(b, "k", &[6, 4, 3, 3], 2);
                let kg = w(b, "kg", &[6, 2, 3, 3], 3);
                let modes: Vec<(Attrs, Value)> = vec![
                    (Attrs::new().with("pad_mode", Attr::Str("valid".into())), k),
                    (
                        Attrs::new()
                            .with("pad_mode", Attr::Str("pad".into()))
                            .with("pad", Attr::ints(&[1, 1, 1, 1]))
                            .with("stride", Attr::Int(2)),
                        k,
                    ),
                    (Attrs::new().with("pad_mode", Attr::Str("same".into())), k),
                    (
                        Attrs::new()
                            .with("pad_mode", Attr::Str("valid".into()))
                            .with("dilation", Attr::Int(2)),
                        k,
                    ),
                    (
                        Attrs::new()
                            .with("pad_mode", Attr::Str("same".into()))
                            .with("group", Attr::Int(2)),
                        kg,
                    ),
                    (
                        Attrs::new()
                            .with("pad_mode", Attr::Str("same".into()))
                            .with("stride", Attr::Int(2)),
                        k,
                    ),
                ];
                let mut out = Vec::new();
                for (i, (at, kk)) in modes.into_iter().enumerate() {
                    let y = op(b, Conv2D, &[x.into(), kk.into()], at.clone());
                    let dy = op(b, Mul, &[y.into(), float(0.05 * (i + 1) as f64)], no());
                    let kshape = if i == 4 { [6, 2, 3, 3] } else { [6, 4, 3, 3] };
                    out.push(y);
                    out.push(op(
                        b,
                        Conv2DBackpropInput,
                        &[dy.into(), kk.into(), ints(&[2, 4, 7, 7])],
                        at.clone(),
                    ));
                    out.push(op(
                        b,
                        Conv2DBackpropFilter,
                        &[dy.into(), x.into(), ints(&kshape.map(|d| d as i64))],
                        at,
                    ));
                }
                out
            },
        ),
        case(
            "pooling",
            &[MaxPool, AvgPool, MaxPoolGrad, AvgPoolGrad],
            |b| {
                let x = w(b, "x", &[2, 3, 6, 6], 1);
                let mut out = Vec::new();
                for (kind, grad) in [(MaxPool, MaxPoolGrad), (AvgPool, AvgPoolGrad)] {
                    for (k, s, mode) in [(2, 2, "valid"), (3, 1, "same"), (3, 2, "valid")] {
                        let at = Attrs::new()
                            .with("kernel_size", Attr::Int(k))
                            .with("strides", Attr::Int(s))
                            .with("pad_mode", Attr::Str(mode.into()));
                        let y = op(b, kind, &[x.into()], at.clone());
                        let dy = op(b, Mul, &[y.into(), float(1.5)], no());
                        out.push(y);
                        out.push(op(b, grad, &[x.into(), y.into(), dy.into()], at));
                    }
                }
                out
            },
        ),
        case("batch_norm", &[BatchNorm, BatchNormGrad], |b| {
            let x = w(b, "x", &[4, 3, 2, 2], 1);
            let x2 = w(b, "x2", &[6, 3], 2);
            let dy = w(b, "dy", &[4, 3, 2, 2], 3);
            let scale = w(b, "scale", &[3], 4);
            let bias = w(b, "bias", &[3], 5);
            let mean = w(b, "mean", &[3], 6);
            let var = b
                .weight("var", DType::Float32, &[3], Init::Ones)
                .expect("var");
            let at = Attrs::new()
                .with("is_training", Attr::Bool(true))
                .with("epsilon", Attr::Float(1e-5));
            let bn = op(
                b,
                BatchNorm,
                &[x.into(), scale.into(), bias.into(), mean.into(), var.into()],
                at.clone(),
            );
            let bn2 = op(
                b,
                BatchNorm,
                &[
                    x2.into(),
                    scale.into(),
                    bias.into(),
                    mean.into(),
                    var.into(),
                ],
                at.clone(),
            );
            let mut out = Vec::new();
            for k in 0..5 {
                out.push(b.tuple_get_item(bn, k).expect("bn result"));
                out.push(b.tuple_get_item(bn2, k).expect("bn result"));
            }
            let g = op(
                b,
                BatchNormGrad,
                &[
                    dy.into(),
                    x.into(),
                    scale.into(),
                    out[6].into(),
                    out[8].into(),
                ],
                at,
            );
            for k in 0..3 {
                out.push(b.tuple_get_item(g, k).expect("bn grad"));
            }
            out
        }),
    ];
    // Cases with integer feeds.
    let idx = Tensor::from_i32(vec![5], vec![3, 0, 9, 3, 7]).expect("indices");
    let labels = Tensor::from_i32(vec![4], vec![1, 4, 0, 2]).expect("labels");
    v.push(Case {
        feeds: vec![("idx", idx.clone())],
        ..case("index", &[OneHot, Gather, UnsortedSegmentSum], |b| {
            let idx = b.input("idx", DType::Int32, &[5]).expect("idx");
            let table = w(b, "table", &[10, 3], 1);
            let t2 = w(b, "t2", &[2, 10], 2);
            let rows = w(b, "rows", &[5, 3], 3);
            vec![
                op(
                    b,
                    OneHot,
                    &[
                        idx.into(),
                        Operand::Const(Const::Int(10)),
                        float(1.0),
                        float(0.0),
                    ],
                    no(),
                ),
                op(
                    b,
                    Gather,
                    &[table.into(), idx.into(), Operand::Const(Const::Int(0))],
                    no(),
                ),
                op(
                    b,
                    Gather,
                    &[t2.into(), idx.into(), Operand::Const(Const::Int(1))],
                    no(),
                ),
                op(
                    b,
                    UnsortedSegmentSum,
                    &[rows.into(), idx.into(), Operand::Const(Const::Int(12))],
                    no(),
                ),
            ]
        })
    });
    v.push(Case {
        feeds: vec![("label", labels)],
        ..case(
            "sparse_softmax_ce",
            &[SparseSoftmaxCrossEntropyWithLogits],
            |b| {
                let label = b.input("label", DType::Int32, &[4]).expect("label");
                let x = w(b, "x", &[4, 5], 1);
                vec![
                    op(
                        b,
                        SparseSoftmaxCrossEntropyWithLogits,
                        &[x.into(), label.into()],
                        no(),
                    ),
                    op(
                        b,
                        SparseSoftmaxCrossEntropyWithLogits,
                        &[x.into(), label.into()],
                        Attrs::new().with("is_grad", Attr::Bool(true)),
                    ),
                ]
            },
        )
    });
    v
}

#[test]
fn every_lowered_op_matches_the_cpu() {
    let cases = cases();
    let mut covered = BTreeSet::new();
    let mut failures = Vec::new();
    for c in &cases {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(c))) {
            Ok(s) => {
                println!("{}: {s}", c.name);
                covered.extend(c.ops.iter().copied())
            }
            Err(e) => failures.push(
                e.downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| format!("{}: panicked", c.name)),
            ),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    let untested: Vec<OpKind> = OpKind::ALL
        .iter()
        .copied()
        .filter(|&o| ops::has_kernel(o) && !covered.contains(&o))
        .collect();
    assert!(untested.is_empty(), "lowered but not tested: {untested:?}");
}

#[test]
fn the_fallback_list_and_the_route_agree() {
    for &(op, why) in ops::HOST_FALLBACKS {
        assert!(!ops::has_kernel(op), "{op}");
        assert!(!why.is_empty());
        assert_eq!(ops::host_fallback(op), Some(why));
    }
}

#[test]
fn device_info_lists_the_libraries_found_and_the_devices() {
    common::use_emulator();
    let s = shardc_backend_ascend::device_info();
    for lib in [
        "libascendcl.so",
        "libnnopbase.so",
        "libopapi.so",
        "libhccl.so",
    ] {
        assert!(s.contains(lib) && s.contains("found"), "{s}");
    }
    assert!(s.contains("device(s)") && s.contains("device 0"), "{s}");
    println!("{s}");
    let dev = common::device(1);
    assert!(
        dev.description().contains("device 1"),
        "{}",
        dev.description()
    );
    assert_eq!(dev.id(), 1);
    assert!(shardc_backend_ascend::acl::device_count().expect("count") >= 2);
}
