//! Shared kernel plumbing: operand access, error construction, deterministic parallel loops.

use crate::real::{Elem, Real};
use rayon::prelude::*;
use shardc_ir::{Const, Node};
use shardc_runtime::{Arg, KernelError, Tensor};
use std::any::Any;
use std::cell::RefCell;

/// Result of a kernel.
pub(crate) type KResult<T = ()> = Result<T, KernelError>;

/// Work (in elements or multiply-adds) below which a kernel stays on the calling thread.
pub(crate) const PAR_MIN: usize = 32 * 1024;

/// How a kernel may use threads.
///
/// Every parallel loop splits its work into chunks whose boundaries depend only on the shapes,
/// never on `threads`, and no float sum is split across chunks: results are bit-identical for
/// every thread count.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Par {
    /// Threads available (1: everything runs serially on the calling thread).
    pub threads: usize,
}

impl Par {
    /// Whether loops of `work` units should run on rayon.
    #[inline]
    pub fn parallel(&self, work: usize) -> bool {
        self.threads > 1 && work >= PAR_MIN
    }

    /// The gemm crate's parallelism setting when a product may use every thread.
    pub fn gemm(&self) -> gemm::Parallelism {
        if self.threads > 1 {
            gemm::Parallelism::Rayon(self.threads)
        } else {
            gemm::Parallelism::None
        }
    }
}

/// Everything a kernel knows about its invocation.
pub(crate) struct Ctx<'a> {
    /// The node being run.
    pub node: &'a Node,
    /// Threading.
    pub par: Par,
    /// The training step (Dropout seeds).
    pub step: u64,
}

impl<'a> Ctx<'a> {
    /// A kernel error for this node.
    pub fn err(&self, reason: impl Into<String>) -> KernelError {
        KernelError::new(self.node, reason)
    }

