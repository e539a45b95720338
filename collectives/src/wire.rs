//! The one encoding of the transports' messages: a call's header (collective, parameters,
//! element type, shape, sequence number) and tensor elements, in frames. TCP sends them on
//! its connections; MPI sends the same frames as its header and send/receive messages. Also
//! here: the element-type and collective codes, the byte views of a tensor's buffer (shared
//! memory copies and reduces them in place), and the hash that names a group.
//!
//! A frame is a fixed 40-byte header, the sender's tensor shape (`ndim` u64s), the call's
//! parameters (UTF-8), and the payload:
//!
//! ```text
//! u32 magic | u8 kind | u8 collective | u8 dtype | u8 ndim | u16 params_len | u16 0
//! u64 key (group hash, or the tag for send/receive) | u64 seq | u32 step | u64 elems
//! ```
//!
//! For data frames the payload is `elems` elements of `dtype` (little-endian, Bool as bytes
//! 0 and 1); for abort frames it is an encoded error of `elems` bytes.

use half::{bf16, f16};
use shardc_ir::{DType, TensorType};
use shardc_runtime::comm::Collective;
use shardc_runtime::tensor::Data;
use std::borrow::Cow;
use std::io::{self, Read, Write};
use std::ops::Range;
use std::time::Duration;

/// Opens every frame.
const FRAME_MAGIC: u32 = 0x5348_4446;
/// The fixed part of a frame header.
const HEADER_LEN: usize = 40;
/// The most dimensions a shape may have on the wire.
const MAX_NDIM: usize = 64;
/// The longest parameter string.
const MAX_PARAMS: usize = 1024;
/// The longest reason of an error (or of a refused connection) on the wire.
pub(crate) const MAX_REASON: usize = 4096;
/// The largest encoded error of an abort frame.
const MAX_ABORT: u64 = 1 << 20;
/// Payloads larger than this are allocated step by step as their bytes arrive, so that a
/// corrupt header cannot make the reader allocate memory nobody sends.
const ALLOC_STEP: usize = 1 << 30;

/// The kind of a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A piece of a collective call.
    Collective = 1,
    /// A send/receive message.
    PointToPoint = 2,
    /// A member's error in a collective call, for every other member.
    Abort = 3,
}

/// The header of a frame.
#[derive(Clone, Debug)]
pub(crate) struct Header {
    pub kind: Kind,
    /// The group's hash (collectives) or the tag (send/receive).
    pub key: u64,
    /// The call's position in the group's sequence.
    pub seq: u64,
    /// Which message of the call.
    pub step: u32,
    pub collective: Collective,
    /// The call's parameters (`op=sum`): every member must pass the same.
    pub params: String,
    /// The sender's tensor's element type.
    pub dtype: DType,
    /// The sender's tensor's shape.
    pub shape: Vec<usize>,
    /// Payload elements (data frames) or bytes (abort frames).
    pub elems: u64,
}

impl Header {
    /// The header of a send/receive message under `tag` carrying `elems` elements of a
    /// tensor of `dtype` and `shape`.
    pub fn p2p(tag: i64, dtype: DType, shape: &[usize], elems: usize) -> Header {
        Header {
            kind: Kind::PointToPoint,
            key: tag as u64,
            seq: 0,
            step: 0,
            collective: Collective::Send,
            params: String::new(),
            dtype,
            shape: shape.to_vec(),
            elems: elems as u64,
        }
    }

    /// The call as its errors name it: `AllReduce(op=sum)`.
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))] // MPI's header exchange
    pub fn call(&self) -> String {
        format!("{}({})", self.collective.name(), self.params)
    }

    /// The sender's tensor type.
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))] // MPI's header exchange
    pub fn ty(&self) -> TensorType {
        TensorType::new(self.dtype, self.shape.clone())
    }
}

/// An error a member reports to the others of its call (an abort frame's payload).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct WireError {
    /// 0 invalid group, 1 invalid argument, 2 mismatch, 3 transport, 4 timeout.
    pub kind: u8,
    pub rank: usize,
    pub reason: String,
    pub missing: Vec<usize>,
    pub timeout: Duration,
}

