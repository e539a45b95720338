//! The text form: round trips, the quickstart model, MindSpore excerpts, error messages.

mod common;

use common::{full_graph, quickstart_text, small_graph};
use shardc_ir::text::{parse_graph, print_graph};
use shardc_ir::{Attr, Const, DType, Init, OpKind, Operand, ParamKind, Strategy, Type};

#[test]
fn small_graph_prints_in_the_dump_grammar() {
    let text = print_graph(&small_graph());
    let expected = "\
#IR entry      : @Net
#Total params  : 2

%para1_x : <Tensor[Float32], (16, 32)>
%para2_w : <Ref[Tensor(F32)], (32, 16), ref_key=:w>  :  has_default  init: normal(sigma=0.01, seed=1)

subgraph @Net(%para1_x, %para2_w) {
  %1(out) = MatMul(%para1_x, %para2_w) {instance name: matmul} primitive_attrs: {in_strategy: ((2, 4), (4, 1))} {in_strategy: ((2, 4), (4, 1))}
      : (<Tensor[Float32], (16, 32)>, <Ref[Tensor(F32)], (32, 16), ref_key=:w>) -> (<Tensor[Float32], (16, 16)>)
  %2(out) = ReduceMean(%1, (0, 1)) {instance name: reduce_mean} primitive_attrs: {keep_dims: false}
      : (<Tensor[Float32], (16, 16)>, <Tuple[Int64*2]>) -> (<Tensor[Float32], ()>)
      # scope: (Default)
  Return(%2)
}
";
    assert_eq!(text, expected);
}

#[test]
fn full_graph_round_trips_exactly() {
    let g = full_graph();
    let text = print_graph(&g);
    let parsed = parse_graph(&text, "full.ir").unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(print_graph(&parsed), text);
    assert_eq!(parsed, g, "parse(print(g)) differs structurally\n{text}");
}

#[test]
fn full_graph_prints_the_tricky_parts_as_documented() {
    let text = print_graph(&full_graph());
    for needle in [
        "%para2_w0.weight : <Ref[Tensor(F32)], (16, 16), ref_key=:w0.weight>  :  has_default  init: normal(sigma=0.01, seed=1)\n",
        "init: normal(sigma=0.5, mean=-1.25, seed=18446744073709551615)\n",
        "init: uniform(scale=0.07, seed=3)  requires_grad: false\n",
        "init: zeros\n",
        "init: ones\n",
        "init: constant(value=1e-5)  requires_grad: false\n",
        "init: xavier_uniform(gain=1.0, seed=4)\n",
        "init: he_normal(seed=5)\n",
        "%para17_\"odd name \\\"quoted\\\"\" : <Ref[Tensor(F32)], (), ref_key=:\"odd name \\\"quoted\\\"\">",
        "%para14_in_Int32 : <Tensor[Int32], (2, 2, 2, 2)>",
        "%para10_in_Float32 : <Tensor[Float32], ()>",
        "one: (5), empty_tuple: (), empty_list: [], ",
        "num_str: \"12\", bool_str: \"true\", empty_str: \"\"",
        "word: 4-6301172352641561019, ranks: 0-1-2-3",
        "f: 0.1, big: 1e300, tiny: -5e-324, inf: -inf",
        "\"in_strategy\": \"not a strategy\", in_strategy: ((2, 4), (4, 1)), out_strategy: ((8, 1))} {in_strategy: ((2, 4), (4, 1))}",
        "cnode_attrs: {comm_reuse: true, k: [0.5]}\n",
        "%3(\"name (with parens)\") = StridedSlice(%2, (0, 0), (8, 4), (1, -1)) {instance name: \"redistribution {odd} instance\"}\n",
        "      : (<Tensor[Float32], (8, 16)>, <Tuple[Int64*2]>, <Tuple[Int64*2]>, <Tuple[Int64*2]>) -> (<Tensor[Float32], (8, 4)>)\n      # scope: ()\n      # scope: (not the scope)\n",
        "Mul(%3, 0.5, -3, true, (5), (), 1.0, 1e-7, inf)",
        "-> (<Tuple[<Tensor[Float32], (4, 4)>, <Tensor[Float32], (4, 4)>]>)",
        "      : (<Tuple[<Tensor[Float32], (4, 4)>, <Tensor[Float32], (4, 4)>]>, <Int64>) -> (<Tensor[Float32], (4, 4)>)",
        "  %7(out) = Add(%6, %para17_\"odd name \\\"quoted\\\"\")\n  %8(out) = Cast(%7)",
        "      : (<Tuple[]>) -> (<Tensor[Float16], (4, 4)>)",
        "      # scope: (Default/with ) paren)\n",
        "      # strategy from: user\n      # \n      #   indented # hash\n",
        "  Return(%8, %9, %para3_w1.weight, %1)\n}\n",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in\n{text}");
    }
}

