//! Redistribution: the cheapest sequence of collectives and local slices that turns a value
//! laid out one way into the layout a consumer needs.
//!
//! Both layouts are first written over **prime device axes** ([`Canon`]): every device-matrix
//! axis is factored into primes (ascending), so that `[2, 4]` and `[4, 2]` over 8 devices are
//! both the axes `(2, 2, 2)` with ranks numbered row-major, and a tensor dimension is split by
//! a list of prime axes, major first. Over a common set of prime axes the plan is, in order:
//!
//! 1. complete partial values: a partial axis that the target splits dimension 0 by next
//!    becomes a **ReduceScatter** (MindSpore's scatters dimension 0); the other partial axes
//!    one **AllReduce** (followed by a slice where the target splits another dimension by it);
//! 2. local **slices** for every split the target adds on an axis the value does not use;
//! 3. axes that move from one dimension to another: **AllToAll** when enabled, else an
//!    AllGather followed by a slice;
//! 4. **AllGather** for the splits the target drops, minor axis first.
//!
//! A slice of a block one already holds needs no communication, so slicing before gathering
//! keeps the bytes down. When the two layouts' prime axes differ in order (a device count with
//! several prime factors, arranged differently), the value is gathered whole over its own
//! axes and then sliced by the target's.
//!
//! Costs are bytes each rank sends (ring algorithms): AllReduce `2(p-1)/p B`, AllGather
//! `(p-1)/p B_out`, ReduceScatter and AllToAll `(p-1)/p B`, slices free, plus a fixed latency
//! per collective so that fewer collectives win ties.

use shardc_ir::{ReduceOp, TensorLayout};

/// A layout over prime device axes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Canon {
    /// The prime axes, major first; their product is the device count.
    pub primes: Vec<usize>,
    /// Per tensor dimension: the prime axes splitting it, major first.
    pub dims: Vec<Vec<usize>>,
    /// Prime axes over which the value is partial.
    pub partial: Vec<usize>,
    /// How the partial terms combine.
    pub op: ReduceOp,
    /// The logical shape.
    pub shape: Vec<usize>,
}

/// Where a value's blocks live, whatever the layout's spelling: its prime axes, the axes
/// splitting each dimension and the partial axes. Two layouts of one value with the same
/// placement need no conversion between them, and a value converted once to a placement
/// serves every reader that needs it there.
pub type Placement = (Vec<usize>, Vec<Vec<usize>>, Vec<usize>);

/// The [`Placement`] of `l`.
pub fn placement(l: &TensorLayout) -> Placement {
    let c = Canon::of(l);
    (c.primes, c.dims, c.partial)
}

/// The prime factors of `n`, smallest first.
pub fn factor(mut n: usize) -> Vec<usize> {
    let mut f = Vec::new();
    let mut p = 2;
    while p * p <= n {
        while n % p == 0 {
            f.push(p);
            n /= p;
        }
        p += 1;
    }
    if n > 1 {
        f.push(n);
    }
    f
}

impl Canon {
    /// The prime-axis form of `l`.
    pub fn of(l: &TensorLayout) -> Canon {
        let m = l.dev_matrix.len();
        let mut primes = Vec::new();
        let mut axes_of = Vec::with_capacity(m); // per dev axis (major first)
        for &n in &l.dev_matrix {
            let f = factor(n);
            let start = primes.len();
            primes.extend(&f);
            axes_of.push((start..primes.len()).collect::<Vec<_>>());
        }
        let of_axis = |k: usize| -> Vec<usize> {
            if k < m {
                axes_of[m - 1 - k].clone()
            } else {
                Vec::new()
            }
        };
        let dims = l
            .tensor_map
            .iter()
            .map(|&k| {
                if k < 0 {
                    Vec::new()
                } else {
                    of_axis(k as usize)
                }
            })
            .collect();
        let mut partial: Vec<usize> = l.partial.iter().flat_map(|&k| of_axis(k)).collect();
        partial.sort_unstable();
        Canon {
            primes,
            dims,
            partial,
            op: l.partial_op,
            shape: l.tensor_shape.clone(),
        }
    }

    /// The number of devices.
    pub fn device_num(&self) -> usize {
        self.primes.iter().product()
    }

