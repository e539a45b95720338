//! Each ONNX op: folded on constants, mapped to shardc ops, or reported as unmapped.

use super::consts::{broadcast, check_size, code, dtype_of_code, numel, ConstT, Elem};
use super::importer::{tensor_value, Ctx, Importer, Val};
use crate::model::ImportError;
use crate::proto::onnx::{AttributeProto, NodeProto};
use shardc_compiler::builder::Value;
use shardc_ir::{geometry::slice_spec, Attr, Attrs, Const, DType, OpKind, Operand};
use std::f64::consts::FRAC_1_SQRT_2;

/// Every default-domain op the importer knows (folds, maps, or maps in some forms only).
pub(crate) const KNOWN: &[&str] = &[
    "Constant",
    "Shape",
    "Size",
    "Gather",
    "Unsqueeze",
    "Squeeze",
    "Concat",
    "ConstantOfShape",
    "Range",
    "Cast",
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Equal",
    "Where",
    "Slice",
    "Reshape",
    "Expand",
    "Less",
    "LessOrEqual",
    "Greater",
    "GreaterOrEqual",
    "And",
    "Or",
    "Not",
    "Min",
    "Max",
    "Conv",
    "BatchNormalization",
    "Gemm",
    "MatMul",
    "Relu",
    "Sigmoid",
    "Tanh",
    "Softmax",
    "LogSoftmax",
    "LayerNormalization",
    "Split",
    "Transpose",
    "Flatten",
    "ReduceMean",
    "ReduceSum",
    "ReduceMax",
    "Pow",
    "Sqrt",
    "Exp",
    "Log",
    "Neg",
    "MaxPool",
    "AveragePool",
    "GlobalAveragePool",
    "GlobalMaxPool",
    "Identity",
    "Dropout",
    "Gelu",
    "Erf",
];

/// What converting a node gave.
pub(crate) enum Outcome {
    /// The node's outputs, in order.
    Done(Vec<Val>),
    /// The node has no mapping in this form (why).
    Unmapped(String),
}

type R = Result<Outcome, ImportError>;

fn one(v: Val) -> R {
    Ok(Outcome::Done(vec![v]))
}

fn attr<'a>(n: &'a NodeProto, name: &str) -> Option<&'a AttributeProto> {
    n.attribute.iter().find(|a| a.name.as_deref() == Some(name))
}

fn attr_i(n: &NodeProto, name: &str, default: i64) -> i64 {
    attr(n, name).and_then(|a| a.i).unwrap_or(default)
}

fn attr_f(n: &NodeProto, name: &str, default: f64) -> f64 {
    attr(n, name).and_then(|a| a.f).map_or(default, f64::from)
}

fn attr_ints(n: &NodeProto, name: &str) -> Option<Vec<i64>> {
    attr(n, name).map(|a| a.ints.clone())
}

fn attr_s(n: &NodeProto, name: &str) -> Option<String> {
    attr(n, name)
        .and_then(|a| a.s.as_ref())
        .map(|s| String::from_utf8_lossy(s).into_owned())
}

/// An axis in `0..rank` (negative counts from the end).
fn norm_axis(cx: &Ctx, axis: i64, rank: usize) -> Result<usize, ImportError> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if (0..r).contains(&a) {
        Ok(a as usize)
    } else {
        Err(cx.err(format!("axis {axis} is out of range for rank {rank}")))
    }
}

fn ints(v: &[i64]) -> Operand {
    Operand::Const(Const::Ints(v.to_vec()))
}

fn dims(v: &[usize]) -> Vec<i64> {
    v.iter().map(|&d| d as i64).collect()
}

/// The shape of a value (graph tensor or constant).
fn shape_of(imp: &Importer, cx: &Ctx, v: &Val) -> Result<Vec<usize>, ImportError> {
    match v {
        Val::T(t) => imp.shape(cx, *t),
        Val::C(c) => Ok(c.shape.clone()),
        Val::Missing => Err(cx.err("an input was not mapped")),
    }
}

