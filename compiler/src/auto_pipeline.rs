//! `auto_pipeline` (Alpa's `stage_option="auto"`): in `auto_parallel`, the stage planner
//! ([`shardc_passes::parallel::search::stage_plan::plan`]) chooses the pipeline stages and
//! the layer → stage split, the micro-batches, optimizer sharding (ZeRO-1) and recompute under
//! `max_device_memory`, over the model's own repeated layers ([`crate::graph_layers`]); this
//! module turns its plan into the options of the one [`crate::pipeline::compile`]:
//!
//! - `pipeline_stage: s` on every forward node: a layer's nodes its stage's, a node outside the
//!   layers (the head, the embedding) the largest stage among its operands', a node reading
//!   only parameters the smallest among its readers' (the embedding joins layer 0, the head
//!   the last layer);
//! - `PipelineOptions { stages: S, micro_size: M, scheduler }` (the context's scheduler);
//! - when the plan shards the optimizer state, the parallel optimizer with no size threshold
//!   ([`ZERO_AS_PLANNED`]): the planner priced every weight's state split over its replicas,
//!   so every weight with a dimension its group divides is split, not only those of 64 KB or
//!   more (MindSpore's default threshold), and the gradient reduce-scattered once per step
//!   (`gradient_accumulation_shard = false`: ZeRO-1, not ZeRO-2);
//! - `recompute: true` on the nodes of the layers of every stage the plan recomputes, but each
//!   layer's outputs (the values read outside the layer: `docs/recompute.md`'s rule that a
//!   cell's output is the checkpoint the replay starts from).
//!
//! A stage whose chosen intra-op plan is Megatron-LM's gets its layers annotated with that
//! split (`layer{i}_attn_q_matmul`, ..., [`crate::transformer_layers::megatron_annotations`]),
//! which `auto_parallel` keeps; the rest of each stage's intra-op plan is then searched by
//! `auto_parallel` on the stage's mesh, as for any pipeline. The micro-batch count keeps whole samples in every micro-batch of every
//! data-parallel block (`samples % (blocks · M) == 0`): a plan that breaks it is planned again
//! without that count.

use crate::device::DeviceDescription;
use crate::graph_layers::{GraphLayers, GraphLayersError};
use crate::parallel_context::{DatasetStrategy, ParallelContext, SearchMode};
use shardc_ir::{Attr, Graph, Operand};
use shardc_passes::autodiff::Optimizer;
use shardc_passes::parallel::search::stage_plan::{self, PipelinePlan, PlanError, PlanReport};
use shardc_passes::parallel::{ParallelOptimizer, SearchMode as PassSearchMode};
use shardc_passes::pipeline::{PipelineOptions, STAGE_ATTR};
use thiserror::Error;

/// The node attribute of a recomputed forward node (`docs/recompute.md`).
pub const RECOMPUTE_ATTR: &str = "recompute";

