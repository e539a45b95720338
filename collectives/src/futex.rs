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

pub(crate) use shardc_runtime::comm::WaitPolicy;

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
/// makes it true. `peer_here` tells whether the process that makes it true last ran on this
/// core (see [`WaitPolicy::pass_time`]).
pub(crate) fn wait_until(
    word: &AtomicU32,
    sleepers: &AtomicU32,
    timeout: Duration,
    policy: WaitPolicy,
    mut cond: impl FnMut() -> bool,
    peer_here: impl FnMut() -> bool,
) -> bool {
    if policy.pass_time(&mut cond, peer_here) {
        return true;
    }
    let start = Instant::now();
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
