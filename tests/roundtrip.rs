//! Every graph the frontend builds — forward and training step — prints, parses back and
//! prints the same text, and survives the binary form unchanged.

use shardc::compiler::pipeline::{compile, CompileOptions};
use shardc::compiler::zoo;
use shardc::ir::text::{parse_graph, print_graph};
use shardc::ir::{binary, Graph};
use shardc::passes::autodiff::Optimizer;

fn graphs() -> Vec<(String, Graph)> {
    let mut out = Vec::new();
    let forwards = [
        (
            "quickstart",
            zoo::quickstart(16).expect("quickstart builds"),
        ),
        ("mlp", zoo::mlp(8, &[784, 64, 10]).expect("mlp builds")),
        ("lenet", zoo::lenet(4).expect("lenet builds")),
        ("resnet18", zoo::resnet18_cifar(2).expect("resnet builds")),
    ];
    let opts = [
        Optimizer::Momentum {
            learning_rate: 0.1,
            momentum: 0.9,
            use_nesterov: false,
        },
        Optimizer::Adam {
            learning_rate: 0.001,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        },
    ];
    for (name, g) in forwards {
        for (i, opt) in opts.iter().enumerate() {
            let c = compile(
                g.clone(),
                &CompileOptions {
                    optimizer: Some(*opt),
                    dump_dir: None,
                    ..Default::default()
                },
            )
            .expect("compiles");
            out.push((format!("{name}/train{i}"), c.graph));
        }
        out.push((name.to_string(), g));
    }
    out
}

#[test]
fn text_round_trip_holds_for_every_built_graph() {
    for (name, g) in graphs() {
        let text = print_graph(&g);
        let parsed = parse_graph(&text, &name).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            print_graph(&parsed),
            text,
            "{name}: print(parse(print(g))) differs"
        );
        assert_eq!(parsed, g, "{name}: parse(print(g)) differs structurally");
    }
}

#[test]
fn binary_round_trip_holds_for_every_built_graph() {
    for (name, g) in graphs() {
        let bytes = binary::encode_graph(&g).unwrap_or_else(|e| panic!("{name}: {e}"));
        let back = binary::decode_graph(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(back, g, "{name}");
    }
}
