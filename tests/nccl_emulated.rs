//! NCCL's multi-rank paths without a GPU: every rank a thread with its own emulated device,
//! the NCCL calls carried out between them by `EmulatedNccl` (`backends/cuda/src/nccl/
//! emulated.rs`), everything above the calls as on GPUs: a communicator per group with its id
//! handed out over the bootstrap, rearrangements for axes other than 0, AllToAll as grouped
//! sends and receives, gradient buckets on the communication stream, collectives inside
//! recorded and replayed steps. A single GPU cannot host several NCCL ranks, so this is
//! where CI runs those paths with 2 to 4 ranks. Skips with a message where no C++20 compiler
//! is found.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use shardc::compiler::optim::Momentum;
use shardc::compiler::pipeline::{compile, CompileOptions};
use shardc::compiler::transformer::{transformer, TransformerConfig};
use shardc::compiler::zoo;
use shardc::cpu::CpuBackend;
use shardc::cuda::device::Device;
use shardc::cuda::emulator::EmulatedDevice;
use shardc::cuda::nccl::emulated::EmulatedNccl;
use shardc::cuda::nccl::NcclComm;
use shardc::cuda::GpuExecutor;
use shardc::ir::{DType, Graph, OpKind, ReduceOp, TensorLayout, TensorType};
use shardc::passes::parallel::rules::{candidates, dims_of, strategy_from_loops};
use shardc::passes::parallel::{DatasetLayout, Mode, ParallelOptions};
use shardc::runtime::comm::conformance;
use shardc::runtime::data::SyntheticData;
use shardc::runtime::executor::CommCall;
use shardc::runtime::{InProcessWorld, Tensor};
use shardc_tools::in_process::run_ranks;
use std::collections::BTreeSet;
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
    f: impl Fn(usize, Arc<EmulatedDevice>, NcclComm) -> Result<T, String> + Sync,
) -> Vec<Result<T, String>> {
    let boots = InProcessWorld::new(n);
    std::thread::scope(|s| {
        let handles: Vec<_> = boots
            .into_iter()
            .enumerate()
            .map(|(rank, boot)| {
                let f = &f;
                s.spawn(move || {
                    let dev = Arc::new(EmulatedDevice::new(64).map_err(|e| e.to_string())?);
                    let nccl = EmulatedNccl::new(dev.clone()).with_timeout(timeout);
                    let comm = NcclComm::with_library(dev.clone(), Arc::new(nccl), boot)
                        .map_err(|e| format!("rank {rank}: joining NCCL: {e}"))?;
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

/// Device buffers of `t` on `dev`.
fn upload(dev: &EmulatedDevice, t: &Tensor) -> u64 {
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
        let x = upload(&dev, &Tensor::zeros(&ty));
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
        let x = upload(&dev, &Tensor::zeros(&ty));
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

/// Annotates some forward ops of `g` with random valid strategies for `device_num` devices.
fn annotate(rng: &mut ChaCha8Rng, g: &mut Graph, device_num: usize) {
    for i in 0..g.nodes.len() {
        let node = &g.nodes[i];
        if matches!(node.op, OpKind::TupleGetItem | OpKind::Assign) || !rng.random_bool(0.6) {
            continue;
        }
        let Ok(dims) = dims_of(g, node) else { continue };
        let cands = candidates(g, node, &dims, device_num, 4);
        if cands.is_empty() {
            continue;
        }
        let splits = cands[rng.random_range(0..cands.len())].clone();
        g.nodes[i].in_strategy = Some(strategy_from_loops(g, node, &dims, &splits));
    }
}

/// The collectives of a rank graph, as "AllGather axis 1", "AllReduce fused" (a gradient
/// bucket, reduced on the communication stream).
fn collectives(g: &Graph) -> BTreeSet<String> {
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

const STEPS: u64 = 4;

/// Compiles `annotated` for `device_num` ranks, trains the rank graphs [`STEPS`] steps on the
/// CPU (in-process communicator) and on emulated GPUs with NCCL, and compares every output
/// of every step and every weight after the last. Returns the collectives the rank graphs
/// hold, and rank 0's GPU stats.
fn train_both(annotated: Graph, device_num: usize, alltoall: bool) -> (BTreeSet<String>, String) {
    let opt = Momentum::new(0.05, 0.9).to_spec();
    let par = compile(
        annotated,
        &CompileOptions {
            optimizer: Some(opt),
            parallel: Some(ParallelOptions {
                mode: Mode::SemiAutoParallel,
                device_num,
                dataset: DatasetLayout::DataParallel,
                gradients_mean: true,
                enable_alltoall: alltoall,
                search: Default::default(),
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
    let gpu = on_emulated_gpus(device_num, Duration::from_secs(60), |rank, dev, comm| {
        let dev: Arc<dyn Device> = dev;
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
                let d = shardc_tools::in_process::tensor_rel(y, x);
                assert!(
                    d <= 1e-5,
                    "rank {rank}, step {}, output {i}: differs by {d:.2e}\n{summary}",
                    step + 1
                );
            }
        }
        for (name, t) in &w {
            let (_, c) = cpu.weights[rank]
                .iter()
                .find(|(n, _)| n == name)
                .unwrap_or_else(|| panic!("the CPU rank {rank} has {name}"));
            let d = shardc_tools::in_process::tensor_rel(t, c);
            assert!(d <= 1e-5, "rank {rank}: weight {name} differs by {d:.2e}");
        }
    }
    (found, summary)
}

#[test]
fn ranks_on_emulated_gpus_with_nccl_train_as_the_cpu_ranks() {
    if !emulator_available() {
        return;
    }
    let mut seen = BTreeSet::new();
    // Data parallel: one bucket of every gradient, reduced on the communication stream.
    let (found, s) = train_both(zoo::mlp(8, &[12, 16, 16, 4]).expect("mlp"), 4, false);
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
    // Model parallel with random strategies: gathers and scatters along other axes.
    for seed in 0..3u64 {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut g = if seed == 2 {
            transformer(&TransformerConfig::new(1, 8, 2, 4, 4).ffn(16)).expect("transformer")
        } else {
            zoo::mlp(8, &[12, 16, 16, 4]).expect("mlp")
        };
        annotate(&mut rng, &mut g, 4);
        let (found, _) = train_both(g, 4, seed == 1);
        seen.extend(found);
    }
    eprintln!("collectives run: {seen:?}");
    for want in [
        "AllReduce",
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
