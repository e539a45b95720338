//! `TcpComm` over 127.0.0.1, its ranks as threads of this process (each with its own
//! listener): every collective on the world of 4 and on sub-groups gives exactly the
//! in-process world's results; groups interleave; send/receive keeps order per tag; a
//! dropped rank, a wrong token, a stranger and a missing member give the right errors.

use shardc_collectives::tcp::{TcpComm, TcpSetup};
use shardc_ir::{DType, ReduceOp, TensorType};
use shardc_runtime::comm::{conformance, CommError, Communicator, InProcessWorld};
use shardc_runtime::tensor::{Data, Tensor};
use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn listeners(n: usize) -> (Vec<TcpListener>, Vec<SocketAddr>) {
    let ls: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    let addrs = ls.iter().map(|l| l.local_addr().unwrap()).collect();
    (ls, addrs)
}

fn setup(
    rank: usize,
    listener: TcpListener,
    peers: &[SocketAddr],
    job: &str,
    token: Option<&[u8]>,
    timeout: Duration,
) -> TcpSetup {
    TcpSetup {
        rank,
        size: peers.len(),
        job_id: job.to_string(),
        peers: peers.to_vec(),
        listener,
        token: token.map(<[u8]>::to_vec),
        tls: None,
        timeout,
    }
}

