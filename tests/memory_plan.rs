//! The executor's memory plan on the real training steps: buffers are reused so that the
//! planned peak stays within 1.5x of the live tensors at the worst point of the schedule.

use shardc::compiler::pipeline::{compile, CompileOptions};
use shardc::compiler::zoo;
use shardc::ir::Graph;
use shardc::passes::autodiff::Optimizer;
use shardc::runtime::memory::plan;

fn train(g: Graph) -> Graph {
    let opts = CompileOptions {
        optimizer: Some(Optimizer::Sgd {
            learning_rate: 0.01,
            momentum: 0.9,
            dampening: 0.0,
            weight_decay: 0.0,
            nesterov: false,
        }),
        dump_dir: None,
        ..Default::default()
    };
    compile(g, &opts).expect("compiles").graph
}

#[test]
fn mlp_step_peak_is_within_one_and_a_half_times_the_live_peak() {
    let g = train(zoo::mlp(32, &[784, 512, 512, 10]).expect("mlp builds"));
    let p = plan(&g);
    let all: usize = g.nodes.iter().map(|n| n.ty.size_bytes()).sum();
    assert!(p.live_peak_bytes > 0);
    assert!(
        p.peak_bytes as f64 <= 1.5 * p.live_peak_bytes as f64,
        "peak {} vs live peak {}",
        p.peak_bytes,
        p.live_peak_bytes
    );
    assert!(
        p.peak_bytes < all,
        "buffers are reused: {} of {all}",
        p.peak_bytes
    );
}

#[test]
fn resnet_and_quickstart_steps_reuse_buffers_too() {
    for g in [
        zoo::quickstart(16).expect("quickstart builds"),
        zoo::resnet18_cifar(2).expect("resnet builds"),
    ] {
        let g = train(g);
        let p = plan(&g);
        assert!(
            p.peak_bytes as f64 <= 1.5 * p.live_peak_bytes as f64,
            "{}: peak {} vs live peak {}",
            g.name,
            p.peak_bytes,
            p.live_peak_bytes
        );
    }
}
