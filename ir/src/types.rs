//! Element types, shapes and the types of values.

use serde::{Deserialize, Serialize};
use std::fmt;

/// The element type of a tensor.
///
/// Kernels compute in `Float32` (and `Float64` for gradient checks); the other float types are
/// storage types reached through `Cast`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
pub enum DType {
    /// 32-bit IEEE float.
    Float32,
    /// 64-bit IEEE float.
    Float64,
    /// 16-bit IEEE float.
    Float16,
    /// bfloat16.
    BFloat16,
    /// 32-bit signed integer.
    Int32,
    /// 64-bit signed integer.
    Int64,
    /// Boolean (one byte per element).
    Bool,
}

impl DType {
    /// All element types, in declaration order.
    pub const ALL: [DType; 7] = [
        DType::Float32,
        DType::Float64,
        DType::Float16,
        DType::BFloat16,
        DType::Int32,
        DType::Int64,
        DType::Bool,
    ];

    /// MindSpore's long name, as in `<Tensor[Float32], (8, 16)>`.
    pub fn name(self) -> &'static str {
        match self {
            DType::Float32 => "Float32",
            DType::Float64 => "Float64",
            DType::Float16 => "Float16",
            DType::BFloat16 => "BFloat16",
            DType::Int32 => "Int32",
            DType::Int64 => "Int64",
            DType::Bool => "Bool",
        }
    }

    /// MindSpore's short name, as in `<Ref[Tensor(F32)], ...>`.
    pub fn short_name(self) -> &'static str {
        match self {
            DType::Float32 => "F32",
            DType::Float64 => "F64",
            DType::Float16 => "F16",
            DType::BFloat16 => "BF16",
            DType::Int32 => "I32",
            DType::Int64 => "I64",
            DType::Bool => "Bool",
        }
    }

    /// Parses either the long or the short name.
    pub fn from_name(s: &str) -> Option<DType> {
        DType::ALL
            .iter()
            .copied()
            .find(|d| d.name() == s || d.short_name() == s)
    }

    /// Bytes per element.
    pub fn size_bytes(self) -> usize {
        match self {
            DType::Float64 | DType::Int64 => 8,
            DType::Float32 | DType::Int32 => 4,
            DType::Float16 | DType::BFloat16 => 2,
            DType::Bool => 1,
        }
    }

    /// Whether this is a floating-point type.
    pub fn is_float(self) -> bool {
        matches!(
            self,
            DType::Float32 | DType::Float64 | DType::Float16 | DType::BFloat16
        )
    }

    /// Whether this is an integer type.
    pub fn is_int(self) -> bool {
        matches!(self, DType::Int32 | DType::Int64)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A static shape: the size of every dimension. A scalar has rank 0.
pub type Shape = Vec<usize>;

/// Number of elements of a shape (1 for a scalar).
pub fn num_elements(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// The type of a tensor value: element type and static shape.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TensorType {
    /// Element type.
    pub dtype: DType,
    /// Static shape.
    pub shape: Shape,
}

impl TensorType {
    /// A tensor type.
    pub fn new(dtype: DType, shape: impl Into<Shape>) -> Self {
        TensorType {
            dtype,
            shape: shape.into(),
        }
    }

    /// A rank-0 tensor type.
    pub fn scalar(dtype: DType) -> Self {
        TensorType {
            dtype,
            shape: Vec::new(),
        }
    }

    /// Number of elements.
    pub fn num_elements(&self) -> usize {
        num_elements(&self.shape)
    }

    /// Size in bytes.
    pub fn size_bytes(&self) -> usize {
        self.num_elements() * self.dtype.size_bytes()
    }

    /// Rank (number of dimensions).
    pub fn rank(&self) -> usize {
        self.shape.len()
    }
}

impl fmt::Display for TensorType {
    /// Prints `<Tensor[Float32], (8, 16)>`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "<Tensor[{}], {}>", self.dtype, ShapeDisplay(&self.shape))
    }
}

/// Displays a shape as MindSpore does: `(8, 16)`, `(8)` for rank one, `()` for a scalar.
pub struct ShapeDisplay<'a>(pub &'a [usize]);

impl fmt::Display for ShapeDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("(")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str(")")
    }
}

/// The type of a node's result: one tensor, or a tuple of tensors for multi-output ops
/// (`Split`, `BatchNorm`, `Dropout`, ...), taken apart by `TupleGetItem`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Type {
    /// A single tensor.
    Tensor(TensorType),
    /// A tuple of tensors.
    Tuple(Vec<TensorType>),
}

impl Type {
    /// The tensor type, if this is a single tensor.
    pub fn as_tensor(&self) -> Option<&TensorType> {
        match self {
            Type::Tensor(t) => Some(t),
            Type::Tuple(_) => None,
        }
    }

    /// The result's tensors: one for a tensor, each element for a tuple.
    pub fn tensors(&self) -> &[TensorType] {
        match self {
            Type::Tensor(t) => std::slice::from_ref(t),
            Type::Tuple(ts) => ts,
        }
    }

    /// Total size in bytes of all tensors.
    pub fn size_bytes(&self) -> usize {
        self.tensors().iter().map(TensorType::size_bytes).sum()
    }
}

impl From<TensorType> for Type {
    fn from(t: TensorType) -> Self {
        Type::Tensor(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtype_names_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::from_name(d.name()), Some(d));
            assert_eq!(DType::from_name(d.short_name()), Some(d));
        }
        assert_eq!(DType::from_name("Float8"), None);
    }

    #[test]
    fn tensor_type_display() {
        let t = TensorType::new(DType::Float32, vec![8, 16]);
        assert_eq!(t.to_string(), "<Tensor[Float32], (8, 16)>");
        assert_eq!(t.size_bytes(), 8 * 16 * 4);
        assert_eq!(
            TensorType::scalar(DType::Int64).to_string(),
            "<Tensor[Int64], ()>"
        );
    }
}
