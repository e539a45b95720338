//! Every kernel source compiles with NVIDIA's runtime compiler, and the PTX holds exactly
//! the kernels the host emulator finds in the sources. NVRTC needs no GPU: CI installs it
//! with `scripts/install-nvrtc.sh` (pip's `nvidia-cuda-nvrtc` 13.0) and names the folder in
//! `SHARDC_CUDA_LIB_DIRS`. Elsewhere the test skips with a message, unless `CI=true`. PTX
//! comes from the cache of an earlier compilation of the same text by the same NVRTC where
//! there is one (`kernels::ptx_cache_path`): what NVRTC made of exactly these sources. The
//! SASS a GPU loads first (`kernels::compile_cubin_text`) is compiled for two GPUs too.

use shardc_backend_cuda::emulator::EmulatedDevice;
use shardc_backend_cuda::kernels::{compile_ptx, ptx_entries, SOURCES};
use shardc_backend_cuda::probe::{self, Library};
use std::path::PathBuf;

fn nvrtc_available() -> bool {
    // The folder scripts/install-nvrtc.sh fills, when the variable is not set.
    let default = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../target/cuda-libs/nvrtc/nvidia/cu13/lib");
    probe::preload(&[default]);
    probe::preload_from_env();
    if Library::Nvrtc.present() {
        return true;
    }
    let msg = format!(
        "NVRTC not found ({}): run scripts/install-nvrtc.sh",
        probe::require(Library::Nvrtc).unwrap_err()
    );
    assert!(std::env::var("CI").as_deref() != Ok("true"), "{msg}");
    eprintln!("SKIP: {msg}");
    false
}

/// The SASS a device loads first: an ELF image per source for each GPU generation, and a
/// virtual architecture is refused (only PTX is made for one).
#[test]
fn every_source_compiles_to_sass_for_hopper_and_ampere() {
    use shardc_backend_cuda::kernels::compile_cubin_text;
    if !nvrtc_available() {
        return;
    }
    for sm in ["sm_90", "sm_80"] {
        for (name, text) in SOURCES {
            let cubin = compile_cubin_text(name, text, sm).unwrap_or_else(|e| panic!("{sm}: {e}"));
            assert!(
                cubin.starts_with(b"\x7fELF"),
                "{name} for {sm}: not an ELF image"
            );
            // The kernels' names are in its symbol table.
            let hay = String::from_utf8_lossy(&cubin);
            let ptx = compile_ptx(name, Some(&sm.replace("sm_", "compute_"))).unwrap();
            for entry in ptx_entries(&ptx) {
                assert!(hay.contains(&entry), "{name} for {sm}: no {entry}");
            }
        }
    }
    let e = compile_cubin_text("elementwise.cu", SOURCES[0].1, "compute_90").unwrap_err();
    assert!(e.to_string().contains("not compute_90"), "{e}");
}

#[test]
fn every_source_compiles_to_ptx_for_hopper_and_ampere() {
    if !nvrtc_available() {
        return;
    }
    let mut entries = Vec::new();
    for arch in ["compute_90", "compute_80"] {
        entries.clear();
        for (name, _) in SOURCES {
            let ptx = compile_ptx(name, Some(arch)).unwrap_or_else(|e| panic!("{arch}: {e}"));
            assert!(ptx.contains(".version"), "{name}: not PTX");
            entries.extend(ptx_entries(&ptx));
        }
    }
    entries.sort();
    println!("{} kernels compiled", entries.len());
    match EmulatedDevice::new(64) {
        Ok(dev) => {
            let mut names = dev.kernel_names().to_vec();
            names.sort();
            assert_eq!(
                entries, names,
                "NVRTC and the emulator see different kernels"
            );
        }
        Err(e) => eprintln!("(the emulator's kernel list is not compared: {e})"),
    }
}

#[test]
fn a_compile_error_names_the_source_and_quotes_the_log() {
    if !nvrtc_available() {
        return;
    }
    let err = shardc_backend_cuda::kernels::compile_ptx("no_such.cu", None).unwrap_err();
    assert!(err.to_string().contains("no_such.cu"), "{err}");
}

#[test]
fn generated_fused_kernels_compile_too() {
    if !nvrtc_available() {
        return;
    }
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/quickstart.ir");
    let text = std::fs::read_to_string(path).expect("the quickstart model");
    let mut g = shardc_ir::text::parse_graph(&text, path).expect("it parses");
    shardc_passes::infer::infer_graph(&mut g).expect("it types");
    let (source, names) = shardc_backend_cuda::fusion::generated_kernels(&g);
    assert!(!names.is_empty(), "the MSE loss's Sub and Square fuse");
    let ptx =
        shardc_backend_cuda::kernels::compile_ptx_text("fused.cu", &source, Some("compute_90"))
            .unwrap_or_else(|e| panic!("{e}\n{source}"));
    let entries = ptx_entries(&ptx);
    for n in &names {
        assert!(entries.contains(n), "{n} missing from the PTX");
    }
}

#[test]
fn compiled_ptx_is_cached_and_a_damaged_entry_is_compiled_again() {
    if !nvrtc_available() {
        return;
    }
    use shardc_backend_cuda::kernels::{compile_ptx_text, ptx_cache_path};
    // A source of this run alone, so the first compilation is NVRTC's.
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let text = format!(
        "// {stamp} {}\nextern \"C\" __global__ void cache_probe(float* x) {{ x[0] = 1.0f; }}\n",
        std::process::id()
    );
    let Some(path) = ptx_cache_path(&text, Some("compute_80")).expect("NVRTC is there") else {
        eprintln!("SKIP: SHARDC_PTX_CACHE turns the cache off");
        return;
    };
    assert!(
        !path.exists(),
        "{} exists before the compilation",
        path.display()
    );
    let ptx = compile_ptx_text("probe.cu", &text, Some("compute_80")).expect("compiles");
    assert_eq!(ptx_entries(&ptx), ["cache_probe"]);
    assert_eq!(std::fs::read_to_string(&path).expect("cached"), ptx);
    // Another architecture is another entry.
    let other = ptx_cache_path(&text, Some("compute_90")).unwrap().unwrap();
    assert_ne!(other, path);
    // A damaged entry (cut short) is not used: the source is compiled again and the entry
    // repaired.
    std::fs::write(&path, &ptx[..ptx.len() / 2]).unwrap();
    let again = compile_ptx_text("probe.cu", &text, Some("compute_80")).expect("compiles");
    assert_eq!(again, ptx);
    assert_eq!(std::fs::read_to_string(&path).unwrap(), ptx);
    let _ = std::fs::remove_file(&path);
}

#[test]
fn the_report_says_which_file_a_found_library_was_loaded_from() {
    if !nvrtc_available() {
        return;
    }
    let path = probe::location(Library::Nvrtc).expect("NVRTC opens, so it has a file");
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    assert!(name.starts_with("libnvrtc.so"), "{}", path.display());
    assert!(path.is_file(), "{}", path.display());
    assert!(
        probe::report().contains(&format!("from {}", path.display())),
        "{}",
        probe::report()
    );
}
