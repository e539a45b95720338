//! A communication node as the executor runs it: its attributes read and checked once
//! ([`comm_call`] into a [`CommCall`]), and the call on a communicator ([`run_comm`]: the one
//! host implementation of a communication node, for any [`Communicator`], used by
//! the executor and its communication thread alike).

use crate::comm::{CommError, Communicator};
use crate::error::RuntimeError;
use crate::memory::node_text;
use crate::tensor::Tensor;
use shardc_ir::{Attr, Graph, OpKind, ReduceOp, TensorType};

/// A communication node's call, its attributes resolved (groups sorted, axes normalised).
///
/// Shared with other executors (the CUDA backend's) so every executor reads a communication
/// node's attributes the same way.
#[derive(Debug, Clone)]
pub enum CommCall {
    /// `AllReduce` over `group` with `op`.
    AllReduce {
        /// The sorted global ranks.
        group: Vec<usize>,
        /// The reduction.
        op: ReduceOp,
    },
    /// `AllGather` along `axis`.
    AllGather {
        /// The sorted global ranks.
        group: Vec<usize>,
        /// The concatenation axis.
        axis: usize,
    },
    /// `ReduceScatter` along `axis`.
    ReduceScatter {
        /// The sorted global ranks.
        group: Vec<usize>,
        /// The reduction.
        op: ReduceOp,
        /// The scatter axis.
        axis: usize,
    },
    /// `AllToAll` from `split_dim` to `concat_dim`.
    AllToAll {
        /// The sorted global ranks.
        group: Vec<usize>,
        /// The axis split into parts.
        split_dim: usize,
        /// The axis the received parts are concatenated along.
        concat_dim: usize,
    },
    /// `Broadcast` from global rank `root`.
    Broadcast {
        /// The sorted global ranks.
        group: Vec<usize>,
        /// The root's global rank.
        root: usize,
    },
    /// `Send` to global rank `dest`.
    Send {
        /// The receiver.
        dest: usize,
        /// The message tag.
        tag: i64,
    },
    /// `Receive` from global rank `src`.
    Receive {
        /// The sender.
        src: usize,
        /// The message tag.
        tag: i64,
    },
}

impl CommCall {
    /// The call's attributes as numbers (reduction, axes, root), what every member must
    /// agree on besides the input type ([`crate::comm::agree_on_call`]).
    pub fn params(&self) -> Vec<i64> {
        match self {
            CommCall::AllReduce { op, .. } => vec![*op as i64],
            CommCall::Broadcast { root, .. } => vec![*root as i64],
            CommCall::AllGather { axis, .. } => vec![*axis as i64],
            CommCall::ReduceScatter { op, axis, .. } => vec![*op as i64, *axis as i64],
            CommCall::AllToAll {
                split_dim,
                concat_dim,
                ..
            } => vec![*split_dim as i64, *concat_dim as i64],
            CommCall::Send { .. } | CommCall::Receive { .. } => Vec::new(),
        }
    }
}

/// Why a communication node failed: in the communicator, or before reaching it.
#[derive(Debug)]
pub enum CommFailure {
    /// The communicator's error.
    Comm(CommError),
    /// A missing operand or a result of the wrong type.
    Local(String),
}

impl std::fmt::Display for CommFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CommFailure::Comm(e) => write!(f, "{e}"),
            CommFailure::Local(reason) => f.write_str(reason),
        }
    }
}

