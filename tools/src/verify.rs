//! `shardc verify`: the one invariant, checked on a model. Compiles it stand-alone and in
//! parallel, trains both on the same seeded batches (all ranks in this process, one thread
//! each), and prints the largest relative difference of the loss at every step and of every
//! weight (gathered from its slices) after the last step.

use crate::commands::{load_model, LossArgs, OptimizerArgs};
use crate::in_process::{rel, run_ranks, tensor_rel};
use crate::parallel_args::ParallelArgs;
use anyhow::{bail, Context, Result};
use clap::Args;
use shardc_backend_cpu::CpuBackend;
use shardc_compiler::parallel_context::ParallelSettings;
use shardc_compiler::pipeline::{self, CompileOptions};
use shardc_ir::{ParamKind, TensorLayout};
use shardc_runtime::data::SyntheticData;
use shardc_runtime::executor::Executor;
use shardc_runtime::Tensor;
use std::path::PathBuf;
use std::sync::Arc;

/// Arguments of `shardc verify`.
#[derive(Args, Debug)]
pub struct VerifyArgs {
    /// The model: a text IR file.
    pub model: PathBuf,
    /// Training steps to compare.
    #[arg(long, default_value_t = 3)]
    pub steps: u64,
    /// Seed of the synthetic data.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// The largest relative difference accepted.
    #[arg(long, default_value_t = 1e-5)]
    pub tolerance: f64,
    /// Write the dumps here, as `shardc compile` does.
    #[arg(long)]
    pub save_graphs_path: Option<PathBuf>,
    /// The optimizer.
    #[command(flatten)]
    pub optimizer: OptimizerArgs,
    /// The loss of a forward network (an imported model), as `shardc compile --loss`.
    #[command(flatten)]
    pub loss: LossArgs,
    /// The parallel context. `gradients_mean` defaults to true here (unless set): only then is
    /// a data-parallel gradient the single device's.
    #[command(flatten)]
    pub parallel: ParallelArgs,
}

/// `shardc verify`; returns whether every difference is within the tolerance.
pub fn verify(a: &VerifyArgs) -> Result<bool> {
    let model = a.loss.apply(load_model(&a.model)?)?;
    let mut pargs = a.parallel.clone();
    if pargs.gradients_mean.is_none() {
        let from_file = match &pargs.config {
            Some(path) => ParallelSettings::from_toml_file(path)?.gradients_mean,
            None => None,
        };
        if from_file.is_none() {
            pargs.gradients_mean = Some(true);
        }
    }
    let ctx = pargs.to_context()?;
    if ctx.auto_pipeline {
        bail!(
            "shardc verify does not apply auto_pipeline: compile with `shardc compile --auto-pipeline` and compare its losses under `shardc launch` (docs/planning.md)"
        );
    }
    let Some(popts) = pargs.options(&ctx)? else {
        bail!(
            "nothing to verify: parallel_mode {} on {} device(s) compiles for one device (give --device-num N and a parallel mode)",
            ctx.parallel_mode,
            ctx.device_num
        );
    };
    let opt = a.optimizer.to_optimizer();
    let single = pipeline::compile(
        model.clone(),
        &CompileOptions {
            optimizer: Some(opt),
            ..Default::default()
        },
    )?
    .graph;
    let compiled = pipeline::compile(
        model,
        &CompileOptions {
            optimizer: Some(opt),
            dump_dir: a.save_graphs_path.clone(),
            parallel: Some(popts.clone()),
            ..Default::default()
        },
    )?;
    let par = compiled
        .parallel
        .context("the parallel compilation produced no per-rank graphs")?;
    let data = SyntheticData::new(&single, a.seed, a.steps.max(1) as usize)?;
    let feeds = |step: u64| -> Vec<(String, Tensor)> {
        data.feeds(step)
            .into_iter()
            .map(|(n, t)| (n.to_string(), t))
            .collect()
    };

    // One device.
    let mut exec = Executor::new(single.clone(), Arc::new(CpuBackend::with_threads(1)))?;
    let mut ref_losses = Vec::new();
    shardc_runtime::train_steps(
        &mut exec,
        0..a.steps,
        |step| Ok::<_, anyhow::Error>(Some(feeds(step))),
        |_, out, _| {
            ref_losses.push(
                out.first()
                    .and_then(Tensor::scalar_value)
                    .context("the model's first output is not a scalar loss")?,
            );
            Ok(())
        },
    )?;

    // All ranks.
    let layouts: Vec<(String, TensorLayout)> = par.layouts_by_name();
    let inputs: Vec<(String, TensorLayout)> = par
        .begin
        .params
        .iter()
        .zip(&layouts)
        .filter(|(p, _)| p.kind == ParamKind::Input)
        .map(|(_, l)| l.clone())
        .collect();
    let n = par.ranks.len();
    let res = run_ranks(par.ranks.clone(), &inputs, &feeds, a.steps, 1)?;

    println!(
        "verify {}: {} on {n} devices against one device, {} step(s)",
        a.model.display(),
        ctx.parallel_mode,
        a.steps
    );
    println!(
        "{:<6} {:>16} {:>16}",
        "step", "loss (1 device)", "max rel diff"
    );
    let mut worst: f64 = 0.0;
    for (k, &l) in ref_losses.iter().enumerate() {
        let mut d: f64 = 0.0;
        if (0..n).all(|r| res.outputs[r][k].is_empty()) {
            anyhow::bail!("step {}: no rank returned the loss", k + 1);
        }
        for r in 0..n {
            // In a pipeline only the last stage's ranks have the loss.
            if res.outputs[r][k].is_empty() {
                continue;
            }
            let v = res.outputs[r][k]
                .first()
                .and_then(Tensor::scalar_value)
                .with_context(|| format!("rank {r}: the first output is not a scalar loss"))?;
            d = d.max(rel(v, l));
        }
        worst = worst.max(d);
        println!("{:<6} {:>16.9} {:>16.3e}", k + 1, l, d);
    }
    println!("{:<24} {:>16} {:>16}", "weight", "shape", "max rel diff");
    for (name, layout) in &layouts {
        let Some(reference) = exec.param(name) else {
            continue;
        };
        let whole = res.gathered_weight(name, layout)?;
        let d = tensor_rel(&whole, reference);
        worst = worst.max(d);
        println!(
            "{:<24} {:>16} {:>16.3e}",
            name,
            format!("{:?}", layout.tensor_shape),
            d
        );
    }
    let ok = worst <= a.tolerance;
    println!(
        "largest relative difference: {worst:.3e} (tolerance {:.0e}): {}",
        a.tolerance,
        if ok { "PASS" } else { "FAIL" }
    );
    Ok(ok)
}
