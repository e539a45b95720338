//! [`TcpSetup`]: what a rank needs to join the TCP data plane (read by `tcp.rs`, which
//! checks it, and by `mesh.rs`, which connects with it).

use super::seal::DataPlaneTls;
use std::net::{SocketAddr, TcpListener};
use std::time::Duration;

/// Everything a rank needs to join the TCP data plane.
#[derive(Debug)]
pub struct TcpSetup {
    /// This rank, in `0..size`.
    pub rank: usize,
    /// The number of ranks in the world.
    pub size: usize,
    /// The job's id, the same on every rank (at most 255 bytes): connections of other jobs
    /// are refused.
    pub job_id: String,
    /// Every rank's data-plane address (its listener's), indexed by rank (this rank's own
    /// entry is not used).
    pub peers: Vec<SocketAddr>,
    /// This rank's listener, bound to the address advertised as `peers[rank]`. It is closed
    /// once every higher rank has connected.
    pub listener: TcpListener,
    /// When set, peers must prove they hold this token (HMAC-SHA256 challenge-response).
    pub token: Option<Vec<u8>>,
    /// When set, every connection runs a TLS handshake with these certificates and its
    /// messages travel in sealed records ([`DataPlaneTls`]); every rank must agree.
    pub tls: Option<DataPlaneTls>,
    /// How long setup and every call wait for the other ranks.
    pub timeout: Duration,
}
