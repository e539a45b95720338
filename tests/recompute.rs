//! Recomputation (`cell.recompute()`): the replayed forward computes the same numbers as the
//! kept one, bit for bit (one device with a Dropout in the recomputed region, and in-process
//! ranks of a transformer under a strategy), and the liveness memory plan of a transformer
//! whose layers are recomputed peaks lower than without.

use shardc::compiler::loss::MSELoss;
use shardc::compiler::model::build_network;
use shardc::compiler::nn::{Cell, Dense, Dropout, SequentialCell};
use shardc::compiler::optim::{Adam, Momentum};
use shardc::compiler::transformer::{transformer, TransformerConfig};
use shardc::compiler::{compile, CompileOptions};
use shardc::ir::{DType, Graph, OpKind, Strategy, TensorLayout};
use shardc::passes::autodiff::Optimizer;
use shardc::passes::parallel::{DatasetLayout, Mode, ParallelOptions, SearchOptions};
use shardc::passes::recompute::replayed_count;
use shardc::runtime::data::SyntheticData;
use shardc::runtime::executor::Executor;
use shardc::runtime::memory::plan;
use shardc::runtime::Tensor;
use shardc_tools::in_process::run_ranks;
use std::sync::Arc;

const STEPS: u64 = 4;

/// A tensor's elements as bits (f32 widens to f64 exactly, so equal bits are equal values).
fn bits(t: &Tensor) -> Vec<u64> {
    t.to_f64_vec().into_iter().map(f64::to_bits).collect()
}

/// Dense(16 -> 32, relu) -> Dropout(0.8) -> Dense(32 -> 32, relu) -> Dense(32 -> 8), the first
/// two layers and the Dropout in one cell that is recomputed when `recompute`.
fn mlp(recompute: bool) -> Graph {
    let body = SequentialCell::new(vec![
        Box::new(Dense::new(16, 32).activation(shardc::compiler::nn::Activation::ReLU)),
        Box::new(Dropout::new(0.8)),
        Box::new(Dense::new(32, 32).activation(shardc::compiler::nn::Activation::ReLU)),
    ]);
    let head = Dense::new(32, 8);
    let net: SequentialCell = if recompute {
        SequentialCell::named(vec![
            ("body", Box::new(body.recompute())),
            ("head", Box::new(head)),
        ])
    } else {
        SequentialCell::named(vec![("body", Box::new(body)), ("head", Box::new(head))])
    };
    build_network(
        "Mlp",
        &net,
        &MSELoss::new(),
        &[
            ("x", DType::Float32, &[8, 16]),
            ("label", DType::Float32, &[8, 8]),
        ],
    )
    .expect("mlp builds")
}

/// Losses of every step and the weights after [`STEPS`] steps on one device.
/// Every step's loss and the named weights at the end, as bits.
type Trained = (Vec<Vec<u64>>, Vec<(String, Vec<u64>)>);

fn train_one_device(g: Graph, opt: Optimizer) -> Trained {
    let step = compile(
        g,
        &CompileOptions {
            optimizer: Some(opt),
            ..Default::default()
        },
    )
    .expect("compiles")
    .graph;
    let data = SyntheticData::new(&step, 5, STEPS as usize).expect("data");
    let mut exec =
        Executor::new(step, Arc::new(shardc::cpu::CpuBackend::with_threads(1))).expect("exec");
    let mut losses = Vec::new();
    for s in 0..STEPS {
        let feeds = data.feeds(s);
        let refs: Vec<(&str, Tensor)> = feeds.iter().map(|(n, t)| (&**n, t.clone())).collect();
        let out = exec.step(&refs).expect("step");
        losses.push(bits(&out[0]));
    }
    let weights = exec
        .weights()
        .map(|(n, t)| (n.to_string(), bits(t)))
        .collect();
    (losses, weights)
}

