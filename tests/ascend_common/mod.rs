//! What the Ascend backend's tests share: the CANN emulator (`shardc-ascend-emulator`, a
//! cdylib this package's tests depend on, built into `target/*/deps`) staged under CANN's
//! library names, and the backend pointed at it.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::OnceLock;

/// The directory that holds the emulator under CANN's names (`libascendcl.so`,
/// `libnnopbase.so`, `libopapi.so`, `libhccl.so`), made once per test process; this
/// process's `SHARDC_ASCEND_LIB_DIRS` names it (set before the backend's first load), and
/// child processes (`shardc run --device-target Ascend`) are given it the same way.
pub fn cann_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("shardc-cann-emulator-{}", std::process::id()));
        shardc_ascend_emulator::install::stage_as_cann(&dir)
            .unwrap_or_else(|e| panic!("staging the CANN emulator in {}: {e}", dir.display()));
        // SAFETY: set once, before any thread of this test loads the libraries.
        unsafe { std::env::set_var("SHARDC_ASCEND_LIB_DIRS", &dir) };
        dir
    })
    .clone()
}
