//! The stage planner: pipeline stages, micro-batches, optimizer sharding (ZeRO-1) and
//! recompute chosen together over the intra-op plans of the folded layers, as Alpa plans
//! inter-op over intra-op (Zheng et al., OSDI 2022, its stage construction by dynamic
//! programming), and a Megatron-LM 3D enumerator priced by the same model.
//!
//! # The cost model
//!
//! `N` devices, a model of `L` layers, a global batch of `B` samples. A plan has `S` stages,
//! each on `d = N / S` consecutive devices (stage `s` on ranks `s·d ..`, so a stage of a host
//! or more starts on a host boundary), a contiguous layer range per stage, `M` micro-batches
//! of `B / M` samples (each stage's intra-op plan splits them further: `b = B / (dp · M)` per
//! replica), ZeRO-1 on or off for the whole model, recompute on or off per stage, and per
//! stage one intra-op plan of the layers ([`IntraPlan`]: a searcher's, or Megatron-LM's
//! tensor parallelism, priced per layer kind by [`super::layer_profile`]).
//!
//! - **Stage time of one micro-batch** `t_s`: the forward and backward of its layers
//!   ([`LayerCost::forward`] + [`LayerCost::backward`], compute and the layers' own
//!   redistributions), one more forward per layer with recompute, and the point-to-point
//!   transfers it sends: the boundary activation to the next stage (forward) and the
//!   gradient of its input to the previous one (backward), each `overhead + α + bytes / β`
//!   of one device's block on the link between the two stages' devices (the inter-host link
//!   where they are on different hosts). Transfers are not overlapped with compute.
//! - **Step**: `(M + S − 1) · max_s t_s + max_s (sync_s + update_s)`, the same for 1F1B and
//!   GPipe (the same bubble: `S − 1` slots of the slowest stage); `sync_s` is the stage's
//!   gradient synchronisation (not hidden: it follows the last micro-batch's backward),
//!   fused into 64 MB buckets as `grad_fusion` emits it (every gradient's bytes at its
//!   collective's bandwidth, and per bucket the fixed part — overhead and latency steps — of
//!   the stage's costliest gradient collective); with ZeRO-1 a ReduceScatter of the
//!   gradients and an AllGather of the updated weights per bucket (the bytes of one
//!   AllReduce on a ring, and one more fixed overhead);
//!   `update_s` the optimizer update (over `1 / replicas` of each weight with ZeRO-1).
//! - **Bubble**: `(S − 1) · max_s t_s / step`, i.e. `(S − 1) / (M + S − 1)` of the pipelined
//!   part.
//! - **Memory of stage `s`** (0-based): its layers' weights, gradients and optimizer state
//!   (the state over a weight's replicas with ZeRO-1), plus the activations of the
//!   micro-batches in flight — `min(S − s, M)` with 1F1B, `M` with GPipe — each the layers'
//!   activations the backward reads, or with recompute only each layer's input, plus then one
//!   layer's activations (the one being recomputed). It must stay within the memory limit; a
//!   plan that does not fit is never chosen, and when none fits the error names the least
//!   memory any plan needs ([`PlanError::NothingFits`]).
//!
//! # The search
//!
//! For every stage count `S` dividing `N` (at most `L`), micro-batch count `M` dividing `B`
//! and ZeRO on/off, [`stage_dp`] chooses the layer split, each stage's intra-op plan and
//! recompute by dynamic programming over (stages placed, layers placed), keeping per state
//! the Pareto front of (slowest stage so far, slowest synchronisation so far): exact for the
//! step above ([`brute_force`] enumerates every split and agrees). The intra-op plans are
//! profiled once per (`d`, micro-batch) on the folded layers, in parallel.
//!
//! The Megatron-LM 3D enumerator ([`megatron_3d`]) takes tensor parallel `tp ∈ {1, 2, 4, 8}`
//! within a host (the layers annotated with Megatron's column / row split of attention and
//! the MLP, every other op completed around them as `sharding_propagation` completes
//! annotations, on the same `tp × dp` devices), pipeline
//! `pp` dividing `L` with layers split evenly, data parallel for the rest, ZeRO-1 on/off,
//! recompute on/off for every stage, and `M` such that `b` is whole; the same model prices
//! it. Every 3D plan is in the auto planner's space (its stage count divides `N` and is at
//! most `L`, its `M` divides `B`, its intra-op plan is one of the auto planner's candidates),
//! so the auto plan is never predicted slower.

use super::super::cost::{LinkCost, Machine};
use super::super::{ParallelError, ParallelOptions, SearchMode};
use super::layer_profile::{kind_of, profile, LayerCost, LayerProfile, LayeredModel};
use std::collections::HashMap;
use std::fmt;
use std::ops::Range;

/// The pipeline schedule: the pipeline pass's own ([`crate::pipeline::Scheduler`]), so that
/// a plan's schedule is the one compiled.
pub use crate::pipeline::Scheduler;

/// The links point-to-point transfers between stages take.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PointToPoint {
    /// Between devices of one host.
    pub intra_host: LinkCost,
    /// Between hosts.
    pub inter_host: LinkCost,
    /// Devices per host.
    pub devices_per_host: usize,
    /// Seconds every transfer costs besides its message (launch).
    pub overhead: f64,
}

