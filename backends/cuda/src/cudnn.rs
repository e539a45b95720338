//! Convolutions through cuDNN, where `libcudnn.so` is found (opened at run time like every
//! CUDA library, probed first: a machine without it keeps the im2col + cuBLAS lowering of
//! `ops::conv`, which is also what runs where cuDNN cannot take a geometry).
//!
//! What cuDNN is asked for keeps shardc's numbers:
//!
//! - **Geometry**: cuDNN pads both sides of a dimension alike. A `same` or `pad` convolution
//!   whose padding differs between the sides still runs here when the symmetric padding of
//!   the leading side gives the same windows (the same output size); otherwise it falls back.
//! - **Precision**: Float32 convolutions use FMA math only (`CUDNN_FMA_MATH`: no TF32 tensor
//!   cores) unless TF32 is turned on for the device, as for cuBLAS.
//! - **Algorithms**: only GEMM-like and direct algorithms (no FFT or Winograd, whose rounding
//!   differs from a dot product's by more than 1e-5) that cuDNN reports deterministic (the
//!   same inputs give the same bits, run after run; `SHARDC_CUDNN_DETERMINISTIC=0` or
//!   `CudaDevice::set_deterministic_convolutions(false)` admits those with atomics too, as
//!   PyTorch does by default), with at most [`WORKSPACE_LIMIT`] bytes of
//!   workspace: the first in the order of cuDNN's heuristics, or with
//!   `SHARDC_CUDNN_ALGOS=measure` the fastest of them as cuDNN measures them on the device
//!   when a shape is first seen (`cudnnFindConvolution*Algorithm`, PyTorch's
//!   `cudnn.benchmark`). On an H200, ResNet-18's convolutions took the same time either way
//!   (about 7.7 ms a step at batch 32); on an H100 measuring was slower (a step of 10.1 ms
//!   against 9.5 ms with deterministic algorithms, 7.7 against 6.7 ms with any, one short
//!   run each), so measuring is not the default: its first step is slower too.
//!
//! A shape cuDNN cannot plan falls back too (said once on stderr). `SHARDC_CUDNN=0` turns
//! cuDNN off (every convolution then takes the im2col path).

use crate::device::{ConvDirection, LibraryConv};
use crate::error::{CudaError, CudaResult};
use crate::kernels::DevPtr;
use cudarc::cudnn::result as dnn;
use cudarc::cudnn::sys;
use cudarc::driver::result as drv;
use shardc_ir::geometry::Conv2dGeometry;
use shardc_ir::DType;
use std::collections::HashMap;
use std::ffi::c_void;

/// The environment variable that turns cuDNN off: `SHARDC_CUDNN=0`.
pub const CUDNN_ENV: &str = "SHARDC_CUDNN";

/// The environment variable that chooses how algorithms are picked: `heuristic` (the
/// default) or `measure`.
pub const ALGOS_ENV: &str = "SHARDC_CUDNN_ALGOS";

/// How a plan's algorithm is picked among the accepted ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AlgoSearch {
    /// The first in the order of cuDNN's heuristics (`cudnnGetConvolution*Algorithm_v7`).
    Heuristic,
    /// The fastest as cuDNN measures them on the device (`cudnnFindConvolution*Algorithm`).
    Measure,
}

impl AlgoSearch {
    /// The search a value of `SHARDC_CUDNN_ALGOS` (None: unset) asks for, or an error naming
    /// the value.
    pub fn from_value(value: Option<&str>) -> CudaResult<AlgoSearch> {
        match value.map(str::trim) {
            None | Some("" | "heuristic") => Ok(AlgoSearch::Heuristic),
            Some("measure") => Ok(AlgoSearch::Measure),
            Some(other) => Err(CudaError::Other(format!(
                "{ALGOS_ENV}={other}: expected `measure` or `heuristic`"
            ))),
        }
    }

    /// The search `SHARDC_CUDNN_ALGOS` asks for.
    pub fn from_env() -> CudaResult<AlgoSearch> {
        Self::from_value(std::env::var(ALGOS_ENV).ok().as_deref())
    }
}

/// The most workspace memory one convolution's algorithm may ask for (256 MiB).
pub const WORKSPACE_LIMIT: usize = 256 << 20;

