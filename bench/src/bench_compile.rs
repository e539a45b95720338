//! `shardc bench compile`: how long the parallel compiler takes on a large model.
//!
//! The model is the transformer of [`shardc_compiler::transformer`] (by default 24 layers,
//! hidden 1024, 16 heads, sequence 512, batch 8: BERT-large's shape), trained with
//! `Momentum(0.01, 0.9)`. For each device count (8 and 64) it is compiled twice:
//!
//! - `semi_auto_parallel` with the first layer's Q, K and V `MatMul`s annotated for model
//!   parallelism (`((1, 1), (1, N))`: the weight's columns over the N devices; where N does not
//!   divide the hidden size, the data-parallel `((N, 1), (1, 1))` instead), every other op on
//!   the semi-auto default;
//! - `auto_parallel` with only those annotations (the rest by sharding propagation).
//!
//! Each case runs the one pipeline ([`shardc_compiler::pipeline::compile`]) `repeats` times
//! and reports medians, per pass from the pipeline's own records: the single-device training
//! step (`infer_types`, `autodiff`), (a) strategy assignment (`sync_bn`,
//! `step_parallel_begin`), (b) the partition into the program of every rank
//! (`step_parallel_end`: rank 0's graph and what differs per rank), (c) the whole pipeline
//! (gradient fusion and every rank's graph materialized included). It prints one line per case with the op counts
//! (logical training-step nodes, rank 0's nodes, rank 0's inserted communication ops by kind
//! and all ranks' total), the seconds, and the pipeline's time as a ratio of the 1 s goal:
//!
//! ```text
//! compile transformer L=24 H=1024 A=16 S=512 B=8 mode=semi_auto_parallel devices=8 logical_nodes=… rank0_nodes=… comm_rank0={AllReduce: …} comm_all_ranks=… train_step=0.100 s assign=0.012 s partition=0.345 s pipeline=0.678 s ratio_vs_goal=0.68 (goal <= 1 s: met)
//! ```

use anyhow::{Context, Result};
use shardc_compiler::optim::Momentum;
use shardc_compiler::pipeline::{compile, CompileOptions};
use shardc_compiler::transformer::{transformer, TransformerConfig};
use shardc_ir::{Graph, Strategy};
use shardc_passes::autodiff::Optimizer;
use shardc_passes::parallel::{DatasetLayout, Mode, ParallelOptions};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// The goal for compiling one training step for all ranks, in seconds.
pub const GOAL_SECONDS: f64 = 1.0;

/// What `shardc bench compile` measures.
#[derive(Clone, Debug, PartialEq)]
pub struct CompileBench {
    /// The model (its annotations are replaced by the benchmark's).
    pub model: TransformerConfig,
    /// Device counts, each compiled in both modes.
    pub devices: Vec<usize>,
    /// Runs per case; the median is reported.
    pub repeats: usize,
}

impl CompileBench {
    /// The benchmark proper: 24 layers, hidden 1024, 16 heads, sequence 512, batch 8, on 8
    /// and 64 devices, 3 runs per case (1 with `quick`).
    pub fn standard(quick: bool) -> Self {
        CompileBench {
            model: TransformerConfig::new(24, 1024, 16, 512, 8),
            devices: vec![8, 64],
            repeats: if quick { 1 } else { 3 },
        }
    }
}

/// The figures of one case.
#[derive(Clone, Debug, PartialEq)]
pub struct CaseResult {
    /// `semi_auto_parallel` or `auto_parallel`.
    pub mode: &'static str,
    /// Number of devices.
    pub devices: usize,
    /// Nodes of the logical training step.
    pub logical_nodes: usize,
    /// Nodes of rank 0's graph.
    pub rank0_nodes: usize,
    /// Rank 0's communication ops, by op name.
    pub comm_rank0: BTreeMap<String, usize>,
    /// Communication ops over all ranks.
    pub comm_all_ranks: usize,
    /// The single-device training step (types, autodiff, verification): the part of the
    /// pipeline before the parallel stages (median).
    pub train_step: Duration,
    /// Strategy assignment (median).
    pub assign: Duration,
    /// Partition into the program of all ranks (median).
    pub partition: Duration,
    /// The whole pipeline, forward graph to verified per-rank graphs (median).
    pub pipeline: Duration,
}

impl CaseResult {
    /// The pipeline's time over the goal.
    pub fn ratio_vs_goal(&self) -> f64 {
        self.pipeline.as_secs_f64() / GOAL_SECONDS
    }

