//! A conformance suite every [`Communicator`] must pass: every collective on the world and
//! on sub-groups, every reducible dtype and reduction, small and large tensors, tagged
//! send/receive out of order, and a disagreement that every member must see, with results
//! compared bit for bit against values computed here independently (reductions in member
//! order, as the trait requires).
//!
//! Call [`run`] from every rank of a world at the same time (threads of one process, or one
//! call per process); each call checks its own rank's results and returns how many checks it
//! made. The data are a deterministic function of (case, member, element), with magnitudes
//! spread over six decades so that a floating-point sum in another order gives other bits.

use super::{CommError, Communicator};
use crate::tensor::{Data, Tensor};
use shardc_ir::{DType, ReduceOp, TensorType};

/// The number of elements of the "large" tensors: big enough (1.2 MB in f32) for pipelined
/// and chunked algorithms, and not a multiple of any power of two above 4 so chunk tails are
/// exercised.
pub const LARGE: usize = 300_004;

/// Runs the suite on `comm` (call it on every rank at once). Returns the number of checks
/// made on this rank, or the first failure: which check, on which group, and what differed.
pub fn run(comm: &dyn Communicator) -> Result<usize, String> {
    let mut s = Suite { comm, checks: 0 };
    for group in groups(comm.size()) {
        if group.contains(&comm.rank()) {
            s.group(&group)?;
        }
    }
    s.send_recv()?;
    s.errors()?;
    let world: Vec<usize> = (0..comm.size()).collect();
    s.comm
        .barrier(&world)
        .map_err(|e| format!("final barrier: {e}"))?;
    Ok(s.checks + 1)
}

/// The groups the suite uses for a world of `n`: the world, the even ranks, the odd ranks,
/// the first half, the ends `{0, n-1}`, the last three, and every singleton (deduplicated, in
/// a fixed order so every rank makes its calls in the same order).
pub fn groups(n: usize) -> Vec<Vec<usize>> {
    let mut out: Vec<Vec<usize>> = vec![(0..n).collect()];
    out.push((0..n).step_by(2).collect());
    out.push((1..n).step_by(2).collect());
    out.push((0..n.div_ceil(2)).collect());
    out.push(vec![0, n.saturating_sub(1)]);
    out.push((n.saturating_sub(3)..n).collect());
    out.extend((0..n).map(|r| vec![r]));
    let mut seen = Vec::new();
    out.retain(|g| {
        let mut g2 = g.clone();
        g2.dedup();
        if g2.is_empty() || g2.len() != g.len() || seen.contains(g) {
            return false;
        }
        seen.push(g.clone());
        true
    });
    out
}

/// A deterministic value for element `i` of member `m`'s tensor in case `case`: an integer
/// in -1000..=1000 times a power of ten in 1e-3..=1e3.
fn value(case: u64, m: usize, i: usize) -> f64 {
    let mut h = case
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add((m as u64).wrapping_mul(0xC2B2_AE3D_27D4_EB4F))
        .wrapping_add((i as u64).wrapping_mul(0x1656_67B1_9E37_79F9));
    h ^= h >> 29;
    h = h.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    h ^= h >> 32;
    let k = (h % 2001) as f64 - 1000.0;
    let e = ((h >> 16) % 7) as i32 - 3;
    k * 10f64.powi(e)
}

/// Member `m`'s tensor of `shape` and `dtype` in case `case`. For products the values stay
/// near one (floats) or small (integers) so that nothing overflows to infinity.
fn tensor(case: u64, m: usize, shape: &[usize], dtype: DType, for_prod: bool) -> Tensor {
    let n: usize = shape.iter().product();
    let v = |i: usize| {
        let x = value(case, m, i);
        if for_prod {
            1.0 + (x.abs() % 1.0) * 0.25
        } else {
            x
        }
    };
    let iv = |i: usize| {
        let x = value(case, m, i);
        if for_prod {
            (x.abs() as i64 % 5) - 2
        } else {
            (x * 1000.0).round() as i64
        }
    };
    let data = match dtype {
        DType::Float32 => Data::F32((0..n).map(|i| v(i) as f32).collect()),
        DType::Float64 => Data::F64((0..n).map(v).collect()),
        DType::Int32 => Data::I32((0..n).map(|i| iv(i) as i32).collect()),
        DType::Int64 => Data::I64((0..n).map(iv).collect()),
        DType::Bool => Data::Bool((0..n).map(|i| iv(i) % 2 == 0).collect()),
        _ => Data::F32((0..n).map(|i| v(i) as f32).collect()),
    };
    Tensor {
        shape: shape.to_vec(),
        data,
    }
}