/// Whether `SHARDC_CUDNN` leaves cuDNN on (unset, or anything but `0`, `off`, `false`).
pub fn enabled_by_env() -> bool {
    enabled(std::env::var(CUDNN_ENV).ok().as_deref())
}

/// Whether a value of `SHARDC_CUDNN` (None: unset) leaves cuDNN on.
pub fn enabled(value: Option<&str>) -> bool {
    !matches!(value.map(str::trim), Some("0" | "off" | "false"))
}

fn err(call: &'static str) -> impl Fn(dnn::CudnnError) -> CudaError {
    move |e| CudaError::Cudnn {
        call,
        reason: format!("{:?}", e.0),
    }
}

/// Why cuDNN cannot compute `g` as shardc defines it, or None when it can.
pub fn unsupported(g: &Conv2dGeometry) -> Option<String> {
    // cuDNN's output size with the leading side's padding on both sides.
    let out = |size: usize, pad: usize, k: usize, dil: usize, stride: usize| {
        let span = dil * (k - 1) + 1;
        (size + 2 * pad)
            .checked_sub(span)
            .map(|free| free / stride + 1)
    };
    if g.kh == 0 || g.kw == 0 || g.stride_h == 0 || g.stride_w == 0 {
        return Some("a zero kernel size or stride".into());
    }
    if out(g.h, g.pad_top, g.kh, g.dil_h, g.stride_h) != Some(g.out_h)
        || out(g.w, g.pad_left, g.kw, g.dil_w, g.stride_w) != Some(g.out_w)
    {
        return Some(format!(
            "padding top/bottom {}/{}, left/right {}/{}: cuDNN pads both sides alike",
            g.pad_top, g.pad_bottom, g.pad_left, g.pad_right
        ));
    }
    let sizes = [
        g.n, g.c_in, g.h, g.w, g.c_out, g.kh, g.kw, g.out_h, g.out_w, g.pad_top, g.pad_left,
    ];
    let elems = [g.n * g.c_in * g.h * g.w, g.n * g.c_out * g.out_h * g.out_w];
    if sizes.iter().chain(&elems).any(|&v| v > i32::MAX as usize) {
        return Some("a size beyond cuDNN's 32-bit dimensions".into());
    }
    None
}

/// One algorithm as cuDNN reports it (measured or by its heuristics), in cuDNN's order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// One of the algorithms this module accepts (GEMM-like or direct), with a math type it
    /// accepts (FMA only for Float32 with TF32 off).
    pub accepted: bool,
    /// cuDNN reports it can run this geometry.
    pub ok: bool,
    /// cuDNN reports it deterministic.
    pub deterministic: bool,
    /// Workspace bytes it needs.
    pub memory: usize,
}

/// The first candidate that is accepted, runs, is deterministic (where `deterministic_only`)
/// and needs at most `limit` bytes of workspace.
pub fn choose(candidates: &[Candidate], limit: usize, deterministic_only: bool) -> Option<usize> {
    candidates.iter().position(|c| {
        c.accepted && c.ok && (c.deterministic || !deterministic_only) && c.memory <= limit
    })
}

/// The environment variable that lets convolutions take cuDNN's non-deterministic algorithms
/// (`SHARDC_CUDNN_DETERMINISTIC=0`: atomics, faster, not the same bits twice; PyTorch's
/// default, `torch.backends.cudnn.deterministic = False`). Unset, only deterministic ones run.
pub const DETERMINISTIC_ENV: &str = "SHARDC_CUDNN_DETERMINISTIC";

/// Whether a value of `SHARDC_CUDNN_DETERMINISTIC` (None: unset) keeps convolutions to
/// deterministic algorithms.
pub fn deterministic(value: Option<&str>) -> bool {
    enabled(value)
}

/// Whether `SHARDC_CUDNN_DETERMINISTIC` keeps convolutions to deterministic algorithms.
pub fn deterministic_by_env() -> bool {
    deterministic(std::env::var(DETERMINISTIC_ENV).ok().as_deref())
}

/// The algorithm of one plan.
#[derive(Clone, Copy, Debug)]
enum Algo {
    Forward(sys::cudnnConvolutionFwdAlgo_t),
    Data(sys::cudnnConvolutionBwdDataAlgo_t),
    Filter(sys::cudnnConvolutionBwdFilterAlgo_t),
}

