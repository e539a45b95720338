//! The reductions' and normalisations' rules: `ReduceSum` / `ReduceMean` / `ReduceMax`,
//! `Softmax` / `LogSoftmax`, `BatchNorm`, `LayerNorm`, `MaxPool` / `AvgPool` (their windows:
//! `shardc_ir::geometry::pool2d_geometry`, which the shape rules and every backend's kernels
//! call), and the synchronised BatchNorm's forward halves `BNTrainingReduce` /
//! `BNTrainingUpdate`.

use super::elementwise::{TRANSCENDENTAL, X};
use super::rule::{Cost, Dims, Gradient, OpRule, Operands, Window};
use crate::autodiff::emitter::{dtype_attr, ints};
use crate::autodiff::error::AutodiffError;
use crate::autodiff::rules::{float, Grads, Rule};
use crate::infer::context::Cx;
use crate::infer::error::InferError;
use crate::infer::shapes::{normalize_axis, reduce_axes, softmax_axis};
use crate::infer::signatures::{OperandSpec::*, Signature};
use crate::infer::text::sh;
use crate::parallel::dims::{Dim, DimsCx, DimsError, OpDims};
use shardc_ir::geometry::pool2d_geometry;
use shardc_ir::OpKind::{self, *};
use shardc_ir::{Attr, Attrs, Const, Operand, ReduceOp, TensorType, Type};

/// `(x, axes)`, `axes` optional (all axes).
const REDUCE: Signature = Signature {
    operands: &[("x", Tensor), ("axes", Ints)],
    required: 1,
    variadic: false,
};

/// A softmax's several passes over the row, per element, relative to an add.
pub(super) const SOFTMAX_WEIGHT: f64 = 40.0;

const SYNC_BN_NO_GRADIENT: &str =
    "the synchronised BatchNorm ops appear only after autodiff (differentiate BatchNorm instead)";

/// `ReduceSum(x, axes)`.
pub(super) static REDUCE_SUM: OpRule = OpRule {
    op: ReduceSum,
    signature: REDUCE,
    infer: reduce,
    gradient: Gradient::Rule(|r| r.reduce_sum_mean()),
    differentiable: Operands::All,
    dims: Dims::Rule(reduce_dims),
    cost: Cost::Vector(1.0),
    window: Window::None,
};

/// `ReduceMean(x, axes)`.
pub(super) static REDUCE_MEAN: OpRule = OpRule {
    op: ReduceMean,
    signature: REDUCE,
    infer: reduce,
    gradient: Gradient::Rule(|r| r.reduce_sum_mean()),
    differentiable: Operands::All,
    dims: Dims::Rule(reduce_dims),
    cost: Cost::Vector(1.0),
    window: Window::None,
};

/// `ReduceMax(x, axes)`.
pub(super) static REDUCE_MAX: OpRule = OpRule {
    op: ReduceMax,
    signature: REDUCE,
    infer: reduce,
    gradient: Gradient::Rule(|r| r.reduce_max()),
    differentiable: Operands::All,
    dims: Dims::Rule(reduce_dims),
    cost: Cost::Vector(1.0),
    window: Window::None,
};

/// `Softmax(x)` along `axis`.
pub(super) static SOFTMAX: OpRule = OpRule {
    op: Softmax,
    signature: X,
    infer: softmax,
    gradient: Gradient::Rule(softmax_grad),
    differentiable: Operands::All,
    dims: Dims::Rule(softmax_dims),
    cost: Cost::Vector(SOFTMAX_WEIGHT),
    window: Window::None,
};

/// `LogSoftmax(x)` along `axis`.
pub(super) static LOG_SOFTMAX: OpRule = OpRule {
    op: LogSoftmax,
    signature: X,
    infer: softmax,
    gradient: Gradient::Rule(log_softmax_grad),
    differentiable: Operands::All,
    dims: Dims::Rule(softmax_dims),
    cost: Cost::Vector(SOFTMAX_WEIGHT),
    window: Window::None,
};

