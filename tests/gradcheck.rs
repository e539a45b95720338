//! Gradient checks: for every differentiable op, the gradients that `autodiff::gradients`
//! builds, run on the CPU executor in Float64, equal central finite differences of the loss.
//!
//! Each case is a small graph `op -> ReduceSum(Mul(out, c))` where `c` is a fixed random data
//! input (so gradients are not uniform) and every float operand of the op is a trainable
//! weight with fixed random values. Also: a quickstart-like net trained for 20 steps with each
//! optimizer has a falling loss.

use shardc::cpu::CpuBackend;
use shardc::ir::{
    Attr, Attrs, Const, DType, Graph, Init, Node, OpKind, Operand, Param, ParamKind, TensorType,
};
use shardc::passes::autodiff::{gradients, training_graph, Optimizer};
use shardc::passes::infer::infer_node;
use shardc::passes::verify::verify;
use shardc::runtime::executor::Executor;
use shardc::runtime::{Backend, Tensor};
use std::sync::Arc;

/// splitmix64: fixed pseudo-random numbers without a dependency.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
    }
}

/// A small Float64 graph under construction, with the values of its weights and feeds.
struct Net {
    g: Graph,
    values: Vec<(String, Tensor)>,
    feeds: Vec<(String, Tensor)>,
    rng: Rng,
}

fn ty(shape: &[usize]) -> TensorType {
    TensorType::new(DType::Float64, shape.to_vec())
}

fn ints(v: &[i64]) -> Operand {
    Operand::Const(Const::Ints(v.to_vec()))
}

impl Net {
    fn new(seed: u64) -> Net {
        Net {
            g: Graph::new("Check"),
            values: Vec::new(),
            feeds: Vec::new(),
            rng: Rng(seed),
        }
    }

    fn add_weight(
        &mut self,
        name: &str,
        shape: &[usize],
        requires_grad: bool,
        v: Vec<f64>,
    ) -> Operand {
        let p = self.g.add_param(Param {
            name: name.into(),
            ty: ty(shape),
            kind: ParamKind::Weight {
                init: Init::Zeros,
                requires_grad,
            },
        });
        self.values
            .push((name.into(), Tensor::from_f64(shape.to_vec(), v).unwrap()));
        Operand::Param(p)
    }

    /// A trainable weight with values `f(u)`, `u` uniform in [-1, 1).
    fn w_with(&mut self, name: &str, shape: &[usize], f: impl Fn(f64) -> f64) -> Operand {
        let n: usize = shape.iter().product();
        let v = (0..n).map(|_| f(self.rng.uniform())).collect();
        self.add_weight(name, shape, true, v)
    }

    /// A trainable weight, uniform in [-1, 1).
    fn w(&mut self, name: &str, shape: &[usize]) -> Operand {
        self.w_with(name, shape, |u| u)
    }

    /// A frozen weight (requires_grad false) with the given values.
    fn frozen(&mut self, name: &str, shape: &[usize], v: Vec<f64>) -> Operand {
        self.add_weight(name, shape, false, v)
    }

    /// A fed Int64 data input.
    fn indices(&mut self, name: &str, shape: &[usize], v: Vec<i64>) -> Operand {
        let p = self.g.add_param(Param {
            name: name.into(),
            ty: TensorType::new(DType::Int64, shape.to_vec()),
            kind: ParamKind::Input,
        });
        self.feeds
            .push((name.into(), Tensor::from_i64(shape.to_vec(), v).unwrap()));
        Operand::Param(p)
    }

    /// A fed Float64 data input with random values.
    fn data(&mut self, name: &str, shape: &[usize]) -> Operand {
        let p = self.g.add_param(Param {
            name: name.into(),
            ty: ty(shape),
            kind: ParamKind::Input,
        });
        let n: usize = shape.iter().product();
        let v = (0..n).map(|_| self.rng.uniform()).collect();
        self.feeds
            .push((name.into(), Tensor::from_f64(shape.to_vec(), v).unwrap()));
        Operand::Param(p)
    }

    fn op(&mut self, op: OpKind, inputs: Vec<Operand>, attrs: Attrs) -> Operand {
        let mut n = Node::new(op, inputs);
        n.attrs = attrs;
        n.instance = format!("{}{}", op.name().to_lowercase(), self.g.nodes.len());
        n.scope = "Default/network".into();
        n.ty = infer_node(&self.g, &n).unwrap_or_else(|e| panic!("test graph: {e}"));
        Operand::Node(self.g.push_node(n))
    }

    fn item(&mut self, t: Operand, k: i64) -> Operand {
        self.op(
            OpKind::TupleGetItem,
            vec![t, Operand::Const(Const::Int(k))],
            Attrs::new(),
        )
    }

