//! MNIST in the real idx format (`train-images-idx3-ubyte`, `train-labels-idx1-ubyte`,
//! `t10k-*`): the whole-set reader `MnistData`, the pipeline source `MnistDataset`, and a
//! writer of small seeded synthetic sets in that format.

use super::dataset::Dataset;
use super::file::{find_file, RandomAccessFile};
use super::source::{Source, SourceOptions};
use super::DataError;
use crate::tensor::Tensor;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// File name of the training images inside an MNIST directory.
pub const TRAIN_IMAGES: &str = "train-images-idx3-ubyte";
/// File name of the training labels inside an MNIST directory.
pub const TRAIN_LABELS: &str = "train-labels-idx1-ubyte";
/// File name of the test images inside an MNIST directory.
pub const TEST_IMAGES: &str = "t10k-images-idx3-ubyte";
/// File name of the test labels inside an MNIST directory.
pub const TEST_LABELS: &str = "t10k-labels-idx1-ubyte";

const IMAGES_MAGIC: u32 = 0x0000_0803;
const LABELS_MAGIC: u32 = 0x0000_0801;

/// An MNIST set in memory: images scaled to [0, 1] as f32 rows of `rows * cols`, labels 0..9.
#[derive(Clone, Debug)]
pub struct MnistData {
    /// Number of examples.
    pub len: usize,
    /// Image height.
    pub rows: usize,
    /// Image width.
    pub cols: usize,
    /// Pixels, `len * rows * cols`, scaled to [0, 1].
    pub images: Vec<f32>,
    /// Labels, one per example.
    pub labels: Vec<i32>,
}

fn read_file(path: &Path) -> Result<Vec<u8>, DataError> {
    std::fs::read(path).map_err(|source| DataError::Io {
        path: path.display().to_string(),
        source,
    })
}

fn be_u32(bytes: &[u8], at: usize, path: &Path) -> Result<u32, DataError> {
    bytes
        .get(at..at + 4)
        .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
        .ok_or_else(|| DataError::Format {
            path: path.display().to_string(),
            reason: format!(
                "truncated header: {} bytes, need at least {}",
                bytes.len(),
                at + 4
            ),
        })
}

fn format_err(path: &Path, reason: String) -> DataError {
    DataError::Format {
        path: path.display().to_string(),
        reason,
    }
}

impl MnistData {
    /// Reads `dir/train-images-idx3-ubyte` and `dir/train-labels-idx1-ubyte`.
    pub fn load_dir(dir: &Path) -> Result<MnistData, DataError> {
        MnistData::load(&dir.join(TRAIN_IMAGES), &dir.join(TRAIN_LABELS))
    }

    /// Reads an idx3 image file and an idx1 label file; checks magic numbers, sizes and label
    /// range, and says which file is wrong and how.
    pub fn load(images: &Path, labels: &Path) -> Result<MnistData, DataError> {
        let part = MnistPart::open(images, labels)?;
        let mut pixels = vec![0u8; part.len * part.rows * part.cols];
        part.images.read_at(&mut pixels, 16)?;
        Ok(MnistData {
            len: part.len,
            rows: part.rows,
            cols: part.cols,
            images: pixels.iter().map(|&p| p as f32 / 255.0).collect(),
            labels: part.labels.iter().map(|&l| l as i32).collect(),
        })
    }

    /// Number of full batches of `batch` examples.
    pub fn num_batches(&self, batch: usize) -> usize {
        self.len.checked_div(batch).unwrap_or(0)
    }