/// `BatchNorm(x, scale, bias, mean, variance)`.
pub(super) static BATCH_NORM: OpRule = OpRule {
    op: BatchNorm,
    signature: Signature::fixed(&[
        ("x", Tensor),
        ("scale", Tensor),
        ("bias", Tensor),
        ("mean", Tensor),
        ("variance", Tensor),
    ]),
    infer: batch_norm,
    gradient: Gradient::Rule(|r| r.batch_norm()),
    differentiable: Operands::Some(batch_norm_differentiable),
    dims: Dims::Rule(batch_norm_dims),
    cost: Cost::Vector(TRANSCENDENTAL),
    window: Window::None,
};

/// `LayerNorm(x, gamma, beta)`.
pub(super) static LAYER_NORM: OpRule = OpRule {
    op: LayerNorm,
    signature: Signature::fixed(&[("x", Tensor), ("gamma", Tensor), ("beta", Tensor)]),
    infer: layer_norm,
    gradient: Gradient::Rule(|r| r.layer_norm()),
    differentiable: Operands::All,
    dims: Dims::Rule(layer_norm_dims),
    cost: Cost::Vector(TRANSCENDENTAL),
    window: Window::None,
};

/// `MaxPool(x)`.
pub(super) static MAX_POOL: OpRule = OpRule {
    op: MaxPool,
    signature: X,
    infer: pool,
    gradient: Gradient::Rule(pool_grad),
    differentiable: Operands::All,
    dims: Dims::Rule(pool_dims),
    cost: Cost::Vector(1.0),
    window: Window::Pool2d,
};

/// `AvgPool(x)`.
pub(super) static AVG_POOL: OpRule = OpRule {
    op: AvgPool,
    signature: X,
    infer: pool,
    gradient: Gradient::Rule(pool_grad),
    differentiable: Operands::All,
    dims: Dims::Rule(pool_dims),
    cost: Cost::Vector(1.0),
    window: Window::Pool2d,
};

/// `BNTrainingReduce(x)` -> per-channel `(sum, square_sum)`.
pub(super) static BN_TRAINING_REDUCE: OpRule = OpRule {
    op: BNTrainingReduce,
    signature: X,
    infer: bn_training_reduce,
    gradient: Gradient::None(SYNC_BN_NO_GRADIENT),
    differentiable: Operands::All,
    dims: Dims::Rule(bn_training_dims),
    cost: Cost::Vector(1.0),
    window: Window::None,
};

/// `BNTrainingUpdate(x, sum, square_sum, scale, bias)`.
pub(super) static BN_TRAINING_UPDATE: OpRule = OpRule {
    op: BNTrainingUpdate,
    signature: Signature::fixed(&[
        ("x", Tensor),
        ("sum", Tensor),
        ("square_sum", Tensor),
        ("scale", Tensor),
        ("bias", Tensor),
    ]),
    infer: bn_training_update,
    gradient: Gradient::None(SYNC_BN_NO_GRADIENT),
    differentiable: Operands::All,
    dims: Dims::Rule(bn_training_dims),
    cost: Cost::Vector(1.0),
    window: Window::None,
};

// ---- shapes ----

fn softmax(cx: &Cx<'_>) -> Result<Type, InferError> {
    let x = cx.float_tensor(0)?;
    softmax_axis(cx.node, x.rank())?;
    Ok(Type::Tensor(x.clone()))
}

fn bn_training_reduce(cx: &Cx<'_>) -> Result<Type, InferError> {
    let x = cx.float_tensor(0)?;
    let c = channels(cx, 0)?;
    let stat = TensorType::new(x.dtype, vec![c]);
    Ok(Type::Tuple(vec![stat.clone(), stat]))
}

