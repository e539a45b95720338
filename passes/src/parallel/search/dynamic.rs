//! `dynamic_programming`: exact elimination over the cost graph, as MindSpore's
//! `dp_algo_costmodel` eliminates ops, edges and merges.
//!
//! The cost graph is a pairwise model: a unary cost per node candidate and a cost matrix per
//! edge. Nodes are eliminated lowest degree first (then lowest index):
//! - parallel edges between the same pair are summed into one (edge elimination);
//! - a node with no neighbour keeps its cheapest candidate;
//! - a node with one neighbour folds into it: for each of the neighbour's candidates, the
//!   node's best answer is remembered and its cost added to the neighbour's unary cost
//!   (merge / contract elimination);
//! - a node with two neighbours becomes one edge between them: for each pair of their
//!   candidates, its best answer is remembered and its cost is that edge's cost (op
//!   elimination); an edge already joining them is summed in.
//!
//! On a series-parallel graph (chains, trees, diamonds, nested residual blocks) these steps
//! eliminate everything, and back-substitution in reverse order recovers a choice that is
//! optimal. Where every remaining node has three neighbours or more, the fallback conditions
//! on the node of most neighbours (lowest index first): it takes the candidate with the least
//! unary cost plus the best of each incident edge, and its edges become unary costs of its
//! neighbours. The nodes so fixed are a cut set: with them fixed, the rest is solved exactly.
//! - When the combinations of the cut's candidates fit [`CUT_BUDGET`], every one is tried
//!   (cut-set conditioning, on rayon) and the best is optimal (`exact: true`, a note gives
//!   the cut's size). Training graphs are rarely series-parallel (a weight meets its
//!   gradient and its update), but their cut sets are small: 1 to 4 ops on the random graphs
//!   of `tests/search_optimality.rs`.
//! - Otherwise [`improve`] searches around the fallback's result, each cut node trying every
//!   candidate with the rest re-solved exactly, and the result is not proven optimal
//!   (`exact: false`, a note names the cut).
//!
//! The memory limit: memory is a sum of per-node terms, so the search minimises
//! `time + λ · memory` (Lagrangian relaxation). With `λ = 0` first; if that choice does not
//! fit, `λ` grows until one fits and is then bisected towards the least `λ` whose choice
//! fits; the best fitting choice is kept, not proven optimal, and a note gives `λ`.
//!
//! Work: every elimination of a node with two neighbours of `a` and `b` candidates costs
//! `a · b · c` for its own `c`; the queue is an ordered set, so the whole search is
//! `O(n log n)` eliminations.

use super::cost_graph::{
    check_memory_feasible, least_memory_choice, CostGraph, SearchError, SearchResult,
};
use std::collections::{BTreeMap, BTreeSet};

/// Bisection rounds on the memory weight.
const BISECTIONS: usize = 40;

/// A matrix between two nodes, oriented `lo` → `hi` (`lo < hi`), row-major over `lo`'s
/// candidates.
struct Matrix {
    lo: usize,
    hi: usize,
    cost: Vec<f64>,
}

/// What back-substitution needs for one eliminated node.
enum Step {
    /// The node's candidate was decided on its own.
    Alone { v: usize, c: usize },
    /// The node's best answer per candidate of `u`.
    One { v: usize, u: usize, arg: Vec<usize> },
    /// The node's best answer per (candidate of `u`, candidate of `w`), row-major over `u`.
    Two {
        v: usize,
        u: usize,
        w: usize,
        nw: usize,
        arg: Vec<usize>,
    },
}

struct Elimination {
    sizes: Vec<usize>,
    unary: Vec<Vec<f64>>,
    matrices: Vec<Option<Matrix>>,
    /// Per node: neighbour -> matrix index.
    adj: Vec<BTreeMap<usize, usize>>,
    queue: BTreeSet<(usize, usize)>,
    alive: Vec<bool>,
    /// Candidate combinations visited, matrix entries copied and set updates (the cost of
    /// the elimination, in about the same unit).
    work: usize,
}

