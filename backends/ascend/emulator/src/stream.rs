//! Streams and events.
//!
//! A stream is a thread that runs its queued work in order. An error inside queued work is kept
//! as the stream's pending error and returned by the next synchronisation on that stream (as
//! ACL reports asynchronous errors); the work after it still runs, so events recorded after it
//! complete and no other stream waits for ever. Events complete when the stream reaches their
//! record; `aclrtStreamWaitEvent` queues a wait for that completion on another stream.
//!
//! Handles given to C are fake addresses (never dereferenced) looked up in registries, so a
//! destroyed or foreign handle is an error, not a crash.

use crate::diag::{EmuError, EmuResult, ErrorKind};
use crate::mem::{engine, Accessor, Vc};
use crate::{bail, emu_err};
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Queued work: runs on the stream's thread; an error becomes the stream's pending error.
pub type Work = Box<dyn FnOnce() -> EmuResult<()> + Send + 'static>;

#[derive(Default)]
struct Progress {
    enqueued: u64,
    done: u64,
    error: Option<(EmuError, String)>,
}

/// One queued operation: its sequence number, its name and its work.
type Item = (u64, &'static str, Work);

/// An emulated stream: a worker thread with an in-order queue.
pub struct Stream {
    /// Id of the stream (its index in the vector clocks).
    pub id: u32,
    /// The device it belongs to.
    pub device: i32,
    tx: Mutex<Option<Sender<Item>>>,
    progress: Arc<(Mutex<Progress>, Condvar)>,
}

const STREAM_TAG: usize = 0x5e00_0000_0000;
const EVENT_TAG: usize = 0x5f00_0000_0000;

fn streams() -> &'static Mutex<HashMap<usize, Arc<Stream>>> {
    static S: OnceLock<Mutex<HashMap<usize, Arc<Stream>>>> = OnceLock::new();
    S.get_or_init(Default::default)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Stream {
    /// Creates a stream of `device` with its worker thread and returns its handle.
    pub fn create(device: i32) -> EmuResult<usize> {
        let id = engine().new_stream_clock();
        let progress: Arc<(Mutex<Progress>, Condvar)> = Arc::default();
        let (tx, rx) = channel::<Item>();
        let p = progress.clone();
        std::thread::Builder::new()
            .name(format!("ascend-emu-stream-{id}"))
            .spawn(move || {
                while let Ok((n, what, work)) = rx.recv() {
                    let r = catch_unwind(AssertUnwindSafe(work)).unwrap_or_else(|_| {
                        Err(emu_err!(
                            Internal,
                            "{what}: the emulator panicked running it"
                        ))
                    });
                    let (m, cv) = &*p;
                    let mut g = lock(m);
                    if let Err(e) = r {
                        let line = format!(
                            "[ascend-emu] stream #{id}: operation {n} ({what}) failed: {}",
                            e.msg
                        );
                        eprintln!("{line}");
                        if g.error.is_none() {
                            g.error = Some((e, line));
                        }
                    }
                    g.done = n;
                    cv.notify_all();
                }
            })
            .map_err(|e| emu_err!(Internal, "could not start a stream thread: {e}"))?;
        let s = Arc::new(Stream {
            id,
            device,
            tx: Mutex::new(Some(tx)),
            progress,
        });
        let h = STREAM_TAG + (id as usize) * 64;
        lock(streams()).insert(h, s);
        Ok(h)
    }

    /// The live stream with handle `h`.
    pub fn get(api: &str, h: usize) -> EmuResult<Arc<Stream>> {
        match lock(streams()).get(&h) {
            Some(s) => Ok(s.clone()),
            None => Err(emu_err!(
                BadHandle,
                "{api}: stream {h:#x} is not a live stream (destroyed, or never created)"
            )),
        }
    }

    /// Removes the stream with handle `h` from the registry after draining its queue; its
    /// thread ends.
    pub fn destroy(api: &str, h: usize) -> EmuResult<()> {
        let s = Stream::get(api, h)?;
        let r = s.synchronize(api, None);
        lock(streams()).remove(&h);
        lock(&s.tx).take();
        r
    }

    /// Enqueues `work` as operation `n` (from [`Engine::begin_op`](crate::mem::Engine::begin_op),
    /// called under the same engine lock so queue order is sequence order).
    pub fn push(&self, n: u64, what: &'static str, work: Work) -> EmuResult<()> {
        let tx = lock(&self.tx);
        let Some(tx) = tx.as_ref() else {
            bail!(InvalidParam, "{what}: stream #{} was destroyed", self.id);
        };
        lock(&self.progress.0).enqueued = n;
        tx.send((n, what, work))
            .map_err(|_| emu_err!(Internal, "{what}: stream #{} thread is gone", self.id))
    }

    /// Waits until everything enqueued so far has run (at most `timeout`), then returns and
    /// clears the pending error of queued work, if any. On success the host's clock joins the
    /// stream's.
    pub fn synchronize(&self, api: &str, timeout: Option<Duration>) -> EmuResult<()> {
        let vc = engine().stream_vc(self.id);
        let (m, cv) = &*self.progress;
        let mut g = lock(m);
        let target = g.enqueued;
        let start = Instant::now();
        while g.done < target {
            match timeout {
                None => g = cv.wait(g).unwrap_or_else(|e| e.into_inner()),
                Some(t) => {
                    let left = t.saturating_sub(start.elapsed());
                    if left.is_zero() {
                        bail!(
                            Timeout,
                            "{api}: stream #{} did not drain within {} ms ({} of {} operations done)",
                            self.id,
                            t.as_millis(),
                            g.done,
                            target
                        );
                    }
                    g = cv
                        .wait_timeout(g, left)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
            }
        }
        let err = g.error.take();
        drop(g);
        engine().host_join(&vc);
        match err {
            Some((e, line)) => Err(queued_error(api, e, &line)),
            None => Ok(()),
        }
    }

    /// Whether everything enqueued so far has run.
    pub fn idle(&self) -> bool {
        let g = lock(&self.progress.0);
        g.done >= g.enqueued
    }

    /// Waits until operation `n` of this stream has run.
    fn wait_done(&self, n: u64) {
        let (m, cv) = &*self.progress;
        let mut g = lock(m);
        while g.done < n {
            g = cv.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// The error a synchronisation returns for failed queued work `e` (logged as `line`).
fn queued_error(api: &str, e: EmuError, line: &str) -> EmuError {
    let kind = match e.kind {
        ErrorKind::Timeout => ErrorKind::QueuedTimeout,
        k => k,
    };
    EmuError::new(
        kind,
        format!("{api}: {}", line.trim_start_matches("[ascend-emu] ")),
    )
}

/// Every live stream (for device-wide synchronisation).
pub fn all_streams() -> Vec<(usize, Arc<Stream>)> {
    lock(streams())
        .iter()
        .map(|(h, s)| (*h, s.clone()))
        .collect()
}

#[derive(Default)]
struct EventState {
    /// How many records were enqueued.
    recorded: u64,
    /// The stream and operation of the latest record.
    last: Option<(Arc<Stream>, u64)>,
    /// The clock the latest record captured.
    vc: Vc,
}

/// An emulated event.
pub struct Event {
    /// The device it was created on.
    pub device: i32,
    state: Mutex<EventState>,
}

fn events() -> &'static Mutex<HashMap<usize, Arc<Event>>> {
    static E: OnceLock<Mutex<HashMap<usize, Arc<Event>>>> = OnceLock::new();
    E.get_or_init(Default::default)
}

impl Event {
    /// Creates an event on `device` and returns its handle.
    pub fn create(device: i32) -> usize {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let h = EVENT_TAG + n * 64;
        lock(events()).insert(
            h,
            Arc::new(Event {
                device,
                state: Mutex::default(),
            }),
        );
        h
    }

    /// The live event with handle `h`.
    pub fn get(api: &str, h: usize) -> EmuResult<Arc<Event>> {
        match lock(events()).get(&h) {
            Some(e) => Ok(e.clone()),
            None => Err(emu_err!(
                BadHandle,
                "{api}: event {h:#x} is not a live event (destroyed, or never created)"
            )),
        }
    }

    /// Destroys the event with handle `h`.
    pub fn destroy(api: &str, h: usize) -> EmuResult<()> {
        match lock(events()).remove(&h) {
            Some(_) => Ok(()),
            None => Err(emu_err!(
                BadHandle,
                "{api}: event {h:#x} is not a live event (destroyed twice?)"
            )),
        }
    }

    /// Records the event on `stream`: it completes when the stream reaches this point.
    pub fn record(&self, api: &str, stream: &Arc<Stream>) -> EmuResult<()> {
        if stream.device != self.device {
            bail!(
                WrongDevice,
                "{api}: event of device {} recorded on stream #{} of device {}",
                self.device,
                stream.id,
                stream.device
            );
        }
        let mut e = engine();
        let (seq, vc) = e.begin_op(stream.id);
        stream.push(seq, "aclrtRecordEvent", Box::new(|| Ok(())))?;
        drop(e);
        let mut st = lock(&self.state);
        st.recorded += 1;
        st.last = Some((stream.clone(), seq));
        st.vc = vc;
        Ok(())
    }

    /// Makes later work on `stream` wait for the event's latest record.
    pub fn wait_on(&self, api: &str, stream: &Arc<Stream>) -> EmuResult<()> {
        let (last, vc) = {
            let st = lock(&self.state);
            (st.last.clone(), st.vc.clone())
        };
        let Some((src, n)) = last else {
            // Waiting on a never-recorded event does nothing (as on the card).
            return Ok(());
        };
        let mut e = engine();
        e.stream_join(stream.id, &vc);
        let (seq, _) = e.begin_op(stream.id);
        let _ = api;
        stream.push(
            seq,
            "aclrtStreamWaitEvent",
            Box::new(move || {
                src.wait_done(n);
                Ok(())
            }),
        )
    }

    /// Blocks the host until the event's latest record has run; the host's clock joins it.
    pub fn synchronize(&self, api: &str, timeout: Option<Duration>) -> EmuResult<()> {
        let (last, vc) = {
            let st = lock(&self.state);
            (st.last.clone(), st.vc.clone())
        };
        if let Some((src, n)) = last {
            let (m, cv) = &*src.progress;
            let mut g = lock(m);
            let start = Instant::now();
            while g.done < n {
                match timeout {
                    None => g = cv.wait(g).unwrap_or_else(|e| e.into_inner()),
                    Some(t) => {
                        let left = t.saturating_sub(start.elapsed());
                        if left.is_zero() {
                            bail!(
                                Timeout,
                                "{api}: the event's record on stream #{} was not reached within {} ms",
                                src.id,
                                t.as_millis()
                            );
                        }
                        g = cv
                            .wait_timeout(g, left)
                            .unwrap_or_else(|e| e.into_inner())
                            .0;
                    }
                }
            }
            let err = g.error.take();
            drop(g);
            engine().host_join(&vc);
            if let Some((e, line)) = err {
                return Err(queued_error(api, e, &line));
            }
        }
        Ok(())
    }

    /// Whether the event's latest record has run (true when never recorded).
    pub fn completed(&self) -> bool {
        let st = lock(&self.state);
        match &st.last {
            Some((s, n)) => lock(&s.progress.0).done >= *n,
            None => true,
        }
    }
}

/// Enqueues an operation on `stream` atomically: starts it in the clocks, resolves and checks
/// its accesses (`reqs`, on the stream's device), records them, and queues the work `build`
/// makes from the resolved regions. Nothing is queued when a check fails.
pub fn submit(
    api: &str,
    what: &'static str,
    stream: &Arc<Stream>,
    reqs: &[crate::mem::AccessReq],
    build: impl FnOnce(Vec<crate::mem::Resolved>) -> Work,
) -> EmuResult<()> {
    let mut e = engine();
    let (seq, vc) = e.begin_op(stream.id);
    let who = Accessor::Stream {
        stream: stream.id,
        seq,
        vc,
    };
    let res = e.access(api, what, &who, Some(stream.device), reqs)?;
    stream.push(seq, what, build(res))
}

/// Kind of an error, for callers that only need to test it.
pub fn kind_of(r: &EmuResult<()>) -> Option<ErrorKind> {
    r.as_ref().err().map(|e| e.kind)
}
