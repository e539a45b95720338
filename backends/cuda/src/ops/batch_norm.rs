//! BatchNorm, BatchNormGrad (training and inference mode) and the synchronised BatchNorm ops
//! (`BNTrainingReduce`, `BNTrainingUpdate`, `BNTrainingUpdateGrad`, `BNTrainingReduceGrad`)
//! on the kernels of `kernels/batch_norm.cu`, with the CPU backend's formulas: x viewed as
//! `(n, c, s)`, per-channel statistics with a block per channel, or per chunk of each channel
//! where there are few long channels (two passes for the variance), then an elementwise pass. An empty tensor runs on the host.

use super::call::{float_suffix, host, Lowered, OpCall, TARGET_BLOCKS};
use crate::error::CudaResult;
use crate::kernels::{DevPtr, KernelArg};
use shardc_ir::TensorType;
use KernelArg::{Ptr, F64, I32, I64};

/// `(n, c, s)` of an `(N, C, ...)` tensor.
fn ncs(call: &OpCall<'_>, t: &TensorType) -> CudaResult<(usize, usize, usize)> {
    if t.shape.len() < 2 {
        return Err(call.err(format!(
            "x must have rank >= 2 (N, C, ...), got {:?}",
            t.shape
        )));
    }
    Ok((t.shape[0], t.shape[1], t.shape[2..].iter().product()))
}

/// What the lowering of one node needs: every operand's pointer, checked to be of one float
/// type, x's `(n, c, s)` (x is operand `x_index`) and the kernels' dtype suffix.
struct Operands {
    ptrs: Vec<DevPtr>,
    outs: Vec<DevPtr>,
    n: usize,
    c: usize,
    s: usize,
    suffix: &'static str,
}

/// The operands of a node whose operands `channel` are `(C)` vectors and the others (and
/// results `full_out`) of x's shape; Err(reason) when it runs on the host.
fn operands(
    call: &OpCall<'_>,
    x_index: usize,
    n_inputs: usize,
    channel: &[usize],
    n_outputs: usize,
    full_out: &[usize],
) -> CudaResult<Result<Operands, &'static str>> {
    let (_, tx) = call.tensor(x_index)?;
    let Some(suffix) = float_suffix(tx.dtype) else {
        return Ok(Err("only Float32 and Float64 run on the GPU"));
    };
    let (n, c, s) = ncs(call, tx)?;
    let mut ptrs = Vec::with_capacity(n_inputs);
    for i in 0..n_inputs {
        let (p, t) = call.tensor(i)?;
        if t.dtype != tx.dtype {
            return Ok(Err("mixed element types"));
        }
        let want: &[usize] = if channel.contains(&i) {
            &[c]
        } else {
            &tx.shape
        };
        if t.shape != want {
            return Err(call.err(format!(
                "operand {i} has shape {:?}, expected {want:?}",
                t.shape
            )));
        }
        ptrs.push(p);
    }
    let mut outs = Vec::with_capacity(n_outputs);
    for i in 0..n_outputs {
        let (p, t) = call.out(i)?;
        if t.dtype != tx.dtype {
            return Ok(Err("mixed element types"));
        }
        let want: &[usize] = if full_out.contains(&i) {
            &tx.shape
        } else {
            &[c]
        };
        if t.shape != want {
            return Err(call.err(format!(
                "result {i} has shape {:?}, expected {want:?}",
                t.shape
            )));
        }
        outs.push(p);
    }
    if n * c * s == 0 {
        return Ok(Err("an empty BatchNorm"));
    }
    Ok(Ok(Operands {
        ptrs,
        outs,
        n,
        c,
        s,
        suffix,
    }))
}

macro_rules! operands_or_host {
    ($e:expr) => {
        match $e? {
            Ok(o) => o,
            Err(why) => return host(why),
        }
    };
}

