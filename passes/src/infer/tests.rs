//! Tests of the shape rules: one or more positive and negative cases per op family, and a
//! table of error cases checking the message text.

use super::*;
use shardc_ir::{
    Attr, Attrs, Const, DType, Graph, Init, Node, NodeId, OpKind, Operand, Param, ParamKind,
    TensorType, Type,
};

fn tt(dtype: DType, shape: &[usize]) -> TensorType {
    TensorType::new(dtype, shape.to_vec())
}

fn f32(shape: &[usize]) -> Type {
    Type::Tensor(tt(DType::Float32, shape))
}

fn input(g: &mut Graph, name: &str, dtype: DType, shape: &[usize]) -> Operand {
    g.add_param(Param {
        name: name.into(),
        ty: tt(dtype, shape),
        kind: ParamKind::Input,
    })
    .into()
}

fn weight(g: &mut Graph, name: &str, shape: &[usize]) -> Operand {
    g.add_param(Param {
        name: name.into(),
        ty: tt(DType::Float32, shape),
        kind: ParamKind::Weight {
            init: Init::Zeros,
            requires_grad: true,
        },
    })
    .into()
}

fn node(op: OpKind, inputs: Vec<Operand>, attrs: &[(&str, Attr)]) -> Node {
    let mut n = Node::new(op, inputs);
    n.instance = op.name().to_lowercase();
    n.attrs = attrs
        .iter()
        .fold(Attrs::new(), |a, (k, v)| a.with(*k, v.clone()));
    n
}

/// Infers the node's type without adding it.
fn infer(
    g: &Graph,
    op: OpKind,
    inputs: Vec<Operand>,
    attrs: &[(&str, Attr)],
) -> Result<Type, InferError> {
    infer_node(g, &node(op, inputs, attrs))
}

/// Infers and appends the node; returns its operand.
fn push(g: &mut Graph, op: OpKind, inputs: Vec<Operand>, attrs: &[(&str, Attr)]) -> Operand {
    let mut n = node(op, inputs, attrs);
    n.ty = match infer_node(g, &n) {
        Ok(t) => t,
        Err(e) => panic!("unexpected error: {e}"),
    };
    g.push_node(n).into()
}

fn ints(v: &[i64]) -> Operand {
    Operand::Const(Const::Ints(v.to_vec()))
}

fn int(v: i64) -> Operand {
    Operand::Const(Const::Int(v))
}

fn float(v: f64) -> Operand {
    Operand::Const(Const::Float(v))
}

fn word(s: &str) -> Attr {
    Attr::Str(s.into())
}

#[test]
fn helpers() {
    assert_eq!(normalize_axis(-1, 3), Some(2));
    assert_eq!(normalize_axis(2, 3), Some(2));
    assert_eq!(normalize_axis(3, 3), None);
    assert_eq!(normalize_axis(-4, 3), None);
    assert_eq!(normalize_axis(0, 0), None);
    assert_eq!(normalize_axis(i64::MIN, 3), None);
    assert_eq!(broadcast_shapes(&[4, 1, 3], &[5, 1]), Some(vec![4, 5, 3]));
    assert_eq!(broadcast_shapes(&[], &[2, 3]), Some(vec![2, 3]));
    assert_eq!(broadcast_shapes(&[2, 3], &[3, 3]), None);
    assert_eq!(broadcast_shapes(&[0], &[1]), Some(vec![0]));
    let n = node(OpKind::ReduceSum, vec![int(0), ints(&[-1, 0])], &[]);
    assert_eq!(reduce_axes(&n, 3).unwrap(), vec![0, 2]);
    let n = node(OpKind::ReduceSum, vec![int(0), ints(&[])], &[]);
    assert_eq!(reduce_axes(&n, 2).unwrap(), vec![0, 1]);
    let n = node(OpKind::ReduceSum, vec![int(0)], &[]);
    assert_eq!(reduce_axes(&n, 2).unwrap(), vec![0, 1]);
    let n = node(OpKind::Softmax, vec![], &[("axis", Attr::ints(&[1]))]);
    assert_eq!(softmax_axis(&n, 3).unwrap(), 1);
    assert_eq!(signature(OpKind::Concat).name(2), "x3");
    assert_eq!(signature(OpKind::MatMul).name(1), "b");
}

#[test]
fn contraction_rules() {
    let mut g = Graph::new("t");
    let x = input(&mut g, "x", DType::Float32, &[16, 32]);
    let w = weight(&mut g, "w", &[32, 8]);
    let wt = weight(&mut g, "wt", &[8, 32]);
    assert_eq!(
        infer(&g, OpKind::MatMul, vec![x.clone(), w.clone()], &[]).unwrap(),
        f32(&[16, 8])
    );
    assert_eq!(
        infer(
            &g,
            OpKind::MatMul,
            vec![x.clone(), wt.clone()],
            &[("transpose_b", Attr::Bool(true))]
        )
        .unwrap(),
        f32(&[16, 8])
    );
    // The older MindSpore name works too.
    assert_eq!(
        infer(
            &g,
            OpKind::MatMul,
            vec![x.clone(), wt.clone()],
            &[("transpose_x2", Attr::Bool(true))]
        )
        .unwrap(),
        f32(&[16, 8])
    );
    let e = infer(&g, OpKind::MatMul, vec![x.clone(), wt.clone()], &[]).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("MatMul 'matmul': contracted dimensions differ"),
        "{e}"
    );
    assert!(e.reason.contains("input 0 (a) has shape (16, 32)"), "{e}");
    assert!(
        e.reason
            .contains("input 1 (b) has shape (8, 32) with transpose_b false"),
        "{e}"
    );

    let a = input(&mut g, "a", DType::Float32, &[4, 1, 3, 5]);
    let b = input(&mut g, "b", DType::Float32, &[6, 5, 7]);
    assert_eq!(
        infer(&g, OpKind::BatchMatMul, vec![a.clone(), b.clone()], &[]).unwrap(),
        f32(&[4, 6, 3, 7])
    );
    let c = input(&mut g, "c", DType::Float32, &[3, 5, 7]);
    let e = infer(
        &g,
        OpKind::BatchMatMul,
        vec![a.clone(), c],
        &[("transpose_a", Attr::Bool(true))],
    )
    .unwrap_err();
    assert!(e.reason.contains("contracted dimensions differ"), "{e}");

    let img = input(&mut g, "img", DType::Float32, &[2, 3, 8, 8]);
    let k = weight(&mut g, "k", &[6, 3, 3, 3]);
    assert_eq!(
        infer(
            &g,
            OpKind::Conv2D,
            vec![img.clone(), k.clone()],
            &[
                ("pad_mode", word("same")),
                ("stride", Attr::Int(2)),
                ("out_channel", Attr::Int(6))
            ]
        )
        .unwrap(),
        f32(&[2, 6, 4, 4])
    );
    let e = infer(
        &g,
        OpKind::Conv2D,
        vec![img, k],
        &[("out_channel", Attr::Int(5))],
    )
    .unwrap_err();
    assert!(e.reason.contains("out_channel"), "{e}");
}

