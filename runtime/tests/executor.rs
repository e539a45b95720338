//! The executor on a naive test backend: results equal a fresh-tensor reference interpreter,
//! TupleGetItem aliases, Assign updates weights across steps, buffers are reused, feeds and
//! parameters are checked with clear errors.

mod common;

use common::{borrow, feeds_for, mlp_train_graph, reference_step, Builder, TestBackend};
use shardc_ir::{Attr, Attrs, Const, DType, Init, Node, OpKind, Operand, TensorType, Type};
use shardc_runtime::executor::Executor;
use shardc_runtime::memory::{Allocator, Location};
use shardc_runtime::{Arg, Backend, KernelContext, KernelError, RuntimeError, Tensor};
use std::collections::HashMap;
use std::sync::Arc;

fn assert_close(a: &Tensor, b: &Tensor, tol: f64, what: &str) {
    assert_eq!(a.shape, b.shape, "{what}: shapes");
    assert_eq!(a.dtype(), b.dtype(), "{what}: dtypes");
    for (i, (x, y)) in a.to_f64_vec().iter().zip(b.to_f64_vec()).enumerate() {
        assert!(
            (x - y).abs() <= tol * (1.0 + y.abs()),
            "{what}[{i}]: {x} vs {y}"
        );
    }
}

/// The executor with buffer reuse computes what the fresh-tensor reference computes, step
/// after step, for both update orders and both float types.
#[test]
fn mlp_training_matches_reference() {
    for (dtype, interleave, allocator) in [
        (DType::Float64, false, Allocator::Best),
        (DType::Float64, true, Allocator::Best),
        (DType::Float32, true, Allocator::Best),
        (DType::Float64, false, Allocator::InOrder),
        (DType::Float64, false, Allocator::BySize),
        (DType::Float32, true, Allocator::BySize),
    ] {
        let graph = mlp_train_graph(4, &[6, 10, 3, 8, 2], dtype, interleave);
        let mut exec =
            Executor::with_allocator(graph.clone(), Arc::new(TestBackend), allocator).unwrap();
        if allocator != Allocator::Best {
            assert_eq!(exec.memory_plan().allocator, allocator);
        }
        let mut ref_weights: HashMap<usize, Tensor> = HashMap::new();
        for (i, p) in graph.params.iter().enumerate() {
            if p.is_weight() {
                ref_weights.insert(i, exec.param(&p.name).unwrap().clone());
            }
        }
        let tol = if dtype == DType::Float64 { 1e-12 } else { 1e-5 };
        let mut losses = Vec::new();
        for step in 0..5 {
            let feeds = feeds_for(&graph, step % 2);
            let got = exec.step(&borrow(&feeds)).unwrap();
            let want = reference_step(&graph, &TestBackend, &mut ref_weights, &feeds, step);
            assert_eq!(got.len(), 1);
            assert_close(&got[0], &want[0], tol, "loss");
            for (i, p) in graph.params.iter().enumerate() {
                if p.is_weight() {
                    assert_close(exec.param(&p.name).unwrap(), &ref_weights[&i], tol, &p.name);
                }
            }
            losses.push(got[0].scalar_value().unwrap());
        }
        // Training on a repeating pair of batches lowers the loss.
        assert!(losses[4] < losses[0], "{losses:?}");
        assert_eq!(exec.step_count(), 5);
        let plan = exec.memory_plan();
        assert_eq!(
            exec.stats().buffer_allocations,
            plan.buffer_count as u64,
            "steps allocated buffers"
        );
        assert!(
            plan.peak_bytes
                < plan
                    .values
                    .iter()
                    .flatten()
                    .map(|v| v.ty.size_bytes())
                    .sum()
        );
        let stats = exec.stats();
        assert_eq!(stats.steps, 5);
        assert_eq!(stats.per_op[&OpKind::MatMul].count, 5 * 11);
        assert_eq!(stats.per_op[&OpKind::Assign].count, 5 * 4);
        // Node by node: every node's calls and time, adding up to the op kinds' totals.
        let graph = exec.graph();
        assert_eq!(stats.per_node.len(), graph.nodes.len());
        for (op, s) in &stats.per_op {
            let nodes = graph
                .nodes
                .iter()
                .zip(&stats.per_node)
                .filter(|(n, _)| n.op == *op);
            let (calls, time) = nodes.fold((0, std::time::Duration::ZERO), |(c, t), (_, n)| {
                (c + n.count, t + n.time)
            });
            assert_eq!((calls, time), (s.count, s.time), "{op:?}");
        }
        let table = stats.to_string();
        assert!(
            table.contains("MatMul") && table.contains("5 steps"),
            "{table}"
        );
    }
}

