//! Any model graph as the stage planner sees it
//! ([`shardc_passes::parallel::search::layer_profile::LayeredModel`]): its repeated layers
//! found from the nodes' scopes, and its training graph at any layer count and micro-batch
//! cut and rebatched from the user's own forward graph.
//!
//! **Layers.** A scope segment `<prefix><i>-<CellType>` (the transformer's
//! `layer3-TransformerEncoderLayer`, a `blocks7-ResidualBlock`) names layer `i` of a repeated
//! cell when the same prefix and cell type occur with every index `0..L` (`L >= 2`), each
//! layer's nodes contiguous and in index order; when several such cells nest, the one with
//! the most layers wins, then the outermost. A node whose scope has no such segment is the
//! head or the embedding. Backward nodes keep their forward scope under `Gradients/`, so
//! [`GraphLayers::layer_of`] finds their layer too. An op's role is its instance name with the
//! layer's `<prefix><i>` replaced by `<prefix>` (`layer3_attn_q_matmul` → `layer_attn_q_matmul`).
//!
//! **Cutting.** The graph of `k < L` layers keeps layers `0..k-1`, the last layer `L-1` and
//! every other node: the last layer reads, where it read layer `L-2`, what layer `k-1` reads
//! at the same place (the output of layer `k-2`, or the embedding's for `k = 1`), and is
//! renamed layer `k-1` (scope segment, instance names, weight names), so that the cut graph is
//! the model built with `k` layers. The layers must be structurally identical (the same ops,
//! shapes, attributes but random seeds and pipeline / recompute marks, and wiring);
//! otherwise finding them is an error naming the first difference.
//!
//! **Rebatching.** The global batch is counted in samples: the smallest leading size of a
//! layer's batch-major `Reshape` that divides the data inputs' rows (the transformer's
//! `(batch, seq, heads, head)`; the rows themselves when no layer reshapes). The graph at
//! `micro_batch` samples is one of `samples / micro_batch` micro-batches of the cut graph, as
//! the pipeline's `micro_batch` pass slices it
//! ([`shardc_passes::pipeline::micro_batch::one_micro_batch`]).
//!
//! **Megatron-LM.** With `tensor_parallel = Some((tp, dp))` the layers are annotated with
//! [`crate::transformer_layers::megatron_annotations`] when every instance those name exists
//! (the transformer builder's names) and `tp` divides the heads and the FFN width, `dp` the
//! micro-batch; otherwise `Ok(None)`.

use crate::pipeline::{compile, CompileOptions};
use crate::transformer_layers::megatron_annotations;
use shardc_ir::{Graph, Node, Operand, ParamId, ParamKind, Type};
use shardc_passes::autodiff::Optimizer;
use shardc_passes::infer;
use shardc_passes::parallel::search::layer_profile::LayeredModel;
use shardc_passes::pipeline::micro_batch::one_micro_batch;
use std::collections::{BTreeMap, HashMap};
use thiserror::Error;

/// Why a graph's layers cannot be found, cut or rebatched.
#[derive(Debug, Error)]
pub enum GraphLayersError {
    /// Two layers differ in structure.
    #[error("layers {a} and {b} of `{cell}` differ: {reason}")]
    NotIdentical {
        /// The repeated cell (`layer*-TransformerEncoderLayer`).
        cell: String,
        /// One layer.
        a: usize,
        /// The other.
        b: usize,
        /// The first difference, naming the ops.
        reason: String,
    },
    /// A node outside the kept layers reads a cut one, or the graph cannot be cut or
    /// rebatched as asked.
    #[error("cannot cut `{graph}` to {layers} layers at {micro_batch} samples: {reason}")]
    Cut {
        /// The graph's name.
        graph: String,
        /// Layers asked for.
        layers: usize,
        /// Samples asked for.
        micro_batch: usize,
        /// Why not.
        reason: String,
    },
    /// The forward graph's types cannot be inferred.
    #[error("infer_types: {0}")]
    Infer(String),
}

