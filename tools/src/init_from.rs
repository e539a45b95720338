//! `shardc run --init-from FILE`: the run starts from the weights of a checkpoint trained
//! elsewhere (MindSpore's `load_checkpoint` + `load_param_into_net`): MindSpore's `.ckpt`,
//! or a whole-model `.safetensors` (a merged or single-device shardc checkpoint, or any
//! safetensors file of named tensors).
//!
//! Parameters are matched by name, MindSpore's and shardc's being the same
//! (`dense_relu_sequential.0.weight`, `moments.dense_relu_sequential.0.weight`). Before any
//! rank steps, the file is checked against the whole model ([`InitialWeights::check`]):
//! every trainable weight must be there with the model's element type and global shape;
//! every tensor of the file must be a parameter of the model, except MindSpore's training
//! bookkeeping ([`BOOKKEEPING`]); each fault is listed, all at once. Optimizer state the
//! file lacks keeps its initial value, as in MindSpore. Each rank then takes its block of
//! every tensor under its layout ([`InitialWeights::apply`]).

use anyhow::{bail, Context, Result};
use shardc_ir::artifact::Artifact;
use shardc_ir::{ParamKind, TensorLayout, TensorType};
use shardc_runtime::mindspore_ckpt::read_weights;
use shardc_runtime::name_map::NameMap;
use shardc_runtime::{StepExecutor, Tensor};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Names MindSpore saves beside the weights that are not the model's parameters: the
/// training loop's counters and the optimizer's hyperparameters.
pub const BOOKKEEPING: &[&str] = &[
    "global_step",
    "learning_rate",
    "momentum",
    "epoch_num",
    "step_num",
    "current_iterator_step",
    "loss_scale",
    "scale_sense",
];

/// Names of an optimizer's state (MindSpore's and shardc's): a forward model
/// (`shardc predict`) has none, and ignores them in a training checkpoint.
pub const OPTIMIZER_STATE: &[&str] = &[
    "moments.",
    "moment1.",
    "moment2.",
    "accum.",
    "stat.",
    "beta1_power",
    "beta2_power",
];

/// One parameter of the whole model: its global type and whether it is trained.
#[derive(Clone, Debug)]
pub struct ModelParam {
    /// Its name.
    pub name: String,
    /// Its element type and global shape.
    pub ty: TensorType,
    /// Whether autodiff trains it (else optimizer state or a statistic).
    pub trainable: bool,
}

/// The weights of an `--init-from` file.
#[derive(Clone, Debug)]
pub struct InitialWeights {
    path: PathBuf,
    tensors: BTreeMap<String, Tensor>,
    names: NameMap,
}

impl InitialWeights {
    /// Reads `path` (`.ckpt` or `.safetensors`); its names become the model's through
    /// `name_map`'s rules (`--name-map`) and the frameworks' conventions
    /// ([`shardc_runtime::name_map`]).
    pub fn read(path: &Path, name_map: Option<&Path>) -> Result<InitialWeights> {
        let tensors = read_weights(path)?.into_iter().collect();
        let names = match name_map {
            Some(m) => NameMap::read(m).map_err(|e| anyhow::anyhow!("--name-map {e}"))?,
            None => NameMap::default(),
        };
        Ok(InitialWeights {
            path: path.to_path_buf(),
            tensors,
            names,
        })
    }

    /// Checks the file against the whole model's parameters (see the module doc), first
    /// renaming its tensors to the parameters they are for (the name map); the error lists
    /// every missing, misshapen and unknown tensor and every fault of the name map. With
    /// `forward_only` (no optimizer) the file's optimizer state ([`OPTIMIZER_STATE`]) is
    /// ignored too.
    pub fn check(&mut self, model: &[ModelParam], forward_only: bool) -> Result<()> {
        let mut faults = Vec::new();
        let file: BTreeSet<String> = self.tensors.keys().cloned().collect();
        let params: BTreeSet<String> = model.iter().map(|p| p.name.clone()).collect();
        match self.names.resolve(&file, &params) {
            Ok(found) => {
                for (param, name) in found {
                    if param != name {
                        if let Some(t) = self.tensors.remove(&name) {
                            self.tensors.insert(param, t);
                        }
                    }
                }
            }
            Err(map_faults) => faults.extend(map_faults),
        }
        for p in model {
            match self.tensors.get(&p.name) {
                None if p.trainable => faults.push(format!(
                    "the model's weight {} {} is missing",
                    p.name,
                    type_text(&p.ty)
                )),
                None => {}
                Some(t) if t.dtype() != p.ty.dtype || t.shape != p.ty.shape => {
                    faults.push(format!(
                        "{} is {} {:?} in the file but {} in the model",
                        p.name,
                        t.dtype().name(),
                        t.shape,
                        type_text(&p.ty)
                    ))
                }
                Some(_) => {}
            }
        }
        let known: std::collections::HashSet<&str> =
            model.iter().map(|p| p.name.as_str()).collect();
        let extra: Vec<&str> = self
            .tensors
            .keys()
            .map(String::as_str)
            .filter(|n| !known.contains(n) && !BOOKKEEPING.contains(n))
            .filter(|n| !(forward_only && OPTIMIZER_STATE.iter().any(|s| n.starts_with(s))))
            .collect();
        if !extra.is_empty() {
            faults.push(format!(
                "{} tensor(s) of the file are not parameters of the model: {}",
                extra.len(),
                extra.join(", ")
            ));
        }
        if !faults.is_empty() {
            bail!(
                "--init-from {}: the checkpoint does not fit the model:\n  {}",
                self.path.display(),
                faults.join("\n  ")
            );
        }
        Ok(())
    }

