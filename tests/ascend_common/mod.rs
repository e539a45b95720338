//! What the Ascend backend's tests share: the CANN emulator (`shardc-ascend-emulator`, a
//! cdylib this package's tests depend on, built into `target/*/deps`) staged under CANN's
//! library names, and the backend pointed at it — or, with `SHARDC_TEST_DEVICE=ascend` (on a
//! machine with NPUs: `scripts/ascend-check.sh`), the real CANN found as a user's run finds
//! it (`ASCEND_HOME_PATH`, `LD_LIBRARY_PATH`).

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::OnceLock;

/// The environment variable that moves the Ascend tests onto real NPUs
/// (`SHARDC_TEST_DEVICE=ascend`).
pub const TEST_DEVICE_ENV: &str = "SHARDC_TEST_DEVICE";

/// Whether the tests run on real NPUs (`SHARDC_TEST_DEVICE=ascend`).
pub fn on_hardware() -> bool {
    std::env::var(TEST_DEVICE_ENV).is_ok_and(|v| v == "ascend")
}

/// The directory that holds the emulator under CANN's names (`libascendcl.so`,
/// `libnnopbase.so`, `libopapi.so`, `libhccl.so`), made once per test process; this
/// process's `SHARDC_ASCEND_LIB_DIRS` names it (set before the backend's first load), and
/// child processes (`shardc run --device-target Ascend`) are given it the same way. None on
/// real NPUs (`SHARDC_TEST_DEVICE=ascend`): CANN is found as a user's run finds it.
pub fn cann_dir() -> Option<PathBuf> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| {
        if on_hardware() {
            return None;
        }
        let dir = shardc_ascend_emulator::install::staging_dir()
            .unwrap_or_else(|e| panic!("the CANN emulator: {e}"));
        shardc_ascend_emulator::install::stage_as_cann(&dir)
            .unwrap_or_else(|e| panic!("staging the CANN emulator in {}: {e}", dir.display()));
        // SAFETY: set once, before any thread of this test loads the libraries.
        unsafe { std::env::set_var("SHARDC_ASCEND_LIB_DIRS", &dir) };
        Some(dir)
    })
    .clone()
}
