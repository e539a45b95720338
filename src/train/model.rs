//! [`Model`]: MindSpore's `Model(net, loss_fn, optimizer).train(epoch, dataset, callbacks)`.

use super::callbacks::{Callback, StepInfo};
use super::DeviceTarget;
use super::TrainError;
use crate::communication::Communication;
use shardc_backend_cpu::CpuBackend;
use shardc_backend_cuda::executor::{gpu_executor, GpuChoice};
use shardc_compiler::auto_pipeline::{self, AutoPipeline};
use shardc_compiler::builder::GraphBuilder;
use shardc_compiler::device::DeviceDescription;
use shardc_compiler::loss::LossFn;
use shardc_compiler::model::build_network_with;
use shardc_compiler::nn::Cell;
use shardc_compiler::optim::OptimizerSpec;
use shardc_compiler::parallel_context::{DatasetStrategy, ParallelContext};
use shardc_compiler::pipeline::{self, CompileOptions};
use shardc_compiler::strategy_file::StrategyFile;
use shardc_ir::{Graph, ParamKind, TensorLayout};
use shardc_passes::autodiff::Optimizer;
use shardc_runtime::comm::Communicator;
use shardc_runtime::data::Dataset;
use shardc_runtime::{Executor, StepExecutor, Tensor};
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// What a [`Model::train`] run did.
#[derive(Clone, Debug, Default)]
pub struct TrainSummary {
    /// The loss of every step, in order (the global batch's loss on every rank).
    pub losses: Vec<f64>,
    /// Steps run.
    pub steps: u64,
    /// Wall-clock seconds of the whole run (compilation included).
    pub seconds: f64,
}

/// A network, its loss and its optimizer, trained on a data set: MindSpore's
/// `mindspore.train.Model`.
///
/// The training step is compiled on the first call to [`Model::train`], from the data set's
/// first batch (its shapes become the graph's inputs: column 0 the network's input, column 1
/// the label). Under a parallel context (`with_context`) the graph is compiled for
/// `device_num` ranks and this process runs its own rank's graph with the cluster's
/// communicator (`with_communication`); how each rank's data set relates to the global batch
/// follows `dataset_strategy`:
/// - `data_parallel` (the default): each rank reads its own shard (`num_shards` /
///   `shard_id`), so the global batch is `device_num` times the rank's batch;
/// - `full_batch`: every rank reads the whole global batch and feeds its block;
/// - an explicit strategy: each rank's batch is its block, the global shape its shape times
///   the strategy.
pub struct Model {
    net: Box<dyn Cell>,
    loss: Box<dyn LossFn>,
    optimizer: Optimizer,
    name: String,
    seed: u64,
    context: ParallelContext,
    comm: Option<Arc<dyn Communicator>>,
    rank: usize,
    size: usize,
    threads: usize,
    dump_dir: Option<PathBuf>,
    device: DeviceTarget,
    compiled: Option<Compiled>,
}

/// The compiled step this process runs.
struct Compiled {
    exec: Box<dyn StepExecutor>,
    /// Per data input this rank's graph reads: the data set's column, its name, and the block
    /// of a global batch this rank feeds when the data set yields the global batch (full
    /// batch). A pipeline stage reads only its own inputs (the first the network's, the last
    /// the label).
    inputs: Vec<(usize, String, Vec<Range<usize>>)>,
    /// In a pipeline, how every rank learns the loss only the last stage computes.
    loss_share: Option<LossShare>,
    /// Per parameter of the logical graph: its layout (several ranks), for gathering.
    layouts: Vec<(String, TensorLayout)>,
    /// The strategy file of a parallel compilation (written beside checkpoints).
    strategy: Option<StrategyFile>,
}

impl Model {
    /// `Model(net, loss_fn, optimizer)`, on one device until told otherwise. The network is
    /// built with the name `net`'s class name and seed 0 (every initializer derives its seed
    /// from it, so every rank and every run starts from the same weights).
    pub fn new(
        net: impl Cell + 'static,
        loss_fn: impl LossFn + 'static,
        optimizer: &dyn OptimizerSpec,
    ) -> Model {
        let name = net.class_name().to_string();
        Model {
            net: Box::new(net),
            loss: Box::new(loss_fn),
            optimizer: optimizer.to_spec(),
            name,
            seed: 0,
            context: ParallelContext::default(),
            comm: None,
            rank: 0,
            size: 1,
            threads: 0,
            dump_dir: None,
            device: DeviceTarget::Cpu,
            compiled: None,
        }
    }

