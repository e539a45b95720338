//! One shardc node as `func`/`tensor`/`linalg`/`arith`/`math` ops (everything of a logical
//! graph but the sharding annotations and the collectives, which `comm` writes).
//!
//! Elementwise ops, broadcasts, transposes, contractions and reductions are `linalg.generic`s
//! (one form for every one of them, which MLIR's sharding interface reads loop by loop);
//! numpy broadcasting is the generic's indexing maps, after a rank-reducing
//! `tensor.extract_slice` drops the size-1 dimensions that broadcast. Ops with no such
//! equivalent become a call of a private external function `@shardc.<OpName>` with the exact
//! tensor types ([`Lowered::External`]).

use super::emit::{elem, tensor_ty, Body, Emitter, GenericInput, Val};
use shardc_ir::{Const, DType, Graph, Node, OpKind, Operand, TensorType};

/// Why a node cannot be lowered (the caller adds the op and value).
pub type Reason = String;

/// What a node became.
pub enum Lowered {
    /// Its results, as ops of the core dialects.
    Values(Vec<Val>),
    /// It has no equivalent: call the external function `@shardc.<OpName>` on its tensor
    /// operands.
    External,
}

/// The tensor operand `i` of `node`, or why it is missing.
fn arg<'a>(node: &Node, ins: &'a [Option<Val>], i: usize) -> Result<&'a Val, Reason> {
    ins.get(i).and_then(|v| v.as_ref()).ok_or_else(|| {
        format!(
            "operand {i} is not a tensor (of {} operands)",
            node.inputs.len()
        )
    })
}

/// The constant operand `i` of `node`.
fn konst(node: &Node, i: usize) -> Option<&Const> {
    node.inputs.get(i).and_then(Operand::as_const)
}

/// The node's single result type.
fn out_ty(node: &Node) -> Result<&TensorType, Reason> {
    node.ty
        .as_tensor()
        .ok_or_else(|| "the result is a tuple where one tensor is expected".to_string())
}

/// Drops the dimensions of `v` marked in `drop` (all of size 1) with a rank-reducing
/// `tensor.extract_slice`.
fn drop_dims(e: &mut Emitter, v: &Val, drop: &[bool]) -> Val {
    if !drop.iter().any(|&d| d) {
        return v.clone();
    }
    let r = v.ty.shape.len();
    let zeros = vec!["0"; r].join(", ");
    let ones = vec!["1"; r].join(", ");
    let sizes: Vec<String> = v.ty.shape.iter().map(|s| s.to_string()).collect();
    let kept: Vec<usize> =
        v.ty.shape
            .iter()
            .zip(drop)
            .filter(|(_, &d)| !d)
            .map(|(&s, _)| s)
            .collect();
    let ty = TensorType::new(v.ty.dtype, kept);
    let name = e.fresh();
    e.line(format!(
        "{name} = tensor.extract_slice {}[{zeros}] [{}] [{ones}] : {} to {}",
        v.name,
        sizes.join(", "),
        tensor_ty(&v.ty),
        tensor_ty(&ty)
    ));
    Val { name, ty }
}

/// `v` broadcast (numpy rules, aligned at the right) into the loops `lead..lead + out.len()`
/// of shape `out`: the value to feed (size-1 broadcast dims dropped) and the loop of each
/// of its dims.
fn aligned(
    e: &mut Emitter,
    v: &Val,
    out: &[usize],
    lead: usize,
) -> Result<(Val, Vec<usize>), Reason> {
    let s = v.ty.shape.len();
    if s > out.len() {
        return Err(format!(
            "operand {} of rank {s} does not broadcast to rank {}",
            v.name,
            out.len()
        ));
    }
    let off = out.len() - s;
    let mut drop = vec![false; s];
    let mut dims = Vec::with_capacity(s);
    for (i, (&n, slot)) in v.ty.shape.iter().zip(drop.iter_mut()).enumerate() {
        let j = off + i;
        if n == out[j] {
            dims.push(lead + j);
        } else if n == 1 {
            *slot = true;
        } else {
            return Err(format!(
                "operand shape {:?} does not broadcast to {out:?}",
                v.ty.shape
            ));
        }
    }
    Ok((drop_dims(e, v, &drop), dims))
}

