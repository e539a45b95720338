//! The MindIR reader on damaged and doctored files: every fault is an error naming the node or
//! parameter, the value and the reason, and no input makes it panic (a proptest run over
//! arbitrary bytes and over damaged copies of a real file MindSpore wrote).

use proptest::prelude::*;
use prost::Message;
use shardc_import::proto::mind_ir::{
    attribute_proto::AttributeType, tensor_proto::ExternalDataProto, ModelProto,
};
use shardc_import::{mindir, ImportError};
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/data/mindspore")
        .join(name)
}

fn model(name: &str) -> ModelProto {
    let bytes = std::fs::read(fixture(name)).expect("fixture");
    ModelProto::decode(bytes.as_slice()).expect("decodes")
}

fn import(m: &ModelProto) -> Result<shardc_import::Imported, ImportError> {
    mindir::import(Path::new("doctored.mindir"), &m.encode_to_vec())
}

#[test]
fn the_fixtures_import_with_their_names() {
    let m = model("lenet.mindir");
    let imported = import(&m).expect("imports");
    assert_eq!(imported.graph.name, "LeNet");
    assert_eq!(imported.producer, "MindSpore 2.10.0");
    let names: Vec<&str> = imported.weights.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "conv1.weight",
            "conv2.weight",
            "bn.gamma",
            "bn.beta",
            "bn.moving_mean",
            "bn.moving_variance",
            "fc1.weight",
            "fc1.bias",
            "fc2.weight",
            "fc2.bias"
        ]
    );
}

#[test]
fn a_dynamic_input_shape_is_an_error_naming_the_input() {
    let mut m = model("tutorial.mindir");
    let g = m.graph.as_mut().expect("graph");
    g.input[0].tensor[0].dims[0] = -1;
    let e = import(&m).expect_err("dynamic").to_string();
    assert!(
        e.contains("input `x` has the dynamic shape [-1, 64]: export with a fixed input shape"),
        "{e}"
    );
}

#[test]
fn a_wrongly_recorded_output_shape_is_an_error_naming_the_node() {
    let mut m = model("tutorial.mindir");
    let g = m.graph.as_mut().expect("graph");
    let node = g
        .node
        .iter_mut()
        .find(|n| n.op_type.as_deref() == Some("REF::ReLU:11"))
        .expect("a ReLU");
    let shape = node
        .attribute
        .iter_mut()
        .find(|a| a.name.as_deref() == Some("shape"))
        .expect("shape");
    assert_eq!(shape.r#type, Some(AttributeType::Tensors as i32));
    shape.tensors[0].dims = vec![16, 33];
    let e = import(&m).expect_err("mismatch").to_string();
    assert!(
        e.contains(
            "(ReLU): the file records the output shape [16, 33], the mapped op gives [16, 32]"
        ),
        "{e}"
    );
}

#[test]
fn a_parameter_with_damaged_or_external_data_is_an_error_naming_it() {
    let mut m = model("tutorial.mindir");
    let g = m.graph.as_mut().expect("graph");
    let raw = g.parameter[1].raw_data.as_mut().expect("raw data");
    raw.truncate(raw.len() - 4);
    let e = import(&m).expect_err("short").to_string();
    assert!(
        e.contains("parameter `dense_relu_sequential.0.bias`: 124 bytes of data for 32 elements of FLOAT (128 bytes expected)"),
        "{e}"
    );

    let mut m = model("tutorial.mindir");
    let g = m.graph.as_mut().expect("graph");
    g.parameter[0].external_data = Some(ExternalDataProto {
        location: Some("weights.bin".into()),
        offset: Some(0),
        length: Some(8192),
    });
    let e = import(&m).expect_err("external").to_string();
    assert!(
        e.contains("parameter `dense_relu_sequential.0.weight`: its data is in an external file"),
        "{e}"
    );
}

#[test]
fn a_batchnorm_in_training_mode_says_to_export_in_inference_mode() {
    let mut m = model("lenet.mindir");
    let g = m.graph.as_mut().expect("graph");
    let bn = g
        .node
        .iter()
        .find(|n| {
            n.op_type
                .as_deref()
                .is_some_and(|t| t.starts_with("REF::BatchNorm"))
        })
        .expect("a BatchNorm")
        .clone();
    let flag = bn.input[5].clone();
    let constant = g
        .node
        .iter_mut()
        .find(|n| n.output.first() == Some(&flag))
        .expect("its is_training constant");
    constant.attribute[0].i = Some(1);
    let e = import(&m).expect_err("training").to_string();
    assert!(
        e.contains("(BatchNorm): is_training is true: export the network in inference mode"),
        "{e}"
    );
}

#[test]
fn a_model_without_a_graph_or_an_output_is_an_error() {
    let mut m = model("tutorial.mindir");
    m.graph = None;
    let e = import(&m).expect_err("no graph").to_string();
    assert!(
        e.contains("doctored.mindir: not a MindIR model: the model has no graph"),
        "{e}"
    );

    let mut m = model("tutorial.mindir");
    m.graph.as_mut().expect("graph").output[0].name = Some("nowhere".into());
    let e = import(&m).expect_err("no output").to_string();
    assert!(e.contains("output `nowhere` is defined by no node"), "{e}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let _ = mindir::import(Path::new("fuzz.mindir"), &bytes);
    }

    #[test]
    fn damaged_copies_of_a_real_file_never_panic(
        cut in 0usize..21_448,
        flips in proptest::collection::vec((0usize..21_448, any::<u8>()), 0..8),
    ) {
        let mut bytes = std::fs::read(fixture("tutorial.mindir")).expect("fixture");
        for (at, v) in flips {
            if at < bytes.len() {
                bytes[at] ^= v;
            }
        }
        bytes.truncate(cut.min(bytes.len()));
        let _ = mindir::import(Path::new("fuzz.mindir"), &bytes);
    }
}