/// A received frame's body.
#[derive(Debug)]
pub(crate) enum Body {
    Data(Data),
    Error(WireError),
}

/// Every collective, in the order of their codes.
const COLLECTIVES: [Collective; 8] = [
    Collective::AllReduce,
    Collective::AllGather,
    Collective::ReduceScatter,
    Collective::AllToAll,
    Collective::Broadcast,
    Collective::Send,
    Collective::Receive,
    Collective::Barrier,
];

/// The wire code of a collective.
pub(crate) fn collective_code(c: Collective) -> u8 {
    COLLECTIVES.iter().position(|&x| x == c).unwrap_or(0) as u8
}

/// The collective of a wire code.
fn collective_of(code: u8) -> Option<Collective> {
    COLLECTIVES.get(code as usize).copied()
}

/// The wire code of an element type: its position in [`DType::ALL`].
pub(crate) fn dtype_code(d: DType) -> u8 {
    DType::ALL.iter().position(|&x| x == d).unwrap_or(0) as u8
}

/// The element type of a wire code.
fn dtype_of(code: u8) -> Option<DType> {
    DType::ALL.get(code as usize).copied()
}

/// FNV-1a of the group's ranks (as little-endian u64s): the group's key on the wire, and
/// the seed of the tags that name a group's calls elsewhere (shared memory, MPI).
pub(crate) fn group_hash(group: &[usize]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &r in group {
        for b in (r as u64).to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// An `InvalidData` error.
pub(crate) fn bad(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// Writes one frame: header, shape, parameters, then `payload`. Small frames go out in one
/// write (one segment with `TCP_NODELAY`).
pub(crate) fn write_frame(w: &mut impl Write, h: &Header, payload: &[u8]) -> io::Result<()> {
    let params = h.params.as_bytes();
    let mut buf = Vec::with_capacity(HEADER_LEN + 8 * h.shape.len() + params.len() + 256);
    buf.extend_from_slice(&FRAME_MAGIC.to_le_bytes());
    buf.push(h.kind as u8);
    buf.push(collective_code(h.collective));
    buf.push(dtype_code(h.dtype));
    buf.push(h.shape.len().min(MAX_NDIM) as u8);
    buf.extend_from_slice(&(params.len().min(MAX_PARAMS) as u16).to_le_bytes());
    buf.extend_from_slice(&0u16.to_le_bytes());
    buf.extend_from_slice(&h.key.to_le_bytes());
    buf.extend_from_slice(&h.seq.to_le_bytes());
    buf.extend_from_slice(&h.step.to_le_bytes());
    buf.extend_from_slice(&h.elems.to_le_bytes());
    for &d in h.shape.iter().take(MAX_NDIM) {
        buf.extend_from_slice(&(d as u64).to_le_bytes());
    }
    buf.extend_from_slice(&params[..params.len().min(MAX_PARAMS)]);
    if payload.len() <= 64 * 1024 {
        buf.extend_from_slice(payload);
        w.write_all(&buf)
    } else {
        w.write_all(&buf)?;
        w.write_all(payload)
    }
}

/// Fills `head` from `r`: `Ok(false)` when the stream ended before its first byte (a clean
/// close between units), an `UnexpectedEof` naming `unit` when it ended inside.
pub(crate) fn read_head(r: &mut impl Read, head: &mut [u8], unit: &str) -> io::Result<bool> {
    let mut got = 0;
    while got < head.len() {
        match r.read(&mut head[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("closed in the middle of {unit}"),
                ))
            }
            Ok(k) => got += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// Reads one frame. `Ok(None)`: the peer closed the connection between frames.
pub(crate) fn read_frame(r: &mut impl Read) -> io::Result<Option<(Header, Body)>> {
    let mut fixed = [0u8; HEADER_LEN];
    if !read_head(r, &mut fixed, "a frame")? {
        return Ok(None);
    }
    let u16_at = |i: usize| u16::from_le_bytes([fixed[i], fixed[i + 1]]);
    let u32_at = |i: usize| {
        let mut b = [0u8; 4];
        b.copy_from_slice(&fixed[i..i + 4]);
        u32::from_le_bytes(b)
    };
    let u64_at = |i: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&fixed[i..i + 8]);
        u64::from_le_bytes(b)
    };
    if u32_at(0) != FRAME_MAGIC {
        return Err(bad(format!("bad frame magic {:#010x}", u32_at(0))));
    }
    let kind = match fixed[4] {
        1 => Kind::Collective,
        2 => Kind::PointToPoint,
        3 => Kind::Abort,
        k => return Err(bad(format!("unknown frame kind {k}"))),
    };
    let collective =
        collective_of(fixed[5]).ok_or_else(|| bad(format!("unknown collective {}", fixed[5])))?;
    let dtype = dtype_of(fixed[6]).ok_or_else(|| bad(format!("unknown dtype {}", fixed[6])))?;
    let ndim = fixed[7] as usize;
    let params_len = u16_at(8) as usize;
    if ndim > MAX_NDIM || params_len > MAX_PARAMS {
        return Err(bad(format!(
            "oversized header: {ndim} dims, {params_len} parameter bytes"
        )));
    }
    let key = u64_at(12);
    let seq = u64_at(20);
    let step = u32_at(28);
    let elems = u64_at(32);
    let mut var = vec![0u8; ndim * 8 + params_len];
    r.read_exact(&mut var)?;
    let shape: Vec<usize> = var[..ndim * 8]
        .chunks_exact(8)
        .map(|c| {
            let mut b = [0u8; 8];
            b.copy_from_slice(c);
            u64::from_le_bytes(b) as usize
        })
        .collect();
    let params = String::from_utf8(var[ndim * 8..].to_vec())
        .map_err(|_| bad("parameters are not UTF-8".into()))?;
    let header = Header {
        kind,
        key,
        seq,
        step,
        collective,
        params,
        dtype,
        shape,
        elems,
    };
    let body = if kind == Kind::Abort {
        if elems > MAX_ABORT {
            return Err(bad(format!("oversized abort frame of {elems} bytes")));
        }
        let mut b = vec![0u8; elems as usize];
        r.read_exact(&mut b)?;
        Body::Error(decode_error(&b).ok_or_else(|| bad("malformed abort frame".into()))?)
    } else {
        let n = usize::try_from(elems)
            .ok()
            .filter(|n| n.checked_mul(dtype.size_bytes()).is_some())
            .ok_or_else(|| bad(format!("payload of {elems} elements is too large")))?;
        Body::Data(read_data(r, dtype, n)?)
    };
    Ok(Some((header, body)))
}

/// Encodes an abort frame's payload.
pub(crate) fn encode_error(e: &WireError) -> Vec<u8> {
    let reason = &e.reason.as_bytes()[..e.reason.len().min(MAX_REASON)];
    let mut b = Vec::with_capacity(32 + reason.len() + 8 * e.missing.len());
    b.push(e.kind);
    b.extend_from_slice(&(e.rank as u64).to_le_bytes());
    b.extend_from_slice(&(e.timeout.as_nanos().min(u64::MAX as u128) as u64).to_le_bytes());
    b.extend_from_slice(&(e.missing.len() as u32).to_le_bytes());
    for &m in &e.missing {
        b.extend_from_slice(&(m as u64).to_le_bytes());
    }
    b.extend_from_slice(&(reason.len() as u32).to_le_bytes());
    b.extend_from_slice(reason);
    b
}

fn decode_error(b: &[u8]) -> Option<WireError> {
    let mut pos = 0usize;
    let mut take = |k: usize| -> Option<&[u8]> {
        let s = b.get(pos..pos.checked_add(k)?)?;
        pos += k;
        Some(s)
    };
    let u64_of = |s: &[u8]| {
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        u64::from_le_bytes(a)
    };
    let u32_of = |s: &[u8]| {
        let mut a = [0u8; 4];
        a.copy_from_slice(s);
        u32::from_le_bytes(a)
    };
    let kind = take(1)?[0];
    let rank = u64_of(take(8)?) as usize;
    let timeout = Duration::from_nanos(u64_of(take(8)?));
    let n = u32_of(take(4)?) as usize;
    let mut missing = Vec::with_capacity(n.min(4096));
    for _ in 0..n {
        missing.push(u64_of(take(8)?) as usize);
    }
    let len = u32_of(take(4)?) as usize;
    let reason = String::from_utf8_lossy(take(len)?).into_owned();
    Some(WireError {
        kind,
        rank,
        reason,
        missing,
        timeout,
    })
}

/// Element types sent as their little-endian bytes.
///
/// # Safety
/// Implementors are plain data without padding, every bit pattern of their size is a valid
/// value, and on a little-endian target their in-memory bytes are their little-endian
/// encoding.
unsafe trait Elem: Copy + Default {
    const SIZE: usize;
    fn put(self, out: &mut Vec<u8>);
    fn get(b: &[u8]) -> Self;
}

macro_rules! elem {
    ($t:ty, $n:expr, $to:expr, $from:expr) => {
        // SAFETY: a primitive number (or a transparent wrapper of u16) of $n bytes.
        unsafe impl Elem for $t {
            const SIZE: usize = $n;
            fn put(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&($to)(self));
            }
            fn get(b: &[u8]) -> Self {
                let mut a = [0u8; $n];
                a.copy_from_slice(&b[..$n]);
                ($from)(a)
            }
        }
    };
}

elem!(f32, 4, f32::to_le_bytes, f32::from_le_bytes);
elem!(f64, 8, f64::to_le_bytes, f64::from_le_bytes);
elem!(i32, 4, i32::to_le_bytes, i32::from_le_bytes);
elem!(i64, 8, i64::to_le_bytes, i64::from_le_bytes);
elem!(f16, 2, |x: f16| x.to_bits().to_le_bytes(), |a| {
    f16::from_bits(u16::from_le_bytes(a))
});
elem!(bf16, 2, |x: bf16| x.to_bits().to_le_bytes(), |a| {
    bf16::from_bits(u16::from_le_bytes(a))
});

/// The little-endian bytes of `v` on a big-endian target.
fn to_le<T: Elem>(v: &[T]) -> Cow<'_, [u8]> {
    let mut out = Vec::with_capacity(v.len() * T::SIZE);
    for &x in v {
        x.put(&mut out);
    }
    Cow::Owned(out)
}

