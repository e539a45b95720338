//! Gradient fusion end to end: data-parallel models compiled with every `comm_fusion` mode
//! (auto, size, index, none) run on 2 and 4 ranks (threads, the in-process communicator, the
//! executor's communication thread and overlapped buckets) and give bit-identical losses and
//! weights to the unfused per-rank graphs (the partitioner's output, every gradient AllReduce
//! synchronous after the backward pass). Also: `data_parallel` ignores shard annotations.

use shardc::compiler::optim::Momentum;
use shardc::compiler::pipeline::grad_fusion_of;
use shardc::compiler::{compile, zoo, CompileOptions};
use shardc::ir::text::parse_graph;
use shardc::ir::{Attr, Graph, TensorLayout};
use shardc::passes::grad_fusion::{GradFusion, MIRROR_PREFIX};
use shardc::passes::parallel::{partition, strategy, DatasetLayout, Mode, ParallelOptions};
use shardc::runtime::data::SyntheticData;
use shardc::runtime::Tensor;
use shardc_tools::in_process::run_ranks;

const STEPS: u64 = 3;

fn quickstart() -> Graph {
    let src = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/models/quickstart.ir"))
        .expect("models/quickstart.ir");
    parse_graph(&src, "quickstart.ir").expect("quickstart parses")
}

fn options(n: usize, mean: bool, fusion: Option<GradFusion>) -> CompileOptions {
    CompileOptions {
        optimizer: Some(Momentum::new(0.05, 0.9).to_spec()),
        parallel: Some(ParallelOptions {
            mode: Mode::DataParallel,
            device_num: n,
            dataset: DatasetLayout::DataParallel,
            gradients_mean: mean,
            enable_alltoall: false,
            search: Default::default(),
            parallel_optimizer: None,
        }),
        grad_fusion: fusion,
        ..Default::default()
    }
}

/// The bucket ids of a rank graph's AllReduces, in program order (0 = not fused).
fn fusion_ids(g: &Graph) -> Vec<(String, i64)> {
    g.nodes
        .iter()
        .filter(|n| n.op == shardc::ir::OpKind::AllReduce)
        .map(|n| {
            let id = match n.attrs.get("fusion") {
                Some(Attr::Int(k)) => *k,
                _ => -1,
            };
            (n.instance.clone(), id)
        })
        .collect()
}

/// Losses per rank per step, then weights per rank, as bit patterns.
type Run = (Vec<Vec<u64>>, Vec<Vec<(String, Vec<u64>)>>);

fn bits(t: &Tensor) -> Vec<u64> {
    t.to_f64_vec().into_iter().map(f64::to_bits).collect()
}

fn run(ranks: Vec<Graph>, inputs: &[(String, TensorLayout)], single: &Graph) -> Run {
    let data = SyntheticData::new(single, 5, STEPS as usize).unwrap();
    let feeds = |step: u64| -> Vec<(String, Tensor)> {
        data.feeds(step)
            .into_iter()
            .map(|(n, t)| (n.to_string(), t))
            .collect()
    };
    let res = run_ranks(ranks, inputs, &feeds, STEPS, 1).unwrap();
    let losses = res
        .outputs
        .iter()
        .map(|steps| {
            steps
                .iter()
                .map(|o| o[0].to_f64_vec()[0].to_bits())
                .collect()
        })
        .collect();
    let weights = res
        .weights
        .iter()
        .map(|ws| ws.iter().map(|(n, t)| (n.clone(), bits(t))).collect())
        .collect();
    (losses, weights)
}

