//! The contractions' rules: `MatMul`, `BatchMatMul`, `Conv2D` (shape, gradient, loops,
//! cost; Conv2D's window is `shardc_ir::geometry::conv2d_geometry`, which its shape rule and
//! every backend's kernel call).

use super::rule::{Cost, Dims, Gradient, OpRule, Operands, Window};
use crate::autodiff::emitter::ints;
use crate::autodiff::rules::{Grads, Rule};
use crate::infer::context::Cx;
use crate::infer::error::InferError;
use crate::infer::shapes::broadcast_shapes;
use crate::infer::signatures::{OperandSpec::*, Signature};
use crate::infer::text::sh;
use crate::parallel::dims::{broadcast_dims, Dim, DimsCx, DimsError, OpDims};
use shardc_ir::geometry::conv2d_geometry;
use shardc_ir::OpKind::{self, *};
use shardc_ir::{Attr, Attrs, Graph, Node, Operand, ReduceOp, TensorType, Type};

/// `(a, b)`.
const AB: Signature = Signature::fixed(&[("a", Tensor), ("b", Tensor)]);

/// `MatMul`: `(m, k) x (k, n)`, loops `i, k, j` (k summed).
pub(super) static MAT_MUL: OpRule = OpRule {
    op: MatMul,
    signature: AB,
    infer: |cx| matmul(cx, false),
    gradient: Gradient::Rule(|r| r.matmul()),
    differentiable: Operands::All,
    dims: Dims::Rule(matmul_dims),
    cost: Cost::Gemm(|_, _| 2.0),
    window: Window::None,
};

/// `BatchMatMul`: MatMul over broadcast leading dims.
pub(super) static BATCH_MAT_MUL: OpRule = OpRule {
    op: BatchMatMul,
    signature: AB,
    infer: |cx| matmul(cx, true),
    gradient: Gradient::Rule(|r| r.matmul()),
    differentiable: Operands::All,
    dims: Dims::Rule(batch_matmul_dims),
    cost: Cost::Gemm(|_, _| 2.0),
    window: Window::None,
};

/// `Conv2D(x, w)`: loops `n, o, c, oh, ow` (c summed), x read through windows.
pub(super) static CONV2D: OpRule = OpRule {
    op: Conv2D,
    signature: Signature::fixed(&[("x", Tensor), ("w", Tensor)]),
    infer: conv2d,
    gradient: Gradient::Rule(conv2d_grad),
    differentiable: Operands::All,
    dims: Dims::Rule(conv_dims),
    cost: Cost::Gemm(conv_flops),
    window: Window::Conv2d,
};

/// A transpose flag: `transpose_a` (MindSpore's newer name) or `transpose_x1` (the older one;
/// dumps print both). When both are present they must agree.
pub(crate) fn transpose_flag(cx: &Cx<'_>, new: &str, old: &str) -> Result<bool, InferError> {
    let a = cx
        .node
        .attrs
        .get(new)
        .map(|_| cx.attr_bool(new, false))
        .transpose()?;
    let b = cx
        .node
        .attrs
        .get(old)
        .map(|_| cx.attr_bool(old, false))
        .transpose()?;
    match (a, b) {
        (Some(x), Some(y)) if x != y => Err(cx.err(format!(
            "attributes `{new}` ({x}) and `{old}` ({y}) disagree"
        ))),
        (Some(x), _) | (None, Some(x)) => Ok(x),
        (None, None) => Ok(false),
    }
}

