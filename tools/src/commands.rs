//! `shardc compile`, `shardc run` and `shardc print`.

use crate::parallel_args::ParallelArgs;
use crate::run_args::RunArgs;
use crate::training::{after_step, distributed_data, print_loss, TrainData};
use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use shardc_backend_cpu::CpuBackend;
use shardc_compiler::auto_pipeline;
use shardc_compiler::pipeline::{self, CompileOptions};
use shardc_compiler::strategy_file::StrategyFile;
use shardc_ir::artifact::{self, Artifact, IoEntry, Manifest};
use shardc_ir::spmd::SpmdProgram;
use shardc_ir::{text, Graph, ParamKind};
use shardc_passes::autodiff::Optimizer;
use shardc_runtime::data::MnistData;
use shardc_runtime::executor::Executor;
use shardc_runtime::train_steps;
use shardc_runtime::Tensor;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Optimizer choice on the command line.
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum OptimizerKind {
    /// MindSpore's Momentum (ApplyMomentum).
    Momentum,
    /// Stochastic gradient descent (MindSpore's SGD op).
    Sgd,
    /// Adam.
    Adam,
}

/// Arguments of `shardc compile`.
#[derive(Args, Debug)]
pub struct CompileArgs {
    /// The model: a text IR file (the grammar of the dumps).
    pub model: PathBuf,
    /// Output artifact directory.
    #[arg(short, long)]
    pub output: PathBuf,
    /// The optimizer.
    #[command(flatten)]
    pub optimizer: OptimizerArgs,
    /// Write every pipeline stage as `NN_name_NNNN.ir` into this directory; with several
    /// devices, the ranks `--ranks` (or `--global-rank`) names each into `rank_R/`
    /// (`step_parallel_begin_NNNN.ir`, `step_parallel_end_NNNN.ir`, `09_execute_NNNN.ir`).
    #[arg(long)]
    pub save_graphs_path: Option<PathBuf>,
    /// Verify what every pass made (every violation reported), as debug builds do; also on
    /// with `SHARDC_VERIFY=1`.
    #[arg(long)]
    pub verify: bool,
    /// The ranks to write out materialized for inspection (`rank_R.ir` in the artifact, and
    /// their dumps): `0-7` (one host's), `0,3,5`, or `all`. Default: `--global-rank`, else 0.
    /// The artifact holds the program every rank runs either way; each worker materializes
    /// its own rank when it loads.
    #[arg(long, value_name = "RANKS")]
    pub ranks: Option<String>,
    /// The parallel context (MindSpore's `set_auto_parallel_context`).
    #[command(flatten)]
    pub parallel: ParallelArgs,
    /// The loss of a forward network (its first output the logits), as MindSpore's
    /// `WithLossCell`; a model that already returns a loss is used as it is.
    #[command(flatten)]
    pub loss: LossArgs,
    /// Start from the weights of this checkpoint (MindSpore's `.ckpt`, or a whole-model
    /// `.safetensors`): checked against the model now and kept in the artifact, so that
    /// `shardc run` starts from them (its own `--init-from` or `--resume-from` wins).
    #[arg(long)]
    pub init_from: Option<PathBuf>,
    /// Rules renaming `--init-from`'s tensors to the model's parameters, one `checkpoint name
    /// = model name` per line (`backbone.* = *` for a prefix); PyTorch's and MindSpore's
    /// conventions (`weight`/`gamma`, `running_var`/`moving_variance`) apply without it.
    #[arg(long, requires = "init_from")]
    pub name_map: Option<PathBuf>,
}

/// A loss for a forward network (`--loss`, `--label-shape`, `--label-dtype`).
#[derive(Args, Debug, Clone, Default)]
pub struct LossArgs {
    /// Wrap the model (a forward network) with this loss against a data input `label`.
    #[arg(long, value_enum)]
    pub loss: Option<LossKind>,
    /// The label's shape, comma-separated (default: the logits' for `mse` and
    /// `softmax_cross_entropy`, without the last dimension for
    /// `sparse_softmax_cross_entropy`).
    #[arg(long, value_delimiter = ',', requires = "loss")]
    pub label_shape: Option<Vec<usize>>,
    /// The label's element type (default: the logits' for `mse` and
    /// `softmax_cross_entropy`, int32 for `sparse_softmax_cross_entropy`).
    #[arg(long, value_enum, requires = "loss")]
    pub label_dtype: Option<LabelDType>,
}

