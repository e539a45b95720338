//! shardc's plans against MindSpore's rule, op by op.
//!
//! For each op with a parallel rule, a one-op training step (the op, then a mean loss;
//! `Momentum`) is annotated with every valid strategy at 4 and 8 devices. MindSpore's plan for
//! the same annotation ([`shardc_tools::plan_compare::mindspore_rule_plan`]: the op's forward
//! communication, its transpose in the backward, the redistribution to the loss and back,
//! mirror AllReduces for replicated weights) is set against:
//! - shardc's `semi_auto_parallel` plan (rank 0's execute graph): never dominated, that is
//!   never at least as many collectives *and* at least as many bytes with one of the two
//!   strictly more;
//! - shardc's `auto_parallel` sharding propagation plan: predicted no slower under shardc's
//!   cost model than MindSpore's plan priced by the same model.
//!
//! The distribution of the comparisons is printed (`--no-capture` shows it).
//!
//! One exception to the first check, ReduceMax: MindSpore's bprop of its forward
//! `AllReduce(max)` all-reduces `dout` and masks it where the local input equals the maximum
//! (`get_bprop_all_reduce`), so a maximum that two ranks hold gets its gradient twice. shardc's
//! gradient shares it exactly among the ties, which needs the count of ties across the reduced
//! ranks: at these sizes one more small AllReduce or a gather, against which MindSpore's
//! inexact plan can win on bytes. Its propagation plan is still checked against MindSpore's.

use shardc::compiler::builder::{BuildError, GraphBuilder, Value};
use shardc::compiler::init;
use shardc::ir::{DType, Graph, OpKind};
use shardc::passes::parallel::rules::{candidates, dims_of, strategy_from_loops};
use shardc::passes::parallel::{Mode, SearchMode};
use shardc_tools::plan_compare::{mindspore_rule_plan, options, plan};

const F: DType = DType::Float32;

type Build = fn(&mut GraphBuilder) -> Result<Value, BuildError>;

fn w(b: &mut GraphBuilder, name: &str, shape: &[usize]) -> Result<Value, BuildError> {
    b.weight(name, F, shape, init::normal(0.1))
}

/// The op under test on its operands: `(name, the op whose strategy is varied, builder)`.
fn cases() -> Vec<(&'static str, OpKind, Build)> {
    vec![
        ("MatMul", OpKind::MatMul, |b| {
            let x = b.input("x", F, &[8, 16])?;
            let w = w(b, "w", &[16, 8])?;
            b.matmul(x, w)
        }),
        ("MatMul transpose_b", OpKind::MatMul, |b| {
            let x = b.input("x", F, &[8, 16])?;
            let w = w(b, "w", &[8, 16])?;
            b.matmul_t(x, w, false, true)
        }),
        ("BatchMatMul", OpKind::BatchMatMul, |b| {
            let x = b.input("x", F, &[8, 8, 16])?;
            let w = w(b, "w", &[8, 16, 8])?;
            b.batch_matmul(x, w, false, false)
        }),
        ("BiasAdd", OpKind::BiasAdd, |b| {
            let x = b.input("x", F, &[8, 16])?;
            let w = w(b, "bias", &[16])?;
            b.bias_add(x, w)
        }),
        ("Add", OpKind::Add, |b| {
            let x = b.input("x", F, &[8, 16])?;
            let w = w(b, "w", &[8, 16])?;
            b.add(x, w)
        }),
        ("Mul", OpKind::Mul, |b| {
            let x = b.input("x", F, &[8, 16])?;
            let w = w(b, "w", &[8, 16])?;
            b.mul(x, w)
        }),
        ("ReLU", OpKind::ReLU, |b| {
            let w = w(b, "w", &[8, 16])?;
            b.relu(w)
        }),
        ("GeLU", OpKind::GeLU, |b| {
            let w = w(b, "w", &[8, 16])?;
            b.gelu(w)
        }),
        ("Tanh", OpKind::Tanh, |b| {
            let w = w(b, "w", &[8, 16])?;
            b.tanh(w)
        }),
        ("Square", OpKind::Square, |b| {
            let w = w(b, "w", &[8, 16])?;
            b.square(w)
        }),
        ("Softmax", OpKind::Softmax, |b| {
            let w = w(b, "w", &[8, 16])?;
            b.softmax(w, -1)
        }),
        ("ReduceSum", OpKind::ReduceSum, |b| {
            let w = w(b, "w", &[8, 16])?;
            b.reduce_sum(w, &[1], false)
        }),
        ("ReduceMean", OpKind::ReduceMean, |b| {
            let w = w(b, "w", &[8, 16])?;
            b.reduce_mean(w, &[0], false)
        }),
        ("ReduceMax", OpKind::ReduceMax, |b| {
            let w = w(b, "w", &[8, 16])?;
            b.reduce_max(w, &[1], false)
        }),
        ("Transpose", OpKind::Transpose, |b| {
            let w = w(b, "w", &[8, 16])?;
            b.transpose(w, &[1, 0])
        }),
        ("Gather", OpKind::Gather, |b| {
            let idx = b.input("idx", DType::Int32, &[8])?;
            let table = w(b, "table", &[32, 8])?;
            b.gather(table, idx, 0)
        }),
    ]
}

