//! The pipeline description (`Dataset`), its epoch plan, and the background iterator.

use super::source::{mix_seed, Source, SourceOptions};
use super::transforms::Transform;
use super::DataError;
use crate::tensor::{Data, Tensor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

/// Domain tags of the derived seeds.
const TAG_MAP: u64 = 0x004D_4150;
const TAG_SHUFFLE: u64 = 0x5348_5546;

#[derive(Clone, Debug)]
enum Stage {
    Map {
        ops: Arc<[Transform]>,
        columns: Vec<usize>,
    },
    Shuffle {
        buffer: usize,
    },
    Batch {
        size: usize,
        drop_remainder: bool,
    },
    Repeat {
        count: usize,
    },
}

/// An immutable pipeline description: a source and its stages. Cloning is cheap; every method
/// returns a new description. See the module doc of [`crate::data`] for the sample order.
#[derive(Clone)]
pub struct Dataset {
    source: Arc<dyn Source>,
    opts: SourceOptions,
    stages: Vec<Stage>,
    workers: usize,
    prefetch: Option<usize>,
}

impl std::fmt::Debug for Dataset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dataset")
            .field("source", &self.source.name())
            .field("opts", &self.opts)
            .field("stages", &self.stages)
            .field("workers", &self.workers)
            .finish()
    }
}

/// One source row in the plan: the pass it belongs to, its global (padded) position and its
/// index in the source.
#[derive(Clone, Copy, Debug)]
struct RowRef {
    pass: u64,
    gpos: usize,
    index: usize,
}

#[derive(Clone, Debug)]
enum Item {
    Row(RowRef),
    Batch(Vec<RowRef>),
}

impl Dataset {
    pub(crate) fn from_source(source: Arc<dyn Source>, opts: SourceOptions) -> Dataset {
        let workers = std::thread::available_parallelism()
            .map_or(2, |n| n.get())
            .clamp(1, 4);
        Dataset {
            source,
            opts,
            stages: Vec::new(),
            workers,
            prefetch: None,
        }
    }

    fn name(&self) -> &str {
        self.source.name()
    }

    fn has_batch(&self) -> bool {
        self.stages.iter().any(|s| matches!(s, Stage::Batch { .. }))
    }

    /// Applies `ops`, in order, to each of `input_columns` of every row. An unknown column is
    /// an error naming it and the columns that exist; so is a map after `batch` (transforms
    /// act on single rows) and an op with bad parameters.
    pub fn map(
        mut self,
        ops: Vec<Transform>,
        input_columns: &[&str],
    ) -> Result<Dataset, DataError> {
        if self.has_batch() {
            return Err(DataError::Pipeline(format!(
                "{}: map() after batch() is not supported; apply the transforms before batching",
                self.name()
            )));
        }
        if input_columns.is_empty() {
            return Err(DataError::Pipeline(format!(
                "{}: map() needs at least one input column (columns: {})",
                self.name(),
                self.source.columns().join(", ")
            )));
        }
        let mut columns = Vec::new();
        for c in input_columns {
            let i = self
                .source
                .columns()
                .iter()
                .position(|x| x == c)
                .ok_or_else(|| {
                    DataError::Pipeline(format!(
                        "{}: map() input column \"{c}\" does not exist; the columns are: {}",
                        self.name(),
                        self.source.columns().join(", ")
                    ))
                })?;
            if !columns.contains(&i) {
                columns.push(i);
            }
        }
        for op in &ops {
            op.validate()?;
        }
        self.stages.push(Stage::Map {
            ops: ops.into(),
            columns,
        });
        Ok(self)
    }

    /// MindSpore's `shuffle(buffer_size)`: a buffer of `buffer_size` items; each incoming item
    /// replaces a uniformly chosen one, which is emitted; at the end the buffer is emitted in
    /// a random order. Seeded per pass (see the module doc). `buffer_size` 0 is an error.
    pub fn shuffle(mut self, buffer_size: usize) -> Result<Dataset, DataError> {
        if buffer_size == 0 {
            return Err(DataError::Pipeline(format!(
                "{}: shuffle buffer_size is 0; it must be at least 1",
                self.name()
            )));
        }
        self.stages.push(Stage::Shuffle {
            buffer: buffer_size,
        });
        Ok(self)
    }

