//! Pipeline parallelism (MindSpore's `pipeline_stages`, `PipelineCell(net, micro_size)`,
//! `pipeline_config.pipeline_scheduler`), on the compiler side.
//!
//! - [`stages`]: every forward node gets its stage (`pipeline_stage: k`), from the cells the
//!   user marked or, when none is, by an automatic split balanced by compute cost; the checks
//!   (stages never decrease along an edge, every stage has nodes, no weight shared by two
//!   stages).
//! - [`micro_batch`]: the forward cloned once per micro-batch (`micro_batch: m`), each clone
//!   reading the rows `i ≡ m (mod micro_size)` of every data input, the loss combined so that
//!   the step computes the global batch's loss; autodiff then accumulates the weight gradients
//!   over the micro-batches by itself.
//! - [`split`]: after the partition over one stage's intra-op mesh, the program lifted to
//!   every device (the stage axis major in every device matrix) and split into one program per
//!   stage, `Send` / `Receive` between them, each stage's nodes ordered by the scheduler
//!   (1F1B or GPipe).
//! - [`accumulate`]: the micro-batches' reduced gradient terms summed first and reduced once
//!   (or, with `gradient_accumulation_shard`, reduce-scattered each and their shards summed).
//!
//! The attributes are MindSpore's: `pipeline_stage` and `micro_batch` on nodes, `dest_rank`,
//! `src_rank`, `sr_tag` on `Send` / `Receive`. See `docs/pipeline.md`.

pub mod accumulate;
pub mod micro_batch;
pub mod split;
pub mod stages;

use std::fmt;

/// The node attribute naming a forward node's pipeline stage (MindSpore's
/// `cell.pipeline_stage`).
pub const STAGE_ATTR: &str = "pipeline_stage";
/// The node attribute naming the micro-batch a node computes.
pub const MICRO_ATTR: &str = "micro_batch";

/// MindSpore's `pipeline_config.pipeline_scheduler`: the order each stage runs its
/// micro-batches' forward and backward passes in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Scheduler {
    /// `1f1b`: stage `s` of `S` runs `min(S - s - 1, M)` warm-up forwards, then one forward and
    /// one backward in turn, then the remaining backwards.
    #[default]
    OneFOneB,
    /// `gpipe`: every forward, then every backward.
    GPipe,
}

impl Scheduler {
    /// MindSpore's name: `1f1b` or `gpipe`.
    pub fn name(self) -> &'static str {
        match self {
            Scheduler::OneFOneB => "1f1b",
            Scheduler::GPipe => "gpipe",
        }
    }

    /// Micro-batches whose activations stage `s` of `stages` keeps at once, of
    /// `micro_batches`: `S − s` with 1F1B (at least 1, at most `M`), all `M` with GPipe.
    pub fn in_flight(self, s: usize, stages: usize, micro_batches: usize) -> usize {
        match self {
            Scheduler::OneFOneB => (stages - s.min(stages)).clamp(1, micro_batches.max(1)),
            Scheduler::GPipe => micro_batches.max(1),
        }
    }

    /// The scheduler of a name (`1f1b`, `gpipe`), if it is one.
    pub fn from_name(name: &str) -> Option<Scheduler> {
        match name {
            "1f1b" => Some(Scheduler::OneFOneB),
            "gpipe" => Some(Scheduler::GPipe),
            _ => None,
        }
    }
}

impl fmt::Display for Scheduler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The pipeline's options: the stage count, the micro-batch count, the scheduler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PipelineOptions {
    /// MindSpore's `pipeline_stages` (1: no pipeline).
    pub stages: usize,
    /// The micro-batch count (MindSpore's `PipelineCell(net, micro_size)`; 1: none).
    pub micro_size: usize,
    /// The order of each stage's forward and backward passes.
    pub scheduler: Scheduler,
}

impl Default for PipelineOptions {
    fn default() -> PipelineOptions {
        PipelineOptions {
            stages: 1,
            micro_size: 1,
            scheduler: Scheduler::OneFOneB,
        }
    }
}

impl PipelineOptions {
    /// Whether the step is split into stages.
    pub fn is_pipelined(&self) -> bool {
        self.stages > 1
    }

    /// Checks the options against the device count (`None`: one device): stages and
    /// micro-batches at least 1, several stages only on several devices, the stage count
    /// dividing the device count, and (as MindSpore) at least as many micro-batches as
    /// stages.
    pub fn validate(&self, device_num: Option<usize>) -> Result<(), PipelineError> {
        let err = |reason: String| Err(PipelineError::options(reason));
        if self.stages == 0 {
            return err("pipeline_stages must be at least 1, got 0".into());
        }
        if self.micro_size == 0 {
            return err("micro_size must be at least 1, got 0".into());
        }
        if self.stages == 1 {
            return Ok(());
        }
        let n = device_num.unwrap_or(1);
        if n <= 1 {
            return err(format!(
                "pipeline_stages {} needs a parallel mode on several devices (stand_alone or one device runs no pipeline)",
                self.stages
            ));
        }
        if n % self.stages != 0 {
            return err(format!(
                "pipeline_stages {} does not divide device_num {n}",
                self.stages
            ));
        }
        if self.micro_size < self.stages {
            return err(format!(
                "micro_size {} is smaller than pipeline_stages {} (MindSpore requires micro_size >= pipeline_stages)",
                self.micro_size, self.stages
            ));
        }
        Ok(())
    }
}

/// A pipeline pass rejected the graph or its options: the pass, the op instance (empty when
/// the error is about the options or the graph as a whole) and the reason, naming the values.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct PipelineError {
    /// The pass (`micro_batch`, `pipeline_split`, or `pipeline` for the options).
    pub pass: &'static str,
    /// The op instance or parameter the error is about (may be empty).
    pub instance: String,
    /// What is wrong.
    pub reason: String,
}

impl PipelineError {
    fn options(reason: String) -> PipelineError {
        PipelineError {
            pass: "pipeline",
            instance: String::new(),
            reason,
        }
    }
}

impl fmt::Display for PipelineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.instance.is_empty() {
            write!(f, "{}: {}", self.pass, self.reason)
        } else {
            write!(f, "{}: `{}`: {}", self.pass, self.instance, self.reason)
        }
    }
}

/// A node's name for errors: its instance, or `%N`.
pub(crate) fn node_name(g: &shardc_ir::Graph, i: usize) -> String {
    let n = &g.nodes[i];
    if n.instance.is_empty() {
        format!("{} %{}", n.op, i + 1)
    } else {
        n.instance.clone()
    }
}

/// The integer attribute `key` of a node, if set.
pub(crate) fn int_attr(n: &shardc_ir::Node, key: &str) -> Option<i64> {
    n.attrs.get(key).and_then(|a| a.as_int())
}
