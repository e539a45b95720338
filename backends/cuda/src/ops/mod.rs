//! Each op of a rank's graph as kernel launches and GEMMs on a [`Device`](crate::device::Device).
//!
//! [`lower`] either runs a node on the device or answers [`Lowered::Host`] with the reason,
//! without touching anything, when no device kernel covers the node as typed (an op without a
//! kernel, a Float16 tensor, an empty tensor, ...): the executor then runs the
//! host backend's kernel on copies. The decision depends only on the node and its types, so
//! it is the same at every step.

use crate::device::Gemm;
use crate::error::CudaResult;
use crate::kernels::{broadcast_strides, contiguous_strides, DevPtr, KernelArg, Strided};
use shardc_ir::{DType, OpKind, TensorType};

use KernelArg::{Ptr, F64, I32, I64};

/// The value of an `Option`, or (when None) return `Lowered::Host` with the reason: a node
/// no device kernel covers as typed.
macro_rules! or_host {
    ($e:expr, $why:expr) => {
        match $e {
            Some(v) => v,
            None => return host($why),
        }
    };
}

mod batch_norm;
mod call;
mod conv;
mod movement;
mod pool;

pub(crate) use call::{copy_suffix, Lowered, OpCall, Val, Workspace};
use call::{float_suffix, host, out_float, suffix, TARGET_BLOCKS};

/// The ops the CUDA lowering has no device kernel for, each with the reason: `lower`
/// answers `Lowered::Host(reason)` for them (the executor runs the host backend's kernel on
/// copies, or runs the op itself). [`has_kernel`] is false exactly for these ops.
pub const HOST_FALLBACKS: &[(OpKind, &str)] = &[
    (
        OpKind::TupleGetItem,
        "plumbing: the executor aliases the tuple's element, no kernel runs",
    ),
    (
        OpKind::Assign,
        "plumbing: the executor stores the value into the parameter, no kernel runs",
    ),
    (
        OpKind::AllReduce,
        "a collective: the executor runs it through the communicator (NCCL)",
    ),
    (
        OpKind::AllGather,
        "a collective: the executor runs it through the communicator (NCCL)",
    ),
    (
        OpKind::ReduceScatter,
        "a collective: the executor runs it through the communicator (NCCL)",
    ),
    (
        OpKind::AllToAll,
        "a collective: the executor runs it through the communicator (NCCL)",
    ),
    (
        OpKind::Broadcast,
        "a collective: the executor runs it through the communicator (NCCL)",
    ),
    (
        OpKind::Send,
        "point-to-point: the executor runs it through the communicator",
    ),
    (
        OpKind::Receive,
        "point-to-point: the executor runs it through the communicator",
    ),
];

/// A device lowering of one op.
type LowerFn = for<'a, 'b> fn(&'a OpCall<'b>) -> CudaResult<Lowered>;

/// Where an op runs: its device lowering, or the host (listed in [`HOST_FALLBACKS`]).
#[derive(Clone, Copy)]
enum Route {
    Kernel(LowerFn),
    Host,
}

/// The device lowering of every op: one exhaustive match, which [`lower`] dispatches by and
/// [`has_kernel`] reports.
fn route(op: OpKind) -> Route {
    use OpKind::*;
    use Route::*;
    match op {
        MatMul | BatchMatMul => Kernel(matmul),
        Add | Sub | Mul | RealDiv | ReluGrad | SigmoidGrad | TanhGrad | SqrtGrad | GeLUGrad
        | DropoutGrad | SiLUGrad => Kernel(binary),
        StridedSlice => Kernel(movement::strided_slice),
        StridedSliceGrad => Kernel(movement::strided_slice_grad),
        Concat => Kernel(movement::concat),
        Split => Kernel(movement::split),
        Gather => Kernel(movement::gather),
        UnsortedSegmentSum => Kernel(movement::unsorted_segment_sum),
        Dropout => Kernel(movement::dropout),
        Equal => Kernel(movement::equal),
        Neg | Square | Sqrt | Exp | Log | ReLU | GeLU | Sigmoid | Tanh | SiLU | Erf => {
            Kernel(unary)
        }
        BiasAdd => Kernel(bias_add),
        BiasAddGrad => Kernel(bias_add_grad),
        Cast => Kernel(cast),
        ZerosLike | OnesLike => Kernel(fill),
        Reshape => Kernel(copy_same),
        Transpose => Kernel(transpose),
        BroadcastTo => Kernel(broadcast_to),
        OneHot => Kernel(one_hot),
        ReduceSum | ReduceMean | ReduceMax => Kernel(reduce),
        Softmax | LogSoftmax => Kernel(softmax),
        SoftmaxGrad | LogSoftmaxGrad => Kernel(softmax_grad),
        LayerNorm => Kernel(layer_norm),
        LayerNormGrad => Kernel(layer_norm_grad),
        SoftmaxCrossEntropyWithLogits => Kernel(softmax_ce),
        SparseSoftmaxCrossEntropyWithLogits => Kernel(sparse_ce),
        ApplyMomentum => Kernel(apply_momentum),
        ApplyGradientDescent => Kernel(apply_gradient_descent),
        SGD => Kernel(sgd),
        Adam => Kernel(adam),
        Conv2D => Kernel(conv::conv2d),
        Conv2DBackpropInput => Kernel(conv::conv2d_backprop_input),
        Conv2DBackpropFilter => Kernel(conv::conv2d_backprop_filter),
        MaxPool | AvgPool => Kernel(pool::pool),
        MaxPoolGrad | AvgPoolGrad => Kernel(pool::pool_grad),
        BatchNorm => Kernel(batch_norm::batch_norm),
        BatchNormGrad => Kernel(batch_norm::batch_norm_grad),
        BNTrainingReduce => Kernel(batch_norm::bn_training_reduce),
        BNTrainingUpdate => Kernel(batch_norm::bn_training_update),
        BNTrainingUpdateGrad => Kernel(batch_norm::bn_training_update_grad),
        BNTrainingReduceGrad => Kernel(batch_norm::bn_training_reduce_grad),
        TupleGetItem | Assign | AllReduce | AllGather | ReduceScatter | AllToAll | Broadcast
        | Send | Receive => Host,
    }
}

