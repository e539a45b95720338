//! Strategy search through the pipeline: every searcher decides every op of a training graph,
//! keeps the user's annotations, reports its predicted step, and honours the memory limit.

use shardc_compiler::optim::Momentum;
use shardc_compiler::transformer::{transformer, TransformerConfig};
use shardc_compiler::{compile, CompileOptions};
use shardc_ir::{Graph, Strategy};
use shardc_passes::parallel::search::{self, problem::Problem};
use shardc_passes::parallel::strategy::Source;
use shardc_passes::parallel::strategy::{assign, Assignment};
use shardc_passes::parallel::{DatasetLayout, Mode, ParallelOptions, SearchMode, SearchOptions};

fn options(device_num: usize, mode: SearchMode, limit: Option<f64>) -> CompileOptions {
    CompileOptions {
        optimizer: Some(Momentum::new(0.1, 0.9).to_spec()),
        parallel: Some(ParallelOptions {
            mode: Mode::AutoParallel,
            device_num,
            dataset: DatasetLayout::DataParallel,
            gradients_mean: true,
            enable_alltoall: false,
            search: SearchOptions {
                mode,
                max_device_memory: limit,
                ..Default::default()
            },
            parallel_optimizer: None,
        }),
        ..Default::default()
    }
}

const SEARCHERS: [SearchMode; 3] = [
    SearchMode::RecursiveProgramming,
    SearchMode::DynamicProgramming,
    SearchMode::Ilp,
];

fn small_transformer() -> Graph {
    transformer(&TransformerConfig::new(1, 32, 4, 8, 8)).unwrap()
}

#[test]
fn every_searcher_decides_every_op_and_reports_its_prediction() {
    for mode in SEARCHERS {
        for n in [2, 4, 8] {
            let g = small_transformer();
            let c = compile(g, &options(n, mode, None))
                .unwrap_or_else(|e| panic!("{mode:?} on {n}: {e}"));
            let p = c.parallel.unwrap();
            let report = p.assignment.search.as_ref().expect("a search report");
            assert_eq!(report.searcher, mode.name());
            assert!(report.predicted.seconds() > 0.0, "{report:?}");
            assert!(report.predicted.memory > 0.0, "{report:?}");
            let searched = p
                .assignment
                .decisions
                .iter()
                .flatten()
                .filter(|d| matches!(d.source, Source::Searched { .. }))
                .count();
            assert_eq!(searched, report.searched_ops, "{mode:?} on {n}");
            eprintln!(
                "{:?} n={n}: {} ops, predicted {:.3} ms (compute {:.3}, comm {:.3}), {:.1} KiB, exact {}, {:.3} s; {:?}",
                mode,
                report.searched_ops,
                report.predicted.seconds() * 1e3,
                report.predicted.compute * 1e3,
                report.predicted.communication * 1e3,
                report.predicted.memory / 1024.0,
                report.exact,
                report.search_seconds,
                report.notes
            );
        }
    }
}

fn training(g: Graph) -> Graph {
    compile(
        g,
        &CompileOptions {
            optimizer: Some(Momentum::new(0.1, 0.9).to_spec()),
            ..Default::default()
        },
    )
    .unwrap()
    .graph
}

fn h100(mut o: ParallelOptions) -> ParallelOptions {
    o.search.machine = shardc_compiler::device::DeviceDescription::preset("8xh100")
        .unwrap()
        .machine();
    o
}

#[test]
fn searched_strategies_are_predicted_no_slower_than_data_parallel() {
    let step = training(transformer(&TransformerConfig::new(2, 256, 4, 64, 16)).unwrap());
    for n in [2usize, 8, 64] {
        let dp = h100(
            options(n, SearchMode::ShardingPropagation, None)
                .parallel
                .unwrap(),
        );
        let dp = ParallelOptions {
            mode: Mode::DataParallel,
            ..dp
        };
        let dp_cost = search::predict(&step, &dp, &assign(&step, &dp).unwrap())
            .unwrap()
            .seconds();
        let mut modes = vec![SearchMode::RecursiveProgramming];
        if n <= 8 {
            modes.push(SearchMode::DynamicProgramming);
        }
        for mode in modes {
            let o = h100(options(n, mode, None).parallel.unwrap());
            let a = assign(&step, &o).unwrap();
            let cost = search::predict(&step, &o, &a).unwrap().seconds();
            let reported = a.search.as_ref().unwrap().predicted.seconds();
            assert!(
                (cost - reported).abs() <= 1e-9 * cost.max(1e-12),
                "{cost} vs {reported}"
            );
            eprintln!(
                "{} on {n}: {:.3} ms, data parallel {:.3} ms",
                mode.name(),
                cost * 1e3,
                dp_cost * 1e3
            );
            assert!(
                cost <= dp_cost * (1.0 + 1e-9),
                "{} on {n} devices: predicted {cost} s, data parallel {dp_cost} s",
                mode.name()
            );
        }
    }
}

