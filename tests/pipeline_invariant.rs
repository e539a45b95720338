//! The one invariant for pipelines, as a property: a pipelined (and optionally
//! optimizer-sharded) training step computes what one device computes on the global batch.
//! Over random models (MLPs of 2 to 4 layers, residual MLPs, a small transformer) × stage
//! counts (1, 2, 3, 4) × micro-batch counts (the stages up to 8, at least 2) × both schedules (1F1B, GPipe)
//! × random intra-op strategies on 1, 2 or 4 devices per stage × optimizer sharding on or
//! off (the gradient accumulation reduce-scattered per micro-batch or once) × recomputation
//! of random forward nodes or none, the ranks run together (a thread each, the in-process communicator, Send and Receive
//! between stages) for 2 steps: the last stage's ranks return the single device's losses,
//! and the weights gathered from the ranks that hold them (each stage its own) are the
//! single device's.
//!
//! Each case is generated from its seed; a failure prints the seed and what it drew, and
//! `SHARDC_CASE=seed cargo nextest run --test pipeline_invariant` reruns that case alone.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use shardc::compiler::builder::{BuildError, GraphBuilder, Value};
use shardc::compiler::loss::{MSELoss, SoftmaxCrossEntropyWithLogits};
use shardc::compiler::model::build_network;
use shardc::compiler::nn::FnCell;
use shardc::compiler::transformer::{transformer, TransformerConfig};
use shardc::compiler::{compile, init, optim::Momentum, CompileOptions};
use shardc::ir::{Attr, DType, Graph, OpKind};
use shardc::passes::parallel::{
    DatasetLayout, Mode, ParallelOptimizer, ParallelOptions, SearchOptions,
};
use shardc::passes::pipeline::{PipelineOptions, Scheduler};
use shardc_tools::in_process::run_ranks;

mod invariant_common;
use invariant_common::{annotate, feeds_of, layouts_of, pick, SingleDevice};

const CASES: u64 = 48;
const STEPS: u64 = 2;

/// One drawn case.
#[derive(Clone, Debug)]
struct Case {
    seed: u64,
    stages: usize,
    micro: usize,
    mesh: usize,
    scheduler: Scheduler,
    zero: bool,
    /// With `zero`: `gradient_accumulation_shard` (each micro-batch's gradient
    /// reduce-scattered and only the shard accumulated) or the accumulation reduced once.
    accumulate_shards: bool,
    /// Forward nodes marked `recompute: true`.
    recomputed: usize,
}

/// An MLP of `layers` Dense layers (f64), the layer `i`'s ops marked with its stage
/// `i * stages / layers`; `residual` adds each layer's input back where the widths agree.
fn mlp(
    rng: &mut ChaCha8Rng,
    layers: usize,
    stages: usize,
    batch: usize,
    residual: bool,
) -> Result<Graph, BuildError> {
    let width = *pick(rng, &[8usize, 16]);
    let classes = *pick(rng, &[4usize, 8]);
    let act = rng.random_range(0..3);
    let bias = rng.random_bool(0.5);
    let cross_entropy = rng.random_bool(0.5);
    let net = FnCell::new("Mlp", move |b: &mut GraphBuilder, mut x: Value| {
        for i in 0..layers {
            let out = if i + 1 == layers { classes } else { width };
            let w = b.weight(
                &format!("w{i}"),
                DType::Float64,
                &[width, out],
                init::normal(0.2),
            )?;
            let mut y = b.matmul(x, w)?;
            if bias {
                let bb = b.weight(&format!("b{i}"), DType::Float64, &[out], init::normal(0.1))?;
                y = b.bias_add(y, bb)?;
            }
            if i + 1 < layers {
                y = match act {
                    0 => b.relu(y)?,
                    1 => b.tanh(y)?,
                    _ => b.gelu(y)?,
                };
                if residual {
                    y = b.add(y, x)?;
                }
            }
            x = y;
        }
        Ok(x)
    });
    let inputs: [(&str, DType, &[usize]); 2] = [
        ("x", DType::Float64, &[batch, width]),
        ("label", DType::Float64, &[batch, classes]),
    ];
    let mut g = if cross_entropy {
        build_network(
            "Mlp",
            &net,
            &SoftmaxCrossEntropyWithLogits::new(false, "mean"),
            &inputs,
        )?
    } else {
        build_network("Mlp", &net, &MSELoss::new(), &inputs)?
    };
    // Layer i is its MatMul and what follows up to the next MatMul; the loss joins the last.
    let mut layer = 0usize;
    let mut seen = 0usize;
    for n in &mut g.nodes {
        if n.op == OpKind::MatMul {
            layer = seen;
            seen += 1;
        }
        n.attrs.set(
            "pipeline_stage",
            Attr::Int((layer * stages / layers) as i64),
        );
    }
    Ok(g)
}

