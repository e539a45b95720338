//! `--device-target GPU`: `shardc run` on the CUDA backend (MindSpore's
//! `set_context(device_target="GPU")` and `init("nccl")`).
//!
//! One device: the artifact's graph on GPU `--device-id`. Several ranks in one process:
//! every rank a thread on the same GPU, collectives through the in-process communicator
//! staged through the host (a single GPU cannot host several NCCL ranks). A rank of a
//! cluster (`shardc launch`, `mpirun`, `MS_*`): GPU `local rank % GPUs`, collectives through
//! NCCL bootstrapped over the cluster's communicator (`--gpu-comm nccl`, the default), or
//! staged through that communicator (`--gpu-comm host`). `--gpu emulator` runs the same
//! kernels on the host C++ emulator (for testing on machines without a GPU).

use crate::device_run::{
    check_world, join_ranks, synthetic_only, train_cluster_rank, train_in_process, train_one,
    DeviceExecutor,
};
use crate::run_args::{GpuComm, GpuKind, RunArgs};
use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use shardc_backend_cpu::CpuBackend;
use shardc_backend_cuda::cuda::{device_count, CudaDevice};
use shardc_backend_cuda::emulator::EmulatedDevice;
use shardc_backend_cuda::nccl::over_host::HostNccl;
use shardc_backend_cuda::nccl::NcclComm;
use shardc_backend_cuda::{Device, GpuExecutor};
use shardc_ir::artifact::Artifact;
use shardc_ir::Graph;
use shardc_runtime::{Communicator, InProcessWorld};
use std::sync::Arc;

/// The real GPU `ordinal`, or the clear error of a machine without one.
fn open_cuda(ordinal: usize) -> Result<Arc<CudaDevice>> {
    CudaDevice::new(ordinal)
        .map(Arc::new)
        .map_err(|e| anyhow!("--device-target GPU: {e}"))
}

fn emulator() -> Result<Arc<dyn Device>> {
    let d = EmulatedDevice::new(64).map_err(|e| anyhow!("--gpu emulator: {e}"))?;
    Ok(Arc::new(d))
}

fn host_backend(a: &RunArgs) -> Arc<CpuBackend> {
    Arc::new(CpuBackend::with_threads(if a.threads == 0 {
        1
    } else {
        a.threads
    }))
}

/// `shardc run --device-target GPU` outside a cluster.
pub fn run(a: &RunArgs, art: Artifact) -> Result<()> {
    synthetic_only(a)?;
    let dev: Arc<dyn Device> = match a.device.gpu {
        GpuKind::Cuda => open_cuda(a.device.device_id.unwrap_or(0))?,
        GpuKind::Emulator => emulator()?,
    };
    println!("device: {}", dev.description());
    if art.device_num() == 1 {
        let graph = art.rank_graph(0)?;
        let exec = GpuExecutor::new(graph, dev, host_backend(a))?;
        return train_one(a, &art, exec);
    }
    // Several ranks in threads: a device each with NCCL between them where there are enough
    // GPUs (or emulated devices), else all on one device, collectives staged through the
    // host.
    let execs = in_process_executors(a, &art, dev)?;
    train_in_process(a, &art, execs)
}

