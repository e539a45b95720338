//! How inference errors write what they name: operands, constants, integer tuples, shapes.

use shardc_ir::{Const, Graph, Operand, ShapeDisplay};

/// A short text for an operand: `%3`, `%para4_w2`, or the constant (`(0, 1)`, `0.5`).
pub fn operand_text(graph: &Graph, operand: &Operand) -> String {
    match operand {
        Operand::Node(n) => format!("%{}", n.index() + 1),
        Operand::Param(p) => match graph.params.get(p.index()) {
            Some(param) => format!("%para{}_{}", p.index() + 1, param.name),
            None => format!("%para{}", p.index() + 1),
        },
        Operand::Const(c) => const_text(c),
    }
}

/// A constant as written in the IR: `3`, `0.5`, `true`, `(0, 1)`.
pub fn const_text(c: &Const) -> String {
    match c {
        Const::Int(i) => i.to_string(),
        Const::Float(f) => format!("{f:?}"),
        Const::Bool(b) => b.to_string(),
        Const::Ints(v) => ints_text(v),
    }
}

/// Integers as a tuple: `(0, 1)`, `(3)`.
pub(crate) fn ints_text(v: &[i64]) -> String {
    let parts: Vec<String> = v.iter().map(i64::to_string).collect();
    format!("({})", parts.join(", "))
}

/// A shape as MindSpore prints it: `(8, 16)`.
pub(crate) fn sh(s: &[usize]) -> ShapeDisplay<'_> {
    ShapeDisplay(s)
}
