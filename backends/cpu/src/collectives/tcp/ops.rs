//! The tensor arithmetic of the TCP collectives: the same splitting, concatenation and
//! member-order reductions as the in-process world, so that results are bit-identical.

use shardc_ir::ReduceOp;
use shardc_runtime::tensor::Data;
use std::ops::Range;

pub(super) use shardc_runtime::comm::tensor_ops::{concat_axis, part_axis, reducible};

fn reduce_float<T: Copy + PartialOrd + std::ops::Add<Output = T> + std::ops::Mul<Output = T>>(
    acc: &mut [T],
    x: &[T],
    op: ReduceOp,
) {
    match op {
        ReduceOp::Sum => acc.iter_mut().zip(x).for_each(|(a, &b)| *a = *a + b),
        ReduceOp::Prod => acc.iter_mut().zip(x).for_each(|(a, &b)| *a = *a * b),
        // NaN propagates: a NaN on either side wins (as in the in-process world).
        ReduceOp::Max => acc.iter_mut().zip(x).for_each(|(a, &b)| {
            if b > *a || b.partial_cmp(&b).is_none() {
                *a = b
            }
        }),
        ReduceOp::Min => acc.iter_mut().zip(x).for_each(|(a, &b)| {
            if b < *a || b.partial_cmp(&b).is_none() {
                *a = b
            }
        }),
    }
}

macro_rules! reduce_int {
    ($name:ident, $t:ty) => {
        fn $name(acc: &mut [$t], x: &[$t], op: ReduceOp) {
            match op {
                ReduceOp::Sum => acc
                    .iter_mut()
                    .zip(x)
                    .for_each(|(a, &b)| *a = a.wrapping_add(b)),
                ReduceOp::Prod => acc
                    .iter_mut()
                    .zip(x)
                    .for_each(|(a, &b)| *a = a.wrapping_mul(b)),
                ReduceOp::Max => acc.iter_mut().zip(x).for_each(|(a, &b)| *a = (*a).max(b)),
                ReduceOp::Min => acc.iter_mut().zip(x).for_each(|(a, &b)| *a = (*a).min(b)),
            }
        }
    };
}

reduce_int!(reduce_i32, i32);
reduce_int!(reduce_i64, i64);

/// `acc = acc op x` elementwise (same reducible dtype and length; checked by the caller).
pub(super) fn reduce_into(acc: &mut Data, x: &Data, op: ReduceOp) {
    match (acc, x) {
        (Data::F32(a), Data::F32(b)) => reduce_float(a, b, op),
        (Data::F64(a), Data::F64(b)) => reduce_float(a, b, op),
        (Data::I32(a), Data::I32(b)) => reduce_i32(a, b, op),
        (Data::I64(a), Data::I64(b)) => reduce_i64(a, b, op),
        _ => {}
    }
}

/// `acc = acc op x[start..start + acc.len()]` elementwise (same reducible dtype, in range;
/// checked by the caller).
pub(super) fn reduce_from(acc: &mut Data, x: &Data, start: usize, op: ReduceOp) {
    let n = acc.len();
    match (acc, x) {
        (Data::F32(a), Data::F32(b)) => reduce_float(a, &b[start..start + n], op),
        (Data::F64(a), Data::F64(b)) => reduce_float(a, &b[start..start + n], op),
        (Data::I32(a), Data::I32(b)) => reduce_i32(a, &b[start..start + n], op),
        (Data::I64(a), Data::I64(b)) => reduce_i64(a, &b[start..start + n], op),
        _ => {}
    }
}

/// `dst[start..start + x.len()] op= x` elementwise (same reducible dtype, in range; checked
/// by the caller).
pub(super) fn reduce_at(dst: &mut Data, start: usize, x: &Data, op: ReduceOp) {
    let n = x.len();
    match (dst, x) {
        (Data::F32(a), Data::F32(b)) => reduce_float(&mut a[start..start + n], b, op),
        (Data::F64(a), Data::F64(b)) => reduce_float(&mut a[start..start + n], b, op),
        (Data::I32(a), Data::I32(b)) => reduce_i32(&mut a[start..start + n], b, op),
        (Data::I64(a), Data::I64(b)) => reduce_i64(&mut a[start..start + n], b, op),
        _ => {}
    }
}

/// Copies `src` into `dst` from element `start` on (same dtype, in range; checked by the
/// caller).
pub(super) fn write_range(dst: &mut Data, start: usize, src: &Data) {
    let n = src.len();
    match (dst, src) {
        (Data::F32(d), Data::F32(s)) => d[start..start + n].copy_from_slice(s),
        (Data::F64(d), Data::F64(s)) => d[start..start + n].copy_from_slice(s),
        (Data::F16(d), Data::F16(s)) => d[start..start + n].copy_from_slice(s),
        (Data::BF16(d), Data::BF16(s)) => d[start..start + n].copy_from_slice(s),
        (Data::I32(d), Data::I32(s)) => d[start..start + n].copy_from_slice(s),
        (Data::I64(d), Data::I64(s)) => d[start..start + n].copy_from_slice(s),
        (Data::Bool(d), Data::Bool(s)) => d[start..start + n].copy_from_slice(s),
        _ => {}
    }
}

/// The `k`-th of `parts` contiguous ranges that partition `0..len` (the first `len % parts`
/// ranges hold one element more).
pub(super) fn chunk(len: usize, parts: usize, k: usize) -> Range<usize> {
    let base = len / parts;
    let extra = len % parts;
    let start = k * base + k.min(extra);
    start..start + base + usize::from(k < extra)
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardc_runtime::tensor::Tensor;

    #[test]
    fn chunks_partition() {
        for len in [0, 1, 5, 16, 17] {
            for parts in 1..6 {
                let mut next = 0;
                for k in 0..parts {
                    let r = chunk(len, parts, k);
                    assert_eq!(r.start, next);
                    next = r.end;
                }
                assert_eq!(next, len);
            }
        }
    }

    #[test]
    fn split_and_concat_are_inverse() {
        let x = Tensor::from_f32(vec![2, 4], (0..8).map(|i| i as f32).collect()).unwrap();
        let parts: Vec<Tensor> = (0..2).map(|k| part_axis(&x, 1, 2, k)).collect();
        assert_eq!(parts[1].as_f32().unwrap(), &[2., 3., 6., 7.]);
        let refs: Vec<&Tensor> = parts.iter().collect();
        assert_eq!(concat_axis(&refs, 1), x);
    }

    #[test]
    fn reductions_match_the_in_process_rules() {
        let mut a = Data::F32(vec![1., 5., f32::NAN]);
        reduce_into(&mut a, &Data::F32(vec![4., 2., 0.]), ReduceOp::Max);
        let Data::F32(v) = &a else { panic!() };
        assert_eq!(&v[..2], &[4., 5.]);
        assert!(v[2].is_nan());
        let mut acc = Data::F64(vec![1.0, 2.0]);
        reduce_from(
            &mut acc,
            &Data::F64(vec![9.0, 10.0, 20.0]),
            1,
            ReduceOp::Sum,
        );
        assert_eq!(acc, Data::F64(vec![11.0, 22.0]));
        reduce_at(&mut acc, 1, &Data::F64(vec![3.0]), ReduceOp::Prod);
        assert_eq!(acc, Data::F64(vec![11.0, 66.0]));
        let mut i = Data::I32(vec![i32::MAX]);
        reduce_into(&mut i, &Data::I32(vec![1]), ReduceOp::Sum);
        assert_eq!(i, Data::I32(vec![i32::MIN]));
    }
}