/// Converts one node.
pub(crate) fn convert(imp: &mut Importer, cx: &Ctx) -> R {
    let n = cx.node;
    match cx.op.as_str() {
        "Constant" => constant(cx),
        "Identity" => identity(imp, cx),
        "Dropout" => {
            if n.output.get(1).is_some_and(|o| !o.is_empty()) {
                return Err(cx.err("the mask output of Dropout is used (only inference is read)"));
            }
            one(imp.req(cx, 0)?)
        }
        "Shape" => {
            let s = dims(&shape_of(imp, cx, &imp.req(cx, 0)?)?);
            let r = s.len() as i64;
            let clampi = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
            let start = clampi(attr_i(n, "start", 0));
            let end = clampi(attr_i(n, "end", r));
            one(Val::C(ConstT::ints(
                s.get(start..end.max(start)).unwrap_or(&[]),
            )))
        }
        "Size" => {
            let s = shape_of(imp, cx, &imp.req(cx, 0)?)?;
            one(Val::C(ConstT::new(
                code::INT64,
                vec![],
                vec![numel(&s) as f64],
            )))
        }
        "ConstantOfShape" => {
            let s = imp.konst(cx, 0, "the shape")?;
            let shape: Vec<usize> = s.as_i64().iter().map(|&d| d.max(0) as usize).collect();
            let (c, v) = match attr(n, "value").and_then(|a| a.t.as_ref()) {
                Some(t) => {
                    let v = tensor_value(t).map_err(|e| cx.err(format!("attribute value: {e}")))?;
                    (v.code, v.data.first().copied().unwrap_or(0.0))
                }
                None => (code::FLOAT, 0.0),
            };
            check_size(&shape).map_err(|e| cx.err(e))?;
            let len = numel(&shape);
            one(Val::C(ConstT::new(c, shape, vec![v; len])))
        }
        "Range" => {
            let start = imp.konst(cx, 0, "start")?;
            let limit = imp.konst(cx, 1, "limit")?;
            let delta = imp.konst(cx, 2, "delta")?;
            let (s, l, d) = match (start.scalar(), limit.scalar(), delta.scalar()) {
                (Some(s), Some(l), Some(d)) if d != 0.0 => (s, l, d),
                _ => return Err(cx.err("start, limit and delta must be scalars, delta non-zero")),
            };
            let count = ((l - s) / d).ceil().max(0.0) as usize;
            check_size(&[count]).map_err(|e| cx.err(e))?;
            let e = start.elem();
            let data = (0..count).map(|i| e.round(s + i as f64 * d)).collect();
            one(Val::C(ConstT::new(start.code, vec![count], data)))
        }
        "Cast" => cast(imp, cx),
        "Relu" | "Sigmoid" | "Tanh" | "Sqrt" | "Exp" | "Log" | "Neg" | "Not" | "Erf" => {
            unary(imp, cx)
        }
        "Add" | "Sub" | "Mul" | "Div" => arith(imp, cx),
        "Equal" | "Less" | "LessOrEqual" | "Greater" | "GreaterOrEqual" | "And" | "Or" | "Min"
        | "Max" => compare(imp, cx),
        "Where" => where_(imp, cx),
        "Pow" => pow(imp, cx),
        "Expand" => expand(imp, cx),
        "Reshape" => {
            let x = imp.req(cx, 0)?;
            let xs = shape_of(imp, cx, &x)?;
            let target = imp.konst(cx, 1, "the target shape")?.as_i64();
            let out = reshape_target(cx, &xs, &target, attr_i(n, "allowzero", 0) != 0)?;
            reshape_val(imp, cx, &x, &out, true).map(|v| Outcome::Done(vec![v]))
        }
        "Flatten" => {
            let x = imp.req(cx, 0)?;
            let xs = shape_of(imp, cx, &x)?;
            let r = xs.len() as i64;
            let a = attr_i(n, "axis", 1);
            let a = if a < 0 { a + r } else { a };
            if !(0..=r).contains(&a) {
                return Err(cx.err(format!(
                    "axis {} is out of range for rank {r}",
                    attr_i(n, "axis", 1)
                )));
            }
            let out = vec![numel(&xs[..a as usize]), numel(&xs[a as usize..])];
            reshape_val(imp, cx, &x, &out, true).map(|v| Outcome::Done(vec![v]))
        }
        "Squeeze" | "Unsqueeze" => squeeze(imp, cx),
        "Transpose" => {
            let x = imp.req(cx, 0)?;
            let r = shape_of(imp, cx, &x)?.len();
            let perm: Vec<i64> =
                attr_ints(n, "perm").unwrap_or_else(|| (0..r as i64).rev().collect());
            let mut p = Vec::with_capacity(r);
            for &a in &perm {
                p.push(norm_axis(cx, a, r)?);
            }
            let mut sorted = p.clone();
            sorted.sort_unstable();
            if sorted != (0..r).collect::<Vec<_>>() {
                return Err(cx.err(format!(
                    "perm {perm:?} is not a permutation of the {r} axes"
                )));
            }
            match x {
                Val::C(c) => one(Val::C(c.transpose(&p))),
                _ => {
                    let t = imp.as_tensor(cx, &x, &n.input[0], true)?;
                    let v = imp.op(
                        cx,
                        OpKind::Transpose,
                        &[t.into(), ints(&dims(&p))],
                        Attrs::new(),
                        true,
                    )?;
                    one(Val::T(v))
                }
            }
        }
        "Gather" => gather(imp, cx),
        "Concat" => concat(imp, cx),
        "Split" => split(imp, cx),
        "Slice" => slice(imp, cx),
        "Conv" => conv(imp, cx),
        "BatchNormalization" => batch_norm(imp, cx),
        "Gemm" => gemm(imp, cx),
        "MatMul" => matmul(imp, cx),
        "Softmax" | "LogSoftmax" => {
            let x = imp.tensor(cx, 0, true)?;
            let kind = if cx.op == "Softmax" {
                OpKind::Softmax
            } else {
                OpKind::LogSoftmax
            };
            let attrs = Attrs::new().with("axis", Attr::Int(attr_i(n, "axis", -1)));
            one(Val::T(imp.op(cx, kind, &[x.into()], attrs, true)?))
        }
        "LayerNormalization" => layer_norm(imp, cx),
        "ReduceMean" | "ReduceSum" | "ReduceMax" => reduce(imp, cx),
        "MaxPool" | "AveragePool" => pool(imp, cx),
        "GlobalAveragePool" | "GlobalMaxPool" => {
            let x = imp.tensor(cx, 0, true)?;
            let r = imp.shape(cx, x)?.len();
            let kind = if cx.op == "GlobalAveragePool" {
                OpKind::ReduceMean
            } else {
                OpKind::ReduceMax
            };
            let axes: Vec<i64> = (2..r as i64).collect();
            let attrs = Attrs::new().with("keep_dims", Attr::Bool(true));
            one(Val::T(imp.op(
                cx,
                kind,
                &[x.into(), ints(&axes)],
                attrs,
                true,
            )?))
        }
        "Gelu" => {
            let approx = attr_s(n, "approximate").unwrap_or_else(|| "none".into());
            let x = imp.tensor(cx, 0, true)?;
            if approx == "none" {
                // The exact GeLU, x/2 * (1 + erf(x / sqrt(2))), of shardc's ops.
                let c = |v: f64| Operand::Const(Const::Float(v));
                let a = Attrs::new;
                let s = imp.op(cx, OpKind::Mul, &[x.into(), c(FRAC_1_SQRT_2)], a(), false)?;
                let e = imp.op(cx, OpKind::Erf, &[s.into()], a(), false)?;
                let p = imp.op(cx, OpKind::Add, &[e.into(), c(1.0)], a(), false)?;
                let h = imp.op(cx, OpKind::Mul, &[x.into(), c(0.5)], a(), false)?;
                return one(Val::T(imp.op(
                    cx,
                    OpKind::Mul,
                    &[h.into(), p.into()],
                    a(),
                    true,
                )?));
            }
            if approx != "tanh" {
                return Ok(Outcome::Unmapped(format!(
                    "approximate=\"{approx}\" is neither \"none\" nor \"tanh\""
                )));
            }
            one(Val::T(imp.op(
                cx,
                OpKind::GeLU,
                &[x.into()],
                Attrs::new(),
                true,
            )?))
        }
        other => Ok(Outcome::Unmapped(format!("{other} is not handled"))),
    }
}

fn constant(cx: &Ctx) -> R {
    let n = cx.node;
    let a = n
        .attribute
        .first()
        .ok_or_else(|| cx.err("a Constant without a value"))?;
    let c = match a.name.as_deref().unwrap_or("") {
        "value" => {
            let t =
                a.t.as_ref()
                    .ok_or_else(|| cx.err("attribute value holds no tensor"))?;
            tensor_value(t).map_err(|e| cx.err(format!("attribute value: {e}")))?
        }
        "value_float" => ConstT::new(code::FLOAT, vec![], vec![f64::from(a.f.unwrap_or(0.0))]),
        "value_floats" => ConstT::new(
            code::FLOAT,
            vec![a.floats.len()],
            a.floats.iter().map(|&v| f64::from(v)).collect(),
        ),
        "value_int" => ConstT::new(code::INT64, vec![], vec![a.i.unwrap_or(0) as f64]),
        "value_ints" => ConstT::ints(&a.ints),
        other => return Err(cx.err(format!("Constant attribute `{other}` is not supported"))),
    };
    one(Val::C(c))
}

