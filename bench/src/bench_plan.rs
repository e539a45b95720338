//! `shardc bench plan`: the stage planner
//! ([`shardc_passes::parallel::search::stage_plan`]) on paper, at scale.
//!
//! GPT-style models (the transformer builder's layers, [`shardc_compiler::transformer`]:
//! post-LayerNorm encoder layers, FFN `4h`, MSE loss, no embedding or LM head) with the
//! layers / hidden / heads of the 1.3B (24, 2048, 16), 6.7B (32, 4096, 32) and 13B (40, 5120,
//! 40) configurations, sequence 2048, global batch 1024 sequences, Adam, on 64 hosts of the
//! `8xh100` preset (512 GPUs). Per model:
//!
//! - shardc's auto plan (stages, layer split, each stage's mesh `tp × dp`, micro-batches,
//!   ZeRO-1, recompute), its predicted step and MFU;
//! - the best Megatron-LM 3D plan under the same cost model, its step and MFU;
//! - the throughput ratio auto / 3D (goal ≥ 1.0 on every model) and the search time (goal
//!   < 60 s per model, release build).
//!
//! MFU = model FLOPs / (step · devices · peak), model FLOPs per step
//! `72 · B · s · L · h² · (1 + s / (6h))` = `6 · P · T + 12 · L · h · s² · B` with
//! `P = 12 · L · h²` the layers' weights and `T = B · s` the tokens (Narayanan et al. 2021
//! without the vocabulary term, as the model has no LM head; recompute's extra forward is not
//! model FLOPs); the peak is the preset's f32 FLOP/s.
//!
//! Then **weak scaling**: the 24-layer transformer of `bench search` (hidden 1024, 16 heads,
//! sequence 512, batch 8 per 8 devices) from 8 to 512 devices with the batch grown with the
//! devices; per device count the auto plan and the per-device throughput relative to 8
//! devices (goal ≥ 70 % at 512).
//!
//! `--quick` (the CLI smoke test): a small model and two device counts.

use crate::args::BenchArgs;
use anyhow::{anyhow, Context, Result};
use shardc_compiler::device::DeviceDescription;
use shardc_compiler::transformer::TransformerConfig;
pub use shardc_compiler::transformer_layers::{megatron_annotations, TransformerLayers};
use shardc_passes::parallel::search::stage_plan::{plan, PlanOptions, PlanReport, PointToPoint};

/// The throughput goal: auto plan over the best 3D plan.
pub const GOAL_RATIO: f64 = 1.0;
/// The search-time goal per model, seconds.
pub const GOAL_SEARCH_SECONDS: f64 = 60.0;
/// The weak-scaling goal at 512 devices: per-device throughput relative to 8 devices.
pub const GOAL_WEAK_SCALING: f64 = 0.7;

/// One model of the benchmark.
#[derive(Clone, Debug)]
pub struct GptModel {
    /// Its name (`1.3B`).
    pub name: &'static str,
    /// Layers.
    pub layers: usize,
    /// Hidden size.
    pub hidden: usize,
    /// Heads.
    pub heads: usize,
}

/// The three GPT configurations of the issue.
pub const GPT_MODELS: [GptModel; 3] = [
    GptModel {
        name: "1.3B",
        layers: 24,
        hidden: 2048,
        heads: 16,
    },
    GptModel {
        name: "6.7B",
        layers: 32,
        hidden: 4096,
        heads: 32,
    },
    GptModel {
        name: "13B",
        layers: 40,
        hidden: 5120,
        heads: 40,
    },
];

/// Model FLOPs of one step: `72 · B · s · L · h² · (1 + s / (6h))`.
pub fn model_flops(layers: usize, hidden: usize, seq: usize, batch: usize) -> f64 {
    let (l, h, s, b) = (layers as f64, hidden as f64, seq as f64, batch as f64);
    72.0 * b * s * l * h * h * (1.0 + s / (6.0 * h))
}

