//! Test support: the emulator of CANN's C API (`shardc-ascend-emulator`, built by cargo as a
//! cdylib next to the test binary) put where the backend's loader finds it, and the CPU
//! comparison helpers.
#![allow(dead_code)]

use shardc_backend_ascend::{AscendDevice, AscendExecutor};
use shardc_backend_cpu::CpuBackend;
use shardc_compiler::pipeline::{compile, CompileOptions};
use shardc_ir::Graph;
use shardc_passes::autodiff::Optimizer;
use shardc_runtime::data::synthetic::SyntheticData;
use shardc_runtime::{Executor, Tensor};
use std::sync::{Arc, Once};

/// Stages the emulator under CANN's library names (`shardc_ascend_emulator::install`, one
/// folder per build) and points `SHARDC_ASCEND_LIB_DIRS` at it (once per test binary, before
/// the first load).
pub fn use_emulator() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        use shardc_ascend_emulator::install::{stage_as_cann, staging_dir};
        let dir = staging_dir()
            .and_then(|d| stage_as_cann(&d))
            .unwrap_or_else(|e| panic!("staging the CANN emulator: {e}"));
        std::env::set_var("SHARDC_ASCEND_LIB_DIRS", &dir);
        std::env::remove_var("ASCEND_HOME_PATH");
        std::env::remove_var("ASCEND_TOOLKIT_HOME");
    });
}

/// Emulated device `id`.
pub fn device(id: usize) -> Arc<AscendDevice> {
    use_emulator();
    AscendDevice::open(id).unwrap_or_else(|e| panic!("emulated device {id}: {e}"))
}

/// The training step of `g` with `optimizer`.
pub fn train(g: Graph, optimizer: Optimizer) -> Graph {
    let opts = CompileOptions {
        optimizer: Some(optimizer),
        ..Default::default()
    };
    compile(g, &opts).expect("compiles").graph
}

/// Momentum(0.05, 0.9).
pub fn momentum() -> Optimizer {
    Optimizer::Momentum {
        learning_rate: 0.05,
        momentum: 0.9,
        use_nesterov: false,
    }
}

/// Whether `a` and `b` agree to `tol` relative to max(|a|, |b|, 1), NaN where the other is.
pub fn close(a: &Tensor, b: &Tensor, tol: f64) -> Result<(), String> {
    if a.shape != b.shape || a.dtype() != b.dtype() {
        return Err(format!("{} and {}", a.ty(), b.ty()));
    }
    let (x, y) = (a.to_f64_vec(), b.to_f64_vec());
    for (i, (u, v)) in x.iter().zip(&y).enumerate() {
        let scale = u.abs().max(v.abs()).max(1.0);
        if (u - v).abs() > tol * scale || u.is_nan() != v.is_nan() {
            return Err(format!("element {i}: {u} vs {v}"));
        }
    }
    Ok(())
}

/// Runs `steps` steps of `g` on the CPU and on emulated device 0 with the same synthetic
/// data; compares every output of every step and every weight after the last (to `tol`).
/// Returns the Ascend executor's stats summary.
pub fn compare(g: Graph, steps: u64, tol: f64) -> String {
    compare_with(g, steps, tol, tol)
}

/// [`compare`] with the weights after the last step compared to `weight_tol` (Adam amplifies
/// the last bits of near-zero gradients: `m / (sqrt(v) + eps)` is about `sign(g)` there, as
/// the CUDA emulated suite allows for too).
pub fn compare_with(g: Graph, steps: u64, tol: f64, weight_tol: f64) -> String {
    let dev = device(0);
    let data = SyntheticData::new(&g, 7, 2).expect("synthetic data");
    let cpu_backend = Arc::new(CpuBackend::with_threads(1));
    let mut cpu = Executor::new(g.clone(), cpu_backend.clone()).expect("cpu executor");
    let mut asc = AscendExecutor::new(g.clone(), dev, cpu_backend).expect("ascend executor");
    for s in 0..steps {
        let feeds = data.feeds(s);
        let a = cpu.step(&feeds).expect("cpu step");
        let b = asc
            .step(&feeds)
            .unwrap_or_else(|e| panic!("{}: ascend step {s}: {e}", g.name));
        assert_eq!(a.len(), b.len());
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            if let Err(e) = close(x, y, tol) {
                panic!("{}: step {s}, output {i}: {e}", g.name);
            }
        }
    }
    let aw = asc.weights().expect("weights");
    for (name, w) in &aw {
        let c = cpu.param(name).expect("the cpu has the weight");
        if let Err(e) = close(c, w, weight_tol) {
            panic!("{}: weight {name} after {steps} steps: {e}", g.name);
        }
    }
    asc.stats().summary()
}
