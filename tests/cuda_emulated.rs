//! The CUDA backend on the emulated device (its kernel sources compiled for the host, see
//! `backends/cuda/src/emulator.rs`): whole training steps of real models against the CPU
//! executor. Kernel choice, arguments, grids, the GEMM mapping, the memory plan, host
//! fallback and Assign all run as on a GPU; only the driver, cuBLAS and NCCL calls do not.
//! Skips with a message where no C++20 compiler is found. With `SHARDC_TEST_DEVICE=cuda` the
//! same tests run on GPU 0 instead (`gpu_common::kernel_test_device`); `tests/cuda_gpu.rs`
//! runs the models on a real GPU too.

mod device_common;
mod gpu_common;
// `gpu_common::nccl_ranks` annotates its models with the invariant suites' `annotate`.
mod invariant_common;

use gpu_common::{compare_on, kernel_test_device, momentum, train};
use shardc::compiler::transformer::{transformer, TransformerConfig};
use shardc::compiler::zoo;
use shardc::cuda::Device;
use shardc::ir::Graph;
use shardc::passes::autodiff::Optimizer;
use std::sync::Arc;

fn device() -> Option<Arc<dyn Device>> {
    kernel_test_device()
}

fn compare(g: Graph, steps: u64, tol: f64) -> Option<String> {
    Some(compare_on(device()?, g, steps, tol))
}

#[test]
fn mlp_trains_as_on_the_cpu() {
    let g = train(zoo::mlp(8, &[20, 16, 16, 4]).expect("mlp"), momentum());
    if let Some(s) = compare(g, 3, 1e-5) {
        println!("{s}");
        assert!(!s.contains("host: MatMul"), "{s}");
    }
}

/// An MLP with SiLU activations (Dense cells with `activation="silu"`): SiLU and SiLUGrad run
/// on the device (their kernels in `elementwise.cu`, or fused into an elementwise chain).
#[test]
fn silu_runs_on_the_device_as_on_the_cpu() {
    use shardc::compiler::loss::SoftmaxCrossEntropyWithLogits;
    use shardc::compiler::model::build_network;
    use shardc::compiler::nn::{Activation, Dense, SequentialCell};
    use shardc::ir::DType;
    let net = SequentialCell::new(vec![
        Box::new(Dense::new(12, 16).activation(Activation::SiLU)),
        Box::new(Dense::new(16, 4)),
    ]);
    let g = build_network(
        "Network",
        &net,
        &SoftmaxCrossEntropyWithLogits::new(true, "mean"),
        &[
            ("x", DType::Float32, &[8, 12]),
            ("label", DType::Int32, &[8]),
        ],
    )
    .expect("SiLU MLP");
    assert!(g.nodes.iter().any(|n| n.op == shardc::ir::OpKind::SiLU));
    let g = train(g, momentum());
    assert!(g.nodes.iter().any(|n| n.op == shardc::ir::OpKind::SiLUGrad));
    if let Some(s) = compare(g, 3, 1e-5) {
        println!("{s}");
        assert!(!s.contains("host: SiLU"), "{s}");
    }
}

/// The exact GeLU, `x/2 * (1 + erf(x/sqrt(2)))`, as PyTorch exports `nn.GELU()`: Erf runs on
/// the device (its kernel in `elementwise.cu`); its gradient is composed of Square, Exp and
/// Mul.
#[test]
fn erf_runs_on_the_device_as_on_the_cpu() {
    use shardc::compiler::builder::GraphBuilder;
    use shardc::compiler::loss::{LossFn, SoftmaxCrossEntropyWithLogits};
    use shardc::ir::{DType, Init};
    let mut b = GraphBuilder::new("ExactGelu");
    let x = b.input("x", DType::Float32, &[8, 12]).expect("x");
    let label = b.input("label", DType::Int32, &[8]).expect("label");
    let w = b
        .weight(
            "w",
            DType::Float32,
            &[12, 16],
            Init::Normal {
                sigma: 0.3,
                mean: 0.0,
                seed: 0,
            },
        )
        .expect("w");
    let w2 = b
        .weight(
            "w2",
            DType::Float32,
            &[16, 4],
            Init::Normal {
                sigma: 0.3,
                mean: 0.0,
                seed: 0,
            },
        )
        .expect("w2");
    let h = b.matmul(x, w).expect("matmul");
    let scaled = b
        .mul_scalar(h, std::f64::consts::FRAC_1_SQRT_2)
        .expect("scale");
    let e = b.erf(scaled).expect("erf");
    let one_plus = b.add_scalar(e, 1.0).expect("add");
    let half_x = b.mul_scalar(h, 0.5).expect("half");
    let gelu = b.mul(half_x, one_plus).expect("gelu");
    let logits = b.matmul(gelu, w2).expect("logits");
    let loss = SoftmaxCrossEntropyWithLogits::new(true, "mean")
        .construct(&mut b, logits, label)
        .expect("loss");
    let g = train(b.finish(&[loss]).expect("graph"), momentum());
    assert!(g.nodes.iter().any(|n| n.op == shardc::ir::OpKind::Erf));
    if let Some(s) = compare(g, 3, 1e-5) {
        println!("{s}");
        assert!(!s.contains("host: Erf"), "{s}");
    }
}