/// The one-op network: the op, then the mean of its result as the loss.
fn network(name: &str, build: Build) -> Graph {
    let mut b = GraphBuilder::new(name);
    let y = build(&mut b).unwrap_or_else(|e| panic!("{name}: {e}"));
    let loss = b.reduce_mean(y, &[], false).unwrap();
    b.finish(&[loss]).unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[derive(Default)]
struct Tally {
    cases: usize,
    both_fewer: usize,
    fewer_collectives: usize,
    fewer_bytes: usize,
    equal: usize,
    traded: usize,
    /// Dominated (ReduceMax only: see the module documentation).
    dominated: usize,
}

#[test]
fn shardc_plans_are_never_dominated_by_mindspores_rule() {
    let mut tally = Tally::default();
    let mut failures = Vec::new();
    for devices in [4usize, 8] {
        for (name, kind, build) in cases() {
            let forward = network(name, build);
            let k = forward
                .nodes
                .iter()
                .position(|n| n.op == kind)
                .unwrap_or_else(|| panic!("{name}: no {kind} node"));
            let dims = dims_of(&forward, &forward.nodes[k]).unwrap();
            for splits in candidates(&forward, &forward.nodes[k], &dims, devices, 4) {
                let mut g = forward.clone();
                let s = strategy_from_loops(&g, &g.nodes[k], &dims, &splits);
                g.nodes[k].in_strategy = Some(s.clone());
                let what = format!("{name} {s} on {devices}");
                let machine = Default::default();
                let semi = match plan(
                    &g,
                    &options(
                        devices,
                        Mode::SemiAutoParallel,
                        SearchMode::ShardingPropagation,
                        machine,
                    ),
                ) {
                    Ok(p) => p,
                    Err(e) => {
                        failures.push(format!("{what}: semi_auto_parallel: {e:#}"));
                        continue;
                    }
                };
                let ms = mindspore_rule_plan(
                    &semi.compiled.begin,
                    &semi.compiled.assignment,
                    &machine,
                    false,
                );
                let sd = semi.rank0;
                tally.cases += 1;
                let (fc, fb) = (sd.collectives < ms.collectives, sd.bytes < ms.bytes - 1e-6);
                let (ec, eb) = (
                    sd.collectives == ms.collectives,
                    (sd.bytes - ms.bytes).abs() <= 1e-6,
                );
                match () {
                    _ if sd.dominated_by(&ms) => tally.dominated += 1,
                    _ if fc && fb => tally.both_fewer += 1,
                    _ if fc && eb => tally.fewer_collectives += 1,
                    _ if fb && ec => tally.fewer_bytes += 1,
                    _ if ec && eb => tally.equal += 1,
                    _ => tally.traded += 1,
                }
                if sd.dominated_by(&ms) && kind != OpKind::ReduceMax {
                    failures.push(format!(
                        "{what}: semi_auto_parallel sends {} collectives, {:.0} bytes; \
                         MindSpore's rule {} collectives, {:.0} bytes",
                        sd.collectives, sd.bytes, ms.collectives, ms.bytes
                    ));
                }
                let prop = match plan(
                    &g,
                    &options(
                        devices,
                        Mode::AutoParallel,
                        SearchMode::ShardingPropagation,
                        machine,
                    ),
                ) {
                    Ok(p) => p,
                    Err(e) => {
                        failures.push(format!("{what}: sharding_propagation: {e:#}"));
                        continue;
                    }
                };
                let ms_predicted = semi.compute + ms.seconds;
                if prop.predicted > ms_predicted * (1.0 + 1e-9) {
                    failures.push(format!(
                        "{what}: sharding propagation predicted {:.3} us, MindSpore's rule \
                         {:.3} us",
                        prop.predicted * 1e6,
                        ms_predicted * 1e6
                    ));
                }
            }
        }
    }
    eprintln!(
        "{} cases against MindSpore's rule: fewer collectives and fewer bytes {}, fewer \
         collectives (same bytes) {}, fewer bytes (same collectives) {}, the same {}, one \
         fewer and the other more {}, dominated {} (ReduceMax, exact on ties)",
        tally.cases,
        tally.both_fewer,
        tally.fewer_collectives,
        tally.fewer_bytes,
        tally.equal,
        tally.traded,
        tally.dominated
    );
    assert!(tally.cases > 150, "only {} cases", tally.cases);
    assert!(
        failures.is_empty(),
        "{} of {} cases:\n{}",
        failures.len(),
        tally.cases,
        failures.join("\n")
    );
}
