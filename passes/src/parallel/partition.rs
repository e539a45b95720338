//! Partition: one graph per rank.
//!
//! Every parameter becomes its rank's block (a weight's initializer becomes an
//! [`Init::Block`] of the logical initializer, so the blocks of all ranks assemble to the
//! single-device weight); every op runs on its local blocks; wherever a value's layout differs
//! from the one its user needs, the [`plan`]'s collectives and slices are inserted with this
//! rank's concrete groups (`rank_list`, `group_ranks`, `group` = size and a hash of the
//! list). Every returned value is made whole on every rank (the loss first).
//!
//! Inserted ops are named for why they exist: `forward_op_<producer>_*` completes an op's own
//! partial result, `mirror_grad_<weight>_*` sums a weight's gradient over the devices that saw
//! different parts of the batch, `redistribution_op_<producer>_<user>_*` converts between two
//! layouts; each carries a comment naming the edge and the rule.

use super::assignment::{Assignment, Decision};
use super::redistribute::{group, placement, plan, Placement, Plan, Step};
use super::roles::gradient_accumulation;
use super::simplify::simplify;
use super::{ParallelError, ParallelOptions};
use crate::infer;
use rayon::prelude::*;
use shardc_ir::spmd::{slice_bounds, Patch, SpmdProgram};
use shardc_ir::{
    Attr, Const, Graph, Init, Node, OpClass, OpKind, Operand, Param, ParamKind, TensorLayout,
    TensorType, Type,
};
use std::collections::HashMap;

pub use shardc_ir::spmd::{comm_attrs, group_name};

fn shape_const(s: &[usize]) -> Operand {
    Operand::Const(Const::Ints(s.iter().map(|&x| x as i64).collect()))
}

/// Why a redistribution exists (for its name and comment).
struct Edge {
    producer: String,
    user: String,
    input: usize,
    /// The weight whose gradient this is, when the user is that weight's optimizer update.
    mirror_of: Option<String>,
    /// Whether the producer is a parameter the parallel optimizer split (its gathers are
    /// named `parallel_optimizer_allgather_<weight>_*`, as MindSpore's).
    optimizer_shard: bool,
}

/// A conversion a value needs before one or more users: the same on every rank.
struct Conversion {
    plan: Plan,
    edge: Edge,
    /// `edge: producer -> user input k: FROM -> TO`, the comment on each inserted op.
    text: String,
    /// The conversion whose result this one starts from, instead of the value itself: a
    /// partial value is completed once, for its first reader, and every other reader converts
    /// from that completed value, so that all of them see the same sums (sums completed by
    /// different groups round differently, and `Equal(x, ReduceMax(x))` would then miss).
    after: Option<usize>,
}

/// What every edge of the logical graph needs, computed once for all ranks: for each node
/// input and each returned value, the conversion it needs (if any). Two users that need one
/// value in the same placement share one conversion.
pub struct Edges {
    /// Per node: `strategy from: ...`, the comment every rank's copy carries.
    sources: Vec<String>,
    inputs: Vec<Vec<Option<usize>>>,
    outputs: Vec<Option<usize>>,
    convs: Vec<Conversion>,
}

/// A hashable name of a logical operand (constants never need conversions).
fn operand_key(o: &Operand) -> Option<(u8, u32)> {
    match o {
        Operand::Node(n) => Some((0, n.0)),
        Operand::Param(p) => Some((1, p.0)),
        Operand::Const(_) => None,
    }
}

fn producer_name(g: &Graph, o: &Operand) -> String {
    match o {
        Operand::Param(p) => g.param(*p).name.clone(),
        Operand::Node(n) => {
            let node = g.node(*n);
            if node.op == OpKind::TupleGetItem {
                if let Some(Operand::Node(src)) = node.inputs.first() {
                    return g.node(*src).instance.clone();
                }
            }
            node.instance.clone()
        }
        Operand::Const(_) => String::new(),
    }
}

struct EdgeBuilder<'a> {
    g: &'a Graph,
    opts: &'a ParallelOptions,
    edges: Edges,
    /// Conversions made, by (value, target placement, whether it completes a weight's
    /// gradient for its update): a mirror is never shared with an ordinary user, since it
    /// may be scaled (`gradients_mean` false) and is bucketed by `grad_fusion`.
    by_target: HashMap<((u8, u32), Placement, bool), usize>,
    plans: HashMap<(TensorLayout, TensorLayout, usize), Plan>,
    /// Per partial value: the conversion that completed it first and the layout it gave.
    completions: HashMap<(u8, u32), (usize, TensorLayout)>,
    /// Per parameter: whether the parallel optimizer split it.
    optimizer_sharded: Vec<bool>,
}

