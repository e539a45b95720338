//! One process of a cluster: the scheduler (`shardc scheduler`, or any shardc command run
//! with `MS_ROLE=MS_SCHED`), or a worker that joins the scheduler, builds its communicator
//! (shared memory within a host, TCP between hosts, or MPI) and runs its own rank of a
//! multi-rank artifact (`shardc run`) or the collectives' conformance suite
//! (`shardc check-collectives`).

use crate::run_args::{CommKind, RunArgs};
use crate::training::{after_step, rank_block};
use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use shardc_backend_cpu::CpuBackend;
use shardc_collectives::tcp::DataPlaneTls;
use shardc_collectives::{CommSetup, Peer, ProcessComm};
use shardc_ir::artifact::Artifact;
use shardc_runtime::cluster::{
    self, ClusterEnv, Membership, Role, Scheduler, SchedulerConfig, SchedulerHandle, WorkerConfig,
};
use shardc_runtime::comm::{conformance, Communicator};
use shardc_runtime::executor::Executor;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What this process is in a cluster.
pub enum ClusterRole {
    /// The scheduler only.
    Scheduler(ClusterEnv),
    /// A worker under the native communicator (dynamic cluster or mpirun + rendezvous).
    Native(ClusterEnv),
    /// A worker whose rank, size and collectives come from MPI.
    Mpi,
}

/// The cluster role named by the environment, or `None` for a single process. `--comm mpi`
/// makes the process an MPI rank whatever the environment says.
pub fn role_from_env(comm: CommKind) -> Result<Option<ClusterRole>> {
    if comm == CommKind::Mpi {
        return Ok(Some(ClusterRole::Mpi));
    }
    Ok(ClusterEnv::from_env()?.map(|env| match env.role {
        Role::Scheduler => ClusterRole::Scheduler(env),
        Role::Worker => ClusterRole::Native(env),
    }))
}

/// `shardc scheduler`: serves the job named by `MS_WORKER_NUM`, `MS_SCHED_HOST`,
/// `MS_SCHED_PORT` until every worker finished (error: a worker was lost or failed).
pub fn scheduler_main() -> Result<()> {
    match ClusterEnv::from_env()? {
        Some(env) if env.role == Role::Scheduler => serve(&env),
        _ => bail!(
            "shardc scheduler: set MS_ROLE=MS_SCHED, MS_WORKER_NUM, MS_SCHED_PORT (and MS_SCHED_HOST) as for MindSpore's dynamic cluster; `shardc launch` does it for you"
        ),
    }
}

fn require_token(env: &ClusterEnv) -> Result<()> {
    if env.token.is_none() {
        bail!(
            "the cluster needs a shared token: set SHARDC_CLUSTER_TOKEN or SHARDC_CLUSTER_TOKEN_FILE to the same secret for the scheduler and every worker (`shardc launch` makes one on a single node)"
        );
    }
    Ok(())
}

fn serve(env: &ClusterEnv) -> Result<()> {
    require_token(env)?;
    let config = SchedulerConfig::from_env(env)?;
    let scheduler = Scheduler::bind(env.sched_addr().as_str(), env.worker_num, config)?;
    eprintln!(
        "scheduler: listening on {} for {} workers",
        scheduler.local_addr(),
        env.worker_num
    );
    let report = scheduler.serve()?;
    eprintln!(
        "scheduler: job {} finished: {} workers in {:.1} s",
        report.job_id,
        report.workers.len(),
        report.elapsed.as_secs_f64()
    );
    Ok(())
}

/// A worker's place in the job and its communicator.
pub struct Joined {
    /// The communicator every collective of this rank goes through.
    pub comm: Arc<dyn Communicator>,
    /// This rank.
    pub rank: usize,
    /// The number of ranks.
    pub size: usize,
    /// What the transport is, for messages.
    pub transport: String,
    membership: Option<Membership>,
    embedded: Option<SchedulerHandle>,
}

