//! The elementwise ops' rules: binary arithmetic (broadcasting), `Equal`, `BiasAdd`, the
//! unary activations (`SiLU` among them), `Erf`, `Cast` and `Dropout`. Their loops are the
//! (broadcast) result's dimensions; a size-1 broadcast dimension stays whole.

use super::rule::{Cost, Dims, Gradient, GradientFn, OpRule, Operands, Window};
use crate::autodiff::emitter::dtype_attr;
use crate::autodiff::rules::{float, Grads, Rule};
use crate::infer::context::Cx;
use crate::infer::error::InferError;
use crate::infer::shapes::broadcast_shapes;
use crate::infer::signatures::{OperandSpec::*, Signature};
use crate::infer::text::sh;
use crate::parallel::dims::{broadcast_dims, Dim, DimsCx, DimsError, OpDims};
use shardc_ir::OpKind::*;
use shardc_ir::{Attr, Attrs, DType, TensorType, Type};

/// `(x)`.
pub(super) const X: Signature = Signature::fixed(&[("x", Tensor)]);
/// `(a, b)`, either a tensor or a number constant.
const AB_NUM: Signature = Signature::fixed(&[("a", TensorOrNumber), ("b", TensorOrNumber)]);

/// A transcendental function (exp, log, sigmoid, tanh, sqrt) per element, relative to an add.
pub(super) const TRANSCENDENTAL: f64 = 20.0;
/// The tanh GeLU per element: its tanh is a vectorised rational function in f32 (measured on
/// rank 0 of `shardc bench strategies --stats`: about a fifth of a softmax per element).
pub(super) const GELU_WEIGHT: f64 = 8.0;

/// The rule of a broadcasting binary arithmetic op (`Add`, `Sub`, `Mul`, `RealDiv`): numbers
/// or tensors in, the broadcast result out, the gradient of each operand reduced back to its
/// shape, one add's work per element.
const fn arithmetic_rule(op: shardc_ir::OpKind) -> OpRule {
    OpRule {
        op,
        signature: AB_NUM,
        infer: arithmetic,
        gradient: Gradient::Rule(|r| r.binary()),
        differentiable: Operands::All,
        dims: Dims::Rule(elementwise_dims),
        cost: Cost::Vector(1.0),
        window: Window::None,
    }
}

/// The rule of a unary activation or function of one tensor (its result has x's type): its
/// gradient rule and its per-element weight are what differ.
const fn unary_rule(op: shardc_ir::OpKind, gradient: GradientFn, weight: f64) -> OpRule {
    OpRule {
        op,
        signature: X,
        infer: |cx| cx.keep(0),
        gradient: Gradient::Rule(gradient),
        differentiable: Operands::All,
        dims: Dims::Rule(elementwise_dims),
        cost: Cost::Vector(weight),
        window: Window::None,
    }
}

/// `BiasAdd(x, b)`: b along axis 1.
pub(super) static BIAS_ADD: OpRule = OpRule {
    op: BiasAdd,
    signature: Signature::fixed(&[("x", Tensor), ("b", Tensor)]),
    infer: bias_add,
    gradient: Gradient::Rule(bias_add_grad),
    differentiable: Operands::All,
    dims: Dims::Rule(bias_add_dims),
    cost: Cost::Vector(1.0),
    window: Window::None,
};

/// `Add(a, b)`.
pub(super) static ADD: OpRule = arithmetic_rule(Add);

/// `Sub(a, b)`.
pub(super) static SUB: OpRule = arithmetic_rule(Sub);

/// `Mul(a, b)`.
pub(super) static MUL: OpRule = arithmetic_rule(Mul);

/// `RealDiv(a, b)`.
pub(super) static REAL_DIV: OpRule = arithmetic_rule(RealDiv);

/// `Neg(x)`.
pub(super) static NEG: OpRule = unary_rule(Neg, neg_grad, 1.0);

/// `Square(x)`.
pub(super) static SQUARE: OpRule = unary_rule(Square, square_grad, 1.0);

/// `Sqrt(x)`.
pub(super) static SQRT: OpRule = unary_rule(Sqrt, sqrt_grad, TRANSCENDENTAL);

/// `Exp(x)`.
pub(super) static EXP: OpRule = unary_rule(Exp, exp_grad, TRANSCENDENTAL);

/// `Log(x)`.
pub(super) static LOG: OpRule = unary_rule(Log, log_grad, TRANSCENDENTAL);

/// `ReLU(x)`.
pub(super) static RELU: OpRule = unary_rule(ReLU, relu_grad, 1.0);