/// Why `auto_pipeline` could not plan.
#[derive(Debug, Error)]
pub enum AutoPipelineError {
    /// The model's layers could not be found, cut or rebatched.
    #[error("auto_pipeline: {0}")]
    Layers(#[from] GraphLayersError),
    /// The stage planner found no plan (nothing fits the memory limit, nothing to profile).
    #[error("auto_pipeline: {0}{bytes}", bytes = in_bytes(.0))]
    Plan(#[from] PlanError),
    /// No micro-batch count keeps whole samples in every micro-batch.
    #[error("auto_pipeline: {0}")]
    NoMicroBatches(String),
}

/// The planner's memory figures in bytes, for a [`PlanError::NothingFits`] (its message
/// rounds to GiB): `; in bytes: max_device_memory 276480, the least any plan needs 157312`.
fn in_bytes(e: &PlanError) -> String {
    match e {
        PlanError::NothingFits { limit, need, .. } => format!(
            "; in bytes: max_device_memory {}, the least any plan needs {}",
            limit.round(),
            need.round()
        ),
        _ => String::new(),
    }
}

/// What `auto_pipeline` decided.
#[derive(Clone, Debug)]
pub enum AutoPipeline {
    /// The planner's plan, applied.
    Planned(Box<PlannedPipeline>),
    /// The model has fewer than two repeated layers: plain `auto_parallel`; the line says so.
    NotLayered(String),
}

/// The planner's plan and the compile options it gives.
#[derive(Clone, Debug)]
pub struct PlannedPipeline {
    /// The forward graph with `pipeline_stage` (and `recompute`) marks.
    pub graph: Graph,
    /// The pipeline options of the compile.
    pub pipeline: PipelineOptions,
    /// Optimizer sharding, when the plan shards the optimizer state.
    pub parallel_optimizer: Option<ParallelOptimizer>,
    /// The planner's answer.
    pub report: PlanReport,
    /// The repeated cell (`layer*-TransformerEncoderLayer`).
    pub cell: String,
    /// Its layer count.
    pub layers: usize,
    /// The global batch in samples the planner was given.
    pub samples: usize,
    /// Forward nodes marked `recompute: true`.
    pub recomputed_nodes: usize,
    /// Layers annotated with Megatron-LM's split (their stage's chosen plan).
    pub megatron_layers: usize,
    /// Micro-batch counts the planner chose that split samples, planned again without.
    pub replanned: Vec<String>,
}

impl PlannedPipeline {
    /// `auto pipeline: stages=2 split=2+2 micro_size=2 zero=on recompute=off ... predicted
    /// step=... bubble=...% (planner ... s)`.
    pub fn summary(&self) -> String {
        let plan = &self.report.auto;
        let recompute: Vec<&str> = plan
            .stages
            .iter()
            .map(|s| if s.recompute { "on" } else { "off" })
            .collect();
        let meshes: Vec<String> = plan
            .stages
            .iter()
            .map(|s| format!("{}x{}", s.mesh.0, s.mesh.1))
            .collect();
        let mut line = format!(
            "auto pipeline: stages={} split={} micro_size={} {} zero={} recompute={} \
             mesh(tp x dp)={} predicted step={:.3} ms bubble={:.1}% peak memory={} bytes \
             (planner {:.2} s; {} layers of `{}`, global batch {} samples)",
            plan.stages.len(),
            plan.split(),
            self.pipeline.micro_size,
            self.pipeline.scheduler.name(),
            if plan.shape.zero { "on" } else { "off" },
            recompute.join(","),
            meshes.join(","),
            plan.step * 1e3,
            plan.bubble * 100.0,
            plan.peak_memory().round(),
            self.report.seconds,
            self.layers,
            self.cell,
            self.samples,
        );
        if !self.replanned.is_empty() {
            line.push_str(&format!("; planned again: {}", self.replanned.join("; ")));
        }
        line
    }

    /// The planner's choice and prediction, for the artifact manifest.
    pub fn to_json(&self) -> serde_json::Value {
        let plan = &self.report.auto;
        serde_json::json!({
            "stages": plan.stages.len(),
            "split": plan.stages.iter().map(|s| s.layers.len()).collect::<Vec<_>>(),
            "micro_size": self.pipeline.micro_size,
            "scheduler": self.pipeline.scheduler.name(),
            "zero": plan.shape.zero,
            "recompute": plan.stages.iter().map(|s| s.recompute).collect::<Vec<_>>(),
            "recomputed_nodes": self.recomputed_nodes,
            "megatron_layers": self.megatron_layers,
            "stage_plans": plan.stages.iter().map(|s| serde_json::json!({
                "layers": [s.layers.start, s.layers.end],
                "plan": s.plan,
                "tp": s.mesh.0,
                "dp": s.mesh.1,
                "recompute": s.recompute,
                "seconds_per_micro_batch": s.figures.seconds,
                "memory_bytes": s.figures.memory,
                "in_flight": s.figures.in_flight,
            })).collect::<Vec<_>>(),
            "predicted_step_seconds": plan.step,
            "predicted_bubble": plan.bubble,
            "peak_memory_bytes": plan.peak_memory(),
            "memory_limit_bytes": plan.shape.memory_limit,
            "megatron_step_seconds": self.report.megatron.as_ref().map(|m| m.step),
            "planner_seconds": self.report.seconds,
            "cell": self.cell,
            "layers": self.layers,
            "global_batch_samples": self.samples,
            "planned_again": self.replanned,
            "planner_notes": self.report.notes,
        })
    }
}

/// The data-parallel blocks the dataset strategy cuts the batch into on a stage of `d`
/// devices.
fn batch_blocks(ctx: &ParallelContext, d: usize) -> usize {
    match &ctx.dataset_strategy {
        DatasetStrategy::DataParallel => d,
        DatasetStrategy::FullBatch => 1,
        DatasetStrategy::Explicit(s) => {
            s.0.first()
                .and_then(|dims| dims.first())
                .map_or(1, |&b| usize::try_from(b).unwrap_or(1).max(1))
        }
    }
}

/// Plans `forward` for `ctx` (its `device_num`, `max_device_memory`, scheduler and searcher)
/// on `device`, and marks the graph with the plan (see the module documentation).
pub fn plan_pipeline(
    forward: &Graph,
    ctx: &ParallelContext,
    device: &DeviceDescription,
    optimizer: Optimizer,
) -> Result<AutoPipeline, AutoPipelineError> {
    let Some(model) = GraphLayers::of(forward, optimizer)? else {
        return Ok(AutoPipeline::NotLayered(format!(
            "auto pipeline: `{}` has no repeated layers (scope segments `<prefix><i>-<Cell>` \
             for i in 0..L, L >= 2): compiled as plain auto_parallel, no pipeline",
            forward.name
        )));
    };
    let n = ctx.device_num;
    let mut opts = device.plan_options(n, model.samples);
    if let Some(limit) = ctx.max_device_memory {
        opts.memory_limit = limit as f64;
    }
    opts.scheduler = ctx.pipeline.scheduler;
    opts.search_mode = match ctx.search_mode {
        SearchMode::ShardingPropagation => PassSearchMode::ShardingPropagation,
        SearchMode::RecursiveProgramming => PassSearchMode::RecursiveProgramming,
        SearchMode::DynamicProgramming => PassSearchMode::DynamicProgramming,
        SearchMode::Ilp => PassSearchMode::Ilp,
    };
    let mut counts: Vec<usize> = (1..=model.samples)
        .filter(|m| model.samples % m == 0)
        .collect();
    let mut replanned = Vec::new();
    let report = loop {
        if counts.is_empty() {
            return Err(AutoPipelineError::NoMicroBatches(format!(
                "no micro-batch count keeps whole samples of the global batch of {} samples \
                 ({}) in every micro-batch of every data-parallel block",
                model.samples,
                replanned.join("; ")
            )));
        }
        opts.micro_batches.clone_from(&counts);
        let report = stage_plan::plan(&model, &opts)?;
        let plan = &report.auto;
        let (s, m) = (plan.stages.len().max(1), plan.shape.micro_batches);
        let blocks = batch_blocks(ctx, n / s);
        if model.samples % (blocks * m) == 0 {
            break report;
        }
        replanned.push(format!(
            "{m} micro-batches on {s} stages of {} data-parallel blocks split the {} samples",
            blocks, model.samples
        ));
        counts.retain(|&c| c != m);
    };
    let plan = &report.auto;
    let stage_of_layer: Vec<usize> = (0..model.cell.count)
        .map(|l| {
            plan.stages
                .iter()
                .position(|s| s.layers.contains(&l))
                .unwrap_or(plan.stages.len().saturating_sub(1))
        })
        .collect();
    let recompute_layer: Vec<bool> = (0..model.cell.count)
        .map(|l| {
            plan.stages
                .iter()
                .any(|s| s.recompute && s.layers.contains(&l))
        })
        .collect();
    let mut graph = model.forward.clone();
    let recomputed_nodes = mark(&mut graph, &model, &stage_of_layer, &recompute_layer);
    let megatron_layers = annotate_megatron_stages(&mut graph, plan, n, model.samples);
    Ok(AutoPipeline::Planned(Box::new(PlannedPipeline {
        pipeline: PipelineOptions {
            stages: plan.stages.len(),
            micro_size: plan.shape.micro_batches,
            scheduler: ctx.pipeline.scheduler,
        },
        parallel_optimizer: plan.shape.zero.then_some(ZERO_AS_PLANNED),
        cell: model.cell.name(),
        layers: model.cell.count,
        samples: model.samples,
        recomputed_nodes,
        megatron_layers,
        replanned,
        graph,
        report,
    })))
}

/// The parallel optimizer as the stage planner prices ZeRO-1: every weight's optimizer state
/// split over its replicas, whatever its size, and a micro-batched gradient accumulated
/// whole and reduce-scattered once per step (`gradient_accumulation_shard = false`: one
/// ReduceScatter per weight, as the planner counts; MindSpore's defaults otherwise).
pub const ZERO_AS_PLANNED: ParallelOptimizer = ParallelOptimizer {
    threshold_kb: 0,
    gradient_accumulation_shard: false,
    ..ParallelOptimizer::DEFAULT
};

/// Annotates the layers of every stage whose plan is Megatron-LM's with its tensor-parallel
/// split on the stage's `tp × dp` mesh (`n / S` devices), so that the stage's search keeps
/// the plan the planner priced (annotations stay fixed in `auto_parallel`); returns how
/// many layers it annotated. A stage's searched plan is searched again on its mesh.
fn annotate_megatron_stages(g: &mut Graph, plan: &PipelinePlan, n: usize, samples: usize) -> usize {
    let d = n / plan.stages.len().max(1);
    let micro_batch = samples / plan.shape.micro_batches.max(1);
    plan.stages
        .iter()
        .filter_map(|st| {
            let tp = st.megatron_tp?;
            let dp = d / tp.max(1);
            GraphLayers::annotate_megatron(g, st.layers.clone(), tp, dp, micro_batch)
                .then_some(st.layers.len())
        })
        .sum()
}

/// Marks every node of `g` (the model's typed forward) with its stage, and the recomputed
/// layers' nodes but their outputs with `recompute: true`; returns how many it marked so.
fn mark(g: &mut Graph, model: &GraphLayers, stage_of_layer: &[usize], recompute: &[bool]) -> usize {
    let len = g.nodes.len();
    let mut stage: Vec<Option<usize>> = vec![None; len];
    for i in 0..len {
        stage[i] = match model.layer[i] {
            Some(l) => stage_of_layer.get(l).copied(),
            None => g.nodes[i]
                .inputs
                .iter()
                .filter_map(|o| match o {
                    Operand::Node(id) => stage[id.index()],
                    _ => None,
                })
                .max(),
        };
    }
    let users = g.users();
    for i in (0..len).rev() {
        if stage[i].is_none() {
            stage[i] = Some(
                users[i]
                    .iter()
                    .filter_map(|u| stage[u.index()])
                    .min()
                    .unwrap_or(0),
            );
        }
    }
    let outputs: Vec<usize> = g
        .outputs
        .iter()
        .filter_map(|o| match o {
            Operand::Node(id) => Some(id.index()),
            _ => None,
        })
        .collect();
    let mut marked = 0;
    for i in 0..len {
        let s = stage[i].unwrap_or(0);
        g.nodes[i].attrs.set(STAGE_ATTR, Attr::Int(s as i64));
        let Some(l) = model.layer[i] else { continue };
        if !recompute.get(l).copied().unwrap_or(false) {
            continue;
        }
        // A layer's output (read outside the layer) is the checkpoint the replay starts from.
        let is_output =
            outputs.contains(&i) || users[i].iter().any(|u| model.layer[u.index()] != Some(l));
        if !is_output {
            g.nodes[i].attrs.set(RECOMPUTE_ATTR, Attr::Bool(true));
            marked += 1;
        }
    }
    marked
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::optim::Momentum;
    use crate::parallel_context::ParallelMode;
    use crate::transformer::{transformer, TransformerConfig};
    use crate::transformer_layers::megatron_annotations;
    use shardc_passes::pipeline::Scheduler;

    fn forward() -> Graph {
        transformer(&TransformerConfig::new(4, 32, 2, 8, 8)).unwrap()
    }

    fn context(limit: Option<u64>) -> ParallelContext {
        ParallelContext {
            parallel_mode: ParallelMode::AutoParallel,
            device_num: 4,
            auto_pipeline: true,
            max_device_memory: limit,
            ..ParallelContext::default()
        }
    }

    fn optimizer() -> Optimizer {
        Momentum::new(0.01, 0.9).to_spec()
    }

    /// The least memory any one-stage plan needs (the planner's `NothingFits` at 1 byte).
    fn one_stage_need(device: &DeviceDescription) -> f64 {
        let model = GraphLayers::of(&forward(), optimizer()).unwrap().unwrap();
        let mut opts = device.plan_options(4, model.samples);
        opts.memory_limit = 1.0;
        opts.max_stages = Some(1);
        opts.search_mode = PassSearchMode::ShardingPropagation;
        match stage_plan::plan(&model, &opts) {
            Err(PlanError::NothingFits { need, .. }) => need,
            other => panic!("1 byte: {other:?}"),
        }
    }

    #[test]
    fn a_stage_whose_plan_is_megatrons_compiles_with_megatrons_split() {
        // The best 3D plan on 8 devices with tp = 2 only: every stage's plan is Megatron's.
        let model = GraphLayers::of(&forward(), optimizer()).unwrap().unwrap();
        let device = DeviceDescription::preset("cpu").unwrap();
        let mut opts = device.plan_options(8, model.samples);
        opts.tensor_parallel = vec![2];
        opts.micro_batches = vec![2];
        opts.max_stages = Some(2);
        opts.search_mode = PassSearchMode::ShardingPropagation;
        let report = stage_plan::plan(&model, &opts).unwrap();
        let plan = report.megatron.expect("a 3D plan at tp 2");
        assert!(
            plan.stages.iter().all(|s| s.megatron_tp == Some(2)),
            "{plan}"
        );
        let stages = plan.stages.len();
        let stage_of_layer: Vec<usize> = (0..4)
            .map(|l| {
                plan.stages
                    .iter()
                    .position(|s| s.layers.contains(&l))
                    .unwrap()
            })
            .collect();
        let mut graph = model.forward.clone();
        mark(&mut graph, &model, &stage_of_layer, &[false; 4]);
        assert_eq!(
            annotate_megatron_stages(&mut graph, &plan, 8, model.samples),
            4
        );
        let dp = 8 / stages / 2;
        let want = megatron_annotations(3, 2, dp);
        for (name, s) in &want {
            let id = graph.node_by_instance(name).unwrap();
            assert_eq!(graph.node(id).in_strategy.as_ref(), Some(s), "{name}");
        }
        // The one compile keeps them: the stage's search leaves annotated ops as they are.
        let ctx = ParallelContext {
            parallel_mode: ParallelMode::AutoParallel,
            device_num: 8,
            ..ParallelContext::default()
        };
        let compiled = crate::pipeline::compile(
            graph,
            &crate::pipeline::CompileOptions {
                optimizer: Some(optimizer()),
                parallel: crate::pipeline::parallel_options(&ctx).unwrap(),
                pipeline: PipelineOptions {
                    stages,
                    micro_size: 2,
                    scheduler: Scheduler::OneFOneB,
                },
                ..Default::default()
            },
        )
        .unwrap();
        let p = compiled.parallel.unwrap();
        let (name, s) = &want[0];
        let kept = p
            .begin
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.instance.starts_with(name.as_str()))
            .map(|(i, _)| p.assignment.decisions[i].as_ref().unwrap())
            .collect::<Vec<_>>();
        assert!(!kept.is_empty(), "no {name} in the compiled graph");
        for d in kept {
            assert_eq!(&d.sharding.strategy, s, "{name}");
        }
    }

    #[test]
    fn under_a_limit_one_stage_cannot_hold_the_plan_has_stages_and_marks_them() {
        let device = DeviceDescription::preset("cpu").unwrap();
        let need = one_stage_need(&device);
        let limit = (need * 0.99) as u64;
        eprintln!("one stage needs {need} bytes; limit {limit}");
        let AutoPipeline::Planned(p) =
            plan_pipeline(&forward(), &context(Some(limit)), &device, optimizer()).unwrap()
        else {
            panic!("the transformer has layers")
        };
        let plan = &p.report.auto;
        assert!(plan.stages.len() > 1, "{}", plan.summary());
        assert!(plan.peak_memory() <= limit as f64);
        assert_eq!(p.pipeline.stages, plan.stages.len());
        assert_eq!(p.pipeline.micro_size, plan.shape.micro_batches);
        assert_eq!(p.parallel_optimizer.is_some(), plan.shape.zero);
        // Every node has its stage: a layer's its stage's, the loss the last.
        let model = GraphLayers::of(&forward(), optimizer()).unwrap().unwrap();
        for (i, n) in p.graph.nodes.iter().enumerate() {
            let s = n.attrs.get(STAGE_ATTR).and_then(Attr::as_int).unwrap() as usize;
            if let Some(l) = model.layer[i] {
                assert!(plan.stages[s].layers.contains(&l), "{}", n.instance);
            }
        }
        let loss = p.graph.node_by_instance("reduce_mean").unwrap();
        assert_eq!(
            p.graph.node(loss).attrs.get(STAGE_ATTR),
            Some(&Attr::Int(plan.stages.len() as i64 - 1))
        );
        assert!(p.summary().starts_with(&format!(
            "auto pipeline: stages={} split={}",
            plan.stages.len(),
            plan.split()
        )));
        assert_eq!(p.to_json()["stages"], plan.stages.len());
    }

    #[test]
    fn nothing_fits_reaches_the_user_with_its_numbers() {
        let device = DeviceDescription::preset("cpu").unwrap();
        let e = plan_pipeline(&forward(), &context(Some(1024)), &device, optimizer())
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("auto_pipeline: no pipeline plan fits 0.00 GiB per device: the least any plan needs is"),
            "{e}"
        );
        let need: f64 = e
            .rsplit("the least any plan needs ")
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no byte figure: {e}"));
        assert!(e.contains("in bytes: max_device_memory 1024,"), "{e}");
        assert!(need > 1024.0, "{e}");
    }

