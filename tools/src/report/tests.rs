//! Unit tests of the report builder: strategy parsing and colouring, folding of repeated
//! layers, edges between boxes, memory grouping, the measured-times files.

use super::memory::{group, MemoryGroup, RankMemory};
use super::model::*;
use super::svg::stroke_width;
use crate::explain::CommEdge;
use shardc_compiler::graph_layers::RepeatedCell;
use shardc_ir::OpKind;

#[test]
fn strategies_parse_and_bad_text_is_refused() {
    assert_eq!(
        parse_strategy("((2, 4), (4, 1))"),
        Some(vec![vec![2, 4], vec![4, 1]])
    );
    assert_eq!(parse_strategy("((8), ())"), Some(vec![vec![8], vec![]]));
    assert_eq!(
        parse_strategy("((2, 1)) out ((1, 2))"),
        Some(vec![vec![2, 1]])
    );
    assert_eq!(parse_strategy(""), None);
    assert_eq!(parse_strategy("((2, x))"), None);
    assert_eq!(parse_strategy("(2, 4"), None);
}

#[test]
fn ops_are_coloured_by_how_they_are_split() {
    // MatMul(x, w): x is data, w a weight.
    let w = [false, true];
    assert_eq!(classify("((1, 1), (1, 1))", &w, false), Split::Replicated);
    assert_eq!(classify("((8, 1), (1, 1))", &w, false), Split::DataParallel);
    assert_eq!(
        classify("((1, 1), (1, 8))", &w, false),
        Split::ModelParallel
    );
    assert_eq!(classify("((2, 1), (1, 4))", &w, false), Split::Mixed);
    // A split reduction dimension: the result is a partial sum, whatever else.
    assert_eq!(classify("((2, 4), (4, 1))", &w, true), Split::Partial);
    // A non-batch dimension of data counts as model parallelism.
    assert_eq!(classify("((1, 8))", &[false], false), Split::ModelParallel);
    // Not a strategy: no colour is made up.
    assert_eq!(classify("garbage", &w, false), Split::Unknown);
    // Every kind has its own colour and class.
    let mut colours: Vec<&str> = Split::ALL.iter().map(|s| s.colour()).collect();
    colours.dedup();
    assert_eq!(colours.len(), Split::ALL.len());
}

fn op(name: &str, kind: OpKind, strategy: &str, phase: Phase, layer: Option<usize>) -> Op {
    Op {
        name: name.into(),
        kind,
        scope: String::new(),
        strategy: strategy.into(),
        split: classify(strategy, &[false, true], false),
        phase,
        layer,
        node: 0,
    }
}

/// An embedding op, `layers` layers of (MatMul, ReLU) forward and a MatMul backward each,
/// and a head; strategies by `strategy(layer, position)`.
fn layered(layers: usize, strategy: impl Fn(usize, usize) -> String) -> StepGraph {
    let mut ops = vec![op(
        "embed",
        OpKind::Gather,
        "((1, 1), (8))",
        Phase::Forward,
        None,
    )];
    for l in 0..layers {
        ops.push(op(
            &format!("l{l}.mm"),
            OpKind::MatMul,
            &strategy(l, 0),
            Phase::Forward,
            Some(l),
        ));
        ops.push(op(
            &format!("l{l}.relu"),
            OpKind::ReLU,
            &strategy(l, 1),
            Phase::Forward,
            Some(l),
        ));
        ops.push(op(
            &format!("l{l}.grad"),
            OpKind::MatMul,
            &strategy(l, 2),
            Phase::Backward,
            Some(l),
        ));
    }
    ops.push(op(
        "head",
        OpKind::MatMul,
        "((8, 1), (1, 1))",
        Phase::Forward,
        None,
    ));
    let mut edges = Vec::new();
    let mut prev = 0;
    for l in 0..layers {
        let base = 1 + 3 * l;
        edges.push(Edge {
            from: prev,
            to: base,
            comms: vec![],
        });
        edges.push(Edge {
            from: base,
            to: base + 1,
            comms: vec![],
        });
        prev = base + 1;
    }
    edges.push(Edge {
        from: prev,
        to: ops.len() - 1,
        comms: vec![],
    });
    StepGraph {
        ops,
        edges,
        comms: vec![],
        cell: Some(RepeatedCell {
            prefix: "layer".into(),
            cell: "Block".into(),
            count: layers,
        }),
    }
}

