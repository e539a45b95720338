//! The HCCL transport: a shared-memory segment per communicator, between threads and between
//! processes.
//!
//! The segment (`/dev/shm/shardc-hccl-emu-<pid>-<nanos>-<counter>`, named from the root info
//! token) holds a header, one block per rank (arrival, pid, a step counter, a "left" flag and
//! the descriptor of its current collective call), one data slot per rank for collectives and
//! one channel per ordered pair of ranks for send / receive. Every wait on a peer is bounded:
//! a peer whose process is gone (`kill(pid, 0)` fails), or which left or failed, ends the wait
//! at once naming it; otherwise `HCCL_EXEC_TIMEOUT` seconds (default 1800) bound it.
//!
//! Collectives: each call first publishes its descriptor (op, dtype, count, root, reduce op,
//! sequence number) and passes a barrier; every rank compares every descriptor, so a call that
//! disagrees fails on every member instead of hanging. Data then moves in chunks through the
//! slots, two barriers a chunk (written, then read). Reductions combine in rank order, so every
//! rank gets the same bits, equal to a member-order sum on the host.

use crate::diag::{EmuError, EmuResult, ErrorKind};
use crate::{bail, emu_err};
use std::ffi::CString;
use std::sync::atomic::{AtomicU64, Ordering::*};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Bytes of each rank's collective slot.
pub const SLOT: usize = 1 << 20;
/// Bytes of each send / receive channel's slot.
pub const PSLOT: usize = 256 << 10;
/// How long a cycle of ranks each waiting to send to the next must make no progress before
/// it is reported as a deadlock.
const STUCK: Duration = Duration::from_secs(2);
const MAGIC: u64 = 0x5348_4443_484d_5531; // "SHDCHMU1"
const HEADER: usize = 4096;
const RANK_BLOCK: usize = 256;
const CHAN_HEAD: usize = 128;
/// Prefix of the segments' file names under /dev/shm.
pub const PREFIX: &str = "shardc-hccl-emu-";

/// Longest wait for a peer's step: `HCCL_EXEC_TIMEOUT` seconds (default 1800).
pub fn exec_timeout() -> Duration {
    env_secs("HCCL_EXEC_TIMEOUT", 1800)
}

/// Longest wait for all ranks to arrive: `HCCL_CONNECT_TIMEOUT` seconds (default 120).
pub fn connect_timeout() -> Duration {
    env_secs("HCCL_CONNECT_TIMEOUT", 120)
}

fn env_secs(name: &str, default: u64) -> Duration {
    let v = std::env::var(name)
        .ok()
        .and_then(|s| s.trim().parse::<f64>().ok());
    match v {
        Some(s) if s > 0.0 => Duration::from_secs_f64(s),
        _ => Duration::from_secs(default),
    }
}

/// Makes a fresh rendezvous token: a segment name unique to this process and moment.
pub fn new_token() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    format!(
        "{PREFIX}{}-{nanos}-{}",
        std::process::id(),
        N.fetch_add(1, Relaxed)
    )
}

/// What a collective call is, as every member posts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Desc {
    /// Operation code ([`op_name`]).
    pub op: u64,
    /// HcclDataType.
    pub dtype: u64,
    /// Element count as the op defines it.
    pub count: u64,
    /// Root rank (or u64::MAX when none).
    pub root: u64,
    /// HcclReduceOp (or u64::MAX when none).
    pub reduce: u64,
    /// The communicator's collective sequence number.
    pub seq: u64,
}

/// Operation codes of [`Desc::op`].
pub mod op {
    /// AllReduce.
    pub const ALL_REDUCE: u64 = 1;
    /// AllGather.
    pub const ALL_GATHER: u64 = 2;
    /// ReduceScatter.
    pub const REDUCE_SCATTER: u64 = 3;
    /// Broadcast.
    pub const BROADCAST: u64 = 4;
    /// AlltoAll.
    pub const ALL_TO_ALL: u64 = 5;
    /// Reduce.
    pub const REDUCE: u64 = 6;
    /// Barrier.
    pub const BARRIER: u64 = 7;
    /// Scatter.
    pub const SCATTER: u64 = 8;
    /// Send / receive (pair channels).
    pub const SEND_RECV: u64 = 9;
}

