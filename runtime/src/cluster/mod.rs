//! The cluster: MindSpore's dynamic-cluster rendezvous (a scheduler and N workers over TCP),
//! with a shared token, optional TLS, heartbeats and fault propagation.
//!
//! - [`env`](mod@env): the environment (`MS_ROLE`, `MS_WORKER_NUM`, `MS_SCHED_HOST`, `MS_SCHED_PORT`,
//!   `OMPI_COMM_WORLD_*`, `PMI_*`, the token, the timeouts) as a [`ClusterEnv`].
//! - [`rank_table`]: MindSpore's rank table file (`RANK_TABLE_FILE`) for Ascend jobs started
//!   by hand: each rank's server, NPU and local rank.
//! - [`frame`]: the control protocol's frames and messages; a pure, fuzzable decoder.
//! - [`auth`]: the shared [`Token`] and the HMAC-SHA256 challenge-response.
//! - [`scheduler`]: the [`Scheduler`]: accepts and authenticates workers, assigns ranks, sends
//!   the address table, watches heartbeats and aborts every worker naming a lost rank.
//! - [`worker`]: [`join`] a job and get a [`Membership`]; background heartbeats; an abort
//!   callback.
//!
//! The protocol on one connection (worker → scheduler on the left):
//!
//! ```text
//! Hello{nonce_w}            →
//!                           ←  Challenge{nonce_s}
//! AuthResponse{HMAC(token, nonce_s || "shardc-cluster-v1")}  →
//!                           ←  Refused{"wrong cluster token"}, or
//!                              Accepted{HMAC(token, nonce_w || "shardc-cluster-v1/scheduler")}
//! Register{node id, requested rank, host id, data port, pid, hostname}  →
//!                           ←  Refused{reason}  (wrong token, rank taken, job full, ...)
//!                           ←  Assign{rank, size, job id, peers}   (once every worker joined)
//! Heartbeat                 ↔  Heartbeat          (both ways, every interval)
//!                           ←  Abort{lost rank, reason}  (another worker was lost)
//! Finish{status}            →
//!                           ←  FinishAck
//! ```

pub mod auth;
pub mod env;
pub mod frame;
pub mod rank_table;
pub mod scheduler;
pub mod tls;
pub mod worker;

pub use auth::Token;
pub use env::{ClusterEnv, Launcher, Role, Timeouts, TlsEnv};
pub use frame::{FrameError, Message, PeerEntry};
pub use rank_table::{npu_of_rank, RankPlace, RankTable};
pub use scheduler::{
    JobReport, Logger, Scheduler, SchedulerConfig, SchedulerHandle, WorkerSummary,
};
pub use tls::{TlsConfigs, WorkerTls};
pub use worker::{
    join, start_embedded_scheduler, AbortHandler, Membership, PeerInfo, WorkerConfig,
};

use std::time::Duration;

