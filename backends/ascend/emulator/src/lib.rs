//! placeholder
#![allow(missing_docs)]
pub mod acl;
pub mod aclnn;
pub mod collective;
pub mod diag;
pub mod dtype;
pub mod ffi;
pub mod hccl;
pub mod install;
pub mod mem;
pub mod nnopbase;
pub mod plan;
pub mod reference;
pub mod shm;
pub mod stream;
pub mod tensor;
