//! The watchdog of one rank's NCCL communicators.
//!
//! NCCL cannot tell a member that never comes: its kernels wait on the GPU for ever, and so
//! does the host thread that waits for them (a step's end, a staged collective). The CPU's
//! communicators give up after `SHARDC_COMM_TIMEOUT`; NCCL gets the same bound here, as
//! PyTorch's NCCL watchdog gives it. Whatever may wait for NCCL runs *armed*
//! ([`Watchdog::arm`]); a background thread sleeps until the deadline of the outermost
//! arming, and if that arming has not ended by then it aborts every communicator of the rank
//! (`ncclCommAbort`, which ends their kernels, so the waiting thread returns). The waiter then
//! sees [`Armed::fired`] and reports the timeout; the communicators are gone, and every later
//! call fails at once ([`Watchdog::aborted`]).
//!
//! Arming costs a lock and a clock reading: the thread is woken only when it sleeps unarmed.
//! It is started on the first arming and stopped when the watchdog is dropped.
//!
//! [`abort_every_communicator`] aborts every live watchdog's communicators of the process at
//! once: a worker the job aborts calls it before it exits, so that no NCCL kernel is left
//! waiting for a peer that is gone while the process tears down.

use super::library::{CommHandle, NcclLibrary};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

#[derive(Default)]
struct State {
    /// How many armings are open (nested: a step's staged collective).
    depth: usize,
    /// The outermost open arming's deadline.
    deadline: Option<Instant>,
    /// Whether the thread sleeps without a deadline (an arming must wake it).
    idle: bool,
    /// Whether the communicators were aborted.
    fired: bool,
    stop: bool,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    library: Arc<dyn NcclLibrary>,
    /// Every communicator of the rank: what an abort ends.
    handles: Mutex<Vec<CommHandle>>,
}

/// Every watchdog of the process (for [`abort_every_communicator`]).
fn live() -> &'static Mutex<Vec<Weak<Shared>>> {
    static LIVE: OnceLock<Mutex<Vec<Weak<Shared>>>> = OnceLock::new();
    LIVE.get_or_init(|| Mutex::new(Vec::new()))
}

/// Aborts the communicators of every watchdog of the process that has not fired yet (see
/// the module doc); returns how many watchdogs fired.
pub fn abort_every_communicator() -> usize {
    let dogs: Vec<Arc<Shared>> = live()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .filter_map(Weak::upgrade)
        .collect();
    dogs.iter().filter(|d| d.fire()).count()
}

/// [`abort_every_communicator`] on another thread, waiting for it at most `limit` (an abort
/// that blocks must not keep a failing process from exiting); how many watchdogs fired, or
/// None where the aborts had not finished by then.
pub fn abort_every_communicator_within(limit: Duration) -> Option<usize> {
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("nccl-abort".into())
        .spawn(move || {
            let _ = done.send(abort_every_communicator());
        })
        .ok()?;
    finished.recv_timeout(limit).ok()
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Aborts every communicator, once; whether this call did.
    fn fire(&self) -> bool {
        {
            let mut s = self.lock();
            if s.fired {
                return false;
            }
            s.fired = true;
            s.deadline = None;
        }
        let handles = self.handles.lock().unwrap_or_else(|p| p.into_inner());
        for &h in handles.iter() {
            self.library.abort(h);
        }
        true
    }

    /// The thread: sleeps until the outermost arming's deadline, aborts if it is still open.
    fn watch(&self) {
        let mut s = self.lock();
        loop {
            if s.stop {
                return;
            }
            match s.deadline {
                Some(deadline) if !s.fired => {
                    let now = Instant::now();
                    if now >= deadline {
                        drop(s);
                        self.fire();
                        s = self.lock();
                        continue;
                    }
                    s.idle = false;
                    s = self
                        .wake
                        .wait_timeout(s, deadline - now)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
                _ => {
                    s.idle = true;
                    s = self.wake.wait(s).unwrap_or_else(|p| p.into_inner());
                }
            }
        }
    }
}

/// Aborts a rank's NCCL communicators when something armed waits past the timeout (see the
/// module doc).
pub struct Watchdog {
    shared: Arc<Shared>,
    timeout: Duration,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Watchdog {
    /// A watchdog over the communicators [`Watchdog::register`]ed, made by `library`.
    pub fn new(library: Arc<dyn NcclLibrary>, timeout: Duration) -> Watchdog {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
            library,
            handles: Mutex::new(Vec::new()),
        });
        let mut all = live().lock().unwrap_or_else(|p| p.into_inner());
        all.retain(|w| w.strong_count() > 0);
        all.push(Arc::downgrade(&shared));
        drop(all);
        Watchdog {
            shared,
            timeout,
            thread: Mutex::new(None),
        }
    }

    /// The timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Sets the timeout of later armings.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// Adds a communicator to those an abort ends.
    pub fn register(&self, comm: CommHandle) {
        self.shared
            .handles
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(comm);
    }

    /// Whether the communicators were aborted (they must then be neither used nor destroyed).
    pub fn aborted(&self) -> bool {
        self.shared.lock().fired
    }

    /// Starts a wait that may not last past the timeout; nested armings share the
    /// outermost's deadline.
    pub fn arm(&self) -> Armed<'_> {
        let mut s = self.shared.lock();
        let before = s.fired;
        s.depth += 1;
        if s.depth == 1 {
            s.deadline = Some(Instant::now() + self.timeout);
            if s.idle {
                s.idle = false;
                self.shared.wake.notify_one();
            }
        }
        drop(s);
        self.start();
        Armed { dog: self, before }
    }

    fn start(&self) {
        let mut t = self.thread.lock().unwrap_or_else(|p| p.into_inner());
        if t.is_none() {
            let shared = self.shared.clone();
            *t = std::thread::Builder::new()
                .name("nccl-watchdog".into())
                .spawn(move || shared.watch())
                .ok();
        }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.wake.notify_all();
        let thread = self
            .thread
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(t) = thread {
            let _ = t.join();
        }
    }
}

