//! Reductions (ReduceSum / ReduceMean / ReduceMax, BiasAddGrad) and the softmax family.
//!
//! Every output element is folded by one thread, over its inputs in row-major order, so the
//! results do not depend on the thread count.

use crate::real::{max_nan, Real};
use crate::util::{chunk_of, for_chunks, Ctx, KResult, ELEMWISE_CHUNK};
use shardc_ir::OpKind;
use shardc_runtime::{Arg, Tensor};

/// The fold of a reduction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fold {
    /// Sum.
    Sum,
    /// Sum divided by the count.
    Mean,
    /// Maximum (NaN propagates).
    Max,
}

impl Fold {
    #[inline(always)]
    fn init<T: Real>(self) -> T {
        match self {
            Fold::Sum | Fold::Mean => T::ZERO,
            Fold::Max => T::NEG_INFINITY,
        }
    }

    #[inline(always)]
    fn combine<T: Real>(self, acc: T, v: T) -> T {
        match self {
            Fold::Sum | Fold::Mean => acc + v,
            Fold::Max => max_nan(acc, v),
        }
    }
}

/// Offsets of every index of the given (size, stride) dims, row-major.
fn offsets(dims: &[(usize, usize)]) -> Vec<usize> {
    let mut offs = vec![0usize];
    for &(size, stride) in dims {
        let mut next = Vec::with_capacity(offs.len() * size);
        for &o in &offs {
            for i in 0..size {
                next.push(o + i * stride);
            }
        }
        offs = next;
    }
    offs
}

/// Reduces `x` (shape `shape`) over the axes flagged in `reduced`, into `out` (the kept axes
/// in order).
pub(crate) fn reduce_into<T: Real>(
    ctx: &Ctx<'_>,
    shape: &[usize],
    x: &[T],
    reduced: &[bool],
    fold: Fold,
    out: &mut [T],
) -> KResult {
    // Collapse: drop size-1 dims, merge neighbours of the same kind.
    let mut groups: Vec<(usize, bool)> = Vec::new();
    for (&d, &r) in shape.iter().zip(reduced) {
        if d == 1 {
            continue;
        }
        match groups.last_mut() {
            Some(g) if g.1 == r => g.0 *= d,
            _ => groups.push((d, r)),
        }
    }
    let count: usize = groups.iter().filter(|g| g.1).map(|g| g.0).product();
    let kept: usize = groups.iter().filter(|g| !g.1).map(|g| g.0).product();
    ctx.ensure(kept == out.len(), || {
        format!(
            "the reduction keeps {kept} elements, the result has {}",
            out.len()
        )
    })?;
    if shape.contains(&0) {
        // No input elements: every output is the fold's identity (NaN for a mean).
        let v = if fold == Fold::Mean {
            T::from_f64(f64::NAN)
        } else {
            fold.init::<T>()
        };
        out.fill(v);
        return Ok(());
    }
    let finish_f64 = |v: f64| -> f64 {
        if fold == Fold::Mean {
            v / count as f64
        } else {
            v
        }
    };
    // Strides of each group.
    let mut strides = vec![0usize; groups.len()];
    let mut acc = 1;
    for i in (0..groups.len()).rev() {
        strides[i] = acc;
        acc *= groups[i].0;
    }
    let inner_reduced = groups.last().map(|g| g.1).unwrap_or(false);
    let kept_dims: Vec<(usize, usize)> = groups
        .iter()
        .zip(&strides)
        .filter(|(g, _)| !g.1)
        .map(|(g, &s)| (g.0, s))
        .collect();
    let red_dims: Vec<(usize, usize)> = groups
        .iter()
        .zip(&strides)
        .filter(|(g, _)| g.1)
        .map(|(g, &s)| (g.0, s))
        .collect();
    let total = x.len();
    if inner_reduced {
        // Each output sums contiguous runs of the innermost group.
        let run = red_dims.last().map(|d| d.0).unwrap_or(1);
        let red_offs = offsets(&red_dims[..red_dims.len() - 1]);
        let kept_offs = offsets(&kept_dims);
        let chunk = (ELEMWISE_CHUNK / count.max(1)).max(1);
        for_chunks(ctx.par, out, chunk, total, |ci, oc| {
            for (j, o) in oc.iter_mut().enumerate() {
                let base = kept_offs[ci * chunk + j];
                if fold == Fold::Max {
                    let mut a = fold.init::<T>();
                    for &ro in &red_offs {
                        for &v in &x[base + ro..base + ro + run] {
                            a = fold.combine(a, v);
                        }
                    }
                    *o = a;
                    continue;
                }
                // Sums accumulate in f64: a long f32 sum drifts (a mean of 6.4 M squares,
                // GPT-2's MSE over its logits, was 0.8 % off).
                let mut a = 0f64;
                for &ro in &red_offs {
                    for &v in &x[base + ro..base + ro + run] {
                        a += v.to_f64();
                    }
                }
                *o = T::from_f64(finish_f64(a));
            }
        });
    } else {
        // Outputs come in rows of the innermost kept group; each row accumulates whole input
        // rows.
        let inner = kept_dims.last().map(|d| d.0).unwrap_or(1);
        let row_offs = offsets(&kept_dims[..kept_dims.len().saturating_sub(1)]);
        let red_offs = offsets(&red_dims);
        let chunk = (ELEMWISE_CHUNK / count.max(1)).max(64);
        for_chunks(ctx.par, out, chunk, total, |ci, oc| {
            let mut s = ci * chunk;
            let e = s + oc.len();
            // The f64 accumulators of a sum's row, allocated once per chunk.
            let mut acc: Vec<f64> = Vec::new();
            while s < e {
                let (q, col) = (s / inner, s % inner);
                let len = (inner - col).min(e - s);
                let o = &mut oc[s - ci * chunk..][..len];
                let base = row_offs[q] + col;
                if fold == Fold::Max {
                    o.fill(fold.init::<T>());
                    for &ro in &red_offs {
                        for (a, &v) in o.iter_mut().zip(&x[base + ro..base + ro + len]) {
                            *a = fold.combine(*a, v);
                        }
                    }
                } else {
                    // Sums accumulate in f64, as above.
                    acc.clear();
                    acc.resize(len, 0.0);
                    for &ro in &red_offs {
                        for (a, &v) in acc.iter_mut().zip(&x[base + ro..base + ro + len]) {
                            *a += v.to_f64();
                        }
                    }
                    for (o, &a) in o.iter_mut().zip(&acc) {
                        *o = T::from_f64(finish_f64(a));
                    }
                }
                s += len;
            }
        });
    }
    Ok(())
}

