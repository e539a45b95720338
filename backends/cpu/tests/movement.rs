//! Reshape, Transpose, BroadcastTo, StridedSlice (+Grad), Concat, Split, Gather,
//! UnsortedSegmentSum, OneHot.

mod common;

use common::*;
use shardc_backend_cpu::CpuBackend;
use shardc_ir::{Attr, Const, DType, OpKind};
use shardc_runtime::{Data, Tensor};

fn iota(shape: &[usize]) -> Tensor {
    t64(shape, (0..numel(shape)).map(|i| i as f64).collect())
}

#[test]
fn reshape_copies_any_dtype() {
    let x = Tensor {
        shape: vec![2, 3],
        data: Data::I64(vec![1, 2, 3, 4, 5, 6]),
    };
    let got = op(OpKind::Reshape)
        .t(x)
        .c(ints(&[3, -1]))
        .out(DType::Int64, &[3, 2])
        .run();
    assert_eq!(got[0].data, Data::I64(vec![1, 2, 3, 4, 5, 6]));
    let bad = op(OpKind::Reshape)
        .t(iota(&[2, 3]))
        .c(ints(&[4]))
        .out(DType::Float64, &[4]);
    assert!(bad.run_on(&CpuBackend::with_threads(1)).is_err());
}

fn ref_transpose(shape: &[usize], x: &[f64], perm: &[usize]) -> (Vec<usize>, Vec<f64>) {
    let out: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
    let v = (0..x.len())
        .map(|i| {
            let oi = unravel(i, &out);
            let mut ii = vec![0; shape.len()];
            for (j, &p) in perm.iter().enumerate() {
                ii[p] = oi[j];
            }
            x[ravel(&ii, shape)]
        })
        .collect();
    (out, v)
}

#[test]
fn transpose_any_permutation() {
    let cases: &[(&[usize], &[usize])] = &[
        (&[3, 5], &[1, 0]),
        (&[70, 45], &[1, 0]),
        (&[2, 3, 4], &[0, 2, 1]),
        (&[2, 3, 4], &[2, 0, 1]),
        (&[2, 3, 4], &[1, 0, 2]),
        (&[2, 3, 4, 5], &[3, 1, 0, 2]),
        (&[2, 1, 4, 5], &[0, 3, 2, 1]),
        (&[4, 33, 65], &[2, 1, 0]),
        (&[3, 4], &[0, 1]),
    ];
    for &(shape, perm) in cases {
        let x = iota(shape);
        let (out, want) = ref_transpose(shape, &x.to_f64_vec(), perm);
        let perm_i: Vec<i64> = perm.iter().map(|&p| p as i64).collect();
        let case = op(OpKind::Transpose)
            .t(x)
            .c(ints(&perm_i))
            .out(DType::Float64, &out);
        check(&case, &[want]);
    }
    // Bool data, negative axes.
    let x = Tensor {
        shape: vec![2, 2],
        data: Data::Bool(vec![true, false, false, false]),
    };
    let got = op(OpKind::Transpose)
        .t(x)
        .c(ints(&[-1, -2]))
        .out(DType::Bool, &[2, 2])
        .run();
    assert_eq!(got[0].data, Data::Bool(vec![true, false, false, false]));
    let bad = op(OpKind::Transpose)
        .t(iota(&[2, 3]))
        .c(ints(&[0, 0]))
        .out(DType::Float64, &[2, 3]);
    assert!(bad.run_on(&CpuBackend::with_threads(1)).is_err());
}

