//! The parallel optimizer (`enable_parallel_optimizer`, ZeRO-1): weights and optimizer state
//! split over their data-parallel group compute what one device computes. Ranks run as
//! threads of this process on their blocks of the same global batches; every rank's loss
//! each step and the weights gathered from the ranks' shards after the last step equal the
//! single device's, for an MLP and a transformer, data-parallel and mixed strategies, Adam and
//! Momentum. The rank graphs gather each split weight before its readers
//! (`parallel_optimizer_allgather_*`) and reduce-scatter its gradient into the update, and
//! every rank keeps a fraction of the weight and state bytes.

use shardc::compiler::builder::{BuildError, GraphBuilder, Value};
use shardc::compiler::loss::MSELoss;
use shardc::compiler::model::build_network;
use shardc::compiler::nn::FnCell;
use shardc::compiler::optim::{Adam, Momentum};
use shardc::compiler::transformer::{transformer, TransformerConfig};
use shardc::compiler::{compile, init, CompileOptions};
use shardc::ir::{DType, Graph, OpKind, ParamKind, Strategy};
use shardc::passes::autodiff::Optimizer;
use shardc::passes::parallel::{
    DatasetLayout, Mode, ParallelOptimizer, ParallelOptions, SearchOptions,
};
use shardc::passes::pipeline::PipelineOptions;
use shardc_tools::in_process::run_ranks;

mod invariant_common;
use invariant_common::{feeds_of, layouts_of, SingleDevice};

const STEPS: u64 = 3;

/// A two-layer MLP in f64 (so the comparison sees the partitioning, not f32 rounding);
/// `annotate` gives the first MatMul's strategy.
fn mlp(batch: usize, annotate: Option<Strategy>) -> Result<Graph, BuildError> {
    let net = FnCell::new("Mlp", move |b: &mut GraphBuilder, x: Value| {
        let w0 = b.weight("w0", DType::Float64, &[16, 32], init::normal(0.1))?;
        let b0 = b.weight("b0", DType::Float64, &[32], init::normal(0.1))?;
        let w1 = b.weight("w1", DType::Float64, &[32, 8], init::normal(0.1))?;
        let h = match &annotate {
            Some(s) => b.op_full(
                OpKind::MatMul,
                &[x.into(), w0.into()],
                shardc::ir::Attrs::new()
                    .with("transpose_a", shardc::ir::Attr::Bool(false))
                    .with("transpose_b", shardc::ir::Attr::Bool(false)),
                "matmul",
                Some(s.clone()),
                None,
            )?,
            None => b.matmul(x, w0)?,
        };
        let h = b.bias_add(h, b0)?;
        let h = b.relu(h)?;
        b.matmul(h, w1)
    });
    build_network(
        "Mlp",
        &net,
        &MSELoss::new(),
        &[
            ("x", DType::Float64, &[batch, 16]),
            ("label", DType::Float64, &[batch, 8]),
        ],
    )
}

fn options(mode: Mode, devices: usize, po: Option<ParallelOptimizer>) -> ParallelOptions {
    ParallelOptions {
        mode,
        device_num: devices,
        dataset: DatasetLayout::DataParallel,
        gradients_mean: true,
        enable_alltoall: false,
        search: SearchOptions::default(),
        parallel_optimizer: po,
    }
}

/// Every weight split, whatever its size.
fn zero1(size: Option<usize>) -> ParallelOptimizer {
    ParallelOptimizer {
        threshold_kb: 0,
        weight_shard_size: size,
        gradient_accumulation_shard: true,
    }
}

/// Bytes of the weights and optimizer state (every `Ref` parameter) of a rank's graph.
fn ref_bytes(g: &Graph) -> usize {
    g.params
        .iter()
        .filter(|p| matches!(p.kind, ParamKind::Weight { .. }))
        .map(|p| p.ty.size_bytes())
        .sum()
}

/// What a case showed: rank 0's collectives by kind.
struct Seen {
    gathers: usize,
    reduce_scatters: usize,
    mirror_all_reduces: usize,
}

