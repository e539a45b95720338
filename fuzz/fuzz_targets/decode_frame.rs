//! Fuzz target: the cluster's control-frame decoder never panics nor allocates beyond its
//! input, consumes a whole frame (header included, never past the input), and whatever
//! decodes re-encodes to exactly the bytes it came from (the encoding is canonical).

#![no_main]

use libfuzzer_sys::fuzz_target;
use shardc_runtime::cluster::frame::{decode, decode_with_limit, encode, HEADER_LEN, MAX_CONTROL_FRAME};

fuzz_target!(|data: &[u8]| {
    if let Ok(Some((_, used))) = decode_with_limit(data, MAX_CONTROL_FRAME) {
        assert!((HEADER_LEN..=data.len()).contains(&used));
    }
    if let Ok(Some((msg, used))) = decode(data) {
        assert!((HEADER_LEN..=data.len()).contains(&used));
        assert_eq!(encode(&msg), &data[..used], "re-encoding {msg:?}");
    }
});
