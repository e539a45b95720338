//! The cluster's environment, as MindSpore's dynamic cluster and `mpirun` set it.
//!
//! | Variable | Meaning |
//! |---|---|
//! | `MS_ROLE` | `MS_SCHED` (the scheduler) or `MS_WORKER` |
//! | `MS_WORKER_NUM` | number of workers (required with `MS_ROLE`) |
//! | `MS_SCHED_HOST` | the scheduler's host (default `127.0.0.1`) |
//! | `MS_SCHED_PORT` | the scheduler's port (required with `MS_ROLE`; `8118` under `mpirun`) |
//! | `MS_NODE_ID` | optional node id (ranks not requested are given in node-id order) |
//! | `SHARDC_RANK`, `OMPI_COMM_WORLD_RANK`, `PMI_RANK` | the rank requested (first set wins) |
//! | `OMPI_COMM_WORLD_SIZE`, `PMI_SIZE` | the world size under `mpirun` |
//! | `OMPI_COMM_WORLD_LOCAL_RANK`, `MPI_LOCALRANKID` | the rank on this host |
//! | `SHARDC_CLUSTER_TOKEN` / `SHARDC_CLUSTER_TOKEN_FILE` | the shared token |
//! | `SHARDC_ENABLE_SSL`, `SHARDC_SSL_CONFIG`, `SHARDC_SSL_SERVER_PASSWORD`, `SHARDC_SSL_CLIENT_PASSWORD` | TLS |
//! | `SHARDC_CLUSTER_TIMEOUT` | seconds to connect and to wait for every worker (default 120) |
//! | `SHARDC_HEARTBEAT_INTERVAL_MS` | heartbeat period in milliseconds (default 500) |
//! | `SHARDC_HEARTBEAT_TIMEOUT` | seconds without a heartbeat before a peer is lost (default 10) |
//! | `SHARDC_HOST_ID` | overrides the detected host id |
//! | `RANK_TABLE_FILE`, `RANK_ID`, `RANK_SIZE` | an Ascend job started by hand, one process per NPU (see below) |
//!
//! Under `mpirun` without `MS_ROLE`, every process is a worker and the one with rank 0 also
//! runs the scheduler ([`ClusterEnv::embed_scheduler`]) at `MS_SCHED_HOST:MS_SCHED_PORT`.
//!
//! Started as MindSpore's Ascend tutorials start a job (a script that starts one process per
//! NPU with `RANK_TABLE_FILE`, `RANK_ID`, `RANK_SIZE` and `DEVICE_ID`, no `MS_ROLE`, no
//! `mpirun`), every process is a worker of rank `RANK_ID`, and rank 0 also runs the scheduler,
//! by default on the server of rank 0 in the table ([`super::rank_table`]) at port
//! `MS_SCHED_PORT` (8118 when unset). The table also gives the rank's place on its server
//! (its local rank).

use super::auth::Token;
use super::ClusterError;
use std::path::PathBuf;
use std::time::Duration;

/// The port of the scheduler embedded in rank 0 under `mpirun` when `MS_SCHED_PORT` is unset.
pub const DEFAULT_MPI_SCHED_PORT: u16 = 8118;

/// Default host of the scheduler.
pub const DEFAULT_SCHED_HOST: &str = "127.0.0.1";

/// A process's role in the cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// `MS_ROLE=MS_SCHED`: runs the scheduler only.
    Scheduler,
    /// `MS_ROLE=MS_WORKER`, or any process under `mpirun`: runs one rank.
    Worker,
}

/// What started the process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launcher {
    /// MindSpore's dynamic-cluster variables (`MS_ROLE`, from `shardc launch`, msrun or a
    /// script).
    DynamicCluster,
    /// `mpirun` (Open MPI's `OMPI_COMM_WORLD_*` or a PMI's `PMI_*`), without `MS_ROLE`.
    Mpi,
    /// A process per NPU started by hand with MindSpore's rank table (`RANK_TABLE_FILE`,
    /// `RANK_ID`, `RANK_SIZE`), without `MS_ROLE` or `mpirun`.
    RankTable,
}

