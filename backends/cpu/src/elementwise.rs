//! Elementwise kernels: unary maps, broadcasting binary ops, Cast, Equal, Dropout, BiasAdd and
//! the elementwise gradients.

use crate::real::{Elem, Real};
use crate::util::{for_chunks, for_chunks2, with_any, Ctx, KResult, ELEMWISE_CHUNK};
use shardc_ir::{Const, OpKind};
use shardc_runtime::{Arg, Tensor};
use std::borrow::Cow;

/// `sqrt(2 / pi)`.
const GELU_C: f64 = 0.797_884_560_802_865_4;
/// The cubic coefficient of the tanh GeLU.
const GELU_A: f64 = 0.044_715;

/// A binary operand's shape and elements.
pub(crate) type OperandData<'t, T> = (Cow<'t, [usize]>, Cow<'t, [T]>);

/// A binary operand: a tensor, or a scalar constant as a rank-0 tensor.
pub(crate) fn operand<'t, T: Elem>(
    ctx: &Ctx<'_>,
    inputs: &[Arg<'t>],
    i: usize,
) -> KResult<OperandData<'t, T>> {
    match ctx.arg(inputs, i)? {
        Arg::Tensor(t) => {
            let (s, d) = ctx.view::<T>(t, i)?;
            Ok((Cow::Borrowed(s), Cow::Borrowed(d)))
        }
        Arg::Const(c) => {
            let v = match c {
                Const::Int(v) => T::from_i64(*v),
                Const::Float(v) => T::from_f64(*v),
                Const::Bool(b) => T::from_i64(*b as i64),
                Const::Ints(_) => {
                    return Err(ctx.err(format!(
                        "operand {i} must be a tensor or a scalar, got {c:?}"
                    )))
                }
            };
            Ok((Cow::Owned(Vec::new()), Cow::Owned(vec![v])))
        }
    }
}

/// A broadcast of two operands to a result shape, with dims of equal broadcast pattern merged.
struct Plan {
    /// Collapsed result dims (the last is the inner loop).
    dims: Vec<usize>,
    /// Stride of each collapsed dim in a (0 where broadcast).
    sa: Vec<usize>,
    /// Stride of each collapsed dim in b.
    sb: Vec<usize>,
}

impl Plan {
    fn new(ctx: &Ctx<'_>, out: &[usize], a: &[usize], b: &[usize]) -> KResult<Plan> {
        let r = out.len();
        let align = |what: &str, s: &[usize]| -> KResult<Vec<bool>> {
            ctx.ensure(s.len() <= r, || {
                format!("{what} shape {s:?} does not broadcast to the result shape {out:?}")
            })?;
            let lead = r - s.len();
            (0..r)
                .map(|i| {
                    let d = if i < lead { 1 } else { s[i - lead] };
                    if d == out[i] {
                        Ok(false)
                    } else if d == 1 {
                        Ok(true)
                    } else {
                        Err(ctx.err(format!(
                            "{what} shape {s:?} does not broadcast to the result shape {out:?}"
                        )))
                    }
                })
                .collect()
        };
        let ba = align("operand 0", a)?;
        let bb = align("operand 1", b)?;
        let mut dims: Vec<(usize, bool, bool)> = Vec::new();
        for i in 0..r {
            if out[i] == 1 {
                continue;
            }
            match dims.last_mut() {
                Some(last) if last.1 == ba[i] && last.2 == bb[i] => last.0 *= out[i],
                _ => dims.push((out[i], ba[i], bb[i])),
            }
        }
        if dims.is_empty() {
            dims.push((1, false, false));
        }
        let strides = |pick: fn(&(usize, bool, bool)) -> bool| {
            let mut s = vec![0; dims.len()];
            let mut acc = 1;
            for i in (0..dims.len()).rev() {
                if !pick(&dims[i]) {
                    s[i] = acc;
                    acc *= dims[i].0;
                }
            }
            s
        };
        let sa = strides(|d| d.1);
        let sb = strides(|d| d.2);
        Ok(Plan {
            dims: dims.iter().map(|d| d.0).collect(),
            sa,
            sb,
        })
    }

    /// Offsets in a and b of the start of outer row `row`.
    #[inline]
    fn row_offsets(&self, mut row: usize) -> (usize, usize) {
        let (mut oa, mut ob) = (0, 0);
        for d in (0..self.dims.len() - 1).rev() {
            let i = row % self.dims[d];
            row /= self.dims[d];
            oa += i * self.sa[d];
            ob += i * self.sb[d];
        }
        (oa, ob)
    }
}

