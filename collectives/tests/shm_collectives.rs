//! Shared-memory collectives between real processes: the test binary re-executes itself,
//! one child per rank (the environment variable `SHARDC_SHM_CHILD` names the test whose
//! worker the child runs), and every child compares its results bit for bit with an
//! in-process world (threads) running the same calls on the same data.

use shardc_collectives::shm::{segment_files, ShmComm, ShmSetup};
use shardc_collectives::{CommSetup, Peer, ProcessComm};
use shardc_ir::{DType, ReduceOp};
use shardc_runtime::comm::{allowed_cores, restrict_to, CommError, Communicator, InProcessWorld};
use shardc_runtime::{Data, Tensor};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

const CHILD: &str = "SHARDC_SHM_CHILD";
const RANK: &str = "SHARDC_SHM_RANK";
const SIZE: &str = "SHARDC_SHM_SIZE";
const JOB: &str = "SHARDC_SHM_JOB";
const PORTS: &str = "SHARDC_SHM_PORTS";
const HOSTS: &str = "SHARDC_SHM_HOSTS";

/// A child's role: which rank of which job.
struct Role {
    rank: usize,
    size: usize,
    job: String,
}

/// `Some` in a child started for `test`.
fn role(test: &str) -> Option<Role> {
    if std::env::var(CHILD).ok()? != test {
        return None;
    }
    let get = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} is not set"));
    Some(Role {
        rank: get(RANK).parse().unwrap(),
        size: get(SIZE).parse().unwrap(),
        job: get(JOB),
    })
}

/// Whether this process is a child of some test (then every other test does nothing).
fn in_other_child(test: &str) -> bool {
    std::env::var(CHILD).is_ok_and(|c| c != test)
}

/// Starts `size` children running `test`'s worker; `extra(rank)` adds environment.
fn spawn(
    test: &str,
    size: usize,
    job: &str,
    extra: &dyn Fn(usize) -> Vec<(String, String)>,
) -> Vec<Child> {
    let exe = std::env::current_exe().unwrap();
    (0..size)
        .map(|rank| {
            let mut cmd = Command::new(&exe);
            cmd.args([test, "--exact", "--nocapture", "--test-threads=1"])
                .env(CHILD, test)
                .env(RANK, rank.to_string())
                .env(SIZE, size.to_string())
                .env(JOB, job)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            for (k, v) in extra(rank) {
                cmd.env(k, v);
            }
            cmd.spawn().unwrap()
        })
        .collect()
}