#[test]
fn print_parse_print_is_stable_for_every_prefix_of_the_node_list() {
    // Graphs with fewer nodes (outputs pointing at what remains) exercise many shapes.
    let full = full_graph();
    for n in 0..=full.nodes.len() {
        let mut g = full.clone();
        g.nodes.truncate(n);
        g.outputs = if n == 0 {
            vec![]
        } else {
            vec![Operand::Node(shardc_ir::NodeId(n as u32 - 1))]
        };
        let text = print_graph(&g);
        let parsed = parse_graph(&text, "prefix.ir").unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(parsed, g);
        assert_eq!(print_graph(&parsed), text);
    }
}

#[test]
fn quickstart_parses_as_it_stands() {
    let g = parse_graph(&quickstart_text(), "quickstart.ir").unwrap();
    assert_eq!(g.name, "Net");
    let names: Vec<_> = g.params.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["x", "label", "w", "w2"]);
    assert_eq!(g.params[0].kind, ParamKind::Input);
    assert_eq!(g.params[0].ty.shape, vec![16, 32]);
    assert_eq!(
        g.params[2].kind,
        ParamKind::Weight {
            init: Init::Normal {
                sigma: 0.01,
                mean: 0.0,
                seed: 1
            },
            requires_grad: true
        }
    );
    let ops: Vec<_> = g.nodes.iter().map(|n| n.op).collect();
    assert_eq!(
        ops,
        [
            OpKind::MatMul,
            OpKind::ReLU,
            OpKind::MatMul,
            OpKind::Sub,
            OpKind::Square,
            OpKind::ReduceMean
        ]
    );
    let mm = &g.nodes[0];
    assert_eq!(mm.instance, "matmul");
    assert_eq!(mm.in_strategy, Some(Strategy(vec![vec![2, 4], vec![4, 1]])));
    assert_eq!(mm.attrs.get("transpose_a"), Some(&Attr::Bool(false)));
    assert!(mm.attrs.get("in_strategy").is_none());
    assert_eq!(mm.scope, "Default/network-WithLossCell/_backbone-Net");
    assert_eq!(
        g.nodes[5].inputs[1],
        Operand::Const(Const::Ints(vec![0, 1]))
    );
    assert_eq!(g.nodes[5].name, "loss");
    // No type lines in the file: every node is "not inferred yet".
    assert!(g.nodes.iter().all(|n| n.ty == Type::Tuple(vec![])));
    assert_eq!(g.outputs, vec![Operand::Node(shardc_ir::NodeId(5))]);
    // And its print parses back to the same graph.
    let text = print_graph(&g);
    assert_eq!(parse_graph(&text, "q2.ir").unwrap(), g);
}

