//! A compiled artifact: a directory holding `manifest.json` and one binary graph per rank
//! (`rank_0.graph`, ... in the format of [`crate::binary`]): the "per-rank executables".
//!
//! [`Artifact::write`] writes every file to a temporary name in the directory and renames it
//! into place, graphs first and the manifest last, so a reader never sees a half-written file
//! and a directory without a manifest is not an artifact.

use crate::binary::{self, BinaryError};
use crate::graph::Graph;
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The manifest's file name inside an artifact directory.
pub const MANIFEST_FILE: &str = "manifest.json";

/// The manifest format version this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;

/// `manifest.json`: what the artifact holds and how to run it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Manifest format version ([`FORMAT_VERSION`]).
    pub format_version: u32,
    /// Version of shardc that compiled the artifact.
    pub shardc_version: String,
    /// The model's (graph's) name.
    pub model: String,
    /// Number of devices (ranks) the model was compiled for; equals `ranks.len()`.
    pub device_num: u32,
    /// `stand_alone`, `data_parallel`, `semi_auto_parallel` or `auto_parallel`.
    pub parallel_mode: String,
    /// One entry per rank.
    pub ranks: Vec<RankEntry>,
    /// The data inputs fed every step, in parameter order.
    pub inputs: Vec<IoEntry>,
    /// Names of the graph's outputs (the first is the loss).
    pub outputs: Vec<String>,
    /// The optimizer's settings, if the graph is a training step.
    #[serde(default)]
    pub optimizer: Option<serde_json::Value>,
    /// Anything else a tool wants to record (strategy file, compile options, ...).
    #[serde(default)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

/// One rank of an artifact.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankEntry {
    /// The rank.
    pub rank: u32,
    /// The file name of its graph inside the artifact directory (`rank_0.graph`).
    pub graph: String,
}

impl RankEntry {
    /// The entry of `rank` with the conventional file name `rank_{rank}.graph`.
    pub fn new(rank: u32) -> Self {
        RankEntry {
            rank,
            graph: format!("rank_{rank}.graph"),
        }
    }
}

/// A data input of the model.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IoEntry {
    /// The parameter's name.
    pub name: String,
    /// The element type's name (`Float32`).
    pub dtype: String,
    /// The (global) shape.
    pub shape: Vec<usize>,
}

/// An artifact in memory: the manifest and the graphs, in the order of `manifest.ranks`.
#[derive(Clone, Debug, PartialEq)]
pub struct Artifact {
    /// The manifest.
    pub manifest: Manifest,
    /// One graph per entry of `manifest.ranks`, in the same order.
    pub graphs: Vec<Graph>,
}