    /// The local shape in this state.
    pub fn local_shape(&self) -> Vec<usize> {
        self.shape
            .iter()
            .zip(&self.dims)
            .map(|(&n, ax)| n / ax.iter().map(|&a| self.primes[a]).product::<usize>())
            .collect()
    }

    /// Whether two canonical layouts place the same data on every rank.
    pub fn same_placement(&self, other: &Canon) -> bool {
        self.primes == other.primes
            && self.dims == other.dims
            && self.partial == other.partial
            && (self.partial.is_empty() || self.op == other.op)
    }
}

/// One step of a redistribution, over the prime axes of [`Plan::spaces`]`[space]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Complete partial terms over `axes` with `op`.
    AllReduce {
        /// Which prime-axis space.
        space: usize,
        /// The axes of the group.
        axes: Vec<usize>,
        /// The reduction.
        op: ReduceOp,
    },
    /// Reduce partial terms over `axes` and keep one's own block along `dim`.
    ReduceScatter {
        /// Which prime-axis space.
        space: usize,
        /// The dimension split.
        dim: usize,
        /// The axes of the group (the new split of `dim`, major first).
        axes: Vec<usize>,
        /// The reduction.
        op: ReduceOp,
    },
    /// Concatenate the group's blocks along `dim`.
    AllGather {
        /// Which prime-axis space.
        space: usize,
        /// The dimension.
        dim: usize,
        /// The axes of the group, major first (the minor end of `dim`'s split).
        axes: Vec<usize>,
    },
    /// Keep one's own block along `dim` by one's coordinates on `axes` (no communication).
    Slice {
        /// Which prime-axis space.
        space: usize,
        /// The dimension.
        dim: usize,
        /// The axes, major first (appended to `dim`'s split).
        axes: Vec<usize>,
    },
    /// Move the split on `axes` from `concat_dim` (gathered) to `split_dim` (sliced).
    AllToAll {
        /// Which prime-axis space.
        space: usize,
        /// The dimension that becomes split.
        split_dim: usize,
        /// The dimension that becomes whole along `axes`.
        concat_dim: usize,
        /// The axes of the group.
        axes: Vec<usize>,
    },
}

/// A redistribution plan.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// The prime-axis spaces the steps refer to (one, or the source's then the target's).
    pub spaces: Vec<Vec<usize>>,
    /// The steps, in order.
    pub steps: Vec<Step>,
    /// Bytes each rank sends, plus latency terms.
    pub cost: f64,
    /// The local shape after each step.
    pub shapes: Vec<Vec<usize>>,
}

/// Latency of one collective, in equivalent bytes.
pub const COLLECTIVE_LATENCY_BYTES: f64 = 4096.0;

/// Whether the two layouts need nothing between them.
pub fn is_noop(from: &TensorLayout, to: &TensorLayout) -> bool {
    Canon::of(from).same_placement(&Canon::of(to))
}

fn group_size(primes: &[usize], axes: &[usize]) -> usize {
    axes.iter().map(|&a| primes[a]).product()
}

struct Builder<'a> {
    primes: &'a [usize],
    space: usize,
    state: Canon,
    steps: Vec<Step>,
    shapes: Vec<Vec<usize>>,
    cost: f64,
    elem_bytes: f64,
}