#[test]
fn quickstart_trains_as_on_the_cpu() {
    let g = train(zoo::quickstart(4).expect("quickstart"), momentum());
    if let Some(s) = compare(g, 2, 1e-5) {
        println!("{s}");
    }
}

#[test]
fn transformer_trains_as_on_the_cpu_with_adam() {
    let cfg = TransformerConfig::new(1, 16, 2, 4, 2);
    let g = transformer(&cfg).expect("transformer");
    let adam = Optimizer::Adam {
        learning_rate: 0.01,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
    };
    if let Some(s) = compare(train(g, adam), 2, 1e-4) {
        println!("{s}");
        for op in ["Softmax", "LayerNorm", "BatchMatMul", "GeLU", "Adam"] {
            assert!(
                !s.contains(&format!("host: {op} ")),
                "{op} ran on the host: {s}"
            );
        }
    }
}

#[test]
fn lenet_trains_as_on_the_cpu_with_convolutions_on_the_device() {
    let g = train(zoo::lenet(2).expect("lenet"), momentum());
    if let Some(s) = compare(g, 1, 1e-4) {
        println!("{s}");
        assert!(!s.contains("host:"), "{s}");
    }
}

/// The movement ops one by one (a forward graph of them, every result an output), on the
/// emulated device against the CPU, over two steps (Dropout's masks depend on the step):
/// exactly equal, since they only move data (and draw the same masks).
#[test]
fn movement_ops_match_the_cpu_exactly() {
    use shardc::compiler::builder::GraphBuilder;
    use shardc::ir::{Attr, Attrs, Const, DType, Init, OpKind, Operand};
    let Some(dev) = device() else { return };
    let mut b = GraphBuilder::new("Movement");
    let x = b.input("x", DType::Float32, &[4, 6]).unwrap();
    let idx = b.input("idx", DType::Int32, &[5]).unwrap();
    let table = b
        .weight(
            "table",
            DType::Float32,
            &[10, 3],
            Init::Normal {
                sigma: 1.0,
                mean: 0.0,
                seed: 3,
            },
        )
        .unwrap();
    let ints = |v: &[i64]| Operand::Const(Const::Ints(v.to_vec()));
    let slice = b
        .op(
            OpKind::StridedSlice,
            &[x.into(), ints(&[0, -6]), ints(&[4, 6]), ints(&[2, 1])],
            Attrs::new(),
        )
        .unwrap();
    let cat = b
        .op(
            OpKind::Concat,
            &[x.into(), slice.into(), x.into()],
            Attrs::new().with("axis", Attr::Int(0)),
        )
        .unwrap();
    let cat1 = b
        .op(
            OpKind::Concat,
            &[x.into(), x.into()],
            Attrs::new().with("axis", Attr::Int(1)),
        )
        .unwrap();
    let split = b
        .op(
            OpKind::Split,
            &[x.into()],
            Attrs::new()
                .with("axis", Attr::Int(1))
                .with("output_num", Attr::Int(3)),
        )
        .unwrap();
    let part = b.tuple_get_item(split, 2).unwrap();
    let gathered = b
        .op(
            OpKind::Gather,
            &[table.into(), idx.into(), Operand::Const(Const::Int(0))],
            Attrs::new(),
        )
        .unwrap();
    // A block of a vocabulary-split table: rows 4..8 of 12; indices outside give zeros.
    let block = b
        .weight(
            "table_block",
            DType::Float32,
            &[4, 3],
            Init::Normal {
                sigma: 1.0,
                mean: 0.0,
                seed: 5,
            },
        )
        .unwrap();
    let gathered_block = b
        .op(
            OpKind::Gather,
            &[block.into(), idx.into(), Operand::Const(Const::Int(0))],
            Attrs::new()
                .with("global_shape", Attr::ints(&[12, 3]))
                .with("offset", Attr::ints(&[4, 0])),
        )
        .unwrap();
    let drop = b
        .op(
            OpKind::Dropout,
            &[x.into()],
            Attrs::new()
                .with("keep_prob", Attr::Float(0.6))
                .with("seed0", Attr::Int(7))
                .with("seed1", Attr::Int(11)),
        )
        .unwrap();
    let dy = b.tuple_get_item(drop, 0).unwrap();
    let mask = b.tuple_get_item(drop, 1).unwrap();
    let dgrad = b
        .op(OpKind::DropoutGrad, &[x.into(), mask.into()], Attrs::new())
        .unwrap();
    let sgrad = b
        .op(
            OpKind::StridedSliceGrad,
            &[
                slice.into(),
                ints(&[4, 6]),
                ints(&[0, -6]),
                ints(&[4, 6]),
                ints(&[2, 1]),
            ],
            Attrs::new(),
        )
        .unwrap();
    let eq = b
        .op(OpKind::Equal, &[x.into(), dgrad.into()], Attrs::new())
        .unwrap();
    // Bool moves by its bits (the one-byte copy kernel), on the device too.
    let eq_t = b
        .op(OpKind::Transpose, &[eq.into(), ints(&[1, 0])], Attrs::new())
        .unwrap();
    let eq_cut = b
        .op(
            OpKind::StridedSlice,
            &[eq.into(), ints(&[0, -6]), ints(&[4, 6]), ints(&[2, 1])],
            Attrs::new(),
        )
        .unwrap();
    let eq_cat = b
        .op(
            OpKind::Concat,
            &[eq.into(), eq_cut.into()],
            Attrs::new().with("axis", Attr::Int(0)),
        )
        .unwrap();
    let g = b
        .finish(&[
            slice,
            cat,
            cat1,
            part,
            gathered,
            gathered_block,
            dy,
            mask,
            dgrad,
            sgrad,
            eq,
            eq_t,
            eq_cut,
            eq_cat,
        ])
        .expect("the movement graph builds");
    let host = Arc::new(shardc::cpu::CpuBackend::with_threads(1));
    let mut cpu = shardc::runtime::Executor::new(g.clone(), host.clone()).unwrap();
    let mut gpu = shardc::cuda::GpuExecutor::new(g, dev, host).unwrap();
    for step in 0..2u64 {
        let xs: Vec<f32> = (0..24)
            .map(|i| ((i * 7 + step as i32) % 11) as f32 - 5.0)
            .collect();
        let feeds = vec![
            (
                "x",
                shardc::runtime::Tensor::from_f32(vec![4, 6], xs).unwrap(),
            ),
            (
                "idx",
                shardc::runtime::Tensor::from_i32(vec![5], vec![9, 0, 3, 3, 7]).unwrap(),
            ),
        ];
        let a = cpu.step(&feeds).unwrap();
        let c = gpu.step(&feeds).unwrap();
        for (i, (u, v)) in a.iter().zip(&c).enumerate() {
            assert_eq!(u, v, "output {i} at step {step}");
        }
        // Of indices 9, 0, 3, 3, 7 only 7 falls in rows 4..8 (as the block's row 3).
        let rows = a[5].to_f64_vec();
        assert!(rows[..12].iter().all(|&v| v == 0.0), "{rows:?}");
        assert!(rows[12..].iter().any(|&v| v != 0.0), "{rows:?}");
    }
    let s = gpu.stats().summary();
    assert!(!s.contains("host:"), "{s}");
    // An index out of range is an error naming the op, not a wrong number.
    let feeds = vec![
        (
            "x",
            shardc::runtime::Tensor::from_f32(vec![4, 6], vec![0.0; 24]).unwrap(),
        ),
        (
            "idx",
            shardc::runtime::Tensor::from_i32(vec![5], vec![0, 1, 10, 2, 3]).unwrap(),
        ),
    ];
    let err = gpu.step(&feeds).unwrap_err().to_string();
    assert!(
        err.contains("Gather") && err.contains("position 2"),
        "{err}"
    );
}

