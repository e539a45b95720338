//! The liveness-based memory plan: which buffer holds each intermediate value.
//!
//! Every element of every node result is a *value*. A value is live from its node to its last
//! use: `TupleGetItem` is an alias (no copy), so the uses of a `TupleGetItem` count as uses of
//! the tuple element it names; the graph's outputs stay live to the end of the step. `Assign`
//! results are the assigned parameter itself and take no intermediate memory.
//!
//! Values are packed into a fixed set of buffers, each of one dtype and a capacity (its
//! largest value). Two values share a buffer only when their live ranges are disjoint; a
//! node's outputs never share a buffer with its inputs. Two greedy best-fit allocators are
//! run and the one with the smaller total kept:
//!
//! - *in order*: walking the schedule, each new value takes the smallest freed buffer of its
//!   dtype that is large enough, else grows the largest freed one, else opens a new buffer;
//! - *by size*: values from largest to smallest each take the smallest buffer of their dtype
//!   whose values' live ranges do not overlap theirs, else open a new buffer.
//!
//! The buffers are allocated once; `peak_bytes` is their total and `live_peak_bytes` the
//! largest sum of live values at any point of the schedule, a lower bound for any plan.

use shardc_ir::{DType, Graph, OpKind, Operand, ParamId, ParamKind, TensorType, Type};
use std::fmt::Write as _;

/// Which allocator packs the values into buffers (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Allocator {
    /// Walk the schedule; reuse freed buffers best-fit, else grow one, else open one.
    InOrder,
    /// Largest values first, each into the smallest non-overlapping buffer.
    BySize,
    /// Run both and keep the smaller plan (what [`plan`] does).
    Best,
}

impl std::fmt::Display for Allocator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Allocator::InOrder => "in order",
            Allocator::BySize => "by size",
            Allocator::Best => "best of in order and by size",
        })
    }
}

/// Where a value lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Location {
    /// An intermediate buffer, by index into [`MemoryPlan::buffers`].
    Buffer(usize),
    /// A parameter (the result of an `Assign` is the assigned parameter).
    Param(ParamId),
}

/// One value of the plan: an element of a node's result.
#[derive(Clone, Debug, PartialEq)]
pub struct ValueInfo {
    /// Where it lives.
    pub location: Location,
    /// Its type.
    pub ty: TensorType,
    /// The node that defines the underlying buffer contents (for a `TupleGetItem`, the tuple's
    /// node).
    pub def: usize,
    /// The last node that reads it (through any alias); `graph.nodes.len()` when it is a
    /// graph output. For an `Assign` result, its own node.
    pub last_use: usize,
}

/// One intermediate buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BufferInfo {
    /// Its element type.
    pub dtype: DType,
    /// Its capacity in elements (the largest value it holds).
    pub elements: usize,
}

impl BufferInfo {
    /// Capacity in bytes.
    pub fn bytes(&self) -> usize {
        self.elements * self.dtype.size_bytes()
    }
}

/// The memory plan of a graph (see the module doc).
#[derive(Clone, Debug, PartialEq)]
pub struct MemoryPlan {
    /// Bytes of intermediate buffers allocated at once: the total capacity of all buffers.
    pub peak_bytes: usize,
    /// The largest sum, over points of the schedule, of the bytes of the live intermediate
    /// values (a lower bound for `peak_bytes`).
    pub live_peak_bytes: usize,
    /// The node index where the live bytes peak.
    pub worst_point: usize,
    /// Number of distinct buffers.
    pub buffer_count: usize,
    /// Bytes of the weight parameters.
    pub weight_bytes: usize,
    /// Bytes of the data inputs.
    pub input_bytes: usize,
    /// The buffers.
    pub buffers: Vec<BufferInfo>,
    /// For each node, for each element of its result, the value's location and live range.
    pub values: Vec<Vec<ValueInfo>>,
    /// Which allocator produced the plan ([`Allocator::InOrder`] or [`Allocator::BySize`]).
    pub allocator: Allocator,
    /// The graph's name.
    pub graph_name: String,
    /// The worst point as text: `%17 MatMul 'matmul2'`.
    pub worst_node: String,
}

impl MemoryPlan {
    /// The location of element `elem` of node `node`'s result.
    pub fn location(&self, node: usize, elem: usize) -> Option<Location> {
        self.values.get(node)?.get(elem).map(|v| v.location)
    }

