//! Redistribution: the cheapest sequence of collectives and local slices that turns a value
//! laid out one way into the layout a consumer needs.
//!
//! Both layouts are first written over **prime device axes** ([`Canon`]): every device-matrix
//! axis is factored into primes (ascending), so that `[2, 4]` and `[4, 2]` over 8 devices are
//! both the axes `(2, 2, 2)` with ranks numbered row-major, and a tensor dimension is split by
//! a list of prime axes, major first. Over a common set of prime axes the plan is, in order:
//!
//! 1. complete partial values: a partial axis that the target splits a dimension by next
//!    becomes a **ReduceScatter** along that dimension (MindSpore's scatters dimension 0 only;
//!    shardc's takes an `axis`, so no transpose is needed); the other partial axes one
//!    **AllReduce** (followed by a slice where the target splits a dimension by it);
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
///
/// Over one prime-axis space the plan is the cheapest chain (a shortest-path search over
/// the states of the prime axes, each step a collective or a slice the runtime has, cut off
/// at the cost of the greedy order of the module documentation); the greedy plan is kept when
/// nothing cheaper exists, when the space is too large to search ([`SEARCH_STATES`]), and
/// between two different prime-axis spaces.
pub fn plan(
    from: &TensorLayout,
    to: &TensorLayout,
    elem_bytes: usize,
    enable_alltoall: bool,
) -> Plan {
    let greedy = greedy_plan(from, to, elem_bytes, enable_alltoall);
    // Nothing to do, or a slice alone (free): nothing is cheaper.
    if greedy.spaces.len() != 1
        || greedy.steps.is_empty()
        || (greedy.steps.len() == 1 && matches!(greedy.steps[0], Step::Slice { .. }))
    {
        return greedy;
    }
    let (src, dst) = (Canon::of(from), Canon::of(to));
    match search(&src, &dst, elem_bytes as f64, enable_alltoall, greedy.cost) {
        Some(p) if p.cost < greedy.cost - 1e-9 => p,
        _ => greedy,
    }
}

/// The shortest-path search gives up past this many states, or this many moves weighed (the
/// greedy plan is used then): a few milliseconds at most per pair of layouts.
pub const SEARCH_STATES: usize = 4_096;
/// See [`SEARCH_STATES`].
pub const SEARCH_MOVES: usize = 5_000;

/// The most prime axes and tensor dimensions a search handles (the greedy plan beyond).
const MAX_AXES: usize = 16;
const MAX_DIMS: usize = 8;

/// Where a prime axis is in a search state: `dim << 4 | position` for an axis splitting a
/// dimension, or one of these.
const PARTIAL: u8 = 0xE0;
const FREE: u8 = 0xF0;

/// A state of the search: per prime axis, where it is. Sixteen bytes, copied and hashed as
/// one number.
type Where = [u8; MAX_AXES];

/// One step of a move, allocation-free: the kind and its axes in order.
#[derive(Clone, Copy)]
struct Mv {
    /// 0 AllReduce, 1 ReduceScatter, 2 Slice, 3 AllGather, 4 AllToAll.
    kind: u8,
    /// The dimension (ReduceScatter, Slice, AllGather; AllToAll's split dimension).
    dim: u8,
    /// AllToAll's concatenated dimension.
    concat: u8,
    axes: [u8; MAX_AXES],
    n: u8,
}

impl Mv {
    fn new(kind: u8, dim: u8, concat: u8, axes: &[u8]) -> Mv {
        let mut a = [0u8; MAX_AXES];
        a[..axes.len()].copy_from_slice(axes);
        Mv {
            kind,
            dim,
            concat,
            axes: a,
            n: axes.len() as u8,
        }
    }

    fn step(&self, op: ReduceOp) -> Step {
        let axes: Vec<usize> = self.axes[..self.n as usize]
            .iter()
            .map(|&a| a as usize)
            .collect();
        let dim = self.dim as usize;
        match self.kind {
            0 => Step::AllReduce { space: 0, axes, op },
            1 => Step::ReduceScatter {
                space: 0,
                dim,
                axes,
                op,
            },
            2 => Step::Slice {
                space: 0,
                dim,
                axes,
            },
            3 => Step::AllGather {
                space: 0,
                dim,
                axes,
            },
            _ => Step::AllToAll {
                space: 0,
                split_dim: dim,
                concat_dim: self.concat as usize,
                axes,
            },
        }
    }
}

