//! `shardc bench collectives`: AllReduce between processes on this host, through the data
//! plane of the cluster ([`shardc_collectives::ProcessComm`]: shared memory
//! between processes of one host).
//!
//! For each process count of `--procs` (default 2, 4, 8) the command starts that many worker
//! processes of the current executable (`shardc bench collectives …` again, with
//! [`WORKER_ENV`] set: [`run`] sees it and becomes a worker). Each worker binds a loopback
//! data-plane listener and reports its port on stdout; the parent hands every worker the
//! table of ports on stdin; each worker builds a [`CommSetup`] (no scheduler: the parent is
//! the rendezvous) and runs AllReduce (sum, f32, in place, the whole world) at each size of
//! `--sizes` (default 4 KiB, 64 KiB, 1 MiB, 16 MiB, 64 MiB).
//!
//! The method, shared with the references of `bench/collectives/` (gloo through
//! `torch.distributed`, Open MPI through `mpirun`), so that the ratios compare like with like:
//!
//! - iterations per size: `--iters N`, else `min(200, max(5, 256 MiB / size))`; untimed
//!   warm-up iterations before them: `max(2, iters / 10)`;
//! - the first warm-up call carries `rank + 1` in every element and is checked against
//!   `P (P + 1) / 2`; the buffer is then zeroed (sums of zeros stay finite);
//! - every timed call is timed on every rank; the figure of one call is the slowest rank's
//!   (an AllReduce max of the samples after the loop); the latency reported is the median of
//!   those figures, the algorithm bandwidth `size / latency` in GB/s (10⁹ bytes per second).
//!
//! `--transport threads` runs the ranks as threads of this process on the in-process
//! communicator instead (no processes, no shared memory: a baseline of the same loop).
//!
//! Output: a table, or with `--json` one JSON object per (procs, size), the schema of the
//! references' output (`bench/collectives/run.sh` merges them):
//!
//! ```text
//! {"impl":"shardc","procs":2,"size_bytes":4096,"iters":200,"median_us":4.1,"algbw_gbs":1.0}
//! ```

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Subcommand, ValueEnum};
use serde::{Deserialize, Serialize};
use shardc_collectives::{CommSetup, Peer, ProcessComm};
use shardc_ir::ReduceOp;
use shardc_runtime::comm::InProcessWorld;
use shardc_runtime::{Communicator, Tensor};
use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Set (to `1`) in the environment of the worker processes: [`run`] then runs one rank.
pub const WORKER_ENV: &str = "SHARDC_BENCH_COLLECTIVES_WORKER";
/// The worker's rank (set by the parent beside [`WORKER_ENV`]).
pub const RANK_ENV: &str = "SHARDC_BENCH_COLLECTIVES_RANK";
/// The number of workers.
pub const SIZE_ENV: &str = "SHARDC_BENCH_COLLECTIVES_SIZE";
/// The job id shared by the workers of one process count (names the shared-memory files).
pub const JOB_ENV: &str = "SHARDC_BENCH_COLLECTIVES_JOB";

/// The subcommand path under which the workers are started: `shardc bench collectives`.
pub const WORKER_COMMAND: [&str; 2] = ["bench", "collectives"];

/// The largest process count accepted.
pub const MAX_PROCS: usize = 256;

/// The host id every worker advertises: they all run on this host.
const HOST_ID: &str = "shardc-bench-collectives-localhost";

/// `shardc bench collectives`, as a subcommand of `shardc bench`.
#[derive(Subcommand, Debug, Clone, PartialEq)]
pub enum BenchSubcommand {
    /// AllReduce between processes on this host (shared memory), latency and bandwidth, to
    /// compare with gloo and Open MPI (bench/collectives/run.sh runs all three).
    Collectives(CollectivesArgs),
}

/// How the ranks of `shardc bench collectives` run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Transport {
    /// One process per rank, connected by the cluster's data plane (`ProcessComm`).
    Processes,
    /// One thread per rank in this process, on the in-process communicator.
    Threads,
}