    /// A human-readable report (for `shardc run --stats`).
    pub fn summary(&self) -> String {
        let mut s = String::new();
        let ratio = if self.live_peak_bytes > 0 {
            format!(
                "{:.2}",
                self.peak_bytes as f64 / self.live_peak_bytes as f64
            )
        } else {
            "-".to_string()
        };
        let nodes = self.values.len();
        let _ = writeln!(s, "memory plan of @{} ({nodes} nodes):", self.graph_name);
        let _ = writeln!(
            s,
            "  intermediate buffers: {} in {} buffers ({} allocator; {ratio}x the live peak)",
            human_bytes(self.peak_bytes),
            self.buffer_count,
            self.allocator
        );
        let _ = writeln!(
            s,
            "  live peak:            {} at {}",
            human_bytes(self.live_peak_bytes),
            if self.worst_node.is_empty() {
                "-".to_string()
            } else {
                self.worst_node.clone()
            }
        );
        let _ = writeln!(
            s,
            "  weights:              {}",
            human_bytes(self.weight_bytes)
        );
        let _ = writeln!(
            s,
            "  inputs:               {}",
            human_bytes(self.input_bytes)
        );
        let _ = write!(
            s,
            "  total:                {}",
            human_bytes(self.peak_bytes + self.weight_bytes + self.input_bytes)
        );
        s
    }
}

/// `1.50 MiB (1572864 bytes)`.
fn human_bytes(b: usize) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if b < 1024 {
        return format!("{b} B");
    }
    let mut v = b as f64;
    let mut unit = "B";
    for u in UNITS {
        if v < 1024.0 {
            break;
        }
        v /= 1024.0;
        unit = u;
    }
    format!("{v:.2} {unit} ({b} bytes)")
}

/// `%3 MatMul 'matmul2'` (without the quote part when the node has no instance name).
pub(crate) fn node_text(graph: &Graph, index: usize) -> String {
    match graph.nodes.get(index) {
        Some(n) if n.instance.is_empty() => format!("%{} {}", index + 1, n.op),
        Some(n) => format!("%{} {} '{}'", index + 1, n.op, n.instance),
        None => format!("%{}", index + 1),
    }
}

/// An allocation: the buffers and, for each root value, its buffer.
struct Allocation {
    buffers: Vec<BufferInfo>,
    assigned: Vec<usize>,
}

impl Allocation {
    fn total(&self) -> usize {
        self.buffers.iter().map(BufferInfo::bytes).sum()
    }
}

/// A value that needs its own storage.
struct Root {
    dtype: DType,
    elements: usize,
    def: usize,
    last: usize,
}

/// Walks the schedule: freed buffers are reused best-fit, grown, or new ones opened.
fn allocate_in_order(roots: &[Root], by_node: &[Vec<usize>], n: usize) -> Allocation {
    let mut buffers: Vec<BufferInfo> = Vec::new();
    let mut assigned = vec![usize::MAX; roots.len()];
    let mut free: Vec<usize> = Vec::new();
    // Roots whose last use is at each point.
    let mut dying: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (r, root) in roots.iter().enumerate() {
        if root.last < n {
            dying[root.last].push(r);
        }
    }
    for i in 0..n {
        for &r in &by_node[i] {
            let root = &roots[r];
            let same: Vec<(usize, usize)> = free
                .iter()
                .enumerate()
                .filter(|(_, &b)| buffers[b].dtype == root.dtype)
                .map(|(k, &b)| (k, b))
                .collect();
            let fit = same
                .iter()
                .filter(|(_, b)| buffers[*b].elements >= root.elements)
                .min_by_key(|(_, b)| buffers[*b].elements);
            let grow = same.iter().max_by_key(|(_, b)| buffers[*b].elements);
            let b = match fit.or(grow) {
                Some(&(k, b)) => {
                    free.swap_remove(k);
                    if buffers[b].elements < root.elements {
                        buffers[b].elements = root.elements;
                    }
                    b
                }
                None => {
                    buffers.push(BufferInfo {
                        dtype: root.dtype,
                        elements: root.elements,
                    });
                    buffers.len() - 1
                }
            };
            assigned[r] = b;
        }
        for &r in &dying[i] {
            free.push(assigned[r]);
        }
    }
    Allocation { buffers, assigned }
}

