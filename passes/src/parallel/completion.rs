//! The exact completion of a plan, and the assignment of every mode but `auto_parallel` with a
//! searcher (`assign_by_propagation`): the breadth-first propagation
//! ([`super::propagation`]), then, in `semi_auto_parallel` and `sharding_propagation`, the ops
//! the user did not fix solved by dynamic programming over the search's cost graph, keeping
//! the plan predicted fastest.

use super::assignment::{Assignment, Decision, SearchReport, Source};
use super::cost::Breakdown;
use super::dataset::data_input_layouts;
use super::propagation::{propagate, propagate_around};
use super::roles::is_generated;
use super::rules::{self, sharding, OpSharding};
use super::search::dynamic;
use super::search::problem::{weigh, Problem, Term, EXPLAIN_BUDGET};
use super::{Mode, ParallelError, ParallelOptions};
use shardc_ir::{Graph, TensorLayout};

/// Whether an assignment weighs every op's candidates for `shardc explain`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Weighing {
    /// Each op's candidates and the term that decided it are priced (the plan that is kept).
    Explained,
    /// Only the plan (a baseline that a search prices and may discard).
    PlanOnly,
}

/// Assigns a strategy to every op of `g` by sharding propagation, as
/// [`assign`](super::strategy::assign) does in every mode but `auto_parallel` with a searcher:
/// in `data_parallel` the breadth-first plan (every annotation ignored), otherwise that plan
/// completed exactly ([`complete`]). `weighing` says whether every op's candidates are weighed
/// for `explain`.
pub(crate) fn assign_by_propagation(
    g: &Graph,
    opts: &ParallelOptions,
    weighing: Weighing,
) -> Result<Assignment, ParallelError> {
    let n = g.nodes.len();
    let ignored: Vec<Option<String>> = if opts.mode == Mode::DataParallel {
        g.nodes
            .iter()
            .map(|node| node.in_strategy.as_ref().map(|s| s.to_string()))
            .collect()
    } else {
        vec![None; n]
    };
    let stripped;
    let g = if ignored.iter().any(Option::is_some) {
        let mut c = g.clone();
        for node in &mut c.nodes {
            node.in_strategy = None;
        }
        stripped = c;
        &stripped
    } else {
        g
    };
    let inputs = data_input_layouts(g, opts)?;
    match opts.mode {
        Mode::DataParallel => propagate(g, opts, inputs, &ignored),
        _ => {
            let bfs = propagate(g, opts, inputs.clone(), &ignored)?;
            complete(g, opts, inputs, bfs, weighing)
        }
    }
}

/// The exact completion solves a cost graph of at most this many entries (candidate pairs of
/// its edges plus candidates of its nodes); a larger one keeps the breadth-first plan, and
/// the report says so.
pub const COMPLETION_BUDGET: usize = 4_000_000;

/// The name sharding propagation reports as its searcher.
const PROPAGATION: &str = "sharding_propagation";

/// The `semi_auto_parallel` baseline is propagated only for problems of at most this many
/// searched ops times devices (propagation weighs every candidate of every op).
pub const SEMI_AUTO_BASELINE_BUDGET: usize = 1 << 20;

