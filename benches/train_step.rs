//! One training step of the quickstart net, the MLP (batch 32) and ResNet-18 for CIFAR
//! (batch 32), against PyTorch CPU eager with the same thread count:
//! `cargo bench --bench train_step [-- --quick --threads 1]`.
//!
//! Runs the release `shardc` binary's `bench train` (built by cargo for this benchmark), so the
//! numbers are exactly those of `shardc bench train`. The reference side runs only when
//! `bench/.venv` already exists (`bash bench/setup_venv.sh` creates it): `cargo bench` never
//! downloads PyTorch. Arguments after `--` are passed on (cargo's own `--bench` is dropped).
//! Run without `--bench` (as `cargo test --benches` does), it is a tiny smoke run of shardc's
//! side only.

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
            "--models",
            "quickstart",
            "--steps",
            "3",
        ]
        .map(String::from)
        .to_vec()
    };
    let root = env!("CARGO_MANIFEST_DIR");
    let status = Command::new(env!("CARGO_BIN_EXE_shardc"))
        .current_dir(root)
        .args(["bench", "train", "--no-setup", "--bench-dir"])
        .arg(format!("{root}/bench"))
        .args(&passed)
        .status();
    match status {
        Ok(s) if s.success() => ExitCode::SUCCESS,
        Ok(s) => {
            eprintln!("train_step: `shardc bench train` ended with {s}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!(
                "train_step: cannot start {}: {e}",
                env!("CARGO_BIN_EXE_shardc")
            );
            ExitCode::FAILURE
        }
    }
}