impl PointToPoint {
    /// The machine's own links (what a device description without a measured
    /// point-to-point link gives).
    pub fn of_machine(m: &Machine) -> PointToPoint {
        PointToPoint {
            intra_host: m.intra_host,
            inter_host: m.inter_host,
            devices_per_host: m.devices_per_host,
            overhead: m.collective_overhead,
        }
    }

    /// Seconds to send `bytes` over the boundary before rank `first_rank` (the first device
    /// of the receiving stage, for a forward send), stages of `d` devices.
    pub fn seconds(&self, bytes: f64, first_rank: usize, d: usize) -> f64 {
        if bytes <= 0.0 {
            return 0.0;
        }
        let h = self.devices_per_host.max(1);
        let link = if d >= h || first_rank % h == 0 {
            &self.inter_host
        } else {
            &self.intra_host
        };
        self.overhead + link.latency + bytes / link.bandwidth
    }
}

/// One intra-op plan of the layers on a stage's devices, priced per layer kind.
#[derive(Clone, Debug, PartialEq)]
pub struct IntraPlan {
    /// What it is (`searched (dynamic_programming)`, `megatron tp=4`).
    pub name: String,
    /// Megatron-LM's tensor-parallel degree, when it is Megatron's plan.
    pub megatron_tp: Option<usize>,
    /// Its cost per layer kind.
    pub profile: LayerProfile,
}

impl IntraPlan {
    /// The cost of layer `i` of `layers`.
    pub fn layer(&self, i: usize, layers: usize) -> &LayerCost {
        let k = kind_of(i, layers).min(self.profile.kinds.len().saturating_sub(1));
        &self.profile.kinds[k]
    }
}

/// What stays fixed while [`stage_dp`] chooses the split: the shape of the pipeline.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PipelineShape {
    /// Devices in all.
    pub devices: usize,
    /// Layers of the model.
    pub layers: usize,
    /// Samples per step.
    pub global_batch: usize,
    /// Stages `S` (each on `devices / S` devices).
    pub stages: usize,
    /// Micro-batches `M`.
    pub micro_batches: usize,
    /// ZeRO-1 for every stage.
    pub zero: bool,
    /// The schedule.
    pub scheduler: Scheduler,
    /// Bytes one device may keep.
    pub memory_limit: f64,
    /// Fixed overhead of one collective, seconds (ZeRO's second collective pays it).
    pub collective_overhead: f64,
    /// The point-to-point links.
    pub p2p: PointToPoint,
}

impl PipelineShape {
    /// Devices per stage.
    pub fn stage_devices(&self) -> usize {
        self.devices / self.stages.max(1)
    }

    /// Samples per micro-batch (all replicas of a stage together).
    pub fn micro_batch(&self) -> usize {
        self.global_batch / self.micro_batches.max(1)
    }
}

/// One stage's choice: its layers, its intra-op plan (an index into the plans), recompute.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StageSpec {
    /// Its layers.
    pub layers: Range<usize>,
    /// Index of its intra-op plan.
    pub plan: usize,
    /// Whether its layers are recomputed.
    pub recompute: bool,
}

/// A stage's figures under a [`PipelineShape`].
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StageFigures {
    /// Seconds per micro-batch: forward, backward, recompute, point-to-point sends.
    pub seconds: f64,
    /// Of which point-to-point.
    pub p2p: f64,
    /// Gradient synchronisation and optimizer update, seconds per step.
    pub sync: f64,
    /// Bytes per device.
    pub memory: f64,
    /// Micro-batches in flight.
    pub in_flight: usize,
}

/// The bytes of one gradient bucket (`grad_fusion`'s `auto` size, 64 MB).
pub const GRADIENT_BUCKET_BYTES: f64 = 64.0 * 1024.0 * 1024.0;

