//! The tensor arithmetic of the collectives, shared by every communicator (the in-process
//! world, and the process communicators of the CPU backend): splitting and concatenating along
//! an axis (any dtype) and reducing in member order (numeric dtypes). Callers check shapes,
//! axes and divisibility first.

use crate::tensor::{Data, Tensor};
use shardc_ir::{DType, ReduceOp};

/// `(outer, dim, inner)` of `shape` around `axis`: the row-major view `[outer, dim, inner]`.
fn around(shape: &[usize], axis: usize) -> (usize, usize, usize) {
    let outer = shape[..axis].iter().product();
    let inner = shape[axis + 1..].iter().product();
    (outer, shape[axis], inner)
}

fn split_vec<T: Copy>(
    v: &[T],
    outer: usize,
    dim: usize,
    inner: usize,
    parts: usize,
) -> Vec<Vec<T>> {
    let part = dim / parts;
    let row = dim * inner;
    (0..parts)
        .map(|k| {
            let mut out = Vec::with_capacity(outer * part * inner);
            for o in 0..outer {
                let start = o * row + k * part * inner;
                out.extend_from_slice(&v[start..start + part * inner]);
            }
            out
        })
        .collect()
}

/// Splits `t` along `axis` into `parts` equal parts (`parts` divides the dim; checked by the
/// caller).
pub fn split_axis(t: &Tensor, axis: usize, parts: usize) -> Vec<Tensor> {
    let (outer, dim, inner) = around(&t.shape, axis);
    let mut shape = t.shape.clone();
    shape[axis] = dim / parts;
    let mut out: Vec<Tensor> = Vec::with_capacity(parts);
    macro_rules! go {
        ($variant:ident, $v:expr) => {
            for p in split_vec($v, outer, dim, inner, parts) {
                out.push(Tensor {
                    shape: shape.clone(),
                    data: Data::$variant(p),
                });
            }
        };
    }
    match &t.data {
        Data::F32(v) => go!(F32, v),
        Data::F64(v) => go!(F64, v),
        Data::F16(v) => go!(F16, v),
        Data::BF16(v) => go!(BF16, v),
        Data::I32(v) => go!(I32, v),
        Data::I64(v) => go!(I64, v),
        Data::Bool(v) => go!(Bool, v),
    }
    out
}

/// Concatenates tensors of one shape and dtype along `axis`, in order (checked by the
/// caller; `ts` is not empty).
pub fn concat_axis(ts: &[&Tensor], axis: usize) -> Tensor {
    let first = ts[0];
    let (outer, dim, inner) = around(&first.shape, axis);
    let mut shape = first.shape.clone();
    shape[axis] = dim * ts.len();
    let chunk = dim * inner;
    macro_rules! go {
        ($variant:ident) => {{
            let srcs: Vec<&[_]> = ts
                .iter()
                .filter_map(|t| match &t.data {
                    Data::$variant(v) => Some(v.as_slice()),
                    _ => None,
                })
                .collect();
            let mut out = Vec::with_capacity(outer * chunk * srcs.len());
            for o in 0..outer {
                for s in &srcs {
                    out.extend_from_slice(&s[o * chunk..(o + 1) * chunk]);
                }
            }
            Data::$variant(out)
        }};
    }
    let data = match &first.data {
        Data::F32(_) => go!(F32),
        Data::F64(_) => go!(F64),
        Data::F16(_) => go!(F16),
        Data::BF16(_) => go!(BF16),
        Data::I32(_) => go!(I32),
        Data::I64(_) => go!(I64),
        Data::Bool(_) => go!(Bool),
    };
    Tensor { shape, data }
}

