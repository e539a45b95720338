//! The emitter: appends typed nodes to the graph being differentiated, named after the forward
//! node whose gradient they compute, and the small operand helpers the rules share.

use super::error::AutodiffError;
use crate::infer::error::InferError;
use shardc_ir::{Attrs, Const, DType, Graph, Node, NodeId, OpKind, Operand, TensorType, Type};
use std::collections::{HashMap, HashSet};

/// The pipeline attributes a gradient's nodes inherit from their forward node.
const PIPELINE_ATTRS: [&str; 2] = ["pipeline_stage", "micro_batch"];

/// The shape rule an emitter types its nodes with (`crate::infer::infer_node`, given by the
/// caller: the rules that emit nodes sit below the dispatcher of every op's shape rule).
pub(crate) type TypeOf = fn(&Graph, &Node) -> Result<Type, InferError>;

/// Appends typed nodes to the graph being built, naming them after the forward node being
/// differentiated.
pub(crate) struct Emitter {
    /// The graph being built.
    pub g: Graph,
    /// Types each emitted node.
    type_of: TypeOf,
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
    /// The pipeline attributes (`pipeline_stage`, `micro_batch`) of the forward node, copied
    /// onto every node emitted for its gradient (only those it has).
    pipeline: Attrs,
}

impl Emitter {
    /// An emitter that appends to `g`, typing nodes with `type_of`; nodes are named as the
    /// loss's gradient until a context is set.
    pub(super) fn new(g: Graph, type_of: TypeOf) -> Emitter {
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
            type_of,
            names,
            items,
            scope: "Gradients".into(),
            base: "grad".into(),
            op: OpKind::OnesLike,
            instance: String::new(),
            pipeline: Attrs::new(),
        }
    }

    /// Emitted nodes from now on belong to the gradient of forward node `id`.
    pub(super) fn set_context(&mut self, id: NodeId) {
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
        self.pipeline = Attrs::new();
        for key in PIPELINE_ATTRS {
            if let Some(v) = node.attrs.get(key) {
                self.pipeline.set(key, v.clone());
            }
        }
        self.instance = if node.instance.is_empty() {
            format!("%{}", id.index() + 1)
        } else {
            node.instance.clone()
        };
    }

    /// Emitted nodes from now on are named `grad_<name>` in scope `Gradients`.
    pub(super) fn set_root_context(&mut self, name: &str) {
        self.scope = "Gradients".into();
        self.base = format!("grad_{name}");
        self.instance = name.into();
        self.pipeline = Attrs::new();
    }

    /// Emitted nodes from now on are named `<base>...` in `scope` (the optimizer update).
    pub(crate) fn set_plain_context(&mut self, scope: &str, base: &str, op: OpKind) {
        self.scope = scope.into();
        self.base = base.into();
        self.op = op;
        self.instance = base.into();
        self.pipeline = Attrs::new();
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
        for (k, v) in self.pipeline.iter() {
            node.attrs.set(k, v.clone());
        }
        node.instance = self.unique(suffix);
        node.scope = self.scope.clone();
        node.name = "grad".into();
        node.ty = (self.type_of)(&self.g, &node).map_err(|source| AutodiffError::Emit {
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
                crate::infer::text::operand_text(&self.g, operand)
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