impl Joined {
    /// This rank's index among the ranks of its host (which GPU it takes): from the
    /// scheduler's host ids, or from mpirun's `OMPI_COMM_WORLD_LOCAL_RANK`.
    pub fn local_rank(&self) -> Option<usize> {
        if let Some(m) = &self.membership {
            let me = m.peers.iter().find(|p| p.rank == self.rank)?;
            return Some(
                m.peers
                    .iter()
                    .filter(|p| p.host_id == me.host_id && p.rank < self.rank)
                    .count(),
            );
        }
        ["OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID"]
            .iter()
            .find_map(|k| std::env::var(k).ok()?.parse().ok())
    }

    /// Tells the scheduler this rank is done (a non-zero status aborts the others) and, on
    /// the rank that embeds the scheduler, waits for the job to end.
    pub fn finish(self, status: i32) -> Result<()> {
        if let Some(m) = self.membership {
            m.finish(status)
                .with_context(|| format!("rank {}: finishing", self.rank))?;
        }
        if let Some(h) = self.embedded {
            h.wait()?;
        }
        Ok(())
    }
}

/// Joins the cluster as a worker and builds the communicator.
pub fn join(role: ClusterRole) -> Result<Joined> {
    match role {
        ClusterRole::Scheduler(_) => bail!("the scheduler has no rank"),
        ClusterRole::Mpi => join_mpi(),
        ClusterRole::Native(env) => join_native(&env),
    }
}

#[cfg(feature = "mpi")]
fn join_mpi() -> Result<Joined> {
    let comm = shardc_collectives::mpi::MpiComm::init()?;
    let (rank, size) = (comm.rank(), comm.size());
    Ok(Joined {
        comm: Arc::new(comm),
        rank,
        size,
        transport: "MPI".into(),
        membership: None,
        embedded: None,
    })
}

#[cfg(not(feature = "mpi"))]
fn join_mpi() -> Result<Joined> {
    bail!(
        "--comm mpi: this shardc was built without MPI; install Open MPI (bash scripts/install-mpi.sh) and build with `cargo build --release --features mpi`"
    )
}

fn join_native(env: &ClusterEnv) -> Result<Joined> {
    require_token(env)?;
    let embedded = cluster::start_embedded_scheduler(env)?;
    let listener = std::net::TcpListener::bind(("0.0.0.0", 0))
        .context("binding this worker's data-plane listener")?;
    let port = listener.local_addr()?.port();
    let rank_cell = Arc::new(AtomicUsize::new(usize::MAX));
    let rank_seen = rank_cell.clone();
    let on_abort: cluster::AbortHandler = Box::new(move |reason: &str| {
        let r = rank_seen.load(Ordering::SeqCst);
        if r == usize::MAX {
            eprintln!("worker: aborting: {reason}");
        } else {
            eprintln!("rank {r}: aborting: {reason}");
        }
        // NCCL kernels waiting for a lost peer would otherwise wait through the exit; an
        // abort that blocks gets 5 s.
        let _ = shardc_backend_cuda::nccl::abort_every_communicator_within(
            std::time::Duration::from_secs(5),
        );
        std::process::exit(1);
    });
    let config = WorkerConfig::from_env(env)?;
    let tls = data_plane_tls(&config)?;
    let membership = cluster::join(&config, port, on_abort)?;
    rank_cell.store(membership.rank, Ordering::SeqCst);
    let setup = CommSetup {
        rank: membership.rank,
        size: membership.size,
        job_id: membership.job_id.clone(),
        peers: membership
            .peers
            .iter()
            .map(|p| Peer {
                host_id: p.host_id.clone(),
                data_addr: p.data_addr,
            })
            .collect(),
        listener,
        token: membership.token.clone(),
        tls,
        timeout: comm_timeout()?,
    };
    let local = membership
        .peers
        .iter()
        .filter(|p| p.host_id == membership.peers[membership.rank].host_id)
        .count();
    let transport = format!(
        "native: {local} of {} ranks on this host over shared memory, the rest over TCP{}",
        membership.size,
        if setup.tls.is_some() {
            " (TLS, sealed records)"
        } else {
            ""
        }
    );
    let comm = ProcessComm::new(setup)
        .map_err(|e| anyhow!("rank {}: building the communicator: {e}", membership.rank))?;
    Ok(Joined {
        comm: Arc::new(comm),
        rank: membership.rank,
        size: membership.size,
        transport,
        membership: Some(membership),
        embedded,
    })
}