/// Name of an operation code.
pub fn op_name(op: u64) -> &'static str {
    match op {
        op::ALL_REDUCE => "HcclAllReduce",
        op::ALL_GATHER => "HcclAllGather",
        op::REDUCE_SCATTER => "HcclReduceScatter",
        op::BROADCAST => "HcclBroadcast",
        op::ALL_TO_ALL => "HcclAlltoAll",
        op::REDUCE => "HcclReduce",
        op::BARRIER => "HcclBarrier",
        op::SCATTER => "HcclScatter",
        op::SEND_RECV => "HcclSend/HcclRecv",
        _ => "an unknown call",
    }
}

fn show(d: &Desc) -> String {
    let opt = |v: u64| {
        if v == u64::MAX {
            "-".to_string()
        } else {
            v.to_string()
        }
    };
    format!(
        "{}(dtype {}, count {}, root {}, reduce op {}, call #{})",
        op_name(d.op),
        d.dtype,
        d.count,
        opt(d.root),
        opt(d.reduce),
        d.seq
    )
}

/// One rank's mapping of a communicator's segment.
pub struct Segment {
    base: *mut u8,
    size: usize,
    /// Number of ranks.
    pub n: usize,
    /// This rank.
    pub rank: usize,
    /// File name of the segment (under /dev/shm).
    pub name: String,
    state: Mutex<Local>,
}

// SAFETY: the mapping is shared memory accessed through atomics and through slots whose
// ownership the step protocol hands over; the pointer itself may move between threads.
unsafe impl Send for Segment {}
// SAFETY: see above; the local state is behind a mutex.
unsafe impl Sync for Segment {}

struct Local {
    seq: u64,
    sent: Vec<u64>,
    received: Vec<u64>,
    failed: Option<EmuError>,
}

fn seg_size(n: usize) -> usize {
    HEADER + n * RANK_BLOCK + n * SLOT + n * n * (CHAN_HEAD + PSLOT)
}

// Header words.
const H_MAGIC: usize = 0;
const H_NRANKS: usize = 1;
const H_MAPPED: usize = 2;
// Rank block words.
const R_ARRIVED: usize = 0;
const R_PID: usize = 1;
const R_STEP: usize = 2;
const R_LEFT: usize = 3;
const R_DESC: usize = 4; // 6 words
/// 0, or 1 + the peer this rank waits to send to (for deadlock detection).
const R_BLOCKED: usize = 12;
// Channel words.
const C_POSTED: usize = 0;
const C_CONSUMED: usize = 1;
const C_ERROR: usize = 2;
const C_DESC: usize = 3; // 3 words: seq, dtype, count

fn pid_alive(pid: u64) -> bool {
    if pid == 0 {
        return true;
    }
    // SAFETY: kill with signal 0 only checks for the process.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    if r != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
        return false;
    }
    // A killed child that its parent has not reaped yet is a zombie: as good as dead.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(st) => !st
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => true,
    }
}

