//! The gradient kernels' rules (the ops autodiff emits: `ReluGrad`, `SigmoidGrad`, ...,
//! `Conv2DBackpropInput` / `Conv2DBackpropFilter` (Conv2D's window geometry,
//! `shardc_ir::geometry::conv2d_geometry`), `MaxPoolGrad` / `AvgPoolGrad` (the pooling's,
//! `pool2d_geometry`), the norms' gradients, `UnsortedSegmentSum`). Their loops are their
//! forward op's; the kernels that are linear in dy (`DropoutGrad`, `StridedSliceGrad`,
//! `UnsortedSegmentSum`) have a gradient, the others are second order and have none.

use super::contraction::{conv_dims, conv_flops};
use super::elementwise::{elementwise_dims, GELU_WEIGHT, TRANSCENDENTAL};
use super::movement::{slice_shape, strided_slice_dims};
use super::reduction::{
    batch_norm_dims, bn_count, bn_training_dims, channels, layer_norm_dims, layer_norm_layout,
    pool_dims, softmax_dims, SOFTMAX_WEIGHT,
};
use super::rule::{Cost, Dims, Gradient, OpRule, Operands, Window};
use crate::autodiff::rules::{Grads, Rule};
use crate::infer::context::Cx;
use crate::infer::error::InferError;
use crate::infer::shapes::softmax_axis;
use crate::infer::signatures::{OperandSpec::*, Signature};
use crate::infer::text::sh;
use crate::parallel::dims::{Dim, DimsCx, DimsError, OpDims};
use shardc_ir::geometry::{conv2d_geometry, pool2d_geometry};
use shardc_ir::OpKind::*;
use shardc_ir::{Attrs, Const, Operand, ReduceOp, TensorType, Type};

/// Why a gradient kernel has no gradient.
const KERNEL: &str = "it is a gradient kernel (second-order gradients are not supported)";
/// `(y, dy)`.
const Y_DY: Signature = Signature::fixed(&[("y", Tensor), ("dy", Tensor)]);
/// `(x, y, dy)`.
const POOL_GRAD: Signature = Signature::fixed(&[("x", Tensor), ("y", Tensor), ("dy", Tensor)]);

/// `ReluGrad(dy, y)`.
pub(super) static RELU_GRAD: OpRule = OpRule {
    op: ReluGrad,
    signature: Signature::fixed(&[("dy", Tensor), ("y", Tensor)]),
    infer: same_as_dy,
    gradient: Gradient::None(KERNEL),
    differentiable: Operands::All,
    dims: Dims::Rule(elementwise_dims),
    cost: Cost::Vector(1.0),
    window: Window::None,
};

/// `GeLUGrad(dy, x, y)`.
pub(super) static GELU_GRAD: OpRule = OpRule {
    op: GeLUGrad,
    signature: Signature::fixed(&[("dy", Tensor), ("x", Tensor), ("y", Tensor)]),
    infer: gelu_grad,
    gradient: Gradient::None(KERNEL),
    differentiable: Operands::All,
    dims: Dims::Rule(elementwise_dims),
    cost: Cost::Vector(GELU_WEIGHT),
    window: Window::None,
};

/// `SiLUGrad(dy, x)`: `dy * s * (1 + x * (1 - s))`, `s = sigmoid(x)`; elementwise, and like
/// every gradient kernel but the linear ones, without a gradient of its own.
pub(super) static SILU_GRAD: OpRule = OpRule {
    op: SiLUGrad,
    signature: Signature::fixed(&[("dy", Tensor), ("x", Tensor)]),
    infer: same_as_dy,
    gradient: Gradient::None(KERNEL),
    differentiable: Operands::All,
    dims: Dims::Rule(elementwise_dims),
    cost: Cost::Vector(TRANSCENDENTAL),
    window: Window::None,
};

/// `SigmoidGrad(y, dy)`.
pub(super) static SIGMOID_GRAD: OpRule = OpRule {
    op: SigmoidGrad,
    signature: Y_DY,
    infer: same_as_dy,
    gradient: Gradient::None(KERNEL),
    differentiable: Operands::All,
    dims: Dims::Rule(elementwise_dims),
    cost: Cost::Vector(TRANSCENDENTAL),
    window: Window::None,
};

/// `TanhGrad(y, dy)`.
pub(super) static TANH_GRAD: OpRule = OpRule {
    op: TanhGrad,
    signature: Y_DY,
    infer: same_as_dy,
    gradient: Gradient::None(KERNEL),
    differentiable: Operands::All,
    dims: Dims::Rule(elementwise_dims),
    cost: Cost::Vector(TRANSCENDENTAL),
    window: Window::None,
};

