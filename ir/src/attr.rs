//! Attribute values, constant operands and strategies.

use serde::{Deserialize, Serialize};

/// An attribute value, as printed inside `primitive_attrs: {...}`.
///
/// The text form is MindSpore's: `true`, `3`, `0.5`, `None`, bare words (`sum`,
/// `4-6301172352641561019`), quoted strings when a word would not read back as itself,
/// `(a, b)` tuples and `[a, b]` lists.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Attr {
    /// `None`.
    None,
    /// `true` / `false`.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
    /// A string or bare word.
    Str(String),
    /// `(a, b, ...)`.
    Tuple(Vec<Attr>),
    /// `[a, b, ...]`.
    List(Vec<Attr>),
}

impl Attr {
    /// The boolean, if this is one.
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Attr::Bool(b) => Some(*b),
            _ => None,
        }
    }

    /// The integer, if this is one.
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Attr::Int(i) => Some(*i),
            _ => None,
        }
    }

    /// The number as a float (integers convert).
    pub fn as_float(&self) -> Option<f64> {
        match self {
            Attr::Float(f) => Some(*f),
            Attr::Int(i) => Some(*i as f64),
            _ => None,
        }
    }

    /// The string, if this is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Attr::Str(s) => Some(s),
            _ => None,
        }
    }

    /// A tuple or list of integers (a single integer reads as a one-element list).
    pub fn as_ints(&self) -> Option<Vec<i64>> {
        match self {
            Attr::Int(i) => Some(vec![*i]),
            Attr::Tuple(xs) | Attr::List(xs) => xs.iter().map(Attr::as_int).collect(),
            _ => None,
        }
    }

    /// An integer tuple attribute.
    pub fn ints(xs: &[i64]) -> Attr {
        Attr::Tuple(xs.iter().map(|&x| Attr::Int(x)).collect())
    }
}

/// An ordered attribute map. Order is kept so that a parsed file prints back as it was.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Attrs(pub Vec<(String, Attr)>);

impl Attrs {
    /// An empty map.
    pub fn new() -> Self {
        Attrs(Vec::new())
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&Attr> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// Sets `key` (replacing in place, or appending).
    pub fn set(&mut self, key: impl Into<String>, value: Attr) {
        let key = key.into();
        if let Some(slot) = self.0.iter_mut().find(|(k, _)| *k == key) {
            slot.1 = value;
        } else {
            self.0.push((key, value));
        }
    }

    /// Builder form of [`Attrs::set`].
    pub fn with(mut self, key: impl Into<String>, value: Attr) -> Self {
        self.set(key, value);
        self
    }

    /// Removes `key`, returning its value.
    pub fn remove(&mut self, key: &str) -> Option<Attr> {
        let i = self.0.iter().position(|(k, _)| k == key)?;
        Some(self.0.remove(i).1)
    }

    /// A boolean attribute, or `default` when absent.
    pub fn bool_or(&self, key: &str, default: bool) -> bool {
        self.get(key).and_then(Attr::as_bool).unwrap_or(default)
    }

    /// An integer attribute, or `default` when absent.
    pub fn int_or(&self, key: &str, default: i64) -> i64 {
        self.get(key).and_then(Attr::as_int).unwrap_or(default)
    }

    /// A float attribute, or `default` when absent.
    pub fn float_or(&self, key: &str, default: f64) -> f64 {
        self.get(key).and_then(Attr::as_float).unwrap_or(default)
    }

    /// A string attribute, or `default` when absent.
    pub fn str_or<'a>(&'a self, key: &str, default: &'a str) -> &'a str {
        self.get(key).and_then(Attr::as_str).unwrap_or(default)
    }

    /// An integer-list attribute, if present and well-formed.
    pub fn ints(&self, key: &str) -> Option<Vec<i64>> {
        self.get(key).and_then(Attr::as_ints)
    }

    /// Whether there are no attributes.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Iterates over `(key, value)` in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Attr)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v))
    }
}

/// A constant operand written in place, as in `ReduceMean(%5, (0, 1))` or `Mul(%3, 0.5)`.
///
/// A `Float` or `Int` constant used where a tensor is expected acts as a rank-0 tensor of the
/// other operands' element type.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Const {
    /// An integer, type `<Int64>`.
    Int(i64),
    /// A float, type `<Float32>`.
    Float(f64),
    /// A boolean, type `<Bool>`.
    Bool(bool),
    /// A tuple of integers, type `<Tuple[Int64*N]>` (shapes, axes, slice bounds).
    Ints(Vec<i64>),
}

impl Const {
    /// The integer tuple (a single integer reads as a one-element tuple).
    pub fn as_ints(&self) -> Option<Vec<i64>> {
        match self {
            Const::Ints(v) => Some(v.clone()),
            Const::Int(i) => Some(vec![*i]),
            _ => None,
        }
    }

    /// The integer, if this is one.
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Const::Int(i) => Some(*i),
            _ => None,
        }
    }

    /// The number as a float.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Const::Float(f) => Some(*f),
            Const::Int(i) => Some(*i as f64),
            Const::Bool(b) => Some(if *b { 1.0 } else { 0.0 }),
            Const::Ints(_) => None,
        }
    }

    /// The type as printed in a node's type line: `<Int64>`, `<Float32>`, `<Bool>`,
    /// `<Tuple[Int64*2]>`.
    pub fn type_text(&self) -> String {
        match self {
            Const::Int(_) => "<Int64>".into(),
            Const::Float(_) => "<Float32>".into(),
            Const::Bool(_) => "<Bool>".into(),
            Const::Ints(v) => format!("<Tuple[Int64*{}]>", v.len()),
        }
    }
}

/// A parallel strategy: for each input, the number of slices of each dimension.
/// MindSpore's `((2, 4), (4, 1))`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Strategy(pub Vec<Vec<i64>>);

impl Strategy {
    /// Number of devices the strategy uses for input `i` (product of its splits).
    pub fn devices_of_input(&self, i: usize) -> i64 {
        self.0.get(i).map(|d| d.iter().product()).unwrap_or(1)
    }
}

impl std::fmt::Display for Strategy {
    /// Prints `((2, 4), (4, 1))`; one input prints `((2, 4))`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("(")?;
        for (i, dims) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            f.write_str("(")?;
            for (j, d) in dims.iter().enumerate() {
                if j > 0 {
                    f.write_str(", ")?;
                }
                write!(f, "{d}")?;
            }
            f.write_str(")")?;
        }
        f.write_str(")")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strategy_display() {
        assert_eq!(
            Strategy(vec![vec![2, 4], vec![4, 1]]).to_string(),
            "((2, 4), (4, 1))"
        );
        assert_eq!(Strategy(vec![vec![2, 4]]).to_string(), "((2, 4))");
    }

    #[test]
    fn attrs_keep_order_and_replace() {
        let mut a = Attrs::new()
            .with("b", Attr::Int(1))
            .with("a", Attr::Bool(true));
        a.set("b", Attr::Int(2));
        let keys: Vec<_> = a.iter().map(|(k, _)| k).collect();
        assert_eq!(keys, ["b", "a"]);
        assert_eq!(a.int_or("b", 0), 2);
        assert!(a.bool_or("a", false));
        assert_eq!(a.float_or("missing", 0.5), 0.5);
    }
}