#[test]
fn broadcast_to_shapes() {
    let cases: &[(&[usize], &[usize])] = &[
        (&[3], &[2, 3]),
        (&[2, 1], &[2, 4]),
        (&[1, 3, 1], &[2, 3, 4]),
        (&[], &[3]),
    ];
    for &(from, to) in cases {
        let x = iota(from);
        let xv = x.to_f64_vec();
        let lead = to.len() - from.len();
        let want: Vec<f64> = (0..numel(to))
            .map(|i| {
                let idx = unravel(i, to);
                let src: Vec<usize> = from
                    .iter()
                    .enumerate()
                    .map(|(d, &s)| if s == 1 { 0 } else { idx[lead + d] })
                    .collect();
                xv[ravel(&src, from)]
            })
            .collect();
        let to_i: Vec<i64> = to.iter().map(|&d| d as i64).collect();
        check(
            &op(OpKind::BroadcastTo)
                .t(x)
                .c(ints(&to_i))
                .out(DType::Float64, to),
            &[want],
        );
    }
}

/// Python slicing per dim with positive steps: the kept indices.
fn py_range(n: usize, b: i64, e: i64, s: i64) -> Vec<usize> {
    let norm = |v: i64| {
        let v = if v < 0 { v + n as i64 } else { v };
        v.clamp(0, n as i64)
    };
    let (b, e) = (norm(b), norm(e));
    (b..e.max(b))
        .step_by(s as usize)
        .map(|v| v as usize)
        .collect()
}

#[test]
fn strided_slice_and_its_gradient() {
    let shape = [5, 6, 7];
    let x = iota(&shape);
    let xv = x.to_f64_vec();
    let cases: &[(&[i64], &[i64], &[i64])] = &[
        (&[0, 0, 0], &[5, 6, 7], &[1, 1, 1]),
        (&[1, 2, 3], &[4, 5, 6], &[1, 1, 1]),
        (&[0, 1, 0], &[5, 6, 7], &[2, 2, 3]),
        (&[-3, -5, 1], &[-1, 100, -2], &[1, 2, 2]),
        (&[-100, 0], &[2, 3], &[1, 1]),
        (&[3], &[1], &[1]),
    ];
    for &(b, e, s) in cases {
        let ranges: Vec<Vec<usize>> = (0..3)
            .map(|d| {
                if d < b.len() {
                    py_range(shape[d], b[d], e[d], s[d])
                } else {
                    (0..shape[d]).collect()
                }
            })
            .collect();
        let out: Vec<usize> = ranges.iter().map(Vec::len).collect();
        let mut want = Vec::new();
        let mut grad = vec![0.0; xv.len()];
        let dy: Vec<f64> = (0..numel(&out)).map(|i| 1.0 + i as f64).collect();
        for (i, &d) in dy.iter().enumerate() {
            let idx = unravel(i, &out);
            let src: Vec<usize> = (0..3).map(|d| ranges[d][idx[d]]).collect();
            want.push(xv[ravel(&src, &shape)]);
            grad[ravel(&src, &shape)] = d;
        }
        let case = op(OpKind::StridedSlice)
            .t(x.clone())
            .c(ints(b))
            .c(ints(e))
            .c(ints(s))
            .out(DType::Float64, &out);
        check(&case, &[want]);
        let case = op(OpKind::StridedSliceGrad)
            .t(t64(&out, dy))
            .c(ints(&[5, 6, 7]))
            .c(ints(b))
            .c(ints(e))
            .c(ints(s))
            .out(DType::Float64, &shape);
        check(&case, &[grad]);
    }
    // Masks and non-positive strides are refused.
    let bad = op(OpKind::StridedSlice)
        .attr("shrink_axis_mask", Attr::Int(1))
        .t(x.clone())
        .c(ints(&[0]))
        .c(ints(&[1]))
        .c(ints(&[1]))
        .out(DType::Float64, &[1, 6, 7]);
    assert!(bad.run_on(&CpuBackend::with_threads(1)).is_err());
    let bad = op(OpKind::StridedSlice)
        .t(x)
        .c(ints(&[4]))
        .c(ints(&[0]))
        .c(ints(&[-1]))
        .out(DType::Float64, &[4, 6, 7]);
    assert!(bad.run_on(&CpuBackend::with_threads(1)).is_err());
}

