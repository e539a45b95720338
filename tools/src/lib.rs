//! `shardc-tools`: the `shardc` command line.
//!
//! Subcommands: `compile` (a `.ir` model to an artifact directory), `run` (train an artifact on
//! seeded data or MNIST; a multi-rank artifact runs all ranks in this process), `print` (show a
//! model or an artifact as text IR), `verify` (distributed equals single device, on a model),
//! `bench` (the benchmarks against numpy and PyTorch).

mod bench;
pub mod ckpt;
pub mod closed_output;
pub mod cluster_run;
mod commands;
mod data_cmd;
mod explain;
mod gen_cmd;
pub mod gpu;
pub mod in_process;
mod launch;
mod parallel_args;
pub mod plan_compare;
mod verify;
mod zoo_cmd;

use clap::{Parser, Subcommand};

/// shardc: an auto-parallel graph compiler and runtime.
#[derive(Parser, Debug)]
#[command(name = "shardc", version, about, long_about = None, propagate_version = true)]
pub struct Cli {
    /// Log filter (as RUST_LOG), e.g. `info` or `shardc=debug`.
    #[arg(long, global = true, default_value = "warn")]
    pub log: String,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Compile a model (.ir text) into an artifact directory (bincode graph + JSON manifest).
    Compile(commands::CompileArgs),
    /// Train a compiled artifact for some steps, printing the loss of each step.
    Run(commands::RunArgs),
    /// Print a model file or an artifact as text IR.
    Print(commands::PrintArgs),
    /// Check the invariant on a model: compile it stand-alone and in parallel, train both on
    /// the same batches (all ranks in this process), print the largest relative differences
    /// of the losses and of the gathered weights; exit status 1 beyond the tolerance.
    Verify(verify::VerifyArgs),
    /// Explain one op of a parallel artifact: its strategy and where it came from, the
    /// candidates weighed with their costs, and the communication around it.
    Explain(explain::ExplainArgs),
    /// Benchmarks: shardc against numpy and PyTorch on this machine.
    Bench(bench::BenchArgs),
    /// Start the scheduler and this node's workers, as MindSpore's msrun: logs in
    /// DIR/1/rank.R/stdout; with --join, wait and exit with the first non-zero status.
    Launch(launch::LaunchArgs),
    /// Run the scheduler of a dynamic cluster (MS_ROLE=MS_SCHED, MS_WORKER_NUM,
    /// MS_SCHED_HOST, MS_SCHED_PORT); `shardc launch` starts it for you.
    Scheduler,
    /// In a cluster (under `shardc launch` or mpirun): run every collective on the world and
    /// on sub-groups and check the results bit for bit.
    CheckCollectives(cluster_run::CheckCollectivesArgs),
    /// Data-set utilities: `data synth --format cifar10|mnist --out DIR` writes a seeded
    /// synthetic set in the real file format.
    Data(data_cmd::DataArgs),
    /// Print one of the tutorials' networks (forward graph with its loss) as text IR, for
    /// `shardc compile`.
    Zoo(zoo_cmd::ZooArgs),
    /// Print a model for the strategy search (a transformer, a wide ResNet, an embedding-heavy
    /// network, a random layered network) as text IR, for `shardc compile`.
    Gen(gen_cmd::GenArgs),
    /// Checkpoints: merge the ranks' files of a step into one single-device file, or inspect
    /// a file.
    Ckpt(ckpt::CkptArgs),
    /// The CUDA backend: `gpu info` lists the CUDA libraries found, the GPUs and NCCL.
    Gpu(gpu::GpuArgs),
}

/// Runs the command line and returns the process exit status (0 success, 1 failure, 2 usage,
/// 141 when standard output was closed under it, 128 + a signal that stopped `launch`).
pub fn main() -> i32 {
    // A closed stdout ends every subcommand quietly (`shardc run ART | head -1`).
    closed_output::install();
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = e.exit_code();
            let _ = e.print();
            return code;
        }
    };
    let result = match &cli.command {
        Command::Compile(a) => commands::compile(a),
        Command::Run(a) => commands::run(a),
        Command::Print(a) => commands::print(a),
        Command::Explain(a) => explain::explain(a),
        Command::Verify(a) => match verify::verify(a) {
            Ok(true) => Ok(()),
            Ok(false) => return 1,
            Err(e) => Err(e),
        },
        Command::Bench(a) => bench::run_bench(a),
        Command::Launch(a) => match launch::launch(a) {
            Ok(status) => return status,
            Err(e) => Err(e),
        },
        Command::Scheduler => cluster_run::scheduler_main(),
        Command::CheckCollectives(a) => cluster_run::check_collectives(a),
        Command::Data(a) => data_cmd::data(a),
        Command::Ckpt(a) => ckpt::ckpt(a),
        Command::Zoo(a) => zoo_cmd::zoo(a),
        Command::Gen(a) => gen_cmd::gen(a),
        Command::Gpu(a) => match a.command {
            gpu::GpuCommand::Info => gpu::info(),
        },
    };
    match result {
        Ok(()) => 0,
        Err(e) if closed_output::is_closed_output(&e) => closed_output::CLOSED_OUTPUT_STATUS,
        Err(e) => {
            eprintln!("error: {}", error_text(&e));
            1
        }
    }
}

/// An error and its causes, each cause added only when the text so far does not already say
/// it (many errors put their cause in their own message), so that nothing prints twice.
fn error_text(e: &anyhow::Error) -> String {
    let mut msg = e.to_string();
    for cause in e.chain().skip(1) {
        let c = cause.to_string();
        if !msg.contains(&c) {
            msg.push_str(": ");
            msg.push_str(&c);
        }
    }
    msg
}
