//! Structural tests of the backward pass and the optimizer update.

use super::*;
use crate::infer::infer_node;
use crate::verify::verify;
use shardc_ir::{Attr, DType, Init, Param, ParamKind, TensorType};

fn input(g: &mut Graph, name: &str, shape: &[usize]) -> Operand {
    Operand::Param(g.add_param(Param {
        name: name.into(),
        ty: TensorType::new(DType::Float32, shape.to_vec()),
        kind: ParamKind::Input,
    }))
}

fn weight(g: &mut Graph, name: &str, shape: &[usize], requires_grad: bool) -> Operand {
    Operand::Param(g.add_param(Param {
        name: name.into(),
        ty: TensorType::new(DType::Float32, shape.to_vec()),
        kind: ParamKind::Weight {
            init: Init::Normal {
                sigma: 0.01,
                mean: 0.0,
                seed: 1,
            },
            requires_grad,
        },
    }))
}

fn push(g: &mut Graph, op: OpKind, inputs: Vec<Operand>, attrs: Attrs, instance: &str) -> Operand {
    let mut n = Node::new(op, inputs);
    n.attrs = attrs;
    n.instance = instance.into();
    n.scope = "Default/network".into();
    n.ty = infer_node(g, &n).expect("forward node types");
    Operand::Node(g.push_node(n))
}

/// x(4, 3) -> MatMul(w (3, 2)) -> ReLU -> Sub(label) -> Square -> ReduceMean: an MSE net,
/// with an unused trainable weight `u` and a frozen weight `f` added to the loss.
fn mse_net() -> Graph {
    let mut g = Graph::new("Net");
    let x = input(&mut g, "x", &[4, 3]);
    let label = input(&mut g, "label", &[4, 2]);
    let w = weight(&mut g, "w", &[3, 2], true);
    weight(&mut g, "u", &[5], true);
    let mm = push(&mut g, OpKind::MatMul, vec![x, w], Attrs::new(), "matmul");
    let r = push(&mut g, OpKind::ReLU, vec![mm], Attrs::new(), "relu");
    let d = push(&mut g, OpKind::Sub, vec![r, label], Attrs::new(), "sub");
    let s = push(&mut g, OpKind::Square, vec![d], Attrs::new(), "square");
    let l = push(
        &mut g,
        OpKind::ReduceMean,
        vec![s, Operand::Const(Const::Ints(vec![0, 1]))],
        Attrs::new().with("keep_dims", Attr::Bool(false)),
        "reduce_mean",
    );
    g.outputs.push(l);
    g
}

fn ops_after(g: &Graph, start: usize) -> Vec<OpKind> {
    g.nodes[start..].iter().map(|n| n.op).collect()
}

#[test]
fn mse_backward_has_the_expected_ops_and_verifies() {
    let fwd = mse_net();
    let (g, grads) = gradients(&fwd).expect("gradients");
    verify(&g).expect("the gradient graph verifies");
    use OpKind::*;
    assert_eq!(
        ops_after(&g, fwd.nodes.len()),
        vec![
            OnesLike,    // seed
            Mul,         // mean scaling
            Reshape,     // to (1, 1)
            BroadcastTo, // to (4, 2)
            Mul,         // 2 * diff
            Mul,         // dy * 2 diff
            ReluGrad,
            MatMul, // x^T dy
        ]
    );
    // Only `w` gets a gradient: `x` and `label` are inputs, `u` does not reach the loss.
    let w = fwd.param_by_name("w").unwrap();
    assert_eq!(grads.len(), 1);
    assert_eq!(grads[0].0, w);
    let Operand::Node(gw) = &grads[0].1 else {
        panic!("a node")
    };
    let node = g.node(*gw);
    assert_eq!(node.op, MatMul);
    assert_eq!(node.instance, "grad_matmul_b");
    assert_eq!(node.scope, "Gradients/Default/network");
    assert_eq!(node.attrs.get("transpose_a"), Some(&Attr::Bool(true)));
    assert_eq!(
        g.operand_tensor_type(&grads[0].1),
        Some(&fwd.params[w.index()].ty)
    );
    assert_eq!(g.outputs, fwd.outputs);
    // The forward part is untouched.
    assert_eq!(g.nodes[..fwd.nodes.len()], fwd.nodes[..]);
}

