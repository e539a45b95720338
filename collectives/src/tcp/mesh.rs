//! The full mesh of TCP connections and the mailboxes that one reader thread per connection
//! fills.
//!
//! Setup: every rank connects to each lower rank and accepts a connection from each higher
//! rank (a handshake with the job id, the ranks and, when a token is set, HMAC-SHA256 proofs
//! in both directions; anything else is refused and logged). Then one reader thread per
//! connection reads frames and files them under (group hash, sequence number) for
//! collectives, or (source, tag) for send/receive; callers wait on one condition variable
//! with their call's deadline. A connection that closes or breaks marks its peer dead, and
//! every call waiting on a message from that peer fails at once.

use super::handshake::{self, Hello, Side};
use super::seal::{self, DataPlaneTls, OpenedReader, SealedWriter, Secret};
use super::setup::TcpSetup;
use crate::wire::{self, Body, Header, Kind, WireError};
use shardc_ir::DType;
use shardc_runtime::comm::{Collective, CommError};
use shardc_runtime::tensor::Data;
use std::collections::{HashMap, HashSet, VecDeque};
use std::io::{self, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

/// The longest a single handshake may take (a stranger that connects and says nothing is
/// dropped after this).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The reader's buffer: frame headers and small payloads are read through it; larger
/// payloads go straight from the socket into the tensor's buffer (a bigger buffer would
/// copy them twice).
const READ_BUFFER: usize = 32 * 1024;

/// A message of a collective call or a send.
#[derive(Debug)]
pub(super) struct Msg {
    pub collective: Collective,
    pub params: String,
    /// The sender's tensor's element type and shape.
    pub dtype: DType,
    pub shape: Vec<usize>,
    /// The payload (a part of the sender's tensor, depending on the collective).
    pub data: Data,
}

/// The messages of one collective call that have arrived.
#[derive(Default)]
struct CallBox {
    /// (source rank, step, message).
    msgs: Vec<(usize, u32, Msg)>,
    /// The first member error reported for this call, with its sender.
    abort: Option<(usize, WireError)>,
}

#[derive(Default)]
struct MailState {
    calls: HashMap<(u64, u64), CallBox>,
    p2p: HashMap<(usize, u64), VecDeque<Msg>>,
    /// Per rank: why its connection is gone.
    dead: Vec<Option<String>>,
    /// Calls that ended in an error: their late messages are dropped.
    discarded: HashSet<(u64, u64)>,
}

/// One collective call in progress, as the mesh sees it.
pub(super) struct Call<'a> {
    pub collective: Collective,
    pub group: &'a [usize],
    /// The group's hash.
    pub key: u64,
    pub seq: u64,
    pub params: String,
    pub deadline: Instant,
    /// This member's tensor type (sent with every message).
    pub dtype: DType,
    pub shape: Vec<usize>,
}

/// The connections and mailboxes of one rank.
pub(super) struct Mesh {
    pub rank: usize,
    pub size: usize,
    pub peers: Vec<SocketAddr>,
    pub timeout: Duration,
    /// The write side of each peer's connection (`None` for this rank).
    writers: Vec<Option<Mutex<Link>>>,
    state: Mutex<MailState>,
    cv: Condvar,
    closing: AtomicBool,
}

fn world(size: usize) -> Vec<usize> {
    (0..size).collect()
}

fn setup_transport(rank: usize, size: usize, reason: String) -> CommError {
    CommError::Transport {
        collective: Collective::Barrier,
        group: world(size),
        rank,
        reason: format!("setting up the TCP data plane: {reason}"),
    }
}

fn log_refusal(rank: usize, addr: SocketAddr, reason: &str) {
    eprintln!("shardc: data plane of rank {rank}: refused a connection from {addr}: {reason}");
}

/// What the acceptor side needs to judge a connection.
#[derive(Clone)]
struct AcceptCtx {
    rank: usize,
    size: usize,
    job_id: String,
    token: Option<Vec<u8>>,
    timeout: Duration,
    tls: Option<DataPlaneTls>,
    claimed: Arc<Mutex<Vec<bool>>>,
    tx: mpsc::Sender<(usize, Connected)>,
}

/// An authenticated connection: the stream, and its TLS secret when the data plane is
/// encrypted.
type Connected = (TcpStream, Option<Secret>);

