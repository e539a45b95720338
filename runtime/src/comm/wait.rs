//! How a member waiting for the others passes the time: a short spin when every rank has a
//! core, yielding when the ranks outnumber the cores, then a sleep. Shared by the
//! in-process world and the shared-memory collectives.

use std::time::{Duration, Instant};

/// Checks of the condition before a spinning waiter first reads the clock.
const QUICK_SPINS: u32 = 128;
/// The fewest yields before a sleep, whatever the policy's yielding time.
const MIN_YIELDS: u32 = 4;

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

    /// Spins, then yields, as the policy says, until `ready` holds (`true`) or the policy's
    /// time is spent (`false`: the caller then sleeps until it is woken). `peer_here` tells
    /// whether the rank waited for last ran on the waiter's own core: spinning then only
    /// keeps that rank from running, so the waiter stops spinning and yields its core
    /// instead, for at least as long as it would have spun, and two ranks the scheduler put
    /// on one core hand it to each other rather than each spinning out its window.
    pub fn pass_time(
        &self,
        mut ready: impl FnMut() -> bool,
        mut peer_here: impl FnMut() -> bool,
    ) -> bool {
        if ready() {
            return true;
        }
        let mut yielding = self.yielding;
        if !self.spin.is_zero() {
            match self.spin_until(&mut ready, &mut peer_here) {
                Spun::Ready => return true,
                Spun::PeerHere => yielding = yielding.max(self.spin),
                Spun::Spent => {}
            }
        }
        let yielded = Instant::now();
        let mut yields = 0u32;
        while yields < MIN_YIELDS || yielded.elapsed() < yielding {
            std::thread::yield_now();
            yields += 1;
            if ready() {
                return true;
            }
        }
        false
    }

    /// Spins for the policy's spin time until `ready` holds, or until `peer_here` says
    /// spinning is useless.
    fn spin_until(
        &self,
        ready: &mut impl FnMut() -> bool,
        peer_here: &mut impl FnMut() -> bool,
    ) -> Spun {
        if peer_here() {
            return Spun::PeerHere;
        }
        // Most waits between ranks with a core each end within a few hundred cycles:
        // check before reading the clock.
        for _ in 0..QUICK_SPINS {
            std::hint::spin_loop();
            if ready() {
                return Spun::Ready;
            }
        }
        let start = Instant::now();
        while start.elapsed() < self.spin {
            for _ in 0..64 {
                if ready() {
                    return Spun::Ready;
                }
                std::hint::spin_loop();
            }
            if peer_here() {
                return Spun::PeerHere;
            }
        }
        Spun::Spent
    }
}

/// How a spin ended.
enum Spun {
    /// The condition holds.
    Ready,
    /// The rank waited for last ran on this core: spinning only keeps it from running.
    PeerHere,
    /// The spin time is spent.
    Spent,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oversubscribed_hosts_yield_instead_of_spinning() {
        let own_core = WaitPolicy::for_host(2, 2);
        assert!(!own_core.spin.is_zero() && own_core.yielding.is_zero());
        let shared = WaitPolicy::for_host(8, 2);
        assert!(shared.spin.is_zero() && !shared.yielding.is_zero());
        // No core count known: as one core.
        assert_eq!(WaitPolicy::for_host(2, 0), shared);
    }

    #[test]
    fn passing_time_ends_when_ready_or_when_the_policy_is_spent() {
        let mut calls = 0;
        assert!(WaitPolicy::for_host(2, 2).pass_time(
            || {
                calls += 1;
                calls == 50
            },
            || false
        ));
        assert_eq!(calls, 50);
        for policy in [WaitPolicy::for_host(2, 2), WaitPolicy::for_host(8, 2)] {
            let t0 = Instant::now();
            assert!(!policy.pass_time(|| false, || false));
            let spent = t0.elapsed();
            assert!(
                spent >= policy.spin + policy.yielding,
                "{spent:?} for {policy:?}"
            );
        }
    }
}