    /// Stacks `batch_size` consecutive rows into one (a leading batch dimension on every
    /// column); `drop_remainder = false` keeps a short last batch. Rows of a batch must agree
    /// in shape and dtype per column. `batch_size` 0 or a second `batch` is an error.
    pub fn batch(mut self, batch_size: usize, drop_remainder: bool) -> Result<Dataset, DataError> {
        if batch_size == 0 {
            return Err(DataError::Pipeline(format!(
                "{}: batch_size is 0; it must be at least 1",
                self.name()
            )));
        }
        if self.has_batch() {
            return Err(DataError::Pipeline(format!(
                "{}: batch() is already in the pipeline; batching twice is not supported",
                self.name()
            )));
        }
        self.stages.push(Stage::Batch {
            size: batch_size,
            drop_remainder,
        });
        Ok(self)
    }

    /// Repeats the stream `count` times; every repetition is a new pass of the source (a new
    /// permutation with `shuffle`, new random transforms). `count` 0 makes [`Dataset::iter`]
    /// fail.
    pub fn repeat(mut self, count: usize) -> Dataset {
        self.stages.push(Stage::Repeat { count });
        self
    }

    /// The number of threads that decode and transform (MindSpore's `num_parallel_workers`);
    /// results do not depend on it. 0 is an error.
    pub fn num_parallel_workers(mut self, workers: usize) -> Result<Dataset, DataError> {
        if workers == 0 {
            return Err(DataError::Pipeline(format!(
                "{}: num_parallel_workers is 0; it must be at least 1",
                self.name()
            )));
        }
        self.workers = workers;
        Ok(self)
    }

    /// How many items (batches, or rows before `batch`) may be ready ahead of the consumer;
    /// default `workers + 2`. 0 is an error.
    pub fn prefetch_size(mut self, items: usize) -> Result<Dataset, DataError> {
        if items == 0 {
            return Err(DataError::Pipeline(format!(
                "{}: prefetch size is 0; it must be at least 1",
                self.name()
            )));
        }
        self.prefetch = Some(items);
        Ok(self)
    }

    /// The column names, in the order of the tensors of every item.
    pub fn column_names(&self) -> Vec<String> {
        self.source.columns().to_vec()
    }

    /// Items per epoch: batches after `batch`, rows otherwise (MindSpore's name).
    pub fn get_dataset_size(&self) -> usize {
        self.count(self.stages.len())
    }

    /// Items produced by the first `k` stages in one pass.
    fn count(&self, k: usize) -> usize {
        if k == 0 {
            return self.opts.shard_len(self.source.len());
        }
        let n = self.count(k - 1);
        match self.stages[k - 1] {
            Stage::Map { .. } | Stage::Shuffle { .. } => n,
            Stage::Batch {
                size,
                drop_remainder,
            } => {
                if drop_remainder {
                    n / size
                } else {
                    n.div_ceil(size)
                }
            }
            Stage::Repeat { count } => n.saturating_mul(count),
        }
    }

    /// The items of the first `k` stages for pass `pass` (at that level).
    fn stream(&self, k: usize, pass: u64) -> Vec<Item> {
        if k == 0 {
            return self
                .opts
                .shard_order(self.source.len(), pass)
                .into_iter()
                .map(|(gpos, index)| Item::Row(RowRef { pass, gpos, index }))
                .collect();
        }
        match self.stages[k - 1] {
            Stage::Map { .. } => self.stream(k - 1, pass),
            Stage::Shuffle { buffer } => {
                let items = self.stream(k - 1, pass);
                let seed = mix_seed(&[self.opts.seed, TAG_SHUFFLE, k as u64, pass]);
                buffer_shuffle(items, buffer, &mut ChaCha8Rng::seed_from_u64(seed))
            }
            Stage::Batch {
                size,
                drop_remainder,
            } => {
                let rows: Vec<RowRef> = self
                    .stream(k - 1, pass)
                    .into_iter()
                    .filter_map(|it| match it {
                        Item::Row(r) => Some(r),
                        Item::Batch(_) => None,
                    })
                    .collect();
                rows.chunks(size)
                    .filter(|c| !drop_remainder || c.len() == size)
                    .map(|c| Item::Batch(c.to_vec()))
                    .collect()
            }
            Stage::Repeat { count } => (0..count as u64)
                .flat_map(|r| self.stream(k - 1, pass.wrapping_mul(count as u64).wrapping_add(r)))
                .collect(),
        }
    }

