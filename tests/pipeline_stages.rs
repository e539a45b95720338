//! Pipeline parallelism end to end: a model compiled with `pipeline_stages` and `micro_size`
//! into one graph per stage (Send / Receive between them, 1F1B or GPipe order), every rank's
//! materialized graph run on its own thread over the in-process communicator, computes the
//! single device's losses on the global batch and, gathered from the ranks' blocks, its
//! weights after the steps.

use shardc::compiler::builder::{BuildError, GraphBuilder, Value};
use shardc::compiler::loss::{MSELoss, SoftmaxCrossEntropyWithLogits};
use shardc::compiler::model::build_network;
use shardc::compiler::nn::FnCell;
use shardc::compiler::{compile, init, optim::Momentum, CompileOptions};
use shardc::ir::{DType, Graph, OpKind, ParamKind, Strategy, TensorLayout};
use shardc::passes::parallel::{DatasetLayout, Mode, ParallelOptions, SearchOptions};
use shardc::passes::pipeline::split::sequence;
use shardc::passes::pipeline::{PipelineOptions, Scheduler};
use shardc::runtime::data::SyntheticData;
use shardc::runtime::executor::Executor;
use shardc::runtime::{InProcessWorld, Tensor};
use std::sync::Arc;

mod invariant_common;
use invariant_common::{feeds_of, SingleDevice};

const STEPS: u64 = 3;
const DT: DType = DType::Float64;
const TOLERANCE: f64 = 1e-9;

/// A 4-layer MLP (widths `dims`), MSE or sparse cross-entropy loss, batch `batch`.
/// With `stages`, layer `i` is built inside `pipeline_stage(i * stages / 4)` (MindSpore's
/// `cell.pipeline_stage`); without, the compiler splits by compute cost.
fn mlp(batch: usize, cross_entropy: bool, stages: Option<usize>) -> Result<Graph, BuildError> {
    let dims = [8usize, 16, 16, 8, 8];
    let net = FnCell::new("Mlp", move |b: &mut GraphBuilder, mut x: Value| {
        for (i, w) in dims.windows(2).enumerate() {
            let layer = |b: &mut GraphBuilder| -> Result<Value, BuildError> {
                let wt = b.weight(&format!("w{i}"), DT, &[w[0], w[1]], init::normal(0.3))?;
                let mut y = b.matmul(x, wt)?;
                let bb = b.weight(&format!("b{i}"), DT, &[w[1]], init::normal(0.1))?;
                y = b.bias_add(y, bb)?;
                if i + 2 < dims.len() {
                    y = b.tanh(y)?;
                }
                Ok(y)
            };
            x = match stages {
                Some(s) => b.pipeline_stage(i * s / 4, layer)?,
                None => layer(b)?,
            };
        }
        Ok(x)
    });
    if cross_entropy {
        build_network(
            "Mlp",
            &net,
            &SoftmaxCrossEntropyWithLogits::new(true, "mean"),
            &[("x", DT, &[batch, 8]), ("label", DType::Int32, &[batch])],
        )
    } else {
        build_network(
            "Mlp",
            &net,
            &MSELoss::new(),
            &[("x", DT, &[batch, 8]), ("label", DT, &[batch, 8])],
        )
    }
}

struct Case {
    mode: Mode,
    device_num: usize,
    pipeline: PipelineOptions,
    /// Relative tolerance of losses and weights (f64 models: rounding only).
    tolerance: f64,
}

fn pipeline(stages: usize, micro_size: usize, scheduler: Scheduler) -> PipelineOptions {
    PipelineOptions {
        stages,
        micro_size,
        scheduler,
    }
}

