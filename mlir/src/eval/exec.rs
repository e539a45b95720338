//! One rank's ops: everything but the collectives (`collective`), which need every rank.

use super::affine::Map;
use super::array::{for_each_index, strides, Arr};
use super::attr;
use super::ir::{Block, Elem, Op, Ty, ValueId};
use std::collections::HashMap;

/// A runtime value.
#[derive(Clone, Debug, PartialEq)]
pub enum Val {
    /// A tensor.
    T(Arr),
    /// A scalar of an element type.
    S(f64, Elem),
}

/// One rank's values.
pub type Env = HashMap<ValueId, Val>;

/// Where the rank sits.
pub struct RankInfo<'a> {
    /// The rank (its linear index in the grid).
    pub rank: usize,
    /// The grid's shape.
    pub grid: &'a [usize],
}

impl RankInfo<'_> {
    /// The rank's multi-index.
    pub fn coords(&self) -> Vec<usize> {
        let st = strides(self.grid);
        self.grid
            .iter()
            .zip(st)
            .map(|(&n, s)| (self.rank / s) % n.max(1))
            .collect()
    }
}

/// Fetches an operand.
pub fn get<'e>(env: &'e Env, op: &Op, k: usize) -> Result<&'e Val, String> {
    let id = op
        .operands
        .get(k)
        .ok_or_else(|| format!("operand {k} is missing"))?;
    env.get(id)
        .ok_or_else(|| format!("operand {k} (%v{id}) has no value yet"))
}

/// A tensor operand.
pub fn tensor<'e>(env: &'e Env, op: &Op, k: usize) -> Result<&'e Arr, String> {
    match get(env, op, k)? {
        Val::T(a) => Ok(a),
        Val::S(..) => Err(format!(
            "operand {k} is a scalar where a tensor is expected"
        )),
    }
}

/// A scalar operand.
fn scalar(env: &Env, op: &Op, k: usize) -> Result<f64, String> {
    match get(env, op, k)? {
        Val::S(v, _) => Ok(*v),
        Val::T(_) => Err(format!(
            "operand {k} is a tensor where a scalar is expected"
        )),
    }
}

/// The type of result `k`.
fn result_ty(op: &Op, k: usize) -> Result<&Ty, String> {
    op.results
        .get(k)
        .map(|(_, t)| t)
        .ok_or_else(|| format!("result {k} is missing"))
}

/// The tensor shape and element type of result `k`.
fn result_tensor(op: &Op, k: usize) -> Result<(Vec<usize>, Elem), String> {
    match result_ty(op, k)? {
        Ty::Tensor(s, e) => Ok((s.clone(), *e)),
        t => Err(format!("result {k} has type {t:?}, not a static tensor")),
    }
}

/// An attribute, or why it is missing.
pub fn attr_of<'o>(op: &'o Op, key: &str) -> Result<&'o str, String> {
    op.attrs
        .get(key)
        .map(String::as_str)
        .ok_or_else(|| format!("attribute {key} is missing"))
}

/// A scalar arithmetic op on `a`, `b`.
fn binary(name: &str, a: f64, b: f64) -> Option<f64> {
    Some(match name {
        "arith.addf" | "arith.addi" => a + b,
        "arith.subf" | "arith.subi" => a - b,
        "arith.mulf" | "arith.muli" => a * b,
        "arith.divf" => a / b,
        "arith.divsi" | "arith.divui" => {
            if b == 0.0 {
                return None;
            }
            (a / b).trunc()
        }
        "arith.floordivsi" => {
            if b == 0.0 {
                return None;
            }
            (a / b).floor()
        }
        "arith.ceildivsi" | "arith.ceildivui" => {
            if b == 0.0 {
                return None;
            }
            (a / b).ceil()
        }
        "arith.remsi" | "arith.remui" => {
            if b == 0.0 {
                return None;
            }
            a % b
        }
        "arith.maximumf" => {
            if a.is_nan() || b.is_nan() {
                f64::NAN
            } else {
                a.max(b)
            }
        }
        "arith.minimumf" => {
            if a.is_nan() || b.is_nan() {
                f64::NAN
            } else {
                a.min(b)
            }
        }
        "arith.maxnumf" | "arith.maxsi" | "arith.maxui" => a.max(b),
        "arith.minnumf" | "arith.minsi" | "arith.minui" => a.min(b),
        "arith.andi" => f64::from(u8::from(a != 0.0 && b != 0.0)),
        "arith.ori" => f64::from(u8::from(a != 0.0 || b != 0.0)),
        "arith.xori" => f64::from(u8::from((a != 0.0) != (b != 0.0))),
        _ => return None,
    })
}

