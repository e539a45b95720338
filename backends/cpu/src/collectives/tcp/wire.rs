//! The wire format of the TCP data plane: the connection handshake, message frames and the
//! tensor payload codec (raw little-endian element bytes).
//!
//! A frame is a fixed 40-byte header, the sender's tensor shape (`ndim` u64s), the call's
//! parameters (UTF-8), and the payload:
//!
//! ```text
//! u32 magic | u8 kind | u8 collective | u8 dtype | u8 ndim | u16 params_len | u16 0
//! u64 key (group hash, or the tag for send/receive) | u64 seq | u32 step | u64 elems
//! ```
//!
//! For data frames the payload is `elems` elements of `dtype`; for abort frames it is an
//! encoded error of `elems` bytes.

use half::{bf16, f16};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use shardc_ir::DType;
use shardc_runtime::comm::Collective;
use shardc_runtime::tensor::Data;
use std::borrow::Cow;
use std::io::{self, Read, Write};
use std::ops::Range;
use std::time::Duration;
use subtle::ConstantTimeEq;

/// Opens every handshake message.
pub(super) const HELLO_MAGIC: [u8; 8] = *b"SHDCTCP1";
/// Opens every frame.
const FRAME_MAGIC: u32 = 0x5348_4446;
/// The fixed part of a frame header.
const HEADER_LEN: usize = 40;
/// The most dimensions a shape may have on the wire.
const MAX_NDIM: usize = 64;
/// The longest parameter string.
const MAX_PARAMS: usize = 1024;
/// The longest job id.
pub(super) const MAX_JOB_ID: usize = 255;
/// The longest refusal reason.
const MAX_REASON: usize = 4096;
/// The largest encoded error of an abort frame.
const MAX_ABORT: u64 = 1 << 20;
/// Payloads larger than this are allocated step by step as their bytes arrive, so that a
/// corrupt header cannot make the reader allocate memory nobody sends.
const ALLOC_STEP: usize = 1 << 30;

/// The kind of a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    /// A piece of a collective call.
    Collective = 1,
    /// A send/receive message.
    PointToPoint = 2,
    /// A member's error in a collective call, for every other member.
    Abort = 3,
}

