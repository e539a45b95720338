//! Collectives over TCP between processes on any hosts: [`TcpComm`], a
//! [`Communicator`] whose results are bit-identical to the in-process world's.
//!
//! # Connections
//! [`TcpComm::new`] builds a full mesh: each rank connects to every lower rank and accepts
//! a connection from every higher rank on its [`TcpSetup::listener`]. The handshake carries
//! a magic, the job id and both ranks; with a token, both sides prove with HMAC-SHA256 over
//! fresh nonces that they hold it (compared in constant time). Connections of other jobs,
//! with a wrong token or from strangers are refused and logged, and setup goes on waiting
//! for the right peer. Sockets use `TCP_NODELAY`; one reader thread per connection files
//! incoming messages by (group, call number, step) or (source, tag), so different groups'
//! collectives and send/receive interleave freely. When the cluster runs with TLS
//! ([`TcpSetup::tls`]), each connection then runs a TLS handshake with the cluster's
//! certificates (both sides verified) and every message travels AES-256-GCM sealed under keys
//! exported from it (see `seal.rs`).
//!
//! # Algorithms
//! Every message carries the sender's collective, parameters, element type and shape, so
//! every member checks the others' calls before using their data (a disagreement is a
//! [`CommError::Mismatch`] on every member). Reductions combine the members' contributions
//! in member order, `((m0 op m1) op m2) ...` elementwise, exactly as the in-process world:
//! - AllReduce up to [`SMALL_ALL_REDUCE_BYTES`]: direct: every member sends its tensor to
//!   every other and reduces all of them itself (one round trip).
//! - Larger AllReduce: a direct reduce-scatter (member `i` receives chunk `i` of every
//!   member and reduces it in member order) then a direct all-gather of the reduced chunks,
//!   pipelined in segments of [`SEGMENT_BYTES`]; each member sends and receives
//!   `2 (n - 1) / n` of the tensor, as a ring does, in two steps instead of `2 (n - 1)`.
//! - AllGather, ReduceScatter (on any axis the group divides), AllToAll: direct exchange
//!   of the parts each member needs. Broadcast: the others report their tensor types to the
//!   root, which checks them and sends its tensor to each. Barrier: an empty message from
//!   every member to every other.
//!
//! # Failures
//! Every wait ends at the setup's timeout ([`CommError::Timeout`] naming the ranks whose
//! messages are missing). A connection that closes or breaks fails every call waiting on
//! that peer at once ([`CommError::Transport`]: `connection to rank 3 (10.0.0.4:4242)
//! closed`). A member whose call fails for a reason the others cannot see (its peer's
//! connection closed, a timeout) sends the error to the other members, which fail with it.

mod handshake;
mod mesh;
mod seal;
mod setup;

pub use seal::{DataPlaneTls, EXPORTER_LABEL, MAX_RECORD, RECORDS_PER_KEY};
pub use setup::TcpSetup;

use crate::wire::group_hash;
use mesh::{Call, Mesh, Msg};
use shardc_ir::{ReduceOp, TensorType};
use shardc_runtime::comm::arguments::{self, check_peer, invalid_if};
use shardc_runtime::comm::tensor_ops::{
    concat_axis, member_range, part_axis, reduce_data, reduce_data_range, reducible,
    write_data_range,
};
use shardc_runtime::comm::{check_group, Collective, CommError, Communicator};
use shardc_runtime::tensor::{Data, Tensor};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// AllReduce payloads up to this size use the direct algorithm (latency); larger ones the
/// reduce-scatter + all-gather (bandwidth).
pub const SMALL_ALL_REDUCE_BYTES: usize = 64 * 1024;

/// The large AllReduce moves its chunks in segments of this size, so that reducing one
/// segment overlaps receiving the next.
pub const SEGMENT_BYTES: usize = 512 * 1024;

/// Phase-two (all-gather) messages of the large AllReduce have this bit set in their step.
const PHASE2: u32 = 1 << 31;

/// One rank's communicator over TCP (see the module doc). Dropping it closes its
/// connections: its peers' calls waiting on it fail with [`CommError::Transport`].
pub struct TcpComm {
    mesh: Arc<Mesh>,
    /// Per group: the sequence number of this rank's next call on it.
    seqs: Mutex<HashMap<Vec<usize>, u64>>,
}

