//! What the invariant suites share (`parallel_invariant`, `pipeline_invariant`,
//! `pipeline_stages`, `optimizer_sharding`): the single device's run on seeded synthetic
//! batches, the layouts every rank is fed and gathered through, and the comparison of the
//! ranks' losses and gathered weights with the single device's.

#![allow(dead_code)]

use rand::Rng;
use rand_chacha::ChaCha8Rng;
use shardc::compiler::pipeline::ParallelCompiled;
use shardc::ir::OpKind;
use shardc::ir::Strategy;
use shardc::ir::{Graph, TensorLayout};
use shardc::passes::parallel::rules::{candidates, dims_of, strategy_from_loops};
use shardc::runtime::data::SyntheticData;
use shardc::runtime::executor::Executor;
use shardc::runtime::Tensor;
use shardc_tools::in_process::{rel, tensor_rel, RanksResult};
use std::sync::Arc;

/// The single device's training run: its data, its executor after the steps and its losses.
pub struct SingleDevice {
    /// The seeded synthetic batches (global: every rank is fed its block of them).
    pub data: SyntheticData,
    /// The executor after the steps (its weights are the reference).
    pub exec: Executor,
    /// The loss of every step.
    pub losses: Vec<f64>,
}

impl SingleDevice {
    /// Trains `single` (a one-device training step) for `steps` steps on the batches of
    /// `seed`.
    pub fn run(what: &str, single: Graph, seed: u64, steps: u64) -> Result<Self, String> {
        let data = SyntheticData::new(&single, seed, steps as usize).map_err(|e| e.to_string())?;
        let mut exec = Executor::new(single, Arc::new(shardc::cpu::CpuBackend::with_threads(1)))
            .map_err(|e| format!("{what}: {e}"))?;
        let mut losses = Vec::new();
        for step in 0..steps {
            let f = feeds_of(&data, step);
            let refs: Vec<(&str, Tensor)> =
                f.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
            let out = exec
                .step(&refs)
                .map_err(|e| format!("{what}: single step: {e}"))?;
            losses.push(out[0].scalar_value().unwrap_or(f64::NAN));
        }
        Ok(SingleDevice { data, exec, losses })
    }

    /// The global batch of `step`, every data input.
    pub fn feeds(&self, step: u64) -> Vec<(String, Tensor)> {
        feeds_of(&self.data, step)
    }

    /// The data inputs among `layouts` (the parameters that are not the model's weights).
    pub fn inputs(&self, layouts: &[(String, TensorLayout)]) -> Vec<(String, TensorLayout)> {
        layouts
            .iter()
            .filter(|(n, _)| self.exec.param(n).is_none())
            .cloned()
            .collect()
    }

    /// The ranks' run `res` against this one: every rank that returned outputs returned the
    /// single device's loss at every step (at least one rank must, and in a pipeline only
    /// the last stage's do), and every weight gathered from the ranks that hold it through
    /// `layouts` equals the single device's, both within `tolerance`.
    pub fn check(
        &self,
        what: &str,
        res: &RanksResult,
        layouts: &[(String, TensorLayout)],
        tolerance: f64,
    ) -> Result<(), String> {
        self.check_except(what, res, layouts, tolerance, &[])
    }

    /// [`SingleDevice::check`] but for the weights whose names end with one of `unchecked`.
    pub fn check_except(
        &self,
        what: &str,
        res: &RanksResult,
        layouts: &[(String, TensorLayout)],
        tolerance: f64,
        unchecked: &[&str],
    ) -> Result<(), String> {
        for (k, &l) in self.losses.iter().enumerate() {
            let mut seen = false;
            for (r, outs) in res.outputs.iter().enumerate() {
                let Some(out) = outs.get(k).filter(|o| !o.is_empty()) else {
                    continue;
                };
                seen = true;
                let v = out[0].scalar_value().unwrap_or(f64::NAN);
                if rel(v, l) > tolerance || rel(v, l).is_nan() {
                    return Err(format!(
                        "{what}: step {} rank {r}: loss {v} vs single device {l}",
                        k + 1
                    ));
                }
            }
            if !seen {
                return Err(format!("{what}: step {}: no rank returned the loss", k + 1));
            }
        }
        for (name, layout) in layouts {
            let Some(reference) = self.exec.param(name) else {
                continue;
            };
            if unchecked.iter().any(|u| name.ends_with(u)) {
                continue;
            }
            let whole = res
                .gathered_weight(name, layout)
                .map_err(|e| format!("{what}: {e}"))?;
            let d = tensor_rel(&whole, reference);
            if d > tolerance || d.is_nan() {
                if std::env::var("SHARDC_CASE").is_ok() {
                    eprintln!("reference {name}: {:?}", reference.to_f64_vec());
                    eprintln!("gathered  {name}: {:?}", whole.to_f64_vec());
                }
                return Err(format!(
                    "{what}: weight {name} differs by {d:.3e} after {} steps",
                    self.losses.len()
                ));
            }
        }
        Ok(())
    }
}

/// The global batch of `step` from `data`, with owned names.
pub fn feeds_of(data: &SyntheticData, step: u64) -> Vec<(String, Tensor)> {
    data.feeds(step)
        .into_iter()
        .map(|(n, t)| (n.to_string(), t))
        .collect()
}

/// Every logical parameter's layout over all ranks (lifted over the stages when pipelined).
pub fn layouts_of(par: &ParallelCompiled) -> Vec<(String, TensorLayout)> {
    par.begin
        .params
        .iter()
        .zip(&par.param_layouts)
        .map(|(p, l)| (p.name.clone(), l.clone()))
        .collect()
}

/// A random element of `xs`.
pub fn pick<'a, T>(rng: &mut ChaCha8Rng, xs: &'a [T]) -> &'a T {
    &xs[rng.random_range(0..xs.len())]
}

/// Annotates a random subset of the forward ops with random valid strategies.
pub fn annotate(rng: &mut ChaCha8Rng, g: &mut Graph, device_num: usize, p: f64) -> Vec<String> {
    let mut notes = Vec::new();
    for i in 0..g.nodes.len() {
        let node = &g.nodes[i];
        // Users annotate computations, not the updates of weights (those follow the weight).
        if matches!(node.op, OpKind::TupleGetItem | OpKind::Assign) || !rng.random_bool(p) {
            continue;
        }
        let Ok(dims) = dims_of(g, node) else { continue };
        let cands = candidates(g, node, &dims, device_num, 4);
        if cands.is_empty() {
            continue;
        }
        let splits = cands[rng.random_range(0..cands.len())].clone();
        let s: Strategy = strategy_from_loops(g, node, &dims, &splits);
        notes.push(format!("{} {}", node.instance, s));
        g.nodes[i].in_strategy = Some(s);
    }
    notes
}