/// The header of a frame.
#[derive(Clone, Debug)]
pub(super) struct Header {
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

/// An error a member reports to the others of its call (an abort frame's payload).
#[derive(Clone, Debug, PartialEq)]
pub(super) struct WireError {
    /// 0 invalid group, 1 invalid argument, 2 mismatch, 3 transport, 4 timeout.
    pub kind: u8,
    pub rank: usize,
    pub reason: String,
    pub missing: Vec<usize>,
    pub timeout: Duration,
}

/// A received frame's body.
#[derive(Debug)]
pub(super) enum Body {
    Data(Data),
    Error(WireError),
}

pub(super) fn collective_code(c: Collective) -> u8 {
    match c {
        Collective::AllReduce => 0,
        Collective::AllGather => 1,
        Collective::ReduceScatter => 2,
        Collective::AllToAll => 3,
        Collective::Broadcast => 4,
        Collective::Send => 5,
        Collective::Receive => 6,
        Collective::Barrier => 7,
    }
}

fn collective_of(code: u8) -> Option<Collective> {
    Some(match code {
        0 => Collective::AllReduce,
        1 => Collective::AllGather,
        2 => Collective::ReduceScatter,
        3 => Collective::AllToAll,
        4 => Collective::Broadcast,
        5 => Collective::Send,
        6 => Collective::Receive,
        7 => Collective::Barrier,
        _ => return None,
    })
}

fn dtype_code(d: DType) -> u8 {
    match d {
        DType::Float32 => 0,
        DType::Float64 => 1,
        DType::Float16 => 2,
        DType::BFloat16 => 3,
        DType::Int32 => 4,
        DType::Int64 => 5,
        DType::Bool => 6,
    }
}

fn dtype_of(code: u8) -> Option<DType> {
    Some(match code {
        0 => DType::Float32,
        1 => DType::Float64,
        2 => DType::Float16,
        3 => DType::BFloat16,
        4 => DType::Int32,
        5 => DType::Int64,
        6 => DType::Bool,
        _ => return None,
    })
}

/// Bytes per element on the wire.
pub(super) fn elem_size(d: DType) -> usize {
    match d {
        DType::Float32 | DType::Int32 => 4,
        DType::Float64 | DType::Int64 => 8,
        DType::Float16 | DType::BFloat16 => 2,
        DType::Bool => 1,
    }
}

fn bad(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// Writes one frame: header, shape, parameters, then `payload`. Small frames go out in one
/// write (one segment with `TCP_NODELAY`).
pub(super) fn write_frame(w: &mut impl Write, h: &Header, payload: &[u8]) -> io::Result<()> {
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
pub(super) fn read_head(r: &mut impl Read, head: &mut [u8], unit: &str) -> io::Result<bool> {
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
pub(super) fn read_frame(r: &mut impl Read) -> io::Result<Option<(Header, Body)>> {
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
            .filter(|n| n.checked_mul(elem_size(dtype)).is_some())
            .ok_or_else(|| bad(format!("payload of {elems} elements is too large")))?;
        Body::Data(read_data(r, dtype, n)?)
    };
    Ok(Some((header, body)))
}

/// Encodes an abort frame's payload.
pub(super) fn encode_error(e: &WireError) -> Vec<u8> {
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

fn view<T: Elem>(v: &[T]) -> Cow<'_, [u8]> {
    if cfg!(target_endian = "little") {
        // SAFETY: `Elem`'s contract: plain data whose memory is its little-endian encoding.
        Cow::Borrowed(unsafe {
            std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v))
        })
    } else {
        let mut out = Vec::with_capacity(v.len() * T::SIZE);
        for &x in v {
            x.put(&mut out);
        }
        Cow::Owned(out)
    }
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
pub(super) fn read_data(r: &mut impl Read, dtype: DType, n: usize) -> io::Result<Data> {
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

/// The bytes of elements `range` of `d` (borrowed on little-endian targets).
pub(super) fn data_bytes(d: &Data, range: Range<usize>) -> Cow<'_, [u8]> {
    match d {
        Data::F32(v) => view(&v[range]),
        Data::F64(v) => view(&v[range]),
        Data::F16(v) => view(&v[range]),
        Data::BF16(v) => view(&v[range]),
        Data::I32(v) => view(&v[range]),
        Data::I64(v) => view(&v[range]),
        Data::Bool(v) => Cow::Owned(v[range].iter().map(|&b| b as u8).collect()),
    }
}

/// The first handshake message, from the connecting (higher) rank.
#[derive(Clone, Debug)]
pub(super) struct Hello {
    pub from: u32,
    pub to: u32,
    pub size: u32,
    pub has_token: bool,
    /// The connection continues with TLS and sealed records ([`super::seal`]).
    pub tls: bool,
    pub nonce: [u8; 32],
    pub job_id: String,
}

pub(super) fn write_hello(w: &mut impl Write, h: &Hello) -> io::Result<()> {
    let job = &h.job_id.as_bytes()[..h.job_id.len().min(MAX_JOB_ID)];
    let mut b = Vec::with_capacity(64 + job.len());
    b.extend_from_slice(&HELLO_MAGIC);
    b.extend_from_slice(&h.from.to_le_bytes());
    b.extend_from_slice(&h.to.to_le_bytes());
    b.extend_from_slice(&h.size.to_le_bytes());
    b.push(h.has_token as u8 | (h.tls as u8) << 1);
    b.extend_from_slice(&h.nonce);
    b.push(job.len() as u8);
    b.extend_from_slice(job);
    w.write_all(&b)
}

/// Reads a [`Hello`]; an `InvalidData` error when it is not one.
pub(super) fn read_hello(r: &mut impl Read) -> io::Result<Hello> {
    let mut b = [0u8; 8 + 12 + 1 + 32 + 1];
    r.read_exact(&mut b)?;
    if b[..8] != HELLO_MAGIC {
        return Err(bad("not a shardc data connection (bad magic)".into()));
    }
    let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    let mut nonce = [0u8; 32];
    nonce.copy_from_slice(&b[21..53]);
    let mut job = vec![0u8; b[53] as usize];
    r.read_exact(&mut job)?;
    Ok(Hello {
        from: u32_at(8),
        to: u32_at(12),
        size: u32_at(16),
        has_token: b[20] & 1 != 0,
        tls: b[20] & 2 != 0,
        nonce,
        job_id: String::from_utf8_lossy(&job).into_owned(),
    })
}

/// Writes a status: accepted (with a 32-byte nonce and a 32-byte proof), or refused with a
/// reason.
pub(super) fn write_status(
    w: &mut impl Write,
    accepted: Option<(&[u8; 32], &[u8; 32])>,
    refusal: &str,
) -> io::Result<()> {
    let mut b = Vec::with_capacity(80);
    b.extend_from_slice(&HELLO_MAGIC);
    match accepted {
        Some((nonce, proof)) => {
            b.push(0);
            b.extend_from_slice(nonce);
            b.extend_from_slice(proof);
        }
        None => {
            let r = &refusal.as_bytes()[..refusal.len().min(MAX_REASON)];
            b.push(1);
            b.extend_from_slice(&(r.len() as u16).to_le_bytes());
            b.extend_from_slice(r);
        }
    }
    w.write_all(&b)
}

/// Reads a status: `Ok(Ok((nonce, proof)))` when accepted, `Ok(Err(reason))` when refused.
#[allow(clippy::type_complexity)]
pub(super) fn read_status(r: &mut impl Read) -> io::Result<Result<([u8; 32], [u8; 32]), String>> {
    let mut b = [0u8; 9];
    r.read_exact(&mut b)?;
    if b[..8] != HELLO_MAGIC {
        return Err(bad("not a shardc data connection (bad magic)".into()));
    }
    if b[8] == 0 {
        let mut nonce = [0u8; 32];
        let mut proof = [0u8; 32];
        r.read_exact(&mut nonce)?;
        r.read_exact(&mut proof)?;
        Ok(Ok((nonce, proof)))
    } else {
        let mut l = [0u8; 2];
        r.read_exact(&mut l)?;
        let mut reason = vec![0u8; u16::from_le_bytes(l) as usize];
        r.read_exact(&mut reason)?;
        Ok(Err(String::from_utf8_lossy(&reason).into_owned()))
    }
}

/// Who computes a proof: the two sides use different labels so that one side's proof is
/// never valid for the other.
#[derive(Clone, Copy)]
pub(super) enum Side {
    Acceptor,
    Connector,
}

/// HMAC-SHA256 under the token over the connection's identity and both nonces.
pub(super) fn proof(
    token: &[u8],
    side: Side,
    hello: &Hello,
    acceptor_nonce: &[u8; 32],
) -> Option<[u8; 32]> {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(token).ok()?;
    mac.update(match side {
        Side::Acceptor => b"shardc-tcp acceptor",
        Side::Connector => b"shardc-tcp connector",
    });
    mac.update(&(hello.job_id.len() as u32).to_le_bytes());
    mac.update(hello.job_id.as_bytes());
    mac.update(&hello.from.to_le_bytes());
    mac.update(&hello.to.to_le_bytes());
    mac.update(&hello.size.to_le_bytes());
    mac.update(&hello.nonce);
    mac.update(acceptor_nonce);
    Some(mac.finalize().into_bytes().into())
}

/// Whether `got` is the expected proof (constant time).
pub(super) fn proof_ok(expected: Option<[u8; 32]>, got: &[u8; 32]) -> bool {
    match expected {
        Some(e) => bool::from(e.ct_eq(got)),
        None => false,
    }
}

/// A fresh random nonce.
pub(super) fn nonce() -> io::Result<[u8; 32]> {
    let mut n = [0u8; 32];
    getrandom::fill(&mut n).map_err(|e| io::Error::other(format!("no randomness: {e}")))?;
    Ok(n)
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

    #[test]
    fn proofs_depend_on_the_token() {
        let hello = Hello {
            from: 1,
            to: 0,
            size: 2,
            has_token: true,
            tls: false,
            nonce: [1; 32],
            job_id: "job".into(),
        };
        let a = proof(b"secret", Side::Acceptor, &hello, &[2; 32]);
        assert!(proof_ok(a, &a.unwrap()));
        let b = proof(b"Secret", Side::Acceptor, &hello, &[2; 32]).unwrap();
        assert!(!proof_ok(a, &b));
        let c = proof(b"secret", Side::Connector, &hello, &[2; 32]).unwrap();
        assert!(!proof_ok(a, &c));
    }
}