/// `w' = w + 1; Assign(w, w')` counts steps; with the new value also returned, the Assign
/// copies (the value lives on); without, it moves the buffer. Both keep counting right.
#[test]
fn assign_counter_across_steps() {
    for return_value in [false, true] {
        let mut b = Builder::new("Counter");
        let w = b.weight("w", DType::Float32, &[3], Init::Constant { value: 10.0 });
        let x = b.input("x", DType::Float32, &[3]);
        let next = b.same(
            OpKind::Add,
            vec![w.clone(), Operand::Const(Const::Float(1.0))],
        );
        let y = b.same(OpKind::Mul, vec![x, w.clone()]);
        let loss = b.reduce_sum(y);
        let assigned = b.assign(w, next.clone());
        let outputs = if return_value {
            vec![loss, next, assigned]
        } else {
            vec![loss, assigned]
        };
        let graph = b.finish(outputs);
        let mut exec = Executor::new(graph, Arc::new(TestBackend)).unwrap();
        assert_eq!(exec.param("w").unwrap().to_f64_vec(), vec![10.0; 3]);
        let ones = Tensor::from_f32(vec![3], vec![1.0; 3]).unwrap();
        for step in 0..4 {
            let before = exec.param("w").unwrap().as_f32().unwrap().as_ptr();
            let out = exec.step(&[("x", ones.clone())]).unwrap();
            let after = exec.param("w").unwrap().as_f32().unwrap().as_ptr();
            // Moved (the storage changes) when the new value has no later use, copied (the
            // storage stays) when it is also returned.
            assert_eq!(before == after, return_value, "step {step}");
            let w_before = 10.0 + step as f64;
            // The loss reads w before the Assign.
            assert_eq!(out[0].scalar_value(), Some(3.0 * w_before));
            // The Assign's result is the parameter's new value.
            assert_eq!(out.last().unwrap().to_f64_vec(), vec![w_before + 1.0; 3]);
            if return_value {
                assert_eq!(out[1].to_f64_vec(), vec![w_before + 1.0; 3]);
            }
            assert_eq!(
                exec.param("w").unwrap().to_f64_vec(),
                vec![w_before + 1.0; 3]
            );
        }
        assert_eq!(
            exec.stats().buffer_allocations,
            exec.memory_plan().buffer_count as u64
        );
        // Resuming: the counter and set_param.
        exec.set_step_count(100);
        exec.set_param("w", Tensor::from_f32(vec![3], vec![0.0, 1.0, 2.0]).unwrap())
            .unwrap();
        exec.step(&[("x", ones.clone())]).unwrap();
        assert_eq!(exec.step_count(), 101);
        assert_eq!(exec.param("w").unwrap().to_f64_vec(), vec![1.0, 2.0, 3.0]);
    }
}

