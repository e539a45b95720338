//! `ilp`: the exact minimum of the cost graph as an integer program, in the style of Alpa's
//! intra-operator pass, solved by good_lp over microlp (pure Rust, branch and bound).
//!
//! Variables and constraints:
//! - `s[v][i]` binary, one per candidate of every node with more than one; `Σ_i s[v][i] = 1`;
//! - per edge between two such nodes, `e[k][i][j]` in `[0, 1]` with the marginal constraints
//!   `Σ_j e[k][i][j] = s[a][i]` and `Σ_i e[k][i][j] = s[b][j]`. With `s` one-hot, every row but
//!   the chosen one and every column but the chosen one sum to zero, so `e` is exactly the
//!   product `s[a] ⊗ s[b]`: no integrality is needed on `e`, and the linear relaxation is
//!   integral on trees, which keeps branch and bound small;
//! - objective `Σ unary · s + Σ cost · e`; memory `Σ memory · s ≤ limit`.
//!
//! Before the program is built, edges joining the same pair are summed, and an edge with an
//! end that has a single candidate becomes a unary cost of the other end (both exact).
//! The program grows with `Σ_edges |a| · |b|`: beyond [`MAX_VARIABLES`] the searcher refuses,
//! naming the size and the searchers for large graphs. It is the optimality oracle for small
//! graphs (tens of ops at 4 to 8 devices solve in well under a second here).

use super::cost_graph::{check_memory_feasible, CostGraph, SearchError, SearchResult};
use good_lp::{microlp, variable, Expression, ProblemVariables, Solution, SolverModel, Variable};
use std::collections::BTreeMap;

/// The largest program the searcher builds (variables).
pub const MAX_VARIABLES: usize = 200_000;

