//! The result of strategy assignment ([`Assignment`]): per op its [`Decision`] (the sharding,
//! its [`Source`], the [`Candidate`]s weighed), per parameter its layout, and the
//! [`SearchReport`] of the search or completion that made it.

use super::cost::Breakdown;
use super::rules::OpSharding;
use shardc_ir::{Graph, NodeId, OpKind, Operand, Strategy, TensorLayout};

/// Where an op's strategy came from.
#[derive(Clone, Debug, PartialEq)]
pub enum Source {
    /// The user's `in_strategy`.
    User,
    /// The semi-auto default for an unannotated op (split the batch).
    SemiAutoDefault,
    /// An optimizer update or Assign follows the layout of the weight it updates.
    FollowsWeight(String),
    /// A searcher chose it ([`super::search`]).
    Searched {
        /// The searcher (`recursive_programming`, ...).
        searcher: &'static str,
        /// The op's own predicted seconds: compute plus the communication it takes part in.
        seconds: f64,
    },
    /// Sharding propagation completed the plan around the fixed ops by solving the cost
    /// graph (see [`assign`](super::strategy::assign)): the op's choice is part of the least
    /// predicted step.
    Completed {
        /// Whether the solver proved the whole plan optimal under the cost model.
        exact: bool,
        /// The op's own predicted seconds: compute plus the communication it takes part in.
        seconds: f64,
        /// The neighbour and edge that decided it (where its best alternative would cost the
        /// most more), for `shardc explain`.
        decided_by: Option<String>,
    },
    /// Breadth-first sharding propagation chose it: the least cost to the named settled
    /// neighbours.
    Propagated {
        /// The settled neighbours it was weighed against (instance names).
        from: Vec<String>,
        /// Its cost (bytes-equivalent).
        cost: f64,
    },
    /// No neighbour was settled: the default.
    Unconstrained,
    /// `data_parallel` split the batch and ignored the user's `in_strategy` (as MindSpore
    /// does: `shard` takes effect only in `semi_auto_parallel` and `auto_parallel`).
    AnnotationIgnored {
        /// The annotation that was ignored, as written.
        annotation: String,
    },
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::User => f.write_str("user annotation"),
            Source::SemiAutoDefault => f.write_str("semi_auto_parallel default (batch split)"),
            Source::FollowsWeight(w) => write!(f, "follows the layout of weight {w}"),
            Source::Propagated { from, cost } => write!(
                f,
                "sharding propagation from {} at cost {} (bytes-equivalent)",
                if from.is_empty() {
                    "nothing settled".to_string()
                } else {
                    from.join(", ")
                },
                cost.round()
            ),
            Source::Completed {
                exact,
                seconds,
                decided_by,
            } => {
                write!(
                    f,
                    "sharding propagation, solved {} with the fixed ops kept: {:.3} us \
                     predicted (compute + communication)",
                    if *exact {
                        "exactly"
                    } else {
                        "by dynamic programming (not proven optimal)"
                    },
                    seconds * 1e6
                )?;
                match decided_by {
                    Some(d) => write!(f, "; decided by {d}"),
                    None => Ok(()),
                }
            }
            Source::Searched { searcher, seconds } => write!(
                f,
                "searched by {searcher}: {:.3} us predicted (compute + communication)",
                seconds * 1e6
            ),
            Source::Unconstrained => f.write_str("no settled neighbour: batch-split default"),
            Source::AnnotationIgnored { annotation } => write!(
                f,
                "data_parallel default (batch split); the annotation {annotation} was ignored \
                 because parallel_mode is data_parallel (shard takes effect only in \
                 semi_auto_parallel and auto_parallel)"
            ),
        }
    }
}

/// The decision for one op.
#[derive(Clone, Debug)]
pub struct Decision {
    /// The chosen sharding.
    pub sharding: OpSharding,
    /// Where it came from.
    pub source: Source,
    /// The candidates weighed, in the order considered.
    pub candidates: Vec<Candidate>,
}