fn identity(imp: &mut Importer, cx: &Ctx) -> R {
    match imp.req(cx, 0)? {
        // An initializer under another name (the exporter's deduplication of equal values):
        // a weight of its own, so that the model's parameters stay apart.
        Val::C(c) if c.origin.is_some() => {
            let mut c = c.clone();
            c.origin = cx.node.output.first().cloned();
            one(Val::C(c))
        }
        v => one(v),
    }
}

fn cast(imp: &mut Importer, cx: &Ctx) -> R {
    let to = attr_i(cx.node, "to", 0) as i32;
    match imp.req(cx, 0)? {
        Val::C(c) => {
            if Elem::of_code(to).is_none() {
                return Err(cx.err(format!("cast to element type {to} is not supported")));
            }
            one(Val::C(c.cast(to)))
        }
        x => {
            let t = imp.as_tensor(cx, &x, &cx.node.input[0], true)?;
            let dt = dtype_of_code(to)
                .ok_or_else(|| cx.err(format!("cast to element type {to} is not supported")))?;
            if imp.dtype(cx, t)? == dt {
                return one(Val::T(t));
            }
            let attrs = Attrs::new().with("dst_type", Attr::Str(dt.name().to_string()));
            one(Val::T(imp.op(
                cx,
                OpKind::Cast,
                &[t.into()],
                attrs,
                true,
            )?))
        }
    }
}

fn unary(imp: &mut Importer, cx: &Ctx) -> R {
    let x = imp.req(cx, 0)?;
    if let Val::C(c) = &x {
        let f: fn(f64) -> f64 = match cx.op.as_str() {
            "Relu" => |v| v.max(0.0),
            "Sigmoid" => |v| 1.0 / (1.0 + (-v).exp()),
            "Tanh" => f64::tanh,
            "Sqrt" => f64::sqrt,
            "Exp" => f64::exp,
            "Log" => f64::ln,
            "Neg" => |v| -v,
            "Erf" => libm::erf,
            _ => |v| f64::from(u8::from(v == 0.0)),
        };
        return one(Val::C(c.map(f)));
    }
    let kind = match cx.op.as_str() {
        "Relu" => OpKind::ReLU,
        "Sigmoid" => OpKind::Sigmoid,
        "Tanh" => OpKind::Tanh,
        "Sqrt" => OpKind::Sqrt,
        "Exp" => OpKind::Exp,
        "Log" => OpKind::Log,
        "Neg" => OpKind::Neg,
        "Erf" => OpKind::Erf,
        other => return Ok(Outcome::Unmapped(format!("{other} of a computed tensor"))),
    };
    let t = imp.as_tensor(cx, &x, &cx.node.input[0], true)?;
    one(Val::T(imp.op(cx, kind, &[t.into()], Attrs::new(), true)?))
}

/// A one-element float constant that broadcasts into `x` without changing its shape.
fn scalar_for(imp: &Importer, cx: &Ctx, c: &ConstT, x: Value) -> Result<Option<f64>, ImportError> {
    let xs = imp.shape(cx, x)?;
    let float = imp.dtype(cx, x)?.is_float();
    Ok(match c.scalar() {
        Some(v) if c.shape.len() <= xs.len() && float && c.elem().is_float() => Some(v),
        _ => None,
    })
}

fn arith(imp: &mut Importer, cx: &Ctx) -> R {
    let a = imp.req(cx, 0)?;
    let b = imp.req(cx, 1)?;
    let op = cx.op.as_str();
    if let (Val::C(x), Val::C(y)) = (&a, &b) {
        let f: fn(f64, f64) -> f64 = match op {
            "Add" => |p, q| p + q,
            "Sub" => |p, q| p - q,
            "Mul" => |p, q| p * q,
            _ => |p, q| p / q,
        };
        return ConstT::zip(x, y, x.code, f)
            .map(|c| Outcome::Done(vec![Val::C(c)]))
            .map_err(|e| cx.err(e));
    }
    let kind = match op {
        "Add" => OpKind::Add,
        "Sub" => OpKind::Sub,
        "Mul" => OpKind::Mul,
        _ => OpKind::RealDiv,
    };
    let scalar = |v: f64| Operand::Const(Const::Float(v));
    match (&a, &b) {
        (Val::T(x), Val::C(c)) => {
            if let Some(v) = scalar_for(imp, cx, c, *x)? {
                // x - c is x + (-c) exactly.
                let (k, v) = if kind == OpKind::Sub {
                    (OpKind::Add, -v)
                } else {
                    (kind, v)
                };
                return one(Val::T(imp.op(
                    cx,
                    k,
                    &[(*x).into(), scalar(v)],
                    Attrs::new(),
                    true,
                )?));
            }
        }
        (Val::C(c), Val::T(x)) => {
            if let Some(v) = scalar_for(imp, cx, c, *x)? {
                match kind {
                    OpKind::Add | OpKind::Mul => {
                        return one(Val::T(imp.op(
                            cx,
                            kind,
                            &[(*x).into(), scalar(v)],
                            Attrs::new(),
                            true,
                        )?));
                    }
                    OpKind::Sub => {
                        // c - x is (-x) + c exactly.
                        let neg = imp.op(cx, OpKind::Neg, &[(*x).into()], Attrs::new(), false)?;
                        return one(Val::T(imp.op(
                            cx,
                            OpKind::Add,
                            &[neg.into(), scalar(v)],
                            Attrs::new(),
                            true,
                        )?));
                    }
                    _ => {}
                }
            }
        }
        _ => {}
    }
    let ta = imp.as_tensor(cx, &a, &cx.node.input[0], true)?;
    let tb = imp.as_tensor(cx, &b, &cx.node.input[1], true)?;
    one(Val::T(imp.op(
        cx,
        kind,
        &[ta.into(), tb.into()],
        Attrs::new(),
        true,
    )?))
}