/// Largest values first, each into the smallest buffer whose live ranges it does not overlap.
fn allocate_by_size(roots: &[Root]) -> Allocation {
    let mut order: Vec<usize> = (0..roots.len()).collect();
    order.sort_by_key(|&r| {
        (
            std::cmp::Reverse(roots[r].elements * roots[r].dtype.size_bytes()),
            roots[r].def,
        )
    });
    let mut buffers: Vec<BufferInfo> = Vec::new();
    // Per buffer: disjoint live ranges sorted by start.
    let mut ranges: Vec<Vec<(usize, usize)>> = Vec::new();
    let mut assigned = vec![usize::MAX; roots.len()];
    for r in order {
        let root = &roots[r];
        let mut best: Option<usize> = None;
        for (b, info) in buffers.iter().enumerate() {
            if info.dtype != root.dtype || info.elements < root.elements {
                continue;
            }
            let rs = &ranges[b];
            let pos = rs.partition_point(|&(d, _)| d <= root.def);
            let before_ok = pos == 0 || rs[pos - 1].1 < root.def;
            let after_ok = pos == rs.len() || rs[pos].0 > root.last;
            if before_ok && after_ok && best.is_none_or(|c| buffers[c].elements > info.elements) {
                best = Some(b);
            }
        }
        let b = match best {
            Some(b) => b,
            None => {
                buffers.push(BufferInfo {
                    dtype: root.dtype,
                    elements: root.elements,
                });
                ranges.push(Vec::new());
                buffers.len() - 1
            }
        };
        let rs = &mut ranges[b];
        let pos = rs.partition_point(|&(d, _)| d <= root.def);
        rs.insert(pos, (root.def, root.last));
        assigned[r] = b;
    }
    Allocation { buffers, assigned }
}

/// The root value (node, element) that an operand reading a node's result refers to, after
/// resolving `TupleGetItem` aliases (and, with `reshapes`, `Reshape`s of node results).
/// `None` for `Assign` results and malformed references.
fn resolve(graph: &Graph, node: usize, elem: usize, reshapes: bool) -> Option<(usize, usize)> {
    let n = graph.nodes.get(node)?;
    match n.op {
        OpKind::Reshape if reshapes => match n.inputs.first() {
            // The input's value in its own buffer: the same bytes under another shape.
            Some(Operand::Node(src))
                if src.index() < node
                    && matches!(graph.nodes[src.index()].ty, Type::Tensor(_))
                    && matches!(n.ty, Type::Tensor(_)) =>
            {
                match resolve(graph, src.index(), 0, reshapes) {
                    Some(root) => Some(root),
                    None => Some((node, elem)),
                }
            }
            _ => Some((node, elem)),
        },
        OpKind::TupleGetItem => {
            let (Some(Operand::Node(src)), Some(idx)) = (
                n.inputs.first(),
                n.inputs
                    .get(1)
                    .and_then(Operand::as_const)
                    .and_then(|c| c.as_int()),
            ) else {
                return Some((node, elem));
            };
            let src = src.index();
            let idx = usize::try_from(idx).ok()?;
            match graph.nodes.get(src) {
                Some(s) if src < node && matches!(s.ty, Type::Tuple(_)) => {
                    (idx < s.ty.tensors().len()).then_some((src, idx))
                }
                _ => Some((node, elem)),
            }
        }
        OpKind::Assign if matches!(n.inputs.first(), Some(Operand::Param(_))) => None,
        _ => Some((node, elem)),
    }
}

/// Whether a node's result is an alias (a `TupleGetItem` of a tuple, an `Assign`, with
/// `reshapes` a `Reshape` of a node result) rather than a value of its own.
fn is_alias(graph: &Graph, node: usize, reshapes: bool) -> bool {
    resolve(graph, node, 0, reshapes) != Some((node, 0))
}

/// Plans the intermediate memory of `graph` (see the module doc) with the better of the two
/// allocators. Never fails: malformed references (which the executor rejects before
/// planning) are ignored.
pub fn plan(graph: &Graph) -> MemoryPlan {
    plan_with(graph, Allocator::Best)
}

/// Plans the intermediate memory of `graph` with the given allocator.
pub fn plan_with(graph: &Graph, allocator: Allocator) -> MemoryPlan {
    plan_impl(graph, allocator, false)
}

/// [`plan`], where a `Reshape` of a node's result is one more alias of that result (its
/// value lives in the input's buffer, which stays live through the `Reshape`'s readers), for
/// an executor whose `Reshape` leaves a value in place instead of copying it (the GPU
/// executor). The plan's other rules hold; a node's outputs share no buffer with its inputs
/// except a `Reshape`'s.
pub fn plan_aliasing_reshapes(graph: &Graph) -> MemoryPlan {
    plan_impl(graph, Allocator::Best, true)
}