/// The control plane's timeouts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// How long a worker tries to reach the scheduler, and how long the scheduler waits for
    /// every worker to join (`SHARDC_CLUSTER_TIMEOUT`, default 120 s).
    pub join: Duration,
    /// Heartbeat period (`SHARDC_HEARTBEAT_INTERVAL_MS`, default 500 ms).
    pub heartbeat_interval: Duration,
    /// Silence after which a peer is lost (`SHARDC_HEARTBEAT_TIMEOUT`, default 10 s).
    pub heartbeat_timeout: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            join: Duration::from_secs(120),
            heartbeat_interval: Duration::from_millis(500),
            heartbeat_timeout: Duration::from_secs(10),
        }
    }
}

/// The TLS settings named by the environment (MindSpore's `enable_ssl` + `config_file_path`).
#[derive(Clone, PartialEq, Eq)]
pub struct TlsEnv {
    /// `SHARDC_SSL_CONFIG`: the JSON file naming certificates, keys, CA, CRL and ciphers.
    pub config_file: PathBuf,
    /// `SHARDC_SSL_SERVER_PASSWORD`: the server certificate's PKCS#12 password.
    pub server_password: Option<String>,
    /// `SHARDC_SSL_CLIENT_PASSWORD`: the client certificate's PKCS#12 password.
    pub client_password: Option<String>,
}

impl std::fmt::Debug for TlsEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsEnv")
            .field("config_file", &self.config_file)
            .field(
                "server_password",
                &self.server_password.as_ref().map(|_| "<set>"),
            )
            .field(
                "client_password",
                &self.client_password.as_ref().map(|_| "<set>"),
            )
            .finish()
    }
}

/// The cluster environment of this process.
#[derive(Clone, Debug)]
pub struct ClusterEnv {
    /// Scheduler or worker.
    pub role: Role,
    /// What started the process.
    pub launcher: Launcher,
    /// Number of workers (`MS_WORKER_NUM`, or the MPI world size).
    pub worker_num: usize,
    /// The scheduler's host (`MS_SCHED_HOST`).
    pub sched_host: String,
    /// The scheduler's port (`MS_SCHED_PORT`).
    pub sched_port: u16,
    /// `MS_NODE_ID`.
    pub node_id: Option<String>,
    /// The rank requested (`SHARDC_RANK`, `OMPI_COMM_WORLD_RANK`, `PMI_RANK`).
    pub requested_rank: Option<usize>,
    /// The rank on this host (`OMPI_COMM_WORLD_LOCAL_RANK`, `MPI_LOCALRANKID`).
    pub local_rank: Option<usize>,
    /// Whether this worker also runs the scheduler (rank 0 under `mpirun`).
    pub embed_scheduler: bool,
    /// The shared token, if one is configured.
    pub token: Option<Token>,
    /// TLS, if `SHARDC_ENABLE_SSL` is on.
    pub tls: Option<TlsEnv>,
    /// Timeouts.
    pub timeouts: Timeouts,
    /// `SHARDC_HOST_ID`, if set (else the host id is detected, see [`host_id`]).
    pub host_id: Option<String>,
}

impl ClusterEnv {
    /// The scheduler's address as `host:port` (brackets around an IPv6 literal).
    pub fn sched_addr(&self) -> String {
        host_port(&self.sched_host, self.sched_port)
    }

    /// Reads the process environment; `Ok(None)` when neither `MS_ROLE` nor an `mpirun`
    /// variable is set (a single-process run).
    pub fn from_env() -> Result<Option<ClusterEnv>, ClusterError> {
        Self::from_vars(&|name| std::env::var(name).ok())
    }

