//! Models written by other frameworks, read into shardc's logical graph and its weights:
//! `shardc import model.mindir|model.onnx -o model.ir --weights model.safetensors`.
//!
//! - [`mindir`]: MindSpore's MindIR (`mindspore.export(..., file_format="MINDIR")`), the
//!   protobuf of `mind_ir.proto`;
//! - [`onnx`]: ONNX (`onnx.proto`, opsets 13 to 21).
//!
//! Both compile their schema with `prost-build` from a checked-in `FileDescriptorSet`
//! (`proto/*.fds`, see `build.rs`) and build the graph through
//! [`shardc_compiler::builder::GraphBuilder`], so every imported node is typed by shardc's own
//! shape rules as it is added. An importer returns an [`Imported`]: the forward graph (data
//! inputs, weights with placeholder initializers, the model's outputs) and the weights' values,
//! which [`write_weights`] stores as a whole-model safetensors checkpoint that `--init-from`
//! reads. Every fault is an [`ImportError`]; an op without a mapping is collected, and the error
//! lists every such op with its node and scope, not just the first.

pub mod mindir;
pub mod onnx;

pub mod proto;

pub mod model;

pub use model::{
    placeholder_init, weight_count, write_weights, Format, ImportError, Imported, UnmappedOp,
};
use std::path::Path;

/// Reads a model file, its format from its extension ([`Format::of_path`]).
pub fn import_file(path: &Path) -> Result<Imported, ImportError> {
    let format = Format::of_path(path).ok_or_else(|| ImportError::UnknownFormat {
        path: path.to_path_buf(),
    })?;
    let bytes = std::fs::read(path).map_err(|source| ImportError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    match format {
        Format::MindIr => mindir::import(path, &bytes),
        Format::Onnx => onnx::import(path, &bytes),
    }
}