/// The sending side of a connection.
enum Link {
    Plain(TcpStream),
    Sealed(Box<SealedWriter<TcpStream>>),
}

impl Link {
    fn stream(&self) -> &TcpStream {
        match self {
            Link::Plain(s) => s,
            Link::Sealed(w) => w.get_ref(),
        }
    }

    /// Writes one frame.
    fn frame(&mut self, h: &Header, payload: &[u8]) -> io::Result<()> {
        match self {
            Link::Plain(s) => wire::write_frame(s, h, payload),
            Link::Sealed(w) => {
                wire::write_frame(w, h, payload)?;
                w.flush()
            }
        }
    }
}

/// Why the two ends of a connection disagree about TLS, if they do.
fn tls_mismatch(theirs: bool, ours: bool) -> Option<String> {
    match (theirs, ours) {
        (true, false) => Some("it encrypts the data plane (TLS) but this rank does not".into()),
        (false, true) => Some("it does not use TLS but this rank requires it".into()),
        _ => None,
    }
}

fn set_timeouts(s: &TcpStream, t: Duration) -> io::Result<()> {
    let t = t.max(Duration::from_millis(1));
    s.set_read_timeout(Some(t))?;
    s.set_write_timeout(Some(t))
}

/// The acceptor side of the handshake; logs and drops refused connections.
fn accept_one(ctx: AcceptCtx, mut s: TcpStream, addr: SocketAddr) {
    let refuse = |s: &mut TcpStream, reason: &str| {
        log_refusal(ctx.rank, addr, reason);
        // Best effort: the connection is dropped either way.
        let _ = handshake::write_status(s, None, reason);
    };
    if let Err(e) = set_timeouts(&s, HANDSHAKE_TIMEOUT.min(ctx.timeout)) {
        log_refusal(ctx.rank, addr, &e.to_string());
        return;
    }
    let hello = match handshake::read_hello(&mut s) {
        Ok(h) => h,
        Err(e) => {
            log_refusal(ctx.rank, addr, &format!("unreadable handshake: {e}"));
            return;
        }
    };
    let from = hello.from as usize;
    let problem = if hello.job_id != ctx.job_id {
        Some(format!(
            "it belongs to job '{}', not to this job '{}'",
            hello.job_id, ctx.job_id
        ))
    } else if hello.size as usize != ctx.size {
        Some(format!(
            "it expects a world of {} ranks, not {}",
            hello.size, ctx.size
        ))
    } else if hello.to as usize != ctx.rank {
        Some(format!(
            "it is for rank {}, not rank {}",
            hello.to, ctx.rank
        ))
    } else if from <= ctx.rank || from >= ctx.size {
        Some(format!(
            "rank {from} may not connect to rank {} (higher ranks connect to lower ones)",
            ctx.rank
        ))
    } else if hello.has_token != ctx.token.is_some() {
        Some(if ctx.token.is_some() {
            "it has no cluster token but this job requires one".to_string()
        } else {
            "it uses a cluster token but this job has none".to_string()
        })
    } else {
        tls_mismatch(hello.tls, ctx.tls.is_some())
    };
    if let Some(p) = problem {
        refuse(&mut s, &p);
        return;
    }
    let nonce = match handshake::nonce() {
        Ok(n) => n,
        Err(e) => {
            refuse(&mut s, &e.to_string());
            return;
        }
    };
    let my_proof = match &ctx.token {
        Some(t) => match handshake::proof(t, Side::Acceptor, &hello, &nonce) {
            Some(p) => p,
            None => {
                refuse(&mut s, "cannot compute the token proof");
                return;
            }
        },
        None => [0u8; 32],
    };
    if handshake::write_status(&mut s, Some((&nonce, &my_proof)), "").is_err() {
        return;
    }
    let their_proof = match handshake::read_status(&mut s) {
        Ok(Ok((_, p))) => p,
        Ok(Err(reason)) => {
            log_refusal(
                ctx.rank,
                addr,
                &format!("rank {from} refused this rank: {reason}"),
            );
            return;
        }
        Err(e) => {
            log_refusal(ctx.rank, addr, &format!("unreadable handshake: {e}"));
            return;
        }
    };
    if let Some(t) = &ctx.token {
        let expected = handshake::proof(t, Side::Connector, &hello, &nonce);
        if !handshake::proof_ok(expected, &their_proof) {
            refuse(
                &mut s,
                &format!("authentication failed: the peer claiming rank {from} does not hold the cluster token"),
            );
            return;
        }
    }
    {
        let mut claimed = ctx.claimed.lock().unwrap_or_else(|e| e.into_inner());
        if claimed[from] {
            drop(claimed);
            refuse(&mut s, &format!("rank {from} is already connected"));
            return;
        }
        claimed[from] = true;
    }
    let unclaim = || {
        ctx.claimed.lock().unwrap_or_else(|e| e.into_inner())[from] = false;
    };
    if handshake::write_status(&mut s, Some((&[0; 32], &[0; 32])), "").is_err() {
        unclaim();
        return;
    }
    let secret = match &ctx.tls {
        None => None,
        Some(tls) => match seal::accept(tls, &mut s, &ctx.job_id, ctx.rank, from) {
            Ok(secret) => Some(secret),
            Err(e) => {
                log_refusal(ctx.rank, addr, &format!("rank {from}: {e}"));
                unclaim();
                return;
            }
        },
    };
    // The receiver is gone only when setup already failed.
    let _ = ctx.tx.send((from, (s, secret)));
}

