//! Tensors known at import time and the arithmetic the importer folds on them.
//!
//! ONNX exporters write a model's shape arithmetic (`Shape`, `Gather` on shapes, `Concat` of
//! dims, `ConstantOfShape`, masks built with `Range`, `Where`, ...) as nodes of the graph.
//! With static input shapes every such value is known when the model is read, so the
//! importer evaluates it here and only real tensor computation reaches shardc's graph.
//!
//! Values are kept as `f64` whatever their element type (every integer a shape or an index
//! holds is exact in an `f64`; `i64::MAX`, ONNX's "to the end" bound, saturates back to
//! itself). A Float32 result is rounded to `f32` after every operation, so folded values equal
//! what a Float32 runtime computes.

use shardc_ir::DType;

/// ONNX `TensorProto.DataType` codes the importer reads.
pub mod code {
    /// FLOAT.
    pub const FLOAT: i32 = 1;
    /// UINT8.
    pub const UINT8: i32 = 2;
    /// INT8.
    pub const INT8: i32 = 3;
    /// INT32.
    pub const INT32: i32 = 6;
    /// INT64.
    pub const INT64: i32 = 7;
    /// BOOL.
    pub const BOOL: i32 = 9;
    /// FLOAT16.
    pub const FLOAT16: i32 = 10;
    /// DOUBLE.
    pub const DOUBLE: i32 = 11;
}

/// The element type of a folded tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Elem {
    /// 32-bit float.
    F32,
    /// 64-bit float.
    F64,
    /// 16-bit float (values kept exact in `f64`).
    F16,
    /// A signed or unsigned integer of any width.
    Int,
    /// Boolean (0 or 1).
    Bool,
}

impl Elem {
    /// The element type of an ONNX data type code, `None` for one the importer does not read.
    pub fn of_code(c: i32) -> Option<Elem> {
        match c {
            code::FLOAT => Some(Elem::F32),
            code::DOUBLE => Some(Elem::F64),
            code::FLOAT16 => Some(Elem::F16),
            code::INT32 | code::INT64 | code::INT8 | code::UINT8 => Some(Elem::Int),
            code::BOOL => Some(Elem::Bool),
            _ => None,
        }
    }

    /// Whether the type is a float type.
    pub fn is_float(self) -> bool {
        matches!(self, Elem::F32 | Elem::F64 | Elem::F16)
    }

    /// Rounds a value to this type (Float32 to `f32`, integers toward zero, booleans to 0/1).
    pub fn round(self, v: f64) -> f64 {
        match self {
            Elem::F32 => v as f32 as f64,
            Elem::F16 => half::f16::from_f64(v).to_f64(),
            Elem::F64 => v,
            Elem::Int => v.trunc(),
            Elem::Bool => f64::from(u8::from(v != 0.0)),
        }
    }
}

/// shardc's element type of an ONNX data type code, `None` for one shardc lacks.
pub fn dtype_of_code(c: i32) -> Option<DType> {
    match c {
        code::FLOAT => Some(DType::Float32),
        code::DOUBLE => Some(DType::Float64),
        code::FLOAT16 => Some(DType::Float16),
        code::INT32 => Some(DType::Int32),
        code::INT64 => Some(DType::Int64),
        code::BOOL => Some(DType::Bool),
        _ => None,
    }
}

/// A tensor whose value is known at import time.
#[derive(Clone, Debug, PartialEq)]
pub struct ConstT {
    /// The ONNX element type code (`code::FLOAT`, ...).
    pub code: i32,
    /// The shape (empty: a scalar).
    pub shape: Vec<usize>,
    /// The elements, row-major.
    pub data: Vec<f64>,
    /// The initializer it is, when it is one (its name): such a float tensor used as an
    /// operand becomes a trainable weight.
    pub origin: Option<String>,
}

/// The number of elements of a shape (saturating: a shape too large to count is
/// `usize::MAX`).
pub fn numel(shape: &[usize]) -> usize {
    shape.iter().fold(1usize, |a, &d| a.saturating_mul(d))
}