fn folds(f: &Folded) -> Vec<&Fold> {
    f.shown
        .iter()
        .filter_map(|b| match b {
            Shown::Folded(x) => Some(x),
            Shown::Op(_) => None,
        })
        .collect()
}

#[test]
fn repeated_layers_with_the_same_plan_fold_into_one_box_per_phase() {
    let s = layered(24, |_, p| {
        ["((8, 1), (1, 1))", "((8, 1))", "((1, 8), (8, 1))"][p].into()
    });
    let f = fold(&s, true);
    let boxes = folds(&f);
    assert_eq!(boxes.len(), 2, "{boxes:?}");
    let fwd = boxes.iter().find(|b| b.phase == Phase::Forward).unwrap();
    assert_eq!(fwd.layers, (1, 23));
    assert_eq!(fwd.ops.len(), 2 * 23);
    assert_eq!(
        fwd.label(s.cell.as_ref()),
        "Block layers 1–23 ×23 (same plan) · forward"
    );
    // Layer 0 is drawn expanded, op by op; so are the embedding and the head.
    for name in ["embed", "l0.mm", "l0.relu", "l0.grad", "head"] {
        let k = s.ops.iter().position(|o| o.name == name).unwrap();
        assert!(matches!(f.shown[f.box_of[k]], Shown::Op(_)), "{name}");
    }
    // 5 ops + 2 folds.
    assert_eq!(f.shown.len(), 7);
    // Edges: no edge inside a fold survives, and the chain reaches the head through it.
    let e = box_edges(&s, &f);
    assert!(e.iter().all(|e| e.from != e.to));
    let fwd_box = f.box_of[s.ops.iter().position(|o| o.name == "l5.mm").unwrap()];
    let head_box = f.box_of[s.ops.len() - 1];
    assert!(e.iter().any(|e| e.from == fwd_box && e.to == head_box));
}

#[test]
fn an_op_whose_plan_differs_stays_unfolded() {
    // Layer 7's MatMul is split differently: it is drawn on its own, the rest folds.
    let s = layered(12, |l, p| {
        if l == 7 && p == 0 {
            "((1, 1), (1, 8))".into()
        } else {
            ["((8, 1), (1, 1))", "((8, 1))", "((1, 8), (8, 1))"][p].into()
        }
    });
    let f = fold(&s, true);
    let k = s.ops.iter().position(|o| o.name == "l7.mm").unwrap();
    assert!(matches!(f.shown[f.box_of[k]], Shown::Op(_)));
    let k = s.ops.iter().position(|o| o.name == "l7.relu").unwrap();
    assert!(matches!(f.shown[f.box_of[k]], Shown::Folded(_)));
    let fwd = folds(&f)
        .into_iter()
        .find(|b| b.phase == Phase::Forward)
        .unwrap();
    assert_eq!(fwd.ops.len(), 2 * 11 - 1);
}

#[test]
fn nothing_folds_without_layers_or_when_asked_not_to() {
    let s = layered(4, |_, _| "((8, 1), (1, 1))".into());
    let f = fold(&s, false);
    assert!(folds(&f).is_empty());
    assert_eq!(f.shown.len(), s.ops.len());
    // A single layer has nothing to fold with.
    let s = layered(1, |_, _| "((8, 1), (1, 1))".into());
    assert!(folds(&fold(&s, true)).is_empty());
    // Layers whose ops differ in kind are not one run.
    let mut s = layered(3, |_, _| "((8, 1), (1, 1))".into());
    s.ops[1 + 3].kind = OpKind::BatchMatMul;
    let forward = |f: &Folded| -> Vec<(usize, usize)> {
        let mut v: Vec<(usize, usize)> = folds(f)
            .iter()
            .filter(|b| b.phase == Phase::Forward)
            .map(|b| b.layers)
            .collect();
        v.sort();
        v
    };
    assert!(forward(&fold(&s, true)).is_empty());
    // The backward ops of those layers are alike: layer 0 expanded, 1–2 folded.
    let back: Vec<(usize, usize)> = folds(&fold(&s, true)).iter().map(|b| b.layers).collect();
    assert_eq!(back, vec![(1, 2)]);
    // Runs either side of a differing layer fold: the first after layer 0 is drawn, the
    // later one folds whole.
    let mut s = layered(7, |_, _| "((8, 1), (1, 1))".into());
    s.ops[1 + 3 * 3].kind = OpKind::BatchMatMul;
    assert_eq!(forward(&fold(&s, true)), vec![(1, 2), (4, 6)]);
}

