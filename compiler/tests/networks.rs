//! Cells, losses and the zoo networks: they build, verify, and have MindSpore's names.

use shardc_compiler::builder::{BuildError, GraphBuilder};
use shardc_compiler::loss::{LossFn, SoftmaxCrossEntropyExpand, SoftmaxCrossEntropyWithLogits};
use shardc_compiler::model::build_network;
use shardc_compiler::nn::{call_cell, BatchNorm2d, Cell, Conv2d, Dense, ReLU, SequentialCell};
use shardc_compiler::{init, zoo};
use shardc_ir::{Attr, Const, DType, Graph, OpKind, Operand, ParamKind};

fn trainable_elements(g: &Graph) -> usize {
    g.params
        .iter()
        .filter(|p| p.requires_grad())
        .map(|p| p.ty.num_elements())
        .sum()
}

fn ops(g: &Graph) -> Vec<OpKind> {
    g.nodes.iter().map(|n| n.op).collect()
}

fn loss_shape(g: &Graph) -> Vec<usize> {
    g.operand_tensor_type(g.loss().unwrap())
        .unwrap()
        .shape
        .clone()
}

#[test]
fn mlp_784_512_512_10() {
    let g = zoo::mlp(32, &[784, 512, 512, 10]).unwrap();
    shardc_passes::verify::verify(&g).unwrap();
    let names: Vec<&str> = g.params.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "x",
            "label",
            "dense_relu_sequential.0.weight",
            "dense_relu_sequential.0.bias",
            "dense_relu_sequential.2.weight",
            "dense_relu_sequential.2.bias",
            "dense_relu_sequential.4.weight",
            "dense_relu_sequential.4.bias",
        ]
    );
    assert_eq!(g.params[2].ty.shape, vec![512, 784]);
    assert_eq!(trainable_elements(&g), 669_706);
    assert_eq!(
        ops(&g),
        [
            OpKind::MatMul,
            OpKind::BiasAdd,
            OpKind::ReLU,
            OpKind::MatMul,
            OpKind::BiasAdd,
            OpKind::ReLU,
            OpKind::MatMul,
            OpKind::BiasAdd,
            OpKind::SparseSoftmaxCrossEntropyWithLogits,
        ]
    );
    assert_eq!(g.nodes[0].attrs.get("transpose_b"), Some(&Attr::Bool(true)));
    assert_eq!(
        g.nodes[0].scope,
        "Default/network-WithLossCell/_backbone-Network/dense_relu_sequential-SequentialCell/0-Dense"
    );
    assert_eq!(
        g.nodes[8].scope,
        "Default/network-WithLossCell/_loss_fn-SoftmaxCrossEntropyWithLogits"
    );
    assert_eq!(loss_shape(&g), Vec::<usize>::new());
    assert!(zoo::mlp(4, &[10]).is_err());
}

#[test]
fn lenet_builds() {
    let g = zoo::lenet(8).unwrap();
    shardc_passes::verify::verify(&g).unwrap();
    assert_eq!(trainable_elements(&g), 61_684);
    let fc3 = g.node_by_instance("bias_add3").unwrap();
    assert_eq!(g.node(fc3).ty.as_tensor().unwrap().shape, vec![8, 10]);
    assert_eq!(
        g.param_by_name("conv1.weight")
            .map(|p| g.param(p).ty.shape.clone()),
        Some(vec![6, 1, 5, 5])
    );
}

#[test]
fn resnet18_cifar_builds() {
    let g = zoo::resnet18_cifar(4).unwrap();
    shardc_passes::verify::verify(&g).unwrap();
    // The standard count for ResNet-18 on CIFAR-10 (bias-free convolutions, BN affine).
    assert_eq!(trainable_elements(&g), 11_173_962);
    let convs = g.nodes.iter().filter(|n| n.op == OpKind::Conv2D).count();
    let bns = g.nodes.iter().filter(|n| n.op == OpKind::BatchNorm).count();
    let assigns = g.nodes.iter().filter(|n| n.op == OpKind::Assign).count();
    assert_eq!((convs, bns, assigns), (20, 20, 40));
    for name in [
        "conv1.weight",
        "bn1.moving_variance",
        "layer1.0.conv1.weight",
        "layer2.0.down_sample_layer.0.weight",
        "layer2.0.down_sample_layer.1.gamma",
        "layer4.1.bn2.beta",
        "end_point.weight",
    ] {
        assert!(g.param_by_name(name).is_some(), "no parameter {name}");
    }
    let last = g.param_by_name("layer4.1.conv2.weight").unwrap();
    assert_eq!(g.param(last).ty.shape, vec![512, 512, 3, 3]);
    let mean = g.node(g.node_by_instance("mean").unwrap());
    assert_eq!(mean.ty.as_tensor().unwrap().shape, vec![4, 512]);
    assert_eq!(mean.inputs[1], Operand::Const(Const::Ints(vec![2, 3])));
    let conv = g
        .nodes
        .iter()
        .find(|n| {
            n.scope
                .ends_with("layer2-SequentialCell/0-BasicBlock/conv1-Conv2d")
        })
        .unwrap();
    assert_eq!(conv.ty.as_tensor().unwrap().shape, vec![4, 128, 16, 16]);
    assert_eq!(loss_shape(&g), Vec::<usize>::new());
}

