//! Fuzz target: the readers of other tools' files never panic: MindSpore's `.ckpt`
//! (`checkpoint.proto`), NumPy's `.npy`, and safetensors. Whatever `.ckpt` bytes decode
//! re-encode and decode to the same tensors (compared as their encodings: a NaN element is
//! not equal to itself).

#![no_main]

use libfuzzer_sys::fuzz_target;
use shardc_runtime::data::numpy::parse_npy;
use shardc_runtime::mindspore_ckpt::{decode, encode, safetensors_tensors};
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let path = Path::new("fuzz.ckpt");
    if let Ok(tensors) = decode(data, path) {
        let bytes = encode(&tensors);
        let again = decode(&bytes, path).expect("an encoded checkpoint decodes");
        assert_eq!(encode(&again), bytes);
    }
    let _ = parse_npy(data, "fuzz.npy");
    let _ = safetensors_tensors(data);
});
