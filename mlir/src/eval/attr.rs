//! Reading attributes in the form MLIR prints them.

use super::affine::Map;
use super::ir::Elem;

/// Splits `s` at the commas outside brackets (`<>`, `()`, `[]`, `{}`).
pub fn split_top(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut cur = String::new();
    let mut prev = ' ';
    for c in s.chars() {
        match c {
            '<' | '(' | '[' | '{' => depth += 1,
            '>' if prev != '-' => depth -= 1,
            ')' | ']' | '}' => depth -= 1,
            _ => {}
        }
        if c == ',' && depth == 0 {
            out.push(cur.trim().to_string());
            cur.clear();
        } else {
            cur.push(c);
        }
        prev = c;
    }
    if !cur.trim().is_empty() {
        out.push(cur.trim().to_string());
    }
    out
}

/// The value before ` : type`.
fn strip_type(s: &str) -> &str {
    match s.rfind(" : ") {
        Some(i) => s[..i].trim(),
        None => s.trim(),
    }
}

/// An integer list: `array<i64: 1, 2>`, `array<i16>`, `[1, 2]`, `dense<[1, 2]> : ...`, or one
/// integer (`1 : index`).
pub fn ints(s: &str) -> Option<Vec<i64>> {
    let s = s.trim();
    if let Some(r) = s.strip_prefix("array<") {
        let r = r.strip_suffix('>')?;
        return match r.split_once(':') {
            Some((_, list)) => list.split(',').map(|x| x.trim().parse().ok()).collect(),
            None => Some(Vec::new()),
        };
    }
    if let Some(r) = s.strip_prefix("dense<") {
        let body = strip_type(r).strip_suffix('>')?;
        let body = body.trim_start_matches('[').trim_end_matches(']');
        if body.trim().is_empty() {
            return Some(Vec::new());
        }
        return body.split(',').map(|x| x.trim().parse().ok()).collect();
    }
    if let Some(r) = s.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
        if r.trim().is_empty() {
            return Some(Vec::new());
        }
        return split_top(r).iter().map(|x| int(x)).collect();
    }
    int(s).map(|v| vec![v])
}

/// One integer: `3`, `1 : index`, `true`.
pub fn int(s: &str) -> Option<i64> {
    match strip_type(s) {
        "true" => Some(1),
        "false" => Some(0),
        v => v.parse().ok(),
    }
}

/// A scalar literal of element type `e`: decimal, hex bit pattern, `true`/`false`.
pub fn scalar(s: &str, e: Elem) -> Option<f64> {
    let v = strip_type(s);
    match v {
        "true" => return Some(1.0),
        "false" => return Some(0.0),
        _ => {}
    }
    if let Some(h) = v.strip_prefix("0x") {
        let bits = u64::from_str_radix(h, 16).ok()?;
        return Some(match e {
            Elem::F32 => f64::from(f32::from_bits(u32::try_from(bits).ok()?)),
            Elem::F64 => f64::from_bits(bits),
            _ => bits as f64,
        });
    }
    v.parse::<f64>().ok()
}

/// A `dense<...>` literal's values (one for a splat) and whether it is a splat.
pub fn dense(s: &str, e: Elem) -> Option<(Vec<f64>, bool)> {
    let r = s.trim().strip_prefix("dense<")?;
    let body = strip_type(r).strip_suffix('>')?.trim();
    if !body.starts_with('[') {
        return Some((vec![scalar(body, e)?], true));
    }
    let flat: String = body.chars().filter(|&c| c != '[' && c != ']').collect();
    if flat.trim().is_empty() {
        return Some((Vec::new(), false));
    }
    let vals: Option<Vec<f64>> = flat.split(',').map(|x| scalar(x, e)).collect();
    Some((vals?, false))
}

/// `[affine_map<...>, ...]`.
pub fn maps(s: &str) -> Option<Vec<Map>> {
    let r = s.trim().strip_prefix('[')?.strip_suffix(']')?;
    split_top(r).iter().map(|m| Map::parse(m)).collect()
}

/// `[#linalg.iterator_type<parallel>, ...]`: whether each loop is a reduction.
pub fn iterators(s: &str) -> Option<Vec<bool>> {
    let r = s.trim().strip_prefix('[')?.strip_suffix(']')?;
    Some(
        split_top(r)
            .iter()
            .map(|x| x.contains("reduction"))
            .collect(),
    )
}

/// A shard reduction kind, printed in whatever wrapping (`sum` when absent).
pub fn reduction(s: Option<&str>) -> &'static str {
    let s = s.unwrap_or("sum");
    for k in ["product", "average", "max", "min", "sum"] {
        if s.contains(k) {
            return k;
        }
    }
    "unknown"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printed_attributes_read_back() {
        assert_eq!(
            ints("array<i64: 0, -9223372036854775808>"),
            Some(vec![0, i64::MIN])
        );
        assert_eq!(ints("array<i16>"), Some(vec![]));
        assert_eq!(ints("1 : index"), Some(vec![1]));
        assert_eq!(ints("[1, 2]"), Some(vec![1, 2]));
        assert_eq!(scalar("0.000000e+00 : f32", Elem::F32), Some(0.0));
        assert_eq!(
            scalar("0xFF800000 : f32", Elem::F32),
            Some(f64::NEG_INFINITY)
        );
        assert_eq!(
            dense("dense<[1, 2]> : tensor<2xi64>", Elem::I64),
            Some((vec![1.0, 2.0], false))
        );
        assert_eq!(
            dense("dense<2.5> : tensor<4xf32>", Elem::F32),
            Some((vec![2.5], true))
        );
        let m = maps("[affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0)>]").unwrap();
        assert_eq!(m.len(), 2);
        assert_eq!(
            iterators("[#linalg.iterator_type<parallel>, #linalg.iterator_type<reduction>]"),
            Some(vec![false, true])
        );
        assert_eq!(reduction(Some("#shard<partial max>")), "max");
    }
}
