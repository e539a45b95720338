//! The parallel compiler: from one logical training graph and a device count to one graph per
//! rank that together compute what the logical graph computes.
//!
//! The stages, each its own module:
//! - [`dims`]: every op as loops (the einsum view) — the table behind every parallel rule;
//! - [`rules`]: strategy → layouts of an op's inputs and results (validity, partial sums);
//! - [`strategy`]: a strategy for every op (annotations, semi-auto defaults, sharding
//!   propagation) and a layout for every parameter; below it, in layers: the searchers
//!   ([`search`]), the exact completion ([`completion`]), the breadth-first propagation
//!   ([`propagation`]), and what they all share: the result ([`assignment`]) and the role of
//!   an op ([`roles`]);
//! - [`redistribute`]: the cheapest collectives between two layouts of a value;
//! - [`partition`]: the per-rank graphs, with sliced shapes, sliced parameter initialisers and
//!   concrete communication groups;
//! - [`sync_bn`]: run first, on graphs for several devices: training-mode BatchNorm and its
//!   gradient become MindSpore's SyncBatchNorm pairs (`BNTrainingReduce` / `BNTrainingUpdate`,
//!   `BNTrainingUpdateGrad` / `BNTrainingReduceGrad`), so a split batch needs per-channel
//!   AllReduces only, never its activations gathered.
//!
//! Semantics (the invariant): the per-rank graphs compute the logical training step. The loss
//! every rank returns is the loss of the whole global batch (as MindSpore's auto-parallel
//! prints the same loss on every rank); a weight replicated over devices that each see part of
//! the batch gets its gradient's partial terms summed over those devices (the "mirror"
//! AllReduce, named `mirror_grad_*`). With `gradients_mean` that sum is exactly the
//! single-device gradient of the mean loss (MindSpore's mean of per-replica gradients); without
//! it, MindSpore sums the replicas' gradients, each of its own local-mean loss, so shardc then
//! multiplies the sum by the group size to give the same numbers.

pub mod assignment;
pub mod completion;
pub mod cost;
mod dataset;
pub mod dims;
pub mod optimizer_shard;
pub mod partition;
pub mod propagation;
pub mod redistribute;
pub mod roles;
pub mod rules;
pub mod search;
pub mod simplify;
pub mod strategy;
pub mod sync_bn;

use shardc_ir::{OpKind, Strategy};
use thiserror::Error;

/// The parallel mode (MindSpore's `parallel_mode`), as the passes need it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Every unannotated forward op splits the batch; no user strategies expected.
    DataParallel,
    /// User strategies; unannotated forward ops split the batch.
    SemiAutoParallel,
    /// User strategies; everything else searched.
    AutoParallel,
}

/// How data inputs are laid out (MindSpore's `dataset_strategy`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DatasetLayout {
    /// Split dimension 0 over all devices.
    DataParallel,
    /// Every device reads the whole batch.
    FullBatch,
    /// One strategy tuple per data input.
    Explicit(Strategy),
}

/// What the parallel passes need to know.
#[derive(Clone, Debug)]
pub struct ParallelOptions {
    /// The mode.
    pub mode: Mode,
    /// The number of devices.
    pub device_num: usize,
    /// The data inputs' layout.
    pub dataset: DatasetLayout,
    /// Divide summed gradients by the group size (MindSpore's `gradients_mean`).
    pub gradients_mean: bool,
    /// Whether redistribution may use AllToAll.
    pub enable_alltoall: bool,
    /// How `auto_parallel` searches, and the cost model's machine.
    pub search: SearchOptions,
    /// MindSpore's parallel optimizer (`enable_parallel_optimizer`): weights and optimizer
    /// state split over their data-parallel group ([`optimizer_shard`]); `None`: off.
    pub parallel_optimizer: Option<ParallelOptimizer>,
}

