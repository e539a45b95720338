//! Autodiff: the training-step graph (MindSpore's `TrainOneStepCell`).
//!
//! [`gradients`] appends the backward pass of the loss (the graph's first output, a scalar
//! float) to a copy of the forward graph: reverse mode over the nodes in reverse order,
//! seeded with `OnesLike(loss)`. Only values that depend on a weight with `requires_grad`
//! through differentiable operands and that reach the loss are differentiated; several
//! contributions to one value are summed with `Add`. Each forward op has its gradient rule in
//! `rules` (MindSpore's gradient kernels where they exist: `ReluGrad`, `Conv2DBackpropInput`,
//! `BatchNormGrad`, ...; basic ops elsewhere).
//!
//! [`training_graph`] adds the optimizer update ([`Optimizer`]): state parameters named as
//! MindSpore names them (`moments.w`, `accum.w`, `stat.w`, `moment1.w`, `moment2.w`,
//! `beta1_power`, `beta2_power`), one `ApplyMomentum` / `SGD` / `Adam` per trained weight and
//! an `Assign` per updated parameter, all at the end of the graph.
//!
//! Backward nodes live in the scope `Gradients/<forward scope>` and are named
//! `grad_<forward instance>` plus a suffix (`grad_matmul_b`, `grad_reduce_mean_reshape`);
//! names are made unique.

pub(crate) mod emitter;
pub(crate) mod error;
mod optimizer;
pub(crate) mod rules;

pub use error::AutodiffError;
pub use optimizer::{append_update, Optimizer};

use crate::ops::{Gradient, Operands};
use emitter::Emitter;
use rules::Rule;
use shardc_ir::{Attrs, Const, Graph, Node, NodeId, OpKind, Operand, ParamId, Type};
use std::collections::HashMap;

/// Appends the backward pass of the loss (`graph.outputs[0]`, must be a scalar float) to a
/// copy of `forward`, returning it and the gradient operand of every weight with
/// `requires_grad` that the loss depends on (in parameter order). Weights the loss does not
/// depend on get no entry. The graph's outputs are unchanged.
///
/// `forward` should pass the verifier; a malformed node on the differentiated path gives an
/// error naming it, never a panic.
pub fn gradients(forward: &Graph) -> Result<(Graph, Vec<(ParamId, Operand)>), AutodiffError> {
    let loss = forward
        .outputs
        .first()
        .cloned()
        .ok_or_else(|| AutodiffError::NoLoss {
            graph: forward.name.clone(),
        })?;
    check_loss(forward, &loss)?;
    let active = Activity::of(forward);
    let mut em = Emitter::new(forward.clone(), crate::infer::infer_node);
    if !active.operand(&loss) {
        return Ok((em.g, Vec::new()));
    }
    let mut grads: HashMap<Key, Operand> = HashMap::new();

    // The seed: d loss / d loss = 1.
    match &loss {
        Operand::Node(id) => em.set_context(*id),
        _ => em.set_root_context("loss"),
    }
    let seed = em.emit(OpKind::OnesLike, vec![loss.clone()], Attrs::new(), "_sens")?;
    let loss_key = Key::of(&loss).ok_or_else(|| AutodiffError::BadLoss {
        loss: "a constant".into(),
        ty: "a constant".into(),
    })?;
    accumulate(&mut em, &mut grads, loss_key, seed)?;

    for i in (0..forward.nodes.len()).rev() {
        let id = NodeId(i as u32);
        let node = &forward.nodes[i];
        let arity = node.ty.tensors().len();
        let dys: Vec<Option<Operand>> = (0..arity)
            .map(|k| grads.remove(&Key::Node(id, k)))
            .collect();
        if dys.iter().all(Option::is_none) {
            continue;
        }
        em.set_context(id);
        if node.op == OpKind::TupleGetItem {
            // Route the gradient into the element of the tuple-valued op.
            let (Some(Operand::Node(src)), Some(Operand::Const(Const::Int(k)))) =
                (node.inputs.first(), node.inputs.get(1))
            else {
                return Err(
                    em.bad_node("TupleGetItem must read a node's tuple at a constant index")
                );
            };
            let k = usize::try_from(*k)
                .map_err(|_| em.bad_node(format!("tuple index {k} is negative")))?;
            if let Some(dy) = dys.into_iter().next().flatten() {
                accumulate(&mut em, &mut grads, Key::Node(*src, k), dy)?;
            }
            continue;
        }
        let needs: Vec<bool> = (0..node.inputs.len())
            .map(|pos| active.position(forward, node, pos))
            .collect();
        let dxs = gradient(&mut em, id, dys, &needs)?;
        for (pos, dx) in dxs.into_iter().enumerate() {
            let Some(dx) = dx else { continue };
            if !needs.get(pos).copied().unwrap_or(false) {
                continue;
            }
            let operand = &node.inputs[pos];
            let want = em.operand_type(operand)?;
            let got = em.operand_type(&dx)?;
            if want != got {
                return Err(em.bad_node(format!(
                    "internal error: the gradient of input {pos} is {got} but the input is {want}"
                )));
            }
            if let Some(key) = Key::of(operand) {
                accumulate(&mut em, &mut grads, key, dx)?;
            }
        }
    }

    let mut out = Vec::new();
    for (p, param) in forward.params.iter().enumerate() {
        let pid = ParamId(p as u32);
        if param.requires_grad() {
            if let Some(g) = grads.remove(&Key::Param(pid)) {
                out.push((pid, g));
            }
        }
    }
    Ok((em.g, out))
}