#[test]
fn instance_names_are_unique_even_when_forward_names_collide() {
    let mut fwd = mse_net();
    // A forward node already named like a gradient node.
    let x = Operand::Param(fwd.param_by_name("x").unwrap());
    push(&mut fwd, OpKind::Neg, vec![x], Attrs::new(), "grad_relu");
    let (g, _) = gradients(&fwd).unwrap();
    verify(&g).unwrap();
    assert!(g.node_by_instance("grad_relu_2").is_some());
}

#[test]
fn frozen_weights_and_inputs_get_no_gradient_nodes() {
    let mut g = Graph::new("Net");
    let x = input(&mut g, "x", &[2, 3]);
    let f = weight(&mut g, "frozen", &[3, 3], false);
    let w = weight(&mut g, "w", &[3], true);
    let a = push(
        &mut g,
        OpKind::MatMul,
        vec![x, f],
        Attrs::new(),
        "frozen_mm",
    );
    let b = push(
        &mut g,
        OpKind::BiasAdd,
        vec![a.clone(), w],
        Attrs::new(),
        "bias",
    );
    let c = push(&mut g, OpKind::Mul, vec![b, a], Attrs::new(), "mul");
    let l = push(
        &mut g,
        OpKind::ReduceSum,
        vec![c, Operand::Const(Const::Ints(vec![]))],
        Attrs::new(),
        "sum",
    );
    g.outputs.push(l);
    let (t, grads) = gradients(&g).unwrap();
    verify(&t).unwrap();
    assert_eq!(grads.len(), 1);
    // No MatMul in the backward pass: the frozen MatMul's operands need no gradient.
    assert!(!ops_after(&t, g.nodes.len()).contains(&OpKind::MatMul));
    assert!(ops_after(&t, g.nodes.len()).contains(&OpKind::BiasAddGrad));
}

#[test]
fn multiple_uses_accumulate_with_add() {
    let mut g = Graph::new("Net");
    let w = weight(&mut g, "w", &[3], true);
    let a = push(
        &mut g,
        OpKind::Mul,
        vec![w.clone(), w.clone()],
        Attrs::new(),
        "sq",
    );
    let b = push(&mut g, OpKind::Add, vec![a, w], Attrs::new(), "add");
    let l = push(
        &mut g,
        OpKind::ReduceSum,
        vec![b, Operand::Const(Const::Ints(vec![0]))],
        Attrs::new(),
        "sum",
    );
    g.outputs.push(l);
    let (t, grads) = gradients(&g).unwrap();
    verify(&t).unwrap();
    let adds = ops_after(&t, g.nodes.len())
        .into_iter()
        .filter(|&o| o == OpKind::Add)
        .count();
    assert_eq!(adds, 2, "three contributions to w need two Adds");
    let Operand::Node(n) = grads[0].1 else {
        panic!()
    };
    assert_eq!(t.node(n).op, OpKind::Add);
}

#[test]
fn broadcast_operands_are_reduced_back() {
    let mut g = Graph::new("Net");
    let x = input(&mut g, "x", &[4, 3]);
    let b = weight(&mut g, "b", &[3], true);
    let c = weight(&mut g, "c", &[4, 1], true);
    let s = push(&mut g, OpKind::Add, vec![x, b], Attrs::new(), "add");
    let m = push(&mut g, OpKind::Mul, vec![s, c], Attrs::new(), "mul");
    let l = push(&mut g, OpKind::ReduceSum, vec![m], Attrs::new(), "sum");
    g.outputs.push(l);
    let (t, grads) = gradients(&g).unwrap();
    verify(&t).unwrap();
    assert_eq!(grads.len(), 2);
    for (p, gr) in &grads {
        assert_eq!(t.operand_tensor_type(gr), Some(&g.param(*p).ty));
    }
    let sum_b = t
        .node_by_instance("grad_add_b_sum")
        .expect("ReduceSum for b");
    assert_eq!(
        t.node(sum_b).attrs.get("keep_dims"),
        Some(&Attr::Bool(false))
    );
    let sum_c = t
        .node_by_instance("grad_mul_b_sum")
        .expect("ReduceSum for c");
    assert_eq!(
        t.node(sum_c).attrs.get("keep_dims"),
        Some(&Attr::Bool(true))
    );
}

