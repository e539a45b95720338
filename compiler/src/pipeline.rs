//! The compilation pipeline: the one place that lists the passes, in order ([`pass_names`]).
//!
//! | index | name                  | what                                                  |
//! |-------|-----------------------|-------------------------------------------------------|
//! | 00    | `infer_types`         | fills every node's type by the shape rules, then verifies (always: the input may be a file a user wrote) |
//! | 01    | `micro_batch`         | pipeline stages on every forward node (`pipeline_stage`: the cells' marks, else a split by compute cost) and the forward cloned per micro-batch, the loss combined (`passes::pipeline::{stages, micro_batch}`; only with [`CompileOptions::pipeline`] `stages > 1` or `micro_size > 1`) |
//! | 02    | `autodiff`            | forward + backward + optimizer update (only with an optimizer) |
//! | 03    | `recompute`           | forward nodes marked `recompute: true` replayed in the backward pass, so their results die after the forward (`passes::recompute`; changes nothing without marks) |
//! | 04    | `sync_bn`             | training-mode BatchNorm as SyncBatchNorm pairs (`passes::parallel::sync_bn`) |
//! | 05    | `step_parallel_begin` | a strategy for every op (the loaded strategy file's, else the mode's), a layout for every parameter (`passes::parallel::strategy`; with `enable_parallel_optimizer`, weights and optimizer state split over their data-parallel group, `passes::parallel::optimizer_shard`); writes the strategy file |
//! | 06    | `step_parallel_end`   | the program every rank runs, once (SPMD): rank 0's graph with sliced shapes and inserted communication, and what differs per rank (`passes::parallel::partition::program`) |
//! | 07    | `pipeline_split`      | the program lifted from one stage's mesh to every device and split into one program per stage, `Send` / `Receive` between them, each stage's nodes in the scheduler's order (`passes::pipeline::split`; only with `stages > 1`); before that, with `micro_size > 1`, the micro-batches' gradient terms summed and reduced once (`passes::pipeline::accumulate`; this alone on one stage) |
//! | 08    | `grad_fusion`         | gradient AllReduces moved to just after their gradients and grouped into `fusion: k` buckets by [`CompileOptions::grad_fusion`], the parallel optimizer's weight gathers moved to the start of the step and bucketed by the cell that reads them first (`passes::grad_fusion::fuse_program`, per stage when pipelined) |
//! | 09    | `execute`             | each asked rank's graph, materialized from the program ([`CompileOptions::materialize`]): its stage's graph when pipelined |
//!
//! With pipeline stages, passes 05-06 plan one stage's intra-op mesh (`device_num / stages`
//! devices); `pipeline_split` lifts the program to every device (the device matrix is
//! stages × that mesh).
//!
//! Passes 04-08 run only with [`CompileOptions::parallel`] set for more than one device. Every
//! pass is one entry of `PASSES`: its name, which is its dump's name and (by its place in the
//! list) index, when it is enabled, and the function, over a [`CompileState`]. [`compile`]
//! runs them all; [`compile_until`] stops after a named one (the filetests print, and the
//! benchmarks time, what it made). Nothing else restates the sequence. Each pass is recorded
//! ([`PassRecord`]: its index, name and time).
//!
//! With [`CompileOptions::verify`] on (in debug builds and so in tests, with `shardc compile
//! --verify`, or `SHARDC_VERIFY=1`), what each pass made is verified after it, every violation
//! reported ([`shardc_passes::verify::Violations`]).
//!
//! With [`CompileOptions::dump_dir`] set, the passes write their dumps there in the text form
//! of [`shardc_ir::text::print_graph`] (`NNNN` a zero-padded counter of dumps in this
//! process): the logical passes `NN_name_NNNN.ir`; on several devices, per rank as MindSpore's,
//! for the ranks [`CompileOptions::materialize`] names, `rank_R/step_parallel_begin_NNNN.ir`
//! (the logical graph with every op's `in_strategy` and where it came from),
//! `rank_R/step_parallel_end_NNNN.ir` (rank R's graph before gradient fusion) and
//! `rank_R/pipeline_split_NNNN.ir` (rank R's stage graph, when pipelined) and
//! `rank_R/09_execute_NNNN.ir` (the graph rank R runs). On one device the final graph is
//! `09_execute_NNNN.ir`. Writing files is the compiler crate's job: the passes know no file
//! system.

use crate::builder::BuildError;
use crate::optim;
use crate::parallel_context::{
    CommFusion, DatasetStrategy, ParallelContext, ParallelMode, SearchMode,
};
use crate::strategy_file::{StrategyFile, StrategyFileError};
use rayon::prelude::*;
use shardc_ir::spmd::SpmdProgram;
use shardc_ir::Graph;
use shardc_passes::autodiff::{self, Optimizer};
use shardc_passes::grad_fusion::{self, GradFusion, GradFusionError};
use shardc_passes::parallel::{
    partition, strategy, sync_bn, DatasetLayout, Mode, ParallelError, ParallelOptimizer,
    ParallelOptions, SearchMode as PassSearchMode, SearchOptions,
};
use shardc_passes::pipeline::{self as pipe, PipelineError, PipelineOptions};
use shardc_passes::{infer, verify};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;
use thiserror::Error;