/// Forward + backward + optimizer update, as MindSpore's `TrainOneStepCell`: the returned
/// graph computes the loss (its outputs stay those of `forward`, the loss first) and, at its
/// end, assigns every trained weight and every optimizer state its new value.
pub fn training_graph(forward: &Graph, opt: &Optimizer) -> Result<Graph, AutodiffError> {
    let (g, grads) = gradients(forward)?;
    optimizer::append_update(g, &grads, opt)
}

/// Checks that the loss is a scalar (one element) float tensor.
fn check_loss(g: &Graph, loss: &Operand) -> Result<(), AutodiffError> {
    let text = match loss {
        Operand::Node(n) => format!("%{}", n.index() + 1),
        Operand::Param(p) => match g.params.get(p.index()) {
            Some(param) => format!("%para{}_{}", p.index() + 1, param.name),
            None => format!("%para{}", p.index() + 1),
        },
        Operand::Const(c) => crate::infer::const_text(c),
    };
    let ty = match loss {
        Operand::Node(n) => g.nodes.get(n.index()).map(|n| n.ty.clone()),
        Operand::Param(p) => g.params.get(p.index()).map(|p| Type::Tensor(p.ty.clone())),
        Operand::Const(_) => None,
    };
    let bad = |ty: String| AutodiffError::BadLoss {
        loss: text.clone(),
        ty,
    };
    match ty {
        None => Err(bad(match loss {
            Operand::Const(c) => format!("the constant {}", c.type_text()),
            _ => "a value that does not exist".into(),
        })),
        Some(Type::Tuple(ts)) => Err(bad(format!("a {}-element tuple", ts.len()))),
        Some(Type::Tensor(t)) if !t.dtype.is_float() || t.num_elements() != 1 => {
            Err(bad(t.to_string()))
        }
        Some(Type::Tensor(_)) => Ok(()),
    }
}

/// Where a gradient accumulates: an element of a node's result, or a parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Key {
    Node(NodeId, usize),
    Param(ParamId),
}

impl Key {
    fn of(operand: &Operand) -> Option<Key> {
        match operand {
            Operand::Node(n) => Some(Key::Node(*n, 0)),
            Operand::Param(p) => Some(Key::Param(*p)),
            Operand::Const(_) => None,
        }
    }
}

