//! A device that runs the CUDA kernel sources on the host (see `kernels/emulator.hpp`).
//!
//! For tests on machines without a GPU, CI included: the same `kernels/*.cu` text NVRTC
//! compiles is compiled by the host C++ compiler (`$CXX`, else `g++`, else `c++`; C++20) into
//! a shared library, once per source version, cached in the temporary directory. Memory is
//! host memory; copies are checked against the allocations; GEMM is a column-major reference
//! loop with cuBLAS's argument conventions. Everything the executor does on a GPU (kernel
//! choice, arguments, grids, the memory plan, the GEMM mapping) runs the same here; only the
//! driver, cuBLAS and NCCL calls themselves are not exercised (NCCL's are emulated between
//! the devices of one process by [`crate::nccl::emulated`]). The compute stream runs each
//! operation as it is issued; the communication stream keeps its work until the compute
//! stream waits for it ([`EmulatedDevice::run_on_comm_stream`]).
//!
//! [`EmulatedDevice::with_reference_library`] adds a stand-in for cuDNN: convolutions that
//! cuDNN would take ([`crate::cudnn::unsupported`]) run as reference loops through
//! [`Device::library_conv`], so the lowering's library path (which buffer is which, in each
//! direction, and the fallback) is tested without a GPU; cuDNN itself is not.

use crate::device::{ConvDirection, Device, Gemm, LibraryConv};
use crate::error::{CudaError, CudaResult};
use crate::kernels::{self, DevPtr, KernelArg};
use sha2::{Digest, Sha256};
use shardc_ir::DType;
use std::alloc::Layout;
use std::collections::{BTreeMap, HashMap};
use std::ffi::c_void;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};

const HEADER: &str = include_str!("../kernels/emulator.hpp");

type Thunk = unsafe extern "C" fn(*mut *mut c_void);
type LaunchFn = unsafe extern "C" fn(Thunk, u32, u32, *mut *mut c_void) -> i32;

/// One compiled library of kernels with its own launch function (and so its own emulation
/// state: a library's kernels are launched through its own `shardc_emu_launch`).
struct Module {
    library: libloading::Library,
    launch_fn: LaunchFn,
    names: Vec<String>,
}

/// Work of another layer carried out on an emulated device's memory in stream order
/// (emulated NCCL calls): run at once, or recorded and run at each replay.
pub type HostWork = Arc<dyn Fn(&EmulatedDevice) -> CudaResult<()> + Send + Sync>;

/// Work recorded between [`Device::begin_capture`] and [`Device::end_capture`], with its
/// arguments' values at the time, as a CUDA Graph records it.
#[derive(Clone)]
enum Recorded {
    Launch {
        name: String,
        grid: u32,
        block: u32,
        args: Vec<KernelArg>,
    },
    Gemm(Gemm),
    Copy {
        dst: DevPtr,
        src: DevPtr,
        bytes: usize,
    },
    Conv(LibraryConv),
    Host(HostWork),
}

impl std::fmt::Debug for Recorded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Recorded::Launch {
                name, grid, block, ..
            } => write!(f, "launch {name} <<<{grid}, {block}>>>"),
            Recorded::Gemm(g) => write!(f, "{g:?}"),
            Recorded::Copy { dst, src, bytes } => {
                write!(f, "copy {bytes} bytes {src:#x} -> {dst:#x}")
            }
            Recorded::Conv(c) => write!(f, "{c:?}"),
            Recorded::Host(_) => write!(f, "host work"),
        }
    }
}

/// A recording in progress: the work so far, or what spoiled it.
#[derive(Default)]
struct Capture {
    work: Vec<Recorded>,
    spoiled: Option<String>,
}

