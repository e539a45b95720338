//! MindSpore's data-parallel tutorial (`distributed_data_parallel.py`) in shardc: the MLP
//! `Network` on MNIST, each rank reading its shard, trained with the explicit loop the
//! tutorial writes (`value_and_grad`, `DistributedGradReducer`, then the optimizer), or with
//! `Model.train` (`--style model`). Both give the same weights.
//!
//! Started by `shardc launch` (`examples/run_mnist_dp.sh`, as the tutorial's msrun
//! `run.sh`), by the `MS_*` variables, by mpirun, or alone as one device.
//!
//! Options: `--epochs 10`, `--batch-size 32`, `--style loop|model`, `--print-every 10` (the
//! loop style's print interval), `--num-samples N` (at most N images per rank and epoch),
//! `--checkpoint-dir DIR` (the weights at the end, `DIR/{rank_id}/`), `--data-path DIR`
//! (instead of `DATA_PATH`).

use shardc::communication::{self, Communication};
use shardc::compiler::loss::SoftmaxCrossEntropyWithLogits;
use shardc::compiler::optim::SGD;
use shardc::compiler::parallel_context::{ParallelContext, ParallelMode};
use shardc::compiler::zoo::MlpNetwork;
use shardc::ir::DType;
use shardc::runtime::checkpoint::{self, Checkpoint};
use shardc::runtime::data::{vision, Dataset, MnistDataset, MnistUsage, SourceOptions};
use shardc::train::{
    value_and_grad, Callback, DistributedGradReducer, LossMonitor, Model, OptimizerCell, TrainError,
};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(PartialEq)]
enum Style {
    Loop,
    Model,
}

struct Config {
    data_path: PathBuf,
    epochs: usize,
    batch_size: usize,
    style: Style,
    print_every: usize,
    num_samples: Option<usize>,
    checkpoint_dir: Option<PathBuf>,
}

fn config() -> Result<Config, TrainError> {
    let bad = TrainError::Mismatch;
    let mut c = Config {
        data_path: std::env::var_os("DATA_PATH")
            .map(PathBuf::from)
            .unwrap_or_default(),
        epochs: 10,
        batch_size: 32,
        style: Style::Loop,
        print_every: 10,
        num_samples: None,
        checkpoint_dir: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let v = args
            .next()
            .ok_or_else(|| bad(format!("{a} needs a value")))?;
        let num = || {
            v.parse::<usize>()
                .map_err(|_| bad(format!("{a} {v}: expected a non-negative integer")))
        };
        match a.as_str() {
            "--epochs" => c.epochs = num()?,
            "--batch-size" => c.batch_size = num()?,
            "--print-every" => c.print_every = num()?.max(1),
            "--num-samples" => c.num_samples = Some(num()?),
            "--checkpoint-dir" => c.checkpoint_dir = Some(PathBuf::from(&v)),
            "--data-path" => c.data_path = PathBuf::from(&v),
            "--style" => {
                c.style = match v.as_str() {
                    "loop" => Style::Loop,
                    "model" => Style::Model,
                    _ => return Err(bad(format!("--style {v}: expected loop or model"))),
                }
            }
            _ => return Err(bad(format!("unknown option {a}"))),
        }
    }
    if c.data_path.as_os_str().is_empty() {
        return Err(bad(
            "no data set: set DATA_PATH (or --data-path) to the MNIST directory; `shardc data synth --format mnist --out DIR` writes a synthetic one".into(),
        ));
    }
    Ok(c)
}

/// The tutorial's `create_dataset`.
fn create_dataset(c: &Config, comm: &Communication) -> Result<Dataset, TrainError> {
    let dataset = MnistDataset::new(
        &c.data_path,
        MnistUsage::Train,
        SourceOptions {
            num_shards: comm.get_group_size(),
            shard_id: comm.get_rank(),
            num_samples: c.num_samples,
            ..SourceOptions::default()
        },
    )?;
    let image_transforms = vec![
        vision::Rescale(1.0 / 255.0, 0.0),
        vision::Normalize(&[0.1307], &[0.3081]),
        vision::HWC2CHW(),
    ];
    let label_transform = vision::TypeCast(DType::Int32);
    let dataset = dataset.map(image_transforms, &["image"])?;
    let dataset = dataset.map(vec![label_transform], &["label"])?;
    Ok(dataset.batch(c.batch_size, true)?)
}

fn network() -> MlpNetwork {
    MlpNetwork::new(&[28 * 28, 512, 512, 10]).with_flatten()
}

fn train(comm: &Communication) -> Result<(), TrainError> {
    let c = config()?;
    let data_set = create_dataset(&c, comm)?;
    let loss_fn = SoftmaxCrossEntropyWithLogits::new(true, "mean");
    let optimizer = SGD::new(1e-2);
    let rank = comm.get_rank();
    let size = comm.get_group_size();
    // Saves the trained weights as `DIR/{rank_id}/mnist_dp-{epochs}_{steps}.safetensors`.
    let save = |exec: &dyn shardc::runtime::StepExecutor, steps: u64| -> Result<(), TrainError> {
        if let Some(dir) = &c.checkpoint_dir {
            let cp =
                Checkpoint::of_executor(exec, rank as u32, size as u32, steps, c.epochs as u64)?;
            let per_epoch = data_set.get_dataset_size().max(1) as u64;
            checkpoint::save_rank(dir, "mnist_dp", per_epoch, &cp, 0)?;
        }
        Ok(())
    };
    match c.style {
        Style::Model => {
            let context = ParallelContext {
                parallel_mode: ParallelMode::DataParallel,
                gradients_mean: true,
                device_num: size,
                ..ParallelContext::default()
            };
            let mut model = Model::new(network(), loss_fn, &optimizer)
                .with_context(context)
                .with_communication(comm);
            let mut monitor = LossMonitor::per_print_times(c.print_every);
            let mut callbacks: Vec<&mut dyn Callback> = vec![&mut monitor];
            let summary = model.train(c.epochs, &data_set, &mut callbacks)?;
            if let Some(exec) = model.executor() {
                save(exec, summary.steps)?;
            }
        }
        Style::Loop => {
            let mut grad_fn = None;
            let mut opt = None;
            let grad_reducer = DistributedGradReducer::new(comm, true);
            let mut steps = 0u64;
            for epoch in 0..c.epochs {
                for (i, batch) in data_set.iter(epoch as u64)?.enumerate() {
                    let batch = batch?;
                    if grad_fn.is_none() {
                        let shapes: Vec<(&str, DType, &[usize])> = vec![
                            ("image", batch[0].dtype(), &batch[0].shape),
                            ("label", batch[1].dtype(), &batch[1].shape),
                        ];
                        let g = value_and_grad(&network(), &loss_fn, &shapes, 0, 0)?;
                        opt = Some(OptimizerCell::new(&optimizer, &g)?);
                        grad_fn = Some(g);
                    }
                    let not_built = || TrainError::Mismatch("the step was not built".into());
                    let g = grad_fn.as_mut().ok_or_else(not_built)?;
                    let o = opt.as_mut().ok_or_else(not_built)?;
                    let (loss, grads) = g.call(&batch)?;
                    let grads = grad_reducer.reduce(grads)?;
                    o.apply(g, grads)?;
                    steps += 1;
                    if i % c.print_every == 0 {
                        println!("epoch: {epoch} step: {i}, loss is {}", loss as f32);
                    }
                }
            }
            if let Some(g) = &grad_fn {
                save(g.executor(), steps)?;
            }
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    communication::main(train)
}
