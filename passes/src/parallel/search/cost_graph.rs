//! The cost graph every searcher minimises: per searched op its candidates' own costs and
//! memory ([`SearchNode`]), per dependency between two searched ops a cost matrix
//! ([`SearchEdge`]); the memory checks and the exhaustive search the searchers share.

use thiserror::Error;

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