/// Waits for every child (killing them all after `limit`); panics with their output unless
/// every one succeeded. Returns the elapsed time.
fn wait_all(children: Vec<Child>, limit: Duration) -> Duration {
    let start = Instant::now();
    let mut children = children;
    loop {
        let done = children
            .iter_mut()
            .all(|c| c.try_wait().ok().flatten().is_some());
        if done || start.elapsed() > limit {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let elapsed = start.elapsed();
    let mut failed = Vec::new();
    for (rank, mut c) in children.into_iter().enumerate() {
        if c.try_wait().ok().flatten().is_none() {
            let _ = c.kill();
        }
        let out = c.wait_with_output().unwrap();
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            if let Some(i) = line.find("rank ") {
                eprintln!("{}", &line[i..]);
            }
        }
        if !out.status.success() {
            failed.push(format!(
                "rank {rank}: {}\n--- stdout\n{}\n--- stderr\n{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    assert!(
        failed.is_empty(),
        "after {elapsed:?} (limit {limit:?}):\n{}",
        failed.join("\n")
    );
    elapsed
}

fn job_id(test: &str) -> String {
    format!(
        "{test}-{}-{}",
        std::process::id(),
        Instant::now().elapsed().as_nanos()
    )
}

fn assert_no_segments(job: &str) {
    let left = segment_files(job);
    assert!(left.is_empty(), "segments left in /dev/shm: {left:?}");
}

/// Runs `test` on `size` processes with a ShmComm each and checks that no segment is left.
fn run_shm_world(test: &str, size: usize, limit: Duration) -> Duration {
    let job = job_id(test);
    let children = spawn(test, size, &job, &|_| Vec::new());
    let elapsed = wait_all(children, limit);
    assert_no_segments(&job);
    elapsed
}

fn shm_comm(role: &Role, timeout: Duration) -> ShmComm {
    ShmComm::new(&ShmSetup {
        rank: role.rank,
        size: role.size,
        job_id: role.job.clone(),
        local_ranks: (0..role.size).collect(),
        timeout,
    })
    .unwrap()
}

/// The sum, in member order, of the f32 tensors of `len` elements of case `case` of members
/// `0..size` (what an AllReduce of them gives every member).
fn f32_sum(case: u64, size: usize, len: usize) -> Tensor {
    let mut want = data(case, 0, &[len], DType::Float32);
    for m in 1..size {
        let x = data(case, m, &[len], DType::Float32);
        for (a, b) in want
            .as_f32_mut()
            .unwrap()
            .iter_mut()
            .zip(x.as_f32().unwrap())
        {
            *a += b;
        }
    }
    want
}

/// Member `m`'s tensor for case `case`: values whose sums depend on the order of addition.
fn data(case: u64, m: usize, shape: &[usize], dtype: DType) -> Tensor {
    let n: usize = shape.iter().product();
    let v = |i: usize| {
        let h = (case * 7919 + m as u64 * 104_729 + i as u64 * 15_485_863) % 2001;
        let e = ((case + m as u64 * 3 + i as u64) % 7) as i32 - 3;
        (h as f64 - 1000.0) * 10f64.powi(e)
    };
    let data = match dtype {
        DType::Float32 => Data::F32((0..n).map(|i| v(i) as f32).collect()),
        DType::Float64 => Data::F64((0..n).map(v).collect()),
        DType::Int32 => Data::I32((0..n).map(|i| (v(i) * 10.0) as i32).collect()),
        DType::Int64 => Data::I64((0..n).map(|i| (v(i) * 1000.0) as i64).collect()),
        DType::Bool => Data::Bool((0..n).map(|i| (i + m) % 3 == 0).collect()),
        DType::Float16 => Data::F16((0..n).map(|i| half::f16::from_f64(v(i))).collect()),
        DType::BFloat16 => Data::BF16((0..n).map(|i| half::bf16::from_f64(v(i))).collect()),
    };
    Tensor {
        shape: shape.to_vec(),
        data,
    }
}

/// What one call produced: a tensor, or the kind of error.
#[derive(Debug, PartialEq)]
enum Out {
    T(Tensor),
    Err(&'static str),
}

fn kind(e: &CommError) -> &'static str {
    match e {
        CommError::InvalidGroup { .. } => "InvalidGroup",
        CommError::InvalidArgument { .. } => "InvalidArgument",
        CommError::Mismatch { .. } => "Mismatch",
        CommError::Timeout { .. } => "Timeout",
        CommError::Transport { .. } => "Transport",
    }
}

fn out(r: Result<Tensor, CommError>) -> Out {
    match r {
        Ok(t) => Out::T(t),
        Err(e) => Out::Err(kind(&e)),
    }
}

/// The groups of the script for a world of `n`.
fn script_groups(n: usize) -> Vec<Vec<usize>> {
    let mut g = vec![(0..n).collect::<Vec<_>>()];
    if n >= 4 {
        g.push(vec![0, 2]);
        g.push(vec![1, 2, 3]);
    }
    g
}

/// Every collective on every group of the script, interleaving the groups call by call.
/// Returns this rank's results in call order.
fn script(comm: &dyn Communicator, large: usize) -> Vec<Out> {
    let rank = comm.rank();
    let groups: Vec<Vec<usize>> = script_groups(comm.size())
        .into_iter()
        .filter(|g| g.contains(&rank))
        .collect();
    let mut res = Vec::new();
    let mut case = 0u64;
    let mut step = |f: &mut dyn FnMut(&[usize], usize, u64) -> Out| {
        // One call per group before the next call on any group: groups interleave.
        for g in &groups {
            let m = g.iter().position(|&r| r == rank).unwrap();
            case += 1;
            res.push(f(g, m, case));
        }
    };
    for dtype in [DType::Float32, DType::Float64, DType::Int32, DType::Int64] {
        for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Prod] {
            step(&mut |g, m, c| {
                let mut t = data(c, m, &[3, 5], dtype);
                out(comm.all_reduce(g, op, &mut t).map(|()| t))
            });
        }
    }
    for (len, dtype) in [
        (large, DType::Float32),
        (large / 2 + 3, DType::Float64),
        (20_000, DType::Float32),
    ] {
        step(&mut |g, m, c| {
            let mut t = data(c, m, &[len], dtype);
            out(comm.all_reduce(g, ReduceOp::Sum, &mut t).map(|()| t))
        });
    }
    step(&mut |g, m, c| {
        let mut t = data(c, m, &[large / 4 + 1], DType::Int64);
        out(comm.all_reduce(g, ReduceOp::Max, &mut t).map(|()| t))
    });
    for axis in 0..3 {
        for dtype in [DType::Float32, DType::Bool, DType::Float16, DType::Int64] {
            step(&mut |g, m, c| out(comm.all_gather(g, axis, &data(c, m, &[2, 3, 4], dtype))));
        }
    }
    step(&mut |g, m, c| out(comm.all_gather(g, 0, &data(c, m, &[large / 3, 3], DType::Float32))));
    step(&mut |g, m, c| out(comm.all_gather(g, 1, &data(c, m, &[3, large / 5], DType::Float32))));
    for axis in 0..2 {
        for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Prod] {
            step(&mut |g, m, c| {
                out(comm.reduce_scatter(g, op, axis, &data(c, m, &[12, 12, 2], DType::Float64)))
            });
        }
    }
    step(&mut |g, m, c| {
        out(comm.reduce_scatter(
            g,
            ReduceOp::Sum,
            1,
            &data(c, m, &[5, 12 * (large / 60)], DType::Float32),
        ))
    });
    for (s, cd) in [(0, 1), (1, 0), (1, 1), (0, 2)] {
        step(&mut |g, m, c| {
            out(comm.all_to_all(g, s, cd, &data(c, m, &[12, 12, 3], DType::Int32)))
        });
    }
    step(&mut |g, m, c| {
        out(comm.all_to_all(g, 0, 1, &data(c, m, &[12, large / 12], DType::Float32)))
    });
    for dtype in [DType::Float32, DType::Bool, DType::BFloat16] {
        step(&mut |g, m, c| {
            let root = g[g.len() - 1 - (c as usize % g.len())];
            let mut t = data(c, m, &[7, 9], dtype);
            out(comm.broadcast(g, root, &mut t).map(|()| t))
        });
    }
    step(&mut |g, m, c| {
        let mut t = data(c, m, &[large], DType::Float32);
        out(comm.broadcast(g, g[0], &mut t).map(|()| t))
    });
    step(&mut |g, _, _| out(comm.barrier(g).map(|()| Tensor::scalar_f32(0.0))));
    // Errors every member must see alike.
    step(&mut |g, m, c| {
        let mut t = data(c, m, &[4], DType::Bool);
        out(comm.all_reduce(g, ReduceOp::Sum, &mut t).map(|()| t))
    });
    step(&mut |g, m, c| out(comm.all_gather(g, 3, &data(c, m, &[2, 3], DType::Float32))));
    step(&mut |g, m, c| {
        out(comm.reduce_scatter(
            g,
            ReduceOp::Sum,
            0,
            &data(c, m, &[g.len() * 2 + 1], DType::Float32),
        ))
    });
    step(&mut |g, m, c| {
        // Member 1 passes another shape: a disagreement.
        let shape = if m == 1 { vec![5] } else { vec![4] };
        let mut t = data(c, m, &shape, DType::Float32);
        out(comm.all_reduce(g, ReduceOp::Sum, &mut t).map(|()| t))
    });
    step(&mut |g, m, c| {
        let mut t = data(c, m, &[4], DType::Float32);
        if m == 0 && g.len() > 1 {
            out(comm.all_reduce(g, ReduceOp::Max, &mut t).map(|()| t))
        } else {
            out(comm.all_reduce(g, ReduceOp::Sum, &mut t).map(|()| t))
        }
    });
    // And the groups still work afterwards.
    step(&mut |g, m, c| {
        let mut t = data(c, m, &[33], DType::Float32);
        out(comm.all_reduce(g, ReduceOp::Sum, &mut t).map(|()| t))
    });
    // Like calls in a row (shared memory keeps their descriptions), then one member differs
    // in its operation only, then all agree again.
    for round in 0..6 {
        step(&mut |g, m, c| {
            let odd_one = round == 3 && g.len() > 1 && m == g.len() - 1;
            let op = if odd_one {
                ReduceOp::Max
            } else {
                ReduceOp::Sum
            };
            let mut t = data(c, m, &[6], DType::Float32);
            out(comm.all_reduce(g, op, &mut t).map(|()| t))
        });
    }
    res
}

/// The script's results for `rank` in an in-process world of `size` threads.
fn expected(size: usize, rank: usize, large: usize) -> Vec<Out> {
    let world = InProcessWorld::with_timeout(size, Duration::from_secs(60));
    let handles: Vec<_> = world
        .into_iter()
        .map(|c: Arc<dyn Communicator>| std::thread::spawn(move || script(c.as_ref(), large)))
        .collect();
    let mut all: Vec<Vec<Out>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    all.swap_remove(rank)
}

fn compare(got: &[Out], want: &[Out]) {
    assert_eq!(got.len(), want.len(), "number of calls");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        match (g, w) {
            (Out::T(a), Out::T(b)) => {
                assert_eq!(a.shape, b.shape, "call {i}: shape");
                assert_eq!(a.dtype(), b.dtype(), "call {i}: dtype");
                // Bitwise comparison (NaN == NaN).
                let same = match (&a.data, &b.data) {
                    (Data::F32(x), Data::F32(y)) => {
                        x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits())
                    }
                    (Data::F64(x), Data::F64(y)) => {
                        x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits())
                    }
                    _ => a.data == b.data,
                };
                assert!(same, "call {i}: values differ from the in-process world's");
            }
            _ => assert_eq!(g, w, "call {i}"),
        }
    }
}

