//! The graph verifier: the structural and type invariants every pass must keep.
//!
//! [`verify`] checks, in order of the nodes, and reports every violation it finds (a node whose
//! operands are broken is not checked further: its type could not be inferred):
//!
//! - parameter names are non-empty and unique;
//! - every operand refers to an existing parameter or an **earlier** node;
//! - each node has the arity and operand kinds of its op (constant vs tensor, kind of
//!   constant), and re-running the shape rule ([`crate::infer`]) gives exactly its stored type;
//! - a tuple-typed result is read only by `TupleGetItem` (or returned), and `TupleGetItem`
//!   reads only tuples, at an index in range;
//! - a parameter is `Assign`ed at most once, and no node after that `Assign` reads it;
//! - instance names are unique among the nodes that have one;
//! - an `in_strategy` has one entry per tensor (non-constant) operand, each with that
//!   operand's rank, all split counts >= 1 (whether they divide the dimensions is for the
//!   parallel passes); an `out_strategy`'s split counts are >= 1;
//! - the returned values exist.

use crate::infer::{infer_at, operand_text, signature};
use shardc_ir::{Graph, Node, NodeId, OpKind, Operand, ParamId, Strategy, Type};
use std::collections::HashMap;

/// A broken invariant: where (a node as `%3 MatMul 'matmul2'`, a parameter or an output) and
/// why.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
#[error("verify: {location}: {reason}")]
pub struct VerifyError {
    /// The offending node, when the error is about one.
    pub node: Option<NodeId>,
    /// Where: `%3 MatMul 'matmul2'`, `parameter %para2_w`, `output 0`.
    pub location: String,
    /// What is wrong.
    pub reason: String,
}

/// Every broken invariant of a graph, in the order [`verify`] found them (never empty).
#[derive(Debug, Clone, PartialEq)]
pub struct Violations(pub Vec<VerifyError>);

impl Violations {
    /// The first violation found.
    pub fn first(&self) -> &VerifyError {
        &self.0[0]
    }
}

