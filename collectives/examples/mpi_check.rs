//! Runs the shared conformance suite (`shardc_runtime::comm::conformance`) through [`MpiComm`],
//! then every collective on the world and on sub-groups, checking that each result (and each
//! error's kind) equals what an in-process world of the same size computes for this rank. Start it under `mpirun` (feature `mpi`):
//!
//! ```text
//! cargo build -p shardc-collectives --features mpi --example mpi_check
//! mpirun --allow-run-as-root --oversubscribe -n 4 target/debug/examples/mpi_check
//! ```
//!
//! Every rank prints `rank R: N checks passed` and exits 0, or prints the differences and
//! exits 1.

use shardc_collectives::mpi::MpiComm;
use shardc_ir::{DType, ReduceOp, TensorType};
use shardc_runtime::comm::{conformance, CommError, Communicator, InProcessWorld};
use shardc_runtime::tensor::{Data, Tensor};
use std::time::Duration;

/// What one step of the script produced.
#[derive(Debug)]
enum Outcome {
    Tensor(Tensor),
    Error(CommError),
}

/// Deterministic data of `rank` for one step; float values are not exactly representable so
/// that the order of a sum shows in its bits.
fn data(rank: usize, salt: usize, dtype: DType, shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    let f = |i: usize| (((rank * 31 + i * 7 + salt * 13) % 23) as f64) * 0.37 - 3.1;
    let data = match dtype {
        DType::Float32 => Data::F32((0..n).map(|i| f(i) as f32).collect()),
        DType::Float64 => Data::F64((0..n).map(f).collect()),
        DType::Float16 => Data::F16((0..n).map(|i| half::f16::from_f64(f(i))).collect()),
        DType::BFloat16 => Data::BF16((0..n).map(|i| half::bf16::from_f64(f(i))).collect()),
        DType::Int32 => Data::I32((0..n).map(|i| (f(i) * 10.0) as i32).collect()),
        DType::Int64 => Data::I64((0..n).map(|i| (f(i) * 1e6) as i64 * 1_000_003).collect()),
        DType::Bool => Data::Bool((0..n).map(|i| (rank + i + salt) % 3 == 0).collect()),
    };
    Tensor {
        shape: shape.to_vec(),
        data,
    }
}

/// The groups this script uses in a world of `size`, in order.
fn groups(size: usize) -> Vec<Vec<usize>> {
    let mut gs = vec![(0..size).collect::<Vec<_>>()];
    if size >= 2 {
        gs.push(vec![0, 1]);
    }
    if size >= 3 {
        gs.push((0..size).filter(|r| r % 2 == 0).collect());
        gs.push(vec![1, size - 1]);
    }
    if size >= 4 {
        gs.push(vec![0, 2, 3]);
    }
    for r in 0..size {
        gs.push(vec![r]);
    }
    gs.dedup();
    gs
}

