//! Hand-built graphs shared by the integration tests.

#![allow(dead_code)]

use shardc_ir::{
    Attr, Attrs, Const, DType, Graph, Init, Node, NodeId, OpKind, Operand, Param, ParamKind,
    Strategy, TensorType, Type,
};

/// The path of `models/quickstart.ir`, the tutorial's net written by hand (in the repository).
pub const QUICKSTART: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../models/quickstart.ir");

/// The text of `models/quickstart.ir`.
pub fn quickstart_text() -> String {
    std::fs::read_to_string(QUICKSTART).expect("models/quickstart.ir is readable")
}

fn t(dtype: DType, shape: &[usize]) -> TensorType {
    TensorType::new(dtype, shape.to_vec())
}

fn weight(name: &str, ty: TensorType, init: Init, requires_grad: bool) -> Param {
    Param {
        name: name.into(),
        ty,
        kind: ParamKind::Weight {
            init,
            requires_grad,
        },
    }
}

/// A typed graph that uses every feature of the text form: every DType, every Init, every
/// Attr and Const kind, tuple types, comments, scopes, strategies, cnode_attrs, odd names and
/// several outputs.
pub fn full_graph() -> Graph {
    let mut g = Graph::new("Everything");
    let x = g.add_param(Param {
        name: "x".into(),
        ty: t(DType::Float32, &[8, 16]),
        kind: ParamKind::Input,
    });
    let inits = [
        Init::Normal {
            sigma: 0.01,
            mean: 0.0,
            seed: 1,
        },
        Init::Normal {
            sigma: 0.5,
            mean: -1.25,
            seed: u64::MAX,
        },
        Init::Uniform {
            scale: 0.07,
            seed: 3,
        },
        Init::Zeros,
        Init::Ones,
        Init::Constant { value: 1e-5 },
        Init::XavierUniform { gain: 1.0, seed: 4 },
        Init::HeNormal { seed: 5 },
    ];
    let mut weights = Vec::new();
    for (i, init) in inits.into_iter().enumerate() {
        let dtype = DType::ALL[i % DType::ALL.len()];
        weights.push(g.add_param(weight(
            &format!("w{i}.weight"),
            t(dtype, &[16, 16]),
            init,
            i % 3 != 2,
        )));
    }
    for (i, &dtype) in DType::ALL.iter().enumerate() {
        g.add_param(Param {
            name: format!("in_{}", dtype.name()),
            ty: t(dtype, &vec![2; i]),
            kind: ParamKind::Input,
        });
    }
    let odd = g.add_param(weight(
        "odd name \"quoted\"",
        t(DType::Float32, &[]),
        Init::Constant { value: -0.0 },
        true,
    ));

    let f32_8_16 = t(DType::Float32, &[8, 16]);
    let mut mm = Node::new(OpKind::MatMul, vec![x.into(), weights[0].into()]);
    mm.attrs = Attrs::new()
        .with("transpose_a", Attr::Bool(false))
        .with("transpose_b", Attr::Bool(true))
        .with(
            "input_names",
            Attr::List(vec![Attr::Str("x1".into()), Attr::Str("x2".into())]),
        )
        .with("out_strategy", Attr::Int(7)) // an attribute that merely shares the name
        .with("none", Attr::None)
        .with("neg", Attr::Int(i64::MIN))
        .with("f", Attr::Float(0.1))
        .with("big", Attr::Float(1e300))
        .with("tiny", Attr::Float(-5e-324))
        .with("inf", Attr::Float(f64::NEG_INFINITY))
        .with("word", Attr::Str("4-6301172352641561019".into()))
        .with("ranks", Attr::Str("0-1-2-3".into()))
        .with("num_str", Attr::Str("12".into()))
        .with("bool_str", Attr::Str("true".into()))
        .with("empty_str", Attr::Str(String::new()))
        .with("spaces", Attr::Str("a b, c: {d}".into()))
        .with("escapes", Attr::Str("q\"b\\n\n\t\r\u{7}é".into()))
        .with("one", Attr::Tuple(vec![Attr::Int(5)]))
        .with("empty_tuple", Attr::Tuple(vec![]))
        .with("empty_list", Attr::List(vec![]))
        .with(
            "nested",
            Attr::Tuple(vec![
                Attr::List(vec![Attr::Tuple(vec![Attr::Int(1), Attr::Float(2.0)])]),
                Attr::Str("s".into()),
                Attr::None,
            ]),
        )
        .with("odd key!", Attr::Bool(true))
        .with("in_strategy", Attr::Str("not a strategy".into()));
    mm.ty = Type::Tensor(f32_8_16.clone());
    mm.name = "out".into();
    mm.instance = "matmul".into();
    mm.scope = "Default/network-WithLossCell/_backbone-Net".into();
    mm.in_strategy = Some(Strategy(vec![vec![2, 4], vec![4, 1]]));
    mm.out_strategy = Some(Strategy(vec![vec![8, 1]]));
    mm.comments = vec![
        "strategy from: user".into(),
        String::new(),
        "  indented # hash".into(),
    ];
    let mm = g.push_node(mm);

    let mut ar = Node::new(OpKind::AllReduce, vec![mm.into()]);
    ar.attrs = Attrs::new()
        .with("group", Attr::Str("4-6301172352641561019".into()))
        .with("fusion", Attr::Int(0))
        .with("op", Attr::Str("sum".into()))
        .with("rank_list", Attr::ints(&[0, 1, 2, 3]));
    ar.cnode_attrs = Attrs::new()
        .with("comm_reuse", Attr::Bool(true))
        .with("k", Attr::List(vec![Attr::Float(0.5)]));
    ar.ty = Type::Tensor(f32_8_16.clone());
    ar.name = "equiv[CNode]520".into();
    ar.instance = "forward_op_11795743325248501408".into();
    let ar = g.push_node(ar);

    let mut ss = Node::new(
        OpKind::StridedSlice,
        vec![
            ar.into(),
            Const::Ints(vec![0, 0]).into(),
            Const::Ints(vec![8, 4]).into(),
            Const::Ints(vec![1, -1]).into(),
        ],
    );
    ss.ty = Type::Tensor(t(DType::Float32, &[8, 4]));
    ss.name = "name (with parens)".into();
    ss.instance = "redistribution {odd} instance".into();
    // Empty scope, but the first comment looks like a scope line.
    ss.comments = vec!["scope: (not the scope)".into()];
    let ss = g.push_node(ss);

    let consts = g.push_node({
        let mut n = Node::new(
            OpKind::Mul,
            vec![
                ss.into(),
                Const::Float(0.5).into(),
                Const::Int(-3).into(),
                Const::Bool(true).into(),
                Const::Ints(vec![5]).into(),
                Const::Ints(vec![]).into(),
                Const::Float(1.0).into(),
                Const::Float(1e-7).into(),
                Const::Float(f64::INFINITY).into(),
            ],
        );
        n.ty = Type::Tensor(t(DType::Float32, &[8, 4]));
        n.name = String::new();
        n.in_strategy = Some(Strategy(vec![vec![2, 4], vec![], vec![1]]));
        n
    });

    let split = g.push_node({
        let mut n = Node::new(OpKind::Split, vec![consts.into()]);
        n.attrs = Attrs::new()
            .with("axis", Attr::Int(0))
            .with("output_num", Attr::Int(2));
        n.ty = Type::Tuple(vec![t(DType::Float32, &[4, 4]), t(DType::Float32, &[4, 4])]);
        n.scope = "Default/with ) paren".into();
        n
    });
    let first = g.push_node({
        let mut n = Node::new(
            OpKind::TupleGetItem,
            vec![split.into(), Const::Int(0).into()],
        );
        n.ty = Type::Tensor(t(DType::Float32, &[4, 4]));
        n.out_strategy = Some(Strategy(vec![]));
        n
    });
    // A node not yet inferred: no type line.
    let untyped = g.push_node(Node::new(OpKind::Add, vec![first.into(), odd.into()]));
    let cast = g.push_node({
        let mut n = Node::new(OpKind::Cast, vec![untyped.into()]);
        n.attrs = Attrs::new().with("dst_type", Attr::Str("Float16".into()));
        n.ty = Type::Tensor(t(DType::Float16, &[4, 4]));
        n.instance = "\"quoted\" instance".into();
        n
    });
    let empty_tuple_typed = g.push_node({
        let mut n = Node::new(OpKind::ZerosLike, vec![weights[4].into()]);
        n.ty = Type::Tensor(t(DType::Int32, &[16, 16]));
        n
    });
    g.outputs = vec![
        Operand::Node(cast),
        Operand::Node(empty_tuple_typed),
        Operand::Param(weights[1]),
        Operand::Node(NodeId(0)),
    ];
    g
}