fn compare(imp: &mut Importer, cx: &Ctx) -> R {
    let a = imp.req(cx, 0)?;
    let b = imp.req(cx, 1)?;
    let op = cx.op.as_str();
    if let (Val::C(x), Val::C(y)) = (&a, &b) {
        let (f, code): (fn(f64, f64) -> f64, i32) = match op {
            "Equal" => (|p, q| f64::from(u8::from(p == q)), code::BOOL),
            "Less" => (|p, q| f64::from(u8::from(p < q)), code::BOOL),
            "LessOrEqual" => (|p, q| f64::from(u8::from(p <= q)), code::BOOL),
            "Greater" => (|p, q| f64::from(u8::from(p > q)), code::BOOL),
            "GreaterOrEqual" => (|p, q| f64::from(u8::from(p >= q)), code::BOOL),
            "And" => (|p, q| f64::from(u8::from(p != 0.0 && q != 0.0)), code::BOOL),
            "Or" => (|p, q| f64::from(u8::from(p != 0.0 || q != 0.0)), code::BOOL),
            "Min" => (f64::min, x.code),
            _ => (f64::max, x.code),
        };
        let mut acc = ConstT::zip(x, y, code, f).map_err(|e| cx.err(e))?;
        // Min and Max are variadic.
        for i in 2..cx.node.input.len() {
            let z = imp.konst(cx, i, "operand")?;
            acc = ConstT::zip(&acc, &z, code, f).map_err(|e| cx.err(e))?;
        }
        return one(Val::C(acc));
    }
    if op != "Equal" {
        return Ok(Outcome::Unmapped(format!("{op} of computed tensors")));
    }
    let ta = imp.as_tensor(cx, &a, &cx.node.input[0], false)?;
    let tb = imp.as_tensor(cx, &b, &cx.node.input[1], false)?;
    one(Val::T(imp.op(
        cx,
        OpKind::Equal,
        &[ta.into(), tb.into()],
        Attrs::new(),
        true,
    )?))
}

/// `Where(cond, x, y)`: folded when all are constants; with a constant condition rewritten
/// exactly as `x * c + y'` (or the mirror image), where `c` is the condition as 0/1 and
/// `y'` is `y` where the condition is false and 0 where it is true (so a `-inf` or `min`
/// fill is never multiplied, and every element is either `x + 0` or `0 + y`).
fn where_(imp: &mut Importer, cx: &Ctx) -> R {
    let c = imp.req(cx, 0)?;
    let x = imp.req(cx, 1)?;
    let y = imp.req(cx, 2)?;
    let Val::C(cond) = c else {
        return Ok(Outcome::Unmapped(
            "a condition computed from the model's inputs".into(),
        ));
    };
    if let (Val::C(a), Val::C(b)) = (&x, &y) {
        return ConstT::select(&cond, a, b)
            .map(|c| Outcome::Done(vec![Val::C(c)]))
            .map_err(|e| cx.err(e));
    }
    let out = cx.node.output.first().cloned().unwrap_or_default();
    let xs = shape_of(imp, cx, &x)?;
    let ys = shape_of(imp, cx, &y)?;
    broadcast(&[&cond.shape, &xs, &ys]).map_err(|e| cx.err(e))?;
    let dtype_code = match (&x, &y) {
        (Val::T(t), _) | (_, Val::T(t)) => match imp.dtype(cx, *t)? {
            DType::Float32 => code::FLOAT,
            DType::Float64 => code::DOUBLE,
            other => return Err(cx.err(format!("Where on {other:?} tensors is not supported"))),
        },
        _ => code::FLOAT,
    };
    let ones = ConstT::new(dtype_code, vec![], vec![1.0]);
    let zeros = ConstT::new(dtype_code, vec![], vec![0.0]);
    let mask = ConstT::select(&cond, &ones, &zeros).map_err(|e| cx.err(e))?;
    let not_mask = ConstT::select(&cond, &zeros, &ones).map_err(|e| cx.err(e))?;
    // The term of one side: a tensor times its mask, or a constant already masked.
    let term = |imp: &mut Importer,
                v: &Val,
                m: &ConstT,
                pick_when: bool,
                tag: &str|
     -> Result<Value, ImportError> {
        match v {
            Val::C(k) => {
                let (a, b) = if pick_when { (k, &zeros) } else { (&zeros, k) };
                let masked = ConstT::select(&cond, a, b)
                    .map_err(|e| cx.err(e))?
                    .cast(dtype_code);
                imp.materialize(&format!("{out}.{tag}"), &masked, false)
                    .map_err(|e| cx.build(e))
            }
            other => {
                let t = imp.as_tensor(cx, other, tag, true)?;
                let mw = imp
                    .materialize(&format!("{out}.{tag}_mask"), m, false)
                    .map_err(|e| cx.build(e))?;
                imp.op(cx, OpKind::Mul, &[t.into(), mw.into()], Attrs::new(), false)
            }
        }
    };
    let tx = term(imp, &x, &mask, true, "x")?;
    let ty = term(imp, &y, &not_mask, false, "y")?;
    one(Val::T(imp.op(
        cx,
        OpKind::Add,
        &[tx.into(), ty.into()],
        Attrs::new(),
        true,
    )?))
}

fn pow(imp: &mut Importer, cx: &Ctx) -> R {
    let x = imp.req(cx, 0)?;
    let Val::C(e) = imp.req(cx, 1)? else {
        return Ok(Outcome::Unmapped(
            "an exponent computed from the model's inputs".into(),
        ));
    };
    if let Val::C(b) = &x {
        return ConstT::zip(b, &e, b.code, f64::powf)
            .map(|c| Outcome::Done(vec![Val::C(c)]))
            .map_err(|er| cx.err(er));
    }
    let Some(p) = e.scalar() else {
        return Ok(Outcome::Unmapped(format!(
            "exponent of shape {:?}",
            e.shape
        )));
    };
    let t = imp.as_tensor(cx, &x, &cx.node.input[0], true)?;
    let v = if p == 2.0 {
        imp.op(cx, OpKind::Square, &[t.into()], Attrs::new(), true)?
    } else if p == 0.5 {
        imp.op(cx, OpKind::Sqrt, &[t.into()], Attrs::new(), true)?
    } else if p == 1.0 {
        t
    } else if p == 3.0 {
        let sq = imp.op(cx, OpKind::Mul, &[t.into(), t.into()], Attrs::new(), false)?;
        imp.op(cx, OpKind::Mul, &[sq.into(), t.into()], Attrs::new(), true)?
    } else {
        return Ok(Outcome::Unmapped(format!(
            "exponent {p} (shardc maps 0.5, 1, 2 and 3)"
        )));
    };
    one(Val::T(v))
}

fn expand(imp: &mut Importer, cx: &Ctx) -> R {
    let x = imp.req(cx, 0)?;
    let target: Vec<usize> = imp
        .konst(cx, 1, "the shape")?
        .as_i64()
        .iter()
        .map(|&d| d.max(0) as usize)
        .collect();
    if let Val::C(c) = &x {
        return c
            .expand(&target)
            .map(|c| Outcome::Done(vec![Val::C(c)]))
            .map_err(|e| cx.err(e));
    }
    let t = imp.as_tensor(cx, &x, &cx.node.input[0], true)?;
    let xs = imp.shape(cx, t)?;
    let out = broadcast(&[&xs, &target]).map_err(|e| cx.err(e))?;
    if out == xs {
        return one(Val::T(t));
    }
    let mut padded = vec![1usize; out.len() - xs.len()];
    padded.extend_from_slice(&xs);
    let t = if padded != xs {
        imp.op(
            cx,
            OpKind::Reshape,
            &[t.into(), ints(&dims(&padded))],
            Attrs::new(),
            false,
        )?
    } else {
        t
    };
    one(Val::T(imp.op(
        cx,
        OpKind::BroadcastTo,
        &[t.into(), ints(&dims(&out))],
        Attrs::new(),
        true,
    )?))
}

