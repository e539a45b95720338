//! The one invariant as a property: for random small models (MLP, attention block, conv
//! block with trained or frozen BatchNorm, embedding block), random valid strategies and 2, 4 or 8 devices, the per-rank graphs run together
//! (every rank a thread, the in-process communicator) compute the single device's losses and,
//! after the steps, its weights (gathered from their slices). The models are f64, so the
//! tolerance is tight (1e-9): a wrong block, group or scale shows at once. The
//! `auto_parallel` cases rotate through every searcher (sharding propagation, recursive and
//! dynamic programming, the ILP), so searched strategies are held to the same invariant.
//!
//! Each case is generated from its seed; a failure prints the seed, the model and the
//! strategies, and `SHARDC_CASE=seed cargo nextest run --test parallel_invariant` reruns that
//! one case alone.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use shardc::compiler::builder::{BuildError, GraphBuilder, Value};
use shardc::compiler::loss::{MSELoss, SoftmaxCrossEntropyExpand, SoftmaxCrossEntropyWithLogits};
use shardc::compiler::model::build_network;
use shardc::compiler::nn::{call_cell, BatchNorm2d, FnCell};
use shardc::compiler::{compile, init, optim::Momentum, CompileOptions};
use shardc::ir::{Attr, Attrs, DType, Graph, OpKind, Strategy, TensorLayout};
use shardc::passes::parallel::rules::{candidates, dims_of, strategy_from_loops};
use shardc::passes::parallel::{DatasetLayout, Mode, ParallelOptions, SearchMode, SearchOptions};
use shardc::runtime::data::SyntheticData;
use shardc::runtime::executor::Executor;
use shardc::runtime::Tensor;
use shardc_tools::in_process::{run_ranks, tensor_rel};

mod invariant_common;
use invariant_common::{annotate, feeds_of, layouts_of, pick, SingleDevice};
use std::sync::Arc;

const CASES: u64 = 320;
/// The model families, taken in turn by seed.
const FAMILIES: u64 = 4;
/// The searchers the auto_parallel cases rotate through.
const SEARCHERS: [SearchMode; 4] = [
    SearchMode::ShardingPropagation,
    SearchMode::RecursiveProgramming,
    SearchMode::DynamicProgramming,
    SearchMode::Ilp,
];
const STEPS: u64 = 2;
/// The models run in f64, so that what is compared is the partitioning, not f32 rounding.
const DT: DType = DType::Float64;
const TOLERANCE: f64 = 1e-9;

fn mlp(rng: &mut ChaCha8Rng, batch: usize) -> Result<Graph, BuildError> {
    let layers = rng.random_range(1..=3);
    let mut dims = vec![*pick(rng, &[8usize, 16, 32])];
    for _ in 0..layers {
        dims.push(*pick(rng, &[8usize, 16, 32]));
    }
    let act = rng.random_range(0..5);
    let bias = rng.random_bool(0.5);
    let d = dims.clone();
    let net = FnCell::new("Mlp", move |b: &mut GraphBuilder, mut x: Value| {
        for (i, w) in d.windows(2).enumerate() {
            let wt = b.weight(&format!("w{i}"), DT, &[w[0], w[1]], init::normal(0.1))?;
            x = b.matmul(x, wt)?;
            if bias {
                let bb = b.weight(&format!("b{i}"), DT, &[w[1]], init::normal(0.1))?;
                x = b.bias_add(x, bb)?;
            }
            if i + 2 < d.len() || act == 2 {
                x = match act {
                    0 => b.relu(x)?,
                    1 => b.gelu(x)?,
                    2 => b.tanh(x)?,
                    3 => b.silu(x)?,
                    _ => b.erf(x)?,
                };
            }
        }
        Ok(x)
    });
    let out = *dims.last().unwrap_or(&8);
    match rng.random_range(0..3) {
        0 => build_network(
            "Mlp",
            &net,
            &MSELoss::new(),
            &[("x", DT, &[batch, dims[0]]), ("label", DT, &[batch, out])],
        ),
        1 => build_network(
            "Mlp",
            &net,
            &SoftmaxCrossEntropyWithLogits::new(true, "mean"),
            &[
                ("x", DT, &[batch, dims[0]]),
                ("label", DType::Int32, &[batch]),
            ],
        ),
        _ => build_network(
            "Mlp",
            &net,
            &SoftmaxCrossEntropyExpand::new(true),
            &[
                ("x", DT, &[batch, dims[0]]),
                ("label", DType::Int32, &[batch]),
            ],
        ),
    }
}