    /// Operand `i`, which must exist.
    pub fn arg<'t>(&self, inputs: &[Arg<'t>], i: usize) -> KResult<Arg<'t>> {
        inputs.get(i).copied().ok_or_else(|| {
            self.err(format!(
                "expected at least {} operands, got {}",
                i + 1,
                inputs.len()
            ))
        })
    }

    /// Operand `i` as a tensor.
    pub fn tensor<'t>(&self, inputs: &[Arg<'t>], i: usize) -> KResult<&'t Tensor> {
        match self.arg(inputs, i)? {
            Arg::Tensor(t) => Ok(t),
            Arg::Const(c) => Err(self.err(format!(
                "operand {i} must be a tensor, got the constant {c:?}"
            ))),
        }
    }

    /// Operand `i` as a tensor of element type `T`: its shape and elements.
    pub fn data<'t, T: Elem>(
        &self,
        inputs: &[Arg<'t>],
        i: usize,
    ) -> KResult<(&'t [usize], &'t [T])> {
        let t = self.tensor(inputs, i)?;
        self.view(t, i)
    }

    /// A tensor's elements as `T` (operand `i`, for the message).
    pub fn view<'t, T: Elem>(&self, t: &'t Tensor, i: usize) -> KResult<(&'t [usize], &'t [T])> {
        let data = T::slice(&t.data).ok_or_else(|| {
            self.err(format!(
                "operand {i} has element type {}, expected {}",
                t.dtype(),
                T::ELEM_DTYPE
            ))
        })?;
        if data.len() != shardc_ir::num_elements(&t.shape) {
            return Err(self.err(format!(
                "operand {i}: {} elements do not fill shape {:?}",
                data.len(),
                t.shape
            )));
        }
        Ok((&t.shape, data))
    }

    /// Operand `i` as a number: a `Float`/`Int`/`Bool` constant or a one-element tensor.
    pub fn scalar(&self, inputs: &[Arg<'_>], i: usize) -> KResult<f64> {
        match self.arg(inputs, i)? {
            Arg::Const(c) => c
                .as_f64()
                .ok_or_else(|| self.err(format!("operand {i} must be a number, got {c:?}"))),
            Arg::Tensor(t) => t.scalar_value().ok_or_else(|| {
                self.err(format!(
                    "operand {i} must be a scalar, got a tensor of shape {:?}",
                    t.shape
                ))
            }),
        }
    }

    /// Operand `i` as a list of integers: an `Ints`/`Int` constant or an integer tensor.
    pub fn ints(&self, inputs: &[Arg<'_>], i: usize) -> KResult<Vec<i64>> {
        match self.arg(inputs, i)? {
            Arg::Const(c) => c.as_ints().ok_or_else(|| {
                self.err(format!(
                    "operand {i} must be a tuple of integers, got {c:?}"
                ))
            }),
            Arg::Tensor(t) if t.dtype().is_int() && t.shape.len() <= 1 => {
                Ok(t.to_f64_vec().into_iter().map(|v| v as i64).collect())
            }
            Arg::Tensor(t) => Err(self.err(format!(
                "operand {i} must be a tuple of integers, got a {} tensor of shape {:?}",
                t.dtype(),
                t.shape
            ))),
        }
    }

    /// Operand `i` as one integer.
    pub fn int(&self, inputs: &[Arg<'_>], i: usize) -> KResult<i64> {
        match self.arg(inputs, i)? {
            Arg::Const(Const::Int(v)) => Ok(*v),
            Arg::Const(Const::Ints(v)) if v.len() == 1 => Ok(v[0]),
            Arg::Tensor(t) if t.dtype().is_int() && t.len() == 1 => Ok(t.data.get_f64(0) as i64),
            other => Err(self.err(format!("operand {i} must be an integer, got {other:?}"))),
        }
    }

    /// Output `i`'s elements as `T`.
    pub fn out<'o, T: Elem>(&self, outputs: &'o mut [Tensor], i: usize) -> KResult<&'o mut [T]> {
        let n = outputs.len();
        let t = outputs
            .get_mut(i)
            .ok_or_else(|| self.err(format!("expected at least {} outputs, got {n}", i + 1)))?;
        out_slice(self, t, i)
    }

    /// All outputs as `T`, with their shapes; there must be exactly `n`.
    pub fn outs<'o, T: Elem>(
        &self,
        outputs: &'o mut [Tensor],
        n: usize,
    ) -> KResult<Vec<(&'o [usize], &'o mut [T])>> {
        if outputs.len() != n {
            return Err(self.err(format!("expected {n} outputs, got {}", outputs.len())));
        }
        outputs
            .iter_mut()
            .enumerate()
            .map(|(i, t)| {
                let dtype = t.dtype();
                let Tensor { shape, data } = t;
                let len = data.len();
                let d = T::slice_mut(data).ok_or_else(|| {
                    self.err(format!(
                        "output {i} has element type {dtype}, expected {}",
                        T::ELEM_DTYPE
                    ))
                })?;
                if len != shardc_ir::num_elements(shape) {
                    return Err(self.err(format!(
                        "output {i}: buffer of {len} elements for shape {shape:?}"
                    )));
                }
                Ok((shape.as_slice(), d))
            })
            .collect()
    }

    /// The shape of output `i`.
    pub fn out_shape(&self, outputs: &[Tensor], i: usize) -> KResult<Vec<usize>> {
        outputs.get(i).map(|t| t.shape.clone()).ok_or_else(|| {
            self.err(format!(
                "expected at least {} outputs, got {}",
                i + 1,
                outputs.len()
            ))
        })
    }

    /// Normalises a possibly negative axis against `rank`.
    pub fn axis(&self, axis: i64, rank: usize) -> KResult<usize> {
        let r = rank as i64;
        let a = if axis < 0 { axis + r } else { axis };
        if a < 0 || a >= r {
            return Err(self.err(format!("axis {axis} is out of range for rank {rank}")));
        }
        Ok(a as usize)
    }

    /// Checks that `shape` equals `expected` (`what` names the value).
    pub fn check_shape(&self, what: &str, shape: &[usize], expected: &[usize]) -> KResult {
        if shape != expected {
            return Err(self.err(format!("{what} has shape {shape:?}, expected {expected:?}")));
        }
        Ok(())
    }

    /// Checks that `ok` holds, or fails with `reason`.
    pub fn ensure(&self, ok: bool, reason: impl FnOnce() -> String) -> KResult {
        if ok {
            Ok(())
        } else {
            Err(self.err(reason()))
        }
    }
}

fn out_slice<'o, T: Elem>(ctx: &Ctx<'_>, t: &'o mut Tensor, i: usize) -> KResult<&'o mut [T]> {
    let dtype = t.dtype();
    let expected = shardc_ir::num_elements(&t.shape);
    let shape = t.shape.clone();
    let d = T::slice_mut(&mut t.data).ok_or_else(|| {
        ctx.err(format!(
            "output {i} has element type {dtype}, expected {}",
            T::ELEM_DTYPE
        ))
    })?;
    if d.len() != expected {
        return Err(ctx.err(format!(
            "output {i}: buffer of {} elements for shape {shape:?}",
            d.len()
        )));
    }
    Ok(d)
}

