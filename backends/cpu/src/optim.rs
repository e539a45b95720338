//! Optimizer updates (functional: they return the new values).

use crate::real::Real;
use crate::util::{for_chunks, for_chunks2, for_chunks3, Ctx, KResult, ELEMWISE_CHUNK};
use shardc_runtime::{Arg, Tensor};

/// Operand `i`, a tensor of `shape` (`what` names it).
fn same<'t, T: Real>(
    ctx: &Ctx<'_>,
    inputs: &[Arg<'t>],
    i: usize,
    what: &str,
    shape: &[usize],
) -> KResult<&'t [T]> {
    let (s, v) = ctx.data::<T>(inputs, i)?;
    ctx.check_shape(what, s, shape)?;
    Ok(v)
}

/// Checks that every output has `shape` and returns their buffers.
fn outs<'o, T: Real>(
    ctx: &Ctx<'_>,
    outputs: &'o mut [Tensor],
    names: &[&str],
    shape: &[usize],
) -> KResult<Vec<&'o mut [T]>> {
    let outs = ctx.outs::<T>(outputs, names.len())?;
    outs.into_iter()
        .zip(names)
        .map(|((s, v), name)| {
            ctx.check_shape(name, s, shape)?;
            Ok(v)
        })
        .collect()
}

fn take<'o, T>(v: &mut Vec<&'o mut [T]>) -> &'o mut [T] {
    v.remove(0)
}

