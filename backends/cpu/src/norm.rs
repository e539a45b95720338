//! BatchNorm and LayerNorm, forward and backward (two-pass statistics, per-channel / per-row
//! folds on one thread each), and the synchronised BatchNorm ops (`BNTrainingReduce`,
//! `BNTrainingUpdate`, `BNTrainingUpdateGrad`, `BNTrainingReduceGrad`) that compute the same
//! from per-channel sums that an AllReduce completes over a split batch.

use crate::real::Real;
use crate::util::{chunk_of, for_chunks, for_chunks2, par_map, Ctx, KResult, ELEMWISE_CHUNK};
use shardc_runtime::{Arg, Tensor};

/// `(n, c, s)` of an `(N, C, ...)` tensor.
fn ncs(ctx: &Ctx<'_>, shape: &[usize]) -> KResult<(usize, usize, usize)> {
    ctx.ensure(shape.len() >= 2, || {
        format!("x must have rank >= 2 (N, C, ...), got {shape:?}")
    })?;
    Ok((shape[0], shape[1], shape[2..].iter().product()))
}

/// Operand `i`, a per-channel vector of length `c`.
fn channel_vec<'t, T: Real>(
    ctx: &Ctx<'_>,
    inputs: &[Arg<'t>],
    i: usize,
    what: &str,
    c: usize,
) -> KResult<&'t [T]> {
    let (s, v) = ctx.data::<T>(inputs, i)?;
    ctx.ensure(v.len() == c, || {
        format!("{what} has shape {s:?}, expected ({c})")
    })?;
    Ok(v)
}

/// Folds `f(value)` over channel `ch` of an `(n, c, s)` tensor, in memory order.
#[inline]
fn channel_fold<T: Real>(
    x: &[T],
    (n, c, s): (usize, usize, usize),
    ch: usize,
    mut f: impl FnMut(usize, T),
) {
    for ni in 0..n {
        let base = (ni * c + ch) * s;
        for (j, &v) in x[base..base + s].iter().enumerate() {
            f(base + j, v);
        }
    }
}

