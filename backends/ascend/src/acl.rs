//! AscendCL, nnopbase and aclnn as loaded at run time ([`api`], resolved once per process),
//! and one Ascend device ([`AscendDevice`]): memory, a compute and a communication stream,
//! events.
//!
//! Device addresses ([`DevPtr`]) are opaque: the host never dereferences them, it only hands
//! them to AscendCL (copies), to aclnn (tensor descriptors) and to HCCL. Every thread that
//! issues work makes the device current first ([`AscendDevice::bind`], `aclrtSetDevice`,
//! once per thread and device).

use crate::error::{AscendError, AscendResult};
use crate::probe::{self, Library, Opened};
use shardc_ascend_sys::{self as sys, sig};
use std::cell::Cell;
use std::ffi::{c_char, c_void, CStr};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// A device address (0 is null). Opaque: never dereferenced on the host.
pub type DevPtr = u64;

macro_rules! api_struct {
    (required { $($req:ident),* $(,)? } optional { $($opt:ident),* $(,)? }) => {
        /// Every AscendCL, nnopbase and aclnn function shardc calls, resolved once
        /// ([`api`]). The aclnn operators are optional: an old CANN without one fails the op
        /// that needs it, naming the symbol.
        #[allow(non_snake_case)]
        pub struct Api {
            $(
                #[doc = concat!("`", stringify!($req), "`.")]
                pub $req: sig::$req,
            )*
            $(
                #[doc = concat!("`", stringify!($opt), "`, if the opApi libraries export it.")]
                pub $opt: Option<sig::$opt>,
            )*
            /// The opened libraries (kept open for the process's life).
            pub libraries: Vec<(Library, Opened)>,
        }

        impl Api {
            fn resolve(libraries: Vec<(Library, Opened)>) -> AscendResult<Api> {
                Ok(Api {
                    $(
                        // SAFETY: the symbol has the C signature of `sig::$req` (the sys
                        // crate's, from CANN's headers).
                        $req: unsafe {
                            std::mem::transmute::<*mut c_void, sig::$req>(find(
                                &libraries,
                                stringify!($req),
                            )?)
                        },
                    )*
                    $(
                        // SAFETY: as above.
                        $opt: find(&libraries, stringify!($opt)).ok().map(|p| unsafe {
                            std::mem::transmute::<*mut c_void, sig::$opt>(p)
                        }),
                    )*
                    libraries,
                })
            }
        }
    };
}

