//! `shardc-backend-ascend`: the Ascend backend. AscendCL (devices, memory, streams, events),
//! aclnn operators through their two-phase API, and HCCL collectives, all opened at run time
//! (nothing is linked: [`probe`] finds `libascendcl.so`, `libnnopbase.so`, `libopapi.so` or
//! its per-domain split, and `libhccl.so`; a machine without them gets an error naming the
//! missing library, never a panic).
//!
//! - [`acl`]: the loaded API and [`AscendDevice`] (memory, a compute and a communication
//!   stream, events);
//! - [`AscendExecutor`]: a rank's graph on a device, the runtime's run loop over its device
//!   trait (memory from the runtime's plan, kernels by `OpKind` through aclnn with a host
//!   fallback listed in [`ops::HOST_FALLBACKS`], gradient buckets on the communication stream
//!   joined by events);
//! - [`HcclComm`]: HCCL bootstrapped over any shardc communicator, a runtime
//!   [`shardc_runtime::Communicator`] as well as the executor's device-native collectives.
//!
//! The C ABI is `shardc-ascend-sys`'s, taken from CANN's headers; CI runs all of it against
//! the emulator of that ABI (`shardc-ascend-emulator`), which the backend cannot tell from
//! CANN.
#![deny(missing_docs)]

pub mod acl;
pub mod aclnn;
pub mod error;
pub mod executor;
pub mod hccl;
pub mod ops;
pub mod probe;

pub use acl::{AscendDevice, DevPtr};
pub use error::{AscendError, AscendResult};
pub use executor::{ascend_executor, why_not_hccl, AscendExecutor, AscendStats};
pub use hccl::HcclComm;

/// `shardc device info` for Ascend: the libraries found where, what is missing and how to
/// make it findable, then the devices AscendCL sees.
pub fn device_info() -> String {
    acl::report()
}