    /// The line printed for the case.
    pub fn line(&self, model: &TransformerConfig) -> String {
        let comm: Vec<String> = self
            .comm_rank0
            .iter()
            .map(|(k, v)| format!("{k}: {v}"))
            .collect();
        let ratio = self.ratio_vs_goal();
        format!(
            "compile transformer L={} H={} A={} S={} B={} mode={} devices={} logical_nodes={} \
             rank0_nodes={} comm_rank0={{{}}} comm_all_ranks={} train_step={:.3} s assign={:.3} s \
             partition={:.3} s pipeline={:.3} s ratio_vs_goal={:.2} (goal <= {} s: {})",
            model.layers,
            model.hidden,
            model.heads,
            model.seq,
            model.batch,
            self.mode,
            self.devices,
            self.logical_nodes,
            self.rank0_nodes,
            comm.join(", "),
            self.comm_all_ranks,
            self.train_step.as_secs_f64(),
            self.assign.as_secs_f64(),
            self.partition.as_secs_f64(),
            self.pipeline.as_secs_f64(),
            ratio,
            GOAL_SECONDS,
            if ratio <= 1.0 { "met" } else { "missed" }
        )
    }
}

/// The strategy of the first layer's Q, K and V `MatMul`s on `devices` devices: their weights'
/// columns split (`((1, 1), (1, N))`) when `N` divides the hidden size, else the batch split
/// `((N, 1), (1, 1))` when `N` divides the tokens, else none.
pub fn qkv_annotations(model: &TransformerConfig, devices: usize) -> Vec<(String, Strategy)> {
    let n = devices as i64;
    let s = if model.hidden % devices == 0 {
        Strategy(vec![vec![1, 1], vec![1, n]])
    } else if model.tokens() % devices == 0 {
        Strategy(vec![vec![n, 1], vec![1, 1]])
    } else {
        return Vec::new();
    };
    ["q", "k", "v"]
        .iter()
        .map(|m| (format!("layer0_attn_{m}_matmul"), s.clone()))
        .collect()
}

/// The optimizer of the benchmark.
fn optimizer() -> Optimizer {
    Momentum::new(0.01, 0.9).to_spec()
}

fn options(mode: Mode, devices: usize) -> ParallelOptions {
    ParallelOptions {
        mode,
        device_num: devices,
        dataset: DatasetLayout::DataParallel,
        gradients_mean: true,
        enable_alltoall: false,
        search: Default::default(),
        parallel_optimizer: None,
    }
}

/// The median of `samples` (not empty).
fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

/// Measures one case: `forward` (annotated) in `mode` on `devices` devices.
pub fn measure_case(
    forward: &Graph,
    mode: Mode,
    devices: usize,
    repeats: usize,
) -> Result<CaseResult> {
    let mode_name = match mode {
        Mode::DataParallel => "data_parallel",
        Mode::SemiAutoParallel => "semi_auto_parallel",
        Mode::AutoParallel => "auto_parallel",
    };
    let opts = options(mode, devices);
    // The one pipeline, run whole `repeats` times; each pass's time is its record's.
    let mut walls = Vec::new();
    let mut per_pass: BTreeMap<&'static str, Vec<Duration>> = BTreeMap::new();
    let mut last = None;
    for _ in 0..repeats.max(1) {
        let t0 = Instant::now();
        let c = compile(
            forward.clone(),
            &CompileOptions {
                optimizer: Some(optimizer()),
                parallel: Some(opts.clone()),
                ..Default::default()
            },
        )
        .with_context(|| format!("{mode_name} on {devices} devices: the pipeline"))?;
        walls.push(t0.elapsed());
        for r in &c.stages {
            per_pass
                .entry(r.name)
                .or_default()
                .push(Duration::from_secs_f64(r.seconds));
        }
        last = Some(c);
    }
    let c = last.context("no run")?;
    let pass = |names: &[&str]| -> Duration {
        names
            .iter()
            .filter_map(|n| per_pass.get(n).cloned().map(median))
            .sum()
    };
    let train_step = pass(&["infer_types", "autodiff"]);
    let assign = pass(&["sync_bn", "step_parallel_begin"]);
    let partition = pass(&["step_parallel_end"]);
    let pipeline = median(walls);
    let step = &c.graph;
    let program = &c
        .parallel
        .as_ref()
        .context("a parallel compile has its program")?
        .program;
    let rank0 = &program.template;
    let mut comm_rank0 = BTreeMap::new();
    for n in rank0.nodes.iter().filter(|n| n.op.is_communication()) {
        *comm_rank0.entry(n.op.name().to_string()).or_insert(0) += 1;
    }
    let mut comm_all_ranks = 0;
    for r in 0..devices {
        let g = program
            .materialize(r)
            .with_context(|| format!("{mode_name} on {devices} devices: rank {r}"))?;
        comm_all_ranks += g.nodes.iter().filter(|n| n.op.is_communication()).count();
    }
    Ok(CaseResult {
        mode: mode_name,
        devices,
        logical_nodes: step.nodes.len(),
        rank0_nodes: rank0.nodes.len(),
        comm_rank0,
        comm_all_ranks,
        train_step,
        assign,
        partition,
        pipeline,
    })
}

