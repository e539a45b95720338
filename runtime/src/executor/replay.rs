//! Graph replay, written once for every device that records steps ([`ExecDevice::begin_capture`]:
//! a CUDA Graph, an Ascend `aclmdlRI` capture): when a step is recorded, when it is replayed,
//! and what a replayed step adds to the device's counts.
//!
//! A replayed step is the recorded step: every address is fixed for the executor's life and
//! every launch argument is the same in every step; what changes per step (Dropout's keys)
//! lives in device memory written before the step. What needs the host mid-step cannot be
//! recorded: [`replay_blocker`] (and the device's own reasons, given to [`Replay::new`]) say
//! so before the first step; ops the lowering placed on the host
//! ([`Replayable::placed_on_host`]) are known after it.
//!
//! The way: the first step runs node by node (libraries make their plans and workspaces),
//! the second is recorded ([`super::run::record_nodes`]) and replayed, every later step is
//! one [`ExecDevice::replay`]. A recording that fails, or a device that does not record,
//! leaves the executor running node by node, with the reason in [`Replay::off`].
//! `SHARDC_CUDA_GRAPHS=0` ([`GRAPHS_ENV`]) turns replay off; profiled steps run node by node
//! without changing the state.

use super::comm_call::CommCall;
use super::device::ExecDevice;
use super::run::{record_nodes, run_nodes, LoopState, Recorded};
use super::schedule::Schedule;
use shardc_ir::Graph;
use std::sync::Arc;

/// The environment variable that turns graph replay off (`0`), on every device.
pub const GRAPHS_ENV: &str = "SHARDC_CUDA_GRAPHS";

/// A device whose steps [`Replay`] records and replays: besides the capture hooks of
/// [`ExecDevice`], what issuing a step adds that a replay adds again (the counts of kernels
/// and collectives, the nodes whose kernels report bad data through a status word).
pub trait Replayable: ExecDevice {
    /// What issuing a step adds besides its work, as far as the device counts it.
    type Tally: Clone;

    /// Where the tally stands now (taken before a recording).
    fn tally(&self) -> Self::Tally;

    /// What was added since `before` (kept with the recording).
    fn tally_since(&self, before: &Self::Tally) -> Self::Tally;

    /// A recording failed (none of it ran): puts the tally back to `before` and takes back
    /// anything the recording left in flight (buckets marked launched).
    fn rewind(&mut self, before: &Self::Tally);

    /// A replay ran: adds what its recording added.
    fn replayed(&mut self, added: &Self::Tally);

    /// After the first step: the first op placed on the host, as a reason not to replay.
    fn placed_on_host(&self) -> Option<String> {
        None
    }
}

/// Where an executor is on the way to replaying its step.
#[derive(Debug)]
enum State<T> {
    /// Never: why.
    Off(String),
    /// The next step runs as it is.
    Warmup,
    /// The next step is recorded, then replayed.
    Record,
    /// Recorded: the graph and what a step adds.
    Ready { graph: usize, added: T },
}

/// How [`Replay::step`] ran the step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ran {
    /// Node by node.
    Issued,
    /// Recorded, then replayed.
    Recorded,
    /// One replay of the recorded step.
    Replayed,
    /// The recording failed (why), then node by node; every later step runs node by node.
    RecordingFailed(String),
}

impl Ran {
    /// Whether the step's work was one replay of a recording.
    pub fn replayed(&self) -> bool {
        matches!(self, Ran::Recorded | Ran::Replayed)
    }
}

/// The replay state machine of one executor (see the module doc), generic over the device's
/// tally.
#[derive(Debug)]
pub struct Replay<T> {
    state: State<T>,
}

impl<T> Default for Replay<T> {
    /// Off, with no reason (a placeholder while an executor has its state taken out).
    fn default() -> Replay<T> {
        Replay {
            state: State::Off(String::new()),
        }
    }
}

impl<T: Clone> Replay<T> {
    /// Off with `blocker` (from [`replay_blocker`] and the device's own reasons), or when
    /// [`GRAPHS_ENV`] is `0`; else warming up.
    pub fn new(blocker: Option<String>) -> Replay<T> {
        let off = if std::env::var(GRAPHS_ENV).as_deref() == Ok("0") {
            Some(format!("turned off by {GRAPHS_ENV}=0"))
        } else {
            blocker
        };
        Replay {
            state: match off {
                Some(why) => State::Off(why),
                None => State::Warmup,
            },
        }
    }