impl Elimination {
    fn new(cg: &CostGraph, lambda: f64) -> Elimination {
        let n = cg.nodes.len();
        let sizes: Vec<usize> = cg.nodes.iter().map(|x| x.len()).collect();
        let unary = cg
            .nodes
            .iter()
            .map(|x| {
                x.unary
                    .iter()
                    .zip(&x.memory)
                    .map(|(u, m)| u + lambda * m)
                    .collect()
            })
            .collect();
        let mut e = Elimination {
            sizes,
            unary,
            matrices: Vec::new(),
            adj: vec![BTreeMap::new(); n],
            queue: BTreeSet::new(),
            alive: vec![true; n],
            work: 0,
        };
        for edge in &cg.edges {
            let (a, b) = (edge.a, edge.b);
            let nb = e.sizes[b];
            let (lo, hi) = (a.min(b), a.max(b));
            let mut cost = vec![0.0; e.sizes[lo] * e.sizes[hi]];
            for ca in 0..e.sizes[a] {
                for cb in 0..nb {
                    let (cl, ch) = if a == lo { (ca, cb) } else { (cb, ca) };
                    cost[cl * e.sizes[hi] + ch] = edge.cost[ca * nb + cb];
                }
            }
            e.add_matrix(Matrix { lo, hi, cost });
        }
        for v in 0..n {
            e.queue.insert((e.adj[v].len(), v));
        }
        // Building costs its copies of the matrices and an ordered-set entry per node.
        e.work = cg.edges.iter().map(|x| x.cost.len()).sum::<usize>() + 32 * n;
        e
    }

    /// Adds `m` to the matrix joining its ends (created if absent); keeps the queue's
    /// degrees in step.
    fn add_matrix(&mut self, m: Matrix) {
        match self.adj[m.lo].get(&m.hi) {
            Some(&k) => {
                if let Some(old) = self.matrices[k].as_mut() {
                    for (x, y) in old.cost.iter_mut().zip(&m.cost) {
                        *x += y;
                    }
                }
            }
            None => {
                let (lo, hi) = (m.lo, m.hi);
                for v in [lo, hi] {
                    self.queue.remove(&(self.adj[v].len(), v));
                }
                let k = self.matrices.len();
                self.matrices.push(Some(m));
                self.adj[lo].insert(hi, k);
                self.adj[hi].insert(lo, k);
                for v in [lo, hi] {
                    if self.alive[v] {
                        self.queue.insert((self.adj[v].len(), v));
                    }
                }
            }
        }
    }

    /// The cost of matrix `k` when `v` takes `cv` and its other end takes `co`.
    fn at(&self, k: usize, v: usize, cv: usize, co: usize) -> f64 {
        let m = self.matrices[k].as_ref().expect("a live matrix");
        if m.lo == v {
            m.cost[cv * self.sizes[m.hi] + co]
        } else {
            m.cost[co * self.sizes[m.hi] + cv]
        }
    }

    /// Removes `v` and its matrices from the graph.
    fn detach(&mut self, v: usize) -> Vec<(usize, usize)> {
        self.queue.remove(&(self.adj[v].len(), v));
        self.alive[v] = false;
        let nbrs: Vec<(usize, usize)> = self.adj[v].iter().map(|(&u, &k)| (u, k)).collect();
        for &(u, _) in &nbrs {
            self.queue.remove(&(self.adj[u].len(), u));
            self.adj[u].remove(&v);
            self.queue.insert((self.adj[u].len(), u));
        }
        nbrs
    }

    fn cheapest(&self, v: usize) -> usize {
        let u = &self.unary[v];
        (0..u.len())
            .min_by(|&a, &b| u[a].total_cmp(&u[b]).then(a.cmp(&b)))
            .unwrap_or(0)
    }

    /// Fixes node `v` to candidate `c`: its edges become unary costs of its neighbours.
    fn condition(&mut self, v: usize, c: usize) {
        let nbrs: Vec<(usize, usize)> = self.adj[v].iter().map(|(&u, &k)| (u, k)).collect();
        for &(u, k) in &nbrs {
            for cu in 0..self.sizes[u] {
                let x = self.at(k, v, c, cu);
                self.unary[u][cu] += x;
            }
        }
        self.detach(v);
        for &(_, k) in &nbrs {
            self.matrices[k] = None;
        }
    }