/// `SqrtGrad(y, dy)`.
pub(super) static SQRT_GRAD: OpRule = OpRule {
    op: SqrtGrad,
    signature: Y_DY,
    infer: same_as_dy,
    gradient: Gradient::None(KERNEL),
    differentiable: Operands::All,
    dims: Dims::Rule(elementwise_dims),
    cost: Cost::Vector(1.0),
    window: Window::None,
};

/// `BiasAddGrad(dy)`: sums all axes but 1.
pub(super) static BIAS_ADD_GRAD: OpRule = OpRule {
    op: BiasAddGrad,
    signature: Signature::fixed(&[("dy", Tensor)]),
    infer: bias_add_grad,
    gradient: Gradient::None(KERNEL),
    differentiable: Operands::All,
    dims: Dims::Rule(bias_add_grad_dims),
    cost: Cost::Vector(1.0),
    window: Window::None,
};

/// `SoftmaxGrad(y, dy)`.
pub(super) static SOFTMAX_GRAD: OpRule = OpRule {
    op: SoftmaxGrad,
    signature: Y_DY,
    infer: softmax_grad,
    gradient: Gradient::None(KERNEL),
    differentiable: Operands::All,
    dims: Dims::Rule(softmax_dims),
    cost: Cost::Vector(SOFTMAX_WEIGHT),
    window: Window::None,
};

/// `LogSoftmaxGrad(y, dy)`.
pub(super) static LOG_SOFTMAX_GRAD: OpRule = OpRule {
    op: LogSoftmaxGrad,
    signature: Y_DY,
    infer: softmax_grad,
    gradient: Gradient::None(KERNEL),
    differentiable: Operands::All,
    dims: Dims::Rule(softmax_dims),
    cost: Cost::Vector(SOFTMAX_WEIGHT),
    window: Window::None,
};

/// `Conv2DBackpropInput(dy, w, input_size)`: Conv2D's dx.
pub(super) static CONV2D_BACKPROP_INPUT: OpRule = OpRule {
    op: Conv2DBackpropInput,
    signature: Signature::fixed(&[("dy", Tensor), ("w", Tensor), ("input_size", Ints)]),
    infer: conv2d_backprop_input,
    gradient: Gradient::None(KERNEL),
    differentiable: Operands::All,
    dims: Dims::Rule(conv_dims),
    cost: Cost::Gemm(conv_flops),
    window: Window::Conv2d,
};

/// `Conv2DBackpropFilter(dy, x, filter_size)`: Conv2D's dw.
pub(super) static CONV2D_BACKPROP_FILTER: OpRule = OpRule {
    op: Conv2DBackpropFilter,
    signature: Signature::fixed(&[("dy", Tensor), ("x", Tensor), ("filter_size", Ints)]),
    infer: conv2d_backprop_filter,
    gradient: Gradient::None(KERNEL),
    differentiable: Operands::All,
    dims: Dims::Rule(conv_dims),
    cost: Cost::Gemm(conv_flops),
    window: Window::Conv2d,
};

/// `MaxPoolGrad(x, y, dy)`.
pub(super) static MAX_POOL_GRAD: OpRule = OpRule {
    op: MaxPoolGrad,
    signature: POOL_GRAD,
    infer: pool_grad,
    gradient: Gradient::None(KERNEL),
    differentiable: Operands::All,
    dims: Dims::Rule(pool_dims),
    cost: Cost::Vector(1.0),
    window: Window::Pool2d,
};

/// `AvgPoolGrad(x, y, dy)`.
pub(super) static AVG_POOL_GRAD: OpRule = OpRule {
    op: AvgPoolGrad,
    signature: POOL_GRAD,
    infer: pool_grad,
    gradient: Gradient::None(KERNEL),
    differentiable: Operands::All,
    dims: Dims::Rule(pool_dims),
    cost: Cost::Vector(1.0),
    window: Window::Pool2d,
};

/// `BatchNormGrad(dy, x, scale, saved_mean, saved_rstd)`.
pub(super) static BATCH_NORM_GRAD: OpRule = OpRule {
    op: BatchNormGrad,
    signature: Signature::fixed(&[
        ("dy", Tensor),
        ("x", Tensor),
        ("scale", Tensor),
        ("saved_mean", Tensor),
        ("saved_rstd", Tensor),
    ]),
    infer: batch_norm_grad,
    gradient: Gradient::None(KERNEL),
    differentiable: Operands::All,
    dims: Dims::Rule(batch_norm_dims),
    cost: Cost::Vector(TRANSCENDENTAL),
    window: Window::None,
};