fn attention(rng: &mut ChaCha8Rng, batch: usize) -> Result<Graph, BuildError> {
    let heads = *pick(rng, &[1usize, 2, 4]);
    let hidden = heads * *pick(rng, &[2usize, 4]);
    let seq = *pick(rng, &[2usize, 4]);
    let norm = rng.random_bool(0.5);
    let (b_, s_, a_, h_) = (batch as i64, seq as i64, heads as i64, hidden as i64);
    let net = FnCell::new("Attn", move |b: &mut GraphBuilder, x: Value| {
        let proj = |b: &mut GraphBuilder, name: &str, x: Value| -> Result<Value, BuildError> {
            let w = b.weight(name, DT, &[hidden, hidden], init::normal(0.2))?;
            b.matmul(x, w)
        };
        let heads_of = |b: &mut GraphBuilder, v: Value| -> Result<Value, BuildError> {
            let r = b.reshape(v, &[b_, s_, a_, h_ / a_])?;
            b.transpose(r, &[0, 2, 1, 3])
        };
        let q = proj(b, "wq", x)?;
        let k = proj(b, "wk", x)?;
        let v = proj(b, "wv", x)?;
        let (q, k, v) = (heads_of(b, q)?, heads_of(b, k)?, heads_of(b, v)?);
        let s = b.batch_matmul(q, k, false, true)?;
        let s = b.mul_scalar(s, 1.0 / ((hidden / heads) as f64).sqrt())?;
        let p = b.softmax(s, -1)?;
        let o = b.batch_matmul(p, v, false, false)?;
        let o = b.transpose(o, &[0, 2, 1, 3])?;
        let o = b.reshape(o, &[b_ * s_, h_])?;
        let o = proj(b, "wo", o)?;
        let o = b.add(o, x)?;
        if norm {
            let g = b.weight("gamma", DT, &[hidden], init::ones())?;
            let be = b.weight("beta", DT, &[hidden], init::zeros())?;
            let ln = b.op(
                OpKind::LayerNorm,
                &[o.into(), g.into(), be.into()],
                Attrs::new()
                    .with("begin_norm_axis", Attr::Int(-1))
                    .with("begin_params_axis", Attr::Int(-1)),
            )?;
            b.tuple_get_item(ln, 0)
        } else {
            Ok(o)
        }
    });
    build_network(
        "Attn",
        &net,
        &MSELoss::new(),
        &[
            ("x", DT, &[batch * seq, hidden]),
            ("label", DT, &[batch * seq, hidden]),
        ],
    )
}

/// A conv block: its sizes and choices.
#[derive(Clone, Copy)]
struct ConvBlock {
    cin: usize,
    cout: usize,
    hw: usize,
    /// 0: none, 1: MaxPool 2x2, 2: AvgPool 2x2 (when the side is even).
    pool: usize,
    classes: usize,
    bn: bool,
    frozen_bn: bool,
    /// The window: 0 padded, 1 `same` with stride 2, 2 `valid`, 3 dilated.
    window: usize,
}

fn conv(rng: &mut ChaCha8Rng, batch: usize) -> Result<Graph, BuildError> {
    let c = ConvBlock {
        cin: *pick(rng, &[1usize, 2, 4]),
        cout: *pick(rng, &[2usize, 4, 8]),
        hw: *pick(rng, &[4usize, 6, 8]),
        pool: rng.random_range(0..3),
        classes: *pick(rng, &[4usize, 8]),
        bn: rng.random_bool(0.4),
        frozen_bn: rng.random_bool(0.5),
        window: rng.random_range(0..4),
    };
    conv_with(c, batch)
}