/// What to compile into.
#[derive(Clone, Debug)]
pub struct CompileOptions {
    /// Build the training step with this optimizer; `None` keeps the forward graph.
    pub optimizer: Option<Optimizer>,
    /// Write every stage as `NN_name_NNNN.ir` into this directory (MindSpore's
    /// `save_graphs_path`).
    pub dump_dir: Option<PathBuf>,
    /// Compile for several devices (`None`: one device).
    pub parallel: Option<ParallelOptions>,
    /// Take every op's strategy from this strategy file (`strategy_ckpt_config.load_file`).
    pub load_strategy: Option<PathBuf>,
    /// Write the strategy file here (`strategy_ckpt_config.save_file`).
    pub save_strategy: Option<PathBuf>,
    /// The name of the parallel mode and searcher, for the strategy file.
    pub mode_names: Option<(String, String)>,
    /// How the gradient AllReduces of each rank are bucketed (MindSpore's `comm_fusion`;
    /// see [`grad_fusion_of`]). `None`: no `comm_fusion`, every gradient its own bucket.
    pub grad_fusion: Option<GradFusion>,
    /// Which ranks' graphs to materialize from the program (and dump): every rank by default
    /// (for in-process runs); `shardc compile` asks for the ranks to inspect only.
    pub materialize: Materialize,
    /// Verify what every pass made, reporting every violation (on by default in debug builds,
    /// so in tests, and when `SHARDC_VERIFY=1`; `shardc compile --verify` sets it). The input
    /// graph is verified after `infer_types` whatever this says.
    pub verify: bool,
    /// Pipeline parallelism: the stage count (MindSpore's `pipeline_stages`), the micro-batch
    /// count (`PipelineCell(net, micro_size)`) and the scheduler (`pipeline_config`). With
    /// `stages > 1` the intra-op passes plan `device_num / stages` devices per stage.
    pub pipeline: PipelineOptions,
}

impl Default for CompileOptions {
    fn default() -> CompileOptions {
        CompileOptions {
            optimizer: None,
            dump_dir: None,
            parallel: None,
            load_strategy: None,
            save_strategy: None,
            mode_names: None,
            grad_fusion: None,
            materialize: Materialize::default(),
            verify: verify_by_default(),
            pipeline: PipelineOptions::default(),
        }
    }
}

/// Whether [`CompileOptions::verify`] is on by default: in debug builds (tests), or with the
/// environment variable `SHARDC_VERIFY` set to `1` or `true`.
pub fn verify_by_default() -> bool {
    cfg!(debug_assertions)
        || std::env::var("SHARDC_VERIFY").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"))
}

/// Which ranks a compilation materializes from the program every rank runs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Materialize {
    /// Every rank.
    #[default]
    All,
    /// These ranks (each below the device count), in this order.
    Ranks(Vec<usize>),
}

/// The parallel part of a compilation.
#[derive(Clone, Debug)]
pub struct ParallelCompiled {
    /// The options it ran with.
    pub options: ParallelOptions,
    /// Every op's strategy and its source; every parameter's layout.
    pub assignment: strategy::Assignment,
    /// The logical graph with every op's strategy (the `step_parallel_begin` dump).
    pub begin: Graph,
    /// The program every rank runs, written once: rank 0's graph and what differs per rank
    /// (each worker materializes its own rank from it).
    pub program: SpmdProgram,
    /// The ranks materialized ([`CompileOptions::materialize`]), in order.
    pub rank_ids: Vec<usize>,
    /// Their graphs, in the order of `rank_ids` (every rank's, `0..device_num`, by default).
    pub ranks: Vec<Graph>,
    /// Every logical parameter's layout over all `device_num` ranks: the assignment's, lifted
    /// over the pipeline stages when pipelined (the stage axis major), so that
    /// `layout.block(global_rank)` is the rank's block (feeding data, merging checkpoints).
    pub param_layouts: Vec<shardc_ir::TensorLayout>,
}

impl ParallelCompiled {
    /// Every logical parameter's name and its layout over all ranks
    /// ([`ParallelCompiled::param_layouts`]: lifted over the pipeline stages when pipelined),
    /// in parameter order.
    pub fn layouts_by_name(&self) -> Vec<(String, shardc_ir::TensorLayout)> {
        self.begin
            .params
            .iter()
            .zip(&self.param_layouts)
            .map(|(p, l)| (p.name.clone(), l.clone()))
            .collect()
    }
}

