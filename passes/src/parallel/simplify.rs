//! Simplification of redistribution chains with an e-graph (egg).
//!
//! A [`Plan`]'s steps become one term over single-axis steps, innermost first —
//! `(sl 1 2 (ar sum 2 x))` is "AllReduce over prime axis 2, then keep one's own block of
//! dimension 1 by axis 2". The rewrites:
//!
//! - `(sl d a (ag d a x)) => x`: an AllGather followed by a slice of one's own block is
//!   nothing;
//! - `(sl d a (ar op a x)) => (rs op d a x)`: an AllReduce followed by a slice of one's own
//!   block of any dimension is a ReduceScatter along that dimension (MindSpore's scatters
//!   dimension 0 only; shardc's takes an `axis`);
//! - `(sl d a (ar op b x)) => (ar op b (sl d a x))` for `a != b`: ranks that reduce together
//!   over `b` share their coordinate on `a`, so slicing first is the same and sends less;
//! - `(ar op a (ar op b x)) => (ar op b (ar op a x))`: reductions over different axes commute
//!   (which exposes the ReduceScatter above);
//! - `(rs op d a (ar op b x)) => (ar op b (rs op d a x))` for `a != b`: scattering first
//!   leaves the AllReduce a smaller buffer;
//! - with `enable_alltoall`, `(sl e a (ag d a x)) => (a2a1 e d a x)` for `d != e`: gathering
//!   a dimension over an axis and keeping one's own block of another by the same axis moves
//!   the split from `d` to `e`, one AllToAll that sends the input's share instead of the
//!   gathered result's;
//!
//! and extraction takes the term that sends the fewest bytes (the sizes come from an e-class
//! analysis: a slice divides the local size by its axis, a gather multiplies it). Adjacent
//! steps of one kind are merged back into one collective over several axes where the result
//! keeps block order.

use super::redistribute::{Plan, Step, COLLECTIVE_LATENCY_BYTES};
use egg::{
    define_language, rewrite as rw, Analysis, CostFunction, DidMerge, EGraph, Extractor, Id,
    Language, RecExpr, Rewrite, Runner, Symbol,
};
use shardc_ir::ReduceOp;

// The chain language: `(ar OP AXIS x)`, `(rs OP DIM AXIS x)`, `(ag DIM AXIS x)`,
// `(sl DIM AXIS x)`, `(a2a SPLIT CONCAT GROUP x)` (GROUP indexes the plan's all-to-all axis
// groups), numbers (dimensions, axes, indices) and names (`x`, reductions).
define_language! {
    pub enum Chain {
        "ar" = Ar([Id; 3]),
        "rs" = Rs([Id; 4]),
        "ag" = Ag([Id; 3]),
        "sl" = Sl([Id; 3]),
        "a2a" = A2a([Id; 4]),
        // `(a2a1 SPLIT CONCAT AXIS x)`: an AllToAll over one prime axis.
        "a2a1" = A2a1([Id; 4]),
        Num(i64),
        Name(Symbol),
    }
}

/// Local sizes in bytes, per e-class.
#[derive(Default)]
pub struct Sizes {
    primes: Vec<usize>,
    base_bytes: f64,
    a2a_sizes: Vec<usize>,
}

fn num_of(eg: &EGraph<Chain, Sizes>, id: Id) -> Option<i64> {
    eg[id].nodes.iter().find_map(|n| match n {
        Chain::Num(v) => Some(*v),
        _ => None,
    })
}

impl Analysis<Chain> for Sizes {
    type Data = Option<f64>;

    fn make(egraph: &mut EGraph<Chain, Self>, enode: &Chain, _id: Id) -> Self::Data {
        let p = |eg: &EGraph<Chain, Self>, axis: Id| -> f64 {
            num_of(eg, axis)
                .and_then(|a| eg.analysis.primes.get(a as usize).copied())
                .unwrap_or(1) as f64
        };
        match enode {
            Chain::Name(s) if s.as_str() == "x" => Some(egraph.analysis.base_bytes),
            Chain::Num(_) | Chain::Name(_) => None,
            Chain::Ar([_, _, x]) => egraph[*x].data,
            Chain::Rs([_, _, a, x]) => egraph[*x].data.map(|s| s / p(egraph, *a)),
            Chain::Sl([_, a, x]) => egraph[*x].data.map(|s| s / p(egraph, *a)),
            Chain::Ag([_, a, x]) => egraph[*x].data.map(|s| s * p(egraph, *a)),
            Chain::A2a([_, _, _, x]) | Chain::A2a1([_, _, _, x]) => egraph[*x].data,
        }
    }

