//! `shardc launch`: MindSpore's `msrun` for shardc (see `shardc_runtime::launcher`).
//! Options take msrun's names in either spelling (`--worker-num` or `--worker_num`).

use anyhow::{bail, Context, Result};
use clap::Args;
use shardc_runtime::launcher::{self, LaunchOptions};
use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

/// Arguments of `shardc launch`.
#[derive(Args, Debug)]
pub struct LaunchArgs {
    /// Workers in the whole job, on all nodes.
    #[arg(long, alias = "worker_num", default_value_t = 8)]
    pub worker_num: usize,
    /// Workers started on this node (equal to --worker-num on one machine).
    #[arg(long, alias = "local_worker_num", default_value_t = 8)]
    pub local_worker_num: usize,
    /// The scheduler's IP address or host name.
    #[arg(long, alias = "master_addr", default_value = "127.0.0.1")]
    pub master_addr: String,
    /// The scheduler's port.
    #[arg(long, alias = "master_port", default_value_t = 8118)]
    pub master_port: u16,
    /// This node's index (several nodes: 0 on the scheduler's node, then 1, 2, ...); rank
    /// `node_rank * local_worker_num + i` runs as this node's worker `i`.
    #[arg(long, alias = "node_rank")]
    pub node_rank: Option<usize>,
    /// Where the logs go: `DIR/1/rank.R/stdout` and `stderr` per worker, `DIR/scheduler.log`.
    #[arg(long, alias = "log_dir", default_value = ".")]
    pub log_dir: PathBuf,
    /// Wait for every process and exit with the first non-zero status; without it the
    /// launcher returns once the processes are started (as msrun does). A joined launcher
    /// forwards SIGINT / SIGTERM / SIGHUP to every process it started, kills what still runs
    /// after SHARDC_KILL_TIMEOUT seconds (default 5), says how each one ended and exits
    /// 128 + the signal (130, 143); its processes die with it if it is killed.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    pub join: Option<bool>,
    /// Seconds to wait for every worker to join the cluster.
    #[arg(long, alias = "cluster_time_out", default_value_t = 600)]
    pub cluster_time_out: u64,
    /// A file holding the cluster token every process must present (several nodes need the
    /// same token; on one node the launcher makes a fresh one when none is given).
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// Seconds the other processes get to end on their own after one fails, before they are
    /// killed.
    #[arg(long, default_value_t = 30)]
    pub grace: u64,
    /// The program every worker runs and its arguments (after `--`).
    #[arg(last = true, required = true)]
    pub program: Vec<OsString>,
}

/// `shardc launch`. Returns the exit status for the process.
pub fn launch(a: &LaunchArgs) -> Result<i32> {
    let exe = std::env::current_exe().context("finding the shardc executable")?;
    let mut env: Vec<(String, String)> = Vec::new();
    let has_token = std::env::var_os("SHARDC_CLUSTER_TOKEN").is_some()
        || std::env::var_os("SHARDC_CLUSTER_TOKEN_FILE").is_some();
    match &a.token_file {
        Some(f) => {
            let f = std::fs::canonicalize(f)
                .with_context(|| format!("--token-file {}: cannot read it", f.display()))?;
            env.push(("SHARDC_CLUSTER_TOKEN_FILE".into(), f.display().to_string()));
        }
        None if has_token => {}
        None if a.local_worker_num == a.worker_num => {
            env.push(("SHARDC_CLUSTER_TOKEN".into(), fresh_token()?));
        }
        None => bail!(
            "launch: the job spans several nodes ({} of {} workers here), so every node needs the same cluster token: give --token-file FILE (or set SHARDC_CLUSTER_TOKEN_FILE / SHARDC_CLUSTER_TOKEN) on each node",
            a.local_worker_num,
            a.worker_num
        ),
    }
    let mut program = a.program.clone();
    // `shardc launch -- shardc run ...` runs this very binary, wherever it was installed.
    if program.first().is_some_and(|p| p == "shardc") {
        program[0] = exe.clone().into_os_string();
    }
    let opts = LaunchOptions {
        worker_num: a.worker_num,
        local_worker_num: a.local_worker_num,
        master_addr: a.master_addr.clone(),
        master_port: a.master_port,
        node_rank: a.node_rank,
        log_dir: a.log_dir.clone(),
        join: a.join.unwrap_or(false),
        cluster_time_out: a.cluster_time_out,
        scheduler_command: vec![exe.into_os_string(), "scheduler".into()],
        program,
        env,
    };
    // A joined launch owns its job: a stop signal is forwarded to every process, and what
    // outlives the kill timeout is killed (read first, so a bad value starts nothing).
    let kill_timeout = launcher::kill_timeout_from_env()?;
    if opts.join {
        launcher::catch_stop_signals()?;
    }
    let launched = launcher::start(&opts)?;
    for l in &launched {
        eprintln!("launch: started {} (pid {})", l.name, l.child.id());
    }
    if !opts.join {
        eprintln!(
            "launch: not joining (--join to wait); logs in {}",
            opts.log_dir.display()
        );
        return Ok(0);
    }
    let logs: Vec<(String, PathBuf)> = launched
        .iter()
        .map(|l| (l.name.clone(), l.stderr_path.clone()))
        .collect();
    let outcome = launcher::wait(
        launched,
        &launcher::WaitOptions {
            grace: Duration::from_secs(a.grace),
            kill_timeout,
            ..launcher::WaitOptions::default()
        },
    );
    if outcome.status != 0 {
        for line in &outcome.summary {
            eprintln!("launch: {line}");
        }
        // Quote the failed processes' last words.
        for ((name, path), line) in logs.iter().zip(&outcome.summary) {
            if outcome.signal.is_none()
                && line.contains("exited with status")
                && !line.ends_with("status 0")
            {
                for l in launcher::tail(path, 5) {
                    eprintln!("launch: {name}: {l}");
                }
            }
        }
    }
    Ok(outcome.status)
}

/// 32 random bytes from the OS, as hex.
fn fresh_token() -> Result<String> {
    use std::io::Read;
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .context("reading /dev/urandom for a cluster token")?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}