impl std::fmt::Debug for TcpComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpComm")
            .field("rank", &self.mesh.rank)
            .field("size", &self.mesh.size)
            .field("timeout", &self.mesh.timeout)
            .finish()
    }
}

impl Drop for TcpComm {
    fn drop(&mut self) {
        self.mesh.close();
    }
}

/// How a collective failed.
enum Failure {
    /// Every member computes this error itself (from the metadata all of them received).
    Shared(CommError),
    /// Only this member knows: the others are told.
    Own(CommError),
}

impl From<CommError> for Failure {
    fn from(e: CommError) -> Failure {
        Failure::Own(e)
    }
}

impl TcpComm {
    /// Connects to every other rank (see the module doc) and returns when the full mesh is
    /// up. Errors: [`CommError::InvalidArgument`] for an inconsistent setup,
    /// [`CommError::Timeout`] naming the ranks that never connected or could not be reached
    /// within the timeout, [`CommError::Transport`] when a peer refused this rank (wrong
    /// token, other job) or failed to authenticate. Setup errors are reported as a
    /// `Barrier` on the world group.
    pub fn new(setup: TcpSetup) -> Result<TcpComm, CommError> {
        let invalid = |reason: String| CommError::InvalidArgument {
            collective: Collective::Barrier,
            group: (0..setup.size).collect(),
            rank: setup.rank,
            reason: format!("TCP data plane setup: {reason}"),
        };
        if setup.size == 0 || setup.size > u32::MAX as usize {
            return Err(invalid(format!("a world of {} ranks", setup.size)));
        }
        if setup.rank >= setup.size {
            return Err(invalid(format!(
                "rank {} is outside the world of {} ranks",
                setup.rank, setup.size
            )));
        }
        if setup.peers.len() != setup.size {
            return Err(invalid(format!(
                "{} peer addresses for a world of {} ranks",
                setup.peers.len(),
                setup.size
            )));
        }
        if setup.job_id.len() > handshake::MAX_JOB_ID {
            return Err(invalid(format!(
                "the job id is {} bytes long (at most {})",
                setup.job_id.len(),
                handshake::MAX_JOB_ID
            )));
        }
        let mesh = Mesh::connect(setup)?;
        Ok(TcpComm {
            mesh,
            seqs: Mutex::new(HashMap::new()),
        })
    }

    /// The time a call waits for the other members.
    pub fn timeout(&self) -> Duration {
        self.mesh.timeout
    }

    fn next_seq(&self, group: &[usize]) -> u64 {
        let mut seqs = self.seqs.lock().unwrap_or_else(|e| e.into_inner());
        let s = seqs.entry(group.to_vec()).or_insert(0);
        let this = *s;
        *s += 1;
        this
    }

