//! The loop-dimension view of every op: which dimensions of its inputs and outputs are the
//! same iteration space, which may be split, and how results combine when a dimension that an
//! output lacks is split (a contraction gives partial sums).
//!
//! This is the one table that makes each op's parallel rule: [`op_dims`] describes the op as
//! loops (like an einsum: MatMul is `(i, k) x (k, j) -> (i, j)` over loops `i, k, j`), and
//! `rules` turns a strategy into layouts from it.

use crate::infer::{normalize_axis, reduce_axes, softmax_axis};
use shardc_ir::{Graph, Node, OpKind, Operand, ReduceOp};

/// What one tensor dimension is in the op's iteration space.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dim {
    /// The dimension runs over loop `l`.
    Loop(usize),
    /// The dimension must stay whole (a broadcast size-1 dimension, or one the op needs whole).
    Whole,
    /// An input dimension read through windows that follow loop `l` (a convolution's input
    /// rows, for the output rows `l`): the strategy's split of this dimension splits loop `l`,
    /// but each part reads a window that can reach anywhere, so the operand is whole along it
    /// (gathered) and the local op slices its window.
    Window(usize),
}

impl Dim {
    /// The loop the dimension follows, if any (`Loop` and `Window`).
    pub fn loop_of(self) -> Option<usize> {
        match self {
            Dim::Loop(l) | Dim::Window(l) => Some(l),
            Dim::Whole => None,
        }
    }
}

/// An op as loops.
#[derive(Clone, Debug, Default)]
pub struct OpDims {
    /// The extent of each loop (informative; divisibility is checked per tensor dimension).
    pub loop_sizes: Vec<usize>,
    /// Per operand: its dimensions, or `None` for a constant operand.
    pub inputs: Vec<Option<Vec<Dim>>>,
    /// Per result (one for a tensor result, one per element of a tuple result).
    pub outputs: Vec<Vec<Dim>>,
    /// Per loop: how a result that lacks the loop combines over its split (a contraction sums).
    pub combine: Vec<Option<ReduceOp>>,
    /// Per loop: why it may not be split, if it may not.
    pub fixed: Vec<Option<String>>,
    /// Loops whose split count also divides the results (a mean computed over a local block
    /// must be scaled by `1/split` to be a term of the global mean).
    pub mean_loops: Vec<usize>,
    /// Per loop: a result that lacks the loop is the same on every part of its split (it is
    /// computed from per-channel inputs that are already complete), so it is replicated, not
    /// partial (BNTrainingUpdate's statistics).
    pub uniform: Vec<bool>,
}

impl OpDims {
    fn with_loops(sizes: Vec<usize>) -> OpDims {
        let n = sizes.len();
        OpDims {
            loop_sizes: sizes,
            inputs: Vec::new(),
            outputs: Vec::new(),
            combine: vec![None; n],
            fixed: vec![None; n],
            mean_loops: Vec::new(),
            uniform: vec![false; n],
        }
    }

    fn fix(&mut self, l: usize, why: impl Into<String>) {
        if self.fixed[l].is_none() {
            self.fixed[l] = Some(why.into());
        }
    }

    fn identity(rank: usize) -> Vec<Dim> {
        (0..rank).map(Dim::Loop).collect()
    }
}

/// Why the dims of an op cannot be described.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DimsError(pub String);

fn shape_of(g: &Graph, o: &Operand) -> Option<Vec<usize>> {
    g.operand_tensor_type(o).map(|t| t.shape.clone())
}

/// The shapes of the node's operands (`None` for constants) and results.
fn shapes(g: &Graph, node: &Node) -> (Vec<Option<Vec<usize>>>, Vec<Vec<usize>>) {
    let ins = node.inputs.iter().map(|o| shape_of(g, o)).collect();
    let outs = node.ty.tensors().iter().map(|t| t.shape.clone()).collect();
    (ins, outs)
}

/// Dims of a tensor of `shape` broadcast against an output of rank `out_rank`: aligned from
/// the right; a size-1 dimension where the output is larger stays whole.
fn broadcast_dims(shape: &[usize], out: &[usize]) -> Vec<Dim> {
    let off = out.len() - shape.len().min(out.len());
    shape
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let l = off + i;
            if n == 1 && out.get(l).copied().unwrap_or(1) != 1 {
                Dim::Whole
            } else {
                Dim::Loop(l)
            }
        })
        .collect()
}