    /// Batch `index` (wrapping around the set) as `(images (batch, rows*cols) f32, labels
    /// (batch) int32)`.
    pub fn batch(&self, index: usize, batch: usize) -> Result<(Tensor, Tensor), DataError> {
        let nb = self.num_batches(batch);
        if nb == 0 {
            return Err(DataError::Mismatch(format!(
                "batch size {batch} is larger than the data set ({} examples)",
                self.len
            )));
        }
        let start = (index % nb) * batch;
        let px = self.rows * self.cols;
        let images = self.images[start * px..(start + batch) * px].to_vec();
        let labels = self.labels[start..start + batch].to_vec();
        let x = Tensor::from_f32(vec![batch, px], images)
            .ok_or_else(|| DataError::Mismatch("image batch size".into()))?;
        let y = Tensor::from_i32(vec![batch], labels)
            .ok_or_else(|| DataError::Mismatch("label batch size".into()))?;
        Ok((x, y))
    }
}

/// Writes a seeded synthetic MNIST-like set into `dir` in idx format: `n` training images
/// (`train-images-idx3-ubyte`, `train-labels-idx1-ubyte`) and `ceil(n / 6)` test images
/// (`t10k-images-idx3-ubyte`, `t10k-labels-idx1-ubyte`), 28x28. Each class is a fixed random
/// prototype plus noise, so a classifier can learn it and its loss falls.
pub fn write_synthetic_mnist(dir: &Path, n: usize, seed: u64) -> Result<(), DataError> {
    let io = |path: &Path| {
        let p = path.display().to_string();
        move |source| DataError::Io { path: p, source }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let (rows, cols) = (28usize, 28usize);
    let px = rows * cols;
    let prototypes: Vec<Vec<f32>> = (0..10)
        .map(|_| (0..px).map(|_| rng.random::<f32>()).collect())
        .collect();
    let sets = [
        (TRAIN_IMAGES, TRAIN_LABELS, n),
        (TEST_IMAGES, TEST_LABELS, n.div_ceil(6)),
    ];
    for (images_name, labels_name, count) in sets {
        let mut images = Vec::with_capacity(16 + count * px);
        for v in [IMAGES_MAGIC, count as u32, rows as u32, cols as u32] {
            images.extend_from_slice(&v.to_be_bytes());
        }
        let mut labels = Vec::with_capacity(8 + count);
        for v in [LABELS_MAGIC, count as u32] {
            labels.extend_from_slice(&v.to_be_bytes());
        }
        for _ in 0..count {
            let class = rng.random_range(0..10u8);
            labels.push(class);
            for &p in &prototypes[class as usize] {
                let v = 0.7 * p + 0.3 * rng.random::<f32>();
                images.push((v * 255.0).round().clamp(0.0, 255.0) as u8);
            }
        }
        for (name, bytes) in [(images_name, images), (labels_name, labels)] {
            let path = dir.join(name);
            let tmp = dir.join(format!("{name}.tmp"));
            std::fs::write(&tmp, bytes).map_err(io(&tmp))?;
            std::fs::rename(&tmp, &path).map_err(io(&path))?;
        }
    }
    Ok(())
}

/// Which part of MNIST to read (MindSpore's `usage`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MnistUsage {
    /// `train-images-idx3-ubyte` / `train-labels-idx1-ubyte` (60000 in the real set).
    Train,
    /// `t10k-images-idx3-ubyte` / `t10k-labels-idx1-ubyte` (10000).
    Test,
    /// Training rows, then test rows.
    All,
}

/// One idx image file (read on demand) and its labels (in memory, checked).
struct MnistPart {
    images: RandomAccessFile,
    len: usize,
    rows: usize,
    cols: usize,
    labels: Vec<u8>,
}

