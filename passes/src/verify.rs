//! The graph verifier: the structural and type invariants every pass must keep.
//!
//! [`verify`] checks, in order of the nodes:
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

/// Checks every invariant of `graph` (see the module doc); the first violation is returned.
pub fn verify(graph: &Graph) -> Result<(), VerifyError> {
    // Parameters.
    let mut param_names: HashMap<&str, usize> = HashMap::new();
    for (i, p) in graph.params.iter().enumerate() {
        let loc = || format!("parameter %para{}_{}", i + 1, p.name);
        if p.name.is_empty() {
            return Err(VerifyError {
                node: None,
                location: loc(),
                reason: "the parameter has no name".into(),
            });
        }
        if let Some(first) = param_names.insert(&p.name, i) {
            return Err(VerifyError {
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
    for (i, node) in graph.nodes.iter().enumerate() {
        let fail = |reason: String| VerifyError {
            node: Some(NodeId(i as u32)),
            location: node_location(i, node),
            reason,
        };
        let sig = signature(node.op);
        let name = |j: usize| format!("input {j} ({})", sig.name(j));

        if !node.instance.is_empty() {
            if let Some(first) = instances.insert(&node.instance, i) {
                return Err(fail(format!(
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
                        return Err(fail(format!("{} uses the node's own result", name(j))));
                    }
                    if k > i {
                        let why = if k < graph.nodes.len() {
                            "a node that comes later (forward reference)"
                        } else {
                            "a node that does not exist"
                        };
                        return Err(fail(format!("{} refers to %{}, {why}", name(j), k + 1)));
                    }
                    let src = &graph.nodes[k];
                    if let Type::Tuple(ts) = &src.ty {
                        if node.op != OpKind::TupleGetItem {
                            return Err(fail(format!(
                                "{} reads %{} ({}), whose result is a {}-element tuple; only TupleGetItem may read a tuple",
                                name(j),
                                k + 1,
                                node_location(k, src),
                                ts.len()
                            )));
                        }
                    }
                }
                Operand::Param(p) => {
                    if p.index() >= graph.params.len() {
                        return Err(fail(format!(
                            "{} refers to parameter #{}, which does not exist",
                            name(j),
                            p.index() + 1
                        )));
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
                        return Err(fail(format!(
                            "{} {what} {}{again} (by {})",
                            name(j),
                            operand_text(graph, operand),
                            node_location(by, &graph.nodes[by])
                        )));
                    }
                }
                Operand::Const(_) => {}
            }
        }

        let inferred = infer_at(graph, i).map_err(|e| fail(e.reason))?;
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
            return Err(fail(format!(
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
            check_in_strategy(graph, node, s).map_err(fail)?;
        }
        if let Some(s) = &node.out_strategy {
            if let Some(d) = s.0.iter().flatten().find(|&&d| d < 1) {
                return Err(fail(format!(
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
            Operand::Node(id) if id.index() >= graph.nodes.len() => {
                return Err(fail(format!(
                    "refers to %{}, which does not exist",
                    id.index() + 1
                )))
            }
            Operand::Param(p) if p.index() >= graph.params.len() => {
                return Err(fail(format!(
                    "refers to parameter #{}, which does not exist",
                    p.index() + 1
                )))
            }
            Operand::Const(c) => {
                return Err(fail(format!(
                    "is the constant {}; a graph returns nodes or parameters",
                    c.type_text()
                )))
            }
            _ => {}
        }
    }
    Ok(())
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
