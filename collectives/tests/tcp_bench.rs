//! AllReduce (f32, sum) latency and bandwidth of `TcpComm` with 2 ranks over loopback
//! (threads of this process, each with its own sockets), plain and with TLS (sealed
//! records) in the same run. Ignored by default; run with
//! `cargo test --release -p shardc-collectives --test tcp_bench -- --ignored --nocapture`.

mod pki;

use shardc_collectives::tcp::{DataPlaneTls, TcpComm, TcpSetup};
use shardc_ir::ReduceOp;
use shardc_runtime::comm::Communicator;
use shardc_runtime::tensor::Tensor;
use std::net::TcpListener;
use std::time::{Duration, Instant};

fn world(n: usize, tls: Option<DataPlaneTls>) -> Vec<TcpComm> {
    let ls: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    let peers: Vec<_> = ls.iter().map(|l| l.local_addr().unwrap()).collect();
    let hs: Vec<_> = ls
        .into_iter()
        .enumerate()
        .map(|(rank, listener)| {
            let s = TcpSetup {
                rank,
                size: n,
                job_id: "bench".into(),
                peers: peers.clone(),
                listener,
                token: None,
                tls: tls.clone(),
                timeout: Duration::from_secs(60),
            };
            std::thread::spawn(move || TcpComm::new(s).unwrap())
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap()).collect()
}

/// Per-iteration times on rank 0 (every rank runs `iters` AllReduces after a warm-up).
fn time_all_reduce(comms: &[TcpComm], elems: usize, warmup: usize, iters: usize) -> Vec<Duration> {
    let group: Vec<usize> = (0..comms.len()).collect();
    std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|c| {
                let group = &group;
                s.spawn(move || {
                    let mut t = Tensor::from_f32(vec![elems], vec![1.0; elems]).unwrap();
                    for _ in 0..warmup {
                        c.all_reduce(group, ReduceOp::Sum, &mut t).unwrap();
                    }
                    c.barrier(group).unwrap();
                    let mut times = Vec::with_capacity(iters);
                    for _ in 0..iters {
                        let start = Instant::now();
                        c.all_reduce(group, ReduceOp::Sum, &mut t).unwrap();
                        times.push(start.elapsed());
                    }
                    times
                })
            })
            .collect();
        let mut all: Vec<Vec<Duration>> = hs.into_iter().map(|h| h.join().unwrap()).collect();
        all.swap_remove(0)
    })
}

#[test]
#[ignore = "a benchmark: run with --ignored --nocapture in release"]
fn all_reduce_f32_two_ranks_over_loopback() {
    let dir = tempfile::tempdir().unwrap();
    pki::write_pki(dir.path(), "bench CA");
    let plain = world(2, None);
    let sealed = world(2, Some(pki::tls(dir.path())));
    println!("AllReduce f32 sum, 2 ranks over loopback: median per call (bytes / median)");
    for (bytes, warmup, iters) in [
        (4 << 10, 200, 3000),
        (64 << 10, 50, 500),
        (1 << 20, 20, 200),
        (16 << 20, 3, 20),
    ] {
        let median = |comms: &[TcpComm]| {
            let mut times = time_all_reduce(comms, bytes / 4, warmup, iters);
            times.sort();
            times[times.len() / 2].as_secs_f64()
        };
        let (p, t) = (median(&plain), median(&sealed));
        println!(
            "{bytes:>9} bytes: plain {:>9.1} us {:>6.2} GB/s | TLS {:>9.1} us {:>6.2} GB/s | TLS / plain time {:.2}",
            p * 1e6,
            bytes as f64 / p / 1e9,
            t * 1e6,
            bytes as f64 / t / 1e9,
            t / p
        );
    }
}
