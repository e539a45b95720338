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
    /// A Huawei Ascend NPU through AscendCL and aclnn; collectives through HCCL. The CANN
    /// libraries are opened at run time (`ASCEND_HOME_PATH`, `SHARDC_ASCEND_LIB_DIRS`).
    Ascend {
        /// The NPU; None: `DEVICE_ID`, else the rank table's device of this rank, else the
        /// rank on its host modulo the NPUs (MindSpore's `device_id`).
        device_id: Option<usize>,
    },
}

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

    /// Whether the Ascend backend runs the graphs.
    pub fn is_ascend(self) -> bool {
        matches!(self, DeviceTarget::Ascend { .. })
    }
}

impl FromStr for DeviceTarget {
    type Err = DeviceTargetError;

    /// `CPU`, `GPU`, `GPU-emulated`, `Ascend` (any case).
    fn from_str(s: &str) -> Result<Self, DeviceTargetError> {
        let refuse = |reason: &str| DeviceTargetError {
            name: s.to_string(),
            reason: reason.to_string(),
        };
        match s.to_ascii_lowercase().as_str() {
            "cpu" => Ok(DeviceTarget::Cpu),
            "gpu" => Ok(DeviceTarget::Gpu { device_id: None }),
            "gpu-emulated" => Ok(DeviceTarget::GpuEmulated),
            "ascend" => Ok(DeviceTarget::Ascend { device_id: None }),
            _ => Err(refuse("expected CPU, GPU, GPU-emulated or Ascend")),
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
            DeviceTarget::Ascend { device_id: None } => f.write_str("Ascend"),
            DeviceTarget::Ascend {
                device_id: Some(id),
            } => write!(f, "Ascend (device {id})"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_an_unknown_one_is_refused_with_the_choices() {
        assert_eq!("cpu".parse(), Ok(DeviceTarget::Cpu));
        assert_eq!("GPU".parse(), Ok(DeviceTarget::Gpu { device_id: None }));
        assert_eq!("GPU-emulated".parse(), Ok(DeviceTarget::GpuEmulated));
        assert_eq!(
            "Ascend".parse(),
            Ok(DeviceTarget::Ascend { device_id: None })
        );
        assert_eq!(
            "ascend".parse::<DeviceTarget>().map(|t| t.is_ascend()),
            Ok(true)
        );
        let e = "TPU".parse::<DeviceTarget>().unwrap_err().to_string();
        assert_eq!(
            e,
            "device_target \"TPU\": expected CPU, GPU, GPU-emulated or Ascend"
        );
        assert!(DeviceTarget::GpuEmulated.is_gpu() && !DeviceTarget::Cpu.is_gpu());
    }
}
