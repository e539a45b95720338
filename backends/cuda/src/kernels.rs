//! The kernel sources, their parameter blocks, and the arguments a launch passes.
//!
//! Each source in `kernels/` is prefixed with `kernels/prelude.cuh` and compiled as one
//! module: by NVRTC to PTX for a GPU ([`compile_ptx`]) and to SASS for the GPU at hand
//! ([`compile_cubin_text`], which loads without the driver's JIT, also where the driver is
//! older than NVRTC within its major version), or by the host C++ compiler for the emulated
//! device (`crate::emulator`). NVRTC's output is cached on disk by a hash of all it depends
//! on ([`ptx_cache_path`]), so only the first process after a change pays for NVRTC.
//! Kernels are `extern "C"`, named
//! `<family>_<dtype>` (`softmax_f32`); a launch names one and passes its parameters in order
//! as [`KernelArg`]s, the way `cuLaunchKernel` takes them (a pointer to each value).

use crate::error::{CudaError, CudaResult};
use sha2::{Digest, Sha256};
use std::ffi::c_void;
use std::path::PathBuf;

/// The prelude every source starts with.
pub const PRELUDE: &str = include_str!("../kernels/prelude.cuh");

/// The elementwise source (its op templates are what fused kernels call).
pub const ELEMENTWISE: &str = include_str!("../kernels/elementwise.cu");

/// The kernel sources: (file name, text).
pub const SOURCES: &[(&str, &str)] = &[
    ("elementwise.cu", ELEMENTWISE),
    ("reduce.cu", include_str!("../kernels/reduce.cu")),
    ("norm.cu", include_str!("../kernels/norm.cu")),
    ("loss.cu", include_str!("../kernels/loss.cu")),
    ("optim.cu", include_str!("../kernels/optim.cu")),
    ("movement.cu", include_str!("../kernels/movement.cu")),
    ("conv.cu", include_str!("../kernels/conv.cu")),
    ("pool.cu", include_str!("../kernels/pool.cu")),
    ("batch_norm.cu", include_str!("../kernels/batch_norm.cu")),
];

/// The most dims a [`Strided`] describes.
pub const MAX_RANK: usize = 8;

/// The twin of the prelude's `struct Strided`: a result's dims and, per dim, the element
/// strides of up to two operands (0 where an operand is broadcast). `rank == 0` means every
/// operand is contiguous with the result's length.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Strided {
    /// Number of dims used (0: contiguous).
    pub rank: i32,
    /// Padding (the C struct's).
    pub pad: i32,
    /// The result's dims.
    pub out: [i64; MAX_RANK],
    /// Operand a's strides per result dim.
    pub a: [i64; MAX_RANK],
    /// Operand b's strides per result dim.
    pub b: [i64; MAX_RANK],
}

impl Strided {
    /// Contiguous operands.
    pub fn contiguous() -> Strided {
        Strided::default()
    }

    /// The broadcast of operands of shapes `a` and `b` (numpy rules, right-aligned) to `out`;
    /// None when a shape does not broadcast or the rank exceeds [`MAX_RANK`]. Dims of 1 in the
    /// result are dropped and contiguous runs merged, so most calls end up small.
    pub fn broadcast(out: &[usize], a: &[usize], b: &[usize]) -> Option<Strided> {
        if a == out && b == out {
            return Some(Strided::contiguous());
        }
        let sa = broadcast_strides(out, a)?;
        let sb = broadcast_strides(out, b)?;
        Strided::from_parts(out, &sa, &sb)
    }

    /// A gather of one operand through per-result-dim strides (a transpose, a broadcast).
    pub fn single(out: &[usize], strides: &[i64]) -> Option<Strided> {
        Strided::from_parts(out, strides, &vec![0; out.len()])
    }