    /// [`ClusterEnv::from_env`] over any variable lookup (for tests).
    pub fn from_vars(
        var: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<ClusterEnv>, ClusterError> {
        let get = |name: &str| var(name).filter(|v| !v.trim().is_empty());
        let mpi_rank = first_usize(&get, &["OMPI_COMM_WORLD_RANK", "PMI_RANK"])?;
        let mpi_size = first_usize(&get, &["OMPI_COMM_WORLD_SIZE", "PMI_SIZE"])?;
        let role_var = get("MS_ROLE");
        let table_var = get("RANK_TABLE_FILE");
        if role_var.is_none() && mpi_rank.is_none() && mpi_size.is_none() {
            return match table_var {
                Some(file) => Self::from_rank_table(&get, file.trim()).map(Some),
                None => Ok(None),
            };
        }
        let (role, launcher) = match role_var.as_deref().map(str::trim) {
            Some("MS_SCHED") => (Role::Scheduler, Launcher::DynamicCluster),
            Some("MS_WORKER") => (Role::Worker, Launcher::DynamicCluster),
            Some(other) => {
                return Err(invalid(
                    "MS_ROLE",
                    other,
                    "expected MS_SCHED (the scheduler) or MS_WORKER; parameter servers (MS_PSERVER) are not supported",
                ))
            }
            None => (Role::Worker, Launcher::Mpi),
        };

        // The number of workers.
        let ms_num = match get("MS_WORKER_NUM") {
            Some(v) => Some(positive(&v, "MS_WORKER_NUM")?),
            None => None,
        };
        let worker_num = match (ms_num, mpi_size) {
            (Some(n), Some((size, size_var))) if n != size => {
                return Err(invalid(
                    "MS_WORKER_NUM",
                    &n.to_string(),
                    &format!("it disagrees with {size_var}={size} (the MPI world size)"),
                ))
            }
            (Some(n), _) => n,
            (None, Some((size, size_var))) => {
                if size == 0 {
                    return Err(invalid(size_var, "0", "the world size must be a positive integer"));
                }
                size
            }
            (None, None) => {
                return Err(ClusterError::MissingEnv {
                    var: "MS_WORKER_NUM".into(),
                    reason: match launcher {
                        Launcher::DynamicCluster => format!(
                            "it is required with MS_ROLE={} (the number of workers, a positive integer)",
                            role_var.as_deref().unwrap_or_default().trim()
                        ),
                        Launcher::Mpi | Launcher::RankTable => "it is required under mpirun when neither OMPI_COMM_WORLD_SIZE nor PMI_SIZE is set".into(),
                    },
                })
            }
        };

        // The scheduler's address.
        let sched_host = get("MS_SCHED_HOST")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|| DEFAULT_SCHED_HOST.to_string());
        let sched_port = match get("MS_SCHED_PORT") {
            Some(v) => {
                let p: u64 = v.trim().parse().map_err(|_| {
                    invalid("MS_SCHED_PORT", &v, "expected a port number in 1..=65535")
                })?;
                match u16::try_from(p) {
                    Ok(p) if p > 0 => p,
                    _ => {
                        return Err(invalid(
                            "MS_SCHED_PORT",
                            &v,
                            "expected a port number in 1..=65535",
                        ))
                    }
                }
            }
            None => match launcher {
                Launcher::Mpi | Launcher::RankTable => DEFAULT_MPI_SCHED_PORT,
                Launcher::DynamicCluster => {
                    return Err(ClusterError::MissingEnv {
                        var: "MS_SCHED_PORT".into(),
                        reason: format!(
                            "it is required with MS_ROLE={} (the scheduler's port, 1..=65535)",
                            role_var.as_deref().unwrap_or_default().trim()
                        ),
                    })
                }
            },
        };

        // Rank requested.
        let requested = match get("SHARDC_RANK") {
            Some(v) => Some((nonneg(&v, "SHARDC_RANK")?, "SHARDC_RANK")),
            None => mpi_rank,
        };
        if let Some((r, r_var)) = requested {
            if r >= worker_num {
                return Err(invalid(
                    r_var,
                    &r.to_string(),
                    &format!("the rank must be below the number of workers ({worker_num})"),
                ));
            }
        }
        let requested_rank = requested.map(|(r, _)| r);
        let local_rank =
            first_usize(&get, &["OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID"])?.map(|(r, _)| r);
        let embed_scheduler = launcher == Launcher::Mpi && requested_rank == Some(0);
        if launcher == Launcher::Mpi && requested_rank.is_none() {
            return Err(ClusterError::MissingEnv {
                var: "OMPI_COMM_WORLD_RANK".into(),
                reason: "under mpirun every process needs its rank (OMPI_COMM_WORLD_RANK, PMI_RANK or SHARDC_RANK) to know which one runs the scheduler".into(),
            });
        }

        // The token.
        // An empty or blank token is refused rather than taken as "no token".
        let token = match (
            var("SHARDC_CLUSTER_TOKEN"),
            get("SHARDC_CLUSTER_TOKEN_FILE"),
        ) {
            (Some(_), Some(_)) => {
                return Err(ClusterError::Token {
                    source_name: "SHARDC_CLUSTER_TOKEN and SHARDC_CLUSTER_TOKEN_FILE".into(),
                    reason: "both are set; set only one".into(),
                })
            }
            (Some(t), None) => Some(Token::new(t.as_bytes(), "SHARDC_CLUSTER_TOKEN")?),
            (None, Some(path)) => Some(Token::from_file(std::path::Path::new(path.trim()))?),
            (None, None) => None,
        };

        // TLS.
        let tls = match get("SHARDC_ENABLE_SSL") {
            Some(v) if flag(&v, "SHARDC_ENABLE_SSL")? => {
                let config_file = get("SHARDC_SSL_CONFIG").ok_or_else(|| ClusterError::MissingEnv {
                    var: "SHARDC_SSL_CONFIG".into(),
                    reason: "it is required with SHARDC_ENABLE_SSL on (the TLS configuration JSON file)".into(),
                })?;
                Some(TlsEnv {
                    config_file: PathBuf::from(config_file.trim()),
                    server_password: var("SHARDC_SSL_SERVER_PASSWORD"),
                    client_password: var("SHARDC_SSL_CLIENT_PASSWORD"),
                })
            }
            _ => None,
        };

        // Timeouts.
        let mut timeouts = Timeouts::default();
        if let Some(v) = get("SHARDC_CLUSTER_TIMEOUT") {
            timeouts.join = seconds(&v, "SHARDC_CLUSTER_TIMEOUT")?;
        }
        if let Some(v) = get("SHARDC_HEARTBEAT_INTERVAL_MS") {
            timeouts.heartbeat_interval =
                Duration::from_millis(positive(&v, "SHARDC_HEARTBEAT_INTERVAL_MS")? as u64);
        }
        if let Some(v) = get("SHARDC_HEARTBEAT_TIMEOUT") {
            timeouts.heartbeat_timeout = seconds(&v, "SHARDC_HEARTBEAT_TIMEOUT")?;
        }
        if timeouts.heartbeat_timeout <= timeouts.heartbeat_interval {
            return Err(invalid(
                "SHARDC_HEARTBEAT_TIMEOUT",
                &format!("{}", timeouts.heartbeat_timeout.as_secs_f64()),
                &format!(
                    "the heartbeat timeout must exceed the heartbeat interval ({} ms)",
                    timeouts.heartbeat_interval.as_millis()
                ),
            ));
        }

        Ok(Some(ClusterEnv {
            role,
            launcher,
            worker_num,
            sched_host,
            sched_port,
            node_id: get("MS_NODE_ID").map(|s| s.trim().to_string()),
            requested_rank,
            local_rank,
            embed_scheduler,
            token,
            tls,
            timeouts,
            host_id: get("SHARDC_HOST_ID").map(|s| s.trim().to_string()),
        }))
    }
}

