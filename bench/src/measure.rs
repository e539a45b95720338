//! What the benchmarks share to measure and print: the median of timed runs, the repetition
//! rule of `reference.py`, shardc's own GEMM rate, milliseconds as printed.

use anyhow::{Context, Result};
use shardc_backend_cpu::{sgemm, MatRef};
use std::time::{Duration, Instant};

/// The median of `samples` (which must not be empty).
pub(crate) fn median(samples: &mut [Duration]) -> Duration {
    samples.sort_unstable();
    let n = samples.len();
    if n % 2 == 1 {
        samples[n / 2]
    } else {
        (samples[n / 2 - 1] + samples[n / 2]) / 2
    }
}

/// Median wall time of `f` after one warm-up call, and the number of timed runs: at least 5
/// runs and 0.5 s in all (`quick`: 3 runs and 0.1 s) — the same rule as `reference.py`.
fn repeat(quick: bool, mut f: impl FnMut() -> Result<()>) -> Result<(Duration, usize)> {
    f()?;
    let (min_runs, min_total) = if quick {
        (3, Duration::from_millis(100))
    } else {
        (5, Duration::from_millis(500))
    };
    let mut samples = Vec::new();
    let mut total = Duration::ZERO;
    while samples.len() < min_runs || total < min_total {
        let t = Instant::now();
        f()?;
        let d = t.elapsed();
        samples.push(d);
        total += d;
    }
    let runs = samples.len();
    Ok((median(&mut samples), runs))
}

/// Deterministic pseudo-random values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            ((s.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// shardc's GFLOP/s for an n×n×n f32 product on `threads` threads.
pub(crate) fn shardc_gemm(n: usize, threads: usize, quick: bool) -> Result<f64> {
    let a = values(n * n, 1);
    let b = values(n * n, 2);
    let mut c = vec![0f32; n * n];
    let mut run = || -> Result<(Duration, usize)> {
        repeat(quick, || {
            sgemm(
                n,
                n,
                n,
                MatRef::new(&a, n),
                MatRef::new(&b, n),
                &mut c,
                threads,
            )
            .with_context(|| format!("sgemm n={n}"))
        })
    };
    let (t, _) = if threads == 1 {
        run()?
    } else {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .with_context(|| format!("starting a rayon pool of {threads} threads"))?
            .install(run)?
    };
    Ok(2.0 * (n as f64).powi(3) / t.as_secs_f64() / 1e9)
}

/// Milliseconds with three significant digits at least.
pub(crate) fn ms(v: f64) -> String {
    if v < 1.0 {
        format!("{v:.3}")
    } else {
        format!("{v:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        let ms = Duration::from_millis;
        assert_eq!(median(&mut [ms(3), ms(1), ms(2)]), ms(2));
        assert_eq!(
            median(&mut [ms(4), ms(1), ms(2), ms(3)]),
            Duration::from_micros(2500)
        );
    }

    #[test]
    fn our_gemm_measures_a_positive_rate() {
        let rate = shardc_gemm(64, 1, true).expect("sgemm runs");
        assert!(rate.is_finite() && rate > 0.0);
        let rate = shardc_gemm(64, 2, true).expect("sgemm runs on a pool");
        assert!(rate.is_finite() && rate > 0.0);
    }
}
