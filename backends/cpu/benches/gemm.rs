//! GEMM and Conv2D throughput of the CPU backend (`cargo bench -p shardc-backend-cpu --bench gemm`).
//!
//! One line per case, `key=value` fields, easy to parse:
//!
//! ```text
//! gemm f32 n=512 threads=1 gflops=123.4 ms=2.175
//! conv2d f32 n=32 c=64 hw=32 k=3 threads=1 gflops=98.7 ms=24.5
//! ```
//!
//! Each figure is the best of several timed runs after one warm-up run (at least 3 runs and
//! about 0.5 s per case). `--quick` runs each case only twice.

use shardc_backend_cpu::{sgemm, CpuBackend, MatRef};
use shardc_ir::{Attr, Const, DType, Node, OpKind, Operand, TensorType, Type};
use shardc_runtime::{Arg, Backend, KernelContext, Tensor};
use std::time::{Duration, Instant};

/// Best wall time of `f` over the repetitions.
fn best_time(quick: bool, mut f: impl FnMut()) -> Duration {
    f();
    let mut best = Duration::MAX;
    let mut total = Duration::ZERO;
    let mut runs = 0;
    while runs < 2 || (!quick && (runs < 3 || total < Duration::from_millis(500))) {
        let t = Instant::now();
        f();
        let d = t.elapsed();
        best = best.min(d);
        total += d;
        runs += 1;
    }
    best
}

/// Deterministic pseudo-random values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            ((s.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn pool(threads: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("a rayon pool for the benchmark")
}

fn bench_gemm(quick: bool) {
    for n in [256usize, 512, 1024, 2048] {
        let a = values(n * n, 1);
        let b = values(n * n, 2);
        let mut c = vec![0f32; n * n];
        for threads in [1usize, 2] {
            let p = pool(threads);
            let t = p.install(|| {
                best_time(quick, || {
                    sgemm(
                        n,
                        n,
                        n,
                        MatRef::new(&a, n),
                        MatRef::new(&b, n),
                        &mut c,
                        threads,
                    )
                    .expect("sgemm operands fit");
                })
            });
            let flops = 2.0 * (n as f64).powi(3);
            println!(
                "gemm f32 n={n} threads={threads} gflops={:.1} ms={:.3}",
                flops / t.as_secs_f64() / 1e9,
                t.as_secs_f64() * 1e3
            );
        }
    }
}

fn conv_node(op: OpKind, out: &[usize]) -> Node {
    let mut node = Node::new(op, vec![]);
    node.instance = "bench".into();
    node.attrs.set("out_channel", Attr::Int(64));
    node.attrs.set("kernel_size", Attr::Int(3));
    node.attrs.set("pad_mode", Attr::Str("same".into()));
    node.ty = Type::Tensor(TensorType::new(DType::Float32, out.to_vec()));
    node.inputs = vec![Operand::Const(Const::Int(0)); 2];
    node
}

fn bench_conv(quick: bool) {
    let (n, c, hw, k) = (32usize, 64usize, 32usize, 3usize);
    let xs = vec![n, c, hw, hw];
    let ws = vec![c, c, k, k];
    let x = Tensor::from_f32(xs.clone(), values(n * c * hw * hw, 3)).expect("x");
    let w = Tensor::from_f32(ws.clone(), values(c * c * k * k, 4)).expect("w");
    let dy = Tensor::from_f32(xs.clone(), values(n * c * hw * hw, 5)).expect("dy");
    let flops = 2.0 * (n * c * hw * hw * c * k * k) as f64;
    let xs_c = Const::Ints(xs.iter().map(|&d| d as i64).collect());
    let ws_c = Const::Ints(ws.iter().map(|&d| d as i64).collect());
    let cases: [(&str, OpKind, Vec<Arg<'_>>, &[usize]); 3] = [
        (
            "conv2d",
            OpKind::Conv2D,
            vec![Arg::Tensor(&x), Arg::Tensor(&w)],
            &xs,
        ),
        (
            "conv2d_backprop_input",
            OpKind::Conv2DBackpropInput,
            vec![Arg::Tensor(&dy), Arg::Tensor(&w), Arg::Const(&xs_c)],
            &xs,
        ),
        (
            "conv2d_backprop_filter",
            OpKind::Conv2DBackpropFilter,
            vec![Arg::Tensor(&dy), Arg::Tensor(&x), Arg::Const(&ws_c)],
            &ws,
        ),
    ];
    for (name, op, args, out_shape) in cases {
        let node = conv_node(op, out_shape);
        for threads in [1usize, 2] {
            let backend = CpuBackend::with_threads(threads);
            let mut out = vec![Tensor::zeros(&TensorType::new(
                DType::Float32,
                out_shape.to_vec(),
            ))];
            let ctx = KernelContext::default();
            let t = best_time(quick, || {
                backend
                    .run(&node, &args, &mut out, &ctx)
                    .expect("the benchmark's conv runs");
            });
            println!(
                "{name} f32 n={n} c={c} hw={hw} k={k} threads={threads} gflops={:.1} ms={:.3}",
                flops / t.as_secs_f64() / 1e9,
                t.as_secs_f64() * 1e3
            );
        }
    }
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    bench_gemm(quick);
    bench_conv(quick);
}