    /// Iterates epoch `epoch` (see the module doc for what the epoch changes), decoding and
    /// transforming on background threads.
    pub fn iter(&self, epoch: u64) -> Result<DatasetIter, DataError> {
        self.iter_from(epoch, 0)
    }

    /// Iterates epoch `epoch` starting at item `skip` (to resume): the skipped items are
    /// planned but never read nor transformed. `skip` beyond the epoch's size is an error.
    pub fn iter_from(&self, epoch: u64, skip: usize) -> Result<DatasetIter, DataError> {
        if let Some(Stage::Repeat { .. }) = self
            .stages
            .iter()
            .find(|s| matches!(s, Stage::Repeat { count: 0 }))
        {
            return Err(DataError::Pipeline(format!(
                "{}: repeat(0): the count must be at least 1",
                self.name()
            )));
        }
        let total = self.get_dataset_size();
        if skip > total {
            return Err(DataError::Pipeline(format!(
                "{}: cannot skip {skip} items of an epoch of {total}",
                self.name()
            )));
        }
        // Trailing repeats are expanded lazily: one chunk (the inner pipeline's pass) at a time.
        let inner_len = self.stages.len()
            - self
                .stages
                .iter()
                .rev()
                .take_while(|s| matches!(s, Stage::Repeat { .. }))
                .count();
        let outer: u64 = self.stages[inner_len..]
            .iter()
            .map(|s| match s {
                Stage::Repeat { count } => *count as u64,
                _ => 1,
            })
            .fold(1u64, |a, b| a.wrapping_mul(b));
        let chunk_len = self.count(inner_len);
        let maps = self
            .stages
            .iter()
            .enumerate()
            .filter_map(|(k, s)| match s {
                Stage::Map { ops, columns } => Some((k as u64 + 1, ops.clone(), columns.clone())),
                _ => None,
            })
            .collect();
        let workers = self.workers.min(total - skip).max(1);
        let prefetch = self.prefetch.unwrap_or(workers + 2);
        let shared = Arc::new(Shared {
            job: Job {
                dataset: self.clone(),
                maps,
                inner_len,
                chunk_len,
                first_pass: epoch.wrapping_mul(outer),
            },
            total,
            prefetch,
            state: Mutex::new(State {
                claim: skip,
                deliver: skip,
                ready: BTreeMap::new(),
                chunks: BTreeMap::new(),
                stop: false,
            }),
            cv: Condvar::new(),
        });
        let mut iter = DatasetIter {
            shared: shared.clone(),
            threads: Vec::new(),
            next: skip,
            done: skip == total,
        };
        if iter.done {
            return Ok(iter);
        }
        for w in 0..workers {
            let sh = shared.clone();
            let handle = std::thread::Builder::new()
                .name(format!("shardc-data-{w}"))
                .spawn(move || worker(&sh))
                .map_err(|e| {
                    DataError::Pipeline(format!(
                        "{}: cannot start a data worker thread: {e}",
                        self.name()
                    ))
                })?;
            iter.threads.push(handle);
        }
        Ok(iter)
    }
}

