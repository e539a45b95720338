//! Resharding chains MLIR 22's `shard-partition` can do one step at a time.
//!
//! `shard-partition` reshards a value between two chained `shard.shard` annotations with
//! one of four single-step patterns (`reshard` in `Shard/Transforms/Partition.cpp`), tried
//! in this order, each on the first tensor dimension (pair) that matches:
//!
//! - equal split axes (or both replicated): nothing;
//! - halo sizes only (not used by shardc's plans);
//! - *move last split axis*: the last grid axis of dimension `i` appended to dimension `j`
//!   (`[[0]]` -> `[[], [0]]`), an `all_to_all` on that grid axis; it is detected when the
//!   two last axes are equal and the rest of `i`'s axes equals the rest of `j`'s target axes;
//! - *split last axis*: one grid axis appended to one dimension (`[[0]]` -> `[[0, 1]]`), an
//!   `all_slice`;
//! - *unsplit last axis*: the last grid axis of one dimension removed (`[[0, 1]]` ->
//!   `[[0]]`), an `all_gather`.
//!
//! Anything else (`[[0, 1]]` -> `[[0], [1]]`, `[[0], [1]]` -> `[]`) is not one step: MLIR's
//! release build then applies the first pattern that half-matches (its assertion that the
//! result is the target is compiled out) and produces invalid IR, a wrong shape or a crash.
//! [`chain`] finds the shortest chain of shardings between two, each step one that
//! [`mlir_step`] (a model of MLIR's choice) takes exactly to the next; the export writes
//! one `shard.shard` per step, so that MLIR still picks the collective of every step.

use std::collections::{BTreeMap, VecDeque};

/// A sharding's split axes: for every tensor dimension, the grid axes splitting it.
pub type SplitAxes = Vec<Vec<usize>>;

/// `a` padded with empty lists to `rank` dimensions (MLIR ignores trailing empty lists).
fn padded(a: &[Vec<usize>], rank: usize) -> SplitAxes {
    let mut out: SplitAxes = a.to_vec();
    while out.len() < rank {
        out.push(Vec::new());
    }
    out
}

/// Whether two split axes are the same sharding (trailing empty lists ignored).
pub fn same(a: &[Vec<usize>], b: &[Vec<usize>]) -> bool {
    let n = a.len().max(b.len());
    padded(a, n) == padded(b, n)
}

/// The sharding MLIR 22's `shard-partition` actually produces when asked to reshard `src`
/// to `tgt` in one step (see the module doc); `None` when no pattern applies.
pub fn mlir_step(src: &[Vec<usize>], tgt: &[Vec<usize>]) -> Option<SplitAxes> {
    let n = src.len().max(tgt.len());
    let (s, t) = (padded(src, n), padded(tgt, n));
    if s == t || (s.iter().all(Vec::is_empty) && t.iter().all(Vec::is_empty)) {
        return Some(s);
    }
    // Move the last split axis (all_to_all).
    for i in 0..n {
        for j in 0..n {
            if i == j {
                continue;
            }
            let (Some(a), Some(b)) = (s[i].last(), t[j].last()) else {
                continue;
            };
            if a != b || s[i][..s[i].len() - 1] != t[j][..t[j].len() - 1] {
                continue;
            }
            let mut out = s.clone();
            let axis = *a;
            out[i].pop();
            out[j].push(axis);
            return Some(out);
        }
    }
    // Split the last axis (all_slice).
    for d in 0..n {
        if s[d].len() + 1 == t[d].len() && s[d][..] == t[d][..s[d].len()] {
            let mut out = s.clone();
            out[d].push(t[d][s[d].len()]);
            return Some(out);
        }
    }
    // Unsplit the last axis (all_gather).
    for d in 0..n {
        if s[d].len() == t[d].len() + 1 && s[d][..t[d].len()] == t[d][..] {
            let mut out = s.clone();
            out[d].pop();
            return Some(out);
        }
    }
    None
}