    /// Runs the elimination with the nodes of `forced` fixed first; returns the choice and
    /// the nodes the fallback fixed greedily.
    fn run(mut self, forced: &[(usize, usize)]) -> (Vec<usize>, Vec<usize>, usize) {
        let mut steps = Vec::new();
        let mut fixed = Vec::new();
        for &(v, c) in forced {
            if self.alive[v] {
                self.condition(v, c);
                steps.push(Step::Alone { v, c });
            }
        }
        while let Some(&(deg, v)) = self.queue.iter().next() {
            if deg > 2 {
                // Fallback: condition on the node with the most neighbours (the lowest index
                // among them).
                let &(most, _) = self
                    .queue
                    .iter()
                    .next_back()
                    .expect("the queue is not empty");
                let &(_, v) = self
                    .queue
                    .range((most, 0)..)
                    .next()
                    .expect("the queue is not empty");
                let nbrs: Vec<(usize, usize)> = self.adj[v].iter().map(|(&u, &k)| (u, k)).collect();
                let score = |c: usize| -> f64 {
                    self.unary[v][c]
                        + nbrs
                            .iter()
                            .map(|&(u, k)| {
                                (0..self.sizes[u])
                                    .map(|cu| self.at(k, v, c, cu) + self.unary[u][cu])
                                    .fold(f64::INFINITY, f64::min)
                            })
                            .sum::<f64>()
                };
                let c = (0..self.sizes[v])
                    .min_by(|&a, &b| score(a).total_cmp(&score(b)).then(a.cmp(&b)))
                    .unwrap_or(0);
                self.condition(v, c);
                steps.push(Step::Alone { v, c });
                fixed.push(v);
                continue;
            }
            let nbrs = self.detach(v);
            let nv = self.sizes[v];
            match nbrs[..] {
                [] => {
                    let c = self.cheapest(v);
                    steps.push(Step::Alone { v, c });
                }
                [(u, k)] => {
                    let nu = self.sizes[u];
                    self.work += nu * nv;
                    let mut arg = vec![0; nu];
                    for (cu, a) in arg.iter_mut().enumerate() {
                        let mut best = (f64::INFINITY, 0);
                        for cv in 0..nv {
                            let x = self.unary[v][cv] + self.at(k, v, cv, cu);
                            if x < best.0 {
                                best = (x, cv);
                            }
                        }
                        *a = best.1;
                        self.unary[u][cu] += best.0;
                    }
                    self.matrices[k] = None;
                    steps.push(Step::One { v, u, arg });
                }
                [(u, ku), (w, kw)] => {
                    let (nu, nw) = (self.sizes[u], self.sizes[w]);
                    self.work += nu * nw * nv;
                    let mut arg = vec![0; nu * nw];
                    let mut cost = vec![0.0; nu * nw];
                    for cu in 0..nu {
                        for cw in 0..nw {
                            let mut best = (f64::INFINITY, 0);
                            for cv in 0..nv {
                                let x = self.unary[v][cv]
                                    + self.at(ku, v, cv, cu)
                                    + self.at(kw, v, cv, cw);
                                if x < best.0 {
                                    best = (x, cv);
                                }
                            }
                            arg[cu * nw + cw] = best.1;
                            cost[cu * nw + cw] = best.0;
                        }
                    }
                    self.matrices[ku] = None;
                    self.matrices[kw] = None;
                    // u < w here (the adjacency map is ordered), so the matrix is oriented.
                    self.add_matrix(Matrix { lo: u, hi: w, cost });
                    steps.push(Step::Two { v, u, w, nw, arg });
                }
                _ => unreachable!("degree at most 2"),
            }
        }
        let mut choice = vec![0usize; self.sizes.len()];
        for s in steps.iter().rev() {
            match s {
                Step::Alone { v, c } => choice[*v] = *c,
                Step::One { v, u, arg } => choice[*v] = arg[choice[*u]],
                Step::Two { v, u, w, nw, arg } => {
                    choice[*v] = arg[choice[*u] * nw + choice[*w]];
                }
            }
        }
        let work = self.work + 32 * steps.len();
        (choice, fixed, work)
    }
}

