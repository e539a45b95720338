//! Whole training steps of the tutorial networks on the emulated Ascend device against the
//! CPU executor: the MLP and the quickstart network with Momentum, the transformer with Adam.

mod common;

use shardc_compiler::transformer::{transformer, TransformerConfig};
use shardc_compiler::zoo;
use shardc_passes::autodiff::Optimizer;

#[test]
fn mlp_trains_as_on_the_cpu() {
    let g = common::train(
        zoo::mlp(8, &[20, 16, 16, 4]).expect("mlp"),
        common::momentum(),
    );
    let s = common::compare(g, 3, 1e-5);
    println!("{s}");
    for op in [
        "MatMul",
        "ApplyMomentum",
        "SparseSoftmaxCrossEntropyWithLogits",
        "ReLU",
    ] {
        assert!(
            !s.contains(&format!("host: {op} ")),
            "{op} ran on the host: {s}"
        );
    }
}

#[test]
fn quickstart_trains_as_on_the_cpu() {
    let g = common::train(zoo::quickstart(4).expect("quickstart"), common::momentum());
    let s = common::compare(g, 2, 1e-5);
    println!("{s}");
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
    // The losses to 1e-5, the weights to 1e-4 (see `common::compare_with`).
    let s = common::compare_with(common::train(g, adam), 2, 1e-5, 1e-4);
    println!("{s}");
    for op in [
        "Softmax",
        "LayerNorm",
        "BatchMatMul",
        "GeLU",
        "Adam",
        "LayerNormGrad",
    ] {
        assert!(
            !s.contains(&format!("host: {op} ")),
            "{op} ran on the host: {s}"
        );
    }
}

#[test]
fn lenet_trains_as_on_the_cpu_with_convolutions_on_the_device() {
    let g = common::train(zoo::lenet(2).expect("lenet"), common::momentum());
    let s = common::compare(g, 2, 1e-5);
    println!("{s}");
    for op in [
        "Conv2D",
        "Conv2DBackpropInput",
        "Conv2DBackpropFilter",
        "MaxPool",
        "MaxPoolGrad",
    ] {
        assert!(
            !s.contains(&format!("host: {op} ")),
            "{op} ran on the host: {s}"
        );
    }
}

#[test]
fn resnet18_trains_a_step_as_on_the_cpu() {
    let g = common::train(zoo::resnet18_cifar(1).expect("resnet"), common::momentum());
    let s = common::compare(g, 1, 1e-4);
    println!("{s}");
    for op in ["BatchNorm", "BatchNormGrad", "Conv2D"] {
        assert!(
            !s.contains(&format!("host: {op} ")),
            "{op} ran on the host: {s}"
        );
    }
}

#[test]
fn profiling_times_every_op_kind_of_a_step() {
    use shardc_backend_ascend::AscendExecutor;
    use shardc_runtime::data::synthetic::SyntheticData;
    let g = common::train(zoo::mlp(4, &[8, 8, 2]).expect("mlp"), common::momentum());
    let data = SyntheticData::new(&g, 3, 1).expect("data");
    let host = std::sync::Arc::new(shardc_backend_cpu::CpuBackend::with_threads(1));
    let mut e = AscendExecutor::new(g, common::device(0), host).expect("executor");
    e.set_profiling(true);
    e.step(&data.feeds(0)).expect("step");
    let s = e.stats().summary();
    assert!(s.contains("device time") && s.contains("MatMul"), "{s}");
    assert_eq!(e.stats().profiled_steps, 1);
    assert!(e.memory_plan().buffers.len() > 1);
}

#[test]
fn the_embedding_network_trains_as_on_the_cpu() {
    let g =
        shardc_compiler::generated::embedding_net(4, 50, 8, 3, &[16, 4]).expect("embedding net");
    let s = common::compare(common::train(g, common::momentum()), 2, 1e-5);
    println!("{s}");
    // Gather forward, UnsortedSegmentSum (the table's gradient) backward: both on the device.
    assert!(!s.contains("host:"), "{s}");
}
