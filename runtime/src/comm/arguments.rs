//! The argument checks every communicator makes, worded once: each function says why a
//! collective cannot take a tensor of type `ty` (the reason of a
//! [`CommError::InvalidArgument`](super::CommError::InvalidArgument)), or `None` when it can.

use super::tensor_ops::reducible;
use shardc_ir::TensorType;

/// A reduction of `ty`'s elements is not supported.
pub fn not_reducible(ty: &TensorType) -> Option<String> {
    (!reducible(ty.dtype)).then(|| {
        format!("cannot reduce {ty}: reductions support Float32, Float64, Int32 and Int64")
    })
}

/// `axis` (the argument called `what`) is not a dimension of `ty`.
pub fn axis_out_of_range(ty: &TensorType, axis: usize, what: &str) -> Option<String> {
    (axis >= ty.shape.len()).then(|| format!("{what} {axis} is out of range for {ty}"))
}

/// A group of `n` ranks does not divide dimension `axis` (the argument called `what`) of
/// `ty`. `axis` must be in range.
pub fn not_divisible(ty: &TensorType, axis: usize, n: usize, what: &str) -> Option<String> {
    (n == 0 || ty.shape[axis] % n != 0)
        .then(|| format!("the group of {n} ranks does not divide dim {axis} ({what}) of {ty}"))
}

/// The broadcast root `root` is not a member of the group.
pub fn root_outside(group: &[usize], root: usize) -> Option<String> {
    (!group.contains(&root)).then(|| format!("the root rank {root} is not in the group"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardc_ir::DType;

    #[test]
    fn reasons_name_the_type_and_the_argument() {
        let t = TensorType::new(DType::Bool, vec![4, 6]);
        assert!(not_reducible(&t).is_some_and(|r| r.contains("cannot reduce")));
        let f = TensorType::new(DType::Float32, vec![4, 6]);
        assert_eq!(not_reducible(&f), None);
        assert!(axis_out_of_range(&f, 2, "split_dim").is_some_and(|r| r.starts_with("split_dim 2")));
        assert_eq!(axis_out_of_range(&f, 1, "axis"), None);
        assert!(not_divisible(&f, 0, 3, "axis").is_some_and(|r| r.contains("group of 3 ranks")));
        assert_eq!(not_divisible(&f, 1, 3, "axis"), None);
        assert!(root_outside(&[0, 2], 1).is_some());
        assert_eq!(root_outside(&[0, 2], 2), None);
    }
}