/// Reshape's target with `0` (copy the input's dim, unless `allowzero`) and `-1` resolved.
pub(crate) fn reshape_target(
    cx: &Ctx,
    xs: &[usize],
    target: &[i64],
    allowzero: bool,
) -> Result<Vec<usize>, ImportError> {
    let mut out = Vec::with_capacity(target.len());
    let mut infer = None;
    for (i, &d) in target.iter().enumerate() {
        match d {
            -1 if infer.is_none() => {
                infer = Some(i);
                out.push(1);
            }
            0 if !allowzero => out.push(*xs.get(i).ok_or_else(|| {
                cx.err(format!(
                    "target {target:?}: dim {i} copies a dim the input {xs:?} lacks"
                ))
            })?),
            d if d >= 0 => out.push(d as usize),
            _ => return Err(cx.err(format!("target shape {target:?} is not valid"))),
        }
    }
    let total = numel(xs);
    if let Some(i) = infer {
        let rest = numel(&out);
        if rest == 0 || total % rest != 0 {
            return Err(cx.err(format!(
                "input of shape {xs:?} cannot be reshaped to {target:?}"
            )));
        }
        out[i] = total / rest;
    }
    if numel(&out) != total {
        return Err(cx.err(format!(
            "input of shape {xs:?} cannot be reshaped to {target:?}"
        )));
    }
    Ok(out)
}

/// A value reshaped to `out` (a constant is folded; an unchanged shape adds nothing).
fn reshape_val(
    imp: &mut Importer,
    cx: &Ctx,
    x: &Val,
    out: &[usize],
    main: bool,
) -> Result<Val, ImportError> {
    match x {
        Val::C(c) => Ok(Val::C(c.reshaped(out.to_vec()))),
        _ => {
            let t = imp.as_tensor(cx, x, cx.node.input.first().map_or("", |s| s), true)?;
            if imp.shape(cx, t)? == out {
                return Ok(Val::T(t));
            }
            Ok(Val::T(imp.op(
                cx,
                OpKind::Reshape,
                &[t.into(), ints(&dims(out))],
                Attrs::new(),
                main,
            )?))
        }
    }
}

fn squeeze(imp: &mut Importer, cx: &Ctx) -> R {
    let x = imp.req(cx, 0)?;
    let xs = shape_of(imp, cx, &x)?;
    let axes: Option<Vec<i64>> = match imp.input(cx, 1)? {
        Some(Val::C(c)) => Some(c.as_i64()),
        Some(_) => return Err(cx.err("axes must be known at import time")),
        None => attr_ints(cx.node, "axes"),
    };
    let out = if cx.op == "Squeeze" {
        match axes {
            None => xs.iter().copied().filter(|&d| d != 1).collect(),
            Some(axes) => {
                let mut drop = Vec::new();
                for a in axes {
                    let a = norm_axis(cx, a, xs.len())?;
                    if xs[a] != 1 {
                        return Err(cx.err(format!("axis {a} of shape {xs:?} is not 1")));
                    }
                    drop.push(a);
                }
                xs.iter()
                    .enumerate()
                    .filter(|(i, _)| !drop.contains(i))
                    .map(|(_, &d)| d)
                    .collect()
            }
        }
    } else {
        let axes = axes.ok_or_else(|| cx.err("Unsqueeze without axes"))?;
        let r = xs.len() + axes.len();
        let mut ins = Vec::new();
        for a in axes {
            ins.push(norm_axis(cx, a, r)?);
        }
        let mut it = xs.iter();
        (0..r)
            .map(|i| {
                if ins.contains(&i) {
                    1
                } else {
                    it.next().copied().unwrap_or(1)
                }
            })
            .collect::<Vec<usize>>()
    };
    reshape_val(imp, cx, &x, &out, true).map(|v| Outcome::Done(vec![v]))
}

fn strided_slice(
    imp: &mut Importer,
    cx: &Ctx,
    x: Value,
    begin: &[i64],
    end: &[i64],
    main: bool,
) -> Result<Value, ImportError> {
    let strides = vec![1i64; begin.len()];
    imp.op(
        cx,
        OpKind::StridedSlice,
        &[x.into(), ints(begin), ints(end), ints(&strides)],
        Attrs::new(),
        main,
    )
}

fn gather(imp: &mut Importer, cx: &Ctx) -> R {
    let data = imp.req(cx, 0)?;
    let idx = imp.req(cx, 1)?;
    let ds = shape_of(imp, cx, &data)?;
    let axis = norm_axis(cx, attr_i(cx.node, "axis", 0), ds.len())?;
    let n = ds[axis];
    if let Val::C(ic) = &idx {
        let mut norm = Vec::with_capacity(ic.data.len());
        for &i in &ic.as_i64() {
            let j = if i < 0 { i + n as i64 } else { i };
            if !(0..n as i64).contains(&j) {
                return Err(cx.err(format!(
                    "index {i} is out of range for dim {axis} of size {n}"
                )));
            }
            norm.push(j as usize);
        }
        if let Val::C(dc) = &data {
            return one(Val::C(dc.gather(axis, &norm, &ic.shape)));
        }
        let contiguous = !norm.is_empty() && norm.windows(2).all(|w| w[1] == w[0] + 1);
        if contiguous {
            // A run of rows: a slice, then the indices' shape.
            let t = imp.as_tensor(cx, &data, &cx.node.input[0], true)?;
            let mut begin = vec![0i64; ds.len()];
            let mut end = dims(&ds);
            begin[axis] = norm[0] as i64;
            end[axis] = (norm[0] + norm.len()) as i64;
            let s = strided_slice(imp, cx, t, &begin, &end, false)?;
            let mut out = ds[..axis].to_vec();
            out.extend_from_slice(&ic.shape);
            out.extend_from_slice(&ds[axis + 1..]);
            return reshape_val(imp, cx, &Val::T(s), &out, true).map(|v| Outcome::Done(vec![v]));
        }
    }
    let t = imp.as_tensor(cx, &data, &cx.node.input[0], true)?;
    let i = imp.as_tensor(cx, &idx, &cx.node.input[1], false)?;
    one(Val::T(imp.op(
        cx,
        OpKind::Gather,
        &[t.into(), i.into(), Const::Int(axis as i64).into()],
        Attrs::new(),
        true,
    )?))
}