fn bn_training_update(cx: &Cx<'_>) -> Result<Type, InferError> {
    let x = cx.float_tensor(0)?;
    let c = channels(cx, 0)?;
    let why = format!("x of shape {} ({c} channels)", sh(&x.shape));
    for i in 1..5 {
        cx.same_dtype(0, i)?;
        cx.expect_shape(i, &[c], &why)?;
    }
    let eps = cx.attr_float("epsilon", 1e-5)?;
    if eps.is_nan() || eps < 0.0 {
        return Err(cx.err(format!("attribute `epsilon` must be >= 0, got {eps}")));
    }
    bn_count(cx)?;
    let stat = TensorType::new(x.dtype, vec![c]);
    Ok(Type::Tuple(vec![
        x.clone(),
        stat.clone(),
        stat.clone(),
        stat.clone(),
        stat,
    ]))
}

/// `MaxPool` / `AvgPool`: the result of the pooling windows.
fn pool(cx: &Cx<'_>) -> Result<Type, InferError> {
    let x = cx.float_tensor(0)?;
    let g = pool2d_geometry(cx.node, &x.shape)?;
    Ok(Type::Tensor(TensorType::new(x.dtype, g.output_shape())))
}

fn reduce(cx: &Cx<'_>) -> Result<Type, InferError> {
    let x = cx.float_tensor(0)?;
    let axes = reduce_axes(cx.node, x.rank())?;
    let keep = cx.attr_bool("keep_dims", false)?;
    let shape = x
        .shape
        .iter()
        .enumerate()
        .filter_map(|(i, &d)| match (axes.contains(&i), keep) {
            (false, _) => Some(d),
            (true, true) => Some(1),
            (true, false) => None,
        })
        .collect::<Vec<_>>();
    Ok(Type::Tensor(TensorType::new(x.dtype, shape)))
}

/// The channel count of a BatchNorm-like input `(N, C, ...)` (operand `i`).
pub(crate) fn channels(cx: &Cx<'_>, i: usize) -> Result<usize, InferError> {
    let x = cx.expect_min_rank(i, 2, "(N, C, ...)")?;
    Ok(x.shape[1])
}

/// The `count` attribute of the synchronised BatchNorm ops: required, at least 1.
pub(crate) fn bn_count(cx: &Cx<'_>) -> Result<usize, InferError> {
    let n = cx.attr_int_req("count")?;
    if n < 1 {
        return Err(cx.err(format!(
            "attribute `count` must be >= 1 (the global number of elements per channel), got {n}"
        )));
    }
    Ok(n as usize)
}

fn batch_norm(cx: &Cx<'_>) -> Result<Type, InferError> {
    let x = cx.float_tensor(0)?;
    let c = channels(cx, 0)?;
    let why = format!("x of shape {} ({c} channels)", sh(&x.shape));
    for i in 1..5 {
        cx.same_dtype(0, i)?;
        cx.expect_shape(i, &[c], &why)?;
    }
    cx.attr_bool("is_training", true)?;
    let eps = cx.attr_float("epsilon", 1e-5)?;
    if eps.is_nan() || eps < 0.0 {
        return Err(cx.err(format!("attribute `epsilon` must be >= 0, got {eps}")));
    }
    cx.attr_float("momentum", 0.1)?;
    let stat = TensorType::new(x.dtype, vec![c]);
    Ok(Type::Tuple(vec![
        x.clone(),
        stat.clone(),
        stat.clone(),
        stat.clone(),
        stat,
    ]))
}

/// The layout of a LayerNorm-like node for input shape `x`:
/// `(begin_norm_axis, begin_params_axis, shape of mean / rstd)`.
pub(crate) fn layer_norm_layout(
    cx: &Cx<'_>,
    x: &[usize],
) -> Result<(usize, usize, Vec<usize>), InferError> {
    let rank = x.len();
    if rank == 0 {
        return Err(cx.err("x must have rank >= 1, got a scalar"));
    }
    let axis = |key: &str| -> Result<usize, InferError> {
        let a = cx.attr_int(key, -1)?;
        normalize_axis(a, rank).ok_or_else(|| {
            cx.err(format!(
                "attribute `{key}` {a} is out of range for x of shape {}",
                sh(x)
            ))
        })
    };
    let bna = axis("begin_norm_axis")?;
    let bpa = axis("begin_params_axis")?;
    let eps = cx.attr_float("epsilon", 1e-7)?;
    if eps.is_nan() || eps < 0.0 {
        return Err(cx.err(format!("attribute `epsilon` must be >= 0, got {eps}")));
    }
    let mut stats = x.to_vec();
    for d in &mut stats[bna..] {
        *d = 1;
    }
    Ok((bna, bpa, stats))
}

