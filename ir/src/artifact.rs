//! A compiled artifact: a directory holding `manifest.json` and the program every rank runs,
//! once (`program.spmd`, an [`SpmdProgram`] in the format of [`crate::binary`]): rank 0's
//! graph and what differs per rank. A worker materializes its own rank's graph when it loads
//! ([`Artifact::rank_graph`]), so an artifact for 4096 ranks is the size of one for 8.
//!
//! Ranks asked for at compile time (`--global-rank R`, `--ranks 0-7`) are also written,
//! materialized, as text IR (`rank_R.ir`, listed in the manifest's `ranks`) for people to read;
//! nothing reads them back.
//!
//! [`Artifact::write`] writes every file to a temporary name in the directory and renames it
//! into place, the manifest last, so a reader never sees a half-written file and a directory
//! without a manifest is not an artifact. An artifact of an older format (format version 1:
//! one graph per rank) gets an error naming its version.

use crate::binary::{self, BinaryError};
use crate::graph::Graph;
use crate::spmd::{SpmdError, SpmdProgram};
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The manifest's file name inside an artifact directory.
pub const MANIFEST_FILE: &str = "manifest.json";

/// The manifest format version this build writes and reads (2: one program for every rank).
pub const FORMAT_VERSION: u32 = 2;

/// The program's file name inside an artifact directory.
pub const PROGRAM_FILE: &str = "program.spmd";

/// `manifest.json`: what the artifact holds and how to run it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Manifest format version ([`FORMAT_VERSION`]).
    pub format_version: u32,
    /// Version of shardc that compiled the artifact.
    pub shardc_version: String,
    /// The model's (graph's) name.
    pub model: String,
    /// Number of devices (ranks) the model was compiled for.
    pub device_num: u32,
    /// `stand_alone`, `data_parallel`, `semi_auto_parallel` or `auto_parallel`.
    pub parallel_mode: String,
    /// The program's file ([`PROGRAM_FILE`]).
    pub program: String,
    /// The ranks written out, materialized, for inspection (text IR; may be empty).
    #[serde(default)]
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

/// A rank written out for inspection.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankEntry {
    /// The rank.
    pub rank: u32,
    /// The file name of its materialized graph, text IR, inside the artifact directory
    /// (`rank_0.ir`).
    pub graph: String,
}

