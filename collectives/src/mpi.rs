//! Collectives through MPI (feature `mpi`): [`MpiComm`] implements
//! [`shardc_runtime::Communicator`] over the C API of the MPI library the `mpi` crate links
//! (Debian's Open MPI; `scripts/install-mpi.sh` installs it).
//!
//! # How a collective runs
//!
//! 1. **Group communicator.** The first call on a group creates an MPI communicator for it with
//!    `MPI_Comm_create_group` (collective over the group's members only) and caches it; later
//!    calls reuse it. Groups of one member need none.
//! 2. **Header exchange.** Every member sends every other member a small message with the
//!    collective, its parameters, the call's sequence number on the group and the tensor's
//!    type (a frame of the TCP data plane's encoding, `wire.rs`; point-to-point, `MPI_Isend` / `MPI_Improbe` / `MPI_Mrecv`, polled until the
//!    communicator's timeout). Every member therefore sees every member's call and reaches the
//!    same verdict: a disagreement ([`CommError::Mismatch`]) or an unusable argument
//!    ([`CommError::InvalidArgument`]) is reported by every member, with the same messages as
//!    the in-process world; a member that does not arrive is named in a
//!    [`CommError::Timeout`]. A barrier is this exchange alone. Small all-reduces,
//!    all-gathers and broadcasts (at most [`INLINE_BYTES`] of data) carry their data in the
//!    header and need nothing more.
//! 3. **Data.** Larger tensors move with MPI's own collectives on the group communicator
//!    (`MPI_Alltoall(v)`, `MPI_Allgather(v)`, `MPI_Bcast`). Floating-point sums and products
//!    are never left to MPI (whose reduction order is implementation-defined): an all-reduce
//!    is a reduce-scatter by element ranges (`MPI_Alltoallv`), a local reduction of each
//!    range in member order, and an `MPI_Allgatherv`, so results are bit-identical to the
//!    in-process world's. Integer max and min use `MPI_Allreduce` directly (exact in any
//!    order).
//!
//! Send/receive use a duplicate of `MPI_COMM_WORLD` of their own: a message carries its
//! 64-bit tag and tensor type, is sent with `MPI_Isend` (a send never blocks; its buffer is
//! kept until MPI has delivered it) and is received by probing the source; messages under
//! other tags are kept for later receives, so messages per (source, tag) arrive in order.
//!
//! # Threads, waiting, errors
//!
//! MPI is initialized with `MPI_THREAD_SERIALIZED` and every MPI call is made under one mutex,
//! released between the polls of a wait, so the communicator is `Send + Sync` and a thread
//! waiting in `recv` does not stop another thread's `send`. Waits poll for about 50 µs, then
//! yield the CPU, then sleep with a growing back-off (at most 1 ms): never a pure spin-wait.
//!
//! Every communicator this module creates has `MPI_ERRORS_RETURN`, so MPI failures become
//! [`CommError::Transport`] naming the MPI function and MPI's message; nothing here panics.
//! Limits that MPI itself imposes, documented rather than hidden:
//! - `MPI_Init_thread` aborts the process when it fails (MPI's default before any communicator
//!   exists); outside `mpirun`, Open MPI starts a singleton world of one rank.
//! - `MPI_Comm_create_group` and the data phase's blocking collectives have no timeout: the
//!   first call on a group waits until every member reaches it, and a member that dies between
//!   a call's header exchange and its data phase leaves the others waiting (under `mpirun` the
//!   job is then aborted by `mpirun`).
//! - After a timeout the group's MPI communicator has outstanding messages and cannot be used
//!   again: later calls on that group fail with [`CommError::Transport`].
//! - One call moves at most `i32::MAX` elements per member and part (MPI's `int` counts).
//! - MPI is initialized once per process and finalized when the [`MpiComm`] is dropped; drop
//!   it before the process exits (a process that exits without `MPI_Finalize` makes `mpirun`
//!   report a failure).

use crate::wire::{self, group_hash, Header, Kind};
use half::{bf16, f16};
use mpi::ffi;
use shardc_ir::{DType, ReduceOp, TensorType};
use shardc_runtime::comm::arguments::{self, check_peer};
use shardc_runtime::comm::tensor_ops::{
    around, concat_axis, concat_packed, member_range, reduce_data, reduce_slice, split_packed,
    ReduceElem,
};
use shardc_runtime::comm::{check_group, Collective, CommError, Communicator, DEFAULT_TIMEOUT};
use shardc_runtime::tensor::{Data, Tensor};
use std::collections::{HashMap, VecDeque};
use std::os::raw::{c_char, c_int, c_void};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Tensors of at most this many bytes travel inside the header message of an all-reduce,
/// all-gather or broadcast (one round of point-to-point messages, no MPI collective).
pub const INLINE_BYTES: usize = 16 * 1024;

/// The MPI tag of header messages on a group communicator.
const HEADER_TAG: c_int = 1;
/// The MPI tag of send/receive messages on the point-to-point communicator (the 64-bit tag
/// travels in the message).
const P2P_TAG: c_int = 2;

/// The level of thread support this module asks MPI for.
const THREAD_LEVEL_NAME: &str = "MPI_THREAD_SERIALIZED";

/// An MPI handle (a pointer in Open MPI) that is only ever used under [`MpiComm`]'s mutex.
#[derive(Clone, Copy)]
struct Handle<T>(T);
// SAFETY: MPI is initialized with MPI_THREAD_SERIALIZED and every use of a handle happens
// while holding `MpiComm::state`'s mutex, so no two threads use MPI at once.
unsafe impl<T> Send for Handle<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for Handle<T> {}

type Comm = Handle<ffi::MPI_Comm>;

/// A send still in flight and the buffer MPI reads from.
struct PendingSend {
    request: ffi::MPI_Request,
    /// Kept alive until the request completes.
    _buffer: Vec<u8>,
}

/// The cached communicator of one group.
struct GroupComm {
    comm: Comm,
    /// The sequence number of this rank's next call on the group.
    seq: u64,
    /// Why the communicator cannot be used any more.
    broken: Option<String>,
}

/// Everything behind the mutex.
struct State {
    /// Duplicate of `MPI_COMM_WORLD` for send/receive.
    p2p: Comm,
    /// Duplicate of `MPI_COMM_WORLD` that group communicators are created from.
    parent: Comm,
    groups: HashMap<Vec<usize>, GroupComm>,
    pending: Vec<PendingSend>,
    /// Received messages no receive has asked for yet: (source, tag) -> tensors in order.
    mailbox: HashMap<(usize, i64), VecDeque<Tensor>>,
    /// Buffers of messages abandoned at a timeout (MPI may still read them).
    leaked: Vec<Vec<u8>>,
    /// Reused working memory of the data phase (8-byte aligned).
    scratch: Vec<u64>,
}

