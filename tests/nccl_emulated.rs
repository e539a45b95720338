//! NCCL's multi-rank paths without a GPU: every rank a thread with its own emulated device,
//! the NCCL calls carried out between them by `EmulatedNccl` (`backends/cuda/src/nccl/
//! emulated.rs`), everything above the calls as on GPUs: a communicator per group with its id
//! handed out over the bootstrap, rearrangements for axes other than 0, AllToAll as grouped
//! sends and receives, gradient buckets on the communication stream, collectives inside
//! recorded and replayed steps. A single GPU cannot host several NCCL ranks, so this is
//! where CI runs those paths with 2 to 4 ranks. Skips with a message where no C++20 compiler
//! is found.

mod device_common;
mod gpu_common;
// `gpu_common::nccl_ranks` annotates its models with the invariant suites' `annotate`.
mod invariant_common;

use gpu_common::nccl_ranks::{
    nccl_ranks_train_as_the_cpu_ranks, on_nccl_ranks, one_rank_buckets_train_as_the_cpu, OpenRank,
};
use shardc::cpu::CpuBackend;
use shardc::cuda::device::Device;
use shardc::cuda::emulator::EmulatedDevice;
use shardc::cuda::nccl::emulated::EmulatedNccl;
use shardc::cuda::nccl::over_host::HostNccl;
use shardc::cuda::nccl::NcclComm;
use shardc::cuda::GpuExecutor;
use shardc::ir::{DType, Graph, ReduceOp, TensorType};
use shardc::runtime::comm::conformance;
use shardc::runtime::executor::CommCall;
use shardc::runtime::{Communicator, Executor, Tensor};
use std::sync::Arc;
use std::time::Duration;

/// Whether the emulator builds here (else the tests skip, saying so).
fn emulator_available() -> bool {
    match EmulatedDevice::new(64) {
        Ok(_) => true,
        Err(e) => {
            eprintln!("SKIP: the kernel emulator cannot be built here: {e}");
            false
        }
    }
}

/// Runs `f` on every rank of a world of `n`, each a thread with its own emulated device and
/// NCCL over it (members wait at most `timeout` for each other); the results by rank.
fn on_emulated_gpus<T: Send>(
    n: usize,
    timeout: Duration,
    f: impl Fn(usize, Arc<dyn Device>, NcclComm) -> Result<T, String> + Sync,
) -> Vec<Result<T, String>> {
    let open = move |_rank: usize, boot: Arc<dyn Communicator>| {
        let dev = Arc::new(EmulatedDevice::new(64).map_err(|e| e.to_string())?);
        let nccl = EmulatedNccl::new(dev.clone()).with_timeout(timeout);
        let comm =
            NcclComm::with_library(dev.clone(), Arc::new(nccl), boot).map_err(|e| e.to_string())?;
        Ok((dev as Arc<dyn Device>, comm))
    };
    let open: OpenRank<'_> = &open;
    on_nccl_ranks(n, open, f)
}

#[test]
fn nccl_on_two_to_four_ranks_passes_the_communicator_conformance_suite() {
    if !emulator_available() {
        return;
    }
    for n in [2, 3, 4] {
        let results = on_emulated_gpus(n, Duration::from_secs(60), |_, _, comm| {
            conformance::run(&comm)
        });
        for (rank, r) in results.into_iter().enumerate() {
            match r {
                Ok(checks) => assert!(checks > 20, "{n} ranks, rank {rank}: {checks} checks"),
                Err(e) => panic!("{n} ranks, rank {rank}: {e}"),
            }
        }
    }
}

#[test]
fn nccl_emulated_over_the_host_communicator_passes_the_conformance_suite() {
    if !emulator_available() {
        return;
    }
    // As launched workers run it: the NCCL calls carried out over the bootstrap itself.
    let open = |_rank: usize, boot: Arc<dyn Communicator>| {
        let dev = Arc::new(EmulatedDevice::new(64).map_err(|e| e.to_string())?);
        let nccl = HostNccl::new(dev.clone(), boot.clone());
        let comm =
            NcclComm::with_library(dev.clone(), Arc::new(nccl), boot).map_err(|e| e.to_string())?;
        Ok((dev as Arc<dyn Device>, comm))
    };
    for n in [2, 3] {
        let results = on_nccl_ranks(n, &open, |_, _, comm| conformance::run(&comm));
        for (rank, r) in results.into_iter().enumerate() {
            match r {
                Ok(checks) => assert!(checks > 20, "{n} ranks, rank {rank}: {checks} checks"),
                Err(e) => panic!("{n} ranks, rank {rank}: {e}"),
            }
        }
    }
}

