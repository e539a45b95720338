//! The text emitter the op lowerings share: value names, tensor types, `tensor.empty` +
//! `linalg.fill`, and `linalg.generic` with its indexing maps and scalar body.

use shardc_ir::{DType, TensorType};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// A tensor value in the emitted function: its SSA name (with `%`) and its type.
#[derive(Clone, Debug, PartialEq)]
pub struct Val {
    /// `%n3`, `%p0`, `%n5#1`.
    pub name: String,
    /// Its tensor type.
    pub ty: TensorType,
}

/// An input of a `linalg.generic`: the value and the loop dims indexing its dimensions.
pub struct GenericInput<'a> {
    /// The value.
    pub val: &'a Val,
    /// For each of its dimensions, the loop dim indexing it.
    pub dims: Vec<usize>,
}

/// The MLIR element type of a dtype.
pub fn elem(d: DType) -> &'static str {
    match d {
        DType::Float32 => "f32",
        DType::Float64 => "f64",
        DType::Float16 => "f16",
        DType::BFloat16 => "bf16",
        DType::Int32 => "i32",
        DType::Int64 => "i64",
        DType::Bool => "i1",
    }
}

/// `tensor<8x16xf32>`, `tensor<f32>` for a rank-0 tensor.
pub fn tensor_ty(t: &TensorType) -> String {
    let mut s = String::from("tensor<");
    for d in &t.shape {
        let _ = write!(s, "{d}x");
    }
    s.push_str(elem(t.dtype));
    s.push('>');
    s
}

/// A float literal MLIR reads back exactly (`1.000000e+00` style, or hex for infinities).
pub fn float_lit(v: f64, d: DType) -> String {
    if v.is_infinite() {
        let neg = v < 0.0;
        return match (d, neg) {
            (DType::Float64, false) => "0x7FF0000000000000".into(),
            (DType::Float64, true) => "0xFFF0000000000000".into(),
            (DType::Float16, false) => "0x7C00".into(),
            (DType::Float16, true) => "0xFC00".into(),
            (DType::BFloat16, false) => "0x7F80".into(),
            (DType::BFloat16, true) => "0xFF80".into(),
            (_, false) => "0x7F800000".into(),
            (_, true) => "0xFF800000".into(),
        };
    }
    if v.is_nan() {
        return match d {
            DType::Float64 => "0x7FF8000000000000".into(),
            _ => "0x7FC00000".into(),
        };
    }
    let s = format!("{v:e}");
    match s.split_once('e') {
        Some((m, e)) if !m.contains('.') => format!("{m}.0e{e}"),
        _ => s,
    }
}

/// Builds the body of one `func.func`: SSA names, lines, and the private external functions
/// it calls.
#[derive(Default)]
pub struct Emitter {
    /// The body lines, indented.
    pub lines: Vec<String>,
    tmp: usize,
    /// External declarations by symbol name: the signature text.
    pub externs: BTreeMap<String, String>,
}

impl Emitter {
    /// A fresh SSA name `%t{k}`.
    pub fn fresh(&mut self) -> String {
        self.tmp += 1;
        format!("%t{}", self.tmp)
    }

    /// Appends a line to the body.
    pub fn line(&mut self, s: String) {
        self.lines.push(format!("    {s}"));
    }

    /// `tensor.empty` of `ty`.
    pub fn empty(&mut self, ty: &TensorType) -> Val {
        let name = self.fresh();
        self.line(format!("{name} = tensor.empty() : {}", tensor_ty(ty)));
        Val {
            name,
            ty: ty.clone(),
        }
    }

    /// A scalar `arith.constant` of dtype `d`.
    pub fn scalar(&mut self, v: f64, d: DType) -> String {
        let name = self.fresh();
        let lit = if d.is_float() {
            float_lit(v, d)
        } else if d == DType::Bool {
            if v != 0.0 { "true" } else { "false" }.to_string()
        } else {
            format!("{}", v as i64)
        };
        self.line(format!("{name} = arith.constant {lit} : {}", elem(d)));
        name
    }

    /// A tensor of `ty` filled with `v` (`tensor.empty` + `linalg.fill`).
    pub fn filled(&mut self, v: f64, ty: &TensorType) -> Val {
        let c = self.scalar(v, ty.dtype);
        let e = self.empty(ty);
        let name = self.fresh();
        let t = tensor_ty(ty);
        self.line(format!(
            "{name} = linalg.fill ins({c} : {}) outs({} : {t}) -> {t}",
            elem(ty.dtype),
            e.name
        ));
        Val {
            name,
            ty: ty.clone(),
        }
    }