/// The figures of stage `s` holding `spec` under `shape` with `plans`.
pub fn stage_figures(
    shape: &PipelineShape,
    plans: &[IntraPlan],
    s: usize,
    spec: &StageSpec,
) -> StageFigures {
    let plan = &plans[spec.plan];
    let l = shape.layers;
    let d = shape.stage_devices();
    let in_flight = shape
        .scheduler
        .in_flight(s, shape.stages, shape.micro_batches);
    let mut f = StageFigures {
        in_flight,
        ..Default::default()
    };
    let (mut fixed, mut act, mut largest) = (0.0, 0.0, 0.0f64);
    let (mut grads, mut per_bucket) = (0.0, 0.0f64);
    for i in spec.layers.clone() {
        let c = plan.layer(i, l);
        f.seconds += c.seconds() + if spec.recompute { c.forward } else { 0.0 };
        f.sync += c.grad_sync_bandwidth
            + if shape.zero {
                c.optimizer_zero
            } else {
                c.optimizer
            };
        if c.grad_collectives > 0.0 {
            grads += c.grad_bytes;
            per_bucket = per_bucket.max(c.grad_sync_latency);
        }
        fixed += c.weight_bytes
            + c.grad_bytes
            + if shape.zero {
                c.state_bytes_zero
            } else {
                c.state_bytes
            };
        act += if spec.recompute {
            c.input_bytes
        } else {
            c.activation_bytes
        };
        largest = largest.max(c.activation_bytes);
    }
    // The gradients fused into buckets (grad_fusion's `auto` size): each bucket pays one
    // collective's fixed part; with ZeRO-1 a ReduceScatter and an AllGather per bucket, one
    // more fixed overhead.
    if per_bucket > 0.0 {
        let buckets = (grads / GRADIENT_BUCKET_BYTES).ceil().max(1.0);
        let extra = if shape.zero {
            shape.collective_overhead
        } else {
            0.0
        };
        f.sync += buckets * (per_bucket + extra);
    }
    f.memory = fixed + in_flight as f64 * act + if spec.recompute { largest } else { 0.0 };
    if spec.layers.end < l {
        let out = plan.layer(spec.layers.end - 1, l).output_bytes;
        f.p2p += shape.p2p.seconds(out, (s + 1) * d, d);
    }
    if spec.layers.start > 0 {
        let input = plan.layer(spec.layers.start, l).input_bytes;
        f.p2p += shape.p2p.seconds(input, s * d, d);
    }
    f.seconds += f.p2p;
    f
}

/// One stage of a chosen plan.
#[derive(Clone, Debug, PartialEq)]
pub struct StagePlan {
    /// Its layers.
    pub layers: Range<usize>,
    /// Its intra-op plan's name.
    pub plan: String,
    /// Megatron-LM's tensor-parallel degree, when its plan is Megatron's (the compiler then
    /// annotates the stage's layers with it).
    pub megatron_tp: Option<usize>,
    /// Tensor-parallel × data-parallel degrees of its plan.
    pub mesh: (usize, usize),
    /// Recompute.
    pub recompute: bool,
    /// Its figures.
    pub figures: StageFigures,
}

/// A chosen pipeline plan with its predicted step.
#[derive(Clone, Debug, PartialEq)]
pub struct PipelinePlan {
    /// The shape it was chosen under.
    pub shape: PipelineShape,
    /// The stages, in order.
    pub stages: Vec<StagePlan>,
    /// The predicted step, seconds.
    pub step: f64,
    /// The predicted bubble: the share of the step the slowest stage's idle slots take.
    pub bubble: f64,
    /// The slowest stage's time per micro-batch.
    pub slowest: f64,
    /// The slowest synchronisation + update.
    pub sync: f64,
}

impl PipelinePlan {
    /// The layer counts per stage, `8+8+8`.
    pub fn split(&self) -> String {
        self.stages
            .iter()
            .map(|s| s.layers.len().to_string())
            .collect::<Vec<_>>()
            .join("+")
    }

    /// The most memory any stage's device keeps.
    pub fn peak_memory(&self) -> f64 {
        self.stages
            .iter()
            .map(|s| s.figures.memory)
            .fold(0.0, f64::max)
    }

    /// One line: stages, split, mesh, micro-batches, ZeRO, recompute, step, bubble.
    pub fn summary(&self) -> String {
        let meshes: Vec<String> = dedup_runs(
            self.stages
                .iter()
                .map(|s| format!("{}x{}", s.mesh.0, s.mesh.1)),
        );
        let rec: Vec<String> = dedup_runs(
            self.stages
                .iter()
                .map(|s| if s.recompute { "on" } else { "off" }.to_string()),
        );
        format!(
            "stages={} split={} mesh(tp x dp)={} M={} micro_batch={} {} zero={} recompute={} \
             step={:.1} ms bubble={:.1}% peak_memory={:.1} GiB",
            self.stages.len(),
            self.split(),
            meshes.join(","),
            self.shape.micro_batches,
            self.shape.micro_batch(),
            self.shape.scheduler.name(),
            if self.shape.zero { "on" } else { "off" },
            rec.join(","),
            self.step * 1e3,
            self.bubble * 100.0,
            self.peak_memory() / GIB,
        )
    }
}

const GIB: f64 = (1u64 << 30) as f64;

/// The items, runs of equal neighbours written once.
fn dedup_runs(items: impl Iterator<Item = String>) -> Vec<String> {
    let mut v: Vec<String> = items.collect();
    v.dedup();
    v
}

impl fmt::Display for PipelinePlan {
    /// The summary, then a line per stage.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}", self.summary())?;
        for (s, st) in self.stages.iter().enumerate() {
            writeln!(
                f,
                "  stage {s}: layers {}..{} plan {} (tp {} x dp {}) recompute={} \
                 t/micro-batch={:.3} ms (p2p {:.3}) sync+update={:.3} ms memory={:.2} GiB \
                 ({} micro-batches in flight)",
                st.layers.start,
                st.layers.end,
                st.plan,
                st.mesh.0,
                st.mesh.1,
                if st.recompute { "on" } else { "off" },
                st.figures.seconds * 1e3,
                st.figures.p2p * 1e3,
                st.figures.sync * 1e3,
                st.figures.memory / GIB,
                st.figures.in_flight,
            )?;
        }
        Ok(())
    }
}

