//! Slicing, concatenation, splitting, Gather, Dropout and Equal on the device: strided
//! copies and scatters (no new data, only addresses), the gather with its bounds check, and
//! Dropout drawing the masks of `shardc_ir::dropout` bit for bit.

use super::call::{copy_suffix, host, suffix, Lowered, OpCall, Val};
use crate::error::CudaResult;
use crate::kernels::{contiguous_strides, DevPtr, KernelArg, Strided};
use shardc_ir::block::Block;
use shardc_ir::{DType, TensorType};
use KernelArg::{Ptr, F64, I64};

fn ints(call: &OpCall<'_>, i: usize, what: &str) -> CudaResult<Vec<i64>> {
    match call.inputs.get(i) {
        Some(Val::Const(c)) => c
            .as_ints()
            .ok_or_else(|| call.err(format!("{what} must be integers, got {c:?}"))),
        _ => Err(call.err(format!("{what} (operand {i}) must be a constant tuple"))),
    }
}

/// (begin, step, count) per dim, as every backend's StridedSlice reads its constants.
fn slice_spec(
    call: &OpCall<'_>,
    shape: &[usize],
    first: usize,
) -> CudaResult<Vec<(usize, usize, usize)>> {
    for mask in shardc_ir::geometry::SLICE_MASKS {
        let v = call.node.attrs.int_or(mask, 0);
        if v != 0 {
            return Err(call.err(format!("{mask} {v} is not supported (only 0)")));
        }
    }
    let (begin, end, steps) = (
        ints(call, first, "begin")?,
        ints(call, first + 1, "end")?,
        ints(call, first + 2, "strides")?,
    );
    shardc_ir::geometry::slice_spec(shape, &begin, &end, &steps).map_err(|r| call.err(r))
}

/// The region of a tensor of `shape` a slice spec selects: its base element and, per dim of
/// the slice, the element stride.
fn region(shape: &[usize], spec: &[(usize, usize, usize)]) -> (usize, Vec<i64>, Vec<usize>) {
    let st = contiguous_strides(shape);
    let base = spec.iter().zip(&st).map(|(s, &t)| s.0 * t as usize).sum();
    let strides = spec.iter().zip(&st).map(|(s, &t)| s.1 as i64 * t).collect();
    let dims = spec.iter().map(|s| s.2).collect();
    (base, strides, dims)
}

fn at(ptr: DevPtr, elements: usize, ty: &TensorType) -> DevPtr {
    ptr + (elements * ty.dtype.size_bytes()) as u64
}

pub(super) fn copy_kernel(
    call: &OpCall<'_>,
    kernel: &str,
    src: DevPtr,
    dst: DevPtr,
    dims: &[usize],
    strides: &[i64],
    dtype: DType,
) -> CudaResult<Lowered> {
    let s = or_host!(copy_suffix(dtype), format!("{dtype} on the GPU"));
    let n: usize = dims.iter().product();
    if n == 0 {
        return Ok(Lowered::Device);
    }
    let st = or_host!(Strided::single(dims, strides), "more than 8 dims");
    call.launch(
        &format!("{kernel}_{s}"),
        call.grid(n),
        &[
            Ptr(src),
            Ptr(dst),
            I64(n as i64),
            KernelArg::Strided(Box::new(st)),
        ],
    )
}

pub(super) fn strided_slice(call: &OpCall<'_>) -> CudaResult<Lowered> {
    let (x, tx) = call.tensor(0)?;
    let (y, ty) = call.out(0)?;
    let spec = slice_spec(call, &tx.shape, 1)?;
    let (base, strides, dims) = region(&tx.shape, &spec);
    if dims != ty.shape {
        return Err(call.err(format!(
            "the result {:?} is not the slice {dims:?}",
            ty.shape
        )));
    }
    copy_kernel(
        call,
        "strided_copy",
        at(x, base, tx),
        y,
        &dims,
        &strides,
        ty.dtype,
    )
}

pub(super) fn strided_slice_grad(call: &OpCall<'_>) -> CudaResult<Lowered> {
    let (dy, tdy) = call.tensor(0)?;
    let (y, ty) = call.out(0)?;
    let s = or_host!(suffix(ty.dtype), format!("{} on the GPU", ty.dtype));
    let spec = slice_spec(call, &ty.shape, 2)?;
    let (base, strides, dims) = region(&ty.shape, &spec);
    if dims != tdy.shape {
        return Err(call.err(format!("dy {:?} is not the slice {dims:?}", tdy.shape)));
    }
    let n = ty.num_elements();
    call.launch(
        &format!("fill_{s}"),
        call.grid(n),
        &[Ptr(y), I64(n as i64), F64(0.0)],
    )?;
    copy_kernel(
        call,
        "strided_scatter",
        dy,
        at(y, base, ty),
        &dims,
        &strides,
        ty.dtype,
    )
}

fn axis_of(call: &OpCall<'_>, rank: usize) -> CudaResult<usize> {
    let a = call.node.attrs.int_or("axis", 0);
    let r = rank as i64;
    let a = if a < 0 { a + r } else { a };
    usize::try_from(a)
        .ok()
        .filter(|&a| a < rank)
        .ok_or_else(|| call.err(format!("axis out of range for rank {rank}")))
}

