//! Where the ranks of a host run: the core a thread is on, and moving off a core that the
//! scheduler made two waiting ranks share.
//!
//! With a core per rank, members of a collective spin briefly instead of sleeping (see
//! [`WaitPolicy`](super::WaitPolicy)). The scheduler sometimes starts two ranks on the
//! same core and, since each yields while it waits, never sees a reason to separate them: each
//! call then costs context switches instead of a few hundred cycles (measured: about 40 µs per
//! 4 KiB AllReduce between two processes, where it takes 0.6 µs on separate cores). Open MPI
//! avoids this by binding every rank to a core for good, which in turn leaves a rank stuck
//! behind any other busy process on its core. shardc does neither: a waiter that finds the
//! rank it waits for last ran on its own core moves itself to a core no local rank uses (by
//! restricting its affinity to that core, which migrates it at once, and then restoring the
//! full mask, so the scheduler stays free to move it again later).
//!
//! When the ranks of a host outnumber its cores, no core is free to move to, and the
//! scheduler's own placement is uneven: measured with 8 thread ranks on 2 cores, each doing
//! a fixed ~30 µs of work and then a one-element AllReduce, a round took 130 to 200 µs from
//! run to run (the ideal is 4 × 30 = 120 µs), because a core sometimes ran 5 or 6 of the ranks
//! and the other 2 or 3. There every rank settles on a home core instead, local rank `i` on
//! the `i mod cores`-th allowed core ([`CoreMoves::settle`], at every call, a thread-local
//! check once done): each core runs an equal share of the ranks, and the same round takes
//! 128-131 µs in every run (a fixed 7.5 µs over the ideal at 8 ranks, 3.6 µs at 4).
//!
//! Both the shared-memory collectives between processes and the in-process world of threads
//! use this (Linux calls: `sched_getcpu`, `sched_setaffinity`).

use std::cell::Cell;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A core number no core has.
pub const NO_CPU: u32 = u32::MAX;

/// The fewest time between two moves of one communicator's thread: if the scheduler keeps
/// putting the ranks together (other work on the host), moving every call would cost more
/// than sharing.
const MIN_MOVE_INTERVAL: Duration = Duration::from_millis(2);

/// The core the calling thread runs on ([`NO_CPU`] where the system cannot tell).
pub fn current_cpu() -> u32 {
    // SAFETY: no arguments; glibc answers from the rseq area or with a system call.
    let cpu = unsafe { libc::sched_getcpu() };
    u32::try_from(cpu).unwrap_or(NO_CPU)
}

/// The calling thread's affinity mask, if the system tells.
fn affinity() -> Option<libc::cpu_set_t> {
    // SAFETY: an all-zero cpu_set_t is a valid, empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid, writable cpu_set_t of the size passed; pid 0 is the calling
    // thread.
    let ok = unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) } == 0;
    ok.then_some(set)
}

/// The cores in `set`, ascending.
fn cores_of(set: &libc::cpu_set_t) -> Vec<u32> {
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: `c` is below CPU_SETSIZE.
        .filter(|&c| unsafe { libc::CPU_ISSET(c, set) })
        .map(|c| c as u32)
        .collect()
}

/// Sets the calling thread's affinity mask; returns whether the system accepted it.
fn set_affinity(set: &libc::cpu_set_t) -> bool {
    // SAFETY: a valid set of the size passed; pid 0 is the calling thread.
    unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(set), set) == 0 }
}

/// The cores the calling thread may run on, ascending (empty if the system does not tell).
pub fn allowed_cores() -> Vec<u32> {
    affinity().as_ref().map(cores_of).unwrap_or_default()
}

/// Restricts the calling thread to `cores` (ids at or above `CPU_SETSIZE` are ignored): the
/// kernel migrates it at once if it runs elsewhere. Returns whether the system accepted it.
pub fn restrict_to(cores: &[u32]) -> bool {
    // SAFETY: an all-zero cpu_set_t is a valid, empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cores
        .iter()
        .filter(|&&c| (c as usize) < libc::CPU_SETSIZE as usize)
    {
        // SAFETY: `c` is below CPU_SETSIZE.
        unsafe { libc::CPU_SET(c as usize, &mut set) };
    }
    set_affinity(&set)
}