/// A move of the search: up to two parked slices and a step.
#[derive(Clone, Copy)]
struct Move {
    steps: [Mv; 3],
    n: u8,
}

/// The per-dimension axis lists of a state (stack arrays).
struct Dims {
    axes: [[u8; MAX_AXES]; MAX_DIMS],
    lens: [u8; MAX_DIMS],
}

impl Dims {
    fn of(w: &Where, naxes: usize) -> Dims {
        let mut d = Dims {
            axes: [[0; MAX_AXES]; MAX_DIMS],
            lens: [0; MAX_DIMS],
        };
        for (a, &x) in w.iter().enumerate().take(naxes) {
            if x < PARTIAL {
                let (dim, pos) = ((x >> 4) as usize, (x & 15) as usize);
                d.axes[dim][pos] = a as u8;
                d.lens[dim] = d.lens[dim].max(pos as u8 + 1);
            }
        }
        d
    }

    fn get(&self, dim: usize) -> &[u8] {
        &self.axes[dim][..self.lens[dim] as usize]
    }
}

fn key_of(w: &Where) -> u128 {
    u128::from_le_bytes(*w)
}

/// The cheapest chain from `src` to `dst` (same prime axes; `dst` not partial) under the
/// planner's pricing (bytes each rank sends on a ring plus [`COLLECTIVE_LATENCY_BYTES`] per
/// collective), if one costs less than `bound`; `None` otherwise or past [`SEARCH_STATES`]
/// states or [`SEARCH_MOVES`] moves.
/// What a dimension shares with the target as a leading run of axes stays; the moves, each
/// as the runtime runs it (several axes in one collective only in ascending order, as one
/// ordered group):
/// - **AllReduce** over a set of partial axes;
/// - **ReduceScatter** of partial axes that the target splits a dimension by next, along it,
///   or of other partial axes along any dimension (parked there until gathered);
/// - **Slice** by free axes the target splits a dimension by next (no communication), or by
///   one free axis (two in small spaces, [`PARK_TWO_AXES`]) along any dimension right before
///   a collective (parked: it moves less; parking for nothing never pays, so no state is a
///   parked slice alone);
/// - **AllGather** of a dimension's trailing axes beyond what it shares with the target;
/// - **AllToAll** (when enabled) moving such trailing axes to any other dimension.
fn search(src: &Canon, dst: &Canon, eb: f64, enable_alltoall: bool, bound: f64) -> Option<Plan> {
    use std::collections::{BinaryHeap, HashMap};
    let primes = &src.primes;
    let naxes = primes.len();
    let ndims = dst.dims.len();
    if naxes > MAX_AXES || ndims > MAX_DIMS {
        return None;
    }
    let place = |dims: &[Vec<usize>], partial: &[usize]| -> Where {
        let mut w = [FREE; MAX_AXES];
        for (d, axes) in dims.iter().enumerate() {
            for (k, &a) in axes.iter().enumerate() {
                w[a] = ((d as u8) << 4) | k as u8;
            }
        }
        for &a in partial {
            w[a] = PARTIAL;
        }
        w
    };
    let keep: Vec<usize> = (0..ndims)
        .map(|d| {
            src.dims[d]
                .iter()
                .zip(&dst.dims[d])
                .take_while(|(a, b)| a == b)
                .count()
        })
        .collect();
    let target: Vec<Vec<u8>> = dst
        .dims
        .iter()
        .map(|ax| ax.iter().map(|&a| a as u8).collect())
        .collect();
    let total: f64 = src.shape.iter().product::<usize>() as f64 * eb;
    let pr = |a: u8| primes[a as usize] as f64;
    let g = |axes: &[u8]| axes.iter().map(|&a| pr(a)).product::<f64>();
    let ascending = |axes: &[u8]| axes.windows(2).all(|w| w[0] < w[1]);
    // The moves out of `w` (its dims `ds`), into `out` as (state, move, cost).
    let moves = |w: &Where, ds: &Dims, out: &mut Vec<(Where, Mv, f64)>| {
        let split: f64 = (0..ndims).flat_map(|d| ds.get(d)).map(|&a| pr(a)).product();
        let sz = total / split;
        let next = |d: usize| -> Option<&[u8]> {
            let (cur, want) = (ds.get(d), &target[d]);
            (cur.len() <= want.len() && want[..cur.len()] == *cur).then(|| &want[cur.len()..])
        };
        let divides = |d: usize, extra: &[u8]| -> bool {
            let s: f64 = ds.get(d).iter().chain(extra).map(|&a| pr(a)).product();
            src.shape[d] % s as usize == 0
        };
        let mut partial = [0u8; MAX_AXES];
        let mut np = 0;
        for (a, _) in w
            .iter()
            .enumerate()
            .take(naxes)
            .filter(|(_, &x)| x == PARTIAL)
        {
            partial[np] = a as u8;
            np += 1;
        }
        let partial = &partial[..np];
        // Sets of partial axes as bit masks over `partial`: all while there are few, else the
        // whole and each one.
        let sets: Vec<u32> = if np <= 4 {
            (1..(1u32 << np)).collect()
        } else {
            std::iter::once((1u32 << np) - 1)
                .chain((0..np).map(|i| 1u32 << i))
                .collect()
        };
        let members = |m: u32| -> ([u8; MAX_AXES], usize) {
            let mut a = [0u8; MAX_AXES];
            let mut n = 0;
            for (i, &x) in partial.iter().enumerate() {
                if m >> i & 1 == 1 {
                    a[n] = x;
                    n += 1;
                }
            }
            (a, n)
        };
        for &m in &sets {
            let (a, n) = members(m);
            let axes = &a[..n];
            let gs = g(axes);
            let mut nw = *w;
            for &x in axes {
                nw[x as usize] = FREE;
            }
            out.push((
                nw,
                Mv::new(0, 0, 0, axes),
                2.0 * (gs - 1.0) / gs * sz + COLLECTIVE_LATENCY_BYTES,
            ));
        }
        for (d, &kept) in keep.iter().enumerate() {
            let nx: &[u8] = next(d).unwrap_or(&[]);
            let len = ds.lens[d] as usize;
            let put = |nw: &mut Where, axes: &[u8], from: usize| {
                for (k, &x) in axes.iter().enumerate() {
                    nw[x as usize] = ((d as u8) << 4) | (from + k) as u8;
                }
            };
            // ReduceScatter: the target's next partial axes (an ascending run), or parked sets.
            let mut run = 0;
            while run < nx.len()
                && w[nx[run] as usize] == PARTIAL
                && (run == 0 || nx[run - 1] < nx[run])
            {
                run += 1;
            }
            let mut scatter = |axes: &[u8]| {
                if !divides(d, axes) {
                    return;
                }
                let mut nw = *w;
                put(&mut nw, axes, len);
                let gs = g(axes);
                out.push((
                    nw,
                    Mv::new(1, d as u8, 0, axes),
                    (gs - 1.0) / gs * sz + COLLECTIVE_LATENCY_BYTES,
                ));
            };
            for k in 1..=run {
                scatter(&nx[..k]);
            }
            for &m in &sets {
                let (a, n) = members(m);
                let axes = &a[..n];
                if ascending(axes) && !nx.starts_with(axes) {
                    scatter(axes);
                }
            }
            // A slice by the target's next free axes.
            let mut k = 0;
            while k < nx.len() && w[nx[k] as usize] == FREE {
                k += 1;
            }
            if k > 0 {
                let mut nw = *w;
                put(&mut nw, &nx[..k], len);
                out.push((nw, Mv::new(2, d as u8, 0, &nx[..k]), SLICE));
            }
            // AllGather (or AllToAll) of trailing axes beyond what the dimension keeps.
            for k in 1..=len.saturating_sub(kept) {
                let axes = &ds.get(d)[len - k..];
                if !ascending(axes) {
                    break;
                }
                let gs = g(axes);
                let mut nw = *w;
                for &x in axes {
                    nw[x as usize] = FREE;
                }
                out.push((
                    nw,
                    Mv::new(3, d as u8, 0, axes),
                    (gs - 1.0) * sz + COLLECTIVE_LATENCY_BYTES,
                ));
                if enable_alltoall {
                    for e in (0..ndims).filter(|&e| e != d) {
                        if !divides(e, axes) {
                            continue;
                        }
                        let mut m = nw;
                        let at = ds.lens[e] as usize;
                        for (i, &x) in axes.iter().enumerate() {
                            m[x as usize] = ((e as u8) << 4) | (at + i) as u8;
                        }
                        out.push((
                            m,
                            Mv::new(4, e as u8, d as u8, axes),
                            (gs - 1.0) / gs * sz + COLLECTIVE_LATENCY_BYTES,
                        ));
                    }
                }
            }
        }
    };
    // Parking one free axis `a` on dimension `d` of `w`, if the target does not split `d` by
    // it next and the split still divides.
    let park = |w: &Where, ds: &Dims, a: u8, d: usize| -> Option<Where> {
        let (cur, want) = (ds.get(d), &target[d]);
        if cur.len() < want.len() && want[..cur.len()] == *cur && want[cur.len()] == a {
            return None;
        }
        let s: f64 = cur.iter().map(|&x| pr(x)).product::<f64>() * pr(a);
        if src.shape[d] % s as usize != 0 {
            return None;
        }
        let mut nw = *w;
        nw[a as usize] = ((d as u8) << 4) | cur.len() as u8;
        Some(nw)
    };
    #[derive(PartialEq)]
    struct Entry(f64, u32);
    impl Eq for Entry {}
    impl PartialOrd for Entry {
        fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
            Some(self.cmp(o))
        }
    }
    impl Ord for Entry {
        fn cmp(&self, o: &Self) -> std::cmp::Ordering {
            o.0.total_cmp(&self.0).then_with(|| o.1.cmp(&self.1))
        }
    }
    let start = place(&src.dims, &src.partial);
    let goal = key_of(&place(&dst.dims, &[]));
    let mut states: Vec<Where> = vec![start];
    // The keys are small and distinct; SipHash dominated the search.
    let mut index: HashMap<u128, u32, foldhash::fast::FixedState> = HashMap::default();
    index.insert(key_of(&start), 0);
    let mut best: Vec<f64> = vec![0.0];
    let mut came: Vec<Option<(u32, Move)>> = vec![None];
    let mut heap = BinaryHeap::from([Entry(0.0, 0)]);
    let mut buf = Vec::new();
    let mut all: Vec<(Where, Move, f64)> = Vec::new();
    let mut weighed = 0usize;
    let found = loop {
        let Entry(c, i) = heap.pop()?;
        // Nothing left cheaper than the bound: the greedy plan stands.
        if c >= bound - 1e-9 {
            return None;
        }
        if c > best[i as usize] {
            continue;
        }
        let here = states[i as usize];
        if key_of(&here) == goal {
            break i as usize;
        }
        all.clear();
        let ds = Dims::of(&here, naxes);
        buf.clear();
        moves(&here, &ds, &mut buf);
        let blank = Mv::new(2, 0, 0, &[]);
        for (n, mv, w) in buf.drain(..) {
            all.push((
                n,
                Move {
                    steps: [mv, blank, blank],
                    n: 1,
                },
                w,
            ));
        }
        // One or two free axes parked, then a collective.
        let free: Vec<u8> = (0..naxes as u8)
            .filter(|&a| here[a as usize] == FREE)
            .collect();
        for (fi, &a) in free.iter().enumerate() {
            for d in 0..ndims {
                let Some(p1) = park(&here, &ds, a, d) else {
                    continue;
                };
                let s1 = Mv::new(2, d as u8, 0, &[a]);
                let ds1 = Dims::of(&p1, naxes);
                let mut seconds: Vec<(Where, [Mv; 2], u8)> = vec![(p1, [s1, blank], 1)];
                // Two parked axes only in small spaces (their pairs grow as the square).
                let pairs: &[u8] = if naxes <= PARK_TWO_AXES {
                    &free[fi + 1..]
                } else {
                    &[]
                };
                for &b in pairs {
                    for e in 0..ndims {
                        if let Some(p2) = park(&p1, &ds1, b, e) {
                            seconds.push((p2, [s1, Mv::new(2, e as u8, 0, &[b])], 2));
                        }
                    }
                }
                for (parked, slices, k) in seconds {
                    let dp = Dims::of(&parked, naxes);
                    buf.clear();
                    moves(&parked, &dp, &mut buf);
                    for (n, mv, w) in buf.drain(..) {
                        if mv.kind == 2 {
                            continue;
                        }
                        let mut steps = [slices[0], slices[1], blank];
                        steps[k as usize] = mv;
                        all.push((n, Move { steps, n: k + 1 }, w + SLICE * k as f64));
                    }
                }
            }
        }
        weighed += all.len();
        if weighed > SEARCH_MOVES {
            return None;
        }
        for &(n, mv, w) in &all {
            let nc = c + w;
            if nc >= bound - 1e-9 {
                continue;
            }
            let key = key_of(&n);
            let j = match index.get(&key) {
                Some(&j) => j as usize,
                None => {
                    if states.len() >= SEARCH_STATES {
                        return None;
                    }
                    states.push(n);
                    best.push(f64::INFINITY);
                    came.push(None);
                    index.insert(key, (states.len() - 1) as u32);
                    states.len() - 1
                }
            };
            if nc < best[j] - 1e-9 {
                best[j] = nc;
                came[j] = Some((i, mv));
                heap.push(Entry(nc, j as u32));
            }
        }
    };
    let mut moves_back = Vec::new();
    let mut cur = found;
    while let Some((prev, mv)) = came[cur] {
        moves_back.push(mv);
        cur = prev as usize;
    }
    let steps: Vec<Step> = moves_back
        .iter()
        .rev()
        .flat_map(|m| m.steps[..m.n as usize].iter().map(|s| s.step(src.op)))
        .collect();
    // Shapes and the cost as `plan` prices it (slices free).
    let mut state = src.clone();
    let mut shapes = Vec::with_capacity(steps.len());
    for step in &steps {
        match step {
            Step::AllReduce { axes, .. } => state.partial.retain(|a| !axes.contains(a)),
            Step::ReduceScatter { dim, axes, .. } => {
                state.partial.retain(|a| !axes.contains(a));
                state.dims[*dim].extend(axes);
            }
            Step::Slice { dim, axes, .. } => state.dims[*dim].extend(axes),
            Step::AllGather { dim, axes, .. } => {
                let len = state.dims[*dim].len();
                state.dims[*dim].truncate(len - axes.len());
            }
            Step::AllToAll {
                split_dim,
                concat_dim,
                axes,
                ..
            } => {
                let len = state.dims[*concat_dim].len();
                state.dims[*concat_dim].truncate(len - axes.len());
                state.dims[*split_dim].extend(axes);
            }
        }
        shapes.push(state.local_shape());
    }
    let slices = steps
        .iter()
        .filter(|s| matches!(s, Step::Slice { .. }))
        .count() as f64;
    Some(Plan {
        spaces: vec![primes.clone()],
        steps,
        cost: best[found] - slices * SLICE,
        shapes,
    })
}