/// `LayerNormGrad(x, dy, rstd, mean, gamma)`.
pub(super) static LAYER_NORM_GRAD: OpRule = OpRule {
    op: LayerNormGrad,
    signature: Signature::fixed(&[
        ("x", Tensor),
        ("dy", Tensor),
        ("rstd", Tensor),
        ("mean", Tensor),
        ("gamma", Tensor),
    ]),
    infer: layer_norm_grad,
    gradient: Gradient::None(KERNEL),
    differentiable: Operands::All,
    dims: Dims::Rule(layer_norm_dims),
    cost: Cost::Vector(TRANSCENDENTAL),
    window: Window::None,
};

/// `DropoutGrad(dy, mask)`: `dy * mask`, linear in dy.
pub(super) static DROPOUT_GRAD: OpRule = OpRule {
    op: DropoutGrad,
    signature: Signature::fixed(&[("dy", Tensor), ("mask", Tensor)]),
    infer: same_as_dy,
    gradient: Gradient::Rule(dropout_grad_grad),
    differentiable: Operands::First,
    dims: Dims::Rule(elementwise_dims),
    cost: Cost::Vector(1.0),
    window: Window::None,
};

/// `StridedSliceGrad(dy, shape, begin, end, strides)`: linear in dy.
pub(super) static STRIDED_SLICE_GRAD: OpRule = OpRule {
    op: StridedSliceGrad,
    signature: Signature::fixed(&[
        ("dy", Tensor),
        ("shape", Ints),
        ("begin", Ints),
        ("end", Ints),
        ("strides", Ints),
    ]),
    infer: strided_slice_grad,
    gradient: Gradient::Rule(strided_slice_grad_grad),
    differentiable: Operands::First,
    dims: Dims::Rule(strided_slice_dims),
    cost: Cost::Vector(1.0),
    window: Window::None,
};

/// `UnsortedSegmentSum(x, segment_ids, num_segments)`: Gather's gradient, linear in x.
pub(super) static UNSORTED_SEGMENT_SUM: OpRule = OpRule {
    op: UnsortedSegmentSum,
    signature: Signature::fixed(&[
        ("x", Tensor),
        ("segment_ids", Tensor),
        ("num_segments", Int),
    ]),
    infer: unsorted_segment_sum,
    gradient: Gradient::Rule(unsorted_segment_sum_grad),
    differentiable: Operands::First,
    dims: Dims::Rule(unsorted_segment_sum_dims),
    cost: Cost::Vector(1.0),
    window: Window::None,
};

/// `BNTrainingUpdateGrad(dy, x, saved_mean, saved_rstd)` -> `(dscale, dbias)`.
pub(super) static BN_TRAINING_UPDATE_GRAD: OpRule = OpRule {
    op: BNTrainingUpdateGrad,
    signature: Signature::fixed(&[
        ("dy", Tensor),
        ("x", Tensor),
        ("saved_mean", Tensor),
        ("saved_rstd", Tensor),
    ]),
    infer: bn_training_update_grad,
    gradient: Gradient::None(KERNEL),
    differentiable: Operands::All,
    dims: Dims::Rule(bn_training_dims),
    cost: Cost::Vector(1.0),
    window: Window::None,
};

/// `BNTrainingReduceGrad(dy, x, dscale, dbias, scale, saved_mean, saved_rstd)` -> dx.
pub(super) static BN_TRAINING_REDUCE_GRAD: OpRule = OpRule {
    op: BNTrainingReduceGrad,
    signature: Signature::fixed(&[
        ("dy", Tensor),
        ("x", Tensor),
        ("dscale", Tensor),
        ("dbias", Tensor),
        ("scale", Tensor),
        ("saved_mean", Tensor),
        ("saved_rstd", Tensor),
    ]),
    infer: bn_training_reduce_grad,
    gradient: Gradient::None(KERNEL),
    differentiable: Operands::All,
    dims: Dims::Rule(bn_training_dims),
    cost: Cost::Vector(1.0),
    window: Window::None,
};

// ---- shapes ----

/// Two operands of one type (`(dy, y)`, `(y, dy)`, `(dy, mask)`, `(dy, x)`), the result of
/// that type.
fn same_as_dy(cx: &Cx<'_>) -> Result<Type, InferError> {
    let t = cx.float_tensor(0)?;
    cx.same_type(0, 1)?;
    Ok(Type::Tensor(t.clone()))
}