impl std::fmt::Display for Violations {
    /// One violation prints as itself; several as a count, then one per line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.as_slice() {
            [one] => write!(f, "{one}"),
            all => {
                write!(f, "verify: {} violations:", all.len())?;
                for e in all {
                    write!(f, "\n  {}: {}", e.location, e.reason)?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for Violations {}

/// `%3 MatMul 'matmul2'` (`%3 MatMul` when the node has no instance name).
fn node_location(index: usize, node: &Node) -> String {
    if node.instance.is_empty() {
        format!("%{} {}", index + 1, node.op)
    } else {
        format!("%{} {} '{}'", index + 1, node.op, node.instance)
    }
}

/// A result type as text: `<Tensor[Float32], (8, 16)>`, or `Tuple(<...>, <...>)`.
pub fn type_text(ty: &Type) -> String {
    match ty {
        Type::Tensor(t) => t.to_string(),
        Type::Tuple(ts) => {
            let parts: Vec<String> = ts.iter().map(ToString::to_string).collect();
            format!("Tuple({})", parts.join(", "))
        }
    }
}

/// Checks every invariant of `graph` (see the module doc); every violation is returned.
pub fn verify(graph: &Graph) -> Result<(), Violations> {
    let mut errors = Vec::new();
    // Parameters.
    let mut param_names: HashMap<&str, usize> = HashMap::new();
    for (i, p) in graph.params.iter().enumerate() {
        let loc = || format!("parameter %para{}_{}", i + 1, p.name);
        if p.name.is_empty() {
            errors.push(VerifyError {
                node: None,
                location: loc(),
                reason: "the parameter has no name".into(),
            });
            continue;
        }
        if let Some(first) = param_names.insert(&p.name, i) {
            errors.push(VerifyError {
                node: None,
                location: loc(),
                reason: format!(
                    "the name `{}` is also used by parameter %para{}_{}",
                    p.name,
                    first + 1,
                    p.name
                ),
            });
        }
    }

    let mut assigned: HashMap<ParamId, usize> = HashMap::new();
    let mut instances: HashMap<&str, usize> = HashMap::new();
    'nodes: for (i, node) in graph.nodes.iter().enumerate() {
        let fail = |reason: String| VerifyError {
            node: Some(NodeId(i as u32)),
            location: node_location(i, node),
            reason,
        };
        let sig = signature(node.op);
        let name = |j: usize| format!("input {j} ({})", sig.name(j));

        if !node.instance.is_empty() {
            if let Some(first) = instances.insert(&node.instance, i) {
                errors.push(fail(format!(
                    "instance name '{}' is already used by {}",
                    node.instance,
                    node_location(first, &graph.nodes[first])
                )));
            }
        }

        for (j, operand) in node.inputs.iter().enumerate() {
            match operand {
                Operand::Node(id) => {
                    let k = id.index();
                    if k == i {
                        errors.push(fail(format!("{} uses the node's own result", name(j))));
                        continue 'nodes;
                    }
                    if k > i {
                        let why = if k < graph.nodes.len() {
                            "a node that comes later (forward reference)"
                        } else {
                            "a node that does not exist"
                        };
                        errors.push(fail(format!("{} refers to %{}, {why}", name(j), k + 1)));
                        continue 'nodes;
                    }
                    let src = &graph.nodes[k];
                    if let Type::Tuple(ts) = &src.ty {
                        if node.op != OpKind::TupleGetItem {
                            errors.push(fail(format!(
                                "{} reads {}, whose result is a {}-element tuple; only TupleGetItem may read a tuple",
                                name(j),
                                node_location(k, src),
                                ts.len()
                            )));
                            continue 'nodes;
                        }
                    }
                }
                Operand::Param(p) => {
                    if p.index() >= graph.params.len() {
                        errors.push(fail(format!(
                            "{} refers to parameter #{}, which does not exist",
                            name(j),
                            p.index() + 1
                        )));
                        continue 'nodes;
                    }
                    if let Some(&by) = assigned.get(p) {
                        let what = if node.op == OpKind::Assign && j == 0 {
                            "assigns"
                        } else {
                            "reads"
                        };
                        let again = if what == "assigns" {
                            " a second time; a parameter is assigned at most once per step"
                        } else {
                            " after it was assigned"
                        };
                        errors.push(fail(format!(
                            "{} {what} {}{again} (by {})",
                            name(j),
                            operand_text(graph, operand),
                            node_location(by, &graph.nodes[by])
                        )));
                        continue 'nodes;
                    }
                }
                Operand::Const(_) => {}
            }
        }

        let inferred = match infer_at(graph, i) {
            Ok(t) => t,
            Err(e) => {
                errors.push(fail(e.reason));
                continue;
            }
        };
        if inferred != node.ty {
            let operands: Vec<String> = node
                .inputs
                .iter()
                .enumerate()
                .map(|(j, o)| {
                    let ty = match o {
                        Operand::Const(c) => c.type_text(),
                        Operand::Node(id) => type_text(&graph.nodes[id.index()].ty),
                        Operand::Param(p) => graph.params[p.index()].ty.to_string(),
                    };
                    format!("{} = {} {ty}", name(j), operand_text(graph, o))
                })
                .collect();
            errors.push(fail(format!(
                "the stored result type says {} but the shape rules give {} (operands: {})",
                type_text(&node.ty),
                type_text(&inferred),
                if operands.is_empty() {
                    "none".to_string()
                } else {
                    operands.join(", ")
                }
            )));
        }

        if let Some(s) = &node.in_strategy {
            if let Err(reason) = check_in_strategy(graph, node, s) {
                errors.push(fail(reason));
            }
        }
        if let Some(s) = &node.out_strategy {
            if let Some(d) = s.0.iter().flatten().find(|&&d| d < 1) {
                errors.push(fail(format!(
                    "out_strategy {s} has the split count {d}; every count must be >= 1"
                )));
            }
        }

        if node.op == OpKind::Assign {
            if let Some(Operand::Param(p)) = node.inputs.first() {
                assigned.insert(*p, i);
            }
        }
    }

    for (k, out) in graph.outputs.iter().enumerate() {
        let fail = |reason: String| VerifyError {
            node: None,
            location: format!("output {k}"),
            reason,
        };
        match out {
            Operand::Node(id) if id.index() >= graph.nodes.len() => errors.push(fail(format!(
                "refers to %{}, which does not exist",
                id.index() + 1
            ))),
            Operand::Param(p) if p.index() >= graph.params.len() => errors.push(fail(format!(
                "refers to parameter #{}, which does not exist",
                p.index() + 1
            ))),
            Operand::Const(c) => errors.push(fail(format!(
                "is the constant {}; a graph returns nodes or parameters",
                c.type_text()
            ))),
            _ => {}
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(Violations(errors))
    }
}

/// One entry per tensor operand, each of that operand's rank, all counts >= 1.
fn check_in_strategy(graph: &Graph, node: &Node, s: &Strategy) -> Result<(), String> {
    let sig = signature(node.op);
    let tensors: Vec<(usize, &Operand)> = node
        .inputs
        .iter()
        .enumerate()
        .filter(|(_, o)| !matches!(o, Operand::Const(_)))
        .collect();
    if s.0.len() != tensors.len() {
        return Err(format!(
            "in_strategy {s} has {} entries but the node has {} tensor operand(s)",
            s.0.len(),
            tensors.len()
        ));
    }
    for ((j, operand), dims) in tensors.iter().zip(&s.0) {
        let rank = graph
            .operand_tensor_type(operand)
            .map(|t| t.rank())
            .unwrap_or(0);
        if dims.len() != rank {
            return Err(format!(
                "in_strategy {s}: the entry for input {j} ({}) has {} split count(s) but {} has rank {rank}",
                sig.name(*j),
                dims.len(),
                operand_text(graph, operand)
            ));
        }
        if let Some(d) = dims.iter().find(|&&d| d < 1) {
            return Err(format!(
                "in_strategy {s}: the entry for input {j} ({}) has the split count {d}; every count must be >= 1",
                sig.name(*j)
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::infer::infer_node;
    use shardc_ir::{Attr, Const, DType, Init, Param, ParamKind, TensorType};

    fn param(g: &mut Graph, name: &str, shape: &[usize], weight: bool) -> Operand {
        let kind = if weight {
            ParamKind::Weight {
                init: Init::Zeros,
                requires_grad: true,
            }
        } else {
            ParamKind::Input
        };
        g.add_param(Param {
            name: name.into(),
            ty: TensorType::new(DType::Float32, shape.to_vec()),
            kind,
        })
        .into()
    }

    fn push(g: &mut Graph, op: OpKind, instance: &str, inputs: Vec<Operand>) -> Operand {
        push_with(g, op, instance, inputs, &[])
    }

    fn push_with(
        g: &mut Graph,
        op: OpKind,
        instance: &str,
        inputs: Vec<Operand>,
        attrs: &[(&str, Attr)],
    ) -> Operand {
        let mut n = Node::new(op, inputs);
        n.instance = instance.into();
        for (k, v) in attrs {
            n.attrs.set(*k, v.clone());
        }
        n.ty = match infer_node(g, &n) {
            Ok(t) => t,
            Err(e) => panic!("{e}"),
        };
        g.push_node(n).into()
    }

    /// The tutorial's net: x (16, 32) @ w (32, 16), ReLU, @ w2 (16, 16), mean.
    fn quickstart() -> Graph {
        let mut g = Graph::new("Net");
        let x = param(&mut g, "x", &[16, 32], false);
        let w = param(&mut g, "w", &[32, 16], true);
        let w2 = param(&mut g, "w2", &[16, 16], true);
        let m = push(&mut g, OpKind::MatMul, "matmul", vec![x, w]);
        let r = push(&mut g, OpKind::ReLU, "relu", vec![m]);
        let m2 = push(&mut g, OpKind::MatMul, "matmul2", vec![r, w2]);
        let loss = push(
            &mut g,
            OpKind::ReduceMean,
            "reduce_mean",
            vec![m2, Operand::Const(Const::Ints(vec![0, 1]))],
        );
        g.outputs.push(loss);
        g.nodes[0].in_strategy = Some(Strategy(vec![vec![2, 4], vec![4, 1]]));
        g.nodes[3].in_strategy = Some(Strategy(vec![vec![2, 1]]));
        g
    }

    fn err(g: &Graph) -> VerifyError {
        match verify(g) {
            Ok(()) => panic!("expected a verify error"),
            Err(e) => e.first().clone(),
        }
    }

    #[test]
    fn every_violation_is_reported_not_only_the_first() {
        let mut g = quickstart();
        g.params[2].name = "w".into();
        g.nodes[2].instance = "matmul".into();
        g.nodes[1].inputs.push(Operand::Param(ParamId(0)));
        g.outputs.push(Operand::Node(NodeId(9)));
        let all = verify(&g).unwrap_err();
        let locations: Vec<&str> = all.0.iter().map(|e| e.location.as_str()).collect();
        assert_eq!(
            locations,
            [
                "parameter %para3_w",
                "%2 ReLU 'relu'",
                "%3 MatMul 'matmul'",
                "output 1"
            ],
            "{all}"
        );
        let text = all.to_string();
        assert!(
            text.starts_with("verify: 4 violations:\n  parameter %para3_w: "),
            "{text}"
        );
        assert_eq!(text.lines().count(), 5, "{text}");
    }

    #[test]
    fn accepts_a_well_formed_graph() {
        verify(&quickstart()).unwrap();
    }

    #[test]
    fn accepts_an_optimizer_step_with_assigns() {
        let mut g = quickstart();
        let w = Operand::Param(ParamId(1));
        let acc = param(&mut g, "moments.w", &[32, 16], true);
        let grad = param(&mut g, "grad_w", &[32, 16], false);
        let upd = push(
            &mut g,
            OpKind::ApplyMomentum,
            "apply_momentum",
            vec![
                w.clone(),
                acc.clone(),
                Operand::Const(Const::Float(0.1)),
                grad,
                Operand::Const(Const::Float(0.9)),
            ],
        );
        let idx = |i| Operand::Const(Const::Int(i));
        let nw = push(
            &mut g,
            OpKind::TupleGetItem,
            "get0",
            vec![upd.clone(), idx(0)],
        );
        let na = push(&mut g, OpKind::TupleGetItem, "get1", vec![upd, idx(1)]);
        push(&mut g, OpKind::Assign, "assign_w", vec![w, nw]);
        push(&mut g, OpKind::Assign, "assign_acc", vec![acc, na]);
        verify(&g).unwrap();
    }

    #[test]
    fn forward_and_self_references() {
        let mut g = quickstart();
        g.nodes[1].inputs[0] = Operand::Node(NodeId(2));
        let e = err(&g);
        assert_eq!(
            e.to_string(),
            "verify: %2 ReLU 'relu': input 0 (x) refers to %3, a node that comes later (forward reference)"
        );
        assert_eq!(e.node, Some(NodeId(1)));
        g.nodes[1].inputs[0] = Operand::Node(NodeId(1));
        assert!(err(&g).reason.contains("uses the node's own result"));
        g.nodes[1].inputs[0] = Operand::Node(NodeId(40));
        assert!(err(&g)
            .reason
            .contains("refers to %41, a node that does not exist"));
    }

    #[test]
    fn stored_type_mismatch() {
        let mut g = quickstart();
        g.nodes[2].ty = Type::Tensor(TensorType::new(DType::Float32, vec![16, 8]));
        let e = err(&g);
        assert_eq!(
            e.to_string(),
            "verify: %3 MatMul 'matmul2': the stored result type says <Tensor[Float32], (16, 8)> but the shape rules give <Tensor[Float32], (16, 16)> (operands: input 0 (a) = %2 <Tensor[Float32], (16, 16)>, input 1 (b) = %para3_w2 <Tensor[Float32], (16, 16)>)"
        );
        // A parameter whose shape changed under the graph: the shape rule itself fails.
        let mut g = quickstart();
        g.params[2].ty.shape = vec![8, 16];
        let e = err(&g);
        assert!(
            e.to_string()
                .starts_with("verify: %3 MatMul 'matmul2': contracted dimensions differ"),
            "{e}"
        );
        assert!(e.reason.contains("input 1 (b) has shape (8, 16)"), "{e}");
    }

    #[test]
    fn double_assign_and_read_after_assign() {
        let mut g = quickstart();
        let w2 = Operand::Param(ParamId(2));
        let r = Operand::Node(NodeId(1));
        push(
            &mut g,
            OpKind::Assign,
            "assign1",
            vec![w2.clone(), r.clone()],
        );
        verify(&g).unwrap();
        // Reading after the assignment.
        let mut g2 = g.clone();
        push(&mut g2, OpKind::ReLU, "relu_late", vec![w2.clone()]);
        let e = err(&g2);
        assert_eq!(
            e.to_string(),
            "verify: %6 ReLU 'relu_late': input 0 (x) reads %para3_w2 after it was assigned (by %5 Assign 'assign1')"
        );
        // Assigning twice.
        push(&mut g, OpKind::Assign, "assign2", vec![w2, r]);
        let e = err(&g);
        assert!(e.reason.contains("assigns %para3_w2 a second time"), "{e}");
        assert!(e.reason.contains("(by %5 Assign 'assign1')"), "{e}");
    }

    #[test]
    fn assign_to_a_data_input_is_rejected() {
        let mut g = quickstart();
        let mut n = Node::new(
            OpKind::Assign,
            vec![Operand::Param(ParamId(0)), Operand::Param(ParamId(0))],
        );
        n.ty = Type::Tensor(TensorType::new(DType::Float32, vec![16, 32]));
        g.push_node(n);
        let e = err(&g);
        assert!(
            e.reason
                .contains("must be a weight parameter, got the data input %para1_x"),
            "{e}"
        );
    }

    #[test]
    fn bad_tuple_get_item() {
        let mut g = Graph::new("t");
        let x = param(&mut g, "x", &[4, 6], false);
        let s = push_with(
            &mut g,
            OpKind::Split,
            "split",
            vec![x.clone()],
            &[("output_num", Attr::Int(2)), ("axis", Attr::Int(1))],
        );
        let a = push(
            &mut g,
            OpKind::TupleGetItem,
            "get",
            vec![s.clone(), Operand::Const(Const::Int(1))],
        );
        g.outputs = vec![a.clone(), s.clone()];
        verify(&g).unwrap();
        // TupleGetItem of a tensor.
        let mut g1 = g.clone();
        let mut n = Node::new(
            OpKind::TupleGetItem,
            vec![a.clone(), Operand::Const(Const::Int(0))],
        );
        n.ty = Type::Tensor(TensorType::new(DType::Float32, vec![4, 3]));
        g1.push_node(n);
        let e = err(&g1);
        assert_eq!(
            e.to_string(),
            "verify: %3 TupleGetItem: input 0 (t) must be a tuple, got the tensor <Tensor[Float32], (4, 3)>"
        );
        // A tuple read by something other than TupleGetItem.
        let mut g2 = g.clone();
        let mut n = Node::new(OpKind::ReLU, vec![s.clone()]);
        n.instance = "relu".into();
        n.ty = Type::Tensor(TensorType::new(DType::Float32, vec![4, 3]));
        g2.push_node(n);
        let e = err(&g2);
        assert!(
            e.reason.contains("input 0 (x) reads %1 Split 'split', whose result is a 2-element tuple; only TupleGetItem may read a tuple"),
            "{e}"
        );
        // Index out of range.
        let mut g3 = g.clone();
        let mut n = Node::new(OpKind::TupleGetItem, vec![s, Operand::Const(Const::Int(2))]);
        n.ty = Type::Tensor(TensorType::new(DType::Float32, vec![4, 3]));
        g3.push_node(n);
        assert!(err(&g3)
            .reason
            .contains("2 is out of range for a tuple of 2"));
    }

    #[test]
    fn duplicate_instances_and_params() {
        let mut g = quickstart();
        g.nodes[2].instance = "matmul".into();
        let e = err(&g);
        assert_eq!(
            e.to_string(),
            "verify: %3 MatMul 'matmul': instance name 'matmul' is already used by %1 MatMul 'matmul'"
        );
        // Empty instance names may repeat.
        let mut g = quickstart();
        g.nodes[1].instance.clear();
        g.nodes[2].instance.clear();
        verify(&g).unwrap();
        let mut g = quickstart();
        g.params[2].name = "w".into();
        let e = err(&g);
        assert_eq!(
            e.to_string(),
            "verify: parameter %para3_w: the name `w` is also used by parameter %para2_w"
        );
    }

    #[test]
    fn strategies() {
        let mut g = quickstart();
        g.nodes[0].in_strategy = Some(Strategy(vec![vec![2, 4]]));
        assert!(err(&g)
            .reason
            .contains("in_strategy ((2, 4)) has 1 entries but the node has 2 tensor operand(s)"));
        g.nodes[0].in_strategy = Some(Strategy(vec![vec![2, 4], vec![4]]));
        assert!(err(&g)
            .reason
            .contains("the entry for input 1 (b) has 1 split count(s) but %para2_w has rank 2"));
        g.nodes[0].in_strategy = Some(Strategy(vec![vec![2, 0], vec![4, 1]]));
        assert!(err(&g).reason.contains("has the split count 0"));
        // Constants do not get an entry; non-dividing splits are not this pass's business.
        g.nodes[0].in_strategy = Some(Strategy(vec![vec![3, 5], vec![5, 1]]));
        g.nodes[3].in_strategy = Some(Strategy(vec![vec![1, 1], vec![1]]));
        assert!(err(&g)
            .reason
            .contains("has 2 entries but the node has 1 tensor operand(s)"));
        g.nodes[3].in_strategy = None;
        verify(&g).unwrap();
        g.nodes[1].out_strategy = Some(Strategy(vec![vec![0, 1]]));
        assert!(err(&g)
            .reason
            .contains("out_strategy ((0, 1)) has the split count 0"));
    }

    #[test]
    fn bad_outputs_and_arity() {
        let mut g = quickstart();
        g.outputs.push(Operand::Node(NodeId(9)));
        assert_eq!(
            err(&g).to_string(),
            "verify: output 1: refers to %10, which does not exist"
        );
        g.outputs[1] = Operand::Const(Const::Float(1.0));
        assert!(err(&g).reason.contains("is the constant <Float32>"));
        let mut g = quickstart();
        g.nodes[1].inputs.push(Operand::Param(ParamId(0)));
        assert_eq!(
            err(&g).to_string(),
            "verify: %2 ReLU 'relu': expects 1 operand(s) (x), got 2"
        );
        let mut g = quickstart();
        g.nodes[3].inputs[1] = Operand::Const(Const::Float(0.0));
        assert!(err(&g)
            .reason
            .contains("input 1 (axes) must be a constant tuple of integers, got the constant 0.0"));
    }
}