/// The `count` attribute of the synchronised ops (the global elements per channel).
fn count(call: &OpCall<'_>) -> CudaResult<f64> {
    let n = call.node.attrs.int_or("count", 0);
    if n < 1 {
        return Err(call.err(format!(
            "attribute `count` must be >= 1 (the global number of elements per channel), got {n}"
        )));
    }
    Ok(n as f64)
}

fn epsilon(call: &OpCall<'_>) -> f64 {
    call.node.attrs.float_or("epsilon", 1e-5)
}

/// y = (x - mean) * rstd * scale + bias.
fn normalize(
    call: &OpCall<'_>,
    o: &Operands,
    [x, mean, rstd, scale, bias, y]: [DevPtr; 6],
) -> CudaResult<Lowered> {
    let total = o.n * o.c * o.s;
    call.launch(
        &format!("bn_normalize_{}", o.suffix),
        call.grid(total),
        &[
            Ptr(x),
            Ptr(mean),
            Ptr(rstd),
            Ptr(scale),
            Ptr(bias),
            Ptr(y),
            I64(total as i64),
            I64(o.c as i64),
            I64(o.s as i64),
        ],
    )
}

/// How the channels of `o` are reduced: `(parts, chunk)`, each channel split into `parts`
/// chunks of `chunk` elements, one block each, where a block per channel would leave the
/// device idle (fewer than [`TARGET_BLOCKS`] channels) and the chunks still give every thread
/// of a wide block 4 elements or more; `parts == 1` is a block per channel.
fn channel_parts(call: &OpCall<'_>, o: &Operands) -> (usize, usize) {
    let m = o.n * o.s;
    let min_chunk = 4 * call.dev.wide_block_size() as usize;
    let parts = TARGET_BLOCKS
        .div_ceil(o.c.max(1))
        .min(m / min_chunk.max(1))
        .max(1);
    (parts, m.div_ceil(parts))
}

/// Training statistics over chunks of long channels (`parts > 1`, see [`channel_parts`]):
/// the partial sums, the mean (into `saved_mean`), the partial squares about it, the rest.
fn chunked_stats(
    call: &OpCall<'_>,
    o: &Operands,
    (parts, chunk): (usize, usize),
    [x, batch_mean, batch_var, saved_mean, saved_rstd]: [DevPtr; 5],
) -> CudaResult<Lowered> {
    let m = o.n * o.s;
    let blocks = o.c * parts;
    let partial = call
        .workspace
        .get(call.dev, blocks * if o.suffix == "f64" { 8 } else { 4 })?;
    let sums = |centered: bool| {
        call.launch_reducing(
            &format!("bn_partial_sums_{}", o.suffix),
            call.rows_grid(blocks),
            chunk,
            &[
                Ptr(x),
                Ptr(saved_mean),
                Ptr(partial),
                I64(o.c as i64),
                I64(o.s as i64),
                I64(m as i64),
                I64(parts as i64),
                I64(chunk as i64),
                I32(i32::from(centered)),
            ],
        )
    };
    sums(false)?;
    call.launch(
        &format!("bn_mean_from_partials_{}", o.suffix),
        call.grid(o.c),
        &[
            Ptr(partial),
            Ptr(saved_mean),
            I64(o.c as i64),
            I64(parts as i64),
            I64(m as i64),
        ],
    )?;
    sums(true)?;
    call.launch(
        &format!("bn_stats_from_partials_{}", o.suffix),
        call.grid(o.c),
        &[
            Ptr(partial),
            Ptr(saved_mean),
            Ptr(batch_mean),
            Ptr(batch_var),
            Ptr(saved_rstd),
            I64(o.c as i64),
            I64(parts as i64),
            I64(m as i64),
            F64(epsilon(call)),
        ],
    )
}

