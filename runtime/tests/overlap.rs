//! Gradient buckets overlap with compute: the executor packs a bucket's AllReduces into one
//! flat buffer, issues ONE AllReduce on its communication thread once the last member exists,
//! keeps computing, and waits only at the first reader of a member. Checked with a slow
//! communicator (sleeps in `all_reduce`) and a backend that records when each node ran; plus
//! errors of the communication thread surfacing at the wait, a dead peer ending in the
//! communicator's timeout, and malformed buckets rejected at creation.

mod common;

use common::{Builder, TestBackend};
use shardc_ir::{
    Attr, Attrs, Const, DType, Graph, Node, OpKind, Operand, ReduceOp, TensorType, Type,
};
use shardc_runtime::comm::{Collective, CommError, Communicator, InProcessWorld};
use shardc_runtime::executor::Executor;
use shardc_runtime::{Arg, Backend, KernelContext, KernelError, RuntimeError, Tensor};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A communicator that sleeps `delay` in every `all_reduce` and records each call's length,
/// start and end; it counts calls that overlap (which must never happen).
struct SlowComm {
    inner: Arc<dyn Communicator>,
    delay: Duration,
    /// Fail every all_reduce of this many elements.
    fail_len: Option<usize>,
    calls: Mutex<Vec<(usize, Instant, Instant)>>,
    /// Per all_reduce: its length and the name of the thread that made it.
    threads: Mutex<Vec<(usize, String)>>,
    in_call: AtomicUsize,
    overlapping: AtomicUsize,
    /// What `overlaps_compute` answers.
    overlaps: bool,
}

impl SlowComm {
    fn wrap(inner: Arc<dyn Communicator>, delay: Duration, fail_len: Option<usize>) -> Arc<Self> {
        Arc::new(SlowComm {
            inner,
            delay,
            fail_len,
            calls: Mutex::new(Vec::new()),
            threads: Mutex::new(Vec::new()),
            in_call: AtomicUsize::new(0),
            overlapping: AtomicUsize::new(0),
            overlaps: true,
        })
    }