/// The step, bubble and stages of `specs` under `shape`; `None` when a stage exceeds the
/// memory limit.
pub fn evaluate(
    shape: &PipelineShape,
    plans: &[IntraPlan],
    specs: &[StageSpec],
) -> Option<PipelinePlan> {
    let mut stages = Vec::with_capacity(specs.len());
    let (mut slowest, mut sync) = (0.0f64, 0.0f64);
    for (s, spec) in specs.iter().enumerate() {
        let f = stage_figures(shape, plans, s, spec);
        if f.memory > shape.memory_limit {
            return None;
        }
        slowest = slowest.max(f.seconds);
        sync = sync.max(f.sync);
        let p = &plans[spec.plan];
        stages.push(StagePlan {
            layers: spec.layers.clone(),
            plan: p.name.clone(),
            megatron_tp: p.megatron_tp,
            mesh: (p.profile.tp, p.profile.dp),
            recompute: spec.recompute,
            figures: f,
        });
    }
    let pipelined = (shape.micro_batches + shape.stages - 1) as f64 * slowest;
    let step = pipelined + sync;
    Some(PipelinePlan {
        shape: *shape,
        stages,
        step,
        bubble: if step > 0.0 {
            (shape.stages - 1) as f64 * slowest / step
        } else {
            0.0
        },
        slowest,
        sync,
    })
}

/// A state of the dynamic program: the slowest stage and synchronisation so far, and how it
/// was reached.
#[derive(Clone, Debug)]
struct Entry {
    slowest: f64,
    sync: f64,
    /// (layers placed before this stage, index in that state's front); `None` for stage 0.
    prev: Option<(usize, usize)>,
    spec: StageSpec,
}

/// Keeps the Pareto front of (slowest, sync): sorted by slowest, sync strictly falling.
fn prune(front: &mut Vec<Entry>) {
    front.sort_by(|a, b| {
        a.slowest
            .total_cmp(&b.slowest)
            .then(a.sync.total_cmp(&b.sync))
    });
    let mut best = f64::INFINITY;
    front.retain(|e| {
        if e.sync < best {
            best = e.sync;
            true
        } else {
            false
        }
    });
}

/// The fastest split of `shape.layers` into `shape.stages` contiguous stages, each with one of
/// `plans` and recompute on or off, under the memory limit: dynamic programming over (stages
/// placed, layers placed) with the Pareto front of (slowest stage, slowest sync) per state.
/// `None` when no split fits.
pub fn stage_dp(shape: &PipelineShape, plans: &[IntraPlan]) -> Option<PipelinePlan> {
    let (l, st) = (shape.layers, shape.stages);
    if st == 0 || st > l || plans.is_empty() {
        return None;
    }
    // fronts[s][n]: stages 0..=s placed, covering layers 0..n.
    let mut fronts: Vec<Vec<Vec<Entry>>> = vec![vec![Vec::new(); l + 1]; st];
    for s in 0..st {
        let starts: Vec<usize> = if s == 0 { vec![0] } else { (s..l).collect() };
        for start in starts {
            if s > 0 && fronts[s - 1][start].is_empty() {
                continue;
            }
            let left_after = st - 1 - s;
            let max_end = l - left_after;
            for end in start + 1..=max_end {
                if s + 1 == st && end != l {
                    continue;
                }
                for spec in stage_choices(start..end, plans.len()) {
                    let f = stage_figures(shape, plans, s, &spec);
                    if f.memory > shape.memory_limit {
                        continue;
                    }
                    if s == 0 {
                        fronts[0][end].push(Entry {
                            slowest: f.seconds,
                            sync: f.sync,
                            prev: None,
                            spec,
                        });
                    } else {
                        let adds: Vec<Entry> = fronts[s - 1][start]
                            .iter()
                            .enumerate()
                            .map(|(i, e)| Entry {
                                slowest: e.slowest.max(f.seconds),
                                sync: e.sync.max(f.sync),
                                prev: Some((start, i)),
                                spec: spec.clone(),
                            })
                            .collect();
                        fronts[s][end].extend(adds);
                    }
                }
            }
        }
        for front in &mut fronts[s] {
            prune(front);
        }
    }
    let slots = (shape.micro_batches + st - 1) as f64;
    let (best, _) = fronts[st - 1][l]
        .iter()
        .enumerate()
        .map(|(i, e)| (i, slots * e.slowest + e.sync))
        .min_by(|a, b| a.1.total_cmp(&b.1))?;
    let mut specs = Vec::with_capacity(st);
    let (mut s, mut n, mut i) = (st - 1, l, best);
    loop {
        let e = &fronts[s][n][i];
        specs.push(e.spec.clone());
        match e.prev {
            Some((pn, pi)) if s > 0 => {
                s -= 1;
                n = pn;
                i = pi;
            }
            _ => break,
        }
    }
    specs.reverse();
    evaluate(shape, plans, &specs)
}