#[test]
fn concat_and_split() {
    let a = iota(&[2, 3, 4]);
    let b = t64(&[2, 1, 4], (100..108).map(|v| v as f64).collect());
    let c = t64(&[2, 2, 4], (200..216).map(|v| v as f64).collect());
    let (av, bv, cv) = (a.to_f64_vec(), b.to_f64_vec(), c.to_f64_vec());
    let mut want = Vec::new();
    for o in 0..2 {
        want.extend_from_slice(&av[o * 12..][..12]);
        want.extend_from_slice(&bv[o * 4..][..4]);
        want.extend_from_slice(&cv[o * 8..][..8]);
    }
    let case = op(OpKind::Concat)
        .attr("axis", Attr::Int(1))
        .t(a.clone())
        .t(b)
        .t(c)
        .out(DType::Float64, &[2, 6, 4]);
    check(&case, std::slice::from_ref(&want));
    // Split undoes it (axis -2, three equal parts of 2).
    let parts = op(OpKind::Split)
        .attr("axis", Attr::Int(-2))
        .attr("output_num", Attr::Int(3))
        .t(t64(&[2, 6, 4], want.clone()))
        .out(DType::Float64, &[2, 2, 4])
        .out(DType::Float64, &[2, 2, 4])
        .out(DType::Float64, &[2, 2, 4])
        .run();
    for (p, part) in parts.iter().enumerate() {
        let mut expect = Vec::new();
        for o in 0..2 {
            expect.extend_from_slice(&want[o * 24 + p * 8..][..8]);
        }
        assert_eq!(part.to_f64_vec(), expect);
    }
    // Concat along axis 0 of Int32.
    let x = Tensor {
        shape: vec![1, 2],
        data: Data::I32(vec![1, 2]),
    };
    let y = Tensor {
        shape: vec![2, 2],
        data: Data::I32(vec![3, 4, 5, 6]),
    };
    let got = op(OpKind::Concat)
        .t(x)
        .t(y)
        .out(DType::Int32, &[3, 2])
        .run();
    assert_eq!(got[0].data, Data::I32(vec![1, 2, 3, 4, 5, 6]));
    // Mismatched off-axis dims are an error.
    let bad = op(OpKind::Concat)
        .t(iota(&[2, 3]))
        .t(iota(&[3, 3]))
        .attr("axis", Attr::Int(1))
        .out(DType::Float64, &[2, 6]);
    assert!(bad.run_on(&CpuBackend::with_threads(1)).is_err());
}