/// Marks each op of layer `layerK` (its instance's prefix) with stage `K * stages / layers`.
fn stage_by_layer_scope(g: &mut Graph, layers: usize, stages: usize) {
    for n in &mut g.nodes {
        let layer = n
            .instance
            .strip_prefix("layer")
            .and_then(|s| s.split('_').next())
            .and_then(|k| k.parse::<usize>().ok());
        if let Some(k) = layer {
            n.attrs
                .set("pipeline_stage", Attr::Int((k * stages / layers) as i64));
        }
    }
}

/// The case of `seed`: its model (marked with stages) and what was drawn.
fn case_of(seed: u64) -> Result<(String, Graph, Case, f64), String> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    // One stage: gradient accumulation over micro-batches alone.
    let stages = *pick(&mut rng, &[1usize, 2, 3, 4]);
    let mesh = *pick(
        &mut rng,
        if stages == 1 {
            &[2usize, 4][..]
        } else {
            &[1, 2, 4]
        },
    );
    let micro = *pick(
        &mut rng,
        &[stages, stages * 2].map(|m| if stages == 1 { m * 2 } else { m.min(8) }),
    );
    let scheduler = if rng.random_bool(0.5) {
        Scheduler::OneFOneB
    } else {
        Scheduler::GPipe
    };
    let zero = mesh > 1 && rng.random_bool(0.3);
    let accumulate_shards = zero && rng.random_bool(0.5);
    let case = Case {
        seed,
        stages,
        micro,
        mesh,
        scheduler,
        zero,
        accumulate_shards,
        recomputed: 0,
    };
    // The batch: every data-parallel rank's micro-batches whole.
    let batch = mesh * micro * 2;
    let family = seed % 3;
    let (what, mut g, tolerance) = match family {
        0 | 1 => {
            let layers = rng.random_range(stages..=4.max(stages));
            let residual = family == 1;
            let g = mlp(&mut rng, layers, stages, batch, residual).map_err(|e| e.to_string())?;
            (
                format!(
                    "{}mlp of {layers} layers",
                    if residual { "residual " } else { "" }
                ),
                g,
                1e-9,
            )
        }
        _ => {
            // The transformer builds in f32: its tolerance is f32 rounding's.
            let layers = stages.max(2);
            let cfg = TransformerConfig::new(layers, 16, 2, 4, batch);
            let mut g = transformer(&cfg).map_err(|e| e.to_string())?;
            stage_by_layer_scope(&mut g, layers, stages);
            (format!("transformer of {layers} layers"), g, 1e-4)
        }
    };
    // Strategies over the stage's intra-op mesh.
    let notes = if mesh > 1 {
        annotate(&mut rng, &mut g, mesh, 0.3)
    } else {
        Vec::new()
    };
    // Recomputation: in some cases, about half of the forward nodes (not the loss's) are
    // replayed in the backward pass.
    let mut case = case;
    let recomputed = &mut case.recomputed;
    if rng.random_bool(0.4) {
        for n in &mut g.nodes {
            let loss = n.scope.contains("_loss_fn");
            if !loss && !n.op.is_communication() && rng.random_bool(0.5) {
                n.attrs.set("recompute", Attr::Bool(true));
                *recomputed += 1;
            }
        }
    }
    Ok((
        format!(
            "seed {seed}: {what}, {case:?}, strategies [{}]",
            notes.join("; ")
        ),
        g,
        case,
        tolerance,
    ))
}

