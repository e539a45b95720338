//! Per-rank graphs with communication nodes, run by one executor per thread rank through the
//! in-process communicator: results against a direct computation, attributes read and
//! checked at creation, failures in the communicator as errors naming the node.

mod common;

use common::{Builder, TestBackend};
use shardc_ir::{Attr, Attrs, Const, DType, Graph, OpKind, Operand, TensorType, Type};
use shardc_runtime::comm::{Communicator, InProcessWorld};
use shardc_runtime::executor::Executor;
use shardc_runtime::{RuntimeError, Tensor};
use std::sync::Arc;
use std::time::Duration;

fn ints(xs: &[i64]) -> Attr {
    Attr::ints(xs)
}

/// Runs `graph_of(rank)` on every rank of `comms` for `steps` steps with `feed(rank, step)`
/// as input `x`, one executor per thread; returns each rank's outputs per step.
fn run_ranks(
    comms: Vec<Arc<dyn Communicator>>,
    graph_of: impl Fn(usize) -> Graph + Sync,
    feed: impl Fn(usize, usize) -> Tensor + Sync,
    steps: usize,
) -> Vec<Result<Vec<Vec<Tensor>>, RuntimeError>> {
    std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|c| {
                let (graph_of, feed) = (&graph_of, &feed);
                s.spawn(move || {
                    let r = c.rank();
                    let mut exec =
                        Executor::with_communicator(graph_of(r), Arc::new(TestBackend), c)?;
                    assert_eq!(exec.communicator().map(|c| c.rank()), Some(r));
                    (0..steps)
                        .map(|k| exec.step(&[("x", feed(r, k))]))
                        .collect::<Result<Vec<_>, _>>()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn x_of(rank: usize, step: usize) -> Tensor {
    let v = (0..4)
        .map(|i| rank as f64 * 10.0 + i as f64 + 0.25 * step as f64)
        .collect();
    Tensor::from_f64(vec![4], v).unwrap()
}

/// `w = AllReduce(x * 2) + x`.
fn allreduce_graph(attrs: Attrs) -> Graph {
    let mut b = Builder::new("DataParallel");
    let x = b.input("x", DType::Float64, &[4]);
    let y = b.same(
        OpKind::Mul,
        vec![x.clone(), Operand::Const(Const::Float(2.0))],
    );
    let ty = Type::Tensor(b.ty(&y));
    let z = b.op(OpKind::AllReduce, vec![y], attrs, ty);
    let w = b.same(OpKind::Add, vec![z, x]);
    b.finish(vec![w])
}

#[test]
fn two_ranks_all_reduce_in_two_executors() {
    let results = run_ranks(
        InProcessWorld::new(2),
        |_| allreduce_graph(Attrs::new().with("op", Attr::Str("sum".into()))),
        x_of,
        3,
    );
    for (r, res) in results.iter().enumerate() {
        let steps = res.as_ref().unwrap();
        for (k, outs) in steps.iter().enumerate() {
            let x0 = x_of(0, k).to_f64_vec();
            let x1 = x_of(1, k).to_f64_vec();
            let xr = x_of(r, k).to_f64_vec();
            let want: Vec<f64> = (0..4)
                .map(|i| (2.0 * x0[i] + 2.0 * x1[i]) + xr[i])
                .collect();
            assert_eq!(outs[0].to_f64_vec(), want, "rank {r} step {k}");
        }
    }
}

#[test]
fn rank_list_and_op_attributes_are_read() {
    // Ranks {0, 2} and {1, 3} of 4 reduce separately with max; no rank_list means the world.
    let results = run_ranks(
        InProcessWorld::new(4),
        |r| {
            let list: &[i64] = if r % 2 == 0 { &[2, 0] } else { &[1, 3] };
            allreduce_graph(
                Attrs::new()
                    .with("op", Attr::Str("max".into()))
                    .with("rank_list", ints(list)),
            )
        },
        x_of,
        1,
    );
    for (r, res) in results.iter().enumerate() {
        let peer = if r % 2 == 0 { 2 } else { 3 };
        let xr = x_of(r, 0).to_f64_vec();
        let xp = x_of(peer, 0).to_f64_vec();
        let want: Vec<f64> = (0..4).map(|i| 2.0 * xr[i].max(xp[i]) + xr[i]).collect();
        assert_eq!(res.as_ref().unwrap()[0][0].to_f64_vec(), want, "rank {r}");
    }
    let results = run_ranks(
        InProcessWorld::new(4),
        |_| allreduce_graph(Attrs::new()),
        x_of,
        1,
    );
    let total: Vec<f64> = (0..4)
        .map(|i| {
            (0..4)
                .map(|r| 2.0 * x_of(r, 0).to_f64_vec()[i])
                .sum::<f64>()
        })
        .collect();
    for (r, res) in results.iter().enumerate() {
        let xr = x_of(r, 0).to_f64_vec();
        let want: Vec<f64> = (0..4).map(|i| total[i] + xr[i]).collect();
        assert_eq!(res.as_ref().unwrap()[0][0].to_f64_vec(), want);
    }
}

/// One graph with every communication op on 4 ranks: x (4,) is reshaped by the ops'
/// shapes only, so every result can be computed directly.
fn every_op_graph(rank: usize) -> Graph {
    let mut b = Builder::new("EveryComm");
    let x = b.input("x", DType::Float64, &[4]);
    let f64t = |shape: &[usize]| Type::Tensor(TensorType::new(DType::Float64, shape.to_vec()));
    let world = ints(&[0, 1, 2, 3]);
    // AllGather on axis -1 (normalised to 0 for a rank-1 operand): (16,).
    let g = b.op(
        OpKind::AllGather,
        vec![x.clone()],
        Attrs::new()
            .with("rank_list", world.clone())
            .with("axis", Attr::Int(-1)),
        f64t(&[16]),
    );
    // ReduceScatter of the gathered (16,) with sum: (4,), identical to the sum of all x.
    let rs = b.op(
        OpKind::ReduceScatter,
        vec![g.clone()],
        Attrs::new().with("rank_list", world.clone()),
        f64t(&[4]),
    );
    // AlltoAll of x over the world: split (4,) in 4 and concat on 0: element j of member i.
    let a2a = b.op(
        OpKind::AllToAll,
        vec![x.clone()],
        Attrs::new()
            .with("split_dim", Attr::Int(0))
            .with("concat_dim", Attr::Int(0))
            .with("split_count", Attr::Int(4))
            .with("rank_list", world),
        f64t(&[4]),
    );
    // Broadcast from global rank 3 within {1, 3} (ranks 0 and 2 use {0, 2}, root 2).
    let (pair, root): (&[i64], i64) = if rank % 2 == 1 {
        (&[1, 3], 3)
    } else {
        (&[0, 2], 2)
    };
    let bc = b.op(
        OpKind::Broadcast,
        vec![x.clone()],
        Attrs::new()
            .with("rank_list", ints(pair))
            .with("root_rank", Attr::Int(root)),
        f64t(&[4]),
    );
    // Ring: send x to the next rank, receive from the previous.
    let sent = b.op(
        OpKind::Send,
        vec![x.clone()],
        Attrs::new()
            .with("dest_rank", Attr::Int(((rank + 1) % 4) as i64))
            .with("sr_tag", Attr::Int(7)),
        f64t(&[4]),
    );
    let recv = b.op(
        OpKind::Receive,
        vec![],
        Attrs::new()
            .with("src_rank", Attr::Int(((rank + 3) % 4) as i64))
            .with("sr_tag", Attr::Int(7))
            .with("shape", ints(&[4]))
            .with("dtype", Attr::Str("Float64".into())),
        f64t(&[4]),
    );
    b.finish(vec![g, rs, a2a, bc, sent, recv])
}

#[test]
fn every_communication_op_through_the_executor() {
    let results = run_ranks(InProcessWorld::new(4), every_op_graph, x_of, 2);
    for (r, res) in results.iter().enumerate() {
        for (k, outs) in res.as_ref().unwrap().iter().enumerate() {
            let xs: Vec<Vec<f64>> = (0..4).map(|q| x_of(q, k).to_f64_vec()).collect();
            let gathered: Vec<f64> = xs.concat();
            assert_eq!(outs[0].shape, vec![16]);
            assert_eq!(outs[0].to_f64_vec(), gathered, "AllGather r{r}");
            // ReduceScatter: member r keeps block r of sum over members of the gathered
            // tensor = 4 * gathered[4r..4r+4].
            let want: Vec<f64> = (0..4)
                .map(|i| {
                    let v = gathered[4 * r + i];
                    ((v + v) + v) + v
                })
                .collect();
            assert_eq!(outs[1].to_f64_vec(), want, "ReduceScatter r{r}");
            let want: Vec<f64> = (0..4).map(|i| xs[i][r]).collect();
            assert_eq!(outs[2].to_f64_vec(), want, "AlltoAll r{r}");
            let root = if r % 2 == 1 { 3 } else { 2 };
            assert_eq!(outs[3].to_f64_vec(), xs[root], "Broadcast r{r}");
            assert_eq!(outs[4].to_f64_vec(), xs[r], "Send r{r}");
            assert_eq!(outs[5].to_f64_vec(), xs[(r + 3) % 4], "Receive r{r}");
        }
    }
}

fn creation_error(graph: Graph, rank: usize, size: usize) -> String {
    let comm = InProcessWorld::new(size).swap_remove(rank);
    Executor::with_communicator(graph, Arc::new(TestBackend), comm)
        .unwrap_err()
        .to_string()
}

#[test]
fn bad_attributes_are_errors_at_creation() {
    let with = |attrs: Attrs| {
        let mut g = allreduce_graph(attrs);
        g.nodes[1].instance = "ar".into();
        g
    };
    let e = creation_error(with(Attrs::new().with("rank_list", ints(&[1, 2]))), 0, 4);
    assert!(e.contains("AllReduce 'ar'"), "{e}");
    assert!(
        e.contains("attribute `rank_list` (1, 2) does not hold this rank 0"),
        "{e}"
    );
    let e = creation_error(with(Attrs::new().with("rank_list", ints(&[0, 5]))), 0, 4);
    assert!(
        e.contains("holds 5, which is not a rank of the world of 4 ranks"),
        "{e}"
    );
    let e = creation_error(with(Attrs::new().with("rank_list", ints(&[0, 0]))), 0, 4);
    assert!(e.contains("must hold distinct ranks"), "{e}");
    let e = creation_error(
        with(Attrs::new().with("op", Attr::Str("mean".into()))),
        0,
        2,
    );
    assert!(e.contains("attribute `op` mean is not a reduction"), "{e}");

    // AllGather axis out of range.
    let mut b = Builder::new("G");
    let x = b.input("x", DType::Float64, &[4]);
    b.op(
        OpKind::AllGather,
        vec![x],
        Attrs::new().with("axis", Attr::Int(1)),
        Type::Tensor(TensorType::new(DType::Float64, vec![8])),
    );
    let g = b.finish(vec![]);
    let e = creation_error(g, 0, 2);
    assert!(
        e.contains("attribute `axis` 1 is out of range for an operand of rank 1"),
        "{e}"
    );

    // Broadcast root outside its group; Send without dest_rank.
    let mut b = Builder::new("B");
    let x = b.input("x", DType::Float64, &[4]);
    let ty = Type::Tensor(b.ty(&x));
    b.op(
        OpKind::Broadcast,
        vec![x],
        Attrs::new()
            .with("rank_list", ints(&[0, 1]))
            .with("root_rank", Attr::Int(2)),
        ty,
    );
    let e = creation_error(b.finish(vec![]), 0, 4);
    assert!(
        e.contains("attribute `root_rank` 2 is not in the group {0, 1}"),
        "{e}"
    );
    let mut b = Builder::new("S");
    let x = b.input("x", DType::Float64, &[4]);
    let ty = Type::Tensor(b.ty(&x));
    b.op(OpKind::Send, vec![x], Attrs::new(), ty);
    let e = creation_error(b.finish(vec![]), 0, 2);
    assert!(e.contains("attribute `dest_rank` is missing"), "{e}");

    // Without a communicator the executor still refuses communication ops.
    let e = Executor::new(with(Attrs::new()), Arc::new(TestBackend)).unwrap_err();
    assert!(matches!(e, RuntimeError::NeedsCommunicator { .. }));
}

#[test]
fn a_rank_that_never_steps_times_out_the_others() {
    let comms = InProcessWorld::with_timeout(2, Duration::from_millis(100));
    let results = run_ranks(
        comms,
        |_| {
            let mut g = allreduce_graph(Attrs::new());
            g.nodes[1].instance = "grad_sum".into();
            g
        },
        x_of,
        1,
    );
    // Both ranks step, so this world succeeds; now one where rank 1 never steps.
    assert!(results.iter().all(Result::is_ok));
    let mut comms = InProcessWorld::with_timeout(2, Duration::from_millis(100));
    let c0 = comms.swap_remove(0);
    let mut g = allreduce_graph(Attrs::new());
    g.nodes[1].instance = "grad_sum".into();
    let mut exec = Executor::with_communicator(g, Arc::new(TestBackend), c0).unwrap();
    let err = exec.step(&[("x", x_of(0, 0))]).unwrap_err();
    assert!(matches!(err, RuntimeError::Comm { .. }));
    assert_eq!(
        err.to_string(),
        "%2 AllReduce 'grad_sum': AllReduce on group {0, 1} at rank 0: timed out after 0.100 s; ranks {1} never arrived"
    );
}

#[test]
fn communication_results_live_in_planned_buffers() {
    // A world of one rank: the collectives are identities, run step after step without
    // allocating beyond the plan.
    let comm = InProcessWorld::new(1).swap_remove(0);
    let graph = every_op_graph_one_rank();
    let mut exec = Executor::with_communicator(graph, Arc::new(TestBackend), comm).unwrap();
    let planned = exec.stats().buffer_allocations;
    assert_eq!(planned as usize, exec.memory_plan().buffers.len());
    for k in 0..3 {
        let x = x_of(0, k);
        let outs = exec.step(&[("x", x.clone())]).unwrap();
        for o in &outs {
            assert_eq!(o, &x);
        }
    }
    assert_eq!(exec.stats().buffer_allocations, planned);
    assert_eq!(exec.stats().per_op[&OpKind::AllReduce].count, 3);
    assert_eq!(exec.stats().per_op[&OpKind::Receive].count, 3);
}

/// Every op on a world of one: AllReduce, AllGather, ReduceScatter, AlltoAll, Broadcast,
/// Send to itself and Receive from itself, chained.
fn every_op_graph_one_rank() -> Graph {
    let mut b = Builder::new("One");
    let x = b.input("x", DType::Float64, &[4]);
    let ty = Type::Tensor(b.ty(&x));
    let mut v = x;
    let mut outs = Vec::new();
    for (op, attrs) in [
        (
            OpKind::AllReduce,
            Attrs::new().with("op", Attr::Str("prod".into())),
        ),
        (
            OpKind::AllGather,
            Attrs::new().with("rank_list", ints(&[0])),
        ),
        (
            OpKind::ReduceScatter,
            Attrs::new().with("axis", Attr::Int(-1)),
        ),
        (
            OpKind::AllToAll,
            Attrs::new()
                .with("split_dim", Attr::Int(0))
                .with("concat_dim", Attr::Int(-1)),
        ),
        (OpKind::Broadcast, Attrs::new()),
        (OpKind::Send, Attrs::new().with("dest_rank", Attr::Int(0))),
    ] {
        v = b.op(op, vec![v], attrs, ty.clone());
        outs.push(v.clone());
    }
    let r = b.op(
        OpKind::Receive,
        vec![],
        Attrs::new()
            .with("src_rank", Attr::Int(0))
            .with("shape", ints(&[4]))
            .with("dtype", Attr::Str("Float64".into())),
        ty,
    );
    outs.push(r);
    b.finish(outs)
}