fn check_model(name: &str, model: &Graph, n: usize, mean: bool) {
    // The unfused per-rank graphs: the partitioner's output as it is.
    let base = options(n, mean, None);
    let single = compile(
        model.clone(),
        &CompileOptions {
            optimizer: base.optimizer,
            ..Default::default()
        },
    )
    .unwrap()
    .graph;
    let p = base.parallel.clone().unwrap();
    let a = strategy::assign(&single, &p).unwrap();
    let unfused = partition::partition(&single, &a, &p).unwrap();
    for g in &unfused {
        assert!(
            fusion_ids(g).iter().all(|(_, k)| *k == 0),
            "{name}: the partitioner fuses nothing"
        );
    }
    let inputs: Vec<(String, TensorLayout)> = single
        .params
        .iter()
        .zip(&a.param_layouts)
        .filter(|(p, _)| !p.is_weight())
        .map(|(p, l)| (p.name.clone(), l.clone()))
        .collect();
    let reference = run(unfused, &inputs, &single);
    let grads = single.params.iter().filter(|p| p.requires_grad()).count();
    for (fusion, want_buckets) in [
        (Some(GradFusion::Auto), Some(1)),
        (Some(GradFusion::SizeMb(0.000_5)), None),
        (Some(GradFusion::Index(vec![1])), Some(2)),
        (None, Some(grads)),
    ] {
        let what = format!("{name} on {n} ranks, gradients_mean {mean}, fusion {fusion:?}");
        let par = compile(model.clone(), &options(n, mean, fusion.clone()))
            .unwrap()
            .parallel
            .unwrap();
        let ids = fusion_ids(&par.ranks[0]);
        let mut buckets: Vec<i64> = ids
            .iter()
            .filter(|(i, _)| i.starts_with(MIRROR_PREFIX))
            .map(|(_, k)| *k)
            .collect();
        assert!(buckets.iter().all(|&k| k > 0), "{what}: {ids:?}");
        assert_eq!(buckets.len(), grads, "{what}: one AllReduce per gradient");
        buckets.dedup();
        if let Some(b) = want_buckets {
            assert_eq!(buckets.len(), b, "{what}: buckets {ids:?}");
        }
        for (i, k) in &ids {
            if !i.starts_with(MIRROR_PREFIX) {
                assert_eq!(*k, 0, "{what}: forward AllReduce {i} is not fused");
            }
        }
        let got = run(par.ranks, &inputs, &single);
        assert_eq!(
            got.0, reference.0,
            "{what}: losses differ from the unfused run"
        );
        assert_eq!(
            got.1, reference.1,
            "{what}: weights differ from the unfused run"
        );
    }
}

#[test]
fn fused_and_unfused_data_parallel_runs_are_bit_identical() {
    let mlp = zoo::mlp(16, &[12, 10, 8, 4]).unwrap();
    for n in [2, 4] {
        check_model("mlp", &mlp, n, n == 2);
        check_model("quickstart", &quickstart(), n, n == 4);
    }
}

#[test]
fn data_parallel_ignores_shard_annotations_and_says_so() {
    // quickstart.ir annotates matmul with an 8-device strategy; data_parallel on 4 devices
    // must ignore it (as MindSpore does) instead of rejecting it.
    let par = compile(quickstart(), &options(4, true, None))
        .unwrap()
        .parallel
        .unwrap();
    let i = par.begin.node_by_instance("matmul").unwrap().index();
    let d = par.assignment.decisions[i].as_ref().unwrap();
    assert_eq!(d.sharding.strategy.to_string(), "((4, 1), (1, 1))");
    let source = d.source.to_string();
    assert!(
        source.contains("((2, 4), (4, 1)) was ignored") && source.contains("data_parallel"),
        "{source}"
    );
    // Every weight is replicated.
    for (p, l) in par.begin.params.iter().zip(&par.assignment.param_layouts) {
        if p.is_weight() {
            let devices =
                |m: i64| usize::try_from(m).map_or(1, |m| l.dev_matrix[l.dev_matrix.len() - 1 - m]);
            assert!(
                l.tensor_map.iter().all(|&m| devices(m) == 1),
                "{} is split: {l}",
                p.name
            );
        }
    }
    // semi_auto_parallel still rejects it on 4 devices.
    let mut semi = options(4, true, None);
    if let Some(p) = semi.parallel.as_mut() {
        p.mode = Mode::SemiAutoParallel;
    }
    let e = compile(quickstart(), &semi).unwrap_err().to_string();
    assert!(e.contains("matmul") && e.contains("8 devices"), "{e}");
}

