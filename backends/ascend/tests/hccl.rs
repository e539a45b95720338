//! HCCL on the emulator: the runtime's communicator conformance suite across threads of one
//! process (rank r on emulated device r, bootstrapped over the in-process world), and the
//! executor's collectives natively on device buffers against the staged path.

mod common;

use shardc_backend_ascend::HcclComm;
use shardc_runtime::comm::conformance;
use shardc_runtime::{Communicator, InProcessWorld};
use std::sync::Arc;

/// Runs `f` on every rank of a world of `n` (a thread each, device = rank, HCCL over the
/// in-process world); the results by rank.
fn on_ranks<T: Send>(
    n: usize,
    f: impl Fn(usize, HcclComm) -> Result<T, String> + Sync,
) -> Vec<Result<T, String>> {
    common::use_emulator();
    let world = InProcessWorld::new(n);
    std::thread::scope(|s| {
        let hs: Vec<_> = world
            .into_iter()
            .enumerate()
            .map(|(rank, boot)| {
                let f = &f;
                s.spawn(move || {
                    let dev = shardc_backend_ascend::AscendDevice::open(rank)
                        .map_err(|e| e.to_string())?;
                    let comm = HcclComm::new(dev, boot).map_err(|e| e.to_string())?;
                    f(rank, comm)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("the rank panicked".into())))
            .collect()
    })
}

#[test]
fn hccl_on_one_to_four_ranks_passes_the_communicator_conformance_suite() {
    for n in [1, 2, 3, 4] {
        let results = on_ranks(n, |_, comm| conformance::run(&comm));
        for (rank, r) in results.into_iter().enumerate() {
            match r {
                Ok(checks) => assert!(checks > 20, "{n} ranks, rank {rank}: {checks} checks"),
                Err(e) => panic!("{n} ranks, rank {rank}: {e}"),
            }
        }
    }
}

#[test]
fn a_communicator_reports_its_rank_and_size() {
    let results = on_ranks(2, |rank, comm| {
        Ok((rank, comm.rank(), comm.size(), Arc::new(comm).device().id()))
    });
    for r in results {
        let (rank, r2, size, dev) = r.expect("rank");
        assert_eq!((rank, size, dev), (r2, 2, rank));
    }
}

use shardc_backend_ascend::AscendExecutor;
use shardc_backend_cpu::CpuBackend;
use shardc_ir::{Graph, OpKind};
use shardc_runtime::{Executor, Tensor};

/// Rank `rank`'s graph of every collective among 4 ranks (axes 0 and 1, sub-groups); the
/// sends and receives are [`ring_graph`]'s.
fn every_op_graph(rank: usize) -> Graph {
    let (pair, root) = if rank % 2 == 1 {
        ("1, 3", 3)
    } else {
        ("0, 2", 2)
    };
    let text = format!(
        "%para1_x : <Tensor[Float32], (4, 2)>

subgraph @Every(%para1_x) {{
  %1(g) = AllGather(%para1_x) {{instance name: g}} primitive_attrs: {{rank_list: (0, 1, 2, 3), axis: 0}}
  %2(rs) = ReduceScatter(%1) {{instance name: rs}} primitive_attrs: {{rank_list: (0, 1, 2, 3), op: sum}}
  %3(a) = AlltoAll(%para1_x) {{instance name: a}} primitive_attrs: {{split_dim: 0, concat_dim: 1, split_count: 4, rank_list: (0, 1, 2, 3)}}
  %4(b) = Broadcast(%para1_x) {{instance name: b}} primitive_attrs: {{rank_list: ({pair}), root_rank: {root}}}
  %5(g1) = AllGather(%para1_x) {{instance name: g1}} primitive_attrs: {{rank_list: (0, 1, 2, 3), axis: 1}}
  %6(r1) = ReduceScatter(%5) {{instance name: r1}} primitive_attrs: {{rank_list: (0, 1, 2, 3), op: sum, axis: 1}}
  %7(ar) = AllReduce(%para1_x) {{instance name: ar}} primitive_attrs: {{group: ({pair}), op: max}}
  Return(%1, %2, %3, %4, %5, %6, %7)
}}",
    );
    let mut g = shardc_ir::text::parse_graph(&text, "every.ir").expect("parses");
    shardc_passes::infer::infer_graph(&mut g).expect("types");
    g
}

#[test]
fn every_collective_runs_natively_as_on_the_cpu() {
    let x = |rank: usize| {
        Tensor::from_f32(
            vec![4, 2],
            (0..8).map(|i| (rank * 10 + i) as f32 * 0.37).collect(),
        )
        .expect("x")
    };
    let host = Arc::new(CpuBackend::with_threads(1));
    let cpu: Vec<Vec<Tensor>> = std::thread::scope(|s| {
        let hs: Vec<_> = InProcessWorld::new(4)
            .into_iter()
            .enumerate()
            .map(|(rank, comm)| {
                let host = host.clone();
                s.spawn(move || {
                    let mut e = Executor::with_communicator(every_op_graph(rank), host, comm)
                        .expect("cpu executor");
                    e.step(&[("x", x(rank))]).expect("cpu step")
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("joins")).collect()
    });
    let asc = on_ranks(4, |rank, comm| {
        let dev = comm.device().clone();
        let mut e =
            AscendExecutor::with_hccl(every_op_graph(rank), dev, host.clone(), Arc::new(comm))
                .map_err(|e| e.to_string())?;
        let mut outs = Vec::new();
        for _ in 0..2 {
            outs = e
                .step(&[("x", x(rank))])
                .map_err(|e| format!("rank {rank}: {e}"))?;
        }
        Ok(outs)
    });
    for (rank, r) in asc.into_iter().enumerate() {
        let outs = r.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(outs, cpu[rank], "rank {rank}");
    }
}

/// The per-rank graphs of a data-parallel MLP training step over 2 ranks (gradient buckets:
/// fused AllReduces).
fn data_parallel_graphs() -> Vec<Graph> {
    data_parallel_graphs_on(2, false)
}

/// The per-rank graphs of a data-parallel MLP training step over `n` ranks; with `zero`, the
/// parallel optimizer splits every weight (parameter-gather buckets: fused AllGathers at the
/// start of the step, and ReduceScatters of the gradients).
fn data_parallel_graphs_on(n: usize, zero: bool) -> Vec<Graph> {
    use shardc_compiler::optim::Momentum;
    use shardc_compiler::pipeline::{compile, CompileOptions};
    use shardc_passes::parallel::{DatasetLayout, Mode, ParallelOptimizer, ParallelOptions};
    let par = compile(
        shardc_compiler::zoo::mlp(8, &[12, 16, 16, 4]).expect("mlp"),
        &CompileOptions {
            optimizer: Some(Momentum::new(0.05, 0.9).to_spec()),
            parallel: Some(ParallelOptions {
                mode: Mode::DataParallel,
                device_num: n,
                dataset: DatasetLayout::DataParallel,
                gradients_mean: true,
                enable_alltoall: false,
                search: Default::default(),
                parallel_optimizer: zero.then_some(ParallelOptimizer {
                    threshold_kb: 0,
                    ..ParallelOptimizer::DEFAULT
                }),
            }),
            ..Default::default()
        },
    )
    .expect("compiles")
    .parallel
    .expect("per-rank graphs");
    par.ranks
}

#[test]
fn data_parallel_ranks_reduce_their_gradient_buckets_through_hccl_as_the_cpu_ranks() {
    for n in [2, 8] {
        data_parallel_ranks_train_as_the_cpu_ranks(n, false);
    }
    // The parallel optimizer: weight gathers bucketed on HCCL's stream at the step's start.
    data_parallel_ranks_train_as_the_cpu_ranks(2, true);
}

fn data_parallel_ranks_train_as_the_cpu_ranks(n: usize, zero: bool) {
    use shardc_runtime::data::synthetic::SyntheticData;
    let graphs = data_parallel_graphs_on(n, zero);
    let fused = |op: OpKind| {
        graphs[0]
            .nodes
            .iter()
            .filter(|n| n.op == op && n.attrs.int_or("fusion", 0) > 0)
            .count()
    };
    if zero {
        assert!(fused(OpKind::AllGather) > 0, "no parameter-gather bucket");
    } else {
        assert!(
            fused(OpKind::AllReduce) > 0,
            "no gradient bucket in the graph"
        );
    }
    let host = Arc::new(CpuBackend::with_threads(1));
    const STEPS: u64 = 3;
    let run_cpu = |rank: usize, comm: Arc<dyn Communicator>| {
        let g = graphs[rank].clone();
        let data = SyntheticData::new(&g, 5, STEPS as usize).expect("data");
        let mut e = Executor::with_communicator(g, host.clone(), comm).expect("cpu executor");
        let mut outs = Vec::new();
        for s in 0..STEPS {
            outs.push(e.step(&data.feeds(s)).expect("cpu step"));
        }
        let w: Vec<(String, Tensor)> = e
            .weights()
            .map(|(n, t)| (n.to_string(), t.clone()))
            .collect();
        (outs, w)
    };
    let cpu: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = InProcessWorld::new(n)
            .into_iter()
            .enumerate()
            .map(|(rank, comm)| {
                let run_cpu = &run_cpu;
                s.spawn(move || run_cpu(rank, comm))
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("joins")).collect()
    });
    let asc = on_ranks(n, |rank, comm| {
        let g = graphs[rank].clone();
        let data = SyntheticData::new(&g, 5, STEPS as usize).expect("data");
        let dev = comm.device().clone();
        let mut e = AscendExecutor::with_hccl(g, dev, host.clone(), Arc::new(comm))
            .map_err(|e| e.to_string())?;
        let mut outs = Vec::new();
        for s in 0..STEPS {
            outs.push(
                e.step(&data.feeds(s))
                    .map_err(|e| format!("rank {rank}: {e}"))?,
            );
        }
        let w = e.weights().map_err(|e| e.to_string())?;
        Ok((outs, w, e.stats().summary()))
    });
    for (rank, r) in asc.into_iter().enumerate() {
        let (outs, weights, summary) = r.unwrap_or_else(|e| panic!("{e}"));
        for (s, (a, b)) in cpu[rank].0.iter().zip(&outs).enumerate() {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                if let Err(e) = common::close(x, y, 1e-5) {
                    panic!("{n} ranks: rank {rank}, step {s}, output {i}: {e}");
                }
            }
        }
        for ((n, a), (m, b)) in cpu[rank].1.iter().zip(&weights) {
            assert_eq!(n, m);
            if let Err(e) = common::close(a, b, 1e-5) {
                panic!("rank {rank}, weight {n}: {e}");
            }
        }
        assert!(!summary.contains("host: MatMul"), "{summary}");
    }
}

/// A ring of sends and receives over `n` ranks (each sends to the next, then receives from
/// the previous): one HCCL batch per rank.
fn ring_graph(rank: usize, n: usize) -> Graph {
    let text = format!(
        "%para1_x : <Tensor[Float32], (4, 2)>

subgraph @Ring(%para1_x) {{
  %1(s) = Send(%para1_x) {{instance name: s}} primitive_attrs: {{dest_rank: {next}, sr_tag: 7}}
  %2(r) = Receive() {{instance name: r}} primitive_attrs: {{src_rank: {prev}, sr_tag: 7, shape: (4, 2), dtype: Float32}}
  Return(%1, %2)
}}",
        next = (rank + 1) % n,
        prev = (rank + n - 1) % n,
    );
    let mut g = shardc_ir::text::parse_graph(&text, "ring.ir").expect("parses");
    shardc_passes::infer::infer_graph(&mut g).expect("types");
    g
}

#[test]
fn a_ring_of_sends_and_receives_runs_as_one_batch_per_rank() {
    let host = Arc::new(CpuBackend::with_threads(1));
    let n = 3;
    let x = |rank: usize| Tensor::from_f32(vec![4, 2], vec![rank as f32; 8]).expect("x");
    let asc = on_ranks(n, |rank, comm| {
        let dev = comm.device().clone();
        let mut e =
            AscendExecutor::with_hccl(ring_graph(rank, n), dev, host.clone(), Arc::new(comm))
                .map_err(|e| e.to_string())?;
        e.step(&[("x", x(rank))])
            .map_err(|e| format!("rank {rank}: {e}"))
    });
    for (rank, r) in asc.into_iter().enumerate() {
        let outs = r.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(outs[0], x(rank));
        assert_eq!(outs[1], x((rank + n - 1) % n), "rank {rank}");
    }
}

#[test]
fn every_collective_staged_through_the_host_runs_as_on_the_cpu() {
    let x = |rank: usize| {
        Tensor::from_f32(
            vec![4, 2],
            (0..8).map(|i| (rank * 10 + i) as f32 * 0.37).collect(),
        )
        .expect("x")
    };
    common::use_emulator();
    let host = Arc::new(CpuBackend::with_threads(1));
    let run = |staged: bool| -> Vec<Vec<Tensor>> {
        std::thread::scope(|s| {
            let hs: Vec<_> = InProcessWorld::new(4)
                .into_iter()
                .enumerate()
                .map(|(rank, comm)| {
                    let host = host.clone();
                    s.spawn(move || {
                        if staged {
                            let dev =
                                shardc_backend_ascend::AscendDevice::open(rank).expect("device");
                            let mut e = AscendExecutor::with_communicator(
                                every_op_graph(rank),
                                dev,
                                host,
                                comm,
                            )
                            .expect("ascend executor");
                            e.step(&[("x", x(rank))]).expect("ascend step")
                        } else {
                            let mut e =
                                Executor::with_communicator(every_op_graph(rank), host, comm)
                                    .expect("cpu executor");
                            e.step(&[("x", x(rank))]).expect("cpu step")
                        }
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().expect("joins")).collect()
        })
    };
    assert_eq!(run(true), run(false));
}

#[test]
fn ranks_agree_on_hccl_and_build_their_executors_through_it() {
    common::use_emulator();
    let graphs = data_parallel_graphs();
    let host = Arc::new(CpuBackend::with_threads(1));
    let summaries: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = InProcessWorld::new(2)
            .into_iter()
            .enumerate()
            .map(|(rank, comm)| {
                let (g, host) = (graphs[rank].clone(), host.clone());
                s.spawn(move || {
                    let data = shardc_runtime::data::synthetic::SyntheticData::new(&g, 5, 1)
                        .expect("data");
                    let mut e = shardc_backend_ascend::ascend_executor(
                        g,
                        host,
                        Some(comm),
                        true,
                        None,
                        Some(rank),
                    )
                    .expect("executor");
                    e.step(&data.feeds(0)).expect("step");
                    assert_eq!(e.device().id(), rank);
                    e.stats().summary()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("joins")).collect()
    });
    for s in summaries {
        assert!(
            s.contains("collectives") && !s.contains("host: MatMul"),
            "{s}"
        );
    }
}

/// A relay over 3 ranks: rank 0 sends x to rank 1, which passes what it received on to rank 2
/// (a send reading a receive: HcclSend / HcclRecv one by one), then sends its own x (the two
/// sends one batch, as rank 2's two receives).
fn relay_graph(rank: usize) -> Graph {
    let body = match rank {
        0 => "  %1(s) = Send(%para1_x) {instance name: s} primitive_attrs: {dest_rank: 1, sr_tag: 1}\n  Return(%1)",
        1 => "  %1(r) = Receive() {instance name: r} primitive_attrs: {src_rank: 0, sr_tag: 1, shape: (4), dtype: Float32}\n  %2(s) = Send(%1) {instance name: s} primitive_attrs: {dest_rank: 2, sr_tag: 2}\n  %3(t) = Send(%para1_x) {instance name: t} primitive_attrs: {dest_rank: 2, sr_tag: 3}\n  Return(%2, %3)",
        _ => "  %1(r) = Receive() {instance name: r} primitive_attrs: {src_rank: 1, sr_tag: 2, shape: (4), dtype: Float32}\n  %2(q) = Receive() {instance name: q} primitive_attrs: {src_rank: 1, sr_tag: 3, shape: (4), dtype: Float32}\n  Return(%1, %2)",
    };
    let text =
        format!("%para1_x : <Tensor[Float32], (4)>\n\nsubgraph @Relay(%para1_x) {{\n{body}\n}}");
    let mut g = shardc_ir::text::parse_graph(&text, "relay.ir").expect("parses");
    shardc_passes::infer::infer_graph(&mut g).expect("types");
    g
}

#[test]
fn a_relay_of_received_values_runs_as_on_the_cpu() {
    let x = |rank: usize| {
        Tensor::from_f32(vec![4], (0..4).map(|i| (rank * 10 + i) as f32).collect()).expect("x")
    };
    let host = Arc::new(CpuBackend::with_threads(1));
    let asc = on_ranks(3, |rank, comm| {
        let dev = comm.device().clone();
        let mut e = AscendExecutor::with_hccl(relay_graph(rank), dev, host.clone(), Arc::new(comm))
            .map_err(|e| e.to_string())?;
        e.step(&[("x", x(rank))])
            .map_err(|e| format!("rank {rank}: {e}"))
    });
    let outs: Vec<Vec<Tensor>> = asc
        .into_iter()
        .map(|r| r.unwrap_or_else(|e| panic!("{e}")))
        .collect();
    // Rank 2 received rank 0's x through rank 1, then rank 1's own x.
    assert_eq!(outs[2], vec![x(0), x(1)]);
    assert_eq!(outs[1], vec![x(0), x(1)]);
}

#[test]
fn members_whose_device_collectives_disagree_get_errors_instead_of_hanging() {
    use shardc_ir::{DType, ReduceOp, TensorType};
    use shardc_runtime::executor::CommCall;
    // Rank 1 reduces 5 elements where rank 0 reduces 4: each member's stream fails with an
    // error (the emulated HCCL compares the members' calls), well before the timeout.
    let results = on_ranks(2, |rank, comm| {
        let dev = comm.device().clone();
        let ty = TensorType::new(DType::Float32, vec![4 + rank]);
        let x = dev.malloc(ty.size_bytes()).map_err(|e| e.to_string())?;
        dev.upload(x, &Tensor::zeros(&ty).to_le_bytes())
            .map_err(|e| e.to_string())?;
        let call = CommCall::AllReduce {
            group: vec![0, 1],
            op: ReduceOp::Sum,
        };
        let start = std::time::Instant::now();
        let r = comm
            .run_on_device(&call, Some((x, &ty)), (x, &ty))
            .and_then(|_| dev.synchronize());
        Ok((
            r.err().map(|e| e.to_string()).unwrap_or_default(),
            start.elapsed().as_secs_f64(),
        ))
    });
    for (rank, r) in results.into_iter().enumerate() {
        let (e, secs) = r.expect("the rank ran");
        assert!(e.contains("disagree"), "rank {rank}: {e}");
        assert!(secs < 30.0, "rank {rank} waited {secs} s: {e}");
    }
}
