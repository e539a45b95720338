//! Checkpoints: the safetensors round trip of every dtype, corruption of every kind refused
//! with the file's name, atomic writes (temporary files ignored), pruning, resuming from the
//! newest complete step, and merging ranks' blocks (split and replicated).

use half::{bf16, f16};
use shardc_ir::{DType, Graph, Init, Param, ParamKind, ReduceOp, TensorLayout, TensorType};
use shardc_runtime::checkpoint::{
    self, identity_of_graph, Checkpoint, CheckpointError, CheckpointMeta,
};
use shardc_runtime::{Data, Tensor};
use std::collections::BTreeMap;
use std::path::Path;

fn meta(model: &str, rank: u32, n: u32, step: u64, identity: String) -> CheckpointMeta {
    CheckpointMeta {
        model: model.into(),
        rank,
        device_num: n,
        step,
        epoch: 1,
        identity,
    }
}

fn f32s(shape: &[usize], f: impl Fn(usize) -> f32) -> Tensor {
    let n = shape.iter().product();
    Tensor::from_f32(shape.to_vec(), (0..n).map(f).collect()).unwrap()
}

fn weight(name: &str, shape: &[usize], init: Init) -> Param {
    Param {
        name: name.into(),
        ty: TensorType::new(DType::Float32, shape.to_vec()),
        kind: ParamKind::Weight {
            init,
            requires_grad: true,
        },
    }
}

/// A graph holding one weight `w` of shape `shape` (the block at `offset` of `global`).
fn graph_with_w(shape: &[usize], global: &[usize], offset: &[usize]) -> Graph {
    let mut g = Graph::new("Net");
    g.add_param(Param {
        name: "x".into(),
        ty: TensorType::new(DType::Float32, vec![2, 2]),
        kind: ParamKind::Input,
    });
    let init = if shape == global {
        Init::Zeros
    } else {
        Init::Block {
            of: Box::new(Init::Zeros),
            global_shape: global.to_vec(),
            offset: offset.to_vec(),
        }
    };
    g.add_param(weight("w", shape, init));
    g
}

fn cp_for(g: &Graph, rank: u32, n: u32, step: u64, w: Tensor) -> Checkpoint {
    Checkpoint {
        meta: meta(&g.name, rank, n, step, identity_of_graph(g)),
        tensors: vec![("w".into(), w)],
    }
}

fn tmpdir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

#[test]
fn every_dtype_round_trips_bit_for_bit() {
    let tensors = vec![
        ("a_f32".to_string(), f32s(&[2, 3], |i| i as f32 * -0.5)),
        (
            "b_f64".to_string(),
            Tensor::from_f64(vec![3], vec![f64::MIN_POSITIVE, -0.0, 1e300]).unwrap(),
        ),
        (
            "c_f16".to_string(),
            Tensor {
                shape: vec![2],
                data: Data::F16(vec![f16::from_f32(1.5), f16::NEG_INFINITY]),
            },
        ),
        (
            "d_bf16".to_string(),
            Tensor {
                shape: vec![2, 1],
                data: Data::BF16(vec![bf16::from_f32(-3.25), bf16::MAX]),
            },
        ),
        (
            "e_i32".to_string(),
            Tensor::from_i32(vec![2], vec![i32::MIN, 7]).unwrap(),
        ),
        (
            "f_i64".to_string(),
            Tensor::from_i64(vec![], vec![i64::MAX]).unwrap(),
        ),
        (
            "g_bool".to_string(),
            Tensor {
                shape: vec![3],
                data: Data::Bool(vec![true, false, true]),
            },
        ),
        (
            "h_nan".to_string(),
            Tensor::from_f32(vec![1], vec![f32::from_bits(0x7fc0_1234)]).unwrap(),
        ),
    ];
    let cp = Checkpoint {
        meta: meta("M", 1, 4, 12, "id".into()),
        tensors,
    };
    let dir = tmpdir();
    let path = dir.path().join("x.safetensors");
    checkpoint::save(&path, &cp).unwrap();
    let back = checkpoint::load(&path).unwrap();
    assert_eq!(back.meta, cp.meta);
    assert_eq!(back.tensors.len(), cp.tensors.len());
    for ((n1, t1), (n2, t2)) in cp.tensors.iter().zip(&back.tensors) {
        assert_eq!(n1, n2);
        assert_eq!(t1.dtype(), t2.dtype(), "{n1}");
        assert_eq!(t1.shape, t2.shape, "{n1}");
        assert_eq!(t1.to_le_bytes(), t2.to_le_bytes(), "{n1}");
    }
    assert_eq!(checkpoint::read_meta(&path).unwrap(), cp.meta);
    // No temporary file is left behind.
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("x.safetensors")]);
}