fn read_into<T: Elem>(r: &mut impl Read, v: &mut [T]) -> io::Result<()> {
    if cfg!(target_endian = "little") {
        // SAFETY: `Elem`'s contract: every bit pattern is a valid value, and the memory is
        // the little-endian encoding.
        let bytes = unsafe {
            std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(v))
        };
        r.read_exact(bytes)
    } else {
        let mut buf = vec![0u8; 64 * 1024 / T::SIZE * T::SIZE];
        for chunk in v.chunks_mut(buf.len() / T::SIZE) {
            let b = &mut buf[..chunk.len() * T::SIZE];
            r.read_exact(b)?;
            for (x, c) in chunk.iter_mut().zip(b.chunks_exact(T::SIZE)) {
                *x = T::get(c);
            }
        }
        Ok(())
    }
}

fn read_vec<T: Elem>(r: &mut impl Read, n: usize) -> io::Result<Vec<T>> {
    let step = (ALLOC_STEP / T::SIZE).max(1);
    if n <= step {
        let mut v = vec![T::default(); n];
        read_into(r, &mut v)?;
        return Ok(v);
    }
    let mut v: Vec<T> = Vec::new();
    while v.len() < n {
        let start = v.len();
        v.resize((start + step).min(n), T::default());
        read_into(r, &mut v[start..])?;
    }
    Ok(v)
}

