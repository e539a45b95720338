//! `shardc predict`: MindSpore's `model.predict` — the forward graph of a model run on the
//! samples of a data file, with its weights from a checkpoint, its outputs written to a
//! safetensors file keyed by the model's output names.
//!
//! The model is compiled without an optimizer (nothing is trained), on one device or, with
//! the parallel flags, on N ranks with the same strategies as training, every rank a thread
//! of this process (the outputs are replicated: rank 0's are written). The data file's
//! samples are cut into batches of the model's batch size in order ([`ArrayBatches`]; the
//! last partial batch is dropped, and said so). Each output is written with the batches
//! concatenated along dimension 0 when its dimension 0 is the batch, else stacked on a new
//! leading dimension of batches (a scalar loss becomes `[batches]`).

use crate::commands::{load_model, FORWARD_MODEL, PARALLEL_CONTEXT, STRATEGY_FILE};
use crate::in_process::{run_ranks_with, RankHooks};
use crate::init_from::{init_path, InitialWeights, ModelParam};
use crate::parallel_args::ParallelArgs;
use anyhow::{bail, Context, Result};
use clap::Args;
use shardc_backend_cpu::CpuBackend;
use shardc_compiler::pipeline::{self, CompileOptions};
use shardc_ir::artifact::Artifact;
use shardc_ir::{Graph, Operand, ParamKind, TensorLayout, TensorType};
use shardc_runtime::checkpoint::{self, Checkpoint};
use shardc_runtime::data::numpy::{read_arrays, ArrayBatches};
use shardc_runtime::{Executor, Tensor};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

/// Arguments of `shardc predict`.
#[derive(Args, Debug, Clone)]
pub struct PredictArgs {
    /// The model: a text IR file (its forward graph), or an artifact `shardc compile` wrote
    /// (its forward graph, run with the artifact's parallel context and plan unless parallel
    /// flags are given).
    pub model: PathBuf,
    /// The weights (MindSpore's `.ckpt` or a whole-model `.safetensors`, e.g. a training run's
    /// checkpoint merged by `shardc ckpt merge`); without it, an artifact's `--init-from`
    /// weights, else the model's initializers.
    #[arg(long)]
    pub init_from: Option<PathBuf>,
    /// Rules renaming `--init-from`'s tensors to the model's parameters, one `checkpoint name
    /// = model name` per line (`backbone.* = *` for a prefix); PyTorch's and MindSpore's
    /// conventions (`weight`/`gamma`, `running_var`/`moving_variance`) apply without it.
    #[arg(long, requires = "init_from")]
    pub name_map: Option<PathBuf>,
    /// The samples: `.npz`, `.npy` or `.safetensors`, one array per model input, named after
    /// it, the first dimension the sample.
    #[arg(long)]
    pub data: PathBuf,
    /// Where to write the outputs (safetensors, keyed by the model's output names).
    #[arg(short, long)]
    pub output: PathBuf,
    /// The parallel context: run on N ranks with its strategies.
    #[command(flatten)]
    pub parallel: ParallelArgs,
}

/// The names of `g`'s outputs: each output node's instance name (a parameter's name), else
/// `output_K`; made unique with `_K`.
pub fn output_names(g: &Graph) -> Vec<String> {
    let mut names: Vec<String> = Vec::with_capacity(g.outputs.len());
    for (k, o) in g.outputs.iter().enumerate() {
        let base = match o {
            Operand::Node(n) => g.nodes[n.index()].instance.clone(),
            Operand::Param(p) => g.params[p.index()].name.clone(),
            Operand::Const(_) => String::new(),
        };
        let base = if base.is_empty() {
            format!("output_{k}")
        } else {
            base
        };
        let name = if names.contains(&base) {
            format!("{base}_{k}")
        } else {
            base
        };
        names.push(name);
    }
    names
}

/// Joins each output's per-batch values: along dimension 0 when it is the batch `batch`,
/// else stacked on a new leading dimension.
fn join(per_batch: &[Vec<Tensor>], batch: usize) -> Result<Vec<Tensor>> {
    let Some(first) = per_batch.first() else {
        return Ok(Vec::new());
    };
    let mut out = Vec::with_capacity(first.len());
    for k in 0..first.len() {
        let parts: Vec<&Tensor> = per_batch.iter().map(|b| &b[k]).collect();
        let t0 = parts[0];
        let along_batch = t0.shape.first() == Some(&batch);
        let mut shape = t0.shape.clone();
        if along_batch {
            shape[0] = batch * parts.len();
        } else {
            shape.insert(0, parts.len());
        }
        let mut whole = Tensor::zeros(&TensorType::new(t0.dtype(), shape));
        let per = t0.len();
        for (i, p) in parts.iter().enumerate() {
            if p.shape != t0.shape || !whole.copy_elements(i * per, p, 0, per) {
                bail!(
                    "output {k}: batch {i} has shape {:?}, batch 0 {:?}",
                    p.shape,
                    t0.shape
                );
            }
        }
        out.push(whole);
    }
    Ok(out)
}

/// What `shardc predict` runs: the forward graph, the parallel flags and the weights, read
/// from the arguments or, for an artifact, from the files `shardc compile` put in it.
struct Target {
    model: PathBuf,
    parallel: ParallelArgs,
    init_from: Option<PathBuf>,
    name_map: Option<PathBuf>,
}