/// Removes segments left by jobs that died before all their ranks mapped them: files older than
/// the connect timeout plus a minute (no live rendezvous can still need them).
fn sweep_stale() {
    let Ok(rd) = std::fs::read_dir("/dev/shm") else {
        return;
    };
    let max = connect_timeout() + Duration::from_secs(60);
    for e in rd.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        if !name.starts_with(PREFIX) {
            continue;
        }
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > max);
        if old {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

impl Segment {
    fn word(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off + 8 <= self.size && off % 8 == 0);
        // SAFETY: in bounds of the mapping, 8-aligned (the mapping is page-aligned and every
        // offset is a multiple of 8), and only accessed atomically.
        unsafe { &*(self.base.add(off) as *const AtomicU64) }
    }
    fn hdr(&self, w: usize) -> &AtomicU64 {
        self.word(w * 8)
    }
    fn rk(&self, r: usize, w: usize) -> &AtomicU64 {
        self.word(HEADER + r * RANK_BLOCK + w * 8)
    }
    fn slot(&self, r: usize) -> *mut u8 {
        // SAFETY: within the mapping.
        unsafe { self.base.add(HEADER + self.n * RANK_BLOCK + r * SLOT) }
    }
    fn chan_off(&self, src: usize, dst: usize) -> usize {
        HEADER + self.n * RANK_BLOCK + self.n * SLOT + (src * self.n + dst) * (CHAN_HEAD + PSLOT)
    }
    fn ch(&self, src: usize, dst: usize, w: usize) -> &AtomicU64 {
        self.word(self.chan_off(src, dst) + w * 8)
    }
    fn chan_data(&self, src: usize, dst: usize) -> *mut u8 {
        // SAFETY: within the mapping.
        unsafe { self.base.add(self.chan_off(src, dst) + CHAN_HEAD) }
    }

    /// Opens (creating if needed) the segment `name` for `n` ranks as rank `rank`, registers
    /// this process, and waits for every rank (bounded by `HCCL_CONNECT_TIMEOUT`).
    pub fn join(api: &str, name: &str, n: usize, rank: usize) -> EmuResult<Segment> {
        if n == 0 || n > 4096 || rank >= n {
            bail!(
                InvalidParam,
                "{api}: rank {rank} of {n} ranks is out of range"
            );
        }
        if !name.starts_with(PREFIX) || name.contains('/') || name.len() > 200 {
            bail!(
                InvalidParam,
                "{api}: the root info does not hold an emulator token (made by HcclGetRootInfo?)"
            );
        }
        sweep_stale();
        let path = format!("/dev/shm/{name}");
        let cpath =
            CString::new(path.clone()).map_err(|_| emu_err!(InvalidParam, "{api}: bad token"))?;
        let size = seg_size(n);
        // SAFETY: plain system calls on a path we own; results checked.
        let base = unsafe {
            let fd = libc::open(
                cpath.as_ptr(),
                libc::O_CREAT | libc::O_RDWR | libc::O_CLOEXEC,
                0o600,
            );
            if fd < 0 {
                bail!(
                    Internal,
                    "{api}: cannot open {path}: {}",
                    std::io::Error::last_os_error()
                );
            }
            let mut st: libc::stat = std::mem::zeroed();
            if libc::fstat(fd, &mut st) != 0
                || ((st.st_size as usize) < size && libc::ftruncate(fd, size as libc::off_t) != 0)
            {
                let e = std::io::Error::last_os_error();
                libc::close(fd);
                bail!(Internal, "{api}: cannot size {path}: {e}");
            }
            let p = libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            );
            libc::close(fd);
            if p == libc::MAP_FAILED {
                bail!(
                    Internal,
                    "{api}: cannot map {path}: {}",
                    std::io::Error::last_os_error()
                );
            }
            p as *mut u8
        };
        let seg = Segment {
            base,
            size,
            n,
            rank,
            name: name.to_string(),
            state: Mutex::new(Local {
                seq: 0,
                sent: vec![0; n],
                received: vec![0; n],
                failed: None,
            }),
        };
        let _ = seg.hdr(H_MAGIC).compare_exchange(0, MAGIC, AcqRel, Acquire);
        if seg.hdr(H_MAGIC).load(Acquire) != MAGIC {
            bail!(Internal, "{api}: {path} is not an emulator segment");
        }
        if let Err(other) = seg
            .hdr(H_NRANKS)
            .compare_exchange(0, n as u64, AcqRel, Acquire)
        {
            if other != n as u64 {
                bail!(
                    InvalidParam,
                    "{api}: rank {rank} says the communicator has {n} ranks, another rank said {other}"
                );
            }
        }
        if seg
            .rk(rank, R_ARRIVED)
            .compare_exchange(0, 1, AcqRel, Acquire)
            .is_err()
        {
            bail!(
                InvalidParam,
                "{api}: rank {rank} of this root info was already initialised (two members with one rank)"
            );
        }
        seg.rk(rank, R_PID)
            .store(std::process::id() as u64, Release);
        if seg.hdr(H_MAPPED).fetch_add(1, AcqRel) + 1 == n as u64 {
            // Every rank has mapped it: the name is no longer needed, and nothing is left
            // behind if the job dies.
            let _ = std::fs::remove_file(&path);
        }
        let deadline = Instant::now() + connect_timeout();
        let mut spins = 0u32;
        loop {
            let missing: Vec<usize> = (0..n)
                .filter(|&r| seg.rk(r, R_ARRIVED).load(Acquire) == 0)
                .collect();
            if missing.is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                seg.rk(rank, R_LEFT).store(2, Release);
                let _ = std::fs::remove_file(&path);
                bail!(
                    Timeout,
                    "{api}: rank {rank}: ranks {missing:?} of {n} did not arrive within HCCL_CONNECT_TIMEOUT={}s",
                    connect_timeout().as_secs_f64()
                );
            }
            backoff(&mut spins);
        }
        Ok(seg)
    }

    /// Marks this rank as gone (HcclCommDestroy): peers waiting for it fail at once.
    pub fn leave(&self) {
        let _ = self
            .rk(self.rank, R_LEFT)
            .compare_exchange(0, 1, AcqRel, Acquire);
    }

    /// The error of this rank's failed call, if one failed (HcclGetCommAsyncError).
    pub fn failure(&self) -> Option<EmuError> {
        self.local().failed.clone()
    }

    fn local(&self) -> std::sync::MutexGuard<'_, Local> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until `ready()` holds, failing if a rank in `peers` dies, leaves or fails, or the
    /// exec timeout passes (naming the ranks `lagging()` returns).
    fn wait(
        &self,
        api: &str,
        what: &str,
        mut ready: impl FnMut() -> bool,
        lagging: impl Fn() -> Vec<usize>,
        mut stuck: impl FnMut() -> Option<(String, String)>,
    ) -> EmuResult<()> {
        // The cycle (with its channels' counters) first seen, and when.
        let mut first_stuck: Option<(String, Instant)> = None;
        let start = Instant::now();
        let limit = exec_timeout();
        let mut spins = 0u32;
        let mut last_check = Instant::now();
        loop {
            if ready() {
                return Ok(());
            }
            let timed = last_check.elapsed() > Duration::from_millis(20);
            if timed || spins < 2 {
                last_check = Instant::now();
                // A wait cycle that makes no progress for STUCK is a deadlock.
                if timed {
                    match stuck() {
                        Some((sig, msg)) => match &first_stuck {
                            Some((s0, t0)) if *s0 == sig => {
                                if t0.elapsed() >= STUCK && !ready() {
                                    bail!(
                                        Mismatch,
                                        "{api}: rank {}: {msg}, during {what}",
                                        self.rank
                                    );
                                }
                            }
                            _ => first_stuck = Some((sig, Instant::now())),
                        },
                        None => first_stuck = None,
                    }
                }
                for r in lagging() {
                    let pid = self.rk(r, R_PID).load(Acquire);
                    // Read once, before the re-check below: a peer may do its part and then
                    // leave (or exit) between two looks, and its step, made before it left,
                    // is visible once its leaving is.
                    let left = self.rk(r, R_LEFT).load(Acquire);
                    let alive = pid_alive(pid);
                    if left == 0 && alive {
                        continue;
                    }
                    if ready() {
                        return Ok(());
                    }
                    if !alive {
                        bail!(
                            RemoteLost,
                            "{api}: rank {}: rank {r} (pid {pid}) is lost: its process is gone, during {what}",
                            self.rank
                        );
                    }
                    if left == 1 {
                        bail!(
                            RemoteLost,
                            "{api}: rank {}: rank {r} destroyed its communicator, during {what}",
                            self.rank
                        );
                    }
                    bail!(
                        RemoteLost,
                        "{api}: rank {}: rank {r} failed an earlier call and left, during {what}",
                        self.rank
                    );
                }
            }
            if start.elapsed() > limit {
                bail!(
                    Timeout,
                    "{api}: rank {}: ranks {:?} did not arrive within HCCL_EXEC_TIMEOUT={}s, during {what}",
                    self.rank,
                    lagging(),
                    limit.as_secs_f64()
                );
            }
            backoff(&mut spins);
        }
    }

    fn fail(&self, l: &mut Local, e: EmuError) -> EmuError {
        self.rk(self.rank, R_LEFT).store(2, Release);
        l.failed = Some(e.clone());
        e
    }

    fn check_usable(&self, api: &str, l: &Local) -> EmuResult<()> {
        if let Some(e) = &l.failed {
            bail!(
                Internal,
                "{api}: rank {}: the communicator failed earlier and cannot be used: {}",
                self.rank,
                e.msg
            );
        }
        Ok(())
    }

    /// Steps all ranks: bump mine, wait for everyone to reach it.
    fn barrier(&self, api: &str, what: &str) -> EmuResult<()> {
        let me = self.rk(self.rank, R_STEP).fetch_add(1, AcqRel) + 1;
        self.wait(
            api,
            what,
            || (0..self.n).all(|r| self.rk(r, R_STEP).load(Acquire) >= me),
            || {
                (0..self.n)
                    .filter(|&r| self.rk(r, R_STEP).load(Acquire) < me)
                    .collect()
            },
            || None,
        )
    }

    /// Runs one collective: checks that every member posts the same descriptor, then for each
    /// of `chunks` chunks lets this rank write its slot (`publish(chunk, slot)`), waits for
    /// all, lets it read every rank's slot (`consume(chunk, slots)`), and waits again.
    pub fn collective(
        &self,
        api: &str,
        mut d: Desc,
        chunks: usize,
        mut publish: impl FnMut(usize, &mut [u8]),
        mut consume: impl FnMut(usize, &[&[u8]]),
    ) -> EmuResult<()> {
        let mut l = self.local();
        self.check_usable(api, &l)?;
        l.seq += 1;
        d.seq = l.seq;
        let r = self.collective_inner(api, d, chunks.max(1), &mut publish, &mut consume);
        r.map_err(|e| self.fail(&mut l, e))
    }

    fn collective_inner(
        &self,
        api: &str,
        d: Desc,
        chunks: usize,
        publish: &mut dyn FnMut(usize, &mut [u8]),
        consume: &mut dyn FnMut(usize, &[&[u8]]),
    ) -> EmuResult<()> {
        let words = [d.op, d.dtype, d.count, d.root, d.reduce, d.seq];
        for (i, w) in words.iter().enumerate() {
            self.rk(self.rank, R_DESC + i).store(*w, Release);
        }
        let what = format!("{} #{}", op_name(d.op), d.seq);
        self.barrier(api, &what)?;
        for r in 0..self.n {
            let got: Vec<u64> = (0..6)
                .map(|i| self.rk(r, R_DESC + i).load(Acquire))
                .collect();
            let theirs = Desc {
                op: got[0],
                dtype: got[1],
                count: got[2],
                root: got[3],
                reduce: got[4],
                seq: got[5],
            };
            if theirs != d {
                bail!(
                    Mismatch,
                    "{api}: rank {} calls {} but rank {r} calls {}: the members' calls disagree",
                    self.rank,
                    show(&d),
                    show(&theirs)
                );
            }
        }
        for c in 0..chunks {
            {
                // SAFETY: between the previous "read" barrier and the next "written" barrier
                // only this rank touches its slot.
                let mine = unsafe { std::slice::from_raw_parts_mut(self.slot(self.rank), SLOT) };
                publish(c, mine);
            }
            self.barrier(api, &what)?;
            {
                // SAFETY: between the "written" and the "read" barriers no rank writes a slot.
                let all: Vec<&[u8]> = (0..self.n)
                    .map(|r| unsafe { std::slice::from_raw_parts(self.slot(r) as *const u8, SLOT) })
                    .collect();
                consume(c, &all);
            }
            self.barrier(api, &what)?;
        }
        Ok(())
    }

    /// Sends `data` (`count` elements of HcclDataType `dtype`) to rank `peer`.
    pub fn send(
        &self,
        api: &str,
        peer: usize,
        dtype: u64,
        count: u64,
        data: &[u8],
    ) -> EmuResult<()> {
        // The lock is not held during the transfer: a batch sends and receives at once.
        let seq = {
            let mut l = self.local();
            self.check_usable(api, &l)?;
            let s = l
                .sent
                .get_mut(peer)
                .ok_or_else(|| emu_err!(InvalidParam, "{api}: peer {peer}"))?;
            *s += 1;
            *s
        };
        let r = self.send_inner(api, peer, [seq, dtype, count], data);
        r.map_err(|e| self.fail(&mut self.local(), e))
    }

    /// When this rank waits to send and the ranks it waits for each wait to send to the next,
    /// back to this rank, no one receives: returns a signature of the cycle (its ranks and
    /// their channels' counters, to tell a stuck cycle from a passing one) and a message.
    fn send_cycle(&self) -> Option<(String, String)> {
        let mut path = vec![self.rank];
        let mut cur = self.rank;
        for _ in 0..self.n {
            let b = self.rk(cur, R_BLOCKED).load(Acquire);
            if b == 0 {
                return None;
            }
            let next = (b - 1) as usize;
            if next >= self.n {
                return None;
            }
            if next == self.rank {
                let mut sig = String::new();
                for w in path.windows(2).chain(std::iter::once(&[cur, next][..])) {
                    let (a, b) = (w[0], w[1]);
                    sig += &format!(
                        "{a}>{b}:{}/{} ",
                        self.ch(a, b, C_POSTED).load(Acquire),
                        self.ch(a, b, C_CONSUMED).load(Acquire)
                    );
                }
                let ring: Vec<String> = path
                    .iter()
                    .chain(std::iter::once(&next))
                    .map(|r| r.to_string())
                    .collect();
                let msg = format!(
                    "deadlock: ranks {} each wait to send to the next and none receives (a message larger than one {} KiB chunk is not buffered; exchange with HcclBatchSendRecv)",
                    ring.join(" → "),
                    PSLOT >> 10
                );
                return Some((sig, msg));
            }
            if path.contains(&next) {
                return None;
            }
            path.push(next);
            cur = next;
        }
        None
    }

    fn send_inner(&self, api: &str, peer: usize, desc: [u64; 3], data: &[u8]) -> EmuResult<()> {
        let (me, n) = (self.rank, self.n);
        if peer >= n || peer == me {
            bail!(InvalidParam, "{api}: rank {me} sends to rank {peer} of {n}");
        }
        let what = format!("HcclSend #{} to rank {peer}", desc[0]);
        let free = |s: &Self| {
            s.ch(me, peer, C_CONSUMED).load(Acquire) >= s.ch(me, peer, C_POSTED).load(Acquire)
        };
        // The descriptor travels with the first chunk, so a message of one chunk is buffered:
        // the sender does not wait for the receiver (later chunks wait for the slot).
        let chunks = data.len().div_ceil(PSLOT).max(1);
        for step in 0..chunks {
            self.rk(me, R_BLOCKED).store(peer as u64 + 1, Release);
            let r = self.wait(
                api,
                &what,
                || free(self),
                || if free(self) { vec![] } else { vec![peer] },
                || self.send_cycle(),
            );
            self.rk(me, R_BLOCKED).store(0, Release);
            r?;
            if self.ch(me, peer, C_ERROR).load(Acquire) != 0 {
                bail!(
                    Mismatch,
                    "{api}: rank {me}: rank {peer} refused {what} (its HcclRecv disagrees; see its message)"
                );
            }
            if step == 0 {
                for (i, w) in desc.iter().enumerate() {
                    self.ch(me, peer, C_DESC + i).store(*w, Release);
                }
            }
            let part = &data[(step * PSLOT).min(data.len())..((step + 1) * PSLOT).min(data.len())];
            // SAFETY: the slot is free (consumed == posted) and only the sender writes it.
            unsafe {
                std::ptr::copy_nonoverlapping(part.as_ptr(), self.chan_data(me, peer), part.len())
            };
            self.ch(me, peer, C_POSTED).fetch_add(1, AcqRel);
        }
        Ok(())
    }

    /// Receives `count` elements of `dtype` from rank `peer` into `out`.
    pub fn recv(
        &self,
        api: &str,
        peer: usize,
        dtype: u64,
        count: u64,
        out: &mut [u8],
    ) -> EmuResult<()> {
        let seq = {
            let mut l = self.local();
            self.check_usable(api, &l)?;
            let s = l
                .received
                .get_mut(peer)
                .ok_or_else(|| emu_err!(InvalidParam, "{api}: peer {peer}"))?;
            *s += 1;
            *s
        };
        let r = self.recv_inner(api, peer, [seq, dtype, count], out);
        r.map_err(|e| self.fail(&mut self.local(), e))
    }

    fn recv_inner(&self, api: &str, peer: usize, desc: [u64; 3], out: &mut [u8]) -> EmuResult<()> {
        let (me, n) = (self.rank, self.n);
        if peer >= n || peer == me {
            bail!(
                InvalidParam,
                "{api}: rank {me} receives from rank {peer} of {n}"
            );
        }
        let what = format!("HcclRecv #{} from rank {peer}", desc[0]);
        let posted = |s: &Self| {
            s.ch(peer, me, C_POSTED).load(Acquire) > s.ch(peer, me, C_CONSUMED).load(Acquire)
        };
        let total = out.len();
        let chunks = total.div_ceil(PSLOT).max(1);
        for step in 0..chunks {
            self.wait(
                api,
                &what,
                || posted(self),
                || if posted(self) { vec![] } else { vec![peer] },
                || None,
            )?;
            if step == 0 {
                let got: Vec<u64> = (0..3)
                    .map(|i| self.ch(peer, me, C_DESC + i).load(Acquire))
                    .collect();
                if got != desc {
                    self.ch(peer, me, C_ERROR).store(1, Release);
                    self.ch(peer, me, C_CONSUMED).fetch_add(1, AcqRel);
                    bail!(
                        Mismatch,
                        "{api}: rank {me} receives message #{} of {} elements of HcclDataType {} from rank {peer}, but rank {peer} sent message #{} of {} elements of HcclDataType {}",
                        desc[0],
                        desc[2],
                        desc[1],
                        got[0],
                        got[2],
                        got[1]
                    );
                }
            }
            let part = &mut out[(step * PSLOT).min(total)..((step + 1) * PSLOT).min(total)];
            let len = part.len();
            // SAFETY: the sender posted this chunk and will not touch the slot until we bump
            // `consumed`.
            unsafe {
                std::ptr::copy_nonoverlapping(self.chan_data(peer, me), part.as_mut_ptr(), len)
            };
            self.ch(peer, me, C_CONSUMED).fetch_add(1, AcqRel);
        }
        Ok(())
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        self.leave();
        // SAFETY: unmapping our own mapping; no reference into it outlives `self`.
        unsafe {
            libc::munmap(self.base as *mut libc::c_void, self.size);
        }
    }
}

fn backoff(spins: &mut u32) {
    *spins += 1;
    if *spins < 64 {
        std::hint::spin_loop();
    } else if *spins < 256 {
        std::thread::yield_now();
    } else {
        std::thread::sleep(Duration::from_micros(if *spins < 2048 { 50 } else { 500 }));
    }
}

/// Kind of a transport error, for mapping to HcclResult.
pub fn kind(e: &EmuError) -> ErrorKind {
    e.kind
}
