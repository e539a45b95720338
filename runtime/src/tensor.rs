//! Host tensors: a shape and a typed buffer.

use half::{bf16, f16};
use shardc_ir::{num_elements, DType, TensorType};
use std::ops::Range;

/// A typed, contiguous, row-major buffer.
#[derive(Clone, Debug, PartialEq)]
pub enum Data {
    /// Float32 elements.
    F32(Vec<f32>),
    /// Float64 elements.
    F64(Vec<f64>),
    /// Float16 elements.
    F16(Vec<f16>),
    /// BFloat16 elements.
    BF16(Vec<bf16>),
    /// Int32 elements.
    I32(Vec<i32>),
    /// Int64 elements.
    I64(Vec<i64>),
    /// Bool elements.
    Bool(Vec<bool>),
}

impl Data {
    /// A zero-filled buffer of `len` elements.
    pub fn zeros(dtype: DType, len: usize) -> Data {
        match dtype {
            DType::Float32 => Data::F32(vec![0.0; len]),
            DType::Float64 => Data::F64(vec![0.0; len]),
            DType::Float16 => Data::F16(vec![f16::ZERO; len]),
            DType::BFloat16 => Data::BF16(vec![bf16::ZERO; len]),
            DType::Int32 => Data::I32(vec![0; len]),
            DType::Int64 => Data::I64(vec![0; len]),
            DType::Bool => Data::Bool(vec![false; len]),
        }
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            Data::F32(_) => DType::Float32,
            Data::F64(_) => DType::Float64,
            Data::F16(_) => DType::Float16,
            Data::BF16(_) => DType::BFloat16,
            Data::I32(_) => DType::Int32,
            Data::I64(_) => DType::Int64,
            Data::Bool(_) => DType::Bool,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Data::F32(v) => v.len(),
            Data::F64(v) => v.len(),
            Data::F16(v) => v.len(),
            Data::BF16(v) => v.len(),
            Data::I32(v) => v.len(),
            Data::I64(v) => v.len(),
            Data::Bool(v) => v.len(),
        }
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element `i` converted to f64.
    pub fn get_f64(&self, i: usize) -> f64 {
        match self {
            Data::F32(v) => v[i] as f64,
            Data::F64(v) => v[i],
            Data::F16(v) => v[i].to_f64(),
            Data::BF16(v) => v[i].to_f64(),
            Data::I32(v) => v[i] as f64,
            Data::I64(v) => v[i] as f64,
            Data::Bool(v) => v[i] as u8 as f64,
        }
    }
}

/// A host tensor: shape and row-major data. `data.len()` always equals the shape's element
/// count.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    /// The shape.
    pub shape: Vec<usize>,
    /// The elements.
    pub data: Data,
}