#[test]
fn the_embedding_network_trains_as_on_the_cpu() {
    let g =
        shardc::compiler::generated::embedding_net(4, 50, 8, 3, &[16, 4]).expect("embedding net");
    if let Some(s) = compare(train(g, momentum()), 2, 1e-5) {
        println!("{s}");
        // Gather forward, UnsortedSegmentSum (the table's gradient) backward: both on the
        // device.
        assert!(!s.contains("host:"), "{s}");
    }
}

#[test]
fn unsorted_segment_sum_matches_the_cpu_bit_for_bit() {
    use shardc::compiler::builder::GraphBuilder;
    use shardc::ir::{Attr, Attrs, Const, DType, OpKind, Operand};
    use shardc::runtime::Tensor;
    let Some(dev) = device() else { return };
    let mut b = GraphBuilder::new("Segments");
    let x = b.input("x", DType::Float32, &[6, 5]).unwrap();
    let ids = b.input("ids", DType::Int32, &[6]).unwrap();
    let x3 = b.input("x3", DType::Float64, &[2, 3, 4]).unwrap();
    let ids2 = b.input("ids2", DType::Int64, &[2, 3]).unwrap();
    let num = |n: i64| Operand::Const(Const::Int(n));
    let sum = b
        .op(
            OpKind::UnsortedSegmentSum,
            &[x.into(), ids.into(), num(5)],
            Attrs::new(),
        )
        .unwrap();
    let sum2 = b
        .op(
            OpKind::UnsortedSegmentSum,
            &[x3.into(), ids2.into(), num(3)],
            Attrs::new(),
        )
        .unwrap();
    // A block of a result split along the segments: segments 2..4 of 6.
    let block = b
        .op(
            OpKind::UnsortedSegmentSum,
            &[x.into(), ids.into(), num(2)],
            Attrs::new()
                .with("global_shape", Attr::ints(&[6, 5]))
                .with("offset", Attr::ints(&[2, 0])),
        )
        .unwrap();
    let g = b.finish(&[sum, sum2, block]).expect("the graph builds");
    let host = Arc::new(shardc::cpu::CpuBackend::with_threads(1));
    let mut cpu = shardc::runtime::Executor::new(g.clone(), host.clone()).unwrap();
    let mut gpu = shardc::cuda::GpuExecutor::new(g, dev, host).unwrap();
    // Values whose sum depends on the order (1e8 + 1 - 1e8 is 0 in f32 that way, 1 the
    // other), repeated ids, a negative id (dropped).
    let xs: Vec<f32> = (0..30)
        .map(|i| match i % 3 {
            0 => 1e8,
            1 => 1.0 + i as f32 * 0.1,
            _ => -1e8,
        })
        .collect();
    let x3: Vec<f64> = (0..24).map(|i| (i as f64).sin() * 1e3).collect();
    let feeds = |ids: Vec<i32>| {
        vec![
            ("x", Tensor::from_f32(vec![6, 5], xs.clone()).unwrap()),
            ("ids", Tensor::from_i32(vec![6], ids).unwrap()),
            ("x3", Tensor::from_f64(vec![2, 3, 4], x3.clone()).unwrap()),
            (
                "ids2",
                Tensor::from_i64(vec![2, 3], vec![2, 0, 2, -1, 2, 1]).unwrap(),
            ),
        ]
    };
    let ok = feeds(vec![2, 0, 2, -1, 2, 3]);
    let a = cpu.step(&ok).unwrap();
    let c = gpu.step(&ok).unwrap();
    for (i, (u, v)) in a.iter().zip(&c).enumerate() {
        assert_eq!(u, v, "output {i}");
    }
    let s = gpu.stats().summary();
    assert!(!s.contains("host:"), "{s}");
    // An id not below num_segments is an error naming the op and the position.
    let err = gpu
        .step(&feeds(vec![2, 0, 7, 1, 2, 3]))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("UnsortedSegmentSum") && err.contains("position 2"),
        "{err}"
    );
}