    /// The parallel context (MindSpore's `set_auto_parallel_context`). `device_num` 1 with
    /// several ranks in the cluster is taken as "all of them".
    pub fn with_context(mut self, context: ParallelContext) -> Model {
        self.context = context;
        self
    }

    /// The cluster this process is a rank of (from [`crate::communication::init`]).
    pub fn with_communication(mut self, comm: &Communication) -> Model {
        self.comm = comm.communicator().cloned();
        self.rank = comm.get_rank();
        self.size = comm.get_group_size();
        self
    }

    /// The builder's seed (every initializer's seed derives from it).
    pub fn with_seed(mut self, seed: u64) -> Model {
        self.seed = seed;
        self
    }

    /// The graph's name (default: the network's class name).
    pub fn with_name(mut self, name: &str) -> Model {
        self.name = name.to_string();
        self
    }

    /// Kernel threads (0: all cores on one device, 1 per rank in a cluster).
    pub fn with_threads(mut self, threads: usize) -> Model {
        self.threads = threads;
        self
    }

    /// Write the compiler's dumps here (MindSpore's `save_graphs_path`): per rank
    /// `rank_R/step_parallel_begin_NNNN.ir` and `09_execute_NNNN.ir`.
    pub fn with_save_graphs(mut self, dir: impl Into<PathBuf>) -> Model {
        self.dump_dir = Some(dir.into());
        self
    }

    /// Where the graphs run (MindSpore's `set_context(device_target=...)`; default CPU).
    pub fn with_device_target(mut self, device: DeviceTarget) -> Model {
        self.device = device;
        self
    }

    /// This rank's executor, once compiled (weights, step count, its device's report).
    pub fn executor(&self) -> Option<&dyn StepExecutor> {
        self.compiled.as_ref().map(|c| c.exec.as_ref())
    }

    /// This rank's executor, mutable (to load weights before training).
    pub fn executor_mut(&mut self) -> Option<&mut (dyn StepExecutor + 'static)> {
        self.compiled.as_mut().map(|c| c.exec.as_mut())
    }

    /// Every parameter's layout over the ranks (empty on one device), to gather weights.
    pub fn param_layouts(&self) -> &[(String, TensorLayout)] {
        self.compiled.as_ref().map_or(&[], |c| c.layouts.as_slice())
    }

    /// The graph's name (the network's class name unless [`Model::with_name`] set one).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// This process's rank and the rank count.
    pub fn rank(&self) -> (usize, usize) {
        (self.rank, self.size)
    }