/// Arguments of `shardc bench collectives`.
#[derive(Args, Debug, Clone, PartialEq)]
pub struct CollectivesArgs {
    /// Message sizes in bytes, comma-separated; `K`, `M`, `G` are powers of 1024 (`4K`,
    /// `64KiB`, `1M`); each a positive multiple of 4 (f32 elements).
    #[arg(long, value_delimiter = ',', value_parser = parse_size, default_value = "4K,64K,1M,16M,64M")]
    pub sizes: Vec<usize>,
    /// Process counts, comma-separated.
    #[arg(long, value_delimiter = ',', value_parser = parse_procs, default_value = "2,4,8")]
    pub procs: Vec<usize>,
    /// Timed iterations per size (default: min(200, max(5, 256 MiB / size))).
    #[arg(long, value_parser = parse_iters)]
    pub iters: Option<usize>,
    /// One JSON object per line instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Seconds a collective waits for a missing rank before failing.
    #[arg(long, value_parser = parse_iters, default_value_t = 120)]
    pub timeout: usize,
    /// Processes (the cluster's data plane) or threads (the in-process communicator).
    #[arg(long, value_enum, default_value_t = Transport::Processes)]
    pub transport: Transport,
}

impl Default for CollectivesArgs {
    fn default() -> Self {
        CollectivesArgs {
            sizes: vec![4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20],
            procs: vec![2, 4, 8],
            iters: None,
            json: false,
            timeout: 120,
            transport: Transport::Processes,
        }
    }
}

/// Parses a message size: bytes, or a number with `K`, `M` or `G` (powers of 1024, optionally
/// followed by `iB` or `B`), case-insensitive; a positive multiple of 4.
pub fn parse_size(s: &str) -> std::result::Result<usize, String> {
    let t = s.trim();
    let upper = t.to_ascii_uppercase();
    let body = upper
        .strip_suffix("IB")
        .or_else(|| upper.strip_suffix('B'))
        .unwrap_or(&upper);
    let (digits, shift) = match body.chars().last() {
        Some('K') => (&body[..body.len() - 1], 10),
        Some('M') => (&body[..body.len() - 1], 20),
        Some('G') => (&body[..body.len() - 1], 30),
        _ => (body, 0),
    };
    let n: usize = digits
        .parse()
        .map_err(|e| format!("size '{t}' is not a number of bytes (like 4096, 4K, 1MiB): {e}"))?;
    let bytes = n
        .checked_mul(1usize << shift)
        .ok_or_else(|| format!("size '{t}' is too large"))?;
    if bytes == 0 || bytes % 4 != 0 {
        return Err(format!(
            "size '{t}' is {bytes} bytes: it must be a positive multiple of 4 (f32 elements)"
        ));
    }
    Ok(bytes)
}

/// Parses a process count: 1 to [`MAX_PROCS`].
pub fn parse_procs(s: &str) -> std::result::Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n @ 1..=MAX_PROCS) => Ok(n),
        Ok(n) => Err(format!("process count {n} is outside 1..={MAX_PROCS}")),
        Err(e) => Err(format!(
            "process count '{s}' is not a positive integer: {e}"
        )),
    }
}

/// Parses a positive integer (iterations, seconds).
fn parse_iters(s: &str) -> std::result::Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("'{s}' is not a positive integer: {e}")),
    }
}

