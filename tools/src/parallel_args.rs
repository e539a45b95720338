//! The parallel-context flags shared by `shardc compile` and `shardc verify`: MindSpore's
//! `set_auto_parallel_context` options, from a TOML file (`--config`) and flags that override it.

use std::path::PathBuf;

use shardc_compiler::device::DeviceDescription;
use shardc_compiler::pipeline;
use shardc_passes::parallel::ParallelOptions;

use clap::builder::{PossibleValuesParser, TypedValueParser};
use shardc_compiler::parallel_context::{
    parse_memory_size, CommFusion, DatasetStrategy, ParallelContext, ParallelContextError,
    ParallelMode, ParallelSettings, SearchMode,
};

/// MindSpore's `set_auto_parallel_context` options. Each flag overrides the same key of the
/// `--config` file; unset options keep MindSpore's defaults.
#[derive(clap::Args, Debug, Clone, Default, PartialEq)]
pub struct ParallelArgs {
    /// TOML file of parallel options, keyed by MindSpore's option names (parallel_mode,
    /// device_num, [strategy_ckpt_config], [comm_fusion.allreduce], ...); flags override it.
    // The brackets are TOML tables, as `shardc compile --help` shows them, not links.
    #[allow(rustdoc::broken_intra_doc_links)]
    #[arg(long, value_name = "FILE.toml")]
    pub config: Option<PathBuf>,

    /// Parallel mode. Default stand_alone, except semi_auto_parallel when --device-num (or the
    /// config's device_num) is above 1 and no mode is given anywhere.
    #[arg(long, value_name = "MODE", value_parser = parallel_mode_parser())]
    pub parallel_mode: Option<ParallelMode>,

    /// Strategy search of auto_parallel [default: sharding_propagation].
    #[arg(long, value_name = "MODE", value_parser = search_mode_parser())]
    pub search_mode: Option<SearchMode>,

    /// Number of devices [default: 1].
    #[arg(long, value_name = "N")]
    pub device_num: Option<usize>,

    /// This process's rank, below --device-num [default: 0].
    #[arg(long, value_name = "RANK")]
    pub global_rank: Option<usize>,

    /// Average (true) or sum (false) the all-reduced gradients; the bare flag means true
    /// [default: false].
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub gradients_mean: Option<bool>,

    /// How dataset inputs are split: data_parallel, full_batch, or a strategy such as
    /// "((2, 1), (2, 1))" [default: data_parallel].
    #[arg(long, value_name = "STRATEGY", value_parser = dataset_strategy_parser)]
    pub dataset_strategy: Option<DatasetStrategy>,

    /// Let redistribution use AllToAll; the bare flag means true [default: false].
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub enable_alltoall: Option<bool>,

    /// File to save the parallel strategies to (strategy_ckpt_config.save_file).
    #[arg(long, value_name = "FILE")]
    pub strategy_ckpt_save_file: Option<PathBuf>,

    /// File to load parallel strategies from (strategy_ckpt_config.load_file).
    #[arg(long, value_name = "FILE")]
    pub strategy_ckpt_load_file: Option<PathBuf>,

    /// Save only trainable parameters' strategies (strategy_ckpt_config.only_trainable_params);
    /// the bare flag means true [default: true].
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub strategy_ckpt_only_trainable_params: Option<bool>,

    /// Gradient all-reduce fusion: auto (64 MB buckets), size:MB (e.g. size:32) or
    /// index:I,J,... (split the parameter list before these indices, e.g. index:20,35)
    /// [default: auto].
    #[arg(long, value_name = "MODE[:CONFIG]", value_parser = comm_fusion_parser)]
    pub comm_fusion: Option<CommFusion>,

    /// Device memory limit, e.g. 16GB, 512MB, 3.5GB (binary units).
    #[arg(long, value_name = "SIZE", value_parser = memory_size_parser)]
    pub max_device_memory: Option<u64>,

    /// The machine the strategy search's cost model prices: a preset (cpu, 8xh100,
    /// ascend910) or a device description file (`shardc bench calibrate` writes one)
    /// [default: cpu].
    #[arg(long, value_name = "PRESET|FILE.toml")]
    pub device: Option<String>,

