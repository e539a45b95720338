//! Where a rank's graph runs: MindSpore's `set_context(device_target=...)`, one enum for the
//! library (`Model::with_device_target`) and the command line (`shardc run --device-target`).

use std::fmt;
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

/// Why `Ascend` is refused (the backend is not built yet).
pub const ASCEND_NOT_BUILT: &str =
    "the Ascend backend is not built; shardc runs on CPU and on NVIDIA GPUs (CPU or GPU)";

/// A device target name that is not one.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("device_target {name:?}: {reason}")]
pub struct DeviceTargetError {
    /// The name given.
    pub name: String,
    /// Why it is refused.
    pub reason: String,
}

impl DeviceTarget {
    /// Whether the CUDA backend (real or emulated) runs the graphs.
    pub fn is_gpu(self) -> bool {
        matches!(self, DeviceTarget::Gpu { .. } | DeviceTarget::GpuEmulated)
    }
}

impl FromStr for DeviceTarget {
    type Err = DeviceTargetError;

    /// `CPU`, `GPU` (any case), `GPU-emulated`; `Ascend` is refused with the reason.
    fn from_str(s: &str) -> Result<Self, DeviceTargetError> {
        let refuse = |reason: &str| DeviceTargetError {
            name: s.to_string(),
            reason: reason.to_string(),
        };
        match s.to_ascii_lowercase().as_str() {
            "cpu" => Ok(DeviceTarget::Cpu),
            "gpu" => Ok(DeviceTarget::Gpu { device_id: None }),
            "gpu-emulated" => Ok(DeviceTarget::GpuEmulated),
            "ascend" => Err(refuse(ASCEND_NOT_BUILT)),
            _ => Err(refuse("expected CPU, GPU or GPU-emulated")),
        }
    }
}

impl fmt::Display for DeviceTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceTarget::Cpu => f.write_str("CPU"),
            DeviceTarget::Gpu { device_id: None } => f.write_str("GPU"),
            DeviceTarget::Gpu {
                device_id: Some(id),
            } => write!(f, "GPU (device {id})"),
            DeviceTarget::GpuEmulated => f.write_str("GPU-emulated"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_ascend_is_refused_with_the_reason() {
        assert_eq!("cpu".parse(), Ok(DeviceTarget::Cpu));
        assert_eq!("GPU".parse(), Ok(DeviceTarget::Gpu { device_id: None }));
        assert_eq!("GPU-emulated".parse(), Ok(DeviceTarget::GpuEmulated));
        let e = "Ascend".parse::<DeviceTarget>().unwrap_err().to_string();
        assert!(e.contains("the Ascend backend is not built"), "{e}");
        let e = "TPU".parse::<DeviceTarget>().unwrap_err().to_string();
        assert_eq!(
            e,
            "device_target \"TPU\": expected CPU, GPU or GPU-emulated"
        );
        assert!(DeviceTarget::GpuEmulated.is_gpu() && !DeviceTarget::Cpu.is_gpu());
    }
}
