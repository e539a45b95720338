//! The evaluator's view of an MLIR module: ops with operands, typed results, attributes (as
//! MLIR prints them) and single-block regions. Built from MLIR's own parse by the `mlir`
//! module (feature `mlir`), or by hand in tests.

use std::collections::BTreeMap;

/// An SSA value, numbered by whoever built the module.
pub type ValueId = usize;

/// An element type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Elem {
    /// `f32`.
    F32,
    /// `f64`.
    F64,
    /// `i1`.
    I1,
    /// `i32`.
    I32,
    /// `i64`.
    I64,
    /// `index`.
    Index,
}

impl Elem {
    /// The element type of its MLIR name.
    pub fn parse(s: &str) -> Option<Elem> {
        Some(match s {
            "f32" => Elem::F32,
            "f64" => Elem::F64,
            "i1" => Elem::I1,
            "i32" => Elem::I32,
            "i64" => Elem::I64,
            "index" => Elem::Index,
            _ => return None,
        })
    }

    /// Bytes per element (index and i1 as 8 and 1).
    pub fn bytes(self) -> usize {
        match self {
            Elem::F32 | Elem::I32 => 4,
            Elem::F64 | Elem::I64 | Elem::Index => 8,
            Elem::I1 => 1,
        }
    }

    /// Whether a float type.
    pub fn is_float(self) -> bool {
        matches!(self, Elem::F32 | Elem::F64)
    }

    /// `v` rounded to what this type holds.
    pub fn round(self, v: f64) -> f64 {
        match self {
            Elem::F32 => v as f32 as f64,
            Elem::F64 => v,
            Elem::I1 => f64::from(u8::from(v != 0.0)),
            Elem::I32 => (v as i64 as i32) as f64,
            Elem::I64 | Elem::Index => v.trunc(),
        }
    }
}

/// A value's type.
#[derive(Clone, Debug, PartialEq)]
pub enum Ty {
    /// A ranked tensor of static shape.
    Tensor(Vec<usize>, Elem),
    /// A scalar.
    Scalar(Elem),
    /// Anything else (`!shard.sharding`, dynamic shapes), as printed.
    Other(String),
}

impl Ty {
    /// The type of its printed form: `tensor<8x16xf32>`, `tensor<f32>`, `f32`, `index`.
    pub fn parse(s: &str) -> Ty {
        let s = s.trim();
        if let Some(inner) = s.strip_prefix("tensor<").and_then(|r| r.strip_suffix('>')) {
            let mut parts: Vec<&str> = inner.split('x').collect();
            let Some(e) = parts.pop().and_then(Elem::parse) else {
                return Ty::Other(s.to_string());
            };
            let mut shape = Vec::with_capacity(parts.len());
            for p in parts {
                match p.parse() {
                    Ok(n) => shape.push(n),
                    Err(_) => return Ty::Other(s.to_string()),
                }
            }
            return Ty::Tensor(shape, e);
        }
        match Elem::parse(s) {
            Some(e) => Ty::Scalar(e),
            None => Ty::Other(s.to_string()),
        }
    }

    /// The element type, if a tensor or scalar.
    pub fn elem(&self) -> Option<Elem> {
        match self {
            Ty::Tensor(_, e) | Ty::Scalar(e) => Some(*e),
            Ty::Other(_) => None,
        }
    }
}

/// One operation.
#[derive(Clone, Debug, PartialEq)]
pub struct Op {
    /// `linalg.generic`.
    pub name: String,
    /// Its operands.
    pub operands: Vec<ValueId>,
    /// Its results and their types.
    pub results: Vec<(ValueId, Ty)>,
    /// Its attributes, printed.
    pub attrs: BTreeMap<String, String>,
    /// Its regions (one block each).
    pub regions: Vec<Block>,
}

/// A block: arguments and ops.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Block {
    /// Its arguments and their types.
    pub args: Vec<(ValueId, Ty)>,
    /// Its ops, in order.
    pub ops: Vec<Op>,
}

/// A function.
#[derive(Clone, Debug, PartialEq)]
pub struct Func {
    /// Its symbol name.
    pub name: String,
    /// Its body.
    pub body: Block,
}

/// A module: the grid and the functions.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Module {
    /// The shape of `@grid0` (the one grid), major first; empty when none.
    pub grid: Vec<usize>,
    /// Its functions with bodies.
    pub funcs: Vec<Func>,
}

impl Op {
    /// The first result's id, for messages.
    pub fn value(&self) -> String {
        self.results
            .first()
            .map_or("-".to_string(), |(v, _)| format!("%v{v}"))
    }
}