/// A small typed graph of the quickstart net, as the frontend would build it.
pub fn small_graph() -> Graph {
    let mut g = Graph::new("Net");
    let x = g.add_param(Param {
        name: "x".into(),
        ty: t(DType::Float32, &[16, 32]),
        kind: ParamKind::Input,
    });
    let w = g.add_param(weight(
        "w",
        t(DType::Float32, &[32, 16]),
        Init::Normal {
            sigma: 0.01,
            mean: 0.0,
            seed: 1,
        },
        true,
    ));
    let mut mm = Node::new(OpKind::MatMul, vec![x.into(), w.into()]);
    mm.ty = Type::Tensor(t(DType::Float32, &[16, 16]));
    mm.instance = "matmul".into();
    mm.in_strategy = Some(Strategy(vec![vec![2, 4], vec![4, 1]]));
    let mm = g.push_node(mm);
    let mut r = Node::new(
        OpKind::ReduceMean,
        vec![mm.into(), Const::Ints(vec![0, 1]).into()],
    );
    r.ty = Type::Tensor(t(DType::Float32, &[]));
    r.attrs = Attrs::new().with("keep_dims", Attr::Bool(false));
    r.instance = "reduce_mean".into();
    r.scope = "Default".into();
    let r = g.push_node(r);
    g.outputs = vec![r.into()];
    g
}
