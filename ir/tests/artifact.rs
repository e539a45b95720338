//! Artifact directories and the binary graph format.

mod common;

use common::{full_graph, small_graph};
use shardc_ir::artifact::{
    Artifact, ArtifactError, IoEntry, Manifest, FORMAT_VERSION, PROGRAM_FILE,
};
use shardc_ir::binary::{decode_graph, decode_program, encode_graph, encode_program, BinaryError};
use shardc_ir::spmd::{Patch, SpmdProgram};

fn manifest(n: u32) -> Manifest {
    Manifest {
        format_version: FORMAT_VERSION,
        shardc_version: "0.1.0".into(),
        model: "Net".into(),
        device_num: n,
        parallel_mode: "semi_auto_parallel".into(),
        program: PROGRAM_FILE.into(),
        ranks: Vec::new(),
        inputs: vec![IoEntry {
            name: "x".into(),
            dtype: "Float32".into(),
            shape: vec![16, 32],
        }],
        outputs: vec!["loss".into()],
        optimizer: Some(serde_json::json!({"kind": "momentum", "learning_rate": 0.1})),
        extra: serde_json::Map::new(),
    }
}

/// An artifact of `n` ranks whose program patches rank 0's graph: its MatMul is a
/// communication node's stand-in whose group comes from the rank.
fn artifact(n: u32) -> Artifact {
    let program = SpmdProgram {
        device_num: n as usize,
        template: full_graph(),
        patches: if n > 1 {
            vec![Patch::Group {
                node: 1,
                primes: vec![2; n.trailing_zeros() as usize],
                axes: vec![0],
            }]
        } else {
            Vec::new()
        },
        stages: Vec::new(),
    };
    Artifact {
        manifest: manifest(n),
        program,
    }
}

#[test]
fn binary_round_trip_of_every_feature() {
    for g in [full_graph(), small_graph()] {
        let bytes = encode_graph(&g).unwrap();
        assert_eq!(decode_graph(&bytes).unwrap(), g);
    }
}

#[test]
fn binary_decoder_survives_every_truncation_and_byte_flip() {
    let bytes = encode_graph(&full_graph()).unwrap();
    for cut in 0..bytes.len() {
        assert!(decode_graph(&bytes[..cut]).is_err(), "cut {cut}");
    }
    for i in 0..bytes.len() {
        for flip in [0x01u8, 0x80, 0xff] {
            let mut b = bytes.clone();
            b[i] ^= flip;
            // Either an error or some graph; never a panic.
            let _ = decode_graph(&b);
        }
    }
}

#[test]
fn a_text_file_is_not_a_binary_graph() {
    let e = decode_graph(b"#IR entry      : @Net\n").unwrap_err();
    assert!(matches!(e, BinaryError::BadMagic), "{e}");
    assert!(e.to_string().contains("not a shardc graph"));
}

#[test]
fn program_round_trip_and_decoder_survives_every_truncation() {
    let p = artifact(4).program;
    let bytes = encode_program(&p).unwrap();
    assert_eq!(decode_program(&bytes).unwrap(), p);
    for cut in 0..bytes.len() {
        assert!(decode_program(&bytes[..cut]).is_err(), "cut {cut}");
    }
    for i in (0..bytes.len()).step_by(7) {
        let mut b = bytes.clone();
        b[i] ^= 0xff;
        let _ = decode_program(&b);
    }
    // A graph is not a program, and the other way round.
    let e = decode_program(&encode_graph(&small_graph()).unwrap()).unwrap_err();
    assert!(matches!(e, BinaryError::BadMagic), "{e}");
    assert!(decode_graph(&bytes).is_err());
}

#[test]
fn write_then_read_gives_the_same_artifact() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("nested/artifact");
    let a = artifact(4);
    let r1 = a.rank_graph(1).unwrap();
    a.write(&out, &[(1, &r1)]).unwrap();
    let mut names: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["manifest.json", "program.spmd", "rank_1.ir"],
        "no temporary files are left behind"
    );
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(json["device_num"], 4);
    assert_eq!(json["format_version"], 2);
    assert_eq!(json["ranks"][0]["graph"], "rank_1.ir");
    let back = Artifact::read(&out).unwrap();
    assert_eq!(back.program, a.program);
    assert_eq!(back.manifest.ranks.len(), 1);
    // The rank written for inspection is the rank's graph, as text.
    let text = std::fs::read_to_string(out.join("rank_1.ir")).unwrap();
    assert_eq!(text, shardc_ir::text::print_graph(&r1));
    // Every rank materializes; rank 1's group is not rank 0's.
    let graphs = back.rank_graphs().unwrap();
    assert_eq!(graphs.len(), 4);
    assert_eq!(graphs[0], a.program.template);
    assert_ne!(graphs[1].nodes[1].attrs, graphs[0].nodes[1].attrs);
    assert_eq!(graphs[1], r1);
    // Writing again over an existing artifact replaces it.
    let b = artifact(2);
    b.write(&out, &[]).unwrap();
    assert_eq!(Artifact::read(&out).unwrap().program, b.program);
}

