//! The in-process communicator: every collective on 1, 2, 4 and 8 thread ranks and on
//! sub-groups, checked against a direct element-by-element computation; results identical on
//! every member; typed errors for bad groups, disagreeing members and missing members.

use shardc_ir::{DType, ReduceOp, TensorType};
use shardc_runtime::comm::{
    allowed_cores, restrict_to, Collective, CommError, Communicator, CoreMoves, InProcessWorld,
};
use shardc_runtime::{Data, Tensor};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Runs `f(comm)` on one thread per rank and returns the results in rank order.
fn run_world<T: Send>(
    comms: Vec<Arc<dyn Communicator>>,
    f: impl Fn(&dyn Communicator) -> T + Sync,
) -> Vec<T> {
    std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .iter()
            .map(|c| {
                let f = &f;
                s.spawn(move || f(c.as_ref()))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank thread panicked"))
            .collect()
    })
}

/// Rank `r`'s distinct test values: non-integers so that sums round differently by order.
fn input(rank: usize, shape: &[usize]) -> Vec<f64> {
    let n: usize = shape.iter().product();
    (0..n)
        .map(|i| ((rank * 7919 + i * 104_729) % 1000) as f64 / 37.0 - 13.0 + 0.1 * rank as f64)
        .collect()
}

fn t64(shape: &[usize], v: Vec<f64>) -> Tensor {
    Tensor::from_f64(shape.to_vec(), v).unwrap()
}

fn t32(shape: &[usize], v: &[f64]) -> Tensor {
    Tensor::from_f32(shape.to_vec(), v.iter().map(|&x| x as f32).collect()).unwrap()
}

fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        idx[d] = i % shape[d];
        i /= shape[d];
    }
    idx
}

fn ravel(idx: &[usize], shape: &[usize]) -> usize {
    idx.iter().zip(strides(shape)).map(|(i, s)| i * s).sum()
}

/// Elementwise reduction of `xs` (member order), in f64 or f32 arithmetic.
fn reduce_ref(xs: &[Vec<f64>], op: ReduceOp, f32_arith: bool) -> Vec<f64> {
    let round = |x: f64| if f32_arith { x as f32 as f64 } else { x };
    let mut acc: Vec<f64> = xs[0].iter().map(|&x| round(x)).collect();
    for x in &xs[1..] {
        for (a, &b) in acc.iter_mut().zip(x) {
            let b = round(b);
            *a = match op {
                ReduceOp::Sum => round(*a + b),
                ReduceOp::Prod => round(*a * b),
                ReduceOp::Max => a.max(b),
                ReduceOp::Min => a.min(b),
            };
        }
    }
    acc
}

/// Member `j`'s AlltoAll result, element by element: output index `o` along `concat` names
/// the source member `o[c] / part[c]`; the element is that member's input at the part's
/// position, shifted by `j`'s block along `split`.
fn all_to_all_ref(
    xs: &[Vec<f64>],
    shape: &[usize],
    split: usize,
    concat: usize,
    j: usize,
) -> (Vec<usize>, Vec<f64>) {
    let n = xs.len();
    let mut part = shape.to_vec();
    part[split] /= n;
    let mut out_shape = part.clone();
    out_shape[concat] *= n;
    let len: usize = out_shape.iter().product();
    let vals = (0..len)
        .map(|k| {
            let o = unravel(k, &out_shape);
            let i = o[concat] / part[concat];
            let mut q = o.clone();
            q[concat] %= part[concat];
            q[split] += j * part[split];
            xs[i][ravel(&q, shape)]
        })
        .collect();
    (out_shape, vals)
}

/// AllGather's result: member `i`'s tensor occupies block `i` along `axis`.
fn all_gather_ref(xs: &[Vec<f64>], shape: &[usize], axis: usize) -> (Vec<usize>, Vec<f64>) {
    let n = xs.len();
    let mut out_shape = shape.to_vec();
    out_shape[axis] *= n;
    let len: usize = out_shape.iter().product();
    let vals = (0..len)
        .map(|k| {
            let mut o = unravel(k, &out_shape);
            let i = o[axis] / shape[axis];
            o[axis] %= shape[axis];
            xs[i][ravel(&o, shape)]
        })
        .collect();
    (out_shape, vals)
}

