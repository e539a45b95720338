//! Malformed invocations (wrong operand counts, shapes, types, result shapes) return a
//! `KernelError` naming the op; no kernel panics.

mod common;

use common::*;
use shardc_backend_cpu::CpuBackend;
use shardc_ir::{Attr, Const, DType, OpKind};
use shardc_runtime::{Data, Tensor};

fn operand_sets() -> Vec<Vec<In>> {
    let f = |shape: &[usize]| {
        In::T(to_f32(&t64(
            shape,
            (0..numel(shape)).map(|i| i as f64 * 0.1).collect(),
        )))
    };
    let i32s = |shape: &[usize]| {
        In::T(Tensor {
            shape: shape.to_vec(),
            data: Data::I32((0..numel(shape) as i32).map(|i| i * 7 - 3).collect()),
        })
    };
    vec![
        vec![],
        vec![In::C(Const::Float(1.0))],
        vec![f(&[])],
        vec![f(&[2, 3])],
        vec![f(&[2, 3]), f(&[3])],
        vec![f(&[2, 3]), f(&[4, 5])],
        vec![f(&[2, 3]), In::C(ints(&[5, -9]))],
        vec![f(&[2, 3]), In::C(ints(&[]))],
        vec![f(&[2, 3]), i32s(&[4])],
        vec![i32s(&[2, 3]), f(&[2, 3])],
        vec![
            f(&[1, 2, 5, 5]),
            f(&[3, 2, 3, 3]),
            In::C(ints(&[1, 2, 9, 9])),
        ],
        vec![f(&[1, 2, 5, 5]), f(&[3, 1, 7, 7])],
        vec![f(&[2, 3]); 10],
        vec![
            f(&[2, 3]),
            In::C(ints(&[0, 0])),
            In::C(ints(&[9, 9])),
            In::C(ints(&[0, 1])),
        ],
        vec![f(&[2, 3]), i32s(&[2]), In::C(Const::Int(-4))],
    ]
}

fn result_sets() -> Vec<Vec<(DType, Vec<usize>)>> {
    vec![
        vec![],
        vec![(DType::Float32, vec![2, 3])],
        vec![(DType::Float32, vec![])],
        vec![(DType::Float32, vec![7, 1, 2])],
        vec![(DType::Int32, vec![2, 3])],
        vec![(DType::Float32, vec![2, 3]); 5],
        vec![(DType::Float32, vec![3]); 3],
    ]
}

#[test]
fn malformed_invocations_are_errors_not_panics() {
    let backend = CpuBackend::with_threads(1);
    let attr_sets: Vec<Vec<(&str, Attr)>> = vec![
        vec![],
        vec![
            ("axis", Attr::Int(7)),
            ("kernel_size", Attr::Int(9)),
            ("group", Attr::Int(3)),
            ("output_num", Attr::Int(0)),
            ("begin_norm_axis", Attr::Int(-9)),
        ],
        vec![
            ("pad_mode", word("weird")),
            ("stride", Attr::Int(0)),
            ("keep_prob", Attr::Float(2.0)),
        ],
    ];
    let mut runs = 0;
    for &kind in OpKind::ALL {
        for args in operand_sets() {
            for outs in result_sets() {
                for attrs in &attr_sets {
                    let mut case = op(kind);
                    for (k, v) in attrs {
                        case = case.attr(k, v.clone());
                    }
                    for a in &args {
                        case = match a {
                            In::T(t) => case.t(t.clone()),
                            In::C(c) => case.c(c.clone()),
                        };
                    }
                    for (d, s) in &outs {
                        case = case.out(*d, s);
                    }
                    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        case.run_on(&backend)
                    }));
                    match result {
                        Ok(Err(e)) => assert_eq!(e.op, kind),
                        Ok(Ok(_)) => {}
                        Err(_) => panic!("{kind} panicked on operands {args:?} and results {outs:?} with {attrs:?}"),
                    }
                    runs += 1;
                }
            }
        }
    }
    assert!(runs > 1000);
}

#[test]
fn rank_zero_axis_is_an_error() {
    let case = op(OpKind::Softmax)
        .t(t64(&[], vec![1.0]))
        .out(DType::Float64, &[]);
    let e = case.run_on(&CpuBackend::with_threads(1)).unwrap_err();
    assert!(e.to_string().contains("axis"), "{e}");
}