#[test]
fn loss_must_be_a_scalar_float() {
    let mut g = Graph::new("Net");
    let w = weight(&mut g, "w", &[3], true);
    let n = push(&mut g, OpKind::Neg, vec![w], Attrs::new(), "neg");
    g.outputs.push(n);
    let e = gradients(&g).unwrap_err();
    assert!(matches!(e, AutodiffError::BadLoss { .. }), "{e}");
    assert!(e.to_string().contains("(3)"), "{e}");
    let empty = Graph::new("Empty");
    assert!(matches!(
        gradients(&empty),
        Err(AutodiffError::NoLoss { .. })
    ));
}

#[test]
fn missing_rules_are_reported_only_on_a_differentiable_path() {
    let mut g = Graph::new("Net");
    let w = weight(&mut g, "w", &[4], true);
    let s = push(
        &mut g,
        OpKind::Send,
        vec![w.clone()],
        Attrs::new().with("dest_rank", Attr::Int(1)),
        "send",
    );
    // Equal stops differentiation: no error from a path through it.
    let eq = push(
        &mut g,
        OpKind::Equal,
        vec![s.clone(), w.clone()],
        Attrs::new(),
        "eq",
    );
    let c = push(
        &mut g,
        OpKind::Cast,
        vec![eq],
        Attrs::new().with("dst_type", Attr::Str("Float32".into())),
        "cast",
    );
    let m = push(&mut g, OpKind::Mul, vec![c, w], Attrs::new(), "mul");
    let l = push(
        &mut g,
        OpKind::ReduceSum,
        vec![m.clone()],
        Attrs::new(),
        "sum",
    );
    g.outputs.push(l);
    let (t, grads) = gradients(&g).expect("Send is not on a differentiable path");
    verify(&t).unwrap();
    assert_eq!(grads.len(), 1);

    // Now the loss reads Send's result directly.
    let m2 = push(&mut g, OpKind::Mul, vec![m, s], Attrs::new(), "mul2");
    let l2 = push(&mut g, OpKind::ReduceSum, vec![m2], Attrs::new(), "sum2");
    g.outputs = vec![l2];
    let e = gradients(&g).unwrap_err();
    assert!(
        matches!(&e, AutodiffError::NoGradient { op: OpKind::Send, instance, .. } if instance == "send"),
        "{e}"
    );
}

#[test]
fn momentum_training_graph() {
    let fwd = mse_net();
    let opt = Optimizer::Momentum {
        learning_rate: 0.1,
        momentum: 0.9,
        use_nesterov: false,
    };
    let t = training_graph(&fwd, &opt).unwrap();
    verify(&t).unwrap();
    let acc = t.param_by_name("moments.w").expect("state");
    assert!(!t.param(acc).requires_grad());
    assert!(matches!(
        t.param(acc).kind,
        ParamKind::Weight {
            init: Init::Zeros,
            ..
        }
    ));
    assert!(t.param_by_name("moments.u").is_none());
    let tail: Vec<OpKind> = t.nodes[t.nodes.len() - 5..].iter().map(|n| n.op).collect();
    use OpKind::*;
    assert_eq!(
        tail,
        vec![ApplyMomentum, TupleGetItem, TupleGetItem, Assign, Assign]
    );
    let am = t.node_by_instance("apply_momentum_w").unwrap();
    assert_eq!(t.node(am).inputs[2], Operand::Const(Const::Float(0.1)));
    assert_eq!(t.node(am).scope, "Default/optimizer-Momentum");
    assert_eq!(t.outputs, fwd.outputs);
}

#[test]
fn sgd_and_adam_state() {
    let fwd = mse_net();
    let sgd = training_graph(
        &fwd,
        &Optimizer::Sgd {
            learning_rate: 0.1,
            momentum: 0.9,
            dampening: 0.0,
            weight_decay: 0.0,
            nesterov: false,
        },
    )
    .unwrap();
    verify(&sgd).unwrap();
    let stat = sgd.param_by_name("stat.w").unwrap();
    assert!(matches!(
        sgd.param(stat).kind,
        ParamKind::Weight {
            init: Init::Ones,
            requires_grad: false
        }
    ));
    assert!(sgd.param_by_name("accum.w").is_some());
    let assigns = sgd.nodes.iter().filter(|n| n.op == OpKind::Assign).count();
    assert_eq!(assigns, 3);

    let adam = training_graph(
        &fwd,
        &Optimizer::Adam {
            learning_rate: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        },
    )
    .unwrap();
    verify(&adam).unwrap();
    for name in ["moment1.w", "moment2.w", "beta1_power", "beta2_power"] {
        assert!(adam.param_by_name(name).is_some(), "{name}");
    }
    let b1 = adam.param_by_name("beta1_power").unwrap();
    assert_eq!(adam.param(b1).ty.rank(), 0);
    assert!(matches!(
        adam.param(b1).kind,
        ParamKind::Weight {
            init: Init::Constant { value },
            ..
        } if value == 0.9
    ));
    // The powers are updated last: Mul + Assign, twice.
    let tail: Vec<OpKind> = adam.nodes[adam.nodes.len() - 4..]
        .iter()
        .map(|n| n.op)
        .collect();
    assert_eq!(
        tail,
        vec![OpKind::Mul, OpKind::Assign, OpKind::Mul, OpKind::Assign]
    );
}