/// `acc op x`, elementwise, as the trait defines it (wrapping integers; NaN wins max/min).
fn combine(acc: &mut Tensor, x: &Tensor, op: ReduceOp) {
    fn f<T: Copy + PartialOrd>(
        a: &mut [T],
        b: &[T],
        add: fn(T, T) -> T,
        mul: fn(T, T) -> T,
        op: ReduceOp,
    ) {
        for (a, &b) in a.iter_mut().zip(b) {
            *a = match op {
                ReduceOp::Sum => add(*a, b),
                ReduceOp::Prod => mul(*a, b),
                ReduceOp::Max => {
                    if b > *a {
                        b
                    } else {
                        *a
                    }
                }
                ReduceOp::Min => {
                    if b < *a {
                        b
                    } else {
                        *a
                    }
                }
            };
        }
    }
    match (&mut acc.data, &x.data) {
        (Data::F32(a), Data::F32(b)) => f(a, b, |x, y| x + y, |x, y| x * y, op),
        (Data::F64(a), Data::F64(b)) => f(a, b, |x, y| x + y, |x, y| x * y, op),
        (Data::I32(a), Data::I32(b)) => f(a, b, i32::wrapping_add, i32::wrapping_mul, op),
        (Data::I64(a), Data::I64(b)) => f(a, b, i64::wrapping_add, i64::wrapping_mul, op),
        _ => {}
    }
}

/// The row-major block of `t` whose `axis` index is in `start..start + len`.
fn slice_axis(t: &Tensor, axis: usize, start: usize, len: usize) -> Tensor {
    let ranges: Vec<std::ops::Range<usize>> = t
        .shape
        .iter()
        .enumerate()
        .map(|(d, &n)| if d == axis { start..start + len } else { 0..n })
        .collect();
    t.block(&ranges).unwrap_or_else(|| t.clone())
}

/// Concatenation along `axis` (tensors of one dtype and equal other dims).
fn concat(ts: &[Tensor], axis: usize) -> Tensor {
    let mut shape = ts[0].shape.clone();
    shape[axis] = ts.iter().map(|t| t.shape[axis]).sum();
    let n: usize = shape.iter().product();
    let mut out = Tensor {
        shape: shape.clone(),
        data: Data::zeros(ts[0].dtype(), n),
    };
    let mut start = 0;
    for t in ts {
        let ranges: Vec<std::ops::Range<usize>> = shape
            .iter()
            .enumerate()
            .map(|(d, &k)| {
                if d == axis {
                    start..start + t.shape[axis]
                } else {
                    0..k
                }
            })
            .collect();
        out.set_block(&ranges, t);
        start += t.shape[axis];
    }
    out
}

/// Whether two tensors are equal bit for bit (shape, dtype and every element's bits).
fn identical(a: &Tensor, b: &Tensor) -> bool {
    if a.shape != b.shape {
        return false;
    }
    match (&a.data, &b.data) {
        (Data::F32(x), Data::F32(y)) => x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits()),
        (Data::F64(x), Data::F64(y)) => x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits()),
        (Data::I32(x), Data::I32(y)) => x == y,
        (Data::I64(x), Data::I64(y)) => x == y,
        (Data::Bool(x), Data::Bool(y)) => x == y,
        (Data::F16(x), Data::F16(y)) => x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits()),
        (Data::BF16(x), Data::BF16(y)) => x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits()),
        _ => false,
    }
}

/// Where two tensors first differ, for a failure message.
fn first_difference(got: &Tensor, want: &Tensor) -> String {
    if got.shape != want.shape || got.dtype() != want.dtype() {
        return format!("got {} but expected {}", got.ty(), want.ty());
    }
    for i in 0..got.len() {
        let (g, w) = (got.data.get_f64(i), want.data.get_f64(i));
        if g.to_bits() != w.to_bits() {
            return format!("element {i}: got {g:e}, expected {w:e}");
        }
    }
    "the bits differ".into()
}

struct Suite<'a> {
    comm: &'a dyn Communicator,
    checks: usize,
}