/// A size as `4KiB`, `64MiB` or `1000B`.
pub fn format_size(bytes: usize) -> String {
    for (shift, unit) in [(30, "GiB"), (20, "MiB"), (10, "KiB")] {
        if bytes >= 1 << shift && bytes % (1 << shift) == 0 {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    format!("{bytes}B")
}

/// Timed iterations at `size_bytes`: `iters` if given, else `min(200, max(5, 256 MiB /
/// size))`.
pub fn iterations(size_bytes: usize, iters: Option<usize>) -> usize {
    iters.unwrap_or_else(|| ((256usize << 20) / size_bytes.max(1)).clamp(5, 200))
}

/// Untimed warm-up iterations before `iters` timed ones: `max(2, iters / 10)`.
pub fn warmup_iterations(iters: usize) -> usize {
    (iters / 10).max(2)
}

/// One measured case.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// Who measured it: `shardc` (or `shardc-threads`), `gloo`, `mpi`.
    #[serde(rename = "impl")]
    pub implementation: String,
    /// Number of ranks.
    pub procs: usize,
    /// Bytes reduced per call (per rank).
    pub size_bytes: usize,
    /// Timed calls.
    pub iters: usize,
    /// Median over the calls of the slowest rank's time, in microseconds.
    pub median_us: f64,
    /// `size_bytes / median`, in 10⁹ bytes per second.
    pub algbw_gbs: f64,
}

impl Row {
    /// The table line of this row (see [`table_header`]).
    pub fn table_line(&self) -> String {
        format!(
            "{:>5} {:>9} {:>6} {:>12.1} {:>10.3}",
            self.procs,
            format_size(self.size_bytes),
            self.iters,
            self.median_us,
            self.algbw_gbs
        )
    }
}

/// The header of the table.
pub fn table_header() -> String {
    format!(
        "{:>5} {:>9} {:>6} {:>12} {:>10}",
        "procs", "size", "iters", "median_us", "GB/s"
    )
}

/// The median of `v` (not empty).
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        0.5 * (v[n / 2 - 1] + v[n / 2])
    }
}

/// Runs the AllReduce benchmark on `comm` (called by every rank of the world at once) and
/// returns one row per size (the same on every rank).
pub fn measure(
    comm: &dyn Communicator,
    sizes: &[usize],
    iters: Option<usize>,
    implementation: &str,
) -> Result<Vec<Row>> {
    let (rank, procs) = (comm.rank(), comm.size());
    let world: Vec<usize> = (0..procs).collect();
    let mut rows = Vec::with_capacity(sizes.len());
    for &size in sizes {
        let what = format!("AllReduce of {} at rank {rank}", format_size(size));
        let n = size / 4;
        let timed = iterations(size, iters);
        let mut buf = Tensor::from_f32(vec![n], vec![(rank + 1) as f32; n])
            .ok_or_else(|| anyhow!("{what}: cannot build a tensor of {n} f32"))?;
        for w in 0..warmup_iterations(timed) {
            comm.all_reduce(&world, ReduceOp::Sum, &mut buf)
                .with_context(|| what.clone())?;
            if w == 0 {
                let want = (procs * (procs + 1) / 2) as f32;
                let values = buf
                    .as_f32_mut()
                    .ok_or_else(|| anyhow!("{what}: the result is not f32"))?;
                if let Some((i, v)) = values.iter().enumerate().find(|(_, v)| **v != want) {
                    bail!("{what}: element {i} is {v}, expected {want}");
                }
                values.fill(0.0);
            }
        }
        let mut samples = Vec::with_capacity(timed);
        for _ in 0..timed {
            let t0 = Instant::now();
            comm.all_reduce(&world, ReduceOp::Sum, &mut buf)
                .with_context(|| what.clone())?;
            samples.push(t0.elapsed().as_secs_f64());
        }
        let mut slowest = Tensor::from_f64(vec![timed], samples)
            .ok_or_else(|| anyhow!("{what}: cannot build the samples tensor"))?;
        comm.all_reduce(&world, ReduceOp::Max, &mut slowest)
            .with_context(|| format!("{what}: gathering the slowest rank's times"))?;
        let mut times = slowest
            .as_f64()
            .ok_or_else(|| anyhow!("{what}: the samples are not f64"))?
            .to_vec();
        let med = median(&mut times);
        rows.push(Row {
            implementation: implementation.to_string(),
            procs,
            size_bytes: size,
            iters: timed,
            median_us: med * 1e6,
            algbw_gbs: size as f64 / med / 1e9,
        });
    }
    Ok(rows)
}