fn saved(dir: &Path) -> (std::path::PathBuf, Vec<u8>) {
    let g = graph_with_w(&[4, 4], &[4, 4], &[0, 0]);
    let cp = cp_for(&g, 0, 1, 3, f32s(&[4, 4], |i| i as f32));
    let path = dir.join("c.safetensors");
    checkpoint::save(&path, &cp).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    (path, bytes)
}

#[test]
fn a_flipped_data_byte_is_a_checksum_error_naming_the_file() {
    let dir = tmpdir();
    let (path, mut bytes) = saved(dir.path());
    let last = bytes.len() - 3;
    bytes[last] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();
    let e = checkpoint::load(&path).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, CheckpointError::Corrupt { .. }), "{msg}");
    assert!(msg.contains("c.safetensors"), "{msg}");
    assert!(msg.contains("checksum mismatch"), "{msg}");
}

#[test]
fn truncated_and_garbage_files_are_refused_with_the_reason() {
    let dir = tmpdir();
    let (path, bytes) = saved(dir.path());
    for (cut, want) in [
        (bytes.len() - 1, "truncated"),
        (20, "ends inside"),
        (4, "too short"),
    ] {
        std::fs::write(&path, &bytes[..cut]).unwrap();
        let e = checkpoint::load(&path).unwrap_err().to_string();
        assert!(e.contains("c.safetensors") && e.contains("corrupt"), "{e}");
        if cut == bytes.len() - 1 {
            assert!(e.contains(want), "{e}");
        }
        let m = checkpoint::read_meta(&path);
        if cut < 30 {
            let m = m.unwrap_err().to_string();
            assert!(m.contains(want), "cut {cut}: {m}");
        }
    }
    // A header that is not JSON.
    let mut bad = bytes.clone();
    bad[9] = b'#';
    std::fs::write(&path, &bad).unwrap();
    let e = checkpoint::load(&path).unwrap_err().to_string();
    assert!(e.contains("bad safetensors header"), "{e}");
    // A safetensors file without our metadata.
    let plain = safetensors_without_metadata();
    std::fs::write(&path, plain).unwrap();
    let e = checkpoint::load(&path).unwrap_err().to_string();
    assert!(e.contains("not a shardc checkpoint"), "{e}");
}

