//! Per-rank training checkpoints as safetensors files: written atomically, checked on load,
//! found again for resuming, and merged into one single-device checkpoint.
//!
//! # The file
//!
//! One `.safetensors` file per rank and saved step holds every weight of the rank's graph (all
//! `Ref` parameters: the model's weights and the optimizer's state, `moments.w`, Adam's
//! `moment1.w` / `moment2.w` / `beta1_power`, ...) under its graph name, each as the block the
//! rank holds. Its `__metadata__` (all strings) holds:
//!
//! | key | value |
//! |---|---|
//! | `format` | [`FORMAT`] |
//! | `model` | the model's (graph's) name |
//! | `rank`, `device_num` | which rank of how many wrote it (a merged file: `0` of `1`) |
//! | `step` | training steps completed when it was written |
//! | `epoch` | the epoch of the last completed step (1-based; 0 before the first step) |
//! | `identity` | [`identity_of_graph`]: SHA-256 of the model name and, per weight, its name, dtype, global shape, block shape and block offset |
//! | `sha256` | SHA-256 of the tensors (names, dtypes, shapes and bytes; safetensors has no checksum) |
//!
//! The identity is the same for the single-device graph of a model and for a file merged from
//! any strategy's ranks, and differs for another model, another optimizer or another block of
//! the weights: a checkpoint of another model or strategy is refused instead of loaded.
//!
//! # The directory
//!
//! `DIR/{rank}/{prefix}-{epoch}_{step}.safetensors` (MindSpore's `{prefix}-{epoch}_{step}.ckpt`:
//! `step` counts within the epoch; the global step is in the metadata). [`save_rank`] writes
//! `NAME.tmp`, syncs it, renames it to `NAME` and syncs the directory, so a writer killed at
//! any point never leaves a file that looks complete; then keeps the newest `keep_max` files of
//! the prefix. [`find_resume`] picks the newest step for which every rank has a complete, valid
//! file (any `*.safetensors` name, so a merged file dropped into `DIR/0/` resumes a single
//! device); newer steps that are incomplete or invalid are skipped, each with a warning naming
//! the file and the reason, which the caller prints.

use crate::step::StepExecutor;
use crate::tensor::{Data, Tensor};
use half::{bf16, f16};
use safetensors::tensor::{Dtype, SafeTensors, View};
use sha2::{Digest, Sha256};
use shardc_ir::{DType, Graph, Init, ParamKind, TensorLayout, TensorType};
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// The format tag in every checkpoint's metadata.
pub const FORMAT: &str = "shardc-checkpoint-v1";

/// The file extension of checkpoints.
pub const EXTENSION: &str = "safetensors";

/// Headers larger than this are refused before they are read (the real ones are a few KiB).
const MAX_HEADER: u64 = 64 << 20;

/// Why a checkpoint could not be written, read, found or merged. Every message names the file
/// (or the parameter) and the reason.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// A file-system operation failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The file is not a valid shardc checkpoint (bad header, truncated, wrong checksum, ...).
    #[error("{}: corrupt checkpoint: {reason}", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The file is valid but was written for another model, rank, device count or strategy.
    #[error("{}: checkpoint does not fit: {reason}", path.display())]
    Mismatch {
        /// The file.
        path: PathBuf,
        /// What differs.
        reason: String,
    },
    /// The ranks' blocks of a parameter cannot be merged.
    #[error("merging parameter {param}: {reason}")]
    Merge {
        /// The parameter.
        param: String,
        /// Why.
        reason: String,
    },
    /// No step has a complete, valid set of files.
    #[error("{}: no complete checkpoint to resume from: {reason}", dir.display())]
    NoCheckpoint {
        /// The checkpoint directory.
        dir: PathBuf,
        /// Why (the files skipped and their reasons).
        reason: String,
    },
    /// A checkpoint cannot be written as asked (bad prefix, empty tensor name, ...).
    #[error("cannot write checkpoint {what}: {reason}")]
    Invalid {
        /// The file or argument.
        what: String,
        /// Why.
        reason: String,
    },
}

/// What a checkpoint file says about itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointMeta {
    /// The model's name.
    pub model: String,
    /// The rank that wrote it.
    pub rank: u32,
    /// The number of ranks of the run.
    pub device_num: u32,
    /// Training steps completed.
    pub step: u64,
    /// The epoch of the last completed step (1-based; 0 before any step).
    pub epoch: u64,
    /// The artifact identity ([`identity_of_graph`]).
    pub identity: String,
}

/// A checkpoint in memory: its metadata and its tensors, sorted by name.
#[derive(Clone, Debug, PartialEq)]
pub struct Checkpoint {
    /// The metadata.
    pub meta: CheckpointMeta,
    /// The tensors (name, value), sorted by name.
    pub tensors: Vec<(String, Tensor)>,
}

