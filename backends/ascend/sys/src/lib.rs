//! `shardc-ascend-sys`: the C ABI of CANN (AscendCL, nnopbase, aclnn, HCCL) exactly as shardc
//! uses it. Nothing is linked: the backend (`shardc-backend-ascend`) opens the libraries at run
//! time and resolves every symbol of [`SYMBOLS`] with the type of the same name in [`sig`]; the
//! emulator (`shardc-ascend-emulator`, a cdylib) exports the same symbols and checks each export
//! against these types at compile time (`const _: sig::aclrtMalloc = aclrtMalloc;`).
//!
//! Every signature and numeric value is taken from the real headers, cited on each item:
//!
//! - AscendCL: `include/external/acl/acl_base_rt.h`, `acl_rt.h` and
//!   `error_codes/rt_error_codes.h` of `hicann/runtime` (CANN's `acl/acl.h`, `libascendcl.so`);
//! - nnopbase: `include/nnopbase/aclnn/acl_meta.h` of `hicann/opbase` (`libnnopbase.so`);
//! - aclnn operators: the `op_api/aclnn_*.h` headers of `hicann/ops-math` and `hicann/ops-nn`
//!   (`libopapi.so`; newer CANN splits it per domain into `libopapi_math.so`,
//!   `libopapi_nn.so`, ...: see [`OpDomain`] and [`ACLNN_DOMAINS`]);
//! - HCCL: `include/hccl.h` of `hicann/hccl` (collectives), `hccl_types.h` (as copied in
//!   `hicann/runtime` `src/queue_schedule/common/hccl/hccl_types.h`) and `hccl_comm.h` /
//!   CANN 8's `hccl/hccl.h` (communicator management: `HcclGetRootInfo`,
//!   `HcclCommInitRootInfo`, `HcclGetRankSize`, `HcclGetCommAsyncError`, ...) (`libhccl.so`).
//!
//! # ABI rules (the emulator's spec)
//!
//! - **Status codes.** AscendCL calls return [`aclError`] ([`ACL_SUCCESS`] = 0), nnopbase and
//!   aclnn calls return [`aclnnStatus`] (0 = success, any other value is an error:
//!   [`ACLNN_ERR_PARAM_NULLPTR`] for a null argument, [`ACLNN_ERR_PARAM_INVALID`] for a bad
//!   shape, dtype or attribute, [`ACLNN_ERR_RUNTIME_ERROR`] for a failed runtime call under
//!   the op; the backend treats any nonzero status as an error), HCCL calls return
//!   [`HcclResult`] ([`HCCL_SUCCESS`] = 0). C enums are passed as `int` (`i32`): every enum
//!   here is an `i32` type alias with its values as constants, so an unknown value crossing the
//!   boundary is an error code, never undefined behaviour.
//! - **Devices and threads.** `aclrtSetDevice(id)` makes device `id` current on the calling
//!   thread (creating its default context on first use); memory, streams and events are
//!   created on the current device. Every thread that issues work calls `aclrtSetDevice`
//!   first. Device pointers returned by `aclrtMalloc` are opaque to the host: only copies
//!   (`aclrtMemcpy*`, `aclrtMemset*`) and device work read or write them.
//! - **Streams.** Work on one stream runs in issue order; `aclrtRecordEvent(e, s)` marks the
//!   point of `s` reached so far, `aclrtStreamWaitEvent(s2, e)` makes later work on `s2` wait
//!   for it. A null stream (`aclrtStream` = null) is the device's default stream.
//!   `aclrtMemcpyAsync` / `aclrtMemsetAsync` / every aclnn launch / every HCCL collective are
//!   ordered on their stream; the host may read a device-to-host destination only after
//!   synchronizing that stream (or an event recorded after the copy).
//! - **Tensors.** An [`aclTensor`] describes memory, it does not own it:
//!   `aclCreateTensor(viewDims, viewDimsNum, dataType, stride, offset, format, storageDims,
//!   storageDimsNum, tensorData)`: element `(i0, .., in-1)` of the view is at
//!   `tensorData + (offset + Σ ik·stride[k]) · sizeof(dataType)` bytes; `offset` and `stride`
//!   count **elements**, strides may be 0 (broadcast) or describe a transpose; `storageDims`
//!   is the shape of the underlying contiguous buffer (shardc passes the flat element count
//!   as a 1-d storage shape). A 0-d tensor has `viewDimsNum` = 0 (and `viewDims`/`stride` may
//!   be null). `format` is [`ACL_FORMAT_ND`] except 4-d convolution/pooling tensors, which
//!   shardc describes as [`ACL_FORMAT_NCHW`]. The descriptors are freed with the matching
//!   `aclDestroy*`; destroying a descriptor never frees `tensorData`.
//! - **Two-phase operators.** `aclnnXxxGetWorkspaceSize(inputs.., outputs.., &workspaceSize,
//!   &executor)` validates shapes and dtypes, computes the scratch size in bytes and returns a
//!   one-shot [`aclOpExecutor`] holding the op and its tensor addresses; then
//!   `aclnnXxx(workspace, workspaceSize, executor, stream)` enqueues the op on `stream` and
//!   consumes the executor (it must not be launched twice, nor destroyed after a launch).
//!   `workspace` is device memory of at least `workspaceSize` bytes (null when the size is 0).
//!   The descriptors given to `GetWorkspaceSize` may be destroyed as soon as it returns.
//!   Optional tensors (`...Optional` parameters, `bias`) may be null.
//! - **Results** are written through the output descriptors, which may be strided views;
//!   outputs never alias inputs unless the op is `Inplace`.
//! - **HCCL.** Rank `r` of an `n`-rank communicator calls `HcclCommInitRootInfo(n, &root, r,
//!   &comm)` with the [`HcclRootInfo`] bytes that one member made with `HcclGetRootInfo` (the
//!   caller shares them). Collectives take device buffers and a stream, and are enqueued on
//!   the stream; the result is visible after the stream is synchronized. Counts are in
//!   elements of the given [`HcclDataType`].
#![deny(missing_docs)]
#![allow(non_camel_case_types, non_snake_case, non_upper_case_globals)]

use std::ffi::{c_char, c_int, c_void};
use std::marker::{PhantomData, PhantomPinned};

// ---------------------------------------------------------------------------------------------
// Libraries
// ---------------------------------------------------------------------------------------------

/// A CANN shared library that exports some of [`SYMBOLS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Library {
    /// AscendCL runtime: `libascendcl.so` (devices, memory, streams, events).
    AscendCl,
    /// nnopbase: `libnnopbase.so` (`aclCreateTensor` and the other aclnn descriptors).
    NnOpBase,
    /// The aclnn operators: `libopapi.so`, or the per-domain split of newer CANN
    /// ([`OpDomain::file_name`]).
    OpApi,
    /// HCCL: `libhccl.so`.
    Hccl,
}

impl Library {
    /// Every library, in load order.
    pub const ALL: [Library; 4] = [
        Library::AscendCl,
        Library::NnOpBase,
        Library::OpApi,
        Library::Hccl,
    ];

    /// The shared-object file name.
    pub fn file_name(self) -> &'static str {
        match self {
            Library::AscendCl => "libascendcl.so",
            Library::NnOpBase => "libnnopbase.so",
            Library::OpApi => "libopapi.so",
            Library::Hccl => "libhccl.so",
        }
    }
}

/// The domain library an aclnn operator lives in when CANN ships `libopapi` split per domain
/// (CANN 8.3+: `libopapi_math.so` from `hicann/ops-math`, `libopapi_nn.so` from `hicann/ops-nn`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpDomain {
    /// `libopapi_math.so` (`hicann/ops-math`: arithmetic, reductions, conversions).
    Math,
    /// `libopapi_nn.so` (`hicann/ops-nn`: activations, norms, conv, pooling, index, matmul).
    Nn,
}

impl OpDomain {
    /// Every domain.
    pub const ALL: [OpDomain; 2] = [OpDomain::Math, OpDomain::Nn];