fn safetensors_without_metadata() -> Vec<u8> {
    let header = br#"{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#;
    let mut h = header.to_vec();
    while h.len() % 8 != 0 {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend(h);
    out.extend(1.0f32.to_le_bytes());
    out
}

#[test]
fn a_checkpoint_of_another_model_or_strategy_does_not_fit() {
    let dir = tmpdir();
    let g = graph_with_w(&[2, 4], &[4, 4], &[0, 0]);
    let cp = cp_for(&g, 0, 2, 1, f32s(&[2, 4], |i| i as f32));
    let p = dir.path().join("a.safetensors");
    cp.check_against(&p, &g, 0, 2).unwrap();
    // Same block shape, another block (the strategy changed): refused by the identity.
    let other = graph_with_w(&[2, 4], &[4, 4], &[2, 0]);
    let e = cp.check_against(&p, &other, 0, 2).unwrap_err().to_string();
    assert!(e.contains("identity") && e.contains("a.safetensors"), "{e}");
    // Another model name, another rank, another shape.
    let mut renamed = g.clone();
    renamed.name = "Other".into();
    assert!(cp
        .check_against(&p, &renamed, 0, 2)
        .unwrap_err()
        .to_string()
        .contains("model"));
    assert!(cp
        .check_against(&p, &g, 1, 2)
        .unwrap_err()
        .to_string()
        .contains("rank 0 of 2"));
    let wide = graph_with_w(&[4, 4], &[4, 4], &[0, 0]);
    let e = cp.check_against(&p, &wide, 0, 2).unwrap_err().to_string();
    assert!(e.contains("weight w is Float32 [2, 4]"), "{e}");
}

#[test]
fn resume_takes_the_newest_complete_step_and_ignores_tmp_files() {
    let dir = tmpdir();
    let d = dir.path();
    let g0 = graph_with_w(&[2, 4], &[4, 4], &[0, 0]);
    let g1 = graph_with_w(&[2, 4], &[4, 4], &[2, 0]);
    for step in [2u64, 4] {
        for (r, g) in [&g0, &g1].into_iter().enumerate() {
            let cp = cp_for(
                g,
                r as u32,
                2,
                step,
                f32s(&[2, 4], |i| (i as u64 * step) as f32),
            );
            checkpoint::save_rank(d, "ck", step, &cp, 5).unwrap();
        }
    }
    // Step 6: rank 0 finished, rank 1 was killed while writing (only its .tmp exists).
    let cp = cp_for(&g0, 0, 2, 6, f32s(&[2, 4], |_| 6.0));
    checkpoint::save_rank(d, "ck", 6, &cp, 5).unwrap();
    let cp1 = cp_for(&g1, 1, 2, 6, f32s(&[2, 4], |_| 6.0));
    let full = cp1.to_bytes().unwrap();
    std::fs::write(
        d.join("1").join("ck-1_6.safetensors.tmp"),
        &full[..full.len() / 2],
    )
    .unwrap();
    let rp = checkpoint::find_resume(d, &[&g0, &g1], &|_| true).unwrap();
    assert_eq!(rp.step, 4);
    assert!(
        rp.files[1].ends_with("1/ck-1_4.safetensors"),
        "{:?}",
        rp.files
    );
    let w1 = rp.checkpoints[1].as_ref().unwrap().tensor("w").unwrap();
    assert_eq!(w1.as_f32().unwrap()[3], 12.0);
    assert!(
        rp.warnings
            .iter()
            .any(|w| w.contains("step 6") && w.contains("rank 1 has no checkpoint")),
        "{:?}",
        rp.warnings
    );
    // Corrupting rank 1's step-4 file makes the resume fall back to step 2, saying why.
    let p = d.join("1").join("ck-1_4.safetensors");
    let mut b = std::fs::read(&p).unwrap();
    let last = b.len() - 1;
    b[last] ^= 1;
    std::fs::write(&p, b).unwrap();
    let rp = checkpoint::find_resume(d, &[&g0, &g1], &|r| r == 0).unwrap();
    assert_eq!(rp.step, 2);
    assert!(rp.checkpoints[1].is_none() && rp.checkpoints[0].is_some());
    assert!(
        rp.warnings
            .iter()
            .any(|w| w.contains("ck-1_4.safetensors") && w.contains("checksum")),
        "{:?}",
        rp.warnings
    );
    // Nothing complete: an error naming the directory and the reasons.
    let e = checkpoint::find_resume(&d.join("nope"), &[&g0], &|_| true).unwrap_err();
    assert!(e.to_string().contains("no such directory"), "{e}");
    let empty = tmpdir();
    let e = checkpoint::find_resume(empty.path(), &[&g0], &|_| true)
        .unwrap_err()
        .to_string();
    assert!(e.contains("no complete checkpoint"), "{e}");
}

#[test]
fn save_rank_keeps_the_newest_files_of_its_prefix() {
    let dir = tmpdir();
    let g = graph_with_w(&[2, 2], &[2, 2], &[0, 0]);
    // Another prefix's file is never pruned.
    let other = cp_for(&g, 0, 1, 1, f32s(&[2, 2], |_| 0.0));
    checkpoint::save(&dir.path().join("0").join("keepme-1_1.safetensors"), &{
        std::fs::create_dir_all(dir.path().join("0")).unwrap();
        other
    })
    .unwrap();
    for step in 1..=7u64 {
        let mut cp = cp_for(&g, 0, 1, step, f32s(&[2, 2], |_| step as f32));
        cp.meta.epoch = (step - 1) / 3 + 1;
        checkpoint::save_rank(dir.path(), "ck", (step - 1) % 3 + 1, &cp, 3).unwrap();
    }
    let mut names: Vec<String> = std::fs::read_dir(dir.path().join("0"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "ck-2_2.safetensors",
            "ck-2_3.safetensors",
            "ck-3_1.safetensors",
            "keepme-1_1.safetensors"
        ]
    );
    assert!(checkpoint::check_prefix("a/b").is_err());
    assert!(checkpoint::check_prefix("").is_err());
}

fn layout(dev: &[usize], map: &[i64], shape: &[usize]) -> TensorLayout {
    TensorLayout {
        dev_matrix: dev.to_vec(),
        tensor_map: map.to_vec(),
        tensor_shape: shape.to_vec(),
        partial: vec![],
        partial_op: ReduceOp::Sum,
    }
}

fn rank_cp(rank: u32, n: u32, tensors: Vec<(&str, Tensor)>) -> Checkpoint {
    Checkpoint {
        meta: meta("Net", rank, n, 5, format!("rank{rank}")),
        tensors: tensors
            .into_iter()
            .map(|(n, t)| (n.to_string(), t))
            .collect(),
    }
}

#[test]
fn merge_assembles_a_2x2_split_and_replicated_blocks() {
    // w (4, 6) split 2 x 2 over 4 ranks; b (3) replicated on every rank.
    let whole = f32s(&[4, 6], |i| i as f32 + 0.25);
    let b = f32s(&[3], |i| -(i as f32));
    let lw = layout(&[2, 2], &[1, 0], &[4, 6]);
    let lb = layout(&[2, 2], &[-1], &[3]);
    let layouts: BTreeMap<String, TensorLayout> =
        [("w".to_string(), lw.clone()), ("b".to_string(), lb)].into();
    let parts: Vec<Checkpoint> = (0..4u32)
        .rev()
        .map(|r| {
            let blk = whole.block(&lw.block(r as usize)).unwrap();
            rank_cp(r, 4, vec![("b", b.clone()), ("w", blk)])
        })
        .collect();
    let merged = checkpoint::merge(&parts, &layouts).unwrap();
    assert_eq!(merged.meta.device_num, 1);
    assert_eq!(merged.meta.rank, 0);
    assert_eq!(merged.meta.step, 5);
    assert_eq!(merged.tensor("w").unwrap(), &whole);
    assert_eq!(merged.tensor("b").unwrap(), &b);
    // The merged file's identity is a single-device graph's.
    let mut g = Graph::new("Net");
    g.add_param(weight("b", &[3], Init::Zeros));
    g.add_param(weight("w", &[4, 6], Init::Zeros));
    assert_eq!(merged.meta.identity, identity_of_graph(&g));
    merged
        .check_against(Path::new("m.safetensors"), &g, 0, 1)
        .unwrap();
}

#[test]
fn merge_refuses_disagreeing_replicas_naming_the_parameter_and_ranks() {
    let lb = layout(&[2, 2], &[-1], &[3]);
    let layouts: BTreeMap<String, TensorLayout> = [("b".to_string(), lb)].into();
    let b = f32s(&[3], |i| i as f32);
    let mut off = b.clone();
    off.as_f32_mut().unwrap()[2] = f32::from_bits(2.0f32.to_bits() + 1);
    let parts: Vec<Checkpoint> = (0..4u32)
        .map(|r| {
            rank_cp(
                r,
                4,
                vec![("b", if r == 2 { off.clone() } else { b.clone() })],
            )
        })
        .collect();
    let e = checkpoint::merge(&parts, &layouts).unwrap_err().to_string();
    assert!(
        e.contains("parameter b") && e.contains("ranks 0 and 2") && e.contains("element 2"),
        "{e}"
    );
    // A missing rank, a block of the wrong shape, a parameter without a layout.
    let e = checkpoint::merge(&parts[..3], &layouts)
        .unwrap_err()
        .to_string();
    assert!(e.contains("rank 3's checkpoint is missing"), "{e}");
    let wrong: Vec<Checkpoint> = (0..4u32)
        .map(|r| rank_cp(r, 4, vec![("b", f32s(&[2], |_| 0.0))]))
        .collect();
    let e = checkpoint::merge(&wrong, &layouts).unwrap_err().to_string();
    assert!(e.contains("rank 0's block has shape [2]"), "{e}");
    let e = checkpoint::merge(&parts, &BTreeMap::new())
        .unwrap_err()
        .to_string();
    assert!(e.contains("no layout"), "{e}");
}

#[test]
fn merge_stages_assembles_each_stage_weights_from_its_own_ranks() {
    // 4 ranks as 2 pipeline stages of 2: stage 0 holds w0 (4, 2) split by rows over its two
    // ranks, stage 1 holds w1 (3) on both. Layouts carry the stage axis (major, unused).
    let w0 = f32s(&[4, 2], |i| i as f32 * 0.5);
    let w1 = f32s(&[3], |i| 10.0 + i as f32);
    let l0 = layout(&[2, 2], &[0, -1], &[4, 2]);
    let l1 = layout(&[2, 2], &[-1], &[3]);
    let layouts: BTreeMap<String, TensorLayout> =
        [("w0".to_string(), l0.clone()), ("w1".to_string(), l1)].into();
    let parts: Vec<Checkpoint> = (0..4u32)
        .map(|r| {
            if r < 2 {
                rank_cp(r, 4, vec![("w0", w0.block(&l0.block(r as usize)).unwrap())])
            } else {
                rank_cp(r, 4, vec![("w1", w1.clone())])
            }
        })
        .collect();
    let merged = checkpoint::merge_stages(&parts, &layouts, 2).unwrap();
    assert_eq!(merged.tensor("w0").unwrap(), &w0);
    assert_eq!(merged.tensor("w1").unwrap(), &w1);
    // Without stages every rank must hold every parameter.
    let e = checkpoint::merge(&parts, &layouts).unwrap_err().to_string();
    assert!(e.contains("rank 0 holds it but rank 2 does not"), "{e}");
    // A stage's rank that lost its weight is named, with its stage.
    let mut lost = parts.clone();
    lost[1] = rank_cp(1, 4, vec![]);
    let e = checkpoint::merge_stages(&lost, &layouts, 2)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("w0")
            && e.contains("rank 0 holds it but rank 1 does not")
            && e.contains("stage 0"),
        "{e}"
    );
    // Ranks per stage must divide the ranks.
    let e = checkpoint::merge_stages(&parts, &layouts, 3)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("3 ranks per stage do not divide the 4 ranks"),
        "{e}"
    );
}
