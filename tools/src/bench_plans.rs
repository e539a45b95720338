//! `shardc bench plans`: the plans of the default modes against the full searcher and against
//! MindSpore's rules, on the parallel quickstart's net.
//!
//! The net: `x → MatMul(w) → ReLU → MatMul(w2) → MSELoss`, `Momentum(0.01, 0.9)`, 8 devices,
//! the first MatMul annotated with each strategy that uses all 8 devices (`((a, b), (b, c))`,
//! `a·b·c = 8`), the rest left to the mode. Two sizes: where bandwidth dominates (batch 512,
//! 4096 → 8192 → 4096) and the tutorial's (batch 16, 32 → 16 → 16, where latency matters as
//! much). Per annotation, one row:
//!
//! - the predicted step (ms, shardc's cost model on the `cpu` preset, as `shardc compile`
//!   prices by default) of `semi_auto_parallel`, `auto_parallel` with
//!   `sharding_propagation`, and `auto_parallel` with `dynamic_programming` (the full
//!   searcher, the same annotation fixed), and the ratio propagation / dynamic programming
//!   (goal: ≤ 1.05);
//! - each plan's collectives and bytes per step on rank 0 (its execute graph);
//! - MindSpore's rule plan for the same annotation ([`crate::plan_compare`]): its collectives,
//!   bytes and predicted step (the semi-auto plan's compute plus its collectives priced by the
//!   same machine); a shardc plan it dominates (no fewer collectives and no fewer bytes, one
//!   strictly more) is flagged `DOMINATED`.
//!
//! A summary line per size counts the rows that meet the goals.

use super::BenchArgs;
use crate::plan_compare::{mindspore_rule_plan, rank_comm, CommSummary};
use anyhow::{Context, Result};
use shardc_compiler::optim::Momentum;
use shardc_compiler::pipeline::{compile, CompileOptions, ParallelCompiled};
use shardc_ir::{text, Graph, Strategy};
use shardc_passes::parallel::cost::Machine;
use shardc_passes::parallel::{search, DatasetLayout, Mode, ParallelOptions, SearchMode};

/// The goal: propagation's predicted step at most this times dynamic programming's.
pub const GOAL_PROPAGATION_RATIO: f64 = 1.05;

/// The quickstart net at `batch`, `d_in → d_hidden → d_out`, its first MatMul annotated.
pub fn tutorial_net(
    batch: usize,
    d_in: usize,
    d_hidden: usize,
    d_out: usize,
    strategy: &Strategy,
) -> Result<Graph> {
    let src = format!(
        "%para1_x : <Tensor[Float32], ({batch}, {d_in})>
%para2_label : <Tensor[Float32], ({batch}, {d_out})>
%para3_w : <Ref[Tensor(F32)], ({d_in}, {d_hidden}), ref_key=:w>  :  has_default  init: normal(sigma=0.01, seed=1)
%para4_w2 : <Ref[Tensor(F32)], ({d_hidden}, {d_out}), ref_key=:w2>  :  has_default  init: normal(sigma=0.01, seed=2)

subgraph @Net(%para1_x, %para2_label, %para3_w, %para4_w2) {{
  %1(out) = MatMul(%para1_x, %para3_w) {{instance name: matmul}} primitive_attrs: {{transpose_a: false, transpose_b: false, in_strategy: {strategy}}}
      # scope: (Default/network-WithLossCell/_backbone-Net)
  %2(out) = ReLU(%1) {{instance name: relu}}
      # scope: (Default/network-WithLossCell/_backbone-Net)
  %3(out) = MatMul(%2, %para4_w2) {{instance name: matmul2}} primitive_attrs: {{transpose_a: false, transpose_b: false}}
      # scope: (Default/network-WithLossCell/_backbone-Net)
  %4(diff) = Sub(%3, %para2_label) {{instance name: sub}}
      # scope: (Default/network-WithLossCell/_loss_fn-MSELoss)
  %5(sq) = Square(%4) {{instance name: square}}
      # scope: (Default/network-WithLossCell/_loss_fn-MSELoss)
  %6(loss) = ReduceMean(%5, (0, 1)) {{instance name: reduce_mean}} primitive_attrs: {{keep_dims: false}}
      # scope: (Default/network-WithLossCell/_loss_fn-MSELoss)
  Return(%6)
}}
"
    );
    Ok(text::parse_graph(&src, "tutorial net")?)
}