#[test]
fn elementwise_rules() {
    let mut g = Graph::new("t");
    let x = input(&mut g, "x", DType::Float32, &[4, 3]);
    let b = input(&mut g, "b", DType::Float32, &[3]);
    let h = input(&mut g, "h", DType::Float16, &[4, 3]);
    let i = input(&mut g, "i", DType::Int32, &[4, 3]);
    assert_eq!(
        infer(&g, OpKind::Add, vec![x.clone(), b.clone()], &[]).unwrap(),
        f32(&[4, 3])
    );
    assert_eq!(
        infer(&g, OpKind::Mul, vec![float(0.5), x.clone()], &[]).unwrap(),
        f32(&[4, 3])
    );
    assert_eq!(
        infer(&g, OpKind::Sub, vec![h.clone(), int(1)], &[]).unwrap(),
        Type::Tensor(tt(DType::Float16, &[4, 3]))
    );
    assert_eq!(
        infer(&g, OpKind::Equal, vec![i.clone(), int(3)], &[]).unwrap(),
        Type::Tensor(tt(DType::Bool, &[4, 3]))
    );
    assert_eq!(
        infer(&g, OpKind::BiasAdd, vec![x.clone(), b.clone()], &[]).unwrap(),
        f32(&[4, 3])
    );
    assert_eq!(
        infer(&g, OpKind::GeLU, vec![x.clone()], &[]).unwrap(),
        f32(&[4, 3])
    );
    assert_eq!(
        infer(
            &g,
            OpKind::Cast,
            vec![x.clone()],
            &[("dst_type", word("Float16"))]
        )
        .unwrap(),
        Type::Tensor(tt(DType::Float16, &[4, 3]))
    );
    assert_eq!(
        infer(
            &g,
            OpKind::Cast,
            vec![i.clone()],
            &[("dst_type", word("mstype.float32"))]
        )
        .unwrap(),
        f32(&[4, 3])
    );
    assert_eq!(
        infer(
            &g,
            OpKind::Dropout,
            vec![x.clone()],
            &[("keep_prob", Attr::Float(0.9))]
        )
        .unwrap(),
        Type::Tuple(vec![tt(DType::Float32, &[4, 3]); 2])
    );
    let e = infer(&g, OpKind::Add, vec![x.clone(), h.clone()], &[]).unwrap_err();
    assert_eq!(
        e.reason,
        "mixed element types: input 0 (a) is Float32 but input 1 (b) is Float16"
    );
    let e = infer(&g, OpKind::ReLU, vec![i.clone()], &[]).unwrap_err();
    assert!(e.reason.contains("must have a float element type"), "{e}");
    let e = infer(&g, OpKind::Add, vec![float(1.0), float(2.0)], &[]).unwrap_err();
    assert!(e.reason.contains("both operands are constants"), "{e}");
}

#[test]
fn reduction_rules() {
    let mut g = Graph::new("t");
    let x = input(&mut g, "x", DType::Float32, &[2, 3, 4]);
    assert_eq!(
        infer(&g, OpKind::ReduceMean, vec![x.clone(), ints(&[0, -1])], &[]).unwrap(),
        f32(&[3])
    );
    assert_eq!(
        infer(
            &g,
            OpKind::ReduceSum,
            vec![x.clone(), int(1)],
            &[("keep_dims", Attr::Bool(true))]
        )
        .unwrap(),
        f32(&[2, 1, 4])
    );
    assert_eq!(
        infer(&g, OpKind::ReduceMax, vec![x.clone(), ints(&[])], &[]).unwrap(),
        f32(&[])
    );
    assert_eq!(
        infer(&g, OpKind::ReduceMax, vec![x.clone()], &[]).unwrap(),
        f32(&[])
    );
    assert_eq!(
        infer(
            &g,
            OpKind::Softmax,
            vec![x.clone()],
            &[("axis", Attr::List(vec![Attr::Int(1)]))]
        )
        .unwrap(),
        f32(&[2, 3, 4])
    );
    let e = infer(&g, OpKind::ReduceSum, vec![x.clone(), ints(&[1, -2])], &[]).unwrap_err();
    assert!(e.reason.contains("more than once"), "{e}");

    let img = input(&mut g, "img", DType::Float32, &[2, 3, 5, 5]);
    let c = input(&mut g, "c", DType::Float32, &[3]);
    let bn = infer(
        &g,
        OpKind::BatchNorm,
        vec![img.clone(), c.clone(), c.clone(), c.clone(), c.clone()],
        &[],
    )
    .unwrap();
    assert_eq!(bn.tensors().len(), 5);
    assert_eq!(bn.tensors()[4], tt(DType::Float32, &[3]));
    let g4 = input(&mut g, "g4", DType::Float32, &[4]);
    let ln = infer(
        &g,
        OpKind::LayerNorm,
        vec![x.clone(), g4.clone(), g4.clone()],
        &[],
    )
    .unwrap();
    assert_eq!(
        ln,
        Type::Tuple(vec![
            tt(DType::Float32, &[2, 3, 4]),
            tt(DType::Float32, &[2, 3, 1]),
            tt(DType::Float32, &[2, 3, 1])
        ])
    );
    let e = infer(
        &g,
        OpKind::LayerNorm,
        vec![x.clone(), c.clone(), c.clone()],
        &[],
    )
    .unwrap_err();
    assert!(e.reason.contains("input 1 (gamma) has shape (3) but x of shape (2, 3, 4) with begin_params_axis 2 requires (4)"), "{e}");
    assert_eq!(
        infer(
            &g,
            OpKind::MaxPool,
            vec![img.clone()],
            &[("kernel_size", Attr::Int(2)), ("strides", Attr::Int(2))]
        )
        .unwrap(),
        f32(&[2, 3, 2, 2])
    );
    let e = infer(
        &g,
        OpKind::AvgPool,
        vec![x],
        &[("kernel_size", Attr::Int(2))],
    )
    .unwrap_err();
    assert!(e.reason.contains("must have rank 4 (NCHW)"), "{e}");
}