/// Reads `n` elements of `dtype`.
pub(crate) fn read_data(r: &mut impl Read, dtype: DType, n: usize) -> io::Result<Data> {
    Ok(match dtype {
        DType::Float32 => Data::F32(read_vec(r, n)?),
        DType::Float64 => Data::F64(read_vec(r, n)?),
        DType::Float16 => Data::F16(read_vec(r, n)?),
        DType::BFloat16 => Data::BF16(read_vec(r, n)?),
        DType::Int32 => Data::I32(read_vec(r, n)?),
        DType::Int64 => Data::I64(read_vec(r, n)?),
        DType::Bool => {
            let mut b = Vec::new();
            r.take(n as u64).read_to_end(&mut b)?;
            if b.len() != n {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "closed in the middle of a frame",
                ));
            }
            let mut out = Vec::with_capacity(n);
            for x in b {
                match x {
                    0 => out.push(false),
                    1 => out.push(true),
                    x => return Err(bad(format!("byte {x} is not a Bool"))),
                }
            }
            Data::Bool(out)
        }
    })
}

/// The bytes of elements `range` of `d` on the wire: little-endian, Bool as 0 and 1
/// (borrowed on little-endian targets).
pub(crate) fn data_bytes(d: &Data, range: Range<usize>) -> Cow<'_, [u8]> {
    if cfg!(target_endian = "little") {
        let es = d.dtype().size_bytes();
        return Cow::Borrowed(&native_bytes(d)[range.start * es..range.end * es]);
    }
    match d {
        Data::F32(v) => to_le(&v[range]),
        Data::F64(v) => to_le(&v[range]),
        Data::F16(v) => to_le(&v[range]),
        Data::BF16(v) => to_le(&v[range]),
        Data::I32(v) => to_le(&v[range]),
        Data::I64(v) => to_le(&v[range]),
        Data::Bool(v) => Cow::Owned(v[range].iter().map(|&b| b as u8).collect()),
    }
}