/// `out[i] = f(a[..], b[..])` with numpy broadcasting of `a` and `b` to `out_shape`.
pub(crate) fn broadcast_zip<A, B, O, F>(
    ctx: &Ctx<'_>,
    out_shape: &[usize],
    (sa, a): (&[usize], &[A]),
    (sb, b): (&[usize], &[B]),
    out: &mut [O],
    f: F,
) -> KResult
where
    A: Copy + Sync,
    B: Copy + Sync,
    O: Send,
    F: Fn(A, B) -> O + Sync + Send,
{
    let plan = Plan::new(ctx, out_shape, sa, sb)?;
    let inner = *plan.dims.last().unwrap_or(&1);
    let (ia, ib) = (*plan.sa.last().unwrap_or(&0), *plan.sb.last().unwrap_or(&0));
    let total = out.len();
    for_chunks(ctx.par, out, ELEMWISE_CHUNK, total, |ci, oc| {
        let mut s = ci * ELEMWISE_CHUNK;
        let e = s + oc.len();
        while s < e {
            let (row, col) = (s / inner, s % inner);
            let len = (inner - col).min(e - s);
            let (oa, ob) = plan.row_offsets(row);
            let o = &mut oc[s - ci * ELEMWISE_CHUNK..][..len];
            match (ia, ib) {
                (0, 0) => {
                    let (x, y) = (a[oa], b[ob]);
                    o.iter_mut().for_each(|v| *v = f(x, y));
                }
                (0, _) => {
                    let x = a[oa];
                    let bs = &b[ob + col..][..len];
                    o.iter_mut().zip(bs).for_each(|(v, &y)| *v = f(x, y));
                }
                (_, 0) => {
                    let y = b[ob];
                    let as_ = &a[oa + col..][..len];
                    o.iter_mut().zip(as_).for_each(|(v, &x)| *v = f(x, y));
                }
                _ => {
                    let as_ = &a[oa + col..][..len];
                    let bs = &b[ob + col..][..len];
                    o.iter_mut()
                        .zip(as_.iter().zip(bs))
                        .for_each(|(v, (&x, &y))| *v = f(x, y));
                }
            }
            s += len;
        }
    });
    Ok(())
}

/// `out[i] = f(x[i])`.
pub(crate) fn map<A, O, F>(ctx: &Ctx<'_>, x: &[A], out: &mut [O], f: F) -> KResult
where
    A: Copy + Sync,
    O: Send,
    F: Fn(A) -> O + Sync + Send,
{
    ctx.ensure(x.len() == out.len(), || {
        format!(
            "{} input elements for {} result elements",
            x.len(),
            out.len()
        )
    })?;
    let total = out.len();
    for_chunks(ctx.par, out, ELEMWISE_CHUNK, total, |ci, oc| {
        let xs = &x[ci * ELEMWISE_CHUNK..][..oc.len()];
        oc.iter_mut().zip(xs).for_each(|(o, &v)| *o = f(v));
    });
    Ok(())
}

/// The tanh-approximated GeLU.
#[inline]
fn gelu<T: Real>(x: T) -> T {
    let c = T::from_f64(GELU_C);
    let a = T::from_f64(GELU_A);
    let half = T::from_f64(0.5);
    half * x * (T::ONE + (c * (x + a * x * x * x)).tanh_fast())
}

/// The exact derivative of [`gelu`].
#[inline]
fn gelu_grad<T: Real>(x: T) -> T {
    let c = T::from_f64(GELU_C);
    let a = T::from_f64(GELU_A);
    let half = T::from_f64(0.5);
    let three = T::from_f64(3.0);
    let t = (c * (x + a * x * x * x)).tanh_fast();
    half * (T::ONE + t) + half * x * (T::ONE - t * t) * c * (T::ONE + three * a * x * x)
}

/// A numerically stable logistic function.
#[inline]
fn sigmoid<T: Real>(x: T) -> T {
    if x >= T::ZERO {
        T::ONE / (T::ONE + (-x).exp())
    } else {
        let e = x.exp();
        e / (T::ONE + e)
    }
}

/// SiLU: `x * sigmoid(x)`.
#[inline]
fn silu<T: Real>(x: T) -> T {
    x * sigmoid(x)
}

/// SiLU's derivative times `dy`: `dy * s * (1 + x * (1 - s))`, `s = sigmoid(x)`.
#[inline]
fn silu_grad<T: Real>(dy: T, x: T) -> T {
    let s = sigmoid(x);
    dy * s * (T::ONE + x * (T::ONE - s))
}

/// The unary float ops.
pub(crate) fn unary<T: Real>(ctx: &Ctx<'_>, inputs: &[Arg<'_>], outputs: &mut [Tensor]) -> KResult {
    let (sx, x) = ctx.data::<T>(inputs, 0)?;
    let out_shape = ctx.out_shape(outputs, 0)?;
    ctx.check_shape("the result", &out_shape, sx)?;
    let out = ctx.out::<T>(outputs, 0)?;
    match ctx.node.op {
        OpKind::Neg => map(ctx, x, out, |v: T| -v),
        OpKind::Square => map(ctx, x, out, |v: T| v * v),
        OpKind::Sqrt => map(ctx, x, out, |v: T| v.sqrt()),
        OpKind::Exp => map(ctx, x, out, |v: T| v.exp()),
        OpKind::Log => map(ctx, x, out, |v: T| v.ln()),
        OpKind::ReLU => map(ctx, x, out, |v: T| if v > T::ZERO { v } else { T::ZERO }),
        OpKind::GeLU => map(ctx, x, out, gelu::<T>),
        OpKind::Sigmoid => map(ctx, x, out, sigmoid::<T>),
        OpKind::SiLU => map(ctx, x, out, silu::<T>),
        OpKind::Tanh => map(ctx, x, out, |v: T| v.tanh()),
        OpKind::Erf => map(ctx, x, out, |v: T| v.erf()),
        op => Err(ctx.err(format!("{op} is not a unary op"))),
    }
}