/// A scalar one-operand op.
fn unary(name: &str, x: f64) -> Option<f64> {
    Some(match name {
        "arith.negf" => -x,
        "math.exp" => x.exp(),
        "math.log" => x.ln(),
        "math.sqrt" => x.sqrt(),
        "math.rsqrt" => 1.0 / x.sqrt(),
        "math.tanh" => x.tanh(),
        "math.absf" | "math.absi" => x.abs(),
        "math.erf" => erf(x),
        "arith.index_cast" | "arith.index_castui" | "arith.extf" | "arith.truncf"
        | "arith.sitofp" | "arith.uitofp" | "arith.extsi" | "arith.extui" | "arith.trunci"
        | "arith.fptosi" | "arith.fptoui" => x,
        _ => return None,
    })
}

/// The error function (Abramowitz–Stegun 7.1.26 refined by one Newton step on f64, ~1e-12).
fn erf(x: f64) -> f64 {
    let t = 1.0 / (1.0 + 0.5 * x.abs());
    let y = 1.0
        - t * (-x * x - 1.265_512_23
            + t * (1.000_023_68
                + t * (0.374_091_96
                    + t * (0.096_784_18
                        + t * (-0.186_288_06
                            + t * (0.278_868_07
                                + t * (-1.135_203_98
                                    + t * (1.488_515_87
                                        + t * (-0.822_152_23 + t * 0.170_872_77)))))))))
            .exp();
    if x >= 0.0 {
        y
    } else {
        -y
    }
}

/// An integer comparison by predicate (name or number).
fn cmpi(pred: &str, a: f64, b: f64) -> Option<bool> {
    let names = [
        "eq", "ne", "slt", "sle", "sgt", "sge", "ult", "ule", "ugt", "uge",
    ];
    let p = attr::int(pred)
        .and_then(|i| usize::try_from(i).ok())
        .and_then(|i| names.get(i).copied())
        .or_else(|| names.iter().copied().find(|n| pred.trim() == *n))?;
    Some(match p {
        "eq" => a == b,
        "ne" => a != b,
        "slt" | "ult" => a < b,
        "sle" | "ule" => a <= b,
        "sgt" | "ugt" => a > b,
        _ => a >= b,
    })
}

/// A float comparison by predicate (name or number).
fn cmpf(pred: &str, a: f64, b: f64) -> Option<bool> {
    let names = [
        "false", "oeq", "ogt", "oge", "olt", "ole", "one", "ord", "ueq", "ugt", "uge", "ult",
        "ule", "une", "uno", "true",
    ];
    let p = attr::int(pred)
        .and_then(|i| usize::try_from(i).ok())
        .and_then(|i| names.get(i).copied())
        .or_else(|| names.iter().copied().find(|n| pred.trim() == *n))?;
    let un = a.is_nan() || b.is_nan();
    Some(match p {
        "false" => false,
        "true" => true,
        "ord" => !un,
        "uno" => un,
        "oeq" => !un && a == b,
        "ogt" => !un && a > b,
        "oge" => !un && a >= b,
        "olt" => !un && a < b,
        "ole" => !un && a <= b,
        "one" => !un && a != b,
        "ueq" => un || a == b,
        "ugt" => un || a > b,
        "uge" => un || a >= b,
        "ult" => un || a < b,
        "ule" => un || a <= b,
        _ => un || a != b,
    })
}