/// Runs `f(chunk_index, chunk)` over `out.chunks_mut(chunk)`, on rayon when `work` is large
/// enough. Chunk boundaries depend only on `chunk`, so results never depend on threads.
pub(crate) fn for_chunks<T, F>(par: Par, out: &mut [T], chunk: usize, work: usize, f: F)
where
    T: Send,
    F: Fn(usize, &mut [T]) + Sync + Send,
{
    if chunk == 0 || out.is_empty() {
        return;
    }
    if par.parallel(work) && out.len() > chunk {
        out.par_chunks_mut(chunk)
            .enumerate()
            .for_each(|(i, c)| f(i, c));
    } else {
        out.chunks_mut(chunk).enumerate().for_each(|(i, c)| f(i, c));
    }
}

/// Like [`for_chunks`] over two outputs chunked in lock step (`a` by `ca`, `b` by `cb`).
pub(crate) fn for_chunks2<A, B, F>(
    par: Par,
    a: &mut [A],
    ca: usize,
    b: &mut [B],
    cb: usize,
    work: usize,
    f: F,
) where
    A: Send,
    B: Send,
    F: Fn(usize, &mut [A], &mut [B]) + Sync + Send,
{
    if ca == 0 || cb == 0 || a.is_empty() {
        return;
    }
    if par.parallel(work) && a.len() > ca {
        a.par_chunks_mut(ca)
            .zip(b.par_chunks_mut(cb))
            .enumerate()
            .for_each(|(i, (x, y))| f(i, x, y));
    } else {
        a.chunks_mut(ca)
            .zip(b.chunks_mut(cb))
            .enumerate()
            .for_each(|(i, (x, y))| f(i, x, y));
    }
}

/// A chunk length (a multiple of `unit`) giving chunks of roughly `target` elements.
pub(crate) fn chunk_of(unit: usize, target: usize) -> usize {
    let unit = unit.max(1);
    unit * (target / unit).max(1)
}

/// Elements per parallel chunk of elementwise loops.
pub(crate) const ELEMWISE_CHUNK: usize = 16 * 1024;

/// Row-major strides of `shape`.
pub(crate) fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// Dispatches on any dtype, binding the type alias `$T` to the element type.
macro_rules! with_any {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            shardc_ir::DType::Float32 => {
                type $T = f32;
                $body
            }
            shardc_ir::DType::Float64 => {
                type $T = f64;
                $body
            }
            shardc_ir::DType::Float16 => {
                type $T = half::f16;
                $body
            }
            shardc_ir::DType::BFloat16 => {
                type $T = half::bf16;
                $body
            }
            shardc_ir::DType::Int32 => {
                type $T = i32;
                $body
            }
            shardc_ir::DType::Int64 => {
                type $T = i64;
                $body
            }
            shardc_ir::DType::Bool => {
                type $T = bool;
                $body
            }
        }
    };
}
pub(crate) use with_any;

/// Reads integer indices (Int32 or Int64 tensor, operand `i`) as i64.
pub(crate) fn index_tensor<'t>(
    ctx: &Ctx<'_>,
    inputs: &[Arg<'t>],
    i: usize,
) -> KResult<(&'t [usize], IndexData<'t>)> {
    let t = ctx.tensor(inputs, i)?;
    match &t.data {
        shardc_runtime::Data::I32(v) => Ok((&t.shape, IndexData::I32(v))),
        shardc_runtime::Data::I64(v) => Ok((&t.shape, IndexData::I64(v))),
        _ => Err(ctx.err(format!(
            "operand {i} must hold Int32 or Int64 indices, got {}",
            t.dtype()
        ))),
    }
}

/// Integer indices of either width.
#[derive(Clone, Copy)]
pub(crate) enum IndexData<'t> {
    /// Int32 indices.
    I32(&'t [i32]),
    /// Int64 indices.
    I64(&'t [i64]),
}

impl IndexData<'_> {
    /// Number of indices.
    pub fn len(&self) -> usize {
        match self {
            IndexData::I32(v) => v.len(),
            IndexData::I64(v) => v.len(),
        }
    }

    /// Index `i` as i64.
    #[inline(always)]
    pub fn get(&self, i: usize) -> i64 {
        match self {
            IndexData::I32(v) => v[i] as i64,
            IndexData::I64(v) => v[i],
        }
    }
}