/// A small ResNet-style block written by a user: conv-bn-relu-conv-bn + identity, relu.
struct Block;

impl Cell for Block {
    fn class_name(&self) -> &str {
        "Block"
    }

    fn construct(
        &self,
        b: &mut GraphBuilder,
        x: shardc_compiler::Value,
    ) -> Result<shardc_compiler::Value, BuildError> {
        let mut y = call_cell(b, "conv1", &Conv2d::new(8, 8, 3), x)?;
        y = call_cell(b, "bn1", &BatchNorm2d::new(8), y)?;
        y = call_cell(b, "relu", &ReLU, y)?;
        y = call_cell(b, "conv2", &Conv2d::new(8, 8, 3).has_bias(true), y)?;
        y = call_cell(b, "bn2", &BatchNorm2d::new(8), y)?;
        let s = b.add(x, y)?;
        let s = b.relu(s)?;
        let p = b.reduce_mean(s, &[2, 3], false)?;
        call_cell(b, "fc", &Dense::new(8, 3), p)
    }
}

#[test]
fn small_resnet_block_builds_and_trains() {
    let g = build_network(
        "Block",
        &Block,
        &SoftmaxCrossEntropyExpand::new(true),
        &[
            ("x", DType::Float32, &[2, 8, 6, 6]),
            ("label", DType::Int32, &[2]),
        ],
    )
    .unwrap();
    shardc_passes::verify::verify(&g).unwrap();
    assert!(g.param_by_name("conv2.bias").is_some());
    let step =
        shardc_compiler::model::train_graph(&g, &shardc_compiler::optim::Momentum::new(0.1, 0.9))
            .unwrap();
    assert!(step.nodes.len() > g.nodes.len());
}

#[test]
fn batchnorm_updates_moving_statistics_mindspore_style() {
    let mut b = GraphBuilder::new("bn");
    let x = b.input("x", DType::Float32, &[2, 4, 3, 3]).unwrap();
    let y = call_cell(&mut b, "bn1", &BatchNorm2d::new(4), x).unwrap();
    let l = b.reduce_mean(y, &[], false).unwrap();
    let g = b.finish(&[l]).unwrap();
    assert_eq!(
        ops(&g),
        [
            OpKind::BatchNorm,
            OpKind::TupleGetItem,
            OpKind::TupleGetItem,
            OpKind::Mul,
            OpKind::Mul,
            OpKind::Add,
            OpKind::Assign,
            OpKind::TupleGetItem,
            OpKind::Mul,
            OpKind::Mul,
            OpKind::Add,
            OpKind::Assign,
            OpKind::ReduceMean,
        ]
    );
    let bn = &g.nodes[0];
    assert_eq!(bn.attrs.get("is_training"), Some(&Attr::Bool(true)));
    assert_eq!(bn.attrs.float_or("momentum", 0.0), 0.1);
    assert_eq!(bn.scope, "bn1-BatchNorm2d");
    // mm' = mm * 0.9 + batch_mean * 0.1, stored into moving_mean.
    let mm = g.param_by_name("bn1.moving_mean").unwrap();
    assert_eq!(
        g.nodes[3].inputs,
        vec![Operand::Param(mm), Operand::Const(Const::Float(0.9))]
    );
    assert_eq!(g.nodes[2].inputs[1], Operand::Const(Const::Int(1)));
    assert_eq!(g.nodes[4].inputs[1], Operand::Const(Const::Float(0.1)));
    assert_eq!(g.nodes[6].inputs[0], Operand::Param(mm));
    for (name, grad) in [
        ("bn1.gamma", true),
        ("bn1.beta", true),
        ("bn1.moving_mean", false),
        ("bn1.moving_variance", false),
    ] {
        let p = g.param(g.param_by_name(name).unwrap());
        assert!(matches!(p.kind, ParamKind::Weight { .. }));
        assert_eq!(p.requires_grad(), grad, "{name}");
    }

    let mut b = GraphBuilder::new("bn");
    b.set_training(false);
    let x = b.input("x", DType::Float32, &[2, 4, 3, 3]).unwrap();
    let y = call_cell(&mut b, "bn1", &BatchNorm2d::new(4), x).unwrap();
    let g = b.finish(&[y]).unwrap();
    assert_eq!(ops(&g), [OpKind::BatchNorm, OpKind::TupleGetItem]);
    assert_eq!(
        g.nodes[0].attrs.get("is_training"),
        Some(&Attr::Bool(false))
    );
}

#[test]
fn dense_checks_and_reshapes() {
    let mut b = GraphBuilder::new("d");
    let x = b.input("x", DType::Float32, &[2, 3, 8]).unwrap();
    let err = call_cell(&mut b, "fc1", &Dense::new(7, 4), x)
        .unwrap_err()
        .to_string();
    assert!(err.contains("Dense at fc1-Dense"), "{err}");
    assert!(err.contains("[2, 3, 8]"), "{err}");
    let y = call_cell(&mut b, "fc1", &Dense::new(8, 4).has_bias(false), x).unwrap();
    assert_eq!(b.ty(&y).unwrap().shape, vec![2, 3, 4]);
    let g = b.finish(&[y]).unwrap();
    assert_eq!(ops(&g), [OpKind::Reshape, OpKind::MatMul, OpKind::Reshape]);
}

