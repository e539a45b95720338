//! Stopping a joined `shardc launch` stops its job, in real processes: SIGTERM and SIGINT are
//! forwarded to every process the launcher started, a process that ignores them is killed
//! after `SHARDC_KILL_TIMEOUT`, the launcher says how each one ended and exits 128 + the
//! signal; a launcher killed with SIGKILL takes its processes with it; a checkpoint being
//! written when the signal lands is whole or absent. Every test runs the launcher in a
//! process group of its own, marks the job's processes through their environment, and checks
//! that none of them is left.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn exe() -> &'static str {
    env!("CARGO_BIN_EXE_shardc")
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn tmp(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("shardc-signals-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn free_port() -> String {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string()
}

/// Compiles `model` (zoo name) for `devices` data-parallel devices into `dir/art`.
fn compile(dir: &Path, model: &str, zoo_args: &[&str], devices: u32) -> PathBuf {
    let ir = dir.join(format!("{model}.ir"));
    let mut zoo = vec!["zoo", model, "-o", s(&ir)];
    zoo.extend_from_slice(zoo_args);
    let o = Command::new(exe()).args(&zoo).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let art = dir.join("art");
    let o = Command::new(exe())
        .args([
            "compile",
            s(&ir),
            "-o",
            s(&art),
            "--device-num",
            &devices.to_string(),
            "--parallel-mode",
            "data_parallel",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    art
}

/// A joined launcher in its own process group, its standard error collected as it comes.
struct Job {
    launcher: Child,
    stderr: Arc<Mutex<String>>,
    log: PathBuf,
    workers: usize,
    /// The value of [`MARK`] in every process of the job.
    mark: String,
}

/// An environment variable whose value marks the processes of one test's job.
const MARK: &str = "SHARDC_TEST_JOB_MARK";

impl Job {
    /// `shardc launch --join` of `workers` workers running `program` (after `--`).
    fn start(dir: &Path, workers: usize, program: &[&str], env: &[(&str, &str)]) -> Job {
        let log = dir.join("log");
        let n = workers.to_string();
        let port = free_port();
        let mut args = vec![
            "launch",
            "--worker-num",
            &n,
            "--local-worker-num",
            &n,
            "--master-port",
            &port,
            "--log-dir",
            s(&log),
            "--join",
            "--",
        ];
        args.extend_from_slice(program);
        let mark = format!(
            "{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        );
        let mut launcher = Command::new(exe())
            .args(&args)
            .envs(env.iter().copied())
            .env(MARK, &mark)
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap();
        let stderr = Arc::new(Mutex::new(String::new()));
        let reader = BufReader::new(launcher.stderr.take().unwrap());
        let sink = stderr.clone();
        std::thread::spawn(move || {
            for line in reader.lines().map_while(Result::ok) {
                let mut s = sink.lock().unwrap();
                s.push_str(&line);
                s.push('\n');
            }
        });
        Job {
            launcher,
            stderr,
            log,
            workers,
            mark,
        }
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// The pids the launcher printed (`launch: started NAME (pid P)`), once all are there.
    fn pids(&self) -> Vec<(String, i32)> {
        let t0 = Instant::now();
        loop {
            let err = self.stderr();
            let pids: Vec<(String, i32)> = err
                .lines()
                .filter_map(|l| l.strip_prefix("launch: started "))
                .filter_map(|l| {
                    let (name, pid) = l.split_once(" (pid ")?;
                    Some((name.to_string(), pid.trim_end_matches(')').parse().ok()?))
                })
                .collect();
            if pids.len() == self.workers + 1 {
                return pids;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "the launcher did not start its processes: {err}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until every rank has printed `steps` loss lines.
    fn wait_for_steps(&self, steps: usize) {
        let t0 = Instant::now();
        while (0..self.workers).any(|r| {
            std::fs::read_to_string(self.log.join(format!("1/rank.{r}/stdout")))
                .unwrap_or_default()
                .matches(", loss is ")
                .count()
                < steps
        }) {
            assert!(
                t0.elapsed() < Duration::from_secs(90),
                "training never got going: launcher: {} rank 0: {}",
                self.stderr(),
                std::fs::read_to_string(self.log.join("1/rank.0/stderr")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on the launcher this test started and has not reaped.
        assert_eq!(unsafe { libc::kill(self.launcher.id() as i32, sig) }, 0);
    }

    /// The launcher's exit status, waiting at most `limit`.
    fn wait(&mut self, limit: Duration) -> ExitStatus {
        let t0 = Instant::now();
        loop {
            if let Some(st) = self.launcher.try_wait().unwrap() {
                // Let the reader thread take the last lines.
                std::thread::sleep(Duration::from_millis(100));
                return st;
            }
            if t0.elapsed() > limit {
                self.kill_group();
                panic!(
                    "the launcher still ran {limit:?} after the signal: {}",
                    self.stderr()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn kill_group(&mut self) {
        // SAFETY: SIGKILL to this test's own process group for the launcher.
        unsafe { libc::kill(-(self.launcher.id() as i32), libc::SIGKILL) };
        let _ = self.launcher.wait();
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        // Whatever a failed assertion left behind.
        // SAFETY: as in kill_group; ESRCH when nothing is left is fine.
        unsafe { libc::kill(-(self.launcher.id() as i32), libc::SIGKILL) };
    }
}

/// Whether `pid` is still a live process (a zombie waiting to be reaped counts as ended).
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => false,
        Ok(stat) => {
            // `pid (comm) STATE ...`; comm may hold spaces and parentheses.
            let state = stat.rsplit_once(')').map(|(_, rest)| rest.trim_start());
            !matches!(state.and_then(|r| r.chars().next()), Some('Z') | Some('X'))
        }
    }
}

/// The live processes of a job: those whose environment carries the job's mark (the launcher
/// passes its environment to every process it starts, and they to theirs), whatever their
/// process group; a pid another test reuses meanwhile does not carry it.
fn job_processes(mark: &str) -> Vec<i32> {
    let needle = format!("{MARK}={mark}");
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(env) = std::fs::read(e.path().join("environ")) else {
            continue;
        };
        if !env.split(|&b| b == 0).any(|v| v == needle.as_bytes()) {
            continue;
        }
        if alive(pid) {
            found.push(pid);
        }
    }
    found
}

/// Waits at most `limit` for every pid to end; returns those still alive.
fn survivors(pids: &[(String, i32)], limit: Duration) -> Vec<(String, i32)> {
    let t0 = Instant::now();
    loop {
        let left: Vec<(String, i32)> = pids.iter().filter(|(_, p)| alive(*p)).cloned().collect();
        if left.is_empty() || t0.elapsed() > limit {
            return left;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The code of an exit status (a launcher killed by a signal has none).
fn code(st: &ExitStatus) -> Option<i32> {
    st.code()
}

/// SIGTERM or SIGINT to a joined launcher: forwarded to the scheduler and every worker; rank
/// 3's wrapper ignores it and is killed after SHARDC_KILL_TIMEOUT.
fn stop_with(sig: i32, name: &str, want_status: i32) {
    let dir = tmp(name);
    let art = compile(&dir, "quickstart", &["--batch", "16"], 4);
    // Rank 3 runs under a wrapper that ignores the signal and outlives its worker (which
    // aborts on its own once the scheduler is gone), as a stuck wrapper script would.
    let ignore = format!(
        "if [ \"$SHARDC_RANK\" = 3 ]; then trap '' {}; \"$0\" \"$@\"; while :; do sleep 0.1; done; fi; exec \"$0\" \"$@\"",
        name.trim_start_matches("SIG")
    );
    let mut job = Job::start(
        &dir,
        4,
        &[
            "sh",
            "-c",
            &ignore,
            exe(),
            "run",
            s(&art),
            "--steps",
            "100000000",
        ],
        &[("SHARDC_KILL_TIMEOUT", "2")],
    );
    let pids = job.pids();
    job.wait_for_steps(2);
    // The mark finds the job: the scheduler, the workers, rank 3's wrapper and its worker.
    let running = job_processes(&job.mark);
    assert!(running.len() >= 6, "the job's processes: {running:?}");
    let t0 = Instant::now();
    job.signal(sig);
    let st = job.wait(Duration::from_secs(20));
    let took = t0.elapsed();
    let err = job.stderr();
    assert_eq!(code(&st), Some(want_status), "{err}");
    // 2 s of kill timeout for rank 3, then the launcher's own bookkeeping.
    assert!(took < Duration::from_secs(10), "took {took:?}: {err}");
    assert!(
        err.contains(&format!("launch: {name} received: forwarding it to scheduler, rank 0, rank 1, rank 2, rank 3 (5 processes)")),
        "{err}"
    );
    for (who, _) in &pids {
        if who == "rank 3" {
            continue;
        }
        // Ended by the signal; or, on a loaded machine, on its own a moment before it landed
        // (a worker whose peer the signal ended first aborts, naming it).
        assert!(
            err.lines()
                .any(|l| l.starts_with(&format!("launch: {who} (pid "))
                    && (l.contains(&format!("ended by {name} (forwarded by the launcher)"))
                        || l.contains(&format!("after the launcher forwarded {name}")))),
            "{who}: {err}"
        );
    }
    assert!(
        err.lines().any(|l| l.starts_with("launch: rank 3 (pid ")
            && l.contains(
                "killed (SIGKILL) by the launcher: still running 2 s after it forwarded"
            )),
        "{err}"
    );
    // The launcher reaped them all: nothing of the job is left, not even a zombie.
    assert_eq!(
        survivors(&pids, Duration::from_millis(200)),
        vec![],
        "{err}"
    );
    // Nor what they started: rank 3's worker under the wrapper, the wrapper's sleep.
    assert_eq!(job_processes(&job.mark), Vec::<i32>::new(), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sigterm_to_a_joined_launcher_stops_every_process_and_exits_143() {
    stop_with(libc::SIGTERM, "SIGTERM", 143);
}

#[test]
fn sigint_to_a_joined_launcher_stops_every_process_and_exits_130() {
    stop_with(libc::SIGINT, "SIGINT", 130);
}

#[test]
fn a_sigkilled_launcher_leaves_no_orphan_behind() {
    let dir = tmp("sigkill");
    let art = compile(&dir, "quickstart", &["--batch", "16"], 4);
    // The bound the issue sets: no orphan outlives the launcher by more than this.
    let heartbeat_timeout = Duration::from_secs(5);
    let mut job = Job::start(
        &dir,
        4,
        &[exe(), "run", s(&art), "--steps", "100000000"],
        &[("SHARDC_HEARTBEAT_TIMEOUT", "5")],
    );
    let pids = job.pids();
    job.wait_for_steps(2);
    job.signal(libc::SIGKILL);
    let st = job.wait(Duration::from_secs(5));
    assert_eq!(code(&st), None, "killed by a signal");
    let left = survivors(&pids, heartbeat_timeout);
    assert_eq!(left, vec![], "orphans of the SIGKILLed launcher");
    assert_eq!(job_processes(&job.mark), Vec::<i32>::new());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_checkpoint_being_written_when_sigterm_lands_is_whole_or_absent() {
    let dir = tmp("ckpt");
    // A net whose checkpoints take a while to write (Adam keeps two moments per weight), saved
    // every step, so that the signal, sent as soon as a file is being written, lands in a
    // write more often than not.
    let art = {
        let ir = dir.join("mlp.ir");
        let o = Command::new(exe())
            .args(["zoo", "mlp", "--dims", "784,1024,1024,10", "-o", s(&ir)])
            .output()
            .unwrap();
        assert!(o.status.success());
        let art = dir.join("art");
        let o = Command::new(exe())
            .args([
                "compile",
                s(&ir),
                "-o",
                s(&art),
                "--device-num",
                "2",
                "--parallel-mode",
                "data_parallel",
                "--optimizer",
                "adam",
            ])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        art
    };
    let ck = dir.join("ck");
    let mut job = Job::start(
        &dir,
        2,
        &[
            exe(),
            "run",
            s(&art),
            "--steps",
            "100000000",
            "--checkpoint-dir",
            s(&ck),
            "--save-steps",
            "1",
            "--keep-checkpoint-max",
            "0",
        ],
        &[],
    );
    let pids = job.pids();
    job.wait_for_steps(2);
    // Send the signal the moment a checkpoint file is being written (`NAME.tmp`).
    let t0 = Instant::now();
    let mut writing = false;
    while t0.elapsed() < Duration::from_secs(30) && !writing {
        writing = (0..2).any(|r| {
            std::fs::read_dir(ck.join(r.to_string()))
                .map(|rd| {
                    rd.flatten()
                        .any(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
                })
                .unwrap_or(false)
        });
    }
    job.signal(libc::SIGTERM);
    let st = job.wait(Duration::from_secs(20));
    assert_eq!(code(&st), Some(143), "{}", job.stderr());
    assert_eq!(survivors(&pids, Duration::from_millis(200)), vec![]);
    // Every checkpoint under its final name is whole: it loads.
    let mut whole = 0;
    for r in 0..2 {
        for e in std::fs::read_dir(ck.join(r.to_string())).unwrap().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !name.ends_with(".safetensors") {
                // A write the signal cut short (`.tmp`): absent under its final name.
                eprintln!("rank {r}: {name} (signal sent while writing: {writing})");
                continue;
            }
            let o = Command::new(exe())
                .args(["ckpt", "inspect", s(&e.path())])
                .output()
                .unwrap();
            assert!(
                o.status.success(),
                "rank {r}'s {name} is not whole: {}",
                String::from_utf8_lossy(&o.stderr)
            );
            whole += 1;
        }
    }
    assert!(whole >= 2, "no checkpoint was saved before the signal");
    // And the job resumes from the newest step every rank saved whole.
    let o = Command::new(exe())
        .args(["run", s(&art), "--steps", "1", "--resume-from", s(&ck)])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success() && text.contains("resuming from step"),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
