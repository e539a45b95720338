//! Fuzz target: the model importers never panic, whatever the bytes: MindSpore's MindIR
//! (`mind_ir.proto`) and ONNX (`onnx.proto`). A file either imports into a graph that passed
//! shardc's verifier or is an `ImportError`.

#![no_main]

use libfuzzer_sys::fuzz_target;
use shardc_import::{mindir, onnx};
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let _ = mindir::import(Path::new("fuzz.mindir"), data);
    let _ = onnx::import(Path::new("fuzz.onnx"), data);
});