/// The cost model's assumptions, printed beside the figures.
pub fn assumptions(d: &DeviceDescription, p2p: &PointToPoint) -> Vec<String> {
    vec![
        format!(
            "machine {}: {} devices/host, {:.1} TFLOP/s f32 (the MFU peak), {:.0} GiB, memory {:.0} GB/s; \
             intra-host {:.0} GB/s {:.1} us ({}), inter-host {:.0} GB/s {:.1} us ({}), {:.0} us per collective",
            d.name,
            d.devices_per_host,
            d.flops / 1e12,
            d.memory_bytes as f64 / (1u64 << 30) as f64,
            d.memory_bandwidth(),
            d.intra_host.bandwidth_gbs,
            d.intra_host.latency_us,
            d.intra_host.algorithm.name(),
            d.inter_host.bandwidth_gbs,
            d.inter_host.latency_us,
            d.inter_host.algorithm.name(),
            d.collective_overhead_us.unwrap_or(0.0),
        ),
        format!(
            "collectives over hosts: hierarchical, as NCCL's rings over every NIC and HCCL's two-level algorithm run \
             them: within each host on the intra-host link, then across the hosts {} (AllReduce: ring or pipelined \
             tree, whichever is faster), then within each host again",
            if d.inter_host_per_device {
                "with every member on its own inter-host link at once, each moving 1/k of the buffer (a NIC per device)"
            } else {
                "over the host's one inter-host link"
            }
        ),
        format!(
            "point-to-point: intra-host {:.0} GB/s {:.1} us, inter-host {:.0} GB/s {:.1} us, {:.0} us per transfer; \
             each device sends its block of the boundary activation (forward) and of its gradient (backward), not overlapped",
            p2p.intra_host.bandwidth / 1e9,
            p2p.intra_host.latency * 1e6,
            p2p.inter_host.bandwidth / 1e9,
            p2p.inter_host.latency * 1e6,
            p2p.overhead * 1e6,
        ),
        "layers: f32, Adam (weight + gradient + 2 states), priced per op by the roofline and α–β collectives of \
         `cost::Machine`; one layer of each kind (first, middle, last + head) planned by the intra-op searcher \
         (dynamic_programming, reduced local search) and by Megatron's tp split (the rest completed as \
         sharding_propagation does) on each stage mesh, the middle layer's plan given to all"
            .into(),
        "step = (M + S - 1) * max_s t_s + max_s (gradient sync + optimizer update), 1F1B and GPipe alike; \
         bubble = (S - 1) * max_s t_s / step; gradient sync not overlapped, fused in 64 MB buckets (each bucket \
         pays one collective's overhead and latency); ZeRO-1: ReduceScatter + AllGather per bucket (one \
         AllReduce's bytes), optimizer state and update / replicas"
            .into(),
        "memory/stage = weights + gradients + optimizer state (/ replicas with ZeRO-1) + in-flight micro-batches \
         (1F1B: S - s; GPipe: M) x activations the backward reads (recompute: the layer inputs, + one layer's \
         activations, + one more forward per micro-batch); no temporaries, no fragmentation"
            .into(),
        "MFU = 72 B s L h^2 (1 + s / 6h) / (step * devices * peak) (= 6 P T + 12 L h s^2 B, P = 12 L h^2: no \
         embedding or LM head in this model)"
            .into(),
    ]
}

/// The planner's options for `devices` devices of `d`, `global_batch` samples.
pub fn plan_options(d: &DeviceDescription, devices: usize, global_batch: usize) -> PlanOptions {
    d.plan_options(devices, global_batch)
}

/// Plans `cfg` on `devices` devices of `d` with `global_batch` samples.
pub fn plan_transformer(
    cfg: &TransformerConfig,
    d: &DeviceDescription,
    devices: usize,
    global_batch: usize,
    micro_batches: &[usize],
) -> Result<PlanReport> {
    let model = TransformerLayers { cfg: cfg.clone() };
    let mut o = plan_options(d, devices, global_batch);
    o.micro_batches = micro_batches.to_vec();
    plan(&model, &o).map_err(|e| anyhow!("{e}"))
}