    /// Pipeline stages (MindSpore's pipeline_stages; each stage gets device_num / stages
    /// devices) [default: 1].
    #[arg(long, value_name = "S")]
    pub pipeline_stages: Option<usize>,

    /// Micro-batches per step (MindSpore's PipelineCell(net, micro_size)) [default: 1].
    #[arg(long, value_name = "M")]
    pub micro_size: Option<usize>,

    /// The pipeline's schedule (pipeline_config.pipeline_scheduler): 1f1b or gpipe
    /// [default: 1f1b].
    #[arg(long, value_name = "SCHEDULER", value_parser = ["1f1b", "gpipe"])]
    pub pipeline_scheduler: Option<String>,
    /// Split weights and optimizer state over their data-parallel group (MindSpore's
    /// parallel optimizer, ZeRO-1); the bare flag means true [default: false].
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub enable_parallel_optimizer: Option<bool>,

    /// Weights under this many KB stay whole
    /// (parallel_optimizer_config.parallel_optimizer_threshold) [default: 64].
    #[arg(long, value_name = "KB")]
    pub parallel_optimizer_threshold: Option<u64>,

    /// Split each weight over this many devices of its data-parallel group, -1 for all of it
    /// (parallel_optimizer_config.optimizer_weight_shard_size) [default: -1].
    #[arg(long, value_name = "N", allow_hyphen_values = true)]
    pub optimizer_weight_shard_size: Option<i64>,

    /// In auto_parallel, let the stage planner choose the pipeline stages and the layer split,
    /// micro-batches, optimizer sharding and recompute under --max-device-memory
    /// (auto_pipeline; Alpa's stage_option="auto"); the bare flag means true [default: false].
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub auto_pipeline: Option<bool>,

    /// Keep accumulated gradients split too
    /// (parallel_optimizer_config.gradient_accumulation_shard) [default: true].
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub gradient_accumulation_shard: Option<bool>,
}

fn parallel_mode_parser() -> impl TypedValueParser<Value = ParallelMode> {
    PossibleValuesParser::new(ParallelMode::NAMES).try_map(|s| s.parse::<ParallelMode>())
}

fn search_mode_parser() -> impl TypedValueParser<Value = SearchMode> {
    PossibleValuesParser::new(SearchMode::NAMES).try_map(|s| s.parse::<SearchMode>())
}

fn dataset_strategy_parser(s: &str) -> Result<DatasetStrategy, ParallelContextError> {
    s.parse()
}

fn comm_fusion_parser(s: &str) -> Result<CommFusion, ParallelContextError> {
    s.parse()
}

fn memory_size_parser(s: &str) -> Result<u64, ParallelContextError> {
    parse_memory_size(s)
}

/// The device description `--device NAME` names: a preset, or a device description file (the
/// `cpu` preset when `None`).
pub fn device_description(name: Option<&str>) -> anyhow::Result<DeviceDescription> {
    let name = name.unwrap_or("cpu");
    if DeviceDescription::PRESETS.contains(&name) {
        return Ok(DeviceDescription::preset(name)?);
    }
    let path = std::path::Path::new(name);
    if !path.exists() {
        anyhow::bail!(
            "--device {name}: neither a preset ({}) nor an existing file",
            DeviceDescription::PRESETS.join(", ")
        );
    }
    Ok(DeviceDescription::load(path)?)
}

impl ParallelArgs {
    /// The device description `--device` names (the `cpu` preset by default).
    pub fn device_description(&self) -> anyhow::Result<DeviceDescription> {
        device_description(self.device.as_deref())
    }

    /// The parallel passes' options of `ctx` with `--device`'s machine (`None` for one
    /// device).
    pub fn options(&self, ctx: &ParallelContext) -> anyhow::Result<Option<ParallelOptions>> {
        let Some(mut o) = pipeline::parallel_options(ctx)? else {
            return Ok(None);
        };
        o.search.machine = self.device_description()?.machine();
        Ok(Some(o))
    }