#[test]
fn profiling_times_every_op_of_a_step_by_kind() {
    use shardc::ir::OpKind;
    use shardc::runtime::data::synthetic::SyntheticData;
    let Some(dev) = device() else { return };
    let g = train(zoo::mlp(8, &[20, 16, 4]).expect("mlp"), momentum());
    let count = |op: OpKind| g.nodes.iter().filter(|n| n.op == op).count() as u64;
    let (matmuls, updates) = (count(OpKind::MatMul), count(OpKind::ApplyMomentum));
    assert!(matmuls > 0 && updates > 0);
    let data = SyntheticData::new(&g, 1, 2).expect("data");
    let host = Arc::new(shardc::cpu::CpuBackend::with_threads(1));
    let mut exec = shardc::cuda::GpuExecutor::new(g, dev, host).expect("executor");
    exec.step(&data.feeds(0)).expect("step");
    assert!(exec.stats().op_seconds.is_empty(), "not profiled yet");
    exec.set_profiling(true);
    for s in 1..3 {
        exec.step(&data.feeds(s)).expect("step");
    }
    let st = exec.stats();
    assert_eq!(st.profiled_steps, 2);
    // Every MatMul of both profiled steps under its kind; the updates, one launch for all
    // weights, once a step.
    assert_eq!(
        st.op_seconds.get("MatMul").map(|v| v.0),
        Some(2 * matmuls),
        "{st:?}"
    );
    let group = format!("ApplyMomentum ({updates} weights, one launch)");
    assert_eq!(st.op_seconds.get(&group).map(|v| v.0), Some(2), "{st:?}");
    assert!(st.op_seconds.values().all(|&(_, s)| s >= 0.0), "{st:?}");
    assert!(st.op_seconds.values().map(|v| v.1).sum::<f64>() > 0.0);
    let s = st.summary();
    assert!(s.contains("device time:") && s.contains("MatMul"), "{s}");
    println!("{s}");
}