/// One weight as the identity sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdentityEntry {
    /// The parameter's name.
    pub name: String,
    /// Its element type.
    pub dtype: DType,
    /// The logical (whole) shape.
    pub global_shape: Vec<usize>,
    /// The shape of the block held.
    pub local_shape: Vec<usize>,
    /// Where the block starts, per dimension.
    pub offset: Vec<usize>,
}

/// The identity of a set of weights: SHA-256 (hex) of the model name and each entry, sorted by
/// name.
pub fn identity(model: &str, entries: &[IdentityEntry]) -> String {
    let mut sorted: Vec<&IdentityEntry> = entries.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    let mut h = Sha256::new();
    h.update(b"shardc-identity-v1\0");
    h.update(model.as_bytes());
    h.update([0]);
    for e in sorted {
        h.update(e.name.as_bytes());
        h.update([0]);
        h.update(e.dtype.name().as_bytes());
        h.update([0]);
        for dims in [&e.global_shape, &e.local_shape, &e.offset] {
            h.update((dims.len() as u64).to_le_bytes());
            for &d in dims {
                h.update((d as u64).to_le_bytes());
            }
        }
    }
    hex(&h.finalize())
}

/// The identity of a (rank's) graph: every weight with its global shape, block shape and
/// block offset. Equal for a model's single-device graph and a checkpoint merged from its
/// ranks.
pub fn identity_of_graph(g: &Graph) -> String {
    let entries: Vec<IdentityEntry> = g
        .params
        .iter()
        .filter_map(|p| match &p.kind {
            ParamKind::Input => None,
            ParamKind::Weight { init, .. } => {
                let (global_shape, offset) = match init {
                    Init::Block {
                        global_shape,
                        offset,
                        ..
                    } => (global_shape.clone(), offset.clone()),
                    _ => (p.ty.shape.clone(), vec![0; p.ty.shape.len()]),
                };
                Some(IdentityEntry {
                    name: p.name.clone(),
                    dtype: p.ty.dtype,
                    global_shape,
                    local_shape: p.ty.shape.clone(),
                    offset,
                })
            }
        })
        .collect();
    identity(&g.name, &entries)
}

/// The identity of a whole (single-device) set of tensors: each held whole.
fn identity_of_whole(model: &str, tensors: &[(String, Tensor)]) -> String {
    let entries: Vec<IdentityEntry> = tensors
        .iter()
        .map(|(n, t)| IdentityEntry {
            name: n.clone(),
            dtype: t.dtype(),
            global_shape: t.shape.clone(),
            local_shape: t.shape.clone(),
            offset: vec![0; t.shape.len()],
        })
        .collect();
    identity(model, &entries)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The file name of a checkpoint: `{prefix}-{epoch}_{step_in_epoch}.safetensors`.
pub fn file_name(prefix: &str, epoch: u64, step_in_epoch: u64) -> String {
    format!("{prefix}-{epoch}_{step_in_epoch}.{EXTENSION}")
}

/// The epoch (1-based) and the step within it of global step `step` (1-based, completed
/// steps) with `per_epoch` steps per epoch; `(0, 0)` for step 0.
pub fn epoch_and_step(step: u64, per_epoch: u64) -> (u64, u64) {
    if step == 0 {
        return (0, 0);
    }
    let per = per_epoch.max(1);
    ((step - 1) / per + 1, (step - 1) % per + 1)
}

// ---------------------------------------------------------------------------------------------
// Tensors <-> bytes

fn st_dtype(d: DType) -> Dtype {
    match d {
        DType::Float32 => Dtype::F32,
        DType::Float64 => Dtype::F64,
        DType::Float16 => Dtype::F16,
        DType::BFloat16 => Dtype::BF16,
        DType::Int32 => Dtype::I32,
        DType::Int64 => Dtype::I64,
        DType::Bool => Dtype::BOOL,
    }
}

fn our_dtype(d: Dtype) -> Option<DType> {
    Some(match d {
        Dtype::F32 => DType::Float32,
        Dtype::F64 => DType::Float64,
        Dtype::F16 => DType::Float16,
        Dtype::BF16 => DType::BFloat16,
        Dtype::I32 => DType::Int32,
        Dtype::I64 => DType::Int64,
        Dtype::BOOL => DType::Bool,
        _ => return None,
    })
}

/// A tensor from little-endian bytes; `Err` names what is wrong.
fn tensor_from_bytes(dtype: DType, shape: &[usize], bytes: &[u8]) -> Result<Tensor, String> {
    let n = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| format!("shape {shape:?} overflows"))?;
    let size = dtype.size_bytes();
    if n.checked_mul(size) != Some(bytes.len()) {
        return Err(format!(
            "{} bytes for {n} elements of {}",
            bytes.len(),
            dtype.name()
        ));
    }
    fn arr<const N: usize>(c: &[u8]) -> [u8; N] {
        let mut a = [0u8; N];
        a.copy_from_slice(c);
        a
    }
    let data = match dtype {
        DType::Float32 => Data::F32(
            bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(arr(c)))
                .collect(),
        ),
        DType::Float64 => Data::F64(
            bytes
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes(arr(c)))
                .collect(),
        ),
        DType::Float16 => Data::F16(
            bytes
                .chunks_exact(2)
                .map(|c| f16::from_bits(u16::from_le_bytes(arr(c))))
                .collect(),
        ),
        DType::BFloat16 => Data::BF16(
            bytes
                .chunks_exact(2)
                .map(|c| bf16::from_bits(u16::from_le_bytes(arr(c))))
                .collect(),
        ),
        DType::Int32 => Data::I32(
            bytes
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes(arr(c)))
                .collect(),
        ),
        DType::Int64 => Data::I64(
            bytes
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(arr(c)))
                .collect(),
        ),
        DType::Bool => Data::Bool(
            bytes
                .iter()
                .enumerate()
                .map(|(i, &b)| match b {
                    0 => Ok(false),
                    1 => Ok(true),
                    _ => Err(format!("bool element {i} is byte {b}, not 0 or 1")),
                })
                .collect::<Result<_, _>>()?,
        ),
    };
    Ok(Tensor {
        shape: shape.to_vec(),
        data,
    })
}

