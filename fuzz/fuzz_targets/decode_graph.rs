//! Fuzz target: the binary decoder never panics or allocates unboundedly, and whatever decodes
//! encodes back to bytes that decode to the same graph.

#![no_main]

use libfuzzer_sys::fuzz_target;
use shardc_ir::binary::{decode_graph, encode_graph};

fuzz_target!(|data: &[u8]| {
    if let Ok(g) = decode_graph(data) {
        let bytes = match encode_graph(&g) {
            Ok(b) => b,
            Err(e) => panic!("a decoded graph does not encode: {e}"),
        };
        let again = match decode_graph(&bytes) {
            Ok(g) => g,
            Err(e) => panic!("re-encoded graph does not decode: {e}"),
        };
        assert_eq!(format!("{again:?}"), format!("{g:?}"));
    }
});