fn matmul(cx: &Cx<'_>, batched: bool) -> Result<Type, InferError> {
    let a = cx.float_tensor(0)?;
    let b = cx.float_tensor(1)?;
    cx.same_dtype(0, 1)?;
    let ta = transpose_flag(cx, "transpose_a", "transpose_x1")?;
    let tb = transpose_flag(cx, "transpose_b", "transpose_x2")?;
    if batched {
        cx.expect_min_rank(0, 2, "(..., m, k)")?;
        cx.expect_min_rank(1, 2, "(..., k, n)")?;
    } else {
        cx.expect_rank(0, 2, "(m, k)")?;
        cx.expect_rank(1, 2, "(k, n)")?;
    }
    let (ra, rb) = (a.rank(), b.rank());
    let (m, k) = if ta {
        (a.shape[ra - 1], a.shape[ra - 2])
    } else {
        (a.shape[ra - 2], a.shape[ra - 1])
    };
    let (k2, n) = if tb {
        (b.shape[rb - 1], b.shape[rb - 2])
    } else {
        (b.shape[rb - 2], b.shape[rb - 1])
    };
    if k != k2 {
        return Err(cx.err(format!(
            "contracted dimensions differ: {} has shape {} with transpose_a {ta} (k = {k}) but {} has shape {} with transpose_b {tb} (k = {k2})",
            cx.name(0),
            sh(&a.shape),
            cx.name(1),
            sh(&b.shape)
        )));
    }
    let mut shape = if batched {
        broadcast_shapes(&a.shape[..ra - 2], &b.shape[..rb - 2]).ok_or_else(|| {
            cx.err(format!(
                "batch dimensions do not broadcast: {} has shape {} and {} has shape {}",
                cx.name(0),
                sh(&a.shape),
                cx.name(1),
                sh(&b.shape)
            ))
        })?
    } else {
        Vec::new()
    };
    shape.extend([m, n]);
    Ok(Type::Tensor(TensorType::new(a.dtype, shape)))
}

fn conv2d(cx: &Cx<'_>) -> Result<Type, InferError> {
    let x = cx.float_tensor(0)?;
    let w = cx.float_tensor(1)?;
    cx.same_dtype(0, 1)?;
    let g = conv2d_geometry(cx.node, &x.shape, &w.shape)?;
    Ok(Type::Tensor(TensorType::new(x.dtype, g.output_shape())))
}

// ---- gradients ----

fn conv2d_grad(r: &mut Rule<'_>) -> Grads {
    let attrs = r.copied_attrs();
    let (x, w) = (r.x(0), r.x(1));
    let (xs, ws) = (r.ty(0)?.shape, r.ty(1)?.shape);
    let dy = r.dy()?;
    let dx = r.when(0, |r| {
        r.emit(
            Conv2DBackpropInput,
            vec![dy.clone(), w, ints(&xs)],
            attrs.clone(),
            "_x",
        )
    })?;
    let dw = r.when(1, |r| {
        r.emit(
            Conv2DBackpropFilter,
            vec![dy.clone(), x, ints(&ws)],
            attrs.clone(),
            "_w",
        )
    })?;
    Ok(vec![dx, dw])
}

impl Rule<'_> {
    fn matmul(&mut self) -> Grads {
        let batched = self.node.op == OpKind::BatchMatMul;
        let flag = |n: &Node, new: &str, old: &str| {
            n.attrs
                .get(new)
                .or_else(|| n.attrs.get(old))
                .and_then(Attr::as_bool)
                .unwrap_or(false)
        };
        let ta = flag(&self.node, "transpose_a", "transpose_x1");
        let tb = flag(&self.node, "transpose_b", "transpose_x2");
        let (a, b) = (self.x(0), self.x(1));
        let (sa, sb) = (self.ty(0)?.shape, self.ty(1)?.shape);
        let dy = self.dy()?;
        let op = self.node.op;
        let mm = |r: &mut Self, x: Operand, y: Operand, tx: bool, ty: bool, s: &str| {
            let attrs = Attrs::new()
                .with("transpose_a", Attr::Bool(tx))
                .with("transpose_b", Attr::Bool(ty));
            r.emit(op, vec![x, y], attrs, s)
        };
        let sfx_a = self.operand_suffix(0);
        let sfx_b = self.operand_suffix(1);
        // d(op(A) op(B)): see the table in MindSpore's bprop of MatMul.
        let da = self.when(0, |r| {
            let g = match (ta, tb) {
                (false, false) => mm(r, dy.clone(), b.clone(), false, true, &sfx_a),
                (false, true) => mm(r, dy.clone(), b.clone(), false, false, &sfx_a),
                (true, false) => mm(r, b.clone(), dy.clone(), false, true, &sfx_a),
                (true, true) => mm(r, b.clone(), dy.clone(), true, true, &sfx_a),
            }?;
            if batched {
                r.em.unbroadcast(g, &sa, &sfx_a)
            } else {
                Ok(g)
            }
        })?;
        let db = self.when(1, |r| {
            let g = match (ta, tb) {
                (false, false) => mm(r, a.clone(), dy.clone(), true, false, &sfx_b),
                (false, true) => mm(r, dy.clone(), a.clone(), true, false, &sfx_b),
                (true, false) => mm(r, a.clone(), dy.clone(), false, false, &sfx_b),
                (true, true) => mm(r, dy.clone(), a.clone(), true, true, &sfx_b),
            }?;
            if batched {
                r.em.unbroadcast(g, &sb, &sfx_b)
            } else {
                Ok(g)
            }
        })?;
        Ok(vec![da, db])
    }
}