api_struct! {
    required {
        aclInit, aclFinalize, aclrtSetDevice, aclrtResetDevice, aclrtGetDevice,
        aclrtGetDeviceCount, aclrtCreateStream, aclrtDestroyStream, aclrtSynchronizeStream,
        aclrtSynchronizeStreamWithTimeout, aclrtCreateEvent, aclrtDestroyEvent,
        aclrtRecordEvent, aclrtStreamWaitEvent, aclrtSynchronizeEvent, aclrtMalloc, aclrtFree,
        aclrtMemcpy, aclrtMemcpyAsync, aclrtMemset, aclrtMemsetAsync, aclrtGetMemInfo,
        aclrtGetSocName, aclrtGetVersion, aclGetRecentErrMsg,
        aclCreateTensor, aclCreateScalar, aclCreateIntArray, aclCreateBoolArray,
        aclCreateTensorList, aclDestroyTensor, aclDestroyScalar, aclDestroyIntArray,
        aclDestroyBoolArray, aclDestroyTensorList,
    }
    optional {
        aclnnAddGetWorkspaceSize, aclnnAdd, aclnnAddsGetWorkspaceSize, aclnnAdds,
        aclnnSubGetWorkspaceSize, aclnnSub, aclnnMulGetWorkspaceSize, aclnnMul,
        aclnnMulsGetWorkspaceSize, aclnnMuls, aclnnDivGetWorkspaceSize, aclnnDiv,
        aclnnNegGetWorkspaceSize, aclnnNeg, aclnnSqrtGetWorkspaceSize, aclnnSqrt,
        aclnnExpGetWorkspaceSize, aclnnExp, aclnnLogGetWorkspaceSize, aclnnLog,
        aclnnTanhGetWorkspaceSize, aclnnTanh, aclnnErfGetWorkspaceSize, aclnnErf,
        aclnnTanhBackwardGetWorkspaceSize,
        aclnnTanhBackward, aclnnCastGetWorkspaceSize, aclnnCast, aclnnEqTensorGetWorkspaceSize,
        aclnnEqTensor, aclnnReduceSumGetWorkspaceSize, aclnnReduceSum, aclnnMeanGetWorkspaceSize,
        aclnnMean, aclnnAmaxGetWorkspaceSize, aclnnAmax, aclnnExpandGetWorkspaceSize,
        aclnnExpand, aclnnOneHotGetWorkspaceSize, aclnnOneHot, aclnnPermuteGetWorkspaceSize,
        aclnnPermute, aclnnCatGetWorkspaceSize, aclnnCat, aclnnInplaceCopyGetWorkspaceSize,
        aclnnInplaceCopy, aclnnInplaceZeroGetWorkspaceSize, aclnnInplaceZero,
        aclnnInplaceFillScalarGetWorkspaceSize, aclnnInplaceFillScalar,
        aclnnMatmulGetWorkspaceSize, aclnnMatmul, aclnnBatchMatMulGetWorkspaceSize,
        aclnnBatchMatMul, aclnnReluGetWorkspaceSize, aclnnRelu, aclnnSigmoidGetWorkspaceSize,
        aclnnSigmoid, aclnnSigmoidBackwardGetWorkspaceSize, aclnnSigmoidBackward,
        aclnnGeluV2GetWorkspaceSize, aclnnGeluV2, aclnnGeluBackwardV2GetWorkspaceSize,
        aclnnGeluBackwardV2, aclnnSiluGetWorkspaceSize, aclnnSilu,
        aclnnSiluBackwardGetWorkspaceSize, aclnnSiluBackward,
        aclnnThresholdBackwardGetWorkspaceSize, aclnnThresholdBackward,
        aclnnSoftmaxGetWorkspaceSize, aclnnSoftmax, aclnnSoftmaxBackwardGetWorkspaceSize,
        aclnnSoftmaxBackward, aclnnLogSoftmaxGetWorkspaceSize, aclnnLogSoftmax,
        aclnnLogSoftmaxBackwardGetWorkspaceSize, aclnnLogSoftmaxBackward,
        aclnnLayerNormGetWorkspaceSize, aclnnLayerNorm, aclnnLayerNormBackwardGetWorkspaceSize,
        aclnnLayerNormBackward, aclnnBatchNormGetWorkspaceSize, aclnnBatchNorm,
        aclnnBatchNormBackwardGetWorkspaceSize, aclnnBatchNormBackward,
        aclnnConvolutionGetWorkspaceSize, aclnnConvolution,
        aclnnConvolutionBackwardGetWorkspaceSize, aclnnConvolutionBackward,
        aclnnAvgPool2dGetWorkspaceSize, aclnnAvgPool2d, aclnnAvgPool2dBackwardGetWorkspaceSize,
        aclnnAvgPool2dBackward, aclnnMaxPool2dWithIndicesGetWorkspaceSize,
        aclnnMaxPool2dWithIndices, aclnnMaxPool2dWithIndicesBackwardGetWorkspaceSize,
        aclnnMaxPool2dWithIndicesBackward, aclnnIndexSelectGetWorkspaceSize, aclnnIndexSelect,
        aclnnIndexAddGetWorkspaceSize, aclnnIndexAdd,
    }
}

/// The address of `symbol` in the library the sys crate says exports it (opApi: in whichever
/// opened opApi file has it).
pub(crate) fn find(
    libraries: &[(Library, Opened)],
    symbol: &'static str,
) -> AscendResult<*mut c_void> {
    let lib = sys::library_of(symbol).ok_or_else(|| {
        AscendError::Other(format!(
            "{symbol} is not in the sys crate's symbol table (a bug)"
        ))
    })?;
    let mut name = symbol.as_bytes().to_vec();
    name.push(0);
    let mut paths = Vec::new();
    for (l, o) in libraries.iter().filter(|(l, _)| *l == lib) {
        let _ = l;
        // SAFETY: reading a symbol's address; it is only called through its `sig` type.
        if let Ok(s) = unsafe { o.handle.get::<*mut c_void>(name.as_slice()) } {
            let p = *s;
            if !p.is_null() {
                return Ok(p);
            }
        }
        paths.push(o.path.clone());
    }
    Err(AscendError::MissingSymbol {
        symbol,
        library: lib.file_name(),
        path: paths.join(", "),
        hint: "the CANN toolkit found is older than the one shardc's ABI is taken from (CANN 8.x); put a newer one first",
    })
}