    /// The options the flags set (the file is not read).
    pub fn flag_settings(&self) -> ParallelSettings {
        ParallelSettings {
            parallel_mode: self.parallel_mode,
            search_mode: self.search_mode,
            device_num: self.device_num,
            global_rank: self.global_rank,
            gradients_mean: self.gradients_mean,
            dataset_strategy: self.dataset_strategy.clone(),
            enable_alltoall: self.enable_alltoall,
            max_device_memory: self.max_device_memory,
            strategy_ckpt_save_file: self.strategy_ckpt_save_file.clone(),
            strategy_ckpt_load_file: self.strategy_ckpt_load_file.clone(),
            strategy_ckpt_only_trainable_params: self.strategy_ckpt_only_trainable_params,
            comm_fusion: self.comm_fusion.clone(),
            enable_parallel_optimizer: self.enable_parallel_optimizer,
            gradient_accumulation_shard: self.gradient_accumulation_shard,
            parallel_optimizer_threshold: self.parallel_optimizer_threshold,
            optimizer_weight_shard_size: self.optimizer_weight_shard_size,
            pipeline_stages: self.pipeline_stages,
            micro_size: self.micro_size,
            pipeline_scheduler: self
                .pipeline_scheduler
                .as_deref()
                .and_then(shardc_passes::pipeline::Scheduler::from_name),
            auto_pipeline: self.auto_pipeline,
        }
    }