// ---- loops ----

fn matmul_dims(c: &DimsCx<'_>) -> Result<OpDims, DimsError> {
    let node = c.node;
    let a = c.in_shape(0)?;
    let b = c.in_shape(1)?;
    let ta = node.attrs.bool_or("transpose_a", false);
    let tb = node.attrs.bool_or("transpose_b", false);
    let (m, k) = if ta { (a[1], a[0]) } else { (a[0], a[1]) };
    let n = if tb { b[0] } else { b[1] };
    // loops: i = 0, k = 1, j = 2
    let mut d = OpDims::with_loops(vec![m, k, n]);
    let (i, kk, j) = (Dim::Loop(0), Dim::Loop(1), Dim::Loop(2));
    d.inputs = vec![
        Some(if ta { vec![kk, i] } else { vec![i, kk] }),
        Some(if tb { vec![j, kk] } else { vec![kk, j] }),
    ];
    d.outputs = vec![vec![i, j]];
    d.combine[1] = Some(ReduceOp::Sum);
    Ok(d)
}

fn batch_matmul_dims(c: &DimsCx<'_>) -> Result<OpDims, DimsError> {
    let (node, out0) = (c.node, &c.out0);
    let a = c.in_shape(0)?;
    let b = c.in_shape(1)?;
    let out = out0.clone();
    let r = out.len();
    let nb = r - 2;
    let ta = node.attrs.bool_or("transpose_a", false);
    let tb = node.attrs.bool_or("transpose_b", false);
    // loops: batch 0..nb, i = nb, j = nb + 1, k = nb + 2
    let ka = if ta { a[a.len() - 2] } else { a[a.len() - 1] };
    let mut sizes = out.clone();
    sizes.push(ka);
    let mut d = OpDims::with_loops(sizes);
    let (i, j, k) = (Dim::Loop(nb), Dim::Loop(nb + 1), Dim::Loop(nb + 2));
    let batch = |s: &[usize]| -> Vec<Dim> {
        let sb = &s[..s.len() - 2];
        broadcast_dims(sb, &out[..nb])
    };
    let mut da = batch(&a);
    da.extend(if ta { [k, i] } else { [i, k] });
    let mut db = batch(&b);
    db.extend(if tb { [j, k] } else { [k, j] });
    d.inputs = vec![Some(da), Some(db)];
    d.outputs = vec![OpDims::identity(r)];
    d.combine[nb + 2] = Some(ReduceOp::Sum);
    Ok(d)
}

/// The loops of `Conv2D` and of its gradients `Conv2DBackpropInput` / `Conv2DBackpropFilter`.
pub(super) fn conv_dims(c: &DimsCx<'_>) -> Result<OpDims, DimsError> {
    conv_loops(c.node, &c.ins, &c.outs)
}