/// `ReduceSum` / `ReduceMean` / `ReduceMax(x, axes)` with `keep_dims`.
pub(crate) fn reduce<T: Real>(
    ctx: &Ctx<'_>,
    inputs: &[Arg<'_>],
    outputs: &mut [Tensor],
) -> KResult {
    let (sx, x) = ctx.data::<T>(inputs, 0)?;
    let axes = if inputs.len() > 1 {
        ctx.ints(inputs, 1)?
    } else {
        Vec::new()
    };
    let rank = sx.len();
    let mut reduced = vec![axes.is_empty(); rank];
    for &a in &axes {
        reduced[ctx.axis(a, rank)?] = true;
    }
    let keep = ctx.node.attrs.bool_or("keep_dims", false);
    let expected: Vec<usize> = sx
        .iter()
        .zip(&reduced)
        .filter_map(|(&d, &r)| match (r, keep) {
            (false, _) => Some(d),
            (true, true) => Some(1),
            (true, false) => None,
        })
        .collect();
    let out_shape = ctx.out_shape(outputs, 0)?;
    ctx.check_shape("the result", &out_shape, &expected)?;
    let fold = match ctx.node.op {
        OpKind::ReduceSum => Fold::Sum,
        OpKind::ReduceMean => Fold::Mean,
        _ => Fold::Max,
    };
    let out = ctx.out::<T>(outputs, 0)?;
    reduce_into(ctx, sx, x, &reduced, fold, out)
}

/// `BiasAddGrad(dy)`: sums every axis but 1.
pub(crate) fn bias_add_grad<T: Real>(
    ctx: &Ctx<'_>,
    inputs: &[Arg<'_>],
    outputs: &mut [Tensor],
) -> KResult {
    let (sdy, dy) = ctx.data::<T>(inputs, 0)?;
    ctx.ensure(sdy.len() >= 2, || {
        format!("dy must have rank >= 2, got {sdy:?}")
    })?;
    let out_shape = ctx.out_shape(outputs, 0)?;
    ctx.check_shape("the result", &out_shape, &[sdy[1]])?;
    let reduced: Vec<bool> = (0..sdy.len()).map(|i| i != 1).collect();
    let out = ctx.out::<T>(outputs, 0)?;
    reduce_into(ctx, sdy, dy, &reduced, Fold::Sum, out)
}

/// The `axis` attribute of the softmax family: an Int or a one-element tuple (default -1).
pub(crate) fn softmax_axis(ctx: &Ctx<'_>, rank: usize) -> KResult<usize> {
    let axis = match ctx.node.attrs.get("axis") {
        None => -1,
        Some(a) => match a.as_ints().as_deref() {
            Some([v]) => *v,
            _ => return Err(ctx.err(format!("attribute `axis` must be one integer, got {a:?}"))),
        },
    };
    ctx.axis(axis, rank)
}

/// Splits `shape` around `axis` into `(outer, len, inner)`.
pub(crate) fn split_axis(shape: &[usize], axis: usize) -> (usize, usize, usize) {
    (
        shape[..axis].iter().product(),
        shape[axis],
        shape[axis + 1..].iter().product(),
    )
}

/// `Softmax` / `LogSoftmax(x)` along `axis` (max-subtracted).
pub(crate) fn softmax<T: Real>(
    ctx: &Ctx<'_>,
    inputs: &[Arg<'_>],
    outputs: &mut [Tensor],
) -> KResult {
    let (sx, x) = ctx.data::<T>(inputs, 0)?;
    let out_shape = ctx.out_shape(outputs, 0)?;
    ctx.check_shape("the result", &out_shape, sx)?;
    let axis = softmax_axis(ctx, sx.len())?;
    let (_, len, inner) = split_axis(sx, axis);
    let log = ctx.node.op == OpKind::LogSoftmax;
    let out = ctx.out::<T>(outputs, 0)?;
    let block = len * inner;
    let chunk = chunk_of(block, ELEMWISE_CHUNK);
    let total = x.len();
    for_chunks(ctx.par, out, chunk, total, |ci, oc| {
        let mut m = vec![T::NEG_INFINITY; inner];
        let mut s = vec![T::ZERO; inner];
        for (bi, ob) in oc.chunks_mut(block).enumerate() {
            let xb = &x[ci * chunk + bi * block..][..block];
            m.fill(T::NEG_INFINITY);
            s.fill(T::ZERO);
            for row in xb.chunks(inner) {
                for (mi, &v) in m.iter_mut().zip(row) {
                    *mi = max_nan(*mi, v);
                }
            }
            for (orow, xrow) in ob.chunks_mut(inner).zip(xb.chunks(inner)) {
                for i in 0..inner {
                    let e = (xrow[i] - m[i]).exp();
                    s[i] += e;
                    orow[i] = e;
                }
            }
            if log {
                let ls: Vec<T> = s.iter().map(|v| v.ln()).collect();
                for (orow, xrow) in ob.chunks_mut(inner).zip(xb.chunks(inner)) {
                    for i in 0..inner {
                        orow[i] = xrow[i] - m[i] - ls[i];
                    }
                }
            } else {
                for orow in ob.chunks_mut(inner) {
                    for i in 0..inner {
                        orow[i] = orow[i] / s[i];
                    }
                }
            }
        }
    });
    Ok(())
}

/// `SoftmaxGrad(y, dy)`: `y * (dy - sum(dy * y))`; `LogSoftmaxGrad(y, dy)`:
/// `dy - exp(y) * sum(dy)`; sums along `axis`.
pub(crate) fn softmax_grad<T: Real>(
    ctx: &Ctx<'_>,
    inputs: &[Arg<'_>],
    outputs: &mut [Tensor],
) -> KResult {
    let (sy, y) = ctx.data::<T>(inputs, 0)?;
    let (sdy, dy) = ctx.data::<T>(inputs, 1)?;
    ctx.check_shape("dy", sdy, sy)?;
    let out_shape = ctx.out_shape(outputs, 0)?;
    ctx.check_shape("the result", &out_shape, sy)?;
    let axis = softmax_axis(ctx, sy.len())?;
    let (_, len, inner) = split_axis(sy, axis);
    let log = ctx.node.op == OpKind::LogSoftmaxGrad;
    let out = ctx.out::<T>(outputs, 0)?;
    let block = len * inner;
    let chunk = chunk_of(block, ELEMWISE_CHUNK);
    let total = y.len();
    for_chunks(ctx.par, out, chunk, total, |ci, oc| {
        let mut s = vec![T::ZERO; inner];
        for (bi, ob) in oc.chunks_mut(block).enumerate() {
            let start = ci * chunk + bi * block;
            let yb = &y[start..][..block];
            let db = &dy[start..][..block];
            s.fill(T::ZERO);
            for (yrow, drow) in yb.chunks(inner).zip(db.chunks(inner)) {
                for i in 0..inner {
                    s[i] += if log { drow[i] } else { drow[i] * yrow[i] };
                }
            }
            for ((orow, yrow), drow) in ob
                .chunks_mut(inner)
                .zip(yb.chunks(inner))
                .zip(db.chunks(inner))
            {
                for i in 0..inner {
                    orow[i] = if log {
                        drow[i] - yrow[i].exp() * s[i]
                    } else {
                        yrow[i] * (drow[i] - s[i])
                    };
                }
            }
        }
    });
    Ok(())
}
