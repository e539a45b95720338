//! Data for training steps: MNIST's idx files and seeded synthetic batches.

pub mod mnist;
pub mod synthetic;

pub use mnist::{write_synthetic_mnist, MnistData};
pub use synthetic::SyntheticData;

/// A data-loading failure: which file and why.
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
}
