//! Strategy search for `auto_parallel`: the cost graph and the searchers over it.
//!
//! The training graph's ops become the nodes of a [`CostGraph`]: each node has candidate
//! strategies, a cost per candidate of its own ([`SearchNode::unary`]: compute time plus the
//! redistribution from fixed neighbours such as data inputs) and a memory per candidate
//! ([`SearchNode::memory`]: the weight slices and optimizer state it owns, the activations it
//! keeps for the backward pass); every data edge between two searched ops has a cost matrix
//! ([`SearchEdge::cost`]: the redistribution time between the producer's result layout under
//! one candidate and the layout the consumer needs under another). A choice of one candidate
//! per node has the predicted step time [`CostGraph::total`] and the per-device memory
//! [`CostGraph::memory`], which must stay within the memory limit.
//!
//! The searchers, selected by `search_mode` as in MindSpore:
//! - [`recursive`]: log2(N) rounds of two-way cuts (MindSpore's SAPP / D-Rec), fast at any
//!   device count;
//! - [`dynamic`]: exact elimination over the cost graph where the graph allows, with a
//!   reported fallback where it does not;
//! - [`ilp`]: an exact integer program (Alpa's intra-op formulation), the optimality oracle.
//!
//! All of them are deterministic: the same cost graph gives the same choice.
//!
//! The cost graph and what the searchers share live in [`cost_graph`]; this module runs a
//! searcher on a training graph's [`problem`] ([`run`]) and prices any plan ([`predict`]).

pub mod cost_graph;
pub mod dynamic;
pub mod ilp;
pub mod layer_profile;
pub mod problem;
pub mod recursive;
pub mod stage_plan;

pub use super::assignment::SearchReport;
pub use super::completion::SEMI_AUTO_BASELINE_BUDGET;
pub use cost_graph::{
    brute_force, check_memory_feasible, largest_holders, least_memory_choice, CostGraph,
    SearchEdge, SearchError, SearchNode, SearchResult,
};
pub use problem::{weigh, EXPLAIN_BUDGET};

use super::assignment::{Assignment, Candidate};
use super::completion::{assign_by_propagation, Weighing};
use super::cost::Breakdown;
use super::rules::{self, OpSharding};
use super::{Mode, ParallelError, ParallelOptions, SearchMode};
use problem::Problem;
use shardc_ir::Graph;

/// The search's choice for every searched op.
#[derive(Clone, Debug)]
pub struct Searched {
    /// Per searched op ([`Problem::ops`]): its sharding.
    pub shardings: Vec<OpSharding>,
    /// Per searched op: the candidates weighed with their costs against the chosen
    /// neighbours (seconds, bytes), the chosen one among them; empty where the search did not
    /// list them (large problems).
    pub weighed: Vec<Vec<Candidate>>,
    /// The report.
    pub report: SearchReport,
}

/// A searcher that did not prove its choice optimal is checked against the data-parallel
/// baselines: every unannotated op splitting its batch (the semi-auto default), and, on
/// problems small enough to propagate quickly, what `semi_auto_parallel` itself assigns (the
/// defaults, with the gradients and updates propagated). Where a baseline is predicted faster
/// and fits the memory limit, the fastest is taken, and a note says so.
fn keep_the_better_of_data_parallel(
    p: &Problem,
    found: Vec<OpSharding>,
    exact: bool,
    mut notes: Vec<String>,
    limit: f64,
) -> (Vec<OpSharding>, Vec<String>) {
    if exact {
        return (found, notes);
    }
    let n = p.opts.device_num;
    let defaults: Option<Vec<OpSharding>> = (0..p.ops.len())
        .map(|k| match &p.fixed[k] {
            Some(f) => Some(f.clone()),
            None => {
                let node = p.g.node(p.ops[k]);
                let s = rules::default_strategy(p.g, node, n).ok()?;
                rules::sharding(p.g, node, &s, n).ok()
            }
        })
        .collect();
    let semi_auto = (p.ops.len().saturating_mul(n) <= SEMI_AUTO_BASELINE_BUDGET)
        .then(|| {
            let opts = ParallelOptions {
                mode: Mode::SemiAutoParallel,
                ..p.opts.clone()
            };
            let a = assign_by_propagation(p.g, &opts, Weighing::PlanOnly).ok()?;
            p.ops
                .iter()
                .map(|id| a.decisions[id.index()].as_ref().map(|d| d.sharding.clone()))
                .collect::<Option<Vec<_>>>()
        })
        .flatten();
    let mut best: Option<(Vec<OpSharding>, &str, Breakdown)> = None;
    for (baseline, what) in [
        (defaults, "batch-split default"),
        (semi_auto, "semi_auto_parallel"),
    ] {
        let Some(baseline) = baseline else { continue };
        let b = p.step_seconds(&baseline.iter().collect::<Vec<_>>());
        if b.memory <= limit
            && best
                .as_ref()
                .is_none_or(|(_, _, x)| b.seconds() < x.seconds())
        {
            best = Some((baseline, what, b));
        }
    }
    let Some((baseline, what, b)) = best else {
        return (found, notes);
    };
    let a = p.step_seconds(&found.iter().collect::<Vec<_>>());
    if b.seconds() < a.seconds() {
        notes.push(format!(
            "the data-parallel baseline ({what}) is predicted faster ({:.6} ms against the \
             search's {:.6} ms) and was kept",
            b.seconds() * 1e3,
            a.seconds() * 1e3
        ));
        (baseline, notes)
    } else {
        (found, notes)
    }
}

