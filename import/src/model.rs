//! What an import gives and how it fails: [`Imported`], [`ImportError`], [`Format`],
//! [`UnmappedOp`]; the weights file ([`write_weights`]) and the `.ir`'s placeholder
//! initializers ([`placeholder_init`]). Every importer builds on these; `lib.rs` only
//! dispatches by format.

use shardc_ir::{Graph, Init, ParamKind};
use shardc_runtime::checkpoint::{self, Checkpoint};
use shardc_runtime::Tensor;
use std::fmt;
use std::path::{Path, PathBuf};

/// The file formats the importers read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// MindSpore's MindIR.
    MindIr,
    /// ONNX.
    Onnx,
}

impl Format {
    /// The format a file name says (`.mindir` or `.onnx`, case-insensitive).
    pub fn of_path(path: &Path) -> Option<Format> {
        let ext = path.extension()?.to_str()?.to_ascii_lowercase();
        match ext.as_str() {
            "mindir" => Some(Format::MindIr),
            "onnx" => Some(Format::Onnx),
            _ => None,
        }
    }
}

impl Format {
    /// The name with its article (`a MindIR`, `an ONNX`), for messages.
    pub fn with_article(self) -> &'static str {
        match self {
            Format::MindIr => "a MindIR",
            Format::Onnx => "an ONNX",
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Format::MindIr => "MindIR",
            Format::Onnx => "ONNX",
        })
    }
}

/// A model read from another framework's file.
#[derive(Clone, Debug)]
pub struct Imported {
    /// The forward graph: data inputs, weights (placeholder initializers: the values are in
    /// [`Imported::weights`]) and the model's outputs, every node typed.
    pub graph: Graph,
    /// The value of every weight of [`Imported::graph`], by parameter name, in the graph's
    /// parameter order.
    pub weights: Vec<(String, Tensor)>,
    /// The format it was read from.
    pub format: Format,
    /// The file's producer, as it records it (`MindSpore 2.10.0`, `pytorch 2.15.0`).
    pub producer: String,
}

/// An op of the file that shardc has no mapping for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnmappedOp {
    /// The file's op (MindSpore primitive or ONNX op type, with its domain if not the
    /// default one).
    pub op: String,
    /// The node's name in the file.
    pub node: String,
    /// The node's scope (MindSpore's `Default/fc-Dense/...`), empty where the file has none.
    pub scope: String,
}

impl fmt::Display for UnmappedOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (node `{}`", self.op, self.node)?;
        if !self.scope.is_empty() {
            write!(f, ", scope {}", self.scope)?;
        }
        f.write_str(")")
    }
}

/// Why a model could not be imported.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// The file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// The bytes are not a model of the format (a truncated or foreign file).
    #[error("{path}: not {} model: {reason}", .format.with_article())]
    Decode {
        /// The file.
        path: PathBuf,
        /// The format it was read as.
        format: Format,
        /// What the decoder found.
        reason: String,
    },
    /// The file's name does not say its format.
    #[error("{path}: unknown model format (expected a `.mindir` or `.onnx` file)")]
    UnknownFormat {
        /// The file.
        path: PathBuf,
    },
    /// Ops without a mapping to shardc, every one of them.
    #[error("{} op(s) have no mapping to shardc:\n{}", .0.len(), list_unmapped(.0))]
    Unmapped(Vec<UnmappedOp>),
    /// A node the importer understands but cannot take as written: a bad attribute, a shape
    /// that cannot be made static, an input that does not exist.
    #[error("node `{node}` ({op}): {reason}")]
    Node {
        /// The node's name in the file.
        node: String,
        /// Its op.
        op: String,
        /// What is wrong, naming the value.
        reason: String,
    },
    /// The model as a whole is unusable (no graph, no output, a parameter without data).
    #[error("{0}")]
    Model(String),
    /// The weights could not be written.
    #[error("writing the weights to {path}: {reason}")]
    Weights {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

fn list_unmapped(ops: &[UnmappedOp]) -> String {
    ops.iter()
        .map(|u| format!("  {u}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Writes an import's weights as a whole-model safetensors checkpoint (model name `model`),
/// the file `shardc run|predict|compile --init-from` reads.
pub fn write_weights(path: &Path, model: &str, imported: &Imported) -> Result<(), ImportError> {
    let cp = Checkpoint::whole(model, imported.weights.clone());
    checkpoint::save(path, &cp).map_err(|e| ImportError::Weights {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

/// The placeholder initializer an imported weight is declared with in the `.ir`, so that the
/// model also trains from scratch: `he_normal` for a matrix or kernel, `ones` for a
/// normalisation's scale or a moving variance, `zeros` for anything else. The file's values
/// are in the weights file.
pub fn placeholder_init(name: &str, shape: &[usize]) -> Init {
    let leaf = name.rsplit('.').next().unwrap_or(name);
    if shape.len() >= 2 {
        Init::HeNormal { seed: 0 }
    } else if matches!(leaf, "gamma" | "moving_variance" | "scale" | "running_var") {
        Init::Ones
    } else {
        Init::Zeros
    }
}

/// The number of weights of a graph (what an import reports).
pub fn weight_count(graph: &Graph) -> usize {
    graph
        .params
        .iter()
        .filter(|p| matches!(p.kind, ParamKind::Weight { .. }))
        .count()
}
