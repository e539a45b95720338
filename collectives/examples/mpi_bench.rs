//! AllReduce (sum, Float32) on the world through [`MpiComm`] against a raw `MPI_Allreduce` in
//! the same binary, at 4 KiB and 16 MiB (feature `mpi`):
//!
//! ```text
//! cargo build --release -p shardc-collectives --features mpi --example mpi_bench
//! mpirun --allow-run-as-root --oversubscribe -n 2 target/release/examples/mpi_bench
//! ```
//!
//! Rank 0 prints, per size, the best and median time per call over several batches and the
//! algorithm bandwidth (bytes / time) of the best batch.

use mpi::ffi;
use shardc_collectives::mpi::MpiComm;
use shardc_ir::ReduceOp;
use shardc_runtime::comm::Communicator;
use shardc_runtime::tensor::Tensor;
use std::os::raw::{c_int, c_void};
use std::time::Instant;

/// Batches per measurement; the best and the median are reported.
const BATCHES: usize = 7;

fn raw_allreduce(send: &[f32], recv: &mut [f32]) -> Result<(), String> {
    // SAFETY: MPI is initialized (by MpiComm) and used by this thread only; both buffers hold
    // `send.len()` floats.
    let rc = unsafe {
        ffi::MPI_Allreduce(
            send.as_ptr().cast::<c_void>(),
            recv.as_mut_ptr().cast::<c_void>(),
            send.len() as c_int,
            ffi::RSMPI_FLOAT,
            ffi::RSMPI_SUM,
            ffi::RSMPI_COMM_WORLD,
        )
    };
    if rc == ffi::MPI_SUCCESS as c_int {
        Ok(())
    } else {
        Err(format!("MPI_Allreduce failed with code {rc}"))
    }
}

/// Times `iters` calls of `f` per batch, `BATCHES` batches, each after a barrier; returns the
/// per-call seconds of the batches, sorted.
fn time(
    comm: &MpiComm,
    world: &[usize],
    iters: usize,
    mut f: impl FnMut() -> Result<(), String>,
) -> Result<Vec<f64>, String> {
    for _ in 0..iters.min(10) {
        f()?;
    }
    let mut per_call = Vec::with_capacity(BATCHES);
    for _ in 0..BATCHES {
        comm.barrier(world).map_err(|e| e.to_string())?;
        let start = Instant::now();
        for _ in 0..iters {
            f()?;
        }
        per_call.push(start.elapsed().as_secs_f64() / iters as f64);
    }
    per_call.sort_by(f64::total_cmp);
    Ok(per_call)
}

fn run(comm: &MpiComm) -> Result<(), String> {
    let world: Vec<usize> = (0..comm.size()).collect();
    if comm.rank() == 0 {
        println!(
            "AllReduce sum Float32, {} ranks, {} ({} batches; best and median per call)",
            comm.size(),
            MpiComm::library_version().lines().next().unwrap_or(""),
            BATCHES
        );
        println!(
            "{:>9} {:>22} {:>22} {:>8}",
            "size", "MpiComm", "MPI_Allreduce", "ratio"
        );
    }
    for (bytes, iters) in [(4usize << 10, 2000usize), (16 << 20, 20)] {
        let n = bytes / 4;
        let mut t = Tensor::from_f32(vec![n], vec![0.0; n]).ok_or("bad tensor")?;
        let ours = time(comm, &world, iters, || {
            comm.all_reduce(&world, ReduceOp::Sum, &mut t)
                .map_err(|e| e.to_string())
        })?;
        let send = vec![0.0f32; n];
        let mut recv = vec![0.0f32; n];
        let raw = time(comm, &world, iters, || raw_allreduce(&send, &mut recv))?;
        if comm.rank() == 0 {
            let fmt = |v: &[f64]| {
                let best = v[0];
                let med = v[v.len() / 2];
                if bytes >= 1 << 20 {
                    format!(
                        "{:.2}/{:.2} ms {:.2} GB/s",
                        best * 1e3,
                        med * 1e3,
                        bytes as f64 / best / 1e9
                    )
                } else {
                    format!("{:.1}/{:.1} us", best * 1e6, med * 1e6)
                }
            };
            let label = if bytes >= 1 << 20 {
                format!("{} MiB", bytes >> 20)
            } else {
                format!("{} KiB", bytes >> 10)
            };
            println!(
                "{label:>9} {:>22} {:>22} {:>7.2}x",
                fmt(&ours),
                fmt(&raw),
                ours[0] / raw[0]
            );
        }
    }
    Ok(())
}

fn main() {
    let comm = match MpiComm::init() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("mpi_bench: {e}");
            std::process::exit(2);
        }
    };
    let result = run(&comm);
    drop(comm);
    if let Err(e) = result {
        eprintln!("mpi_bench: {e}");
        std::process::exit(1);
    }
}
