//! The memory plan on synthetic graphs: liveness, the lower bound, the 1.5x bound on
//! MLP-like training graphs, and the invariant that values sharing a buffer never overlap.

mod common;

use common::{mlp_train_graph, Builder};
use shardc_ir::{DType, Graph, OpKind};
use shardc_runtime::memory::{
    plan, plan_aliasing_reshapes, plan_with, Allocator, Location, MemoryPlan,
};

/// No two values whose live ranges overlap share a buffer; every buffer is large enough and
/// of the right dtype; the lower bound holds.
fn check_plan(graph: &Graph, p: &MemoryPlan) {
    assert_eq!(p.values.len(), graph.nodes.len());
    let mut by_buffer: Vec<Vec<(usize, usize, usize, usize)>> = vec![Vec::new(); p.buffer_count];
    for (i, vs) in p.values.iter().enumerate() {
        for (e, v) in vs.iter().enumerate() {
            if let Location::Buffer(b) = v.location {
                let buf = &p.buffers[b];
                assert_eq!(buf.dtype, v.ty.dtype, "%{} element {e}", i + 1);
                assert!(
                    buf.elements >= v.ty.num_elements(),
                    "%{} element {e}",
                    i + 1
                );
                // Aliases (a TupleGetItem, an aliased Reshape) share their value's range.
                if v.def == i {
                    by_buffer[b].push((v.def, v.last_use, i, e));
                } else {
                    assert_eq!(
                        p.values[v.def]
                            .iter()
                            .filter(|w| w.location == v.location)
                            .count(),
                        1
                    );
                }
            }
        }
    }
    for (b, vs) in by_buffer.iter().enumerate() {
        for (k, x) in vs.iter().enumerate() {
            for y in &vs[k + 1..] {
                assert!(
                    x.1 < y.0 || y.1 < x.0,
                    "buffer {b}: %{}[{}] live {}..={} overlaps %{}[{}] live {}..={}",
                    x.2 + 1,
                    x.3,
                    x.0,
                    x.1,
                    y.2 + 1,
                    y.3,
                    y.0,
                    y.1
                );
            }
        }
    }
    assert!(p.peak_bytes >= p.live_peak_bytes);
    assert_eq!(
        p.peak_bytes,
        p.buffers.iter().map(|b| b.bytes()).sum::<usize>()
    );
    assert_eq!(p.buffer_count, p.buffers.len());
}

#[test]
fn deep_mlp_peak_within_1_5x_of_live_peak() {
    let cases: Vec<(usize, Vec<usize>)> = vec![
        (16, vec![64, 128, 96, 128, 32, 10]),
        (32, vec![784, 512, 512, 256, 10]),
        (8, vec![100, 300, 300, 300, 300, 300, 300, 300, 300, 10]),
        (128, vec![32, 64, 64, 64, 64, 64, 64, 64, 64, 64, 64, 16]),
        (4, vec![10, 20, 40, 80, 160, 80, 40, 20, 10]),
    ];
    for (batch, widths) in cases {
        for interleave in [false, true] {
            let graph = mlp_train_graph(batch, &widths, DType::Float32, interleave);
            let p = plan(&graph);
            check_plan(&graph, &p);
            for alloc in [Allocator::InOrder, Allocator::BySize] {
                let q = plan_with(&graph, alloc);
                check_plan(&graph, &q);
                assert_eq!(q.live_peak_bytes, p.live_peak_bytes);
                assert!(
                    q.peak_bytes >= p.peak_bytes,
                    "plan keeps the better allocation"
                );
                eprintln!(
                    "  {alloc}: {:.3}x",
                    q.peak_bytes as f64 / q.live_peak_bytes as f64
                );
            }
            let all: usize = p.values.iter().flatten().map(|v| v.ty.size_bytes()).sum();
            let ratio = p.peak_bytes as f64 / p.live_peak_bytes as f64;
            eprintln!("batch {batch} widths {widths:?} interleave {interleave}: {ratio:.3}x ({}, {} buffers)", p.allocator, p.buffer_count);
            assert!(
                ratio <= 1.5,
                "batch {batch} widths {widths:?} interleave {interleave}: peak {} live peak {} ({ratio:.3}x)",
                p.peak_bytes,
                p.live_peak_bytes
            );
            assert!(p.peak_bytes < all, "no reuse at all");
            assert!(p
                .worst_node
                .starts_with(&format!("%{} ", p.worst_point + 1)));
        }
    }
}