/// Runs `shardc bench collectives`: as a worker when [`WORKER_ENV`] is set, else measures
/// every process count and prints the table (or JSON lines).
pub fn run(args: &CollectivesArgs) -> Result<()> {
    if is_worker() {
        return worker_main(args);
    }
    if !args.json {
        println!(
            "AllReduce f32 sum, in place, whole world; {} ({} logical CPUs); median over calls of the slowest rank",
            match args.transport {
                Transport::Processes => "shardc ProcessComm between processes",
                Transport::Threads => "shardc in-process communicator between threads",
            },
            std::thread::available_parallelism().map_or(1, |n| n.get())
        );
        println!("{}", table_header());
    }
    for &procs in &args.procs {
        let rows = match args.transport {
            Transport::Processes => run_processes(args, procs)?,
            Transport::Threads => run_threads(args, procs)?,
        };
        for row in rows {
            if args.json {
                println!("{}", serde_json::to_string(&row)?);
            } else {
                println!("{}", row.table_line());
            }
        }
    }
    Ok(())
}

/// Whether this process is a worker of `shardc bench collectives` ([`WORKER_ENV`] is `1`).
pub fn is_worker() -> bool {
    std::env::var(WORKER_ENV).is_ok_and(|v| v == "1")
}

/// All ranks as threads of this process on the in-process communicator.
fn run_threads(args: &CollectivesArgs, procs: usize) -> Result<Vec<Row>> {
    let comms = InProcessWorld::with_timeout(procs, Duration::from_secs(args.timeout as u64));
    let results: Vec<Result<Vec<Row>>> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .iter()
            .map(|c| {
                s.spawn(move || measure(c.as_ref(), &args.sizes, args.iters, "shardc-threads"))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow!("a benchmark thread panicked")))
            })
            .collect()
    });
    let mut rows = None;
    for (rank, r) in results.into_iter().enumerate() {
        let r = r.with_context(|| format!("rank {rank} of {procs} threads"))?;
        rows.get_or_insert(r);
    }
    rows.ok_or_else(|| anyhow!("no rank ran"))
}

/// The worker processes of one process count; killed if dropped before they end.
struct Workers {
    children: Vec<Child>,
}

