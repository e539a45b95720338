//! Finding the CUDA libraries before cudarc touches them.
//!
//! cudarc opens every library lazily and **panics** when one is missing (at every call, not
//! once). So nothing in this crate calls into a library before [`require`] has opened it with
//! the same names cudarc would try; a missing one becomes a [`MissingLibrary`] error that
//! says which library, which file names were tried, what `LD_LIBRARY_PATH` held, and how to
//! make it findable.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The environment variable naming extra folders (`:`-separated) to load CUDA libraries from.
pub const LIB_DIRS_ENV: &str = "SHARDC_CUDA_LIB_DIRS";

/// Libraries opened by [`preload`], kept open for the process's life.
static PRELOADED: Mutex<Vec<(PathBuf, libloading::Library)>> = Mutex::new(Vec::new());

/// A CUDA library this backend uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Library {
    /// The driver API (`libcuda.so`, shipped with the NVIDIA driver).
    Driver,
    /// The runtime compiler (`libnvrtc.so`): the kernels are compiled when first used.
    Nvrtc,
    /// cuBLAS (`libcublas.so`): MatMul and BatchMatMul.
    Cublas,
    /// cuBLASLt (`libcublasLt.so`), which cuBLAS itself loads.
    CublasLt,
    /// NCCL (`libnccl.so`): collectives between GPUs.
    Nccl,
    /// cuDNN (`libcudnn.so`): convolutions. Optional: without it they run as im2col + cuBLAS.
    Cudnn,
}

impl Library {
    /// Every library, in the order a GPU run needs them.
    pub const ALL: [Library; 6] = [
        Library::Driver,
        Library::Nvrtc,
        Library::Cublas,
        Library::CublasLt,
        Library::Nccl,
        Library::Cudnn,
    ];

    /// The name cudarc builds file names from (`cuda` -> `libcuda.so`, `libcuda.so.1`, ...).
    pub fn stem(self) -> &'static str {
        match self {
            Library::Driver => "cuda",
            Library::Nvrtc => "nvrtc",
            Library::Cublas => "cublas",
            Library::CublasLt => "cublasLt",
            Library::Nccl => "nccl",
            Library::Cudnn => "cudnn",
        }
    }

    /// What the library does for shardc.
    pub fn purpose(self) -> &'static str {
        match self {
            Library::Driver => "the CUDA driver API",
            Library::Nvrtc => "the runtime compiler that builds shardc's kernels",
            Library::Cublas => "cuBLAS, for MatMul and BatchMatMul",
            Library::CublasLt => "cuBLASLt, which cuBLAS loads",
            Library::Nccl => "NCCL, for collectives between GPUs",
            Library::Cudnn => {
                "cuDNN, for convolutions (optional: im2col + cuBLAS run them without it)"
            }
        }
    }

    /// The file names tried, in cudarc's order.
    pub fn candidates(self) -> Vec<String> {
        let mut names = cudarc::get_lib_name_candidates(self.stem());
        if self == Library::Driver {
            names.extend(cudarc::get_lib_name_candidates("nvcuda"));
        }
        let mut seen = std::collections::HashSet::new();
        names.retain(|n| seen.insert(n.clone()));
        names
    }

    /// How to make the library findable.
    pub fn hint(self) -> &'static str {
        match self {
            Library::Driver => {
                "libcuda.so comes with the NVIDIA driver, not with the CUDA toolkit or pip: install \
                 the driver (`nvidia-smi` must work), or use --device-target CPU"
            }
            Library::Nvrtc => {
                "install CUDA 13, or `pip install nvidia-cuda-nvrtc==13.0.*` and put its lib folder \
                 (site-packages/nvidia/cu13/lib or site-packages/nvidia/cuda_nvrtc/lib) on \
                 LD_LIBRARY_PATH"
            }
            Library::Cublas | Library::CublasLt => {
                "install CUDA 13, or `pip install nvidia-cublas==13.*` and put its lib folder on \
                 LD_LIBRARY_PATH"
            }
            Library::Nccl => {
                "pip's NVIDIA NCCL wheel ships only libnccl.so.2, a name cudarc does not try: make a \
                 folder with a link `ln -s .../nvidia/nccl/lib/libnccl.so.2 DIR/libnccl.so` and put \
                 DIR on LD_LIBRARY_PATH"
            }
            Library::Cudnn => {
                "install cuDNN 9, or `pip install nvidia-cudnn-cu13` and put its lib folder \
                 (site-packages/nvidia/cudnn/lib) on LD_LIBRARY_PATH; without it convolutions run \
                 as im2col + cuBLAS"
            }
        }
    }

    /// Whether the library opens, without panicking when it does not.
    pub fn present(self) -> bool {
        // SAFETY: the `is_culib_present` functions only try `dlopen` on the candidate names.
        unsafe {
            match self {
                Library::Driver => cudarc::driver::sys::is_culib_present(),
                Library::Nvrtc => cudarc::nvrtc::sys::is_culib_present(),
                Library::Cublas => cudarc::cublas::sys::is_culib_present(),
                Library::CublasLt => cudarc::cublaslt::sys::is_culib_present(),
                Library::Nccl => cudarc::nccl::sys::is_culib_present(),
                Library::Cudnn => cudarc::cudnn::sys::is_culib_present(),
            }
        }
    }
}

