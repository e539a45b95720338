//! The graph plumbing's rules: `TupleGetItem` and `Assign`.

use super::communication::NO_STRATEGY;
use super::optimizer::update_dims;
use super::rule::{Cost, Dims, Gradient, OpRule, Operands, Window};
use crate::infer::context::Cx;
use crate::infer::error::InferError;
use crate::infer::signatures::{OperandSpec::*, Signature};
use crate::infer::text::operand_text;
use shardc_ir::OpKind::*;
use shardc_ir::Type;

/// `TupleGetItem(t, index)`: an alias of the tuple's element (the autodiff driver routes its
/// gradient; the executor aliases it).
pub(super) static TUPLE_GET_ITEM: OpRule = OpRule {
    op: TupleGetItem,
    signature: Signature::fixed(&[("t", Tensor), ("index", Int)]),
    infer: tuple_get_item,
    gradient: Gradient::Driver("TupleGetItem is routed by the driver, not by a rule"),
    differentiable: Operands::All,
    dims: Dims::NoStrategy(NO_STRATEGY),
    cost: Cost::Vector(1.0),
    window: Window::None,
};

/// `Assign(param, value)`: the parameter takes `value` (it follows the weight's layout, as
/// an update does).
pub(super) static ASSIGN: OpRule = OpRule {
    op: Assign,
    signature: Signature::fixed(&[("param", Weight), ("value", Tensor)]),
    infer: assign,
    gradient: Gradient::None("Assign stores a parameter; read the value it stores instead"),
    differentiable: Operands::All,
    dims: Dims::Rule(update_dims),
    cost: Cost::Vector(1.0),
    window: Window::None,
};

fn tuple_get_item(cx: &Cx<'_>) -> Result<Type, InferError> {
    let ts = match cx.value_type(0)? {
        Type::Tuple(ts) => ts,
        Type::Tensor(t) => {
            return Err(cx.err(format!(
                "{} must be a tuple, got the tensor {t}",
                cx.name(0)
            )))
        }
    };
    let index = cx.int(1)?;
    let t = usize::try_from(index)
        .ok()
        .and_then(|i| ts.get(i))
        .ok_or_else(|| {
            cx.err(format!(
                "{} {index} is out of range for a tuple of {} element(s)",
                cx.name(1),
                ts.len()
            ))
        })?;
    Ok(Type::Tensor(t.clone()))
}

fn assign(cx: &Cx<'_>) -> Result<Type, InferError> {
    // The signature check has made operand 0 a weight parameter.
    let param = cx.tensor(0)?;
    let value = cx.tensor(1)?;
    if param != value {
        return Err(cx.err(format!(
            "{} is {value} but the parameter {} is {param}; they must be equal",
            cx.name(1),
            operand_text(cx.graph, &cx.node.inputs[0])
        )));
    }
    Ok(Type::Tensor(param.clone()))
}
