//! Device memory and the happens-before bookkeeping of the emulated card.
//!
//! Each device owns an address range (`device_base`) that is not host-dereferenceable; a bump
//! allocator hands out buffers in it with unmapped gaps between them, and never reuses an
//! address, so a use after free is recognised. A table maps device ranges to host backing
//! storage ([`AllocData`]).
//!
//! Ordering: every stream keeps a vector clock over streams (`Vc`); an operation enqueued on a
//! stream gets the stream's next sequence number and the stream's clock at that moment (joined
//! with the host's clock, since the host enqueued it after all it had synchronised with). Event
//! records capture a clock, stream waits join it, host synchronisations join it into the host's
//! clock. Every access of device memory by queued work leaves a record (region, stream,
//! sequence number, read or write); an access that overlaps a record of another stream which is
//! not ordered before it (its clock has not seen that sequence number), where either is a
//! write, is a race and is refused. Checks happen when work is enqueued, so they do not depend
//! on timing.

use crate::diag::{EmuError, EmuResult};
use crate::{bail, emu_err};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

/// Distance between the address ranges of two devices; device `d` starts at `(d + 1) *
/// DEVICE_STRIDE`, far above the 47-bit user address space, so a host dereference faults.
pub const DEVICE_STRIDE: u64 = 0x1_0000_0000_0000;
/// Unmapped bytes left after every allocation, so an access just past its end is in no buffer.
pub const GAP: u64 = 64 * 1024;
/// Alignment of every device allocation (the card aligns to 32 bytes; more is allowed).
pub const ALIGN: u64 = 512;

/// Number of emulated devices in this process: `SHARDC_ASCEND_EMU_DEVICES`, default 8.
pub fn device_count() -> i32 {
    static N: OnceLock<i32> = OnceLock::new();
    *N.get_or_init(|| {
        std::env::var("SHARDC_ASCEND_EMU_DEVICES")
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
            .filter(|n| (1..=64).contains(n))
            .unwrap_or(8)
    })
}

/// First address of device `device`'s range.
pub fn device_base(device: i32) -> u64 {
    (device as u64 + 1) * DEVICE_STRIDE
}

/// The device whose range contains `addr`, if any (whether or not it is allocated).
pub fn device_of_addr(addr: u64) -> Option<i32> {
    if addr < DEVICE_STRIDE {
        return None;
    }
    let d = (addr / DEVICE_STRIDE) as i64 - 1;
    (d >= 0 && d < device_count() as i64).then_some(d as i32)
}

/// Fails with `InvalidDevice` unless `device` is one of the emulated devices.
pub fn check_device(api: &str, device: i32) -> EmuResult<()> {
    if device < 0 || device >= device_count() {
        bail!(
            InvalidDevice,
            "{api}: device {device} does not exist (the emulator has {} devices, SHARDC_ASCEND_EMU_DEVICES)",
            device_count()
        );
    }
    Ok(())
}

/// Host backing storage of one device allocation.
pub struct AllocData {
    bytes: Mutex<Vec<u8>>,
}

impl AllocData {
    /// Runs `f` on the bytes of the allocation.
    pub fn with<R>(&self, f: impl FnOnce(&mut [u8]) -> R) -> R {
        let mut g = self.bytes.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut g)
    }
}

/// A vector clock: for each stream id, the highest sequence number of that stream known to be
/// ordered before the owner's position.
pub type Vc = Vec<u64>;

/// `a := max(a, b)` element-wise.
pub fn join(a: &mut Vc, b: &[u64]) {
    if a.len() < b.len() {
        a.resize(b.len(), 0);
    }
    for (x, y) in a.iter_mut().zip(b) {
        *x = (*x).max(*y);
    }
}

fn seen(vc: &[u64], stream: u32, seq: u64) -> bool {
    vc.get(stream as usize).is_some_and(|&s| s >= seq)
}

/// One access of queued work to a region of an allocation.
#[derive(Clone, Debug)]
struct Record {
    lo: u64,
    hi: u64,
    stream: u32,
    seq: u64,
    write: bool,
    what: &'static str,
}

struct Alloc {
    device: i32,
    size: u64,
    data: Arc<AllocData>,
    records: Vec<Record>,
}