#[test]
fn manifest_without_optional_fields_reads() {
    let dir = tempfile::tempdir().unwrap();
    artifact(1).write(dir.path(), &[]).unwrap();
    let path = dir.path().join("manifest.json");
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let obj = json.as_object_mut().unwrap();
    obj.remove("optimizer");
    obj.remove("extra");
    obj.remove("ranks");
    std::fs::write(&path, serde_json::to_string(&json).unwrap()).unwrap();
    let a = Artifact::read(dir.path()).unwrap();
    assert_eq!(a.manifest.optimizer, None);
    assert!(a.manifest.extra.is_empty());
}

fn read_err(dir: &std::path::Path) -> String {
    match Artifact::read(dir) {
        Ok(_) => panic!("{} read", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn read_errors_name_the_file_and_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let shown = d.display().to_string();

    let e = read_err(d);
    assert_eq!(
        e,
        format!("{shown}: not a shardc artifact (no manifest.json)")
    );

    artifact(2).write(d, &[]).unwrap();
    let manifest_path = d.join("manifest.json");
    let good = std::fs::read_to_string(&manifest_path).unwrap();

    std::fs::write(&manifest_path, "{ not json").unwrap();
    let e = read_err(d);
    assert!(
        e.starts_with(&format!("{shown}/manifest.json: bad manifest: ")),
        "{e}"
    );
    assert!(e.contains("line 1 column 3"), "{e}");

    std::fs::write(
        &manifest_path,
        good.replace("\"device_num\": 2", "\"device_num\": 4"),
    )
    .unwrap();
    let e = read_err(d);
    assert_eq!(
        e,
        format!(
            "{shown}/program.spmd: the program runs on 2 ranks but the manifest says device_num 4"
        )
    );

    // An artifact of the old format (one graph per rank) is named by its version.
    std::fs::write(
        &manifest_path,
        "{\"format_version\": 1, \"ranks\": [{\"rank\": 0, \"graph\": \"rank_0.graph\"}]}",
    )
    .unwrap();
    let e = read_err(d);
    assert_eq!(
        e,
        format!("{shown}/manifest.json: manifest format version 1 is not supported (this build reads version 2, one program for every rank): compile the model again with this shardc")
    );

    std::fs::write(
        &manifest_path,
        good.replace("\"program.spmd\"", "\"../program.spmd\""),
    )
    .unwrap();
    let e = read_err(d);
    assert!(
        e.contains("program file name \"../program.spmd\" is not a plain file name"),
        "{e}"
    );

    std::fs::write(&manifest_path, &good).unwrap();
    std::fs::write(d.join("program.spmd"), b"garbage").unwrap();
    let e = read_err(d);
    assert_eq!(
        e,
        format!("{shown}/program.spmd: bad program file: not a shardc graph: the data does not start with the magic bytes \"SHARDCG\\0\"")
    );

    std::fs::remove_file(d.join("program.spmd")).unwrap();
    let e = read_err(d);
    assert_eq!(
        e,
        format!("{shown}/program.spmd: the program file is missing")
    );
}

#[test]
fn write_refuses_inconsistent_artifacts() {
    let dir = tempfile::tempdir().unwrap();
    let a = artifact(2);
    let g = a.program.template.clone();
    let e = a.write(dir.path(), &[(0, &g), (0, &g)]).unwrap_err();
    assert!(e.to_string().contains("rank 0 is listed twice"), "{e}");
    let e = a.write(dir.path(), &[(2, &g)]).unwrap_err();
    assert!(e.to_string().contains("rank 2 is out of range"), "{e}");
    let mut b = artifact(2);
    b.program.device_num = 3;
    let e = b.write(dir.path(), &[]).unwrap_err();
    assert!(matches!(e, ArtifactError::BadRank { .. }), "{e}");
    assert!(!dir.path().join("manifest.json").exists());
}