fn layer_norm(cx: &Cx<'_>) -> Result<Type, InferError> {
    let x = cx.float_tensor(0)?;
    let (_, bpa, stats) = layer_norm_layout(cx, &x.shape)?;
    let why = format!("x of shape {} with begin_params_axis {bpa}", sh(&x.shape));
    for i in 1..3 {
        cx.same_dtype(0, i)?;
        cx.expect_shape(i, &x.shape[bpa..], &why)?;
    }
    let stat = TensorType::new(x.dtype, stats);
    Ok(Type::Tuple(vec![x.clone(), stat.clone(), stat]))
}

// ---- gradients ----

/// Training-mode BatchNorm normalises with the batch statistics: y does not depend on the
/// moving mean and variance (operands 3 and 4).
fn batch_norm_differentiable(node: &shardc_ir::Node, pos: usize) -> bool {
    pos < 3 || !node.attrs.bool_or("is_training", true)
}

fn softmax_grad(r: &mut Rule<'_>) -> Grads {
    r.unary(|r, dy| {
        let attrs = r.axis_attr();
        r.emit(SoftmaxGrad, vec![r.y(), dy], attrs, "")
    })
}

fn log_softmax_grad(r: &mut Rule<'_>) -> Grads {
    r.unary(|r, dy| {
        let attrs = r.axis_attr();
        r.emit(LogSoftmaxGrad, vec![r.y(), dy], attrs, "")
    })
}

fn pool_grad(r: &mut Rule<'_>) -> Grads {
    let op = if r.node.op == MaxPool {
        MaxPoolGrad
    } else {
        AvgPoolGrad
    };
    r.unary(|r, dy| {
        let attrs = r.copied_attrs();
        r.emit(op, vec![r.x(0), r.y(), dy], attrs, "")
    })
}

