//! The CUDA backend's convolutions, pools and BatchNorms on the emulated device (the kernel
//! sources compiled for the host, see `backends/cuda/src/emulator.rs`) against the CPU
//! executor: training steps of LeNet-5, ResNets and a net of unusual convolutions, the
//! synchronised BatchNorm ops, and single ops with their gradients in Float32 and Float64
//! (stride, `same` / `pad` padding, dilation, groups, 1x1, ties in a max pool), and softmaxes
//! over every axis with their gradients (the same single-op harness). Every test
//! also checks that these ops ran on the device. Skips with a message where no C++20
//! compiler is found. With `SHARDC_TEST_DEVICE=cuda` the same tests run on GPU 0 instead
//! (`gpu_common::kernel_test_device`).

mod device_common;
mod gpu_common;
// `gpu_common::nccl_ranks` annotates its models with the invariant suites' `annotate`.
mod invariant_common;

use device_common::small_resnet18;
use gpu_common::{close, compare_on_with, kernel_test_device, momentum, train};
use shardc::compiler::builder::{BuildError, GraphBuilder, Value};
use shardc::compiler::loss::SoftmaxCrossEntropyWithLogits;
use shardc::compiler::model::build_network;
use shardc::compiler::nn::{
    call_cell, AvgPool2d, BatchNorm2d, Cell, Conv2d, Dense, Flatten, MaxPool2d, ReLU,
};
use shardc::compiler::pipeline::{compile, CompileOptions};
use shardc::compiler::zoo;
use shardc::cpu::CpuBackend;
use shardc::cuda::emulator::EmulatedDevice;
use shardc::cuda::{Device, GpuExecutor};
use shardc::ir::TensorType;
use shardc::ir::{Attr, Attrs, Const, DType, Graph, Init, Node, OpKind, Operand, Param, ParamKind};
use shardc::passes::autodiff::gradients;
use shardc::passes::infer::infer_node;
use shardc::passes::parallel::sync_bn::sync_batch_norm;
use shardc::runtime::{Executor, Tensor};
use std::sync::Arc;

fn device() -> Option<Arc<dyn Device>> {
    kernel_test_device()
}

/// Training steps on the emulated device against the CPU (see `gpu_common`).
fn compare(g: Graph, steps: u64, tol: f64) -> Option<String> {
    compare_with(g, steps, tol, tol)
}

/// As [`compare`], with the weights compared to `weight_tol`.
fn compare_with(g: Graph, steps: u64, tol: f64, weight_tol: f64) -> Option<String> {
    Some(compare_on_with(device()?, g, steps, tol, weight_tol))
}

/// Panics when one of `ops` ran on the host.
fn assert_on_device(summary: &str, ops: &[&str]) {
    for op in ops {
        assert!(
            !summary.contains(&format!("host: {op} ")),
            "{op} ran on the host: {summary}"
        );
    }
}

const CONV_OPS: [&str; 3] = ["Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter"];
const BN_OPS: [&str; 2] = ["BatchNorm", "BatchNormGrad"];

#[test]
fn lenet_runs_convolutions_and_pools_on_the_device() {
    let g = train(zoo::lenet(2).expect("lenet"), momentum());
    if let Some(s) = compare(g, 2, 1e-4) {
        println!("{s}");
        assert_on_device(&s, &CONV_OPS);
        assert_on_device(&s, &["MaxPool", "MaxPoolGrad"]);
        assert!(!s.contains("host:"), "{s}");
    }
}

#[test]
fn a_small_resnet18_with_batch_norm_trains_as_on_the_cpu() {
    let g = train(small_resnet18(2), momentum());
    // Every Assign's value is written in place: the optimizer's updates and BatchNorm's
    // moving statistics (which compare_on_with checks with the weights).
    let assigns = g.nodes.iter().filter(|n| n.op == OpKind::Assign).count();
    if let Some(s) = compare(g, 2, 1e-4) {
        println!("{s}");
        assert_on_device(&s, &CONV_OPS);
        assert_on_device(&s, &BN_OPS);
        assert!(!s.contains("host:"), "{s}");
        assert!(
            s.contains(&format!("in place: {} results", 2 * assigns)),
            "{assigns} Assigns a step: {s}"
        );
    }
}