fn softmax_grad(cx: &Cx<'_>) -> Result<Type, InferError> {
    let t = cx.float_tensor(0)?;
    cx.same_type(0, 1)?;
    softmax_axis(cx.node, t.rank())?;
    Ok(Type::Tensor(t.clone()))
}

fn gelu_grad(cx: &Cx<'_>) -> Result<Type, InferError> {
    let t = cx.float_tensor(0)?;
    cx.same_type(0, 1)?;
    cx.same_type(0, 2)?;
    Ok(Type::Tensor(t.clone()))
}

fn bias_add_grad(cx: &Cx<'_>) -> Result<Type, InferError> {
    let dy = cx.float_tensor(0)?;
    let c = channels(cx, 0)?;
    Ok(Type::Tensor(TensorType::new(dy.dtype, vec![c])))
}

fn conv2d_backprop_input(cx: &Cx<'_>) -> Result<Type, InferError> {
    let dy = cx.float_tensor(0)?;
    let w = cx.float_tensor(1)?;
    cx.same_dtype(0, 1)?;
    let size = cx.sizes(2)?;
    let g = conv2d_geometry(cx.node, &size, &w.shape)?;
    cx.expect_shape(
        0,
        &g.output_shape(),
        &format!(
            "a convolution of input_size {} with w of shape {}",
            sh(&size),
            sh(&w.shape)
        ),
    )?;
    Ok(Type::Tensor(TensorType::new(dy.dtype, size)))
}

fn conv2d_backprop_filter(cx: &Cx<'_>) -> Result<Type, InferError> {
    let dy = cx.float_tensor(0)?;
    let x = cx.float_tensor(1)?;
    cx.same_dtype(0, 1)?;
    let size = cx.sizes(2)?;
    let g = conv2d_geometry(cx.node, &x.shape, &size)?;
    cx.expect_shape(
        0,
        &g.output_shape(),
        &format!(
            "a convolution of x of shape {} with filter_size {}",
            sh(&x.shape),
            sh(&size)
        ),
    )?;
    Ok(Type::Tensor(TensorType::new(dy.dtype, size)))
}

fn pool_grad(cx: &Cx<'_>) -> Result<Type, InferError> {
    let x = cx.float_tensor(0)?;
    let g = pool2d_geometry(cx.node, &x.shape)?;
    let why = format!("pooling x of shape {}", sh(&x.shape));
    for i in [1, 2] {
        cx.same_dtype(0, i)?;
        cx.expect_shape(i, &g.output_shape(), &why)?;
    }
    Ok(Type::Tensor(x.clone()))
}

fn batch_norm_grad(cx: &Cx<'_>) -> Result<Type, InferError> {
    let x = cx.float_tensor(1)?;
    cx.same_type(1, 0)?;
    let c = channels(cx, 1)?;
    let why = format!("x of shape {} ({c} channels)", sh(&x.shape));
    for i in 2..5 {
        cx.same_dtype(1, i)?;
        cx.expect_shape(i, &[c], &why)?;
    }
    cx.attr_bool("is_training", true)?;
    cx.attr_float("epsilon", 1e-5)?;
    let stat = TensorType::new(x.dtype, vec![c]);
    Ok(Type::Tuple(vec![x.clone(), stat.clone(), stat]))
}

fn bn_training_update_grad(cx: &Cx<'_>) -> Result<Type, InferError> {
    let x = cx.float_tensor(1)?;
    cx.same_type(1, 0)?;
    let c = channels(cx, 1)?;
    let why = format!("x of shape {} ({c} channels)", sh(&x.shape));
    for i in 2..4 {
        cx.same_dtype(1, i)?;
        cx.expect_shape(i, &[c], &why)?;
    }
    let stat = TensorType::new(x.dtype, vec![c]);
    Ok(Type::Tuple(vec![stat.clone(), stat]))
}

fn bn_training_reduce_grad(cx: &Cx<'_>) -> Result<Type, InferError> {
    let x = cx.float_tensor(1)?;
    cx.same_type(1, 0)?;
    let c = channels(cx, 1)?;
    let why = format!("x of shape {} ({c} channels)", sh(&x.shape));
    for i in 2..7 {
        cx.same_dtype(1, i)?;
        cx.expect_shape(i, &[c], &why)?;
    }
    bn_count(cx)?;
    Ok(Type::Tensor(x.clone()))
}