/// An elementwise `linalg.generic` of `ins` (broadcast) into a fresh tensor of `out`.
fn ewise(
    e: &mut Emitter,
    ins: &[&Val],
    out: &TensorType,
    body: impl FnOnce(&[String], &mut Body) -> String,
) -> Result<Val, Reason> {
    let mut fed = Vec::with_capacity(ins.len());
    for v in ins {
        fed.push(aligned(e, v, &out.shape, 0)?);
    }
    let init = e.empty(out);
    let inputs: Vec<GenericInput<'_>> = fed
        .iter()
        .map(|(v, dims)| GenericInput {
            val: v,
            dims: dims.clone(),
        })
        .collect();
    let out_dims: Vec<usize> = (0..out.shape.len()).collect();
    Ok(e.generic(None, out.shape.len(), &[], &inputs, &init, &out_dims, body))
}

/// The scalar op of a binary arithmetic op on dtype `d`.
fn arith2(op: OpKind, d: DType) -> Result<&'static str, Reason> {
    let f = d.is_float();
    Ok(match (op, f) {
        (OpKind::Add, true) => "arith.addf",
        (OpKind::Add, false) => "arith.addi",
        (OpKind::Sub, true) => "arith.subf",
        (OpKind::Sub, false) => "arith.subi",
        (OpKind::Mul, true) => "arith.mulf",
        (OpKind::Mul, false) => "arith.muli",
        (OpKind::RealDiv, true) => "arith.divf",
        (OpKind::RealDiv, false) => "arith.divsi",
        _ => return Err(format!("{op} has no scalar op for {}", d.name())),
    })
}

/// `1 / (1 + exp(-x))` in a body.
fn sigmoid(b: &mut Body, x: &str, t: &str, d: DType) -> String {
    let n = b.op(&format!("arith.negf {x}"), t);
    let ex = b.op(&format!("math.exp {n}"), t);
    let one = b.constant(1.0, d);
    let den = b.op(&format!("arith.addf {one}, {ex}"), t);
    b.op(&format!("arith.divf {one}, {den}"), t)
}

/// The normalised reduction axes of a ReduceSum/Mean/Max node over a rank-`r` input.
fn reduce_axes(node: &Node, r: usize) -> Result<Vec<usize>, Reason> {
    let raw: Vec<i64> = match konst(node, 1) {
        Some(c) => c
            .as_ints()
            .ok_or_else(|| "the axes operand is not an Int or Ints constant".to_string())?,
        None if node.inputs.len() < 2 => Vec::new(),
        None => return Err("the axes operand is not a constant".into()),
    };
    let mut axes = Vec::with_capacity(raw.len());
    for a in raw {
        let n = if a < 0 { a + r as i64 } else { a };
        if n < 0 || n >= r as i64 {
            return Err(format!("axis {a} is outside a rank-{r} tensor"));
        }
        axes.push(n as usize);
    }
    if axes.is_empty() {
        axes = (0..r).collect();
    }
    axes.sort_unstable();
    axes.dedup();
    Ok(axes)
}

/// `tensor.expand_shape` of `v` into `to` (the same elements with size-1 dims inserted).
fn expand_to(e: &mut Emitter, v: &Val, to: &TensorType) -> Result<Val, Reason> {
    if v.ty.shape == to.shape {
        return Ok(v.clone());
    }
    // The position in `to` of every dim of `v`: the size-1 dims of `to` in between join the
    // group of the dim before them (the first group takes the leading ones).
    let mut pos = Vec::with_capacity(v.ty.shape.len());
    let mut j = 0;
    for &s in &v.ty.shape {
        while j < to.shape.len() && to.shape[j] != s {
            if to.shape[j] != 1 {
                return Err(format!(
                    "shape {:?} does not expand to {:?}",
                    v.ty.shape, to.shape
                ));
            }
            j += 1;
        }
        if j == to.shape.len() {
            return Err(format!(
                "shape {:?} does not expand to {:?}",
                v.ty.shape, to.shape
            ));
        }
        pos.push(j);
        j += 1;
    }
    if to.shape[j..].iter().any(|&s| s != 1) {
        return Err(format!(
            "shape {:?} does not expand to {:?}",
            v.ty.shape, to.shape
        ));
    }
    let groups: Vec<String> = (0..pos.len())
        .map(|i| {
            let lo = if i == 0 { 0 } else { pos[i] };
            let hi = if i + 1 == pos.len() {
                to.shape.len()
            } else {
                pos[i + 1]
            };
            let g: Vec<String> = (lo..hi).map(|k| k.to_string()).collect();
            format!("[{}]", g.join(", "))
        })
        .collect();
    let sizes: Vec<String> = to.shape.iter().map(|s| s.to_string()).collect();
    let name = e.fresh();
    e.line(format!(
        "{name} = tensor.expand_shape {} [{}] output_shape [{}] : {} into {}",
        v.name,
        groups.join(", "),
        sizes.join(", "),
        tensor_ty(&v.ty),
        tensor_ty(to)
    ));
    Ok(Val {
        name,
        ty: to.clone(),
    })
}

