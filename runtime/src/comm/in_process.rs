//! A world whose ranks are threads of one process.
//!
//! Every call of a collective deposits its member's tensor in a *slot* keyed by the group and
//! the group's sequence number (each rank counts its calls per group). The last member to
//! arrive combines the tensors in member order, once, and publishes the result; every member
//! takes its part of that one result, so results are bit-identical on every member and do
//! not depend on arrival order. A large AllReduce ([`ALL_REDUCE_PART_MIN`] elements or more
//! per member) is reduced by all members instead, each its own range of the elements in
//! member order, and a second rendezvous shares the reduced ranges (the same arithmetic, in
//! parallel: a serial reduction by the last member left the other cores idle). Waiting
//! members spin briefly (or yield, when the ranks outnumber the cores: [`WaitPolicy`]), then
//! sleep on the slot's condition variable until the result is published or the timeout
//! expires; a member that times out publishes a [`CommError::Timeout`] naming the ranks that
//! never arrived, which every later arrival of that call also gets. Point-to-point messages
//! go through FIFO mailboxes keyed by (source, destination, tag); `send` never blocks.

use super::arguments::{self, check_peer, invalid_if};
use super::tensor_ops::{
    concat_axis, member_range, part_axis, reduce_in_order, reduce_part_in_order,
    reduce_range_in_order, write_range,
};
use super::{
    assign, check_group, Collective, CommError, Communicator, CoreMoves, WaitPolicy, NO_CPU,
};
use crate::tensor::{Data, Tensor};
use shardc_ir::{ReduceOp, TensorType};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The default time a member waits for the others before a collective fails.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// The fewest elements per member from which an AllReduce is reduced by all its members in
/// parallel (each its own range, then a second rendezvous shares the ranges) rather than by
/// the last to arrive alone.
pub const ALL_REDUCE_PART_MIN: usize = 4096;

/// The result of one collective call: per member index, or for one-result collectives a
/// single tensor every member copies.
type Outcome = Arc<Result<Vec<Tensor>, CommError>>;

/// Wakes the members waiting on one slot.
#[derive(Default)]
struct Signal {
    ready: AtomicBool,
    cv: Condvar,
}

/// One collective call in progress.
struct Slot {
    collective: Collective,
    /// The call's parameters (`op=sum, axis=0`): every member must pass the same.
    params: String,
    /// The rank whose call created the slot (for mismatch messages).
    first_rank: usize,
    inputs: Vec<Option<Tensor>>,
    arrived: Vec<bool>,
    count: usize,
    outcome: Option<Outcome>,
    /// Members that have taken the outcome; the slot is dropped when all have.
    readers: usize,
    signal: Arc<Signal>,
}

/// The shared state of the world, behind one mutex.
#[derive(Default)]
struct State {
    slots: HashMap<(Vec<usize>, u64), Slot>,
    mail: HashMap<(usize, usize, i64), VecDeque<Tensor>>,
}

struct Shared {
    size: usize,
    timeout: Duration,
    state: Mutex<State>,
    /// Signalled on every send.
    mail_cv: Condvar,
    /// How a member waiting for the others passes the time before it sleeps.
    wait: WaitPolicy,
    /// Per rank: the core its thread last ran on when it began to wait ([`NO_CPU`]: not
    /// known), so that a waiter can tell that spinning only keeps the rank it waits for
    /// from running (see [`CoreMoves`]).
    cpus: Vec<AtomicU32>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // No code panics while holding the lock; a poisoned lock still holds a usable state.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Builds worlds of thread ranks.
#[derive(Clone, Copy, Debug)]
pub struct InProcessWorld;

impl InProcessWorld {
    /// A world of `size` ranks with the [`DEFAULT_TIMEOUT`]: element `r` is rank `r`'s
    /// communicator (move each to its own thread).
    // A world is only ever used through its ranks' communicators, so `new` returns them.
    #[allow(clippy::new_ret_no_self)]
    pub fn new(size: usize) -> Vec<Arc<dyn Communicator>> {
        InProcessWorld::with_timeout(size, DEFAULT_TIMEOUT)
    }