/// `GeLU(x)`.
pub(super) static GELU: OpRule = unary_rule(GeLU, gelu_grad, GELU_WEIGHT);

/// `Sigmoid(x)`.
pub(super) static SIGMOID: OpRule = unary_rule(Sigmoid, sigmoid_grad, TRANSCENDENTAL);

/// `Tanh(x)`.
pub(super) static TANH: OpRule = unary_rule(Tanh, tanh_grad, TRANSCENDENTAL);

/// `SiLU(x)`: `x * sigmoid(x)`; its gradient is the `SiLUGrad` kernel of x.
pub(super) static SILU: OpRule = unary_rule(SiLU, silu_grad, TRANSCENDENTAL);

/// `Erf(x)`: its gradient `2/sqrt(pi) * exp(-x^2) * dy` is composed of existing ops.
pub(super) static ERF: OpRule = unary_rule(Erf, erf_grad, TRANSCENDENTAL);

/// `Cast(x)` to `dst_type`.
pub(super) static CAST: OpRule = OpRule {
    op: Cast,
    signature: X,
    infer: cast,
    gradient: Gradient::Rule(cast_grad),
    differentiable: Operands::All,
    dims: Dims::Rule(elementwise_dims),
    cost: Cost::Vector(1.0),
    window: Window::None,
};

/// `Equal(a, b)` -> Bool.
pub(super) static EQUAL: OpRule = OpRule {
    op: Equal,
    signature: AB_NUM,
    infer: equal,
    gradient: Gradient::None("its result does not vary continuously with its operands"),
    differentiable: Operands::NoneOf,
    dims: Dims::Rule(elementwise_dims),
    cost: Cost::Vector(1.0),
    window: Window::None,
};

/// `Dropout(x)` -> `(y, mask)`.
pub(super) static DROPOUT: OpRule = OpRule {
    op: Dropout,
    signature: X,
    infer: dropout,
    gradient: Gradient::Rule(dropout_grad),
    differentiable: Operands::All,
    dims: Dims::Rule(elementwise_dims),
    cost: Cost::Vector(1.0),
    window: Window::None,
};

// ---- shapes ----

/// `Add`, `Sub`, `Mul`, `RealDiv`: broadcast, float.
fn arithmetic(cx: &Cx<'_>) -> Result<Type, InferError> {
    let (dtype, shape) = binary(cx)?;
    if !dtype.is_float() {
        return Err(cx.err(format!("needs a float element type, got {dtype} operands")));
    }
    Ok(Type::Tensor(TensorType::new(dtype, shape)))
}

