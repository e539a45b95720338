//! The reference side: `reference.py serve` of the bench directory, run by the Python of its
//! virtual environment (`setup_venv.sh` creates it on first use), and the lines it answers.

use crate::args::BenchArgs;
use anyhow::{anyhow, bail, Context, Result};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

/// One `ref=...` line of `reference.py`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RefLine {
    /// The line as printed.
    pub(crate) raw: String,
    /// Its `key=value` words.
    fields: HashMap<String, String>,
}

impl RefLine {
    /// Splits a line into its `key=value` words.
    pub(crate) fn parse(raw: &str) -> RefLine {
        let fields = raw
            .split_whitespace()
            .filter_map(|w| w.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        RefLine {
            raw: raw.to_string(),
            fields,
        }
    }

    /// The value of `key=`, if the line has one.
    pub(crate) fn field(&self, key: &str) -> Option<&str> {
        self.fields.get(key).map(String::as_str)
    }

    /// The value of `key=` as a number (an error when missing or not a number).
    pub(crate) fn number(&self, key: &str) -> Result<f64> {
        let v = self
            .field(key)
            .ok_or_else(|| anyhow!("reference.py printed no `{key}=` in `{}`", self.raw))?;
        v.parse()
            .with_context(|| format!("reference.py printed `{key}={v}` in `{}`", self.raw))
    }
}

/// `reference.py serve`, running.
pub(crate) struct Reference {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl Reference {
    /// Sends one command and collects its result lines (up to `ref=done`).
    pub(crate) fn query(&mut self, command: &str) -> Result<Vec<RefLine>> {
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| anyhow!("the reference process's input is closed"))?;
        writeln!(stdin, "{command}")
            .and_then(|()| stdin.flush())
            .context("sending a command to reference.py (did it exit? see its messages above)")?;
        let mut lines = Vec::new();
        let mut error = None;
        loop {
            let mut buf = String::new();
            let read = self
                .stdout
                .read_line(&mut buf)
                .context("reading reference.py's output")?;
            if read == 0 {
                bail!("reference.py exited while answering `{command}` (see its messages above)");
            }
            let text = buf.trim_end();
            if text == "ref=done" {
                // Every answer ends here, an error's too: the next query starts clean.
                return match error {
                    Some(msg) => Err(anyhow!("reference.py failed on `{command}`: {msg}")),
                    None => Ok(lines),
                };
            }
            if let Some(msg) = text.strip_prefix("ref=error message=") {
                error = Some(msg.to_string());
            } else if text.starts_with("ref=") {
                lines.push(RefLine::parse(text));
            } else if !text.is_empty() {
                eprintln!("reference.py: {text}");
            }
        }
    }