#[test]
fn a_recomputed_dense_and_dropout_train_bit_for_bit_as_kept_ones() {
    let (plain, marked) = (mlp(false), mlp(true));
    let marks = marked
        .nodes
        .iter()
        .filter(|n| n.attrs.get("recompute").is_some())
        .count();
    assert!(marks > 0, "recompute() marks the cell's nodes");
    // The recomputed step replays the Dropout (same seeds: same mask).
    let step = compile(
        marked.clone(),
        &CompileOptions {
            optimizer: Some(Momentum::new(0.1, 0.9).to_spec()),
            ..Default::default()
        },
    )
    .expect("compiles")
    .graph;
    assert!(
        step.nodes
            .iter()
            .any(|n| n.op == OpKind::Dropout && n.instance.ends_with("_recompute")),
        "the Dropout is replayed"
    );
    for opt in [Momentum::new(0.1, 0.9).to_spec(), Adam::new(0.01).to_spec()] {
        let a = train_one_device(plain.clone(), opt);
        let b = train_one_device(marked.clone(), opt);
        assert_eq!(a.0, b.0, "losses differ");
        assert_eq!(a.1, b.1, "weights differ");
    }
}

/// Rank graphs of `g` on 4 devices (semi-auto, the feed-forward input split by columns).
fn ranks(g: Graph) -> (Vec<Graph>, Vec<(String, TensorLayout)>, Graph) {
    let opt = Momentum::new(0.1, 0.9).to_spec();
    let single = compile(
        g.clone(),
        &CompileOptions {
            optimizer: Some(opt),
            ..Default::default()
        },
    )
    .expect("single")
    .graph;
    let p = compile(
        g,
        &CompileOptions {
            optimizer: Some(opt),
            parallel: Some(ParallelOptions {
                mode: Mode::SemiAutoParallel,
                device_num: 4,
                dataset: DatasetLayout::DataParallel,
                gradients_mean: true,
                enable_alltoall: false,
                search: SearchOptions::default(),
                parallel_optimizer: None,
            }),
            ..Default::default()
        },
    )
    .expect("parallel")
    .parallel
    .expect("ranks");
    let inputs = p
        .begin
        .params
        .iter()
        .zip(&p.assignment.param_layouts)
        .filter(|(q, _)| !q.is_weight())
        .map(|(q, l)| (q.name.clone(), l.clone()))
        .collect();
    (p.ranks, inputs, single)
}

#[test]
fn recomputed_transformer_ranks_train_bit_for_bit_as_plain_ones() {
    let cfg = TransformerConfig::new(2, 16, 2, 4, 4).annotate(
        "layer0_ffn_in_matmul",
        Strategy(vec![vec![2, 1], vec![1, 2]]),
    );
    let (plain, inputs, single) = ranks(transformer(&cfg).expect("transformer"));
    let (recomputed, _, _) =
        ranks(transformer(&cfg.clone().with_recompute(true)).expect("transformer"));
    assert!(replayed_count(&recomputed[0]) > 0, "rank 0 replays nodes");
    let data = SyntheticData::new(&single, 9, STEPS as usize).expect("data");
    let feeds = |step: u64| -> Vec<(String, Tensor)> {
        data.feeds(step)
            .into_iter()
            .map(|(n, t)| (n.to_string(), t))
            .collect()
    };
    let a = run_ranks(plain, &inputs, &feeds, STEPS, 1).expect("plain ranks");
    let b = run_ranks(recomputed, &inputs, &feeds, STEPS, 1).expect("recomputed ranks");
    for (r, (x, y)) in a.outputs.iter().zip(&b.outputs).enumerate() {
        let (x, y): (Vec<Vec<u64>>, Vec<Vec<u64>>) = (
            x.iter().map(|o| bits(&o[0])).collect(),
            y.iter().map(|o| bits(&o[0])).collect(),
        );
        assert_eq!(x, y, "rank {r}: losses differ");
    }
    for (r, (x, y)) in a.weights.iter().zip(&b.weights).enumerate() {
        for ((n, t), (m, u)) in x.iter().zip(y) {
            assert_eq!(n, m);
            assert_eq!(bits(t), bits(u), "rank {r}: {n} differs");
        }
    }
}