fn accepted_forward(a: sys::cudnnConvolutionFwdAlgo_t) -> bool {
    use sys::cudnnConvolutionFwdAlgo_t::*;
    matches!(
        a,
        CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM
            | CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM
            | CUDNN_CONVOLUTION_FWD_ALGO_GEMM
            | CUDNN_CONVOLUTION_FWD_ALGO_DIRECT
    )
}

fn accepted_data(a: sys::cudnnConvolutionBwdDataAlgo_t) -> bool {
    use sys::cudnnConvolutionBwdDataAlgo_t::*;
    matches!(
        a,
        CUDNN_CONVOLUTION_BWD_DATA_ALGO_0 | CUDNN_CONVOLUTION_BWD_DATA_ALGO_1
    )
}

fn accepted_filter(a: sys::cudnnConvolutionBwdFilterAlgo_t) -> bool {
    use sys::cudnnConvolutionBwdFilterAlgo_t::*;
    matches!(
        a,
        CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0
            | CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1
            | CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3
    )
}

/// The descriptors and algorithm of one convolution shape, kept for the process's life.
struct Plan {
    x: sys::cudnnTensorDescriptor_t,
    w: sys::cudnnFilterDescriptor_t,
    conv: sys::cudnnConvolutionDescriptor_t,
    y: sys::cudnnTensorDescriptor_t,
    algo: Algo,
    workspace: usize,
}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: descriptors created in `Dnn::plan`, destroyed once here.
        unsafe {
            let _ = dnn::destroy_tensor_descriptor(self.x);
            let _ = dnn::destroy_filter_descriptor(self.w);
            let _ = dnn::destroy_convolution_descriptor(self.conv);
            let _ = dnn::destroy_tensor_descriptor(self.y);
        }
    }
}

/// What a plan is made for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Key {
    direction: ConvDirection,
    dtype: DType,
    geometry: Conv2dGeometry,
    tf32: bool,
    deterministic: bool,
}

/// A cuDNN handle on the device's compute stream, its plans and its workspace. Used only
/// with the device's context current and its lock held (see `cuda::Handles`).
pub(crate) struct Dnn {
    handle: sys::cudnnHandle_t,
    /// Per shape: its plan, or None where no accepted algorithm runs it (the caller falls
    /// back, and the shape is not asked again).
    plans: HashMap<Key, Option<Plan>>,
    workspace: DevPtr,
    workspace_bytes: usize,
    search: AlgoSearch,
}

impl Dnn {
    /// A handle on `stream` (the library must have been probed).
    pub(crate) fn new(stream: sys::cudaStream_t) -> CudaResult<Dnn> {
        let search = AlgoSearch::from_env()?;
        let handle = dnn::create_handle().map_err(err("cudnnCreate"))?;
        // SAFETY: a live handle and stream.
        unsafe { dnn::set_stream(handle, stream) }.map_err(err("cudnnSetStream"))?;
        Ok(Dnn {
            handle,
            plans: HashMap::new(),
            workspace: 0,
            workspace_bytes: 0,
            search,
        })
    }

    /// cuDNN's version (`90100` for 9.1.0).
    pub(crate) fn version() -> usize {
        dnn::get_version()
    }