/// What one solve at a memory weight found.
struct Solved {
    /// A candidate per node.
    choice: Vec<usize>,
    /// The cut set the fallback fixed (empty for a series-parallel graph).
    cut: Vec<usize>,
    /// Whether `choice` is proven optimal at this weight: the graph was series-parallel, or
    /// every combination of the cut's candidates was tried with the rest solved exactly.
    exact: bool,
}

/// One elimination at memory weight `lambda`. Where the fallback had to fix a cut set and
/// `condition` holds, every combination of the cut's candidates is tried when they fit
/// [`CUT_BUDGET`] (cut-set conditioning: exact); otherwise [`improve`] searches around the
/// result. The memory limit's re-solves (dozens of weights, none of them proven anyway) do not
/// condition, so a bound search costs what it did before conditioning existed.
fn solve(cg: &CostGraph, lambda: f64, condition: bool) -> Solved {
    let (choice, cut, work) = Elimination::new(cg, lambda).run(&[]);
    if cut.is_empty() {
        return Solved {
            choice,
            cut,
            exact: true,
        };
    }
    if let Some(best) = condition
        .then(|| condition_on_cut(cg, lambda, &cut, work))
        .flatten()
    {
        return Solved {
            choice: best,
            cut,
            exact: true,
        };
    }
    let choice = improve(cg, lambda, choice, cut.clone());
    Solved {
        choice,
        cut,
        exact: false,
    }
}

/// The work `condition_on_cut` may spend, in the unit of [`IMPROVE_BUDGET`] (about two
/// seconds of one core here, shared by the threads).
pub const CUT_BUDGET: usize = 2 * IMPROVE_BUDGET;

/// Cut-set conditioning: the optimum over every combination of the candidates of `cut`,
/// each with the rest of the graph solved exactly by elimination, or `None` when the
/// combinations would exceed [`CUT_BUDGET`] (one solve costs about `work`) or some
/// combination leaves a remainder that elimination cannot solve exactly. Combinations run on
/// rayon; ties go to the first combination in counting order, so the answer does not depend
/// on the thread count.
fn condition_on_cut(cg: &CostGraph, lambda: f64, cut: &[usize], work: usize) -> Option<Vec<usize>> {
    use rayon::prelude::*;
    let radix: Vec<usize> = cut.iter().map(|&v| cg.nodes[v].len().max(1)).collect();
    let combos = radix
        .iter()
        .try_fold(1usize, |acc, &r| acc.checked_mul(r))?;
    if combos.checked_mul(work.max(1))? > CUT_BUDGET {
        return None;
    }
    let price = |c: &[usize]| cg.total(c) + lambda * cg.memory(c);
    let best = (0..combos)
        .into_par_iter()
        .map(|index| {
            let mut rest = index;
            let forced: Vec<(usize, usize)> = cut
                .iter()
                .zip(&radix)
                .map(|(&v, &r)| {
                    let c = rest % r;
                    rest /= r;
                    (v, c)
                })
                .collect();
            let (choice, more, _) = Elimination::new(cg, lambda).run(&forced);
            more.is_empty().then(|| (price(&choice), index, choice))
        })
        .try_reduce_with(|a, b| {
            Some(if b.0 < a.0 || (b.0 == a.0 && b.1 < a.1) {
                b
            } else {
                a
            })
        })??;
    Some(best.2)
}

/// The work [`improve`] may spend, in candidate combinations its re-solves visit (a
/// deterministic bound of about a second here).
pub const IMPROVE_BUDGET: usize = 60_000_000;

/// The nodes elimination's fallback fixes on `cg` (empty for a series-parallel graph): a cut
/// set for [`improve`].
pub fn cut_set(cg: &CostGraph) -> Vec<usize> {
    Elimination::new(cg, 0.0).run(&[]).1
}

