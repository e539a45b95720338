//! The optimizer updates' rules: `ApplyMomentum`, `SGD`, `ApplyGradientDescent`, `Adam`.
//! Each is functional: it returns the new values of the variable and its state (a tuple, all
//! of the variable's type; `ApplyGradientDescent` has no state and returns one tensor);
//! `Assign` stores them. Their loops are the variable's: every tensor operand of its shape
//! shares them (an update follows its weight's layout).

use super::rule::{Cost, Dims, Gradient, OpRule, Operands, Window};
use crate::infer::context::Cx;
use crate::infer::error::InferError;
use crate::infer::signatures::{OperandSpec::*, Signature};
use crate::parallel::dims::{broadcast_dims, DimsCx, DimsError, OpDims};
use shardc_ir::OpKind::*;
use shardc_ir::Type;

const NOT_DIFFERENTIABLE: &str = "an optimizer update is not differentiable";

/// `ApplyMomentum(variable, accumulation, learning_rate, gradient, momentum)`.
pub(super) static APPLY_MOMENTUM: OpRule = OpRule {
    op: ApplyMomentum,
    signature: Signature::fixed(&[
        ("variable", Tensor),
        ("accumulation", Tensor),
        ("learning_rate", Scalar),
        ("gradient", Tensor),
        ("momentum", Scalar),
    ]),
    infer: |cx| {
        cx.attr_bool("use_nesterov", false)?;
        update(cx, &[1, 3], &[2, 4], 2)
    },
    gradient: Gradient::None(NOT_DIFFERENTIABLE),
    differentiable: Operands::All,
    dims: Dims::Rule(update_dims),
    cost: Cost::Vector(1.0),
    window: Window::None,
};

/// `SGD(parameters, gradient, learning_rate, accum, momentum, stat)`.
pub(super) static SGD_RULE: OpRule = OpRule {
    op: shardc_ir::OpKind::SGD,
    signature: Signature::fixed(&[
        ("parameters", Tensor),
        ("gradient", Tensor),
        ("learning_rate", Scalar),
        ("accum", Tensor),
        ("momentum", Scalar),
        ("stat", Tensor),
    ]),
    infer: |cx| {
        cx.attr_float("dampening", 0.0)?;
        cx.attr_float("weight_decay", 0.0)?;
        cx.attr_bool("nesterov", false)?;
        update(cx, &[1, 3, 5], &[2, 4], 3)
    },
    gradient: Gradient::None(NOT_DIFFERENTIABLE),
    differentiable: Operands::All,
    dims: Dims::Rule(update_dims),
    cost: Cost::Vector(1.0),
    window: Window::None,
};

/// `ApplyGradientDescent(var, alpha, delta)`.
pub(super) static APPLY_GRADIENT_DESCENT: OpRule = OpRule {
    op: ApplyGradientDescent,
    signature: Signature::fixed(&[("var", Tensor), ("alpha", Scalar), ("delta", Tensor)]),
    infer: |cx| update(cx, &[2], &[1], 1),
    gradient: Gradient::None(NOT_DIFFERENTIABLE),
    differentiable: Operands::All,
    dims: Dims::Rule(update_dims),
    cost: Cost::Vector(1.0),
    window: Window::None,
};

/// `Adam(var, m, v, beta1_power, beta2_power, lr, beta1, beta2, epsilon, gradient)`.
pub(super) static ADAM: OpRule = OpRule {
    op: Adam,
    signature: Signature::fixed(&[
        ("var", Tensor),
        ("m", Tensor),
        ("v", Tensor),
        ("beta1_power", Scalar),
        ("beta2_power", Scalar),
        ("lr", Scalar),
        ("beta1", Scalar),
        ("beta2", Scalar),
        ("epsilon", Scalar),
        ("gradient", Tensor),
    ]),
    infer: |cx| {
        cx.attr_bool("use_nesterov", false)?;
        update(cx, &[1, 2, 9], &[3, 4, 5, 6, 7, 8], 3)
    },
    gradient: Gradient::None(NOT_DIFFERENTIABLE),
    differentiable: Operands::All,
    dims: Dims::Rule(update_dims),
    cost: Cost::Vector(1.0),
    window: Window::None,
};

/// An update's type: `tensors` must match operand 0 (the variable), `scalars` are scalar
/// hyper-parameters of its element type; `results` copies of the variable's type.
fn update(
    cx: &Cx<'_>,
    tensors: &[usize],
    scalars: &[usize],
    results: usize,
) -> Result<Type, InferError> {
    let var = cx.float_tensor(0)?;
    for &i in tensors {
        cx.same_type(0, i)?;
    }
    for &i in scalars {
        cx.scalar(i, var.dtype)?;
    }
    Ok(if results == 1 {
        Type::Tensor(var.clone())
    } else {
        Type::Tuple(vec![var.clone(); results])
    })
}

/// The loops of an update (and of `Assign`): the variable's dims, shared by every tensor
/// operand of its shape; scalars (rank 0) have no dimensions.
pub(super) fn update_dims(c: &DimsCx<'_>) -> Result<OpDims, DimsError> {
    let (ins, outs) = (&c.ins, &c.outs);
    // Every tensor operand of the variable's shape shares its loops; scalars (rank 0)
    // have no dimensions.
    let var = c.in_shape(0)?;
    let mut d = OpDims::with_loops(var.clone());
    d.inputs = ins
        .iter()
        .map(|s| {
            s.as_ref().map(|s| {
                if s.is_empty() {
                    Vec::new()
                } else {
                    broadcast_dims(s, &var)
                }
            })
        })
        .collect();
    d.outputs = outs.iter().map(|o| broadcast_dims(o, &var)).collect();
    Ok(d)
}