    /// Runs `c`, or returns Ok(false) when cuDNN cannot (see the module doc); only
    /// deterministic algorithms where `deterministic`. `sync` waits for the stream before a
    /// smaller workspace is freed.
    pub(crate) fn run(
        &mut self,
        c: &LibraryConv,
        (tf32, deterministic): (bool, bool),
        sync: &dyn Fn() -> CudaResult<()>,
    ) -> CudaResult<bool> {
        if !matches!(c.dtype, DType::Float32 | DType::Float64) || unsupported(&c.geometry).is_some()
        {
            return Ok(false);
        }
        let key = Key {
            direction: c.direction,
            dtype: c.dtype,
            geometry: c.geometry,
            tf32,
            deterministic,
        };
        if !self.plans.contains_key(&key) {
            // A shape cuDNN refuses to plan (a descriptor or algorithm call fails) falls back
            // to the kernels, said once; a convolution that fails to run is an error.
            let plan = self.plan(&key).unwrap_or_else(|e| {
                eprintln!(
                    "shardc: cuDNN cannot plan the {:?} convolution of {:?} ({e}); it runs as \
                     im2col + cuBLAS",
                    key.direction, key.geometry
                );
                None
            });
            self.plans.insert(key, plan);
        }
        let Some(plan) = self.plans.get(&key).and_then(Option::as_ref) else {
            return Ok(false);
        };
        let need = plan.workspace;
        if need > self.workspace_bytes {
            sync()?;
            if self.workspace != 0 {
                // SAFETY: the stream is idle; the workspace is ours.
                let _ = unsafe { drv::free_sync(self.workspace) };
                self.workspace = 0;
                self.workspace_bytes = 0;
            }
            // SAFETY: a current context (the caller's).
            self.workspace =
                unsafe { drv::malloc_sync(need) }.map_err(|e| CudaError::OutOfMemory {
                    requested: need,
                    context: format!("cuDNN workspace ({e:?})"),
                })?;
            self.workspace_bytes = need;
        }
        let plan = self
            .plans
            .get(&key)
            .and_then(Option::as_ref)
            .ok_or_else(|| CudaError::Other("a cuDNN plan vanished".into()))?;
        let (one_f, zero_f) = (1f32, 0f32);
        let (one_d, zero_d) = (1f64, 0f64);
        let (alpha, beta): (*const c_void, *const c_void) = if c.dtype == DType::Float64 {
            (&one_d as *const f64 as _, &zero_d as *const f64 as _)
        } else {
            (&one_f as *const f32 as _, &zero_f as *const f32 as _)
        };
        let ptr = |p: DevPtr| p as *mut c_void;
        let ws = ptr(self.workspace);
        // SAFETY: the descriptors describe the buffers the executor's plan gives `c` (their
        // shapes checked by the caller); the workspace holds `plan.workspace` bytes.
        unsafe {
            match plan.algo {
                Algo::Forward(a) => dnn::convolution_forward(
                    self.handle,
                    alpha,
                    plan.x,
                    ptr(c.x),
                    plan.w,
                    ptr(c.w),
                    plan.conv,
                    a,
                    ws,
                    plan.workspace,
                    beta,
                    plan.y,
                    ptr(c.y),
                )
                .map_err(err("cudnnConvolutionForward"))?,
                Algo::Data(a) => dnn::convolution_backward_data(
                    self.handle,
                    alpha,
                    plan.w,
                    ptr(c.w),
                    plan.y,
                    ptr(c.y),
                    plan.conv,
                    a,
                    ws,
                    plan.workspace,
                    beta,
                    plan.x,
                    ptr(c.x),
                )
                .map_err(err("cudnnConvolutionBackwardData"))?,
                Algo::Filter(a) => dnn::convolution_backward_filter(
                    self.handle,
                    alpha,
                    plan.x,
                    ptr(c.x),
                    plan.y,
                    ptr(c.y),
                    plan.conv,
                    a,
                    ws,
                    plan.workspace,
                    beta,
                    plan.w,
                    ptr(c.w),
                )
                .map_err(err("cudnnConvolutionBackwardFilter"))?,
            }
        }
        Ok(true)
    }