/// A stage's choices for `layers`: each of `plans` intra-op plans, recompute off and on.
fn stage_choices(layers: Range<usize>, plans: usize) -> impl Iterator<Item = StageSpec> {
    (0..plans).flat_map(move |plan| {
        let layers = layers.clone();
        [false, true].map(move |recompute| StageSpec {
            layers: layers.clone(),
            plan,
            recompute,
        })
    })
}

/// Every split, plan and recompute choice tried (for tests on small problems): the fastest
/// that fits.
pub fn brute_force(shape: &PipelineShape, plans: &[IntraPlan]) -> Option<PipelinePlan> {
    fn go(
        shape: &PipelineShape,
        plans: &[IntraPlan],
        specs: &mut Vec<StageSpec>,
        best: &mut Option<PipelinePlan>,
    ) {
        let (l, st) = (shape.layers, shape.stages);
        let start = specs.last().map_or(0, |s| s.layers.end);
        if specs.len() == st {
            if start == l {
                if let Some(p) = evaluate(shape, plans, specs) {
                    if best.as_ref().is_none_or(|b| p.step < b.step) {
                        *best = Some(p);
                    }
                }
            }
            return;
        }
        for end in start + 1..=l {
            for spec in stage_choices(start..end, plans.len()) {
                specs.push(spec);
                go(shape, plans, specs, best);
                specs.pop();
            }
        }
    }
    let mut best = None;
    go(shape, plans, &mut Vec::new(), &mut best);
    best
}

/// The least memory per device any split of `shape` needs (for the error when none fits).
pub fn least_memory(shape: &PipelineShape, plans: &[IntraPlan]) -> f64 {
    let (l, st) = (shape.layers, shape.stages);
    if st == 0 || st > l {
        return f64::INFINITY;
    }
    // need[s][n]: the least max-memory of stages 0..=s covering layers 0..n.
    let mut need = vec![vec![f64::INFINITY; l + 1]; st];
    for s in 0..st {
        let (done, rest) = need.split_at_mut(s);
        let row = &mut rest[0];
        for start in if s == 0 { 0..1 } else { s..l } {
            let before = if s == 0 { 0.0 } else { done[s - 1][start] };
            if !before.is_finite() {
                continue;
            }
            let last_end = l - (st - 1 - s);
            for (end, slot) in row
                .iter_mut()
                .enumerate()
                .take(last_end + 1)
                .skip(start + 1)
            {
                for spec in stage_choices(start..end, plans.len()) {
                    let m = stage_figures(shape, plans, s, &spec).memory.max(before);
                    if m < *slot {
                        *slot = m;
                    }
                }
            }
        }
    }
    need[st - 1][l]
}

/// What the planner is asked.
#[derive(Clone, Debug)]
pub struct PlanOptions {
    /// Devices in all.
    pub devices: usize,
    /// Samples per step.
    pub global_batch: usize,
    /// Bytes one device may keep (`max_device_memory`, else the device's memory).
    pub memory_limit: f64,
    /// The schedule.
    pub scheduler: Scheduler,
    /// The machine (intra-op pricing).
    pub machine: Machine,
    /// The point-to-point links.
    pub p2p: PointToPoint,
    /// The intra-op searcher the layers are planned with.
    pub search_mode: SearchMode,
    /// Tensor-parallel degrees of the Megatron-LM plans (within a host).
    pub tensor_parallel: Vec<usize>,
    /// The micro-batch counts tried (each must divide the global batch); empty: every
    /// divisor of the global batch.
    pub micro_batches: Vec<usize>,
    /// Most stages tried (`None`: up to the layer count).
    pub max_stages: Option<usize>,
}

impl PlanOptions {
    /// Options for `devices` devices of `machine` and a global batch: 1F1B,
    /// `dynamic_programming`, Megatron's `tp ∈ {1, 2, 4, 8}`, every micro-batch count, the
    /// machine's memory and links.
    pub fn new(machine: Machine, devices: usize, global_batch: usize) -> PlanOptions {
        PlanOptions {
            devices,
            global_batch,
            memory_limit: machine.memory_bytes,
            scheduler: Scheduler::OneFOneB,
            p2p: PointToPoint::of_machine(&machine),
            machine,
            search_mode: SearchMode::DynamicProgramming,
            tensor_parallel: vec![1, 2, 4, 8],
            micro_batches: Vec::new(),
            max_stages: None,
        }
    }
}

/// Why no plan came out.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// No plan fits the memory limit.
    #[error(
        "no pipeline plan fits {limit:.2} GiB per device: the least any plan needs is \
         {need:.2} GiB ({with})",
        limit = limit / GIB,
        need = need / GIB
    )]
    NothingFits {
        /// The limit, bytes.
        limit: f64,
        /// The least any plan tried needs, bytes.
        need: f64,
        /// Which shape needs it.
        with: String,
    },
    /// Nothing could be profiled or planned at all.
    #[error("no pipeline plan: {0}")]
    NoPlan(String),
    /// An error of the parallel passes.
    #[error(transparent)]
    Parallel(#[from] ParallelError),
}