thread_local! {
    /// The home core the calling thread settled on ([`NO_CPU`]: none).
    static SETTLED_ON: Cell<u32> = const { Cell::new(NO_CPU) };
}

/// The cores a thread may run on (its affinity mask when the communicator was made), and
/// when it last moved; or, when the local ranks outnumber those cores, the one core the
/// rank's threads stay on.
#[derive(Debug)]
pub struct CoreMoves {
    /// The allowed cores, ascending.
    allowed: Vec<u32>,
    /// How many of them the ranks may use (at least 1).
    cores: usize,
    /// With more local ranks than allowed cores: the rank's home core (see
    /// [`CoreMoves::settle`]); it then never moves.
    home: Option<u32>,
    /// The ranks on this host.
    local_ranks: usize,
    /// The mask to restore after a move.
    mask: Option<libc::cpu_set_t>,
    epoch: Instant,
    /// Nanoseconds after `epoch` of the last move (`u64::MAX`: never moved).
    last_move: AtomicU64,
    /// Moves made.
    moves: AtomicU64,
}

impl CoreMoves {
    /// For local rank `local_rank` of `local_ranks` ranks on this host: reads the calling
    /// thread's affinity mask; when the ranks outnumber its [`CoreMoves::cores`], the rank's
    /// home core is the `local_rank mod cores`-th allowed core, else it has none and moves
    /// when it must.
    pub fn for_rank(local_rank: usize, local_ranks: usize) -> CoreMoves {
        let mask = affinity();
        let allowed = mask.as_ref().map(cores_of).unwrap_or_default();
        // The affinity mask, cut to what the process may use (a container's CPU quota, as
        // `available_parallelism` reads it).
        let cores = std::thread::available_parallelism()
            .map_or(allowed.len(), |n| n.get().min(allowed.len()))
            .max(1);
        let home =
            (!allowed.is_empty() && local_ranks > cores).then(|| allowed[local_rank % cores]);
        CoreMoves {
            allowed,
            cores,
            home,
            local_ranks,
            mask,
            epoch: Instant::now(),
            last_move: AtomicU64::new(u64::MAX),
            moves: AtomicU64::new(0),
        }
    }

    /// How many times the thread moved.
    pub fn count(&self) -> u64 {
        self.moves.load(Ordering::Relaxed)
    }

    /// The rank's home core, when the local ranks outnumber the cores.
    pub fn home(&self) -> Option<u32> {
        self.home
    }

    /// The cores this host's ranks may use: the affinity mask's, at most the process's CPU
    /// quota, at least 1. The one count every decision about sharing cores reads (home cores,
    /// [`CoreMoves::spare_core`], and the waiters' [`WaitPolicy`](super::WaitPolicy)).
    pub fn cores(&self) -> usize {
        self.cores
    }

    /// Whether the host has a core beyond one per local rank (where a rank's collectives can
    /// run beside its compute instead of taking turns with it).
    pub fn spare_core(&self) -> bool {
        self.cores > self.local_ranks
    }

    /// Call at the start of every collective: with a home core, restricts the calling thread
    /// to it the first time this thread comes here (a thread-local check afterwards). The
    /// binding lasts for the thread's life, as `mpirun --bind-to core` binds a process: a
    /// rank's main and communication threads both stay on its core. Without a home core,
    /// nothing.
    pub fn settle(&self) {
        let Some(home) = self.home else {
            return;
        };
        if SETTLED_ON.with(Cell::get) != home && restrict_to(&[home]) {
            SETTLED_ON.with(|s| s.set(home));
        }
    }

    /// A waiter's side of it all: publishes the calling thread's core in `own` (written only
    /// when it changed, so that readers' copies stay valid); if `peer_here(core)` says a rank
    /// it waits for last ran on that core, moves off it ([`CoreMoves::move_off`], away from
    /// the cores in `others`, announcing the target in `own`). Returns whether the waiter
    /// still shares its core: it should then yield rather than spin.
    pub fn still_shared(
        &self,
        own: &AtomicU32,
        peer_here: impl FnOnce(u32) -> bool,
        others: impl Iterator<Item = u32> + Clone,
    ) -> bool {
        let cpu = current_cpu();
        if own.load(Ordering::Relaxed) != cpu {
            own.store(cpu, Ordering::Relaxed);
        }
        if cpu == NO_CPU || !peer_here(cpu) {
            return false;
        }
        match self.move_off(cpu, others, |target| own.store(target, Ordering::SeqCst)) {
            Some(now) => {
                own.store(now, Ordering::Relaxed);
                false
            }
            None => {
                own.store(cpu, Ordering::Relaxed);
                true
            }
        }
    }

