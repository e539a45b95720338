//! `shardc export MODEL --mlir -o DIR`: the training step as MLIR (crate `shardc-mlir`).
//!
//! It compiles the model exactly as `shardc compile` does (the same flags, the one pass
//! list), then writes `DIR/logical.mlir` (the logical step as `func` + `tensor` / `linalg` /
//! `arith` ops, with the plan as `shard.grid` and `shard.sharding` annotations) and, with
//! several devices, `DIR/rank_R.mlir` for the ranks `--ranks` names (each rank's graph with
//! `shard` collectives). Every file is checked by MLIR's own verifier before it is written.
//! MLIR is linked only with the cargo feature `mlir`; without it the command says how to
//! build it.

use crate::commands::{build_step, LossArgs, OptimizerArgs, StepInputs};
use crate::parallel_args::ParallelArgs;
use anyhow::Result;
use clap::Args;
use std::path::PathBuf;

/// Arguments of `shardc export`.
#[derive(Args, Debug)]
pub struct ExportArgs {
    /// The model: a text IR file (the grammar of the dumps).
    pub model: PathBuf,
    /// Write MLIR (the one format `export` writes today; the flag names it, as a user of
    /// `torch.export` / `mlir-translate` expects).
    #[arg(long, required = true)]
    pub mlir: bool,
    /// Output directory: `logical.mlir` and `rank_R.mlir`.
    #[arg(short, long)]
    pub output: PathBuf,
    /// The ranks to write: `0-7`, `0,3,5`, or `all`. Default: `--global-rank`, else 0.
    #[arg(long, value_name = "RANKS")]
    pub ranks: Option<String>,
    /// The optimizer.
    #[command(flatten)]
    pub optimizer: OptimizerArgs,
    /// The parallel context (MindSpore's `set_auto_parallel_context`).
    #[command(flatten)]
    pub parallel: ParallelArgs,
    /// The loss of a forward network.
    #[command(flatten)]
    pub loss: LossArgs,
}

/// How to get a `shardc` that exports MLIR.
pub const ENABLE_MLIR: &str = "this shardc was built without MLIR: `shardc export --mlir` \
    needs the cargo feature `mlir` (LLVM/MLIR 22): run `bash scripts/install-mlir.sh`, then \
    `cargo build --release --features mlir`";

/// `shardc export`.
pub fn export(a: &ExportArgs) -> Result<()> {
    let step = build_step(&StepInputs {
        model: &a.model,
        optimizer: &a.optimizer,
        parallel: &a.parallel,
        loss: &a.loss,
        ranks: a.ranks.as_deref(),
        dump_dir: None,
        verify: false,
    })?;
    write_mlir(a, step)
}

#[cfg(not(feature = "mlir"))]
fn write_mlir(_a: &ExportArgs, _step: crate::commands::BuiltStep) -> Result<()> {
    anyhow::bail!("{ENABLE_MLIR}")
}

#[cfg(feature = "mlir")]
fn write_mlir(a: &ExportArgs, step: crate::commands::BuiltStep) -> Result<()> {
    use anyhow::Context;
    use shardc_mlir::export::{logical_module, plan_grid, rank_module};
    std::fs::create_dir_all(&a.output)
        .with_context(|| format!("creating {}", a.output.display()))?;
    let checked = |name: String, text: String| -> Result<()> {
        shardc_mlir::mlir::verify(&text)
            .with_context(|| format!("{name}: MLIR's verifier rejected the export"))?;
        let path = a.output.join(&name);
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {} (verified by MLIR)", path.display());
        Ok(())
    };
    match &step.compiled.parallel {
        None => checked(
            "logical.mlir".into(),
            logical_module(&step.compiled.graph, None)?,
        ),
        Some(p) => {
            checked(
                "logical.mlir".into(),
                logical_module(&p.begin, Some(&p.assignment))?,
            )?;
            let grid = plan_grid(&p.begin, &p.assignment)?;
            for (rank, g) in p.rank_ids.iter().zip(&p.ranks) {
                checked(format!("rank_{rank}.mlir"), rank_module(g, *rank, &grid)?)?;
            }
            Ok(())
        }
    }
}