/// The most elements the importer computes for one folded tensor.
pub const MAX_FOLDED_ELEMENTS: usize = 1 << 24;

/// An error when a folded tensor of `shape` would exceed [`MAX_FOLDED_ELEMENTS`].
pub fn check_size(shape: &[usize]) -> Result<(), String> {
    let n = numel(shape);
    if n > MAX_FOLDED_ELEMENTS {
        return Err(format!(
            "a constant of shape {shape:?} is too large to fold at import time ({n} elements, at most {MAX_FOLDED_ELEMENTS})"
        ));
    }
    Ok(())
}

/// Row-major strides of a shape.
fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

/// The broadcast shape of several shapes (numpy rules), or why there is none.
pub fn broadcast(shapes: &[&[usize]]) -> Result<Vec<usize>, String> {
    let rank = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
    let mut out = vec![1usize; rank];
    for s in shapes {
        let off = rank - s.len();
        for (i, &d) in s.iter().enumerate() {
            let o = &mut out[off + i];
            if *o == 1 {
                *o = d;
            } else if d != 1 && d != *o {
                return Err(format!(
                    "shapes {:?} do not broadcast",
                    shapes.iter().map(|s| s.to_vec()).collect::<Vec<_>>()
                ));
            }
        }
    }
    Ok(out)
}

/// The flat index into a tensor of shape `inp` (broadcast to `out`) of every element of
/// `out`, in order.
fn broadcast_index(out: &[usize], inp: &[usize]) -> Vec<usize> {
    let n = numel(out);
    let off = out.len() - inp.len();
    let in_strides = strides(inp);
    let out_strides = strides(out);
    (0..n)
        .map(|flat| {
            let mut idx = 0;
            for (d, &size) in inp.iter().enumerate() {
                if size == 1 {
                    continue;
                }
                let coord = (flat / out_strides[off + d]) % out[off + d];
                idx += coord * in_strides[d];
            }
            idx
        })
        .collect()
}

impl ConstT {
    /// A tensor of the given type code, shape and elements (not from an initializer).
    pub fn new(code: i32, shape: Vec<usize>, data: Vec<f64>) -> ConstT {
        ConstT {
            code,
            shape,
            data,
            origin: None,
        }
    }

    /// An Int64 vector.
    pub fn ints(v: &[i64]) -> ConstT {
        ConstT::new(
            code::INT64,
            vec![v.len()],
            v.iter().map(|&x| x as f64).collect(),
        )
    }

    /// The element type (Float32 for a code the importer does not know).
    pub fn elem(&self) -> Elem {
        Elem::of_code(self.code).unwrap_or(Elem::F32)
    }

    /// The elements as integers (saturating).
    pub fn as_i64(&self) -> Vec<i64> {
        self.data.iter().map(|&v| v as i64).collect()
    }

    /// The single element of a one-element tensor.
    pub fn scalar(&self) -> Option<f64> {
        (self.data.len() == 1).then(|| self.data[0])
    }

    /// The same values with a new shape (same number of elements, checked by the caller).
    pub fn reshaped(&self, shape: Vec<usize>) -> ConstT {
        ConstT::new(self.code, shape, self.data.clone())
    }

    /// The values converted to type `code`.
    pub fn cast(&self, code: i32) -> ConstT {
        let e = Elem::of_code(code).unwrap_or(Elem::F32);
        ConstT::new(
            code,
            self.shape.clone(),
            self.data.iter().map(|&v| e.round(v)).collect(),
        )
    }

    /// `f` on every element, rounded to the tensor's type.
    pub fn map(&self, f: impl Fn(f64) -> f64) -> ConstT {
        let e = self.elem();
        ConstT::new(
            self.code,
            self.shape.clone(),
            self.data.iter().map(|&v| e.round(f(v))).collect(),
        )
    }

