//! What every training run of the command line shares around the one loop
//! ([`shardc_runtime::train_steps`]): the data each rank is fed (its block of the global
//! batch, [`rank_block`]; a multi-rank artifact's synthetic data, [`distributed_data`]) and
//! what follows a step (`after_step`: the loss line, [`print_loss`], and the checkpoint,
//! `save_after`).

use crate::ckpt::Saver;
use crate::run_args::RunArgs;
use anyhow::{bail, Context, Result};
use shardc_ir::artifact::Artifact;
use shardc_ir::{ParamKind, TensorLayout};
use shardc_runtime::data::SyntheticData;
use shardc_runtime::{StepExecutor, Tensor};

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
/// the inputs' layouts.
pub fn rank_block<N: AsRef<str>>(
    global: Vec<(N, Tensor)>,
    layouts: &[(String, TensorLayout)],
    rank: usize,
) -> Result<Vec<(N, Tensor)>> {
    let mut feeds = Vec::with_capacity(global.len());
    for (name, t) in global {
        let layout = layouts
            .iter()
            .find(|(n, _)| n == name.as_ref())
            .map(|(_, l)| l)
            .ok_or_else(|| anyhow::anyhow!("no layout for data input {}", name.as_ref()))?;
        let block = t.block(&layout.block(rank)).ok_or_else(|| {
            anyhow::anyhow!(
                "data input {}: a batch of shape {:?} does not fit its layout {layout}",
                name.as_ref(),
                t.shape
            )
        })?;
        feeds.push((name, block));
    }
    Ok(feeds)
}

/// The synthetic data of a multi-rank artifact (global batches, from the manifest's global
/// input shapes) and the data inputs' layouts (which block each rank is fed).
pub fn distributed_data(
    a: &RunArgs,
    art: &Artifact,
) -> Result<(SyntheticData, Vec<(String, TensorLayout)>)> {
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
    let data = SyntheticData::new(&global, a.seed, a.data_pool)?;
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
    print_loss(outputs, step, per_epoch)?;
    save_after(exec, saver, steps)
}

/// The checkpoint after a step, when `saver` asks for one (always after the last of `steps`).
pub(crate) fn save_after(exec: &dyn StepExecutor, saver: Option<&Saver>, steps: u64) -> Result<()> {
    match saver {
        Some(s) => s.after_step(exec, exec.step_count() == steps),
        None => Ok(()),
    }
}