fn comm(node: usize, op: OpKind, from: &str, to: &str, bytes: f64) -> CommEdge {
    CommEdge {
        node,
        op,
        instance: format!("c{node}"),
        from: from.into(),
        to: to.into(),
        bytes,
        rule: String::new(),
        group: None,
    }
}

#[test]
fn edges_carry_their_communication_summed_and_labelled() {
    let mut s = layered(3, |_, _| "((8, 1), (1, 1))".into());
    s.comms = vec![
        comm(
            10,
            OpKind::AllReduce,
            "l1.relu",
            "l2.mm",
            4.0 * 1024.0 * 1024.0,
        ),
        comm(
            11,
            OpKind::AllReduce,
            "l2.relu",
            "head",
            4.0 * 1024.0 * 1024.0,
        ),
        comm(12, OpKind::AllGather, "l2.relu", "head", 512.0),
    ];
    for e in &mut s.edges {
        let (a, b) = (&s.ops[e.from].name, &s.ops[e.to].name);
        e.comms = s
            .comms
            .iter()
            .enumerate()
            .filter(|(_, c)| &c.from == a && &c.to == b)
            .map(|(i, _)| i)
            .collect();
    }
    let f = fold(&s, true);
    let edges = box_edges(&s, &f);
    let into_head = edges
        .iter()
        .find(|e| e.to == f.box_of[s.ops.len() - 1])
        .unwrap();
    assert_eq!(into_head.label(&s), "AllGather 512 B + AllReduce 4.0 MiB");
    // The AllReduce inside the folded layers is gone with the edge inside the box.
    assert_eq!(
        edges.iter().map(|e| e.comms.len()).sum::<usize>(),
        2,
        "{edges:?}"
    );
    // Wider for more bytes, 1 for none.
    assert_eq!(stroke_width(0.0, 10.0), 1);
    assert!(stroke_width(10.0, 10.0) > stroke_width(1.0, 10.0));
    assert_eq!(human_bytes(4.0 * 1024.0 * 1024.0), "4.0 MiB");
}

#[test]
fn ranks_with_the_same_memory_are_one_bar_and_different_ones_are_not() {
    let m = |w| RankMemory {
        weights: w,
        optimizer_state: 2 * w,
        activations_peak: 100,
        inputs: 10,
    };
    let mems: Vec<(usize, RankMemory)> = (0..8)
        .map(|r| (r, m(if r < 4 { 64 } else { 32 })))
        .collect();
    let stage = |r: usize| Some(r / 4);
    let g = group(&mems, &stage);
    assert_eq!(
        g,
        vec![
            MemoryGroup {
                ranks: (0, 3),
                stage: Some(0),
                memory: m(64)
            },
            MemoryGroup {
                ranks: (4, 7),
                stage: Some(1),
                memory: m(32)
            },
        ]
    );
    assert_eq!(g[0].memory.total(), 64 + 128 + 100 + 10);
    // Equal memory in two stages is still two bars.
    let same: Vec<(usize, RankMemory)> = (0..8).map(|r| (r, m(8))).collect();
    assert_eq!(group(&same, &stage).len(), 2);
    assert_eq!(group(&same, &|_| None).len(), 1);
    // One rank that differs splits the run.
    let mut odd = same.clone();
    odd[5].1.activations_peak = 7;
    assert_eq!(group(&odd, &|_| None).len(), 3);
}

#[test]
fn memory_counts_weights_state_inputs_and_the_live_peak() {
    let text = "%para1_x : <Tensor[Float32], (4, 8)>\n\
        %para2_w : <Ref[Tensor(F32)], (8, 2), ref_key=:w>  :  has_default  init: normal(sigma=0.01, seed=1)\n\
        subgraph @Net(%para1_x, %para2_w) {\n\
          %1(out) = MatMul(%para1_x, %para2_w) {instance name: matmul} primitive_attrs: {transpose_a: false, transpose_b: false}\n\
          %2(r) = ReLU(%1) {instance name: relu}\n\
          Return(%2)\n\
        }\n";
    let mut g = shardc_ir::text::parse_graph(text, "memory.ir").unwrap();
    shardc_passes::infer::infer_graph(&mut g).unwrap();
    let m = RankMemory::of(&g);
    assert_eq!(m.inputs, 4 * 8 * 4);
    assert_eq!(m.weights, 8 * 2 * 4);
    assert_eq!(m.optimizer_state, 0);
    assert!(m.activations_peak >= 4 * 2 * 4, "{m:?}");
}