    /// The parallel context: the `--config` file if given (else MindSpore's defaults), every
    /// given flag overriding it, `semi_auto_parallel` when `device_num > 1` and no mode is
    /// given anywhere; then validated.
    pub fn to_context(&self) -> Result<ParallelContext, ParallelContextError> {
        let file = match &self.config {
            Some(path) => ParallelSettings::from_toml_file(path)?,
            None => ParallelSettings::default(),
        };
        let mut settings = file.override_with(self.flag_settings());
        if settings.parallel_mode.is_none() && settings.device_num.is_some_and(|n| n > 1) {
            settings.parallel_mode = Some(ParallelMode::SemiAutoParallel);
        }
        let ctx = settings.resolve();
        ctx.validate()?;
        Ok(ctx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use shardc_ir::Strategy;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        parallel: ParallelArgs,
        /// A positional, as `shardc compile MODEL` has.
        model: Option<PathBuf>,
    }

    fn parse(args: &[&str]) -> Result<ParallelArgs, clap::Error> {
        let argv = std::iter::once("shardc").chain(args.iter().copied());
        Cli::try_parse_from(argv).map(|c| c.parallel)
    }

    fn context(args: &[&str]) -> ParallelContext {
        match parse(args) {
            Ok(a) => match a.to_context() {
                Ok(c) => c,
                Err(e) => panic!("{args:?}: {e}"),
            },
            Err(e) => panic!("{args:?}: {e}"),
        }
    }

    #[test]
    fn no_flags_give_mindspore_defaults() {
        assert_eq!(context(&[]), ParallelContext::default());
    }

    #[test]
    fn every_flag_sets_its_option() {
        let ctx = context(&[
            "--parallel-mode",
            "auto_parallel",
            "--search-mode",
            "recursive_programming",
            "--device-num",
            "8",
            "--global-rank",
            "3",
            "--gradients-mean",
            "--dataset-strategy",
            "((4, 1), (4, 1))",
            "--enable-alltoall",
            "true",
            "--strategy-ckpt-save-file",
            "s.ckpt",
            "--strategy-ckpt-load-file",
            "l.ckpt",
            "--strategy-ckpt-only-trainable-params",
            "false",
            "--comm-fusion",
            "index:20,35",
            "--max-device-memory",
            "16GB",
        ]);
        assert_eq!(ctx.parallel_mode, ParallelMode::AutoParallel);
        assert_eq!(ctx.search_mode, SearchMode::RecursiveProgramming);
        assert_eq!((ctx.device_num, ctx.global_rank), (8, 3));
        assert!(ctx.gradients_mean);
        assert_eq!(
            ctx.dataset_strategy,
            DatasetStrategy::Explicit(Strategy(vec![vec![4, 1], vec![4, 1]]))
        );
        assert!(ctx.enable_alltoall);
        assert_eq!(
            ctx.strategy_ckpt_config.save_file,
            Some(PathBuf::from("s.ckpt"))
        );
        assert_eq!(
            ctx.strategy_ckpt_config.load_file,
            Some(PathBuf::from("l.ckpt"))
        );
        assert!(!ctx.strategy_ckpt_config.only_trainable_params);
        assert_eq!(ctx.comm_fusion, CommFusion::Index(vec![20, 35]));
        assert_eq!(ctx.max_device_memory, Some(16 << 30));
    }

    #[test]
    fn bool_flags_take_an_optional_value() {
        assert!(context(&["--gradients-mean"]).gradients_mean);
        assert!(context(&["--gradients-mean", "true"]).gradients_mean);
        assert!(!context(&["--gradients-mean", "false"]).gradients_mean);
        assert!(!context(&["--gradients-mean=false"]).gradients_mean);
        assert!(context(&["--enable-alltoall", "--device-num", "2"]).enable_alltoall);
        // After a positional, or with `=`, a bare flag cannot swallow the positional.
        let cli = Cli::try_parse_from(["shardc", "model.ir", "--gradients-mean"]).expect("parse");
        assert_eq!(cli.model, Some(PathBuf::from("model.ir")));
        assert_eq!(cli.parallel.gradients_mean, Some(true));
    }

    #[test]
    fn device_num_above_one_defaults_to_semi_auto_parallel() {
        let ctx = context(&["--device-num", "4"]);
        assert_eq!(ctx.parallel_mode, ParallelMode::SemiAutoParallel);
        let ctx = context(&["--device-num", "4", "--parallel-mode", "stand_alone"]);
        assert_eq!(ctx.parallel_mode, ParallelMode::StandAlone);
        assert!(!ctx.is_parallel());
        let ctx = context(&["--device-num", "1"]);
        assert_eq!(ctx.parallel_mode, ParallelMode::StandAlone);
    }

    #[test]
    fn flags_override_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("ctx.toml");
        std::fs::write(
            &path,
            "parallel_mode = \"data_parallel\"\ndevice_num = 4\nglobal_rank = 3\n\
             gradients_mean = true\n[comm_fusion.allreduce]\nmode = \"size\"\nconfig = 32\n",
        )
        .expect("write");
        let p = path.to_str().expect("utf-8 temp path");
        let from_file = context(&["--config", p]);
        assert_eq!(from_file.parallel_mode, ParallelMode::DataParallel);
        assert_eq!((from_file.device_num, from_file.global_rank), (4, 3));
        assert!(from_file.gradients_mean);
        assert_eq!(from_file.comm_fusion, CommFusion::Size(32.0));

        let ctx = context(&[
            "--config",
            p,
            "--device-num",
            "8",
            "--global-rank",
            "7",
            "--gradients-mean",
            "false",
            "--comm-fusion",
            "auto",
        ]);
        assert_eq!(
            ctx.parallel_mode,
            ParallelMode::DataParallel,
            "kept from file"
        );
        assert_eq!((ctx.device_num, ctx.global_rank), (8, 7));
        assert!(!ctx.gradients_mean);
        assert_eq!(ctx.comm_fusion, CommFusion::Auto);

        // A mode in the file counts as "given": no semi_auto_parallel default.
        std::fs::write(&path, "parallel_mode = \"stand_alone\"\n").expect("write");
        let ctx = context(&["--config", p, "--device-num", "8"]);
        assert_eq!(ctx.parallel_mode, ParallelMode::StandAlone);

        // A device_num in the file alone triggers the default.
        std::fs::write(&path, "device_num = 2\n").expect("write");
        let ctx = context(&["--config", p]);
        assert_eq!(ctx.parallel_mode, ParallelMode::SemiAutoParallel);
    }