/// Large-neighbourhood search around `choice` for a graph that elimination cannot solve
/// exactly: the cut set `cut` (the nodes the fallback fixed) is what makes the rest
/// series-parallel, so with the cut fixed the rest is solved exactly by elimination. Each cut
/// node in turn tries every candidate, the others held at their current values and the rest
/// re-solved exactly; a better total (time + `lambda` · memory) is kept; sweeps repeat until
/// none improves or [`IMPROVE_BUDGET`] is spent. Nodes the fallback fixes anew
/// join the cut.
pub fn improve(cg: &CostGraph, lambda: f64, choice: Vec<usize>, cut: Vec<usize>) -> Vec<usize> {
    improve_within(cg, lambda, choice, cut, IMPROVE_BUDGET)
}

/// As [`improve`], spending at most `budget` instead of [`IMPROVE_BUDGET`].
pub fn improve_within(
    cg: &CostGraph,
    lambda: f64,
    mut choice: Vec<usize>,
    mut cut: Vec<usize>,
    budget: usize,
) -> Vec<usize> {
    let price = |c: &[usize]| cg.total(c) + lambda * cg.memory(c);
    let mut best = price(&choice);
    let mut spent = 0usize;
    // The work of one re-solve, as the first one measures it.
    let mut per_solve = cg.nodes.len().max(1);
    'sweeps: for _ in 0..4 {
        let mut better = false;
        let mut i = 0;
        while i < cut.len() {
            let v = cut[i];
            for c in 0..cg.nodes[v].len() {
                if c == choice[v] {
                    continue;
                }
                if spent + per_solve > budget {
                    break 'sweeps;
                }
                let forced: Vec<(usize, usize)> = cut
                    .iter()
                    .map(|&u| (u, if u == v { c } else { choice[u] }))
                    .collect();
                let (trial, more, work) = Elimination::new(cg, lambda).run(&forced);
                spent += work;
                per_solve = work;
                for m in more {
                    if !cut.contains(&m) {
                        cut.push(m);
                    }
                }
                let p = price(&trial);
                if p < best - 1e-12 * best.abs() {
                    best = p;
                    choice = trial;
                    better = true;
                }
            }
            i += 1;
        }
        if !better {
            break;
        }
    }
    choice
}

/// Elimination with no memory weight, then (where the graph is not series-parallel)
/// [`improve_within`] `budget`, without cut-set conditioning: the stage planner's search, run
/// at many (devices, micro-batch) points, which checks memory itself. Returns the choice and
/// whether it is exact.
pub fn search_within(cg: &CostGraph, budget: usize) -> Result<(Vec<usize>, bool), SearchError> {
    cg.validate()?;
    let (choice, cut, _) = Elimination::new(cg, 0.0).run(&[]);
    if cut.is_empty() {
        return Ok((choice, true));
    }
    Ok((improve_within(cg, 0.0, choice, cut, budget), false))
}