#[test]
fn movement_rules() {
    let mut g = Graph::new("t");
    let x = input(&mut g, "x", DType::Float32, &[4, 6]);
    let idx = input(&mut g, "idx", DType::Int32, &[5]);
    assert_eq!(
        infer(&g, OpKind::Reshape, vec![x.clone(), ints(&[3, -1, 2])], &[]).unwrap(),
        f32(&[3, 4, 2])
    );
    assert_eq!(
        infer(&g, OpKind::Transpose, vec![x.clone(), ints(&[1, 0])], &[]).unwrap(),
        f32(&[6, 4])
    );
    assert_eq!(
        infer(
            &g,
            OpKind::OneHot,
            vec![idx.clone(), int(10), float(1.0), float(0.0)],
            &[]
        )
        .unwrap(),
        f32(&[5, 10])
    );
    assert_eq!(
        infer(
            &g,
            OpKind::OneHot,
            vec![idx.clone(), int(10), float(1.0), float(0.0)],
            &[("axis", Attr::Int(0))]
        )
        .unwrap(),
        f32(&[10, 5])
    );
    assert_eq!(
        infer(
            &g,
            OpKind::Gather,
            vec![x.clone(), idx.clone(), int(1)],
            &[]
        )
        .unwrap(),
        f32(&[4, 5])
    );
    let y = input(&mut g, "y", DType::Float32, &[4, 2]);
    assert_eq!(
        infer(
            &g,
            OpKind::Concat,
            vec![x.clone(), y.clone(), y.clone()],
            &[("axis", Attr::Int(-1))]
        )
        .unwrap(),
        f32(&[4, 10])
    );
    assert_eq!(
        infer(
            &g,
            OpKind::Split,
            vec![x.clone()],
            &[("axis", Attr::Int(1)), ("output_num", Attr::Int(3))]
        )
        .unwrap(),
        Type::Tuple(vec![tt(DType::Float32, &[4, 2]); 3])
    );
    assert_eq!(
        infer(
            &g,
            OpKind::StridedSlice,
            vec![x.clone(), ints(&[0, -4]), ints(&[8, 6]), ints(&[3, 1])],
            &[]
        )
        .unwrap(),
        f32(&[2, 4])
    );
    assert_eq!(
        infer(
            &g,
            OpKind::StridedSlice,
            vec![x.clone(), ints(&[1]), ints(&[3]), ints(&[1])],
            &[]
        )
        .unwrap(),
        f32(&[2, 6])
    );
    let b = input(&mut g, "b", DType::Float32, &[1, 6]);
    assert_eq!(
        infer(
            &g,
            OpKind::BroadcastTo,
            vec![b.clone(), ints(&[2, 4, -1])],
            &[]
        )
        .unwrap(),
        f32(&[2, 4, 6])
    );
    assert_eq!(
        infer(&g, OpKind::ZerosLike, vec![idx.clone()], &[]).unwrap(),
        Type::Tensor(tt(DType::Int32, &[5]))
    );
    let e = infer(&g, OpKind::Reshape, vec![x.clone(), ints(&[5, 5])], &[]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "Reshape 'reshape': cannot reshape input 0 (x) of shape (4, 6) (24 elements) into (5, 5) (25 elements)"
    );
    let e = infer(&g, OpKind::Concat, vec![x.clone(), idx], &[]).unwrap_err();
    assert!(e.reason.contains("mixed element types"), "{e}");
}

#[test]
fn loss_rules() {
    let mut g = Graph::new("t");
    let logits = input(&mut g, "logits", DType::Float32, &[8, 10]);
    let dense = input(&mut g, "dense", DType::Float32, &[8, 10]);
    let labels = input(&mut g, "labels", DType::Int32, &[8]);
    assert_eq!(
        infer(
            &g,
            OpKind::SoftmaxCrossEntropyWithLogits,
            vec![logits.clone(), dense.clone()],
            &[]
        )
        .unwrap(),
        Type::Tuple(vec![tt(DType::Float32, &[8]), tt(DType::Float32, &[8, 10])])
    );
    assert_eq!(
        infer(
            &g,
            OpKind::SparseSoftmaxCrossEntropyWithLogits,
            vec![logits.clone(), labels.clone()],
            &[]
        )
        .unwrap(),
        f32(&[])
    );
    assert_eq!(
        infer(
            &g,
            OpKind::SparseSoftmaxCrossEntropyWithLogits,
            vec![logits.clone(), labels.clone()],
            &[("is_grad", Attr::Bool(true))]
        )
        .unwrap(),
        f32(&[8, 10])
    );
    let e = infer(
        &g,
        OpKind::SparseSoftmaxCrossEntropyWithLogits,
        vec![logits.clone(), dense],
        &[],
    )
    .unwrap_err();
    assert!(
        e.reason
            .contains("input 1 (labels) must have an integer element type"),
        "{e}"
    );
}

