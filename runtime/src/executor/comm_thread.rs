//! The executor's communication thread: every collective of one executor runs here, one at a
//! time, in the order the main thread submits them (program order), so that all ranks issue
//! their collectives in the same order and the communicator is never called from two threads
//! at once. The main thread submits a job and gets a ticket; it later waits for that ticket
//! (right away for an ordinary communication node, at the first reader for a gradient bucket).
//!
//! A job submitted while the thread has nothing else to do runs on the submitting thread
//! instead ([`CommThread::run`]): the order is the same (every earlier job has finished), the
//! communicator is still never called from two threads at once (the idle thread waits on its
//! queue), and an ordinary collective saves the two thread hand-offs (a wake-up of the
//! communication thread, then one of the main thread, each tens of microseconds when the
//! thread slept). A gradient bucket with little compute to hide behind may run here the same
//! way ([`CommThread::run_if_idle`]; the executor decides).

use super::comm_call::{run_comm, CommCall, CommFailure};
use super::schedule::BucketCollective;
#[cfg(doc)]
use super::schedule::BucketSpec;
use crate::comm::Communicator;
use crate::tensor::Tensor;
use shardc_ir::{ReduceOp, TensorType};
use std::collections::HashMap;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What the communication thread runs.
pub(super) enum Job {
    /// One communication node, as [`run_comm`] runs it: the operand (moved in and given back)
    /// and the result buffer, already of type `ty`.
    Node {
        call: Arc<CommCall>,
        input: Option<Tensor>,
        dst: Tensor,
        ty: Arc<TensorType>,
    },
    /// One bucket: a single collective over the packed members (see [`BucketSpec`]).
    Bucket {
        group: Arc<[usize]>,
        collective: BucketCollective,
        op: ReduceOp,
        per_rank: usize,
        flat: Tensor,
    },
}

/// A finished job: its tensors given back, the outcome and the time spent in the
/// communicator.
#[derive(Debug)]
pub(super) struct Reply {
    /// The operand of a node job.
    pub input: Option<Tensor>,
    /// The result buffer of a node job, or the reduced flat buffer of a bucket.
    pub dst: Tensor,
    /// Whether it worked.
    pub result: Result<(), CommFailure>,
    /// Time inside the communicator.
    pub elapsed: Duration,
}

/// The thread and its two queues.
pub(super) struct CommThread {
    /// The communicator, for jobs run on the submitting thread.
    comm: Arc<dyn Communicator>,
    jobs: Option<Sender<(u64, Job)>>,
    replies: Receiver<(u64, Reply)>,
    handle: Option<JoinHandle<()>>,
    next: u64,
    /// Replies taken from the queue (stashed or handed out): the thread is idle when this
    /// equals `next`.
    received: u64,
    /// Replies that arrived while waiting for a later ticket.
    stash: HashMap<u64, Reply>,
}

impl CommThread {
    /// Starts the thread for `comm` (named after the rank).
    pub fn start(comm: Arc<dyn Communicator>) -> std::io::Result<CommThread> {
        let thread_comm = comm.clone();
        let (jobs, job_rx) = channel::<(u64, Job)>();
        let (reply_tx, replies) = channel::<(u64, Reply)>();
        let handle = std::thread::Builder::new()
            .name(format!("shardc-comm-{}", comm.rank()))
            .spawn(move || {
                while let Ok((ticket, job)) = job_rx.recv() {
                    let reply = execute(&*thread_comm, job);
                    if reply_tx.send((ticket, reply)).is_err() {
                        break;
                    }
                }
            })?;
        Ok(CommThread {
            comm,
            jobs: Some(jobs),
            replies,
            handle: Some(handle),
            next: 0,
            received: 0,
            stash: HashMap::new(),
        })
    }

    /// Runs `job` now and returns its reply: on this thread when the communication thread
    /// has no job in flight, else after every earlier job, on the communication thread.
    /// `None` when the thread died (a panic in a communicator).
    pub fn run(&mut self, job: Job) -> Option<Reply> {
        let job = match self.run_if_idle(job) {
            Ok(reply) => return Some(reply),
            Err(job) => *job,
        };
        match self.submit(job) {
            Ok(ticket) => self.wait(ticket),
            Err(job) => match *job {
                Job::Node { input, dst, .. } => Some(Reply {
                    input,
                    dst,
                    result: Err(CommFailure::Local(
                        "the communication thread has ended".into(),
                    )),
                    elapsed: Duration::ZERO,
                }),
                Job::Bucket { .. } => None,
            },
        }
    }

