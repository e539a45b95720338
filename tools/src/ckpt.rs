//! Checkpoints on the command line: the flags of `shardc run` (saving every K steps, keeping
//! the newest M, resuming), and `shardc ckpt merge` / `shardc ckpt inspect` / `shardc ckpt
//! export` (to and from MindSpore's `.ckpt`).
//!
//! Layout of a checkpoint directory `DIR` (default `.`, as MindSpore's `./{rank_id}/`):
//!
//! ```text
//! DIR/strategy.json                       the strategy file (compiler::strategy_file), once
//! DIR/{rank}/{prefix}-{epoch}_{step}.safetensors   each rank's weights and optimizer state
//! ```
//!
//! `step` in a file name counts within its epoch, as MindSpore's; the global step is in the
//! file's metadata (see `shardc_runtime::checkpoint`). `--resume-from DIR` loads the newest
//! step for which every rank of the artifact has a complete, valid file; a newer step that is
//! incomplete or invalid (killed writer, corrupt file) is skipped with a warning on stderr
//! naming the file and the reason. A single-device artifact resumes from any valid
//! `.safetensors` file in `DIR/0/`, so a file written by `shardc ckpt merge` dropped there
//! continues a multi-rank run on one device.

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Subcommand};
use shardc_compiler::strategy_file::{OpEntry, ParamLayout, StrategyFile, FORMAT};
use shardc_ir::artifact::Artifact;
use shardc_ir::{Graph, ReduceOp, TensorLayout};
use shardc_runtime::checkpoint::{self, Checkpoint, CheckpointError, ResumePoint};
use shardc_runtime::StepExecutor;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The strategy file's name inside a checkpoint directory.
pub const STRATEGY_FILE: &str = "strategy.json";

/// The checkpoint flags of `shardc run` (MindSpore's `CheckpointConfig` and
/// `load_checkpoint`).
#[derive(Args, Debug, Clone, Default)]
pub struct CheckpointArgs {
    /// Save checkpoints into DIR/{rank}/ (and the strategy file as DIR/strategy.json): every
    /// --save-steps steps and after the last step. Default with --save-steps: `.`.
    #[arg(long, value_name = "DIR")]
    pub checkpoint_dir: Option<PathBuf>,
    /// Save a checkpoint every K steps (MindSpore's `save_checkpoint_steps`); without it, only
    /// after the last step.
    #[arg(long, value_name = "K")]
    pub save_steps: Option<u64>,
    /// Keep at most M checkpoints per rank, deleting the oldest (MindSpore's
    /// `keep_checkpoint_max`); 0 keeps all.
    #[arg(long, default_value_t = 5, value_name = "M")]
    pub keep_checkpoint_max: usize,
    /// File-name prefix of the checkpoints (default `checkpoint_{model}`).
    #[arg(long)]
    pub checkpoint_prefix: Option<String>,
    /// Resume from the newest step for which every rank has a complete, valid checkpoint in
    /// DIR/{rank}/; `--steps` counts the total, so training continues with the next step.
    #[arg(long, value_name = "DIR")]
    pub resume_from: Option<PathBuf>,
}

/// Saves one rank's checkpoints as a run goes.
pub(crate) struct Saver {
    dir: PathBuf,
    prefix: String,
    every: Option<u64>,
    keep: usize,
    per_epoch: u64,
    rank: u32,
    device_num: u32,
}

impl Saver {
    /// The saver the flags ask for (`None`: no saving), for rank `rank` of `device_num`.
    pub(crate) fn new(
        a: &CheckpointArgs,
        model: &str,
        per_epoch: u64,
        rank: usize,
        device_num: usize,
    ) -> Result<Option<Saver>> {
        if a.checkpoint_dir.is_none() && a.save_steps.is_none() {
            return Ok(None);
        }
        if a.save_steps == Some(0) {
            bail!("--save-steps 0: expected a positive number of steps");
        }
        let prefix = a
            .checkpoint_prefix
            .clone()
            .unwrap_or_else(|| format!("checkpoint_{model}"));
        checkpoint::check_prefix(&prefix)?;
        Ok(Some(Saver {
            dir: a
                .checkpoint_dir
                .clone()
                .unwrap_or_else(|| PathBuf::from(".")),
            prefix,
            every: a.save_steps,
            keep: a.keep_checkpoint_max,
            per_epoch: per_epoch.max(1),
            rank: rank as u32,
            device_num: device_num as u32,
        }))
    }

