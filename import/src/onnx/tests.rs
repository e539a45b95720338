use super::consts::code;
use super::importer::param_name;
use super::*;
use crate::proto::onnx::{
    tensor_shape_proto, type_proto, AttributeProto, GraphProto, OperatorSetIdProto, TensorProto,
    TensorShapeProto, TypeProto, ValueInfoProto,
};
use proptest::prelude::*;
use shardc_ir::{OpKind, Operand};
use std::path::PathBuf;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/data/onnx")
        .join(name)
}

fn read(name: &str) -> Result<Imported, ImportError> {
    let p = fixture(name);
    let bytes = std::fs::read(&p).unwrap();
    import(&p, &bytes)
}

fn ops(g: &shardc_ir::Graph) -> Vec<OpKind> {
    g.nodes.iter().map(|n| n.op).collect()
}

// ---- a small model written in Rust -----------------------------------------------------

fn vi(name: &str, elem: i32, shape: &[i64]) -> ValueInfoProto {
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(elem),
                shape: Some(TensorShapeProto {
                    dim: shape
                        .iter()
                        .map(|&d| tensor_shape_proto::Dimension {
                            value: Some(tensor_shape_proto::dimension::Value::DimValue(d)),
                            ..Default::default()
                        })
                        .collect(),
                }),
            })),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn node(
    op: &str,
    name: &str,
    inputs: &[&str],
    outputs: &[&str],
    attrs: Vec<AttributeProto>,
) -> NodeProto {
    NodeProto {
        op_type: Some(op.into()),
        name: Some(name.into()),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        attribute: attrs,
        ..Default::default()
    }
}

fn int_attr(name: &str, v: i64) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        i: Some(v),
        r#type: Some(2),
        ..Default::default()
    }
}

fn tensor_attr(name: &str, t: TensorProto) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        t: Some(t),
        r#type: Some(4),
        ..Default::default()
    }
}

fn f32_tensor(name: &str, shape: &[i64], v: &[f32]) -> TensorProto {
    TensorProto {
        name: Some(name.into()),
        dims: shape.to_vec(),
        data_type: Some(code::FLOAT),
        raw_data: Some(v.iter().flat_map(|x| x.to_le_bytes()).collect()),
        ..Default::default()
    }
}

fn i64_tensor(name: &str, shape: &[i64], v: &[i64]) -> TensorProto {
    TensorProto {
        name: Some(name.into()),
        dims: shape.to_vec(),
        data_type: Some(code::INT64),
        int64_data: v.to_vec(),
        ..Default::default()
    }
}