/// The data plane's TLS when the cluster runs with TLS: every worker accepts connections
/// from higher ranks and connects to lower ones, so the configuration file must name both
/// identities.
fn data_plane_tls(config: &WorkerConfig) -> Result<Option<DataPlaneTls>> {
    let Some(t) = &config.tls else {
        return Ok(None);
    };
    let Some(server) = &t.data_server else {
        bail!(
            "SHARDC_ENABLE_SSL: the TLS configuration names no server certificate (server_cert_path); every worker needs one, because it accepts the data-plane connections of higher ranks"
        );
    };
    Ok(Some(DataPlaneTls::new(server.clone(), t.config.clone())))
}

/// `SHARDC_COMM_TIMEOUT` (seconds; default 300): how long a collective waits for its peers.
fn comm_timeout() -> Result<Duration> {
    shardc_runtime::comm::comm_timeout_from_env().map_err(|e| anyhow!(e))
}

/// How long a failed rank waits for the scheduler's word on a lost peer before it reports
/// itself as failed (see [`run_rank`]).
const FAILURE_GRACE: Duration = Duration::from_secs(1);

/// `shardc run` in a cluster: the scheduler serves; a worker trains its own rank of the
/// artifact on its block of the same global batches as every other rank and prints the
/// loss of each step (every rank computes the global loss).
pub fn run_rank(a: &RunArgs, role: ClusterRole) -> Result<()> {
    if let ClusterRole::Scheduler(env) = &role {
        return serve(env);
    }
    if a.mnist.is_some() {
        bail!("--mnist trains one device; a cluster trains a multi-rank artifact on synthetic data here");
    }
    let art = Artifact::read(&a.artifact)?;
    let joined = join(role)?;
    let result = train_rank(a, art, &joined);
    let status = i32::from(result.is_err());
    if status != 0 {
        // A rank's failure is often the effect of another's loss (a collective whose peer
        // died: HCCL or shared memory notice at once). The scheduler sees the lost rank's
        // connection close about as soon; give its abort, which names the lost rank and ends
        // this process, a moment to arrive before reporting this rank as the cause.
        std::thread::sleep(FAILURE_GRACE);
    }
    // Tell the scheduler first: a failed rank ends the job for everyone at once.
    let finished = joined.finish(status);
    result?;
    finished
}

