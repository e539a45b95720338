//! f32 GEMM GFLOP/s at 256, 512, 1024 and 2048 on 1 and 2 threads against `numpy.matmul` and
//! `torch.matmul`: `cargo bench --bench gemm_ratio [-- --quick]`.
//!
//! Runs the release `shardc` binary's `bench gemm` (built by cargo for this benchmark), so the
//! numbers are exactly those of `shardc bench gemm`. The reference side runs only when
//! `bench/.venv` already exists (`bash bench/setup_venv.sh` creates it): `cargo bench` never
//! downloads PyTorch. Arguments after `--` are passed on (cargo's own `--bench` is dropped).
//! Run without `--bench` (as `cargo test --benches` does), it is a tiny smoke run of shardc's
//! side only.
//! The CPU backend's own kernel benchmark (GEMM and Conv2D, no reference) is
//! `cargo bench -p shardc-backend-cpu --bench gemm`.

use std::process::{Command, ExitCode};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // `cargo bench` passes `--bench`; without it (`cargo test --benches`) this is a smoke run
    // of the same code path: tiny, shardc's side only.
    let passed: Vec<String> = if args.iter().any(|a| a == "--bench") {
        args.into_iter().filter(|a| a != "--bench").collect()
    } else {
        [
            "--quick",
            "--no-reference",
            "--sizes",
            "64",
            "--threads",
            "1",
        ]
        .map(String::from)
        .to_vec()
    };
    let root = env!("CARGO_MANIFEST_DIR");
    let status = Command::new(env!("CARGO_BIN_EXE_shardc"))
        .current_dir(root)
        .args(["bench", "gemm", "--no-setup", "--bench-dir"])
        .arg(format!("{root}/bench"))
        .args(&passed)
        .status();
    match status {
        Ok(s) if s.success() => ExitCode::SUCCESS,
        Ok(s) => {
            eprintln!("gemm_ratio: `shardc bench gemm` ended with {s}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!(
                "gemm_ratio: cannot start {}: {e}",
                env!("CARGO_BIN_EXE_shardc")
            );
            ExitCode::FAILURE
        }
    }
}