/// Completes a plan exactly: the ops the user fixed stay (annotations; in
/// `semi_auto_parallel` also the batch-split defaults of the forward ops the user wrote), the
/// others are solved by dynamic programming over the cost graph ([`dynamic`]). The
/// breadth-first plan `bfs` is the fallback when the cost graph exceeds
/// [`COMPLETION_BUDGET`] and a baseline; in `auto_parallel` so is the `semi_auto_parallel`
/// plan. The plan predicted fastest within the memory limit is kept, and the report says
/// which and why.
fn complete(
    g: &Graph,
    opts: &ParallelOptions,
    inputs: Vec<Option<TensorLayout>>,
    bfs: Assignment,
    weighing: Weighing,
) -> Result<Assignment, ParallelError> {
    let start = std::time::Instant::now();
    let n = opts.device_num;
    let semi_auto = opts.mode == Mode::SemiAutoParallel;
    let problem = Problem::with_fixed(g, opts, inputs.clone(), |node| match &node.in_strategy {
        Some(s) => sharding(g, node, s, n).map(Some),
        None if semi_auto && !is_generated(node) => {
            let s = rules::default_strategy(g, node, n)?;
            sharding(g, node, &s, n).map(Some)
        }
        None => Ok(None),
    })?;
    let limit = opts.search.memory_limit();
    let mut notes = Vec::new();
    let of = |a: &Assignment| -> Option<Vec<OpSharding>> {
        problem
            .ops
            .iter()
            .map(|id| a.decisions[id.index()].as_ref().map(|d| d.sharding.clone()))
            .collect()
    };
    // The exact completion, where the cost graph fits the budget.
    let open = problem.fixed.iter().filter(|f| f.is_none()).count();
    let mut exact_plan: Option<(Vec<OpSharding>, bool, Vec<Vec<OpSharding>>)> = None;
    if open > 0 {
        let cands = problem.all_candidates()?;
        let size: usize = cands.iter().map(Vec::len).sum::<usize>()
            + problem
                .terms
                .iter()
                .map(|t| t.ops().iter().map(|&k| cands[k].len()).product::<usize>())
                .sum::<usize>();
        if size > COMPLETION_BUDGET {
            notes.push(format!(
                "fell back to breadth-first propagation: the cost graph of the {open} open ops \
                 has {size} entries, over the exact completion's budget of {COMPLETION_BUDGET}"
            ));
        } else {
            let cg = problem.cost_graph(&cands);
            match dynamic::search(&cg, Some(limit)) {
                Ok(r) => {
                    notes.extend(r.notes);
                    let plan = r
                        .choice
                        .iter()
                        .zip(&cands)
                        .map(|(&c, cs)| cs[c].clone())
                        .collect();
                    exact_plan = Some((plan, r.exact, cands));
                }
                Err(e) => notes.push(format!(
                    "the exact completion found no plan ({e}); breadth-first propagation kept"
                )),
            }
        }
    }
    // The baselines.
    let semi = (opts.mode == Mode::AutoParallel
        && problem.ops.len().saturating_mul(n) <= SEMI_AUTO_BASELINE_BUDGET)
        .then(|| {
            let o = ParallelOptions {
                mode: Mode::SemiAutoParallel,
                ..opts.clone()
            };
            assign_by_propagation(g, &o, Weighing::PlanOnly).ok()
        })
        .flatten();
    enum Kept {
        Exact,
        BreadthFirst,
        SemiAuto,
    }
    let price = |plan: &[OpSharding]| problem.step_seconds(&plan.iter().collect::<Vec<_>>());
    let mut options: Vec<(Kept, Vec<OpSharding>, Breakdown)> = Vec::new();
    if let Some((plan, _, _)) = &exact_plan {
        let b = price(plan);
        options.push((Kept::Exact, plan.clone(), b));
    }
    if let Some(plan) = of(&bfs) {
        let b = price(&plan);
        options.push((Kept::BreadthFirst, plan, b));
    }
    if let Some(plan) = semi.as_ref().and_then(of) {
        let b = price(&plan);
        options.push((Kept::SemiAuto, plan, b));
    }
    let fits = options.iter().any(|(_, _, b)| b.memory <= limit);
    if !fits && !options.is_empty() {
        notes.push(format!(
            "no plan fits the memory limit of {limit:.0} bytes per device; the fastest is kept"
        ));
    }
    // The fastest that fits; on a tie the earlier (the exact completion first).
    let best = options
        .iter()
        .enumerate()
        .filter(|(_, (_, _, b))| !fits || b.memory <= limit)
        .min_by(|(i, (_, _, a)), (j, (_, _, b))| {
            let (ta, tb) = (a.seconds(), b.seconds());
            if (ta - tb).abs() <= 1e-12 * ta.abs().max(tb.abs()) {
                i.cmp(j)
            } else {
                ta.total_cmp(&tb)
            }
        })
        .map(|(i, _)| i);
    let Some(best) = best else {
        return Ok(bfs);
    };
    let exact_seconds = options
        .iter()
        .find(|(k, _, _)| matches!(k, Kept::Exact))
        .map(|(_, _, b)| b.seconds());
    let (kept, plan, predicted) = options.swap_remove(best);
    let mut report = SearchReport {
        searcher: PROPAGATION,
        predicted,
        memory_limit: limit,
        exact: false,
        notes,
        search_seconds: 0.0,
        searched_ops: open,
    };
    let describe = |what: &str| match exact_seconds {
        Some(e) => format!(
            "the {what} plan is predicted faster ({:.6} ms) than the exact completion \
             ({:.6} ms, which counts a conversion that several readers share once per reader) \
             and was kept",
            predicted.seconds() * 1e3,
            e * 1e3
        ),
        None => format!("the {what} plan was kept"),
    };
    // An option is offered only with its plan, so each kept kind finds its own here.
    let mut assignment = match (kept, semi, exact_plan) {
        (Kept::SemiAuto, Some(semi), _) => {
            report.notes.push(describe("semi_auto_parallel"));
            semi
        }
        (Kept::Exact, _, Some((_, exact, cands))) => {
            report.exact = exact;
            let refs: Vec<&OpSharding> = plan.iter().collect();
            let explained = weighing == Weighing::Explained;
            let weighed = weigh(&problem, explained.then_some(&cands[..]), &refs);
            let settled = plan
                .iter()
                .zip(weighed)
                .enumerate()
                .map(|(k, (sh, weighed))| {
                    let node = g.node(problem.ops[k]);
                    let source = match &problem.fixed[k] {
                        Some(_) if node.in_strategy.is_some() => Source::User,
                        Some(_) => Source::SemiAutoDefault,
                        None => {
                            let own = problem.op_breakdown(k, sh, &refs).seconds();
                            Source::Completed {
                                exact,
                                seconds: own,
                                decided_by: explained
                                    .then(|| deciding_term(&problem, k, &cands[k], &refs))
                                    .flatten(),
                            }
                        }
                    };
                    let decision = Decision {
                        sharding: sh.clone(),
                        source,
                        candidates: weighed,
                    };
                    (problem.ops[k], decision)
                });
            propagate_around(g, opts, inputs, settled, None)?
        }
        (_, _, exact_plan) => {
            if exact_plan.is_some() {
                report.notes.push(describe("breadth-first"));
            }
            bfs
        }
    };
    report.search_seconds = start.elapsed().as_secs_f64();
    assignment.search = Some(report);
    Ok(assignment)
}