/// `--loss`: MindSpore's `MSELoss` and `SoftmaxCrossEntropyWithLogits` (mean).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LossKind {
    /// `nn.MSELoss()`.
    #[value(name = "mse")]
    Mse,
    /// `nn.SoftmaxCrossEntropyWithLogits(sparse=False, reduction="mean")`: one-hot or soft
    /// labels.
    #[value(name = "softmax_cross_entropy")]
    SoftmaxCrossEntropy,
    /// `nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")`: class indices.
    #[value(name = "sparse_softmax_cross_entropy")]
    SparseSoftmaxCrossEntropy,
}

/// `--label-dtype`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LabelDType {
    /// Float32.
    Float32,
    /// Float64.
    Float64,
    /// Int32.
    Int32,
    /// Int64.
    Int64,
}

impl LossArgs {
    /// `graph` wrapped with `--loss` (as it is without the flag).
    pub fn apply(&self, mut graph: Graph) -> Result<Graph> {
        let Some(kind) = self.loss else {
            return Ok(graph);
        };
        shardc_passes::infer::infer_graph(&mut graph)?;
        let logits = graph
            .outputs
            .first()
            .and_then(|o| graph.operand_tensor_type(o))
            .cloned()
            .context("--loss: the model has no tensor output to take a loss of")?;
        let sparse = kind == LossKind::SparseSoftmaxCrossEntropy;
        let shape = match (&self.label_shape, sparse) {
            (Some(s), _) => s.clone(),
            (None, true) => logits.shape[..logits.shape.len().saturating_sub(1)].to_vec(),
            (None, false) => logits.shape.clone(),
        };
        let dtype = match (self.label_dtype, sparse) {
            (Some(LabelDType::Float32), _) => shardc_ir::DType::Float32,
            (Some(LabelDType::Float64), _) => shardc_ir::DType::Float64,
            (Some(LabelDType::Int32), _) => shardc_ir::DType::Int32,
            (Some(LabelDType::Int64), _) => shardc_ir::DType::Int64,
            (None, true) => shardc_ir::DType::Int32,
            (None, false) => logits.dtype,
        };
        let loss: Box<dyn shardc_compiler::loss::LossFn> = match kind {
            LossKind::Mse => Box::new(shardc_compiler::loss::MSELoss::new()),
            LossKind::SoftmaxCrossEntropy => Box::new(
                shardc_compiler::loss::SoftmaxCrossEntropyWithLogits::new(false, "mean"),
            ),
            LossKind::SparseSoftmaxCrossEntropy => Box::new(
                shardc_compiler::loss::SoftmaxCrossEntropyWithLogits::new(true, "mean"),
            ),
        };
        Ok(shardc_compiler::model::with_loss(
            graph,
            loss.as_ref(),
            ("label", dtype, &shape),
        )?)
    }
}

/// The optimizer of the training step.
#[derive(Args, Debug, Clone)]
pub struct OptimizerArgs {
    /// Optimizer of the training step.
    #[arg(long, value_enum, default_value_t = OptimizerKind::Momentum)]
    pub optimizer: OptimizerKind,
    /// Learning rate.
    #[arg(long, default_value_t = 0.01)]
    pub learning_rate: f64,
    /// Momentum (Momentum and SGD).
    #[arg(long, default_value_t = 0.9)]
    pub momentum: f64,
}

/// Arguments of `shardc print`.
#[derive(Args, Debug)]
pub struct PrintArgs {
    /// A text IR file, or an artifact directory.
    pub path: PathBuf,
    /// For an artifact: which rank's graph.
    #[arg(long, default_value_t = 0)]
    pub rank: u32,
}

impl OptimizerArgs {
    /// The optimizer these flags describe.
    pub fn to_optimizer(&self) -> Optimizer {
        optimizer_of(self)
    }
}

