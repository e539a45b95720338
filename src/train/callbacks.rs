//! Callbacks of [`super::Model::train`], as MindSpore's `mindspore.train` callbacks.

use super::TrainError;
use shardc_runtime::StepExecutor;
use std::io::{IsTerminal, Write};
use std::time::Instant;

/// What a callback is told after a step.
pub struct StepInfo<'a> {
    /// The model's name.
    pub model: &'a str,
    /// The epoch, from 1.
    pub epoch: usize,
    /// The number of epochs of the run.
    pub epochs: usize,
    /// The step within the epoch, from 1 (0 at the end of training).
    pub step_in_epoch: usize,
    /// Steps per epoch (the data set's size in batches).
    pub steps_per_epoch: usize,
    /// Steps done since training began.
    pub global_step: u64,
    /// The step's loss.
    pub loss: f64,
    /// The step's wall-clock time, in seconds.
    pub step_seconds: f64,
    /// This process's rank.
    pub rank: usize,
    /// The number of ranks.
    pub size: usize,
    /// This rank's executor (its weights and optimizer state).
    pub exec: &'a dyn StepExecutor,
    /// The strategy file of a parallel run (every weight's layout), for checkpoints.
    pub strategy: Option<&'a shardc_compiler::strategy_file::StrategyFile>,
}

/// A hook into training (MindSpore's `Callback`): every method does nothing by default.
pub trait Callback {
    /// Before the first step, once the step is compiled.
    fn on_train_begin(
        &mut self,
        _epochs: usize,
        _steps_per_epoch: usize,
    ) -> Result<(), TrainError> {
        Ok(())
    }
    /// After every step.
    fn on_step_end(&mut self, _info: &StepInfo<'_>) -> Result<(), TrainError> {
        Ok(())
    }
    /// After every epoch.
    fn on_epoch_end(&mut self, _info: &StepInfo<'_>) -> Result<(), TrainError> {
        Ok(())
    }
    /// After the last step.
    fn on_train_end(&mut self, _info: &StepInfo<'_>) -> Result<(), TrainError> {
        Ok(())
    }
}

/// MindSpore's `LossMonitor(per_print_times=1)`: prints `epoch: 1 step: 1, loss is 2.4686084`
/// every `per_print_times` steps (the step within the epoch, the loss as a float32).
#[derive(Clone, Debug)]
pub struct LossMonitor {
    per_print_times: usize,
}

impl LossMonitor {
    /// Prints every step.
    pub fn new() -> Self {
        LossMonitor { per_print_times: 1 }
    }

    /// Prints every `n` steps (0 is taken as 1).
    pub fn per_print_times(n: usize) -> Self {
        LossMonitor {
            per_print_times: n.max(1),
        }
    }
}

impl Default for LossMonitor {
    fn default() -> Self {
        Self::new()
    }
}

impl Callback for LossMonitor {
    fn on_step_end(&mut self, info: &StepInfo<'_>) -> Result<(), TrainError> {
        if info.step_in_epoch % self.per_print_times == 0 {
            if !info.loss.is_finite() {
                return Err(TrainError::Mismatch(format!(
                    "epoch: {} step: {}: the loss is {}; training stopped (lower the learning rate?)",
                    info.epoch, info.step_in_epoch, info.loss
                )));
            }
            println!(
                "epoch: {} step: {}, loss is {}",
                info.epoch, info.step_in_epoch, info.loss as f32
            );
        }
        Ok(())
    }
}

/// MindSpore's `TimeMonitor`: at the end of every epoch prints
/// `epoch time: 1234.567 ms, per step time: 12.346 ms`.
#[derive(Debug, Default)]
pub struct TimeMonitor {
    epoch_start: Option<Instant>,
}

impl TimeMonitor {
    /// A monitor.
    pub fn new() -> Self {
        TimeMonitor::default()
    }
}

impl Callback for TimeMonitor {
    fn on_step_end(&mut self, info: &StepInfo<'_>) -> Result<(), TrainError> {
        if info.step_in_epoch == 1 {
            self.epoch_start =
                Some(Instant::now() - std::time::Duration::from_secs_f64(info.step_seconds));
        }
        Ok(())
    }

    fn on_epoch_end(&mut self, info: &StepInfo<'_>) -> Result<(), TrainError> {
        if let Some(t0) = self.epoch_start.take() {
            let ms = t0.elapsed().as_secs_f64() * 1e3;
            println!(
                "epoch time: {ms:.3} ms, per step time: {:.3} ms",
                ms / info.step_in_epoch.max(1) as f64
            );
        }
        Ok(())
    }
}

/// A progress bar on the terminal (stderr), redrawn after every step with the loss and the
/// time per step; silent when stderr is not a terminal (a log file gets only LossMonitor's
/// lines). Only rank 0 draws.
#[derive(Debug)]
pub struct ProgressBar {
    enabled: bool,
    width: usize,
}

impl ProgressBar {
    /// A bar, drawn only if stderr is a terminal.
    pub fn new() -> Self {
        ProgressBar {
            enabled: std::io::stderr().is_terminal(),
            width: 30,
        }
    }

