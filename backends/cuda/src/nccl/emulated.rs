//! NCCL emulated between the [`EmulatedDevice`]s of one process: each rank a thread with its
//! own device, as each NCCL rank has its own GPU.
//!
//! It keeps NCCL's contract, and is stricter where NCCL would hang or corrupt silently:
//! - `ncclCommInitRank` returns once all `nranks` members of the id have joined; two members
//!   on one device are refused (NCCL's "Duplicate GPU detected").
//! - The k-th collective of every member of a communicator is one operation: its members
//!   must agree on the call, count, element type, reduction and root, or every member gets
//!   an error naming both calls. Reductions run in member order.
//! - Sends and receives between two members pair in issue order (NCCL has no tags); a
//!   receive whose count or type differs from its send, or whose graph tag does (when both
//!   carry one), is an error. An ungrouped send returns once it has been received, as a
//!   GPU's stream waits for it; inside `ncclGroupStart/End` all sends are posted before the
//!   receives wait, so a group that exchanges with every peer completes.
//! - Whatever waits on other members gives up after [`EmulatedNccl::with_timeout`] (60 s by
//!   default) with an error saying who never came, instead of hanging a test.
//! - `ncclCommAbort` by one member ends every wait on that communicator, the other members'
//!   too (on a GPU they would go on waiting until their own watchdogs abort).
//!
//! Work issued while the device records a graph is recorded (as CUDA Graphs record NCCL's
//! kernels) and carried out at each replay. Work on the communication stream waits until the
//! compute stream waits for it ([`EmulatedDevice::run_on_comm_stream`]), so a reader that does
//! not wait reads the old values. Data move through host memory; the device's
//! ranges are checked.

use super::library::{CommHandle, NcclCall, NcclLibrary, Stream, UniqueId, ID_BYTES};
use crate::emulator::{EmulatedDevice, HostWork};
use crate::error::{CudaError, CudaResult};
use crate::kernels::DevPtr;
use half::f16;
use shardc_ir::{DType, ReduceOp};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// How long a member waits for the others by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

fn emu(reason: String) -> CudaError {
    CudaError::Emulator(format!("emulated NCCL: {reason}"))
}

/// A collective as its members must agree on it (buffers excluded).
#[derive(Clone, Debug, PartialEq)]
struct Signature {
    name: &'static str,
    count: usize,
    dtype: DType,
    op: Option<ReduceOp>,
    root: Option<usize>,
}

/// The k-th collective of a communicator: what each member brought.
struct Round {
    signature: Signature,
    inputs: Vec<Option<Arc<Vec<u8>>>>,
    finished: usize,
    /// Set when a member brought another call: every member then fails with it.
    conflict: Option<String>,
}

/// A send waiting for its receive.
struct Message {
    bytes: Arc<Vec<u8>>,
    count: usize,
    dtype: DType,
    tag: Option<i64>,
}

#[derive(Default)]
struct CliqueState {
    /// Per member: the device it joined from.
    joined: Vec<Option<usize>>,
    next_round: Vec<u64>,
    rounds: HashMap<u64, Round>,
    /// (from, to) -> messages in send order.
    mail: HashMap<(usize, usize), VecDeque<Message>>,
    /// (from, to) -> messages posted and received so far.
    posted: HashMap<(usize, usize), u64>,
    received: HashMap<(usize, usize), u64>,
    destroyed: usize,
    /// The member that aborted the communicator (`ncclCommAbort`), if one did.
    aborted: Option<usize>,
}

/// The members of one unique id.
struct Clique {
    nranks: usize,
    state: Mutex<CliqueState>,
    changed: Condvar,
}

