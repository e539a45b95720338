//! The argument checks every communicator makes, worded once: each reason function says
//! why a collective cannot take a tensor of type `ty` (the reason of a
//! [`CommError::InvalidArgument`]), or `None` when it can; [`all_gather`], [`reduce_scatter`],
//! [`all_to_all`] and [`all_reduce`] combine them in the order every communicator checks
//! them; [`invalid`] and [`invalid_if`] turn a reason into the error, and [`check_peer`]
//! checks the peer of a send or receive.

use super::tensor_ops::reducible;
use super::{Collective, CommError};
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

/// Why an AllReduce cannot take `ty`: [`not_reducible`].
pub fn all_reduce(ty: &TensorType) -> Option<String> {
    not_reducible(ty)
}

/// Why an AllGather along `axis` cannot take `ty`: [`axis_out_of_range`].
pub fn all_gather(ty: &TensorType, axis: usize) -> Option<String> {
    axis_out_of_range(ty, axis, "axis")
}

/// Why a ReduceScatter along `axis` over a group of `n` cannot take `ty`: [`not_reducible`],
/// then [`axis_out_of_range`], then [`not_divisible`].
pub fn reduce_scatter(ty: &TensorType, axis: usize, n: usize) -> Option<String> {
    not_reducible(ty)
        .or_else(|| axis_out_of_range(ty, axis, "axis"))
        .or_else(|| not_divisible(ty, axis, n, "axis"))
}

/// Why an AllToAll over a group of `n` cannot take `ty`: `split_dim` or `concat_dim` out of
/// range, or the group does not divide `split_dim`.
pub fn all_to_all(
    ty: &TensorType,
    split_dim: usize,
    concat_dim: usize,
    n: usize,
) -> Option<String> {
    axis_out_of_range(ty, split_dim, "split_dim")
        .or_else(|| axis_out_of_range(ty, concat_dim, "concat_dim"))
        .or_else(|| not_divisible(ty, split_dim, n, "split_dim"))
}

/// The [`CommError::InvalidArgument`] of `collective` on `group` at `rank` for `reason`.
pub fn invalid(collective: Collective, group: &[usize], rank: usize, reason: String) -> CommError {
    CommError::InvalidArgument {
        collective,
        group: group.to_vec(),
        rank,
        reason,
    }
}

/// [`invalid`] with `reason`, if there is one.
pub fn invalid_if(
    collective: Collective,
    group: &[usize],
    rank: usize,
    reason: Option<String>,
) -> Result<(), CommError> {
    reason.map_or(Ok(()), |r| Err(invalid(collective, group, rank, r)))
}

/// Checks the peer of a point-to-point call (`collective` is [`Collective::Send`] or
/// [`Collective::Receive`]) made by `rank` in a world of `size`: a peer outside the world is
/// a [`CommError::InvalidGroup`] whose group lists the sender first.
pub fn check_peer(
    collective: Collective,
    rank: usize,
    size: usize,
    peer: usize,
) -> Result<(), CommError> {
    if peer < size {
        return Ok(());
    }
    let group = match collective {
        Collective::Send => vec![rank, peer],
        _ => vec![peer, rank],
    };
    Err(CommError::InvalidGroup {
        collective,
        group,
        rank,
        reason: format!("rank {peer} is outside the world of {size} ranks"),
    })
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
        // The combined checks, in order.
        let b = TensorType::new(DType::Bool, vec![3]);
        assert!(reduce_scatter(&b, 5, 2).is_some_and(|r| r.contains("cannot reduce")));
        assert!(reduce_scatter(&f, 2, 2).is_some_and(|r| r.starts_with("axis 2")));
        assert!(reduce_scatter(&f, 1, 4).is_some_and(|r| r.contains("group of 4")));
        assert_eq!(reduce_scatter(&f, 1, 3), None);
        assert!(all_to_all(&f, 0, 2, 2).is_some_and(|r| r.starts_with("concat_dim 2")));
        assert_eq!(all_to_all(&f, 0, 1, 2), None);
        assert!(all_gather(&f, 2).is_some());
        assert!(all_reduce(&b).is_some());
    }

    #[test]
    fn a_peer_outside_the_world_is_an_invalid_group_listing_the_sender_first() {
        assert!(check_peer(Collective::Send, 1, 4, 3).is_ok());
        match check_peer(Collective::Send, 1, 4, 7) {
            Err(CommError::InvalidGroup { group, reason, .. }) => {
                assert_eq!(group, vec![1, 7]);
                assert_eq!(reason, "rank 7 is outside the world of 4 ranks");
            }
            other => panic!("{other:?}"),
        }
        match check_peer(Collective::Receive, 1, 4, 7) {
            Err(CommError::InvalidGroup { group, .. }) => assert_eq!(group, vec![7, 1]),
            other => panic!("{other:?}"),
        }
        assert!(invalid_if(Collective::AllGather, &[0], 0, None).is_ok());
        assert!(matches!(
            invalid_if(Collective::AllGather, &[0], 0, Some("x".into())),
            Err(CommError::InvalidArgument { .. })
        ));
    }
}