fn conv_loops(
    node: &Node,
    ins: &[Option<Vec<usize>>],
    outs: &[Vec<usize>],
) -> Result<OpDims, DimsError> {
    use OpKind::*;
    let group = node.attrs.int_or("group", 1);
    // loops: n = 0, o = 1, c = 2, and the output's spatial oh = 3, ow = 4. A split of oh / ow
    // splits the output (and dy) into blocks of rows / columns; the input's windows reach
    // across any split, so the input (x, dx) is whole along them: x is gathered
    // (`Dim::Window`) and the local op reads the window of its block; dx is a sum of the
    // blocks' contributions. Kernel dims stay whole.
    let nd = |a: usize, b: usize| -> Vec<Dim> {
        let mut v = vec![Dim::Loop(a), Dim::Loop(b)];
        v.extend([Dim::Whole, Dim::Whole]);
        v
    };
    let out_image = |a: usize, b: usize| -> Vec<Dim> {
        vec![Dim::Loop(a), Dim::Loop(b), Dim::Loop(3), Dim::Loop(4)]
    };
    let in_image = |a: usize, b: usize| -> Vec<Dim> {
        vec![Dim::Loop(a), Dim::Loop(b), Dim::Window(3), Dim::Window(4)]
    };
    let get = |i: usize| ins.get(i).cloned().flatten().unwrap_or_default();
    let (n, o, c) = match node.op {
        Conv2D => (get(0)[0], get(1)[0], get(0)[1]),
        Conv2DBackpropInput => (get(0)[0], get(0)[1], outs[0][1]),
        _ => (get(0)[0], get(0)[1], get(1)[1]),
    };
    // The output's (dy's) spatial extent.
    let y = if node.op == Conv2D {
        outs.first().cloned().unwrap_or_default()
    } else {
        get(0)
    };
    let y_hw = (
        y.get(2).copied().unwrap_or(1),
        y.get(3).copied().unwrap_or(1),
    );
    let mut d = OpDims::with_loops(vec![n, o, c, y_hw.0, y_hw.1]);
    match node.op {
        Conv2D => {
            d.inputs = vec![Some(in_image(0, 2)), Some(nd(1, 2))];
            d.outputs = vec![out_image(0, 1)];
            d.combine[2] = Some(ReduceOp::Sum);
        }
        Conv2DBackpropInput => {
            d.inputs = vec![Some(out_image(0, 1)), Some(nd(1, 2)), None];
            d.outputs = vec![nd(0, 2)];
            for l in [1, 3, 4] {
                d.combine[l] = Some(ReduceOp::Sum);
            }
        }
        _ => {
            d.inputs = vec![Some(out_image(0, 1)), Some(in_image(0, 2)), None];
            d.outputs = vec![nd(1, 2)];
            for l in [0, 3, 4] {
                d.combine[l] = Some(ReduceOp::Sum);
            }
        }
    }
    if group != 1 {
        d.fix(1, "a grouped convolution keeps its channels whole");
        d.fix(2, "a grouped convolution keeps its channels whole");
    }
    Ok(d)
}

// ---- cost ----

/// FLOPs of one iteration of a convolution's loops `(n, out channels, in channels, h, w)`
/// (also its gradients'): the kernel window is not a loop, so its area multiplies: from the
/// weight (operand 1 of Conv2D and Conv2DBackpropInput), else the `kernel_size` attribute.
pub(super) fn conv_flops(g: &Graph, node: &Node) -> f64 {
    let from_weight = (node.op != Conv2DBackpropFilter)
        .then(|| node.inputs.get(1).and_then(|o| g.operand_tensor_type(o)))
        .flatten()
        .filter(|t| t.shape.len() == 4)
        .map(|t| (t.shape[2] * t.shape[3]) as f64);
    let k = from_weight
        .or_else(|| {
            node.attrs.ints("kernel_size").map(|v| match v[..] {
                [a] => (a * a).max(1) as f64,
                _ => v.iter().product::<i64>().max(1) as f64,
            })
        })
        .unwrap_or(9.0);
    2.0 * k
}