impl fmt::Display for Library {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "lib{}.so", self.stem())
    }
}

/// A library that could not be opened: the error every GPU entry point returns instead of
/// cudarc's panic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MissingLibrary {
    /// The library.
    pub library: Library,
    /// The file names tried.
    pub tried: Vec<String>,
    /// `LD_LIBRARY_PATH` at the time (None when unset).
    pub ld_library_path: Option<String>,
}

impl fmt::Display for MissingLibrary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "CUDA not found: {} ({}) could not be opened; tried {}; LD_LIBRARY_PATH is {}. {} \
             (or name the folder in {LIB_DIRS_ENV})",
            self.library,
            self.library.purpose(),
            self.tried.join(", "),
            self.ld_library_path
                .as_deref()
                .map_or_else(|| "unset".to_string(), |p| format!("`{p}`")),
            self.library.hint()
        )
    }
}

impl std::error::Error for MissingLibrary {}

/// Opens, by absolute path, every CUDA library file of `dirs` (`libnvrtc.so.13`,
/// `libnvrtc-builtins.so.13.0`, `libcublas.so.13`, ...), so that cudarc's later lookups by
/// file name find the loaded library (the dynamic loader reuses a loaded library whose
/// soname matches): pip's NVIDIA wheels work without `LD_LIBRARY_PATH`, which only takes
/// effect when a process starts. Returns the files newly loaded. A file that does not load
/// is skipped (the probe then reports the library as missing, with the usual hint).
pub fn preload(dirs: &[PathBuf]) -> Vec<PathBuf> {
    let mut loaded = PRELOADED.lock().unwrap_or_else(|p| p.into_inner());
    let mut new = Vec::new();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        let mut files: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| is_cuda_library(p))
            .collect();
        // Dependencies first: builtins before nvrtc, cublasLt before cublas, cuDNN's parts
        // (`libcudnn_graph`, `libcudnn_ops`, ...) before the `libcudnn` that opens them.
        files.sort_by_key(|p| {
            let n = p
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            (
                !(n.contains("builtins") || n.contains("cublasLt") || n.contains("cudnn_")),
                n,
            )
        });
        for f in files {
            if loaded.iter().any(|(p, _)| *p == f) {
                continue;
            }
            // SAFETY: NVIDIA's libraries run no initialisers that depend on our state.
            if let Ok(lib) = unsafe { libloading::Library::new(&f) } {
                loaded.push((f.clone(), lib));
                new.push(f);
            }
        }
    }
    new
}

fn is_cuda_library(p: &Path) -> bool {
    let Some(name) = p.file_name().and_then(|n| n.to_str()) else {
        return false;
    };
    !name.contains(".alt.")
        && ["cudart", "nvrtc", "cublas", "nccl", "nvJitLink", "cudnn"]
            .iter()
            .any(|stem| name.starts_with(&format!("lib{stem}")) && name.contains(".so"))
}

/// [`preload`] of the folders in `SHARDC_CUDA_LIB_DIRS`, once per process.
pub fn preload_from_env() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if let Some(v) = std::env::var_os(LIB_DIRS_ENV) {
            let dirs: Vec<PathBuf> = std::env::split_paths(&v).collect();
            preload(&dirs);
        }
    });
}

/// Opens `library` or says why not (see the module doc).
pub fn require(library: Library) -> Result<(), MissingLibrary> {
    preload_from_env();
    if library.present() {
        Ok(())
    } else {
        Err(MissingLibrary {
            library,
            tried: library.candidates(),
            ld_library_path: std::env::var("LD_LIBRARY_PATH").ok(),
        })
    }
}

/// Opens every library in `libraries`, the first missing one an error.
pub fn require_all(libraries: &[Library]) -> Result<(), MissingLibrary> {
    libraries.iter().try_for_each(|&l| require(l))
}

/// The file `library` is loaded from, as the dynamic loader resolves cudarc's names (the
/// first that opens), read from `/proc/self/maps` while it is open; None when none opens or
/// the maps cannot be read.
pub fn location(library: Library) -> Option<PathBuf> {
    preload_from_env();
    let prefix = format!("lib{}.so", library.stem());
    for name in library.candidates() {
        // SAFETY: as in `preload`: NVIDIA's libraries run no initialisers that depend on us.
        let Ok(lib) = (unsafe { libloading::Library::new(&name) }) else {
            continue;
        };
        let maps = std::fs::read_to_string("/proc/self/maps").ok();
        drop(lib);
        return maps?.lines().find_map(|l| {
            let path = l.split_whitespace().nth(5)?;
            let file = Path::new(path).file_name()?.to_str()?;
            file.starts_with(&prefix).then(|| PathBuf::from(path))
        });
    }
    None
}

/// One line per library: found (and where) or not (for `shardc gpu info`), after preloading
/// the folders of `SHARDC_CUDA_LIB_DIRS`.
pub fn report() -> String {
    preload_from_env();
    let mut s = String::new();
    for l in Library::ALL {
        let state = if l.present() { "found" } else { "missing" };
        s.push_str(&format!(
            "{:<16} {state:<8} {}\n",
            l.to_string(),
            l.purpose()
        ));
        if let Some(path) = location(l) {
            s.push_str(&format!("{:<16} {:<8} from {}\n", "", "", path.display()));
        }
    }
    s
}