/// `(dscale, dbias)` per channel: a block per channel, or per chunk of each channel (see
/// [`channel_parts`]) and then the chunks' partials added per channel.
fn grad_sums(
    call: &OpCall<'_>,
    o: &Operands,
    [dy, x, mean, rstd, dscale, dbias]: [DevPtr; 6],
) -> CudaResult<Lowered> {
    let (parts, chunk) = channel_parts(call, o);
    let blocks = o.c * parts;
    let (pds, pdb) = if parts > 1 {
        let esz = if o.suffix == "f64" { 8 } else { 4 };
        let half = (blocks * esz).next_multiple_of(256);
        let scratch = call.workspace.get(call.dev, 2 * half)?;
        (scratch, scratch + half as u64)
    } else {
        (dscale, dbias)
    };
    call.launch_reducing(
        &format!("bn_grad_sums_{}", o.suffix),
        call.rows_grid(blocks),
        chunk,
        &[
            Ptr(dy),
            Ptr(x),
            Ptr(mean),
            Ptr(rstd),
            Ptr(pds),
            Ptr(pdb),
            I64(o.c as i64),
            I64(o.s as i64),
            I64((o.n * o.s) as i64),
            I64(parts as i64),
            I64(chunk as i64),
        ],
    )?;
    if parts == 1 {
        return Ok(Lowered::Device);
    }
    call.launch(
        &format!("bn_grad_sums_from_partials_{}", o.suffix),
        call.grid(o.c),
        &[
            Ptr(pds),
            Ptr(pdb),
            Ptr(dscale),
            Ptr(dbias),
            I64(o.c as i64),
            I64(parts as i64),
        ],
    )
}

/// dx from the per-channel sums (`m` the count per channel; inference mode ignores them).
fn grad_dx(
    call: &OpCall<'_>,
    o: &Operands,
    [dy, x, scale, mean, rstd, dscale, dbias, dx]: [DevPtr; 8],
    m: f64,
    training: bool,
) -> CudaResult<Lowered> {
    let total = o.n * o.c * o.s;
    call.launch(
        &format!("bn_grad_dx_{}", o.suffix),
        call.grid(total),
        &[
            Ptr(dy),
            Ptr(x),
            Ptr(scale),
            Ptr(mean),
            Ptr(rstd),
            Ptr(dscale),
            Ptr(dbias),
            Ptr(dx),
            I64(total as i64),
            I64(o.c as i64),
            I64(o.s as i64),
            F64(m),
            I32(i32::from(training)),
        ],
    )
}

/// `BatchNorm(x, scale, bias, mean, variance)` -> `(y, batch_mean, batch_variance,
/// saved_mean, saved_rstd)`.
pub(super) fn batch_norm(call: &OpCall<'_>) -> CudaResult<Lowered> {
    let o = operands_or_host!(operands(call, 0, 5, &[1, 2, 3, 4], 5, &[0]));
    let [x, scale, bias, mean_in, var_in] = o.ptrs[..] else {
        return Err(call.err("five operands expected"));
    };
    let [y, batch_mean, batch_var, saved_mean, saved_rstd] = o.outs[..] else {
        return Err(call.err("five results expected"));
    };
    let training = call.node.attrs.bool_or("is_training", true);
    let parts = channel_parts(call, &o);
    if training && parts.0 > 1 {
        chunked_stats(
            call,
            &o,
            parts,
            [x, batch_mean, batch_var, saved_mean, saved_rstd],
        )?;
        return normalize(call, &o, [x, saved_mean, saved_rstd, scale, bias, y]);
    }
    call.launch_reducing(
        &format!("bn_stats_{}", o.suffix),
        call.rows_grid(o.c),
        o.n * o.s,
        &[
            Ptr(x),
            Ptr(mean_in),
            Ptr(var_in),
            Ptr(batch_mean),
            Ptr(batch_var),
            Ptr(saved_mean),
            Ptr(saved_rstd),
            I64(o.n as i64),
            I64(o.c as i64),
            I64(o.s as i64),
            F64(epsilon(call)),
            I32(i32::from(training)),
        ],
    )?;
    normalize(call, &o, [x, saved_mean, saved_rstd, scale, bias, y])
}