/// Runs the benchmark, printing one line per case (and the forward graph's build time);
/// returns every case's figures.
pub fn run(bench: &CompileBench) -> Result<Vec<CaseResult>> {
    let mut results = Vec::new();
    for &devices in &bench.devices {
        let mut model = bench.model.clone();
        model.annotations = qkv_annotations(&model, devices);
        let t0 = Instant::now();
        let forward = transformer(&model).context("building the transformer")?;
        let build = t0.elapsed();
        println!(
            "build transformer L={} devices={devices}: {} forward nodes, {} parameters in {:.3} s",
            model.layers,
            forward.nodes.len(),
            forward.params.len(),
            build.as_secs_f64()
        );
        for mode in [Mode::SemiAutoParallel, Mode::AutoParallel] {
            let r = measure_case(&forward, mode, devices, bench.repeats)?;
            println!("{}", r.line(&model));
            results.push(r);
        }
    }
    Ok(results)
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardc_backend_cpu::CpuBackend;
    use shardc_ir::{OpKind, ParamKind, TensorLayout};
    use shardc_runtime::data::SyntheticData;
    use shardc_runtime::executor::Executor;
    use shardc_runtime::Tensor;
    use shardc_tools::in_process::{rel, run_ranks, tensor_rel};
    use std::sync::Arc;

    fn tiny() -> TransformerConfig {
        TransformerConfig::new(2, 16, 2, 4, 2)
    }

    #[test]
    fn runs_on_a_two_layer_transformer() {
        let bench = CompileBench {
            model: tiny(),
            devices: vec![2, 4],
            repeats: 1,
        };
        let results = run(&bench).unwrap();
        assert_eq!(results.len(), 4);
        for r in &results {
            assert!(r.logical_nodes > 2 * 2 * 31, "{r:?}");
            assert!(r.rank0_nodes >= r.logical_nodes, "{r:?}");
            // Some communication: the gradients of replicated weights are reduced, or the
            // activations they need gathered, as the plan finds cheaper.
            assert!(r.comm_rank0.values().sum::<usize>() > 0, "{r:?}");
            assert!(r.comm_all_ranks >= r.devices, "{r:?}");
            let line = r.line(&bench.model);
            assert!(line.contains("ratio_vs_goal="), "{line}");
            assert!(line.contains(&format!("devices={}", r.devices)), "{line}");
        }
    }

    /// (That `shardc bench compile --quick` reaches this benchmark is checked where the
    /// command line is: the `shardc` binary's tests.)
    #[test]
    fn the_standard_benchmark_is_the_24_layer_transformer() {
        let s = CompileBench::standard(false);
        assert_eq!(
            (
                s.model.layers,
                s.model.hidden,
                s.model.heads,
                s.model.seq,
                s.model.batch
            ),
            (24, 1024, 16, 512, 8)
        );
        assert_eq!(s.devices, vec![8, 64]);
    }

    #[test]
    fn qkv_annotations_fall_back_to_data_parallel() {
        let m = tiny();
        let a = qkv_annotations(&m, 4);
        assert_eq!(a.len(), 3);
        assert_eq!(a[0].0, "layer0_attn_q_matmul");
        assert_eq!(a[2].1, Strategy(vec![vec![1, 1], vec![1, 4]]));
        // 32 does not divide hidden 16, but divides no tokens either (8): none.
        assert!(qkv_annotations(&m, 32).is_empty());
        // 8 does not divide hidden 12 but divides the 8 tokens: the batch split.
        let m = TransformerConfig::new(1, 12, 2, 4, 2);
        assert_eq!(
            qkv_annotations(&m, 8)[1].1,
            Strategy(vec![vec![8, 1], vec![1, 1]])
        );
    }

    /// Trains the tiny transformer for 3 steps on one device and on `devices` devices in
    /// `mode` (with the first layer's Q/K/V column-split when `annotate`); returns the largest
    /// relative difference of the losses and of the gathered weights (against the largest
    /// magnitude of each reference weight).
    fn parallel_difference(mode: Mode, devices: usize, annotate: bool) -> (f64, f64) {
        let mut cfg = tiny();
        if annotate {
            cfg.annotations = qkv_annotations(&cfg, devices);
        }
        let forward = transformer(&cfg).unwrap();
        let steps = 3u64;
        let single = compile(
            forward.clone(),
            &CompileOptions {
                optimizer: Some(optimizer()),
                ..Default::default()
            },
        )
        .unwrap()
        .graph;
        let par = compile(
            forward,
            &CompileOptions {
                optimizer: Some(optimizer()),
                parallel: Some(options(mode, devices)),
                ..Default::default()
            },
        )
        .unwrap()
        .parallel
        .unwrap();
        let data = SyntheticData::new(&single, 1, steps as usize).unwrap();
        let feeds = |step: u64| -> Vec<(String, Tensor)> {
            data.feeds(step)
                .into_iter()
                .map(|(n, t)| (n.to_string(), t))
                .collect()
        };
        let mut exec =
            Executor::new(single.clone(), Arc::new(CpuBackend::with_threads(1))).unwrap();
        let mut ref_losses = Vec::new();
        for step in 0..steps {
            let f = feeds(step);
            let refs: Vec<(&str, Tensor)> =
                f.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
            ref_losses.push(exec.step(&refs).unwrap()[0].scalar_value().unwrap());
        }
        let layouts: Vec<(String, TensorLayout, ParamKind)> = par
            .begin
            .params
            .iter()
            .zip(&par.assignment.param_layouts)
            .map(|(p, l)| (p.name.clone(), l.clone(), p.kind.clone()))
            .collect();
        let inputs: Vec<(String, TensorLayout)> = layouts
            .iter()
            .filter(|(_, _, k)| *k == ParamKind::Input)
            .map(|(n, l, _)| (n.clone(), l.clone()))
            .collect();
        let res = run_ranks(par.ranks.clone(), &inputs, &feeds, steps, 1).unwrap();
        let mut loss_diff: f64 = 0.0;
        for (k, &l) in ref_losses.iter().enumerate() {
            for rank in &res.outputs {
                loss_diff = loss_diff.max(rel(rank[k][0].scalar_value().unwrap(), l));
            }
        }
        let mut weight_diff: f64 = 0.0;
        for (name, layout, _) in &layouts {
            let Some(reference) = exec.param(name) else {
                continue;
            };
            let whole = res.gathered_weight(name, layout).unwrap();
            weight_diff = weight_diff.max(tensor_rel(&whole, reference));
        }
        (loss_diff, weight_diff)
    }

    #[test]
    fn semi_auto_parallel_transformer_matches_one_device() {
        for devices in [2, 4] {
            for annotate in [false, true] {
                let (loss, weights) =
                    parallel_difference(Mode::SemiAutoParallel, devices, annotate);
                eprintln!("semi_auto_parallel {devices} devices, annotated {annotate}: loss {loss:e}, weights {weights:e}");
                assert!(
                    loss <= 1e-5 && weights <= 1e-5,
                    "{devices} devices, annotated {annotate}: loss diff {loss:e}, weight diff {weights:e}"
                );
            }
        }
    }

    #[test]
    fn auto_parallel_transformer_matches_one_device() {
        for devices in [2, 4] {
            let (loss, weights) = parallel_difference(Mode::AutoParallel, devices, true);
            eprintln!("auto_parallel {devices} devices: loss {loss:e}, weights {weights:e}");
            assert!(
                loss <= 1e-5 && weights <= 1e-5,
                "{devices} devices: loss diff {loss:e}, weight diff {weights:e}"
            );
        }
    }

    #[test]
    fn communication_is_counted_per_kind() {
        let mut cfg = tiny();
        cfg.annotations = qkv_annotations(&cfg, 2);
        let forward = transformer(&cfg).unwrap();
        let r = measure_case(&forward, Mode::SemiAutoParallel, 2, 1).unwrap();
        let total: usize = r.comm_rank0.values().sum();
        assert!(total > 0);
        for k in r.comm_rank0.keys() {
            assert!(
                [
                    OpKind::AllReduce,
                    OpKind::AllGather,
                    OpKind::ReduceScatter,
                    OpKind::AllToAll,
                    OpKind::Broadcast,
                    OpKind::Send,
                    OpKind::Receive
                ]
                .iter()
                .any(|o| o.name() == k),
                "{k}"
            );
        }
    }
}
