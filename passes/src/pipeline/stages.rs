//! Every forward node's pipeline stage (`pipeline_stage: k`).
//!
//! A node's stage is its own `pipeline_stage` attribute (set by the builder for everything
//! built inside a cell with `pipeline_stage(k)`, or written in a text model); else the
//! largest stage of its node operands; a node that reads only parameters and constants
//! takes the smallest stage of its readers (so a label's slicing goes to the last stage, the
//! input's to the first). When no node is marked, the forward (in program order) is cut into
//! `S` contiguous chunks of about equal compute cost (the ops' `Cost` in [`crate::ops`]), and
//! the first node of each chunk says so in a comment.
//!
//! The checks, each naming the op instance and the values: a stage attribute below `S`;
//! stages never decrease along an edge; every stage `0..S` has nodes; the loss is on the last
//! stage; a weight is read by one stage only.

use super::{int_attr, node_name, PipelineError, STAGE_ATTR};
use crate::ops::{rule, Cost};
use shardc_ir::{Attr, Graph, Operand, ParamKind, Type};

/// How the stages were chosen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StagePlan {
    /// Per node: its stage.
    pub stage: Vec<usize>,
    /// Whether no node was marked and the split was made by compute cost.
    pub automatic: bool,
}

fn err(instance: String, reason: String) -> PipelineError {
    PipelineError {
        pass: "micro_batch",
        instance,
        reason,
    }
}

/// A node's compute cost as the split weighs it: a vector op its weight per output element,
/// a contraction its FLOPs per iteration times its iterations (the first operand's elements
/// times the result's last dimension: `m·k·n` for a MatMul).
fn cost(g: &Graph, i: usize) -> f64 {
    let n = &g.nodes[i];
    let out: usize = match &n.ty {
        Type::Tensor(t) => t.shape.iter().product(),
        Type::Tuple(ts) => ts.iter().map(|t| t.shape.iter().product::<usize>()).sum(),
    };
    match rule(n.op).cost {
        Cost::Vector(w) => w * out as f64,
        Cost::Gemm(flops) => {
            let first: usize = n
                .inputs
                .first()
                .and_then(|o| g.operand_tensor_type(o))
                .map_or(1, |t| t.shape.iter().product());
            let last = match &n.ty {
                Type::Tensor(t) => t.shape.last().copied().unwrap_or(1),
                Type::Tuple(_) => 1,
            };
            flops(g, n) * (first * last) as f64
        }
    }
}

/// Assigns every node of the forward graph `g` its stage among `stages` and writes it as the
/// `pipeline_stage` attribute; see the module documentation.
pub fn assign_stages(g: &mut Graph, stages: usize) -> Result<StagePlan, PipelineError> {
    let n = g.nodes.len();
    let mut explicit: Vec<Option<usize>> = Vec::with_capacity(n);
    for (i, node) in g.nodes.iter().enumerate() {
        match node.attrs.get(STAGE_ATTR) {
            None => explicit.push(None),
            Some(a) => {
                let k = a
                    .as_int()
                    .filter(|&k| k >= 0 && (k as usize) < stages)
                    .ok_or_else(|| {
                        err(
                            node_name(g, i),
                            format!(
                                "pipeline_stage {a} is not a stage of pipeline_stages {stages} (0..{stages})"
                            ),
                        )
                    })?;
                explicit.push(Some(k as usize));
            }
        }
    }
    let automatic = explicit.iter().all(Option::is_none);
    if automatic {
        let costs: Vec<f64> = (0..n).map(|i| cost(g, i)).collect();
        let total: f64 = costs.iter().sum::<f64>().max(f64::MIN_POSITIVE);
        let mut before = 0.0;
        let mut last = usize::MAX;
        for i in 0..n {
            let mid = before + costs[i] / 2.0;
            before += costs[i];
            let k = ((mid / total * stages as f64) as usize).min(stages - 1);
            // Only nodes that compute on a node's result or a data input are placed by cost;
            // weight-only ones follow their readers below.
            if g.nodes[i].inputs.iter().any(|o| match o {
                Operand::Node(_) => true,
                Operand::Param(p) => matches!(g.params[p.index()].kind, ParamKind::Input),
                Operand::Const(_) => false,
            }) {
                explicit[i] = Some(k);
                if k != last {
                    g.nodes[i].comments.push(format!(
                        "pipeline_stage {k}: automatic split of the forward into {stages} stages balanced by compute cost"
                    ));
                    last = k;
                }
            }
        }
    }
    let stage = resolve(g, &explicit);
    check(g, &stage, stages)?;
    for (node, &k) in g.nodes.iter_mut().zip(&stage) {
        node.attrs.set(STAGE_ATTR, Attr::Int(k as i64));
    }
    Ok(StagePlan { stage, automatic })
}

/// The stage of every node from the explicit ones: the largest of its node operands', else
/// (a node reading only parameters and constants) the smallest of its readers', else 0.
pub(crate) fn resolve(g: &Graph, explicit: &[Option<usize>]) -> Vec<usize> {
    let n = g.nodes.len();
    let mut stage: Vec<Option<usize>> = explicit.to_vec();
    for i in 0..n {
        if stage[i].is_some() {
            continue;
        }
        stage[i] = g.nodes[i]
            .inputs
            .iter()
            .filter_map(|o| match o {
                Operand::Node(id) => stage.get(id.index()).copied().flatten(),
                _ => None,
            })
            .max();
    }
    let users = g.users();
    for i in (0..n).rev() {
        if stage[i].is_none() {
            stage[i] = users[i]
                .iter()
                .filter_map(|u| stage.get(u.index()).copied().flatten())
                .min();
        }
    }
    stage.into_iter().map(|s| s.unwrap_or(0)).collect()
}

