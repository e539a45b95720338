//! CIFAR-10 in its binary format (`data_batch_1.bin` .. `data_batch_5.bin`, `test_batch.bin`:
//! records of 1 label byte and 3072 pixel bytes, the 1024 red, then green, then blue values
//! of a 32x32 image in row-major order), and a writer of seeded synthetic sets in that format.

use super::dataset::Dataset;
use super::file::{find_file, io_err, write_atomic, RandomAccessFile};
use super::source::{Source, SourceOptions};
use super::DataError;
use crate::tensor::Tensor;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Image side of CIFAR-10.
pub const CIFAR_SIDE: usize = 32;
/// Bytes of one record: the label byte and 3x32x32 pixels.
pub const CIFAR_RECORD: usize = 1 + 3 * CIFAR_SIDE * CIFAR_SIDE;
/// The training files, in reading order.
pub const CIFAR_TRAIN_FILES: [&str; 5] = [
    "data_batch_1.bin",
    "data_batch_2.bin",
    "data_batch_3.bin",
    "data_batch_4.bin",
    "data_batch_5.bin",
];
/// The test file.
pub const CIFAR_TEST_FILE: &str = "test_batch.bin";
/// The subdirectory of the official archive.
pub const CIFAR_SUBDIR: &str = "cifar-10-batches-bin";
/// The class names of `batches.meta.txt`.
pub const CIFAR_CLASSES: [&str; 10] = [
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
];

/// Which part of CIFAR-10 to read (MindSpore's `usage`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cifar10Usage {
    /// The five training files (50000 images in the real set).
    Train,
    /// `test_batch.bin` (10000 images).
    Test,
    /// Training files, then the test file.
    All,
}

struct CifarSource {
    name: String,
    columns: Vec<String>,
    files: Vec<RandomAccessFile>,
    /// Index of the first row of every file, and the total at the end.
    starts: Vec<usize>,
}

impl Source for CifarSource {
    fn name(&self) -> &str {
        &self.name
    }
    fn len(&self) -> usize {
        self.starts.last().copied().unwrap_or(0)
    }
    fn columns(&self) -> &[String] {
        &self.columns
    }
    fn fetch(&self, index: usize) -> Result<Vec<Tensor>, DataError> {
        let f = self
            .starts
            .partition_point(|&s| s <= index)
            .saturating_sub(1);
        let file = self.files.get(f).ok_or_else(|| {
            DataError::Pipeline(format!("{}: row {index} is out of range", self.name))
        })?;
        let rec = index - self.starts[f];
        let mut buf = [0u8; CIFAR_RECORD];
        file.read_at(&mut buf, (rec * CIFAR_RECORD) as u64)?;
        let label = buf[0];
        if label > 9 {
            return Err(DataError::Format {
                path: file.path().display().to_string(),
                reason: format!("record {rec} has label {label}, outside 0..=9"),
            });
        }
        let plane = CIFAR_SIDE * CIFAR_SIDE;
        let px = &buf[1..];
        let mut hwc = Vec::with_capacity(3 * plane);
        for p in 0..plane {
            hwc.push(px[p] as f32);
            hwc.push(px[plane + p] as f32);
            hwc.push(px[2 * plane + p] as f32);
        }
        let image = Tensor::from_f32(vec![CIFAR_SIDE, CIFAR_SIDE, 3], hwc)
            .ok_or_else(|| DataError::Mismatch("CIFAR image size".into()))?;
        let label = Tensor::from_i32(Vec::new(), vec![label as i32])
            .ok_or_else(|| DataError::Mismatch("CIFAR label size".into()))?;
        Ok(vec![image, label])
    }
}

/// MindSpore's `Cifar10Dataset`: columns `"image"` (32x32x3 HWC Float32, values 0..=255) and
/// `"label"` (rank-0 Int32).
pub struct Cifar10Dataset;

