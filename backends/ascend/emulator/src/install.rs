//! Staging the emulator where a CANN loader looks: a directory of symbolic links named as
//! CANN's libraries (`libascendcl.so`, `libnnopbase.so`, `libopapi.so`, `libhccl.so`), all to
//! this crate's one `cdylib`. Point `SHARDC_ASCEND_LIB_DIRS` (or `LD_LIBRARY_PATH`) at the
//! directory and the Ascend backend opens the emulator as it would open CANN; the loader
//! maps the file once (the links name one file), so the four "libraries" share one state,
//! as AscendCL, aclnn and HCCL share the card.
//!
//! Used by tests: the `cdylib` is built next to the test executables (`target/<profile>/deps`)
//! because the tests' package depends on this crate.

use std::io;
use std::path::{Path, PathBuf};

/// The file name cargo gives this crate's `cdylib` on Linux.
pub const CDYLIB: &str = "libshardc_ascend_emulator.so";

/// CANN's library names the emulator is staged under.
pub const CANN_NAMES: [&str; 4] = [
    "libascendcl.so",
    "libnnopbase.so",
    "libopapi.so",
    "libhccl.so",
];

/// The built `cdylib`: next to the running executable (`target/<profile>/deps/`, where test
/// executables live) or in its parent directory (`target/<profile>/`, where binaries live).
pub fn built_library() -> io::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let mut tried = Vec::new();
    for dir in exe.ancestors().skip(1).take(2) {
        for candidate in [dir.join(CDYLIB), dir.join("deps").join(CDYLIB)] {
            if candidate.is_file() {
                return Ok(candidate);
            }
            tried.push(candidate.display().to_string());
        }
    }
    Err(io::Error::new(
        io::ErrorKind::NotFound,
        format!(
            "the CANN emulator {CDYLIB} is not built next to {} (tried {}): build a package that depends on shardc-ascend-emulator (its tests do)",
            exe.display(),
            tried.join(", ")
        ),
    ))
}

/// Makes `dir` (created if missing) hold CANN's library names, each a link to the built
/// emulator ([`built_library`]); returns `dir`. Idempotent, and safe to run from several
/// processes at once.
pub fn stage_as_cann(dir: &Path) -> io::Result<PathBuf> {
    let lib = built_library()?;
    std::fs::create_dir_all(dir)?;
    for name in CANN_NAMES {
        let link = dir.join(name);
        if std::fs::read_link(&link).is_ok_and(|to| to == lib) {
            continue;
        }
        let _ = std::fs::remove_file(&link);
        match std::os::unix::fs::symlink(&lib, &link) {
            Ok(()) => {}
            // Another process staged the same build at the same moment.
            Err(e)
                if e.kind() == io::ErrorKind::AlreadyExists
                    && std::fs::read_link(&link).is_ok_and(|to| to == lib) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(dir.to_path_buf())
}

/// A directory of the temporary folder for staging this build's emulator: one per built
/// library (named from a hash of its path), so test processes of one build share it.
pub fn staging_dir() -> io::Result<PathBuf> {
    let lib = built_library()?;
    let h = lib
        .to_string_lossy()
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
    Ok(std::env::temp_dir().join(format!("shardc-cann-emulator-{h:016x}")))
}
