//! Optimizer updates written straight into the weights.
//!
//! A training step ends with, per weight, an update op (`ApplyMomentum`, `Adam`, `SGD`,
//! `ApplyGradientDescent`) whose results are new values, each `Assign`ed to the parameter it
//! was computed from. Done literally, that is a kernel writing fresh buffers and then one
//! device copy per result: for ResNet-18, 62 updates and 124 copies a step, each a driver call.
//!
//! Where it changes nothing, the update writes the parameter itself and the `Assign` finds its
//! source already in place (the executor skips a copy onto itself). It changes nothing when:
//!
//! - the result is the update's new value of that very operand (ApplyMomentum's `var` and
//!   `accum`; Adam's `var`, `m`, `v`; SGD's `parameters`, `accum`, `stat`;
//!   ApplyGradientDescent's `var`): every kernel reads element `i` of its operands before it
//!   writes element `i` of its results, so writing over the operand is safe;
//! - the `Assign` is the result's only reader (through its `TupleGetItem`, which has no other
//!   reader either) and the result is no graph output;
//! - no node between the update and the `Assign` reads or assigns the parameter: they would
//!   have seen the old value.
//!
//! The same holds for an elementwise map (a unary or binary op [`crate::fusion`] can fuse)
//! whose result is `Assign`ed to a parameter of its type, under the last two conditions:
//! BatchNorm's moving statistics (`Assign(mean, Add(Mul(mean, 0.9), Mul(batch_mean, 0.1)))`,
//! 40 copies a step in ResNet-18) are then written by the kernel that computes them, fused or
//! not. A map of the result's shape reads any operand of that shape at the element it writes,
//! so it may read the parameter it overwrites.
//!
//! Adjacent in-place momentum or Adam updates with the same scalars then go out as one launch
//! ([`update_groups`], the kernels `apply_momentum_multi` and `adam_multi`), as PyTorch's
//! multi-tensor optimizers do: ResNet-18's 62 updates become one kernel.

use shardc_ir::{Graph, OpKind, Operand};

/// The operand whose new value result `elem` of an update op is, or None.
fn updated_operand(op: OpKind, elem: usize) -> Option<usize> {
    match (op, elem) {
        (OpKind::ApplyMomentum, 0 | 1) | (OpKind::Adam, 0..=2) => Some(elem),
        (OpKind::ApplyGradientDescent, 0) => Some(0),
        (OpKind::SGD, 0) => Some(0),
        (OpKind::SGD, 1) => Some(3),
        (OpKind::SGD, 2) => Some(5),
        _ => None,
    }
}

