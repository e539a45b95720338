//! The CUDA backend on the emulated device (its kernel sources compiled for the host, see
//! `backends/cuda/src/emulator.rs`): whole training steps of real models against the CPU
//! executor. Kernel choice, arguments, grids, the GEMM mapping, the memory plan, host
//! fallback and Assign all run as on a GPU; only the driver, cuBLAS and NCCL calls do not.
//! Skips with a message where no C++20 compiler is found. `tests/cuda_gpu.rs` runs the same
//! models on a real GPU.

mod gpu_common;

use gpu_common::{compare_on, momentum, train};
use shardc::compiler::transformer::{transformer, TransformerConfig};
use shardc::compiler::zoo;
use shardc::cuda::emulator::EmulatedDevice;
use shardc::cuda::Device;
use shardc::ir::Graph;
use shardc::passes::autodiff::Optimizer;
use std::sync::{Arc, OnceLock};

fn device() -> Option<Arc<dyn Device>> {
    static DEV: OnceLock<Option<Arc<EmulatedDevice>>> = OnceLock::new();
    let d = DEV.get_or_init(|| match EmulatedDevice::new(64) {
        Ok(d) => Some(Arc::new(d)),
        Err(e) => {
            eprintln!("SKIP: the kernel emulator cannot be built here: {e}");
            None
        }
    });
    d.clone().map(|d| d as Arc<dyn Device>)
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
            assert!(!s.contains(&format!("host: {op} ")), "{op} ran on the host: {s}");
        }
    }
}

#[test]
fn lenet_with_convolutions_runs_them_on_the_host_and_still_matches() {
    let g = train(zoo::lenet(2).expect("lenet"), momentum());
    if let Some(s) = compare(g, 1, 1e-4) {
        println!("{s}");
        assert!(s.contains("host: Conv2D"), "{s}");
    }
}