    /// The descriptors of `key` and its algorithm: the fastest accepted one as cuDNN measures
    /// them, or the first in its heuristics' order (see [`AlgoSearch`]); None when none fits.
    fn plan(&self, key: &Key) -> CudaResult<Option<Plan>> {
        let g = &key.geometry;
        let (data_type, math) = match key.dtype {
            DType::Float64 => (
                sys::cudnnDataType_t::CUDNN_DATA_DOUBLE,
                sys::cudnnMathType_t::CUDNN_DEFAULT_MATH,
            ),
            _ if key.tf32 => (
                sys::cudnnDataType_t::CUDNN_DATA_FLOAT,
                sys::cudnnMathType_t::CUDNN_DEFAULT_MATH,
            ),
            _ => (
                sys::cudnnDataType_t::CUDNN_DATA_FLOAT,
                sys::cudnnMathType_t::CUDNN_FMA_MATH,
            ),
        };
        let i = |v: usize| v as i32;
        let nchw = sys::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW;
        // Descriptors first, owned by a Plan at once so that an error below frees them.
        let mut plan = Plan {
            x: dnn::create_tensor_descriptor().map_err(err("cudnnCreateTensorDescriptor"))?,
            w: std::ptr::null_mut(),
            conv: std::ptr::null_mut(),
            y: std::ptr::null_mut(),
            algo: Algo::Forward(sys::cudnnConvolutionFwdAlgo_t::CUDNN_CONVOLUTION_FWD_ALGO_GEMM),
            workspace: 0,
        };
        plan.y = dnn::create_tensor_descriptor().map_err(err("cudnnCreateTensorDescriptor"))?;
        plan.w = dnn::create_filter_descriptor().map_err(err("cudnnCreateFilterDescriptor"))?;
        plan.conv = dnn::create_convolution_descriptor()
            .map_err(err("cudnnCreateConvolutionDescriptor"))?;
        // SAFETY: fresh descriptors; sizes checked to fit i32 by `unsupported`.
        unsafe {
            dnn::set_tensor4d_descriptor(
                plan.x,
                nchw,
                data_type,
                [i(g.n), i(g.c_in), i(g.h), i(g.w)],
            )
            .map_err(err("cudnnSetTensor4dDescriptor"))?;
            dnn::set_tensor4d_descriptor(
                plan.y,
                nchw,
                data_type,
                [i(g.n), i(g.c_out), i(g.out_h), i(g.out_w)],
            )
            .map_err(err("cudnnSetTensor4dDescriptor"))?;
            dnn::set_filter4d_descriptor(
                plan.w,
                data_type,
                nchw,
                [i(g.c_out), i(g.c_in / g.group.max(1)), i(g.kh), i(g.kw)],
            )
            .map_err(err("cudnnSetFilter4dDescriptor"))?;
            dnn::set_convolution2d_descriptor(
                plan.conv,
                i(g.pad_top),
                i(g.pad_left),
                i(g.stride_h),
                i(g.stride_w),
                i(g.dil_h),
                i(g.dil_w),
                sys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
                data_type,
            )
            .map_err(err("cudnnSetConvolution2dDescriptor"))?;
            dnn::set_convolution_group_count(plan.conv, i(g.group.max(1)))
                .map_err(err("cudnnSetConvolutionGroupCount"))?;
            dnn::set_convolution_math_type(plan.conv, math)
                .map_err(err("cudnnSetConvolutionMathType"))?;
        }
        // Strict Float32 takes only FMA kernels; Float64 and TF32 whatever cuDNN offers.
        let strict = key.dtype == DType::Float32 && !key.tf32;
        let math_ok =
            |m: sys::cudnnMathType_t| !strict || m == sys::cudnnMathType_t::CUDNN_FMA_MATH;
        let h = self.handle;
        let measure = self.search == AlgoSearch::Measure;
        // One direction's pick: its measuring and its heuristic call take the same arguments
        // (the handle, four descriptors in the direction's order, the result buffer).
        // SAFETY (the six calls): live descriptors and handle; cuDNN writes at most the
        // requested count of results. The measuring calls allocate their own buffers and run
        // on the handle's stream, which is not being recorded while a plan is made (the first
        // step runs node by node).
        macro_rules! search {
            ($find:ident, $get:ident, $a:expr, $b:expr, $c:expr, $d:expr) => {
                pick(
                    &candidates(
                        if measure {
                            stringify!($find)
                        } else {
                            stringify!($get)
                        },
                        |n, got, out| unsafe {
                            if measure {
                                sys::$find(h, $a, $b, $c, $d, n, got, out)
                            } else {
                                sys::$get(h, $a, $b, $c, $d, n, got, out)
                            }
                            .result()
                        },
                    )?,
                    math_ok,
                    key.deterministic,
                )
            };
        }
        let (x, w, y, conv) = (plan.x, plan.w, plan.y, plan.conv);
        let chosen = match key.direction {
            ConvDirection::Forward => search!(
                cudnnFindConvolutionForwardAlgorithm,
                cudnnGetConvolutionForwardAlgorithm_v7,
                x,
                w,
                conv,
                y
            ),
            ConvDirection::BackwardData => search!(
                cudnnFindConvolutionBackwardDataAlgorithm,
                cudnnGetConvolutionBackwardDataAlgorithm_v7,
                w,
                y,
                conv,
                x
            ),
            ConvDirection::BackwardFilter => search!(
                cudnnFindConvolutionBackwardFilterAlgorithm,
                cudnnGetConvolutionBackwardFilterAlgorithm_v7,
                x,
                y,
                conv,
                w
            ),
        };
        let Some((algo, chosen_math, workspace)) = chosen else {
            return Ok(None);
        };
        // The kernels the algorithm was ranked with (docs of cudnnConvolutionFwdAlgoPerf_t).
        // SAFETY: a live descriptor.
        unsafe { dnn::set_convolution_math_type(plan.conv, chosen_math) }
            .map_err(err("cudnnSetConvolutionMathType"))?;
        plan.algo = algo;
        plan.workspace = workspace;
        Ok(Some(plan))
    }
}