impl EdgeBuilder<'_> {
    /// The conversion `o` (in `have`) needs to be in `want`, if any.
    fn need(
        &mut self,
        o: &Operand,
        have: TensorLayout,
        want: TensorLayout,
        user: &str,
        input: usize,
        mirror_of: Option<&String>,
    ) -> Option<usize> {
        let key = operand_key(o)?;
        let target = placement(&want);
        if placement(&have) == target {
            return None;
        }
        let mirror = mirror_of.is_some() && have.is_partial();
        if let Some(&c) = self.by_target.get(&(key, target.clone(), mirror)) {
            return Some(c);
        }
        // A partial value completed before: convert from what that completion gave.
        let (have, after) = match self.completions.get(&key) {
            Some((first, done)) if have.is_partial() && !mirror => (done.clone(), Some(*first)),
            _ => (have, None),
        };
        let bytes = self
            .g
            .operand_tensor_type(o)
            .map(|t| t.dtype.size_bytes())
            .unwrap_or(4);
        let pkey = (have.clone(), want.clone(), bytes);
        let plan = match self.plans.get(&pkey) {
            Some(p) => p.clone(),
            None => {
                let direct = plan(&have, &want, bytes, self.opts.enable_alltoall);
                let p = simplify(
                    direct,
                    &have.slice_shape(),
                    bytes,
                    self.opts.enable_alltoall,
                );
                self.plans.insert(pkey, p.clone());
                p
            }
        };
        let edge = Edge {
            producer: producer_name(self.g, o),
            user: user.to_string(),
            input,
            mirror_of: if have.is_partial() {
                mirror_of.cloned()
            } else {
                None
            },
            optimizer_shard: matches!(o, Operand::Param(p) if self.optimizer_sharded.get(p.index()).copied().unwrap_or(false)),
        };
        let id = self.edges.convs.len();
        let text = format!(
            "edge: {} -> {} input {}: {} -> {}{}",
            edge.producer,
            edge.user,
            edge.input,
            have,
            want,
            if after.is_some() {
                " (from the value as completed for its first reader)"
            } else {
                ""
            }
        );
        if have.is_partial() && !mirror {
            self.completions.insert(key, (id, want));
        }
        self.edges.convs.push(Conversion {
            plan,
            edge,
            text,
            after,
        });
        self.by_target.insert((key, target, mirror), id);
        Some(id)
    }
}

/// The conversions of every edge of `g` under `a`, for all ranks.
pub fn edges(g: &Graph, a: &Assignment, opts: &ParallelOptions) -> Edges {
    let mut b = EdgeBuilder {
        g,
        opts,
        edges: Edges {
            sources: a
                .decisions
                .iter()
                .map(|d| {
                    d.as_ref()
                        .map(|d| format!("strategy from: {}", d.source))
                        .unwrap_or_default()
                })
                .collect(),
            inputs: vec![Vec::new(); g.nodes.len()],
            outputs: Vec::new(),
            convs: Vec::new(),
        },
        by_target: HashMap::new(),
        plans: HashMap::new(),
        completions: HashMap::new(),
        optimizer_sharded: (0..g.params.len())
            .map(|p| a.optimizer_shard_of(p).is_some())
            .collect(),
    };
    // Per node: the weight whose gradient it reduces into, when its partial operands are a
    // weight's gradient terms (an optimizer update, and the Adds that accumulate its
    // gradient over micro-batches or several reads): those completions are the weight's
    // mirrors.
    let mut mirror_target: Vec<Option<String>> = vec![None; g.nodes.len()];
    let users = g.users();
    for (i, node) in g.nodes.iter().enumerate() {
        if node.op.class() != OpClass::Optimizer {
            continue;
        }
        let Some(Operand::Param(p)) = node.inputs.first() else {
            continue;
        };
        let name = g.param(*p).name.clone();
        for add in gradient_accumulation(g, &users, i) {
            mirror_target[add] = Some(name.clone());
        }
        mirror_target[i] = Some(name);
    }
    for (i, node) in g.nodes.iter().enumerate() {
        let Some(d) = a.decisions[i].as_ref() else {
            continue;
        };
        let mirror_of = mirror_target[i].clone();
        let mut ins = Vec::with_capacity(node.inputs.len());
        for (j, o) in node.inputs.iter().enumerate() {
            let need = match (a.operand_layout(g, o), d.sharding.inputs[j].clone()) {
                (Some(have), Some(want)) => {
                    b.need(o, have, want, &node.instance, j, mirror_of.as_ref())
                }
                _ => None,
            };
            ins.push(need);
        }
        b.edges.inputs[i] = ins;
    }
    for (k, o) in g.outputs.iter().enumerate() {
        let need = a.operand_layout(g, o).and_then(|have| {
            let want = TensorLayout::replicated(&have.tensor_shape, opts.device_num);
            b.need(o, have, want, "Return", k, None)
        });
        b.edges.outputs.push(need);
    }
    b.edges
}

struct RankBuilder<'a> {
    opts: &'a ParallelOptions,
    edges: &'a Edges,
    rank: usize,
    out: Graph,
    /// Per logical node: its value in the rank graph.
    values: Vec<Option<Operand>>,
    /// Per conversion: its result in the rank graph, once made.
    converted: Vec<Option<Operand>>,
    counter: usize,
    /// The scope of the logical node being partitioned (inserted ops take it).
    scope: String,
    /// What of the rank graph depends on the rank, as computed from the rank id (the
    /// program's [`Patch`]es, recorded while building any rank's graph).
    patches: Vec<Patch>,
}

