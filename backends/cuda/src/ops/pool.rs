//! MaxPool, AvgPool, MaxPoolGrad and AvgPoolGrad (NCHW, `valid` / `same`) on the kernels of
//! `kernels/pool.cu`, with the CPU backend's semantics: windows from
//! `shardc_ir::geometry::pool2d_geometry`, padding outside every max and every average,
//! MaxPoolGrad's gradient to the first maximum of each window (a NaN before any number).
//! Gradients are gathers (a thread per input element), so no atomics. An empty pool runs on
//! the host.

use super::call::{host, out_float, Lowered, OpCall};
use crate::error::CudaResult;
use crate::kernels::KernelArg;
use shardc_ir::geometry::{pool2d_geometry, Pool2dGeometry};
use shardc_ir::OpKind;
use KernelArg::{Ptr, I32, I64};

fn geometry(call: &OpCall<'_>, x: &[usize]) -> CudaResult<Pool2dGeometry> {
    pool2d_geometry(call.node, x).map_err(|e| call.err(e.reason))
}

/// The geometry arguments after the pointers.
fn geometry_args(g: &Pool2dGeometry, is_max: bool) -> [KernelArg; 12] {
    [
        I64((g.n * g.c) as i64),
        I64(g.h as i64),
        I64(g.w as i64),
        I64(g.out_h as i64),
        I64(g.out_w as i64),
        I64(g.kh as i64),
        I64(g.kw as i64),
        I64(g.stride_h as i64),
        I64(g.stride_w as i64),
        I64(g.pad_top as i64),
        I64(g.pad_left as i64),
        I32(i32::from(is_max)),
    ]
}

fn empty(g: &Pool2dGeometry) -> bool {
    g.n * g.c * g.h * g.w * g.out_h * g.out_w == 0
}

/// `MaxPool(x)` / `AvgPool(x)`.
pub(super) fn pool(call: &OpCall<'_>) -> CudaResult<Lowered> {
    let (x, tx) = call.tensor(0)?;
    let (y, ty, s) = or_host!(out_float(call)?, "only Float32 and Float64 run on the GPU");
    if tx.dtype != ty.dtype {
        return host("mixed element types");
    }
    let g = geometry(call, &tx.shape)?;
    if ty.shape != g.output_shape() {
        return Err(call.err(format!(
            "the result has shape {:?}, expected {:?}",
            ty.shape,
            g.output_shape()
        )));
    }
    if empty(&g) {
        return host("an empty pool");
    }
    let mut args = vec![Ptr(x), Ptr(y)];
    args.extend(geometry_args(&g, call.node.op == OpKind::MaxPool));
    call.launch(
        &format!("pool_forward_{s}"),
        call.grid(ty.num_elements()),
        &args,
    )
}

/// `MaxPoolGrad(x, y, dy)` / `AvgPoolGrad(x, y, dy)`.
pub(super) fn pool_grad(call: &OpCall<'_>) -> CudaResult<Lowered> {
    let (x, tx) = call.tensor(0)?;
    let (dy, tdy) = call.tensor(2)?;
    let (dx, tdx, s) = or_host!(out_float(call)?, "only Float32 and Float64 run on the GPU");
    if tx.dtype != tdx.dtype || tdy.dtype != tdx.dtype {
        return host("mixed element types");
    }
    let g = geometry(call, &tx.shape)?;
    if tdy.shape != g.output_shape() || tdx.shape != tx.shape {
        return Err(call.err(format!(
            "dy {:?} and the result {:?} do not match x {:?} (output {:?})",
            tdy.shape,
            tdx.shape,
            tx.shape,
            g.output_shape()
        )));
    }
    if empty(&g) {
        return host("an empty pool");
    }
    let mut args = vec![Ptr(x), Ptr(dy), Ptr(dx)];
    args.extend(geometry_args(&g, call.node.op == OpKind::MaxPoolGrad));
    call.launch(
        &format!("pool_grad_{s}"),
        call.grid(tdx.num_elements()),
        &args,
    )
}