fn reduce_vec<T: Copy + PartialOrd + std::ops::Add<Output = T> + std::ops::Mul<Output = T>>(
    acc: &mut [T],
    x: &[T],
    op: ReduceOp,
) {
    match op {
        ReduceOp::Sum => acc.iter_mut().zip(x).for_each(|(a, &b)| *a = *a + b),
        ReduceOp::Prod => acc.iter_mut().zip(x).for_each(|(a, &b)| *a = *a * b),
        // NaN propagates: a NaN on either side wins (as the comparison is false).
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

/// Whether reductions support `dtype`.
pub fn reducible(dtype: DType) -> bool {
    matches!(
        dtype,
        DType::Float32 | DType::Float64 | DType::Int32 | DType::Int64
    )
}

/// Reduces tensors of one shape and a [`reducible`] dtype with `op`, left to right:
/// `((t0 op t1) op t2) ...`. Checked by the caller; `ts` is not empty.
pub fn reduce_in_order(ts: Vec<Tensor>, op: ReduceOp) -> Tensor {
    let mut it = ts.into_iter();
    let mut acc = match it.next() {
        Some(t) => t,
        None => return Tensor::scalar_f32(0.0),
    };
    for t in it {
        match (&mut acc.data, &t.data) {
            (Data::F32(a), Data::F32(b)) => reduce_vec(a, b, op),
            (Data::F64(a), Data::F64(b)) => reduce_vec(a, b, op),
            (Data::I32(a), Data::I32(b)) => reduce_vec_int(a, b, op),
            (Data::I64(a), Data::I64(b)) => reduce_vec_int(a, b, op),
            _ => {}
        }
    }
    acc
}

/// Integer reduction with wrapping arithmetic (no overflow panic in debug builds).
fn reduce_vec_int<T: Copy + Ord + WrappingArith>(acc: &mut [T], x: &[T], op: ReduceOp) {
    match op {
        ReduceOp::Sum => acc.iter_mut().zip(x).for_each(|(a, &b)| *a = a.wadd(b)),
        ReduceOp::Prod => acc.iter_mut().zip(x).for_each(|(a, &b)| *a = a.wmul(b)),
        ReduceOp::Max => acc.iter_mut().zip(x).for_each(|(a, &b)| *a = (*a).max(b)),
        ReduceOp::Min => acc.iter_mut().zip(x).for_each(|(a, &b)| *a = (*a).min(b)),
    }
}

/// Wrapping add and multiply of the integer element types.
trait WrappingArith {
    fn wadd(self, b: Self) -> Self;
    fn wmul(self, b: Self) -> Self;
}

impl WrappingArith for i32 {
    fn wadd(self, b: i32) -> i32 {
        self.wrapping_add(b)
    }
    fn wmul(self, b: i32) -> i32 {
        self.wrapping_mul(b)
    }
}

impl WrappingArith for i64 {
    fn wadd(self, b: i64) -> i64 {
        self.wrapping_add(b)
    }
    fn wmul(self, b: i64) -> i64 {
        self.wrapping_mul(b)
    }
}

/// Makes `dst` equal to `src`, reusing `dst`'s storage when the element types agree.
pub(crate) fn assign(dst: &mut Tensor, src: &Tensor) {
    let done = match (&mut dst.data, &src.data) {
        (Data::F32(d), Data::F32(s)) => {
            d.clone_from(s);
            true
        }
        (Data::F64(d), Data::F64(s)) => {
            d.clone_from(s);
            true
        }
        (Data::F16(d), Data::F16(s)) => {
            d.clone_from(s);
            true
        }
        (Data::BF16(d), Data::BF16(s)) => {
            d.clone_from(s);
            true
        }
        (Data::I32(d), Data::I32(s)) => {
            d.clone_from(s);
            true
        }
        (Data::I64(d), Data::I64(s)) => {
            d.clone_from(s);
            true
        }
        (Data::Bool(d), Data::Bool(s)) => {
            d.clone_from(s);
            true
        }
        _ => false,
    };
    if !done {
        dst.data = src.data.clone();
    }
    dst.shape.clone_from(&src.shape);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(shape: &[usize], v: &[f32]) -> Tensor {
        Tensor::from_f32(shape.to_vec(), v.to_vec()).unwrap()
    }

    #[test]
    fn split_and_concat_are_inverse() {
        let x = t(&[2, 4], &[0., 1., 2., 3., 4., 5., 6., 7.]);
        let parts = split_axis(&x, 1, 2);
        assert_eq!(parts[0], t(&[2, 2], &[0., 1., 4., 5.]));
        assert_eq!(parts[1], t(&[2, 2], &[2., 3., 6., 7.]));
        let refs: Vec<&Tensor> = parts.iter().collect();
        assert_eq!(concat_axis(&refs, 1), x);
        let rows = split_axis(&x, 0, 2);
        assert_eq!(rows[1], t(&[1, 4], &[4., 5., 6., 7.]));
        let refs: Vec<&Tensor> = rows.iter().collect();
        assert_eq!(concat_axis(&refs, 0), x);
    }

    #[test]
    fn reductions_in_order() {
        let a = t(&[3], &[1., 5., f32::NAN]);
        let b = t(&[3], &[4., 2., 0.]);
        let s = reduce_in_order(vec![a.clone(), b.clone()], ReduceOp::Max);
        assert_eq!(&s.as_f32().unwrap()[..2], &[4., 5.]);
        assert!(s.as_f32().unwrap()[2].is_nan());
        let p = reduce_in_order(vec![a, b], ReduceOp::Prod);
        assert_eq!(&p.as_f32().unwrap()[..2], &[4., 10.]);
        let i = Tensor::from_i64(vec![2], vec![3, -1]).unwrap();
        let j = Tensor::from_i64(vec![2], vec![-7, 9]).unwrap();
        assert_eq!(
            reduce_in_order(vec![i, j], ReduceOp::Min).data,
            Data::I64(vec![-7, -1])
        );
    }
}