/// Searches `cg` by elimination within `memory_limit` bytes per device.
pub fn search(cg: &CostGraph, memory_limit: Option<f64>) -> Result<SearchResult, SearchError> {
    cg.validate()?;
    check_memory_feasible(cg, memory_limit)?;
    let mut notes = Vec::new();
    let first = solve(cg, 0.0, true);
    let fallback_note = |fixed: &[usize]| {
        let names: Vec<&str> = fixed
            .iter()
            .take(8)
            .map(|&v| cg.nodes[v].name.as_str())
            .collect();
        format!(
            "dynamic_programming: the cost graph is not series-parallel; {} op(s) form a cut \
             set ({}{}): each tried every candidate with the rest solved exactly, not proven \
             optimal",
            fixed.len(),
            names.join(", "),
            if fixed.len() > 8 { ", ..." } else { "" }
        )
    };
    let conditioned_note = |cut: &[usize]| {
        let combos: f64 = cut.iter().map(|&v| cg.nodes[v].len() as f64).product();
        format!(
            "dynamic_programming: the cost graph is not series-parallel; solved exactly by \
             conditioning on a cut set of {} op(s) ({combos} candidate combinations)",
            cut.len()
        )
    };
    let fits = |c: &[usize]| memory_limit.is_none_or(|l| cg.memory(c) <= l);
    if fits(&first.choice) {
        let Solved { choice, cut, exact } = first;
        if !exact {
            notes.push(fallback_note(&cut));
        } else if !cut.is_empty() {
            notes.push(conditioned_note(&cut));
        }
        let cost = cg.total(&choice);
        return Ok(SearchResult {
            choice,
            cost,
            exact,
            notes,
        });
    }
    let choice = first.choice;
    let limit = memory_limit.unwrap_or(f64::INFINITY);
    // Grow λ until a choice fits, then bisect towards the least such λ.
    let scale = cg.total(&choice) / cg.memory(&choice).max(1.0);
    let mut lo = 0.0;
    let mut hi = scale.max(1e-30);
    type Kept = Option<(f64, Vec<usize>, Vec<usize>, f64)>;
    let keep = |lambda: f64, c: Vec<usize>, f: Vec<usize>, best: &mut Kept| {
        let t = cg.total(&c);
        if best.as_ref().is_none_or(|b| t < b.0) {
            *best = Some((t, c, f, lambda));
        }
    };
    let mut best: Kept = None;
    let mut found = false;
    for _ in 0..200 {
        let Solved {
            choice: c, cut: f, ..
        } = solve(cg, hi, false);
        if fits(&c) {
            keep(hi, c, f, &mut best);
            found = true;
            break;
        }
        lo = hi;
        hi *= 4.0;
    }
    if !found {
        // The least-memory choice fits (checked above): take it.
        let c = least_memory_choice(cg);
        keep(f64::INFINITY, c, Vec::new(), &mut best);
    } else {
        for _ in 0..BISECTIONS {
            let mid = 0.5 * (lo + hi);
            let Solved {
                choice: c, cut: f, ..
            } = solve(cg, mid, false);
            if fits(&c) {
                keep(mid, c, f, &mut best);
                hi = mid;
            } else {
                lo = mid;
            }
        }
    }
    let (cost, choice, fixed, lambda) = best.expect("a fitting choice");
    if !fixed.is_empty() {
        notes.push(fallback_note(&fixed));
    }
    notes.push(format!(
        "memory limit bound: memory weighted by {lambda:.3e} s/byte; {:.0} of {limit:.0} bytes \
         per device",
        cg.memory(&choice)
    ));
    Ok(SearchResult {
        choice,
        cost,
        exact: false,
        notes,
    })
}