#[test]
fn state_name_clash_is_an_error() {
    let mut fwd = mse_net();
    weight(&mut fwd, "moments.w", &[3, 2], false);
    let e = training_graph(
        &fwd,
        &Optimizer::Momentum {
            learning_rate: 0.1,
            momentum: 0.9,
            use_nesterov: false,
        },
    )
    .unwrap_err();
    assert!(e.to_string().contains("moments.w"), "{e}");
}

#[test]
fn collectives_have_their_adjoint_collectives() {
    let group = || {
        Attrs::new()
            .with("rank_list", Attr::ints(&[0, 1]))
            .with("group", Attr::Str("2-0".into()))
    };
    let cases = [
        (
            OpKind::AllReduce,
            group().with("op", Attr::Str("sum".into())),
            OpKind::AllReduce,
        ),
        (OpKind::AllGather, group(), OpKind::ReduceScatter),
        (
            OpKind::ReduceScatter,
            group().with("op", Attr::Str("sum".into())),
            OpKind::AllGather,
        ),
        (
            OpKind::AllToAll,
            group()
                .with("split_dim", Attr::Int(0))
                .with("concat_dim", Attr::Int(1)),
            OpKind::AllToAll,
        ),
    ];
    for (op, attrs, grad_op) in cases {
        let mut g = Graph::new("Net");
        let w = weight(&mut g, "w", &[4, 6], true);
        let c = push(&mut g, op, vec![w], attrs, "comm");
        let l = push(&mut g, OpKind::ReduceSum, vec![c], Attrs::new(), "sum");
        g.outputs.push(l);
        let (t, grads) = gradients(&g).unwrap_or_else(|e| panic!("{op}: {e}"));
        verify(&t).unwrap_or_else(|e| panic!("{op}: {e}"));
        let gc = t
            .node_by_instance("grad_comm")
            .expect("the collective's gradient");
        assert_eq!(t.node(gc).op, grad_op, "{op}");
        assert_eq!(
            t.node(gc).attrs.get("rank_list"),
            Some(&Attr::ints(&[0, 1]))
        );
        assert_eq!(
            t.operand_tensor_type(&grads[0].1),
            Some(&g.params[0].ty),
            "{op}"
        );
        if op == OpKind::AllToAll {
            assert_eq!(t.node(gc).attrs.get("split_dim"), Some(&Attr::Int(1)));
            assert_eq!(t.node(gc).attrs.get("concat_dim"), Some(&Attr::Int(0)));
        }
    }
    // AllReduce(max) has no gradient rule.
    let mut g = Graph::new("Net");
    let w = weight(&mut g, "w", &[4], true);
    let c = push(
        &mut g,
        OpKind::AllReduce,
        vec![w],
        group().with("op", Attr::Str("max".into())),
        "allreduce_max",
    );
    let l = push(&mut g, OpKind::ReduceSum, vec![c], Attrs::new(), "sum");
    g.outputs.push(l);
    let e = gradients(&g).unwrap_err();
    assert!(e.to_string().contains("allreduce_max"), "{e}");
    assert!(e.to_string().contains("op: max"), "{e}");
}

#[test]
fn a_loss_through_a_statistic_output_is_an_error() {
    let mut g = Graph::new("Net");
    let x = weight(&mut g, "x", &[2, 3, 2, 2], true);
    let s = weight(&mut g, "s", &[3], true);
    let b = weight(&mut g, "b", &[3], true);
    let m = weight(&mut g, "m", &[3], false);
    let v = weight(&mut g, "v", &[3], false);
    let bn = push(
        &mut g,
        OpKind::BatchNorm,
        vec![x, s, b, m, v],
        Attrs::new(),
        "bn",
    );
    let mean = push(
        &mut g,
        OpKind::TupleGetItem,
        vec![bn, Operand::Const(Const::Int(1))],
        Attrs::new(),
        "bn_mean",
    );
    let l = push(&mut g, OpKind::ReduceSum, vec![mean], Attrs::new(), "sum");
    g.outputs.push(l);
    let e = gradients(&g).unwrap_err();
    assert!(
        matches!(&e, AutodiffError::NoGradient { op: OpKind::BatchNorm, instance, .. } if instance == "bn"),
        "{e}"
    );
    assert!(e.to_string().contains("result 1"), "{e}");
}