/// An open arming of a [`Watchdog`]; ends when dropped.
pub struct Armed<'a> {
    dog: &'a Watchdog,
    /// Whether the communicators were aborted before.
    before: bool,
}

impl Armed<'_> {
    /// Whether the watchdog aborted the communicators during this wait (a wait begun after
    /// the abort fails at its first call instead).
    pub fn fired(&self) -> bool {
        !self.before && self.dog.aborted()
    }
}

impl Drop for Armed<'_> {
    fn drop(&mut self) {
        let mut s = self.dog.shared.lock();
        s.depth = s.depth.saturating_sub(1);
        if s.depth == 0 {
            s.deadline = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::CudaResult;
    use crate::nccl::library::{NcclCall, Stream, UniqueId};
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Held by each test: one aborts every watchdog of the process (under `cargo test` the
    /// tests share one).
    static SERIAL: Mutex<()> = Mutex::new(());

    fn serial() -> MutexGuard<'static, ()> {
        SERIAL.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts aborts (and, if `.1`, never returns from one); nothing else is called.
    #[derive(Default)]
    struct Aborts(AtomicUsize, bool);

    impl NcclLibrary for Aborts {
        fn description(&self) -> String {
            "aborts".into()
        }
        fn unique_id(&self) -> CudaResult<UniqueId> {
            unreachable!()
        }
        fn init_rank(&self, _: usize, _: &UniqueId, _: usize) -> CudaResult<CommHandle> {
            unreachable!()
        }
        fn issue(&self, _: CommHandle, _: &NcclCall, _: Stream) -> CudaResult<()> {
            unreachable!()
        }
        fn group_start(&self) -> CudaResult<()> {
            unreachable!()
        }
        fn group_end(&self) -> CudaResult<()> {
            unreachable!()
        }
        fn destroy(&self, _: CommHandle) {}
        fn abort(&self, _: CommHandle) {
            self.0.fetch_add(1, Ordering::SeqCst);
            if self.1 {
                loop {
                    std::thread::park();
                }
            }
        }
    }

    #[test]
    fn short_waits_do_not_fire_and_a_long_one_aborts_every_communicator() {
        let _serial = serial();
        let lib = Arc::new(Aborts::default());
        let dog = Watchdog::new(lib.clone(), Duration::from_millis(200));
        dog.register(0);
        dog.register(1);
        // Many short armings, nested ones too, well within the timeout each.
        for _ in 0..50 {
            let outer = dog.arm();
            {
                let inner = dog.arm();
                assert!(!inner.fired());
            }
            std::thread::sleep(Duration::from_millis(5));
            assert!(!outer.fired());
        }
        // Unarmed for longer than the timeout: nothing happens.
        std::thread::sleep(Duration::from_millis(300));
        assert!(!dog.aborted());
        assert_eq!(lib.0.load(Ordering::SeqCst), 0);
        // One wait past the timeout.
        let armed = dog.arm();
        let start = Instant::now();
        while !armed.fired() && start.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(armed.fired());
        assert!(start.elapsed() >= Duration::from_millis(190));
        assert_eq!(lib.0.load(Ordering::SeqCst), 2);
        drop(armed);
        assert!(dog.aborted());
        // A later wait did not fire: it fails on its own, at its first call.
        assert!(!dog.arm().fired());
    }

    #[test]
    fn aborting_every_communicator_fires_each_live_watchdog_once() {
        let _serial = serial();
        let lib = Arc::new(Aborts::default());
        let dogs: Vec<Watchdog> = (0..3)
            .map(|k| {
                let d = Watchdog::new(lib.clone(), Duration::from_secs(60));
                d.register(k);
                d
            })
            .collect();
        abort_every_communicator();
        assert!(dogs.iter().all(Watchdog::aborted));
        assert_eq!(lib.0.load(Ordering::SeqCst), 3);
        abort_every_communicator();
        assert_eq!(lib.0.load(Ordering::SeqCst), 3);
        assert_eq!(
            abort_every_communicator_within(Duration::from_secs(10)),
            Some(0)
        );
    }

    #[test]
    fn a_blocking_abort_does_not_hold_the_caller_past_its_limit() {
        let _serial = serial();
        let stuck = Arc::new(Aborts(AtomicUsize::new(0), true));
        let dog = Watchdog::new(stuck, Duration::from_secs(60));
        dog.register(0);
        let start = Instant::now();
        assert_eq!(
            abort_every_communicator_within(Duration::from_millis(200)),
            None
        );
        assert!(start.elapsed() < Duration::from_secs(5));
        assert!(dog.aborted());
    }

    #[test]
    fn a_nested_arming_keeps_the_outer_deadline() {
        let _serial = serial();
        let lib = Arc::new(Aborts::default());
        let dog = Watchdog::new(lib.clone(), Duration::from_secs(60));
        let outer = dog.arm();
        let first = dog.shared.lock().deadline;
        std::thread::sleep(Duration::from_millis(20));
        let inner = dog.arm();
        assert_eq!(dog.shared.lock().deadline, first);
        drop(inner);
        assert_eq!(dog.shared.lock().deadline, first);
        drop(outer);
        assert_eq!(dog.shared.lock().deadline, None);
        let again = dog.arm();
        assert!(dog.shared.lock().deadline > first);
        drop(again);
        assert_eq!(lib.0.load(Ordering::SeqCst), 0);
    }
}