/// Whether the CUDA backend has a device kernel for `op` (it may still fall back to the host
/// for some types or shapes, saying why); `false` exactly for the ops of [`HOST_FALLBACKS`].
pub fn has_kernel(op: OpKind) -> bool {
    matches!(route(op), Route::Kernel(_))
}

/// The reason [`HOST_FALLBACKS`] gives for `op`, if it lists it.
pub fn host_fallback(op: OpKind) -> Option<&'static str> {
    HOST_FALLBACKS
        .iter()
        .find(|(o, _)| *o == op)
        .map(|(_, why)| *why)
}

/// Runs `call.node` on the device, or says why it cannot (see the module doc).
pub(crate) fn lower(call: &OpCall<'_>) -> CudaResult<Lowered> {
    // Every tensor of a device kernel is Float32/Float64 or an index type the kernel names.
    let op = call.node.op;
    match route(op) {
        Route::Kernel(f) => f(call),
        Route::Host => {
            host(host_fallback(op).unwrap_or("no CUDA kernel (not listed in HOST_FALLBACKS)"))
        }
    }
}

fn matmul(call: &OpCall<'_>) -> CudaResult<Lowered> {
    let (a, ta) = call.tensor(0)?;
    let (b, tb) = call.tensor(1)?;
    let (c, tc, _) = or_host!(
        out_float(call)?,
        "only Float32 and Float64 products run on the GPU"
    );
    if ta.dtype != tc.dtype || tb.dtype != tc.dtype {
        return host("mixed element types");
    }
    let tr_a = call.node.attrs.bool_or("transpose_a", false);
    let tr_b = call.node.attrs.bool_or("transpose_b", false);
    let (ra, rb, rc) = (ta.shape.len(), tb.shape.len(), tc.shape.len());
    if ra < 2 || rb < 2 || rc < 2 {
        return Err(call.err(format!(
            "operands of rank >= 2 expected, got {:?} and {:?}",
            ta.shape, tb.shape
        )));
    }
    let (m, k) = if tr_a {
        (ta.shape[ra - 1], ta.shape[ra - 2])
    } else {
        (ta.shape[ra - 2], ta.shape[ra - 1])
    };
    let n = if tr_b {
        tb.shape[rb - 2]
    } else {
        tb.shape[rb - 1]
    };
    if tc.shape[rc - 2] != m || tc.shape[rc - 1] != n {
        return Err(call.err(format!("result {:?} is not ({m}, {n})", tc.shape)));
    }
    let batch_out = &tc.shape[..rc - 2];
    let batch: usize = batch_out.iter().product();
    // A batch operand either has the result's batch dims or none that are not 1.
    let stride = |shape: &[usize], mat: usize| -> Option<usize> {
        let bd = &shape[..shape.len() - 2];
        if bd == batch_out {
            Some(mat)
        } else if bd.iter().all(|&d| d == 1) {
            Some(0)
        } else {
            None
        }
    };
    let (Some(sa), Some(sb)) = (stride(&ta.shape, m * k), stride(&tb.shape, k * n)) else {
        return host("batch dims that broadcast partially run on the host");
    };
    if batch == 0 || m * n == 0 {
        return Ok(Lowered::Device);
    }
    if k == 0 {
        return host("an empty contraction");
    }
    let g = Gemm::row_major(
        tc.dtype,
        (m, n, k),
        a,
        tr_a,
        b,
        tr_b,
        c,
        batch,
        (sa, sb, m * n),
    );
    call.dev.gemm(&g)?;
    Ok(Lowered::Device)
}