/// The checksum of a set of tensors (sorted by name): names, dtypes, shapes and bytes.
fn checksum<'a>(tensors: impl Iterator<Item = (&'a str, DType, &'a [usize], &'a [u8])>) -> String {
    let mut h = Sha256::new();
    for (name, dtype, shape, bytes) in tensors {
        h.update((name.len() as u64).to_le_bytes());
        h.update(name.as_bytes());
        h.update(dtype.name().as_bytes());
        h.update([0]);
        h.update((shape.len() as u64).to_le_bytes());
        for &d in shape {
            h.update((d as u64).to_le_bytes());
        }
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    }
    hex(&h.finalize())
}

struct RawView {
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

impl View for &RawView {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.bytes)
    }
    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

// ---------------------------------------------------------------------------------------------
// Writing and reading one file

impl Checkpoint {
    /// A single-device checkpoint of whole tensors of model `model` (sorted by name; step and
    /// epoch 0): another framework's weights (MindSpore's `.ckpt`) in this format.
    pub fn whole(model: &str, mut tensors: Vec<(String, Tensor)>) -> Checkpoint {
        tensors.sort_by(|a, b| a.0.cmp(&b.0));
        Checkpoint {
            meta: CheckpointMeta {
                model: model.to_string(),
                rank: 0,
                device_num: 1,
                step: 0,
                epoch: 0,
                identity: identity_of_whole(model, &tensors),
            },
            tensors,
        }
    }

    /// The checkpoint of an executor's weights (every `Ref` parameter) after `step` completed
    /// steps, as rank `rank` of `device_num`. Errors: the weights could not be read back from
    /// the executor's device.
    pub fn of_executor(
        exec: &dyn StepExecutor,
        rank: u32,
        device_num: u32,
        step: u64,
        epoch: u64,
    ) -> Result<Checkpoint, crate::RuntimeError> {
        let mut tensors: Vec<(String, Tensor)> = exec.weight_values()?;
        tensors.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(Checkpoint {
            meta: CheckpointMeta {
                model: exec.graph().name.clone(),
                rank,
                device_num,
                step,
                epoch,
                identity: identity_of_graph(exec.graph()),
            },
            tensors,
        })
    }

    /// The tensor `name`.
    pub fn tensor(&self, name: &str) -> Option<&Tensor> {
        self.tensors.iter().find(|(n, _)| n == name).map(|(_, t)| t)
    }

    /// Checks that this checkpoint (read from `path`) fits rank `rank` of `device_num` running
    /// `graph`: model, rank, device count, identity, and every weight present with its dtype
    /// and shape and nothing else.
    pub fn check_against(
        &self,
        path: &Path,
        graph: &Graph,
        rank: u32,
        device_num: u32,
    ) -> Result<(), CheckpointError> {
        let bad = |reason: String| CheckpointError::Mismatch {
            path: path.to_path_buf(),
            reason,
        };
        let m = &self.meta;
        if m.model != graph.name {
            return Err(bad(format!(
                "written for model {:?}, this artifact is model {:?}",
                m.model, graph.name
            )));
        }
        if m.device_num != device_num || m.rank != rank {
            return Err(bad(format!(
                "written by rank {} of {}, loading into rank {rank} of {device_num}",
                m.rank, m.device_num
            )));
        }
        for p in graph.params.iter().filter(|p| p.is_weight()) {
            let Some(t) = self.tensor(&p.name) else {
                return Err(bad(format!("weight {} is missing", p.name)));
            };
            if t.dtype() != p.ty.dtype || t.shape != p.ty.shape {
                return Err(bad(format!(
                    "weight {} is {} {:?} in the file but {} {:?} in the graph",
                    p.name,
                    t.dtype().name(),
                    t.shape,
                    p.ty.dtype.name(),
                    p.ty.shape
                )));
            }
        }
        for (n, _) in &self.tensors {
            if !graph
                .param_by_name(n)
                .is_some_and(|id| graph.params[id.index()].is_weight())
            {
                return Err(bad(format!("tensor {n} is not a weight of the graph")));
            }
        }
        let want = identity_of_graph(graph);
        if m.identity != want {
            return Err(bad(format!(
                "artifact identity {} differs from this graph's {want} (another model, optimizer or strategy)",
                m.identity
            )));
        }
        Ok(())
    }

