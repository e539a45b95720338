//! `shardc gen`: the strategy search's models as text IR (forward graph with its loss), ready
//! for `shardc compile`: the transformer of [`shardc_compiler::transformer`], a wide ResNet,
//! an embedding-heavy network and seeded random layered networks
//! ([`shardc_compiler::generated`]).

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use shardc_compiler::generated;
use shardc_compiler::transformer::{transformer, TransformerConfig};
use std::path::PathBuf;

/// Arguments of `shardc gen`.
#[derive(Args, Debug)]
pub struct GenArgs {
    /// Which model.
    #[command(subcommand)]
    pub model: GenModel,
    /// Write here instead of stdout.
    #[arg(short, long, global = true)]
    pub output: Option<PathBuf>,
}

/// A generated model.
#[derive(Subcommand, Debug)]
pub enum GenModel {
    /// A transformer encoder stack with an MSE loss: per layer Q, K, V dense, heads,
    /// BatchMatMul(q, kᵀ) × scale, Softmax, BatchMatMul(p, v), dense out, residual +
    /// LayerNorm, FFN dense + GeLU + dense, residual + LayerNorm.
    Transformer {
        /// Encoder layers.
        #[arg(long, default_value_t = 2)]
        layers: usize,
        /// Hidden size (divisible by --heads).
        #[arg(long, default_value_t = 256)]
        hidden: usize,
        /// Attention heads.
        #[arg(long, default_value_t = 4)]
        heads: usize,
        /// Sequence length.
        #[arg(long, default_value_t = 64)]
        seq: usize,
        /// Batch size.
        #[arg(long, default_value_t = 16)]
        batch: usize,
        /// Inner size of the feed-forward block [default: 4 x hidden].
        #[arg(long)]
        ffn: Option<usize>,
    },
    /// WRN-depth-widen for CIFAR-10 (3x32x32) with sparse softmax cross-entropy.
    WideResnet {
        /// Depth, 6n + 4 (10, 16, 22, 28, ...).
        #[arg(long, default_value_t = 16)]
        depth: usize,
        /// Width multiplier.
        #[arg(long, default_value_t = 4)]
        widen: usize,
        /// Batch size.
        #[arg(long, default_value_t = 32)]
        batch: usize,
    },
    /// Tokens -> Gather on a (vocab, embed) table -> Dense layers -> MSE.
    Embedding {
        /// Rows of the table.
        #[arg(long, default_value_t = 100_000)]
        vocab: usize,
        /// Columns of the table.
        #[arg(long, default_value_t = 64)]
        embed: usize,
        /// Tokens per sample.
        #[arg(long, default_value_t = 16)]
        seq: usize,
        /// Batch size.
        #[arg(long, default_value_t = 64)]
        batch: usize,
        /// Dense layer widths, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "512,64")]
        dims: Vec<usize>,
    },
    /// A seeded random layered network of about --ops forward ops (dense, residual,
    /// LayerNorm, two-branch blocks).
    Random {
        /// Forward ops, about.
        #[arg(long, default_value_t = 1000)]
        ops: usize,
        /// Activation width.
        #[arg(long, default_value_t = 256)]
        width: usize,
        /// Batch size.
        #[arg(long, default_value_t = 1024)]
        batch: usize,
        /// Seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
}

/// `shardc gen`.
pub fn gen(a: &GenArgs) -> Result<()> {
    let g = match &a.model {
        GenModel::Transformer {
            layers,
            hidden,
            heads,
            seq,
            batch,
            ffn,
        } => {
            let mut cfg = TransformerConfig::new(*layers, *hidden, *heads, *seq, *batch);
            if let Some(f) = ffn {
                cfg = cfg.ffn(*f);
            }
            transformer(&cfg)?
        }
        GenModel::WideResnet {
            depth,
            widen,
            batch,
        } => generated::wide_resnet(*batch, *depth, *widen)?,
        GenModel::Embedding {
            vocab,
            embed,
            seq,
            batch,
            dims,
        } => generated::embedding_net(*batch, *vocab, *embed, *seq, dims)?,
        GenModel::Random {
            ops,
            width,
            batch,
            seed,
        } => generated::generated_network(*ops, *width, *batch, *seed)?,
    };
    let text = shardc_ir::text::print_graph(&g);
    match &a.output {
        Some(p) => std::fs::write(p, text).with_context(|| format!("writing {}", p.display()))?,
        None => print!("{text}"),
    }
    Ok(())
}
