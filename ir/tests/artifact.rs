//! Artifact directories and the binary graph format.

mod common;

use common::{full_graph, small_graph};
use shardc_ir::artifact::{Artifact, ArtifactError, IoEntry, Manifest, RankEntry};
use shardc_ir::binary::{decode_graph, encode_graph, BinaryError};

fn manifest(n: u32) -> Manifest {
    Manifest {
        format_version: 1,
        shardc_version: "0.1.0".into(),
        model: "Net".into(),
        device_num: n,
        parallel_mode: "semi_auto_parallel".into(),
        ranks: (0..n).map(RankEntry::new).collect(),
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

fn artifact(n: u32) -> Artifact {
    let graphs = (0..n)
        .map(|r| {
            if r % 2 == 0 {
                small_graph()
            } else {
                full_graph()
            }
        })
        .collect();
    Artifact {
        manifest: manifest(n),
        graphs,
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
fn write_then_read_gives_the_same_artifact() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("nested/artifact");
    let a = artifact(4);
    a.write(&out).unwrap();
    let mut names: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "manifest.json",
            "rank_0.graph",
            "rank_1.graph",
            "rank_2.graph",
            "rank_3.graph"
        ],
        "no temporary files are left behind"
    );
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(json["device_num"], 4);
    assert_eq!(json["ranks"][2]["graph"], "rank_2.graph");
    assert_eq!(Artifact::read(&out).unwrap(), a);
    // Writing again over an existing artifact replaces it.
    let b = artifact(2);
    b.write(&out).unwrap();
    assert_eq!(Artifact::read(&out).unwrap(), b);
}

#[test]
fn manifest_without_optional_fields_reads() {
    let dir = tempfile::tempdir().unwrap();
    artifact(1).write(dir.path()).unwrap();
    let path = dir.path().join("manifest.json");
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let obj = json.as_object_mut().unwrap();
    obj.remove("optimizer");
    obj.remove("extra");
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

    artifact(2).write(d).unwrap();
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
        good.replace("\"device_num\": 2", "\"device_num\": 3"),
    )
    .unwrap();
    let e = read_err(d);
    assert_eq!(
        e,
        format!(
            "{shown}/manifest.json: rank count mismatch: device_num is 3 but 2 ranks are listed"
        )
    );

    std::fs::write(
        &manifest_path,
        good.replace("\"format_version\": 1", "\"format_version\": 9"),
    )
    .unwrap();
    let e = read_err(d);
    assert_eq!(
        e,
        format!("{shown}/manifest.json: manifest format version 9 is not supported (this build reads version 1)")
    );

    std::fs::write(
        &manifest_path,
        good.replace("rank_1.graph", "../rank_1.graph"),
    )
    .unwrap();
    let e = read_err(d);
    assert!(
        e.contains("\"../rank_1.graph\" of rank 1 is not a plain file name"),
        "{e}"
    );

    std::fs::write(&manifest_path, &good).unwrap();
    std::fs::write(d.join("rank_1.graph"), b"garbage").unwrap();
    let e = read_err(d);
    assert_eq!(
        e,
        format!("{shown}/rank_1.graph: bad graph file of rank 1: not a shardc graph: the data does not start with the magic bytes \"SHARDCG\\0\"")
    );

    std::fs::remove_file(d.join("rank_1.graph")).unwrap();
    let e = read_err(d);
    assert_eq!(
        e,
        format!("{shown}/rank_1.graph: graph file of rank 1 is missing")
    );
}

#[test]
fn write_refuses_inconsistent_artifacts() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = artifact(2);
    a.graphs.pop();
    let e = a.write(dir.path()).unwrap_err();
    assert!(matches!(e, ArtifactError::BadRanks { .. }), "{e}");
    assert!(
        e.to_string()
            .contains("lists 2 ranks but the artifact holds 1 graphs"),
        "{e}"
    );

    let mut a = artifact(2);
    a.manifest.ranks[1].rank = 0;
    let e = a.write(dir.path()).unwrap_err();
    assert!(e.to_string().contains("rank 0 is listed twice"), "{e}");

    let mut a = artifact(2);
    a.manifest.ranks[1].graph = "rank_0.graph".into();
    let e = a.write(dir.path()).unwrap_err();
    assert!(e.to_string().contains("listed twice"), "{e}");
    assert!(!dir.path().join("manifest.json").exists());
}
