//! What the root benchmarks share: run the release `shardc` binary's `bench WHAT`.

use std::process::{Command, ExitCode};

/// Runs `shardc bench <what> --no-setup` with the arguments after cargo's `--bench`, or, when
/// cargo did not pass `--bench` (as under `cargo test --benches`), with `smoke`: a tiny run of
/// shardc's side only.
pub fn run_shardc_bench(what: &str, smoke: &[&str]) -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let passed: Vec<String> = if args.iter().any(|a| a == "--bench") {
        args.into_iter().filter(|a| a != "--bench").collect()
    } else {
        smoke.iter().map(|s| s.to_string()).collect()
    };
    let root = env!("CARGO_MANIFEST_DIR");
    let status = Command::new(env!("CARGO_BIN_EXE_shardc"))
        .current_dir(root)
        .args(["bench", what, "--no-setup", "--bench-dir"])
        .arg(format!("{root}/bench"))
        .args(&passed)
        .status();
    match status {
        Ok(s) if s.success() => ExitCode::SUCCESS,
        Ok(s) => {
            eprintln!("`shardc bench {what}` ended with {s}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("cannot start {}: {e}", env!("CARGO_BIN_EXE_shardc"));
            ExitCode::FAILURE
        }
    }
}
