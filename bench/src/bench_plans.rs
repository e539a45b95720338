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
//! - MindSpore's rule plan for the same annotation ([`shardc_tools::plan_compare`]): its collectives,
//!   bytes and predicted step (the semi-auto plan's compute plus its collectives priced by the
//!   same machine); a shardc plan it dominates (no fewer collectives and no fewer bytes, one
//!   strictly more) is flagged `DOMINATED`.
//!
//! A summary line per size counts the rows that meet the goals.

use crate::args::BenchArgs;
use anyhow::{Context, Result};
use shardc_ir::{text, Graph, Strategy};
use shardc_passes::parallel::cost::Machine;
use shardc_passes::parallel::{Mode, SearchMode};
use shardc_tools::plan_compare::{mindspore_rule_plan, options, plan, CommSummary, PlanFigures};

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
    let machine = shardc_tools::parallel_args::device_description(Some(device))?.machine();
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The goals on the quickstart net, every annotation, both sizes, on the default
    /// machine: propagation within 5 % of dynamic programming, and neither the semi-auto nor
    /// the propagation plan dominated by MindSpore's rule plan.
    #[test]
    fn the_quickstart_plans_meet_the_goals_at_both_sizes() {
        let machine = Machine::default();
        let mut failures = Vec::new();
        for dims in [(512, 4096, 8192, 4096), (16, 32, 16, 16)] {
            for s in full_matmul_strategies(8) {
                let r = row(8, dims, &s, machine).unwrap();
                let ratio = r.propagation.predicted / r.dynamic.predicted;
                if ratio > GOAL_PROPAGATION_RATIO {
                    failures.push(format!("{dims:?} {s}: propagation / dp = {ratio:.3}"));
                }
                for (what, p) in [("semi-auto", &r.semi), ("propagation", &r.propagation)] {
                    if p.rank0.dominated_by(&r.mindspore) {
                        failures.push(format!(
                            "{dims:?} {s}: the {what} plan ({} collectives, {:.0} bytes) is \
                             dominated by MindSpore's ({}, {:.0})",
                            p.rank0.collectives,
                            p.rank0.bytes,
                            r.mindspore.collectives,
                            r.mindspore.bytes
                        ));
                    }
                }
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    #[test]
    fn every_full_matmul_strategy_is_listed() {
        let s = full_matmul_strategies(8);
        assert_eq!(s.len(), 10);
        assert!(s.iter().all(|s| {
            let (a, b, c) = (s.0[0][0], s.0[0][1], s.0[1][1]);
            a * b * c == 8 && s.0[1][0] == b
        }));
    }
}