/// TupleGetItem resolves to the tuple element's buffer, and elements are read correctly.
#[test]
fn tuple_get_item_is_an_alias() {
    let mut b = Builder::new("Tuples");
    let x = b.input("x", DType::Float64, &[4, 2]);
    let half = TensorType::new(DType::Float64, vec![2, 2]);
    let split = b.op(
        OpKind::Split,
        vec![x],
        Attrs::new()
            .with("axis", Attr::Int(0))
            .with("output_num", Attr::Int(2)),
        Type::Tuple(vec![half.clone(), half.clone()]),
    );
    let first = b.op(
        OpKind::TupleGetItem,
        vec![split.clone(), Operand::Const(Const::Int(0))],
        Attrs::new(),
        Type::Tensor(half.clone()),
    );
    let second = b.op(
        OpKind::TupleGetItem,
        vec![split.clone(), Operand::Const(Const::Int(1))],
        Attrs::new(),
        Type::Tensor(half.clone()),
    );
    let diff = b.same(OpKind::Sub, vec![second.clone(), first.clone()]);
    let relu = b.same(OpKind::ReLU, vec![diff.clone()]);
    // The first element stays live until here, through its alias.
    let sum = b.same(OpKind::Add, vec![relu, first]);
    let graph = b.finish(vec![sum, second]);
    let mut exec = Executor::new(graph, Arc::new(TestBackend)).unwrap();
    let plan = exec.memory_plan();
    assert_eq!(plan.location(1, 0), plan.location(0, 0));
    assert_eq!(plan.location(2, 0), plan.location(0, 1));
    assert_ne!(plan.location(0, 0), plan.location(0, 1));
    // Element 0 is read (through its alias) by node 5, element 1 is a graph output.
    assert_eq!(plan.values[0][0].last_use, 5);
    assert_eq!(plan.values[1][0].last_use, 5);
    assert_eq!(plan.values[0][1].last_use, 6);
    // The ReLU's output may not take element 0's buffer (it is still live).
    assert_ne!(plan.location(4, 0), plan.location(0, 0));
    let x = Tensor::from_f64(vec![4, 2], vec![1.0, 5.0, 2.0, 2.0, 3.0, 4.0, 0.0, 1.0]).unwrap();
    let out = exec.step(&[("x", x)]).unwrap();
    // second - first = [2, -1, -2, -1] -> relu [2, 0, 0, 0]; + first.
    assert_eq!(out[0].to_f64_vec(), vec![3.0, 5.0, 2.0, 2.0]);
    assert_eq!(out[1].to_f64_vec(), vec![3.0, 4.0, 0.0, 1.0]);
}

/// A long chain of elementwise ops reuses two buffers.
#[test]
fn long_chain_reuses_buffers() {
    let mut b = Builder::new("Chain");
    let x = b.input("x", DType::Float32, &[64, 32]);
    let mut h = x;
    for k in 0..50 {
        let op = if k % 2 == 0 {
            OpKind::ReLU
        } else {
            OpKind::Square
        };
        h = b.same(op, vec![h]);
    }
    let loss = b.reduce_sum(h);
    let graph = b.finish(vec![loss]);
    let mut exec = Executor::new(graph.clone(), Arc::new(TestBackend)).unwrap();
    let plan = exec.memory_plan().clone();
    let all: usize = plan
        .values
        .iter()
        .flatten()
        .map(|v| v.ty.size_bytes())
        .sum();
    assert_eq!(plan.live_peak_bytes, 2 * 64 * 32 * 4);
    // The scalar sum takes the buffer freed by the next-to-last activation.
    assert_eq!(plan.peak_bytes, 2 * 64 * 32 * 4);
    assert_eq!(plan.buffer_count, 2);
    assert!(plan.peak_bytes * 10 < all);
    let x = Tensor::from_f32(
        vec![64, 32],
        (0..2048).map(|i| (i % 3) as f32 - 1.0).collect(),
    )
    .unwrap();
    let out = exec.step(&[("x", x.clone())]).unwrap();
    // relu then square alternately: (relu(x))^(2^25) stays 0 or 1 for x in {-1, 0, 1}.
    let want = x.to_f64_vec().iter().filter(|&&v| v == 1.0).count() as f64;
    assert_eq!(out[0].scalar_value(), Some(want));
    let summary = plan.summary();
    eprintln!("{summary}\n{}", exec.stats());
    assert!(
        summary.contains("live peak") && summary.contains("@Chain"),
        "{summary}"
    );
}

