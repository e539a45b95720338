//! `scripts/ascend-check.sh`, the prepared run of the Ascend checks for a machine with NPUs,
//! rehearsed on the project's CANN emulator (`SHARDC_ASCEND_CHECK_REHEARSE=1`) with this
//! build's binaries: device info, the models against the CPU, the quickstart net on one NPU
//! and on 8 in-process ranks with HCCL, launched workers and a job started from a rank table
//! must pass with the CPU's losses, and the torch_npu bench must say it was skipped. So the
//! script a person with an Ascend machine runs first cannot rot unnoticed.

mod ascend_common;

use std::path::Path;
use std::process::Command;

/// A test executable of this package, next to this one (`target/<profile>/deps`).
fn test_binary(prefix: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("test path");
    let deps = exe.parent().expect("deps");
    std::fs::read_dir(deps)
        .expect("deps lists")
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            name.starts_with(&format!("{prefix}-")) && !name.contains('.') && p.is_file()
        })
        .max_by_key(|p| p.metadata().and_then(|m| m.modified()).ok())
        .unwrap_or_else(|| panic!("no {prefix} test executable in {}", deps.display()))
}

#[test]
fn the_ascend_check_script_rehearses_on_the_emulated_cann() {
    let Some(cann) = ascend_common::cann_dir() else {
        eprintln!("SKIP: on NPUs the script itself is the check");
        return;
    };
    let dir = std::env::temp_dir().join(format!("shardc-ascend-check-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let bundle = dir.join("bundle");
    std::fs::create_dir_all(&bundle).unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_shardc"), bundle.join("shardc")).unwrap();
    std::os::unix::fs::symlink(
        test_binary("ascend_emulated"),
        bundle.join("ascend_emulated"),
    )
    .unwrap();
    let out = dir.join("out");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let o = Command::new("bash")
        .arg(root.join("scripts/ascend-check.sh"))
        .arg(&bundle)
        .arg(&out)
        .env("SHARDC_ASCEND_CHECK_REHEARSE", "1")
        .env("SHARDC_ASCEND_LIB_DIRS", &cann)
        // Two emulated NPUs: the launched steps run 2 workers (as the GPU check's rehearsal),
        // and 8 in-process ranks share one NPU with staged collectives.
        .env("SHARDC_ASCEND_EMU_DEVICES", "2")
        .env_remove("ASCEND_HOME_PATH")
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
        "PASS 01-device-info",
        "PASS 02-models-on-npu",
        "PASS 03-quickstart-cli",
        "PASS 04-launched-hccl",
        "SKIP 05-bench-torch-npu (needs NPUs and torch_npu; rehearsal)",
        "4 passed, 0 failed, 1 skipped",
    ] {
        assert!(summary.contains(line), "missing {line:?}:\n{text}");
    }
    let x = Command::new("tar")
        .arg("xzf")
        .arg(out.join("logs.tar.gz"))
        .arg("-C")
        .arg(&dir)
        .status()
        .expect("tar runs");
    assert!(x.success());
    let cli = std::fs::read_to_string(dir.join("logs/03-quickstart-cli.log")).unwrap_or_default();
    assert_eq!(cli.matches("same losses").count(), 2, "{cli}");
    let launched =
        std::fs::read_to_string(dir.join("logs/04-launched-hccl.log")).unwrap_or_default();
    assert_eq!(launched.matches("same losses").count(), 2, "{launched}");
    let _ = std::fs::remove_dir_all(&dir);
}
