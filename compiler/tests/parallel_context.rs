//! The parallel context: MindSpore's option names and defaults, TOML reading and writing, and
//! every error with its exact message.

use std::path::PathBuf;

use shardc_compiler::parallel_context::{
    format_memory_size, parse_memory_size, CommFusion, DatasetStrategy, ParallelContext,
    ParallelContextError, ParallelMode, ParallelOptimizerConfig, ParallelSettings, SearchMode,
    StrategyCkptConfig,
};
use shardc_ir::Strategy;

const FULL: &str = r#"
parallel_mode = "semi_auto_parallel"
search_mode = "dynamic_programming"
device_num = 8
global_rank = 5
gradients_mean = true
dataset_strategy = [[4, 1], [4, 1]]
enable_alltoall = true
max_device_memory = "3.5GB"

[strategy_ckpt_config]
save_file = "out/strategy.ckpt"
load_file = "in/strategy.ckpt"
only_trainable_params = false

[comm_fusion.allreduce]
mode = "index"
config = [20, 35]
"#;

fn err(text: &str) -> String {
    match ParallelContext::from_toml_str(text) {
        Ok(ctx) => panic!("expected an error for {text:?}, got {ctx:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn defaults_are_mindspore_defaults() {
    let ctx = ParallelContext::default();
    assert_eq!(ctx.parallel_mode, ParallelMode::StandAlone);
    assert_eq!(ctx.search_mode, SearchMode::ShardingPropagation);
    assert_eq!((ctx.device_num, ctx.global_rank), (1, 0));
    assert!(!ctx.gradients_mean);
    assert_eq!(ctx.dataset_strategy, DatasetStrategy::DataParallel);
    assert_eq!(ctx.strategy_ckpt_config, StrategyCkptConfig::default());
    assert!(ctx.strategy_ckpt_config.only_trainable_params);
    assert!(!ctx.enable_alltoall);
    assert_eq!(ctx.comm_fusion, CommFusion::Auto);
    assert_eq!(ctx.max_device_memory, None);
    assert!(!ctx.is_parallel());
    ctx.validate().expect("defaults are valid");
    assert_eq!(ParallelContext::from_toml_str("").expect("empty"), ctx);
}

#[test]
fn names_round_trip_through_display_and_from_str() {
    for (mode, name) in ParallelMode::ALL.iter().zip(ParallelMode::NAMES) {
        assert_eq!(mode.to_string(), *name);
        assert_eq!(name.parse::<ParallelMode>().expect("name"), *mode);
    }
    for (mode, name) in SearchMode::ALL.iter().zip(SearchMode::NAMES) {
        assert_eq!(mode.to_string(), *name);
        assert_eq!(name.parse::<SearchMode>().expect("name"), *mode);
    }
    assert_eq!(
        ParallelMode::NAMES,
        [
            "stand_alone",
            "data_parallel",
            "semi_auto_parallel",
            "auto_parallel"
        ]
    );
    assert_eq!(
        SearchMode::NAMES,
        [
            "sharding_propagation",
            "dynamic_programming",
            "recursive_programming",
            "ilp"
        ]
    );
    for text in ["data_parallel", "full_batch", "((2, 1), (2, 1))", "((8))"] {
        let s: DatasetStrategy = text.parse().expect("dataset strategy");
        assert_eq!(s.to_string(), text);
    }
    for text in ["auto", "size:32", "size:0.5", "index:20,35"] {
        let f: CommFusion = text.parse().expect("comm fusion");
        assert_eq!(f.to_string(), text);
    }
}

#[test]
fn unknown_names_list_the_valid_ones() {
    assert_eq!(
        "semi_auto"
            .parse::<ParallelMode>()
            .expect_err("bad")
            .to_string(),
        "unknown parallel_mode `semi_auto`; valid values: stand_alone, data_parallel, \
         semi_auto_parallel, auto_parallel"
    );
    assert_eq!(
        "sharding_propagaton"
            .parse::<SearchMode>()
            .expect_err("bad")
            .to_string(),
        "unknown search_mode `sharding_propagaton` (did you mean `sharding_propagation`?); \
         valid values: sharding_propagation, dynamic_programming, recursive_programming, ilp"
    );
    assert_eq!(
        "fullbatch"
            .parse::<DatasetStrategy>()
            .expect_err("bad")
            .to_string(),
        "unknown dataset_strategy `fullbatch` (did you mean `full_batch`?); valid values: \
         data_parallel, full_batch, a strategy such as ((2, 1), (2, 1))"
    );
}

#[test]
fn dataset_strategy_text_forms() {
    let two = DatasetStrategy::Explicit(Strategy(vec![vec![2, 1], vec![2, 1]]));
    for text in [
        "((2, 1), (2, 1))",
        " ( (2,1) ,(2,1), ) ",
        "[[2, 1], [2, 1]]",
        "((2, 1,), (2, 1))",
    ] {
        assert_eq!(text.parse::<DatasetStrategy>().expect(text), two, "{text}");
    }
    assert_eq!(
        "((2, 1),)".parse::<DatasetStrategy>().expect("one input"),
        DatasetStrategy::Explicit(Strategy(vec![vec![2, 1]]))
    );
    let cases = [
        ("((2, 1)", "expected `,`, found end of text"),
        ("((2, x))", "expected an integer, found `x` at column 6"),
        (
            "((2, 1)) extra",
            "expected end of text, found `e` at column 10",
        ),
        ("(2, 1)", "expected `(`, found `2` at column 2"),
    ];
    for (text, reason) in cases {
        assert_eq!(
            text.parse::<DatasetStrategy>().expect_err(text).to_string(),
            format!("invalid dataset_strategy `{text}`: {reason}")
        );
    }
}

#[test]
fn full_toml_is_read() {
    let ctx = ParallelContext::from_toml_str(FULL).expect("full");
    assert_eq!(ctx.parallel_mode, ParallelMode::SemiAutoParallel);
    assert_eq!(ctx.search_mode, SearchMode::DynamicProgramming);
    assert_eq!((ctx.device_num, ctx.global_rank), (8, 5));
    assert!(ctx.gradients_mean);
    assert_eq!(
        ctx.dataset_strategy,
        DatasetStrategy::Explicit(Strategy(vec![vec![4, 1], vec![4, 1]]))
    );
    assert!(ctx.enable_alltoall);
    assert_eq!(ctx.max_device_memory, Some(3584 << 20));
    assert_eq!(
        ctx.strategy_ckpt_config,
        StrategyCkptConfig {
            save_file: Some(PathBuf::from("out/strategy.ckpt")),
            load_file: Some(PathBuf::from("in/strategy.ckpt")),
            only_trainable_params: false,
        }
    );
    assert_eq!(ctx.comm_fusion, CommFusion::Index(vec![20, 35]));
    assert!(ctx.is_parallel());
}

#[test]
fn other_value_forms_are_read() {
    let ctx = ParallelContext::from_toml_str(
        "dataset_strategy = \"((2, 1), (2, 1))\"\nmax_device_memory = 1024\n\
         comm_fusion.allreduce.mode = \"size\"\ncomm_fusion.allreduce.config = 32\n",
    )
    .expect("forms");
    assert_eq!(
        ctx.dataset_strategy,
        DatasetStrategy::Explicit(Strategy(vec![vec![2, 1], vec![2, 1]]))
    );
    assert_eq!(ctx.max_device_memory, Some(1024));
    assert_eq!(ctx.comm_fusion, CommFusion::Size(32.0));
    let ctx =
        ParallelContext::from_toml_str("dataset_strategy = \"full_batch\"\n").expect("full batch");
    assert_eq!(ctx.dataset_strategy, DatasetStrategy::FullBatch);
    let ctx =
        ParallelContext::from_toml_str("[comm_fusion.allreduce]\nmode = \"auto\"\n").expect("auto");
    assert_eq!(ctx.comm_fusion, CommFusion::Auto);
}

#[test]
fn round_trip() {
    let full = ParallelContext::from_toml_str(FULL).expect("full");
    let contexts = [
        ParallelContext::default(),
        full.clone(),
        ParallelContext {
            parallel_mode: ParallelMode::AutoParallel,
            search_mode: SearchMode::Ilp,
            device_num: 16,
            global_rank: 15,
            dataset_strategy: DatasetStrategy::FullBatch,
            comm_fusion: CommFusion::Size(0.75),
            max_device_memory: Some(100),
            strategy_ckpt_config: StrategyCkptConfig {
                save_file: Some(PathBuf::from("a \"quoted\" dir\\s.ckpt")),
                ..StrategyCkptConfig::default()
            },
            ..full.clone()
        },
        ParallelContext {
            parallel_mode: ParallelMode::DataParallel,
            device_num: 2,
            dataset_strategy: DatasetStrategy::DataParallel,
            comm_fusion: CommFusion::Auto,
            ..ParallelContext::default()
        },
    ];
    for ctx in contexts {
        let text = ctx.to_toml_string();
        let back = ParallelContext::from_toml_str(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(back, ctx, "{text}");
        assert_eq!(back.to_toml_string(), text);
    }
    assert_eq!(
        full.to_toml_string(),
        "parallel_mode = \"semi_auto_parallel\"\nsearch_mode = \"dynamic_programming\"\n\
         device_num = 8\nglobal_rank = 5\ngradients_mean = true\n\
         dataset_strategy = [[4, 1], [4, 1]]\nenable_alltoall = true\n\
         max_device_memory = \"3584MB\"\nenable_parallel_optimizer = false\n\n\
         [strategy_ckpt_config]\n\
         save_file = \"out/strategy.ckpt\"\nload_file = \"in/strategy.ckpt\"\n\
         only_trainable_params = false\n\n[comm_fusion.allreduce]\nmode = \"index\"\n\
         config = [20, 35]\n\n[parallel_optimizer_config]\n\
         gradient_accumulation_shard = true\nparallel_optimizer_threshold = 64\n\
         optimizer_weight_shard_size = -1\n"
    );
}

#[test]
fn parallel_optimizer_options_read_round_trip_and_validate() {
    let ctx = ParallelContext::from_toml_str(
        "device_num = 8\nenable_parallel_optimizer = true\n\
         [parallel_optimizer_config]\nparallel_optimizer_threshold = 0\n\
         optimizer_weight_shard_size = 4\ngradient_accumulation_shard = false\n",
    )
    .expect("parallel optimizer");
    assert!(ctx.enable_parallel_optimizer);
    assert_eq!(
        ctx.parallel_optimizer_config,
        ParallelOptimizerConfig {
            gradient_accumulation_shard: false,
            parallel_optimizer_threshold: 0,
            optimizer_weight_shard_size: 4,
        }
    );
    let text = ctx.to_toml_string();
    assert_eq!(
        ParallelContext::from_toml_str(&text).expect("round trip"),
        ctx
    );
    for (size, ok) in [
        (-1, true),
        (2, true),
        (8, true),
        (3, false),
        (1, false),
        (0, false),
    ] {
        let r = ParallelContext::from_toml_str(&format!(
            "device_num = 8\n[parallel_optimizer_config]\noptimizer_weight_shard_size = {size}\n"
        ));
        assert_eq!(r.is_ok(), ok, "{size}: {r:?}");
        if let Err(e) = r {
            assert!(
                e.to_string().contains(&format!(
                    "invalid parallel_optimizer_config.optimizer_weight_shard_size `{size}`"
                )),
                "{e}"
            );
        }
    }
    let typo = ParallelContext::from_toml_str("[parallel_optimizer_config]\nthreshold = 1\n")
        .expect_err("unknown key");
    assert!(
        typo.to_string()
            .contains("parallel_optimizer_config.threshold"),
        "{typo}"
    );
}

#[test]
fn validation_errors_name_option_value_and_reason() {
    let cases: &[(&str, &str)] = &[
        (
            "device_num = 0",
            "line 1: invalid device_num `0`: must be at least 1",
        ),
        (
            "device_num = 4\nglobal_rank = 4",
            "line 2: invalid global_rank `4`: must be less than device_num (4)",
        ),
        (
            "global_rank = 1",
            "line 1: invalid global_rank `1`: must be less than device_num (1)",
        ),
        (
            "dataset_strategy = [[2, 0], [2, 1]]",
            "line 1: invalid dataset_strategy `((2, 0), (2, 1))`: split 0 of input 0, \
             dimension 1 is not positive",
        ),
        (
            "dataset_strategy = \"((2, 1), (-2, 1))\"",
            "line 1: invalid dataset_strategy `((2, 1), (-2, 1))`: split -2 of input 1, \
             dimension 0 is not positive",
        ),
        (
            "dataset_strategy = []",
            "line 1: invalid dataset_strategy `()`: an explicit strategy needs at least one input",
        ),
        (
            "[comm_fusion.allreduce]\nmode = \"index\"\nconfig = [20, 35, 35]",
            "line 3: invalid comm_fusion.allreduce.config `[20, 35, 35]`: parameter indices \
             must be strictly increasing, but 35 follows 35",
        ),
        (
            "[comm_fusion.allreduce]\nmode = \"index\"\nconfig = []",
            "line 3: invalid comm_fusion.allreduce.config `[]`: index mode needs at least one \
             parameter index",
        ),
        (
            "[comm_fusion.allreduce]\nmode = \"size\"\nconfig = 0",
            "line 3: invalid comm_fusion.allreduce.config `0`: fusion size in MB must be \
             greater than 0",
        ),
        (
            "[comm_fusion.allreduce]\nmode = \"size\"\nconfig = -1.5",
            "line 3: invalid comm_fusion.allreduce.config `-1.5`: fusion size in MB must be \
             greater than 0",
        ),
    ];
    for (text, msg) in cases {
        assert_eq!(err(text), *msg, "{text}");
    }
}

#[test]
fn stand_alone_on_many_devices_is_allowed_but_not_parallel() {
    let ctx = ParallelContext::from_toml_str("device_num = 8\nglobal_rank = 7").expect("valid");
    assert_eq!(ctx.parallel_mode, ParallelMode::StandAlone);
    assert!(!ctx.is_parallel());
    let ctx = ParallelContext {
        parallel_mode: ParallelMode::DataParallel,
        ..ctx
    };
    assert!(ctx.is_parallel());
}

#[test]
fn key_errors_name_the_key() {
    let cases: &[(&str, &str)] = &[
        (
            "device_num = 2\ndevce_num = 4",
            "line 2: unknown key `devce_num` (did you mean `device_num`?); valid keys: \
             parallel_mode, search_mode, device_num, global_rank, gradients_mean, \
             dataset_strategy, enable_alltoall, max_device_memory, strategy_ckpt_config, \
             comm_fusion, enable_parallel_optimizer, parallel_optimizer_config, pipeline_stages, \
             micro_size, pipeline_config, auto_pipeline",
        ),
        (
            "full_batch = true",
            "line 1: unknown key `full_batch`; valid keys: parallel_mode, search_mode, \
             device_num, global_rank, gradients_mean, dataset_strategy, enable_alltoall, \
             max_device_memory, strategy_ckpt_config, comm_fusion, enable_parallel_optimizer, \
             parallel_optimizer_config, pipeline_stages, micro_size, pipeline_config, auto_pipeline",
        ),
        (
            "[strategy_ckpt_config]\nsave_file = \"a\"\nsvae_file = \"b\"",
            "line 3: unknown key `strategy_ckpt_config.svae_file` (did you mean `save_file`?); \
             valid keys: save_file, load_file, only_trainable_params",
        ),
        (
            "[comm_fusion.allgather]\nmode = \"auto\"",
            "line 1: unknown key `comm_fusion.allgather`; valid keys: allreduce",
        ),
        (
            "[comm_fusion.allreduce]\nmode = \"size\"\nconfg = 3",
            "line 3: unknown key `comm_fusion.allreduce.confg` (did you mean `config`?); \
             valid keys: mode, config",
        ),
        (
            "device_num = \"8\"",
            "line 1: key `device_num`: expected a non-negative integer, found string",
        ),
        (
            "gradients_mean = 1",
            "line 1: key `gradients_mean`: expected a boolean (true or false), found integer",
        ),
        (
            "parallel_mode = 2",
            "line 1: key `parallel_mode`: expected a string, found integer",
        ),
        (
            "strategy_ckpt_config = \"x\"",
            "line 1: key `strategy_ckpt_config`: expected a table, found string",
        ),
        (
            "[strategy_ckpt_config]\nonly_trainable_params = \"yes\"",
            "line 2: key `strategy_ckpt_config.only_trainable_params`: expected a boolean \
             (true or false), found string",
        ),
        (
            "dataset_strategy = [[2, 1], 3]",
            "line 1: key `dataset_strategy`: expected \"data_parallel\", \"full_batch\" or an \
             array of arrays of integers, found integer",
        ),
        (
            "dataset_strategy = true",
            "line 1: key `dataset_strategy`: expected \"data_parallel\", \"full_batch\" or an \
             array of arrays of integers, found boolean",
        ),
        (
            "max_device_memory = 1.5",
            "line 1: key `max_device_memory`: expected a size such as \"16GB\", or an integer \
             number of bytes, found float",
        ),
        (
            "global_rank = -1",
            "line 1: invalid global_rank `-1`: must be a non-negative integer",
        ),
        (
            "parallel_mode = \"semi_auto\"",
            "line 1: unknown parallel_mode `semi_auto`; valid values: stand_alone, \
             data_parallel, semi_auto_parallel, auto_parallel",
        ),
        (
            "\n\nsearch_mode = \"greedy\"",
            "line 3: unknown search_mode `greedy`; valid values: sharding_propagation, \
             dynamic_programming, recursive_programming, ilp",
        ),
        (
            "max_device_memory = \"16XB\"",
            "line 1: invalid max_device_memory `16XB`: unknown unit `XB`; valid units: B, KB, \
             MB, GB, TB",
        ),
        (
            "[comm_fusion.allreduce]\nmode = \"bucket\"",
            "line 2: unknown comm_fusion.allreduce.mode `bucket`; valid values: auto, size, index",
        ),
        (
            "[comm_fusion.allreduce]\nconfig = 32",
            "missing key `comm_fusion.allreduce.mode`: `auto`, `size` or `index` is required \
             in [comm_fusion.allreduce]",
        ),
        (
            "[comm_fusion.allreduce]\nmode = \"size\"",
            "missing key `comm_fusion.allreduce.config`: mode `size` needs a config",
        ),
        (
            "[comm_fusion.allreduce]\nmode = \"auto\"\nconfig = 32",
            "line 3: invalid comm_fusion.allreduce.config `32`: mode `auto` takes no config \
             (it fuses 64 MB buckets)",
        ),
        (
            "[comm_fusion.allreduce]\nmode = \"index\"\nconfig = [1, -2]",
            "line 3: invalid comm_fusion.allreduce.config `[1, -2]`: indices must be \
             non-negative",
        ),
        (
            "[comm_fusion.allreduce]\nmode = \"size\"\nconfig = \"32\"",
            "line 3: key `comm_fusion.allreduce.config`: expected a size in MB, found string",
        ),
    ];
    for (text, msg) in cases {
        assert_eq!(err(text), *msg, "{text}");
    }
}

#[test]
fn errors_expose_their_key() {
    let e = ParallelContext::from_toml_str("device_num = 2\ndevce_num = 4").expect_err("typo");
    assert_eq!(e.key(), Some("devce_num"));
    assert!(matches!(e.root(), ParallelContextError::UnknownKey { .. }));
}

#[test]
fn syntax_errors_are_reported() {
    let msg = err("device_num = = 2");
    assert!(msg.contains("line 1"), "{msg}");
}

#[test]
fn file_errors_carry_the_file_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("ctx.toml");
    std::fs::write(&path, FULL).expect("write");
    assert_eq!(
        ParallelContext::from_toml_file(&path).expect("full"),
        ParallelContext::from_toml_str(FULL).expect("full")
    );

    std::fs::write(&path, "device_num = 4\nglobal_rank = 9\n").expect("write");
    let e = ParallelContext::from_toml_file(&path).expect_err("rank");
    assert_eq!(
        e.to_string(),
        format!(
            "{}:2: invalid global_rank `9`: must be less than device_num (4)",
            path.display()
        )
    );

    std::fs::write(&path, "\nparalel_mode = \"auto_parallel\"\n").expect("write");
    let e = ParallelSettings::from_toml_file(&path).expect_err("typo");
    assert!(
        e.to_string().starts_with(&format!(
            "{}:2: unknown key `paralel_mode` (did you mean `parallel_mode`?)",
            path.display()
        )),
        "{e}"
    );

    std::fs::write(&path, "device_num = [").expect("write");
    let e = ParallelContext::from_toml_file(&path).expect_err("syntax");
    assert!(
        e.to_string().starts_with(&format!("{}: ", path.display())),
        "{e}"
    );

    let missing = dir.path().join("missing.toml");
    let e = ParallelContext::from_toml_file(&missing).expect_err("missing");
    assert!(
        e.to_string()
            .starts_with(&format!("cannot read {}: ", missing.display())),
        "{e}"
    );
}

#[test]
fn settings_layer_and_resolve() {
    let file =
        ParallelSettings::from_toml_str("device_num = 4\ngradients_mean = true").expect("file");
    assert_eq!(file.parallel_mode, None);
    assert_eq!(file.device_num, Some(4));
    let flags = ParallelSettings {
        device_num: Some(8),
        comm_fusion: Some(CommFusion::Size(16.0)),
        ..ParallelSettings::default()
    };
    let ctx = file.override_with(flags).resolve();
    assert_eq!(ctx.device_num, 8);
    assert!(ctx.gradients_mean);
    assert_eq!(ctx.comm_fusion, CommFusion::Size(16.0));
    assert_eq!(ctx.parallel_mode, ParallelMode::StandAlone);
    // Settings are not validated together; the context is.
    let bad = ParallelSettings::from_toml_str("device_num = 0").expect("settings");
    assert!(bad.resolve().validate().is_err());
}

#[test]
fn memory_sizes() {
    assert_eq!(parse_memory_size("16GB").expect("16GB"), 16 << 30);
    assert_eq!(parse_memory_size("512MB").expect("512MB"), 512 << 20);
    assert_eq!(parse_memory_size("3.5GB").expect("3.5GB"), 3584 << 20);
    assert_eq!(parse_memory_size("1 TiB").expect("1 TiB"), 1 << 40);
    assert_eq!(parse_memory_size("64kb").expect("64kb"), 64 << 10);
    assert_eq!(parse_memory_size("100").expect("100"), 100);
    for (text, reason) in [
        ("0GB", "must be greater than 0"),
        ("GB", "expected a size such as `16GB` or `512MB`"),
        ("1.2.3GB", "expected a size such as `16GB` or `512MB`"),
        (
            "16 gigs",
            "unknown unit `gigs`; valid units: B, KB, MB, GB, TB",
        ),
        ("99999999999TB", "size too large"),
    ] {
        assert_eq!(
            parse_memory_size(text).expect_err(text).to_string(),
            format!("invalid max_device_memory `{text}`: {reason}")
        );
    }
    for bytes in [1, 1023, 1024, 3584 << 20, 16 << 30, (1 << 40) + 1] {
        assert_eq!(
            parse_memory_size(&format_memory_size(bytes)).expect("round trip"),
            bytes
        );
    }
    assert_eq!(format_memory_size(16 << 30), "16GB");
    assert_eq!(format_memory_size(3584 << 20), "3584MB");
}

#[test]
fn comm_fusion_text_errors() {
    for (text, msg) in [
        (
            "size:0",
            "invalid comm_fusion.allreduce.config `0`: fusion size in MB must be greater than 0",
        ),
        (
            "size:abc",
            "invalid comm_fusion.allreduce.config `abc`: expected a size in MB, as in `size:32`",
        ),
        (
            "index:35,20",
            "invalid comm_fusion.allreduce.config `[35, 20]`: parameter indices must be \
             strictly increasing, but 20 follows 35",
        ),
        (
            "index:1,-2",
            "invalid comm_fusion.allreduce.config `1,-2`: expected non-negative parameter \
             indices, as in `index:20,35`",
        ),
        (
            "size",
            "invalid comm_fusion `size`: mode `size` needs a config, as in `size:32` or \
             `index:20,35`",
        ),
        (
            "auto:64",
            "invalid comm_fusion.allreduce.config `64`: mode `auto` takes no config (it fuses \
             64 MB buckets)",
        ),
        (
            "sise:32",
            "unknown comm_fusion.allreduce.mode `sise` (did you mean `size`?); valid values: \
             auto, size, index",
        ),
    ] {
        assert_eq!(
            text.parse::<CommFusion>().expect_err(text).to_string(),
            msg,
            "{text}"
        );
    }
    assert_eq!(CommFusion::AUTO_BUCKET_MB, 64.0);
}

#[test]
fn pipeline_options_read_from_toml_and_checked() {
    use shardc_passes::pipeline::Scheduler;
    let ctx = ParallelContext::from_toml_str(
        "parallel_mode = \"semi_auto_parallel\"\ndevice_num = 4\npipeline_stages = 2\nmicro_size = 4\n[pipeline_config]\npipeline_scheduler = \"gpipe\"\n",
    )
    .unwrap();
    assert_eq!(ctx.pipeline.stages, 2);
    assert_eq!(ctx.pipeline.micro_size, 4);
    assert_eq!(ctx.pipeline.scheduler, Scheduler::GPipe);
    assert_eq!(
        ParallelContext::from_toml_str(&ctx.to_toml_string()).unwrap(),
        ctx
    );
    let e = ParallelContext::from_toml_str(
        "parallel_mode = \"semi_auto_parallel\"\ndevice_num = 6\npipeline_stages = 4\nmicro_size = 4\n",
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("pipeline_stages 4 does not divide device_num 6"),
        "{e}"
    );
    let e = ParallelContext::from_toml_str(
        "parallel_mode = \"semi_auto_parallel\"\ndevice_num = 4\npipeline_stages = 2\nmicro_size = 1\n",
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("micro_size 1 is smaller than pipeline_stages 2"),
        "{e}"
    );
    let e = ParallelContext::from_toml_str("pipeline_stages = 2\nmicro_size = 2\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("stand_alone"), "{e}");
    let e = ParallelContext::from_toml_str("[pipeline_config]\npipeline_scheduler = \"zb\"\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("expected 1f1b or gpipe"), "{e}");
}

#[test]
fn auto_pipeline_reads_from_toml_and_excludes_an_explicit_pipeline() {
    let ctx = ParallelContext::from_toml_str(
        "parallel_mode = \"auto_parallel\"\ndevice_num = 4\nauto_pipeline = true\nmax_device_memory = \"1GB\"\n",
    )
    .unwrap();
    assert!(ctx.auto_pipeline);
    assert_eq!(
        ParallelContext::from_toml_str(&ctx.to_toml_string()).unwrap(),
        ctx
    );
    assert!(!ParallelContext::default().auto_pipeline);
    let cases: &[(&str, &str)] = &[
        (
            "parallel_mode = \"semi_auto_parallel\"\ndevice_num = 4\nauto_pipeline = true\n",
            "line 3: invalid auto_pipeline `true`: needs parallel_mode `auto_parallel`, not \
             `semi_auto_parallel`",
        ),
        (
            "parallel_mode = \"auto_parallel\"\ndevice_num = 4\nauto_pipeline = true\npipeline_stages = 2\nmicro_size = 2\n",
            "invalid auto_pipeline `true`: the stage planner chooses pipeline_stages, so \
             pipeline_stages must be left at 1, not 2",
        ),
        (
            "parallel_mode = \"auto_parallel\"\ndevice_num = 4\nauto_pipeline = true\nmicro_size = 4\n",
            "the stage planner chooses micro_size, so micro_size must be left at 1, not 4",
        ),
        (
            "parallel_mode = \"auto_parallel\"\ndevice_num = 4\nauto_pipeline = true\nenable_parallel_optimizer = true\n",
            "enable_parallel_optimizer must be left false, not true",
        ),
        (
            "auto_pipeline = 1\n",
            "key `auto_pipeline`: expected",
        ),
    ];
    for (text, needle) in cases {
        let e = ParallelContext::from_toml_str(text)
            .unwrap_err()
            .to_string();
        assert!(e.contains(needle), "{text}: {e}");
    }
}