    /// Checks the group and numbers the call.
    fn begin<'a>(
        &self,
        collective: Collective,
        group: &'a [usize],
        params: String,
        t: &Tensor,
    ) -> Result<(Call<'a>, usize), CommError> {
        check_group(collective, group, self.mesh.rank, self.mesh.size)?;
        let me = group.iter().position(|&r| r == self.mesh.rank).unwrap_or(0);
        let call = Call {
            collective,
            group,
            key: group_hash(group),
            seq: self.next_seq(group),
            params,
            deadline: Instant::now() + self.mesh.timeout,
            dtype: t.dtype(),
            shape: t.shape.clone(),
        };
        Ok((call, me))
    }

    /// Runs a call's body; on failure tells the other members where needed, and forgets
    /// the call's mailbox.
    fn run<T>(
        &self,
        call: &Call,
        body: impl FnOnce() -> Result<T, Failure>,
    ) -> Result<T, CommError> {
        match body() {
            Ok(v) => {
                self.mesh.finish(call, true);
                Ok(v)
            }
            Err(Failure::Shared(e)) => {
                self.mesh.finish(call, false);
                Err(e)
            }
            Err(Failure::Own(e)) => {
                self.mesh.abort(call, &e);
                self.mesh.finish(call, false);
                Err(e)
            }
        }
    }

    /// The other members of the group, in member order.
    fn others(&self, group: &[usize]) -> Vec<usize> {
        group
            .iter()
            .copied()
            .filter(|&r| r != self.mesh.rank)
            .collect()
    }

    fn mismatch(&self, call: &Call, reason: String) -> CommError {
        CommError::Mismatch {
            collective: call.collective,
            group: call.group.to_vec(),
            rank: self.mesh.rank,
            reason,
        }
    }

    fn transport(&self, call: &Call, reason: String) -> CommError {
        CommError::Transport {
            collective: call.collective,
            group: call.group.to_vec(),
            rank: self.mesh.rank,
            reason,
        }
    }

    /// Checks that every member passed the first member's tensor type (`types` in member
    /// order), as the in-process world does.
    fn same_types(&self, call: &Call, types: &[TensorType]) -> Result<(), CommError> {
        let first = &types[0];
        for (k, t) in types.iter().enumerate().skip(1) {
            if t != first {
                return Err(self.mismatch(
                    call,
                    format!(
                        "rank {} passed {} but rank {} passed {}",
                        call.group[k], t, call.group[0], first
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The members' tensor types in member order: this member's own and the others' from
    /// their messages (`msgs` in the order of [`TcpComm::others`]).
    fn types(&self, call: &Call, me: usize, msgs: &[Msg]) -> Vec<TensorType> {
        let mut v: Vec<TensorType> = msgs
            .iter()
            .map(|m| TensorType::new(m.dtype, m.shape.clone()))
            .collect();
        v.insert(me, TensorType::new(call.dtype, call.shape.clone()));
        v
    }

    /// Checks that a peer's payload has `expected` elements.
    fn check_len(&self, call: &Call, src: usize, m: &Msg, expected: usize) -> Result<(), Failure> {
        if m.data.len() == expected {
            return Ok(());
        }
        Err(Failure::Own(self.transport(
            call,
            format!(
                "rank {src} sent {} elements where {expected} were expected",
                m.data.len()
            ),
        )))
    }

    /// Reduces the members' contributions in member order: `own` is this member's (member
    /// `me`), `msgs` the others' in member order.
    fn reduce_members(me: usize, own: Data, msgs: Vec<Msg>, op: ReduceOp) -> Data {
        let mut others = msgs.into_iter().map(|m| m.data);
        let mut own = Some(own);
        let mut acc: Option<Data> = None;
        let n = others.len() + 1;
        for m in 0..n {
            let x = if m == me { own.take() } else { others.next() };
            let Some(x) = x else { continue };
            match acc.as_mut() {
                None => acc = Some(x),
                Some(a) => reduce_data(a, &x, op),
            }
        }
        acc.unwrap_or(Data::F32(Vec::new()))
    }

    fn all_reduce_direct(
        &self,
        call: &Call,
        me: usize,
        op: ReduceOp,
        tensor: &mut Tensor,
    ) -> Result<(), Failure> {
        let others = self.others(call.group);
        let len = tensor.len();
        let ok = reducible(tensor.dtype());
        for &p in &others {
            self.mesh
                .send(call, p, 0, &tensor.data, if ok { 0..len } else { 0..0 })?;
        }
        let msgs = self.mesh.wait(call, &others, 0)?;
        let types = self.types(call, me, &msgs);
        self.same_types(call, &types).map_err(Failure::Shared)?;
        invalid(call, self.mesh.rank, arguments::all_reduce(&types[0])).map_err(Failure::Shared)?;
        for (m, &p) in msgs.iter().zip(&others) {
            self.check_len(call, p, m, len)?;
        }
        let own = std::mem::replace(&mut tensor.data, Data::F32(Vec::new()));
        tensor.data = Self::reduce_members(me, own, msgs, op);
        Ok(())
    }

    fn all_reduce_large(
        &self,
        call: &Call,
        me: usize,
        op: ReduceOp,
        tensor: &mut Tensor,
    ) -> Result<(), Failure> {
        let n = call.group.len();
        let others = self.others(call.group);
        let len = tensor.len();
        let seg = (SEGMENT_BYTES / tensor.dtype().size_bytes()).max(1);
        // Segment `k` of member `j`'s chunk, and the number of segments (at least one).
        let segment = |j: usize, k: usize| {
            let c = member_range(len, n, j);
            let start = (c.start + k * seg).min(c.end);
            start..(start + seg).min(c.end)
        };
        let segments = |j: usize| member_range(len, n, j).len().div_ceil(seg).max(1);
        // Phase one: every member's chunk `j` to member `j`.
        for off in 1..n {
            let j = (me + off) % n;
            for k in 0..segments(j) {
                self.mesh
                    .send(call, call.group[j], k as u32, &tensor.data, segment(j, k))?;
            }
        }
        // Reduce this member's chunk segment by segment, in member order, and send each
        // reduced segment to every other member.
        for k in 0..segments(me) {
            let msgs = self.mesh.wait(call, &others, k as u32)?;
            if k == 0 {
                let types = self.types(call, me, &msgs);
                self.same_types(call, &types).map_err(Failure::Shared)?;
            }
            let r = segment(me, k);
            for (m, &p) in msgs.iter().zip(&others) {
                self.check_len(call, p, m, r.len())?;
            }
            // In member order, without copying this member's own contribution.
            let mut it = msgs.into_iter().map(|m| m.data);
            if me == 0 {
                for x in it {
                    let all = 0..x.len();
                    reduce_data_range(&mut tensor.data, r.start, &x, all, op);
                }
            } else if let Some(mut acc) = it.next() {
                for m in 1..n {
                    if m == me {
                        reduce_data_range(&mut acc, 0, &tensor.data, r.clone(), op);
                    } else if let Some(x) = it.next() {
                        reduce_data(&mut acc, &x, op);
                    }
                }
                write_data_range(&mut tensor.data, r.start, &acc);
            }
            for &p in &others {
                self.mesh
                    .send(call, p, PHASE2 | k as u32, &tensor.data, r.clone())?;
            }
        }
        // Phase two: the other members' reduced chunks.
        for off in 1..n {
            let j = (me + off) % n;
            for k in 0..segments(j) {
                let r = segment(j, k);
                let src = call.group[j];
                let mut msgs = self.mesh.wait(call, &[src], PHASE2 | k as u32)?;
                let m = msgs.pop().ok_or_else(|| {
                    Failure::Own(self.transport(call, format!("no message from rank {src}")))
                })?;
                self.check_len(call, src, &m, r.len())?;
                write_data_range(&mut tensor.data, r.start, &m.data);
            }
        }
        Ok(())
    }
}

/// `InvalidArgument` of the call with `reason`, if there is one.
fn invalid(call: &Call, rank: usize, reason: Option<String>) -> Result<(), CommError> {
    invalid_if(call.collective, call.group, rank, reason)
}

impl Communicator for TcpComm {
    fn rank(&self) -> usize {
        self.mesh.rank
    }

    fn size(&self) -> usize {
        self.mesh.size
    }

    fn all_reduce(
        &self,
        group: &[usize],
        op: ReduceOp,
        tensor: &mut Tensor,
    ) -> Result<(), CommError> {
        let (call, me) = self.begin(Collective::AllReduce, group, format!("op={op}"), tensor)?;
        let rank = self.mesh.rank;
        self.run(&call, || {
            if group.len() == 1 {
                return invalid(&call, rank, arguments::all_reduce(&tensor.ty()))
                    .map_err(Failure::Shared);
            }
            let bytes = tensor.len() * tensor.dtype().size_bytes();
            if bytes <= SMALL_ALL_REDUCE_BYTES || !reducible(tensor.dtype()) {
                self.all_reduce_direct(&call, me, op, tensor)
            } else {
                self.all_reduce_large(&call, me, op, tensor)
            }
        })
    }

    fn all_gather(
        &self,
        group: &[usize],
        axis: usize,
        input: &Tensor,
    ) -> Result<Tensor, CommError> {
        let (call, me) = self.begin(Collective::AllGather, group, format!("axis={axis}"), input)?;
        let rank = self.mesh.rank;
        self.run(&call, || {
            let others = self.others(group);
            for &p in &others {
                self.mesh.send(&call, p, 0, &input.data, 0..input.len())?;
            }
            let msgs = self.mesh.wait(&call, &others, 0)?;
            let types = self.types(&call, me, &msgs);
            self.same_types(&call, &types).map_err(Failure::Shared)?;
            invalid(&call, rank, arguments::all_gather(&types[0], axis))
                .map_err(Failure::Shared)?;
            for (m, &p) in msgs.iter().zip(&others) {
                self.check_len(&call, p, m, input.len())?;
            }
            let mut parts: Vec<Tensor> = msgs
                .into_iter()
                .map(|m| Tensor {
                    shape: input.shape.clone(),
                    data: m.data,
                })
                .collect();
            parts.insert(me, input.clone());
            let refs: Vec<&Tensor> = parts.iter().collect();
            Ok(concat_axis(&refs, axis))
        })
    }

    fn reduce_scatter(
        &self,
        group: &[usize],
        op: ReduceOp,
        axis: usize,
        input: &Tensor,
    ) -> Result<Tensor, CommError> {
        let (call, me) = self.begin(
            Collective::ReduceScatter,
            group,
            format!("op={op}, axis={axis}"),
            input,
        )?;
        let rank = self.mesh.rank;
        let n = group.len();
        self.run(&call, || {
            // A member whose own input is unusable sends nothing; every member then reports
            // the error from the types the messages carry.
            let ok = arguments::reduce_scatter(&input.ty(), axis, n).is_none();
            for (j, &p) in group.iter().enumerate() {
                if p == rank {
                    continue;
                }
                if ok {
                    let part = part_axis(input, axis, n, j);
                    self.mesh.send(&call, p, 0, &part.data, 0..part.len())?;
                } else {
                    self.mesh.send(&call, p, 0, &input.data, 0..0)?;
                }
            }
            let others = self.others(group);
            let msgs = self.mesh.wait(&call, &others, 0)?;
            let types = self.types(&call, me, &msgs);
            self.same_types(&call, &types).map_err(Failure::Shared)?;
            invalid(&call, rank, arguments::reduce_scatter(&types[0], axis, n))
                .map_err(Failure::Shared)?;
            let own = part_axis(input, axis, n, me);
            for (m, &p) in msgs.iter().zip(&others) {
                self.check_len(&call, p, m, own.len())?;
            }
            let data = Self::reduce_members(me, own.data, msgs, op);
            Ok(Tensor {
                shape: own.shape,
                data,
            })
        })
    }

    fn all_to_all(
        &self,
        group: &[usize],
        split_dim: usize,
        concat_dim: usize,
        input: &Tensor,
    ) -> Result<Tensor, CommError> {
        let (call, me) = self.begin(
            Collective::AllToAll,
            group,
            format!("split_dim={split_dim}, concat_dim={concat_dim}"),
            input,
        )?;
        let rank = self.mesh.rank;
        let n = group.len();
        self.run(&call, || {
            let ok = arguments::all_to_all(&input.ty(), split_dim, concat_dim, n).is_none();
            for (j, &p) in group.iter().enumerate() {
                if p == rank {
                    continue;
                }
                if ok {
                    let part = part_axis(input, split_dim, n, j);
                    self.mesh.send(&call, p, 0, &part.data, 0..part.len())?;
                } else {
                    self.mesh.send(&call, p, 0, &input.data, 0..0)?;
                }
            }
            let others = self.others(group);
            let msgs = self.mesh.wait(&call, &others, 0)?;
            let types = self.types(&call, me, &msgs);
            self.same_types(&call, &types).map_err(Failure::Shared)?;
            let reason = arguments::all_to_all(&types[0], split_dim, concat_dim, n);
            invalid(&call, rank, reason).map_err(Failure::Shared)?;
            let own = part_axis(input, split_dim, n, me);
            for (m, &p) in msgs.iter().zip(&others) {
                self.check_len(&call, p, m, own.len())?;
            }
            let mut parts: Vec<Tensor> = msgs
                .into_iter()
                .map(|m| Tensor {
                    shape: own.shape.clone(),
                    data: m.data,
                })
                .collect();
            parts.insert(me, own);
            let refs: Vec<&Tensor> = parts.iter().collect();
            Ok(concat_axis(&refs, concat_dim))
        })
    }

    fn broadcast(
        &self,
        group: &[usize],
        root: usize,
        tensor: &mut Tensor,
    ) -> Result<(), CommError> {
        let c = Collective::Broadcast;
        let rank = self.mesh.rank;
        if let Some(reason) = arguments::root_outside(group, root) {
            check_group(c, group, rank, self.mesh.size)?;
            return invalid_if(c, group, rank, Some(reason));
        }
        let (call, me) = self.begin(c, group, format!("root={root}"), tensor)?;
        self.run(&call, || {
            if group.len() == 1 {
                return Ok(());
            }
            let len = tensor.len();
            if rank == root {
                let others = self.others(group);
                let msgs = self.mesh.wait(&call, &others, 0)?;
                let types = self.types(&call, me, &msgs);
                // The others learn the verdict from the root: an error is this member's to
                // report.
                self.same_types(&call, &types).map_err(Failure::Own)?;
                for &p in &others {
                    self.mesh.send(&call, p, 1, &tensor.data, 0..len)?;
                }
                Ok(())
            } else {
                self.mesh.send(&call, root, 0, &tensor.data, 0..0)?;
                let mut msgs = self.mesh.wait(&call, &[root], 1)?;
                let m = msgs.pop().ok_or_else(|| {
                    Failure::Own(self.transport(&call, format!("no message from rank {root}")))
                })?;
                self.check_len(&call, root, &m, len)?;
                if m.dtype != tensor.dtype() {
                    return Err(Failure::Own(self.mismatch(
                        &call,
                        format!(
                            "rank {root} sent {} but rank {rank} passed {}",
                            TensorType::new(m.dtype, m.shape.clone()),
                            tensor.ty()
                        ),
                    )));
                }
                tensor.data = m.data;
                Ok(())
            }
        })
    }

    fn send(&self, dest: usize, tag: i64, tensor: &Tensor) -> Result<(), CommError> {
        let c = Collective::Send;
        check_peer(c, self.mesh.rank, self.mesh.size, dest)?;
        self.mesh
            .send_p2p(dest, tag, tensor.dtype(), &tensor.shape, &tensor.data)
            .map_err(|reason| CommError::Transport {
                collective: c,
                group: vec![self.mesh.rank, dest],
                rank: self.mesh.rank,
                reason,
            })
    }

    fn recv(&self, src: usize, tag: i64, ty: &TensorType) -> Result<Tensor, CommError> {
        let c = Collective::Receive;
        check_peer(c, self.mesh.rank, self.mesh.size, src)?;
        let rank = self.mesh.rank;
        let group = vec![src, rank];
        let deadline = Instant::now() + self.mesh.timeout;
        match self.mesh.recv_p2p(src, tag, deadline) {
            Ok(m) => {
                let got = TensorType::new(m.dtype, m.shape.clone());
                if got.shape != ty.shape || got.dtype != ty.dtype {
                    return Err(CommError::Mismatch {
                        collective: c,
                        group,
                        rank,
                        reason: format!(
                            "rank {src} sent {got} under tag {tag} but rank {rank} expects {ty}"
                        ),
                    });
                }
                if m.data.len() != ty.num_elements() {
                    return Err(CommError::Transport {
                        collective: c,
                        group,
                        rank,
                        reason: format!(
                            "rank {src} sent {} elements for {got} under tag {tag}",
                            m.data.len()
                        ),
                    });
                }
                Ok(Tensor {
                    shape: m.shape,
                    data: m.data,
                })
            }
            Err(None) => Err(CommError::Timeout {
                collective: c,
                group,
                rank,
                missing: vec![src],
                timeout: self.mesh.timeout,
            }),
            Err(Some(reason)) => Err(CommError::Transport {
                collective: c,
                group,
                rank,
                reason,
            }),
        }
    }

    fn barrier(&self, group: &[usize]) -> Result<(), CommError> {
        let empty = Tensor {
            shape: vec![0],
            data: Data::F32(Vec::new()),
        };
        let (call, _) = self.begin(Collective::Barrier, group, String::new(), &empty)?;
        self.run(&call, || {
            let others = self.others(group);
            for &p in &others {
                self.mesh.send(&call, p, 0, &empty.data, 0..0)?;
            }
            self.mesh.wait(&call, &others, 0)?;
            Ok(())
        })
    }
}