    /// Moves the calling thread from core `here` to an allowed core that no core in `taken`
    /// is (the cores the other local ranks last ran on), unless it moved within
    /// `MIN_MOVE_INTERVAL`; returns the core it now runs on, or `None` if it stayed.
    ///
    /// `announce(target)` runs before the move: the peer left behind on `here` runs as soon
    /// as this thread leaves, and must already see that it is alone there (otherwise it too
    /// finds the two on one core and follows this thread to `target`).
    pub fn move_off(
        &self,
        here: u32,
        taken: impl Iterator<Item = u32> + Clone,
        announce: impl FnOnce(u32),
    ) -> Option<u32> {
        if self.home.is_some() {
            return None;
        }
        let mask = self.mask.as_ref()?;
        let now = self.epoch.elapsed().as_nanos() as u64;
        let last = self.last_move.load(Ordering::Relaxed);
        if last != u64::MAX && now.saturating_sub(last) < MIN_MOVE_INTERVAL.as_nanos() as u64 {
            return None;
        }
        let target = *self
            .allowed
            .iter()
            .find(|&&c| c != here && !taken.clone().any(|t| t == c))?;
        self.last_move.store(now, Ordering::Relaxed);
        announce(target);
        let moved = restrict_to(&[target]);
        // Restore the full mask whatever happened: the move is a nudge, not a binding.
        set_affinity(mask);
        if moved {
            self.moves.fetch_add(1, Ordering::Relaxed);
        }
        moved.then(current_cpu)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_moves_off_a_taken_core_and_keeps_its_mask() {
        let moves = CoreMoves::for_rank(0, 1);
        if moves.allowed.len() < 2 {
            eprintln!("skipped: fewer than two cores allowed");
            return;
        }
        let here = current_cpu();
        let mut announced = None;
        let before = Instant::now();
        let now = moves.move_off(here, std::iter::once(here), |t| announced = Some(t));
        // Where the thread runs once the mask is whole again is the scheduler's choice (a
        // busy host may move it straight back): the move itself is what is checked.
        assert!(now.is_some(), "a second core is free");
        let target = announced.expect("the target was announced");
        assert_ne!(target, here);
        assert!(moves.allowed.contains(&target));
        assert_eq!(moves.count(), 1);
        // The mask is whole again.
        assert_eq!(allowed_cores(), moves.allowed);
        // Within the interval it stays put (checked only if this thread got here within it:
        // a loaded host may deschedule it for longer).
        let again = moves.move_off(target, std::iter::once(target), |_| ());
        if before.elapsed() < MIN_MOVE_INTERVAL {
            assert_eq!(again, None);
            assert_eq!(moves.count(), 1);
        }
    }

    #[test]
    fn no_move_when_every_other_core_is_taken() {
        let moves = CoreMoves::for_rank(0, 1);
        let here = current_cpu();
        let all = moves.allowed.clone();
        assert_eq!(moves.move_off(here, all.iter().copied(), |_| ()), None);
    }

    #[test]
    fn oversubscribed_ranks_have_home_cores_in_turn_and_never_move() {
        let allowed = allowed_cores();
        let n = CoreMoves::for_rank(0, 1).cores();
        if allowed.is_empty() {
            eprintln!("skipped: the system does not tell which cores are allowed");
            return;
        }
        // A core per rank: no home.
        assert_eq!(CoreMoves::for_rank(0, n).home(), None);
        // Three ranks per core: local rank i on the (i mod n)-th core.
        for i in 0..3 * n {
            let moves = CoreMoves::for_rank(i, 3 * n);
            assert_eq!(moves.home(), Some(allowed[i % n]), "rank {i}");
            assert_eq!(
                moves.move_off(current_cpu(), std::iter::empty(), |_| ()),
                None
            );
        }
    }
}