/// Runs one communication node on host tensors: `input` is its operand (none for
/// `Receive`), `dst` its output buffer, already of type `ty`. A device without a
/// communicator of its own stages a node through here (operand downloaded, result
/// uploaded), so every device reads a [`CommCall`] the same way.
pub fn run_comm(
    comm: &dyn Communicator,
    call: &CommCall,
    input: Option<&Tensor>,
    dst: &mut Tensor,
    ty: &TensorType,
) -> Result<(), CommFailure> {
    let need_input = || {
        input.ok_or_else(|| CommFailure::Local("the executor has no value for operand 0".into()))
    };
    let store = |dst: &mut Tensor, t: &Tensor| -> Result<(), CommFailure> {
        if t.shape != ty.shape || t.dtype() != ty.dtype || !dst.copy_from(t) {
            return Err(CommFailure::Local(format!(
                "the communicator returned {} but the node's type is {ty}",
                t.ty()
            )));
        }
        Ok(())
    };
    match call {
        CommCall::AllReduce { group, op } => {
            store(dst, need_input()?)?;
            comm.all_reduce(group, *op, dst).map_err(CommFailure::Comm)
        }
        CommCall::Broadcast { group, root } => {
            store(dst, need_input()?)?;
            comm.broadcast(group, *root, dst).map_err(CommFailure::Comm)
        }
        CommCall::AllGather { group, axis } => {
            let t = comm
                .all_gather(group, *axis, need_input()?)
                .map_err(CommFailure::Comm)?;
            store(dst, &t)
        }
        CommCall::ReduceScatter { group, op, axis } => {
            let t = comm
                .reduce_scatter(group, *op, *axis, need_input()?)
                .map_err(CommFailure::Comm)?;
            store(dst, &t)
        }
        CommCall::AllToAll {
            group,
            split_dim,
            concat_dim,
        } => {
            let t = comm
                .all_to_all(group, *split_dim, *concat_dim, need_input()?)
                .map_err(CommFailure::Comm)?;
            store(dst, &t)
        }
        CommCall::Send { dest, tag } => {
            let x = need_input()?;
            comm.send(*dest, *tag, x).map_err(CommFailure::Comm)?;
            store(dst, x)
        }
        CommCall::Receive { src, tag } => {
            let t = comm.recv(*src, *tag, ty).map_err(CommFailure::Comm)?;
            store(dst, &t)
        }
    }
}