/// Compiles `model` on one device and on `par.device_num` ranks, trains both [`STEPS`] steps
/// on the same data, and compares every rank's loss and the gathered weights.
fn check(
    what: &str,
    model: &Graph,
    par: ParallelOptions,
    opt: Optimizer,
    tolerance: f64,
    unchecked: &[&str],
) -> Result<Seen, String> {
    let one_stage = PipelineOptions::default();
    check_against(
        what,
        model,
        (par, one_stage, opt),
        opt,
        tolerance,
        unchecked,
    )
}

/// [`check`] with the ranks compiled with `pipeline` and `opt`, the single device with
/// `single_opt`.
fn check_against(
    what: &str,
    model: &Graph,
    (par, pipeline, opt): (ParallelOptions, PipelineOptions, Optimizer),
    single_opt: Optimizer,
    tolerance: f64,
    unchecked: &[&str],
) -> Result<Seen, String> {
    let single = compile(
        model.clone(),
        &CompileOptions {
            optimizer: Some(single_opt),
            ..Default::default()
        },
    )
    .map_err(|e| format!("{what}: single: {e}"))?
    .graph;
    let compiled = compile(
        model.clone(),
        &CompileOptions {
            optimizer: Some(opt),
            parallel: Some(par),
            pipeline,
            ..Default::default()
        },
    )
    .map_err(|e| format!("{what}: parallel: {e}"))?
    .parallel
    .ok_or_else(|| format!("{what}: no ranks"))?;
    let reference = SingleDevice::run(what, single, 11, STEPS)?;
    let layouts = layouts_of(&compiled);
    let inputs = reference.inputs(&layouts);
    let rank0 = &compiled.ranks[0];
    let count =
        |pred: &dyn Fn(&shardc::ir::Node) -> bool| rank0.nodes.iter().filter(|n| pred(n)).count();
    let seen = Seen {
        gathers: count(&|n| {
            n.op == OpKind::AllGather && n.instance.starts_with("parallel_optimizer_allgather_")
        }),
        reduce_scatters: count(&|n| {
            n.op == OpKind::ReduceScatter && n.instance.starts_with("mirror_grad_")
        }),
        mirror_all_reduces: count(&|n| {
            n.op == OpKind::AllReduce && n.instance.starts_with("mirror_grad_")
        }),
    };
    let data = &reference.data;
    let feeds = |step: u64| feeds_of(data, step);
    let res = run_ranks(compiled.ranks, &inputs, &feeds, STEPS, 1)
        .map_err(|e| format!("{what}: {e:#}"))?;
    reference.check_except(what, &res, &layouts, tolerance, unchecked)?;
    Ok(seen)
}

fn momentum() -> Optimizer {
    Momentum::new(0.1, 0.9).to_spec()
}

fn adam() -> Optimizer {
    Adam::new(0.01).to_spec()
}