impl ClusterEnv {
    /// A worker of a job started by hand with MindSpore's rank table (see the module doc):
    /// `RANK_ID` (or `SHARDC_RANK`) and `RANK_SIZE` are required, the size must be the
    /// table's, and rank 0 runs the scheduler on its table server unless `MS_SCHED_HOST` says
    /// otherwise.
    fn from_rank_table(get: &Lookup<'_>, file: &str) -> Result<ClusterEnv, ClusterError> {
        let table = super::rank_table::RankTable::from_file(std::path::Path::new(file))?;
        let size = match get("RANK_SIZE") {
            Some(v) => positive(&v, "RANK_SIZE")?,
            None => {
                return Err(ClusterError::MissingEnv {
                    var: "RANK_SIZE".into(),
                    reason: format!(
                        "it is required with RANK_TABLE_FILE={file} (the number of ranks, {} in the table)",
                        table.size()
                    ),
                })
            }
        };
        if size != table.size() {
            return Err(invalid(
                "RANK_SIZE",
                &size.to_string(),
                &format!("the rank table {file} lists {} device(s)", table.size()),
            ));
        }
        let (rank, rank_var) = match (get("SHARDC_RANK"), get("RANK_ID")) {
            (Some(v), _) => (nonneg(&v, "SHARDC_RANK")?, "SHARDC_RANK"),
            (None, Some(v)) => (nonneg(&v, "RANK_ID")?, "RANK_ID"),
            (None, None) => {
                return Err(ClusterError::MissingEnv {
                    var: "RANK_ID".into(),
                    reason: format!(
                        "it is required with RANK_TABLE_FILE={file} (this process's rank)"
                    ),
                })
            }
        };
        let place = table.place(rank).ok_or_else(|| {
            invalid(
                rank_var,
                &rank.to_string(),
                &format!("the rank must be below RANK_SIZE ({size})"),
            )
        })?;
        let root = table.place(0).map(|p| p.server_id).unwrap_or_default();
        let mut env = ClusterEnv::from_vars(&|name| match name {
            // Read the rest as a worker under mpirun would be, then mark it ours.
            "OMPI_COMM_WORLD_RANK" => Some(rank.to_string()),
            "OMPI_COMM_WORLD_SIZE" => Some(size.to_string()),
            "OMPI_COMM_WORLD_LOCAL_RANK" => Some(place.local_rank.to_string()),
            "MS_SCHED_HOST" => get("MS_SCHED_HOST").or_else(|| Some(root.clone())),
            "SHARDC_RANK" | "PMI_RANK" | "PMI_SIZE" | "MPI_LOCALRANKID" | "MS_ROLE"
            | "RANK_TABLE_FILE" | "MS_WORKER_NUM" => None,
            other => get(other),
        })?
        .ok_or_else(|| ClusterError::InvalidConfig {
            what: "the rank table job".into(),
            value: file.to_string(),
            reason: "it names no worker".into(),
        })?;
        env.launcher = Launcher::RankTable;
        Ok(env)
    }
}