impl Builder<'_> {
    fn bytes(&self) -> f64 {
        self.state.local_shape().iter().product::<usize>() as f64 * self.elem_bytes
    }

    fn push(&mut self, step: Step, comm_bytes: f64) {
        if !matches!(step, Step::Slice { .. }) {
            self.cost += comm_bytes + COLLECTIVE_LATENCY_BYTES;
        }
        self.steps.push(step);
        self.shapes.push(self.state.local_shape());
    }

    fn all_reduce(&mut self, axes: Vec<usize>) {
        if axes.is_empty() {
            return;
        }
        let p = group_size(self.primes, &axes) as f64;
        let b = self.bytes();
        self.state.partial.retain(|a| !axes.contains(a));
        let op = self.state.op;
        self.push(
            Step::AllReduce {
                space: self.space,
                axes,
                op,
            },
            2.0 * (p - 1.0) / p * b,
        );
    }

    fn reduce_scatter(&mut self, dim: usize, axes: Vec<usize>) {
        let p = group_size(self.primes, &axes) as f64;
        let b = self.bytes();
        self.state.partial.retain(|a| !axes.contains(a));
        self.state.dims[dim].extend(&axes);
        let op = self.state.op;
        self.push(
            Step::ReduceScatter {
                space: self.space,
                dim,
                axes,
                op,
            },
            (p - 1.0) / p * b,
        );
    }

    fn slice(&mut self, dim: usize, axes: Vec<usize>) {
        self.state.dims[dim].extend(&axes);
        self.push(
            Step::Slice {
                space: self.space,
                dim,
                axes,
            },
            0.0,
        );
    }

    fn gather(&mut self, dim: usize, n: usize) {
        let len = self.state.dims[dim].len();
        let axes: Vec<usize> = self.state.dims[dim].split_off(len - n);
        let p = group_size(self.primes, &axes) as f64;
        let b_out = self.bytes();
        self.push(
            Step::AllGather {
                space: self.space,
                dim,
                axes,
            },
            (p - 1.0) / p * b_out,
        );
    }

    fn all_to_all(&mut self, concat_dim: usize, split_dim: usize, axes: Vec<usize>) {
        let b = self.bytes();
        let p = group_size(self.primes, &axes) as f64;
        let len = self.state.dims[concat_dim].len();
        self.state.dims[concat_dim].truncate(len - axes.len());
        self.state.dims[split_dim].extend(&axes);
        self.push(
            Step::AllToAll {
                space: self.space,
                split_dim,
                concat_dim,
                axes,
            },
            (p - 1.0) / p * b,
        );
    }
}

