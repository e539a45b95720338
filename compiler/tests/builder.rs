//! The builder and the op primitives: names, scopes, strategies, errors, seeds.

use shardc_compiler::builder::{BuildError, GraphBuilder};
use shardc_compiler::{init, ops, zoo};
use shardc_ir::{Const, DType, Init, OpKind, Operand, ParamKind, Strategy, TensorType};

fn xw() -> (GraphBuilder, shardc_compiler::Value, shardc_compiler::Value) {
    let mut b = GraphBuilder::new("Net");
    let x = b.input("x", DType::Float32, &[16, 32]).unwrap();
    let w = b
        .weight("w", DType::Float32, &[32, 16], init::normal(0.01))
        .unwrap();
    (b, x, w)
}

#[test]
fn instance_names_count_from_two() {
    let (mut b, x, w) = xw();
    let a = b.matmul(x, w).unwrap();
    let r = b.relu(a).unwrap();
    let w2 = b
        .weight("w2", DType::Float32, &[16, 16], init::zeros())
        .unwrap();
    let c = b.matmul(r, w2).unwrap();
    let d = b.matmul(c, w2).unwrap();
    let m = b.reduce_mean(d, &[], false).unwrap();
    let g = b.finish(&[m]).unwrap();
    let names: Vec<&str> = g.nodes.iter().map(|n| n.instance.as_str()).collect();
    assert_eq!(
        names,
        ["matmul", "relu", "matmul2", "matmul3", "reduce_mean"]
    );
    assert_eq!(
        g.nodes[4].ty.as_tensor(),
        Some(&TensorType::scalar(DType::Float32))
    );
}

#[test]
fn explicit_instance_names_stay_unique() {
    let (mut b, x, w) = xw();
    let a = ops::MatMul::new()
        .instance("dense")
        .call(&mut b, x, w)
        .unwrap();
    let c = ops::ReLU::new().instance("dense").call(&mut b, a).unwrap();
    let d = b.matmul(x, x).unwrap_err();
    // The failed op did not claim a name: the next matmul is still `matmul`.
    assert!(d.to_string().contains("matmul"), "{d}");
    let w2 = b
        .weight("w2", DType::Float32, &[16, 16], init::zeros())
        .unwrap();
    let e = b.matmul(c, w2).unwrap();
    let g = b.finish(&[e]).unwrap();
    let names: Vec<&str> = g.nodes.iter().map(|n| n.instance.as_str()).collect();
    assert_eq!(names, ["dense", "dense2", "matmul"]);
}

#[test]
fn scopes_nest_and_pop() {
    let (mut b, x, w) = xw();
    b.push_scope("Default");
    b.push_scope("network-WithLossCell");
    let a = b.matmul(x, w).unwrap();
    b.pop_scope();
    let r = b.relu(a).unwrap();
    b.pop_scope();
    b.pop_scope(); // popping past the bottom does nothing
    let s = b.reduce_sum(r, &[0, 1], false).unwrap();
    let g = b.finish(&[s]).unwrap();
    let scopes: Vec<&str> = g.nodes.iter().map(|n| n.scope.as_str()).collect();
    assert_eq!(scopes, ["Default/network-WithLossCell", "Default", ""]);
}

#[test]
fn shard_takes_tuples_and_vectors() {
    let (mut b, x, w) = xw();
    let a = ops::MatMul::new()
        .shard(vec![vec![2i64, 4], vec![4, 1]])
        .call(&mut b, x, w)
        .unwrap();
    let r = ops::ReLU::new().shard(((2, 4),)).call(&mut b, a).unwrap();
    let s = ops::ReduceSum::new()
        .shard(((8, 1),))
        .call(&mut b, r, &[1])
        .unwrap();
    let m = ops::MatMul::new()
        .out_strategy(((8, 1),))
        .call(&mut b, x, w)
        .unwrap();
    let g = b.finish(&[s, m]).unwrap();
    assert_eq!(
        g.nodes[0].in_strategy,
        Some(Strategy(vec![vec![2, 4], vec![4, 1]]))
    );
    assert_eq!(g.nodes[1].in_strategy, Some(Strategy(vec![vec![2, 4]])));
    // The constant axes of ReduceSum take no strategy entry.
    assert_eq!(g.nodes[2].in_strategy, Some(Strategy(vec![vec![8, 1]])));
    assert_eq!(g.nodes[3].out_strategy, Some(Strategy(vec![vec![8, 1]])));
}

fn strategy_error(
    f: impl FnOnce(
        &mut GraphBuilder,
        shardc_compiler::Value,
        shardc_compiler::Value,
    ) -> Result<shardc_compiler::Value, BuildError>,
) -> String {
    let (mut b, x, w) = xw();
    let err = f(&mut b, x, w).unwrap_err();
    assert!(matches!(err, BuildError::Strategy { .. }), "{err:?}");
    // Nothing was added.
    assert!(b.graph().nodes.is_empty());
    err.to_string()
}

#[test]
fn shard_with_bad_arity_is_a_clear_error() {
    let msg = strategy_error(|b, x, w| ops::MatMul::new().shard(((2, 4),)).call(b, x, w));
    assert!(msg.contains("op `matmul` (MatMul)"), "{msg}");
    assert!(msg.contains("in_strategy ((2, 4))"), "{msg}");
    assert!(
        msg.contains("has 1 entries, but the op has 2 tensor inputs"),
        "{msg}"
    );

    let msg = strategy_error(|b, x, _| ops::ReLU::new().shard(((2, 4), (1, 1))).call(b, x));
    assert!(msg.contains("op `relu` (ReLU)"), "{msg}");
    assert!(
        msg.contains("has 2 entries, but the op has 1 tensor inputs"),
        "{msg}"
    );
}