    /// Compiles the training step for batches shaped like `columns` (this rank's batch, one
    /// tensor per column), unless already compiled.
    pub fn build(&mut self, columns: &[Tensor], names: &[String]) -> Result<(), TrainError> {
        if self.compiled.is_some() {
            return Ok(());
        }
        if columns.len() != 2 {
            return Err(TrainError::Mismatch(format!(
                "Model({}): the data set yields {} column(s) {names:?}; Model with a loss function takes two (the network's input, then the label)",
                self.name,
                columns.len()
            )));
        }
        let mut ctx = self.context.clone();
        if ctx.is_parallel() && ctx.device_num <= 1 {
            ctx.device_num = self.size;
        }
        let parallel = ctx.is_parallel() && ctx.device_num > 1;
        if parallel && ctx.device_num != self.size {
            return Err(TrainError::Mismatch(format!(
                "Model({}): the parallel context has device_num {} but the cluster has {} rank(s)",
                self.name, ctx.device_num, self.size
            )));
        }
        if parallel && self.comm.is_none() {
            return Err(TrainError::Mismatch(format!(
                "Model({}): {} over {} devices needs the cluster's communicator: call communication::init() and Model::with_communication",
                self.name, ctx.parallel_mode, ctx.device_num
            )));
        }
        ctx.global_rank = self.rank;
        // The global shape of each input, from this rank's batch.
        let global: Vec<Vec<usize>> = columns
            .iter()
            .enumerate()
            .map(|(i, t)| global_shape(&ctx, parallel, i, &t.shape, &names[i]))
            .collect::<Result<_, _>>()?;
        let inputs: Vec<(&str, shardc_ir::DType, &[usize])> = names
            .iter()
            .zip(columns)
            .zip(&global)
            .map(|((n, t), g)| (n.as_str(), t.dtype(), g.as_slice()))
            .collect();
        let builder = GraphBuilder::new(&self.name).with_seed(self.seed);
        let mut forward =
            build_network_with(builder, self.net.as_ref(), self.loss.as_ref(), &inputs)?;
        let mut popts = if parallel {
            pipeline::parallel_options(&ctx)?
        } else {
            None
        };
        // Pipeline stages and micro-batches: the context's, or the stage planner's
        // (`auto_pipeline`, as `shardc compile --auto-pipeline` does).
        let mut stages = ctx.pipeline;
        if ctx.auto_pipeline {
            if parallel && ctx.dataset_strategy != DatasetStrategy::FullBatch {
                return Err(TrainError::Mismatch(format!(
                    "Model({}): auto_pipeline chooses the stage count, and so how many ranks share a batch: set dataset_strategy to full_batch (every rank reads the global batch and feeds its block), or set pipeline_stages yourself",
                    self.name
                )));
            }
            let Some(p) = popts.as_mut() else {
                return Err(TrainError::Mismatch(format!(
                    "Model({}): auto_pipeline needs auto_parallel on several devices, but device_num is {}",
                    self.name, ctx.device_num
                )));
            };
            let device = DeviceDescription::preset("cpu")
                .map_err(|e| TrainError::Mismatch(format!("Model({}): {e}", self.name)))?;
            match auto_pipeline::plan_pipeline(&forward, &ctx, &device, self.optimizer)
                .map_err(|e| TrainError::Mismatch(format!("Model({}): {e}", self.name)))?
            {
                AutoPipeline::NotLayered(line) => eprintln!("{line}"),
                AutoPipeline::Planned(planned) => {
                    if self.rank == 0 {
                        println!("{}", planned.summary());
                    }
                    p.parallel_optimizer = planned.parallel_optimizer;
                    stages = planned.pipeline;
                    forward = planned.graph.clone();
                }
            }
        }
        let opts = CompileOptions {
            optimizer: Some(self.optimizer),
            dump_dir: self.dump_dir.clone(),
            parallel: popts,
            pipeline: stages,
            load_strategy: ctx.strategy_ckpt_config.load_file.clone(),
            save_strategy: if self.rank == 0 {
                ctx.strategy_ckpt_config.save_file.clone()
            } else {
                None
            },
            mode_names: Some((ctx.parallel_mode.to_string(), ctx.search_mode.to_string())),
            grad_fusion: Some(pipeline::grad_fusion_of(&ctx.comm_fusion)),
            // This process's own rank, materialized from the program (and dumped) only.
            materialize: pipeline::Materialize::Ranks(vec![self.rank]),
            ..Default::default()
        };
        let compiled = pipeline::compile(forward, &opts)?;
        let threads = match self.threads {
            0 if self.size > 1 => 1,
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        };
        let backend = Arc::new(CpuBackend::with_threads(threads));
        let mut strategy = None;
        let (graph, layouts): (Graph, Vec<(String, TensorLayout)>) = match compiled.parallel {
            Some(p) => {
                strategy = Some(StrategyFile::of(
                    &p.begin,
                    &p.assignment,
                    &p.options,
                    &ctx.parallel_mode.to_string(),
                    &ctx.search_mode.to_string(),
                ));
                // Lifted over the stages when pipelined: `block(global rank)` is this
                // rank's.
                let layouts = p.layouts_by_name();
                let g = p.ranks.into_iter().next().ok_or_else(|| {
                    TrainError::Mismatch(format!("no graph for rank {}", self.rank))
                })?;
                (g, layouts)
            }
            None => (compiled.graph, Vec::new()),
        };
        // Which block of a global batch this rank feeds (used when the data set yields
        // global batches), of the inputs its graph reads.
        let mut feed = Vec::new();
        for (i, name) in names.iter().enumerate() {
            let read = graph
                .params
                .iter()
                .any(|p| p.kind == ParamKind::Input && &p.name == name);
            if !read {
                continue;
            }
            let block = match layouts.iter().find(|(n, _)| n == name) {
                Some((_, l)) => l.block(self.rank),
                None => global[i].iter().map(|&d| 0..d).collect(),
            };
            feed.push((i, name.clone(), block));
        }
        let loss_share = match (&self.comm, stages.stages > 1 && parallel) {
            (Some(comm), true) => Some(LossShare {
                comm: comm.clone(),
                group: (0..ctx.device_num).collect(),
                root: (stages.stages - 1) * (ctx.device_num / stages.stages),
            }),
            _ => None,
        };
        let comm = match (&self.comm, parallel || self.size > 1) {
            (Some(c), true) => Some(c.clone()),
            _ => None,
        };
        let exec: Box<dyn StepExecutor> = match self.device {
            DeviceTarget::Cpu => match comm {
                Some(c) => Box::new(Executor::with_communicator(graph, backend, c)?),
                None => Box::new(Executor::new(graph, backend)?),
            },
            DeviceTarget::Gpu { device_id } => Box::new(
                gpu_executor(
                    GpuChoice::Cuda { ordinal: device_id },
                    graph,
                    backend,
                    comm,
                    true,
                    local_rank(),
                )
                .map_err(|e| {
                    TrainError::Cluster(format!("Model({}) on the GPU: {e}", self.name))
                })?,
            ),
            DeviceTarget::Ascend { device_id } => Box::new(
                shardc_tools::ascend::ascend_executor(
                    device_id,
                    graph,
                    backend,
                    comm,
                    true,
                    local_rank(),
                )
                .map_err(|e| {
                    TrainError::Cluster(format!("Model({}) on Ascend: {e:#}", self.name))
                })?,
            ),
            DeviceTarget::GpuEmulated => Box::new(
                gpu_executor(GpuChoice::Emulated, graph, backend, comm, true, None).map_err(
                    |e| {
                        TrainError::Cluster(format!(
                            "Model({}) on the emulated GPU: {e}",
                            self.name
                        ))
                    },
                )?,
            ),
        };
        self.compiled = Some(Compiled {
            exec,
            inputs: feed,
            loss_share,
            layouts,
            strategy,
        });
        Ok(())
    }