/// Steps after the first replay one recorded graph of the step's work: the same outputs and
/// weights, bit for bit, as launching kernel by kernel, while the weights change every step.
#[test]
fn later_steps_replay_the_recorded_step_bit_for_bit() {
    use shardc::runtime::data::synthetic::SyntheticData;
    let Some(dev) = device() else { return };
    let g = train(zoo::mlp(8, &[20, 16, 16, 4]).expect("mlp"), momentum());
    let data = SyntheticData::new(&g, 5, 2).expect("data");
    let host = Arc::new(shardc::cpu::CpuBackend::with_threads(1));
    let mut replayed =
        shardc::cuda::GpuExecutor::new(g.clone(), dev.clone(), host.clone()).expect("executor");
    let mut launched = shardc::cuda::GpuExecutor::new(g, dev, host).expect("executor");
    launched.disable_graph_replay();
    let mut losses = Vec::new();
    for s in 0..5 {
        let a = replayed.step(&data.feeds(s)).expect("step");
        let b = launched.step(&data.feeds(s)).expect("step");
        assert_eq!(a, b, "step {s}");
        losses.push(a[0].to_f64_vec()[0]);
    }
    assert_eq!(replayed.weights().unwrap(), launched.weights().unwrap());
    // The replayed steps trained: each step's loss is its own.
    losses.dedup();
    assert_eq!(losses.len(), 5, "{losses:?}");
    let (r, l) = (replayed.stats(), launched.stats());
    assert_eq!(
        (r.replayed_steps, r.no_replay.as_deref()),
        (4, None),
        "{r:?}"
    );
    assert_eq!(l.replayed_steps, 0);
    assert!(l
        .no_replay
        .as_deref()
        .unwrap()
        .contains("disable_graph_replay"));
    // A replayed step counts its ops as a launched one does.
    assert_eq!(
        (r.device_ops, r.fused_kernels),
        (l.device_ops, l.fused_kernels)
    );
    assert!(
        r.summary().contains("4 of 5 steps ran as one replay"),
        "{}",
        r.summary()
    );
}

/// A device that records but whose driver refuses every recorded graph.
struct RefusesGraphs(Arc<dyn Device>);