    /// The elementwise `f(a, b)` with numpy broadcasting; the result has type `code`.
    pub fn zip(
        a: &ConstT,
        b: &ConstT,
        code: i32,
        f: impl Fn(f64, f64) -> f64,
    ) -> Result<ConstT, String> {
        let out = broadcast(&[&a.shape, &b.shape])?;
        check_size(&out)?;
        let ia = broadcast_index(&out, &a.shape);
        let ib = broadcast_index(&out, &b.shape);
        let e = Elem::of_code(code).unwrap_or(Elem::F32);
        let data = ia
            .iter()
            .zip(&ib)
            .map(|(&i, &j)| e.round(f(a.data[i], b.data[j])))
            .collect();
        Ok(ConstT::new(code, out, data))
    }

    /// `Where(cond, x, y)` with numpy broadcasting.
    pub fn select(cond: &ConstT, x: &ConstT, y: &ConstT) -> Result<ConstT, String> {
        let out = broadcast(&[&cond.shape, &x.shape, &y.shape])?;
        check_size(&out)?;
        let ic = broadcast_index(&out, &cond.shape);
        let ix = broadcast_index(&out, &x.shape);
        let iy = broadcast_index(&out, &y.shape);
        let data = (0..numel(&out))
            .map(|k| {
                if cond.data[ic[k]] != 0.0 {
                    x.data[ix[k]]
                } else {
                    y.data[iy[k]]
                }
            })
            .collect();
        Ok(ConstT::new(x.code, out, data))
    }

    /// The tensor broadcast to `shape` (`Expand`: the result is the broadcast of both).
    pub fn expand(&self, shape: &[usize]) -> Result<ConstT, String> {
        let out = broadcast(&[&self.shape, shape])?;
        check_size(&out)?;
        let idx = broadcast_index(&out, &self.shape);
        Ok(ConstT::new(
            self.code,
            out,
            idx.iter().map(|&i| self.data[i]).collect(),
        ))
    }

    /// The axes permuted (`perm[i]` is the input axis of output axis `i`).
    pub fn transpose(&self, perm: &[usize]) -> ConstT {
        let out: Vec<usize> = perm.iter().map(|&p| self.shape[p]).collect();
        let in_strides = strides(&self.shape);
        let out_strides = strides(&out);
        let data = (0..numel(&out))
            .map(|flat| {
                let mut idx = 0;
                for (d, &p) in perm.iter().enumerate() {
                    let coord = (flat / out_strides[d]) % out[d];
                    idx += coord * in_strides[p];
                }
                self.data[idx]
            })
            .collect();
        ConstT::new(self.code, out, data)
    }

    /// `Gather` along `axis` with (already normalised, in-range) indices of shape
    /// `idx_shape`.
    pub fn gather(&self, axis: usize, indices: &[usize], idx_shape: &[usize]) -> ConstT {
        let outer: usize = numel(&self.shape[..axis]);
        let inner: usize = numel(&self.shape[axis + 1..]);
        let n = self.shape[axis];
        let mut data = Vec::with_capacity(outer * indices.len() * inner);
        for o in 0..outer {
            for &i in indices {
                let base = (o * n + i) * inner;
                data.extend_from_slice(&self.data[base..base + inner]);
            }
        }
        let mut shape = self.shape[..axis].to_vec();
        shape.extend_from_slice(idx_shape);
        shape.extend_from_slice(&self.shape[axis + 1..]);
        ConstT::new(self.code, shape, data)
    }

