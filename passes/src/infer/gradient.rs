//! Shape rules of the gradient kernels that autodiff emits.

use super::context::Cx;
use super::error::InferError;
use super::movement::slice_shape;
use super::reduction::{bn_count, channels, layer_norm_layout};
use super::shapes::softmax_axis;
use super::text::sh;
use shardc_ir::geometry::{conv2d_geometry, pool2d_geometry};
use shardc_ir::{OpKind, TensorType, Type};

pub(super) fn infer(cx: &Cx<'_>) -> Result<Type, InferError> {
    use OpKind::*;
    match cx.op() {
        // (dy, y), (y, dy), (dy, mask): two operands of one type.
        ReluGrad | SigmoidGrad | TanhGrad | SqrtGrad | DropoutGrad => {
            let t = cx.float_tensor(0)?;
            cx.same_type(0, 1)?;
            Ok(Type::Tensor(t.clone()))
        }
        SoftmaxGrad | LogSoftmaxGrad => {
            let t = cx.float_tensor(0)?;
            cx.same_type(0, 1)?;
            softmax_axis(cx.node, t.rank())?;
            Ok(Type::Tensor(t.clone()))
        }
        GeLUGrad => {
            let t = cx.float_tensor(0)?;
            cx.same_type(0, 1)?;
            cx.same_type(0, 2)?;
            Ok(Type::Tensor(t.clone()))
        }
        BiasAddGrad => {
            let dy = cx.float_tensor(0)?;
            let c = channels(cx, 0)?;
            Ok(Type::Tensor(TensorType::new(dy.dtype, vec![c])))
        }
        Conv2DBackpropInput => {
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
        Conv2DBackpropFilter => {
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
        MaxPoolGrad | AvgPoolGrad => {
            let x = cx.float_tensor(0)?;
            let g = pool2d_geometry(cx.node, &x.shape)?;
            let why = format!("pooling x of shape {}", sh(&x.shape));
            for i in [1, 2] {
                cx.same_dtype(0, i)?;
                cx.expect_shape(i, &g.output_shape(), &why)?;
            }
            Ok(Type::Tensor(x.clone()))
        }
        BatchNormGrad => {
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
        BNTrainingUpdateGrad => {
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
        BNTrainingReduceGrad => {
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
        LayerNormGrad => {
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
        StridedSliceGrad => {
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
        UnsortedSegmentSum => {
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
        _ => Err(cx.misrouted()),
    }
}
