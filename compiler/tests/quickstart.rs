//! The quickstart tutorial's net, built with the builder, against `models/quickstart.ir`.

use shardc_compiler::builder::GraphBuilder;
use shardc_compiler::{init, ops, zoo};
use shardc_ir::text::parse_graph;
use shardc_ir::{DType, Graph, OpKind, ParamKind, Strategy};

fn model_text() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../models/quickstart.ir");
    std::fs::read_to_string(path).expect("models/quickstart.ir is part of the repository")
}

/// The net written out with the builder and `ops`, as a user would (no cells, no helpers).
fn hand_built() -> Graph {
    let mut b = GraphBuilder::new("Net");
    let x = b.input("x", DType::Float32, &[16, 32]).unwrap();
    let label = b.input("label", DType::Float32, &[16, 16]).unwrap();
    b.push_scope("Default");
    b.push_scope("network-WithLossCell");
    b.push_scope("_backbone-Net");
    let w = b
        .weight("w", DType::Float32, &[32, 16], init::normal(0.01))
        .unwrap();
    let w2 = b
        .weight("w2", DType::Float32, &[16, 16], init::normal(0.01))
        .unwrap();
    let out = ops::MatMul::new()
        .shard(((2, 4), (4, 1)))
        .call(&mut b, x, w)
        .unwrap();
    let out = b.relu(out).unwrap();
    let out = b.matmul(out, w2).unwrap();
    b.pop_scope();
    b.push_scope("_loss_fn-MSELoss");
    let diff = b.sub(out, label).unwrap();
    let sq = b.square(diff).unwrap();
    let loss = b.reduce_mean(sq, &[0, 1], false).unwrap();
    b.finish(&[loss]).unwrap()
}

/// (op, instance, scope, output shape) of every node.
fn summary(g: &Graph) -> Vec<(OpKind, String, String, Vec<usize>)> {
    g.nodes
        .iter()
        .map(|n| {
            (
                n.op,
                n.instance.clone(),
                n.scope.clone(),
                n.ty.as_tensor()
                    .map(|t| t.shape.clone())
                    .unwrap_or_default(),
            )
        })
        .collect()
}

fn params(g: &Graph) -> Vec<(String, DType, Vec<usize>, bool)> {
    g.params
        .iter()
        .map(|p| {
            (
                p.name.clone(),
                p.ty.dtype,
                p.ty.shape.clone(),
                p.is_weight(),
            )
        })
        .collect()
}

#[test]
fn hand_built_net_matches_the_model_file() {
    let built = hand_built();
    let mut parsed = parse_graph(&model_text(), "quickstart.ir").unwrap();
    shardc_passes::infer::infer_graph(&mut parsed).unwrap();
    assert_eq!(summary(&built), summary(&parsed));
    assert_eq!(params(&built), params(&parsed));
    let strategies: Vec<Option<Strategy>> =
        built.nodes.iter().map(|n| n.in_strategy.clone()).collect();
    let parsed_strategies: Vec<Option<Strategy>> =
        parsed.nodes.iter().map(|n| n.in_strategy.clone()).collect();
    assert_eq!(strategies, parsed_strategies);
    assert_eq!(
        built.nodes[0].in_strategy,
        Some(Strategy(vec![vec![2, 4], vec![4, 1]]))
    );
    assert_eq!(built.outputs.len(), 1);
}

#[test]
fn hand_built_net_matches_the_lines_of_the_file() {
    // Independent of the parser: pick op, instance and scope off the text lines.
    let text = model_text();
    let mut expected = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        let line = line.trim();
        let Some(rest) = line.strip_prefix('%').filter(|_| line.contains(" = ")) else {
            continue;
        };
        if rest.starts_with("para") {
            continue;
        }
        let rhs = line.split(" = ").nth(1).unwrap();
        let op = rhs.split('(').next().unwrap().to_string();
        let instance = rhs
            .split("{instance name: ")
            .nth(1)
            .and_then(|s| s.split('}').next())
            .unwrap()
            .to_string();
        let scope = lines[i + 1]
            .trim()
            .strip_prefix("# scope: (")
            .and_then(|s| s.strip_suffix(')'))
            .unwrap()
            .to_string();
        expected.push((op, instance, scope));
    }
    let built: Vec<(String, String, String)> = hand_built()
        .nodes
        .iter()
        .map(|n| (n.op.name().to_string(), n.instance.clone(), n.scope.clone()))
        .collect();
    assert_eq!(expected.len(), 6);
    assert_eq!(built, expected);
}

#[test]
fn zoo_quickstart_is_the_model_file_seeds_included() {
    let g = zoo::quickstart(16).unwrap();
    let mut parsed = parse_graph(&model_text(), "quickstart.ir").unwrap();
    shardc_passes::infer::infer_graph(&mut parsed).unwrap();
    assert_eq!(summary(&g), summary(&parsed));
    assert_eq!(params(&g), params(&parsed));
    // The default builder numbers random initializers 1, 2, ... as the file does.
    let inits: Vec<ParamKind> = g.params.iter().map(|p| p.kind.clone()).collect();
    let parsed_inits: Vec<ParamKind> = parsed.params.iter().map(|p| p.kind.clone()).collect();
    assert_eq!(inits, parsed_inits);
    let names: Vec<&str> = g.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["out", "out", "out", "diff", "sq", "loss"]);
}

#[test]
fn zoo_quickstart_rejects_an_odd_batch() {
    let err = zoo::quickstart(15).unwrap_err().to_string();
    assert!(err.contains("matmul"), "{err}");
    assert!(err.contains("does not divide"), "{err}");
}