/// Block `j` of `n` along `axis` of `x`.
fn block_ref(
    x: &[f64],
    shape: &[usize],
    axis: usize,
    n: usize,
    j: usize,
) -> (Vec<usize>, Vec<f64>) {
    let mut out_shape = shape.to_vec();
    out_shape[axis] /= n;
    let len: usize = out_shape.iter().product();
    let vals = (0..len)
        .map(|k| {
            let mut o = unravel(k, &out_shape);
            o[axis] += j * out_shape[axis];
            x[ravel(&o, shape)]
        })
        .collect();
    (out_shape, vals)
}

/// Every collective on a group, checked at one member: `rank` is the caller, `group` the
/// sorted members, `n` their count. Returns the all-reduce result for cross-member checks.
fn check_all_collectives(c: &dyn Communicator, group: &[usize]) -> Vec<Tensor> {
    let n = group.len();
    let me = group.iter().position(|&r| r == c.rank()).unwrap();
    let shape = [2 * n, 4, 3];
    let xs: Vec<Vec<f64>> = group.iter().map(|&r| input(r, &shape)).collect();
    let mine = &xs[me];
    let mut shared = Vec::new();

    // AllReduce: every op, f64 and f32, exact (same order of operations).
    for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Prod] {
        let mut t = t64(&shape, mine.clone());
        c.all_reduce(group, op, &mut t).unwrap();
        assert_eq!(t.shape, shape);
        assert_eq!(
            t.to_f64_vec(),
            reduce_ref(&xs, op, false),
            "AllReduce {op} f64"
        );
        let mut t = t32(&shape, mine);
        c.all_reduce(group, op, &mut t).unwrap();
        assert_eq!(
            t.to_f64_vec(),
            reduce_ref(&xs, op, true),
            "AllReduce {op} f32"
        );
        shared.push(t);
    }
    // Integer sums.
    let mut ti = Tensor::from_i64(vec![3], vec![c.rank() as i64, 1, -2]).unwrap();
    c.all_reduce(group, ReduceOp::Sum, &mut ti).unwrap();
    let rsum: i64 = group.iter().map(|&r| r as i64).sum();
    assert_eq!(ti.data, Data::I64(vec![rsum, n as i64, -2 * n as i64]));

    // AllGather along every axis.
    for axis in 0..shape.len() {
        let got = c
            .all_gather(group, axis, &t64(&shape, mine.clone()))
            .unwrap();
        let (s, v) = all_gather_ref(&xs, &shape, axis);
        assert_eq!(got.shape, s, "AllGather axis {axis}");
        assert_eq!(got.to_f64_vec(), v, "AllGather axis {axis}");
    }
    // AllGather moves any dtype.
    let b = Tensor {
        shape: vec![1],
        data: Data::Bool(vec![c.rank() % 2 == 1]),
    };
    let got = c.all_gather(group, 0, &b).unwrap();
    assert_eq!(
        got.data,
        Data::Bool(group.iter().map(|&r| r % 2 == 1).collect())
    );

    // ReduceScatter along axes 0 and 2 (shape (2n, 4, 3): n divides dim 0; dim 2 only for
    // n in {1, 3}).
    for (axis, op) in [(0, ReduceOp::Sum), (0, ReduceOp::Max), (2, ReduceOp::Sum)] {
        if shape[axis] % n != 0 {
            continue;
        }
        let got = c
            .reduce_scatter(group, op, axis, &t64(&shape, mine.clone()))
            .unwrap();
        let full = reduce_ref(&xs, op, false);
        let (s, v) = block_ref(&full, &shape, axis, n, me);
        assert_eq!(got.shape, s, "ReduceScatter axis {axis}");
        assert_eq!(got.to_f64_vec(), v, "ReduceScatter axis {axis} {op}");
    }

    // AlltoAll for several (split, concat) pairs, including split == concat.
    for (split, concat) in [(0, 1), (0, 0), (0, 2), (2, 0)] {
        if shape[split] % n != 0 {
            continue;
        }
        let got = c
            .all_to_all(group, split, concat, &t64(&shape, mine.clone()))
            .unwrap();
        let (s, v) = all_to_all_ref(&xs, &shape, split, concat, me);
        assert_eq!(got.shape, s, "AlltoAll {split}->{concat}");
        assert_eq!(got.to_f64_vec(), v, "AlltoAll {split}->{concat}");
    }

    // Broadcast from the last member and from the first.
    for root_index in [n - 1, 0] {
        let root = group[root_index];
        let mut t = t32(&shape, mine);
        c.broadcast(group, root, &mut t).unwrap();
        assert_eq!(t, t32(&shape, &xs[root_index]), "Broadcast from {root}");
    }

    c.barrier(group).unwrap();
    shared
}

