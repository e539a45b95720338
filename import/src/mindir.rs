//! MindSpore's MindIR.

use crate::proto::mind_ir::ModelProto;
use crate::{Format, ImportError, Imported};
use prost::Message;
use std::path::Path;

/// Reads a MindIR file's bytes (`path` names it in errors).
pub fn import(path: &Path, bytes: &[u8]) -> Result<Imported, ImportError> {
    let model = ModelProto::decode(bytes).map_err(|e| ImportError::Decode {
        path: path.to_path_buf(),
        format: Format::MindIr,
        reason: e.to_string(),
    })?;
    Err(ImportError::Model(format!(
        "{}: MindIR graph `{}` read; its conversion is being written",
        path.display(),
        model.graph.and_then(|g| g.name).unwrap_or_default()
    )))
}