fn concat(imp: &mut Importer, cx: &Ctx) -> R {
    let mut vals = Vec::new();
    for i in 0..cx.node.input.len() {
        vals.push(imp.req(cx, i)?);
    }
    let first = vals
        .first()
        .ok_or_else(|| cx.err("Concat without inputs"))?;
    let r = shape_of(imp, cx, first)?.len();
    let axis = norm_axis(cx, attr_i(cx.node, "axis", 0), r)?;
    if vals.iter().all(|v| matches!(v, Val::C(_))) {
        let cs: Vec<ConstT> = vals
            .into_iter()
            .filter_map(|v| if let Val::C(c) = v { Some(c) } else { None })
            .collect();
        return ConstT::concat(&cs, axis)
            .map(|c| Outcome::Done(vec![Val::C(c)]))
            .map_err(|e| cx.err(e));
    }
    let mut ts = Vec::new();
    for (i, v) in vals.iter().enumerate() {
        // Empty pieces add nothing.
        if shape_of(imp, cx, v)?.contains(&0) {
            continue;
        }
        ts.push(imp.as_tensor(cx, v, &cx.node.input[i], true)?.into());
    }
    let attrs = Attrs::new().with("axis", Attr::Int(axis as i64));
    one(Val::T(imp.op(cx, OpKind::Concat, &ts, attrs, true)?))
}

fn split(imp: &mut Importer, cx: &Ctx) -> R {
    let x = imp.req(cx, 0)?;
    let xs = shape_of(imp, cx, &x)?;
    let axis = norm_axis(cx, attr_i(cx.node, "axis", 0), xs.len())?;
    let outs = cx.node.output.len();
    let sizes: Vec<usize> = match imp.input(cx, 1)? {
        Some(Val::C(c)) => c.as_i64().iter().map(|&d| d.max(0) as usize).collect(),
        Some(_) => return Err(cx.err("the split sizes must be known at import time")),
        None => match attr_ints(cx.node, "split").filter(|s| !s.is_empty()) {
            Some(s) => s.iter().map(|&d| d.max(0) as usize).collect(),
            None => {
                let k = attr_i(cx.node, "num_outputs", outs as i64).max(1) as usize;
                let part = xs[axis].div_ceil(k);
                (0..k)
                    .map(|i| part.min(xs[axis].saturating_sub(i * part)))
                    .collect()
            }
        },
    };
    if sizes.iter().sum::<usize>() != xs[axis] || sizes.len() != outs {
        return Err(cx.err(format!(
            "split sizes {sizes:?} do not cover dim {axis} of shape {xs:?} with {outs} outputs"
        )));
    }
    let mut results = Vec::with_capacity(outs);
    if let Val::C(c) = &x {
        let mut at = 0;
        for &s in &sizes {
            let spec: Vec<(usize, usize, usize)> = xs
                .iter()
                .enumerate()
                .map(|(d, &n)| if d == axis { (at, 1, s) } else { (0, 1, n) })
                .collect();
            results.push(Val::C(c.slice(&spec)));
            at += s;
        }
        return Ok(Outcome::Done(results));
    }
    let t = imp.as_tensor(cx, &x, &cx.node.input[0], true)?;
    if sizes.iter().all(|&s| s == sizes[0]) {
        let attrs = Attrs::new()
            .with("axis", Attr::Int(axis as i64))
            .with("output_num", Attr::Int(outs as i64));
        let tuple = imp.op(cx, OpKind::Split, &[t.into()], attrs, true)?;
        for i in 0..outs {
            let v = imp.op(
                cx,
                OpKind::TupleGetItem,
                &[tuple.into(), Const::Int(i as i64).into()],
                Attrs::new(),
                false,
            )?;
            results.push(Val::T(v));
        }
        return Ok(Outcome::Done(results));
    }
    let mut at = 0;
    for &s in &sizes {
        let mut begin = vec![0i64; xs.len()];
        let mut end = dims(&xs);
        begin[axis] = at as i64;
        end[axis] = (at + s) as i64;
        results.push(Val::T(strided_slice(imp, cx, t, &begin, &end, false)?));
        at += s;
    }
    Ok(Outcome::Done(results))
}

fn slice(imp: &mut Importer, cx: &Ctx) -> R {
    let x = imp.req(cx, 0)?;
    let xs = shape_of(imp, cx, &x)?;
    let r = xs.len();
    let starts = imp.konst(cx, 1, "starts")?.as_i64();
    let ends = imp.konst(cx, 2, "ends")?.as_i64();
    let axes: Vec<i64> = match imp.input(cx, 3)? {
        Some(Val::C(c)) => c.as_i64(),
        Some(_) => return Err(cx.err("axes must be known at import time")),
        None => (0..starts.len() as i64).collect(),
    };
    let steps: Vec<i64> = match imp.input(cx, 4)? {
        Some(Val::C(c)) => c.as_i64(),
        Some(_) => return Err(cx.err("steps must be known at import time")),
        None => vec![1; starts.len()],
    };
    if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
        return Err(cx.err("starts, ends, axes and steps differ in length"));
    }
    let mut begin = vec![0i64; r];
    let mut end = dims(&xs);
    let mut stride = vec![1i64; r];
    for k in 0..starts.len() {
        let a = norm_axis(cx, axes[k], r)?;
        if steps[k] <= 0 {
            return Err(cx.err(format!(
                "step {} on axis {a}: only positive steps are supported",
                steps[k]
            )));
        }
        let n = xs[a] as i64;
        let clamp = |v: i64| (if v < 0 { v.saturating_add(n) } else { v }).clamp(0, n);
        begin[a] = clamp(starts[k]);
        end[a] = clamp(ends[k]).max(begin[a]);
        stride[a] = steps[k];
    }
    if let Val::C(c) = &x {
        let spec = slice_spec(&xs, &begin, &end, &stride).map_err(|e| cx.err(e))?;
        return one(Val::C(c.slice(&spec)));
    }
    let t = imp.as_tensor(cx, &x, &cx.node.input[0], true)?;
    if begin.iter().all(|&b| b == 0) && end == dims(&xs) && stride.iter().all(|&s| s == 1) {
        return one(Val::T(t));
    }
    let v = imp.op(
        cx,
        OpKind::StridedSlice,
        &[t.into(), ints(&begin), ints(&end), ints(&stride)],
        Attrs::new(),
        true,
    )?;
    one(Val::T(v))
}