fn model(
    nodes: Vec<NodeProto>,
    inits: Vec<TensorProto>,
    inputs: Vec<ValueInfoProto>,
    out: &str,
    opset: i64,
) -> Vec<u8> {
    ModelProto {
        ir_version: Some(8),
        opset_import: vec![OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(opset),
        }],
        producer_name: Some("test".into()),
        graph: Some(GraphProto {
            node: nodes,
            name: Some("g".into()),
            initializer: inits,
            input: inputs,
            output: vec![ValueInfoProto {
                name: Some(out.into()),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
    .encode_to_vec()
}

fn import_bytes(bytes: &[u8]) -> Result<Imported, ImportError> {
    import(Path::new("test.onnx"), bytes)
}

#[test]
fn shape_arithmetic_folds_to_one_reshape() {
    // y = Reshape(x, Concat(Gather(Shape(x), 0), [-1])): (2, 3, 4) -> (2, 12).
    let nodes = vec![
        node("Shape", "/s/Shape", &["x"], &["shape"], vec![]),
        node(
            "Constant",
            "/s/Constant",
            &[],
            &["zero"],
            vec![tensor_attr("value", i64_tensor("", &[], &[0]))],
        ),
        node(
            "Gather",
            "/s/Gather",
            &["shape", "zero"],
            &["n"],
            vec![int_attr("axis", 0)],
        ),
        node("Unsqueeze", "/s/Unsqueeze", &["n", "axes"], &["n1"], vec![]),
        node(
            "Concat",
            "/s/Concat",
            &["n1", "minus1"],
            &["target"],
            vec![int_attr("axis", 0)],
        ),
        node("Reshape", "/s/Reshape", &["x", "target"], &["y"], vec![]),
    ];
    let inits = vec![
        i64_tensor("axes", &[1], &[0]),
        i64_tensor("minus1", &[1], &[-1]),
    ];
    let bytes = model(
        nodes,
        inits,
        vec![vi("x", code::FLOAT, &[2, 3, 4])],
        "y",
        17,
    );
    let m = import_bytes(&bytes).unwrap();
    assert_eq!(ops(&m.graph), vec![OpKind::Reshape]);
    let n = &m.graph.nodes[0];
    assert_eq!(
        n.inputs[1],
        Operand::Const(shardc_ir::Const::Ints(vec![2, 12]))
    );
    // Named after the graph output, scoped by torch's name.
    assert_eq!(n.instance, "y");
    assert_eq!(n.scope, "s");
    assert!(
        m.weights.is_empty(),
        "integer initializers are folded, not weights"
    );
}

#[test]
fn scalar_constants_are_operands_and_tensors_are_weights() {
    let nodes = vec![
        node(
            "Constant",
            "/a/Constant",
            &[],
            &["half"],
            vec![tensor_attr("value", f32_tensor("", &[], &[0.5]))],
        ),
        node("Mul", "/a/Mul", &["x", "half"], &["m"], vec![]),
        node("Sub", "/a/Sub", &["half", "m"], &["s"], vec![]),
        node("Add", "/a/Add", &["s", "b"], &["y"], vec![]),
    ];
    let inits = vec![f32_tensor("b", &[3], &[1.0, 2.0, 3.0])];
    let bytes = model(nodes, inits, vec![vi("x", code::FLOAT, &[2, 3])], "y", 17);
    let m = import_bytes(&bytes).unwrap();
    assert_eq!(
        ops(&m.graph),
        vec![OpKind::Mul, OpKind::Neg, OpKind::Add, OpKind::Add]
    );
    assert_eq!(m.weights.len(), 1);
    assert_eq!(m.weights[0].0, "b");
    let p = &m.graph.params[m.graph.param_by_name("b").unwrap().index()];
    assert!(
        p.requires_grad(),
        "a float initializer is a trainable weight"
    );
}

#[test]
fn where_with_a_constant_condition_is_exact() {
    // y = Where(c, x, min): the min fill is never multiplied.
    let min = f32::MIN;
    let nodes = vec![node(
        "Where",
        "/w/Where",
        &["c", "x", "fill"],
        &["y"],
        vec![],
    )];
    let inits = vec![
        TensorProto {
            name: Some("c".into()),
            dims: vec![2],
            data_type: Some(code::BOOL),
            int32_data: vec![1, 0],
            ..Default::default()
        },
        f32_tensor("fill", &[], &[min]),
    ];
    let bytes = model(nodes, inits, vec![vi("x", code::FLOAT, &[3, 2])], "y", 17);
    let m = import_bytes(&bytes).unwrap();
    assert_eq!(ops(&m.graph), vec![OpKind::Mul, OpKind::Add]);
    let vals: HashMap<_, _> = m.weights.iter().cloned().collect();
    assert_eq!(vals["y.x_mask"].as_f32().unwrap(), &[1.0, 0.0]);
    assert_eq!(vals["y.y"].as_f32().unwrap(), &[0.0, min]);
    for (name, _) in &m.weights {
        let p = &m.graph.params[m.graph.param_by_name(name).unwrap().index()];
        assert!(!p.requires_grad(), "{name}: masks are not trained");
    }
}

#[test]
fn pow_maps_known_exponents_and_reports_others() {
    for (e, want) in [
        (2.0f32, Some(OpKind::Square)),
        (0.5, Some(OpKind::Sqrt)),
        (1.7, None),
    ] {
        let nodes = vec![node("Pow", "/p/Pow", &["x", "e"], &["y"], vec![])];
        let bytes = model(
            nodes,
            vec![f32_tensor("e", &[], &[e])],
            vec![vi("x", code::FLOAT, &[4])],
            "y",
            17,
        );
        match (import_bytes(&bytes), want) {
            (Ok(m), Some(op)) => assert_eq!(ops(&m.graph), vec![op]),
            (Err(ImportError::Unmapped(u)), None) => {
                assert_eq!(u.len(), 1);
                assert!(u[0].op.contains("exponent 1.7"), "{}", u[0]);
            }
            (r, _) => panic!("exponent {e}: {:?}", r.map(|m| ops(&m.graph))),
        }
    }
}

#[test]
fn slice_and_gather_of_constant_rows_become_strided_slices() {
    let nodes = vec![
        node(
            "Slice",
            "/s/Slice",
            &["x", "st", "en", "ax"],
            &["s"],
            vec![],
        ),
        node(
            "Gather",
            "/s/Gather",
            &["s", "idx"],
            &["y"],
            vec![int_attr("axis", 0)],
        ),
    ];
    let inits = vec![
        i64_tensor("st", &[1], &[1]),
        i64_tensor("en", &[1], &[i64::MAX]),
        i64_tensor("ax", &[1], &[1]),
        i64_tensor("idx", &[1, 2], &[1, 2]),
    ];
    let bytes = model(nodes, inits, vec![vi("x", code::FLOAT, &[4, 6])], "y", 17);
    let m = import_bytes(&bytes).unwrap();
    assert_eq!(
        ops(&m.graph),
        vec![OpKind::StridedSlice, OpKind::StridedSlice, OpKind::Reshape]
    );
    let out = m
        .graph
        .nodes
        .last()
        .unwrap()
        .ty
        .as_tensor()
        .unwrap()
        .shape
        .clone();
    assert_eq!(out, vec![1, 2, 5]);
}

fn str_attr(name: &str, v: &str) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        s: Some(v.as_bytes().to_vec()),
        r#type: Some(3),
        ..Default::default()
    }
}

fn ints_attr(name: &str, v: &[i64]) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        ints: v.to_vec(),
        r#type: Some(7),
        ..Default::default()
    }
}