fn optimizer_of(a: &OptimizerArgs) -> Optimizer {
    match a.optimizer {
        OptimizerKind::Momentum => Optimizer::Momentum {
            learning_rate: a.learning_rate,
            momentum: a.momentum,
            use_nesterov: false,
        },
        OptimizerKind::Sgd => Optimizer::Sgd {
            learning_rate: a.learning_rate,
            momentum: a.momentum,
            dampening: 0.0,
            weight_decay: 0.0,
            nesterov: false,
        },
        OptimizerKind::Adam => Optimizer::Adam {
            learning_rate: a.learning_rate,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        },
    }
}

/// Reads and parses a text IR model.
pub fn load_model(path: &Path) -> Result<Graph> {
    let src =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let graph = text::parse_graph(&src, &path.display().to_string())?;
    Ok(graph)
}

/// The manifest entries of a graph's data inputs.
fn io_entries(g: &Graph) -> Vec<IoEntry> {
    g.params
        .iter()
        .filter(|p| p.kind == ParamKind::Input)
        .map(|p| IoEntry {
            name: p.name.clone(),
            dtype: p.ty.dtype.name().to_string(),
            shape: p.ty.shape.clone(),
        })
        .collect()
}

/// The manifest key naming the artifact's forward graph (the model as given, before
/// `--loss`), which `shardc predict ART` runs.
pub const FORWARD_MODEL: &str = "forward_model";
/// The forward graph's file in an artifact.
pub const FORWARD_MODEL_FILE: &str = "forward.ir";
/// The manifest key naming the parallel context the artifact was compiled with.
pub const PARALLEL_CONTEXT: &str = "parallel_context";
/// The parallel context's file in an artifact (the TOML `--config` reads).
pub const PARALLEL_CONTEXT_FILE: &str = "parallel.toml";
/// The manifest key naming the strategy file of the artifact's plan (not for pipelines).
pub const STRATEGY_FILE: &str = "strategy_file";
/// The strategy file's name in an artifact (`--strategy-ckpt-load-file` reads it).
pub const STRATEGY_FILE_NAME: &str = "strategy.json";

