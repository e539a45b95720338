//! Plans side by side: the communication a compiled plan runs on rank 0, and the plan
//! MindSpore's rules give for the same forward strategies — for `shardc bench plans` and the
//! property test that shardc's plans are never dominated by MindSpore's.
//!
//! **MindSpore's rule plan** ([`mindspore_rule_plan`]), for the forward strategies of a
//! `semi_auto_parallel` assignment (the user's annotations, the batch-split default of every
//! other forward op), as MindSpore 2.x builds it:
//! - each forward op's own communication: a result that is a partial sum (a split contraction
//!   or reduction) is completed by an AllReduce (`forward_op`), and the bprop of that
//!   AllReduce is another AllReduce of the same size (`get_bprop_all_reduce`);
//! - between a producer and a consumer whose layouts differ, MindSpore's redistribution has
//!   no partial state (the producer's AllReduce came first): AllGather, StridedSlice and,
//!   with `enable_alltoall`, AlltoAll; in the backward the transposes: ReduceScatter for an
//!   AllGather, nothing for a slice (its bprop pads with zeros), AlltoAll for an AlltoAll. A
//!   data input has no gradient, so its redistribution has no transpose;
//! - every weight whose slice several devices hold gets its gradient summed over them (the
//!   `_MirrorOperator`, an AllReduce over the devices holding the same slice).
//!
//! Bytes are what one rank sends per step on a ring (AllReduce `2(p − 1)/p` of its buffer,
//! AllGather `(p − 1)/p` of its result, ReduceScatter and AlltoAll `(p − 1)/p` of their
//! input), as `shardc explain` counts the emitted collectives of a rank graph.

use anyhow::{Context, Result};
use shardc_compiler::optim::Momentum;
use shardc_compiler::pipeline::{compile, CompileOptions, ParallelCompiled};
use shardc_ir::{Graph, Operand, TensorLayout};
use shardc_passes::parallel::cost::{elem_bytes, Machine};
use shardc_passes::parallel::redistribute::{self, group, Canon, Step};
use shardc_passes::parallel::strategy::{is_generated, updated_weight, Assignment};
use shardc_passes::parallel::{search, DatasetLayout, Mode, ParallelOptions, SearchMode};

/// The communication of a plan: how many collectives and the bytes one rank sends per step;
/// `seconds` prices them with a machine (α–β per group, as the cost model prices a
/// redistribution).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CommSummary {
    /// Collectives per step.
    pub collectives: usize,
    /// Bytes one rank sends per step.
    pub bytes: f64,
    /// Seconds of those collectives on the machine.
    pub seconds: f64,
}

impl CommSummary {
    /// Whether `self` is dominated by `other`: at least as many collectives and at least as
    /// many bytes, one of the two strictly more.
    pub fn dominated_by(&self, other: &CommSummary) -> bool {
        let eps = 1e-9 * self.bytes.max(other.bytes).max(1.0);
        self.collectives >= other.collectives
            && self.bytes >= other.bytes - eps
            && (self.collectives > other.collectives || self.bytes > other.bytes + eps)
    }

    fn add(&mut self, bytes: f64, seconds: f64) {
        self.collectives += 1;
        self.bytes += bytes;
        self.seconds += seconds;
    }
}

/// The collectives of a rank graph (rank 0's, usually): their count and bytes per step.
pub fn rank_comm(g: &Graph) -> CommSummary {
    let mut s = CommSummary::default();
    for (i, n) in g.nodes.iter().enumerate() {
        if n.op.is_communication() {
            s.collectives += 1;
            s.bytes += crate::explain::comm_bytes(g, i);
        }
    }
    s
}

/// Bytes of a layout's local block.
fn local_bytes(l: &TensorLayout, elem: usize) -> f64 {
    l.slice_shape().iter().product::<usize>() as f64 * elem as f64
}

/// Rank 0's group over the prime axes `axes` of `primes`, and the seconds of a collective of
/// `kind` moving `buffer` bytes (the result for an AllGather, the input otherwise) over it.
fn priced(m: &Machine, primes: &[usize], axes: &[usize], all_reduce: bool, buffer: f64) -> f64 {
    let (ranks, _) = group(primes, axes, 0);
    m.collective_overhead
        + if all_reduce {
            m.group_all_reduce_seconds(&ranks, buffer)
        } else {
            m.group_all_gather_seconds(&ranks, buffer)
        }
}

/// The ring share of a group of `p`.
fn share(p: usize) -> f64 {
    (p.max(1) - 1) as f64 / p.max(1) as f64
}

/// The prime axes over which `l` is partial, with the primes of its space.
fn partial_axes(l: &TensorLayout) -> (Vec<usize>, Vec<usize>) {
    let c = Canon::of(l);
    (c.primes, c.partial)
}

/// `l` with its partial sums completed (what MindSpore's forward AllReduce leaves).
fn completed(l: &TensorLayout) -> TensorLayout {
    TensorLayout {
        partial: Vec::new(),
        ..l.clone()
    }
}