/// Device buffers of `t` on `dev`.
fn upload(dev: &dyn Device, t: &Tensor) -> u64 {
    let bytes: Vec<u8> = t
        .to_f64_vec()
        .iter()
        .flat_map(|&x| (x as f32).to_le_bytes())
        .collect();
    let p = dev.alloc(bytes.len()).expect("alloc");
    dev.upload(p, &bytes).expect("upload");
    p
}

#[test]
fn members_that_disagree_get_errors_naming_both_calls_instead_of_hanging() {
    if !emulator_available() {
        return;
    }
    // Rank 1 reduces 5 elements where rank 0 reduces 4: NCCL would read past rank 0's buffer
    // or hang; each member gets an error naming both calls.
    let results = on_emulated_gpus(2, Duration::from_secs(20), |rank, dev, comm| {
        let n = 4 + rank;
        let ty = TensorType::new(DType::Float32, vec![n]);
        let x = upload(dev.as_ref(), &Tensor::zeros(&ty));
        let call = CommCall::AllReduce {
            group: vec![0, 1],
            op: ReduceOp::Sum,
        };
        let r = comm.run_on_device(&call, Some((x, &ty)), (x, &ty));
        Ok(r.err().map(|e| e.to_string()).unwrap_or_default())
    });
    for r in results {
        let e = r.expect("the rank ran");
        assert!(
            e.contains("ncclAllReduce of 4 Float32") && e.contains("ncclAllReduce of 5 Float32"),
            "{e}"
        );
    }
    // A send nobody receives: the sender says so once the timeout has passed.
    let results = on_emulated_gpus(2, Duration::from_secs(1), |rank, dev, comm| {
        let ty = TensorType::new(DType::Float32, vec![3]);
        let x = upload(dev.as_ref(), &Tensor::zeros(&ty));
        if rank == 1 {
            return Ok(String::new());
        }
        let call = CommCall::Send { dest: 1, tag: 9 };
        let r = comm.run_on_device(&call, Some((x, &ty)), (x, &ty));
        Ok(r.err().map(|e| e.to_string()).unwrap_or_default())
    });
    let e = results[0].as_ref().expect("rank 0 ran");
    assert!(
        e.contains("ncclSend from rank 0 to rank 1 was never received"),
        "{e}"
    );
}

