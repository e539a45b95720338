//! The strategy file (MindSpore's `strategy_ckpt_config` save / load), as JSON.
//!
//! It records, per weight, the layout its slices follow (`dev_matrix`, `tensor_map`,
//! `tensor_shape`, as MindSpore's strategy checkpoint) and, per op of the training graph, its
//! strategy and where that came from. Loading it into the same model sets every op's strategy
//! (optimizer updates and `Assign`s follow their weight as always), so compiling again gives
//! the same per-rank graphs.

use serde::{Deserialize, Serialize};
use shardc_ir::{Graph, OpClass, OpKind, Strategy};
use shardc_passes::parallel::strategy::Assignment;
use shardc_passes::parallel::{search, ParallelOptions};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use thiserror::Error;

/// The format tag written into every file.
pub const FORMAT: &str = "shardc-strategy-v1";

/// A weight's layout.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParamLayout {
    /// The device matrix.
    pub dev_matrix: Vec<usize>,
    /// The tensor map (MindSpore's convention).
    pub tensor_map: Vec<i64>,
    /// The logical shape.
    pub tensor_shape: Vec<usize>,
}

/// An op's `(in_strategy, out_strategy)` as a strategy file imposes them.
pub type InOutStrategy = (Strategy, Option<Strategy>);

/// One op's entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpEntry {
    /// The op (`MatMul`).
    pub op: String,
    /// Its strategy, one tuple per tensor input.
    pub strategy: Vec<Vec<i64>>,
    /// Its out strategy, one tuple per result, when it splits a dimension no input has
    /// (UnsortedSegmentSum's segments).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub out_strategy: Option<Vec<Vec<i64>>>,
    /// Where it came from.
    pub source: String,
}

/// The cost model's prediction of one training step (`shardc_passes::parallel::cost`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PredictedStep {
    /// Compute plus communication, seconds.
    pub step_seconds: f64,
    /// Compute, seconds.
    pub compute_seconds: f64,
    /// Communication, seconds.
    pub communication_seconds: f64,
    /// Bytes kept per device.
    pub memory_bytes: f64,
    /// Whether the searcher proved the strategies optimal under the cost model.
    pub exact: bool,
}

/// The whole file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StrategyFile {
    /// [`FORMAT`].
    pub format: String,
    /// The model's name.
    pub model: String,
    /// The device count.
    pub device_num: usize,
    /// The parallel mode (`semi_auto_parallel`, ...).
    pub parallel_mode: String,
    /// The searcher that decided unannotated ops.
    pub searcher: String,
    /// The cost model's prediction of one training step under these strategies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted: Option<PredictedStep>,
    /// Per parameter (weights and data inputs): its layout.
    pub parameters: BTreeMap<String, ParamLayout>,
    /// Per op instance: its strategy.
    pub ops: BTreeMap<String, OpEntry>,
    /// Pipeline stages, when more than one: the layouts then span every device (the stage
    /// axis major) and each stage's ranks hold its own weights (`shardc ckpt merge` merges
    /// them stage by stage).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pipeline_stages: Option<usize>,
}

