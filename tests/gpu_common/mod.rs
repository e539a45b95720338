//! What the GPU backend's tests share: the device the kernel tests run on, and training steps on a device
//! against the CPU executor.

#![allow(dead_code)]

pub mod nccl_ranks;

// Every test that uses this module also declares `mod device_common;` and
// `mod invariant_common;`.
#[allow(unused_imports)]
pub use crate::device_common::{close, momentum, train};

use shardc::cpu::CpuBackend;
use shardc::cuda::cuda::CudaDevice;
use shardc::cuda::emulator::EmulatedDevice;
use shardc::cuda::{Device, GpuExecutor};
use shardc::ir::Graph;
use std::sync::{Arc, OnceLock};

/// The environment variable that moves the kernel tests onto a real GPU: with
/// `SHARDC_TEST_DEVICE=cuda`, [`kernel_test_device`] is GPU 0 instead of the emulator, so the
/// emulated suites (`cuda_emulated`, `cuda_conv_emulated`) check every kernel on the GPU
/// against the CPU executor (`scripts/gpu-check.sh` runs them so).
pub const TEST_DEVICE_ENV: &str = "SHARDC_TEST_DEVICE";

/// The device the kernel tests run on (built once per test binary): the host emulator, or
/// None with a SKIP message where no C++20 compiler is found; GPU 0 where
/// `SHARDC_TEST_DEVICE=cuda` (a test fails, naming the missing library, where that GPU
/// cannot be opened: the variable asks for it).
pub fn kernel_test_device() -> Option<Arc<dyn Device>> {
    static DEV: OnceLock<Option<Arc<dyn Device>>> = OnceLock::new();
    DEV.get_or_init(|| match std::env::var(TEST_DEVICE_ENV).as_deref() {
        Ok("cuda") => match CudaDevice::new(0) {
            Ok(d) => {
                eprintln!("kernel tests on {}", d.description());
                Some(Arc::new(d) as Arc<dyn Device>)
            }
            Err(e) => panic!("{TEST_DEVICE_ENV}=cuda: {e}"),
        },
        Ok("emulator") | Err(_) => match EmulatedDevice::new(64) {
            Ok(d) => Some(Arc::new(d) as Arc<dyn Device>),
            Err(e) => {
                eprintln!("SKIP: the kernel emulator cannot be built here: {e}");
                None
            }
        },
        Ok(other) => panic!("{TEST_DEVICE_ENV}={other}: expected cuda or emulator"),
    })
    .clone()
}

/// Runs `steps` steps on the CPU and on `dev`; compares every output of every step (to `tol`)
/// and every weight after the last (to `weight_tol`). Returns the GPU executor's stats
/// summary.
pub fn compare_on_with(
    dev: Arc<dyn Device>,
    g: Graph,
    steps: u64,
    tol: f64,
    weight_tol: f64,
) -> String {
    compare_steps(dev, g, steps, tol, weight_tol, false)
}

/// [`compare_on`] for nets too badly conditioned to train side by side (deep nets with
/// BatchNorm over a few images: on the CPU alone, a change of 1e-7 in ResNet-18's weights
/// moves its second loss by 2e-4 and its third by 2e-2): before each step after the first,
/// the CPU takes the device's weights (and optimizer state), so every step is compared from
/// the same start. Every output to `tol`, the weights after the last step to `weight_tol`.
pub fn compare_each_step_on(
    dev: Arc<dyn Device>,
    g: Graph,
    steps: u64,
    tol: f64,
    weight_tol: f64,
) -> String {
    compare_steps(dev, g, steps, tol, weight_tol, true)
}

fn compare_steps(
    dev: Arc<dyn Device>,
    g: Graph,
    steps: u64,
    tol: f64,
    weight_tol: f64,
    resync: bool,
) -> String {
    let cpu_backend = Arc::new(CpuBackend::with_threads(1));
    let mut gpu = GpuExecutor::new(g.clone(), dev, cpu_backend).expect("gpu executor");
    crate::device_common::compare_steps_on(&mut gpu, &g, steps, tol, weight_tol, resync);
    gpu.stats().summary()
}

/// [`compare_on_with`] with one tolerance.
pub fn compare_on(dev: Arc<dyn Device>, g: Graph, steps: u64, tol: f64) -> String {
    compare_on_with(dev, g, steps, tol, tol)
}
