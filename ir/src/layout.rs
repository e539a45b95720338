//! Tensor layouts: how one value is spread over the devices, in MindSpore's terms.
//!
//! A layout has a **device matrix** (the devices `0..N` arranged row-major in a grid whose
//! product is `N`; the rightmost axis varies fastest), a **tensor map** (for each tensor
//! dimension the device-matrix axis that splits it, counted from the right, or `-1` when the
//! dimension is whole), and the device axes over which the value is a **partial** result
//! (each rank holds one term of a sum, or one candidate of a max, ...) that a reduction over
//! those axes completes. Devices along an axis that neither splits a dimension nor is partial
//! hold the same block: that is repeated (replicated) computation.
//!
//! Worked example (docs/design.md): 8 devices, `x[16, 32]` with strategy `(2, 4)` under MatMul's
//! device matrix `[2, 4, 1]`: tensor map `[2, 1]`; rank 5 sits at `(1, 1, 0)` and holds
//! `x[8..16, 8..16]`.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::ops::Range;

/// The reduction of a collective or of a partial value: the `op` attribute of `AllReduce`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
pub enum ReduceOp {
    /// `sum`.
    Sum,
    /// `max`.
    Max,
    /// `min`.
    Min,
    /// `prod`.
    Prod,
}

impl ReduceOp {
    /// The name as printed in `op: sum`.
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::Prod => "prod",
        }
    }

    /// The op of a printed name.
    pub fn from_name(name: &str) -> Option<ReduceOp> {
        match name {
            "sum" => Some(ReduceOp::Sum),
            "max" => Some(ReduceOp::Max),
            "min" => Some(ReduceOp::Min),
            "prod" => Some(ReduceOp::Prod),
            _ => None,
        }
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How one value is spread over `N` devices (see the module doc).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TensorLayout {
    /// The device matrix, major axis first; its product is the device count.
    pub dev_matrix: Vec<usize>,
    /// Per tensor dimension: the device-matrix axis splitting it, counted from the right, or
    /// `-1`.
    pub tensor_map: Vec<i64>,
    /// The logical (unsliced) shape.
    pub tensor_shape: Vec<usize>,
    /// Device-matrix axes (counted from the right) over which the value is partial, ascending.
    pub partial: Vec<usize>,
    /// How the partial terms combine (meaningless when `partial` is empty; `Sum` then).
    pub partial_op: ReduceOp,
}

/// Why a layout is malformed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("layout {layout}: {reason}")]
pub struct LayoutError {
    /// The layout, printed.
    pub layout: String,
    /// What is wrong.
    pub reason: String,
}

impl TensorLayout {
    /// The layout of a value every one of `device_num` devices holds whole.
    pub fn replicated(shape: &[usize], device_num: usize) -> TensorLayout {
        TensorLayout {
            dev_matrix: vec![device_num.max(1)],
            tensor_map: vec![-1; shape.len()],
            tensor_shape: shape.to_vec(),
            partial: Vec::new(),
            partial_op: ReduceOp::Sum,
        }
    }

    /// The number of devices (the product of the device matrix).
    pub fn device_num(&self) -> usize {
        self.dev_matrix.iter().product()
    }

    /// The size of device-matrix axis `k` counted from the right.
    pub fn axis_size(&self, k: usize) -> usize {
        let m = self.dev_matrix.len();
        if k < m {
            self.dev_matrix[m - 1 - k]
        } else {
            1
        }
    }

    /// The split count of each tensor dimension.
    pub fn splits(&self) -> Vec<usize> {
        self.tensor_map
            .iter()
            .map(|&k| if k < 0 { 1 } else { self.axis_size(k as usize) })
            .collect()
    }

    /// The shape of one rank's block.
    pub fn slice_shape(&self) -> Vec<usize> {
        self.tensor_shape
            .iter()
            .zip(self.splits())
            .map(|(&n, s)| n / s.max(1))
            .collect()
    }

    /// Whether some rank holds only a partial result.
    pub fn is_partial(&self) -> bool {
        self.partial.iter().any(|&k| self.axis_size(k) > 1)
    }

    /// Checks the layout: a non-empty device matrix of positive sizes, one map entry per
    /// dimension, each axis used at most once (by a dimension or as partial), and every split
    /// dimension divisible by its axis size.
    pub fn validate(&self) -> Result<(), LayoutError> {
        let err = |reason: String| LayoutError {
            layout: self.to_string(),
            reason,
        };
        if self.dev_matrix.is_empty() || self.dev_matrix.contains(&0) {
            return Err(err("the device matrix needs positive sizes".into()));
        }
        if self.tensor_map.len() != self.tensor_shape.len() {
            return Err(err(format!(
                "the tensor map has {} entries for a rank-{} tensor",
                self.tensor_map.len(),
                self.tensor_shape.len()
            )));
        }
        let m = self.dev_matrix.len();
        let mut used = vec![false; m];
        for (d, &k) in self.tensor_map.iter().enumerate() {
            if k < -1 || k >= m as i64 {
                return Err(err(format!(
                    "dimension {d} maps to axis {k}, outside the {m}-axis device matrix"
                )));
            }
            if k >= 0 {
                let k = k as usize;
                if used[k] {
                    return Err(err(format!("axis {k} splits two dimensions")));
                }
                used[k] = true;
                let s = self.axis_size(k);
                if self.tensor_shape[d] % s != 0 {
                    return Err(err(format!(
                        "dimension {d} of size {} is not divisible by {s}",
                        self.tensor_shape[d]
                    )));
                }
            }
        }
        for &k in &self.partial {
            if k >= m || used[k] {
                return Err(err(format!(
                    "partial axis {k} is outside the device matrix or also splits a dimension"
                )));
            }
            used[k] = true;
        }
        Ok(())
    }

    /// The coordinates of `rank` in the device matrix (major axis first).
    pub fn coords(&self, rank: usize) -> Vec<usize> {
        let mut c = vec![0; self.dev_matrix.len()];
        let mut r = rank;
        for (i, &n) in self.dev_matrix.iter().enumerate().rev() {
            c[i] = r % n.max(1);
            r /= n.max(1);
        }
        c
    }

    /// The block of the logical tensor that `rank` holds: one range per dimension.
    pub fn block(&self, rank: usize) -> Vec<Range<usize>> {
        let c = self.coords(rank);
        let m = self.dev_matrix.len();
        self.tensor_map
            .iter()
            .zip(&self.tensor_shape)
            .map(|(&k, &n)| {
                if k < 0 {
                    0..n
                } else {
                    let s = self.axis_size(k as usize);
                    let i = c[m - 1 - k as usize];
                    let b = n / s.max(1);
                    i * b..(i + 1) * b
                }
            })
            .collect()
    }
}

impl fmt::Display for TensorLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{{dev_matrix: {:?}, tensor_map: {:?}, tensor_shape: {:?}",
            self.dev_matrix, self.tensor_map, self.tensor_shape
        )?;
        if !self.partial.is_empty() {
            write!(f, ", partial: {:?} ({})", self.partial, self.partial_op)?;
        }
        f.write_str("}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn x_layout() -> TensorLayout {
        TensorLayout {
            dev_matrix: vec![2, 4, 1],
            tensor_map: vec![2, 1],
            tensor_shape: vec![16, 32],
            partial: vec![],
            partial_op: ReduceOp::Sum,
        }
    }

    #[test]
    fn tutorial_blocks() {
        let l = x_layout();
        l.validate().unwrap();
        assert_eq!(l.slice_shape(), vec![8, 8]);
        assert_eq!(l.coords(5), vec![1, 1, 0]);
        assert_eq!(l.block(0), vec![0..8, 0..8]);
        assert_eq!(l.block(5), vec![8..16, 8..16]);
        assert_eq!(l.block(7), vec![8..16, 24..32]);
    }

    #[test]
    fn invalid_layouts_are_named() {
        let mut l = x_layout();
        l.tensor_shape = vec![15, 32];
        let e = l.validate().unwrap_err();
        assert!(e.reason.contains("dimension 0 of size 15"), "{e}");
        let mut l = x_layout();
        l.tensor_map = vec![1, 1];
        assert!(l.validate().unwrap_err().reason.contains("two dimensions"));
        let mut l = x_layout();
        l.partial = vec![1];
        assert!(l.validate().is_err());
    }

    #[test]
    fn reduce_op_names_round_trip() {
        for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Prod] {
            assert_eq!(ReduceOp::from_name(op.name()), Some(op));
        }
    }
}