    /// Checks the checkpoint against the executor's graph ([`Checkpoint::check_against`]),
    /// then sets every weight and the executor's step count. Nothing is changed on error.
    pub fn apply_to(
        &self,
        path: &Path,
        exec: &mut dyn StepExecutor,
        rank: u32,
        device_num: u32,
    ) -> Result<(), CheckpointError> {
        self.check_against(path, exec.graph(), rank, device_num)?;
        for (n, t) in &self.tensors {
            exec.set_param(n, t.clone())
                .map_err(|e| CheckpointError::Mismatch {
                    path: path.to_path_buf(),
                    reason: e.to_string(),
                })?;
        }
        exec.set_step_count(self.meta.step);
        Ok(())
    }

    /// The file's bytes: safetensors with the metadata of the module doc.
    pub fn to_bytes(&self) -> Result<Vec<u8>, CheckpointError> {
        let invalid = |reason: String| CheckpointError::Invalid {
            what: format!("of model {}", self.meta.model),
            reason,
        };
        let mut seen = std::collections::HashSet::new();
        let mut views: Vec<(String, RawView)> = Vec::with_capacity(self.tensors.len());
        for (n, t) in &self.tensors {
            if n.is_empty() || n == "__metadata__" {
                return Err(invalid(format!("tensor name {n:?} is reserved or empty")));
            }
            if !seen.insert(n.as_str()) {
                return Err(invalid(format!("tensor {n} appears twice")));
            }
            views.push((
                n.clone(),
                RawView {
                    dtype: st_dtype(t.dtype()),
                    shape: t.shape.clone(),
                    bytes: t.to_le_bytes(),
                },
            ));
        }
        views.sort_by(|a, b| a.0.cmp(&b.0));
        let sum = checksum(views.iter().map(|(n, v)| {
            (
                n.as_str(),
                our_dtype(v.dtype).unwrap_or(DType::Float32),
                v.shape.as_slice(),
                v.bytes.as_slice(),
            )
        }));
        let m = &self.meta;
        let meta: HashMap<String, String> = [
            ("format", FORMAT.to_string()),
            ("model", m.model.clone()),
            ("rank", m.rank.to_string()),
            ("device_num", m.device_num.to_string()),
            ("step", m.step.to_string()),
            ("epoch", m.epoch.to_string()),
            ("identity", m.identity.clone()),
            ("sha256", sum),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        safetensors::tensor::serialize(views.iter().map(|(n, v)| (n.as_str(), v)), Some(meta))
            .map_err(|e| invalid(e.to_string()))
    }

    /// Parses and checks a checkpoint file's bytes (`path` for messages): the safetensors
    /// structure, the format tag, the metadata, every dtype, and the checksum.
    pub fn from_bytes(path: &Path, bytes: &[u8]) -> Result<Checkpoint, CheckpointError> {
        let corrupt = |reason: String| CheckpointError::Corrupt {
            path: path.to_path_buf(),
            reason,
        };
        let (_, header) = SafeTensors::read_metadata(bytes).map_err(|e| corrupt(header_err(e)))?;
        let meta = parse_meta(header.metadata().as_ref()).map_err(&corrupt)?;
        let st = SafeTensors::deserialize(bytes).map_err(|e| corrupt(header_err(e)))?;
        let mut raw: Vec<(String, DType, Vec<usize>, &[u8])> = Vec::with_capacity(st.len());
        for (name, view) in st.iter() {
            let dtype = our_dtype(view.dtype()).ok_or_else(|| {
                corrupt(format!(
                    "tensor {name} has dtype {:?}, which shardc does not use",
                    view.dtype()
                ))
            })?;
            raw.push((name.to_string(), dtype, view.shape().to_vec(), view.data()));
        }
        raw.sort_by(|a, b| a.0.cmp(&b.0));
        let sum = checksum(
            raw.iter()
                .map(|(n, d, s, b)| (n.as_str(), *d, s.as_slice(), *b)),
        );
        let stored = meta.1;
        if sum != stored {
            return Err(corrupt(format!(
                "checksum mismatch: the tensors hash to {sum} but the metadata says {stored}"
            )));
        }
        let mut tensors = Vec::with_capacity(raw.len());
        for (n, d, s, b) in raw {
            let t = tensor_from_bytes(d, &s, b).map_err(|r| corrupt(format!("tensor {n}: {r}")))?;
            tensors.push((n, t));
        }
        Ok(Checkpoint {
            meta: meta.0,
            tensors,
        })
    }
}

fn header_err(e: safetensors::SafeTensorError) -> String {
    use safetensors::SafeTensorError as E;
    match e {
        E::MetadataIncompleteBuffer => {
            "the data section is shorter than the header says (truncated file?)".into()
        }
        E::HeaderTooSmall => "the file is too short to hold a safetensors header".into(),
        other => format!("bad safetensors header: {other}"),
    }
}

/// The metadata and the stored checksum, from the header's `__metadata__`.
fn parse_meta(m: Option<&HashMap<String, String>>) -> Result<(CheckpointMeta, String), String> {
    let m = m.ok_or("no __metadata__: not a shardc checkpoint")?;
    let get = |k: &str| {
        m.get(k)
            .cloned()
            .ok_or_else(|| format!("metadata lacks {k:?}"))
    };
    let format = get("format")?;
    if format != FORMAT {
        return Err(format!("format tag is {format:?}, expected {FORMAT:?}"));
    }
    let num = |k: &str| -> Result<u64, String> {
        let v = get(k)?;
        v.parse::<u64>()
            .map_err(|_| format!("metadata {k} = {v:?} is not a non-negative integer"))
    };
    let narrow = |k: &str| -> Result<u32, String> {
        u32::try_from(num(k)?).map_err(|_| format!("metadata {k} is out of range"))
    };
    let meta = CheckpointMeta {
        model: get("model")?,
        rank: narrow("rank")?,
        device_num: narrow("device_num")?,
        step: num("step")?,
        epoch: num("epoch")?,
        identity: get("identity")?,
    };
    if meta.device_num == 0 || meta.rank >= meta.device_num {
        return Err(format!(
            "metadata rank {} of device_num {} is impossible",
            meta.rank, meta.device_num
        ));
    }
    Ok((meta, get("sha256")?))
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CheckpointError + '_ {
    move |source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Writes `bytes` to `path` atomically: `path.tmp`, fsync, rename, fsync of the directory.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), CheckpointError> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| CheckpointError::Invalid {
            what: path.display().to_string(),
            reason: "not a file path".into(),
        })?;
    let tmp = path.with_file_name(format!("{name}.tmp"));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp).map_err(io(&tmp))?;
        f.write_all(bytes).map_err(io(&tmp))?;
        f.sync_all().map_err(io(&tmp))?;
        drop(f);
        std::fs::rename(&tmp, path).map_err(io(path))?;
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io(dir))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Writes a checkpoint file atomically ([`write_atomic`]).
pub fn save(path: &Path, cp: &Checkpoint) -> Result<(), CheckpointError> {
    write_atomic(path, &cp.to_bytes()?)
}