fn binary(call: &OpCall<'_>) -> CudaResult<Lowered> {
    use OpKind::*;
    let (y, ty, s) = or_host!(out_float(call)?, "only Float32 and Float64 run on the GPU");
    let name = match call.node.op {
        Add => "add",
        Sub => "sub",
        Mul => "mul",
        RealDiv => "div",
        DropoutGrad => "mul",
        ReluGrad => "relu_grad",
        SigmoidGrad => "sigmoid_grad",
        TanhGrad => "tanh_grad",
        SqrtGrad => "sqrt_grad",
        GeLUGrad => "gelu_grad",
        SiLUGrad => "silu_grad",
        op => return Err(call.err(format!("{op} is not a binary elementwise op"))),
    };
    let n = ty.num_elements() as i64;
    match (call.inputs.first(), call.inputs.get(1)) {
        (Some(Val::Tensor { ptr: a, ty: ta }), Some(Val::Tensor { ptr: b, ty: tb })) => {
            if ta.dtype != ty.dtype || tb.dtype != ty.dtype {
                return host("mixed element types");
            }
            let st = or_host!(
                Strided::broadcast(&ty.shape, &ta.shape, &tb.shape),
                "a broadcast of more than 8 dims"
            );
            call.launch(
                &format!("binary_{name}_{s}"),
                call.grid(n as usize),
                &[
                    Ptr(*a),
                    Ptr(*b),
                    Ptr(y),
                    I64(n),
                    KernelArg::Strided(Box::new(st)),
                ],
            )
        }
        (Some(first), Some(second)) if matches!(call.node.op, Add | Sub | Mul | RealDiv) => {
            let (x, c, scalar_first) = match (first, second) {
                (Val::Tensor { ptr, ty: tx }, Val::Const(c)) => ((*ptr, *tx), c, 0),
                (Val::Const(c), Val::Tensor { ptr, ty: tx }) => ((*ptr, *tx), c, 1),
                _ => return host("two constant operands"),
            };
            if x.1.dtype != ty.dtype || x.1.shape != ty.shape {
                return host("a constant with a broadcast tensor");
            }
            let v = c.as_f64().ok_or_else(|| {
                call.err(format!("the constant operand must be a number, got {c:?}"))
            })?;
            call.launch(
                &format!("scalar_{name}_{s}"),
                call.grid(n as usize),
                &[Ptr(x.0), Ptr(0), F64(v), I32(scalar_first), Ptr(y), I64(n)],
            )
        }
        _ => host("constant operands of a gradient op"),
    }
}

fn unary(call: &OpCall<'_>) -> CudaResult<Lowered> {
    use OpKind::*;
    let (x, tx) = call.tensor(0)?;
    let (y, ty, s) = or_host!(out_float(call)?, "only Float32 and Float64 run on the GPU");
    if tx.dtype != ty.dtype {
        return host("mixed element types");
    }
    let name = match call.node.op {
        Neg => "neg",
        Square => "square",
        Sqrt => "sqrt",
        Exp => "exp",
        Log => "log",
        ReLU => "relu",
        GeLU => "gelu",
        Sigmoid => "sigmoid",
        Tanh => "tanh",
        SiLU => "silu",
        Erf => "erf",
        op => return Err(call.err(format!("{op} is not a unary elementwise op"))),
    };
    let n = ty.num_elements();
    call.launch(
        &format!("unary_{name}_{s}"),
        call.grid(n),
        &[Ptr(x), Ptr(y), I64(n as i64)],
    )
}

fn bias_add(call: &OpCall<'_>) -> CudaResult<Lowered> {
    let (x, tx) = call.tensor(0)?;
    let (b, tb) = call.tensor(1)?;
    let (y, ty, s) = or_host!(out_float(call)?, "only Float32 and Float64 run on the GPU");
    if tx.shape.len() < 2 || tb.shape != [tx.shape[1]] || tx.dtype != ty.dtype {
        return Err(call.err(format!(
            "x of rank >= 2 and a bias of shape (C) expected, got {:?} and {:?}",
            tx.shape, tb.shape
        )));
    }
    let n = ty.num_elements();
    let inner: usize = tx.shape[2..].iter().product();
    call.launch(
        &format!("bias_add_{s}"),
        call.grid(n),
        &[
            Ptr(x),
            Ptr(b),
            Ptr(y),
            I64(n as i64),
            I64(tx.shape[1] as i64),
            I64(inner.max(1) as i64),
        ],
    )
}

fn bias_add_grad(call: &OpCall<'_>) -> CudaResult<Lowered> {
    let (dy, tdy) = call.tensor(0)?;
    let (db, _, s) = or_host!(out_float(call)?, "only Float32 and Float64 run on the GPU");
    if tdy.shape.len() < 2 {
        return Err(call.err(format!("dy of rank >= 2 expected, got {:?}", tdy.shape)));
    }
    let (n, c) = (tdy.shape[0], tdy.shape[1]);
    let inner: usize = tdy.shape[2..].iter().product();
    if inner == 1 {
        // (n, c) column sums.
        return reduce_pass(call, s, (dy, db), (1, n, c), 0, 1.0);
    }
    call.launch(
        &format!("bias_add_grad_{s}"),
        call.rows_grid(c),
        &[
            Ptr(dy),
            Ptr(db),
            I64(n as i64),
            I64(c as i64),
            I64(inner as i64),
        ],
    )
}

