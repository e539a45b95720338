//! The `shardc` binary: its command line ([`Cli`], clap) and the dispatch of each subcommand
//! to the crate that implements it — `shardc-bench` for `bench`, `shardc-tools` for every
//! other. Both are libraries of this workspace; `shardc-bench` uses `shardc-tools` (never the
//! reverse), and neither holds the command line: it is all here.

use clap::{Parser, Subcommand};
use shardc_tools::{
    ckpt, closed_output, cluster_run, commands, data_cmd, device_cmd, explain, export_cmd, gen_cmd,
    gpu, import_cmd, launch, predict, report, run_args, verify, zoo_cmd,
};

/// shardc: an auto-parallel graph compiler and runtime.
#[derive(Parser, Debug)]
// `about` is the text `shardc --help` has always shown (once shardc-tools' package
// description, when the command line lived there).
#[command(
    name = "shardc",
    version,
    about = "The shardc command line: compile, run, bench.",
    long_about = None,
    propagate_version = true
)]
struct Cli {
    /// Log filter (as RUST_LOG), e.g. `info` or `shardc=debug`.
    #[arg(long, global = true, default_value = "warn")]
    log: String,
    /// What to do.
    #[command(subcommand)]
    command: Command,
}

/// The subcommands.
#[derive(Subcommand, Debug)]
enum Command {
    /// Compile a model (.ir text) into an artifact directory (bincode graph + JSON manifest).
    Compile(commands::CompileArgs),
    /// Train a compiled artifact for some steps, printing the loss of each step.
    Run(run_args::RunArgs),
    /// Print a model file or an artifact as text IR.
    Print(commands::PrintArgs),
    /// Run a model's forward graph on the samples of a data file (MindSpore's
    /// `model.predict`), with its weights from a checkpoint, on one device or N ranks; write
    /// the outputs as safetensors keyed by the model's output names.
    Predict(predict::PredictArgs),
    /// Read a model written by MindSpore (`.mindir`) or exported to ONNX (`.onnx`): write its
    /// forward graph as text IR and its weights as safetensors (for `--init-from`).
    Import(import_cmd::ImportArgs),
    /// Check the invariant on a model: compile it stand-alone and in parallel, train both on
    /// the same batches (all ranks in this process), print the largest relative differences
    /// of the losses and of the gathered weights; exit status 1 beyond the tolerance.
    Verify(verify::VerifyArgs),
    /// Explain one op of a parallel artifact: its strategy and where it came from, the
    /// candidates weighed with their costs, and the communication around it.
    Explain(explain::ExplainArgs),
    /// Export the training step as MLIR: the logical graph with its plan as `shard`
    /// annotations, and each rank's graph with `shard` collectives, checked by MLIR's
    /// verifier (cargo feature `mlir`).
    Export(export_cmd::ExportArgs),
    /// Write a parallel artifact's strategy report: one self-contained HTML page with the
    /// graph (repeated layers folded) coloured by how each op is split, the communication by
    /// bytes per step, predicted and measured times, memory per rank, and each op's plan.
    Report(report::ReportArgs),
    /// Benchmarks: shardc against numpy and PyTorch on this machine.
    Bench(shardc_bench::BenchArgs),
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
    /// Every device backend: `device info` lists the libraries found for CUDA and for
    /// Ascend (CANN: AscendCL, aclnn, HCCL), the GPUs and the NPUs.
    Device(device_cmd::DeviceCmdArgs),
}

/// Exits with [`run`]'s status.
fn main() {
    std::process::exit(run());
}

/// Runs the command line and returns the process exit status (0 success, 1 failure, 2 usage,
/// 141 when standard output was closed under it, 128 + a signal that stopped `launch`).
fn run() -> i32 {
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
        Command::Predict(a) => predict::predict(a),
        Command::Import(a) => import_cmd::import(a),
        Command::Explain(a) => explain::explain(a),
        Command::Export(a) => export_cmd::export(a),
        Command::Report(a) => report::report(a),
        Command::Verify(a) => match verify::verify(a) {
            Ok(true) => Ok(()),
            Ok(false) => return 1,
            Err(e) => Err(e),
        },
        Command::Bench(a) => shardc_bench::run_bench(a),
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
        Command::Device(a) => match a.command {
            device_cmd::DeviceCommand::Info => device_cmd::info(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use shardc_bench::BenchWhat;

    /// `shardc bench WHAT --quick` reaches the benchmark named, for the benchmarks that test
    /// the rest of their setup in `shardc-bench` (`bench_compile`, `bench_strategies`).
    #[test]
    fn compile_and_strategies_are_subcommands_of_shardc_bench() {
        for (what, expected) in [
            ("compile", BenchWhat::Compile),
            ("strategies", BenchWhat::Strategies),
        ] {
            let cli = Cli::try_parse_from(["shardc", "bench", what, "--quick"]).unwrap();
            match cli.command {
                Command::Bench(a) => {
                    assert_eq!(a.what, expected);
                    assert!(a.quick);
                }
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