/// One stage of the pipeline as it ran (what it made is in the [`CompileState`], or for
/// [`compile`] in [`Compiled`]; [`compile_until`] gives the state after any pass).
#[derive(Clone, Debug)]
pub struct PassRecord {
    /// The stage's index in the pass list (the `NN` of its dump).
    pub index: usize,
    /// The stage's name.
    pub name: &'static str,
    /// How long the pass took, in seconds (its dump and verification not included).
    pub seconds: f64,
}

/// The result of [`compile`].
#[derive(Clone, Debug)]
pub struct Compiled {
    /// The final graph.
    pub graph: Graph,
    /// Every stage that ran, in order.
    pub stages: Vec<PassRecord>,
    /// The per-rank graphs, when compiled for several devices.
    pub parallel: Option<ParallelCompiled>,
}

/// An error of the pipeline, naming the stage.
#[derive(Debug, Error)]
pub enum CompileError {
    /// Building a graph failed.
    #[error(transparent)]
    Build(#[from] BuildError),
    /// The shape rules rejected a node.
    #[error("infer_types: op `{instance}` ({op}, node %{index}): {error}")]
    Infer {
        /// The node's instance name.
        instance: String,
        /// Its op.
        op: shardc_ir::OpKind,
        /// Its number as printed (`%3`).
        index: usize,
        /// Why the shape rules rejected it (in the message, not a separate cause, so that it
        /// prints once).
        error: Box<infer::InferError>,
    },
    /// A graph failed verification after a stage.
    #[error("{stage}: graph `{graph}` failed verification: {error}")]
    Verify {
        /// The stage after which it failed.
        stage: &'static str,
        /// The graph's name.
        graph: String,
        /// The verifier's error (in the message).
        error: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The optimizer's numbers are unusable.
    #[error("optimizer {optimizer}: {reason}")]
    InvalidOptimizer {
        /// The optimizer, as debug-printed.
        optimizer: String,
        /// Why.
        reason: String,
    },
    /// The parallel passes rejected the graph (an invalid strategy, a dataset strategy that
    /// does not fit, ...).
    #[error("{stage}: {error}")]
    Parallel {
        /// The stage.
        stage: &'static str,
        /// The error, naming the op instance and the reason (in the message, not as a
        /// separate cause, so that it prints once).
        error: ParallelError,
    },
    /// Gradient fusion rejected its configuration or a gradient AllReduce.
    #[error("{}", named_stage("grad_fusion", .0))]
    GradFusion(#[from] GradFusionError),
    /// A pass found a part of the compilation that an earlier pass makes missing (it was
    /// disabled, or the pipeline was stopped before it).
    #[error("{pass}: needs what `{needs}` makes, and it did not run")]
    Order {
        /// The pass (or `compile`).
        pass: &'static str,
        /// The pass that makes what it needs.
        needs: &'static str,
    },
    /// [`compile_until`] was asked for a pass that does not exist.
    #[error("no pass named `{name}`; the passes are {passes}")]
    UnknownPass {
        /// The name asked for.
        name: String,
        /// Every pass, in order.
        passes: String,
    },
    /// A strategy file could not be read, written or applied.
    #[error(transparent)]
    StrategyFile(#[from] StrategyFileError),
    /// Autodiff failed.
    #[error(transparent)]
    Autodiff(Box<dyn std::error::Error + Send + Sync>),
    /// A pipeline pass rejected the options or the graph (naming the op or value and why).
    #[error("{0}")]
    Pipeline(#[from] PipelineError),
    /// The `recompute` pass refused a marked node (it names the op, the node and why).
    #[error(transparent)]
    Recompute(Box<shardc_passes::recompute::RecomputeError>),
    /// A dump could not be written.
    #[error("writing {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// What the passes read and write: the logical graph, then (on several devices) the plan,
/// the program every rank runs and the ranks' graphs. Each pass fills its part; a pass that
/// needs an earlier one's part and finds it missing is an error naming both.
#[derive(Clone, Debug)]
pub struct CompileState {
    /// The logical graph (the whole model, as for one device).
    pub graph: Graph,
    /// Every op's strategy and every parameter's layout (after `step_parallel_begin`).
    pub assignment: Option<strategy::Assignment>,
    /// The logical graph with every op's strategy (the `step_parallel_begin` dump).
    pub begin: Option<Graph>,
    /// The program every rank runs, before gradient fusion (after `step_parallel_end`; taken
    /// by `grad_fusion`).
    pub unfused: Option<SpmdProgram>,
    /// The program after gradient fusion (after `grad_fusion`).
    pub program: Option<SpmdProgram>,
    /// The materialized ranks and their graphs, in [`CompileOptions::materialize`]'s order
    /// (after `execute`; empty on one device).
    pub ranks: Vec<(usize, Graph)>,
}

impl CompileState {
    fn new(graph: Graph) -> CompileState {
        CompileState {
            graph,
            assignment: None,
            begin: None,
            unfused: None,
            program: None,
            ranks: Vec::new(),
        }
    }
}

/// What a pass writes into the dump directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dump {
    /// The logical graph, as `NN_name_NNNN.ir`.
    Logical,
    /// Each materialized rank's `rank_R/name_NNNN.ir`, un-numbered as MindSpore's
    /// `step_parallel_*` dumps.
    PerRankNamed,
    /// Each materialized rank's `rank_R/NN_name_NNNN.ir` (on one device, the logical graph as
    /// `NN_name_NNNN.ir`).
    PerRankNumbered,
    /// Nothing of its own: its result is what the next dump shows.
    None,
}

/// A pass: its name (its dump's name and, by its place in [`PASSES`], the dump's index), when
/// the options enable it, what it dumps, and the transformation.
struct Pass {
    name: &'static str,
    enabled: fn(&CompileOptions) -> bool,
    dump: Dump,
    run: fn(&mut CompileState, &CompileOptions) -> Result<(), CompileError>,
}

/// THE pass list, in order: the compiler, the filetests and the benchmarks all run it (through
/// [`compile`] or [`compile_until`]); nothing else restates the sequence.
const PASSES: &[Pass] = &[
    Pass {
        name: "infer_types",
        enabled: |_| true,
        dump: Dump::Logical,
        run: run_infer_types,
    },
    Pass {
        name: "micro_batch",
        enabled: |o| o.pipeline.stages > 1 || o.pipeline.micro_size > 1,
        dump: Dump::Logical,
        run: run_micro_batch,
    },
    Pass {
        name: "autodiff",
        enabled: |o| o.optimizer.is_some(),
        dump: Dump::Logical,
        run: run_autodiff,
    },
    Pass {
        name: "recompute",
        enabled: |o| o.optimizer.is_some(),
        dump: Dump::Logical,
        run: run_recompute,
    },
    Pass {
        name: "sync_bn",
        enabled: is_parallel,
        dump: Dump::Logical,
        run: run_sync_bn,
    },
    Pass {
        name: "step_parallel_begin",
        enabled: is_parallel,
        dump: Dump::PerRankNamed,
        run: run_strategy,
    },
    Pass {
        name: "step_parallel_end",
        enabled: is_parallel,
        dump: Dump::PerRankNamed,
        run: run_partition,
    },
    Pass {
        name: "pipeline_split",
        enabled: |o| is_parallel(o) && (o.pipeline.stages > 1 || o.pipeline.micro_size > 1),
        dump: Dump::PerRankNamed,
        run: run_pipeline_split,
    },
    Pass {
        name: "grad_fusion",
        enabled: is_parallel,
        dump: Dump::None,
        run: run_grad_fusion,
    },
    Pass {
        name: "execute",
        enabled: |_| true,
        dump: Dump::PerRankNumbered,
        run: run_materialize,
    },
];

/// The names of the pipeline's passes, in order (index = the `NN` of their dumps).
pub fn pass_names() -> Vec<&'static str> {
    PASSES.iter().map(|p| p.name).collect()
}

/// The index of the pass named `name` (the `NN` of its dumps), if there is one.
pub fn pass_index(name: &str) -> Option<usize> {
    PASSES.iter().position(|p| p.name == name)
}

/// Whether the options compile for several devices (the parallel passes run).
fn is_parallel(o: &CompileOptions) -> bool {
    o.parallel.as_ref().is_some_and(|p| p.device_num > 1)
}

/// The parallel options of a parallel compilation (the passes that call this are enabled only
/// by [`is_parallel`]; without options they are an error naming the pass, not a panic).
fn parallel_of<'a>(
    o: &'a CompileOptions,
    pass: &'static str,
) -> Result<&'a ParallelOptions, CompileError> {
    o.parallel.as_ref().ok_or(CompileError::Parallel {
        stage: pass,
        error: ParallelError::Options("the pass needs parallel options (device_num > 1)".into()),
    })
}

/// The part of the state that pass `pass` needs, or an error naming the pass that makes it.
fn needs<'a, T>(
    part: &'a Option<T>,
    pass: &'static str,
    made_by: &'static str,
) -> Result<&'a T, CompileError> {
    part.as_ref().ok_or(CompileError::Order {
        pass,
        needs: made_by,
    })
}