    /// Runs `job` on this thread if the communication thread has no job in flight (see
    /// [`CommThread::run`]); else gives it back.
    pub fn run_if_idle(&mut self, job: Job) -> Result<Reply, Box<Job>> {
        if self.idle() {
            Ok(execute(&*self.comm, job))
        } else {
            Err(Box::new(job))
        }
    }

    /// Whether no job is in flight (replies that came in are stashed for their waiters) and
    /// the thread still takes jobs.
    fn idle(&mut self) -> bool {
        while self.received < self.next {
            match self.replies.try_recv() {
                Ok((t, r)) => {
                    self.received += 1;
                    self.stash.insert(t, r);
                }
                Err(_) => break,
            }
        }
        self.received == self.next && self.jobs.is_some()
    }

    /// Queues `job`; returns its ticket, or the job back when the thread is gone.
    pub fn submit(&mut self, job: Job) -> Result<u64, Box<Job>> {
        let ticket = self.next;
        match &self.jobs {
            Some(tx) => match tx.send((ticket, job)) {
                Ok(()) => {
                    self.next += 1;
                    Ok(ticket)
                }
                Err(e) => Err(Box::new(e.0 .1)),
            },
            None => Err(Box::new(job)),
        }
    }

    /// Blocks until `ticket` is done; `None` when the thread died (a panic in a
    /// communicator).
    pub fn wait(&mut self, ticket: u64) -> Option<Reply> {
        if let Some(r) = self.stash.remove(&ticket) {
            return Some(r);
        }
        loop {
            let (t, r) = self.replies.recv().ok()?;
            self.received += 1;
            if t == ticket {
                return Some(r);
            }
            self.stash.insert(t, r);
        }
    }
}

/// Runs `job` on `comm`, timing it.
fn execute(comm: &dyn Communicator, job: Job) -> Reply {
    let t0 = Instant::now();
    match job {
        Job::Node {
            call,
            input,
            mut dst,
            ty,
        } => {
            let result = run_comm(comm, &call, input.as_ref(), &mut dst, &ty);
            Reply {
                input,
                dst,
                result,
                elapsed: t0.elapsed(),
            }
        }
        Job::Bucket {
            group,
            collective,
            op,
            per_rank,
            mut flat,
        } => {
            let result = run_bucket(comm, &group, collective, op, per_rank, &mut flat);
            Reply {
                input: None,
                dst: flat,
                result,
                elapsed: t0.elapsed(),
            }
        }
    }
}

/// Runs a bucket's collective over its flat buffer (see [`BucketSpec`]): an AllReduce in
/// place, or an AllGather of the rank's own blocks (the buffer's tail) into every rank's
/// (its head).
pub(super) fn run_bucket(
    comm: &dyn Communicator,
    group: &[usize],
    collective: BucketCollective,
    op: ReduceOp,
    per_rank: usize,
    flat: &mut Tensor,
) -> Result<(), CommFailure> {
    match collective {
        BucketCollective::AllReduce => comm.all_reduce(group, op, flat).map_err(CommFailure::Comm),
        BucketCollective::AllGather { ranks } => {
            let mut own = Tensor::zeros(&TensorType::new(flat.dtype(), vec![per_rank]));
            if !own.copy_elements(0, flat, ranks * per_rank, per_rank) {
                return Err(CommFailure::Local(format!(
                    "a gather bucket's buffer of {} elements has no own blocks of {per_rank} \
                     after {ranks} ranks' blocks",
                    flat.len()
                )));
            }
            let gathered = comm.all_gather(group, 0, &own).map_err(CommFailure::Comm)?;
            if gathered.len() != ranks * per_rank
                || !flat.copy_elements(0, &gathered, 0, gathered.len())
            {
                return Err(CommFailure::Local(format!(
                    "the bucket's AllGather returned {} elements, not {ranks} x {per_rank}",
                    gathered.len()
                )));
            }
            Ok(())
        }
    }
}

impl Drop for CommThread {
    fn drop(&mut self) {
        // Closing the queue ends the thread once its current collective returns (bounded by
        // the communicator's timeout).
        self.jobs.take();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}
