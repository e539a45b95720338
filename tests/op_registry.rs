//! Every op has every rule and a kernel: the walk over `OpKind::ALL` that a new op must pass.
//!
//! For each op: its rules (`passes::ops::rule`) are its own (the entry names the op), its
//! shape rule and signature exist (a struct literal: no field can be left out), its gradient
//! is a rule or an explicit "no gradient, because ..." (only the autodiff driver's own
//! `TupleGetItem` is routed elsewhere), its parallel rule is its loops (only collectives and
//! plumbing have no strategy of their own, with the reason), its cost is explicit and the one
//! the strategy search has always used (the table below pins it), a windowed op says which
//! geometry it follows; the CPU backend has a kernel, or the op is one the executor or the
//! communicator runs (listed below with why); the CUDA backend has a kernel, or the op is in
//! `HOST_FALLBACKS` with a reason, never both; so has the Ascend backend (an aclnn lowering,
//! or its own `HOST_FALLBACKS` entry with the reason).
//!
//! The walk is a function of the lookups, so the tests below also run it on registries with
//! one entry taken out, and check that it fails for exactly that op.

use shardc::ascend::ops::{
    has_kernel as ascend_has_kernel, host_fallback as ascend_fallback,
    HOST_FALLBACKS as ASCEND_HOST_FALLBACKS,
};
use shardc::cpu::{kernel as cpu_kernel, not_compute_reason, Kernel};
use shardc::cuda::{has_kernel as cuda_has_kernel, host_fallback, HOST_FALLBACKS};
use shardc::ir::{OpClass, OpKind};
use shardc::passes::ops::{rule, Cost, Dims, Gradient, OpRule, Window};

/// Ops no backend runs, and why: the executor aliases or stores them, or its communication
/// thread runs them through the communicator.
const EXECUTOR_OPS: &[(OpKind, &str)] = &[
    (
        OpKind::TupleGetItem,
        "the executor aliases the tuple's element",
    ),
    (
        OpKind::Assign,
        "the executor stores the value into the parameter",
    ),
    (OpKind::AllReduce, "a collective: the communicator runs it"),
    (OpKind::AllGather, "a collective: the communicator runs it"),
    (
        OpKind::ReduceScatter,
        "a collective: the communicator runs it",
    ),
    (OpKind::AllToAll, "a collective: the communicator runs it"),
    (OpKind::Broadcast, "a collective: the communicator runs it"),
    (OpKind::Send, "point-to-point: the communicator runs it"),
    (OpKind::Receive, "point-to-point: the communicator runs it"),
];

/// The cost each op has always had in the strategy search (before the rules moved together,
/// `vector_weight` listed the non-1 weights and defaulted the rest to 1): a GEMM-rate
/// contraction, or the vector weight per element.
fn expected_cost(op: OpKind) -> Option<f64> {
    use OpKind::*;
    match op {
        MatMul | BatchMatMul | Conv2D | Conv2DBackpropInput | Conv2DBackpropFilter => None,
        GeLU | GeLUGrad => Some(8.0),
        Softmax
        | LogSoftmax
        | SoftmaxGrad
        | LogSoftmaxGrad
        | SoftmaxCrossEntropyWithLogits
        | SparseSoftmaxCrossEntropyWithLogits => Some(40.0),
        Exp | Log | Sigmoid | Tanh | Sqrt | SigmoidGrad | TanhGrad | LayerNorm | LayerNormGrad
        | BatchNorm | BatchNormGrad | SiLU | SiLUGrad | Erf => Some(20.0),
        _ => Some(1.0),
    }
}

/// The window geometry each windowed op follows.
fn expected_window(op: OpKind) -> Window {
    use OpKind::*;
    match op {
        Conv2D | Conv2DBackpropInput | Conv2DBackpropFilter => Window::Conv2d,
        MaxPool | AvgPool | MaxPoolGrad | AvgPoolGrad => Window::Pool2d,
        _ => Window::None,
    }
}

