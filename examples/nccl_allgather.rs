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
//! MPI), to check a launch on a machine without GPUs. A machine without CUDA gets the probe's
//! error naming the missing library.

use shardc::communication::{self, Communication};
use shardc::cuda::cuda::{device_count, CudaDevice};
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

fn gather(c: &Communication, on_gpu: bool) -> Result<(), TrainError> {
    let (rank, size) = (c.get_rank(), c.get_group_size());
    let boot: Arc<dyn Communicator> = match c.communicator() {
        Some(comm) => comm.clone(),
        None => InProcessWorld::new(1).remove(0),
    };
    let comm: Arc<dyn Communicator> = if on_gpu {
        let err = |e: shardc::cuda::CudaError| TrainError::Cluster(format!("rank {rank}: {e}"));
        let gpus = device_count().map_err(err)?;
        if gpus == 0 {
            return Err(TrainError::Cluster("the CUDA driver sees no GPU".into()));
        }
        let dev = Arc::new(CudaDevice::new(local_rank(rank) % gpus).map_err(err)?);
        Arc::new(NcclComm::new(dev, boot).map_err(err)?)
    } else {
        boot
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
    let on_gpu = match args.iter().position(|a| a == "--device-target") {
        Some(i) => match args.get(i + 1).map(String::as_str) {
            Some("GPU") | Some("gpu") => true,
            Some("CPU") | Some("cpu") => false,
            other => {
                eprintln!("error: --device-target must be GPU or CPU, got {other:?}");
                return ExitCode::from(2);
            }
        },
        None => true,
    };
    communication::main(|c| gather(c, on_gpu))
}