impl Clique {
    fn lock(&self) -> MutexGuard<'_, CliqueState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits until `ready` holds (re-checked after every change) or the deadline passes;
    /// `who` says, on timeout, what was awaited.
    fn wait_until<'a>(
        &'a self,
        mut s: MutexGuard<'a, CliqueState>,
        timeout: Duration,
        mut ready: impl FnMut(&mut CliqueState) -> bool,
        who: impl Fn(&CliqueState) -> String,
    ) -> CudaResult<MutexGuard<'a, CliqueState>> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(r) = s.aborted {
                return Err(emu(format!(
                    "the communicator was aborted by its member {r} (ncclCommAbort)"
                )));
            }
            if ready(&mut s) {
                return Ok(s);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(emu(format!(
                    "waited {:.1} s: {}",
                    timeout.as_secs_f64(),
                    who(&s)
                )));
            }
            s = self
                .changed
                .wait_timeout(s, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

/// Every communicator of the process, by unique id.
fn cliques() -> &'static Mutex<HashMap<UniqueId, Arc<Clique>>> {
    static CLIQUES: OnceLock<Mutex<HashMap<UniqueId, Arc<Clique>>>> = OnceLock::new();
    CLIQUES.get_or_init(|| Mutex::new(HashMap::new()))
}

/// One member's view of a communicator.
#[derive(Clone)]
struct Member {
    clique: Arc<Clique>,
    rank: usize,
    id: UniqueId,
}

/// NCCL emulated for one rank on its [`EmulatedDevice`] (see the module doc).
pub struct EmulatedNccl {
    device: Arc<EmulatedDevice>,
    timeout: Duration,
    comms: Mutex<Vec<Option<Member>>>,
    group: OpenGroup<Member>,
}

/// The calls of an open NCCL group (issued between `ncclGroupStart` and `ncclGroupEnd`), for
/// both emulations; member `M` is the emulation's view of a communicator.
pub(super) struct OpenGroup<M>(Mutex<Option<Vec<(M, NcclCall)>>>);

impl<M> OpenGroup<M> {
    /// No group open.
    pub(super) fn new() -> OpenGroup<M> {
        OpenGroup(Mutex::new(None))
    }

    fn lock(&self) -> MutexGuard<'_, Option<Vec<(M, NcclCall)>>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Checks that `call`'s peer or root is one of the communicator's `members`, then adds it
    /// to the open group (None), or hands it back to be carried out now where none is open.
    pub(super) fn add(
        &self,
        m: M,
        call: &NcclCall,
        members: usize,
    ) -> CudaResult<Option<Vec<(M, NcclCall)>>> {
        let peer = match call {
            NcclCall::Send { peer, .. } | NcclCall::Recv { peer, .. } => Some(*peer),
            NcclCall::Broadcast { root, .. } => Some(*root),
            _ => None,
        };
        if let Some(p) = peer.filter(|&p| p >= members) {
            return Err(emu(format!(
                "{}: rank {p} is outside the communicator of {members} members",
                call.name(),
            )));
        }
        match self.lock().as_mut() {
            Some(calls) => {
                calls.push((m, call.clone()));
                Ok(None)
            }
            None => Ok(Some(vec![(m, call.clone())])),
        }
    }

    /// `ncclGroupStart` (not nested here).
    pub(super) fn start(&self) -> CudaResult<()> {
        let mut group = self.lock();
        if group.is_some() {
            return Err(emu("ncclGroupStart inside a group (not nested here)".into()));
        }
        *group = Some(Vec::new());
        Ok(())
    }

    /// `ncclGroupEnd`: the group's calls.
    pub(super) fn end(&self) -> CudaResult<Vec<(M, NcclCall)>> {
        self.lock()
            .take()
            .ok_or_else(|| emu("ncclGroupEnd without ncclGroupStart".into()))
    }
}

impl EmulatedNccl {
    /// NCCL for the rank on `device`.
    pub fn new(device: Arc<EmulatedDevice>) -> EmulatedNccl {
        EmulatedNccl {
            device,
            timeout: DEFAULT_TIMEOUT,
            comms: Mutex::new(Vec::new()),
            group: OpenGroup::new(),
        }
    }

    /// The same, waiting at most `timeout` for other members.
    pub fn with_timeout(mut self, timeout: Duration) -> EmulatedNccl {
        self.timeout = timeout;
        self
    }

    fn member(&self, comm: CommHandle) -> CudaResult<Member> {
        self.comms
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(comm)
            .cloned()
            .flatten()
            .ok_or_else(|| emu(format!("communicator {comm} does not exist (destroyed?)")))
    }