/// Replays the forward nodes marked `recompute: true` in the backward pass
/// (`passes::recompute`); a graph without marks is left as it is.
fn run_recompute(s: &mut CompileState, _: &CompileOptions) -> Result<(), CompileError> {
    if shardc_passes::recompute::any_marked(&s.graph) {
        s.graph = shardc_passes::recompute::recompute(&s.graph)
            .map_err(|e| CompileError::Recompute(Box::new(e)))?;
    }
    Ok(())
}

fn run_infer_types(s: &mut CompileState, _: &CompileOptions) -> Result<(), CompileError> {
    let g = &mut s.graph;
    for i in 0..g.nodes.len() {
        let node = &g.nodes[i];
        let ty = infer::infer_node(g, node).map_err(|source| CompileError::Infer {
            instance: node.instance.clone(),
            op: node.op,
            index: i + 1,
            error: Box::new(source),
        })?;
        g.nodes[i].ty = ty;
    }
    // The input may come from a file a user wrote: always verified, whatever the flag.
    check(g, "infer_types")
}

fn run_autodiff(s: &mut CompileState, opts: &CompileOptions) -> Result<(), CompileError> {
    if let Some(opt) = &opts.optimizer {
        s.graph = training_step_unverified(&s.graph, opt)?;
    }
    Ok(())
}