/// Why an artifact could not be written or read. Every message names the file.
#[derive(Debug, thiserror::Error)]
pub enum ArtifactError {
    /// A file-system operation failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The directory has no `manifest.json`.
    #[error("{}: not a shardc artifact (no {MANIFEST_FILE})", dir.display())]
    MissingManifest {
        /// The artifact directory.
        dir: PathBuf,
    },
    /// `manifest.json` is not valid JSON or does not have the manifest's fields.
    #[error("{}: bad manifest: {source}", path.display())]
    BadManifest {
        /// The manifest's path.
        path: PathBuf,
        /// The JSON error (with line and column).
        source: serde_json::Error,
    },
    /// The manifest's format version is not the one this build reads.
    #[error("{}: manifest format version {found} is not supported (this build reads version {supported})", path.display())]
    UnsupportedVersion {
        /// The manifest's path.
        path: PathBuf,
        /// The version found.
        found: u32,
        /// The version this build reads.
        supported: u32,
    },
    /// The manifest is inconsistent (rank count, duplicate ranks, file names).
    #[error("{}: {reason}", path.display())]
    BadRanks {
        /// The manifest's path.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A rank's graph file listed in the manifest does not exist.
    #[error("{}: graph file of rank {rank} is missing", path.display())]
    MissingGraph {
        /// The graph file's path.
        path: PathBuf,
        /// The rank.
        rank: u32,
    },
    /// A rank's graph file is not a valid binary graph.
    #[error("{}: bad graph file of rank {rank}: {source}", path.display())]
    BadGraph {
        /// The graph file's path.
        path: PathBuf,
        /// The rank.
        rank: u32,
        /// Why it could not be decoded (or encoded, when writing).
        source: BinaryError,
    },
}

impl Artifact {
    /// Writes the artifact into `dir` (created if needed): each rank's graph, then
    /// `manifest.json`, each through a temporary file and a rename.
    pub fn write(&self, dir: &Path) -> Result<(), ArtifactError> {
        let manifest_path = dir.join(MANIFEST_FILE);
        check_manifest(&self.manifest, &manifest_path)?;
        if self.graphs.len() != self.manifest.ranks.len() {
            return Err(ArtifactError::BadRanks {
                path: manifest_path,
                reason: format!(
                    "the manifest lists {} ranks but the artifact holds {} graphs",
                    self.manifest.ranks.len(),
                    self.graphs.len()
                ),
            });
        }
        std::fs::create_dir_all(dir).map_err(|source| ArtifactError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        for (entry, graph) in self.manifest.ranks.iter().zip(&self.graphs) {
            let path = dir.join(&entry.graph);
            let bytes = binary::encode_graph(graph).map_err(|source| ArtifactError::BadGraph {
                path: path.clone(),
                rank: entry.rank,
                source,
            })?;
            write_atomic(&path, &bytes)?;
        }
        let mut json = serde_json::to_vec_pretty(&self.manifest).map_err(|source| {
            ArtifactError::BadManifest {
                path: manifest_path.clone(),
                source,
            }
        })?;
        json.push(b'\n');
        write_atomic(&manifest_path, &json)
    }

    /// Reads an artifact directory: the manifest, then every rank's graph.
    pub fn read(dir: &Path) -> Result<Artifact, ArtifactError> {
        let manifest_path = dir.join(MANIFEST_FILE);
        let text = match std::fs::read(&manifest_path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(ArtifactError::MissingManifest {
                    dir: dir.to_path_buf(),
                })
            }
            Err(source) => {
                return Err(ArtifactError::Io {
                    path: manifest_path,
                    source,
                })
            }
        };
        let manifest: Manifest =
            serde_json::from_slice(&text).map_err(|source| ArtifactError::BadManifest {
                path: manifest_path.clone(),
                source,
            })?;
        check_manifest(&manifest, &manifest_path)?;
        let mut graphs = Vec::with_capacity(manifest.ranks.len());
        for entry in &manifest.ranks {
            let path = dir.join(&entry.graph);
            let bytes = match std::fs::read(&path) {
                Ok(b) => b,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Err(ArtifactError::MissingGraph {
                        path,
                        rank: entry.rank,
                    })
                }
                Err(source) => return Err(ArtifactError::Io { path, source }),
            };
            let graph = binary::decode_graph(&bytes).map_err(|source| ArtifactError::BadGraph {
                path: path.clone(),
                rank: entry.rank,
                source,
            })?;
            graphs.push(graph);
        }
        Ok(Artifact { manifest, graphs })
    }
}

/// Checks the version, that there is one rank entry per device, that ranks are distinct and
/// below `device_num`, and that graph file names are distinct plain file names.
fn check_manifest(m: &Manifest, path: &Path) -> Result<(), ArtifactError> {
    if m.format_version != FORMAT_VERSION {
        return Err(ArtifactError::UnsupportedVersion {
            path: path.to_path_buf(),
            found: m.format_version,
            supported: FORMAT_VERSION,
        });
    }
    let bad = |reason: String| ArtifactError::BadRanks {
        path: path.to_path_buf(),
        reason,
    };
    if m.ranks.len() != m.device_num as usize {
        return Err(bad(format!(
            "rank count mismatch: device_num is {} but {} ranks are listed",
            m.device_num,
            m.ranks.len()
        )));
    }
    let mut ranks = HashSet::new();
    let mut files = HashSet::new();
    for e in &m.ranks {
        if e.rank >= m.device_num {
            return Err(bad(format!(
                "rank {} is out of range for device_num {}",
                e.rank, m.device_num
            )));
        }
        if !ranks.insert(e.rank) {
            return Err(bad(format!("rank {} is listed twice", e.rank)));
        }
        let plain = !e.graph.is_empty()
            && e.graph != "."
            && e.graph != ".."
            && e.graph != MANIFEST_FILE
            && !e.graph.contains(['/', '\\', '\0']);
        if !plain {
            return Err(bad(format!(
                "graph file name {:?} of rank {} is not a plain file name",
                e.graph, e.rank
            )));
        }
        if !files.insert(e.graph.as_str()) {
            return Err(bad(format!("graph file {:?} is listed twice", e.graph)));
        }
    }
    Ok(())
}

/// Writes `bytes` to a temporary file beside `path`, syncs it and renames it to `path`.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), ArtifactError> {
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{file_name}.tmp{}", std::process::id()));
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ArtifactError::Io { path, source }
    };
    let result = (|| {
        let mut f = std::fs::File::create(&tmp).map_err(io(&tmp))?;
        f.write_all(bytes).map_err(io(&tmp))?;
        f.sync_all().map_err(io(&tmp))?;
        std::fs::rename(&tmp, path).map_err(io(path))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}