#[test]
fn gelu_maps_the_tanh_approximation_and_the_exact_form() {
    let m = |approx: &str| {
        let nodes = vec![node(
            "Gelu",
            "/g/Gelu",
            &["x"],
            &["y"],
            vec![str_attr("approximate", approx)],
        )];
        import_bytes(&model(
            nodes,
            vec![],
            vec![vi("x", code::FLOAT, &[4])],
            "y",
            20,
        ))
    };
    assert_eq!(ops(&m("tanh").unwrap().graph), vec![OpKind::GeLU]);
    // x/2 * (1 + erf(x / sqrt 2)).
    assert_eq!(
        ops(&m("none").unwrap().graph),
        vec![
            OpKind::Mul,
            OpKind::Erf,
            OpKind::Add,
            OpKind::Mul,
            OpKind::Mul
        ]
    );
    match m("sigmoid") {
        Err(ImportError::Unmapped(u)) => assert!(u[0].op.starts_with("Gelu (approximate"), "{u:?}"),
        other => panic!("{:?}", other.map(|m| ops(&m.graph))),
    }
}

#[test]
fn conv_with_bias_pools_and_batched_matmul() {
    let w: Vec<f32> = (0..4 * 3 * 3 * 3).map(|i| i as f32 * 0.01).collect();
    let nodes = vec![
        node(
            "Conv",
            "/c/Conv",
            &["x", "w", "b"],
            &["c"],
            vec![
                ints_attr("pads", &[1, 0, 1, 0]),
                ints_attr("strides", &[1, 1]),
            ],
        ),
        node(
            "AveragePool",
            "/c/AveragePool",
            &["c"],
            &["p"],
            vec![
                ints_attr("kernel_shape", &[2, 2]),
                ints_attr("strides", &[2, 2]),
            ],
        ),
        node("Reshape", "/c/Reshape", &["p", "shape"], &["r"], vec![]),
        node("MatMul", "/c/MatMul", &["r", "r2"], &["y"], vec![]),
        node(
            "Transpose",
            "/c/Transpose",
            &["r"],
            &["r2"],
            vec![ints_attr("perm", &[0, 2, 1])],
        ),
    ];
    // Transpose after its user: ONNX graphs are sorted, so this one is rejected ...
    let inits = vec![
        f32_tensor("w", &[4, 3, 3, 3], &w),
        f32_tensor("b", &[4], &[0.1, 0.2, 0.3, 0.4]),
        i64_tensor("shape", &[3], &[2, 4, -1]),
    ];
    let bytes = model(
        nodes.clone(),
        inits.clone(),
        vec![vi("x", code::FLOAT, &[2, 3, 6, 6])],
        "y",
        17,
    );
    let e = import_bytes(&bytes).unwrap_err().to_string();
    assert!(
        e.contains("/c/MatMul") && e.contains("`r2` is not defined"),
        "{e}"
    );
    // ... and sorted it imports.
    let mut sorted = nodes;
    sorted.swap(3, 4);
    let m = import_bytes(&model(
        sorted,
        inits,
        vec![vi("x", code::FLOAT, &[2, 3, 6, 6])],
        "y",
        17,
    ))
    .unwrap();
    assert_eq!(
        ops(&m.graph),
        vec![
            OpKind::Conv2D,
            OpKind::BiasAdd,
            OpKind::AvgPool,
            OpKind::Reshape,
            OpKind::Transpose,
            OpKind::BatchMatMul
        ]
    );
    let conv = &m.graph.nodes[0];
    assert_eq!(
        conv.attrs.get("pad"),
        Some(&shardc_ir::Attr::ints(&[1, 1, 0, 0]))
    );
    let out = m
        .graph
        .nodes
        .last()
        .unwrap()
        .ty
        .as_tensor()
        .unwrap()
        .shape
        .clone();
    assert_eq!(out, vec![2, 4, 4]);
}