fn least_memory(step: &Graph, o: &ParallelOptions) -> f64 {
    let inputs = step
        .params
        .iter()
        .map(|p| {
            (!p.is_weight()).then(|| {
                let mut l = shardc_ir::TensorLayout::replicated(&p.ty.shape, o.device_num);
                // The dataset strategy: split the batch over all devices.
                l.dev_matrix = vec![o.device_num];
                l.tensor_map = (0..p.ty.shape.len())
                    .map(|d| if d == 0 { 0 } else { -1 })
                    .collect();
                l
            })
        })
        .collect();
    let p = Problem::new(step, o, inputs).unwrap();
    let cands: Vec<_> = (0..p.ops.len()).map(|k| p.candidates(k).unwrap()).collect();
    let cg = p.cost_graph(&cands);
    cg.memory(&search::least_memory_choice(&cg))
}

#[test]
fn the_memory_limit_is_hard_and_a_miss_says_how_much_and_where() {
    let step = training(transformer(&TransformerConfig::new(1, 64, 4, 16, 8)).unwrap());
    for mode in [
        SearchMode::RecursiveProgramming,
        SearchMode::DynamicProgramming,
    ] {
        let free = assign(&step, &options(4, mode, None).parallel.unwrap()).unwrap();
        let free_mem = free.search.as_ref().unwrap().predicted.memory;
        let o = options(4, mode, None).parallel.unwrap();
        let least = least_memory(&step, &o);
        assert!(least < free_mem, "{least} vs {free_mem}");
        // A limit between the least memory and the unconstrained choice binds.
        let limit = (least + free_mem) / 2.0;
        let a: Assignment = assign(&step, &options(4, mode, Some(limit)).parallel.unwrap())
            .unwrap_or_else(|e| panic!("{}: {e}", mode.name()));
        let r = a.search.unwrap();
        assert!(
            r.predicted.memory <= limit,
            "{} > {limit}",
            r.predicted.memory
        );
        assert!(
            r.notes.iter().any(|n| n.contains("memory")),
            "{}: {:?}",
            mode.name(),
            r.notes
        );
        // Below the least: an error with the missing bytes and the largest holders.
        let e = assign(
            &step,
            &options(4, mode, Some(least * 0.9)).parallel.unwrap(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("max_device_memory"), "{e}");
        assert!(e.contains("missing"), "{e}");
        assert!(e.contains("layer0_"), "{e}");
    }
}

#[test]
fn annotations_stay_fixed_under_every_searcher() {
    let annotated = TransformerConfig::new(1, 32, 4, 8, 8).annotate(
        "layer0_ffn_in_matmul",
        Strategy(vec![vec![2, 1], vec![1, 2]]),
    );
    for mode in [
        SearchMode::RecursiveProgramming,
        SearchMode::DynamicProgramming,
        SearchMode::Ilp,
    ] {
        let g = transformer(&annotated).unwrap();
        let p = compile(g, &options(4, mode, None))
            .unwrap_or_else(|e| panic!("{}: {e}", mode.name()))
            .parallel
            .unwrap();
        let (node, d) = p
            .begin
            .nodes
            .iter()
            .zip(&p.assignment.decisions)
            .find(|(n, _)| n.instance == "layer0_ffn_in_matmul")
            .unwrap();
        let d = d.as_ref().unwrap();
        assert_eq!(
            d.sharding.strategy.to_string(),
            "((2, 1), (1, 2))",
            "{}",
            node.instance
        );
        assert_eq!(d.source, Source::User);
    }
}

#[test]
fn the_search_models_build_and_every_searcher_handles_them() {
    use shardc_compiler::generated::{embedding_net, generated_network, wide_resnet};
    let g = generated_network(500, 64, 64, 3).unwrap();
    let again = generated_network(500, 64, 64, 3).unwrap();
    assert_eq!(
        shardc_ir::text::print_graph(&g),
        shardc_ir::text::print_graph(&again),
        "the same seed gives the same graph"
    );
    assert!((500..560).contains(&g.nodes.len()), "{}", g.nodes.len());
    let adds_of_two_nodes = g
        .nodes
        .iter()
        .filter(|n| {
            n.op == shardc_ir::OpKind::Add
                && n.inputs
                    .iter()
                    .all(|o| matches!(o, shardc_ir::Operand::Node(_)))
        })
        .count();
    assert!(adds_of_two_nodes > 0, "joins are present");
    let wrn = wide_resnet(8, 16, 2).unwrap();
    let convs = wrn
        .nodes
        .iter()
        .filter(|n| n.op == shardc_ir::OpKind::Conv2D)
        .count();
    // Stem + 2 per block x 6 blocks + 2 shortcuts (group 1 widens too: 16 -> 32).
    assert_eq!(convs, 1 + 12 + 3, "WRN-16-2 convolutions");
    let emb = embedding_net(8, 1000, 8, 4, &[32, 8]).unwrap();
    let table = emb.param_by_name("embedding.table").unwrap();
    assert_eq!(emb.param(table).ty.shape, vec![1000, 8]);
    assert!(wide_resnet(8, 11, 1)
        .unwrap_err()
        .to_string()
        .contains("6n + 4"));
    for (name, model) in [
        ("generated", generated_network(60, 32, 32, 1).unwrap()),
        ("wide_resnet", wide_resnet(8, 10, 1).unwrap()),
        ("embedding", emb),
    ] {
        for mode in SEARCHERS {
            let c = compile(model.clone(), &options(4, mode, None))
                .unwrap_or_else(|e| panic!("{name} under {}: {e}", mode.name()));
            let p = c.parallel.unwrap();
            assert!(
                p.assignment.search.is_some(),
                "{name} under {}",
                mode.name()
            );
        }
    }
}
