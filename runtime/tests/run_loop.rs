//! The one run loop on a device that only records what it is asked: the order of the hooks
//! (packs, the bucket launched by its last member, waited for once before the first reader,
//! members unpacked as they are read, every launched bucket waited for at the end), and
//! recording under the capture hooks, and the replay state machine (warm-up, record,
//! replay, off) over them.

mod common;

use common::Builder;
use shardc_ir::{Attr, Attrs, Const, DType, Graph, OpKind, Operand, Type};
use shardc_runtime::comm::InProcessWorld;
use shardc_runtime::executor::device::ExecDevice;
use shardc_runtime::executor::replay::{replay_blocker, Ran, Replay, Replayable};
use shardc_runtime::executor::run::{record_nodes, run_nodes, LoopState, Recorded};
use shardc_runtime::executor::schedule::{BucketSpec, MemberSpec, NodeStep, Schedule};
use shardc_runtime::executor::CommCall;
use shardc_runtime::RuntimeError;

/// Records every hook as a line; `capture` says whether it offers recording, `fail_at`
/// makes compute fail at that node.
#[derive(Default)]
struct Log {
    calls: Vec<String>,
    capture: bool,
    fail_at: Option<usize>,
    dropped: Vec<usize>,
    /// Compute fails while capturing (a recording that fails).
    fail_in_capture: bool,
    capturing: bool,
    /// Computes issued or replayed (the tally a replay adds again).
    computes: usize,
    /// An op placed on the host (blocks replay after the first step).
    host: Option<String>,
}

impl ExecDevice for Log {
    type Error = RuntimeError;

    fn compute(&mut self, i: usize) -> Result<(), RuntimeError> {
        self.calls.push(format!("compute {i}"));
        if self.fail_at == Some(i) || (self.fail_in_capture && self.capturing) {
            return Err(RuntimeError::Device {
                device: "log".into(),
                reason: format!("node {i} failed"),
            });
        }
        self.computes += 1;
        Ok(())
    }

    fn assign(&mut self, i: usize, param: usize) -> Result<(), RuntimeError> {
        self.calls.push(format!("assign {i} -> param {param}"));
        Ok(())
    }

    fn collective(&mut self, i: usize, _call: &CommCall) -> Result<(), RuntimeError> {
        self.calls.push(format!("collective {i}"));
        Ok(())
    }

    fn pack(&mut self, m: usize, member: &MemberSpec) -> Result<(), RuntimeError> {
        self.calls.push(format!("pack {m} at {}", member.offset));
        Ok(())
    }

    fn launch_bucket(&mut self, b: usize, bucket: &BucketSpec) -> Result<(), RuntimeError> {
        self.calls
            .push(format!("launch {b} of {} elements", bucket.elements));
        Ok(())
    }

    fn wait_bucket(&mut self, b: usize, _: &BucketSpec, node: usize) -> Result<(), RuntimeError> {
        self.calls.push(format!("wait {b} for {node}"));
        Ok(())
    }

    fn unpack(&mut self, m: usize, _: &MemberSpec) -> Result<(), RuntimeError> {
        self.calls.push(format!("unpack {m}"));
        Ok(())
    }

    fn begin_capture(&mut self) -> Result<bool, RuntimeError> {
        self.calls.push("begin capture".into());
        self.capturing = self.capture;
        Ok(self.capture)
    }

    fn end_capture(&mut self) -> Result<usize, RuntimeError> {
        self.calls.push("end capture".into());
        self.capturing = false;
        Ok(7)
    }

    fn replay(&mut self, graph: usize) -> Result<(), RuntimeError> {
        self.calls.push(format!("replay {graph}"));
        Ok(())
    }

    fn drop_capture(&mut self, graph: usize) {
        self.dropped.push(graph);
    }
}

impl Replayable for Log {
    type Tally = usize;

    fn tally(&self) -> usize {
        self.computes
    }

    fn tally_since(&self, before: &usize) -> usize {
        self.computes - before
    }

    fn rewind(&mut self, before: &usize) {
        self.computes = *before;
    }

    fn replayed(&mut self, added: &usize) {
        self.computes += added;
    }

    fn placed_on_host(&self) -> Option<String> {
        self.host.clone()
    }
}

fn fused(id: i64) -> Attrs {
    Attrs::new()
        .with("op", Attr::Str("sum".into()))
        .with("fusion", Attr::Int(id))
}