pub(super) fn concat(call: &OpCall<'_>) -> CudaResult<Lowered> {
    let (y, ty) = call.out(0)?;
    let axis = axis_of(call, ty.shape.len())?;
    let outer: usize = ty.shape[..axis].iter().product();
    let inner: usize = ty.shape[axis + 1..].iter().product();
    let total = ty.shape[axis];
    let mut at_axis = 0;
    for i in 0..call.inputs.len() {
        let (x, tx) = call.tensor(i)?;
        if tx.dtype != ty.dtype || tx.shape.len() != ty.shape.len() {
            return Err(call.err(format!("operand {i} is {tx}, the result {ty}")));
        }
        let len = tx.shape[axis];
        let dst = at(y, at_axis * inner, ty);
        let placed = copy_kernel(
            call,
            "strided_scatter",
            x,
            dst,
            &[outer, len * inner],
            &[(total * inner) as i64, 1],
            ty.dtype,
        )?;
        if let Lowered::Host(why) = placed {
            return Ok(Lowered::Host(why));
        }
        at_axis += len;
    }
    if at_axis != total {
        return Err(call.err(format!(
            "the operands add up to {at_axis} along axis {axis}, the result has {total}"
        )));
    }
    Ok(Lowered::Device)
}

pub(super) fn split(call: &OpCall<'_>) -> CudaResult<Lowered> {
    let (x, tx) = call.tensor(0)?;
    if copy_suffix(tx.dtype).is_none() {
        return host(format!("{} on the GPU", tx.dtype));
    }
    let axis = axis_of(call, tx.shape.len())?;
    let parts = call.outputs.len();
    if parts == 0 || tx.shape[axis] % parts != 0 {
        return Err(call.err(format!(
            "{parts} parts do not divide dim {axis} of {:?}",
            tx.shape
        )));
    }
    let outer: usize = tx.shape[..axis].iter().product();
    let inner: usize = tx.shape[axis + 1..].iter().product();
    let part = tx.shape[axis] / parts;
    for i in 0..parts {
        let (y, _) = call.out(i)?;
        copy_kernel(
            call,
            "strided_copy",
            at(x, i * part * inner, tx),
            y,
            &[outer, part * inner],
            &[(parts * part * inner) as i64, 1],
            tx.dtype,
        )?;
    }
    Ok(Lowered::Device)
}

pub(super) fn gather(call: &OpCall<'_>) -> CudaResult<Lowered> {
    let (p, tp) = call.tensor(0)?;
    let (idx, ti) = call.tensor(1)?;
    let (y, ty) = call.out(0)?;
    let axis = match call.inputs.get(2) {
        None => 0,
        Some(Val::Const(c)) => c
            .as_int()
            .ok_or_else(|| call.err(format!("axis must be an integer, got {c:?}")))?,
        Some(_) => return host("an axis from a tensor"),
    };
    let rank = tp.shape.len() as i64;
    let axis = if axis < 0 { axis + rank } else { axis };
    let axis = usize::try_from(axis)
        .ok()
        .filter(|&a| a < tp.shape.len())
        .ok_or_else(|| call.err(format!("axis out of range for rank {rank}")))?;
    let is = match ti.dtype {
        DType::Int32 => "i32",
        DType::Int64 => "i64",
        other => return host(format!("{other} indices")),
    };
    let s = or_host!(suffix(ty.dtype), format!("{} on the GPU", ty.dtype));
    let pre: usize = tp.shape[..axis].iter().product();
    let post: usize = tp.shape[axis + 1..].iter().product();
    let n = ti.num_elements();
    let total = pre * n * post;
    if total == 0 {
        return Ok(Lowered::Device);
    }
    // A block of a table split along `axis` (a vocabulary split).
    let block = Block::of(&call.node.attrs, &tp.shape).map_err(|e| call.err(e))?;
    let (bound, lo) = Block::along(block.as_ref(), axis, tp.shape[axis]);
    call.launch(
        &format!("gather_{is}_{s}"),
        call.grid(total),
        &[
            Ptr(p),
            Ptr(idx),
            Ptr(y),
            I64(pre as i64),
            I64(tp.shape[axis] as i64),
            I64(n as i64),
            I64(post as i64),
            I64(lo as i64),
            I64(bound as i64),
            Ptr(call.status),
        ],
    )
}

/// The most threads an UnsortedSegmentSum launches: each reads every id, so more threads
/// mean more reads of the ids, not more speed, once the GPU is full.
const SEGMENT_SUM_THREADS: usize = 1 << 16;

