//! The cluster through the `shardc` binary, with real processes: `shardc launch` starting a
//! scheduler and workers that run every collective and a training job; a worker killed with
//! SIGKILL; a wrong token and a garbage frame; a scheduler that cannot be reached, a port in
//! use, a worker count that never completes.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn exe() -> &'static str {
    env!("CARGO_BIN_EXE_shardc")
}

fn shardc(args: &[&str]) -> Output {
    Command::new(exe())
        .args(args)
        .output()
        .expect("the shardc binary runs")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn tmp(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("shardc-cluster-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A port nobody listens on now (bound, then released).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

fn rank_stdout(log: &Path, r: usize) -> String {
    read(&log.join(format!("1/rank.{r}/stdout")))
}

fn rank_stderr(log: &Path, r: usize) -> String {
    read(&log.join(format!("1/rank.{r}/stderr")))
}

fn loss_lines(s: &str) -> Vec<String> {
    s.lines()
        .filter(|l| l.contains(", loss is "))
        .map(str::to_string)
        .collect()
}

fn config() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("models/parallel_8.toml")
        .display()
        .to_string()
}

/// The tutorial's net as configured by models/parallel_8.toml (8 devices).
fn compile_quickstart(out: &Path) {
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/quickstart.ir");
    let c = shardc(&[
        "compile",
        model.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--config",
        &config(),
    ]);
    assert!(c.status.success(), "{}", text(&c));
}

/// Waits for `child` at most `limit`; kills it and fails the test beyond.
fn wait_within(child: &mut Child, limit: Duration, what: &str) -> std::process::ExitStatus {
    let t0 = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn four_workers_run_every_collective_on_sub_groups() {
    let log = tmp("collectives");
    let port = free_port().to_string();
    let o = shardc(&[
        "launch",
        "--worker-num",
        "4",
        "--local-worker-num",
        "4",
        "--master-port",
        &port,
        "--log-dir",
        log.to_str().unwrap(),
        "--join",
        "--",
        "shardc",
        "check-collectives",
    ]);
    let mut all = text(&o);
    for r in 0..4 {
        all += &format!(
            "\n--- rank {r}\n{}{}",
            rank_stdout(&log, r),
            rank_stderr(&log, r)
        );
    }
    assert!(o.status.success(), "{all}");
    for r in 0..4 {
        let out = rank_stdout(&log, r);
        assert!(
            out.starts_with(&format!("rank {r}: ")) && out.contains("collective checks passed"),
            "{all}"
        );
    }
    assert!(
        read(&log.join("scheduler.log")).contains("finished: 4 workers"),
        "{all}"
    );
    let _ = std::fs::remove_dir_all(&log);
}

#[test]
fn eight_launched_workers_print_the_losses_of_verify() {
    let dir = tmp("quickstart");
    let (art, log) = (dir.join("art"), dir.join("log"));
    compile_quickstart(&art);
    let port = free_port().to_string();
    let o = shardc(&[
        "launch",
        "--worker-num",
        "8",
        "--local-worker-num",
        "8",
        "--master-port",
        &port,
        "--log-dir",
        log.to_str().unwrap(),
        "--join",
        "--",
        "shardc",
        "run",
        art.to_str().unwrap(),
        "--steps",
        "4",
    ]);
    assert!(o.status.success(), "{}\n{}", text(&o), rank_stderr(&log, 0));
    // The same losses, bit for bit, as all ranks in one process ...
    let inproc = shardc(&["run", art.to_str().unwrap(), "--steps", "4"]);
    assert!(inproc.status.success(), "{}", text(&inproc));
    let want = loss_lines(&String::from_utf8_lossy(&inproc.stdout));
    assert_eq!(want.len(), 4);
    for r in 0..8 {
        assert_eq!(loss_lines(&rank_stdout(&log, r)), want, "rank {r}");
    }
    // ... and the single device's losses that `shardc verify` prints, within its tolerance.
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/quickstart.ir");
    let v = shardc(&[
        "verify",
        model.to_str().unwrap(),
        "--config",
        &config(),
        "--steps",
        "4",
    ]);
    assert!(v.status.success(), "{}", text(&v));
    let single: Vec<f64> = String::from_utf8_lossy(&v.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 3 && f[0].parse::<u32>().is_ok()).then(|| f[1].parse().unwrap())
        })
        .collect();
    assert_eq!(single.len(), 4, "{}", text(&v));
    for (line, s) in want.iter().zip(&single) {
        let got: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
        assert!(((got - s) / s).abs() < 1e-5, "{line} vs single device {s}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_killed_worker_ends_the_job_within_30_seconds_naming_its_rank() {
    let dir = tmp("kill");
    let (art, log) = (dir.join("art"), dir.join("log"));
    compile_quickstart(&art);
    let port = free_port().to_string();
    let mut launcher = Command::new(exe())
        .args([
            "launch",
            "--worker-num",
            "8",
            "--local-worker-num",
            "8",
            "--master-port",
            &port,
            "--log-dir",
            log.to_str().unwrap(),
            "--join",
            "--",
            "shardc",
            "run",
            art.to_str().unwrap(),
            "--steps",
            "100000000",
        ])
        .env("SHARDC_HEARTBEAT_TIMEOUT", "5")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The launcher names each process and its pid.
    let mut err = BufReader::new(launcher.stderr.take().unwrap());
    let mut victim = None;
    let mut seen = String::new();
    while victim.is_none() {
        let mut line = String::new();
        if err.read_line(&mut line).unwrap() == 0 {
            break;
        }
        seen += &line;
        if let Some(pid) = line.trim().strip_prefix("launch: started rank 2 (pid ") {
            victim = pid.trim_end_matches(')').parse::<i32>().ok();
        }
    }
    let victim = victim.unwrap_or_else(|| panic!("no pid for rank 2 in: {seen}"));
    // Let training get going on every rank.
    let t0 = Instant::now();
    while (0..8).any(|r| loss_lines(&rank_stdout(&log, r)).len() < 2) {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "training never started: {}",
            rank_stderr(&log, 0)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let killed_at = Instant::now();
    assert!(Command::new("kill")
        .args(["-9", &victim.to_string()])
        .status()
        .unwrap()
        .success());
    let st = wait_within(&mut launcher, Duration::from_secs(40), "the launcher");
    let took = killed_at.elapsed();
    let mut rest = String::new();
    let _ = std::io::Read::read_to_string(&mut err, &mut rest);
    assert!(!st.success(), "{rest}");
    assert!(
        took < Duration::from_secs(30),
        "the job took {took:?} to end"
    );
    let sched = read(&log.join("scheduler.log"));
    assert!(
        sched.contains("rank 2") && sched.contains("lost"),
        "{sched}"
    );
    for r in [0, 1, 3, 7] {
        let e = rank_stderr(&log, r);
        assert!(e.contains("rank 2"), "rank {r}: {e}");
    }
    assert!(
        rest.contains("rank 2") && rest.contains("status 137"),
        "{rest}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A scheduler process for `workers` workers on `port` with `token`.
fn scheduler(port: &str, workers: usize, token: &str, timeout_s: u64) -> Child {
    Command::new(exe())
        .arg("scheduler")
        .env("MS_ROLE", "MS_SCHED")
        .env("MS_WORKER_NUM", workers.to_string())
        .env("MS_SCHED_HOST", "127.0.0.1")
        .env("MS_SCHED_PORT", port)
        .env("SHARDC_CLUSTER_TOKEN", token)
        .env("SHARDC_CLUSTER_TIMEOUT", timeout_s.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// A worker running the collectives' check.
fn worker(port: &str, workers: usize, token: &str, timeout_s: u64) -> Child {
    Command::new(exe())
        .arg("check-collectives")
        .env("MS_ROLE", "MS_WORKER")
        .env("MS_WORKER_NUM", workers.to_string())
        .env("MS_SCHED_HOST", "127.0.0.1")
        .env("MS_SCHED_PORT", port)
        .env("SHARDC_CLUSTER_TOKEN", token)
        .env("SHARDC_CLUSTER_TIMEOUT", timeout_s.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn output_within(child: Child, limit: Duration, what: &str) -> Output {
    let mut child = child;
    wait_within(&mut child, limit, what);
    child.wait_with_output().unwrap()
}

#[test]
fn a_wrong_token_and_a_garbage_frame_are_refused_while_the_others_run() {
    let port = free_port().to_string();
    let sched = scheduler(&port, 2, "the-right-token", 60);
    // Garbage, then an oversized frame header, on raw connections.
    let t0 = Instant::now();
    let mut raw = loop {
        match TcpStream::connect(format!("127.0.0.1:{port}")) {
            Ok(s) => break s,
            Err(_) if t0.elapsed() < Duration::from_secs(20) => {
                std::thread::sleep(Duration::from_millis(50))
            }
            Err(e) => panic!("the scheduler never listened: {e}"),
        }
    };
    let _ = raw.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n\x00\xff\xfe garbage");
    let mut big = TcpStream::connect(format!("127.0.0.1:{port}")).unwrap();
    let _ = big.write_all(&[b'S', b'H', b'C', b'L', 1, 0xff, 0xff, 0xff, 0x7f]);
    let wrong = output_within(
        worker(&port, 2, "a-wrong-token", 20),
        Duration::from_secs(30),
        "the wrong worker",
    );
    assert!(!wrong.status.success());
    let t = text(&wrong);
    assert!(t.contains("wrong cluster token"), "{t}");
    // The real workers still form the job and pass.
    let good: Vec<Child> = (0..2)
        .map(|_| worker(&port, 2, "the-right-token", 60))
        .collect();
    for (i, w) in good.into_iter().enumerate() {
        let o = output_within(w, Duration::from_secs(60), "a worker");
        assert!(o.status.success(), "worker {i}: {}", text(&o));
        assert!(
            text(&o).contains("collective checks passed"),
            "{}",
            text(&o)
        );
    }
    let s = output_within(sched, Duration::from_secs(30), "the scheduler");
    let t = text(&s);
    assert!(s.status.success(), "{t}");
    assert!(
        t.contains("wrong cluster token"),
        "the refusal is logged: {t}"
    );
    drop((raw, big));
}

#[test]
fn an_unreachable_scheduler_is_a_clear_error_after_the_timeout() {
    let port = free_port().to_string();
    let t0 = Instant::now();
    let o = output_within(
        worker(&port, 2, "tok", 2),
        Duration::from_secs(30),
        "the worker",
    );
    assert!(!o.status.success());
    let t = text(&o);
    assert!(
        t.contains("could not reach the scheduler") && t.contains(&port),
        "{t}"
    );
    assert!(t0.elapsed() < Duration::from_secs(15), "{:?}", t0.elapsed());
}

#[test]
fn a_port_in_use_is_a_clear_error() {
    let held = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = held.local_addr().unwrap().port().to_string();
    let o = output_within(
        scheduler(&port, 2, "tok", 5),
        Duration::from_secs(30),
        "the scheduler",
    );
    assert!(!o.status.success());
    let t = text(&o);
    assert!(
        t.contains(&format!("127.0.0.1:{port}")) && t.to_lowercase().contains("in use"),
        "{t}"
    );
}

#[test]
fn a_worker_count_that_never_completes_times_out_naming_the_missing() {
    let port = free_port().to_string();
    let sched = scheduler(&port, 3, "tok", 3);
    let ws: Vec<Child> = (0..2).map(|_| worker(&port, 3, "tok", 3)).collect();
    let s = output_within(sched, Duration::from_secs(30), "the scheduler");
    assert!(!s.status.success());
    let t = text(&s);
    assert!(t.contains("2 of 3"), "{t}");
    for w in ws {
        let o = output_within(w, Duration::from_secs(30), "a worker");
        assert!(!o.status.success(), "{}", text(&o));
    }
}

#[test]
fn a_cluster_without_a_token_is_refused_with_advice() {
    let port = free_port().to_string();
    let o = Command::new(exe())
        .arg("check-collectives")
        .env("MS_ROLE", "MS_WORKER")
        .env("MS_WORKER_NUM", "2")
        .env("MS_SCHED_PORT", &port)
        .env_remove("SHARDC_CLUSTER_TOKEN")
        .env_remove("SHARDC_CLUSTER_TOKEN_FILE")
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(text(&o).contains("SHARDC_CLUSTER_TOKEN"), "{}", text(&o));
}
