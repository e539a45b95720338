//! `recursive_programming`: strategies by rounds of cuts, as MindSpore's SAPP / D-Rec.
//!
//! The device count `N` is cut into its prime factors, largest first (log2(N) rounds of
//! two-way cuts for a power of two). Every op starts whole; in each round, the ops are visited
//! by weight (their unsplit compute time, heaviest first; then program order) and each takes
//! the cheapest of: cutting one of its loops once more by the round's factor, or staying as
//! it is (a strategy using fewer devices, the rest repeating the work). The price of an option
//! is the op's compute time plus every term with an op already visited in this round, a user
//! annotation (fixed from the start) or a data input (fixed by the dataset strategy) — the
//! ops not yet visited follow later, as in D-Rec, so a heavy op is never held back by
//! neighbours that have not moved yet — plus `λ` times its memory.
//!
//! The work is `rounds × ops × (loops + 1)` option prices, each a few redistribution times
//! (memoised per pair of layouts): linear in the graph, logarithmic in `N`.
//!
//! For small problems (every candidate list at most [`super::problem::MAX_CANDIDATES`] and
//! at most [`REFINE_MAX_DEVICES`] devices) a refinement follows: sweeps of single-op moves
//! over the full candidate lists, each op taking its best candidate against all its
//! neighbours, until no move lowers the predicted step time; then
//! [`super::dynamic::improve`]'s coordinated moves around the result.
//!
//! Memory: with `λ = 0` first; when the result exceeds the limit, `λ` starts at the ratio of
//! its step time to its memory and doubles (at most [`MEMORY_ROUNDS`] times) until a result
//! fits.

use super::super::rules::{loop_admits, OpSharding};
use super::super::ParallelError;
use super::cost_graph::{check_memory_feasible, CostGraph, SearchError};
use super::problem::Problem;

/// Refinement runs up to this device count.
pub const REFINE_MAX_DEVICES: usize = 64;
/// At most this many doublings of the memory weight.
pub const MEMORY_ROUNDS: usize = 40;

/// The prime factors of `n`, largest first.
fn factors(n: usize) -> Vec<usize> {
    let mut f = super::super::redistribute::factor(n);
    f.reverse();
    f
}

/// What the recursive search found.
#[derive(Clone, Debug)]
pub struct Found {
    /// One sharding per searched op.
    pub shardings: Vec<OpSharding>,
    /// Notes for the user (memory weight, refinement moves).
    pub notes: Vec<String>,
}

fn search_with(p: &Problem, lambda: f64) -> Result<Vec<OpSharding>, ParallelError> {
    let n = p.opts.device_num;
    let g = p.g;
    let count = p.ops.len();
    let mut dims = Vec::with_capacity(count);
    for &id in &p.ops {
        dims.push(super::super::rules::dims_of(g, g.node(id))?);
    }
    let mut splits: Vec<Vec<usize>> = dims.iter().map(|d| vec![1; d.loop_sizes.len()]).collect();
    let mut cur: Vec<OpSharding> = Vec::with_capacity(count);
    for k in 0..count {
        let node = g.node(p.ops[k]);
        cur.push(match &p.fixed[k] {
            Some(f) => f.clone(),
            None => super::super::rules::sharding_of_loops(g, node, &dims[k], &splits[k], n)?,
        });
    }
    let weight: Vec<f64> = (0..count).map(|k| p.compute_seconds(k, &cur[k])).collect();
    let mut order: Vec<usize> = (0..count).filter(|&k| p.fixed[k].is_none()).collect();
    order.sort_by(|&a, &b| weight[b].total_cmp(&weight[a]).then(a.cmp(&b)));
    let fixed: Vec<bool> = p.fixed.iter().map(Option::is_some).collect();
    let mut used = vec![1usize; count];
    for q in factors(n) {
        let mut visited = fixed.clone();
        for &k in &order {
            let node = g.node(p.ops[k]);
            let price = |s: &OpSharding, cur: &[OpSharding], visited: &[bool]| -> f64 {
                let mut c = p.compute_seconds(k, s) + lambda * p.memory_bytes(k, s);
                for &t in &p.op_terms[k] {
                    let term = &p.terms[t];
                    if term.ops().iter().all(|&x| x == k || visited[x]) {
                        c += p.term_estimate(term, |x| if x == k { s } else { &cur[x] });
                    }
                }
                c
            };
            let mut best: Option<(f64, Vec<usize>, OpSharding)> = None;
            if used[k] * q <= n && n % (used[k] * q) == 0 {
                for l in 0..splits[k].len() {
                    let want = splits[k][l] * q;
                    if !loop_admits(g, node, &dims[k], l, want) {
                        continue;
                    }
                    let mut sp = splits[k].clone();
                    sp[l] = want;
                    let Ok(s) = super::super::rules::sharding_of_loops(g, node, &dims[k], &sp, n)
                    else {
                        continue;
                    };
                    let c = price(&s, &cur, &visited);
                    if best.as_ref().is_none_or(|(b, _, _)| c < *b - 1e-15) {
                        best = Some((c, sp, s));
                    }
                }
            }
            let stay = price(&cur[k], &cur, &visited);
            if let Some((c, sp, s)) = best {
                // A tie goes to the cut (more devices used).
                if c <= stay + 1e-15 {
                    used[k] *= q;
                    splits[k] = sp;
                    cur[k] = s;
                }
            }
            visited[k] = true;
        }
    }
    Ok(cur)
}

