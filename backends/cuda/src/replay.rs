//! Graph replay: whether a [`crate::GpuExecutor`]'s steps can be recorded once
//! ([`crate::Device::begin_capture`]) and replayed, and where an executor is on the way.
//!
//! A replayed step is the recorded step: every address is fixed for the executor's life and
//! every launch argument is the same in every step; what changes per step (Dropout's keys)
//! lives in device memory written before the step. What needs the host mid-step cannot be
//! recorded: `replay_blocker` says so before the first step; ops the lowering placed on the
//! host are known after it.

use shardc_ir::Graph;
use shardc_runtime::executor::CommCall;

/// The counts one step adds to [`crate::executor::GpuStats`] (what a replayed step adds, as recorded).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct StepCounts {
    pub(crate) device_ops: u64,
    pub(crate) comm_ops: u64,
    pub(crate) fused_kernels: u64,
    pub(crate) library_ops: u64,
    pub(crate) in_place_updates: u64,
}

impl StepCounts {
    /// What was added since `before`.
    pub(crate) fn since(self, before: StepCounts) -> StepCounts {
        StepCounts {
            device_ops: self.device_ops - before.device_ops,
            comm_ops: self.comm_ops - before.comm_ops,
            fused_kernels: self.fused_kernels - before.fused_kernels,
            library_ops: self.library_ops - before.library_ops,
            in_place_updates: self.in_place_updates - before.in_place_updates,
        }
    }
}

/// Where an executor is on the way to replaying its step (see [`crate::GpuExecutor`]).
#[derive(Debug)]
pub(crate) enum Replay {
    /// Never: why.
    Off(String),
    /// The next step runs as it is.
    Warmup,
    /// The next step is recorded, then replayed.
    Record,
    /// Recorded: the graph, what a step adds to the counts, and the nodes whose kernels
    /// report bad data through the status word.
    Ready {
        graph: usize,
        counts: StepCounts,
        status_users: Vec<usize>,
    },
}

/// The environment variable that turns graph replay off (`0`).
pub const CUDA_GRAPHS_ENV: &str = "SHARDC_CUDA_GRAPHS";

/// Why `graph`'s steps cannot be replayed from a recording, as far as the graph and its
/// communicator tell before a step runs (ops placed on the host are known after the first).
pub(crate) fn replay_blocker(
    graph: &Graph,
    calls: &[Option<std::sync::Arc<CommCall>>],
    staged: bool,
) -> Option<String> {
    if std::env::var(CUDA_GRAPHS_ENV).as_deref() == Ok("0") {
        return Some(format!("turned off by {CUDA_GRAPHS_ENV}=0"));
    }
    if staged {
        // Also without collectives in the graph: ranks in one process share the device.
        return Some("its communicator stages collectives through the host (no NCCL)".into());
    }
    for (i, call) in calls.iter().enumerate() {
        let Some(call) = call.as_deref() else {
            continue;
        };
        let node = &graph.nodes[i];
        // Collectives rearranged around NCCL (axes other than 0, AllToAll) do so in the
        // executor's scratch memory, at fixed addresses.
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
        if let Some(why) = why {
            return Some(format!("{} '{}' {why}", node.op, node.instance));
        }
    }
    None
}