#[test]
fn mindspore_excerpts_parse_with_load_as_an_alias() {
    let src = r#"#IR entry      : @1_construct_wrapper.337
#Total params  : 3

%para1_x : <Tensor[Float32], (8, 8)>
%para2_w : <Ref[Tensor(F32)], (8, 16), ref_key=:w>  :  has_default
%para4_w2 : <Ref[Tensor(F32)], (4, 16), ref_key=:w2>  :  has_default
%para12_u : <UMonad>

subgraph @1_construct_wrapper.337(%para1_x, %para2_w, %para4_w2, %para12_u) {
%11([CNode]471) = Load(%para2_w, U)
    : (<Ref[Tensor(F32)], (8, 16), ref_key=:w>, <UMonad>) -> (<Tensor[Float32], (8, 16)>)
    # scope: (Default/network-WithLossCell)
%12(equivout) = MatMul(%para1_x, %11) {instance name: matmul} primitive_attrs: {input_names: [x1, x2], out_strategy: None, transpose_x2: false, transpose_b: false, in_strategy: ((2, 4), (4, 1)), output_names: [output], transpose_a: false, transpose_x1: false} {in_strategy: ((2, 4), (4, 1))}
    : (<Tensor[Float32], (8, 8)>, <Tensor[Float32], (8, 16)>) -> (<Tensor[Float32], (8, 16)>)
    # scope: (Default/network-WithLossCell/_backbone-Net)
    # In file /home/jenkins/my_dir/parallel_training_quick_start/device/./matmul.py(45)/        out = self.matmul(x, self.weight)/
%13(equiv[CNode]520) = AllReduce(%12) {instance name: forward_op_11795743325248501408} primitive_attrs: {group: 4-6301172352641561019, fusion: 0, op: sum, rank_list: (0, 1, 2, 3), group_ranks: 0-1-2-3, index: 0, group_rank_ids: (0, 1, 2, 3), no_eliminate: true} cnode_attrs: {comm_reuse: true}
    : (<Tensor[Float32], (8, 16)>) -> (<Tensor[Float32], (8, 16)>)
    # scope: (Default/network-WithLossCell/_backbone-Net)
%14(equiv[CNode]519) = StridedSlice(%13, (0, 0), (8, 4), (1, 1)) {instance name: redistribution_op_16390315056374637535StridedSlice} primitive_attrs: {new_axis_mask: 0, shrink_axis_mask: 0, end_mask: 0, input_names: [x, begin, end, strides], output_names: [output], keep_value_node_input: true, begin_mask: 0, ellipsis_mask: 0}
    : (<Tensor[Float32], (8, 16)>, <Tuple[Int64*2], sequence_nodes={node={ValueNode<ValueTuple> (0, 0), elements_use_flags: {ptr: 0x560e8fef5fa0, value: [const vector][1, 1]}}, node={<freed node>}}>, <Tuple[Int64*2]>, <Tuple[Int64*2]>) -> (<Tensor[Float32], (8, 4)>)
    # scope: (Default/network-WithLossCell/_backbone-Net)
%15(equivout) = ReLU(%14) {instance name: relu} primitive_attrs: {output_names: [output], input_names: [x]} {in_strategy: ((2, 4))}
    : (<Tensor[Float32], (8, 4)>) -> (<Tensor[Float32], (8, 4)>)
%16(equiv[CNode]472) = Load($(@1_construct_wrapper.337:para4_w2), %para12_u)
    : (<Ref[Tensor(F32)], (4, 16), ref_key=:w2>, <UMonad>) -> (<Tensor[Float32], (4, 16)>)
%17(equivout) = MatMul(%15, %16) {instance name: matmul2} primitive_attrs: {output_names: [output], transpose_a: false, input_names: [x1, x2], transpose_x2: false, transpose_x1: false, transpose_b: false} {in_strategy: ((2, 4), (4, 1))}
    : (<Tensor[Float32], (8, 4)>, <Tensor[Float32], (4, 16)>) -> (<Tensor[Float32], (8, 16)>)
%18(split) = Split(%17) {instance name: split} primitive_attrs: {axis: 0, output_num: 2}
    : (<Tensor[Float32], (8, 16)>) -> (<Tuple[Tensor[Float32]*2], TupleShape((4, 16), (4, 16))>)
Return(%17)
    : (<Tensor[Float32], (8, 16)>) -> (<Tensor[Float32], (8, 16)>)
    # scope: (Default)
}
"#;
    let g = parse_graph(src, "rank_0.ir").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(g.name, "1_construct_wrapper.337");
    assert_eq!(g.nodes.len(), 6, "the two Loads are aliases, not nodes");
    assert_eq!(
        g.nodes[0].inputs,
        vec![
            Operand::Param(shardc_ir::ParamId(0)),
            Operand::Param(shardc_ir::ParamId(1))
        ]
    );
    assert_eq!(g.nodes[0].comments.len(), 1);
    assert!(g.nodes[0].comments[0].starts_with("In file "));
    assert_eq!(
        g.params[1].kind,
        ParamKind::Weight {
            init: Init::Zeros,
            requires_grad: true
        }
    );
    assert_eq!(
        g.nodes[1].attrs.get("group"),
        Some(&Attr::Str("4-6301172352641561019".into()))
    );
    assert_eq!(
        g.nodes[1].cnode_attrs.get("comm_reuse"),
        Some(&Attr::Bool(true))
    );
    assert_eq!(g.nodes[3].in_strategy, Some(Strategy(vec![vec![2, 4]])));
    assert_eq!(g.nodes[4].inputs[1], Operand::Param(shardc_ir::ParamId(2)));
    assert_eq!(
        g.nodes[4].ty.as_tensor().map(|t| t.shape.clone()),
        Some(vec![8, 16])
    );
    let tuple = &g.nodes[5].ty;
    assert_eq!(tuple.tensors().len(), 2);
    assert_eq!(tuple.tensors()[1].shape, vec![4, 16]);
    assert_eq!(tuple.tensors()[1].dtype, DType::Float32);
    // It prints in shardc's form and round-trips from there.
    let text = print_graph(&g);
    assert_eq!(print_graph(&parse_graph(&text, "again.ir").unwrap()), text);
}