/// The shardings one elementary change away from `s` on a grid of `grid_rank` axes:
/// a last axis moved to another dimension, an unused axis appended, a last axis removed.
fn neighbours(s: &SplitAxes, grid_rank: usize) -> Vec<SplitAxes> {
    let n = s.len();
    let mut out = Vec::new();
    for i in 0..n {
        if let Some(&a) = s[i].last() {
            for j in (0..n).filter(|&j| j != i) {
                let mut x = s.clone();
                x[i].pop();
                x[j].push(a);
                out.push(x);
            }
        }
    }
    let used: Vec<usize> = s.iter().flatten().copied().collect();
    for d in 0..n {
        if !s[d].is_empty() {
            let mut x = s.clone();
            x[d].pop();
            out.push(x);
        }
    }
    for d in 0..n {
        for a in (0..grid_rank).filter(|a| !used.contains(a)) {
            let mut x = s.clone();
            x[d].push(a);
            out.push(x);
        }
    }
    out
}

/// The intermediate shardings (neither `src` nor `tgt`) of the shortest chain from `src` to
/// `tgt` of a value of `rank` dimensions on a grid of `grid_rank` axes whose every step
/// MLIR 22 takes exactly ([`mlir_step`]); empty when one step does; `None` when no chain
/// exists.
pub fn chain(
    src: &[Vec<usize>],
    tgt: &[Vec<usize>],
    rank: usize,
    grid_rank: usize,
) -> Option<Vec<SplitAxes>> {
    let n = rank.max(src.len()).max(tgt.len());
    let (s, t) = (padded(src, n), padded(tgt, n));
    if mlir_step(&s, &t).is_some_and(|x| x == t) {
        return Some(Vec::new());
    }
    let mut prev: BTreeMap<SplitAxes, SplitAxes> = BTreeMap::new();
    let mut queue = VecDeque::from([s.clone()]);
    prev.insert(s.clone(), s.clone());
    while let Some(x) = queue.pop_front() {
        if x == t {
            let mut path = Vec::new();
            let mut cur = prev.get(&t)?.clone();
            while cur != s {
                path.push(cur.clone());
                cur = prev.get(&cur)?.clone();
            }
            path.reverse();
            return Some(path);
        }
        for y in neighbours(&x, grid_rank) {
            if prev.contains_key(&y) || mlir_step(&x, &y).as_ref() != Some(&y) {
                continue;
            }
            prev.insert(y.clone(), x.clone());
            queue.push_back(y);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mlir_takes_one_step_patterns_exactly() {
        assert_eq!(
            mlir_step(&[vec![0]], &[vec![], vec![0]]),
            Some(vec![vec![], vec![0]])
        );
        assert_eq!(mlir_step(&[vec![0]], &[vec![0, 1]]), Some(vec![vec![0, 1]]));
        assert_eq!(mlir_step(&[vec![0, 1]], &[vec![0]]), Some(vec![vec![0]]));
        // Two steps: MLIR half-matches and lands elsewhere.
        let got = mlir_step(&[vec![0, 1]], &[vec![0], vec![1]]);
        assert_ne!(got, Some(vec![vec![0], vec![1]]));
        let got = mlir_step(&[vec![0], vec![1]], &[]);
        assert_eq!(got, Some(vec![vec![], vec![1]]));
    }

    #[test]
    fn chains_decompose_two_step_reshardings() {
        assert_eq!(
            chain(&[vec![0, 1]], &[vec![0], vec![1]], 2, 2),
            Some(vec![vec![vec![0], vec![]]])
        );
        assert_eq!(
            chain(&[vec![0], vec![1]], &[vec![], vec![]], 2, 2),
            Some(vec![vec![vec![], vec![1]]])
        );
        assert_eq!(chain(&[vec![0]], &[vec![], vec![0]], 2, 2), Some(vec![]));
        assert_eq!(chain(&[vec![0]], &[vec![0]], 2, 2), Some(vec![]));
        // Every step of a chain is one MLIR takes exactly.
        let (s, t) = (vec![vec![0, 1], vec![2]], vec![vec![2, 1], vec![0]]);
        let c = chain(&s, &t, 2, 3).unwrap();
        let mut cur = s.clone();
        for x in c.iter().chain([&t]) {
            assert_eq!(mlir_step(&cur, x).as_ref(), Some(x), "{cur:?} -> {x:?}");
            cur = x.clone();
        }
    }
}
