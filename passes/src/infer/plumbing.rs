//! Shape rules of the graph plumbing: `TupleGetItem` and `Assign`.

use super::context::Cx;
use super::error::InferError;
use super::text::operand_text;
use shardc_ir::{OpKind, Type};

pub(super) fn infer(cx: &Cx<'_>) -> Result<Type, InferError> {
    match cx.op() {
        OpKind::TupleGetItem => {
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
        OpKind::Assign => {
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
        _ => Err(cx.misrouted()),
    }
}
