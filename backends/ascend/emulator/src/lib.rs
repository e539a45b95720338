//! `shardc-ascend-emulator`: an emulator of CANN's C API for CI machines without an Ascend
//! card.
//!
//! One library (a `cdylib`) exports every symbol of `shardc_ascend_sys::SYMBOLS` with the
//! exact signature of `shardc_ascend_sys::sig` (checked at compile time), so that a directory
//! of symlinks named `libascendcl.so`, `libnnopbase.so`, `libopapi.so` (and
//! `libopapi_math.so` / `libopapi_nn.so`) and `libhccl.so` pointing at it, found through
//! `SHARDC_ASCEND_LIB_DIRS`, is loaded by the Ascend backend exactly as CANN would be. It is
//! not a mock inside the backend: the backend cannot tell it from CANN except by the
//! numerics and the speed.
//!
//! # What is emulated
//!
//! - **Devices** ([`mem`], [`acl`]): `SHARDC_ASCEND_EMU_DEVICES` devices (default 8) per
//!   process; `aclrtSetDevice` sets the calling thread's current device. Device `d`'s memory
//!   lives at its own address range (`(d + 1) · 2^48`, above the host's address space, so a
//!   host dereference faults) with unmapped gaps between allocations and no address reuse;
//!   a table maps ranges to host backing storage.
//! - **Streams and events** ([`stream`]): each stream is a thread running its work in order;
//!   events complete when their stream reaches them; `aclrtStreamWaitEvent` queues a wait.
//!   An error inside queued work is returned by the next synchronisation of that stream (or of
//!   an event recorded on it), as ACL reports asynchronous errors.
//! - **aclnn** ([`nnopbase`], [`aclnn`], [`plan`], [`reference`](mod@reference)): descriptors (tensors as
//!   strided views of device memory, scalars, int/bool arrays, tensor lists) and the 50
//!   operators of the sys crate through the two-phase API. Each op's result is computed by the
//!   emulator's own plain reference loops (f32 values, f64 accumulation for sums, f16 / bf16 /
//!   int / bool converted in and out), never by shardc's CPU kernels, so tests of the backend
//!   against it are not circular.
//! - **HCCL** ([`hccl`], [`shm`], [`collective`]): communicators between threads and between
//!   processes over a shared-memory segment named by the root info's token; AllReduce (sum,
//!   prod, max, min, reduced in rank order so every rank gets the same bits), AllGather,
//!   ReduceScatter, Broadcast, Send / Recv (matched by peer and order; one chunk is buffered),
//!   AlltoAll and BatchSendRecv, in chunks through fixed-size slots, enqueued on streams.
//!
//! # What is checked (a misuse is an error with the real code, and a stderr line naming the
//! API, the address and why; the line is also `aclGetRecentErrMsg`)
//!
//! | misuse | code |
//! | --- | --- |
//! | `aclInit` twice | `ACL_ERROR_REPEAT_INITIALIZE` |
//! | a call before `aclInit` | `ACL_ERROR_UNINITIALIZE` |
//! | no current device on the thread | `ACL_ERROR_RT_CONTEXT_NULL` (107002) |
//! | a device id out of range | `ACL_ERROR_INVALID_DEVICE` |
//! | use after free, double free, a pointer in no allocation, an access past an allocation's end, another device's buffer | `ACL_ERROR_RT_PARAM_INVALID` (aclnn: `ACLNN_ERR_RUNTIME_ERROR` 361001) |
//! | an unsynchronised access: a host copy or another stream's work touching memory that queued work writes (or reads, for a write) without a stream / event synchronisation or event wait ordering them | `ACL_ERROR_RT_PARAM_INVALID` (aclnn: 361001) |
//! | a destroyed or unknown stream / event | `ACL_ERROR_INVALID_RESOURCE_HANDLE` |
//! | a descriptor whose view leaves its storage, null dims, unknown dtype | null from `aclCreateTensor`; `ACLNN_ERR_PARAM_INVALID` (161002) when a dead one is used |
//! | shapes / dtypes / attributes an op does not accept | `ACLNN_ERR_PARAM_INVALID` (161002) |
//! | a workspace smaller than `GetWorkspaceSize` asked for (matmul, convolution, reductions and norms ask for one), or null | `ACLNN_ERR_PARAM_INVALID` |
//! | an executor launched twice, made by another op, or unknown | `ACLNN_ERR_PARAM_INVALID` |
//! | an index outside its axis (IndexSelect, IndexAdd), found while running | the next synchronisation returns `ACL_ERROR_INVALID_PARAM` |
//! | a stream that has not drained in time | `ACL_ERROR_RT_STREAM_SYNC_TIMEOUT` / `ACL_ERROR_RT_EVENT_SYNC_TIMEOUT` |
//! | HCCL members whose calls disagree (op, dtype, count, root, reduce op) | every member's call fails, `HCCL_E_PARA` from `HcclGetCommAsyncError`, `ACL_ERROR_FAILURE` from the synchronisation |
//! | a rank that does not arrive at init within `HCCL_CONNECT_TIMEOUT` (default 120 s) | `HCCL_E_TIMEOUT`, naming the missing ranks |
//! | a peer that does not join a call within `HCCL_EXEC_TIMEOUT` (default 1800 s) | `HCCL_E_TIMEOUT` (async), naming the ranks |
//! | a peer whose process died, or that destroyed its communicator or failed | at once, `HCCL_E_REMOTE` (async), naming the rank |
//!
//! The emulator also scribbles over every workspace before the op runs, so a workspace that
//! aliases live data shows up as wrong results.
//!
//! # What is not emulated
//!
//! Performance (every op is a plain loop on one thread per stream), the real numerics of the
//! card's kernels (cube units' rounding, fused reductions' order), formats other than the plain
//! ND / NCHW layouts, transposed convolution, memory pools and virtual memory, contexts
//! beyond one per device, peer-to-peer access between devices, and HCCL topologies (every
//! communicator is flat, whatever the rank table says). Faults are reported, never raised as
//! signals: no call panics across the FFI boundary (each export catches panics and returns an
//! internal-error code), and every wait is bounded except stream synchronisations, which wait
//! for work that itself is bounded.
#![deny(missing_docs)]

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