/// Reads and checks a checkpoint file ([`Checkpoint::from_bytes`]).
pub fn load(path: &Path) -> Result<Checkpoint, CheckpointError> {
    let bytes = std::fs::read(path).map_err(io(path))?;
    Checkpoint::from_bytes(path, &bytes)
}

/// Reads only the metadata of a checkpoint file (the header; no checksum).
pub fn read_meta(path: &Path) -> Result<CheckpointMeta, CheckpointError> {
    let corrupt = |reason: String| CheckpointError::Corrupt {
        path: path.to_path_buf(),
        reason,
    };
    let mut f = std::fs::File::open(path).map_err(io(path))?;
    let mut len = [0u8; 8];
    f.read_exact(&mut len)
        .map_err(|_| corrupt("the file is too short to hold a safetensors header".into()))?;
    let n = u64::from_le_bytes(len);
    if n > MAX_HEADER {
        return Err(corrupt(format!(
            "header length {n} is beyond the {MAX_HEADER}-byte limit"
        )));
    }
    let mut header = vec![0u8; n as usize];
    f.read_exact(&mut header)
        .map_err(|_| corrupt(format!("the file ends inside its {n}-byte header")))?;
    let json: serde_json::Value = serde_json::from_slice(&header)
        .map_err(|e| corrupt(format!("the header is not JSON: {e}")))?;
    let meta: Option<HashMap<String, String>> = match json.get("__metadata__") {
        None => None,
        Some(v) => Some(
            serde_json::from_value(v.clone())
                .map_err(|e| corrupt(format!("bad __metadata__: {e}")))?,
        ),
    };
    parse_meta(meta.as_ref()).map(|m| m.0).map_err(corrupt)
}

// ---------------------------------------------------------------------------------------------
// The directory: saving with pruning, finding the step to resume from