fn cast(call: &OpCall<'_>) -> CudaResult<Lowered> {
    let (x, tx) = call.tensor(0)?;
    let (y, ty) = call.out(0)?;
    // Bool has casts to and from every type the kernels name (and no other kernels).
    let cast_suffix = |d: DType| {
        if d == DType::Bool {
            Some("b8")
        } else {
            suffix(d)
        }
    };
    let (Some(from), Some(to)) = (cast_suffix(tx.dtype), cast_suffix(ty.dtype)) else {
        return host(format!("a cast from {} to {}", tx.dtype, ty.dtype));
    };
    let n = ty.num_elements();
    call.launch(
        &format!("cast_{from}_{to}"),
        call.grid(n),
        &[Ptr(x), Ptr(y), I64(n as i64)],
    )
}

fn fill(call: &OpCall<'_>) -> CudaResult<Lowered> {
    let (y, ty) = call.out(0)?;
    let s = or_host!(suffix(ty.dtype), format!("a fill of {}", ty.dtype));
    let v = if call.node.op == OpKind::OnesLike {
        1.0
    } else {
        0.0
    };
    let n = ty.num_elements();
    call.launch(
        &format!("fill_{s}"),
        call.grid(n),
        &[Ptr(y), I64(n as i64), F64(v)],
    )
}

fn copy_same(call: &OpCall<'_>) -> CudaResult<Lowered> {
    let (x, tx) = call.tensor(0)?;
    let (y, ty) = call.out(0)?;
    if tx.dtype != ty.dtype || tx.num_elements() != ty.num_elements() {
        return Err(call.err(format!("{} cannot be reshaped to {}", tx, ty)));
    }
    if x != y {
        call.dev
            .copy(y, x, ty.num_elements() * ty.dtype.size_bytes())?;
    }
    Ok(Lowered::Device)
}

fn strided_copy(call: &OpCall<'_>, x: DevPtr, strides: &[i64]) -> CudaResult<Lowered> {
    let (y, ty) = call.out(0)?;
    let s = or_host!(copy_suffix(ty.dtype), format!("a copy of {}", ty.dtype));
    let st = or_host!(Strided::single(&ty.shape, strides), "more than 8 dims");
    let n = ty.num_elements();
    call.launch(
        &format!("strided_copy_{s}"),
        call.grid(n),
        &[
            Ptr(x),
            Ptr(y),
            I64(n as i64),
            KernelArg::Strided(Box::new(st)),
        ],
    )
}

fn transpose(call: &OpCall<'_>) -> CudaResult<Lowered> {
    let (x, tx) = call.tensor(0)?;
    let perm = match call.inputs.get(1) {
        Some(Val::Const(c)) => c.as_ints(),
        _ => None,
    }
    .ok_or_else(|| call.err("the permutation must be a constant tuple"))?;
    let own = contiguous_strides(&tx.shape);
    let mut strides = Vec::with_capacity(perm.len());
    for &p in &perm {
        let p = usize::try_from(p)
            .ok()
            .filter(|&p| p < own.len())
            .ok_or_else(|| call.err(format!("permutation {perm:?} is out of range")))?;
        strides.push(own[p]);
    }
    strided_copy(call, x, &strides)
}

fn broadcast_to(call: &OpCall<'_>) -> CudaResult<Lowered> {
    let (x, tx) = call.tensor(0)?;
    let (_, ty) = call.out(0)?;
    let strides = broadcast_strides(&ty.shape, &tx.shape).ok_or_else(|| {
        call.err(format!(
            "{:?} does not broadcast to {:?}",
            tx.shape, ty.shape
        ))
    })?;
    strided_copy(call, x, &strides)
}

fn one_hot(call: &OpCall<'_>) -> CudaResult<Lowered> {
    let (idx, ti) = call.tensor(0)?;
    let (y, ty, s) = or_host!(
        out_float(call)?,
        "only a Float32 or Float64 one-hot runs on the GPU"
    );
    let rank = ty.shape.len() as i64;
    let axis = call.node.attrs.int_or("axis", -1);
    if axis != -1 && axis != rank - 1 {
        return host("a one-hot axis other than the last");
    }
    let is = match ti.dtype {
        DType::Int32 => "i32",
        DType::Int64 => "i64",
        other => return host(format!("{other} indices")),
    };
    let depth = *ty.shape.last().unwrap_or(&0);
    let (_, on) = call.scalar(2)?;
    let (_, off) = call.scalar(3)?;
    if !matches!(call.inputs.get(2), Some(Val::Const(_)))
        || !matches!(call.inputs.get(3), Some(Val::Const(_)))
    {
        return host("on/off values from tensors");
    }
    let n = ti.num_elements();
    call.launch(
        &format!("one_hot_{is}_{s}"),
        call.grid(n * depth),
        &[
            Ptr(idx),
            Ptr(y),
            I64(n as i64),
            I64(depth as i64),
            F64(on),
            F64(off),
        ],
    )
}