impl MnistPart {
    fn open(images: &Path, labels: &Path) -> Result<MnistPart, DataError> {
        let file = RandomAccessFile::open(images)?;
        let mut head = [0u8; 16];
        // The magic first (a file that is not idx3 at all says so), then the header's length.
        let have = usize::try_from(file.len()).unwrap_or(usize::MAX).min(16);
        file.read_at(&mut head[..have], 0)?;
        if have >= 4 {
            let magic = be_u32(&head, 0, images)?;
            if magic != IMAGES_MAGIC {
                return Err(format_err(
                    images,
                    format!("bad magic number {magic:#010x}, expected {IMAGES_MAGIC:#010x} (idx3 unsigned byte images)"),
                ));
            }
        }
        if have < 16 {
            return Err(format_err(
                images,
                format!("truncated header: {} bytes, need at least 16", file.len()),
            ));
        }
        let n = be_u32(&head, 4, images)? as usize;
        let rows = be_u32(&head, 8, images)? as usize;
        let cols = be_u32(&head, 12, images)? as usize;
        let need = (n as u64)
            .checked_mul(rows as u64)
            .and_then(|x| x.checked_mul(cols as u64))
            .and_then(|x| x.checked_add(16))
            .ok_or_else(|| {
                format_err(
                    images,
                    format!("header sizes overflow: {n} x {rows} x {cols}"),
                )
            })?;
        if file.len() != need {
            return Err(format_err(
                images,
                format!(
                    "{} bytes, but the header ({n} images of {rows}x{cols}) needs {need}{}",
                    file.len(),
                    if file.len() < need {
                        ": file is truncated"
                    } else {
                        ""
                    }
                ),
            ));
        }
        let lb = read_file(labels)?;
        let magic = be_u32(&lb, 0, labels)?;
        if magic != LABELS_MAGIC {
            return Err(format_err(
                labels,
                format!("bad magic number {magic:#010x}, expected {LABELS_MAGIC:#010x} (idx1 unsigned byte labels)"),
            ));
        }
        let nl = be_u32(&lb, 4, labels)? as usize;
        if nl != n {
            return Err(format_err(
                labels,
                format!("{nl} labels but {} holds {n} images", images.display()),
            ));
        }
        if lb.len() != 8 + nl {
            return Err(format_err(
                labels,
                format!(
                    "{} bytes, but the header ({nl} labels) needs {}{}",
                    lb.len(),
                    8 + nl,
                    if lb.len() < 8 + nl {
                        ": file is truncated"
                    } else {
                        ""
                    }
                ),
            ));
        }
        let label_bytes = lb[8..].to_vec();
        if let Some(pos) = label_bytes.iter().position(|&l| l > 9) {
            return Err(format_err(
                labels,
                format!("label {} at index {pos} is outside 0..=9", label_bytes[pos]),
            ));
        }
        Ok(MnistPart {
            images: file,
            len: n,
            rows,
            cols,
            labels: label_bytes,
        })
    }
}

struct MnistSource {
    name: String,
    columns: Vec<String>,
    parts: Vec<MnistPart>,
}

impl Source for MnistSource {
    fn name(&self) -> &str {
        &self.name
    }
    fn len(&self) -> usize {
        self.parts.iter().map(|p| p.len).sum()
    }
    fn columns(&self) -> &[String] {
        &self.columns
    }
    fn fetch(&self, index: usize) -> Result<Vec<Tensor>, DataError> {
        let mut i = index;
        for part in &self.parts {
            if i < part.len {
                let px = part.rows * part.cols;
                let mut buf = vec![0u8; px];
                part.images.read_at(&mut buf, 16 + (i * px) as u64)?;
                let image = Tensor::from_f32(
                    vec![part.rows, part.cols, 1],
                    buf.iter().map(|&b| b as f32).collect(),
                )
                .ok_or_else(|| DataError::Mismatch("MNIST image size".into()))?;
                let label = Tensor::from_i32(Vec::new(), vec![part.labels[i] as i32])
                    .ok_or_else(|| DataError::Mismatch("MNIST label size".into()))?;
                return Ok(vec![image, label]);
            }
            i -= part.len;
        }
        Err(DataError::Pipeline(format!(
            "{}: row {index} is out of range",
            self.name
        )))
    }
}

/// MindSpore's `MnistDataset`: columns `"image"` (rows x cols x 1 HWC Float32, values
/// 0..=255; 28x28x1 for MNIST) and `"label"` (rank-0 Int32).
pub struct MnistDataset;