    /// Runs one training step on this rank's batch (one tensor per column); returns the loss.
    pub fn train_step(&mut self, columns: Vec<Tensor>) -> Result<f64, TrainError> {
        let name = self.name.clone();
        let c = self.compiled.as_mut().ok_or_else(|| not_built(&name))?;
        let shapes = input_shapes(c);
        let feeds = rank_feeds(&name, &c.inputs, &shapes, columns)?;
        let feeds: Vec<(&str, Tensor)> = feeds.iter().map(|(n, t)| (*n, t.clone())).collect();
        let outputs = c.exec.step(&feeds)?;
        step_loss(&name, c.loss_share.as_ref(), &outputs)
    }

    /// What the callbacks are told: (epoch, epochs), (step in epoch, steps per epoch), the
    /// global step, (loss, step seconds).
    fn step_info(
        &self,
        (epoch, epochs): (usize, usize),
        (step_in_epoch, steps_per_epoch): (usize, usize),
        global_step: u64,
        (loss, step_seconds): (f64, f64),
    ) -> Result<StepInfo<'_>, TrainError> {
        let c = self
            .compiled
            .as_ref()
            .ok_or_else(|| not_built(&self.name))?;
        Ok(StepInfo {
            model: &self.name,
            epoch,
            epochs,
            step_in_epoch,
            steps_per_epoch,
            global_step,
            loss,
            step_seconds,
            rank: self.rank,
            size: self.size,
            exec: c.exec.as_ref(),
            strategy: c.strategy.as_ref(),
        })
    }

    /// `model.train(epoch, dataset, callbacks)`: `epochs` passes over `dataset`, every
    /// callback told of every step. Returns the losses. Each epoch is the one training loop
    /// ([`shardc_runtime::train_steps`]) fed by the data set.
    pub fn train(
        &mut self,
        epochs: usize,
        dataset: &Dataset,
        callbacks: &mut [&mut dyn Callback],
    ) -> Result<TrainSummary, TrainError> {
        let start = Instant::now();
        let names = dataset.column_names();
        let steps_per_epoch = dataset.get_dataset_size();
        let mut summary = TrainSummary::default();
        let mut begun = false;
        for epoch in 0..epochs {
            let mut batches = dataset.iter(epoch as u64)?;
            // The first batch builds the training step: its shapes decide the graph.
            let mut first = None;
            if !begun {
                match batches.next() {
                    Some(batch) => {
                        let batch = batch?;
                        self.build(&batch, &names)?;
                        for cb in callbacks.iter_mut() {
                            cb.on_train_begin(epochs, steps_per_epoch)?;
                        }
                        begun = true;
                        first = Some(batch);
                    }
                    None => continue,
                }
            }
            let mut batches = first.into_iter().map(Ok).chain(batches);
            let (name, rank, size) = (self.name.clone(), self.rank, self.size);
            let c = self.compiled.as_mut().ok_or_else(|| not_built(&name))?;
            let shapes = input_shapes(c);
            let Compiled {
                exec,
                inputs,
                strategy,
                loss_share,
                ..
            } = c;
            let step_began = std::cell::Cell::new(Instant::now());
            let mut step_in_epoch = 0usize;
            let feed = |_| -> Result<Option<Vec<(&str, Tensor)>>, TrainError> {
                let Some(batch) = batches.next() else {
                    return Ok(None);
                };
                step_began.set(Instant::now());
                rank_feeds(&name, inputs, &shapes, batch?).map(Some)
            };
            let after_step = |_, outputs: Vec<Tensor>, e: &(dyn StepExecutor + 'static)| {
                let loss = step_loss(&name, loss_share.as_ref(), &outputs)?;
                step_in_epoch += 1;
                summary.steps += 1;
                summary.losses.push(loss);
                let info = StepInfo {
                    model: &name,
                    epoch: epoch + 1,
                    epochs,
                    step_in_epoch,
                    steps_per_epoch,
                    global_step: summary.steps,
                    loss,
                    step_seconds: step_began.get().elapsed().as_secs_f64(),
                    rank,
                    size,
                    exec: e,
                    strategy: strategy.as_ref(),
                };
                for cb in callbacks.iter_mut() {
                    cb.on_step_end(&info)?;
                }
                Ok(())
            };
            shardc_runtime::train_steps(exec.as_mut(), 0..u64::MAX, feed, after_step)?;
            let last = summary.losses.last().copied().unwrap_or(f64::NAN);
            let info = self.step_info(
                (epoch + 1, epochs),
                (step_in_epoch, steps_per_epoch),
                summary.steps,
                (last, 0.0),
            )?;
            for cb in callbacks.iter_mut() {
                cb.on_epoch_end(&info)?;
            }
        }
        if !begun {
            return Err(TrainError::Mismatch(format!(
                "Model({}): the data set yielded no batch (size {steps_per_epoch}); check batch_size against the shard's size",
                self.name
            )));
        }
        let last = summary.losses.last().copied().unwrap_or(f64::NAN);
        let info = self.step_info(
            (epochs, epochs),
            (0, steps_per_epoch),
            summary.steps,
            (last, 0.0),
        )?;
        for cb in callbacks.iter_mut() {
            cb.on_train_end(&info)?;
        }
        summary.seconds = start.elapsed().as_secs_f64();
        Ok(summary)
    }
}

