//! Strategy assignment: every op of the training graph gets a strategy, and every parameter
//! (data input or weight) a layout.
//!
//! Sources, in order of authority:
//! 1. the user's annotation (`in_strategy`);
//! 2. in `semi_auto_parallel` (and `data_parallel`), the default for unannotated forward ops:
//!    split the batch ([`super::rules::default_strategy`]);
//! 3. an optimizer update or `Assign` of a weight follows the weight's layout exactly;
//! 4. **sharding propagation** for everything else (the backward pass, and in
//!    `auto_parallel` every unannotated op): from the settled ops outward, forward in program
//!    order (an op waits until every input's layout is known) and backward in reverse order
//!    (an op waits until every user is settled), each op takes the candidate strategy with the
//!    least redistribution cost to its settled neighbours plus its share of the compute; ties
//!    go to the earlier candidate in [`super::rules::candidates`]' fixed order.
//!
//! A weight takes the layout its first settled user needs; a data input the layout of the
//! `dataset_strategy`. Every decision is recorded with its source and the costs of the
//! candidates that were weighed, for the dumps and `shardc explain`.
//!
//! This module is the entry point ([`assign`]) and the face of strategy assignment: the result
//! types live in [`super::assignment`], the breadth-first propagation in
//! [`super::propagation`], the exact completion in [`super::completion`] and the searchers in
//! [`super::search`].

pub use super::assignment::{Assignment, Candidate, Decision, Source};
pub use super::completion::COMPLETION_BUDGET;
pub use super::propagation::COMPUTE_BYTES_PER_ELEMENT;
pub use super::roles::{is_generated, like_weight, updated_weight};
pub use super::rules::MAX_SPLIT_LOOPS;

use super::completion::{assign_by_propagation, Weighing};
use super::dataset::data_input_layouts;
use super::propagation::propagate_around;
use super::search::{self, problem::Problem};
use super::{Mode, ParallelError, ParallelOptions, SearchMode};
use shardc_ir::Graph;

/// Assigns a strategy to every op of `g` (types inferred) and a layout to every parameter.
///
/// In `data_parallel` every user annotation is ignored (MindSpore applies `shard` only in
/// `semi_auto_parallel` and `auto_parallel`): every forward op splits the batch over all
/// devices, weights stay replicated, and the decision's source says which annotation was
/// ignored ([`Source::AnnotationIgnored`]).
///
/// In `semi_auto_parallel`, and in `auto_parallel` with `sharding_propagation`, the plan is
/// **completed exactly**: the ops the user fixed (annotations; in
/// `semi_auto_parallel` also the batch-split defaults of the forward ops the user wrote) stay
/// as they are, and every other op (the backward pass, the loss's gradient, and in
/// `auto_parallel` the unannotated forward ops) is solved by dynamic programming over the
/// cost graph, so that a backward op takes its forward op's layout where that is cheaper, as
/// MindSpore's bprop of a distributed operator does. The breadth-first propagation is the
/// fallback for cost graphs too large to solve ([`COMPLETION_BUDGET`]) and a baseline: the
/// plan kept is never predicted slower than it (nor, in `auto_parallel`, than the
/// `semi_auto_parallel` plan of the same annotations).
///
/// With `parallel_optimizer` set, every eligible weight and its optimizer state are then split
/// over their data-parallel group ([`super::optimizer_shard::apply`]).
pub fn assign(g: &Graph, opts: &ParallelOptions) -> Result<Assignment, ParallelError> {
    let mut a = match opts.mode {
        Mode::AutoParallel if opts.search.mode != SearchMode::ShardingPropagation => {
            searched(g, opts)
        }
        _ => assign_by_propagation(g, opts, Weighing::Explained),
    }?;
    super::optimizer_shard::apply(g, &mut a, opts)?;
    Ok(a)
}

/// `auto_parallel` with a searcher: it decides every op but the weight updates (annotations
/// stay fixed); the updates then follow their weights.
fn searched(g: &Graph, opts: &ParallelOptions) -> Result<Assignment, ParallelError> {
    let inputs = data_input_layouts(g, opts)?;
    let problem = Problem::new(g, opts, inputs.clone())?;
    let found = search::run(&problem, opts.search.mode)?;
    let searcher = found.report.searcher;
    let settled = found
        .shardings
        .into_iter()
        .zip(found.weighed)
        .enumerate()
        .map(|(k, (sh, weighed))| {
            let own = weighed
                .iter()
                .find(|c| c.strategy == sh.strategy && c.out_strategy == sh.out_strategy)
                .map_or(0.0, |c| c.compute + c.communication);
            let source = if problem.fixed[k].is_some() {
                Source::User
            } else {
                Source::Searched {
                    searcher,
                    seconds: own,
                }
            };
            let decision = Decision {
                sharding: sh,
                source,
                candidates: weighed,
            };
            (problem.ops[k], decision)
        });
    propagate_around(g, opts, inputs, settled, Some(found.report))
}