    fn enter(&self) {
        if self.in_call.fetch_add(1, Ordering::SeqCst) > 0 {
            self.overlapping.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn leave(&self) {
        self.in_call.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Communicator for SlowComm {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn size(&self) -> usize {
        self.inner.size()
    }
    fn all_reduce(&self, group: &[usize], op: ReduceOp, t: &mut Tensor) -> Result<(), CommError> {
        self.enter();
        let thread = std::thread::current().name().unwrap_or("").to_string();
        self.threads.lock().unwrap().push((t.len(), thread));
        let start = Instant::now();
        std::thread::sleep(self.delay);
        let r = if self.fail_len == Some(t.len()) {
            Err(CommError::Transport {
                collective: Collective::AllReduce,
                group: group.to_vec(),
                rank: self.rank(),
                reason: "the test's peer connection broke".into(),
            })
        } else {
            self.inner.all_reduce(group, op, t)
        };
        self.calls
            .lock()
            .unwrap()
            .push((t.len(), start, Instant::now()));
        self.leave();
        r
    }
    fn all_gather(&self, g: &[usize], axis: usize, x: &Tensor) -> Result<Tensor, CommError> {
        self.enter();
        let r = self.inner.all_gather(g, axis, x);
        self.leave();
        r
    }
    fn reduce_scatter(
        &self,
        g: &[usize],
        op: ReduceOp,
        axis: usize,
        x: &Tensor,
    ) -> Result<Tensor, CommError> {
        self.enter();
        let r = self.inner.reduce_scatter(g, op, axis, x);
        self.leave();
        r
    }
    fn all_to_all(&self, g: &[usize], s: usize, c: usize, x: &Tensor) -> Result<Tensor, CommError> {
        self.enter();
        let r = self.inner.all_to_all(g, s, c, x);
        self.leave();
        r
    }
    fn broadcast(&self, g: &[usize], root: usize, t: &mut Tensor) -> Result<(), CommError> {
        self.enter();
        let r = self.inner.broadcast(g, root, t);
        self.leave();
        r
    }
    fn send(&self, dest: usize, tag: i64, t: &Tensor) -> Result<(), CommError> {
        self.inner.send(dest, tag, t)
    }
    fn recv(&self, src: usize, tag: i64, ty: &TensorType) -> Result<Tensor, CommError> {
        self.inner.recv(src, tag, ty)
    }
    fn barrier(&self, g: &[usize]) -> Result<(), CommError> {
        self.inner.barrier(g)
    }
    fn overlaps_compute(&self, _group: &[usize]) -> bool {
        self.overlaps
    }
}

/// The test backend, recording when each node started and ended; nodes named `work*` take
/// `work` each.
struct Recorder {
    work: Duration,
    log: Mutex<Vec<(String, Instant, Instant)>>,
}

impl Backend for Recorder {
    fn name(&self) -> &str {
        "recorder"
    }
    fn run(
        &self,
        node: &Node,
        inputs: &[Arg<'_>],
        outputs: &mut [Tensor],
        ctx: &KernelContext,
    ) -> Result<(), KernelError> {
        let start = Instant::now();
        if node.instance.starts_with("work") {
            std::thread::sleep(self.work);
        }
        let r = TestBackend.run(node, inputs, outputs, ctx);
        self.log
            .lock()
            .unwrap()
            .push((node.instance.clone(), start, Instant::now()));
        r
    }
}

fn named(b: &mut Builder, o: &Operand, name: &str) {
    if let Operand::Node(n) = o {
        b.g.nodes[n.index()].instance = name.to_string();
    }
}

fn fused(id: i64) -> Attrs {
    Attrs::new()
        .with("op", Attr::Str("sum".into()))
        .with("fusion", Attr::Int(id))
}

/// `f = AllReduce(x)` (not fused); `g1 = f*2`, `g2 = x*3` reduced in bucket 1 (`grad1`,
/// `grad2`); five `work` nodes after the bucket's launch; `out = grad1 + grad2 + work5`.
/// With `fusion` false the two gradient AllReduces are not fused.
fn bucket_graph(fusion: bool) -> Graph {
    let mut b = Builder::new("Bucket");
    let x = b.input("x", DType::Float64, &[4]);
    let tx = Type::Tensor(b.ty(&x));
    let f = b.op(OpKind::AllReduce, vec![x.clone()], fused(0), tx.clone());
    let g1 = b.same(OpKind::Mul, vec![f, Operand::Const(Const::Float(2.0))]);
    let a1 = b.op(
        OpKind::AllReduce,
        vec![g1],
        fused(i64::from(fusion)),
        tx.clone(),
    );
    named(&mut b, &a1, "grad1");
    let g2 = b.same(
        OpKind::Mul,
        vec![x.clone(), Operand::Const(Const::Float(3.0))],
    );
    let a2 = b.op(OpKind::AllReduce, vec![g2], fused(i64::from(fusion)), tx);
    named(&mut b, &a2, "grad2");
    let mut w = x;
    for k in 1..=5 {
        w = b.same(OpKind::Mul, vec![w, Operand::Const(Const::Float(1.5))]);
        named(&mut b, &w, &format!("work{k}"));
    }
    let s = b.same(OpKind::Add, vec![a1, a2]);
    named(&mut b, &s, "consumer");
    let out = b.same(OpKind::Add, vec![s, w]);
    b.finish(vec![out])
}

fn x_of(rank: usize, step: usize) -> Tensor {
    let v = (0..4)
        .map(|i| 0.1 + rank as f64 * 1.7 + i as f64 * 0.3 + step as f64 * 0.01)
        .collect();
    Tensor::from_f64(vec![4], v).unwrap()
}

struct RankRun {
    outputs: Vec<Vec<u64>>,
    stats: shardc_runtime::executor::ExecStats,
    comm: Arc<SlowComm>,
    backend: Arc<Recorder>,
}

fn run(n: usize, fusion: bool, delay: Duration, work: Duration, steps: usize) -> Vec<RankRun> {
    run_with(n, fusion, delay, work, steps, true)
}

/// As [`run`], the communicator answering `overlaps` to `overlaps_compute`.
fn run_with(
    n: usize,
    fusion: bool,
    delay: Duration,
    work: Duration,
    steps: usize,
    overlaps: bool,
) -> Vec<RankRun> {
    let comms = InProcessWorld::with_timeout(n, Duration::from_secs(20));
    std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .into_iter()
            .map(|c| {
                s.spawn(move || {
                    let r = c.rank();
                    let mut comm = SlowComm::wrap(c, delay, None);
                    Arc::get_mut(&mut comm).unwrap().overlaps = overlaps;
                    let backend = Arc::new(Recorder {
                        work,
                        log: Mutex::new(Vec::new()),
                    });
                    let mut exec = Executor::with_communicator(
                        bucket_graph(fusion),
                        backend.clone(),
                        comm.clone(),
                    )
                    .unwrap();
                    let outputs = (0..steps)
                        .map(|k| {
                            let o = exec.step(&[("x", x_of(r, k))]).unwrap();
                            o[0].to_f64_vec().into_iter().map(f64::to_bits).collect()
                        })
                        .collect();
                    RankRun {
                        outputs,
                        stats: exec.stats().clone(),
                        comm,
                        backend,
                    }
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn a_slow_bucket_overlaps_with_the_compute_after_its_launch() {
    let delay = Duration::from_millis(300);
    let work = Duration::from_millis(15);
    let runs = run(2, true, delay, work, 3);
    for (r, run) in runs.iter().enumerate() {
        // The numbers: grad1 + grad2 summed over ranks, plus this rank's work chain.
        for (k, out) in run.outputs.iter().enumerate() {
            let xs: Vec<Vec<f64>> = (0..2).map(|q| x_of(q, k).to_f64_vec()).collect();
            let f: Vec<f64> = (0..4).map(|i| xs[0][i] + xs[1][i]).collect();
            let want: Vec<u64> = (0..4)
                .map(|i| {
                    let g1 = (f[i] * 2.0) + (f[i] * 2.0);
                    let g2 = (xs[0][i] * 3.0) + (xs[1][i] * 3.0);
                    let w = xs[r][i] * 1.5 * 1.5 * 1.5 * 1.5 * 1.5;
                    ((g1 + g2) + w).to_bits()
                })
                .collect();
            assert_eq!(out, &want, "rank {r} step {k}");
        }
        let calls = run.comm.calls.lock().unwrap().clone();
        // Per step: the forward AllReduce (4 elements), then ONE bucket AllReduce (8).
        let lens: Vec<usize> = calls.iter().map(|c| c.0).collect();
        assert_eq!(lens, [4, 8, 4, 8, 4, 8], "rank {r}");
        assert_eq!(run.comm.overlapping.load(Ordering::SeqCst), 0, "rank {r}");
        let log = run.backend.log.lock().unwrap().clone();
        for (step, bucket) in calls.iter().filter(|c| c.0 == 8).enumerate() {
            let at = |name: &str| {
                log.iter()
                    .filter(|(n, _, _)| n == name)
                    .nth(step)
                    .map(|(_, s, e)| (*s, *e))
                    .unwrap()
            };
            // Compute after the launch ran while the bucket was being reduced ...
            assert!(
                at("work1").0 < bucket.2,
                "rank {r} step {step}: work1 did not start before the bucket finished"
            );
            assert!(at("work3").1 < bucket.2, "rank {r} step {step}");
            // ... and the reader waited for it.
            assert!(at("consumer").0 >= bucket.2, "rank {r} step {step}");
        }
        let g = &run.stats.gradient_comm;
        assert_eq!((g.buckets, g.steps), (1, 3), "rank {r}");
        assert!(g.comm >= delay * 3, "rank {r}: {g:?}");
        assert!(g.hidden_fraction() > 0.0, "rank {r}: {g:?}");
        assert!(g.wait < g.comm, "rank {r}: {g:?}");
        let text = run.stats.to_string();
        assert!(
            text.contains("gradient communication: 1 bucket, "),
            "rank {r}: {text}"
        );
    }
}

#[test]
fn collectives_run_on_the_main_thread_when_nothing_is_in_flight_or_to_overlap() {
    // No work after the bucket's launch: nothing to hide its AllReduce behind.
    let runs = run(2, true, Duration::from_millis(1), Duration::ZERO, 3);
    for (r, run) in runs.iter().enumerate() {
        let threads = run.comm.threads.lock().unwrap().clone();
        // Per step: `f` (4 elements, nothing in flight before it), then the bucket (8).
        assert_eq!(threads.len(), 6, "rank {r}: {threads:?}");
        let on_comm_thread: Vec<(usize, bool)> = threads
            .iter()
            .map(|(len, name)| (*len, name.starts_with("shardc-comm-")))
            .collect();
        // The ordinary one always on the main thread; the bucket on the communication
        // thread in the first step, then, as that step found nothing to overlap it with, on
        // the main thread.
        assert_eq!(
            on_comm_thread,
            [
                (4, false),
                (8, true),
                (4, false),
                (8, false),
                (4, false),
                (8, false)
            ],
            "rank {r}: {threads:?}"
        );
        let g = &run.stats.gradient_comm;
        assert_eq!((g.buckets, g.steps), (1, 3), "rank {r}");
    }
}

#[test]
fn buckets_run_on_the_main_thread_when_the_communicator_cannot_overlap_them() {
    // Work after the launch to hide behind, but a communicator that would take turns with
    // it (shared memory with no spare core): every bucket on the main thread, from the first
    // step, and the same numbers.
    let work = Duration::from_millis(2);
    let inline = run_with(2, true, Duration::from_millis(1), work, 2, false);
    let overlapped = run(2, true, Duration::from_millis(1), work, 2);
    for r in 0..2 {
        let threads = inline[r].comm.threads.lock().unwrap().clone();
        assert_eq!(threads.len(), 4, "rank {r}: {threads:?}");
        assert!(
            threads
                .iter()
                .all(|(_, name)| !name.starts_with("shardc-comm-")),
            "rank {r}: {threads:?}"
        );
        assert_eq!(inline[r].outputs, overlapped[r].outputs, "rank {r}");
        // The overlapping run kept its buckets on the communication thread.
        let threads = overlapped[r].comm.threads.lock().unwrap().clone();
        assert!(
            threads
                .iter()
                .filter(|(len, _)| *len == 8)
                .all(|(_, name)| name.starts_with("shardc-comm-")),
            "rank {r}: {threads:?}"
        );
    }
}

#[test]
fn fused_and_unfused_buckets_give_bit_identical_results_on_four_ranks() {
    let fused = run(4, true, Duration::ZERO, Duration::ZERO, 4);
    let unfused = run(4, false, Duration::ZERO, Duration::ZERO, 4);
    for r in 0..4 {
        assert_eq!(fused[r].outputs, unfused[r].outputs, "rank {r}");
        let lens: Vec<usize> = fused[r]
            .comm
            .calls
            .lock()
            .unwrap()
            .iter()
            .map(|c| c.0)
            .collect();
        assert_eq!(lens, [4, 8].repeat(4), "rank {r}: one AllReduce per bucket");
        let lens: Vec<usize> = unfused[r]
            .comm
            .calls
            .lock()
            .unwrap()
            .iter()
            .map(|c| c.0)
            .collect();
        assert_eq!(lens, [4, 4, 4].repeat(4), "rank {r}");
        assert_eq!(unfused[r].stats.gradient_comm.buckets, 0);
    }
}

#[test]
fn a_failing_bucket_surfaces_at_the_wait_naming_the_node() {
    let comm = InProcessWorld::new(1).remove(0);
    let slow = SlowComm::wrap(comm, Duration::ZERO, Some(8));
    let mut exec =
        Executor::with_communicator(bucket_graph(true), Arc::new(TestBackend), slow.clone())
            .unwrap();
    for step in 0..2 {
        let e = exec.step(&[("x", x_of(0, step))]).unwrap_err();
        match &e {
            RuntimeError::Comm {
                op,
                instance,
                error,
                ..
            } => {
                assert_eq!(*op, OpKind::AllReduce);
                assert_eq!(instance, "grad1", "the first reader's member");
                assert!(matches!(error, CommError::Transport { .. }), "{error}");
            }
            other => panic!("expected a communication error, got {other}"),
        }
        assert!(e.to_string().contains("grad1") && e.to_string().contains("broke"));
    }
    // The executor is still usable: the bucket's buffer came back each time.
    assert_eq!(slow.calls.lock().unwrap().len(), 4);
}

#[test]
fn a_dead_peer_ends_in_the_communicators_timeout() {
    let mut comms = InProcessWorld::with_timeout(2, Duration::from_millis(300));
    let _peer_that_never_steps = comms.pop().unwrap();
    let comm = comms.pop().unwrap();
    // Rank 0's graph with only the bucket (the forward AllReduce would time out first).
    let mut b = Builder::new("Lonely");
    let x = b.input("x", DType::Float64, &[4]);
    let tx = Type::Tensor(b.ty(&x));
    let a = b.op(OpKind::AllReduce, vec![x.clone()], fused(3), tx);
    named(&mut b, &a, "grad_w");
    let out = b.same(OpKind::Add, vec![a, x]);
    let mut exec =
        Executor::with_communicator(b.finish(vec![out]), Arc::new(TestBackend), comm).unwrap();
    let t0 = Instant::now();
    let e = exec.step(&[("x", x_of(0, 0))]).unwrap_err();
    assert!(t0.elapsed() < Duration::from_secs(10));
    match e {
        RuntimeError::Comm {
            instance, error, ..
        } => {
            assert_eq!(instance, "grad_w");
            assert!(
                matches!(error, CommError::Timeout { ref missing, .. } if missing == &[1]),
                "{error}"
            );
        }
        other => panic!("expected a timeout, got {other}"),
    }
}

#[test]
fn malformed_buckets_are_rejected_at_creation() {
    let comm = || InProcessWorld::new(1).remove(0);
    // A reader of a member before the bucket's last member.
    let mut b = Builder::new("Early");
    let x = b.input("x", DType::Float64, &[4]);
    let tx = Type::Tensor(b.ty(&x));
    let a1 = b.op(OpKind::AllReduce, vec![x.clone()], fused(1), tx.clone());
    named(&mut b, &a1, "grad1");
    let early = b.same(OpKind::Add, vec![a1, x.clone()]);
    named(&mut b, &early, "early_reader");
    let a2 = b.op(OpKind::AllReduce, vec![early], fused(1), tx.clone());
    let e = Executor::with_communicator(b.finish(vec![a2]), Arc::new(TestBackend), comm())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("early_reader") && e.contains("before the bucket's last member"),
        "{e}"
    );
    // Members of one bucket with different dtypes.
    let mut b = Builder::new("Mixed");
    let x = b.input("x", DType::Float64, &[4]);
    let y = b.input("y", DType::Float32, &[4]);
    let tx = Type::Tensor(b.ty(&x));
    let ty = Type::Tensor(b.ty(&y));
    let a1 = b.op(OpKind::AllReduce, vec![x], fused(2), tx);
    let a2 = b.op(OpKind::AllReduce, vec![y], fused(2), ty);
    let e = Executor::with_communicator(b.finish(vec![a1, a2]), Arc::new(TestBackend), comm())
        .unwrap_err()
        .to_string();
    assert!(e.contains("fusion 2") && e.contains("differ"), "{e}");
    // A fusion id that is not a number, and a fused op that is not an AllReduce.
    let mut b = Builder::new("BadId");
    let x = b.input("x", DType::Float64, &[4]);
    let tx = Type::Tensor(b.ty(&x));
    let a = b.op(
        OpKind::AllReduce,
        vec![x.clone()],
        Attrs::new().with("fusion", Attr::Str("one".into())),
        tx.clone(),
    );
    let e = Executor::with_communicator(b.finish(vec![a]), Arc::new(TestBackend), comm())
        .unwrap_err()
        .to_string();
    assert!(e.contains("attribute `fusion`") && e.contains("one"), "{e}");
    // Neither a ReduceScatter nor an AllGather along another axis than 0 can be fused.
    for (op, attrs) in [
        (
            OpKind::ReduceScatter,
            Attrs::new().with("op", Attr::Str("sum".into())),
        ),
        (OpKind::AllGather, Attrs::new().with("axis", Attr::Int(1))),
    ] {
        let mut b = Builder::new("Fused");
        let x = b.input("x", DType::Float64, &[4, 2]);
        let a = b.op(
            op,
            vec![x],
            attrs.with("fusion", Attr::Int(1)),
            Type::Tensor(TensorType::new(DType::Float64, vec![4, 2])),
        );
        let e = Executor::with_communicator(b.finish(vec![a]), Arc::new(TestBackend), comm())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("only AllReduce nodes and AllGather nodes along axis 0 can be fused"),
            "{op}: {e}"
        );
    }
}

/// `w1 = x * 2` ([2, 3] per rank) and `w2 = x` gathered along axis 0 over every rank, in one
/// bucket or each on its own; `out = w1 + w2` gathered, of shape [2n, 3].
fn gather_graph(n: usize, fusion: bool) -> Graph {
    let mut b = Builder::new("Gathers");
    let x = b.input("x", DType::Float64, &[2, 3]);
    let w1 = b.same(
        OpKind::Mul,
        vec![x.clone(), Operand::Const(Const::Float(2.0))],
    );
    let whole = Type::Tensor(TensorType::new(DType::Float64, vec![2 * n, 3]));
    let attrs = Attrs::new()
        .with("axis", Attr::Int(0))
        .with("fusion", Attr::Int(i64::from(fusion)));
    let g1 = b.op(OpKind::AllGather, vec![w1], attrs.clone(), whole.clone());
    let g2 = b.op(OpKind::AllGather, vec![x], attrs, whole);
    let out = b.same(OpKind::Add, vec![g1, g2]);
    b.finish(vec![out])
}

/// A parameter-gather bucket (the parallel optimizer's weights, `fusion: k` on AllGathers
/// along axis 0) gives every member exactly what gathering it alone gives, on 3 ranks, with
/// ONE AllGather per bucket on the communication thread.
#[test]
fn a_gather_bucket_gives_what_gathering_each_member_gives() {
    let n = 3;
    let run_gathers = |fusion: bool| -> Vec<(Vec<f64>, usize)> {
        let comms = InProcessWorld::with_timeout(n, Duration::from_secs(20));
        std::thread::scope(|s| {
            let hs: Vec<_> = comms
                .into_iter()
                .map(|c| {
                    s.spawn(move || {
                        let r = c.rank();
                        let x: Vec<f64> = (0..6).map(|i| (r * 10 + i) as f64).collect();
                        let x = Tensor::from_f64(vec![2, 3], x).unwrap();
                        let mut exec = Executor::with_communicator(
                            gather_graph(n, fusion),
                            Arc::new(TestBackend),
                            c,
                        )
                        .unwrap();
                        let out = exec.step(&[("x", x)]).unwrap();
                        (out[0].to_f64_vec(), exec.stats().gradient_comm.buckets)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        })
    };
    let fused = run_gathers(true);
    let alone = run_gathers(false);
    // Rank r's block is x_r * 2 + x_r = 3 x_r, in rank order.
    let want: Vec<f64> = (0..n)
        .flat_map(|r| (0..6).map(move |i| 3.0 * (r * 10 + i) as f64))
        .collect();
    for r in 0..n {
        assert_eq!(fused[r].0, want, "rank {r}, one bucket");
        assert_eq!(alone[r].0, want, "rank {r}, one by one");
        assert_eq!(fused[r].1, 1, "rank {r}: one bucket");
        assert_eq!(alone[r].1, 0, "rank {r}: no bucket unfused");
    }
}
