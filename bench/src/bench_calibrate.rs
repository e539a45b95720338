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
//!   on stderr.

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
    };
    d.validate()?;
    d.save(&args.device_file)?;
    print!("{}", d.to_toml());
    eprintln!("calibrate: wrote {}", args.device_file.display());
    Ok(())
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
    fn memory_is_read() {
        assert!(mem_total().unwrap() > 1 << 20);
    }
}