/// A world of `n` TCP ranks (set up concurrently, as processes would).
fn tcp_world(n: usize, token: Option<&[u8]>, timeout: Duration) -> Vec<TcpComm> {
    let (ls, addrs) = listeners(n);
    let handles: Vec<_> = ls
        .into_iter()
        .enumerate()
        .map(|(r, l)| {
            let s = setup(r, l, &addrs, "job-1", token, timeout);
            std::thread::spawn(move || TcpComm::new(s))
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().unwrap().unwrap())
        .collect()
}

/// Runs `f` on every rank at once; results by rank.
fn on_every_rank<T: Send>(
    comms: Vec<&dyn Communicator>,
    f: impl Fn(&dyn Communicator) -> T + Sync,
) -> Vec<T> {
    std::thread::scope(|s| {
        let f = &f;
        let hs: Vec<_> = comms.into_iter().map(|c| s.spawn(move || f(c))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn refs(v: &[TcpComm]) -> Vec<&dyn Communicator> {
    v.iter().map(|c| c as &dyn Communicator).collect()
}

/// Values spread over six decades, so a sum in another order gives other bits.
fn value(case: usize, rank: usize, i: usize) -> f64 {
    let h = (case * 7919 + rank * 104_729 + i * 15_485_863) % 1_000_003;
    let mag = 10f64.powi((h % 7) as i32 - 3);
    let sign = if h % 3 == 0 { -1.0 } else { 1.0 };
    sign * (1.0 + (h % 1000) as f64 / 997.0) * mag
}

fn tensor(case: usize, rank: usize, shape: &[usize], dtype: DType) -> Tensor {
    let n: usize = shape.iter().product();
    let v = |i| value(case, rank, i);
    let data = match dtype {
        DType::Float32 => Data::F32((0..n).map(|i| v(i) as f32).collect()),
        DType::Float64 => Data::F64((0..n).map(v).collect()),
        DType::Float16 => Data::F16((0..n).map(|i| half::f16::from_f64(v(i))).collect()),
        DType::BFloat16 => Data::BF16((0..n).map(|i| half::bf16::from_f64(v(i))).collect()),
        DType::Int32 => Data::I32((0..n).map(|i| (v(i) * 1000.0) as i32).collect()),
        DType::Int64 => Data::I64((0..n).map(|i| (v(i) * 1e6) as i64 | 1).collect()),
        DType::Bool => Data::Bool((0..n).map(|i| v(i) > 0.0).collect()),
    };
    Tensor {
        shape: shape.to_vec(),
        data,
    }
}

/// Bitwise identity (NaN-safe).
fn bits(t: &Tensor) -> (Vec<usize>, DType, Vec<u64>) {
    let b: Vec<u64> = match &t.data {
        Data::F32(v) => v.iter().map(|x| x.to_bits() as u64).collect(),
        Data::F64(v) => v.iter().map(|x| x.to_bits()).collect(),
        Data::F16(v) => v.iter().map(|x| x.to_bits() as u64).collect(),
        Data::BF16(v) => v.iter().map(|x| x.to_bits() as u64).collect(),
        Data::I32(v) => v.iter().map(|&x| x as u32 as u64).collect(),
        Data::I64(v) => v.iter().map(|&x| x as u64).collect(),
        Data::Bool(v) => v.iter().map(|&x| x as u64).collect(),
    };
    (t.shape.clone(), t.dtype(), b)
}

/// A program of every collective on the groups this rank is in; every result (or error's
/// variant) in call order.
fn program(comm: &dyn Communicator) -> Vec<String> {
    let rank = comm.rank();
    let groups: [&[usize]; 3] = [&[0, 1, 2, 3], &[0, 2], &[1, 2, 3]];
    let mut out = Vec::new();
    let mut record = |what: String, r: Result<Tensor, CommError>| {
        out.push(match r {
            Ok(t) => format!("{what}: {:?}", bits(&t)),
            Err(e) => format!("{what}: error {e}"),
        });
    };
    for (gi, g) in groups.iter().enumerate() {
        if !g.contains(&rank) {
            continue;
        }
        let n = g.len();
        let case = gi * 100;
        for (k, op) in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Prod]
            .into_iter()
            .enumerate()
        {
            for (shape, dtype) in [
                (vec![3, 5], DType::Float32),
                (vec![70_001], DType::Float32),
                (vec![40_000, 3], DType::Float64),
                (vec![7], DType::Int32),
                (vec![33_000], DType::Int64),
                (vec![0], DType::Float32),
            ] {
                let mut t = tensor(case + k, rank, &shape, dtype);
                let r = comm.all_reduce(g, op, &mut t).map(|()| t);
                record(format!("AllReduce {g:?} {op} {shape:?} {dtype}"), r);
            }
        }
        for (axis, shape, dtype) in [
            (0, vec![2, 3], DType::Float32),
            (1, vec![2, 3], DType::Bool),
            (1, vec![4, 50_000], DType::BFloat16),
        ] {
            let t = tensor(case + 10, rank, &shape, dtype);
            record(
                format!("AllGather {g:?} axis {axis} {shape:?}"),
                comm.all_gather(g, axis, &t),
            );
        }
        for (axis, shape) in [(1, vec![3, 2 * n]), (0, vec![n * 30_000, 2])] {
            let t = tensor(case + 20, rank, &shape, DType::Float32);
            record(
                format!("ReduceScatter {g:?} axis {axis} {shape:?}"),
                comm.reduce_scatter(g, ReduceOp::Sum, axis, &t),
            );
        }
        let t = tensor(case + 30, rank, &[2 * n, 3, n], DType::Int64);
        record(format!("AlltoAll {g:?}"), comm.all_to_all(g, 0, 2, &t));
        for (root, dtype) in [(g[n - 1], DType::Float16), (g[0], DType::Float64)] {
            let mut t = tensor(case + 40, rank, &[3, 4], dtype);
            let r = comm.broadcast(g, root, &mut t).map(|()| t);
            record(format!("Broadcast {g:?} root {root}"), r);
        }
        record(
            format!("Barrier {g:?}"),
            comm.barrier(g).map(|()| Tensor::scalar_f32(0.0)),
        );
        // Argument errors every member sees.
        let t = tensor(case + 50, rank, &[3], DType::Bool);
        record(
            format!("ReduceScatter {g:?} of Bool"),
            comm.reduce_scatter(g, ReduceOp::Sum, 0, &t),
        );
        let t = tensor(case + 51, rank, &[n + 1], DType::Float32);
        if n > 1 {
            record(
                format!("AlltoAll {g:?} indivisible"),
                comm.all_to_all(g, 0, 0, &t),
            );
        }
    }
    out
}

#[test]
fn every_collective_matches_the_in_process_world() {
    let tcp = tcp_world(4, None, Duration::from_secs(60));
    let got = on_every_rank(refs(&tcp), program);
    let local = InProcessWorld::new(4);
    let want = on_every_rank(local.iter().map(|c| c.as_ref()).collect(), program);
    for r in 0..4 {
        assert_eq!(got[r].len(), want[r].len());
        for (g, w) in got[r].iter().zip(&want[r]) {
            // Error messages name the detecting rank, which may differ; results must not.
            if w.contains(": error ") {
                let (gw, ww) = (g.split(": error ").next(), w.split(": error ").next());
                assert_eq!(gw, ww, "rank {r}");
                assert!(g.contains(": error "), "rank {r}: {g} but in process: {w}");
            } else {
                assert!(
                    g == w,
                    "rank {r}: differs from the in-process world: {}",
                    &g[..g.len().min(200)]
                );
            }
        }
    }
}

#[test]
fn the_conformance_suite_passes() {
    for n in [2, 4] {
        let tcp = tcp_world(n, Some(b"secret"), Duration::from_secs(60));
        for r in on_every_rank(refs(&tcp), conformance::run) {
            assert!(r.as_ref().is_ok_and(|&k| k > 20), "world of {n}: {r:?}");
        }
    }
}

#[test]
fn groups_interleave_across_threads() {
    let tcp = tcp_world(4, None, Duration::from_secs(60));
    let results = on_every_rank(refs(&tcp), |comm| {
        let rank = comm.rank();
        let pair: Vec<usize> = if rank % 2 == 0 {
            vec![0, 2]
        } else {
            vec![1, 3]
        };
        let world = [0, 1, 2, 3];
        let sums_and_gathers = std::thread::scope(|s| {
            let a = s.spawn(|| {
                (0..40)
                    .map(|i| {
                        let mut t = Tensor::from_f64(vec![2], vec![rank as f64, i as f64]).unwrap();
                        comm.all_reduce(&pair, ReduceOp::Sum, &mut t).unwrap();
                        t.as_f64().unwrap().to_vec()
                    })
                    .collect::<Vec<_>>()
            });
            let b = s.spawn(|| {
                (0..40)
                    .map(|i| {
                        let t = Tensor::from_f64(vec![1], vec![(rank * 100 + i) as f64]).unwrap();
                        comm.all_gather(&world, 0, &t)
                            .unwrap()
                            .as_f64()
                            .unwrap()
                            .to_vec()
                    })
                    .collect::<Vec<_>>()
            });
            (a.join().unwrap(), b.join().unwrap())
        });
        (sums_and_gathers.0, sums_and_gathers.1, pair)
    });
    for (rank, (sums, gathers, pair)) in results.into_iter().enumerate() {
        for (i, s) in sums.iter().enumerate() {
            assert_eq!(
                s,
                &vec![(pair[0] + pair[1]) as f64, 2.0 * i as f64],
                "rank {rank}"
            );
        }
        for (i, g) in gathers.iter().enumerate() {
            let want: Vec<f64> = (0..4).map(|r| (r * 100 + i) as f64).collect();
            assert_eq!(g, &want, "rank {rank}");
        }
    }
}

#[test]
fn send_and_receive_keep_order_per_pair_and_tag() {
    let tcp = tcp_world(3, None, Duration::from_secs(30));
    let ty = |n| TensorType::new(DType::Float32, vec![n]);
    on_every_rank(refs(&tcp), |comm| match comm.rank() {
        0 => {
            for i in 0..30 {
                let tag = if i % 2 == 0 { 5 } else { -9 };
                let n = 1 + i * 1000;
                let t = Tensor::from_f32(vec![n], vec![i as f32; n]).unwrap();
                comm.send(1, tag, &t).unwrap();
            }
            // To itself.
            comm.send(0, 1, &Tensor::scalar_f32(4.0)).unwrap();
            let t = comm
                .recv(0, 1, &TensorType::new(DType::Float32, vec![]))
                .unwrap();
            assert_eq!(t.as_f32().unwrap(), &[4.0]);
            comm.send(2, 0, &Tensor::from_i32(vec![2], vec![1, 2]).unwrap())
                .unwrap();
        }
        1 => {
            for i in (1..30).step_by(2) {
                let t = comm.recv(0, -9, &ty(1 + i * 1000)).unwrap();
                assert_eq!(t.as_f32().unwrap()[0], i as f32);
            }
            for i in (0..30).step_by(2) {
                let t = comm.recv(0, 5, &ty(1 + i * 1000)).unwrap();
                assert_eq!(t.as_f32().unwrap()[i * 1000], i as f32);
            }
        }
        _ => {
            let e = comm
                .recv(0, 0, &TensorType::new(DType::Float32, vec![2]))
                .unwrap_err();
            assert!(matches!(e, CommError::Mismatch { .. }), "{e}");
            assert!(
                e.to_string().contains("rank 0 sent <Tensor[Int32], (2)>"),
                "{e}"
            );
            let e = comm.recv(7, 0, &ty(1)).unwrap_err();
            assert!(matches!(e, CommError::InvalidGroup { .. }), "{e}");
        }
    });
}

#[test]
fn a_dropped_rank_fails_the_others_at_once() {
    let mut tcp = tcp_world(3, None, Duration::from_secs(60));
    // One collective that works first, so every connection has carried data.
    on_every_rank(refs(&tcp), |c| c.barrier(&[0, 1, 2]).unwrap());
    drop(tcp.pop());
    let start = Instant::now();
    let errs = on_every_rank(refs(&tcp), |c| {
        let mut t = Tensor::from_f32(vec![4], vec![1.0; 4]).unwrap();
        let ar = c.all_reduce(&[0, 1, 2], ReduceOp::Sum, &mut t).unwrap_err();
        let rv = c
            .recv(2, 0, &TensorType::new(DType::Float32, vec![1]))
            .unwrap_err();
        (ar, rv)
    });
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    for (ar, rv) in errs {
        for e in [ar, rv] {
            assert!(matches!(e, CommError::Transport { .. }), "{e}");
            assert!(e.to_string().contains("rank 2 (127.0.0.1:"), "{e}");
        }
    }
    // The survivors still talk to each other.
    let sums = on_every_rank(refs(&tcp), |c| {
        let mut t = Tensor::from_f32(vec![1], vec![c.rank() as f32 + 1.0]).unwrap();
        c.all_reduce(&[0, 1], ReduceOp::Sum, &mut t).map(|()| t)
    });
    for s in sums {
        assert_eq!(s.unwrap().as_f32().unwrap(), &[3.0]);
    }
}

#[test]
fn a_missing_member_times_out_naming_it() {
    let tcp = tcp_world(2, None, Duration::from_millis(600));
    let mut t = Tensor::from_f32(vec![2], vec![1.0, 2.0]).unwrap();
    let start = Instant::now();
    let e = tcp[0]
        .all_reduce(&[0, 1], ReduceOp::Sum, &mut t)
        .unwrap_err();
    assert!(start.elapsed() >= Duration::from_millis(550));
    match &e {
        CommError::Timeout { missing, rank, .. } => {
            assert_eq!((missing.as_slice(), *rank), ([1usize].as_slice(), 0));
        }
        other => panic!("{other}"),
    }
    // A member arriving after the timed-out member's report got there gets the same error
    // instead of waiting again. (One arriving earlier may still complete with the data that
    // was sent before the timeout: members of a distributed call cannot retract messages.)
    std::thread::sleep(Duration::from_millis(300));
    let mut t = Tensor::from_f32(vec![2], vec![1.0, 2.0]).unwrap();
    let late = tcp[1]
        .all_reduce(&[0, 1], ReduceOp::Sum, &mut t)
        .unwrap_err();
    assert!(
        matches!(&late, CommError::Timeout { missing, rank: 0, .. } if missing == &[1]),
        "{late}"
    );
    let e = tcp[1]
        .recv(0, 3, &TensorType::new(DType::Float32, vec![1]))
        .unwrap_err();
    assert!(matches!(e, CommError::Timeout { .. }), "{e}");
}

#[test]
fn disagreements_reach_every_member() {
    let tcp = tcp_world(3, None, Duration::from_secs(30));
    let errs = on_every_rank(refs(&tcp), |c| {
        let r = c.rank();
        let mut out = Vec::new();
        // Shapes differ (large path on some members, small on others).
        let n = if r == 1 { 100_000 } else { 10 };
        let mut t = Tensor::from_f32(vec![n], vec![1.0; n]).unwrap();
        out.push(c.all_reduce(&[0, 1, 2], ReduceOp::Sum, &mut t).unwrap_err());
        // Different collectives at one position.
        let t = Tensor::from_f32(vec![2], vec![1.0; 2]).unwrap();
        out.push(match r {
            0 => c.all_gather(&[0, 1, 2], 0, &t).unwrap_err(),
            _ => c
                .all_reduce(&[0, 1, 2], ReduceOp::Max, &mut t.clone())
                .unwrap_err(),
        });
        // A broadcast where a non-root has another dtype.
        let mut t = if r == 2 {
            Tensor::from_f64(vec![2], vec![1.0; 2]).unwrap()
        } else {
            Tensor::from_f32(vec![2], vec![1.0; 2]).unwrap()
        };
        out.push(c.broadcast(&[0, 1, 2], 0, &mut t).unwrap_err());
        // And the world still works.
        let mut t = Tensor::from_f32(vec![1], vec![1.0]).unwrap();
        c.all_reduce(&[0, 1, 2], ReduceOp::Sum, &mut t).unwrap();
        assert_eq!(t.as_f32().unwrap(), &[3.0]);
        out
    });
    for (r, es) in errs.iter().enumerate() {
        for e in es {
            assert!(matches!(e, CommError::Mismatch { .. }), "rank {r}: {e}");
        }
        assert!(
            es[0]
                .to_string()
                .contains("rank 1 passed <Tensor[Float32], (100000)>"),
            "{}",
            es[0]
        );
        assert!(
            es[2]
                .to_string()
                .contains("rank 2 passed <Tensor[Float64], (2)>"),
            "{}",
            es[2]
        );
    }
}

#[test]
fn a_wrong_token_is_refused() {
    let (mut ls, addrs) = listeners(2);
    let l1 = ls.pop().unwrap();
    let l0 = ls.pop().unwrap();
    let t = Duration::from_millis(1500);
    let s0 = setup(0, l0, &addrs, "job", Some(b"right"), t);
    let s1 = setup(1, l1, &addrs, "job", Some(b"wrong"), t);
    let h0 = std::thread::spawn(move || TcpComm::new(s0));
    let e1 = TcpComm::new(s1).unwrap_err();
    assert!(matches!(&e1, CommError::Transport { .. }), "{e1}");
    assert!(e1.to_string().contains("cluster token"), "{e1}");
    let e0 = h0.join().unwrap().unwrap_err();
    assert!(
        matches!(&e0, CommError::Timeout { missing, .. } if missing == &[1]),
        "{e0}"
    );
    // No token against a token.
    let (mut ls, addrs) = listeners(2);
    let l1 = ls.pop().unwrap();
    let l0 = ls.pop().unwrap();
    let s0 = setup(0, l0, &addrs, "job", Some(b"right"), t);
    let s1 = setup(1, l1, &addrs, "job", None, t);
    let h0 = std::thread::spawn(move || TcpComm::new(s0));
    let e1 = TcpComm::new(s1).unwrap_err();
    assert!(e1.to_string().contains("requires one"), "{e1}");
    assert!(h0.join().unwrap().is_err());
}

#[test]
fn strangers_and_other_jobs_are_refused_and_setup_goes_on() {
    let (mut ls, addrs) = listeners(2);
    let l1 = ls.pop().unwrap();
    let l0 = ls.pop().unwrap();
    let t = Duration::from_secs(20);
    let s0 = setup(0, l0, &addrs, "job-a", Some(b"k"), t);
    let h0 = std::thread::spawn(move || TcpComm::new(s0));
    // Garbage, then silence-and-close, then a rank of another job.
    let mut junk = TcpStream::connect(addrs[0]).unwrap();
    junk.write_all(&[0xde; 100]).unwrap();
    drop(TcpStream::connect(addrs[0]).unwrap());
    let other = TcpListener::bind("127.0.0.1:0").unwrap();
    let e = TcpComm::new(setup(1, other, &addrs, "job-b", Some(b"k"), t)).unwrap_err();
    assert!(e.to_string().contains("belongs to job 'job-b'"), "{e}");
    // The right rank 1 still gets in.
    let c1 = TcpComm::new(setup(1, l1, &addrs, "job-a", Some(b"k"), t)).unwrap();
    let c0 = h0.join().unwrap().unwrap();
    let comms = [c0, c1];
    let sums = on_every_rank(refs(&comms), |c| {
        let mut x = Tensor::from_i64(vec![1], vec![c.rank() as i64 + 5]).unwrap();
        c.all_reduce(&[0, 1], ReduceOp::Prod, &mut x).map(|()| x)
    });
    for s in sums {
        assert_eq!(s.unwrap().data, Data::I64(vec![30]));
    }
}

#[test]
fn setup_errors_are_typed() {
    let (mut ls, addrs) = listeners(3);
    let l = ls.remove(0);
    let e = TcpComm::new(TcpSetup {
        rank: 5,
        ..setup(0, l, &addrs, "j", None, Duration::from_secs(1))
    })
    .unwrap_err();
    assert!(matches!(e, CommError::InvalidArgument { .. }), "{e}");
    // Rank 2 never starts; rank 1 never connects to 0 (it does not exist either).
    let l = ls.remove(0);
    let start = Instant::now();
    let e = TcpComm::new(setup(1, l, &addrs, "j", None, Duration::from_millis(500))).unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(3));
    assert!(
        matches!(&e, CommError::Timeout { missing, .. } if missing == &[0, 2]),
        "{e}"
    );
}

#[test]
fn a_world_of_one_works() {
    let tcp = tcp_world(1, None, Duration::from_secs(5));
    let c: Arc<dyn Communicator> = Arc::new(tcp.into_iter().next().unwrap());
    let mut t = Tensor::from_f32(vec![2], vec![1.0, 2.0]).unwrap();
    c.all_reduce(&[0], ReduceOp::Sum, &mut t).unwrap();
    assert_eq!(t.as_f32().unwrap(), &[1.0, 2.0]);
    assert_eq!(c.all_gather(&[0], 0, &t).unwrap(), t);
    c.barrier(&[0]).unwrap();
    assert!(conformance::run(c.as_ref()).is_ok());
}