/// Runs the benchmark.
pub fn run(args: &BenchArgs) -> Result<()> {
    let d = match args.device.as_deref() {
        None => DeviceDescription::preset("8xh100")?,
        Some(name) if DeviceDescription::PRESETS.contains(&name) => {
            DeviceDescription::preset(name)?
        }
        Some(path) => DeviceDescription::load(std::path::Path::new(path))?,
    };
    let o = plan_options(&d, 8, 8);
    println!("plan: cost model assumptions");
    for a in assumptions(&d, &o.p2p) {
        println!("  {a}");
    }
    let peak = d.flops;
    let (models, seq, batch, devices): (Vec<GptModel>, usize, usize, usize) = if args.quick {
        (
            vec![GptModel {
                name: "tiny",
                layers: 4,
                hidden: 256,
                heads: 4,
            }],
            128,
            32,
            16,
        )
    } else {
        (GPT_MODELS.to_vec(), 2048, 1024, 512)
    };
    let mut all_met = true;
    for m in &models {
        let cfg = TransformerConfig::new(m.layers, m.hidden, m.heads, seq, batch);
        let r = plan_transformer(&cfg, &d, devices, batch, &[])
            .with_context(|| format!("planning the {} model", m.name))?;
        let flops = model_flops(m.layers, m.hidden, seq, batch);
        let mfu = |step: f64| flops / (step * devices as f64 * peak);
        println!(
            "plan model={} layers={} hidden={} heads={} seq={seq} batch={batch} devices={devices} \
             search={:.2} s ({} intra-op profiles, {} pipeline shapes; goal < {GOAL_SEARCH_SECONDS} s: {})",
            m.name,
            m.layers,
            m.hidden,
            m.heads,
            r.seconds,
            r.profiles,
            r.shapes,
            met(r.seconds < GOAL_SEARCH_SECONDS),
        );
        print!("  auto: {}", indent(&r.auto.to_string()));
        println!("  auto: MFU={:.1}%", 100.0 * mfu(r.auto.step));
        match &r.megatron {
            Some(p) => {
                print!("  3d:   {}", indent(&p.to_string()));
                let ratio = p.step / r.auto.step;
                println!(
                    "  3d:   MFU={:.1}%\n  ratio auto/3d throughput={ratio:.3} (goal >= {GOAL_RATIO}: {})",
                    100.0 * mfu(p.step),
                    met(ratio >= GOAL_RATIO - 1e-12)
                );
                all_met &= ratio >= GOAL_RATIO - 1e-12;
            }
            None => println!("  3d:   no Megatron 3D plan fits"),
        }
        all_met &= r.seconds < GOAL_SEARCH_SECONDS;
        for n in r.notes.iter().take(3) {
            println!("  note: {n}");
        }
    }
    // Weak scaling.
    let counts: Vec<usize> = if args.quick {
        vec![8, 16]
    } else {
        vec![8, 16, 32, 64, 128, 256, 512]
    };
    let (layers, hidden, heads, wseq) = if args.quick {
        (4, 256, 4, 128)
    } else {
        (24, 1024, 16, 512)
    };
    println!(
        "plan weak scaling: {layers}-layer transformer hidden={hidden} heads={heads} seq={wseq}, \
         batch 8 per 8 devices"
    );
    let mut base = None;
    let mut last_rel = 1.0;
    for &n in &counts {
        let b = 8 * n / 8;
        let cfg = TransformerConfig::new(layers, hidden, heads, wseq, b);
        let r = plan_transformer(&cfg, &d, n, b, &[])
            .with_context(|| format!("planning the weak-scaling model on {n} devices"))?;
        let per_device = (b * wseq) as f64 / r.auto.step / n as f64;
        let base = *base.get_or_insert(per_device);
        last_rel = per_device / base;
        println!(
            "  devices={n:>4} batch={b:>4} step={:.2} ms tokens/s/device={per_device:.0} \
             relative={:.1}% search={:.2} s | {}",
            r.auto.step * 1e3,
            100.0 * last_rel,
            r.seconds,
            r.auto.summary()
        );
    }
    let weak_met = last_rel >= GOAL_WEAK_SCALING;
    println!(
        "plan weak scaling at {} devices: {:.1}% of 8 devices' per-device throughput (goal >= {:.0}%: {})",
        counts.last().copied().unwrap_or(8),
        100.0 * last_rel,
        100.0 * GOAL_WEAK_SCALING,
        met(weak_met)
    );
    println!(
        "plan summary: {}",
        if all_met && weak_met {
            "every goal met"
        } else {
            "some goals missed"
        }
    );
    Ok(())
}