/// Per node and result element, the parameter (index) that value lives in instead of its
/// planned buffer (see the module doc): an update's result and the `TupleGetItem` that names
/// it, or an elementwise map's result.
pub fn in_place_updates(graph: &Graph) -> Vec<Vec<Option<usize>>> {
    let n = graph.nodes.len();
    // Readers of each node's result, and whether it is a graph output.
    let mut readers: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (i, node) in graph.nodes.iter().enumerate() {
        for o in &node.inputs {
            if let Operand::Node(id) = o {
                if let Some(r) = readers.get_mut(id.index()) {
                    r.push(i);
                }
            }
        }
    }
    let mut output = vec![false; n];
    for o in &graph.outputs {
        if let Operand::Node(id) = o {
            if let Some(f) = output.get_mut(id.index()) {
                *f = true;
            }
        }
    }
    let sole_reader = |node: usize, reader: usize| !output[node] && readers[node] == [reader];
    let mut places: Vec<Vec<Option<usize>>> = graph
        .nodes
        .iter()
        .map(|nd| vec![None; nd.ty.tensors().len().max(1)])
        .collect();
    for (a, assign) in graph.nodes.iter().enumerate() {
        if assign.op != OpKind::Assign {
            continue;
        }
        let (Some(Operand::Param(q)), Some(Operand::Node(src))) =
            (assign.inputs.first(), assign.inputs.get(1))
        else {
            continue;
        };
        let src = src.index();
        // The update and the element: through a TupleGetItem, or the update itself.
        let (k, elem, via) = match graph.nodes.get(src) {
            Some(g) if g.op == OpKind::TupleGetItem => {
                match (
                    g.inputs.first(),
                    g.inputs
                        .get(1)
                        .and_then(Operand::as_const)
                        .and_then(|c| c.as_int()),
                ) {
                    (Some(Operand::Node(k)), Some(e)) if e >= 0 => {
                        (k.index(), e as usize, Some(src))
                    }
                    _ => continue,
                }
            }
            Some(_) => (src, 0, None),
            None => continue,
        };
        let Some(update) = graph.nodes.get(k) else {
            continue;
        };
        if k >= a {
            continue;
        }
        let writes_operand = updated_operand(update.op, elem)
            .is_some_and(|operand| update.inputs.get(operand) == Some(&Operand::Param(*q)));
        let param_ty = graph.params.get(q.index()).map(|p| &p.ty);
        let elementwise =
            via.is_none() && crate::fusion::fusable(graph, k).is_some_and(|t| Some(t) == param_ty);
        if !writes_operand && !elementwise {
            continue;
        }
        let sole = match via {
            // The tuple is read by several TupleGetItems; this element only through `g`.
            Some(g) => {
                sole_reader(g, a)
                    && !output[k]
                    && readers[k].iter().all(|&r| {
                        r == g || {
                            let t = &graph.nodes[r];
                            t.op != OpKind::TupleGetItem
                                || t.inputs
                                    .get(1)
                                    .and_then(Operand::as_const)
                                    .and_then(|c| c.as_int())
                                    != Some(elem as i64)
                        }
                    })
            }
            None => sole_reader(k, a),
        };
        let untouched_between = graph.nodes[k + 1..a]
            .iter()
            .all(|nd| !nd.inputs.contains(&Operand::Param(*q)));
        if !sole || !untouched_between {
            continue;
        }
        let q = q.index();
        places[k][elem] = Some(q);
        if let Some(g) = via {
            places[g][0] = Some(q);
        }
    }
    places
}

/// The operands of an update op that are scalars every member of a group shares: the
/// learning rate and momentum of ApplyMomentum; Adam's beta powers, learning rate, betas and
/// epsilon.
pub fn shared_scalars(op: OpKind) -> &'static [usize] {
    match op {
        OpKind::ApplyMomentum => &[2, 4],
        OpKind::Adam => &[3, 4, 5, 6, 7, 8],
        _ => &[],
    }
}