const LARGE: usize = 300_004;

fn worker_script(role: &Role) {
    let comm = shm_comm(role, Duration::from_secs(60));
    let got = script(&comm, LARGE);
    let want = expected(role.size, role.rank, LARGE);
    compare(&got, &want);
    println!(
        "rank {}: {} calls equal the in-process world's",
        role.rank,
        got.len()
    );
    // The same calls once more: the boxes' state carries over correctly.
    let again = script(&comm, 1000);
    compare(&again, &expected(role.size, role.rank, 1000));
}

#[test]
fn shm_world_of_four_matches_in_process() {
    const T: &str = "shm_world_of_four_matches_in_process";
    if let Some(r) = role(T) {
        return worker_script(&r);
    }
    if in_other_child(T) {
        return;
    }
    run_shm_world(T, 4, Duration::from_secs(240));
}

#[test]
fn shm_world_of_two_and_one() {
    const T: &str = "shm_world_of_two_and_one";
    if let Some(r) = role(T) {
        return worker_script(&r);
    }
    if in_other_child(T) {
        return;
    }
    run_shm_world(T, 2, Duration::from_secs(240));
    run_shm_world(T, 1, Duration::from_secs(240));
}

#[test]
fn shm_eight_processes_on_few_cores() {
    const T: &str = "shm_eight_processes_on_few_cores";
    if let Some(r) = role(T) {
        let comm = shm_comm(&r, Duration::from_secs(60));
        let world: Vec<usize> = (0..r.size).collect();
        let pairs: Vec<usize> = vec![r.rank & !1, r.rank | 1];
        for i in 0..300u64 {
            let mut t = data(i, r.rank, &[64], DType::Float32);
            comm.all_reduce(&world, ReduceOp::Sum, &mut t).unwrap();
            assert_eq!(t, f32_sum(i, r.size, 64), "iteration {i}");
            comm.barrier(&pairs).unwrap();
        }
        let mut t = data(9, r.rank, &[LARGE], DType::Float32);
        comm.all_reduce(&world, ReduceOp::Sum, &mut t).unwrap();
        return;
    }
    if in_other_child(T) {
        return;
    }
    let elapsed = run_shm_world(T, 8, Duration::from_secs(120));
    eprintln!("8 processes, 300 small all-reduces + barriers and one large: {elapsed:?}");
    assert!(elapsed < Duration::from_secs(60), "too slow: {elapsed:?}");
}