    fn merge(&mut self, a: &mut Self::Data, b: Self::Data) -> DidMerge {
        match (a.is_none(), b) {
            (true, Some(v)) => {
                *a = Some(v);
                DidMerge(true, false)
            }
            _ => DidMerge(false, a.is_some() && b.is_none()),
        }
    }
}

/// Bytes sent per rank, plus the latency term per collective.
struct BytesSent<'a> {
    egraph: &'a EGraph<Chain, Sizes>,
}

impl CostFunction<Chain> for BytesSent<'_> {
    type Cost = f64;

    fn cost<C>(&mut self, enode: &Chain, mut costs: C) -> f64
    where
        C: FnMut(Id) -> f64,
    {
        let eg = self.egraph;
        let p = |axis: Id| -> f64 {
            num_of(eg, axis)
                .and_then(|a| eg.analysis.primes.get(a as usize).copied())
                .unwrap_or(1) as f64
        };
        let size = |x: Id| eg[x].data.unwrap_or(0.0);
        let own = match enode {
            Chain::Ar([_, a, x]) => {
                2.0 * (p(*a) - 1.0) / p(*a) * size(*x) + COLLECTIVE_LATENCY_BYTES
            }
            Chain::Rs([_, _, a, x]) => (p(*a) - 1.0) / p(*a) * size(*x) + COLLECTIVE_LATENCY_BYTES,
            Chain::Ag([_, a, x]) => (p(*a) - 1.0) * size(*x) + COLLECTIVE_LATENCY_BYTES,
            Chain::A2a([_, _, i, x]) => {
                let g = num_of(eg, *i)
                    .and_then(|i| eg.analysis.a2a_sizes.get(i as usize).copied())
                    .unwrap_or(1) as f64;
                (g - 1.0) / g * size(*x) + COLLECTIVE_LATENCY_BYTES
            }
            Chain::A2a1([_, _, a, x]) => {
                (p(*a) - 1.0) / p(*a) * size(*x) + COLLECTIVE_LATENCY_BYTES
            }
            // A tiny cost keeps slices from multiplying for nothing.
            Chain::Sl(_) => 1e-3,
            Chain::Num(_) | Chain::Name(_) => 0.0,
        };
        enode.fold(own, |acc, id| acc + costs(id))
    }
}

fn rules(enable_alltoall: bool) -> Vec<Rewrite<Chain, Sizes>> {
    let distinct = |a: &'static str, b: &'static str| {
        let (a, b) = (a.parse().expect("var"), b.parse().expect("var"));
        move |eg: &mut EGraph<Chain, Sizes>, _: Id, s: &egg::Subst| eg.find(s[a]) != eg.find(s[b])
    };
    let mut rules = vec![
        rw!("gather-slice"; "(sl ?d ?a (ag ?d ?a ?x))" => "?x"),
        rw!("reduce-scatter"; "(sl ?d ?a (ar ?op ?a ?x))" => "(rs ?op ?d ?a ?x)"),
        rw!("slice-first"; "(sl ?d ?a (ar ?op ?b ?x))" => "(ar ?op ?b (sl ?d ?a ?x))"
            if distinct("?a", "?b")),
        rw!("reduce-commute"; "(ar ?op ?a (ar ?op ?b ?x))" => "(ar ?op ?b (ar ?op ?a ?x))"),
        rw!("scatter-first"; "(rs ?op ?d ?a (ar ?op ?b ?x))" => "(ar ?op ?b (rs ?op ?d ?a ?x))"
            if distinct("?a", "?b")),
    ];
    if enable_alltoall {
        rules.push(
            rw!("gather-slice-alltoall"; "(sl ?e ?a (ag ?d ?a ?x))" => "(a2a1 ?e ?d ?a ?x)"
                if distinct("?d", "?e")),
        );
    }
    rules
}