#[test]
fn a_narrow_resnet50_forward_matches_the_cpu() {
    // A 7x7 stride-2 `pad` stem, a `same` 3x3 stride-2 max pool, bottlenecks with 1x1
    // convolutions (pointwise and strided) and BatchNorm everywhere. Forward only: so narrow
    // and deep a net is badly conditioned backwards (on the CPU alone, a relative change of
    // 1e-7 in x moves the weights after one step by 1e-3 or more), and every op's own
    // gradients are compared exactly by the single-op tests below.
    let opts = CompileOptions::default();
    let g = compile(zoo::resnet50(2, 64, 10, 16).expect("resnet50"), &opts)
        .expect("compiles")
        .graph;
    if let Some(s) = compare(g, 1, 1e-4) {
        println!("{s}");
        assert_on_device(&s, &["Conv2D", "BatchNorm", "MaxPool"]);
        assert!(!s.contains("host:"), "{s}");
    }
}

/// Convolutions of every kind the CPU supports: stride 2 `same`, groups with dilation,
/// asymmetric `pad`, a depthwise convolution, a 1x1; `same` average and max pools.
struct OddConvs;

impl Cell for OddConvs {
    fn class_name(&self) -> &str {
        "OddConvs"
    }

    fn construct(&self, b: &mut GraphBuilder, x: Value) -> Result<Value, BuildError> {
        // (name, convolution, its output channels)
        let convs = [
            ("strided", Conv2d::new(3, 8, 3).stride(2), 8),
            ("grouped", Conv2d::new(8, 8, 3).group(2).dilation(2), 8),
            (
                "padded",
                Conv2d::new(8, 8, 3).pad_mode("pad").padding4(1, 0, 2, 1),
                8,
            ),
            (
                "depthwise",
                Conv2d::new(8, 8, 3).group(8).pad_mode("valid"),
                8,
            ),
            ("pointwise", Conv2d::new(8, 6, 1), 6),
        ];
        let mut y = x;
        for (name, conv, out) in convs {
            y = call_cell(b, name, &conv, y)?;
            y = call_cell(b, &format!("{name}_bn"), &BatchNorm2d::new(out), y)?;
            y = call_cell(b, "relu", &ReLU, y)?;
            if name == "padded" {
                y = call_cell(b, "avg", &AvgPool2d::new(3, 2).pad_mode("same"), y)?;
            }
        }
        y = call_cell(b, "max", &MaxPool2d::new(2, 1).pad_mode("same"), y)?;
        y = call_cell(b, "flatten", &Flatten, y)?;
        call_cell(b, "fc", &Dense::new(6 * 2 * 3, 10), y)
    }
}

fn odd_convs(batch: usize) -> Graph {
    build_network(
        "OddConvs",
        &OddConvs,
        &SoftmaxCrossEntropyWithLogits::new(true, "mean"),
        &[
            ("x", DType::Float32, &[batch, 3, 16, 16]),
            ("label", DType::Int32, &[batch]),
        ],
    )
    .expect("odd convs")
}

#[test]
fn strided_grouped_dilated_padded_depthwise_and_pointwise_convolutions_train_as_on_the_cpu() {
    let g = train(odd_convs(3), momentum());
    if let Some(s) = compare(g, 2, 1e-4) {
        println!("{s}");
        assert_on_device(&s, &CONV_OPS);
        assert_on_device(&s, &["AvgPool", "AvgPoolGrad", "MaxPool", "MaxPoolGrad"]);
        assert!(!s.contains("host:"), "{s}");
    }
}

#[test]
fn synchronised_batch_norm_ops_run_on_the_device() {
    let g = sync_batch_norm(&train(small_resnet18(2), momentum())).expect("sync bn");
    for op in [
        OpKind::BNTrainingReduce,
        OpKind::BNTrainingUpdate,
        OpKind::BNTrainingUpdateGrad,
        OpKind::BNTrainingReduceGrad,
    ] {
        assert!(g.nodes.iter().any(|n| n.op == op), "no {op} in the graph");
    }
    if let Some(s) = compare(g, 2, 1e-4) {
        println!("{s}");
        assert!(!s.contains("host:"), "{s}");
    }
}