/// `shardc compile`.
pub fn compile(a: &CompileArgs) -> Result<()> {
    let step = build_step(&StepInputs {
        model: &a.model,
        optimizer: &a.optimizer,
        parallel: &a.parallel,
        loss: &a.loss,
        ranks: a.ranks.as_deref(),
        dump_dir: a.save_graphs_path.clone(),
        verify: a.verify,
    })?;
    let BuiltStep {
        forward,
        plain,
        compiled,
        opts,
        ctx,
        auto_pipeline,
        optimizer: opt,
    } = step;
    let g = compiled.graph;
    let recompute_line = recompute_summary(plain, &g, opt)?;
    let mut extra = serde_json::Map::new();
    if let Some(planned) = &auto_pipeline {
        extra.insert("auto_pipeline".into(), planned.to_json());
    }
    let mut optimizer_line = None;
    let mut strategies = None;
    let (program, graphs, mode) = match compiled.parallel {
        Some(p) => {
            // The plan `shardc predict ART` runs the forward graph with (one stage's).
            if !opts.pipeline.is_pipelined() {
                strategies = Some(StrategyFile::of(
                    &p.begin,
                    &p.assignment,
                    &p.options,
                    &ctx.parallel_mode.to_string(),
                    &ctx.search_mode.to_string(),
                ));
            }
            if p.options.parallel_optimizer.is_some() {
                optimizer_line = Some(parallel_optimizer_summary(&p));
            }
            let layouts: serde_json::Map<String, serde_json::Value> = p
                .begin
                .params
                .iter()
                .zip(&p.param_layouts)
                .map(|(param, l)| Ok((param.name.clone(), serde_json::to_value(l)?)))
                .collect::<Result<_>>()?;
            extra.insert("layouts".into(), serde_json::Value::Object(layouts));
            if opts.pipeline.is_pipelined() {
                extra.insert(
                    "pipeline".into(),
                    serde_json::json!({
                        "stages": opts.pipeline.stages,
                        "micro_size": opts.pipeline.micro_size,
                        "scheduler": opts.pipeline.scheduler.name(),
                        "ranks_per_stage": p.options.device_num / opts.pipeline.stages,
                    }),
                );
            }
            extra.insert("decisions".into(), crate::explain::decisions_json(&p));
            if let Some(r) = &p.assignment.search {
                extra.insert(
                    "search".into(),
                    serde_json::json!({
                        "searcher": r.searcher,
                        "predicted_step_seconds": r.predicted.seconds(),
                        "predicted_compute_seconds": r.predicted.compute,
                        "predicted_communication_seconds": r.predicted.communication,
                        "predicted_memory_bytes": r.predicted.memory,
                        "memory_limit_bytes": r.memory_limit,
                        "exact": r.exact,
                        "notes": r.notes,
                        "search_seconds": r.search_seconds,
                        "searched_ops": r.searched_ops,
                    }),
                );
            }
            let graphs: Vec<(usize, Graph)> = p.rank_ids.iter().copied().zip(p.ranks).collect();
            (p.program, graphs, ctx.parallel_mode.to_string())
        }
        None => (
            SpmdProgram::uniform(g.clone(), 1),
            vec![(0, g.clone())],
            "stand_alone".to_string(),
        ),
    };
    let n = program.device_num;
    let nodes = program.template.nodes.len();
    let manifest = Manifest {
        format_version: artifact::FORMAT_VERSION,
        shardc_version: env!("CARGO_PKG_VERSION").to_string(),
        model: g.name.clone(),
        device_num: n as u32,
        parallel_mode: mode,
        program: artifact::PROGRAM_FILE.to_string(),
        ranks: Vec::new(),
        inputs: io_entries(&g),
        outputs: vec!["loss".into()],
        optimizer: Some(serde_json::to_value(format!("{opt:?}"))?),
        extra,
    };
    let inspect: Vec<(usize, &Graph)> = graphs.iter().map(|(r, g)| (*r, g)).collect();
    let mut art = Artifact { manifest, program };
    let initial =
        crate::init_from::initial_weights(a.init_from.as_deref(), a.name_map.as_deref(), &art)?;
    if initial.is_some() {
        art.manifest.extra.insert(
            "initial_weights".into(),
            crate::init_from::ARTIFACT_WEIGHTS.into(),
        );
    }
    let extra = &mut art.manifest.extra;
    extra.insert(FORWARD_MODEL.into(), FORWARD_MODEL_FILE.into());
    extra.insert(PARALLEL_CONTEXT.into(), PARALLEL_CONTEXT_FILE.into());
    if strategies.is_some() {
        extra.insert(STRATEGY_FILE.into(), STRATEGY_FILE_NAME.into());
    }
    art.write(&a.output, &inspect)?;
    if let Some(w) = &initial {
        w.save(&a.output.join(crate::init_from::ARTIFACT_WEIGHTS), &g.name)?;
    }
    let beside = |name: &str, text: String| {
        let path = a.output.join(name);
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))
    };
    beside(FORWARD_MODEL_FILE, text::print_graph(&forward))?;
    beside(PARALLEL_CONTEXT_FILE, ctx.to_toml_string())?;
    if let Some(file) = &strategies {
        file.save(&a.output.join(STRATEGY_FILE_NAME))?;
    }
    println!(
        "compiled {} -> {} ({n} rank(s) from one program; {nodes} nodes in rank 0's training step)",
        a.model.display(),
        a.output.display(),
    );
    if let Some(line) = optimizer_line {
        println!("{line}");
    }
    if let Some(line) = recompute_line {
        println!("{line}");
    }
    Ok(())
}

/// What a training step is built from: `shardc compile`'s and `shardc export`'s common
/// arguments.
pub struct StepInputs<'a> {
    /// The model file (text IR).
    pub model: &'a Path,
    /// The optimizer.
    pub optimizer: &'a OptimizerArgs,
    /// The parallel context.
    pub parallel: &'a ParallelArgs,
    /// The loss wrapped around a forward network.
    pub loss: &'a LossArgs,
    /// `--ranks`: the ranks to materialize (default: the context's global rank).
    pub ranks: Option<&'a str>,
    /// Where to dump every pipeline stage, if anywhere.
    pub dump_dir: Option<PathBuf>,
    /// Verify after every pass.
    pub verify: bool,
}

