//! Collectives between processes of one host through shared memory.
//!
//! # Segments
//! Every rank creates one segment, a file under `/dev/shm` named
//! `shardc-shm-<job>-r<rank>-p<pid>`, and maps the segments of the other ranks of its host
//! (waiting for them up to the timeout). Once every local peer has mapped a segment, its
//! owner unlinks the file, so nothing is left behind however the processes end; a segment
//! left by a process killed during the short setup window is removed by the next
//! [`ShmComm::new`] on the host (its pid is dead).
//!
//! A segment holds a header and four *boxes*: two input boxes and two output boxes used
//! alternately by the rounds of a collective, and by consecutive calls of a group (a call's
//! first step then never waits for the acknowledgements of the previous call's). A box has a tag (which call and step its
//! contents belong to), a futex word incremented at each publication, one acknowledgement
//! counter per reader rank, a description of the call (for mismatch errors) and the data.
//!
//! # Protocol
//! A rank *publishes* into one of its own boxes: it waits until every reader of that box's
//! previous contents has acknowledged them, writes, stores the tag and wakes the sleepers.
//! A reader waits for the tag it expects on a peer's box (spin, yield, then futex sleep),
//! reads, and acknowledges. Tags hash the group, the group's sequence number and the step,
//! so calls on different groups may interleave in any order the ranks agree on. The first
//! step of every call carries the call's description: every member checks every other
//! member's before going on, so a disagreement is reported to every member.
//!
//! # Algorithms
//! Every reduction is applied in member order (`((m0 op m1) op m2) ...`, elementwise), so
//! the results equal the in-process world's bit for bit. AllReduce of a small tensor is
//! *direct* (each member reads every member's copy and reduces); a large one is a pipelined
//! reduce-scatter + all-gather: in each round every member publishes one cache-sized piece
//! per member, member `i` reduces the pieces `i`, publishes the result, and everyone copies
//! the results. ReduceScatter and AllToAll use the same pieces; AllGather and Broadcast
//! stream the tensor in box-sized rounds.

use crate::futex::{signal, wait_until, WaitPolicy};
use crate::wire::{group_hash, native_bytes as bytes, native_bytes_mut as bytes_mut};
use rustc_hash::FxHashMap;
use shardc_ir::{DType, ReduceOp};
use shardc_runtime::comm::arguments::{self, invalid, invalid_if};
use shardc_runtime::comm::tensor_ops::{around, reduce_bytes, reducible, split_packed};
use shardc_runtime::comm::{check_group, Collective, CommError, Communicator};
use shardc_runtime::comm::{CoreMoves, NO_CPU};
use shardc_runtime::{Data, Tensor};
use std::fs::OpenOptions;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Where the segments live.
const SHM_DIR: &str = "/dev/shm";
/// The prefix of every segment's file name.
const PREFIX: &str = "shardc-shm-";
/// Written last when a segment is initialised.
const MAGIC: u64 = 0x5348_4152_4443_534d; // "SHARDCSM"
/// The layout version.
const VERSION: u32 = 2;
/// Data bytes of one box.
pub const BOX_BYTES: usize = 2048 * 1024;
/// AllReduce is direct when (group size - 1) x tensor bytes is at most this.
const DIRECT_LIMIT: usize = 64 * 1024;
/// Bytes of the header page.
const HEADER: usize = 4096;
/// Bytes of the call description in a box.
const META_BYTES: usize = 1024;
/// Boxes per segment: input 0, input 1, output 0, output 1.
const NBOX: usize = 4;

// Header offsets.
const H_MAGIC: usize = 0;
const H_VERSION: usize = 8;
const H_SIZE: usize = 12;
const H_BOX: usize = 16;
const H_MAPPED: usize = 64;
const H_MAPPED_SLEEPERS: usize = 68;
/// The core the rank last ran on when it began to wait (`u32::MAX`: not known), on a cache
/// line of its own.
const H_CPU: usize = 128;

// Box control offsets.
const B_TAG: usize = 0;
const B_READY: usize = 8;
const B_SLEEPERS: usize = 12;
const B_ACK_WORD: usize = 64;
const B_ACK_SLEEPERS: usize = 68;
const B_ACKS: usize = 128;

/// How to set up a [`ShmComm`].
#[derive(Clone, Debug)]
pub struct ShmSetup {
    /// This rank.
    pub rank: usize,
    /// The number of ranks in the world.
    pub size: usize,
    /// The job's id, the same on every rank (names the segments).
    pub job_id: String,
    /// The ranks on this host, this one included (any order).
    pub local_ranks: Vec<usize>,
    /// How long a member waits for the others (and for their segments at setup).
    pub timeout: Duration,
}

/// One mapped segment.
struct Segment {
    base: *mut u8,
    len: usize,
    /// Bytes of a box's control part (before its data).
    ctrl: usize,
    /// Data bytes of a box.
    box_bytes: usize,
}

