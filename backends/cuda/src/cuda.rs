//! The GPU: the driver API and cuBLAS behind [`Device`].
//!
//! One primary context per device, one non-blocking stream every operation goes to (kernel
//! launches, copies, cuBLAS), all kernel sources compiled by NVRTC for the device's
//! architecture when the device is opened. Every entry point first probes the libraries it
//! needs ([`crate::probe`]). A step's work can be recorded once as a CUDA Graph and replayed
//! with one launch ([`Device::begin_capture`]); cuBLAS gets its workspace from here so that
//! no GEMM allocates while recording.

use crate::cudnn::{self, Dnn};
use crate::device::{Device, Gemm, LibraryConv};
use crate::error::{CudaError, CudaResult};
use crate::kernels::{self, DevPtr, KernelArg};
use crate::probe::{self, Library};
use cudarc::cublas::sys as cublas_sys;
use cudarc::driver::result as drv;
use cudarc::driver::sys as drv_sys;
use shardc_ir::DType;
use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::sync::Mutex;

fn driver(call: &'static str) -> impl Fn(drv::DriverError) -> CudaError {
    move |e| CudaError::Driver {
        call,
        reason: format!("{e:?}"),
    }
}

/// Raw handles, used only with the context made current on the calling thread.
struct Handles {
    ctx: drv_sys::CUcontext,
    stream: drv_sys::CUstream,
    /// The stream collectives run on, beside the kernels.
    comm: drv_sys::CUstream,
    /// Events by slot ([`Device::comm_record`]).
    events: Vec<drv_sys::CUevent>,
    blas: cublas_sys::cublasHandle_t,
    /// cuDNN, where it is found and not turned off.
    dnn: DnnState,
    /// Timing events of [`Device::mark`], reused from step to step; `marks_used` of them
    /// recorded since the last reset.
    marks: Vec<drv_sys::CUevent>,
    marks_used: usize,
    /// cuBLAS's workspace, given to it rather than allocated by it (so that no GEMM
    /// allocates while a graph is recorded, as PyTorch does for the same reason).
    blas_workspace: drv_sys::CUdeviceptr,
    /// Whether the compute stream is being recorded ([`Device::begin_capture`]).
    capturing: bool,
    /// Why the recording in progress cannot be kept: the first call made meanwhile that waits
    /// for the stream or moves host memory (the driver would record a pageable copy from an
    /// address that may be gone by the replay, or refuse the wait and break the recording).
    spoiled: Option<String>,
    /// Recorded graphs and their executable instances, by number (None once dropped).
    graphs: Vec<Option<(drv_sys::CUgraph, drv_sys::CUgraphExec)>>,
}

/// Bytes of cuBLAS's workspace (NVIDIA's advice for Hopper; more than enough before).
const BLAS_WORKSPACE: usize = 32 << 20;

/// Whether convolutions go through cuDNN.
enum DnnState {
    /// A handle on the compute stream.
    Ready(Dnn),
    /// Not used, and why.
    Off(String),
}

impl DnnState {
    /// cuDNN on `stream` if `SHARDC_CUDNN` allows it and the library opens and starts.
    fn open(stream: drv_sys::CUstream) -> DnnState {
        if !cudnn::enabled_by_env() {
            return DnnState::Off(format!("turned off by {}", cudnn::CUDNN_ENV));
        }
        if let Err(e) = probe::require(Library::Cudnn) {
            return DnnState::Off(format!("{} not found", e.library));
        }
        match Dnn::new(stream as _) {
            Ok(d) => DnnState::Ready(d),
            Err(e) => DnnState::Off(e.to_string()),
        }
    }
}

// SAFETY: CUDA contexts, streams and cuBLAS handles may be used from any thread once the
// context is current there (`current()` does that before every use); the mutex in
// `CudaDevice` serialises cuBLAS calls, which are not thread-safe on one handle.
unsafe impl Send for Handles {}

/// A GPU (see the module doc).
pub struct CudaDevice {
    handles: Mutex<Handles>,
    /// The primary context (as `handles.ctx`), for [`CudaDevice::bind_from_another_thread`],
    /// which must not wait for `handles`.
    context: usize,
    functions: Mutex<HashMap<String, usize>>,
    /// The NVRTC architecture of the device (`compute_90`).
    arch: String,
    ordinal: usize,
    name: String,
    capability: (i32, i32),
    multiprocessors: u32,
    tf32: bool,
    /// Whether convolutions keep to cuDNN's deterministic algorithms
    /// ([`CudaDevice::set_deterministic_convolutions`]).
    deterministic_convs: std::sync::atomic::AtomicBool,
    /// Whether convolutions may go through cuDNN where it is loaded
    /// ([`CudaDevice::set_cudnn`]).
    cudnn_on: std::sync::atomic::AtomicBool,
    /// What the kernels were loaded as (`SASS by NVRTC 12.8`).
    kernel_image: String,
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.description())
    }
}