/// The directory of rank `rank`'s checkpoints: `dir/{rank}`.
pub fn rank_dir(dir: &Path, rank: usize) -> PathBuf {
    dir.join(rank.to_string())
}

/// Checks a file-name prefix: non-empty, no path separator, no leading dot.
pub fn check_prefix(prefix: &str) -> Result<(), CheckpointError> {
    if prefix.is_empty() || prefix.starts_with('.') || prefix.contains(['/', '\\', '\0']) {
        return Err(CheckpointError::Invalid {
            what: format!("prefix {prefix:?}"),
            reason: "a prefix must be a non-empty plain file name not starting with '.'".into(),
        });
    }
    Ok(())
}

/// Saves `cp` as `dir/{rank}/{prefix}-{epoch}_{step_in_epoch}.safetensors` (atomically), then
/// keeps only the newest `keep_max` files of `prefix` in that directory (by their metadata's
/// step; `keep_max` 0 keeps all). Returns the file written.
pub fn save_rank(
    dir: &Path,
    prefix: &str,
    step_in_epoch: u64,
    cp: &Checkpoint,
    keep_max: usize,
) -> Result<PathBuf, CheckpointError> {
    check_prefix(prefix)?;
    let rdir = rank_dir(dir, cp.meta.rank as usize);
    std::fs::create_dir_all(&rdir).map_err(io(&rdir))?;
    let path = rdir.join(file_name(prefix, cp.meta.epoch, step_in_epoch));
    save(&path, cp)?;
    if keep_max > 0 {
        prune(&rdir, prefix, keep_max)?;
    }
    Ok(path)
}

/// The checkpoint files of a directory: `*.safetensors`, not hidden, not temporary.
fn checkpoint_files(dir: &Path) -> Result<Vec<PathBuf>, CheckpointError> {
    let mut out = Vec::new();
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(io(dir)(e)),
    };
    for entry in rd {
        let entry = entry.map_err(io(dir))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || !name.ends_with(&format!(".{EXTENSION}")) {
            continue;
        }
        if entry.file_type().map(|t| t.is_file()).unwrap_or(false) {
            out.push(entry.path());
        }
    }
    out.sort();
    Ok(out)
}

/// Deletes all but the newest `keep_max` checkpoints named `{prefix}-*.safetensors` in
/// `rank_dir` (by metadata step; files whose header cannot be read are left alone). Returns
/// the files deleted.
pub fn prune(
    rank_dir: &Path,
    prefix: &str,
    keep_max: usize,
) -> Result<Vec<PathBuf>, CheckpointError> {
    let mut ours: Vec<(u64, PathBuf)> = checkpoint_files(rank_dir)?
        .into_iter()
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_prefix(prefix))
                .is_some_and(|rest| rest.starts_with('-'))
        })
        .filter_map(|p| read_meta(&p).ok().map(|m| (m.step, p)))
        .collect();
    ours.sort();
    let excess = ours.len().saturating_sub(keep_max);
    let mut removed = Vec::new();
    for (_, p) in ours.into_iter().take(excess) {
        std::fs::remove_file(&p).map_err(io(&p))?;
        removed.push(p);
    }
    Ok(removed)
}

/// Where to resume: the step, each rank's file and (for the ranks asked for) its checkpoint,
/// and a warning for every newer file that was skipped.
#[derive(Debug)]
pub struct ResumePoint {
    /// The step every rank has a complete, valid checkpoint of.
    pub step: u64,
    /// Per rank: the file of that step.
    pub files: Vec<PathBuf>,
    /// Per rank: its checkpoint, for the ranks `find_resume` was asked to keep.
    pub checkpoints: Vec<Option<Checkpoint>>,
    /// Files skipped (unreadable, or a newer step that is incomplete or invalid), each
    /// naming the file and the reason.
    pub warnings: Vec<String>,
}

/// Finds the newest step for which every rank `r` of `graphs` has a complete, valid file in
/// `dir/{r}/` (any `*.safetensors` name; checksum, metadata and fit to `graphs[r]` checked)
/// and loads it. Newer steps that some rank lacks or holds an invalid file of are skipped with
/// a warning. `keep(r)` says whose tensors to keep in memory. Every caller that sees the same
/// directory computes the same step.
pub fn find_resume(
    dir: &Path,
    graphs: &[&Graph],
    keep: &dyn Fn(usize) -> bool,
) -> Result<ResumePoint, CheckpointError> {
    find_resume_with(
        dir,
        graphs.len(),
        &|r| std::borrow::Cow::Borrowed(graphs[r]),
        keep,
    )
}

