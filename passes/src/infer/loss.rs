//! Shape rules of the losses: `SoftmaxCrossEntropyWithLogits` and
//! `SparseSoftmaxCrossEntropyWithLogits`.

use super::context::Cx;
use super::error::InferError;
use super::text::sh;
use shardc_ir::{OpKind, TensorType, Type};

pub(super) fn infer(cx: &Cx<'_>) -> Result<Type, InferError> {
    match cx.op() {
        OpKind::SoftmaxCrossEntropyWithLogits => {
            let logits = cx.float_tensor(0)?;
            cx.expect_rank(0, 2, "(N, C)")?;
            cx.same_type(0, 1)?;
            let n = logits.shape[0];
            Ok(Type::Tuple(vec![
                TensorType::new(logits.dtype, vec![n]),
                logits.clone(),
            ]))
        }
        OpKind::SparseSoftmaxCrossEntropyWithLogits => {
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
        _ => Err(cx.misrouted()),
    }
}
