//! The pipeline: stages, dumps, errors.

use shardc_compiler::optim::{Adam, Momentum, SGD};
use shardc_compiler::pipeline::{
    compile, compile_until, pass_index, pass_names, CompileError, CompileOptions,
};
use shardc_compiler::{model, zoo};
use shardc_ir::text::parse_graph;
use shardc_ir::{OpKind, Type};

#[test]
fn forward_only_runs_infer_types() {
    let g = zoo::quickstart(16).unwrap();
    let c = compile(g.clone(), &CompileOptions::default()).unwrap();
    let names: Vec<&str> = c.stages.iter().map(|s| s.name).collect();
    assert_eq!(names, ["infer_types", "execute"]);
    assert_eq!(c.graph, g);
    assert_eq!(
        pass_names(),
        [
            "infer_types",
            "micro_batch",
            "autodiff",
            "recompute",
            "sync_bn",
            "step_parallel_begin",
            "step_parallel_end",
            "pipeline_split",
            "grad_fusion",
            "execute"
        ]
    );
    assert_eq!(pass_index("execute"), Some(9));
    assert_eq!(pass_index("partition"), None);
}

#[test]
fn parsed_model_compiles_to_a_training_step_with_dumps() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../models/quickstart.ir");
    let text = std::fs::read_to_string(path).unwrap();
    let parsed = parse_graph(&text, "quickstart.ir").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let opts = CompileOptions {
        optimizer: Some(Momentum::new(0.2, 0.1).to_spec()),
        dump_dir: Some(dir.path().join("saved_graph")),
        ..Default::default()
    };
    let c = compile(parsed.clone(), &opts).unwrap();
    let plain = CompileOptions {
        dump_dir: None,
        ..opts.clone()
    };
    let stages: Vec<(usize, &str)> = c.stages.iter().map(|s| (s.index, s.name)).collect();
    assert_eq!(
        stages,
        [
            (0, "infer_types"),
            (2, "autodiff"),
            (3, "recompute"),
            (9, "execute")
        ]
    );
    // After type inference every node has its type.
    let (after_infer, _) = compile_until(parsed.clone(), &plain, "infer_types").unwrap();
    let first = &after_infer.graph;
    assert!(first.nodes.iter().all(|n| n.ty != Type::Tuple(Vec::new())));
    assert!(c.graph.nodes.iter().any(|n| n.op == OpKind::ApplyMomentum));
    let (after_autodiff, _) = compile_until(parsed, &plain, "autodiff").unwrap();
    assert_eq!(c.graph, after_autodiff.graph);

    let mut files: Vec<String> = std::fs::read_dir(dir.path().join("saved_graph"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    files.sort();
    assert_eq!(files.len(), 4, "{files:?}");
    assert!(
        files[3].starts_with("09_execute_") && files[3].ends_with(".ir"),
        "{files:?}"
    );
    assert!(
        files[0].starts_with("00_infer_types_") && files[0].ends_with(".ir"),
        "{files:?}"
    );
    assert!(
        files[1].starts_with("02_autodiff_") && files[1].ends_with(".ir"),
        "{files:?}"
    );
    let counter = |f: &str| -> usize {
        f.trim_end_matches(".ir")
            .rsplit('_')
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    assert_eq!(
        files[0]
            .trim_end_matches(".ir")
            .rsplit('_')
            .next()
            .unwrap()
            .len(),
        4
    );
    assert!(counter(&files[1]) > counter(&files[0]));
    // Each dump parses back into the graph of its stage.
    let dumped = std::fs::read_to_string(dir.path().join("saved_graph").join(&files[0])).unwrap();
    assert!(dumped.contains("{instance name: matmul}"));
    let mut back = parse_graph(&dumped, &files[0]).unwrap();
    shardc_passes::infer::infer_graph(&mut back).unwrap();
    assert_eq!(back.nodes.len(), first.nodes.len());
}

#[test]
fn every_optimizer_builds_a_step() {
    let g = zoo::mlp(8, &[20, 16, 10]).unwrap();
    for (opt, op) in [
        (Momentum::new(0.1, 0.9).to_spec(), OpKind::ApplyMomentum),
        (SGD::new(0.1).momentum(0.9).to_spec(), OpKind::SGD),
        (Adam::new(1e-3).to_spec(), OpKind::Adam),
    ] {
        let step = model::train_graph(&g, &opt).unwrap();
        let n = step.nodes.iter().filter(|n| n.op == op).count();
        assert_eq!(n, 4, "{op}: one update per trainable weight");
    }
}

#[test]
fn bad_optimizer_numbers_are_errors() {
    let g = zoo::quickstart(16).unwrap();
    let err = model::train_graph(&g, &Momentum::new(f64::NAN, 0.9)).unwrap_err();
    assert!(
        matches!(err, CompileError::InvalidOptimizer { .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("learning_rate"), "{err}");
}

#[test]
fn bad_parsed_graphs_fail_with_the_stage_named() {
    let text = "%para1_x : <Tensor[Float32], (4, 3)>\n%para2_w : <Ref[Tensor(F32)], (4, 3), ref_key=:w>  :  has_default  init: zeros\n\nsubgraph @Net(%para1_x, %para2_w) {\n  %1(out) = MatMul(%para1_x, %para2_w) {instance name: matmul}\n  Return(%1)\n}\n";
    let g = parse_graph(text, "bad.ir").unwrap();
    let err = compile(g, &CompileOptions::default())
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("infer_types"), "{err}");
    assert!(err.contains("matmul"), "{err}");
}

fn parallel_options(device_num: usize) -> shardc_passes::parallel::ParallelOptions {
    use shardc_passes::parallel::{DatasetLayout, Mode, ParallelOptions};
    ParallelOptions {
        mode: Mode::SemiAutoParallel,
        device_num,
        dataset: DatasetLayout::DataParallel,
        gradients_mean: true,
        enable_alltoall: false,
        search: Default::default(),
        parallel_optimizer: None,
    }
}

#[test]
fn a_parallel_compile_runs_every_pass_of_the_one_list_and_dumps_by_its_index() {
    let g = zoo::quickstart(16).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let opts = CompileOptions {
        optimizer: Some(Momentum::new(0.2, 0.1).to_spec()),
        parallel: Some(parallel_options(8)),
        dump_dir: Some(dir.path().to_path_buf()),
        materialize: shardc_compiler::pipeline::Materialize::Ranks(vec![3, 5]),
        ..Default::default()
    };
    let c = compile(g, &opts).unwrap();
    let ran: Vec<(usize, &str)> = c.stages.iter().map(|s| (s.index, s.name)).collect();
    // Every pass but the pipeline's (no stages, no micro-batches).
    let all: Vec<(usize, &str)> = pass_names()
        .into_iter()
        .enumerate()
        .filter(|(_, n)| !matches!(*n, "micro_batch" | "pipeline_split"))
        .collect();
    assert_eq!(ran, all);
    assert!(c.stages.iter().all(|s| s.seconds >= 0.0));
    let p = c.parallel.unwrap();
    assert_eq!(p.rank_ids, [3, 5]);
    let mut top: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    top.sort();
    let prefixes: Vec<&str> = top.iter().map(|n| &n[..n.len().min(8)]).collect();
    assert_eq!(
        prefixes,
        ["00_infer", "02_autod", "03_recom", "04_sync_", "rank_3", "rank_5"],
        "{top:?}"
    );
    for r in [3, 5] {
        let mut names: Vec<String> = std::fs::read_dir(dir.path().join(format!("rank_{r}")))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .collect();
        names.sort();
        let stems: Vec<&str> = names.iter().map(|n| &n[..n.len() - 8]).collect();
        assert_eq!(
            stems,
            ["09_execute", "step_parallel_begin", "step_parallel_end"],
            "{names:?}"
        );
    }
}

#[test]
fn compile_until_stops_after_the_named_pass() {
    let g = zoo::quickstart(16).unwrap();
    let opts = CompileOptions {
        optimizer: Some(Momentum::new(0.2, 0.1).to_spec()),
        parallel: Some(parallel_options(8)),
        ..Default::default()
    };
    let (state, records) = compile_until(g.clone(), &opts, "step_parallel_begin").unwrap();
    assert_eq!(records.last().unwrap().name, "step_parallel_begin");
    assert!(state.assignment.is_some() && state.begin.is_some());
    assert!(state.unfused.is_none() && state.program.is_none() && state.ranks.is_empty());
    let err = compile_until(g, &opts, "partition").unwrap_err();
    assert!(matches!(err, CompileError::UnknownPass { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        "no pass named `partition`; the passes are infer_types, micro_batch, autodiff, recompute, \
         sync_bn, step_parallel_begin, step_parallel_end, pipeline_split, grad_fusion, execute"
    );
}

#[test]
fn the_verifier_is_on_in_tests_and_reports_every_violation() {
    assert!(
        CompileOptions::default().verify,
        "debug builds (tests) verify every pass"
    );
    // Two broken nodes: both are named, not only the first.
    let text = "%para1_x : <Tensor[Float32], (4, 3)>\n\nsubgraph @Net(%para1_x) {\n  %1(a) = ReLU(%para1_x) {instance name: relu} primitive_attrs: {out_strategy: ((0, 1))}\n  %2(b) = ReLU(%1) {instance name: relu}\n  Return(%2)\n}\n";
    let g = parse_graph(text, "two.ir").unwrap();
    let err = compile(g, &CompileOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("infer_types: graph `Net` failed verification: verify: 2 violations:"),
        "{err}"
    );
    assert!(
        err.contains("%1 ReLU 'relu': out_strategy ((0, 1)) has the split count 0"),
        "{err}"
    );
    assert!(
        err.contains("%2 ReLU 'relu': instance name 'relu' is already used by %1 ReLU 'relu'"),
        "{err}"
    );
}

#[test]
fn a_pipelined_compile_runs_every_pass_and_dumps_each_ranks_stage() {
    use shardc_passes::pipeline::PipelineOptions;
    // quickstart's MatMul is annotated for 8 devices: one stage's mesh of 16 / 2.
    let g = zoo::quickstart(16).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let opts = CompileOptions {
        optimizer: Some(Momentum::new(0.2, 0.1).to_spec()),
        parallel: Some(parallel_options(16)),
        dump_dir: Some(dir.path().to_path_buf()),
        materialize: shardc_compiler::pipeline::Materialize::Ranks(vec![1, 14]),
        pipeline: PipelineOptions {
            stages: 2,
            micro_size: 2,
            ..Default::default()
        },
        ..Default::default()
    };
    let c = compile(g, &opts).unwrap();
    let ran: Vec<(usize, &str)> = c.stages.iter().map(|s| (s.index, s.name)).collect();
    let all: Vec<(usize, &str)> = pass_names().into_iter().enumerate().collect();
    assert_eq!(ran, all);
    let p = c.parallel.unwrap();
    assert_eq!(p.program.stage_count(), 2);
    assert_eq!(p.program.stage_of(1).unwrap(), 0);
    assert_eq!(p.program.stage_of(14).unwrap(), 1);
    // The lifted layouts cover all 16 devices, the stage axis major.
    assert!(p
        .param_layouts
        .iter()
        .all(|l| l.device_num() == 16 && l.dev_matrix[0] == 2));
    for r in [1, 14] {
        let mut names: Vec<String> = std::fs::read_dir(dir.path().join(format!("rank_{r}")))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .collect();
        names.sort();
        let stems: Vec<&str> = names.iter().map(|n| &n[..n.len() - 8]).collect();
        assert_eq!(
            stems,
            [
                "09_execute",
                "pipeline_split",
                "step_parallel_begin",
                "step_parallel_end"
            ],
            "{names:?}"
        );
    }
}