#[test]
fn recomputed_layers_lower_the_memory_plan_peak() {
    let cfg = TransformerConfig::new(4, 64, 4, 32, 8);
    let step = |g: Graph| {
        compile(
            g,
            &CompileOptions {
                optimizer: Some(Momentum::new(0.1, 0.9).to_spec()),
                ..Default::default()
            },
        )
        .expect("compiles")
        .graph
    };
    let plain = plan(&step(transformer(&cfg).expect("transformer")));
    let recomputed = plan(&step(
        transformer(&cfg.clone().with_recompute(true)).expect("transformer"),
    ));
    eprintln!(
        "4-layer transformer (hidden 64, seq 32, batch 8) memory plan: live peak {} -> {} bytes, \
         planned peak {} -> {} bytes with recompute on every layer",
        plain.live_peak_bytes, recomputed.live_peak_bytes, plain.peak_bytes, recomputed.peak_bytes
    );
    assert!(
        (recomputed.live_peak_bytes as f64) < 0.8 * plain.live_peak_bytes as f64,
        "live peak {} -> {}",
        plain.live_peak_bytes,
        recomputed.live_peak_bytes
    );
    assert!(
        recomputed.peak_bytes < plain.peak_bytes,
        "planned peak {} -> {}",
        plain.peak_bytes,
        recomputed.peak_bytes
    );
}

/// `shardc compile` of a text model with `recompute: true` marks prints the saving.
#[test]
fn shardc_compile_prints_the_replays_and_the_memory_plan() {
    let src = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/filetests/recompute/mlp_dense_recomputed.ir"),
    )
    .expect("the filetest model");
    let model: String = src
        .lines()
        .filter(|l| !l.starts_with(';'))
        .map(|l| format!("{l}\n"))
        .collect();
    let dir = std::env::temp_dir().join(format!("shardc-recompute-cli-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("mlp.ir");
    std::fs::write(&path, model).expect("write the model");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_shardc"))
        .args(["compile", path.to_str().unwrap_or_default(), "-o"])
        .arg(dir.join("art"))
        .args(["--optimizer", "momentum"])
        .output()
        .expect("shardc runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("recompute: 3 nodes replayed in the backward pass")
            && text.contains("live peak"),
        "{text}"
    );
}

/// The search's memory model does not count the activations the backward replays: the
/// predicted bytes per device of a searched plan fall with recompute on every layer.
#[test]
fn the_searched_plans_predicted_memory_counts_no_recomputed_activation() {
    use shardc::passes::parallel::SearchMode;
    let cfg = TransformerConfig::new(2, 32, 2, 16, 4);
    let predicted = |g: Graph| {
        compile(
            g,
            &CompileOptions {
                optimizer: Some(Momentum::new(0.1, 0.9).to_spec()),
                parallel: Some(ParallelOptions {
                    mode: Mode::AutoParallel,
                    device_num: 2,
                    dataset: DatasetLayout::DataParallel,
                    gradients_mean: true,
                    enable_alltoall: false,
                    search: SearchOptions {
                        mode: SearchMode::DynamicProgramming,
                        ..Default::default()
                    },
                    parallel_optimizer: None,
                }),
                ..Default::default()
            },
        )
        .expect("compiles")
        .parallel
        .and_then(|p| p.assignment.search)
        .map(|r| r.predicted.memory)
        .expect("a search report")
    };
    let plain = predicted(transformer(&cfg).expect("transformer"));
    let recomputed = predicted(transformer(&cfg.clone().with_recompute(true)).expect("t"));
    eprintln!("predicted bytes per device: {plain} without, {recomputed} with recompute");
    assert!(recomputed < 0.8 * plain, "{plain} -> {recomputed}");
}