fn conv_with(c: ConvBlock, batch: usize) -> Result<Graph, BuildError> {
    let ConvBlock {
        cin,
        cout,
        hw,
        pool,
        classes,
        bn,
        frozen_bn,
        window,
    } = c;
    let conv_side = match window {
        1 => hw.div_ceil(2),
        2 => hw - 2,
        _ => hw,
    };
    let net = FnCell::new("ConvNet", move |b: &mut GraphBuilder, x: Value| {
        let w = b.weight("conv_w", DT, &[cout, cin, 3, 3], init::normal(0.2))?;
        let attrs = Attrs::new()
            .with("out_channel", Attr::Int(cout as i64))
            .with("kernel_size", Attr::ints(&[3, 3]));
        let attrs = match window {
            0 => attrs
                .with("pad_mode", Attr::Str("pad".into()))
                .with("pad", Attr::ints(&[1, 1, 1, 1])),
            1 => attrs
                .with("pad_mode", Attr::Str("same".into()))
                .with("stride", Attr::ints(&[2, 2])),
            2 => attrs.with("pad_mode", Attr::Str("valid".into())),
            _ => attrs
                .with("pad_mode", Attr::Str("pad".into()))
                .with("pad", Attr::ints(&[2, 2, 2, 2]))
                .with("dilation", Attr::ints(&[2, 2])),
        };
        let y = b.op(OpKind::Conv2D, &[x.into(), w.into()], attrs)?;
        let bias = b.weight("conv_b", DT, &[cout], init::normal(0.1))?;
        let y = b.bias_add(y, bias)?;
        let y = if bn {
            // A frozen BatchNorm (inference mode in a training graph, as when fine-tuning)
            // normalizes with its moving statistics.
            let training = b.is_training();
            b.set_training(training && !frozen_bn);
            let y = call_cell(b, "bn", &BatchNorm2d::new(cout), y)?;
            b.set_training(training);
            y
        } else {
            y
        };
        let y = b.relu(y)?;
        let (y, side) = match pool {
            // A 2x2 pool needs an even side.
            k if k == 0 || conv_side % 2 == 1 => (y, conv_side),
            k => {
                let op = if k == 1 {
                    OpKind::MaxPool
                } else {
                    OpKind::AvgPool
                };
                let p = b.op(
                    op,
                    &[y.into()],
                    Attrs::new()
                        .with("kernel_size", Attr::ints(&[2, 2]))
                        .with("strides", Attr::ints(&[2, 2]))
                        .with("pad_mode", Attr::Str("valid".into())),
                )?;
                (p, conv_side / 2)
            }
        };
        let flat = b.reshape(y, &[batch as i64, (cout * side * side) as i64])?;
        let fc = b.weight(
            "fc_w",
            DT,
            &[cout * side * side, classes],
            init::normal(0.1),
        )?;
        b.matmul(flat, fc)
    });
    build_network(
        "ConvNet",
        &net,
        &SoftmaxCrossEntropyWithLogits::new(true, "mean"),
        &[
            ("x", DT, &[batch, cin, hw, hw]),
            ("label", DType::Int32, &[batch]),
        ],
    )
}

/// An embedding block: a Gather from a table (whose rows the strategies may split, a
/// vocabulary split), pooled over the sequence by a mean or flattened, then a dense layer.
fn embedding(rng: &mut ChaCha8Rng, batch: usize) -> Result<Graph, BuildError> {
    let vocab = *pick(rng, &[8usize, 16, 32]);
    let dim = *pick(rng, &[4usize, 8]);
    let seq = *pick(rng, &[2usize, 4]);
    let classes = *pick(rng, &[4usize, 8]);
    let pool = rng.random_bool(0.5);
    let net = FnCell::new("Embed", move |b: &mut GraphBuilder, idx: Value| {
        let table = b.weight("table", DT, &[vocab, dim], init::normal(0.5))?;
        let e = b.gather(table, idx, 0)?;
        let (h, width) = if pool {
            (b.reduce_mean(e, &[1], false)?, dim)
        } else {
            let flat = b.reshape(e, &[batch as i64, (seq * dim) as i64])?;
            (flat, seq * dim)
        };
        let w = b.weight("fc_w", DT, &[width, classes], init::normal(0.3))?;
        b.matmul(h, w)
    });
    build_network(
        "Embed",
        &net,
        &SoftmaxCrossEntropyWithLogits::new(true, "mean"),
        &[
            ("idx", DType::Int32, &[batch, seq]),
            ("label", DType::Int32, &[batch]),
        ],
    )
}