/// The broadcasting binary float ops and the two-operand elementwise gradients.
pub(crate) fn binary<T: Real>(
    ctx: &Ctx<'_>,
    inputs: &[Arg<'_>],
    outputs: &mut [Tensor],
) -> KResult {
    let (sa, a) = operand::<T>(ctx, inputs, 0)?;
    let (sb, b) = operand::<T>(ctx, inputs, 1)?;
    let out_shape = ctx.out_shape(outputs, 0)?;
    let out = ctx.out::<T>(outputs, 0)?;
    let (a, b) = ((&*sa, &*a), (&*sb, &*b));
    let two = T::from_f64(2.0);
    match ctx.node.op {
        OpKind::Add => broadcast_zip(ctx, &out_shape, a, b, out, |x: T, y: T| x + y),
        OpKind::Sub => broadcast_zip(ctx, &out_shape, a, b, out, |x: T, y: T| x - y),
        OpKind::Mul => broadcast_zip(ctx, &out_shape, a, b, out, |x: T, y: T| x * y),
        OpKind::RealDiv => broadcast_zip(ctx, &out_shape, a, b, out, |x: T, y: T| x / y),
        // ReluGrad(dy, y)
        OpKind::ReluGrad => broadcast_zip(ctx, &out_shape, a, b, out, |dy: T, y: T| {
            if y > T::ZERO {
                dy
            } else {
                T::ZERO
            }
        }),
        // SigmoidGrad(y, dy)
        OpKind::SigmoidGrad => broadcast_zip(ctx, &out_shape, a, b, out, |y: T, dy: T| {
            dy * y * (T::ONE - y)
        }),
        // TanhGrad(y, dy)
        OpKind::TanhGrad => broadcast_zip(ctx, &out_shape, a, b, out, |y: T, dy: T| {
            dy * (T::ONE - y * y)
        }),
        // SqrtGrad(y, dy)
        OpKind::SqrtGrad => broadcast_zip(ctx, &out_shape, a, b, out, |y: T, dy: T| dy / (two * y)),
        // SiLUGrad(dy, x)
        OpKind::SiLUGrad => broadcast_zip(ctx, &out_shape, a, b, out, silu_grad::<T>),
        // DropoutGrad(dy, mask)
        OpKind::DropoutGrad => broadcast_zip(ctx, &out_shape, a, b, out, |dy: T, m: T| dy * m),
        op => Err(ctx.err(format!("{op} is not a binary op"))),
    }
}

/// `GeLUGrad(dy, x, y)`: `dy * gelu'(x)`.
pub(crate) fn gelu_grad_kernel<T: Real>(
    ctx: &Ctx<'_>,
    inputs: &[Arg<'_>],
    outputs: &mut [Tensor],
) -> KResult {
    let (sdy, dy) = ctx.data::<T>(inputs, 0)?;
    let (sx, x) = ctx.data::<T>(inputs, 1)?;
    ctx.check_shape("x", sx, sdy)?;
    let out_shape = ctx.out_shape(outputs, 0)?;
    ctx.check_shape("the result", &out_shape, sx)?;
    let out = ctx.out::<T>(outputs, 0)?;
    broadcast_zip(ctx, &out_shape, (sdy, dy), (sx, x), out, |d: T, v: T| {
        d * gelu_grad(v)
    })
}

/// `BiasAdd(x, b)`: adds `b` along axis 1.
pub(crate) fn bias_add<T: Real>(
    ctx: &Ctx<'_>,
    inputs: &[Arg<'_>],
    outputs: &mut [Tensor],
) -> KResult {
    let (sx, x) = ctx.data::<T>(inputs, 0)?;
    let (sb, b) = ctx.data::<T>(inputs, 1)?;
    ctx.ensure(sx.len() >= 2 && sb.len() == 1 && sb[0] == sx[1], || {
        format!(
            "BiasAdd needs x of rank >= 2 and a bias of shape (C) = ({}), got {sx:?} and {sb:?}",
            sx.get(1).copied().unwrap_or(0)
        )
    })?;
    let out_shape = ctx.out_shape(outputs, 0)?;
    ctx.check_shape("the result", &out_shape, sx)?;
    let out = ctx.out::<T>(outputs, 0)?;
    let mut b_shape = vec![1usize; sx.len() - 1];
    b_shape[0] = sb[0];
    broadcast_zip(
        ctx,
        &out_shape,
        (sx, x),
        (&b_shape, b),
        out,
        |v: T, c: T| v + c,
    )
}

/// `Equal(a, b)` -> Bool, broadcasting, for any (equal) element types.
pub(crate) fn equal(ctx: &Ctx<'_>, inputs: &[Arg<'_>], outputs: &mut [Tensor]) -> KResult {
    let dtype = match (ctx.arg(inputs, 0)?, ctx.arg(inputs, 1)?) {
        (Arg::Tensor(t), _) | (_, Arg::Tensor(t)) => t.dtype(),
        _ => return Err(ctx.err("Equal needs at least one tensor operand")),
    };
    let out_shape = ctx.out_shape(outputs, 0)?;
    let out = ctx.out::<bool>(outputs, 0)?;
    with_any!(dtype, T => {
        let (sa, a) = operand::<T>(ctx, inputs, 0)?;
        let (sb, b) = operand::<T>(ctx, inputs, 1)?;
        broadcast_zip(ctx, &out_shape, (&*sa, &*a), (&*sb, &*b), out, |x: T, y: T| x == y)
    })
}

fn cast_from<S: Elem>(ctx: &Ctx<'_>, x: &[S], out: &mut Tensor) -> KResult {
    let dtype = out.dtype();
    with_any!(dtype, D => {
        let o = D::slice_mut(&mut out.data)
            .ok_or_else(|| ctx.err("internal: output buffer type"))?;
        if S::IS_INTEGRAL && D::IS_INTEGRAL {
            map(ctx, x, o, |v: S| D::from_i64(v.to_i64()))
        } else {
            map(ctx, x, o, |v: S| D::from_f64(v.to_f64()))
        }
    })
}

/// `Cast(x)` to the result's dtype (attr `dst_type`, when present, must agree).
pub(crate) fn cast(ctx: &Ctx<'_>, inputs: &[Arg<'_>], outputs: &mut [Tensor]) -> KResult {
    let x = ctx.tensor(inputs, 0)?;
    let out = outputs
        .first_mut()
        .ok_or_else(|| ctx.err("Cast has no output"))?;
    if let Some(dst) = ctx.node.attrs.get("dst_type").and_then(|a| a.as_str()) {
        let want = shardc_ir::DType::from_name(dst)
            .ok_or_else(|| ctx.err(format!("unknown dst_type `{dst}`")))?;
        ctx.ensure(want == out.dtype(), || {
            format!("dst_type {want} but the result is {}", out.dtype())
        })?;
    }
    ctx.check_shape("the result", &out.shape, &x.shape)?;
    with_any!(x.dtype(), S => {
        let (_, xs) = ctx.view::<S>(x, 0)?;
        cast_from::<S>(ctx, xs, out)
    })
}

/// `ZerosLike(x)` / `OnesLike(x)`.
pub(crate) fn fill_like(ctx: &Ctx<'_>, inputs: &[Arg<'_>], outputs: &mut [Tensor]) -> KResult {
    let x = ctx.tensor(inputs, 0)?;
    let out = outputs.first_mut().ok_or_else(|| ctx.err("no output"))?;
    ctx.check_shape("the result", &out.shape, &x.shape)?;
    let one = ctx.node.op == OpKind::OnesLike;
    let dtype = out.dtype();
    with_any!(dtype, D => {
        let o = D::slice_mut(&mut out.data).ok_or_else(|| ctx.err("internal: output buffer type"))?;
        o.fill(if one { D::one() } else { D::zero() });
        Ok(())
    })
}