/// What decided op `k`'s choice in a completed plan: among the terms it takes part in, the
/// one where its best alternative candidate would cost the most more; `None` where the choice
/// is its own compute's (or it had no alternative).
fn deciding_term(
    p: &Problem<'_>,
    k: usize,
    cands: &[OpSharding],
    choice: &[&OpSharding],
) -> Option<String> {
    if cands.len() < 2 || p.ops.len().saturating_mul(cands.len()) > EXPLAIN_BUDGET {
        return None;
    }
    let chosen = choice[k];
    let total = |s: &OpSharding| p.op_breakdown(k, s, choice).seconds();
    let runner_up = cands
        .iter()
        .filter(|s| s.strategy != chosen.strategy || s.out_strategy != chosen.out_strategy)
        .min_by(|a, b| total(a).total_cmp(&total(b)))?;
    let with = |s: &OpSharding, t: &Term| p.term_seconds(t, |x| if x == k { s } else { choice[x] });
    let (delta, t) = p.op_terms[k]
        .iter()
        .map(|&t| {
            let t = &p.terms[t];
            (with(runner_up, t) - with(chosen, t), t)
        })
        .max_by(|a, b| a.0.total_cmp(&b.0))?;
    let compute = p.compute_seconds(k, runner_up) - p.compute_seconds(k, chosen);
    if delta <= 0.0 || compute > delta {
        return Some(format!(
            "its own compute: the runner-up {} would compute {:.3} us longer",
            runner_up.strategy,
            compute * 1e6
        ));
    }
    let edge = match t {
        Term::Flow {
            from,
            out,
            to,
            operand,
            ..
        } => format!(
            "the edge {} result {out} -> {} input {operand}",
            p.name(*from),
            p.name(*to)
        ),
        Term::SharedWeight { first, to, .. } => format!(
            "the weight {} shares with {}",
            if *first == k { "it" } else { p.name(*first) },
            if *to == k { "it" } else { p.name(*to) }
        ),
        Term::IntoWeight { from, first, .. } => match first {
            Some((f, _)) => format!(
                "the gradient {} writes into the weight {} lays out",
                p.name(*from),
                p.name(*f)
            ),
            None => format!("the gradient {} writes into a whole weight", p.name(*from)),
        },
        Term::FromInput { param, .. } => {
            format!("the data input {}", p.g.params[*param].name)
        }
    };
    Some(format!(
        "{edge}: the runner-up {} would spend {:.3} us more there",
        runner_up.strategy,
        delta * 1e6
    ))
}