    /// Why steps do not replay, once that is known.
    pub fn off(&self) -> Option<&str> {
        match &self.state {
            State::Off(why) => Some(why),
            _ => None,
        }
    }

    /// The recorded graph, if any (the device frees it when the executor goes).
    pub fn recorded(&self) -> Option<usize> {
        match self.state {
            State::Ready { graph, .. } => Some(graph),
            _ => None,
        }
    }

    /// Turns replay off for every later step; returns the recorded graph to free, if any.
    pub fn turn_off(&mut self, why: String) -> Option<usize> {
        let graph = self.recorded();
        self.state = State::Off(why);
        graph
    }

    /// Runs one step's nodes on `dev`: replays the recording, records it, or issues it node
    /// by node (always when `profiled`), and moves on the way.
    pub fn step<D>(
        &mut self,
        dev: &mut D,
        graph: &Graph,
        schedule: &Schedule,
        state: &mut LoopState,
        profiled: bool,
    ) -> Result<Ran, D::Error>
    where
        D: Replayable<Tally = T>,
        D::Error: std::fmt::Display,
    {
        match &self.state {
            State::Ready { graph: g, added } if !profiled => {
                let (g, added) = (*g, added.clone());
                dev.replay(g)?;
                dev.replayed(&added);
                Ok(Ran::Replayed)
            }
            State::Record if !profiled => self.record(dev, graph, schedule, state),
            _ => {
                run_nodes(dev, graph, schedule, state)?;
                if matches!(self.state, State::Warmup) {
                    self.state = match dev.placed_on_host() {
                        Some(why) => State::Off(why),
                        None => State::Record,
                    };
                }
                Ok(Ran::Issued)
            }
        }
    }

    /// Records one step and replays it; when the recording fails, the step runs node by
    /// node, as every later step will.
    fn record<D>(
        &mut self,
        dev: &mut D,
        graph: &Graph,
        schedule: &Schedule,
        state: &mut LoopState,
    ) -> Result<Ran, D::Error>
    where
        D: Replayable<Tally = T>,
        D::Error: std::fmt::Display,
    {
        let before = dev.tally();
        let why = match record_nodes(dev, graph, schedule, state)? {
            Recorded::NotOffered => {
                self.state = State::Off("the device cannot record graphs".into());
                run_nodes(dev, graph, schedule, state)?;
                return Ok(Ran::Issued);
            }
            Recorded::Graph(g) => {
                self.state = State::Ready {
                    graph: g,
                    added: dev.tally_since(&before),
                };
                dev.replay(g)?;
                return Ok(Ran::Recorded);
            }
            Recorded::Failed(e) => e.to_string(),
        };
        self.state = State::Off(format!("the recording failed: {why}"));
        dev.rewind(&before);
        run_nodes(dev, graph, schedule, state)?;
        Ok(Ran::RecordingFailed(why))
    }
}

/// Why `graph`'s steps cannot be replayed from a recording, as far as the graph and its
/// communicator tell before a step runs: a communicator that stages collectives through the
/// host (`staged`), a point-to-point transfer (not recorded). Collectives rearranged around
/// a device-native communicator (axes other than 0, AllToAll) do so in the executor's
/// scratch memory, at fixed addresses, and are recorded.
pub fn replay_blocker(
    graph: &Graph,
    calls: &[Option<Arc<CommCall>>],
    staged: bool,
) -> Option<String> {
    if staged {
        // Also without collectives in the graph: ranks in one process share the device.
        return Some("its communicator stages collectives through the host (no NCCL)".into());
    }
    for (i, call) in calls.iter().enumerate() {
        let Some(call) = call.as_deref() else {
            continue;
        };
        let why = match call {
            CommCall::AllReduce { .. }
            | CommCall::Broadcast { .. }
            | CommCall::AllGather { .. }
            | CommCall::ReduceScatter { .. }
            | CommCall::AllToAll { .. } => None,
            CommCall::Send { .. } | CommCall::Receive { .. } => {
                Some("is a point-to-point transfer, which is not recorded")
            }
        };
        if let (Some(why), Some(node)) = (why, graph.nodes.get(i)) {
            return Some(format!("{} '{}' {why}", node.op, node.instance));
        }
    }
    None
}