/// Batch-split BatchNorm as SyncBatchNorm (per-channel AllReduces, no gathering).
fn run_sync_bn(s: &mut CompileState, _: &CompileOptions) -> Result<(), CompileError> {
    s.graph = sync_bn::sync_batch_norm(&s.graph).map_err(|error| CompileError::Parallel {
        stage: "sync_bn",
        error,
    })?;
    Ok(())
}

/// A strategy for every op (the strategy file's, when one is loaded, else the mode's), a
/// layout for every parameter, and the annotated logical graph.
fn run_strategy(s: &mut CompileState, opts: &CompileOptions) -> Result<(), CompileError> {
    let p = &intra_op(parallel_of(opts, "step_parallel_begin")?, opts);
    if let Some(path) = &opts.load_strategy {
        let file = StrategyFile::load(path)?;
        let strategies = file.strategies_for(&s.graph, p.device_num, path)?;
        for (n, st) in s.graph.nodes.iter_mut().zip(strategies) {
            if let Some((in_strategy, out_strategy)) = st {
                n.in_strategy = Some(in_strategy);
                if out_strategy.is_some() {
                    n.out_strategy = out_strategy;
                }
            }
        }
    }
    let assignment = strategy::assign(&s.graph, p).map_err(|error| CompileError::Parallel {
        stage: "step_parallel_begin",
        error,
    })?;
    let begin = annotated(&s.graph, &assignment);
    if let Some(path) = &opts.save_strategy {
        let (mode, searcher) = opts
            .mode_names
            .clone()
            .unwrap_or_else(|| ("semi_auto_parallel".into(), "sharding_propagation".into()));
        StrategyFile::of(&begin, &assignment, p, &mode, &searcher).save(path)?;
    }
    s.begin = Some(begin);
    s.assignment = Some(assignment);
    Ok(())
}

/// The program every rank runs, once: rank 0's graph and what differs per rank.
fn run_partition(s: &mut CompileState, opts: &CompileOptions) -> Result<(), CompileError> {
    let a = needs(&s.assignment, "step_parallel_end", "step_parallel_begin")?;
    let intra = intra_op(parallel_of(opts, "step_parallel_end")?, opts);
    let program =
        partition::program(&s.graph, a, &intra).map_err(|error| CompileError::Parallel {
            stage: "step_parallel_end",
            error,
        })?;
    s.unfused = Some(program);
    Ok(())
}

/// The options the intra-op passes plan with: one pipeline stage's mesh, `device_num /
/// stages` devices (the device matrix is stages × this mesh).
fn intra_op(p: &ParallelOptions, opts: &CompileOptions) -> ParallelOptions {
    let mut intra = p.clone();
    intra.device_num = p.device_num / opts.pipeline.stages.max(1);
    intra
}

/// Pipeline stages (`pipeline_stage` on every forward node) and micro-batches
/// (`passes::pipeline::{stages, micro_batch}`).
fn run_micro_batch(s: &mut CompileState, opts: &CompileOptions) -> Result<(), CompileError> {
    let pl = &opts.pipeline;
    pl.validate(opts.parallel.as_ref().map(|p| p.device_num))?;
    if pl.stages > 1 {
        pipe::stages::assign_stages(&mut s.graph, pl.stages)?;
    }
    let splits = batch_splits(&s.graph, opts);
    s.graph = pipe::micro_batch::micro_batch(&s.graph, pl.micro_size, &splits)?;
    Ok(())
}

/// Per parameter of `g`: how many contiguous blocks the dataset strategy splits a data
/// input's dimension 0 into over a stage's devices (1 for a weight, on one device, or with
/// `full_batch`).
fn batch_splits(g: &Graph, opts: &CompileOptions) -> Vec<usize> {
    let Some(p) = &opts.parallel else {
        return vec![1; g.params.len()];
    };
    let mesh = (p.device_num / opts.pipeline.stages.max(1)).max(1);
    let mut k = 0;
    g.params
        .iter()
        .map(|prm| {
            if !matches!(prm.kind, shardc_ir::ParamKind::Input) {
                return 1;
            }
            let split = match &p.dataset {
                DatasetLayout::DataParallel => mesh,
                DatasetLayout::FullBatch => 1,
                DatasetLayout::Explicit(s) => {
                    s.0.get(k)
                        .and_then(|row| row.first())
                        .map_or(1, |&x| x.max(1) as usize)
                }
            };
            k += 1;
            split
        })
        .collect()
}

