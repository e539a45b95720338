//! Communication between ranks: the [`Communicator`] trait that the executor runs collective
//! nodes through, its error type, and an in-process implementation ([`InProcessWorld`]) whose
//! ranks are threads of one process (used by `shardc verify`).
//!
//! Conventions every implementation follows:
//! - A *group* is a sorted list of distinct global ranks (`&[usize]`) that contains the
//!   caller's rank. The *member index* of a rank is its position in that list; results are
//!   assembled and reduced in member order (member 0's tensor, then member 1's, ...), so they
//!   are bit-identical on every member and independent of arrival order.
//! - Collectives on one group are matched by order: every member calls them in the same
//!   sequence (the per-rank graphs' node order guarantees it).
//! - Reductions work on Float32, Float64, Int32 and Int64 tensors; the data-movement
//!   collectives (gather, all-to-all, broadcast, send/receive) on every dtype.

pub mod arguments;
pub mod conformance;
mod cores;
mod in_process;
pub mod tensor_ops;
mod wait;

pub use cores::{allowed_cores, current_cpu, restrict_to, CoreMoves, NO_CPU};
pub use in_process::{InProcessComm, InProcessWorld, DEFAULT_TIMEOUT};
pub use wait::WaitPolicy;

use crate::tensor::Tensor;
use shardc_ir::{ReduceOp, TensorType};
use std::fmt;
use std::time::Duration;

/// How long a rank waits for its peers in one collective (or, with NCCL, in one step's
/// collectives) where `SHARDC_COMM_TIMEOUT` does not say.
pub const DEFAULT_COMM_TIMEOUT: Duration = Duration::from_secs(300);

/// `SHARDC_COMM_TIMEOUT` (seconds; default [`DEFAULT_COMM_TIMEOUT`]): how long a launched
/// rank waits for its peers, on every communicator. An error names the value when it is not
/// a positive number of seconds.
pub fn comm_timeout_from_env() -> Result<Duration, String> {
    match std::env::var("SHARDC_COMM_TIMEOUT") {
        Err(_) => Ok(DEFAULT_COMM_TIMEOUT),
        Ok(v) => v
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|s| s.is_finite() && *s > 0.0)
            .map(Duration::from_secs_f64)
            .ok_or_else(|| {
                format!("SHARDC_COMM_TIMEOUT = {v}: expected a positive number of seconds")
            }),
    }
}

/// The collective (or point-to-point operation) an error concerns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Collective {
    /// [`Communicator::all_reduce`].
    AllReduce,
    /// [`Communicator::all_gather`].
    AllGather,
    /// [`Communicator::reduce_scatter`].
    ReduceScatter,
    /// [`Communicator::all_to_all`].
    AllToAll,
    /// [`Communicator::broadcast`].
    Broadcast,
    /// [`Communicator::send`].
    Send,
    /// [`Communicator::recv`].
    Receive,
    /// [`Communicator::barrier`].
    Barrier,
}

impl Collective {
    /// The name as in the IR (`AllReduce`, `AlltoAll`, ...; `Barrier` for the barrier).
    pub fn name(self) -> &'static str {
        match self {
            Collective::AllReduce => "AllReduce",
            Collective::AllGather => "AllGather",
            Collective::ReduceScatter => "ReduceScatter",
            Collective::AllToAll => "AlltoAll",
            Collective::Broadcast => "Broadcast",
            Collective::Send => "Send",
            Collective::Receive => "Receive",
            Collective::Barrier => "Barrier",
        }
    }
}

impl fmt::Display for Collective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Displays a list of ranks as `{0, 2, 5}` (as in the errors' messages).
pub struct RankList<'a>(
    /// The ranks.
    pub &'a [usize],
);

impl fmt::Display for RankList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("{")?;
        for (i, r) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{r}")?;
        }
        f.write_str("}")
    }
}