#[test]
fn optimizer_sharded_mlp_equals_one_device_data_parallel_and_mixed() {
    let mut failures = Vec::new();
    let mlp_dp = mlp(8, None).expect("mlp");
    // Mixed: the first MatMul splits its batch by 2 and w0's columns by 2; w0 is then
    // replicated over 2 devices, which the optimizer splits it over.
    let mixed = Strategy(vec![vec![2, 1], vec![1, 2]]);
    let mlp_mixed = mlp(8, Some(mixed)).expect("mlp");
    for (opt_name, opt) in [("momentum", momentum()), ("adam", adam())] {
        for (what, model, mode) in [
            ("mlp data_parallel", &mlp_dp, Mode::DataParallel),
            ("mlp mixed", &mlp_mixed, Mode::SemiAutoParallel),
        ] {
            let what = format!("{what} {opt_name}");
            match check(
                &what,
                model,
                options(mode, 4, Some(zero1(None))),
                opt,
                1e-9,
                &[],
            ) {
                Ok(seen) => {
                    // Data parallel: every gradient is reduce-scattered, none all-reduced. In
                    // the mixed plan the completion may pick gradient strategies that make
                    // the update's block directly.
                    let dp = mode == Mode::DataParallel;
                    let unreduced =
                        dp && (seen.reduce_scatters == 0 || seen.mirror_all_reduces > 0);
                    if seen.gathers == 0 || unreduced {
                        failures.push(format!(
                            "{what}: {} optimizer all-gathers, {} gradient reduce-scatters, \
                             {} gradient all-reduces",
                            seen.gathers, seen.reduce_scatters, seen.mirror_all_reduces
                        ));
                    }
                }
                Err(e) => failures.push(e),
            }
        }
        // A shard size of 2 on 4 data-parallel devices: split over pairs, the gradient
        // reduced over the rest.
        let what = format!("mlp data_parallel shard size 2 {opt_name}");
        if let Err(e) = check(
            &what,
            &mlp_dp,
            options(Mode::DataParallel, 4, Some(zero1(Some(2)))),
            opt,
            1e-9,
            &[],
        ) {
            failures.push(e);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn optimizer_sharded_transformer_equals_one_device_data_parallel_and_mixed() {
    let cfg = TransformerConfig::new(1, 16, 2, 4, 4);
    let dp = transformer(&cfg).expect("transformer");
    // Mixed: the feed-forward input Dense split by columns over 2, batch over 2.
    let mixed = transformer(&cfg.clone().annotate(
        "layer0_ffn_in_matmul",
        Strategy(vec![vec![2, 1], vec![1, 2]]),
    ))
    .expect("transformer");
    let mut failures = Vec::new();
    for (opt_name, opt) in [("momentum", momentum()), ("adam", adam())] {
        for (what, model, mode) in [
            ("transformer data_parallel", &dp, Mode::DataParallel),
            ("transformer mixed", &mixed, Mode::SemiAutoParallel),
        ] {
            let what = format!("{what} {opt_name}");
            // The key bias's exact gradient is zero (softmax ignores a shift of a row of
            // scores): its f32 rounding noise, which depends on the order of the sums, Adam
            // normalises into whole steps on either side. The ranks' losses still agree.
            let unchecked: &[&str] = if opt_name == "adam" {
                &["attn_k.bias"]
            } else {
                &[]
            };
            match check(
                &what,
                model,
                options(mode, 4, Some(zero1(None))),
                opt,
                2e-4,
                unchecked,
            ) {
                Ok(seen) if seen.gathers == 0 || seen.reduce_scatters == 0 => failures.push(
                    format!("{what}: no optimizer all-gather or gradient reduce-scatter"),
                ),
                Ok(_) => {}
                Err(e) => failures.push(e),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Gradient accumulation over 4 micro-batches on 4 data-parallel devices, every weight
/// split: with `gradient_accumulation_shard` each micro-batch's gradient is reduce-scattered
/// and only the shard accumulated (4 ReduceScatters per weight); without it the whole
/// gradients are summed first and reduce-scattered once (1 per weight). Never an AllReduce
/// of a gradient; both equal one device.
#[test]
fn micro_batched_gradients_are_reduce_scattered_per_micro_batch_or_once() {
    let model = mlp(32, None).expect("mlp");
    let micro = PipelineOptions {
        micro_size: 4,
        ..Default::default()
    };
    let mut failures = Vec::new();
    for (accumulate_shards, per_weight) in [(true, 4), (false, 1)] {
        let what = format!("mlp, 4 micro-batches, gradient_accumulation_shard {accumulate_shards}");
        let po = ParallelOptimizer {
            gradient_accumulation_shard: accumulate_shards,
            ..zero1(None)
        };
        let par = options(Mode::DataParallel, 4, Some(po));
        match check_against(
            &what,
            &model,
            (par, micro, momentum()),
            momentum(),
            1e-9,
            &[],
        ) {
            // Three weights: w0, b0, w1.
            Ok(seen) if seen.reduce_scatters != 3 * per_weight || seen.mirror_all_reduces > 0 => {
                failures.push(format!(
                    "{what}: {} gradient reduce-scatters (want {}), {} gradient all-reduces",
                    seen.reduce_scatters,
                    3 * per_weight,
                    seen.mirror_all_reduces
                ))
            }
            Ok(_) => {}
            Err(e) => failures.push(e),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `gradients_mean = false` sums the replicas' gradients (MindSpore's convention: each
/// replica's gradient is of its own local-mean loss), so with Momentum 4 data-parallel ranks
/// step as one device with 4 times the learning rate, with or without micro-batches and
/// optimizer sharding: the micro-batches' accumulated gradient is scaled like the plain one.
#[test]
fn summed_gradients_are_scaled_alike_with_micro_batches() {
    let model = mlp(32, None).expect("mlp");
    let mut failures = Vec::new();
    for micro_size in [1, 4] {
        for po in [None, Some(zero1(None))] {
            let what = format!(
                "mlp, gradients_mean false, {micro_size} micro-batch(es), optimizer sharding {}",
                po.is_some()
            );
            let par = ParallelOptions {
                gradients_mean: false,
                ..options(Mode::DataParallel, 4, po)
            };
            let pipeline = PipelineOptions {
                micro_size,
                ..Default::default()
            };
            let scaled = Momentum::new(0.4, 0.9).to_spec();
            // The moments hold 4 times the single device's (its velocity is of the unscaled
            // gradient); the weights and losses agree.
            let moments = ["moments.w0", "moments.b0", "moments.w1"];
            if let Err(e) = check_against(
                &what,
                &model,
                (par, pipeline, momentum()),
                scaled,
                1e-9,
                &moments,
            ) {
                failures.push(e);
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Rank 0's weights and optimizer state: with Adam (two moments per weight) on 4
/// data-parallel devices, every weight splits 4 ways, so the bytes fall to a quarter (the
/// shared `beta*_power` scalars aside), and the data-parallel AllReduces become
/// reduce-scatters.
#[test]
fn each_rank_keeps_a_quarter_of_the_weight_and_state_bytes() {
    let model = transformer(&TransformerConfig::new(1, 16, 2, 4, 4)).expect("transformer");
    let rank0 = |po: Option<ParallelOptimizer>| {
        compile(
            model.clone(),
            &CompileOptions {
                optimizer: Some(adam()),
                parallel: Some(options(Mode::DataParallel, 4, po)),
                ..Default::default()
            },
        )
        .expect("compile")
        .parallel
        .expect("ranks")
        .ranks
        .swap_remove(0)
    };
    let plain = rank0(None);
    let sharded = rank0(Some(zero1(None)));
    let scalars: usize = plain
        .params
        .iter()
        .filter(|p| p.ty.shape.is_empty() && matches!(p.kind, ParamKind::Weight { .. }))
        .map(|p| p.ty.size_bytes())
        .sum();
    let (before, after) = (ref_bytes(&plain), ref_bytes(&sharded));
    eprintln!(
        "rank 0 weight + Adam state bytes: {before} without, {after} with the parallel optimizer"
    );
    assert_eq!(
        after - scalars,
        (before - scalars) / 4,
        "{before} -> {after}"
    );
    let all_reduces = |g: &Graph| {
        g.nodes
            .iter()
            .filter(|n| n.op == OpKind::AllReduce && n.instance.starts_with("mirror_grad_"))
            .count()
    };
    assert!(all_reduces(&plain) > 0);
    assert_eq!(
        all_reduces(&sharded),
        0,
        "every gradient is reduce-scattered"
    );
    // The 64 KB default threshold keeps this small model's weights whole.
    let default = rank0(Some(ParallelOptimizer::DEFAULT));
    assert_eq!(ref_bytes(&default), before);
}

#[test]
fn a_shard_size_that_does_not_divide_the_group_is_an_error_naming_the_weight() {
    let model = mlp(8, None).expect("mlp");
    // 8 devices, a shard size of 3.
    let err = compile(
        model,
        &CompileOptions {
            optimizer: Some(momentum()),
            parallel: Some(options(Mode::DataParallel, 8, Some(zero1(Some(3))))),
            ..Default::default()
        },
    )
    .expect_err("3 does not divide 8");
    let text = err.to_string();
    assert!(
        text.contains("optimizer_weight_shard_size 3") && text.contains("weight 'w0'"),
        "{text}"
    );
}

mod cli {
    //! `shardc compile --enable-parallel-optimizer`, `shardc run` on 4 in-process ranks with
    //! checkpoints (each rank's file holds its shard), `shardc ckpt merge` equal to the single
    //! device's checkpoint.

    use shardc_runtime::checkpoint;
    use std::path::{Path, PathBuf};
    use std::process::{Command, Output};

    fn ok(args: &[&str]) -> Output {
        let o = Command::new(env!("CARGO_BIN_EXE_shardc"))
            .args(args)
            .output()
            .expect("the shardc binary runs");
        assert!(
            o.status.success(),
            "shardc {args:?} failed:\n{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        o
    }

    fn stdout(o: &Output) -> String {
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    fn losses(o: &Output) -> Vec<f64> {
        stdout(o)
            .lines()
            .filter_map(|l| l.split(", loss is ").nth(1))
            .filter_map(|v| v.trim().parse().ok())
            .collect()
    }

    fn s(p: &Path) -> &str {
        p.to_str().unwrap_or_default()
    }

    fn tmp() -> PathBuf {
        let d = std::env::temp_dir().join(format!("shardc-zero-cli-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn only_file(dir: &Path) -> PathBuf {
        let f: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert_eq!(f.len(), 1, "{f:?}");
        f[0].clone()
    }

    #[test]
    fn compiled_with_the_parallel_optimizer_ranks_save_shards_that_merge_to_one_device() {
        let dir = tmp();
        let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/quickstart.ir");
        let (art4, art1) = (dir.join("art4"), dir.join("art1"));
        let common = ["--optimizer", "adam", "--learning-rate", "0.05"];
        let mut args = vec!["compile", s(&model), "-o", s(&art4)];
        args.extend(common);
        args.extend([
            "--device-num",
            "4",
            "--parallel-mode",
            "data_parallel",
            "--gradients-mean",
            "--enable-parallel-optimizer",
            "--parallel-optimizer-threshold",
            "0",
        ]);
        let c = ok(&args);
        let summary = stdout(&c);
        assert!(
            summary.contains("parallel optimizer:") && summary.contains("weights split"),
            "{summary}"
        );
        let mut args = vec!["compile", s(&model), "-o", s(&art1)];
        args.extend(common);
        ok(&args);
        let rank0 = std::fs::read_to_string(art4.join("rank_0.ir")).unwrap_or_default();
        assert!(rank0.contains("parallel_optimizer_allgather_"), "{rank0}");
        assert!(rank0.contains("ReduceScatter("), "{rank0}");

        let (ck, single) = (dir.join("ck"), dir.join("single"));
        let par = ok(&["run", s(&art4), "--steps", "4", "--checkpoint-dir", s(&ck)]);
        let one = ok(&[
            "run",
            s(&art1),
            "--steps",
            "4",
            "--checkpoint-dir",
            s(&single),
        ]);
        let (lp, l1) = (losses(&par), losses(&one));
        assert_eq!((lp.len(), l1.len()), (4, 4), "{}", stdout(&par));
        for (v, want) in lp.iter().zip(&l1) {
            let want = *want;
            assert!(
                (v - want).abs() <= 1e-5 * want.abs().max(1.0),
                "{v} vs {want}"
            );
        }
        // Each rank's file holds its quarter of a split weight.
        let r0 = checkpoint::load(&only_file(&ck.join("0"))).unwrap();
        let whole = checkpoint::load(&only_file(&single.join("0"))).unwrap();
        let split = whole
            .tensors
            .iter()
            .filter(|(n, t)| {
                r0.tensor(n).is_some_and(|b| {
                    b.shape.iter().product::<usize>() * 4 == t.shape.iter().product::<usize>()
                })
            })
            .count();
        assert!(
            split > 0,
            "no rank-0 tensor is a quarter of the single device's"
        );

        let merged = dir.join("merged/0/merged.safetensors");
        ok(&[
            "ckpt",
            "merge",
            "--strategy",
            s(&ck.join("strategy.json")),
            "--input",
            s(&ck),
            "-o",
            s(&merged),
        ]);
        let mer = checkpoint::load(&merged).unwrap();
        let names: Vec<&str> = whole.tensors.iter().map(|(n, _)| n.as_str()).collect();
        let mnames: Vec<&str> = mer.tensors.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, mnames);
        for (n, t) in &whole.tensors {
            let (a, b) = (mer.tensor(n).unwrap().to_f64_vec(), t.to_f64_vec());
            assert_eq!(a.len(), b.len(), "{n}");
            let scale = b.iter().fold(1e-4f64, |m, x| m.max(x.abs()));
            let d = a
                .iter()
                .zip(&b)
                .map(|(x, y)| (x - y).abs() / scale)
                .fold(0.0, f64::max);
            assert!(
                d < 1e-5,
                "{n}: merged differs from the single device by {d}"
            );
        }
    }
}