#[test]
fn feeds_are_checked() {
    let graph = mlp_train_graph(2, &[3, 4, 2], DType::Float32, true);
    let mut exec = Executor::new(graph.clone(), Arc::new(TestBackend)).unwrap();
    let feeds = feeds_for(&graph, 0);
    let x = feeds[0].1.clone();
    let label = feeds[1].1.clone();

    let err = exec.step(&[("x", x.clone())]).unwrap_err();
    assert!(matches!(err, RuntimeError::MissingFeed { .. }));
    assert_eq!(
        err.to_string(),
        "input 'label' was not fed; it expects <Tensor[Float32], (2, 2)>"
    );

    let wrong = Tensor::from_f32(vec![3, 2], vec![0.0; 6]).unwrap();
    let err = exec
        .step(&[("x", x.clone()), ("label", wrong)])
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "input 'label' expects <Tensor[Float32], (2, 2)> but was fed <Tensor[Float32], (3, 2)>"
    );
    let wrong_dtype = Tensor::from_f64(vec![2, 2], vec![0.0; 4]).unwrap();
    let err = exec
        .step(&[("x", x.clone()), ("label", wrong_dtype)])
        .unwrap_err();
    assert!(
        err.to_string().contains("<Tensor[Float64], (2, 2)>"),
        "{err}"
    );

    let err = exec
        .step(&[
            ("x", x.clone()),
            ("label", label.clone()),
            ("lable", label.clone()),
        ])
        .unwrap_err();
    assert!(err.to_string().contains("'lable'"), "{err}");
    assert!(err.to_string().contains("x, label"), "{err}");

    let err = exec
        .step(&[
            ("x", x.clone()),
            ("label", label.clone()),
            ("w1", label.clone()),
        ])
        .unwrap_err();
    assert!(err.to_string().contains("weight"), "{err}");

    let err = exec
        .step(&[("x", x.clone()), ("x", x.clone()), ("label", label.clone())])
        .unwrap_err();
    assert!(matches!(err, RuntimeError::DuplicateFeed { .. }), "{err}");

    // Failed feeds leave the executor as it was.
    assert_eq!(exec.step_count(), 0);
    exec.step(&[("label", label), ("x", x)]).unwrap();
    assert_eq!(exec.step_count(), 1);
}

#[test]
fn params_are_checked() {
    let graph = mlp_train_graph(2, &[3, 4, 2], DType::Float32, true);
    let mut exec = Executor::new(graph, Arc::new(TestBackend)).unwrap();
    let names: Vec<&str> = exec.weights().map(|(n, _)| n).collect();
    assert_eq!(names, ["w1", "w2"]);
    assert!(exec.param("x").is_none());
    assert!(exec.param("nope").is_none());
    let err = exec
        .set_param("w1", Tensor::from_f32(vec![4, 3], vec![0.0; 12]).unwrap())
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "parameter 'w1' is <Tensor[Float32], (3, 4)> but the new value is <Tensor[Float32], (4, 3)>"
    );
    let err = exec.set_param("nope", Tensor::scalar_f32(0.0)).unwrap_err();
    assert!(matches!(err, RuntimeError::UnknownParam { .. }));
    assert!(err.to_string().contains("'nope'"), "{err}");
    let err = exec.set_param("x", Tensor::scalar_f32(0.0)).unwrap_err();
    assert!(err.to_string().contains("data input"), "{err}");
    // Weights start from their initializers.
    let w1 = exec.param("w1").unwrap().clone();
    let want = shardc_runtime::init::init_tensor(
        &Init::XavierUniform { gain: 1.0, seed: 1 },
        &TensorType::new(DType::Float32, vec![3, 4]),
    )
    .unwrap();
    assert_eq!(w1, want);
}

#[test]
fn communication_needs_a_communicator() {
    let mut b = Builder::new("Comm");
    let x = b.input("x", DType::Float32, &[4]);
    let r = b.op(
        OpKind::AllReduce,
        vec![x.clone()],
        Attrs::new().with("op", Attr::Str("sum".into())),
        Type::Tensor(b.ty(&x)),
    );
    let mut graph = b.finish(vec![r]);
    graph.nodes[0].instance = "x".into();
    let err = Executor::new(graph, Arc::new(TestBackend)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "op AllReduce 'x' needs a communicator; run under shardc launch or shardc verify"
    );
}

