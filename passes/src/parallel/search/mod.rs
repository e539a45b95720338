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

pub mod dynamic;
pub mod ilp;
pub mod problem;
pub mod recursive;

use super::rules::OpSharding;
use super::strategy::Candidate;
use super::{ParallelError, SearchMode};
use problem::{Breakdown, Problem};
use thiserror::Error;

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
                let s = super::rules::default_strategy(p.g, node, n).ok()?;
                super::rules::sharding(p.g, node, &s, n).ok()
            }
        })
        .collect();
    let semi_auto = (p.ops.len().saturating_mul(n) <= SEMI_AUTO_BASELINE_BUDGET)
        .then(|| {
            let opts = super::ParallelOptions {
                mode: super::Mode::SemiAutoParallel,
                ..p.opts.clone()
            };
            let a =
                super::strategy::assign_weighed(p.g, &opts, super::strategy::Weighing::PlanOnly)
                    .ok()?;
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

/// The predicted step of an assignment made by any source (annotations, propagation, a
/// searcher), under `opts`' machine.
pub fn predict(
    g: &shardc_ir::Graph,
    opts: &super::ParallelOptions,
    a: &super::strategy::Assignment,
) -> Result<Breakdown, ParallelError> {
    let inputs = g
        .params
        .iter()
        .zip(&a.param_layouts)
        .map(|(p, l)| (!p.is_weight()).then(|| l.clone()))
        .collect();
    let p = Problem::new(g, opts, inputs)?;
    let choice: Vec<&OpSharding> = p
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
    Ok(p.step_seconds(&choice))
}

/// The `semi_auto_parallel` baseline is propagated only for problems of at most this many
/// searched ops times devices (propagation weighs every candidate of every op).
pub const SEMI_AUTO_BASELINE_BUDGET: usize = 1 << 20;

/// Candidate lists are explained per op only up to this many searched ops times candidates.
pub const EXPLAIN_BUDGET: usize = 200_000;

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

/// Per searched op of `p`: its candidates (`cands`, when given and within
/// [`EXPLAIN_BUDGET`]; else only the chosen one) weighed against the neighbours of `choice`,
/// with the seconds and bytes of each (for `shardc explain`).
pub fn weigh(
    p: &Problem,
    cands: Option<&[Vec<OpSharding>]>,
    choice: &[&OpSharding],
) -> Vec<Vec<Candidate>> {
    let weigh_one = |k: usize, s: &OpSharding| {
        let b = p.op_breakdown(k, s, choice);
        Candidate {
            strategy: s.strategy.clone(),
            out_strategy: s.out_strategy.clone(),
            communication: b.communication,
            compute: b.compute,
            memory: b.memory,
        }
    };
    let total_cands: usize = cands.map_or(usize::MAX, |c| c.iter().map(Vec::len).sum());
    match cands {
        Some(cands) if total_cands <= EXPLAIN_BUDGET => cands
            .iter()
            .enumerate()
            .map(|(k, cs)| cs.iter().map(|s| weigh_one(k, s)).collect())
            .collect(),
        _ => choice
            .iter()
            .enumerate()
            .map(|(k, s)| vec![weigh_one(k, s)])
            .collect(),
    }
}

/// One op of the cost graph.
#[derive(Clone, Debug, PartialEq)]
pub struct SearchNode {
    /// The op's instance name (for messages).
    pub name: String,
    /// Per candidate: its cost that depends on no other searched op (seconds).
    pub unary: Vec<f64>,
    /// Per candidate: the bytes it keeps on one device (weights, optimizer state, activations).
    pub memory: Vec<f64>,
}

impl SearchNode {
    /// The number of candidates.
    pub fn len(&self) -> usize {
        self.unary.len()
    }

    /// Whether the node has no candidate (never in a valid cost graph).
    pub fn is_empty(&self) -> bool {
        self.unary.is_empty()
    }
}

/// A dependency between two searched ops.
#[derive(Clone, Debug, PartialEq)]
pub struct SearchEdge {
    /// One end (index into [`CostGraph::nodes`]).
    pub a: usize,
    /// The other end (`a != b`; several edges may join the same pair).
    pub b: usize,
    /// Row-major `[ca * nodes[b].len() + cb]`: the cost (seconds) when `a` takes candidate
    /// `ca` and `b` candidate `cb`.
    pub cost: Vec<f64>,
}

impl SearchEdge {
    /// The cost when `a` takes `ca` and `b` takes `cb`; `nb` is `nodes[b].len()`.
    pub fn at(&self, ca: usize, cb: usize, nb: usize) -> f64 {
        self.cost[ca * nb + cb]
    }
}

/// The cost graph: what every searcher minimises.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CostGraph {
    /// The searched ops.
    pub nodes: Vec<SearchNode>,
    /// The edges between them.
    pub edges: Vec<SearchEdge>,
}

impl CostGraph {
    /// The predicted step time of `choice` (one candidate index per node): every node's unary
    /// cost plus every edge's cost.
    pub fn total(&self, choice: &[usize]) -> f64 {
        let u: f64 = self
            .nodes
            .iter()
            .zip(choice)
            .map(|(n, &c)| n.unary[c])
            .sum();
        let e: f64 = self
            .edges
            .iter()
            .map(|e| e.at(choice[e.a], choice[e.b], self.nodes[e.b].len()))
            .sum();
        u + e
    }

    /// The bytes `choice` keeps on one device.
    pub fn memory(&self, choice: &[usize]) -> f64 {
        self.nodes
            .iter()
            .zip(choice)
            .map(|(n, &c)| n.memory[c])
            .sum()
    }

    /// Per node: its incident edges as (edge index, the other end).
    pub fn adjacency(&self) -> Vec<Vec<(usize, usize)>> {
        let mut adj = vec![Vec::new(); self.nodes.len()];
        for (i, e) in self.edges.iter().enumerate() {
            adj[e.a].push((i, e.b));
            adj[e.b].push((i, e.a));
        }
        adj
    }

    /// Checks the shapes: every node has a candidate, the unary and memory lists agree, every
    /// edge joins two distinct nodes and has one cost per candidate pair, and no cost is
    /// negative or not finite.
    pub fn validate(&self) -> Result<(), SearchError> {
        for (i, n) in self.nodes.iter().enumerate() {
            if n.unary.is_empty() || n.unary.len() != n.memory.len() {
                return Err(SearchError::Malformed(format!(
                    "node {i} ('{}') has {} unary costs and {} memory figures (need the same \
                     number, at least one)",
                    n.name,
                    n.unary.len(),
                    n.memory.len()
                )));
            }
            if n.unary
                .iter()
                .chain(&n.memory)
                .any(|x| !x.is_finite() || *x < 0.0)
            {
                return Err(SearchError::Malformed(format!(
                    "node {i} ('{}') has a negative or non-finite cost",
                    n.name
                )));
            }
        }
        for (k, e) in self.edges.iter().enumerate() {
            let nn = self.nodes.len();
            if e.a >= nn || e.b >= nn || e.a == e.b {
                return Err(SearchError::Malformed(format!(
                    "edge {k} joins {} and {} (there are {nn} nodes; the ends must differ)",
                    e.a, e.b
                )));
            }
            let want = self.nodes[e.a].len() * self.nodes[e.b].len();
            if e.cost.len() != want {
                return Err(SearchError::Malformed(format!(
                    "edge {k} has {} costs, need {want}",
                    e.cost.len()
                )));
            }
            if e.cost.iter().any(|x| !x.is_finite() || *x < 0.0) {
                return Err(SearchError::Malformed(format!(
                    "edge {k} has a negative or non-finite cost"
                )));
            }
        }
        Ok(())
    }
}

/// What a searcher found.
#[derive(Clone, Debug, PartialEq)]
pub struct SearchResult {
    /// One candidate index per node.
    pub choice: Vec<usize>,
    /// Its predicted step time ([`CostGraph::total`]).
    pub cost: f64,
    /// Whether the searcher proved it optimal (within the memory limit).
    pub exact: bool,
    /// What the searcher wants the user to know (a fallback taken, a limit that bound).
    pub notes: Vec<String>,
}

/// A search that found nothing.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum SearchError {
    /// The cost graph is inconsistent (a bug in whoever built it).
    #[error("malformed cost graph: {0}")]
    Malformed(String),
    /// No choice fits the memory limit.
    #[error(
        "no strategy fits max_device_memory {limit:.0} bytes: the least memory any choice needs \
         is {least:.0} bytes ({missing:.0} missing); the largest holders: {holders}"
    )]
    OutOfMemory {
        /// The limit in bytes.
        limit: f64,
        /// The least memory of any choice found.
        least: f64,
        /// `least - limit`.
        missing: f64,
        /// The nodes holding the most memory in that choice, with their bytes.
        holders: String,
    },
    /// The solver failed.
    #[error("{searcher}: {reason}")]
    Solver {
        /// The searcher.
        searcher: &'static str,
        /// Why.
        reason: String,
    },
}

