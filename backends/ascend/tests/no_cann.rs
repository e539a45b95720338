//! A machine without CANN: every way in is an error naming the missing library and how to
//! make it findable, never a panic.

use shardc_backend_ascend::probe::{self, Library};
use shardc_backend_ascend::AscendDevice;

#[test]
fn without_cann_the_error_names_libascendcl_and_how_to_find_it() {
    let empty = std::env::temp_dir().join(format!("shardc-no-cann-{}", std::process::id()));
    std::fs::create_dir_all(&empty).expect("an empty folder");
    std::env::set_var(probe::LIB_DIRS_ENV, &empty);
    std::env::remove_var("ASCEND_HOME_PATH");
    std::env::remove_var("ASCEND_TOOLKIT_HOME");
    if let Ok(found) = probe::open(Library::AscendCl) {
        // CANN (or the emulator) on LD_LIBRARY_PATH or in the default toolkit folder.
        eprintln!("libascendcl.so is found here ({found:?}): nothing to test");
        return;
    }
    let e = AscendDevice::open(0).expect_err("no CANN, no device");
    let text = e.to_string();
    println!("{text}");
    assert!(text.contains("libascendcl.so"), "{text}");
    assert!(text.contains("ASCEND_HOME_PATH"), "{text}");
    assert!(text.contains(probe::LIB_DIRS_ENV), "{text}");
    assert!(text.contains(&empty.display().to_string()), "{text}");
    // Every later call says the same, and the probe names each library.
    let again = AscendDevice::open(0).expect_err("still none").to_string();
    assert_eq!(again, text);
    let m = probe::open(Library::Hccl).expect_err("no libhccl.so");
    assert!(m.to_string().contains("libhccl.so"), "{m}");
    let opapi = probe::open(Library::OpApi)
        .expect_err("no opApi")
        .to_string();
    assert!(opapi.contains("libopapi_nn.so"), "{opapi}");
    let report = shardc_backend_ascend::device_info();
    assert!(
        report.contains("libascendcl.so") && report.contains("missing"),
        "{report}"
    );
}