    fn from_parts(out: &[usize], sa: &[i64], sb: &[i64]) -> Option<Strided> {
        // Drop dims of 1; merge a dim into the previous one when both operands step through
        // them contiguously.
        let mut dims: Vec<(i64, i64, i64)> = Vec::new();
        for i in 0..out.len() {
            let (n, x, y) = (out[i] as i64, sa[i], sb[i]);
            if n == 1 {
                continue;
            }
            if let Some(last) = dims.last_mut() {
                if last.1 == x * n && last.2 == y * n {
                    *last = (last.0 * n, x, y);
                    continue;
                }
            }
            dims.push((n, x, y));
        }
        if dims.is_empty() {
            dims.push((1, 0, 0));
        }
        if dims.len() > MAX_RANK {
            return None;
        }
        let mut s = Strided {
            rank: dims.len() as i32,
            ..Strided::default()
        };
        for (i, (n, x, y)) in dims.into_iter().enumerate() {
            s.out[i] = n;
            s.a[i] = x;
            s.b[i] = y;
        }
        Some(s)
    }
}

/// Row-major element strides of `shape`.
pub fn contiguous_strides(shape: &[usize]) -> Vec<i64> {
    let mut st = vec![0i64; shape.len()];
    let mut acc = 1i64;
    for i in (0..shape.len()).rev() {
        st[i] = acc;
        acc *= shape[i] as i64;
    }
    st
}

/// The strides of an operand of shape `x` broadcast to `out` (right-aligned; 0 on broadcast
/// dims), or None when it does not broadcast.
pub fn broadcast_strides(out: &[usize], x: &[usize]) -> Option<Vec<i64>> {
    if x.len() > out.len() {
        return None;
    }
    let own = contiguous_strides(x);
    let lead = out.len() - x.len();
    let mut st = vec![0i64; out.len()];
    for i in 0..x.len() {
        let (d, o) = (x[i], out[lead + i]);
        if d == o {
            st[lead + i] = if d == 1 { 0 } else { own[i] };
        } else if d != 1 {
            return None;
        }
    }
    Some(st)
}

/// A device address (as `CUdeviceptr`; a host address on the emulated device). 0 is null.
pub type DevPtr = u64;

/// One kernel parameter, by value.
#[derive(Clone, Debug, PartialEq)]
pub enum KernelArg {
    /// A pointer (`const float*`, `int*`); 0 for null.
    Ptr(DevPtr),
    /// `i64` (the prelude's `i64`, `long long`).
    I64(i64),
    /// `int`.
    I32(i32),
    /// `double`.
    F64(f64),
    /// `Strided` by value.
    Strided(Box<Strided>),
}

impl KernelArg {
    /// A pointer to the value, as `cuLaunchKernel`'s `kernelParams` holds it. Valid while
    /// `self` lives and is not moved.
    pub fn as_param(&self) -> *mut c_void {
        match self {
            KernelArg::Ptr(p) => p as *const u64 as *mut c_void,
            KernelArg::I64(v) => v as *const i64 as *mut c_void,
            KernelArg::I32(v) => v as *const i32 as *mut c_void,
            KernelArg::F64(v) => v as *const f64 as *mut c_void,
            KernelArg::Strided(s) => &**s as *const Strided as *mut c_void,
        }
    }
}

/// The kernel parameter list of `args` (pointers into `args`).
pub fn params(args: &[KernelArg]) -> Vec<*mut c_void> {
    args.iter().map(KernelArg::as_param).collect()
}

/// A source with its prelude, as one compilation unit.
pub fn unit(text: &str) -> String {
    format!("{PRELUDE}\n{text}")
}

/// Compiles source `name` of [`SOURCES`] to PTX with NVRTC for `arch` (`compute_90`; None:
/// NVRTC's default). TF32 never enters: these are plain f32/f64 kernels.
pub fn compile_ptx(name: &str, arch: Option<&str>) -> CudaResult<String> {
    let text = SOURCES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, t)| *t)
        .ok_or_else(|| CudaError::Other(format!("no kernel source named {name}")))?;
    compile_ptx_text(name, text, arch)
}

/// The environment variable naming the folder of compiled PTX (`0` or `off`: no cache);
/// default `shardc-ptx-cache` in the temporary directory.
pub const PTX_CACHE_ENV: &str = "SHARDC_PTX_CACHE";

