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

mod optimizer;
mod rules;

pub use optimizer::{append_update, Optimizer};

use crate::infer::{infer_node, InferError};
use shardc_ir::{
    Attrs, Const, DType, Graph, Node, NodeId, OpKind, Operand, ParamId, TensorType, Type,
};
use std::collections::{HashMap, HashSet};

/// Why the backward pass or the training step cannot be built. Every variant about a node
/// names its op and instance.
#[derive(Debug, thiserror::Error)]
pub enum AutodiffError {
    /// The graph returns nothing, so there is no loss.
    #[error("autodiff: graph '{graph}' returns no value; its first output must be the loss")]
    NoLoss {
        /// The graph's name.
        graph: String,
    },
    /// The loss is not a scalar float tensor.
    #[error("autodiff: the loss {loss} must be a scalar float tensor, got {ty}")]
    BadLoss {
        /// The loss operand as text (`%6`, `%para3_w`, a constant).
        loss: String,
        /// Its type as text.
        ty: String,
    },
    /// The loss depends, through a differentiable path, on an op that has no gradient.
    #[error("autodiff: {op} '{instance}' has no gradient rule, but the loss depends on it through a differentiable path: {reason}")]
    NoGradient {
        /// The op.
        op: OpKind,
        /// Its instance name (or `%N` when it has none).
        instance: String,
        /// Why there is no gradient.
        reason: String,
    },
    /// A forward node is malformed in a way its gradient rule cannot work with (the forward
    /// graph was not verified).
    #[error("autodiff: {op} '{instance}': {reason}")]
    BadNode {
        /// The op.
        op: OpKind,
        /// Its instance name (or `%N`).
        instance: String,
        /// What is wrong.
        reason: String,
    },
    /// A node emitted for the gradient of a forward node failed shape inference.
    #[error("autodiff: differentiating {op} '{instance}': the emitted {emitted} '{emitted_instance}' is ill-typed: {source}")]
    Emit {
        /// The forward op being differentiated.
        op: OpKind,
        /// Its instance name.
        instance: String,
        /// The op that was emitted.
        emitted: OpKind,
        /// The emitted node's instance name.
        emitted_instance: String,
        /// The shape-inference error.
        #[source]
        source: InferError,
    },
    /// The optimizer cannot be added.
    #[error("autodiff: optimizer {optimizer}: {reason}")]
    Optimizer {
        /// The optimizer (`Momentum`, `SGD`, `Adam`).
        optimizer: &'static str,
        /// What is wrong (a state name already taken, a weight of a non-float type).
        reason: String,
    },
}

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
    let mut em = Emitter::new(forward.clone());
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
        let dxs = rules::gradient(&mut em, id, dys, &needs)?;
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
        if !self.operand(operand) || !rules::differentiable(g, node, pos) {
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

/// Appends typed nodes to the graph being built, naming them after the forward node being
/// differentiated.
pub(crate) struct Emitter {
    /// The graph being built.
    pub g: Graph,
    /// Every instance name in use.
    names: HashSet<String>,
    /// Existing `TupleGetItem` nodes: (tuple node, index) -> node.
    items: HashMap<(NodeId, usize), NodeId>,
    /// Scope of emitted nodes.
    scope: String,
    /// Instance name prefix of emitted nodes (`grad_matmul`).
    base: String,
    /// The forward op being differentiated (for errors).
    op: OpKind,
    /// Its instance name (or `%N`).
    instance: String,
}

impl Emitter {
    fn new(g: Graph) -> Emitter {
        let names = g
            .nodes
            .iter()
            .filter(|n| !n.instance.is_empty())
            .map(|n| n.instance.clone())
            .collect();
        let mut items = HashMap::new();
        for (i, n) in g.nodes.iter().enumerate() {
            if let (OpKind::TupleGetItem, Some(Operand::Node(src)), Some(Operand::Const(c))) =
                (n.op, n.inputs.first(), n.inputs.get(1))
            {
                if let Some(k) = c.as_int().and_then(|k| usize::try_from(k).ok()) {
                    items.entry((*src, k)).or_insert(NodeId(i as u32));
                }
            }
        }
        Emitter {
            g,
            names,
            items,
            scope: "Gradients".into(),
            base: "grad".into(),
            op: OpKind::OnesLike,
            instance: String::new(),
        }
    }

    /// Emitted nodes from now on belong to the gradient of forward node `id`.
    fn set_context(&mut self, id: NodeId) {
        let node = &self.g.nodes[id.index()];
        let instance = if node.instance.is_empty() {
            format!("{}_{}", node.op.name(), id.index() + 1)
        } else {
            node.instance.clone()
        };
        self.scope = if node.scope.is_empty() {
            "Gradients".into()
        } else {
            format!("Gradients/{}", node.scope)
        };
        self.base = format!("grad_{instance}");
        self.op = node.op;
        self.instance = if node.instance.is_empty() {
            format!("%{}", id.index() + 1)
        } else {
            node.instance.clone()
        };
    }

    /// Emitted nodes from now on are named `grad_<name>` in scope `Gradients`.
    fn set_root_context(&mut self, name: &str) {
        self.scope = "Gradients".into();
        self.base = format!("grad_{name}");
        self.instance = name.into();
    }

    /// Emitted nodes from now on are named `<base>...` in `scope` (the optimizer update).
    pub(crate) fn set_plain_context(&mut self, scope: &str, base: &str, op: OpKind) {
        self.scope = scope.into();
        self.base = base.into();
        self.op = op;
        self.instance = base.into();
    }

    /// A fresh instance name `base + suffix` (with `_2`, `_3`, ... when taken).
    fn unique(&mut self, suffix: &str) -> String {
        let first = format!("{}{}", self.base, suffix);
        let mut name = first.clone();
        let mut k = 2;
        while self.names.contains(&name) {
            name = format!("{first}_{k}");
            k += 1;
        }
        self.names.insert(name.clone());
        name
    }

    /// Appends `op(inputs)` with `attrs`, typed by shape inference, and returns its node.
    pub(crate) fn emit_node(
        &mut self,
        op: OpKind,
        inputs: Vec<Operand>,
        attrs: Attrs,
        suffix: &str,
    ) -> Result<NodeId, AutodiffError> {
        let mut node = Node::new(op, inputs);
        node.attrs = attrs;
        node.instance = self.unique(suffix);
        node.scope = self.scope.clone();
        node.name = "grad".into();
        node.ty = infer_node(&self.g, &node).map_err(|source| AutodiffError::Emit {
            op: self.op,
            instance: self.instance.clone(),
            emitted: op,
            emitted_instance: node.instance.clone(),
            source,
        })?;
        Ok(self.g.push_node(node))
    }

    /// As [`Emitter::emit_node`], returning the result as an operand.
    pub(crate) fn emit(
        &mut self,
        op: OpKind,
        inputs: Vec<Operand>,
        attrs: Attrs,
        suffix: &str,
    ) -> Result<Operand, AutodiffError> {
        self.emit_node(op, inputs, attrs, suffix).map(Operand::Node)
    }

    /// Element `k` of the tuple-valued node `tuple`: an existing `TupleGetItem` when there is
    /// one (every node so far precedes the ones to come), else a new one.
    pub(crate) fn item(
        &mut self,
        tuple: NodeId,
        k: usize,
        suffix: &str,
    ) -> Result<Operand, AutodiffError> {
        if let Some(&n) = self.items.get(&(tuple, k)) {
            return Ok(Operand::Node(n));
        }
        let n = self.emit_node(
            OpKind::TupleGetItem,
            vec![Operand::Node(tuple), Operand::Const(Const::Int(k as i64))],
            Attrs::new(),
            suffix,
        )?;
        self.items.insert((tuple, k), n);
        Ok(Operand::Node(n))
    }

    /// The tensor type of a node or parameter operand.
    pub(crate) fn operand_type(&self, operand: &Operand) -> Result<TensorType, AutodiffError> {
        self.g.operand_tensor_type(operand).cloned().ok_or_else(|| {
            self.bad_node(format!(
                "expected a tensor operand, got {}",
                crate::infer::operand_text(&self.g, operand)
            ))
        })
    }

    /// An error about the forward node being differentiated.
    pub(crate) fn bad_node(&self, reason: impl Into<String>) -> AutodiffError {
        AutodiffError::BadNode {
            op: self.op,
            instance: self.instance.clone(),
            reason: reason.into(),
        }
    }

    /// "No gradient" for the forward node being differentiated.
    pub(crate) fn no_gradient(&self, reason: impl Into<String>) -> AutodiffError {
        AutodiffError::NoGradient {
            op: self.op,
            instance: self.instance.clone(),
            reason: reason.into(),
        }
    }

    /// `g` summed over the axes along which a value of shape `target` was broadcast to `g`'s
    /// shape, then reshaped to `target`.
    pub(crate) fn unbroadcast(
        &mut self,
        g: Operand,
        target: &[usize],
        suffix: &str,
    ) -> Result<Operand, AutodiffError> {
        let shape = self.operand_type(&g)?.shape;
        if shape == target {
            return Ok(g);
        }
        let lead = shape.len().checked_sub(target.len()).ok_or_else(|| {
            self.bad_node(format!(
                "internal error: cannot unbroadcast shape {:?} to the larger rank of {:?}",
                shape, target
            ))
        })?;
        let axes: Vec<i64> = (0..shape.len())
            .filter(|&i| i < lead || (target[i - lead] == 1 && shape[i] != 1))
            .map(|i| i as i64)
            .collect();
        let mut r = g;
        if !axes.is_empty() {
            let keep = lead == 0;
            r = self.emit(
                OpKind::ReduceSum,
                vec![r, Operand::Const(Const::Ints(axes))],
                Attrs::new().with("keep_dims", shardc_ir::Attr::Bool(keep)),
                &format!("{suffix}_sum"),
            )?;
        }
        if self.operand_type(&r)?.shape != target {
            r = self.reshape(r, target, &format!("{suffix}_reshape"))?;
        }
        Ok(r)
    }

    /// `Reshape(x, shape)`.
    pub(crate) fn reshape(
        &mut self,
        x: Operand,
        shape: &[usize],
        suffix: &str,
    ) -> Result<Operand, AutodiffError> {
        self.emit(OpKind::Reshape, vec![x, ints(shape)], Attrs::new(), suffix)
    }
}

/// Sizes as a constant integer tuple.
pub(crate) fn ints(shape: &[usize]) -> Operand {
    Operand::Const(Const::Ints(shape.iter().map(|&d| d as i64).collect()))
}

/// The name of a dtype as the `dst_type` attribute of `Cast` takes it.
pub(crate) fn dtype_attr(d: DType) -> shardc_ir::Attr {
    shardc_ir::Attr::Str(d.name().to_string())
}

#[cfg(test)]
mod tests;
