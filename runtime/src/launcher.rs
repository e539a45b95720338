//! The launcher (`shardc launch`, after MindSpore's `msrun`): on one node, starts the
//! scheduler (on the node that hosts it) and this node's workers with the dynamic-cluster
//! environment (`MS_ROLE`, `MS_WORKER_NUM`, `MS_SCHED_HOST`, `MS_SCHED_PORT`, `MS_NODE_ID`,
//! `RANK_ID`, ...), writes each worker's output to `DIR/1/rank.R/stdout` (and `stderr`) as
//! Open MPI's `--output-filename` lays it out and the tutorials grep it, the scheduler's to
//! `DIR/scheduler.log`, and with `join` waits for them all and returns the first non-zero exit
//! status (stopping the others when one fails).
//!
//! A joined launch owns its job. SIGINT, SIGTERM and SIGHUP sent to the launcher
//! ([`catch_stop_signals`]) are forwarded to every process it started; what is still running
//! after `SHARDC_KILL_TIMEOUT` ([`kill_timeout_from_env`]) is killed, and [`wait`] reports how
//! each process ended and the shell's status for the signal (130, 143, 129). Each process of a
//! joined launch leads a process group of its own, signalled as a whole, so what a wrapper
//! script started stops too; on Linux they also die with the launcher (`PR_SET_PDEATHSIG`),
//! so a launcher killed with SIGKILL leaves no orphan. An unjoined launch (msrun's default)
//! returns at once and leaves its job running on purpose.
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
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

/// How long the processes of a joined launch get to end after the launcher forwarded a stop
/// signal to them, before they are killed (`SHARDC_KILL_TIMEOUT` overrides it).
pub const DEFAULT_KILL_TIMEOUT: Duration = Duration::from_secs(5);

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
    /// `--join`: wait for every process and return the first non-zero exit status. The
    /// processes of a joined launch die with the launcher (see the module documentation).
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
    /// Whether it leads a process group of its own (a joined launch), which the launcher
    /// signals as a whole, so that what it started (a wrapper script's program) stops too.
    pub own_group: bool,
}

impl Launched {
    /// Sends `sig` to the process, and to its whole group when it leads one.
    fn send(&self, sig: i32) {
        let pid = self.child.id() as libc::pid_t;
        let target = if self.own_group { -pid } else { pid };
        // SAFETY: kill(2) on a child this launcher started (or the group it leads).
        unsafe {
            libc::kill(target, sig);
        }
    }

    /// Whether a process of its group is still there (after the process itself ended).
    fn group_alive(&self) -> bool {
        // SAFETY: signal 0 only checks that the group exists.
        self.own_group && unsafe { libc::kill(-(self.child.id() as libc::pid_t), 0) } == 0
    }
}

/// How a joined launch ended.
#[derive(Debug)]
pub struct LaunchOutcome {
    /// 0 when every process exited with 0; else the first non-zero status seen (a process
    /// killed by a signal counts as 128 + the signal, as a shell reports it).
    pub status: i32,
    /// One line per process: its name, pid and how it ended.
    pub summary: Vec<String>,
    /// The stop signal the launcher received and forwarded, if any.
    pub signal: Option<i32>,
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
        if opts.join {
            own_job_process(&mut cmd);
        }
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
            own_group: opts.join,
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
        if opts.join {
            own_job_process(&mut cmd);
        }
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
                own_group: opts.join,
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

/// Makes the process `cmd` starts a process of this launcher's job: it leads a process group
/// of its own (which the launcher signals as a whole, so that a wrapper script's program
/// stops with it), and on Linux it dies with this process: the kernel sends it SIGKILL when
/// the thread that spawns it ends (`PR_SET_PDEATHSIG`), so spawn from a thread that lives as
/// long as the job (the launcher's main thread). A launcher that died between the fork and
/// that call is noticed (the parent is no longer this process) and the spawn fails.
/// Elsewhere there is no such death: the scheduler's heartbeats still end the workers of a
/// lost scheduler.
pub fn own_job_process(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    cmd.process_group(0);
    #[cfg(target_os = "linux")]
    {
        let parent = std::process::id() as libc::pid_t;
        // SAFETY: the closure runs in the child between fork and exec and calls only
        // async-signal-safe functions (prctl, getppid), allocating nothing.
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(
                    libc::PR_SET_PDEATHSIG,
                    libc::SIGKILL as libc::c_ulong,
                    0,
                    0,
                    0,
                ) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::getppid() != parent {
                    return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
                }
                Ok(())
            });
        }
    }
}

