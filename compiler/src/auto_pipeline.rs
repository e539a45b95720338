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
//! - `ParallelOptimizer::DEFAULT` when the plan shards the optimizer state;
//! - `recompute: true` on the nodes of the layers of every stage the plan recomputes, but each
//!   layer's outputs (the values read outside the layer: `docs/recompute.md`'s rule that a
//!   cell's output is the checkpoint the replay starts from).
//!
//! Each stage's intra-op plan is then searched by `auto_parallel` on the stage's mesh, as for
//! any pipeline. The micro-batch count keeps whole samples in every micro-batch of every
//! data-parallel block (`samples % (blocks · M) == 0`): a plan that breaks it is planned again
//! without that count.

use crate::device::DeviceDescription;
use crate::graph_layers::{GraphLayers, GraphLayersError};
use crate::parallel_context::{DatasetStrategy, ParallelContext, SearchMode};
use shardc_ir::{Attr, Graph, Operand};
use shardc_passes::autodiff::Optimizer;
use shardc_passes::parallel::search::stage_plan::{self, PlanError, PlanReport};
use shardc_passes::parallel::{ParallelOptimizer, SearchMode as PassSearchMode};
use shardc_passes::pipeline::{PipelineOptions, Scheduler, STAGE_ATTR};
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
    #[error("auto_pipeline: {0}")]
    Plan(#[from] PlanError),
    /// No micro-batch count keeps whole samples in every micro-batch.
    #[error("auto_pipeline: {0}")]
    NoMicroBatches(String),
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
        })
    }
}

/// The data-parallel blocks the dataset strategy cuts the batch into on a stage of `d`
/// devices.
fn batch_blocks(ctx: &ParallelContext, d: usize) -> usize {
    match &ctx.dataset_strategy {
        DatasetStrategy::DataParallel => d,
        DatasetStrategy::FullBatch => 1,
        DatasetStrategy::Explicit(s) => s
            .0
            .first()
            .and_then(|dims| dims.first())
            .map_or(1, |&b| usize::try_from(b).unwrap_or(1).max(1)),
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
    opts.scheduler = match ctx.pipeline.scheduler {
        Scheduler::OneFOneB => stage_plan::Scheduler::OneFOneB,
        Scheduler::GPipe => stage_plan::Scheduler::GPipe,
    };
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
        .map(|l| plan.stages.iter().any(|s| s.recompute && s.layers.contains(&l)))
        .collect();
    let mut graph = model.forward.clone();
    let recomputed_nodes = mark(&mut graph, &model, &stage_of_layer, &recompute_layer);
    Ok(AutoPipeline::Planned(Box::new(PlannedPipeline {
        pipeline: PipelineOptions {
            stages: plan.stages.len(),
            micro_size: plan.shape.micro_batches,
            scheduler: ctx.pipeline.scheduler,
        },
        parallel_optimizer: plan.shape.zero.then_some(ParallelOptimizer::DEFAULT),
        cell: model.cell.name(),
        layers: model.cell.count,
        samples: model.samples,
        recomputed_nodes,
        replanned,
        graph,
        report,
    })))
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
        let is_output = outputs.contains(&i)
            || users[i].iter().any(|u| model.layer[u.index()] != Some(l));
        if !is_output {
            g.nodes[i].attrs.set(RECOMPUTE_ATTR, Attr::Bool(true));
            marked += 1;
        }
    }
    marked
}