    /// Runs `calls` (one call, or a group) on the device's `stream`, or records them. Work on
    /// the communication stream waits there until the compute stream waits for it; anything
    /// on the compute stream first lets it run, so every member meets its collectives in
    /// the order it issued them (where a GPU would run both streams at once).
    fn submit(&self, calls: Vec<(Member, NcclCall)>, stream: Stream) -> CudaResult<()> {
        let timeout = self.timeout;
        let work: HostWork = Arc::new(move |dev: &EmulatedDevice| carry_out(dev, &calls, timeout));
        submit_on(&self.device, work, stream)
    }
}

/// Runs `work` (NCCL calls carried out on the host) on `device`'s `stream`, or records it
/// (see [`EmulatedNccl`]'s `submit`).
pub(super) fn submit_on(device: &EmulatedDevice, work: HostWork, stream: Stream) -> CudaResult<()> {
    match stream {
        Stream::Comm => device.run_on_comm_stream(work),
        Stream::Compute => {
            device.flush_comm(u64::MAX)?;
            device.run_or_record(work)
        }
    }
}

impl NcclLibrary for EmulatedNccl {
    fn description(&self) -> String {
        "NCCL emulated between the process's emulated devices".into()
    }

    fn unique_id(&self) -> CudaResult<UniqueId> {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let mut id = [0u8; ID_BYTES];
        id[..8].copy_from_slice(&NEXT.fetch_add(1, Ordering::Relaxed).to_le_bytes());
        id[8..12].copy_from_slice(&std::process::id().to_le_bytes());
        id[12..20].copy_from_slice(&(Arc::as_ptr(&self.device) as u64).to_le_bytes());
        Ok(id)
    }

    fn init_rank(&self, nranks: usize, id: &UniqueId, rank: usize) -> CudaResult<CommHandle> {
        if nranks == 0 || rank >= nranks {
            return Err(emu(format!(
                "ncclCommInitRank: rank {rank} of {nranks} members"
            )));
        }
        let clique = {
            let mut all = cliques().lock().unwrap_or_else(|p| p.into_inner());
            let c = all.entry(*id).or_insert_with(|| {
                Arc::new(Clique {
                    nranks,
                    state: Mutex::new(CliqueState {
                        joined: vec![None; nranks],
                        next_round: vec![0; nranks],
                        ..CliqueState::default()
                    }),
                    changed: Condvar::new(),
                })
            });
            c.clone()
        };
        if clique.nranks != nranks {
            return Err(emu(format!(
                "ncclCommInitRank: rank {rank} joins with {nranks} members, others with {}",
                clique.nranks
            )));
        }
        let device = Arc::as_ptr(&self.device) as usize;
        let mut s = clique.lock();
        if s.joined[rank].is_some() {
            return Err(emu(format!(
                "ncclCommInitRank: rank {rank} of this id joined twice"
            )));
        }
        if let Some(other) = s.joined.iter().position(|d| *d == Some(device)) {
            return Err(emu(format!(
                "ncclCommInitRank: ranks {other} and {rank} are on the same device (NCCL: \"Duplicate GPU detected\"; one rank per GPU)"
            )));
        }
        s.joined[rank] = Some(device);
        clique.changed.notify_all();
        let s = clique.wait_until(
            s,
            self.timeout,
            |s| s.joined.iter().all(Option::is_some),
            |s| {
                let missing: Vec<usize> = (0..s.joined.len())
                    .filter(|&r| s.joined[r].is_none())
                    .collect();
                format!(
                    "ncclCommInitRank at rank {rank} of {nranks}: ranks {missing:?} never joined"
                )
            },
        )?;
        drop(s);
        let mut comms = self.comms.lock().unwrap_or_else(|p| p.into_inner());
        comms.push(Some(Member {
            clique,
            rank,
            id: *id,
        }));
        Ok(comms.len() - 1)
    }

    fn issue(&self, comm: CommHandle, call: &NcclCall, stream: Stream) -> CudaResult<()> {
        let m = self.member(comm)?;
        let members = m.clique.nranks;
        match self.group.add(m, call, members)? {
            Some(now) => self.submit(now, stream),
            None => Ok(()),
        }
    }