/// A training step built by the one pass list, before anything is written.
pub struct BuiltStep {
    /// The model as read (the forward network).
    pub forward: Graph,
    /// The step's input graph: the forward network with its loss, before any pass.
    pub plain: Graph,
    /// What the pipeline made: the step, and with several devices its plan and program.
    pub compiled: pipeline::Compiled,
    /// The options it ran with.
    pub opts: CompileOptions,
    /// The parallel context.
    pub ctx: shardc_compiler::parallel_context::ParallelContext,
    /// The stage planner's plan, with `auto_pipeline`.
    pub auto_pipeline: Option<Box<auto_pipeline::PlannedPipeline>>,
    /// The optimizer.
    pub optimizer: Optimizer,
}

/// Reads the model and compiles its training step through the one pass list: the parallel
/// context's plan and program with several devices, the ranks asked for materialized.
pub fn build_step(a: &StepInputs<'_>) -> Result<BuiltStep> {
    let forward = load_model(a.model)?;
    let graph = a.loss.apply(forward.clone())?;
    let opt = optimizer_of(a.optimizer);
    let ctx = a.parallel.to_context()?;
    let mut popts = a.parallel.options(&ctx)?;
    let (graph, pipeline_options, auto_pipeline) =
        choose_pipeline(graph, &ctx, a.parallel, popts.as_mut(), opt)?;
    let device_num = popts.as_ref().map_or(1, |p| p.device_num);
    let inspect = match a.ranks {
        Some(spec) => parse_ranks(spec, device_num)?,
        None => vec![ctx.global_rank],
    };
    let opts = CompileOptions {
        optimizer: Some(opt),
        dump_dir: a.dump_dir.clone(),
        parallel: popts.clone(),
        load_strategy: ctx.strategy_ckpt_config.load_file.clone(),
        save_strategy: ctx.strategy_ckpt_config.save_file.clone(),
        mode_names: Some((ctx.parallel_mode.to_string(), ctx.search_mode.to_string())),
        grad_fusion: Some(pipeline::grad_fusion_of(&ctx.comm_fusion)),
        materialize: pipeline::Materialize::Ranks(inspect),
        verify: a.verify || pipeline::verify_by_default(),
        pipeline: pipeline_options,
    };
    let plain = graph.clone();
    let compiled = pipeline::compile(graph, &opts)?;
    Ok(BuiltStep {
        forward,
        plain,
        compiled,
        opts,
        ctx,
        auto_pipeline,
        optimizer: opt,
    })
}

/// The forward graph and pipeline options to compile: the context's, or with `auto_pipeline`
/// the stage planner's plan applied (stage and recompute marks on the graph, the stage and
/// micro-batch counts, optimizer sharding in `popts`), its summary printed. A model without
/// repeated layers compiles as plain auto_parallel, and says so.
fn choose_pipeline(
    graph: Graph,
    ctx: &shardc_compiler::parallel_context::ParallelContext,
    args: &ParallelArgs,
    popts: Option<&mut shardc_passes::parallel::ParallelOptions>,
    opt: Optimizer,
) -> Result<(
    Graph,
    shardc_passes::pipeline::PipelineOptions,
    Option<Box<auto_pipeline::PlannedPipeline>>,
)> {
    if !ctx.auto_pipeline {
        return Ok((graph, ctx.pipeline, None));
    }
    let Some(popts) = popts else {
        bail!(
            "auto_pipeline needs auto_parallel on several devices, but device_num is {}",
            ctx.device_num
        );
    };
    let device = args.device_description()?;
    match auto_pipeline::plan_pipeline(&graph, ctx, &device, opt)? {
        auto_pipeline::AutoPipeline::NotLayered(line) => {
            eprintln!("{line}");
            Ok((graph, ctx.pipeline, None))
        }
        auto_pipeline::AutoPipeline::Planned(planned) => {
            println!("{}", planned.summary());
            popts.parallel_optimizer = planned.parallel_optimizer;
            Ok((planned.graph.clone(), planned.pipeline, Some(planned)))
        }
    }
}