impl RankBuilder<'_> {
    /// Appends `node`, typed by the shape rules.
    fn emit(&mut self, mut node: Node) -> Result<Operand, ParallelError> {
        node.ty = self.infer(&node)?;
        Ok(Operand::Node(self.out.push_node(node)))
    }

    /// Appends `node` with the type its layouts give. Debug builds (and so the tests) check it
    /// against the shape rules; release builds trust the layouts, which keeps partitioning
    /// many ranks fast.
    fn emit_typed(&mut self, mut node: Node, ty: Type) -> Result<Operand, ParallelError> {
        if cfg!(debug_assertions) {
            let inferred = self.infer(&node)?;
            if inferred != ty {
                return Err(ParallelError::Partition {
                    rank: self.rank,
                    instance: node.instance.clone(),
                    reason: format!(
                        "the layouts give {ty:?} but the shape rules give {inferred:?}"
                    ),
                });
            }
        }
        node.ty = ty;
        Ok(Operand::Node(self.out.push_node(node)))
    }

    fn infer(&self, node: &Node) -> Result<Type, ParallelError> {
        infer::infer_node(&self.out, node).map_err(|e| ParallelError::Partition {
            rank: self.rank,
            instance: node.instance.clone(),
            reason: e.to_string(),
        })
    }

    /// The type of a rank graph operand.
    fn type_of(&self, x: &Operand) -> Option<Type> {
        match x {
            Operand::Node(n) => Some(self.out.node(*n).ty.clone()),
            Operand::Param(p) => Some(Type::Tensor(self.out.param(*p).ty.clone())),
            Operand::Const(_) => None,
        }
    }

    fn map_operand(&self, o: &Operand) -> Operand {
        match o {
            Operand::Node(n) => self.values[n.index()].clone().expect("earlier node mapped"),
            other => other.clone(),
        }
    }

    fn redistribute(&mut self, x: Operand, conv: usize) -> Result<Operand, ParallelError> {
        if let Some(v) = &self.converted[conv] {
            return Ok(v.clone());
        }
        let edges = self.edges;
        let c = &edges.convs[conv];
        let (p, edge, edge_text) = (&c.plan, &c.edge, &c.text);
        let mut x = match c.after {
            Some(first) => self.redistribute(x, first)?,
            None => x,
        };
        for (k, step) in p.steps.iter().enumerate() {
            self.counter += 1;
            let c = self.counter;
            let space = match step {
                Step::AllReduce { space, .. }
                | Step::ReduceScatter { space, .. }
                | Step::AllGather { space, .. }
                | Step::Slice { space, .. }
                | Step::AllToAll { space, .. } => *space,
            };
            let primes = &p.spaces[space];
            let before: Vec<usize> = if k == 0 {
                self.out_shape(&x)
            } else {
                p.shapes[k - 1].clone()
            };
            let completes = matches!(step, Step::AllReduce { .. } | Step::ReduceScatter { .. });
            let name = |what: &str| -> String {
                if completes {
                    match &edge.mirror_of {
                        Some(w) => format!("mirror_grad_{w}_{what}{c}"),
                        None => format!("forward_op_{}_{what}{c}", edge.producer),
                    }
                } else if edge.optimizer_shard {
                    format!("parallel_optimizer_allgather_{}_{what}{c}", edge.producer)
                } else {
                    format!(
                        "redistribution_op_{}_{}_{what}{c}",
                        edge.producer, edge.user
                    )
                }
            };
            let (node, group_size, rule) = match step {
                Step::AllReduce { axes, op, .. } => {
                    let (ranks, _) = group(primes, axes, self.rank);
                    let mut n = Node::new(OpKind::AllReduce, vec![x.clone()]);
                    n.attrs = comm_attrs(&ranks)
                        .with("op", Attr::Str(op.name().into()))
                        .with("fusion", Attr::Int(0));
                    n.instance = name("AllReduce");
                    (
                        n,
                        ranks.len(),
                        "the value is partial over these devices (a split contraction): sum the terms",
                    )
                }
                Step::ReduceScatter { dim, axes, op, .. } => {
                    let (ranks, _) = group(primes, axes, self.rank);
                    let mut n = Node::new(OpKind::ReduceScatter, vec![x.clone()]);
                    n.attrs = comm_attrs(&ranks)
                        .with("op", Attr::Str(op.name().into()))
                        .with("axis", Attr::Int(*dim as i64));
                    n.instance = name("ReduceScatter");
                    (
                        n,
                        ranks.len(),
                        "partial over the devices that the user splits this dimension by: reduce and keep one's own block",
                    )
                }
                Step::AllGather { dim, axes, .. } => {
                    let (ranks, _) = group(primes, axes, self.rank);
                    let mut n = Node::new(OpKind::AllGather, vec![x.clone()]);
                    n.attrs = comm_attrs(&ranks).with("axis", Attr::Int(*dim as i64));
                    n.instance = name("AllGather");
                    (
                        n,
                        ranks.len(),
                        if edge.optimizer_shard {
                            "the parallel optimizer keeps this weight split over its data-parallel group: gather it for its reader"
                        } else {
                            "the user needs this dimension less split: gather the blocks"
                        },
                    )
                }
                Step::AllToAll {
                    split_dim,
                    concat_dim,
                    axes,
                    ..
                } => {
                    let (ranks, _) = group(primes, axes, self.rank);
                    let mut n = Node::new(OpKind::AllToAll, vec![x.clone()]);
                    n.attrs = comm_attrs(&ranks)
                        .with("split_dim", Attr::Int(*split_dim as i64))
                        .with("concat_dim", Attr::Int(*concat_dim as i64))
                        .with("split_count", Attr::Int(ranks.len() as i64));
                    n.instance = name("AlltoAll");
                    (
                        n,
                        ranks.len(),
                        "the split moves from one dimension to another: exchange blocks",
                    )
                }
                Step::Slice { dim, axes, .. } => {
                    // The bounds as the program computes them for any rank.
                    let (begin, end) = slice_bounds(primes, axes, *dim, &before, self.rank)
                        .map_err(|reason| ParallelError::Partition {
                            rank: self.rank,
                            instance: edge.user.clone(),
                            reason,
                        })?;
                    let n = Node::new(
                        OpKind::StridedSlice,
                        vec![
                            x.clone(),
                            Operand::Const(Const::Ints(begin)),
                            Operand::Const(Const::Ints(end)),
                            Operand::Const(Const::Ints(vec![1; before.len()])),
                        ],
                    );
                    let mut n = n;
                    n.instance = name("StridedSlice");
                    (
                        n,
                        1,
                        "the user needs this dimension more split: keep one's own block (no communication)",
                    )
                }
            };
            let mut node = node;
            if matches!(step, Step::Slice { .. }) || group_size > 1 {
                node.comments.push(edge_text.clone());
                node.comments.push(format!("rule: {rule}"));
                node.scope = self.scope.clone();
                let dtype = self
                    .out
                    .operand_tensor_type(&x)
                    .map_or(shardc_ir::DType::Float32, |t| t.dtype);
                let ty = Type::Tensor(TensorType::new(dtype, p.shapes[k].clone()));
                x = self.emit_typed(node, ty)?;
                let id = self.out.nodes.len() as u32 - 1;
                self.patches.push(match step {
                    Step::Slice { dim, axes, .. } => Patch::Slice {
                        node: id,
                        primes: primes.clone(),
                        axes: axes.clone(),
                        dim: *dim,
                        shape: before.clone(),
                    },
                    Step::AllReduce { axes, .. }
                    | Step::ReduceScatter { axes, .. }
                    | Step::AllGather { axes, .. }
                    | Step::AllToAll { axes, .. } => Patch::Group {
                        node: id,
                        primes: primes.clone(),
                        axes: axes.clone(),
                    },
                });
                if completes && edge.mirror_of.is_some() && !self.opts.gradients_mean {
                    let ty_x = self.type_of(&x).expect("a node's type");
                    let mut m = Node::new(
                        OpKind::Mul,
                        vec![x, Operand::Const(Const::Float(group_size as f64))],
                    );
                    m.instance = format!("mirror_grad_sum_{c}");
                    m.comments.push(
                        "gradients_mean is false: the sum of the replicas' gradients, each of its own local-mean loss (MindSpore's convention)"
                            .into(),
                    );
                    m.scope = self.scope.clone();
                    x = self.emit_typed(m, ty_x)?;
                }
            }
        }
        self.converted[conv] = Some(x.clone());
        Ok(x)
    }

    /// Emits a window op (a convolution or pool, or a gradient of one) whose output rows /
    /// columns are split (see [`spatial_window`]): the input it reads (x) is sliced to the
    /// window, the padding is the window's, and the ops that return dx (Conv2DBackpropInput,
    /// MaxPoolGrad, AvgPoolGrad) place their window of dx into the whole dx (zeros elsewhere;
    /// the blocks' dx are partial sums, completed by their users' redistribution).
    fn emit_window_op(
        &mut self,
        mut n: Node,
        ty: Type,
        w: &SpatialWindow,
    ) -> Result<Operand, ParallelError> {
        use OpKind::*;
        n.attrs.set("pad_mode", Attr::Str("pad".into()));
        n.attrs.set(
            "pad",
            Attr::ints(&w.pads.iter().map(|&p| p as i64).collect::<Vec<_>>()),
        );
        n.comments.push(format!(
            "rule: a block of the output rows {}..{} and columns {}..{} reads input rows {}..{} and columns {}..{} (padding {:?})",
            w.out_rows.0, w.out_rows.1, w.out_cols.0, w.out_cols.1, w.rows.0, w.rows.1, w.cols.0, w.cols.1, w.pads
        ));
        let window_of = |shape: &[usize]| -> Vec<usize> {
            vec![shape[0], shape[1], w.rows.1 - w.rows.0, w.cols.1 - w.cols.0]
        };
        let bounds = |shape: &[usize]| -> (Vec<i64>, Vec<i64>) {
            (
                vec![0, 0, w.rows.0 as i64, w.cols.0 as i64],
                vec![
                    shape[0] as i64,
                    shape[1] as i64,
                    w.rows.1 as i64,
                    w.cols.1 as i64,
                ],
            )
        };
        // The operand that is x, sliced to the window.
        let reads_x = match n.op {
            Conv2DBackpropInput => None,
            Conv2DBackpropFilter => Some(1),
            _ => Some(0),
        };
        if let Some(k) = reads_x {
            let x = n.inputs[k].clone();
            let Some(Type::Tensor(tx)) = self.type_of(&x) else {
                return Err(self.partition_error(&n, "the input it reads is not a tensor"));
            };
            let (begin, end) = bounds(&tx.shape);
            let mut slice = Node::new(
                OpKind::StridedSlice,
                vec![
                    x,
                    Operand::Const(Const::Ints(begin)),
                    Operand::Const(Const::Ints(end)),
                    Operand::Const(Const::Ints(vec![1; 4])),
                ],
            );
            slice.instance = format!("{}_input_window", n.instance);
            slice.scope = self.scope.clone();
            slice
                .comments
                .push("rule: the input window this block of the output reads".into());
            let window = TensorType::new(tx.dtype, window_of(&tx.shape));
            n.inputs[k] = self.emit_typed(slice, Type::Tensor(window))?;
        }
        if !matches!(n.op, Conv2DBackpropInput | MaxPoolGrad | AvgPoolGrad) {
            return self.emit_typed(n, ty);
        }
        let Type::Tensor(full) = ty else {
            return Err(self.partition_error(&n, "dx has a tuple type"));
        };
        let window = window_of(&full.shape);
        if n.op == Conv2DBackpropInput && n.inputs.len() > 2 {
            n.inputs[2] = shape_const(&window);
        }
        let instance = n.instance.clone();
        let dx = self.emit_typed(n, Type::Tensor(TensorType::new(full.dtype, window)))?;
        let (begin, end) = bounds(&full.shape);
        let mut place = Node::new(
            OpKind::StridedSliceGrad,
            vec![
                dx,
                shape_const(&full.shape),
                Operand::Const(Const::Ints(begin)),
                Operand::Const(Const::Ints(end)),
                Operand::Const(Const::Ints(vec![1; 4])),
            ],
        );
        place.instance = format!("{instance}_dx_window");
        place.scope = self.scope.clone();
        place.comments.push(
            "rule: the block's dx covers the input window it read; elsewhere it is 0 (the blocks' dx sum to the whole)"
                .into(),
        );
        self.emit_typed(place, Type::Tensor(full))
    }

    /// Emits this rank's window op ([`RankBuilder::emit_window_op`]) and records, as a
    /// [`Patch::Variants`], the nodes of every distinct window the ranks' blocks give (each
    /// emitted, copied and taken back), so that any rank's graph follows from this one.
    fn emit_window_variants(
        &mut self,
        node: &Node,
        d: &Decision,
        device_num: usize,
        n: Node,
        ty: Type,
        own: &SpatialWindow,
    ) -> Result<Operand, ParallelError> {
        let base = self.out.nodes.len();
        let mut keys: Vec<Vec<(usize, usize)>> = Vec::new();
        let mut variants: Vec<Vec<Node>> = Vec::new();
        for r in 0..device_num {
            let Some(w) = spatial_window(node, d, r)? else {
                continue;
            };
            let key = vec![w.out_rows, w.out_cols];
            if keys.contains(&key) {
                continue;
            }
            self.emit_window_op(n.clone(), ty.clone(), &w)?;
            variants.push(self.out.nodes.split_off(base));
            keys.push(key);
        }
        let v = self.emit_window_op(n, ty, own)?;
        let count = self.out.nodes.len() - base;
        if keys.len() > 1 {
            let layout = window_output_layout(node, d).ok_or_else(|| {
                self.partition_error(node, "the window op's output has no layout")
            })?;
            self.patches.push(Patch::Variants {
                nodes: (base..base + count).map(|i| i as u32).collect(),
                layout,
                dims: vec![2, 3],
                keys,
                variants,
            });
        }
        Ok(v)
    }

    fn partition_error(&self, n: &Node, reason: &str) -> ParallelError {
        ParallelError::Partition {
            rank: self.rank,
            instance: n.instance.clone(),
            reason: reason.into(),
        }
    }

    fn out_shape(&self, x: &Operand) -> Vec<usize> {
        self.out
            .operand_tensor_type(x)
            .map(|t| t.shape.clone())
            .unwrap_or_default()
    }
}