fn op_name(op: ReduceOp) -> &'static str {
    op.name()
}

/// The chain term of a plan (single-axis steps); `None` for a plan over two axis spaces.
fn to_term(plan: &Plan) -> Option<(RecExpr<Chain>, Vec<Vec<usize>>)> {
    if plan.spaces.len() != 1 {
        return None;
    }
    let mut e = RecExpr::default();
    let mut x = e.add(Chain::Name(Symbol::from("x")));
    let mut a2a_axes = Vec::new();
    let num = |e: &mut RecExpr<Chain>, v: usize| e.add(Chain::Num(v as i64));
    for step in &plan.steps {
        match step {
            Step::AllReduce { axes, op, .. } => {
                for &a in axes {
                    let o = e.add(Chain::Name(Symbol::from(op_name(*op))));
                    let an = num(&mut e, a);
                    x = e.add(Chain::Ar([o, an, x]));
                }
            }
            Step::ReduceScatter { dim, axes, op, .. } => {
                for &a in axes {
                    let o = e.add(Chain::Name(Symbol::from(op_name(*op))));
                    let d = num(&mut e, *dim);
                    let an = num(&mut e, a);
                    x = e.add(Chain::Rs([o, d, an, x]));
                }
            }
            Step::AllGather { dim, axes, .. } => {
                // Minor axis first.
                for &a in axes.iter().rev() {
                    let d = num(&mut e, *dim);
                    let an = num(&mut e, a);
                    x = e.add(Chain::Ag([d, an, x]));
                }
            }
            Step::Slice { dim, axes, .. } => {
                for &a in axes {
                    let d = num(&mut e, *dim);
                    let an = num(&mut e, a);
                    x = e.add(Chain::Sl([d, an, x]));
                }
            }
            Step::AllToAll {
                split_dim,
                concat_dim,
                axes,
                ..
            } => {
                let s = num(&mut e, *split_dim);
                let c = num(&mut e, *concat_dim);
                let i = num(&mut e, a2a_axes.len());
                a2a_axes.push(axes.clone());
                x = e.add(Chain::A2a([s, c, i, x]));
            }
        }
    }
    Some((e, a2a_axes))
}

/// Steps of an extracted term, innermost first, merged where block order allows.
fn from_term(e: &RecExpr<Chain>, a2a_axes: &[Vec<usize>]) -> Vec<Step> {
    let nodes = e.as_ref();
    let num = |id: Id| match &nodes[usize::from(id)] {
        Chain::Num(v) => *v as usize,
        _ => 0,
    };
    let op = |id: Id| match &nodes[usize::from(id)] {
        Chain::Name(s) => ReduceOp::from_name(s.as_str()).unwrap_or(ReduceOp::Sum),
        _ => ReduceOp::Sum,
    };
    // Walk from the root down to `x`, then reverse.
    let mut chain = Vec::new();
    let mut cur = Id::from(nodes.len() - 1);
    loop {
        let step = match &nodes[usize::from(cur)] {
            Chain::Ar([o, a, x]) => (
                Step::AllReduce {
                    space: 0,
                    axes: vec![num(*a)],
                    op: op(*o),
                },
                *x,
            ),
            Chain::Rs([o, d, a, x]) => (
                Step::ReduceScatter {
                    space: 0,
                    dim: num(*d),
                    axes: vec![num(*a)],
                    op: op(*o),
                },
                *x,
            ),
            Chain::Ag([d, a, x]) => (
                Step::AllGather {
                    space: 0,
                    dim: num(*d),
                    axes: vec![num(*a)],
                },
                *x,
            ),
            Chain::Sl([d, a, x]) => (
                Step::Slice {
                    space: 0,
                    dim: num(*d),
                    axes: vec![num(*a)],
                },
                *x,
            ),
            Chain::A2a([s, c, i, x]) => (
                Step::AllToAll {
                    space: 0,
                    split_dim: num(*s),
                    concat_dim: num(*c),
                    axes: a2a_axes.get(num(*i)).cloned().unwrap_or_default(),
                },
                *x,
            ),
            Chain::A2a1([s, c, a, x]) => (
                Step::AllToAll {
                    space: 0,
                    split_dim: num(*s),
                    concat_dim: num(*c),
                    axes: vec![num(*a)],
                },
                *x,
            ),
            Chain::Num(_) | Chain::Name(_) => break,
        };
        chain.push(step.0);
        cur = step.1;
    }
    chain.reverse();
    let mut out: Vec<Step> = Vec::with_capacity(chain.len());
    for s in chain {
        if let Some(last) = out.last_mut() {
            match (last, &s) {
                (
                    Step::AllReduce { axes, op, .. },
                    Step::AllReduce {
                        axes: b, op: o2, ..
                    },
                ) if op == o2 => {
                    axes.extend(b);
                    axes.sort_unstable();
                    continue;
                }
                (
                    Step::Slice { dim, axes, .. },
                    Step::Slice {
                        dim: d2, axes: b, ..
                    },
                ) if dim == d2 => {
                    axes.extend(b);
                    continue;
                }
                // Gathering `b` (major) after `a` (minor) gathers `[b, a]` in block order when
                // `b < a`.
                (
                    Step::AllGather { dim, axes, .. },
                    Step::AllGather {
                        dim: d2, axes: b, ..
                    },
                ) if dim == d2 && b.len() == 1 && axes.first().is_some_and(|&f| b[0] < f) => {
                    axes.insert(0, b[0]);
                    continue;
                }
                (
                    Step::ReduceScatter { dim, axes, op, .. },
                    Step::ReduceScatter {
                        dim: d2,
                        axes: b,
                        op: o2,
                        ..
                    },
                ) if dim == d2
                    && op == o2
                    && b.len() == 1
                    && axes.last().is_some_and(|&l| l < b[0]) =>
                {
                    axes.push(b[0]);
                    continue;
                }
                _ => {}
            }
        }
        out.push(s);
    }
    out
}