/// `recompute: N nodes replayed in the backward pass; ...`: the liveness memory plan of the
/// logical training step (one device) with and without the replays, when any node was marked
/// `recompute: true` (`None` otherwise).
fn recompute_summary(forward: Graph, step: &Graph, opt: Optimizer) -> Result<Option<String>> {
    let replayed = shardc_passes::recompute::replayed_count(step);
    if replayed == 0 {
        return Ok(None);
    }
    let opts = CompileOptions {
        optimizer: Some(opt),
        verify: false,
        ..Default::default()
    };
    let (kept, _) = pipeline::compile_until(forward, &opts, "autodiff")?;
    let (with, without) = (
        shardc_runtime::memory::plan(step),
        shardc_runtime::memory::plan(&kept.graph),
    );
    Ok(Some(format!(
        "recompute: {replayed} nodes replayed in the backward pass; the training step's memory \
         plan (one device): live peak {} bytes ({} without), planned peak {} bytes ({} without)",
        with.live_peak_bytes, without.live_peak_bytes, with.peak_bytes, without.peak_bytes
    )))
}

/// `parallel optimizer: K of N weights split; weights + optimizer state per rank: X bytes
/// (Y without)`, from the layouts before and after the split.
fn parallel_optimizer_summary(p: &pipeline::ParallelCompiled) -> String {
    let a = &p.assignment;
    let bytes = |l: &shardc_ir::TensorLayout, param: &shardc_ir::Param| -> usize {
        l.slice_shape().iter().product::<usize>() * param.ty.dtype.size_bytes()
    };
    let (mut with, mut without, mut weights) = (0usize, 0usize, 0usize);
    for (i, param) in p.begin.params.iter().enumerate() {
        if !param.is_weight() {
            continue;
        }
        weights += usize::from(param.requires_grad());
        let now = &a.param_layouts[i];
        with += bytes(now, param);
        without += bytes(a.optimizer_shard_of(i).map_or(now, |s| &s.before), param);
    }
    format!(
        "parallel optimizer: {} of {weights} weights split over their data-parallel group; \
         weights + optimizer state per rank: {with} bytes ({without} without)",
        a.optimizer_shards.len()
    )
}

/// The ranks `--ranks` names: `all`, `A-B` (inclusive), or a comma-separated list of those.
pub fn parse_ranks(spec: &str, device_num: usize) -> Result<Vec<usize>> {
    let mut out = Vec::new();
    let bad = |what: &str, why: String| anyhow::anyhow!("--ranks {spec}: {what}: {why}");
    for part in spec.split(',').map(str::trim) {
        if part == "all" {
            out.extend(0..device_num);
            continue;
        }
        let (lo, hi) = match part.split_once('-') {
            Some((a, b)) => (a.trim(), b.trim()),
            None => (part, part),
        };
        let num = |x: &str| -> Result<usize> {
            x.parse::<usize>()
                .map_err(|_| bad(part, format!("{x:?} is not a rank number")))
        };
        let (lo, hi) = (num(lo)?, num(hi)?);
        if lo > hi {
            return Err(bad(part, format!("{lo} is above {hi}")));
        }
        if hi >= device_num {
            return Err(bad(
                part,
                format!("rank {hi} is not below the device count {device_num}"),
            ));
        }
        out.extend(lo..=hi);
    }
    let mut seen = std::collections::HashSet::new();
    out.retain(|r| seen.insert(*r));
    if out.is_empty() {
        return Err(bad(spec, "names no rank".into()));
    }
    Ok(out)
}