/// The executors of in-process ranks: with `--gpu-comm nccl` (the default), a device each and
/// NCCL between them where the host has a GPU per rank (`--device-id` unset; the emulator:
/// a device per rank, NCCL emulated between them); otherwise every rank on `dev`, collectives
/// staged through the host.
fn in_process_executors(
    a: &RunArgs,
    art: &Artifact,
    dev: Arc<dyn Device>,
) -> Result<Vec<GpuExecutor>> {
    let n = art.device_num();
    let graphs = art.rank_graphs()?;
    let comms = InProcessWorld::new(n);
    let per_rank = a.device.gpu_comm == GpuComm::Nccl
        && match a.device.gpu {
            GpuKind::Emulator => true,
            GpuKind::Cuda => a.device.device_id.is_none() && device_count().unwrap_or(0) >= n,
        };
    if !per_rank {
        if a.device.gpu_comm == GpuComm::Nccl && a.device.gpu == GpuKind::Cuda {
            println!("{n} ranks share one GPU: collectives staged through the host (NCCL needs a GPU per rank)");
        }
        let mut execs = Vec::with_capacity(n);
        for (rank, (g, comm)) in graphs.into_iter().zip(comms).enumerate() {
            let comm: Arc<dyn Communicator> = comm;
            execs.push(
                GpuExecutor::with_communicator(g, dev.clone(), host_backend(a), comm)
                    .with_context(|| format!("rank {rank}: preparing its graph"))?,
            );
        }
        return Ok(execs);
    }
    // Every device first (a rank that cannot open one must not leave the others waiting in
    // NCCL's initialisation), then NCCL and the executors, a thread per rank.
    let mut devices: Vec<(
        Arc<dyn Device>,
        Arc<dyn shardc_backend_cuda::nccl::library::NcclLibrary>,
    )> = Vec::with_capacity(n);
    for rank in 0..n {
        devices.push(match a.device.gpu {
            GpuKind::Cuda => {
                let cuda = open_cuda(rank)?;
                let lib = shardc_backend_cuda::nccl::library::SystemNccl::new(cuda.clone());
                (cuda as Arc<dyn Device>, Arc::new(lib) as _)
            }
            GpuKind::Emulator => {
                let emu =
                    Arc::new(EmulatedDevice::new(64).map_err(|e| anyhow!("--gpu emulator: {e}"))?);
                let lib = shardc_backend_cuda::nccl::emulated::EmulatedNccl::new(emu.clone());
                (emu as Arc<dyn Device>, Arc::new(lib) as _)
            }
        });
    }
    if a.device.gpu == GpuKind::Cuda {
        shardc_backend_cuda::probe::require(shardc_backend_cuda::Library::Nccl)
            .map_err(|e| anyhow!("--device-target GPU with {n} ranks on {n} GPUs: {e}"))?;
    }
    println!("{n} ranks, a device each, collectives through NCCL");
    drop(dev);
    std::thread::scope(|s| {
        let handles: Vec<_> = devices
            .into_iter()
            .zip(comms)
            .zip(graphs)
            .enumerate()
            .map(|(rank, (((dev, lib), comm), g))| {
                s.spawn(move || -> Result<GpuExecutor> {
                    let comm: Arc<dyn Communicator> = comm;
                    let nccl = NcclComm::with_library(dev.clone(), lib, comm)
                        .map_err(|e| anyhow!("rank {rank}: NCCL: {e}"))?;
                    GpuExecutor::with_nccl(g, dev, host_backend(a), Arc::new(nccl))
                        .with_context(|| format!("rank {rank}: preparing its graph"))
                })
            })
            .collect();
        join_ranks(handles).into_iter().collect()
    })
}