/// As [`find_resume`] for `n` ranks whose graphs `graph_of` gives one at a time (only the
/// name and parameters are read: a program's ranks need not all be materialized at once).
pub fn find_resume_with<'g>(
    dir: &Path,
    n: usize,
    graph_of: &dyn Fn(usize) -> std::borrow::Cow<'g, Graph>,
    keep: &dyn Fn(usize) -> bool,
) -> Result<ResumePoint, CheckpointError> {
    if !dir.is_dir() {
        return Err(CheckpointError::NoCheckpoint {
            dir: dir.to_path_buf(),
            reason: "no such directory".into(),
        });
    }
    let mut warnings = Vec::new();
    // Per rank: step -> files claiming it.
    let mut by_rank: Vec<BTreeMap<u64, Vec<PathBuf>>> = vec![BTreeMap::new(); n];
    for (r, steps) in by_rank.iter_mut().enumerate() {
        for p in checkpoint_files(&rank_dir(dir, r))? {
            match read_meta(&p) {
                Ok(m) => steps.entry(m.step).or_default().push(p),
                Err(e) => warnings.push(format!("skipping {e}")),
            }
        }
    }
    let mut candidates: Vec<u64> = by_rank
        .iter()
        .flat_map(|m| m.keys().copied())
        .collect::<std::collections::BTreeSet<u64>>()
        .into_iter()
        .collect();
    candidates.reverse();
    'step: for step in candidates {
        let mut files = Vec::with_capacity(n);
        let mut cps = Vec::with_capacity(n);
        for (r, steps) in by_rank.iter().enumerate() {
            let Some(paths) = steps.get(&step) else {
                warnings.push(format!(
                    "skipping step {step}: rank {r} has no checkpoint of it in {}",
                    rank_dir(dir, r).display()
                ));
                continue 'step;
            };
            let g = graph_of(r);
            let mut found = None;
            for p in paths {
                match load(p).and_then(|cp| cp.check_against(p, &g, r as u32, n as u32).map(|_| cp))
                {
                    Ok(cp) => {
                        found = Some((p.clone(), cp));
                        break;
                    }
                    Err(e) => warnings.push(format!("skipping step {step}: {e}")),
                }
            }
            let Some((p, cp)) = found else {
                continue 'step;
            };
            files.push(p);
            cps.push(keep(r).then_some(cp));
        }
        return Ok(ResumePoint {
            step,
            files,
            checkpoints: cps,
            warnings,
        });
    }
    let reason = if warnings.is_empty() {
        format!(
            "no {EXTENSION} file in any of its rank directories 0..{}",
            n.saturating_sub(1)
        )
    } else {
        warnings.join("; ")
    };
    Err(CheckpointError::NoCheckpoint {
        dir: dir.to_path_buf(),
        reason,
    })
}

// ---------------------------------------------------------------------------------------------
// Merging

/// Merges the ranks' checkpoints of one step into a single-device checkpoint: each parameter's
/// global tensor assembled from the blocks `layouts[name].block(rank)`; blocks held by several
/// ranks (replicas) must agree bit for bit. `parts` holds one checkpoint per rank `0..n` (any
/// order), all of the same model, step and device count `n`. Every rank must hold every
/// parameter ([`merge_stages`] merges a pipeline's, where each stage holds its own).
pub fn merge(
    parts: &[Checkpoint],
    layouts: &BTreeMap<String, TensorLayout>,
) -> Result<Checkpoint, CheckpointError> {
    let n = parts.first().map_or(1, |c| c.meta.device_num as usize);
    merge_stages(parts, layouts, n)
}