    /// As [`InProcessWorld::new`], waiting at most `timeout` for the other members of a
    /// collective (or for a message) before failing.
    pub fn with_timeout(size: usize, timeout: Duration) -> Vec<Arc<dyn Communicator>> {
        InProcessWorld::comms(size, timeout)
            .into_iter()
            .map(|c| Arc::new(c) as Arc<dyn Communicator>)
            .collect()
    }

    /// The communicators of a world of `size` ranks as their concrete type.
    pub fn comms(size: usize, timeout: Duration) -> Vec<InProcessComm> {
        let moves: Vec<CoreMoves> = (0..size).map(|r| CoreMoves::for_rank(r, size)).collect();
        let cores = moves.first().map_or(1, CoreMoves::cores);
        let shared = Arc::new(Shared {
            size,
            timeout,
            state: Mutex::new(State::default()),
            mail_cv: Condvar::new(),
            wait: WaitPolicy::for_host(size, cores),
            cpus: (0..size).map(|_| AtomicU32::new(NO_CPU)).collect(),
        });
        moves
            .into_iter()
            .enumerate()
            .map(|(rank, moves)| InProcessComm {
                rank,
                shared: shared.clone(),
                seq: Mutex::new(HashMap::new()),
                moves,
            })
            .collect()
    }
}

/// One rank of an [`InProcessWorld`].
pub struct InProcessComm {
    rank: usize,
    shared: Arc<Shared>,
    /// Per group: the sequence number of this rank's next call on it.
    seq: Mutex<HashMap<Vec<usize>, u64>>,
    /// Moves this rank's thread off a core another rank's thread last ran on; or, with more
    /// ranks than cores, keeps it on its home core.
    moves: CoreMoves,
}

impl std::fmt::Debug for InProcessComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InProcessComm")
            .field("rank", &self.rank)
            .field("size", &self.shared.size)
            .field("timeout", &self.shared.timeout)
            .finish()
    }
}

/// Checks that every member passed a tensor of the first member's type.
fn same_types(
    collective: Collective,
    group: &[usize],
    rank: usize,
    inputs: &[Tensor],
) -> Result<(), CommError> {
    let first = &inputs[0];
    for (k, t) in inputs.iter().enumerate().skip(1) {
        if t.shape != first.shape || t.dtype() != first.dtype() {
            return Err(CommError::Mismatch {
                collective,
                group: group.to_vec(),
                rank,
                reason: format!(
                    "rank {} passed {} but rank {} passed {}",
                    group[k],
                    t.ty(),
                    group[0],
                    first.ty()
                ),
            });
        }
    }
    Ok(())
}

impl InProcessComm {
    /// How many times this rank's waiting thread moved off a core another rank's thread had
    /// last run on.
    pub fn core_moves(&self) -> u64 {
        self.moves.count()
    }

    /// Whether another member of `group` last ran on this thread's core, which this thread
    /// could not leave: a waiter then yields instead of spinning.
    fn shares_core(&self, group: &[usize]) -> bool {
        let cpus = &self.shared.cpus;
        let others = cpus
            .iter()
            .enumerate()
            .filter(|&(r, _)| r != self.rank)
            .map(|(_, c)| c.load(Ordering::Relaxed));
        self.moves.still_shared(
            &cpus[self.rank],
            |cpu| {
                group
                    .iter()
                    .any(|&r| r != self.rank && cpus[r].load(Ordering::Relaxed) == cpu)
            },
            others,
        )
    }

    /// The time a member waits for the others.
    pub fn timeout(&self) -> Duration {
        self.shared.timeout
    }

    fn next_seq(&self, group: &[usize]) -> u64 {
        let mut seq = self.seq.lock().unwrap_or_else(|e| e.into_inner());
        let s = seq.entry(group.to_vec()).or_insert(0);
        let this = *s;
        *s += 1;
        this
    }

    fn invalid(&self, collective: Collective, group: &[usize], reason: String) -> CommError {
        CommError::InvalidArgument {
            collective,
            group: group.to_vec(),
            rank: self.rank,
            reason,
        }
    }

