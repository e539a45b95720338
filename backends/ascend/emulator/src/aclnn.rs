//! aclnn operator exports (`libopapi.so`): for each op, `aclnnXxxGetWorkspaceSize` validates
//! its arguments as the real op documents (see `shardc_ascend_sys::sig`) and prepares a
//! [`Plan`]; `aclnnXxx` launches it ([`plan::launch`]). Every computation is the emulator's own
//! reference code ([`crate::reference`]).
//!
//! # Safety
//!
//! Every export is an `unsafe extern "C" fn` called from C: each pointer argument must be
//! null or valid for the reads and writes the C API documents for it (`shardc_ascend_sys::sig`);
//! handles are checked against the emulator's registries, so a stale one is an error code.
#![allow(
    clippy::missing_safety_doc,
    clippy::redundant_closure_call,
    clippy::too_many_arguments,
    non_snake_case
)]

use crate::diag::EmuResult;
use crate::dtype::DType;
use crate::plan::{self, scratch, Arg, Plan};
use crate::reference::{self as r, Axis, Conv, Pool, Reduce};
use crate::tensor::{self, numel, TensorDesc};
use crate::{bail, emu_err};
use shardc_ascend_sys::{
    aclBoolArray, aclDataType, aclIntArray, aclOpExecutor, aclScalar, aclTensor, aclTensorList,
    aclnnStatus, aclrtStream,
};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::Arc;

type T = Arc<TensorDesc>;

fn tn(api: &str, role: &str, p: *const aclTensor) -> EmuResult<T> {
    tensor::tensor(api, role, p as usize)
}

fn otn(api: &str, role: &str, p: *const aclTensor) -> EmuResult<Option<T>> {
    tensor::opt_tensor(api, role, p as usize)
}

fn ints(api: &str, role: &str, p: *const aclIntArray) -> EmuResult<Vec<i64>> {
    tensor::int_array(api, role, p as usize)
}

fn bools(api: &str, role: &str, p: *const aclBoolArray) -> EmuResult<Vec<bool>> {
    tensor::bool_array(api, role, p as usize)
}

fn scalar(api: &str, role: &str, p: *const aclScalar) -> EmuResult<f64> {
    Ok(tensor::scalar(api, role, p as usize)?.value)
}

fn shape_eq(api: &str, a: (&str, &T), b: (&str, &T)) -> EmuResult<()> {
    if a.1.dims != b.1.dims {
        bail!(
            InvalidParam,
            "{api}: {} has shape {:?} but {} has shape {:?}; they must be equal",
            a.0,
            a.1.dims,
            b.0,
            b.1.dims
        );
    }
    Ok(())
}

fn float(api: &str, role: &str, t: &T) -> EmuResult<()> {
    if !t.dtype.is_float() {
        bail!(
            InvalidParam,
            "{api}: {role} has dtype {:?}, a floating-point type is required",
            t.dtype
        );
    }
    Ok(())
}

fn index_dtype(api: &str, role: &str, t: &T) -> EmuResult<()> {
    if !matches!(t.dtype, DType::I32 | DType::I64) {
        bail!(
            InvalidParam,
            "{api}: {role} has dtype {:?}, int32 or int64 is required",
            t.dtype
        );
    }
    Ok(())
}

fn axis(api: &str, d: i64, rank: usize) -> EmuResult<usize> {
    let r = rank.max(1) as i64;
    let x = if d < 0 { d + r } else { d };
    if x < 0 || x >= r {
        bail!(
            InvalidParam,
            "{api}: dim {d} is out of range for a {rank}-d tensor"
        );
    }
    Ok(x as usize)
}

fn bcast(api: &str, a: (&str, &T), b: (&str, &T), out: &T) -> EmuResult<()> {
    let Some(s) = r::broadcast_shape(&a.1.dims, &b.1.dims) else {
        bail!(
            InvalidParam,
            "{api}: {} {:?} and {} {:?} do not broadcast",
            a.0,
            a.1.dims,
            b.0,
            b.1.dims
        );
    };
    if s != out.dims {
        bail!(
            InvalidParam,
            "{api}: out has shape {:?} but {} {:?} and {} {:?} broadcast to {:?}",
            out.dims,
            a.0,
            a.1.dims,
            b.0,
            b.1.dims,
            s
        );
    }
    Ok(())
}

/// Element-wise unary op: `out = f(self)`, same shapes.
fn unary(
    api: &str,
    x: *const aclTensor,
    out: *const aclTensor,
    f: fn(f64) -> f64,
) -> EmuResult<Plan> {
    let (x, o) = (tn(api, "self", x)?, tn(api, "out", out)?);
    shape_eq(api, ("self", &x), ("out", &o))?;
    float(api, "out", &o)?;
    let mut p = Plan::new();
    let (a, y) = (p.input(&x, "self"), p.output(&o, "out"));
    Ok(p.with_run(move |res| {
        let v: Vec<f64> = a.f64(res).into_iter().map(f).collect();
        y.put64(res, &v);
        Ok(())
    }))
}

/// Element-wise binary op with broadcasting: `out = f(self, other)`.
fn binary(
    api: &str,
    a: &T,
    b: &T,
    o: &T,
    f: impl Fn(f64, f64) -> f64 + Send + 'static,
) -> EmuResult<Plan> {
    bcast(api, ("self", a), ("other", b), o)?;
    let mut p = Plan::new();
    let (x, y, z) = (p.input(a, "self"), p.input(b, "other"), p.output(o, "out"));
    Ok(p.with_run(move |res| {
        let (xs, ys) = (x.f64(res), y.f64(res));
        let xe = expand64(&xs, x.dims(), z.dims());
        let ye = expand64(&ys, y.dims(), z.dims());
        let v: Vec<f64> = xe.iter().zip(&ye).map(|(&p, &q)| f(p, q)).collect();
        z.put64(res, &v);
        Ok(())
    }))
}

fn expand64(v: &[f64], from: &[i64], to: &[i64]) -> Vec<f64> {
    if from == to {
        return v.to_vec();
    }
    // Expand indices through the f32 helper on positions (exact for < 2^24 elements).
    let idx: Vec<f32> = (0..v.len()).map(|i| i as f32).collect();
    r::expand(&idx, from, to)
        .into_iter()
        .map(|i| v[i as usize])
        .collect()
}

/// A gradient op `gradInput = f(gradOutput, x)` with equal shapes.
fn grad2(
    api: &str,
    names: [&str; 3],
    g: *const aclTensor,
    x: *const aclTensor,
    out: *const aclTensor,
    f: impl Fn(f64, f64) -> f64 + Send + 'static,
) -> EmuResult<Plan> {
    let (g, x, o) = (
        tn(api, names[0], g)?,
        tn(api, names[1], x)?,
        tn(api, names[2], out)?,
    );
    shape_eq(api, (names[0], &g), (names[1], &x))?;
    shape_eq(api, (names[0], &g), (names[2], &o))?;
    float(api, names[2], &o)?;
    let mut p = Plan::new();
    let (a, b, y) = (
        p.input(&g, names[0]),
        p.input(&x, names[1]),
        p.output(&o, names[2]),
    );
    Ok(p.with_run(move |res| {
        let (gs, xs) = (a.f64(res), b.f64(res));
        let v: Vec<f64> = gs.iter().zip(&xs).map(|(&g, &x)| f(g, x)).collect();
        y.put64(res, &v);
        Ok(())
    }))
}

fn reduce_plan(
    api: &str,
    x: *const aclTensor,
    dims: Vec<i64>,
    keep: bool,
    empty_is_all: bool,
    dtype: Option<aclDataType>,
    out: *const aclTensor,
    op: Reduce,
) -> EmuResult<Plan> {
    let (x, o) = (tn(api, "self", x)?, tn(api, "out", out)?);
    if let Some(d) = dtype {
        if DType::parse(api, d)? != o.dtype {
            bail!(
                InvalidParam,
                "{api}: dtype {d} differs from out's dtype {:?}",
                o.dtype
            );
        }
    }
    let Some(nd) = r::norm_dims(&dims, x.dims.len()) else {
        bail!(
            InvalidParam,
            "{api}: dims {dims:?} out of range for self {:?}",
            x.dims
        );
    };
    let all: Vec<usize> = if nd.is_empty() && empty_is_all {
        (0..x.dims.len()).collect()
    } else {
        nd
    };
    let shape = if all.is_empty() {
        x.dims.clone()
    } else {
        r::reduce(&[], &x.dims, &all, keep, op).1
    };
    if numel(&shape) != o.numel()
        || (shape.len() == o.dims.len() && shape != o.dims)
        || (shape != o.dims && !(shape.is_empty() && o.dims == [1]))
    {
        bail!(
            InvalidParam,
            "{api}: reducing self {:?} over {all:?} (keep {keep}) gives {shape:?} but out is {:?}",
            x.dims,
            o.dims
        );
    }
    let mut p = Plan::new();
    let (a, y) = (p.input(&x, "self"), p.output(&o, "out"));
    let ws = scratch(o.numel() * 4);
    Ok(p.with_workspace(ws).with_run(move |res| {
        let v = a.f32(res);
        if all.is_empty() {
            y.put32(res, &v);
        } else {
            let (s, _) = r::reduce(&v, a.dims(), &all, keep, op);
            y.put32(res, &s);
        }
        Ok(())
    }))
}