impl Device for RefusesGraphs {
    fn description(&self) -> String {
        self.0.description()
    }
    fn block_size(&self) -> u32 {
        self.0.block_size()
    }
    fn max_grid(&self) -> u32 {
        self.0.max_grid()
    }
    fn alloc(&self, bytes: usize) -> shardc::cuda::CudaResult<u64> {
        self.0.alloc(bytes)
    }
    fn free(&self, ptr: u64) {
        self.0.free(ptr)
    }
    fn upload(&self, dst: u64, src: &[u8]) -> shardc::cuda::CudaResult<()> {
        self.0.upload(dst, src)
    }
    fn download(&self, src: u64, dst: &mut [u8]) -> shardc::cuda::CudaResult<()> {
        self.0.download(src, dst)
    }
    fn copy(&self, dst: u64, src: u64, bytes: usize) -> shardc::cuda::CudaResult<()> {
        self.0.copy(dst, src, bytes)
    }
    fn launch(
        &self,
        name: &str,
        grid: u32,
        block: u32,
        args: &[shardc::cuda::kernels::KernelArg],
    ) -> shardc::cuda::CudaResult<()> {
        self.0.launch(name, grid, block, args)
    }
    fn gemm(&self, g: &shardc::cuda::device::Gemm) -> shardc::cuda::CudaResult<()> {
        self.0.gemm(g)
    }
    fn synchronize(&self) -> shardc::cuda::CudaResult<()> {
        self.0.synchronize()
    }
    fn load_kernels(
        &self,
        unit: &str,
        text: &str,
        names: &[String],
    ) -> shardc::cuda::CudaResult<()> {
        self.0.load_kernels(unit, text, names)
    }
    fn begin_capture(&self) -> shardc::cuda::CudaResult<bool> {
        self.0.begin_capture()
    }
    fn end_capture(&self) -> shardc::cuda::CudaResult<usize> {
        let g = self.0.end_capture()?;
        self.0.drop_graph(g);
        Err(shardc::cuda::CudaError::Other(
            "cuGraphInstantiate: refused (test)".into(),
        ))
    }
}

/// A recording the device refuses costs nothing but the replay: the step runs kernel by
/// kernel, as every later one, with the CPU's numbers and the reason in the stats.
#[test]
fn a_refused_recording_leaves_the_steps_launched_kernel_by_kernel() {
    let Some(dev) = device() else { return };
    let g = train(zoo::mlp(8, &[20, 16, 4]).expect("mlp"), momentum());
    let s = compare_on(Arc::new(RefusesGraphs(dev)), g, 4, 1e-5);
    assert!(
        s.contains("graph replay: off (the recording failed: cuGraphInstantiate: refused (test))"),
        "{s}"
    );
    assert!(!s.contains("steps ran as one replay"), "{s}");
}

/// Dropout's key changes every step: the executor writes it to device memory before each
/// step, so replayed steps draw their own masks, the CPU's.
#[test]
fn replayed_steps_with_dropout_draw_each_steps_masks() {
    use shardc::compiler::builder::GraphBuilder;
    use shardc::ir::{Attr, Attrs, DType, OpKind};
    let Some(dev) = device() else { return };
    let mut b = GraphBuilder::new("Dropped");
    let x = b.input("x", DType::Float32, &[4, 6]).unwrap();
    let d = b
        .op(
            OpKind::Dropout,
            &[x.into()],
            Attrs::new()
                .with("keep_prob", Attr::Float(0.5))
                .with("seed0", Attr::Int(3))
                .with("seed1", Attr::Int(4)),
        )
        .unwrap();
    let y = b.tuple_get_item(d, 0).unwrap();
    let g = b.finish(&[y]).unwrap();
    let data = shardc::runtime::data::synthetic::SyntheticData::new(&g, 1, 2).expect("data");
    let host = Arc::new(shardc::cpu::CpuBackend::with_threads(1));
    let mut cpu = shardc::runtime::Executor::new(g.clone(), host.clone()).expect("cpu");
    let mut exec = shardc::cuda::GpuExecutor::new(g, dev, host).expect("executor");
    let mut outs = Vec::new();
    for _ in 0..4 {
        let a = exec.step(&data.feeds(0)).expect("step");
        assert_eq!(a, cpu.step(&data.feeds(0)).expect("cpu step"));
        outs.push(a);
    }
    outs.dedup();
    assert_eq!(outs.len(), 4, "a new mask every step");
    let st = exec.stats();
    assert_eq!(
        (st.replayed_steps, st.no_replay.as_deref()),
        (3, None),
        "{st:?}"
    );
}