/// Which rarer rules a case's per-rank graphs exercise (the property test checks that the
/// random cases reach each of them).
#[derive(Default, Debug, Clone, Copy)]
struct Reached {
    /// A Gather from a block of a table split along the gathered axis.
    vocab_split: bool,
    /// An UnsortedSegmentSum into a block of segments (the table's gradient, split).
    segment_split: bool,
    /// A frozen (inference-mode) BatchNorm with its batch split.
    frozen_bn_batch_split: bool,
    /// A Conv2D whose output rows or columns are split (it reads a window of its input).
    conv_spatial_split: bool,
    /// A convolution gradient whose dy rows or columns are split.
    conv_grad_spatial_split: bool,
    /// A MaxPool or AvgPool whose output rows or columns are split.
    pool_spatial_split: bool,
}

fn reached(rank0: &Graph) -> Reached {
    let mut r = Reached::default();
    for n in &rank0.nodes {
        let marked = n.attrs.get("offset").is_some();
        let spatial = n
            .in_strategy
            .as_ref()
            .and_then(|s| s.0.first())
            .is_some_and(|x| x.iter().skip(2).any(|&s| s > 1));
        match n.op {
            OpKind::Gather => r.vocab_split |= marked,
            OpKind::UnsortedSegmentSum => r.segment_split |= marked,
            OpKind::BatchNorm if !n.attrs.bool_or("is_training", true) => {
                r.frozen_bn_batch_split |= n
                    .in_strategy
                    .as_ref()
                    .and_then(|s| s.0.first())
                    .is_some_and(|x| x.first().is_some_and(|&b| b > 1));
            }
            OpKind::Conv2D => r.conv_spatial_split |= spatial,
            OpKind::MaxPool | OpKind::AvgPool => r.pool_spatial_split |= spatial,
            OpKind::Conv2DBackpropInput | OpKind::Conv2DBackpropFilter => {
                r.conv_grad_spatial_split |= spatial
            }
            _ => {}
        }
    }
    r
}

/// Runs one case; `Err` describes the failure.
fn run_case(seed: u64) -> Result<Reached, String> {
    let (what, model, annotated, case) = case_of(seed)?;
    check_case(&what, model, annotated, &case)
}

/// The random case of `seed`: its description, the model, the annotated model and how it
/// compiles.
fn case_of(seed: u64) -> Result<(String, Graph, Graph, Case), String> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let device_num = *pick(&mut rng, &[2usize, 4, 8]);
    let batch = device_num * *pick(&mut rng, &[1usize, 2]);
    let kind = seed % FAMILIES;
    let model = match kind {
        0 => mlp(&mut rng, batch),
        1 => attention(&mut rng, batch),
        2 => conv(&mut rng, batch),
        _ => embedding(&mut rng, batch),
    }
    .map_err(|e| format!("building the model: {e}"))?;
    let mode = if rng.random_bool(0.5) {
        Mode::SemiAutoParallel
    } else {
        Mode::AutoParallel
    };
    let mut annotated = model.clone();
    let p = if mode == Mode::AutoParallel { 0.3 } else { 0.5 };
    let notes = annotate(&mut rng, &mut annotated, device_num, p);
    let dataset = if rng.random_bool(0.8) {
        DatasetLayout::DataParallel
    } else {
        DatasetLayout::FullBatch
    };
    let alltoall = rng.random_bool(0.3);
    // In auto_parallel, every searcher in turn decides what the annotations leave open.
    let search = if mode == Mode::AutoParallel {
        SEARCHERS[(seed / FAMILIES) as usize % SEARCHERS.len()]
    } else {
        SearchMode::ShardingPropagation
    };
    let what = format!(
        "seed {seed}: {} on {device_num} devices, {mode:?} ({}), {dataset:?}, alltoall {alltoall}, strategies [{}]",
        model.name,
        search.name(),
        notes.join("; ")
    );
    let case = Case {
        seed,
        device_num,
        mode,
        dataset,
        alltoall,
        search,
    };
    Ok((what, model, annotated, case))
}

/// How one case compiles.
struct Case {
    seed: u64,
    device_num: usize,
    mode: Mode,
    dataset: DatasetLayout,
    alltoall: bool,
    search: SearchMode,
}

