//! MaxPool / AvgPool and their gradients (NCHW, valid / same padding), parallel over planes.

use crate::real::Real;
use crate::util::{for_chunks, Ctx, KResult};
use shardc_ir::geometry::{pool2d_geometry, Pool2dGeometry};
use shardc_runtime::{Arg, Tensor};

/// The valid input rows and columns of output pixel `(oh, ow)`'s window.
#[inline]
fn window(g: &Pool2dGeometry, oh: usize, ow: usize) -> (usize, usize, usize, usize) {
    let h0 = (oh * g.stride_h) as isize - g.pad_top as isize;
    let w0 = (ow * g.stride_w) as isize - g.pad_left as isize;
    let h1 = (h0 + g.kh as isize).min(g.h as isize);
    let w1 = (w0 + g.kw as isize).min(g.w as isize);
    let h0 = h0.max(0);
    let w0 = w0.max(0);
    (
        h0 as usize,
        h1.max(h0) as usize,
        w0 as usize,
        w1.max(w0) as usize,
    )
}

/// Whether the op is a max pool (else average).
fn is_max(ctx: &Ctx<'_>) -> bool {
    matches!(
        ctx.node.op,
        shardc_ir::OpKind::MaxPool | shardc_ir::OpKind::MaxPoolGrad
    )
}

fn geometry(ctx: &Ctx<'_>, x: &[usize]) -> KResult<Pool2dGeometry> {
    pool2d_geometry(ctx.node, x).map_err(|e| ctx.err(e.reason))
}

/// `MaxPool(x)` / `AvgPool(x)` (padding excluded from the average).
pub(crate) fn pool<T: Real>(ctx: &Ctx<'_>, inputs: &[Arg<'_>], outputs: &mut [Tensor]) -> KResult {
    let (sx, x) = ctx.data::<T>(inputs, 0)?;
    let g = geometry(ctx, sx)?;
    let out_shape = ctx.out_shape(outputs, 0)?;
    ctx.check_shape("the result", &out_shape, &[g.n, g.c, g.out_h, g.out_w])?;
    let y = ctx.out::<T>(outputs, 0)?;
    let (pin, pout) = (g.h * g.w, g.out_h * g.out_w);
    let max = is_max(ctx);
    for_chunks(ctx.par, y, pout, y.len() * g.kh * g.kw, |plane, yp| {
        let xp = &x[plane * pin..][..pin];
        for oh in 0..g.out_h {
            for ow in 0..g.out_w {
                let (h0, h1, w0, w1) = window(&g, oh, ow);
                let v = if max {
                    let mut m = T::NEG_INFINITY;
                    for ih in h0..h1 {
                        for &v in &xp[ih * g.w + w0..ih * g.w + w1] {
                            m = crate::real::max_nan(m, v);
                        }
                    }
                    m
                } else {
                    let mut s = T::ZERO;
                    for ih in h0..h1 {
                        for &v in &xp[ih * g.w + w0..ih * g.w + w1] {
                            s += v;
                        }
                    }
                    let count = (h1 - h0) * (w1 - w0);
                    if count == 0 {
                        T::ZERO
                    } else {
                        s / T::from_f64(count as f64)
                    }
                };
                yp[oh * g.out_w + ow] = v;
            }
        }
    });
    Ok(())
}

/// `MaxPoolGrad(x, y, dy)` (to the first maximum of each window) / `AvgPoolGrad(x, y, dy)`.
pub(crate) fn pool_grad<T: Real>(
    ctx: &Ctx<'_>,
    inputs: &[Arg<'_>],
    outputs: &mut [Tensor],
) -> KResult {
    let (sx, x) = ctx.data::<T>(inputs, 0)?;
    let (sdy, dy) = ctx.data::<T>(inputs, 2)?;
    let g = geometry(ctx, sx)?;
    ctx.check_shape("dy", sdy, &[g.n, g.c, g.out_h, g.out_w])?;
    let out_shape = ctx.out_shape(outputs, 0)?;
    ctx.check_shape("the result", &out_shape, sx)?;
    let dx = ctx.out::<T>(outputs, 0)?;
    let (pin, pout) = (g.h * g.w, g.out_h * g.out_w);
    let max = is_max(ctx);
    for_chunks(ctx.par, dx, pin, dy.len() * g.kh * g.kw, |plane, dxp| {
        dxp.fill(T::ZERO);
        let xp = &x[plane * pin..][..pin];
        let dyp = &dy[plane * pout..][..pout];
        for oh in 0..g.out_h {
            for ow in 0..g.out_w {
                let (h0, h1, w0, w1) = window(&g, oh, ow);
                let d = dyp[oh * g.out_w + ow];
                if max {
                    let mut best: Option<(usize, T)> = None;
                    for ih in h0..h1 {
                        for iw in w0..w1 {
                            let v = xp[ih * g.w + iw];
                            let better = match best {
                                None => true,
                                Some((_, b)) => v > b || (v.is_nan() && !b.is_nan()),
                            };
                            if better {
                                best = Some((ih * g.w + iw, v));
                            }
                        }
                    }
                    if let Some((i, _)) = best {
                        dxp[i] += d;
                    }
                } else {
                    let count = (h1 - h0) * (w1 - w0);
                    if count == 0 {
                        continue;
                    }
                    let share = d / T::from_f64(count as f64);
                    for ih in h0..h1 {
                        for v in &mut dxp[ih * g.w + w0..ih * g.w + w1] {
                            *v += share;
                        }
                    }
                }
            }
        }
    });
    Ok(())
}