fn softmax_plan(
    api: &str,
    x: *const aclTensor,
    dim: i64,
    out: *const aclTensor,
    log: bool,
) -> EmuResult<Plan> {
    let (x, o) = (tn(api, "self", x)?, tn(api, "out", out)?);
    shape_eq(api, ("self", &x), ("out", &o))?;
    float(api, "out", &o)?;
    let d = axis(api, dim, x.dims.len())?;
    let mut p = Plan::new();
    let (a, y) = (p.input(&x, "self"), p.output(&o, "out"));
    Ok(p.with_run(move |res| {
        let sh = if a.dims().is_empty() {
            vec![1]
        } else {
            a.dims().to_vec()
        };
        y.put32(res, &r::softmax(&a.f32(res), &sh, d, log));
        Ok(())
    }))
}

fn softmax_bw_plan(
    api: &str,
    g: *const aclTensor,
    yv: *const aclTensor,
    dim: i64,
    out: *const aclTensor,
    log: bool,
) -> EmuResult<Plan> {
    let (g, yt, o) = (
        tn(api, "gradOutput", g)?,
        tn(api, "output", yv)?,
        tn(api, "out", out)?,
    );
    shape_eq(api, ("gradOutput", &g), ("output", &yt))?;
    shape_eq(api, ("gradOutput", &g), ("out", &o))?;
    let d = axis(api, dim, g.dims.len())?;
    let mut p = Plan::new();
    let (a, b, y) = (
        p.input(&g, "gradOutput"),
        p.input(&yt, "output"),
        p.output(&o, "out"),
    );
    Ok(p.with_run(move |res| {
        let sh = if a.dims().is_empty() {
            vec![1]
        } else {
            a.dims().to_vec()
        };
        y.put32(
            res,
            &r::softmax_backward(&a.f32(res), &b.f32(res), &sh, d, log),
        );
        Ok(())
    }))
}

fn matmul_plan(
    api: &str,
    a: *const aclTensor,
    b: *const aclTensor,
    out: *const aclTensor,
    batch3: bool,
) -> EmuResult<Plan> {
    let (a, b, o) = (
        tn(api, "self", a)?,
        tn(api, "mat2", b)?,
        tn(api, "out", out)?,
    );
    float(api, "self", &a)?;
    float(api, "mat2", &b)?;
    if batch3 && (a.dims.len() != 3 || b.dims.len() != 3 || a.dims[0] != b.dims[0]) {
        bail!(
            InvalidParam,
            "{api}: self {:?} and mat2 {:?} must be [b,m,k] and [b,k,n]",
            a.dims,
            b.dims
        );
    }
    let Some(s) = r::matmul_shape(&a.dims, &b.dims) else {
        bail!(
            InvalidParam,
            "{api}: self {:?} and mat2 {:?} do not multiply",
            a.dims,
            b.dims
        );
    };
    if s != o.dims {
        bail!(
            InvalidParam,
            "{api}: self {:?} · mat2 {:?} is {s:?} but out is {:?}",
            a.dims,
            b.dims,
            o.dims
        );
    }
    let mut p = Plan::new();
    let (x, y, z) = (
        p.input(&a, "self"),
        p.input(&b, "mat2"),
        p.output(&o, "out"),
    );
    Ok(p.with_workspace(scratch(o.numel() * 4))
        .with_run(move |res| {
            z.put32(
                res,
                &r::matmul(&x.f32(res), x.dims(), &y.f32(res), y.dims()),
            );
            Ok(())
        }))
}

/// Normalises a 2-element (or 1-element) window parameter.
fn pair(api: &str, role: &str, v: &[i64], default: Option<[usize; 2]>) -> EmuResult<[usize; 2]> {
    match v {
        [] => default.ok_or_else(|| emu_err!(InvalidParam, "{api}: {role} is empty")),
        [a] if *a >= 0 => Ok([*a as usize; 2]),
        [a, b] if *a >= 0 && *b >= 0 => Ok([*a as usize, *b as usize]),
        _ => bail!(
            InvalidParam,
            "{api}: {role} {v:?} must hold 1 or 2 non-negative values"
        ),
    }
}

/// `[N, C, H, W]` of a 4-d (or 3-d `[C, H, W]`) pooling / convolution input.
fn nchw(api: &str, role: &str, t: &T) -> EmuResult<[usize; 4]> {
    if t.format == shardc_ascend_sys::ACL_FORMAT_NHWC {
        bail!(
            NotSupported,
            "{api}: {role} is NHWC; the emulator's convolution and pooling take NCHW"
        );
    }
    let d = &t.dims;
    match d.len() {
        4 => Ok([d[0] as usize, d[1] as usize, d[2] as usize, d[3] as usize]),
        3 => Ok([1, d[0] as usize, d[1] as usize, d[2] as usize]),
        _ => bail!(
            InvalidParam,
            "{api}: {role} {:?} must be NCHW (4-d) or CHW (3-d)",
            d
        ),
    }
}

fn pool_geom(
    api: &str,
    x: &T,
    k: &[i64],
    s: &[i64],
    pd: &[i64],
    dil: &[i64],
    ceil: bool,
) -> EmuResult<(Pool, Vec<i64>)> {
    let [n, c, h, w] = nchw(api, "self", x)?;
    let k = pair(api, "kernelSize", k, None)?;
    let s = pair(api, "stride", s, Some(k))?;
    let pd = pair(api, "padding", pd, Some([0, 0]))?;
    let dil = pair(api, "dilation", dil, Some([1, 1]))?;
    if k[0] == 0 || k[1] == 0 || s[0] == 0 || s[1] == 0 || dil[0] == 0 || dil[1] == 0 {
        bail!(
            InvalidParam,
            "{api}: kernel {k:?}, stride {s:?} and dilation {dil:?} must be positive"
        );
    }
    if pd[0] * 2 > k[0] || pd[1] * 2 > k[1] {
        bail!(
            InvalidParam,
            "{api}: padding {pd:?} must be at most half the kernel {k:?}"
        );
    }
    let ha = Axis {
        input: h,
        kernel: k[0],
        stride: s[0],
        pad: pd[0],
        dilation: dil[0],
    };
    let wa = Axis {
        input: w,
        kernel: k[1],
        stride: s[1],
        pad: pd[1],
        dilation: dil[1],
    };
    let (Some(oh), Some(ow)) = (ha.pool_out(ceil), wa.pool_out(ceil)) else {
        bail!(
            InvalidParam,
            "{api}: the window {k:?} does not fit the input {:?}",
            x.dims
        );
    };
    let mut out = x.dims.clone();
    let r = out.len();
    out[r - 2] = oh as i64;
    out[r - 1] = ow as i64;
    Ok((
        Pool {
            planes: n * c,
            h: ha,
            w: wa,
            oh,
            ow,
        },
        out,
    ))
}

