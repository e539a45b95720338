//! All ranks in one process: each rank's graph runs on its own thread with an in-process
//! communicator, each fed its block of the same global batches.

use crate::training::rank_block;
use anyhow::{anyhow, Context, Result};
use shardc_backend_cpu::CpuBackend;
use shardc_ir::{Graph, ParamKind, TensorLayout};
use shardc_runtime::comm::InProcessWorld;
use shardc_runtime::executor::Executor;
use shardc_runtime::Tensor;
use std::sync::Arc;

/// What every rank returned.
#[derive(Debug)]
pub struct RanksResult {
    /// Per rank, per step: the graph's outputs.
    pub outputs: Vec<Vec<Vec<Tensor>>>,
    /// Per rank: its weights after the last step (name, local block).
    pub weights: Vec<Vec<(String, Tensor)>>,
}

/// One rank's result: its outputs per step and its weights at the end.
type RankRun = (Vec<Vec<Tensor>>, Vec<(String, Tensor)>);

/// Runs `graphs` (rank `r` = `graphs[r]`) for `steps` steps. `global_feeds(step)` gives the
/// whole batch of every data input; rank `r` is fed the block `input_layouts[name].block(r)`
/// of each input its graph reads (a pipeline stage reads only some).
pub fn run_ranks(
    graphs: Vec<Graph>,
    input_layouts: &[(String, TensorLayout)],
    global_feeds: &(dyn Fn(u64) -> Vec<(String, Tensor)> + Sync),
    steps: u64,
    threads_per_rank: usize,
) -> Result<RanksResult> {
    run_ranks_with(
        graphs,
        input_layouts,
        global_feeds,
        steps,
        threads_per_rank,
        None,
    )
}

/// Per-rank hooks of [`run_ranks_with`] (checkpoints).
pub struct RankHooks<'a> {
    /// Called on each rank's executor before any step runs (loading a checkpoint: the run
    /// continues from the executor's step count).
    pub prepare: &'a (dyn Fn(usize, &mut Executor) -> Result<()> + Sync),
    /// Called on each rank after each of its steps (saving a checkpoint).
    pub after_step: &'a (dyn Fn(usize, &Executor) -> Result<()> + Sync),
}