/// The nodes holding the most memory under `choice`, for [`SearchError::OutOfMemory`].
pub fn largest_holders(cg: &CostGraph, choice: &[usize], k: usize) -> String {
    let mut v: Vec<(f64, &str)> = cg
        .nodes
        .iter()
        .zip(choice)
        .map(|(n, &c)| (n.memory[c], n.name.as_str()))
        .collect();
    v.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.cmp(b.1)));
    v.iter()
        .take(k)
        .map(|(m, n)| format!("{n} {m:.0} B"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The choice with the least memory: every node's least-memory candidate (ties to the lower
/// index). The memory of this choice is the least any choice needs, since memory is a sum of
/// per-node terms.
pub fn least_memory_choice(cg: &CostGraph) -> Vec<usize> {
    cg.nodes
        .iter()
        .map(|n| {
            (0..n.len())
                .min_by(|&a, &b| n.memory[a].total_cmp(&n.memory[b]).then(a.cmp(&b)))
                .unwrap_or(0)
        })
        .collect()
}

/// The error for a memory limit that even the least-memory choice exceeds, if it does.
pub fn check_memory_feasible(cg: &CostGraph, limit: Option<f64>) -> Result<(), SearchError> {
    let Some(limit) = limit else {
        return Ok(());
    };
    let least = least_memory_choice(cg);
    let m = cg.memory(&least);
    if m > limit {
        return Err(SearchError::OutOfMemory {
            limit,
            least: m,
            missing: m - limit,
            holders: largest_holders(cg, &least, 5),
        });
    }
    Ok(())
}

/// Exhaustive search for tiny cost graphs (tests): the least total within the memory limit,
/// ties to the lexicographically smallest choice. `None` when nothing fits.
pub fn brute_force(cg: &CostGraph, limit: Option<f64>) -> Option<SearchResult> {
    let n = cg.nodes.len();
    let mut cur = vec![0usize; n];
    let mut best: Option<(f64, Vec<usize>)> = None;
    loop {
        if limit.is_none_or(|l| cg.memory(&cur) <= l) {
            let t = cg.total(&cur);
            if best.as_ref().is_none_or(|(b, _)| t < *b - 1e-12) {
                best = Some((t, cur.clone()));
            }
        }
        let mut k = n;
        loop {
            if k == 0 {
                return best.map(|(cost, choice)| SearchResult {
                    choice,
                    cost,
                    exact: true,
                    notes: Vec::new(),
                });
            }
            k -= 1;
            cur[k] += 1;
            if cur[k] < cg.nodes[k].len() {
                break;
            }
            cur[k] = 0;
        }
    }
}

#[cfg(test)]
pub(crate) mod testing {
    //! Random cost graphs for the searchers' tests.
    use super::*;

    /// A small deterministic generator (SplitMix64).
    pub struct Rng(pub u64);

    impl Rng {
        /// The next 64 random bits.
        pub fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }

        /// A number in `0..n`.
        pub fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }

        /// A number in `[0, 1)`.
        pub fn unit(&mut self) -> f64 {
            (self.next() >> 11) as f64 / (1u64 << 53) as f64
        }
    }

    /// A random cost graph: `n` nodes of 1..=`max_cands` candidates, a chain plus `extra`
    /// random edges (so trees, series-parallel graphs and denser graphs all occur).
    pub fn random_graph(rng: &mut Rng, n: usize, max_cands: usize, extra: usize) -> CostGraph {
        let nodes: Vec<SearchNode> = (0..n)
            .map(|i| {
                let k = 1 + rng.below(max_cands);
                SearchNode {
                    name: format!("op{i}"),
                    unary: (0..k).map(|_| rng.unit() * 10.0).collect(),
                    memory: (0..k).map(|_| (rng.below(100) + 1) as f64).collect(),
                }
            })
            .collect();
        let mut edges = Vec::new();
        let mut add = |a: usize, b: usize, rng: &mut Rng| {
            let na = nodes[a].len();
            let nb = nodes[b].len();
            edges.push(SearchEdge {
                a,
                b,
                cost: (0..na * nb)
                    .map(|_| {
                        if rng.below(3) == 0 {
                            0.0
                        } else {
                            rng.unit() * 10.0
                        }
                    })
                    .collect(),
            });
        };
        for i in 1..n {
            let a = rng.below(i);
            add(a, i, rng);
        }
        for _ in 0..extra {
            if n < 2 {
                break;
            }
            let a = rng.below(n);
            let b = rng.below(n);
            if a != b {
                add(a, b, rng);
            }
        }
        CostGraph { nodes, edges }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;

    #[test]
    fn totals_and_memory_add_up() {
        let cg = CostGraph {
            nodes: vec![
                SearchNode {
                    name: "a".into(),
                    unary: vec![1.0, 2.0],
                    memory: vec![10.0, 5.0],
                },
                SearchNode {
                    name: "b".into(),
                    unary: vec![3.0, 0.5, 0.0],
                    memory: vec![1.0, 2.0, 3.0],
                },
            ],
            edges: vec![SearchEdge {
                a: 0,
                b: 1,
                cost: vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0],
            }],
        };
        cg.validate().unwrap();
        assert_eq!(cg.total(&[1, 2]), 2.0 + 0.0 + 5.0);
        assert_eq!(cg.memory(&[1, 2]), 8.0);
        let best = brute_force(&cg, None).unwrap();
        assert_eq!(best.choice, vec![0, 1]);
        assert_eq!(best.cost, 1.0 + 0.5 + 1.0);
        let tight = brute_force(&cg, Some(7.0)).unwrap();
        assert_eq!(tight.choice, vec![1, 1]);
        assert!(brute_force(&cg, Some(5.0)).is_none());
        let e = check_memory_feasible(&cg, Some(5.0)).unwrap_err();
        assert!(e.to_string().contains("1 missing"), "{e}");
        assert!(e.to_string().contains("a 5 B"), "{e}");
    }

    #[test]
    fn validate_names_what_is_wrong() {
        let mut rng = Rng(7);
        let mut cg = random_graph(&mut rng, 4, 3, 2);
        cg.validate().unwrap();
        cg.edges[0].cost.pop();
        assert!(cg.validate().unwrap_err().to_string().contains("edge 0"));
    }
}