static API: OnceLock<Result<Api, String>> = OnceLock::new();

/// AscendCL, nnopbase and aclnn, opened and resolved once per process, `aclInit` called.
/// A missing library or symbol is an error (the same one on every later call).
pub fn api() -> AscendResult<&'static Api> {
    let r = API.get_or_init(|| load().map_err(|e| e.to_string()));
    match r {
        Ok(a) => Ok(a),
        Err(e) => Err(AscendError::Other(e.clone())),
    }
}

fn load() -> AscendResult<Api> {
    let mut libraries = Vec::new();
    for lib in [Library::AscendCl, Library::NnOpBase, Library::OpApi] {
        for o in probe::open(lib)? {
            libraries.push((lib, o));
        }
    }
    let api = Api::resolve(libraries)?;
    // SAFETY: a null config path is allowed.
    let code = unsafe { (api.aclInit)(std::ptr::null()) };
    if code != sys::ACL_SUCCESS && code != sys::ACL_ERROR_REPEAT_INITIALIZE {
        return Err(acl_error(&api, "aclInit", code, "initialising AscendCL"));
    }
    Ok(api)
}

/// The error of AscendCL call `call` that returned `code`, with `aclGetRecentErrMsg`.
pub(crate) fn acl_error(api: &Api, call: &'static str, code: i32, context: &str) -> AscendError {
    AscendError::Acl {
        call,
        code,
        message: with_recent(api, context),
    }
}

/// `context` and AscendCL's last error message on this thread, if any.
pub(crate) fn with_recent(api: &Api, context: &str) -> String {
    // SAFETY: returns a NUL-terminated string or null.
    let p = unsafe { (api.aclGetRecentErrMsg)() };
    let recent = c_text(p);
    match (context.is_empty(), recent.is_empty()) {
        (_, true) => context.to_string(),
        (true, false) => recent,
        (false, false) => format!("{context} ({recent})"),
    }
}

/// A C string as text ("" for null).
pub(crate) fn c_text(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: the callers pass NUL-terminated strings from CANN.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

fn check(
    api: &Api,
    call: &'static str,
    code: i32,
    context: impl Fn() -> String,
) -> AscendResult<()> {
    if code == sys::ACL_SUCCESS {
        Ok(())
    } else {
        Err(acl_error(api, call, code, &context()))
    }
}

/// The number of Ascend devices AscendCL sees (an error names a missing library).
pub fn device_count() -> AscendResult<usize> {
    let api = api()?;
    let mut n = 0u32;
    // SAFETY: writes one u32.
    let code = unsafe { (api.aclrtGetDeviceCount)(&mut n) };
    check(api, "aclrtGetDeviceCount", code, || {
        "counting devices".into()
    })?;
    Ok(n as usize)
}

/// `shardc device info` for Ascend: the libraries ([`probe::report`]), then the devices.
pub fn report() -> String {
    let mut s = probe::report();
    match api() {
        Err(e) => s.push_str(&format!("\n  AscendCL not usable: {e}")),
        Ok(api) => {
            let (mut a, mut b, mut c) = (0, 0, 0);
            // SAFETY: writes three i32.
            if unsafe { (api.aclrtGetVersion)(&mut a, &mut b, &mut c) } == sys::ACL_SUCCESS {
                s.push_str(&format!("\n  AscendCL version {a}.{b}.{c}"));
            }
            match device_count() {
                Ok(n) => {
                    s.push_str(&format!("\n  {n} device(s)"));
                    for d in 0..n {
                        match AscendDevice::open(d) {
                            Ok(dev) => s.push_str(&format!("\n    {}", dev.description())),
                            Err(e) => s.push_str(&format!("\n    device {d}: {e}")),
                        }
                    }
                }
                Err(e) => s.push_str(&format!("\n  {e}")),
            }
        }
    }
    s
}

thread_local! {
    /// The device this thread made current last (`aclrtSetDevice`), -1 for none.
    static CURRENT: Cell<i32> = const { Cell::new(-1) };
}

/// A stream handle (an `aclrtStream`, kept as an integer so the device is `Send + Sync`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stream(usize);

impl Stream {
    /// The raw handle.
    pub fn raw(self) -> sys::aclrtStream {
        self.0 as sys::aclrtStream
    }
}

/// An event handle (an `aclrtEvent`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event(usize);

impl Event {
    /// The raw handle.
    pub fn raw(self) -> sys::aclrtEvent {
        self.0 as sys::aclrtEvent
    }
}

/// One Ascend device, opened for this process: its compute and communication streams.
/// Shared (`Arc`) by the executors and the HCCL communicator of one rank.
pub struct AscendDevice {
    id: usize,
    /// The bound of every host wait for a stream (`SHARDC_COMM_TIMEOUT`).
    timeout: Duration,
    api: &'static Api,
    compute: Stream,
    comm: Stream,
    description: String,
}

impl std::fmt::Debug for AscendDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AscendDevice({})", self.description)
    }
}