/// The host-emulated device (see the module doc).
pub struct EmulatedDevice {
    /// The kernel sources' library first, then any loaded with `load_kernels`.
    modules: Mutex<Vec<Module>>,
    thunks: Mutex<HashMap<String, (LaunchFn, Thunk)>>,
    names: Vec<String>,
    /// Live allocations: start -> layout.
    allocations: Mutex<BTreeMap<u64, Layout>>,
    block: u32,
    /// Whether [`Device::library_conv`] runs the reference convolutions.
    reference_library: bool,
    /// The instants of [`Device::mark`] (every operation here finishes before it returns).
    marks: Mutex<Vec<std::time::Instant>>,
    /// The recording in progress, if any.
    capture: Mutex<Option<Capture>>,
    /// Recorded graphs by number (None once dropped).
    graphs: Mutex<Vec<Option<Arc<Vec<Recorded>>>>>,
    /// The communication stream: work issued on it and not yet run, which runs when the
    /// compute stream is made to wait for it (or at a synchronisation), so that a reader
    /// that forgets to wait sees what a GPU may show it: the values from before.
    comm: Mutex<CommStream>,
}

/// See [`EmulatedDevice::run_on_comm_stream`].
#[derive(Default)]
struct CommStream {
    /// How many pieces of work have been issued.
    issued: u64,
    /// Those not run yet, by number.
    pending: std::collections::VecDeque<(u64, HostWork)>,
    /// Per event slot, the number of work it was recorded after.
    events: HashMap<usize, u64>,
}

impl std::fmt::Debug for EmulatedDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmulatedDevice")
            .field("kernels", &self.names.len())
            .finish()
    }
}

fn compiler() -> String {
    if let Ok(cxx) = std::env::var("CXX") {
        if !cxx.is_empty() {
            return cxx;
        }
    }
    for c in ["g++", "c++", "clang++"] {
        if Command::new(c).arg("--version").output().is_ok() {
            return c.to_string();
        }
    }
    "g++".to_string()
}

fn run(cmd: &mut Command, what: &str) -> CudaResult<Vec<u8>> {
    let out = cmd
        .output()
        .map_err(|e| CudaError::Emulator(format!("{what}: cannot start {cmd:?}: {e}")))?;
    if !out.status.success() {
        let log = String::from_utf8_lossy(&out.stderr);
        let log: String = log.lines().take(40).collect::<Vec<_>>().join("\n");
        return Err(CudaError::Emulator(format!(
            "{what} failed ({}):\n{log}",
            out.status
        )));
    }
    Ok(out.stdout)
}

/// The translation unit of the kernel sources: the header, the prelude, every source.
fn translation_unit() -> String {
    let mut text = String::new();
    for (name, source) in kernels::SOURCES {
        text.push_str(&format!("\n// ---- {name}\n{source}\n"));
    }
    unit_of(&text)
}

/// The translation unit of kernel text (without the prelude).
fn unit_of(text: &str) -> String {
    format!("#include \"emulator.hpp\"\n{}\n{text}\n", kernels::PRELUDE)
}

/// A name no other writer of this process or another uses at the same time (process id and a
/// counter): temporary files of [`write_atomic`] and the compiler's outputs.
fn unique_suffix() -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{}-{n}", std::process::id())
}

/// Writes `text` to `path` atomically (several processes, and several devices of one
/// process, may build the same cache at once).
fn write_atomic(path: &Path, text: &str) -> CudaResult<()> {
    let tmp = path.with_extension(format!("{}.tmp", unique_suffix()));
    std::fs::write(&tmp, text)
        .and_then(|_| std::fs::rename(&tmp, path))
        .map_err(|e| CudaError::Emulator(format!("cannot write {}: {e}", path.display())))
}

/// Every kernel name of a translation unit, found by preprocessing it with the host compiler.
fn kernel_names_in(dir: &Path, cxx: &str, unit_text: &str) -> CudaResult<Vec<String>> {
    let unit = dir.join(format!("kernels.{}.cpp", unique_suffix()));
    write_atomic(&unit, unit_text)?;
    let pre = run(
        Command::new(cxx)
            .args(["-std=c++20", "-E", "-P", "-D__global__=", "-I"])
            .arg(dir)
            .arg(&unit),
        "preprocessing the kernel sources",
    )?;
    let _ = std::fs::remove_file(&unit);
    let text = String::from_utf8_lossy(&pre);
    // Only what follows the header: its own extern "C" launch function is not a kernel.
    let names = kernels::extern_c_functions(&text)
        .into_iter()
        .filter(|n| n != "shardc_emu_launch")
        .collect();
    Ok(names)
}