/// The micro-batches' gradient accumulation reduced once, and with stages the program lifted
/// to every device and split into its stages, each stage's nodes in the scheduler's order
/// (`passes::pipeline::split`).
fn run_pipeline_split(s: &mut CompileState, opts: &CompileOptions) -> Result<(), CompileError> {
    let unfused = s.unfused.take().ok_or(CompileError::Order {
        pass: "pipeline_split",
        needs: "step_parallel_end",
    })?;
    let accumulate_shards = opts
        .parallel
        .as_ref()
        .and_then(|p| p.parallel_optimizer.as_ref())
        .is_some_and(|po| po.gradient_accumulation_shard);
    s.unfused = Some(pipe::split::pipeline_split(
        unfused,
        &opts.pipeline,
        accumulate_shards,
    )?);
    Ok(())
}

/// Gradient AllReduces moved to just after their gradients and bucketed (`comm_fusion`).
/// The unfused program is taken (its dumps are written): the fused one replaces it.
fn run_grad_fusion(s: &mut CompileState, opts: &CompileOptions) -> Result<(), CompileError> {
    let unfused = s.unfused.take().ok_or(CompileError::Order {
        pass: "grad_fusion",
        needs: "step_parallel_end",
    })?;
    let mode = opts.grad_fusion.clone().unwrap_or(GradFusion::Each);
    let (program, _) = grad_fusion::fuse_program(unfused, &mode)?;
    s.program = Some(program);
    Ok(())
}

/// Each asked rank's graph, materialized from the program (nothing to do on one device).
fn run_materialize(s: &mut CompileState, opts: &CompileOptions) -> Result<(), CompileError> {
    let Some(p) = opts.parallel.as_ref().filter(|p| p.device_num > 1) else {
        return Ok(());
    };
    let program = needs(&s.program, "execute", "grad_fusion")?;
    let rank_ids: Vec<usize> = match &opts.materialize {
        Materialize::All => (0..p.device_num).collect(),
        Materialize::Ranks(r) => r.clone(),
    };
    // The ranks are independent.
    s.ranks = rank_ids
        .par_iter()
        .map(|&r| Ok((r, materialize(program, r)?)))
        .collect::<Result<_, CompileError>>()?;
    Ok(())
}

/// Rank `r`'s graph of `program`.
fn materialize(program: &SpmdProgram, r: usize) -> Result<Graph, CompileError> {
    program.materialize(r).map_err(|e| CompileError::Parallel {
        stage: "execute",
        error: ParallelError::Partition {
            rank: r,
            instance: String::new(),
            reason: e.reason,
        },
    })
}

/// Verifies `g`, naming `stage` on failure.
fn check(g: &Graph, stage: &'static str) -> Result<(), CompileError> {
    verify::verify(g).map_err(|error| CompileError::Verify {
        stage,
        graph: g.name.clone(),
        error: Box::new(error),
    })
}

/// Verifies what pass `pass` produced: the logical graph, or the program's template and every
/// materialized rank.
fn check_pass(s: &CompileState, pass: &Pass) -> Result<(), CompileError> {
    match pass.name {
        // Always verified by the pass itself.
        "infer_types" => Ok(()),
        "step_parallel_begin" => check(needs(&s.begin, pass.name, pass.name)?, pass.name),
        "step_parallel_end" => check(
            &needs(&s.unfused, pass.name, pass.name)?.template,
            pass.name,
        ),
        "grad_fusion" => check_program(needs(&s.program, pass.name, pass.name)?, pass.name),
        "pipeline_split" => check_program(needs(&s.unfused, pass.name, pass.name)?, pass.name),
        "execute" if !s.ranks.is_empty() => s
            .ranks
            .par_iter()
            .try_for_each(|(_, g)| check(g, pass.name)),
        _ => check(&s.graph, pass.name),
    }
}

/// Verifies a program's template, or each of its stages' when it is pipelined.
fn check_program(p: &SpmdProgram, stage: &'static str) -> Result<(), CompileError> {
    if p.stages.is_empty() {
        return check(&p.template, stage);
    }
    p.stages
        .iter()
        .try_for_each(|st| check(&st.template, stage))
}

fn training_step_unverified(forward: &Graph, opt: &Optimizer) -> Result<Graph, CompileError> {
    optim::validate(opt).map_err(|reason| CompileError::InvalidOptimizer {
        optimizer: format!("{opt:?}"),
        reason,
    })?;
    autodiff::training_graph(forward, opt).map_err(|e| CompileError::Autodiff(Box::new(e)))
}