/// The bytes of a buffer in memory (native byte order; a Bool is the byte 0 or 1).
pub(crate) fn native_bytes(d: &Data) -> &[u8] {
    fn cast<T>(v: &[T]) -> &[u8] {
        // SAFETY: the element types are plain numbers (and bool) without padding; the byte
        // view covers the same memory, and any byte may be read.
        unsafe { std::slice::from_raw_parts(v.as_ptr().cast(), std::mem::size_of_val(v)) }
    }
    match d {
        Data::F32(v) => cast(v),
        Data::F64(v) => cast(v),
        Data::F16(v) => cast(v),
        Data::BF16(v) => cast(v),
        Data::I32(v) => cast(v),
        Data::I64(v) => cast(v),
        Data::Bool(v) => cast(v),
    }
}

/// The bytes of a buffer in memory, writable. Only the bytes of elements of the same type
/// (from a member's tensor of the same dtype) are ever written into them, so that a Bool
/// stays 0 or 1.
pub(crate) fn native_bytes_mut(d: &mut Data) -> &mut [u8] {
    fn cast<T>(v: &mut [T]) -> &mut [u8] {
        // SAFETY: as in `native_bytes`; writers only store valid element bytes.
        unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast(), std::mem::size_of_val(v)) }
    }
    match d {
        Data::F32(v) => cast(v),
        Data::F64(v) => cast(v),
        Data::F16(v) => cast(v),
        Data::BF16(v) => cast(v),
        Data::I32(v) => cast(v),
        Data::I64(v) => cast(v),
        Data::Bool(v) => cast(v),
    }
}

/// A data frame as one message: its header and elements `range` of `data` (MPI sends
/// frames this way).
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
pub(crate) fn encode_frame(h: &Header, data: &Data, range: Range<usize>) -> Vec<u8> {
    let mut m = Vec::new();
    let payload = data_bytes(data, range);
    // Writing into a vector cannot fail.
    let _ = write_frame(&mut m, h, &payload);
    m
}