/// Each data input's shape in this rank's graph (what a batch column must have, or be cut to).
fn input_shapes(c: &Compiled) -> Vec<Vec<usize>> {
    c.inputs
        .iter()
        .map(|(_, input, _)| {
            c.exec
                .graph()
                .params
                .iter()
                .find(|p| p.kind == ParamKind::Input && &p.name == input)
                .map(|p| p.ty.shape.clone())
                .unwrap_or_default()
        })
        .collect()
}

/// This rank's feeds of a batch (one tensor per column) for the inputs its graph reads: each
/// column as it is when it has the rank's shape, else this rank's block of it (the data set
/// yields the global batch).
fn rank_feeds<'a>(
    model: &str,
    inputs: &'a [(usize, String, Vec<Range<usize>>)],
    shapes: &[Vec<usize>],
    columns: Vec<Tensor>,
) -> Result<Vec<(&'a str, Tensor)>, TrainError> {
    let mut columns: Vec<Option<Tensor>> = columns.into_iter().map(Some).collect();
    let mut feeds = Vec::with_capacity(inputs.len());
    for ((column, input, block), want) in inputs.iter().zip(shapes) {
        let Some(t) = columns.get_mut(*column).and_then(Option::take) else {
            return Err(TrainError::Mismatch(format!(
                "Model({model}): the batch has no column {column} ({input})"
            )));
        };
        let t = if &t.shape == want {
            t
        } else {
            let whole: Vec<usize> = block.iter().map(|r| r.end - r.start).collect();
            match t.block(block) {
                Some(b) if &whole == want => b,
                _ => {
                    return Err(TrainError::Mismatch(format!(
                        "Model({model}): column {input} has shape {:?}, but this rank's graph takes {want:?} (its batch) and the global batch would be larger: check num_shards/shard_id against dataset_strategy",
                        t.shape
                    )))
                }
            }
        };
        feeds.push((input.as_str(), t));
    }
    Ok(feeds)
}

