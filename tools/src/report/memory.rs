//! Memory per rank: what each rank's graph holds, from its shapes (the runtime's memory plan
//! of the rank's graph, as `shardc run` allocates it on the CPU).
//!
//! - weights: the trained parameters' blocks on the rank;
//! - optimizer state: the other parameters (moments, step counters, moving statistics);
//! - activations peak: the memory plan's live peak of every intermediate value of the step
//!   (activations kept for the backward pass, gradients, temporaries, communication
//!   buffers);
//! - inputs: the rank's block of the data fed per step.

use anyhow::{Context, Result};
use shardc_ir::artifact::Artifact;
use shardc_ir::Graph;

/// One rank's memory, bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RankMemory {
    /// Trained weights.
    pub weights: usize,
    /// Optimizer state and other untrained parameters.
    pub optimizer_state: usize,
    /// The live peak of the step's intermediate values.
    pub activations_peak: usize,
    /// Data inputs.
    pub inputs: usize,
}

impl RankMemory {
    /// Everything together.
    pub fn total(&self) -> usize {
        self.weights + self.optimizer_state + self.activations_peak + self.inputs
    }

    /// The memory of one rank's graph.
    pub fn of(g: &Graph) -> RankMemory {
        let mut m = RankMemory::default();
        for p in &g.params {
            let b = p.ty.size_bytes();
            if !p.is_weight() {
                m.inputs += b;
            } else if p.requires_grad() {
                m.weights += b;
            } else {
                m.optimizer_state += b;
            }
        }
        m.activations_peak = shardc_runtime::memory::plan(g).live_peak_bytes;
        m
    }
}

/// Ranks with the same memory, consecutive: a bar of the chart.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryGroup {
    /// The first and last rank.
    pub ranks: (usize, usize),
    /// The pipeline stage, when the ranks are one stage's.
    pub stage: Option<usize>,
    /// Their memory.
    pub memory: RankMemory,
}

/// The memory of the ranks of an artifact, grouped. Every rank is materialized and planned
/// when there are at most `all_up_to` ranks; past that, the first and last rank of each
/// stage (or of all ranks, without stages), and a stage whose two agree is reported as one
/// group (ranks of one stage run one program, whose patches change groups and offsets, not
/// shapes), else as those two ranks. Returns the groups and the ranks measured.
pub fn rank_memory(art: &Artifact, all_up_to: usize) -> Result<(Vec<MemoryGroup>, Vec<usize>)> {
    let n = art.device_num();
    let stages = art.program.stage_count().max(1);
    let per_stage = (n / stages).max(1);
    let measured: Vec<usize> = if n <= all_up_to {
        (0..n).collect()
    } else {
        let mut v = Vec::new();
        for s in 0..stages {
            v.push(s * per_stage);
            v.push((s + 1) * per_stage - 1);
        }
        v.dedup();
        v
    };
    let mut mems = Vec::with_capacity(measured.len());
    for &r in &measured {
        let g = art
            .rank_graph(r)
            .with_context(|| format!("rank {r} of the artifact (for its memory)"))?;
        mems.push((r, RankMemory::of(&g)));
    }
    let stage_of = |r: usize| (stages > 1).then(|| art.program.stage_of(r).ok()).flatten();
    Ok((group(&mems, &stage_of), measured))
}

/// Groups consecutive measured ranks of one stage with equal memory: a group runs from its
/// first measured rank to its last.
pub fn group(
    mems: &[(usize, RankMemory)],
    stage_of: &dyn Fn(usize) -> Option<usize>,
) -> Vec<MemoryGroup> {
    let mut out: Vec<MemoryGroup> = Vec::new();
    for &(r, m) in mems {
        let st = stage_of(r);
        match out.last_mut() {
            Some(g) if g.memory == m && g.stage == st => g.ranks.1 = r,
            _ => out.push(MemoryGroup {
                ranks: (r, r),
                stage: st,
                memory: m,
            }),
        }
    }
    out
}