/// The lookups the walk checks.
struct Registry {
    rule: fn(OpKind) -> &'static OpRule,
    cpu_kernel: fn(OpKind) -> Option<Kernel>,
    cpu_not_compute: fn(OpKind) -> Option<&'static str>,
    cuda_has_kernel: fn(OpKind) -> bool,
    cuda_fallback: fn(OpKind) -> Option<&'static str>,
    ascend_has_kernel: fn(OpKind) -> bool,
    ascend_fallback: fn(OpKind) -> Option<&'static str>,
}

const REAL: Registry = Registry {
    rule,
    cpu_kernel,
    cpu_not_compute: not_compute_reason,
    cuda_has_kernel,
    cuda_fallback: host_fallback,
    ascend_has_kernel,
    ascend_fallback,
};

/// Every problem of every op, as `Op: what is missing`.
fn problems(reg: &Registry) -> Vec<String> {
    let mut out = Vec::new();
    for &op in OpKind::ALL {
        let mut bad = |what: String| out.push(format!("{op}: {what}"));
        let r = (reg.rule)(op);
        if r.op != op {
            bad(format!("its rules are {}'s", r.op));
        }
        // Signature: names unique, required within the operands.
        let sig = &r.signature;
        if sig.required > sig.operands.len() {
            bad("its signature requires more operands than it names".into());
        }
        let mut names: Vec<&str> = sig.operands.iter().map(|o| o.0).collect();
        names.sort_unstable();
        names.dedup();
        if names.len() != sig.operands.len() {
            bad("its signature names an operand twice".into());
        }
        // Gradient.
        match r.gradient {
            Gradient::Rule(_) => {}
            Gradient::None(why) if why.trim().is_empty() => {
                bad("it has no gradient and gives no reason".into())
            }
            Gradient::None(_) => {}
            Gradient::Driver(_) if op != OpKind::TupleGetItem => {
                bad("only TupleGetItem's gradient is routed by the driver".into())
            }
            Gradient::Driver(_) => {}
        }
        // Parallel rule.
        match r.dims {
            Dims::Rule(_) => {}
            Dims::NoStrategy(why) => {
                let allowed =
                    matches!(op.class(), OpClass::Communication) || op == OpKind::TupleGetItem;
                if !allowed || why.trim().is_empty() {
                    bad(format!(
                        "it has no parallel rule ({why:?}); only collectives and TupleGetItem \
                         may have none"
                    ));
                }
            }
        }
        // Cost.
        match (r.cost, expected_cost(op)) {
            (Cost::Gemm(_), None) => {}
            (Cost::Vector(w), Some(e)) if w == e && w.is_finite() && w > 0.0 => {}
            (Cost::Vector(w), e) => bad(format!("its vector weight is {w}, expected {e:?}")),
            (Cost::Gemm(_), Some(e)) => bad(format!("it is costed as a GEMM, expected {e}")),
        }
        // Window.
        if r.window != expected_window(op) {
            bad(format!(
                "its window is {:?}, expected {:?}",
                r.window,
                expected_window(op)
            ));
        }
        // CPU kernel.
        let executor_why = EXECUTOR_OPS.iter().find(|(o, _)| *o == op).map(|e| e.1);
        match (
            (reg.cpu_kernel)(op),
            (reg.cpu_not_compute)(op),
            executor_why,
        ) {
            (Some(_), None, None) => {}
            (None, Some(_), Some(_)) => {}
            (Some(_), _, Some(_)) => {
                bad("it has a CPU kernel but is listed as run by the executor".into())
            }
            (None, _, None) => bad("it has no CPU kernel and is not run by the executor".into()),
            (k, why, _) => bad(format!(
                "the CPU backend says kernel {k:?} and not-compute {why:?}"
            )),
        }
        // CUDA kernel or listed host fallback.
        match ((reg.cuda_has_kernel)(op), (reg.cuda_fallback)(op)) {
            (true, None) => {}
            (false, Some(why)) if !why.trim().is_empty() => {}
            (false, _) => bad("it has no CUDA kernel and no listed host fallback".into()),
            (true, Some(_)) => bad("it has a CUDA kernel but is listed as a host fallback".into()),
        }
        // Ascend: an aclnn lowering or a listed host fallback.
        match ((reg.ascend_has_kernel)(op), (reg.ascend_fallback)(op)) {
            (true, None) => {}
            (false, Some(why)) if !why.trim().is_empty() => {}
            (false, _) => bad("it has no aclnn lowering and no listed host fallback".into()),
            (true, Some(_)) => {
                bad("it has an aclnn lowering but is listed as a host fallback".into())
            }
        }
    }
    out
}