/// The `pad_mode` and `(top, bottom, left, right)` pads of a Conv or pool node.
fn pads(cx: &Ctx) -> Result<(String, Vec<i64>), ImportError> {
    let n = cx.node;
    let auto = attr_s(n, "auto_pad").unwrap_or_else(|| "NOTSET".into());
    match auto.as_str() {
        "NOTSET" | "" => {
            let p = attr_ints(n, "pads").unwrap_or_else(|| vec![0; 4]);
            if p.len() != 4 {
                return Err(cx.err(format!("pads {p:?}: only 2-D windows are supported")));
            }
            // ONNX: (top, left, bottom, right); shardc: (top, bottom, left, right).
            let q = vec![p[0], p[2], p[1], p[3]];
            if q.iter().all(|&v| v == 0) {
                Ok(("valid".into(), q))
            } else {
                Ok(("pad".into(), q))
            }
        }
        "VALID" => Ok(("valid".into(), vec![0; 4])),
        // TensorFlow's (and shardc's) `same` puts the odd pad at the end, as SAME_UPPER.
        "SAME_UPPER" => Ok(("same".into(), vec![0; 4])),
        other => Err(cx.err(format!("auto_pad {other} is not supported"))),
    }
}

fn pair(cx: &Ctx, name: &str, default: i64) -> Result<Vec<i64>, ImportError> {
    let v = attr_ints(cx.node, name).unwrap_or_else(|| vec![default; 2]);
    if v.len() != 2 {
        return Err(cx.err(format!("{name} {v:?}: only 2-D windows are supported")));
    }
    Ok(v)
}

fn conv(imp: &mut Importer, cx: &Ctx) -> R {
    let x = imp.tensor(cx, 0, true)?;
    let w = imp.tensor(cx, 1, true)?;
    let wsh = imp.shape(cx, w)?;
    if wsh.len() != 4 {
        return Err(cx.err(format!(
            "weight of shape {wsh:?}: only 2-D convolutions are supported"
        )));
    }
    let (mode, pad) = pads(cx)?;
    let attrs = Attrs::new()
        .with("out_channel", Attr::Int(wsh[0] as i64))
        .with("kernel_size", Attr::ints(&[wsh[2] as i64, wsh[3] as i64]))
        .with("stride", Attr::ints(&pair(cx, "strides", 1)?))
        .with("dilation", Attr::ints(&pair(cx, "dilations", 1)?))
        .with("pad_mode", Attr::Str(mode))
        .with("pad", Attr::ints(&pad))
        .with("group", Attr::Int(attr_i(cx.node, "group", 1)))
        .with("data_format", Attr::Str("NCHW".into()));
    let has_bias = imp.input(cx, 2)?.is_some();
    let y = imp.op(cx, OpKind::Conv2D, &[x.into(), w.into()], attrs, true)?;
    if !has_bias {
        return one(Val::T(y));
    }
    let b = imp.tensor(cx, 2, true)?;
    one(Val::T(imp.op(
        cx,
        OpKind::BiasAdd,
        &[y.into(), b.into()],
        Attrs::new(),
        false,
    )?))
}

fn batch_norm(imp: &mut Importer, cx: &Ctx) -> R {
    let n = cx.node;
    if attr_i(n, "training_mode", 0) != 0 {
        return Err(cx.err("training_mode=1: export the model in inference mode (model.eval())"));
    }
    if n.output.iter().skip(1).any(|o| !o.is_empty()) {
        return Err(cx.err("the running-statistics outputs are used (only inference is read)"));
    }
    let x = imp.tensor(cx, 0, true)?;
    let scale = imp.tensor(cx, 1, true)?;
    let bias = imp.tensor(cx, 2, true)?;
    let mean = imp.tensor(cx, 3, false)?;
    let var = imp.tensor(cx, 4, false)?;
    let attrs = Attrs::new()
        .with("is_training", Attr::Bool(false))
        .with(
            "epsilon",
            Attr::Float(attr_f(n, "epsilon", 1e-5) as f32 as f64),
        )
        .with("momentum", Attr::Float(1.0 - attr_f(n, "momentum", 0.9)));
    first_result(
        imp,
        cx,
        OpKind::BatchNorm,
        &[x.into(), scale.into(), bias.into(), mean.into(), var.into()],
        attrs,
    )
}

/// Result 0 of a tuple-valued op (BatchNorm's and LayerNorm's `y`).
fn first_result(imp: &mut Importer, cx: &Ctx, op: OpKind, inputs: &[Operand], attrs: Attrs) -> R {
    let t = imp.op(cx, op, inputs, attrs, true)?;
    let y = imp.op(
        cx,
        OpKind::TupleGetItem,
        &[t.into(), Const::Int(0).into()],
        Attrs::new(),
        false,
    )?;
    one(Val::T(y))
}

fn gemm(imp: &mut Importer, cx: &Ctx) -> R {
    let n = cx.node;
    let a = imp.tensor(cx, 0, true)?;
    let b = imp.tensor(cx, 1, true)?;
    let alpha = attr_f(n, "alpha", 1.0);
    let beta = attr_f(n, "beta", 1.0);
    let attrs = Attrs::new()
        .with("transpose_a", Attr::Bool(attr_i(n, "transA", 0) != 0))
        .with("transpose_b", Attr::Bool(attr_i(n, "transB", 0) != 0));
    let c = imp.input(cx, 2)?;
    let mut y = imp.op(cx, OpKind::MatMul, &[a.into(), b.into()], attrs, true)?;
    if alpha != 1.0 {
        y = imp.op(
            cx,
            OpKind::Mul,
            &[y.into(), Const::Float(alpha as f32 as f64).into()],
            Attrs::new(),
            false,
        )?;
    }
    let Some(c) = c else {
        return one(Val::T(y));
    };
    let c = match c {
        // beta folded into the bias's value (it stays the same weight).
        Val::C(k) if beta != 1.0 => {
            let origin = k.origin.clone();
            let mut s = k.map(|v| v * beta);
            s.origin = origin;
            Val::C(s)
        }
        other => other,
    };
    let mut ct = imp.as_tensor(cx, &c, &n.input[2], true)?;
    if beta != 1.0 && matches!(c, Val::T(_)) {
        ct = imp.op(
            cx,
            OpKind::Mul,
            &[ct.into(), Const::Float(beta).into()],
            Attrs::new(),
            false,
        )?;
    }
    let ys = imp.shape(cx, y)?;
    let cs = imp.shape(cx, ct)?;
    let kind = if cs.len() == 1 && ys.len() == 2 && cs[0] == ys[1] {
        OpKind::BiasAdd
    } else {
        OpKind::Add
    };
    one(Val::T(imp.op(
        cx,
        kind,
        &[y.into(), ct.into()],
        Attrs::new(),
        false,
    )?))
}