#[test]
fn optimizer_rules() {
    let mut g = Graph::new("t");
    let w = weight(&mut g, "w", &[4, 3]);
    let m = weight(&mut g, "m", &[4, 3]);
    let v = weight(&mut g, "v", &[4, 3]);
    let grad = input(&mut g, "grad", DType::Float32, &[4, 3]);
    let lr = input(&mut g, "lr", DType::Float32, &[]);
    let pair = Type::Tuple(vec![tt(DType::Float32, &[4, 3]); 2]);
    let triple = Type::Tuple(vec![tt(DType::Float32, &[4, 3]); 3]);
    assert_eq!(
        infer(
            &g,
            OpKind::ApplyMomentum,
            vec![w.clone(), m.clone(), lr.clone(), grad.clone(), float(0.9)],
            &[]
        )
        .unwrap(),
        pair
    );
    assert_eq!(
        infer(
            &g,
            OpKind::SGD,
            vec![
                w.clone(),
                grad.clone(),
                float(0.1),
                m.clone(),
                float(0.9),
                v.clone()
            ],
            &[]
        )
        .unwrap(),
        triple
    );
    let adam = vec![
        w.clone(),
        m.clone(),
        v.clone(),
        float(0.9),
        float(0.999),
        lr.clone(),
        float(0.9),
        float(0.999),
        float(1e-8),
        grad.clone(),
    ];
    assert_eq!(infer(&g, OpKind::Adam, adam, &[]).unwrap(), triple);
    let short = input(&mut g, "short", DType::Float32, &[4]);
    let e = infer(
        &g,
        OpKind::ApplyMomentum,
        vec![w.clone(), m.clone(), lr.clone(), short, float(0.9)],
        &[],
    )
    .unwrap_err();
    assert!(
        e.reason
            .contains("input 3 (gradient) has shape (4) but input 0 (variable) has shape (4, 3)"),
        "{e}"
    );
    let e = infer(
        &g,
        OpKind::ApplyMomentum,
        vec![w, m, grad.clone(), grad, float(0.9)],
        &[],
    )
    .unwrap_err();
    assert!(
        e.reason
            .contains("input 2 (learning_rate) must be a scalar"),
        "{e}"
    );
}

#[test]
fn gradient_rules() {
    let mut g = Graph::new("t");
    let y = input(&mut g, "y", DType::Float32, &[4, 3]);
    let dy = input(&mut g, "dy", DType::Float32, &[4, 3]);
    assert_eq!(
        infer(&g, OpKind::ReluGrad, vec![dy.clone(), y.clone()], &[]).unwrap(),
        f32(&[4, 3])
    );
    assert_eq!(
        infer(
            &g,
            OpKind::GeLUGrad,
            vec![dy.clone(), y.clone(), y.clone()],
            &[]
        )
        .unwrap(),
        f32(&[4, 3])
    );
    assert_eq!(
        infer(&g, OpKind::SoftmaxGrad, vec![y.clone(), dy.clone()], &[]).unwrap(),
        f32(&[4, 3])
    );
    assert_eq!(
        infer(&g, OpKind::BiasAddGrad, vec![dy.clone()], &[]).unwrap(),
        f32(&[3])
    );
    assert_eq!(
        infer(
            &g,
            OpKind::StridedSliceGrad,
            vec![
                dy.clone(),
                ints(&[8, 3]),
                ints(&[0, 0]),
                ints(&[8, 3]),
                ints(&[2, 1])
            ],
            &[]
        )
        .unwrap(),
        f32(&[8, 3])
    );
    let ids = input(&mut g, "ids", DType::Int64, &[4]);
    assert_eq!(
        infer(
            &g,
            OpKind::UnsortedSegmentSum,
            vec![dy.clone(), ids, int(10)],
            &[]
        )
        .unwrap(),
        f32(&[10, 3])
    );
    // Conv2D (2, 3, 8, 8) * (6, 3, 3, 3) valid -> (2, 6, 6, 6).
    let x = input(&mut g, "x", DType::Float32, &[2, 3, 8, 8]);
    let w = weight(&mut g, "w", &[6, 3, 3, 3]);
    let dout = input(&mut g, "dout", DType::Float32, &[2, 6, 6, 6]);
    assert_eq!(
        infer(
            &g,
            OpKind::Conv2DBackpropInput,
            vec![dout.clone(), w.clone(), ints(&[2, 3, 8, 8])],
            &[]
        )
        .unwrap(),
        f32(&[2, 3, 8, 8])
    );
    assert_eq!(
        infer(
            &g,
            OpKind::Conv2DBackpropFilter,
            vec![dout.clone(), x.clone(), ints(&[6, 3, 3, 3])],
            &[]
        )
        .unwrap(),
        f32(&[6, 3, 3, 3])
    );
    let e = infer(
        &g,
        OpKind::Conv2DBackpropFilter,
        vec![dout.clone(), x.clone(), ints(&[6, 3, 5, 5])],
        &[],
    )
    .unwrap_err();
    assert!(
        e.reason
            .contains("input 0 (dy) has shape (2, 6, 6, 6) but a convolution"),
        "{e}"
    );
    let pooled = input(&mut g, "pooled", DType::Float32, &[2, 3, 4, 4]);
    assert_eq!(
        infer(
            &g,
            OpKind::MaxPoolGrad,
            vec![x.clone(), pooled.clone(), pooled.clone()],
            &[("kernel_size", Attr::Int(2)), ("strides", Attr::Int(2))]
        )
        .unwrap(),
        f32(&[2, 3, 8, 8])
    );
    let c = input(&mut g, "c", DType::Float32, &[3]);
    assert_eq!(
        infer(
            &g,
            OpKind::BatchNormGrad,
            vec![x.clone(), x.clone(), c.clone(), c.clone(), c.clone()],
            &[]
        )
        .unwrap(),
        Type::Tuple(vec![
            tt(DType::Float32, &[2, 3, 8, 8]),
            tt(DType::Float32, &[3]),
            tt(DType::Float32, &[3])
        ])
    );
    let stats = input(&mut g, "stats", DType::Float32, &[4, 1]);
    let gamma = input(&mut g, "gamma", DType::Float32, &[3]);
    assert_eq!(
        infer(
            &g,
            OpKind::LayerNormGrad,
            vec![
                y.clone(),
                dy.clone(),
                stats.clone(),
                stats.clone(),
                gamma.clone()
            ],
            &[]
        )
        .unwrap(),
        Type::Tuple(vec![
            tt(DType::Float32, &[4, 3]),
            tt(DType::Float32, &[3]),
            tt(DType::Float32, &[3])
        ])
    );
    let e = infer(&g, OpKind::SigmoidGrad, vec![y, c], &[]).unwrap_err();
    assert!(
        e.reason
            .contains("input 1 (dy) has shape (3) but input 0 (y) has shape (4, 3)"),
        "{e}"
    );
}

