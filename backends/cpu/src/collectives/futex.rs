//! Waiting on a word of shared memory: a short spin, a few yields, then a futex sleep
//! ([`WaitPolicy`]: no spin and longer yielding when the ranks on the host outnumber its
//! cores, so that a waiter hands its core to the rank it waits for).
//!
//! The futex calls use the shared (not `FUTEX_PRIVATE_FLAG`) variants, so a process can sleep
//! on a word of a mapping that another process changes and wakes. Each wait pairs a *word*
//! (a counter the signalling side increments) with a *sleepers* count, so the signalling side
//! makes the wake-up system call only when someone sleeps.

use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
use std::time::{Duration, Instant};

/// How a waiter passes the time before it sleeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitPolicy {
    /// How long it spins before yielding.
    pub spin: Duration,
    /// How long it yields its core (at least a few times) before it sleeps.
    pub yielding: Duration,
}

impl WaitPolicy {
    /// For `ranks` processes on a host with `cores` cores. With a core each, a short spin
    /// answers fastest (a futex wake-up costs tens of microseconds). With more ranks than
    /// cores, a spinning waiter holds the core the rank it waits for needs: it yields at
    /// once, for up to 200 µs (as Open MPI yields when it finds itself oversubscribed), and
    /// only then sleeps.
    pub fn for_host(ranks: usize, cores: usize) -> WaitPolicy {
        if ranks > cores.max(1) {
            WaitPolicy {
                spin: Duration::ZERO,
                yielding: Duration::from_micros(200),
            }
        } else {
            WaitPolicy {
                spin: Duration::from_micros(15),
                yielding: Duration::ZERO,
            }
        }
    }
}

/// Checks of the condition before a spinning waiter first reads the clock.
const QUICK_SPINS: u32 = 128;
/// The fewest yields before a sleep, whatever the policy's yielding time.
const MIN_YIELDS: u32 = 4;
/// The longest single futex sleep (the condition is checked again after each).
const MAX_SLEEP: Duration = Duration::from_millis(50);

/// Sleeps while `word` holds `expected`, at most `timeout` (spurious returns are fine).
fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `word` is a valid, aligned u32 that outlives the call; FUTEX_WAIT only reads it.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

/// Wakes every process sleeping on `word`.
fn futex_wake(word: &AtomicU32) {
    // SAFETY: `word` is a valid, aligned u32; FUTEX_WAKE does not access its value.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

/// Announces a change the waiters of `word` check for: increments `word`, and wakes the
/// sleepers if there are any. Whatever was stored before this call is visible to a waiter
/// whose condition then holds.
pub(crate) fn signal(word: &AtomicU32, sleepers: &AtomicU32) {
    word.fetch_add(1, SeqCst);
    if sleepers.load(SeqCst) != 0 {
        futex_wake(word);
    }
}

/// Waits until `cond` holds, at most `timeout`, as `policy` says; returns whether it holds.
/// `cond` must become true only after a [`signal`] on (`word`, `sleepers`) by the side that
/// makes it true.
pub(crate) fn wait_until(
    word: &AtomicU32,
    sleepers: &AtomicU32,
    timeout: Duration,
    policy: WaitPolicy,
    mut cond: impl FnMut() -> bool,
) -> bool {
    if cond() {
        return true;
    }
    if !policy.spin.is_zero() {
        // Most waits between ranks with a core each end within a few hundred cycles: check
        // before reading the clock.
        for _ in 0..QUICK_SPINS {
            std::hint::spin_loop();
            if cond() {
                return true;
            }
        }
    }
    let start = Instant::now();
    while !policy.spin.is_zero() {
        for _ in 0..64 {
            if cond() {
                return true;
            }
            std::hint::spin_loop();
        }
        if start.elapsed() >= policy.spin {
            break;
        }
    }
    let yielded = Instant::now();
    let mut yields = 0u32;
    while yields < MIN_YIELDS || yielded.elapsed() < policy.yielding {
        std::thread::yield_now();
        yields += 1;
        if cond() {
            return true;
        }
    }
    loop {
        let elapsed = start.elapsed();
        if elapsed >= timeout {
            return cond();
        }
        sleepers.fetch_add(1, SeqCst);
        let seen = word.load(SeqCst);
        if cond() {
            sleepers.fetch_sub(1, SeqCst);
            return true;
        }
        futex_wait(word, seen, (timeout - elapsed).min(MAX_SLEEP));
        sleepers.fetch_sub(1, SeqCst);
        if cond() {
            return true;
        }
    }
}