/// Runs the script on `comm`, recording every result and error in order.
fn script(comm: &dyn Communicator) -> Vec<(String, Outcome)> {
    let rank = comm.rank();
    let size = comm.size();
    let mut out: Vec<(String, Outcome)> = Vec::new();
    let mut rec = |name: String, r: Result<Tensor, CommError>| {
        out.push((
            name,
            match r {
                Ok(t) => Outcome::Tensor(t),
                Err(e) => Outcome::Error(e),
            },
        ))
    };
    let ops = [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Prod];
    let mut salt = 0;
    for (gi, g) in groups(size).iter().enumerate() {
        if !g.contains(&rank) {
            continue;
        }
        let n = g.len();
        let me = g.iter().position(|&r| r == rank).unwrap_or(0);
        // All-reduce: every reducible dtype and op, small (inline) and large.
        for dtype in [DType::Float32, DType::Float64, DType::Int32, DType::Int64] {
            for op in ops {
                for shape in [vec![3, 5], vec![9000]] {
                    salt += 1;
                    let mut t = data(rank, salt, dtype, &shape);
                    let r = comm.all_reduce(g, op, &mut t).map(|()| t);
                    rec(format!("g{gi} all_reduce {dtype} {op} {shape:?}"), r);
                }
            }
        }
        // NaN propagates through max.
        let mut t = data(rank, 1, DType::Float32, &[4]);
        if me == 0 {
            if let Data::F32(v) = &mut t.data {
                v[1] = f32::NAN;
            }
        }
        let r = comm.all_reduce(g, ReduceOp::Max, &mut t).map(|()| t);
        rec(format!("g{gi} all_reduce max NaN"), r);
        // All-gather on every axis, several dtypes, small and large.
        for dtype in [DType::Float32, DType::Float16, DType::Bool, DType::Int64] {
            for shape in [vec![2, 3, 2], vec![3, 2000]] {
                for axis in 0..shape.len() {
                    salt += 1;
                    let t = data(rank, salt, dtype, &shape);
                    rec(
                        format!("g{gi} all_gather {dtype} {shape:?} axis {axis}"),
                        comm.all_gather(g, axis, &t),
                    );
                }
            }
        }
        // Reduce-scatter on each axis.
        for dtype in [DType::Float32, DType::Int32, DType::Float64] {
            for op in ops {
                for (shape, axis) in [
                    (vec![2 * n, 3], 0),
                    (vec![2, 3 * n], 1),
                    (vec![n * 3000], 0),
                ] {
                    salt += 1;
                    let t = data(rank, salt, dtype, &shape);
                    rec(
                        format!("g{gi} reduce_scatter {dtype} {op} {shape:?} axis {axis}"),
                        comm.reduce_scatter(g, op, axis, &t),
                    );
                }
            }
        }
        // All-to-all.
        for dtype in [DType::Float32, DType::BFloat16, DType::Bool, DType::Int32] {
            for (shape, split, concat) in [
                (vec![2 * n, 3], 0, 1),
                (vec![3, 2 * n], 1, 0),
                (vec![n, 2, 3], 0, 0),
                (vec![4, 1000 * n], 1, 1),
            ] {
                salt += 1;
                let t = data(rank, salt, dtype, &shape);
                rec(
                    format!("g{gi} all_to_all {dtype} {shape:?} {split}->{concat}"),
                    comm.all_to_all(g, split, concat, &t),
                );
            }
        }
        // Broadcast from every member, small and large.
        for &root in g {
            for (dtype, shape) in [
                (DType::Float32, vec![2, 3]),
                (DType::Bool, vec![7]),
                (DType::Float64, vec![5000]),
                (DType::Bool, vec![20000]),
            ] {
                salt += 1;
                let mut t = data(rank, salt, dtype, &shape);
                let r = comm.broadcast(g, root, &mut t).map(|()| t);
                rec(format!("g{gi} broadcast {dtype} {shape:?} root {root}"), r);
            }
        }
        let r = comm.barrier(g).map(|()| Tensor::scalar_f32(0.0));
        rec(format!("g{gi} barrier"), r);
        // Errors every member reports, after which the group still works.
        let t = data(rank, 0, DType::Float32, &[2, 3]);
        rec(
            format!("g{gi} all_gather axis 5"),
            comm.all_gather(g, 5, &t),
        );
        let mut b = data(rank, 0, DType::Bool, &[4]);
        let r = comm.all_reduce(g, ReduceOp::Sum, &mut b).map(|()| b);
        rec(format!("g{gi} all_reduce Bool"), r);
        let mut t = data(rank, 0, DType::Float32, &[2]);
        let outside = (0..size).find(|r| !g.contains(r)).unwrap_or(size + 5);
        let r = comm.broadcast(g, outside, &mut t).map(|()| t);
        rec(format!("g{gi} broadcast root outside"), r);
        if n > 1 {
            let t = data(rank, 0, DType::Float32, &[n + 1, 2]);
            rec(
                format!("g{gi} reduce_scatter not divisible"),
                comm.reduce_scatter(g, ReduceOp::Sum, 0, &t),
            );
            let shape = if me == 0 { vec![2] } else { vec![3] };
            let mut t = data(rank, 0, DType::Float32, &shape);
            let r = comm.all_reduce(g, ReduceOp::Sum, &mut t).map(|()| t);
            rec(format!("g{gi} all_reduce shape mismatch"), r);
            let axis = if me == 0 { 0 } else { 1 };
            let t = data(rank, 0, DType::Float32, &[2, 2]);
            rec(
                format!("g{gi} all_gather axis mismatch"),
                comm.all_gather(g, axis, &t),
            );
        }
        let mut t = data(rank, 99, DType::Float32, &[3]);
        let r = comm.all_reduce(g, ReduceOp::Sum, &mut t).map(|()| t);
        rec(format!("g{gi} all_reduce after errors"), r);
    }
    // A malformed group fails at once, locally.
    if size >= 2 {
        let t = data(rank, 0, DType::Float32, &[2]);
        rec("unsorted group".into(), comm.all_gather(&[1, 0], 0, &t));
    }
    // Point-to-point around a ring: two tags received out of order, a large message, a
    // message to itself, then a receive with the wrong type.
    let next = (rank + 1) % size;
    let prev = (rank + size - 1) % size;
    let sends = [
        (7, data(rank, 1, DType::Float32, &[3])),
        (-3, data(rank, 2, DType::Int64, &[2, 2])),
        (7, data(rank, 3, DType::Float32, &[3])),
        (1 << 40, data(rank, 4, DType::Float64, &[20000])),
        (5, data(rank, 5, DType::Bool, &[5])),
    ];
    for (tag, t) in &sends {
        if let Err(e) = comm.send(next, *tag, t) {
            rec(format!("send tag {tag}"), Err(e));
        }
    }
    for (tag, ty) in [
        (1i64 << 40, TensorType::new(DType::Float64, vec![20000])),
        (-3, TensorType::new(DType::Int64, vec![2, 2])),
        (7, TensorType::new(DType::Float32, vec![3])),
        (7, TensorType::new(DType::Float32, vec![3])),
        (5, TensorType::new(DType::Float32, vec![5])),
    ] {
        rec(
            format!("recv from {prev} tag {tag}"),
            comm.recv(prev, tag, &ty),
        );
    }
    let me_t = data(rank, 6, DType::Int32, &[4]);
    if let Err(e) = comm.send(rank, 11, &me_t) {
        rec("send to self".into(), Err(e));
    }
    rec(
        "recv from self".into(),
        comm.recv(rank, 11, &TensorType::new(DType::Int32, vec![4])),
    );
    rec(
        "send outside".into(),
        comm.send(size, 0, &me_t).map(|()| me_t.clone()),
    );
    let r = comm.barrier(&(0..size).collect::<Vec<_>>());
    rec("final barrier".into(), r.map(|()| Tensor::scalar_f32(0.0)));
    out
}

