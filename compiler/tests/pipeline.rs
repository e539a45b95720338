//! The pipeline: stages, dumps, errors.

use shardc_compiler::optim::{Adam, Momentum, SGD};
use shardc_compiler::pipeline::{compile, pass_names, CompileError, CompileOptions};
use shardc_compiler::{model, zoo};
use shardc_ir::text::parse_graph;
use shardc_ir::{OpKind, Type};

#[test]
fn forward_only_runs_infer_types() {
    let g = zoo::quickstart(16).unwrap();
    let c = compile(g.clone(), &CompileOptions::default()).unwrap();
    let names: Vec<&str> = c.stages.iter().map(|s| s.name).collect();
    assert_eq!(names, ["infer_types"]);
    assert_eq!(c.graph, g);
    assert_eq!(pass_names(), ["infer_types", "autodiff"]);
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
    let c = compile(parsed, &opts).unwrap();
    let stages: Vec<(usize, &str)> = c.stages.iter().map(|s| (s.index, s.name)).collect();
    assert_eq!(stages, [(0, "infer_types"), (1, "autodiff")]);
    // After type inference every node has its type.
    let first = &c.stages[0].graph;
    assert!(first.nodes.iter().all(|n| n.ty != Type::Tuple(Vec::new())));
    assert!(c.graph.nodes.iter().any(|n| n.op == OpKind::ApplyMomentum));
    assert_eq!(c.graph, c.stages[1].graph);

    let mut files: Vec<String> = std::fs::read_dir(dir.path().join("saved_graph"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    files.sort();
    assert_eq!(files.len(), 3, "{files:?}");
    assert!(
        files[2].starts_with("04_execute_") && files[2].ends_with(".ir"),
        "{files:?}"
    );
    assert!(
        files[0].starts_with("00_infer_types_") && files[0].ends_with(".ir"),
        "{files:?}"
    );
    assert!(
        files[1].starts_with("01_autodiff_") && files[1].ends_with(".ir"),
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