/// Attributes that may differ between identical layers: random seeds (a Dropout's
/// `seed0` / `seed1`), and the pipeline's and recompute's marks.
const PER_LAYER_ATTRS: &[&str] = &[
    "seed",
    "seed0",
    "seed1",
    "seed2",
    "pipeline_stage",
    "micro_batch",
    "recompute",
];

/// A node's attributes but [`PER_LAYER_ATTRS`].
fn structural(attrs: &shardc_ir::Attrs) -> Vec<(&str, &shardc_ir::Attr)> {
    attrs
        .iter()
        .filter(|(k, _)| !PER_LAYER_ATTRS.contains(k))
        .collect()
}

/// A repeated cell: scope segments `<prefix><i>-<cell>` for `i` in `0..count`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepeatedCell {
    /// The text before the index (`layer`).
    pub prefix: String,
    /// The cell type after the `-` (`TransformerEncoderLayer`).
    pub cell: String,
    /// How many layers (`L`).
    pub count: usize,
}

impl RepeatedCell {
    /// The layer a scope names: the index of its first segment `<prefix><i>-<cell>`.
    pub fn layer_in_scope(&self, scope: &str) -> Option<usize> {
        scope
            .split('/')
            .find_map(|seg| match segment(seg) {
                Some((p, i, c)) if p == self.prefix && c == self.cell => Some(i),
                _ => None,
            })
            .filter(|&i| i < self.count)
    }

    /// The cell as `<prefix>*-<cell>`.
    pub fn name(&self) -> String {
        format!("{}*-{}", self.prefix, self.cell)
    }
}

/// `(prefix, index, cell)` of a scope segment `<prefix><digits>-<cell>`.
fn segment(seg: &str) -> Option<(&str, usize, &str)> {
    let (head, cell) = seg.split_once('-')?;
    let digits = head.len() - head.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    if digits == 0 || cell.is_empty() {
        return None;
    }
    let (prefix, index) = head.split_at(head.len() - digits);
    Some((prefix, index.parse().ok()?, cell))
}

/// `s` with its first `<prefix><from>` (not followed by another digit) replaced by
/// `<prefix><to>` (`to` `None`: by `<prefix>`); `None` when `s` has none.
fn replace_index(s: &str, prefix: &str, from: usize, to: Option<usize>) -> Option<String> {
    let pat = format!("{prefix}{from}");
    let mut start = 0;
    while let Some(at) = s[start..].find(&pat).map(|a| a + start) {
        let end = at + pat.len();
        let boundary_before =
            at == 0 || !s[..at].ends_with(|c: char| c.is_ascii_digit()) || prefix.is_empty();
        if !s[end..].starts_with(|c: char| c.is_ascii_digit()) && boundary_before {
            let with = match to {
                Some(t) => format!("{prefix}{t}"),
                None => prefix.to_string(),
            };
            return Some(format!("{}{with}{}", &s[..at], &s[end..]));
        }
        start = at + 1;
    }
    None
}

/// The repeated cell of a forward graph's scopes (see the module documentation), if any has
/// at least two layers.
pub fn find_repeated_cell(g: &Graph) -> Option<RepeatedCell> {
    // (depth, prefix, cell) -> the indices seen, in node order.
    let mut seen: BTreeMap<(usize, String, String), Vec<usize>> = BTreeMap::new();
    for n in &g.nodes {
        for (depth, seg) in n.scope.split('/').enumerate() {
            if let Some((p, i, c)) = segment(seg) {
                let v = seen
                    .entry((depth, p.to_string(), c.to_string()))
                    .or_default();
                if v.last() != Some(&i) {
                    v.push(i);
                }
            }
        }
    }
    let mut best: Option<(usize, usize, RepeatedCell)> = None;
    for ((depth, prefix, cell), order) in seen {
        // Contiguous layers in index order: the indices appear as 0, 1, ..., L-1 once each.
        let count = order.len();
        if count < 2 || order.iter().enumerate().any(|(k, &i)| k != i) {
            continue;
        }
        let better = match &best {
            None => true,
            Some((c, d, _)) => count > *c || (count == *c && depth < *d),
        };
        if better {
            best = Some((
                count,
                depth,
                RepeatedCell {
                    prefix,
                    cell,
                    count,
                },
            ));
        }
    }
    best.map(|(_, _, r)| r)
}

