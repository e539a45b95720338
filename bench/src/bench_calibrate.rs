//! `shardc bench calibrate`: measures this machine for the cost model and writes a device
//! description ([`shardc_compiler::device::DeviceDescription`], TOML).
//!
//! A device here is one worker process with one kernel thread, as `shardc launch` runs them:
//! - `devices_per_host`: the logical CPUs;
//! - `flops`: shardc's f32 GEMM (n = 1024, one thread), the median rate;
//! - `memory_bytes`: `MemTotal` of `/proc/meminfo` divided by the devices;
//! - `memory_bandwidth_gbs`: one thread adding two 64 MiB f32 arrays into a third (bytes read
//!   and written per second, the median of 5), the roofline of memory-bound ops;
//! - `intra_host`: AllReduce between 2 worker processes over shared memory (the cluster's data
//!   plane, measured as `shardc bench collectives` does) at 4 KiB and 16 MiB, fitted to the
//!   shared-memory model `t = 2 (p − 1) α + 2 S / β` (`algorithm = "shared_memory"`: a member
//!   copies the whole buffer whatever the group's size);
//! - `vector_flops`: the CPU backend's GeLU kernel on one thread, in the cost model's vector
//!   FLOP/s (as `shardc bench strategies` measures it);
//! - `collective_overhead_us`: what a collective costs inside a step beyond its messages, with
//!   one rank per logical CPU (threads of this process doing a fixed piece of work between
//!   AllReduces with a partner; see
//!   [`crate::bench_strategies::collective_overhead_seconds`]);
//! - `inter_host`: not measurable on one host: the `cpu` preset's Ethernet figures, said so
//!   on stderr;
//! - `point_to_point`: Send / Receive between two ranks of this process (threads, as
//!   in-process ranks run: the message is handed over through the host's memory), one way,
//!   the median of ping-pong round trips halved at 4 KiB and 16 MiB, fitted to `α + b / β`:
//!   what the stage planner prices a boundary activation between stages of one host at.

use crate::args::BenchArgs;
use crate::bench_collectives::{run_processes, CollectivesArgs, Transport};
use crate::bench_strategies::{collective_overhead_seconds, core_figures, fit_link, measure_link};
use crate::measure::shardc_gemm;
use anyhow::{anyhow, Context, Result};
use shardc_compiler::device::{DeviceDescription, Link};
use shardc_passes::parallel::cost::LinkAlgorithm;

/// Runs the calibration and writes the description to `args.device_file`.
pub fn run(args: &BenchArgs) -> Result<()> {
    let devices = std::thread::available_parallelism().map_or(1, |n| n.get());
    eprintln!("calibrate: f32 GEMM n=1024 on one thread ...");
    let gflops = shardc_gemm(1024, 1, args.quick)?;
    let memory = mem_total()? / devices as u64;
    eprintln!("calibrate: memory bandwidth (one thread, c = a + b over 64 MiB) ...");
    let membw = memory_bandwidth_gbs(if args.quick { 3 } else { 5 });
    eprintln!("calibrate: AllReduce between 2 worker processes (shared memory) ...");
    let (small, large) = (4usize << 10, 16usize << 20);
    let rows = run_processes(
        &CollectivesArgs {
            sizes: vec![small, large],
            procs: vec![2],
            iters: if args.quick { Some(5) } else { None },
            json: true,
            timeout: 120,
            transport: Transport::Processes,
        },
        2,
    )?;
    let time = |size: usize| -> Result<f64> {
        rows.iter()
            .find(|r| r.size_bytes == size)
            .map(|r| r.median_us * 1e-6)
            .ok_or_else(|| anyhow!("no AllReduce measurement of {size} bytes"))
    };
    let fit = fit_link(
        2,
        LinkAlgorithm::SharedMemory,
        (small as f64, time(small)?),
        (large as f64, time(large)?),
    );
    let intra = Link {
        bandwidth_gbs: fit.bandwidth / 1e9,
        latency_us: fit.latency * 1e6,
        algorithm: LinkAlgorithm::SharedMemory,
    };
    eprintln!("calibrate: the GeLU kernel's rate on one thread ...");
    let core = core_figures(args.quick)?;
    eprintln!("calibrate: the cost of a collective in a step, {devices} ranks ...");
    let link = measure_link(devices, args.quick, std::time::Duration::ZERO)?;
    let overhead = collective_overhead_seconds(devices, link, args.quick)?;
    let preset = DeviceDescription::preset("cpu")?;
    eprintln!(
        "calibrate: inter_host cannot be measured on one host: the cpu preset's {} GB/s, {} us (edit the file for your network)",
        preset.inter_host.bandwidth_gbs, preset.inter_host.latency_us
    );
    eprintln!("calibrate: point-to-point between two ranks (threads), 4 KiB and 16 MiB ...");
    let p2p = point_to_point_link(if args.quick { 10 } else { 40 })?;
    let d = DeviceDescription {
        name: format!("this-host-{devices}x1-thread"),
        devices_per_host: devices,
        flops: gflops * 1e9,
        memory_bytes: memory,
        memory_bandwidth_gbs: Some(membw),
        vector_flops: Some(core.vector_flops),
        collective_overhead_us: Some(overhead * 1e6),
        intra_host: intra,
        inter_host: preset.inter_host,
        inter_host_per_device: preset.inter_host_per_device,
        point_to_point: Some(p2p),
    };
    d.validate()?;
    d.save(&args.device_file)?;
    print!("{}", d.to_toml());
    eprintln!("calibrate: wrote {}", args.device_file.display());
    Ok(())
}