/// 0: g1 = x*2; 1: a1 = AllReduce(g1) (bucket 1); 2: g2 = x*3; 3: a2 = AllReduce(g2)
/// (bucket 1, last); 4: a3 = AllReduce(x) (bucket 2, alone, read by nobody);
/// 5: w = x*1.5; 6: s = a2 + w; 7: out = s + a1; 8: Assign(v, out).
fn graph() -> Graph {
    let mut b = Builder::new("Loop");
    let x = b.input("x", DType::Float32, &[4]);
    let v = b.weight("v", DType::Float32, &[4], shardc_ir::Init::Zeros);
    let tx = Type::Tensor(b.ty(&x));
    let g1 = b.same(
        OpKind::Mul,
        vec![x.clone(), Operand::Const(Const::Float(2.0))],
    );
    let a1 = b.op(OpKind::AllReduce, vec![g1], fused(1), tx.clone());
    let g2 = b.same(
        OpKind::Mul,
        vec![x.clone(), Operand::Const(Const::Float(3.0))],
    );
    let a2 = b.op(OpKind::AllReduce, vec![g2], fused(1), tx.clone());
    let _a3 = b.op(OpKind::AllReduce, vec![x.clone()], fused(2), tx);
    let w = b.same(OpKind::Mul, vec![x, Operand::Const(Const::Float(1.5))]);
    let s = b.same(OpKind::Add, vec![a2, w]);
    let out = b.same(OpKind::Add, vec![s, a1]);
    let _ = b.assign(v, out.clone());
    b.finish(vec![out])
}

fn schedule(g: &Graph) -> Schedule {
    let comm = InProcessWorld::new(1).remove(0);
    Schedule::new(g, Some(comm.as_ref())).unwrap()
}

#[test]
fn the_schedule_plans_buckets_and_their_readers() {
    let g = graph();
    let s = schedule(&g);
    assert_eq!(s.buckets.len(), 2);
    assert_eq!(s.buckets[0].members, vec![0, 1]);
    assert_eq!(s.buckets[0].last, 3);
    assert_eq!(s.buckets[0].elements, 8);
    assert_eq!(s.members[1].offset, 4);
    assert_eq!(s.steps[1], NodeStep::Pack { member: 0 });
    assert_eq!(s.steps[0], NodeStep::Compute);
    assert!(matches!(s.steps[8], NodeStep::Assign { .. }));
    assert_eq!(s.reads[6], vec![1]);
    assert_eq!(s.reads[7], vec![0]);
    assert_eq!(s.buckets_read(7), vec![0]);
    assert!(s.output_reads.is_empty());
}

#[test]
fn hooks_come_in_schedule_order_with_each_bucket_waited_for_once() {
    let g = graph();
    let s = schedule(&g);
    let mut dev = Log::default();
    let mut state = LoopState::new(&s);
    for _ in 0..2 {
        dev.calls.clear();
        run_nodes(&mut dev, &g, &s, &mut state).unwrap();
        assert_eq!(
            dev.calls,
            [
                "compute 0",
                "pack 0 at 0",
                "compute 2",
                "pack 1 at 4",
                "launch 0 of 8 elements",
                "pack 2 at 0",
                "launch 1 of 4 elements",
                "compute 5",
                "wait 0 for 3",
                "unpack 1",
                "compute 6",
                "unpack 0",
                "compute 7",
                "assign 8 -> param 1",
                "wait 1 for 4",
            ]
        );
    }
}

#[test]
fn a_failing_node_stops_the_loop_and_the_next_step_starts_afresh() {
    let g = graph();
    let s = schedule(&g);
    let mut dev = Log {
        fail_at: Some(6),
        ..Log::default()
    };
    let mut state = LoopState::new(&s);
    let e = run_nodes(&mut dev, &g, &s, &mut state).unwrap_err();
    assert!(e.to_string().contains("node 6 failed"), "{e}");
    dev.fail_at = None;
    dev.calls.clear();
    run_nodes(&mut dev, &g, &s, &mut state).unwrap();
    assert_eq!(
        dev.calls.iter().filter(|c| c.starts_with("wait")).count(),
        2
    );
}