/// The planner's answer.
#[derive(Clone, Debug)]
pub struct PlanReport {
    /// The auto plan.
    pub auto: PipelinePlan,
    /// The best Megatron-LM 3D plan that fits, if any does.
    pub megatron: Option<PipelinePlan>,
    /// Intra-op plans profiled (searches of the folded layers).
    pub profiles: usize,
    /// Pipeline shapes the stage DP ran on.
    pub shapes: usize,
    /// Profiles that could not be made, with why (a stage mesh a model does not divide).
    pub notes: Vec<String>,
    /// Wall time of the whole planning, seconds.
    pub seconds: f64,
}

/// The micro-batch counts both planners try: `opts.micro_batches` that divide the global
/// batch, or every divisor of it.
fn micro_batch_counts(opts: &PlanOptions) -> Vec<usize> {
    let b = opts.global_batch;
    if opts.micro_batches.is_empty() {
        divisors(b)
    } else {
        opts.micro_batches
            .iter()
            .copied()
            .filter(|&m| m >= 1 && b % m == 0)
            .collect()
    }
}

fn divisors(n: usize) -> Vec<usize> {
    (1..=n).filter(|d| n % d == 0).collect()
}

/// Whether the planners try `m` micro-batches on `s` stages of `n / s` devices (global batch
/// `b`): at least as many micro-batches as stages (fewer leaves a stage idle for a whole
/// micro-batch slot), and at least one sample per `max_tp` devices of a stage (what the most
/// tensor-parallel Megatron plan needs: `dp = d / tp` replicas of a whole sample each).
/// Both planners keep to it, so the auto plan's space still contains every 3D plan.
pub fn grid_admits(n: usize, s: usize, m: usize, b: usize, max_tp: usize) -> bool {
    let d = n / s.max(1);
    m >= s && (b / m.max(1)) * max_tp >= d
}

/// The largest of the Megatron-LM tensor-parallel degrees tried (at least 1).
fn largest_tensor_parallel(opts: &PlanOptions) -> usize {
    opts.tensor_parallel
        .iter()
        .copied()
        .max()
        .unwrap_or(1)
        .max(1)
}

/// The intra-op plans at one (stage devices, micro-batch) point.
type Plans = Vec<IntraPlan>;