#[test]
fn every_collective_on_the_whole_world() {
    for n in [1, 2, 4, 8] {
        let group: Vec<usize> = (0..n).collect();
        let results = run_world(InProcessWorld::new(n), |c| {
            assert_eq!(c.size(), n);
            check_all_collectives(c, &group)
        });
        // Bit-identical on every member.
        for r in &results[1..] {
            assert_eq!(r, &results[0], "world of {n}");
        }
    }
}

#[test]
fn collectives_on_sub_groups_run_concurrently() {
    // Ranks {1, 3} and {0, 2} of 4 at the same time, then the pairs {0, 1}, {2, 3}, then
    // the world, then {1, 2, 3}.
    let results = run_world(InProcessWorld::new(4), |c| {
        let r = c.rank();
        let odd_even: Vec<usize> = if r % 2 == 1 { vec![1, 3] } else { vec![0, 2] };
        let a = check_all_collectives(c, &odd_even);
        let pair: Vec<usize> = if r < 2 { vec![0, 1] } else { vec![2, 3] };
        check_all_collectives(c, &pair);
        check_all_collectives(c, &[0, 1, 2, 3]);
        if r > 0 {
            check_all_collectives(c, &[1, 2, 3]);
        }
        a
    });
    assert_eq!(results[1], results[3]);
    assert_eq!(results[0], results[2]);
    assert_ne!(results[0], results[1]);
}

#[test]
fn sums_are_reduced_in_member_order_whatever_the_arrival_order() {
    // f32 values whose sum depends on the order; ranks arrive in reverse order.
    let vals = [1.0e8_f32, 1.0, -1.0e8, 1.0];
    let results = run_world(InProcessWorld::new(4), |c| {
        std::thread::sleep(Duration::from_millis(20 * (3 - c.rank()) as u64));
        let mut t = Tensor::from_f32(vec![1], vec![vals[c.rank()]]).unwrap();
        c.all_reduce(&[0, 1, 2, 3], ReduceOp::Sum, &mut t).unwrap();
        t.as_f32().unwrap()[0]
    });
    let want = ((vals[0] + vals[1]) + vals[2]) + vals[3];
    assert!(
        results.iter().all(|&r| r.to_bits() == want.to_bits()),
        "{results:?} vs {want}"
    );
}

#[test]
fn send_and_receive_in_a_ring_keep_order_per_tag() {
    for n in [1, 2, 4, 8] {
        let results = run_world(InProcessWorld::new(n), |c| {
            let r = c.rank();
            let next = (r + 1) % n;
            let prev = (r + n - 1) % n;
            let ty = TensorType::new(DType::Float64, vec![2]);
            for k in 0..3 {
                c.send(next, 5, &t64(&[2], vec![r as f64, k as f64]))
                    .unwrap();
            }
            c.send(next, 6, &t64(&[2], vec![-1.0, -1.0])).unwrap();
            // Tag 6 first: tags are separate queues.
            let other = c.recv(prev, 6, &ty).unwrap();
            assert_eq!(other.to_f64_vec(), vec![-1.0, -1.0]);
            (0..3)
                .map(|_| c.recv(prev, 5, &ty).unwrap().to_f64_vec())
                .collect::<Vec<_>>()
        });
        for (r, got) in results.iter().enumerate() {
            let prev = ((r + n - 1) % n) as f64;
            assert_eq!(
                got,
                &vec![vec![prev, 0.0], vec![prev, 1.0], vec![prev, 2.0]]
            );
        }
    }
}