/// A strategy file that cannot be read or does not fit the model.
#[derive(Debug, Error)]
pub enum StrategyFileError {
    /// Reading or writing failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Not a strategy file.
    #[error("{path}: not a shardc strategy file: {reason}")]
    Format {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The file was written for another model or device count.
    #[error("{path}: {reason}")]
    Mismatch {
        /// The file.
        path: PathBuf,
        /// What does not match.
        reason: String,
    },
}

impl StrategyFile {
    /// The strategy file of a parallel compilation: its annotated logical graph (the
    /// `step_parallel_begin` graph), assignment and options.
    pub fn of(
        begin: &Graph,
        assignment: &Assignment,
        options: &ParallelOptions,
        parallel_mode: &str,
        searcher: &str,
    ) -> StrategyFile {
        let g = begin;
        let parameters = g
            .params
            .iter()
            .zip(&assignment.param_layouts)
            .map(|(param, l)| {
                (
                    param.name.clone(),
                    ParamLayout {
                        dev_matrix: l.dev_matrix.clone(),
                        tensor_map: l.tensor_map.clone(),
                        tensor_shape: l.tensor_shape.clone(),
                    },
                )
            })
            .collect();
        let ops = g
            .nodes
            .iter()
            .zip(&assignment.decisions)
            .filter_map(|(n, d)| {
                let d = d.as_ref()?;
                Some((
                    n.instance.clone(),
                    OpEntry {
                        op: n.op.name().to_string(),
                        strategy: d.sharding.strategy.0.clone(),
                        out_strategy: d.sharding.out_strategy.as_ref().map(|s| s.0.clone()),
                        source: d.source.to_string(),
                    },
                ))
            })
            .collect();
        let (predicted, exact) = match &assignment.search {
            Some(r) => (Some(r.predicted), r.exact),
            None => (search::predict(g, options, assignment).ok(), false),
        };
        StrategyFile {
            format: FORMAT.into(),
            model: g.name.clone(),
            pipeline_stages: None,
            device_num: options.device_num,
            parallel_mode: parallel_mode.into(),
            searcher: searcher.into(),
            predicted: predicted.map(|b| PredictedStep {
                step_seconds: b.seconds(),
                compute_seconds: b.compute,
                communication_seconds: b.communication,
                memory_bytes: b.memory,
                exact,
            }),
            parameters,
            ops,
        }
    }

    /// Writes the file (pretty JSON) through a temporary file and a rename.
    pub fn save(&self, path: &Path) -> Result<(), StrategyFileError> {
        let io = |source| StrategyFileError::Io {
            path: path.to_path_buf(),
            source,
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let text = serde_json::to_string_pretty(self).expect("a strategy file serialises");
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, text).map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)
    }

    /// Reads a file written by [`StrategyFile::save`].
    pub fn load(path: &Path) -> Result<StrategyFile, StrategyFileError> {
        let text = std::fs::read_to_string(path).map_err(|source| StrategyFileError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let f: StrategyFile =
            serde_json::from_str(&text).map_err(|e| StrategyFileError::Format {
                path: path.to_path_buf(),
                reason: e.to_string(),
            })?;
        if f.format != FORMAT {
            return Err(StrategyFileError::Format {
                path: path.to_path_buf(),
                reason: format!("format is {:?}, expected {FORMAT:?}", f.format),
            });
        }
        Ok(f)
    }

    /// The strategies to impose on `g` (the training graph), by node index, as `(in_strategy,
    /// out_strategy)`: every op the file names except optimizer updates and `Assign` (they
    /// follow their weight). Errors: a device count or model that differs, an op of `g` the
    /// file lacks or of another kind.
    pub fn strategies_for(
        &self,
        g: &Graph,
        device_num: usize,
        path: &Path,
    ) -> Result<Vec<Option<InOutStrategy>>, StrategyFileError> {
        let mismatch = |reason: String| StrategyFileError::Mismatch {
            path: path.to_path_buf(),
            reason,
        };
        if self.device_num != device_num {
            return Err(mismatch(format!(
                "written for {} devices, compiling for {device_num}",
                self.device_num
            )));
        }
        if self.model != g.name {
            return Err(mismatch(format!(
                "written for model {:?}, compiling {:?}",
                self.model, g.name
            )));
        }
        let mut out = vec![None; g.nodes.len()];
        for (i, n) in g.nodes.iter().enumerate() {
            if n.op == OpKind::TupleGetItem
                || n.op == OpKind::Assign
                || n.op.class() == OpClass::Optimizer
            {
                continue;
            }
            let e = self.ops.get(&n.instance).ok_or_else(|| {
                mismatch(format!(
                    "no strategy for op {} '{}' (the model changed since the file was saved?)",
                    n.op, n.instance
                ))
            })?;
            if e.op != n.op.name() {
                return Err(mismatch(format!(
                    "op '{}' is {} in the file but {} in the model",
                    n.instance, e.op, n.op
                )));
            }
            out[i] = Some((
                Strategy(e.strategy.clone()),
                e.out_strategy.clone().map(Strategy),
            ));
        }
        Ok(out)
    }
}
