//! Several ranks with NCCL, each a thread with its own device (emulated, or a GPU each), and
//! their training steps against the same rank graphs on the CPU (`tests/nccl_emulated.rs`,
//! and `tests/cuda_gpu.rs` on a machine with several GPUs).

use super::*;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use shardc::compiler::optim::Momentum;
use shardc::compiler::pipeline::{compile, CompileOptions};
use shardc::compiler::transformer::{transformer, TransformerConfig};
use shardc::compiler::zoo;
use shardc::cuda::nccl::NcclComm;
use shardc::ir::{OpKind, TensorLayout};
use shardc::passes::parallel::{DatasetLayout, Mode, ParallelOptimizer, ParallelOptions};
use shardc::runtime::data::synthetic::SyntheticData;
use shardc::runtime::{Communicator, InProcessWorld};
use shardc::runtime::{Executor, Tensor};
use shardc_tools::in_process::run_ranks;
use std::collections::BTreeSet;

/// Opens rank `rank`'s device and joins NCCL over the bootstrap communicator.
pub type OpenRank<'a> = &'a (dyn Fn(usize, Arc<dyn Communicator>) -> Result<(Arc<dyn Device>, NcclComm), String>
         + Sync);

/// Runs `f` on every rank of a world of `n`, each a thread with the device and NCCL `open`
/// gives it; the results by rank.
pub fn on_nccl_ranks<T: Send>(
    n: usize,
    open: OpenRank<'_>,
    f: impl Fn(usize, Arc<dyn Device>, NcclComm) -> Result<T, String> + Sync,
) -> Vec<Result<T, String>> {
    let boots = InProcessWorld::new(n);
    std::thread::scope(|s| {
        let handles: Vec<_> = boots
            .into_iter()
            .enumerate()
            .map(|(rank, boot)| {
                let f = &f;
                s.spawn(move || {
                    let boot: Arc<dyn Communicator> = boot;
                    let (dev, comm) =
                        open(rank, boot).map_err(|e| format!("rank {rank}: opening: {e}"))?;
                    f(rank, dev, comm)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a rank panicked".into())))
            .collect()
    })
}

/// The collectives of a rank graph, as "AllGather axis 1", "AllReduce fused" (a gradient
/// bucket, reduced on the communication stream).
pub fn collectives(g: &Graph) -> BTreeSet<String> {
    g.nodes
        .iter()
        .filter(|n| n.op.is_communication())
        .map(|n| {
            let axis = ["axis", "split_dim"]
                .iter()
                .find_map(|a| n.attrs.get(a).and_then(|v| v.as_int()))
                .map(|a| format!(" axis {}", a.min(1)))
                .unwrap_or_default();
            let fused = if n.attrs.int_or("fusion", 0) > 0 {
                " fused"
            } else {
                ""
            };
            format!("{}{axis}{fused}", n.op)
        })
        .collect()
}

/// Steps each case trains.
pub const STEPS: u64 = 4;

/// Compiles `annotated` for `device_num` ranks, trains the rank graphs [`STEPS`] steps on the
/// CPU (in-process communicator) and on emulated GPUs with NCCL, and compares every output
/// of every step and every weight after the last. Returns the collectives the rank graphs
/// hold, and rank 0's GPU stats.
pub fn train_both(
    annotated: Graph,
    device_num: usize,
    mode: Mode,
    alltoall: bool,
    open: OpenRank<'_>,
) -> (BTreeSet<String>, String) {
    train_both_with(annotated, device_num, (mode, alltoall, None), open)
}

/// [`train_both`] with the parallel optimizer `zero` (`None`: off).
pub fn train_both_with(
    annotated: Graph,
    device_num: usize,
    (mode, alltoall, zero): (Mode, bool, Option<ParallelOptimizer>),
    open: OpenRank<'_>,
) -> (BTreeSet<String>, String) {
    let opt = Momentum::new(0.05, 0.9).to_spec();
    let par = compile(
        annotated,
        &CompileOptions {
            optimizer: Some(opt),
            parallel: Some(ParallelOptions {
                mode,
                device_num,
                dataset: DatasetLayout::DataParallel,
                gradients_mean: true,
                enable_alltoall: alltoall,
                search: Default::default(),
                parallel_optimizer: zero,
            }),
            ..Default::default()
        },
    )
    .expect("compiles")
    .parallel
    .expect("per-rank graphs");
    let found = collectives(&par.ranks[0]);
    let data = SyntheticData::new(&par.begin, 3, STEPS as usize).expect("data");
    let weights: BTreeSet<&str> = par
        .begin
        .params
        .iter()
        .filter(|p| p.is_weight())
        .map(|p| p.name.as_str())
        .collect();
    let inputs: Vec<(String, TensorLayout)> = par
        .begin
        .params
        .iter()
        .zip(&par.assignment.param_layouts)
        .filter(|(p, _)| !weights.contains(p.name.as_str()) && !p.name.contains('.'))
        .map(|(p, l)| (p.name.clone(), l.clone()))
        .collect();
    let feeds = |step: u64| -> Vec<(String, Tensor)> {
        data.feeds(step)
            .into_iter()
            .filter(|(n, _)| inputs.iter().any(|(m, _)| m == n))
            .map(|(n, t)| (n.to_string(), t))
            .collect()
    };
    let cpu = run_ranks(par.ranks.clone(), &inputs, &feeds, STEPS, 1).expect("the CPU ranks run");
    let graphs = par.ranks.clone();
    let gpu = on_nccl_ranks(device_num, open, |rank, dev, comm| {
        let host = Arc::new(CpuBackend::with_threads(1));
        let mut exec = GpuExecutor::with_nccl(graphs[rank].clone(), dev, host, Arc::new(comm))
            .map_err(|e| format!("rank {rank}: {e}"))?;
        let mut outs = Vec::new();
        for step in 0..STEPS {
            let mut block = Vec::new();
            for (name, t) in feeds(step) {
                let layout = &inputs.iter().find(|(m, _)| *m == name).expect("layout").1;
                block.push((
                    name,
                    t.block(&layout.block(rank)).expect("the rank's block"),
                ));
            }
            let refs: Vec<(&str, Tensor)> =
                block.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
            outs.push(
                exec.step(&refs)
                    .map_err(|e| format!("rank {rank}, step {}: {e}", step + 1))?,
            );
        }
        let w = exec.weights().map_err(|e| e.to_string())?;
        Ok((outs, w, exec.stats().summary()))
    });
    let mut summary = String::new();
    for (rank, r) in gpu.into_iter().enumerate() {
        let (outs, w, s) = r.unwrap_or_else(|e| panic!("{e}"));
        if rank == 0 {
            summary = s;
        }
        for (step, (a, b)) in cpu.outputs[rank].iter().zip(&outs).enumerate() {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                if let Err(e) = close(y, x, 1e-5) {
                    panic!("rank {rank}, step {}, output {i}: {e}\n{summary}", step + 1);
                }
            }
        }
        for (name, t) in &w {
            let (_, c) = cpu.weights[rank]
                .iter()
                .find(|(n, _)| n == name)
                .unwrap_or_else(|| panic!("the CPU rank {rank} has {name}"));
            // As the GPU suites compare: relative to max(|x|, 1) (a bias block of 6e-5 kept
            // 4e-9 of rounding from another summation order, 4e-5 of its own size).
            if let Err(e) = close(t, c, 1e-5) {
                panic!("rank {rank}: weight {name}: {e}");
            }
        }
    }
    (found, summary)
}

/// Trains on `device_num` NCCL ranks as the CPU ranks: data parallel (a gradient bucket on
/// the communication stream, replayed steps), then random strategies of an MLP, a
/// transformer and LeNet. Returns the collectives the rank graphs held.
pub fn nccl_ranks_train_as_the_cpu_ranks(
    device_num: usize,
    open: OpenRank<'_>,
) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    // Data parallel: one bucket of every gradient, reduced on the communication stream.
    let (found, s) = train_both(
        zoo::mlp(8, &[12, 16, 16, 4]).expect("mlp"),
        device_num,
        Mode::DataParallel,
        false,
        open,
    );
    assert!(found.contains("AllReduce"), "{found:?}");
    assert!(
        found.contains("AllReduce fused"),
        "no gradient bucket: {found:?}"
    );
    assert!(
        s.contains(&format!("{} of {STEPS} steps ran as one replay", STEPS - 1)),
        "{s}"
    );
    seen.extend(found);
    // The parallel optimizer: every weight split, its gathers bucketed on the communication
    // stream at the step's start, its gradients reduce-scattered.
    let zero = ParallelOptimizer {
        threshold_kb: 0,
        ..ParallelOptimizer::DEFAULT
    };
    let (found, s) = train_both_with(
        zoo::mlp(8, &[12, 16, 16, 4]).expect("mlp"),
        device_num,
        (Mode::DataParallel, false, Some(zero)),
        open,
    );
    assert!(
        found.contains("AllGather axis 0 fused") && found.contains("ReduceScatter axis 0"),
        "no parameter-gather bucket or gradient reduce-scatter: {found:?}"
    );
    assert!(
        s.contains(&format!("{} of {STEPS} steps ran as one replay", STEPS - 1)),
        "{s}"
    );
    seen.extend(found);
    // Model parallel with random strategies: gathers and scatters along other axes.
    for seed in 0..4u64 {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut g = match seed {
            2 => transformer(&TransformerConfig::new(1, 8, 2, 4, 4).ffn(16)).expect("transformer"),
            3 => zoo::lenet(8).expect("lenet"),
            _ => zoo::mlp(8, &[12, 16, 16, 4]).expect("mlp"),
        };
        crate::invariant_common::annotate(&mut rng, &mut g, device_num, 0.6);
        let (found, s) = train_both(g, device_num, Mode::SemiAutoParallel, seed == 1, open);
        // Rearranged collectives (other axes, AlltoAll) work in the executor's scratch
        // memory: the steps replay too.
        assert!(
            s.contains(&format!("{} of {STEPS} steps ran as one replay", STEPS - 1)),
            "seed {seed}: {s}"
        );
        seen.extend(found);
    }
    seen
}

/// Rank 0's training step of an MLP compiled data parallel for 2 devices, with every
/// collective's group narrowed to rank 0 alone: a graph one rank runs with NCCL, so that a
/// single GPU runs the gradient buckets through NCCL on the communication stream (the events
/// that order it, and steps recorded with NCCL in them), which otherwise needs two GPUs.
pub fn one_rank_bucket_graph() -> Graph {
    let par = compile(
        zoo::mlp(8, &[12, 16, 16, 4]).expect("mlp"),
        &CompileOptions {
            optimizer: Some(Momentum::new(0.05, 0.9).to_spec()),
            parallel: Some(ParallelOptions {
                mode: Mode::DataParallel,
                device_num: 2,
                dataset: DatasetLayout::DataParallel,
                gradients_mean: true,
                enable_alltoall: false,
                search: Default::default(),
                parallel_optimizer: None,
            }),
            ..Default::default()
        },
    )
    .expect("compiles")
    .parallel
    .expect("per-rank graphs");
    let mut g = par.ranks[0].clone();
    for n in g.nodes.iter_mut().filter(|n| n.op.is_communication()) {
        n.attrs.set("rank_list", shardc::ir::Attr::ints(&[0]));
    }
    g
}

/// Trains [`one_rank_bucket_graph`] [`STEPS`] steps on the CPU (a world of one) and on `dev`
/// with `comm` (one rank); compares every output and weight to 1e-5 and returns the device's
/// stats summary, which must say that the buckets were reduced and the steps replayed.
pub fn one_rank_buckets_train_as_the_cpu(dev: Arc<dyn Device>, comm: NcclComm) -> String {
    let g = one_rank_bucket_graph();
    let buckets = g
        .nodes
        .iter()
        .filter(|n| n.op == OpKind::AllReduce && n.attrs.int_or("fusion", 0) > 0)
        .count();
    assert!(buckets > 0, "no gradient bucket in the graph");
    let data = SyntheticData::new(&g, 5, STEPS as usize).expect("data");
    let host = Arc::new(CpuBackend::with_threads(1));
    let world: Arc<dyn Communicator> = InProcessWorld::new(1).remove(0);
    let mut cpu = Executor::with_communicator(g.clone(), host.clone(), world).expect("cpu");
    let mut gpu = GpuExecutor::with_nccl(g.clone(), dev, host, Arc::new(comm)).expect("gpu");
    for step in 0..STEPS {
        let feeds = data.feeds(step);
        let a = cpu.step(&feeds).expect("cpu step");
        let b = gpu.step(&feeds).expect("gpu step");
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            if let Err(e) = close(y, x, 1e-5) {
                panic!("step {}, output {i}: {e}", step + 1);
            }
        }
    }
    for (name, w) in gpu.weights().expect("weights") {
        if let Err(e) = close(&w, cpu.param(&name).expect("the CPU has it"), 1e-5) {
            panic!("weight {name}: {e}");
        }
    }
    let s = gpu.stats().summary();
    assert!(s.contains("collectives"), "{s}");
    s
}