/// A model graph's repeated layers as the stage planner's [`LayeredModel`].
#[derive(Clone, Debug)]
pub struct GraphLayers {
    /// The forward graph, typed.
    pub forward: Graph,
    /// Its repeated cell.
    pub cell: RepeatedCell,
    /// Per node of `forward`: its layer (`None`: the head or the embedding).
    pub layer: Vec<Option<usize>>,
    /// The global batch in samples (see the module documentation).
    pub samples: usize,
    /// The rows of the data inputs (their dimension 0).
    pub rows: usize,
    /// The optimizer of the training graphs.
    pub optimizer: Optimizer,
}

impl GraphLayers {
    /// The layers of `forward` (typed here), or `Ok(None)` when it has no repeated cell of
    /// two layers or more. Errors: types that cannot be inferred, layers that are not
    /// structurally identical, no data input.
    pub fn of(
        forward: &Graph,
        optimizer: Optimizer,
    ) -> Result<Option<GraphLayers>, GraphLayersError> {
        let mut forward = forward.clone();
        infer::infer_graph(&mut forward).map_err(|e| GraphLayersError::Infer(e.to_string()))?;
        let Some(cell) = find_repeated_cell(&forward) else {
            return Ok(None);
        };
        let layer: Vec<Option<usize>> = forward
            .nodes
            .iter()
            .map(|n| cell.layer_in_scope(&n.scope))
            .collect();
        let rows = forward
            .params
            .iter()
            .find(|p| matches!(p.kind, ParamKind::Input))
            .and_then(|p| p.ty.shape.first().copied())
            .ok_or_else(|| GraphLayersError::Cut {
                graph: forward.name.clone(),
                layers: cell.count,
                micro_batch: 0,
                reason: "no data input with a batch dimension".into(),
            })?;
        let samples = forward
            .nodes
            .iter()
            .zip(&layer)
            .filter(|(n, l)| l.is_some() && n.op == shardc_ir::OpKind::Reshape)
            .filter_map(|(n, _)| match &n.ty {
                Type::Tensor(t) => t.shape.first().copied(),
                _ => None,
            })
            .filter(|&d| d > 0 && rows % d == 0)
            .min()
            .unwrap_or(rows);
        let model = GraphLayers {
            forward,
            cell,
            layer,
            samples,
            rows,
            optimizer,
        };
        let last = model.cell.count - 1;
        for i in 0..last {
            model.same_structure(i, last)?;
        }
        Ok(Some(model))
    }

    /// The node indices of layer `i`, in order.
    fn nodes_of(&self, i: usize) -> Vec<usize> {
        (0..self.layer.len())
            .filter(|&k| self.layer[k] == Some(i))
            .collect()
    }

    /// The role of a node (its instance without the layer index), given its layer.
    fn role_in(&self, n: &Node, i: usize) -> String {
        replace_index(&n.instance, &self.cell.prefix, i, None).unwrap_or_else(|| n.instance.clone())
    }