#[test]
fn scopes_come_from_torch_names() {
    assert_eq!(
        scope_and_leaf("/layer1/layer1.0/conv1/Conv"),
        ("layer1/layer1.0/conv1".to_string(), "Conv".to_string())
    );
    assert_eq!(
        scope_and_leaf("Identity_33"),
        (String::new(), "Identity_33".to_string())
    );
    assert_eq!(scope_and_leaf("/a (b):c/Relu").0, "a__b__c");
    assert!(is_ident("Conv_1") && !is_ident("1x") && !is_ident("a.b") && !is_ident(""));
    assert_eq!(param_name("onnx::MatMul_324"), "onnx__MatMul_324");
    assert_eq!(
        param_name("/model/Where_1_output_0"),
        "model.Where_1_output_0"
    );
}

// ---- the exporters' fixtures -------------------------------------------------------------

#[test]
fn mlp_imports_with_torch_names() {
    let m = read("mlp.onnx").unwrap();
    assert!(m.producer.starts_with("pytorch"), "{}", m.producer);
    let names: Vec<&str> = m.weights.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "dense_relu_sequential.0.weight",
            "dense_relu_sequential.0.bias",
            "dense_relu_sequential.2.weight",
            "dense_relu_sequential.2.bias",
            "dense_relu_sequential.4.weight",
            "dense_relu_sequential.4.bias"
        ]
    );
    assert_eq!(
        ops(&m.graph)
            .iter()
            .filter(|o| **o == OpKind::MatMul)
            .count(),
        3
    );
    let last = m.graph.nodes.last().unwrap();
    assert_eq!(last.instance, "expected");
    assert_eq!(last.scope, "dense_relu_sequential/dense_relu_sequential.4");
}

#[test]
fn resnet_keeps_batch_norm_with_frozen_statistics() {
    let m = read("resnet18_narrow.onnx").unwrap();
    let count = |op| ops(&m.graph).iter().filter(|o| **o == op).count();
    assert_eq!(count(OpKind::Conv2D), 20);
    assert_eq!(count(OpKind::BatchNorm), 20);
    assert_eq!(count(OpKind::MaxPool), 1);
    let id = m.graph.param_by_name("bn1.running_mean").unwrap();
    assert!(!m.graph.params[id.index()].requires_grad());
    let id = m.graph.param_by_name("bn1.weight").unwrap();
    assert!(m.graph.params[id.index()].requires_grad());
    let conv = m
        .graph
        .nodes
        .iter()
        .find(|n| n.op == OpKind::Conv2D)
        .unwrap();
    assert_eq!(conv.scope, "conv1");
    assert_eq!(conv.instance, "Conv");
}

