//! The device grid (`shard.grid`) a plan's layouts live on, and the translation of shardc's
//! layouts and communication groups into grid axes.
//!
//! shardc gives every op its own device matrix (MindSpore's: `[2, 4, 1]` for a MatMul
//! `((2, 4), (4, 1))` on 8 devices, rank = row-major index, rightmost axis fastest), while a
//! `shard` program has one grid. Every device matrix is a mixed-radix factorisation of the
//! device count; the grid is their common refinement: its axis boundaries are the union of
//! every device matrix's suffix products (`[2, 4, 1]` cuts at 1, 4, 8). A device-matrix axis is
//! then a run of consecutive grid axes, and a rank's linear index in the grid is its rank,
//! since both are row-major. Matrices without a common refinement (`[2, 3]` and `[3, 2]` on 6
//! devices) are an error.

use crate::error::ExportError;
use shardc_ir::TensorLayout;

/// A device grid, major axis first; the product of its shape is the device count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grid {
    /// The size of every axis, major first.
    pub shape: Vec<usize>,
}

impl Grid {
    /// The grid of `n` devices cut into its prime factors, ascending (`8` -> `2x2x2`,
    /// `12` -> `2x2x3`); one axis of size 1 for one device.
    pub fn for_devices(n: usize) -> Grid {
        let mut shape = Vec::new();
        let mut m = n.max(1);
        let mut p = 2;
        while m > 1 {
            while m % p == 0 {
                shape.push(p);
                m /= p;
            }
            p += 1;
        }
        if shape.is_empty() {
            shape.push(1);
        }
        Grid { shape }
    }

    /// The coarsest grid of `n` devices on which every one of `layouts` is expressible (see
    /// the module doc).
    pub fn for_layouts<'a>(
        n: usize,
        layouts: impl IntoIterator<Item = &'a TensorLayout>,
    ) -> Result<Grid, ExportError> {
        let mut cuts = vec![1usize, n.max(1)];
        for l in layouts {
            if l.device_num() != n.max(1) {
                return Err(ExportError::Grid {
                    reason: format!(
                        "layout {l} spans {} devices, the program {n}",
                        l.device_num()
                    ),
                });
            }
            let mut p = 1;
            for &s in l.dev_matrix.iter().rev() {
                p *= s;
                cuts.push(p);
            }
        }
        cuts.sort_unstable();
        cuts.dedup();
        let mut shape = Vec::with_capacity(cuts.len());
        for w in cuts.windows(2) {
            if w[1] % w[0] != 0 {
                return Err(ExportError::Grid {
                    reason: format!(
                        "the device matrices have no common refinement: {} does not divide {}",
                        w[0], w[1]
                    ),
                });
            }
            shape.push(w[1] / w[0]);
        }
        shape.reverse();
        if shape.is_empty() {
            shape.push(1);
        }
        Ok(Grid { shape })
    }

    /// The number of devices.
    pub fn device_num(&self) -> usize {
        self.shape.iter().product()
    }

    /// The product of the grid axes after `axis` (the stride of `axis` in a linear index).
    fn stride(&self, axis: usize) -> usize {
        self.shape[axis + 1..].iter().product()
    }

    /// The multi-index of `rank`, major axis first.
    pub fn coords(&self, rank: usize) -> Vec<usize> {
        self.shape
            .iter()
            .enumerate()
            .map(|(a, &s)| (rank / self.stride(a)) % s.max(1))
            .collect()
    }

    /// The linear index (the rank) of a multi-index.
    pub fn rank_of(&self, coords: &[usize]) -> usize {
        coords
            .iter()
            .enumerate()
            .map(|(a, &c)| c * self.stride(a))
            .sum()
    }

    /// The grid axes making up axis `k` (counted from the right, as in a tensor map) of
    /// `layout`'s device matrix, ascending.
    pub fn axes_of(&self, layout: &TensorLayout, k: usize) -> Result<Vec<usize>, ExportError> {
        let m = layout.dev_matrix.len();
        if k >= m {
            return Err(ExportError::Grid {
                reason: format!("axis {k} is outside the device matrix of {layout}"),
            });
        }
        let lo: usize = layout.dev_matrix[m - k..].iter().product();
        let hi = lo * layout.dev_matrix[m - 1 - k];
        let axes: Vec<usize> = (0..self.shape.len())
            .filter(|&a| {
                let s = self.stride(a);
                s >= lo && s * self.shape[a] <= hi && self.shape[a] > 1
            })
            .collect();
        let covered: usize = axes.iter().map(|&a| self.shape[a]).product();
        if covered != hi / lo {
            return Err(ExportError::Grid {
                reason: format!(
                    "axis {k} of {layout} is no run of axes of the grid {}",
                    self.text_shape()
                ),
            });
        }
        Ok(axes)
    }

    /// For every dimension of `layout`, the grid axes splitting it (shard's `split_axes`).
    pub fn split_axes(&self, layout: &TensorLayout) -> Result<Vec<Vec<usize>>, ExportError> {
        layout
            .tensor_map
            .iter()
            .map(|&k| {
                if k < 0 {
                    Ok(Vec::new())
                } else {
                    self.axes_of(layout, k as usize)
                }
            })
            .collect()
    }

    /// The grid axes over which `layout` is partial, ascending.
    pub fn partial_axes(&self, layout: &TensorLayout) -> Result<Vec<usize>, ExportError> {
        let mut out = Vec::new();
        for &k in &layout.partial {
            out.extend(self.axes_of(layout, k)?);
        }
        out.sort_unstable();
        Ok(out)
    }

    /// The grid axes whose devices, all other coordinates equal to `rank`'s, are exactly
    /// `ranks` (a communication group), ascending; `None` when no set of axes gives it.
    pub fn group_axes(&self, rank: usize, ranks: &[usize]) -> Option<Vec<usize>> {
        let mut want: Vec<usize> = ranks.to_vec();
        want.sort_unstable();
        want.dedup();
        if !want.contains(&rank) {
            return None;
        }
        let n = self.shape.len();
        for mask in 0u32..(1u32 << n) {
            let axes: Vec<usize> = (0..n).filter(|&a| mask & (1 << a) != 0).collect();
            if self.group(rank, &axes) == want {
                return Some(axes);
            }
        }
        None
    }

    /// The ranks sharing `rank`'s coordinates outside `axes`, ascending.
    pub fn group(&self, rank: usize, axes: &[usize]) -> Vec<usize> {
        let base = self.coords(rank);
        let mut out: Vec<usize> = (0..self.device_num())
            .filter(|&r| {
                let c = self.coords(r);
                (0..self.shape.len()).all(|a| axes.contains(&a) || c[a] == base[a])
            })
            .collect();
        out.sort_unstable();
        out
    }

    /// The shape as shard writes it: `2x4`.
    pub fn text_shape(&self) -> String {
        self.shape
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
            .join("x")
    }
}