    /// After a step: saves when the executor's completed steps are a multiple of
    /// `--save-steps`, or when `last`.
    pub(crate) fn after_step(&self, exec: &dyn StepExecutor, last: bool) -> Result<()> {
        let step = exec.step_count();
        let due = self.every.is_some_and(|k| step % k == 0);
        if !(due || last) || step == 0 {
            return Ok(());
        }
        let (epoch, in_epoch) = checkpoint::epoch_and_step(step, self.per_epoch);
        let cp = Checkpoint::of_executor(exec, self.rank, self.device_num, step, epoch)?;
        checkpoint::save_rank(&self.dir, &self.prefix, in_epoch, &cp, self.keep)
            .with_context(|| format!("rank {}: saving the checkpoint of step {step}", self.rank))?;
        Ok(())
    }

    /// Writes `DIR/strategy.json` for the artifact (rank 0 only; atomically).
    pub(crate) fn write_strategy(&self, art_dir: &Path, art: &Artifact) -> Result<()> {
        if self.rank != 0 {
            return Ok(());
        }
        let sf = strategy_of(art_dir, art)?;
        std::fs::create_dir_all(&self.dir)
            .with_context(|| format!("creating {}", self.dir.display()))?;
        let mut text = serde_json::to_string_pretty(&sf)?;
        text.push('\n');
        checkpoint::write_atomic(&self.dir.join(STRATEGY_FILE), text.as_bytes())?;
        Ok(())
    }
}

/// The strategy file of an artifact, rebuilt from its manifest: every parameter's layout
/// (`extra["layouts"]`; a single-device artifact's parameters are whole) and every op's
/// strategy (`extra["decisions"]`).
pub fn strategy_of(art_dir: &Path, art: &Artifact) -> Result<StrategyFile> {
    let m = &art.manifest;
    let mut parameters = BTreeMap::new();
    match m.extra.get("layouts") {
        Some(serde_json::Value::Object(ls)) => {
            for (name, v) in ls {
                let l: TensorLayout = serde_json::from_value(v.clone()).with_context(|| {
                    format!("{}: bad layout of parameter {name}", art_dir.display())
                })?;
                parameters.insert(
                    name.clone(),
                    ParamLayout {
                        dev_matrix: l.dev_matrix,
                        tensor_map: l.tensor_map,
                        tensor_shape: l.tensor_shape,
                    },
                );
            }
        }
        _ if art.device_num() == 1 => {
            for p in &art.program.template.params {
                parameters.insert(
                    p.name.clone(),
                    ParamLayout {
                        dev_matrix: vec![1],
                        tensor_map: vec![-1; p.ty.shape.len()],
                        tensor_shape: p.ty.shape.clone(),
                    },
                );
            }
        }
        _ => bail!(
            "{}: the manifest of a {}-rank artifact has no parameter layouts",
            art_dir.display(),
            art.device_num()
        ),
    }
    let mut ops = BTreeMap::new();
    if let Some(serde_json::Value::Object(ds)) = m.extra.get("decisions") {
        for (instance, d) in ds {
            let field = |k: &str| d.get(k).and_then(|v| v.as_str()).unwrap_or("").to_string();
            let strategy = parse_strategy(&field("strategy")).with_context(|| {
                format!(
                    "{}: op {instance}: bad strategy {:?}",
                    art_dir.display(),
                    field("strategy")
                )
            })?;
            let out_strategy = match field("out_strategy") {
                o if o.is_empty() => None,
                o => Some(parse_strategy(&o).with_context(|| {
                    format!(
                        "{}: op {instance}: bad out strategy {o:?}",
                        art_dir.display()
                    )
                })?),
            };
            ops.insert(
                instance.clone(),
                OpEntry {
                    op: field("op"),
                    strategy,
                    out_strategy,
                    source: field("source"),
                },
            );
        }
    }
    Ok(StrategyFile {
        format: FORMAT.into(),
        model: m.model.clone(),
        device_num: m.device_num as usize,
        parallel_mode: m.parallel_mode.clone(),
        searcher: m
            .extra
            .get("searcher")
            .and_then(|v| v.as_str())
            .unwrap_or("not recorded in the artifact")
            .to_string(),
        predicted: None,
        parameters,
        ops,
        pipeline_stages: m
            .extra
            .get("pipeline")
            .and_then(|p| p.get("stages"))
            .and_then(serde_json::Value::as_u64)
            .map(|s| s as usize)
            .filter(|&s| s > 1),
    })
}