impl Drop for Workers {
    fn drop(&mut self) {
        for c in &mut self.children {
            if let Ok(None) = c.try_wait() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

/// Reads one line of a worker's stdout (`None` at its end).
fn read_line(out: &mut BufReader<ChildStdout>, rank: usize) -> Result<Option<String>> {
    let mut line = String::new();
    let n = out
        .read_line(&mut line)
        .with_context(|| format!("reading the output of worker rank {rank}"))?;
    Ok((n > 0).then(|| line.trim_end().to_string()))
}

/// A job id unique to this parent and moment (names the workers' shared-memory files).
fn job_id(procs: usize) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("bench-{}-{procs}-{nanos:x}", std::process::id())
}

/// Starts `procs` workers, hands them each other's ports, and collects rank 0's rows.
pub(crate) fn run_processes(args: &CollectivesArgs, procs: usize) -> Result<Vec<Row>> {
    let exe = std::env::current_exe().context("finding the current executable")?;
    let sizes: Vec<String> = args.sizes.iter().map(|s| s.to_string()).collect();
    let job = job_id(procs);
    let mut workers = Workers {
        children: Vec::with_capacity(procs),
    };
    for rank in 0..procs {
        let mut cmd = Command::new(&exe);
        cmd.args(WORKER_COMMAND)
            .arg("--sizes")
            .arg(sizes.join(","))
            .arg("--procs")
            .arg(procs.to_string())
            .arg("--timeout")
            .arg(args.timeout.to_string());
        if let Some(n) = args.iters {
            cmd.arg("--iters").arg(n.to_string());
        }
        cmd.env(WORKER_ENV, "1")
            .env(RANK_ENV, rank.to_string())
            .env(SIZE_ENV, procs.to_string())
            .env(JOB_ENV, &job)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if std::env::var_os("RAYON_NUM_THREADS").is_none() {
            // One compute thread per rank, as the references.
            cmd.env("RAYON_NUM_THREADS", "1");
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("starting worker rank {rank} ({})", exe.display()))?;
        workers.children.push(child);
    }
    let mut pipes: Vec<(ChildStdin, BufReader<ChildStdout>)> = Vec::with_capacity(procs);
    for (rank, child) in workers.children.iter_mut().enumerate() {
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            bail!("worker rank {rank} started without its pipes");
        };
        pipes.push((stdin, BufReader::new(stdout)));
    }
    let mut ports = Vec::with_capacity(procs);
    for (rank, (_, out)) in pipes.iter_mut().enumerate() {
        let line = read_line(out, rank)?
            .ok_or_else(|| anyhow!("worker rank {rank} exited before reporting its port"))?;
        let port: u16 = line
            .strip_prefix("port ")
            .and_then(|p| p.parse().ok())
            .ok_or_else(|| anyhow!("worker rank {rank} said '{line}', expected 'port N'"))?;
        ports.push(port.to_string());
    }
    let table = format!("peers {}\n", ports.join(" "));
    let mut outs = Vec::with_capacity(procs);
    for (rank, (mut stdin, out)) in pipes.into_iter().enumerate() {
        stdin
            .write_all(table.as_bytes())
            .with_context(|| format!("sending the peer table to worker rank {rank}"))?;
        drop(stdin);
        outs.push(out);
    }
    let mut rows = Vec::new();
    for (rank, out) in outs.iter_mut().enumerate() {
        while let Some(line) = read_line(out, rank)? {
            if let Some(json) = line.strip_prefix("row ") {
                let row: Row = serde_json::from_str(json).with_context(|| {
                    format!("worker rank {rank} sent an unreadable row: {json}")
                })?;
                if rank == 0 {
                    rows.push(row);
                }
            } else if !line.is_empty() {
                eprintln!("worker rank {rank}: {line}");
            }
        }
    }
    let mut failed = Vec::new();
    for (rank, child) in workers.children.iter_mut().enumerate() {
        let status = child
            .wait()
            .with_context(|| format!("waiting for worker rank {rank}"))?;
        if !status.success() {
            failed.push(format!("rank {rank} ({status})"));
        }
    }
    if !failed.is_empty() {
        bail!(
            "AllReduce benchmark with {procs} processes: workers failed: {} (see their messages above)",
            failed.join(", ")
        );
    }
    if rows.len() != args.sizes.len() {
        bail!(
            "AllReduce benchmark with {procs} processes: rank 0 reported {} of {} sizes",
            rows.len(),
            args.sizes.len()
        );
    }
    Ok(rows)
}

/// A variable of the worker's environment, parsed.
fn env_usize(name: &str) -> Result<usize> {
    let v = std::env::var(name).with_context(|| format!("{name} is not set"))?;
    v.parse()
        .with_context(|| format!("{name}={v} is not a non-negative integer"))
}

/// One rank of `shardc bench collectives` (a process started by [`run`] with [`WORKER_ENV`]):
/// binds its data-plane listener, prints `port N`, reads `peers P0 P1 …` from stdin, builds
/// its [`ProcessComm`], runs [`measure`] and (rank 0) prints `row {json}` per size.
pub fn worker_main(args: &CollectivesArgs) -> Result<()> {
    let rank = env_usize(RANK_ENV)?;
    let size = env_usize(SIZE_ENV)?;
    if rank >= size {
        bail!("{RANK_ENV}={rank} is outside the world of {size} ranks");
    }
    let job_id = std::env::var(JOB_ENV).with_context(|| format!("{JOB_ENV} is not set"))?;
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .with_context(|| format!("rank {rank}: binding a loopback listener"))?;
    let port = listener.local_addr()?.port();
    let mut stdout = std::io::stdout();
    writeln!(stdout, "port {port}")?;
    stdout.flush()?;
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .with_context(|| format!("rank {rank}: reading the peer table"))?;
    let ports = parse_peer_table(&line, size)
        .with_context(|| format!("rank {rank}: the peer table '{}'", line.trim_end()))?;
    let peers = ports
        .into_iter()
        .map(|p| Peer {
            host_id: HOST_ID.to_string(),
            data_addr: SocketAddr::from((Ipv4Addr::LOCALHOST, p)),
        })
        .collect();
    let setup = CommSetup {
        rank,
        size,
        job_id,
        peers,
        listener,
        token: None,
        tls: None,
        timeout: Duration::from_secs(args.timeout as u64),
    };
    let comm = ProcessComm::new(setup)
        .with_context(|| format!("rank {rank}: connecting the data plane of {size} ranks"))?;
    let rows = measure(&comm, &args.sizes, args.iters, "shardc")?;
    if rank == 0 {
        for row in rows {
            writeln!(stdout, "row {}", serde_json::to_string(&row)?)?;
        }
        stdout.flush()?;
    }
    Ok(())
}

/// Parses `peers P0 P1 …` (one port per rank, `size` of them).
pub fn parse_peer_table(line: &str, size: usize) -> Result<Vec<u16>> {
    let mut words = line.split_whitespace();
    if words.next() != Some("peers") {
        bail!("expected 'peers' and {size} ports");
    }
    let ports = words
        .map(|w| {
            w.parse::<u16>()
                .map_err(|e| anyhow!("'{w}' is not a port: {e}"))
        })
        .collect::<Result<Vec<_>>>()?;
    if ports.len() != size {
        bail!("{} ports for {size} ranks", ports.len());
    }
    Ok(ports)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// `shardc bench` as the lead wires it: the benchmark enum (positional, defaulted), a
    /// flag of the same name as ours (`--sizes`), and our subcommand.
    #[derive(Parser, Debug)]
    struct Cli {
        #[arg(default_value = "all")]
        what: String,
        #[arg(long, value_delimiter = ',', default_value = "256")]
        sizes: Vec<usize>,
        #[command(subcommand)]
        sub: Option<BenchSubcommand>,
    }

    fn collectives(argv: &[&str]) -> CollectivesArgs {
        let cli = Cli::try_parse_from(argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
        match cli.sub {
            Some(BenchSubcommand::Collectives(a)) => a,
            None => panic!("{argv:?}: no collectives subcommand"),
        }
    }

    #[test]
    fn sizes_parse_with_binary_suffixes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4K"), Ok(4096));
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("64KiB"), Ok(64 << 10));
        assert_eq!(parse_size("1M"), Ok(1 << 20));
        assert_eq!(parse_size("16MB"), Ok(16 << 20));
        assert_eq!(parse_size(" 64M "), Ok(64 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        for bad in [
            "",
            "K",
            "0",
            "6",
            "4T",
            "1.5M",
            "-4K",
            "4 K",
            "99999999999999999999G",
        ] {
            let err = parse_size(bad).expect_err(bad);
            assert!(err.contains(bad.trim()), "{bad}: {err}");
        }
        assert!(parse_size("6").unwrap_err().contains("multiple of 4"));
    }

    #[test]
    fn sizes_format_back() {
        for (bytes, text) in [
            (4096, "4KiB"),
            (64 << 20, "64MiB"),
            (1 << 30, "1GiB"),
            (1000, "1000B"),
            (1536 << 10, "1536KiB"),
        ] {
            assert_eq!(format_size(bytes), text);
            assert_eq!(parse_size(&format_size(bytes)), Ok(bytes));
        }
    }

    #[test]
    fn arguments_parse_under_bench_beside_its_own_sizes() {
        let a = collectives(&["bench", "collectives"]);
        assert_eq!(a, CollectivesArgs::default());
        let a = collectives(&[
            "bench",
            "collectives",
            "--sizes",
            "4K,1M",
            "--procs",
            "2",
            "--iters",
            "3",
            "--json",
            "--transport",
            "threads",
        ]);
        assert_eq!(a.sizes, vec![4096, 1 << 20]);
        assert_eq!(a.procs, vec![2]);
        assert_eq!(a.iters, Some(3));
        assert!(a.json);
        assert_eq!(a.transport, Transport::Threads);
        // The gemm benchmark keeps its own --sizes.
        let cli = Cli::try_parse_from(["bench", "gemm", "--sizes", "512"]).expect("gemm");
        assert_eq!(
            (cli.what.as_str(), cli.sizes, cli.sub),
            ("gemm", vec![512], None)
        );
        for bad in [
            &["bench", "collectives", "--sizes", "3"][..],
            &["bench", "collectives", "--procs", "0"],
            &["bench", "collectives", "--procs", "257"],
            &["bench", "collectives", "--iters", "0"],
            &["bench", "collectives", "--transport", "carrier-pigeon"],
        ] {
            let err = Cli::try_parse_from(bad).expect_err("refused");
            assert_eq!(err.exit_code(), 2, "{bad:?}");
        }
    }

    #[test]
    fn iteration_rule_follows_the_size() {
        assert_eq!(iterations(4096, None), 200);
        assert_eq!(iterations(1 << 20, None), 200);
        assert_eq!(iterations(16 << 20, None), 16);
        assert_eq!(iterations(64 << 20, None), 5);
        assert_eq!(iterations(64 << 20, Some(3)), 3);
        assert_eq!(warmup_iterations(200), 20);
        assert_eq!(warmup_iterations(5), 2);
    }

    #[test]
    fn peer_tables_parse_and_reject() {
        assert_eq!(
            parse_peer_table("peers 4000 4001\n", 2).expect("two ports"),
            vec![4000, 4001]
        );
        assert!(parse_peer_table("peers 4000", 2).is_err());
        assert!(parse_peer_table("ports 4000 4001", 2).is_err());
        assert!(parse_peer_table("peers 4000 70000", 2).is_err());
    }

    #[test]
    fn rows_round_trip_through_the_json_schema_of_the_references() {
        let line = r#"{"impl":"mpi","procs":2,"size_bytes":4096,"iters":200,"median_us":4.083,"algbw_gbs":1.0033}"#;
        let row: Row = serde_json::from_str(line).expect("the C reference's line");
        assert_eq!(row.implementation, "mpi");
        assert_eq!(row.size_bytes, 4096);
        let back: Row = serde_json::from_str(&serde_json::to_string(&row).unwrap()).unwrap();
        assert_eq!(back, row);
        assert_eq!(
            row.table_line(),
            "    2      4KiB    200          4.1      1.003"
        );
    }

    #[test]
    fn the_loop_checks_and_reports_on_threads() {
        let args = CollectivesArgs {
            sizes: vec![4096, 64],
            procs: vec![3],
            iters: Some(3),
            transport: Transport::Threads,
            ..CollectivesArgs::default()
        };
        let rows = run_threads(&args, 3).expect("three threads reduce");
        assert_eq!(rows.len(), 2);
        for (row, size) in rows.iter().zip([4096, 64]) {
            assert_eq!((row.procs, row.size_bytes, row.iters), (3, size, 3));
            assert!(row.median_us > 0.0 && row.algbw_gbs > 0.0, "{row:?}");
        }
    }

    #[test]
    fn medians() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
    }
}
