//! MPI as the engine (`--features mpi`): `mpirun -n 8 shardc run OUT/ --comm mpi` prints the
//! losses of the native communicator under `shardc launch`, and `mpirun -n 4 shardc
//! check-collectives --comm mpi` passes the same conformance suite as the native one. Skips
//! with a message when `mpirun` is absent (scripts/install-mpi.sh installs Open MPI); without
//! the feature, one test says what it would take.

#[cfg(not(feature = "mpi"))]
#[test]
fn the_mpi_tests_need_the_mpi_feature() {
    eprintln!(
        "SKIP: built without the `mpi` feature: bash scripts/install-mpi.sh, then bash scripts/test.sh turns it on"
    );
}

#[cfg(feature = "mpi")]
mod ascend_common;
#[cfg(feature = "mpi")]
mod cli_common;

#[cfg(feature = "mpi")]
mod with_mpi {

    use std::path::{Path, PathBuf};
    use std::process::{Command, Output};

    fn exe() -> &'static str {
        env!("CARGO_BIN_EXE_shardc")
    }

    fn text(o: &Output) -> String {
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    }

    fn have_mpirun() -> bool {
        Command::new("mpirun")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    }

    /// `mpirun -n N shardc ARGS` (as root Open MPI needs --allow-run-as-root; 8 ranks on 2 cores
    /// need --oversubscribe).
    fn mpirun(n: usize, args: &[&str]) -> Output {
        mpirun_program(n, Path::new(exe()), args)
    }

    /// `mpirun -n N PROGRAM ARGS`, as [`mpirun`].
    fn mpirun_program(n: usize, program: &Path, args: &[&str]) -> Output {
        Command::new("mpirun")
            .args([
                "--allow-run-as-root",
                "--oversubscribe",
                "-n",
                &n.to_string(),
            ])
            .args(["--mca", "btl", "self,vader"])
            .arg(program)
            .args(args)
            .output()
            .expect("mpirun runs")
    }

    fn tmp(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("shardc-mpi-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn loss_lines(s: &str) -> Vec<String> {
        s.lines()
            .filter(|l| l.contains(", loss is "))
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn mpirun_prints_the_losses_of_the_native_communicator() {
        if !have_mpirun() {
            eprintln!("SKIP: mpirun not found; bash scripts/install-mpi.sh installs Open MPI");
            return;
        }
        let dir = tmp("losses");
        let (art, log) = (dir.join("art"), dir.join("log"));
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let c = Command::new(exe())
            .arg("compile")
            .arg(root.join("models/quickstart.ir"))
            .arg("-o")
            .arg(&art)
            .arg("--config")
            .arg(root.join("models/parallel_8.toml"))
            .output()
            .unwrap();
        assert!(c.status.success(), "{}", text(&c));
        let m = mpirun(
            8,
            &[
                "run",
                art.to_str().unwrap(),
                "--steps",
                "4",
                "--comm",
                "mpi",
            ],
        );
        assert!(m.status.success(), "{}", text(&m));
        // Every rank prints the global loss: 8 x 4 lines, 4 distinct.
        let mut mpi_lines = loss_lines(&String::from_utf8_lossy(&m.stdout));
        assert_eq!(mpi_lines.len(), 32, "{}", text(&m));
        mpi_lines.sort();
        mpi_lines.dedup();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
            .to_string();
        let n = Command::new(exe())
            .args(["launch", "--worker-num", "8", "--local-worker-num", "8"])
            .args(["--master-port", &port, "--join", "--log-dir"])
            .arg(&log)
            .args(["--", "shardc", "run", art.to_str().unwrap(), "--steps", "4"])
            .output()
            .unwrap();
        assert!(n.status.success(), "{}", text(&n));
        let mut native =
            loss_lines(&std::fs::read_to_string(log.join("1/rank.0/stdout")).unwrap_or_default());
        native.sort();
        assert_eq!(mpi_lines, native);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A pipeline under `mpirun --comm mpi`: the 2-layer transformer as 2 stages × 2-way data
    /// parallel, 1F1B over 4 micro-batches, with optimizer sharding: the last stage's ranks
    /// print the single device's losses, sends and receives between stages going over MPI.
    #[test]
    fn mpirun_runs_pipeline_stages_with_the_single_device_losses() {
        if !have_mpirun() {
            eprintln!("SKIP: mpirun not found; bash scripts/install-mpi.sh installs Open MPI");
            return;
        }
        let dir = tmp("pipeline");
        std::fs::create_dir_all(&dir).unwrap();
        let (one, pipe) = super::cli_common::compile_pipelined_transformer(
            &dir,
            &["--enable-parallel-optimizer"],
        );
        let reference = loss_lines(&super::cli_common::shardc_ok(&[
            "run",
            one.to_str().unwrap(),
            "--steps",
            "3",
        ]));
        assert_eq!(reference.len(), 3);
        let o = mpirun(
            4,
            &[
                "run",
                pipe.to_str().unwrap(),
                "--steps",
                "3",
                "--comm",
                "mpi",
            ],
        );
        assert!(o.status.success(), "{}", text(&o));
        let out = String::from_utf8_lossy(&o.stdout);
        for r in 0..4 {
            let stage = r / 2;
            assert!(
                out.contains(&format!("rank {r}: pipeline stage {stage} of 2")),
                "{}",
                text(&o)
            );
        }
        // The two last-stage ranks print 3 losses each; the values are the single device's
        // to f32 rounding of another summation order.
        let got = loss_lines(&out);
        assert_eq!(got.len(), 6, "{}", text(&o));
        let value = |l: &str| -> f64 { l.rsplit(' ').next().unwrap().parse().unwrap() };
        for l in &got {
            let step = reference
                .iter()
                .find(|r| r.split(", loss is ").next() == l.split(", loss is ").next())
                .unwrap_or_else(|| panic!("{l}: no such step in {reference:?}"));
            let (a, b) = (value(l), value(step));
            assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{l} vs {step}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Ascend ranks started by `mpirun` (MindSpore's GPU and Ascend tutorials' launcher): MPI
    /// carries rank 0's HCCL root info to the others, HCCL (the emulated CANN here) runs the
    /// collectives, and every rank prints the CPU's losses.
    #[test]
    fn mpirun_starts_ascend_ranks_with_hccl() {
        if !have_mpirun() {
            eprintln!("SKIP: mpirun not found; bash scripts/install-mpi.sh installs Open MPI");
            return;
        }
        let dir = tmp("ascend");
        let art = dir.join("art");
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let c = Command::new(exe())
            .arg("compile")
            .arg(root.join("models/quickstart.ir"))
            .arg("-o")
            .arg(&art)
            .args(["--device-num", "2", "--parallel-mode", "data_parallel"])
            .output()
            .unwrap();
        assert!(c.status.success(), "{}", text(&c));
        let cpu = Command::new(exe())
            .args(["run", art.to_str().unwrap(), "--steps", "3"])
            .output()
            .unwrap();
        assert!(cpu.status.success(), "{}", text(&cpu));
        let mut cmd = Command::new("mpirun");
        cmd.args(["--allow-run-as-root", "--oversubscribe", "-n", "2"])
            .args(["--mca", "btl", "self,vader"]);
        if let Some(cann) = super::ascend_common::cann_dir() {
            cmd.env("SHARDC_ASCEND_LIB_DIRS", cann)
                .args(["-x", "SHARDC_ASCEND_LIB_DIRS"]);
        }
        let m = cmd
            .arg(exe())
            .args([
                "run",
                art.to_str().unwrap(),
                "--steps",
                "3",
                "--comm",
                "mpi",
            ])
            .args(["--device-target", "Ascend"])
            .output()
            .expect("mpirun runs");
        let t = text(&m);
        assert!(m.status.success(), "{t}");
        assert!(t.contains("2 ranks on Ascend"), "{t}");
        assert!(t.contains("collectives through HCCL"), "{t}");
        // Both ranks print every step's global loss; the CPU's to 1e-5 (HCCL's sums and the
        // aclnn kernels round differently from the CPU's).
        let value = |l: &String| -> f64 {
            l.split(", loss is ")
                .nth(1)
                .unwrap()
                .trim()
                .parse()
                .unwrap()
        };
        let npu = loss_lines(&String::from_utf8_lossy(&m.stdout));
        let want = loss_lines(&String::from_utf8_lossy(&cpu.stdout));
        assert_eq!(npu.len(), 2 * want.len(), "{t}");
        for l in &npu {
            let step = l.split(", loss is ").next().unwrap();
            let w = want
                .iter()
                .find(|w| w.starts_with(step))
                .expect("the CPU's step");
            assert!(
                (value(l) - value(w)).abs() <= 1e-5 * value(w).abs().max(1.0),
                "{l} vs {w}"
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn mpirun_passes_the_collectives_conformance_suite() {
        if !have_mpirun() {
            eprintln!("SKIP: mpirun not found; bash scripts/install-mpi.sh installs Open MPI");
            return;
        }
        let m = mpirun(4, &["check-collectives", "--comm", "mpi"]);
        let t = text(&m);
        assert!(m.status.success(), "{t}");
        assert_eq!(t.matches("collective checks passed").count(), 4, "{t}");
        assert!(t.contains("MPI"), "{t}");
    }

    /// The GPU tutorials' sanity check as they start it, `mpirun -n 4` and no token: a training
    /// program's `communication::init()` joins through MPI in a build with the feature
    /// (`--device-target CPU`: the cluster's communicator stands in for NCCL).
    #[test]
    fn mpirun_starts_nccl_allgather_without_a_token() {
        if !have_mpirun() {
            eprintln!("SKIP: mpirun not found; bash scripts/install-mpi.sh installs Open MPI");
            return;
        }
        let exe = std::env::current_exe().expect("test path");
        let bin = exe
            .parent()
            .and_then(Path::parent)
            .expect("target/<profile>/deps/..")
            .join("examples/nccl_allgather");
        let mut targets = vec![&["--device-target", "CPU"][..]];
        // NCCL emulated over MPI between the ranks' emulated GPUs.
        if shardc::cuda::emulator::EmulatedDevice::new(64).is_ok() {
            targets.push(&["--device-target", "GPU", "--gpu", "emulator"][..]);
        }
        for target in targets {
            let m = mpirun_program(4, &bin, target);
            let t = text(&m);
            assert!(m.status.success(), "{target:?}: {t}");
            assert_eq!(
                String::from_utf8_lossy(&m.stdout)
                    .matches("[[0.], [1.], [2.], [3.]]")
                    .count(),
                4,
                "{target:?}: {t}"
            );
        }
    }
}