impl Rule<'_> {
    /// `x.shape` with the reduced axes set to 1, and the reduced axes.
    fn kept_shape(&self) -> Result<(Vec<usize>, Vec<usize>), AutodiffError> {
        let xs = self.ty(0)?.shape;
        let axes = reduce_axes(&self.node, xs.len()).map_err(|e| self.em.bad_node(e.reason))?;
        let mut kept = xs.clone();
        for &a in &axes {
            kept[a] = 1;
        }
        Ok((kept, axes))
    }

    fn reduce_sum_mean(&mut self) -> Grads {
        let xs = self.ty(0)?.shape;
        let (kept, axes) = self.kept_shape()?;
        let mean = self.node.op == OpKind::ReduceMean;
        self.unary(|r, dy| {
            let mut g = dy;
            if mean {
                let count: usize = axes.iter().map(|&a| xs[a]).product();
                if count > 0 {
                    g = r.emit(
                        OpKind::Mul,
                        vec![g, float(1.0 / count as f64)],
                        Attrs::new(),
                        "_scale",
                    )?;
                }
            }
            if r.em.operand_type(&g)?.shape != kept {
                g = r.em.reshape(g, &kept, "_reshape")?;
            }
            if kept != xs {
                g = r.emit(OpKind::BroadcastTo, vec![g, ints(&xs)], Attrs::new(), "")?;
            }
            Ok(g)
        })
    }

    /// The gradient goes to the maxima, split evenly among ties.
    fn reduce_max(&mut self) -> Grads {
        let (kept, axes) = self.kept_shape()?;
        let dtype = self.ty(0)?.dtype;
        self.unary(|r, dy| {
            let mut y = r.y();
            let mut dy = dy;
            if r.em.operand_type(&y)?.shape != kept {
                y = r.em.reshape(y, &kept, "_max")?;
                dy = r.em.reshape(dy, &kept, "_reshape")?;
            }
            let eq = r.emit(Equal, vec![r.x(0), y], Attrs::new(), "_equal")?;
            let mask = r.emit(
                Cast,
                vec![eq],
                Attrs::new().with("dst_type", dtype_attr(dtype)),
                "_mask",
            )?;
            let axes: Vec<i64> = axes.iter().map(|&a| a as i64).collect();
            let count = r.emit(
                ReduceSum,
                vec![mask.clone(), Operand::Const(Const::Ints(axes))],
                Attrs::new().with("keep_dims", Attr::Bool(true)),
                "_count",
            )?;
            let share = r.emit(RealDiv, vec![mask, count], Attrs::new(), "_share")?;
            r.emit(Mul, vec![share, dy], Attrs::new(), "")
        })
    }

    fn batch_norm(&mut self) -> Grads {
        self.only_outputs(&[0], "the batch statistics (results 1 to 4)")?;
        let training = self.node.attrs.bool_or("is_training", true);
        let dy = self.dy()?;
        let mean = self.item(3)?;
        let rstd = self.item(4)?;
        let g = self.emit_node_grad(
            BatchNormGrad,
            vec![dy, self.x(0), self.x(1), mean, rstd.clone()],
        )?;
        let mut out = vec![None; 5];
        for (i, name) in [(0, "_x"), (1, "_scale"), (2, "_bias")] {
            if self.need(i) {
                out[i] = Some(self.em.item(g, i, name)?);
            }
        }
        if !training && (self.need(3) || self.need(4)) {
            // y = (x - mean) * scale * rstd + bias with rstd = (variance + eps)^(-1/2):
            // dmean = -scale * rstd * dbias, dvariance = -scale * rstd^2 * dscale / 2.
            let scale_rstd = self.emit(Mul, vec![self.x(1), rstd.clone()], Attrs::new(), "_k")?;
            if self.need(3) {
                let db = self.em.item(g, 2, "_bias")?;
                let m = self.emit(Mul, vec![scale_rstd.clone(), db], Attrs::new(), "_mean_mul")?;
                out[3] = Some(self.emit(Neg, vec![m], Attrs::new(), "_mean")?);
            }
            if self.need(4) {
                let ds = self.em.item(g, 1, "_scale")?;
                let k = self.emit(Mul, vec![scale_rstd, rstd], Attrs::new(), "_k2")?;
                let m = self.emit(Mul, vec![k, ds], Attrs::new(), "_variance_mul")?;
                out[4] = Some(self.emit(Mul, vec![m, float(-0.5)], Attrs::new(), "_variance")?);
            }
        }
        Ok(out)
    }

    fn layer_norm(&mut self) -> Grads {
        self.only_outputs(&[0], "the statistics (results 1 and 2)")?;
        let dy = self.dy()?;
        let mean = self.item(1)?;
        let rstd = self.item(2)?;
        let g = self.emit_node_grad(
            OpKind::LayerNormGrad,
            vec![self.x(0), dy, rstd, mean, self.x(1)],
        )?;
        let mut out = vec![None; 3];
        for (i, name) in [(0, "_x"), (1, "_gamma"), (2, "_beta")] {
            if self.need(i) {
                out[i] = Some(self.em.item(g, i, name)?);
            }
        }
        Ok(out)
    }
}

// ---- loops ----