fn train_rank(a: &RunArgs, art: Artifact, joined: &Joined) -> Result<()> {
    if a.device.target().is_ascend() {
        return crate::ascend::train_rank(a, art, joined.comm.clone(), joined.local_rank());
    }
    if a.device.target().is_gpu() {
        return crate::gpu::train_rank(a, art, joined.comm.clone(), joined.local_rank());
    }
    let (rank, size) = (joined.rank, joined.size);
    if art.device_num() != size {
        bail!(
            "{}: the artifact is compiled for {} rank(s) but the job has {size} workers: compile with --device-num {size}",
            a.artifact.display(),
            art.device_num()
        );
    }
    let (data, inputs) = crate::training::distributed_data(a, &art)?;
    let inputs = crate::training::rank_inputs(&art, rank, &inputs)?;
    let pipeline = crate::training::PipelineInfo::of(&art);
    if let Some(p) = &pipeline {
        println!("{}", p.stage_line(rank));
    }
    // This worker's own rank, materialized from the program every rank runs.
    let graph = art
        .rank_graph(rank)
        .with_context(|| format!("rank {rank}: materializing its graph"))?;
    let threads = if a.threads == 0 { 1 } else { a.threads };
    let mut exec = Executor::with_communicator(
        graph,
        Arc::new(CpuBackend::with_threads(threads)),
        joined.comm.clone(),
    )
    .with_context(|| format!("rank {rank}: preparing its graph"))?;
    let per_epoch = data.per_epoch(a);
    let init = crate::init_from::init_path(a.init_from.as_deref(), &a.artifact, &art);
    crate::init_from::init_rank(
        init.as_deref(),
        a.name_map.as_deref(),
        &art,
        &mut exec,
        rank,
    )?;
    // Checkpoints: every rank reads the shared directory and computes the same newest
    // complete step (it checks every rank's file of it), then loads its own file; a barrier
    // keeps any rank from saving (and pruning) before all have chosen.
    let start = match &a.checkpoint.resume_from {
        Some(dir) => {
            let who = format!("rank {rank}: ");
            let ranks = crate::ckpt::RankWeights::Program(&art.program);
            let mut rp = crate::ckpt::resume_point(dir, &ranks, &|r| r == rank, &who, a.steps)?;
            crate::ckpt::apply(&mut rp, rank, size, &mut exec)?;
            let all: Vec<usize> = (0..size).collect();
            joined.comm.barrier(&all).map_err(|e| {
                anyhow!("rank {rank}: waiting for every rank to load its checkpoint: {e}")
            })?;
            rp.step
        }
        None => 0,
    };
    let saver = crate::ckpt::Saver::new(&a.checkpoint, &art.manifest.model, per_epoch, rank, size)?;
    if let Some(s) = &saver {
        s.write_strategy(&a.artifact, &art)?;
    }
    shardc_runtime::train_steps(
        &mut exec,
        start..a.steps,
        |step| rank_block(data.feeds(step), &inputs, rank).map(Some),
        |step, outputs, exec| after_step(step, &outputs, exec, per_epoch, saver.as_ref(), a.steps),
    )
    .with_context(|| format!("rank {rank}"))?;
    if a.stats {
        let stats = exec.stats();
        println!("{stats}");
        if let Some(p) = &pipeline {
            let wait = stats
                .per_op
                .get(&shardc_ir::OpKind::Receive)
                .map_or(Duration::ZERO, |s| s.time);
            println!("{}", p.bubble_line(rank, wait, stats.total));
        }
    }
    Ok(())
}

/// Arguments of `shardc check-collectives`.
#[derive(Args, Debug)]
pub struct CheckCollectivesArgs {
    /// The communicator (see `shardc run --comm`).
    #[arg(long, value_enum, default_value_t = CommKind::Native)]
    pub comm: CommKind,
}

/// `shardc check-collectives`: every worker of the job runs the conformance suite (every
/// collective on the world and on sub-groups, compared bit for bit with values computed
/// independently) and prints how many checks passed; exit status 1 on the first failure.
pub fn check_collectives(a: &CheckCollectivesArgs) -> Result<()> {
    let Some(role) = role_from_env(a.comm)? else {
        bail!(
            "shardc check-collectives runs in a cluster: start it with `shardc launch --worker-num N -- shardc check-collectives` or under mpirun with --comm mpi"
        );
    };
    if let ClusterRole::Scheduler(env) = &role {
        return serve(env);
    }
    let joined = join(role)?;
    let t0 = Instant::now();
    let result = conformance::run(joined.comm.as_ref());
    let status = i32::from(result.is_err());
    let line = match &result {
        Ok(n) => format!(
            "rank {}: {n} collective checks passed in {:.2} s (world of {}, {})",
            joined.rank,
            t0.elapsed().as_secs_f64(),
            joined.size,
            joined.transport
        ),
        Err(e) => format!("rank {}: collective check failed: {e}", joined.rank),
    };
    let finished = joined.finish(status);
    match result {
        Ok(_) => {
            println!("{line}");
            finished
        }
        Err(_) => bail!("{line}"),
    }
}