#[test]
fn members_that_disagree_over_the_host_get_errors_instead_of_hanging() {
    if !emulator_available() {
        return;
    }
    // As launched workers run NCCL on the emulated GPU: rank 1 reduces 5 elements where rank
    // 0 reduces 4; the host communicator refuses the pair on both ranks.
    let boots = shardc::runtime::InProcessWorld::with_timeout(2, Duration::from_secs(20));
    let results: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = boots
            .into_iter()
            .enumerate()
            .map(|(rank, boot)| {
                s.spawn(move || {
                    let boot: Arc<dyn Communicator> = boot;
                    let dev = Arc::new(EmulatedDevice::new(64).expect("device"));
                    let nccl = HostNccl::new(dev.clone(), boot.clone());
                    let comm =
                        NcclComm::with_library(dev.clone(), Arc::new(nccl), boot).expect("joins");
                    let ty = TensorType::new(DType::Float32, vec![4 + rank]);
                    let x = upload(dev.as_ref(), &Tensor::zeros(&ty));
                    let call = CommCall::AllReduce {
                        group: vec![0, 1],
                        op: ReduceOp::Sum,
                    };
                    let r = comm.run_on_device(&call, Some((x, &ty)), (x, &ty));
                    r.err().map(|e| e.to_string()).unwrap_or_default()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("joins"))
            .collect()
    });
    for (rank, e) in results.iter().enumerate() {
        assert!(
            e.contains("ncclAllReduce")
                && e.contains("members disagree")
                && e.contains("<Tensor[Float32], (5)>")
                && e.contains("<Tensor[Float32], (4)>"),
            "rank {rank}: {e}"
        );
    }
}

#[test]
fn a_step_waiting_past_the_timeout_for_a_member_fails_naming_its_collective() {
    if !emulator_available() {
        return;
    }
    // Rank 1 builds its executor (the communicators exist) but never steps: on a GPU, rank
    // 0's AllReduce kernel would wait for ever. The watchdog (0.5 s here, SHARDC_COMM_TIMEOUT
    // in a job) aborts rank 0's communicators long before the emulation's own 60 s bound.
    let text = "%para1_x : <Tensor[Float32], (4)>

subgraph @Sum(%para1_x) {
  %1(total) = AllReduce(%para1_x) {instance name: total} primitive_attrs: {group: (0, 1), op: sum}
  Return(%1)
}";
    let graph = || {
        let mut g = shardc::ir::text::parse_graph(text, "sum.ir").expect("parses");
        shardc::passes::infer::infer_graph(&mut g).expect("types");
        g
    };
    let host = Arc::new(CpuBackend::with_threads(1));
    let done = std::sync::Barrier::new(2);
    let results = on_emulated_gpus(2, Duration::from_secs(60), |rank, dev, comm| {
        let comm = Arc::new(comm.with_timeout(Duration::from_millis(500)));
        let mut e =
            GpuExecutor::with_nccl(graph(), dev, host.clone(), comm).map_err(|e| e.to_string())?;
        let mut errors = Vec::new();
        if rank == 0 {
            let x = Tensor::zeros(&TensorType::new(DType::Float32, vec![4]));
            let start = std::time::Instant::now();
            for _ in 0..2 {
                let e = e.step(&[("x", x.clone())]).err();
                errors.push(e.map(|e| e.to_string()).unwrap_or_default());
            }
            errors.push(format!("{:.1}", start.elapsed().as_secs_f64()));
        }
        done.wait();
        Ok(errors)
    });
    let errors = results[0].as_ref().expect("rank 0 ran");
    assert!(
        errors[0].contains("rank 0 waited more than 500ms (SHARDC_COMM_TIMEOUT)")
            && errors[0].contains("AllReduce 'total' on ranks [0, 1]")
            && errors[0].contains("communicators were aborted"),
        "{errors:?}"
    );
    assert!(
        errors[1].contains("aborted after an earlier wait outlasted 500ms"),
        "{errors:?}"
    );
    let secs: f64 = errors[2].parse().expect("seconds");
    assert!(secs < 30.0, "the steps took {secs} s: {errors:?}");
    assert!(results[1].is_ok(), "{:?}", results[1]);
}

#[test]
fn ranks_on_emulated_gpus_with_nccl_train_as_the_cpu_ranks() {
    if !emulator_available() {
        return;
    }
    // Generous: each rank compiles its graph's fused kernels for the host before its first
    // collective, one compilation at a time in the process, on a loaded 2-core CI machine.
    let open = |_rank: usize, boot: Arc<dyn Communicator>| {
        let dev = Arc::new(EmulatedDevice::new(64).map_err(|e| e.to_string())?);
        let nccl = EmulatedNccl::new(dev.clone()).with_timeout(Duration::from_secs(240));
        let comm =
            NcclComm::with_library(dev.clone(), Arc::new(nccl), boot).map_err(|e| e.to_string())?;
        Ok((dev as Arc<dyn Device>, comm))
    };
    let seen = nccl_ranks_train_as_the_cpu_ranks(4, &open);
    eprintln!("collectives run: {seen:?}");
    for want in [
        "AllReduce fused",
        "AllGather axis 1",
        "ReduceScatter",
        "AlltoAll axis 1",
    ] {
        assert!(
            seen.iter().any(|s| s.starts_with(want)),
            "no {want} in {seen:?}"
        );
    }
}

#[test]
fn one_rank_reduces_its_gradient_buckets_through_nccl_in_replayed_steps() {
    if !emulator_available() {
        return;
    }
    let s = on_emulated_gpus(1, Duration::from_secs(20), |_, dev, comm| {
        Ok(one_rank_buckets_train_as_the_cpu(dev, comm))
    })
    .remove(0)
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(s.contains("3 of 4 steps ran as one replay"), "{s}");
}

/// Rank `rank`'s graph of every communication op among 4 ranks, with a ring of sends and
/// receives (each rank sends to the next and receives from the previous, in that order).
fn every_op_graph(rank: usize) -> Graph {
    let (pair, root) = if rank % 2 == 1 {
        ("1, 3", 3)
    } else {
        ("0, 2", 2)
    };
    let text = format!(
        "%para1_x : <Tensor[Float32], (4)>

subgraph @Every(%para1_x) {{
  %1(g) = AllGather(%para1_x) {{instance name: g}} primitive_attrs: {{rank_list: (0, 1, 2, 3), axis: 0}}
  %2(rs) = ReduceScatter(%1) {{instance name: rs}} primitive_attrs: {{rank_list: (0, 1, 2, 3), op: sum}}
  %3(a) = AlltoAll(%para1_x) {{instance name: a}} primitive_attrs: {{split_dim: 0, concat_dim: 0, split_count: 4, rank_list: (0, 1, 2, 3)}}
  %4(b) = Broadcast(%para1_x) {{instance name: b}} primitive_attrs: {{rank_list: ({pair}), root_rank: {root}}}
  %5(s) = Send(%para1_x) {{instance name: s}} primitive_attrs: {{dest_rank: {next}, sr_tag: 7}}
  %6(r) = Receive() {{instance name: r}} primitive_attrs: {{src_rank: {prev}, sr_tag: 7, shape: (4), dtype: Float32}}
  Return(%1, %2, %3, %4, %5, %6)
}}",
        next = (rank + 1) % 4,
        prev = (rank + 3) % 4,
    );
    let mut g = shardc::ir::text::parse_graph(&text, "every.ir").expect("parses");
    shardc::passes::infer::infer_graph(&mut g).expect("types");
    g
}

#[test]
fn every_communication_op_with_a_ring_of_sends_runs_as_on_the_cpu() {
    if !emulator_available() {
        return;
    }
    let x = |rank: usize| {
        Tensor::from_f32(
            vec![4],
            (0..4).map(|i| (rank * 10 + i) as f32 * 0.37).collect(),
        )
        .expect("x")
    };
    let host = Arc::new(CpuBackend::with_threads(1));
    let cpu: Vec<Vec<Tensor>> = std::thread::scope(|s| {
        let hs: Vec<_> = shardc::runtime::InProcessWorld::new(4)
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
    let gpu = on_emulated_gpus(4, Duration::from_secs(10), |rank, dev, comm| {
        let mut e = GpuExecutor::with_nccl(every_op_graph(rank), dev, host.clone(), Arc::new(comm))
            .map_err(|e| e.to_string())?;
        let mut outs = Vec::new();
        for _ in 0..2 {
            outs = e
                .step(&[("x", x(rank))])
                .map_err(|e| format!("rank {rank}: {e}"))?;
        }
        Ok(outs)
    });
    for (rank, r) in gpu.into_iter().enumerate() {
        let outs = r.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(outs, cpu[rank], "rank {rank}");
    }
}

/// A relay over 3 ranks: rank 0 sends x to rank 1, which passes what it received on to
/// rank 2 (a send reading a receive: not one group).
fn relay_graph(rank: usize) -> Graph {
    let body = match rank {
        0 => "  %1(s) = Send(%para1_x) {instance name: s} primitive_attrs: {dest_rank: 1, sr_tag: 1}\n  Return(%1)",
        1 => "  %1(r) = Receive() {instance name: r} primitive_attrs: {src_rank: 0, sr_tag: 1, shape: (4), dtype: Float32}\n  %2(s) = Send(%1) {instance name: s} primitive_attrs: {dest_rank: 2, sr_tag: 2}\n  %3(t) = Send(%para1_x) {instance name: t} primitive_attrs: {dest_rank: 2, sr_tag: 3}\n  Return(%2, %3)",
        _ => "  %1(r) = Receive() {instance name: r} primitive_attrs: {src_rank: 1, sr_tag: 2, shape: (4), dtype: Float32}\n  %2(q) = Receive() {instance name: q} primitive_attrs: {src_rank: 1, sr_tag: 3, shape: (4), dtype: Float32}\n  Return(%1, %2)",
    };
    let text =
        format!("%para1_x : <Tensor[Float32], (4)>\n\nsubgraph @Relay(%para1_x) {{\n{body}\n}}");
    let mut g = shardc::ir::text::parse_graph(&text, "relay.ir").expect("parses");
    shardc::passes::infer::infer_graph(&mut g).expect("types");
    g
}

#[test]
fn a_relay_of_received_values_runs_as_on_the_cpu() {
    if !emulator_available() {
        return;
    }
    let x = |rank: usize| {
        Tensor::from_f32(vec![4], (0..4).map(|i| (rank * 10 + i) as f32).collect()).expect("x")
    };
    let host = Arc::new(CpuBackend::with_threads(1));
    let gpu = on_emulated_gpus(3, Duration::from_secs(10), |rank, dev, comm| {
        let mut e = GpuExecutor::with_nccl(relay_graph(rank), dev, host.clone(), Arc::new(comm))
            .map_err(|e| e.to_string())?;
        e.step(&[("x", x(rank))])
            .map_err(|e| format!("rank {rank}: {e}"))
    });
    let outs: Vec<Vec<Tensor>> = gpu
        .into_iter()
        .map(|r| r.unwrap_or_else(|e| panic!("{e}")))
        .collect();
    // Rank 2 received rank 0's x through rank 1, then rank 1's own x.
    assert_eq!(outs[2], vec![x(0), x(1)]);
    assert_eq!(outs[1], vec![x(0), x(1)]);
}
