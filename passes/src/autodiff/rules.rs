//! One gradient rule per op: given the gradients of a forward node's results, emit the
//! gradients of its operands.
//!
//! MindSpore's gradient kernels are used where they exist (`ReluGrad`, `SigmoidGrad`,
//! `TanhGrad`, `GeLUGrad`, `SqrtGrad`, `BiasAddGrad`, `SoftmaxGrad`, `LogSoftmaxGrad`,
//! `Conv2DBackpropInput` / `Conv2DBackpropFilter`, `MaxPoolGrad`, `AvgPoolGrad`,
//! `BatchNormGrad`, `LayerNormGrad`, `DropoutGrad`, `StridedSliceGrad`, `UnsortedSegmentSum`
//! for `Gather`, `SparseSoftmaxCrossEntropyWithLogits` with `is_grad`, the `backprop` result of
//! `SoftmaxCrossEntropyWithLogits`); the rest is composed from basic ops. A broadcast operand
//! gets its gradient summed back to its own shape.

use super::emitter::{dtype_attr, ints, Emitter};
use super::error::AutodiffError;
use crate::infer::{normalize_axis, reduce_axes, signature};
use shardc_ir::{Attr, Attrs, Const, Graph, Node, NodeId, OpKind, Operand, TensorType};

/// Whether operand `pos` of `node` can carry a gradient (before looking at dtypes and at
/// what depends on what). Ops with no gradient rule count their tensor operands as
/// differentiable, so that a loss depending on them through them is reported.
pub(super) fn differentiable(_g: &Graph, node: &Node, pos: usize) -> bool {
    use OpKind::*;
    if matches!(node.inputs.get(pos), Some(Operand::Const(_)) | None) {
        return false;
    }
    match node.op {
        // Integer-valued or constant results: no gradient flows through them.
        Equal | OneHot | ZerosLike | OnesLike => false,
        // Indices, segment ids, masks and labels.
        Gather | UnsortedSegmentSum | DropoutGrad | StridedSliceGrad => pos == 0,
        SparseSoftmaxCrossEntropyWithLogits => pos == 0,
        // Training-mode BatchNorm normalises with the batch statistics: y does not depend on
        // the moving mean and variance.
        BatchNorm => pos < 3 || !node.attrs.bool_or("is_training", true),
        _ => true,
    }
}

/// The gradients of the operands of forward node `id`, given the gradients `dys` of its
/// results (one per tensor of its result; `None` where nothing flows back). `needs[i]` says
/// whether operand `i` wants a gradient; the result has one entry per operand.
pub(super) fn gradient(
    em: &mut Emitter,
    id: NodeId,
    dys: Vec<Option<Operand>>,
    needs: &[bool],
) -> Result<Vec<Option<Operand>>, AutodiffError> {
    let node = em.g.nodes[id.index()].clone();
    // Optional operands (the axes of a reduction) are read with their defaults.
    let wanted = signature(node.op).required;
    if node.inputs.len() < wanted {
        return Err(em.bad_node(format!(
            "expects {wanted} operand(s), got {}",
            node.inputs.len()
        )));
    }
    let mut r = Rule {
        em,
        id,
        node,
        dys,
        needs: needs.to_vec(),
    };
    r.run()
}

/// Attributes that describe the forward node's own operands or strategy, not its semantics;
/// they are not copied to gradient kernels.
const NOT_COPIED: &[&str] = &["input_names", "output_names", "in_strategy", "out_strategy"];

struct Rule<'e> {
    em: &'e mut Emitter,
    id: NodeId,
    node: Node,
    dys: Vec<Option<Operand>>,
    needs: Vec<bool>,
}

type Grads = Result<Vec<Option<Operand>>, AutodiffError>;