/// Bit-exact equality of two tensors (NaN equals NaN of the same bits).
fn same_bits(a: &Tensor, b: &Tensor) -> bool {
    if a.shape != b.shape || a.dtype() != b.dtype() {
        return false;
    }
    match (&a.data, &b.data) {
        (Data::F32(x), Data::F32(y)) => x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits()),
        (Data::F64(x), Data::F64(y)) => x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits()),
        (Data::F16(x), Data::F16(y)) => x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits()),
        (Data::BF16(x), Data::BF16(y)) => x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits()),
        _ => a.data == b.data,
    }
}

/// Whether two errors agree: same kind, collective and group; the same reason where the
/// reason does not depend on which member detected the error.
fn same_error(a: &CommError, b: &CommError) -> bool {
    match (a, b) {
        (
            CommError::InvalidGroup {
                collective: c1,
                group: g1,
                reason: r1,
                ..
            },
            CommError::InvalidGroup {
                collective: c2,
                group: g2,
                reason: r2,
                ..
            },
        )
        | (
            CommError::InvalidArgument {
                collective: c1,
                group: g1,
                reason: r1,
                ..
            },
            CommError::InvalidArgument {
                collective: c2,
                group: g2,
                reason: r2,
                ..
            },
        ) => c1 == c2 && g1 == g2 && r1 == r2,
        (
            CommError::Mismatch {
                collective: c1,
                group: g1,
                ..
            },
            CommError::Mismatch {
                collective: c2,
                group: g2,
                ..
            },
        ) => c1 == c2 && g1 == g2,
        _ => false,
    }
}

fn main() {
    let comm = match MpiComm::init_with_timeout(Duration::from_secs(120)) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("mpi_check: {e}");
            std::process::exit(2);
        }
    };
    let rank = comm.rank();
    let size = comm.size();
    // The shared conformance suite first (values computed independently), then this
    // example's script against an in-process world.
    let conformance = conformance::run(&comm);
    let got = script(&comm);
    // The same script on an in-process world of the same size; keep this rank's outcomes.
    let world = InProcessWorld::comms(size, Duration::from_secs(120));
    let mut expected = Vec::new();
    std::thread::scope(|s| {
        let handles: Vec<_> = world.iter().map(|c| s.spawn(move || script(c))).collect();
        for (r, h) in handles.into_iter().enumerate() {
            match h.join() {
                Ok(v) if r == rank => expected = v,
                Ok(_) => {}
                Err(_) => eprintln!("rank {rank}: in-process rank {r} panicked"),
            }
        }
    });
    let mut failures = Vec::new();
    let conformance_checks = match conformance {
        Ok(n) => n,
        Err(e) => {
            failures.push(format!("conformance suite: {e}"));
            0
        }
    };
    if got.len() != expected.len() {
        failures.push(format!(
            "{} outcomes through MPI but {} in process",
            got.len(),
            expected.len()
        ));
    }
    for ((name, g), (_, e)) in got.iter().zip(&expected) {
        let ok = match (g, e) {
            (Outcome::Tensor(a), Outcome::Tensor(b)) => same_bits(a, b),
            (Outcome::Error(a), Outcome::Error(b)) => same_error(a, b),
            _ => false,
        };
        if !ok {
            failures.push(format!("{name}: MPI gave {g:?}\n    in process: {e:?}"));
        }
    }
    let checks = got.len() + conformance_checks;
    drop(comm);
    if failures.is_empty() {
        println!("rank {rank}: {checks} checks passed (world of {size})");
    } else {
        for f in failures.iter().take(20) {
            eprintln!("rank {rank}: FAILED {f}");
        }
        eprintln!("rank {rank}: {} of {checks} checks failed", failures.len());
        std::process::exit(1);
    }
}
