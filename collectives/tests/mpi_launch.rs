//! Runs the `mpi_check` example under `mpirun` with 2, 3 and 4 ranks: every collective through
//! `MpiComm` on the world and on sub-groups must equal the in-process world's results exactly
//! (see `examples/mpi_check.rs`). Skips, saying so, when `mpirun` is not installed
//! (`scripts/install-mpi.sh` installs it).
#![cfg(feature = "mpi")]

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The longest one `mpirun` may take (debug build, ranks outnumbering cores).
const LIMIT: Duration = Duration::from_secs(600);

fn mpirun_present() -> bool {
    Command::new("mpirun")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// The `mpi_check` example next to this test's binary, built first when absent.
fn example() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    // target/<profile>/deps/mpi_launch-HASH -> target/<profile>/examples/mpi_check
    let profile_dir = exe
        .parent()
        .and_then(|d| d.parent())
        .expect("the test binary lives in target/<profile>/deps");
    let path = profile_dir.join("examples").join("mpi_check");
    if !path.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args([
            "build",
            "-p",
            "shardc-collectives",
            "--features",
            "mpi",
            "--example",
            "mpi_check",
        ]);
        if profile_dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        let status = cmd.status().expect("cargo runs");
        assert!(status.success(), "building the mpi_check example failed");
    }
    assert!(path.exists(), "{} is missing", path.display());
    path
}

/// Runs `mpirun -n ranks mpi_check` and returns (success, stdout, stderr).
fn mpirun(ranks: usize) -> (bool, String, String) {
    let bin = example();
    let mut child = Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "-n"])
        .arg(ranks.to_string())
        .arg(&bin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("mpirun starts");
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting for mpirun") {
            break Some(status);
        }
        if start.elapsed() > LIMIT {
            let _ = child.kill();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let out = child.wait_with_output().expect("mpirun's output");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (status.is_some_and(|s| s.success()), stdout, stderr)
}

fn check(ranks: usize) {
    if !mpirun_present() {
        eprintln!("skipping: mpirun is not installed (scripts/install-mpi.sh installs Open MPI)");
        return;
    }
    let (ok, stdout, stderr) = mpirun(ranks);
    assert!(
        ok,
        "mpirun -n {ranks} mpi_check failed\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    for r in 0..ranks {
        let line = format!("rank {r}: ");
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with(&line) && l.contains("checks passed")),
            "rank {r} did not report its checks\nstdout:\n{stdout}\nstderr:\n{stderr}"
        );
    }
}

/// One test runs the three world sizes in turn: several `mpirun`s at once would oversubscribe
/// a small machine many times over.
#[test]
fn mpi_collectives_equal_in_process_with_2_3_and_4_ranks() {
    for ranks in [2, 3, 4] {
        check(ranks);
    }
}
