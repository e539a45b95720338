//! The types of an op's operand signature: the names and kinds of its operands by position
//! (each op's own is in its rules, `crate::ops`).

/// What an operand position of an op accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OperandSpec {
    /// A tensor: a node result or a parameter.
    Tensor,
    /// A constant integer tuple (a single integer reads as a one-element tuple).
    Ints,
    /// A constant integer.
    Int,
    /// A constant number (Float or Int).
    Number,
    /// A tensor, or a Float / Int constant acting as a rank-0 tensor of the other operand's
    /// element type.
    TensorOrNumber,
    /// A scalar hyper-parameter: a Float / Int constant or a one-element float tensor.
    Scalar,
    /// A weight parameter (a `Ref`).
    Weight,
}

/// The operands an op takes: names and kinds by position.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Signature {
    /// Name and kind of each operand, in order. For a variadic op, the one repeated operand.
    pub operands: &'static [(&'static str, OperandSpec)],
    /// How many leading operands are required (the rest are optional).
    pub required: usize,
    /// Whether the op takes any number (at least `required`) of operands like the first.
    pub variadic: bool,
}

impl Signature {
    /// A signature of exactly these operands.
    pub const fn fixed(operands: &'static [(&'static str, OperandSpec)]) -> Self {
        Signature {
            operands,
            required: operands.len(),
            variadic: false,
        }
    }

    /// The name of operand `i` (`x1`, `x2`, ... for a variadic op).
    pub fn name(&self, i: usize) -> String {
        if self.variadic {
            let base = self.operands.first().map_or("x", |o| o.0);
            format!("{base}{}", i + 1)
        } else {
            self.operands
                .get(i)
                .map_or_else(|| format!("extra{i}"), |o| o.0.to_string())
        }
    }

    /// The kind of operand `i`.
    pub fn spec(&self, i: usize) -> Option<OperandSpec> {
        if self.variadic {
            self.operands.first().map(|o| o.1)
        } else {
            self.operands.get(i).map(|o| o.1)
        }
    }
}