fn met(b: bool) -> &'static str {
    if b {
        "met"
    } else {
        "missed"
    }
}

/// Indents every line after the first by the prefix's width.
fn indent(s: &str) -> String {
    s.replace("\n  stage", "\n        stage")
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardc_passes::parallel::search::layer_profile::{
        predict_unfolded, profile, profile_layers, LayeredModel,
    };
    use shardc_passes::parallel::{
        DatasetLayout, Mode, ParallelOptions, SearchMode, SearchOptions,
    };

    fn opts(d: usize) -> ParallelOptions {
        ParallelOptions {
            mode: Mode::AutoParallel,
            device_num: d,
            dataset: DatasetLayout::DataParallel,
            gradients_mean: true,
            enable_alltoall: false,
            search: SearchOptions {
                mode: SearchMode::DynamicProgramming,
                machine: DeviceDescription::preset("8xh100").unwrap().machine(),
                max_device_memory: None,
            },
            parallel_optimizer: None,
        }
    }

    #[test]
    fn folding_prices_what_the_unfolded_graph_predicts() {
        for (layers, tp) in [(5, None), (4, Some((2, 2))), (2, None), (1, None)] {
            let model = TransformerLayers {
                cfg: TransformerConfig::new(layers, 32, 4, 8, 4),
            };
            let o = opts(4);
            let p = profile(&model, &o, SearchMode::DynamicProgramming, 4, tp)
                .unwrap()
                .unwrap();
            let folded: f64 = (0..layers)
                .map(|i| {
                    let c =
                        p.kinds[shardc_passes::parallel::search::layer_profile::kind_of(i, layers)];
                    c.forward + c.backward + c.grad_sync + c.optimizer
                })
                .sum();
            let small = model
                .layer_graph(profile_layers(layers), 4, tp)
                .unwrap()
                .unwrap();
            let whole = model.layer_graph(layers, 4, tp).unwrap().unwrap();
            let unfolded = predict_unfolded(
                &model,
                &o,
                &small,
                &whole,
                SearchMode::DynamicProgramming,
                tp.is_some(),
            )
            .unwrap();
            assert!(
                (folded - unfolded).abs() <= 1e-9 * unfolded,
                "L={layers} tp={tp:?}: folded {folded} vs unfolded {unfolded}"
            );
        }
    }

    #[test]
    fn the_auto_plan_is_never_slower_than_the_best_3d_plan_and_memory_binds() {
        let cfg = TransformerConfig::new(4, 64, 4, 16, 16);
        let d = DeviceDescription::preset("8xh100").unwrap();
        let r = plan_transformer(&cfg, &d, 16, 16, &[1, 2, 4, 8]).unwrap();
        let m = r.megatron.as_ref().expect("a 3D plan");
        assert!(r.auto.step <= m.step * (1.0 + 1e-12), "{} vs {}", r.auto, m);
        // A tight limit: the plan fits it, and it is slower or equal.
        let model = TransformerLayers { cfg: cfg.clone() };
        let mut o = plan_options(&d, 16, 16);
        o.micro_batches = vec![1, 2, 4, 8];
        let tight = r.auto.peak_memory() * 0.5;
        o.memory_limit = tight;
        match plan(&model, &o) {
            Ok(t) => {
                assert!(t.auto.peak_memory() <= tight);
                assert!(t.auto.step >= r.auto.step * (1.0 - 1e-12));
            }
            Err(e) => assert!(e.to_string().contains("the least any plan needs"), "{e}"),
        }
        o.memory_limit = 1024.0;
        let e = plan(&model, &o).unwrap_err().to_string();
        assert!(
            e.contains("no pipeline plan fits") && e.contains("the least any plan needs"),
            "{e}"
        );
    }
}
