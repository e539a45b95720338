//! `shardc run` on a device with its own memory (the CUDA backend, [`crate::gpu`]; the
//! Ascend backend, [`crate::ascend`]): what follows once a device's executors are built is
//! the same for every device, and written once here over [`DeviceExecutor`]: resuming from a
//! checkpoint, one device's training loop, in-process ranks in threads, and a cluster rank.
//! A device module only opens its devices and builds its executors.

use crate::run_args::RunArgs;
use crate::training::{
    after_step, distributed_data, print_loss, rank_block, rank_inputs, save_after, TrainData,
};
use anyhow::{anyhow, bail, Context, Result};
use shardc_ir::artifact::Artifact;
use shardc_runtime::{Communicator, StepExecutor, Tensor};
use std::sync::Arc;

/// A device's executor as `shardc run` drives it.
pub trait DeviceExecutor: StepExecutor + Send {
    /// Times every node of the following steps (`--stats`).
    fn set_profiling(&mut self, on: bool);
    /// The run's counts (ops on the device and on the host, bytes moved, times), one block
    /// of text.
    fn stats_summary(&self) -> String;
}

/// `--device-target GPU` / `Ascend` train on synthetic data or `--data` here; `--mnist` runs on
/// the CPU.
pub fn synthetic_only(a: &RunArgs) -> Result<()> {
    if a.mnist.is_some() {
        bail!(
            "--device-target {} trains on synthetic data or --data here (--mnist runs on the CPU)",
            a.device.device_target
        );
    }
    Ok(())
}

/// Loads rank `rank`'s file of the newest complete checkpoint step into `exec` (every rank
/// reads the same directory and picks the same step), or its block of `--init-from`'s
/// weights; returns the step to continue from.
pub fn resume(
    a: &RunArgs,
    art: &Artifact,
    exec: &mut dyn StepExecutor,
    rank: usize,
    size: usize,
) -> Result<u64> {
    let Some(dir) = &a.checkpoint.resume_from else {
        let init = crate::init_from::init_path(a.init_from.as_deref(), &a.artifact, art);
        crate::init_from::init_rank(init.as_deref(), a.name_map.as_deref(), art, exec, rank)?;
        return Ok(0);
    };
    let ranks = crate::ckpt::RankWeights::Program(&art.program);
    let who = if size > 1 {
        format!("rank {rank}: ")
    } else {
        String::new()
    };
    let mut rp = crate::ckpt::resume_point(dir, &ranks, &|r| r == rank, &who, a.steps)?;
    crate::ckpt::apply(&mut rp, rank, size, exec)?;
    Ok(rp.step)
}

/// One device: trains `exec` (rank 0 of a one-rank artifact) for `--steps`, printing each
/// loss, saving checkpoints, and with `--stats` the executor's report.
pub fn train_one<E: DeviceExecutor>(a: &RunArgs, art: &Artifact, mut exec: E) -> Result<()> {
    let graph = exec.graph().clone();
    let data = TrainData::of(a, &graph)?;
    let per_epoch = data.per_epoch(a);
    exec.set_profiling(a.stats);
    let start = resume(a, art, &mut exec, 0, 1)?;
    let saver = crate::ckpt::Saver::new(&a.checkpoint, &art.manifest.model, per_epoch, 0, 1)?;
    if let Some(s) = &saver {
        s.write_strategy(&a.artifact, art)?;
    }
    shardc_runtime::train_steps(
        &mut exec,
        start..a.steps,
        |step| Ok::<_, anyhow::Error>(Some(data.feeds(step))),
        |step, out, exec| after_step(step, &out, exec, per_epoch, saver.as_ref(), a.steps),
    )?;
    if a.stats {
        println!("{}", exec.report());
    }
    Ok(())
}

/// The results of rank threads, by rank (a panicked thread as an error).
pub fn join_ranks<T>(handles: Vec<std::thread::ScopedJoinHandle<'_, Result<T>>>) -> Vec<Result<T>> {
    handles
        .into_iter()
        .map(|h| {
            h.join()
                .unwrap_or_else(|_| Err(anyhow!("a rank thread panicked")))
        })
        .collect()
}

