//! `shardc device info`: what each device backend finds on this machine — the CUDA
//! libraries, GPUs and NCCL ([`crate::gpu::info`]), then the CANN libraries and NPUs
//! ([`crate::ascend::info`]) — and, for a missing library, how to make it findable.

use anyhow::Result;
use clap::Args;

/// Arguments of `shardc device`.
#[derive(Args, Debug)]
pub struct DeviceCmdArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: DeviceCommand,
}

/// The `shardc device` subcommands.
#[derive(clap::Subcommand, Debug, Clone, Copy)]
pub enum DeviceCommand {
    /// The libraries found for CUDA and for Ascend (and how to make a missing one
    /// findable), the GPUs and NPUs.
    Info,
}

/// `shardc device info`.
pub fn info() -> Result<()> {
    println!("== CUDA (--device-target GPU) ==");
    crate::gpu::info()?;
    println!();
    println!("== Ascend (--device-target Ascend) ==");
    crate::ascend::info()
}
