//! The flags of `shardc run` ([`RunArgs`]), with the communicator and device choices they
//! hold: what every way of running an artifact (one process, in-process ranks, a cluster
//! rank, a GPU) reads.

use clap::{Args, ValueEnum};
use shardc_runtime::DeviceTarget;
use std::path::PathBuf;

/// Arguments of `shardc run`.
#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// The artifact directory written by `shardc compile`.
    pub artifact: PathBuf,
    /// Number of training steps.
    #[arg(long, default_value_t = 10)]
    pub steps: u64,
    /// Steps per epoch (for the `epoch: E step: S` lines); default: the data pool size (with
    /// `--data`, the file's batches).
    #[arg(long)]
    pub steps_per_epoch: Option<u64>,
    /// Seed of the synthetic data.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Number of distinct synthetic batches, cycled.
    #[arg(long, default_value_t = 8)]
    pub data_pool: usize,
    /// Start from the weights of this checkpoint (MindSpore's `.ckpt`, or a whole-model
    /// `.safetensors`), matched by parameter name: every trainable weight must be there with
    /// its global shape, and every tensor of the file must be the model's (MindSpore's
    /// `global_step`, `learning_rate`, ... aside); each rank takes its block.
    #[arg(long, conflicts_with = "resume_from")]
    pub init_from: Option<PathBuf>,
    /// Rules renaming `--init-from`'s tensors to the model's parameters, one `checkpoint name
    /// = model name` per line (`backbone.* = *` for a prefix); PyTorch's and MindSpore's
    /// conventions (`weight`/`gamma`, `running_var`/`moving_variance`) apply without it.
    #[arg(long, conflicts_with = "resume_from")]
    pub name_map: Option<PathBuf>,
    /// Train on the arrays of this data file (`.npz`, `.npy` or `.safetensors`): one array per
    /// model input, named after it, its first dimension the sample (NumPy's `np.savez(path,
    /// x=..., label=...)`). The samples are cut into global batches in order (the last
    /// partial one dropped) and cycled; each rank feeds its block, as with synthetic data.
    #[arg(long, conflicts_with = "mnist")]
    pub data: Option<PathBuf>,
    /// Train on MNIST idx files in this directory (`train-images-idx3-ubyte`,
    /// `train-labels-idx1-ubyte`) instead of synthetic data. The model's first input must be
    /// `(batch, 784)` Float32 and its second `(batch)` Int32.
    #[arg(long)]
    pub mnist: Option<PathBuf>,
    /// Kernel threads (0 = all cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Print the memory plan and per-op timings at the end.
    #[arg(long)]
    pub stats: bool,
    /// The communicator between worker processes: `native` (shared memory within a host,
    /// TCP between hosts; ranks from the scheduler) or `mpi` (under `mpirun`; needs a build
    /// with `--features mpi`).
    #[arg(long, value_enum, default_value_t = CommKind::Native)]
    pub comm: CommKind,
    /// Checkpoints: saving, keeping, resuming.
    #[command(flatten)]
    pub checkpoint: crate::ckpt::CheckpointArgs,
    /// The device: CPU or GPU.
    #[command(flatten)]
    pub device: DeviceArgs,
}

/// Which communicator a worker process uses.
#[derive(Clone, Copy, Debug, Default, ValueEnum, PartialEq, Eq)]
pub enum CommKind {
    /// shardc's own: shared memory between processes of one host, TCP between hosts.
    #[default]
    Native,
    /// MPI (started by `mpirun`; a build with `--features mpi`).
    Mpi,
}

/// Which device runs the CUDA backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum GpuKind {
    /// A real GPU through the CUDA driver.
    Cuda,
    /// The kernels compiled for the host and emulated (no GPU needed; for testing).
    Emulator,
}

/// How a cluster rank's collectives reach the other GPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum GpuComm {
    /// NCCL, its unique id handed out over the cluster's communicator.
    Nccl,
    /// The cluster's communicator (`--comm`), tensors staged through host memory.
    Host,
}

/// How a cluster rank's collectives reach the other NPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum NpuComm {
    /// HCCL, its root info handed out over the cluster's communicator.
    Hccl,
    /// The cluster's communicator (`--comm`), tensors staged through host memory.
    Host,
}

/// The device flags of `shardc run`.
#[derive(Args, Debug, Clone)]
pub struct DeviceArgs {
    /// Where to run: CPU (default), GPU (the CUDA backend) or Ascend (AscendCL, aclnn, HCCL).
    #[arg(long, default_value = "CPU", value_parser = device_target_parser())]
    pub device_target: DeviceTarget,
    /// The GPU or NPU to use (default: on Ascend `DEVICE_ID`, else the rank table's device
    /// (`RANK_TABLE_FILE`); else the rank on this host modulo the devices, 0 for one device).
    #[arg(long)]
    pub device_id: Option<usize>,
    /// `cuda` (a real GPU) or `emulator` (the GPU kernels emulated on the host, for tests).
    #[arg(long, value_enum, default_value_t = GpuKind::Cuda)]
    pub gpu: GpuKind,
    /// Collectives of a cluster rank on the GPU: `nccl` or `host` (staged through `--comm`).
    #[arg(long, value_enum, default_value_t = GpuComm::Nccl)]
    pub gpu_comm: GpuComm,
    /// Collectives of a cluster rank on Ascend: `hccl` or `host` (staged through `--comm`).
    #[arg(long, value_enum, default_value_t = NpuComm::Hccl)]
    pub npu_comm: NpuComm,
}

impl DeviceArgs {
    /// The device target these flags name: `--device-target GPU` with `--gpu emulator` is
    /// the emulated GPU, with `--gpu cuda` the GPU `--device-id`; `Ascend` the NPU
    /// `--device-id`.
    pub fn target(&self) -> DeviceTarget {
        match (self.device_target, self.gpu) {
            (DeviceTarget::Cpu, _) => DeviceTarget::Cpu,
            (DeviceTarget::Ascend { .. }, _) => DeviceTarget::Ascend {
                device_id: self.device_id,
            },
            (_, GpuKind::Emulator) => DeviceTarget::GpuEmulated,
            (_, GpuKind::Cuda) => DeviceTarget::Gpu {
                device_id: self.device_id,
            },
        }
    }
}

/// `--device-target`: CPU, GPU or Ascend (any case), parsed into the runtime's
/// [`DeviceTarget`].
fn device_target_parser() -> impl clap::builder::TypedValueParser<Value = DeviceTarget> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
    PossibleValuesParser::new([
        PossibleValue::new("CPU").alias("cpu"),
        PossibleValue::new("GPU").alias("gpu"),
        PossibleValue::new("Ascend").alias("ascend"),
    ])
    .try_map(|s| s.parse::<DeviceTarget>())
}