    /// A `linalg.generic` over `loops` loop dims (`reduction` marks the reduction ones) with
    /// `inputs`, writing `init` (indexed by `out_dims`). `body` gets the block argument names
    /// (inputs, then the output's current value) and an emitter of body lines, and returns
    /// the yielded scalar. The result is named `result` if given.
    #[allow(clippy::too_many_arguments)]
    pub fn generic(
        &mut self,
        result: Option<String>,
        loops: usize,
        reduction: &[usize],
        inputs: &[GenericInput<'_>],
        init: &Val,
        out_dims: &[usize],
        body: impl FnOnce(&[String], &mut Body) -> String,
    ) -> Val {
        let dims: Vec<String> = (0..loops).map(|d| format!("d{d}")).collect();
        let map = |idx: &[usize]| {
            let r: Vec<String> = idx.iter().map(|&i| format!("d{i}")).collect();
            format!("affine_map<({}) -> ({})>", dims.join(", "), r.join(", "))
        };
        let mut maps: Vec<String> = inputs.iter().map(|i| map(&i.dims)).collect();
        maps.push(map(out_dims));
        let iters: Vec<&str> = (0..loops)
            .map(|d| {
                if reduction.contains(&d) {
                    "\"reduction\""
                } else {
                    "\"parallel\""
                }
            })
            .collect();
        let name = result.unwrap_or_else(|| self.fresh());
        let ins_names: Vec<&str> = inputs.iter().map(|i| i.val.name.as_str()).collect();
        let ins_tys: Vec<String> = inputs.iter().map(|i| tensor_ty(&i.val.ty)).collect();
        let out_t = tensor_ty(&init.ty);
        let ins = if inputs.is_empty() {
            String::new()
        } else {
            format!("ins({} : {}) ", ins_names.join(", "), ins_tys.join(", "))
        };
        self.line(format!(
            "{name} = linalg.generic {{indexing_maps = [{}], iterator_types = [{}]}} {ins}outs({} : {out_t}) {{",
            maps.join(", "),
            iters.join(", "),
            init.name
        ));
        let args: Vec<String> = (0..=inputs.len()).map(|k| format!("%b{k}")).collect();
        let arg_decls: Vec<String> = inputs
            .iter()
            .map(|i| elem(i.val.ty.dtype))
            .chain(std::iter::once(elem(init.ty.dtype)))
            .zip(&args)
            .map(|(t, a)| format!("{a}: {t}"))
            .collect();
        self.lines
            .push(format!("    ^bb0({}):", arg_decls.join(", ")));
        let mut b = Body::new();
        let y = body(&args, &mut b);
        for l in b.lines {
            self.lines.push(format!("      {l}"));
        }
        self.lines
            .push(format!("      linalg.yield {y} : {}", elem(init.ty.dtype)));
        self.lines.push(format!("    }} -> {out_t}"));
        Val {
            name,
            ty: init.ty.clone(),
        }
    }
}

/// The scalar body of a `linalg.generic` being written.
#[derive(Default)]
pub struct Body {
    /// Its lines.
    pub lines: Vec<String>,
    k: usize,
}

impl Body {
    /// An empty body.
    pub fn new() -> Body {
        Body::default()
    }

    /// Emits `%v = <text>` (the text carries its own types) and returns `%v`.
    pub fn raw(&mut self, text: &str) -> String {
        self.k += 1;
        let v = format!("%s{}", self.k);
        self.lines.push(format!("{v} = {text}"));
        v
    }

    /// Emits `%v = <op> : <ty>` and returns `%v`.
    pub fn op(&mut self, op: &str, ty: &str) -> String {
        self.k += 1;
        let v = format!("%s{}", self.k);
        self.lines.push(format!("{v} = {op} : {ty}"));
        v
    }

    /// A scalar constant.
    pub fn constant(&mut self, v: f64, d: DType) -> String {
        let lit = if d.is_float() {
            float_lit(v, d)
        } else {
            format!("{}", v as i64)
        };
        self.op(&format!("arith.constant {lit}"), elem(d))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_and_types() {
        assert_eq!(float_lit(1.0, DType::Float32), "1.0e0");
        assert_eq!(float_lit(0.5, DType::Float32), "5.0e-1");
        assert_eq!(float_lit(-2.25, DType::Float32), "-2.25e0");
        assert_eq!(float_lit(f64::NEG_INFINITY, DType::Float32), "0xFF800000");
        assert_eq!(
            tensor_ty(&TensorType::new(DType::Float32, vec![8, 16])),
            "tensor<8x16xf32>"
        );
        assert_eq!(tensor_ty(&TensorType::scalar(DType::Int64)), "tensor<i64>");
    }
}
