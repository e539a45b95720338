//! Compiles the protobuf schemas the importers read into Rust with `prost-build`.
//!
//! The schemas are checked in as `FileDescriptorSet`s (`proto/*.fds`), made by the
//! frameworks' own Python packages from the descriptors they were built with (see
//! `tests/data/mindspore/make_mindir.py` and `tests/data/onnx/make_onnx.py`), so the build
//! needs no `protoc` and reads exactly the schema those versions write.

use prost::Message;
use std::path::PathBuf;

fn main() {
    for (fds, module) in [("proto/mind_ir.fds", "mind_ir"), ("proto/onnx.fds", "onnx")] {
        println!("cargo:rerun-if-changed={fds}");
        let bytes = std::fs::read(fds).unwrap_or_else(|e| panic!("reading {fds}: {e}"));
        let set = prost_types::FileDescriptorSet::decode(bytes.as_slice())
            .unwrap_or_else(|e| panic!("{fds} is not a FileDescriptorSet: {e}"));
        let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
        let mut config = prost_build::Config::new();
        config.out_dir(out.join(module));
        std::fs::create_dir_all(out.join(module)).unwrap_or_else(|e| panic!("{e}"));
        config
            .compile_fds(set)
            .unwrap_or_else(|e| panic!("compiling {fds}: {e}"));
    }
}