#[test]
fn comm_rules() {
    let mut g = Graph::new("t");
    let x = input(&mut g, "x", DType::Float32, &[8, 6]);
    let group = ("rank_list", Attr::ints(&[0, 1, 2, 3]));
    assert_eq!(
        infer(
            &g,
            OpKind::AllReduce,
            vec![x.clone()],
            &[("op", word("sum")), group.clone()]
        )
        .unwrap(),
        f32(&[8, 6])
    );
    assert_eq!(
        infer(
            &g,
            OpKind::AllGather,
            vec![x.clone()],
            std::slice::from_ref(&group)
        )
        .unwrap(),
        f32(&[32, 6])
    );
    assert_eq!(
        infer(
            &g,
            OpKind::ReduceScatter,
            vec![x.clone()],
            std::slice::from_ref(&group)
        )
        .unwrap(),
        f32(&[2, 6])
    );
    assert_eq!(
        infer(
            &g,
            OpKind::AllToAll,
            vec![x.clone()],
            &[
                ("split_dim", Attr::Int(0)),
                ("concat_dim", Attr::Int(1)),
                group.clone()
            ]
        )
        .unwrap(),
        f32(&[2, 24])
    );
    assert_eq!(
        infer(
            &g,
            OpKind::Broadcast,
            vec![x.clone()],
            &[("root_rank", Attr::Int(0))]
        )
        .unwrap(),
        f32(&[8, 6])
    );
    assert_eq!(
        infer(
            &g,
            OpKind::Send,
            vec![x.clone()],
            &[("dest_rank", Attr::Int(1))]
        )
        .unwrap(),
        f32(&[8, 6])
    );
    assert_eq!(
        infer(
            &g,
            OpKind::Receive,
            vec![],
            &[
                ("src_rank", Attr::Int(0)),
                ("shape", Attr::ints(&[2, 3])),
                ("dtype", word("Float16"))
            ]
        )
        .unwrap(),
        Type::Tensor(tt(DType::Float16, &[2, 3]))
    );
    let e = infer(
        &g,
        OpKind::ReduceScatter,
        vec![x.clone()],
        &[("rank_list", Attr::ints(&[0, 1, 2]))],
    )
    .unwrap_err();
    assert!(
        e.reason
            .contains("the group of 3 ranks does not divide dim 0"),
        "{e}"
    );
    let e = infer(&g, OpKind::AllReduce, vec![x], &[("op", word("mean"))]).unwrap_err();
    assert!(e.reason.contains("is not a reduction"), "{e}");
}

#[test]
fn plumbing_rules() {
    let mut g = Graph::new("t");
    let w = weight(&mut g, "w", &[4, 3]);
    let x = input(&mut g, "x", DType::Float32, &[4, 3]);
    let d = push(&mut g, OpKind::Dropout, vec![x.clone()], &[]);
    assert_eq!(
        infer(&g, OpKind::TupleGetItem, vec![d.clone(), int(1)], &[]).unwrap(),
        f32(&[4, 3])
    );
    let e = infer(&g, OpKind::TupleGetItem, vec![d.clone(), int(2)], &[]).unwrap_err();
    assert_eq!(
        e.reason,
        "input 1 (index) 2 is out of range for a tuple of 2 element(s)"
    );
    let e = infer(&g, OpKind::ReLU, vec![d], &[]).unwrap_err();
    assert!(
        e.reason
            .contains("is the 2-element tuple result of %1 (Dropout 'dropout')"),
        "{e}"
    );
    assert_eq!(
        infer(&g, OpKind::Assign, vec![w.clone(), x.clone()], &[]).unwrap(),
        f32(&[4, 3])
    );
    let e = infer(&g, OpKind::Assign, vec![x.clone(), w.clone()], &[]).unwrap_err();
    assert_eq!(
        e.reason,
        "input 0 (param) must be a weight parameter, got the data input %para2_x"
    );
}

#[test]
fn infer_graph_fills_types_and_rejects_forward_references() {
    let mut g = Graph::new("t");
    let x = input(&mut g, "x", DType::Float32, &[16, 32]);
    let w = weight(&mut g, "w", &[32, 16]);
    g.push_node(node(OpKind::MatMul, vec![x, w], &[]));
    g.push_node(node(OpKind::ReLU, vec![NodeId(0).into()], &[]));
    g.push_node(node(
        OpKind::ReduceMean,
        vec![NodeId(1).into(), ints(&[0, 1])],
        &[],
    ));
    infer_graph(&mut g).unwrap();
    assert_eq!(g.nodes[0].ty, f32(&[16, 16]));
    assert_eq!(g.nodes[2].ty, f32(&[]));
    g.nodes[0].inputs[0] = NodeId(1).into();
    let e = infer_graph(&mut g).unwrap_err();
    assert_eq!(
        e.reason,
        "input 0 (a) refers to %2, which is not computed before this node"
    );
}