/// `[[0], [1, 2], []]`: shard's split axes as written in `shard.sharding`.
pub fn split_axes_text(axes: &[Vec<usize>]) -> String {
    if axes.is_empty() {
        return "[[]]".to_string();
    }
    let parts: Vec<String> = axes.iter().map(|a| list_text(a)).collect();
    format!("[{}]", parts.join(", "))
}

/// `[1, 2]`.
pub fn list_text(xs: &[usize]) -> String {
    let parts: Vec<String> = xs.iter().map(|x| x.to_string()).collect();
    format!("[{}]", parts.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardc_ir::ReduceOp;

    fn layout(dm: &[usize], map: &[i64], shape: &[usize], partial: &[usize]) -> TensorLayout {
        TensorLayout {
            dev_matrix: dm.to_vec(),
            tensor_map: map.to_vec(),
            tensor_shape: shape.to_vec(),
            partial: partial.to_vec(),
            partial_op: ReduceOp::Sum,
        }
    }

    #[test]
    fn the_grid_refines_every_device_matrix() {
        let a = layout(&[2, 4, 1], &[2, 1], &[16, 32], &[]);
        let b = layout(&[8], &[0, -1], &[16, 16], &[]);
        let g = Grid::for_layouts(8, [&a, &b]).unwrap();
        assert_eq!(g.shape, vec![2, 4]);
        assert_eq!(g.split_axes(&a).unwrap(), vec![vec![0], vec![1]]);
        assert_eq!(g.split_axes(&b).unwrap(), vec![vec![0, 1], vec![]]);
        let c = layout(&[2, 2, 2], &[-1, 0], &[4, 4], &[1]);
        let g = Grid::for_layouts(8, [&a, &c]).unwrap();
        assert_eq!(g.shape, vec![2, 2, 2]);
        assert_eq!(g.split_axes(&a).unwrap(), vec![vec![0], vec![1, 2]]);
        assert_eq!(g.partial_axes(&c).unwrap(), vec![1]);
        assert_eq!(g.split_axes(&c).unwrap(), vec![vec![], vec![2]]);
    }

    #[test]
    fn matrices_without_a_common_refinement_are_an_error() {
        let a = layout(&[2, 3], &[1, 0], &[6, 6], &[]);
        let b = layout(&[3, 2], &[1, 0], &[6, 6], &[]);
        let e = Grid::for_layouts(6, [&a, &b]).unwrap_err();
        assert!(e.to_string().contains("no common refinement"), "{e}");
        let c = layout(&[4], &[0], &[8], &[]);
        assert!(Grid::for_layouts(8, [&c]).is_err());
    }

    #[test]
    fn groups_are_sets_of_axes() {
        let g = Grid::for_devices(8);
        assert_eq!(g.shape, vec![2, 2, 2]);
        assert_eq!(g.coords(5), vec![1, 0, 1]);
        assert_eq!(g.rank_of(&[1, 0, 1]), 5);
        assert_eq!(g.group_axes(5, &[4, 5, 6, 7]), Some(vec![1, 2]));
        assert_eq!(g.group_axes(1, &[1, 3, 5, 7]), Some(vec![0, 1]));
        assert_eq!(g.group_axes(0, &[0, 3]), None);
        assert_eq!(g.group_axes(2, &[0, 1]), None);
        assert_eq!(Grid::for_devices(12).shape, vec![2, 2, 3]);
        assert_eq!(Grid::for_devices(1).shape, vec![1]);
    }
}