/// `host:port`, with brackets around an IPv6 literal.
pub fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// This process's host id: `SHARDC_HOST_ID` if set, else `<boot id>/<network namespace>`
/// (`/proc/sys/kernel/random/boot_id` and the target of `/proc/self/ns/net`), so that two
/// network namespaces of one machine are two hosts. Where `/proc` lacks them, the host name.
pub fn host_id() -> String {
    if let Ok(id) = std::env::var("SHARDC_HOST_ID") {
        if !id.trim().is_empty() {
            return id.trim().to_string();
        }
    }
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .ok();
    let net = std::fs::read_link("/proc/self/ns/net")
        .map(|p| p.display().to_string())
        .ok();
    match (boot, net) {
        (Some(b), Some(n)) => format!("{b}/{n}"),
        (Some(b), None) => b,
        _ => format!("host:{}", hostname()),
    }
}

/// This machine's host name (`/proc/sys/kernel/hostname`, `$HOSTNAME`, or `unknown`).
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|s| !s.is_empty()))
        .unwrap_or_else(|| "unknown".to_string())
}

fn invalid(var: &str, value: &str, reason: &str) -> ClusterError {
    ClusterError::InvalidEnv {
        var: var.to_string(),
        value: value.to_string(),
        reason: reason.to_string(),
    }
}

