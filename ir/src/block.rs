//! Where one rank's block of a sharded tensor sits in the logical tensor.
//!
//! The partition marks a local op whose result depends on *where* its block is with two
//! attributes, `global_shape` (the logical shape, Ints) and `offset` (the block's first index
//! per dimension, Ints):
//!
//! - `Dropout`: the block of `x`; each element draws the mask of its global index.
//! - `Gather`: the block of the table; indices are checked against the global table and those
//!   outside the rows this rank holds give zeros (a vocabulary split).
//! - `UnsortedSegmentSum`: the block of the result; ids outside the segments this rank holds
//!   are skipped.
//!
//! Every backend reads the attributes through [`Block::of`], so they agree on what is valid.

use crate::{Attr, Attrs};

/// A block of shape `local` at `offset` in a tensor of shape `global_shape`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Block {
    /// The logical tensor's shape.
    pub global_shape: Vec<usize>,
    /// The block's first index along each dimension.
    pub offset: Vec<usize>,
}

fn text(v: &[i64]) -> String {
    format!(
        "({})",
        v.iter()
            .map(|x| x.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    )
}

impl Block {
    /// The block described by `attrs` for a local tensor of shape `local`: `Ok(None)` when
    /// neither attribute is there (the tensor is the whole tensor); an error, saying what is
    /// wrong, when only one is there, when they are not tuples of one integer per dimension,
    /// or when the block does not fit in the global shape.
    pub fn of(attrs: &Attrs, local: &[usize]) -> Result<Option<Block>, String> {
        let read = |key: &str| -> Result<Option<Vec<i64>>, String> {
            match attrs.get(key) {
                None => Ok(None),
                Some(a) => a.as_ints().map(Some).ok_or_else(|| {
                    format!("attribute `{key}` must be a tuple of integers, got {a}")
                }),
            }
        };
        let (global, offset) = match (read("global_shape")?, read("offset")?) {
            (None, None) => return Ok(None),
            (Some(g), Some(o)) => (g, o),
            (Some(_), None) => {
                return Err("attribute `global_shape` is given without `offset`".into())
            }
            (None, Some(_)) => {
                return Err("attribute `offset` is given without `global_shape`".into())
            }
        };
        if global.len() != local.len() || offset.len() != local.len() {
            return Err(format!(
                "attributes `global_shape` {} and `offset` {} must have one entry per dim of the local tensor of shape {local:?}",
                text(&global),
                text(&offset)
            ));
        }
        for d in 0..local.len() {
            let (g, o) = (global[d], offset[d]);
            let fits = g >= 0
                && o >= 0
                && (o as u64)
                    .checked_add(local[d] as u64)
                    .is_some_and(|end| end <= g as u64);
            if !fits {
                return Err(format!(
                    "the block of shape {local:?} at `offset` {} does not fit in `global_shape` {} (dim {d})",
                    text(&offset),
                    text(&global)
                ));
            }
        }
        Ok(Some(Block {
            global_shape: global.iter().map(|&g| g as usize).collect(),
            offset: offset.iter().map(|&o| o as usize).collect(),
        }))
    }

    /// Writes the two attributes into `attrs`.
    pub fn set_on(&self, attrs: &mut Attrs) {
        let ints = |v: &[usize]| Attr::ints(&v.iter().map(|&x| x as i64).collect::<Vec<_>>());
        attrs.set("global_shape", ints(&self.global_shape));
        attrs.set("offset", ints(&self.offset));
    }

    /// Along dimension `d`: the global extent and the half-open range `[lo, lo + local)`
    /// of this block (for a whole tensor, `(local, 0)`).
    pub fn along(block: Option<&Block>, d: usize, local: usize) -> (usize, usize) {
        match block {
            None => (local, 0),
            Some(b) => (b.global_shape[d], b.offset[d]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(g: &[i64], o: &[i64]) -> Attrs {
        Attrs::new()
            .with("global_shape", Attr::ints(g))
            .with("offset", Attr::ints(o))
    }

    #[test]
    fn reads_a_block_and_writes_it_back() {
        let b = Block::of(&attrs(&[8, 4], &[4, 0]), &[4, 4])
            .unwrap()
            .unwrap();
        assert_eq!(b.global_shape, vec![8, 4]);
        assert_eq!(b.offset, vec![4, 0]);
        let mut a = Attrs::new();
        b.set_on(&mut a);
        assert_eq!(Block::of(&a, &[4, 4]).unwrap(), Some(b.clone()));
        assert_eq!(Block::along(Some(&b), 0, 4), (8, 4));
        assert_eq!(Block::along(None, 0, 4), (4, 0));
        assert_eq!(Block::of(&Attrs::new(), &[4]).unwrap(), None);
    }

    #[test]
    fn refuses_what_does_not_fit_or_is_half_given() {
        let e = Block::of(&attrs(&[8, 4], &[6, 0]), &[4, 4]).unwrap_err();
        assert!(
            e.contains("does not fit in `global_shape` (8, 4) (dim 0)"),
            "{e}"
        );
        let e = Block::of(&attrs(&[8], &[0]), &[4, 4]).unwrap_err();
        assert!(e.contains("one entry per dim"), "{e}");
        let half = Attrs::new().with("offset", Attr::ints(&[0]));
        assert!(Block::of(&half, &[4])
            .unwrap_err()
            .contains("without `global_shape`"));
        let bad = attrs(&[8], &[0]).with("offset", Attr::Str("x".into()));
        assert!(Block::of(&bad, &[4])
            .unwrap_err()
            .contains("tuple of integers"));
    }
}