/// Builds (or finds in the cache) the library of a translation unit, with thunks for `names`
/// (None: every kernel of the unit), and loads it.
fn module(unit_text: &str, names: Option<&[String]>) -> CudaResult<Module> {
    // One build at a time in the process: devices opened together (a rank each) find the
    // first one's build in the cache instead of compiling the same text side by side.
    static BUILDING: Mutex<()> = Mutex::new(());
    let _one = BUILDING.lock().unwrap_or_else(|p| p.into_inner());
    let mut h = Sha256::new();
    h.update(HEADER);
    h.update(unit_text);
    if let Some(n) = names {
        h.update(n.join(","));
    }
    let digest = h.finalize();
    let tag: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
    let dir = std::env::temp_dir().join(format!("shardc-cuda-emulator-{tag}"));
    std::fs::create_dir_all(&dir)
        .map_err(|e| CudaError::Emulator(format!("cannot create {}: {e}", dir.display())))?;
    write_atomic(&dir.join("emulator.hpp"), HEADER)?;
    let lib = dir.join("libshardc_emulated_kernels.so");
    let names_file = dir.join("kernels.txt");
    let cached: Option<Vec<String>> = if lib.exists() {
        std::fs::read_to_string(&names_file)
            .ok()
            .map(|t| t.lines().map(str::to_string).collect::<Vec<_>>())
            .filter(|n| !n.is_empty())
    } else {
        None
    };
    let names = match cached {
        Some(n) => n,
        None => {
            let cxx = compiler();
            let names = match names {
                Some(n) => n.to_vec(),
                None => kernel_names_in(&dir, &cxx, unit_text)?,
            };
            let mut unit = unit_text.to_string();
            for n in &names {
                unit.push_str(&format!(
                    "extern \"C\" void shardc_thunk_{n}(void** a) {{ shardc_emu::invoke({n}, a); }}\n"
                ));
            }
            let src = dir.join(format!("kernels_thunks.{}.cpp", unique_suffix()));
            write_atomic(&src, &unit)?;
            let tmp = dir.join(format!("lib.{}.tmp.so", unique_suffix()));
            run(
                Command::new(&cxx)
                    .args([
                        "-std=c++20",
                        "-O1",
                        "-shared",
                        "-fPIC",
                        "-pthread",
                        "-w",
                        "-I",
                    ])
                    .arg(&dir)
                    .arg(&src)
                    .arg("-o")
                    .arg(&tmp),
                "compiling the kernel sources for the host",
            )?;
            let _ = std::fs::remove_file(&src);
            std::fs::rename(&tmp, &lib)
                .map_err(|e| CudaError::Emulator(format!("cannot place {}: {e}", lib.display())))?;
            write_atomic(&names_file, &names.join("\n"))?;
            names
        }
    };
    // SAFETY: the library is ours, built from our sources; loading runs no initialisers
    // beyond the C++ runtime's.
    let library = unsafe { libloading::Library::new(&lib) }
        .map_err(|e| CudaError::Emulator(format!("cannot load {}: {e}", lib.display())))?;
    // SAFETY: the symbol is `shardc_emu_launch` of emulator.hpp with this signature.
    let launch_fn: LaunchFn = unsafe {
        *library
            .get::<LaunchFn>(b"shardc_emu_launch\0")
            .map_err(|e| CudaError::Emulator(format!("no launch entry: {e}")))?
    };
    Ok(Module {
        library,
        launch_fn,
        names,
    })
}

impl EmulatedDevice {
    /// Builds (or reuses the cached build of) the kernels for the host. `block` threads per
    /// block (a multiple of 32; 64 keeps tests quick).
    pub fn new(block: u32) -> CudaResult<EmulatedDevice> {
        if block == 0 || block % 32 != 0 || block > 1024 {
            return Err(CudaError::Emulator(format!(
                "block size {block} must be a multiple of 32 in 32..=1024"
            )));
        }
        let base = module(&translation_unit(), None)?;
        Ok(EmulatedDevice {
            names: base.names.clone(),
            modules: Mutex::new(vec![base]),
            thunks: Mutex::new(HashMap::new()),
            allocations: Mutex::new(BTreeMap::new()),
            block,
            reference_library: false,
            marks: Mutex::new(Vec::new()),
            capture: Mutex::new(None),
            graphs: Mutex::new(Vec::new()),
            comm: Mutex::new(CommStream::default()),
        })
    }