    /// Closes the input and waits for the process to end.
    pub(crate) fn finish(mut self) -> Result<()> {
        drop(self.stdin.take());
        let status = self.child.wait().context("waiting for reference.py")?;
        if !status.success() {
            bail!("reference.py ended with {status}");
        }
        Ok(())
    }
}

impl Drop for Reference {
    fn drop(&mut self) {
        // Only reached without `finish` (on an error): do not leave the process behind.
        if self.stdin.take().is_some() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The `bench/` directory: `--bench-dir`, else `bench/` of the nearest ancestor of the current
/// directory that has `bench/reference.py`, else the one this crate was built from (the
/// crate's own directory: its sources sit beside the scripts).
pub(crate) fn bench_dir(args: &BenchArgs) -> Result<PathBuf> {
    if let Some(dir) = &args.bench_dir {
        if dir.join("reference.py").is_file() {
            return Ok(dir.clone());
        }
        bail!("--bench-dir {}: no reference.py there", dir.display());
    }
    if let Ok(cwd) = std::env::current_dir() {
        for dir in cwd.ancestors() {
            let candidate = dir.join("bench");
            if candidate.join("reference.py").is_file() {
                return Ok(candidate);
            }
        }
    }
    let built = Path::new(env!("CARGO_MANIFEST_DIR"));
    if built.join("reference.py").is_file() {
        return Ok(built.to_path_buf());
    }
    bail!(
        "no bench/reference.py found above the current directory or at {}; pass --bench-dir, or --no-reference to measure shardc only",
        built.display()
    )
}

/// The reference side's Python: `--python`, else the bench directory's `.venv/bin/python`.
pub(crate) fn reference_python(args: &BenchArgs, dir: &Path) -> PathBuf {
    args.python
        .clone()
        .unwrap_or_else(|| dir.join(".venv/bin/python"))
}

/// Starts `reference.py serve` in the virtual environment, creating it first if needed
/// (`None` when it is missing and `--no-setup` forbids creating it).
pub(crate) fn start_reference(args: &BenchArgs) -> Result<Option<Reference>> {
    let dir = bench_dir(args)?;
    let python = reference_python(args, &dir);
    if args.python.is_none() && !python.is_file() {
        if args.no_setup {
            eprintln!(
                "{} is missing and --no-setup is given: measuring shardc only (run {} to compare against numpy and PyTorch)",
                python.display(),
                dir.join("setup_venv.sh").display()
            );
            return Ok(None);
        }
        let script = dir.join("setup_venv.sh");
        eprintln!(
            "the reference side (numpy, PyTorch) is not installed yet: running {} (creates {}, downloads about 5.5 GB once) ...",
            script.display(),
            dir.join(".venv").display()
        );
        let status = Command::new("bash")
            .arg(&script)
            .stdout(Stdio::from(std::io::stderr()))
            .status()
            .with_context(|| format!("running {}", script.display()))?;
        if !status.success() || !python.is_file() {
            bail!(
                "{} failed ({status}); pass --no-reference to measure shardc only",
                script.display()
            );
        }
    }
    let max_threads = args.threads.iter().copied().max().unwrap_or(1);
    let mut command = Command::new(&python);
    command
        .arg(dir.join("reference.py"))
        .arg("serve")
        .arg("--threads")
        .arg(max_threads.to_string())
        // Set on some machines; they make OpenBLAS pick slower kernels (reference.py removes
        // them as well, for direct use).
        .env_remove("OPENBLAS_CORETYPE")
        .env_remove("OPENBLAS_L2_SIZE");
    let what = format!(
        "{} {}",
        python.display(),
        dir.join("reference.py").display()
    );
    Reference::spawn(command, &what).map(Some)
}

impl Reference {
    /// Starts `command` (a `reference.py serve` process) with piped input and output.
    fn spawn(mut command: Command, what: &str) -> Result<Reference> {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting {what}"))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            let _ = child.wait();
            bail!("{what} started without its pipes");
        };
        Ok(Reference {
            child,
            stdin: Some(stdin),
            stdout: BufReader::new(stdout),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_lines_parse() {
        let l = RefLine::parse("ref=torch gemm f32 n=512 threads=1 gflops=160.3 ms=1.675 runs=299");
        assert_eq!(l.field("ref"), Some("torch"));
        assert_eq!(l.number("gflops").expect("a number"), 160.3);
        assert!(l.number("step_ms").is_err());
        let bad = RefLine::parse("ref=torch gflops=fast");
        assert!(bad.number("gflops").is_err());
    }

    /// A stand-in for `reference.py serve`: answers `gemm` with one torch line, anything
    /// else with an error, and exits on `quit` without answering.
    fn fake_reference() -> Reference {
        let script = r#"
while IFS= read -r line; do
  case "$line" in
    gemm*) echo "note: not a result line"; echo "ref=torch gemm f32 n=8 threads=1 gflops=12.5 ms=0.1 runs=5";;
    quit) exit 3;;
    *) echo "ref=error message=unknown command: $line";;
  esac
  echo ref=done
done
"#;
        let mut command = Command::new("sh");
        command.arg("-c").arg(script);
        Reference::spawn(command, "a fake reference").expect("sh starts")
    }

    #[test]
    fn the_serve_protocol_collects_lines_and_reports_errors() {
        let mut r = fake_reference();
        let lines = r.query("gemm --sizes 8 --threads 1").expect("an answer");
        assert_eq!(lines.len(), 1);
        assert_eq!(lines[0].number("gflops").expect("gflops"), 12.5);
        let err = r.query("train --model x").expect_err("an error line");
        assert!(
            err.to_string().contains("unknown command: train --model x"),
            "{err}"
        );
        // Still usable after an error; a clean end of input is a clean exit.
        assert_eq!(r.query("gemm").expect("an answer").len(), 1);
        r.finish().expect("exit status 0");

        let mut r = fake_reference();
        let err = r
            .query("quit")
            .expect_err("the process exits without answering");
        assert!(
            err.to_string().contains("exited while answering `quit`"),
            "{err}"
        );
    }

    #[test]
    fn a_missing_bench_dir_is_an_error() {
        let args = BenchArgs {
            bench_dir: Some(PathBuf::from("/nonexistent/bench")),
            ..BenchArgs::default()
        };
        let err = bench_dir(&args).expect_err("no reference.py there");
        assert!(err.to_string().contains("/nonexistent/bench"), "{err}");
    }
}
