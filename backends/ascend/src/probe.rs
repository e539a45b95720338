//! Finding CANN's libraries at run time.
//!
//! Nothing is linked: `libascendcl.so`, `libnnopbase.so`, `libopapi.so` (or its per-domain
//! split, `libopapi_math.so`, `libopapi_nn.so`, ...) and `libhccl.so` are opened with
//! `dlopen` the first time the backend needs them. Each is looked for, in order, in every
//! folder of [`LIB_DIRS_ENV`] (`:`-separated), in `$ASCEND_HOME_PATH/lib64`, in
//! `$ASCEND_TOOLKIT_HOME/lib64`, by the default search (`LD_LIBRARY_PATH`, the loader's cache)
//! and in `/usr/local/Ascend/ascend-toolkit/latest/lib64`. A library that is not found is a
//! [`MissingLibrary`] error naming it, the file names and folders tried, and how to make it
//! findable; never a panic.

use std::fmt;
use std::path::{Path, PathBuf};

pub use shardc_ascend_sys::{Library, OpDomain};

/// The environment variable naming extra folders (`:`-separated) to load CANN libraries from,
/// searched first.
pub const LIB_DIRS_ENV: &str = "SHARDC_ASCEND_LIB_DIRS";

/// Where CANN installs its toolkit by default.
pub const DEFAULT_TOOLKIT_LIB64: &str = "/usr/local/Ascend/ascend-toolkit/latest/lib64";

/// What a library does for shardc.
pub fn purpose(lib: Library) -> &'static str {
    match lib {
        Library::AscendCl => "AscendCL: devices, memory, streams and events",
        Library::NnOpBase => "nnopbase: the aclnn tensor descriptors (aclCreateTensor)",
        Library::OpApi => "the aclnn operators (libopapi, or its per-domain split)",
        Library::Hccl => "HCCL: collectives between Ascend devices",
    }
}

/// The file names tried for `lib`: its own, then (opApi) the per-domain split libraries.
pub fn file_names(lib: Library) -> Vec<&'static str> {
    let mut names = vec![lib.file_name()];
    if lib == Library::OpApi {
        names.extend(OpDomain::ALL.iter().map(|d| d.file_name()));
    }
    names
}

/// The folders searched, in order (see the module doc); `None` stands for the loader's
/// default search (`LD_LIBRARY_PATH`).
pub fn search_dirs() -> Vec<Option<PathBuf>> {
    let mut dirs: Vec<Option<PathBuf>> = Vec::new();
    if let Ok(v) = std::env::var(LIB_DIRS_ENV) {
        dirs.extend(
            v.split(':')
                .filter(|s| !s.trim().is_empty())
                .map(|s| Some(PathBuf::from(s.trim()))),
        );
    }
    for var in ["ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME"] {
        if let Ok(v) = std::env::var(var) {
            if !v.trim().is_empty() {
                dirs.push(Some(Path::new(v.trim()).join("lib64")));
            }
        }
    }
    dirs.push(None);
    dirs.push(Some(PathBuf::from(DEFAULT_TOOLKIT_LIB64)));
    dirs
}

/// One opened library file.
pub struct Opened {
    /// The file name (`libopapi_nn.so`).
    pub file_name: &'static str,
    /// Where it was opened from (a path, or the file name for the default search).
    pub path: String,
    /// The open library (kept open for the process's life by whoever holds it).
    pub handle: libloading::Library,
}

impl fmt::Debug for Opened {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Opened({} at {})", self.file_name, self.path)
    }
}

/// A library that could not be opened: which, where it was looked for, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MissingLibrary {
    /// The library.
    pub library: Library,
    /// The file names tried.
    pub file_names: Vec<&'static str>,
    /// The folders tried (`the default library search` for `dlopen`'s own).
    pub tried: Vec<String>,
    /// The loader's message for files that exist but would not load.
    pub errors: Vec<String>,
}

impl fmt::Display for MissingLibrary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({}) was not found: tried {} in {}",
            self.library.file_name(),
            purpose(self.library),
            self.file_names.join(", "),
            self.tried.join(", "),
        )?;
        if let Ok(v) = std::env::var("LD_LIBRARY_PATH") {
            write!(f, " (LD_LIBRARY_PATH={v})")?;
        }
        for e in &self.errors {
            write!(f, "; {e}")?;
        }
        write!(
            f,
            ". Install the CANN toolkit and set ASCEND_HOME_PATH (`source /usr/local/Ascend/ascend-toolkit/set_env.sh`), or set {LIB_DIRS_ENV} to the folder holding {}, or run with --device-target CPU",
            self.library.file_name()
        )
    }
}

impl std::error::Error for MissingLibrary {}

fn dir_text(d: &Option<PathBuf>) -> String {
    match d {
        Some(p) => p.display().to_string(),
        None => "the default library search".into(),
    }
}

/// Opens one file by name from the first folder that has it.
fn open_file(
    name: &'static str,
    dirs: &[Option<PathBuf>],
    errors: &mut Vec<String>,
) -> Option<Opened> {
    for d in dirs {
        let (target, path) = match d {
            Some(dir) => {
                let p = dir.join(name);
                if !p.exists() {
                    continue;
                }
                (p.clone().into_os_string(), p.display().to_string())
            }
            None => (name.into(), name.to_string()),
        };
        // SAFETY: opening a CANN library runs its initialisers, which is what CANN expects
        // of any program that uses it.
        match unsafe { libloading::Library::new(&target) } {
            Ok(handle) => {
                return Some(Opened {
                    file_name: name,
                    path,
                    handle,
                })
            }
            Err(e) => {
                if d.is_some() {
                    errors.push(format!("{path} exists but does not load: {e}"));
                }
            }
        }
    }
    None
}

/// Opens `lib`: one file for AscendCL, nnopbase and HCCL; for opApi the monolithic
/// `libopapi.so` and every per-domain split library found (an aclnn symbol is resolved in
/// whichever has it). Not cached: the backend keeps what it opens once
/// (`crate::acl::api`).
pub fn open(lib: Library) -> Result<Vec<Opened>, MissingLibrary> {
    let dirs = search_dirs();
    let mut errors = Vec::new();
    let opened: Vec<Opened> = file_names(lib)
        .into_iter()
        .filter_map(|name| open_file(name, &dirs, &mut errors))
        .collect();
    if opened.is_empty() {
        return Err(MissingLibrary {
            library: lib,
            file_names: file_names(lib),
            tried: dirs.iter().map(dir_text).collect(),
            errors,
        });
    }
    Ok(opened)
}

/// What was found where for every library, what is missing and how to make it findable
/// (`shardc device info`).
pub fn report() -> String {
    let mut s = String::from("Ascend (CANN) libraries:");
    for lib in Library::ALL {
        match open(lib) {
            Ok(found) => {
                let at: Vec<String> = found
                    .iter()
                    .map(|o| format!("{} at {}", o.file_name, o.path))
                    .collect();
                s.push_str(&format!(
                    "\n  {:<16} found: {} ({})",
                    lib.file_name(),
                    at.join(", "),
                    purpose(lib)
                ));
            }
            Err(m) => s.push_str(&format!("\n  {:<16} missing: {m}", lib.file_name())),
        }
    }
    s
}