/// More than 25 malformed nodes, each with a fragment of the expected message.
#[test]
fn error_table() {
    let mut g = Graph::new("t");
    let x = input(&mut g, "x", DType::Float32, &[4, 6]); // %para1_x
    let x4 = input(&mut g, "x4", DType::Float32, &[2, 3, 8, 8]); // %para2_x4
    let i = input(&mut g, "i", DType::Int32, &[4]); // %para3_i
    let h = input(&mut g, "h", DType::Float16, &[4, 6]); // %para4_h
    let w = weight(&mut g, "w", &[6, 5]); // %para5_w
    let k = weight(&mut g, "k", &[6, 3, 3, 3]); // %para6_k
    let e = input(&mut g, "e", DType::Float32, &[0, 3]); // %para7_e
    let split = push(
        &mut g,
        OpKind::Split,
        vec![x.clone()],
        &[("output_num", Attr::Int(2))],
    ); // %1
    type Case = (
        OpKind,
        Vec<Operand>,
        Vec<(&'static str, Attr)>,
        &'static str,
    );
    let cases: Vec<Case> = vec![
        (OpKind::MatMul, vec![x.clone()], vec![], "expects 2 operand(s) (a, b), got 1"),
        (OpKind::MatMul, vec![x.clone(), w.clone(), w.clone()], vec![], "expects 2 operand(s) (a, b), got 3"),
        (OpKind::MatMul, vec![x.clone(), ints(&[1])], vec![], "input 1 (b) must be a tensor, got the constant (1)"),
        (OpKind::MatMul, vec![x4.clone(), w.clone()], vec![], "input 0 (a) must have rank 2 (m, k), got shape (2, 3, 8, 8)"),
        (OpKind::MatMul, vec![x.clone(), w.clone()], vec![("transpose_a", Attr::Str("yes".into()))], "attribute `transpose_a` must be true or false, got yes"),
        (OpKind::MatMul, vec![h.clone(), w.clone()], vec![], "mixed element types: input 0 (a) is Float16 but input 1 (b) is Float32"),
        (OpKind::MatMul, vec![x.clone(), w.clone()], vec![("transpose_a", Attr::Bool(true)), ("transpose_x1", Attr::Bool(false))], "attributes `transpose_a` (true) and `transpose_x1` (false) disagree"),
        (OpKind::BatchMatMul, vec![i.clone(), w.clone()], vec![], "input 0 (a) must have a float element type, got <Tensor[Int32], (4)>"),
        (OpKind::Conv2D, vec![x4.clone(), k.clone()], vec![("pad_mode", Attr::Str("full".into()))], "pad_mode `full` is not supported (expected valid, same or pad)"),
        (OpKind::Conv2D, vec![x4.clone(), k.clone()], vec![("group", Attr::Int(0))], "attribute `group` must be positive, got 0"),
        (OpKind::Conv2D, vec![x.clone(), k.clone()], vec![], "the input must have rank 4 (NCHW), got shape (4, 6)"),
        (OpKind::Add, vec![x.clone(), w.clone()], vec![], "cannot broadcast input 0 (a) of shape (4, 6) with input 1 (b) of shape (6, 5)"),
        (OpKind::Add, vec![x.clone(), Operand::Const(Const::Ints(vec![1]))], vec![], "input 1 (b) must be a tensor or a number constant, got the constant (1)"),
        (OpKind::Mul, vec![i.clone(), int(2)], vec![], "needs a float element type, got Int32 operands"),
        (OpKind::BiasAdd, vec![x.clone(), i.clone()], vec![], "mixed element types: input 0 (x) is Float32 but input 1 (b) is Int32"),
        (OpKind::BiasAdd, vec![x4.clone(), w.clone()], vec![], "input 1 (b) has shape (6, 5) but x of shape (2, 3, 8, 8) requires (3)"),
        (OpKind::Cast, vec![x.clone()], vec![], "attribute `dst_type` is missing"),
        (OpKind::Cast, vec![x.clone()], vec![("dst_type", Attr::Str("Float8".into()))], "attribute `dst_type` Float8 is not an element type"),
        (OpKind::Dropout, vec![x.clone()], vec![("keep_prob", Attr::Float(0.0))], "attribute `keep_prob` must be in (0, 1], got 0"),
        (OpKind::ReduceSum, vec![x.clone(), ints(&[2])], vec![], "axis 2 in axes (2) is out of range for rank 2"),
        (OpKind::ReduceMean, vec![x.clone(), w.clone()], vec![], "input 1 (axes) must be a constant tuple of integers, got the tensor %para5_w"),
        (OpKind::Softmax, vec![x.clone()], vec![("axis", Attr::ints(&[0, 1]))], "attribute `axis` must be one integer (or a one-element tuple), got (0, 1)"),
        (OpKind::LogSoftmax, vec![x.clone()], vec![("axis", Attr::Int(5))], "attribute `axis` 5 is out of range for rank 2"),
        (OpKind::BatchNorm, vec![x4.clone(), i.clone(), i.clone(), i.clone(), i.clone()], vec![], "mixed element types: input 0 (x) is Float32 but input 1 (scale) is Int32"),
        (OpKind::MaxPool, vec![x4.clone()], vec![("kernel_size", Attr::Int(9))], "the vertical window (9 with dilation) is larger than the padded input (8)"),
        (OpKind::Reshape, vec![x.clone(), ints(&[-1, -1])], vec![], "shape (-1, -1) has more than one -1"),
        (OpKind::Reshape, vec![x.clone(), ints(&[5, -1])], vec![], "the -1 cannot be resolved"),
        (OpKind::Transpose, vec![x.clone(), ints(&[0, 0])], vec![], "perm (0, 0) is not a permutation of the 2 axes of input 0 (x) (shape (4, 6))"),
        (OpKind::OneHot, vec![x.clone(), int(3), float(1.0), float(0.0)], vec![], "input 0 (indices) must have an integer element type (Int32 or Int64), got <Tensor[Float32], (4, 6)>"),
        (OpKind::OneHot, vec![i.clone(), float(3.0), float(1.0), float(0.0)], vec![], "input 1 (depth) must be a constant integer, got the constant 3.0"),
        (OpKind::Gather, vec![x.clone(), i.clone(), int(2)], vec![], "input 2 (axis) 2 is out of range for input 0 (params) of shape (4, 6)"),
        (OpKind::Concat, vec![x.clone(), w.clone()], vec![], "input 1 (x2) of shape (6, 5) does not match input 0 (x1) of shape (4, 6) off axis 0"),
        (OpKind::Concat, vec![], vec![], "expects at least 1 operand(s), got 0"),
        (OpKind::Split, vec![x.clone()], vec![("output_num", Attr::Int(4)), ("axis", Attr::Int(1))], "output_num 4 does not divide dim 1 (size 6) of input 0 (x) of shape (4, 6)"),
        (OpKind::Split, vec![e.clone()], vec![("output_num", Attr::Int(i64::MAX))], "attribute `output_num` 9223372036854775807 is more than the 65536 results a node may have"),
        (OpKind::StridedSlice, vec![x.clone(), ints(&[0]), ints(&[2, 2]), ints(&[1])], vec![], "must have equal lengths"),
        (OpKind::StridedSlice, vec![x.clone(), ints(&[0]), ints(&[2]), ints(&[0])], vec![], "stride 0 of dim 0 in strides (0) is not positive"),
        (OpKind::StridedSlice, vec![x.clone(), ints(&[0]), ints(&[2]), ints(&[1])], vec![("shrink_axis_mask", Attr::Int(1))], "attribute `shrink_axis_mask` 1 is not supported (only 0)"),
        (OpKind::BroadcastTo, vec![x.clone(), ints(&[4, 5])], vec![], "cannot broadcast input 0 (x) of shape (4, 6) to (4, 5): dim 1 is 6, neither 5 nor 1"),
        (OpKind::SoftmaxCrossEntropyWithLogits, vec![x.clone(), w.clone()], vec![], "input 1 (labels) has shape (6, 5) but input 0 (logits) has shape (4, 6); they must be equal"),
        (OpKind::SparseSoftmaxCrossEntropyWithLogits, vec![w.clone(), i.clone()], vec![], "input 1 (labels) has shape (4) but logits of shape (6, 5) requires (6)"),
        (OpKind::SGD, vec![w.clone(), w.clone(), float(0.1), w.clone(), Operand::Const(Const::Bool(true)), w.clone()], vec![], "input 4 (momentum) must be a number constant or a one-element float tensor, got the constant true"),
        (OpKind::Conv2DBackpropInput, vec![x4.clone(), k.clone(), ints(&[2, 3, -8, 8])], vec![], "input 2 (input_size) must hold sizes (integers >= 0), got (2, 3, -8, 8)"),
        (OpKind::UnsortedSegmentSum, vec![w.clone(), i.clone(), int(3)], vec![], "input 1 (segment_ids) of shape (4) is not a prefix of input 0 (x) of shape (6, 5)"),
        (OpKind::AllGather, vec![x.clone()], vec![], "attribute `rank_list` is missing"),
        (OpKind::AllGather, vec![x.clone()], vec![("rank_list", Attr::ints(&[0, 0]))], "attribute `rank_list` (0, 0) must hold distinct ranks >= 0"),
        (OpKind::AllToAll, vec![x.clone()], vec![("split_dim", Attr::Int(1)), ("concat_dim", Attr::Int(0)), ("split_count", Attr::Int(4))], "split_count 4 does not divide dim 1 of input 0 (x) of shape (4, 6)"),
        (OpKind::AllToAll, vec![e.clone()], vec![("split_dim", Attr::Int(0)), ("concat_dim", Attr::Int(1)), ("split_count", Attr::Int(i64::MAX))], "split_count 9223372036854775807 times dim 1 of input 0 (x) of shape (0, 3) overflows a size"),
        (OpKind::Send, vec![x.clone()], vec![], "attribute `dest_rank` is missing"),
        (OpKind::Receive, vec![], vec![("src_rank", Attr::Int(0)), ("shape", Attr::ints(&[2]))], "attribute `dtype` is missing"),
        (OpKind::Receive, vec![x.clone()], vec![], "expects no operands, got 1"),
        (OpKind::TupleGetItem, vec![x.clone(), int(0)], vec![], "input 0 (t) must be the result of a node, got the parameter %para1_x"),
        (OpKind::TupleGetItem, vec![split.clone(), float(0.0)], vec![], "input 1 (index) must be a constant integer, got the constant 0.0"),
        (OpKind::Assign, vec![w.clone(), x.clone()], vec![], "input 1 (value) is <Tensor[Float32], (4, 6)> but the parameter %para5_w is <Tensor[Float32], (6, 5)>; they must be equal"),
        (OpKind::ReLU, vec![Operand::Node(NodeId(7))], vec![], "input 0 (x) refers to %8, which does not exist"),
    ];
    assert!(cases.len() >= 25);
    for (op, inputs, attrs, want) in cases {
        let attrs: Vec<(&str, Attr)> = attrs.into_iter().collect();
        match infer(&g, op, inputs.clone(), &attrs) {
            Ok(t) => panic!(
                "{op} {inputs:?} {attrs:?}: expected an error containing {want:?}, got {t:?}"
            ),
            Err(e) => {
                assert_eq!(e.op, op);
                assert_eq!(e.instance, op.name().to_lowercase());
                assert!(
                    e.reason.contains(want),
                    "{op}: expected {want:?} in {:?}",
                    e.reason
                );
                assert!(e
                    .to_string()
                    .starts_with(&format!("{op} '{}': ", e.instance)));
            }
        }
    }
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    fn conv_node(stride: usize, dil: usize, mode: &str, pads: [i64; 4]) -> Node {
        let mut attrs = vec![
            ("stride", Attr::Int(stride as i64)),
            ("dilation", Attr::Int(dil as i64)),
            ("pad_mode", word(mode)),
        ];
        if mode == "pad" {
            attrs.push(("pad", Attr::ints(&pads)));
        }
        node(OpKind::Conv2D, vec![], &attrs)
    }

    proptest! {
        /// Every output position's window fits the padded input, and one more would not.
        #[test]
        fn conv_geometry_is_tight(
            h in 1usize..40, w in 1usize..40, kh in 1usize..6, kw in 1usize..6,
            stride in 1usize..4, dil in 1usize..3, mode in 0usize..3,
            pads in proptest::array::uniform4(0i64..3),
        ) {
            let mode = ["valid", "same", "pad"][mode];
            let n = conv_node(stride, dil, mode, pads);
            if let Ok(g) = conv2d_geometry(&n, &[1, 2, h, w], &[3, 2, kh, kw]) {
                for (inp, k, before, after, out) in [
                    (h, kh, g.pad_top, g.pad_bottom, g.out_h),
                    (w, kw, g.pad_left, g.pad_right, g.out_w),
                ] {
                    let eff = (k - 1) * dil + 1;
                    let padded = inp + before + after;
                    prop_assert!(out >= 1);
                    prop_assert!((out - 1) * stride + eff <= padded);
                    prop_assert!(out * stride + eff > padded);
                    if mode == "same" {
                        prop_assert_eq!(out, inp.div_ceil(stride));
                        prop_assert!(before <= after && after <= before + 1);
                    }
                }
            } else {
                // Only a window larger than the padded input is an error here.
                prop_assert!(mode != "same");
            }
        }

        #[test]
        fn broadcast_is_commutative(
            a in proptest::collection::vec(1usize..4, 0..4),
            b in proptest::collection::vec(1usize..4, 0..4),
        ) {
            let ab = broadcast_shapes(&a, &b);
            prop_assert_eq!(&ab, &broadcast_shapes(&b, &a));
            if let Some(s) = ab {
                prop_assert_eq!(s.len(), a.len().max(b.len()));
                // Broadcasting each operand to the result changes nothing more.
                prop_assert_eq!(broadcast_shapes(&a, &s), Some(s.clone()));
                prop_assert_eq!(broadcast_shapes(&b, &s), Some(s.clone()));
            }
        }

        /// Shape inference never panics, whatever the operands and attributes.
        #[test]
        fn never_panics(
            op in 0usize..OpKind::ALL.len(),
            picks in proptest::collection::vec(0usize..14, 0..11),
            attr_picks in proptest::collection::vec((0usize..22, 0usize..8), 0..6),
            exact_arity in proptest::bool::ANY,
        ) {
            let mut g = Graph::new("t");
            let pool = [
                input(&mut g, "a", DType::Float32, &[4, 6]),
                input(&mut g, "b", DType::Float32, &[2, 3, 8, 8]),
                input(&mut g, "c", DType::Int32, &[4]),
                input(&mut g, "d", DType::Float16, &[]),
                input(&mut g, "e", DType::Float32, &[0, 3]),
                weight(&mut g, "w", &[6, 3, 3, 3]),
            ];
            let s = push(&mut g, OpKind::Dropout, vec![pool[0].clone()], &[]);
            let consts = [
                int(-1), int(7), float(0.5), ints(&[]), ints(&[0, -1]), ints(&[-1, 3, i64::MAX]),
                Operand::Const(Const::Bool(true)),
            ];
            let mut operands: Vec<Operand> = pool.to_vec();
            operands.push(s);
            operands.extend(consts);
            operands.push(Operand::Node(NodeId(99)));
            let keys = [
                "axis", "keep_dims", "transpose_a", "kernel_size", "strides", "stride", "pad_mode",
                "pad", "rank_list", "output_num", "split_dim", "dst_type", "group", "dilation",
                "split_count", "concat_dim", "shape", "dtype", "begin_norm_axis",
                "begin_params_axis", "src_rank", "keep_prob",
            ];
            let values = [
                Attr::Int(-1), Attr::Int(i64::MAX), Attr::Int(0), Attr::Bool(true), word("same"),
                Attr::ints(&[1, 1, 2, 2]), Attr::ints(&[0, 0]), Attr::Float(f64::NAN),
            ];
            let arity = if exact_arity { signature(OpKind::ALL[op]).operands.len() } else { picks.len() };
            let inputs = (0..arity)
                .map(|j| operands[picks.get(j).copied().unwrap_or(j) % operands.len()].clone())
                .collect();
            let attrs: Vec<(&str, Attr)> =
                attr_picks.iter().map(|&(k, v)| (keys[k], values[v].clone())).collect();
            let _ = infer(&g, OpKind::ALL[op], inputs, &attrs);
        }
    }
}

/// The collectives' `axis` attribute (`AllGather`, `ReduceScatter`).
mod comm {
    use crate::infer::infer_node;
    use shardc_ir::{Attr, Attrs, DType, Graph, Node, OpKind, Operand, Param, ParamKind};
    use shardc_ir::{TensorType, Type};

    fn run(op: OpKind, shape: &[usize], attrs: &[(&str, Attr)]) -> Result<Type, String> {
        let mut g = Graph::new("t");
        let x: Operand = g
            .add_param(Param {
                name: "x".into(),
                ty: TensorType::new(DType::Float32, shape.to_vec()),
                kind: ParamKind::Input,
            })
            .into();
        let mut n = Node::new(op, vec![x]);
        n.instance = "c".into();
        n.attrs = attrs
            .iter()
            .fold(Attrs::new(), |a, (k, v)| a.with(*k, v.clone()));
        infer_node(&g, &n).map_err(|e| e.to_string())
    }

    fn f32(shape: &[usize]) -> Type {
        Type::Tensor(TensorType::new(DType::Float32, shape.to_vec()))
    }

    #[test]
    fn gather_and_scatter_take_an_axis() {
        let g2 = ("rank_list", Attr::ints(&[0, 1]));
        let g4 = ("rank_list", Attr::ints(&[0, 1, 2, 3]));
        for (axis, want) in [
            (0, [16, 6, 4]),
            (1, [8, 12, 4]),
            (2, [8, 6, 8]),
            (-1, [8, 6, 8]),
            (-3, [16, 6, 4]),
        ] {
            let got = run(
                OpKind::AllGather,
                &[8, 6, 4],
                &[g2.clone(), ("axis", Attr::Int(axis))],
            );
            assert_eq!(got, Ok(f32(&want)), "AllGather axis {axis}");
        }
        // Default: axis 0.
        assert_eq!(
            run(OpKind::AllGather, &[8, 6, 4], std::slice::from_ref(&g2)),
            Ok(f32(&[16, 6, 4]))
        );
        let g6 = ("rank_list", Attr::ints(&[0, 1, 2, 3, 4, 5]));
        for (group, axis, want) in [
            (&g4, 0, [2, 6, 4]),
            (&g4, 2, [8, 6, 1]),
            (&g6, -2, [8, 1, 4]),
        ] {
            let got = run(
                OpKind::ReduceScatter,
                &[8, 6, 4],
                &[group.clone(), ("axis", Attr::Int(axis))],
            );
            assert_eq!(got, Ok(f32(&want)), "ReduceScatter axis {axis}");
        }
    }

    #[test]
    fn bad_axes_name_the_op_and_value() {
        let g4 = ("rank_list", Attr::ints(&[0, 1, 2, 3]));
        let e = run(
            OpKind::AllGather,
            &[8, 6],
            &[g4.clone(), ("axis", Attr::Int(2))],
        )
        .unwrap_err();
        assert!(e.contains("AllGather 'c'"), "{e}");
        assert!(
            e.contains("attribute `axis` 2 is out of range for input 0 (x) of shape (8, 6)"),
            "{e}"
        );
        let e = run(
            OpKind::ReduceScatter,
            &[8, 6],
            &[g4.clone(), ("axis", Attr::Int(-3))],
        )
        .unwrap_err();
        assert!(e.contains("ReduceScatter 'c'"), "{e}");
        assert!(e.contains("attribute `axis` -3 is out of range"), "{e}");
        let e = run(
            OpKind::ReduceScatter,
            &[8, 6],
            &[g4.clone(), ("axis", Attr::Int(1))],
        )
        .unwrap_err();
        assert!(
            e.contains("the group of 4 ranks does not divide dim 1 of input 0 (x) of shape (8, 6)"),
            "{e}"
        );
        let e = run(
            OpKind::AllGather,
            &[8, 6],
            &[g4, ("axis", Attr::Str("one".into()))],
        )
        .unwrap_err();
        assert!(e.contains("`axis`"), "{e}");
    }
}
