//! The crate's errors: every one names what it is about (the op, the value) and why.

use thiserror::Error;

/// Why a shardc graph or plan could not be exported to MLIR.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ExportError {
    /// A node that cannot be expressed.
    #[error("op {op} '{instance}' (value %{value}): {reason}")]
    Op {
        /// The op's MindSpore name.
        op: String,
        /// The node's instance name.
        instance: String,
        /// The node's value name (`n{index}`).
        value: String,
        /// Why.
        reason: String,
    },
    /// A parameter that cannot be expressed.
    #[error("parameter '{name}': {reason}")]
    Param {
        /// The parameter's name.
        name: String,
        /// Why.
        reason: String,
    },
    /// The plan's device matrices do not fit one device grid.
    #[error("device grid: {reason}")]
    Grid {
        /// Why.
        reason: String,
    },
}

/// Why MLIR text could not be evaluated, or a comparison could not be made.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EvalError {
    /// An op the evaluator cannot run, or ran into bad operands.
    #[error("rank {rank}: op {op} (value {value}): {reason}")]
    Op {
        /// The rank being evaluated.
        rank: usize,
        /// The MLIR op name.
        op: String,
        /// The op's first result (or `-` when it has none).
        value: String,
        /// Why.
        reason: String,
    },
    /// The program as a whole does not fit (missing function, wrong arguments).
    #[error("{0}")]
    Program(String),
}
