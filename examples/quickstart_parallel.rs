//! MindSpore's parallel-training quickstart (`parallel_training_quick_start`) in shardc: the
//! `Net(32, 16, 16)` with `matmul` sharded `((2, 4), (4, 1))` and everything else decided by
//! sharding propagation (`auto_parallel`), 8 ranks, MSELoss, Momentum(0.2, 0.1), 5 epochs of
//! 4 steps on a fixed random batch of 2 per rank; the dumps in `saved_graph/rank_R/`
//! (`step_parallel_begin_NNNN.ir`, `09_execute_NNNN.ir`) and every rank's checkpoints in
//! `DIR/{rank_id}/`.
//!
//! `examples/run_quickstart_parallel.sh` starts it with `shardc launch` (8 workers); options:
//! `--epochs 5`, `--save-graphs-path saved_graph`, `--checkpoint-dir .`, `--gradients-mean
//! false` (the tutorial's default: the replicas' gradients are summed; `true` averages them,
//! which makes the 8 ranks train exactly what one device does on the same batches).

use shardc::communication::{self, Communication};
use shardc::compiler::loss::MSELoss;
use shardc::compiler::optim::Momentum;
use shardc::compiler::parallel_context::{ParallelContext, ParallelMode, SearchMode};
use shardc::compiler::zoo::QuickstartNet;
use shardc::runtime::data::{GeneratorDataset, SourceOptions};
use shardc::runtime::Tensor;
use shardc::train::{Callback, CheckpointConfig, LossMonitor, Model, ModelCheckpoint, TrainError};
use std::path::PathBuf;
use std::process::ExitCode;

const STEP_PER_EPOCH: usize = 4;
const SINGLE_BATCH_SIZE: usize = 2;
const IN_DIM: usize = 32;
const OUT_DIM: usize = 16;

/// The tutorial's `get_dataset`: one seeded uniform batch (numpy's `rand` in the tutorial),
/// yielded `step_per_epoch` times.
fn get_dataset() -> Result<shardc::runtime::data::Dataset, TrainError> {
    let mut state = 1u64;
    let mut rand = |n: usize| -> Vec<f32> {
        (0..n)
            .map(|_| {
                // splitmix64: a fixed stream, the same on every rank.
                state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
                let mut z = state;
                z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
                ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 24) as f32
            })
            .collect()
    };
    let input = Tensor::from_f32(
        vec![SINGLE_BATCH_SIZE, IN_DIM],
        rand(SINGLE_BATCH_SIZE * IN_DIM),
    );
    let label = Tensor::from_f32(
        vec![SINGLE_BATCH_SIZE, OUT_DIM],
        rand(SINGLE_BATCH_SIZE * OUT_DIM),
    );
    let (Some(input), Some(label)) = (input, label) else {
        return Err(TrainError::Mismatch("building the fake batch".into()));
    };
    Ok(GeneratorDataset::new(
        &["input", "label"],
        STEP_PER_EPOCH,
        move |_| Ok(vec![input.clone(), label.clone()]),
        SourceOptions::default(),
    )?)
}

fn train(comm: &Communication) -> Result<(), TrainError> {
    let mut epochs = 5;
    let mut graphs = PathBuf::from("saved_graph");
    let mut ckpt_dir = PathBuf::from(".");
    let mut gradients_mean = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let v = args
            .next()
            .ok_or_else(|| TrainError::Mismatch(format!("{a} needs a value")))?;
        match a.as_str() {
            "--epochs" => {
                epochs = v
                    .parse()
                    .map_err(|_| TrainError::Mismatch(format!("--epochs {v}: not a count")))?
            }
            "--save-graphs-path" => graphs = PathBuf::from(v),
            "--checkpoint-dir" => ckpt_dir = PathBuf::from(v),
            "--gradients-mean" => {
                gradients_mean = v.parse().map_err(|_| {
                    TrainError::Mismatch(format!("--gradients-mean {v}: expected true or false"))
                })?
            }
            _ => return Err(TrainError::Mismatch(format!("unknown option {a}"))),
        }
    }
    let context = ParallelContext {
        parallel_mode: ParallelMode::AutoParallel,
        search_mode: SearchMode::ShardingPropagation,
        device_num: comm.get_group_size(),
        gradients_mean,
        ..ParallelContext::default()
    };
    let dataset = get_dataset()?;
    let net = QuickstartNet;
    let loss = MSELoss::new();
    let opt = Momentum::new(0.2, 0.1);
    let mut model = Model::new(net, loss, &opt)
        .with_context(context)
        .with_communication(comm)
        .with_save_graphs(graphs);
    let mut monitor = LossMonitor::new();
    let mut ckpt = ModelCheckpoint::new(
        "checkpoint_Net",
        ckpt_dir,
        CheckpointConfig {
            save_checkpoint_steps: STEP_PER_EPOCH as u64,
            keep_checkpoint_max: 5,
        },
    );
    let mut callbacks: Vec<&mut dyn Callback> = vec![&mut monitor, &mut ckpt];
    model.train(epochs, &dataset, &mut callbacks)?;
    Ok(())
}

fn main() -> ExitCode {
    communication::main(train)
}