// SAFETY: see `Handle`; the request handles in `pending` are only used under the mutex.
unsafe impl Send for State {}

/// A [`Communicator`] whose world is MPI's `MPI_COMM_WORLD` (see the module doc).
pub struct MpiComm {
    rank: usize,
    size: usize,
    timeout: Duration,
    state: Mutex<State>,
}

impl std::fmt::Debug for MpiComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiComm")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// The message of an MPI error code.
fn error_string(code: c_int) -> String {
    let mut buf = vec![0 as c_char; ffi::MPI_MAX_ERROR_STRING as usize + 1];
    let mut len: c_int = 0;
    // SAFETY: the buffer holds MPI_MAX_ERROR_STRING characters as the standard requires.
    let rc = unsafe { ffi::MPI_Error_string(code, buf.as_mut_ptr(), &mut len) };
    if rc != ffi::MPI_SUCCESS as c_int {
        return format!("MPI error code {code}");
    }
    let bytes: Vec<u8> = buf[..len.clamp(0, buf.len() as c_int) as usize]
        .iter()
        .map(|&c| c as u8)
        .collect();
    format!("{} (code {code})", String::from_utf8_lossy(&bytes))
}

/// The [`CommError::Transport`] of an initialization failure.
fn init_error(reason: String) -> CommError {
    CommError::Transport {
        collective: Collective::Barrier,
        group: Vec::new(),
        rank: 0,
        reason: format!("MPI initialization: {reason}"),
    }
}

/// A wait that polls, then yields, then sleeps with a growing back-off.
struct Backoff {
    start: Instant,
    sleep: Duration,
}

impl Backoff {
    fn new() -> Backoff {
        Backoff {
            start: Instant::now(),
            sleep: Duration::from_micros(20),
        }
    }

    fn wait(&mut self) {
        let waited = self.start.elapsed();
        if waited < Duration::from_micros(50) {
            for _ in 0..64 {
                std::hint::spin_loop();
            }
        } else if waited < Duration::from_millis(2) {
            std::thread::yield_now();
        } else {
            std::thread::sleep(self.sleep);
            self.sleep = (self.sleep * 2).min(Duration::from_millis(1));
        }
    }
}

/// Element types MPI moves. Every bit pattern of `Self` is a valid value, and `Self` has no
/// padding, so a buffer of them may be viewed and filled as bytes.
///
/// # Safety
/// Implementors must be plain old data: no padding, every bit pattern valid.
unsafe trait Elem: Copy + Default + 'static {
    /// The MPI datatype of one element.
    fn datatype() -> ffi::MPI_Datatype;
}

macro_rules! elem {
    ($t:ty, $dt:ident) => {
        // SAFETY: a primitive number type: no padding, every bit pattern valid.
        unsafe impl Elem for $t {
            fn datatype() -> ffi::MPI_Datatype {
                // SAFETY: a constant initialized by the MPI library.
                unsafe { ffi::$dt }
            }
        }
    };
}
elem!(f32, RSMPI_FLOAT);
elem!(f64, RSMPI_DOUBLE);
elem!(i32, RSMPI_INT32_T);
elem!(i64, RSMPI_INT64_T);
elem!(u8, RSMPI_UINT8_T);
elem!(f16, RSMPI_UINT16_T);
elem!(bf16, RSMPI_UINT16_T);