/// Where a window op's block of output rows and columns reads its input: the output block,
/// the input window (clipped to the input) and the padding that window needs
/// `(top, bottom, left, right)`.
struct SpatialWindow {
    out_rows: (usize, usize),
    out_cols: (usize, usize),
    rows: (usize, usize),
    cols: (usize, usize),
    pads: [usize; 4],
}

/// The layout whose block decides a window op's window: its output, or the dy it reads.
fn window_output_layout(node: &Node, d: &Decision) -> Option<TensorLayout> {
    use OpKind::*;
    let input = |i: usize| d.sharding.inputs.get(i).cloned().flatten();
    match node.op {
        Conv2D | MaxPool | AvgPool => d.sharding.outputs.first().cloned(),
        Conv2DBackpropInput | Conv2DBackpropFilter => input(0),
        _ => input(1),
    }
}

/// The window of a Conv2D, MaxPool or AvgPool (or one of their gradients) whose output (dy)
/// rows or columns are split (the last two loops of its `dims`), for `rank`; `None` when
/// neither is split.
fn spatial_window(
    node: &Node,
    d: &Decision,
    rank: usize,
) -> Result<Option<SpatialWindow>, ParallelError> {
    use OpKind::*;
    let is_pool = matches!(node.op, MaxPool | AvgPool | MaxPoolGrad | AvgPoolGrad);
    if !(is_pool || matches!(node.op, Conv2D | Conv2DBackpropInput | Conv2DBackpropFilter))
        || d.sharding.loop_splits.iter().rev().take(2).all(|&s| s <= 1)
    {
        return Ok(None);
    }
    let fail = |reason: String| ParallelError::Partition {
        rank,
        instance: node.instance.clone(),
        reason,
    };
    let input = |i: usize| d.sharding.inputs.get(i).cloned().flatten();
    let output = || d.sharding.outputs.first().cloned();
    // The layouts of the output (or dy), x and the convolution's weight.
    let (y, x, w) = match node.op {
        Conv2D => (output(), input(0), input(1)),
        Conv2DBackpropInput => (input(0), output(), input(1)),
        Conv2DBackpropFilter => (input(0), input(1), output()),
        MaxPool | AvgPool => (output(), input(0), None),
        _ => (input(1), input(0), None),
    };
    let (Some(y), Some(x)) = (y, x) else {
        return Err(fail("an operand has no layout".into()));
    };
    // Per spatial axis: (stride, dilation, kernel, padding before, input size).
    let axes = if is_pool {
        let g = shardc_ir::geometry::pool2d_geometry(node, &x.tensor_shape)
            .map_err(|e| fail(e.reason))?;
        [
            (g.stride_h, 1, g.kh, g.pad_top, g.h),
            (g.stride_w, 1, g.kw, g.pad_left, g.w),
        ]
    } else {
        let w = w.ok_or_else(|| fail("the weight has no layout".into()))?;
        let g = shardc_ir::geometry::conv2d_geometry(node, &x.tensor_shape, &w.tensor_shape)
            .map_err(|e| fail(e.reason))?;
        [
            (g.stride_h, g.dil_h, g.kh, g.pad_top, g.h),
            (g.stride_w, g.dil_w, g.kw, g.pad_left, g.w),
        ]
    };
    let block = y.block(rank);
    let (Some(r), Some(c)) = (block.get(2), block.get(3)) else {
        return Err(fail("the result is not 4-d".into()));
    };
    // Input positions [start, end) that output positions [o0, o1) read, padding included:
    // the window [lo, hi) of the input, and the padding before and after it.
    type Window = ((usize, usize), usize, usize);
    let window = |what: &str,
                  (o0, o1): (usize, usize),
                  (stride, dil, k, pad, n): (usize, usize, usize, usize, usize)|
     -> Result<Window, ParallelError> {
        let start = (o0 * stride) as i64 - pad as i64;
        let end = ((o1 - 1) * stride + (k - 1) * dil + 1) as i64 - pad as i64;
        let (lo, hi) = (start.max(0), end.min(n as i64));
        if lo >= hi {
            return Err(fail(format!(
                "output {what} {o0}..{o1} read only padding; split the {what} fewer ways"
            )));
        }
        Ok((
            (lo as usize, hi as usize),
            (lo - start) as usize,
            (end - hi) as usize,
        ))
    };
    let (rows, top, bottom) = window("rows", (r.start, r.end), axes[0])?;
    let (cols, left, right) = window("columns", (c.start, c.end), axes[1])?;
    Ok(Some(SpatialWindow {
        out_rows: (r.start, r.end),
        out_cols: (c.start, c.end),
        rows,
        cols,
        pads: [top, bottom, left, right],
    }))
}

