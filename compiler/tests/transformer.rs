//! The transformer encoder stack: its graph, its training step, its parallel compilation.
//! (That the parallel training step computes the single device's numbers is checked in
//! `shardc-bench`, which has the runtime: `bench_compile::tests`.)

use shardc_compiler::builder::BuildError;
use shardc_compiler::optim::Momentum;
use shardc_compiler::pipeline::{compile, CompileOptions};
use shardc_compiler::transformer::{transformer, TransformerConfig, NODES_PER_LAYER};
use shardc_ir::{Init, OpKind, ParamKind, Strategy};
use shardc_passes::parallel::{DatasetLayout, Mode, ParallelOptions};
use std::collections::BTreeMap;

fn tiny() -> TransformerConfig {
    TransformerConfig::new(2, 16, 2, 4, 2)
}

fn parallel(mode: Mode, devices: usize) -> ParallelOptions {
    ParallelOptions {
        mode,
        device_num: devices,
        dataset: DatasetLayout::DataParallel,
        gradients_mean: true,
        enable_alltoall: false,
        search: Default::default(),
        parallel_optimizer: None,
    }
}

#[test]
fn tiny_graph_infers_and_verifies() {
    let g = transformer(&tiny()).unwrap();
    shardc_passes::verify::verify(&g).unwrap();
    let c = compile(g.clone(), &CompileOptions::default()).unwrap();
    assert_eq!(c.graph.nodes.len(), g.nodes.len());
    // Inputs first, then the weights of layer 0.
    assert_eq!(g.params[0].name, "x");
    assert_eq!(g.params[0].ty.shape, vec![8, 16]);
    assert_eq!(g.params[1].name, "label");
    // The loss is a scalar.
    let loss = g.loss().unwrap();
    assert!(g.operand_tensor_type(loss).unwrap().shape.is_empty());
}

#[test]
fn every_layer_has_the_expected_ops() {
    let cfg = tiny();
    let g = transformer(&cfg).unwrap();
    assert_eq!(g.nodes.len(), cfg.layers * NODES_PER_LAYER + 3);
    let expected: BTreeMap<OpKind, usize> = [
        (OpKind::MatMul, 6),
        (OpKind::Add, 8),
        (OpKind::Reshape, 4),
        (OpKind::Transpose, 4),
        (OpKind::BatchMatMul, 2),
        (OpKind::Mul, 1),
        (OpKind::Softmax, 1),
        (OpKind::GeLU, 1),
        (OpKind::LayerNorm, 2),
        (OpKind::TupleGetItem, 2),
    ]
    .into_iter()
    .collect();
    for layer in 0..cfg.layers {
        let prefix = format!("layer{layer}_");
        let mut counts = BTreeMap::new();
        for n in g.nodes.iter().filter(|n| n.instance.starts_with(&prefix)) {
            *counts.entry(n.op).or_insert(0usize) += 1;
            assert!(
                n.scope
                    .ends_with(&format!("layer{layer}-TransformerEncoderLayer")),
                "{} in scope {}",
                n.instance,
                n.scope
            );
        }
        assert_eq!(counts, expected, "layer {layer}");
    }
    let tail: Vec<OpKind> = g.nodes[g.nodes.len() - 3..].iter().map(|n| n.op).collect();
    assert_eq!(tail, vec![OpKind::Sub, OpKind::Square, OpKind::ReduceMean]);
}

#[test]
fn attention_has_the_documented_shapes_and_attributes() {
    let cfg = tiny();
    let g = transformer(&cfg).unwrap();
    let shape = |name: &str| {
        let id = g.node_by_instance(name).unwrap();
        g.node(id).ty.as_tensor().unwrap().shape.clone()
    };
    assert_eq!(shape("layer1_attn_q_matmul"), vec![8, 16]);
    assert_eq!(shape("layer1_attn_q_reshape"), vec![2, 4, 2, 8]);
    assert_eq!(shape("layer1_attn_k_transpose"), vec![2, 2, 4, 8]);
    assert_eq!(shape("layer1_attn_scores_batch_matmul"), vec![2, 2, 4, 4]);
    assert_eq!(shape("layer1_attn_context_batch_matmul"), vec![2, 2, 4, 8]);
    assert_eq!(shape("layer1_attn_context_reshape"), vec![8, 16]);
    assert_eq!(shape("layer1_ffn_in_matmul"), vec![8, 64]);
    assert_eq!(shape("layer1_ffn_out_bias_add"), vec![8, 16]);
    let scores = g.node(
        g.node_by_instance("layer0_attn_scores_batch_matmul")
            .unwrap(),
    );
    assert!(scores.attrs.bool_or("transpose_b", false));
    let scale = g.node(g.node_by_instance("layer0_attn_scale_mul").unwrap());
    let c = scale.inputs[1].as_const().unwrap();
    assert_eq!(*c, shardc_ir::Const::Float(1.0 / 8f64.sqrt()));
}