    /// Records `work` instead of running it when a recording is in progress (true then).
    fn recorded(&self, work: impl FnOnce() -> Recorded) -> bool {
        let mut c = self.capture.lock().unwrap_or_else(|p| p.into_inner());
        match c.as_mut() {
            Some(c) => {
                if c.spoiled.is_none() {
                    c.work.push(work());
                }
                true
            }
            None => false,
        }
    }

    /// An error, spoiling the recording, when one is in progress: `what` cannot be recorded
    /// (it involves the host), as on a GPU.
    fn not_while_recording(&self, what: &str) -> CudaResult<()> {
        let mut c = self.capture.lock().unwrap_or_else(|p| p.into_inner());
        match c.as_mut() {
            Some(c) => {
                let why = format!("{what} is not permitted while the stream is being recorded");
                c.spoiled.get_or_insert_with(|| why.clone());
                Err(CudaError::Emulator(why))
            }
            None => Ok(()),
        }
    }

    /// This device with a convolution library: reference loops standing in for cuDNN
    /// (see the module doc).
    pub fn with_reference_library(mut self) -> EmulatedDevice {
        self.reference_library = true;
        self
    }

    /// The kernel names the sources define.
    pub fn kernel_names(&self) -> &[String] {
        &self.names
    }

    fn thunk(&self, name: &str) -> CudaResult<(LaunchFn, Thunk)> {
        let mut map = self.thunks.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = map.get(name) {
            return Ok(*t);
        }
        let modules = self.modules.lock().unwrap_or_else(|p| p.into_inner());
        // The newest module first: kernels generated later may share a name with none.
        let m = modules
            .iter()
            .rev()
            .find(|m| m.names.iter().any(|n| n == name))
            .ok_or_else(|| CudaError::UnknownKernel(name.to_string()))?;
        let sym = format!("shardc_thunk_{name}\0");
        // SAFETY: every thunk has the signature `void(void**)`; the library stays loaded as
        // long as the device (modules are never removed).
        let t: Thunk = unsafe {
            *m.library
                .get::<Thunk>(sym.as_bytes())
                .map_err(|_| CudaError::UnknownKernel(name.to_string()))?
        };
        map.insert(name.to_string(), (m.launch_fn, t));
        Ok((m.launch_fn, t))
    }

    /// Checks that `[ptr, ptr + bytes)` lies in one live allocation.
    fn check_range(&self, ptr: DevPtr, bytes: usize, what: &str) -> CudaResult<()> {
        if bytes == 0 {
            return Ok(());
        }
        let allocs = self.allocations.lock().unwrap_or_else(|p| p.into_inner());
        match allocs.range(..=ptr).next_back() {
            Some((&start, layout)) if ptr + bytes as u64 <= start + layout.size() as u64 => Ok(()),
            _ => Err(CudaError::Emulator(format!(
                "{what}: {bytes} bytes at {ptr:#x} are outside every allocation"
            ))),
        }
    }
}

impl EmulatedDevice {
    /// Runs `work` now, or records it when a recording is in progress (it then runs at
    /// each replay, in order with the recorded kernels).
    pub fn run_or_record(&self, work: HostWork) -> CudaResult<()> {
        if self.recorded(|| Recorded::Host(work.clone())) {
            return Ok(());
        }
        work(self)
    }

    /// Issues `work` on the communication stream: it runs when the compute stream waits for an
    /// event recorded after it ([`Device::compute_after_comm`]), at a synchronisation, or
    /// before later work of [`EmulatedDevice::flush_comm`]'s callers; recorded in order while
    /// a recording is in progress. Work on the compute stream runs at once, so whatever it
    /// issued before is done when this runs ([`Device::comm_after_compute`] holds).
    pub fn run_on_comm_stream(&self, work: HostWork) -> CudaResult<()> {
        if self.recorded(|| Recorded::Host(work.clone())) {
            return Ok(());
        }
        let mut c = self.comm.lock().unwrap_or_else(|p| p.into_inner());
        c.issued += 1;
        let n = c.issued;
        c.pending.push_back((n, work));
        Ok(())
    }