fn nonneg(v: &str, var: &str) -> Result<usize, ClusterError> {
    v.trim()
        .parse::<usize>()
        .map_err(|_| invalid(var, v, "expected a non-negative integer"))
}

fn positive(v: &str, var: &str) -> Result<usize, ClusterError> {
    match v.trim().parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(invalid(var, v, "expected a positive integer")),
    }
}

fn seconds(v: &str, var: &str) -> Result<Duration, ClusterError> {
    match v.trim().parse::<f64>() {
        Ok(s) if s.is_finite() && s > 0.0 && s < 1e9 => Ok(Duration::from_secs_f64(s)),
        _ => Err(invalid(var, v, "expected a positive number of seconds")),
    }
}

fn flag(v: &str, var: &str) -> Result<bool, ClusterError> {
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(invalid(var, v, "expected true or false (or 1 / 0)")),
    }
}

type Lookup<'a> = dyn Fn(&str) -> Option<String> + 'a;

fn first_usize(
    get: &Lookup<'_>,
    vars: &[&'static str],
) -> Result<Option<(usize, &'static str)>, ClusterError> {
    for &name in vars {
        if let Some(v) = get(name) {
            return Ok(Some((nonneg(&v, name)?, name)));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> Result<Option<ClusterEnv>, ClusterError> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        ClusterEnv::from_vars(&move |k| map.get(k).cloned())
    }

    fn err(pairs: &[(&str, &str)]) -> String {
        env(pairs).unwrap_err().to_string()
    }

    #[test]
    fn no_cluster_variables_is_a_single_process_run() {
        assert!(env(&[]).unwrap().is_none());
        assert!(env(&[("MS_WORKER_NUM", "4")]).unwrap().is_none());
    }

    #[test]
    fn dynamic_cluster_worker_and_scheduler() {
        let e = env(&[
            ("MS_ROLE", "MS_WORKER"),
            ("MS_WORKER_NUM", "4"),
            ("MS_SCHED_HOST", "10.0.0.1"),
            ("MS_SCHED_PORT", "8081"),
            ("MS_NODE_ID", "n2"),
            ("SHARDC_RANK", "2"),
            ("SHARDC_CLUSTER_TOKEN", "s3cret"),
            ("SHARDC_CLUSTER_TIMEOUT", "2.5"),
            ("SHARDC_HEARTBEAT_INTERVAL_MS", "100"),
            ("SHARDC_HEARTBEAT_TIMEOUT", "3"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(e.role, Role::Worker);
        assert_eq!(e.launcher, Launcher::DynamicCluster);
        assert_eq!(e.worker_num, 4);
        assert_eq!(e.sched_addr(), "10.0.0.1:8081");
        assert_eq!(e.node_id.as_deref(), Some("n2"));
        assert_eq!(e.requested_rank, Some(2));
        assert!(!e.embed_scheduler);
        assert_eq!(e.token.as_ref().unwrap().as_bytes(), b"s3cret");
        assert_eq!(e.timeouts.join, Duration::from_millis(2500));
        assert_eq!(e.timeouts.heartbeat_interval, Duration::from_millis(100));
        assert_eq!(e.timeouts.heartbeat_timeout, Duration::from_secs(3));

        let s = env(&[
            ("MS_ROLE", "MS_SCHED"),
            ("MS_WORKER_NUM", "8"),
            ("MS_SCHED_PORT", "9000"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(s.role, Role::Scheduler);
        assert_eq!(s.sched_addr(), "127.0.0.1:9000");
        assert_eq!(s.timeouts, Timeouts::default());
        assert!(s.token.is_none() && s.tls.is_none());
    }

    #[test]
    fn missing_and_invalid_values_are_named() {
        assert_eq!(
            err(&[("MS_ROLE", "MS_WORKER"), ("MS_SCHED_PORT", "1")]),
            "environment variable MS_WORKER_NUM is not set: it is required with MS_ROLE=MS_WORKER (the number of workers, a positive integer)"
        );
        assert_eq!(
            err(&[
                ("MS_ROLE", "MS_WORKER"),
                ("MS_WORKER_NUM", "zero"),
                ("MS_SCHED_PORT", "1")
            ]),
            "environment variable MS_WORKER_NUM=\"zero\" is invalid: expected a positive integer"
        );
        assert!(err(&[
            ("MS_ROLE", "MS_SCHED"),
            ("MS_WORKER_NUM", "0"),
            ("MS_SCHED_PORT", "1")
        ])
        .contains("MS_WORKER_NUM=\"0\""));
        assert!(err(&[("MS_ROLE", "MS_SCHED"), ("MS_WORKER_NUM", "2")])
            .starts_with("environment variable MS_SCHED_PORT is not set"));
        assert_eq!(
            err(&[("MS_ROLE", "MS_SCHED"), ("MS_WORKER_NUM", "2"), ("MS_SCHED_PORT", "70000")]),
            "environment variable MS_SCHED_PORT=\"70000\" is invalid: expected a port number in 1..=65535"
        );
        assert!(err(&[("MS_ROLE", "MS_PSERVER")]).contains("MS_ROLE=\"MS_PSERVER\""));
        assert_eq!(
            err(&[("MS_ROLE", "MS_WORKER"), ("MS_WORKER_NUM", "2"), ("MS_SCHED_PORT", "1"), ("SHARDC_RANK", "2")]),
            "environment variable SHARDC_RANK=\"2\" is invalid: the rank must be below the number of workers (2)"
        );
        assert!(err(&[
            ("MS_ROLE", "MS_WORKER"),
            ("MS_WORKER_NUM", "2"),
            ("MS_SCHED_PORT", "1"),
            ("SHARDC_CLUSTER_TIMEOUT", "-1")
        ])
        .contains(
            "SHARDC_CLUSTER_TIMEOUT=\"-1\" is invalid: expected a positive number of seconds"
        ));
        assert!(err(&[
            ("MS_ROLE", "MS_WORKER"),
            ("MS_WORKER_NUM", "2"),
            ("MS_SCHED_PORT", "1"),
            ("SHARDC_HEARTBEAT_TIMEOUT", "0.1")
        ])
        .contains("must exceed the heartbeat interval (500 ms)"));
        assert!(err(&[
            ("MS_ROLE", "MS_WORKER"),
            ("MS_WORKER_NUM", "2"),
            ("MS_SCHED_PORT", "1"),
            ("SHARDC_CLUSTER_TOKEN", "  ")
        ])
        .starts_with("cluster token SHARDC_CLUSTER_TOKEN: the token is empty"));
        assert!(err(&[
            ("MS_ROLE", "MS_WORKER"),
            ("MS_WORKER_NUM", "2"),
            ("MS_SCHED_PORT", "1"),
            ("SHARDC_ENABLE_SSL", "true")
        ])
        .starts_with("environment variable SHARDC_SSL_CONFIG is not set"));
    }

    #[test]
    fn a_rank_table_job_gives_each_process_its_rank_and_rank_zero_the_scheduler() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("hccl_2s.json");
        std::fs::write(
            &file,
            r#"{"version": "1.0", "server_count": "2", "server_list": [
                {"server_id": "10.0.0.1", "device": [
                    {"device_id": "0", "device_ip": "192.168.1.1", "rank_id": "0"},
                    {"device_id": "1", "device_ip": "192.168.1.2", "rank_id": "1"}]},
                {"server_id": "10.0.0.2", "device": [
                    {"device_id": "4", "device_ip": "192.168.1.3", "rank_id": "2"}]}],
                "status": "completed"}"#,
        )
        .unwrap();
        let f = file.to_str().unwrap();
        let e = env(&[("RANK_TABLE_FILE", f), ("RANK_ID", "2"), ("RANK_SIZE", "3")])
            .unwrap()
            .unwrap();
        assert_eq!(e.launcher, Launcher::RankTable);
        assert_eq!((e.requested_rank, e.worker_num), (Some(2), 3));
        assert_eq!(e.local_rank, Some(0));
        assert!(!e.embed_scheduler);
        assert_eq!(e.sched_addr(), "10.0.0.1:8118");
        let e = env(&[
            ("RANK_TABLE_FILE", f),
            ("RANK_ID", "0"),
            ("RANK_SIZE", "3"),
            ("MS_SCHED_HOST", "127.0.0.1"),
            ("MS_SCHED_PORT", "9000"),
        ])
        .unwrap()
        .unwrap();
        assert!(e.embed_scheduler);
        assert_eq!(e.sched_addr(), "127.0.0.1:9000");

        assert_eq!(
            err(&[("RANK_TABLE_FILE", f), ("RANK_ID", "0"), ("RANK_SIZE", "8")]),
            "environment variable RANK_SIZE=\"8\" is invalid: the rank table ".to_string()
                + f
                + " lists 3 device(s)"
        );
        assert!(
            err(&[("RANK_TABLE_FILE", f), ("RANK_SIZE", "3")]).starts_with(
                "environment variable RANK_ID is not set: it is required with RANK_TABLE_FILE="
            )
        );
        assert!(
            err(&[("RANK_TABLE_FILE", f), ("RANK_ID", "3"), ("RANK_SIZE", "3")])
                .contains("RANK_ID=\"3\" is invalid: the rank must be below RANK_SIZE (3)")
        );
        assert!(
            err(&[("RANK_TABLE_FILE", "/nonexistent/t.json"), ("RANK_ID", "0")])
                .starts_with("rank table /nonexistent/t.json: cannot read it")
        );
    }

    #[test]
    fn mpirun_rank_zero_embeds_the_scheduler() {
        let vars = [
            ("OMPI_COMM_WORLD_RANK", "0"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
        ];
        let e = env(&vars).unwrap().unwrap();
        assert_eq!(e.role, Role::Worker);
        assert_eq!(e.launcher, Launcher::Mpi);
        assert_eq!(e.worker_num, 4);
        assert_eq!(e.requested_rank, Some(0));
        assert_eq!(e.local_rank, Some(0));
        assert!(e.embed_scheduler);
        assert_eq!(e.sched_addr(), "127.0.0.1:8118");

        let e = env(&[
            ("PMI_RANK", "3"),
            ("PMI_SIZE", "4"),
            ("MS_SCHED_PORT", "9999"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(e.requested_rank, Some(3));
        assert!(!e.embed_scheduler);
        assert_eq!(e.sched_port, 9999);

        assert_eq!(
            err(&[("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "4"), ("MS_WORKER_NUM", "8")]),
            "environment variable MS_WORKER_NUM=\"8\" is invalid: it disagrees with OMPI_COMM_WORLD_SIZE=4 (the MPI world size)"
        );
        assert!(err(&[("OMPI_COMM_WORLD_SIZE", "4")]).contains("OMPI_COMM_WORLD_RANK is not set"));
    }

    #[test]
    fn ipv6_hosts_are_bracketed() {
        assert_eq!(host_port("::1", 5), "[::1]:5");
        assert_eq!(host_port("h", 5), "h:5");
    }

    #[test]
    fn host_id_names_boot_and_network_namespace() {
        let id = host_id();
        assert!(!id.is_empty());
        if std::path::Path::new("/proc/self/ns/net").exists()
            && std::env::var("SHARDC_HOST_ID").is_err()
        {
            assert!(id.contains("net:["), "{id}");
        }
    }
}