/// The uniform number in `[0, 1)` of element `index` for (seed0, seed1, step): a counter-based
/// hash, so the mask depends on nothing else (not on threads, nor on chunking). The hash is
/// `shardc_ir::dropout`'s, which every backend uses.
#[inline(always)]
pub fn dropout_uniform(seed0: i64, seed1: i64, step: u64, index: u64) -> f64 {
    shardc_ir::dropout::uniform(shardc_ir::dropout::key(seed0, seed1, step), index)
}

/// Where a block of a sharded Dropout sits in the global tensor: from the optional attrs
/// `global_shape` and `offset` ([`shardc_ir::block::Block`]). Local element `i` (row-major in
/// the block's shape) is global element `global(i)`, so that the block draws the single
/// device's mask for its elements.
struct DropoutBlock {
    local: Vec<usize>,
    offset: Vec<u64>,
    global_strides: Vec<u64>,
}

impl DropoutBlock {
    /// The block of `ctx`'s node for a local tensor of shape `local`, `None` when the node
    /// has neither attribute (the tensor is the whole tensor).
    fn of(ctx: &Ctx<'_>, local: &[usize]) -> KResult<Option<DropoutBlock>> {
        let Some(block) =
            shardc_ir::block::Block::of(&ctx.node.attrs, local).map_err(|e| ctx.err(e))?
        else {
            return Ok(None);
        };
        let global = &block.global_shape;
        let mut global_strides = vec![1u64; local.len()];
        for d in (0..local.len().saturating_sub(1)).rev() {
            global_strides[d] = global_strides[d + 1].wrapping_mul(global[d + 1] as u64);
        }
        Ok(Some(DropoutBlock {
            local: local.to_vec(),
            offset: block.offset.iter().map(|&o| o as u64).collect(),
            global_strides,
        }))
    }