#[test]
fn bad_groups_are_errors_naming_the_collective_and_group() {
    let comms = InProcessWorld::new(4);
    let c = comms[0].as_ref();
    let mut t = t64(&[2], vec![1.0, 2.0]);
    let err = c.all_reduce(&[1, 3], ReduceOp::Sum, &mut t).unwrap_err();
    assert!(matches!(err, CommError::InvalidGroup { .. }));
    assert_eq!(
        err.to_string(),
        "AllReduce on group {1, 3} at rank 0: rank 0 is not a member of the group"
    );
    let err = c.all_gather(&[2, 0], 0, &t).unwrap_err();
    assert_eq!(
        err.to_string(),
        "AllGather on group {2, 0} at rank 0: the group must list distinct ranks in ascending order"
    );
    let err = c.barrier(&[0, 4]).unwrap_err();
    assert!(
        err.to_string()
            .contains("rank 4 is outside the world of 4 ranks"),
        "{err}"
    );
    let err = c.broadcast(&[0, 1], 2, &mut t).unwrap_err();
    assert_eq!(
        err.to_string(),
        "Broadcast on group {0, 1} at rank 0: the root rank 2 is not in the group"
    );
    let err = c.send(9, 0, &t).unwrap_err();
    assert!(
        err.to_string().contains("rank 9 is outside the world"),
        "{err}"
    );
    // A one-member group works without anyone else.
    c.all_reduce(&[0], ReduceOp::Sum, &mut t).unwrap();
    assert_eq!(t.to_f64_vec(), vec![1.0, 2.0]);
}

#[test]
fn disagreeing_members_all_get_an_error() {
    // Different shapes.
    let errs = run_world(InProcessWorld::new(2), |c| {
        let shape = if c.rank() == 0 {
            vec![2, 3]
        } else {
            vec![3, 2]
        };
        let mut t = Tensor::from_f32(shape, vec![0.0; 6]).unwrap();
        c.all_reduce(&[0, 1], ReduceOp::Sum, &mut t).unwrap_err()
    });
    for e in &errs {
        assert!(matches!(e, CommError::Mismatch { .. }), "{e}");
        let s = e.to_string();
        assert!(s.starts_with("AllReduce on group {0, 1}"), "{s}");
        assert!(
            s.contains("rank 1 passed <Tensor[Float32], (3, 2)> but rank 0 passed <Tensor[Float32], (2, 3)>"),
            "{s}"
        );
    }
    // Different parameters at the same position of the sequence.
    let errs = run_world(InProcessWorld::new(2), |c| {
        let op = if c.rank() == 0 {
            ReduceOp::Sum
        } else {
            ReduceOp::Max
        };
        let mut t = t64(&[1], vec![1.0]);
        c.all_reduce(&[0, 1], op, &mut t).unwrap_err().to_string()
    });
    for e in &errs {
        assert!(e.contains("members disagree"), "{e}");
        assert!(
            e.contains("AllReduce(op=sum)") && e.contains("AllReduce(op=max)"),
            "{e}"
        );
    }
    // Bool cannot be reduced; indivisible scatter; axis out of range.
    let errs = run_world(InProcessWorld::new(2), |c| {
        let mut b = Tensor {
            shape: vec![2],
            data: Data::Bool(vec![true, false]),
        };
        let e1 = c.all_reduce(&[0, 1], ReduceOp::Sum, &mut b).unwrap_err();
        let x = t64(&[3, 2], vec![0.0; 6]);
        let e2 = c.reduce_scatter(&[0, 1], ReduceOp::Sum, 0, &x).unwrap_err();
        let e3 = c.all_gather(&[0, 1], 2, &x).unwrap_err();
        // The world still works after failed calls.
        let mut ok = t64(&[1], vec![c.rank() as f64]);
        c.all_reduce(&[0, 1], ReduceOp::Sum, &mut ok).unwrap();
        assert_eq!(ok.to_f64_vec(), vec![1.0]);
        [e1.to_string(), e2.to_string(), e3.to_string()]
    });
    for e in &errs {
        assert!(
            e[0].contains("cannot reduce <Tensor[Bool], (2)>"),
            "{}",
            e[0]
        );
        assert!(
            e[1].contains(
                "the group of 2 ranks does not divide dim 0 (axis) of <Tensor[Float64], (3, 2)>"
            ),
            "{}",
            e[1]
        );
        assert!(e[2].contains("axis 2 is out of range"), "{}", e[2]);
    }
    // A received tensor of another type.
    let errs = run_world(InProcessWorld::new(2), |c| {
        if c.rank() == 0 {
            c.send(1, 3, &t64(&[2], vec![1.0, 2.0])).unwrap();
            None
        } else {
            let ty = TensorType::new(DType::Float32, vec![2]);
            Some(c.recv(0, 3, &ty).unwrap_err().to_string())
        }
    });
    assert_eq!(
        errs[1].as_deref(),
        Some("Receive on group {0, 1} at rank 1: members disagree: rank 0 sent <Tensor[Float64], (2)> under tag 3 but rank 1 expects <Tensor[Float32], (2)>")
    );
}