// SAFETY: the mapping is plain shared memory; all concurrent access goes through atomics or
// through the publish / acknowledge protocol that keeps readers and the writer apart.
unsafe impl Send for Segment {}
// SAFETY: as above.
unsafe impl Sync for Segment {}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` come from a successful mmap and are unmapped once.
        unsafe {
            libc::munmap(self.base.cast(), self.len);
        }
    }
}

/// `(control bytes per box, total bytes)` of a segment for a world of `size` ranks.
fn layout(size: usize, box_bytes: usize) -> (usize, usize) {
    let meta = (B_ACKS + 8 * size).div_ceil(64) * 64;
    let ctrl = (meta + META_BYTES).div_ceil(4096) * 4096;
    (ctrl, HEADER + NBOX * (ctrl + box_bytes))
}

impl Segment {
    fn u32_at(&self, off: usize) -> &AtomicU32 {
        debug_assert!(off + 4 <= self.len && off % 4 == 0);
        // SAFETY: in bounds, aligned, and only ever accessed atomically.
        unsafe { &*(self.base.add(off) as *const AtomicU32) }
    }

    fn u64_at(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off + 8 <= self.len && off % 8 == 0);
        // SAFETY: in bounds, aligned, and only ever accessed atomically.
        unsafe { &*(self.base.add(off) as *const AtomicU64) }
    }

    fn box_off(&self, b: usize) -> usize {
        HEADER + b * (self.ctrl + self.box_bytes)
    }

    fn tag(&self, b: usize) -> &AtomicU64 {
        self.u64_at(self.box_off(b) + B_TAG)
    }

    fn ready(&self, b: usize) -> (&AtomicU32, &AtomicU32) {
        let o = self.box_off(b);
        (self.u32_at(o + B_READY), self.u32_at(o + B_SLEEPERS))
    }

    fn ack_word(&self, b: usize) -> (&AtomicU32, &AtomicU32) {
        let o = self.box_off(b);
        (self.u32_at(o + B_ACK_WORD), self.u32_at(o + B_ACK_SLEEPERS))
    }

    /// The tag of box `b`'s contents that `rank` last finished reading.
    fn ack(&self, b: usize, rank: usize) -> &AtomicU64 {
        self.u64_at(self.box_off(b) + B_ACKS + 8 * rank)
    }

    /// The core the segment's rank last ran on when it began to wait.
    fn cpu(&self) -> u32 {
        self.u32_at(H_CPU).load(Ordering::Relaxed)
    }

    fn meta_ptr(&self, b: usize) -> *mut u8 {
        // SAFETY: the description lies inside the box's control part.
        unsafe { self.base.add(self.box_off(b) + self.ctrl - META_BYTES) }
    }

    fn data_ptr(&self, b: usize) -> *mut u8 {
        // SAFETY: the data lies inside the mapping.
        unsafe { self.base.add(self.box_off(b) + self.ctrl) }
    }
}

/// Maps `len` bytes of an open file, shared.
fn map(file: &std::fs::File, len: usize) -> std::io::Result<*mut u8> {
    // SAFETY: a fresh shared mapping of a file we hold open; checked for failure.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    Ok(p.cast())
}

/// The job id as it appears in file names: letters, digits and `_` only, at most 64.
fn sanitize(job: &str) -> String {
    job.chars()
        .take(64)
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// The file-name prefix of `rank`'s segment in `job` (the pid follows).
fn seg_prefix(job: &str, rank: usize) -> String {
    format!("{PREFIX}{}-r{rank}-p", sanitize(job))
}

/// The pid at the end of a segment's file name.
fn name_pid(name: &str) -> Option<i32> {
    let (_, pid) = name.rsplit_once("-p")?;
    pid.parse().ok()
}

fn pid_alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks for existence.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// Removes the segments of processes that no longer exist.
fn remove_stale_segments() {
    let Ok(dir) = std::fs::read_dir(SHM_DIR) else {
        return;
    };
    for entry in dir.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !name.starts_with(PREFIX) {
            continue;
        }
        if let Some(pid) = name_pid(name) {
            if pid > 0 && !pid_alive(pid) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
}

/// Every segment file of `job` (for tests: none must remain after a job).
pub fn segment_files(job_id: &str) -> Vec<PathBuf> {
    let prefix = format!("{PREFIX}{}-r", sanitize(job_id));
    let Ok(dir) = std::fs::read_dir(SHM_DIR) else {
        return Vec::new();
    };
    dir.flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.starts_with(&prefix))
        })
        .map(|e| e.path())
        .collect()
}

/// The per-rank bookkeeping, behind the communicator's mutex (one call at a time).
struct State {
    /// Per group: the sequence number of the next call.
    seq: FxHashMap<Vec<usize>, u64>,
    /// What the description areas of own input boxes 0 and 1 hold (written by the last
    /// [`ShmComm::begin`] on each that changed it): a call like the one before does not
    /// write it again.
    #[allow(clippy::type_complexity)]
    meta: [Option<(Collective, CallParams, Option<(DType, Vec<usize>)>)>; 2],
    /// Per own box: the readers of its current contents that have not acknowledged them
    /// yet, with the tag they acknowledge.
    pending: Vec<Vec<(usize, u64)>>,
}

/// Collectives through shared memory among the ranks of one host.
pub struct ShmComm {
    rank: usize,
    size: usize,
    timeout: Duration,
    /// How members wait for each other (oversubscribed hosts yield instead of spinning).
    wait: WaitPolicy,
    /// Moves this rank's thread off a core it shares with a local peer; or, with more local
    /// ranks than cores, keeps it on its home core.
    moves: CoreMoves,
    /// Per rank: its segment, for the ranks on this host.
    segs: Vec<Option<Segment>>,
    box_bytes: usize,
    state: Mutex<State>,
}

impl std::fmt::Debug for ShmComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let local: Vec<usize> = (0..self.size).filter(|&r| self.segs[r].is_some()).collect();
        f.debug_struct("ShmComm")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("local_ranks", &local)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// A setup failure (reported as a Barrier over the local ranks).
fn setup_error(setup: &ShmSetup, reason: String) -> CommError {
    CommError::Transport {
        collective: Collective::Barrier,
        group: sorted_local(setup),
        rank: setup.rank,
        reason,
    }
}

fn sorted_local(setup: &ShmSetup) -> Vec<usize> {
    let mut v = setup.local_ranks.clone();
    if !v.contains(&setup.rank) {
        v.push(setup.rank);
    }
    v.sort_unstable();
    v.dedup();
    v
}

/// Creates, sizes and maps this rank's segment; returns it and its path.
fn create_segment(setup: &ShmSetup, box_bytes: usize) -> Result<(Segment, PathBuf), CommError> {
    let (ctrl, len) = layout(setup.size, box_bytes);
    let name = format!(
        "{}{}",
        seg_prefix(&setup.job_id, setup.rank),
        std::process::id()
    );
    let path = Path::new(SHM_DIR).join(name);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .map_err(|e| setup_error(setup, format!("cannot create {}: {e}", path.display())))?;
    let fail = |what: String| {
        let _ = std::fs::remove_file(&path);
        setup_error(setup, what)
    };
    // SAFETY: plain syscall on our open file; reserves the pages so later writes cannot
    // fault with SIGBUS on a full /dev/shm.
    let r = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len as libc::off_t) };
    if r != 0 {
        return Err(fail(format!(
            "cannot reserve {len} bytes for {}: {}",
            path.display(),
            std::io::Error::from_raw_os_error(r)
        )));
    }
    let base = map(&file, len).map_err(|e| fail(format!("cannot map {}: {e}", path.display())))?;
    let seg = Segment {
        base,
        len,
        ctrl,
        box_bytes,
    };
    seg.u32_at(H_VERSION).store(VERSION, Ordering::Relaxed);
    seg.u32_at(H_SIZE)
        .store(setup.size as u32, Ordering::Relaxed);
    seg.u64_at(H_BOX).store(box_bytes as u64, Ordering::Relaxed);
    seg.u32_at(H_CPU).store(NO_CPU, Ordering::Relaxed);
    seg.u64_at(H_MAGIC).store(MAGIC, Ordering::Release);
    Ok((seg, path))
}

/// Tries once to map `rank`'s segment: `Ok(None)` when it is not (fully) there yet.
fn try_open_segment(
    setup: &ShmSetup,
    rank: usize,
    box_bytes: usize,
) -> Result<Option<Segment>, String> {
    let prefix = seg_prefix(&setup.job_id, rank);
    let Ok(dir) = std::fs::read_dir(SHM_DIR) else {
        return Err(format!("cannot list {SHM_DIR}"));
    };
    let (ctrl, len) = layout(setup.size, box_bytes);
    for entry in dir.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(pid) = name.strip_prefix(prefix.as_str()) else {
            continue;
        };
        match pid.parse::<i32>() {
            Ok(pid) if pid_alive(pid) => {}
            _ => continue,
        }
        let Ok(file) = OpenOptions::new().read(true).write(true).open(entry.path()) else {
            continue;
        };
        match file.metadata() {
            Ok(m) if m.len() as usize == len => {}
            Ok(m) if m.len() == 0 => continue,
            Ok(m) => {
                return Err(format!(
                    "the segment {} of rank {rank} has {} bytes, expected {len} \
                     (a different world size or build?)",
                    entry.path().display(),
                    m.len()
                ))
            }
            Err(_) => continue,
        }
        let base = map(&file, len).map_err(|e| format!("cannot map rank {rank}'s segment: {e}"))?;
        let seg = Segment {
            base,
            len,
            ctrl,
            box_bytes,
        };
        if seg.u64_at(H_MAGIC).load(Ordering::Acquire) != MAGIC {
            continue;
        }
        let version = seg.u32_at(H_VERSION).load(Ordering::Relaxed);
        let size = seg.u32_at(H_SIZE).load(Ordering::Relaxed) as usize;
        let bb = seg.u64_at(H_BOX).load(Ordering::Relaxed) as usize;
        if version != VERSION || size != setup.size || bb != box_bytes {
            return Err(format!(
                "rank {rank}'s segment has version {version}, world {size}, box {bb}; \
                 this rank expects {VERSION}, {}, {box_bytes}",
                setup.size
            ));
        }
        return Ok(Some(seg));
    }
    Ok(None)
}

impl ShmComm {
    /// Creates this rank's segment, maps every local peer's (waiting up to the timeout for
    /// them to appear), and unlinks its own file once all local peers have mapped it. Every
    /// local rank must call this at about the same time.
    pub fn new(setup: &ShmSetup) -> Result<ShmComm, CommError> {
        ShmComm::with_box_bytes(setup, BOX_BYTES)
    }

    /// As [`ShmComm::new`] with boxes of `box_bytes` data bytes (every rank must pass the
    /// same; at least 4 KiB).
    pub fn with_box_bytes(setup: &ShmSetup, box_bytes: usize) -> Result<ShmComm, CommError> {
        let local = sorted_local(setup);
        if setup.rank >= setup.size || local.iter().any(|&r| r >= setup.size) {
            return Err(setup_error(
                setup,
                format!(
                    "rank {} or a local rank {:?} is outside the world of {} ranks",
                    setup.rank, setup.local_ranks, setup.size
                ),
            ));
        }
        let box_bytes = box_bytes.max(4096).div_ceil(4096) * 4096;
        remove_stale_segments();
        let (own, path) = create_segment(setup, box_bytes)?;
        let result = ShmComm::connect(setup, &local, own, box_bytes);
        let _ = std::fs::remove_file(&path);
        result
    }

    fn connect(
        setup: &ShmSetup,
        local: &[usize],
        own: Segment,
        box_bytes: usize,
    ) -> Result<ShmComm, CommError> {
        let start = Instant::now();
        let mut segs: Vec<Option<Segment>> = (0..setup.size).map(|_| None).collect();
        let mut pending: Vec<usize> = local.iter().copied().filter(|&r| r != setup.rank).collect();
        while !pending.is_empty() {
            let mut still = Vec::new();
            for &r in &pending {
                match try_open_segment(setup, r, box_bytes).map_err(|e| setup_error(setup, e))? {
                    Some(seg) => {
                        let (w, s) = (seg.u32_at(H_MAPPED), seg.u32_at(H_MAPPED_SLEEPERS));
                        signal(w, s);
                        segs[r] = Some(seg);
                    }
                    None => still.push(r),
                }
            }
            pending = still;
            if pending.is_empty() {
                break;
            }
            if start.elapsed() >= setup.timeout {
                return Err(CommError::Timeout {
                    collective: Collective::Barrier,
                    group: local.to_vec(),
                    rank: setup.rank,
                    missing: pending,
                    timeout: setup.timeout,
                });
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        // Wait until every local peer has mapped this segment, so it can be unlinked.
        let want = (local.len() - 1) as u32;
        let remaining = setup.timeout.saturating_sub(start.elapsed());
        let (w, s) = (own.u32_at(H_MAPPED), own.u32_at(H_MAPPED_SLEEPERS));
        let moves = CoreMoves::for_rank(
            local.iter().position(|&r| r == setup.rank).unwrap_or(0),
            local.len(),
        );
        let wait = WaitPolicy::for_host(local.len(), moves.cores());
        if !wait_until(
            w,
            s,
            remaining,
            wait,
            || w.load(Ordering::SeqCst) >= want,
            || false,
        ) {
            return Err(setup_error(
                setup,
                format!(
                    "only {} of the {want} other local ranks mapped this rank's segment within {:.3} s",
                    w.load(Ordering::SeqCst),
                    setup.timeout.as_secs_f64()
                ),
            ));
        }
        segs[setup.rank] = Some(own);
        Ok(ShmComm {
            rank: setup.rank,
            size: setup.size,
            timeout: setup.timeout,
            wait,
            moves,
            segs,
            box_bytes,
            state: Mutex::new(State {
                seq: FxHashMap::default(),
                meta: [None, None],
                pending: vec![Vec::new(); NBOX],
            }),
        })
    }

    /// The time a member waits for the others.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// How many times a waiting thread of this rank moved off a core that a local peer had
    /// last run on (see the `cores` module: the scheduler sometimes starts two ranks on one
    /// core and leaves them there).
    pub fn core_moves(&self) -> u64 {
        self.moves.count()
    }

    /// Whether `rank` is on this host (reachable through shared memory).
    pub fn is_local(&self, rank: usize) -> bool {
        self.segs.get(rank).is_some_and(Option::is_some)
    }

    /// Whether every rank of `group` is on this host.
    pub fn covers(&self, group: &[usize]) -> bool {
        group.iter().all(|&r| self.is_local(r))
    }

    fn seg(&self, rank: usize) -> &Segment {
        // Callers only ask for members of a covered group.
        self.segs[rank]
            .as_ref()
            .unwrap_or_else(|| unreachable!("rank {rank} is not on this host"))
    }

    /// Whether one of `peers` last ran on this thread's core, which this thread could not
    /// leave (see [`CoreMoves`]): a waiter then yields instead of spinning.
    fn shares_core(&self, peers: impl Iterator<Item = usize>) -> bool {
        let others = self
            .segs
            .iter()
            .enumerate()
            .filter(|&(r, seg)| r != self.rank && seg.is_some())
            .filter_map(|(_, seg)| seg.as_ref().map(Segment::cpu));
        self.moves.still_shared(
            self.seg(self.rank).u32_at(H_CPU),
            |cpu| peers.into_iter().any(|r| self.seg(r).cpu() == cpu),
            others,
        )
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Checks the group and starts a call: publishes step 0 (the description, and whatever
    /// `fill` writes into input box 0), waits for every member's step 0 and compares the
    /// descriptions.
    fn begin<'a>(
        &'a self,
        collective: Collective,
        group: &'a [usize],
        params: CallParams,
        ty: Option<&Tensor>,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<Call<'a>, CommError> {
        check_group(collective, group, self.rank, self.size)?;
        if let Some(&r) = group.iter().find(|&&r| !self.is_local(r)) {
            return Err(CommError::Transport {
                collective,
                group: group.to_vec(),
                rank: self.rank,
                reason: format!(
                    "rank {r} is on another host: shared memory reaches only this host's ranks"
                ),
            });
        }
        self.moves.settle();
        let me = group.iter().position(|&r| r == self.rank).unwrap_or(0);
        let mut st = self.lock();
        let seq = {
            // The group's key is allocated on its first call only.
            if !st.seq.contains_key(group) {
                st.seq.insert(group.to_vec(), 0);
            }
            let s = st.seq.get_mut(group).map_or(0, |s| {
                *s += 1;
                *s - 1
            });
            s
        };
        let mut call = Call {
            comm: self,
            st,
            collective,
            group,
            me,
            seq,
            ghash: group_hash(group),
        };
        let own = self.seg(self.rank);
        let buf = call.acquire(0)?;
        let b0 = call.phys(0);
        let same = call.st.meta[b0].as_ref().is_some_and(|(c, p, t)| {
            *c == collective
                && *p == params
                && match (t, ty) {
                    (None, None) => true,
                    (Some((d, shape)), Some(x)) => *d == x.dtype() && shape[..] == x.shape[..],
                    _ => false,
                }
        });
        if !same {
            let tt = ty.map(Tensor::ty);
            let text: &dyn std::fmt::Display = match &tt {
                Some(t) => t,
                None => &"",
            };
            write_meta(
                own.meta_ptr(b0),
                &format_args!("{collective}({params})"),
                text,
            );
            call.st.meta[b0] = Some((collective, params, tt.map(|t| (t.dtype, t.shape))));
        }
        fill(buf);
        call.commit(0, 0);
        if let Err(e) = call.wait_all(0, 0) {
            // Release the members that did arrive: they are done with this call too.
            for k in 0..call.n() {
                if k != call.me && call.published(k, 0, 0) {
                    let _ = call.ack(k, 0, 0);
                }
            }
            return Err(e);
        }
        if let Some(e) = call.check_meta() {
            let _ = call.ack_all(0, 0);
            return Err(e);
        }
        Ok(call)
    }
}

/// The parameters of a call, as its description shows them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CallParams {
    None,
    Op(ReduceOp),
    OpAxis(ReduceOp, usize),
    Axis(usize),
    Root(usize),
    SplitConcat(usize, usize),
}

impl std::fmt::Display for CallParams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallParams::None => Ok(()),
            CallParams::Op(op) => write!(f, "op={op}"),
            CallParams::OpAxis(op, axis) => write!(f, "op={op}, axis={axis}"),
            CallParams::Axis(axis) => write!(f, "axis={axis}"),
            CallParams::Root(root) => write!(f, "root={root}"),
            CallParams::SplitConcat(s, c) => write!(f, "split_dim={s}, concat_dim={c}"),
        }
    }
}

/// Bytes of a call description before its two strings: the FNV-1a hash of both (whole,
/// before truncation) and the two lengths.
const META_HEAD: usize = 16;

/// Formats into a fixed buffer (the rest is cut) while hashing everything written.
struct MetaWriter<'b> {
    buf: &'b mut [u8],
    len: usize,
    hash: u64,
}

impl std::fmt::Write for MetaWriter<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        for &b in s.as_bytes() {
            self.hash = (self.hash ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
        let mut n = s.len().min(self.buf.len() - self.len);
        while !s.is_char_boundary(n) {
            n -= 1;
        }
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

/// Writes a call description: the call and the operand type, each truncated to fit, and a
/// hash of both that the members compare first (no allocation on the way: this runs on
/// every call, and a 4 KiB AllReduce takes about a microsecond).
fn write_meta(p: *mut u8, call: &dyn std::fmt::Display, ty: &dyn std::fmt::Display) {
    use std::fmt::Write;
    let cap = (META_BYTES - META_HEAD) / 2;
    // SAFETY: the description area of our own box, META_BYTES long; nobody reads it before
    // the tag is published.
    let area = unsafe { std::slice::from_raw_parts_mut(p, META_BYTES) };
    let (head, strings) = area.split_at_mut(META_HEAD);
    let (first, second) = strings.split_at_mut(cap);
    let mut w = MetaWriter {
        buf: first,
        len: 0,
        hash: 0xcbf2_9ce4_8422_2325,
    };
    let _ = write!(w, "{call}\u{0}");
    let (a, hash) = (w.len, w.hash);
    let mut w = MetaWriter {
        buf: &mut second[..cap],
        len: 0,
        hash,
    };
    let _ = write!(w, "{ty}");
    let (b, hash) = (w.len, w.hash);
    // The second string follows the first directly (read_meta expects them adjacent).
    strings.copy_within(cap..cap + b, a);
    head[..8].copy_from_slice(&hash.to_le_bytes());
    head[8..12].copy_from_slice(&(a as u32).to_le_bytes());
    head[12..16].copy_from_slice(&(b as u32).to_le_bytes());
}

/// The hash of a description written by [`write_meta`].
fn meta_hash(p: *const u8) -> u64 {
    let mut h = [0u8; 8];
    // SAFETY: a published description area of META_BYTES, not written until acknowledged.
    unsafe { std::ptr::copy_nonoverlapping(p, h.as_mut_ptr(), 8) };
    u64::from_le_bytes(h)
}

/// Reads a call description written by [`write_meta`].
fn read_meta(p: *const u8) -> (String, String) {
    let cap = (META_BYTES - META_HEAD) / 2;
    // SAFETY: a published description area of META_BYTES, not written until acknowledged.
    unsafe {
        let mut n = [0u8; 4];
        std::ptr::copy_nonoverlapping(p.add(8), n.as_mut_ptr(), 4);
        let a = (u32::from_le_bytes(n) as usize).min(cap);
        std::ptr::copy_nonoverlapping(p.add(12), n.as_mut_ptr(), 4);
        let b = (u32::from_le_bytes(n) as usize).min(cap);
        let s = std::slice::from_raw_parts(p.add(META_HEAD), a + b);
        let call = String::from_utf8_lossy(&s[..a]);
        (
            call.trim_end_matches('\u{0}').to_string(),
            String::from_utf8_lossy(&s[a..]).into_owned(),
        )
    }
}

fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// One collective call in progress on this rank.
struct Call<'a> {
    comm: &'a ShmComm,
    st: MutexGuard<'a, State>,
    collective: Collective,
    group: &'a [usize],
    me: usize,
    seq: u64,
    ghash: u64,
}

impl<'a> Call<'a> {
    fn n(&self) -> usize {
        self.group.len()
    }

    fn tag(&self, step: u64) -> u64 {
        mix(self.ghash ^ mix(self.seq ^ mix(step))) | 1
    }

    /// The physical box of logical box `b`: calls of odd sequence numbers swap the two
    /// input boxes and the two output boxes, so that a call's first step does not wait for
    /// the peers to acknowledge the previous call's (they usually have not yet: a member
    /// acknowledges only after it has reduced).
    fn phys(&self, b: usize) -> usize {
        let flip = (self.seq & 1) as usize;
        (b & !1) | ((b & 1) ^ flip)
    }

    fn timeout(&self, missing: Vec<usize>) -> CommError {
        CommError::Timeout {
            collective: self.collective,
            group: self.group.to_vec(),
            rank: self.comm.rank,
            missing,
            timeout: self.comm.timeout,
        }
    }

    /// Gives up on the acknowledgements of `missing` ranks (after a timeout): should one of
    /// them read a box later, it notices the box changed under it (see [`Call::ack`]).
    fn abandon(&mut self, missing: &[usize]) {
        for p in &mut self.st.pending {
            p.retain(|(r, _)| !missing.contains(r));
        }
    }

    /// Waits until every reader acknowledged own box `b`'s current contents; invalidates its
    /// tag and returns its data for writing.
    fn acquire(&mut self, b: usize) -> Result<&'a mut [u8], CommError> {
        let b = self.phys(b);
        let own = self.comm.seg(self.comm.rank);
        let pending = &self.st.pending[b];
        let done = || {
            pending
                .iter()
                .all(|&(r, t)| own.ack(b, r).load(Ordering::Acquire) == t)
        };
        let (w, s) = own.ack_word(b);
        let here = || self.comm.shares_core(pending.iter().map(|&(r, _)| r));
        if !wait_until(w, s, self.comm.timeout, self.comm.wait, done, here) {
            let missing: Vec<usize> = pending
                .iter()
                .filter(|&&(r, t)| own.ack(b, r).load(Ordering::Acquire) != t)
                .map(|&(r, _)| r)
                .collect();
            self.abandon(&missing);
            return Err(self.timeout(missing));
        }
        self.st.pending[b].clear();
        // A late reader of the old contents must see them change (seqlock-style).
        own.tag(b).store(0, Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::Release);
        // SAFETY: our own box: every reader of the previous contents has acknowledged them
        // (or was abandoned and re-checks the tag); the mapping lives as long as the
        // communicator.
        Ok(unsafe { std::slice::from_raw_parts_mut(own.data_ptr(b), own.box_bytes) })
    }

    /// Publishes own box `b` as step `step` of this call.
    fn commit(&mut self, b: usize, step: u64) {
        let b = self.phys(b);
        let own = self.comm.seg(self.comm.rank);
        let tag = self.tag(step);
        for (k, &r) in self.group.iter().enumerate() {
            if k != self.me {
                self.st.pending[b].push((r, tag));
            }
        }
        // Release suffices: `signal`'s read-modify-write on the word is sequentially
        // consistent, so a waiter that then sleeps is seen, and one that reads the word after
        // it sees the tag.
        own.tag(b).store(tag, Ordering::Release);
        let (w, s) = own.ready(b);
        signal(w, s);
    }

    fn published(&self, k: usize, b: usize, step: u64) -> bool {
        self.published_phys(k, self.phys(b), step)
    }

    fn published_phys(&self, k: usize, b: usize, step: u64) -> bool {
        self.comm.seg(self.group[k]).tag(b).load(Ordering::Acquire) == self.tag(step)
    }

    /// Waits for member `k`'s box `b` to hold step `step`; returns its data.
    fn wait(&mut self, k: usize, b: usize, step: u64) -> Result<&'a [u8], CommError> {
        let b = self.phys(b);
        let seg = self.comm.seg(self.group[k]);
        let (w, s) = seg.ready(b);
        let peer = self.group[k];
        let here = || self.comm.shares_core(std::iter::once(peer));
        if !wait_until(
            w,
            s,
            self.comm.timeout,
            self.comm.wait,
            || self.published_phys(k, b, step),
            here,
        ) {
            let missing: Vec<usize> = (0..self.n())
                .filter(|&j| j != self.me && !self.published_phys(j, b, step))
                .map(|j| self.group[j])
                .collect();
            self.abandon(&missing);
            return Err(self.timeout(missing));
        }
        // SAFETY: published data the owner does not change until we acknowledge.
        Ok(unsafe { std::slice::from_raw_parts(seg.data_ptr(b), seg.box_bytes) })
    }

    /// The data of member `k`'s box `b` (own box included), already waited for.
    fn data(&self, k: usize, b: usize) -> &'a [u8] {
        let b = self.phys(b);
        let seg = self.comm.seg(self.group[k]);
        // SAFETY: as in `wait`.
        unsafe { std::slice::from_raw_parts(seg.data_ptr(b), seg.box_bytes) }
    }

    fn wait_all(&mut self, b: usize, step: u64) -> Result<(), CommError> {
        for k in 0..self.n() {
            if k != self.me {
                self.wait(k, b, step)?;
            }
        }
        Ok(())
    }

    /// Acknowledges member `k`'s box `b` (step `step`), which this rank has finished
    /// reading. Fails if the box changed meanwhile: its owner gave up on this rank.
    fn ack(&self, k: usize, b: usize, step: u64) -> Result<(), CommError> {
        let b = self.phys(b);
        let seg = self.comm.seg(self.group[k]);
        std::sync::atomic::fence(Ordering::Acquire);
        let tag = self.tag(step);
        if seg.tag(b).load(Ordering::Relaxed) != tag {
            return Err(CommError::Transport {
                collective: self.collective,
                group: self.group.to_vec(),
                rank: self.comm.rank,
                reason: format!(
                    "rank {} gave up on call #{} of this group (it timed out) while this rank \
                     was reading its data",
                    self.group[k], self.seq
                ),
            });
        }
        seg.ack(b, self.comm.rank).store(tag, Ordering::SeqCst);
        let (w, s) = seg.ack_word(b);
        signal(w, s);
        Ok(())
    }

    fn ack_all(&self, b: usize, step: u64) -> Result<(), CommError> {
        for k in 0..self.n() {
            if k != self.me {
                self.ack(k, b, step)?;
            }
        }
        Ok(())
    }

    /// The first disagreement between member 0's description and another's.
    fn check_meta(&self) -> Option<CommError> {
        let b = self.phys(0);
        let own = meta_hash(self.comm.seg(self.comm.rank).meta_ptr(b));
        if (0..self.n()).all(|k| meta_hash(self.comm.seg(self.group[k]).meta_ptr(b)) == own) {
            return None;
        }
        let metas: Vec<(String, String)> = (0..self.n())
            .map(|k| read_meta(self.comm.seg(self.group[k]).meta_ptr(b)))
            .collect();
        let g = self.group;
        let mismatch = |reason: String| CommError::Mismatch {
            collective: self.collective,
            group: g.to_vec(),
            rank: self.comm.rank,
            reason,
        };
        if let Some(k) = (1..self.n()).find(|&k| metas[k].0 != metas[0].0) {
            return Some(mismatch(format!(
                "call #{} on this group: rank {} called {} but rank {} called {}",
                self.seq, g[k], metas[k].0, g[0], metas[0].0
            )));
        }
        if let Some(k) = (1..self.n()).find(|&k| metas[k].1 != metas[0].1) {
            return Some(mismatch(format!(
                "rank {} passed {} but rank {} passed {}",
                g[k], metas[k].1, g[0], metas[0].1
            )));
        }
        // Same text, different hashes: one description was cut short.
        Some(mismatch(format!(
            "call #{} on this group: the members' calls differ beyond the first {} bytes of \
             their descriptions",
            self.seq,
            (META_BYTES - META_HEAD) / 2
        )))
    }
}

/// Input box of round `r`, and its step.
fn in_box(r: usize) -> (usize, u64) {
    (r % 2, 2 * r as u64)
}

/// Output box of round `r`, and its step.
fn out_box(r: usize) -> (usize, u64) {
    (2 + r % 2, 2 * r as u64 + 1)
}

/// Elements per piece when a box holds `n` pieces.
fn piece_elems(box_bytes: usize, n: usize, es: usize) -> usize {
    let c = box_bytes / (n * es);
    if c >= 16 {
        c / 16 * 16
    } else {
        c.max(1)
    }
}

/// The element range of part `j`'s piece in round `r`.
fn piece_range(bounds: &[usize], j: usize, r: usize, pc: usize) -> (usize, usize) {
    let a = (bounds[j] + r * pc).min(bounds[j + 1]);
    let b = (a + pc).min(bounds[j + 1]);
    (a, b)
}

/// Rounds needed for parts delimited by `bounds` in pieces of `pc`.
fn piece_rounds(bounds: &[usize], pc: usize) -> usize {
    let longest = bounds.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
    longest.div_ceil(pc).max(1)
}

/// Bytes of a tensor that a collective reads while it writes other ranges of it.
#[derive(Clone, Copy)]
struct Src {
    ptr: *const u8,
    len: usize,
}

impl Src {
    fn new(b: &[u8]) -> Src {
        Src {
            ptr: b.as_ptr(),
            len: b.len(),
        }
    }

    /// Bytes `a..b`. The caller never writes them while the slice lives.
    fn get(&self, a: usize, b: usize) -> &[u8] {
        assert!(a <= b && b <= self.len);
        // SAFETY: in bounds (checked); the algorithms only write ranges already read.
        unsafe { std::slice::from_raw_parts(self.ptr.add(a), b - a) }
    }
}

/// Copies every part's piece of round `r` from `src` into a box.
fn fill_pieces(buf: &mut [u8], src: Src, bounds: &[usize], pc: usize, r: usize, es: usize) {
    for j in 0..bounds.len() - 1 {
        let (a, b) = piece_range(bounds, j, r, pc);
        buf[j * pc * es..(j * pc + b - a) * es].copy_from_slice(src.get(a * es, b * es));
    }
}

/// The bytes of `src` (shape `shape`, elements of `es` bytes) rearranged so that its `n`
/// parts along `axis` are contiguous, part after part.
fn split_parts(src: &[u8], shape: &[usize], axis: usize, n: usize, es: usize) -> Vec<u8> {
    let (outer, dim, inner) = around(shape, axis);
    split_packed(src, (outer, dim, inner * es), n)
}

/// Writes elements `[e0, e0 + len)` of member `k`'s flat tensor (whose `axis` slices are
/// rows of `row` elements) where they go in the concatenation of `n` such tensors.
fn place(out: &mut [u8], data: &[u8], k: usize, n: usize, e0: usize, row: usize, es: usize) {
    let len = data.len() / es;
    let mut e = 0;
    while e < len {
        let g = e0 + e;
        let (o, within) = (g / row, g % row);
        let seg = (row - within).min(len - e);
        let dst = (o * n * row + k * row + within) * es;
        out[dst..dst + seg * es].copy_from_slice(&data[e * es..(e + seg) * es]);
        e += seg;
    }
}

impl ShmComm {
    /// Reduce-scatter rounds over parts-contiguous `src` (part `j` = `bounds[j]..bounds[j+1]`
    /// elements): for each round, the reduced piece of part `me` goes to `sink(call, round,
    /// element range, reduced bytes in own output box)`. Step 0 (round 0) is already
    /// published by `begin`.
    #[allow(clippy::too_many_arguments)]
    fn reduce_pieces(
        &self,
        call: &mut Call<'_>,
        op: ReduceOp,
        dtype: DType,
        src: Src,
        bounds: &[usize],
        pc: usize,
        mut sink: impl FnMut(&mut Call<'_>, usize, (usize, usize), &[u8]) -> Result<(), CommError>,
    ) -> Result<(), CommError> {
        let es = dtype.size_bytes();
        let n = call.n();
        let me = call.me;
        let rounds = piece_rounds(bounds, pc);
        for r in 0..rounds {
            let (ib, istep) = in_box(r);
            if r > 0 {
                let buf = call.acquire(ib)?;
                fill_pieces(buf, src, bounds, pc, r, es);
                call.commit(ib, istep);
            }
            let (a, b) = piece_range(bounds, me, r, pc);
            let m = (b - a) * es;
            let mut srcs: Vec<&[u8]> = Vec::with_capacity(n);
            for k in 0..n {
                if k == me {
                    srcs.push(src.get(a * es, b * es));
                } else {
                    let d = call.wait(k, ib, istep)?;
                    srcs.push(&d[me * pc * es..me * pc * es + m]);
                }
            }
            let (ob, _) = out_box(r);
            let out = call.acquire(ob)?;
            reduce_bytes(dtype, op, &mut out[..m], &srcs);
            drop(srcs);
            call.ack_all(ib, istep)?;
            sink(call, r, (a, b), &out[..m])?;
        }
        Ok(())
    }

    fn all_reduce_impl(
        &self,
        group: &[usize],
        op: ReduceOp,
        t: &mut Tensor,
    ) -> Result<(), CommError> {
        let c = Collective::AllReduce;
        let n = group.len().max(1);
        let dtype = t.dtype();
        let es = dtype.size_bytes();
        let len = t.len();
        let nbytes = len * es;
        let valid = reducible(dtype);
        let direct = nbytes <= self.box_bytes && nbytes * (n - 1) <= DIRECT_LIMIT;
        let bounds: Vec<usize> = if direct {
            Vec::new()
        } else {
            (0..=n)
                .map(|j| ((j as u128 * len as u128) / n as u128) as usize)
                .collect()
        };
        let pc = piece_elems(self.box_bytes, n, es);
        let mut call = self.begin(c, group, CallParams::Op(op), Some(t), |buf| {
            if !valid {
                return;
            }
            let src = bytes(&t.data);
            if direct {
                buf[..nbytes].copy_from_slice(src);
            } else {
                fill_pieces(buf, Src::new(src), &bounds, pc, 0, es);
            }
        })?;
        if !valid {
            let _ = call.ack_all(0, 0);
            return invalid_if(c, group, self.rank, arguments::all_reduce(&t.ty()));
        }
        if direct {
            // Up to 8 members without allocating.
            let mut few: [&[u8]; 8] = [&[]; 8];
            let many: Vec<&[u8]>;
            let srcs: &[&[u8]] = if n <= few.len() {
                for (k, s) in few.iter_mut().enumerate().take(n) {
                    *s = &call.data(k, 0)[..nbytes];
                }
                &few[..n]
            } else {
                many = (0..n).map(|k| &call.data(k, 0)[..nbytes]).collect();
                &many
            };
            reduce_bytes(dtype, op, bytes_mut(&mut t.data), srcs);
            call.ack_all(0, 0)?;
            return Ok(());
        }
        // The tensor is both the source (pieces not yet published) and the destination
        // (pieces already published): a round only writes ranges it has published.
        let base = bytes_mut(&mut t.data).as_mut_ptr();
        let src = Src {
            ptr: base,
            len: nbytes,
        };
        let me = call.me;
        self.reduce_pieces(
            &mut call,
            op,
            dtype,
            src,
            &bounds,
            pc,
            |call, r, (a, _), red| {
                let (ob, ostep) = out_box(r);
                // SAFETY: piece `me` of round `r` was published (and reduced) already.
                unsafe { std::ptr::copy_nonoverlapping(red.as_ptr(), base.add(a * es), red.len()) };
                call.commit(ob, ostep);
                for k in 0..call.n() {
                    if k == me {
                        continue;
                    }
                    let (ka, kb) = piece_range(&bounds, k, r, pc);
                    let d = call.wait(k, ob, ostep)?;
                    // SAFETY: piece `k` of round `r` was published already; `d` is the peer's box.
                    unsafe {
                        std::ptr::copy_nonoverlapping(d.as_ptr(), base.add(ka * es), (kb - ka) * es)
                    };
                    call.ack(k, ob, ostep)?;
                }
                Ok(())
            },
        )
    }

    fn reduce_scatter_impl(
        &self,
        group: &[usize],
        op: ReduceOp,
        axis: usize,
        input: &Tensor,
    ) -> Result<Tensor, CommError> {
        let c = Collective::ReduceScatter;
        let n = group.len().max(1);
        let dtype = input.dtype();
        let es = dtype.size_bytes();
        let len = input.len();
        let error = arguments::reduce_scatter(&input.ty(), axis, n);
        let reordered;
        let src: &[u8] = if error.is_none() && input.shape[..axis].iter().product::<usize>() > 1 {
            reordered = split_parts(bytes(&input.data), &input.shape, axis, n, es);
            &reordered
        } else {
            bytes(&input.data)
        };
        let part = len / n;
        let bounds: Vec<usize> = (0..=n).map(|j| j * part).collect();
        let pc = piece_elems(self.box_bytes, n, es);
        let mut call = self.begin(c, group, CallParams::OpAxis(op, axis), Some(input), |buf| {
            if error.is_none() {
                fill_pieces(buf, Src::new(src), &bounds, pc, 0, es);
            }
        })?;
        if let Some(reason) = error {
            let _ = call.ack_all(0, 0);
            return Err(invalid(c, group, self.rank, reason));
        }
        let mut shape = input.shape.clone();
        shape[axis] /= n;
        let mut out = Data::zeros(dtype, part);
        let ob = bytes_mut(&mut out);
        let lo = bounds[call.me];
        self.reduce_pieces(
            &mut call,
            op,
            dtype,
            Src::new(src),
            &bounds,
            pc,
            |_, _, (a, b), red| {
                ob[(a - lo) * es..(b - lo) * es].copy_from_slice(red);
                Ok(())
            },
        )?;
        Ok(Tensor { shape, data: out })
    }

    fn all_gather_impl(
        &self,
        group: &[usize],
        axis: usize,
        input: &Tensor,
    ) -> Result<Tensor, CommError> {
        let c = Collective::AllGather;
        let n = group.len().max(1);
        let dtype = input.dtype();
        let es = dtype.size_bytes();
        let len = input.len();
        let error = arguments::all_gather(&input.ty(), axis);
        let src = bytes(&input.data);
        let ce = self.box_bytes / es;
        let rounds = len.div_ceil(ce).max(1);
        let first = len.min(ce) * es;
        let mut call = self.begin(c, group, CallParams::Axis(axis), Some(input), |buf| {
            if error.is_none() {
                buf[..first].copy_from_slice(&src[..first]);
            }
        })?;
        if let Some(reason) = error {
            let _ = call.ack_all(0, 0);
            return Err(invalid(c, group, self.rank, reason));
        }
        let (_, dim, inner) = around(&input.shape, axis);
        let row = dim * inner;
        let mut shape = input.shape.clone();
        shape[axis] *= n;
        let mut out = Data::zeros(dtype, len * n);
        let ob = bytes_mut(&mut out);
        let me = call.me;
        if row > 0 {
            place(ob, src, me, n, 0, row, es);
        }
        for r in 0..rounds {
            let (ib, istep) = in_box(r);
            let (e0, e1) = (r * ce, ((r + 1) * ce).min(len));
            if r > 0 {
                let buf = call.acquire(ib)?;
                buf[..(e1 - e0) * es].copy_from_slice(&src[e0 * es..e1 * es]);
                call.commit(ib, istep);
            }
            for k in 0..n {
                if k == me {
                    continue;
                }
                let d = call.wait(k, ib, istep)?;
                if row > 0 {
                    place(ob, &d[..(e1 - e0) * es], k, n, e0, row, es);
                }
                call.ack(k, ib, istep)?;
            }
        }
        Ok(Tensor { shape, data: out })
    }

    fn broadcast_impl(
        &self,
        group: &[usize],
        root: usize,
        t: &mut Tensor,
    ) -> Result<(), CommError> {
        let c = Collective::Broadcast;
        if let Some(reason) = arguments::root_outside(group, root) {
            check_group(c, group, self.rank, self.size)?;
            return invalid_if(c, group, self.rank, Some(reason));
        }
        let ri = group.iter().position(|&r| r == root).unwrap_or(0);
        let dtype = t.dtype();
        let es = dtype.size_bytes();
        let len = t.len();
        let ce = self.box_bytes / es;
        let rounds = len.div_ceil(ce).max(1);
        let is_root = self.rank == root;
        let first = len.min(ce) * es;
        let call = self.begin(c, group, CallParams::Root(root), Some(t), |buf| {
            if is_root {
                buf[..first].copy_from_slice(&bytes(&t.data)[..first]);
            }
        })?;
        let mut call = call;
        let dst = bytes_mut(&mut t.data);
        if !is_root {
            dst[..first].copy_from_slice(&call.data(ri, 0)[..first]);
        }
        call.ack_all(0, 0)?;
        for r in 1..rounds {
            let (ib, istep) = in_box(r);
            let (e0, e1) = (r * ce, ((r + 1) * ce).min(len));
            if is_root {
                let buf = call.acquire(ib)?;
                buf[..(e1 - e0) * es].copy_from_slice(&dst[e0 * es..e1 * es]);
                call.commit(ib, istep);
            } else {
                let d = call.wait(ri, ib, istep)?;
                dst[e0 * es..e1 * es].copy_from_slice(&d[..(e1 - e0) * es]);
                call.ack(ri, ib, istep)?;
            }
        }
        Ok(())
    }

    fn all_to_all_impl(
        &self,
        group: &[usize],
        split_dim: usize,
        concat_dim: usize,
        input: &Tensor,
    ) -> Result<Tensor, CommError> {
        let c = Collective::AllToAll;
        let n = group.len().max(1);
        let dtype = input.dtype();
        let es = dtype.size_bytes();
        let len = input.len();
        let error = arguments::all_to_all(&input.ty(), split_dim, concat_dim, n);
        let reordered;
        let src: &[u8] =
            if error.is_none() && input.shape[..split_dim].iter().product::<usize>() > 1 {
                reordered = split_parts(bytes(&input.data), &input.shape, split_dim, n, es);
                &reordered
            } else {
                bytes(&input.data)
            };
        let part = len / n;
        let bounds: Vec<usize> = (0..=n).map(|j| j * part).collect();
        let pc = piece_elems(self.box_bytes, n, es);
        let mut call = self.begin(
            c,
            group,
            CallParams::SplitConcat(split_dim, concat_dim),
            Some(input),
            |buf| {
                if error.is_none() {
                    fill_pieces(buf, Src::new(src), &bounds, pc, 0, es);
                }
            },
        )?;
        if let Some(reason) = error {
            let _ = call.ack_all(0, 0);
            return Err(invalid(c, group, self.rank, reason));
        }
        let me = call.me;
        // Part `me` of every member, member after member.
        let mut recv = vec![0u8; len * es];
        let rounds = piece_rounds(&bounds, pc);
        for r in 0..rounds {
            let (ib, istep) = in_box(r);
            if r > 0 {
                let buf = call.acquire(ib)?;
                fill_pieces(buf, Src::new(src), &bounds, pc, r, es);
                call.commit(ib, istep);
            }
            let (a, b) = piece_range(&bounds, me, r, pc);
            let off = (a - bounds[me]) * es;
            let m = (b - a) * es;
            for k in 0..n {
                let dst = &mut recv[k * part * es + off..k * part * es + off + m];
                if k == me {
                    dst.copy_from_slice(&src[a * es..b * es]);
                } else {
                    let d = call.wait(k, ib, istep)?;
                    dst.copy_from_slice(&d[me * pc * es..me * pc * es + m]);
                }
            }
            call.ack_all(ib, istep)?;
        }
        let mut part_shape = input.shape.clone();
        part_shape[split_dim] /= n;
        let (_, d, inner) = around(&part_shape, concat_dim);
        let row = d * inner;
        let mut shape = part_shape.clone();
        shape[concat_dim] *= n;
        let mut out = Data::zeros(dtype, len);
        let ob = bytes_mut(&mut out);
        if row > 0 {
            for k in 0..n {
                place(
                    ob,
                    &recv[k * part * es..(k + 1) * part * es],
                    k,
                    n,
                    0,
                    row,
                    es,
                );
            }
        }
        Ok(Tensor { shape, data: out })
    }
}

impl Communicator for ShmComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn all_reduce(
        &self,
        group: &[usize],
        op: ReduceOp,
        tensor: &mut Tensor,
    ) -> Result<(), CommError> {
        self.all_reduce_impl(group, op, tensor)
    }

    fn all_gather(
        &self,
        group: &[usize],
        axis: usize,
        input: &Tensor,
    ) -> Result<Tensor, CommError> {
        self.all_gather_impl(group, axis, input)
    }

    fn reduce_scatter(
        &self,
        group: &[usize],
        op: ReduceOp,
        axis: usize,
        input: &Tensor,
    ) -> Result<Tensor, CommError> {
        self.reduce_scatter_impl(group, op, axis, input)
    }

    fn all_to_all(
        &self,
        group: &[usize],
        split_dim: usize,
        concat_dim: usize,
        input: &Tensor,
    ) -> Result<Tensor, CommError> {
        self.all_to_all_impl(group, split_dim, concat_dim, input)
    }

    fn broadcast(
        &self,
        group: &[usize],
        root: usize,
        tensor: &mut Tensor,
    ) -> Result<(), CommError> {
        self.broadcast_impl(group, root, tensor)
    }

    fn send(&self, dest: usize, _tag: i64, _tensor: &Tensor) -> Result<(), CommError> {
        Err(CommError::Transport {
            collective: Collective::Send,
            group: vec![self.rank, dest],
            rank: self.rank,
            reason: "point-to-point messages go over TCP (ProcessComm), not shared memory".into(),
        })
    }

    fn recv(
        &self,
        src: usize,
        _tag: i64,
        _ty: &shardc_ir::TensorType,
    ) -> Result<Tensor, CommError> {
        Err(CommError::Transport {
            collective: Collective::Receive,
            group: vec![src, self.rank],
            rank: self.rank,
            reason: "point-to-point messages go over TCP (ProcessComm), not shared memory".into(),
        })
    }

    fn overlaps_compute(&self, _group: &[usize]) -> bool {
        self.moves.spare_core()
    }

    fn barrier(&self, group: &[usize]) -> Result<(), CommError> {
        let call = self.begin(Collective::Barrier, group, CallParams::None, None, |_| {})?;
        call.ack_all(0, 0)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_descriptions_hash_alike_only_when_equal_and_read_back_whole() {
        let mut a = vec![0u8; META_BYTES];
        let mut b = vec![0u8; META_BYTES];
        let write = |m: &mut Vec<u8>, call: &str, ty: &str| write_meta(m.as_mut_ptr(), &call, &ty);
        write(&mut a, "AllReduce(op=sum)", "Tensor[Float32](2, 3)");
        write(&mut b, "AllReduce(op=sum)", "Tensor[Float32](2, 3)");
        assert_eq!(meta_hash(a.as_ptr()), meta_hash(b.as_ptr()));
        write(&mut b, "AllReduce(op=max)", "Tensor[Float32](2, 3)");
        assert_ne!(meta_hash(a.as_ptr()), meta_hash(b.as_ptr()));
        // The boundary between the two strings counts.
        write(&mut a, "ab", "c");
        write(&mut b, "a", "bc");
        assert_ne!(meta_hash(a.as_ptr()), meta_hash(b.as_ptr()));
        assert_eq!(read_meta(a.as_ptr()), ("ab".to_string(), "c".to_string()));
        // Too long: cut to fit, the hash still of the whole.
        let long = "x".repeat(2 * META_BYTES);
        write(&mut a, &long, "t");
        let (call, ty) = read_meta(a.as_ptr());
        assert_eq!(
            (call.len(), ty.as_str()),
            ((META_BYTES - META_HEAD) / 2, "t")
        );
        write(&mut b, &format!("{long}y"), "t");
        assert_ne!(meta_hash(a.as_ptr()), meta_hash(b.as_ptr()));
    }

    #[test]
    fn parts_and_placement_are_inverse() {
        // A [2, 4] tensor of bytes split in 2 parts along axis 1.
        let src: Vec<u8> = (0..8).collect();
        let parts = split_parts(&src, &[2, 4], 1, 2, 1);
        assert_eq!(parts, vec![0, 1, 4, 5, 2, 3, 6, 7]);
        let mut out = vec![0u8; 8];
        place(&mut out, &parts[..4], 0, 2, 0, 2, 1);
        place(&mut out, &parts[4..], 1, 2, 0, 2, 1);
        assert_eq!(out, src);
    }

    #[test]
    fn pieces_cover_every_part() {
        let bounds = [0, 5, 10, 16];
        let pc = 4;
        let rounds = piece_rounds(&bounds, pc);
        assert_eq!(rounds, 2);
        let mut seen = [0u32; 16];
        for r in 0..rounds {
            for j in 0..3 {
                let (a, b) = piece_range(&bounds, j, r, pc);
                (a..b).for_each(|e| seen[e] += 1);
            }
        }
        assert!(seen.iter().all(|&s| s == 1));
    }

    #[test]
    fn reductions_follow_member_order() {
        let a = [1.0f32, f32::NAN, 3.0];
        let b = [2.0f32, 0.0, f32::NAN];
        let mut d = Data::F32(vec![0.0; 3]);
        let (ab, bb) = (typed_bytes(&a), typed_bytes(&b));
        reduce_bytes(DType::Float32, ReduceOp::Max, bytes_mut(&mut d), &[ab, bb]);
        let Data::F32(r) = d else { unreachable!() };
        assert_eq!(r[0], 2.0);
        assert!(r[1].is_nan() && r[2].is_nan());
    }

    fn typed_bytes(v: &[f32]) -> &[u8] {
        // SAFETY: test helper over plain f32s.
        unsafe { std::slice::from_raw_parts(v.as_ptr().cast(), std::mem::size_of_val(v)) }
    }

    #[test]
    fn tags_differ_by_group_seq_and_step() {
        let g1 = group_hash(&[0, 1]);
        let g2 = group_hash(&[0, 2]);
        assert_ne!(g1, g2);
        assert_ne!(mix(g1 ^ mix(mix(0))), mix(g1 ^ mix(1 ^ mix(0))));
    }
}
