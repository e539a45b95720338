//! `shardc zoo`: the tutorials' networks (forward graph with loss) as text IR, ready for
//! `shardc compile` — the same graphs the Rust examples build.

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use shardc_compiler::zoo;
use std::path::PathBuf;

/// A network of the zoo.
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum ZooNet {
    /// The parallel quickstart's `Net(32, 16, 16)` with MSELoss (batch must be even).
    Quickstart,
    /// The data-parallel tutorial's MLP (`--dims`, default 784,512,512,10) with sparse softmax
    /// cross-entropy.
    Mlp,
    /// LeNet-5 (1x32x32 inputs).
    Lenet,
    /// ResNet-18 for CIFAR-10 (3x32x32 inputs).
    Resnet18,
    /// ResNet-50 (3 x `--image-size`², `--width-divisor`) with SoftmaxCrossEntropyExpand.
    Resnet50,
}

/// Arguments of `shardc zoo`.
#[derive(Args, Debug)]
pub struct ZooArgs {
    /// Which network.
    #[arg(value_enum)]
    pub net: ZooNet,
    /// The (global) batch size.
    #[arg(long, default_value_t = 32)]
    pub batch: usize,
    /// Layer sizes of the MLP, input first.
    #[arg(long, value_delimiter = ',', default_value = "784,512,512,10")]
    pub dims: Vec<usize>,
    /// ResNet-50's input height and width.
    #[arg(long, default_value_t = 224)]
    pub image_size: usize,
    /// ResNet-50's channel divisor (1: the real net).
    #[arg(long, default_value_t = 1)]
    pub width_divisor: usize,
    /// Number of classes (ResNet-50).
    #[arg(long, default_value_t = 10)]
    pub classes: usize,
    /// Write here instead of stdout.
    #[arg(short, long)]
    pub output: Option<PathBuf>,
}

/// `shardc zoo`.
pub fn zoo(a: &ZooArgs) -> Result<()> {
    if a.batch == 0 {
        bail!("--batch 0: a batch needs at least one sample");
    }
    let g = match a.net {
        ZooNet::Quickstart => zoo::quickstart(a.batch)?,
        ZooNet::Mlp => zoo::mlp(a.batch, &a.dims)?,
        ZooNet::Lenet => zoo::lenet(a.batch)?,
        ZooNet::Resnet18 => zoo::resnet18_cifar(a.batch)?,
        ZooNet::Resnet50 => zoo::resnet50(a.batch, a.image_size, a.classes, a.width_divisor)?,
    };
    let text = shardc_ir::text::print_graph(&g);
    match &a.output {
        Some(p) => std::fs::write(p, text).with_context(|| format!("writing {}", p.display()))?,
        None => print!("{text}"),
    }
    Ok(())
}