/// Why connecting to a lower rank failed.
enum ConnectError {
    /// It never answered before the deadline.
    Unreachable(String),
    /// It refused, or failed to authenticate: final.
    Refused(String),
}

/// The connector side: connects to `to` (retrying until `deadline`) and authenticates.
fn connect_one(setup: &TcpSetup, to: usize, deadline: Instant) -> Result<Connected, ConnectError> {
    let addr = setup.peers[to];
    let mut last = String::from("no attempt");
    loop {
        let now = Instant::now();
        if now >= deadline {
            return Err(ConnectError::Unreachable(last));
        }
        let left = deadline - now;
        match TcpStream::connect_timeout(&addr, left.min(Duration::from_secs(2))) {
            Ok(s) => match handshake_connector(setup, to, s, deadline) {
                Ok(s) => return Ok(s),
                Err(ConnectError::Refused(r)) => return Err(ConnectError::Refused(r)),
                Err(ConnectError::Unreachable(r)) => last = r,
            },
            Err(e) => last = e.to_string(),
        }
        thread::sleep(
            Duration::from_millis(20).min(deadline.saturating_duration_since(Instant::now())),
        );
    }
}

fn handshake_connector(
    setup: &TcpSetup,
    to: usize,
    mut s: TcpStream,
    deadline: Instant,
) -> Result<Connected, ConnectError> {
    let addr = setup.peers[to];
    let io = |e: io::Error| ConnectError::Unreachable(format!("handshake with {addr}: {e}"));
    set_timeouts(&s, deadline.saturating_duration_since(Instant::now())).map_err(io)?;
    let hello = Hello {
        from: setup.rank as u32,
        to: to as u32,
        size: setup.size as u32,
        has_token: setup.token.is_some(),
        tls: setup.tls.is_some(),
        nonce: handshake::nonce().map_err(|e| ConnectError::Refused(e.to_string()))?,
        job_id: setup.job_id.clone(),
    };
    handshake::write_hello(&mut s, &hello).map_err(io)?;
    let (their_nonce, their_proof) = match handshake::read_status(&mut s).map_err(io)? {
        Ok(x) => x,
        Err(reason) => {
            return Err(ConnectError::Refused(format!(
                "rank {to} ({addr}) refused the data connection: {reason}"
            )))
        }
    };
    let my_proof = match &setup.token {
        Some(t) => {
            let expected = handshake::proof(t, Side::Acceptor, &hello, &their_nonce);
            if !handshake::proof_ok(expected, &their_proof) {
                let _ = handshake::write_status(&mut s, None, "you do not hold the cluster token");
                return Err(ConnectError::Refused(format!(
                    "rank {to} ({addr}) failed to prove that it holds the cluster token"
                )));
            }
            handshake::proof(t, Side::Connector, &hello, &their_nonce)
                .ok_or_else(|| ConnectError::Refused("cannot compute the token proof".into()))?
        }
        None => [0u8; 32],
    };
    handshake::write_status(&mut s, Some((&[0; 32], &my_proof)), "").map_err(io)?;
    if let Err(reason) = handshake::read_status(&mut s).map_err(io)? {
        return Err(ConnectError::Refused(format!(
            "rank {to} ({addr}) refused the data connection: {reason}"
        )));
    }
    let secret = match &setup.tls {
        None => None,
        Some(tls) => {
            let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
            let secret =
                seal::connect(tls, &mut s, name, &setup.job_id, to, setup.rank).map_err(|e| {
                    ConnectError::Refused(format!("data connection to rank {to} ({addr}): {e}"))
                })?;
            Some(secret)
        }
    };
    Ok((s, secret))
}