fn matmul(imp: &mut Importer, cx: &Ctx) -> R {
    let a = imp.tensor(cx, 0, true)?;
    let b = imp.tensor(cx, 1, true)?;
    let (asz, bsz) = (imp.shape(cx, a)?, imp.shape(cx, b)?);
    let (ra, rb) = (asz.len(), bsz.len());
    let mm = |t: bool| {
        Attrs::new()
            .with("transpose_a", Attr::Bool(false))
            .with("transpose_b", Attr::Bool(t))
    };
    if ra < 2 || rb < 2 {
        return Err(cx.err(format!(
            "operands of shapes {asz:?} and {bsz:?}: 1-D MatMul operands are not supported"
        )));
    }
    if ra == 2 && rb == 2 {
        return one(Val::T(imp.op(
            cx,
            OpKind::MatMul,
            &[a.into(), b.into()],
            mm(false),
            true,
        )?));
    }
    if rb == 2 {
        // (..., m, k) x (k, n): one MatMul over the flattened leading dims.
        let lead = numel(&asz[..ra - 1]);
        let flat = imp.op(
            cx,
            OpKind::Reshape,
            &[a.into(), ints(&[lead as i64, asz[ra - 1] as i64])],
            Attrs::new(),
            false,
        )?;
        let y = imp.op(
            cx,
            OpKind::MatMul,
            &[flat.into(), b.into()],
            mm(false),
            false,
        )?;
        let mut out = asz[..ra - 1].to_vec();
        out.push(bsz[1]);
        return one(Val::T(imp.op(
            cx,
            OpKind::Reshape,
            &[y.into(), ints(&dims(&out))],
            Attrs::new(),
            true,
        )?));
    }
    let r = ra.max(rb);
    let lift = |imp: &mut Importer, t: Value, s: &[usize]| -> Result<Value, ImportError> {
        if s.len() == r {
            return Ok(t);
        }
        let mut p = vec![1usize; r - s.len()];
        p.extend_from_slice(s);
        imp.op(
            cx,
            OpKind::Reshape,
            &[t.into(), ints(&dims(&p))],
            Attrs::new(),
            false,
        )
    };
    let a = lift(imp, a, &asz)?;
    let b = lift(imp, b, &bsz)?;
    one(Val::T(imp.op(
        cx,
        OpKind::BatchMatMul,
        &[a.into(), b.into()],
        mm(false),
        true,
    )?))
}

fn layer_norm(imp: &mut Importer, cx: &Ctx) -> R {
    let n = cx.node;
    if n.output.iter().skip(1).any(|o| !o.is_empty()) {
        return Err(cx.err("the mean / inverse-deviation outputs are used (only output 0 is read)"));
    }
    let x = imp.tensor(cx, 0, true)?;
    let gamma = imp.tensor(cx, 1, true)?;
    let beta = match imp.input(cx, 2)? {
        Some(v) => imp.as_tensor(cx, &v, &n.input[2], true)?,
        None => {
            let gs = imp.shape(cx, gamma)?;
            let mut z = ConstT::new(code::FLOAT, gs.clone(), vec![0.0; numel(&gs)]);
            let key = format!("{}.bias", cx.name);
            z.origin = Some(key.clone());
            imp.materialize(&key, &z, true).map_err(|e| cx.build(e))?
        }
    };
    let axis = attr_i(n, "axis", -1);
    let attrs = Attrs::new()
        .with("begin_norm_axis", Attr::Int(axis))
        .with("begin_params_axis", Attr::Int(axis))
        .with(
            "epsilon",
            Attr::Float(attr_f(n, "epsilon", 1e-5) as f32 as f64),
        );
    first_result(
        imp,
        cx,
        OpKind::LayerNorm,
        &[x.into(), gamma.into(), beta.into()],
        attrs,
    )
}

fn reduce(imp: &mut Importer, cx: &Ctx) -> R {
    let n = cx.node;
    let x = imp.tensor(cx, 0, true)?;
    let r = imp.shape(cx, x)?.len();
    // Axes are an attribute before opset 18 (ReduceSum: 13), an input from then on.
    let axes_attr_until = if cx.op == "ReduceSum" { 12 } else { 17 };
    let axes: Vec<i64> = if imp.opset <= axes_attr_until {
        attr_ints(n, "axes").unwrap_or_default()
    } else {
        match imp.input(cx, 1)? {
            Some(Val::C(c)) => c.as_i64(),
            Some(_) => return Err(cx.err("axes must be known at import time")),
            None => Vec::new(),
        }
    };
    if axes.is_empty() && attr_i(n, "noop_with_empty_axes", 0) != 0 {
        return one(Val::T(x));
    }
    let mut norm = Vec::new();
    for a in if axes.is_empty() {
        (0..r as i64).collect()
    } else {
        axes
    } {
        norm.push(norm_axis(cx, a, r)? as i64);
    }
    let kind = match cx.op.as_str() {
        "ReduceMean" => OpKind::ReduceMean,
        "ReduceSum" => OpKind::ReduceSum,
        _ => OpKind::ReduceMax,
    };
    let attrs = Attrs::new().with("keep_dims", Attr::Bool(attr_i(n, "keepdims", 1) != 0));
    one(Val::T(imp.op(
        cx,
        kind,
        &[x.into(), ints(&norm)],
        attrs,
        true,
    )?))
}

fn pool(imp: &mut Importer, cx: &Ctx) -> R {
    let n = cx.node;
    if n.output.get(1).is_some_and(|o| !o.is_empty()) {
        return Err(cx.err("MaxPool's indices output is used"));
    }
    if attr_i(n, "ceil_mode", 0) != 0 {
        return Err(cx.err("ceil_mode=1 is not supported"));
    }
    if attr_ints(n, "dilations").is_some_and(|d| d.iter().any(|&v| v != 1)) {
        return Err(cx.err("dilated pooling is not supported"));
    }
    let (mode, pad) = pads(cx)?;
    if cx.op == "AveragePool"
        && attr_i(n, "count_include_pad", 0) != 0
        && pad.iter().any(|&p| p != 0)
    {
        return Ok(Outcome::Unmapped(
            "count_include_pad=1 with padding: shardc's AvgPool leaves padding out of the average"
                .into(),
        ));
    }
    let x = imp.tensor(cx, 0, true)?;
    let kernel = attr_ints(n, "kernel_shape").ok_or_else(|| cx.err("kernel_shape is missing"))?;
    if kernel.len() != 2 {
        return Err(cx.err(format!(
            "kernel_shape {kernel:?}: only 2-D pooling is supported"
        )));
    }
    let attrs = Attrs::new()
        .with("kernel_size", Attr::ints(&kernel))
        .with("strides", Attr::ints(&pair(cx, "strides", 1)?))
        .with("pad_mode", Attr::Str(mode))
        .with("pad", Attr::ints(&pad))
        .with("data_format", Attr::Str("NCHW".into()));
    let kind = if cx.op == "MaxPool" {
        OpKind::MaxPool
    } else {
        OpKind::AvgPool
    };
    one(Val::T(imp.op(cx, kind, &[x.into()], attrs, true)?))
}