#[test]
fn every_op_has_every_rule_and_a_kernel_or_a_listed_fallback() {
    let p = problems(&REAL);
    assert!(
        p.is_empty(),
        "ops lacking a rule or kernel:\n{}",
        p.join("\n")
    );
}

#[test]
fn the_host_fallback_list_has_no_duplicates() {
    for (i, (op, _)) in HOST_FALLBACKS.iter().enumerate() {
        assert!(
            !HOST_FALLBACKS[i + 1..].iter().any(|(o, _)| o == op),
            "{op} is listed twice"
        );
    }
}

#[test]
fn the_ascend_host_fallback_list_has_no_duplicates() {
    for (i, (op, _)) in ASCEND_HOST_FALLBACKS.iter().enumerate() {
        assert!(
            !ASCEND_HOST_FALLBACKS[i + 1..].iter().any(|(o, _)| o == op),
            "{op} is listed twice"
        );
    }
}

#[test]
fn the_walk_fails_for_an_ascend_op_without_a_lowering_or_a_listed_fallback() {
    let reg = Registry {
        ascend_has_kernel: |op| op != OpKind::LayerNormGrad && ascend_has_kernel(op),
        ..REAL
    };
    assert_eq!(
        problems(&reg),
        vec!["LayerNormGrad: it has no aclnn lowering and no listed host fallback".to_string()]
    );
}

#[test]
fn the_walk_fails_for_an_op_without_a_cpu_kernel() {
    let reg = Registry {
        cpu_kernel: |op| {
            if op == OpKind::SiLU {
                None
            } else {
                cpu_kernel(op)
            }
        },
        ..REAL
    };
    let p = problems(&reg);
    assert_eq!(
        p,
        vec!["SiLU: it has no CPU kernel and is not run by the executor".to_string()]
    );
}

#[test]
fn the_walk_fails_for_a_cuda_op_without_a_kernel_or_a_listed_fallback() {
    let reg = Registry {
        cuda_has_kernel: |op| op != OpKind::SiLUGrad && cuda_has_kernel(op),
        ..REAL
    };
    let p = problems(&reg);
    assert_eq!(
        p,
        vec!["SiLUGrad: it has no CUDA kernel and no listed host fallback".to_string()]
    );
}

#[test]
fn the_walk_fails_for_rules_wired_to_another_op() {
    let reg = Registry {
        rule: |op| {
            if op == OpKind::Tanh {
                rule(OpKind::Sigmoid)
            } else {
                rule(op)
            }
        },
        ..REAL
    };
    let p = problems(&reg);
    assert_eq!(p, vec!["Tanh: its rules are Sigmoid's".to_string()]);
}

#[test]
fn the_walk_fails_for_a_cost_other_than_the_searchs() {
    let reg = Registry {
        rule: |op| {
            if op == OpKind::Add {
                // Sigmoid's rules with Add's name would cost Add 20 per element.
                rule(OpKind::Sigmoid)
            } else {
                rule(op)
            }
        },
        ..REAL
    };
    let p = problems(&reg);
    assert!(
        p.iter()
            .any(|m| m == "Add: its vector weight is 20, expected Some(1.0)"),
        "{p:?}"
    );
}