    /// The concatenation of tensors of equal rank along `axis`.
    pub fn concat(parts: &[ConstT], axis: usize) -> Result<ConstT, String> {
        let first = parts.first().ok_or("no tensors to concatenate")?;
        let mut shape = first.shape.clone();
        if axis >= shape.len() {
            return Err(format!("axis {axis} is out of range for shape {shape:?}"));
        }
        shape[axis] = 0;
        for p in parts {
            if p.shape.len() != first.shape.len()
                || p.shape
                    .iter()
                    .zip(&first.shape)
                    .enumerate()
                    .any(|(d, (a, b))| d != axis && a != b)
            {
                return Err(format!(
                    "shapes {:?} and {:?} cannot be concatenated along axis {axis}",
                    first.shape, p.shape
                ));
            }
            shape[axis] += p.shape[axis];
        }
        let outer = numel(&first.shape[..axis]);
        let mut data = Vec::with_capacity(numel(&shape));
        for o in 0..outer {
            for p in parts {
                let chunk = numel(&p.shape[axis..]);
                data.extend_from_slice(&p.data[o * chunk..(o + 1) * chunk]);
            }
        }
        Ok(ConstT::new(first.code, shape, data))
    }

    /// The elements at `(first, step, count)` per dim (see [`shardc_ir::geometry::slice_spec`]).
    pub fn slice(&self, spec: &[(usize, usize, usize)]) -> ConstT {
        let out: Vec<usize> = spec.iter().map(|s| s.2).collect();
        let in_strides = strides(&self.shape);
        let out_strides = strides(&out);
        let data = (0..numel(&out))
            .map(|flat| {
                let mut idx = 0;
                for (d, &(first, step, _)) in spec.iter().enumerate() {
                    let coord = (flat / out_strides[d]) % out[d];
                    idx += (first + coord * step) * in_strides[d];
                }
                self.data[idx]
            })
            .collect();
        ConstT::new(self.code, out, data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(shape: &[usize], data: &[f64]) -> ConstT {
        ConstT::new(code::FLOAT, shape.to_vec(), data.to_vec())
    }

    #[test]
    fn broadcasting_zip_and_select() {
        let a = f(&[2, 1], &[1.0, 2.0]);
        let b = f(&[3], &[10.0, 20.0, 30.0]);
        let s = ConstT::zip(&a, &b, code::FLOAT, |x, y| x + y).unwrap();
        assert_eq!(s.shape, vec![2, 3]);
        assert_eq!(s.data, vec![11.0, 21.0, 31.0, 12.0, 22.0, 32.0]);
        let c = ConstT::new(code::BOOL, vec![3], vec![1.0, 0.0, 1.0]);
        let w = ConstT::select(&c, &a, &f(&[], &[f32::MIN as f64])).unwrap();
        assert_eq!(w.shape, vec![2, 3]);
        assert_eq!(w.data[1], f32::MIN as f64);
        assert_eq!(w.data[5], 2.0);
        assert!(ConstT::zip(&f(&[2], &[0.0; 2]), &b, code::FLOAT, |x, _| x).is_err());
    }

    #[test]
    fn movement() {
        let t = f(&[2, 3], &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
        assert_eq!(
            t.transpose(&[1, 0]).data,
            vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]
        );
        let g = t.gather(1, &[2, 0], &[2]);
        assert_eq!(
            (g.shape.clone(), g.data),
            (vec![2, 2], vec![2.0, 0.0, 5.0, 3.0])
        );
        let c = ConstT::concat(&[t.clone(), t.clone()], 1).unwrap();
        assert_eq!(c.shape, vec![2, 6]);
        assert_eq!(&c.data[..6], &[0.0, 1.0, 2.0, 0.0, 1.0, 2.0]);
        let s = t.slice(&[(1, 1, 1), (0, 2, 2)]);
        assert_eq!(s.data, vec![3.0, 5.0]);
        let e = f(&[1, 3], &[1.0, 2.0, 3.0]).expand(&[2, 1]).unwrap();
        assert_eq!(e.shape, vec![2, 3]);
    }

    #[test]
    fn rounding_follows_the_type() {
        assert_eq!(Elem::F32.round(0.1), 0.1f32 as f64);
        assert_eq!(Elem::Int.round(-7.0 / 2.0), -3.0);
        assert_eq!(Elem::Bool.round(5.0), 1.0);
        let i = ConstT::ints(&[i64::MAX]);
        assert_eq!(i.as_i64(), vec![i64::MAX]);
    }
}