    /// Checks that layers `a` and `b` have the same ops, shapes, attributes (but
    /// [`PER_LAYER_ATTRS`]) and wiring, node by node in order.
    fn same_structure(&self, a: usize, b: usize) -> Result<(), GraphLayersError> {
        let g = &self.forward;
        let (na, nb) = (self.nodes_of(a), self.nodes_of(b));
        let differ = |reason: String| GraphLayersError::NotIdentical {
            cell: self.cell.name(),
            a,
            b,
            reason,
        };
        if na.len() != nb.len() {
            return Err(differ(format!("{} nodes against {}", na.len(), nb.len())));
        }
        let pos_a: HashMap<usize, usize> = na.iter().enumerate().map(|(k, &i)| (i, k)).collect();
        let pos_b: HashMap<usize, usize> = nb.iter().enumerate().map(|(k, &i)| (i, k)).collect();
        for (&ia, &ib) in na.iter().zip(&nb) {
            let (x, y) = (&g.nodes[ia], &g.nodes[ib]);
            let what = format!(
                "`{}` ({}) and `{}` ({})",
                x.instance, x.op, y.instance, y.op
            );
            if x.op != y.op {
                return Err(differ(format!("{what} are not the same op")));
            }
            if x.ty != y.ty
                || structural(&x.attrs) != structural(&y.attrs)
                || x.inputs.len() != y.inputs.len()
            {
                return Err(differ(format!(
                    "{what} differ in type, attributes or operands"
                )));
            }
            for (ox, oy) in x.inputs.iter().zip(&y.inputs) {
                let same = match (ox, oy) {
                    (Operand::Node(p), Operand::Node(q)) => {
                        match (pos_a.get(&p.index()), pos_b.get(&q.index())) {
                            (Some(u), Some(v)) => u == v,
                            (None, None) => true,
                            _ => false,
                        }
                    }
                    (Operand::Param(p), Operand::Param(q)) => {
                        let (pp, pq) = (&g.params[p.index()], &g.params[q.index()]);
                        pp.ty == pq.ty && pp.is_weight() == pq.is_weight()
                    }
                    (Operand::Const(c), Operand::Const(d)) => c == d,
                    (Operand::Node(_), Operand::Param(q))
                    | (Operand::Param(q), Operand::Node(_)) => {
                        // The first layer reads a data input where the others read the layer
                        // before.
                        !g.params[q.index()].is_weight()
                    }
                    _ => false,
                };
                if !same {
                    return Err(differ(format!("{what} read different operands")));
                }
            }
        }
        Ok(())
    }

    /// The forward graph of the first `layers` layers with the head (see the module
    /// documentation), typed, at the full batch.
    pub fn cut(&self, layers: usize) -> Result<Graph, GraphLayersError> {
        let g = &self.forward;
        let l = self.cell.count;
        let fail = |reason: String| GraphLayersError::Cut {
            graph: g.name.clone(),
            layers,
            micro_batch: self.samples,
            reason,
        };
        if layers == 0 || layers > l {
            return Err(fail(format!("the model has {l} layers")));
        }
        if layers == l {
            return Ok(g.clone());
        }
        let (k, last) = (layers - 1, l - 1);
        let keep = |i: usize| match self.layer[i] {
            None => true,
            Some(j) => j < k || j == last,
        };
        // Layer `last`'s node at position p stands where layer k's node at p stood.
        let stand_in: HashMap<usize, usize> = self
            .nodes_of(last)
            .into_iter()
            .zip(self.nodes_of(k))
            .collect();
        let prefix = &self.cell.prefix;
        let mut node_map: Vec<Option<usize>> = vec![None; g.nodes.len()];
        let mut used = vec![false; g.params.len()];
        let mut last_weights = vec![false; g.params.len()];
        let mut nodes: Vec<Node> = Vec::new();
        for (i, n) in g.nodes.iter().enumerate() {
            if !keep(i) {
                continue;
            }
            let mut c = n.clone();
            let in_last = self.layer[i] == Some(last);
            for (pos, o) in c.inputs.iter_mut().enumerate() {
                // An operand of the last layer from outside it: layer k's at the same place.
                let from_outside = match &*o {
                    Operand::Node(p) => self.layer[p.index()] != Some(last),
                    Operand::Param(p) => !g.params[p.index()].is_weight(),
                    Operand::Const(_) => false,
                };
                if in_last && from_outside {
                    let twin = stand_in.get(&i).ok_or_else(|| {
                        fail(format!("`{}` has no counterpart in layer {k}", n.instance))
                    })?;
                    *o = g.nodes[*twin].inputs[pos].clone();
                }
                match o {
                    Operand::Node(p) => {
                        let at = node_map[p.index()].ok_or_else(|| {
                            fail(format!(
                                "`{}` reads `{}` of a layer that is cut",
                                n.instance,
                                g.nodes[p.index()].instance
                            ))
                        })?;
                        *p = shardc_ir::NodeId(at as u32);
                    }
                    Operand::Param(p) => {
                        used[p.index()] = true;
                        if in_last && g.params[p.index()].is_weight() {
                            last_weights[p.index()] = true;
                        }
                    }
                    Operand::Const(_) => {}
                }
            }
            if in_last {
                let seg = format!("{prefix}{last}-{}", self.cell.cell);
                c.scope = c
                    .scope
                    .split('/')
                    .map(|s| {
                        if s == seg {
                            format!("{prefix}{k}-{}", self.cell.cell)
                        } else {
                            s.to_string()
                        }
                    })
                    .collect::<Vec<_>>()
                    .join("/");
                if let Some(name) = replace_index(&c.instance, prefix, last, Some(k)) {
                    c.instance = name;
                }
            }
            node_map[i] = Some(nodes.len());
            nodes.push(c);
        }
        // The weights the kept nodes read and every data input (the dataset feeds them), in
        // their order; the last layer's weights renamed as layer k's.
        let mut out = Graph::new(g.name.clone());
        let mut param_map: Vec<Option<ParamId>> = vec![None; g.params.len()];
        for (idx, prm) in g.params.iter().enumerate() {
            if used[idx] || !prm.is_weight() {
                let mut prm = prm.clone();
                if last_weights[idx] {
                    if let Some(name) = replace_index(&prm.name, prefix, last, Some(k)) {
                        prm.name = name;
                    }
                }
                param_map[idx] = Some(out.add_param(prm));
            }
        }
        for mut c in nodes {
            for o in &mut c.inputs {
                if let Operand::Param(p) = o {
                    *p = param_map[p.index()].ok_or_else(|| {
                        fail(format!("parameter `{}` not kept", g.params[p.index()].name))
                    })?;
                }
            }
            out.push_node(c);
        }
        out.outputs = g
            .outputs
            .iter()
            .map(|o| match o {
                Operand::Node(p) => node_map[p.index()]
                    .map(|at| Operand::Node(shardc_ir::NodeId(at as u32)))
                    .ok_or_else(|| {
                        fail(format!("output `{}` is cut", g.nodes[p.index()].instance))
                    }),
                Operand::Param(p) => param_map[p.index()]
                    .map(Operand::Param)
                    .ok_or_else(|| fail(format!("output `{}` is cut", g.params[p.index()].name))),
                other => Ok(other.clone()),
            })
            .collect::<Result<_, _>>()?;
        infer::infer_graph(&mut out).map_err(|e| fail(e.to_string()))?;
        Ok(out)
    }