/// What this module reads of cuDNN's three perf-result structs (one per direction).
trait Perf {
    /// The number of algorithms cuDNN has in this direction.
    const COUNT: usize;
    /// The algorithm, and whether this module accepts it (GEMM-like or direct).
    fn algorithm(&self) -> (Algo, bool);
    /// Math type, status, determinism, workspace bytes.
    fn fields(
        &self,
    ) -> (
        sys::cudnnMathType_t,
        sys::cudnnStatus_t,
        sys::cudnnDeterminism_t,
        usize,
    );
}

macro_rules! impl_perf {
    ($perf:ty, $count:expr, $variant:ident, $accepted:ident) => {
        impl Perf for $perf {
            const COUNT: usize = $count as usize;
            fn algorithm(&self) -> (Algo, bool) {
                (Algo::$variant(self.algo), $accepted(self.algo))
            }
            fn fields(
                &self,
            ) -> (
                sys::cudnnMathType_t,
                sys::cudnnStatus_t,
                sys::cudnnDeterminism_t,
                usize,
            ) {
                (self.mathType, self.status, self.determinism, self.memory)
            }
        }
    };
}
impl_perf!(
    sys::cudnnConvolutionFwdAlgoPerf_t,
    sys::cudnnConvolutionFwdAlgo_t::CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
    Forward,
    accepted_forward
);
impl_perf!(
    sys::cudnnConvolutionBwdDataAlgoPerf_t,
    sys::cudnnConvolutionBwdDataAlgo_t::CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT,
    Data,
    accepted_data
);
impl_perf!(
    sys::cudnnConvolutionBwdFilterAlgoPerf_t,
    sys::cudnnConvolutionBwdFilterAlgo_t::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT,
    Filter,
    accepted_filter
);

/// cuDNN's algorithms for one direction, in its order (fastest first where measured):
/// `get(requested, returned, results)` is the `cudnnFind*Algorithm` or
/// `cudnnGet*Algorithm_v7` call named `call`.
fn candidates<P: Perf>(
    call: &'static str,
    get: impl FnOnce(i32, *mut i32, *mut P) -> Result<(), dnn::CudnnError>,
) -> CudaResult<Vec<P>> {
    // SAFETY: the perf structs are plain C data; cuDNN overwrites the ones it returns.
    let mut perfs: Vec<P> = (0..P::COUNT)
        .map(|_| unsafe { std::mem::zeroed() })
        .collect();
    let mut n = 0;
    get(P::COUNT as i32, &mut n, perfs.as_mut_ptr()).map_err(err(call))?;
    perfs.truncate(n.clamp(0, P::COUNT as i32) as usize);
    Ok(perfs)
}

/// [`choose`] over cuDNN's perf results (math types checked by `math_ok`): the chosen
/// algorithm, its math type and its workspace.
fn pick<P: Perf>(
    perfs: &[P],
    math_ok: impl Fn(sys::cudnnMathType_t) -> bool,
    deterministic_only: bool,
) -> Option<(Algo, sys::cudnnMathType_t, usize)> {
    let candidates: Vec<Candidate> = perfs
        .iter()
        .map(|p| {
            let ((_, accepted), (math, status, det, memory)) = (p.algorithm(), p.fields());
            Candidate {
                accepted: accepted && math_ok(math),
                ok: status == sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS,
                deterministic: det == sys::cudnnDeterminism_t::CUDNN_DETERMINISTIC,
                memory,
            }
        })
        .collect();
    choose(&candidates, WORKSPACE_LIMIT, deterministic_only).map(|i| {
        let (math, _, _, memory) = perfs[i].fields();
        (perfs[i].algorithm().0, math, memory)
    })
}