    /// A bar drawn whatever stderr is (for tests and `script`).
    pub fn always() -> Self {
        ProgressBar {
            enabled: true,
            width: 30,
        }
    }

    /// The bar's text for a step (what is drawn).
    pub fn render(&self, info: &StepInfo<'_>) -> String {
        let total = info.steps_per_epoch.max(1);
        let done = info.step_in_epoch.min(total);
        let filled = done * self.width / total;
        format!(
            "epoch {}/{} [{}{}] {done}/{total} loss {:.4} {:.1} ms/step",
            info.epoch,
            info.epochs,
            "=".repeat(filled),
            " ".repeat(self.width - filled),
            info.loss,
            info.step_seconds * 1e3
        )
    }
}

impl Default for ProgressBar {
    fn default() -> Self {
        Self::new()
    }
}

impl Callback for ProgressBar {
    fn on_step_end(&mut self, info: &StepInfo<'_>) -> Result<(), TrainError> {
        if self.enabled && info.rank == 0 {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r{}", self.render(info));
            let _ = err.flush();
        }
        Ok(())
    }

    fn on_epoch_end(&mut self, info: &StepInfo<'_>) -> Result<(), TrainError> {
        if self.enabled && info.rank == 0 {
            eprintln!();
        }
        Ok(())
    }
}

/// When [`ModelCheckpoint`] saves (MindSpore's `CheckpointConfig`).
#[derive(Clone, Debug)]
pub struct CheckpointConfig {
    /// Save every this many steps (MindSpore's default: 1); the end of training is always
    /// saved.
    pub save_checkpoint_steps: u64,
    /// Keep at most this many files per rank, the newest (0 keeps all); MindSpore's default 5.
    pub keep_checkpoint_max: usize,
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        CheckpointConfig {
            save_checkpoint_steps: 1,
            keep_checkpoint_max: 5,
        }
    }
}

/// MindSpore's `ModelCheckpoint(prefix, directory, config)`: every rank writes its weights and
/// optimizer state as `DIR/{rank_id}/{prefix}-{epoch}_{step}.safetensors` (atomically: a
/// temporary file renamed), every `save_checkpoint_steps` steps and at the end of training.
/// The default directory `.` gives the tutorial's `./{rank_id}/`. In a parallel run rank 0
/// also writes the strategy file as `DIR/strategy.json`, which `shardc ckpt merge` reads.
#[derive(Clone, Debug)]
pub struct ModelCheckpoint {
    prefix: String,
    directory: std::path::PathBuf,
    config: CheckpointConfig,
    last_saved: Option<u64>,
    saved: Vec<std::path::PathBuf>,
}

impl ModelCheckpoint {
    /// Files `directory/{rank_id}/{prefix}-{epoch}_{step}.safetensors`.
    pub fn new(
        prefix: &str,
        directory: impl Into<std::path::PathBuf>,
        config: CheckpointConfig,
    ) -> Self {
        ModelCheckpoint {
            prefix: prefix.to_string(),
            directory: directory.into(),
            config,
            last_saved: None,
            saved: Vec::new(),
        }
    }

    /// The files written so far, in order.
    pub fn saved(&self) -> &[std::path::PathBuf] {
        &self.saved
    }

    fn save(&mut self, info: &StepInfo<'_>) -> Result<(), TrainError> {
        if self.last_saved == Some(info.global_step) {
            return Ok(());
        }
        let step_in_epoch = if info.step_in_epoch == 0 {
            info.steps_per_epoch
        } else {
            info.step_in_epoch
        };
        let cp = shardc_runtime::checkpoint::Checkpoint::of_executor(
            info.exec,
            info.rank as u32,
            info.size as u32,
            info.global_step,
            info.epoch as u64,
        )?;
        let path = shardc_runtime::checkpoint::save_rank(
            &self.directory,
            &self.prefix,
            step_in_epoch as u64,
            &cp,
            self.config.keep_checkpoint_max,
        )?;
        self.saved.push(path);
        if self.last_saved.is_none() && info.rank == 0 {
            if let Some(sf) = info.strategy {
                sf.save(&self.directory.join("strategy.json"))
                    .map_err(|e| TrainError::Mismatch(format!("ModelCheckpoint: {e}")))?;
            }
        }
        self.last_saved = Some(info.global_step);
        Ok(())
    }
}

impl Callback for ModelCheckpoint {
    fn on_train_begin(&mut self, _: usize, _: usize) -> Result<(), TrainError> {
        shardc_runtime::checkpoint::check_prefix(&self.prefix)?;
        Ok(())
    }

    fn on_step_end(&mut self, info: &StepInfo<'_>) -> Result<(), TrainError> {
        let every = self.config.save_checkpoint_steps.max(1);
        if info.global_step % every == 0 {
            self.save(info)?;
        }
        Ok(())
    }

    fn on_train_end(&mut self, info: &StepInfo<'_>) -> Result<(), TrainError> {
        self.save(info)
    }
}