#[test]
fn gather_and_unsorted_segment_sum() {
    let params = iota(&[4, 3, 5]);
    let pv = params.to_f64_vec();
    for (axis, dim) in [(0i64, 4usize), (1, 3), (-1, 5)] {
        let ax = if axis < 0 { 2 } else { axis as usize };
        let idx: Vec<i64> = vec![2, 0, (dim - 1) as i64, 1, 1, 0];
        let idx_shape = [2, 3];
        let mut out_shape = params.shape[..ax].to_vec();
        out_shape.extend(idx_shape);
        out_shape.extend_from_slice(&params.shape[ax + 1..]);
        let want: Vec<f64> = (0..numel(&out_shape))
            .map(|i| {
                let oi = unravel(i, &out_shape);
                let mut src = oi[..ax].to_vec();
                src.push(idx[oi[ax] * 3 + oi[ax + 1]] as usize);
                src.extend_from_slice(&oi[ax + 2..]);
                pv[ravel(&src, &[4, 3, 5])]
            })
            .collect();
        for indices in [
            Tensor {
                shape: idx_shape.to_vec(),
                data: Data::I32(idx.iter().map(|&v| v as i32).collect()),
            },
            Tensor {
                shape: idx_shape.to_vec(),
                data: Data::I64(idx.clone()),
            },
        ] {
            let case = op(OpKind::Gather)
                .t(params.clone())
                .t(indices)
                .c(Const::Int(axis))
                .out(DType::Float64, &out_shape);
            check(&case, std::slice::from_ref(&want));
        }
    }
    let bad = op(OpKind::Gather)
        .t(params.clone())
        .t(Tensor {
            shape: vec![1],
            data: Data::I32(vec![4]),
        })
        .c(Const::Int(0))
        .out(DType::Float64, &[1, 3, 5]);
    let e = bad.run_on(&CpuBackend::with_threads(1)).unwrap_err();
    assert!(e.to_string().contains("index 4"), "{e}");

    // UnsortedSegmentSum: ids of shape (2, 3) over x (2, 3, 4); a negative id is dropped.
    let x = iota(&[2, 3, 4]);
    let xv = x.to_f64_vec();
    let ids = [3i64, 0, 3, -1, 1, 0];
    let mut want = vec![0.0; 5 * 4];
    for (i, &id) in ids.iter().enumerate() {
        if id >= 0 {
            for j in 0..4 {
                want[id as usize * 4 + j] += xv[i * 4 + j];
            }
        }
    }
    for seg in [
        Tensor {
            shape: vec![2, 3],
            data: Data::I32(ids.iter().map(|&v| v as i32).collect()),
        },
        Tensor {
            shape: vec![2, 3],
            data: Data::I64(ids.to_vec()),
        },
    ] {
        let case = op(OpKind::UnsortedSegmentSum)
            .t(x.clone())
            .t(seg)
            .c(Const::Int(5))
            .out(DType::Float64, &[5, 4]);
        check(&case, std::slice::from_ref(&want));
    }
    let bad = op(OpKind::UnsortedSegmentSum)
        .t(x)
        .t(Tensor {
            shape: vec![2],
            data: Data::I64(vec![0, 9]),
        })
        .c(Const::Int(5))
        .out(DType::Float64, &[5, 3, 4]);
    assert!(bad.run_on(&CpuBackend::with_threads(1)).is_err());
}

#[test]
fn one_hot_on_any_axis() {
    let idx = [1i64, 0, 3, 2, 5, -1];
    for indices in [
        Tensor {
            shape: vec![2, 3],
            data: Data::I32(idx.iter().map(|&v| v as i32).collect()),
        },
        Tensor {
            shape: vec![2, 3],
            data: Data::I64(idx.to_vec()),
        },
    ] {
        for (axis, out_shape) in [
            (-1i64, vec![2, 3, 4]),
            (0, vec![4, 2, 3]),
            (1, vec![2, 4, 3]),
        ] {
            let want: Vec<f64> = (0..24)
                .map(|i| {
                    let oi = unravel(i, &out_shape);
                    let (d, rest): (usize, Vec<usize>) = match axis {
                        -1 => (oi[2], vec![oi[0], oi[1]]),
                        0 => (oi[0], vec![oi[1], oi[2]]),
                        _ => (oi[1], vec![oi[0], oi[2]]),
                    };
                    if idx[rest[0] * 3 + rest[1]] == d as i64 {
                        2.0
                    } else {
                        -0.5
                    }
                })
                .collect();
            let case = op(OpKind::OneHot)
                .attr("axis", Attr::Int(axis))
                .t(indices.clone())
                .c(Const::Int(4))
                .c(Const::Float(2.0))
                .c(Const::Float(-0.5))
                .out(DType::Float64, &out_shape);
            check(&case, &[want]);
        }
    }
}

