//! placeholder
#![allow(missing_docs)]
pub mod collective;
pub mod diag;
pub mod dtype;
pub mod mem;
pub mod reference;
pub mod shm;
pub mod stream;
pub mod tensor;