impl Cifar10Dataset {
    /// Reads the binary files of `dir` (or of `dir/cifar-10-batches-bin`). A missing file is an
    /// error with its path; a file whose size is not a multiple of 3073 is an error with its
    /// path, size and the record size. Records are read on demand.
    // MindSpore's shape: the class constructs a pipeline, not itself.
    #[allow(clippy::new_ret_no_self)]
    pub fn new(
        dir: impl AsRef<Path>,
        usage: Cifar10Usage,
        opts: SourceOptions,
    ) -> Result<Dataset, DataError> {
        let dir = dir.as_ref();
        let name = format!("Cifar10Dataset({})", dir.display());
        opts.validate(&name)?;
        let names: Vec<&str> = match usage {
            Cifar10Usage::Train => CIFAR_TRAIN_FILES.to_vec(),
            Cifar10Usage::Test => vec![CIFAR_TEST_FILE],
            Cifar10Usage::All => {
                let mut v = CIFAR_TRAIN_FILES.to_vec();
                v.push(CIFAR_TEST_FILE);
                v
            }
        };
        let sub = dir.join(CIFAR_SUBDIR);
        let base: PathBuf = if !dir.join(names[0]).exists() && sub.is_dir() {
            sub
        } else {
            dir.to_path_buf()
        };
        let mut files = Vec::new();
        let mut starts = vec![0usize];
        for n in names {
            let path = find_file(std::slice::from_ref(&base), &[n])?;
            let file = RandomAccessFile::open(&path)?;
            let size = file.len();
            if size % CIFAR_RECORD as u64 != 0 {
                return Err(DataError::Format {
                    path: path.display().to_string(),
                    reason: format!(
                        "size {size} bytes is not a multiple of the record size {CIFAR_RECORD} \
                         (1 label byte + 3072 pixel bytes): the file is truncated or not \
                         CIFAR-10 binary"
                    ),
                });
            }
            let records = (size / CIFAR_RECORD as u64) as usize;
            starts.push(starts.last().copied().unwrap_or(0) + records);
            files.push(file);
        }
        let src = CifarSource {
            name,
            columns: vec!["image".into(), "label".into()],
            files,
            starts,
        };
        Ok(Dataset::from_source(Arc::new(src), opts))
    }
}

/// Writes a seeded synthetic CIFAR-10 set into `dir` in the real binary format:
/// `data_batch_1.bin` .. `data_batch_5.bin` and `test_batch.bin` with `images_per_batch_file`
/// records each, and `batches.meta.txt`. Every class has a seeded prototype (a colour and a
/// coarse 4x4 pattern, smooth enough to survive crops and flips) plus per-pixel noise, so a
/// classifier's loss falls.
pub fn write_synthetic_cifar10(
    dir: &Path,
    images_per_batch_file: usize,
    seed: u64,
) -> Result<(), DataError> {
    std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let plane = CIFAR_SIDE * CIFAR_SIDE;
    // prototypes[class][channel * plane + pixel] in [0, 1).
    let prototypes: Vec<Vec<f32>> = (0..10)
        .map(|_| {
            let colour: [f32; 3] = [rng.random(), rng.random(), rng.random()];
            let grid: Vec<f32> = (0..3 * 16).map(|_| rng.random()).collect();
            let mut p = vec![0f32; 3 * plane];
            for ch in 0..3 {
                for y in 0..CIFAR_SIDE {
                    for x in 0..CIFAR_SIDE {
                        let g = grid[ch * 16 + (y / 8) * 4 + x / 8];
                        p[ch * plane + y * CIFAR_SIDE + x] = 0.45 * colour[ch] + 0.35 * g;
                    }
                }
            }
            p
        })
        .collect();
    let files = CIFAR_TRAIN_FILES
        .iter()
        .chain(std::iter::once(&CIFAR_TEST_FILE));
    for name in files {
        let mut bytes = Vec::with_capacity(images_per_batch_file * CIFAR_RECORD);
        for _ in 0..images_per_batch_file {
            let class = rng.random_range(0..10u8);
            bytes.push(class);
            for &p in &prototypes[class as usize] {
                let v = p + 0.2 * rng.random::<f32>();
                bytes.push((v * 255.0).round().clamp(0.0, 255.0) as u8);
            }
        }
        write_atomic(dir, name, &bytes)?;
    }
    let mut meta = CIFAR_CLASSES.join("\n");
    meta.push_str("\n\n");
    write_atomic(dir, "batches.meta.txt", meta.as_bytes())
}