/// Compiles `model` on one device and `annotated` on `case.device_num`, trains both
/// [`STEPS`] steps on the same data and compares losses and weights.
fn check_case(what: &str, model: Graph, annotated: Graph, case: &Case) -> Result<Reached, String> {
    let opt = Momentum::new(0.1, 0.9).to_spec();
    check_case_with(what, model, annotated, case, Some(opt))
}

/// As [`check_case`], with the optimizer that builds the training step; `None` compiles the
/// graphs as they are (training steps built already, their generated ops annotated).
fn check_case_with(
    what: &str,
    model: Graph,
    annotated: Graph,
    case: &Case,
    optimizer: Option<shardc::passes::autodiff::Optimizer>,
) -> Result<Reached, String> {
    let Case {
        seed,
        device_num,
        mode,
        ref dataset,
        alltoall,
        search,
    } = *case;
    let single = compile(
        model,
        &CompileOptions {
            optimizer,
            ..Default::default()
        },
    )
    .map_err(|e| format!("{what}: single-device compile: {e}"))?
    .graph;
    let par = compile(
        annotated,
        &CompileOptions {
            optimizer,
            parallel: Some(ParallelOptions {
                mode,
                device_num,
                dataset: dataset.clone(),
                gradients_mean: true,
                enable_alltoall: alltoall,
                search: SearchOptions {
                    mode: search,
                    ..Default::default()
                },
                parallel_optimizer: None,
            }),
            // `SHARDC_CASE_DUMP=DIR` writes the case's dumps (with `SHARDC_CASE=seed`).
            dump_dir: std::env::var_os("SHARDC_CASE_DUMP").map(std::path::PathBuf::from),
            ..Default::default()
        },
    )
    .map_err(|e| format!("{what}: parallel compile: {e}"))?
    .parallel
    .ok_or_else(|| format!("{what}: no per-rank graphs"))?;

    let reference = SingleDevice::run(what, single, seed, STEPS)?;
    let layouts = layouts_of(&par);
    let inputs = reference.inputs(&layouts);
    let reach = par.ranks.first().map(reached).unwrap_or_default();
    let data = &reference.data;
    let feeds = |step: u64| feeds_of(data, step);
    let res =
        run_ranks(par.ranks, &inputs, &feeds, STEPS, 1).map_err(|e| format!("{what}: {e:#}"))?;
    // Every rank returns the global loss.
    if let Some(r) = res.outputs.iter().position(|o| o.iter().any(Vec::is_empty)) {
        return Err(format!("{what}: rank {r} returned no loss"));
    }
    reference.check(what, &res, &layouts, TOLERANCE)?;
    Ok(reach)
}