/// The plan MindSpore's rules give for the forward strategies of `a` (a `semi_auto_parallel`
/// assignment of the training graph `g`), priced on `machine`; see the module documentation.
pub fn mindspore_rule_plan(
    g: &Graph,
    a: &Assignment,
    machine: &Machine,
    enable_alltoall: bool,
) -> CommSummary {
    let mut s = CommSummary::default();
    let layout_of = |o: &Operand| a.operand_layout(g, o);
    let elem_of = |o: &Operand| {
        g.operand_tensor_type(o)
            .map(|t| elem_bytes(t.dtype))
            .unwrap_or(4)
    };
    let mut first_layout: Vec<Option<TensorLayout>> = vec![None; g.params.len()];
    for (i, node) in g.nodes.iter().enumerate() {
        if is_generated(node) || updated_weight(g, node).is_some() {
            continue;
        }
        let Some(d) = a.decisions[i].as_ref() else {
            continue;
        };
        // The op's own communication and its bprop.
        for (k, out) in d.sharding.outputs.iter().enumerate() {
            if !out.is_partial() {
                continue;
            }
            let (primes, axes) = partial_axes(out);
            let elem = node
                .ty
                .tensors()
                .get(k)
                .map(|t| elem_bytes(t.dtype))
                .unwrap_or(4);
            let b = local_bytes(out, elem);
            let p: usize = axes.iter().map(|&x| primes[x]).product();
            let secs = priced(machine, &primes, &axes, true, b);
            s.add(2.0 * share(p) * b, secs);
            s.add(2.0 * share(p) * b, secs);
        }
        // Redistribution of each input, and its transpose where a gradient flows back.
        for (j, o) in node.inputs.iter().enumerate() {
            let Some(Some(want)) = d.sharding.inputs.get(j) else {
                continue;
            };
            let have = match o {
                Operand::Param(p) if g.param(*p).is_weight() => {
                    // A weight is sliced as its first user wants it.
                    match &first_layout[p.index()] {
                        None => {
                            first_layout[p.index()] = Some(want.clone());
                            continue;
                        }
                        Some(l) => l.clone(),
                    }
                }
                _ => match layout_of(o) {
                    Some(l) => completed(&l),
                    None => continue,
                },
            };
            let data = matches!(o, Operand::Param(p) if !g.param(*p).is_weight());
            let elem = elem_of(o);
            let pl = redistribute::plan(&have, want, elem, enable_alltoall);
            let mut before = Canon::of(&have).local_shape();
            for (step, after) in pl.steps.iter().zip(&pl.shapes) {
                let bytes = |shape: &[usize]| shape.iter().product::<usize>() as f64 * elem as f64;
                let (space, axes, input_sized) = match step {
                    Step::AllGather { space, axes, .. } => (*space, axes, false),
                    Step::AllToAll { space, axes, .. } => (*space, axes, true),
                    Step::AllReduce { space, axes, .. }
                    | Step::ReduceScatter { space, axes, .. } => (*space, axes, true),
                    Step::Slice { .. } => {
                        before = after.clone();
                        continue;
                    }
                };
                let primes = &pl.spaces[space];
                let p: usize = axes.iter().map(|&x| primes[x]).product();
                let buffer = if input_sized {
                    bytes(&before)
                } else {
                    bytes(after)
                };
                let secs = priced(machine, primes, axes, false, buffer);
                s.add(share(p) * buffer, secs);
                if !data {
                    // The transpose: ReduceScatter of an AllGather's result, AlltoAll back.
                    s.add(share(p) * buffer, secs);
                }
                before = after.clone();
            }
        }
    }
    // Mirrors: each weight's gradient summed over the devices holding the same slice.
    for (p, l) in g.params.iter().zip(&a.param_layouts) {
        if !p.is_weight() || !p.requires_grad() {
            continue;
        }
        let c = Canon::of(l);
        let used: Vec<usize> = c.dims.iter().flatten().copied().collect();
        let axes: Vec<usize> = (0..c.primes.len()).filter(|x| !used.contains(x)).collect();
        let n: usize = axes.iter().map(|&x| c.primes[x]).product();
        if n <= 1 {
            continue;
        }
        let b = local_bytes(l, elem_bytes(p.ty.dtype));
        s.add(
            2.0 * share(n) * b,
            priced(machine, &c.primes, &axes, true, b),
        );
    }
    s
}

/// The parallel options of one plan on `machine`.
pub fn options(
    devices: usize,
    mode: Mode,
    search: SearchMode,
    machine: Machine,
) -> ParallelOptions {
    ParallelOptions {
        mode,
        device_num: devices,
        dataset: DatasetLayout::DataParallel,
        gradients_mean: true,
        enable_alltoall: false,
        search: shardc_passes::parallel::SearchOptions {
            mode: search,
            machine,
            max_device_memory: None,
        },
        parallel_optimizer: None,
    }
}

/// One compiled plan: its predicted step (seconds) and rank 0's communication.
#[derive(Clone, Debug)]
pub struct PlanFigures {
    /// The compiled plan.
    pub compiled: ParallelCompiled,
    /// Predicted step, seconds (compute + communication).
    pub predicted: f64,
    /// Predicted compute, seconds.
    pub compute: f64,
    /// Rank 0's collectives and bytes per step.
    pub rank0: CommSummary,
}

/// Compiles `forward` (with `Momentum(0.01, 0.9)`) under `opts` and measures the plan.
pub fn plan(forward: &Graph, opts: &ParallelOptions) -> Result<PlanFigures> {
    let c = compile(
        forward.clone(),
        &CompileOptions {
            optimizer: Some(Momentum::new(0.01, 0.9).to_spec()),
            parallel: Some(opts.clone()),
            ..Default::default()
        },
    )?;
    let compiled = c.parallel.context("no parallel plan")?;
    let b = search::predict(&compiled.begin, opts, &compiled.assignment)?;
    let rank0 = rank_comm(&compiled.ranks[0]);
    Ok(PlanFigures {
        compiled,
        predicted: b.seconds(),
        compute: b.compute,
        rank0,
    })
}