impl Tensor {
    /// The elements as little-endian bytes (bools as one byte, 0 or 1): the form checkpoints
    /// store and devices upload.
    pub fn to_le_bytes(&self) -> Vec<u8> {
        fn le<T: Copy, const N: usize>(v: &[T], f: impl Fn(T) -> [u8; N]) -> Vec<u8> {
            if cfg!(target_endian = "little") {
                // SAFETY: plain numeric element types without padding, already little-endian;
                // the length is the slice's own in bytes.
                unsafe {
                    std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v))
                }
                .to_vec()
            } else {
                v.iter().flat_map(|&x| f(x)).collect()
            }
        }
        match &self.data {
            Data::F32(v) => le(v, f32::to_le_bytes),
            Data::F64(v) => le(v, f64::to_le_bytes),
            Data::F16(v) => le(v, |x: f16| x.to_bits().to_le_bytes()),
            Data::BF16(v) => le(v, |x: bf16| x.to_bits().to_le_bytes()),
            Data::I32(v) => le(v, i32::to_le_bytes),
            Data::I64(v) => le(v, i64::to_le_bytes),
            Data::Bool(v) => v.iter().map(|&b| u8::from(b)).collect(),
        }
    }

    /// A tensor of type `ty` from little-endian element bytes (the inverse of
    /// [`Tensor::to_le_bytes`]). Bytes beyond the type's are ignored and missing ones read as
    /// zero: callers that take bytes from outside check the length first.
    pub fn from_le_bytes(ty: &TensorType, bytes: &[u8]) -> Tensor {
        fn fill<T: Copy, const N: usize>(v: &mut [T], bytes: &[u8], f: impl Fn([u8; N]) -> T) {
            for (x, c) in v.iter_mut().zip(bytes.chunks_exact(N)) {
                let mut a = [0u8; N];
                a.copy_from_slice(c);
                *x = f(a);
            }
        }
        let mut t = Tensor::zeros(ty);
        match &mut t.data {
            Data::F32(v) => fill(v, bytes, f32::from_le_bytes),
            Data::F64(v) => fill(v, bytes, f64::from_le_bytes),
            Data::F16(v) => fill(v, bytes, |a| f16::from_bits(u16::from_le_bytes(a))),
            Data::BF16(v) => fill(v, bytes, |a| bf16::from_bits(u16::from_le_bytes(a))),
            Data::I32(v) => fill(v, bytes, i32::from_le_bytes),
            Data::I64(v) => fill(v, bytes, i64::from_le_bytes),
            Data::Bool(v) => v.iter_mut().zip(bytes).for_each(|(b, &x)| *b = x != 0),
        }
        t
    }

    /// Copies `src`'s elements into this tensor's storage (same dtype and length, checked by
    /// the caller's planning), taking `src`'s shape. Returns false when they do not match.
    pub fn copy_from(&mut self, src: &Tensor) -> bool {
        let ok = match (&mut self.data, &src.data) {
            (Data::F32(d), Data::F32(s)) if d.len() == s.len() => {
                d.copy_from_slice(s);
                true
            }
            (Data::F64(d), Data::F64(s)) if d.len() == s.len() => {
                d.copy_from_slice(s);
                true
            }
            (Data::F16(d), Data::F16(s)) if d.len() == s.len() => {
                d.copy_from_slice(s);
                true
            }
            (Data::BF16(d), Data::BF16(s)) if d.len() == s.len() => {
                d.copy_from_slice(s);
                true
            }
            (Data::I32(d), Data::I32(s)) if d.len() == s.len() => {
                d.copy_from_slice(s);
                true
            }
            (Data::I64(d), Data::I64(s)) if d.len() == s.len() => {
                d.copy_from_slice(s);
                true
            }
            (Data::Bool(d), Data::Bool(s)) if d.len() == s.len() => {
                d.copy_from_slice(s);
                true
            }
            _ => false,
        };
        if ok && self.shape != src.shape {
            self.shape.clone_from(&src.shape);
        }
        ok
    }

    /// Copies `len` elements of `src` from element `from` into this tensor's storage at
    /// element `at` (same dtype; the shape is kept). Returns false when the dtypes differ or
    /// a range does not fit.
    pub fn copy_elements(&mut self, at: usize, src: &Tensor, from: usize, len: usize) -> bool {
        fn put<T: Copy>(d: &mut [T], at: usize, s: &[T], from: usize, len: usize) -> bool {
            match (d.get_mut(at..at + len), s.get(from..from + len)) {
                (Some(d), Some(s)) => {
                    d.copy_from_slice(s);
                    true
                }
                _ => false,
            }
        }
        match (&mut self.data, &src.data) {
            (Data::F32(d), Data::F32(s)) => put(d, at, s, from, len),
            (Data::F64(d), Data::F64(s)) => put(d, at, s, from, len),
            (Data::F16(d), Data::F16(s)) => put(d, at, s, from, len),
            (Data::BF16(d), Data::BF16(s)) => put(d, at, s, from, len),
            (Data::I32(d), Data::I32(s)) => put(d, at, s, from, len),
            (Data::I64(d), Data::I64(s)) => put(d, at, s, from, len),
            (Data::Bool(d), Data::Bool(s)) => put(d, at, s, from, len),
            _ => false,
        }
    }

    /// A zero tensor of the given type.
    pub fn zeros(ty: &TensorType) -> Tensor {
        Tensor {
            shape: ty.shape.clone(),
            data: Data::zeros(ty.dtype, ty.num_elements()),
        }
    }

    /// A Float32 tensor; `None` when `values` does not fill `shape`.
    pub fn from_f32(shape: Vec<usize>, values: Vec<f32>) -> Option<Tensor> {
        (num_elements(&shape) == values.len()).then_some(Tensor {
            shape,
            data: Data::F32(values),
        })
    }

    /// A Float64 tensor; `None` when `values` does not fill `shape`.
    pub fn from_f64(shape: Vec<usize>, values: Vec<f64>) -> Option<Tensor> {
        (num_elements(&shape) == values.len()).then_some(Tensor {
            shape,
            data: Data::F64(values),
        })
    }

    /// An Int32 tensor; `None` when `values` does not fill `shape`.
    pub fn from_i32(shape: Vec<usize>, values: Vec<i32>) -> Option<Tensor> {
        (num_elements(&shape) == values.len()).then_some(Tensor {
            shape,
            data: Data::I32(values),
        })
    }

    /// An Int64 tensor; `None` when `values` does not fill `shape`.
    pub fn from_i64(shape: Vec<usize>, values: Vec<i64>) -> Option<Tensor> {
        (num_elements(&shape) == values.len()).then_some(Tensor {
            shape,
            data: Data::I64(values),
        })
    }

    /// A rank-0 Float32 tensor.
    pub fn scalar_f32(v: f32) -> Tensor {
        Tensor {
            shape: Vec::new(),
            data: Data::F32(vec![v]),
        }
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.data.dtype()
    }

    /// The tensor's type.
    pub fn ty(&self) -> TensorType {
        TensorType::new(self.dtype(), self.shape.clone())
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// Whether the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// Size in bytes.
    pub fn size_bytes(&self) -> usize {
        self.len() * self.dtype().size_bytes()
    }

    /// The Float32 elements, if this is a Float32 tensor.
    pub fn as_f32(&self) -> Option<&[f32]> {
        match &self.data {
            Data::F32(v) => Some(v),
            _ => None,
        }
    }

    /// The Float32 elements, mutably.
    pub fn as_f32_mut(&mut self) -> Option<&mut [f32]> {
        match &mut self.data {
            Data::F32(v) => Some(v),
            _ => None,
        }
    }

    /// The Float64 elements, if this is a Float64 tensor.
    pub fn as_f64(&self) -> Option<&[f64]> {
        match &self.data {
            Data::F64(v) => Some(v),
            _ => None,
        }
    }

    /// The Float64 elements, mutably.
    pub fn as_f64_mut(&mut self) -> Option<&mut [f64]> {
        match &mut self.data {
            Data::F64(v) => Some(v),
            _ => None,
        }
    }

    /// All elements converted to f64 (for tests and printing).
    pub fn to_f64_vec(&self) -> Vec<f64> {
        (0..self.len()).map(|i| self.data.get_f64(i)).collect()
    }

    /// The single element of a one-element tensor, as f64.
    pub fn scalar_value(&self) -> Option<f64> {
        (self.len() == 1).then(|| self.data.get_f64(0))
    }

    /// The block `ranges` (one `lo..hi` per dimension) as a tensor of its own, or `None` when
    /// the ranges do not fit the shape.
    pub fn block(&self, ranges: &[Range<usize>]) -> Option<Tensor> {
        if !fits(&self.shape, ranges) {
            return None;
        }
        let shape: Vec<usize> = ranges.iter().map(|r| r.end - r.start).collect();
        let runs = block_runs(&self.shape, ranges);
        macro_rules! take {
            ($v:expr, $variant:ident) => {{
                let mut out = Vec::with_capacity(shape.iter().product());
                for &(start, len) in &runs {
                    out.extend_from_slice(&$v[start..start + len]);
                }
                Data::$variant(out)
            }};
        }
        let data = match &self.data {
            Data::F32(v) => take!(v, F32),
            Data::F64(v) => take!(v, F64),
            Data::F16(v) => take!(v, F16),
            Data::BF16(v) => take!(v, BF16),
            Data::I32(v) => take!(v, I32),
            Data::I64(v) => take!(v, I64),
            Data::Bool(v) => take!(v, Bool),
        };
        Some(Tensor { shape, data })
    }

    /// Writes `src` into the block `ranges` of this tensor. Returns false (and writes nothing)
    /// when the ranges do not fit, `src`'s shape is not the block's, or the dtypes differ.
    pub fn set_block(&mut self, ranges: &[Range<usize>], src: &Tensor) -> bool {
        let block_shape: Vec<usize> = ranges
            .iter()
            .map(|r| r.end.saturating_sub(r.start))
            .collect();
        if !fits(&self.shape, ranges) || src.shape != block_shape || src.dtype() != self.dtype() {
            return false;
        }
        let runs = block_runs(&self.shape, ranges);
        macro_rules! put {
            ($dst:expr, $src:expr) => {{
                let mut at = 0;
                for &(start, len) in &runs {
                    $dst[start..start + len].copy_from_slice(&$src[at..at + len]);
                    at += len;
                }
            }};
        }
        match (&mut self.data, &src.data) {
            (Data::F32(d), Data::F32(s)) => put!(d, s),
            (Data::F64(d), Data::F64(s)) => put!(d, s),
            (Data::F16(d), Data::F16(s)) => put!(d, s),
            (Data::BF16(d), Data::BF16(s)) => put!(d, s),
            (Data::I32(d), Data::I32(s)) => put!(d, s),
            (Data::I64(d), Data::I64(s)) => put!(d, s),
            (Data::Bool(d), Data::Bool(s)) => put!(d, s),
            _ => return false,
        }
        true
    }
}