/// Reads and checks the attributes of communication node `i` for `comm`'s rank and world.
pub fn comm_call(
    graph: &Graph,
    i: usize,
    comm: &dyn Communicator,
) -> Result<CommCall, RuntimeError> {
    let node = &graph.nodes[i];
    let err = |reason: String| RuntimeError::Graph {
        graph: graph.name.clone(),
        location: node_text(graph, i),
        reason,
    };
    let (rank, size) = (comm.rank(), comm.size());
    let int_attr = |key: &str, default: Option<i64>| -> Result<i64, RuntimeError> {
        match (node.attrs.get(key), default) {
            (Some(Attr::Int(v)), _) => Ok(*v),
            (Some(other), _) => Err(err(format!(
                "attribute `{key}` must be an integer, got {other}"
            ))),
            (None, Some(d)) => Ok(d),
            (None, None) => Err(err(format!("attribute `{key}` is missing"))),
        }
    };
    let global_rank = |key: &str, default: Option<i64>| -> Result<usize, RuntimeError> {
        let r = int_attr(key, default)?;
        usize::try_from(r)
            .ok()
            .filter(|&r| r < size)
            .ok_or_else(|| {
                err(format!(
                    "attribute `{key}` {r} is not a rank of the world of {size} ranks"
                ))
            })
    };
    let group = || -> Result<Vec<usize>, RuntimeError> {
        let Some(attr) = node.attrs.get("rank_list") else {
            return Ok((0..size).collect());
        };
        let list = attr.as_ints().ok_or_else(|| {
            err(format!(
                "attribute `rank_list` must be a tuple of ranks, got {attr}"
            ))
        })?;
        let mut group = Vec::with_capacity(list.len());
        for &r in &list {
            match usize::try_from(r).ok().filter(|&r| r < size) {
                Some(r) => group.push(r),
                None => {
                    return Err(err(format!(
                        "attribute `rank_list` {attr} holds {r}, which is not a rank of the world of {size} ranks"
                    )))
                }
            }
        }
        group.sort_unstable();
        if group.is_empty() || group.windows(2).any(|w| w[0] == w[1]) {
            return Err(err(format!(
                "attribute `rank_list` {attr} must hold distinct ranks"
            )));
        }
        if !group.contains(&rank) {
            return Err(err(format!(
                "attribute `rank_list` {attr} does not hold this rank {rank}"
            )));
        }
        Ok(group)
    };
    let reduce_op = || -> Result<ReduceOp, RuntimeError> {
        match node.attrs.get("op") {
            None => Ok(ReduceOp::Sum),
            Some(Attr::Str(s)) => ReduceOp::from_name(s).ok_or_else(|| {
                err(format!(
                    "attribute `op` {s} is not a reduction (expected sum, max, min or prod)"
                ))
            }),
            Some(other) => Err(err(format!(
                "attribute `op` must be sum, max, min or prod, got {other}"
            ))),
        }
    };
    let input_rank = || -> usize {
        node.inputs
            .first()
            .and_then(|o| graph.operand_tensor_type(o))
            .map_or(0, |t| t.shape.len())
    };
    let axis = |key: &str, default: Option<i64>| -> Result<usize, RuntimeError> {
        let a = int_attr(key, default)?;
        let r = input_rank();
        let norm = if a < 0 {
            a.checked_add(r as i64)
        } else {
            Some(a)
        };
        norm.and_then(|a| usize::try_from(a).ok())
            .filter(|&a| a < r)
            .ok_or_else(|| {
                err(format!(
                    "attribute `{key}` {a} is out of range for an operand of rank {r}"
                ))
            })
    };
    let has_input = || -> Result<(), RuntimeError> {
        match node.inputs.first() {
            Some(o) if node.inputs.len() == 1 && graph.operand_tensor_type(o).is_some() => Ok(()),
            _ => Err(err(format!(
                "{} takes one tensor operand, got {} operands",
                node.op,
                node.inputs.len()
            ))),
        }
    };
    Ok(match node.op {
        OpKind::AllReduce => {
            has_input()?;
            CommCall::AllReduce {
                group: group()?,
                op: reduce_op()?,
            }
        }
        OpKind::AllGather => {
            has_input()?;
            CommCall::AllGather {
                group: group()?,
                axis: axis("axis", Some(0))?,
            }
        }
        OpKind::ReduceScatter => {
            has_input()?;
            CommCall::ReduceScatter {
                group: group()?,
                op: reduce_op()?,
                axis: axis("axis", Some(0))?,
            }
        }
        OpKind::AllToAll => {
            has_input()?;
            let group = group()?;
            if node.attrs.get("split_count").is_some() {
                let c = int_attr("split_count", None)?;
                if usize::try_from(c).ok() != Some(group.len()) {
                    return Err(err(format!(
                        "attribute `split_count` {c} differs from the group size {}",
                        group.len()
                    )));
                }
            }
            CommCall::AllToAll {
                split_dim: axis("split_dim", None)?,
                concat_dim: axis("concat_dim", None)?,
                group,
            }
        }
        OpKind::Broadcast => {
            has_input()?;
            let group = group()?;
            let root = global_rank("root_rank", Some(0))?;
            if !group.contains(&root) {
                return Err(err(format!(
                    "attribute `root_rank` {root} is not in the group {}",
                    crate::comm::RankList(&group)
                )));
            }
            CommCall::Broadcast { group, root }
        }
        OpKind::Send => {
            has_input()?;
            CommCall::Send {
                dest: global_rank("dest_rank", None)?,
                tag: int_attr("sr_tag", Some(0))?,
            }
        }
        OpKind::Receive => {
            if !node.inputs.is_empty() {
                return Err(err(format!(
                    "Receive takes no operand, got {}",
                    node.inputs.len()
                )));
            }
            CommCall::Receive {
                src: global_rank("src_rank", None)?,
                tag: int_attr("sr_tag", Some(0))?,
            }
        }
        other => {
            return Err(err(format!("{other} is not a communication op")));
        }
    })
}