    /// Gives `exec` (rank `rank`) the file's value of every weight of its graph that the file
    /// holds, as the rank's block under `layouts` (the parameters' global layouts; absent or
    /// empty: whole). Returns how many it set.
    pub fn apply(
        &self,
        exec: &mut dyn StepExecutor,
        layouts: &BTreeMap<String, TensorLayout>,
        rank: usize,
    ) -> Result<usize> {
        let names: Vec<String> = exec
            .graph()
            .params
            .iter()
            .filter(|p| matches!(p.kind, ParamKind::Weight { .. }))
            .map(|p| p.name.clone())
            .collect();
        let mut set = 0;
        for name in names {
            let Some(whole) = self.tensors.get(&name) else {
                continue;
            };
            let value = match layouts.get(&name) {
                Some(l) => whole.block(&l.block(rank)).with_context(|| {
                    format!(
                        "--init-from {}: {name}: rank {rank}'s block of {:?} under {l}",
                        self.path.display(),
                        whole.shape
                    )
                })?,
                None => whole.clone(),
            };
            exec.set_param(&name, value).with_context(|| {
                format!("--init-from {}: rank {rank}: {name}", self.path.display())
            })?;
            set += 1;
        }
        Ok(set)
    }
}

fn type_text(t: &TensorType) -> String {
    format!("{} {:?}", t.dtype.name(), t.shape)
}

/// The parameters' global layouts of a multi-rank artifact (its manifest's `layouts`; empty
/// for one device).
pub fn layouts_of(art: &Artifact) -> Result<BTreeMap<String, TensorLayout>> {
    match art.manifest.extra.get("layouts") {
        Some(serde_json::Value::Object(m)) => m
            .iter()
            .map(|(k, v)| Ok((k.clone(), serde_json::from_value(v.clone())?)))
            .collect(),
        _ => Ok(BTreeMap::new()),
    }
}

/// Every weight parameter of the whole model an artifact holds, with its global type: the
/// program's parameters (every stage's), shaped by their layouts.
pub fn model_params(art: &Artifact) -> Result<Vec<ModelParam>> {
    let layouts = layouts_of(art)?;
    let program = &art.program;
    let mut seen = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    let graphs =
        std::iter::once(&program.template).chain(program.stages.iter().map(|s| &s.template));
    for g in graphs {
        for p in &g.params {
            if !matches!(p.kind, ParamKind::Weight { .. }) || !seen.insert(p.name.clone()) {
                continue;
            }
            let shape = layouts
                .get(&p.name)
                .map_or_else(|| p.ty.shape.clone(), |l| l.tensor_shape.clone());
            out.push(ModelParam {
                name: p.name.clone(),
                ty: TensorType::new(p.ty.dtype, shape),
                trainable: p.requires_grad(),
            });
        }
    }
    Ok(out)
}

/// The name, inside an artifact, of the weights `shardc compile --init-from` put there.
pub const ARTIFACT_WEIGHTS: &str = "initial_weights.safetensors";

/// The weights a run starts from: `--init-from`'s, else those `shardc compile --init-from`
/// put in the artifact (`None`: the initializers).
pub fn init_path(flag: Option<&Path>, art_dir: &Path, art: &Artifact) -> Option<PathBuf> {
    flag.map(Path::to_path_buf).or_else(|| {
        art.manifest
            .extra
            .get("initial_weights")
            .and_then(|v| v.as_str())
            .map(|name| art_dir.join(name))
    })
}

impl InitialWeights {
    /// Writes the weights as a whole-model safetensors file.
    pub fn save(&self, path: &Path, model: &str) -> Result<()> {
        let tensors: Vec<(String, Tensor)> = self
            .tensors
            .iter()
            .map(|(n, t)| (n.clone(), t.clone()))
            .collect();
        let cp = shardc_runtime::checkpoint::Checkpoint::whole(model, tensors);
        shardc_runtime::checkpoint::save(path, &cp)?;
        Ok(())
    }
}

/// `--init-from`'s weights, read and checked against the artifact's model (`None` without
/// the flag).
pub fn initial_weights(
    path: Option<&Path>,
    name_map: Option<&Path>,
    art: &Artifact,
) -> Result<Option<InitialWeights>> {
    let Some(path) = path else {
        return Ok(None);
    };
    let mut w = InitialWeights::read(path, name_map)?;
    w.check(&model_params(art)?, false)?;
    Ok(Some(w))
}

/// Rank `rank`'s start from `--init-from` (nothing without the flag): the file read, checked
/// against the artifact's model and applied to `exec`.
pub fn init_rank(
    path: Option<&Path>,
    name_map: Option<&Path>,
    art: &Artifact,
    exec: &mut dyn StepExecutor,
    rank: usize,
) -> Result<()> {
    if let Some(w) = initial_weights(path, name_map, art)? {
        w.apply(exec, &layouts_of(art)?, rank)?;
    }
    Ok(())
}