/// Compiles kernel source `text` named `unit` and loads it into the current context: SASS for
/// the GPU (`sm`, `sm_90`) where NVRTC makes it and the driver takes it (no JIT; a driver
/// older than NVRTC within its major version takes it too), else PTX for `arch`
/// (`compute_90`), which the driver compiles. Returns the functions of its kernels (`only`
/// these, when given) by name, and which image was loaded (`SASS` or `PTX`).
fn compile_and_load(
    unit: &str,
    text: &str,
    (arch, sm): (&str, &str),
    only: Option<&[String]>,
) -> CudaResult<(Vec<(String, usize)>, &'static str)> {
    // The PTX names the kernels, and is the fallback.
    let ptx = kernels::compile_ptx_text(unit, text, Some(arch))?;
    let names: Vec<String> = kernels::ptx_entries(&ptx)
        .into_iter()
        .filter(|e| only.is_none_or(|names| names.contains(e)))
        .collect();
    let sass_error = match kernels::compile_cubin_text(unit, text, sm) {
        // SAFETY: an ELF image NVRTC made (checked by its header); the module lives as long
        // as the context.
        Ok(cubin) => match unsafe { drv::module::load_data(cubin.as_ptr() as *const c_void) } {
            Ok(module) => return Ok((functions(unit, module, names)?, "SASS")),
            Err(e) => format!("{e:?}"),
        },
        Err(e) => e.to_string(),
    };
    let image = CString::new(ptx)
        .map_err(|_| CudaError::Other(format!("PTX of {unit} holds a NUL byte")))?;
    // SAFETY: a NUL-terminated PTX image; the module lives as long as the context.
    let module = unsafe { drv::module::load_data(image.as_ptr() as *const c_void) }.map_err(|e| {
        let (major, minor) = kernels::nvrtc_version();
        CudaError::Driver {
            call: "cuModuleLoadData",
            reason: format!(
                "{unit}: {e:?}: neither its SASS for {sm} ({sass_error}) nor its PTX loads (a driver \
                 older than the NVRTC that compiled the kernels, CUDA {major}.{minor}, refuses its \
                 PTX: update the driver, or put an NVRTC no newer than the driver's CUDA first in \
                 SHARDC_CUDA_LIB_DIRS)"
            ),
        }
    })?;
    Ok((functions(unit, module, names)?, "PTX"))
}

/// The functions `names` of a loaded module.
fn functions(
    unit: &str,
    module: drv_sys::CUmodule,
    names: Vec<String>,
) -> CudaResult<Vec<(String, usize)>> {
    let mut out = Vec::with_capacity(names.len());
    for entry in names {
        let cname = CString::new(entry.clone())
            .map_err(|_| CudaError::Other(format!("{unit}: a kernel name holds a NUL byte")))?;
        // SAFETY: a loaded module.
        let f = unsafe { drv::module::get_function(module, cname) }
            .map_err(driver("cuModuleGetFunction"))?;
        out.push((entry, f as usize));
    }
    Ok(out)
}

/// The libraries a device needs (NCCL only for NCCL collectives).
pub const REQUIRED: [Library; 4] = [
    Library::Driver,
    Library::Nvrtc,
    Library::Cublas,
    Library::CublasLt,
];

/// The number of CUDA devices, after probing the driver (0 when the driver has none).
pub fn device_count() -> CudaResult<usize> {
    probe::require(Library::Driver)?;
    drv::init().map_err(driver("cuInit"))?;
    let n = drv::device::get_count().map_err(driver("cuDeviceGetCount"))?;
    Ok(n.max(0) as usize)
}

/// The newest CUDA version the driver supports (`(12, 4)`): PTX from a newer NVRTC does not
/// load there, SASS from a newer NVRTC of the same major version does.
pub fn driver_cuda_version() -> CudaResult<(i32, i32)> {
    probe::require(Library::Driver)?;
    let mut v = 0;
    // SAFETY: the driver is loaded (probed above); the call writes one int.
    unsafe { drv_sys::cuDriverGetVersion(&mut v) }
        .result()
        .map_err(driver("cuDriverGetVersion"))?;
    Ok((v / 1000, (v % 1000) / 10))
}

