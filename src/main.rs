//! The `shardc` binary.

fn main() {
    std::process::exit(shardc_tools::main());
}