/// The loop view of `node` (types inferred).
pub fn op_dims(g: &Graph, node: &Node) -> Result<OpDims, DimsError> {
    use OpKind::*;
    let (ins, outs) = shapes(g, node);
    let err = |m: String| DimsError(m);
    let in_shape = |i: usize| -> Result<Vec<usize>, DimsError> {
        ins.get(i)
            .cloned()
            .flatten()
            .ok_or_else(|| DimsError(format!("operand {i} is not a tensor")))
    };
    let out0 = outs.first().cloned().unwrap_or_default();
    let consts_as_none = |d: &mut OpDims| {
        d.inputs = ins
            .iter()
            .map(|s| s.as_ref().map(|s| broadcast_dims(s, &out0)))
            .collect();
    };
    let d = match node.op {
        // Elementwise over the (broadcast) output shape.
        Add | Sub | Mul | RealDiv | Neg | Square | Sqrt | Exp | Log | ReLU | GeLU | Sigmoid
        | Tanh | Cast | Equal | ZerosLike | OnesLike | ReluGrad | GeLUGrad | SigmoidGrad
        | TanhGrad | SqrtGrad | DropoutGrad | Dropout => {
            let mut d = OpDims::with_loops(out0.clone());
            consts_as_none(&mut d);
            d.outputs = outs.iter().map(|o| broadcast_dims(o, &out0)).collect();
            d
        }
        ApplyMomentum | SGD | ApplyGradientDescent | Adam | Assign => {
            // Every tensor operand of the variable's shape shares its loops; scalars (rank 0)
            // have no dimensions.
            let var = in_shape(0)?;
            let mut d = OpDims::with_loops(var.clone());
            d.inputs = ins
                .iter()
                .map(|s| {
                    s.as_ref().map(|s| {
                        if s.is_empty() {
                            Vec::new()
                        } else {
                            broadcast_dims(s, &var)
                        }
                    })
                })
                .collect();
            d.outputs = outs.iter().map(|o| broadcast_dims(o, &var)).collect();
            d
        }
        BiasAdd => {
            let x = in_shape(0)?;
            let mut d = OpDims::with_loops(x.clone());
            d.inputs = vec![Some(OpDims::identity(x.len())), Some(vec![Dim::Loop(1)])];
            d.outputs = vec![OpDims::identity(x.len())];
            d
        }
        BiasAddGrad => {
            let x = in_shape(0)?;
            let mut d = OpDims::with_loops(x.clone());
            d.inputs = vec![Some(OpDims::identity(x.len()))];
            d.outputs = vec![vec![Dim::Loop(1)]];
            for l in 0..x.len() {
                if l != 1 {
                    d.combine[l] = Some(ReduceOp::Sum);
                }
            }
            d
        }
        MatMul => {
            let a = in_shape(0)?;
            let b = in_shape(1)?;
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
            d
        }
        BatchMatMul => {
            let a = in_shape(0)?;
            let b = in_shape(1)?;
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
            d
        }
        Conv2D | Conv2DBackpropInput | Conv2DBackpropFilter => conv_dims(node, &ins, &outs)?,
        ReduceSum | ReduceMean | ReduceMax => {
            let x = in_shape(0)?;
            let axes = reduce_axes(node, x.len()).map_err(|e| err(e.to_string()))?;
            let keep = node.attrs.bool_or("keep_dims", false);
            let mut d = OpDims::with_loops(x.clone());
            d.inputs = vec![Some(OpDims::identity(x.len()))];
            d.inputs.extend((1..ins.len()).map(|_| None));
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
            d
        }
        Softmax | LogSoftmax | SoftmaxGrad | LogSoftmaxGrad => {
            let x = in_shape(0)?;
            let axis = softmax_axis(node, x.len()).map_err(|e| err(e.to_string()))?;
            let mut d = OpDims::with_loops(x.clone());
            consts_as_none(&mut d);
            d.outputs = vec![OpDims::identity(x.len())];
            d.fix(
                axis,
                format!(
                    "dimension {axis} is the {} axis, which it needs whole",
                    node.op.name()
                ),
            );
            d
        }
        BatchNorm | BatchNormGrad => {
            // x (N, C, ...) ; per-channel vectors (C).
            let x = in_shape(if node.op == BatchNorm { 0 } else { 1 })?;
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
            d
        }
        BNTrainingReduce | BNTrainingUpdateGrad | BNTrainingUpdate | BNTrainingReduceGrad => {
            // x (N, C, ...); per-channel vectors (C) carry the channel loop only.
            let x = in_shape(match node.op {
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
            d
        }
        LayerNorm | LayerNormGrad => {
            let x = in_shape(0)?;
            let r = x.len();
            let bna = normalize_axis(node.attrs.int_or("begin_norm_axis", -1), r)
                .ok_or_else(|| err("begin_norm_axis out of range".into()))?;
            let bpa = normalize_axis(node.attrs.int_or("begin_params_axis", -1), r)
                .ok_or_else(|| err("begin_params_axis out of range".into()))?;
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
                    format!(
                        "dimension {l} is normalised (begin_norm_axis {bna}), which needs it whole"
                    ),
                );
            }
            for l in 0..bpa {
                d.combine[l] = Some(ReduceOp::Sum);
            }
            d
        }
        MaxPool | AvgPool | MaxPoolGrad | AvgPoolGrad => {
            // loops: n = 0, c = 1, and the pooled result's spatial oh = 2, ow = 3 (as a
            // convolution's: x is read through windows that reach across a split of them, so
            // it is whole along them; the gradients' dx is the blocks' partial sums).
            let x = in_shape(0)?;
            let y = if matches!(node.op, MaxPool | AvgPool) {
                out0.clone()
            } else {
                in_shape(1)?
            };
            if x.len() != 4 || y.len() != 4 {
                return Err(err(format!(
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
            d
        }
        Reshape => reshape_dims(&in_shape(0)?, &out0, ins.len()),
        Transpose => {
            let x = in_shape(0)?;
            let perm = node
                .inputs
                .get(1)
                .and_then(Operand::as_const)
                .and_then(|c| c.as_ints())
                .ok_or_else(|| err("Transpose needs a constant perm".into()))?;
            let mut d = OpDims::with_loops(x.clone());
            d.inputs = vec![Some(OpDims::identity(x.len())), None];
            d.outputs = vec![perm
                .iter()
                .map(|&p| Dim::Loop(normalize_axis(p, x.len()).unwrap_or(0)))
                .collect()];
            d
        }
        OneHot => {
            let idx = in_shape(0)?;
            let r = out0.len();
            let axis = normalize_axis(node.attrs.int_or("axis", -1), r).unwrap_or(r - 1);
            let mut sizes = idx.clone();
            sizes.push(out0[axis]);
            let depth = idx.len();
            let mut d = OpDims::with_loops(sizes);
            d.inputs = vec![Some(OpDims::identity(idx.len()))];
            d.inputs.extend((1..ins.len()).map(|_| None));
            let mut out: Vec<Dim> = OpDims::identity(idx.len());
            out.insert(axis, Dim::Loop(depth));
            d.outputs = vec![out];
            d.fix(depth, "the depth dimension is created by the op");
            d
        }
        Gather => {
            let p = in_shape(0)?;
            let idx = in_shape(1)?;
            let axis = node
                .inputs
                .get(2)
                .and_then(Operand::as_const)
                .and_then(|c| c.as_int())
                .and_then(|a| normalize_axis(a, p.len()))
                .ok_or_else(|| err("Gather needs a constant axis".into()))?;
            // loops: params dims (0..p.len()), then indices dims.
            let mut sizes = p.clone();
            sizes.extend(&idx);
            let mut d = OpDims::with_loops(sizes);
            let il: Vec<Dim> = (0..idx.len()).map(|i| Dim::Loop(p.len() + i)).collect();
            d.inputs = vec![Some(OpDims::identity(p.len())), Some(il.clone()), None];
            let mut out: Vec<Dim> = (0..axis).map(Dim::Loop).collect();
            out.extend(il);
            out.extend((axis + 1..p.len()).map(Dim::Loop));
            d.outputs = vec![out];
            // A table split along the gathered axis (a vocabulary split): each part looks up
            // the indices that fall in its rows and gives zeros for the others, so the parts'
            // results sum to the lookup (the partition marks the local Gather with its rows).
            d.combine[axis] = Some(ReduceOp::Sum);
            d
        }
        UnsortedSegmentSum => {
            // loops: the segments first (so that a segment split takes the outer device axes,
            // as the table's rows do in the Gather whose gradient this is), then x's dims.
            let x = in_shape(0)?;
            let ids = in_shape(1)?;
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
            d
        }
        Concat | Split => {
            let x = in_shape(0)?;
            let axis = normalize_axis(node.attrs.int_or("axis", 0), x.len())
                .ok_or_else(|| err("axis out of range".into()))?;
            let mut d = OpDims::with_loops(x.clone());
            let dims: Vec<Dim> = (0..x.len())
                .map(|l| if l == axis { Dim::Whole } else { Dim::Loop(l) })
                .collect();
            // The inputs carry the axis loop (fixed below, so that a split is refused with its
            // reason); the results keep the axis whole.
            let carried = OpDims::identity(x.len());
            d.inputs = ins
                .iter()
                .map(|s| s.as_ref().map(|_| carried.clone()))
                .collect();
            d.outputs = outs.iter().map(|_| dims.clone()).collect();
            d.fix(
                axis,
                format!("dimension {axis} is the {} axis", node.op.name()),
            );
            d
        }
        StridedSlice | StridedSliceGrad => {
            // Dimensions the slice does not touch may be split.
            let (full, sliced) = if node.op == StridedSlice {
                (in_shape(0)?, out0.clone())
            } else {
                (out0.clone(), in_shape(0)?)
            };
            let mut d = OpDims::with_loops(full.clone());
            let dims: Vec<Dim> = (0..full.len())
                .map(|l| {
                    if full[l] == sliced[l] {
                        Dim::Loop(l)
                    } else {
                        Dim::Whole
                    }
                })
                .collect();
            // The full-size side carries every loop (the sliced ones fixed below, so that a
            // split is refused with its reason).
            if node.op == StridedSlice {
                d.inputs = vec![Some(OpDims::identity(full.len()))];
                d.inputs.extend((1..ins.len()).map(|_| None));
                d.outputs = vec![dims.clone()];
            } else {
                d.inputs = ins
                    .iter()
                    .map(|s| s.as_ref().map(|_| dims.clone()))
                    .collect();
                d.outputs = vec![OpDims::identity(full.len())];
            }
            for l in 0..full.len() {
                if full[l] != sliced[l] {
                    d.fix(l, format!("dimension {l} is sliced"));
                }
            }
            d
        }
        BroadcastTo => {
            let x = in_shape(0)?;
            let mut d = OpDims::with_loops(out0.clone());
            d.inputs = vec![Some(broadcast_dims(&x, &out0)), None];
            d.outputs = vec![OpDims::identity(out0.len())];
            d
        }
        SoftmaxCrossEntropyWithLogits => {
            let x = in_shape(0)?;
            let mut d = OpDims::with_loops(x.clone());
            d.inputs = vec![Some(vec![Dim::Loop(0), Dim::Loop(1)]); 2];
            d.outputs = vec![vec![Dim::Loop(0)], vec![Dim::Loop(0), Dim::Loop(1)]];
            d.fix(1, "dimension 1 is the class axis of the softmax");
            d
        }
        SparseSoftmaxCrossEntropyWithLogits => {
            let x = in_shape(0)?;
            let mut d = OpDims::with_loops(x.clone());
            d.inputs = vec![
                Some(vec![Dim::Loop(0), Dim::Loop(1)]),
                Some(vec![Dim::Loop(0)]),
            ];
            d.outputs = vec![if node.attrs.bool_or("is_grad", false) {
                vec![Dim::Loop(0), Dim::Loop(1)]
            } else {
                Vec::new()
            }];
            d.combine[0] = Some(ReduceOp::Sum);
            d.mean_loops.push(0);
            d.fix(1, "dimension 1 is the class axis of the softmax");
            d
        }
        TupleGetItem | AllReduce | AllGather | ReduceScatter | AllToAll | Broadcast | Send
        | Receive => {
            return Err(err(format!(
                "{} has no strategy of its own (it is plumbing or communication)",
                node.op.name()
            )))
        }
    };
    Ok(d)
}

fn conv_dims(
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

/// Reshape: dimensions are matched in groups of equal running products; the leading non-1
/// dimension of each input group may be split, and carries its split to the leading non-1
/// dimension of the matching output group.
fn reshape_dims(x: &[usize], out: &[usize], n_inputs: usize) -> OpDims {
    let mut d = OpDims::with_loops(x.to_vec());
    let mut out_dims = vec![Dim::Whole; out.len()];
    let (mut i, mut j) = (0usize, 0usize);
    while i < x.len() || j < out.len() {
        // One group: advance both sides until the products match (and are non-trivial).
        let (gi, gj) = (i, j);
        let (mut pi, mut pj) = (1usize, 1usize);
        loop {
            if pi <= pj && i < x.len() {
                pi *= x[i];
                i += 1;
            } else if j < out.len() {
                pj *= out[j];
                j += 1;
            } else if i < x.len() {
                pi *= x[i];
                i += 1;
            } else {
                break;
            }
            if pi == pj
                && (i == x.len() || x[i] != 1 || pi != 1)
                && (j == out.len() || out[j] != 1 || pj != 1)
            {
                break;
            }
        }
        let head_in = (gi..i).find(|&k| x[k] != 1);
        let head_out = (gj..j).find(|&k| out[k] != 1);
        for k in gi..i {
            if Some(k) != head_in || head_out.is_none() {
                d.fix(
                    k,
                    format!(
                        "dimension {k} is not the leading dimension of its group in the reshape"
                    ),
                );
            }
        }
        if let (Some(hi), Some(ho)) = (head_in, head_out) {
            out_dims[ho] = Dim::Loop(hi);
        }
        if i == gi && j == gj {
            break;
        }
    }
    d.inputs = vec![Some(OpDims::identity(x.len()))];
    d.inputs.extend((1..n_inputs).map(|_| None));
    d.outputs = vec![out_dims];
    d
}
