//! The text form of a graph: the grammar of MindSpore's IR dumps (`docs/ir-format.md`).
//!
//! [`print_graph`] writes a graph; [`parse_graph`] reads it back (and reads hand-written files
//! such as `models/quickstart.ir`). For every graph, `print(parse(print(g)))` equals
//! `print(g)`, and `parse(print(g))` equals `g`.
//!
//! # Printed form
//!
//! ```text
//! #IR entry      : @Net
//! #Total params  : 2
//!
//! %para1_x : <Tensor[Float32], (16, 32)>
//! %para2_w : <Ref[Tensor(F32)], (32, 16), ref_key=:w>  :  has_default  init: normal(sigma=0.01, seed=1)
//!
//! subgraph @Net(%para1_x, %para2_w) {
//!   %1(out) = MatMul(%para1_x, %para2_w) {instance name: matmul} primitive_attrs: {transpose_a: false, in_strategy: ((2, 4), (4, 1))} {in_strategy: ((2, 4), (4, 1))}
//!       : (<Tensor[Float32], (16, 32)>, <Ref[Tensor(F32)], (32, 16), ref_key=:w>) -> (<Tensor[Float32], (16, 16)>)
//!       # scope: (Default/network-WithLossCell/_backbone-Net)
//!   Return(%1)
//! }
//! ```
//!
//! Decisions the grammar leaves open, and how this module settles them:
//!
//! - **Types not yet inferred.** A node whose `ty` is the empty tuple `Type::Tuple(vec![])`
//!   ("not inferred yet") prints no type line; a parsed node without a type line gets that
//!   empty tuple. The parser never infers shapes: `shardc_passes::infer::infer_graph` fills
//!   them in. The operand types on the left of `->` are derived from the graph when printing
//!   and skipped when parsing (they only need balanced parentheses), so MindSpore's verbose
//!   annotations parse.
//! - **Tuple results** print as `(<Tuple[<Tensor[Float32], (8)>, <Tensor[Float32], (8)>]>)`.
//! - **Constants** in argument position: `3` (Int), `0.5` / `1e-5` / `inf` / `nan` (Float,
//!   always with a `.`, an exponent or one of those names), `true` (Bool), and any
//!   parenthesised list `(0, 1)`, `(5)`, `()` (Ints: in argument position parentheses always
//!   mean an integer tuple, so MindSpore's one-element `(5)` is unambiguous).
//! - **Attribute values**: `None`, `true`, integers, floats (as above), bare words for strings
//!   that read back as themselves, double-quoted strings with escapes (`\"`, `\\`, `\n`,
//!   `\t`, `\r`, `\u{7f}`) otherwise, `(a, b)` tuples (one element: `(a)`), `[a, b]` lists.
//!   Nesting deeper than [`MAX_NESTING`] is an error.
//! - **Strategies**: `in_strategy` / `out_strategy` keys (bare words) inside `primitive_attrs`
//!   or in the trailing `{in_strategy: ...}` set [`crate::Node::in_strategy`] /
//!   `out_strategy`; `None` means no strategy. An attribute really named `in_strategy` prints
//!   with a quoted key and stays an attribute.
//! - **Names**: node debug names (`%3(out)`) and instance names are written raw when they
//!   cannot be misread, quoted otherwise; parameter names likewise (`%para3_w`,
//!   `%para3_"odd name"`).
//! - **Comments**: under a node, the first `# scope: (X)` line sets the scope; every other `#`
//!   line goes to [`crate::Node::comments`] (text after `#` and one space). When the scope is
//!   empty but the first comment itself looks like a scope line, the printer writes
//!   `# scope: ()` first so that the round trip holds. Newlines in comments and scopes print as
//!   spaces. Comments outside nodes (the header) are ignored.
//! - **Weights without `init:`** (MindSpore dumps print only `has_default`) get
//!   [`crate::Init::Zeros`]; `requires_grad: false` after the init marks a weight autodiff
//!   skips.
//! - **MindSpore plumbing**: `%5(x) = Load(%para4_w2, U)` (or `Load($(@g:para4_w2), %para12_u)`)
//!   is an alias: later references to `%5` mean its first operand. Its other operands are not
//!   resolved, and its type line and comments are dropped. Monad parameters
//!   (`%para12_u : <UMonad>`, `<IOMonad>`) are read and ignored, in the subgraph's parameter
//!   list too.
//! - **Ids**: `%N` in a file may be any distinct numbers; nodes are numbered in order of
//!   appearance. Parameters listed in `subgraph @Net(...)` must be the declared ones, in order.