    /// loss = ReduceSum(Mul(out, c)) over all axes, c a fixed random input of out's shape.
    fn finish(mut self, out: Operand) -> Case {
        let shape = self.g.operand_tensor_type(&out).unwrap().shape.clone();
        let c = self.data("loss_weight", &shape);
        let m = self.op(OpKind::Mul, vec![out, c], Attrs::new());
        let l = self.op(OpKind::ReduceSum, vec![m, ints(&[])], Attrs::new());
        self.g.outputs = vec![l];
        Case {
            g: self.g,
            values: self.values,
            feeds: self.feeds,
            eps: 1e-6,
            tol: 1e-6,
        }
    }
}

struct Case {
    g: Graph,
    values: Vec<(String, Tensor)>,
    feeds: Vec<(String, Tensor)>,
    eps: f64,
    tol: f64,
}

fn backend() -> Arc<dyn Backend> {
    Arc::new(CpuBackend::with_threads(1))
}

/// Runs one step at step number 0 (so Dropout masks are the same every time) and returns the
/// outputs.
fn run(ex: &mut Executor, feeds: &[(String, Tensor)]) -> Vec<Tensor> {
    let feeds: Vec<(&str, Tensor)> = feeds.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
    ex.set_step_count(0);
    ex.step(&feeds).unwrap_or_else(|e| panic!("step: {e}"))
}

impl Case {
    fn tol(mut self, eps: f64, tol: f64) -> Case {
        self.eps = eps;
        self.tol = tol;
        self
    }

    /// Compares the analytic gradients with central differences, for every trainable weight.
    fn check(self, what: &str) {
        verify(&self.g).unwrap_or_else(|e| panic!("{what}: forward graph: {e}"));
        let (mut bg, grads) = gradients(&self.g).unwrap_or_else(|e| panic!("{what}: {e}"));
        verify(&bg).unwrap_or_else(|e| panic!("{what}: gradient graph: {e}"));
        let trainable: Vec<_> = self
            .g
            .params
            .iter()
            .filter(|p| p.requires_grad())
            .map(|p| p.name.clone())
            .collect();
        let names: Vec<String> = grads
            .iter()
            .map(|(p, _)| self.g.param(*p).name.clone())
            .collect();
        assert_eq!(names, trainable, "{what}: every weight gets a gradient");
        bg.outputs.extend(grads.iter().map(|(_, g)| g.clone()));

        let mut ex = Executor::new(bg, backend()).unwrap_or_else(|e| panic!("{what}: {e}"));
        for (n, v) in &self.values {
            ex.set_param(n, v.clone()).unwrap();
        }
        let outs = run(&mut ex, &self.feeds);

        let mut fwd = Executor::new(self.g.clone(), backend()).unwrap();
        for (n, v) in &self.values {
            fwd.set_param(n, v.clone()).unwrap();
        }
        let loss0 = run(&mut fwd, &self.feeds)[0].to_f64_vec()[0];
        let analytic_loss = outs[0].to_f64_vec()[0];
        assert!(
            (loss0 - analytic_loss).abs() <= 1e-12 * loss0.abs().max(1.0),
            "{what}: the gradient graph changes the loss ({analytic_loss} vs {loss0})"
        );

        for (k, name) in names.iter().enumerate() {
            let analytic = outs[k + 1].to_f64_vec();
            let base = self
                .values
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, t)| t.clone())
                .unwrap();
            assert_eq!(
                analytic.len(),
                base.len(),
                "{what}: gradient of {name} has the weight's size"
            );
            for (i, &a) in analytic.iter().enumerate() {
                let mut at = |delta: f64| {
                    let mut t = base.clone();
                    t.as_f64_mut().unwrap()[i] += delta;
                    fwd.set_param(name, t).unwrap();
                    run(&mut fwd, &self.feeds)[0].to_f64_vec()[0]
                };
                let numeric = (at(self.eps) - at(-self.eps)) / (2.0 * self.eps);
                let err = (a - numeric).abs() / a.abs().max(numeric.abs()).max(1.0);
                assert!(
                    err <= self.tol,
                    "{what}: d loss / d {name}[{i}]: autodiff {a}, finite differences {numeric} (error {err:.2e} > {:.0e})",
                    self.tol
                );
            }
            fwd.set_param(name, base).unwrap();
        }
    }
}

fn attrs(kv: &[(&str, Attr)]) -> Attrs {
    let mut a = Attrs::new();
    for (k, v) in kv {
        a.set(*k, v.clone());
    }
    a
}

fn b(v: bool) -> Attr {
    Attr::Bool(v)
}

