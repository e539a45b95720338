//! Training through the user-facing API (`shardc::train`): `Model::train` and the explicit
//! `value_and_grad` loop give the same weights; data-parallel and auto-parallel ranks (threads
//! of this process on the in-process communicator) give the single-device weights on the
//! global batch; the callbacks print and save what MindSpore's do.

mod ascend_common;

use shardc::communication::Communication;
use shardc::compiler::loss::{MSELoss, SoftmaxCrossEntropyWithLogits};
use shardc::compiler::optim::{Momentum, SGD};
use shardc::compiler::parallel_context::{ParallelContext, ParallelMode};
use shardc::compiler::zoo::{MlpNetwork, QuickstartNet};
use shardc::ir::DType;
use shardc::runtime::data::{Dataset, GeneratorDataset, SourceOptions};
use shardc::runtime::{InProcessWorld, Tensor};
use shardc::train::{
    value_and_grad, Callback, CheckpointConfig, DistributedGradReducer, Model, ModelCheckpoint,
    OptimizerCell, TrainError,
};
use std::collections::BTreeMap;

/// A seeded value in [-1, 1) for (row, column, stream).
fn value(row: usize, col: usize, stream: u64) -> f32 {
    let mut z = (row as u64) << 32 ^ (col as u64) << 8 ^ stream;
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 40) as f32 / (1u64 << 23) as f32 - 1.0
}

/// Rows of a classification set: `x (in_dim)` and an Int32 label below `classes`.
fn classification(rows: usize, in_dim: usize, classes: usize, opts: SourceOptions) -> Dataset {
    GeneratorDataset::new(
        &["x", "label"],
        rows,
        move |i| {
            let x: Vec<f32> = (0..in_dim).map(|c| value(i, c, 1)).collect();
            let label = (value(i, 0, 2).abs() * classes as f32) as i32 % classes as i32;
            Ok(vec![
                Tensor::from_f32(vec![in_dim], x).expect("shape"),
                Tensor::from_i32(vec![], vec![label]).expect("shape"),
            ])
        },
        opts,
    )
    .expect("generator")
}

/// Rows of the quickstart's regression: `input (32)`, `label (16)`.
fn regression(rows: usize, opts: SourceOptions) -> Dataset {
    GeneratorDataset::new(
        &["input", "label"],
        rows,
        |i| {
            Ok(vec![
                Tensor::from_f32(vec![32], (0..32).map(|c| value(i, c, 3)).collect())
                    .expect("shape"),
                Tensor::from_f32(vec![16], (0..16).map(|c| value(i, c, 4)).collect())
                    .expect("shape"),
            ])
        },
        opts,
    )
    .expect("generator")
}

fn sharded(num_shards: usize, shard_id: usize) -> SourceOptions {
    SourceOptions {
        num_shards,
        shard_id,
        ..SourceOptions::default()
    }
}

fn weights_of(model: &Model) -> BTreeMap<String, Tensor> {
    model
        .executor()
        .expect("trained")
        .weight_values()
        .expect("weights")
        .into_iter()
        .collect()
}

/// The largest |a - b| / (1 + |b|) over the weights both have; panics if `a` lacks one of
/// `names`.
fn max_rel_diff(
    a: &BTreeMap<String, Tensor>,
    b: &BTreeMap<String, Tensor>,
    names: &[String],
) -> f64 {
    let mut worst: f64 = 0.0;
    for n in names {
        let (x, y) = (&a[n], &b[n]);
        assert_eq!(x.shape, y.shape, "weight {n}");
        for (p, q) in x.to_f64_vec().iter().zip(y.to_f64_vec()) {
            worst = worst.max((p - q).abs() / (1.0 + q.abs()));
        }
    }
    worst
}

fn trainable(model: &Model) -> Vec<String> {
    model
        .executor()
        .expect("trained")
        .graph()
        .params
        .iter()
        .filter(|p| p.requires_grad())
        .map(|p| p.name.clone())
        .collect()
}