fn equal(cx: &Cx<'_>) -> Result<Type, InferError> {
    let (_, shape) = binary(cx)?;
    Ok(Type::Tensor(TensorType::new(DType::Bool, shape)))
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

// ---- gradients ----

fn bias_add_grad(r: &mut Rule<'_>) -> Grads {
    let dy = r.dy()?;
    let attrs = r.copied_attrs();
    let db = r.when(1, |r| r.emit(BiasAddGrad, vec![dy.clone()], attrs, "_b"))?;
    Ok(vec![Some(dy), db])
}

fn neg_grad(r: &mut Rule<'_>) -> Grads {
    r.unary(|r, dy| r.emit(Neg, vec![dy], Attrs::new(), ""))
}

fn square_grad(r: &mut Rule<'_>) -> Grads {
    r.unary(|r, dy| {
        let two_x = r.emit(Mul, vec![r.x(0), float(2.0)], Attrs::new(), "_2x")?;
        r.emit(Mul, vec![dy, two_x], Attrs::new(), "")
    })
}

fn sqrt_grad(r: &mut Rule<'_>) -> Grads {
    r.unary(|r, dy| r.emit(SqrtGrad, vec![r.y(), dy], Attrs::new(), ""))
}

fn exp_grad(r: &mut Rule<'_>) -> Grads {
    r.unary(|r, dy| r.emit(Mul, vec![dy, r.y()], Attrs::new(), ""))
}

fn log_grad(r: &mut Rule<'_>) -> Grads {
    r.unary(|r, dy| r.emit(RealDiv, vec![dy, r.x(0)], Attrs::new(), ""))
}

fn relu_grad(r: &mut Rule<'_>) -> Grads {
    r.unary(|r, dy| r.emit(ReluGrad, vec![dy, r.y()], Attrs::new(), ""))
}

fn gelu_grad(r: &mut Rule<'_>) -> Grads {
    r.unary(|r, dy| r.emit(GeLUGrad, vec![dy, r.x(0), r.y()], Attrs::new(), ""))
}

fn sigmoid_grad(r: &mut Rule<'_>) -> Grads {
    r.unary(|r, dy| r.emit(SigmoidGrad, vec![r.y(), dy], Attrs::new(), ""))
}

fn tanh_grad(r: &mut Rule<'_>) -> Grads {
    r.unary(|r, dy| r.emit(TanhGrad, vec![r.y(), dy], Attrs::new(), ""))
}

fn silu_grad(r: &mut Rule<'_>) -> Grads {
    r.unary(|r, dy| r.emit(SiLUGrad, vec![dy, r.x(0)], Attrs::new(), ""))
}

/// `d erf(x) / dx = 2/sqrt(pi) * exp(-x^2)`.
fn erf_grad(r: &mut Rule<'_>) -> Grads {
    r.unary(|r, dy| {
        let sq = r.emit(Square, vec![r.x(0)], Attrs::new(), "_sq")?;
        let neg = r.emit(Mul, vec![sq, float(-1.0)], Attrs::new(), "_neg")?;
        let e = r.emit(Exp, vec![neg], Attrs::new(), "_exp")?;
        let d = r.emit(
            Mul,
            vec![e, float(std::f64::consts::FRAC_2_SQRT_PI)],
            Attrs::new(),
            "_deriv",
        )?;
        r.emit(Mul, vec![dy, d], Attrs::new(), "")
    })
}

fn cast_grad(r: &mut Rule<'_>) -> Grads {
    let src = r.ty(0)?.dtype;
    r.unary(|r, dy| {
        r.emit(
            Cast,
            vec![dy],
            Attrs::new().with("dst_type", dtype_attr(src)),
            "",
        )
    })
}

fn dropout_grad(r: &mut Rule<'_>) -> Grads {
    r.only_outputs(&[0], "the mask (result 1)")?;
    let dy = r.dy()?;
    let mask = r.item(1)?;
    let mut attrs = Attrs::new();
    if let Some(k) = r.node.attrs.get("keep_prob") {
        attrs.set("keep_prob", k.clone());
    }
    let dx = r.emit(DropoutGrad, vec![dy, mask], attrs, "")?;
    Ok(vec![Some(dx)])
}

impl Rule<'_> {
    fn binary(&mut self) -> Grads {
        let dy = self.dy()?;
        let op = self.node.op;
        let mut out = Vec::with_capacity(2);
        for i in 0..2 {
            if !self.need(i) {
                out.push(None);
                continue;
            }
            let sfx = self.operand_suffix(i);
            let shape = self.ty(i)?.shape;
            let other = self.x(1 - i);
            let g = match (op, i) {
                (Add, _) | (Sub, 0) => dy.clone(),
                (Sub, _) => self.emit(Neg, vec![dy.clone()], Attrs::new(), &sfx)?,
                (Mul, _) => self.emit(Mul, vec![dy.clone(), other], Attrs::new(), &sfx)?,
                (RealDiv, 0) => self.emit(RealDiv, vec![dy.clone(), other], Attrs::new(), &sfx)?,
                // d(a / b) / db = -a / b^2 = -y / b.
                _ => {
                    let q = self.emit(
                        RealDiv,
                        vec![self.y(), self.x(1)],
                        Attrs::new(),
                        &format!("{sfx}_quot"),
                    )?;
                    let m = self.emit(
                        Mul,
                        vec![dy.clone(), q],
                        Attrs::new(),
                        &format!("{sfx}_mul"),
                    )?;
                    self.emit(Neg, vec![m], Attrs::new(), &sfx)?
                }
            };
            out.push(Some(self.em.unbroadcast(g, &shape, &sfx)?));
        }
        Ok(out)
    }
}

// ---- loops ----

/// Elementwise over the (broadcast) result's shape (also the elementwise gradient kernels').
pub(super) fn elementwise_dims(c: &DimsCx<'_>) -> Result<OpDims, DimsError> {
    let (outs, out0) = (&c.outs, &c.out0);
    let mut d = OpDims::with_loops(out0.clone());
    c.consts_as_none(&mut d);
    d.outputs = outs.iter().map(|o| broadcast_dims(o, out0)).collect();
    Ok(d)
}

fn bias_add_dims(c: &DimsCx<'_>) -> Result<OpDims, DimsError> {
    let x = c.in_shape(0)?;
    let mut d = OpDims::with_loops(x.clone());
    d.inputs = vec![Some(OpDims::identity(x.len())), Some(vec![Dim::Loop(1)])];
    d.outputs = vec![OpDims::identity(x.len())];
    Ok(d)
}