    /// Runs one collective call: deposits `input`, and the last member to arrive applies
    /// `combine` to the members' tensors (in member order). Returns the shared outcome and
    /// this rank's member index.
    fn collective(
        &self,
        collective: Collective,
        group: &[usize],
        params: String,
        input: Tensor,
        combine: impl FnOnce(Vec<Tensor>) -> Result<Vec<Tensor>, CommError>,
    ) -> Result<(Outcome, usize), CommError> {
        check_group(collective, group, self.rank, self.shared.size)?;
        self.moves.settle();
        let me = group.iter().position(|&r| r == self.rank).unwrap_or(0);
        let n = group.len();
        let key = (group.to_vec(), self.next_seq(group));
        let deadline = Instant::now() + self.shared.timeout;
        let mut state = self.shared.lock();
        let slot = state.slots.entry(key.clone()).or_insert_with(|| Slot {
            collective,
            params: params.clone(),
            first_rank: self.rank,
            inputs: (0..n).map(|_| None).collect(),
            arrived: vec![false; n],
            count: 0,
            outcome: None,
            readers: 0,
            signal: Arc::new(Signal::default()),
        });
        if slot.outcome.is_none() && (slot.collective != collective || slot.params != params) {
            let err = CommError::Mismatch {
                collective,
                group: group.to_vec(),
                rank: self.rank,
                reason: format!(
                    "call #{} on this group: rank {} called {}({}) but rank {} called {}({})",
                    key.1,
                    self.rank,
                    collective,
                    params,
                    slot.first_rank,
                    slot.collective,
                    slot.params
                ),
            };
            publish(slot, Arc::new(Err(err)));
        }
        if slot.outcome.is_none() {
            slot.inputs[me] = Some(input);
            slot.arrived[me] = true;
            slot.count += 1;
            if slot.count == n {
                let inputs: Vec<Tensor> = slot.inputs.iter_mut().filter_map(Option::take).collect();
                drop(state);
                let outcome = Arc::new(combine(inputs));
                state = self.shared.lock();
                if let Some(slot) = state.slots.get_mut(&key) {
                    if slot.outcome.is_none() {
                        publish(slot, outcome);
                    }
                }
            } else {
                let signal = slot.signal.clone();
                drop(state);
                // A condition variable's wake-up costs tens to hundreds of microseconds: spin
                // (or yield, when the ranks outnumber the cores) for a while first.
                self.shared.wait.pass_time(
                    || signal.ready.load(Ordering::Acquire),
                    || self.shares_core(group),
                );
                state = self.shared.lock();
                while let Some(slot) = state.slots.get_mut(&key) {
                    if slot.outcome.is_some() {
                        break;
                    }
                    let now = Instant::now();
                    if now >= deadline && slot.count < n {
                        let missing = group
                            .iter()
                            .zip(&slot.arrived)
                            .filter(|(_, &a)| !a)
                            .map(|(&r, _)| r)
                            .collect();
                        let err = CommError::Timeout {
                            collective,
                            group: group.to_vec(),
                            rank: self.rank,
                            missing,
                            timeout: self.shared.timeout,
                        };
                        publish(slot, Arc::new(Err(err)));
                        break;
                    }
                    // Once everyone has arrived the result is being computed: wait for it
                    // (checking again now and then) however long the deadline is past.
                    let wait = deadline
                        .saturating_duration_since(now)
                        .max(Duration::from_millis(1));
                    state = signal
                        .cv
                        .wait_timeout(state, wait)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
            }
        }
        let Some(slot) = state.slots.get_mut(&key) else {
            // Unreachable: a slot is dropped only after all members have read it.
            return Err(self.invalid(
                collective,
                group,
                "internal: the call's slot vanished".into(),
            ));
        };
        let outcome = slot
            .outcome
            .clone()
            .unwrap_or_else(|| Arc::new(Ok(Vec::new())));
        slot.readers += 1;
        if slot.readers == n {
            state.slots.remove(&key);
        }
        drop(state);
        match outcome.as_ref() {
            Ok(_) => Ok((outcome, me)),
            Err(e) => Err(e.clone()),
        }
    }
}

/// Publishes a slot's outcome and wakes its waiters.
fn publish(slot: &mut Slot, outcome: Outcome) {
    slot.outcome = Some(outcome);
    slot.signal.ready.store(true, Ordering::Release);
    slot.signal.cv.notify_all();
}

/// Tensor `k` of a successful outcome.
fn part(outcome: &Outcome, k: usize) -> Option<&Tensor> {
    outcome.as_ref().as_ref().ok().and_then(|v| v.get(k))
}

impl Communicator for InProcessComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.shared.size
    }

    fn all_reduce(
        &self,
        group: &[usize],
        op: ReduceOp,
        tensor: &mut Tensor,
    ) -> Result<(), CommError> {
        let c = Collective::AllReduce;
        let rank = self.rank;
        let n = group.len();
        let check = |inputs: &[Tensor]| {
            same_types(c, group, rank, inputs)?;
            invalid_if(c, group, rank, arguments::all_reduce(&inputs[0].ty()))
        };
        if n < 2 || tensor.len() < n * ALL_REDUCE_PART_MIN {
            let (outcome, _) =
                self.collective(c, group, format!("op={op}"), tensor.clone(), |inputs| {
                    check(&inputs)?;
                    Ok(vec![reduce_in_order(inputs, op)])
                })?;
            return copy_out(self, c, group, &outcome, 0, tensor);
        }
        // Large tensors: every member reduces its own range of the shared inputs, in member
        // order, in parallel; a second rendezvous shares the reduced ranges, which every
        // member copies into its tensor.
        let (outcome, me) =
            self.collective(c, group, format!("op={op}"), tensor.clone(), |inputs| {
                check(&inputs)?;
                Ok(inputs)
            })?;
        let len = tensor.len();
        let part = {
            let inputs = inputs_of(self, c, group, &outcome)?;
            reduce_range_in_order(&inputs, member_range(len, n, me), op)
        };
        drop(outcome);
        let (parts, _) = self.collective(c, group, format!("op={op}, reduced parts"), part, Ok)?;
        for (k, p) in inputs_of(self, c, group, &parts)?.into_iter().enumerate() {
            write_range(tensor, member_range(len, n, k).start, p);
        }
        Ok(())
    }

    fn all_gather(
        &self,
        group: &[usize],
        axis: usize,
        input: &Tensor,
    ) -> Result<Tensor, CommError> {
        let c = Collective::AllGather;
        let rank = self.rank;
        // The last member to arrive only checks; every member then concatenates the shared
        // inputs itself, in parallel (one copy each, none of them serial).
        let (outcome, _) =
            self.collective(c, group, format!("axis={axis}"), input.clone(), |inputs| {
                same_types(c, group, rank, &inputs)?;
                invalid_if(c, group, rank, arguments::all_gather(&inputs[0].ty(), axis))?;
                Ok(inputs)
            })?;
        Ok(concat_axis(&inputs_of(self, c, group, &outcome)?, axis))
    }

    fn reduce_scatter(
        &self,
        group: &[usize],
        op: ReduceOp,
        axis: usize,
        input: &Tensor,
    ) -> Result<Tensor, CommError> {
        let c = Collective::ReduceScatter;
        let rank = self.rank;
        let (outcome, me) = self.collective(
            c,
            group,
            format!("op={op}, axis={axis}"),
            input.clone(),
            |inputs| {
                same_types(c, group, rank, &inputs)?;
                let reason = arguments::reduce_scatter(&inputs[0].ty(), axis, group.len());
                invalid_if(c, group, rank, reason)?;
                Ok(inputs)
            },
        )?;
        // The last member to arrive only checks; every member then reduces its own part of
        // the shared inputs, in member order, in parallel (a serial reduction of the whole
        // tensor by the last member cost as much as an AllReduce).
        let inputs = inputs_of(self, c, group, &outcome)?;
        Ok(reduce_part_in_order(&inputs, axis, group.len(), me, op))
    }

    fn all_to_all(
        &self,
        group: &[usize],
        split_dim: usize,
        concat_dim: usize,
        input: &Tensor,
    ) -> Result<Tensor, CommError> {
        let c = Collective::AllToAll;
        let rank = self.rank;
        let (outcome, me) = self.collective(
            c,
            group,
            format!("split_dim={split_dim}, concat_dim={concat_dim}"),
            input.clone(),
            |inputs| {
                same_types(c, group, rank, &inputs)?;
                let ty = inputs[0].ty();
                let reason = arguments::all_to_all(&ty, split_dim, concat_dim, group.len());
                invalid_if(c, group, rank, reason)?;
                Ok(inputs)
            },
        )?;
        // Every member cuts its own part out of each shared input, in parallel.
        let parts: Vec<Tensor> = inputs_of(self, c, group, &outcome)?
            .into_iter()
            .map(|t| part_axis(t, split_dim, group.len(), me))
            .collect();
        let refs: Vec<&Tensor> = parts.iter().collect();
        Ok(concat_axis(&refs, concat_dim))
    }

    fn broadcast(
        &self,
        group: &[usize],
        root: usize,
        tensor: &mut Tensor,
    ) -> Result<(), CommError> {
        let c = Collective::Broadcast;
        if let Some(reason) = arguments::root_outside(group, root) {
            check_group(c, group, self.rank, self.shared.size)?;
            return Err(self.invalid(c, group, reason));
        }
        let rank = self.rank;
        let root_index = group.iter().position(|&r| r == root).unwrap_or(0);
        let (outcome, _) = self.collective(
            c,
            group,
            format!("root={root}"),
            tensor.clone(),
            |mut inputs| {
                same_types(c, group, rank, &inputs)?;
                Ok(vec![inputs.swap_remove(root_index)])
            },
        )?;
        copy_out(self, c, group, &outcome, 0, tensor)
    }

    fn send(&self, dest: usize, tag: i64, tensor: &Tensor) -> Result<(), CommError> {
        check_peer(Collective::Send, self.rank, self.shared.size, dest)?;
        let mut state = self.shared.lock();
        state
            .mail
            .entry((self.rank, dest, tag))
            .or_default()
            .push_back(tensor.clone());
        drop(state);
        self.shared.mail_cv.notify_all();
        Ok(())
    }

    fn recv(&self, src: usize, tag: i64, ty: &TensorType) -> Result<Tensor, CommError> {
        let c = Collective::Receive;
        check_peer(c, self.rank, self.shared.size, src)?;
        self.moves.settle();
        let deadline = Instant::now() + self.shared.timeout;
        let key = (src, self.rank, tag);
        let mut state = self.shared.lock();
        loop {
            if let Some(t) = state.mail.get_mut(&key).and_then(VecDeque::pop_front) {
                if t.shape != ty.shape || t.dtype() != ty.dtype {
                    return Err(CommError::Mismatch {
                        collective: c,
                        group: vec![src, self.rank],
                        rank: self.rank,
                        reason: format!(
                            "rank {src} sent {} under tag {tag} but rank {} expects {ty}",
                            t.ty(),
                            self.rank
                        ),
                    });
                }
                return Ok(t);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(CommError::Timeout {
                    collective: c,
                    group: vec![src, self.rank],
                    rank: self.rank,
                    missing: vec![src],
                    timeout: self.shared.timeout,
                });
            }
            state = self
                .shared
                .mail_cv
                .wait_timeout(state, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn overlaps_compute(&self, _group: &[usize]) -> bool {
        self.moves.spare_core()
    }

    fn barrier(&self, group: &[usize]) -> Result<(), CommError> {
        let empty = Tensor {
            shape: vec![0],
            data: Data::F32(Vec::new()),
        };
        self.collective(Collective::Barrier, group, String::new(), empty, |_| {
            Ok(Vec::new())
        })?;
        Ok(())
    }
}

/// Every member's input, in member order, from a successful outcome that holds the inputs
/// (the collectives whose members compute their own results from them, in parallel).
fn inputs_of<'a>(
    comm: &InProcessComm,
    c: Collective,
    group: &[usize],
    outcome: &'a Outcome,
) -> Result<Vec<&'a Tensor>, CommError> {
    (0..group.len())
        .map(|k| {
            part(outcome, k)
                .ok_or_else(|| comm.invalid(c, group, format!("internal: no input of member {k}")))
        })
        .collect()
}

/// Copies tensor `k` of the outcome into `dst`.
fn copy_out(
    comm: &InProcessComm,
    c: Collective,
    group: &[usize],
    outcome: &Outcome,
    k: usize,
    dst: &mut Tensor,
) -> Result<(), CommError> {
    let src = part(outcome, k)
        .ok_or_else(|| comm.invalid(c, group, format!("internal: no result for member {k}")))?;
    assign(dst, src);
    Ok(())
}
