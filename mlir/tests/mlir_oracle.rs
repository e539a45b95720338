//! Every test that links MLIR (melior; about 230 MB a binary), in one binary.
//!
//! - the export of a real model's training step (models/quickstart.ir on 8 devices, logical
//!   and every rank) passes MLIR's verifier;
//! - the oracle grid: programs x strategies x 2, 4, 8 devices, shardc's partition against
//!   MLIR's shard-partition, values and collective bytes;
//! - a wrong slice on either side makes the comparison fail.

use shardc_compiler::pipeline::{self, CompileOptions};
use shardc_ir::text::parse_graph;
use shardc_ir::{Graph, Init, ParamKind};
use shardc_mlir::export::{logical_module, plan_grid, rank_module};
use shardc_mlir::mlir::MlirError;
use shardc_mlir::mlir::{partition, verify};
use shardc_mlir::oracle::{compare_with, plan_module, Hooks, OracleError};
use shardc_passes::autodiff::Optimizer;
use shardc_passes::parallel::{DatasetLayout, Mode, ParallelOptions};

const TOL: f64 = 1e-5;

fn popts(n: usize) -> ParallelOptions {
    ParallelOptions {
        mode: Mode::SemiAutoParallel,
        device_num: n,
        dataset: DatasetLayout::DataParallel,
        gradients_mean: true,
        enable_alltoall: false,
        search: Default::default(),
        parallel_optimizer: None,
    }
}

fn quickstart() -> Graph {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../models/quickstart.ir");
    let src = std::fs::read_to_string(path).expect("models/quickstart.ir");
    parse_graph(&src, "quickstart.ir").expect("parses")
}

#[test]
fn quickstart_training_step_exports_and_verifies() {
    let mut g = quickstart();
    shardc_passes::infer::infer_graph(&mut g).expect("infers");
    let compiled = pipeline::compile(
        g,
        &CompileOptions {
            optimizer: Some(Optimizer::Momentum {
                learning_rate: 0.01,
                momentum: 0.9,
                use_nesterov: false,
            }),
            parallel: Some(popts(8)),
            ..Default::default()
        },
    )
    .expect("compiles");
    let par = compiled.parallel.expect("parallel");
    let logical = logical_module(&par.begin, Some(&par.assignment)).expect("exports");
    verify(&logical).unwrap_or_else(|e| panic!("{e}\n{logical}"));
    assert!(logical.contains("shard.grid @grid0"));
    assert!(logical.contains("annotate_for_users"));
    let plain = logical_module(&par.begin, None).expect("exports");
    verify(&plain).unwrap_or_else(|e| panic!("{e}\n{plain}"));
    let grid = plan_grid(&par.begin, &par.assignment).expect("grid");
    let mut collectives = 0;
    for (rank, g) in par.rank_ids.iter().zip(&par.ranks) {
        let text = rank_module(g, *rank, &grid).expect("exports");
        verify(&text).unwrap_or_else(|e| panic!("rank {rank}: {e}\n{text}"));
        collectives += text.matches("= shard.").count();
    }
    assert!(collectives > 0, "the ranks' graphs hold no collective");
    println!(
        "quickstart training step on 8 devices (grid {}): logical {} lines, {} rank modules, {collectives} shard collectives, all verified",
        grid.text_shape(),
        logical.lines().count(),
        par.ranks.len()
    );
    // A bad plan is an error naming the op, not a panic.
    let bad = shardc_ir::TensorLayout {
        dev_matrix: vec![3],
        tensor_map: vec![0, -1],
        tensor_shape: vec![16, 32],
        partial: vec![],
        partial_op: shardc_ir::ReduceOp::Sum,
    };
    let mut a = par.assignment.clone();
    a.param_layouts[0] = bad;
    let e = logical_module(&par.begin, Some(&a)).unwrap_err();
    assert!(e.to_string().contains("device"), "{e}");
}

/// `v` without repeats, in order.
fn uniq(v: Vec<String>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for s in v {
        if !out.contains(&s) {
            out.push(s);
        }
    }
    out
}

