//! The memory plan on synthetic graphs: liveness, the lower bound, the 1.5x bound on
//! MLP-like training graphs, and the invariant that values sharing a buffer never overlap.

mod common;

use common::{mlp_train_graph, Builder};
use shardc_ir::{DType, Graph, OpKind};
use shardc_runtime::memory::{plan, plan_with, Allocator, Location, MemoryPlan};

/// No two values whose live ranges overlap share a buffer; every buffer is large enough and
/// of the right dtype; the lower bound holds.
fn check_plan(graph: &Graph, p: &MemoryPlan) {
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
                if graph.nodes[i].op != OpKind::TupleGetItem {
                    by_buffer[b].push((v.def, v.last_use, i, e));
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
