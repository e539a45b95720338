//! Sources of rows (the leaves of a pipeline) and the sampler every source shares.

use super::DataError;
use crate::tensor::Tensor;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// How a source samples its rows: MindSpore's `num_shards`, `shard_id`, `shuffle`, `num_samples`
/// and the seed (see the module doc of [`crate::data`] for the exact rule).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceOptions {
    /// Number of shards the data set is split into (the number of data-parallel ranks); 1.
    pub num_shards: usize,
    /// Which shard this source reads, `0..num_shards`; 0.
    pub shard_id: usize,
    /// Whether the sample order is a seeded permutation, drawn anew every pass; false.
    pub shuffle: bool,
    /// Seed of the sampler's permutation and of every random transform and shuffle buffer; 0.
    pub seed: u64,
    /// At most this many rows from this shard per pass; `None` for all.
    pub num_samples: Option<usize>,
}

impl Default for SourceOptions {
    fn default() -> Self {
        SourceOptions {
            num_shards: 1,
            shard_id: 0,
            shuffle: false,
            seed: 0,
            num_samples: None,
        }
    }
}

impl SourceOptions {
    /// Checks the options for the source named `source`.
    pub fn validate(&self, source: &str) -> Result<(), DataError> {
        if self.num_shards == 0 {
            return Err(DataError::Pipeline(format!(
                "{source}: num_shards is 0; it must be at least 1"
            )));
        }
        if self.shard_id >= self.num_shards {
            return Err(DataError::Pipeline(format!(
                "{source}: shard_id {} is out of range for num_shards {} (must be 0..{})",
                self.shard_id, self.num_shards, self.num_shards
            )));
        }
        if self.num_samples == Some(0) {
            return Err(DataError::Pipeline(format!(
                "{source}: num_samples is 0; use None for all rows or a positive count"
            )));
        }
        Ok(())
    }

    /// Rows this shard yields per pass from a source of `n` rows.
    pub fn shard_len(&self, n: usize) -> usize {
        let m = n.div_ceil(self.num_shards.max(1));
        self.num_samples.map_or(m, |c| c.min(m))
    }

    /// The `(global position, source row)` pairs this shard yields in pass `pass`, in order.
    pub fn shard_order(&self, n: usize, pass: u64) -> Vec<(usize, usize)> {
        let k = self.num_shards.max(1);
        let count = self.shard_len(n);
        if count == 0 {
            return Vec::new();
        }
        let perm = self
            .shuffle
            .then(|| permutation(n, self.seed.wrapping_add(pass)));
        (0..count)
            .map(|j| {
                let g = j * k + self.shard_id;
                let i = g % n;
                (g, perm.as_ref().map_or(i, |p| p[i]))
            })
            .collect()
    }
}

/// The Fisher–Yates permutation of `0..n` drawn from `ChaCha8Rng::seed_from_u64(seed)`.
fn permutation(n: usize, seed: u64) -> Vec<usize> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut p: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = rng.random_range(0..=i);
        p.swap(i, j);
    }
    p
}

fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A seed derived from several parts (splitmix64 chained), for per-row generators.
pub(crate) fn mix_seed(parts: &[u64]) -> u64 {
    parts
        .iter()
        .fold(0x005E_ED0F_DA7A_u64, |h, &p| splitmix64(h ^ splitmix64(p)))
}

/// The leaf of a pipeline: a fixed number of rows, each decoded on demand.
pub(crate) trait Source: Send + Sync {
    /// A name for messages, e.g. `Cifar10Dataset(/data/cifar)`.
    fn name(&self) -> &str;
    /// Number of rows in the whole data set (before sharding).
    fn len(&self) -> usize;
    /// The column names, in order.
    fn columns(&self) -> &[String];
    /// Decodes row `index` (one tensor per column).
    fn fetch(&self, index: usize) -> Result<Vec<Tensor>, DataError>;
}