/// The search's problem of `g` under `opts`, with `a`'s data-input layouts, and `a`'s choice
/// for each of its ops (an op without a decision is an error naming it).
fn problem_of<'a>(
    g: &'a Graph,
    opts: &'a ParallelOptions,
    a: &'a Assignment,
) -> Result<(Problem<'a>, Vec<&'a OpSharding>), ParallelError> {
    let inputs = g
        .params
        .iter()
        .zip(&a.param_layouts)
        .map(|(p, l)| (!p.is_weight()).then(|| l.clone()))
        .collect();
    let p = Problem::new(g, opts, inputs)?;
    let choice = p
        .ops
        .iter()
        .map(|id| {
            a.decisions[id.index()]
                .as_ref()
                .map(|d| &d.sharding)
                .ok_or_else(|| {
                    ParallelError::Search(format!(
                        "op '{}' has no decision to predict from",
                        g.node(*id).instance
                    ))
                })
        })
        .collect::<Result<_, _>>()?;
    Ok((p, choice))
}

/// The predicted step of an assignment made by any source (annotations, propagation, a
/// searcher), under `opts`' machine.
pub fn predict(
    g: &Graph,
    opts: &ParallelOptions,
    a: &Assignment,
) -> Result<Breakdown, ParallelError> {
    let (p, choice) = problem_of(g, opts, a)?;
    Ok(p.step_seconds(&choice))
}

/// Each searched op's share of the predicted step under `a` (the cost model of
/// [`predict`]): per node index of `g`, its compute and the communication of the terms it
/// takes part in ([`Problem::op_breakdown`]: a term between two ops counts at both ends, so
/// the shares do not add up to the step) and the memory it is charged.
pub fn predict_per_op(
    g: &Graph,
    opts: &ParallelOptions,
    a: &Assignment,
) -> Result<Vec<(usize, Breakdown)>, ParallelError> {
    let (p, choice) = problem_of(g, opts, a)?;
    Ok(p.ops
        .iter()
        .enumerate()
        .map(|(k, id)| (id.index(), p.op_breakdown(k, choice[k], &choice)))
        .collect())
}

/// Runs the searcher of `mode` on `p` (not sharding propagation, which
/// [`super::strategy::assign`] runs itself).
pub fn run(p: &Problem, mode: SearchMode) -> Result<Searched, ParallelError> {
    let start = std::time::Instant::now();
    let limit = p.opts.search.memory_limit();
    let n = p.ops.len();
    let (shardings, exact, notes, cands) = match mode {
        SearchMode::RecursiveProgramming | SearchMode::ShardingPropagation => {
            let f = recursive::search(p, limit)?;
            (f.shardings, false, f.notes, None)
        }
        SearchMode::DynamicProgramming | SearchMode::Ilp => {
            let cands = p.all_candidates()?;
            let cg = p.cost_graph(&cands);
            let r = if mode == SearchMode::Ilp {
                ilp::search(&cg, Some(limit))
            } else {
                dynamic::search(&cg, Some(limit))
            }
            .map_err(recursive::search_error)?;
            let sh = r
                .choice
                .iter()
                .zip(&cands)
                .map(|(&c, cs)| cs[c].clone())
                .collect();
            (sh, r.exact, r.notes, Some(cands))
        }
    };
    let (shardings, notes) = keep_the_better_of_data_parallel(p, shardings, exact, notes, limit);
    let refs: Vec<&OpSharding> = shardings.iter().collect();
    let predicted = p.step_seconds(&refs);
    let weighed = weigh(p, cands.as_deref(), &refs);
    Ok(Searched {
        shardings,
        weighed,
        report: SearchReport {
            searcher: mode.name(),
            predicted,
            memory_limit: limit,
            exact,
            notes,
            search_seconds: start.elapsed().as_secs_f64(),
            searched_ops: n,
        },
    })
}