/// The device's recording: recorded copies run at each replay on the memory as it is then;
/// an upload while recording fails and spoils the recording, which is discarded, and the
/// device works as before.
#[test]
fn a_recording_replays_its_work_and_an_upload_spoils_it() {
    let Some(dev) = device() else { return };
    let (a, b) = (dev.alloc(8).unwrap(), dev.alloc(8).unwrap());
    let read = |p: u64| {
        let mut v = [0u8; 8];
        dev.download(p, &mut v).unwrap();
        u64::from_ne_bytes(v)
    };
    dev.upload(a, &1u64.to_ne_bytes()).unwrap();
    dev.upload(b, &0u64.to_ne_bytes()).unwrap();
    assert!(dev.begin_capture().unwrap());
    dev.copy(b, a, 8).unwrap();
    let g = dev.end_capture().unwrap();
    assert_eq!(read(b), 0, "recording ran nothing");
    dev.replay(g).unwrap();
    assert_eq!(read(b), 1);
    dev.upload(a, &7u64.to_ne_bytes()).unwrap();
    dev.replay(g).unwrap();
    assert_eq!(read(b), 7, "a replay reads the memory of its time");
    dev.drop_graph(g);

    assert!(dev.begin_capture().unwrap());
    dev.copy(b, a, 8).unwrap();
    assert!(dev.upload(a, &9u64.to_ne_bytes()).is_err());
    let e = dev.end_capture().unwrap_err();
    println!("{e}");
    dev.upload(a, &3u64.to_ne_bytes()).unwrap();
    dev.copy(b, a, 8).unwrap();
    assert_eq!(read(b), 3, "the device runs work again");
    dev.free(a);
    dev.free(b);
}

/// Adam updates sharing their scalars (the beta powers are one pair of parameters) go out as
/// one launch over a table of their weights, with the CPU's numbers.
#[test]
fn adam_updates_of_every_weight_run_as_one_launch() {
    use shardc::runtime::data::synthetic::SyntheticData;
    let Some(dev) = device() else { return };
    let adam = Optimizer::Adam {
        learning_rate: 0.01,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
    };
    let g = train(zoo::mlp(8, &[20, 16, 16, 4]).expect("mlp"), adam);
    let updates = g
        .nodes
        .iter()
        .filter(|n| n.op == shardc::ir::OpKind::Adam)
        .count();
    assert!(updates >= 6, "{updates}");
    let s = compare_on(dev.clone(), g.clone(), 3, 1e-5);
    println!("{s}");
    let data = SyntheticData::new(&g, 1, 2).expect("data");
    let host = Arc::new(shardc::cpu::CpuBackend::with_threads(1));
    let mut exec = shardc::cuda::GpuExecutor::new(g, dev, host).expect("executor");
    exec.set_profiling(true);
    exec.step(&data.feeds(0)).expect("step");
    let label = format!("Adam ({updates} weights, one launch)");
    assert_eq!(
        exec.stats().op_seconds.get(&label).map(|v| v.0),
        Some(1),
        "{:?}",
        exec.stats().op_seconds.keys().collect::<Vec<_>>()
    );
}

/// On the device a Reshape of a node's result is that result in place: the transformer's
/// Reshapes copy nothing (the plan gives each its input's buffer), with the CPU's numbers
/// (`transformer_trains_as_on_the_cpu_with_adam`).
#[test]
fn reshapes_of_node_results_are_that_result_in_place() {
    use shardc::ir::{OpKind, Operand};
    let Some(dev) = device() else { return };
    let cfg = TransformerConfig::new(1, 16, 2, 4, 2);
    let g = train(transformer(&cfg).expect("transformer"), momentum());
    let host = Arc::new(shardc::cpu::CpuBackend::with_threads(1));
    let exec = shardc::cuda::GpuExecutor::new(g.clone(), dev, host).expect("executor");
    let plan = exec.memory_plan();
    let mut aliased = 0;
    for (i, n) in g.nodes.iter().enumerate() {
        if let (OpKind::Reshape, Some(Operand::Node(src))) = (n.op, n.inputs.first()) {
            if matches!(g.nodes[src.index()].op, OpKind::Assign) {
                continue;
            }
            assert_eq!(
                plan.location(i, 0),
                plan.location(src.index(), 0),
                "{}",
                n.instance
            );
            aliased += 1;
        }
    }
    assert!(aliased >= 4, "{aliased}");
}
