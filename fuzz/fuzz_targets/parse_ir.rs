//! Fuzz target: the text parser never panics; what parses prints and parses back to the same
//! graph; errors have the `file:line:column: expected ..., found ...` form.
//!
//! Seed it with valid files, from `fuzz/`: `mkdir -p corpus/parse_ir && cp ../models/quickstart.ir corpus/parse_ir/`.

#![no_main]

use libfuzzer_sys::fuzz_target;
use shardc_ir::text::{parse_graph, print_graph};

fuzz_target!(|data: &[u8]| {
    let src = String::from_utf8_lossy(data);
    match parse_graph(&src, "fuzz.ir") {
        Ok(g) => {
            let text = print_graph(&g);
            let again = match parse_graph(&text, "printed.ir") {
                Ok(g) => g,
                Err(e) => panic!("printed text does not parse: {e}\n{text}"),
            };
            assert_eq!(print_graph(&again), text);
            assert_eq!(format!("{again:?}"), format!("{g:?}"));
        }
        Err(e) => {
            let msg = e.to_string();
            assert!(
                msg.starts_with("fuzz.ir:") && msg.contains(": expected "),
                "{msg}"
            );
        }
    }
});