/// `(0..n).map(f).collect()`, on rayon when `work` is large enough (order kept).
pub(crate) fn par_map<R, F>(par: Par, n: usize, work: usize, f: F) -> Vec<R>
where
    R: Send,
    F: Fn(usize) -> R + Sync + Send,
{
    if par.parallel(work) && n > 1 {
        (0..n).into_par_iter().map(f).collect()
    } else {
        (0..n).map(f).collect()
    }
}

/// Like [`for_chunks`] over three equally long outputs, all chunked by `chunk`.
pub(crate) fn for_chunks3<A, B, C, F>(
    par: Par,
    (a, b, c): (&mut [A], &mut [B], &mut [C]),
    chunk: usize,
    f: F,
) where
    A: Send,
    B: Send,
    C: Send,
    F: Fn(usize, &mut [A], &mut [B], &mut [C]) + Sync + Send,
{
    if chunk == 0 || a.is_empty() {
        return;
    }
    if par.parallel(a.len()) && a.len() > chunk {
        a.par_chunks_mut(chunk)
            .zip(b.par_chunks_mut(chunk))
            .zip(c.par_chunks_mut(chunk))
            .enumerate()
            .for_each(|(i, ((x, y), z))| f(i, x, y, z));
    } else {
        a.chunks_mut(chunk)
            .zip(b.chunks_mut(chunk))
            .zip(c.chunks_mut(chunk))
            .enumerate()
            .for_each(|(i, ((x, y), z))| f(i, x, y, z));
    }
}

/// Most scratch vectors a thread keeps between calls (the Winograd kernels hold three at
/// once, im2col two, and sizes differ from layer to layer).
const SCRATCH_KEPT: usize = 8;

thread_local! {
    /// Scratch vectors (`Vec<f32>` / `Vec<f64>`) kept by this thread between kernel calls, so
    /// that large im2col buffers are not allocated (and zeroed) on every call.
    static SCRATCH_POOL: RefCell<Vec<Box<dyn Any>>> = const { RefCell::new(Vec::new()) };
}

/// The length of a pooled vector of type `Vec<T>`, or `None` for another type.
fn pooled_len<T: Real>(b: &dyn Any) -> Option<usize> {
    b.downcast_ref::<Vec<T>>().map(Vec::len)
}

/// A vector of at least `len` elements of unspecified contents, from this thread's pool when
/// it has one: the smallest that is long enough, else the longest (grown).
pub(crate) fn take_vec<T: Real>(len: usize) -> Vec<T> {
    let cached = SCRATCH_POOL.with(|pool| {
        let mut pool = pool.borrow_mut();
        let lens = pool
            .iter()
            .enumerate()
            .filter_map(|(i, b)| Some((i, pooled_len::<T>(b.as_ref())?)));
        let fit = lens
            .clone()
            .filter(|&(_, l)| l >= len)
            .min_by_key(|&(_, l)| l)
            .or_else(|| lens.max_by_key(|&(_, l)| l))?;
        Some(pool.swap_remove(fit.0))
    });
    let mut v = cached
        .and_then(|b| b.downcast::<Vec<T>>().ok())
        .map(|b| *b)
        .unwrap_or_default();
    if v.len() < len {
        // The old contents are not needed: drop them rather than copy them while growing.
        v = Vec::new();
        v.resize(len, T::ZERO);
    }
    v
}

/// Returns a vector to this thread's pool; a full pool keeps its longest vectors.
pub(crate) fn give_vec<T: Real>(v: Vec<T>) {
    if v.is_empty() {
        return;
    }
    SCRATCH_POOL.with(|pool| {
        let mut pool = pool.borrow_mut();
        if pool.len() < SCRATCH_KEPT {
            pool.push(Box::new(v));
            return;
        }
        let size = |b: &Box<dyn Any>| {
            pooled_len::<f32>(b.as_ref())
                .map(|l| l * 4)
                .or_else(|| pooled_len::<f64>(b.as_ref()).map(|l| l * 8))
                .unwrap_or(0)
        };
        let new_size = v.len() * std::mem::size_of::<T>();
        if let Some((i, _)) = pool
            .iter()
            .enumerate()
            .map(|(i, b)| (i, size(b)))
            .filter(|&(_, s)| s < new_size)
            .min_by_key(|&(_, s)| s)
        {
            pool[i] = Box::new(v);
        }
    });
}
