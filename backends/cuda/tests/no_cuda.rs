//! On a machine without CUDA (CI), every GPU entry point returns an error that names the
//! missing library, the file names tried and the fix: never cudarc's panic.

use shardc_backend_cuda::cuda::{device_count, CudaDevice};
use shardc_backend_cuda::nccl::NcclComm;
use shardc_backend_cuda::probe::{self, Library};
use shardc_backend_cuda::CudaError;

#[test]
fn without_a_driver_opening_a_gpu_is_a_clear_error() {
    if Library::Driver.present() {
        eprintln!("SKIP: this machine has a CUDA driver");
        return;
    }
    for _ in 0..2 {
        // twice: cudarc would panic on every use, the probe answers every time
        let err = CudaDevice::new(0).unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, CudaError::LibraryMissing(_)), "{err:?}");
        for needle in [
            "CUDA not found",
            "libcuda.so",
            "tried",
            "libcuda.so.1",
            "NVIDIA driver",
            "--device-target CPU",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in: {text}");
        }
    }
    assert!(device_count().is_err());
}

#[test]
fn a_missing_nccl_says_how_to_link_the_pip_wheel() {
    if Library::Nccl.present() {
        eprintln!("SKIP: this machine has NCCL");
        return;
    }
    let text = NcclComm::version().unwrap_err().to_string();
    for needle in [
        "libnccl.so",
        "libnccl.so.2",
        "ln -s",
        "LD_LIBRARY_PATH",
        probe::LIB_DIRS_ENV,
    ] {
        assert!(text.contains(needle), "missing {needle:?} in: {text}");
    }
}

#[test]
fn the_report_lists_every_library() {
    let r = probe::report();
    for l in Library::ALL {
        assert!(r.contains(&l.to_string()), "{r}");
    }
}

#[test]
fn preloading_a_folder_without_libraries_loads_nothing() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("libcuda.so.1"), b"not an ELF file").unwrap();
    assert!(probe::preload(&[dir.path().to_path_buf()]).is_empty());
}