fn plan_impl(graph: &Graph, allocator: Allocator, reshapes: bool) -> MemoryPlan {
    let n = graph.nodes.len();
    let resolve = |node: usize, elem: usize| resolve(graph, node, elem, reshapes);
    // Root values: every element of every non-alias node.
    let mut root_of: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut roots: Vec<Root> = Vec::new();
    for (i, node) in graph.nodes.iter().enumerate() {
        if is_alias(graph, i, reshapes) {
            continue;
        }
        for t in node.ty.tensors() {
            root_of[i].push(roots.len());
            roots.push(Root {
                dtype: t.dtype,
                elements: t.num_elements(),
                def: i,
                last: i,
            });
        }
    }
    let mut touch = |node: usize, elem: usize, at: usize| {
        if let Some((s, e)) = resolve(node, elem) {
            if let Some(&r) = root_of.get(s).and_then(|v| v.get(e)) {
                roots[r].last = roots[r].last.max(at);
            }
        }
    };
    for (i, node) in graph.nodes.iter().enumerate() {
        for op in &node.inputs {
            if let Operand::Node(src) = op {
                let src = src.index();
                if src >= i {
                    continue;
                }
                // A tuple read by TupleGetItem: only the element it names is used, and
                // resolving the TupleGetItem itself covers it. Reading a tuple whole (not
                // allowed by the verifier) keeps every element alive.
                if node.op == OpKind::TupleGetItem {
                    if let Some((s, e)) = resolve(i, 0) {
                        touch(s, e, i);
                        continue;
                    }
                }
                for e in 0..graph.nodes[src].ty.tensors().len() {
                    touch(src, e, i);
                }
            }
        }
    }
    for out in &graph.outputs {
        if let Operand::Node(src) = out {
            let src = src.index();
            if let Some(node) = graph.nodes.get(src) {
                for e in 0..node.ty.tensors().len() {
                    touch(src, e, n);
                }
            }
        }
    }

    // Live bytes at each point.
    let mut delta = vec![0i64; n + 1];
    for r in &roots {
        let bytes = (r.elements * r.dtype.size_bytes()) as i64;
        delta[r.def] += bytes;
        delta[r.last.min(n - 1) + 1] -= bytes;
    }
    let (mut live, mut live_peak, mut worst) = (0i64, 0i64, 0usize);
    for (i, d) in delta.iter().take(n).enumerate() {
        live += d;
        if live > live_peak {
            live_peak = live;
            worst = i;
        }
    }

    let mut by_node: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (r, root) in roots.iter().enumerate() {
        by_node[root.def].push(r);
    }
    let (alloc, allocator) = match allocator {
        Allocator::InOrder => (allocate_in_order(&roots, &by_node, n), Allocator::InOrder),
        Allocator::BySize => (allocate_by_size(&roots), Allocator::BySize),
        Allocator::Best => {
            let a = allocate_in_order(&roots, &by_node, n);
            let b = allocate_by_size(&roots);
            if b.total() < a.total() {
                (b, Allocator::BySize)
            } else {
                (a, Allocator::InOrder)
            }
        }
    };

    let mut values: Vec<Vec<ValueInfo>> = Vec::with_capacity(n);
    for (i, node) in graph.nodes.iter().enumerate() {
        let vs = node
            .ty
            .tensors()
            .iter()
            .enumerate()
            .map(|(e, t)| {
                let (location, def, last_use) = match resolve(i, e) {
                    Some((s, se)) => match root_of.get(s).and_then(|v| v.get(se)) {
                        Some(&r) => (
                            Location::Buffer(alloc.assigned[r]),
                            roots[r].def,
                            roots[r].last,
                        ),
                        None => (Location::Buffer(usize::MAX), i, i),
                    },
                    None => match node.inputs.first() {
                        Some(Operand::Param(p)) => (Location::Param(*p), i, i),
                        _ => (Location::Buffer(usize::MAX), i, i),
                    },
                };
                ValueInfo {
                    location,
                    ty: t.clone(),
                    def,
                    last_use,
                }
            })
            .collect();
        values.push(vs);
    }

    let bytes_of = |input: bool| {
        graph
            .params
            .iter()
            .filter(|p| (p.kind == ParamKind::Input) == input)
            .map(|p| p.ty.size_bytes())
            .sum()
    };
    MemoryPlan {
        peak_bytes: alloc.total(),
        live_peak_bytes: live_peak as usize,
        worst_point: worst,
        buffer_count: alloc.buffers.len(),
        weight_bytes: bytes_of(false),
        input_bytes: bytes_of(true),
        buffers: alloc.buffers,
        values,
        allocator,
        graph_name: graph.name.clone(),
        worst_node: if n == 0 {
            String::new()
        } else {
            node_text(graph, worst)
        },
    }
}
