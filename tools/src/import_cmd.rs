//! `shardc import MODEL.mindir|MODEL.onnx -o MODEL.ir [--weights W.safetensors]`: a model
//! written by MindSpore (`mindspore.export(..., file_format="MINDIR")`) or exported to ONNX,
//! as shardc's text IR (its forward graph) and its weights as a whole-model safetensors file
//! that `shardc predict|run|compile --init-from` reads. `--loss` on `shardc compile` then
//! wraps the forward graph with a loss, as MindSpore's `WithLossCell`.

use anyhow::{Context, Result};
use clap::Args;
use shardc_import::{import_file, weight_count, write_weights};
use shardc_ir::text::print_graph;
use std::path::{Path, PathBuf};

/// Arguments of `shardc import`.
#[derive(Args, Debug, Clone)]
pub struct ImportArgs {
    /// The model file: `.mindir` (MindSpore) or `.onnx`.
    pub model: PathBuf,
    /// Where to write the text IR.
    #[arg(short, long)]
    pub output: PathBuf,
    /// Where to write the weights (safetensors); default: the output's path with the
    /// extension `.safetensors`.
    #[arg(long)]
    pub weights: Option<PathBuf>,
}

/// The weights file beside `output` (`model.ir` -> `model.safetensors`).
pub fn default_weights_path(output: &Path) -> PathBuf {
    output.with_extension("safetensors")
}

/// `shardc import`.
pub fn import(a: &ImportArgs) -> Result<()> {
    let imported = import_file(&a.model)?;
    let weights = a
        .weights
        .clone()
        .unwrap_or_else(|| default_weights_path(&a.output));
    let text = format!(
        "# Imported by `shardc import` from {} ({}, written by {}).\n\
         # The weights' values are in {}: pass it as --init-from.\n\n{}",
        a.model.display(),
        imported.format,
        imported.producer,
        weights.display(),
        print_graph(&imported.graph)
    );
    std::fs::write(&a.output, text).with_context(|| format!("writing {}", a.output.display()))?;
    let model = a
        .output
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("model")
        .to_string();
    write_weights(&weights, &model, &imported)?;
    println!(
        "imported {} ({}): {} nodes, {} inputs, {} weights, {} outputs -> {}, weights -> {}",
        a.model.display(),
        imported.format,
        imported.graph.nodes.len(),
        imported.graph.params.len() - weight_count(&imported.graph),
        weight_count(&imported.graph),
        imported.graph.outputs.len(),
        a.output.display(),
        weights.display()
    );
    Ok(())
}