/// `UnsortedSegmentSum(x, segment_ids, num_segments)`, the CPU's semantics (negative ids
/// dropped, a block of segments where the result is split along them), without atomics:
/// each thread owns some segments of one column and adds x's rows in index order, so every
/// element is summed in the CPU's order (see `kernels/movement.cu`).
pub(super) fn unsorted_segment_sum(call: &OpCall<'_>) -> CudaResult<Lowered> {
    let (x, tx) = call.tensor(0)?;
    let (ids, ti) = call.tensor(1)?;
    let (y, ty) = call.out(0)?;
    let num = match call.inputs.get(2) {
        Some(Val::Const(c)) => c.as_int().filter(|&v| v >= 0).ok_or_else(|| {
            call.err(format!(
                "num_segments must be a non-negative integer, got {c:?}"
            ))
        })? as usize,
        _ => return host("num_segments from a tensor"),
    };
    let is = match ti.dtype {
        DType::Int32 => "i32",
        DType::Int64 => "i64",
        other => return host(format!("{other} segment ids")),
    };
    let s = match ty.dtype {
        DType::Float32 => "f32",
        DType::Float64 => "f64",
        other => return host(format!("{other} on the GPU")),
    };
    if tx.dtype != ty.dtype {
        return host("mixed element types");
    }
    let k = ti.shape.len();
    if tx.shape.len() < k || tx.shape[..k] != ti.shape[..] {
        return Err(call.err(format!(
            "segment_ids shape {:?} is not a prefix of x's shape {:?}",
            ti.shape, tx.shape
        )));
    }
    let n = ti.num_elements();
    let inner: usize = tx.shape[k..].iter().product();
    let mut expected = vec![num];
    expected.extend_from_slice(&tx.shape[k..]);
    if ty.shape != expected {
        return Err(call.err(format!(
            "the result has shape {:?}, expected {expected:?}",
            ty.shape
        )));
    }
    if num * inner == 0 {
        return Ok(Lowered::Device);
    }
    let block = Block::of(&call.node.attrs, &expected).map_err(|e| call.err(e))?;
    let (bound, lo) = Block::along(block.as_ref(), 0, num);
    let ranges = (SEGMENT_SUM_THREADS / inner).clamp(1, num);
    let per = num.div_ceil(ranges);
    let ranges = num.div_ceil(per);
    call.launch(
        &format!("unsorted_segment_sum_{is}_{s}"),
        call.grid(ranges * inner),
        &[
            Ptr(x),
            Ptr(ids),
            Ptr(y),
            I64(n as i64),
            I64(inner as i64),
            I64(num as i64),
            I64(per as i64),
            I64(ranges as i64),
            I64(lo as i64),
            I64(bound as i64),
            Ptr(call.status),
        ],
    )
}

pub(super) fn dropout(call: &OpCall<'_>) -> CudaResult<Lowered> {
    let (x, tx) = call.tensor(0)?;
    let (y, ty) = call.out(0)?;
    let (mask, _) = call.out(1)?;
    let s = match ty.dtype {
        DType::Float32 => "f32",
        DType::Float64 => "f64",
        other => return host(format!("{other} on the GPU")),
    };
    let a = &call.node.attrs;
    let keep = a.float_or("keep_prob", 0.5);
    if !(keep > 0.0 && keep <= 1.0) {
        return Err(call.err(format!("keep_prob must be in (0, 1], got {keep}")));
    }
    if call.dropout_key == 0 {
        return Err(call.err("the executor gave no device word for the step's key"));
    }
    let block = Block::of(a, &tx.shape).map_err(|e| call.err(e))?;
    let (base, st) = match block {
        None => (0i64, Strided::contiguous()),
        Some(b) => {
            let gst = contiguous_strides(&b.global_shape);
            let base = b.offset.iter().zip(&gst).map(|(&o, &s)| o as i64 * s).sum();
            let st = or_host!(Strided::single(&tx.shape, &gst), "more than 8 dims");
            (base, st)
        }
    };
    let n = tx.num_elements();
    call.launch(
        &format!("dropout_{s}"),
        call.grid(n),
        &[
            Ptr(x),
            Ptr(y),
            Ptr(mask),
            I64(n as i64),
            Ptr(call.dropout_key),
            F64(keep),
            I64(base),
            KernelArg::Strided(Box::new(st)),
        ],
    )
}

pub(super) fn equal(call: &OpCall<'_>) -> CudaResult<Lowered> {
    let (a, ta) = match call.inputs.first() {
        Some(Val::Tensor { ptr, ty }) => (*ptr, *ty),
        _ => return host("a constant operand"),
    };
    let (b, tb) = match call.inputs.get(1) {
        Some(Val::Tensor { ptr, ty }) => (*ptr, *ty),
        _ => return host("a constant operand"),
    };
    let (y, ty) = call.out(0)?;
    let s = or_host!(suffix(ta.dtype), format!("{} on the GPU", ta.dtype));
    if ta.dtype != tb.dtype || ty.dtype != DType::Bool {
        return host("mixed element types");
    }
    let st = or_host!(
        Strided::broadcast(&ty.shape, &ta.shape, &tb.shape),
        "a broadcast of more than 8 dims"
    );
    let n = ty.num_elements();
    call.launch(
        &format!("equal_{s}"),
        call.grid(n),
        &[
            Ptr(a),
            Ptr(b),
            Ptr(y),
            I64(n as i64),
            KernelArg::Strided(Box::new(st)),
        ],
    )
}