fn check(g: &Graph, stage: &[usize], stages: usize) -> Result<(), PipelineError> {
    for (i, node) in g.nodes.iter().enumerate() {
        for o in &node.inputs {
            if let Operand::Node(id) = o {
                let (a, b) = (stage[id.index()], stage[i]);
                if a > b {
                    return Err(err(
                        node_name(g, i),
                        format!(
                            "is on stage {b} but reads `{}` of stage {a}: stages must not decrease along a forward edge",
                            node_name(g, id.index())
                        ),
                    ));
                }
            }
        }
    }
    for k in 0..stages {
        if !stage.contains(&k) {
            return Err(err(
                String::new(),
                format!(
                    "pipeline stage {k} of {stages} has no node (the model has {} nodes)",
                    g.nodes.len()
                ),
            ));
        }
    }
    if let Some(Operand::Node(l)) = g.loss() {
        let k = stage[l.index()];
        if k + 1 != stages {
            return Err(err(
                node_name(g, l.index()),
                format!(
                    "computes the loss on stage {k}: the loss must be on the last stage {}",
                    stages - 1
                ),
            ));
        }
    }
    let mut readers: Vec<Option<(usize, usize)>> = vec![None; g.params.len()];
    for (i, node) in g.nodes.iter().enumerate() {
        for o in &node.inputs {
            if let Operand::Param(p) = o {
                if !matches!(g.params[p.index()].kind, ParamKind::Weight { .. }) {
                    continue;
                }
                match readers[p.index()] {
                    None => readers[p.index()] = Some((stage[i], i)),
                    Some((k, j)) if k != stage[i] => {
                        return Err(err(
                            g.params[p.index()].name.clone(),
                            format!(
                                "is read by `{}` on stage {k} and by `{}` on stage {}: shared weights across stages are not supported",
                                node_name(g, j),
                                node_name(g, i),
                                stage[i]
                            ),
                        ))
                    }
                    Some(_) => {}
                }
            }
        }
    }
    Ok(())
}

/// The stage attribute of a node, if it has one.
pub fn stage_of(node: &shardc_ir::Node) -> Option<usize> {
    int_attr(node, STAGE_ATTR).and_then(|k| usize::try_from(k).ok())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) const MLP: &str = "#IR entry      : @Net
%para1_x : <Tensor[Float32], (16, 32)>
%para2_label : <Tensor[Float32], (16, 16)>
%para3_w : <Ref[Tensor(F32)], (32, 16), ref_key=:w>  :  has_default  init: normal(sigma=0.01, seed=1)
%para4_w2 : <Ref[Tensor(F32)], (16, 16), ref_key=:w2>  :  has_default  init: normal(sigma=0.01, seed=2)

subgraph @Net(%para1_x, %para2_label, %para3_w, %para4_w2) {
  %1(out) = MatMul(%para1_x, %para3_w) {instance name: matmul} primitive_attrs: {transpose_a: false, transpose_b: false}
  %2(out) = ReLU(%1) {instance name: relu}
  %3(out) = MatMul(%2, %para4_w2) {instance name: matmul2} primitive_attrs: {transpose_a: false, transpose_b: false}
  %4(diff) = Sub(%3, %para2_label) {instance name: sub}
  %5(sq) = Square(%4) {instance name: square}
  %6(loss) = ReduceMean(%5, (0, 1)) {instance name: reduce_mean} primitive_attrs: {keep_dims: false}
  Return(%6)
}
";

    pub(crate) fn mlp() -> Graph {
        let mut g = shardc_ir::text::parse_graph(MLP, "mlp.ir").unwrap();
        crate::infer::infer_graph(&mut g).unwrap();
        g
    }

    #[test]
    fn an_unmarked_graph_is_split_by_compute_cost() {
        let mut g = mlp();
        let plan = assign_stages(&mut g, 2).unwrap();
        assert!(plan.automatic);
        // The first MatMul (16·32·16 FLOP-iterations) outweighs the rest: stage 0 holds it
        // alone, the loss is on stage 1; stages never decrease.
        assert_eq!(plan.stage, vec![0, 1, 1, 1, 1, 1]);
        assert!(g.nodes[0]
            .comments
            .iter()
            .any(|c| c.contains("automatic split")));
        assert_eq!(stage_of(&g.nodes[5]), Some(1));
    }

    #[test]
    fn stage_errors_name_the_op_and_values() {
        let mut g = mlp();
        g.nodes[0].attrs.set(STAGE_ATTR, Attr::Int(1));
        g.nodes[1].attrs.set(STAGE_ATTR, Attr::Int(0));
        let e = assign_stages(&mut g, 2).unwrap_err().to_string();
        assert!(
            e.contains("`relu`") && e.contains("must not decrease"),
            "{e}"
        );
        let mut g = mlp();
        g.nodes[2].attrs.set(STAGE_ATTR, Attr::Int(5));
        let e = assign_stages(&mut g, 2).unwrap_err().to_string();
        assert!(
            e.contains("`matmul2`") && e.contains("pipeline_stage 5"),
            "{e}"
        );
        let mut g = mlp();
        let e = assign_stages(&mut g, 9).unwrap_err().to_string();
        assert!(e.contains("has no node"), "{e}");
    }
}