/// The search parks two axes before one collective only in spaces of at most this many prime
/// axes (16 devices when every axis is 2).
const PARK_TWO_AXES: usize = 4;

/// A tiny cost per slice in the search keeps chains from growing for nothing.
const SLICE: f64 = 1e-3;

/// The greedy plan (see the module documentation): the bound and fallback of [`plan`], the
/// plan between two different prime-axis spaces, and the searchers' fast estimate.
pub fn greedy_plan(
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
            // A ReduceScatter along any dimension (shardc's takes an `axis`; MindSpore's only
            // scatters dimension 0, and keeps an AllReduce and a slice elsewhere).
            let target = (0..ndims).find(|&d| to_gather[d] == 0 && to_slice[d].first() == Some(&a));
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

pub use shardc_ir::spmd::{coords, group};

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
    fn tutorial_matmul_to_relu_is_one_reduce_scatter_along_the_columns() {
        // matmul out: dev [2,4,1], map [2, 0], partial over axis 1 (the k axis).
        let from = lay(&[2, 4, 1], &[2, 0], &[16, 16], &[1]);
        // relu (2, 4): dev [2, 4], map [1, 0]. MindSpore prints AllReduce + StridedSlice
        // (its ReduceScatter scatters dimension 0 only); shardc's scatters the columns.
        let to = lay(&[2, 4], &[1, 0], &[16, 16], &[]);
        let p = plan(&from, &to, 4, false);
        assert_eq!(p.steps.len(), 1, "{:?}", p.steps);
        assert!(matches!(p.steps[0], Step::ReduceScatter { dim: 1, .. }));
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
}
