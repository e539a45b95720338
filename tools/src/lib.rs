//! `shardc-tools`: what the subcommands of the `shardc` command line do.
//!
//! Subcommands: `compile` (a `.ir` model to an artifact directory), `run` (train an artifact on
//! seeded data or MNIST; a multi-rank artifact runs all ranks in this process), `print` (show a
//! model or an artifact as text IR), `verify` (distributed equals single device, on a model),
//! `explain`, `report` (the strategy report page), `launch`, `scheduler`, `check-collectives`, `data`, `zoo`, `gen`, `ckpt`, `gpu`,
//! `device`.
//! A subcommand's module holds its arguments (clap) and the function that runs it; the others
//! are shared ([`in_process`]: all ranks as threads, [`plan_compare`], [`parallel_args`]: the
//! parallel flags, [`closed_output`]). The command line itself (the `Cli` parser and the
//! dispatch) is the `shardc` binary's, in the root package, which also dispatches `bench` to
//! the `shardc-bench` crate. That crate uses this one ([`cluster_run`], [`in_process`],
//! [`plan_compare`], [`parallel_args`]); this one does not use it.

#![warn(missing_docs)]

pub mod ascend;
pub mod ckpt;
pub mod closed_output;
pub mod cluster_run;
pub mod commands;
pub mod data_cmd;
pub mod device_cmd;
pub mod device_run;
pub mod explain;
pub mod export_cmd;
pub mod gen_cmd;
pub mod gpu;
pub mod import_cmd;
pub mod in_process;
pub mod init_from;
pub mod launch;
pub mod parallel_args;
pub mod plan_compare;
pub mod predict;
pub mod report;
pub mod run_args;
pub mod run_stats;
pub mod training;
pub mod verify;
pub mod zoo_cmd;
