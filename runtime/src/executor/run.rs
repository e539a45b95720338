//! The one run loop: a step's nodes in schedule order on any [`ExecDevice`], with the
//! gradient buckets packed, launched by their last member and waited for before their
//! first reader (see [`super::device`] for the order of the hooks).

use super::device::ExecDevice;
use super::schedule::{NodeStep, Schedule};
use crate::error::RuntimeError;
use crate::memory::node_text;
use shardc_ir::Graph;

/// What the loop tracks within a step (reset at its start): per member whether its result
/// is unpacked, per bucket whether it was launched and whether it was waited for.
#[derive(Clone, Debug, Default)]
pub struct LoopState {
    unpacked: Vec<bool>,
    launched: Vec<bool>,
    waited: Vec<bool>,
}

impl LoopState {
    /// The state for `schedule`'s members and buckets.
    pub fn new(schedule: &Schedule) -> LoopState {
        LoopState {
            unpacked: vec![false; schedule.members.len()],
            launched: vec![false; schedule.buckets.len()],
            waited: vec![false; schedule.buckets.len()],
        }
    }

    fn reset(&mut self, schedule: &Schedule) {
        if self.unpacked.len() != schedule.members.len()
            || self.launched.len() != schedule.buckets.len()
        {
            *self = LoopState::new(schedule);
        } else {
            self.unpacked.fill(false);
            self.launched.fill(false);
            self.waited.fill(false);
        }
    }
}

/// Issues one step's nodes on `dev` (see the module doc). On an error, buckets may still be
/// in flight: the device takes them back before its next step.
pub fn run_nodes<D: ExecDevice>(
    dev: &mut D,
    graph: &Graph,
    schedule: &Schedule,
    state: &mut LoopState,
) -> Result<(), D::Error> {
    state.reset(schedule);
    for (i, step) in schedule.steps.iter().enumerate() {
        let reads = &schedule.reads[i];
        let mut waited = false;
        for &m in reads {
            waited |= ready(dev, graph, schedule, state, m)?;
        }
        dev.before_node(i, waited)?;
        match *step {
            NodeStep::Alias => {}
            NodeStep::Compute => dev.compute(i)?,
            NodeStep::Assign { param } => dev.assign(i, param)?,
            NodeStep::Collective => match schedule.calls[i].as_deref() {
                Some(call) => dev.collective(i, call)?,
                None => {
                    return Err(graph_error(
                        graph,
                        i,
                        "a communication node without its call".into(),
                    )
                    .into())
                }
            },
            NodeStep::Pack { member } => {
                let mem = &schedule.members[member];
                dev.pack(member, mem)?;
                let bucket = &schedule.buckets[mem.bucket];
                if bucket.last == i {
                    dev.launch_bucket(mem.bucket, bucket)?;
                    state.launched[mem.bucket] = true;
                }
            }
        }
        dev.after_node(i)?;
    }
    for &m in &schedule.output_reads {
        ready(dev, graph, schedule, state, m)?;
    }
    for (b, bucket) in schedule.buckets.iter().enumerate() {
        if state.launched[b] && !state.waited[b] {
            let first = bucket
                .members
                .first()
                .map_or(bucket.last, |&m| schedule.members[m].node);
            dev.wait_bucket(b, bucket, first)?;
            state.waited[b] = true;
        }
    }
    dev.nodes_done()
}

/// How [`record_nodes`] went.
#[derive(Debug)]
pub enum Recorded<E> {
    /// The device does not record ([`ExecDevice::begin_capture`] said so); nothing ran.
    NotOffered,
    /// Recorded as this graph (nothing of it ran yet: replay it).
    Graph(usize),
    /// Issuing or ending the recording failed; the recording is discarded and nothing ran.
    Failed(E),
}

/// Records one step's nodes as one graph instead of running them: the device's capture
/// hooks around [`run_nodes`]. Graph replay on any device goes through here: the first
/// step runs node by node (libraries make their plans), the second is recorded and
/// replayed ([`ExecDevice::replay`]), every later step is one replay; a device whose
/// recording fails runs node by node from then on.
pub fn record_nodes<D: ExecDevice>(
    dev: &mut D,
    graph: &Graph,
    schedule: &Schedule,
    state: &mut LoopState,
) -> Result<Recorded<D::Error>, D::Error> {
    if !dev.begin_capture()? {
        return Ok(Recorded::NotOffered);
    }
    let issued = run_nodes(dev, graph, schedule, state);
    let ended = dev.end_capture();
    Ok(match (issued, ended) {
        (Ok(()), Ok(g)) => Recorded::Graph(g),
        (Err(e), Ok(g)) => {
            dev.drop_capture(g);
            Recorded::Failed(e)
        }
        (Err(e), Err(_)) | (Ok(()), Err(e)) => Recorded::Failed(e),
    })
}

/// Makes member `m`'s result ready for `reader`: waits for its bucket (once), unpacks it
/// (once); errors name the member's node. Returns whether it did anything.
fn ready<D: ExecDevice>(
    dev: &mut D,
    graph: &Graph,
    schedule: &Schedule,
    state: &mut LoopState,
    m: usize,
) -> Result<bool, D::Error> {
    if state.unpacked[m] {
        return Ok(false);
    }
    let mem = &schedule.members[m];
    let b = mem.bucket;
    if !state.launched[b] {
        let reason = format!(
            "gradient bucket fusion {} is read before its last member ran",
            schedule.buckets[b].id
        );
        return Err(graph_error(graph, mem.node, reason).into());
    }
    if !state.waited[b] {
        dev.wait_bucket(b, &schedule.buckets[b], mem.node)?;
        state.waited[b] = true;
    }
    dev.unpack(m, mem)?;
    state.unpacked[m] = true;
    Ok(true)
}

fn graph_error(graph: &Graph, i: usize, reason: String) -> RuntimeError {
    RuntimeError::Graph {
        graph: graph.name.clone(),
        location: node_text(graph, i),
        reason,
    }
}