/// The verified training step of a verified forward graph.
pub(crate) fn training_step(forward: &Graph, opt: &Optimizer) -> Result<Graph, CompileError> {
    let g = training_step_unverified(forward, opt)?;
    check(&g, "autodiff")?;
    Ok(g)
}

/// Counter of dumps written by this process (the `NNNN` of dump names).
static DUMP_COUNTER: AtomicUsize = AtomicUsize::new(0);

/// Writes `g` as `dir/NN_name_NNNN.ir`; returns the path.
pub fn write_dump(
    dir: &Path,
    index: usize,
    name: &str,
    g: &Graph,
) -> Result<PathBuf, CompileError> {
    std::fs::create_dir_all(dir).map_err(|source| CompileError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let n = DUMP_COUNTER.fetch_add(1, Ordering::Relaxed);
    let path = dir.join(format!("{index:02}_{name}_{n:04}.ir"));
    std::fs::write(&path, shardc_ir::text::print_graph(g)).map_err(|source| CompileError::Io {
        path: path.clone(),
        source,
    })?;
    Ok(path)
}

/// The ranks a compilation materializes and dumps ([`CompileOptions::materialize`]).
fn asked_ranks(opts: &CompileOptions) -> Vec<usize> {
    match (&opts.materialize, &opts.parallel) {
        (Materialize::Ranks(r), _) => r.clone(),
        (Materialize::All, Some(p)) => (0..p.device_num).collect(),
        (Materialize::All, None) => Vec::new(),
    }
}

/// Writes what `pass` (at `index`) dumps into `dir`. Per-rank dumps go rank by rank, so that
/// their numbers follow the rank order.
fn dump(
    dir: &Path,
    index: usize,
    pass: &Pass,
    s: &CompileState,
    opts: &CompileOptions,
) -> Result<(), CompileError> {
    let name = pass.name;
    let rank_dir = |r: usize| dir.join(format!("rank_{r}"));
    match pass.dump {
        Dump::None => {}
        Dump::Logical => {
            write_dump(dir, index, name, &s.graph)?;
        }
        Dump::PerRankNumbered if !is_parallel(opts) => {
            write_dump(dir, index, name, &s.graph)?;
        }
        Dump::PerRankNumbered => {
            for (r, g) in &s.ranks {
                write_dump(&rank_dir(*r), index, name, g)?;
            }
        }
        Dump::PerRankNamed => {
            for r in asked_ranks(opts) {
                match &s.unfused {
                    Some(program) => {
                        // Before the pipeline split, the program covers one stage's mesh: rank
                        // r's graph there is its intra-op position's.
                        let local = if r >= program.device_num {
                            r % program.device_num.max(1)
                        } else {
                            r
                        };
                        write_named_dump(&rank_dir(r), name, &materialize(program, local)?)?
                    }
                    None => write_named_dump(&rank_dir(r), name, needs(&s.begin, name, name)?)?,
                };
            }
        }
    }
    Ok(())
}

/// Runs the pipeline on `graph` (types may be missing, as in a parsed file).
pub fn compile(graph: Graph, opts: &CompileOptions) -> Result<Compiled, CompileError> {
    let (state, stages) = run_passes(graph, opts, None)?;
    let parallel = match &opts.parallel {
        Some(p) if p.device_num > 1 => {
            let missing = |what: &'static str| CompileError::Order {
                pass: "compile",
                needs: what,
            };
            let (rank_ids, ranks) = state.ranks.into_iter().unzip();
            let assignment = state.assignment.ok_or(missing("step_parallel_begin"))?;
            let param_layouts = assignment
                .param_layouts
                .iter()
                .map(|l| pipe::split::lift_layout(l, opts.pipeline.stages))
                .collect();
            Some(ParallelCompiled {
                param_layouts,
                options: p.clone(),
                assignment,
                begin: state.begin.ok_or(missing("step_parallel_begin"))?,
                program: state.program.ok_or(missing("grad_fusion"))?,
                rank_ids,
                ranks,
            })
        }
        _ => None,
    };
    Ok(Compiled {
        graph: state.graph,
        stages,
        parallel,
    })
}

/// Runs the pipeline up to and including the pass named `last` (the filetests' and the
/// benchmarks' entry: they print or time what that pass made). An unknown name is an error
/// listing the passes.
pub fn compile_until(
    graph: Graph,
    opts: &CompileOptions,
    last: &str,
) -> Result<(CompileState, Vec<PassRecord>), CompileError> {
    let index = pass_index(last).ok_or_else(|| CompileError::UnknownPass {
        name: last.to_string(),
        passes: pass_names().join(", "),
    })?;
    run_passes(graph, opts, Some(index))
}