/// Adds `g` to the gradient accumulated at `key` (an `Add` node when there is one already).
fn accumulate(
    em: &mut Emitter,
    grads: &mut HashMap<Key, Operand>,
    key: Key,
    g: Operand,
) -> Result<(), AutodiffError> {
    let total = match grads.remove(&key) {
        Some(prev) => em.emit(OpKind::Add, vec![prev, g], Attrs::new(), "_accum")?,
        None => g,
    };
    grads.insert(key, total);
    Ok(())
}

/// Which values depend on a trainable weight through differentiable operands.
struct Activity {
    params: Vec<bool>,
    nodes: Vec<bool>,
}

impl Activity {
    fn of(g: &Graph) -> Activity {
        let params: Vec<bool> = g
            .params
            .iter()
            .map(|p| p.requires_grad() && p.ty.dtype.is_float())
            .collect();
        let mut act = Activity {
            params,
            nodes: Vec::with_capacity(g.nodes.len()),
        };
        for node in &g.nodes {
            let floats = node.ty.tensors().iter().any(|t| t.dtype.is_float());
            let a = floats && (0..node.inputs.len()).any(|pos| act.position(g, node, pos));
            act.nodes.push(a);
        }
        act
    }

    /// Whether `operand` depends on a trainable weight.
    fn operand(&self, operand: &Operand) -> bool {
        match operand {
            Operand::Node(n) => self.nodes.get(n.index()).copied().unwrap_or(false),
            Operand::Param(p) => self.params.get(p.index()).copied().unwrap_or(false),
            Operand::Const(_) => false,
        }
    }

    /// Whether input `pos` of `node` is differentiable and depends on a trainable weight.
    fn position(&self, g: &Graph, node: &Node, pos: usize) -> bool {
        let Some(operand) = node.inputs.get(pos) else {
            return false;
        };
        if !self.operand(operand) || !differentiable(node, pos) {
            return false;
        }
        // Only float tensors carry gradients (a tuple operand is TupleGetItem's).
        match operand {
            Operand::Node(n) => g
                .nodes
                .get(n.index())
                .is_some_and(|n| n.ty.tensors().iter().any(|t| t.dtype.is_float())),
            Operand::Param(p) => g
                .params
                .get(p.index())
                .is_some_and(|p| p.ty.dtype.is_float()),
            Operand::Const(_) => false,
        }
    }
}

/// The gradients of the operands of forward node `id`, given the gradients `dys` of its
/// results (one per tensor of its result; `None` where nothing flows back). `needs[i]` says
/// whether operand `i` wants a gradient; the result has one entry per operand. The rule is
/// the op's, in its family module of `crate::ops`.
fn gradient(
    em: &mut Emitter,
    id: NodeId,
    dys: Vec<Option<Operand>>,
    needs: &[bool],
) -> Result<Vec<Option<Operand>>, AutodiffError> {
    let node = em.g.nodes[id.index()].clone();
    // Optional operands (the axes of a reduction) are read with their defaults.
    let rule = crate::ops::rule(node.op);
    let wanted = rule.signature.required;
    if node.inputs.len() < wanted {
        return Err(em.bad_node(format!(
            "expects {wanted} operand(s), got {}",
            node.inputs.len()
        )));
    }
    match rule.gradient {
        Gradient::Rule(f) => f(&mut Rule {
            em,
            id,
            node,
            sig: rule.signature,
            dys,
            needs: needs.to_vec(),
        }),
        Gradient::None(why) => Err(em.no_gradient(why)),
        Gradient::Driver(why) => Err(em.bad_node(format!("internal error: {why}"))),
    }
}

/// Whether operand `pos` of `node` can carry a gradient (before looking at dtypes and at
/// what depends on what): a constant never does; otherwise the op's rules say
/// (`crate::ops::Operands`).
fn differentiable(node: &Node, pos: usize) -> bool {
    if matches!(node.inputs.get(pos), Some(Operand::Const(_)) | None) {
        return false;
    }
    match crate::ops::rule(node.op).differentiable {
        Operands::All => true,
        Operands::First => pos == 0,
        Operands::NoneOf => false,
        Operands::Some(f) => f(node, pos),
    }
}

#[cfg(test)]
mod tests;