#[test]
fn ids_may_be_any_numbers_and_crlf_is_accepted() {
    let src = "%para1_x : <Tensor[Float32], (2)>\r\n\r\nsubgraph @G(%para1_x) {\r\n  %40(a) = Neg(%para1_x)\r\n  %7(b) = Exp(%40)\r\n      # scope: (S)\r\n  Return(%7, %40)\r\n}\r\n";
    let g = parse_graph(src, "crlf.ir").unwrap();
    assert_eq!(g.nodes.len(), 2);
    assert_eq!(g.nodes[1].inputs, vec![Operand::Node(shardc_ir::NodeId(0))]);
    assert_eq!(g.nodes[1].scope, "S");
    assert_eq!(
        g.outputs,
        vec![
            Operand::Node(shardc_ir::NodeId(1)),
            Operand::Node(shardc_ir::NodeId(0))
        ]
    );
}

/// A small valid file to corrupt, one line at a time.
const BASE: &str = "\
%para1_x : <Tensor[Float32], (16, 32)>
%para2_w : <Ref[Tensor(F32)], (32, 16), ref_key=:w>  :  has_default  init: normal(sigma=0.01, seed=1)

subgraph @Net(%para1_x, %para2_w) {
  %1(out) = MatMul(%para1_x, %para2_w) {instance name: matmul} primitive_attrs: {transpose_a: false}
  Return(%1)
}
";

#[test]
fn the_base_of_the_error_table_parses() {
    parse_graph(BASE, "model.ir").unwrap();
}