/// [`merge`] for a pipeline whose stages are the consecutive runs of `ranks_per_stage` ranks:
/// a parameter is held by every rank of the stages that hold it and by no other rank (a
/// stage's weights live on its ranks only), and those ranks' blocks must cover it.
pub fn merge_stages(
    parts: &[Checkpoint],
    layouts: &BTreeMap<String, TensorLayout>,
    ranks_per_stage: usize,
) -> Result<Checkpoint, CheckpointError> {
    let merr = |param: &str, reason: String| CheckpointError::Merge {
        param: param.to_string(),
        reason,
    };
    let Some(first) = parts.first() else {
        return Err(merr("*", "no rank's checkpoint was given".into()));
    };
    let n = first.meta.device_num as usize;
    let mut by_rank: Vec<Option<&Checkpoint>> = vec![None; n];
    for p in parts {
        let m = &p.meta;
        if m.device_num as usize != n || m.model != first.meta.model || m.step != first.meta.step {
            return Err(merr(
                "*",
                format!(
                    "rank {}'s checkpoint is model {:?} step {} of {} ranks; rank {}'s is model {:?} step {} of {n}",
                    m.rank, m.model, m.step, m.device_num, first.meta.rank, first.meta.model, first.meta.step
                ),
            ));
        }
        let slot = by_rank
            .get_mut(m.rank as usize)
            .ok_or_else(|| merr("*", format!("rank {} is out of range for {n}", m.rank)))?;
        if slot.is_some() {
            return Err(merr("*", format!("rank {} is given twice", m.rank)));
        }
        *slot = Some(p);
    }
    let ranks: Vec<&Checkpoint> = by_rank
        .iter()
        .enumerate()
        .map(|(r, c)| c.ok_or_else(|| merr("*", format!("rank {r}'s checkpoint is missing"))))
        .collect::<Result<_, _>>()?;
    if ranks_per_stage == 0 || n % ranks_per_stage != 0 {
        return Err(merr(
            "*",
            format!("{ranks_per_stage} ranks per stage do not divide the {n} ranks"),
        ));
    }
    // Every parameter any rank holds, in the order the ranks list them.
    let mut names: Vec<&str> = Vec::new();
    for cp in &ranks {
        for (name, _) in &cp.tensors {
            if !names.contains(&name.as_str()) {
                names.push(name);
            }
        }
    }
    let mut merged = Vec::with_capacity(names.len());
    for name in names {
        let holders: Vec<usize> = (0..n)
            .filter(|&r| ranks[r].tensor(name).is_some())
            .collect();
        // The stages of the holders must be held whole: a rank of such a stage that lacks it
        // lost it.
        for &r in &holders {
            let stage = r / ranks_per_stage;
            let stage_ranks = stage * ranks_per_stage..(stage + 1) * ranks_per_stage;
            if let Some(q) = stage_ranks
                .clone()
                .find(|q| ranks[*q].tensor(name).is_none())
            {
                return Err(merr(
                    name,
                    format!(
                        "rank {r} holds it but rank {q} does not{}",
                        if ranks_per_stage < n {
                            format!(" (both run pipeline stage {stage}, ranks {stage_ranks:?})")
                        } else {
                            String::new()
                        }
                    ),
                ));
            }
        }
        let Some(t0) = holders.first().and_then(|&r| ranks[r].tensor(name)) else {
            continue;
        };
        let name = &name.to_string();
        let layout = layouts.get(name).ok_or_else(|| {
            merr(
                name,
                "the strategy file has no layout for it (another model?)".into(),
            )
        })?;
        layout
            .validate()
            .map_err(|e| merr(name, format!("bad layout: {e}")))?;
        if layout.device_num() != n {
            return Err(merr(
                name,
                format!(
                    "its layout spans {} devices, the checkpoints {n}",
                    layout.device_num()
                ),
            ));
        }
        let mut whole = Tensor::zeros(&TensorType::new(t0.dtype(), layout.tensor_shape.clone()));
        let mut owner: HashMap<Vec<std::ops::Range<usize>>, usize> = HashMap::new();
        let mut covered = 0usize;
        for &r in &holders {
            let cp = ranks[r];
            let t = cp
                .tensor(name)
                .ok_or_else(|| merr(name, format!("rank {r}'s checkpoint lacks it")))?;
            if t.dtype() != t0.dtype() {
                return Err(merr(
                    name,
                    format!(
                        "rank {r} holds {} but rank {} holds {}",
                        t.dtype().name(),
                        first.meta.rank,
                        t0.dtype().name()
                    ),
                ));
            }
            let block = layout.block(r);
            let lens: Vec<usize> = block.iter().map(|b| b.len()).collect();
            if t.shape != lens {
                return Err(merr(
                    name,
                    format!(
                        "rank {r}'s block has shape {:?} but its layout {layout} gives {lens:?}",
                        t.shape
                    ),
                ));
            }
            if let Some(&q) = owner.get(&block) {
                let have = whole
                    .block(&block)
                    .ok_or_else(|| merr(name, format!("block {block:?} is out of range")))?;
                let (a, b) = (have.to_le_bytes(), t.to_le_bytes());
                if a != b {
                    let size = t.dtype().size_bytes().max(1);
                    let at = a.iter().zip(&b).position(|(x, y)| x != y).unwrap_or(0) / size;
                    return Err(merr(
                        name,
                        format!(
                            "ranks {q} and {r} hold replicas of block {block:?} that differ (first at element {at}: {} vs {})",
                            have.data.get_f64(at),
                            t.data.get_f64(at)
                        ),
                    ));
                }
            } else {
                if !whole.set_block(&block, t) {
                    return Err(merr(
                        name,
                        format!("rank {r}'s block {block:?} does not fit {layout}"),
                    ));
                }
                covered += t.len();
                owner.insert(block, r);
            }
        }
        if covered != whole.len() {
            return Err(merr(
                name,
                format!(
                    "the ranks' blocks cover {covered} of its {} elements",
                    whole.len()
                ),
            ));
        }
        merged.push((name.clone(), whole));
    }
    merged.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(Checkpoint {
        meta: CheckpointMeta {
            model: first.meta.model.clone(),
            rank: 0,
            device_num: 1,
            step: first.meta.step,
            epoch: first.meta.epoch,
            identity: identity_of_whole(&first.meta.model, &merged),
        },
        tensors: merged,
    })
}