fn reduce_dims(c: &DimsCx<'_>) -> Result<OpDims, DimsError> {
    let node = c.node;
    let x = c.in_shape(0)?;
    let axes = reduce_axes(node, x.len()).map_err(|e| DimsError(e.to_string()))?;
    let keep = node.attrs.bool_or("keep_dims", false);
    let mut d = OpDims::with_loops(x.clone());
    d.inputs = vec![Some(OpDims::identity(x.len()))];
    d.inputs.extend((1..c.ins.len()).map(|_| None));
    let mut out = Vec::new();
    for l in 0..x.len() {
        if axes.contains(&l) {
            d.combine[l] = Some(if node.op == ReduceMax {
                ReduceOp::Max
            } else {
                ReduceOp::Sum
            });
            if node.op == ReduceMean {
                d.mean_loops.push(l);
            }
            if keep {
                out.push(Dim::Whole);
            }
        } else {
            out.push(Dim::Loop(l));
        }
    }
    d.outputs = vec![out];
    Ok(d)
}

/// The loops of a softmax and of its gradient kernel: the softmax axis stays whole.
pub(super) fn softmax_dims(c: &DimsCx<'_>) -> Result<OpDims, DimsError> {
    let node = c.node;
    let x = c.in_shape(0)?;
    let axis = softmax_axis(node, x.len()).map_err(|e| DimsError(e.to_string()))?;
    let mut d = OpDims::with_loops(x.clone());
    c.consts_as_none(&mut d);
    d.outputs = vec![OpDims::identity(x.len())];
    d.fix(
        axis,
        format!(
            "dimension {axis} is the {} axis, which it needs whole",
            node.op.name()
        ),
    );
    Ok(d)
}

/// The loops of BatchNorm and of BatchNormGrad: the channel loop is split freely.
pub(super) fn batch_norm_dims(c: &DimsCx<'_>) -> Result<OpDims, DimsError> {
    let (node, ins, outs) = (c.node, &c.ins, &c.outs);
    // x (N, C, ...) ; per-channel vectors (C).
    let x = c.in_shape(if node.op == BatchNorm { 0 } else { 1 })?;
    let mut d = OpDims::with_loops(x.clone());
    let chan = vec![Dim::Loop(1)];
    d.inputs = ins
        .iter()
        .map(|s| {
            s.as_ref().map(|s| {
                if s.len() == 1 {
                    chan.clone()
                } else {
                    OpDims::identity(x.len())
                }
            })
        })
        .collect();
    d.outputs = outs
        .iter()
        .map(|o| {
            if o.len() == 1 {
                chan.clone()
            } else {
                OpDims::identity(x.len())
            }
        })
        .collect();
    let training = node.attrs.bool_or("is_training", true);
    for l in (0..x.len()).filter(|&l| l != 1) {
        if training {
            d.fix(
                l,
                format!(
                    "dimension {l} feeds the batch statistics, which would need a \
                     reduction across devices (split the channel dimension instead)"
                ),
            );
        } else if node.op == BatchNorm {
            // Inference normalizes with the moving statistics: elementwise given the
            // per-channel vectors, and the statistics it returns are those vectors.
            d.uniform[l] = true;
        } else {
            // dscale and dbias are sums over the batch and spatial positions.
            d.combine[l] = Some(ReduceOp::Sum);
        }
    }
    Ok(d)
}

/// The loops of the synchronised BatchNorm ops (and their gradients).
pub(super) fn bn_training_dims(c: &DimsCx<'_>) -> Result<OpDims, DimsError> {
    let (node, ins, outs) = (c.node, &c.ins, &c.outs);
    // x (N, C, ...); per-channel vectors (C) carry the channel loop only.
    let x = c.in_shape(match node.op {
        BNTrainingReduce | BNTrainingUpdate => 0,
        _ => 1,
    })?;
    let mut d = OpDims::with_loops(x.clone());
    let chan = vec![Dim::Loop(1)];
    let classify = |s: &Vec<usize>| -> Vec<Dim> {
        if s.len() == 1 {
            chan.clone()
        } else {
            OpDims::identity(x.len())
        }
    };
    d.inputs = ins.iter().map(|s| s.as_ref().map(classify)).collect();
    d.outputs = outs.iter().map(classify).collect();
    for l in (0..x.len()).filter(|&l| l != 1) {
        match node.op {
            // Per-channel sums: a split batch or spatial loop gives partial sums, which
            // an AllReduce completes.
            BNTrainingReduce | BNTrainingUpdateGrad => d.combine[l] = Some(ReduceOp::Sum),
            // Elementwise given the (complete) per-channel vectors; the statistics
            // they return are the same on every part of the split.
            _ => d.uniform[l] = true,
        }
    }
    Ok(d)
}