    /// Runs the communication stream's pending work numbered up to `upto` (all: `u64::MAX`),
    /// in order.
    pub fn flush_comm(&self, upto: u64) -> CudaResult<()> {
        loop {
            let next = {
                let mut c = self.comm.lock().unwrap_or_else(|p| p.into_inner());
                match c.pending.front() {
                    Some((n, _)) if *n <= upto => c.pending.pop_front(),
                    _ => None,
                }
            };
            match next {
                Some((_, work)) => work(self)?,
                None => return Ok(()),
            }
        }
    }

    /// `bytes` bytes of device memory at `ptr` (checked against the allocations), for work
    /// running in stream order ([`EmulatedDevice::run_or_record`]).
    pub fn read_bytes(&self, ptr: DevPtr, bytes: usize) -> CudaResult<Vec<u8>> {
        self.check_range(ptr, bytes, "read")?;
        let mut out = vec![0u8; bytes];
        // SAFETY: the range is inside an allocation.
        unsafe { std::ptr::copy_nonoverlapping(ptr as *const u8, out.as_mut_ptr(), bytes) };
        Ok(out)
    }

    /// Writes `src` to device memory at `ptr` (checked), as [`EmulatedDevice::read_bytes`].
    pub fn write_bytes(&self, ptr: DevPtr, src: &[u8]) -> CudaResult<()> {
        self.check_range(ptr, src.len(), "write")?;
        // SAFETY: the range is inside an allocation.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), ptr as *mut u8, src.len()) };
        Ok(())
    }
}

impl Drop for EmulatedDevice {
    fn drop(&mut self) {
        let allocs =
            std::mem::take(&mut *self.allocations.lock().unwrap_or_else(|p| p.into_inner()));
        for (p, layout) in allocs {
            // SAFETY: allocated by `alloc` with this layout.
            unsafe { std::alloc::dealloc(p as *mut u8, layout) };
        }
    }
}

fn gemm_ref<T: Copy + Into<f64>>(g: &Gemm, from: impl Fn(f64) -> T) {
    let at = |base: u64, i: usize| base as *mut T as usize + i * std::mem::size_of::<T>();
    for bi in 0..g.batch {
        let (a0, b0, c0) = (bi * g.stride_a, bi * g.stride_b, bi * g.stride_c);
        for j in 0..g.n {
            for i in 0..g.m {
                let mut acc = 0.0f64;
                for p in 0..g.k {
                    let ai = if g.trans_a {
                        a0 + p + i * g.lda
                    } else {
                        a0 + i + p * g.lda
                    };
                    let bj = if g.trans_b {
                        b0 + j + p * g.ldb
                    } else {
                        b0 + p + j * g.ldb
                    };
                    // SAFETY: the caller checked the ranges.
                    let (x, y) =
                        unsafe { (*(at(g.a, ai) as *const T), *(at(g.b, bj) as *const T)) };
                    acc += x.into() * y.into();
                }
                let ci = at(g.c, c0 + i + j * g.ldc) as *mut T;
                // SAFETY: as above.
                unsafe {
                    let old: f64 = if g.beta == 0.0 { 0.0 } else { (*ci).into() };
                    *ci = from(g.alpha * acc + g.beta * old);
                }
            }
        }
    }
}