/// `shardc run`.
pub fn run(a: &RunArgs) -> Result<()> {
    // A process of a cluster (`shardc launch`, MS_ROLE, mpirun) runs its own rank only.
    if let Some(role) = crate::cluster_run::role_from_env(a.comm)? {
        return crate::cluster_run::run_rank(a, role);
    }
    let art = Artifact::read(&a.artifact)?;
    if a.device.target().is_gpu() {
        return crate::gpu::run(a, art);
    }
    if a.device.target().is_ascend() {
        return crate::ascend::run(a, art);
    }
    if art.device_num() > 1 {
        return run_ranks_in_process(a, art);
    }
    let graph = art.rank_graph(0)?;
    let threads = if a.threads == 0 {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    } else {
        a.threads
    };
    let inputs: Vec<(String, Vec<usize>)> = graph
        .params
        .iter()
        .filter(|p| p.kind == ParamKind::Input)
        .map(|p| (p.name.clone(), p.ty.shape.clone()))
        .collect();
    let mut exec = Executor::new(graph, Arc::new(CpuBackend::with_threads(threads)))?;
    let init = crate::init_from::init_path(a.init_from.as_deref(), &a.artifact, &art);
    crate::init_from::init_rank(init.as_deref(), a.name_map.as_deref(), &art, &mut exec, 0)?;
    // Resume: the weights, the optimizer state and the step count of the newest valid
    // checkpoint; steps continue from there (`--steps` counts the total).
    let start = match &a.checkpoint.resume_from {
        Some(dir) => {
            let mut rp = crate::ckpt::resume_point(
                dir,
                &crate::ckpt::RankWeights::Graphs(&[exec.graph()]),
                &|_| true,
                "",
                a.steps,
            )?;
            crate::ckpt::apply(&mut rp, 0, 1, &mut exec)?;
            rp.step
        }
        None => 0,
    };
    enum Source {
        Arrays(TrainData),
        Mnist(MnistData, usize),
    }
    let (source, pool) = match &a.mnist {
        Some(dir) => {
            let data = MnistData::load_dir(dir)?;
            let batch = match inputs.as_slice() {
                [(_, xs), (_, ys)] if xs.len() == 2 && xs[1] == data.rows * data.cols && ys.len() == 1 && ys[0] == xs[0] => xs[0],
                _ => bail!(
                    "--mnist needs a model whose inputs are (batch, {}) images and (batch) labels; this one has {:?}",
                    data.rows * data.cols,
                    inputs
                ),
            };
            let nb = data.num_batches(batch) as u64;
            (Source::Mnist(data, batch), nb)
        }
        None => {
            let data = TrainData::of(a, exec.graph())?;
            let pool = data.per_epoch(a);
            (Source::Arrays(data), pool)
        }
    };
    let per_epoch = a.steps_per_epoch.unwrap_or(pool).max(1);
    let saver = crate::ckpt::Saver::new(&a.checkpoint, &art.manifest.model, per_epoch, 0, 1)?;
    if let Some(s) = &saver {
        s.write_strategy(&a.artifact, &art)?;
    }
    let names: Vec<&str> = inputs.iter().map(|(n, _)| n.as_str()).collect();
    train_steps(
        &mut exec,
        start..a.steps,
        |step| -> Result<Option<Vec<(&str, Tensor)>>> {
            Ok(Some(match &source {
                Source::Arrays(s) => s.feeds(step),
                Source::Mnist(m, batch) => {
                    let (x, y) = m.batch(step as usize, *batch)?;
                    vec![(names[0], x), (names[1], y)]
                }
            }))
        },
        |step, outputs, exec| after_step(step, &outputs, exec, per_epoch, saver.as_ref(), a.steps),
    )?;
    if a.stats {
        println!("{}", exec.memory_plan().summary());
        println!("{}", exec.stats());
        crate::run_stats::record(&a.artifact, 0, exec.graph(), exec.stats());
    }
    Ok(())
}

/// `shardc print`.
pub fn print(a: &PrintArgs) -> Result<()> {
    let graph = if a.path.is_dir() {
        let art = Artifact::read(&a.path)?;
        art.rank_graph(a.rank as usize)
            .with_context(|| format!("{}: rank {}", a.path.display(), a.rank))?
    } else {
        let mut g = load_model(&a.path)?;
        shardc_passes::infer::infer_graph(&mut g)?;
        g
    };
    print!("{}", text::print_graph(&graph));
    Ok(())
}