/// A tensor's elements as the buffer MPI moves (Bool as bytes 0/1).
enum Buf {
    F32(Vec<f32>),
    F64(Vec<f64>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    I32(Vec<i32>),
    I64(Vec<i64>),
    U8(Vec<u8>),
}

/// Applies `$body` to the vector inside a [`Buf`] and wraps the result in the same variant.
macro_rules! map_buf {
    ($buf:expr, $v:ident => $body:expr) => {
        match $buf {
            Buf::F32($v) => Buf::F32($body),
            Buf::F64($v) => Buf::F64($body),
            Buf::F16($v) => Buf::F16($body),
            Buf::BF16($v) => Buf::BF16($body),
            Buf::I32($v) => Buf::I32($body),
            Buf::I64($v) => Buf::I64($body),
            Buf::U8($v) => Buf::U8($body),
        }
    };
}

impl Buf {
    fn into_data(self) -> Data {
        match self {
            Buf::F32(v) => Data::F32(v),
            Buf::F64(v) => Data::F64(v),
            Buf::F16(v) => Data::F16(v),
            Buf::BF16(v) => Data::BF16(v),
            Buf::I32(v) => Data::I32(v),
            Buf::I64(v) => Data::I64(v),
            Buf::U8(v) => Data::Bool(v.iter().map(|&b| b != 0).collect()),
        }
    }
}

/// A tensor's elements as MPI moves them, borrowed (Bool as its bytes 0/1).
enum View<'a> {
    F32(&'a [f32]),
    F64(&'a [f64]),
    F16(&'a [f16]),
    BF16(&'a [bf16]),
    I32(&'a [i32]),
    I64(&'a [i64]),
    U8(&'a [u8]),
}

impl View<'_> {
    fn of(data: &Data) -> View<'_> {
        match data {
            Data::F32(v) => View::F32(v),
            Data::F64(v) => View::F64(v),
            Data::F16(v) => View::F16(v),
            Data::BF16(v) => View::BF16(v),
            Data::I32(v) => View::I32(v),
            Data::I64(v) => View::I64(v),
            Data::Bool(_) => View::U8(wire::native_bytes(data)),
        }
    }
}

/// Applies `$body` (a `Result<Vec<T>, _>` computed from the slice `$v`) to a [`View`] and
/// wraps the vector in the [`Buf`] variant of the same type.
macro_rules! map_view {
    ($view:expr, $v:ident => $body:expr) => {
        match $view {
            View::F32($v) => Buf::F32($body),
            View::F64($v) => Buf::F64($body),
            View::F16($v) => Buf::F16($body),
            View::BF16($v) => Buf::BF16($body),
            View::I32($v) => Buf::I32($body),
            View::I64($v) => Buf::I64($body),
            View::U8($v) => Buf::U8($body),
        }
    };
}

/// Reduces the `parts` equal blocks of `packed` with `op` in block order into the first block;
/// returns the block length.
fn reduce_in_place<T: ReduceElem>(packed: &mut [T], parts: usize, op: ReduceOp) -> usize {
    let len = packed.len().checked_div(parts).unwrap_or(0);
    let (acc, rest) = packed.split_at_mut(len);
    for k in 0..parts.saturating_sub(1) {
        reduce_slice(acc, &rest[k * len..(k + 1) * len], op);
    }
    len
}

/// One member's call, as its header message announced it.
struct Announced {
    header: Header,
    /// Its data, when the data travelled inside the header (else empty).
    data: Data,
}

/// Encodes a send/receive message: a frame with the tag, the type and the elements.
fn encode_p2p(tag: i64, tensor: &Tensor) -> Vec<u8> {
    let h = Header::p2p(tag, tensor.dtype(), &tensor.shape, tensor.len());
    wire::encode_frame(&h, &tensor.data, 0..tensor.len())
}

/// Decodes a send/receive message into its tag and tensor.
fn decode_p2p(m: &[u8]) -> Result<(i64, Tensor), String> {
    let (h, data) = wire::decode_frame(m)?;
    if h.kind != Kind::PointToPoint {
        return Err(format!("a {:?} frame where a message was expected", h.kind));
    }
    let count = h.shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
    if count != Some(data.len()) {
        return Err(format!("{} elements for {}", data.len(), h.ty()));
    }
    Ok((
        h.key as i64,
        Tensor {
            shape: h.shape,
            data,
        },
    ))
}

/// An MPI `int` count, or an error naming the collective.
fn count(n: usize) -> Result<c_int, String> {
    c_int::try_from(n).map_err(|_| {
        format!(
            "{n} elements exceed what one MPI call moves ({} at most)",
            c_int::MAX
        )
    })
}

/// One call's context: what every error of it names.
struct Ctx<'a> {
    c: Collective,
    group: &'a [usize],
    rank: usize,
}

impl Ctx<'_> {
    fn transport(&self, reason: String) -> CommError {
        CommError::Transport {
            collective: self.c,
            group: self.group.to_vec(),
            rank: self.rank,
            reason,
        }
    }
    fn invalid(&self, reason: String) -> CommError {
        arguments::invalid(self.c, self.group, self.rank, reason)
    }
    fn mismatch(&self, reason: String) -> CommError {
        CommError::Mismatch {
            collective: self.c,
            group: self.group.to_vec(),
            rank: self.rank,
            reason,
        }
    }
    /// Turns an MPI return code into a result.
    fn check(&self, what: &str, rc: c_int) -> Result<(), CommError> {
        if rc == ffi::MPI_SUCCESS as c_int {
            Ok(())
        } else {
            Err(self.transport(format!("{what} failed: {}", error_string(rc))))
        }
    }
    /// The runtime's argument check's verdict (see [`arguments`]).
    fn invalid_if(&self, reason: Option<String>) -> Result<(), CommError> {
        arguments::invalid_if(self.c, self.group, self.rank, reason)
    }
}

/// A call whose header exchange succeeded.
struct Started {
    /// The group's communicator (`None` for a group of one).
    comm: Option<Comm>,
    /// This rank's member index.
    me: usize,
    /// Every member's header, in member order.
    headers: Vec<Announced>,
}

impl MpiComm {
    /// Initializes MPI (`MPI_Init_thread` with `MPI_THREAD_SERIALIZED`) and returns the
    /// communicator of `MPI_COMM_WORLD`, whose rank and size are MPI's. Waits at most
    /// [`DEFAULT_TIMEOUT`] for the other members of a call. Fails when MPI was already
    /// initialized (or finalized) in this process, or provides less thread support.
    pub fn init() -> Result<MpiComm, CommError> {
        MpiComm::init_with_timeout(DEFAULT_TIMEOUT)
    }

    /// As [`MpiComm::init`], waiting at most `timeout` for the other members of a call (or for
    /// a message).
    pub fn init_with_timeout(timeout: Duration) -> Result<MpiComm, CommError> {
        let mut flag: c_int = 0;
        // SAFETY: MPI_Initialized and MPI_Finalized may be called at any time.
        unsafe { ffi::MPI_Finalized(&mut flag) };
        if flag != 0 {
            return Err(init_error(
                "MPI was already finalized in this process and cannot be initialized again".into(),
            ));
        }
        // SAFETY: as above.
        unsafe { ffi::MPI_Initialized(&mut flag) };
        if flag != 0 {
            return Err(init_error(
                "MPI was already initialized in this process (one MpiComm per process)".into(),
            ));
        }
        let mut provided: c_int = 0;
        // SAFETY: MPI is not initialized; null argc/argv are allowed.
        let rc = unsafe {
            ffi::MPI_Init_thread(
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                ffi::RSMPI_THREAD_SERIALIZED,
                &mut provided,
            )
        };
        if rc != ffi::MPI_SUCCESS as c_int {
            return Err(init_error(format!(
                "MPI_Init_thread failed: {}",
                error_string(rc)
            )));
        }
        // Thread levels are ordered: SINGLE < FUNNELED < SERIALIZED < MULTIPLE.
        // SAFETY: constants initialized by the MPI library.
        if provided < unsafe { ffi::RSMPI_THREAD_SERIALIZED } {
            // SAFETY: MPI is initialized; nothing else uses it.
            unsafe { ffi::MPI_Finalize() };
            return Err(init_error(format!(
                "the MPI library provides thread level {provided}, below {THREAD_LEVEL_NAME}"
            )));
        }
        match MpiComm::setup(timeout) {
            Ok(comm) => Ok(comm),
            Err(e) => {
                // SAFETY: MPI is initialized; no communicator of ours survives.
                unsafe { ffi::MPI_Finalize() };
                Err(e)
            }
        }
    }

    /// Reads rank and size and duplicates the world (MPI is initialized).
    fn setup(timeout: Duration) -> Result<MpiComm, CommError> {
        let fail =
            |what: &str, rc: c_int| init_error(format!("{what} failed: {}", error_string(rc)));
        let ok = ffi::MPI_SUCCESS as c_int;
        // SAFETY: MPI is initialized; the world communicator and errhandler are valid handles.
        unsafe {
            let world = ffi::RSMPI_COMM_WORLD;
            let rc = ffi::MPI_Comm_set_errhandler(world, ffi::RSMPI_ERRORS_RETURN);
            if rc != ok {
                return Err(fail("MPI_Comm_set_errhandler", rc));
            }
            let (mut rank, mut size): (c_int, c_int) = (0, 0);
            let rc = ffi::MPI_Comm_rank(world, &mut rank);
            if rc != ok {
                return Err(fail("MPI_Comm_rank", rc));
            }
            let rc = ffi::MPI_Comm_size(world, &mut size);
            if rc != ok {
                return Err(fail("MPI_Comm_size", rc));
            }
            let mut p2p = ffi::RSMPI_COMM_NULL;
            let rc = ffi::MPI_Comm_dup(world, &mut p2p);
            if rc != ok {
                return Err(fail("MPI_Comm_dup", rc));
            }
            let mut parent = ffi::RSMPI_COMM_NULL;
            let rc = ffi::MPI_Comm_dup(world, &mut parent);
            if rc != ok {
                return Err(fail("MPI_Comm_dup", rc));
            }
            for c in [p2p, parent] {
                let rc = ffi::MPI_Comm_set_errhandler(c, ffi::RSMPI_ERRORS_RETURN);
                if rc != ok {
                    return Err(fail("MPI_Comm_set_errhandler", rc));
                }
            }
            Ok(MpiComm {
                rank: rank.max(0) as usize,
                size: size.max(0) as usize,
                timeout,
                state: Mutex::new(State {
                    p2p: Handle(p2p),
                    parent: Handle(parent),
                    groups: HashMap::new(),
                    pending: Vec::new(),
                    mailbox: HashMap::new(),
                    leaked: Vec::new(),
                    scratch: Vec::new(),
                }),
            })
        }
    }

    /// The time a member waits for the others.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The MPI library's version string (`MPI_Get_library_version`), e.g. `Open MPI v4.1.4`.
    pub fn library_version() -> String {
        mpi::environment::library_version().unwrap_or_else(|_| "unknown".into())
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // No code panics while holding the lock; a poisoned lock still holds a usable state.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The group's communicator (created on first use) and this call's sequence number.
    fn group_comm(&self, ctx: &Ctx<'_>) -> Result<(Comm, u64), CommError> {
        let mut state = self.lock();
        if let Some(g) = state.groups.get_mut(ctx.group) {
            if let Some(why) = &g.broken {
                return Err(
                    ctx.transport(format!("the group's MPI communicator is unusable: {why}"))
                );
            }
            let seq = g.seq;
            g.seq += 1;
            return Ok((g.comm, seq));
        }
        let ranks: Vec<c_int> = ctx.group.iter().map(|&r| r as c_int).collect();
        // A tag derived from the group, so that concurrent creations of different groups by
        // overlapping processes do not match each other's messages.
        let tag = (group_hash(ctx.group) % 30_000) as c_int + 100;
        let parent = state.parent;
        // SAFETY: MPI is initialized; handles are valid; we hold the mutex.
        let comm = unsafe {
            let mut world_group = ffi::RSMPI_GROUP_NULL;
            ctx.check(
                "MPI_Comm_group",
                ffi::MPI_Comm_group(parent.0, &mut world_group),
            )?;
            let mut group = ffi::RSMPI_GROUP_NULL;
            let rc = ffi::MPI_Group_incl(
                world_group,
                ranks.len() as c_int,
                ranks.as_ptr(),
                &mut group,
            );
            ffi::MPI_Group_free(&mut world_group);
            ctx.check("MPI_Group_incl", rc)?;
            let mut comm = ffi::RSMPI_COMM_NULL;
            let rc = ffi::MPI_Comm_create_group(parent.0, group, tag, &mut comm);
            ffi::MPI_Group_free(&mut group);
            ctx.check("MPI_Comm_create_group", rc)?;
            ctx.check(
                "MPI_Comm_set_errhandler",
                ffi::MPI_Comm_set_errhandler(comm, ffi::RSMPI_ERRORS_RETURN),
            )?;
            Handle(comm)
        };
        state.groups.insert(
            ctx.group.to_vec(),
            GroupComm {
                comm,
                seq: 1,
                broken: None,
            },
        );
        Ok((comm, 0))
    }

    /// Marks a group's communicator unusable.
    fn break_group(&self, group: &[usize], why: String) {
        if let Some(g) = self.lock().groups.get_mut(group) {
            g.broken = Some(why);
        }
    }

    /// Checks the group, exchanges headers with every member and checks that every member
    /// called the same collective with the same parameters on a tensor of the same type.
    /// `inline` data (all of it) is sent inside this rank's header.
    fn start(
        &self,
        ctx: &Ctx<'_>,
        params: &str,
        ty: &TensorType,
        inline: Option<&Data>,
    ) -> Result<Started, CommError> {
        check_group(ctx.c, ctx.group, self.rank, self.size)?;
        let me = ctx.group.iter().position(|&r| r == self.rank).unwrap_or(0);
        let n = ctx.group.len();
        let elems = inline.map_or(0, Data::len);
        let header = |seq| Header {
            kind: Kind::Collective,
            key: group_hash(ctx.group),
            seq,
            step: 0,
            collective: ctx.c,
            params: params.to_string(),
            dtype: ty.dtype,
            shape: ty.shape.clone(),
            elems: elems as u64,
        };
        if n == 1 {
            // Alone in the group: nobody reads the header or its data.
            let own = Announced {
                header: header(0),
                data: Data::zeros(ty.dtype, 0),
            };
            return Ok(Started {
                comm: None,
                me,
                headers: vec![own],
            });
        }
        let (comm, seq) = self.group_comm(ctx)?;
        let empty = Data::zeros(ty.dtype, 0);
        let message = wire::encode_frame(&header(seq), inline.unwrap_or(&empty), 0..elems);
        let received = self.exchange(ctx, comm, me, message)?;
        let mut headers = Vec::with_capacity(n);
        for (k, m) in received.into_iter().enumerate() {
            let (header, data) = wire::decode_frame(&m).map_err(|e| {
                ctx.transport(format!(
                    "rank {} sent an unreadable header: {e}",
                    ctx.group[k]
                ))
            })?;
            headers.push(Announced { header, data });
        }
        let first = &headers[0].header;
        for (k, h) in headers.iter().map(|a| &a.header).enumerate().skip(1) {
            if h.seq != first.seq {
                return Err(ctx.mismatch(format!(
                    "rank {} is at call #{} on this group but rank {} is at call #{}",
                    ctx.group[k], h.seq, ctx.group[0], first.seq
                )));
            }
            if h.collective != first.collective || h.params != first.params {
                return Err(ctx.mismatch(format!(
                    "call #{} on this group: rank {} called {} but rank {} called {}",
                    seq,
                    ctx.group[k],
                    h.call(),
                    ctx.group[0],
                    first.call()
                )));
            }
        }
        for (k, h) in headers.iter().map(|a| &a.header).enumerate().skip(1) {
            if h.shape != first.shape || h.dtype != first.dtype {
                return Err(ctx.mismatch(format!(
                    "rank {} passed {} but rank {} passed {}",
                    ctx.group[k],
                    h.ty(),
                    ctx.group[0],
                    first.ty()
                )));
            }
        }
        Ok(Started {
            comm: Some(comm),
            me,
            headers,
        })
    }

    /// Sends `message` to every other member and receives theirs; element `k` of the result is
    /// member `k`'s message (this rank's own at `me`).
    fn exchange(
        &self,
        ctx: &Ctx<'_>,
        comm: Comm,
        me: usize,
        message: Vec<u8>,
    ) -> Result<Vec<Vec<u8>>, CommError> {
        let n = ctx.group.len();
        let len = count(message.len()).map_err(|e| ctx.invalid(e))?;
        let mut requests: Vec<ffi::MPI_Request> = Vec::with_capacity(n - 1);
        {
            let _state = self.lock();
            for j in (0..n).filter(|&j| j != me) {
                // SAFETY: REQUEST_NULL is a constant of the library.
                let mut req = unsafe { ffi::RSMPI_REQUEST_NULL };
                // SAFETY: `message` outlives the request (it is kept until the requests
                // complete, or leaked on timeout); we hold the mutex.
                let rc = unsafe {
                    ffi::MPI_Isend(
                        message.as_ptr().cast::<c_void>(),
                        len,
                        ffi::RSMPI_UINT8_T,
                        j as c_int,
                        HEADER_TAG,
                        comm.0,
                        &mut req,
                    )
                };
                if rc != ffi::MPI_SUCCESS as c_int {
                    drop(_state);
                    self.abandon(ctx.group, message, "a header send failed".into());
                    return Err(ctx.transport(format!(
                        "MPI_Isend to rank {} failed: {}",
                        ctx.group[j],
                        error_string(rc)
                    )));
                }
                requests.push(req);
            }
        }
        let mut received: Vec<Option<Vec<u8>>> = (0..n).map(|_| None).collect();
        let mut missing = n - 1;
        let deadline = Instant::now() + self.timeout;
        let mut backoff = Backoff::new();
        loop {
            let sends_done;
            {
                let _state = self.lock();
                for (j, slot) in received.iter_mut().enumerate() {
                    if j == me || slot.is_some() {
                        continue;
                    }
                    match probe_receive(comm, j as c_int, HEADER_TAG) {
                        Ok(Some(m)) => {
                            *slot = Some(m);
                            missing -= 1;
                        }
                        Ok(None) => {}
                        Err(e) => {
                            drop(_state);
                            self.abandon(ctx.group, message, e.clone());
                            return Err(ctx.transport(format!(
                                "receiving the header of rank {}: {e}",
                                ctx.group[j]
                            )));
                        }
                    }
                }
                let mut flag: c_int = 0;
                // SAFETY: the requests are valid (or null once completed).
                let rc = unsafe {
                    ffi::MPI_Testall(
                        requests.len() as c_int,
                        requests.as_mut_ptr(),
                        &mut flag,
                        ffi::RSMPI_STATUSES_IGNORE,
                    )
                };
                if rc != ffi::MPI_SUCCESS as c_int {
                    drop(_state);
                    self.abandon(ctx.group, message, "a header send failed".into());
                    return Err(ctx.transport(format!(
                        "MPI_Testall on the header sends failed: {}",
                        error_string(rc)
                    )));
                }
                sends_done = flag != 0;
            }
            if missing == 0 && sends_done {
                break;
            }
            if Instant::now() >= deadline {
                let mut absent: Vec<usize> = received
                    .iter()
                    .enumerate()
                    .filter(|&(j, m)| j != me && m.is_none())
                    .map(|(j, _)| ctx.group[j])
                    .collect();
                if absent.is_empty() {
                    // Every header arrived but a member has not taken ours.
                    absent = ctx
                        .group
                        .iter()
                        .copied()
                        .filter(|&r| r != self.rank)
                        .collect();
                }
                self.abandon(
                    ctx.group,
                    message,
                    format!("a {} on this group timed out", ctx.c),
                );
                return Err(CommError::Timeout {
                    collective: ctx.c,
                    group: ctx.group.to_vec(),
                    rank: self.rank,
                    missing: absent,
                    timeout: self.timeout,
                });
            }
            backoff.wait();
        }
        received[me] = Some(message);
        Ok(received
            .into_iter()
            .map(Option::unwrap_or_default)
            .collect())
    }

    /// Keeps a buffer MPI may still read, and marks the group unusable.
    fn abandon(&self, group: &[usize], buffer: Vec<u8>, why: String) {
        self.lock().leaked.push(buffer);
        self.break_group(group, why);
    }

    /// Completes the sends that MPI has delivered (call under the lock).
    fn reap(state: &mut State) {
        state.pending.retain_mut(|p| {
            let mut flag: c_int = 0;
            // SAFETY: a valid request; the status is ignored.
            let rc = unsafe { ffi::MPI_Test(&mut p.request, &mut flag, ffi::RSMPI_STATUS_IGNORE) };
            rc == ffi::MPI_SUCCESS as c_int && flag == 0
        });
    }

    /// The data phase of an all-reduce: `data` becomes the reduction (types are checked).
    fn all_reduce_data(
        &self,
        ctx: &Ctx<'_>,
        s: Started,
        op: ReduceOp,
        data: &mut Data,
    ) -> Result<(), CommError> {
        let Some(comm) = s.comm else {
            return Ok(());
        };
        if s.headers.iter().all(|h| h.data.len() == data.len()) {
            // Every member's data came with its header: reduce in member order.
            let mut members = s.headers.into_iter().map(|h| h.data);
            if let Some(mut acc) = members.next() {
                for x in members {
                    reduce_data(&mut acc, &x, op);
                }
                *data = acc;
            }
            return Ok(());
        }
        let mut state = self.lock();
        let scratch = &mut state.scratch;
        match (data, op) {
            (Data::I32(v), ReduceOp::Max | ReduceOp::Min) => {
                mpi_allreduce_int(ctx, comm, v, op, scratch)
            }
            (Data::I64(v), ReduceOp::Max | ReduceOp::Min) => {
                mpi_allreduce_int(ctx, comm, v, op, scratch)
            }
            (Data::F32(v), _) => reduce_by_ranges(ctx, comm, s.me, v, op, scratch),
            (Data::F64(v), _) => reduce_by_ranges(ctx, comm, s.me, v, op, scratch),
            (Data::I32(v), _) => reduce_by_ranges(ctx, comm, s.me, v, op, scratch),
            (Data::I64(v), _) => reduce_by_ranges(ctx, comm, s.me, v, op, scratch),
            (d, _) => Err(ctx.invalid(format!("internal: reducing {} elements", d.dtype()))),
        }
    }
}

/// A scratch buffer of `n` elements of `T` in `words` (grown as needed; its contents are
/// whatever an earlier call left).
fn scratch<T: Elem>(words: &mut Vec<u64>, n: usize) -> &mut [T] {
    let need = (n * std::mem::size_of::<T>()).div_ceil(8);
    if words.len() < need {
        words.resize(need, 0);
    }
    // SAFETY: the buffer holds at least `n * size_of::<T>()` bytes, is aligned to 8 (enough for
    // every `Elem`), and every bit pattern is a valid `T`.
    unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<T>(), n) }
}

/// Whether a tensor of `ty` travels inside the header (at most [`INLINE_BYTES`]).
fn travels_inline(ty: &TensorType) -> bool {
    ty.num_elements() * ty.dtype.size_bytes() <= INLINE_BYTES
}

/// Checks that every member's inline data has the size of `ty` (when `inline` data is
/// expected at all, i.e. when `ty` is at most [`INLINE_BYTES`]).
fn check_payloads(
    ctx: &Ctx<'_>,
    s: &Started,
    ty: &TensorType,
    expected: bool,
) -> Result<(), CommError> {
    if !expected || !travels_inline(ty) {
        return Ok(());
    }
    for (k, h) in s.headers.iter().enumerate() {
        if h.data.len() != ty.num_elements() {
            return Err(ctx.transport(format!(
                "rank {} sent {} bytes of data for {ty}",
                ctx.group[k],
                h.data.len() * ty.dtype.size_bytes()
            )));
        }
    }
    Ok(())
}

/// Receives the next message from `src` under `tag` on `comm`, if one has arrived (call under
/// the lock).
fn probe_receive(comm: Comm, src: c_int, tag: c_int) -> Result<Option<Vec<u8>>, String> {
    let ok = ffi::MPI_SUCCESS as c_int;
    // SAFETY: valid handles; we hold the mutex; the status is plain data.
    unsafe {
        let mut flag: c_int = 0;
        let mut msg = ffi::RSMPI_MESSAGE_NULL;
        let mut status: ffi::MPI_Status = std::mem::zeroed();
        let rc = ffi::MPI_Improbe(src, tag, comm.0, &mut flag, &mut msg, &mut status);
        if rc != ok {
            return Err(format!("MPI_Improbe failed: {}", error_string(rc)));
        }
        if flag == 0 {
            return Ok(None);
        }
        let mut len: c_int = 0;
        let rc = ffi::MPI_Get_count(&status, ffi::RSMPI_UINT8_T, &mut len);
        if rc != ok {
            return Err(format!("MPI_Get_count failed: {}", error_string(rc)));
        }
        let mut buf = vec![0u8; len.max(0) as usize];
        let rc = ffi::MPI_Mrecv(
            buf.as_mut_ptr().cast::<c_void>(),
            len.max(0),
            ffi::RSMPI_UINT8_T,
            &mut msg,
            ffi::RSMPI_STATUS_IGNORE,
        );
        if rc != ok {
            return Err(format!("MPI_Mrecv failed: {}", error_string(rc)));
        }
        Ok(Some(buf))
    }
}

/// Reduces `n` equal blocks of `buf` in block order.
fn reduce_buf(ctx: &Ctx<'_>, buf: Buf, n: usize, op: ReduceOp) -> Result<Buf, CommError> {
    fn go<T: ReduceElem>(mut v: Vec<T>, n: usize, op: ReduceOp) -> Vec<T> {
        let len = reduce_in_place(&mut v, n, op);
        v.truncate(len);
        v
    }
    match buf {
        Buf::F32(v) => Ok(Buf::F32(go(v, n, op))),
        Buf::F64(v) => Ok(Buf::F64(go(v, n, op))),
        Buf::I32(v) => Ok(Buf::I32(go(v, n, op))),
        Buf::I64(v) => Ok(Buf::I64(go(v, n, op))),
        _ => Err(ctx.invalid("internal: reducing an element type without reductions".into())),
    }
}

/// `MPI_Allreduce` with MPI_MAX / MPI_MIN on integers, exact in any order (call under the
/// lock). `v` becomes the result.
fn mpi_allreduce_int<T: Elem>(
    ctx: &Ctx<'_>,
    comm: Comm,
    v: &mut [T],
    op: ReduceOp,
    words: &mut Vec<u64>,
) -> Result<(), CommError> {
    let len = count(v.len()).map_err(|e| ctx.invalid(e))?;
    let send: &mut [T] = scratch(words, v.len());
    send.copy_from_slice(v);
    // SAFETY: both buffers hold `len` elements of T's datatype; we hold the mutex.
    let rc = unsafe {
        let mpi_op = if op == ReduceOp::Max {
            ffi::RSMPI_MAX
        } else {
            ffi::RSMPI_MIN
        };
        ffi::MPI_Allreduce(
            send.as_ptr().cast::<c_void>(),
            v.as_mut_ptr().cast::<c_void>(),
            len,
            T::datatype(),
            mpi_op,
            comm.0,
        )
    };
    ctx.check("MPI_Allreduce", rc)
}

/// All-reduce of `v` in place as reduce-scatter by element ranges (`MPI_Alltoallv`), a local
/// reduction in member order, and `MPI_Allgatherv` (call under the lock).
fn reduce_by_ranges<T: Elem + ReduceElem>(
    ctx: &Ctx<'_>,
    comm: Comm,
    me: usize,
    v: &mut [T],
    op: ReduceOp,
    words: &mut Vec<u64>,
) -> Result<(), CommError> {
    let n = ctx.group.len();
    // Member `k` reduces the elements `member_range(len, n, k)`.
    let mine = member_range(v.len(), n, me).len();
    let as_int = |x: usize| count(x).map_err(|e| ctx.invalid(e));
    let mut counts = Vec::with_capacity(n);
    let mut displs = Vec::with_capacity(n);
    for k in 0..n {
        let r = member_range(v.len(), n, k);
        counts.push(as_int(r.len())?);
        displs.push(as_int(r.start)?);
    }
    let recv_counts = vec![as_int(mine)?; n];
    let recv_displs: Vec<c_int> = (0..n).map(|k| as_int(k * mine)).collect::<Result<_, _>>()?;
    let parts: &mut [T] = scratch(words, mine * n);
    // SAFETY: counts and displacements stay inside the buffers; we hold the mutex.
    let rc = unsafe {
        ffi::MPI_Alltoallv(
            v.as_ptr().cast::<c_void>(),
            counts.as_ptr(),
            displs.as_ptr(),
            T::datatype(),
            parts.as_mut_ptr().cast::<c_void>(),
            recv_counts.as_ptr(),
            recv_displs.as_ptr(),
            T::datatype(),
            comm.0,
        )
    };
    ctx.check("MPI_Alltoallv", rc)?;
    reduce_in_place(parts, n, op);
    // SAFETY: as above; member k contributes `counts[k]` elements at `displs[k]`.
    let rc = unsafe {
        ffi::MPI_Allgatherv(
            parts.as_ptr().cast::<c_void>(),
            as_int(mine)?,
            T::datatype(),
            v.as_mut_ptr().cast::<c_void>(),
            counts.as_ptr(),
            displs.as_ptr(),
            T::datatype(),
            comm.0,
        )
    };
    ctx.check("MPI_Allgatherv", rc)
}

/// `MPI_Allgather` of equal buffers into member order (call under the lock).
fn allgather<T: Elem>(ctx: &Ctx<'_>, comm: Comm, v: &[T]) -> Result<Vec<T>, CommError> {
    let n = ctx.group.len();
    let len = count(v.len()).map_err(|e| ctx.invalid(e))?;
    let mut out = vec![T::default(); v.len() * n];
    // SAFETY: `out` holds n blocks of `len` elements; we hold the mutex.
    let rc = unsafe {
        ffi::MPI_Allgather(
            v.as_ptr().cast::<c_void>(),
            len,
            T::datatype(),
            out.as_mut_ptr().cast::<c_void>(),
            len,
            T::datatype(),
            comm.0,
        )
    };
    ctx.check("MPI_Allgather", rc)?;
    Ok(out)
}

/// `MPI_Alltoall` of `n` equal blocks (call under the lock).
fn alltoall<T: Elem>(ctx: &Ctx<'_>, comm: Comm, v: &[T]) -> Result<Vec<T>, CommError> {
    let n = ctx.group.len();
    let block = count(v.len() / n).map_err(|e| ctx.invalid(e))?;
    let mut out = vec![T::default(); v.len()];
    // SAFETY: both buffers hold n blocks of `block` elements; we hold the mutex.
    let rc = unsafe {
        ffi::MPI_Alltoall(
            v.as_ptr().cast::<c_void>(),
            block,
            T::datatype(),
            out.as_mut_ptr().cast::<c_void>(),
            block,
            T::datatype(),
            comm.0,
        )
    };
    ctx.check("MPI_Alltoall", rc)?;
    Ok(out)
}

/// `MPI_Bcast` from member `root` (call under the lock).
fn bcast<T: Elem>(ctx: &Ctx<'_>, comm: Comm, v: &mut [T], root: usize) -> Result<(), CommError> {
    let len = count(v.len()).map_err(|e| ctx.invalid(e))?;
    // SAFETY: the buffer holds `len` elements; we hold the mutex.
    let rc = unsafe {
        ffi::MPI_Bcast(
            v.as_mut_ptr().cast::<c_void>(),
            len,
            T::datatype(),
            root as c_int,
            comm.0,
        )
    };
    ctx.check("MPI_Bcast", rc)
}

impl Communicator for MpiComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn all_reduce(
        &self,
        group: &[usize],
        op: ReduceOp,
        tensor: &mut Tensor,
    ) -> Result<(), CommError> {
        let ctx = Ctx {
            c: Collective::AllReduce,
            group,
            rank: self.rank,
        };
        let ty = tensor.ty();
        let payload = travels_inline(&ty).then_some(&tensor.data);
        let s = self.start(&ctx, &format!("op={op}"), &ty, payload)?;
        ctx.invalid_if(arguments::all_reduce(&ty))?;
        check_payloads(&ctx, &s, &ty, group.len() > 1)?;
        self.all_reduce_data(&ctx, s, op, &mut tensor.data)
    }

    fn all_gather(
        &self,
        group: &[usize],
        axis: usize,
        input: &Tensor,
    ) -> Result<Tensor, CommError> {
        let ctx = Ctx {
            c: Collective::AllGather,
            group,
            rank: self.rank,
        };
        let ty = input.ty();
        let inline = travels_inline(&ty);
        let s = self.start(
            &ctx,
            &format!("axis={axis}"),
            &ty,
            inline.then_some(&input.data),
        )?;
        ctx.invalid_if(arguments::all_gather(&ty, axis))?;
        let n = group.len();
        let packed = match s.comm {
            None => return Ok(input.clone()),
            Some(_) if inline => {
                // Every member's data came with its header.
                check_payloads(&ctx, &s, &ty, true)?;
                let parts: Vec<Tensor> = s
                    .headers
                    .into_iter()
                    .map(|h| Tensor {
                        shape: ty.shape.clone(),
                        data: h.data,
                    })
                    .collect();
                let refs: Vec<&Tensor> = parts.iter().collect();
                return Ok(concat_axis(&refs, axis));
            }
            Some(comm) => {
                let view = View::of(&input.data);
                let _state = self.lock();
                map_view!(view, v => allgather(&ctx, comm, v)?)
            }
        };
        let out = if axis == 0 {
            packed
        } else {
            map_buf!(packed, v => concat_packed(&v, around(&ty.shape, axis), n))
        };
        let mut shape = ty.shape.clone();
        shape[axis] *= n;
        Ok(Tensor {
            shape,
            data: out.into_data(),
        })
    }

    fn reduce_scatter(
        &self,
        group: &[usize],
        op: ReduceOp,
        axis: usize,
        input: &Tensor,
    ) -> Result<Tensor, CommError> {
        let ctx = Ctx {
            c: Collective::ReduceScatter,
            group,
            rank: self.rank,
        };
        let ty = input.ty();
        let s = self.start(&ctx, &format!("op={op}, axis={axis}"), &ty, None)?;
        let n = group.len();
        ctx.invalid_if(arguments::reduce_scatter(&ty, axis, n))?;
        let mut shape = ty.shape.clone();
        shape[axis] /= n;
        // Part j of every member's input goes to member j, which reduces the parts it
        // receives in member order.
        let view = View::of(&input.data);
        let received = map_view!(view, v => {
            let packed = split_packed(v, around(&ty.shape, axis), n);
            match s.comm {
                None => packed,
                Some(comm) => {
                    let _state = self.lock();
                    alltoall(&ctx, comm, &packed)?
                }
            }
        });
        let reduced = reduce_buf(&ctx, received, n, op)?;
        Ok(Tensor {
            shape,
            data: reduced.into_data(),
        })
    }

    fn all_to_all(
        &self,
        group: &[usize],
        split_dim: usize,
        concat_dim: usize,
        input: &Tensor,
    ) -> Result<Tensor, CommError> {
        let ctx = Ctx {
            c: Collective::AllToAll,
            group,
            rank: self.rank,
        };
        let ty = input.ty();
        let params = format!("split_dim={split_dim}, concat_dim={concat_dim}");
        let s = self.start(&ctx, &params, &ty, None)?;
        let n = group.len();
        ctx.invalid_if(arguments::all_to_all(&ty, split_dim, concat_dim, n))?;
        let mut part_shape = ty.shape.clone();
        part_shape[split_dim] /= n;
        let view = View::of(&input.data);
        let out = map_view!(view, v => {
            let packed = split_packed(v, around(&ty.shape, split_dim), n);
            let received = match s.comm {
                None => packed,
                Some(comm) => {
                    let _state = self.lock();
                    alltoall(&ctx, comm, &packed)?
                }
            };
            concat_packed(&received, around(&part_shape, concat_dim), n)
        });
        let mut shape = part_shape;
        shape[concat_dim] *= n;
        Ok(Tensor {
            shape,
            data: out.into_data(),
        })
    }

    fn broadcast(
        &self,
        group: &[usize],
        root: usize,
        tensor: &mut Tensor,
    ) -> Result<(), CommError> {
        let ctx = Ctx {
            c: Collective::Broadcast,
            group,
            rank: self.rank,
        };
        if let Some(reason) = arguments::root_outside(group, root) {
            check_group(ctx.c, group, self.rank, self.size)?;
            return Err(ctx.invalid(reason));
        }
        let root_index = group.iter().position(|&r| r == root).unwrap_or(0);
        let ty = tensor.ty();
        let inline = travels_inline(&ty);
        let payload = (inline && self.rank == root).then_some(&tensor.data);
        let mut s = self.start(&ctx, &format!("root={root}"), &ty, payload)?;
        let Some(comm) = s.comm else {
            return Ok(());
        };
        if inline {
            if self.rank != root {
                let data = s.headers.swap_remove(root_index).data;
                if data.len() != tensor.len() {
                    return Err(ctx.transport(format!(
                        "rank {root} sent {} bytes of data for {ty}",
                        data.len() * ty.dtype.size_bytes()
                    )));
                }
                tensor.data = data;
            }
            return Ok(());
        }
        let _state = self.lock();
        match &mut tensor.data {
            Data::F32(v) => bcast(&ctx, comm, v, root_index),
            Data::F64(v) => bcast(&ctx, comm, v, root_index),
            Data::F16(v) => bcast(&ctx, comm, v, root_index),
            Data::BF16(v) => bcast(&ctx, comm, v, root_index),
            Data::I32(v) => bcast(&ctx, comm, v, root_index),
            Data::I64(v) => bcast(&ctx, comm, v, root_index),
            Data::Bool(v) => {
                let mut bytes: Vec<u8> = v.iter().map(|&b| b as u8).collect();
                bcast(&ctx, comm, &mut bytes, root_index)?;
                *v = bytes.iter().map(|&b| b != 0).collect();
                Ok(())
            }
        }
    }

    fn send(&self, dest: usize, tag: i64, tensor: &Tensor) -> Result<(), CommError> {
        let group = [self.rank, dest];
        let ctx = Ctx {
            c: Collective::Send,
            group: &group,
            rank: self.rank,
        };
        check_peer(ctx.c, self.rank, self.size, dest)?;
        let message = encode_p2p(tag, tensor);
        let len = count(message.len()).map_err(|e| ctx.invalid(e))?;
        let mut state = self.lock();
        MpiComm::reap(&mut state);
        // SAFETY: REQUEST_NULL is a constant of the library.
        let mut request = unsafe { ffi::RSMPI_REQUEST_NULL };
        // SAFETY: the buffer moves into `pending` (its heap storage does not move) and lives
        // until the request completes; we hold the mutex.
        let rc = unsafe {
            ffi::MPI_Isend(
                message.as_ptr().cast::<c_void>(),
                len,
                ffi::RSMPI_UINT8_T,
                dest as c_int,
                P2P_TAG,
                state.p2p.0,
                &mut request,
            )
        };
        ctx.check(&format!("MPI_Isend to rank {dest}"), rc)?;
        state.pending.push(PendingSend {
            request,
            _buffer: message,
        });
        Ok(())
    }

    fn recv(&self, src: usize, tag: i64, ty: &TensorType) -> Result<Tensor, CommError> {
        let group = [src, self.rank];
        let ctx = Ctx {
            c: Collective::Receive,
            group: &group,
            rank: self.rank,
        };
        check_peer(ctx.c, self.rank, self.size, src)?;
        let deadline = Instant::now() + self.timeout;
        let mut backoff = Backoff::new();
        let t = loop {
            {
                let mut state = self.lock();
                MpiComm::reap(&mut state);
                if let Some(t) = state
                    .mailbox
                    .get_mut(&(src, tag))
                    .and_then(VecDeque::pop_front)
                {
                    break t;
                }
                let p2p = state.p2p;
                let mut found = None;
                while let Some(m) = probe_receive(p2p, src as c_int, P2P_TAG)
                    .map_err(|e| ctx.transport(format!("receiving from rank {src}: {e}")))?
                {
                    let (t_tag, t) = decode_p2p(&m).map_err(|e| {
                        ctx.transport(format!("rank {src} sent an unreadable message: {e}"))
                    })?;
                    if t_tag == tag {
                        found = Some(t);
                        break;
                    }
                    state.mailbox.entry((src, t_tag)).or_default().push_back(t);
                }
                if let Some(t) = found {
                    break t;
                }
            }
            if Instant::now() >= deadline {
                return Err(CommError::Timeout {
                    collective: ctx.c,
                    group: group.to_vec(),
                    rank: self.rank,
                    missing: vec![src],
                    timeout: self.timeout,
                });
            }
            backoff.wait();
        };
        if t.shape != ty.shape || t.dtype() != ty.dtype {
            return Err(ctx.mismatch(format!(
                "rank {src} sent {} under tag {tag} but rank {} expects {ty}",
                t.ty(),
                self.rank
            )));
        }
        Ok(t)
    }

    fn barrier(&self, group: &[usize]) -> Result<(), CommError> {
        let ctx = Ctx {
            c: Collective::Barrier,
            group,
            rank: self.rank,
        };
        let ty = TensorType::new(DType::Float32, vec![0]);
        self.start(&ctx, "", &ty, None)?;
        Ok(())
    }
}

impl Drop for MpiComm {
    /// Waits (at most the timeout) for sends in flight, frees the communicators and finalizes
    /// MPI.
    fn drop(&mut self) {
        let deadline = Instant::now() + self.timeout;
        let mut backoff = Backoff::new();
        loop {
            let mut state = self.lock();
            MpiComm::reap(&mut state);
            if state.pending.is_empty() || Instant::now() >= deadline {
                break;
            }
            drop(state);
            backoff.wait();
        }
        let state = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        // SAFETY: MPI is initialized; every handle is valid; no other thread can hold `self`.
        unsafe {
            for p in &mut state.pending {
                ffi::MPI_Cancel(&mut p.request);
                ffi::MPI_Request_free(&mut p.request);
            }
            for g in state.groups.values_mut() {
                if g.broken.is_none() {
                    ffi::MPI_Comm_free(&mut g.comm.0);
                }
            }
            ffi::MPI_Comm_free(&mut state.p2p.0);
            ffi::MPI_Comm_free(&mut state.parent.0);
            let mut finalized: c_int = 0;
            ffi::MPI_Finalized(&mut finalized);
            if finalized == 0 {
                ffi::MPI_Finalize();
            }
        }
    }
}