fn reduce(call: &OpCall<'_>) -> CudaResult<Lowered> {
    let (x, tx) = call.tensor(0)?;
    let (y, _, s) = or_host!(out_float(call)?, "only Float32 and Float64 run on the GPU");
    let rank = tx.shape.len();
    let axes: Vec<i64> = match call.inputs.get(1) {
        None => Vec::new(),
        Some(Val::Const(c)) => c
            .as_ints()
            .ok_or_else(|| call.err(format!("axes must be integers, got {c:?}")))?,
        Some(_) => return host("axes from a tensor"),
    };
    let mut reduced = vec![axes.is_empty(); rank];
    for &a in &axes {
        let a = if a < 0 { a + rank as i64 } else { a };
        let a = usize::try_from(a)
            .ok()
            .filter(|&a| a < rank)
            .ok_or_else(|| call.err(format!("axis out of range for rank {rank}")))?;
        reduced[a] = true;
    }
    // The dims other than 1, runs of reduced and of kept dims merged: (size, reduced).
    let mut runs: Vec<(usize, bool)> = Vec::new();
    for d in (0..rank).filter(|&d| tx.shape[d] != 1) {
        match runs.last_mut() {
            Some((size, red)) if *red == reduced[d] => *size *= tx.shape[d],
            _ => runs.push((tx.shape[d], reduced[d])),
        }
    }
    let total_reduced: usize = runs.iter().filter(|r| r.1).map(|r| r.0).product();
    if total_reduced == 0 {
        return host("an empty reduction");
    }
    let op = if call.node.op == OpKind::ReduceMax {
        1
    } else {
        0
    };
    let passes = runs.iter().filter(|r| r.1).count();
    if passes == 0 {
        // Nothing but dims of 1 reduced: a copy (scale 1 for every op).
        return reduce_pass(
            call,
            s,
            (x, y),
            (1, 1, runs.iter().map(|r| r.0).product()),
            op,
            1.0,
        );
    }
    // One pass per run of reduced dims, the innermost first, each a reduction of
    // (outer, r, inner); intermediate results alternate between two halves of the scratch
    // memory, the last pass writes y. A mean divides once, in the last pass.
    let esz = tx.dtype.size_bytes();
    let first_out: usize = {
        let j = runs.iter().rposition(|r| r.1).unwrap_or(0);
        runs.iter().map(|r| r.0).product::<usize>() / runs[j].0.max(1)
    };
    let scratch = if passes > 1 {
        let half = (first_out * esz).next_multiple_of(256);
        Some((call.workspace.get(call.dev, 2 * half)?, half as u64))
    } else {
        None
    };
    let mut src = x;
    for pass in 0..passes {
        let j = runs
            .iter()
            .rposition(|r| r.1)
            .ok_or_else(|| call.err("internal: no reduced run left"))?;
        let outer: usize = runs[..j].iter().map(|r| r.0).product();
        let inner: usize = runs[j + 1..].iter().map(|r| r.0).product();
        let last = pass + 1 == passes;
        let dst = match (last, scratch) {
            (true, _) | (false, None) => y,
            (false, Some((base, half))) => base + (pass as u64 % 2) * half,
        };
        let scale = if last && call.node.op == OpKind::ReduceMean {
            1.0 / total_reduced as f64
        } else {
            1.0
        };
        let r = runs[j].0;
        match (scratch, inner, row_parts(call, outer, r)) {
            // The only pass, over few long rows: in chunks through the scratch memory.
            (None, 1, Some(parts)) => {
                let partial = call.workspace.get(call.dev, outer * parts * esz)?;
                reduce_pass(
                    call,
                    s,
                    (src, partial),
                    (outer * parts, r / parts, 1),
                    op,
                    1.0,
                )?;
                reduce_pass(call, s, (partial, dst), (outer, parts, 1), op, scale)?;
            }
            _ => {
                reduce_pass(call, s, (src, dst), (outer, r, inner), op, scale)?;
            }
        }
        // The reduced run goes; the kept runs beside it become one.
        runs.remove(j);
        if j > 0 && j < runs.len() && !runs[j - 1].1 && !runs[j].1 {
            runs[j - 1].0 *= runs[j].0;
            runs.remove(j);
        }
        src = dst;
    }
    Ok(Lowered::Device)
}