/// How the ranks of a pipeline learn the step's loss, which only the last stage computes:
/// its first rank broadcasts it to every rank after each step (so that every rank's
/// callbacks and summary see the global batch's loss, as in data parallel).
struct LossShare {
    comm: Arc<dyn Communicator>,
    /// Every rank.
    group: Vec<usize>,
    /// The last stage's first rank.
    root: usize,
}

/// The loss of a step: its outputs' first (a scalar), or in a pipeline the last stage's,
/// broadcast ([`LossShare`]).
fn step_loss(
    model: &str,
    share: Option<&LossShare>,
    outputs: &[Tensor],
) -> Result<f64, TrainError> {
    let Some(share) = share else {
        return loss_of(model, outputs);
    };
    let mine = if share.comm.rank() == share.root {
        loss_of(model, outputs)?
    } else {
        0.0
    };
    let mut t = Tensor::from_f64(vec![], vec![mine])
        .ok_or_else(|| TrainError::Mismatch(format!("Model({model}): a scalar loss tensor")))?;
    share
        .comm
        .broadcast(&share.group, share.root, &mut t)
        .map_err(|e| {
            TrainError::Cluster(format!(
                "Model({model}): sharing the last pipeline stage's loss from rank {}: {e}",
                share.root
            ))
        })?;
    t.scalar_value()
        .ok_or_else(|| TrainError::Mismatch(format!("Model({model}): the shared loss")))
}

/// The loss of a step's outputs (the first, a scalar).
fn loss_of(model: &str, outputs: &[Tensor]) -> Result<f64, TrainError> {
    outputs
        .first()
        .and_then(Tensor::scalar_value)
        .ok_or_else(|| TrainError::Mismatch(format!("Model({model}): the loss is not a scalar")))
}

/// The global shape of input `i` given this rank's batch shape, by `dataset_strategy`.
fn global_shape(
    ctx: &ParallelContext,
    parallel: bool,
    i: usize,
    local: &[usize],
    name: &str,
) -> Result<Vec<usize>, TrainError> {
    if !parallel {
        return Ok(local.to_vec());
    }
    match &ctx.dataset_strategy {
        DatasetStrategy::FullBatch => Ok(local.to_vec()),
        DatasetStrategy::DataParallel => {
            let mut g = local.to_vec();
            // In a pipeline each stage's ranks split the batch: a rank reads the shard of its
            // data-parallel index within its stage (`rank % (device_num / stages)`).
            match g.first_mut() {
                Some(b) => *b *= ctx.device_num / ctx.pipeline.stages.max(1),
                None => {
                    return Err(TrainError::Mismatch(format!(
                        "column {name} is a scalar per batch: data_parallel splits the batch dimension, so batch the data set"
                    )))
                }
            }
            Ok(g)
        }
        DatasetStrategy::Explicit(s) => {
            let splits = s.0.get(i).ok_or_else(|| {
                TrainError::Mismatch(format!(
                    "dataset_strategy {:?} has no entry for input {i} ({name})",
                    s.0
                ))
            })?;
            if splits.len() != local.len() {
                return Err(TrainError::Mismatch(format!(
                    "dataset_strategy entry {splits:?} for input {name} has {} dims, the column has shape {local:?}",
                    splits.len()
                )));
            }
            Ok(local
                .iter()
                .zip(splits)
                .map(|(&d, &k)| d * k.max(1) as usize)
                .collect())
        }
    }
}

/// The error of a step taken before the graph is compiled (an internal order mistake).
/// The rank on this host, where the launcher says it (`OMPI_COMM_WORLD_LOCAL_RANK`, ...).
fn local_rank() -> Option<usize> {
    [
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "MPI_LOCALRANKID",
        "MS_LOCAL_RANK",
    ]
    .iter()
    .find_map(|k| std::env::var(k).ok()?.parse().ok())
}

fn not_built(name: &str) -> TrainError {
    TrainError::Mismatch(format!(
        "Model({name}): the training step is not compiled yet"
    ))
}