fn conv_geom(
    api: &str,
    x: &T,
    w: &T,
    stride: &[i64],
    pad: &[i64],
    dil: &[i64],
    transposed: bool,
    out_pad: &[i64],
    groups: i64,
) -> EmuResult<(Conv, Vec<i64>)> {
    if transposed {
        bail!(
            NotSupported,
            "{api}: transposed convolution is not emulated"
        );
    }
    if out_pad.iter().any(|&v| v != 0) {
        bail!(
            InvalidParam,
            "{api}: outputPadding {out_pad:?} must be zero for a forward convolution"
        );
    }
    for (role, t) in [("input", x), ("weight", w)] {
        if t.format == shardc_ascend_sys::ACL_FORMAT_NHWC {
            bail!(
                NotSupported,
                "{api}: {role} is NHWC; the emulator's convolution takes NCHW"
            );
        }
    }
    let one_d = x.dims.len() == 3 && w.dims.len() == 3;
    let (xd, wd): (Vec<i64>, Vec<i64>) = if one_d {
        (
            vec![x.dims[0], x.dims[1], 1, x.dims[2]],
            vec![w.dims[0], w.dims[1], 1, w.dims[2]],
        )
    } else if x.dims.len() == 4 && w.dims.len() == 4 {
        (x.dims.clone(), w.dims.clone())
    } else {
        bail!(
            InvalidParam,
            "{api}: input {:?} and weight {:?} must both be 4-d (NCHW / OIHW) or 3-d",
            x.dims,
            w.dims
        );
    };
    let fix = |v: &[i64], role: &str, d: [usize; 2]| -> EmuResult<[usize; 2]> {
        if one_d && v.len() == 1 {
            Ok([d[0], v[0].max(0) as usize])
        } else {
            pair(api, role, v, Some(d))
        }
    };
    let s = fix(stride, "stride", [1, 1])?;
    let p = fix(pad, "padding", [0, 0])?;
    let dl = fix(dil, "dilation", [1, 1])?;
    let g = groups.max(0) as usize;
    let (n, c, h, wi) = (
        xd[0] as usize,
        xd[1] as usize,
        xd[2] as usize,
        xd[3] as usize,
    );
    let (o, cg, kh, kw) = (
        wd[0] as usize,
        wd[1] as usize,
        wd[2] as usize,
        wd[3] as usize,
    );
    if g == 0 || c % g != 0 || o % g != 0 || cg * g != c {
        bail!(
            InvalidParam,
            "{api}: input {:?} has {c} channels, weight {:?} expects {cg}·groups with groups {groups}",
            x.dims,
            w.dims
        );
    }
    if s.contains(&0) || dl.contains(&0) {
        bail!(
            InvalidParam,
            "{api}: stride {s:?} and dilation {dl:?} must be positive"
        );
    }
    let ha = Axis {
        input: h,
        kernel: kh,
        stride: s[0],
        pad: p[0],
        dilation: dl[0],
    };
    let wa = Axis {
        input: wi,
        kernel: kw,
        stride: s[1],
        pad: p[1],
        dilation: dl[1],
    };
    let (Some(oh), Some(ow)) = (ha.out(), wa.out()) else {
        bail!(
            InvalidParam,
            "{api}: kernel {:?} does not fit input {:?} with padding {p:?}",
            w.dims,
            x.dims
        );
    };
    let out = if one_d {
        vec![n as i64, o as i64, ow as i64]
    } else {
        vec![n as i64, o as i64, oh as i64, ow as i64]
    };
    Ok((
        Conv {
            n,
            c,
            o,
            groups: g,
            h: ha,
            w: wa,
        },
        out,
    ))
}

macro_rules! aclnn {
    ($api:ident; $( $op:ident, $ws:ident ( $($arg:ident : $ty:ty),* $(,)? ) => $body:block )*) => {$(
        #[doc = concat!("`", stringify!($ws), "`: validates and prepares `", stringify!($op), "` (semantics: `shardc_ascend_sys::sig::", stringify!($op), "`).")]
        #[no_mangle]
        pub unsafe extern "C" fn $ws($($arg: $ty,)* workspace_size: *mut u64, executor: *mut *mut aclOpExecutor) -> aclnnStatus {
            let api = stringify!($ws);
            crate::ffi::nn(api, || {
                if workspace_size.is_null() || executor.is_null() {
                    bail!(NullPtr, "{api}: workspaceSize or executor is null");
                }
                let $api = stringify!($op);
                let plan: EmuResult<Plan> = (|| $body)();
                let (ws, h) = plan::register(stringify!($op), plan?);
                *workspace_size = ws;
                *executor = h as *mut aclOpExecutor;
                Ok(())
            })
        }
        #[doc = concat!("`", stringify!($op), "`: launches the executor made by `", stringify!($ws), "` on `stream`.")]
        #[no_mangle]
        pub unsafe extern "C" fn $op(workspace: *mut c_void, workspace_size: u64, executor: *mut aclOpExecutor, stream: aclrtStream) -> aclnnStatus {
            let api = stringify!($op);
            crate::ffi::nn(api, || plan::launch(api, workspace as u64, workspace_size, executor as usize, stream as usize))
        }
        const _: shardc_ascend_sys::sig::$ws = $ws;
        const _: shardc_ascend_sys::sig::$op = $op;
    )*};
}

