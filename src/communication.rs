//! MindSpore's `mindspore.communication`: [`init`] joins the cluster this process was started
//! in and gives its rank and the group size.
//!
//! Which cluster is read from the environment, as MindSpore reads it: the dynamic cluster's
//! `MS_ROLE` / `MS_WORKER_NUM` / `MS_SCHED_HOST` / `MS_SCHED_PORT` (set by `shardc launch`, or
//! by hand as in the CPU tutorial's `run.sh`), or mpirun's `OMPI_COMM_WORLD_*`. With none of
//! them the process is a single device (rank 0 of 1). A process started with
//! `MS_ROLE=MS_SCHED` is the scheduler: [`init`] serves the job and ends the process, as
//! MindSpore's scheduler runs the same script but never trains.
//!
//! A worker must say how it ended, or the scheduler takes its exit for a lost rank and stops
//! the others: [`run`] does that around a closure; [`Communication::finish`] by hand.

use crate::train::TrainError;
use shardc_runtime::comm::Communicator;
use shardc_tools::cluster_run::{self, ClusterRole, Joined};
use shardc_tools::run_args::CommKind;
use std::sync::Arc;

/// This process's place in the job: its rank, the group size and the communicator.
pub struct Communication {
    rank: usize,
    size: usize,
    transport: String,
    comm: Option<Arc<dyn Communicator>>,
    joined: Option<Joined>,
}

impl std::fmt::Debug for Communication {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communication")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("transport", &self.transport)
            .finish()
    }
}

/// Joins the cluster named by the environment with shardc's own collectives (shared memory
/// within a host, TCP between hosts); a single device when no cluster is named. Under
/// `mpirun` (without `MS_ROLE`), a build with the `mpi` feature joins through MPI instead, as
/// MindSpore's `init()` does under `mpirun`: no token needed. On the scheduler
/// (`MS_ROLE=MS_SCHED`) it serves the job and exits the process with the job's status.
pub fn init() -> Result<Communication, TrainError> {
    let under_mpirun = ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE"]
        .iter()
        .any(|v| std::env::var_os(v).is_some())
        && std::env::var_os("MS_ROLE").is_none();
    if under_mpirun && cfg!(feature = "mpi") {
        return init_with(CommKind::Mpi);
    }
    let token = ["SHARDC_CLUSTER_TOKEN", "SHARDC_CLUSTER_TOKEN_FILE"]
        .iter()
        .any(|v| std::env::var_os(v).is_some_and(|t| !t.is_empty()));
    if under_mpirun && !token {
        return Err(TrainError::Cluster(
            "under mpirun this build joins with shardc's own collectives, whose ranks need a shared token: run `mpirun -x SHARDC_CLUSTER_TOKEN=<secret> ...` (or set SHARDC_CLUSTER_TOKEN_FILE on every rank), or build with `--features mpi` (Open MPI: scripts/install-mpi.sh) to join through MPI".into(),
        ));
    }
    init_with(CommKind::Native)
}

/// MindSpore's `init(backend_name)`: `"hccl"` (Ascend), `"nccl"` (GPU) or `"mccl"` (CPU)
/// join the cluster as [`init`] does; the name says which device collectives the job's
/// models use, and a `Model` with `device_target="Ascend"` (or `"GPU"`) runs them through
/// HCCL (or NCCL), bootstrapped over the joined communicator. Any other name is an error
/// naming it.
pub fn init_backend(backend_name: &str) -> Result<Communication, TrainError> {
    match backend_name {
        "hccl" | "nccl" | "mccl" => init(),
        other => Err(TrainError::Cluster(format!(
            "init({other:?}): unknown communication backend: expected \"hccl\" (Ascend), \"nccl\" (GPU) or \"mccl\" (CPU)"
        ))),
    }
}

/// [`init`] with a chosen communicator: `CommKind::Mpi` under `mpirun` (a build with the
/// `mpi` feature); MindSpore's `init("nccl")` is the CUDA backend's, not this one.
pub fn init_with(kind: CommKind) -> Result<Communication, TrainError> {
    let role =
        cluster_run::role_from_env(kind).map_err(|e| TrainError::Cluster(format!("{e:#}")))?;
    match role {
        None => Ok(Communication::single()),
        Some(ClusterRole::Scheduler(_)) => {
            let status = match cluster_run::scheduler_main() {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("scheduler: {e:#}");
                    1
                }
            };
            std::process::exit(status)
        }
        Some(role) => {
            let joined =
                cluster_run::join(role).map_err(|e| TrainError::Cluster(format!("{e:#}")))?;
            Ok(Communication {
                rank: joined.rank,
                size: joined.size,
                transport: joined.transport.clone(),
                comm: Some(joined.comm.clone()),
                joined: Some(joined),
            })
        }
    }
}

impl Communication {
    /// A single device: rank 0 of 1, no communicator.
    pub fn single() -> Communication {
        Communication {
            rank: 0,
            size: 1,
            transport: "single device".into(),
            comm: None,
            joined: None,
        }
    }

    /// A communicator made elsewhere (for example one rank of an in-process world).
    pub fn from_communicator(comm: Arc<dyn Communicator>) -> Communication {
        Communication {
            rank: comm.rank(),
            size: comm.size(),
            transport: "given communicator".into(),
            comm: Some(comm),
            joined: None,
        }
    }

    /// This process's rank (MindSpore's `get_rank()`).
    pub fn get_rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks (MindSpore's `get_group_size()`).
    pub fn get_group_size(&self) -> usize {
        self.size
    }

    /// The communicator, when there are other ranks.
    pub fn communicator(&self) -> Option<&Arc<dyn Communicator>> {
        self.comm.as_ref()
    }

    /// How the ranks talk, for logs.
    pub fn transport(&self) -> &str {
        &self.transport
    }

    /// Tells the scheduler this rank ended with `status` (non-zero stops every other rank
    /// at once) and, on a rank that embeds the scheduler (under mpirun), waits for the job.
    pub fn finish(mut self, status: i32) -> Result<(), TrainError> {
        self.finish_inner(status)
    }

    fn finish_inner(&mut self, status: i32) -> Result<(), TrainError> {
        self.comm = None;
        match self.joined.take() {
            Some(j) => j
                .finish(status)
                .map_err(|e| TrainError::Cluster(format!("{e:#}"))),
            None => Ok(()),
        }
    }
}

impl Drop for Communication {
    fn drop(&mut self) {
        // Not finished by hand: a panic is a failure; anything else the owner chose to end.
        if self.joined.is_some() {
            let status = i32::from(std::thread::panicking());
            if let Err(e) = self.finish_inner(status) {
                eprintln!("rank {}: {e}", self.rank);
            }
        }
    }
}

/// Joins the cluster ([`init`]), runs `body` with this rank's [`Communication`], and tells
/// the scheduler how it ended: an error in `body` stops every other rank at once, naming this
/// one. The error is returned (for `main` to print and exit non-zero).
pub fn run<F>(body: F) -> Result<(), TrainError>
where
    F: FnOnce(&Communication) -> Result<(), TrainError>,
{
    let comm = init()?;
    let result = body(&comm);
    let finished = comm.finish(i32::from(result.is_err()));
    result?;
    finished
}

/// A training program's `main`: [`run`] with `body`, the error (if any) printed as
/// `error: ...` on stderr, and the exit status (1 on failure).
pub fn main<F>(body: F) -> std::process::ExitCode
where
    F: FnOnce(&Communication) -> Result<(), TrainError>,
{
    match run(body) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