/// Rows so few that a block each leaves the device idle and so long that chunks of them still
/// give every thread of a wide block 8 elements: each row reduced in `parts` chunks (a divisor
/// of `r`, so the chunks are rows of their own), then the chunks' results; None otherwise.
fn row_parts(call: &OpCall<'_>, outer: usize, r: usize) -> Option<usize> {
    let min_chunk = 8 * call.dev.wide_block_size() as usize;
    if outer >= TARGET_BLOCKS || r < 2 * min_chunk {
        return None;
    }
    let want = TARGET_BLOCKS.div_ceil(outer.max(1)).min(r / min_chunk);
    (2..=want).rev().find(|p| r % p == 0)
}

/// Columns at least this long are reduced by the tiled kernel (a block per 32 columns).
const TILED_COLUMNS_FROM: usize = 64;

/// One reduction of `x` viewed as (outer, r, inner) over r into `y`: `op` 0 sums, 1 takes
/// the maximum; the result is multiplied by `scale`. Rows (inner 1) a block each; long
/// columns by the tiled kernel, short ones a thread per result.
fn reduce_pass(
    call: &OpCall<'_>,
    s: &str,
    (x, y): (DevPtr, DevPtr),
    (outer, r, inner): (usize, usize, usize),
    op: i32,
    scale: f64,
) -> CudaResult<Lowered> {
    if inner == 1 {
        return call.launch_reducing(
            &format!("reduce_rows_{s}"),
            call.rows_grid(outer),
            r,
            &[
                Ptr(x),
                Ptr(y),
                I64(outer as i64),
                I64(r as i64),
                I32(op),
                F64(scale),
            ],
        );
    }
    let args = [
        Ptr(x),
        Ptr(y),
        I64(outer as i64),
        I64(r as i64),
        I64(inner as i64),
        I32(op),
        F64(scale),
    ];
    if r >= TILED_COLUMNS_FROM {
        call.launch(
            &format!("reduce_cols_tiled_{s}"),
            call.rows_grid(outer * inner.div_ceil(32)),
            &args,
        )
    } else {
        call.launch(&format!("reduce_cols_{s}"), call.grid(outer * inner), &args)
    }
}

/// `(outer, cols, inner)` of a softmax along attribute `axis` (default -1) of `shape`.
fn softmax_layout(call: &OpCall<'_>, shape: &[usize]) -> CudaResult<(usize, usize, usize)> {
    let rank = shape.len() as i64;
    let axis = match call.node.attrs.get("axis") {
        None => -1,
        Some(a) => match a.as_ints().as_deref() {
            Some([v]) => *v,
            _ => return Err(call.err(format!("attribute `axis` must be one integer, got {a}"))),
        },
    };
    let axis = if axis < 0 { axis + rank } else { axis };
    if axis < 0 || axis >= rank {
        return Err(call.err(format!("axis out of range for rank {rank}")));
    }
    let axis = axis as usize;
    Ok((
        shape[..axis].iter().product(),
        shape[axis],
        shape[axis + 1..].iter().product(),
    ))
}

fn softmax(call: &OpCall<'_>) -> CudaResult<Lowered> {
    let (x, tx) = call.tensor(0)?;
    let (y, _, s) = or_host!(out_float(call)?, "only Float32 and Float64 run on the GPU");
    let (outer, cols, inner) = softmax_layout(call, &tx.shape)?;
    let rows = outer * inner;
    let log = i32::from(call.node.op == OpKind::LogSoftmax);
    call.launch(
        &format!("softmax_{s}"),
        call.rows_grid(rows),
        &[
            Ptr(x),
            Ptr(y),
            I64(rows as i64),
            I64(cols as i64),
            I64(inner as i64),
            I32(log),
        ],
    )
}

fn softmax_grad(call: &OpCall<'_>) -> CudaResult<Lowered> {
    let (y, ty) = call.tensor(0)?;
    let (dy, _) = call.tensor(1)?;
    let (dx, _, s) = or_host!(out_float(call)?, "only Float32 and Float64 run on the GPU");
    let (outer, cols, inner) = softmax_layout(call, &ty.shape)?;
    let rows = outer * inner;
    let log = i32::from(call.node.op == OpKind::LogSoftmaxGrad);
    call.launch(
        &format!("softmax_grad_{s}"),
        call.rows_grid(rows),
        &[
            Ptr(y),
            Ptr(dy),
            Ptr(dx),
            I64(rows as i64),
            I64(cols as i64),
            I64(inner as i64),
            I32(log),
        ],
    )
}

/// (rows, d, p) of a LayerNorm of x with parameters of shape `g`.
fn ln_layout(call: &OpCall<'_>, x: &[usize], g: &[usize]) -> CudaResult<(usize, usize, usize)> {
    let rank = x.len() as i64;
    let norm = |key: &str| -> CudaResult<usize> {
        let a = call.node.attrs.int_or(key, -1);
        let a = if a < 0 { a + rank } else { a };
        usize::try_from(a)
            .ok()
            .filter(|&a| a < x.len())
            .ok_or_else(|| call.err(format!("attribute `{key}` is out of range for rank {rank}")))
    };
    let (bna, bpa) = (norm("begin_norm_axis")?, norm("begin_params_axis")?);
    if g != &x[bpa..] {
        return Err(call.err(format!(
            "gamma {g:?} does not match x {x:?} from axis {bpa}"
        )));
    }
    let d: usize = x[bna..].iter().product();
    let p: usize = x[bpa..].iter().product();
    if p == 0 || d % p != 0 {
        return Err(call.err("the parameters must tile the normalised axes"));
    }
    Ok((x[..bna].iter().product(), d, p))
}

