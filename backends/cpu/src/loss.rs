//! Losses: softmax cross-entropy with dense and sparse labels.

use crate::real::{max_nan, Real};
use crate::util::{
    chunk_of, for_chunks, for_chunks2, index_tensor, par_map, Ctx, KResult, ELEMWISE_CHUNK,
};
use shardc_runtime::{Arg, Tensor};

/// `(max, log-sum-exp)` of a row.
#[inline]
fn row_lse<T: Real>(row: &[T]) -> (T, T) {
    let m = row.iter().fold(T::NEG_INFINITY, |a, &v| max_nan(a, v));
    let mut s = T::ZERO;
    for &v in row {
        s += (v - m).exp();
    }
    (m, m + s.ln())
}

fn nc(ctx: &Ctx<'_>, shape: &[usize]) -> KResult<(usize, usize)> {
    ctx.ensure(shape.len() == 2, || {
        format!("logits must be (N, C), got {shape:?}")
    })?;
    Ok((shape[0], shape[1]))
}

/// `SoftmaxCrossEntropyWithLogits(logits, labels)` -> `(loss (N), backprop (N, C))`.
pub(crate) fn softmax_ce<T: Real>(
    ctx: &Ctx<'_>,
    inputs: &[Arg<'_>],
    outputs: &mut [Tensor],
) -> KResult {
    let (sl, logits) = ctx.data::<T>(inputs, 0)?;
    let (sy, labels) = ctx.data::<T>(inputs, 1)?;
    let (n, c) = nc(ctx, sl)?;
    ctx.check_shape("labels", sy, sl)?;
    let mut outs = ctx.outs::<T>(outputs, 2)?;
    ctx.check_shape("loss", outs[0].0, &[n])?;
    ctx.check_shape("backprop", outs[1].0, sl)?;
    let (lo, bp) = outs.split_at_mut(1);
    let loss = &mut *lo[0].1;
    let back = &mut *bp[0].1;
    if c == 0 {
        loss.fill(T::ZERO);
        return Ok(());
    }
    let rows = (ELEMWISE_CHUNK / c).max(1);
    for_chunks2(ctx.par, loss, rows, back, rows * c, n * c, |ci, lc, bc| {
        for (ri, (l, brow)) in lc.iter_mut().zip(bc.chunks_mut(c)).enumerate() {
            let r = ci * rows + ri;
            let x = &logits[r * c..][..c];
            let y = &labels[r * c..][..c];
            let (_, lse) = row_lse(x);
            let mut acc = T::ZERO;
            for j in 0..c {
                acc += y[j] * (lse - x[j]);
                brow[j] = (x[j] - lse).exp() - y[j];
            }
            *l = acc;
        }
    });
    Ok(())
}

/// `SparseSoftmaxCrossEntropyWithLogits(logits, labels)`: the mean loss, or with `is_grad` its
/// gradient `(softmax - onehot) / N`.
pub(crate) fn sparse_softmax_ce<T: Real>(
    ctx: &Ctx<'_>,
    inputs: &[Arg<'_>],
    outputs: &mut [Tensor],
) -> KResult {
    let (sl, logits) = ctx.data::<T>(inputs, 0)?;
    let (sy, labels) = index_tensor(ctx, inputs, 1)?;
    let (n, c) = nc(ctx, sl)?;
    ctx.check_shape("labels", sy, &[n])?;
    for i in 0..n {
        let v = labels.get(i);
        ctx.ensure(v >= 0 && (v as usize) < c, || {
            format!("label {v} (row {i}) is out of range for {c} classes")
        })?;
    }
    let is_grad = ctx.node.attrs.bool_or("is_grad", false);
    let out_shape = ctx.out_shape(outputs, 0)?;
    let out = ctx.out::<T>(outputs, 0)?;
    if is_grad {
        ctx.check_shape("the gradient", &out_shape, sl)?;
        if c == 0 {
            return Ok(());
        }
        let inv_n = T::ONE / T::from_f64(n as f64);
        let chunk = chunk_of(c, ELEMWISE_CHUNK);
        for_chunks(ctx.par, out, chunk, n * c, |ci, oc| {
            for (ri, orow) in oc.chunks_mut(c).enumerate() {
                let r = ci * chunk / c + ri;
                let x = &logits[r * c..][..c];
                let (_, lse) = row_lse(x);
                let label = labels.get(r) as usize;
                for j in 0..c {
                    let p = (x[j] - lse).exp();
                    let t = if j == label { T::ONE } else { T::ZERO };
                    orow[j] = (p - t) * inv_n;
                }
            }
        });
    } else {
        ctx.ensure(out.len() == 1, || {
            format!("the loss must be a scalar, the result has shape {out_shape:?}")
        })?;
        let per_row: Vec<T> = par_map(ctx.par, n, n * c, |r| {
            let x = &logits[r * c..][..c];
            let (_, lse) = row_lse(x);
            lse - x[labels.get(r) as usize]
        });
        let mut s = T::ZERO;
        for v in per_row {
            s += v;
        }
        out[0] = s / T::from_f64(n as f64);
    }
    Ok(())
}