/// The one data frame a message holds (see [`encode_frame`]): its header and elements.
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
pub(crate) fn decode_frame(m: &[u8]) -> Result<(Header, Data), String> {
    let mut r = m;
    match read_frame(&mut r) {
        Ok(Some((h, Body::Data(d)))) if r.is_empty() => Ok((h, d)),
        Ok(Some((_, Body::Data(_)))) => Err(format!("{} trailing bytes", r.len())),
        Ok(Some((_, Body::Error(_)))) => Err("an abort frame where data was expected".into()),
        Ok(None) => Err("an empty message".into()),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip() {
        let h = Header {
            kind: Kind::Collective,
            key: 77,
            seq: 3,
            step: 9,
            collective: Collective::ReduceScatter,
            params: "op=sum, axis=1".into(),
            dtype: DType::Float32,
            shape: vec![2, 3],
            elems: 3,
        };
        let data = Data::F32(vec![1.5, -2.0, 3.25]);
        let mut buf = Vec::new();
        write_frame(&mut buf, &h, &data_bytes(&data, 0..3)).unwrap();
        assert_eq!(buf, encode_frame(&h, &data, 0..3));
        let (d, back) = decode_frame(&buf).unwrap();
        assert_eq!(
            (d.call(), back),
            ("ReduceScatter(op=sum, axis=1)".to_string(), data.clone())
        );
        buf.push(0);
        assert!(decode_frame(&buf).is_err_and(|e| e.contains("1 trailing bytes")));
        buf.pop();
        let (g, body) = read_frame(&mut buf.as_slice()).unwrap().unwrap();
        assert_eq!((g.key, g.seq, g.step, g.elems), (77, 3, 9, 3));
        assert_eq!(g.params, h.params);
        assert_eq!(g.shape, vec![2, 3]);
        assert_eq!(g.collective, Collective::ReduceScatter);
        match body {
            Body::Data(d) => assert_eq!(d, data),
            Body::Error(e) => panic!("{e:?}"),
        }
        assert!(read_frame(&mut [].as_slice()).unwrap().is_none());
    }

    #[test]
    fn every_dtype_round_trips() {
        let all = [
            Data::F64(vec![1.0, f64::NAN]),
            Data::F16(vec![f16::from_f32(1.5), f16::from_f32(-0.25)]),
            Data::BF16(vec![bf16::from_f32(3.0)]),
            Data::I32(vec![i32::MIN, 7]),
            Data::I64(vec![i64::MAX, -1]),
            Data::Bool(vec![true, false, true]),
        ];
        for d in all {
            let bytes = data_bytes(&d, 0..d.len());
            let back = read_data(&mut &bytes[..], d.dtype(), d.len()).unwrap();
            assert_eq!(data_bytes(&back, 0..back.len()), bytes);
        }
        assert!(read_data(&mut &[2u8][..], DType::Bool, 1).is_err());
        // The codes are the order of DType::ALL and of the collectives.
        for (i, &d) in DType::ALL.iter().enumerate() {
            assert_eq!((dtype_code(d), dtype_of(i as u8)), (i as u8, Some(d)));
        }
        assert_eq!(dtype_of(7), None);
        for (i, &c) in COLLECTIVES.iter().enumerate() {
            assert_eq!(
                (collective_code(c), collective_of(i as u8)),
                (i as u8, Some(c))
            );
        }
        assert_eq!(collective_of(8), None);
    }

    #[test]
    fn malformed_frames_are_errors() {
        let mut junk = vec![0u8; 64];
        assert!(read_frame(&mut junk.as_slice()).is_err());
        junk[..4].copy_from_slice(&FRAME_MAGIC.to_le_bytes());
        junk[4] = 9;
        assert!(read_frame(&mut junk.as_slice()).is_err());
        junk[4] = 1;
        junk[7] = 200;
        assert!(read_frame(&mut junk.as_slice()).is_err());
        // A truncated frame.
        assert!(read_frame(&mut &junk[..10]).is_err());
    }

    #[test]
    fn errors_round_trip() {
        let e = WireError {
            kind: 4,
            rank: 3,
            reason: "x".into(),
            missing: vec![1, 2],
            timeout: Duration::from_millis(1500),
        };
        assert_eq!(decode_error(&encode_error(&e)), Some(e));
        assert_eq!(decode_error(&[4, 1]), None);
    }
}