impl Drop for Dnn {
    fn drop(&mut self) {
        self.plans.clear();
        // SAFETY: the handle and workspace are ours, released once; the device's Drop has
        // synchronised its streams first.
        unsafe {
            if self.workspace != 0 {
                let _ = drv::free_sync(self.workspace);
            }
            let _ = dnn::destroy_handle(self.handle);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A square convolution of 3 channels into 4 on `h` x `h` images, padded `pads` (before,
    /// after) on both axes, its output size as shardc computes it.
    fn geometry(h: usize, k: usize, stride: usize, pads: (usize, usize)) -> Conv2dGeometry {
        let out = (h + pads.0 + pads.1 - k) / stride + 1;
        Conv2dGeometry {
            n: 2,
            c_in: 3,
            h,
            w: h,
            c_out: 4,
            kh: k,
            kw: k,
            stride_h: stride,
            stride_w: stride,
            dil_h: 1,
            dil_w: 1,
            pad_top: pads.0,
            pad_bottom: pads.1,
            pad_left: pads.0,
            pad_right: pads.1,
            out_h: out,
            out_w: out,
            group: 1,
        }
    }

    #[test]
    fn algorithms_come_from_the_heuristics_unless_measuring_is_asked_for() {
        assert_eq!(AlgoSearch::from_value(None).unwrap(), AlgoSearch::Heuristic);
        assert_eq!(
            AlgoSearch::from_value(Some("heuristic")).unwrap(),
            AlgoSearch::Heuristic
        );
        assert_eq!(
            AlgoSearch::from_value(Some(" measure ")).unwrap(),
            AlgoSearch::Measure
        );
        let e = AlgoSearch::from_value(Some("fastest"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("SHARDC_CUDNN_ALGOS=fastest") && e.contains("heuristic"),
            "{e}"
        );
    }

    #[test]
    fn symmetric_or_equivalent_padding_runs_on_cudnn_and_uneven_padding_does_not() {
        // 3x3 stride 1 pad 1: symmetric.
        assert_eq!(unsupported(&geometry(8, 3, 1, (1, 1))), None);
        // `same` 3x3 stride 2 on 8 rows: TensorFlow pads 0 above and 1 below; cuDNN's 0/0
        // gives 3 outputs where shardc has 4.
        let g = geometry(8, 3, 2, (0, 1));
        assert_eq!(g.out_h, 4);
        let why = unsupported(&g).expect("uneven padding falls back");
        assert!(why.contains("padding top/bottom 0/1"), "{why}");
        // 2x2 stride 2 on 7 rows, 0 above and 1 below: the last window needs the padded row
        // (4 outputs; cuDNN's 0/0 gives 3). On 6 rows no window reaches it.
        let g = geometry(7, 2, 2, (0, 1));
        assert_eq!(g.out_h, 4);
        assert!(unsupported(&g).is_some());
        let g = geometry(6, 2, 2, (0, 1));
        assert_eq!(g.out_h, 3);
        assert_eq!(unsupported(&g), None, "the padded row is never read");
    }

    #[test]
    fn the_first_accepted_deterministic_algorithm_that_fits_is_chosen() {
        let c = |accepted, ok, deterministic, memory| Candidate {
            accepted,
            ok,
            deterministic,
            memory,
        };
        let list = [
            c(false, true, true, 0),      // FFT or Winograd: other rounding
            c(true, false, true, 0),      // cannot run this geometry
            c(true, true, false, 0),      // atomics: not the same bits twice
            c(true, true, true, 1 << 40), // too much workspace
            c(true, true, true, 4096),
            c(true, true, true, 0),
        ];
        assert_eq!(choose(&list, WORKSPACE_LIMIT, true), Some(4));
        assert_eq!(choose(&list[..4], WORKSPACE_LIMIT, true), None);
        assert_eq!(choose(&list, 1024, true), Some(5));
        // Non-deterministic algorithms allowed: the one with atomics first.
        assert_eq!(choose(&list, WORKSPACE_LIMIT, false), Some(2));
        assert!(deterministic(None) && deterministic(Some("1")));
        assert!(!deterministic(Some("0")) && !deterministic(Some("off")));
    }

    #[test]
    fn shardc_cudnn_0_turns_cudnn_off() {
        assert!(enabled(None));
        for off in ["0", "off", "false", " 0 "] {
            assert!(!enabled(Some(off)), "{off}");
        }
        assert!(enabled(Some("1")));
    }
}