/// The programs of the grid: (name, .ir text) for `n` devices, one per strategy.
fn programs(n: usize) -> Vec<(String, String)> {
    let half = n / 2;
    let head = |params: &str| format!("#IR entry : @Net\n{params}\n");
    let w = |name: &str, k: usize, shape: &str| {
        format!("%para{k}_{name} : <Ref[Tensor(F32)], ({shape}), ref_key=:{name}>  :  has_default  init: normal(sigma=0.5, seed={k})\n")
    };
    let x = |name: &str, k: usize, shape: &str| {
        format!("%para{k}_{name} : <Tensor[Float32], ({shape})>\n")
    };
    let mut out = Vec::new();
    // MatMul and an MLP, with several strategies of the first MatMul.
    let mm = [
        format!("(({n}, 1), (1, 1))"),
        format!("((1, {n}), ({n}, 1))"),
        format!("((2, {half}), ({half}, 1))"),
        format!("((1, 1), (1, {n}))"),
        format!("((2, 1), (1, {half}))"),
    ];
    for s in &uniq(mm.to_vec()) {
        out.push((
            format!("matmul {s}"),
            format!(
                "{}subgraph @Net(%para1_x, %para2_w) {{\n  %1(out) = MatMul(%para1_x, %para2_w) {{instance name: matmul}} primitive_attrs: {{transpose_a: false, transpose_b: false, in_strategy: {s}}}\n  Return(%1)\n}}\n",
                head(&(x("x", 1, "16, 32") + &w("w", 2, "32, 16")))
            ),
        ));
        out.push((
            format!("mlp {s}"),
            format!(
                "{}subgraph @Net(%para1_x, %para2_w, %para3_w2) {{\n  %1(out) = MatMul(%para1_x, %para2_w) {{instance name: matmul}} primitive_attrs: {{in_strategy: {s}}}\n  %2(out) = ReLU(%1) {{instance name: relu}}\n  %3(out) = MatMul(%2, %para3_w2) {{instance name: matmul2}}\n  Return(%3)\n}}\n",
                head(&(x("x", 1, "16, 32") + &w("w", 2, "32, 16") + &w("w2", 3, "16, 16")))
            ),
        ));
    }
    // MatMul with a transposed weight.
    for s in uniq(vec![
        format!("((2, {half}), (1, {half}))"),
        format!("(({n}, 1), (1, 1))"),
        format!("((1, 1), ({n}, 1))"),
    ]) {
        out.push((
            format!("matmul_tb {s}"),
            format!(
                "{}subgraph @Net(%para1_x, %para2_w) {{\n  %1(out) = MatMul(%para1_x, %para2_w) {{instance name: matmul}} primitive_attrs: {{transpose_a: false, transpose_b: true, in_strategy: {s}}}\n  Return(%1)\n}}\n",
                head(&(x("x", 1, "16, 32") + &w("w", 2, "16, 32")))
            ),
        ));
    }
    // Elementwise with a broadcast bias.
    for s in uniq(vec![
        format!("((2, {half}), ({half}))"),
        format!("(({n}, 1), (1))"),
        format!("((1, {n}), ({n}))"),
    ]) {
        out.push((
            format!("elementwise {s}"),
            format!(
                "{}subgraph @Net(%para1_x, %para2_b) {{\n  %1(out) = Add(%para1_x, %para2_b) {{instance name: add}} primitive_attrs: {{in_strategy: {s}}}\n  %2(out) = Exp(%1) {{instance name: exp}}\n  %3(out) = Mul(%2, %para1_x) {{instance name: mul}}\n  %4(out) = Sub(%3, %para1_x) {{instance name: sub}}\n  Return(%4)\n}}\n",
                head(&(x("x", 1, "16, 32") + &w("b", 2, "32")))
            ),
        ));
    }
    // Reductions after a MatMul.
    for (op, axes) in [
        ("ReduceSum", "(1)"),
        ("ReduceMax", "(1)"),
        ("ReduceMean", "(0)"),
        ("ReduceSum", "(0, 1)"),
    ] {
        for s in [
            format!("((2, {half}))"),
            format!("(({n}, 1))"),
            format!("((1, {n}))"),
        ] {
            out.push((
                format!("{op}{axes} {s}"),
                format!(
                    "{}subgraph @Net(%para1_x, %para2_w) {{\n  %1(out) = MatMul(%para1_x, %para2_w) {{instance name: matmul}} primitive_attrs: {{in_strategy: ((2, {half}), ({half}, 1))}}\n  %2(out) = {op}(%1, {axes}) {{instance name: reduce}} primitive_attrs: {{keep_dims: false, in_strategy: {s}}}\n  Return(%2)\n}}\n",
                    head(&(x("x", 1, "16, 32") + &w("w", 2, "32, 16")))
                ),
            ));
        }
    }
    // BatchMatMul.
    for s in uniq(vec![
        format!("(({n}, 1, 1), ({n}, 1, 1))"),
        format!("((2, 1, {half}), (2, {half}, 1))"),
        format!("((1, {n}, 1), (1, 1, 1))"),
    ]) {
        out.push((
            format!("batch_matmul {s}"),
            format!(
                "{}subgraph @Net(%para1_a, %para2_b) {{\n  %1(out) = BatchMatMul(%para1_a, %para2_b) {{instance name: bmm}} primitive_attrs: {{in_strategy: {s}}}\n  Return(%1)\n}}\n",
                head(&(x("a", 1, "8, 8, 16") + &w("b", 2, "8, 16, 8")))
            ),
        ));
    }
    out
}

