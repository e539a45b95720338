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

mod common;

fn main() -> std::process::ExitCode {
    common::run_shardc_bench(
        "train",
        &[
            "--quick",
            "--no-reference",
            "--models",
            "quickstart",
            "--steps",
            "3",
        ],
    )
}
