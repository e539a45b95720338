//! MindSpore's `GeneratorDataset`: a data set over a random-access function.

use super::dataset::Dataset;
use super::source::{Source, SourceOptions};
use super::DataError;
use crate::tensor::Tensor;
use std::sync::Arc;

/// A row function: row `i` as one tensor per column.
type RowFn = dyn Fn(usize) -> Result<Vec<Tensor>, DataError> + Send + Sync;

/// The source of a [`GeneratorDataset`]: rows from a function.
struct GeneratorSource {
    name: String,
    columns: Vec<String>,
    len: usize,
    f: Box<RowFn>,
}

impl Source for GeneratorSource {
    fn name(&self) -> &str {
        &self.name
    }
    fn len(&self) -> usize {
        self.len
    }
    fn columns(&self) -> &[String] {
        &self.columns
    }
    fn fetch(&self, index: usize) -> Result<Vec<Tensor>, DataError> {
        let row = (self.f)(index)?;
        if row.len() != self.columns.len() {
            return Err(DataError::Pipeline(format!(
                "{}: row {index} has {} tensors but the data set has {} columns ({})",
                self.name,
                row.len(),
                self.columns.len(),
                self.columns.join(", ")
            )));
        }
        Ok(row)
    }
}

/// MindSpore's `GeneratorDataset` over a random-access function: row `i` is `f(i)`, one tensor
/// per column.
pub struct GeneratorDataset;

impl GeneratorDataset {
    /// A data set of `len` rows with the given column names; `f(i)` must return one tensor per
    /// column (checked when the row is read). Column names must be non-empty and distinct.
    // MindSpore's shape: the class constructs a pipeline, not itself.
    #[allow(clippy::new_ret_no_self)]
    pub fn new(
        columns: &[&str],
        len: usize,
        f: impl Fn(usize) -> Result<Vec<Tensor>, DataError> + Send + Sync + 'static,
        opts: SourceOptions,
    ) -> Result<Dataset, DataError> {
        let name = format!("GeneratorDataset({})", columns.join(", "));
        if columns.is_empty() {
            return Err(DataError::Pipeline(
                "GeneratorDataset: no columns; give at least one column name".into(),
            ));
        }
        for (i, c) in columns.iter().enumerate() {
            if c.is_empty() {
                return Err(DataError::Pipeline(format!(
                    "{name}: column {i} has an empty name"
                )));
            }
            if columns[..i].contains(c) {
                return Err(DataError::Pipeline(format!(
                    "{name}: column \"{c}\" is named twice"
                )));
            }
        }
        opts.validate(&name)?;
        let src = GeneratorSource {
            name,
            columns: columns.iter().map(|c| c.to_string()).collect(),
            len,
            f: Box::new(f),
        };
        Ok(Dataset::from_source(Arc::new(src), opts))
    }
}