/// [`run_ranks`] with hooks: the steps run are `step_count..steps`, where `step_count` is the
/// executors' step count after `prepare` (0 without hooks); the outputs hold those steps only.
pub fn run_ranks_with(
    graphs: Vec<Graph>,
    input_layouts: &[(String, TensorLayout)],
    global_feeds: &(dyn Fn(u64) -> Vec<(String, Tensor)> + Sync),
    steps: u64,
    threads_per_rank: usize,
    hooks: Option<&RankHooks<'_>>,
) -> Result<RanksResult> {
    let n = graphs.len();
    let comms = InProcessWorld::new(n);
    // Every rank's executor first: a rank that cannot start must not leave the others waiting
    // in their first collective until the communicator's timeout.
    let mut execs = Vec::with_capacity(n);
    let mut rank_inputs = Vec::with_capacity(n);
    for (rank, (g, comm)) in graphs.into_iter().zip(comms).enumerate() {
        rank_inputs.push(inputs_of(&g, input_layouts));
        let backend = Arc::new(CpuBackend::with_threads(threads_per_rank));
        let mut exec = Executor::with_communicator(g, backend, comm)
            .with_context(|| format!("rank {rank}: preparing its graph"))?;
        if let Some(h) = hooks {
            (h.prepare)(rank, &mut exec)?;
        }
        execs.push(exec);
    }
    let results: Vec<Result<RankRun>> = std::thread::scope(|s| {
        let handles: Vec<_> = execs
            .into_iter()
            .zip(&rank_inputs)
            .enumerate()
            .map(|(rank, (mut exec, input_layouts))| {
                s.spawn(move || -> Result<RankRun> {
                    let start = exec.step_count();
                    let mut outs = Vec::with_capacity(steps.saturating_sub(start) as usize);
                    shardc_runtime::train_steps(
                        &mut exec,
                        start..steps,
                        |step| rank_block(global_feeds(step), input_layouts, rank).map(Some),
                        |_, o, exec| {
                            outs.push(o);
                            match hooks {
                                Some(h) => (h.after_step)(rank, exec),
                                None => Ok(()),
                            }
                        },
                    )
                    .with_context(|| format!("rank {rank}"))?;
                    let weights = exec
                        .weights()
                        .map(|(n, t)| (n.to_string(), t.clone()))
                        .collect();
                    Ok((outs, weights))
                })
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(r, h)| {
                h.join()
                    .map_err(|_| anyhow!("rank {r}: its thread panicked"))
                    .and_then(|x| x)
            })
            .collect()
    });
    let mut outputs = Vec::with_capacity(n);
    let mut weights = Vec::with_capacity(n);
    // Report the first failure by rank order; a rank that failed usually makes the others
    // time out, so the first is the cause.
    for r in results {
        let (o, w) = r?;
        outputs.push(o);
        weights.push(w);
    }
    Ok(RanksResult { outputs, weights })
}

/// The layouts of the data inputs `graph` reads, out of `input_layouts`.
pub fn inputs_of(
    graph: &Graph,
    input_layouts: &[(String, TensorLayout)],
) -> Vec<(String, TensorLayout)> {
    input_layouts
        .iter()
        .filter(|(n, _)| {
            graph
                .params
                .iter()
                .any(|p| p.kind == ParamKind::Input && &p.name == n)
        })
        .cloned()
        .collect()
}

impl RanksResult {
    /// Weight `name` as a whole tensor, assembled from the blocks of the ranks that hold it
    /// (`layout.block(r)` on rank `r`; in a pipeline, only its stage's ranks hold a weight).
    /// Every element must be covered.
    pub fn gathered_weight(&self, name: &str, layout: &TensorLayout) -> Result<Tensor> {
        let blocks: Vec<(usize, &Tensor)> = self
            .weights
            .iter()
            .enumerate()
            .filter_map(|(r, w)| w.iter().find(|(n, _)| n == name).map(|(_, t)| (r, t)))
            .collect();
        gather_weight(name, layout, &blocks)
    }

    /// The outputs of the ranks that have outputs (every rank, or a pipeline's last stage):
    /// the first of them, by rank, per step.
    pub fn loss_rank_outputs(&self) -> Option<&Vec<Vec<Tensor>>> {
        self.outputs
            .iter()
            .find(|steps| steps.iter().any(|o| !o.is_empty()))
    }
}

/// Assembles a weight from the blocks `(r, block)` of the ranks that hold it: rank `r`
/// holds `layout.block(r)`; together they must cover the whole weight.
fn gather_weight(name: &str, layout: &TensorLayout, blocks: &[(usize, &Tensor)]) -> Result<Tensor> {
    let (_, first) = blocks
        .first()
        .ok_or_else(|| anyhow!("weight {name}: no rank holds it"))?;
    let mut whole = Tensor::zeros(&shardc_ir::TensorType::new(
        first.dtype(),
        layout.tensor_shape.clone(),
    ));
    let mut covered = vec![false; whole.len()];
    for &(r, b) in blocks {
        let block = layout.block(r);
        mark_covered(&mut covered, &layout.tensor_shape, &block);
        if !whole.set_block(&block, b) {
            return Err(anyhow!(
                "weight {name}: rank {r}'s block of shape {:?} does not fit {layout}",
                b.shape
            ));
        }
    }
    if let Some(at) = covered.iter().position(|c| !c) {
        return Err(anyhow!(
            "weight {name}: no rank holds element {at} of {:?} (layout {layout})",
            layout.tensor_shape
        ));
    }
    Ok(whole)
}

/// Marks the elements of `block` (ranges per dimension of a row-major tensor of `shape`).
fn mark_covered(covered: &mut [bool], shape: &[usize], block: &[std::ops::Range<usize>]) {
    if block.iter().any(|r| r.is_empty()) {
        return;
    }
    let mut idx: Vec<usize> = block.iter().map(|r| r.start).collect();
    loop {
        let flat = idx
            .iter()
            .zip(shape)
            .fold(0usize, |acc, (&i, &d)| acc * d + i);
        if let Some(c) = covered.get_mut(flat) {
            *c = true;
        }
        // The next index, last dimension fastest.
        let mut k = idx.len();
        loop {
            if k == 0 {
                return;
            }
            k -= 1;
            idx[k] += 1;
            if idx[k] < block[k].end {
                break;
            }
            idx[k] = block[k].start;
        }
    }
}

/// Differences of a weight are measured against its largest magnitude, or this when smaller:
/// below it, f32 rounding in the gradient sums (which run in another order on several ranks)
/// dominates, not the partitioning.
pub const WEIGHT_SCALE_FLOOR: f64 = 1e-4;

/// Relative difference of two numbers, against the larger magnitude.
pub fn rel(a: f64, b: f64) -> f64 {
    let d = (a - b).abs();
    if d == 0.0 {
        0.0
    } else {
        d / a.abs().max(b.abs()).max(1e-6)
    }
}

/// Largest elementwise difference, relative to the reference tensor's largest magnitude.
pub fn tensor_rel(a: &Tensor, b: &Tensor) -> f64 {
    let (a, b) = (a.to_f64_vec(), b.to_f64_vec());
    let scale = b
        .iter()
        .fold(0.0f64, |m, x| m.max(x.abs()))
        .max(WEIGHT_SCALE_FLOOR);
    a.iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs() / scale)
        .fold(0.0, f64::max)
}