/// MatMul (`batch = false`) or BatchMatMul.
fn contraction(e: &mut Emitter, node: &Node, ins: &[Option<Val>]) -> Result<Val, Reason> {
    let a = arg(node, ins, 0)?;
    let b = arg(node, ins, 1)?;
    let out = out_ty(node)?;
    let ta = node.attrs.bool_or("transpose_a", false);
    let tb = node.attrs.bool_or("transpose_b", false);
    let (ra, rb, ro) = (a.ty.shape.len(), b.ty.shape.len(), out.shape.len());
    if ra < 2 || rb < 2 || ro < 2 {
        return Err(format!(
            "operands of rank {ra} and {rb} (result rank {ro}): a contraction needs rank 2 at least"
        ));
    }
    let nb = ro - 2;
    let (m, n, k) = (nb, nb + 1, nb + 2);
    let batch = &out.shape[..nb];
    // Batch dims broadcast as numpy's; the matrix dims are the last two.
    let feed = |e: &mut Emitter, v: &Val, mat: [usize; 2]| -> Result<(Val, Vec<usize>), Reason> {
        let r = v.ty.shape.len();
        let bshape = TensorType::new(v.ty.dtype, v.ty.shape[..r - 2].to_vec());
        let probe = Val {
            name: v.name.clone(),
            ty: bshape,
        };
        // Which batch dims broadcast (size 1 against a larger result dim).
        let off = nb
            .checked_sub(r - 2)
            .ok_or_else(|| format!("operand of rank {r} has more batch dims than the result"))?;
        let mut drop = vec![false; r];
        let mut dims = Vec::with_capacity(r);
        for (i, (&n, slot)) in probe.ty.shape.iter().zip(drop.iter_mut()).enumerate() {
            let j = off + i;
            if n == batch[j] {
                dims.push(j);
            } else if n == 1 {
                *slot = true;
            } else {
                return Err(format!(
                    "batch dims {:?} do not broadcast to {batch:?}",
                    probe.ty.shape
                ));
            }
        }
        dims.extend(mat);
        Ok((drop_dims(e, v, &drop), dims))
    };
    let (av, ad) = feed(e, a, if ta { [k, m] } else { [m, k] })?;
    let (bv, bd) = feed(e, b, if tb { [n, k] } else { [k, n] })?;
    let init = e.filled(0.0, out);
    let d = out.dtype;
    let (mul, add) = if d.is_float() {
        ("arith.mulf", "arith.addf")
    } else {
        ("arith.muli", "arith.addi")
    };
    let t = elem(d);
    let out_dims: Vec<usize> = (0..ro).collect();
    Ok(e.generic(
        None,
        ro + 1,
        &[k],
        &[
            GenericInput { val: &av, dims: ad },
            GenericInput { val: &bv, dims: bd },
        ],
        &init,
        &out_dims,
        |x, body| {
            let p = body.op(&format!("{mul} {}, {}", x[0], x[1]), t);
            body.op(&format!("{add} {}, {p}", x[2]), t)
        },
    ))
}