/// The live peak is exactly the hand-computed one on a small graph.
#[test]
fn live_peak_by_hand() {
    // x(2,3) -> relu a(2,3) -> square b(2,3) -> add(a, b) c(2,3) -> sum d()
    let mut bld = Builder::new("Small");
    let x = bld.input("x", DType::Float64, &[2, 3]);
    let a = bld.same(OpKind::ReLU, vec![x]);
    let b = bld.same(OpKind::Square, vec![a.clone()]);
    let c = bld.same(OpKind::Add, vec![a, b]);
    let d = bld.reduce_sum(c);
    let graph = bld.finish(vec![d]);
    let p = plan(&graph);
    check_plan(&graph, &p);
    // At %3 (add): a, b and c are live: 3 * 48 bytes.
    assert_eq!(p.live_peak_bytes, 3 * 48);
    assert_eq!(p.worst_point, 2);
    assert_eq!(p.worst_node, "%3 Add 'add3'");
    // a dies at %3, b too: c cannot share with them; d can take a's or b's buffer? No: d is
    // a scalar, allocated best-fit into a freed 48-byte buffer.
    assert_eq!(p.peak_bytes, 3 * 48);
    assert_eq!(p.buffer_count, 3);
    assert_eq!(p.values[0][0].last_use, 2);
    assert_eq!(p.values[3][0].last_use, 4, "an output lives to the end");
    assert_eq!(p.input_bytes, 48);
    assert_eq!(p.weight_bytes, 0);
    let s = p.summary();
    assert!(s.contains("%3 Add 'add3'"), "{s}");
    assert!(s.contains("inputs"), "{s}");
}

/// For the GPU executor, a Reshape of a node's result lives in that result's buffer, which
/// stays live through the Reshape's readers; the CPU's plan gives it a buffer of its own.
#[test]
fn an_aliased_reshape_keeps_its_input_alive_through_its_readers() {
    use shardc_ir::{Attrs, Const, Operand, TensorType, Type};
    let mut bld = Builder::new("Reshaped");
    let x = bld.input("x", DType::Float32, &[2, 6]);
    let a = bld.same(OpKind::ReLU, vec![x.clone()]); // %1
    let shape = Operand::Const(Const::Ints(vec![3, 4]));
    let r = bld.op(
        OpKind::Reshape,
        vec![a.clone(), shape.clone()],
        Attrs::new(),
        Type::Tensor(TensorType::new(DType::Float32, vec![3, 4])),
    ); // %2
    let r2 = bld.op(
        OpKind::Reshape,
        vec![r.clone(), Operand::Const(Const::Ints(vec![12]))],
        Attrs::new(),
        Type::Tensor(TensorType::new(DType::Float32, vec![12])),
    ); // %3
    let unrelated = bld.same(OpKind::Neg, vec![x.clone()]); // %4
    let b = bld.same(OpKind::Square, vec![r2]); // %5: reads a through two reshapes
    let c = bld.same(OpKind::Square, vec![unrelated]); // %6
    let graph = bld.finish(vec![b, c]);
    let p = plan_aliasing_reshapes(&graph);
    check_plan(&graph, &p);
    let loc = |i: usize| p.values[i][0].location;
    assert_eq!(loc(1), loc(0), "the Reshape is its input in place");
    assert_eq!(loc(2), loc(0), "so is a Reshape of a Reshape");
    assert_eq!(
        p.values[0][0].last_use, 4,
        "a lives until the Square that reads its alias"
    );
    assert_ne!(loc(3), loc(0), "the Neg cannot take a's buffer meanwhile");
    // The CPU's plan copies: the Reshapes have buffers of their own.
    let q = plan(&graph);
    check_plan(&graph, &q);
    assert_ne!(q.values[1][0].location, q.values[0][0].location);
    assert_eq!(q.values[0][0].last_use, 1);
}

/// A dead result (never read, not returned) is freed at its own node.
#[test]
fn dead_values_are_freed_at_once() {
    let mut bld = Builder::new("Dead");
    let x = bld.input("x", DType::Float32, &[256]);
    let mut h = x.clone();
    for _ in 0..10 {
        // Each iteration computes an unused Square and a used ReLU.
        let _dead = bld.same(OpKind::Square, vec![x.clone()]);
        h = bld.same(OpKind::ReLU, vec![h]);
    }
    let graph = bld.finish(vec![h]);
    let p = plan(&graph);
    check_plan(&graph, &p);
    assert!(p.buffer_count <= 3, "{} buffers", p.buffer_count);
}

#[test]
fn empty_graph_plans() {
    let graph = Builder::new("Empty").finish(vec![]);
    let p = plan(&graph);
    assert_eq!(p.peak_bytes, 0);
    assert_eq!(p.live_peak_bytes, 0);
    assert_eq!(p.buffer_count, 0);
    assert!(p.summary().contains("@Empty"));
}