/// MindSpore's shuffle buffer over planned items.
fn buffer_shuffle(items: Vec<Item>, buffer: usize, rng: &mut ChaCha8Rng) -> Vec<Item> {
    let mut out = Vec::with_capacity(items.len());
    let mut buf: Vec<Item> = Vec::with_capacity(buffer.min(items.len()));
    for it in items {
        if buf.len() < buffer {
            buf.push(it);
        } else {
            let j = rng.random_range(0..buf.len());
            out.push(std::mem::replace(&mut buf[j], it));
        }
    }
    for i in (1..buf.len()).rev() {
        let j = rng.random_range(0..=i);
        buf.swap(i, j);
    }
    out.extend(buf);
    out
}

type MapStage = (u64, Arc<[Transform]>, Vec<usize>);

/// What the workers compute: everything immutable about one iteration.
struct Job {
    dataset: Dataset,
    maps: Vec<MapStage>,
    inner_len: usize,
    chunk_len: usize,
    first_pass: u64,
}

impl Job {
    fn chunk(&self, c: usize) -> Vec<Item> {
        self.dataset
            .stream(self.inner_len, self.first_pass.wrapping_add(c as u64))
    }

    fn row(&self, r: RowRef) -> Result<Vec<Tensor>, DataError> {
        let src = &self.dataset.source;
        let mut row = src.fetch(r.index)?;
        let cols = src.columns();
        if row.len() != cols.len() {
            return Err(DataError::Pipeline(format!(
                "{}: row {} has {} tensors for {} columns",
                src.name(),
                r.index,
                row.len(),
                cols.len()
            )));
        }
        let seed = self.dataset.opts.seed;
        for (stage, ops, columns) in &self.maps {
            for (o, op) in ops.iter().enumerate() {
                let op_seed = mix_seed(&[seed, TAG_MAP, *stage, o as u64, r.pass, r.gpos as u64]);
                for &c in columns {
                    let mut rng = ChaCha8Rng::seed_from_u64(op_seed);
                    let t = std::mem::replace(&mut row[c], Tensor::scalar_f32(0.0));
                    row[c] = op.apply(t, &mut rng).map_err(|e| DataError::InRow {
                        row: r.index,
                        column: cols[c].clone(),
                        source: Box::new(e),
                    })?;
                }
            }
        }
        Ok(row)
    }

    fn item(&self, item: &Item) -> Result<Vec<Tensor>, DataError> {
        match item {
            Item::Row(r) => self.row(*r),
            Item::Batch(rows) => {
                let decoded = rows
                    .iter()
                    .map(|r| self.row(*r).map(|t| (r.index, t)))
                    .collect::<Result<Vec<_>, _>>()?;
                stack(&decoded, self.dataset.source.columns())
            }
        }
    }
}

/// Stacks rows into one batch per column; shapes and dtypes must agree.
fn stack(rows: &[(usize, Vec<Tensor>)], columns: &[String]) -> Result<Vec<Tensor>, DataError> {
    let Some((first_index, first)) = rows.first() else {
        return Ok(Vec::new());
    };
    let mut out = Vec::with_capacity(first.len());
    for (c, proto) in first.iter().enumerate() {
        for (index, row) in rows.iter().skip(1) {
            let t = &row[c];
            if t.shape != proto.shape || t.dtype() != proto.dtype() {
                return Err(DataError::Pipeline(format!(
                    "batch: column \"{}\" has shape {:?} {:?} in row {first_index} but {:?} {:?} \
                     in row {index}; every row of a batch needs the same shape and dtype",
                    columns.get(c).map_or("?", |s| s.as_str()),
                    proto.shape,
                    proto.dtype(),
                    t.shape,
                    t.dtype()
                )));
            }
        }
        let mut shape = Vec::with_capacity(proto.shape.len() + 1);
        shape.push(rows.len());
        shape.extend_from_slice(&proto.shape);
        let len = proto.len() * rows.len();
        macro_rules! cat {
            ($variant:ident) => {{
                let mut all = Vec::with_capacity(len);
                for (_, row) in rows {
                    if let Data::$variant(v) = &row[c].data {
                        all.extend_from_slice(v);
                    }
                }
                Data::$variant(all)
            }};
        }
        let data = match proto.data {
            Data::F32(_) => cat!(F32),
            Data::F64(_) => cat!(F64),
            Data::F16(_) => cat!(F16),
            Data::BF16(_) => cat!(BF16),
            Data::I32(_) => cat!(I32),
            Data::I64(_) => cat!(I64),
            Data::Bool(_) => cat!(Bool),
        };
        out.push(Tensor { shape, data });
    }
    Ok(out)
}