/// The local shape after each step, from `start`.
fn shapes_of(primes: &[usize], start: &[usize], steps: &[Step]) -> Vec<Vec<usize>> {
    let g = |axes: &[usize]| axes.iter().map(|&a| primes[a]).product::<usize>();
    let mut cur = start.to_vec();
    steps
        .iter()
        .map(|s| {
            match s {
                Step::AllReduce { .. } => {}
                Step::ReduceScatter { dim, axes, .. } | Step::Slice { dim, axes, .. } => {
                    cur[*dim] /= g(axes)
                }
                Step::AllGather { dim, axes, .. } => cur[*dim] *= g(axes),
                Step::AllToAll {
                    split_dim,
                    concat_dim,
                    axes,
                    ..
                } => {
                    cur[*split_dim] /= g(axes);
                    cur[*concat_dim] *= g(axes);
                }
            }
            cur.clone()
        })
        .collect()
}

/// The plan with its chain simplified; `start` is the local shape before the first step and
/// `elem_bytes` the element size; `enable_alltoall` allows AllToAll. A plan over two axis
/// spaces (gather whole, then slice) is returned as it is.
pub fn simplify(plan: Plan, start: &[usize], elem_bytes: usize, enable_alltoall: bool) -> Plan {
    if plan.steps.len() < 2 {
        return plan;
    }
    let Some((expr, a2a_axes)) = to_term(&plan) else {
        return plan;
    };
    let primes = plan.spaces[0].clone();
    let base = start.iter().product::<usize>() as f64 * elem_bytes as f64;
    let a2a_sizes = a2a_axes
        .iter()
        .map(|ax| ax.iter().map(|&a| primes[a]).product())
        .collect();
    let runner = Runner::<Chain, Sizes>::new(Sizes {
        primes: primes.clone(),
        base_bytes: base,
        a2a_sizes,
    })
    .with_expr(&expr)
    .with_iter_limit(8)
    .with_node_limit(2_000)
    .run(&rules(enable_alltoall));
    let root = runner.roots[0];
    let (_, best) = Extractor::new(
        &runner.egraph,
        BytesSent {
            egraph: &runner.egraph,
        },
    )
    .find_best(root);
    let steps = from_term(&best, &a2a_axes);
    let shapes = shapes_of(&primes, start, &steps);
    // The e-graph prices single-axis steps; merged steps cost less (one latency, fewer bytes),
    // so the extracted chain is kept only when, merged, it beats the plan.
    let cost = steps_cost(&primes, start, &steps, &shapes, elem_bytes);
    let plan_shapes = shapes_of(&primes, start, &plan.steps);
    let before = steps_cost(&primes, start, &plan.steps, &plan_shapes, elem_bytes);
    if cost < before - 1e-9 {
        Plan {
            spaces: plan.spaces,
            steps,
            cost,
            shapes,
        }
    } else {
        plan
    }
}