mod random_chains {
    use super::*;
    use proptest::prelude::*;

    /// Builds a chain from `steps` on a (2, 3, 4) weight; each step picks an op by number and
    /// may add a weight of a broadcastable shape. Ends with a mean over all axes.
    fn chain(steps: &[(u8, bool)]) -> Graph {
        let mut g = Graph::new("Chain");
        let mut cur = weight(&mut g, "w0", &[2, 3, 4], true);
        for (k, &(pick, keep)) in steps.iter().enumerate() {
            let shape = g.operand_tensor_type(&cur).unwrap().shape.clone();
            let rank = shape.len();
            let inst = format!("op{k}");
            cur = match pick % 9 {
                0 => push(&mut g, OpKind::Tanh, vec![cur], Attrs::new(), &inst),
                1 => push(&mut g, OpKind::Square, vec![cur], Attrs::new(), &inst),
                2 | 3 => {
                    // A weight broadcast along the first axis (or a full-shape one).
                    let ws: Vec<usize> = if keep && rank > 0 {
                        std::iter::once(1)
                            .chain(shape[1..].iter().copied())
                            .collect()
                    } else {
                        shape[rank.saturating_sub(1)..].to_vec()
                    };
                    let w = weight(&mut g, &format!("w{}", k + 1), &ws, true);
                    let op = if pick % 9 == 2 {
                        OpKind::Add
                    } else {
                        OpKind::Mul
                    };
                    push(&mut g, op, vec![cur, w], Attrs::new(), &inst)
                }
                4 if rank > 1 => push(
                    &mut g,
                    OpKind::ReduceSum,
                    vec![cur, Operand::Const(Const::Ints(vec![0]))],
                    Attrs::new().with("keep_dims", Attr::Bool(keep)),
                    &inst,
                ),
                5 if rank > 1 => {
                    let perm: Vec<i64> = (0..rank as i64).rev().collect();
                    push(
                        &mut g,
                        OpKind::Transpose,
                        vec![cur, Operand::Const(Const::Ints(perm))],
                        Attrs::new(),
                        &inst,
                    )
                }
                6 if rank > 0 => push(
                    &mut g,
                    OpKind::Reshape,
                    vec![cur, Operand::Const(Const::Ints(vec![-1]))],
                    Attrs::new(),
                    &inst,
                ),
                7 if rank > 0 => push(&mut g, OpKind::Softmax, vec![cur], Attrs::new(), &inst),
                8 if rank == 2 => {
                    let w = weight(&mut g, &format!("w{}", k + 1), &[shape[1], 3], true);
                    push(&mut g, OpKind::MatMul, vec![cur, w], Attrs::new(), &inst)
                }
                _ => push(&mut g, OpKind::ReLU, vec![cur], Attrs::new(), &inst),
            };
        }
        let l = push(
            &mut g,
            OpKind::ReduceMean,
            vec![cur, Operand::Const(Const::Ints(vec![]))],
            Attrs::new(),
            "loss",
        );
        g.outputs.push(l);
        g
    }

    proptest! {
        #[test]
        fn every_chain_differentiates_into_a_verified_graph(
            steps in proptest::collection::vec((any::<u8>(), any::<bool>()), 0..10)
        ) {
            let g = chain(&steps);
            verify(&g).unwrap();
            let (t, grads) = gradients(&g).unwrap();
            verify(&t).unwrap();
            let trainable = g.params.iter().filter(|p| p.requires_grad()).count();
            prop_assert_eq!(grads.len(), trainable);
            for (p, gr) in &grads {
                prop_assert_eq!(t.operand_tensor_type(gr), Some(&g.param(*p).ty));
            }
            let train = training_graph(&g, &Optimizer::Adam {
                learning_rate: 0.1, beta1: 0.9, beta2: 0.99, eps: 1e-8,
            }).unwrap();
            verify(&train).unwrap();
        }
    }
}