#[test]
fn sequential_cells_name_children_by_index() {
    let seq = SequentialCell::new(vec![
        Box::new(Dense::new(4, 4).weight_init(init::xavier_uniform())),
        Box::new(ReLU),
        Box::new(Dense::new(4, 2)),
    ]);
    let mut b = GraphBuilder::new("s");
    let x = b.input("x", DType::Float32, &[3, 4]).unwrap();
    let y = call_cell(&mut b, "seq", &seq, x).unwrap();
    let g = b.finish(&[y]).unwrap();
    let names: Vec<&str> = g.params.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "x",
            "seq.0.weight",
            "seq.0.bias",
            "seq.2.weight",
            "seq.2.bias"
        ]
    );
    assert_eq!(g.nodes[2].scope, "seq-SequentialCell/1-ReLU");
    // Default Dense init: uniform on ±1/sqrt(fan_in).
    let ParamKind::Weight { init, .. } = &g.params[3].kind else {
        panic!()
    };
    assert!(matches!(init, shardc_ir::Init::Uniform { scale, .. } if (*scale - 0.5).abs() < 1e-12));
}

fn loss_graph(loss: &dyn LossFn, label: (DType, &[usize])) -> Result<Graph, BuildError> {
    let mut b = GraphBuilder::new("l");
    let logits = b.input("logits", DType::Float32, &[4, 5]).unwrap();
    let label = b.input("label", label.0, label.1).unwrap();
    let l = loss.construct(&mut b, logits, label)?;
    b.finish(&[l])
}

#[test]
fn softmax_cross_entropy_forms() {
    let g = loss_graph(
        &SoftmaxCrossEntropyWithLogits::new(true, "mean"),
        (DType::Int32, &[4]),
    )
    .unwrap();
    assert_eq!(ops(&g), [OpKind::SparseSoftmaxCrossEntropyWithLogits]);

    let g = loss_graph(
        &SoftmaxCrossEntropyWithLogits::new(false, "mean"),
        (DType::Float32, &[4, 5]),
    )
    .unwrap();
    assert_eq!(
        ops(&g),
        [
            OpKind::SoftmaxCrossEntropyWithLogits,
            OpKind::TupleGetItem,
            OpKind::ReduceMean
        ]
    );
    assert_eq!(loss_shape(&g), Vec::<usize>::new());

    let g = loss_graph(
        &SoftmaxCrossEntropyWithLogits::new(true, "sum"),
        (DType::Int32, &[4]),
    )
    .unwrap();
    assert_eq!(
        ops(&g),
        [
            OpKind::OneHot,
            OpKind::SoftmaxCrossEntropyWithLogits,
            OpKind::TupleGetItem,
            OpKind::ReduceSum
        ]
    );

    let g = loss_graph(
        &SoftmaxCrossEntropyWithLogits::new(false, "none"),
        (DType::Float32, &[4, 5]),
    )
    .unwrap();
    assert_eq!(loss_shape(&g), vec![4]);

    let err = loss_graph(
        &SoftmaxCrossEntropyWithLogits::new(false, "avg"),
        (DType::Float32, &[4, 5]),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("reduction must be"), "{err}");
}

#[test]
fn softmax_cross_entropy_expand_is_the_tutorials() {
    let g = loss_graph(&SoftmaxCrossEntropyExpand::new(true), (DType::Int32, &[4])).unwrap();
    let got: Vec<(OpKind, &str)> = g
        .nodes
        .iter()
        .map(|n| (n.op, n.instance.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            (OpKind::ReduceMax, "max"),
            (OpKind::Sub, "sub"),
            (OpKind::Exp, "exp"),
            (OpKind::ReduceSum, "sum"),
            (OpKind::RealDiv, "div"),
            (OpKind::OneHot, "onehot"),
            (OpKind::Log, "log"),
            (OpKind::Mul, "mul"),
            (OpKind::ReduceSum, "sum_cross_entropy"),
            (OpKind::Mul, "mul2"),
            (OpKind::ReduceMean, "mean"),
        ]
    );
    assert_eq!(g.nodes[0].attrs.get("keep_dims"), Some(&Attr::Bool(true)));
    assert_eq!(g.nodes[0].ty.as_tensor().unwrap().shape, vec![4, 1]);
    assert_eq!(g.nodes[8].attrs.get("keep_dims"), Some(&Attr::Bool(false)));
    assert_eq!(g.nodes[9].inputs[0], Operand::Const(Const::Float(-1.0)));
    assert_eq!(loss_shape(&g), Vec::<usize>::new());

    let g = loss_graph(
        &SoftmaxCrossEntropyExpand::new(false),
        (DType::Float32, &[4, 5]),
    )
    .unwrap();
    assert!(!ops(&g).contains(&OpKind::OneHot));
}