/// What went wrong in a collective. Every message names the collective, the group (for
/// send/receive: `{src, dest}`), a rank and the reason. An error detected while combining
/// the members' tensors (a [`CommError::Mismatch`]) or by a member that timed out is given to
/// every member of that call as it is, so its `rank` is the rank that detected it.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum CommError {
    /// The group is malformed: empty, unsorted, with duplicates or ranks outside the world, or
    /// without the calling rank; or a peer rank is outside the world.
    #[error("{collective} on group {} at rank {rank}: {reason}", RankList(group))]
    InvalidGroup {
        /// The collective.
        collective: Collective,
        /// The group as given.
        group: Vec<usize>,
        /// The calling rank.
        rank: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// An argument is unusable: an axis out of range, a dimension the group size does not
    /// divide, an element type the collective cannot reduce, a root outside the group.
    #[error("{collective} on group {} at rank {rank}: {reason}", RankList(group))]
    InvalidArgument {
        /// The collective.
        collective: Collective,
        /// The group.
        group: Vec<usize>,
        /// The calling rank.
        rank: usize,
        /// Which argument and why.
        reason: String,
    },
    /// The members disagree: different shapes or element types, different collectives or
    /// parameters at the same position of the group's sequence, or a received tensor that
    /// is not what the receiver expects.
    #[error(
        "{collective} on group {} at rank {rank}: members disagree: {reason}",
        RankList(group)
    )]
    Mismatch {
        /// The collective.
        collective: Collective,
        /// The group.
        group: Vec<usize>,
        /// The calling rank.
        rank: usize,
        /// Who has what.
        reason: String,
    },
    /// The transport between processes failed: a peer's connection closed or broke, shared
    /// memory could not be set up, a peer sent something unreadable, or the job was aborted.
    /// The reason names the peer rank concerned where there is one.
    #[error("{collective} on group {} at rank {rank}: {reason}", RankList(group))]
    Transport {
        /// The collective.
        collective: Collective,
        /// The group.
        group: Vec<usize>,
        /// The calling rank.
        rank: usize,
        /// What failed, naming the peer.
        reason: String,
    },
    /// Some members never arrived within the timeout.
    #[error(
        "{collective} on group {} at rank {rank}: timed out after {:.3} s; ranks {} never arrived",
        RankList(group),
        timeout.as_secs_f64(),
        RankList(missing)
    )]
    Timeout {
        /// The collective.
        collective: Collective,
        /// The group.
        group: Vec<usize>,
        /// The calling (waiting) rank.
        rank: usize,
        /// The global ranks that did not arrive.
        missing: Vec<usize>,
        /// The timeout that expired.
        timeout: Duration,
    },
}

/// Communication between the ranks of a world of [`Communicator::size`] ranks.
///
/// Collectives take a group (see the module doc) and block until every member has called the
/// same collective at the same position of that group's sequence; a member that does not
/// arrive within the implementation's timeout makes the call fail with
/// [`CommError::Timeout`]. Errors never leave a member hanging: when one member detects
/// a disagreement, every member of that call gets an error.
pub trait Communicator: Send + Sync {
    /// This rank, in `0..size()`.
    fn rank(&self) -> usize;

    /// The number of ranks in the world.
    fn size(&self) -> usize;

    /// Reduces `tensor` over the group with `op`, in member order; every member gets the
    /// same result in place. Shapes and dtypes must agree.
    fn all_reduce(
        &self,
        group: &[usize],
        op: ReduceOp,
        tensor: &mut Tensor,
    ) -> Result<(), CommError>;

    /// Concatenates the members' tensors along `axis` in member order. Shapes and dtypes
    /// must agree; the result's `axis` dim is `|group|` times the input's.
    fn all_gather(&self, group: &[usize], axis: usize, input: &Tensor)
        -> Result<Tensor, CommError>;

    /// Reduces the members' tensors with `op` (in member order), then member `i` keeps part
    /// `i` of `|group|` equal parts along `axis` (which `|group|` must divide).
    fn reduce_scatter(
        &self,
        group: &[usize],
        op: ReduceOp,
        axis: usize,
        input: &Tensor,
    ) -> Result<Tensor, CommError>;

    /// Splits the input along `split_dim` into `|group|` equal parts; part `j` goes to member
    /// `j`; each member concatenates the parts it receives along `concat_dim` in member
    /// order. Shapes and dtypes must agree.
    fn all_to_all(
        &self,
        group: &[usize],
        split_dim: usize,
        concat_dim: usize,
        input: &Tensor,
    ) -> Result<Tensor, CommError>;

    /// Every member's `tensor` becomes the value of the member whose global rank is `root`
    /// (which must be in the group). Shapes and dtypes must agree.
    fn broadcast(&self, group: &[usize], root: usize, tensor: &mut Tensor)
        -> Result<(), CommError>;

    /// Sends a copy of `tensor` to rank `dest` under `tag`. Messages between one pair of
    /// ranks with one tag arrive in the order sent. May return before the receiver receives.
    fn send(&self, dest: usize, tag: i64, tensor: &Tensor) -> Result<(), CommError>;

    /// Receives the next tensor rank `src` sent under `tag`; it must have type `ty`.
    fn recv(&self, src: usize, tag: i64, ty: &TensorType) -> Result<Tensor, CommError>;

    /// Returns when every member of the group has called `barrier` (at the same position of
    /// the group's sequence).
    fn barrier(&self, group: &[usize]) -> Result<(), CommError>;

    /// Whether a collective of `group` run on a thread of its own overlaps this rank's
    /// compute rather than taking turns with it: the executor then runs gradient buckets on
    /// its communication thread (else on the main thread). By default yes (a network or a
    /// device does the moving); a communicator whose collectives are CPU copies between ranks
    /// of one host says no when the host has no core to spare beyond one per local rank.
    fn overlaps_compute(&self, group: &[usize]) -> bool {
        let _ = group;
        true
    }
}

