//! The losses' rules: `SoftmaxCrossEntropyWithLogits` and
//! `SparseSoftmaxCrossEntropyWithLogits`.

use super::reduction::SOFTMAX_WEIGHT;
use super::rule::{Cost, Dims, Gradient, OpRule, Operands, Window};
use crate::autodiff::rules::{Grads, Rule};
use crate::infer::context::Cx;
use crate::infer::error::InferError;
use crate::infer::signatures::{OperandSpec::*, Signature};
use crate::infer::text::sh;
use crate::parallel::dims::{Dim, DimsCx, DimsError, OpDims};
use shardc_ir::OpKind::*;
use shardc_ir::{Attr, Attrs, ReduceOp, TensorType, Type};

/// `(logits, labels)`.
const LOGITS_LABELS: Signature = Signature::fixed(&[("logits", Tensor), ("labels", Tensor)]);

/// `SoftmaxCrossEntropyWithLogits(logits, labels)` -> `(loss, backprop)`.
pub(super) static SOFTMAX_CROSS_ENTROPY_WITH_LOGITS: OpRule = OpRule {
    op: SoftmaxCrossEntropyWithLogits,
    signature: LOGITS_LABELS,
    infer: softmax_ce,
    gradient: Gradient::Rule(|r| r.softmax_ce()),
    differentiable: Operands::All,
    dims: Dims::Rule(softmax_ce_dims),
    cost: Cost::Vector(SOFTMAX_WEIGHT),
    window: Window::None,
};

/// `SparseSoftmaxCrossEntropyWithLogits(logits, labels)`: the mean loss, or its gradient.
pub(super) static SPARSE_SOFTMAX_CROSS_ENTROPY_WITH_LOGITS: OpRule = OpRule {
    op: SparseSoftmaxCrossEntropyWithLogits,
    signature: LOGITS_LABELS,
    infer: sparse_softmax_ce,
    gradient: Gradient::Rule(sparse_softmax_ce_grad),
    differentiable: Operands::First,
    dims: Dims::Rule(sparse_softmax_ce_dims),
    cost: Cost::Vector(SOFTMAX_WEIGHT),
    window: Window::None,
};

// ---- shapes ----

fn softmax_ce(cx: &Cx<'_>) -> Result<Type, InferError> {
    let logits = cx.float_tensor(0)?;
    cx.expect_rank(0, 2, "(N, C)")?;
    cx.same_type(0, 1)?;
    let n = logits.shape[0];
    Ok(Type::Tuple(vec![
        TensorType::new(logits.dtype, vec![n]),
        logits.clone(),
    ]))
}

fn sparse_softmax_ce(cx: &Cx<'_>) -> Result<Type, InferError> {
    let logits = cx.float_tensor(0)?;
    cx.expect_rank(0, 2, "(N, C)")?;
    cx.int_tensor(1)?;
    let n = logits.shape[0];
    cx.expect_shape(1, &[n], &format!("logits of shape {}", sh(&logits.shape)))?;
    if cx.attr_bool("is_grad", false)? {
        Ok(Type::Tensor(logits.clone()))
    } else {
        Ok(Type::Tensor(TensorType::scalar(logits.dtype)))
    }
}

// ---- gradients ----

fn sparse_softmax_ce_grad(r: &mut Rule<'_>) -> Grads {
    if r.node.attrs.bool_or("is_grad", false) {
        return Err(r.em.no_gradient(
            "with is_grad: true it computes a gradient already (second-order gradients are not supported)",
        ));
    }
    r.unary(|r, dy| {
        let g = r.emit(
            SparseSoftmaxCrossEntropyWithLogits,
            vec![r.x(0), r.x(1)],
            Attrs::new().with("is_grad", Attr::Bool(true)),
            "_logits",
        )?;
        r.emit(Mul, vec![g, dy], Attrs::new(), "")
    })
}

impl Rule<'_> {
    /// `(loss (N), backprop (N, C))`: dlogits = backprop * dloss[:, None]; dlabels =
    /// -log_softmax(logits) * dloss[:, None].
    fn softmax_ce(&mut self) -> Grads {
        self.only_outputs(&[0], "backprop (result 1)")?;
        let dy = self.dy()?;
        let n = self.em.operand_type(&dy)?.shape;
        let mut col = n.clone();
        col.push(1);
        let d = self.em.reshape(dy, &col, "_col")?;
        let mut out = vec![None, None];
        if self.need(0) {
            let bp = self.item(1)?;
            out[0] = Some(self.emit(Mul, vec![bp, d.clone()], Attrs::new(), "_logits")?);
        }
        if self.need(1) {
            let ls = self.emit(
                LogSoftmax,
                vec![self.x(0)],
                Attrs::new().with("axis", Attr::Int(-1)),
                "_log_softmax",
            )?;
            let m = self.emit(Mul, vec![ls, d], Attrs::new(), "_labels_mul")?;
            out[1] = Some(self.emit(Neg, vec![m], Attrs::new(), "_labels")?);
        }
        Ok(out)
    }
}

// ---- loops ----

fn softmax_ce_dims(c: &DimsCx<'_>) -> Result<OpDims, DimsError> {
    let x = c.in_shape(0)?;
    let mut d = OpDims::with_loops(x.clone());
    d.inputs = vec![Some(vec![Dim::Loop(0), Dim::Loop(1)]); 2];
    d.outputs = vec![vec![Dim::Loop(0)], vec![Dim::Loop(0), Dim::Loop(1)]];
    d.fix(1, "dimension 1 is the class axis of the softmax");
    Ok(d)
}

fn sparse_softmax_ce_dims(c: &DimsCx<'_>) -> Result<OpDims, DimsError> {
    let node = c.node;
    let x = c.in_shape(0)?;
    let mut d = OpDims::with_loops(x.clone());
    d.inputs = vec![
        Some(vec![Dim::Loop(0), Dim::Loop(1)]),
        Some(vec![Dim::Loop(0)]),
    ];
    d.outputs = vec![if node.attrs.bool_or("is_grad", false) {
        vec![Dim::Loop(0), Dim::Loop(1)]
    } else {
        Vec::new()
    }];
    d.combine[0] = Some(ReduceOp::Sum);
    d.mean_loops.push(0);
    d.fix(1, "dimension 1 is the class axis of the softmax");
    Ok(d)
}