fn i(v: i64) -> Attr {
    Attr::Int(v)
}

fn s(v: &str) -> Attr {
    Attr::Str(v.into())
}

// ---------------------------------------------------------------------------------------------
// Contractions
// ---------------------------------------------------------------------------------------------

#[test]
fn matmul_all_transposes() {
    for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
        let mut n = Net::new(1);
        let a = n.w("a", if ta { &[4, 3] } else { &[3, 4] });
        let bw = n.w("b", if tb { &[5, 4] } else { &[4, 5] });
        let y = n.op(
            OpKind::MatMul,
            vec![a, bw],
            attrs(&[("transpose_a", b(ta)), ("transpose_b", b(tb))]),
        );
        n.finish(y).check(&format!("MatMul ta={ta} tb={tb}"));
    }
}

#[test]
fn batch_matmul_transposes_and_broadcast_batch() {
    // (2, 3, 4) x (4, 5): b is broadcast over the batch.
    let mut n = Net::new(2);
    let a = n.w("a", &[2, 3, 4]);
    let bw = n.w("b", &[4, 5]);
    let y = n.op(OpKind::BatchMatMul, vec![a, bw], Attrs::new());
    n.finish(y).check("BatchMatMul broadcast b");
    // (2, 1, 4, 3)^T x (3, 5, 4)^T: batch dims (2, 1) and (3) broadcast to (2, 3).
    let mut n = Net::new(3);
    let a = n.w("a", &[2, 1, 4, 3]);
    let bw = n.w("b", &[3, 5, 4]);
    let y = n.op(
        OpKind::BatchMatMul,
        vec![a, bw],
        attrs(&[("transpose_a", b(true)), ("transpose_b", b(true))]),
    );
    n.finish(y).check("BatchMatMul transposes, broadcast both");
    let mut n = Net::new(4);
    let a = n.w("a", &[2, 3, 4]);
    let bw = n.w("b", &[2, 3, 5]);
    let y = n.op(
        OpKind::BatchMatMul,
        vec![a, bw],
        attrs(&[("transpose_a", b(true))]),
    );
    n.finish(y).check("BatchMatMul transpose_a");
}