/// `shardc run` on a multi-rank artifact: every rank on a thread of this process (the
/// in-process communicator), fed its block of the same global batches; prints rank 0's loss
/// (every rank computes the same global loss).
fn run_ranks_in_process(a: &RunArgs, art: Artifact) -> Result<()> {
    if a.mnist.is_some() {
        bail!("--mnist runs one device; a multi-rank artifact trains on synthetic data or --data here");
    }
    let (data, inputs) = distributed_data(a, &art)?;
    let feeds = |step: u64| -> Vec<(String, Tensor)> {
        data.feeds(step)
            .into_iter()
            .map(|(n, t)| (n.to_string(), t))
            .collect()
    };
    let per_epoch = data.per_epoch(a);
    let n = art.device_num();
    // Every rank's graph, materialized from the program.
    let rank_graphs = art.rank_graphs()?;
    // Checkpoints: every rank loads its file of the newest complete step, saves its own.
    let mut resume = match &a.checkpoint.resume_from {
        Some(dir) => {
            let graphs: Vec<&Graph> = rank_graphs.iter().collect();
            Some(crate::ckpt::resume_point(
                dir,
                &crate::ckpt::RankWeights::Graphs(&graphs),
                &|_| true,
                "",
                a.steps,
            )?)
        }
        None => None,
    };
    let start = resume.as_ref().map_or(0, |rp| rp.step);
    let savers: Vec<Option<crate::ckpt::Saver>> = (0..n)
        .map(|r| crate::ckpt::Saver::new(&a.checkpoint, &art.manifest.model, per_epoch, r, n))
        .collect::<Result<_>>()?;
    if let Some(Some(s)) = savers.first() {
        s.write_strategy(&a.artifact, &art)?;
    }
    let loaded: Vec<std::sync::Mutex<Option<(PathBuf, shardc_runtime::checkpoint::Checkpoint)>>> =
        (0..n)
            .map(|r| {
                std::sync::Mutex::new(
                    resume.as_mut().and_then(|rp| {
                        rp.checkpoints[r].take().map(|cp| (rp.files[r].clone(), cp))
                    }),
                )
            })
            .collect();
    let init = crate::init_from::init_path(a.init_from.as_deref(), &a.artifact, &art);
    let initial = crate::init_from::initial_weights(init.as_deref(), a.name_map.as_deref(), &art)?;
    let layouts = crate::init_from::layouts_of(&art)?;
    let prepare = |rank: usize, exec: &mut Executor| -> Result<()> {
        if let Some(w) = &initial {
            w.apply(exec, &layouts, rank)?;
        }
        let taken = loaded[rank]
            .lock()
            .map_err(|_| anyhow::anyhow!("rank {rank}: checkpoint lock poisoned"))?
            .take();
        if let Some((path, cp)) = taken {
            cp.apply_to(&path, exec, rank as u32, n as u32)?;
        }
        Ok(())
    };
    let steps = a.steps;
    let after_step = |rank: usize, exec: &Executor| -> Result<()> {
        // `--stats`: every rank's per-node times, after its last step (for `shardc report`).
        if a.stats && exec.step_count() == steps {
            crate::run_stats::record(&a.artifact, rank, exec.graph(), exec.stats());
        }
        match &savers[rank] {
            Some(s) => s.after_step(exec, exec.step_count() == steps),
            None => Ok(()),
        }
    };
    let hooks = crate::in_process::RankHooks {
        prepare: &prepare,
        after_step: &after_step,
    };
    let res =
        crate::in_process::run_ranks_with(rank_graphs, &inputs, &feeds, a.steps, 1, Some(&hooks))?;
    // Rank 0's losses, or in a pipeline those of the last stage's first rank.
    // (None at all when no step was left to run.)
    let ran = res.outputs.iter().any(|steps| !steps.is_empty());
    let losses: &[Vec<Tensor>] = match res.loss_rank_outputs() {
        Some(l) => l,
        None if ran => bail!("no rank returned a loss"),
        None => &[],
    };
    for (i, outs) in losses.iter().enumerate() {
        print_loss(outs, start + i as u64, per_epoch)?;
    }
    Ok(())
}