/// Who performs an access: the host (synchronously) or an operation queued on a stream.
#[derive(Clone, Debug)]
pub enum Accessor {
    /// A synchronous call of the host (aclrtMemcpy, aclrtMemset).
    Host,
    /// Work queued on stream `stream` as its operation number `seq`, with clock `vc`.
    Stream {
        /// The stream's id.
        stream: u32,
        /// The operation's sequence number on that stream.
        seq: u64,
        /// The operation's vector clock.
        vc: Vc,
    },
}

/// A region of device memory an operation reads or writes.
#[derive(Clone, Debug)]
pub struct AccessReq {
    /// First device address.
    pub addr: u64,
    /// Bytes accessed (0: nothing is touched, only the pointer is checked when not null).
    pub len: u64,
    /// Whether the operation writes it.
    pub write: bool,
    /// What the region is, for messages ("self", "out", "dst"...).
    pub role: String,
}

impl AccessReq {
    /// A read of `len` bytes at `addr`.
    pub fn read(addr: u64, len: u64, role: impl Into<String>) -> Self {
        AccessReq {
            addr,
            len,
            write: false,
            role: role.into(),
        }
    }
    /// A write of `len` bytes at `addr`.
    pub fn write(addr: u64, len: u64, role: impl Into<String>) -> Self {
        AccessReq {
            addr,
            len,
            write: true,
            role: role.into(),
        }
    }
}

/// A checked region: the allocation's storage and the byte offset of the region in it.
#[derive(Clone)]
pub struct Resolved {
    /// The allocation's host storage.
    pub data: Arc<AllocData>,
    /// Byte offset of the region's first byte in the allocation.
    pub offset: usize,
    /// Length in bytes.
    pub len: usize,
    /// The device the allocation belongs to.
    pub device: i32,
}

/// The clock state of one stream.
#[derive(Default)]
struct StreamClock {
    vc: Vc,
    seq: u64,
}

/// All device memory and clocks of the process, behind one lock ([`engine`]).
pub struct Engine {
    next: Vec<u64>,
    live: BTreeMap<u64, Alloc>,
    freed: BTreeMap<u64, (u64, i32)>,
    host: Vc,
    streams: Vec<StreamClock>,
}

/// The process's engine, locked.
pub fn engine() -> MutexGuard<'static, Engine> {
    static E: OnceLock<Mutex<Engine>> = OnceLock::new();
    E.get_or_init(|| {
        Mutex::new(Engine {
            next: (0..device_count()).map(device_base).collect(),
            live: BTreeMap::new(),
            freed: BTreeMap::new(),
            host: Vec::new(),
            streams: Vec::new(),
        })
    })
    .lock()
    .unwrap_or_else(|e| e.into_inner())
}

fn hex(a: u64) -> String {
    format!("{a:#x}")
}

impl Engine {
    /// Allocates `size` bytes on `device` and returns the device address.
    pub fn alloc(&mut self, api: &str, device: i32, size: u64) -> EmuResult<u64> {
        check_device(api, device)?;
        if size == 0 {
            bail!(InvalidParam, "{api}: size 0 requested on device {device}");
        }
        if size > (1 << 40) {
            bail!(
                BadAlloc,
                "{api}: {size} bytes requested on device {device}, more than the emulated card has"
            );
        }
        let Some(v) = zeroed(size as usize) else {
            bail!(
                BadAlloc,
                "{api}: the host could not back {size} bytes for device {device}"
            );
        };
        let base = self.next[device as usize];
        let next = (base + size + GAP).div_ceil(ALIGN) * ALIGN;
        if next >= device_base(device) + DEVICE_STRIDE {
            bail!(
                BadAlloc,
                "{api}: device {device}'s address range is used up"
            );
        }
        self.next[device as usize] = next;
        self.live.insert(
            base,
            Alloc {
                device,
                size,
                data: Arc::new(AllocData {
                    bytes: Mutex::new(v),
                }),
                records: Vec::new(),
            },
        );
        Ok(base)
    }

    /// Frees the allocation that starts at `addr`.
    pub fn free(&mut self, api: &str, addr: u64) -> EmuResult<()> {
        if let Some(a) = self.live.remove(&addr) {
            self.freed.insert(addr, (a.size, a.device));
            return Ok(());
        }
        Err(self.explain_missing(api, addr, "free"))
    }

    /// Bytes allocated and live on `device`.
    pub fn used(&self, device: i32) -> u64 {
        self.live
            .values()
            .filter(|a| a.device == device)
            .map(|a| a.size)
            .sum()
    }

    /// Whether `addr` lies in some device's range (live, freed or never allocated).
    pub fn is_device_addr(addr: u64) -> bool {
        device_of_addr(addr).is_some()
    }