/// Marks a local op with the block of `layout` this rank holds: `global_shape` (the logical
/// shape) and `offset` (the block's first index per dimension): see [`shardc_ir::block`].
/// (The program records it as a [`Patch::NodeBlock`].)
fn mark_block(node: &mut Node, layout: &TensorLayout, rank: usize) {
    shardc_ir::block::Block {
        global_shape: layout.tensor_shape.clone(),
        offset: layout.block(rank).iter().map(|r| r.start).collect(),
    }
    .set_on(&mut node.attrs);
}

fn localize(node: &mut Node, d: &Decision, rank: usize) -> Option<TensorLayout> {
    let mut marked = None;
    let out_local = d
        .sharding
        .outputs
        .first()
        .map(TensorLayout::slice_shape)
        .unwrap_or_default();
    match node.op {
        OpKind::Reshape | OpKind::BroadcastTo | OpKind::StridedSliceGrad
            if node.inputs.len() > 1 =>
        {
            node.inputs[1] = shape_const(&out_local);
        }
        OpKind::Conv2D | OpKind::Conv2DBackpropFilter | OpKind::Conv2DBackpropInput => {
            // `out_channel` counts the local output channels of the convolution.
            let local = match node.op {
                OpKind::Conv2D => out_local.get(1).copied(),
                OpKind::Conv2DBackpropFilter => out_local.first().copied(),
                _ => d
                    .sharding
                    .inputs
                    .first()
                    .cloned()
                    .flatten()
                    .and_then(|l| l.slice_shape().get(1).copied()),
            };
            if let Some(c) = local {
                node.attrs.set("out_channel", Attr::Int(c as i64));
            }
            if node.op != OpKind::Conv2D && node.inputs.len() > 2 {
                node.inputs[2] = shape_const(&out_local);
            }
        }
        OpKind::Gather => {
            // A table split along the gathered axis: this rank holds rows `offset[axis]..`; the
            // kernel checks indices against the global table and gives zeros for rows it
            // does not hold.
            let axis = node
                .inputs
                .get(2)
                .and_then(Operand::as_const)
                .and_then(Const::as_int)
                .unwrap_or(0);
            if let Some(table) = d.sharding.inputs.first().cloned().flatten() {
                let rank_of_table = table.tensor_shape.len();
                let axis = infer::normalize_axis(axis, rank_of_table).unwrap_or(0);
                if table.splits().get(axis).copied().unwrap_or(1) > 1 {
                    mark_block(node, &table, rank);
                    marked = Some(table);
                }
            }
        }
        OpKind::UnsortedSegmentSum => {
            // A split segment dimension: this rank sums segments `offset[0]..` only.
            if let Some(out) = d.sharding.outputs.first() {
                if out.splits().first().copied().unwrap_or(1) > 1 {
                    mark_block(node, out, rank);
                    marked = Some(out.clone());
                    if let Some(&n) = out_local.first() {
                        if node.inputs.len() > 2 {
                            node.inputs[2] = Operand::Const(Const::Int(n as i64));
                        }
                    }
                }
            }
        }
        OpKind::Dropout => {
            if let Some(l) = d.sharding.outputs.first() {
                if l.splits().iter().any(|&s| s > 1) {
                    mark_block(node, l, rank);
                    marked = Some(l.clone());
                }
            }
        }
        _ => {}
    }
    // Full-range bounds of a split dimension shrink to the local size.
    let bounds = match node.op {
        OpKind::StridedSlice => Some((1, 2, d.sharding.inputs.first().cloned().flatten())),
        OpKind::StridedSliceGrad => Some((2, 3, d.sharding.outputs.first().cloned())),
        _ => None,
    };
    if let Some((bi, ei, Some(full))) = bounds {
        let splits = full.splits();
        let local = full.slice_shape();
        if let Some(Operand::Const(Const::Ints(end))) = node.inputs.get(ei).cloned() {
            let end: Vec<i64> = end
                .iter()
                .enumerate()
                .map(|(k, &e)| {
                    if splits.get(k).copied().unwrap_or(1) > 1 {
                        local[k] as i64
                    } else {
                        e
                    }
                })
                .collect();
            node.inputs[ei] = Operand::Const(Const::Ints(end));
        }
        debug_assert!(bi < ei);
    }
    marked
}