/// Whether every rank of `comm`'s world can take a path (a device communicator: NCCL, HCCL),
/// given this rank's own obstacle `mine`: they must all decide alike, or the ones that take
/// it wait for the others for ever. None where all can; else why not (this rank's reason, or
/// `another`: what to say when only other ranks have one). Every rank must call it, at the
/// same point.
pub fn why_not_all(
    comm: &dyn Communicator,
    mine: Option<String>,
    another: &str,
) -> Result<Option<String>, CommError> {
    let world: Vec<usize> = (0..comm.size()).collect();
    let mut flag = Tensor::from_i32(vec![1], vec![i32::from(mine.is_some())]).ok_or_else(|| {
        CommError::InvalidArgument {
            collective: Collective::AllReduce,
            group: world.clone(),
            rank: comm.rank(),
            reason: "cannot make the flag tensor".into(),
        }
    })?;
    comm.all_reduce(&world, ReduceOp::Max, &mut flag)?;
    let any = matches!(&flag.data, crate::tensor::Data::I32(v) if v.first() == Some(&1));
    Ok(match (any, mine) {
        (_, Some(why)) => Some(why),
        (true, None) => Some(another.to_string()),
        (false, None) => None,
    })
}

/// Whether every member of `group` calls `collective` with the same input type and
/// parameters (`params`: the call's attributes, [`crate::executor::CommCall::params`]),
/// compared over `bootstrap`: a device library (NCCL, HCCL) cannot tell a disagreement and
/// would hang or read past a buffer. For host-staged calls of a device communicator, no hot
/// path (an executor's own collectives come from one compiled graph and skip this). The
/// error names the ranks whose call differs.
pub fn agree_on_call(
    bootstrap: &dyn Communicator,
    collective: Collective,
    group: &[usize],
    input: Option<&TensorType>,
    params: &[i64],
) -> Result<(), CommError> {
    if group.len() < 2 {
        return Ok(());
    }
    let rank = bootstrap.rank();
    const WORDS: usize = 16;
    let mut d = vec![collective as i64, params.len() as i64];
    d.extend_from_slice(params);
    if let Some(t) = input {
        d.push(t.dtype as i64);
        d.push(t.shape.len() as i64);
        d.extend(t.shape.iter().map(|&x| x as i64));
    }
    if d.len() > WORDS {
        // Too many dims to compare in one descriptor: a hash of the rest in the last word.
        let h = d[WORDS - 1..]
            .iter()
            .fold(0xcbf2_9ce4_8422_2325u64, |h, &w| {
                (h ^ w as u64).wrapping_mul(0x0100_0000_01b3)
            });
        d.truncate(WORDS - 1);
        d.push(h as i64);
    }
    d.resize(WORDS, -1);
    let mine =
        Tensor::from_i64(vec![1, WORDS], d.clone()).ok_or_else(|| CommError::InvalidArgument {
            collective,
            group: group.to_vec(),
            rank,
            reason: "cannot describe the call".into(),
        })?;
    let all = bootstrap.all_gather(group, 0, &mine)?;
    let crate::tensor::Data::I64(words) = &all.data else {
        return Ok(());
    };
    let differing: Vec<usize> = words
        .chunks(WORDS)
        .zip(group)
        .filter(|(w, _)| *w != d.as_slice())
        .map(|(_, &r)| r)
        .collect();
    if differing.is_empty() {
        return Ok(());
    }
    Err(CommError::Mismatch {
        collective,
        group: group.to_vec(),
        rank,
        reason: format!(
            "rank {rank} calls it with {}, ranks {differing:?} with another type or parameters",
            input.map_or("no input".to_string(), |t| t.to_string())
        ),
    })
}

/// Checks a group: non-empty, strictly ascending, inside a world of `size`, holding `rank`.
pub fn check_group(
    collective: Collective,
    group: &[usize],
    rank: usize,
    size: usize,
) -> Result<(), CommError> {
    let err = |reason: String| CommError::InvalidGroup {
        collective,
        group: group.to_vec(),
        rank,
        reason,
    };
    if group.is_empty() {
        return Err(err("the group is empty".into()));
    }
    if group.windows(2).any(|w| w[0] >= w[1]) {
        return Err(err(
            "the group must list distinct ranks in ascending order".into()
        ));
    }
    if let Some(&r) = group.iter().find(|&&r| r >= size) {
        return Err(err(format!(
            "rank {r} is outside the world of {size} ranks"
        )));
    }
    if !group.contains(&rank) {
        return Err(err(format!("rank {rank} is not a member of the group")));
    }
    Ok(())
}

pub(crate) use tensor_ops::assign;