impl Rule<'_> {
    fn run(&mut self) -> Grads {
        use OpKind::*;
        match self.node.op {
            MatMul | BatchMatMul => self.matmul(),
            Conv2D => {
                let attrs = self.copied_attrs();
                let (x, w) = (self.x(0), self.x(1));
                let (xs, ws) = (self.ty(0)?.shape, self.ty(1)?.shape);
                let dy = self.dy()?;
                let dx = self.when(0, |r| {
                    r.emit(
                        Conv2DBackpropInput,
                        vec![dy.clone(), w, ints(&xs)],
                        attrs.clone(),
                        "_x",
                    )
                })?;
                let dw = self.when(1, |r| {
                    r.emit(
                        Conv2DBackpropFilter,
                        vec![dy.clone(), x, ints(&ws)],
                        attrs.clone(),
                        "_w",
                    )
                })?;
                Ok(vec![dx, dw])
            }
            BiasAdd => {
                let dy = self.dy()?;
                let attrs = self.copied_attrs();
                let db = self.when(1, |r| r.emit(BiasAddGrad, vec![dy.clone()], attrs, "_b"))?;
                Ok(vec![Some(dy), db])
            }
            Add | Sub | Mul | RealDiv => self.binary(),
            Neg => self.unary(|r, dy| r.emit(Neg, vec![dy], Attrs::new(), "")),
            Square => self.unary(|r, dy| {
                let two_x = r.emit(Mul, vec![r.x(0), float(2.0)], Attrs::new(), "_2x")?;
                r.emit(Mul, vec![dy, two_x], Attrs::new(), "")
            }),
            Sqrt => self.unary(|r, dy| r.emit(SqrtGrad, vec![r.y(), dy], Attrs::new(), "")),
            Exp => self.unary(|r, dy| r.emit(Mul, vec![dy, r.y()], Attrs::new(), "")),
            Log => self.unary(|r, dy| r.emit(RealDiv, vec![dy, r.x(0)], Attrs::new(), "")),
            ReLU => self.unary(|r, dy| r.emit(ReluGrad, vec![dy, r.y()], Attrs::new(), "")),
            GeLU => self.unary(|r, dy| r.emit(GeLUGrad, vec![dy, r.x(0), r.y()], Attrs::new(), "")),
            Sigmoid => self.unary(|r, dy| r.emit(SigmoidGrad, vec![r.y(), dy], Attrs::new(), "")),
            Tanh => self.unary(|r, dy| r.emit(TanhGrad, vec![r.y(), dy], Attrs::new(), "")),
            Cast => {
                let src = self.ty(0)?.dtype;
                self.unary(|r, dy| {
                    r.emit(
                        Cast,
                        vec![dy],
                        Attrs::new().with("dst_type", dtype_attr(src)),
                        "",
                    )
                })
            }
            Dropout => {
                self.only_outputs(&[0], "the mask (result 1)")?;
                let dy = self.dy()?;
                let mask = self.item(1)?;
                let mut attrs = Attrs::new();
                if let Some(k) = self.node.attrs.get("keep_prob") {
                    attrs.set("keep_prob", k.clone());
                }
                let dx = self.emit(DropoutGrad, vec![dy, mask], attrs, "")?;
                Ok(vec![Some(dx)])
            }
            DropoutGrad => self.unary(|r, dy| {
                let attrs = r.copied_attrs();
                r.emit(DropoutGrad, vec![dy, r.x(1)], attrs, "")
            }),
            ReduceSum | ReduceMean => self.reduce_sum_mean(),
            ReduceMax => self.reduce_max(),
            Softmax => self.unary(|r, dy| {
                let attrs = r.axis_attr();
                r.emit(SoftmaxGrad, vec![r.y(), dy], attrs, "")
            }),
            LogSoftmax => self.unary(|r, dy| {
                let attrs = r.axis_attr();
                r.emit(LogSoftmaxGrad, vec![r.y(), dy], attrs, "")
            }),
            BatchNorm => self.batch_norm(),
            LayerNorm => self.layer_norm(),
            MaxPool | AvgPool => {
                let op = if self.node.op == MaxPool {
                    MaxPoolGrad
                } else {
                    AvgPoolGrad
                };
                self.unary(|r, dy| {
                    let attrs = r.copied_attrs();
                    r.emit(op, vec![r.x(0), r.y(), dy], attrs, "")
                })
            }
            Reshape | BroadcastTo => {
                let shape = self.ty(0)?.shape;
                let is_reshape = self.node.op == Reshape;
                self.unary(|r, dy| {
                    if is_reshape {
                        r.em.reshape(dy, &shape, "")
                    } else {
                        r.em.unbroadcast(dy, &shape, "")
                    }
                })
            }
            Transpose => self.transpose(),
            Gather => self.gather(),
            Concat => self.concat(),
            Split => self.split(),
            StridedSlice => self.unary(|r, dy| {
                let shape = r.ty(0)?.shape;
                let mut inputs = vec![dy, ints(&shape)];
                inputs.extend(r.node.inputs[1..4].iter().cloned());
                let attrs = r.copied_attrs();
                r.emit(StridedSliceGrad, inputs, attrs, "")
            }),
            StridedSliceGrad => self.unary(|r, dy| {
                let mut inputs = vec![dy];
                inputs.extend(r.node.inputs[2..5].iter().cloned());
                let attrs = r.copied_attrs();
                r.emit(StridedSlice, inputs, attrs, "")
            }),
            UnsortedSegmentSum => self.unary(|r, dy| {
                r.emit(
                    Gather,
                    vec![dy, r.x(1), Operand::Const(Const::Int(0))],
                    Attrs::new(),
                    "",
                )
            }),
            SoftmaxCrossEntropyWithLogits => self.softmax_ce(),
            SparseSoftmaxCrossEntropyWithLogits => {
                if self.node.attrs.bool_or("is_grad", false) {
                    return Err(self.em.no_gradient(
                        "with is_grad: true it computes a gradient already (second-order gradients are not supported)",
                    ));
                }
                self.unary(|r, dy| {
                    let g = r.emit(
                        SparseSoftmaxCrossEntropyWithLogits,
                        vec![r.x(0), r.x(1)],
                        Attrs::new().with("is_grad", Attr::Bool(true)),
                        "_logits",
                    )?;
                    r.emit(Mul, vec![g, dy], Attrs::new(), "")
                })
            }
            AllReduce => {
                let op = self.node.attrs.str_or("op", "sum");
                if op != "sum" {
                    return Err(self.em.no_gradient(format!(
                        "only AllReduce with op: sum has a gradient, this one has op: {op}"
                    )));
                }
                self.unary(|r, dy| {
                    let attrs = r.copied_attrs();
                    r.emit(AllReduce, vec![dy], attrs, "")
                })
            }
            AllGather => self.unary(|r, dy| {
                let attrs = r.copied_attrs().with("op", Attr::Str("sum".into()));
                r.emit(ReduceScatter, vec![dy], attrs, "")
            }),
            ReduceScatter => {
                let op = self.node.attrs.str_or("op", "sum");
                if op != "sum" {
                    return Err(self.em.no_gradient(format!(
                        "only ReduceScatter with op: sum has a gradient, this one has op: {op}"
                    )));
                }
                self.unary(|r, dy| {
                    let mut attrs = r.copied_attrs();
                    attrs.remove("op");
                    r.emit(AllGather, vec![dy], attrs, "")
                })
            }
            AllToAll => self.unary(|r, dy| {
                let mut attrs = r.copied_attrs();
                let split = r.node.attrs.get("split_dim").cloned();
                let concat = r.node.attrs.get("concat_dim").cloned();
                match (split, concat) {
                    (Some(s), Some(c)) => {
                        attrs.set("split_dim", c);
                        attrs.set("concat_dim", s);
                    }
                    _ => return Err(r.em.bad_node("AlltoAll needs `split_dim` and `concat_dim`")),
                }
                r.emit(AllToAll, vec![dy], attrs, "")
            }),
            Broadcast | Send | Receive => Err(self.em.no_gradient(
                "point-to-point and broadcast communication have no gradient rule yet",
            )),
            ApplyMomentum | SGD | ApplyGradientDescent | Adam => Err(self
                .em
                .no_gradient("an optimizer update is not differentiable")),
            Assign => Err(self
                .em
                .no_gradient("Assign stores a parameter; read the value it stores instead")),
            ReluGrad | GeLUGrad | SigmoidGrad | TanhGrad | SqrtGrad | BiasAddGrad | SoftmaxGrad
            | LogSoftmaxGrad | Conv2DBackpropInput | Conv2DBackpropFilter | MaxPoolGrad
            | AvgPoolGrad | BatchNormGrad | LayerNormGrad | BNTrainingUpdateGrad
            | BNTrainingReduceGrad => Err(self
                .em
                .no_gradient("it is a gradient kernel (second-order gradients are not supported)")),
            BNTrainingReduce | BNTrainingUpdate => Err(self.em.no_gradient(
                "the synchronised BatchNorm ops appear only after autodiff (differentiate \
                 BatchNorm instead)",
            )),
            Equal | OneHot | ZerosLike | OnesLike => Err(self
                .em
                .no_gradient("its result does not vary continuously with its operands")),
            TupleGetItem => Err(self
                .em
                .bad_node("internal error: TupleGetItem is routed by the driver, not by a rule")),
        }
    }

    // ---- access to the forward node ----

    /// Forward operand `i`.
    fn x(&self, i: usize) -> Operand {
        self.node.inputs[i].clone()
    }

    /// The tensor type of forward operand `i`.
    fn ty(&self, i: usize) -> Result<TensorType, AutodiffError> {
        let op = self
            .node
            .inputs
            .get(i)
            .ok_or_else(|| self.em.bad_node(format!("input {i} is missing")))?;
        self.em.operand_type(op)
    }

    /// The forward node's (single) result.
    fn y(&self) -> Operand {
        Operand::Node(self.id)
    }

    /// Result `k` of the tuple-valued forward node.
    fn item(&mut self, k: usize) -> Result<Operand, AutodiffError> {
        self.em.item(self.id, k, &format!("_item{k}"))
    }

    /// The gradient of the single (or first) result.
    fn dy(&self) -> Result<Operand, AutodiffError> {
        self.dys
            .first()
            .cloned()
            .flatten()
            .ok_or_else(|| self.em.bad_node("internal error: no gradient for result 0"))
    }

    /// Fails when a gradient reaches a result other than `allowed` (`what` names them).
    fn only_outputs(&self, allowed: &[usize], what: &str) -> Result<(), AutodiffError> {
        for (k, d) in self.dys.iter().enumerate() {
            if d.is_some() && !allowed.contains(&k) {
                return Err(self.em.no_gradient(format!(
                    "the loss depends on result {k}, and only {} of the results are differentiable ({what} is not)",
                    allowed.len()
                )));
            }
        }
        Ok(())
    }

    /// Whether operand `i` wants a gradient.
    fn need(&self, i: usize) -> bool {
        self.needs.get(i).copied().unwrap_or(false)
    }

    /// `f(self)` when operand `i` wants a gradient.
    fn when(
        &mut self,
        i: usize,
        f: impl FnOnce(&mut Self) -> Result<Operand, AutodiffError>,
    ) -> Result<Option<Operand>, AutodiffError> {
        if self.need(i) {
            f(self).map(Some)
        } else {
            Ok(None)
        }
    }

    /// The forward node's attributes, for a gradient kernel of the same op family.
    fn copied_attrs(&self) -> Attrs {
        let mut a = Attrs::new();
        for (k, v) in self.node.attrs.iter() {
            if !NOT_COPIED.contains(&k) {
                a.set(k, v.clone());
            }
        }
        a
    }

    /// The `axis` attribute (when present) of a softmax.
    fn axis_attr(&self) -> Attrs {
        let mut a = Attrs::new();
        if let Some(v) = self.node.attrs.get("axis") {
            a.set("axis", v.clone());
        }
        a
    }

    fn emit(
        &mut self,
        op: OpKind,
        inputs: Vec<Operand>,
        attrs: Attrs,
        suffix: &str,
    ) -> Result<Operand, AutodiffError> {
        self.em.emit(op, inputs, attrs, suffix)
    }

    /// The suffix for operand `i`: `_` + its name in the op's signature (`_a`, `_b`, `_x`).
    fn operand_suffix(&self, i: usize) -> String {
        format!("_{}", signature(self.node.op).name(i))
    }

    /// A one-operand op whose gradient is `f(dy)`.
    fn unary(
        &mut self,
        f: impl FnOnce(&mut Self, Operand) -> Result<Operand, AutodiffError>,
    ) -> Grads {
        let dy = self.dy()?;
        let mut out = vec![None; self.node.inputs.len()];
        if self.need(0) {
            out[0] = Some(f(self, dy)?);
        }
        Ok(out)
    }

    // ---- the rules ----

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

    fn binary(&mut self) -> Grads {
        use OpKind::*;
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
        use OpKind::*;
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
        use OpKind::*;
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

    /// Emits a tuple-valued gradient kernel with the forward node's attributes.
    fn emit_node_grad(
        &mut self,
        op: OpKind,
        inputs: Vec<Operand>,
    ) -> Result<NodeId, AutodiffError> {
        let attrs = self.copied_attrs();
        self.em.emit_node(op, inputs, attrs, "")
    }

    fn transpose(&mut self) -> Grads {
        let rank = self.ty(0)?.rank();
        let perm = self
            .node
            .inputs
            .get(1)
            .and_then(Operand::as_const)
            .and_then(Const::as_ints)
            .ok_or_else(|| self.em.bad_node("input 1 (perm) must be a constant tuple"))?;
        let mut inv = vec![0i64; rank];
        for (i, &p) in perm.iter().enumerate() {
            let a = normalize_axis(p, rank)
                .ok_or_else(|| self.em.bad_node(format!("perm entry {p} is out of range")))?;
            inv[a] = i as i64;
        }
        self.unary(|r, dy| {
            r.emit(
                OpKind::Transpose,
                vec![dy, Operand::Const(Const::Ints(inv))],
                Attrs::new(),
                "",
            )
        })
    }

    /// `UnsortedSegmentSum` of dy by the indices, along the gathered axis.
    fn gather(&mut self) -> Grads {
        use OpKind::*;
        let ps = self.ty(0)?.shape;
        let ri = self.ty(1)?.rank();
        let axis = self
            .node
            .inputs
            .get(2)
            .and_then(Operand::as_const)
            .and_then(Const::as_int)
            .ok_or_else(|| {
                self.em
                    .bad_node("input 2 (axis) must be a constant integer")
            })?;
        let a = normalize_axis(axis, ps.len())
            .ok_or_else(|| self.em.bad_node(format!("axis {axis} is out of range")))?;
        let rank_dy = ps.len() - 1 + ri;
        self.unary(|r, dy| {
            let mut g = dy;
            if a > 0 {
                // Bring the index dims to the front: (idx..., p[..a], p[a+1..]).
                let perm: Vec<i64> = (a..a + ri)
                    .chain(0..a)
                    .chain(a + ri..rank_dy)
                    .map(|d| d as i64)
                    .collect();
                g = r.emit(
                    Transpose,
                    vec![g, Operand::Const(Const::Ints(perm))],
                    Attrs::new(),
                    "_front",
                )?;
            }
            let mut s = r.emit(
                UnsortedSegmentSum,
                vec![g, r.x(1), Operand::Const(Const::Int(ps[a] as i64))],
                Attrs::new(),
                if a > 0 { "_segments" } else { "" },
            )?;
            if a > 0 {
                // (p[a], p[..a], p[a+1..]) -> p.
                let perm: Vec<i64> = (1..=a)
                    .chain(std::iter::once(0))
                    .chain(a + 1..ps.len())
                    .map(|d| d as i64)
                    .collect();
                s = r.emit(
                    Transpose,
                    vec![s, Operand::Const(Const::Ints(perm))],
                    Attrs::new(),
                    "",
                )?;
            }
            Ok(s)
        })
    }

    fn concat(&mut self) -> Grads {
        let dy = self.dy()?;
        let shape = self.em.operand_type(&dy)?.shape;
        let axis = self.node.attrs.int_or("axis", 0);
        let a = normalize_axis(axis, shape.len())
            .ok_or_else(|| self.em.bad_node(format!("axis {axis} is out of range")))?;
        let mut out = Vec::with_capacity(self.node.inputs.len());
        let mut offset = 0usize;
        for i in 0..self.node.inputs.len() {
            let size = self.ty(i)?.shape.get(a).copied().ok_or_else(|| {
                self.em
                    .bad_node(format!("input {i} has no axis {a} to concatenate along"))
            })?;
            if self.need(i) {
                let mut begin = vec![0usize; shape.len()];
                let mut end = shape.clone();
                begin[a] = offset;
                end[a] = offset + size;
                let strides = vec![1usize; shape.len()];
                let g = self.emit(
                    OpKind::StridedSlice,
                    vec![dy.clone(), ints(&begin), ints(&end), ints(&strides)],
                    Attrs::new(),
                    &format!("_{i}"),
                )?;
                out.push(Some(g));
            } else {
                out.push(None);
            }
            offset += size;
        }
        Ok(out)
    }

    fn split(&mut self) -> Grads {
        let present = self.dys.iter().flatten().next().cloned().ok_or_else(|| {
            self.em
                .bad_node("internal error: no gradient reaches Split")
        })?;
        if !self.need(0) {
            return Ok(vec![None]);
        }
        if self.dys.len() == 1 {
            return Ok(vec![Some(present)]);
        }
        let mut parts = Vec::with_capacity(self.dys.len());
        for (k, d) in self.dys.clone().into_iter().enumerate() {
            parts.push(match d {
                Some(d) => d,
                None => self.emit(
                    OpKind::ZerosLike,
                    vec![present.clone()],
                    Attrs::new(),
                    &format!("_zeros{k}"),
                )?,
            });
        }
        let axis = self.node.attrs.get("axis").cloned().unwrap_or(Attr::Int(0));
        let dx = self.emit(OpKind::Concat, parts, Attrs::new().with("axis", axis), "")?;
        Ok(vec![Some(dx)])
    }

    /// `(loss (N), backprop (N, C))`: dlogits = backprop * dloss[:, None]; dlabels =
    /// -log_softmax(logits) * dloss[:, None].
    fn softmax_ce(&mut self) -> Grads {
        use OpKind::*;
        self.only_outputs(&[0], "backprop (result 1)")?;
        let dy = self.dy()?;
        let n = self.em.operand_type(&dy)?.shape;
        let mut col = n.clone();
        col.push(1);
        let d = self.em.reshape(dy, &col, "_col")?;
        let mut out = vec![None, None];
        if self.need(0) {
            let bp = self.item(1)?;
            out[0] = Some(self.emit(Mul, vec![bp, d.clone()], Attrs::new(), "_logits")?);
        }
        if self.need(1) {
            let ls = self.emit(
                LogSoftmax,
                vec![self.x(0)],
                Attrs::new().with("axis", Attr::Int(-1)),
                "_log_softmax",
            )?;
            let m = self.emit(Mul, vec![ls, d], Attrs::new(), "_labels_mul")?;
            out[1] = Some(self.emit(Neg, vec![m], Attrs::new(), "_labels")?);
        }
        Ok(out)
    }
}

/// A float constant operand.
fn float(v: f64) -> Operand {
    Operand::Const(Const::Float(v))
}
