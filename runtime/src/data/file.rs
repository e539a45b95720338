//! A file read at offsets from several threads at once (positional reads on Unix).

use super::DataError;
use std::fs::File;
use std::path::{Path, PathBuf};

/// An open file, its path and its size, read with positional reads.
#[derive(Debug)]
pub(crate) struct RandomAccessFile {
    path: PathBuf,
    #[cfg(unix)]
    file: File,
    #[cfg(not(unix))]
    file: std::sync::Mutex<File>,
    len: u64,
}

pub(crate) fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> DataError {
    let path = path.display().to_string();
    move |source| DataError::Io { path, source }
}

impl RandomAccessFile {
    /// Opens `path`; a missing file is an `Io` error naming it.
    pub(crate) fn open(path: &Path) -> Result<RandomAccessFile, DataError> {
        let file = File::open(path).map_err(io_err(path))?;
        let len = file.metadata().map_err(io_err(path))?.len();
        Ok(RandomAccessFile {
            path: path.to_path_buf(),
            #[cfg(unix)]
            file,
            #[cfg(not(unix))]
            file: std::sync::Mutex::new(file),
            len,
        })
    }

    /// The path it was opened with.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The size in bytes when it was opened.
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// Fills `buf` from byte `offset`.
    pub(crate) fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DataError> {
        #[cfg(unix)]
        {
            use std::os::unix::fs::FileExt;
            self.file
                .read_exact_at(buf, offset)
                .map_err(io_err(&self.path))
        }
        #[cfg(not(unix))]
        {
            use std::io::{Read, Seek, SeekFrom};
            let mut f = self.file.lock().unwrap_or_else(|e| e.into_inner());
            f.seek(SeekFrom::Start(offset))
                .and_then(|_| f.read_exact(buf))
                .map_err(io_err(&self.path))
        }
    }
}

/// The first of `names` that exists in one of `dirs`; otherwise a not-found error naming the
/// first candidate and the others tried.
pub(crate) fn find_file(dirs: &[PathBuf], names: &[&str]) -> Result<PathBuf, DataError> {
    let mut tried = Vec::new();
    for d in dirs {
        for n in names {
            let p = d.join(n);
            if p.is_file() {
                return Ok(p);
            }
            tried.push(p);
        }
    }
    let first = tried
        .first()
        .cloned()
        .unwrap_or_else(|| PathBuf::from(names.first().copied().unwrap_or("")));
    let others: Vec<String> = tried
        .iter()
        .skip(1)
        .map(|p| p.display().to_string())
        .collect();
    let msg = if others.is_empty() {
        "no such file".to_string()
    } else {
        format!("no such file (also looked for {})", others.join(", "))
    };
    Err(DataError::Io {
        path: first.display().to_string(),
        source: std::io::Error::new(std::io::ErrorKind::NotFound, msg),
    })
}

/// Writes `bytes` to `dir/name` through a temporary file and a rename.
pub(crate) fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), DataError> {
    let path = dir.join(name);
    let tmp = dir.join(format!("{name}.tmp"));
    std::fs::write(&tmp, bytes).map_err(io_err(&tmp))?;
    std::fs::rename(&tmp, &path).map_err(io_err(&path))
}