fn layer_norm(call: &OpCall<'_>) -> CudaResult<Lowered> {
    let (x, tx) = call.tensor(0)?;
    let (g, tg) = call.tensor(1)?;
    let (b, _) = call.tensor(2)?;
    let (y, _, s) = or_host!(out_float(call)?, "only Float32 and Float64 run on the GPU");
    let (mean, _) = call.out(1)?;
    let (rstd, _) = call.out(2)?;
    let (rows, d, p) = ln_layout(call, &tx.shape, &tg.shape)?;
    if rows * d == 0 {
        return host("an empty LayerNorm");
    }
    let eps = call.node.attrs.float_or("epsilon", 1e-7);
    call.launch(
        &format!("layer_norm_{s}"),
        call.rows_grid(rows),
        &[
            Ptr(x),
            Ptr(g),
            Ptr(b),
            Ptr(y),
            Ptr(mean),
            Ptr(rstd),
            I64(rows as i64),
            I64(d as i64),
            I64(p as i64),
            F64(eps),
        ],
    )
}

fn layer_norm_grad(call: &OpCall<'_>) -> CudaResult<Lowered> {
    let (x, tx) = call.tensor(0)?;
    let (dy, _) = call.tensor(1)?;
    let (rstd, _) = call.tensor(2)?;
    let (mean, _) = call.tensor(3)?;
    let (g, tg) = call.tensor(4)?;
    let (dx, _, s) = or_host!(out_float(call)?, "only Float32 and Float64 run on the GPU");
    let (dg, _) = call.out(1)?;
    let (db, _) = call.out(2)?;
    let (rows, d, p) = ln_layout(call, &tx.shape, &tg.shape)?;
    if rows * d == 0 {
        return host("an empty LayerNorm");
    }
    call.launch(
        &format!("layer_norm_grad_x_{s}"),
        call.rows_grid(rows),
        &[
            Ptr(x),
            Ptr(dy),
            Ptr(rstd),
            Ptr(mean),
            Ptr(g),
            Ptr(dx),
            I64(rows as i64),
            I64(d as i64),
            I64(p as i64),
        ],
    )?;
    call.launch(
        &format!("layer_norm_grad_params_{s}"),
        call.rows_grid(p.div_ceil(32)),
        &[
            Ptr(x),
            Ptr(dy),
            Ptr(rstd),
            Ptr(mean),
            Ptr(dg),
            Ptr(db),
            I64((rows * d) as i64),
            I64(d as i64),
            I64(p as i64),
        ],
    )
}

fn logits_nc(call: &OpCall<'_>, t: &TensorType) -> CudaResult<(usize, usize)> {
    match t.shape.as_slice() {
        [n, c] => Ok((*n, *c)),
        s => Err(call.err(format!("logits must be (N, C), got {s:?}"))),
    }
}

fn softmax_ce(call: &OpCall<'_>) -> CudaResult<Lowered> {
    let (x, tx) = call.tensor(0)?;
    let (l, tl) = call.tensor(1)?;
    let (loss, _, s) = or_host!(out_float(call)?, "only Float32 and Float64 run on the GPU");
    let (back, _) = call.out(1)?;
    let (n, c) = logits_nc(call, tx)?;
    if tl.shape != tx.shape || c == 0 {
        return host("labels of another shape, or no classes");
    }
    call.launch(
        &format!("softmax_ce_{s}"),
        call.rows_grid(n),
        &[
            Ptr(x),
            Ptr(l),
            Ptr(loss),
            Ptr(back),
            I64(n as i64),
            I64(c as i64),
        ],
    )
}

fn sparse_ce(call: &OpCall<'_>) -> CudaResult<Lowered> {
    let (x, tx) = call.tensor(0)?;
    let (l, tl) = call.tensor(1)?;
    let (y, _, s) = or_host!(out_float(call)?, "only Float32 and Float64 run on the GPU");
    let (n, c) = logits_nc(call, tx)?;
    let is = match tl.dtype {
        DType::Int32 => "i32",
        DType::Int64 => "i64",
        other => return host(format!("{other} labels")),
    };
    if tl.shape != [n] || n == 0 || c == 0 {
        return host("labels of another shape, or an empty batch");
    }
    let args = [
        Ptr(x),
        Ptr(l),
        Ptr(y),
        I64(n as i64),
        I64(c as i64),
        Ptr(call.status),
    ];
    if call.node.attrs.bool_or("is_grad", false) {
        call.launch(
            &format!("sparse_ce_grad_{is}_{s}"),
            call.rows_grid(n),
            &args,
        )
    } else {
        call.launch(&format!("sparse_ce_loss_{is}_{s}"), 1, &args)
    }
}