/// Runs every enabled pass (up to index `last`), verifying after each when
/// [`CompileOptions::verify`] is on, dumping and recording each.
fn run_passes(
    graph: Graph,
    opts: &CompileOptions,
    last: Option<usize>,
) -> Result<(CompileState, Vec<PassRecord>), CompileError> {
    let mut state = CompileState::new(graph);
    let mut stages = Vec::new();
    for (index, pass) in PASSES.iter().enumerate() {
        if last.is_some_and(|l| index > l) {
            break;
        }
        if !(pass.enabled)(opts) {
            continue;
        }
        let start = Instant::now();
        (pass.run)(&mut state, opts)?;
        let seconds = start.elapsed().as_secs_f64();
        if opts.verify {
            check_pass(&state, pass)?;
        }
        if let Some(dir) = &opts.dump_dir {
            dump(dir, index, pass, &state, opts)?;
        }
        stages.push(PassRecord {
            index,
            name: pass.name,
            seconds,
        });
    }
    Ok((state, stages))
}

/// `error`'s message, starting with the stage's name (`stage: ...`) once.
fn named_stage(stage: &str, error: &dyn std::fmt::Display) -> String {
    let message = error.to_string();
    if message.starts_with(&format!("{stage}:")) {
        message
    } else {
        format!("{stage}: {message}")
    }
}

/// The parallel passes' options for a parallel context: `None` for one device (stand_alone,
/// or a single device). The cost model's machine is the `cpu` preset; callers with a device
/// description replace `search.machine`.
pub fn parallel_options(ctx: &ParallelContext) -> Result<Option<ParallelOptions>, CompileError> {
    let mode = match ctx.parallel_mode {
        ParallelMode::StandAlone => return Ok(None),
        _ if ctx.device_num <= 1 => return Ok(None),
        ParallelMode::DataParallel => Mode::DataParallel,
        ParallelMode::SemiAutoParallel => Mode::SemiAutoParallel,
        ParallelMode::AutoParallel => Mode::AutoParallel,
    };
    let dataset = match &ctx.dataset_strategy {
        DatasetStrategy::DataParallel => DatasetLayout::DataParallel,
        DatasetStrategy::FullBatch => DatasetLayout::FullBatch,
        DatasetStrategy::Explicit(s) => DatasetLayout::Explicit(s.clone()),
    };
    Ok(Some(ParallelOptions {
        mode,
        device_num: ctx.device_num,
        dataset,
        gradients_mean: ctx.gradients_mean,
        enable_alltoall: ctx.enable_alltoall,
        search: SearchOptions {
            mode: match ctx.search_mode {
                SearchMode::ShardingPropagation => PassSearchMode::ShardingPropagation,
                SearchMode::RecursiveProgramming => PassSearchMode::RecursiveProgramming,
                SearchMode::DynamicProgramming => PassSearchMode::DynamicProgramming,
                SearchMode::Ilp => PassSearchMode::Ilp,
            },
            machine: Default::default(),
            max_device_memory: ctx.max_device_memory.map(|b| b as f64),
        },
        parallel_optimizer: ctx.enable_parallel_optimizer.then(|| {
            let c = &ctx.parallel_optimizer_config;
            ParallelOptimizer {
                threshold_kb: c.parallel_optimizer_threshold,
                weight_shard_size: usize::try_from(c.optimizer_weight_shard_size).ok(),
                gradient_accumulation_shard: c.gradient_accumulation_shard,
            }
        }),
    }))
}

/// The gradient fusion of a context's `comm_fusion`.
pub fn grad_fusion_of(c: &CommFusion) -> GradFusion {
    match c {
        CommFusion::Auto => GradFusion::Auto,
        CommFusion::Size(mb) => GradFusion::SizeMb(*mb),
        CommFusion::Index(ix) => GradFusion::Index(ix.clone()),
    }
}

/// Writes `g` as `dir/name_NNNN.ir` (MindSpore's un-numbered `step_parallel_*` dumps).
fn write_named_dump(dir: &Path, name: &str, g: &Graph) -> Result<PathBuf, CompileError> {
    std::fs::create_dir_all(dir).map_err(|source| CompileError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let n = DUMP_COUNTER.fetch_add(1, Ordering::Relaxed);
    let path = dir.join(format!("{name}_{n:04}.ir"));
    std::fs::write(&path, shardc_ir::text::print_graph(g)).map_err(|source| CompileError::Io {
        path: path.clone(),
        source,
    })?;
    Ok(path)
}

/// The logical graph with each op's strategy and a comment saying where it came from.
fn annotated(g: &Graph, a: &strategy::Assignment) -> Graph {
    let mut out = g.clone();
    for (node, d) in out.nodes.iter_mut().zip(&a.decisions) {
        if let Some(d) = d {
            node.in_strategy = Some(d.sharding.strategy.clone());
            if d.sharding.out_strategy.is_some() {
                node.out_strategy.clone_from(&d.sharding.out_strategy);
            }
            node.comments.push(format!("strategy from: {}", d.source));
        }
    }
    out
}