/// Sweeps of single-op moves over the full candidate lists until none helps; returns the
/// number of moves made.
fn refine(cg: &CostGraph, choice: &mut [usize]) -> usize {
    let adj = cg.adjacency();
    let mut moves = 0;
    for _ in 0..8 {
        let mut changed = false;
        for v in 0..cg.nodes.len() {
            let price = |c: usize| -> f64 {
                let mut x = cg.nodes[v].unary[c];
                for &(e, _) in &adj[v] {
                    let ed = &cg.edges[e];
                    let nb = cg.nodes[ed.b].len();
                    x += if ed.a == v {
                        ed.at(c, choice[ed.b], nb)
                    } else {
                        ed.at(choice[ed.a], c, nb)
                    };
                }
                x
            };
            let now = price(choice[v]);
            let mut best = (now, choice[v]);
            for c in 0..cg.nodes[v].len() {
                let x = price(c);
                if x < best.0 - 1e-12 * now.abs().max(1e-12) {
                    best = (x, c);
                }
            }
            if best.1 != choice[v] {
                choice[v] = best.1;
                moves += 1;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    moves
}

/// Runs the recursive search on `p` within `limit` bytes per device.
pub fn search(p: &Problem, limit: f64) -> Result<Found, ParallelError> {
    let mut notes = Vec::new();
    let mut lambda = 0.0;
    let mut found = None;
    for round in 0..=MEMORY_ROUNDS {
        let s = search_with(p, lambda)?;
        let refs: Vec<&OpSharding> = s.iter().collect();
        let b = p.step_seconds(&refs);
        if b.memory <= limit {
            if round > 0 {
                notes.push(format!(
                    "memory limit bound: memory weighted by {lambda:.3e} s/byte; {:.0} of {:.0} \
                     bytes per device",
                    b.memory, limit
                ));
            }
            found = Some(s);
            break;
        }
        lambda = if lambda == 0.0 {
            (b.seconds() / b.memory.max(1.0)).max(1e-18)
        } else {
            lambda * 2.0
        };
    }
    let Some(mut shardings) = found else {
        // Nothing fitted: say how much is missing, from the least-memory candidates.
        let cands = p.all_candidates()?;
        let cg = p.cost_graph(&cands);
        check_memory_feasible(&cg, Some(limit)).map_err(search_error)?;
        return Err(search_error(SearchError::Solver {
            searcher: "recursive_programming",
            reason: format!(
                "no result within max_device_memory {limit:.0} bytes although one exists; use \
                 search_mode dynamic_programming or ilp"
            ),
        }));
    };
    if p.opts.device_num <= REFINE_MAX_DEVICES {
        let cands = p.all_candidates()?;
        let index: Option<Vec<usize>> = shardings
            .iter()
            .zip(&cands)
            .map(|(s, cs)| cs.iter().position(|c| c.loop_splits == s.loop_splits))
            .collect();
        if let Some(mut choice) = index {
            let cg = p.cost_graph(&cands);
            let before = cg.total(&choice);
            let mut trial = choice.clone();
            let moves = refine(&cg, &mut trial);
            // Then coordinated moves: each op of a cut set that leaves the rest
            // series-parallel tries every candidate, the rest re-solved exactly.
            let cut = super::dynamic::cut_set(&cg);
            let trial = super::dynamic::improve(&cg, 0.0, trial, cut);
            if cg.memory(&trial) <= limit && cg.total(&trial) < before {
                choice = trial;
                notes.push(format!(
                    "refined ({moves} single-op move(s), then the cut set's candidates with the \
                     rest re-solved exactly): predicted {:.6} ms -> {:.6} ms",
                    before * 1e3,
                    cg.total(&choice) * 1e3
                ));
                shardings = choice
                    .iter()
                    .zip(cands)
                    .map(|(&c, mut cs)| cs.swap_remove(c))
                    .collect();
            }
        }
    }
    Ok(Found { shardings, notes })
}

/// A search error as a parallel error.
pub fn search_error(e: SearchError) -> ParallelError {
    ParallelError::Search(e.to_string())
}

#[cfg(test)]
mod tests {
    use super::factors;

    #[test]
    fn factors_largest_first() {
        assert_eq!(factors(4096), vec![2; 12]);
        assert_eq!(factors(12), vec![3, 2, 2]);
        assert_eq!(factors(7), vec![7]);
        assert!(factors(1).is_empty());
    }
}