/// What NVRTC makes of a source.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Image {
    /// PTX for a virtual architecture (`compute_90`), compiled by the driver at load.
    Ptx,
    /// SASS for one GPU (`sm_90`), loaded as it is.
    Cubin,
}

/// NVRTC's options for `arch` (part of the cache key).
fn nvrtc_options(arch: Option<&str>) -> Vec<String> {
    let mut v = vec![
        // IEEE division and square root, no flush-to-zero: results within 1e-5 of the CPU's.
        "--ftz=false".to_string(),
        "--prec-sqrt=true".into(),
        "--prec-div=true".into(),
    ];
    if let Some(a) = arch {
        v.push(format!("--gpu-architecture={a}"));
    }
    v.push("--std=c++17".into());
    v
}

/// Where NVRTC's output for `text` (a unit without the prelude) and `arch` is cached, or None
/// when `SHARDC_PTX_CACHE` turns the cache off. The name is a SHA-256 of everything the output
/// depends on: NVRTC's version, the options, the prelude and the text.
fn cache_path(text: &str, arch: Option<&str>, image: Image) -> CudaResult<Option<PathBuf>> {
    crate::probe::require(crate::probe::Library::Nvrtc)?;
    let dir = match std::env::var_os(PTX_CACHE_ENV) {
        Some(v) if v == "0" || v == "off" => return Ok(None),
        Some(v) if !v.is_empty() => PathBuf::from(v),
        _ => std::env::temp_dir().join("shardc-ptx-cache"),
    };
    let (major, minor) = nvrtc_version();
    let mut h = Sha256::new();
    h.update(format!(
        "nvrtc {major}.{minor}\0{:?}\0",
        nvrtc_options(arch)
    ));
    h.update(unit(text));
    let digest: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    let ext = match image {
        Image::Ptx => "ptx",
        Image::Cubin => "cubin",
    };
    Ok(Some(dir.join(format!("{digest}.{ext}"))))
}

/// NVRTC's version (major, minor); NVRTC must have been probed
/// (`probe::require(Library::Nvrtc)`).
pub fn nvrtc_version() -> (i32, i32) {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: NVRTC is loaded (probed by the callers); the call writes two ints.
    unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    (major, minor)
}

/// Where the PTX of `text` (a unit without the prelude) for `arch` is cached, or None when
/// `SHARDC_PTX_CACHE` turns the cache off.
pub fn ptx_cache_path(text: &str, arch: Option<&str>) -> CudaResult<Option<PathBuf>> {
    cache_path(text, arch, Image::Ptx)
}

/// Whether `bytes` look like a whole `image` (a cache entry cut short or damaged does not).
fn whole(bytes: &[u8], image: Image) -> bool {
    match image {
        Image::Ptx => std::str::from_utf8(bytes)
            .is_ok_and(|p| p.contains(".version") && p.contains(".target") && p.ends_with('\n')),
        // An ELF file: the magic, and at least its header.
        Image::Cubin => bytes.len() >= 64 && bytes.starts_with(b"\x7fELF"),
    }
}

/// NVRTC's `image` of kernel source `text` (without the prelude) named `name`, or the cached
/// one of an earlier compilation ([`cache_path`]): every process that opens a device compiles
/// the same sources, and NVRTC takes about a second for them. A damaged entry is compiled
/// again; a cache that cannot be written is only not used.
fn compile_cached(name: &str, text: &str, arch: Option<&str>, image: Image) -> CudaResult<Vec<u8>> {
    let cached = cache_path(text, arch, image)?;
    if let Some(path) = &cached {
        if let Ok(bytes) = std::fs::read(path) {
            if whole(&bytes, image) {
                return Ok(bytes);
            }
        }
    }
    let bytes = compile_with_nvrtc(name, text, arch, image)?;
    if let Some(path) = &cached {
        // Written aside, then renamed: a reader never sees half a file.
        if let Some(dir) = path.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        let tmp = path.with_extension(format!("{}.tmp", std::process::id()));
        if std::fs::write(&tmp, &bytes).is_ok() && std::fs::rename(&tmp, path).is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
    }
    Ok(bytes)
}