#[test]
fn model_train_and_explicit_loop_give_the_same_weights() {
    let net = || MlpNetwork::new(&[12, 16, 5]);
    let loss = || SoftmaxCrossEntropyWithLogits::new(true, "mean");
    let opt = Momentum::new(0.1, 0.9);
    let data = classification(64, 12, 5, SourceOptions::default())
        .batch(8, true)
        .expect("batch");

    let mut model = Model::new(net(), loss(), &opt).with_threads(1);
    let summary = model.train(2, &data, &mut []).expect("Model.train");
    assert_eq!(summary.steps, 16);

    let mut grad_fn = None;
    let mut cell = None;
    let reducer = DistributedGradReducer::new(&Communication::single(), true);
    let mut losses = Vec::new();
    for epoch in 0..2 {
        for batch in data.iter(epoch).expect("iter") {
            let batch = batch.expect("batch");
            if grad_fn.is_none() {
                let shapes: Vec<(&str, DType, &[usize])> = vec![
                    ("x", batch[0].dtype(), &batch[0].shape),
                    ("label", batch[1].dtype(), &batch[1].shape),
                ];
                let g = value_and_grad(&net(), &loss(), &shapes, 0, 1).expect("value_and_grad");
                cell = Some(OptimizerCell::new(&opt, &g).expect("optimizer"));
                grad_fn = Some(g);
            }
            let g = grad_fn.as_mut().expect("built");
            let (l, grads) = g.call(&batch).expect("grad_fn");
            let grads = reducer.reduce(grads).expect("reduce");
            cell.as_mut()
                .expect("built")
                .apply(g, grads)
                .expect("optimizer");
            losses.push(l);
        }
    }
    // One device, the same graph arithmetic: the losses agree to rounding.
    assert_eq!(losses.len(), summary.losses.len());
    for (a, b) in losses.iter().zip(&summary.losses) {
        assert!((a - b).abs() <= 1e-6 * (1.0 + b.abs()), "{a} vs {b}");
    }
    let g = grad_fn.expect("built");
    let loop_weights: BTreeMap<String, Tensor> = g
        .executor()
        .weights()
        .map(|(n, t)| (n.to_string(), t.clone()))
        .collect();
    let names = trainable(&model);
    assert_eq!(names, g.trainable_params());
    let d = max_rel_diff(&loop_weights, &weights_of(&model), &names);
    assert!(d <= 1e-6, "weights differ by {d}");
    assert!(losses.last() < losses.first(), "the loss falls: {losses:?}");
}

