//! The Ascend backend on the emulated CANN (`shardc-ascend-emulator`: AscendCL, aclnn and
//! HCCL's C API exported by a library of this project, which the backend opens as it would
//! open CANN's, and whose aclnn operators are its own reference loops, not shardc's CPU
//! kernels): whole training steps of the models of the CUDA emulated suites against the CPU
//! executor, and HCCL between ranks of one process through the communicator conformance
//! suite and data- and model-parallel training.

mod ascend_common;
mod device_common;

use device_common::{compare_steps_on, momentum, small_resnet18, train};
use shardc::ascend::{AscendDevice, AscendExecutor};
use shardc::compiler::transformer::{transformer, TransformerConfig};
use shardc::compiler::zoo;
use shardc::cpu::CpuBackend;
use shardc::ir::Graph;
use shardc::passes::autodiff::Optimizer;
use std::sync::Arc;

/// `steps` training steps of `g` on emulated NPU 0 against the CPU; returns the executor's
/// report (memory plan and counts: which ops ran on the host).
fn compare(g: Graph, steps: u64, tol: f64, resync: bool) -> String {
    ascend_common::cann_dir();
    let dev = AscendDevice::open(0).expect("NPU 0");
    let host = Arc::new(CpuBackend::with_threads(1));
    let mut exec = AscendExecutor::new(g.clone(), dev, host).expect("ascend executor");
    compare_steps_on(&mut exec, &g, steps, tol, tol, resync);
    let s = exec.stats().summary();
    println!("{s}");
    s
}

fn adam() -> Optimizer {
    Optimizer::Adam {
        learning_rate: 0.01,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
    }
}

#[test]
fn mlp_trains_as_on_the_cpu() {
    let s = compare(
        train(zoo::mlp(8, &[20, 16, 16, 4]).expect("mlp"), momentum()),
        3,
        1e-5,
        false,
    );
    assert!(!s.contains("host:"), "{s}");
}

#[test]
fn quickstart_trains_as_on_the_cpu() {
    let s = compare(
        train(zoo::quickstart(4).expect("quickstart"), momentum()),
        3,
        1e-5,
        false,
    );
    assert!(!s.contains("host:"), "{s}");
}

#[test]
fn transformer_trains_as_on_the_cpu_with_adam() {
    let g = transformer(&TransformerConfig::new(1, 16, 2, 4, 2)).expect("transformer");
    let s = compare(train(g, adam()), 2, 1e-4, false);
    for op in ["Softmax", "LayerNorm", "BatchMatMul", "MatMul", "GeLU"] {
        assert!(
            !s.contains(&format!("host: {op} ")),
            "{op} ran on the host: {s}"
        );
    }
}

#[test]
fn lenet_trains_as_on_the_cpu_with_convolutions_on_the_device() {
    compare(
        train(zoo::lenet(2).expect("lenet"), momentum()),
        2,
        1e-4,
        false,
    );
}

#[test]
fn a_small_resnet18_with_batch_norm_trains_as_on_the_cpu() {
    let s = compare(train(small_resnet18(2), momentum()), 2, 1e-4, true);
    assert!(
        !s.contains("host:"),
        "convolutions, BatchNorms and pools on the device: {s}"
    );
}
