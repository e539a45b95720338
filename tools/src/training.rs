//! What every training run of the command line shares around the one loop
//! ([`shardc_runtime::train_steps`]): the data each rank is fed (its block of the global
//! batch, [`rank_block`]; a multi-rank artifact's synthetic data, [`distributed_data`]) and
//! what follows a step (`after_step`: the loss line, [`print_loss`], and the checkpoint,
//! `save_after`).

use crate::ckpt::Saver;
use crate::run_args::RunArgs;
use anyhow::{bail, Context, Result};
use shardc_ir::artifact::Artifact;
use shardc_ir::{Graph, ParamKind, TensorLayout};
use shardc_runtime::data::numpy::{read_arrays, ArrayBatches};
use shardc_runtime::data::SyntheticData;
use shardc_runtime::{StepExecutor, Tensor};
use std::time::Duration;

/// Prints `epoch: E step: S, loss is L` for the step's outputs (the loss first), as
/// MindSpore's LossMonitor.
pub fn print_loss(outputs: &[Tensor], step: u64, per_epoch: u64) -> Result<()> {
    let loss = outputs
        .first()
        .and_then(Tensor::scalar_value)
        .context("the graph's first output is not a scalar loss")?;
    println!(
        "epoch: {} step: {}, loss is {}",
        step / per_epoch + 1,
        step % per_epoch + 1,
        loss as f32
    );
    Ok(())
}

/// Rank `rank`'s blocks of the global batch `global` (one tensor per data input), through
/// the layouts of the inputs it reads (`layouts`; see [`rank_inputs`]): a pipeline stage is
/// fed only the inputs its own ops read, the first stage the samples, the last the labels.
pub fn rank_block<N: AsRef<str>>(
    global: Vec<(N, Tensor)>,
    layouts: &[(String, TensorLayout)],
    rank: usize,
) -> Result<Vec<(N, Tensor)>> {
    let mut feeds = Vec::with_capacity(layouts.len());
    for (name, t) in global {
        let Some(layout) = layouts
            .iter()
            .find(|(n, _)| n == name.as_ref())
            .map(|(_, l)| l)
        else {
            continue;
        };
        let block = t.block(&layout.block(rank)).ok_or_else(|| {
            anyhow::anyhow!(
                "data input {}: a batch of shape {:?} does not fit its layout {layout}",
                name.as_ref(),
                t.shape
            )
        })?;
        feeds.push((name, block));
    }
    if feeds.len() != layouts.len() {
        let missing: Vec<&str> = layouts
            .iter()
            .filter(|(n, _)| !feeds.iter().any(|(f, _)| f.as_ref() == n))
            .map(|(n, _)| n.as_str())
            .collect();
        bail!(
            "rank {rank}: the batch has no data for input(s) {}",
            missing.join(", ")
        );
    }
    Ok(feeds)
}

/// The data inputs rank `rank` of `art` reads, with their layouts, out of every input's
/// (`inputs`, from [`distributed_data`]): all of them, except in a pipeline, where each
/// stage reads its own.
pub fn rank_inputs(
    art: &Artifact,
    rank: usize,
    inputs: &[(String, TensorLayout)],
) -> Result<Vec<(String, TensorLayout)>> {
    let params = art
        .program
        .weights_of(rank)
        .with_context(|| format!("rank {rank}: its parameters"))?;
    Ok(inputs
        .iter()
        .filter(|(n, _)| {
            params
                .params
                .iter()
                .any(|p| p.kind == ParamKind::Input && &p.name == n)
        })
        .cloned()
        .collect())
}

/// A pipelined artifact's stages (the manifest's `pipeline` entry, written by `shardc
/// compile` with `--pipeline-stages`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PipelineInfo {
    /// The number of stages.
    pub stages: usize,
    /// Ranks per stage (the intra-op mesh): rank `r` runs stage `r / ranks_per_stage`.
    pub ranks_per_stage: usize,
    /// Micro-batches per step.
    pub micro_size: usize,
    /// `1f1b` or `gpipe`.
    pub scheduler: String,
}

impl PipelineInfo {
    /// The artifact's pipeline, if it has more than one stage.
    pub fn of(art: &Artifact) -> Option<PipelineInfo> {
        let p = art.manifest.extra.get("pipeline")?;
        let num = |k: &str| {
            p.get(k)
                .and_then(serde_json::Value::as_u64)
                .map(|v| v as usize)
        };
        let info = PipelineInfo {
            stages: num("stages")?,
            ranks_per_stage: num("ranks_per_stage")?,
            micro_size: num("micro_size").unwrap_or(1),
            scheduler: p
                .get("scheduler")
                .and_then(serde_json::Value::as_str)
                .unwrap_or("1f1b")
                .to_string(),
        };
        (info.stages > 1 && info.ranks_per_stage > 0).then_some(info)
    }

    /// The stage rank `rank` runs.
    pub fn stage_of(&self, rank: usize) -> usize {
        rank / self.ranks_per_stage
    }

    /// The bubble of the schedule with equal stages, as a fraction of the step: `(S − 1) /
    /// (M + S − 1)` for both 1F1B and GPipe (they differ in the activations they keep, not in
    /// their idle time).
    pub fn ideal_bubble(&self) -> f64 {
        let (s, m) = (self.stages as f64, self.micro_size.max(1) as f64);
        (s - 1.0) / (m + s - 1.0)
    }