/// The first stop signal (SIGINT, SIGTERM, SIGHUP) received since [`catch_stop_signals`];
/// 0 when none.
static STOP_SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn record_stop_signal(sig: libc::c_int) {
    // Only an atomic store: the one thing a signal handler may safely do here.
    let _ = STOP_SIGNAL.compare_exchange(0, sig, Ordering::SeqCst, Ordering::SeqCst);
}

/// From now on SIGINT, SIGTERM and SIGHUP no longer end this process: they are recorded, and
/// a running [`wait`] forwards the first one to every process of the job. Call it before
/// [`start`], so that a signal during the start is not lost.
pub fn catch_stop_signals() -> Result<(), LaunchError> {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: installs a handler that only stores into an atomic; `sa` is zeroed, then
        // its handler, mask and flags are set, as sigaction(2) asks.
        let failed = unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = record_stop_signal as *const () as libc::sighandler_t;
            sa.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut()) != 0
        };
        if failed {
            return Err(LaunchError::Io {
                what: format!("catching {}", signal_name(sig)),
                source: std::io::Error::last_os_error(),
            });
        }
    }
    Ok(())
}

/// The stop signal received so far, if any.
pub fn stop_signal() -> Option<i32> {
    match STOP_SIGNAL.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

/// A signal's name (`SIGTERM`), or `signal N`.
pub fn signal_name(sig: i32) -> String {
    match sig {
        libc::SIGHUP => "SIGHUP".into(),
        libc::SIGINT => "SIGINT".into(),
        libc::SIGQUIT => "SIGQUIT".into(),
        libc::SIGABRT => "SIGABRT".into(),
        libc::SIGKILL => "SIGKILL".into(),
        libc::SIGSEGV => "SIGSEGV".into(),
        libc::SIGPIPE => "SIGPIPE".into(),
        libc::SIGTERM => "SIGTERM".into(),
        s => format!("signal {s}"),
    }
}

/// `SHARDC_KILL_TIMEOUT`: seconds (a decimal number, > 0) the processes get after a
/// forwarded stop signal before they are killed; [`DEFAULT_KILL_TIMEOUT`] when unset.
pub fn kill_timeout_from_env() -> Result<Duration, LaunchError> {
    match std::env::var("SHARDC_KILL_TIMEOUT") {
        Err(_) => Ok(DEFAULT_KILL_TIMEOUT),
        Ok(v) => match v.trim().parse::<f64>() {
            Ok(s) if s.is_finite() && s > 0.0 && s < 1e9 => Ok(Duration::from_secs_f64(s)),
            _ => Err(option(
                "SHARDC_KILL_TIMEOUT",
                v,
                "expected a positive number of seconds (e.g. 5 or 0.5)",
            )),
        },
    }
}

/// Kills every process still running and reaps it.
pub fn stop(launched: &mut [Launched]) {
    for l in launched.iter_mut() {
        if matches!(l.child.try_wait(), Ok(None)) {
            l.send(libc::SIGKILL);
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

/// How [`wait`] treats the job.
#[derive(Clone, Copy, Debug)]
pub struct WaitOptions {
    /// After a process exits non-zero, how long the others get to end on their own (the
    /// scheduler tells every worker to abort) before they are killed (`--grace`).
    pub grace: Duration,
    /// After a stop signal was forwarded, how long the processes get before they are killed
    /// (`SHARDC_KILL_TIMEOUT`).
    pub kill_timeout: Duration,
    /// Where `wait` says what it does while it does it (the stop signal it forwards).
    pub log: fn(&str),
    /// Where `wait` learns of a stop signal: [`stop_signal`], what [`catch_stop_signals`]
    /// recorded.
    pub stop: fn() -> Option<i32>,
}

impl Default for WaitOptions {
    fn default() -> Self {
        WaitOptions {
            grace: Duration::from_secs(30),
            kill_timeout: DEFAULT_KILL_TIMEOUT,
            log: |line| eprintln!("launch: {line}"),
            stop: stop_signal,
        }
    }
}

/// Why the launcher ended a process, if it did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ending {
    /// It ended on its own.
    OnItsOwn,
    /// Killed after the grace period that followed another process's failure.
    KilledAfterFailure,
    /// The launcher forwarded this stop signal to it.
    Forwarded(i32),
    /// Killed when it outlived the kill timeout after the forwarded signal.
    KilledAfterSignal(i32),
}

/// Waits for every process. When one exits non-zero, the others get `opts.grace` to end on
/// their own (the scheduler tells every worker to abort), then are killed. When the launcher
/// receives a stop signal ([`catch_stop_signals`]), the signal is forwarded to every process
/// still running, and what outlives `opts.kill_timeout` is killed. Returns the status (the
/// shell's 128 + the signal after a stop signal, else the first non-zero status, 0 when all
/// succeeded) and a line per process saying how it ended.
pub fn wait(mut launched: Vec<Launched>, opts: &WaitOptions) -> LaunchOutcome {
    let mut ended: Vec<Option<ExitStatus>> = vec![None; launched.len()];
    let mut endings = vec![Ending::OnItsOwn; launched.len()];
    let mut first_failure: Option<(usize, i32)> = None;
    let mut kill_at: Option<Instant> = None;
    let mut forwarded: Option<i32> = None;
    loop {
        for (i, l) in launched.iter_mut().enumerate() {
            if ended[i].is_some() {
                continue;
            }
            match l.child.try_wait() {
                Ok(Some(st)) => {
                    ended[i] = Some(st);
                    let code = status_code(&st);
                    if code != 0 && first_failure.is_none() && forwarded.is_none() {
                        first_failure = Some((i, code));
                        kill_at = Some(Instant::now() + opts.grace);
                    }
                }
                Ok(None) => {}
                Err(_) => {
                    // Not ours to wait for any more: count it as failed.
                    ended[i] = Some(ExitStatus::default());
                }
            }
        }
        // After a stop signal, the job is over when its processes and whatever they started
        // in their groups have ended, or were killed at the deadline.
        let groups_done =
            forwarded.is_none() || kill_at.is_none() || !launched.iter().any(Launched::group_alive);
        if ended.iter().all(Option::is_some) && groups_done {
            break;
        }
        if let (None, Some(sig)) = (forwarded, (opts.stop)()) {
            forwarded = Some(sig);
            let running: Vec<&str> = launched
                .iter()
                .zip(&ended)
                .filter(|(_, e)| e.is_none())
                .map(|(l, _)| l.name.as_str())
                .collect();
            (opts.log)(&format!(
                "{} received: forwarding it to {} ({}); what still runs after {} is killed (SHARDC_KILL_TIMEOUT)",
                signal_name(sig),
                running.join(", "),
                if running.len() == 1 { "1 process".to_string() } else { format!("{} processes", running.len()) },
                fmt_duration(opts.kill_timeout)
            ));
            // The workers first, the scheduler last: a worker that loses the scheduler before
            // its own signal lands aborts on its own, which reads as a failure of its own.
            let order = (0..launched.len())
                .filter(|&i| launched[i].name != "scheduler")
                .chain((0..launched.len()).filter(|&i| launched[i].name == "scheduler"));
            for i in order {
                let l = &launched[i];
                if ended[i].is_none() {
                    l.send(sig);
                    endings[i] = Ending::Forwarded(sig);
                } else if l.group_alive() {
                    l.send(sig);
                }
            }
            kill_at = Some(Instant::now() + opts.kill_timeout);
        }
        if kill_at.is_some_and(|t| Instant::now() >= t) {
            for (i, l) in launched.iter_mut().enumerate() {
                if l.group_alive() {
                    l.send(libc::SIGKILL);
                }
                if ended[i].is_none() {
                    let _ = l.child.kill();
                    endings[i] = match forwarded {
                        Some(sig) => Ending::KilledAfterSignal(sig),
                        None => Ending::KilledAfterFailure,
                    };
                }
            }
            kill_at = None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let summary = launched
        .iter()
        .zip(&ended)
        .zip(&endings)
        .map(|((l, st), ending)| {
            let code = st.map(|s| status_code(&s)).unwrap_or(1);
            let how = match *ending {
                Ending::KilledAfterFailure => {
                    "killed by the launcher after another process failed".to_string()
                }
                Ending::KilledAfterSignal(sig) => format!(
                    "killed (SIGKILL) by the launcher: still running {} after it forwarded {}",
                    fmt_duration(opts.kill_timeout),
                    signal_name(sig)
                ),
                Ending::Forwarded(sig) if code == 128 + sig => {
                    format!("ended by {} (forwarded by the launcher)", signal_name(sig))
                }
                Ending::Forwarded(sig) => format!(
                    "{} after the launcher forwarded {}",
                    exited(code),
                    signal_name(sig)
                ),
                Ending::OnItsOwn => exited(code),
            };
            format!("{} (pid {}): {how}", l.name, l.child.id())
        })
        .collect();
    let status = match forwarded {
        Some(sig) => 128 + sig,
        None => first_failure.map(|(_, c)| c).unwrap_or(0),
    };
    LaunchOutcome {
        status,
        summary,
        signal: forwarded,
    }
}

/// `exited with status N`, naming the signal for 128 + N.
fn exited(code: i32) -> String {
    if code > 128 && code < 128 + 65 {
        format!("exited with status {code} ({})", signal_name(code - 128))
    } else {
        format!("exited with status {code}")
    }
}

/// `5 s`, `500 ms`.
fn fmt_duration(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        format!("{} ms", d.as_millis())
    } else {
        format!("{} s", d.as_secs_f64())
    }
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
        let out = wait(
            launched,
            &WaitOptions {
                grace: Duration::from_millis(200),
                ..WaitOptions::default()
            },
        );
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

    #[test]
    fn a_stop_signal_is_forwarded_and_what_ignores_it_is_killed() {
        static STOP: AtomicI32 = AtomicI32::new(0);
        let dir = std::env::temp_dir().join(format!("shardc-launch-stop-{}", std::process::id()));
        let mut o = opts(3, 3, None);
        o.log_dir = dir.clone();
        o.scheduler_command = vec!["sh".into(), "-c".into(), "exec sleep 30".into()];
        // Rank 1 ignores SIGTERM; rank 2 ends with status 0 when it gets it.
        o.program = vec![
            "sh".into(),
            "-c".into(),
            "case $SHARDC_RANK in 0) exec sleep 30;; 1) trap '' TERM; while :; do sleep 0.05; done;; 2) trap 'exit 0' TERM; while :; do sleep 0.05; done;; esac"
                .into(),
        ];
        let launched = start(&o).unwrap();
        std::thread::spawn(|| {
            std::thread::sleep(Duration::from_millis(300));
            STOP.store(libc::SIGTERM, Ordering::SeqCst);
        });
        let t0 = Instant::now();
        let out = wait(
            launched,
            &WaitOptions {
                grace: Duration::from_secs(30),
                kill_timeout: Duration::from_millis(700),
                log: |_| {},
                stop: || match STOP.load(Ordering::SeqCst) {
                    0 => None,
                    s => Some(s),
                },
            },
        );
        assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
        assert_eq!(out.status, 143, "{:?}", out.summary);
        assert_eq!(out.signal, Some(libc::SIGTERM));
        let line = |who: &str| {
            out.summary
                .iter()
                .find(|s| s.starts_with(who))
                .cloned()
                .unwrap_or_default()
        };
        assert!(
            line("scheduler").contains("ended by SIGTERM (forwarded"),
            "{:?}",
            out.summary
        );
        assert!(
            line("rank 0").contains("ended by SIGTERM"),
            "{:?}",
            out.summary
        );
        assert!(
            line("rank 1").contains("killed (SIGKILL)") && line("rank 1").contains("700 ms"),
            "{:?}",
            out.summary
        );
        assert!(
            line("rank 2").contains("exited with status 0 after the launcher forwarded SIGTERM"),
            "{:?}",
            out.summary
        );
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_kill_timeout_is_read_and_checked() {
        // Only this test sets the variable; nextest runs each test in its own process.
        std::env::set_var("SHARDC_KILL_TIMEOUT", "0.25");
        assert_eq!(kill_timeout_from_env().unwrap(), Duration::from_millis(250));
        std::env::set_var("SHARDC_KILL_TIMEOUT", "soon");
        let e = kill_timeout_from_env().unwrap_err().to_string();
        assert!(
            e.contains("SHARDC_KILL_TIMEOUT = soon") && e.contains("positive number of seconds"),
            "{e}"
        );
        std::env::remove_var("SHARDC_KILL_TIMEOUT");
        assert_eq!(kill_timeout_from_env().unwrap(), DEFAULT_KILL_TIMEOUT);
    }
}