    fn explain_missing(&self, api: &str, addr: u64, verb: &str) -> EmuError {
        if let Some((&base, &(size, dev))) = self.freed.range(..=addr).next_back() {
            if addr < base + size.max(1) {
                return emu_err!(
                    IllegalAddress,
                    "{api}: {verb} of {} which is in device {dev}'s allocation {}+{size} that was already freed (use after free)",
                    hex(addr),
                    hex(base)
                );
            }
        }
        if let Some((&base, a)) = self.live.range(..=addr).next_back() {
            if addr < base + a.size {
                return emu_err!(
                    InvalidParam,
                    "{api}: {verb} of {} which is inside allocation {}+{} but not its start",
                    hex(addr),
                    hex(base),
                    a.size
                );
            }
        }
        match device_of_addr(addr) {
            Some(d) => emu_err!(
                IllegalAddress,
                "{api}: {verb} of {} which is in device {d}'s range but in no allocation",
                hex(addr)
            ),
            None => emu_err!(
                IllegalAddress,
                "{api}: {verb} of {} which is not a device address (a host pointer?)",
                hex(addr)
            ),
        }
    }

    /// Finds the live allocation holding `[addr, addr+len)` and checks the whole range is in
    /// it and, when `device` is given, that the allocation belongs to that device.
    pub fn resolve(
        &self,
        api: &str,
        req: &AccessReq,
        device: Option<i32>,
    ) -> EmuResult<(u64, Resolved)> {
        let addr = req.addr;
        if addr == 0 {
            bail!(NullPtr, "{api}: {} is a null device pointer", req.role);
        }
        let found = self
            .live
            .range(..=addr)
            .next_back()
            .filter(|(&b, a)| addr < b + a.size);
        let Some((&base, a)) = found else {
            let e = self.explain_missing(api, addr, &format!("access to {}", req.role));
            return Err(e);
        };
        let end = addr.saturating_add(req.len);
        if end > base + a.size {
            bail!(
                IllegalAddress,
                "{api}: {} accesses {}..{} ({} bytes) past the end of device {}'s allocation {}+{} by {} bytes",
                req.role,
                hex(addr),
                hex(end),
                req.len,
                a.device,
                hex(base),
                a.size,
                end - (base + a.size)
            );
        }
        if let Some(d) = device {
            if d != a.device {
                bail!(
                    WrongDevice,
                    "{api}: {} at {} belongs to device {} but is used from device {d}",
                    req.role,
                    hex(addr),
                    a.device
                );
            }
        }
        Ok((
            base,
            Resolved {
                data: a.data.clone(),
                offset: (addr - base) as usize,
                len: req.len as usize,
                device: a.device,
            },
        ))
    }

    /// Registers a new stream's clock and returns its id.
    pub fn new_stream_clock(&mut self) -> u32 {
        self.streams.push(StreamClock::default());
        (self.streams.len() - 1) as u32
    }

    /// Starts an operation on stream `id`: bumps its sequence number, joins the host's clock,
    /// and returns the operation's sequence number and vector clock.
    pub fn begin_op(&mut self, id: u32) -> (u64, Vc) {
        let host = self.host.clone();
        let s = &mut self.streams[id as usize];
        s.seq += 1;
        join(&mut s.vc, &host);
        if s.vc.len() <= id as usize {
            s.vc.resize(id as usize + 1, 0);
        }
        s.vc[id as usize] = s.seq;
        (s.seq, s.vc.clone())
    }

    /// The clock of stream `id` at its latest operation (what an event recorded now captures,
    /// after [`Engine::begin_op`] for the record itself).
    pub fn stream_vc(&self, id: u32) -> Vc {
        self.streams[id as usize].vc.clone()
    }

    /// Stream `id` waits for `vc` (aclrtStreamWaitEvent): everything `vc` has seen is ordered
    /// before the stream's later operations.
    pub fn stream_join(&mut self, id: u32, vc: &[u64]) {
        join(&mut self.streams[id as usize].vc, vc);
    }

    /// The host has waited for `vc` (a stream or event synchronisation).
    pub fn host_join(&mut self, vc: &[u64]) {
        join(&mut self.host, vc);
    }

