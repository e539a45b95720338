//! What the gradient rules share: [`Rule`], the forward node being differentiated with the
//! helpers that read it and emit gradient nodes. Each op's own rule (given the gradients of a
//! forward node's results, emit the gradients of its operands) lives with its other rules in
//! its family module of `crate::ops`.
//!
//! MindSpore's gradient kernels are used where they exist (`ReluGrad`, `SigmoidGrad`,
//! `TanhGrad`, `GeLUGrad`, `SqrtGrad`, `BiasAddGrad`, `SoftmaxGrad`, `LogSoftmaxGrad`,
//! `Conv2DBackpropInput` / `Conv2DBackpropFilter`, `MaxPoolGrad`, `AvgPoolGrad`,
//! `BatchNormGrad`, `LayerNormGrad`, `DropoutGrad`, `StridedSliceGrad`, `UnsortedSegmentSum`
//! for `Gather`, `SparseSoftmaxCrossEntropyWithLogits` with `is_grad`, the `backprop` result of
//! `SoftmaxCrossEntropyWithLogits`); the rest is composed from basic ops. A broadcast operand
//! gets its gradient summed back to its own shape.

use super::emitter::Emitter;
use super::error::AutodiffError;
use crate::infer::signatures::Signature;
use shardc_ir::{Attrs, Const, Node, NodeId, OpKind, Operand, TensorType};

/// Attributes that describe the forward node's own operands or strategy, not its semantics;
/// they are not copied to gradient kernels.
const NOT_COPIED: &[&str] = &["input_names", "output_names", "in_strategy", "out_strategy"];

/// One forward node whose operands' gradients a rule emits, with helpers the rules share
/// (public only as the argument type of a `crate::ops::Gradient::Rule`).
pub struct Rule<'e> {
    /// The emitter that appends the gradient nodes.
    pub(crate) em: &'e mut Emitter,
    /// The forward node's id.
    pub(crate) id: NodeId,
    /// The forward node.
    pub(crate) node: Node,
    /// The operand signature of its op.
    pub(crate) sig: Signature,
    /// The gradients of its results (`None` where nothing flows back).
    pub(crate) dys: Vec<Option<Operand>>,
    /// Whether each operand wants a gradient.
    pub(crate) needs: Vec<bool>,
}

/// The gradients of a node's operands (one per operand, `None` where none is wanted).
pub(crate) type Grads = Result<Vec<Option<Operand>>, AutodiffError>;

impl Rule<'_> {
    // ---- access to the forward node ----

    /// Forward operand `i`.
    pub(crate) fn x(&self, i: usize) -> Operand {
        self.node.inputs[i].clone()
    }

    /// The tensor type of forward operand `i`.
    pub(crate) fn ty(&self, i: usize) -> Result<TensorType, AutodiffError> {
        let op = self
            .node
            .inputs
            .get(i)
            .ok_or_else(|| self.em.bad_node(format!("input {i} is missing")))?;
        self.em.operand_type(op)
    }

    /// The forward node's (single) result.
    pub(crate) fn y(&self) -> Operand {
        Operand::Node(self.id)
    }

    /// Result `k` of the tuple-valued forward node.
    pub(crate) fn item(&mut self, k: usize) -> Result<Operand, AutodiffError> {
        self.em.item(self.id, k, &format!("_item{k}"))
    }

    /// The gradient of the single (or first) result.
    pub(crate) fn dy(&self) -> Result<Operand, AutodiffError> {
        self.dys
            .first()
            .cloned()
            .flatten()
            .ok_or_else(|| self.em.bad_node("internal error: no gradient for result 0"))
    }

    /// Fails when a gradient reaches a result other than `allowed` (`what` names them).
    pub(crate) fn only_outputs(&self, allowed: &[usize], what: &str) -> Result<(), AutodiffError> {
        for (k, d) in self.dys.iter().enumerate() {
            if d.is_some() && !allowed.contains(&k) {
                return Err(self.em.no_gradient(format!(
                    "the loss depends on result {k}, and only {} of the results are differentiable ({what} is not)",
                    allowed.len()
                )));
            }
        }
        Ok(())
    }

    /// Whether operand `i` wants a gradient.
    pub(crate) fn need(&self, i: usize) -> bool {
        self.needs.get(i).copied().unwrap_or(false)
    }

    /// `f(self)` when operand `i` wants a gradient.
    pub(crate) fn when(
        &mut self,
        i: usize,
        f: impl FnOnce(&mut Self) -> Result<Operand, AutodiffError>,
    ) -> Result<Option<Operand>, AutodiffError> {
        if self.need(i) {
            f(self).map(Some)
        } else {
            Ok(None)
        }
    }

    /// The forward node's attributes, for a gradient kernel of the same op family.
    pub(crate) fn copied_attrs(&self) -> Attrs {
        let mut a = Attrs::new();
        for (k, v) in self.node.attrs.iter() {
            if !NOT_COPIED.contains(&k) {
                a.set(k, v.clone());
            }
        }
        a
    }

    /// The `axis` attribute (when present) of a softmax.
    pub(crate) fn axis_attr(&self) -> Attrs {
        let mut a = Attrs::new();
        if let Some(v) = self.node.attrs.get("axis") {
            a.set("axis", v.clone());
        }
        a
    }

    pub(crate) fn emit(
        &mut self,
        op: OpKind,
        inputs: Vec<Operand>,
        attrs: Attrs,
        suffix: &str,
    ) -> Result<Operand, AutodiffError> {
        self.em.emit(op, inputs, attrs, suffix)
    }

    /// The suffix for operand `i`: `_` + its name in the op's signature (`_a`, `_b`, `_x`).
    pub(crate) fn operand_suffix(&self, i: usize) -> String {
        format!("_{}", self.sig.name(i))
    }

    /// Emits a tuple-valued gradient kernel with the forward node's attributes.
    pub(crate) fn emit_node_grad(
        &mut self,
        op: OpKind,
        inputs: Vec<Operand>,
    ) -> Result<NodeId, AutodiffError> {
        let attrs = self.copied_attrs();
        self.em.emit_node(op, inputs, attrs, "")
    }

    /// A one-operand op whose gradient is `f(dy)`.
    pub(crate) fn unary(
        &mut self,
        f: impl FnOnce(&mut Self, Operand) -> Result<Operand, AutodiffError>,
    ) -> Grads {
        let dy = self.dy()?;
        let mut out = vec![None; self.node.inputs.len()];
        if self.need(0) {
            out[0] = Some(f(self, dy)?);
        }
        Ok(out)
    }
}

/// A float constant operand.
pub(crate) fn float(v: f64) -> Operand {
    Operand::Const(Const::Float(v))
}