/// MindSpore's `parallel_optimizer_config` ([`optimizer_shard`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParallelOptimizer {
    /// Weights smaller than this many KB (1024 bytes) stay whole
    /// (`parallel_optimizer_threshold`, MindSpore's default 64).
    pub threshold_kb: u64,
    /// Split each weight over at most this many devices of its data-parallel group, which it
    /// must divide (`optimizer_weight_shard_size`); `None` (MindSpore's -1): the whole group.
    pub weight_shard_size: Option<usize>,
    /// `gradient_accumulation_shard`: with gradient accumulation over micro-batches, keep the
    /// accumulated gradient split as well. Without micro-batches there is no accumulated
    /// gradient and it changes nothing.
    pub gradient_accumulation_shard: bool,
}

impl ParallelOptimizer {
    /// MindSpore's defaults: 64 KB threshold, the whole group, accumulation shard on.
    pub const DEFAULT: ParallelOptimizer = ParallelOptimizer {
        threshold_kb: 64,
        weight_shard_size: None,
        gradient_accumulation_shard: true,
    };

    /// The threshold in bytes.
    pub fn threshold_bytes(&self) -> f64 {
        self.threshold_kb as f64 * 1024.0
    }
}

impl Default for ParallelOptimizer {
    fn default() -> ParallelOptimizer {
        ParallelOptimizer::DEFAULT
    }
}

/// How `auto_parallel` searches strategies (MindSpore's `search_mode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SearchMode {
    /// From the annotated ops outward, each op the least redistribution to its settled
    /// neighbours ([`strategy`]).
    #[default]
    ShardingPropagation,
    /// log2(N) rounds of two-way cuts ([`search::recursive`]).
    RecursiveProgramming,
    /// Exact elimination over the cost graph, with a reported fallback ([`search::dynamic`]).
    DynamicProgramming,
    /// An exact integer program ([`search::ilp`]), the optimality oracle for small graphs.
    Ilp,
}

impl SearchMode {
    /// MindSpore's name of the mode (`ilp` is shardc's own).
    pub fn name(self) -> &'static str {
        match self {
            SearchMode::ShardingPropagation => "sharding_propagation",
            SearchMode::RecursiveProgramming => "recursive_programming",
            SearchMode::DynamicProgramming => "dynamic_programming",
            SearchMode::Ilp => "ilp",
        }
    }
}

/// The search's settings.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SearchOptions {
    /// The searcher.
    pub mode: SearchMode,
    /// The machine the cost model prices.
    pub machine: cost::Machine,
    /// A hard limit on the bytes one device keeps (MindSpore's `max_device_memory`); the
    /// machine's memory when `None`.
    pub max_device_memory: Option<f64>,
}

impl SearchOptions {
    /// The memory limit in force: the smaller of `max_device_memory` and the machine's.
    pub fn memory_limit(&self) -> f64 {
        let m = self.machine.memory_bytes;
        self.max_device_memory.map_or(m, |l| l.min(m))
    }
}

/// An error of the parallel passes, naming the op instance (or value) and the reason.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum ParallelError {
    /// A strategy that the op's rule rejects.
    #[error("invalid strategy {strategy} for {op} '{instance}': {reason}")]
    InvalidStrategy {
        /// The op instance.
        instance: String,
        /// The op.
        op: OpKind,
        /// The strategy, as written.
        strategy: String,
        /// Why it is invalid.
        reason: String,
    },
    /// An op the parallel passes cannot handle here.
    #[error("{op} '{instance}': {reason}")]
    NoRule {
        /// The op instance.
        instance: String,
        /// The op.
        op: OpKind,
        /// Why.
        reason: String,
    },
    /// The dataset strategy does not fit a data input.
    #[error("dataset_strategy for input '{input}': {reason}")]
    Dataset {
        /// The data input.
        input: String,
        /// Why.
        reason: String,
    },
    /// The strategy search found nothing (no strategy fits the memory limit, a solver
    /// failed).
    #[error("strategy search: {0}")]
    Search(String),
    /// The options are unusable.
    #[error("parallel options: {0}")]
    Options(String),
    /// A per-rank graph failed shape inference (a bug in a parallel rule).
    #[error("partition (rank {rank}): node for '{instance}': {reason}")]
    Partition {
        /// The rank.
        rank: usize,
        /// The op instance.
        instance: String,
        /// Why.
        reason: String,
    },
}