#[test]
fn comm_fusion_of_the_context_maps_to_the_pass() {
    use shardc::compiler::parallel_context::CommFusion;
    assert_eq!(grad_fusion_of(&CommFusion::Auto), GradFusion::Auto);
    assert_eq!(
        grad_fusion_of(&CommFusion::Size(32.0)),
        GradFusion::SizeMb(32.0)
    );
    assert_eq!(
        grad_fusion_of(&CommFusion::Index(vec![2, 5])),
        GradFusion::Index(vec![2, 5])
    );
    // An unusable configuration is an error naming it, not a panic.
    let e = compile(
        zoo::mlp(8, &[4, 4]).unwrap(),
        &options(2, true, Some(GradFusion::SizeMb(-1.0))),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("grad_fusion") && e.contains("size -1"), "{e}");
}

#[test]
fn gradient_all_reduces_follow_their_gradients() {
    // Each gradient AllReduce comes right after the node producing its operand; the
    // optimizer updates stay after the whole backward pass.
    let par = compile(
        zoo::mlp(8, &[6, 5, 4]).unwrap(),
        &options(2, true, Some(GradFusion::Auto)),
    )
    .unwrap()
    .parallel
    .unwrap();
    let g = &par.ranks[0];
    let mut seen = 0;
    for (i, n) in g.nodes.iter().enumerate() {
        if n.op == shardc::ir::OpKind::AllReduce && n.instance.starts_with(MIRROR_PREFIX) {
            let shardc::ir::Operand::Node(src) = &n.inputs[0] else {
                panic!("{} reads no node", n.instance);
            };
            let prev = i - 1;
            let prev_is_reducer = g.nodes[prev].op == shardc::ir::OpKind::AllReduce;
            assert!(
                src.index() == prev || prev_is_reducer,
                "{} at %{} reads %{}",
                n.instance,
                i + 1,
                src.index() + 1
            );
            seen += 1;
        }
    }
    assert_eq!(seen, 4);
    let first_update = g
        .nodes
        .iter()
        .position(|n| n.instance.starts_with("apply_momentum"))
        .unwrap();
    let last_reduce = g
        .nodes
        .iter()
        .rposition(|n| {
            n.instance.starts_with(MIRROR_PREFIX) && n.op == shardc::ir::OpKind::AllReduce
        })
        .unwrap();
    assert!(last_reduce < first_update);
}

#[test]
fn data_parallel_reduces_weight_gradients_instead_of_gathering_the_batch() {
    // With a large weight and a small batch, gathering the batch to compute each weight
    // gradient whole moves fewer bytes than reducing the gradient; data_parallel still splits
    // the batch everywhere and reduces the partial gradients, as MindSpore's does.
    let mlp = zoo::mlp(64, &[784, 512, 512, 10]).unwrap();
    let par = compile(mlp, &options(2, true, None))
        .unwrap()
        .parallel
        .unwrap();
    for (r, g) in par.ranks.iter().enumerate() {
        let ops: Vec<_> = g.nodes.iter().map(|n| n.op).collect();
        assert!(
            !ops.contains(&shardc::ir::OpKind::AllGather),
            "rank {r} gathers: {ops:?}"
        );
    }
    for node in &par.begin.nodes {
        if node.op == shardc::ir::OpKind::MatMul && node.instance.ends_with("_b") {
            let d = par.assignment.decisions
                [par.begin.node_by_instance(&node.instance).unwrap().index()]
            .as_ref()
            .unwrap();
            assert_eq!(
                d.sharding.strategy.to_string(),
                "((2, 1), (2, 1))",
                "{} does not split the batch",
                node.instance
            );
        }
    }
}
