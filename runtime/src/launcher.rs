//! The launcher (`shardc launch`, after MindSpore's `msrun`): on one node, starts the
//! scheduler (on the node that hosts it) and this node's workers with the dynamic-cluster
//! environment (`MS_ROLE`, `MS_WORKER_NUM`, `MS_SCHED_HOST`, `MS_SCHED_PORT`, `MS_NODE_ID`,
//! `RANK_ID`, ...), writes each worker's output to `DIR/1/rank.R/stdout` (and `stderr`) as
//! Open MPI's `--output-filename` lays it out and the tutorials grep it, the scheduler's to
//! `DIR/scheduler.log`, and with `join` waits for them all and returns the first non-zero exit
//! status (stopping the others when one fails).
//!
//! Ranks: the worker with local index `i` on node `node_rank` is rank
//! `node_rank * local_worker_num + i`; every node runs `local_worker_num` workers, so their
//! numbers agree across nodes (the last node may run fewer). The launcher asks the scheduler
//! for that rank through `SHARDC_RANK`.

use std::ffi::OsString;
use std::fs::{self, File};
use std::net::{TcpListener, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// What `shardc launch` was asked to do (msrun's options).
#[derive(Clone, Debug)]
pub struct LaunchOptions {
    /// `--worker-num`: workers in the whole job, on all nodes.
    pub worker_num: usize,
    /// `--local-worker-num`: workers started on this node.
    pub local_worker_num: usize,
    /// `--master-addr`: the scheduler's address (IP or host name).
    pub master_addr: String,
    /// `--master-port`: the scheduler's port.
    pub master_port: u16,
    /// `--node-rank`: this node's index; `None` is allowed when every worker runs here.
    pub node_rank: Option<usize>,
    /// `--log-dir`: where the logs go (created when missing).
    pub log_dir: PathBuf,
    /// `--join`: wait for every process and return the first non-zero exit status.
    pub join: bool,
    /// `--cluster-time-out`: seconds to wait for every worker to join (passed to the
    /// scheduler and the workers as `SHARDC_CLUSTER_TIMEOUT`).
    pub cluster_time_out: u64,
    /// The command that runs the scheduler (the `shardc` binary and its arguments); it is
    /// started with `MS_ROLE=MS_SCHED` on the node that hosts the scheduler.
    pub scheduler_command: Vec<OsString>,
    /// The program every worker runs, and its arguments.
    pub program: Vec<OsString>,
    /// Extra environment for the scheduler and the workers.
    pub env: Vec<(String, String)>,
}

/// Why the launch failed.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// An option is unusable.
    #[error("launch: {option} = {value}: {reason}")]
    Option {
        /// The option, as on the command line.
        option: &'static str,
        /// Its value.
        value: String,
        /// Why it is refused.
        reason: String,
    },
    /// A file or process could not be created.
    #[error("launch: {what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        source: std::io::Error,
    },
}

/// One process the launcher started.
#[derive(Debug)]
pub struct Launched {
    /// `"scheduler"` or `"rank R"`.
    pub name: String,
    /// The process.
    pub child: Child,
    /// Where its standard error goes (quoted when it fails).
    pub stderr_path: PathBuf,
}

/// How a joined launch ended.
#[derive(Debug)]
pub struct LaunchOutcome {
    /// 0 when every process exited with 0; else the first non-zero status seen (a process
    /// killed by a signal counts as 128 + the signal, as a shell reports it).
    pub status: i32,
    /// One line per process: its name, pid and how it ended.
    pub summary: Vec<String>,
}