/// `BatchNorm(x, scale, bias, mean, variance)` -> `(y, batch_mean, batch_variance,
/// saved_mean, saved_rstd)`.
pub(crate) fn batch_norm<T: Real>(
    ctx: &Ctx<'_>,
    inputs: &[Arg<'_>],
    outputs: &mut [Tensor],
) -> KResult {
    let (sx, x) = ctx.data::<T>(inputs, 0)?;
    let dims @ (n, c, s) = ncs(ctx, sx)?;
    let scale = channel_vec::<T>(ctx, inputs, 1, "scale", c)?;
    let bias = channel_vec::<T>(ctx, inputs, 2, "bias", c)?;
    let mean_in = channel_vec::<T>(ctx, inputs, 3, "mean", c)?;
    let var_in = channel_vec::<T>(ctx, inputs, 4, "variance", c)?;
    let training = ctx.node.attrs.bool_or("is_training", true);
    let eps = T::from_f64(ctx.node.attrs.float_or("epsilon", 1e-5));
    let mut outs = ctx.outs::<T>(outputs, 5)?;
    ctx.check_shape("y", outs[0].0, sx)?;
    for (i, name) in [
        (1, "batch_mean"),
        (2, "batch_variance"),
        (3, "saved_mean"),
        (4, "saved_rstd"),
    ] {
        ctx.check_shape(name, outs[i].0, &[c])?;
    }
    let m = n * s;
    // (mean, biased variance, unbiased variance) per channel.
    let stats: Vec<(T, T, T)> = if training {
        par_map(ctx.par, c, x.len(), |ch| {
            let mut sum = T::ZERO;
            channel_fold(x, dims, ch, |_, v| sum += v);
            let mean = sum / T::from_f64(m as f64);
            let mut sq = T::ZERO;
            channel_fold(x, dims, ch, |_, v| {
                let d = v - mean;
                sq += d * d;
            });
            let var = if m > 0 {
                sq / T::from_f64(m as f64)
            } else {
                T::ZERO
            };
            let unbiased = if m > 1 {
                sq / T::from_f64((m - 1) as f64)
            } else {
                var
            };
            (mean, var, unbiased)
        })
    } else {
        (0..c)
            .map(|ch| (mean_in[ch], var_in[ch], var_in[ch]))
            .collect()
    };
    let rstd: Vec<T> = stats
        .iter()
        .map(|st| T::ONE / (st.1 + eps).sqrt())
        .collect();
    for ch in 0..c {
        outs[1].1[ch] = stats[ch].0;
        outs[2].1[ch] = stats[ch].2;
        outs[3].1[ch] = stats[ch].0;
        outs[4].1[ch] = rstd[ch];
    }
    let mean: Vec<T> = stats.iter().map(|st| st.0).collect();
    normalize(ctx, x, dims, &mean, &rstd, scale, bias, &mut *outs[0].1);
    Ok(())
}

/// `y = (x - mean) * (rstd * scale) + bias` per channel of an `(n, c, s)` tensor, in
/// chunks of whole planes (split by shape only).
#[allow(clippy::too_many_arguments)]
fn normalize<T: Real>(
    ctx: &Ctx<'_>,
    x: &[T],
    (_, c, s): (usize, usize, usize),
    mean: &[T],
    rstd: &[T],
    scale: &[T],
    bias: &[T],
    y: &mut [T],
) {
    if s == 0 {
        return;
    }
    for_chunks(
        ctx.par,
        y,
        chunk_of(s, ELEMWISE_CHUNK),
        x.len(),
        |ci, yc| {
            let start = ci * chunk_of(s, ELEMWISE_CHUNK);
            for (pi, yp) in yc.chunks_mut(s).enumerate() {
                let plane = start / s + pi;
                let ch = plane % c;
                let k = rstd[ch] * scale[ch];
                let (mu, b) = (mean[ch], bias[ch]);
                for (o, &v) in yp.iter_mut().zip(&x[(start / s + pi) * s..][..s]) {
                    *o = (v - mu) * k + b;
                }
            }
        },
    );
}

/// The `count` attribute of the synchronised BatchNorm ops (the global elements per channel).
fn bn_count<T: Real>(ctx: &Ctx<'_>) -> KResult<T> {
    let n = ctx.node.attrs.int_or("count", 0);
    ctx.ensure(n >= 1, || {
        format!(
            "attribute `count` must be >= 1 (the global number of elements per channel), got {n}"
        )
    })?;
    Ok(T::from_f64(n as f64))
}

/// `BNTrainingReduce(x)` -> `(sum, square_sum)` per channel, each channel folded in memory
/// order on one thread.
pub(crate) fn bn_training_reduce<T: Real>(
    ctx: &Ctx<'_>,
    inputs: &[Arg<'_>],
    outputs: &mut [Tensor],
) -> KResult {
    let (sx, x) = ctx.data::<T>(inputs, 0)?;
    let dims @ (_, c, _) = ncs(ctx, sx)?;
    let mut outs = ctx.outs::<T>(outputs, 2)?;
    ctx.check_shape("sum", outs[0].0, &[c])?;
    ctx.check_shape("square_sum", outs[1].0, &[c])?;
    let sums: Vec<(T, T)> = par_map(ctx.par, c, x.len(), |ch| {
        let (mut sum, mut sq) = (T::ZERO, T::ZERO);
        channel_fold(x, dims, ch, |_, v| {
            sum += v;
            sq += v * v;
        });
        (sum, sq)
    });
    for (ch, &(sum, sq)) in sums.iter().enumerate() {
        outs[0].1[ch] = sum;
        outs[1].1[ch] = sq;
    }
    Ok(())
}

/// `BNTrainingUpdate(x, sum, square_sum, scale, bias)` -> `(y, batch_mean, batch_variance,
/// saved_mean, saved_rstd)` from the global sums and attr `count`.
pub(crate) fn bn_training_update<T: Real>(
    ctx: &Ctx<'_>,
    inputs: &[Arg<'_>],
    outputs: &mut [Tensor],
) -> KResult {
    let (sx, x) = ctx.data::<T>(inputs, 0)?;
    let dims @ (_, c, _) = ncs(ctx, sx)?;
    let sum = channel_vec::<T>(ctx, inputs, 1, "sum", c)?;
    let square_sum = channel_vec::<T>(ctx, inputs, 2, "square_sum", c)?;
    let scale = channel_vec::<T>(ctx, inputs, 3, "scale", c)?;
    let bias = channel_vec::<T>(ctx, inputs, 4, "bias", c)?;
    let count = bn_count::<T>(ctx)?;
    let eps = T::from_f64(ctx.node.attrs.float_or("epsilon", 1e-5));
    let mut outs = ctx.outs::<T>(outputs, 5)?;
    ctx.check_shape("y", outs[0].0, sx)?;
    for (i, name) in [
        (1, "batch_mean"),
        (2, "batch_variance"),
        (3, "saved_mean"),
        (4, "saved_rstd"),
    ] {
        ctx.check_shape(name, outs[i].0, &[c])?;
    }
    let mut mean = vec![T::ZERO; c];
    let mut rstd = vec![T::ZERO; c];
    for ch in 0..c {
        let mu = sum[ch] / count;
        // The biased variance E[x^2] - E[x]^2 (never below zero through rounding).
        let mut var = square_sum[ch] / count - mu * mu;
        if var < T::ZERO {
            var = T::ZERO;
        }
        let unbiased = if count > T::ONE {
            var * count / (count - T::ONE)
        } else {
            var
        };
        mean[ch] = mu;
        rstd[ch] = T::ONE / (var + eps).sqrt();
        outs[1].1[ch] = mu;
        outs[2].1[ch] = unbiased;
        outs[3].1[ch] = mu;
        outs[4].1[ch] = rstd[ch];
    }
    normalize(ctx, x, dims, &mean, &rstd, scale, bias, &mut *outs[0].1);
    Ok(())
}

/// `BNTrainingUpdateGrad(dy, x, saved_mean, saved_rstd)` -> `(dscale, dbias)` per channel.
pub(crate) fn bn_training_update_grad<T: Real>(
    ctx: &Ctx<'_>,
    inputs: &[Arg<'_>],
    outputs: &mut [Tensor],
) -> KResult {
    let (sdy, dy) = ctx.data::<T>(inputs, 0)?;
    let (sx, x) = ctx.data::<T>(inputs, 1)?;
    ctx.check_shape("dy", sdy, sx)?;
    let dims @ (_, c, _) = ncs(ctx, sx)?;
    let mean = channel_vec::<T>(ctx, inputs, 2, "saved_mean", c)?;
    let rstd = channel_vec::<T>(ctx, inputs, 3, "saved_rstd", c)?;
    let mut outs = ctx.outs::<T>(outputs, 2)?;
    ctx.check_shape("dscale", outs[0].0, &[c])?;
    ctx.check_shape("dbias", outs[1].0, &[c])?;
    let sums = grad_sums(ctx, dy, x, dims, mean, rstd);
    for (ch, &(ds, db)) in sums.iter().enumerate() {
        outs[0].1[ch] = ds;
        outs[1].1[ch] = db;
    }
    Ok(())
}

/// `(sum(dy * xhat), sum(dy))` per channel, each folded in memory order on one thread.
fn grad_sums<T: Real>(
    ctx: &Ctx<'_>,
    dy: &[T],
    x: &[T],
    dims: (usize, usize, usize),
    mean: &[T],
    rstd: &[T],
) -> Vec<(T, T)> {
    par_map(ctx.par, dims.1, x.len(), |ch| {
        let (mut ds, mut db) = (T::ZERO, T::ZERO);
        channel_fold(x, dims, ch, |i, v| {
            let xhat = (v - mean[ch]) * rstd[ch];
            ds += dy[i] * xhat;
            db += dy[i];
        });
        (ds, db)
    })
}

/// `dx = scale * rstd / m * (m * dy - dbias - xhat * dscale)` (training mode), `m` the
/// global count per channel.
#[allow(clippy::too_many_arguments)]
fn batch_norm_dx<T: Real>(
    ctx: &Ctx<'_>,
    dy: &[T],
    x: &[T],
    (_, c, s): (usize, usize, usize),
    m: T,
    scale: &[T],
    mean: &[T],
    rstd: &[T],
    sums: &[(T, T)],
    dx: &mut [T],
) {
    if s == 0 {
        return;
    }
    let chunk = chunk_of(s, ELEMWISE_CHUNK);
    for_chunks(ctx.par, dx, chunk, x.len(), |ci, dc| {
        for (pi, dp) in dc.chunks_mut(s).enumerate() {
            let plane = ci * chunk / s + pi;
            let ch = plane % c;
            let base = plane * s;
            let (mu, r, g) = (mean[ch], rstd[ch], scale[ch]);
            let (ds, db) = sums[ch];
            for (j, o) in dp.iter_mut().enumerate() {
                let i = base + j;
                let xhat = (x[i] - mu) * r;
                *o = g * r / m * (m * dy[i] - db - xhat * ds);
            }
        }
    });
}

/// `BNTrainingReduceGrad(dy, x, dscale, dbias, scale, saved_mean, saved_rstd)` -> dx, from
/// the global sums and attr `count`.
pub(crate) fn bn_training_reduce_grad<T: Real>(
    ctx: &Ctx<'_>,
    inputs: &[Arg<'_>],
    outputs: &mut [Tensor],
) -> KResult {
    let (sdy, dy) = ctx.data::<T>(inputs, 0)?;
    let (sx, x) = ctx.data::<T>(inputs, 1)?;
    ctx.check_shape("dy", sdy, sx)?;
    let dims @ (_, c, _) = ncs(ctx, sx)?;
    let dscale = channel_vec::<T>(ctx, inputs, 2, "dscale", c)?;
    let dbias = channel_vec::<T>(ctx, inputs, 3, "dbias", c)?;
    let scale = channel_vec::<T>(ctx, inputs, 4, "scale", c)?;
    let mean = channel_vec::<T>(ctx, inputs, 5, "saved_mean", c)?;
    let rstd = channel_vec::<T>(ctx, inputs, 6, "saved_rstd", c)?;
    let count = bn_count::<T>(ctx)?;
    let mut outs = ctx.outs::<T>(outputs, 1)?;
    ctx.check_shape("dx", outs[0].0, sx)?;
    let sums: Vec<(T, T)> = dscale.iter().zip(dbias).map(|(&a, &b)| (a, b)).collect();
    batch_norm_dx(
        ctx,
        dy,
        x,
        dims,
        count,
        scale,
        mean,
        rstd,
        &sums,
        &mut *outs[0].1,
    );
    Ok(())
}

/// `BatchNormGrad(dy, x, scale, saved_mean, saved_rstd)` -> `(dx, dscale, dbias)`.
pub(crate) fn batch_norm_grad<T: Real>(
    ctx: &Ctx<'_>,
    inputs: &[Arg<'_>],
    outputs: &mut [Tensor],
) -> KResult {
    let (sdy, dy) = ctx.data::<T>(inputs, 0)?;
    let (sx, x) = ctx.data::<T>(inputs, 1)?;
    ctx.check_shape("dy", sdy, sx)?;
    let dims @ (n, c, s) = ncs(ctx, sx)?;
    let scale = channel_vec::<T>(ctx, inputs, 2, "scale", c)?;
    let mean = channel_vec::<T>(ctx, inputs, 3, "saved_mean", c)?;
    let rstd = channel_vec::<T>(ctx, inputs, 4, "saved_rstd", c)?;
    let training = ctx.node.attrs.bool_or("is_training", true);
    let mut outs = ctx.outs::<T>(outputs, 3)?;
    ctx.check_shape("dx", outs[0].0, sx)?;
    ctx.check_shape("dscale", outs[1].0, &[c])?;
    ctx.check_shape("dbias", outs[2].0, &[c])?;
    // (dscale, dbias) per channel.
    let sums = grad_sums(ctx, dy, x, dims, mean, rstd);
    for (ch, &(ds, db)) in sums.iter().enumerate() {
        outs[1].1[ch] = ds;
        outs[2].1[ch] = db;
    }
    let m = T::from_f64((n * s) as f64);
    let dx = &mut *outs[0].1;
    if training {
        batch_norm_dx(ctx, dy, x, dims, m, scale, mean, rstd, &sums, dx);
        return Ok(());
    }
    if s == 0 {
        return Ok(());
    }
    let chunk = chunk_of(s, ELEMWISE_CHUNK);
    for_chunks(ctx.par, dx, chunk, x.len(), |ci, dc| {
        for (pi, dp) in dc.chunks_mut(s).enumerate() {
            let plane = ci * chunk / s + pi;
            let ch = plane % c;
            let base = plane * s;
            let (r, g) = (rstd[ch], scale[ch]);
            for (j, o) in dp.iter_mut().enumerate() {
                *o = dy[base + j] * g * r;
            }
        }
    });
    Ok(())
}

/// LayerNorm's layout: `(rows, row length, param length)` and the stats shape.
struct LnLayout {
    rows: usize,
    d: usize,
    p: usize,
    stats_shape: Vec<usize>,
}

fn ln_layout(ctx: &Ctx<'_>, sx: &[usize], gamma_shape: &[usize]) -> KResult<LnLayout> {
    let rank = sx.len();
    ctx.ensure(rank >= 1, || "x must have rank >= 1".to_string())?;
    let bna = ctx.axis(ctx.node.attrs.int_or("begin_norm_axis", -1), rank)?;
    let bpa = ctx.axis(ctx.node.attrs.int_or("begin_params_axis", -1), rank)?;
    ctx.check_shape("gamma", gamma_shape, &sx[bpa..])?;
    let mut stats_shape = sx.to_vec();
    for d in &mut stats_shape[bna..] {
        *d = 1;
    }
    Ok(LnLayout {
        rows: sx[..bna].iter().product(),
        d: sx[bna..].iter().product(),
        p: sx[bpa..].iter().product(),
        stats_shape,
    })
}

/// `LayerNorm(x, gamma, beta)` -> `(y, mean, rstd)`.
pub(crate) fn layer_norm<T: Real>(
    ctx: &Ctx<'_>,
    inputs: &[Arg<'_>],
    outputs: &mut [Tensor],
) -> KResult {
    let (sx, x) = ctx.data::<T>(inputs, 0)?;
    let (sg, gamma) = ctx.data::<T>(inputs, 1)?;
    let (sb, beta) = ctx.data::<T>(inputs, 2)?;
    ctx.check_shape("beta", sb, sg)?;
    let l = ln_layout(ctx, sx, sg)?;
    let eps = T::from_f64(ctx.node.attrs.float_or("epsilon", 1e-7));
    let mut outs = ctx.outs::<T>(outputs, 3)?;
    ctx.check_shape("y", outs[0].0, sx)?;
    ctx.check_shape("mean", outs[1].0, &l.stats_shape)?;
    ctx.check_shape("rstd", outs[2].0, &l.stats_shape)?;
    if l.d == 0 || l.rows == 0 {
        outs[1].1.fill(T::ZERO);
        outs[2].1.fill(T::ZERO);
        return Ok(());
    }
    let dlen = T::from_f64(l.d as f64);
    let stats: Vec<(T, T)> = par_map(ctx.par, l.rows, x.len(), |r| {
        let row = &x[r * l.d..][..l.d];
        let mut s = T::ZERO;
        row.iter().for_each(|&v| s += v);
        let mean = s / dlen;
        let mut sq = T::ZERO;
        row.iter().for_each(|&v| sq += (v - mean) * (v - mean));
        (mean, T::ONE / (sq / dlen + eps).sqrt())
    });
    for (r, st) in stats.iter().enumerate() {
        outs[1].1[r] = st.0;
        outs[2].1[r] = st.1;
    }
    let chunk = chunk_of(l.d, ELEMWISE_CHUNK);
    let y = &mut *outs[0].1;
    for_chunks(ctx.par, y, chunk, x.len(), |ci, yc| {
        let start = ci * chunk;
        for (j, o) in yc.iter_mut().enumerate() {
            let i = start + j;
            let (mu, rs) = stats[i / l.d];
            let pi = i % l.p;
            *o = (x[i] - mu) * rs * gamma[pi] + beta[pi];
        }
    });
    Ok(())
}

/// `LayerNormGrad(x, dy, rstd, mean, gamma)` -> `(dx, dgamma, dbeta)`.
pub(crate) fn layer_norm_grad<T: Real>(
    ctx: &Ctx<'_>,
    inputs: &[Arg<'_>],
    outputs: &mut [Tensor],
) -> KResult {
    let (sx, x) = ctx.data::<T>(inputs, 0)?;
    let (sdy, dy) = ctx.data::<T>(inputs, 1)?;
    let (_, rstd) = ctx.data::<T>(inputs, 2)?;
    let (_, mean) = ctx.data::<T>(inputs, 3)?;
    let (sg, gamma) = ctx.data::<T>(inputs, 4)?;
    ctx.check_shape("dy", sdy, sx)?;
    let l = ln_layout(ctx, sx, sg)?;
    ctx.ensure(rstd.len() == l.rows && mean.len() == l.rows, || {
        format!(
            "mean and rstd must have {} elements (shape {:?}), got {} and {}",
            l.rows,
            l.stats_shape,
            mean.len(),
            rstd.len()
        )
    })?;
    let mut outs = ctx.outs::<T>(outputs, 3)?;
    ctx.check_shape("dx", outs[0].0, sx)?;
    ctx.check_shape("dgamma", outs[1].0, sg)?;
    ctx.check_shape("dbeta", outs[2].0, sg)?;
    let (dx_part, rest) = outs.split_at_mut(1);
    let dx = &mut *dx_part[0].1;
    let (dg_part, db_part) = rest.split_at_mut(1);
    let dgamma = &mut *dg_part[0].1;
    let dbeta = &mut *db_part[0].1;
    if l.d == 0 || l.rows == 0 {
        dgamma.fill(T::ZERO);
        dbeta.fill(T::ZERO);
        return Ok(());
    }
    let (d, p) = (l.d, l.p);
    let dlen = T::from_f64(d as f64);
    // dx, row by row.
    let chunk = chunk_of(d, ELEMWISE_CHUNK);
    for_chunks(ctx.par, dx, chunk, x.len(), |ci, dc| {
        for (ri, drow) in dc.chunks_mut(d).enumerate() {
            let r = ci * chunk / d + ri;
            let base = r * d;
            let (mu, rs) = (mean[r], rstd[r]);
            let (mut sg_, mut sgx) = (T::ZERO, T::ZERO);
            for j in 0..d {
                let i = base + j;
                let g = dy[i] * gamma[i % p];
                sg_ += g;
                sgx += g * (x[i] - mu) * rs;
            }
            let (mg, mgx) = (sg_ / dlen, sgx / dlen);
            for (j, o) in drow.iter_mut().enumerate() {
                let i = base + j;
                let g = dy[i] * gamma[i % p];
                let xhat = (x[i] - mu) * rs;
                *o = rs * (g - mg - xhat * mgx);
            }
        }
    });
    // dgamma / dbeta: column sums of the (total / p, p) view.
    let q = x.len() / p;
    let pchunk = (ELEMWISE_CHUNK / q.max(1)).max(64);
    for_chunks2(
        ctx.par,
        dgamma,
        pchunk,
        dbeta,
        pchunk,
        x.len(),
        |ci, gc, bc| {
            gc.fill(T::ZERO);
            bc.fill(T::ZERO);
            let p0 = ci * pchunk;
            for qi in 0..q {
                for (j, (g, b)) in gc.iter_mut().zip(bc.iter_mut()).enumerate() {
                    let i = qi * p + p0 + j;
                    let r = i / d;
                    *g += dy[i] * (x[i] - mean[r]) * rstd[r];
                    *b += dy[i];
                }
            }
        },
    );
    Ok(())
}