#[test]
fn distributed_equals_single_device_on_random_models_and_strategies() {
    let only: Option<u64> = std::env::var("SHARDC_CASE")
        .ok()
        .and_then(|s| s.parse().ok());
    let seeds: Vec<u64> = match only {
        Some(s) => vec![s],
        None => (0..CASES).collect(),
    };
    let mut failures = Vec::new();
    let (mut vocab, mut segment, mut frozen_bn, mut conv, mut conv_grad) = (0, 0, 0, 0, 0);
    for seed in seeds {
        match run_case(seed) {
            Ok(r) => {
                vocab += r.vocab_split as usize;
                segment += r.segment_split as usize;
                frozen_bn += r.frozen_bn_batch_split as usize;
                conv += r.conv_spatial_split as usize;
                conv_grad += r.conv_grad_spatial_split as usize;
            }
            Err(e) => failures.push(e),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {CASES} cases failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    eprintln!(
        "cases with a vocabulary-split Gather: {vocab}, a segment-split UnsortedSegmentSum: \
         {segment}, a frozen BatchNorm with its batch split: {frozen_bn}, a Conv2D with split \
         rows or columns: {conv}, a convolution gradient with split rows or columns: {conv_grad}"
    );
    if only.is_none() {
        for (what, n) in [
            ("a vocabulary-split Gather", vocab),
            ("a segment-split UnsortedSegmentSum", segment),
            ("a frozen BatchNorm with its batch split", frozen_bn),
            ("a Conv2D with split rows or columns", conv),
        ] {
            // Convolution gradients with split rows or columns: the planner picks the
            // backward's strategies by cost and seldom splits them, so
            // `convolutions_with_split_rows_and_columns_equal_the_single_device` annotates 16
            // of them itself.
            assert!(n >= 3, "only {n} cases reach {what}");
        }
    }
}

/// `gradients_mean = false` is MindSpore's data-parallel sum of the replicas' gradients, each of
/// its own local-mean loss: `N` times the single device's gradient of the global mean. One
/// plain-SGD step on `N` ranks with learning rate `lr` must therefore equal one single-device
/// step with `N * lr`; with `gradients_mean = true` it equals the step with `lr`.
#[test]
fn gradients_mean_false_sums_the_replicas_gradients() {
    use shardc::compiler::optim::SGD;
    let n = 4usize;
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let model = mlp(&mut rng, 8).unwrap();
    for mean in [true, false] {
        let lr = 0.1;
        let single_lr = if mean { lr } else { lr * n as f64 };
        let single = compile(
            model.clone(),
            &CompileOptions {
                optimizer: Some(SGD::new(single_lr).to_spec()),
                ..Default::default()
            },
        )
        .unwrap()
        .graph;
        let par = compile(
            model.clone(),
            &CompileOptions {
                optimizer: Some(SGD::new(lr).to_spec()),
                parallel: Some(ParallelOptions {
                    mode: Mode::DataParallel,
                    device_num: n,
                    dataset: DatasetLayout::DataParallel,
                    gradients_mean: mean,
                    enable_alltoall: false,
                    search: Default::default(),
                    parallel_optimizer: None,
                }),
                ..Default::default()
            },
        )
        .unwrap()
        .parallel
        .unwrap();
        let scaled = par.ranks[0]
            .nodes
            .iter()
            .any(|nd| nd.instance.starts_with("mirror_grad_sum_"));
        assert_eq!(
            scaled, !mean,
            "the mirror scale appears exactly without gradients_mean"
        );
        let data = SyntheticData::new(&single, 3, 1).unwrap();
        let feeds = |step: u64| -> Vec<(String, Tensor)> {
            data.feeds(step)
                .into_iter()
                .map(|(k, t)| (k.to_string(), t))
                .collect()
        };
        let mut exec =
            Executor::new(single, Arc::new(shardc::cpu::CpuBackend::with_threads(1))).unwrap();
        let f = feeds(0);
        let refs: Vec<(&str, Tensor)> = f.iter().map(|(k, t)| (k.as_str(), t.clone())).collect();
        exec.step(&refs).unwrap();
        let layouts: Vec<(String, TensorLayout)> = par
            .begin
            .params
            .iter()
            .zip(&par.assignment.param_layouts)
            .map(|(p, l)| (p.name.clone(), l.clone()))
            .collect();
        let inputs: Vec<(String, TensorLayout)> = layouts
            .iter()
            .filter(|(k, _)| exec.param(k).is_none())
            .cloned()
            .collect();
        let res = run_ranks(par.ranks, &inputs, &feeds, 1, 1).unwrap();
        for (name, layout) in &layouts {
            let Some(reference) = exec.param(name) else {
                continue;
            };
            let whole = res.gathered_weight(name, layout).unwrap();
            let d = tensor_rel(&whole, reference);
            assert!(
                d <= TOLERANCE,
                "gradients_mean {mean}: {name} differs by {d:.3e}"
            );
        }
    }
}

/// Conv2D with its output rows, columns or both split (every rank reads the window of the
/// input its block needs, with that window's padding), for every kind of window: padded,
/// `same` with stride 2, `valid`, dilated; followed by a MaxPool or AvgPool split alike, or
/// by nothing, on 4 devices.
#[test]
fn convolutions_with_split_rows_and_columns_equal_the_single_device() {
    let mut failures = Vec::new();
    let mut n = 0;
    let mut pools = 0;
    let mut grads = 0;
    for window in 0..4 {
        // A `valid` window gives 6 rows, which 4 does not divide.
        let rows = if window == 2 { 2 } else { 4 };
        for (k, split) in [[1i64, 1, 2, 2], [1, 1, rows, 1], [1, 1, 1, 2], [2, 1, 2, 1]]
            .iter()
            .enumerate()
        {
            let block = ConvBlock {
                cin: 2,
                cout: 4,
                hw: 8,
                pool: k % 3,
                classes: 4,
                bn: k == 3,
                frozen_bn: false,
                window,
            };
            let model = conv_with(block, 4).unwrap();
            let mut annotated = model.clone();
            let conv = annotated
                .nodes
                .iter_mut()
                .find(|n| n.op == OpKind::Conv2D)
                .unwrap();
            conv.in_strategy = Some(Strategy(vec![split.to_vec(), vec![1, 1, 1, 1]]));
            // The pool after it (if any) split alike where its pooled rows and columns allow.
            let mut pool_split = false;
            if let Some(pool) = annotated
                .nodes
                .iter_mut()
                .find(|n| matches!(n.op, OpKind::MaxPool | OpKind::AvgPool))
            {
                let pooled = pool.ty.tensors()[0].shape.clone();
                if pooled[2] % split[2] as usize == 0 && pooled[3] % split[3] as usize == 0 {
                    pool.in_strategy = Some(Strategy(vec![split.to_vec()]));
                    pool_split = split[2] * split[3] > 1;
                }
            }
            let what =
                format!("window {window}, Conv2D in_strategy {split:?}, pool split {pool_split}");
            let case = Case {
                seed: 100 + n,
                device_num: 4,
                mode: Mode::SemiAutoParallel,
                dataset: DatasetLayout::DataParallel,
                alltoall: false,
                search: SearchMode::ShardingPropagation,
            };
            n += 1;
            match check_case(&what, model.clone(), annotated.clone(), &case) {
                Ok(r) if r.conv_spatial_split && r.pool_spatial_split == pool_split => {
                    pools += pool_split as usize;
                }
                Ok(r) => failures.push(format!("{what}: the rank graph reaches {r:?}")),
                Err(e) => failures.push(e),
            }
            // The gradients split alike. The planner now picks the backward's strategies by
            // cost (and rarely splits a gradient's rows), so the training step is built here
            // and its convolution gradients are annotated with the forward's spatial split,
            // as a strategy file could.
            if split[2] * split[3] > 1 {
                let what = format!("{what}, gradients split alike");
                let opt = Momentum::new(0.1, 0.9).to_spec();
                let step = |g: Graph| {
                    compile(
                        g,
                        &CompileOptions {
                            optimizer: Some(opt),
                            ..Default::default()
                        },
                    )
                    .map(|c| c.graph)
                };
                let (Ok(train), Ok(mut train_annotated)) = (step(model), step(annotated)) else {
                    failures.push(format!("{what}: building the training step failed"));
                    continue;
                };
                let mut forced = 0;
                for i in 0..train_annotated.nodes.len() {
                    let node = &train_annotated.nodes[i];
                    if !matches!(
                        node.op,
                        OpKind::Conv2DBackpropInput | OpKind::Conv2DBackpropFilter
                    ) {
                        continue;
                    }
                    let Ok(dims) = dims_of(&train_annotated, node) else {
                        continue;
                    };
                    let nl = dims.loop_sizes.len();
                    let want = |c: &Vec<usize>| {
                        c[nl - 2] == split[2] as usize
                            && c[nl - 1] == split[3] as usize
                            && c[..nl - 2].iter().all(|&x| x == 1)
                    };
                    if let Some(c) = candidates(&train_annotated, node, &dims, 4, 8)
                        .into_iter()
                        .find(want)
                    {
                        let st = strategy_from_loops(&train_annotated, node, &dims, &c);
                        train_annotated.nodes[i].in_strategy = Some(st);
                        forced += 1;
                    }
                }
                match check_case_with(&what, train, train_annotated, &case, None) {
                    Ok(r) if forced > 0 && r.conv_grad_spatial_split => grads += 1,
                    Ok(r) => failures.push(format!(
                        "{what}: {forced} gradients annotated; the rank graph reaches {r:?}"
                    )),
                    Err(e) => failures.push(e),
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(
        pools >= 4,
        "only {pools} cases split a pool's rows or columns"
    );
    assert!(
        grads >= 8,
        "only {grads} cases split a convolution gradient's rows or columns"
    );
}

/// The program every rank runs, written once, materializes each rank into exactly the graph
/// the per-rank partition gives it (then gradient fusion on each), on every random case of
/// the invariant and every rank, and on the convolution cases with split rows and columns
/// (whose windows differ from rank to rank).
#[test]
fn every_rank_materialized_from_the_program_is_its_per_rank_partition() {
    use shardc::passes::grad_fusion::{fuse_owned, fuse_program, GradFusion};
    use shardc::passes::parallel::{partition, strategy, sync_bn};
    let mut failures = Vec::new();
    let (mut ranks, mut variants) = (0, 0);
    let mut check = |what: &str, annotated: Graph, case: &Case| {
        let opt = Momentum::new(0.1, 0.9).to_spec();
        let train = match compile(
            annotated,
            &CompileOptions {
                optimizer: Some(opt),
                ..Default::default()
            },
        ) {
            Ok(c) => c.graph,
            Err(e) => return failures.push(format!("{what}: {e}")),
        };
        let opts = ParallelOptions {
            mode: case.mode,
            device_num: case.device_num,
            dataset: case.dataset.clone(),
            gradients_mean: true,
            enable_alltoall: case.alltoall,
            search: SearchOptions {
                mode: case.search,
                ..Default::default()
            },
            parallel_optimizer: None,
        };
        let result = (|| -> Result<(), String> {
            let g = sync_bn::sync_batch_norm(&train).map_err(|e| e.to_string())?;
            let a = strategy::assign(&g, &opts).map_err(|e| e.to_string())?;
            let program = partition::program(&g, &a, &opts).map_err(|e| e.to_string())?;
            let (program, _) =
                fuse_program(program, &GradFusion::Each).map_err(|e| e.to_string())?;
            variants += program
                .patches
                .iter()
                .filter(|p| matches!(p, shardc::ir::spmd::Patch::Variants { .. }))
                .count();
            for r in 0..case.device_num {
                let rg = partition::rank_graph(&g, &a, &opts, r).map_err(|e| e.to_string())?;
                let (reference, _) =
                    fuse_owned(rg, &GradFusion::Each).map_err(|e| e.to_string())?;
                let materialized = program.materialize(r).map_err(|e| e.to_string())?;
                if materialized != reference {
                    let (x, y) = (
                        shardc::ir::text::print_graph(&materialized),
                        shardc::ir::text::print_graph(&reference),
                    );
                    let line = x
                        .lines()
                        .zip(y.lines())
                        .find(|(a, b)| a != b)
                        .map(|(a, b)| format!("materialized `{a}`, partition `{b}`"))
                        .unwrap_or_else(|| "the graphs differ in length".into());
                    return Err(format!("rank {r}: {line}"));
                }
                ranks += 1;
            }
            Ok(())
        })();
        if let Err(e) = result {
            failures.push(format!("{what}: {e}"));
        }
    };
    for seed in 0..CASES {
        let (what, _, annotated, case) = case_of(seed).unwrap();
        check(&what, annotated, &case);
    }
    for (k, split) in [[1i64, 1, 2, 2], [1, 1, 4, 1], [2, 1, 2, 1]]
        .iter()
        .enumerate()
    {
        let block = ConvBlock {
            cin: 2,
            cout: 4,
            hw: 8,
            pool: k % 3,
            classes: 4,
            bn: k == 2,
            frozen_bn: false,
            window: k,
        };
        let mut annotated = conv_with(block, 4).unwrap();
        let conv = annotated
            .nodes
            .iter_mut()
            .find(|n| n.op == OpKind::Conv2D)
            .unwrap();
        conv.in_strategy = Some(Strategy(vec![split.to_vec(), vec![1, 1, 1, 1]]));
        let case = Case {
            seed: 200 + k as u64,
            device_num: 4,
            mode: Mode::SemiAutoParallel,
            dataset: DatasetLayout::DataParallel,
            alltoall: false,
            search: SearchMode::ShardingPropagation,
        };
        check(&format!("conv {split:?}"), annotated, &case);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(ranks > 1000, "only {ranks} ranks compared");
    assert!(
        variants > 0,
        "no case had windows that differ between ranks"
    );
    eprintln!("{ranks} ranks materialized and compared; {variants} window variant patches");
}