// ---------------------------------------------------------------------------------------------
// Single ops with their gradients, Float32 and Float64
// ---------------------------------------------------------------------------------------------

/// splitmix64: fixed pseudo-random numbers without a dependency.
struct Rng(u64);

impl Rng {
    fn uniform(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
    }
}

/// A graph `op -> ReduceSum(Mul(out, c))` under construction: every float operand a
/// trainable weight with fixed random values, `c` a fed input.
struct OpNet {
    g: Graph,
    dtype: DType,
    values: Vec<(String, Tensor)>,
    feeds: Vec<(String, Tensor)>,
    /// Compared too, after the loss (not differentiated).
    extra_outputs: Vec<Operand>,
    rng: Rng,
}

impl OpNet {
    fn new(dtype: DType, seed: u64) -> OpNet {
        OpNet {
            g: Graph::new("Op"),
            dtype,
            values: Vec::new(),
            feeds: Vec::new(),
            extra_outputs: Vec::new(),
            rng: Rng(seed),
        }
    }

    fn tensor(&self, shape: &[usize], v: Vec<f64>) -> Tensor {
        match self.dtype {
            DType::Float32 => {
                Tensor::from_f32(shape.to_vec(), v.iter().map(|&x| x as f32).collect())
            }
            _ => Tensor::from_f64(shape.to_vec(), v),
        }
        .expect("values of the shape")
    }

    /// A weight with values `f(u)`, `u` uniform in [-1, 1).
    fn w_with(&mut self, name: &str, shape: &[usize], f: impl Fn(f64) -> f64) -> Operand {
        let p = self.g.add_param(Param {
            name: name.into(),
            ty: TensorType::new(self.dtype, shape.to_vec()),
            kind: ParamKind::Weight {
                init: Init::Zeros,
                requires_grad: true,
            },
        });
        let n: usize = shape.iter().product();
        let v = (0..n).map(|_| f(self.rng.uniform())).collect();
        let t = self.tensor(shape, v);
        self.values.push((name.into(), t));
        Operand::Param(p)
    }

    fn w(&mut self, name: &str, shape: &[usize]) -> Operand {
        self.w_with(name, shape, |u| u)
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

    /// Appends the loss and its gradients, runs one step on the CPU and on the device and
    /// compares the loss and every gradient. Returns the stats summary.
    fn check(self, out: Operand, what: &str, tol: f64) -> Option<String> {
        let dev = device()?;
        Some(self.check_on(dev, out, what, tol))
    }

    /// [`OpNet::check`] on `dev`.
    fn check_on(mut self, dev: Arc<dyn Device>, out: Operand, what: &str, tol: f64) -> String {
        let shape = self.g.operand_tensor_type(&out).unwrap().shape.clone();
        let p = self.g.add_param(Param {
            name: "c".into(),
            ty: TensorType::new(self.dtype, shape.clone()),
            kind: ParamKind::Input,
        });
        let n: usize = shape.iter().product();
        let v = (0..n).map(|_| self.rng.uniform()).collect();
        let c = self.tensor(&shape, v);
        self.feeds.push(("c".into(), c));
        let m = self.op(OpKind::Mul, vec![out, Operand::Param(p)], Attrs::new());
        let l = self.op(
            OpKind::ReduceSum,
            vec![m, Operand::Const(Const::Ints(vec![]))],
            Attrs::new(),
        );
        self.g.outputs = vec![l];
        self.g.outputs.extend(self.extra_outputs.iter().cloned());
        let (mut bg, grads) = gradients(&self.g).unwrap_or_else(|e| panic!("{what}: {e}"));
        bg.outputs.extend(grads.iter().map(|(_, g)| g.clone()));

        let backend = Arc::new(CpuBackend::with_threads(1));
        let mut cpu = Executor::new(bg.clone(), backend.clone()).expect("cpu executor");
        let mut gpu = GpuExecutor::new(bg, dev, backend).expect("gpu executor");
        for (name, v) in &self.values {
            cpu.set_param(name, v.clone()).unwrap();
            gpu.set_param(name, v).unwrap();
        }
        let feeds: Vec<(&str, Tensor)> = self
            .feeds
            .iter()
            .map(|(n, t)| (n.as_str(), t.clone()))
            .collect();
        let a = cpu
            .step(&feeds)
            .unwrap_or_else(|e| panic!("{what}: cpu: {e}"));
        let b = gpu
            .step(&feeds)
            .unwrap_or_else(|e| panic!("{what}: gpu: {e}"));
        assert_eq!(
            a.len(),
            1 + self.extra_outputs.len() + grads.len(),
            "{what}"
        );
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            if let Err(e) = close(x, y, tol) {
                panic!("{what} ({}): output {i}: {e}", self.dtype);
            }
        }
        let s = gpu.stats().summary();
        assert!(!s.contains("host:"), "{what} ({}): {s}", self.dtype);
        s
    }
}