#[test]
fn oracle_grid_shardc_and_mlir_partition_alike() {
    let mut total = 0;
    let mut agreed = 0;
    let mut disagreed = Vec::new();
    let mut not_partitioned = Vec::new();
    let mut other_errors = Vec::new();
    let mut fewer = std::collections::BTreeMap::<&'static str, usize>::new();
    let mut differing = Vec::new();
    for (inputs, dataset) in [
        ("data-parallel inputs", None),
        ("full-batch inputs", Some(DatasetLayout::FullBatch)),
    ] {
        for n in [2, 4, 8] {
            for (name, src) in programs(n) {
                let name = format!("{name} [{inputs}]");
                total += 1;
                let g = parse_graph(&src, &name).unwrap_or_else(|e| panic!("{name}: {e}"));
                if let Ok(dir) = std::env::var("SHARDC_MLIR_DUMP") {
                    let text =
                        plan_module(&g, n, dataset.clone()).unwrap_or_else(|e| format!("// {e}"));
                    let file = format!(
                        "{dir}/{}_x{n}.mlir",
                        name.replace([' ', '(', ')', ','], "_")
                    );
                    std::fs::write(&file, text).unwrap_or_else(|e| panic!("{file}: {e}"));
                    eprintln!("dumped {file}");
                }
                match compare_with(&g, n, TOL, &isolated_hooks(dataset.clone())) {
                    Ok(r) => {
                        println!("{name} x{n}: {}", r.summary());
                        if r.passed() {
                            agreed += 1;
                        } else {
                            disagreed.push(format!("{name} x{n}: {}", r.summary()));
                        }
                        *fewer.entry(r.fewer_bytes()).or_default() += 1;
                        if r.fewer_bytes() != "equal" {
                            differing.push(format!(
                                "{name} x{n}: shardc {} B, MLIR {} B -> {} moves fewer",
                                r.shardc_bytes(),
                                r.mlir_bytes(),
                                r.fewer_bytes()
                            ));
                        }
                    }
                    Err(e @ (OracleError::Mlir(_) | OracleError::MlirResult(_))) => {
                        not_partitioned.push(format!("{name} x{n}: {e}"))
                    }
                    Err(e) => other_errors.push(format!("{name} x{n}: {e}")),
                }
            }
        }
    }
    println!("\n== oracle grid: {total} cases (programs x strategies x 2, 4, 8 devices x data-parallel / full-batch inputs)");
    let reason = |m: &String| {
        if m.contains("shard-partition crashed") {
            "crashed"
        } else if m.contains("MLIR's partition:") {
            "wrong result"
        } else {
            "error"
        }
    };
    let mut reasons = std::collections::BTreeMap::<&'static str, usize>::new();
    for m in &not_partitioned {
        *reasons.entry(reason(m)).or_default() += 1;
    }
    println!(
        "compared: {}, agree: {agreed}, disagree: {}, MLIR could not partition: {} {reasons:?}, other errors: {}",
        agreed + disagreed.len(),
        disagreed.len(),
        not_partitioned.len(),
        other_errors.len()
    );
    println!("fewer bytes: {fewer:?}");
    for d in &differing {
        println!("  bytes differ: {d}");
    }
    for m in &not_partitioned {
        println!("  MLIR could not partition: {m}");
    }
    for e in &other_errors {
        println!("  error: {e}");
    }
    assert!(
        disagreed.is_empty(),
        "disagreements:\n{}",
        disagreed.join("\n")
    );
    assert!(
        other_errors.is_empty(),
        "errors:\n{}",
        other_errors.join("\n")
    );
    assert!(
        agreed * 10 >= total * 9,
        "fewer than 90% of the grid compared: {agreed} of {total}"
    );
}

