//! Shape rules of the elementwise ops: binary arithmetic (broadcasting), `Equal`, `BiasAdd`,
//! the unary activations, `Cast` and `Dropout`.

use super::context::Cx;
use super::error::InferError;
use super::shapes::broadcast_shapes;
use super::text::sh;
use shardc_ir::{Attr, DType, OpKind, TensorType, Type};

pub(super) fn infer(cx: &Cx<'_>) -> Result<Type, InferError> {
    use OpKind::*;
    match cx.op() {
        Add | Sub | Mul | RealDiv => {
            let (dtype, shape) = binary(cx)?;
            if !dtype.is_float() {
                return Err(cx.err(format!("needs a float element type, got {dtype} operands")));
            }
            Ok(Type::Tensor(TensorType::new(dtype, shape)))
        }
        Equal => {
            let (_, shape) = binary(cx)?;
            Ok(Type::Tensor(TensorType::new(DType::Bool, shape)))
        }
        BiasAdd => bias_add(cx),
        Neg | Square | Sqrt | Exp | Log | ReLU | GeLU | Sigmoid | Tanh => cx.keep(0),
        Cast => cast(cx),
        Dropout => dropout(cx),
        _ => Err(cx.misrouted()),
    }
}

/// `(dtype, broadcast shape)` of a binary op whose operands are tensors or number constants
/// (a constant acts as a rank-0 tensor of the other operand's element type).
pub(super) fn binary(cx: &Cx<'_>) -> Result<(DType, Vec<usize>), InferError> {
    match (cx.is_const(0), cx.is_const(1)) {
        (true, true) => Err(cx.err(
            "both operands are constants; at least one must be a tensor to give the element type",
        )),
        (true, false) => {
            let b = cx.tensor(1)?;
            Ok((b.dtype, b.shape.clone()))
        }
        (false, true) => {
            let a = cx.tensor(0)?;
            Ok((a.dtype, a.shape.clone()))
        }
        (false, false) => {
            let (a, b) = (cx.tensor(0)?, cx.tensor(1)?);
            cx.same_dtype(0, 1)?;
            let shape = broadcast_shapes(&a.shape, &b.shape).ok_or_else(|| {
                cx.err(format!(
                    "cannot broadcast {} of shape {} with {} of shape {}",
                    cx.name(0),
                    sh(&a.shape),
                    cx.name(1),
                    sh(&b.shape)
                ))
            })?;
            Ok((a.dtype, shape))
        }
    }
}

fn bias_add(cx: &Cx<'_>) -> Result<Type, InferError> {
    let x = cx.float_tensor(0)?;
    cx.expect_min_rank(0, 2, "(N, C, ...)")?;
    cx.same_dtype(0, 1)?;
    cx.expect_shape(1, &[x.shape[1]], &format!("x of shape {}", sh(&x.shape)))?;
    Ok(Type::Tensor(x.clone()))
}

/// Reads a dtype name as MindSpore writes it: `Float16`, `F16`, `float16`, `mstype.float16`.
pub(crate) fn parse_dtype(name: &str) -> Option<DType> {
    let name = name.strip_prefix("mstype.").unwrap_or(name);
    DType::from_name(name).or_else(|| {
        DType::ALL
            .iter()
            .copied()
            .find(|d| d.name().eq_ignore_ascii_case(name))
    })
}

fn cast(cx: &Cx<'_>) -> Result<Type, InferError> {
    let x = cx.tensor(0)?;
    let dst = match cx.node.attrs.get("dst_type") {
        None => return Err(cx.err("attribute `dst_type` is missing")),
        Some(Attr::Str(s)) => parse_dtype(s).ok_or_else(|| {
            cx.err(format!(
                "attribute `dst_type` {s} is not an element type (expected one of {})",
                DType::ALL.map(DType::name).join(", ")
            ))
        })?,
        Some(other) => {
            return Err(cx.err(format!(
                "attribute `dst_type` must be an element type name, got {}",
                other
            )))
        }
    };
    Ok(Type::Tensor(TensorType::new(dst, x.shape.clone())))
}

fn dropout(cx: &Cx<'_>) -> Result<Type, InferError> {
    let x = cx.float_tensor(0)?;
    let keep = cx.attr_float("keep_prob", 0.5)?;
    if !(keep > 0.0 && keep <= 1.0) {
        return Err(cx.err(format!(
            "attribute `keep_prob` must be in (0, 1], got {keep}"
        )));
    }
    cx.attr_int("seed0", 0)?;
    cx.attr_int("seed1", 0)?;
    Ok(Type::Tuple(vec![x.clone(), x.clone()]))
}