impl Mesh {
    /// Connects the full mesh (see the module doc) and starts the reader threads.
    pub(super) fn connect(setup: TcpSetup) -> Result<Arc<Mesh>, CommError> {
        let (rank, size) = (setup.rank, setup.size);
        let deadline = Instant::now() + setup.timeout;
        let (tx, rx) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let acceptor = if rank + 1 < size {
            setup
                .listener
                .set_nonblocking(true)
                .map_err(|e| setup_transport(rank, size, format!("listener: {e}")))?;
            let listener = setup
                .listener
                .try_clone()
                .map_err(|e| setup_transport(rank, size, format!("listener: {e}")))?;
            let ctx = AcceptCtx {
                rank,
                size,
                job_id: setup.job_id.clone(),
                token: setup.token.clone(),
                tls: setup.tls.clone(),
                timeout: setup.timeout,
                claimed: Arc::new(Mutex::new(vec![false; size])),
                tx,
            };
            let stop = stop.clone();
            Some(
                thread::Builder::new()
                    .name(format!("shardc-tcp-accept-{rank}"))
                    .spawn(move || accept_loop(listener, ctx, &stop))
                    .map_err(|e| setup_transport(rank, size, format!("thread: {e}")))?,
            )
        } else {
            drop(tx);
            None
        };
        let finish_acceptor = |acceptor: Option<thread::JoinHandle<()>>| {
            stop.store(true, Ordering::Release);
            if let Some(h) = acceptor {
                let _ = h.join();
            }
        };
        let mut streams: Vec<Option<Connected>> = (0..size).map(|_| None).collect();
        for (to, slot) in streams.iter_mut().enumerate().take(rank) {
            match connect_one(&setup, to, deadline) {
                Ok(s) => *slot = Some(s),
                // Named among the missing ranks below.
                Err(ConnectError::Unreachable(_)) => {}
                Err(ConnectError::Refused(reason)) => {
                    finish_acceptor(acceptor);
                    return Err(setup_transport(rank, size, reason));
                }
            }
        }
        let mut waiting = size - rank - 1;
        while waiting > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok((from, s)) => {
                    if streams[from].is_none() {
                        streams[from] = Some(s);
                        waiting -= 1;
                    }
                }
                Err(_) => break,
            }
        }
        finish_acceptor(acceptor);
        drop(setup.listener);
        let missing: Vec<usize> = (0..size)
            .filter(|&r| r != rank && streams[r].is_none())
            .collect();
        if !missing.is_empty() {
            return Err(CommError::Timeout {
                collective: Collective::Barrier,
                group: world(size),
                rank,
                missing,
                timeout: setup.timeout,
            });
        }
        let mut writers = Vec::with_capacity(size);
        let mut readers = Vec::new();
        for (peer, s) in streams.into_iter().enumerate() {
            let Some((s, secret)) = s else {
                writers.push(None);
                continue;
            };
            let prepare = || -> io::Result<TcpStream> {
                s.set_nodelay(true)?;
                s.set_read_timeout(None)?;
                // A peer that stops reading (a stopped process) fails the sender's call.
                s.set_write_timeout(Some(setup.timeout.max(Duration::from_millis(1))))?;
                s.try_clone()
            };
            let r = prepare().map_err(|e| {
                setup_transport(rank, size, format!("connection to rank {peer}: {e}"))
            })?;
            let link = match &secret {
                None => Link::Plain(s),
                Some(k) => Link::Sealed(Box::new(SealedWriter::new(s, k, rank, peer).map_err(
                    |e| setup_transport(rank, size, format!("connection to rank {peer}: {e}")),
                )?)),
            };
            readers.push((peer, r, secret));
            writers.push(Some(Mutex::new(link)));
        }
        let mesh = Arc::new(Mesh {
            rank,
            size,
            peers: setup.peers,
            timeout: setup.timeout,
            writers,
            state: Mutex::new(MailState {
                dead: vec![None; size],
                ..MailState::default()
            }),
            cv: Condvar::new(),
            closing: AtomicBool::new(false),
        });
        for (peer, stream, secret) in readers {
            let m = mesh.clone();
            let spawned = thread::Builder::new()
                .name(format!("shardc-tcp-{rank}-from-{peer}"))
                .spawn(move || match secret {
                    None => {
                        let r = BufReader::with_capacity(READ_BUFFER, &stream);
                        m.read_loop(peer, &stream, r)
                    }
                    Some(k) => match OpenedReader::new(&stream, &k, peer, rank) {
                        Ok(r) => m.read_loop(peer, &stream, r),
                        Err(e) => m.mark_dead(peer, format!("connection to rank {peer}: {e}")),
                    },
                });
            if let Err(e) = spawned {
                mesh.close();
                return Err(setup_transport(rank, size, format!("thread: {e}")));
            }
        }
        Ok(mesh)
    }

    fn lock(&self) -> MutexGuard<'_, MailState> {
        // No code panics while holding the lock; a poisoned lock still holds a usable state.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `rank 3 (1.2.3.4:5)`.
    fn peer_name(&self, r: usize) -> String {
        format!("rank {r} ({})", self.peers[r])
    }

    fn mark_dead(&self, peer: usize, why: String) {
        let mut st = self.lock();
        if st.dead[peer].is_none() {
            st.dead[peer] = Some(why);
        }
        drop(st);
        self.cv.notify_all();
    }

    /// Files the frames read through `r` (from `stream`) until the connection ends.
    fn read_loop(&self, peer: usize, stream: &TcpStream, mut r: impl Read) {
        let why = loop {
            match wire::read_frame(&mut r) {
                Ok(Some((h, body))) => self.deliver(peer, h, body),
                Ok(None) => break format!("connection to {} closed", self.peer_name(peer)),
                Err(e) => {
                    let _ = stream.shutdown(Shutdown::Both);
                    break format!("connection to {} broke: {e}", self.peer_name(peer));
                }
            }
        };
        if !self.closing.load(Ordering::Acquire) {
            self.mark_dead(peer, why);
        }
    }

    fn deliver(&self, src: usize, h: Header, body: Body) {
        let mut st = self.lock();
        match (h.kind, body) {
            (Kind::Abort, Body::Error(e)) => {
                let key = (h.key, h.seq);
                if !st.discarded.contains(&key) {
                    let b = st.calls.entry(key).or_default();
                    if b.abort.is_none() {
                        b.abort = Some((src, e));
                    }
                }
            }
            (kind, Body::Data(data)) => {
                let msg = Msg {
                    collective: h.collective,
                    params: h.params,
                    dtype: h.dtype,
                    shape: h.shape,
                    data,
                };
                if kind == Kind::PointToPoint {
                    st.p2p.entry((src, h.key)).or_default().push_back(msg);
                } else {
                    let key = (h.key, h.seq);
                    if !st.discarded.contains(&key) {
                        st.calls
                            .entry(key)
                            .or_default()
                            .msgs
                            .push((src, h.step, msg));
                    }
                }
            }
            // An abort frame always decodes to an error and a data frame to data.
            (_, Body::Error(_)) => {}
        }
        drop(st);
        self.cv.notify_all();
    }

    /// Writes one frame to `dest`; a failure marks the connection dead.
    fn write(&self, dest: usize, h: &Header, payload: &[u8]) -> Result<(), String> {
        if let Some(why) = &self.lock().dead[dest] {
            return Err(why.clone());
        }
        let Some(Some(w)) = self.writers.get(dest) else {
            return Err(format!("no connection to rank {dest}"));
        };
        let mut s = w.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = s.frame(h, payload) {
            // A partly written frame leaves the stream unusable.
            let _ = s.stream().shutdown(Shutdown::Both);
            drop(s);
            let why = format!("sending to {} failed: {e}", self.peer_name(dest));
            self.mark_dead(dest, why.clone());
            return Err(why);
        }
        Ok(())
    }

    /// Sends elements `range` of `data` to member `dest` as message `step` of the call.
    pub(super) fn send(
        &self,
        call: &Call,
        dest: usize,
        step: u32,
        data: &Data,
        range: Range<usize>,
    ) -> Result<(), CommError> {
        let h = Header {
            kind: Kind::Collective,
            key: call.key,
            seq: call.seq,
            step,
            collective: call.collective,
            params: call.params.clone(),
            dtype: call.dtype,
            shape: call.shape.clone(),
            elems: range.len() as u64,
        };
        let bytes = wire::data_bytes(data, range);
        self.write(dest, &h, &bytes)
            .map_err(|reason| self.transport(call, reason))
    }

    /// Tells every other member of the call (best effort) that it failed with `err`.
    pub(super) fn abort(&self, call: &Call, err: &CommError) {
        let e = to_wire(err);
        let payload = wire::encode_error(&e);
        let h = Header {
            kind: Kind::Abort,
            key: call.key,
            seq: call.seq,
            step: 0,
            collective: call.collective,
            params: call.params.clone(),
            dtype: call.dtype,
            shape: Vec::new(),
            elems: payload.len() as u64,
        };
        for &r in call.group {
            if r != self.rank {
                let _ = self.write(r, &h, &payload);
            }
        }
    }

    /// Forgets the call's mailbox; after an error, its late messages are dropped.
    pub(super) fn finish(&self, call: &Call, ok: bool) {
        let mut st = self.lock();
        let key = (call.key, call.seq);
        st.calls.remove(&key);
        if !ok {
            st.discarded.insert(key);
        }
    }

    fn transport(&self, call: &Call, reason: String) -> CommError {
        CommError::Transport {
            collective: call.collective,
            group: call.group.to_vec(),
            rank: self.rank,
            reason,
        }
    }

    /// Waits for message `step` of the call from each rank of `srcs` (in that order).
    /// Fails at once on another member's abort, on a message of a different collective at
    /// this position of the group's sequence, or when a source's connection is gone; and
    /// at the deadline, naming the sources still missing.
    pub(super) fn wait(
        &self,
        call: &Call,
        srcs: &[usize],
        step: u32,
    ) -> Result<Vec<Msg>, CommError> {
        let mut got: Vec<Option<Msg>> = srcs.iter().map(|_| None).collect();
        let key = (call.key, call.seq);
        let mut st = self.lock();
        loop {
            if let Some(b) = st.calls.get_mut(&key) {
                if let Some((_, e)) = &b.abort {
                    return Err(from_wire(e, call));
                }
                if let Some((src, _, m)) = b
                    .msgs
                    .iter()
                    .find(|(_, _, m)| m.collective != call.collective || m.params != call.params)
                {
                    return Err(CommError::Mismatch {
                        collective: call.collective,
                        group: call.group.to_vec(),
                        rank: self.rank,
                        reason: format!(
                            "call #{} on this group: rank {} called {}({}) but rank {} called {}({})",
                            call.seq,
                            self.rank,
                            call.collective,
                            call.params,
                            src,
                            m.collective,
                            m.params
                        ),
                    });
                }
                for (slot, &src) in got.iter_mut().zip(srcs) {
                    if slot.is_none() {
                        if let Some(pos) =
                            b.msgs.iter().position(|(s, t, _)| *s == src && *t == step)
                        {
                            *slot = Some(b.msgs.swap_remove(pos).2);
                        }
                    }
                }
            }
            if got.iter().all(Option::is_some) {
                return Ok(got.into_iter().flatten().collect());
            }
            for (slot, &src) in got.iter().zip(srcs) {
                if slot.is_none() {
                    if let Some(why) = &st.dead[src] {
                        return Err(self.transport(call, why.clone()));
                    }
                }
            }
            let now = Instant::now();
            if now >= call.deadline {
                return Err(CommError::Timeout {
                    collective: call.collective,
                    group: call.group.to_vec(),
                    rank: self.rank,
                    missing: got
                        .iter()
                        .zip(srcs)
                        .filter(|(g, _)| g.is_none())
                        .map(|(_, &s)| s)
                        .collect(),
                    timeout: self.timeout,
                });
            }
            st = self
                .cv
                .wait_timeout(st, call.deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Sends a tensor to `dest` under `tag` (to this rank: straight into its mailbox).
    pub(super) fn send_p2p(
        &self,
        dest: usize,
        tag: i64,
        dtype: DType,
        shape: &[usize],
        data: &Data,
    ) -> Result<(), String> {
        if dest == self.rank {
            let msg = Msg {
                collective: Collective::Send,
                params: String::new(),
                dtype,
                shape: shape.to_vec(),
                data: data.clone(),
            };
            self.lock()
                .p2p
                .entry((dest, tag as u64))
                .or_default()
                .push_back(msg);
            self.cv.notify_all();
            return Ok(());
        }
        let h = Header::p2p(tag, dtype, shape, data.len());
        self.write(dest, &h, &wire::data_bytes(data, 0..data.len()))
    }

    /// The next message from `src` under `tag`. `Err(None)`: the deadline passed;
    /// `Err(Some(reason))`: the connection to `src` is gone.
    pub(super) fn recv_p2p(
        &self,
        src: usize,
        tag: i64,
        deadline: Instant,
    ) -> Result<Msg, Option<String>> {
        let key = (src, tag as u64);
        let mut st = self.lock();
        loop {
            if let Some(m) = st.p2p.get_mut(&key).and_then(VecDeque::pop_front) {
                return Ok(m);
            }
            if let Some(why) = &st.dead[src] {
                return Err(Some(why.clone()));
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(None);
            }
            st = self
                .cv
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Closes every connection: the peers see them close; the reader threads end.
    pub(super) fn close(&self) {
        self.closing.store(true, Ordering::Release);
        for w in self.writers.iter().flatten() {
            let s = w.lock().unwrap_or_else(|e| e.into_inner());
            let _ = s.stream().shutdown(Shutdown::Both);
        }
    }
}

fn accept_loop(listener: TcpListener, ctx: AcceptCtx, stop: &AtomicBool) {
    while !stop.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((s, addr)) => {
                if s.set_nonblocking(false).is_err() {
                    continue;
                }
                let c = ctx.clone();
                let spawned = thread::Builder::new()
                    .name(format!("shardc-tcp-handshake-{}", ctx.rank))
                    .spawn(move || accept_one(c, s, addr));
                if let Err(e) = spawned {
                    log_refusal(ctx.rank, addr, &format!("no thread for the handshake: {e}"));
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                thread::sleep(Duration::from_millis(2));
            }
            Err(e) => {
                eprintln!(
                    "shardc: data plane of rank {}: accept failed: {e}",
                    ctx.rank
                );
                thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// The wire form of an error.
fn to_wire(e: &CommError) -> WireError {
    let (kind, rank, reason, missing, timeout) = match e {
        CommError::InvalidGroup { rank, reason, .. } => {
            (0, *rank, reason.clone(), vec![], Duration::ZERO)
        }
        CommError::InvalidArgument { rank, reason, .. } => {
            (1, *rank, reason.clone(), vec![], Duration::ZERO)
        }
        CommError::Mismatch { rank, reason, .. } => {
            (2, *rank, reason.clone(), vec![], Duration::ZERO)
        }
        CommError::Transport { rank, reason, .. } => {
            (3, *rank, reason.clone(), vec![], Duration::ZERO)
        }
        CommError::Timeout {
            rank,
            missing,
            timeout,
            ..
        } => (4, *rank, String::new(), missing.clone(), *timeout),
    };
    WireError {
        kind,
        rank,
        reason,
        missing,
        timeout,
    }
}

/// The error another member reported, as this member's error of the call.
fn from_wire(e: &WireError, call: &Call) -> CommError {
    let (collective, group, rank, reason) = (
        call.collective,
        call.group.to_vec(),
        e.rank,
        e.reason.clone(),
    );
    match e.kind {
        0 => CommError::InvalidGroup {
            collective,
            group,
            rank,
            reason,
        },
        1 => CommError::InvalidArgument {
            collective,
            group,
            rank,
            reason,
        },
        2 => CommError::Mismatch {
            collective,
            group,
            rank,
            reason,
        },
        4 => CommError::Timeout {
            collective,
            group,
            rank,
            missing: e.missing.clone(),
            timeout: e.timeout,
        },
        _ => CommError::Transport {
            collective,
            group,
            rank,
            reason,
        },
    }
}