    fn group_start(&self) -> CudaResult<()> {
        self.group.start()
    }

    fn group_end(&self) -> CudaResult<()> {
        let calls = self.group.end()?;
        if calls.is_empty() {
            return Ok(());
        }
        self.submit(calls, Stream::Compute)
    }

    fn abort(&self, comm: CommHandle) {
        if let Ok(m) = self.member(comm) {
            let mut s = m.clique.lock();
            s.aborted.get_or_insert(m.rank);
            m.clique.changed.notify_all();
        }
    }

    fn destroy(&self, comm: CommHandle) {
        let m = self
            .comms
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(comm)
            .and_then(Option::take);
        if let Some(m) = m {
            let last = {
                let mut s = m.clique.lock();
                s.destroyed += 1;
                s.destroyed == m.clique.nranks
            };
            if last {
                cliques()
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&m.id);
            }
        }
    }
}

impl Drop for EmulatedNccl {
    fn drop(&mut self) {
        let n = self.comms.lock().unwrap_or_else(|p| p.into_inner()).len();
        for c in 0..n {
            self.destroy(c);
        }
    }
}

/// Carries out one call or one group's calls for one member: sends posted first, then the
/// collectives and receives in order, then the wait for the sends to be received.
fn carry_out(
    dev: &EmulatedDevice,
    calls: &[(Member, NcclCall)],
    timeout: Duration,
) -> CudaResult<()> {
    // On a GPU a group's transfers run at once: a receive into memory a send reads races.
    let range = |call: &NcclCall| match *call {
        NcclCall::Send {
            buf, count, dtype, ..
        }
        | NcclCall::Recv {
            buf, count, dtype, ..
        } => Some((buf, buf + (count * dtype.size_bytes()) as u64)),
        _ => None,
    };
    for (_, recv) in calls
        .iter()
        .filter(|(_, c)| matches!(c, NcclCall::Recv { .. }))
    {
        for (_, send) in calls
            .iter()
            .filter(|(_, c)| matches!(c, NcclCall::Send { .. }))
        {
            if let (Some(r), Some(s)) = (range(recv), range(send)) {
                if r.0 < s.1 && s.0 < r.1 {
                    return Err(emu(format!(
                        "a group's ncclRecv into {:#x}..{:#x} overlaps its ncclSend from {:#x}..{:#x}: on a GPU they race",
                        r.0, r.1, s.0, s.1
                    )));
                }
            }
        }
    }
    let mut sent = Vec::new();
    for (m, call) in calls {
        if let NcclCall::Send {
            buf,
            count,
            dtype,
            peer,
            tag,
        } = *call
        {
            let bytes = dev.read_bytes(buf, count * dtype.size_bytes())?;
            let mut s = m.clique.lock();
            let key = (m.rank, peer);
            s.mail.entry(key).or_default().push_back(Message {
                bytes: Arc::new(bytes),
                count,
                dtype,
                tag,
            });
            let n = s.posted.entry(key).or_default();
            *n += 1;
            sent.push((m.clone(), peer, *n));
            m.clique.changed.notify_all();
        }
    }
    for (m, call) in calls {
        match call {
            NcclCall::Send { .. } => {}
            NcclCall::Recv {
                buf,
                count,
                dtype,
                peer,
                tag,
            } => receive(dev, m, (*buf, *count, *dtype, *peer, *tag), timeout)?,
            _ => collective(dev, m, call, timeout)?,
        }
    }
    for (m, peer, n) in sent {
        let key = (m.rank, peer);
        let s = m.clique.lock();
        let s = m.clique.wait_until(
            s,
            timeout,
            |s| s.received.get(&key).copied().unwrap_or(0) >= n,
            |_| format!("ncclSend from rank {} to rank {peer} was never received (its receive is missing, or comes after something that waits for this rank)", m.rank),
        )?;
        drop(s);
    }
    Ok(())
}