/// Runs of update nodes that one kernel launch can update together, as PyTorch's multi-tensor
/// optimizers do: ApplyMomentum or Adam nodes with every result written in place
/// ([`in_place_updates`]), Float32 or Float64 alike, the same [`shared_scalars`] operands
/// (ApplyMomentum: constants; Adam: constants or one-element parameters of the weight's
/// type, such as its beta powers) and the same `use_nesterov`, and nothing between them but
/// their own `TupleGetItem`s and `Assign`s (which the in-place writes make no-ops). Runs of two
/// or more, in program order.
pub fn update_groups(graph: &Graph, places: &[Vec<Option<usize>>]) -> Vec<Vec<usize>> {
    let eligible = |k: usize| {
        let nd = &graph.nodes[k];
        let results = match nd.op {
            OpKind::ApplyMomentum => 2,
            OpKind::Adam => 3,
            _ => return false,
        };
        let dtype = nd.ty.tensors().first().map(|t| t.dtype);
        let scalar_ok = |i: usize| match nd.inputs.get(i) {
            Some(Operand::Const(_)) => true,
            Some(Operand::Param(p)) => {
                nd.op == OpKind::Adam
                    && graph
                        .params
                        .get(p.index())
                        .is_some_and(|q| q.ty.num_elements() == 1 && Some(q.ty.dtype) == dtype)
            }
            _ => false,
        };
        places
            .get(k)
            .is_some_and(|p| p.len() == results && p.iter().all(Option::is_some))
            && shared_scalars(nd.op).iter().all(|&i| scalar_ok(i))
            && matches!(
                dtype,
                Some(shardc_ir::DType::Float32 | shardc_ir::DType::Float64)
            )
    };
    let same = |a: usize, b: usize| {
        let (x, y) = (&graph.nodes[a], &graph.nodes[b]);
        x.op == y.op
            && shared_scalars(x.op)
                .iter()
                .all(|&i| x.inputs.get(i) == y.inputs.get(i))
            && x.attrs.bool_or("use_nesterov", false) == y.attrs.bool_or("use_nesterov", false)
            && x.ty.tensors().first().map(|t| t.dtype) == y.ty.tensors().first().map(|t| t.dtype)
    };
    // A node between two members that does nothing: a TupleGetItem, or an Assign whose value
    // is already in place.
    let idle = |i: usize| {
        let nd = &graph.nodes[i];
        match nd.op {
            OpKind::TupleGetItem => true,
            OpKind::Assign => match nd.inputs.get(1) {
                Some(Operand::Node(src)) => places
                    .get(src.index())
                    .and_then(|p| p.first())
                    .is_some_and(Option::is_some),
                _ => false,
            },
            _ => false,
        }
    };
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut current: Vec<usize> = Vec::new();
    for i in 0..graph.nodes.len() {
        if eligible(i) && current.last().is_none_or(|&l| same(l, i)) {
            current.push(i);
        } else if eligible(i) {
            groups.push(std::mem::replace(&mut current, vec![i]));
        } else if !idle(i) {
            groups.push(std::mem::take(&mut current));
        }
    }
    groups.push(current);
    groups.retain(|g| g.len() >= 2);
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A momentum update of `w` and `acc` by the input gradient `g`; `between` is inserted
    /// after the update, and the graph returns `ret`.
    fn graph(between: &str, ret: &str) -> Graph {
        let text = format!(
            "%para1_g : <Tensor[Float32], (4)>
%para2_w : <Ref[Tensor(F32)], (4), ref_key=:w>  :  has_default  init: normal(sigma=0.01, seed=1)
%para3_acc : <Ref[Tensor(F32)], (4), ref_key=:acc>  :  has_default  init: zeros

subgraph @Update(%para1_g, %para2_w, %para3_acc) {{
  %1(u) = ApplyMomentum(%para2_w, %para3_acc, 0.1, %para1_g, 0.9) {{instance name: m}} primitive_attrs: {{use_nesterov: false}}
  {between}
  %3(w) = TupleGetItem(%1, 0)
  %4(aw) = Assign(%para2_w, %3)
  %5(a) = TupleGetItem(%1, 1)
  %6(aa) = Assign(%para3_acc, %5)
  Return({ret})
}}"
        );
        let mut g = shardc_ir::text::parse_graph(&text, "update.ir").expect("parses");
        shardc_passes::infer::infer_graph(&mut g).expect("types");
        g
    }

    #[test]
    fn both_results_of_a_momentum_update_are_written_into_their_weights() {
        let g = graph("%2(n) = Neg(%para1_g) {instance name: n}", "%2");
        let p = in_place_updates(&g);
        // The update's two results and the TupleGetItems naming them: w (param 1), acc (2).
        assert_eq!(p[0], [Some(1), Some(2)]);
        assert_eq!(p[2][0], Some(1));
        assert_eq!(p[4][0], Some(2));
        assert!(p[1].iter().all(Option::is_none) && p[3][0].is_none());
    }

    /// Momentum updates of weights `w1` and `w2` (learning rates `lr1`, `lr2`), with `between`
    /// after the first update's Assigns.
    fn two_updates(lr1: &str, lr2: &str, between: &str) -> Graph {
        let w = |i: usize, name: &str| {
            format!(
                "%para{i}_{name} : <Ref[Tensor(F32)], (4), ref_key=:{name}>  :  has_default  init: zeros\n"
            )
        };
        let text = format!(
            "%para1_g : <Tensor[Float32], (4)>
{}{}{}{}
subgraph @Update(%para1_g, %para2_w1, %para3_a1, %para4_w2, %para5_a2) {{
  %1(u) = ApplyMomentum(%para2_w1, %para3_a1, {lr1}, %para1_g, 0.9) {{instance name: m1}} primitive_attrs: {{use_nesterov: false}}
  %2(w) = TupleGetItem(%1, 0)
  %3(aw) = Assign(%para2_w1, %2)
  %4(a) = TupleGetItem(%1, 1)
  %5(aa) = Assign(%para3_a1, %4)
  {between}
  %7(u2) = ApplyMomentum(%para4_w2, %para5_a2, {lr2}, %para1_g, 0.9) {{instance name: m2}} primitive_attrs: {{use_nesterov: false}}
  %8(w) = TupleGetItem(%7, 0)
  %9(aw) = Assign(%para4_w2, %8)
  %10(a) = TupleGetItem(%7, 1)
  %11(aa) = Assign(%para5_a2, %10)
  Return(%para1_g)
}}",
            w(2, "w1"),
            w(3, "a1"),
            w(4, "w2"),
            w(5, "a2")
        );
        let mut g = shardc_ir::text::parse_graph(&text, "updates.ir").expect("parses");
        shardc_passes::infer::infer_graph(&mut g).expect("types");
        g
    }

    #[test]
    fn momentum_updates_alike_and_adjacent_form_one_group() {
        let groups = |g: &Graph| update_groups(g, &in_place_updates(g));
        // Nothing between the first update's Assigns and the second update (node 5).
        assert_eq!(groups(&two_updates("0.1", "0.1", "")), [vec![0, 5]]);
        // Another learning rate, or work between them: two launches.
        assert!(groups(&two_updates("0.1", "0.2", "")).is_empty());
        let work = "%6(n) = Neg(%para1_g) {instance name: n}";
        assert!(groups(&two_updates("0.1", "0.1", work)).is_empty());
    }

    /// Adam updates of `w1` and `w2` (their `m`, `v`), sharing the beta powers; the second
    /// with learning rate `lr2` and `op2` (Adam, or ApplyMomentum of w2 and m2).
    fn two_adams(lr2: &str, momentum2: bool) -> Graph {
        let w = |i: usize, name: &str, shape: &str| {
            format!(
                "%para{i}_{name} : <Ref[Tensor(F32)], ({shape}), ref_key=:{name}>  :  has_default  init: zeros\n"
            )
        };
        let weights: String = [
            (2, "w1"),
            (3, "m1"),
            (4, "v1"),
            (5, "w2"),
            (6, "m2"),
            (7, "v2"),
        ]
        .iter()
        .map(|&(i, n)| w(i, n, "4"))
        .chain([w(8, "b1p", "1"), w(9, "b2p", "1")])
        .collect();
        let second = if momentum2 {
            format!(
                "%9(u2) = ApplyMomentum(%para5_w2, %para6_m2, {lr2}, %para1_g, 0.9) {{instance name: a2}} primitive_attrs: {{use_nesterov: false}}"
            )
        } else {
            format!(
                "%9(u2) = Adam(%para5_w2, %para6_m2, %para7_v2, %para8_b1p, %para9_b2p, {lr2}, 0.9, 0.999, 0.00000001, %para1_g) {{instance name: a2}} primitive_attrs: {{use_nesterov: false}}"
            )
        };
        let tail = if momentum2 {
            ""
        } else {
            "%14(v) = TupleGetItem(%9, 2)\n  %15(av) = Assign(%para7_v2, %14)\n  "
        };
        let text = format!(
            "%para1_g : <Tensor[Float32], (4)>
{weights}
subgraph @Update(%para1_g, %para2_w1, %para3_m1, %para4_v1, %para5_w2, %para6_m2, %para7_v2, %para8_b1p, %para9_b2p) {{
  %1(u) = Adam(%para2_w1, %para3_m1, %para4_v1, %para8_b1p, %para9_b2p, 0.001, 0.9, 0.999, 0.00000001, %para1_g) {{instance name: a1}} primitive_attrs: {{use_nesterov: false}}
  %2(w) = TupleGetItem(%1, 0)
  %3(aw) = Assign(%para2_w1, %2)
  %4(m) = TupleGetItem(%1, 1)
  %5(am) = Assign(%para3_m1, %4)
  %6(v) = TupleGetItem(%1, 2)
  %7(av) = Assign(%para4_v1, %6)
  {second}
  %10(w) = TupleGetItem(%9, 0)
  %11(aw) = Assign(%para5_w2, %10)
  %12(m) = TupleGetItem(%9, 1)
  %13(am) = Assign(%para6_m2, %12)
  {tail}Return(%para1_g)
}}"
        );
        let mut g = shardc_ir::text::parse_graph(&text, "adams.ir").expect("parses");
        shardc_passes::infer::infer_graph(&mut g).expect("types");
        g
    }

    #[test]
    fn adam_updates_sharing_their_scalars_form_one_group() {
        let groups = |g: &Graph| update_groups(g, &in_place_updates(g));
        let g = two_adams("0.001", false);
        assert_eq!(groups(&g), [vec![0, 7]], "{}", g.nodes.len());
        // Another learning rate, or another optimizer: two launches.
        assert!(groups(&two_adams("0.002", false)).is_empty());
        assert!(groups(&two_adams("0.001", true)).is_empty());
    }

    /// A moving mean's update as BatchNorm's training step writes it, then `between`.
    fn moving_mean(between: &str) -> Graph {
        let text = format!(
            "%para1_m : <Tensor[Float32], (4)>
%para2_mean : <Ref[Tensor(F32)], (4), ref_key=:mean>  :  has_default  init: zeros

subgraph @Stats(%para1_m, %para2_mean) {{
  %1(a) = Mul(%para2_mean, 0.9) {{instance name: a}}
  %2(b) = Mul(%para1_m, 0.1) {{instance name: b}}
  %3(c) = Add(%1, %2) {{instance name: c}}
  {between}
  %5(s) = Assign(%para2_mean, %3)
  Return(%5)
}}"
        );
        let mut g = shardc_ir::text::parse_graph(&text, "stats.ir").expect("parses");
        shardc_passes::infer::infer_graph(&mut g).expect("types");
        g
    }

    #[test]
    fn an_elementwise_result_assigned_to_its_parameter_is_written_into_it() {
        let g = moving_mean("%4(n) = Neg(%para1_m) {instance name: n}");
        let p = in_place_updates(&g);
        assert_eq!(p[2][0], Some(1), "{p:?}");
        assert!(p.iter().enumerate().all(|(i, v)| i == 2 || v[0].is_none()));
        // A reader of the old mean between the Add and the Assign keeps the copy.
        let g = moving_mean("%4(n) = Neg(%para2_mean) {instance name: n}");
        assert!(in_place_updates(&g)[2][0].is_none());
        // So does a second reader of the new value.
        let g = moving_mean("%4(n) = Neg(%3) {instance name: n}");
        assert!(in_place_updates(&g)[2][0].is_none());
        // Not a map: a reduction's result keeps its buffer.
        let text = "%para1_x : <Tensor[Float32], (2, 4)>
%para2_mean : <Ref[Tensor(F32)], (4), ref_key=:mean>  :  has_default  init: zeros

subgraph @Stats(%para1_x, %para2_mean) {
  %1(r) = ReduceMean(%para1_x, (0)) {instance name: r} primitive_attrs: {keep_dims: false}
  %2(s) = Assign(%para2_mean, %1)
  Return(%2)
}";
        let mut g = shardc_ir::text::parse_graph(text, "r.ir").expect("parses");
        shardc_passes::infer::infer_graph(&mut g).expect("types");
        assert!(in_place_updates(&g)[0][0].is_none());
    }

    #[test]
    fn a_reader_of_the_old_weight_or_of_the_result_keeps_the_copy() {
        // Neg reads w between the update and its Assign: w's update keeps its buffer.
        let g = graph("%2(n) = Neg(%para2_w) {instance name: n}", "%2");
        assert_eq!(in_place_updates(&g)[0], [None, Some(2)]);
        // acc's new value is also returned: it keeps its buffer too.
        let g = graph("%2(n) = Neg(%para1_g) {instance name: n}", "%5");
        assert_eq!(in_place_updates(&g)[0], [Some(1), None]);
        // A second reader of w's new value.
        let g = graph("%2(n) = Neg(%para1_g) {instance name: n}", "%3");
        assert_eq!(in_place_updates(&g)[0], [None, Some(2)]);
    }
}