/// The reference convolution of [`EmulatedDevice::with_reference_library`]: every (output
/// pixel, filter tap) pair of `c`'s geometry, accumulated in f64 per written element for the
/// forward pass and scattered in that loop order for the gradients.
///
/// # Safety
/// The three buffers hold the geometry's elements of `T` (the caller checked the ranges).
unsafe fn conv_ref<T: Copy + Into<f64>>(c: &LibraryConv, from: impl Fn(f64) -> T) {
    let g = &c.geometry;
    let (cg, og) = (g.c_in / g.group, g.c_out / g.group);
    let x = |i: usize| c.x as *mut T as usize + i * std::mem::size_of::<T>();
    let w = |i: usize| c.w as *mut T as usize + i * std::mem::size_of::<T>();
    let y = |i: usize| c.y as *mut T as usize + i * std::mem::size_of::<T>();
    let (x_len, w_len) = (g.n * g.c_in * g.h * g.w, g.c_out * cg * g.kh * g.kw);
    // Gradients are sums over the loop below: start from zero.
    let mut acc_x = vec![
        0f64;
        if c.direction == ConvDirection::BackwardData {
            x_len
        } else {
            0
        }
    ];
    let mut acc_w = vec![
        0f64;
        if c.direction == ConvDirection::BackwardFilter {
            w_len
        } else {
            0
        }
    ];
    for n in 0..g.n {
        for o in 0..g.c_out {
            let group = o / og;
            for oy in 0..g.out_h {
                for ox in 0..g.out_w {
                    let yi = ((n * g.c_out + o) * g.out_h + oy) * g.out_w + ox;
                    let dy: f64 = if c.direction == ConvDirection::Forward {
                        0.0
                    } else {
                        (*(y(yi) as *const T)).into()
                    };
                    let mut sum = 0f64;
                    for ci in 0..cg {
                        for ky in 0..g.kh {
                            let iy = (oy * g.stride_h + ky * g.dil_h) as isize - g.pad_top as isize;
                            if iy < 0 || iy >= g.h as isize {
                                continue;
                            }
                            for kx in 0..g.kw {
                                let ix =
                                    (ox * g.stride_w + kx * g.dil_w) as isize - g.pad_left as isize;
                                if ix < 0 || ix >= g.w as isize {
                                    continue;
                                }
                                let xi = ((n * g.c_in + group * cg + ci) * g.h + iy as usize) * g.w
                                    + ix as usize;
                                let wi = ((o * cg + ci) * g.kh + ky) * g.kw + kx;
                                match c.direction {
                                    ConvDirection::Forward => {
                                        let (a, b): (f64, f64) = (
                                            (*(x(xi) as *const T)).into(),
                                            (*(w(wi) as *const T)).into(),
                                        );
                                        sum += a * b;
                                    }
                                    ConvDirection::BackwardData => {
                                        acc_x[xi] += (*(w(wi) as *const T)).into() * dy;
                                    }
                                    ConvDirection::BackwardFilter => {
                                        acc_w[wi] += (*(x(xi) as *const T)).into() * dy;
                                    }
                                }
                            }
                        }
                    }
                    if c.direction == ConvDirection::Forward {
                        *(y(yi) as *mut T) = from(sum);
                    }
                }
            }
        }
    }
    for (i, v) in acc_x.into_iter().enumerate() {
        *(x(i) as *mut T) = from(v);
    }
    for (i, v) in acc_w.into_iter().enumerate() {
        *(w(i) as *mut T) = from(v);
    }
}

impl Device for EmulatedDevice {
    fn description(&self) -> String {
        format!(
            "emulated on the host ({} kernels{})",
            self.names.len(),
            if self.reference_library {
                ", reference convolution library"
            } else {
                ""
            }
        )
    }

    fn block_size(&self) -> u32 {
        self.block
    }

    /// Twice the block (at most 1024), so the emulated suites run the wide kernels with
    /// another block size than the others.
    fn wide_block_size(&self) -> u32 {
        (self.block * 2).min(1024)
    }

    fn max_grid(&self) -> u32 {
        4
    }

    fn alloc(&self, bytes: usize) -> CudaResult<DevPtr> {
        let layout = Layout::from_size_align(bytes.max(1), 256)
            .map_err(|e| CudaError::Emulator(format!("allocation of {bytes} bytes: {e}")))?;
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { std::alloc::alloc(layout) };
        if p.is_null() {
            return Err(CudaError::OutOfMemory {
                requested: bytes,
                context: "emulated device".into(),
            });
        }
        self.allocations
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(p as u64, layout);
        Ok(p as u64)
    }