/// Plans the conversion of a value from layout `from` to layout `to` (same logical shape).
/// `to` may not be partial. `elem_bytes` sizes the cost.
pub fn plan(
    from: &TensorLayout,
    to: &TensorLayout,
    elem_bytes: usize,
    enable_alltoall: bool,
) -> Plan {
    let src = Canon::of(from);
    let dst = Canon::of(to);
    let eb = elem_bytes as f64;
    if src.primes != dst.primes {
        // Gather whole over the source's axes, then slice by the target's.
        let mut b = Builder {
            primes: &src.primes,
            space: 0,
            state: src.clone(),
            steps: Vec::new(),
            shapes: Vec::new(),
            cost: 0.0,
            elem_bytes: eb,
        };
        let partial = b.state.partial.clone();
        b.all_reduce(partial);
        for d in 0..b.state.dims.len() {
            while !b.state.dims[d].is_empty() {
                b.gather(d, 1);
            }
        }
        let (steps0, shapes0, cost0) = (b.steps, b.shapes, b.cost);
        let mut whole = dst.clone();
        whole.dims.iter_mut().for_each(Vec::clear);
        whole.partial.clear();
        let mut b2 = Builder {
            primes: &dst.primes,
            space: 1,
            state: whole,
            steps: steps0,
            shapes: shapes0,
            cost: cost0,
            elem_bytes: eb,
        };
        for d in 0..dst.dims.len() {
            if !dst.dims[d].is_empty() {
                b2.slice(d, dst.dims[d].clone());
            }
        }
        return Plan {
            spaces: vec![src.primes.clone(), dst.primes.clone()],
            steps: b2.steps,
            cost: b2.cost,
            shapes: b2.shapes,
        };
    }
    let primes = src.primes.clone();
    let mut b = Builder {
        primes: &primes,
        space: 0,
        state: src.clone(),
        steps: Vec::new(),
        shapes: Vec::new(),
        cost: 0.0,
        elem_bytes: eb,
    };
    let ndims = dst.dims.len();
    // Common prefix per dimension: kept; the rest of the source is gathered, the rest of the
    // target sliced.
    let prefix: Vec<usize> = (0..ndims)
        .map(|d| {
            src.dims[d]
                .iter()
                .zip(&dst.dims[d])
                .take_while(|(a, b)| a == b)
                .count()
        })
        .collect();
    let mut to_gather: Vec<usize> = (0..ndims).map(|d| src.dims[d].len() - prefix[d]).collect();
    let mut to_slice: Vec<Vec<usize>> = (0..ndims)
        .map(|d| dst.dims[d][prefix[d]..].to_vec())
        .collect();

    // 1. Partial axes: a ReduceScatter where the target splits a dimension by that axis next
    //    (and the dimension has nothing left to gather), the rest one AllReduce.
    if !b.state.partial.is_empty() {
        let mut rest = Vec::new();
        let partial = b.state.partial.clone();
        let mut rs: Vec<(usize, Vec<usize>)> = Vec::new();
        for a in partial {
            // ReduceScatter splits dimension 0 (MindSpore's op); elsewhere the AllReduce and a
            // slice are kept.
            let target = (0..ndims)
                .find(|&d| d == 0 && to_gather[d] == 0 && to_slice[d].first() == Some(&a));
            match target {
                Some(d) => {
                    to_slice[d].remove(0);
                    match rs.iter_mut().find(|(dd, _)| *dd == d) {
                        Some((_, axes)) => axes.push(a),
                        None => rs.push((d, vec![a])),
                    }
                }
                None => rest.push(a),
            }
        }
        // Axes taken for one dimension must be taken in the target's order.
        for (d, axes) in rs {
            b.reduce_scatter(d, axes);
        }
        b.all_reduce(rest);
    }
    let in_use = |state: &Canon, a: usize| state.dims.iter().any(|ax| ax.contains(&a));
    loop {
        let mut progressed = false;
        // 2. Slices on free axes.
        for d in 0..ndims {
            if to_gather[d] > 0 {
                continue;
            }
            let mut take = Vec::new();
            while let Some(&a) = to_slice[d].first() {
                if in_use(&b.state, a) || take.contains(&a) {
                    break;
                }
                take.push(a);
                to_slice[d].remove(0);
            }
            if !take.is_empty() {
                b.slice(d, take);
                progressed = true;
            }
        }
        // 3./4. Gathers (or all-to-alls), minor axis first.
        for d in 0..ndims {
            if to_gather[d] == 0 {
                continue;
            }
            let len = b.state.dims[d].len();
            let rest: Vec<usize> = b.state.dims[d][len - to_gather[d]..].to_vec();
            let ascending = rest.windows(2).all(|w| w[0] < w[1]);
            // The whole remaining split of `d` moves to `e` in the same order: one AllToAll.
            let dest =
                (0..ndims).find(|&e| e != d && to_gather[e] == 0 && to_slice[e].starts_with(&rest));
            match dest {
                Some(e) if enable_alltoall && ascending => {
                    b.all_to_all(d, e, rest.clone());
                    to_gather[d] = 0;
                    to_slice[e].drain(..rest.len());
                }
                _ => {
                    // Gather as many trailing axes as form one ordered group.
                    let ax = &b.state.dims[d];
                    let mut n = 1;
                    while n < to_gather[d] && ax[ax.len() - n - 1] < ax[ax.len() - n] {
                        n += 1;
                    }
                    b.gather(d, n);
                    to_gather[d] -= n;
                }
            }
            progressed = true;
            break;
        }
        if !progressed {
            break;
        }
    }
    debug_assert!(to_gather.iter().all(|&n| n == 0));
    debug_assert!(to_slice.iter().all(Vec::is_empty), "{from} -> {to}");
    Plan {
        spaces: vec![primes.clone()],
        steps: b.steps,
        cost: b.cost,
        shapes: b.shapes,
    }
}

/// The coordinates of `rank` over the prime axes `primes` (row-major).
pub fn coords(primes: &[usize], rank: usize) -> Vec<usize> {
    let mut c = vec![0; primes.len()];
    let mut r = rank;
    for i in (0..primes.len()).rev() {
        c[i] = r % primes[i];
        r /= primes[i];
    }
    c
}

