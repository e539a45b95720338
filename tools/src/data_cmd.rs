//! `shardc data`: data-set utilities. `shardc data synth --format cifar10|mnist --out DIR
//! [--images N] [--seed S]` writes a seeded synthetic set in the real file format, with
//! class-dependent structure so that a network's loss falls on it.

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use shardc_runtime::data::{write_synthetic_cifar10, write_synthetic_mnist};
use std::path::PathBuf;

/// `shardc data ...`.
#[derive(Args, Debug)]
pub struct DataArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: DataCommand,
}

/// The `data` subcommands.
#[derive(Subcommand, Debug)]
pub enum DataCommand {
    /// Write a seeded synthetic data set in the real binary format (CIFAR-10's
    /// `data_batch_{1..5}.bin` + `test_batch.bin` + `batches.meta.txt`, or MNIST's idx files
    /// `train-*` and `t10k-*`).
    Synth(SynthArgs),
}

/// The file format of `data synth`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum SynthFormat {
    /// CIFAR-10 binary (32x32x3, 10 classes).
    Cifar10,
    /// MNIST idx (28x28, 10 classes).
    Mnist,
}

/// Arguments of `shardc data synth`.
#[derive(Args, Debug)]
pub struct SynthArgs {
    /// The file format.
    #[arg(long, value_enum)]
    pub format: SynthFormat,
    /// The directory to write (created if missing).
    #[arg(long)]
    pub out: PathBuf,
    /// Number of training images: CIFAR-10 writes ceil(N / 5) per training file and as many
    /// in the test file; MNIST writes N training and ceil(N / 6) test images.
    #[arg(long, default_value_t = 5000)]
    pub images: usize,
    /// Seed of the class prototypes, the labels and the noise.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

/// Runs `shardc data ...`.
pub fn data(args: &DataArgs) -> anyhow::Result<()> {
    match &args.command {
        DataCommand::Synth(a) => synth(a),
    }
}

fn synth(a: &SynthArgs) -> anyhow::Result<()> {
    if a.images == 0 {
        anyhow::bail!("--images 0: the data set needs at least one training image");
    }
    match a.format {
        SynthFormat::Cifar10 => {
            let per_file = a.images.div_ceil(5);
            write_synthetic_cifar10(&a.out, per_file, a.seed)
                .with_context(|| format!("writing synthetic CIFAR-10 into {}", a.out.display()))?;
            println!(
                "wrote synthetic CIFAR-10 to {}: 5 training files of {per_file} images and a test file of {per_file} (seed {})",
                a.out.display(),
                a.seed
            );
        }
        SynthFormat::Mnist => {
            write_synthetic_mnist(&a.out, a.images, a.seed)
                .with_context(|| format!("writing synthetic MNIST into {}", a.out.display()))?;
            println!(
                "wrote synthetic MNIST to {}: {} training and {} test images (seed {})",
                a.out.display(),
                a.images,
                a.images.div_ceil(6),
                a.seed
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardc_runtime::data::{
        Cifar10Dataset, Cifar10Usage, MnistDataset, MnistUsage, SourceOptions,
    };

    #[test]
    fn synth_writes_sets_the_readers_accept() {
        let d = tempfile::tempdir().unwrap();
        let cifar = d.path().join("cifar");
        synth(&SynthArgs {
            format: SynthFormat::Cifar10,
            out: cifar.clone(),
            images: 12,
            seed: 1,
        })
        .unwrap();
        let ds =
            Cifar10Dataset::new(&cifar, Cifar10Usage::Train, SourceOptions::default()).unwrap();
        assert_eq!(ds.get_dataset_size(), 15);
        let mnist = d.path().join("mnist");
        synth(&SynthArgs {
            format: SynthFormat::Mnist,
            out: mnist.clone(),
            images: 12,
            seed: 1,
        })
        .unwrap();
        let ds = MnistDataset::new(&mnist, MnistUsage::Test, SourceOptions::default()).unwrap();
        assert_eq!(ds.get_dataset_size(), 2);
        let e = synth(&SynthArgs {
            format: SynthFormat::Mnist,
            out: mnist,
            images: 0,
            seed: 1,
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("--images 0"), "{e}");
    }
}