#[test]
fn a_missing_member_is_a_timeout_naming_it() {
    let timeout = Duration::from_millis(200);
    let start = Instant::now();
    let results = run_world(InProcessWorld::with_timeout(4, timeout), |c| {
        if c.rank() == 2 {
            return None;
        }
        let mut t = t64(&[1], vec![1.0]);
        let err = c
            .all_reduce(&[0, 1, 2, 3], ReduceOp::Sum, &mut t)
            .unwrap_err();
        Some(err)
    });
    let elapsed = start.elapsed();
    assert!(elapsed < Duration::from_secs(5), "took {elapsed:?}");
    for (r, e) in results.iter().enumerate() {
        let Some(e) = e else {
            assert_eq!(r, 2);
            continue;
        };
        match e {
            CommError::Timeout {
                collective,
                missing,
                timeout: t,
                ..
            } => {
                assert_eq!(*collective, Collective::AllReduce);
                assert_eq!(missing, &vec![2]);
                assert_eq!(*t, timeout);
            }
            other => panic!("rank {r}: {other}"),
        }
        assert!(
            e.to_string()
                .contains("timed out after 0.200 s; ranks {2} never arrived"),
            "{e}"
        );
    }
    // A receive whose sender never sends.
    let comms = InProcessWorld::with_timeout(2, Duration::from_millis(50));
    let ty = TensorType::new(DType::Float32, vec![1]);
    let err = comms[1].recv(0, 0, &ty).unwrap_err();
    assert_eq!(
        err.to_string(),
        "Receive on group {0, 1} at rank 1: timed out after 0.050 s; ranks {0} never arrived"
    );
}

#[test]
fn many_rounds_on_eight_ranks() {
    // Long sequences on 8 ranks (more threads than cores) finish and stay matched.
    let results = run_world(InProcessWorld::new(8), |c| {
        let mut acc = 0.0;
        for k in 0..200 {
            let mut t = t64(&[4], vec![(c.rank() + k) as f64; 4]);
            c.all_reduce(&[0, 1, 2, 3, 4, 5, 6, 7], ReduceOp::Sum, &mut t)
                .unwrap();
            acc += t.to_f64_vec()[0];
            let g = if c.rank() < 4 {
                [0, 1, 2, 3]
            } else {
                [4, 5, 6, 7]
            };
            c.barrier(&g).unwrap();
        }
        acc
    });
    let want: f64 = (0..200)
        .map(|k| (0..8).map(|r| (r + k) as f64).sum::<f64>())
        .sum();
    assert!(results.iter().all(|&a| a == want));
}

/// Throughput of AllReduce and AllGather on 8 thread ranks (run with `--ignored
/// --nocapture`; timings depend on the machine).
#[test]
#[ignore]
fn throughput_on_eight_ranks() {
    let n = 8;
    let len = 1 << 20;
    let rounds = 20;
    let group: Vec<usize> = (0..n).collect();
    let start = Instant::now();
    run_world(InProcessWorld::new(n), |c| {
        let mut t = Tensor::from_f32(vec![len], vec![c.rank() as f32; len]).unwrap();
        for _ in 0..rounds {
            c.all_reduce(&group, ReduceOp::Sum, &mut t).unwrap();
        }
    });
    let dt = start.elapsed().as_secs_f64() / rounds as f64;
    println!(
        "AllReduce of {len} f32 on {n} ranks: {:.2} ms per call ({:.2} GB/s of input per rank)",
        dt * 1e3,
        (len * 4) as f64 / dt / 1e9
    );
    let start = Instant::now();
    run_world(InProcessWorld::new(n), |c| {
        let t = Tensor::from_f32(vec![len / n, 8], vec![1.0; len / n * 8]).unwrap();
        for _ in 0..rounds {
            c.all_gather(&group, 1, &t).unwrap();
        }
    });
    let dt = start.elapsed().as_secs_f64() / rounds as f64;
    println!(
        "AllGather (axis 1) of {} f32 per rank on {n} ranks: {:.2} ms per call",
        len,
        dt * 1e3
    );
    let start = Instant::now();
    run_world(InProcessWorld::new(n), |c| {
        for _ in 0..1000 {
            c.barrier(&group).unwrap();
        }
    });
    println!(
        "Barrier on {n} ranks: {:.1} us per call",
        start.elapsed().as_secs_f64() * 1e6 / 1000.0
    );
}