mod parse;
mod print;

pub use parse::{parse_graph, ParseError};
pub use print::print_graph;

/// The deepest nesting of attribute tuples and lists the text form reads and writes.
pub const MAX_NESTING: usize = 64;

/// Characters of a bare word: attribute words, numbers, `%` names, keys.
pub(crate) fn is_word_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-' | '+' | '/')
}

/// What a bare word in value position means.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Word {
    /// `None`.
    None,
    /// `true` / `false`.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
    /// Any other word: a string.
    Str,
}

/// Classifies a bare word (which must consist of word characters).
pub(crate) fn classify_word(w: &str) -> Word {
    match w {
        "None" => return Word::None,
        "true" => return Word::Bool(true),
        "false" => return Word::Bool(false),
        "inf" => return Word::Float(f64::INFINITY),
        "-inf" => return Word::Float(f64::NEG_INFINITY),
        "nan" => return Word::Float(f64::NAN),
        _ => {}
    }
    if let Ok(i) = w.parse::<i64>() {
        return Word::Int(i);
    }
    if w.contains(['.', 'e', 'E']) {
        // Only plain decimal forms: Rust also accepts "infinity" and friends, which we keep
        // as strings.
        let plain = w
            .chars()
            .all(|c| c.is_ascii_digit() || matches!(c, '.' | 'e' | 'E' | '-' | '+'));
        if plain {
            if let Ok(f) = w.parse::<f64>() {
                return Word::Float(f);
            }
        }
    }
    Word::Str
}

/// A float in a form that reads back exactly and always looks like a float.
pub(crate) fn format_float(f: f64) -> String {
    if f.is_nan() {
        "nan".to_string()
    } else if f == f64::INFINITY {
        "inf".to_string()
    } else if f == f64::NEG_INFINITY {
        "-inf".to_string()
    } else {
        // Debug prints the shortest representation that round-trips, always with a `.` or an
        // exponent (`1.0`, `0.01`, `1e-5`, `1e20`).
        format!("{f:?}")
    }
}

/// Whether `s` prints as a bare word in value position and reads back as the same string.
pub(crate) fn is_bare_string(s: &str) -> bool {
    !s.is_empty() && s.chars().all(is_word_char) && classify_word(s) == Word::Str
}

/// Whether `s` prints as a bare word where no value classification applies (keys, names).
pub(crate) fn is_bare_name(s: &str) -> bool {
    !s.is_empty() && s.chars().all(is_word_char)
}

/// A name where no value classification applies: bare when it is a word, quoted otherwise.
pub(crate) fn name_text(s: &str) -> String {
    if is_bare_name(s) {
        s.to_string()
    } else {
        quote(s)
    }
}

/// `s` as a double-quoted string with escapes.
pub(crate) fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_classify() {
        assert_eq!(classify_word("None"), Word::None);
        assert_eq!(classify_word("true"), Word::Bool(true));
        assert_eq!(classify_word("-3"), Word::Int(-3));
        assert_eq!(classify_word("1e-5"), Word::Float(1e-5));
        assert_eq!(classify_word("0.5"), Word::Float(0.5));
        assert_eq!(classify_word("sum"), Word::Str);
        assert_eq!(classify_word("4-6301172352641561019"), Word::Str);
        assert_eq!(classify_word("0-1-2-3"), Word::Str);
        assert_eq!(classify_word("infinity"), Word::Str);
        assert_eq!(classify_word("1.2.3"), Word::Str);
        assert_eq!(classify_word("e"), Word::Str);
    }

    #[test]
    fn floats_look_like_floats_and_round_trip() {
        for f in [
            1.0,
            0.01,
            1e-5,
            1e20,
            -0.0,
            123456.789,
            f64::MIN_POSITIVE,
            f64::MAX,
        ] {
            let s = format_float(f);
            match classify_word(&s) {
                Word::Float(g) => assert_eq!(g.to_bits(), f.to_bits(), "{s}"),
                other => panic!("{s} reads as {other:?}"),
            }
        }
        assert!(matches!(classify_word(&format_float(f64::NAN)), Word::Float(g) if g.is_nan()));
    }

    #[test]
    fn bare_strings() {
        assert!(is_bare_string("NCHW"));
        assert!(is_bare_string("4-6301172352641561019"));
        assert!(!is_bare_string("12"));
        assert!(!is_bare_string("true"));
        assert!(!is_bare_string("a b"));
        assert!(!is_bare_string(""));
        assert_eq!(quote("a\"b\\\n\u{7}"), "\"a\\\"b\\\\\\n\\u{7}\"");
    }
}