/// What a chain of (merged) steps costs, as the planner prices it.
fn steps_cost(
    primes: &[usize],
    start: &[usize],
    steps: &[Step],
    shapes: &[Vec<usize>],
    elem_bytes: usize,
) -> f64 {
    let g = |axes: &[usize]| axes.iter().map(|&a| primes[a]).product::<usize>() as f64;
    let bytes = |s: &[usize]| s.iter().product::<usize>() as f64 * elem_bytes as f64;
    let mut cost = 0.0;
    for (k, step) in steps.iter().enumerate() {
        let before = if k == 0 { start } else { &shapes[k - 1] };
        let after = &shapes[k];
        cost += match step {
            Step::AllReduce { axes, .. } => {
                2.0 * (g(axes) - 1.0) / g(axes) * bytes(before) + COLLECTIVE_LATENCY_BYTES
            }
            Step::ReduceScatter { axes, .. } | Step::AllToAll { axes, .. } => {
                (g(axes) - 1.0) / g(axes) * bytes(before) + COLLECTIVE_LATENCY_BYTES
            }
            Step::AllGather { axes, .. } => {
                (g(axes) - 1.0) / g(axes) * bytes(after) + COLLECTIVE_LATENCY_BYTES
            }
            Step::Slice { .. } => 0.0,
        };
    }
    cost
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parallel::redistribute::plan;
    use shardc_ir::TensorLayout;

    fn lay(dev: &[usize], map: &[i64], shape: &[usize], partial: &[usize]) -> TensorLayout {
        TensorLayout {
            dev_matrix: dev.to_vec(),
            tensor_map: map.to_vec(),
            tensor_shape: shape.to_vec(),
            partial: partial.to_vec(),
            partial_op: ReduceOp::Sum,
        }
    }

    fn p(steps: Vec<Step>, primes: Vec<usize>) -> Plan {
        Plan {
            spaces: vec![primes],
            steps,
            cost: 0.0,
            shapes: Vec::new(),
        }
    }

    /// AllReduce over `axis` of a 16 × 16 value on 2 × 2 × 2 devices, then one's own slice of
    /// `dim` by the same axis: one ReduceScatter along `dim`.
    fn reduce_then_own_slice(axis: usize, dim: usize) -> Plan {
        let plan = p(
            vec![
                Step::AllReduce {
                    space: 0,
                    axes: vec![axis],
                    op: ReduceOp::Sum,
                },
                Step::Slice {
                    space: 0,
                    dim,
                    axes: vec![axis],
                },
            ],
            vec![2, 2, 2],
        );
        simplify(plan, &[16, 16], 4, false)
    }

    #[test]
    fn allreduce_then_own_slice_of_any_dim_is_a_reduce_scatter_along_it() {
        for (axis, dim, shape) in [(1, 0, vec![8, 16]), (2, 1, vec![16, 8])] {
            let s = reduce_then_own_slice(axis, dim);
            assert_eq!(
                s.steps,
                vec![Step::ReduceScatter {
                    space: 0,
                    dim,
                    axes: vec![axis],
                    op: ReduceOp::Sum
                }],
                "axis {axis}, dim {dim}"
            );
            assert_eq!(s.shapes, vec![shape]);
        }
    }

    #[test]
    fn scattering_before_a_reduction_over_another_axis_leaves_it_less_to_send() {
        // AllReduce over axis 0, then ReduceScatter of dim 0 over axis 1: scatter first.
        let plan = p(
            vec![
                Step::AllReduce {
                    space: 0,
                    axes: vec![0],
                    op: ReduceOp::Sum,
                },
                Step::ReduceScatter {
                    space: 0,
                    dim: 0,
                    axes: vec![1],
                    op: ReduceOp::Sum,
                },
            ],
            vec![2, 2],
        );
        let s = simplify(plan, &[1024, 1024], 4, false);
        assert!(
            matches!(
                s.steps[..],
                [Step::ReduceScatter { dim: 0, .. }, Step::AllReduce { .. }]
            ),
            "{:?}",
            s.steps
        );
        assert_eq!(s.shapes.last().unwrap(), &vec![512, 1024]);
    }

    #[test]
    fn a_gather_then_a_slice_of_another_dim_is_one_alltoall_when_enabled() {
        let plan = || {
            p(
                vec![
                    Step::AllGather {
                        space: 0,
                        dim: 0,
                        axes: vec![1],
                    },
                    Step::Slice {
                        space: 0,
                        dim: 1,
                        axes: vec![1],
                    },
                ],
                vec![2, 2],
            )
        };
        let s = simplify(plan(), &[8, 16], 4, true);
        assert_eq!(
            s.steps,
            vec![Step::AllToAll {
                space: 0,
                split_dim: 1,
                concat_dim: 0,
                axes: vec![1]
            }]
        );
        assert_eq!(s.shapes, vec![vec![16, 8]]);
        // Without AllToAll the chain stays.
        let kept = simplify(plan(), &[8, 16], 4, false);
        assert_eq!(kept.steps.len(), 2, "{:?}", kept.steps);
    }

    #[test]
    fn allgather_then_own_slice_disappears() {
        let plan = p(
            vec![
                Step::AllGather {
                    space: 0,
                    dim: 1,
                    axes: vec![2],
                },
                Step::Slice {
                    space: 0,
                    dim: 1,
                    axes: vec![2],
                },
            ],
            vec![2, 2, 2],
        );
        let s = simplify(plan, &[4, 4], 4, false);
        assert!(s.steps.is_empty(), "{:?}", s.steps);
    }

    #[test]
    fn a_reduction_over_two_axes_scatters_by_the_one_the_slice_needs() {
        // AllReduce over axes {0, 1}, then slice dim 0 by axis 1: ReduceScatter on axis 1 and
        // an AllReduce over axis 0 only.
        let plan = p(
            vec![
                Step::AllReduce {
                    space: 0,
                    axes: vec![0, 1],
                    op: ReduceOp::Sum,
                },
                Step::Slice {
                    space: 0,
                    dim: 0,
                    axes: vec![1],
                },
            ],
            vec![2, 2],
        );
        // (Large enough that bytes, not the latency of a second collective, decide.)
        let s = simplify(plan, &[1024, 1024], 4, false);
        assert_eq!(s.steps.len(), 2, "{:?}", s.steps);
        assert!(s
            .steps
            .iter()
            .any(|x| matches!(x, Step::ReduceScatter { dim: 0, .. })));
        assert_eq!(s.shapes.last().unwrap(), &vec![512, 1024]);
    }

    #[test]
    fn planner_output_is_never_made_worse() {
        let cases = [
            (
                lay(&[2, 4, 1], &[2, 0], &[16, 16], &[1]),
                lay(&[2, 4], &[1, 0], &[16, 16], &[]),
            ),
            (
                lay(&[8], &[0, -1], &[16, 16], &[]),
                lay(&[8], &[-1, 0], &[16, 16], &[]),
            ),
            (
                lay(&[2, 4, 1], &[2, 0], &[16, 16], &[1]),
                lay(&[8, 1], &[1, 0], &[16, 16], &[]),
            ),
            (
                lay(&[4, 2], &[0, 1], &[16, 16], &[]),
                lay(&[2, 4], &[-1, 0], &[16, 16], &[]),
            ),
        ];
        for ((from, to), alltoall) in cases
            .iter()
            .flat_map(|c| [(c.clone(), false), (c.clone(), true)])
        {
            let direct = plan(&from, &to, 4, alltoall);
            let start = from.slice_shape();
            let s = simplify(direct.clone(), &start, 4, alltoall);
            assert!(
                s.cost <= direct.cost + 1e-6,
                "{from} -> {to}: {:?} vs {:?}",
                s.steps,
                direct.steps
            );
            assert_eq!(s.shapes.last(), direct.shapes.last(), "{from} -> {to}");
        }
    }
}
