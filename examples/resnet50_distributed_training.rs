//! MindSpore's CPU data-parallel tutorial (`distributed_training_cpu/resnet50_distributed_training.py`)
//! in shardc: ResNet-50 on CIFAR-10, data parallel with `gradients_mean`, one process per
//! worker plus a scheduler, all started from the `MS_*` variables (`examples/run_cpu_dp.sh`
//! does it, as the tutorial's `run.sh`).
//!
//! ```text
//! DATA_PATH=/path/cifar-10-batches-bin MS_WORKER_NUM=8 MS_SCHED_HOST=127.0.0.1 \
//!   MS_SCHED_PORT=8117 MS_ROLE=MS_WORKER resnet50_distributed_training [options]
//! ```
//!
//! Options (the tutorial's values are the defaults): `--epochs 10`, `--batch-size 32`,
//! `--image-size 224` (the Resize target), `--width-divisor 1` (divides every channel count:
//! 16 trains the same 50-layer structure at a size a laptop runs in seconds),
//! `--num-samples N` (at most N images per rank and epoch), `--checkpoint-dir DIR`
//! (ModelCheckpoint every epoch's end into `DIR/{rank_id}/`), `--data-path DIR` (instead of `DATA_PATH`),
//! `--learning-rate 0.01` (Momentum's, momentum 0.9), `--device-target CPU|GPU` (the GPU tutorial's `set_context(device_target="GPU")`: one GPU per
//! rank, the rank on its host modulo the GPUs, gradients through NCCL; `GPU-emulated` runs the
//! CUDA backend's kernels on the host).

use shardc::communication::{self, Communication};
use shardc::compiler::loss::SoftmaxCrossEntropyExpand;
use shardc::compiler::optim::Momentum;
use shardc::compiler::parallel_context::{ParallelContext, ParallelMode};
use shardc::compiler::zoo::ResNet50;
use shardc::ir::DType;
use shardc::runtime::data::{vision, Cifar10Dataset, Cifar10Usage, Dataset, SourceOptions};
use shardc::train::{
    Callback, DeviceTarget, LossMonitor, Model, ProgressBar, TimeMonitor, TrainError,
};
use std::path::PathBuf;
use std::process::ExitCode;

struct Config {
    data_path: PathBuf,
    epochs: usize,
    batch_size: usize,
    image_size: usize,
    width_divisor: usize,
    num_samples: Option<usize>,
    learning_rate: f64,
    checkpoint_dir: Option<PathBuf>,
    device_target: DeviceTarget,
}

fn config() -> Result<Config, TrainError> {
    let bad = |m: String| TrainError::Mismatch(m);
    let mut c = Config {
        data_path: std::env::var_os("DATA_PATH")
            .map(PathBuf::from)
            .unwrap_or_default(),
        epochs: 10,
        batch_size: 32,
        image_size: 224,
        width_divisor: 1,
        num_samples: None,
        learning_rate: 0.01,
        checkpoint_dir: None,
        device_target: DeviceTarget::Cpu,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().ok_or_else(|| bad(format!("{a} needs a value")));
        let num = |v: String, a: &str| {
            v.parse::<usize>()
                .map_err(|_| bad(format!("{a} {v}: expected a non-negative integer")))
        };
        match a.as_str() {
            "--epochs" => c.epochs = num(value()?, &a)?,
            "--batch-size" => c.batch_size = num(value()?, &a)?,
            "--image-size" => c.image_size = num(value()?, &a)?,
            "--width-divisor" => c.width_divisor = num(value()?, &a)?,
            "--num-samples" => c.num_samples = Some(num(value()?, &a)?),
            "--learning-rate" => {
                let v = value()?;
                c.learning_rate = v
                    .parse::<f64>()
                    .ok()
                    .filter(|lr| lr.is_finite() && *lr >= 0.0)
                    .ok_or_else(|| bad(format!("{a} {v}: expected a finite number >= 0")))?;
            }
            "--checkpoint-dir" => c.checkpoint_dir = Some(PathBuf::from(value()?)),
            "--data-path" => c.data_path = PathBuf::from(value()?),
            "--device-target" => c.device_target = value()?.parse()?,
            _ => return Err(bad(format!("unknown option {a}"))),
        }
    }
    if c.data_path.as_os_str().is_empty() {
        return Err(bad(
            "no data set: set DATA_PATH (or --data-path) to the cifar-10-batches-bin directory; `shardc data synth --format cifar10 --out DIR` writes a synthetic one".into(),
        ));
    }
    Ok(c)
}

/// The tutorial's `create_dataset`: this rank's shard, random crop with padding 4, random
/// flip, resize, rescale, normalize, HWC to CHW; labels to int32; shuffle(10); batch with
/// drop_remainder; repeat.
fn create_dataset(
    c: &Config,
    comm: &Communication,
    repeat_num: usize,
) -> Result<Dataset, TrainError> {
    let data_set = Cifar10Dataset::new(
        &c.data_path,
        Cifar10Usage::Train,
        SourceOptions {
            num_shards: comm.get_group_size(),
            shard_id: comm.get_rank(),
            num_samples: c.num_samples,
            ..SourceOptions::default()
        },
    )?;
    let c_trans = vec![
        vision::RandomCrop((32, 32), (4, 4, 4, 4)),
        vision::RandomHorizontalFlip(0.5),
        vision::Resize((c.image_size, c.image_size)),
        vision::Rescale(1.0 / 255.0, 0.0),
        vision::Normalize(&[0.4465, 0.4822, 0.4914], &[0.2010, 0.1994, 0.2023]),
        vision::HWC2CHW(),
    ];
    let data_set = data_set.map(vec![vision::TypeCast(DType::Int32)], &["label"])?;
    let data_set = data_set.map(c_trans, &["image"])?;
    let data_set = data_set.shuffle(10)?;
    let data_set = data_set.batch(c.batch_size, true)?;
    Ok(data_set.repeat(repeat_num))
}

fn train_resnet50_with_cifar10(comm: &Communication) -> Result<(), TrainError> {
    let c = config()?;
    let dataset = create_dataset(&c, comm, 1)?;
    let net = ResNet50::new(10).width_divisor(c.width_divisor);
    let loss = SoftmaxCrossEntropyExpand::new(true);
    let opt = Momentum::new(c.learning_rate, 0.9);
    let context = ParallelContext {
        parallel_mode: ParallelMode::DataParallel,
        gradients_mean: true,
        device_num: comm.get_group_size(),
        ..ParallelContext::default()
    };
    let mut model = Model::new(net, loss, &opt)
        .with_context(context)
        .with_communication(comm)
        .with_device_target(c.device_target);
    let mut loss_cb = LossMonitor::new();
    let mut time_cb = TimeMonitor::new();
    // Drawn only when stderr is a terminal (never into the workers' log files).
    let mut bar = ProgressBar::new();
    let mut callbacks: Vec<&mut dyn Callback> = vec![&mut loss_cb, &mut time_cb, &mut bar];
    let mut ckpt_cb;
    if let Some(dir) = &c.checkpoint_dir {
        ckpt_cb = shardc::train::ModelCheckpoint::new(
            "resnet50",
            dir,
            shardc::train::CheckpointConfig::default(),
        );
        callbacks.push(&mut ckpt_cb);
    }
    model.train(c.epochs, &dataset, &mut callbacks)?;
    Ok(())
}

fn main() -> ExitCode {
    communication::main(train_resnet50_with_cifar10)
}