fn run_case(seed: u64) -> Result<(), String> {
    let (what, model, case, tolerance) = case_of(seed)?;
    let opt = Momentum::new(0.1, 0.9).to_spec();
    let mut plain = model.clone();
    for n in &mut plain.nodes {
        n.in_strategy = None;
        n.out_strategy = None;
    }
    let single = compile(
        plain,
        &CompileOptions {
            optimizer: Some(opt),
            ..Default::default()
        },
    )
    .map_err(|e| format!("{what}: single-device compile: {e}"))?
    .graph;
    let device_num = case.stages * case.mesh;
    let par = compile(
        model,
        &CompileOptions {
            optimizer: Some(opt),
            parallel: Some(ParallelOptions {
                mode: Mode::SemiAutoParallel,
                device_num,
                dataset: DatasetLayout::DataParallel,
                gradients_mean: true,
                enable_alltoall: false,
                search: SearchOptions::default(),
                // Optimizer sharding: every weight split over its data-parallel group,
                // however small.
                parallel_optimizer: case.zero.then_some(ParallelOptimizer {
                    threshold_kb: 0,
                    gradient_accumulation_shard: case.accumulate_shards,
                    ..ParallelOptimizer::DEFAULT
                }),
            }),
            pipeline: PipelineOptions {
                stages: case.stages,
                micro_size: case.micro,
                scheduler: case.scheduler,
            },
            ..Default::default()
        },
    )
    .map_err(|e| format!("{what}: parallel compile: {e}"))?
    .parallel
    .ok_or_else(|| format!("{what}: no per-rank graphs"))?;

    let reference = SingleDevice::run(&what, single, case.seed, STEPS)?;
    let layouts = layouts_of(&par);
    let inputs = reference.inputs(&layouts);
    if par.ranks.len() != device_num {
        return Err(format!(
            "{what}: {} rank graphs for {device_num} devices",
            par.ranks.len()
        ));
    }
    let data = &reference.data;
    let feeds = |step: u64| feeds_of(data, step);
    let res =
        run_ranks(par.ranks, &inputs, &feeds, STEPS, 1).map_err(|e| format!("{what}: {e:#}"))?;
    // Only the last stage's ranks return the loss.
    let last_stage = (case.stages - 1) * case.mesh..device_num;
    for (r, outs) in res.outputs.iter().enumerate() {
        let has_loss = outs.iter().all(|o| !o.is_empty());
        if has_loss != last_stage.contains(&r) {
            return Err(format!(
                "{what}: rank {r} {} the loss, but the last stage is ranks {last_stage:?}",
                if has_loss {
                    "returned"
                } else {
                    "did not return"
                }
            ));
        }
    }
    reference.check(&what, &res, &layouts, tolerance)?;
    Ok(())
}

#[test]
fn pipelined_steps_equal_the_single_device_on_random_models_stages_and_strategies() {
    let only: Option<u64> = std::env::var("SHARDC_CASE")
        .ok()
        .and_then(|s| s.parse().ok());
    let seeds: Vec<u64> = match only {
        Some(s) => vec![s],
        None => (0..CASES).collect(),
    };
    let mut failures = Vec::new();
    let mut drawn = std::collections::BTreeMap::new();
    let (mut sharded, mut accumulated_shards, mut recomputing) = (0usize, 0usize, 0usize);
    for seed in seeds {
        if let Ok((_, _, c, _)) = case_of(seed) {
            sharded += c.zero as usize;
            accumulated_shards += c.accumulate_shards as usize;
            recomputing += usize::from(c.recomputed > 0);
            *drawn
                .entry((c.stages, c.micro, c.mesh, format!("{:?}", c.scheduler)))
                .or_insert(0usize) += 1;
        }
        if let Err(e) = run_case(seed) {
            failures.push(e);
        }
    }
    eprintln!(
        "cases (stages, micro-batches, mesh, schedule): {drawn:?}; with optimizer sharding: {sharded} ({accumulated_shards} accumulating the shards); recomputing: {recomputing}"
    );
    if only.is_none() {
        assert!(sharded >= 5, "only {sharded} cases shard the optimizer");
        assert!(recomputing >= 10, "only {recomputing} cases recompute");
        assert!(
            accumulated_shards >= 2 && sharded - accumulated_shards >= 2,
            "{accumulated_shards} of {sharded} optimizer-sharded cases accumulate the shards: both ways must be drawn"
        );
        assert!(
            drawn.len() >= 20,
            "only {} kinds of case drawn",
            drawn.len()
        );
    }
    assert!(
        failures.is_empty(),
        "{} of {CASES} cases failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