#[test]
fn errors_name_file_line_column_expected_and_found() {
    let node = "  %1(out) = MatMul(%para1_x, %para2_w) {instance name: matmul} primitive_attrs: {transpose_a: false}";
    let cases: &[(&str, &str, &str)] = &[
        // (text to replace in BASE, replacement, expected message)
        (node, "  %1(out) = MatMul(%para1_x x)", "model.ir:5:29: expected ',' or ')', found 'x'"),
        (node, "  %1(out) = MatMull(%para1_x)", "model.ir:5:13: expected an op name such as MatMul, found 'MatMull'"),
        (node, "  %1(out) = MatMul(%para1_x, %2)", "model.ir:5:30: expected a node id defined above, found '%2'"),
        (node, "  %1(out) = MatMul(%para1_x, %para3_z)", "model.ir:5:30: expected a declared parameter, found '%para3_z'"),
        (node, "  %1(out) = MatMul(%para1_x, foo)", "model.ir:5:30: expected an operand (%ID, %paraN_name or a constant), found 'foo'"),
        (node, "  %1(out) = MatMul(%para1_x, (1, x))", "model.ir:5:34: expected an integer, found 'x'"),
        (node, "  %1(out) = MatMul(%para1_x) primitive_attrs: {a: (1, 2}", "model.ir:5:56: expected ',' or ')', found '}'"),
        (node, "  %1(out) = MatMul(%para1_x) primitive_attrs: {a: \"open}", "model.ir:5:57: expected '\"', found end of line"),
        (node, "  %1(out) = MatMul(%para1_x) {in_strategy: (2, 4)}", "model.ir:5:44: expected a strategy such as ((2, 4), (4, 1)) or None, found '('"),
        (node, "  %1(out) = MatMul(%para1_x) primitive_attrs: {a: 1, a: 2}", "model.ir:5:54: expected an attribute name not used before, found 'a'"),
        (node, "  %1(out) = MatMul(%para1_x) trailing", "model.ir:5:30: expected '{', 'primitive_attrs', 'cnode_attrs' or end of line, found 'trailing'"),
        (node, "  %1(out) = MatMul(%para1_x)\n      : (<Tensor[Float32], (16, 32)>) -> (<Tensor[Float33], (16, 16)>)", "model.ir:6:51: expected an element type such as Float32, found 'Float33'"),
        (node, "  %1(out) = MatMul(%para1_x)\n      : (<Tensor[Float32], (16, 32)> -> (<Tensor[Float32], (16, 16)>)", "model.ir:6:70: expected ')', found end of line"),
        (node, "  %x(out) = MatMul(%para1_x)", "model.ir:5:3: expected a node id such as %1, found '%x'"),
        ("(16, 32)>\n", "(16, -32)>\n", "model.ir:1:35: expected a dimension size, found '-32'"),
        ("ref_key=:w>", "ref_key=:v>", "model.ir:2:50: expected ref_key=:w, found 'v'"),
        ("init: normal(sigma=0.01, seed=1)", "init: normal(sigma=0.01, seed=x)", "model.ir:2:100: expected a seed (a non-negative integer), found 'x'"),
        ("init: normal(sigma=0.01, seed=1)", "init: gaussian(sigma=0.01)", "model.ir:2:76: expected an initializer (normal, uniform, zeros, ones, constant, xavier_uniform, he_normal), found 'gaussian'"),
        ("subgraph @Net(%para1_x, %para2_w)", "subgraph @Net(%para2_w, %para1_x)", "model.ir:4:15: expected %para1_x (the declared parameters, in order), found '%para2_w'"),
        ("subgraph @Net(%para1_x, %para2_w)", "subgraph @Net(%para1_x)", "model.ir:4:23: expected %para2_w (the declared parameters, in order), found ')'"),
        ("%para1_x : <Tensor[Float32], (16, 32)>", "%para1_x : <Tensr[Float32], (16, 32)>", "model.ir:1:13: expected Tensor or Ref, found 'Tensr'"),
        ("  Return(%1)\n}\n", "  Return(%1)\n", "model.ir:7:1: expected '}', found end of file"),
        ("  Return(%1)\n}\n", "  Return(%1)\n}\nextra\n", "model.ir:8:1: expected end of file, found 'extra'"),
        ("subgraph", "subgraf", "model.ir:4:1: expected a parameter line or 'subgraph', found 'subgraf'"),
    ];
    let mut wrong = Vec::new();
    for (from, to, expected) in cases {
        assert!(BASE.contains(from), "{from:?} not in BASE");
        let src = BASE.replacen(from, to, 1);
        match parse_graph(&src, "model.ir") {
            Ok(_) => wrong.push(format!("{to:?} parsed, expected {expected}")),
            Err(e) if e.to_string() != *expected => {
                wrong.push(format!("{to:?}\n   got: {e}\n  want: {expected}"))
            }
            Err(_) => {}
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn empty_and_tiny_inputs_are_errors_not_panics() {
    assert_eq!(
        parse_graph("", "e.ir").unwrap_err().to_string(),
        "e.ir:1:1: expected a parameter line or 'subgraph', found end of file"
    );
    for src in [
        "%",
        "%para",
        "%para1_",
        "subgraph",
        "subgraph @",
        "subgraph @N(",
        "subgraph @N() {",
        "subgraph @N() {\n  %1(",
        "é",
        "\"",
        "subgraph @N() {\n  Return(%1)\n}\n",
    ] {
        assert!(parse_graph(src, "t.ir").is_err(), "{src:?}");
    }
    // An empty graph is fine.
    let g = parse_graph("subgraph @N() {\n  Return()\n}\n", "t.ir").unwrap();
    assert!(g.nodes.is_empty() && g.outputs.is_empty());
}

#[test]
fn deep_nesting_is_an_error_not_a_stack_overflow() {
    let deep = format!("{}1{}", "(".repeat(100_000), ")".repeat(100_000));
    let src = BASE.replace("transpose_a: false", &format!("a: {deep}"));
    let e = parse_graph(&src, "deep.ir").unwrap_err();
    assert!(
        e.to_string()
            .contains("expected at most 64 levels of nested tuples and lists"),
        "{e}"
    );
    let ok = format!("{}1{}", "[".repeat(64), "]".repeat(64));
    parse_graph(
        &BASE.replace("transpose_a: false", &format!("a: {ok}")),
        "ok.ir",
    )
    .unwrap();
}