    fn free(&self, ptr: DevPtr) {
        let layout = self
            .allocations
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&ptr);
        if let Some(layout) = layout {
            // SAFETY: allocated by `alloc` with this layout and now forgotten.
            unsafe { std::alloc::dealloc(ptr as *mut u8, layout) };
        }
    }

    fn upload(&self, dst: DevPtr, src: &[u8]) -> CudaResult<()> {
        self.not_while_recording("an upload")?;
        self.check_range(dst, src.len(), "upload")?;
        // SAFETY: the range is inside an allocation.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst as *mut u8, src.len()) };
        Ok(())
    }

    fn download(&self, src: DevPtr, dst: &mut [u8]) -> CudaResult<()> {
        self.not_while_recording("a download")?;
        self.check_range(src, dst.len(), "download")?;
        // SAFETY: the range is inside an allocation.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    fn copy(&self, dst: DevPtr, src: DevPtr, bytes: usize) -> CudaResult<()> {
        self.check_range(dst, bytes, "copy (destination)")?;
        self.check_range(src, bytes, "copy (source)")?;
        if self.recorded(|| Recorded::Copy { dst, src, bytes }) {
            return Ok(());
        }
        // SAFETY: both ranges are inside allocations; `copy` allows overlap.
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, bytes) };
        Ok(())
    }

    fn launch(&self, name: &str, grid: u32, block: u32, args: &[KernelArg]) -> CudaResult<()> {
        let (launch_fn, thunk) = self.thunk(name)?;
        if self.recorded(|| Recorded::Launch {
            name: name.to_string(),
            grid,
            block,
            args: args.to_vec(),
        }) {
            return Ok(());
        }
        let mut params = kernels::params(args);
        // One launch at a time in the process: a library's block state is global, and every
        // device of the process loads the same cached libraries.
        static LAUNCHING: Mutex<()> = Mutex::new(());
        let _one = LAUNCHING.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: the thunk unpacks `params` as the kernel's parameter list; the executor
        // passes one value of the right type per parameter.
        let rc = unsafe { launch_fn(thunk, grid, block, params.as_mut_ptr()) };
        if rc != 0 {
            return Err(CudaError::Emulator(format!(
                "launch of {name} with grid {grid}, block {block} failed"
            )));
        }
        Ok(())
    }

    fn gemm(&self, g: &Gemm) -> CudaResult<()> {
        let size = g.dtype.size_bytes();
        // Bytes a column-major operand of `rows x cols` with leading dimension `ld` spans
        // over the batch.
        let span = |stride: usize, ld: usize, rows: usize, cols: usize| {
            if g.batch == 0 || rows == 0 || cols == 0 {
                0
            } else {
                ((g.batch - 1) * stride + ld * (cols - 1) + rows) * size
            }
        };
        let (a_rows, a_cols) = if g.trans_a { (g.k, g.m) } else { (g.m, g.k) };
        let (b_rows, b_cols) = if g.trans_b { (g.n, g.k) } else { (g.k, g.n) };
        if g.lda < a_rows || g.ldb < b_rows || g.ldc < g.m {
            return Err(CudaError::Emulator(format!(
                "gemm leading dimensions too small: {g:?}"
            )));
        }
        self.check_range(g.a, span(g.stride_a, g.lda, a_rows, a_cols), "gemm A")?;
        self.check_range(g.b, span(g.stride_b, g.ldb, b_rows, b_cols), "gemm B")?;
        self.check_range(g.c, span(g.stride_c, g.ldc, g.m, g.n), "gemm C")?;
        if !matches!(g.dtype, DType::Float32 | DType::Float64) {
            return Err(CudaError::Emulator(format!(
                "gemm of {} is not supported",
                g.dtype
            )));
        }
        if self.recorded(|| Recorded::Gemm(g.clone())) {
            return Ok(());
        }
        match g.dtype {
            DType::Float32 => gemm_ref::<f32>(g, |v| v as f32),
            DType::Float64 => gemm_ref::<f64>(g, |v| v),
            other => {
                return Err(CudaError::Emulator(format!(
                    "gemm of {other} is not supported"
                )))
            }
        }
        Ok(())
    }

    fn has_conv_library(&self) -> bool {
        self.reference_library
    }

    fn library_conv(&self, c: &LibraryConv) -> CudaResult<bool> {
        if !self.reference_library || crate::cudnn::unsupported(&c.geometry).is_some() {
            return Ok(false);
        }
        let g = &c.geometry;
        let size = c.dtype.size_bytes();
        let cg = g.c_in / g.group.max(1);
        self.check_range(c.x, g.n * g.c_in * g.h * g.w * size, "library_conv x")?;
        self.check_range(c.w, g.c_out * cg * g.kh * g.kw * size, "library_conv w")?;
        self.check_range(
            c.y,
            g.n * g.c_out * g.out_h * g.out_w * size,
            "library_conv y",
        )?;
        if !matches!(c.dtype, DType::Float32 | DType::Float64) {
            return Ok(false);
        }
        if self.recorded(|| Recorded::Conv(c.clone())) {
            return Ok(true);
        }
        // SAFETY: the ranges are inside allocations.
        unsafe {
            match c.dtype {
                DType::Float32 => conv_ref::<f32>(c, |v| v as f32),
                DType::Float64 => conv_ref::<f64>(c, |v| v),
                _ => return Ok(false),
            }
        }
        Ok(true)
    }

    fn mark(&self) -> CudaResult<Option<usize>> {
        self.not_while_recording("a timing mark")?;
        let mut m = self.marks.lock().unwrap_or_else(|p| p.into_inner());
        m.push(std::time::Instant::now());
        Ok(Some(m.len() - 1))
    }

    fn seconds_between(&self, a: usize, b: usize) -> CudaResult<f64> {
        let m = self.marks.lock().unwrap_or_else(|p| p.into_inner());
        match (m.get(a), m.get(b)) {
            (Some(&ta), Some(&tb)) => Ok(tb.saturating_duration_since(ta).as_secs_f64()),
            _ => Err(CudaError::Emulator(format!(
                "marks {a} and {b}: only {} recorded",
                m.len()
            ))),
        }
    }

    fn reset_marks(&self) {
        self.marks.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }

    fn synchronize(&self) -> CudaResult<()> {
        self.not_while_recording("a synchronization")?;
        self.flush_comm(u64::MAX)
    }

    fn comm_record(&self, slot: usize) -> CudaResult<()> {
        let mut c = self.comm.lock().unwrap_or_else(|p| p.into_inner());
        let n = c.issued;
        c.events.insert(slot, n);
        Ok(())
    }

    fn compute_after_comm(&self, slot: usize) -> CudaResult<()> {
        let upto = self
            .comm
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .events
            .get(&slot)
            .copied()
            .unwrap_or(0);
        self.flush_comm(upto)
    }

    fn begin_capture(&self) -> CudaResult<bool> {
        let mut c = self.capture.lock().unwrap_or_else(|p| p.into_inner());
        if c.is_some() {
            return Err(CudaError::Emulator(
                "a recording is already in progress".into(),
            ));
        }
        *c = Some(Capture::default());
        Ok(true)
    }

    fn end_capture(&self) -> CudaResult<usize> {
        let c = self
            .capture
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .ok_or_else(|| CudaError::Emulator("no recording is in progress".into()))?;
        if let Some(why) = c.spoiled {
            return Err(CudaError::Emulator(format!(
                "the recording was discarded: {why}"
            )));
        }
        let mut graphs = self.graphs.lock().unwrap_or_else(|p| p.into_inner());
        graphs.push(Some(Arc::new(c.work)));
        Ok(graphs.len() - 1)
    }

    fn replay(&self, graph: usize) -> CudaResult<()> {
        let work = self
            .graphs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(graph)
            .cloned()
            .flatten()
            .ok_or_else(|| CudaError::Emulator(format!("no recorded graph {graph}")))?;
        for w in work.iter() {
            match w {
                Recorded::Launch {
                    name,
                    grid,
                    block,
                    args,
                } => self.launch(name, *grid, *block, args)?,
                Recorded::Gemm(g) => self.gemm(g)?,
                Recorded::Copy { dst, src, bytes } => self.copy(*dst, *src, *bytes)?,
                Recorded::Conv(c) => {
                    self.library_conv(c)?;
                }
                Recorded::Host(work) => work(self)?,
            }
        }
        Ok(())
    }

    fn drop_graph(&self, graph: usize) {
        if let Some(g) = self
            .graphs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(graph)
        {
            *g = None;
        }
    }

    fn load_kernels(&self, _unit: &str, text: &str, names: &[String]) -> CudaResult<()> {
        let m = module(&unit_of(text), Some(names))?;
        self.modules
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(m);
        Ok(())
    }
}