/// `ApplyMomentum(variable, accumulation, learning_rate, gradient, momentum)` ->
/// `(var', acc')`.
pub(crate) fn apply_momentum<T: Real>(
    ctx: &Ctx<'_>,
    inputs: &[Arg<'_>],
    outputs: &mut [Tensor],
) -> KResult {
    let (shape, var) = ctx.data::<T>(inputs, 0)?;
    let acc = same::<T>(ctx, inputs, 1, "accumulation", shape)?;
    let lr = T::from_f64(ctx.scalar(inputs, 2)?);
    let grad = same::<T>(ctx, inputs, 3, "gradient", shape)?;
    let mom = T::from_f64(ctx.scalar(inputs, 4)?);
    let nesterov = ctx.node.attrs.bool_or("use_nesterov", false);
    let mut o = outs::<T>(ctx, outputs, &["var'", "acc'"], shape)?;
    let var_out = take(&mut o);
    let acc_out = take(&mut o);
    let n = var.len();
    for_chunks2(
        ctx.par,
        var_out,
        ELEMWISE_CHUNK,
        acc_out,
        ELEMWISE_CHUNK,
        n,
        |ci, vc, ac| {
            // Slices of the chunk and the branch out of the loop: the loop vectorises (it
            // indexed the inputs and tested `nesterov` per element: about 1 ns per element).
            let r = ci * ELEMWISE_CHUNK..ci * ELEMWISE_CHUNK + vc.len();
            let elems = vc
                .iter_mut()
                .zip(ac.iter_mut())
                .zip(&var[r.clone()])
                .zip(&acc[r.clone()])
                .zip(&grad[r]);
            if nesterov {
                for ((((v, a), &v0), &a0), &g) in elems {
                    let new_acc = a0 * mom + g;
                    *a = new_acc;
                    *v = v0 - lr * (g + mom * new_acc);
                }
            } else {
                for ((((v, a), &v0), &a0), &g) in elems {
                    let new_acc = a0 * mom + g;
                    *a = new_acc;
                    *v = v0 - lr * new_acc;
                }
            }
        },
    );
    Ok(())
}

/// `ApplyGradientDescent(var, alpha, delta)` -> `var - alpha * delta`.
pub(crate) fn apply_gradient_descent<T: Real>(
    ctx: &Ctx<'_>,
    inputs: &[Arg<'_>],
    outputs: &mut [Tensor],
) -> KResult {
    let (shape, var) = ctx.data::<T>(inputs, 0)?;
    let alpha = T::from_f64(ctx.scalar(inputs, 1)?);
    let delta = same::<T>(ctx, inputs, 2, "delta", shape)?;
    let mut o = outs::<T>(ctx, outputs, &["var'"], shape)?;
    let out = take(&mut o);
    let n = var.len();
    for_chunks(ctx.par, out, ELEMWISE_CHUNK, n, |ci, oc| {
        let base = ci * ELEMWISE_CHUNK;
        let (v, d) = (&var[base..base + oc.len()], &delta[base..base + oc.len()]);
        for ((o, &v), &d) in oc.iter_mut().zip(v).zip(d) {
            *o = v - alpha * d;
        }
    });
    Ok(())
}

/// `SGD(parameters, gradient, learning_rate, accum, momentum, stat)` ->
/// `(parameters', accum', stat')`, as MindSpore's SGD kernel:
///
/// ```text
/// g = grad + weight_decay * param            (when weight_decay > 0)
/// if momentum > 0:
///     if stat > 0: accum = g; stat = 0
///     else:        accum = momentum * accum + (1 - dampening) * g
///     g = nesterov ? g + momentum * accum : accum
/// param = param - lr * g
/// ```
pub(crate) fn sgd<T: Real>(ctx: &Ctx<'_>, inputs: &[Arg<'_>], outputs: &mut [Tensor]) -> KResult {
    let (shape, param) = ctx.data::<T>(inputs, 0)?;
    let grad = same::<T>(ctx, inputs, 1, "gradient", shape)?;
    let lr = T::from_f64(ctx.scalar(inputs, 2)?);
    let accum = same::<T>(ctx, inputs, 3, "accum", shape)?;
    let mom = T::from_f64(ctx.scalar(inputs, 4)?);
    let stat = same::<T>(ctx, inputs, 5, "stat", shape)?;
    let dampening = T::from_f64(ctx.node.attrs.float_or("dampening", 0.0));
    let wd = T::from_f64(ctx.node.attrs.float_or("weight_decay", 0.0));
    let nesterov = ctx.node.attrs.bool_or("nesterov", false);
    let mut o = outs::<T>(ctx, outputs, &["parameters'", "accum'", "stat'"], shape)?;
    let p_out = take(&mut o);
    let a_out = take(&mut o);
    let s_out = take(&mut o);
    for_chunks3(
        ctx.par,
        (p_out, a_out, s_out),
        ELEMWISE_CHUNK,
        |ci, pc, ac, sc| {
            let r = ci * ELEMWISE_CHUNK..ci * ELEMWISE_CHUNK + pc.len();
            let (param, grad) = (&param[r.clone()], &grad[r.clone()]);
            let (accum, stat) = (&accum[r.clone()], &stat[r]);
            if mom <= T::ZERO && wd <= T::ZERO {
                // Plain SGD (the flags tested once, not per element: the loop vectorises).
                for ((p, &p0), &g) in pc.iter_mut().zip(param).zip(grad) {
                    *p = p0 - lr * g;
                }
                ac.copy_from_slice(accum);
                sc.copy_from_slice(stat);
                return;
            }
            for j in 0..pc.len() {
                let mut g = grad[j];
                if wd > T::ZERO {
                    g += param[j] * wd;
                }
                let (mut a, mut s) = (accum[j], stat[j]);
                if mom > T::ZERO {
                    if s > T::ZERO {
                        a = g;
                        s = T::ZERO;
                    } else {
                        a = a * mom + (T::ONE - dampening) * g;
                    }
                    g = if nesterov { g + a * mom } else { a };
                }
                pc[j] = param[j] - lr * g;
                ac[j] = a;
                sc[j] = s;
            }
        },
    );
    Ok(())
}

/// `Adam(var, m, v, beta1_power, beta2_power, lr, beta1, beta2, epsilon, gradient)` ->
/// `(var', m', v')`.
pub(crate) fn adam<T: Real>(ctx: &Ctx<'_>, inputs: &[Arg<'_>], outputs: &mut [Tensor]) -> KResult {
    let (shape, var) = ctx.data::<T>(inputs, 0)?;
    let m = same::<T>(ctx, inputs, 1, "m", shape)?;
    let v = same::<T>(ctx, inputs, 2, "v", shape)?;
    let b1p = ctx.scalar(inputs, 3)?;
    let b2p = ctx.scalar(inputs, 4)?;
    let lr = ctx.scalar(inputs, 5)?;
    let b1 = T::from_f64(ctx.scalar(inputs, 6)?);
    let b2 = T::from_f64(ctx.scalar(inputs, 7)?);
    let eps = T::from_f64(ctx.scalar(inputs, 8)?);
    let grad = same::<T>(ctx, inputs, 9, "gradient", shape)?;
    ctx.ensure(b1p != 1.0, || {
        "beta1_power is 1: the bias correction divides by zero".into()
    })?;
    let lr_t = T::from_f64(lr * (1.0 - b2p).sqrt() / (1.0 - b1p));
    let nesterov = ctx.node.attrs.bool_or("use_nesterov", false);
    let mut o = outs::<T>(ctx, outputs, &["var'", "m'", "v'"], shape)?;
    let var_out = take(&mut o);
    let m_out = take(&mut o);
    let v_out = take(&mut o);
    for_chunks3(
        ctx.par,
        (var_out, m_out, v_out),
        ELEMWISE_CHUNK,
        |ci, xc, mc, vc| {
            // Slices of the chunk, no per-element indexing: the loop vectorises.
            let r = ci * ELEMWISE_CHUNK..ci * ELEMWISE_CHUNK + xc.len();
            let (var, m, v, grad) = (&var[r.clone()], &m[r.clone()], &v[r.clone()], &grad[r]);
            let elems = xc
                .iter_mut()
                .zip(mc.iter_mut())
                .zip(vc.iter_mut())
                .zip(var.iter().zip(m).zip(v).zip(grad));
            for (((x, mo), vo), (((&x0, &m0), &v0), &g)) in elems {
                let nm = b1 * m0 + (T::ONE - b1) * g;
                let nv = b2 * v0 + (T::ONE - b2) * g * g;
                let num = if nesterov {
                    nm * b1 + (T::ONE - b1) * g
                } else {
                    nm
                };
                *x = x0 - lr_t * num / (nv.sqrt() + eps);
                *mo = nm;
                *vo = nv;
            }
        },
    );
    Ok(())
}