/// A block of a vocabulary-split table (`global_shape`, `offset`): rows outside the block give
/// zeros, indices are checked against the whole table; the blocks' results sum to the lookup.
/// UnsortedSegmentSum into a block of segments sums only the ids that fall in it.
#[test]
fn gather_and_segment_sum_on_blocks_sum_to_the_whole() {
    let cpu = CpuBackend::with_threads(1);
    let table = iota(&[6, 2]);
    let tv = table.to_f64_vec();
    let idx = Tensor {
        shape: vec![4],
        data: Data::I32(vec![5, 0, 2, 5]),
    };
    let block = |rows: std::ops::Range<usize>| {
        t64(&[rows.len(), 2], tv[rows.start * 2..rows.end * 2].to_vec())
    };
    let mut sum = vec![0.0; 8];
    for lo in [0usize, 3] {
        let got = op(OpKind::Gather)
            .t(block(lo..lo + 3))
            .t(idx.clone())
            .c(Const::Int(0))
            .attr("global_shape", attr_ints(&[6, 2]))
            .attr("offset", attr_ints(&[lo as i64, 0]))
            .out(DType::Float64, &[4, 2])
            .run_on(&cpu)
            .unwrap();
        for (k, &i) in [5usize, 0, 2, 5].iter().enumerate() {
            let inside = (lo..lo + 3).contains(&i);
            for j in 0..2 {
                let v = got[0].to_f64_vec()[k * 2 + j];
                assert_eq!(v, if inside { tv[i * 2 + j] } else { 0.0 });
                sum[k * 2 + j] += v;
            }
        }
    }
    let whole: Vec<f64> = [5usize, 0, 2, 5]
        .iter()
        .flat_map(|&i| [tv[i * 2], tv[i * 2 + 1]])
        .collect();
    assert_eq!(sum, whole);
    // Index 6 is outside the whole table: an error even though no block holds it.
    let e = op(OpKind::Gather)
        .t(block(3..6))
        .t(Tensor {
            shape: vec![1],
            data: Data::I32(vec![6]),
        })
        .c(Const::Int(0))
        .attr("global_shape", attr_ints(&[6, 2]))
        .attr("offset", attr_ints(&[3, 0]))
        .out(DType::Float64, &[1, 2])
        .run_on(&cpu)
        .unwrap_err();
    assert!(
        e.to_string().contains("index 6") && e.to_string().contains("size 6"),
        "{e}"
    );
    // A block that does not fit the table is refused.
    let e = op(OpKind::Gather)
        .t(block(3..6))
        .t(idx.clone())
        .c(Const::Int(0))
        .attr("global_shape", attr_ints(&[6, 2]))
        .attr("offset", attr_ints(&[4, 0]))
        .out(DType::Float64, &[4, 2])
        .run_on(&cpu)
        .unwrap_err();
    assert!(e.to_string().contains("does not fit"), "{e}");

    // Segments: x (4, 2) summed by ids into 6 segments, as two blocks of 3.
    let x = iota(&[4, 2]);
    let xv = x.to_f64_vec();
    let ids = Tensor {
        shape: vec![4],
        data: Data::I64(vec![5, 0, 5, -1]),
    };
    let mut whole = [0.0; 12];
    for (k, &id) in [5usize, 0, 5].iter().enumerate() {
        for j in 0..2 {
            whole[id * 2 + j] += xv[k * 2 + j];
        }
    }
    for lo in [0usize, 3] {
        let got = op(OpKind::UnsortedSegmentSum)
            .t(x.clone())
            .t(ids.clone())
            .c(Const::Int(3))
            .attr("global_shape", attr_ints(&[6, 2]))
            .attr("offset", attr_ints(&[lo as i64, 0]))
            .out(DType::Float64, &[3, 2])
            .run_on(&cpu)
            .unwrap();
        assert_eq!(
            got[0].to_f64_vec(),
            whole[lo * 2..lo * 2 + 6].to_vec(),
            "block at {lo}"
        );
    }
    let e = op(OpKind::UnsortedSegmentSum)
        .t(x)
        .t(Tensor {
            shape: vec![4],
            data: Data::I64(vec![0, 6, 1, 2]),
        })
        .c(Const::Int(3))
        .attr("global_shape", attr_ints(&[6, 2]))
        .attr("offset", attr_ints(&[3, 0]))
        .out(DType::Float64, &[3, 2])
        .run_on(&cpu)
        .unwrap_err();
    assert!(e.to_string().contains("not below num_segments 6"), "{e}");
}