fn same_shape(call: &OpCall<'_>, idx: &[usize]) -> CudaResult<Option<usize>> {
    let (_, t0) = call.tensor(idx[0])?;
    for &i in &idx[1..] {
        let (_, t) = call.tensor(i)?;
        if t.shape != t0.shape || t.dtype != t0.dtype {
            return Err(call.err(format!("operand {i} is {t}, operand {} is {t0}", idx[0])));
        }
    }
    Ok(float_suffix(t0.dtype).map(|_| t0.num_elements()))
}

fn apply_momentum(call: &OpCall<'_>) -> CudaResult<Lowered> {
    let n = or_host!(
        same_shape(call, &[0, 1, 3])?,
        "only Float32 and Float64 run on the GPU"
    );
    let (vo, _, s) = or_host!(out_float(call)?, "only Float32 and Float64 run on the GPU");
    let (ao, _) = call.out(1)?;
    let (lr_p, lr_v) = call.scalar(2)?;
    let (mom_p, mom_v) = call.scalar(4)?;
    let nesterov = i32::from(call.node.attrs.bool_or("use_nesterov", false));
    call.launch(
        &format!("apply_momentum_{s}"),
        call.grid(n),
        &[
            Ptr(call.tensor(0)?.0),
            Ptr(call.tensor(1)?.0),
            Ptr(lr_p),
            F64(lr_v),
            Ptr(call.tensor(3)?.0),
            Ptr(mom_p),
            F64(mom_v),
            Ptr(vo),
            Ptr(ao),
            I64(n as i64),
            I32(nesterov),
        ],
    )
}

fn apply_gradient_descent(call: &OpCall<'_>) -> CudaResult<Lowered> {
    let n = or_host!(
        same_shape(call, &[0, 2])?,
        "only Float32 and Float64 run on the GPU"
    );
    let (o, _, s) = or_host!(out_float(call)?, "only Float32 and Float64 run on the GPU");
    let (a_p, a_v) = call.scalar(1)?;
    call.launch(
        &format!("apply_gradient_descent_{s}"),
        call.grid(n),
        &[
            Ptr(call.tensor(0)?.0),
            Ptr(a_p),
            F64(a_v),
            Ptr(call.tensor(2)?.0),
            Ptr(o),
            I64(n as i64),
        ],
    )
}

fn sgd(call: &OpCall<'_>) -> CudaResult<Lowered> {
    let n = or_host!(
        same_shape(call, &[0, 1, 3, 5])?,
        "only Float32 and Float64 run on the GPU"
    );
    let (po, _, s) = or_host!(out_float(call)?, "only Float32 and Float64 run on the GPU");
    let (ao, _) = call.out(1)?;
    let (so, _) = call.out(2)?;
    let (lr_p, lr_v) = call.scalar(2)?;
    let (mom_p, mom_v) = call.scalar(4)?;
    let a = &call.node.attrs;
    call.launch(
        &format!("sgd_{s}"),
        call.grid(n),
        &[
            Ptr(call.tensor(0)?.0),
            Ptr(call.tensor(1)?.0),
            Ptr(lr_p),
            F64(lr_v),
            Ptr(call.tensor(3)?.0),
            Ptr(mom_p),
            F64(mom_v),
            Ptr(call.tensor(5)?.0),
            Ptr(po),
            Ptr(ao),
            Ptr(so),
            I64(n as i64),
            F64(a.float_or("dampening", 0.0)),
            F64(a.float_or("weight_decay", 0.0)),
            I32(i32::from(a.bool_or("nesterov", false))),
        ],
    )
}

fn adam(call: &OpCall<'_>) -> CudaResult<Lowered> {
    let n = or_host!(
        same_shape(call, &[0, 1, 2, 9])?,
        "only Float32 and Float64 run on the GPU"
    );
    let (vo, _, s) = or_host!(out_float(call)?, "only Float32 and Float64 run on the GPU");
    let (mo, _) = call.out(1)?;
    let (v2o, _) = call.out(2)?;
    let mut args = vec![
        Ptr(call.tensor(0)?.0),
        Ptr(call.tensor(1)?.0),
        Ptr(call.tensor(2)?.0),
    ];
    for i in 3..9 {
        let (p, v) = call.scalar(i)?;
        args.push(Ptr(p));
        args.push(F64(v));
    }
    args.extend([
        Ptr(call.tensor(9)?.0),
        Ptr(vo),
        Ptr(mo),
        Ptr(v2o),
        I64(n as i64),
        I32(i32::from(call.node.attrs.bool_or("use_nesterov", false))),
    ]);
    call.launch(&format!("adam_{s}"), call.grid(n), &args)
}
