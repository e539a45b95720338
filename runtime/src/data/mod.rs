//! Data for training steps: MindSpore-style data-set pipelines (`Cifar10Dataset`,
//! `MnistDataset`, `GeneratorDataset`, `NumpySlicesDataset` with `map` / `shuffle` / `batch` /
//! `repeat`), the raw MNIST idx reader, NumPy's `.npy` / `.npz` and safetensors arrays
//! ([`numpy`]), and seeded synthetic batches for any graph.
//!
//! # Pipelines
//!
//! A [`Dataset`] is an immutable description: a source and a list of stages. Iterating it
//! ([`Dataset::iter`]) first plans the epoch — which source rows, in which order, grouped into
//! which batches — without decoding anything, then decodes rows and runs the transforms on
//! background threads with a bounded prefetch queue. Items come back in plan order whatever
//! the number of threads.
//!
//! The training tutorial's `create_dataset`, for rank `rank_id` of `rank_size`:
//!
//! ```no_run
//! use shardc_ir::DType;
//! use shardc_runtime::data::{vision, Cifar10Dataset, Cifar10Usage, SourceOptions};
//! # fn main() -> Result<(), shardc_runtime::data::DataError> {
//! # let (rank_id, rank_size) = (0, 1);
//! let opts = SourceOptions { num_shards: rank_size, shard_id: rank_id, ..Default::default() };
//! let ds = Cifar10Dataset::new("cifar-10-batches-bin", Cifar10Usage::Train, opts)?
//!     .map(vec![vision::TypeCast(DType::Int32)], &["label"])?
//!     .map(
//!         vec![
//!             vision::RandomCrop((32, 32), (4, 4, 4, 4)),
//!             vision::RandomHorizontalFlip(0.5),
//!             vision::Resize((224, 224)),
//!             vision::Rescale(1.0 / 255.0, 0.0),
//!             vision::Normalize(&[0.4465, 0.4822, 0.4914], &[0.2010, 0.1994, 0.2023]),
//!             vision::HWC2CHW(),
//!         ],
//!         &["image"],
//!     )?
//!     .shuffle(10)?
//!     .batch(32, true)?
//!     .repeat(1);
//! for epoch in 0..2 {
//!     for batch in ds.iter(epoch)? {
//!         let batch = batch?; // [image (32, 3, 224, 224) Float32, label (32) Int32]
//!         # let _ = batch;
//!     }
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # Sharding and sample order (MindSpore's `DistributedSampler`)
//!
//! Let `n` be the number of rows of the source, `K = num_shards`, `s = shard_id`, and `p` the
//! *pass* of the source: the epoch given to [`Dataset::iter`] when the pipeline has no
//! `repeat`, otherwise `p = epoch * R + r` where `R` is the product of the repeat counts and
//! `r` the repetition (mixed radix, outermost repeat most significant).
//!
//! 1. The order of the whole data set is `P = [0, 1, .., n-1]` without `shuffle`; with
//!    `shuffle`, `P` is a Fisher–Yates permutation drawn from
//!    `ChaCha8Rng::seed_from_u64(seed + p)` (wrapping add): for `i` from `n-1` down to `1`,
//!    `j = rng.random_range(0..=i)`,
//!    swap `P[i]` and `P[j]`. Every shard draws the same `P`.
//! 2. Every shard gets `m = ceil(n / K)` rows. The padded order is `P` followed by `P[0],
//!    P[1], ..` until it has `m * K` entries (global position `g` holds row `P[g % n]`).
//! 3. Shard `s` yields the global positions `g = j * K + s` for `j = 0, 1, .., m - 1`, in that
//!    order. With `num_samples = Some(c)` it stops after `min(c, m)` rows.
//!
//! So with `batch(B)` and no `shuffle(buffer)` stage, batch `t` of rank `s` holds positions
//! `(t * B + j) * K + s`, `j < B`: the ranks' batches `t`, concatenated rank after rank, are
//! exactly the rows of the single-device (`K = 1`, same seed) batch `t` of size `B * K`,
//! permuted — row `j` of rank `s` is row `j * K + s` of the global batch. Random transforms
//! draw from `(seed, pass, global position, map stage, op)`, so a row is augmented the same
//! way on one device and on K. A `shuffle(buffer)` stage shuffles each shard's own stream and
//! breaks that correspondence (as in MindSpore).
//!
//! # Randomness
//!
//! Nothing shares a random generator: the sampler uses `seed + pass`; transform `o` of map
//! stage `k` on the row at global position `g` uses a generator seeded from `(seed, k, o, p,
//! g)` (the same generator for every input column of that map, so an image and its mask get
//! the same crop); `shuffle(buffer)` at stage `k` uses `(seed, k, pass at that stage)`. Results
//! therefore do not depend on the thread count or on prefetch timing.

pub mod cifar;
pub mod dataset;
mod file;
pub mod generator;
pub mod mnist;
pub mod numpy;
pub mod source;
pub mod synthetic;
pub mod transforms;

pub use cifar::{write_synthetic_cifar10, Cifar10Dataset, Cifar10Usage};
pub use dataset::{Dataset, DatasetIter};
pub use generator::GeneratorDataset;
pub use mnist::{write_synthetic_mnist, MnistData, MnistDataset, MnistUsage};
pub use numpy::NumpySlicesDataset;
pub use source::SourceOptions;
pub use synthetic::SyntheticData;
pub use transforms::{vision, Transform};

/// A data-loading failure: which file, column, transform or stage, and why.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// The file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not in the expected format.
    #[error("{path}: {reason}")]
    Format {
        /// The file.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// The data does not fit the graph.
    #[error("{0}")]
    Mismatch(String),
    /// A transform refused its input or its parameters.
    #[error("{transform}: {reason}")]
    Transform {
        /// The transform (`Resize`, `Normalize`, ...).
        transform: String,
        /// What is wrong, with the shape or value at fault.
        reason: String,
    },
    /// A failure while producing one row of a pipeline: the row and column it happened in.
    #[error("row {row}, column \"{column}\": {source}")]
    InRow {
        /// The source row (its index in the source, before sharding).
        row: usize,
        /// The column.
        column: String,
        /// The failure.
        #[source]
        source: Box<DataError>,
    },
    /// A pipeline was built or used wrongly (unknown column, zero batch size, bad shard, ...).
    #[error("{0}")]
    Pipeline(String),
}