impl Suite<'_> {
    fn me(&self, group: &[usize]) -> usize {
        group
            .iter()
            .position(|&r| r == self.comm.rank())
            .unwrap_or(0)
    }

    fn expect(
        &mut self,
        what: &str,
        group: &[usize],
        got: Result<Tensor, CommError>,
        want: &Tensor,
    ) -> Result<(), String> {
        let rank = self.comm.rank();
        let got = got.map_err(|e| format!("rank {rank}: {what} on group {group:?} failed: {e}"))?;
        if !identical(&got, want) {
            return Err(format!(
                "rank {rank}: {what} on group {group:?}: {}",
                first_difference(&got, want)
            ));
        }
        self.checks += 1;
        Ok(())
    }

    fn group(&mut self, group: &[usize]) -> Result<(), String> {
        let n = group.len();
        let me = self.me(group);
        let gid = group
            .iter()
            .fold(17u64, |h, &r| h.wrapping_mul(31).wrapping_add(r as u64));
        let mut case = gid.wrapping_mul(1000);
        let mut next = || {
            case += 1;
            case
        };
        // AllReduce: every reducible dtype and op, small and odd-sized; large (split into uneven
        // ranges over the members) in f32 sum, f64 max and i64 sum.
        let mut shapes: Vec<(Vec<usize>, DType, ReduceOp)> = Vec::new();
        for dtype in [DType::Float32, DType::Float64, DType::Int32, DType::Int64] {
            for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Prod] {
                shapes.push((vec![3, 5], dtype, op));
            }
        }
        shapes.push((vec![1], DType::Float32, ReduceOp::Sum));
        shapes.push((vec![1027], DType::Float32, ReduceOp::Sum));
        shapes.push((vec![LARGE], DType::Float32, ReduceOp::Sum));
        shapes.push((vec![LARGE / 4], DType::Float64, ReduceOp::Max));
        shapes.push((vec![LARGE / 4 + 3], DType::Int64, ReduceOp::Sum));
        for (shape, dtype, op) in shapes {
            let c = next();
            let prod = op == ReduceOp::Prod;
            let mut want = tensor(c, 0, &shape, dtype, prod);
            for m in 1..n {
                combine(&mut want, &tensor(c, m, &shape, dtype, prod), op);
            }
            let mut t = tensor(c, me, &shape, dtype, prod);
            let r = self.comm.all_reduce(group, op, &mut t).map(|()| t);
            self.expect(
                &format!("AllReduce {op} of {dtype:?} {shape:?}"),
                group,
                r,
                &want,
            )?;
        }
        // AllGather on every axis, every dtype it moves; large.
        for (shape, axis, dtype) in [
            (vec![2, 3, 4], 0, DType::Float32),
            (vec![2, 3, 4], 1, DType::Int64),
            (vec![2, 3, 4], 2, DType::Bool),
            (vec![LARGE / 4], 0, DType::Float32),
        ] {
            let c = next();
            let parts: Vec<Tensor> = (0..n).map(|m| tensor(c, m, &shape, dtype, false)).collect();
            let want = concat(&parts, axis);
            let got = self.comm.all_gather(group, axis, &parts[me]);
            self.expect(
                &format!("AllGather axis {axis} of {dtype:?} {shape:?}"),
                group,
                got,
                &want,
            )?;
        }
        // ReduceScatter on axes 0 and 1; large.
        for (per, axis, dtype, op) in [
            (vec![2, 3], 0, DType::Float32, ReduceOp::Sum),
            (vec![3, 2], 1, DType::Float64, ReduceOp::Sum),
            (vec![2, 2], 0, DType::Int32, ReduceOp::Max),
            (vec![LARGE / 4], 0, DType::Float32, ReduceOp::Sum),
        ] {
            let mut shape = per.clone();
            shape[axis] *= n;
            let c = next();
            let mut full = tensor(c, 0, &shape, dtype, false);
            for m in 1..n {
                combine(&mut full, &tensor(c, m, &shape, dtype, false), op);
            }
            let want = slice_axis(&full, axis, me * per[axis], per[axis]);
            let got =
                self.comm
                    .reduce_scatter(group, op, axis, &tensor(c, me, &shape, dtype, false));
            self.expect(
                &format!("ReduceScatter {op} axis {axis} of {dtype:?} {shape:?}"),
                group,
                got,
                &want,
            )?;
        }
        // AllToAll: split one axis, concatenate another (or the same).
        for (split, concat_dim, dtype) in [
            (0, 1, DType::Float32),
            (1, 0, DType::Int32),
            (0, 0, DType::Float64),
        ] {
            let mut shape = vec![2, 3];
            shape[split] *= n;
            let c = next();
            let inputs: Vec<Tensor> = (0..n).map(|m| tensor(c, m, &shape, dtype, false)).collect();
            let per = shape[split] / n;
            let mine: Vec<Tensor> = inputs
                .iter()
                .map(|t| slice_axis(t, split, me * per, per))
                .collect();
            let want = concat(&mine, concat_dim);
            let got = self.comm.all_to_all(group, split, concat_dim, &inputs[me]);
            self.expect(
                &format!("AlltoAll split {split} concat {concat_dim} of {dtype:?}"),
                group,
                got,
                &want,
            )?;
        }
        // Broadcast from every member; one large.
        for (k, &root) in group.iter().enumerate() {
            let c = next();
            let len = if k == 0 { 4099 } else { 7 };
            let want = tensor(c, k, &[len], DType::Float32, false);
            let mut t = if root == self.comm.rank() {
                want.clone()
            } else {
                tensor(c, 99, &[len], DType::Float32, false)
            };
            let r = self.comm.broadcast(group, root, &mut t).map(|()| t);
            self.expect(&format!("Broadcast from rank {root}"), group, r, &want)?;
        }
        self.comm.barrier(group).map_err(|e| {
            format!(
                "rank {}: Barrier on group {group:?} failed: {e}",
                self.comm.rank()
            )
        })?;
        self.checks += 1;
        Ok(())
    }

    /// A ring of sends and receives, two tags received in the opposite order of sending.
    fn send_recv(&mut self) -> Result<(), String> {
        let (rank, n) = (self.comm.rank(), self.comm.size());
        if n < 2 {
            return Ok(());
        }
        let to = (rank + 1) % n;
        let from = (rank + n - 1) % n;
        let shape = [5, 2];
        let ty = TensorType::new(DType::Float32, shape.to_vec());
        for tag in [7i64, -3, 7] {
            let t = tensor(
                (1_000_000 + tag) as u64,
                rank,
                &shape,
                DType::Float32,
                false,
            );
            self.comm
                .send(to, tag, &t)
                .map_err(|e| format!("rank {rank}: Send to {to} tag {tag} failed: {e}"))?;
        }
        let pair = [from.min(rank), from.max(rank)];
        for tag in [-3i64, 7, 7] {
            let want = tensor(
                (1_000_000 + tag) as u64,
                from,
                &shape,
                DType::Float32,
                false,
            );
            let got = self.comm.recv(from, tag, &ty);
            self.expect(&format!("Receive from {from} tag {tag}"), &pair, got, &want)?;
        }
        Ok(())
    }

    /// Errors: a group without the caller fails at once, locally; members that disagree on a
    /// shape all get `Mismatch`, and the group stays usable afterwards.
    fn errors(&mut self) -> Result<(), String> {
        let (rank, n) = (self.comm.rank(), self.comm.size());
        let world: Vec<usize> = (0..n).collect();
        if n >= 2 {
            let other = [(rank + 1) % n];
            let mut t = tensor(5, rank, &[2], DType::Float32, false);
            match self.comm.all_reduce(&other, ReduceOp::Sum, &mut t) {
                Err(CommError::InvalidGroup { .. }) => self.checks += 1,
                r => return Err(format!("rank {rank}: AllReduce on a group without the caller gave {r:?}, expected InvalidGroup")),
            }
            let shape = if rank == n - 1 { vec![3] } else { vec![2] };
            let t = tensor(6, rank, &shape, DType::Float32, false);
            match self.comm.all_gather(&world, 0, &t) {
                Err(CommError::Mismatch { .. }) => self.checks += 1,
                r => return Err(format!(
                    "rank {rank}: AllGather where rank {} has another shape gave {r:?}, expected Mismatch",
                    n - 1
                )),
            }
        }
        // Still usable.
        let c = 77;
        let mut want = tensor(c, 0, &[9], DType::Float32, false);
        for m in 1..n {
            combine(
                &mut want,
                &tensor(c, m, &[9], DType::Float32, false),
                ReduceOp::Sum,
            );
        }
        let mut t = tensor(c, rank, &[9], DType::Float32, false);
        let r = self
            .comm
            .all_reduce(&world, ReduceOp::Sum, &mut t)
            .map(|()| t);
        self.expect("AllReduce after a disagreement", &world, r, &want)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::InProcessWorld;

    #[test]
    fn groups_are_distinct_and_sorted() {
        for n in 1..9 {
            let gs = groups(n);
            assert!(gs
                .iter()
                .all(|g| !g.is_empty() && g.windows(2).all(|w| w[0] < w[1])));
            assert!(gs.iter().all(|g| g.iter().all(|&r| r < n)));
            for (i, g) in gs.iter().enumerate() {
                assert!(!gs[..i].contains(g));
            }
        }
    }

    #[test]
    fn the_in_process_world_conforms() {
        for n in [1, 2, 3, 4] {
            let comms = InProcessWorld::new(n);
            let results: Vec<Result<usize, String>> = std::thread::scope(|s| {
                let hs: Vec<_> = comms
                    .iter()
                    .map(|c| s.spawn(move || run(c.as_ref())))
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            for r in results {
                assert!(r.as_ref().is_ok_and(|&k| k > 20), "world of {n}: {r:?}");
            }
        }
    }

    #[test]
    fn float_sums_depend_on_order_for_these_data() {
        // The suite's data must catch a reduction in another order.
        let shape = [4096];
        let ts: Vec<Tensor> = (0..4)
            .map(|m| tensor(1, m, &shape, DType::Float32, false))
            .collect();
        let mut fwd = ts[0].clone();
        for t in &ts[1..] {
            combine(&mut fwd, t, ReduceOp::Sum);
        }
        let mut rev = ts[3].clone();
        for t in ts[..3].iter().rev() {
            combine(&mut rev, t, ReduceOp::Sum);
        }
        assert!(!identical(&fwd, &rev));
    }
}