    #[test]
    fn auto_pipeline_flag_sets_the_key_and_is_validated() {
        let ctx = context(&[
            "--parallel-mode",
            "auto_parallel",
            "--device-num",
            "4",
            "--auto-pipeline",
        ]);
        assert!(ctx.auto_pipeline);
        let err = parse(&["--device-num", "4", "--auto-pipeline"])
            .expect("flags parse")
            .to_context()
            .expect_err("semi_auto_parallel by default");
        assert!(
            err.to_string().starts_with(
                "invalid auto_pipeline `true`: needs parallel_mode `auto_parallel`, not `semi_auto_parallel`"
            ),
            "{err}"
        );
    }

    #[test]
    fn merged_values_are_validated() {
        let err = parse(&["--device-num", "2", "--global-rank", "2"])
            .expect("flags parse")
            .to_context()
            .expect_err("rank 2 of 2");
        assert_eq!(
            err.to_string(),
            "invalid global_rank `2`: must be less than device_num (2)"
        );
        let err = parse(&["--dataset-strategy", "((2, 0))"])
            .expect("flags parse")
            .to_context()
            .expect_err("zero split");
        assert_eq!(
            err.to_string(),
            "invalid dataset_strategy `((2, 0))`: split 0 of input 0, dimension 1 is not positive"
        );
    }

    #[test]
    fn file_errors_name_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("bad.toml");
        std::fs::write(&path, "device_num = 2\ndevce_num = 4\n").expect("write");
        let args = parse(&["--config", path.to_str().expect("utf-8 temp path")]).expect("parse");
        let msg = args.to_context().expect_err("typo").to_string();
        assert!(
            msg.starts_with(&format!("{}:2: unknown key `devce_num`", path.display())),
            "{msg}"
        );
        let missing = dir.path().join("missing.toml");
        let args = parse(&["--config", missing.to_str().expect("utf-8")]).expect("parse");
        let msg = args.to_context().expect_err("missing").to_string();
        assert!(msg.starts_with("cannot read "), "{msg}");
    }

    #[test]
    fn bad_flag_values_are_usage_errors() {
        let cases: &[(&[&str], &str)] = &[
            (&["--parallel-mode", "semi_auto"], "semi_auto_parallel"),
            (&["--search-mode", "greedy"], "sharding_propagation"),
            (
                &["--comm-fusion", "size:0"],
                "fusion size in MB must be greater than 0",
            ),
            (
                &["--comm-fusion", "index:35,20"],
                "parameter indices must be strictly increasing, but 20 follows 35",
            ),
            (
                &["--comm-fusion", "bucket"],
                "valid values: auto, size, index",
            ),
            (&["--max-device-memory", "16QB"], "unknown unit `QB`"),
            (
                &["--dataset-strategy", "((2, 1)"],
                "expected `,`, found end of text",
            ),
            (&["--gradients-mean", "yes"], "yes"),
            (&["--device-num=-1"], "-1"),
        ];
        for (args, needle) in cases {
            let err = parse(args).expect_err("bad value");
            use clap::error::ErrorKind;
            assert!(
                matches!(
                    err.kind(),
                    ErrorKind::ValueValidation | ErrorKind::InvalidValue
                ),
                "{args:?}: {:?}",
                err.kind()
            );
            assert_eq!(err.exit_code(), 2, "{args:?}");
            let msg = err.to_string();
            assert!(msg.contains(needle), "{args:?}: {msg}");
        }
    }

    #[test]
    fn help_documents_every_flag() {
        use clap::CommandFactory;
        let help = Cli::command().render_long_help().to_string();
        for flag in [
            "--config",
            "--parallel-mode",
            "--search-mode",
            "--device-num",
            "--global-rank",
            "--gradients-mean",
            "--dataset-strategy",
            "--enable-alltoall",
            "--strategy-ckpt-save-file",
            "--strategy-ckpt-load-file",
            "--strategy-ckpt-only-trainable-params",
            "--comm-fusion",
            "--max-device-memory",
            "--auto-pipeline",
        ] {
            assert!(help.contains(flag), "{flag} missing from help:\n{help}");
        }
        assert!(help.contains("semi_auto_parallel when --device-num"));
        assert!(help.contains("recursive_programming"));
    }
}