aclnn! {
api;
aclnnAdd, aclnnAddGetWorkspaceSize(self_: *const aclTensor, other: *const aclTensor, alpha: *const aclScalar, out: *mut aclTensor) => {
    let al = scalar(api, "alpha", alpha)?;
    binary(api, &tn(api, "self", self_)?, &tn(api, "other", other)?, &tn(api, "out", out)?, move |a, b| a + al * b)
}
aclnnAdds, aclnnAddsGetWorkspaceSize(self_: *const aclTensor, other: *const aclScalar, alpha: *const aclScalar, out: *mut aclTensor) => {
    let (b, al) = (scalar(api, "other", other)?, scalar(api, "alpha", alpha)?);
    let (x, o) = (tn(api, "self", self_)?, tn(api, "out", out)?);
    shape_eq(api, ("self", &x), ("out", &o))?;
    let mut p = Plan::new();
    let (a, y) = (p.input(&x, "self"), p.output(&o, "out"));
    Ok(p.with_run(move |res| { let v: Vec<f64> = a.f64(res).iter().map(|&v| v + al * b).collect(); y.put64(res, &v); Ok(()) }))
}
aclnnSub, aclnnSubGetWorkspaceSize(self_: *const aclTensor, other: *const aclTensor, alpha: *const aclScalar, out: *mut aclTensor) => {
    let al = scalar(api, "alpha", alpha)?;
    binary(api, &tn(api, "self", self_)?, &tn(api, "other", other)?, &tn(api, "out", out)?, move |a, b| a - al * b)
}
aclnnMul, aclnnMulGetWorkspaceSize(self_: *const aclTensor, other: *const aclTensor, out: *mut aclTensor) => {
    binary(api, &tn(api, "self", self_)?, &tn(api, "other", other)?, &tn(api, "out", out)?, |a, b| a * b)
}
aclnnMuls, aclnnMulsGetWorkspaceSize(self_: *const aclTensor, other: *const aclScalar, out: *mut aclTensor) => {
    let b = scalar(api, "other", other)?;
    let (x, o) = (tn(api, "self", self_)?, tn(api, "out", out)?);
    shape_eq(api, ("self", &x), ("out", &o))?;
    let mut p = Plan::new();
    let (a, y) = (p.input(&x, "self"), p.output(&o, "out"));
    Ok(p.with_run(move |res| { let v: Vec<f64> = a.f64(res).iter().map(|&v| v * b).collect(); y.put64(res, &v); Ok(()) }))
}
aclnnDiv, aclnnDivGetWorkspaceSize(self_: *const aclTensor, other: *const aclTensor, out: *mut aclTensor) => {
    let o = tn(api, "out", out)?;
    float(api, "out", &o)?;
    binary(api, &tn(api, "self", self_)?, &tn(api, "other", other)?, &o, |a, b| ((a as f32) / (b as f32)) as f64)
}
aclnnNeg, aclnnNegGetWorkspaceSize(self_: *const aclTensor, out: *mut aclTensor) => { unary(api, self_, out, |v| -v) }
aclnnSqrt, aclnnSqrtGetWorkspaceSize(self_: *const aclTensor, out: *mut aclTensor) => { unary(api, self_, out, |v| (v as f32).sqrt() as f64) }
aclnnExp, aclnnExpGetWorkspaceSize(self_: *const aclTensor, out: *mut aclTensor) => { unary(api, self_, out, f64::exp) }
aclnnLog, aclnnLogGetWorkspaceSize(self_: *const aclTensor, out: *mut aclTensor) => { unary(api, self_, out, f64::ln) }
aclnnTanh, aclnnTanhGetWorkspaceSize(self_: *const aclTensor, out: *mut aclTensor) => { unary(api, self_, out, f64::tanh) }
aclnnErf, aclnnErfGetWorkspaceSize(self_: *const aclTensor, out: *mut aclTensor) => { unary(api, self_, out, libm::erf) }
aclnnTanhBackward, aclnnTanhBackwardGetWorkspaceSize(gradOutput: *const aclTensor, output: *const aclTensor, gradInput: *mut aclTensor) => {
    grad2(api, ["gradOutput", "output", "gradInput"], gradOutput, output, gradInput, |g, y| g * (1.0 - y * y))
}
aclnnCast, aclnnCastGetWorkspaceSize(self_: *const aclTensor, dtype: aclDataType, out: *mut aclTensor) => {
    let (x, o) = (tn(api, "self", self_)?, tn(api, "out", out)?);
    shape_eq(api, ("self", &x), ("out", &o))?;
    if DType::parse(api, dtype)? != o.dtype {
        bail!(InvalidParam, "{api}: dtype {dtype} differs from out's dtype {:?}", o.dtype);
    }
    let exact_int = !x.dtype.is_float() && !o.dtype.is_float();
    let mut p = Plan::new();
    let (a, y) = (p.input(&x, "self"), p.output(&o, "out"));
    Ok(p.with_run(move |res| {
        if exact_int { y.puti(res, &a.i64(res)) } else { y.put64(res, &a.f64(res)) }
        Ok(())
    }))
}
aclnnEqTensor, aclnnEqTensorGetWorkspaceSize(self_: *const aclTensor, other: *const aclTensor, out: *mut aclTensor) => {
    binary(api, &tn(api, "self", self_)?, &tn(api, "other", other)?, &tn(api, "out", out)?, |a, b| (a == b) as u8 as f64)
}
aclnnReduceSum, aclnnReduceSumGetWorkspaceSize(self_: *const aclTensor, dims: *const aclIntArray, keepDims: bool, dtype: aclDataType, out: *mut aclTensor) => {
    reduce_plan(api, self_, ints(api, "dims", dims)?, keepDims, false, Some(dtype), out, Reduce::Sum)
}
aclnnMean, aclnnMeanGetWorkspaceSize(self_: *const aclTensor, dim: *const aclIntArray, keepDim: bool, dtype: aclDataType, out: *mut aclTensor) => {
    reduce_plan(api, self_, ints(api, "dim", dim)?, keepDim, true, Some(dtype), out, Reduce::Mean)
}
aclnnAmax, aclnnAmaxGetWorkspaceSize(self_: *const aclTensor, dim: *const aclIntArray, keepDim: bool, out: *mut aclTensor) => {
    reduce_plan(api, self_, ints(api, "dim", dim)?, keepDim, true, None, out, Reduce::Max)
}
aclnnExpand, aclnnExpandGetWorkspaceSize(self_: *const aclTensor, size: *const aclIntArray, out: *mut aclTensor) => {
    let (x, o, size) = (tn(api, "self", self_)?, tn(api, "out", out)?, ints(api, "size", size)?);
    if size.len() < x.dims.len() {
        bail!(InvalidParam, "{api}: size {size:?} has fewer dims than self {:?}", x.dims);
    }
    let off = size.len() - x.dims.len();
    let target: Vec<i64> = size.iter().enumerate().map(|(i, &s)| if s == -1 && i >= off { x.dims[i - off] } else { s }).collect();
    if r::broadcast_shape(&x.dims, &target).as_ref() != Some(&target) || target != o.dims {
        bail!(InvalidParam, "{api}: self {:?} does not expand to size {size:?} / out {:?}", x.dims, o.dims);
    }
    let mut p = Plan::new();
    let (a, y) = (p.input(&x, "self"), p.output(&o, "out"));
    Ok(p.with_run(move |res| { y.put64(res, &expand64(&a.f64(res), a.dims(), y.dims())); Ok(()) }))
}
aclnnOneHot, aclnnOneHotGetWorkspaceSize(self_: *const aclTensor, numClasses: c_int, onValue: *const aclTensor, offValue: *const aclTensor, axis_: i64, out: *mut aclTensor) => {
    let (x, on, off, o) = (tn(api, "self", self_)?, tn(api, "onValue", onValue)?, tn(api, "offValue", offValue)?, tn(api, "out", out)?);
    index_dtype(api, "self", &x)?;
    if numClasses < 1 {
        bail!(InvalidParam, "{api}: numClasses {numClasses} must be positive");
    }
    if on.numel() != 1 || off.numel() != 1 {
        bail!(InvalidParam, "{api}: onValue {:?} and offValue {:?} must hold one element", on.dims, off.dims);
    }
    let r0 = x.dims.len();
    let ax = if axis_ == -1 { r0 } else if axis_ >= 0 && axis_ as usize <= r0 { axis_ as usize } else {
        bail!(InvalidParam, "{api}: axis {axis_} out of range for self {:?}", x.dims);
    };
    let mut want = x.dims.clone();
    want.insert(ax, numClasses as i64);
    if want != o.dims {
        bail!(InvalidParam, "{api}: out is {:?} but self {:?} with {numClasses} classes at axis {axis_} gives {want:?}", o.dims, x.dims);
    }
    let mut p = Plan::new();
    let (a, onv, offv, y) = (p.input(&x, "self"), p.input(&on, "onValue"), p.input(&off, "offValue"), p.output(&o, "out"));
    Ok(p.with_run(move |res| {
        let idx = a.i64(res);
        let (onv, offv) = (onv.f64(res)[0], offv.f64(res)[0]);
        let (outer, inner) = (numel(&a.dims()[..ax]), numel(&a.dims()[ax..]));
        let k = numClasses as usize;
        let mut v = vec![offv; outer * k * inner];
        for o_ in 0..outer {
            for i in 0..inner {
                let c = idx[o_ * inner + i];
                if c >= 0 && (c as usize) < k {
                    v[(o_ * k + c as usize) * inner + i] = onv;
                }
            }
        }
        y.put64(res, &v);
        Ok(())
    }))
}
aclnnPermute, aclnnPermuteGetWorkspaceSize(self_: *const aclTensor, dims: *const aclIntArray, out: *mut aclTensor) => {
    let (x, o, dims) = (tn(api, "self", self_)?, tn(api, "out", out)?, ints(api, "dims", dims)?);
    let r0 = x.dims.len();
    let perm: Vec<usize> = dims.iter().map(|&d| axis(api, d, r0)).collect::<EmuResult<_>>()?;
    let mut seen = perm.clone();
    seen.sort_unstable();
    seen.dedup();
    if perm.len() != r0 || seen.len() != r0 {
        bail!(InvalidParam, "{api}: dims {dims:?} is not a permutation of self's {r0} axes");
    }
    let want: Vec<i64> = perm.iter().map(|&p| x.dims[p]).collect();
    if want != o.dims {
        bail!(InvalidParam, "{api}: out is {:?} but permuting self {:?} by {dims:?} gives {want:?}", o.dims, x.dims);
    }
    let mut p = Plan::new();
    let (a, y) = (p.input(&x, "self"), p.output(&o, "out"));
    Ok(p.with_run(move |res| {
        let v = a.f64(res);
        let idx: Vec<f32> = (0..v.len()).map(|i| i as f32).collect();
        let pv: Vec<f64> = r::permute(&idx, a.dims(), &perm).into_iter().map(|i| v[i as usize]).collect();
        y.put64(res, &pv);
        Ok(())
    }))
}
aclnnCat, aclnnCatGetWorkspaceSize(tensors: *const aclTensorList, dim: i64, out: *mut aclTensor) => {
    let (ts, o) = (tensor::tensor_list(api, "tensors", tensors as usize)?, tn(api, "out", out)?);
    if ts.is_empty() {
        bail!(InvalidParam, "{api}: the tensor list is empty");
    }
    let r0 = ts[0].dims.len();
    let d = axis(api, dim, r0)?;
    let mut want = ts[0].dims.clone();
    want[d] = 0;
    for (i, t) in ts.iter().enumerate() {
        let ok = t.dims.len() == r0 && t.dims.iter().zip(&ts[0].dims).enumerate().all(|(k, (a, b))| k == d || a == b);
        if !ok {
            bail!(InvalidParam, "{api}: tensors[{i}] {:?} does not match tensors[0] {:?} outside dim {dim}", t.dims, ts[0].dims);
        }
        want[d] += t.dims[d];
    }
    if want != o.dims {
        bail!(InvalidParam, "{api}: out is {:?} but the concatenation is {want:?}", o.dims);
    }
    let mut p = Plan::new();
    let args: Vec<Arg> = ts.iter().enumerate().map(|(i, t)| p.input(t, &format!("tensors[{i}]"))).collect();
    let y = p.output(&o, "out");
    Ok(p.with_run(move |res| {
        let outer = numel(&want[..d]);
        let mut v = Vec::with_capacity(numel(&want));
        let parts: Vec<(Vec<f64>, usize)> = args.iter().map(|a| (a.f64(res), numel(&a.dims()[d..]))).collect();
        for o_ in 0..outer {
            for (vals, row) in &parts {
                v.extend_from_slice(&vals[o_ * row..(o_ + 1) * row]);
            }
        }
        y.put64(res, &v);
        Ok(())
    }))
}
aclnnInplaceCopy, aclnnInplaceCopyGetWorkspaceSize(selfRef: *mut aclTensor, src: *const aclTensor) => {
    let (d, s) = (tn(api, "selfRef", selfRef)?, tn(api, "src", src)?);
    if r::broadcast_shape(&s.dims, &d.dims).as_ref() != Some(&d.dims) {
        bail!(InvalidParam, "{api}: src {:?} does not broadcast to selfRef {:?}", s.dims, d.dims);
    }
    let exact_int = !s.dtype.is_float() && !d.dtype.is_float();
    let mut p = Plan::new();
    let (a, y) = (p.input(&s, "src"), p.output(&d, "selfRef"));
    Ok(p.with_run(move |res| {
        if exact_int {
            let v = a.i64(res);
            let idx: Vec<f64> = (0..v.len()).map(|i| i as f64).collect();
            let e: Vec<i64> = expand64(&idx, a.dims(), y.dims()).into_iter().map(|i| v[i as usize]).collect();
            y.puti(res, &e);
        } else {
            y.put64(res, &expand64(&a.f64(res), a.dims(), y.dims()));
        }
        Ok(())
    }))
}
aclnnInplaceZero, aclnnInplaceZeroGetWorkspaceSize(selfRef: *mut aclTensor) => {
    let d = tn(api, "selfRef", selfRef)?;
    let mut p = Plan::new();
    let y = p.output(&d, "selfRef");
    let n = d.numel();
    Ok(p.with_run(move |res| { y.put64(res, &vec![0.0; n]); Ok(()) }))
}
aclnnInplaceFillScalar, aclnnInplaceFillScalarGetWorkspaceSize(selfRef: *mut aclTensor, value: *const aclScalar) => {
    let (d, v) = (tn(api, "selfRef", selfRef)?, scalar(api, "value", value)?);
    let mut p = Plan::new();
    let y = p.output(&d, "selfRef");
    let n = d.numel();
    Ok(p.with_run(move |res| { y.put64(res, &vec![v; n]); Ok(()) }))
}
aclnnMatmul, aclnnMatmulGetWorkspaceSize(self_: *const aclTensor, mat2: *const aclTensor, out: *mut aclTensor, _cubeMathType: i8) => {
    matmul_plan(api, self_, mat2, out, false)
}
aclnnBatchMatMul, aclnnBatchMatMulGetWorkspaceSize(self_: *const aclTensor, mat2: *const aclTensor, out: *mut aclTensor, _cubeMathType: i8) => {
    matmul_plan(api, self_, mat2, out, true)
}
aclnnRelu, aclnnReluGetWorkspaceSize(self_: *const aclTensor, out: *const aclTensor) => { unary(api, self_, out, |v| if v > 0.0 { v } else { 0.0 }) }
aclnnSigmoid, aclnnSigmoidGetWorkspaceSize(self_: *const aclTensor, out: *mut aclTensor) => { unary(api, self_, out, |v| r::sigmoid(v as f32) as f64) }
aclnnSigmoidBackward, aclnnSigmoidBackwardGetWorkspaceSize(gradOutput: *const aclTensor, output: *const aclTensor, gradInput: *mut aclTensor) => {
    grad2(api, ["gradOutput", "output", "gradInput"], gradOutput, output, gradInput, |g, y| g * y * (1.0 - y))
}
aclnnGeluV2, aclnnGeluV2GetWorkspaceSize(x: *const aclTensor, approximate: i64, y: *mut aclTensor) => {
    match approximate {
        0 => unary(api, x, y, |v| r::gelu_erf(v as f32) as f64),
        1 => unary(api, x, y, |v| r::gelu_tanh(v as f32) as f64),
        a => bail!(InvalidParam, "{api}: approximate {a} (0: none, 1: tanh)"),
    }
}
aclnnGeluBackwardV2, aclnnGeluBackwardV2GetWorkspaceSize(gradOutput: *const aclTensor, self_: *const aclTensor, approximate: *mut c_char, gradInput: *mut aclTensor) => {
    if approximate.is_null() {
        bail!(NullPtr, "{api}: approximate is null");
    }
    let names = ["gradOutput", "self", "gradInput"];
    match CStr::from_ptr(approximate).to_str().unwrap_or("") {
        "none" => grad2(api, names, gradOutput, self_, gradInput, |g, x| g * r::gelu_erf_grad(x as f32) as f64),
        "tanh" => grad2(api, names, gradOutput, self_, gradInput, |g, x| g * r::gelu_tanh_grad(x as f32) as f64),
        a => bail!(InvalidParam, "{api}: approximate {a:?} (\"none\" or \"tanh\")"),
    }
}
aclnnSilu, aclnnSiluGetWorkspaceSize(self_: *const aclTensor, out: *mut aclTensor) => {
    unary(api, self_, out, |v| v * r::sigmoid(v as f32) as f64)
}
aclnnSiluBackward, aclnnSiluBackwardGetWorkspaceSize(gradOutput: *const aclTensor, self_: *const aclTensor, gradInput: *mut aclTensor) => {
    grad2(api, ["gradOutput", "self", "gradInput"], gradOutput, self_, gradInput, |g, x| {
        let s = r::sigmoid(x as f32) as f64;
        g * s * (1.0 + x * (1.0 - s))
    })
}
aclnnThresholdBackward, aclnnThresholdBackwardGetWorkspaceSize(gradOutput: *const aclTensor, self_: *const aclTensor, threshold: *const aclScalar, out: *mut aclTensor) => {
    let th = scalar(api, "threshold", threshold)?;
    grad2(api, ["gradOutput", "self", "out"], gradOutput, self_, out, move |g, x| if x > th { g } else { 0.0 })
}
aclnnSoftmax, aclnnSoftmaxGetWorkspaceSize(self_: *const aclTensor, dim: i64, out: *mut aclTensor) => { softmax_plan(api, self_, dim, out, false) }
aclnnSoftmaxBackward, aclnnSoftmaxBackwardGetWorkspaceSize(gradOutput: *const aclTensor, output: *const aclTensor, dim: i64, out: *mut aclTensor) => {
    softmax_bw_plan(api, gradOutput, output, dim, out, false)
}
aclnnLogSoftmax, aclnnLogSoftmaxGetWorkspaceSize(self_: *const aclTensor, dim: i64, out: *mut aclTensor) => { softmax_plan(api, self_, dim, out, true) }
aclnnLogSoftmaxBackward, aclnnLogSoftmaxBackwardGetWorkspaceSize(gradOutput: *const aclTensor, output: *const aclTensor, dim: i64, out: *mut aclTensor) => {
    softmax_bw_plan(api, gradOutput, output, dim, out, true)
}
aclnnLayerNorm, aclnnLayerNormGetWorkspaceSize(input: *const aclTensor, normalizedShape: *const aclIntArray, weightOptional: *const aclTensor, biasOptional: *const aclTensor, eps: f64, out: *mut aclTensor, meanOutOptional: *mut aclTensor, rstdOutOptional: *mut aclTensor) => {
    let (x, o, ns) = (tn(api, "input", input)?, tn(api, "out", out)?, ints(api, "normalizedShape", normalizedShape)?);
    let (w, b) = (otn(api, "weight", weightOptional)?, otn(api, "bias", biasOptional)?);
    let (mo, ro) = (otn(api, "meanOut", meanOutOptional)?, otn(api, "rstdOut", rstdOutOptional)?);
    shape_eq(api, ("input", &x), ("out", &o))?;
    let k = ns.len();
    if k == 0 || k > x.dims.len() || x.dims[x.dims.len() - k..] != ns[..] {
        bail!(InvalidParam, "{api}: normalizedShape {ns:?} is not the trailing shape of input {:?}", x.dims);
    }
    for (role, t) in [("weight", &w), ("bias", &b)] {
        if let Some(t) = t {
            if numel(&t.dims) != numel(&ns) {
                bail!(InvalidParam, "{api}: {role} {:?} does not have normalizedShape {ns:?}", t.dims);
            }
        }
    }
    let inner = numel(&ns);
    let outer = numel(&x.dims) / inner.max(1);
    for (role, t) in [("meanOut", &mo), ("rstdOut", &ro)] {
        if let Some(t) = t {
            if t.numel() != outer {
                bail!(InvalidParam, "{api}: {role} {:?} must hold {outer} elements (input {:?} with the last {k} axes set to 1)", t.dims, x.dims);
            }
        }
    }
    let mut p = Plan::new();
    let a = p.input(&x, "input");
    let wa = w.as_ref().map(|t| p.input(t, "weight"));
    let ba = b.as_ref().map(|t| p.input(t, "bias"));
    let y = p.output(&o, "out");
    let ma = mo.as_ref().map(|t| p.output(t, "meanOut"));
    let ra = ro.as_ref().map(|t| p.output(t, "rstdOut"));
    Ok(p.with_workspace(scratch(outer * 8)).with_run(move |res| {
        let wv = wa.map(|a| a.f32(res));
        let bv = ba.map(|a| a.f32(res));
        let (v, m, rs) = r::layer_norm(&a.f32(res), outer, inner, wv.as_deref(), bv.as_deref(), eps);
        y.put32(res, &v);
        if let Some(ma) = ma { ma.put32(res, &m) }
        if let Some(ra) = ra { ra.put32(res, &rs) }
        Ok(())
    }))
}
aclnnLayerNormBackward, aclnnLayerNormBackwardGetWorkspaceSize(gradOut: *const aclTensor, input: *const aclTensor, normalizedShape: *const aclIntArray, mean: *const aclTensor, rstd: *const aclTensor, weightOptional: *const aclTensor, _biasOptional: *const aclTensor, outputMask: *const aclBoolArray, gradInputOut: *mut aclTensor, gradWeightOut: *mut aclTensor, gradBiasOut: *mut aclTensor) => {
    let (g, x, ns) = (tn(api, "gradOut", gradOut)?, tn(api, "input", input)?, ints(api, "normalizedShape", normalizedShape)?);
    let (m, rs, w) = (tn(api, "mean", mean)?, tn(api, "rstd", rstd)?, otn(api, "weight", weightOptional)?);
    let mask = bools(api, "outputMask", outputMask)?;
    if mask.len() != 3 {
        bail!(InvalidParam, "{api}: outputMask has {} values, 3 are required", mask.len());
    }
    shape_eq(api, ("gradOut", &g), ("input", &x))?;
    let k = ns.len();
    if k == 0 || k > x.dims.len() || x.dims[x.dims.len() - k..] != ns[..] {
        bail!(InvalidParam, "{api}: normalizedShape {ns:?} is not the trailing shape of input {:?}", x.dims);
    }
    let inner = numel(&ns);
    let outer = numel(&x.dims) / inner.max(1);
    if m.numel() != outer || rs.numel() != outer {
        bail!(InvalidParam, "{api}: mean {:?} / rstd {:?} must hold {outer} elements", m.dims, rs.dims);
    }
    let outs = [(gradInputOut, "gradInputOut", numel(&x.dims)), (gradWeightOut, "gradWeightOut", inner), (gradBiasOut, "gradBiasOut", inner)];
    let mut ot: Vec<Option<T>> = Vec::new();
    for (i, (h, role, n)) in outs.into_iter().enumerate() {
        if !mask[i] { ot.push(None); continue; }
        let t = tn(api, role, h)?;
        if t.numel() != n {
            bail!(InvalidParam, "{api}: {role} {:?} must hold {n} elements", t.dims);
        }
        ot.push(Some(t));
    }
    let mut p = Plan::new();
    let (ga, xa, ma, ra) = (p.input(&g, "gradOut"), p.input(&x, "input"), p.input(&m, "mean"), p.input(&rs, "rstd"));
    let wa = w.as_ref().map(|t| p.input(t, "weight"));
    let oa: Vec<Option<Arg>> = ot.iter().zip(["gradInputOut", "gradWeightOut", "gradBiasOut"]).map(|(t, role)| t.as_ref().map(|t| p.output(t, role))).collect();
    Ok(p.with_workspace(scratch(inner * 8)).with_run(move |res| {
        let wv = wa.map(|a| a.f32(res));
        let (dx, dw, db) = r::layer_norm_backward(&ga.f32(res), &xa.f32(res), outer, inner, &ma.f32(res), &ra.f32(res), wv.as_deref());
        for (a, v) in oa.iter().zip([dx, dw, db]) {
            if let Some(a) = a { a.put32(res, &v) }
        }
        Ok(())
    }))
}
aclnnBatchNorm, aclnnBatchNormGetWorkspaceSize(input: *const aclTensor, weight: *const aclTensor, bias: *const aclTensor, runningMean: *mut aclTensor, runningVar: *mut aclTensor, training: bool, momentum: f64, eps: f64, output: *mut aclTensor, saveMean: *mut aclTensor, saveInvstd: *mut aclTensor) => {
    let (x, o) = (tn(api, "input", input)?, tn(api, "output", output)?);
    shape_eq(api, ("input", &x), ("output", &o))?;
    if x.dims.len() < 2 {
        bail!(InvalidParam, "{api}: input {:?} must be [N, C, ...]", x.dims);
    }
    let (n, c) = (x.dims[0] as usize, x.dims[1] as usize);
    let hw = numel(&x.dims[2..]);
    let per_c = |role: &str, p: *const aclTensor, need: bool| -> EmuResult<Option<T>> {
        let t = if need { Some(tn(api, role, p)?) } else { otn(api, role, p)? };
        if let Some(t) = &t {
            if t.numel() != c {
                bail!(InvalidParam, "{api}: {role} {:?} must hold C = {c} elements (input {:?})", t.dims, x.dims);
            }
        }
        Ok(t)
    };
    let w = per_c("weight", weight, false)?;
    let b = per_c("bias", bias, false)?;
    let rm = per_c("runningMean", runningMean, !training)?;
    let rv = per_c("runningVar", runningVar, !training)?;
    let sm = if training { per_c("saveMean", saveMean, false)? } else { None };
    let si = if training { per_c("saveInvstd", saveInvstd, false)? } else { None };
    let mut p = Plan::new();
    let xa = p.input(&x, "input");
    let wa = w.as_ref().map(|t| p.input(t, "weight"));
    let ba = b.as_ref().map(|t| p.input(t, "bias"));
    let rma = rm.as_ref().map(|t| if training { p.output(t, "runningMean") } else { p.input(t, "runningMean") });
    let rva = rv.as_ref().map(|t| if training { p.output(t, "runningVar") } else { p.input(t, "runningVar") });
    let y = p.output(&o, "output");
    let sma = sm.as_ref().map(|t| p.output(t, "saveMean"));
    let sia = si.as_ref().map(|t| p.output(t, "saveInvstd"));
    Ok(p.with_workspace(scratch(c * 8)).with_run(move |res| {
        let xv = xa.f32(res);
        let wv = wa.map(|a| a.f64(res));
        let bv = ba.map(|a| a.f64(res));
        let (mean, var) = if training {
            r::channel_stats(&xv, n, c, hw)
        } else {
            match (&rma, &rva) {
                (Some(m), Some(v)) => (m.f64(res), v.f64(res)),
                _ => return Err(crate::emu_err!(Internal, "aclnnBatchNorm: inference without running statistics")),
            }
        };
        let inv: Vec<f64> = var.iter().map(|v| 1.0 / (v + eps).sqrt()).collect();
        let mut out = vec![0f32; xv.len()];
        for b_ in 0..n {
            for ch in 0..c {
                let (w_, bb) = (wv.as_ref().map_or(1.0, |w| w[ch]), bv.as_ref().map_or(0.0, |b| b[ch]));
                for q in 0..hw {
                    let i = (b_ * c + ch) * hw + q;
                    out[i] = ((xv[i] as f64 - mean[ch]) * inv[ch] * w_ + bb) as f32;
                }
            }
        }
        y.put32(res, &out);
        if training {
            let m_ = (n * hw) as f64;
            if let (Some(rma), Some(rva)) = (&rma, &rva) {
                let (om, ov) = (rma.f64(res), rva.f64(res));
                let nm: Vec<f64> = om.iter().zip(&mean).map(|(o, m)| (1.0 - momentum) * o + momentum * m).collect();
                let nv: Vec<f64> = ov.iter().zip(&var).map(|(o, v)| (1.0 - momentum) * o + momentum * v * m_ / (m_ - 1.0).max(1.0)).collect();
                rma.put64(res, &nm);
                rva.put64(res, &nv);
            }
            if let Some(a) = sma { a.put64(res, &mean) }
            if let Some(a) = sia { a.put64(res, &inv) }
        }
        Ok(())
    }))
}
aclnnBatchNormBackward, aclnnBatchNormBackwardGetWorkspaceSize(gradOut: *const aclTensor, input: *const aclTensor, weight: *const aclTensor, runningMean: *const aclTensor, runningVar: *const aclTensor, saveMean: *const aclTensor, saveInvstd: *const aclTensor, training: bool, eps: f64, outputMask: *const aclBoolArray, gradInput: *mut aclTensor, gradWeight: *mut aclTensor, gradBias: *mut aclTensor) => {
    let (g, x) = (tn(api, "gradOut", gradOut)?, tn(api, "input", input)?);
    shape_eq(api, ("gradOut", &g), ("input", &x))?;
    if x.dims.len() < 2 {
        bail!(InvalidParam, "{api}: input {:?} must be [N, C, ...]", x.dims);
    }
    let mask = bools(api, "outputMask", outputMask)?;
    if mask.len() != 3 {
        bail!(InvalidParam, "{api}: outputMask has {} values, 3 are required", mask.len());
    }
    let (n, c) = (x.dims[0] as usize, x.dims[1] as usize);
    let hw = numel(&x.dims[2..]);
    let per_c = |role: &str, p: *const aclTensor, need: bool| -> EmuResult<Option<T>> {
        let t = if need { Some(tn(api, role, p)?) } else { otn(api, role, p)? };
        if let Some(t) = &t {
            if t.numel() != c {
                bail!(InvalidParam, "{api}: {role} {:?} must hold C = {c} elements", t.dims);
            }
        }
        Ok(t)
    };
    let w = per_c("weight", weight, false)?;
    let (sm, si) = (per_c("saveMean", saveMean, training)?, per_c("saveInvstd", saveInvstd, training)?);
    let (rm, rv) = (per_c("runningMean", runningMean, !training)?, per_c("runningVar", runningVar, !training)?);
    let gi = if mask[0] { Some(tn(api, "gradInput", gradInput)?) } else { None };
    if let Some(t) = &gi { shape_eq(api, ("gradInput", t), ("input", &x))?; }
    let gw = if mask[1] { per_c("gradWeight", gradWeight, true)? } else { None };
    let gb = if mask[2] { per_c("gradBias", gradBias, true)? } else { None };
    let mut p = Plan::new();
    let (ga, xa) = (p.input(&g, "gradOut"), p.input(&x, "input"));
    let wa = w.as_ref().map(|t| p.input(t, "weight"));
    let (mA, iA) = if training {
        let (Some(sm), Some(si)) = (&sm, &si) else {
            bail!(NullPtr, "{api}: training needs saveMean and saveInvstd");
        };
        (p.input(sm, "saveMean"), p.input(si, "saveInvstd"))
    } else {
        let (Some(rm), Some(rv)) = (&rm, &rv) else {
            bail!(NullPtr, "{api}: inference needs runningMean and runningVar");
        };
        (p.input(rm, "runningMean"), p.input(rv, "runningVar"))
    };
    let gia = gi.as_ref().map(|t| p.output(t, "gradInput"));
    let gwa = gw.as_ref().map(|t| p.output(t, "gradWeight"));
    let gba = gb.as_ref().map(|t| p.output(t, "gradBias"));
    Ok(p.with_workspace(scratch(c * 8)).with_run(move |res| {
        let (gv, xv) = (ga.f32(res), xa.f32(res));
        let wv = wa.map(|a| a.f64(res));
        let mean = mA.f64(res);
        let inv: Vec<f64> = if training { iA.f64(res) } else { iA.f64(res).iter().map(|v| 1.0 / (v + eps).sqrt()).collect() };
        let mut dw = vec![0f64; c];
        let mut db = vec![0f64; c];
        for b_ in 0..n {
            for ch in 0..c {
                for q in 0..hw {
                    let i = (b_ * c + ch) * hw + q;
                    let xh = (xv[i] as f64 - mean[ch]) * inv[ch];
                    dw[ch] += gv[i] as f64 * xh;
                    db[ch] += gv[i] as f64;
                }
            }
        }
        if let Some(a) = &gia {
            let m_ = (n * hw) as f64;
            let mut dx = vec![0f64; xv.len()];
            for b_ in 0..n {
                for ch in 0..c {
                    let w_ = wv.as_ref().map_or(1.0, |w| w[ch]);
                    for q in 0..hw {
                        let i = (b_ * c + ch) * hw + q;
                        dx[i] = if training {
                            let xh = (xv[i] as f64 - mean[ch]) * inv[ch];
                            w_ * inv[ch] / m_ * (m_ * gv[i] as f64 - db[ch] - xh * dw[ch])
                        } else {
                            gv[i] as f64 * w_ * inv[ch]
                        };
                    }
                }
            }
            a.put64(res, &dx);
        }
        if let Some(a) = gwa { a.put64(res, &dw) }
        if let Some(a) = gba { a.put64(res, &db) }
        Ok(())
    }))
}
aclnnConvolution, aclnnConvolutionGetWorkspaceSize(input: *const aclTensor, weight: *const aclTensor, bias: *const aclTensor, stride: *const aclIntArray, padding: *const aclIntArray, dilation: *const aclIntArray, transposed: bool, outputPadding: *const aclIntArray, groups: i64, output: *mut aclTensor, _cubeMathType: i8) => {
    let (x, w, b, o) = (tn(api, "input", input)?, tn(api, "weight", weight)?, otn(api, "bias", bias)?, tn(api, "output", output)?);
    let op_ = if outputPadding.is_null() { Vec::new() } else { ints(api, "outputPadding", outputPadding)? };
    let (cv, want) = conv_geom(api, &x, &w, &ints(api, "stride", stride)?, &ints(api, "padding", padding)?, &ints(api, "dilation", dilation)?, transposed, &op_, groups)?;
    if want != o.dims {
        bail!(InvalidParam, "{api}: output is {:?} but input {:?} with weight {:?} gives {want:?}", o.dims, x.dims, w.dims);
    }
    if let Some(b) = &b {
        if b.numel() != cv.o {
            bail!(InvalidParam, "{api}: bias {:?} must hold Cout = {} elements", b.dims, cv.o);
        }
    }
    let mut p = Plan::new();
    let (xa, wa) = (p.input(&x, "input"), p.input(&w, "weight"));
    let ba = b.as_ref().map(|t| p.input(t, "bias"));
    let y = p.output(&o, "output");
    Ok(p.with_workspace(scratch(o.numel() * 4)).with_run(move |res| {
        let bv = ba.map(|a| a.f32(res));
        y.put32(res, &cv.forward(&xa.f32(res), &wa.f32(res), bv.as_deref()));
        Ok(())
    }))
}
aclnnConvolutionBackward, aclnnConvolutionBackwardGetWorkspaceSize(gradOutput: *const aclTensor, input: *const aclTensor, weight: *const aclTensor, _biasSizes: *const aclIntArray, stride: *const aclIntArray, padding: *const aclIntArray, dilation: *const aclIntArray, transposed: bool, outputPadding: *const aclIntArray, groups: c_int, outputMask: *const aclBoolArray, _cubeMathType: i8, gradInput: *mut aclTensor, gradWeight: *mut aclTensor, gradBias: *mut aclTensor) => {
    let (g, x, w) = (tn(api, "gradOutput", gradOutput)?, tn(api, "input", input)?, tn(api, "weight", weight)?);
    let mask = bools(api, "outputMask", outputMask)?;
    if mask.len() != 3 {
        bail!(InvalidParam, "{api}: outputMask has {} values, 3 are required", mask.len());
    }
    let op_ = if outputPadding.is_null() { Vec::new() } else { ints(api, "outputPadding", outputPadding)? };
    let (cv, want) = conv_geom(api, &x, &w, &ints(api, "stride", stride)?, &ints(api, "padding", padding)?, &ints(api, "dilation", dilation)?, transposed, &op_, groups as i64)?;
    if want != g.dims {
        bail!(InvalidParam, "{api}: gradOutput is {:?} but the forward output is {want:?}", g.dims);
    }
    let gi = if mask[0] { Some(tn(api, "gradInput", gradInput)?) } else { None };
    let gw = if mask[1] { Some(tn(api, "gradWeight", gradWeight)?) } else { None };
    let gb = if mask[2] { Some(tn(api, "gradBias", gradBias)?) } else { None };
    if let Some(t) = &gi { shape_eq(api, ("gradInput", t), ("input", &x))?; }
    if let Some(t) = &gw { shape_eq(api, ("gradWeight", t), ("weight", &w))?; }
    if let Some(t) = &gb {
        if t.numel() != cv.o {
            bail!(InvalidParam, "{api}: gradBias {:?} must hold Cout = {} elements", t.dims, cv.o);
        }
    }
    let mut p = Plan::new();
    let (ga, xa, wa) = (p.input(&g, "gradOutput"), p.input(&x, "input"), p.input(&w, "weight"));
    let gia = gi.as_ref().map(|t| p.output(t, "gradInput"));
    let gwa = gw.as_ref().map(|t| p.output(t, "gradWeight"));
    let gba = gb.as_ref().map(|t| p.output(t, "gradBias"));
    Ok(p.with_workspace(scratch(x.numel() * 4)).with_run(move |res| {
        let (dx, dw, db) = cv.backward(&ga.f32(res), &xa.f32(res), &wa.f32(res));
        if let Some(a) = gia { a.put32(res, &dx) }
        if let Some(a) = gwa { a.put32(res, &dw) }
        if let Some(a) = gba { a.put32(res, &db) }
        Ok(())
    }))
}
aclnnAvgPool2d, aclnnAvgPool2dGetWorkspaceSize(self_: *const aclTensor, kernelSize: *const aclIntArray, strides: *const aclIntArray, paddings: *const aclIntArray, ceilMode: bool, countIncludePad: bool, divisorOverride: i64, _cubeMathType: i8, out: *mut aclTensor) => {
    let (x, o) = (tn(api, "self", self_)?, tn(api, "out", out)?);
    let (pg, want) = pool_geom(api, &x, &ints(api, "kernelSize", kernelSize)?, &ints(api, "strides", strides)?, &ints(api, "paddings", paddings)?, &[], ceilMode)?;
    if want != o.dims {
        bail!(InvalidParam, "{api}: out is {:?} but pooling self {:?} gives {want:?}", o.dims, x.dims);
    }
    let div = (divisorOverride != 0).then_some(divisorOverride);
    let mut p = Plan::new();
    let (a, y) = (p.input(&x, "self"), p.output(&o, "out"));
    Ok(p.with_run(move |res| { y.put32(res, &pg.avg(&a.f32(res), countIncludePad, div)); Ok(()) }))
}
aclnnAvgPool2dBackward, aclnnAvgPool2dBackwardGetWorkspaceSize(gradOutput: *const aclTensor, self_: *const aclTensor, kernelSize: *const aclIntArray, stride: *const aclIntArray, padding: *const aclIntArray, ceilMode: bool, countIncludePad: bool, divisorOverride: i64, _cubeMathType: i8, gradInput: *mut aclTensor) => {
    let (g, x, gi) = (tn(api, "gradOutput", gradOutput)?, tn(api, "self", self_)?, tn(api, "gradInput", gradInput)?);
    let (pg, want) = pool_geom(api, &x, &ints(api, "kernelSize", kernelSize)?, &ints(api, "stride", stride)?, &ints(api, "padding", padding)?, &[], ceilMode)?;
    if want != g.dims {
        bail!(InvalidParam, "{api}: gradOutput is {:?} but pooling self {:?} gives {want:?}", g.dims, x.dims);
    }
    shape_eq(api, ("gradInput", &gi), ("self", &x))?;
    let div = (divisorOverride != 0).then_some(divisorOverride);
    let mut p = Plan::new();
    let (a, y) = (p.input(&g, "gradOutput"), p.output(&gi, "gradInput"));
    Ok(p.with_run(move |res| { y.put32(res, &pg.avg_backward(&a.f32(res), countIncludePad, div)); Ok(()) }))
}
aclnnMaxPool2dWithIndices, aclnnMaxPool2dWithIndicesGetWorkspaceSize(self_: *const aclTensor, kernelSize: *const aclIntArray, stride: *const aclIntArray, padding: *const aclIntArray, dilation: *const aclIntArray, ceilMode: bool, out: *mut aclTensor, indices: *mut aclTensor) => {
    let (x, o, ix) = (tn(api, "self", self_)?, tn(api, "out", out)?, tn(api, "indices", indices)?);
    index_dtype(api, "indices", &ix)?;
    let (pg, want) = pool_geom(api, &x, &ints(api, "kernelSize", kernelSize)?, &ints(api, "stride", stride)?, &ints(api, "padding", padding)?, &ints(api, "dilation", dilation)?, ceilMode)?;
    if want != o.dims || want != ix.dims {
        bail!(InvalidParam, "{api}: out {:?} / indices {:?} but pooling self {:?} gives {want:?}", o.dims, ix.dims, x.dims);
    }
    let mut p = Plan::new();
    let (a, y, iy) = (p.input(&x, "self"), p.output(&o, "out"), p.output(&ix, "indices"));
    Ok(p.with_run(move |res| {
        let (v, i) = pg.max(&a.f32(res));
        y.put32(res, &v);
        iy.puti(res, &i);
        Ok(())
    }))
}
aclnnMaxPool2dWithIndicesBackward, aclnnMaxPool2dWithIndicesBackwardGetWorkspaceSize(gradOutput: *const aclTensor, self_: *const aclTensor, indices: *const aclTensor, kernelSize: *const aclIntArray, stride: *const aclIntArray, padding: *const aclIntArray, dilation: *const aclIntArray, ceilMode: bool, gradInput: *mut aclTensor) => {
    let (g, x, ix, gi) = (tn(api, "gradOutput", gradOutput)?, tn(api, "self", self_)?, tn(api, "indices", indices)?, tn(api, "gradInput", gradInput)?);
    index_dtype(api, "indices", &ix)?;
    let (pg, want) = pool_geom(api, &x, &ints(api, "kernelSize", kernelSize)?, &ints(api, "stride", stride)?, &ints(api, "padding", padding)?, &ints(api, "dilation", dilation)?, ceilMode)?;
    if want != g.dims || want != ix.dims {
        bail!(InvalidParam, "{api}: gradOutput {:?} / indices {:?} but pooling self {:?} gives {want:?}", g.dims, ix.dims, x.dims);
    }
    shape_eq(api, ("gradInput", &gi), ("self", &x))?;
    let mut p = Plan::new();
    let (a, ia, y) = (p.input(&g, "gradOutput"), p.input(&ix, "indices"), p.output(&gi, "gradInput"));
    Ok(p.with_run(move |res| { y.put32(res, &pg.max_backward(&a.f32(res), &ia.i64(res))); Ok(()) }))
}
aclnnIndexSelect, aclnnIndexSelectGetWorkspaceSize(self_: *const aclTensor, dim: i64, index: *const aclTensor, out: *mut aclTensor) => {
    let (x, ix, o) = (tn(api, "self", self_)?, tn(api, "index", index)?, tn(api, "out", out)?);
    index_dtype(api, "index", &ix)?;
    if ix.dims.len() > 1 {
        bail!(InvalidParam, "{api}: index {:?} must be 0-d or 1-d", ix.dims);
    }
    let d = axis(api, dim, x.dims.len())?;
    let mut want = x.dims.clone();
    if want.is_empty() { want.push(1); }
    want[d] = ix.numel() as i64;
    if want != o.dims && !(x.dims.is_empty() && o.numel() == 1) {
        bail!(InvalidParam, "{api}: out is {:?} but selecting {} entries of self {:?} along {dim} gives {want:?}", o.dims, ix.numel(), x.dims);
    }
    let sh = if x.dims.is_empty() { vec![1] } else { x.dims.clone() };
    let mut p = Plan::new();
    let (a, ia, y) = (p.input(&x, "self"), p.input(&ix, "index"), p.output(&o, "out"));
    Ok(p.with_run(move |res| {
        let (v, idx) = (a.f64(res), ia.i64(res));
        let (outer, len, inner) = r::around(&sh, d);
        let mut out = Vec::with_capacity(outer * idx.len() * inner);
        for o_ in 0..outer {
            for (j, &k) in idx.iter().enumerate() {
                if k < 0 || k as usize >= len {
                    bail!(InvalidParam, "aclnnIndexSelect: index[{j}] = {k} is outside [0, {len}) of self {sh:?} along dim {d}");
                }
                out.extend_from_slice(&v[(o_ * len + k as usize) * inner..(o_ * len + k as usize + 1) * inner]);
            }
        }
        y.put64(res, &out);
        Ok(())
    }))
}
aclnnIndexAdd, aclnnIndexAddGetWorkspaceSize(self_: *const aclTensor, dim: i64, index: *const aclTensor, source: *const aclTensor, alpha: *const aclScalar, out: *mut aclTensor) => {
    let (x, ix, s, o) = (tn(api, "self", self_)?, tn(api, "index", index)?, tn(api, "source", source)?, tn(api, "out", out)?);
    let al = scalar(api, "alpha", alpha)?;
    index_dtype(api, "index", &ix)?;
    shape_eq(api, ("self", &x), ("out", &o))?;
    if ix.dims.len() > 1 {
        bail!(InvalidParam, "{api}: index {:?} must be 0-d or 1-d", ix.dims);
    }
    let d = axis(api, dim, x.dims.len())?;
    let sh = if x.dims.is_empty() { vec![1] } else { x.dims.clone() };
    let mut want = sh.clone();
    want[d] = ix.numel() as i64;
    if numel(&want) != s.numel() || (s.dims.len() == want.len() && s.dims != want) {
        bail!(InvalidParam, "{api}: source is {:?} but self {:?} with {} indices along {dim} needs {want:?}", s.dims, x.dims, ix.numel());
    }
    let mut p = Plan::new();
    let (a, ia, sa, y) = (p.input(&x, "self"), p.input(&ix, "index"), p.input(&s, "source"), p.output(&o, "out"));
    Ok(p.with_run(move |res| {
        let (mut v, idx, src) = (a.f64(res), ia.i64(res), sa.f64(res));
        let (outer, len, inner) = r::around(&sh, d);
        for o_ in 0..outer {
            for (j, &k) in idx.iter().enumerate() {
                if k < 0 || k as usize >= len {
                    bail!(InvalidParam, "aclnnIndexAdd: index[{j}] = {k} is outside [0, {len}) along dim {d}");
                }
                for q in 0..inner {
                    let t = (o_ * len + k as usize) * inner + q;
                    let f = (v[t] as f32 + (al * src[(o_ * idx.len() + j) * inner + q]) as f32) as f64;
                    v[t] = f;
                }
            }
        }
        y.put64(res, &v);
        Ok(())
    }))
}
}
