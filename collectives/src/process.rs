//! [`ProcessComm`], the communicator a worker uses, and what it is built from ([`CommSetup`],
//! [`Peer`]): shared memory for the groups on this host, TCP for the rest.

use crate::shm::{ShmComm, ShmSetup};
use crate::tcp::{DataPlaneTls, TcpComm, TcpSetup};
use shardc_ir::{ReduceOp, TensorType};
use shardc_runtime::comm::{Collective, CommError, Communicator};
use shardc_runtime::Tensor;
use std::net::{SocketAddr, TcpListener};
use std::time::Duration;

/// One rank of the job as the data plane sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    /// The host (and network namespace) it runs on: ranks with equal ids share memory.
    pub host_id: String,
    /// Its data-plane listener's address.
    pub data_addr: SocketAddr,
}

/// Everything a rank needs to join the data plane.
#[derive(Debug)]
pub struct CommSetup {
    /// This rank, in `0..size`.
    pub rank: usize,
    /// The number of ranks in the world.
    pub size: usize,
    /// The job's id, the same on every rank (names the shared-memory segments; TCP
    /// connections of other jobs are refused).
    pub job_id: String,
    /// Every rank, indexed by rank (this one included).
    pub peers: Vec<Peer>,
    /// This rank's data-plane listener: the one whose address was advertised.
    pub listener: TcpListener,
    /// When set, TCP data connections must prove they hold this token.
    pub token: Option<Vec<u8>>,
    /// When set, TCP data connections run TLS with these certificates and their messages
    /// are sealed (the cluster's `SHARDC_ENABLE_SSL`); shared memory never leaves the host.
    pub tls: Option<DataPlaneTls>,
    /// How long a member waits for the others (setup included) before
    /// [`CommError::Timeout`].
    pub timeout: Duration,
}

/// A rank's communicator between processes: it runs every collective whose group lies on
/// this host through shared memory ([`ShmComm`]) and everything else — groups spanning
/// hosts, send and receive — over TCP ([`TcpComm`]). Results are bit-identical to the in-process world's
/// whichever path a group takes.
#[derive(Debug)]
pub struct ProcessComm {
    rank: usize,
    size: usize,
    shm: ShmComm,
    tcp: TcpComm,
}

impl ProcessComm {
    /// Maps the shared memory of this host's ranks and connects to every other rank over
    /// TCP; every rank of the job must call it at about the same time. Errors:
    /// [`CommError::InvalidArgument`] for an inconsistent setup, [`CommError::Timeout`]
    /// naming the ranks that never showed up, [`CommError::Transport`] when shared memory
    /// cannot be set up or a peer refuses this rank. Setup errors are reported as a
    /// `Barrier`.
    pub fn new(setup: CommSetup) -> Result<ProcessComm, CommError> {
        if setup.rank >= setup.size || setup.peers.len() != setup.size {
            return Err(CommError::InvalidArgument {
                collective: Collective::Barrier,
                group: (0..setup.size).collect(),
                rank: setup.rank,
                reason: format!(
                    "data plane setup: rank {} with {} peer entries in a world of {} ranks",
                    setup.rank,
                    setup.peers.len(),
                    setup.size
                ),
            });
        }
        let host = &setup.peers[setup.rank].host_id;
        let local_ranks: Vec<usize> = (0..setup.size)
            .filter(|&r| setup.peers[r].host_id == *host)
            .collect();
        let shm = ShmComm::new(&ShmSetup {
            rank: setup.rank,
            size: setup.size,
            job_id: setup.job_id.clone(),
            local_ranks,
            timeout: setup.timeout,
        })?;
        let tcp = TcpComm::new(TcpSetup {
            rank: setup.rank,
            size: setup.size,
            job_id: setup.job_id,
            peers: setup.peers.iter().map(|p| p.data_addr).collect(),
            listener: setup.listener,
            token: setup.token,
            tls: setup.tls,
            timeout: setup.timeout,
        })?;
        Ok(ProcessComm {
            rank: setup.rank,
            size: setup.size,
            shm,
            tcp,
        })
    }

    /// The shared-memory communicator (groups on this host).
    pub fn shm(&self) -> &ShmComm {
        &self.shm
    }

    /// The TCP communicator (groups spanning hosts, send and receive).
    pub fn tcp(&self) -> &TcpComm {
        &self.tcp
    }

    /// The ranks on this host, ascending (this one included).
    pub fn local_ranks(&self) -> Vec<usize> {
        (0..self.size).filter(|&r| self.shm.is_local(r)).collect()
    }

    /// The time a member waits for the others.
    pub fn timeout(&self) -> Duration {
        self.shm.timeout()
    }

    /// The communicator a group's collectives go through: every member decides alike, as
    /// the host ids are the same on every rank.
    fn route(&self, group: &[usize]) -> &dyn Communicator {
        if !group.is_empty() && self.shm.covers(group) {
            &self.shm
        } else {
            &self.tcp
        }
    }
}

impl Communicator for ProcessComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn all_reduce(
        &self,
        group: &[usize],
        op: ReduceOp,
        tensor: &mut Tensor,
    ) -> Result<(), CommError> {
        self.route(group).all_reduce(group, op, tensor)
    }

    fn all_gather(
        &self,
        group: &[usize],
        axis: usize,
        input: &Tensor,
    ) -> Result<Tensor, CommError> {
        self.route(group).all_gather(group, axis, input)
    }

    fn reduce_scatter(
        &self,
        group: &[usize],
        op: ReduceOp,
        axis: usize,
        input: &Tensor,
    ) -> Result<Tensor, CommError> {
        self.route(group).reduce_scatter(group, op, axis, input)
    }

    fn all_to_all(
        &self,
        group: &[usize],
        split_dim: usize,
        concat_dim: usize,
        input: &Tensor,
    ) -> Result<Tensor, CommError> {
        self.route(group)
            .all_to_all(group, split_dim, concat_dim, input)
    }

    fn broadcast(
        &self,
        group: &[usize],
        root: usize,
        tensor: &mut Tensor,
    ) -> Result<(), CommError> {
        self.route(group).broadcast(group, root, tensor)
    }

    fn send(&self, dest: usize, tag: i64, tensor: &Tensor) -> Result<(), CommError> {
        self.tcp.send(dest, tag, tensor)
    }

    fn recv(&self, src: usize, tag: i64, ty: &TensorType) -> Result<Tensor, CommError> {
        self.tcp.recv(src, tag, ty)
    }

    fn overlaps_compute(&self, group: &[usize]) -> bool {
        self.route(group).overlaps_compute(group)
    }

    fn barrier(&self, group: &[usize]) -> Result<(), CommError> {
        self.route(group).barrier(group)
    }
}
