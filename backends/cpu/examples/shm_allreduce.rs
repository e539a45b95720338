//! A quick measurement of the shared-memory AllReduce (f32 sum) between processes.
//!
//! `cargo run --release -p shardc-backend-cpu --example shm_allreduce -- [PROCS] [ITERS]`
//! starts PROCS processes (default 2) of this program, which time AllReduce of 4 KiB,
//! 1 MiB, 16 MiB and 64 MiB; rank 0 prints the latency per call and the bandwidth (tensor
//! bytes / time per call).

use shardc_backend_cpu::collectives::shm::{ShmComm, ShmSetup};
use shardc_ir::ReduceOp;
use shardc_runtime::comm::Communicator;
use shardc_runtime::Tensor;
use std::process::Command;
use std::time::{Duration, Instant};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let procs: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(2);
    let iters: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(0);
    if let Ok(rank) = std::env::var("SHM_BENCH_RANK") {
        let rank: usize = rank.parse().expect("SHM_BENCH_RANK");
        let job = std::env::var("SHM_BENCH_JOB").expect("SHM_BENCH_JOB");
        worker(rank, procs, &job, iters);
        return;
    }
    let exe = std::env::current_exe().expect("current_exe");
    let job = format!("bench{}", std::process::id());
    let children: Vec<_> = (0..procs)
        .map(|r| {
            Command::new(&exe)
                .args([procs.to_string(), iters.to_string()])
                .env("SHM_BENCH_RANK", r.to_string())
                .env("SHM_BENCH_JOB", &job)
                .spawn()
                .expect("spawn")
        })
        .collect();
    let mut ok = true;
    for mut c in children {
        ok &= c.wait().map(|s| s.success()).unwrap_or(false);
    }
    if !ok {
        eprintln!("a worker failed");
        std::process::exit(1);
    }
}

fn worker(rank: usize, size: usize, job: &str, iters: usize) {
    let comm = ShmComm::new(&ShmSetup {
        rank,
        size,
        job_id: job.to_string(),
        local_ranks: (0..size).collect(),
        timeout: Duration::from_secs(60),
    })
    .expect("shared-memory setup");
    let group: Vec<usize> = (0..size).collect();
    for bytes in [4usize << 10, 1 << 20, 16 << 20, 64 << 20] {
        let n = bytes / 4;
        let mut t = Tensor::from_f32(vec![n], (0..n).map(|i| (i % 97) as f32 * 0.5).collect())
            .expect("tensor");
        let reps = if iters > 0 {
            iters
        } else {
            (2_000_000_000 / (bytes * 8 + 200_000)).clamp(5, 20_000)
        };
        for _ in 0..reps.div_ceil(10).max(3) {
            comm.all_reduce(&group, ReduceOp::Sum, &mut t)
                .expect("warm-up");
        }
        comm.barrier(&group).expect("barrier");
        let start = Instant::now();
        for _ in 0..reps {
            comm.all_reduce(&group, ReduceOp::Sum, &mut t)
                .expect("all-reduce");
        }
        let per = start.elapsed().as_secs_f64() / reps as f64;
        comm.barrier(&group).expect("barrier");
        if rank == 0 {
            println!(
                "procs {size} size {:>9} B: {:>10.2} us/call {:>8.3} GB/s ({reps} calls)",
                bytes,
                per * 1e6,
                bytes as f64 / per / 1e9
            );
        }
    }
}
