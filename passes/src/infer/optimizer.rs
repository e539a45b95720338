//! Shape rules of the optimizer updates: `ApplyMomentum`, `SGD`, `ApplyGradientDescent`,
//! `Adam`. Each is functional: it returns the new values of the variable and its state (a
//! tuple, all of the variable's type; `ApplyGradientDescent` has no state and returns one
//! tensor); `Assign` stores them.

use super::context::Cx;
use super::error::InferError;
use shardc_ir::{OpKind, Type};

pub(super) fn infer(cx: &Cx<'_>) -> Result<Type, InferError> {
    // (tensor operands that must match operand 0, scalar operands, result arity)
    let (tensors, scalars, results): (&[usize], &[usize], usize) = match cx.op() {
        OpKind::ApplyMomentum => {
            cx.attr_bool("use_nesterov", false)?;
            (&[1, 3], &[2, 4], 2)
        }
        OpKind::SGD => {
            cx.attr_float("dampening", 0.0)?;
            cx.attr_float("weight_decay", 0.0)?;
            cx.attr_bool("nesterov", false)?;
            (&[1, 3, 5], &[2, 4], 3)
        }
        OpKind::ApplyGradientDescent => (&[2], &[1], 1),
        OpKind::Adam => {
            cx.attr_bool("use_nesterov", false)?;
            (&[1, 2, 9], &[3, 4, 5, 6, 7, 8], 3)
        }
        _ => return Err(cx.misrouted()),
    };
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