#[test]
fn shm_member_that_never_arrives_times_out() {
    const T: &str = "shm_member_that_never_arrives_times_out";
    if let Some(r) = role(T) {
        let comm = shm_comm(&r, Duration::from_millis(1500));
        if r.rank == 2 {
            std::thread::sleep(Duration::from_secs(4));
            return;
        }
        let start = Instant::now();
        let mut t = data(1, r.rank, &[16], DType::Float32);
        let e = comm
            .all_reduce(&[0, 1, 2], ReduceOp::Sum, &mut t)
            .unwrap_err();
        let took = start.elapsed();
        match &e {
            CommError::Timeout { missing, .. } => assert_eq!(missing, &vec![2], "{e}"),
            other => panic!("expected a timeout, got {other}"),
        }
        assert!(e.to_string().contains("ranks {2} never arrived"), "{e}");
        assert!(
            took >= Duration::from_millis(1400) && took < Duration::from_secs(4),
            "{took:?}"
        );
        // A pair without the absent member still works.
        comm.barrier(&[0, 1]).unwrap();
        return;
    }
    if in_other_child(T) {
        return;
    }
    run_shm_world(T, 3, Duration::from_secs(60));
}

#[test]
fn shm_setup_times_out_without_peers_and_leaves_nothing() {
    if std::env::var(CHILD).is_ok() {
        return;
    }
    let job = job_id("setup_timeout");
    let start = Instant::now();
    let e = ShmComm::new(&ShmSetup {
        rank: 0,
        size: 3,
        job_id: job.clone(),
        local_ranks: vec![0, 1, 2],
        timeout: Duration::from_millis(300),
    })
    .unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(3));
    match &e {
        CommError::Timeout { missing, .. } => assert_eq!(missing, &vec![1, 2], "{e}"),
        other => panic!("expected a timeout, got {other}"),
    }
    assert_no_segments(&job);
}