/// Searches `cg` exactly within `memory_limit` bytes per device.
pub fn search(cg: &CostGraph, memory_limit: Option<f64>) -> Result<SearchResult, SearchError> {
    cg.validate()?;
    check_memory_feasible(cg, memory_limit)?;
    let n = cg.nodes.len();
    let sizes: Vec<usize> = cg.nodes.iter().map(|x| x.len()).collect();
    let mut unary: Vec<Vec<f64>> = cg.nodes.iter().map(|x| x.unary.clone()).collect();
    // Merge edges per pair, oriented lo -> hi; fold edges with a single-candidate end.
    let mut pairs: BTreeMap<(usize, usize), Vec<f64>> = BTreeMap::new();
    for e in &cg.edges {
        let (a, b) = (e.a, e.b);
        let nb = sizes[b];
        let (lo, hi) = (a.min(b), a.max(b));
        let at = |cl: usize, ch: usize| {
            let (ca, cb) = if a == lo { (cl, ch) } else { (ch, cl) };
            e.cost[ca * nb + cb]
        };
        match (sizes[lo], sizes[hi]) {
            // A constant: the same for every choice.
            (1, 1) => {}
            (1, _) => {
                for (ch, u) in unary[hi].iter_mut().enumerate() {
                    *u += at(0, ch);
                }
            }
            (_, 1) => {
                for (cl, u) in unary[lo].iter_mut().enumerate() {
                    *u += at(cl, 0);
                }
            }
            (nl, nh) => {
                let m = pairs.entry((lo, hi)).or_insert_with(|| vec![0.0; nl * nh]);
                for cl in 0..nl {
                    for ch in 0..nh {
                        m[cl * nh + ch] += at(cl, ch);
                    }
                }
            }
        }
    }
    let variables: usize = sizes.iter().filter(|&&k| k > 1).sum::<usize>()
        + pairs
            .keys()
            .map(|&(a, b)| sizes[a] * sizes[b])
            .sum::<usize>();
    if variables > MAX_VARIABLES {
        return Err(SearchError::Solver {
            searcher: "ilp",
            reason: format!(
                "the integer program would have {variables} variables (over {MAX_VARIABLES}): \
                 ilp is the optimality oracle for small graphs; use dynamic_programming or \
                 recursive_programming for {n} ops"
            ),
        });
    }
    let mut vars = ProblemVariables::new();
    let s: Vec<Vec<Option<Variable>>> = sizes
        .iter()
        .map(|&k| {
            (0..k)
                .map(|_| (k > 1).then(|| vars.add(variable().binary())))
                .collect()
        })
        .collect();
    let e: Vec<((usize, usize), Vec<Variable>)> = pairs
        .keys()
        .map(|&(a, b)| {
            let m = (0..sizes[a] * sizes[b])
                .map(|_| vars.add(variable().min(0.0).max(1.0)))
                .collect();
            ((a, b), m)
        })
        .collect();
    let mut objective = Expression::with_capacity(variables);
    for v in 0..n {
        for (c, x) in s[v].iter().enumerate() {
            if let Some(x) = x {
                objective.add_mul(unary[v][c], *x);
            }
        }
    }
    for ((pair, m), xs) in pairs.iter().zip(&e) {
        for (c, x) in m.iter().zip(&xs.1) {
            if *c != 0.0 {
                objective.add_mul(*c, *x);
            }
        }
        debug_assert_eq!(*pair, xs.0);
    }
    let mut model = vars.minimise(objective).using(microlp);
    for sv in &s {
        if sv.len() > 1 {
            let sum: Expression = sv.iter().flatten().map(|&x| Expression::from(x)).sum();
            model = model.with(good_lp::constraint::eq(sum, 1.0));
        }
    }
    for ((a, b), xs) in &e {
        let (na, nb) = (sizes[*a], sizes[*b]);
        let (sa, sb) = (&s[*a], &s[*b]);
        for i in 0..na {
            let row: Expression = (0..nb).map(|j| Expression::from(xs[i * nb + j])).sum();
            let Some(si) = sa[i] else { continue };
            model = model.with(good_lp::constraint::eq(row, si));
        }
        for j in 0..nb {
            let col: Expression = (0..na).map(|i| Expression::from(xs[i * nb + j])).sum();
            let Some(sj) = sb[j] else { continue };
            model = model.with(good_lp::constraint::eq(col, sj));
        }
    }
    if let Some(limit) = memory_limit {
        let mut mem = Expression::default();
        let mut fixed = 0.0;
        for (v, sv) in s.iter().enumerate() {
            match sv.as_slice() {
                [None] => fixed += cg.nodes[v].memory[0],
                _ => {
                    for (c, x) in sv.iter().enumerate() {
                        if let Some(x) = x {
                            mem.add_mul(cg.nodes[v].memory[c], *x);
                        }
                    }
                }
            }
        }
        model = model.with(good_lp::constraint::leq(mem, limit - fixed));
    }
    let solution = model.solve().map_err(|err| SearchError::Solver {
        searcher: "ilp",
        reason: format!("microlp: {err}"),
    })?;
    let choice: Vec<usize> = s
        .iter()
        .map(|sv| {
            let mut best = (f64::NEG_INFINITY, 0);
            for (c, x) in sv.iter().enumerate() {
                let val = x.map_or(1.0, |x| solution.value(x));
                if val > best.0 + 1e-9 {
                    best = (val, c);
                }
            }
            best.1
        })
        .collect();
    let cost = cg.total(&choice);
    if memory_limit.is_some_and(|l| cg.memory(&choice) > l * (1.0 + 1e-9)) {
        return Err(SearchError::Solver {
            searcher: "ilp",
            reason: format!(
                "the solver's choice needs {:.0} bytes, over the limit (a numerical failure)",
                cg.memory(&choice)
            ),
        });
    }
    Ok(SearchResult {
        choice,
        cost,
        exact: true,
        notes: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::super::cost_graph::testing::{random_graph, Rng};
    use super::super::cost_graph::{brute_force, least_memory_choice, SearchEdge, SearchNode};
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-7 * a.abs().max(b.abs()).max(1.0)
    }

    #[test]
    fn equals_brute_force_with_and_without_a_memory_limit() {
        let mut rng = Rng(11);
        for case in 0..300 {
            let n = 1 + rng.below(8);
            let extra = rng.below(5);
            let cg = random_graph(&mut rng, n, 4, extra);
            let r = search(&cg, None).unwrap();
            let opt = brute_force(&cg, None).unwrap();
            assert!(
                close(r.cost, opt.cost),
                "case {case}: {} vs {}",
                r.cost,
                opt.cost
            );
            let least = cg.memory(&least_memory_choice(&cg));
            let median = 0.5 * (least + cg.memory(&opt.choice));
            let limited = search(&cg, Some(median));
            match brute_force(&cg, Some(median)) {
                Some(o) => {
                    let r = limited.unwrap();
                    assert!(
                        close(r.cost, o.cost),
                        "case {case}: {} vs {}",
                        r.cost,
                        o.cost
                    );
                    assert!(cg.memory(&r.choice) <= median + 1e-9);
                }
                None => assert!(limited.is_err(), "case {case}"),
            }
        }
    }

    #[test]
    fn a_binding_memory_limit_forces_the_costlier_choice() {
        let cg = CostGraph {
            nodes: vec![
                SearchNode {
                    name: "big".into(),
                    unary: vec![1.0, 5.0],
                    memory: vec![100.0, 10.0],
                },
                SearchNode {
                    name: "b".into(),
                    unary: vec![1.0, 1.0],
                    memory: vec![1.0, 1.0],
                },
            ],
            edges: vec![SearchEdge {
                a: 0,
                b: 1,
                cost: vec![0.0, 1.0, 1.0, 0.0],
            }],
        };
        assert_eq!(search(&cg, None).unwrap().choice[0], 0);
        let r = search(&cg, Some(50.0)).unwrap();
        assert_eq!(r.choice[0], 1);
        assert!(close(r.cost, 6.0));
        let e = search(&cg, Some(5.0)).unwrap_err();
        assert!(e.to_string().contains("missing"), "{e}");
    }

    #[test]
    fn deterministic_and_fast_enough_for_thirty_ops() {
        let mut rng = Rng(3);
        let cg = random_graph(&mut rng, 30, 8, 10);
        let t = std::time::Instant::now();
        let a = search(&cg, None).unwrap();
        eprintln!(
            "ilp: 30 nodes x up to 8 candidates, {} edges: {:.3} s",
            cg.edges.len(),
            t.elapsed().as_secs_f64()
        );
        let b = search(&cg, None).unwrap();
        assert_eq!(a.choice, b.choice);
        assert!(a.exact);
    }
}