/// Every strategy `((a, b), (b, c))` of a MatMul with `a·b·c = devices`.
pub fn full_matmul_strategies(devices: usize) -> Vec<Strategy> {
    let divisors: Vec<usize> = (1..=devices).filter(|d| devices % d == 0).collect();
    let mut out = Vec::new();
    for &a in &divisors {
        for &b in &divisors {
            if (devices / a) % b != 0 {
                continue;
            }
            let c = devices / a / b;
            out.push(Strategy(vec![
                vec![a as i64, b as i64],
                vec![b as i64, c as i64],
            ]));
        }
    }
    out
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

/// One row: the three plans of one annotation and MindSpore's rule plan.
#[derive(Clone, Debug)]
pub struct Row {
    /// The first MatMul's strategy.
    pub strategy: Strategy,
    /// `semi_auto_parallel`.
    pub semi: PlanFigures,
    /// `auto_parallel` with `sharding_propagation`.
    pub propagation: PlanFigures,
    /// `auto_parallel` with `dynamic_programming`.
    pub dynamic: PlanFigures,
    /// MindSpore's rule plan for the semi-auto forward strategies.
    pub mindspore: CommSummary,
    /// Its predicted step: the semi-auto plan's compute plus its collectives.
    pub mindspore_predicted: f64,
}

/// The row of one annotation.
pub fn row(
    devices: usize,
    (batch, d_in, d_hidden, d_out): (usize, usize, usize, usize),
    strategy: &Strategy,
    machine: Machine,
) -> Result<Row> {
    let net = tutorial_net(batch, d_in, d_hidden, d_out, strategy)?;
    let opts = |mode, search| options(devices, mode, search, machine);
    let semi = plan(
        &net,
        &opts(Mode::SemiAutoParallel, SearchMode::ShardingPropagation),
    )?;
    let propagation = plan(
        &net,
        &opts(Mode::AutoParallel, SearchMode::ShardingPropagation),
    )?;
    let dynamic = plan(
        &net,
        &opts(Mode::AutoParallel, SearchMode::DynamicProgramming),
    )?;
    let opts = opts(Mode::SemiAutoParallel, SearchMode::ShardingPropagation);
    let mindspore = mindspore_rule_plan(
        &semi.compiled.begin,
        &semi.compiled.assignment,
        &opts.search.machine,
        opts.enable_alltoall,
    );
    let mindspore_predicted = semi.compute + mindspore.seconds;
    Ok(Row {
        strategy: strategy.clone(),
        semi,
        propagation,
        dynamic,
        mindspore,
        mindspore_predicted,
    })
}

fn cell(p: &PlanFigures, ms: &CommSummary) -> String {
    format!(
        "{:>9.3} {:>3} {:>10.0}{}",
        p.predicted * 1e3,
        p.rank0.collectives,
        p.rank0.bytes,
        if p.rank0.dominated_by(ms) {
            " DOMINATED"
        } else {
            ""
        }
    )
}

/// `shardc bench plans`.
pub fn run(args: &BenchArgs) -> Result<()> {
    let devices = 8;
    let device = args.device.as_deref().unwrap_or("cpu");
    let machine = crate::parallel_args::device_description(Some(device))?.machine();
    println!(
        "plans: the quickstart net on {devices} devices, the first MatMul annotated; predicted \
         step in ms on the {device} machine, rank 0's collectives and bytes per step; \
         MindSpore's rule plan for the same annotation"
    );
    for (what, dims) in [
        ("bandwidth-bound", (512, 4096, 8192, 4096)),
        ("tutorial", (16, 32, 16, 16)),
    ] {
        println!(
            "plans size={what} batch={} dims={}x{}x{}",
            dims.0, dims.1, dims.2, dims.3
        );
        println!(
            "  {:<18} | {:>9} {:>3} {:>10} | {:>9} {:>3} {:>10} | {:>9} {:>3} {:>10} | {:>6} | {:>9} {:>3} {:>10}",
            "matmul strategy",
            "semi ms",
            "n",
            "bytes",
            "prop ms",
            "n",
            "bytes",
            "dp ms",
            "n",
            "bytes",
            "p/dp",
            "ms-rule ms",
            "n",
            "bytes"
        );
        let (mut within, mut undominated, mut rows) = (0, 0, 0);
        for s in full_matmul_strategies(devices) {
            let r = row(devices, dims, &s, machine).with_context(|| format!("annotation {s}"))?;
            let ratio = r.propagation.predicted / r.dynamic.predicted;
            rows += 1;
            within += (ratio <= GOAL_PROPAGATION_RATIO) as usize;
            undominated += (!r.semi.rank0.dominated_by(&r.mindspore)
                && !r.propagation.rank0.dominated_by(&r.mindspore))
                as usize;
            println!(
                "  {:<18} | {} | {} | {} | {:>6.3} | {:>9.3} {:>3} {:>10.0}",
                r.strategy.to_string(),
                cell(&r.semi, &r.mindspore),
                cell(&r.propagation, &r.mindspore),
                cell(&r.dynamic, &r.mindspore),
                ratio,
                r.mindspore_predicted * 1e3,
                r.mindspore.collectives,
                r.mindspore.bytes
            );
        }
        println!(
            "plans summary size={what}: propagation within {GOAL_PROPAGATION_RATIO}x of \
             dynamic programming in {within} of {rows}; semi-auto and propagation undominated \
             by MindSpore's rule plan in {undominated} of {rows}"
        );
    }
    Ok(())
}
