//! NCCL's multi-rank paths without a GPU: every rank a thread with its own emulated device,
//! the NCCL calls carried out between them by `EmulatedNccl` (`backends/cuda/src/nccl/
//! emulated.rs`), everything above the calls as on GPUs: a communicator per group with its id
//! handed out over the bootstrap, rearrangements for axes other than 0, AllToAll as grouped
//! sends and receives, gradient buckets on the communication stream, collectives inside
//! recorded and replayed steps. A single GPU cannot host several NCCL ranks, so this is
//! where CI runs those paths with 2 to 4 ranks. Skips with a message where no C++20 compiler
//! is found.

mod gpu_common;

use gpu_common::nccl_ranks::{
    nccl_ranks_train_as_the_cpu_ranks, on_nccl_ranks, one_rank_buckets_train_as_the_cpu, OpenRank,
};
use shardc::cuda::device::Device;
use shardc::cuda::emulator::EmulatedDevice;
use shardc::cuda::nccl::emulated::EmulatedNccl;
use shardc::cuda::nccl::NcclComm;
use shardc::ir::{DType, ReduceOp, TensorType};
use shardc::runtime::comm::conformance;
use shardc::runtime::executor::CommCall;
use shardc::runtime::{Communicator, Tensor};
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