    /// The global row-major index of local element `i`.
    #[inline]
    fn global(&self, mut i: usize) -> u64 {
        let mut g = 0u64;
        for d in (0..self.local.len()).rev() {
            let n = self.local[d];
            let c = i % n;
            i /= n;
            g = g.wrapping_add((self.offset[d] + c as u64).wrapping_mul(self.global_strides[d]));
        }
        g
    }
}

/// `Dropout(x)` -> `(y, mask)`. With `global_shape` and `offset` (a block of a sharded
/// tensor), each element's mask is drawn from its global index.
pub(crate) fn dropout<T: Real>(
    ctx: &Ctx<'_>,
    inputs: &[Arg<'_>],
    outputs: &mut [Tensor],
) -> KResult {
    let (sx, x) = ctx.data::<T>(inputs, 0)?;
    let keep = ctx.node.attrs.float_or("keep_prob", 0.5);
    ctx.ensure(keep > 0.0 && keep <= 1.0, || {
        format!("keep_prob must be in (0, 1], got {keep}")
    })?;
    // The per-step key once; only the element index varies in the loop.
    let key = shardc_ir::dropout::key(
        ctx.node.attrs.int_or("seed0", 0),
        ctx.node.attrs.int_or("seed1", 0),
        ctx.step,
    );
    let block = DropoutBlock::of(ctx, sx)?;
    let mut outs = ctx.outs::<T>(outputs, 2)?;
    for (i, (s, _)) in outs.iter().enumerate() {
        ctx.check_shape(if i == 0 { "y" } else { "mask" }, s, sx)?;
    }
    let (_, mask) = outs.pop().ok_or_else(|| ctx.err("internal: outputs"))?;
    let (_, y) = outs.pop().ok_or_else(|| ctx.err("internal: outputs"))?;
    let scale = T::from_f64(1.0 / keep);
    let total = x.len();
    let block = block.as_ref();
    for_chunks2(
        ctx.par,
        y,
        ELEMWISE_CHUNK,
        mask,
        ELEMWISE_CHUNK,
        total,
        |ci, yc, mc| {
            let base = ci * ELEMWISE_CHUNK;
            for (j, (yv, mv)) in yc.iter_mut().zip(mc.iter_mut()).enumerate() {
                let i = base + j;
                let index = match block {
                    None => i as u64,
                    Some(b) => b.global(i),
                };
                let m = if shardc_ir::dropout::uniform(key, index) < keep {
                    scale
                } else {
                    T::ZERO
                };
                *mv = m;
                *yv = x[i] * m;
            }
        },
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::CpuBackend;
    use shardc_ir::{Attr, Attrs, Node, OpKind, Operand, ParamId};
    use shardc_runtime::{Arg, Backend, KernelContext, Tensor};

    /// Runs Dropout on ones of `shape` with `extra` attrs; returns the mask.
    fn mask(shape: &[usize], extra: &[(&str, Attr)]) -> Result<Vec<f64>, String> {
        let mut node = Node::new(OpKind::Dropout, vec![Operand::Param(ParamId(0))]);
        node.instance = "dropout".into();
        node.attrs = Attrs::new()
            .with("keep_prob", Attr::Float(0.5))
            .with("seed0", Attr::Int(3))
            .with("seed1", Attr::Int(11));
        for (k, v) in extra {
            node.attrs.set(*k, v.clone());
        }
        let n: usize = shape.iter().product();
        let x = Tensor::from_f64(shape.to_vec(), vec![1.0; n]).unwrap();
        let mut outs = vec![x.clone(), x.clone()];
        let ctx = KernelContext { step: 5, rank: 0 };
        CpuBackend::new()
            .run(&node, &[Arg::Tensor(&x)], &mut outs, &ctx)
            .map_err(|e| e.to_string())?;
        Ok(outs[1].to_f64_vec())
    }

    #[test]
    fn a_block_draws_the_global_mask_of_its_elements() {
        let full = mask(&[4, 6], &[]).unwrap();
        assert!(full.contains(&0.0) && full.contains(&2.0));
        let at = |offset: &[i64], shape: &[usize]| {
            mask(
                shape,
                &[
                    ("global_shape", Attr::ints(&[4, 6])),
                    ("offset", Attr::ints(offset)),
                ],
            )
            .unwrap()
        };
        let block = at(&[2, 3], &[2, 3]);
        for r in 0..2 {
            for c in 0..3 {
                assert_eq!(block[r * 3 + c], full[(2 + r) * 6 + 3 + c], "({r}, {c})");
            }
        }
        // The four (2, 3) blocks tile the full mask; the whole tensor at offset 0 is itself.
        for (or, oc) in [(0, 0), (0, 3), (2, 0)] {
            let b = at(&[or, oc], &[2, 3]);
            for r in 0..2 {
                for c in 0..3 {
                    assert_eq!(b[r * 3 + c], full[(or as usize + r) * 6 + oc as usize + c]);
                }
            }
        }
        assert_eq!(at(&[0, 0], &[4, 6]), full);
    }

    #[test]
    fn bad_blocks_are_errors() {
        let g = ("global_shape", Attr::ints(&[4, 6]));
        let e = mask(&[2, 3], &[g.clone(), ("offset", Attr::ints(&[3, 0]))]).unwrap_err();
        assert!(e.contains("Dropout 'dropout'"), "{e}");
        assert!(
            e.contains("does not fit in `global_shape` (4, 6) (dim 0)"),
            "{e}"
        );
        let e = mask(&[2, 3], std::slice::from_ref(&g)).unwrap_err();
        assert!(
            e.contains("`global_shape` is given without `offset`"),
            "{e}"
        );
        let e = mask(&[2, 3], &[g, ("offset", Attr::ints(&[0]))]).unwrap_err();
        assert!(e.contains("one entry per dim"), "{e}");
        let e = mask(&[2, 3], &[("offset", Attr::Str("x".into()))]).unwrap_err();
        assert!(
            e.contains("attribute `offset` must be a tuple of integers"),
            "{e}"
        );
    }
}