/// The ranks that share `rank`'s coordinates except on `axes`, ascending; and `rank`'s index
/// among them (its mixed-radix coordinate over `axes`, major first).
pub fn group(primes: &[usize], axes: &[usize], rank: usize) -> (Vec<usize>, usize) {
    let c = coords(primes, rank);
    let size: usize = axes.iter().map(|&a| primes[a]).product();
    let mut strides = vec![1usize; primes.len()];
    for i in (0..primes.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * primes[i + 1];
    }
    let base: usize = c
        .iter()
        .enumerate()
        .filter(|(i, _)| !axes.contains(i))
        .map(|(i, &x)| x * strides[i])
        .sum();
    let mut ranks = Vec::with_capacity(size);
    for k in 0..size {
        // Mixed-radix digits of k over axes (major first).
        let mut rem = k;
        let mut r = base;
        for &a in axes.iter().rev() {
            r += (rem % primes[a]) * strides[a];
            rem /= primes[a];
        }
        ranks.push(r);
    }
    let mut own = 0;
    for &a in axes {
        own = own * primes[a] + c[a];
    }
    let mut sorted = ranks.clone();
    sorted.sort_unstable();
    // With axes ascending, `ranks` is already sorted and `own` is the position in it.
    debug_assert!(sorted == ranks || axes.windows(2).any(|w| w[0] > w[1]));
    (ranks, own)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lay(dev: &[usize], map: &[i64], shape: &[usize], partial: &[usize]) -> TensorLayout {
        TensorLayout {
            dev_matrix: dev.to_vec(),
            tensor_map: map.to_vec(),
            tensor_shape: shape.to_vec(),
            partial: partial.to_vec(),
            partial_op: ReduceOp::Sum,
        }
    }

    #[test]
    fn tutorial_matmul_to_relu_is_allreduce_then_slice() {
        // matmul out: dev [2,4,1], map [2, 0], partial over axis 1 (the k axis).
        let from = lay(&[2, 4, 1], &[2, 0], &[16, 16], &[1]);
        // relu (2, 4): dev [2, 4], map [1, 0].
        let to = lay(&[2, 4], &[1, 0], &[16, 16], &[]);
        let p = plan(&from, &to, 4, false);
        assert_eq!(p.steps.len(), 2, "{:?}", p.steps);
        assert!(matches!(p.steps[0], Step::AllReduce { .. }));
        assert!(matches!(p.steps[1], Step::Slice { dim: 1, .. }));
        assert_eq!(p.shapes.last().unwrap(), &vec![8, 4]);
    }

    #[test]
    fn partial_to_row_split_is_a_reduce_scatter() {
        // partial over the 4-axis, rows split 2 -> rows split 8.
        let from = lay(&[2, 4, 1], &[2, 0], &[16, 16], &[1]);
        let to = lay(&[8, 1], &[1, 0], &[16, 16], &[]);
        let p = plan(&from, &to, 4, false);
        assert_eq!(p.steps.len(), 1, "{:?}", p.steps);
        assert!(matches!(p.steps[0], Step::ReduceScatter { dim: 0, .. }));
        assert_eq!(p.shapes.last().unwrap(), &vec![2, 16]);
    }

    #[test]
    fn gather_then_slice_and_alltoall() {
        // rows split 8 -> columns split 8
        let from = lay(&[8], &[0, -1], &[16, 16], &[]);
        let to = lay(&[8], &[-1, 0], &[16, 16], &[]);
        let p = plan(&from, &to, 4, false);
        assert!(p.steps.iter().any(|s| matches!(s, Step::AllGather { .. })));
        assert_eq!(p.shapes.last().unwrap(), &vec![16, 2]);
        let q = plan(&from, &to, 4, true);
        assert!(
            q.steps.iter().all(|s| matches!(s, Step::AllToAll { .. })),
            "{:?}",
            q.steps
        );
        assert_eq!(q.shapes.last().unwrap(), &vec![16, 2]);
        assert!(q.cost < p.cost);
    }

    #[test]
    fn same_placement_under_different_matrices_is_free() {
        let a = lay(&[2, 4, 1], &[2, 1], &[16, 32], &[]);
        let b = lay(&[8], &[0, -1], &[16, 32], &[]);
        // a splits dim 0 by 2 and dim 1 by 4; b splits dim 0 by 8: different.
        assert!(!is_noop(&a, &b));
        let c = lay(&[2, 4], &[1, 0], &[16, 32], &[]);
        assert!(is_noop(&a, &c));
        assert!(plan(&a, &c, 4, false).steps.is_empty());
    }

    #[test]
    fn groups_are_row_major() {
        let primes = vec![2, 2, 2];
        assert_eq!(group(&primes, &[1, 2], 0), (vec![0, 1, 2, 3], 0));
        assert_eq!(group(&primes, &[1, 2], 6), (vec![4, 5, 6, 7], 2));
        assert_eq!(group(&primes, &[0], 5), (vec![1, 5], 1));
    }
}
