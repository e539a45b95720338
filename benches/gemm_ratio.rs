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

mod common;

fn main() -> std::process::ExitCode {
    common::run_shardc_bench(
        "gemm",
        &[
            "--quick",
            "--no-reference",
            "--sizes",
            "64",
            "--threads",
            "1",
        ],
    )
}