    /// The line each rank's log starts with: its stage.
    pub fn stage_line(&self, rank: usize) -> String {
        let s = self.stage_of(rank);
        let first = s * self.ranks_per_stage;
        format!(
            "rank {rank}: pipeline stage {s} of {} (ranks {first}..{}; {} schedule, {} micro-batches){}",
            self.stages,
            first + self.ranks_per_stage,
            self.scheduler,
            self.micro_size,
            if s + 1 == self.stages {
                "; this stage computes the loss"
            } else {
                "; the loss is printed by the last stage"
            }
        )
    }

    /// `--stats`' pipeline line: the time this rank waited for other stages (`Receive`) as a
    /// share of its step time, beside the schedule's predicted bubble.
    pub fn bubble_line(&self, rank: usize, receive_wait: Duration, total: Duration) -> String {
        let measured = if total > Duration::ZERO {
            receive_wait.as_secs_f64() / total.as_secs_f64()
        } else {
            0.0
        };
        format!(
            "rank {rank}: pipeline stage {}: waited for other stages {:.3} ms of {:.3} ms = {:.1} % of the step (measured bubble); predicted bubble {:.1} % ({} stages, {} micro-batches, {})",
            self.stage_of(rank),
            receive_wait.as_secs_f64() * 1e3,
            total.as_secs_f64() * 1e3,
            100.0 * measured,
            100.0 * self.ideal_bubble(),
            self.stages,
            self.micro_size,
            self.scheduler
        )
    }
}

/// The global batches a run trains on: seeded synthetic ones (`--seed`, `--data-pool`), or a
/// data file's (`--data`).
pub enum TrainData {
    /// [`SyntheticData`].
    Synthetic(SyntheticData),
    /// A data file's arrays, batched ([`ArrayBatches`]).
    File(ArrayBatches),
}

impl TrainData {
    /// The data for `graph`'s inputs (their global shapes): `--data`'s file, else synthetic.
    pub fn of(a: &RunArgs, graph: &Graph) -> Result<TrainData> {
        Ok(match &a.data {
            Some(path) => TrainData::File(ArrayBatches::new(
                graph,
                read_arrays(path)?,
                &path.display().to_string(),
            )?),
            None => TrainData::Synthetic(SyntheticData::new(graph, a.seed, a.data_pool)?),
        })
    }

    /// Step `step`'s global batch, by input name.
    pub fn feeds(&self, step: u64) -> Vec<(&str, Tensor)> {
        match self {
            TrainData::Synthetic(s) => s.feeds(step),
            TrainData::File(f) => f.feeds(step),
        }
    }

    /// The steps of one pass over the data: `--steps-per-epoch`, else the synthetic pool's
    /// batches or the file's.
    pub fn per_epoch(&self, a: &RunArgs) -> u64 {
        let pass = match self {
            TrainData::Synthetic(_) => a.data_pool as u64,
            TrainData::File(f) => f.len() as u64,
        };
        a.steps_per_epoch.unwrap_or(pass).max(1)
    }
}

/// The data of a multi-rank artifact (global batches, from the manifest's global input
/// shapes: [`TrainData`]) and the data inputs' layouts (which block each rank is fed).
pub fn distributed_data(
    a: &RunArgs,
    art: &Artifact,
) -> Result<(TrainData, Vec<(String, TensorLayout)>)> {
    let layouts: Vec<(String, TensorLayout)> = match art.manifest.extra.get("layouts") {
        Some(serde_json::Value::Object(m)) => m
            .iter()
            .map(|(k, v)| Ok((k.clone(), serde_json::from_value(v.clone())?)))
            .collect::<Result<_>>()?,
        _ => bail!(
            "{}: the manifest of a {}-rank artifact has no parameter layouts",
            a.artifact.display(),
            art.device_num()
        ),
    };
    // A graph with the global input shapes, for the data generator.
    let mut global = art.program.template.clone();
    for p in &mut global.params {
        if p.kind == ParamKind::Input {
            if let Some(e) = art.manifest.inputs.iter().find(|e| e.name == p.name) {
                p.ty.shape = e.shape.clone();
            }
        }
    }
    let data = TrainData::of(a, &global)?;
    let inputs: Vec<(String, TensorLayout)> = layouts
        .iter()
        .filter(|(n, _)| art.manifest.inputs.iter().any(|e| &e.name == n))
        .cloned()
        .collect();
    Ok((data, inputs))
}

/// What follows a step of a rank that prints: its loss line, then its checkpoint.
pub(crate) fn after_step(
    step: u64,
    outputs: &[Tensor],
    exec: &dyn StepExecutor,
    per_epoch: u64,
    saver: Option<&Saver>,
    steps: u64,
) -> Result<()> {
    // A pipeline stage before the last has no outputs: the last stage prints the loss.
    if !outputs.is_empty() {
        print_loss(outputs, step, per_epoch)?;
    }
    save_after(exec, saver, steps)
}

/// The checkpoint after a step, when `saver` asks for one (always after the last of `steps`).
pub(crate) fn save_after(exec: &dyn StepExecutor, saver: Option<&Saver>, steps: u64) -> Result<()> {
    match saver {
        Some(s) => s.after_step(exec, exec.step_count() == steps),
        None => Ok(()),
    }
}