/// Plans `model` on `opts`: the auto plan (stage DP over every stage count, micro-batch
/// count and ZeRO setting) and the best Megatron-LM 3D plan, both under the same model.
pub fn plan(model: &dyn LayeredModel, opts: &PlanOptions) -> Result<PlanReport, PlanError> {
    use rayon::prelude::*;
    let start = std::time::Instant::now();
    let (n, l, b) = (opts.devices, model.layers(), opts.global_batch);
    if n == 0 || l == 0 || b == 0 {
        return Err(PlanError::NoPlan(format!(
            "devices {n}, layers {l} and global batch {b} must all be at least 1"
        )));
    }
    let max_stages = opts.max_stages.unwrap_or(l).min(l);
    let stage_counts: Vec<usize> = divisors(n)
        .into_iter()
        .filter(|&s| s <= max_stages)
        .collect();
    let ms = micro_batch_counts(opts);
    let h = opts.machine.devices_per_host.max(1);
    let max_tp = largest_tensor_parallel(opts);
    // Every (stage devices, micro-batch) point, and what to profile there.
    let mut points: Vec<(usize, usize)> = Vec::new();
    for &s in &stage_counts {
        for &m in &ms {
            if grid_admits(n, s, m, b, max_tp) {
                points.push((n / s, b / m));
            }
        }
    }
    points.sort_unstable();
    points.dedup();
    let jobs: Vec<(usize, usize, Option<usize>)> = points
        .iter()
        .flat_map(|&(d, mb)| {
            let mut v = vec![(d, mb, None)];
            for &tp in &opts.tensor_parallel {
                if tp <= h && d % tp == 0 && mb % (d / tp) == 0 {
                    v.push((d, mb, Some(tp)));
                }
            }
            v
        })
        .collect();
    let results: Vec<(usize, usize, Result<Option<IntraPlan>, ParallelError>)> = jobs
        .par_iter()
        .map(|&(d, mb, tp)| {
            let popts = ParallelOptions {
                mode: super::super::Mode::AutoParallel,
                device_num: d,
                dataset: super::super::DatasetLayout::DataParallel,
                gradients_mean: true,
                enable_alltoall: false,
                search: super::super::SearchOptions {
                    mode: opts.search_mode,
                    machine: opts.machine,
                    max_device_memory: None,
                },
                // The planner prices ZeRO-1 itself, per candidate.
                parallel_optimizer: None,
            };
            let r = profile(model, &popts, opts.search_mode, mb, tp.map(|t| (t, d / t))).map(|p| {
                p.map(|profile| IntraPlan {
                    name: match tp {
                        Some(t) => format!("megatron tp={t}"),
                        None => format!("searched ({})", opts.search_mode.name()),
                    },
                    megatron_tp: tp,
                    profile,
                })
            });
            (d, mb, r)
        })
        .collect();
    let mut table: HashMap<(usize, usize), Plans> = HashMap::new();
    let mut notes = Vec::new();
    let mut profiles = 0;
    for (d, mb, r) in results {
        match r {
            Ok(Some(p)) => {
                profiles += 1;
                table.entry((d, mb)).or_default().push(p);
            }
            Ok(None) => {}
            Err(e) => notes.push(format!("{d} devices, micro-batch {mb}: {e}")),
        }
    }
    if table.is_empty() {
        return Err(PlanError::NoPlan(
            notes
                .first()
                .cloned()
                .unwrap_or_else(|| "no layer profile".into()),
        ));
    }
    let shape_of = |s: usize, m: usize, zero: bool| PipelineShape {
        devices: n,
        layers: l,
        global_batch: b,
        stages: s,
        micro_batches: m,
        zero,
        scheduler: opts.scheduler,
        memory_limit: opts.memory_limit,
        collective_overhead: opts.machine.collective_overhead,
        p2p: opts.p2p,
    };
    let mut best: Option<PipelinePlan> = None;
    let mut shapes = 0;
    let mut need = (f64::INFINITY, String::new());
    for &s in &stage_counts {
        for &m in &ms {
            let Some(plans) = table.get(&(n / s, b / m)) else {
                continue;
            };
            for zero in [false, true] {
                let shape = shape_of(s, m, zero);
                shapes += 1;
                match stage_dp(&shape, plans) {
                    Some(p) if best.as_ref().is_none_or(|x| p.step < x.step) => {
                        best = Some(p);
                    }
                    Some(_) => {}
                    None if best.is_none() => {
                        let least = least_memory(&shape, plans);
                        if least < need.0 {
                            need = (
                                least,
                                format!(
                                    "{s} stages, {m} micro-batches, zero {}, recompute where it helps",
                                    if zero { "on" } else { "off" }
                                ),
                            );
                        }
                    }
                    None => {}
                }
            }
        }
    }
    let Some(auto) = best else {
        return Err(PlanError::NothingFits {
            limit: opts.memory_limit,
            need: need.0,
            with: need.1,
        });
    };
    let megatron = megatron_3d(model.layers(), opts, &table, &shape_of);
    Ok(PlanReport {
        auto,
        megatron,
        profiles,
        shapes,
        notes,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// The best Megatron-LM 3D plan among the profiled points `table`: tensor parallel from
/// `opts.tensor_parallel`, pipeline `pp` dividing the layers (split evenly), data parallel
/// for the rest, ZeRO-1 and recompute on or off everywhere, `M` among the micro-batch counts
/// with a whole number of samples per replica (the auto planner's counts, [`grid_admits`]).
pub fn megatron_3d(
    layers: usize,
    opts: &PlanOptions,
    table: &HashMap<(usize, usize), Vec<IntraPlan>>,
    shape_of: &dyn Fn(usize, usize, bool) -> PipelineShape,
) -> Option<PipelinePlan> {
    let (n, b) = (opts.devices, opts.global_batch);
    let max_tp = largest_tensor_parallel(opts);
    let counts = micro_batch_counts(opts);
    let mut best: Option<PipelinePlan> = None;
    for &tp in &opts.tensor_parallel {
        for pp in divisors(layers) {
            if n % (tp * pp) != 0 {
                continue;
            }
            let dp = n / (tp * pp);
            let per = layers / pp;
            for &m in &counts {
                if (b / m) % dp != 0 || !grid_admits(n, pp, m, b, max_tp) {
                    continue;
                }
                let Some(plans) = table.get(&(tp * dp, b / m)) else {
                    continue;
                };
                let Some(plan) = plans.iter().position(|p| p.megatron_tp == Some(tp)) else {
                    continue;
                };
                for zero in [false, true] {
                    for recompute in [false, true] {
                        let specs: Vec<StageSpec> = (0..pp)
                            .map(|s| StageSpec {
                                layers: s * per..(s + 1) * per,
                                plan,
                                recompute,
                            })
                            .collect();
                        let shape = shape_of(pp, m, zero);
                        if let Some(p) = evaluate(&shape, plans, &specs) {
                            if best.as_ref().is_none_or(|x| p.step < x.step) {
                                best = Some(p);
                            }
                        }
                    }
                }
            }
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parallel::cost::LinkAlgorithm;

    fn link(bw: f64, lat: f64) -> LinkCost {
        LinkCost {
            bandwidth: bw,
            latency: lat,
            algorithm: LinkAlgorithm::Ring,
        }
    }

    fn shape(layers: usize, stages: usize, m: usize, zero: bool, limit: f64) -> PipelineShape {
        PipelineShape {
            devices: 16,
            layers,
            global_batch: 64,
            stages,
            micro_batches: m,
            zero,
            scheduler: Scheduler::OneFOneB,
            memory_limit: limit,
            collective_overhead: 1e-5,
            p2p: PointToPoint {
                intra_host: link(1e11, 1e-6),
                inter_host: link(1e10, 5e-6),
                devices_per_host: 4,
                overhead: 1e-6,
            },
        }
    }

    /// A deterministic pseudo-random layer cost.
    fn cost(seed: u64) -> LayerCost {
        let mut x = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let mut next = || {
            x ^= x >> 33;
            x = x.wrapping_mul(0xff51afd7ed558ccd);
            x ^= x >> 33;
            (x % 1000) as f64 / 1000.0 + 0.1
        };
        LayerCost {
            forward: next() * 1e-3,
            backward: next() * 2e-3,
            grad_sync: next() * 1e-3,
            grad_collectives: 4.0,
            grad_sync_bandwidth: next() * 1e-3,
            grad_sync_latency: next() * 1e-4,
            optimizer: next() * 1e-4,
            optimizer_zero: next() * 2e-5,
            weight_bytes: next() * 1e8,
            grad_bytes: next() * 1e8,
            state_bytes: next() * 2e8,
            state_bytes_zero: next() * 5e7,
            activation_bytes: next() * 3e8,
            input_bytes: next() * 2e7,
            output_bytes: next() * 2e7,
        }
    }

    fn plans(seed: u64, n: usize) -> Vec<IntraPlan> {
        (0..n)
            .map(|i| IntraPlan {
                name: format!("p{i}"),
                megatron_tp: None,
                profile: LayerProfile {
                    kinds: (0..3).map(|k| cost(seed * 31 + i as u64 * 7 + k)).collect(),
                    tp: 1,
                    dp: 4,
                },
            })
            .collect()
    }

    #[test]
    fn the_stage_dp_finds_the_brute_force_optimum() {
        let mut compared = 0;
        for seed in 0..12u64 {
            for layers in 1..=6 {
                for stages in [1, 2, 4] {
                    if stages > layers {
                        continue;
                    }
                    for (m, zero, limit) in [(1, false, 1e12), (4, true, 2.5e9), (8, false, 1.2e9)]
                    {
                        let sh = shape(layers, stages, m, zero, limit);
                        let ps = plans(seed, 2);
                        let dp = stage_dp(&sh, &ps);
                        let bf = brute_force(&sh, &ps);
                        match (&dp, &bf) {
                            (Some(a), Some(b)) => {
                                assert!(
                                    (a.step - b.step).abs() <= 1e-12 * b.step,
                                    "seed {seed} L={layers} S={stages}: {} vs {}",
                                    a.step,
                                    b.step
                                );
                                assert!(a.peak_memory() <= limit);
                                compared += 1;
                            }
                            (None, None) => {
                                assert!(least_memory(&sh, &ps) > limit);
                            }
                            _ => panic!("seed {seed} L={layers} S={stages}: {dp:?} vs {bf:?}"),
                        }
                    }
                }
            }
        }
        assert!(compared > 100, "{compared}");
    }

    #[test]
    fn a_tight_memory_limit_forces_recompute_or_zero_and_a_hopeless_one_fails() {
        let ps = plans(3, 1);
        let roomy = stage_dp(&shape(4, 2, 8, false, 1e13), &ps).unwrap();
        assert!(roomy.stages.iter().all(|s| !s.recompute));
        // Between the least any split needs and what the roomy plan keeps: a plan still
        // fits, within the limit, and no faster.
        let least = least_memory(&shape(4, 2, 8, false, 1e13), &ps);
        assert!(
            least < roomy.peak_memory(),
            "{least} vs {}",
            roomy.peak_memory()
        );
        let tight = 0.5 * (least + roomy.peak_memory());
        let p = stage_dp(&shape(4, 2, 8, false, tight), &ps).unwrap();
        assert!(p.peak_memory() <= tight);
        assert!(p.step >= roomy.step);
        // At exactly the least memory, the plan found needs exactly that (recompute on the
        // stage that keeps the most micro-batches in flight).
        let p = stage_dp(&shape(4, 2, 8, false, least), &ps).unwrap();
        assert_eq!(p.peak_memory(), least);
        assert!(p.stages[0].recompute, "{p}");
        // Nothing fits 1 byte.
        assert!(stage_dp(&shape(4, 2, 8, true, 1.0), &ps).is_none());
        assert!(least_memory(&shape(4, 2, 8, true, 1.0), &ps) > 1.0);
    }

    #[test]
    fn one_f_one_b_keeps_fewer_micro_batches_than_gpipe_at_the_same_step() {
        let ps = plans(5, 1);
        let mut a = shape(4, 4, 8, false, 1e13);
        let specs: Vec<StageSpec> = (0..4)
            .map(|s| StageSpec {
                layers: s..s + 1,
                plan: 0,
                recompute: false,
            })
            .collect();
        let one = evaluate(&a, &ps, &specs).unwrap();
        a.scheduler = Scheduler::GPipe;
        let gpipe = evaluate(&a, &ps, &specs).unwrap();
        assert_eq!(one.step, gpipe.step);
        assert_eq!(one.stages[0].figures.in_flight, 4);
        assert_eq!(one.stages[3].figures.in_flight, 1);
        assert!(gpipe.stages.iter().all(|s| s.figures.in_flight == 8));
        assert!(gpipe.peak_memory() > one.peak_memory());
        // The bubble: S − 1 slots of the slowest stage.
        let want = 3.0 * one.slowest / one.step;
        assert!((one.bubble - want).abs() < 1e-15);
    }
}