    /// Resolves and checks all `reqs` for `who` on `device` (None for host accesses that may
    /// touch any device), and records them when all pass. Returns the resolved regions in the
    /// order of `reqs`.
    pub fn access(
        &mut self,
        api: &str,
        what: &'static str,
        who: &Accessor,
        device: Option<i32>,
        reqs: &[AccessReq],
    ) -> EmuResult<Vec<Resolved>> {
        let mut out = Vec::with_capacity(reqs.len());
        let mut bases = Vec::with_capacity(reqs.len());
        for r in reqs {
            let (base, res) = self.resolve(api, r, device)?;
            bases.push(base);
            out.push(res);
        }
        let host = self.host.clone();
        for (r, (&base, res)) in reqs.iter().zip(bases.iter().zip(&out)) {
            if res.len == 0 {
                continue;
            }
            let Some(a) = self.live.get_mut(&base) else {
                bail!(
                    Internal,
                    "{api}: allocation {base:#x} vanished while checking {what}"
                );
            };
            a.records.retain(|x| !seen(&host, x.stream, x.seq));
            let lo = res.offset as u64;
            let hi = lo + res.len as u64;
            for x in &a.records {
                if x.hi <= lo || hi <= x.lo || !(x.write || r.write) {
                    continue;
                }
                let ordered = match who {
                    Accessor::Host => false,
                    Accessor::Stream { stream, vc, .. } => {
                        *stream == x.stream || seen(vc, x.stream, x.seq)
                    }
                };
                if !ordered {
                    let me = match who {
                        Accessor::Host => "the host (synchronously)".to_string(),
                        Accessor::Stream { stream, seq, .. } => {
                            format!("stream #{stream} (its operation {seq})")
                        }
                    };
                    bail!(
                        Race,
                        "{api}: {} {} {}..{} from {me}, but {} of stream #{} (its operation {}) {} {}..{} of the same device {} allocation {}+{} and is not ordered before it: synchronize that stream, or record an event after it and wait on it",
                        r.role,
                        if r.write { "writes" } else { "reads" },
                        hex(base + lo),
                        hex(base + hi),
                        x.what,
                        x.stream,
                        x.seq,
                        if x.write { "writes" } else { "reads" },
                        hex(base + x.lo),
                        hex(base + x.hi),
                        res.device,
                        hex(base),
                        a.size
                    );
                }
            }
        }
        if let Accessor::Stream { stream, seq, .. } = who {
            for (r, (&base, res)) in reqs.iter().zip(bases.iter().zip(&out)) {
                if res.len == 0 {
                    continue;
                }
                let lo = res.offset as u64;
                let hi = lo + res.len as u64;
                let Some(a) = self.live.get_mut(&base) else {
                    bail!(
                        Internal,
                        "{api}: allocation {base:#x} vanished while checking {what}"
                    );
                };
                // A newer access of the same stream covering an older one supersedes it
                // (same-stream order), as long as it is at least as strong.
                a.records.retain(|x| {
                    !(x.stream == *stream && x.lo >= lo && x.hi <= hi && (r.write || !x.write))
                });
                a.records.push(Record {
                    lo,
                    hi,
                    stream: *stream,
                    seq: *seq,
                    write: r.write,
                    what,
                });
            }
        }
        Ok(out)
    }
}

/// `n` zero bytes, or None when the host cannot allocate them. Large buffers come from
/// `calloc`-like zeroed allocation, so untouched device memory costs no host pages.
fn zeroed(n: usize) -> Option<Vec<u8>> {
    let layout = std::alloc::Layout::array::<u8>(n).ok()?;
    // SAFETY: `n` > 0 (checked by the caller); the pointer comes from the global allocator
    // with this layout (alignment 1), so a Vec of capacity and length `n` may own it, and
    // zeroed bytes are valid u8s.
    unsafe {
        let p = std::alloc::alloc_zeroed(layout);
        if p.is_null() {
            return None;
        }
        Some(Vec::from_raw_parts(p, n, n))
    }
}

/// Reads `len` bytes of a resolved region into a new vector.
pub fn read_bytes(r: &Resolved) -> Vec<u8> {
    r.data.with(|b| b[r.offset..r.offset + r.len].to_vec())
}

/// Writes `src` into a resolved region (at most its length).
pub fn write_bytes(r: &Resolved, src: &[u8]) {
    let n = src.len().min(r.len);
    r.data
        .with(|b| b[r.offset..r.offset + n].copy_from_slice(&src[..n]));
}

/// An error of kind `Internal` (for impossible states reached through the FFI).
pub fn internal(msg: impl Into<String>) -> EmuError {
    EmuError::new(crate::diag::ErrorKind::Internal, msg)
}