/// Several ranks in this process, a thread each over its executor in `execs` (by rank):
/// as on the CPU, every rank loads its file of the newest complete checkpoint step (before
/// any rank runs, so none saves and prunes first) and saves its own; rank 0's losses are
/// printed.
pub fn train_in_process<E: DeviceExecutor>(
    a: &RunArgs,
    art: &Artifact,
    mut execs: Vec<E>,
) -> Result<()> {
    let (data, inputs) = distributed_data(a, art)?;
    let n = art.device_num();
    let per_epoch = data.per_epoch(a);
    let mut start = 0;
    for (rank, exec) in execs.iter_mut().enumerate() {
        // No profiling here: the ranks' marks would interleave on a shared device.
        start = resume(a, art, exec, rank, n)?;
    }
    let savers: Vec<Option<crate::ckpt::Saver>> = (0..n)
        .map(|r| crate::ckpt::Saver::new(&a.checkpoint, &art.manifest.model, per_epoch, r, n))
        .collect::<Result<_>>()?;
    if let Some(Some(s)) = savers.first() {
        s.write_strategy(&a.artifact, art)?;
    }
    let results: Vec<Result<(Vec<Vec<Tensor>>, String)>> = std::thread::scope(|s| {
        let handles: Vec<_> = execs
            .into_iter()
            .zip(&savers)
            .enumerate()
            .map(|(rank, (mut exec, saver))| {
                let data = &data;
                let inputs = rank_inputs(art, rank, &inputs);
                s.spawn(move || -> Result<(Vec<Vec<Tensor>>, String)> {
                    let inputs = &inputs?;
                    let mut outs = Vec::new();
                    shardc_runtime::train_steps(
                        &mut exec,
                        start..a.steps,
                        |step| rank_block(data.feeds(step), inputs, rank).map(Some),
                        |_, out, exec| {
                            outs.push(out);
                            save_after(exec, saver.as_ref(), a.steps)
                        },
                    )
                    .with_context(|| format!("rank {rank}"))?;
                    Ok((outs, exec.stats_summary()))
                })
            })
            .collect();
        join_ranks(handles)
    });
    // The losses of the first rank that has them: rank 0, or a pipeline's last stage.
    let results: Vec<(Vec<Vec<Tensor>>, String)> = results.into_iter().collect::<Result<_>>()?;
    let ran = results.iter().any(|(steps, _)| !steps.is_empty());
    // (Rank 0 when no step was left to run.)
    let rank = match results
        .iter()
        .position(|(steps, _)| steps.iter().any(|o| !o.is_empty()))
    {
        Some(r) => r,
        None if ran => bail!("no rank returned a loss"),
        None => 0,
    };
    let (outs, summary) = results.get(rank).context("no rank ran")?;
    for (i, o) in outs.iter().enumerate() {
        print_loss(o, start + i as u64, per_epoch)?;
    }
    if a.stats {
        println!("rank {rank}: {summary}");
    }
    Ok(())
}

/// Checks that a cluster of `size` workers runs an artifact compiled for as many ranks.
pub fn check_world(a: &RunArgs, art: &Artifact, size: usize) -> Result<()> {
    if art.device_num() != size {
        bail!(
            "{}: the artifact is compiled for {} rank(s) but the job has {size} workers: compile with --device-num {size}",
            a.artifact.display(),
            art.device_num()
        );
    }
    Ok(())
}

/// One rank of a cluster on its device: `exec` runs the rank's graph; `cluster` is the
/// job's communicator (every rank waits at its barrier after loading a checkpoint, so no
/// rank saves and prunes before all have loaded).
pub fn train_cluster_rank<E: DeviceExecutor>(
    a: &RunArgs,
    art: &Artifact,
    mut exec: E,
    cluster: Arc<dyn Communicator>,
) -> Result<()> {
    let (rank, size) = (cluster.rank(), cluster.size());
    let (data, inputs) = distributed_data(a, art)?;
    let inputs = rank_inputs(art, rank, &inputs)?;
    if let Some(p) = crate::training::PipelineInfo::of(art) {
        println!("{}", p.stage_line(rank));
    }
    let per_epoch = data.per_epoch(a);
    exec.set_profiling(a.stats);
    let start = resume(a, art, &mut exec, rank, size)?;
    if a.checkpoint.resume_from.is_some() {
        let all: Vec<usize> = (0..size).collect();
        cluster.barrier(&all).map_err(|e| {
            anyhow!("rank {rank}: waiting for every rank to load its checkpoint: {e}")
        })?;
    }
    let saver = crate::ckpt::Saver::new(&a.checkpoint, &art.manifest.model, per_epoch, rank, size)?;
    if let Some(s) = &saver {
        s.write_strategy(&a.artifact, art)?;
    }
    shardc_runtime::train_steps(
        &mut exec,
        start..a.steps,
        |step| rank_block(data.feeds(step), &inputs, rank).map(Some),
        |step, out, exec| after_step(step, &out, exec, per_epoch, saver.as_ref(), a.steps),
    )
    .with_context(|| format!("rank {rank}"))?;
    if a.stats {
        println!("{}", exec.stats_summary());
    }
    Ok(())
}