    #[test]
    fn recomputed_layers_are_marked_but_their_outputs() {
        let model = GraphLayers::of(&forward(), optimizer()).unwrap().unwrap();
        let mut g = model.forward.clone();
        let marked = mark(&mut g, &model, &[0, 0, 1, 1], &[false, true, false, false]);
        let rec = |inst: &str| {
            g.node(g.node_by_instance(inst).unwrap())
                .attrs
                .get(RECOMPUTE_ATTR)
                .cloned()
        };
        assert_eq!(rec("layer1_attn_q_matmul"), Some(Attr::Bool(true)));
        assert_eq!(
            rec("layer1_ffn_layernorm_output"),
            None,
            "the layer's output"
        );
        assert_eq!(rec("layer0_attn_q_matmul"), None);
        assert_eq!(marked, crate::transformer::NODES_PER_LAYER - 1);
        let stage = |inst: &str| {
            g.node(g.node_by_instance(inst).unwrap())
                .attrs
                .get(STAGE_ATTR)
                .cloned()
        };
        assert_eq!(stage("layer1_ffn_gelu"), Some(Attr::Int(0)));
        assert_eq!(stage("layer2_attn_q_matmul"), Some(Attr::Int(1)));
        assert_eq!(stage("reduce_mean"), Some(Attr::Int(1)));
    }

    #[test]
    fn a_model_without_layers_is_plain_auto_parallel() {
        let g = transformer(&TransformerConfig::new(1, 32, 2, 8, 8)).unwrap();
        let device = DeviceDescription::preset("cpu").unwrap();
        match plan_pipeline(&g, &context(None), &device, optimizer()).unwrap() {
            AutoPipeline::NotLayered(line) => {
                assert!(line.contains("compiled as plain auto_parallel"), "{line}")
            }
            AutoPipeline::Planned(p) => panic!("planned {}", p.summary()),
        }
    }
}