/// One rank of a cluster on its GPU.
pub fn train_rank(
    a: &RunArgs,
    art: Artifact,
    comm: Arc<dyn Communicator>,
    local_rank: Option<usize>,
) -> Result<()> {
    synthetic_only(a)?;
    let (rank, size) = (comm.rank(), comm.size());
    check_world(a, &art, size)?;
    let graph: Graph = art
        .rank_graph(rank)
        .with_context(|| format!("rank {rank}: materializing its graph"))?;
    let cluster = comm.clone();
    let exec = match a.device.gpu {
        GpuKind::Emulator if a.device.gpu_comm == GpuComm::Nccl && size > 1 => {
            // One process per rank: NCCL emulated over the cluster's communicator.
            let dev =
                Arc::new(EmulatedDevice::new(64).map_err(|e| anyhow!("--gpu emulator: {e}"))?);
            let lib = Arc::new(HostNccl::new(dev.clone(), comm.clone()));
            let nccl = NcclComm::with_library(dev.clone(), lib, comm)
                .map_err(|e| anyhow!("rank {rank}: NCCL: {e}"))?;
            if rank == 0 {
                eprintln!("{size} ranks, collectives through NCCL (emulated over the cluster's communicator)");
            }
            GpuExecutor::with_nccl(graph, dev, host_backend(a), Arc::new(nccl))?
        }
        GpuKind::Emulator => {
            GpuExecutor::with_communicator(graph, emulator()?, host_backend(a), comm)?
        }
        GpuKind::Cuda => {
            let count = device_count().map_err(|e| anyhow!("--device-target GPU: {e}"))?;
            if count == 0 {
                bail!("--device-target GPU: the CUDA driver sees no GPU on this host");
            }
            let ordinal = a
                .device
                .device_id
                .unwrap_or(local_rank.unwrap_or(rank) % count);
            let cuda = open_cuda(ordinal)?;
            let dev: Arc<dyn Device> = cuda.clone();
            let mut shared = match a.device.device_id {
                None => {
                    shardc_backend_cuda::nccl::shared_gpu(local_rank.unwrap_or(rank), count, size)
                }
                Some(_) => None,
            };
            // Every rank must decide alike: a rank that joins NCCL waits for all the others.
            if a.device.gpu_comm == GpuComm::Nccl && size > 1 {
                shared = shardc_backend_cuda::nccl::why_not_nccl(comm.as_ref(), shared)
                    .map_err(|e| anyhow!("rank {rank}: {e}"))?;
            }
            if let (GpuComm::Nccl, Some(why)) = (a.device.gpu_comm, &shared) {
                eprintln!("rank {rank}: {why}: collectives staged through the host");
            }
            match a.device.gpu_comm {
                GpuComm::Host => GpuExecutor::with_communicator(graph, dev, host_backend(a), comm)?,
                GpuComm::Nccl if shared.is_some() => {
                    GpuExecutor::with_communicator(graph, dev, host_backend(a), comm)?
                }
                GpuComm::Nccl => {
                    let nccl =
                        NcclComm::new(cuda, comm).map_err(|e| anyhow!("rank {rank}: NCCL: {e}"))?;
                    GpuExecutor::with_nccl(graph, dev, host_backend(a), Arc::new(nccl))?
                }
            }
        }
    };
    train_cluster_rank(a, &art, exec, cluster)
}

impl DeviceExecutor for GpuExecutor {
    fn set_profiling(&mut self, on: bool) {
        GpuExecutor::set_profiling(self, on);
    }

    fn stats_summary(&self) -> String {
        self.stats().summary()
    }
}

/// Arguments of `shardc gpu`.
#[derive(Args, Debug)]
pub struct GpuArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: GpuCommand,
}

/// The `shardc gpu` subcommands.
#[derive(clap::Subcommand, Debug, Clone, Copy)]
pub enum GpuCommand {
    /// The CUDA libraries found (and how to make a missing one findable), the GPUs, NCCL.
    Info,
}

/// `shardc gpu info`: the CUDA libraries found, the GPUs, NCCL's version.
pub fn info() -> Result<()> {
    print!("{}", shardc_backend_cuda::probe::report());
    // Kernels compiled by an NVRTC newer than the driver load only as SASS of the same major
    // version (see `CudaDevice::new`).
    if shardc_backend_cuda::Library::Driver.present() {
        match shardc_backend_cuda::cuda::driver_cuda_version() {
            Ok((major, minor)) => println!("driver: CUDA {major}.{minor}"),
            Err(e) => println!("driver: {e}"),
        }
    }
    if shardc_backend_cuda::Library::Nvrtc.present() {
        let (major, minor) = shardc_backend_cuda::kernels::nvrtc_version();
        println!("NVRTC: CUDA {major}.{minor}");
    }
    match device_count() {
        Ok(n) => {
            println!("GPUs: {n}");
            for i in 0..n {
                match CudaDevice::new(i) {
                    Ok(d) => println!("  {}", d.description()),
                    Err(e) => println!("  GPU {i}: {e}"),
                }
            }
        }
        Err(e) => println!("GPUs: none ({e})"),
    }
    match NcclComm::version() {
        Ok(v) => println!("NCCL {}.{}.{}", v / 10000, (v / 100) % 100, v % 100),
        Err(e) => println!("NCCL: {e}"),
    }
    Ok(())
}
