//! Where a [`super::Model`] runs: MindSpore's `set_context(device_target=...)`.

use super::TrainError;
use std::str::FromStr;

/// The device a model's graphs run on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DeviceTarget {
    /// The CPU backend (the default).
    #[default]
    Cpu,
    /// An NVIDIA GPU through the CUDA backend; collectives through NCCL.
    Gpu {
        /// The GPU; None: the rank on its host modulo the GPUs (MindSpore's `device_id`).
        device_id: Option<usize>,
    },
    /// The CUDA backend's kernels emulated on the host, collectives through the cluster's
    /// communicator (for tests on machines without a GPU).
    GpuEmulated,
}

impl FromStr for DeviceTarget {
    type Err = TrainError;

    /// `CPU`, `GPU` (any case), `GPU-emulated`; `Ascend` is refused with the reason.
    fn from_str(s: &str) -> Result<Self, TrainError> {
        match s.to_ascii_lowercase().as_str() {
            "cpu" => Ok(DeviceTarget::Cpu),
            "gpu" => Ok(DeviceTarget::Gpu { device_id: None }),
            "gpu-emulated" => Ok(DeviceTarget::GpuEmulated),
            "ascend" => Err(TrainError::Mismatch(
                "device_target Ascend: the Ascend backend is not built; shardc runs on CPU and NVIDIA GPUs".into(),
            )),
            other => Err(TrainError::Mismatch(format!(
                "device_target {other:?}: expected CPU, GPU or GPU-emulated"
            ))),
        }
    }
}