#[test]
fn thread_ranks_held_on_one_core_move_apart_and_stay_exact() {
    let cores = allowed_cores();
    if cores.len() < 2 {
        eprintln!("skipped: this test needs two cores it may use, it has {cores:?}");
        return;
    }
    let first = cores[0];
    // Made on this thread, with its whole mask: a move restores that mask.
    let comms = InProcessWorld::comms(2, Duration::from_secs(30));
    let moves: Vec<u64> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .iter()
            .map(|comm| {
                s.spawn(move || {
                    // Both ranks held on one core, as if the scheduler had put them there:
                    // only the communicator's own move can separate them.
                    assert!(restrict_to(&[first]));
                    for i in 0..2000 {
                        let v = (comm.rank() * 1000 + i) as f32;
                        let mut t = Tensor::from_f32(vec![4], vec![v; 4]).unwrap();
                        comm.all_reduce(&[0, 1], ReduceOp::Sum, &mut t).unwrap();
                        let want = (2 * i + 1000) as f32;
                        assert_eq!(t.as_f32().unwrap(), &[want; 4], "call {i}");
                    }
                    comm.core_moves()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(
        moves.iter().sum::<u64>() >= 1,
        "neither rank left the shared core: {moves:?}"
    );
}

#[test]
fn oversubscribed_thread_ranks_settle_evenly_on_the_cores() {
    let cores = allowed_cores();
    if cores.is_empty() {
        eprintln!("skipped: the system does not tell which cores this test may use");
        return;
    }
    // Twice as many ranks as the cores they may use (the mask, cut to a CPU quota): each
    // core is home to two of them.
    let usable = CoreMoves::for_rank(0, 1).cores();
    let size = 2 * usable;
    let group: Vec<usize> = (0..size).collect();
    let comms = InProcessWorld::comms(size, Duration::from_secs(30));
    let placed: Vec<(usize, Vec<u32>)> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .iter()
            .map(|comm| {
                let (group, cores) = (&group, &cores);
                s.spawn(move || {
                    let before = allowed_cores();
                    for i in 0..50 {
                        let mut t =
                            Tensor::from_f32(vec![2], vec![(comm.rank() + i) as f32; 2]).unwrap();
                        comm.all_reduce(group, ReduceOp::Sum, &mut t).unwrap();
                        let want = (size * (size - 1) / 2 + size * i) as f32;
                        assert_eq!(t.as_f32().unwrap(), &[want; 2], "call {i}");
                    }
                    assert_eq!(&before, cores, "a new thread starts unbound");
                    (comm.rank(), allowed_cores())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // Ranks that take turns with each other's compute: no overlap to win.
    assert!(comms.iter().all(|c| !c.overlaps_compute(&group)));
    for (rank, allowed) in placed {
        assert_eq!(
            allowed,
            vec![cores[rank % usable]],
            "rank {rank} of {size} on {cores:?}"
        );
    }
    // A world with a core per rank binds nothing; with a core to spare, collectives
    // overlap compute.
    let comms = InProcessWorld::comms(1, Duration::from_secs(30));
    assert_eq!(comms[0].overlaps_compute(&[0]), usable > 1);
    let mut t = Tensor::from_f32(vec![1], vec![1.0]).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            comms[0].all_reduce(&[0], ReduceOp::Sum, &mut t).unwrap();
            assert_eq!(allowed_cores(), cores);
        });
    });
}