fn receive(
    dev: &EmulatedDevice,
    m: &Member,
    (buf, count, dtype, peer, tag): (DevPtr, usize, DType, usize, Option<i64>),
    timeout: Duration,
) -> CudaResult<()> {
    let key = (peer, m.rank);
    let s = m.clique.lock();
    let mut s = m.clique.wait_until(
        s,
        timeout,
        |s| s.mail.get(&key).is_some_and(|q| !q.is_empty()),
        |_| {
            format!(
                "ncclRecv at rank {} from rank {peer}: nothing was sent",
                m.rank
            )
        },
    )?;
    let msg = s
        .mail
        .get_mut(&key)
        .and_then(VecDeque::pop_front)
        .ok_or_else(|| emu("a message vanished".into()))?;
    *s.received.entry(key).or_default() += 1;
    m.clique.changed.notify_all();
    drop(s);
    if msg.count != count || msg.dtype != dtype {
        return Err(emu(format!(
            "ncclRecv at rank {} of {count} {dtype} from rank {peer} met a send of {} {}",
            m.rank, msg.count, msg.dtype
        )));
    }
    if let (Some(want), Some(got)) = (tag, msg.tag) {
        if want != got {
            return Err(emu(format!(
                "ncclRecv at rank {} from rank {peer} waits for tag {want} but the next send from there has tag {got} (NCCL pairs sends and receives in order)",
                m.rank
            )));
        }
    }
    dev.write_bytes(buf, &msg.bytes)
}

fn signature(call: &NcclCall) -> Signature {
    let (count, op, root) = match *call {
        NcclCall::AllReduce { count, op, .. } | NcclCall::ReduceScatter { count, op, .. } => {
            (count, Some(op), None)
        }
        NcclCall::Broadcast { count, root, .. } => (count, None, Some(root)),
        NcclCall::AllGather { count, .. }
        | NcclCall::Send { count, .. }
        | NcclCall::Recv { count, .. } => (count, None, None),
    };
    Signature {
        name: call.name(),
        count,
        dtype: call.dtype(),
        op,
        root,
    }
}

fn describe(s: &Signature) -> String {
    let mut t = format!("{} of {} {}", s.name, s.count, s.dtype);
    if let Some(op) = s.op {
        t.push_str(&format!(" ({op:?})"));
    }
    if let Some(r) = s.root {
        t.push_str(&format!(" from root {r}"));
    }
    t
}

fn collective(
    dev: &EmulatedDevice,
    m: &Member,
    call: &NcclCall,
    timeout: Duration,
) -> CudaResult<()> {
    let sig = signature(call);
    let n = m.clique.nranks;
    let elem = sig.dtype.size_bytes();
    let (send, send_elems, recv) = match *call {
        NcclCall::AllReduce {
            send, recv, count, ..
        }
        | NcclCall::AllGather {
            send, recv, count, ..
        } => (send, count, recv),
        NcclCall::Broadcast {
            send,
            recv,
            count,
            root,
            ..
        } => (send, if root == m.rank { count } else { 0 }, recv),
        NcclCall::ReduceScatter {
            send, recv, count, ..
        } => (send, count * n, recv),
        NcclCall::Send { .. } | NcclCall::Recv { .. } => {
            return Err(emu(format!("{} is not a collective", call.name())))
        }
    };
    let input = Arc::new(dev.read_bytes(send, send_elems * elem)?);
    let mut s = m.clique.lock();
    let round = s.next_round[m.rank];
    s.next_round[m.rank] += 1;
    let r = s.rounds.entry(round).or_insert_with(|| Round {
        signature: sig.clone(),
        inputs: vec![None; n],
        finished: 0,
        conflict: None,
    });
    if r.signature != sig && r.conflict.is_none() {
        r.conflict = Some(format!(
            "collective {round} of this communicator is {} at rank {} but {} elsewhere",
            describe(&sig),
            m.rank,
            describe(&r.signature)
        ));
    }
    r.inputs[m.rank] = Some(input);
    m.clique.changed.notify_all();
    let mut s = m.clique.wait_until(
        s,
        timeout,
        |s| {
            s.rounds
                .get(&round)
                .is_some_and(|r| r.conflict.is_some() || r.inputs.iter().all(Option::is_some))
        },
        |s| {
            let missing: Vec<usize> = s
                .rounds
                .get(&round)
                .map(|r| (0..n).filter(|&k| r.inputs[k].is_none()).collect())
                .unwrap_or_default();
            format!(
                "{} at rank {}: ranks {missing:?} of {n} never issued it",
                describe(&sig),
                m.rank
            )
        },
    )?;
    let r = s
        .rounds
        .get_mut(&round)
        .ok_or_else(|| emu("a round vanished".into()))?;
    let conflict = r.conflict.clone();
    let inputs: Vec<Arc<Vec<u8>>> = r.inputs.iter().flatten().cloned().collect();
    r.finished += 1;
    if r.finished == n {
        s.rounds.remove(&round);
    }
    drop(s);
    if let Some(c) = conflict {
        return Err(emu(c));
    }
    let out: Vec<u8> = match *call {
        NcclCall::AllReduce { op, .. } => reduce(&inputs, sig.dtype, op)?,
        NcclCall::Broadcast { root, .. } => inputs[root].to_vec(),
        NcclCall::AllGather { .. } => inputs.iter().flat_map(|b| b.iter().copied()).collect(),
        NcclCall::ReduceScatter { count, op, .. } => {
            let all = reduce(&inputs, sig.dtype, op)?;
            all[m.rank * count * elem..(m.rank + 1) * count * elem].to_vec()
        }
        _ => Vec::new(),
    };
    dev.write_bytes(recv, &out)
}