#[test]
fn weights_are_seeded_normal_and_named_per_layer() {
    let g = transformer(&tiny()).unwrap();
    let mut seeds = Vec::new();
    for name in [
        "layer0.attn_q.weight",
        "layer0.attn_out.weight",
        "layer1.ffn_in.weight",
        "layer1.ffn_out.weight",
    ] {
        let p = g.param(g.param_by_name(name).unwrap_or_else(|| panic!("{name}")));
        match &p.kind {
            ParamKind::Weight {
                init: Init::Normal { sigma, seed, .. },
                requires_grad: true,
            } => {
                assert_eq!(*sigma, 0.02);
                seeds.push(*seed);
            }
            other => panic!("{name}: {other:?}"),
        }
    }
    seeds.dedup();
    assert_eq!(seeds.len(), 4, "every weight has its own seed");
    let gamma = g.param(g.param_by_name("layer1.ffn_layernorm.gamma").unwrap());
    assert!(matches!(
        gamma.kind,
        ParamKind::Weight {
            init: Init::Ones,
            ..
        }
    ));
    // Same config, same graph.
    assert_eq!(
        shardc_ir::text::print_graph(&g),
        shardc_ir::text::print_graph(&transformer(&tiny()).unwrap())
    );
}

#[test]
fn trains_with_momentum() {
    let g = transformer(&tiny()).unwrap();
    let c = compile(
        g.clone(),
        &CompileOptions {
            optimizer: Some(Momentum::new(0.01, 0.9).to_spec()),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(c.graph.nodes.len() > 2 * g.nodes.len());
    // One Momentum update per trainable weight.
    let weights = g.params.iter().filter(|p| p.requires_grad()).count();
    let updates = c
        .graph
        .nodes
        .iter()
        .filter(|n| n.op == OpKind::ApplyMomentum)
        .count();
    assert_eq!(updates, weights);
}

#[test]
fn compiles_semi_auto_parallel_with_annotated_qkv() {
    for devices in [2usize, 4] {
        let mut cfg = tiny();
        for m in ["q", "k", "v"] {
            cfg = cfg.annotate(
                &format!("layer0_attn_{m}_matmul"),
                Strategy(vec![vec![1, 1], vec![1, devices as i64]]),
            );
        }
        let g = transformer(&cfg).unwrap();
        let c = compile(
            g,
            &CompileOptions {
                optimizer: Some(Momentum::new(0.01, 0.9).to_spec()),
                parallel: Some(parallel(Mode::SemiAutoParallel, devices)),
                ..Default::default()
            },
        )
        .unwrap_or_else(|e| panic!("{devices} devices: {e}"));
        let p = c.parallel.unwrap();
        assert_eq!(p.ranks.len(), devices);
        let q = p
            .begin
            .node(p.begin.node_by_instance("layer0_attn_q_matmul").unwrap());
        assert_eq!(
            q.in_strategy,
            Some(Strategy(vec![vec![1, 1], vec![1, devices as i64]]))
        );
    }
}

#[test]
fn bad_configs_are_errors_naming_the_reason() {
    let e = transformer(&TransformerConfig::new(2, 15, 2, 4, 2)).unwrap_err();
    assert!(e.to_string().contains("not divisible by heads"), "{e}");
    let e = transformer(&TransformerConfig::new(0, 16, 2, 4, 2)).unwrap_err();
    assert!(e.to_string().contains("layers must be at least 1"), "{e}");
    let e = transformer(&tiny().ffn(0)).unwrap_err();
    assert!(e.to_string().contains("ffn"), "{e}");
    let e = transformer(&TransformerConfig::new(1, 16, 2, usize::MAX / 2, 4)).unwrap_err();
    assert!(e.to_string().contains("overflows"), "{e}");
    let e = transformer(&tiny().annotate("layer9_attn_q_matmul", Strategy(vec![vec![1, 1]])))
        .unwrap_err();
    assert!(
        e.to_string().contains("layer9_attn_q_matmul") && e.to_string().contains("names no op"),
        "{e}"
    );
    // 3 does not divide 16 columns: the builder's strategy check names the op.
    let e = transformer(&tiny().annotate(
        "layer1_attn_k_matmul",
        Strategy(vec![vec![1, 1], vec![1, 3]]),
    ))
    .unwrap_err();
    assert!(matches!(e, BuildError::Strategy { .. }), "{e}");
    assert!(e.to_string().contains("layer1_attn_k_matmul"), "{e}");
}