#[test]
fn conv2d_stride_pad_dilation_same_group() {
    type ConvCase = (
        &'static str,
        [usize; 4],
        [usize; 4],
        Vec<(&'static str, Attr)>,
    );
    let cases: Vec<ConvCase> = vec![
        ("valid", [2, 2, 5, 5], [3, 2, 3, 3], vec![]),
        (
            "stride 2, pad (1, 0, 1, 2)",
            [1, 2, 6, 5],
            [2, 2, 3, 2],
            vec![
                ("stride", i(2)),
                ("pad_mode", s("pad")),
                ("pad", Attr::ints(&[1, 0, 1, 2])),
            ],
        ),
        (
            "dilation 2",
            [1, 1, 6, 6],
            [2, 1, 2, 3],
            vec![("dilation", i(2))],
        ),
        (
            "same, stride 2",
            [1, 2, 5, 6],
            [2, 2, 3, 3],
            vec![("pad_mode", s("same")), ("stride", Attr::ints(&[2, 2]))],
        ),
        ("group 2", [1, 4, 4, 4], [4, 2, 2, 2], vec![("group", i(2))]),
    ];
    for (k, (what, xs, ws, extra)) in cases.into_iter().enumerate() {
        let mut n = Net::new(10 + k as u64);
        let x = n.w("x", &xs);
        let w = n.w("w", &ws);
        let mut a = attrs(&[
            ("out_channel", i(ws[0] as i64)),
            ("kernel_size", Attr::ints(&[ws[2] as i64, ws[3] as i64])),
        ]);
        for (key, v) in extra {
            a.set(key, v);
        }
        let y = n.op(OpKind::Conv2D, vec![x, w], a);
        n.finish(y).check(&format!("Conv2D {what}"));
    }
}

// ---------------------------------------------------------------------------------------------
// Elementwise
// ---------------------------------------------------------------------------------------------

#[test]
fn bias_add() {
    let mut n = Net::new(20);
    let x = n.w("x", &[2, 3, 2, 2]);
    let bias = n.w("b", &[3]);
    let y = n.op(OpKind::BiasAdd, vec![x, bias], Attrs::new());
    n.finish(y).check("BiasAdd NCHW");
    let mut n = Net::new(21);
    let x = n.w("x", &[4, 3]);
    let bias = n.w("b", &[3]);
    let y = n.op(OpKind::BiasAdd, vec![x, bias], Attrs::new());
    n.finish(y).check("BiasAdd (N, C)");
}

#[test]
fn binary_ops_with_broadcasting() {
    let shapes: [(&[usize], &[usize]); 4] = [
        (&[3, 4], &[3, 4]),
        (&[3, 4], &[4]),
        (&[3, 1], &[1, 4]),
        (&[2, 1, 4], &[3, 1]),
    ];
    for op in [OpKind::Add, OpKind::Sub, OpKind::Mul, OpKind::RealDiv] {
        for (k, (sa, sb)) in shapes.iter().enumerate() {
            let mut n = Net::new(30 + k as u64);
            let a = n.w("a", sa);
            // Divisors away from zero.
            let bw = n.w_with("b", sb, |u| 1.0 + 0.5 * u);
            let y = n.op(op, vec![a, bw], Attrs::new());
            n.finish(y).check(&format!("{op} {sa:?} with {sb:?}"));
        }
    }
}

#[test]
fn binary_ops_with_a_constant() {
    for op in [OpKind::Add, OpKind::Sub, OpKind::Mul, OpKind::RealDiv] {
        let mut n = Net::new(40);
        let a = n.w_with("a", &[3, 2], |u| 1.0 + 0.5 * u);
        let y = n.op(
            op,
            vec![a.clone(), Operand::Const(Const::Float(2.5))],
            Attrs::new(),
        );
        n.finish(y).check(&format!("{op}(w, 2.5)"));
        let mut n = Net::new(41);
        let a = n.w_with("a", &[3, 2], |u| 1.0 + 0.5 * u);
        let y = n.op(op, vec![Operand::Const(Const::Float(2.5)), a], Attrs::new());
        n.finish(y).check(&format!("{op}(2.5, w)"));
    }
}

#[test]
fn unary_ops() {
    use OpKind::*;
    for op in [
        Neg, Square, Sqrt, Exp, Log, ReLU, GeLU, Sigmoid, SiLU, Tanh, Erf,
    ] {
        let mut n = Net::new(50);
        let x = if matches!(op, Sqrt | Log) {
            n.w_with("x", &[3, 4], |u| 1.0 + 0.8 * u)
        } else {
            n.w_with("x", &[3, 4], |u| 2.0 * u)
        };
        let y = n.op(op, vec![x], Attrs::new());
        n.finish(y).check(&format!("{op}"));
    }
}

#[test]
fn cast_round_trip() {
    // f64 -> f32 -> Square -> f64: the f32 part needs a larger step and tolerance.
    let mut n = Net::new(60);
    let x = n.w("x", &[2, 3]);
    let c = n.op(OpKind::Cast, vec![x], attrs(&[("dst_type", s("Float32"))]));
    let sq = n.op(OpKind::Square, vec![c], Attrs::new());
    let y = n.op(OpKind::Cast, vec![sq], attrs(&[("dst_type", s("Float64"))]));
    n.finish(y).tol(1e-2, 1e-4).check("Cast");
}

#[test]
fn dropout_with_a_fixed_mask() {
    let mut n = Net::new(70);
    let x = n.w("x", &[4, 5]);
    let d = n.op(
        OpKind::Dropout,
        vec![x],
        attrs(&[
            ("keep_prob", Attr::Float(0.6)),
            ("seed0", i(3)),
            ("seed1", i(4)),
        ]),
    );
    let y = n.item(d, 0);
    n.finish(y).check("Dropout");
}

// ---------------------------------------------------------------------------------------------
// Reductions and normalisations
// ---------------------------------------------------------------------------------------------

#[test]
fn reductions_axes_and_keep_dims() {
    let axes: [&[i64]; 4] = [&[1], &[0, 2], &[-1], &[]];
    for op in [OpKind::ReduceSum, OpKind::ReduceMean, OpKind::ReduceMax] {
        for (k, ax) in axes.iter().enumerate() {
            for keep in [false, true] {
                let mut n = Net::new(80 + k as u64);
                let x = n.w("x", &[2, 3, 4]);
                let y = n.op(op, vec![x, ints(ax)], attrs(&[("keep_dims", b(keep))]));
                n.finish(y)
                    .check(&format!("{op} axes {ax:?} keep_dims {keep}"));
            }
        }
    }
}

#[test]
fn reduce_max_splits_ties_evenly() {
    // Two equal maxima in each row: each gets half of the gradient.
    let mut n = Net::new(90);
    let x = n.add_weight("x", &[2, 3], true, vec![1.0, 3.0, 3.0, -2.0, 0.5, 0.5]);
    let y = n.op(OpKind::ReduceMax, vec![x, ints(&[1])], Attrs::new());
    let mut case = n.finish(y);
    case.feeds = vec![(
        "loss_weight".into(),
        Tensor::from_f64(vec![2], vec![1.0, 1.0]).unwrap(),
    )];
    let (mut bg, grads) = gradients(&case.g).unwrap();
    bg.outputs.push(grads[0].1.clone());
    let mut ex = Executor::new(bg, backend()).unwrap();
    ex.set_param("x", case.values[0].1.clone()).unwrap();
    let out = run(&mut ex, &case.feeds);
    assert_eq!(out[1].to_f64_vec(), vec![0.0, 0.5, 0.5, 0.0, 0.5, 0.5]);
}

#[test]
fn softmax_and_log_softmax_axes() {
    for op in [OpKind::Softmax, OpKind::LogSoftmax] {
        for axis in [Attr::Int(-1), Attr::Int(0), Attr::ints(&[1])] {
            let mut n = Net::new(100);
            let x = n.w_with("x", &[2, 3, 4], |u| 2.0 * u);
            let y = n.op(op, vec![x], attrs(&[("axis", axis.clone())]));
            n.finish(y).check(&format!("{op} axis {axis:?}"));
        }
    }
}

#[test]
fn batch_norm_training_and_inference() {
    for training in [true, false] {
        let mut n = Net::new(110);
        let x = n.w("x", &[2, 3, 2, 2]);
        let scale = n.w_with("scale", &[3], |u| 1.0 + 0.5 * u);
        let bias = n.w("bias", &[3]);
        let (mean, var) = if training {
            (
                n.frozen("mean", &[3], vec![0.0; 3]),
                n.frozen("variance", &[3], vec![1.0; 3]),
            )
        } else {
            // In inference mode y depends on the statistics: make them trainable too.
            let m = n.w("mean", &[3]);
            let v = n.w_with("variance", &[3], |u| 1.0 + 0.5 * u);
            (m, v)
        };
        let bn = n.op(
            OpKind::BatchNorm,
            vec![x, scale, bias, mean, var],
            attrs(&[("is_training", b(training)), ("epsilon", Attr::Float(1e-5))]),
        );
        let y = n.item(bn, 0);
        n.finish(y)
            .check(&format!("BatchNorm is_training {training}"));
    }
}

#[test]
fn layer_norm_axes() {
    for (bna, bpa, ps) in [
        (-1i64, -1i64, vec![4usize]),
        (1, 1, vec![3, 4]),
        (1, -1, vec![4]),
    ] {
        let mut n = Net::new(120);
        let x = n.w("x", &[2, 3, 4]);
        let gamma = n.w_with("gamma", &ps, |u| 1.0 + 0.5 * u);
        let beta = n.w("beta", &ps);
        let ln = n.op(
            OpKind::LayerNorm,
            vec![x, gamma, beta],
            attrs(&[
                ("begin_norm_axis", i(bna)),
                ("begin_params_axis", i(bpa)),
                ("epsilon", Attr::Float(1e-7)),
            ]),
        );
        let y = n.item(ln, 0);
        n.finish(y).check(&format!(
            "LayerNorm begin_norm_axis {bna} begin_params_axis {bpa}"
        ));
    }
}

#[test]
fn pools_same_and_valid() {
    for op in [OpKind::MaxPool, OpKind::AvgPool] {
        for (mode, k, st) in [
            ("valid", 2, 2),
            ("valid", 3, 1),
            ("same", 3, 2),
            ("same", 2, 1),
        ] {
            let mut n = Net::new(130);
            let x = n.w("x", &[1, 2, 5, 5]);
            let y = n.op(
                op,
                vec![x],
                attrs(&[
                    ("kernel_size", i(k)),
                    ("strides", i(st)),
                    ("pad_mode", s(mode)),
                ]),
            );
            n.finish(y)
                .check(&format!("{op} {mode} kernel {k} stride {st}"));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Movement
// ---------------------------------------------------------------------------------------------

#[test]
fn reshape_transpose_broadcast_to() {
    let mut n = Net::new(140);
    let x = n.w("x", &[2, 6]);
    let y = n.op(OpKind::Reshape, vec![x, ints(&[3, -1, 2])], Attrs::new());
    n.finish(y).check("Reshape");
    let mut n = Net::new(141);
    let x = n.w("x", &[2, 3, 4]);
    let y = n.op(OpKind::Transpose, vec![x, ints(&[2, 0, -2])], Attrs::new());
    n.finish(y).check("Transpose");
    let mut n = Net::new(142);
    let x = n.w("x", &[3, 1]);
    let y = n.op(OpKind::BroadcastTo, vec![x, ints(&[2, 3, 4])], Attrs::new());
    n.finish(y).check("BroadcastTo");
}

#[test]
fn gather_axes_and_repeated_indices() {
    let mut n = Net::new(150);
    let p = n.w("params", &[5, 3]);
    let idx = n.indices("indices", &[4], vec![1, 4, 1, 0]);
    let y = n.op(
        OpKind::Gather,
        vec![p, idx, Operand::Const(Const::Int(0))],
        Attrs::new(),
    );
    n.finish(y).check("Gather axis 0");
    let mut n = Net::new(151);
    let p = n.w("params", &[2, 4, 3]);
    let idx = n.indices("indices", &[2, 2], vec![3, 0, 3, 2]);
    let y = n.op(
        OpKind::Gather,
        vec![p, idx, Operand::Const(Const::Int(1))],
        Attrs::new(),
    );
    n.finish(y).check("Gather axis 1, 2-d indices");
    let mut n = Net::new(152);
    let p = n.w("params", &[2, 3, 4]);
    let idx = n.indices("indices", &[3], vec![3, 3, 1]);
    let y = n.op(
        OpKind::Gather,
        vec![p, idx, Operand::Const(Const::Int(-1))],
        Attrs::new(),
    );
    n.finish(y).check("Gather axis -1");
}

#[test]
fn concat_and_split() {
    let mut n = Net::new(160);
    let a = n.w("a", &[2, 1, 3]);
    let bw = n.w("b", &[2, 2, 3]);
    let c = n.w("c", &[2, 3, 3]);
    let y = n.op(OpKind::Concat, vec![a, bw, c], attrs(&[("axis", i(1))]));
    n.finish(y).check("Concat axis 1");
    // Split into 3 along the last axis; use pieces 0 and 2 (piece 1 gets zeros).
    let mut n = Net::new(161);
    let x = n.w("x", &[2, 6]);
    let sp = n.op(
        OpKind::Split,
        vec![x],
        attrs(&[("axis", i(-1)), ("output_num", i(3))]),
    );
    let p0 = n.item(sp.clone(), 0);
    let p2 = n.item(sp, 2);
    let sq = n.op(OpKind::Square, vec![p2], Attrs::new());
    let y = n.op(OpKind::Mul, vec![p0, sq], Attrs::new());
    n.finish(y).check("Split with an unused piece");
}

#[test]
fn strided_slice() {
    let mut n = Net::new(170);
    let x = n.w("x", &[4, 7, 3]);
    let y = n.op(
        OpKind::StridedSlice,
        vec![x, ints(&[1, 0, 0]), ints(&[4, -1, 3]), ints(&[2, 3, 1])],
        Attrs::new(),
    );
    n.finish(y).check("StridedSlice");
}

// ---------------------------------------------------------------------------------------------
// Losses
// ---------------------------------------------------------------------------------------------

#[test]
fn softmax_cross_entropy_dense_and_sparse() {
    let mut n = Net::new(180);
    let logits = n.w_with("logits", &[3, 4], |u| 2.0 * u);
    // Dense labels are probabilities (rows summing to 1), as the op's contract says: then
    // `backprop` is the gradient w.r.t. the logits.
    let raw: Vec<f64> = (0..12).map(|_| 0.5 + 0.4 * n.rng.uniform()).collect();
    let rows: Vec<f64> = raw
        .chunks(4)
        .flat_map(|r| {
            let t: f64 = r.iter().sum();
            r.iter().map(move |v| v / t)
        })
        .collect();
    let labels = n.add_weight("labels", &[3, 4], true, rows);
    let ce = n.op(
        OpKind::SoftmaxCrossEntropyWithLogits,
        vec![logits, labels],
        Attrs::new(),
    );
    let y = n.item(ce, 0);
    n.finish(y).check("SoftmaxCrossEntropyWithLogits");
    let mut n = Net::new(181);
    let logits = n.w_with("logits", &[3, 4], |u| 2.0 * u);
    let labels = n.indices("labels", &[3], vec![2, 0, 3]);
    let y = n.op(
        OpKind::SparseSoftmaxCrossEntropyWithLogits,
        vec![logits, labels],
        Attrs::new(),
    );
    n.finish(y).check("SparseSoftmaxCrossEntropyWithLogits");
}

// ---------------------------------------------------------------------------------------------
// Linear gradient kernels (their own gradients are the forward ops)
// ---------------------------------------------------------------------------------------------

#[test]
fn linear_gradient_kernels() {
    let mut n = Net::new(190);
    let x = n.w("x", &[4, 3]);
    let ids = n.indices("ids", &[4], vec![2, 0, 2, 1]);
    let y = n.op(
        OpKind::UnsortedSegmentSum,
        vec![x, ids, Operand::Const(Const::Int(3))],
        Attrs::new(),
    );
    n.finish(y).check("UnsortedSegmentSum");
    let mut n = Net::new(191);
    let dy = n.w("dy", &[2, 2]);
    let y = n.op(
        OpKind::StridedSliceGrad,
        vec![
            dy,
            ints(&[4, 3]),
            ints(&[1, 0]),
            ints(&[4, 3]),
            ints(&[2, 2]),
        ],
        Attrs::new(),
    );
    n.finish(y).check("StridedSliceGrad");
    let mut n = Net::new(192);
    let dy = n.w("dy", &[3, 4]);
    let mask = n.frozen(
        "mask",
        &[3, 4],
        (0..12).map(|k| f64::from(k % 3 != 0) * 2.0).collect(),
    );
    let y = n.op(OpKind::DropoutGrad, vec![dy, mask], Attrs::new());
    n.finish(y).check("DropoutGrad");
}

// ---------------------------------------------------------------------------------------------
// Composition
// ---------------------------------------------------------------------------------------------

#[test]
fn shared_values_accumulate() {
    // An MLP where a weight and an activation are used twice.
    let mut n = Net::new(200);
    let x = n.data("x", &[4, 3]);
    let w = n.w("w", &[3, 3]);
    let h = n.op(OpKind::MatMul, vec![x, w.clone()], Attrs::new());
    let t = n.op(OpKind::Tanh, vec![h], Attrs::new());
    let u = n.op(OpKind::MatMul, vec![t.clone(), w], Attrs::new());
    let y = n.op(OpKind::Mul, vec![u, t], Attrs::new());
    n.finish(y).check("shared weight and activation");
}

// ---------------------------------------------------------------------------------------------
// Training
// ---------------------------------------------------------------------------------------------

/// The quickstart net (MatMul -> ReLU -> MatMul -> MSE) in Float32 with Xavier weights.
fn quickstart() -> (Graph, Vec<(String, Tensor)>) {
    let mut g = Graph::new("Net");
    let f32t = |shape: &[usize]| TensorType::new(DType::Float32, shape.to_vec());
    let x = g.add_param(Param {
        name: "x".into(),
        ty: f32t(&[16, 32]),
        kind: ParamKind::Input,
    });
    let label = g.add_param(Param {
        name: "label".into(),
        ty: f32t(&[16, 16]),
        kind: ParamKind::Input,
    });
    let weight = |g: &mut Graph, name: &str, shape: &[usize], seed| {
        g.add_param(Param {
            name: name.into(),
            ty: f32t(shape),
            kind: ParamKind::Weight {
                init: Init::XavierUniform { gain: 1.0, seed },
                requires_grad: true,
            },
        })
    };
    let w = weight(&mut g, "w", &[32, 16], 1);
    let w2 = weight(&mut g, "w2", &[16, 16], 2);
    let push = |g: &mut Graph, op, inputs: Vec<Operand>, instance: &str| {
        let mut n = Node::new(op, inputs);
        n.instance = instance.into();
        n.ty = infer_node(g, &n).unwrap();
        Operand::Node(g.push_node(n))
    };
    let mm = push(&mut g, OpKind::MatMul, vec![x.into(), w.into()], "matmul");
    let r = push(&mut g, OpKind::ReLU, vec![mm], "relu");
    let mm2 = push(&mut g, OpKind::MatMul, vec![r, w2.into()], "matmul2");
    let d = push(&mut g, OpKind::Sub, vec![mm2, label.into()], "sub");
    let sq = push(&mut g, OpKind::Square, vec![d], "square");
    let l = push(
        &mut g,
        OpKind::ReduceMean,
        vec![sq, ints(&[0, 1])],
        "reduce_mean",
    );
    g.outputs = vec![l];
    let mut rng = Rng(7);
    let mut rand = |n: usize| (0..n).map(|_| rng.uniform() as f32).collect::<Vec<_>>();
    let feeds = vec![
        (
            "x".to_string(),
            Tensor::from_f32(vec![16, 32], rand(512)).unwrap(),
        ),
        (
            "label".to_string(),
            Tensor::from_f32(vec![16, 16], rand(256)).unwrap(),
        ),
    ];
    (g, feeds)
}

#[test]
fn quickstart_trains_with_every_optimizer() {
    let opts = [
        Optimizer::Momentum {
            learning_rate: 0.05,
            momentum: 0.9,
            use_nesterov: false,
        },
        Optimizer::Momentum {
            learning_rate: 0.05,
            momentum: 0.9,
            use_nesterov: true,
        },
        Optimizer::Sgd {
            learning_rate: 0.1,
            momentum: 0.9,
            dampening: 0.0,
            weight_decay: 1e-4,
            nesterov: false,
        },
        Optimizer::Sgd {
            learning_rate: 0.1,
            momentum: 0.0,
            dampening: 0.0,
            weight_decay: 0.0,
            nesterov: false,
        },
        Optimizer::Adam {
            learning_rate: 0.01,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        },
    ];
    let (fwd, feeds) = quickstart();
    for opt in opts {
        let t = training_graph(&fwd, &opt).unwrap();
        verify(&t).unwrap_or_else(|e| panic!("{opt:?}: {e}"));
        let mut ex = Executor::new(t, backend()).unwrap();
        let feeds: Vec<(&str, Tensor)> =
            feeds.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
        let losses: Vec<f64> = (0..20)
            .map(|_| ex.step(&feeds).unwrap()[0].to_f64_vec()[0])
            .collect();
        let (first, last) = (losses[0], losses[19]);
        assert!(
            last < 0.8 * first,
            "{opt:?}: loss did not fall enough: {losses:?}"
        );
        let rises = losses.windows(2).filter(|w| w[1] > w[0]).count();
        assert!(
            rises <= 3,
            "{opt:?}: the loss rose {rises} times: {losses:?}"
        );
    }
}

#[test]
fn adam_updates_its_beta_powers() {
    let (fwd, feeds) = quickstart();
    let t = training_graph(
        &fwd,
        &Optimizer::Adam {
            learning_rate: 0.01,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        },
    )
    .unwrap();
    let mut ex = Executor::new(t, backend()).unwrap();
    let feeds: Vec<(&str, Tensor)> = feeds.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
    for _ in 0..3 {
        ex.step(&feeds).unwrap();
    }
    let b1 = ex.param("beta1_power").unwrap().to_f64_vec()[0];
    let b2 = ex.param("beta2_power").unwrap().to_f64_vec()[0];
    assert!((b1 - 0.9f64.powi(4)).abs() < 1e-6, "{b1}");
    assert!((b2 - 0.999f64.powi(4)).abs() < 1e-6, "{b2}");
}

#[test]
fn first_step_follows_the_update_rules() {
    let (fwd, feeds) = quickstart();
    let feeds: Vec<(&str, Tensor)> = feeds.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
    // The gradients at the initial weights.
    let (mut bg, grads) = gradients(&fwd).unwrap();
    bg.outputs.extend(grads.iter().map(|(_, g)| g.clone()));
    let mut ex = Executor::new(bg, backend()).unwrap();
    let outs = ex.step(&feeds).unwrap();
    let w0: Vec<Vec<f64>> = ["w", "w2"]
        .iter()
        .map(|n| ex.param(n).unwrap().to_f64_vec())
        .collect();
    let g: Vec<Vec<f64>> = outs[1..].iter().map(Tensor::to_f64_vec).collect();
    let (lr, b1, b2, eps) = (0.01, 0.9, 0.999, 1e-8);
    type Rule = Box<dyn Fn(f64, f64) -> f64>;
    let cases: [(Optimizer, Rule); 3] = [
        (
            Optimizer::Momentum {
                learning_rate: lr,
                momentum: 0.9,
                use_nesterov: false,
            },
            Box::new(move |w, g| w - lr * g),
        ),
        (
            Optimizer::Sgd {
                learning_rate: lr,
                momentum: 0.9,
                dampening: 0.5,
                weight_decay: 0.1,
                nesterov: false,
            },
            // stat = 1 on the first step: accum = g + weight_decay * w, undamped.
            Box::new(move |w, g| w - lr * (g + 0.1 * w)),
        ),
        (
            Optimizer::Adam {
                learning_rate: lr,
                beta1: b1,
                beta2: b2,
                eps,
            },
            Box::new(move |w, g| {
                let (m, v) = ((1.0 - b1) * g, (1.0 - b2) * g * g);
                w - lr * (1.0 - b2).sqrt() / (1.0 - b1) * m / (v.sqrt() + eps)
            }),
        ),
    ];
    for (opt, rule) in cases {
        let mut ex = Executor::new(training_graph(&fwd, &opt).unwrap(), backend()).unwrap();
        ex.step(&feeds).unwrap();
        for (k, name) in ["w", "w2"].iter().enumerate() {
            let w1 = ex.param(name).unwrap().to_f64_vec();
            for (j, &got) in w1.iter().enumerate() {
                let want = rule(w0[k][j], g[k][j]);
                assert!(
                    (got - want).abs() <= 1e-5 * want.abs().max(1e-2),
                    "{opt:?}: {name}[{j}] after one step is {got}, the update rule gives {want}"
                );
            }
        }
    }
}
