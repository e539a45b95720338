//! The compilation pipeline: the one place that lists the passes, in order.
//!
//! | index | name          | what                                                        |
//! |-------|---------------|-------------------------------------------------------------|
//! | 00    | `infer_types` | fills every node's type by the shape rules, then verifies   |
//! | 01    | `autodiff`    | forward + backward + optimizer update (only with an optimizer) |
//! | 02    | `step_parallel_begin` | training-mode BatchNorm as SyncBatchNorm pairs (`passes::parallel::sync_bn`), then a strategy for every op, a layout for every parameter (`passes::parallel::strategy`) |
//! | 03    | `step_parallel_end`   | the program every rank runs, once (SPMD): rank 0's graph with sliced shapes and inserted communication, and what differs per rank (`passes::parallel::partition::program`) |
//! | 04    | `execute`     | the program after `grad_fusion` (`passes::grad_fusion::fuse_program`: gradient AllReduces moved to just after their gradients and grouped into `fusion: k` buckets by [`CompileOptions::grad_fusion`]); each rank's graph is materialized from it |
//!
//! Stages 02-04 run only with [`CompileOptions::parallel`] set (more than one device). Their
//! dumps are per rank, as MindSpore's, for the ranks [`CompileOptions::materialize`] names:
//! `DIR/rank_R/step_parallel_begin_NNNN.ir` (the logical graph with every op's `in_strategy`
//! and where it came from), `step_parallel_end_NNNN.ir` and `04_execute_NNNN.ir` (rank R's
//! graph, materialized from the program). Without parallelism the final graph is dumped as
//! `04_execute_NNNN.ir` too.
//!
//! The input graph is always verified after its types are inferred (it may come from a file a
//! user wrote). After every later pass the result is verified again in debug builds (and so in
//! tests). Each stage that ran is recorded as a [`PassRecord`]; with
//! [`CompileOptions::dump_dir`] set, each is also written there as `NN_name_NNNN.ir` (`NN` the
//! stage's index in the list above, `NNNN` a zero-padded counter of dumps in this process), in
//! the text form of [`shardc_ir::text::print_graph`]. Writing files is the compiler crate's
//! job: the passes know no file system.

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
use shardc_passes::grad_fusion::{self, GradFusion};
use shardc_passes::parallel::{
    partition, strategy, sync_bn, DatasetLayout, Mode, ParallelError, ParallelOptions,
    SearchMode as PassSearchMode, SearchOptions,
};
use shardc_passes::{infer, verify};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use thiserror::Error;

/// What to compile into.
#[derive(Clone, Debug, Default)]
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
}