/// Runs `model` on one device and pipelined; compares losses and weights.
fn check(what: &str, model: Graph, annotated: Graph, case: &Case) -> Result<(), String> {
    let opt = Momentum::new(0.1, 0.9).to_spec();
    let single = compile(
        model,
        &CompileOptions {
            optimizer: Some(opt),
            ..Default::default()
        },
    )
    .map_err(|e| format!("{what}: single-device compile: {e}"))?
    .graph;
    let par = compile(
        annotated,
        &CompileOptions {
            optimizer: Some(opt),
            parallel: Some(ParallelOptions {
                mode: case.mode,
                device_num: case.device_num,
                dataset: DatasetLayout::DataParallel,
                gradients_mean: true,
                enable_alltoall: false,
                search: SearchOptions::default(),
                parallel_optimizer: None,
            }),
            pipeline: case.pipeline,
            dump_dir: std::env::var_os("SHARDC_PIPE_DUMP").map(std::path::PathBuf::from),
            ..Default::default()
        },
    )
    .map_err(|e| format!("{what}: pipelined compile: {e}"))?
    .parallel
    .ok_or_else(|| format!("{what}: no per-rank graphs"))?;
    if !par.program.is_pipelined() || par.program.stage_count() != case.pipeline.stages {
        return Err(format!("{what}: the program is not split into stages"));
    }
    let stages = par.program.stage_count();
    // Every stage sends and receives: activations forward, their gradients back.
    for (r, g) in par.ranks.iter().enumerate() {
        let s = par.program.stage_of(r).map_err(|e| e.to_string())?;
        let has = |op| g.nodes.iter().any(|n| n.op == op);
        if !has(OpKind::Receive) || !has(OpKind::Send) {
            return Err(format!(
                "{what}: rank {r} (stage {s}) lacks its Send/Receive"
            ));
        }
    }

    // Each rank's Send/Receive run in its stage's (phase, micro-batch) order, its parameters
    // are its stage's, and the program survives its binary form.
    for (r, g) in par.ranks.iter().enumerate() {
        let s = par.program.stage_of(r).map_err(|e| e.to_string())?;
        let mut seen: Vec<(bool, usize)> = Vec::new();
        for n in &g.nodes {
            if !matches!(n.op, OpKind::Send | OpKind::Receive) {
                continue;
            }
            let m = n
                .attrs
                .get("micro_batch")
                .and_then(|a| a.as_int())
                .unwrap_or(-1) as usize;
            let x = (n.scope.starts_with("Gradients"), m);
            if seen.last() != Some(&x) {
                seen.push(x);
            }
        }
        let want = sequence(case.pipeline.scheduler, s, stages, case.pipeline.micro_size);
        if seen != want {
            return Err(format!(
                "{what}: rank {r} (stage {s}) runs {seen:?}, not the {} order {want:?}",
                case.pipeline.scheduler
            ));
        }
        let w = par.program.weights_of(r).map_err(|e| e.to_string())?;
        if w.params != g.params {
            return Err(format!(
                "{what}: rank {r}: weights_of differs from its graph's"
            ));
        }
    }
    let bytes = shardc::ir::binary::encode_program(&par.program).map_err(|e| e.to_string())?;
    if shardc::ir::binary::decode_program(&bytes).map_err(|e| e.to_string())? != par.program {
        return Err(format!("{what}: the program does not round-trip"));
    }

    let reference = SingleDevice::run(what, single, 7, STEPS)?;
    let (exec, losses) = (&reference.exec, &reference.losses);
    let data = &reference.data;
    let feeds = |step: u64| feeds_of(data, step);

    let layouts: Vec<(String, TensorLayout)> = par
        .begin
        .params
        .iter()
        .zip(&par.param_layouts)
        .map(|(p, l)| (p.name.clone(), l.clone()))
        .collect();
    let layout_of = |name: &str| layouts.iter().find(|(n, _)| n == name).map(|(_, l)| l);
    let n = par.ranks.len();
    let comms = InProcessWorld::new(n);
    type Run = (Vec<Vec<Tensor>>, Vec<(String, Tensor)>);
    let results: Vec<Result<Run, String>> = std::thread::scope(|sc| {
        let handles: Vec<_> = par
            .ranks
            .iter()
            .cloned()
            .zip(comms)
            .enumerate()
            .map(|(rank, (g, comm))| {
                let feeds = &feeds;
                let layout_of = &layout_of;
                sc.spawn(move || -> Result<Run, String> {
                    let inputs: Vec<String> = g
                        .params
                        .iter()
                        .filter(|p| matches!(p.kind, ParamKind::Input))
                        .map(|p| p.name.clone())
                        .collect();
                    let backend = Arc::new(shardc::cpu::CpuBackend::with_threads(1));
                    let mut exec = Executor::with_communicator(g, backend, comm)
                        .map_err(|e| format!("rank {rank}: {e}"))?;
                    let mut outs = Vec::new();
                    for step in 0..STEPS {
                        let mine: Vec<(String, Tensor)> = feeds(step)
                            .into_iter()
                            .filter(|(name, _)| inputs.contains(name))
                            .map(|(name, t)| {
                                let l = layout_of(&name)
                                    .ok_or_else(|| format!("no layout for {name}"))?;
                                let b = t
                                    .block(&l.block(rank))
                                    .ok_or_else(|| format!("{name} does not fit {l}"))?;
                                Ok((name, b))
                            })
                            .collect::<Result<_, String>>()?;
                        let refs: Vec<(&str, Tensor)> =
                            mine.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
                        outs.push(
                            exec.step(&refs)
                                .map_err(|e| format!("rank {rank} step {step}: {e}"))?,
                        );
                    }
                    let weights = exec
                        .weights()
                        .map(|(n, t)| (n.to_string(), t.clone()))
                        .collect();
                    Ok((outs, weights))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a rank panicked".into())))
            .collect()
    });
    let results: Vec<Run> = results
        .into_iter()
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{what}: {e}"))?;
    for (r, (outs, _)) in results.iter().enumerate() {
        let last = par.program.stage_of(r).map_err(|e| e.to_string())? + 1 == stages;
        for (k, &l) in losses.iter().enumerate() {
            match (last, outs[k].first()) {
                (true, Some(t)) => {
                    let v = t.scalar_value().unwrap_or(f64::NAN);
                    let d = (v - l).abs() / l.abs().max(1e-6);
                    if d > case.tolerance || d.is_nan() {
                        return Err(format!(
                            "{what}: step {} rank {r}: loss {v} vs single device {l}",
                            k + 1
                        ));
                    }
                }
                (true, None) => return Err(format!("{what}: rank {r} returns no loss")),
                (false, Some(_)) => {
                    return Err(format!(
                        "{what}: rank {r} of an early stage returns a value"
                    ))
                }
                (false, None) => {}
            }
        }
    }
    for (name, layout) in &layouts {
        let Some(reference) = exec.param(name) else {
            continue;
        };
        let mut whole = Tensor::zeros(&shardc::ir::TensorType::new(
            reference.dtype(),
            layout.tensor_shape.clone(),
        ));
        let mut holders = 0;
        for (r, (_, w)) in results.iter().enumerate() {
            if let Some((_, t)) = w.iter().find(|(n, _)| n == name) {
                holders += 1;
                if !whole.set_block(&layout.block(r), t) {
                    return Err(format!("{what}: rank {r}'s block of {name} does not fit"));
                }
            }
        }
        if holders != case.device_num / stages {
            return Err(format!(
                "{what}: weight {name} is held by {holders} ranks, not one stage's {}",
                case.device_num / stages
            ));
        }
        let (a, b) = (whole.to_f64_vec(), reference.to_f64_vec());
        let scale = b.iter().fold(1e-4f64, |m, x| m.max(x.abs()));
        let d = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs() / scale)
            .fold(0.0, f64::max);
        if d > case.tolerance || d.is_nan() {
            return Err(format!(
                "{what}: weight {name} differs by {d:.3e} after {STEPS} steps"
            ));
        }
    }
    Ok(())
}

fn run(what: &str, model: Graph, case: Case) {
    if let Err(e) = check(what, model.clone(), model, &case) {
        panic!("{e}");
    }
}

#[test]
fn two_stages_by_two_data_parallel_1f1b_equal_the_single_device() {
    for ce in [false, true] {
        run(
            &format!("mlp (cross-entropy {ce}), S=2 x DP2, M=4, 1f1b"),
            mlp(16, ce, None).expect("model"),
            Case {
                mode: Mode::DataParallel,
                device_num: 4,
                pipeline: pipeline(2, 4, Scheduler::OneFOneB),
                tolerance: TOLERANCE,
            },
        );
    }
}

#[test]
fn two_stages_gpipe_equal_the_single_device() {
    run(
        "mlp, S=2 x DP2, M=4, gpipe, stages marked on the cells",
        mlp(16, false, Some(2)).expect("model"),
        Case {
            mode: Mode::DataParallel,
            device_num: 4,
            pipeline: pipeline(2, 4, Scheduler::GPipe),
            tolerance: TOLERANCE,
        },
    );
}

#[test]
fn four_stages_on_four_devices_equal_the_single_device() {
    run(
        "mlp, S=4 on N=4, M=4, 1f1b, stages marked on the cells",
        mlp(16, false, Some(4)).expect("model"),
        Case {
            mode: Mode::DataParallel,
            device_num: 4,
            pipeline: pipeline(4, 4, Scheduler::OneFOneB),
            tolerance: TOLERANCE,
        },
    );
}

#[test]
fn model_parallel_inside_stages_equals_the_single_device() {
    let model = mlp(16, false, None).expect("model");
    let mut annotated = model.clone();
    // Split the first and third MatMuls' output columns over the stage's 2 devices.
    let mut k = 0;
    for n in annotated.nodes.iter_mut() {
        if n.op == OpKind::MatMul {
            if k % 2 == 0 {
                n.in_strategy = Some(Strategy(vec![vec![1, 1], vec![1, 2]]));
            }
            k += 1;
        }
    }
    if let Err(e) = check(
        "mlp, S=2 x MP2, M=2, 1f1b",
        model,
        annotated,
        &Case {
            mode: Mode::SemiAutoParallel,
            device_num: 4,
            pipeline: pipeline(2, 2, Scheduler::OneFOneB),
            tolerance: TOLERANCE,
        },
    ) {
        panic!("{e}");
    }
}

/// The 2-layer transformer (f32) on 2 stages x 2-way data parallel, 4 micro-batches, both
/// schedulers. Its data inputs are tokens `(batch * seq, hidden)`: micro-batches interleave
/// rows, so only `seq = 1` keeps each sequence whole in one micro-batch (see
/// docs/pipeline.md, Limits).
#[test]
fn a_two_layer_transformer_on_two_stages_equals_the_single_device() {
    use shardc::compiler::transformer::{transformer, TransformerConfig};
    let model = transformer(&TransformerConfig::new(2, 8, 2, 1, 16)).expect("model");
    for scheduler in [Scheduler::OneFOneB, Scheduler::GPipe] {
        run(
            &format!("transformer, S=2 x DP2, M=4, {scheduler}"),
            model.clone(),
            Case {
                mode: Mode::DataParallel,
                device_num: 4,
                pipeline: pipeline(2, 4, scheduler),
                tolerance: 1e-5,
            },
        );
    }
}

/// Micro-batches without stages (MindSpore's gradient accumulation through `PipelineCell` on
/// one device): the step equals the plain one on the global batch.
#[test]
fn micro_batches_on_one_device_accumulate_to_the_global_batch_step() {
    let model = mlp(16, true, None).expect("model");
    let opt = Momentum::new(0.1, 0.9).to_spec();
    let build = |micro_size: usize| {
        compile(
            model.clone(),
            &CompileOptions {
                optimizer: Some(opt),
                pipeline: pipeline(1, micro_size, Scheduler::OneFOneB),
                ..Default::default()
            },
        )
        .expect("compile")
        .graph
    };
    let (plain, micro) = (build(1), build(4));
    assert!(micro
        .nodes
        .iter()
        .any(|n| n.instance == "matmul_micro3" && n.attrs.get("micro_batch").is_some()));
    let data = SyntheticData::new(&plain, 3, STEPS as usize).expect("data");
    let run = |g: Graph| {
        let mut exec =
            Executor::new(g, Arc::new(shardc::cpu::CpuBackend::with_threads(1))).expect("exec");
        let mut losses = Vec::new();
        for step in 0..STEPS {
            let out = exec.step(&data.feeds(step)).expect("step");
            losses.push(out[0].scalar_value().unwrap_or(f64::NAN));
        }
        let w: Vec<Vec<f64>> = ["w0", "w3", "b2"]
            .iter()
            .map(|n| exec.param(n).expect("weight").to_f64_vec())
            .collect();
        (losses, w)
    };
    let (a, b) = (run(plain), run(micro));
    for (x, y) in a.0.iter().zip(&b.0) {
        assert!(
            (x - y).abs() <= TOLERANCE * x.abs().max(1.0),
            "loss {x} vs {y}"
        );
    }
    for (x, y) in a.1.iter().flatten().zip(b.1.iter().flatten()) {
        assert!((x - y).abs() <= TOLERANCE, "weight {x} vs {y}");
    }
}