/// One strategy weighed: by sharding propagation in bytes-equivalent, by a searcher in
/// seconds (compute, communication) and bytes (memory).
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    /// The strategy.
    pub strategy: Strategy,
    /// The out strategy, when it splits a loop no input carries.
    pub out_strategy: Option<Strategy>,
    /// Redistribution to and from the settled neighbours (bytes sent per rank, plus a latency
    /// term per collective).
    pub communication: f64,
    /// The op's own work on one device ([`COMPUTE_BYTES_PER_ELEMENT`] per element).
    ///
    /// [`COMPUTE_BYTES_PER_ELEMENT`]: super::propagation::COMPUTE_BYTES_PER_ELEMENT
    pub compute: f64,
    /// Bytes it keeps on one device (searched ops only; propagation leaves 0).
    pub memory: f64,
}

impl Candidate {
    /// Communication plus compute.
    pub fn total(&self) -> f64 {
        self.communication + self.compute
    }
}

/// The result of strategy assignment.
#[derive(Clone, Debug)]
pub struct Assignment {
    /// Per node: its decision (`None` for TupleGetItem, which has no strategy of its own).
    pub decisions: Vec<Option<Decision>>,
    /// Per parameter: its layout.
    pub param_layouts: Vec<TensorLayout>,
    /// What the searcher decided, when one ran (`auto_parallel` with a search mode other than
    /// sharding propagation).
    pub search: Option<SearchReport>,
    /// The weights the parallel optimizer split (`enable_parallel_optimizer`), in update
    /// order.
    pub optimizer_shards: Vec<OptimizerShard>,
}

/// A weight split by the parallel optimizer.
#[derive(Clone, Debug, PartialEq)]
pub struct OptimizerShard {
    /// The weight (parameter index).
    pub weight: usize,
    /// Its optimizer state parameters split alike (parameter indices).
    pub states: Vec<usize>,
    /// The dimension split.
    pub dim: usize,
    /// The devices each slice of the weight's layout is split over.
    pub devices: usize,
    /// The layout before the split.
    pub before: TensorLayout,
}

impl Assignment {
    /// The parallel optimizer's split of parameter `p` (a weight or one of its optimizer
    /// states), if it split it.
    pub fn optimizer_shard_of(&self, p: usize) -> Option<&OptimizerShard> {
        self.optimizer_shards
            .iter()
            .find(|s| s.weight == p || s.states.contains(&p))
    }

    /// The layout a logical operand of `g` has under this assignment: a parameter's, a node's
    /// first result's, or the chosen result of a `TupleGetItem`; `None` for a constant or an
    /// op without a decision.
    pub fn operand_layout(&self, g: &Graph, o: &Operand) -> Option<TensorLayout> {
        let decision = |n: NodeId| self.decisions[n.index()].as_ref();
        match o {
            Operand::Param(p) => Some(self.param_layouts[p.index()].clone()),
            Operand::Node(n) => {
                let node = g.node(*n);
                if node.op == OpKind::TupleGetItem {
                    let Some(Operand::Node(src)) = node.inputs.first() else {
                        return None;
                    };
                    let idx = node.inputs.get(1)?.as_const()?.as_int()? as usize;
                    decision(*src)?.sharding.outputs.get(idx).cloned()
                } else {
                    decision(*n)?.sharding.outputs.first().cloned()
                }
            }
            Operand::Const(_) => None,
        }
    }
}

/// What the search of a training graph decided, for the strategy file and the dumps.
#[derive(Clone, Debug, PartialEq)]
pub struct SearchReport {
    /// The searcher (`recursive_programming`, `dynamic_programming`, `ilp`).
    pub searcher: &'static str,
    /// The predicted step of the whole choice (seconds; bytes per device).
    pub predicted: Breakdown,
    /// The memory limit in force (bytes per device).
    pub memory_limit: f64,
    /// Whether the searcher proved the choice optimal under the cost model.
    pub exact: bool,
    /// What the searcher wants the user to know.
    pub notes: Vec<String>,
    /// Seconds the search took.
    pub search_seconds: f64,
    /// The number of searched ops.
    pub searched_ops: usize,
}