/// One-way seconds of a Send / Receive of `bytes` between two in-process ranks: the median
/// of `reps` ping-pong round trips (after one untimed), halved.
pub fn point_to_point_seconds(bytes: usize, reps: usize) -> Result<f64> {
    use shardc_ir::{DType, TensorType};
    use shardc_runtime::tensor::Tensor;
    use shardc_runtime::InProcessWorld;
    let comms = InProcessWorld::new(2);
    let ty = TensorType::new(DType::Float32, vec![(bytes / 4).max(1)]);
    let t = Tensor::zeros(&ty);
    let (a, b) = (comms[0].clone(), comms[1].clone());
    let mut times = std::thread::scope(|s| -> Result<Vec<f64>> {
        let ty1 = ty.clone();
        let echo = s.spawn(move || -> Result<()> {
            for i in 0..=reps {
                let x = b.recv(0, i as i64, &ty1)?;
                b.send(0, i as i64, &x)?;
            }
            Ok(())
        });
        let mut times = Vec::with_capacity(reps);
        for i in 0..=reps {
            let start = std::time::Instant::now();
            a.send(1, i as i64, &t)?;
            a.recv(1, i as i64, &ty)?;
            if i > 0 {
                times.push(start.elapsed().as_secs_f64() / 2.0);
            }
        }
        echo.join().map_err(|_| {
            anyhow!("the echoing rank of the point-to-point measurement panicked")
        })??;
        Ok(times)
    })?;
    times.sort_by(f64::total_cmp);
    times
        .get(times.len() / 2)
        .copied()
        .ok_or_else(|| anyhow!("no point-to-point measurement"))
}

/// The point-to-point link of this host: [`point_to_point_seconds`] at 4 KiB and 16 MiB
/// fitted to `α + b / β`.
pub fn point_to_point_link(reps: usize) -> Result<Link> {
    let (small, large) = (4usize << 10, 16usize << 20);
    let ts = point_to_point_seconds(small, reps)?;
    let tl = point_to_point_seconds(large, reps)?;
    let inv_beta = ((tl - ts) / (large - small) as f64).max(1e-15);
    let alpha = (ts - small as f64 * inv_beta).max(0.0);
    Ok(Link {
        bandwidth_gbs: 1.0 / inv_beta / 1e9,
        latency_us: alpha * 1e6,
        algorithm: LinkAlgorithm::Ring,
    })
}

/// Bytes per second (10⁹) one thread reads and writes adding two 64 MiB f32 arrays.
fn memory_bandwidth_gbs(reps: usize) -> f64 {
    let n = 16 << 20;
    let a = vec![1.0f32; n];
    let b = vec![2.0f32; n];
    let mut c = vec![0.0f32; n];
    let mut rates: Vec<f64> = (0..reps)
        .map(|_| {
            let t = std::time::Instant::now();
            for ((c, a), b) in c.iter_mut().zip(&a).zip(&b) {
                *c = a + b;
            }
            std::hint::black_box(&mut c);
            (3 * 4 * n) as f64 / t.elapsed().as_secs_f64().max(1e-9) / 1e9
        })
        .collect();
    rates.sort_by(f64::total_cmp);
    rates[rates.len() / 2]
}

/// `MemTotal` of `/proc/meminfo`, in bytes.
fn mem_total() -> Result<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").context("reading /proc/meminfo")?;
    text.lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .ok_or_else(|| anyhow!("/proc/meminfo has no MemTotal line"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_point_to_point_link_is_measured() {
        let l = point_to_point_link(3).unwrap();
        assert!(
            l.bandwidth_gbs > 0.0 && l.bandwidth_gbs.is_finite(),
            "{l:?}"
        );
        assert!(l.latency_us >= 0.0 && l.latency_us.is_finite(), "{l:?}");
    }

    #[test]
    fn memory_is_read() {
        assert!(mem_total().unwrap() > 1 << 20);
    }
}