/// `BatchNormGrad(dy, x, scale, saved_mean, saved_rstd)` -> `(dx, dscale, dbias)`.
pub(super) fn batch_norm_grad(call: &OpCall<'_>) -> CudaResult<Lowered> {
    let o = operands_or_host!(operands(call, 1, 5, &[2, 3, 4], 3, &[0]));
    let [dy, x, scale, mean, rstd] = o.ptrs[..] else {
        return Err(call.err("five operands expected"));
    };
    let [dx, dscale, dbias] = o.outs[..] else {
        return Err(call.err("three results expected"));
    };
    let training = call.node.attrs.bool_or("is_training", true);
    grad_sums(call, &o, [dy, x, mean, rstd, dscale, dbias])?;
    let m = (o.n * o.s) as f64;
    grad_dx(
        call,
        &o,
        [dy, x, scale, mean, rstd, dscale, dbias, dx],
        m,
        training,
    )
}

/// `BNTrainingReduce(x)` -> `(sum, square_sum)`.
pub(super) fn bn_training_reduce(call: &OpCall<'_>) -> CudaResult<Lowered> {
    let o = operands_or_host!(operands(call, 0, 1, &[], 2, &[]));
    call.launch_reducing(
        &format!("bn_reduce_{}", o.suffix),
        call.rows_grid(o.c),
        o.n * o.s,
        &[
            Ptr(o.ptrs[0]),
            Ptr(o.outs[0]),
            Ptr(o.outs[1]),
            I64(o.n as i64),
            I64(o.c as i64),
            I64(o.s as i64),
        ],
    )
}

/// `BNTrainingUpdate(x, sum, square_sum, scale, bias)` -> `(y, batch_mean, batch_variance,
/// saved_mean, saved_rstd)`.
pub(super) fn bn_training_update(call: &OpCall<'_>) -> CudaResult<Lowered> {
    let o = operands_or_host!(operands(call, 0, 5, &[1, 2, 3, 4], 5, &[0]));
    let [x, sum, square_sum, scale, bias] = o.ptrs[..] else {
        return Err(call.err("five operands expected"));
    };
    let [y, batch_mean, batch_var, saved_mean, saved_rstd] = o.outs[..] else {
        return Err(call.err("five results expected"));
    };
    let count = count(call)?;
    call.launch(
        &format!("bn_update_stats_{}", o.suffix),
        call.grid(o.c),
        &[
            Ptr(sum),
            Ptr(square_sum),
            Ptr(batch_mean),
            Ptr(batch_var),
            Ptr(saved_mean),
            Ptr(saved_rstd),
            I64(o.c as i64),
            F64(count),
            F64(epsilon(call)),
        ],
    )?;
    normalize(call, &o, [x, saved_mean, saved_rstd, scale, bias, y])
}

/// `BNTrainingUpdateGrad(dy, x, saved_mean, saved_rstd)` -> `(dscale, dbias)`.
pub(super) fn bn_training_update_grad(call: &OpCall<'_>) -> CudaResult<Lowered> {
    let o = operands_or_host!(operands(call, 1, 4, &[2, 3], 2, &[]));
    let [dy, x, mean, rstd] = o.ptrs[..] else {
        return Err(call.err("four operands expected"));
    };
    grad_sums(call, &o, [dy, x, mean, rstd, o.outs[0], o.outs[1]])
}

/// `BNTrainingReduceGrad(dy, x, dscale, dbias, scale, saved_mean, saved_rstd)` -> dx.
pub(super) fn bn_training_reduce_grad(call: &OpCall<'_>) -> CudaResult<Lowered> {
    let o = operands_or_host!(operands(call, 1, 7, &[2, 3, 4, 5, 6], 1, &[0]));
    let [dy, x, dscale, dbias, scale, mean, rstd] = o.ptrs[..] else {
        return Err(call.err("seven operands expected"));
    };
    let count = count(call)?;
    grad_dx(
        call,
        &o,
        [dy, x, scale, mean, rstd, dscale, dbias, o.outs[0]],
        count,
        true,
    )
}