#[test]
fn shard_with_bad_rank_or_split_is_a_clear_error() {
    let msg = strategy_error(|b, x, w| {
        ops::MatMul::new()
            .instance("mm")
            .shard(((2, 4, 1), (4, 1)))
            .call(b, x, w)
    });
    assert!(msg.contains("op `mm` (MatMul)"), "{msg}");
    assert!(msg.contains("entry 0 [2, 4, 1] has 3 dimensions"), "{msg}");
    assert!(msg.contains("%para1_x has shape [16, 32]"), "{msg}");

    let msg = strategy_error(|b, x, w| ops::MatMul::new().shard(((3, 4), (4, 1))).call(b, x, w));
    assert!(
        msg.contains("splits dimension 0 of %para1_x (size 16) into 3 parts"),
        "{msg}"
    );

    let msg = strategy_error(|b, x, w| ops::MatMul::new().shard(((0, 4), (4, 1))).call(b, x, w));
    assert!(msg.contains("at least 1"), "{msg}");

    let msg = strategy_error(|b, x, w| {
        ops::MatMul::new()
            .out_strategy(((2, 4), (1, 1)))
            .call(b, x, w)
    });
    assert!(msg.contains("out_strategy"), "{msg}");
}

#[test]
fn shape_errors_name_the_instance() {
    let (mut b, x, _) = xw();
    let w = b
        .weight("w_bad", DType::Float32, &[16, 16], init::zeros())
        .unwrap();
    let err = ops::MatMul::new()
        .instance("matmul")
        .call(&mut b, x, w)
        .unwrap_err();
    assert!(
        matches!(
            err,
            BuildError::Infer {
                op: OpKind::MatMul,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        err.to_string().starts_with("op `matmul` (MatMul): "),
        "{err}"
    );
}

#[test]
fn values_of_another_graph_are_rejected() {
    let (mut b, x, w) = xw();
    let a = b.matmul(x, w).unwrap();
    let (mut other, _, _) = xw();
    let err = other.relu(a).unwrap_err();
    assert!(matches!(err, BuildError::UnknownValue { .. }), "{err:?}");
    assert!(
        err.to_string().contains("op `relu` (ReLU): operand 0 (%1"),
        "{err}"
    );
}

#[test]
fn parameters_are_checked() {
    let (mut b, _, _) = xw();
    let err = b.input("x", DType::Float32, &[1]).unwrap_err();
    assert!(matches!(err, BuildError::DuplicateParam { .. }), "{err}");
    assert!(b.input("bad name", DType::Float32, &[1]).is_err());
    assert!(b.input("z", DType::Float32, &[0, 3]).is_err());
    b.push_name_prefix("fc1");
    let v = b
        .weight("weight", DType::Float32, &[2, 2], init::ones())
        .unwrap();
    assert_eq!(
        b.graph().params.last().map(|p| p.name.as_str()),
        Some("fc1.weight")
    );
    assert_eq!(b.ty(&v), Some(TensorType::new(DType::Float32, vec![2, 2])));
}

#[test]
fn scalar_constants_are_operands() {
    let (mut b, x, _) = xw();
    let y = ops::Mul::new().call(&mut b, -1.0, x).unwrap();
    let g = b.finish(&[y]).unwrap();
    assert_eq!(g.nodes[0].inputs[0], Operand::Const(Const::Float(-1.0)));
    assert_eq!(
        g.nodes[0].ty.as_tensor().map(|t| t.shape.clone()),
        Some(vec![16, 32])
    );
}

fn seeds(g: &shardc_ir::Graph) -> Vec<u64> {
    g.params
        .iter()
        .filter_map(|p| match &p.kind {
            ParamKind::Weight {
                init: Init::Normal { seed, .. } | Init::Uniform { seed, .. },
                ..
            } => Some(*seed),
            _ => None,
        })
        .collect()
}

#[test]
fn same_seed_same_graph() {
    let build = |seed: u64| {
        let mut b = GraphBuilder::new("Net").with_seed(seed);
        let x = b.input("x", DType::Float32, &[4, 8]).unwrap();
        let w = b
            .weight("w", DType::Float32, &[8, 8], init::normal(0.1))
            .unwrap();
        let w2 = b
            .weight("w2", DType::Float32, &[8, 2], init::uniform(0.5))
            .unwrap();
        let y = b.matmul(x, w).unwrap();
        let y = ops::Dropout::new(0.9).call_output(&mut b, y).unwrap();
        let y = b.matmul(y, w2).unwrap();
        let l = b.reduce_mean(y, &[], false).unwrap();
        b.finish(&[l]).unwrap()
    };
    assert_eq!(build(42), build(42));
    assert_ne!(build(42), build(43));
    let s = seeds(&build(42));
    assert_eq!(s.len(), 2);
    assert_ne!(s[0], s[1]);
    assert_ne!(seeds(&build(42)), seeds(&build(43)));
    // Larger programs too.
    assert_eq!(zoo::lenet(4).unwrap(), zoo::lenet(4).unwrap());
}

#[test]
fn exact_weights_keep_their_seed() {
    let mut b = GraphBuilder::new("Net").with_seed(9);
    b.weight_exact(
        "w",
        DType::Float32,
        &[2, 2],
        Init::Normal {
            sigma: 1.0,
            mean: 0.0,
            seed: 1234,
        },
    )
    .unwrap();
    assert_eq!(
        b.graph().params[0].kind,
        ParamKind::Weight {
            init: Init::Normal {
                sigma: 1.0,
                mean: 0.0,
                seed: 1234
            },
            requires_grad: true
        }
    );
}