impl RankEntry {
    /// The entry of `rank` with the conventional file name `rank_{rank}.ir`.
    pub fn new(rank: u32) -> Self {
        RankEntry {
            rank,
            graph: format!("rank_{rank}.ir"),
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

/// An artifact in memory: the manifest and the program.
#[derive(Clone, Debug, PartialEq)]
pub struct Artifact {
    /// The manifest.
    pub manifest: Manifest,
    /// The program every rank runs.
    pub program: SpmdProgram,
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
    #[error("{}: manifest format version {found} is not supported (this build reads version {supported}, one program for every rank): compile the model again with this shardc", path.display())]
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
    /// The program file listed in the manifest does not exist.
    #[error("{}: the program file is missing", path.display())]
    MissingProgram {
        /// The program file's path.
        path: PathBuf,
    },
    /// The program file is not a valid binary program (or could not be encoded).
    #[error("{}: bad program file: {source}", path.display())]
    BadProgram {
        /// The program file's path.
        path: PathBuf,
        /// Why it could not be decoded (or encoded, when writing).
        source: BinaryError,
    },
    /// The program does not run on the manifest's device count, or a rank could not be
    /// materialized from it.
    #[error("{}: {reason}", path.display())]
    BadRank {
        /// The program file's path.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

impl From<(PathBuf, SpmdError)> for ArtifactError {
    fn from((path, e): (PathBuf, SpmdError)) -> Self {
        ArtifactError::BadRank {
            path,
            reason: e.to_string(),
        }
    }
}

impl Artifact {
    /// Writes the artifact into `dir` (created if needed): the program, the materialized
    /// graphs of `inspect` as text IR (each `(rank, graph)` listed in the manifest's `ranks`),
    /// then `manifest.json`, each through a temporary file and a rename.
    pub fn write(&self, dir: &Path, inspect: &[(usize, &Graph)]) -> Result<(), ArtifactError> {
        let manifest_path = dir.join(MANIFEST_FILE);
        let mut manifest = self.manifest.clone();
        manifest.ranks = inspect
            .iter()
            .map(|&(r, _)| RankEntry::new(r as u32))
            .collect();
        check_manifest(&manifest, &manifest_path)?;
        let program_path = dir.join(&manifest.program);
        if self.program.device_num != manifest.device_num as usize {
            return Err(ArtifactError::BadRank {
                path: program_path,
                reason: format!(
                    "the program runs on {} ranks but the manifest says device_num {}",
                    self.program.device_num, manifest.device_num
                ),
            });
        }
        std::fs::create_dir_all(dir).map_err(|source| ArtifactError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        let bytes =
            binary::encode_program(&self.program).map_err(|source| ArtifactError::BadProgram {
                path: program_path.clone(),
                source,
            })?;
        write_atomic(&program_path, &bytes)?;
        for (entry, (_, graph)) in manifest.ranks.iter().zip(inspect) {
            let text = crate::text::print_graph(graph);
            write_atomic(&dir.join(&entry.graph), text.as_bytes())?;
        }
        let mut json =
            serde_json::to_vec_pretty(&manifest).map_err(|source| ArtifactError::BadManifest {
                path: manifest_path.clone(),
                source,
            })?;
        json.push(b'\n');
        write_atomic(&manifest_path, &json)
    }

    /// Reads an artifact directory: the manifest, then the program.
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
        // The version first: an older manifest lacks this build's fields.
        #[derive(Deserialize)]
        struct Version {
            format_version: u32,
        }
        let version: Version =
            serde_json::from_slice(&text).map_err(|source| ArtifactError::BadManifest {
                path: manifest_path.clone(),
                source,
            })?;
        if version.format_version != FORMAT_VERSION {
            return Err(ArtifactError::UnsupportedVersion {
                path: manifest_path,
                found: version.format_version,
                supported: FORMAT_VERSION,
            });
        }
        let manifest: Manifest =
            serde_json::from_slice(&text).map_err(|source| ArtifactError::BadManifest {
                path: manifest_path.clone(),
                source,
            })?;
        check_manifest(&manifest, &manifest_path)?;
        let path = dir.join(&manifest.program);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(ArtifactError::MissingProgram { path })
            }
            Err(source) => return Err(ArtifactError::Io { path, source }),
        };
        let program =
            binary::decode_program(&bytes).map_err(|source| ArtifactError::BadProgram {
                path: path.clone(),
                source,
            })?;
        if program.device_num != manifest.device_num as usize {
            return Err(ArtifactError::BadRank {
                path,
                reason: format!(
                    "the program runs on {} ranks but the manifest says device_num {}",
                    program.device_num, manifest.device_num
                ),
            });
        }
        Ok(Artifact { manifest, program })
    }

    /// The number of ranks.
    pub fn device_num(&self) -> usize {
        self.program.device_num
    }

    /// Rank `rank`'s graph, materialized from the program.
    pub fn rank_graph(&self, rank: usize) -> Result<Graph, ArtifactError> {
        self.program
            .materialize(rank)
            .map_err(|e| (PathBuf::from(&self.manifest.program), e).into())
    }

    /// Every rank's graph, `0..device_num` (for running all ranks in one process).
    pub fn rank_graphs(&self) -> Result<Vec<Graph>, ArtifactError> {
        (0..self.device_num()).map(|r| self.rank_graph(r)).collect()
    }
}

/// Checks the version, that the program's file name is a plain file name, that the ranks
/// written out are distinct and below `device_num`, and that their file names are distinct
/// plain file names.
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
    let plain = |f: &str| {
        !f.is_empty()
            && f != "."
            && f != ".."
            && f != MANIFEST_FILE
            && !f.contains(['/', '\\', '\0'])
    };
    if m.device_num == 0 {
        return Err(bad("device_num is 0".into()));
    }
    if !plain(&m.program) {
        return Err(bad(format!(
            "program file name {:?} is not a plain file name",
            m.program
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
        if !plain(&e.graph) || e.graph == m.program {
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