/// Static values of a mixed static/dynamic list: `static` with `i64::MIN` where the next
/// dynamic operand (from `dyn_at`) stands.
fn mixed(env: &Env, op: &Op, key: &str, dyn_at: &mut usize) -> Result<Vec<usize>, String> {
    let st = attr::ints(attr_of(op, key)?).ok_or_else(|| format!("{key} is not a list"))?;
    let mut out = Vec::with_capacity(st.len());
    for v in st {
        let v = if v == i64::MIN {
            let x = scalar(env, op, *dyn_at)?;
            *dyn_at += 1;
            x as i64
        } else {
            v
        };
        out.push(usize::try_from(v).map_err(|_| format!("{key} has a negative entry {v}"))?);
    }
    Ok(out)
}

/// Evaluates the ops of `block` with its arguments bound to `args`; returns the operands of
/// its terminator (`func.return`, `scf.yield`, `linalg.yield`).
pub fn run_block(
    block: &Block,
    args: Vec<Val>,
    env: &mut Env,
    at: &RankInfo<'_>,
) -> Result<Vec<Val>, (String, String, String)> {
    for ((id, _), v) in block.args.iter().zip(args) {
        env.insert(*id, v);
    }
    for op in &block.ops {
        if matches!(
            op.name.as_str(),
            "func.return" | "scf.yield" | "linalg.yield"
        ) {
            return op
                .operands
                .iter()
                .map(|id| {
                    env.get(id).cloned().ok_or_else(|| {
                        (op.name.clone(), op.value(), format!("%v{id} has no value"))
                    })
                })
                .collect();
        }
        let vals = eval(op, env, at).map_err(|r| (op.name.clone(), op.value(), r))?;
        for ((id, _), v) in op.results.iter().zip(vals) {
            env.insert(*id, v);
        }
    }
    Ok(Vec::new())
}