/// Parses a strategy as printed: `((2, 4), (4, 1))`.
fn parse_strategy(s: &str) -> Result<Vec<Vec<i64>>> {
    let inner = s
        .trim()
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| anyhow!("expected ((..), ..)"))?;
    let mut out = Vec::new();
    let mut rest = inner.trim();
    while !rest.is_empty() {
        let open = rest
            .strip_prefix('(')
            .ok_or_else(|| anyhow!("expected '(' at {rest:?}"))?;
        let close = open
            .find(')')
            .ok_or_else(|| anyhow!("unclosed '(' at {rest:?}"))?;
        let dims = open[..close]
            .split(',')
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(|t| {
                t.parse::<i64>()
                    .map_err(|_| anyhow!("{t:?} is not a number"))
            })
            .collect::<Result<Vec<_>>>()?;
        out.push(dims);
        rest = open[close + 1..].trim_start();
        rest = rest.strip_prefix(',').unwrap_or(rest).trim_start();
    }
    Ok(out)
}

/// Finds the step to resume from for `graphs` (rank order) in `dir`, printing every skipped
/// file with its reason on stderr (and a note when `steps`, the total, leaves nothing to run);
/// keeps the checkpoints of the ranks `keep` selects.
pub(crate) fn resume_point(
    dir: &Path,
    ranks: &RankWeights<'_>,
    keep: &dyn Fn(usize) -> bool,
    who: &str,
    steps: u64,
) -> Result<ResumePoint> {
    let rp = match ranks {
        RankWeights::Graphs(graphs) => checkpoint::find_resume(dir, graphs, keep)?,
        RankWeights::Program(p) => {
            // Check every rank's weights first: a malformed program is an error here, not
            // in the middle of the search.
            for r in 0..p.device_num {
                p.weights_of(r)?;
            }
            checkpoint::find_resume_with(
                dir,
                p.device_num,
                &|r| {
                    std::borrow::Cow::Owned(p.weights_of(r).unwrap_or_else(|_| p.template.clone()))
                },
                keep,
            )?
        }
    };
    if rp.step >= steps {
        eprintln!(
            "{who}note: the checkpoint is at step {} and --steps is {steps} (the total): no step left to run",
            rp.step
        );
    }
    for w in &rp.warnings {
        eprintln!("{who}warning: {w}");
    }
    eprintln!(
        "{who}resuming from step {} ({})",
        rp.step,
        rp.files
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(rp)
}

/// The ranks a resume point is found for: their graphs, or the program every rank runs
/// (whose ranks' weights are read one at a time).
pub(crate) enum RankWeights<'a> {
    /// The ranks' graphs.
    Graphs(&'a [&'a Graph]),
    /// The program.
    Program(&'a shardc_ir::spmd::SpmdProgram),
}

/// Loads rank `rank`'s checkpoint of a resume point into its executor.
pub(crate) fn apply(
    rp: &mut ResumePoint,
    rank: usize,
    device_num: usize,
    exec: &mut dyn StepExecutor,
) -> Result<()> {
    let cp = rp
        .checkpoints
        .get_mut(rank)
        .and_then(Option::take)
        .ok_or_else(|| anyhow!("rank {rank}: its checkpoint was not kept"))?;
    let path = rp.files[rank].clone();
    cp.apply_to(&path, exec, rank as u32, device_num as u32)?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// `shardc ckpt`

/// Arguments of `shardc ckpt`.
#[derive(Args, Debug)]
pub struct CkptArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: CkptCommand,
}

/// The subcommands of `shardc ckpt`.
#[derive(Subcommand, Debug)]
pub enum CkptCommand {
    /// Merge the ranks' checkpoints of one step into one single-device checkpoint.
    Merge(MergeArgs),
    /// Print a checkpoint's metadata and its tensors' names, dtypes and shapes.
    Inspect(InspectArgs),
    /// Write a whole-model checkpoint (a single device's, or `merge`'s) as MindSpore's
    /// `.ckpt` (`mindspore.load_checkpoint` reads it), or a `.ckpt` as safetensors.
    Export(ExportArgs),
}