/// Resolves an artifact argument into its forward graph, parallel context and plan
/// (`shardc compile` writes them beside the program), and its `--init-from` weights.
fn target(a: &PredictArgs) -> Result<Target> {
    if !a.model.is_dir() {
        return Ok(Target {
            model: a.model.clone(),
            parallel: a.parallel.clone(),
            init_from: a.init_from.clone(),
            name_map: a.name_map.clone(),
        });
    }
    let dir = &a.model;
    let art = Artifact::read(dir)?;
    let file = |key: &str| {
        art.manifest
            .extra
            .get(key)
            .and_then(|v| v.as_str())
            .map(|name| dir.join(name))
    };
    let Some(model) = file(FORWARD_MODEL) else {
        bail!(
            "{}: the artifact has no forward graph (compiled by an older shardc): recompile it, or predict the model's .ir",
            dir.display()
        );
    };
    let mut parallel = a.parallel.clone();
    if parallel == ParallelArgs::default() {
        parallel.config = file(PARALLEL_CONTEXT);
        parallel.strategy_ckpt_load_file = file(STRATEGY_FILE);
        if let Some(config) = &parallel.config {
            let ctx = shardc_compiler::parallel_context::ParallelContext::from_toml_file(config)?;
            if ctx.pipeline.is_pipelined() || ctx.auto_pipeline {
                eprintln!(
                    "note: {} trains as a pipeline; its forward graph runs on one device here (give parallel flags to run it on N ranks)",
                    dir.display()
                );
                parallel = ParallelArgs::default();
            }
        }
    }
    Ok(Target {
        model,
        parallel,
        init_from: init_path(a.init_from.as_deref(), dir, &art),
        name_map: a.name_map.clone(),
    })
}

/// `shardc predict`.
pub fn predict(a: &PredictArgs) -> Result<()> {
    let t = target(a)?;
    let mut model = load_model(&t.model)?;
    shardc_passes::infer::infer_graph(&mut model)?;
    let ctx = t.parallel.to_context()?;
    let popts = t.parallel.options(&ctx)?;
    let n = popts.as_ref().map_or(1, |p| p.device_num);
    let arrays = read_arrays(&a.data)?;
    let data = ArrayBatches::new(&model, arrays, &a.data.display().to_string())?;
    let batch = data.batch();
    // The whole model's weights, for --init-from's check.
    let params: Vec<ModelParam> = model
        .params
        .iter()
        .filter(|p| matches!(p.kind, ParamKind::Weight { .. }))
        .map(|p| ModelParam {
            name: p.name.clone(),
            ty: p.ty.clone(),
            trainable: p.requires_grad(),
        })
        .collect();
    let initial = match &t.init_from {
        Some(path) => {
            let mut w = InitialWeights::read(path, t.name_map.as_deref())?;
            w.check(&params, true)?;
            Some(w)
        }
        None => None,
    };
    let names = output_names(&model);
    let steps = data.len() as u64;
    let feeds = |step: u64| -> Vec<(String, Tensor)> {
        data.feeds(step)
            .into_iter()
            .map(|(n, t)| (n.to_string(), t))
            .collect()
    };
    let per_batch: Vec<Vec<Tensor>> = match popts {
        None => {
            let compiled = pipeline::compile(model.clone(), &CompileOptions::default())?;
            let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
            let mut exec =
                Executor::new(compiled.graph, Arc::new(CpuBackend::with_threads(threads)))?;
            if let Some(w) = &initial {
                w.apply(&mut exec, &BTreeMap::new(), 0)?;
            }
            let mut outs = Vec::with_capacity(steps as usize);
            for step in 0..steps {
                let fed = feeds(step);
                let refs: Vec<(&str, Tensor)> =
                    fed.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
                outs.push(exec.step(&refs)?);
            }
            outs
        }
        Some(p) => {
            let compiled = pipeline::compile(
                model.clone(),
                &CompileOptions {
                    parallel: Some(p),
                    ..Default::default()
                },
            )?;
            let par = compiled
                .parallel
                .context("the parallel compilation produced no per-rank graphs")?;
            let layouts: BTreeMap<String, TensorLayout> =
                par.layouts_by_name().into_iter().collect();
            let inputs: Vec<(String, TensorLayout)> = par
                .begin
                .params
                .iter()
                .filter(|p| p.kind == ParamKind::Input)
                .filter_map(|p| layouts.get(&p.name).map(|l| (p.name.clone(), l.clone())))
                .collect();
            let prepare = |rank: usize, exec: &mut Executor| -> Result<()> {
                if let Some(w) = &initial {
                    w.apply(exec, &layouts, rank)?;
                }
                Ok(())
            };
            let after_step = |_: usize, _: &Executor| Ok(());
            let hooks = RankHooks {
                prepare: &prepare,
                after_step: &after_step,
            };
            let res = run_ranks_with(par.ranks, &inputs, &feeds, steps, 1, Some(&hooks))?;
            res.outputs
                .into_iter()
                .next()
                .context("rank 0 returned no outputs")?
        }
    };
    let outputs = join(&per_batch, batch)?;
    let named: Vec<(String, Tensor)> = names.into_iter().zip(outputs).collect();
    let shapes: Vec<String> = named
        .iter()
        .map(|(n, t)| format!("{n} {:?}", t.shape))
        .collect();
    checkpoint::save(&a.output, &Checkpoint::whole(&model.name, named))?;
    let used = data.len() * batch;
    let dropped = data.samples() - used;
    println!(
        "predicted {used} sample(s) in {} batch(es) of {batch} on {n} device(s){} -> {}: {}{}",
        data.len(),
        match &t.parallel.strategy_ckpt_load_file {
            Some(plan) if n > 1 => format!(" with the plan of {}", plan.display()),
            _ => String::new(),
        },
        a.output.display(),
        shapes.join(", "),
        if dropped > 0 {
            format!(" ({dropped} last sample(s) of the file dropped: not a whole batch)")
        } else {
            String::new()
        }
    );
    Ok(())
}
