//! `--device-target Ascend`: `shardc run` on the Ascend backend (MindSpore's
//! `set_context(device_target="Ascend")` and `init("hccl")`).
//!
//! One device: the artifact's graph on NPU `--device-id` (else `DEVICE_ID`, else 0). Several
//! ranks in one process: a thread per rank, an NPU each with HCCL between them where the host
//! has an NPU per rank (`--npu-comm hccl`, the default), else every rank on one NPU with the
//! collectives staged through the in-process communicator. A rank of a cluster
//! (`shardc launch`, `mpirun`, MindSpore's `MS_*` variables or its rank table:
//! `RANK_TABLE_FILE` / `RANK_ID` / `RANK_SIZE` / `DEVICE_ID`): its NPU as
//! [`shardc_runtime::cluster::npu_of_rank`] says, collectives through HCCL bootstrapped over
//! the cluster's communicator (rank 0's `HcclGetRootInfo` handed to the others), or staged
//! through that communicator (`--npu-comm host`).
//!
//! The CANN libraries are opened at run time; a machine without them gets an error naming
//! the missing library and how to make it findable (`ASCEND_HOME_PATH`,
//! `SHARDC_ASCEND_LIB_DIRS`; `shardc device info` lists what was found).

use crate::device_run::{
    check_world, join_ranks, synthetic_only, train_cluster_rank, train_in_process, train_one,
    DeviceExecutor,
};
use crate::run_args::{NpuComm, RunArgs};
use anyhow::{anyhow, Context, Result};
use shardc_backend_ascend::hccl::HcclComm;
use shardc_backend_ascend::{AscendDevice, AscendExecutor};
use shardc_backend_cpu::CpuBackend;
use shardc_ir::artifact::Artifact;
use shardc_ir::Graph;
use shardc_runtime::cluster::npu_of_rank;
use shardc_runtime::{Backend, Communicator, InProcessWorld};
use std::sync::Arc;

impl DeviceExecutor for AscendExecutor {
    fn set_profiling(&mut self, on: bool) {
        AscendExecutor::set_profiling(self, on);
    }

    fn stats_summary(&self) -> String {
        self.stats().summary()
    }
}

/// The NPUs this host has, or the clear error of a machine without CANN.
fn npus() -> Result<usize> {
    shardc_backend_ascend::acl::device_count().map_err(|e| anyhow!("--device-target Ascend: {e}"))
}

/// NPU `id`, opened.
fn open(id: usize) -> Result<Arc<AscendDevice>> {
    AscendDevice::open(id).map_err(|e| anyhow!("--device-target Ascend: NPU {id}: {e}"))
}

/// The CPU kernels that run the ops without an aclnn lowering, on copies.
fn host_backend(a: &RunArgs) -> Arc<dyn Backend> {
    Arc::new(CpuBackend::with_threads(if a.threads == 0 {
        1
    } else {
        a.threads
    }))
}

/// The NPU of `rank` (`local_rank` on its host) as MindSpore maps it (see the module doc).
fn npu_for(asked: Option<usize>, rank: usize, local_rank: Option<usize>) -> Result<usize> {
    let count = npus()?;
    let (id, _why) = npu_of_rank(asked, rank, local_rank, count, &|v| std::env::var(v).ok())
        .map_err(|e| anyhow!("--device-target Ascend: rank {rank}: {e}"))?;
    Ok(id)
}

/// `shardc run --device-target Ascend` outside a cluster.
pub fn run(a: &RunArgs, art: Artifact) -> Result<()> {
    synthetic_only(a)?;
    if art.device_num() == 1 {
        let dev = open(npu_for(a.device.device_id, 0, None)?)?;
        println!("device: {}", dev.description());
        let graph = art.rank_graph(0)?;
        let exec = AscendExecutor::new(graph, dev, host_backend(a))?;
        return train_one(a, &art, exec);
    }
    let execs = in_process_executors(a, &art)?;
    train_in_process(a, &art, execs)
}