/// Compiles kernel source `text` (without the prelude) named `name` to PTX for `arch`
/// (`compute_90`; None: NVRTC's default), through the cache.
pub fn compile_ptx_text(name: &str, text: &str, arch: Option<&str>) -> CudaResult<String> {
    let bytes = compile_cached(name, text, arch, Image::Ptx)?;
    String::from_utf8(bytes)
        .map_err(|_| CudaError::Other(format!("NVRTC's PTX of {name} is not UTF-8")))
}

/// Compiles kernel source `text` (without the prelude) named `name` to SASS for GPU `sm`
/// (`sm_90`), through the cache: an ELF image `cuModuleLoadData` takes without JIT.
pub fn compile_cubin_text(name: &str, text: &str, sm: &str) -> CudaResult<Vec<u8>> {
    if !sm.starts_with("sm_") {
        return Err(CudaError::Other(format!(
            "a cubin is for one GPU (sm_XY), not {sm}"
        )));
    }
    compile_cached(name, text, Some(sm), Image::Cubin)
}

/// Compiles with NVRTC.
fn compile_with_nvrtc(
    name: &str,
    text: &str,
    arch: Option<&str>,
    image: Image,
) -> CudaResult<Vec<u8>> {
    use cudarc::nvrtc::{result, sys};
    crate::probe::require(crate::probe::Library::Nvrtc)?;
    let err = |log: String| CudaError::Compile {
        source_name: name.to_string(),
        log,
    };
    let src = std::ffi::CString::new(unit(text))
        .map_err(|_| err("the source holds a NUL byte".into()))?;
    let cname =
        std::ffi::CString::new(name).map_err(|_| err("the name holds a NUL byte".into()))?;
    let prog = result::create_program(&src, Some(&cname)).map_err(|e| err(format!("{e:?}")))?;
    // SAFETY: `prog` is a live program until destroyed below; the buffers are sized by
    // NVRTC's own size queries.
    let out = unsafe {
        match result::compile_program(prog, &nvrtc_options(arch)) {
            Err(e) => {
                let log = result::get_program_log(prog)
                    .map(|l| {
                        std::ffi::CStr::from_ptr(l.as_ptr())
                            .to_string_lossy()
                            .into_owned()
                    })
                    .unwrap_or_else(|_| format!("{e:?}"));
                Err(err(log))
            }
            Ok(()) => match image {
                Image::Ptx => result::get_ptx(prog)
                    .map(|p| {
                        let mut b: Vec<u8> = p.iter().map(|&c| c as u8).collect();
                        while b.last() == Some(&0) {
                            b.pop();
                        }
                        b
                    })
                    .map_err(|e| err(format!("nvrtcGetPTX: {e:?}"))),
                Image::Cubin => {
                    let mut size = 0usize;
                    let mut r = sys::nvrtcGetCUBINSize(prog, &mut size).result();
                    let mut buf = vec![0u8; size];
                    if r.is_ok() {
                        r = sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr() as *mut _).result();
                    }
                    r.map(|()| buf)
                        .map_err(|e| err(format!("nvrtcGetCUBIN: {e:?}")))
                }
            },
        }
    };
    // SAFETY: created above, released once.
    let _ = unsafe { result::destroy_program(prog) };
    out
}

/// The names of the kernels (`.entry` symbols) in a PTX text.
pub fn ptx_entries(ptx: &str) -> Vec<String> {
    ptx.lines()
        .filter_map(|l| {
            let l = l.trim_start();
            let rest = l
                .strip_prefix(".visible .entry ")
                .or_else(|| l.strip_prefix(".entry "))?;
            Some(rest.split(['(', ' ']).next()?.to_string())
        })
        .collect()
}

/// The kernel names (after macro expansion) of a preprocessed source: every
/// `extern "C" void NAME(` in it.
pub fn extern_c_functions(preprocessed: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = preprocessed;
    while let Some(i) = rest.find("extern \"C\"") {
        rest = &rest[i + 10..];
        let head = rest.trim_start();
        let Some(after_void) = head.strip_prefix("void") else {
            continue;
        };
        let name: String = after_void
            .trim_start()
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if !name.is_empty() {
            names.push(name);
        }
    }
    names
}