/// One stage of the pipeline as it ran.
#[derive(Clone, Debug)]
pub struct PassRecord {
    /// The stage's index in the pass list (the `NN` of its dump).
    pub index: usize,
    /// The stage's name.
    pub name: &'static str,
    /// The graph after the stage.
    pub graph: Graph,
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
    /// A strategy file could not be read, written or applied.
    #[error(transparent)]
    StrategyFile(#[from] StrategyFileError),
    /// Autodiff failed.
    #[error(transparent)]
    Autodiff(Box<dyn std::error::Error + Send + Sync>),
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

/// A pass: its dump name, whether the options enable it, and the transformation.
struct Pass {
    name: &'static str,
    enabled: fn(&CompileOptions) -> bool,
    run: fn(Graph, &CompileOptions) -> Result<Graph, CompileError>,
}

/// THE pass list, in order.
const PASSES: &[Pass] = &[
    Pass {
        name: "infer_types",
        enabled: |_| true,
        run: run_infer_types,
    },
    Pass {
        name: "autodiff",
        enabled: |o| o.optimizer.is_some(),
        run: run_autodiff,
    },
];

/// The names of the pipeline's passes, in order (index = the `NN` of their dumps).
pub fn pass_names() -> Vec<&'static str> {
    PASSES.iter().map(|p| p.name).collect()
}

fn run_infer_types(mut g: Graph, _: &CompileOptions) -> Result<Graph, CompileError> {
    for i in 0..g.nodes.len() {
        let node = &g.nodes[i];
        let ty = infer::infer_node(&g, node).map_err(|source| CompileError::Infer {
            instance: node.instance.clone(),
            op: node.op,
            index: i + 1,
            error: Box::new(source),
        })?;
        g.nodes[i].ty = ty;
    }
    check(&g, "infer_types")?;
    Ok(g)
}

fn run_autodiff(g: Graph, opts: &CompileOptions) -> Result<Graph, CompileError> {
    match &opts.optimizer {
        Some(opt) => training_step_unverified(&g, opt),
        None => Ok(g),
    }
}

/// Verifies `g`, naming `stage` on failure.
fn check(g: &Graph, stage: &'static str) -> Result<(), CompileError> {
    verify::verify(g).map_err(|error| CompileError::Verify {
        stage,
        graph: g.name.clone(),
        error: Box::new(error),
    })
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

/// Runs the pipeline on `graph` (types may be missing, as in a parsed file).
pub fn compile(graph: Graph, opts: &CompileOptions) -> Result<Compiled, CompileError> {
    let mut g = graph;
    let mut stages = Vec::new();
    for (index, pass) in PASSES.iter().enumerate() {
        if !(pass.enabled)(opts) {
            continue;
        }
        g = (pass.run)(g, opts)?;
        if cfg!(debug_assertions) {
            check(&g, pass.name)?;
        }
        if let Some(dir) = &opts.dump_dir {
            write_dump(dir, index, pass.name, &g)?;
        }
        stages.push(PassRecord {
            index,
            name: pass.name,
            graph: g.clone(),
        });
    }
    let parallel = match &opts.parallel {
        Some(p) if p.device_num > 1 => Some(compile_parallel(&g, p, opts)?),
        _ => {
            if let Some(dir) = &opts.dump_dir {
                write_dump(dir, EXECUTE_INDEX, "execute", &g)?;
            }
            None
        }
    };
    Ok(Compiled {
        graph: g,
        stages,
        parallel,
    })
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

/// The `NN` of the execute dump.
const EXECUTE_INDEX: usize = 4;

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

/// Stages 02-04: strategies, per-rank graphs, dumps.
fn compile_parallel(
    g: &Graph,
    p: &ParallelOptions,
    opts: &CompileOptions,
) -> Result<ParallelCompiled, CompileError> {
    let dump_dir = opts.dump_dir.as_deref();
    // Batch-split BatchNorm as SyncBatchNorm (per-channel AllReduces, no gathering).
    let synced = sync_bn::sync_batch_norm(g).map_err(|source| CompileError::Parallel {
        stage: "step_parallel_begin",
        error: source,
    })?;
    let g = &synced;
    let loaded;
    let g = match &opts.load_strategy {
        Some(path) => {
            let file = StrategyFile::load(path)?;
            let strategies = file.strategies_for(g, p.device_num, path)?;
            let mut g2 = g.clone();
            for (n, s) in g2.nodes.iter_mut().zip(strategies) {
                if let Some((in_strategy, out_strategy)) = s {
                    n.in_strategy = Some(in_strategy);
                    if out_strategy.is_some() {
                        n.out_strategy = out_strategy;
                    }
                }
            }
            loaded = g2;
            &loaded
        }
        None => g,
    };
    let assignment = strategy::assign(g, p).map_err(|source| CompileError::Parallel {
        stage: "step_parallel_begin",
        error: source,
    })?;
    let begin = annotated(g, &assignment);
    // Partition once: rank 0's graph and what differs per rank.
    let unfused =
        partition::program(g, &assignment, p).map_err(|source| CompileError::Parallel {
            stage: "step_parallel_end",
            error: source,
        })?;
    if cfg!(debug_assertions) {
        check(&unfused.template, "step_parallel_end")?;
    }
    let mode = opts.grad_fusion.clone().unwrap_or(GradFusion::Each);
    let (program, _) =
        grad_fusion::fuse_program(unfused.clone(), &mode).map_err(|e| CompileError::Parallel {
            stage: "grad_fusion",
            error: ParallelError::Options(e.to_string()),
        })?;
    if cfg!(debug_assertions) {
        check(&program.template, "grad_fusion")?;
    }
    let rank_ids: Vec<usize> = match &opts.materialize {
        Materialize::All => (0..p.device_num).collect(),
        Materialize::Ranks(r) => r.clone(),
    };
    let materialize = |prog: &SpmdProgram, r: usize| -> Result<Graph, CompileError> {
        prog.materialize(r).map_err(|e| CompileError::Parallel {
            stage: "execute",
            error: ParallelError::Partition {
                rank: r,
                instance: String::new(),
                reason: e.reason,
            },
        })
    };
    let ranks: Vec<Graph> = match dump_dir {
        // The ranks are independent; dumps are numbered in rank order, so they go one by one.
        None => rank_ids
            .par_iter()
            .map(|&r| materialize(&program, r))
            .collect::<Result<_, _>>()?,
        Some(dir) => {
            let mut ranks = Vec::with_capacity(rank_ids.len());
            for &r in &rank_ids {
                let fused = materialize(&program, r)?;
                let rd = dir.join(format!("rank_{r}"));
                write_named_dump(&rd, "step_parallel_begin", &begin)?;
                write_named_dump(&rd, "step_parallel_end", &materialize(&unfused, r)?)?;
                write_dump(&rd, EXECUTE_INDEX, "execute", &fused)?;
                ranks.push(fused);
            }
            ranks
        }
    };
    let compiled = ParallelCompiled {
        options: p.clone(),
        assignment,
        begin,
        program,
        rank_ids,
        ranks,
    };
    if let Some(path) = &opts.save_strategy {
        let (mode, searcher) = opts
            .mode_names
            .clone()
            .unwrap_or_else(|| ("semi_auto_parallel".into(), "sharding_propagation".into()));
        StrategyFile::of(&compiled, &mode, &searcher).save(path)?;
    }
    Ok(compiled)
}