/// Evaluates one op of one rank.
pub fn eval(op: &Op, env: &mut Env, at: &RankInfo<'_>) -> Result<Vec<Val>, String> {
    let name = op.name.as_str();
    let out_elem = |k: usize| result_ty(op, k).ok().and_then(Ty::elem);
    match name {
        "arith.constant" => {
            let v = attr_of(op, "value")?;
            match result_ty(op, 0)? {
                Ty::Scalar(e) => {
                    let x = attr::scalar(v, *e).ok_or_else(|| format!("value {v} unread"))?;
                    Ok(vec![Val::S(e.round(x), *e)])
                }
                Ty::Tensor(shape, e) => {
                    let (vals, splat) =
                        attr::dense(v, *e).ok_or_else(|| format!("value {v} unread"))?;
                    let n: usize = shape.iter().product();
                    let data: Vec<f64> = if splat {
                        vec![e.round(vals[0]); n]
                    } else if vals.len() == n {
                        vals.iter().map(|x| e.round(*x)).collect()
                    } else {
                        return Err(format!("{} values for {n} elements", vals.len()));
                    };
                    Ok(vec![Val::T(Arr {
                        shape: shape.clone(),
                        data,
                        elem: *e,
                    })])
                }
                t => Err(format!("constant of type {t:?}")),
            }
        }
        "arith.cmpi" | "arith.cmpf" => {
            let (a, b) = (scalar(env, op, 0)?, scalar(env, op, 1)?);
            let p = attr_of(op, "predicate")?;
            let r = if name == "arith.cmpi" {
                cmpi(p, a, b)
            } else {
                cmpf(p, a, b)
            }
            .ok_or_else(|| format!("predicate {p}"))?;
            Ok(vec![Val::S(f64::from(u8::from(r)), Elem::I1)])
        }
        "arith.select" => {
            let c = scalar(env, op, 0)?;
            Ok(vec![get(env, op, if c != 0.0 { 1 } else { 2 })?.clone()])
        }
        "affine.apply" => {
            let m = Map::parse(attr_of(op, "map")?).ok_or("unreadable map")?;
            let xs: Vec<i64> = (0..op.operands.len())
                .map(|k| scalar(env, op, k).map(|v| v as i64))
                .collect::<Result<_, _>>()?;
            let (d, s) = xs.split_at(m.dims.min(xs.len()));
            let r = m.eval(d, s).ok_or("map evaluation failed")?;
            Ok(vec![Val::S(
                *r.first().ok_or("empty map")? as f64,
                Elem::Index,
            )])
        }
        "shard.process_linear_index" => Ok(vec![Val::S(at.rank as f64, Elem::Index)]),
        "shard.process_multi_index" | "shard.grid_shape" => {
            let axes = match op.attrs.get("axes") {
                Some(a) => attr::ints(a).ok_or("unreadable axes")?,
                None => Vec::new(),
            };
            let axes: Vec<usize> = if axes.is_empty() {
                (0..at.grid.len()).collect()
            } else {
                axes.iter().map(|&a| a as usize).collect()
            };
            let c = at.coords();
            axes.iter()
                .map(|&a| {
                    let v = if name == "shard.grid_shape" {
                        at.grid.get(a)
                    } else {
                        c.get(a)
                    };
                    v.map(|&x| Val::S(x as f64, Elem::Index))
                        .ok_or_else(|| format!("axis {a} is outside the grid"))
                })
                .collect()
        }
        "tensor.empty" => {
            let (s, e) = result_tensor(op, 0)?;
            Ok(vec![Val::T(Arr::full(&s, 0.0, e))])
        }
        "linalg.fill" => {
            let v = scalar(env, op, 0)?;
            let (s, e) = result_tensor(op, 0)?;
            Ok(vec![Val::T(Arr::full(&s, v, e))])
        }
        "tensor.extract_slice" => {
            let src = tensor(env, op, 0)?.clone();
            let mut k = 1;
            let offs = mixed(env, op, "static_offsets", &mut k)?;
            let sizes = mixed(env, op, "static_sizes", &mut k)?;
            let steps = mixed(env, op, "static_strides", &mut k)?;
            let mut s = src.slice(&offs, &sizes, &steps).ok_or_else(|| {
                format!(
                    "slice at {offs:?} of {sizes:?} leaves the source {:?}",
                    src.shape
                )
            })?;
            s.shape = result_tensor(op, 0)?.0;
            Ok(vec![Val::T(s)])
        }
        "tensor.insert_slice" => {
            let mut src = tensor(env, op, 0)?.clone();
            let dst = tensor(env, op, 1)?;
            let mut k = 2;
            let offs = mixed(env, op, "static_offsets", &mut k)?;
            let sizes = mixed(env, op, "static_sizes", &mut k)?;
            let steps = mixed(env, op, "static_strides", &mut k)?;
            src.shape = sizes;
            let r = dst.insert(&src, &offs, &steps).ok_or_else(|| {
                format!("insert at {offs:?} leaves the destination {:?}", dst.shape)
            })?;
            Ok(vec![Val::T(r)])
        }
        "tensor.expand_shape" | "tensor.collapse_shape" | "tensor.reshape" | "tensor.cast" => {
            let mut a = tensor(env, op, 0)?.clone();
            let (s, _) = result_tensor(op, 0)?;
            if s.iter().product::<usize>() != a.data.len() {
                return Err(format!("{:?} does not reshape to {s:?}", a.shape));
            }
            a.shape = s;
            Ok(vec![Val::T(a)])
        }
        "tensor.concat" => {
            let axis = attr::int(attr_of(op, "dim")?).ok_or("unreadable dim")? as usize;
            let parts: Vec<&Arr> = (0..op.operands.len())
                .map(|k| tensor(env, op, k))
                .collect::<Result<_, _>>()?;
            Ok(vec![Val::T(
                Arr::concat(&parts, axis).ok_or("concatenation of mismatched shapes")?,
            )])
        }
        "scf.if" => {
            let c = scalar(env, op, 0)?;
            let region = op
                .regions
                .get(if c != 0.0 { 0 } else { 1 })
                .ok_or("scf.if without the region taken")?;
            run_block(region, Vec::new(), env, at).map_err(|(o, v, r)| format!("in {o} {v}: {r}"))
        }
        "linalg.generic" => generic(op, env, at),
        _ if op.operands.len() == 2 && binary(name, 0.0, 1.0).is_some() => {
            let (a, b) = (scalar(env, op, 0)?, scalar(env, op, 1)?);
            let e = out_elem(0).ok_or("untyped result")?;
            let r = binary(name, a, b).ok_or("division by zero")?;
            Ok(vec![Val::S(e.round(r), e)])
        }
        _ if op.operands.len() == 1 && unary(name, 0.5).is_some() => {
            let x = scalar(env, op, 0)?;
            let e = out_elem(0).ok_or("untyped result")?;
            let r = unary(name, x).ok_or("unknown")?;
            Ok(vec![Val::S(e.round(r), e)])
        }
        _ => Err("the evaluator does not implement this op".into()),
    }
}

