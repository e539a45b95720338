//! The built cdylib, loaded as CANN's libraries are: a directory of symlinks named
//! `libascendcl.so`, `libnnopbase.so`, `libopapi.so` (and the per-domain splits) and
//! `libhccl.so` pointing at the one emulator library; every symbol shardc resolves is found in
//! the library the sys crate says, and callable with its `sig` type.

use shardc_ascend_sys::{self as sys, sig, Library, OpDomain};
use std::ffi::{c_void, CString};
use std::path::PathBuf;

/// The built cdylib (`target/<profile>/` when this package is built alone, `deps/` when the
/// workspace is).
fn cdylib() -> PathBuf {
    shardc_ascend_emulator::install::built_library().unwrap_or_else(|e| panic!("{e}"))
}

fn open(path: &std::path::Path) -> *mut c_void {
    let c = CString::new(path.to_str().unwrap()).unwrap();
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    assert!(!h.is_null(), "dlopen {}", path.display());
    h
}

fn sym(h: *mut c_void, name: &str) -> *mut c_void {
    let c = CString::new(name).unwrap();
    unsafe { libc::dlsym(h, c.as_ptr()) }
}

#[test]
fn every_symbol_is_exported_under_every_library_name() {
    let so = cdylib();
    let dir = std::env::temp_dir().join(format!("shardc-ascend-emu-libs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut names: Vec<&str> = Library::ALL.iter().map(|l| l.file_name()).collect();
    names.extend(OpDomain::ALL.iter().map(|d| d.file_name()));
    for n in &names {
        std::os::unix::fs::symlink(&so, dir.join(n)).unwrap();
    }
    for (lib, name) in sys::SYMBOLS {
        let h = open(&dir.join(lib.file_name()));
        assert!(
            !sym(h, name).is_null(),
            "{name} missing from {}",
            lib.file_name()
        );
        if let Some(d) = sys::domain_of(name) {
            let h = open(&dir.join(d.file_name()));
            assert!(
                !sym(h, name).is_null(),
                "{name} missing from {}",
                d.file_name()
            );
        }
    }
    // Called through the loaded library with the sys type, as the backend does.
    let h = open(&dir.join("libascendcl.so"));
    let count: sig::aclrtGetDeviceCount =
        unsafe { std::mem::transmute(sym(h, "aclrtGetDeviceCount")) };
    let mut n = 0u32;
    assert_eq!(unsafe { count(&mut n) }, 0);
    assert!(n >= 1);
    let init: sig::aclInit = unsafe { std::mem::transmute(sym(h, "aclInit")) };
    let r = unsafe { init(std::ptr::null()) };
    assert!(r == 0 || r == sys::ACL_ERROR_REPEAT_INITIALIZE);
    std::fs::remove_dir_all(&dir).unwrap();
}