/// Runs `body(rank, communication)` on `n` threads with an in-process world.
fn on_ranks<T: Send + 'static>(
    n: usize,
    body: impl Fn(usize, Communication) -> T + Send + Sync + Clone + 'static,
) -> Vec<T> {
    let comms = InProcessWorld::new(n);
    let handles: Vec<_> = comms
        .into_iter()
        .enumerate()
        .map(|(r, c)| {
            let body = body.clone();
            std::thread::spawn(move || body(r, Communication::from_communicator(c)))
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("rank thread"))
        .collect()
}

#[test]
fn data_parallel_ranks_train_the_single_device_model_on_the_global_batch() {
    let (ranks, local_batch, steps) = (4, 4, 20usize);
    let rows = ranks * local_batch * steps;
    let net = || MlpNetwork::new(&[10, 16, 4]);
    let loss = || SoftmaxCrossEntropyWithLogits::new(true, "mean");
    let opt = SGD::new(0.2).momentum(0.9);

    let single_data = classification(rows, 10, 4, SourceOptions::default())
        .batch(ranks * local_batch, true)
        .expect("batch");
    let mut single = Model::new(net(), loss(), &opt).with_threads(1);
    let single_summary = single.train(1, &single_data, &mut []).expect("single");
    let names = trainable(&single);
    let single_w = weights_of(&single);

    for (mode, style) in [
        (ParallelMode::DataParallel, "Model.train"),
        (ParallelMode::DataParallel, "loop"),
    ] {
        let out = on_ranks(
            ranks,
            move |r, comm| -> Result<(Vec<f64>, BTreeMap<String, Tensor>), TrainError> {
                let data =
                    classification(rows, 10, 4, sharded(ranks, r)).batch(local_batch, true)?;
                let opt = SGD::new(0.2).momentum(0.9);
                if style == "loop" {
                    let mut losses = Vec::new();
                    let mut g = None;
                    let mut cell = None;
                    let reducer = DistributedGradReducer::new(&comm, true);
                    for batch in data.iter(0)? {
                        let batch = batch?;
                        if g.is_none() {
                            let shapes: Vec<(&str, DType, &[usize])> = vec![
                                ("x", batch[0].dtype(), &batch[0].shape),
                                ("label", batch[1].dtype(), &batch[1].shape),
                            ];
                            let f = value_and_grad(&net(), &loss(), &shapes, 0, 1)?;
                            cell = Some(OptimizerCell::new(&opt, &f)?);
                            g = Some(f);
                        }
                        let f = g.as_mut().expect("built");
                        let (l, grads) = f.call(&batch)?;
                        cell.as_mut()
                            .expect("built")
                            .apply(f, reducer.reduce(grads)?)?;
                        losses.push(l);
                    }
                    let f = g.expect("built");
                    let w = f
                        .executor()
                        .weights()
                        .map(|(n, t)| (n.to_string(), t.clone()))
                        .collect();
                    return Ok((losses, w));
                }
                let ctx = ParallelContext {
                    parallel_mode: mode,
                    gradients_mean: true,
                    device_num: ranks,
                    ..ParallelContext::default()
                };
                let mut m = Model::new(net(), loss(), &opt)
                    .with_context(ctx)
                    .with_communication(&comm)
                    .with_threads(1);
                let s = m.train(1, &data, &mut [])?;
                Ok((s.losses, weights_of(&m)))
            },
        );
        for (r, res) in out.into_iter().enumerate() {
            let (losses, w) = res.unwrap_or_else(|e| panic!("{style} rank {r}: {e}"));
            assert_eq!(losses.len(), steps, "{style} rank {r}");
            if style == "Model.train" {
                // Every rank prints the global batch's loss.
                for (a, b) in losses.iter().zip(&single_summary.losses) {
                    assert!(
                        (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                        "{style} rank {r}: loss {a} vs {b}"
                    );
                }
            }
            let d = max_rel_diff(&w, &single_w, &names);
            assert!(
                d <= 1e-5,
                "{style} rank {r}: weights differ from one device by {d}"
            );
        }
    }
}

#[test]
fn auto_parallel_quickstart_on_8_ranks_equals_one_device() {
    let (ranks, local_batch, steps) = (8, 2, 8usize);
    let rows = ranks * local_batch * steps;
    let opt = Momentum::new(0.2, 0.1);
    let single_data = regression(rows, SourceOptions::default())
        .batch(ranks * local_batch, true)
        .expect("batch");
    let mut single = Model::new(QuickstartNet, MSELoss::new(), &opt).with_threads(1);
    let single_summary = single.train(1, &single_data, &mut []).expect("single");
    let single_w = weights_of(&single);
    let dumps = tempfile::tempdir().expect("tempdir");
    let dump_dir = dumps.path().to_path_buf();
    let out = on_ranks(ranks, move |r, comm| -> Result<_, TrainError> {
        let data = regression(rows, sharded(ranks, r)).batch(local_batch, true)?;
        let ctx = ParallelContext {
            parallel_mode: ParallelMode::AutoParallel,
            device_num: ranks,
            // The mean of the replicas' gradients is the single-device gradient of the
            // mean loss (without it MindSpore sums them, a different optimizer step).
            gradients_mean: true,
            ..ParallelContext::default()
        };
        let mut m = Model::new(QuickstartNet, MSELoss::new(), &Momentum::new(0.2, 0.1))
            .with_context(ctx)
            .with_communication(&comm)
            .with_threads(1)
            .with_save_graphs(dump_dir.clone());
        let s = m.train(1, &data, &mut [])?;
        Ok((s.losses, weights_of(&m), m.param_layouts().to_vec()))
    });
    let mut gathered: BTreeMap<String, Tensor> = BTreeMap::new();
    for (r, res) in out.into_iter().enumerate() {
        let (losses, w, layouts) = res.unwrap_or_else(|e| panic!("rank {r}: {e}"));
        for (a, b) in losses.iter().zip(&single_summary.losses) {
            assert!(
                (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                "rank {r}: loss {a} vs {b}: {losses:?} vs {:?}",
                single_summary.losses
            );
        }
        for name in ["w", "w2"] {
            let (_, layout) = layouts.iter().find(|(n, _)| n == name).expect("layout");
            let full = gathered.entry(name.to_string()).or_insert_with(|| {
                Tensor::from_f32(
                    layout.tensor_shape.clone(),
                    vec![0.0; layout.tensor_shape.iter().product()],
                )
                .expect("shape")
            });
            assert!(
                full.set_block(&layout.block(r), &w[name]),
                "rank {r}: block of {name}"
            );
        }
    }
    let d = max_rel_diff(&gathered, &single_w, &["w".into(), "w2".into()]);
    assert!(d <= 1e-5, "gathered weights differ from one device by {d}");
    // The dumps a MindSpore user greps: the annotated matmul and a propagated relu.
    let begin = std::fs::read_dir(dumps.path().join("rank_0"))
        .expect("rank_0 dumps")
        .filter_map(|e| e.ok())
        .find(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("step_parallel_begin")
        })
        .expect("step_parallel_begin dump");
    let text = std::fs::read_to_string(begin.path()).expect("read dump");
    assert!(text.contains("in_strategy: ((2, 4), (4, 1))"), "{text}");
}

/// Records what the callbacks are told, and the progress bar's text.
#[derive(Default)]
struct Recorder {
    steps: Vec<(usize, usize)>,
    bars: Vec<String>,
    epochs_ended: usize,
    ended: bool,
}

impl Callback for Recorder {
    fn on_step_end(&mut self, info: &shardc::train::StepInfo<'_>) -> Result<(), TrainError> {
        self.steps.push((info.epoch, info.step_in_epoch));
        self.bars
            .push(shardc::train::ProgressBar::always().render(info));
        assert!(info.loss.is_finite() && info.exec.weight_value("w").is_ok());
        Ok(())
    }
    fn on_epoch_end(&mut self, _: &shardc::train::StepInfo<'_>) -> Result<(), TrainError> {
        self.epochs_ended += 1;
        Ok(())
    }
    fn on_train_end(&mut self, _: &shardc::train::StepInfo<'_>) -> Result<(), TrainError> {
        self.ended = true;
        Ok(())
    }
}

#[test]
fn model_checkpoint_saves_every_k_steps_and_at_the_end_keeping_the_newest() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = regression(16 * 5, SourceOptions::default())
        .batch(16, true)
        .expect("batch");
    let mut model =
        Model::new(QuickstartNet, MSELoss::new(), &Momentum::new(0.2, 0.1)).with_threads(1);
    let mut ckpt = ModelCheckpoint::new(
        "checkpoint_Net",
        dir.path(),
        CheckpointConfig {
            save_checkpoint_steps: 2,
            keep_checkpoint_max: 2,
        },
    );
    let mut seen = Recorder::default();
    let mut cbs: Vec<&mut dyn Callback> = vec![&mut ckpt, &mut seen];
    model.train(1, &data, &mut cbs).expect("train");
    assert_eq!(seen.steps, [(1, 1), (1, 2), (1, 3), (1, 4), (1, 5)]);
    assert_eq!((seen.epochs_ended, seen.ended), (1, true));
    assert!(
        seen.bars[0].starts_with("epoch 1/1 [======") && seen.bars[0].contains(" 1/5 loss "),
        "{:?}",
        seen.bars
    );
    assert!(
        seen.bars[4].contains("[==============================] 5/5"),
        "{:?}",
        seen.bars
    );
    // Steps 2 and 4, then the end (5); the newest two are kept.
    let saved: Vec<String> = ckpt
        .saved()
        .iter()
        .map(|p| p.file_name().expect("name").to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        saved,
        [
            "checkpoint_Net-1_2.safetensors",
            "checkpoint_Net-1_4.safetensors",
            "checkpoint_Net-1_5.safetensors"
        ]
    );
    let mut left: Vec<String> = std::fs::read_dir(dir.path().join("0"))
        .expect("rank dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(
        left,
        [
            "checkpoint_Net-1_4.safetensors",
            "checkpoint_Net-1_5.safetensors"
        ]
    );
    // The last file holds the trained weights.
    let cp =
        shardc::runtime::checkpoint::load(&dir.path().join("0/checkpoint_Net-1_5.safetensors"))
            .expect("load");
    assert_eq!(cp.meta.step, 5);
    let w = model
        .executor()
        .expect("trained")
        .weight_value("w")
        .expect("w");
    assert_eq!(cp.tensor("w").expect("w in file"), &w);
}

/// Pipeline stages on one device (no cluster) are an error that says what they need.
#[test]
fn model_pipeline_stages_on_one_device_are_an_error_saying_what_they_need() {
    let data = regression(32, SourceOptions::default())
        .batch(8, true)
        .expect("batch");
    let mut ctx = ParallelContext {
        parallel_mode: ParallelMode::SemiAutoParallel,
        ..ParallelContext::default()
    };
    ctx.pipeline.stages = 2;
    ctx.pipeline.micro_size = 2;
    let mut m =
        Model::new(QuickstartNet, MSELoss::new(), &Momentum::new(0.2, 0.1)).with_context(ctx);
    let e = m
        .train(1, &data, &mut [])
        .expect_err("one device runs no pipeline")
        .to_string();
    assert!(
        e.contains("pipeline_stages 2") && e.contains("several devices"),
        "{e}"
    );
}

#[test]
fn a_mismatch_between_data_and_context_is_an_error_naming_both() {
    // Four ranks' context on a single device.
    let data = regression(32, SourceOptions::default())
        .batch(8, true)
        .expect("batch");
    let ctx = ParallelContext {
        parallel_mode: ParallelMode::DataParallel,
        device_num: 4,
        ..ParallelContext::default()
    };
    let mut m =
        Model::new(QuickstartNet, MSELoss::new(), &Momentum::new(0.2, 0.1)).with_context(ctx);
    let e = m
        .train(1, &data, &mut [])
        .expect_err("no cluster of 4")
        .to_string();
    assert!(e.contains("device_num 4") && e.contains("1 rank"), "{e}");
    // Three columns for a model with a loss.
    let three = GeneratorDataset::new(
        &["a", "b", "c"],
        4,
        |_| {
            let t = Tensor::from_f32(vec![2], vec![0.0, 1.0]).expect("shape");
            Ok(vec![t.clone(), t.clone(), t])
        },
        SourceOptions::default(),
    )
    .expect("generator")
    .batch(2, true)
    .expect("batch");
    let mut m = Model::new(QuickstartNet, MSELoss::new(), &Momentum::new(0.2, 0.1));
    let e = m
        .train(1, &three, &mut [])
        .expect_err("three columns")
        .to_string();
    assert!(
        e.contains("3 column(s)") && e.contains("[\"a\", \"b\", \"c\"]"),
        "{e}"
    );
}

#[test]
fn full_batch_ranks_read_the_whole_batch_and_feed_their_block() {
    // semi_auto_parallel with dataset_strategy full_batch: every rank reads the global batch
    // (an unsharded data set) and feeds the block its input layout gives it.
    use shardc::compiler::parallel_context::DatasetStrategy;
    let (ranks, batch, steps) = (8, 16, 4usize);
    let data = move || {
        regression(batch * steps, SourceOptions::default())
            .batch(batch, true)
            .expect("batch")
    };
    let mut single =
        Model::new(QuickstartNet, MSELoss::new(), &Momentum::new(0.2, 0.1)).with_threads(1);
    let want = single.train(1, &data(), &mut []).expect("single").losses;
    let out = on_ranks(ranks, move |_, comm| -> Result<Vec<f64>, TrainError> {
        let ctx = ParallelContext {
            parallel_mode: ParallelMode::SemiAutoParallel,
            device_num: ranks,
            gradients_mean: true,
            dataset_strategy: DatasetStrategy::FullBatch,
            ..ParallelContext::default()
        };
        let mut m = Model::new(QuickstartNet, MSELoss::new(), &Momentum::new(0.2, 0.1))
            .with_context(ctx)
            .with_communication(&comm)
            .with_threads(1);
        Ok(m.train(1, &data(), &mut [])?.losses)
    });
    for (r, res) in out.into_iter().enumerate() {
        let got = res.unwrap_or_else(|e| panic!("rank {r}: {e}"));
        assert_eq!(got.len(), steps);
        for (a, b) in got.iter().zip(&want) {
            assert!(
                (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                "rank {r}: {got:?} vs {want:?}"
            );
        }
    }
}

/// The MLP trained for 2 epochs by `Model` on the CPU and on `target` (a device whose
/// description contains `device_says`): the same losses and weights to 1e-5, and the
/// device run's checkpoints written through the same callback.
fn model_on_a_device_trains_as_on_the_cpu(target: &str, device_says: &str) {
    use shardc::train::DeviceTarget;
    let net = || MlpNetwork::new(&[12, 16, 5]);
    let loss = || SoftmaxCrossEntropyWithLogits::new(true, "mean");
    let opt = Momentum::new(0.1, 0.9);
    let data = classification(32, 12, 5, SourceOptions::default())
        .batch(8, true)
        .expect("batch");
    let mut cpu = Model::new(net(), loss(), &opt).with_threads(1);
    let a = cpu.train(2, &data, &mut []).expect("CPU");
    let mut dev = Model::new(net(), loss(), &opt)
        .with_threads(1)
        .with_device_target(target.parse::<DeviceTarget>().expect("a target"));
    let dir = tempfile::tempdir().expect("tempdir");
    let mut ckpt = ModelCheckpoint::new("dev", dir.path(), CheckpointConfig::default());
    let b = dev.train(2, &data, &mut [&mut ckpt]).expect(target);
    let described = dev.executor().expect("built").device();
    assert!(described.contains(device_says), "{described}");
    assert_eq!(a.losses.len(), b.losses.len());
    for (x, y) in a.losses.iter().zip(&b.losses) {
        assert!(
            (x - y).abs() <= 1e-5 * (1.0 + x.abs()),
            "{:?} vs {:?}",
            a.losses,
            b.losses
        );
    }
    let names = trainable(&cpu);
    let d = max_rel_diff(&weights_of(&dev), &weights_of(&cpu), &names);
    assert!(d <= 1e-5, "weights differ by {d}");
    assert!(
        std::fs::read_dir(dir.path().join("0"))
            .expect("rank 0's checkpoints")
            .count()
            > 0
    );
}

/// `Model` on the Ascend backend (MindSpore's `device_target="Ascend"`) over the emulated
/// CANN (`tests/ascend_common`): the same losses and weights as on the CPU, checkpoints
/// through the same callback.
#[test]
fn model_trains_on_ascend_as_on_the_cpu() {
    ascend_common::cann_dir();
    model_on_a_device_trains_as_on_the_cpu("Ascend", "(device 0,");
}

/// `Model` on the GPU backend's emulated device (MindSpore's `device_target="GPU"`, the
/// kernels run on the host): the same losses and weights as on the CPU, checkpoints through
/// the same callback; on a machine without CUDA, `DeviceTarget::Gpu` is an error naming the
/// missing library.
#[test]
fn model_trains_on_the_emulated_gpu_as_on_the_cpu() {
    use shardc::train::DeviceTarget;
    if shardc::cuda::emulator::EmulatedDevice::new(64).is_err() {
        eprintln!("SKIP: no C++20 compiler for the emulated GPU");
        return;
    }
    model_on_a_device_trains_as_on_the_cpu("GPU-emulated", "emulated");
    if !shardc::cuda::probe::Library::Driver.present() {
        let data = classification(32, 12, 5, SourceOptions::default())
            .batch(8, true)
            .expect("batch");
        let opt = Momentum::new(0.1, 0.9);
        let mut real = Model::new(
            MlpNetwork::new(&[12, 16, 5]),
            SoftmaxCrossEntropyWithLogits::new(true, "mean"),
            &opt,
        )
        .with_device_target(DeviceTarget::Gpu { device_id: None });
        let err = real.train(1, &data, &mut []).unwrap_err().to_string();
        assert!(err.contains("CUDA not found: libcuda.so"), "{err}");
    }
}

/// MindSpore's `init("hccl")` (and `"nccl"`, `"mccl"`) joins as `init()` does (a single
/// device outside a cluster); another name is an error naming it.
#[test]
fn init_with_a_backend_name_joins_and_an_unknown_name_is_refused() {
    let c = shardc::communication::init_backend("hccl").expect("hccl");
    assert_eq!((c.get_rank(), c.get_group_size()), (0, 1));
    let e = shardc::communication::init_backend("gloo")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("init(\"gloo\"): unknown communication backend: expected \"hccl\" (Ascend), \"nccl\" (GPU) or \"mccl\" (CPU)"),
        "{e}"
    );
}

/// `Model` under `pipeline_stages = 2`, `micro_size = 2` on 4 ranks (2 stages × 2-way data
/// parallel, the stage split automatic): each rank reads the shard of its data-parallel
/// index within its stage, every rank reports the single device's losses (the last stage
/// broadcasts them), and each stage's ranks hold its weights as the single device's.
#[test]
fn pipelined_model_on_4_ranks_equals_one_device() {
    let (ranks, stages, local_batch, steps) = (4, 2, 4, 6usize);
    let dp = ranks / stages;
    let rows = dp * local_batch * steps;
    let net = || MlpNetwork::new(&[32, 24, 24, 16]);
    let opt = Momentum::new(0.2, 0.1);
    let single_data = regression(rows, SourceOptions::default())
        .batch(dp * local_batch, true)
        .expect("batch");
    let mut single = Model::new(net(), MSELoss::new(), &opt).with_threads(1);
    let single_summary = single.train(1, &single_data, &mut []).expect("single");
    let single_w = weights_of(&single);
    let out = on_ranks(ranks, move |r, comm| -> Result<_, TrainError> {
        let data = regression(rows, sharded(dp, r % dp)).batch(local_batch, true)?;
        let mut ctx = ParallelContext {
            parallel_mode: ParallelMode::SemiAutoParallel,
            device_num: ranks,
            gradients_mean: true,
            ..ParallelContext::default()
        };
        ctx.pipeline.stages = stages;
        ctx.pipeline.micro_size = 2;
        let mut m = Model::new(net(), MSELoss::new(), &Momentum::new(0.2, 0.1))
            .with_context(ctx)
            .with_communication(&comm)
            .with_threads(1);
        let s = m.train(1, &data, &mut [])?;
        Ok((s.losses, weights_of(&m), m.param_layouts().to_vec()))
    });
    let mut held: BTreeMap<String, usize> = BTreeMap::new();
    for (r, res) in out.into_iter().enumerate() {
        let (losses, w, layouts) = res.unwrap_or_else(|e| panic!("rank {r}: {e}"));
        assert_eq!(losses.len(), single_summary.losses.len(), "rank {r}");
        for (a, b) in losses.iter().zip(&single_summary.losses) {
            assert!(
                (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                "rank {r}: loss {a} vs {b}: {losses:?} vs {:?}",
                single_summary.losses
            );
        }
        // A stage's weights are whole on each of its ranks (data parallel within the stage).
        for (name, t) in &w {
            let Some(want) = single_w.get(name) else {
                continue;
            };
            let (_, layout) = layouts.iter().find(|(n, _)| n == name).expect("layout");
            assert_eq!(layout.slice_shape(), t.shape, "rank {r}: {name}");
            let d = max_rel_diff(
                &BTreeMap::from([(name.clone(), t.clone())]),
                &BTreeMap::from([(name.clone(), want.clone())]),
                std::slice::from_ref(name),
            );
            assert!(d <= 1e-5, "rank {r}: {name} differs from one device by {d}");
            *held.entry(name.clone()).or_default() += 1;
        }
    }
    // Every weight of the single device is held by the 2 ranks of its stage.
    for name in single_w
        .keys()
        .filter(|n| !n.contains('.') || n.ends_with("weight"))
    {
        if name.starts_with("moments") {
            continue;
        }
        assert_eq!(held.get(name), Some(&dp), "{name}: {held:?}");
    }
}

/// A block of two Dense layers, repeated as `layer<i>` (the scopes the stage planner folds).
struct Block;

impl shardc::compiler::nn::Cell for Block {
    fn class_name(&self) -> &str {
        "Block"
    }

    fn construct(
        &self,
        b: &mut shardc::compiler::GraphBuilder,
        x: shardc::compiler::Value,
    ) -> Result<shardc::compiler::Value, shardc::compiler::BuildError> {
        let d = shardc::compiler::nn::Dense::new(32, 32);
        let h = shardc::compiler::nn::call_cell(b, "dense", &d, x)?;
        b.relu(h)
    }
}

/// Four `layer<i>` blocks then a Dense to 16.
struct Layered;

impl shardc::compiler::nn::Cell for Layered {
    fn class_name(&self) -> &str {
        "Layered"
    }

    fn construct(
        &self,
        b: &mut shardc::compiler::GraphBuilder,
        mut x: shardc::compiler::Value,
    ) -> Result<shardc::compiler::Value, shardc::compiler::BuildError> {
        for i in 0..4 {
            x = shardc::compiler::nn::call_cell(b, &format!("layer{i}"), &Block, x)?;
        }
        let head = shardc::compiler::nn::Dense::new(32, 16);
        shardc::compiler::nn::call_cell(b, "head", &head, x)
    }
}

/// `Model` with `auto_pipeline`: the stage planner's plan is applied (as `shardc compile
/// --auto-pipeline`; under this memory bound it plans 2 stages of 2 layers × 2-way data
/// parallel, 2 micro-batches, ZeRO-1) and every rank trains to the single device's losses;
/// without `full_batch` it is an error that says why.
#[test]
fn auto_pipelined_model_equals_one_device() {
    const MEMORY: u64 = 30_000;
    let (ranks, batch, steps) = (4, 16, 3usize);
    let rows = batch * steps;
    let opt = Momentum::new(0.2, 0.1);
    let single_data = regression(rows, SourceOptions::default())
        .batch(batch, true)
        .expect("batch");
    let mut single = Model::new(Layered, MSELoss::new(), &opt).with_threads(1);
    let single_summary = single.train(1, &single_data, &mut []).expect("single");
    let context = move |full_batch: bool| {
        let mut ctx = ParallelContext {
            parallel_mode: ParallelMode::AutoParallel,
            device_num: ranks,
            gradients_mean: true,
            auto_pipeline: true,
            // Tight enough that one stage's weights, state and activations do not fit.
            max_device_memory: Some(MEMORY),
            ..ParallelContext::default()
        };
        if full_batch {
            ctx.dataset_strategy = shardc::compiler::parallel_context::DatasetStrategy::FullBatch;
        }
        ctx
    };
    let out = on_ranks(ranks, move |_, comm| -> Result<_, TrainError> {
        let data = regression(rows, SourceOptions::default()).batch(batch, true)?;
        let mut m = Model::new(Layered, MSELoss::new(), &Momentum::new(0.2, 0.1))
            .with_context(context(true))
            .with_communication(&comm)
            .with_threads(1);
        Ok(m.train(1, &data, &mut [])?.losses)
    });
    for (r, res) in out.into_iter().enumerate() {
        let losses = res.unwrap_or_else(|e| panic!("rank {r}: {e}"));
        assert_eq!(losses.len(), steps, "rank {r}");
        for (a, b) in losses.iter().zip(&single_summary.losses) {
            assert!(
                (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                "rank {r}: loss {a} vs {b}"
            );
        }
    }
    let errs = on_ranks(2, move |_, comm| -> String {
        let data = regression(rows, SourceOptions::default())
            .batch(batch, true)
            .expect("batch");
        let mut ctx = context(false);
        ctx.device_num = 2;
        let mut m = Model::new(Layered, MSELoss::new(), &Momentum::new(0.2, 0.1))
            .with_context(ctx)
            .with_communication(&comm)
            .with_threads(1);
        m.train(1, &data, &mut [])
            .map(|_| String::new())
            .unwrap_or_else(|e| e.to_string())
    });
    for e in errs {
        assert!(
            e.contains("auto_pipeline") && e.contains("full_batch"),
            "{e}"
        );
    }
}