    /// The split library's file name.
    pub fn file_name(self) -> &'static str {
        match self {
            OpDomain::Math => "libopapi_math.so",
            OpDomain::Nn => "libopapi_nn.so",
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Scalar types, handles
// ---------------------------------------------------------------------------------------------

/// `typedef int aclError;` (`acl_base_rt.h`).
pub type aclError = c_int;
/// `typedef int32_t aclnnStatus;` (`acl_meta.h`); 0 is success.
pub type aclnnStatus = i32;
/// `typedef void* aclrtStream;` (`acl_base_rt.h`).
pub type aclrtStream = *mut c_void;
/// `typedef void* aclrtEvent;` (`acl_base_rt.h`).
pub type aclrtEvent = *mut c_void;
/// `typedef void* aclrtContext;` (`acl_base_rt.h`).
pub type aclrtContext = *mut c_void;
/// `typedef void* HcclComm;` (`hccl_types.h`).
pub type HcclComm = *mut c_void;

macro_rules! opaque {
    ($($(#[$doc:meta])* $name:ident;)*) => {$(
        $(#[$doc])*
        #[repr(C)]
        pub struct $name {
            _private: [u8; 0],
            _marker: PhantomData<(*mut u8, PhantomPinned)>,
        }
    )*};
}

opaque! {
    /// `typedef struct aclTensor aclTensor;` (`acl_meta.h`): a tensor descriptor.
    aclTensor;
    /// `typedef struct aclScalar aclScalar;` (`acl_meta.h`): a host scalar of an
    /// [`aclDataType`], copied at creation.
    aclScalar;
    /// `typedef struct aclIntArray aclIntArray;` (`acl_meta.h`): host `int64_t` values,
    /// copied at creation.
    aclIntArray;
    /// `typedef struct aclBoolArray aclBoolArray;` (`acl_meta.h`): host `bool` values, copied
    /// at creation.
    aclBoolArray;
    /// `typedef struct aclTensorList aclTensorList;` (`acl_meta.h`): a list of tensor
    /// descriptors. Destroying the list destroys the tensors it holds.
    aclTensorList;
    /// `typedef struct aclOpExecutor aclOpExecutor;` (`acl_meta.h`): one prepared operator
    /// launch, made by `aclnnXxxGetWorkspaceSize`, consumed by `aclnnXxx`.
    aclOpExecutor;
}

// ---------------------------------------------------------------------------------------------
// aclError values (acl_base_rt.h, error_codes/rt_error_codes.h)
// ---------------------------------------------------------------------------------------------

/// `static const int ACL_SUCCESS = 0;` (`acl_base_rt.h`).
pub const ACL_SUCCESS: aclError = 0;
/// `ACL_ERROR_INVALID_PARAM = 100000` (`acl_base_rt.h`): a bad argument.
pub const ACL_ERROR_INVALID_PARAM: aclError = 100000;
/// `ACL_ERROR_UNINITIALIZE = 100001` (`acl_base_rt.h`): `aclInit` not called.
pub const ACL_ERROR_UNINITIALIZE: aclError = 100001;
/// `ACL_ERROR_REPEAT_INITIALIZE = 100002` (`acl_base_rt.h`): `aclInit` called twice.
pub const ACL_ERROR_REPEAT_INITIALIZE: aclError = 100002;
/// `ACL_ERROR_BAD_ALLOC = 200000` (`acl_base_rt.h`): out of memory.
pub const ACL_ERROR_BAD_ALLOC: aclError = 200000;
/// `ACL_ERROR_INVALID_DEVICE = 200002` (`acl_base_rt.h`).
pub const ACL_ERROR_INVALID_DEVICE: aclError = 200002;
/// `ACL_ERROR_INVALID_RESOURCE_HANDLE = 200005` (`acl_base_rt.h`): a stream, event or
/// executor that does not exist (or no longer does).
pub const ACL_ERROR_INVALID_RESOURCE_HANDLE: aclError = 200005;
/// `ACL_ERROR_FEATURE_UNSUPPORTED = 200006` (`acl_base_rt.h`).
pub const ACL_ERROR_FEATURE_UNSUPPORTED: aclError = 200006;
/// `ACL_ERROR_INTERNAL_ERROR = 500000` (`acl_base_rt.h`).
pub const ACL_ERROR_INTERNAL_ERROR: aclError = 500000;
/// `ACL_ERROR_FAILURE = 500001` (`acl_base_rt.h`).
pub const ACL_ERROR_FAILURE: aclError = 500001;
/// `#define ACL_ERROR_RT_PARAM_INVALID 107000` (`rt_error_codes.h`).
pub const ACL_ERROR_RT_PARAM_INVALID: aclError = 107000;
/// `#define ACL_ERROR_RT_MEMORY_ALLOCATION 207001` (`rt_error_codes.h`): device out of memory.
pub const ACL_ERROR_RT_MEMORY_ALLOCATION: aclError = 207001;
/// `#define ACL_ERROR_RT_CONTEXT_NULL 107002` (`rt_error_codes.h`): no current device or
/// context on the calling thread.
pub const ACL_ERROR_RT_CONTEXT_NULL: aclError = 107002;

/// `ACLNN_ERR_PARAM_NULLPTR = 161001` (CANN's aclnn error codes, `aclnn/aclnn_base.h`): a
/// required argument is null.
pub const ACLNN_ERR_PARAM_NULLPTR: aclnnStatus = 161001;

/// `ACLNN_ERR_PARAM_INVALID = 161002` (`aclnn/aclnn_base.h`): a shape, dtype or attribute the
/// operator does not accept.
pub const ACLNN_ERR_PARAM_INVALID: aclnnStatus = 161002;

/// `ACLNN_ERR_RUNTIME_ERROR = 361001` (`aclnn/aclnn_base.h`): a runtime call under the
/// operator failed.
pub const ACLNN_ERR_RUNTIME_ERROR: aclnnStatus = 361001;

/// `ACLNN_ERR_INNER = 561000` (`aclnn/aclnn_base.h`): an internal error of the operator.
pub const ACLNN_ERR_INNER: aclnnStatus = 561000;

/// `#define ACL_ERROR_RT_STREAM_SYNC_TIMEOUT 507046` (`rt_error_codes.h`): returned by
/// `aclrtSynchronizeStreamWithTimeout` when the stream has not drained in time.
pub const ACL_ERROR_RT_STREAM_SYNC_TIMEOUT: aclError = 507046;
/// `#define ACL_ERROR_RT_EVENT_SYNC_TIMEOUT 507047` (`rt_error_codes.h`).
pub const ACL_ERROR_RT_EVENT_SYNC_TIMEOUT: aclError = 507047;

// ---------------------------------------------------------------------------------------------
// Enums of AscendCL (acl_base_rt.h, acl_rt.h), as i32 values
// ---------------------------------------------------------------------------------------------

/// `aclDataType` (`acl_base_rt.h`).
pub type aclDataType = c_int;
/// `ACL_DT_UNDEFINED = -1`.
pub const ACL_DT_UNDEFINED: aclDataType = -1;
/// `ACL_FLOAT = 0` (f32).
pub const ACL_FLOAT: aclDataType = 0;
/// `ACL_FLOAT16 = 1`.
pub const ACL_FLOAT16: aclDataType = 1;
/// `ACL_INT8 = 2`.
pub const ACL_INT8: aclDataType = 2;
/// `ACL_INT32 = 3`.
pub const ACL_INT32: aclDataType = 3;
/// `ACL_UINT8 = 4`.
pub const ACL_UINT8: aclDataType = 4;
/// `ACL_INT16 = 6`.
pub const ACL_INT16: aclDataType = 6;
/// `ACL_UINT16 = 7`.
pub const ACL_UINT16: aclDataType = 7;
/// `ACL_UINT32 = 8`.
pub const ACL_UINT32: aclDataType = 8;
/// `ACL_INT64 = 9`.
pub const ACL_INT64: aclDataType = 9;
/// `ACL_UINT64 = 10`.
pub const ACL_UINT64: aclDataType = 10;
/// `ACL_DOUBLE = 11`.
pub const ACL_DOUBLE: aclDataType = 11;
/// `ACL_BOOL = 12` (one byte, 0 or 1).
pub const ACL_BOOL: aclDataType = 12;
/// `ACL_BF16 = 27`.
pub const ACL_BF16: aclDataType = 27;

/// `aclFormat` (`acl_base_rt.h`).
pub type aclFormat = c_int;
/// `ACL_FORMAT_UNDEFINED = -1`.
pub const ACL_FORMAT_UNDEFINED: aclFormat = -1;
/// `ACL_FORMAT_NCHW = 0`.
pub const ACL_FORMAT_NCHW: aclFormat = 0;
/// `ACL_FORMAT_NHWC = 1`.
pub const ACL_FORMAT_NHWC: aclFormat = 1;
/// `ACL_FORMAT_ND = 2`: plain row-major (the view's strides say the rest).
pub const ACL_FORMAT_ND: aclFormat = 2;

/// `aclrtMemcpyKind` (`acl_rt.h`).
pub type aclrtMemcpyKind = c_int;
/// `ACL_MEMCPY_HOST_TO_HOST = 0`.
pub const ACL_MEMCPY_HOST_TO_HOST: aclrtMemcpyKind = 0;
/// `ACL_MEMCPY_HOST_TO_DEVICE = 1`.
pub const ACL_MEMCPY_HOST_TO_DEVICE: aclrtMemcpyKind = 1;
/// `ACL_MEMCPY_DEVICE_TO_HOST = 2`.
pub const ACL_MEMCPY_DEVICE_TO_HOST: aclrtMemcpyKind = 2;
/// `ACL_MEMCPY_DEVICE_TO_DEVICE = 3` (same device).
pub const ACL_MEMCPY_DEVICE_TO_DEVICE: aclrtMemcpyKind = 3;
/// `ACL_MEMCPY_DEFAULT = 4` (direction inferred from the addresses).
pub const ACL_MEMCPY_DEFAULT: aclrtMemcpyKind = 4;

/// `aclrtMemMallocPolicy` (`acl_rt.h`).
pub type aclrtMemMallocPolicy = c_int;
/// `ACL_MEM_MALLOC_HUGE_FIRST = 0`: huge pages when the size is above 1 MiB and they are
/// available, else normal pages.
pub const ACL_MEM_MALLOC_HUGE_FIRST: aclrtMemMallocPolicy = 0;
/// `ACL_MEM_MALLOC_HUGE_ONLY = 1`.
pub const ACL_MEM_MALLOC_HUGE_ONLY: aclrtMemMallocPolicy = 1;
/// `ACL_MEM_MALLOC_NORMAL_ONLY = 2`.
pub const ACL_MEM_MALLOC_NORMAL_ONLY: aclrtMemMallocPolicy = 2;

/// `aclrtMemAttr` (`acl_rt.h`), the memory kind `aclrtGetMemInfo` reports on.
pub type aclrtMemAttr = c_int;
/// `ACL_DDR_MEM = 0`.
pub const ACL_DDR_MEM: aclrtMemAttr = 0;
/// `ACL_HBM_MEM = 1`: the device's HBM (what shardc reports).
pub const ACL_HBM_MEM: aclrtMemAttr = 1;

/// `cubeMathType` of the aclnn matmul/conv/pool operators (an `int8_t`, documented in
/// `aclnn_matmul.h`): `0` = KEEP_DTYPE (compute in the input dtype: f32 stays f32), `1` =
/// ALLOW_FP32_DOWN_PRECISION, `2` = USE_FP16, `3` = USE_HF32. shardc always passes
/// [`CUBE_MATH_KEEP_DTYPE`].
pub const CUBE_MATH_KEEP_DTYPE: i8 = 0;

// ---------------------------------------------------------------------------------------------
// HCCL types (hccl_types.h)
// ---------------------------------------------------------------------------------------------

/// `HcclResult` (`hccl_types.h`).
pub type HcclResult = c_int;
/// `HCCL_SUCCESS = 0`.
pub const HCCL_SUCCESS: HcclResult = 0;
/// `HCCL_E_PARA = 1`: parameter error (also: members of one collective disagree).
pub const HCCL_E_PARA: HcclResult = 1;
/// `HCCL_E_PTR = 2`: null pointer.
pub const HCCL_E_PTR: HcclResult = 2;
/// `HCCL_E_MEMORY = 3`.
pub const HCCL_E_MEMORY: HcclResult = 3;
/// `HCCL_E_INTERNAL = 4`.
pub const HCCL_E_INTERNAL: HcclResult = 4;
/// `HCCL_E_NOT_SUPPORT = 5`.
pub const HCCL_E_NOT_SUPPORT: HcclResult = 5;
/// `HCCL_E_NOT_FOUND = 6`.
pub const HCCL_E_NOT_FOUND: HcclResult = 6;
/// `HCCL_E_UNAVAIL = 7`.
pub const HCCL_E_UNAVAIL: HcclResult = 7;
/// `HCCL_E_TIMEOUT = 9`.
pub const HCCL_E_TIMEOUT: HcclResult = 9;
/// `HCCL_E_RUNTIME = 15`: a runtime (AscendCL) call failed.
pub const HCCL_E_RUNTIME: HcclResult = 15;
/// `HCCL_E_REMOTE = 21`: error reported by a remote rank.
pub const HCCL_E_REMOTE: HcclResult = 21;

/// `HcclReduceOp` (`hccl_types.h`).
pub type HcclReduceOp = c_int;
/// `HCCL_REDUCE_SUM = 0`.
pub const HCCL_REDUCE_SUM: HcclReduceOp = 0;
/// `HCCL_REDUCE_PROD = 1`.
pub const HCCL_REDUCE_PROD: HcclReduceOp = 1;
/// `HCCL_REDUCE_MAX = 2`.
pub const HCCL_REDUCE_MAX: HcclReduceOp = 2;
/// `HCCL_REDUCE_MIN = 3`.
pub const HCCL_REDUCE_MIN: HcclReduceOp = 3;

/// `HcclDataType` (`hccl_types.h`).
pub type HcclDataType = c_int;
/// `HCCL_DATA_TYPE_INT8 = 0`.
pub const HCCL_DATA_TYPE_INT8: HcclDataType = 0;
/// `HCCL_DATA_TYPE_INT16 = 1`.
pub const HCCL_DATA_TYPE_INT16: HcclDataType = 1;
/// `HCCL_DATA_TYPE_INT32 = 2`.
pub const HCCL_DATA_TYPE_INT32: HcclDataType = 2;
/// `HCCL_DATA_TYPE_FP16 = 3`.
pub const HCCL_DATA_TYPE_FP16: HcclDataType = 3;
/// `HCCL_DATA_TYPE_FP32 = 4`.
pub const HCCL_DATA_TYPE_FP32: HcclDataType = 4;
/// `HCCL_DATA_TYPE_INT64 = 5`.
pub const HCCL_DATA_TYPE_INT64: HcclDataType = 5;
/// `HCCL_DATA_TYPE_UINT64 = 6`.
pub const HCCL_DATA_TYPE_UINT64: HcclDataType = 6;
/// `HCCL_DATA_TYPE_UINT8 = 7`.
pub const HCCL_DATA_TYPE_UINT8: HcclDataType = 7;
/// `HCCL_DATA_TYPE_UINT16 = 8`.
pub const HCCL_DATA_TYPE_UINT16: HcclDataType = 8;
/// `HCCL_DATA_TYPE_UINT32 = 9`.
pub const HCCL_DATA_TYPE_UINT32: HcclDataType = 9;
/// `HCCL_DATA_TYPE_FP64 = 10`.
pub const HCCL_DATA_TYPE_FP64: HcclDataType = 10;
/// `HCCL_DATA_TYPE_BFP16 = 11`.
pub const HCCL_DATA_TYPE_BFP16: HcclDataType = 11;

/// `const uint32_t HCCL_ROOT_INFO_BYTES = 4108;` (`hccl_types.h`).
pub const HCCL_ROOT_INFO_BYTES: usize = 4108;

/// `typedef struct HcclRootInfoDef { char internal[HCCL_ROOT_INFO_BYTES]; } HcclRootInfo;`
/// (`hccl_types.h`): what `HcclGetRootInfo` fills and every member passes to
/// `HcclCommInitRootInfo`. Opaque bytes; the emulator chooses their content.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct HcclRootInfo {
    /// The opaque root-info bytes.
    pub internal: [c_char; HCCL_ROOT_INFO_BYTES],
}

impl Default for HcclRootInfo {
    fn default() -> Self {
        HcclRootInfo {
            internal: [0; HCCL_ROOT_INFO_BYTES],
        }
    }
}

/// `HcclSendRecvType` (`hccl_types.h`).
pub type HcclSendRecvType = c_int;
/// `HCCL_SEND = 0`.
pub const HCCL_SEND: HcclSendRecvType = 0;
/// `HCCL_RECV = 1`.
pub const HCCL_RECV: HcclSendRecvType = 1;

/// `typedef struct HcclSendRecvItemDef { HcclSendRecvType sendRecvType; void* buf; uint64_t
/// count; HcclDataType dataType; uint32_t remoteRank; } HcclSendRecvItem;` (`hccl_types.h`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct HcclSendRecvItem {
    /// [`HCCL_SEND`] or [`HCCL_RECV`].
    pub sendRecvType: HcclSendRecvType,
    /// The device buffer sent from or received into.
    pub buf: *mut c_void,
    /// Elements of `dataType`.
    pub count: u64,
    /// The element type.
    pub dataType: HcclDataType,
    /// The peer's rank in the communicator.
    pub remoteRank: u32,
}

// ---------------------------------------------------------------------------------------------
// Functions
// ---------------------------------------------------------------------------------------------

macro_rules! api {
    (
        core { $( $lib:ident { $( $(#[$doc:meta])* fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) -> $ret:ty ; )* } )* }
        aclnn { $( $dom:ident { $( $(#[$odoc:meta])* op $op:ident, $ws:ident ( $($oarg:ident : $oty:ty),* $(,)? ) ; )* } )* }
    ) => {
        /// One `unsafe extern "C" fn` type per C symbol, named exactly as the symbol.
        ///
        /// Each aclnn operator has two: `aclnnXxxGetWorkspaceSize` (validate, size the
        /// workspace, make the executor) and `aclnnXxx(workspace, workspaceSize, executor,
        /// stream)` (launch on the stream, consume the executor). The operator's semantics are
        /// on both.
        pub mod sig {
            #[allow(unused_imports)]
            use super::*;
            $( $(
                $(#[$doc])*
                pub type $name = unsafe extern "C" fn($($arg: $ty),*) -> $ret;
            )* )*
            $( $(
                $(#[$odoc])*
                ///
                /// Phase 1: validates the descriptors, writes the workspace size in bytes to
                /// `*workspaceSize` and a one-shot executor to `*executor`.
                pub type $ws = unsafe extern "C" fn($($oarg: $oty,)* workspaceSize: *mut u64, executor: *mut *mut aclOpExecutor) -> aclnnStatus;
                $(#[$odoc])*
                ///
                /// Phase 2: enqueues the prepared op on `stream` with `workspace` (device memory
                /// of at least `workspaceSize` bytes, null if 0) and consumes `executor`.
                pub type $op = unsafe extern "C" fn(workspace: *mut c_void, workspaceSize: u64, executor: *mut aclOpExecutor, stream: aclrtStream) -> aclnnStatus;
            )* )*
        }

        /// Every symbol shardc resolves, with the library that exports it (aclnn operators:
        /// [`Library::OpApi`]; see [`ACLNN_DOMAINS`] for the split libraries).
        pub const SYMBOLS: &[(Library, &str)] = &[
            $( $( (Library::$lib, stringify!($name)), )* )*
            $( $( (Library::OpApi, stringify!($ws)), (Library::OpApi, stringify!($op)), )* )*
        ];

        /// Every aclnn symbol with the per-domain library of newer CANN that exports it.
        pub const ACLNN_DOMAINS: &[(&str, OpDomain)] = &[
            $( $( (stringify!($ws), OpDomain::$dom), (stringify!($op), OpDomain::$dom), )* )*
        ];
    };
}

api! {
core {
AscendCl {
    /// `aclError aclInit(const char* configPath);` (`acl_rt.h`). Once per process, before any
    /// other call; `configPath` may be null. A second call returns
    /// [`ACL_ERROR_REPEAT_INITIALIZE`] (callers treat it as success).
    fn aclInit(configPath: *const c_char) -> aclError;
    /// `aclError aclFinalize();` (`acl_rt.h`).
    fn aclFinalize() -> aclError;
    /// `aclError aclrtSetDevice(int32_t deviceId);` (`acl_rt.h`): make `deviceId` current on
    /// the calling thread.
    fn aclrtSetDevice(deviceId: i32) -> aclError;
    /// `aclError aclrtResetDevice(int32_t deviceId);` (`acl_rt.h`).
    fn aclrtResetDevice(deviceId: i32) -> aclError;
    /// `aclError aclrtGetDevice(int32_t* deviceId);` (`acl_rt.h`): the calling thread's
    /// current device.
    fn aclrtGetDevice(deviceId: *mut i32) -> aclError;
    /// `aclError aclrtGetDeviceCount(uint32_t* count);` (`acl_rt.h`).
    fn aclrtGetDeviceCount(count: *mut u32) -> aclError;
    /// `aclError aclrtCreateStream(aclrtStream* stream);` (`acl_rt.h`): a stream on the
    /// current device.
    fn aclrtCreateStream(stream: *mut aclrtStream) -> aclError;
    /// `aclError aclrtDestroyStream(aclrtStream stream);` (`acl_rt.h`).
    fn aclrtDestroyStream(stream: aclrtStream) -> aclError;
    /// `aclError aclrtSynchronizeStream(aclrtStream stream);` (`acl_rt.h`): block until all
    /// work on `stream` is done; returns the first error of that work.
    fn aclrtSynchronizeStream(stream: aclrtStream) -> aclError;
    /// `aclError aclrtSynchronizeStreamWithTimeout(aclrtStream stream, int32_t timeout);`
    /// (`acl_rt.h`): as `aclrtSynchronizeStream`, at most `timeout` **milliseconds** (-1:
    /// forever); on expiry returns [`ACL_ERROR_RT_STREAM_SYNC_TIMEOUT`] (the work stays
    /// queued).
    fn aclrtSynchronizeStreamWithTimeout(stream: aclrtStream, timeout: i32) -> aclError;
    /// `aclError aclrtCreateEvent(aclrtEvent* event);` (`acl_rt.h`).
    fn aclrtCreateEvent(event: *mut aclrtEvent) -> aclError;
    /// `aclError aclrtDestroyEvent(aclrtEvent event);` (`acl_rt.h`).
    fn aclrtDestroyEvent(event: aclrtEvent) -> aclError;
    /// `aclError aclrtRecordEvent(aclrtEvent event, aclrtStream stream);` (`acl_rt.h`): the
    /// event completes when the work issued to `stream` before it is done.
    fn aclrtRecordEvent(event: aclrtEvent, stream: aclrtStream) -> aclError;
    /// `aclError aclrtStreamWaitEvent(aclrtStream stream, aclrtEvent event);` (`acl_rt.h`):
    /// later work on `stream` waits for the event's last record.
    fn aclrtStreamWaitEvent(stream: aclrtStream, event: aclrtEvent) -> aclError;
    /// `aclError aclrtSynchronizeEvent(aclrtEvent event);` (`acl_rt.h`): block the host until
    /// the event's last record completes.
    fn aclrtSynchronizeEvent(event: aclrtEvent) -> aclError;
    /// `aclError aclrtMalloc(void** devPtr, size_t size, aclrtMemMallocPolicy policy);`
    /// (`acl_rt.h`): `size` > 0 bytes of device memory on the current device, 64-byte
    /// aligned, uninitialised.
    fn aclrtMalloc(devPtr: *mut *mut c_void, size: usize, policy: aclrtMemMallocPolicy) -> aclError;
    /// `aclError aclrtFree(void* devPtr);` (`acl_rt.h`).
    fn aclrtFree(devPtr: *mut c_void) -> aclError;
    /// `aclError aclrtMemcpy(void* dst, size_t destMax, const void* src, size_t count,
    /// aclrtMemcpyKind kind);` (`acl_rt.h`): synchronous copy of `count` bytes (`count` ≤
    /// `destMax`, else [`ACL_ERROR_INVALID_PARAM`]); it does not wait for streams.
    fn aclrtMemcpy(dst: *mut c_void, destMax: usize, src: *const c_void, count: usize, kind: aclrtMemcpyKind) -> aclError;
    /// `aclError aclrtMemcpyAsync(void* dst, size_t destMax, const void* src, size_t count,
    /// aclrtMemcpyKind kind, aclrtStream stream);` (`acl_rt.h`): the copy is ordered on
    /// `stream`; a host source must stay valid (and a host destination unread) until the
    /// stream is synchronized.
    fn aclrtMemcpyAsync(dst: *mut c_void, destMax: usize, src: *const c_void, count: usize, kind: aclrtMemcpyKind, stream: aclrtStream) -> aclError;
    /// `aclError aclrtMemset(void* devPtr, size_t maxCount, int32_t value, size_t count);`
    /// (`acl_rt.h`): set `count` bytes to `value as u8`.
    fn aclrtMemset(devPtr: *mut c_void, maxCount: usize, value: i32, count: usize) -> aclError;
    /// `aclError aclrtMemsetAsync(void* devPtr, size_t maxCount, int32_t value, size_t count,
    /// aclrtStream stream);` (`acl_rt.h`).
    fn aclrtMemsetAsync(devPtr: *mut c_void, maxCount: usize, value: i32, count: usize, stream: aclrtStream) -> aclError;
    /// `aclError aclrtGetMemInfo(aclrtMemAttr attr, size_t* free, size_t* total);`
    /// (`acl_rt.h`): free and total bytes of the current device.
    fn aclrtGetMemInfo(attr: aclrtMemAttr, free: *mut usize, total: *mut usize) -> aclError;
    /// `const char* aclrtGetSocName();` (`acl_rt.h`): the SoC name (e.g. `Ascend910B1`), a
    /// static NUL-terminated string, or null before `aclInit`.
    fn aclrtGetSocName() -> *const c_char;
    /// `aclError aclrtGetVersion(int32_t* majorVersion, int32_t* minorVersion, int32_t*
    /// patchVersion);` (`acl_rt.h`).
    fn aclrtGetVersion(majorVersion: *mut i32, minorVersion: *mut i32, patchVersion: *mut i32) -> aclError;
    /// `const char* aclGetRecentErrMsg();` (`acl_rt.h`): the calling thread's last error
    /// message (NUL-terminated, valid until the next call on the thread), or null.
    fn aclGetRecentErrMsg() -> *const c_char;
}
NnOpBase {
    /// `aclTensor* aclCreateTensor(const int64_t* viewDims, uint64_t viewDimsNum, aclDataType
    /// dataType, const int64_t* stride, int64_t offset, aclFormat format, const int64_t*
    /// storageDims, uint64_t storageDimsNum, void* tensorData);` (`acl_meta.h`). See the crate
    /// doc for the addressing rule. Null on a bad argument.
    fn aclCreateTensor(viewDims: *const i64, viewDimsNum: u64, dataType: aclDataType, stride: *const i64, offset: i64, format: aclFormat, storageDims: *const i64, storageDimsNum: u64, tensorData: *mut c_void) -> *mut aclTensor;
    /// `aclScalar* aclCreateScalar(void* value, aclDataType dataType);` (`acl_meta.h`):
    /// copies the host value (`sizeof(dataType)` bytes at `value`).
    fn aclCreateScalar(value: *mut c_void, dataType: aclDataType) -> *mut aclScalar;
    /// `aclIntArray* aclCreateIntArray(const int64_t* value, uint64_t size);` (`acl_meta.h`).
    fn aclCreateIntArray(value: *const i64, size: u64) -> *mut aclIntArray;
    /// `aclBoolArray* aclCreateBoolArray(const bool* value, uint64_t size);` (`acl_meta.h`).
    fn aclCreateBoolArray(value: *const bool, size: u64) -> *mut aclBoolArray;
    /// `aclTensorList* aclCreateTensorList(const aclTensor* const* value, uint64_t size);`
    /// (`acl_meta.h`): the list takes ownership of the tensors.
    fn aclCreateTensorList(value: *const *const aclTensor, size: u64) -> *mut aclTensorList;
    /// `aclnnStatus aclDestroyTensor(const aclTensor* tensor);` (`acl_meta.h`).
    fn aclDestroyTensor(tensor: *const aclTensor) -> aclnnStatus;
    /// `aclnnStatus aclDestroyScalar(const aclScalar* scalar);` (`acl_meta.h`).
    fn aclDestroyScalar(scalar: *const aclScalar) -> aclnnStatus;
    /// `aclnnStatus aclDestroyIntArray(const aclIntArray* array);` (`acl_meta.h`).
    fn aclDestroyIntArray(array: *const aclIntArray) -> aclnnStatus;
    /// `aclnnStatus aclDestroyBoolArray(const aclBoolArray* array);` (`acl_meta.h`).
    fn aclDestroyBoolArray(array: *const aclBoolArray) -> aclnnStatus;
    /// `aclnnStatus aclDestroyTensorList(const aclTensorList* array);` (`acl_meta.h`):
    /// destroys the list and its tensors.
    fn aclDestroyTensorList(array: *const aclTensorList) -> aclnnStatus;
}
Hccl {
    /// `HcclResult HcclGetRootInfo(HcclRootInfo* rootInfo);` (`hccl_comm.h`): made by one
    /// member (the root), shared by the caller with the others.
    fn HcclGetRootInfo(rootInfo: *mut HcclRootInfo) -> HcclResult;
    /// `HcclResult HcclCommInitRootInfo(uint32_t nRanks, const HcclRootInfo* rootInfo,
    /// uint32_t rank, HcclComm* comm);` (`hccl_comm.h`): blocks until all `nRanks` members
    /// have joined; the communicator's device is the caller's current device.
    fn HcclCommInitRootInfo(nRanks: u32, rootInfo: *const HcclRootInfo, rank: u32, comm: *mut HcclComm) -> HcclResult;
    /// `HcclResult HcclCommDestroy(HcclComm comm);` (`hccl_comm.h`).
    fn HcclCommDestroy(comm: HcclComm) -> HcclResult;
    /// `HcclResult HcclGetRankSize(HcclComm comm, uint32_t* rankSize);` (`hccl_comm.h`).
    fn HcclGetRankSize(comm: HcclComm, rankSize: *mut u32) -> HcclResult;
    /// `HcclResult HcclGetRankId(HcclComm comm, uint32_t* rank);` (`hccl_comm.h`).
    fn HcclGetRankId(comm: HcclComm, rank: *mut u32) -> HcclResult;
    /// `HcclResult HcclGetCommAsyncError(HcclComm comm, HcclResult* asyncError);`
    /// (`hccl_comm.h`): the communicator's asynchronous error (e.g. a peer that left or
    /// disagreed), [`HCCL_SUCCESS`] if none.
    fn HcclGetCommAsyncError(comm: HcclComm, asyncError: *mut HcclResult) -> HcclResult;
    /// `const char* HcclGetErrorString(HcclResult code);` (`hccl_comm.h`): a static
    /// NUL-terminated description of `code`.
    fn HcclGetErrorString(code: HcclResult) -> *const c_char;
    /// `HcclResult HcclAllReduce(void* sendBuf, void* recvBuf, uint64_t count, HcclDataType
    /// dataType, HcclReduceOp op, HcclComm comm, aclrtStream stream);` (`hccl.h`): `recvBuf[i]
    /// = op over ranks of sendBuf[i]` for `i < count`; `sendBuf == recvBuf` is allowed.
    /// Summation order is rank 0, 1, .., n-1 (deterministic).
    fn HcclAllReduce(sendBuf: *mut c_void, recvBuf: *mut c_void, count: u64, dataType: HcclDataType, op: HcclReduceOp, comm: HcclComm, stream: aclrtStream) -> HcclResult;
    /// `HcclResult HcclBroadcast(void* buf, uint64_t count, HcclDataType dataType, uint32_t
    /// root, HcclComm comm, aclrtStream stream);` (`hccl.h`): every member's `buf` becomes
    /// `root`'s.
    fn HcclBroadcast(buf: *mut c_void, count: u64, dataType: HcclDataType, root: u32, comm: HcclComm, stream: aclrtStream) -> HcclResult;
    /// `HcclResult HcclReduceScatter(void* sendBuf, void* recvBuf, uint64_t recvCount,
    /// HcclDataType dataType, HcclReduceOp op, HcclComm comm, aclrtStream stream);`
    /// (`hccl.h`): `sendBuf` holds `n·recvCount` elements; rank `r` receives the reduction of
    /// block `r` (elements `r·recvCount ..`) over ranks.
    fn HcclReduceScatter(sendBuf: *mut c_void, recvBuf: *mut c_void, recvCount: u64, dataType: HcclDataType, op: HcclReduceOp, comm: HcclComm, stream: aclrtStream) -> HcclResult;
    /// `HcclResult HcclAllGather(void* sendBuf, void* recvBuf, uint64_t sendCount,
    /// HcclDataType dataType, HcclComm comm, aclrtStream stream);` (`hccl.h`): `recvBuf`
    /// holds `n·sendCount` elements, block `r` is rank `r`'s `sendBuf`.
    fn HcclAllGather(sendBuf: *mut c_void, recvBuf: *mut c_void, sendCount: u64, dataType: HcclDataType, comm: HcclComm, stream: aclrtStream) -> HcclResult;
    /// `HcclResult HcclSend(void* sendBuf, uint64_t count, HcclDataType dataType, uint32_t
    /// destRank, HcclComm comm, aclrtStream stream);` (`hccl.h`): matched with `destRank`'s
    /// `HcclRecv` from this rank, in issue order.
    fn HcclSend(sendBuf: *mut c_void, count: u64, dataType: HcclDataType, destRank: u32, comm: HcclComm, stream: aclrtStream) -> HcclResult;
    /// `HcclResult HcclRecv(void* recvBuf, uint64_t count, HcclDataType dataType, uint32_t
    /// srcRank, HcclComm comm, aclrtStream stream);` (`hccl.h`).
    fn HcclRecv(recvBuf: *mut c_void, count: u64, dataType: HcclDataType, srcRank: u32, comm: HcclComm, stream: aclrtStream) -> HcclResult;
    /// `HcclResult HcclAlltoAll(const void* sendBuf, uint64_t sendCount, HcclDataType
    /// sendType, const void* recvBuf, uint64_t recvCount, HcclDataType recvType, HcclComm
    /// comm, aclrtStream stream);` (`hccl.h`): block `j` (of `sendCount` elements) of rank
    /// `i`'s `sendBuf` lands in block `i` (of `recvCount` elements) of rank `j`'s `recvBuf`.
    /// Note `recvBuf` is declared `const void*` in the header although it is written.
    fn HcclAlltoAll(sendBuf: *const c_void, sendCount: u64, sendType: HcclDataType, recvBuf: *const c_void, recvCount: u64, recvType: HcclDataType, comm: HcclComm, stream: aclrtStream) -> HcclResult;
    /// `HcclResult HcclBatchSendRecv(HcclSendRecvItem* sendRecvInfo, uint32_t itemNum,
    /// HcclComm comm, aclrtStream stream);` (`hccl.h`): all items are posted together, so
    /// a pair of ranks may exchange in both directions without deadlock.
    fn HcclBatchSendRecv(sendRecvInfo: *mut HcclSendRecvItem, itemNum: u32, comm: HcclComm, stream: aclrtStream) -> HcclResult;
}
}
aclnn {
Math {
    /// `aclnnAdd` (`ops-math` `math/add/op_api/aclnn_add.h`): `out = self + alpha·other`,
    /// numpy broadcasting of `self` and `other` to `out`'s shape; `alpha` (an [`aclScalar`]
    /// of the tensors' dtype, shardc passes 1.0) scales `other`.
    op aclnnAdd, aclnnAddGetWorkspaceSize(self_: *const aclTensor, other: *const aclTensor, alpha: *const aclScalar, out: *mut aclTensor);
    /// `aclnnAdds` (`aclnn_add.h`): `out = self + alpha·other` with a scalar `other`.
    op aclnnAdds, aclnnAddsGetWorkspaceSize(self_: *const aclTensor, other: *const aclScalar, alpha: *const aclScalar, out: *mut aclTensor);
    /// `aclnnSub` (`math/sub/op_api/aclnn_sub.h`): `out = self - alpha·other`, broadcasting.
    op aclnnSub, aclnnSubGetWorkspaceSize(self_: *const aclTensor, other: *const aclTensor, alpha: *const aclScalar, out: *mut aclTensor);
    /// `aclnnMul` (`math/mul/op_api/aclnn_mul.h`): `out = self · other`, broadcasting.
    op aclnnMul, aclnnMulGetWorkspaceSize(self_: *const aclTensor, other: *const aclTensor, out: *mut aclTensor);
    /// `aclnnMuls` (`aclnn_mul.h`): `out = self · other` with a scalar `other`.
    op aclnnMuls, aclnnMulsGetWorkspaceSize(self_: *const aclTensor, other: *const aclScalar, out: *mut aclTensor);
    /// `aclnnDiv` (`math/div/op_api/aclnn_div.h`): `out = self / other` (true division),
    /// broadcasting.
    op aclnnDiv, aclnnDivGetWorkspaceSize(self_: *const aclTensor, other: *const aclTensor, out: *mut aclTensor);
    /// `aclnnNeg` (`math/neg/op_api/aclnn_neg.h`): `out = -self`.
    op aclnnNeg, aclnnNegGetWorkspaceSize(self_: *const aclTensor, out: *mut aclTensor);
    /// `aclnnSqrt` (`math/sqrt/op_api/aclnn_sqrt.h`): `out = sqrt(self)`.
    op aclnnSqrt, aclnnSqrtGetWorkspaceSize(self_: *const aclTensor, out: *mut aclTensor);
    /// `aclnnExp` (`math/exp/op_api/aclnn_exp.h`): `out = exp(self)`.
    op aclnnExp, aclnnExpGetWorkspaceSize(self_: *const aclTensor, out: *mut aclTensor);
    /// `aclnnLog` (`math/log/op_api/aclnn_log.h`): `out = ln(self)`.
    op aclnnLog, aclnnLogGetWorkspaceSize(self_: *const aclTensor, out: *mut aclTensor);
    /// `aclnnTanh` (`math/tanh/op_api/aclnn_tanh.h`): `out = tanh(self)`.
    op aclnnTanh, aclnnTanhGetWorkspaceSize(self_: *const aclTensor, out: *mut aclTensor);
    /// `aclnnErf` (`math/erf/op_api/aclnn_erf.h`, hicann/ops-math): `out = erf(self)`, the
    /// error function.
    op aclnnErf, aclnnErfGetWorkspaceSize(self_: *const aclTensor, out: *mut aclTensor);
    /// `aclnnTanhBackward` (`math/tanh_grad/op_api/aclnn_tanh_backward.h`): `gradInput =
    /// gradOutput · (1 - output²)` where `output = tanh(x)`.
    op aclnnTanhBackward, aclnnTanhBackwardGetWorkspaceSize(gradOutput: *const aclTensor, output: *const aclTensor, gradInput: *mut aclTensor);
    /// `aclnnCast` (`math/cast/op_api/aclnn_cast.h`): `out = self` converted to `dtype`
    /// (`out`'s dtype): float→int truncates toward zero, bool→number is 0/1, number→bool is
    /// `!= 0`.
    op aclnnCast, aclnnCastGetWorkspaceSize(self_: *const aclTensor, dtype: aclDataType, out: *mut aclTensor);
    /// `aclnnEqTensor` (`math/equal/op_api/aclnn_eq_tensor.h`): `out = (self == other)`,
    /// broadcasting; `out` is [`ACL_BOOL`] (or any dtype: 1/0).
    op aclnnEqTensor, aclnnEqTensorGetWorkspaceSize(self_: *const aclTensor, other: *const aclTensor, out: *mut aclTensor);
    /// `aclnnReduceSum` (`math/reduce_sum/op_api/aclnn_reduce_sum.h`): sum of `self` over the
    /// axes `dims` (negative counts from the end; an empty array reduces nothing), kept as
    /// size-1 axes when `keepDims`; result in `dtype` (= `out`'s). Summation runs in
    /// increasing index order.
    op aclnnReduceSum, aclnnReduceSumGetWorkspaceSize(self_: *const aclTensor, dims: *const aclIntArray, keepDims: bool, dtype: aclDataType, out: *mut aclTensor);
    /// `aclnnMean` (`math/reduce_mean/op_api/aclnn_mean.h`): mean over `dim` (an empty array
    /// means every axis), kept when `keepDim`; result in `dtype`.
    op aclnnMean, aclnnMeanGetWorkspaceSize(self_: *const aclTensor, dim: *const aclIntArray, keepDim: bool, dtype: aclDataType, out: *mut aclTensor);
    /// `aclnnAmax` (`math/reduce_max/op_api/aclnn_amax.h`): maximum over `dim` (empty: every
    /// axis), kept when `keepDim`.
    op aclnnAmax, aclnnAmaxGetWorkspaceSize(self_: *const aclTensor, dim: *const aclIntArray, keepDim: bool, out: *mut aclTensor);
    /// `aclnnExpand` (`math/expand/op_api/aclnn_expand.h`): `out` = `self` broadcast (numpy
    /// rules) to the shape `size`.
    op aclnnExpand, aclnnExpandGetWorkspaceSize(self_: *const aclTensor, size: *const aclIntArray, out: *mut aclTensor);
    /// `aclnnOneHot` (`math/one_hot/op_api/aclnn_one_hot.h`): `self` holds integer indices
    /// (int32/int64); `out` has a new axis of length `numClasses` inserted at `axis` (-1:
    /// last); `out[.., k, ..] = onValue` where `self[..] == k`, else `offValue`
    /// (`onValue`/`offValue`: 1-element tensors of `out`'s dtype). Indices outside
    /// `[0, numClasses)` give an all-`offValue` row.
    op aclnnOneHot, aclnnOneHotGetWorkspaceSize(self_: *const aclTensor, numClasses: c_int, onValue: *const aclTensor, offValue: *const aclTensor, axis: i64, out: *mut aclTensor);
    /// `aclnnPermute` (`conversion/transpose/op_api/aclnn_permute.h`): `out.shape[i] =
    /// self.shape[dims[i]]`, `out[i0..] = self[i_{dims^-1}..]` (numpy `transpose(self, dims)`).
    op aclnnPermute, aclnnPermuteGetWorkspaceSize(self_: *const aclTensor, dims: *const aclIntArray, out: *mut aclTensor);
    /// `aclnnCat` (`conversion/concat_d/op_api/aclnn_cat.h`): concatenation of the list's
    /// tensors along `dim` (negative counts from the end), in list order.
    op aclnnCat, aclnnCatGetWorkspaceSize(tensors: *const aclTensorList, dim: i64, out: *mut aclTensor);
    /// `aclnnInplaceCopy` (`conversion/view_copy/op_api/aclnn_copy.h`): `selfRef = src`
    /// element by element (both may be strided views; `src` broadcasts to `selfRef`'s shape;
    /// dtype converted as [`sig::aclnnCast`]).
    op aclnnInplaceCopy, aclnnInplaceCopyGetWorkspaceSize(selfRef: *mut aclTensor, src: *const aclTensor);
    /// `aclnnInplaceZero` (`math/zero_op/op_api/aclnn_zero.h`): `selfRef = 0`.
    op aclnnInplaceZero, aclnnInplaceZeroGetWorkspaceSize(selfRef: *mut aclTensor);
    /// `aclnnInplaceFillScalar` (`conversion/fill/op_api/aclnn_fill_scalar.h`): every element
    /// of `selfRef` = `value` (converted to `selfRef`'s dtype).
    op aclnnInplaceFillScalar, aclnnInplaceFillScalarGetWorkspaceSize(selfRef: *mut aclTensor, value: *const aclScalar);
}
Nn {
    /// `aclnnMatmul` (`ops-nn` `matmul/mat_mul_v3/op_host/op_api/aclnn_matmul.h`):
    /// `torch.matmul(self, mat2)`: 2-d × 2-d is `[m,k]·[k,n]`; with more axes the leading
    /// (batch) axes broadcast. Transposed operands are strided views. Accumulates in f32 in
    /// increasing `k` order. `cubeMathType`: see [`CUBE_MATH_KEEP_DTYPE`].
    op aclnnMatmul, aclnnMatmulGetWorkspaceSize(self_: *const aclTensor, mat2: *const aclTensor, out: *mut aclTensor, cubeMathType: i8);
    /// `aclnnBatchMatMul` (`matmul/batch_mat_mul_v3/op_host/op_api/aclnn_batch_matmul.h`):
    /// `[b,m,k]·[b,k,n] → [b,m,n]` (3-d only; strided views allowed).
    op aclnnBatchMatMul, aclnnBatchMatMulGetWorkspaceSize(self_: *const aclTensor, mat2: *const aclTensor, out: *mut aclTensor, cubeMathType: i8);
    /// `aclnnRelu` (`activation/relu/op_api/aclnn_relu.h`): `out = max(self, 0)`. (`out` is
    /// declared `const aclTensor*` in the header.)
    op aclnnRelu, aclnnReluGetWorkspaceSize(self_: *const aclTensor, out: *const aclTensor);
    /// `aclnnSigmoid` (`activation/sigmoid/op_api/aclnn_sigmoid.h`): `out = 1/(1+exp(-self))`.
    op aclnnSigmoid, aclnnSigmoidGetWorkspaceSize(self_: *const aclTensor, out: *mut aclTensor);
    /// `aclnnSigmoidBackward` (`activation/sigmoid_grad/op_api/aclnn_sigmoid_backward.h`):
    /// `gradInput = gradOutput · output · (1 - output)`, `output = sigmoid(x)`.
    op aclnnSigmoidBackward, aclnnSigmoidBackwardGetWorkspaceSize(gradOutput: *const aclTensor, output: *const aclTensor, gradInput: *mut aclTensor);
    /// `aclnnGeluV2` (`activation/gelu_v2/op_api/aclnn_gelu_v2.h`): `approximate` 0 =
    /// "none": `y = x·Φ(x) = 0.5·x·(1+erf(x/√2))`; 1 = "tanh" (MindSpore's GeLU, what shardc
    /// passes): `y = 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`.
    op aclnnGeluV2, aclnnGeluV2GetWorkspaceSize(x: *const aclTensor, approximate: i64, y: *mut aclTensor);
    /// `aclnnGeluBackwardV2` (`activation/gelu_grad_v2/op_api/aclnn_gelu_backward_v2.h`):
    /// `gradInput = gradOutput · d gelu(self)/d self` with `approximate` a NUL-terminated
    /// string `"none"` or `"tanh"` (shardc passes `"tanh"`): for tanh, with `u = √(2/π)·(x +
    /// 0.044715·x³)`, `d/dx = 0.5·(1+tanh u) + 0.5·x·(1-tanh² u)·√(2/π)·(1 + 3·0.044715·x²)`.
    op aclnnGeluBackwardV2, aclnnGeluBackwardV2GetWorkspaceSize(gradOutput: *const aclTensor, self_: *const aclTensor, approximate: *mut c_char, gradInput: *mut aclTensor);
    /// `aclnnSilu` (`activation/swish/op_api/aclnn_silu.h`): `out = self · sigmoid(self)`.
    op aclnnSilu, aclnnSiluGetWorkspaceSize(self_: *const aclTensor, out: *mut aclTensor);
    /// `aclnnSiluBackward` (`activation/silu_grad/op_api/aclnn_silu_backward.h`): `gradInput
    /// = gradOutput · s·(1 + x·(1-s))`, `s = sigmoid(x)`, `x = self`.
    op aclnnSiluBackward, aclnnSiluBackwardGetWorkspaceSize(gradOutput: *const aclTensor, self_: *const aclTensor, gradInput: *mut aclTensor);
    /// `aclnnThresholdBackward` (`activation/threshold_grad_v2_d/op_api/aclnn_threshold_backward.h`):
    /// `out = self > threshold ? gradOutput : 0` (ReLU's gradient with threshold 0).
    op aclnnThresholdBackward, aclnnThresholdBackwardGetWorkspaceSize(gradOutput: *const aclTensor, self_: *const aclTensor, threshold: *const aclScalar, out: *mut aclTensor);
    /// `aclnnSoftmax` (`activation/softmax_v2/op_api/aclnn_softmax.h`): softmax along `dim`
    /// (negative counts from the end), computed as `exp(x - max)/Σ exp(x - max)`.
    op aclnnSoftmax, aclnnSoftmaxGetWorkspaceSize(self_: *const aclTensor, dim: i64, out: *mut aclTensor);
    /// `aclnnSoftmaxBackward` (`activation/softmax_grad/op_api/aclnn_softmax_backward.h`):
    /// `out = output · (gradOutput - Σ_dim(gradOutput · output))`.
    op aclnnSoftmaxBackward, aclnnSoftmaxBackwardGetWorkspaceSize(gradOutput: *const aclTensor, output: *const aclTensor, dim: i64, out: *mut aclTensor);
    /// `aclnnLogSoftmax` (`activation/log_softmax_v2/op_api/aclnn_logsoftmax.h`): `out = x -
    /// max - ln Σ exp(x - max)` along `dim`.
    op aclnnLogSoftmax, aclnnLogSoftmaxGetWorkspaceSize(self_: *const aclTensor, dim: i64, out: *mut aclTensor);
    /// `aclnnLogSoftmaxBackward` (`activation/log_softmax_grad/op_api/aclnn_logsoftmax_backward.h`):
    /// `out = gradOutput - exp(output) · Σ_dim gradOutput`.
    op aclnnLogSoftmaxBackward, aclnnLogSoftmaxBackwardGetWorkspaceSize(gradOutput: *const aclTensor, output: *const aclTensor, dim: i64, out: *mut aclTensor);
    /// `aclnnLayerNorm` (`norm/layer_norm_v4/op_host/op_api/aclnn_layer_norm.h`): normalizes
    /// over the trailing axes whose sizes are `normalizedShape` (length `k`): with `mean` and
    /// biased `var` over those axes, `out = (x - mean)·rstd·weight + bias`, `rstd =
    /// 1/√(var + eps)`; `weightOptional`/`biasOptional` have shape `normalizedShape` (null:
    /// 1 and 0). `meanOutOptional`/`rstdOutOptional` (may be null) have the input's shape
    /// with the last `k` axes set to 1.
    op aclnnLayerNorm, aclnnLayerNormGetWorkspaceSize(input: *const aclTensor, normalizedShape: *const aclIntArray, weightOptional: *const aclTensor, biasOptional: *const aclTensor, eps: f64, out: *mut aclTensor, meanOutOptional: *mut aclTensor, rstdOutOptional: *mut aclTensor);
    /// `aclnnLayerNormBackward` (`norm/layer_norm_grad_v3/op_host/op_api/aclnn_layer_norm_backward.h`):
    /// with `xhat = (input - mean)·rstd` (`mean`/`rstd` as [`sig::aclnnLayerNorm`] wrote
    /// them) and `g = gradOut·weight`, over the normalized axes of size `N`:
    /// `gradInputOut = rstd·(g - mean(g) - xhat·mean(g·xhat))`; `gradWeightOut =
    /// Σ_batch gradOut·xhat`; `gradBiasOut = Σ_batch gradOut`. `outputMask` (3 bools) says
    /// which of the three outputs to write (an unwritten one may be null).
    op aclnnLayerNormBackward, aclnnLayerNormBackwardGetWorkspaceSize(gradOut: *const aclTensor, input: *const aclTensor, normalizedShape: *const aclIntArray, mean: *const aclTensor, rstd: *const aclTensor, weightOptional: *const aclTensor, biasOptional: *const aclTensor, outputMask: *const aclBoolArray, gradInputOut: *mut aclTensor, gradWeightOut: *mut aclTensor, gradBiasOut: *mut aclTensor);
    /// `aclnnBatchNorm` (`norm/batch_norm_v3/op_host/op_api/aclnn_batch_norm.h`): input
    /// `[N, C, ...]` (NCHW), per channel `c`. `training`: batch `mean`, biased `var` over all
    /// axes but 1; `output = (x - mean)/√(var + eps)·weight + bias`; `saveMean = mean`,
    /// `saveInvstd = 1/√(var + eps)` (`[C]`); `runningMean = (1-momentum)·runningMean +
    /// momentum·mean`, `runningVar = (1-momentum)·runningVar + momentum·var·M/(M-1)`
    /// (unbiased, `M` = elements per channel), updated in place. Not `training`: uses
    /// `runningMean`/`runningVar`, writes neither save tensor.
    op aclnnBatchNorm, aclnnBatchNormGetWorkspaceSize(input: *const aclTensor, weight: *const aclTensor, bias: *const aclTensor, runningMean: *mut aclTensor, runningVar: *mut aclTensor, training: bool, momentum: f64, eps: f64, output: *mut aclTensor, saveMean: *mut aclTensor, saveInvstd: *mut aclTensor);
    /// `aclnnBatchNormBackward` (`norm/batch_norm_grad_v3/op_host/op_api/aclnn_batch_norm_backward.h`):
    /// `training`: with `xhat = (x - saveMean)·saveInvstd` per channel and `M` elements per
    /// channel, `gradWeight = Σ gradOut·xhat`, `gradBias = Σ gradOut`, `gradInput =
    /// weight·saveInvstd/M · (M·gradOut - gradBias - xhat·gradWeight)`. Not `training`: uses
    /// the running statistics, `gradInput = gradOut·weight/√(runningVar + eps)`.
    /// `outputMask` (3 bools) selects the outputs. When `training`, `runningMean` and
    /// `runningVar` are not read and may be null (shardc passes null).
    op aclnnBatchNormBackward, aclnnBatchNormBackwardGetWorkspaceSize(gradOut: *const aclTensor, input: *const aclTensor, weight: *const aclTensor, runningMean: *const aclTensor, runningVar: *const aclTensor, saveMean: *const aclTensor, saveInvstd: *const aclTensor, training: bool, eps: f64, outputMask: *const aclBoolArray, gradInput: *mut aclTensor, gradWeight: *mut aclTensor, gradBias: *mut aclTensor);
    /// `aclnnConvolution` (`conv/convolution_forward/op_host/op_api/aclnn_convolution.h`):
    /// 2-d cross-correlation, NCHW input `[N, Cin, H, W]`, weight `[Cout, Cin/groups, kh,
    /// kw]`, `stride`/`padding`/`dilation` `[h, w]` (zero padding, symmetric: `padding` on
    /// both sides), `bias` `[Cout]` or null; shardc passes `transposed = false`,
    /// `outputPadding = [0, 0]`. `out[n, co, y, x] = bias[co] + Σ_{ci,i,j} in[n, ci', y·sh -
    /// ph + i·dh, x·sw - pw + j·dw]·w[co, ci, i, j]`.
    op aclnnConvolution, aclnnConvolutionGetWorkspaceSize(input: *const aclTensor, weight: *const aclTensor, bias: *const aclTensor, stride: *const aclIntArray, padding: *const aclIntArray, dilation: *const aclIntArray, transposed: bool, outputPadding: *const aclIntArray, groups: i64, output: *mut aclTensor, cubeMathType: i8);
    /// `aclnnConvolutionBackward` (`conv/convolution_backward/op_api/aclnn_convolution_backward.h`):
    /// the gradients of [`sig::aclnnConvolution`] with respect to `input` (`gradInput`, the
    /// input's shape), `weight` (`gradWeight`) and the bias (`gradBias` `[Cout]`, `biasSizes`
    /// may be null), each written only where `outputMask` (3 bools) is true (the others may be
    /// null).
    op aclnnConvolutionBackward, aclnnConvolutionBackwardGetWorkspaceSize(gradOutput: *const aclTensor, input: *const aclTensor, weight: *const aclTensor, biasSizes: *const aclIntArray, stride: *const aclIntArray, padding: *const aclIntArray, dilation: *const aclIntArray, transposed: bool, outputPadding: *const aclIntArray, groups: c_int, outputMask: *const aclBoolArray, cubeMathType: i8, gradInput: *mut aclTensor, gradWeight: *mut aclTensor, gradBias: *mut aclTensor);
    /// `aclnnAvgPool2d` (`pooling/avg_pool3_d/op_api/aclnn_avgpool2d.h`): NCHW average
    /// pooling, `kernelSize`/`strides`/`paddings` `[h, w]` (symmetric zero padding),
    /// `ceilMode` rounds the output size up; each window's sum is divided by the window size
    /// counting padding when `countIncludePad`, else by the number of in-bounds elements;
    /// `divisorOverride` (0: none) replaces the divisor.
    op aclnnAvgPool2d, aclnnAvgPool2dGetWorkspaceSize(self_: *const aclTensor, kernelSize: *const aclIntArray, strides: *const aclIntArray, paddings: *const aclIntArray, ceilMode: bool, countIncludePad: bool, divisorOverride: i64, cubeMathType: i8, out: *mut aclTensor);
    /// `aclnnAvgPool2dBackward` (`pooling/avg_pool3_d_grad/op_api/aclnn_avgpool2d_backward.h`):
    /// each window's `gradOutput / divisor` is added to every in-bounds element of the window
    /// in `gradInput` (shape of `self`); parameters as [`sig::aclnnAvgPool2d`].
    op aclnnAvgPool2dBackward, aclnnAvgPool2dBackwardGetWorkspaceSize(gradOutput: *const aclTensor, self_: *const aclTensor, kernelSize: *const aclIntArray, stride: *const aclIntArray, padding: *const aclIntArray, ceilMode: bool, countIncludePad: bool, divisorOverride: i64, cubeMathType: i8, gradInput: *mut aclTensor);
    /// `aclnnMaxPool2dWithIndices` (`pooling/max_pool3d_with_argmax_v2/op_api/aclnn_max_pool2d_with_indices.h`):
    /// NCHW max pooling (padding counts as -inf); `indices` (int32, shape of `out`) holds the
    /// flat `h·W + w` position of each window's maximum in its input plane, the first one in
    /// row-major window order on ties.
    op aclnnMaxPool2dWithIndices, aclnnMaxPool2dWithIndicesGetWorkspaceSize(self_: *const aclTensor, kernelSize: *const aclIntArray, stride: *const aclIntArray, padding: *const aclIntArray, dilation: *const aclIntArray, ceilMode: bool, out: *mut aclTensor, indices: *mut aclTensor);
    /// `aclnnMaxPool2dWithIndicesBackward` (`pooling/max_pool3d_grad_with_argmax/op_api/aclnn_max_pool2d_with_indices_backward.h`):
    /// `gradInput` (shape of `self`, zeroed first) gets `gradOutput` added at each window's
    /// `indices` position.
    op aclnnMaxPool2dWithIndicesBackward, aclnnMaxPool2dWithIndicesBackwardGetWorkspaceSize(gradOutput: *const aclTensor, self_: *const aclTensor, indices: *const aclTensor, kernelSize: *const aclIntArray, stride: *const aclIntArray, padding: *const aclIntArray, dilation: *const aclIntArray, ceilMode: bool, gradInput: *mut aclTensor);
    /// `aclnnIndexSelect` (`index/gather_v2/op_api/aclnn_index_select.h`): `index` is a 1-d
    /// (or 0-d) int32/int64 tensor; `out` = `self` with axis `dim` replaced by `index`'s
    /// entries: `out[.., i, ..] = self[.., index[i], ..]`. An index outside `[0,
    /// self.shape[dim])` is an error.
    op aclnnIndexSelect, aclnnIndexSelectGetWorkspaceSize(self_: *const aclTensor, dim: i64, index: *const aclTensor, out: *mut aclTensor);
    /// `aclnnIndexAdd` (`index/inplace_scatter_add/op_host/op_api/aclnn_index_add.h`): `out =
    /// self`, then for each `i`, `out[.., index[i], ..] += alpha·source[.., i, ..]` along
    /// `dim`, `i` increasing (`index` 1-d int32/int64).
    op aclnnIndexAdd, aclnnIndexAddGetWorkspaceSize(self_: *const aclTensor, dim: i64, index: *const aclTensor, source: *const aclTensor, alpha: *const aclScalar, out: *mut aclTensor);
}
}
}

/// The library an exact symbol name is resolved from, if shardc uses it.
pub fn library_of(symbol: &str) -> Option<Library> {
    SYMBOLS
        .iter()
        .find(|(_, name)| *name == symbol)
        .map(|(lib, _)| *lib)
}

/// The split opApi library of an aclnn symbol, if shardc uses it.
pub fn domain_of(symbol: &str) -> Option<OpDomain> {
    ACLNN_DOMAINS
        .iter()
        .find(|(name, _)| *name == symbol)
        .map(|(_, d)| *d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_info_has_the_header_size() {
        assert_eq!(std::mem::size_of::<HcclRootInfo>(), 4108);
    }

    #[test]
    fn send_recv_item_has_the_c_layout() {
        // enum (4) + pad (4) + void* (8) + u64 (8) + enum (4) + u32 (4)
        assert_eq!(std::mem::size_of::<HcclSendRecvItem>(), 32);
    }

    #[test]
    fn symbols_are_unique_and_every_aclnn_symbol_has_a_domain() {
        let mut names: Vec<&str> = SYMBOLS.iter().map(|(_, n)| *n).collect();
        names.sort_unstable();
        let n = names.len();
        names.dedup();
        assert_eq!(n, names.len());
        for (lib, name) in SYMBOLS {
            assert_eq!(*lib == Library::OpApi, domain_of(name).is_some(), "{name}");
            assert_eq!(name.starts_with("aclnn"), *lib == Library::OpApi, "{name}");
        }
    }
}