impl CudaDevice {
    /// Opens GPU `ordinal`, compiles the kernels for it and creates the stream and the cuBLAS
    /// handle. Errors: a missing library (never a panic), no such device, a driver too old
    /// for the PTX, a failed compilation.
    pub fn new(ordinal: usize) -> CudaResult<CudaDevice> {
        probe::require_all(&REQUIRED)?;
        let count = device_count()?;
        if ordinal >= count {
            return Err(CudaError::NoDevice(format!(
                "device {ordinal} was asked for, the driver sees {count} (CUDA_VISIBLE_DEVICES is {})",
                std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_else(|_| "unset".into())
            )));
        }
        let dev = drv::device::get(ordinal as i32).map_err(driver("cuDeviceGet"))?;
        let name = drv::device::get_name(dev).map_err(driver("cuDeviceGetName"))?;
        // SAFETY: `dev` came from cuDeviceGet.
        let attr = |a| unsafe { drv::device::get_attribute(dev, a) };
        let major = attr(drv_sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
            .map_err(driver("cuDeviceGetAttribute"))?;
        let minor = attr(drv_sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
            .map_err(driver("cuDeviceGetAttribute"))?;
        let sms = attr(drv_sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(driver("cuDeviceGetAttribute"))?;
        // SAFETY: `dev` came from cuDeviceGet; the context is released by Drop.
        let ctx =
            unsafe { drv::primary_ctx::retain(dev) }.map_err(driver("cuDevicePrimaryCtxRetain"))?;
        // SAFETY: a live context.
        unsafe { drv::ctx::set_current(ctx) }.map_err(driver("cuCtxSetCurrent"))?;
        let stream = drv::stream::create(drv::stream::StreamKind::NonBlocking)
            .map_err(driver("cuStreamCreate"))?;
        let comm = drv::stream::create(drv::stream::StreamKind::NonBlocking)
            .map_err(driver("cuStreamCreate"))?;
        let blas = cudarc::cublas::result::create_handle().map_err(|e| CudaError::Cublas {
            call: "cublasCreate",
            reason: format!("{e:?}"),
        })?;
        // SAFETY: a live handle and stream.
        unsafe {
            cudarc::cublas::result::set_stream(blas, stream as _).map_err(|e| {
                CudaError::Cublas {
                    call: "cublasSetStream",
                    reason: format!("{e:?}"),
                }
            })?;
            cublas_sys::cublasSetMathMode(blas, cublas_sys::cublasMath_t::CUBLAS_DEFAULT_MATH)
                .result()
                .map_err(|e| CudaError::Cublas {
                    call: "cublasSetMathMode",
                    reason: format!("{e:?}"),
                })?;
        }
        // After cublasSetStream, which resets the workspace to cuBLAS's own.
        // SAFETY: the context is current; freed in Drop.
        let blas_workspace =
            unsafe { drv::malloc_sync(BLAS_WORKSPACE) }.map_err(driver("cuMemAlloc"))?;
        // SAFETY: a live handle; the workspace outlives it (freed after the handle in Drop).
        unsafe {
            cublas_sys::cublasSetWorkspace_v2(blas, blas_workspace as _, BLAS_WORKSPACE)
                .result()
                .map_err(|e| CudaError::Cublas {
                    call: "cublasSetWorkspace",
                    reason: format!("{e:?}"),
                })?;
        }
        // Kernels: every source compiled for this GPU, each kernel's function looked up once.
        let arch = format!("compute_{major}{minor}");
        let sm = format!("sm_{major}{minor}");
        let mut functions = HashMap::new();
        let mut images = Vec::new();
        for (source, text) in kernels::SOURCES {
            let (f, image) = compile_and_load(source, text, (&arch, &sm), None)?;
            functions.extend(f);
            images.push(image);
        }
        let (nv_major, nv_minor) = kernels::nvrtc_version();
        let kernel_image = if images.iter().all(|&i| i == "SASS") {
            format!("SASS by NVRTC {nv_major}.{nv_minor}")
        } else {
            format!("PTX by NVRTC {nv_major}.{nv_minor}, compiled by the driver")
        };
        let dnn = DnnState::open(stream);
        Ok(CudaDevice {
            context: ctx as usize,
            handles: Mutex::new(Handles {
                ctx,
                stream,
                comm,
                events: Vec::new(),
                blas,
                dnn,
                marks: Vec::new(),
                marks_used: 0,
                blas_workspace,
                capturing: false,
                spoiled: None,
                graphs: Vec::new(),
            }),
            functions: Mutex::new(functions),
            arch,
            ordinal,
            name,
            capability: (major, minor),
            multiprocessors: sms.max(1) as u32,
            tf32: false,
            deterministic_convs: std::sync::atomic::AtomicBool::new(cudnn::deterministic_by_env()),
            cudnn_on: std::sync::atomic::AtomicBool::new(true),
            kernel_image,
        })
    }

    /// Lets cuBLAS use TF32 tensor cores for Float32 GEMMs (off by default: results then
    /// match the CPU's to 1e-5; on, they match to about 1e-3).
    pub fn set_tf32(&mut self, on: bool) -> CudaResult<()> {
        let h = self.current()?;
        let mode = if on {
            cublas_sys::cublasMath_t::CUBLAS_TF32_TENSOR_OP_MATH
        } else {
            cublas_sys::cublasMath_t::CUBLAS_DEFAULT_MATH
        };
        // SAFETY: a live handle.
        unsafe { cublas_sys::cublasSetMathMode(h.blas, mode).result() }.map_err(|e| {
            CudaError::Cublas {
                call: "cublasSetMathMode",
                reason: format!("{e:?}"),
            }
        })?;
        drop(h);
        self.tf32 = on;
        Ok(())
    }

    /// Lets cuDNN's convolutions take its non-deterministic algorithms (atomics: faster, but
    /// not the same bits twice) or keeps them to deterministic ones (the default, unless
    /// `SHARDC_CUDNN_DETERMINISTIC=0`). Plans made before keep their algorithms for the other
    /// setting.
    pub fn set_deterministic_convolutions(&self, on: bool) {
        self.deterministic_convs
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// Lets convolutions go through cuDNN where it is loaded (the default), or sends them all
    /// to im2col + cuBLAS (as `SHARDC_CUDNN=0` does from the start), for comparing the two.
    pub fn set_cudnn(&self, on: bool) {
        self.cudnn_on
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    fn cudnn_on(&self) -> bool {
        self.cudnn_on.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn deterministic_convolutions(&self) -> bool {
        self.deterministic_convs
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How convolutions run: `cuDNN 91000` (`, any algorithm` where non-deterministic ones
    /// are allowed), or `im2col + cuBLAS (cuDNN ...)` with the reason cuDNN is not used.
    pub fn convolutions(&self) -> String {
        let h = self.handles.lock().unwrap_or_else(|p| p.into_inner());
        match &h.dnn {
            DnnState::Ready(_) if !self.cudnn_on() => {
                "im2col + cuBLAS (cuDNN turned off by set_cudnn)".into()
            }
            DnnState::Ready(_) => format!(
                "cuDNN {}{}",
                Dnn::version(),
                if self.deterministic_convolutions() {
                    ""
                } else {
                    ", any algorithm"
                }
            ),
            DnnState::Off(why) => format!("im2col + cuBLAS (cuDNN {why})"),
        }
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The raw compute stream (for NCCL calls ordered with the kernels).
    pub fn stream_handle(&self) -> usize {
        self.handles
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .stream as usize
    }

    /// The raw communication stream (NCCL calls that overlap the kernels).
    pub fn comm_stream_handle(&self) -> usize {
        self.handles.lock().unwrap_or_else(|p| p.into_inner()).comm as usize
    }

    fn event(h: &mut Handles, slot: usize) -> CudaResult<drv_sys::CUevent> {
        while h.events.len() <= slot {
            let e = drv::event::create(drv_sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
                .map_err(driver("cuEventCreate"))?;
            h.events.push(e);
        }
        Ok(h.events[slot])
    }

    /// Locks the handles with the context current on this thread.
    fn current(&self) -> CudaResult<std::sync::MutexGuard<'_, Handles>> {
        let h = self.handles.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: a live context.
        unsafe { drv::ctx::set_current(h.ctx) }.map_err(driver("cuCtxSetCurrent"))?;
        Ok(h)
    }

    /// The current handles, or an error (which spoils the recording) where the stream is being
    /// recorded: `what` waits for the stream or moves host memory.
    fn current_unrecorded(&self, what: &str) -> CudaResult<std::sync::MutexGuard<'_, Handles>> {
        let mut h = self.current()?;
        if h.capturing {
            let reason = format!("{what} is not possible while the stream is being recorded");
            h.spoiled.get_or_insert_with(|| reason.clone());
            return Err(CudaError::Other(reason));
        }
        Ok(h)
    }

    /// Makes the context current on this thread (for NCCL calls made outside this type).
    pub fn bind(&self) -> CudaResult<()> {
        self.current().map(drop)
    }

    /// Makes the context current on this thread without taking the device's lock, which a
    /// thread blocked in a stream wait holds: for the NCCL watchdog's abort.
    pub fn bind_from_another_thread(&self) -> CudaResult<()> {
        // SAFETY: the primary context, retained until the device is dropped.
        unsafe { drv::ctx::set_current(self.context as drv_sys::CUcontext) }
            .map_err(driver("cuCtxSetCurrent"))
    }
}

/// The element and compute types of [`CudaDevice::time_gemm`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmPrecision {
    /// Float32 in, Float32 compute (TF32 off).
    F32,
    /// Float32 in, TF32 tensor-core compute.
    Tf32,
    /// BFloat16 in and out, Float32 compute.
    Bf16,
}

impl CudaDevice {
    /// The median seconds of an `n x n x n` GEMM at `precision` (cuBLAS `GemmEx`), over
    /// `reps` products after one warm-up, each timed on the GPU between events recorded around
    /// it and waited for, as `bench/gpu/reference.py` times `torch.matmul`. The inputs are
    /// random (zeros would let the GPU draw less power and keep higher clocks than PyTorch's
    /// `randn` inputs). For `shardc bench gpu`.
    pub fn time_gemm(&self, precision: GemmPrecision, n: usize, reps: usize) -> CudaResult<f64> {
        use cublas_sys::cublasComputeType_t::{CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_32F_FAST_TF32};
        use cublas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DFALT as CUBLAS_GEMM_DEFAULT;
        use cublas_sys::cublasOperation_t::CUBLAS_OP_N;
        use cublas_sys::cudaDataType::{CUDA_R_16BF, CUDA_R_32F};
        let (ty, elem, compute) = match precision {
            GemmPrecision::F32 => (CUDA_R_32F, 4, CUBLAS_COMPUTE_32F),
            GemmPrecision::Tf32 => (CUDA_R_32F, 4, CUBLAS_COMPUTE_32F_FAST_TF32),
            GemmPrecision::Bf16 => (CUDA_R_16BF, 2, CUBLAS_COMPUTE_32F),
        };
        let bytes = n * n * elem;
        let bufs = [self.alloc(bytes)?, self.alloc(bytes)?, self.alloc(bytes)?];
        let mut result = Ok(());
        for (seed, &b) in bufs[..2].iter().enumerate() {
            result = result.and_then(|_| {
                self.upload(
                    b,
                    &gemm_operand(n * n, seed as u64, precision == GemmPrecision::Bf16),
                )
            });
        }
        let (alpha, beta) = (1.0f32, 0.0f32);
        let mut samples = Vec::with_capacity(reps);
        for i in 0..=reps {
            if result.is_err() {
                break;
            }
            result = (|| {
                let start = self.mark()?;
                let h = self.current()?;
                // SAFETY: three n x n device buffers of this element type.
                unsafe {
                    cudarc::cublas::result::gemm_ex(
                        h.blas,
                        CUBLAS_OP_N,
                        CUBLAS_OP_N,
                        n as i32,
                        n as i32,
                        n as i32,
                        &alpha as *const f32 as *const c_void,
                        bufs[0] as *const c_void,
                        ty,
                        n as i32,
                        bufs[1] as *const c_void,
                        ty,
                        n as i32,
                        &beta as *const f32 as *const c_void,
                        bufs[2] as *mut c_void,
                        ty,
                        n as i32,
                        compute,
                        CUBLAS_GEMM_DEFAULT,
                    )
                }
                .map_err(|e| CudaError::Cublas {
                    call: "cublasGemmEx",
                    reason: format!("{e:?}"),
                })?;
                drop(h);
                let end = self.mark()?;
                self.synchronize()?;
                let seconds = match (start, end) {
                    (Some(a), Some(b)) => self.seconds_between(a, b),
                    _ => Err(CudaError::Other("no timing marks on this device".into())),
                };
                self.reset_marks();
                if i > 0 {
                    samples.push(seconds?);
                }
                Ok(())
            })();
        }
        for b in bufs {
            self.free(b);
        }
        result?;
        samples.sort_by(f64::total_cmp);
        Ok(samples.get(samples.len() / 2).copied().unwrap_or(f64::NAN))
    }
}

/// The bytes of a GEMM operand of `count` elements for [`CudaDevice::time_gemm`]: from a fixed
/// hash of the index and `seed`, a random sign, magnitude in [1/16, 1) and every bit of the
/// mantissa random (as in PyTorch's `randn` operands), as Float32 or, where `bf16`, BFloat16.
fn gemm_operand(count: usize, seed: u64, bf16: bool) -> Vec<u8> {
    let value = |i: usize| {
        // SplitMix64's finaliser of the index: a well-mixed 64-bit word per element.
        let mut z = (i as u64 ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        // Sign bit 63, exponent 2^-1 to 2^-4 from bits 61-62, mantissa from bits 0-22.
        let exponent = 126 - ((z >> 61) & 3) as u32;
        f32::from_bits(((z >> 63) as u32) << 31 | exponent << 23 | (z as u32 & 0x7f_ffff))
    };
    if bf16 {
        (0..count)
            .flat_map(|i| half::bf16::from_f32(value(i)).to_le_bytes())
            .collect()
    } else {
        (0..count).flat_map(|i| value(i).to_le_bytes()).collect()
    }
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        let mut h = self.handles.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: handles created in `new`, released once here; errors at teardown are moot.
        unsafe {
            let _ = drv::ctx::set_current(h.ctx);
            let _ = drv::stream::synchronize(h.stream);
            let _ = drv::stream::synchronize(h.comm);
            for &e in h.events.iter().chain(&h.marks) {
                let _ = drv::event::destroy(e);
            }
            for (graph, exec) in h.graphs.drain(..).flatten() {
                let _ = drv::graph::exec_destroy(exec);
                let _ = drv::graph::destroy(graph);
            }
            let _ = cudarc::cublas::result::destroy_handle(h.blas);
            let _ = drv::free_sync(h.blas_workspace);
            // cuDNN's handle and workspace, before the stream they use.
            h.dnn = DnnState::Off("closed".into());
            let _ = drv::stream::destroy(h.stream);
            let _ = drv::stream::destroy(h.comm);
        }
    }
}

impl Device for CudaDevice {
    fn description(&self) -> String {
        format!(
            "{} (GPU {}, sm_{}{}, {} SMs{}; kernels: {}; convolutions: {})",
            self.name,
            self.ordinal,
            self.capability.0,
            self.capability.1,
            self.multiprocessors,
            if self.tf32 { ", TF32 on" } else { "" },
            self.kernel_image,
            self.convolutions()
        )
    }

    fn block_size(&self) -> u32 {
        256
    }

    fn wide_block_size(&self) -> u32 {
        1024
    }

    fn max_grid(&self) -> u32 {
        self.multiprocessors * 16
    }

    fn alloc(&self, bytes: usize) -> CudaResult<DevPtr> {
        let _h = self.current()?;
        // SAFETY: a current context.
        unsafe { drv::malloc_sync(bytes.max(1)) }.map_err(|e| {
            if e.0 == drv_sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY {
                CudaError::OutOfMemory {
                    requested: bytes,
                    context: self.name.clone(),
                }
            } else {
                driver("cuMemAlloc")(e)
            }
        })
    }

    fn free(&self, ptr: DevPtr) {
        if let Ok(_h) = self.current() {
            // SAFETY: a pointer from `alloc`, freed once by its owner.
            let _ = unsafe { drv::free_sync(ptr) };
        }
    }

    fn upload(&self, dst: DevPtr, src: &[u8]) -> CudaResult<()> {
        let h = self.current_unrecorded("an upload")?;
        // SAFETY: `dst` is an allocation of at least `src.len()` bytes (the caller's plan);
        // a pageable source is staged before the call returns.
        unsafe { drv::memcpy_htod_async(dst, src, h.stream) }.map_err(driver("cuMemcpyHtoDAsync"))
    }

    fn download(&self, src: DevPtr, dst: &mut [u8]) -> CudaResult<()> {
        let h = self.current_unrecorded("a download")?;
        // SAFETY: as upload; the stream is synchronised before `dst` is read.
        unsafe {
            drv::memcpy_dtoh_async(dst, src, h.stream).map_err(driver("cuMemcpyDtoHAsync"))?;
            drv::stream::synchronize(h.stream).map_err(driver("cuStreamSynchronize"))
        }
    }

    fn copy(&self, dst: DevPtr, src: DevPtr, bytes: usize) -> CudaResult<()> {
        if bytes == 0 {
            return Ok(());
        }
        let h = self.current()?;
        // SAFETY: both ranges lie in allocations (the caller's plan).
        unsafe { drv::memcpy_dtod_async(dst, src, bytes, h.stream) }
            .map_err(driver("cuMemcpyDtoDAsync"))
    }

    fn launch(&self, name: &str, grid: u32, block: u32, args: &[KernelArg]) -> CudaResult<()> {
        let f = *self
            .functions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .ok_or_else(|| CudaError::UnknownKernel(name.to_string()))?;
        let h = self.current()?;
        let mut params = kernels::params(args);
        // SAFETY: `f` is a kernel of a loaded module; `params` points at one value per
        // kernel parameter, of the parameter's type (ops.rs builds them from the kernel
        // signatures); the driver copies them before returning.
        unsafe {
            drv::launch_kernel(
                f as drv_sys::CUfunction,
                (grid.max(1), 1, 1),
                (block, 1, 1),
                0,
                h.stream,
                &mut params,
            )
        }
        .map_err(|e| CudaError::Driver {
            call: "cuLaunchKernel",
            reason: format!("{name}: {e:?}"),
        })
    }

    fn gemm(&self, g: &Gemm) -> CudaResult<()> {
        use cublas_sys::cublasOperation_t::{CUBLAS_OP_N, CUBLAS_OP_T};
        let h = self.current()?;
        let op = |t: bool| if t { CUBLAS_OP_T } else { CUBLAS_OP_N };
        let i = |v: usize| v as i32;
        let l = |v: usize| v as i64;
        let err = |e: cudarc::cublas::result::CublasError| CudaError::Cublas {
            call: "cublasGemmStridedBatched",
            reason: format!("{e:?}"),
        };
        // SAFETY: pointers and strides describe ranges inside allocations (ops.rs); alpha
        // and beta live on the host through the call.
        unsafe {
            match g.dtype {
                DType::Float32 => {
                    let (alpha, beta) = (g.alpha as f32, g.beta as f32);
                    cudarc::cublas::result::sgemm_strided_batched(
                        h.blas,
                        op(g.trans_a),
                        op(g.trans_b),
                        i(g.m),
                        i(g.n),
                        i(g.k),
                        &alpha,
                        g.a as *const f32,
                        i(g.lda),
                        l(g.stride_a),
                        g.b as *const f32,
                        i(g.ldb),
                        l(g.stride_b),
                        &beta,
                        g.c as *mut f32,
                        i(g.ldc),
                        l(g.stride_c),
                        i(g.batch),
                    )
                    .map_err(err)
                }
                DType::Float64 => {
                    let (alpha, beta) = (g.alpha, g.beta);
                    cudarc::cublas::result::dgemm_strided_batched(
                        h.blas,
                        op(g.trans_a),
                        op(g.trans_b),
                        i(g.m),
                        i(g.n),
                        i(g.k),
                        &alpha,
                        g.a as *const f64,
                        i(g.lda),
                        l(g.stride_a),
                        g.b as *const f64,
                        i(g.ldb),
                        l(g.stride_b),
                        &beta,
                        g.c as *mut f64,
                        i(g.ldc),
                        l(g.stride_c),
                        i(g.batch),
                    )
                    .map_err(err)
                }
                other => Err(CudaError::Other(format!(
                    "GEMM of {other} is not supported"
                ))),
            }
        }
    }

    fn has_conv_library(&self) -> bool {
        self.cudnn_on()
            && self
                .current()
                .is_ok_and(|h| matches!(h.dnn, DnnState::Ready(_)))
    }

    fn library_conv(&self, c: &LibraryConv) -> CudaResult<bool> {
        if !self.cudnn_on() {
            return Ok(false);
        }
        let mut h = self.current()?;
        let stream = h.stream;
        let DnnState::Ready(dnn) = &mut h.dnn else {
            return Ok(false);
        };
        // SAFETY: a live stream (the workspace is freed only after it is idle).
        let sync =
            || unsafe { drv::stream::synchronize(stream) }.map_err(driver("cuStreamSynchronize"));
        dnn.run(c, (self.tf32, self.deterministic_convolutions()), &sync)
    }

    fn mark(&self) -> CudaResult<Option<usize>> {
        let mut h = self.current_unrecorded("a timing mark")?;
        if h.marks_used == h.marks.len() {
            let e = drv::event::create(drv_sys::CUevent_flags::CU_EVENT_DEFAULT)
                .map_err(driver("cuEventCreate"))?;
            h.marks.push(e);
        }
        let i = h.marks_used;
        // SAFETY: a live event and stream.
        unsafe { drv::event::record(h.marks[i], h.stream) }.map_err(driver("cuEventRecord"))?;
        h.marks_used += 1;
        Ok(Some(i))
    }

    fn seconds_between(&self, a: usize, b: usize) -> CudaResult<f64> {
        let h = self.current()?;
        let (Some(&ea), Some(&eb)) = (
            h.marks[..h.marks_used].get(a),
            h.marks[..h.marks_used].get(b),
        ) else {
            return Err(CudaError::Other(format!(
                "marks {a} and {b}: only {} recorded",
                h.marks_used
            )));
        };
        // SAFETY: both events were recorded on the stream.
        let ms = unsafe { drv::event::elapsed(ea, eb) }.map_err(driver("cuEventElapsedTime"))?;
        Ok(f64::from(ms) / 1e3)
    }

    fn reset_marks(&self) {
        self.handles
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .marks_used = 0;
    }

    fn synchronize(&self) -> CudaResult<()> {
        let h = self.current_unrecorded("a synchronisation")?;
        // SAFETY: live streams.
        unsafe {
            drv::stream::synchronize(h.comm).map_err(driver("cuStreamSynchronize"))?;
            drv::stream::synchronize(h.stream).map_err(driver("cuStreamSynchronize"))
        }
    }

    fn begin_capture(&self) -> CudaResult<bool> {
        let mut h = self.current()?;
        if h.capturing {
            return Err(CudaError::Other(
                "a recording is already in progress".into(),
            ));
        }
        // Relaxed: the libraries may still allocate (a first cuDNN plan) while recording;
        // anything that waits for the stream fails and spoils the recording.
        // SAFETY: a live stream.
        unsafe {
            drv::stream::begin_capture(
                h.stream,
                drv_sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
            )
        }
        .map_err(driver("cuStreamBeginCapture"))?;
        h.capturing = true;
        h.spoiled = None;
        Ok(true)
    }

    fn end_capture(&self) -> CudaResult<usize> {
        let mut h = self.current()?;
        if !h.capturing {
            return Err(CudaError::Other("no recording is in progress".into()));
        }
        h.capturing = false;
        let spoiled = h.spoiled.take();
        // SAFETY: the stream is being captured; the graph is owned here from now on.
        let graph =
            unsafe { drv::stream::end_capture(h.stream) }.map_err(driver("cuStreamEndCapture"))?;
        if graph.is_null() {
            return Err(CudaError::Other("the recording produced no graph".into()));
        }
        if let Some(reason) = spoiled {
            // SAFETY: the graph just recorded, owned here and not instantiated.
            let _ = unsafe { drv::graph::destroy(graph) };
            return Err(CudaError::Other(format!(
                "the recording was spoiled: {reason}"
            )));
        }
        // SAFETY: a graph just recorded; destroyed here if it cannot be instantiated.
        let exec =
            match unsafe { drv::graph::instantiate(graph, drv_sys::CUgraphInstantiate_flags(0)) } {
                Ok(e) => e,
                Err(e) => {
                    // SAFETY: as above.
                    let _ = unsafe { drv::graph::destroy(graph) };
                    return Err(driver("cuGraphInstantiate")(e));
                }
            };
        // SAFETY: a live executable graph and stream.
        unsafe { drv::graph::upload(exec, h.stream) }.map_err(driver("cuGraphUpload"))?;
        h.graphs.push(Some((graph, exec)));
        Ok(h.graphs.len() - 1)
    }

    fn replay(&self, graph: usize) -> CudaResult<()> {
        let h = self.current()?;
        let Some(Some((_, exec))) = h.graphs.get(graph) else {
            return Err(CudaError::Other(format!("no recorded graph {graph}")));
        };
        // SAFETY: a live executable graph and stream.
        unsafe { drv::graph::launch(*exec, h.stream) }.map_err(driver("cuGraphLaunch"))
    }

    fn drop_graph(&self, graph: usize) {
        let Ok(mut h) = self.current() else {
            return;
        };
        if let Some((g, exec)) = h.graphs.get_mut(graph).and_then(Option::take) {
            // SAFETY: recorded here; the stream is synchronised first, since a replay may
            // still run.
            unsafe {
                let _ = drv::stream::synchronize(h.stream);
                let _ = drv::graph::exec_destroy(exec);
                let _ = drv::graph::destroy(g);
            }
        }
    }

    fn load_kernels(&self, unit: &str, text: &str, names: &[String]) -> CudaResult<()> {
        let _h = self.current()?;
        let sm = format!("sm_{}{}", self.capability.0, self.capability.1);
        let (loaded, _) = compile_and_load(unit, text, (&self.arch, &sm), Some(names))?;
        self.functions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(loaded);
        Ok(())
    }

    fn comm_after_compute(&self) -> CudaResult<()> {
        let mut h = self.current()?;
        // Slot 0 is this crossing's own event; buckets use slots from 1.
        let e = CudaDevice::event(&mut h, 0)?;
        // SAFETY: live streams and event.
        unsafe {
            drv::event::record(e, h.stream).map_err(driver("cuEventRecord"))?;
            drv::stream::wait_event(
                h.comm,
                e,
                drv_sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
            .map_err(driver("cuStreamWaitEvent"))
        }
    }

    fn comm_record(&self, slot: usize) -> CudaResult<()> {
        let mut h = self.current()?;
        let e = CudaDevice::event(&mut h, slot + 1)?;
        // SAFETY: a live stream and event.
        unsafe { drv::event::record(e, h.comm) }.map_err(driver("cuEventRecord"))
    }

    fn compute_after_comm(&self, slot: usize) -> CudaResult<()> {
        let mut h = self.current()?;
        let e = CudaDevice::event(&mut h, slot + 1)?;
        // SAFETY: a live stream and event.
        unsafe {
            drv::stream::wait_event(
                h.stream,
                e,
                drv_sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
        }
        .map_err(driver("cuStreamWaitEvent"))
    }
}

#[cfg(test)]
mod tests {
    use super::gemm_operand;

    #[test]
    fn gemm_operands_are_random_values_below_one_of_either_type() {
        let n = 1 << 16;
        let f32s: Vec<f32> = gemm_operand(n, 0, false)
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        assert_eq!(f32s.len(), n);
        assert!(
            f32s.iter().all(|v| (1.0 / 16.0..1.0).contains(&v.abs())),
            "a magnitude out of [1/16, 1)"
        );
        let mean = f32s.iter().map(|&v| f64::from(v)).sum::<f64>() / n as f64;
        assert!(mean.abs() < 0.01, "mean {mean}");
        // Half the signs negative, half the mantissas odd: the low bits toggle too.
        let count = |f: &dyn Fn(&f32) -> bool| f32s.iter().filter(|v| f(v)).count();
        for (what, c) in [
            ("negative", count(&|v| *v < 0.0)),
            ("odd", count(&|v| v.to_bits() & 1 == 1)),
        ] {
            assert!((n * 9 / 20..n * 11 / 20).contains(&c), "{c} of {n} {what}");
        }
        // The second operand differs; BFloat16 holds the same values rounded.
        assert_ne!(gemm_operand(16, 1, false), gemm_operand(16, 0, false));
        let bf16s = gemm_operand(n, 0, true);
        assert_eq!(bf16s.len(), 2 * n);
        for (b, &v) in bf16s.chunks_exact(2).zip(&f32s) {
            let x = half::bf16::from_le_bytes([b[0], b[1]]).to_f32();
            assert!((x - v).abs() <= v.abs() / 128.0, "{x} for {v}");
        }
    }
}