    /// The forward graph of the first `layers` layers with the head at `micro_batch` samples.
    pub fn forward_at(&self, layers: usize, micro_batch: usize) -> Result<Graph, GraphLayersError> {
        let cut = self.cut(layers)?;
        if micro_batch == 0 || self.samples % micro_batch != 0 {
            return Err(GraphLayersError::Cut {
                graph: self.forward.name.clone(),
                layers,
                micro_batch,
                reason: format!(
                    "{micro_batch} samples do not divide the global batch of {} samples",
                    self.samples
                ),
            });
        }
        one_micro_batch(&cut, self.samples / micro_batch).map_err(|e| GraphLayersError::Cut {
            graph: self.forward.name.clone(),
            layers,
            micro_batch,
            reason: e.to_string(),
        })
    }

    /// Megatron-LM's strategies on `g`'s layers `layers` for a `tp × dp` mesh; `false`
    /// when they do not apply (an instance they name is missing, `tp` does not divide the
    /// heads or the FFN width, `dp` the micro-batch), and then `g` is left as it was.
    pub fn annotate_megatron(
        g: &mut Graph,
        layers: std::ops::Range<usize>,
        tp: usize,
        dp: usize,
        micro_batch: usize,
    ) -> bool {
        let dim = |g: &Graph, inst: &str, d: usize| {
            g.node_by_instance(inst)
                .and_then(|id| match &g.node(id).ty {
                    Type::Tensor(t) => t.shape.get(d).copied(),
                    _ => None,
                })
        };
        let (Some(heads), Some(ffn)) = (
            dim(g, "layer0_attn_q_reshape", 2),
            dim(g, "layer0_ffn_in_matmul", 1),
        ) else {
            return false;
        };
        if tp == 0 || dp == 0 || heads % tp != 0 || ffn % tp != 0 || micro_batch % dp != 0 {
            return false;
        }
        let mut marks = Vec::new();
        for i in layers {
            for (name, s) in megatron_annotations(i, tp, dp) {
                let Some(id) = g.node_by_instance(&name) else {
                    return false;
                };
                marks.push((id, s));
            }
        }
        for (id, s) in marks {
            g.nodes[id.index()].in_strategy = Some(s);
        }
        true
    }
}