#[test]
fn malformed_graphs_are_errors() {
    // A tuple read as a tensor.
    let mut b = Builder::new("Bad");
    let x = b.input("x", DType::Float32, &[4, 2]);
    let half = TensorType::new(DType::Float32, vec![2, 2]);
    let split = b.op(
        OpKind::Split,
        vec![x],
        Attrs::new().with("output_num", Attr::Int(2)),
        Type::Tuple(vec![half.clone(), half.clone()]),
    );
    let r = b.op(OpKind::ReLU, vec![split], Attrs::new(), Type::Tensor(half));
    let graph = b.finish(vec![r]);
    let err = Executor::new(graph, Arc::new(TestBackend)).unwrap_err();
    assert!(err.to_string().contains("only TupleGetItem"), "{err}");

    // An initializer that cannot produce its weight names the parameter.
    let mut b = Builder::new("BadInit");
    let w = b.weight("steps", DType::Int32, &[1], Init::HeNormal { seed: 0 });
    let graph = b.finish(vec![w]);
    let err = Executor::new(graph, Arc::new(TestBackend)).unwrap_err();
    assert!(err.to_string().contains("parameter 'steps'"), "{err}");

    // Assign to a data input.
    let mut b = Builder::new("BadAssign");
    let x = b.input("x", DType::Float32, &[2]);
    let y = b.same(OpKind::ReLU, vec![x.clone()]);
    let a = b.assign(x, y);
    let graph = b.finish(vec![a]);
    let err = Executor::new(graph, Arc::new(TestBackend)).unwrap_err();
    assert!(err.to_string().contains("weight parameter"), "{err}");
}

/// A backend that fails or leaves outputs of the wrong shape gets a typed error naming the
/// node, and the executor stays usable.
#[test]
fn kernel_errors_name_the_node() {
    struct Flaky;
    impl Backend for Flaky {
        fn name(&self) -> &str {
            "flaky"
        }
        fn run(
            &self,
            node: &Node,
            inputs: &[Arg<'_>],
            outputs: &mut [Tensor],
            ctx: &KernelContext,
        ) -> Result<(), KernelError> {
            match ctx.step {
                0 => Err(KernelError::new(node, "deliberate failure")),
                1 => {
                    outputs[0] = Tensor::from_f32(vec![1], vec![0.0]).unwrap();
                    Ok(())
                }
                _ => TestBackend.run(node, inputs, outputs, ctx),
            }
        }
    }
    let mut b = Builder::new("Flaky");
    let x = b.input("x", DType::Float32, &[2]);
    let r = b.same(OpKind::ReLU, vec![x]);
    let graph = b.finish(vec![r]);
    let mut exec = Executor::new(graph, Arc::new(Flaky)).unwrap();
    let x = Tensor::from_f32(vec![2], vec![-1.0, 2.0]).unwrap();
    let err = exec.step(&[("x", x.clone())]).unwrap_err();
    assert_eq!(err.to_string(), "%1 ReLU 'relu1': deliberate failure");
    exec.set_step_count(1);
    let err = exec.step(&[("x", x.clone())]).unwrap_err();
    assert!(
        err.to_string()
            .contains("left output 0 as <Tensor[Float32], (1)>"),
        "{err}"
    );
    exec.set_step_count(2);
    let out = exec.step(&[("x", x)]).unwrap();
    assert_eq!(out[0].to_f64_vec(), vec![0.0, 2.0]);
}

#[test]
fn assign_results_live_in_the_parameter() {
    let graph = mlp_train_graph(2, &[3, 4, 2], DType::Float32, true);
    let exec = Executor::new(graph.clone(), Arc::new(TestBackend)).unwrap();
    let plan = exec.memory_plan();
    for (i, node) in graph.nodes.iter().enumerate() {
        if node.op == OpKind::Assign {
            let Operand::Param(p) = node.inputs[0] else {
                panic!()
            };
            assert_eq!(plan.location(i, 0), Some(Location::Param(p)));
        }
    }
}