/// ReduceSum, ReduceMean, ReduceMax.
fn reduction(e: &mut Emitter, node: &Node, ins: &[Option<Val>]) -> Result<Val, Reason> {
    let x = arg(node, ins, 0)?;
    let out = out_ty(node)?;
    let r = x.ty.shape.len();
    let axes = reduce_axes(node, r)?;
    let kept: Vec<usize> = (0..r).filter(|d| !axes.contains(d)).collect();
    let d = x.ty.dtype;
    let t = elem(d);
    let red_ty = TensorType::new(d, kept.iter().map(|&k| x.ty.shape[k]).collect::<Vec<_>>());
    let is_max = node.op == OpKind::ReduceMax;
    let init = e.filled(if is_max { f64::NEG_INFINITY } else { 0.0 }, &red_ty);
    let comb = match (is_max, d.is_float()) {
        (true, true) => "arith.maximumf",
        (true, false) => "arith.maxsi",
        (false, true) => "arith.addf",
        (false, false) => "arith.addi",
    };
    let all: Vec<usize> = (0..r).collect();
    let mut v = e.generic(
        None,
        r,
        &axes,
        &[GenericInput { val: x, dims: all }],
        &init,
        &kept,
        |a, b| b.op(&format!("{comb} {}, {}", a[1], a[0]), t),
    );
    if node.op == OpKind::ReduceMean {
        if !d.is_float() {
            return Err("ReduceMean of integers".into());
        }
        let count: usize = axes.iter().map(|&k| x.ty.shape[k]).product();
        let scale = 1.0 / count.max(1) as f64;
        let ty = v.ty.clone();
        v = ewise(e, &[&v], &ty, |a, b| {
            let c = b.constant(scale, d);
            b.op(&format!("arith.mulf {}, {c}", a[0]), t)
        })?;
    }
    expand_to(e, &v, out)
}

/// The scalar body of a one-input elementwise op, or `None` when it has none.
fn unary_body(op: OpKind, x: &str, b: &mut Body, d: DType) -> Option<String> {
    let t = elem(d);
    let f = d.is_float();
    Some(match op {
        OpKind::Neg if f => b.op(&format!("arith.negf {x}"), t),
        OpKind::Square if f => b.op(&format!("arith.mulf {x}, {x}"), t),
        OpKind::Square => b.op(&format!("arith.muli {x}, {x}"), t),
        OpKind::Sqrt if f => b.op(&format!("math.sqrt {x}"), t),
        OpKind::Exp if f => b.op(&format!("math.exp {x}"), t),
        OpKind::Log if f => b.op(&format!("math.log {x}"), t),
        OpKind::Tanh if f => b.op(&format!("math.tanh {x}"), t),
        OpKind::Erf if f => b.op(&format!("math.erf {x}"), t),
        OpKind::ReLU if f => {
            let z = b.constant(0.0, d);
            b.op(&format!("arith.maximumf {x}, {z}"), t)
        }
        OpKind::Sigmoid if f => sigmoid(b, x, t, d),
        OpKind::SiLU if f => {
            let s = sigmoid(b, x, t, d);
            b.op(&format!("arith.mulf {x}, {s}"), t)
        }
        OpKind::GeLU if f => {
            // MindSpore's tanh form: x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
            let x2 = b.op(&format!("arith.mulf {x}, {x}"), t);
            let x3 = b.op(&format!("arith.mulf {x2}, {x}"), t);
            let c = b.constant(0.044715, d);
            let cx3 = b.op(&format!("arith.mulf {c}, {x3}"), t);
            let inner = b.op(&format!("arith.addf {x}, {cx3}"), t);
            let k = b.constant((2.0 / std::f64::consts::PI).sqrt(), d);
            let arg = b.op(&format!("arith.mulf {k}, {inner}"), t);
            let th = b.op(&format!("math.tanh {arg}"), t);
            let one = b.constant(1.0, d);
            let s = b.op(&format!("arith.addf {one}, {th}"), t);
            let half = b.constant(0.5, d);
            let hx = b.op(&format!("arith.mulf {half}, {x}"), t);
            b.op(&format!("arith.mulf {hx}, {s}"), t)
        }
        _ => return None,
    })
}

/// Cast from `from` to `to` in a body, or `None` when not a plain conversion.
fn cast_body(x: &str, b: &mut Body, from: DType, to: DType) -> Option<String> {
    let (ft, tt) = (elem(from), elem(to));
    let width = |d: DType| match d {
        DType::Float16 | DType::BFloat16 => 16,
        DType::Float32 | DType::Int32 => 32,
        DType::Bool => 1,
        _ => 64,
    };
    let conv = |op: &str, b: &mut Body| b.raw(&format!("{op} {x} : {ft} to {tt}"));
    Some(match (from.is_float(), to.is_float()) {
        _ if from == to => return Some(x.to_string()),
        (true, true) if width(from) < width(to) => conv("arith.extf", b),
        (true, true) if width(from) > width(to) => conv("arith.truncf", b),
        (false, true) if from == DType::Bool => conv("arith.uitofp", b),
        (false, true) => conv("arith.sitofp", b),
        (true, false) if to != DType::Bool => conv("arith.fptosi", b),
        (false, false) if to != DType::Bool && width(from) < width(to) => {
            let op = if from == DType::Bool {
                "arith.extui"
            } else {
                "arith.extsi"
            };
            conv(op, b)
        }
        (false, false) if to != DType::Bool => conv("arith.trunci", b),
        _ => return None,
    })
}

