//! `scripts/gpu-check.sh`, the prepared run of the GPU checks, rehearsed on the emulated GPU
//! (`SHARDC_GPU_CHECK_REHEARSE=1`) with this build's binaries: the command-line steps (the
//! quickstart net on one device, 8 in-process ranks and 2 launched workers; the ResNet-50
//! example; the multi-GPU step's launches of nccl_allgather and the quickstart net, on the
//! CPU and with host-staged collectives) must pass against the CPU's losses, and the steps
//! that need a GPU must say they were skipped. So the script a GPU session runs first cannot rot unnoticed.

use std::path::{Path, PathBuf};
use std::process::Command;

fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test path");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps/..")
        .join("examples")
        .join(name)
}

#[test]
fn the_gpu_check_script_rehearses_on_the_emulated_gpu() {
    if let Err(e) = shardc::cuda::emulator::EmulatedDevice::new(64) {
        eprintln!("SKIP: no emulated GPU here: {e}");
        return;
    }
    let dir = std::env::temp_dir().join(format!("shardc-gpu-check-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let bundle = dir.join("bundle");
    std::fs::create_dir_all(&bundle).unwrap();
    let resnet = example("resnet50_distributed_training");
    assert!(resnet.exists(), "{} is missing", resnet.display());
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_shardc"), bundle.join("shardc")).unwrap();
    std::os::unix::fs::symlink(&resnet, bundle.join("resnet50_distributed_training")).unwrap();
    let allgather = example("nccl_allgather");
    assert!(allgather.exists(), "{} is missing", allgather.display());
    std::os::unix::fs::symlink(&allgather, bundle.join("nccl_allgather")).unwrap();
    let out = dir.join("out");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let o = Command::new("bash")
        .arg(root.join("scripts/gpu-check.sh"))
        .arg(&bundle)
        .arg(&out)
        .env("SHARDC_GPU_CHECK_REHEARSE", "1")
        .env("SHARDC_GPU_CHECK_SECONDS", "300")
        .output()
        .expect("bash runs");
    let summary = std::fs::read_to_string(out.join("summary.txt")).unwrap_or_default();
    let text = format!(
        "{}{}\n{summary}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.status.success(), "{text}");
    for line in [
        "PASS 01-gpu-info",
        "PASS 06-quickstart-cli",
        "PASS 07-resnet50-example",
        "SKIP 02-cuda-gpu-suite (needs a GPU; rehearsal)",
        "SKIP 08-bench-gpu (needs a GPU; rehearsal)",
        "PASS 12-multi-gpu-nccl",
        "4 passed, 0 failed, 8 skipped",
    ] {
        assert!(summary.contains(line), "missing {line:?}:\n{text}");
    }
    // At most three files come back (the device tool brings back eight); the logs are in the
    // tarball, where the CPU and the emulated GPU printed the same losses for every run
    // compared.
    let files: Vec<_> = std::fs::read_dir(&out).unwrap().flatten().collect();
    assert!(files.len() <= 3, "{files:?}");
    let x = Command::new("tar")
        .arg("xzf")
        .arg(out.join("logs.tar.gz"))
        .arg("-C")
        .arg(&dir)
        .status()
        .expect("tar runs");
    assert!(x.success());
    let cli = std::fs::read_to_string(dir.join("logs/06-quickstart-cli.log")).unwrap_or_default();
    assert_eq!(cli.matches("same losses").count(), 3, "{cli}");
    // The ResNet-50 example twice: at the tutorial's learning rate, and frozen (rate 0).
    let r50 = std::fs::read_to_string(dir.join("logs/07-resnet50-example.log")).unwrap_or_default();
    assert_eq!(r50.matches("same losses").count(), 2, "{r50}");
    let _ = std::fs::remove_dir_all(&dir);
}