/// The executors of in-process ranks: with `--npu-comm hccl` (the default) and an NPU per
/// rank (`--device-id` unset), NPU `r` for rank `r` and HCCL between them; otherwise every
/// rank on one NPU, collectives staged through the in-process communicator.
fn in_process_executors(a: &RunArgs, art: &Artifact) -> Result<Vec<AscendExecutor>> {
    let n = art.device_num();
    let graphs = art.rank_graphs()?;
    let comms = InProcessWorld::new(n);
    let count = npus()?;
    let per_rank = a.device.npu_comm == NpuComm::Hccl && a.device.device_id.is_none() && count >= n;
    if !per_rank {
        let dev = open(npu_for(a.device.device_id, 0, None)?)?;
        println!("device: {}", dev.description());
        if a.device.npu_comm == NpuComm::Hccl {
            println!("{n} ranks share one NPU: collectives staged through the host (HCCL needs an NPU per rank; this host has {count})");
        }
        let mut execs = Vec::with_capacity(n);
        for (rank, (g, comm)) in graphs.into_iter().zip(comms).enumerate() {
            let comm: Arc<dyn Communicator> = comm;
            execs.push(
                AscendExecutor::with_communicator(g, dev.clone(), host_backend(a), comm)
                    .with_context(|| format!("rank {rank}: preparing its graph"))?,
            );
        }
        return Ok(execs);
    }
    // Every NPU first (a rank that cannot open one must not leave the others waiting in
    // HCCL's initialisation), then HCCL and the executors, a thread per rank: HCCL's
    // initialisation returns once every rank has joined.
    let devices: Vec<Arc<AscendDevice>> = (0..n).map(open).collect::<Result<_>>()?;
    println!("{n} ranks, an NPU each, collectives through HCCL");
    std::thread::scope(|s| {
        let handles: Vec<_> = devices
            .into_iter()
            .zip(comms)
            .zip(graphs)
            .enumerate()
            .map(|(rank, ((dev, comm), g))| {
                s.spawn(move || -> Result<AscendExecutor> {
                    let comm: Arc<dyn Communicator> = comm;
                    let hccl = HcclComm::new(dev.clone(), comm)
                        .map_err(|e| anyhow!("rank {rank}: HCCL: {e}"))?;
                    AscendExecutor::with_hccl(g, dev, host_backend(a), Arc::new(hccl))
                        .with_context(|| format!("rank {rank}: preparing its graph"))
                })
            })
            .collect();
        join_ranks(handles).into_iter().collect()
    })
}

/// A rank's executor on its NPU, as a training program needs it (`Model` with
/// `device_target="Ascend"`, a cluster rank): NPU `device_id`, else as
/// [`shardc_runtime::cluster::npu_of_rank`] maps the rank (`DEVICE_ID`, the rank table, the
/// local rank); collectives through HCCL bootstrapped over `comm` when `hccl` and there are
/// several ranks (all ranks agree first: [`shardc_backend_ascend::executor::ascend_executor`]),
/// else staged through `comm`.
pub fn ascend_executor(
    device_id: Option<usize>,
    graph: Graph,
    host: Arc<dyn Backend>,
    comm: Option<Arc<dyn Communicator>>,
    hccl: bool,
    local_rank: Option<usize>,
) -> Result<AscendExecutor> {
    let rank = comm.as_ref().map_or(0, |c| c.rank());
    let id = npu_for(device_id, rank, local_rank)?;
    shardc_backend_ascend::executor::ascend_executor(graph, host, comm, hccl, Some(id), local_rank)
        .map_err(|e| anyhow!("--device-target Ascend: rank {rank}: {e}"))
}

/// One rank of a cluster on its NPU.
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
    let hccl = a.device.npu_comm == NpuComm::Hccl;
    let exec = ascend_executor(
        a.device.device_id,
        graph,
        host_backend(a),
        Some(comm.clone()),
        hccl,
        local_rank,
    )?;
    if rank == 0 {
        eprintln!(
            "{size} ranks on {}, collectives {}",
            exec.device().description(),
            if exec.uses_hccl() {
                "through HCCL"
            } else {
                "staged through the cluster's communicator"
            }
        );
    }
    train_cluster_rank(a, &art, exec, comm)
}

/// `shardc device info`'s Ascend part: the CANN libraries found (and how to make a missing
/// one findable), AscendCL's version, the NPUs.
pub fn info() -> Result<()> {
    println!("{}", shardc_backend_ascend::device_info());
    Ok(())
}
