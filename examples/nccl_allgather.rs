//! The GPU tutorials' sanity check of a distributed setup: every rank contributes a tensor
//! holding its rank id, an AllGather over the world collects them, every rank prints the
//! result. With 4 ranks: `[[0.], [1.], [2.], [3.]]`.
//!
//! On GPUs (the default, `--device-target GPU`): NCCL, its unique id handed out over the
//! cluster's communicator, one GPU per rank (the rank on its host modulo the GPUs):
//!
//! ```text
//! mpirun -n 4 target/release/examples/nccl_allgather
//! shardc launch --worker-num 4 --local-worker-num 4 --join -- target/release/examples/nccl_allgather
//! ```
//!
//! `--device-target CPU` gathers with the cluster's own communicator (shared memory, TCP or
//! MPI), to check a launch on a machine without GPUs; `--gpu emulator` runs the GPU path on
//! the emulated GPU, NCCL emulated over the cluster's communicator. A machine without CUDA
//! gets the probe's error naming the missing library.

use shardc::communication::{self, Communication};
use shardc::cuda::cuda::{device_count, CudaDevice};
use shardc::cuda::emulator::EmulatedDevice;
use shardc::cuda::nccl::over_host::HostNccl;
use shardc::cuda::nccl::NcclComm;
use shardc::runtime::{Communicator, InProcessWorld, Tensor};
use shardc::train::TrainError;
use std::process::ExitCode;
use std::sync::Arc;

fn local_rank(rank: usize) -> usize {
    [
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "MPI_LOCALRANKID",
        "MS_LOCAL_RANK",
    ]
    .iter()
    .find_map(|k| std::env::var(k).ok()?.parse().ok())
    .unwrap_or(rank)
}

/// `[[0.], [1.]]`, as numpy prints a (N, 1) float array.
fn numpy_text(t: &Tensor) -> String {
    let rows: Vec<String> = t
        .to_f64_vec()
        .iter()
        .map(|v| {
            if v.fract() == 0.0 {
                format!("[{v:.0}.]")
            } else {
                format!("[{v}]")
            }
        })
        .collect();
    format!("[{}]", rows.join(", "))
}

/// Where the gather runs.
#[derive(Clone, Copy, PartialEq)]
enum Target {
    Cpu,
    Gpu,
    EmulatedGpu,
}

fn gather(c: &Communication, target: Target) -> Result<(), TrainError> {
    let (rank, size) = (c.get_rank(), c.get_group_size());
    let boot: Arc<dyn Communicator> = match c.communicator() {
        Some(comm) => comm.clone(),
        None => InProcessWorld::new(1).remove(0),
    };
    let err = |e: shardc::cuda::CudaError| TrainError::Cluster(format!("rank {rank}: {e}"));
    let comm: Arc<dyn Communicator> = match target {
        Target::Gpu => {
            let gpus = device_count().map_err(err)?;
            if gpus == 0 {
                return Err(TrainError::Cluster("the CUDA driver sees no GPU".into()));
            }
            let dev = Arc::new(CudaDevice::new(local_rank(rank) % gpus).map_err(err)?);
            Arc::new(NcclComm::new(dev, boot).map_err(err)?)
        }
        Target::EmulatedGpu => {
            let dev = Arc::new(EmulatedDevice::new(64).map_err(err)?);
            let lib = Arc::new(HostNccl::new(dev.clone(), boot.clone()));
            Arc::new(NcclComm::with_library(dev, lib, boot).map_err(err)?)
        }
        Target::Cpu => boot,
    };
    let x = Tensor::from_f32(vec![1, 1], vec![rank as f32])
        .ok_or_else(|| TrainError::Mismatch("a (1, 1) tensor holds one value".into()))?;
    let world: Vec<usize> = (0..size).collect();
    let y = comm
        .all_gather(&world, 0, &x)
        .map_err(|e| TrainError::Cluster(e.to_string()))?;
    println!("{}", numpy_text(&y));
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let value = |flag: &str| {
        let i = args.iter().position(|a| a == flag)?;
        Some(args.get(i + 1).map_or("", String::as_str))
    };
    let mut target = match value("--device-target") {
        Some("GPU") | Some("gpu") | None => Target::Gpu,
        Some("CPU") | Some("cpu") => Target::Cpu,
        Some(other) => {
            eprintln!("error: --device-target must be GPU or CPU, got {other:?}");
            return ExitCode::from(2);
        }
    };
    match (value("--gpu"), target) {
        (None, _) | (Some("cuda"), _) => {}
        (Some("emulator"), Target::Gpu) => target = Target::EmulatedGpu,
        (Some(other), _) => {
            eprintln!(
                "error: --gpu must be cuda or emulator (with --device-target GPU), got {other:?}"
            );
            return ExitCode::from(2);
        }
    }
    communication::main(|c| gather(c, target))
}