#[test]
fn measured_times_round_trip_and_bad_files_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let stats = crate::run_stats::stats_path(dir.path(), 3);
    std::fs::create_dir_all(stats.parent().unwrap()).unwrap();
    std::fs::write(
        &stats,
        r#"{"rank": 3, "steps": 4, "nodes": {"matmul": {"calls": 4, "seconds_per_step": 0.5}}}"#,
    )
    .unwrap();
    let all = crate::run_stats::read_all(dir.path()).unwrap();
    assert_eq!(all[&3].steps, 4);
    assert_eq!(all[&3].nodes["matmul"].seconds_per_step, 0.5);
    for (bad, why) in [
        (r#"{"rank": 3, "steps": 4}"#, "\"nodes\""),
        (
            r#"{"rank": 3, "steps": 4, "nodes": {"m": {"calls": 1, "seconds_per_step": -1}}}"#,
            "not a time",
        ),
        ("not json", "not JSON"),
    ] {
        std::fs::write(&stats, bad).unwrap();
        let e = format!("{:#}", crate::run_stats::read_all(dir.path()).unwrap_err());
        assert!(e.contains(why) && e.contains("rank_3.json"), "{e}");
    }
    // No stats folder: no measured times, no error.
    let empty = tempfile::tempdir().unwrap();
    assert!(crate::run_stats::read_all(empty.path()).unwrap().is_empty());
}

#[test]
fn layers_are_read_from_names_where_the_scope_has_none() {
    assert_eq!(
        layer_in_name("layer", "apply_momentum_layer3.attn_q.weight"),
        Some(3)
    );
    assert_eq!(layer_in_name("layer", "assign_layer12_moments"), Some(12));
    // Not a layer: inside a longer word, or no number.
    assert_eq!(layer_in_name("layer", "multilayer3.w"), None);
    assert_eq!(layer_in_name("layer", "layer3x.w"), None);
    assert_eq!(layer_in_name("layer", "layernorm.gamma"), None);
    assert_eq!(layer_in_name("", "layer3"), None);
}

#[test]
fn the_updates_of_an_expanded_layer_are_one_box_and_a_differing_first_layer_stays_drawn() {
    let mut s = layered(5, |_, _| "((8, 1), (1, 1))".into());
    // Layer 0's backward differs from the others' (as a first layer's, without an input
    // gradient, does).
    let g0 = s.ops.iter().position(|o| o.name == "l0.grad").unwrap();
    s.ops[g0].kind = OpKind::BatchMatMul;
    for l in 0..5 {
        for w in ["w", "b"] {
            let mut u = op(
                &format!("apply_l{l}.{w}"),
                OpKind::ApplyMomentum,
                "((1, 1), (1, 1))",
                Phase::Update,
                Some(l),
            );
            u.split = Split::Replicated;
            s.ops.push(u);
        }
    }
    s.ops.push(op(
        "apply_head.w",
        OpKind::ApplyMomentum,
        "((1, 1))",
        Phase::Update,
        None,
    ));
    let f = fold(&s, true);
    let labels: Vec<String> = folds(&f).iter().map(|b| b.label(s.cell.as_ref())).collect();
    assert!(
        labels.contains(&"Block layers 1–4 ×4 (same plan) · forward".to_string()),
        "{labels:?}"
    );
    // Backward: layer 0 differs (drawn op by op), layers 1–4 fold whole.
    assert!(
        labels.contains(&"Block layers 1–4 ×4 (same plan) · backward".to_string()),
        "{labels:?}"
    );
    assert!(
        labels.contains(&"Block layers 1–4 ×4 (same plan) · update".to_string()),
        "{labels:?}"
    );
    assert!(
        labels.contains(&"updates of layer 0".to_string()),
        "{labels:?}"
    );
    assert!(
        labels.contains(&"updates of the other weights".to_string()),
        "{labels:?}"
    );
    let l1 = s.ops.iter().position(|o| o.name == "l1.grad").unwrap();
    assert!(matches!(f.shown[f.box_of[l1]], Shown::Folded(_)));
    // Without folding every op is drawn.
    assert_eq!(fold(&s, false).shown.len(), s.ops.len());
}