#[test]
fn a_two_step_resharding_is_exported_as_steps_mlir_partitions() {
    let (name, src) = programs(4)
        .into_iter()
        .find(|(n, _)| n.starts_with("matmul ((2, 2), (2, 1))"))
        .expect("the matmul program");
    let g = parse_graph(&src, &name).expect("parses");
    // The data-parallel input [[0, 1]] goes to the strategy's [[0], [1]] through [[0], []].
    let text = plan_module(&g, 4, None).expect("exports");
    assert!(text.contains("one step of MLIR's resharding"), "{text}");
    assert!(text.contains("split_axes = [[0], []]"), "{text}");
    let out = isolated(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert!(out.contains("shard.all_gather"), "{out}");
    assert!(out.contains("shard.all_slice"), "{out}");
}

#[test]
fn a_wrong_slice_in_shardc_fails_the_comparison() {
    let (name, src) = programs(4)
        .into_iter()
        .find(|(n, _)| n.starts_with("mlp ((1, 4)"))
        .expect("the mlp program");
    let g = parse_graph(&src, &name).expect("parses");
    // Rank 1's block of `w` starts one row further down than the plan says.
    let shift = |ranks: &mut [Graph]| {
        for p in ranks[1].params.iter_mut() {
            if let ParamKind::Weight {
                init:
                    Init::Block {
                        offset,
                        global_shape,
                        ..
                    },
                ..
            } = &mut p.kind
            {
                if p.name == "w" && offset[0] + p.ty.shape[0] < global_shape[0] {
                    offset[0] += 1;
                } else if p.name == "w" && offset[0] > 0 {
                    offset[0] -= 1;
                }
            }
        }
    };
    let full = Some(DatasetLayout::FullBatch);
    let honest = compare_with(&g, 4, TOL, &isolated_hooks(full.clone())).expect("compares");
    assert!(honest.passed(), "{}", honest.summary());
    let r = compare_with(
        &g,
        4,
        TOL,
        &Hooks {
            shardc: Some(&shift),
            mlir: None,
            partition: Some(&isolated),
            dataset: full,
        },
    )
    .expect("compares");
    println!("tampered shardc: {}", r.summary());
    assert!(
        !r.passed(),
        "a shifted slice went unnoticed: {}",
        r.summary()
    );
    let m = r.mismatch.expect("a mismatch");
    assert!(
        m.contains("rank") && m.contains("shardc") && m.contains("MLIR"),
        "{m}"
    );
}

#[test]
fn a_wrong_slice_in_mlirs_partition_fails_the_comparison() {
    let (name, src) = programs(4)
        .into_iter()
        .find(|(n, _)| n.starts_with("mlp ((1, 4)"))
        .expect("the mlp program");
    let g = parse_graph(&src, &name).expect("parses");
    // MLIR's first all_slice becomes a tensor.extract_slice at offset 0 on every rank: the
    // same shapes, rank 0's block everywhere.
    let wrong = |text: &str| -> String {
        let mut out = String::new();
        let mut done = false;
        for l in text.lines() {
            let parts = l.split_once(" = shard.all_slice ").and_then(|(lhs, rest)| {
                let src = rest.split_whitespace().next()?;
                let (tin, tout) = rest.rsplit_once(" : ")?.1.split_once(" -> ")?;
                let dims: Vec<&str> = tout
                    .trim_start_matches("tensor<")
                    .trim_end_matches('>')
                    .split('x')
                    .collect();
                let sizes = dims[..dims.len() - 1].join(", ");
                let zeros = vec!["0"; dims.len() - 1].join(", ");
                let ones = vec!["1"; dims.len() - 1].join(", ");
                Some(format!(
                    "{lhs} = tensor.extract_slice {src}[{zeros}] [{sizes}] [{ones}] : {tin} to {tout}"
                ))
            });
            match parts {
                Some(p) if !done => {
                    out.push_str(&p);
                    done = true;
                }
                _ => out.push_str(l),
            }
            out.push('\n');
        }
        assert!(
            done,
            "MLIR's partition has no all_slice to corrupt:\n{text}"
        );
        out
    };
    let r = compare_with(
        &g,
        4,
        TOL,
        &Hooks {
            shardc: None,
            mlir: Some(&wrong),
            partition: Some(&isolated),
            dataset: Some(DatasetLayout::FullBatch),
        },
    )
    .expect("compares");
    println!("tampered MLIR: {}", r.summary());
    assert!(!r.passed(), "a wrong slice went unnoticed: {}", r.summary());
    let m = r.mismatch.expect("a mismatch");
    assert!(m.contains("rank") && m.contains("MLIR"), "{m}");
}

#[test]
fn partition_errors_carry_mlirs_diagnostics() {
    let e = verify("module { func.func @f() { %0 = arith.addf } }").unwrap_err();
    assert!(!e.diagnostics.is_empty(), "{e}");
    let e = partition("module { func.func @f(%a: tensor<4xf32>) -> tensor<4xf32> { %s = shard.sharding @nogrid split_axes = [[0]] : !shard.sharding\n %b = shard.shard %a to %s : tensor<4xf32>\n return %b : tensor<4xf32> } }").unwrap_err();
    assert!(e.to_string().contains("nogrid"), "{e}");
}

/// MLIR's partition of `text` in a child process (this test binary, running
/// `partition_child`): MLIR 22's shard-partition dies of SIGSEGV on some reshardings, which
/// must fail one case, not the whole grid.
fn isolated(text: &str) -> Result<String, MlirError> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static K: AtomicUsize = AtomicUsize::new(0);
    let k = K.fetch_add(1, Ordering::SeqCst);
    let dir = std::env::temp_dir();
    let input = dir.join(format!("shardc-mlir-{}-{k}.mlir", std::process::id()));
    let output = input.with_extension("out");
    let err = |stage: &str, d: String| MlirError {
        stage: stage.to_string(),
        diagnostics: vec![d],
    };
    std::fs::write(&input, text).map_err(|e| err("child", e.to_string()))?;
    let exe = std::env::current_exe().map_err(|e| err("child", e.to_string()))?;
    let run = std::process::Command::new(exe)
        .args([
            "--exact",
            "partition_child",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env("SHARDC_MLIR_CHILD_IN", &input)
        .env("SHARDC_MLIR_CHILD_OUT", &output)
        .output()
        .map_err(|e| err("child", e.to_string()))?;
    let _ = std::fs::remove_file(&input);
    let result = std::fs::read_to_string(&output);
    let _ = std::fs::remove_file(&output);
    if !run.status.success() {
        let stderr = String::from_utf8_lossy(&run.stderr);
        let frame = stderr
            .lines()
            .find(|l| l.contains("mlir::shard::") || l.contains("mlir::"))
            .unwrap_or("")
            .trim()
            .chars()
            .take(160)
            .collect::<String>();
        return Err(err(
            "shard-partition crashed",
            format!("{} {frame}", run.status),
        ));
    }
    let r = result.map_err(|e| err("child", e.to_string()))?;
    match r.strip_prefix("ERR ") {
        Some(e) => Err(err("shard-partition", e.to_string())),
        None => Ok(r),
    }
}

fn isolated_hooks(dataset: Option<DatasetLayout>) -> Hooks<'static> {
    Hooks {
        partition: Some(&isolated),
        dataset,
        ..Default::default()
    }
}

/// The child of [`isolated`]; does nothing in a plain test run.
#[test]
fn partition_child() {
    let (Ok(input), Ok(output)) = (
        std::env::var("SHARDC_MLIR_CHILD_IN"),
        std::env::var("SHARDC_MLIR_CHILD_OUT"),
    ) else {
        return;
    };
    let text = std::fs::read_to_string(&input).expect("the child's input");
    let out = match partition(&text) {
        Ok(t) => t,
        Err(e) => format!("ERR {e}"),
    };
    std::fs::write(&output, out).expect("the child's output");
}