/// Arguments of `shardc ckpt export`.
#[derive(Args, Debug)]
pub struct ExportArgs {
    /// The checkpoint: shardc's `.safetensors` of one device or merged, or MindSpore's
    /// `.ckpt`.
    pub file: PathBuf,
    /// Where to write it: `.ckpt` (MindSpore) or `.safetensors`.
    #[arg(short, long)]
    pub output: PathBuf,
}

/// Arguments of `shardc ckpt merge`.
#[derive(Args, Debug)]
pub struct MergeArgs {
    /// The strategy file (`DIR/strategy.json`, written beside the checkpoints).
    #[arg(long)]
    pub strategy: PathBuf,
    /// The checkpoint directory holding `{rank}/` for every rank.
    #[arg(long)]
    pub input: PathBuf,
    /// The step to merge (default: the newest step every rank has a valid file of).
    #[arg(long)]
    pub step: Option<u64>,
    /// The merged checkpoint to write.
    #[arg(short, long)]
    pub output: PathBuf,
}

/// Arguments of `shardc ckpt inspect`.
#[derive(Args, Debug)]
pub struct InspectArgs {
    /// A checkpoint file.
    pub file: PathBuf,
}

/// `shardc ckpt`.
pub fn ckpt(a: &CkptArgs) -> Result<()> {
    match &a.command {
        CkptCommand::Merge(m) => merge(m),
        CkptCommand::Inspect(i) => inspect(i),
        CkptCommand::Export(e) => export(e),
    }
}

/// `shardc ckpt export`: the file's tensors, by name, rewritten in the output's format. A
/// shardc checkpoint of one rank of several is refused (merge it first).
fn export(a: &ExportArgs) -> Result<()> {
    let tensors = match checkpoint::load(&a.file) {
        Ok(cp) if cp.meta.device_num > 1 => bail!(
            "{}: rank {} of a {}-rank checkpoint holds blocks, not the model: `shardc ckpt merge` the ranks first",
            a.file.display(),
            cp.meta.rank,
            cp.meta.device_num
        ),
        Ok(cp) => cp.tensors,
        // Not a shardc checkpoint: MindSpore's .ckpt or any safetensors file.
        Err(_) => shardc_runtime::mindspore_ckpt::read_weights(&a.file)?,
    };
    match a.output.extension().and_then(|e| e.to_str()) {
        Some("ckpt") => shardc_runtime::mindspore_ckpt::write(&a.output, &tensors)?,
        Some("safetensors") => {
            let cp = Checkpoint::whole(&a.file.display().to_string(), tensors.clone());
            checkpoint::save(&a.output, &cp)?;
        }
        _ => bail!(
            "{}: the output must be .ckpt (MindSpore) or .safetensors",
            a.output.display()
        ),
    }
    println!(
        "exported {} tensor(s) of {} -> {}",
        tensors.len(),
        a.file.display(),
        a.output.display()
    );
    Ok(())
}

fn layouts_of(sf: &StrategyFile) -> BTreeMap<String, TensorLayout> {
    sf.parameters
        .iter()
        .map(|(n, p)| {
            (
                n.clone(),
                TensorLayout {
                    dev_matrix: p.dev_matrix.clone(),
                    tensor_map: p.tensor_map.clone(),
                    tensor_shape: p.tensor_shape.clone(),
                    partial: Vec::new(),
                    partial_op: ReduceOp::Sum,
                },
            )
        })
        .collect()
}