/// Everything that can go wrong in the control plane. Every message names the value concerned
/// (variable, address, rank, file) and the reason.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// A required environment variable is not set.
    #[error("environment variable {var} is not set: {reason}")]
    MissingEnv {
        /// The variable.
        var: String,
        /// Why it is needed.
        reason: String,
    },
    /// An environment variable has a value that cannot be used.
    #[error("environment variable {var}={value:?} is invalid: {reason}")]
    InvalidEnv {
        /// The variable.
        var: String,
        /// Its value.
        value: String,
        /// What was expected.
        reason: String,
    },
    /// The rank table file (`RANK_TABLE_FILE`) cannot be used.
    #[error("rank table {file}: {reason}")]
    RankTable {
        /// The file.
        file: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The cluster token (or its file) cannot be used.
    #[error("cluster token {source_name}: {reason}")]
    Token {
        /// Where the token came from (`SHARDC_CLUSTER_TOKEN`, or the file's path).
        source_name: String,
        /// Why it was refused.
        reason: String,
    },
    /// A configuration value given by the program (not the environment) is invalid.
    #[error("invalid cluster configuration: {what} is {value}: {reason}")]
    InvalidConfig {
        /// The setting.
        what: String,
        /// Its value.
        value: String,
        /// Why it is invalid.
        reason: String,
    },
    /// The scheduler cannot listen on its address (port in use, address not local, ...).
    #[error("the scheduler cannot listen on {addr}: {reason}")]
    Bind {
        /// The address asked for.
        addr: String,
        /// Why (`address already in use`, ...).
        reason: String,
    },
    /// A worker could not connect to the scheduler before its timeout.
    #[error("could not reach the scheduler at {addr} within {}: {reason}", fmt_secs(*timeout))]
    Connect {
        /// The scheduler's address.
        addr: String,
        /// The connect timeout.
        timeout: Duration,
        /// The last connection error (`connection refused`, ...).
        reason: String,
    },
    /// The scheduler refused this worker.
    #[error("the scheduler at {addr} refused this worker: {reason}")]
    Refused {
        /// The scheduler's address.
        addr: String,
        /// The scheduler's reason (`wrong cluster token`, a rank taken, ...).
        reason: String,
    },
    /// The scheduler did not prove that it knows the cluster token (or has none).
    #[error("the scheduler at {addr} is not trusted: {reason}")]
    SchedulerAuth {
        /// The scheduler's address.
        addr: String,
        /// What was wrong with its proof.
        reason: String,
    },
    /// The peer broke the protocol (an unexpected message in this state).
    #[error("protocol error with {peer}: {reason}")]
    Protocol {
        /// The peer (`the scheduler at H:P` or `the worker at A`).
        peer: String,
        /// What it sent and what was expected.
        reason: String,
    },
    /// A frame from the peer could not be decoded; the connection was closed.
    #[error("bad frame from {peer}: {source}")]
    Frame {
        /// The peer.
        peer: String,
        /// The decoder's error.
        source: FrameError,
    },
    /// An I/O operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done, with the address.
        context: String,
        /// The error.
        source: std::io::Error,
    },
    /// TLS could not be set up or its handshake failed.
    #[error("TLS with {peer}: {reason}")]
    Tls {
        /// The peer or the configuration file.
        peer: String,
        /// Why.
        reason: String,
    },
    /// Not every worker joined before the join timeout (scheduler side), or this worker got no
    /// rank in time (worker side).
    #[error("only {joined} of {expected} workers joined within {} (ranks missing: {})", fmt_secs(*timeout), fmt_ranks(missing))]
    JoinTimeout {
        /// Workers that had registered.
        joined: usize,
        /// `MS_WORKER_NUM`.
        expected: usize,
        /// The join timeout.
        timeout: Duration,
        /// The ranks nobody would have taken.
        missing: Vec<usize>,
    },
    /// This worker waited for its rank longer than its timeout.
    #[error("the scheduler at {addr} assigned no rank within {}: the job is still waiting for other workers", fmt_secs(*timeout))]
    AssignTimeout {
        /// The scheduler's address.
        addr: String,
        /// The timeout.
        timeout: Duration,
    },
    /// A worker of the job was lost (connection closed without finishing, no heartbeat, or a
    /// non-zero exit status); the scheduler aborted the job.
    #[error("rank {rank} ({who}) was lost: {reason}")]
    RankLost {
        /// The lost rank.
        rank: usize,
        /// `node N, host H, pid P`.
        who: String,
        /// Why (`its connection closed without finishing`, ...).
        reason: String,
    },
    /// The scheduler aborted this worker's job (another rank was lost).
    #[error("the job was aborted: {reason}")]
    Aborted {
        /// The scheduler's message (names the lost rank).
        reason: String,
    },
    /// The connection to the scheduler was lost.
    #[error("lost the scheduler at {addr}: {reason}")]
    SchedulerLost {
        /// The scheduler's address.
        addr: String,
        /// Why.
        reason: String,
    },
}

/// Formats a duration in seconds as the messages show it: `120 s`, `0.5 s`.
pub fn fmt_secs(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s.fract() == 0.0 {
        format!("{} s", d.as_secs())
    } else {
        let text = format!("{s:.3}");
        let text = text.trim_end_matches('0').trim_end_matches('.');
        format!("{text} s")
    }
}

/// Formats ranks as `1, 3` (or `none`).
fn fmt_ranks(ranks: &[usize]) -> String {
    if ranks.is_empty() {
        return "none".to_string();
    }
    ranks
        .iter()
        .map(|r| r.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// An I/O error as a short lower-case reason: `connection refused` rather than
/// `Connection refused (os error 111)`.
pub(crate) fn io_reason(e: &std::io::Error) -> String {
    let text = e.to_string();
    let text = match text.find(" (os error ") {
        Some(i) => text[..i].to_string(),
        None => text,
    };
    let mut chars = text.chars();
    match chars.next() {
        Some(c) => c.to_lowercase().collect::<String>() + chars.as_str(),
        None => format!("{:?}", e.kind()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_are_formatted_without_noise() {
        assert_eq!(fmt_secs(Duration::from_secs(120)), "120 s");
        assert_eq!(fmt_secs(Duration::from_millis(500)), "0.5 s");
        assert_eq!(fmt_secs(Duration::from_millis(1250)), "1.25 s");
    }

    #[test]
    fn io_reasons_are_short() {
        let e = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert_eq!(io_reason(&e), "connection refused");
        let e = std::io::Error::from_raw_os_error(111);
        assert_eq!(io_reason(&e), "connection refused");
    }
}