impl AscendDevice {
    /// Opens device `device_id`: makes it current on this thread, creates its streams.
    pub fn open(device_id: usize) -> AscendResult<Arc<AscendDevice>> {
        let api = api()?;
        let count = device_count()?;
        if device_id >= count {
            return Err(AscendError::Other(format!(
                "Ascend device {device_id} does not exist: AscendCL sees {count} device(s)"
            )));
        }
        let id = i32::try_from(device_id)
            .map_err(|_| AscendError::Other(format!("device id {device_id} is too large")))?;
        set_device(api, id)?;
        let mut compute: sys::aclrtStream = std::ptr::null_mut();
        let mut comm: sys::aclrtStream = std::ptr::null_mut();
        // SAFETY: each call writes one stream handle.
        let code = unsafe { (api.aclrtCreateStream)(&mut compute) };
        check(api, "aclrtCreateStream", code, || {
            format!("the compute stream of device {device_id}")
        })?;
        // SAFETY: as above.
        let code = unsafe { (api.aclrtCreateStream)(&mut comm) };
        check(api, "aclrtCreateStream", code, || {
            format!("the communication stream of device {device_id}")
        })?;
        let soc = c_text(
            // SAFETY: returns a static string or null.
            unsafe { (api.aclrtGetSocName)() },
        );
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: writes two usize.
        let mem = unsafe { (api.aclrtGetMemInfo)(sys::ACL_HBM_MEM, &mut free, &mut total) };
        let mut description = match soc.as_str() {
            "" => format!("Ascend NPU (device {device_id}"),
            s if s.starts_with("Ascend") => format!("{s} (device {device_id}"),
            s => format!("Ascend {s} (device {device_id}"),
        };
        if mem == sys::ACL_SUCCESS && total > 0 {
            description.push_str(&format!(", {:.1} GiB", total as f64 / (1u64 << 30) as f64));
        }
        description.push(')');
        let timeout = shardc_runtime::comm::comm_timeout_from_env().map_err(AscendError::Other)?;
        Ok(Arc::new(AscendDevice {
            timeout,
            id: device_id,
            api,
            compute: Stream(compute as usize),
            comm: Stream(comm as usize),
            description,
        }))
    }

    /// The device's number.
    pub fn id(&self) -> usize {
        self.id
    }