/// One rank's checkpoint of `step` in `dir/{rank}/`, if some file there is valid for it.
fn rank_file_of_step(
    dir: &Path,
    rank: usize,
    n: usize,
    model: &str,
    step: u64,
    warnings: &mut Vec<String>,
) -> Result<Option<(PathBuf, Checkpoint)>> {
    let rdir = checkpoint::rank_dir(dir, rank);
    let entries = match std::fs::read_dir(&rdir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(anyhow!("{}: {e}", rdir.display())),
    };
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| !n.starts_with('.') && n.ends_with(".safetensors"))
        })
        .collect();
    paths.sort();
    for p in paths {
        if checkpoint::read_meta(&p).ok().map(|m| m.step) != Some(step) {
            continue;
        }
        let checked = checkpoint::load(&p).and_then(|cp| {
            let m = &cp.meta;
            if m.model != model || m.rank as usize != rank || m.device_num as usize != n {
                return Err(CheckpointError::Mismatch {
                    path: p.clone(),
                    reason: format!(
                        "model {:?} rank {} of {}, expected model {model:?} rank {rank} of {n}",
                        m.model, m.rank, m.device_num
                    ),
                });
            }
            Ok(cp)
        });
        match checked {
            Ok(cp) => return Ok(Some((p, cp))),
            Err(e) => warnings.push(e.to_string()),
        }
    }
    Ok(None)
}

/// The steps any rank has a file of, newest first.
fn steps_in(dir: &Path, n: usize) -> Vec<u64> {
    let mut steps = std::collections::BTreeSet::new();
    for r in 0..n {
        if let Ok(rd) = std::fs::read_dir(checkpoint::rank_dir(dir, r)) {
            for e in rd.flatten() {
                let p = e.path();
                let ok = p
                    .file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| !n.starts_with('.') && n.ends_with(".safetensors"));
                if ok {
                    if let Ok(m) = checkpoint::read_meta(&p) {
                        steps.insert(m.step);
                    }
                }
            }
        }
    }
    steps.into_iter().rev().collect()
}

/// `shardc ckpt merge`.
fn merge(a: &MergeArgs) -> Result<()> {
    let sf = StrategyFile::load(&a.strategy)?;
    let n = sf.device_num;
    if n == 0 {
        bail!("{}: device_num is 0", a.strategy.display());
    }
    if !a.input.is_dir() {
        bail!("{}: no such checkpoint directory", a.input.display());
    }
    let candidates = match a.step {
        Some(s) => vec![s],
        None => steps_in(&a.input, n),
    };
    let mut warnings = Vec::new();
    let mut chosen = None;
    'step: for step in &candidates {
        let mut parts = Vec::with_capacity(n);
        for r in 0..n {
            match rank_file_of_step(&a.input, r, n, &sf.model, *step, &mut warnings)? {
                Some((_, cp)) => parts.push(cp),
                None => {
                    warnings.push(format!(
                        "step {step}: rank {r} has no valid checkpoint of it in {}",
                        checkpoint::rank_dir(&a.input, r).display()
                    ));
                    continue 'step;
                }
            }
        }
        chosen = Some((*step, parts));
        break;
    }
    for w in &warnings {
        if chosen.is_some() {
            eprintln!("warning: {w}");
        }
    }
    let Some((step, parts)) = chosen else {
        bail!(
            "{}: no step has a valid checkpoint from every one of the {n} ranks{}{}",
            a.input.display(),
            a.step
                .map(|s| format!(" (asked for step {s})"))
                .unwrap_or_default(),
            if warnings.is_empty() {
                String::new()
            } else {
                format!(": {}", warnings.join("; "))
            }
        );
    };
    // A pipeline's stages hold their own weights: merge stage by stage.
    let ranks_per_stage = n / sf.pipeline_stages.unwrap_or(1).max(1);
    let merged = checkpoint::merge_stages(&parts, &layouts_of(&sf), ranks_per_stage)?;
    if let Some(dir) = a.output.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    checkpoint::save(&a.output, &merged)?;
    println!(
        "merged step {step} of {n} rank(s) of {} -> {} ({} tensors)",
        sf.model,
        a.output.display(),
        merged.tensors.len()
    );
    Ok(())
}

/// `shardc ckpt inspect`.
fn inspect(a: &InspectArgs) -> Result<()> {
    let cp = checkpoint::load(&a.file)?;
    let m = &cp.meta;
    println!("file: {}", a.file.display());
    println!("format: {}", checkpoint::FORMAT);
    println!("model: {}", m.model);
    println!("rank: {} of {}", m.rank, m.device_num);
    println!("step: {}", m.step);
    println!("epoch: {}", m.epoch);
    println!("identity: {}", m.identity);
    println!("tensors: {}", cp.tensors.len());
    for (n, t) in &cp.tensors {
        println!("  {n}  {}  {:?}", t.dtype().name(), t.shape);
    }
    Ok(())
}