/// Lowers `node` (of `g`) with its tensor operands `ins` (`None` for a constant).
pub fn lower(
    e: &mut Emitter,
    g: &Graph,
    node: &Node,
    ins: &[Option<Val>],
) -> Result<Lowered, Reason> {
    let _ = g;
    let op = node.op;
    let v = match op {
        OpKind::MatMul | OpKind::BatchMatMul => contraction(e, node, ins)?,
        OpKind::ReduceSum | OpKind::ReduceMean | OpKind::ReduceMax => reduction(e, node, ins)?,
        OpKind::Add | OpKind::Sub | OpKind::Mul | OpKind::RealDiv => {
            let out = out_ty(node)?.clone();
            let d = out.dtype;
            let sop = arith2(op, d)?;
            let t = elem(d);
            // A constant operand is a scalar of the body.
            match (
                ins.first().and_then(|v| v.as_ref()),
                ins.get(1).and_then(|v| v.as_ref()),
            ) {
                (Some(a), Some(b)) => ewise(e, &[a, b], &out, |x, body| {
                    body.op(&format!("{sop} {}, {}", x[0], x[1]), t)
                })?,
                (Some(a), None) | (None, Some(a)) => {
                    let first = ins.first().is_some_and(|v| v.is_some());
                    let c = konst(node, if first { 1 } else { 0 })
                        .and_then(Const::as_f64)
                        .ok_or_else(|| "a non-tensor operand that is no number".to_string())?;
                    ewise(e, &[a], &out, |x, body| {
                        let k = body.constant(c, d);
                        if first {
                            body.op(&format!("{sop} {}, {k}", x[0]), t)
                        } else {
                            body.op(&format!("{sop} {k}, {}", x[0]), t)
                        }
                    })?
                }
                (None, None) => return Err("no tensor operand".into()),
            }
        }
        OpKind::BiasAdd => {
            let x = arg(node, ins, 0)?;
            let b = arg(node, ins, 1)?;
            let out = out_ty(node)?.clone();
            if out.shape.len() < 2 || b.ty.shape.len() != 1 {
                return Err("BiasAdd needs x of rank 2 at least and a rank-1 bias".into());
            }
            let t = elem(out.dtype);
            let sop = arith2(OpKind::Add, out.dtype)?;
            let init = e.empty(&out);
            let all: Vec<usize> = (0..out.shape.len()).collect();
            e.generic(
                None,
                out.shape.len(),
                &[],
                &[
                    GenericInput {
                        val: x,
                        dims: all.clone(),
                    },
                    GenericInput {
                        val: b,
                        dims: vec![1],
                    },
                ],
                &init,
                &all,
                |a, body| body.op(&format!("{sop} {}, {}", a[0], a[1]), t),
            )
        }
        OpKind::Equal => {
            let a = arg(node, ins, 0)?;
            let b = arg(node, ins, 1)?;
            let out = out_ty(node)?.clone();
            let d = a.ty.dtype;
            let t = elem(d);
            let cmp = if d.is_float() {
                "arith.cmpf oeq"
            } else {
                "arith.cmpi eq"
            };
            ewise(e, &[a, b], &out, |x, body| {
                body.raw(&format!("{cmp}, {}, {} : {t}", x[0], x[1]))
            })?
        }
        OpKind::Neg
        | OpKind::Square
        | OpKind::Sqrt
        | OpKind::Exp
        | OpKind::Log
        | OpKind::ReLU
        | OpKind::GeLU
        | OpKind::Sigmoid
        | OpKind::Tanh
        | OpKind::SiLU
        | OpKind::Erf => {
            let x = arg(node, ins, 0)?;
            let out = out_ty(node)?.clone();
            let d = out.dtype;
            let mut probe = Body::new();
            if unary_body(op, "%x", &mut probe, d).is_none() {
                return Ok(Lowered::External);
            }
            ewise(e, &[x], &out, |a, b| {
                unary_body(op, &a[0], b, d).unwrap_or_else(|| a[0].clone())
            })?
        }
        OpKind::Cast => {
            let x = arg(node, ins, 0)?;
            let out = out_ty(node)?.clone();
            let (from, to) = (x.ty.dtype, out.dtype);
            let mut probe = Body::new();
            if cast_body("%x", &mut probe, from, to).is_none() {
                return Ok(Lowered::External);
            }
            ewise(e, &[x], &out, |a, b| {
                cast_body(&a[0], b, from, to).unwrap_or_else(|| a[0].clone())
            })?
        }
        OpKind::ReluGrad
        | OpKind::SigmoidGrad
        | OpKind::TanhGrad
        | OpKind::SqrtGrad
        | OpKind::DropoutGrad => {
            let a = arg(node, ins, 0)?;
            let b = arg(node, ins, 1)?;
            let out = out_ty(node)?.clone();
            let d = out.dtype;
            if !d.is_float() {
                return Ok(Lowered::External);
            }
            let t = elem(d);
            ewise(e, &[a, b], &out, |x, body| match op {
                // ReluGrad(dy, y): dy where y > 0.
                OpKind::ReluGrad => {
                    let z = body.constant(0.0, d);
                    let c = body.raw(&format!("arith.cmpf ogt, {}, {z} : {t}", x[1]));
                    body.op(&format!("arith.select {c}, {}, {z}", x[0]), t)
                }
                // SigmoidGrad(y, dy): dy y (1 - y).
                OpKind::SigmoidGrad => {
                    let one = body.constant(1.0, d);
                    let om = body.op(&format!("arith.subf {one}, {}", x[0]), t);
                    let yy = body.op(&format!("arith.mulf {}, {om}", x[0]), t);
                    body.op(&format!("arith.mulf {}, {yy}", x[1]), t)
                }
                // TanhGrad(y, dy): dy (1 - y^2).
                OpKind::TanhGrad => {
                    let one = body.constant(1.0, d);
                    let y2 = body.op(&format!("arith.mulf {}, {}", x[0], x[0]), t);
                    let om = body.op(&format!("arith.subf {one}, {y2}"), t);
                    body.op(&format!("arith.mulf {}, {om}", x[1]), t)
                }
                // SqrtGrad(y, dy): dy / (2 y).
                OpKind::SqrtGrad => {
                    let two = body.constant(2.0, d);
                    let ty2 = body.op(&format!("arith.mulf {two}, {}", x[0]), t);
                    body.op(&format!("arith.divf {}, {ty2}", x[1]), t)
                }
                // DropoutGrad(dy, mask): dy mask.
                _ => body.op(&format!("arith.mulf {}, {}", x[0], x[1]), t),
            })?
        }
        OpKind::BroadcastTo => {
            let x = arg(node, ins, 0)?;
            let out = out_ty(node)?.clone();
            ewise(e, &[x], &out, |a, _| a[0].clone())?
        }
        OpKind::ZerosLike | OpKind::OnesLike => {
            let out = out_ty(node)?.clone();
            e.filled(if op == OpKind::OnesLike { 1.0 } else { 0.0 }, &out)
        }
        OpKind::Transpose => {
            let x = arg(node, ins, 0)?;
            let out = out_ty(node)?.clone();
            let perm = konst(node, 1)
                .and_then(Const::as_ints)
                .ok_or_else(|| "the perm operand is not an Ints constant".to_string())?;
            let r = x.ty.shape.len();
            let mut dims = vec![usize::MAX; r];
            for (j, &p) in perm.iter().enumerate() {
                let p = if p < 0 { p + r as i64 } else { p };
                let slot = usize::try_from(p)
                    .ok()
                    .and_then(|p| dims.get_mut(p))
                    .ok_or_else(|| format!("perm {perm:?} is no permutation of {r} axes"))?;
                *slot = j;
            }
            if perm.len() != r || dims.contains(&usize::MAX) {
                return Err(format!("perm {perm:?} is no permutation of {r} axes"));
            }
            let init = e.empty(&out);
            let all: Vec<usize> = (0..r).collect();
            e.generic(
                None,
                r,
                &[],
                &[GenericInput { val: x, dims }],
                &init,
                &all,
                |a, _| a[0].clone(),
            )
        }
        OpKind::Reshape => {
            let x = arg(node, ins, 0)?;
            let out = out_ty(node)?.clone();
            let shape: Vec<String> = out.shape.iter().map(|s| s.to_string()).collect();
            let s = e.fresh();
            e.line(format!(
                "{s} = arith.constant dense<[{}]> : tensor<{}xi64>",
                shape.join(", "),
                shape.len()
            ));
            let name = e.fresh();
            e.line(format!(
                "{name} = tensor.reshape {}({s}) : ({}, tensor<{}xi64>) -> {}",
                x.name,
                tensor_ty(&x.ty),
                shape.len(),
                tensor_ty(&out)
            ));
            Val { name, ty: out }
        }
        OpKind::StridedSlice => {
            let x = arg(node, ins, 0)?;
            let out = out_ty(node)?.clone();
            for m in [
                "begin_mask",
                "end_mask",
                "ellipsis_mask",
                "new_axis_mask",
                "shrink_axis_mask",
            ] {
                if node.attrs.int_or(m, 0) != 0 {
                    return Err(format!("{m} is not 0"));
                }
            }
            let ints = |i: usize, what: &str| {
                konst(node, i)
                    .and_then(Const::as_ints)
                    .ok_or_else(|| format!("the {what} operand is not an Ints constant"))
            };
            let begin = ints(1, "begin")?;
            let strides = ints(3, "strides")?;
            let r = x.ty.shape.len();
            if begin.len() != r || strides.len() != r || out.shape.len() != r {
                return Err("begin, end and strides need one entry per dimension".into());
            }
            let b: Vec<String> = begin
                .iter()
                .zip(&x.ty.shape)
                .map(|(&b, &n)| {
                    let b = if b < 0 { b + n as i64 } else { b };
                    b.clamp(0, n as i64).to_string()
                })
                .collect();
            if strides.iter().any(|&s| s <= 0) {
                return Err(format!("strides {strides:?}: only positive strides"));
            }
            let sz: Vec<String> = out.shape.iter().map(|s| s.to_string()).collect();
            let st: Vec<String> = strides.iter().map(|s| s.to_string()).collect();
            let name = e.fresh();
            e.line(format!(
                "{name} = tensor.extract_slice {}[{}] [{}] [{}] : {} to {}",
                x.name,
                b.join(", "),
                sz.join(", "),
                st.join(", "),
                tensor_ty(&x.ty),
                tensor_ty(&out)
            ));
            Val { name, ty: out }
        }
        OpKind::Concat => {
            let out = out_ty(node)?.clone();
            let r = out.shape.len() as i64;
            let axis = node.attrs.int_or("axis", 0);
            let axis = if axis < 0 { axis + r } else { axis };
            let vals: Vec<&Val> = ins.iter().flatten().collect();
            if vals.len() != ins.len() || vals.is_empty() {
                return Err("every operand of Concat must be a tensor".into());
            }
            let names: Vec<&str> = vals.iter().map(|v| v.name.as_str()).collect();
            let tys: Vec<String> = vals.iter().map(|v| tensor_ty(&v.ty)).collect();
            let name = e.fresh();
            e.line(format!(
                "{name} = tensor.concat dim({axis}) {} : ({}) -> {}",
                names.join(", "),
                tys.join(", "),
                tensor_ty(&out)
            ));
            Val { name, ty: out }
        }
        OpKind::Split => {
            let x = arg(node, ins, 0)?;
            let parts = node.ty.tensors().to_vec();
            let r = x.ty.shape.len() as i64;
            let axis = node.attrs.int_or("axis", 0);
            let axis = usize::try_from(if axis < 0 { axis + r } else { axis })
                .map_err(|_| format!("axis {axis} is outside a rank-{r} tensor"))?;
            let mut out = Vec::with_capacity(parts.len());
            let mut at = 0;
            for p in parts {
                let offs: Vec<String> = (0..x.ty.shape.len())
                    .map(|d| {
                        if d == axis {
                            at.to_string()
                        } else {
                            "0".into()
                        }
                    })
                    .collect();
                let sz: Vec<String> = p.shape.iter().map(|s| s.to_string()).collect();
                let ones = vec!["1"; sz.len()].join(", ");
                let name = e.fresh();
                e.line(format!(
                    "{name} = tensor.extract_slice {}[{}] [{}] [{ones}] : {} to {}",
                    x.name,
                    offs.join(", "),
                    sz.join(", "),
                    tensor_ty(&x.ty),
                    tensor_ty(&p)
                ));
                at += p.shape.get(axis).copied().unwrap_or(0);
                out.push(Val { name, ty: p });
            }
            return Ok(Lowered::Values(out));
        }
        _ => return Ok(Lowered::External),
    };
    Ok(Lowered::Values(vec![v]))
}