/// The graph of one rank.
pub fn rank_graph(
    g: &Graph,
    a: &Assignment,
    opts: &ParallelOptions,
    rank: usize,
) -> Result<Graph, ParallelError> {
    rank_graph_with(g, a, opts, &edges(g, a, opts), rank)
}

/// As [`rank_graph`], with the edges' conversions already planned (see [`edges`]).
pub fn rank_graph_with(
    g: &Graph,
    a: &Assignment,
    opts: &ParallelOptions,
    edges: &Edges,
    rank: usize,
) -> Result<Graph, ParallelError> {
    rank_graph_and_patches(g, a, opts, edges, rank).map(|(graph, _)| graph)
}

/// The program every rank runs ([`SpmdProgram`]): rank 0's graph and what differs per rank,
/// with the edges' conversions planned once.
pub fn program(
    g: &Graph,
    a: &Assignment,
    opts: &ParallelOptions,
) -> Result<SpmdProgram, ParallelError> {
    let edges = edges(g, a, opts);
    let (template, patches) = rank_graph_and_patches(g, a, opts, &edges, 0)?;
    Ok(SpmdProgram {
        device_num: opts.device_num,
        template,
        patches,
        stages: Vec::new(),
    })
}

/// Rank `rank`'s graph, and the patches that turn it into any other rank's.
fn rank_graph_and_patches(
    g: &Graph,
    a: &Assignment,
    opts: &ParallelOptions,
    edges: &Edges,
    rank: usize,
) -> Result<(Graph, Vec<Patch>), ParallelError> {
    let mut out = Graph::new(g.name.clone());
    let mut patches = Vec::new();
    for (pi, (p, l)) in g.params.iter().zip(&a.param_layouts).enumerate() {
        let local = TensorType::new(p.ty.dtype, l.slice_shape());
        let kind = match &p.kind {
            ParamKind::Input => ParamKind::Input,
            ParamKind::Weight {
                init,
                requires_grad,
            } => {
                let init = if l.splits().iter().all(|&s| s == 1) {
                    init.clone()
                } else {
                    patches.push(Patch::ParamBlock {
                        param: pi as u32,
                        layout: l.clone(),
                    });
                    Init::Block {
                        of: Box::new(init.clone()),
                        global_shape: p.ty.shape.clone(),
                        offset: l.block(rank).iter().map(|r| r.start).collect(),
                    }
                };
                ParamKind::Weight {
                    init,
                    requires_grad: *requires_grad,
                }
            }
        };
        out.add_param(Param {
            name: p.name.clone(),
            ty: local,
            kind,
        });
    }
    // Every logical node, plus the steps of the conversions: reserved once, so that pushing
    // nodes never moves the graph.
    let steps: usize = edges.convs.iter().map(|c| c.plan.steps.len() + 1).sum();
    out.nodes.reserve(g.nodes.len() + steps);
    let mut b = RankBuilder {
        opts,
        edges,
        rank,
        out,
        values: vec![None; g.nodes.len()],
        converted: vec![None; edges.convs.len()],
        counter: 0,
        scope: String::new(),
        patches,
    };
    for (i, node) in g.nodes.iter().enumerate() {
        b.scope.clone_from(&node.scope);
        if node.op == OpKind::TupleGetItem {
            let mut n = node.clone();
            n.inputs = node.inputs.iter().map(|o| b.map_operand(o)).collect();
            b.values[i] = Some(b.emit(n)?);
            continue;
        }
        let Some(d) = a.decisions[i].as_ref() else {
            return Err(ParallelError::Partition {
                rank,
                instance: node.instance.clone(),
                reason: "the op has no strategy".into(),
            });
        };
        let mut inputs = Vec::with_capacity(node.inputs.len());
        for (j, o) in node.inputs.iter().enumerate() {
            let x = b.map_operand(o);
            match edges.inputs[i].get(j).copied().flatten() {
                Some(conv) => inputs.push(b.redistribute(x, conv)?),
                None => inputs.push(x),
            }
        }
        let mut n = Node {
            op: node.op,
            inputs,
            attrs: node.attrs.clone(),
            cnode_attrs: node.cnode_attrs.clone(),
            // Set by `emit_typed` from the layouts.
            ty: Type::Tuple(Vec::new()),
            name: node.name.clone(),
            instance: node.instance.clone(),
            scope: node.scope.clone(),
            in_strategy: Some(d.sharding.strategy.clone()),
            out_strategy: d
                .sharding
                .out_strategy
                .clone()
                .or_else(|| node.out_strategy.clone()),
            comments: node.comments.clone(),
        };
        n.comments.push(edges.sources[i].clone());
        let marked = localize(&mut n, d, rank);
        let local = |t: &TensorType, l: Option<&TensorLayout>| {
            TensorType::new(
                t.dtype,
                l.map_or_else(|| t.shape.clone(), |l| l.slice_shape()),
            )
        };
        let ty = match &node.ty {
            Type::Tensor(t) => Type::Tensor(local(t, d.sharding.outputs.first())),
            Type::Tuple(ts) => Type::Tuple(
                ts.iter()
                    .enumerate()
                    .map(|(k, t)| local(t, d.sharding.outputs.get(k)))
                    .collect(),
            ),
        };
        let mut v = match spatial_window(node, d, rank)? {
            Some(w) => b.emit_window_variants(node, d, opts.device_num, n, ty, &w)?,
            None => b.emit_typed(n, ty)?,
        };
        if let Some(layout) = marked {
            b.patches.push(Patch::NodeBlock {
                node: b.out.nodes.len() as u32 - 1,
                layout,
            });
        }
        if let Some(scale) = d.sharding.scale {
            let ty_v = b.type_of(&v).expect("a node's type");
            let mut m = Node::new(OpKind::Mul, vec![v, Operand::Const(Const::Float(scale))]);
            m.instance = format!("forward_op_{}_mean_scale", node.instance);
            m.scope = node.scope.clone();
            m.comments.push(format!(
                "rule: a mean over a split dimension is a term of the global mean after x{scale}"
            ));
            v = b.emit_typed(m, ty_v)?;
        }
        b.values[i] = Some(v);
    }
    // Every returned value whole on every rank.
    let mut outputs = Vec::with_capacity(g.outputs.len());
    for (k, o) in g.outputs.iter().enumerate() {
        let x = b.map_operand(o);
        match edges.outputs.get(k).copied().flatten() {
            Some(conv) => outputs.push(b.redistribute(x, conv)?),
            None => outputs.push(x),
        }
    }
    b.out.outputs = outputs;
    Ok((b.out, b.patches))
}

/// The graphs of all ranks, `0..device_num`.
pub fn partition(
    g: &Graph,
    a: &Assignment,
    opts: &ParallelOptions,
) -> Result<Vec<Graph>, ParallelError> {
    let edges = edges(g, a, opts);
    (0..opts.device_num)
        .into_par_iter()
        .map(|r| rank_graph_with(g, a, opts, &edges, r))
        .collect()
}