#[test]
fn gpt2_folds_its_mask_and_keeps_tied_copies_apart() {
    let m = read("gpt2_tiny.onnx").unwrap();
    let o = ops(&m.graph);
    for op in [
        OpKind::Gather,
        OpKind::LayerNorm,
        OpKind::Softmax,
        OpKind::BatchMatMul,
        OpKind::Tanh,
    ] {
        assert!(o.contains(&op), "{op} missing: {o:?}");
    }
    assert!(!o.contains(&OpKind::Equal), "the mask arithmetic is folded");
    // The exporter wrote ln_f's bias as an Identity of ln_1's: two weights.
    assert!(m
        .graph
        .param_by_name("model.transformer.ln_f.bias")
        .is_some());
    assert!(m
        .graph
        .param_by_name("model.transformer.h.0.ln_1.bias")
        .is_some());
}

#[test]
fn every_unmapped_op_is_listed() {
    match read("unmapped.onnx") {
        Err(ImportError::Unmapped(u)) => {
            let ops: Vec<&str> = u.iter().map(|x| x.op.as_str()).collect();
            assert_eq!(ops, ["Sin", "Cos"], "{u:?}");
            let msg = ImportError::Unmapped(u).to_string();
            assert!(msg.contains("Cos (node `/Cos`)"), "{msg}");
        }
        other => panic!("{:?}", other.map(|m| ops(&m.graph))),
    }
}

#[test]
fn bad_files_are_errors_naming_the_reason() {
    let e = read("truncated.onnx").unwrap_err();
    assert!(matches!(e, ImportError::Decode { .. }), "{e}");
    let e = read("opset9.onnx").unwrap_err().to_string();
    assert!(e.contains("opset 9 is not supported"), "{e}");
    let e = read("symbolic.onnx").unwrap_err().to_string();
    assert!(
        e.contains("graph input `x`") && e.contains("`batch`"),
        "{e}"
    );
    let bytes = model(vec![], vec![], vec![], "y", 22);
    let e = import_bytes(&bytes).unwrap_err().to_string();
    assert!(e.contains("opset 22"), "{e}");
    let mut t = f32_tensor("w", &[2], &[1.0, 2.0]);
    t.raw_data = None;
    t.data_location = Some(1);
    t.external_data = vec![crate::proto::onnx::StringStringEntryProto {
        key: Some("location".into()),
        value: Some("w.bin".into()),
    }];
    let bytes = model(vec![], vec![t], vec![], "w", 17);
    let e = import_bytes(&bytes).unwrap_err().to_string();
    assert!(e.contains("initializer `w`") && e.contains("w.bin"), "{e}");
}

#[test]
fn a_shape_that_cannot_fold_names_the_node() {
    // Reshape to a shape computed from a tensor.
    let nodes = vec![
        node(
            "Cast",
            "/c/Cast",
            &["x"],
            &["xi"],
            vec![int_attr("to", code::INT64 as i64)],
        ),
        node("Reshape", "/c/Reshape", &["x", "xi"], &["y"], vec![]),
    ];
    let bytes = model(nodes, vec![], vec![vi("x", code::FLOAT, &[2])], "y", 17);
    let e = import_bytes(&bytes).unwrap_err().to_string();
    assert!(
        e.contains("/c/Reshape") && e.contains("target shape"),
        "{e}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = import_bytes(&bytes);
    }

    #[test]
    fn damaged_models_never_panic(flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8), cut in any::<usize>()) {
        let mut bytes = std::fs::read(fixture("mlp.onnx")).unwrap();
        for (at, v) in flips {
            let i = at % bytes.len();
            bytes[i] = v;
        }
        let keep = bytes.len() - cut % (bytes.len() / 4);
        bytes.truncate(keep);
        let _ = import_bytes(&bytes);
    }
}