#[test]
fn shm_stale_segment_of_a_dead_process_is_removed() {
    if std::env::var(CHILD).is_ok() {
        return;
    }
    let mut dead = Command::new("true").spawn().unwrap();
    let pid = dead.id();
    dead.wait().unwrap();
    let job = job_id("stale");
    let sanitized: String = job
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    let stale = format!("/dev/shm/shardc-shm-{sanitized}-r1-p{pid}");
    std::fs::write(&stale, b"left by a killed process").unwrap();
    assert_eq!(segment_files(&job).len(), 1);
    let comm = ShmComm::new(&ShmSetup {
        rank: 0,
        size: 1,
        job_id: job.clone(),
        local_ranks: vec![0],
        timeout: Duration::from_secs(5),
    })
    .unwrap();
    assert_no_segments(&job);
    let mut t = data(1, 0, &[5], DType::Float32);
    let before = t.clone();
    comm.all_reduce(&[0], ReduceOp::Sum, &mut t).unwrap();
    assert_eq!(t, before);
}

/// Free ports on the loopback interface for the children's TCP listeners.
fn free_ports(n: usize) -> Vec<u16> {
    let ls: Vec<_> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    ls.iter().map(|l| l.local_addr().unwrap().port()).collect()
}

fn process_comm(r: &Role) -> ProcessComm {
    let ports: Vec<u16> = std::env::var(PORTS)
        .unwrap()
        .split(',')
        .map(|p| p.parse().unwrap())
        .collect();
    let hosts: Vec<String> = std::env::var(HOSTS)
        .unwrap()
        .split(',')
        .map(str::to_string)
        .collect();
    let listener = {
        let start = Instant::now();
        loop {
            match std::net::TcpListener::bind(("127.0.0.1", ports[r.rank])) {
                Ok(l) => break l,
                Err(e) if start.elapsed() > Duration::from_secs(5) => panic!("bind: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    };
    ProcessComm::new(CommSetup {
        rank: r.rank,
        size: r.size,
        job_id: r.job.clone(),
        peers: (0..r.size)
            .map(|p| Peer {
                host_id: hosts[p].clone(),
                data_addr: format!("127.0.0.1:{}", ports[p]).parse().unwrap(),
            })
            .collect(),
        listener,
        token: Some(b"secret".to_vec()),
        tls: None,
        timeout: Duration::from_secs(60),
    })
    .unwrap()
}

fn run_process_world(test: &str, hosts: &[&str], limit: Duration) {
    let job = job_id(test);
    let ports = free_ports(hosts.len());
    let ports_s = ports
        .iter()
        .map(u16::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let hosts_s = hosts.join(",");
    let children = spawn(test, hosts.len(), &job, &|_| {
        vec![
            (PORTS.into(), ports_s.clone()),
            (HOSTS.into(), hosts_s.clone()),
        ]
    });
    wait_all(children, limit);
    assert_no_segments(&job);
}

fn worker_process(r: &Role) {
    let comm = process_comm(r);
    let hosts: Vec<String> = std::env::var(HOSTS)
        .unwrap()
        .split(',')
        .map(str::to_string)
        .collect();
    let local: Vec<usize> = (0..r.size).filter(|&p| hosts[p] == hosts[r.rank]).collect();
    assert_eq!(comm.local_ranks(), local);
    let got = script(&comm, 100_003);
    compare(&got, &expected(r.size, r.rank, 100_003));
    let checks = shardc_runtime::comm::conformance::run(&comm).unwrap();
    assert!(checks > 0);
    println!("rank {}: {checks} conformance checks passed", r.rank);
}

#[test]
fn process_comm_one_host_of_four() {
    const T: &str = "process_comm_one_host_of_four";
    if let Some(r) = role(T) {
        return worker_process(&r);
    }
    if in_other_child(T) {
        return;
    }
    run_process_world(T, &["h", "h", "h", "h"], Duration::from_secs(300));
}

#[test]
fn process_comm_two_hosts_of_two() {
    const T: &str = "process_comm_two_hosts_of_two";
    if let Some(r) = role(T) {
        return worker_process(&r);
    }
    if in_other_child(T) {
        return;
    }
    run_process_world(T, &["a", "a", "b", "b"], Duration::from_secs(300));
}

#[test]
fn ranks_held_on_one_core_move_apart_and_stay_exact() {
    let cores = allowed_cores();
    if cores.len() < 2 {
        eprintln!("skipped: this test needs two cores it may use, it has {cores:?}");
        return;
    }
    let job = job_id("ranks_held_on_one_core");
    let threads: Vec<_> = (0..2)
        .map(|rank| {
            let job = job.clone();
            let first = cores[0];
            std::thread::spawn(move || {
                let comm = shm_comm(&Role { rank, size: 2, job }, Duration::from_secs(60));
                // Both threads held on one core, as if the scheduler had put them there and
                // left them: only the communicator's own move can separate them (it restores
                // the mask the communicator was made with).
                assert!(restrict_to(&[first]));
                for i in 0..2000u64 {
                    let mut t = data(i, rank, &[1024], DType::Float32);
                    comm.all_reduce(&[0, 1], ReduceOp::Sum, &mut t).unwrap();
                    assert_eq!(t, f32_sum(i, 2, 1024), "call {i}");
                }
                comm.core_moves()
            })
        })
        .collect();
    let moves: Vec<u64> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert_no_segments(&job);
    assert!(
        moves.iter().sum::<u64>() >= 1,
        "neither rank left the shared core: {moves:?}"
    );
}