struct State {
    claim: usize,
    deliver: usize,
    ready: BTreeMap<usize, Result<Vec<Tensor>, DataError>>,
    chunks: BTreeMap<usize, Arc<Vec<Item>>>,
    stop: bool,
}

struct Shared {
    job: Job,
    total: usize,
    prefetch: usize,
    state: Mutex<State>,
    cv: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn worker(sh: &Shared) {
    loop {
        let (i, item) = {
            let mut st = sh.lock();
            loop {
                if st.stop || st.claim >= sh.total {
                    return;
                }
                if st.claim < st.deliver + sh.prefetch {
                    break;
                }
                st = sh.cv.wait(st).unwrap_or_else(|e| e.into_inner());
            }
            let i = st.claim;
            st.claim += 1;
            let (c, within) = (i / sh.job.chunk_len, i % sh.job.chunk_len);
            let low = st.deliver / sh.job.chunk_len;
            st.chunks.retain(|&k, _| k >= low);
            let chunk = match st.chunks.get(&c) {
                Some(ch) => ch.clone(),
                None => {
                    let ch = Arc::new(sh.job.chunk(c));
                    st.chunks.insert(c, ch.clone());
                    ch
                }
            };
            (i, chunk.get(within).cloned())
        };
        let result = match item {
            Some(item) => {
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sh.job.item(&item)))
                    .unwrap_or_else(|p| {
                        let what = p
                            .downcast_ref::<&str>()
                            .map(|s| s.to_string())
                            .or_else(|| p.downcast_ref::<String>().cloned())
                            .unwrap_or_else(|| "unknown panic".into());
                        Err(DataError::Pipeline(format!(
                            "{}: a data worker panicked on item {i}: {what}",
                            sh.job.dataset.name()
                        )))
                    })
            }
            None => Err(DataError::Pipeline(format!(
                "{}: item {i} is missing from the epoch plan",
                sh.job.dataset.name()
            ))),
        };
        let mut st = sh.lock();
        st.ready.insert(i, result);
        sh.cv.notify_all();
    }
}

/// The items of one epoch, in plan order: one tensor per column, with a leading batch
/// dimension after `batch`. Decoding runs ahead on background threads, at most the prefetch
/// size of items ahead; an error arrives as one `Err` item, then the iterator ends. Dropping
/// it stops and joins the threads.
pub struct DatasetIter {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    next: usize,
    done: bool,
}

impl DatasetIter {
    /// Items left in this epoch (0 after an error).
    pub fn remaining(&self) -> usize {
        if self.done {
            0
        } else {
            self.shared.total - self.next
        }
    }

    fn stop_and_join(&mut self) {
        {
            let mut st = self.shared.lock();
            st.stop = true;
            st.ready.clear();
            self.shared.cv.notify_all();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Iterator for DatasetIter {
    type Item = Result<Vec<Tensor>, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done || self.next >= self.shared.total {
            self.done = true;
            return None;
        }
        let result = {
            let mut st = self.shared.lock();
            loop {
                if let Some(r) = st.ready.remove(&self.next) {
                    break r;
                }
                st = self.shared.cv.wait(st).unwrap_or_else(|e| e.into_inner());
            }
        };
        self.next += 1;
        {
            let mut st = self.shared.lock();
            st.deliver = self.next;
            self.shared.cv.notify_all();
        }
        if result.is_err() || self.next >= self.shared.total {
            self.done = true;
            self.stop_and_join();
        }
        Some(result)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.remaining();
        (0, Some(n))
    }
}

impl Drop for DatasetIter {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}