impl MnistDataset {
    /// Reads the idx files of `dir` (also `dir/train/` and `dir/test/`, and the
    /// `train-images.idx3-ubyte` spelling). Missing, truncated or malformed files are errors
    /// naming the path. Images are read on demand; labels are loaded and checked here.
    // MindSpore's shape: the class constructs a pipeline, not itself.
    #[allow(clippy::new_ret_no_self)]
    pub fn new(
        dir: impl AsRef<Path>,
        usage: MnistUsage,
        opts: SourceOptions,
    ) -> Result<Dataset, DataError> {
        let dir = dir.as_ref();
        let name = format!("MnistDataset({})", dir.display());
        opts.validate(&name)?;
        let which: &[(&str, &str, &str)] = match usage {
            MnistUsage::Train => &[("train", TRAIN_IMAGES, TRAIN_LABELS)],
            MnistUsage::Test => &[("test", TEST_IMAGES, TEST_LABELS)],
            MnistUsage::All => &[
                ("train", TRAIN_IMAGES, TRAIN_LABELS),
                ("test", TEST_IMAGES, TEST_LABELS),
            ],
        };
        let mut parts = Vec::new();
        for (sub, images, labels) in which {
            let dirs: Vec<PathBuf> = vec![dir.to_path_buf(), dir.join(sub)];
            let dotted = |n: &str| n.replacen("-idx", ".idx", 1);
            let (di, dl) = (dotted(images), dotted(labels));
            let ip = find_file(&dirs, &[images, &di])?;
            let lp = find_file(&dirs, &[labels, &dl])?;
            parts.push(MnistPart::open(&ip, &lp)?);
        }
        let src = MnistSource {
            name,
            columns: vec!["image".into(), "label".into()],
            parts,
        };
        Ok(Dataset::from_source(Arc::new(src), opts))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpdir(tag: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("shardc-mnist-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn synthetic_set_round_trips_through_idx() {
        let d = tmpdir("rt");
        write_synthetic_mnist(&d, 64, 7).unwrap();
        let m = MnistData::load_dir(&d).unwrap();
        assert_eq!((m.len, m.rows, m.cols), (64, 28, 28));
        assert!(m.labels.iter().all(|&l| (0..10).contains(&l)));
        let (x, y) = m.batch(1, 32).unwrap();
        assert_eq!(x.shape, vec![32, 784]);
        assert_eq!(y.shape, vec![32]);
        // Same seed, same bytes.
        let d2 = tmpdir("rt2");
        write_synthetic_mnist(&d2, 64, 7).unwrap();
        assert_eq!(
            std::fs::read(d.join(TRAIN_IMAGES)).unwrap(),
            std::fs::read(d2.join(TRAIN_IMAGES)).unwrap()
        );
        let _ = std::fs::remove_dir_all(&d);
        let _ = std::fs::remove_dir_all(&d2);
    }

    #[test]
    fn truncated_and_bad_files_are_refused_with_the_file_name() {
        let d = tmpdir("bad");
        write_synthetic_mnist(&d, 8, 1).unwrap();
        let img = d.join(TRAIN_IMAGES);
        let bytes = std::fs::read(&img).unwrap();
        std::fs::write(&img, &bytes[..bytes.len() - 10]).unwrap();
        let e = MnistData::load_dir(&d).unwrap_err().to_string();
        assert!(e.contains(TRAIN_IMAGES) && e.contains("truncated"), "{e}");
        std::fs::write(&img, [0u8, 0, 8, 1, 0, 0]).unwrap();
        let e = MnistData::load_dir(&d).unwrap_err().to_string();
        assert!(e.contains("bad magic number"), "{e}");
        std::fs::remove_file(&img).unwrap();
        let e = MnistData::load_dir(&d).unwrap_err().to_string();
        assert!(e.contains(TRAIN_IMAGES), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }
}