fn fits(shape: &[usize], ranges: &[Range<usize>]) -> bool {
    ranges.len() == shape.len()
        && ranges
            .iter()
            .zip(shape)
            .all(|(r, &n)| r.start <= r.end && r.end <= n)
}

/// The contiguous runs `(start, len)` of a block in a row-major tensor, in order.
fn block_runs(shape: &[usize], ranges: &[Range<usize>]) -> Vec<(usize, usize)> {
    let rank = shape.len();
    if rank == 0 {
        return vec![(0, 1)];
    }
    if ranges.iter().any(|r| r.is_empty()) {
        return Vec::new();
    }
    let mut strides = vec![1usize; rank];
    for i in (0..rank - 1).rev() {
        strides[i] = strides[i + 1] * shape[i + 1];
    }
    let inner = ranges[rank - 1].end - ranges[rank - 1].start;
    let mut runs = Vec::new();
    let mut idx: Vec<usize> = ranges[..rank - 1].iter().map(|r| r.start).collect();
    loop {
        let start: usize = idx
            .iter()
            .zip(&strides)
            .map(|(&i, &s)| i * s)
            .sum::<usize>()
            + ranges[rank - 1].start;
        runs.push((start, inner));
        // Advance the outer index (odometer).
        let mut d = rank - 1;
        loop {
            if d == 0 {
                return runs;
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < ranges[d].end {
                break;
            }
            idx[d] = ranges[d].start;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constructors_check_sizes() {
        assert!(Tensor::from_f32(vec![2, 3], vec![0.0; 6]).is_some());
        assert!(Tensor::from_f32(vec![2, 3], vec![0.0; 5]).is_none());
        let t = Tensor::zeros(&TensorType::new(DType::Int64, vec![4]));
        assert_eq!(t.size_bytes(), 32);
        assert_eq!(Tensor::scalar_f32(2.5).scalar_value(), Some(2.5));
    }

    #[test]
    fn blocks_round_trip() {
        let t = Tensor::from_f32(vec![4, 6], (0..24).map(|x| x as f32).collect()).unwrap();
        let b = t.block(&[2..4, 3..6]).unwrap();
        assert_eq!(b.shape, vec![2, 3]);
        assert_eq!(b.as_f32().unwrap(), &[15.0, 16.0, 17.0, 21.0, 22.0, 23.0]);
        let mut z = Tensor::zeros(&TensorType::new(DType::Float32, vec![4, 6]));
        assert!(z.set_block(&[2..4, 3..6], &b));
        assert_eq!(z.block(&[2..4, 3..6]).unwrap(), b);
        assert!(!z.set_block(&[0..1, 0..6], &b));
        assert!(t.block(&[0..5, 0..1]).is_none());
    }
}