fn option(option: &'static str, value: impl ToString, reason: impl Into<String>) -> LaunchError {
    LaunchError::Option {
        option,
        value: value.to_string(),
        reason: reason.into(),
    }
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> LaunchError {
    let what = what.into();
    move |source| LaunchError::Io { what, source }
}

impl LaunchOptions {
    /// Checks the options; returns this node's index (0 when every worker runs here).
    pub fn validate(&self) -> Result<usize, LaunchError> {
        if self.worker_num == 0 {
            return Err(option("--worker-num", 0, "must be at least 1"));
        }
        if self.local_worker_num == 0 || self.local_worker_num > self.worker_num {
            return Err(option(
                "--local-worker-num",
                self.local_worker_num,
                format!("must be between 1 and --worker-num ({})", self.worker_num),
            ));
        }
        if self.master_port == 0 {
            return Err(option(
                "--master-port",
                0,
                "must be a port number (1..65535)",
            ));
        }
        if self.program.is_empty() {
            return Err(option(
                "PROGRAM",
                "(none)",
                "give the program the workers run after `--`",
            ));
        }
        let node = if self.local_worker_num == self.worker_num {
            0
        } else {
            let Some(node) = self.node_rank else {
                return Err(option(
                    "--node-rank",
                    "(unset)",
                    format!(
                        "{} of {} workers run on this node, so the job spans several nodes: give each node's launcher its index",
                        self.local_worker_num, self.worker_num
                    ),
                ));
            };
            let first = node * self.local_worker_num;
            if first >= self.worker_num {
                return Err(option(
                    "--node-rank",
                    node,
                    format!(
                        "node {node} would start at rank {first}, but the job has only {} workers ({} per node)",
                        self.worker_num, self.local_worker_num
                    ),
                ));
            }
            node
        };
        Ok(node)
    }

    /// This node's ranks.
    pub fn local_ranks(&self, node: usize) -> std::ops::Range<usize> {
        let first = node * self.local_worker_num;
        first..(first + self.local_worker_num).min(self.worker_num)
    }

    /// Whether this node hosts the scheduler: node 0, or (without a node rank) the node whose
    /// addresses include `master_addr`.
    pub fn hosts_scheduler(&self, node: usize) -> bool {
        match self.node_rank {
            Some(_) => node == 0,
            None => is_local_address(&self.master_addr),
        }
    }

    /// The environment every process of the job gets (besides `self.env`).
    fn cluster_env(&self) -> Vec<(String, String)> {
        vec![
            ("MS_WORKER_NUM".into(), self.worker_num.to_string()),
            ("MS_SCHED_HOST".into(), self.master_addr.clone()),
            ("MS_SCHED_PORT".into(), self.master_port.to_string()),
            (
                "SHARDC_CLUSTER_TIMEOUT".into(),
                self.cluster_time_out.to_string(),
            ),
        ]
    }
}

/// Whether `addr` names an address of this machine (one a socket can be bound to here).
pub fn is_local_address(addr: &str) -> bool {
    let Ok(addrs) = (addr, 0u16).to_socket_addrs() else {
        return false;
    };
    addrs
        .into_iter()
        .any(|a| a.ip().is_loopback() || TcpListener::bind(a).is_ok())
}

/// The directory of rank `rank`'s logs: `DIR/1/rank.R` (Open MPI's layout).
pub fn rank_log_dir(log_dir: &Path, rank: usize) -> PathBuf {
    log_dir.join("1").join(format!("rank.{rank}"))
}

/// Starts the scheduler (when this node hosts it) and this node's workers. The processes run
/// on when the launcher returns; [`wait`] joins them.
pub fn start(opts: &LaunchOptions) -> Result<Vec<Launched>, LaunchError> {
    let node = opts.validate()?;
    fs::create_dir_all(&opts.log_dir).map_err(io(format!(
        "creating the log directory {}",
        opts.log_dir.display()
    )))?;
    let mut launched = Vec::new();
    let base = opts.cluster_env();
    if opts.hosts_scheduler(node) {
        let (exe, args) = opts
            .scheduler_command
            .split_first()
            .ok_or_else(|| option("scheduler command", "(none)", "empty"))?;
        let log = opts.log_dir.join("scheduler.log");
        let out = File::create(&log).map_err(io(format!("creating {}", log.display())))?;
        let err = out
            .try_clone()
            .map_err(io(format!("opening {}", log.display())))?;
        let mut cmd = Command::new(exe);
        cmd.args(args)
            .envs(base.iter().cloned())
            .envs(opts.env.iter().cloned())
            .env("MS_ROLE", "MS_SCHED")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        let child = cmd.spawn().map_err(io(format!(
            "starting the scheduler ({})",
            Path::new(exe).display()
        )))?;
        launched.push(Launched {
            name: "scheduler".into(),
            child,
            stderr_path: log,
        });
    }
    let (exe, args) = opts
        .program
        .split_first()
        .ok_or_else(|| option("PROGRAM", "(none)", "empty"))?;
    for (local, rank) in opts.local_ranks(node).enumerate() {
        let dir = rank_log_dir(&opts.log_dir, rank);
        fs::create_dir_all(&dir).map_err(io(format!("creating {}", dir.display())))?;
        let out_path = dir.join("stdout");
        let err_path = dir.join("stderr");
        let out =
            File::create(&out_path).map_err(io(format!("creating {}", out_path.display())))?;
        let err =
            File::create(&err_path).map_err(io(format!("creating {}", err_path.display())))?;
        let mut cmd = Command::new(exe);
        cmd.args(args)
            .envs(base.iter().cloned())
            .envs(opts.env.iter().cloned())
            .env("MS_ROLE", "MS_WORKER")
            .env("MS_NODE_ID", format!("node{node}-{local}"))
            .env("SHARDC_RANK", rank.to_string())
            .env("RANK_ID", rank.to_string())
            .env("RANK_SIZE", opts.worker_num.to_string())
            .env("MS_LOCAL_RANK", local.to_string())
            .env("LOCAL_RANK", local.to_string())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        match cmd.spawn() {
            Ok(child) => launched.push(Launched {
                name: format!("rank {rank}"),
                child,
                stderr_path: err_path,
            }),
            Err(e) => {
                stop(&mut launched);
                return Err(LaunchError::Io {
                    what: format!("starting rank {rank} ({})", Path::new(exe).display()),
                    source: e,
                });
            }
        }
    }
    Ok(launched)
}

/// Kills every process still running and reaps it.
pub fn stop(launched: &mut [Launched]) {
    for l in launched.iter_mut() {
        if matches!(l.child.try_wait(), Ok(None)) {
            let _ = l.child.kill();
        }
        let _ = l.child.wait();
    }
}

/// The shell's number for an exit status: the code, or 128 + the signal.
pub fn status_code(status: &ExitStatus) -> i32 {
    if let Some(code) = status.code() {
        return code;
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(sig) = status.signal() {
            return 128 + sig;
        }
    }
    1
}

/// Waits for every process. When one exits non-zero, the others get `grace` to end on their
/// own (the scheduler tells every worker to abort), then are killed. Returns the first
/// non-zero status (0 when all succeeded) and a summary line per process.
pub fn wait(mut launched: Vec<Launched>, grace: Duration) -> LaunchOutcome {
    let mut ended: Vec<Option<ExitStatus>> = vec![None; launched.len()];
    let mut first_failure: Option<(usize, i32)> = None;
    let mut kill_at: Option<Instant> = None;
    let mut killed = vec![false; launched.len()];
    loop {
        for (i, l) in launched.iter_mut().enumerate() {
            if ended[i].is_some() {
                continue;
            }
            match l.child.try_wait() {
                Ok(Some(st)) => {
                    ended[i] = Some(st);
                    let code = status_code(&st);
                    if code != 0 && first_failure.is_none() {
                        first_failure = Some((i, code));
                        kill_at = Some(Instant::now() + grace);
                    }
                }
                Ok(None) => {}
                Err(_) => {
                    // Not ours to wait for any more: count it as failed.
                    ended[i] = Some(ExitStatus::default());
                }
            }
        }
        if ended.iter().all(Option::is_some) {
            break;
        }
        if kill_at.is_some_and(|t| Instant::now() >= t) {
            for (i, l) in launched.iter_mut().enumerate() {
                if ended[i].is_none() {
                    let _ = l.child.kill();
                    killed[i] = true;
                }
            }
            kill_at = None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let summary = launched
        .iter()
        .zip(&ended)
        .zip(&killed)
        .map(|((l, st), &k)| {
            let st = st.map(|s| status_code(&s)).unwrap_or(1);
            let how = if k {
                "killed by the launcher after another process failed".to_string()
            } else if st == 0 {
                "exited with status 0".to_string()
            } else {
                format!("exited with status {st}")
            };
            format!("{} (pid {}): {how}", l.name, l.child.id())
        })
        .collect();
    let status = first_failure.map(|(_, c)| c).unwrap_or(0);
    LaunchOutcome { status, summary }
}

/// The last `n` lines of a log file (for the launcher's report on a failed process).
pub fn tail(path: &Path, n: usize) -> Vec<String> {
    let text = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(worker: usize, local: usize, node: Option<usize>) -> LaunchOptions {
        LaunchOptions {
            worker_num: worker,
            local_worker_num: local,
            master_addr: "127.0.0.1".into(),
            master_port: 8118,
            node_rank: node,
            log_dir: PathBuf::from("/tmp/unused"),
            join: true,
            cluster_time_out: 600,
            scheduler_command: vec!["shardc".into(), "scheduler".into()],
            program: vec!["true".into()],
            env: Vec::new(),
        }
    }

    #[test]
    fn ranks_per_node() {
        let o = opts(8, 4, Some(1));
        assert_eq!(o.validate().unwrap(), 1);
        assert_eq!(o.local_ranks(1), 4..8);
        assert!(!o.hosts_scheduler(1));
        let o = opts(7, 4, Some(1));
        assert_eq!(o.local_ranks(1), 4..7);
        let o = opts(4, 4, None);
        assert_eq!(o.validate().unwrap(), 0);
        assert!(o.hosts_scheduler(0));
    }

    #[test]
    fn bad_options_are_named() {
        let e = opts(8, 4, None).validate().unwrap_err().to_string();
        assert!(
            e.contains("--node-rank") && e.contains("several nodes"),
            "{e}"
        );
        let e = opts(8, 4, Some(2)).validate().unwrap_err().to_string();
        assert!(
            e.contains("--node-rank = 2") && e.contains("only 8 workers"),
            "{e}"
        );
        let e = opts(4, 8, None).validate().unwrap_err().to_string();
        assert!(e.contains("--local-worker-num = 8"), "{e}");
        let e = opts(0, 0, None).validate().unwrap_err().to_string();
        assert!(e.contains("--worker-num = 0"), "{e}");
    }

    #[test]
    fn loopback_is_local_and_a_foreign_address_is_not() {
        assert!(is_local_address("127.0.0.1"));
        assert!(!is_local_address("192.0.2.77"));
    }

    #[test]
    fn waits_and_reports_the_first_failure() {
        let dir = std::env::temp_dir().join(format!("shardc-launch-test-{}", std::process::id()));
        let mut o = opts(3, 3, None);
        o.log_dir = dir.clone();
        o.scheduler_command = vec!["sh".into(), "-c".into(), "sleep 30".into()];
        o.program = vec![
            "sh".into(),
            "-c".into(),
            "echo out $RANK_ID; if [ $SHARDC_RANK = 1 ]; then echo bad >&2; exit 3; fi; sleep 30"
                .into(),
        ];
        let launched = start(&o).unwrap();
        assert_eq!(launched.len(), 4);
        let t0 = Instant::now();
        let out = wait(launched, Duration::from_millis(200));
        assert_eq!(out.status, 3, "{:?}", out.summary);
        assert!(t0.elapsed() < Duration::from_secs(10));
        assert!(out
            .summary
            .iter()
            .any(|s| s.starts_with("rank 1") && s.contains("status 3")));
        assert!(out
            .summary
            .iter()
            .any(|s| s.starts_with("rank 0") && s.contains("killed")));
        let stdout = fs::read_to_string(rank_log_dir(&dir, 2).join("stdout")).unwrap();
        assert_eq!(stdout, "out 2\n");
        assert_eq!(tail(&rank_log_dir(&dir, 1).join("stderr"), 5), vec!["bad"]);
        let _ = fs::remove_dir_all(&dir);
    }
}