    /// The loaded API.
    pub fn api(&self) -> &'static Api {
        self.api
    }

    /// The device, in words (`Ascend910B1 (device 0, 64.0 GiB)`).
    pub fn description(&self) -> String {
        self.description.clone()
    }

    /// The compute stream (kernels, copies, packs and unpacks).
    pub fn stream(&self) -> Stream {
        self.compute
    }

    /// The communication stream (gradient buckets).
    pub fn comm_stream(&self) -> Stream {
        self.comm
    }

    /// Makes this device current on the calling thread (`aclrtSetDevice`, once per thread
    /// and device).
    pub fn bind(&self) -> AscendResult<()> {
        set_device(self.api, self.id as i32)
    }

    fn check(
        &self,
        call: &'static str,
        code: i32,
        context: impl Fn() -> String,
    ) -> AscendResult<()> {
        check(self.api, call, code, context)
    }

    /// `bytes` of device memory (at least one byte is asked for: AscendCL refuses 0).
    pub fn malloc(&self, bytes: usize) -> AscendResult<DevPtr> {
        self.bind()?;
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: writes one pointer.
        let code =
            unsafe { (self.api.aclrtMalloc)(&mut p, bytes.max(1), sys::ACL_MEM_MALLOC_HUGE_FIRST) };
        self.check("aclrtMalloc", code, || {
            format!("{bytes} bytes on device {}", self.id)
        })?;
        Ok(p as DevPtr)
    }

    /// Frees `p` (0 is ignored). The caller has synchronized the streams that use it.
    pub fn free(&self, p: DevPtr) {
        if p != 0 {
            let _ = self.bind();
            // SAFETY: `p` came from `malloc` and is freed once.
            unsafe { (self.api.aclrtFree)(p as *mut c_void) };
        }
    }

    /// Copies `bytes` to `dst` after the compute stream's work so far (which may still read
    /// `dst`): the stream is drained (bounded by `SHARDC_COMM_TIMEOUT`), then a synchronous
    /// `aclrtMemcpy`. Synchronous copies from ordinary (pageable) host memory are what every
    /// CANN version supports; `aclrtMemcpyAsync` from pageable memory is undefined on CANN
    /// 8.0's training products.
    pub fn upload(&self, dst: DevPtr, bytes: &[u8]) -> AscendResult<()> {
        if bytes.is_empty() {
            return Ok(());
        }
        self.synchronize()?;
        // SAFETY: `dst` is a device buffer of at least `bytes.len()`; nothing queued uses it.
        let code = unsafe {
            (self.api.aclrtMemcpy)(
                dst as *mut c_void,
                bytes.len(),
                bytes.as_ptr() as *const c_void,
                bytes.len(),
                sys::ACL_MEMCPY_HOST_TO_DEVICE,
            )
        };
        self.check("aclrtMemcpy", code, || {
            format!("{} bytes to device {}", bytes.len(), self.id)
        })
    }

    /// Copies `out.len()` bytes from `src` once the compute stream's work so far is done
    /// (drained, bounded by `SHARDC_COMM_TIMEOUT`; then a synchronous `aclrtMemcpy`).
    pub fn download(&self, src: DevPtr, out: &mut [u8]) -> AscendResult<()> {
        if out.is_empty() {
            return Ok(());
        }
        self.synchronize()?;
        let n = out.len();
        // SAFETY: `src` is a device buffer of at least `n` bytes, its writers done.
        let code = unsafe {
            (self.api.aclrtMemcpy)(
                out.as_mut_ptr() as *mut c_void,
                n,
                src as *const c_void,
                n,
                sys::ACL_MEMCPY_DEVICE_TO_HOST,
            )
        };
        self.check("aclrtMemcpy", code, || {
            format!("{n} bytes from device {}", self.id)
        })
    }

    /// A device-to-device copy of `bytes` on the compute stream.
    pub fn copy(&self, dst: DevPtr, src: DevPtr, bytes: usize) -> AscendResult<()> {
        self.copy_on(self.compute, dst, src, bytes)
    }

    /// A device-to-device copy of `bytes` on `stream`.
    pub fn copy_on(
        &self,
        stream: Stream,
        dst: DevPtr,
        src: DevPtr,
        bytes: usize,
    ) -> AscendResult<()> {
        if bytes == 0 || dst == src {
            return Ok(());
        }
        // SAFETY: both are device addresses of at least `bytes`.
        let code = unsafe {
            (self.api.aclrtMemcpyAsync)(
                dst as *mut c_void,
                bytes,
                src as *const c_void,
                bytes,
                sys::ACL_MEMCPY_DEVICE_TO_DEVICE,
                stream.raw(),
            )
        };
        self.check("aclrtMemcpyAsync", code, || {
            format!("{bytes} bytes within device {}", self.id)
        })
    }

    /// Sets `bytes` at `dst` to zero on the compute stream.
    pub fn zero(&self, dst: DevPtr, bytes: usize) -> AscendResult<()> {
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: `dst` is a device address of at least `bytes`.
        let code = unsafe {
            (self.api.aclrtMemsetAsync)(dst as *mut c_void, bytes, 0, bytes, self.compute.raw())
        };
        self.check("aclrtMemsetAsync", code, || {
            format!("{bytes} bytes on device {}", self.id)
        })
    }

    /// Waits for the compute stream's work, at most `SHARDC_COMM_TIMEOUT` (300 s by default):
    /// a stream held up by a collective whose members never all arrive ends in an
    /// [`AscendError::Timeout`] instead of waiting for ever.
    pub fn synchronize(&self) -> AscendResult<()> {
        self.synchronize_stream(self.compute)
    }

    /// As [`AscendDevice::synchronize`], for `stream`.
    pub fn synchronize_stream(&self, stream: Stream) -> AscendResult<()> {
        if self.synchronize_within(stream, self.timeout)? {
            return Ok(());
        }
        Err(AscendError::Timeout {
            what: format!(
                "the {} stream of device {}",
                if stream == self.comm {
                    "communication"
                } else {
                    "compute"
                },
                self.id
            ),
            timeout: self.timeout,
        })
    }

    /// The bound of the host's waits (`SHARDC_COMM_TIMEOUT`).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Waits at most `timeout` for `stream`'s work: `Ok(false)` when it did not finish in time
    /// (`ACL_ERROR_RT_STREAM_SYNC_TIMEOUT`; the work stays queued).
    pub fn synchronize_within(&self, stream: Stream, timeout: Duration) -> AscendResult<bool> {
        self.bind()?;
        let ms = i32::try_from(timeout.as_millis())
            .unwrap_or(i32::MAX)
            .max(1);
        // SAFETY: a stream of this device.
        let code = unsafe { (self.api.aclrtSynchronizeStreamWithTimeout)(stream.raw(), ms) };
        if code == sys::ACL_ERROR_RT_STREAM_SYNC_TIMEOUT {
            return Ok(false);
        }
        self.check("aclrtSynchronizeStreamWithTimeout", code, || {
            format!("a stream of device {} ({ms} ms)", self.id)
        })?;
        Ok(true)
    }

    /// A new event.
    pub fn event(&self) -> AscendResult<Event> {
        self.bind()?;
        let mut e: sys::aclrtEvent = std::ptr::null_mut();
        // SAFETY: writes one handle.
        let code = unsafe { (self.api.aclrtCreateEvent)(&mut e) };
        self.check("aclrtCreateEvent", code, || {
            format!("on device {}", self.id)
        })?;
        Ok(Event(e as usize))
    }

    /// Destroys `e`.
    pub fn destroy_event(&self, e: Event) {
        let _ = self.bind();
        // SAFETY: an event of this device, destroyed once.
        unsafe { (self.api.aclrtDestroyEvent)(e.raw()) };
    }

    /// Records `e` on `stream` (it completes when the work issued so far does).
    pub fn record(&self, e: Event, stream: Stream) -> AscendResult<()> {
        // SAFETY: handles of this device.
        let code = unsafe { (self.api.aclrtRecordEvent)(e.raw(), stream.raw()) };
        self.check("aclrtRecordEvent", code, || {
            format!("on device {}", self.id)
        })
    }

    /// Makes `stream`'s later work wait for `e`.
    pub fn wait(&self, stream: Stream, e: Event) -> AscendResult<()> {
        // SAFETY: handles of this device.
        let code = unsafe { (self.api.aclrtStreamWaitEvent)(stream.raw(), e.raw()) };
        self.check("aclrtStreamWaitEvent", code, || {
            format!("on device {}", self.id)
        })
    }
}

impl Drop for AscendDevice {
    fn drop(&mut self) {
        if self.bind().is_ok() {
            for s in [self.compute, self.comm] {
                // A stream still held up past the timeout (a lost peer) is left to the
                // process's end rather than waited for without bound.
                if matches!(self.synchronize_within(s, self.timeout), Ok(true)) {
                    // SAFETY: the device's own stream, destroyed once, after its work.
                    unsafe { (self.api.aclrtDestroyStream)(s.raw()) };
                }
            }
        }
    }
}

fn set_device(api: &Api, id: i32) -> AscendResult<()> {
    if CURRENT.with(Cell::get) == id {
        return Ok(());
    }
    // SAFETY: plain call.
    let code = unsafe { (api.aclrtSetDevice)(id) };
    check(api, "aclrtSetDevice", code, || format!("device {id}"))?;
    CURRENT.with(|c| c.set(id));
    Ok(())
}