/// The elementwise reduction of `inputs` (equal lengths) in member order.
fn reduce(inputs: &[Arc<Vec<u8>>], dtype: DType, op: ReduceOp) -> CudaResult<Vec<u8>> {
    fn fold<T: Copy, const N: usize>(
        inputs: &[Arc<Vec<u8>>],
        from: impl Fn([u8; N]) -> T,
        to: impl Fn(T) -> [u8; N],
        f: impl Fn(T, T) -> T,
    ) -> Vec<u8> {
        let mut acc: Vec<T> = inputs[0]
            .chunks_exact(N)
            .map(|c| from(c.try_into().unwrap_or([0; N])))
            .collect();
        for b in &inputs[1..] {
            for (a, c) in acc.iter_mut().zip(b.chunks_exact(N)) {
                *a = f(*a, from(c.try_into().unwrap_or([0; N])));
            }
        }
        acc.into_iter().flat_map(to).collect()
    }
    macro_rules! by_op {
        (float $t:ty, $n:literal) => {
            by_op!(@ $t, $n, |a: $t, b: $t| a + b, |a: $t, b: $t| a * b)
        };
        (int $t:ty, $n:literal) => {
            by_op!(@ $t, $n, <$t>::wrapping_add, <$t>::wrapping_mul)
        };
        (@ $t:ty, $n:literal, $add:expr, $mul:expr) => {{
            let (from, to) = (<$t>::from_le_bytes, <$t>::to_le_bytes);
            match op {
                ReduceOp::Sum => fold::<$t, $n>(inputs, from, to, $add),
                ReduceOp::Prod => fold::<$t, $n>(inputs, from, to, $mul),
                ReduceOp::Max => fold::<$t, $n>(inputs, from, to, |a, b| pick(a, b, true)),
                ReduceOp::Min => fold::<$t, $n>(inputs, from, to, |a, b| pick(a, b, false)),
            }
        }};
    }
    Ok(match dtype {
        DType::Float32 => by_op!(float f32, 4),
        DType::Float64 => by_op!(float f64, 8),
        DType::Float16 => by_op!(float f16, 2),
        DType::Int32 => by_op!(int i32, 4),
        DType::Int64 => by_op!(int i64, 8),
        DType::Bool => by_op!(int u8, 1),
        other => return Err(emu(format!("NCCL cannot carry {other}"))),
    })
}

/// `b` where it is greater than `a` (`greater`) or less, else `a`: the first on a tie or
/// NaN, as shardc's host communicators reduce.
fn pick<T: PartialOrd>(a: T, b: T, greater: bool) -> T {
    if (greater && b > a) || (!greater && b < a) {
        b
    } else {
        a
    }
}