impl LayeredModel for GraphLayers {
    fn layers(&self) -> usize {
        self.cell.count
    }

    fn layer_graph(
        &self,
        layers: usize,
        micro_batch: usize,
        tensor_parallel: Option<(usize, usize)>,
    ) -> Result<Option<Graph>, String> {
        let mut forward = self
            .forward_at(layers, micro_batch)
            .map_err(|e| e.to_string())?;
        if let Some((tp, dp)) = tensor_parallel {
            if !Self::annotate_megatron(&mut forward, 0..layers, tp, dp, micro_batch) {
                return Ok(None);
            }
        }
        compile(
            forward,
            &CompileOptions {
                optimizer: Some(self.optimizer),
                verify: false,
                ..Default::default()
            },
        )
        .map(|c| Some(c.graph))
        .map_err(|e| e.to_string())
    }

    fn layer_of(&self, node: &Node) -> Option<usize> {
        self.cell.layer_in_scope(&node.scope)
    }

    fn role(&self, node: &Node) -> String {
        match self.layer_of(node) {
            Some(i) => self.role_in(node, i),
            None => node.instance.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::optim::Adam;
    use crate::transformer::{transformer, TransformerConfig};
    use crate::transformer_layers::TransformerLayers;

    fn cfg(layers: usize, batch: usize) -> TransformerConfig {
        TransformerConfig::new(layers, 32, 2, 8, batch)
    }

    fn model(layers: usize) -> GraphLayers {
        let g = transformer(&cfg(layers, 8)).unwrap();
        GraphLayers::of(&g, Adam::new(1e-4).to_spec())
            .unwrap()
            .expect("the transformer has layers")
    }

    /// Op, instance, scope and output shape of every node; name and shape of every parameter.
    fn outline(g: &Graph) -> (Vec<String>, Vec<String>) {
        let nodes = g
            .nodes
            .iter()
            .map(|n| format!("{} {} {} {:?}", n.op, n.instance, n.scope, n.ty))
            .collect();
        let params = g
            .params
            .iter()
            .map(|p| format!("{} {:?}", p.name, p.ty.shape))
            .collect();
        (nodes, params)
    }

    #[test]
    fn the_transformers_layers_are_found_from_the_scopes() {
        let m = model(4);
        assert_eq!(
            m.cell,
            RepeatedCell {
                prefix: "layer".into(),
                cell: "TransformerEncoderLayer".into(),
                count: 4
            }
        );
        // 8 sequences of 8 tokens: the rows are 64, the samples 8 (the attention's reshape).
        assert_eq!((m.rows, m.samples), (64, 8));
        let per_layer: Vec<usize> = (0..4).map(|i| m.nodes_of(i).len()).collect();
        assert_eq!(per_layer, vec![crate::transformer::NODES_PER_LAYER; 4]);
        // The loss head is outside the layers.
        let loss = m.forward.node_by_instance("reduce_mean").unwrap();
        assert_eq!(m.layer[loss.index()], None);
        let q = m.forward.node_by_instance("layer2_attn_q_matmul").unwrap();
        assert_eq!(m.layer_of(m.forward.node(q)), Some(2));
        assert_eq!(m.role(m.forward.node(q)), "layer_attn_q_matmul");
        assert_eq!(
            m.layer_of(&Node {
                scope: "Gradients/Default/x/layer3-TransformerEncoderLayer".into(),
                ..Node::new(shardc_ir::OpKind::Add, vec![])
            }),
            Some(3)
        );
    }

    #[test]
    fn a_graph_without_repeated_layers_has_none() {
        let mut g = transformer(&cfg(1, 8)).unwrap();
        assert!(GraphLayers::of(&g, Adam::new(1e-4).to_spec())
            .unwrap()
            .is_none());
        for n in &mut g.nodes {
            n.scope = "Default/network-WithLossCell".into();
        }
        assert!(find_repeated_cell(&g).is_none());
    }

    #[test]
    fn cut_and_rebatched_graphs_are_the_builders_at_that_size() {
        let m = model(4);
        for (layers, mb) in [(1, 8), (2, 4), (3, 2), (2, 1), (4, 8)] {
            let ours = m.forward_at(layers, mb).unwrap();
            let mut built = transformer(&cfg(layers, mb)).unwrap();
            infer::infer_graph(&mut built).unwrap();
            assert_eq!(
                outline(&ours),
                outline(&built),
                "{layers} layers at {mb} samples"
            );
            // The training graphs: the same node count and shapes as the planner's own
            // transformer model.
            let reference = TransformerLayers { cfg: cfg(4, 8) };
            let a = m.layer_graph(layers, mb, None).unwrap().unwrap();
            let b = reference.layer_graph(layers, mb, None).unwrap().unwrap();
            assert_eq!(a.nodes.len(), b.nodes.len(), "{layers} layers at {mb}");
            let shapes = |g: &Graph| g.nodes.iter().map(|n| n.ty.clone()).collect::<Vec<_>>();
            assert_eq!(shapes(&a), shapes(&b), "{layers} layers at {mb}");
        }
        let e = m.forward_at(2, 3).unwrap_err().to_string();
        assert!(
            e.contains("3 samples do not divide the global batch of 8"),
            "{e}"
        );
        let e = m.forward_at(5, 8).unwrap_err().to_string();
        assert!(e.contains("the model has 4 layers"), "{e}");
    }

    #[test]
    fn megatron_annotations_apply_where_they_divide() {
        let m = model(4);
        let reference = TransformerLayers { cfg: cfg(4, 8) };
        let a = m
            .layer_graph(3, 4, Some((2, 2)))
            .unwrap()
            .expect("tp 2 divides 2 heads");
        let b = reference.layer_graph(3, 4, Some((2, 2))).unwrap().unwrap();
        assert_eq!(a.nodes.len(), b.nodes.len());
        let q = a.node_by_instance("layer2_attn_q_matmul").unwrap();
        assert_eq!(
            a.node(q).in_strategy,
            Some(shardc_ir::Strategy(vec![vec![2, 1], vec![1, 2]]))
        );
        // 4 does not divide 2 heads; 3 replicas do not divide 4 samples.
        assert!(m.layer_graph(3, 4, Some((4, 1))).unwrap().is_none());
        assert!(m.layer_graph(3, 4, Some((1, 3))).unwrap().is_none());
    }

    #[test]
    fn layers_that_differ_are_an_error_naming_them() {
        // Random seeds and pipeline marks may differ between identical layers.
        let mut g = transformer(&cfg(3, 8)).unwrap();
        for (inst, seed) in [("layer0_ffn_gelu", 1), ("layer2_ffn_gelu", 7)] {
            let at = g.node_by_instance(inst).unwrap();
            let attrs = &mut g.nodes[at.index()].attrs;
            attrs.set("seed0", shardc_ir::Attr::Int(seed));
            attrs.set("pipeline_stage", shardc_ir::Attr::Int(seed));
        }
        assert!(GraphLayers::of(&g, Adam::new(1e-4).to_spec())
            .unwrap()
            .is_some());
        let mut g = transformer(&cfg(3, 8)).unwrap();
        let at = g.node_by_instance("layer1_ffn_gelu").unwrap();
        g.nodes[at.index()].op = shardc_ir::OpKind::ReLU;
        let e = GraphLayers::of(&g, Adam::new(1e-4).to_spec())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("layers 1 and 2 of `layer*-TransformerEncoderLayer` differ")
                && e.contains("`layer1_ffn_gelu` (ReLU)"),
            "{e}"
        );
    }
}