#[test]
fn recording_runs_the_loop_under_the_capture_hooks() {
    let g = graph();
    let s = schedule(&g);
    let mut state = LoopState::new(&s);
    let mut none = Log::default();
    assert!(matches!(
        record_nodes(&mut none, &g, &s, &mut state).unwrap(),
        Recorded::NotOffered
    ));
    assert_eq!(none.calls, ["begin capture"]);
    let mut dev = Log {
        capture: true,
        ..Log::default()
    };
    assert!(matches!(
        record_nodes(&mut dev, &g, &s, &mut state).unwrap(),
        Recorded::Graph(7)
    ));
    assert_eq!(dev.calls.first().map(String::as_str), Some("begin capture"));
    assert_eq!(dev.calls.last().map(String::as_str), Some("end capture"));
    let mut failing = Log {
        capture: true,
        fail_at: Some(0),
        ..Log::default()
    };
    assert!(matches!(
        record_nodes(&mut failing, &g, &s, &mut state).unwrap(),
        Recorded::Failed(_)
    ));
    assert_eq!(failing.dropped, [7], "a failed recording is discarded");
}

/// Runs `n` steps through `replay` (the last `profiled` of them profiled); returns how each ran.
fn steps(dev: &mut Log, replay: &mut Replay<usize>, n: usize, profiled: usize) -> Vec<Ran> {
    let g = graph();
    let s = schedule(&g);
    let mut state = LoopState::new(&s);
    (0..n)
        .map(|k| {
            replay
                .step(dev, &g, &s, &mut state, k + profiled >= n)
                .unwrap()
        })
        .collect()
}

#[test]
fn replay_warms_up_records_then_replays_adding_what_the_recording_added() {
    let mut dev = Log {
        capture: true,
        ..Log::default()
    };
    let mut replay = Replay::new(None);
    let ran = steps(&mut dev, &mut replay, 5, 1);
    assert_eq!(
        ran,
        [
            Ran::Issued,
            Ran::Recorded,
            Ran::Replayed,
            Ran::Replayed,
            Ran::Issued
        ],
        "a profiled step runs node by node"
    );
    assert_eq!(dev.computes, 5 * 5, "every step counts its five computes");
    assert_eq!(
        dev.calls.iter().filter(|c| *c == "replay 7").count(),
        3,
        "recorded once, replayed by three steps"
    );
    assert_eq!(replay.recorded(), Some(7));
    assert_eq!(replay.off(), None);
    assert_eq!(replay.turn_off("turned off".into()), Some(7));
    assert_eq!(replay.off(), Some("turned off"));
}

#[test]
fn replay_is_off_for_a_blocker_a_host_op_a_device_without_capture_or_a_failed_recording() {
    let g = graph();
    let calls = schedule(&g).calls;
    let staged = replay_blocker(&g, &calls, true);
    assert_eq!(
        staged.as_deref(),
        Some("its communicator stages collectives through the host (no NCCL)")
    );
    assert_eq!(replay_blocker(&g, &calls, false), None);
    let mut replay = Replay::new(staged);
    let mut dev = Log {
        capture: true,
        ..Log::default()
    };
    assert_eq!(
        steps(&mut dev, &mut replay, 3, 0),
        [Ran::Issued, Ran::Issued, Ran::Issued]
    );
    assert!(!dev.calls.iter().any(|c| c == "begin capture"));

    let mut host = Log {
        capture: true,
        host: Some("Gather 'g' runs on the host".into()),
        ..Log::default()
    };
    let mut replay = Replay::new(None);
    assert_eq!(
        steps(&mut host, &mut replay, 3, 0),
        [Ran::Issued, Ran::Issued, Ran::Issued]
    );
    assert_eq!(replay.off(), Some("Gather 'g' runs on the host"));

    let mut none = Log::default();
    let mut replay = Replay::new(None);
    assert_eq!(
        steps(&mut none, &mut replay, 3, 0),
        [Ran::Issued, Ran::Issued, Ran::Issued]
    );
    assert_eq!(replay.off(), Some("the device cannot record graphs"));

    let mut failing = Log {
        capture: true,
        fail_in_capture: true,
        ..Log::default()
    };
    let mut replay = Replay::new(None);
    let ran = steps(&mut failing, &mut replay, 3, 0);
    assert!(
        matches!(&ran[1], Ran::RecordingFailed(why) if why.contains("node 0 failed")),
        "{ran:?}"
    );
    assert_eq!(ran[2], Ran::Issued);
    assert_eq!(
        failing.computes,
        3 * 5,
        "the failed recording counts nothing"
    );
    assert!(replay
        .off()
        .is_some_and(|w| w.starts_with("the recording failed: ")));
}