#[cfg(test)]
mod tests {
    use super::super::cost_graph::testing::{random_graph, Rng};
    use super::super::cost_graph::{brute_force, SearchEdge, SearchNode};
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
    }

    #[test]
    fn equals_brute_force_wherever_it_claims_exactness() {
        let mut rng = Rng(42);
        let (mut exact, mut total) = (0, 0);
        for case in 0..600 {
            let n = 1 + rng.below(9);
            let extra = rng.below(5);
            let cg = random_graph(&mut rng, n, 4, extra);
            let opt = brute_force(&cg, None).unwrap();
            let r = search(&cg, None).unwrap();
            assert!(close(r.cost, cg.total(&r.choice)), "case {case}");
            assert!(r.cost >= opt.cost - 1e-9, "case {case}");
            if r.exact {
                exact += 1;
                assert!(
                    close(r.cost, opt.cost),
                    "case {case}: {} vs {}",
                    r.cost,
                    opt.cost
                );
            }
            if extra == 0 {
                assert!(r.exact, "case {case}: a tree must be exact");
            }
            total += 1;
        }
        eprintln!("dynamic_programming: exact in {exact} of {total} random graphs");
    }

    fn node(name: &str, unary: Vec<f64>) -> SearchNode {
        let k = unary.len();
        SearchNode {
            name: name.into(),
            unary,
            memory: vec![1.0; k],
        }
    }

    #[test]
    fn series_parallel_graphs_are_exact_small_cuts_are_conditioned_and_large_ones_fall_back() {
        let mut rng = Rng(5);
        // A diamond and a chain with skip edges of length 2.
        for shape in [
            vec![(0, 1), (0, 2), (1, 3), (2, 3)],
            vec![(0, 1), (1, 2), (2, 3), (3, 4), (0, 2), (2, 4)],
        ] {
            let n = shape.iter().map(|&(a, b)| a.max(b)).max().unwrap() + 1;
            let nodes: Vec<SearchNode> = (0..n)
                .map(|i| node(&format!("v{i}"), (0..3).map(|_| rng.unit()).collect()))
                .collect();
            let edges = shape
                .iter()
                .map(|&(a, b)| SearchEdge {
                    a,
                    b,
                    cost: (0..9).map(|_| rng.unit() * 3.0).collect(),
                })
                .collect();
            let cg = CostGraph { nodes, edges };
            let r = search(&cg, None).unwrap();
            assert!(r.exact, "{shape:?}");
            assert!(close(r.cost, brute_force(&cg, None).unwrap().cost));
        }
        // K5: every node has four neighbours; a cut set of two nodes leaves a triangle, and
        // their 4 combinations are all tried: exact.
        let complete = |n: usize, k: usize, rng: &mut Rng| {
            let nodes: Vec<SearchNode> = (0..n)
                .map(|i| node(&format!("k{i}"), (0..k).map(|c| 1.0 + c as f64).collect()))
                .collect();
            let mut edges = Vec::new();
            for a in 0..n {
                for b in a + 1..n {
                    edges.push(SearchEdge {
                        a,
                        b,
                        cost: (0..k * k).map(|_| rng.unit()).collect(),
                    });
                }
            }
            CostGraph { nodes, edges }
        };
        let cg = complete(5, 2, &mut rng);
        let r = search(&cg, None).unwrap();
        assert!(r.exact, "{:?}", r.notes);
        assert!(
            r.notes[0].contains("conditioning on a cut set of 2"),
            "{:?}",
            r.notes
        );
        assert!(close(r.cost, brute_force(&cg, None).unwrap().cost));
        // K9 with 10 candidates: a cut set of 7 nodes, 10^7 combinations, beyond the budget:
        // the fallback's local search, not proven.
        let cg = complete(9, 10, &mut rng);
        let r = search(&cg, None).unwrap();
        assert!(!r.exact);
        assert!(r.notes[0].contains("not series-parallel"), "{:?}", r.notes);
        assert!(r.notes[0].contains("k0"), "{:?}", r.notes);
    }

    #[test]
    fn memory_limits_bind_or_fail_clearly() {
        let mut rng = Rng(9);
        for case in 0..200 {
            let n = 2 + rng.below(6);
            let extra = rng.below(3);
            let cg = random_graph(&mut rng, n, 3, extra);
            let least = cg.memory(&least_memory_choice(&cg));
            let free = cg.memory(&search(&cg, None).unwrap().choice);
            let limit = 0.5 * (least + free);
            let r = search(&cg, Some(limit)).unwrap();
            assert!(cg.memory(&r.choice) <= limit, "case {case}");
            let opt = brute_force(&cg, Some(limit)).unwrap();
            assert!(r.cost >= opt.cost - 1e-9, "case {case}");
            let e = search(&cg, Some(least - 0.5)).unwrap_err();
            assert!(
                matches!(e, SearchError::OutOfMemory { .. }),
                "case {case}: {e}"
            );
        }
    }

    #[test]
    fn scales_to_large_sparse_graphs() {
        let mut rng = Rng(1);
        let n = 10_000;
        let cg = random_graph(&mut rng, n, 8, n / 2);
        let t = std::time::Instant::now();
        let r = search(&cg, None).unwrap();
        eprintln!(
            "dynamic_programming: {n} nodes, {} edges in {:.3} s (exact {})",
            cg.edges.len(),
            t.elapsed().as_secs_f64(),
            r.exact
        );
        assert_eq!(r.choice.len(), n);
    }

    #[test]
    #[ignore = "a timing run: cargo test --release -p shardc-passes -- --ignored dynamic"]
    fn a_hundred_thousand_nodes() {
        let mut rng = Rng(2);
        let n = 100_000;
        let cg = random_graph(&mut rng, n, 8, n / 2);
        let t = std::time::Instant::now();
        let r = search(&cg, None).unwrap();
        eprintln!(
            "dynamic_programming: {n} nodes in {:.3} s (exact {})",
            t.elapsed().as_secs_f64(),
            r.exact
        );
    }
}