fn tol(dtype: DType) -> f64 {
    if dtype == DType::Float64 {
        1e-10
    } else {
        1e-4
    }
}

fn ints(v: &[i64]) -> Attr {
    Attr::ints(v)
}

fn word(s: &str) -> Attr {
    Attr::Str(s.into())
}

fn attrs(kv: Vec<(&str, Attr)>) -> Attrs {
    let mut a = Attrs::new();
    for (k, v) in kv {
        a.set(k, v);
    }
    a
}

/// A convolution case: what it shows, x's shape, w's shape, attributes beyond out_channel and
/// kernel_size.
type ConvCase = (
    &'static str,
    [usize; 4],
    [usize; 4],
    Vec<(&'static str, Attr)>,
);

/// Convolutions of every geometry the CPU supports.
fn conv_cases() -> Vec<ConvCase> {
    vec![
        ("valid", [2, 3, 7, 9], [4, 3, 3, 3], vec![]),
        (
            "same, stride 2",
            [2, 2, 7, 8],
            [4, 2, 3, 3],
            vec![("pad_mode", word("same")), ("stride", ints(&[2, 2]))],
        ),
        (
            "pad (1, 2, 0, 1), stride (2, 1), dilation (1, 2)",
            [2, 3, 7, 8],
            [4, 3, 3, 3],
            vec![
                ("pad_mode", word("pad")),
                ("pad", ints(&[1, 2, 0, 1])),
                ("stride", ints(&[1, 1, 2, 1])),
                ("dilation", ints(&[1, 2])),
            ],
        ),
        (
            "pad 2, stride 3, rectangular kernel",
            [2, 2, 9, 7],
            [3, 2, 2, 4],
            vec![
                ("pad_mode", word("pad")),
                ("pad", Attr::Int(2)),
                ("stride", Attr::Int(3)),
            ],
        ),
        (
            "same, dilation 2",
            [2, 2, 8, 8],
            [3, 2, 3, 3],
            vec![("pad_mode", word("same")), ("dilation", Attr::Int(2))],
        ),
        (
            "group 2, same",
            [2, 4, 6, 6],
            [6, 2, 3, 3],
            vec![("pad_mode", word("same")), ("group", Attr::Int(2))],
        ),
        (
            "depthwise (group 4 > batch)",
            [1, 4, 5, 5],
            [8, 1, 3, 3],
            vec![("group", Attr::Int(4))],
        ),
        ("pointwise", [2, 4, 5, 5], [6, 4, 1, 1], vec![]),
        (
            "pointwise, group 2",
            [3, 4, 5, 5],
            [6, 2, 1, 1],
            vec![("group", Attr::Int(2))],
        ),
        (
            "1x1, stride 2",
            [2, 4, 6, 6],
            [8, 4, 1, 1],
            vec![("stride", Attr::Int(2))],
        ),
        (
            "7x7, stride 2, pad 3 (ResNet-50's stem)",
            [2, 3, 12, 11],
            [4, 3, 7, 7],
            vec![
                ("pad_mode", word("pad")),
                ("pad", Attr::Int(3)),
                ("stride", Attr::Int(2)),
            ],
        ),
        (
            "window as large as the padded input",
            [2, 2, 3, 3],
            [2, 2, 5, 5],
            vec![("pad_mode", word("pad")), ("pad", Attr::Int(1))],
        ),
    ]
}

/// Conv2D `what` of case `k` (its gradients come with it in [`OpNet::check`]).
fn conv_net(dtype: DType, k: usize, (_, xs, ws, extra): &ConvCase) -> (OpNet, Operand) {
    let mut n = OpNet::new(dtype, 10 + k as u64);
    let x = n.w("x", xs);
    let w = n.w("w", ws);
    let mut a = attrs(vec![
        ("out_channel", Attr::Int(ws[0] as i64)),
        ("kernel_size", ints(&[ws[2] as i64, ws[3] as i64])),
    ]);
    for (key, v) in extra {
        a.set(*key, v.clone());
    }
    let y = n.op(OpKind::Conv2D, vec![x, w], a);
    (n, y)
}

#[test]
fn single_convolutions_and_their_gradients_match_the_cpu() {
    for dtype in [DType::Float32, DType::Float64] {
        for (k, case) in conv_cases().iter().enumerate() {
            let (n, y) = conv_net(dtype, k, case);
            let what = case.0;
            if n.check(y, &format!("Conv2D {what}"), tol(dtype)).is_none() {
                return;
            }
        }
    }
}

/// The emulated device with its reference convolution library standing in for cuDNN, or
/// None (with a SKIP) where the emulator cannot be built or the tests run on a GPU (where the
/// other tests go through cuDNN itself).
fn library_device() -> Option<Arc<dyn Device>> {
    if std::env::var(gpu_common::TEST_DEVICE_ENV).as_deref() == Ok("cuda") {
        eprintln!("SKIP: the reference convolution library is the emulator's");
        return None;
    }
    match EmulatedDevice::new(64) {
        Ok(d) => Some(Arc::new(d.with_reference_library())),
        Err(e) => {
            eprintln!("SKIP: the kernel emulator cannot be built here: {e}");
            None
        }
    }
}

#[test]
fn every_convolution_goes_to_the_library_the_unevenly_padded_ones_padded_first() {
    let Some(dev) = library_device() else {
        return;
    };
    for dtype in [DType::Float32, DType::Float64] {
        for (k, case) in conv_cases().iter().enumerate() {
            let (n, y) = conv_net(dtype, k, case);
            let what = format!("Conv2D {} ({dtype})", case.0);
            let s = n.check_on(dev.clone(), y, &what, tol(dtype));
            // The forward pass and both gradients, with the CPU's numbers. cuDNN cannot
            // express two of the cases' padding, which differs between the sides in a way
            // that changes the windows of a symmetric padding: `same` with stride 2 pads 8
            // columns 0 left, 1 right (4 outputs, 3 with 0/0); `pad (1, 2, 0, 1)` pads 0 left
            // and 1 right around a dilated kernel (5 outputs, 4 with 0/0). They go as the
            // unpadded convolution of their input with the padding written in (`ops::conv`).
            assert!(
                s.contains(", 3 through the convolution library"),
                "{what}: {s}"
            );
        }
    }
    // A training net mixing them: the strided `same`, grouped, uneven `pad`, depthwise and
    // pointwise convolutions, all through the library (3 ops each, 2 for the first, whose
    // input needs no gradient; 2 steps).
    let s = compare_on_with(dev, train(odd_convs(3), momentum()), 2, 1e-4, 1e-4);
    println!("{s}");
    assert!(s.contains(", 28 through the convolution library"), "{s}");
}

#[test]
fn a_convolution_over_several_scratch_chunks_matches_the_cpu() {
    // 16 images whose column matrices (72 x 4096 each) do not fit one scratch chunk.
    let mut n = OpNet::new(DType::Float32, 5);
    let x = n.w("x", &[16, 8, 64, 64]);
    let w = n.w("w", &[4, 8, 3, 3]);
    let y = n.op(
        OpKind::Conv2D,
        vec![x, w],
        attrs(vec![("pad_mode", word("same"))]),
    );
    // Each element of the filter's gradient sums 16 x 64 x 64 = 65,536 products: the order
    // of summation alone (cuDNN's against the CPU's) moves it by about 2e-4 (seen on an H200).
    n.check(y, "Conv2D in chunks", 1e-3);
}

#[test]
fn single_pools_and_their_gradients_match_the_cpu() {
    for dtype in [DType::Float32, DType::Float64] {
        for op in [OpKind::MaxPool, OpKind::AvgPool] {
            for (mode, k, st) in [
                ("valid", 2, 2),
                ("valid", 3, 1),
                ("same", 3, 2),
                ("same", 2, 1),
                ("same", 4, 3),
            ] {
                for values in ["uniform", "ties", "NaNs"] {
                    let mut n = OpNet::new(dtype, 130);
                    let shape = [2, 3, 7, 8];
                    // With ties, many windows hold their maximum twice: the gradient goes to
                    // the first. A NaN is the maximum of its windows.
                    let x = match values {
                        "ties" => n.w_with("x", &shape, |u| (u * 1.5).round()),
                        "NaNs" => n.w_with("x", &shape, |u| if u > 0.9 { f64::NAN } else { u }),
                        _ => n.w("x", &shape),
                    };
                    let y = n.op(
                        op,
                        vec![x],
                        attrs(vec![
                            ("kernel_size", Attr::Int(k)),
                            ("strides", Attr::Int(st)),
                            ("pad_mode", word(mode)),
                        ]),
                    );
                    let what = format!("{op} {mode} k {k} s {st}, {values} values");
                    if n.check(y, &what, tol(dtype)).is_none() {
                        return;
                    }
                }
            }
        }
    }
}

#[test]
fn single_batch_norms_and_their_gradients_match_the_cpu() {
    for dtype in [DType::Float32, DType::Float64] {
        for training in [true, false] {
            // Channels of 40 and 6 elements; then channels longer than a block of threads
            // (64 on the emulator), whose threads step across images: 9 images of 10
            // positions (a step of 6 images and 4 positions), 5 of 77, 3 of 300; and 4 of
            // 300, long enough for the wide blocks (128 threads on the emulator), and split
            // into 2 chunks of 600 (a block each: few long channels); 7 of 250, 3 chunks of
            // 584 that start inside images, the last shorter.
            for shape in [
                &[4usize, 3, 5, 2][..],
                &[6, 3],
                &[9, 3, 10],
                &[5, 3, 7, 11],
                &[3, 3, 300],
                &[4, 3, 300],
                &[7, 3, 250],
            ] {
                let mut n = OpNet::new(dtype, 120);
                let x = n.w_with("x", shape, |u| 2.0 * u + 0.5);
                let scale = n.w_with("scale", &[3], |u| 1.0 + 0.5 * u);
                let bias = n.w("bias", &[3]);
                let mean = n.w("mean", &[3]);
                let var = n.w_with("variance", &[3], |u| 1.0 + 0.5 * u);
                let bn = n.op(
                    OpKind::BatchNorm,
                    vec![x, scale, bias, mean, var],
                    attrs(vec![
                        ("is_training", Attr::Bool(training)),
                        ("epsilon", Attr::Float(1e-3)),
                    ]),
                );
                let y = n.item(bn.clone(), 0);
                // The statistics are compared too.
                for k in 1..5 {
                    let v = n.item(bn.clone(), k);
                    n.extra_outputs.push(v);
                }
                let what = format!("BatchNorm training {training} {shape:?}");
                if n.check(y, &what, tol(dtype)).is_none() {
                    return;
                }
            }
        }
    }
}

#[test]
fn softmaxes_over_any_axis_and_their_gradients_match_the_cpu() {
    // The last axis (contiguous rows), a middle one and the first (rows `inner` apart), each
    // with its gradient, Softmax and LogSoftmax, in Float32 and Float64.
    for dtype in [DType::Float32, DType::Float64] {
        for op in [OpKind::Softmax, OpKind::LogSoftmax] {
            for axis in [-1i64, 1, 0] {
                let mut n = OpNet::new(dtype, (41 + axis) as u64);
                let x = n.w("x", &[3, 5, 4]);
                let y = n.op(op, vec![x], attrs(vec![("axis", ints(&[axis]))]));
                let what = format!("{op} over axis {axis}");
                match n.check(y, &what, tol(dtype)) {
                    Some(s) => assert!(!s.contains("host:"), "{what}: {s}"),
                    None => return,
                }
            }
        }
    }
}

#[test]
fn reductions_over_axes_that_are_not_adjacent_match_the_cpu() {
    // One pass per run of reduced axes on the device (innermost first), with gradients
    // (ReduceMax's goes through Equal and a cast from Bool).
    for (dtype, op) in [
        (DType::Float32, OpKind::ReduceSum),
        (DType::Float32, OpKind::ReduceMean),
        (DType::Float32, OpKind::ReduceMax),
        (DType::Float64, OpKind::ReduceSum),
    ] {
        for (axes, keep) in [
            (vec![0i64, 2], false),
            (vec![0, 2, 3], true),
            (vec![1, 3], false),
            (vec![0, -1], true),
            (vec![0, 1, 2, 3], false),
        ] {
            let mut n = OpNet::new(dtype, 60 + axes.len() as u64);
            let x = n.w("x", &[3, 4, 5, 2]);
            let y = n.op(
                op,
                vec![x, Operand::Const(Const::Ints(axes.clone()))],
                attrs(vec![("keep_dims", Attr::Bool(keep))]),
            );
            let what = format!("{op} over {axes:?} (keep_dims {keep})");
            match n.check(y, &what, tol(dtype)) {
                Some(s) => assert!(!s.contains("host:"), "{what}: {s}"),
                None => return,
            }
        }
    }
}

#[test]
fn long_columns_and_layer_norm_parameters_reduce_as_on_the_cpu() {
    // Columns of at least 64 rows go through the tiled kernel (a block per 32 columns, its
    // warps taking every few rows): a last tile of 6 of 32 columns, several tiles per outer
    // slice, NaN in a maximum.
    for (dtype, op) in [
        (DType::Float32, OpKind::ReduceSum),
        (DType::Float32, OpKind::ReduceMean),
        (DType::Float32, OpKind::ReduceMax),
        (DType::Float64, OpKind::ReduceSum),
    ] {
        // Rows of 1500: long enough for the wide blocks; 2 rows of 6000 and a whole tensor of
        // 4800: few rows, each reduced in chunks (5 of 1200, 4 of 1200), then the chunks.
        for (shape, axis) in [
            (vec![150usize, 70], 0i64),
            (vec![2, 100, 40], 1),
            (vec![3, 1500], 1),
            (vec![2, 6000], 1),
            (vec![4800], 0),
        ] {
            for values in ["uniform", "NaNs"] {
                if values == "NaNs" && op != OpKind::ReduceMax {
                    continue;
                }
                let mut n = OpNet::new(dtype, 90 + shape.len() as u64);
                let x = match values {
                    "NaNs" => n.w_with("x", &shape, |u| if u > 0.995 { f64::NAN } else { u }),
                    _ => n.w("x", &shape),
                };
                let y = n.op(
                    op,
                    vec![x, Operand::Const(Const::Ints(vec![axis]))],
                    attrs(vec![("keep_dims", Attr::Bool(false))]),
                );
                let what = format!("{op} over axis {axis} of {shape:?} ({values})");
                match n.check(y, &what, tol(dtype)) {
                    Some(s) => assert!(!s.contains("host:"), "{what}: {s}"),
                    None => return,
                }
            }
        }
    }
    // LayerNorm's gamma and beta gradients: column sums over 130 rows of 45 parameters
    // (two tiles, the second of 13), and over rows of a 2-D parameter block.
    for dtype in [DType::Float32, DType::Float64] {
        for (shape, bna, bpa) in [(vec![130usize, 45], 1i64, 1i64), (vec![70, 3, 20], 1, 1)] {
            let mut n = OpNet::new(dtype, 97);
            let x = n.w("x", &shape);
            let params = &shape[bpa as usize..];
            let gamma = n.w("gamma", params);
            let beta = n.w("beta", params);
            let ln = n.op(
                OpKind::LayerNorm,
                vec![x, gamma, beta],
                attrs(vec![
                    ("begin_norm_axis", Attr::Int(bna)),
                    ("begin_params_axis", Attr::Int(bpa)),
                    ("epsilon", Attr::Float(1e-5)),
                ]),
            );
            let y = n.item(ln, 0);
            let what = format!("LayerNorm of {shape:?} ({dtype})");
            match n.check(y, &what, tol(dtype)) {
                Some(s) => assert!(!s.contains("host:"), "{what}: {s}"),
                None => return,
            }
        }
    }
}