/// The loops of LayerNorm and of LayerNormGrad: the normalised axes stay whole.
pub(super) fn layer_norm_dims(c: &DimsCx<'_>) -> Result<OpDims, DimsError> {
    let (node, ins, outs) = (c.node, &c.ins, &c.outs);
    let x = c.in_shape(0)?;
    let r = x.len();
    let bna = normalize_axis(node.attrs.int_or("begin_norm_axis", -1), r)
        .ok_or_else(|| DimsError("begin_norm_axis out of range".into()))?;
    let bpa = normalize_axis(node.attrs.int_or("begin_params_axis", -1), r)
        .ok_or_else(|| DimsError("begin_params_axis out of range".into()))?;
    let mut d = OpDims::with_loops(x.clone());
    let params: Vec<Dim> = (bpa..r).map(Dim::Loop).collect();
    let stats: Vec<Dim> = (0..r)
        .map(|l| if l >= bna { Dim::Whole } else { Dim::Loop(l) })
        .collect();
    let classify = |s: &Vec<usize>| -> Vec<Dim> {
        if s.len() == r && s[bna..].iter().all(|&n| n == 1) && x[bna..] != s[bna..] {
            stats.clone()
        } else if s.len() == r {
            OpDims::identity(r)
        } else {
            params.clone()
        }
    };
    d.inputs = ins.iter().map(|s| s.as_ref().map(classify)).collect();
    d.outputs = outs.iter().map(classify).collect();
    for l in bna..r {
        d.fix(
            l,
            format!("dimension {l} is normalised (begin_norm_axis {bna}), which needs it whole"),
        );
    }
    for l in 0..bpa {
        d.combine[l] = Some(ReduceOp::Sum);
    }
    Ok(d)
}

/// The loops of the poolings and of their gradients: `n, c, oh, ow`, x read through windows.
pub(super) fn pool_dims(c: &DimsCx<'_>) -> Result<OpDims, DimsError> {
    let (node, out0) = (c.node, &c.out0);
    // loops: n = 0, c = 1, and the pooled result's spatial oh = 2, ow = 3 (as a
    // convolution's: x is read through windows that reach across a split of them, so
    // it is whole along them; the gradients' dx is the blocks' partial sums).
    let x = c.in_shape(0)?;
    let y = if matches!(node.op, MaxPool | AvgPool) {
        out0.clone()
    } else {
        c.in_shape(1)?
    };
    if x.len() != 4 || y.len() != 4 {
        return Err(DimsError(format!(
            "pooling is over NCHW tensors, got x of rank {} and a result of rank {}",
            x.len(),
            y.len()
        )));
    }
    let mut d = OpDims::with_loops(vec![x[0], x[1], y[2], y[3]]);
    let window = vec![Dim::Loop(0), Dim::Loop(1), Dim::Window(2), Dim::Window(3)];
    let pooled = OpDims::identity(4);
    if matches!(node.op, MaxPool | AvgPool) {
        d.inputs = vec![Some(window)];
        d.outputs = vec![pooled];
    } else {
        d.inputs = vec![Some(window), Some(pooled.clone()), Some(pooled)];
        d.outputs = vec![vec![Dim::Loop(0), Dim::Loop(1), Dim::Whole, Dim::Whole]];
        d.combine[2] = Some(ReduceOp::Sum);
        d.combine[3] = Some(ReduceOp::Sum);
    }
    Ok(d)
}