fn layer_norm_grad(cx: &Cx<'_>) -> Result<Type, InferError> {
    let x = cx.float_tensor(0)?;
    cx.same_type(0, 1)?;
    let (bna, bpa, stats) = layer_norm_layout(cx, &x.shape)?;
    let why = format!("x of shape {} with begin_norm_axis {bna}", sh(&x.shape));
    for i in [2, 3] {
        cx.same_dtype(0, i)?;
        cx.expect_shape(i, &stats, &why)?;
    }
    cx.same_dtype(0, 4)?;
    let params = &x.shape[bpa..];
    cx.expect_shape(
        4,
        params,
        &format!("x of shape {} with begin_params_axis {bpa}", sh(&x.shape)),
    )?;
    let p = TensorType::new(x.dtype, params.to_vec());
    Ok(Type::Tuple(vec![x.clone(), p.clone(), p]))
}

fn strided_slice_grad(cx: &Cx<'_>) -> Result<Type, InferError> {
    let dy = cx.tensor(0)?;
    let shape = cx.sizes(1)?;
    let sliced = slice_shape(cx, &shape, 2)?;
    cx.expect_shape(
        0,
        &sliced,
        &format!("slicing a tensor of shape {}", sh(&shape)),
    )?;
    Ok(Type::Tensor(TensorType::new(dy.dtype, shape)))
}

fn unsorted_segment_sum(cx: &Cx<'_>) -> Result<Type, InferError> {
    let x = cx.float_tensor(0)?;
    let ids = cx.int_tensor(1)?;
    if ids.rank() > x.rank() || x.shape[..ids.rank()] != ids.shape[..] {
        return Err(cx.err(format!(
            "{} of shape {} is not a prefix of {} of shape {}",
            cx.name(1),
            sh(&ids.shape),
            cx.name(0),
            sh(&x.shape)
        )));
    }
    let num = cx.int(2)?;
    let num = usize::try_from(num)
        .map_err(|_| cx.err(format!("{} must be >= 0, got {num}", cx.name(2))))?;
    let mut shape = vec![num];
    shape.extend_from_slice(&x.shape[ids.rank()..]);
    Ok(Type::Tensor(TensorType::new(x.dtype, shape)))
}

// ---- gradients ----

fn dropout_grad_grad(r: &mut Rule<'_>) -> Grads {
    r.unary(|r, dy| {
        let attrs = r.copied_attrs();
        r.emit(DropoutGrad, vec![dy, r.x(1)], attrs, "")
    })
}

fn strided_slice_grad_grad(r: &mut Rule<'_>) -> Grads {
    r.unary(|r, dy| {
        let mut inputs = vec![dy];
        inputs.extend(r.node.inputs[2..5].iter().cloned());
        let attrs = r.copied_attrs();
        r.emit(StridedSlice, inputs, attrs, "")
    })
}

fn unsorted_segment_sum_grad(r: &mut Rule<'_>) -> Grads {
    r.unary(|r, dy| {
        r.emit(
            Gather,
            vec![dy, r.x(1), Operand::Const(Const::Int(0))],
            Attrs::new(),
            "",
        )
    })
}

// ---- loops ----

fn bias_add_grad_dims(c: &DimsCx<'_>) -> Result<OpDims, DimsError> {
    let x = c.in_shape(0)?;
    let mut d = OpDims::with_loops(x.clone());
    d.inputs = vec![Some(OpDims::identity(x.len()))];
    d.outputs = vec![vec![Dim::Loop(1)]];
    for l in 0..x.len() {
        if l != 1 {
            d.combine[l] = Some(ReduceOp::Sum);
        }
    }
    Ok(d)
}

fn unsorted_segment_sum_dims(c: &DimsCx<'_>) -> Result<OpDims, DimsError> {
    let out0 = &c.out0;
    // loops: the segments first (so that a segment split takes the outer device axes,
    // as the table's rows do in the Gather whose gradient this is), then x's dims.
    let x = c.in_shape(0)?;
    let ids = c.in_shape(1)?;
    let mut sizes = vec![out0[0]];
    sizes.extend(&x);
    let mut d = OpDims::with_loops(sizes);
    let x_dims = |n: usize| -> Vec<Dim> { (1..=n).map(Dim::Loop).collect() };
    d.inputs = vec![Some(x_dims(x.len())), Some(x_dims(ids.len())), None];
    let mut out = vec![Dim::Loop(0)];
    out.extend((ids.len()..x.len()).map(|k| Dim::Loop(k + 1)));
    d.outputs = vec![out];
    for l in 1..=ids.len() {
        d.combine[l] = Some(ReduceOp::Sum);
    }
    // A split segment dimension (through the out strategy): each part sums the rows
    // whose ids fall in its segments (the partition marks the local op with them).
    Ok(d)
}