/// `linalg.generic`: every point of the iteration space through the body.
fn generic(op: &Op, env: &mut Env, at: &RankInfo<'_>) -> Result<Vec<Val>, String> {
    let maps = attr::maps(attr_of(op, "indexing_maps")?).ok_or("unreadable indexing_maps")?;
    let seg = attr::ints(attr_of(op, "operandSegmentSizes")?).ok_or("unreadable segments")?;
    let n_in = usize::try_from(*seg.first().ok_or("no segments")?).map_err(|_| "segments")?;
    let n_out = op
        .operands
        .len()
        .checked_sub(n_in)
        .ok_or("more inputs than operands")?;
    if maps.len() != op.operands.len() {
        return Err(format!(
            "{} indexing maps for {} operands",
            maps.len(),
            op.operands.len()
        ));
    }
    let body = op.regions.first().ok_or("no body")?;
    let operands: Vec<Val> = (0..op.operands.len())
        .map(|k| get(env, op, k).cloned())
        .collect::<Result<_, _>>()?;
    let loops = maps.first().map_or(0, |m| m.dims);
    let mut bounds = vec![None; loops];
    for (v, m) in operands.iter().zip(&maps) {
        if let Val::T(a) = v {
            for (j, e) in m.results.iter().enumerate() {
                if let (Some(slot), Some(&n)) =
                    (e.as_dim().and_then(|d| bounds.get_mut(d)), a.shape.get(j))
                {
                    *slot = Some(n);
                }
            }
        }
    }
    let bounds: Vec<usize> = bounds
        .into_iter()
        .enumerate()
        .map(|(d, b)| b.ok_or_else(|| format!("loop d{d} has no bound")))
        .collect::<Result<_, _>>()?;
    let mut outs: Vec<Arr> = operands[n_in..]
        .iter()
        .map(|v| match v {
            Val::T(a) => Ok(a.clone()),
            Val::S(..) => Err("a scalar output".to_string()),
        })
        .collect::<Result<_, _>>()?;
    let mut err = None;
    for_each_index(&bounds, |idx| {
        if err.is_some() {
            return;
        }
        let ii: Vec<i64> = idx.iter().map(|&i| i as i64).collect();
        let mut args = Vec::with_capacity(operands.len());
        let mut out_pos = Vec::with_capacity(n_out);
        for (k, m) in maps.iter().enumerate() {
            let Some(p) = m.eval(&ii, &[]) else {
                err = Some("map evaluation failed".to_string());
                return;
            };
            let p: Vec<usize> = p.iter().map(|&x| x as usize).collect();
            let t = match (k < n_in, &operands[k]) {
                (true, Val::S(..)) => {
                    args.push(operands[k].clone());
                    continue;
                }
                (true, Val::T(t)) => t,
                (false, _) => &outs[k - n_in],
            };
            if p.len() != t.shape.len() || p.iter().zip(&t.shape).any(|(i, n)| i >= n) {
                err = Some(format!("index {p:?} outside operand {k} of {:?}", t.shape));
                return;
            }
            let o = t.offset(&p);
            args.push(Val::S(t.data[o], t.elem));
            if k >= n_in {
                out_pos.push(o);
            }
        }
        match run_block(body, args, env, at) {
            Ok(ys) => {
                for (o, (y, pos)) in outs.iter_mut().zip(ys.iter().zip(&out_pos)) {
                    if let Val::S(x, _) = y {
                        o.data[*pos] = o.elem.round(*x);
                    }
                }
            }
            Err((o, v, r)) => err = Some(format!("in the body, {o} {v}: {r}")),
        }
    });
    if let Some(e) = err {
        return Err(e);
    }
    Ok(outs.into_iter().map(Val::T).collect())
}
