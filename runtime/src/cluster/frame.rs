//! Frames of the control protocol and the messages they carry.
//!
//! A frame is `magic (4 bytes, "SHCL") | kind (1 byte) | length (u32, little endian) |
//! payload (length bytes)`. The payload is a small explicit encoding: integers little endian,
//! strings and byte strings as a `u32` length then the bytes, options as a `0`/`1` tag, lists
//! as a `u32` count then the items. [`decode`] is pure (no I/O) so that it can be fuzzed; the
//! async [`FrameReader`] uses it. A bad magic, an unknown kind, a length over the limit or a
//! malformed payload is a [`FrameError`]: the connection it came on is closed, nothing else.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The four bytes every frame starts with.
pub const MAGIC: [u8; 4] = *b"SHCL";

/// Size of a frame's header (magic, kind, length).
pub const HEADER_LEN: usize = 9;

/// The largest payload [`decode`] accepts (16 MiB: the address table of a very large job).
pub const MAX_FRAME: usize = 16 << 20;

/// The largest payload the scheduler accepts from a worker (64 KiB: workers send only small
/// messages, and nobody may make the scheduler buffer megabytes before authenticating).
pub const MAX_CONTROL_FRAME: usize = 64 << 10;

/// Length of the random nonces of the challenge-response.
pub const NONCE_LEN: usize = 32;

/// Version of the control protocol, sent in [`Message::Hello`].
pub const PROTOCOL_VERSION: u32 = 1;

/// One row of the address table in [`Message::Assign`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerEntry {
    /// The peer's rank.
    pub rank: u32,
    /// The peer's host id (host and network namespace).
    pub host_id: String,
    /// The IP address the scheduler saw the peer connect from.
    pub ip: IpAddr,
    /// The peer's data-plane port.
    pub data_port: u16,
    /// The peer's node id (`MS_NODE_ID`; empty when not set).
    pub node_id: String,
}

/// A message of the control protocol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    /// Worker → scheduler, first: the protocol version and the worker's nonce.
    Hello {
        /// [`PROTOCOL_VERSION`].
        protocol: u32,
        /// The worker's random nonce (the scheduler proves it knows the token with it).
        nonce: [u8; NONCE_LEN],
    },
    /// Scheduler → worker: the scheduler's nonce.
    Challenge {
        /// The scheduler's random nonce.
        nonce: [u8; NONCE_LEN],
        /// Whether the scheduler requires a token.
        token_required: bool,
    },
    /// Worker → scheduler: the HMAC of the scheduler's nonce under the token.
    AuthResponse {
        /// The MAC (empty when the worker has no token).
        mac: Vec<u8>,
    },
    /// Scheduler → worker, after a valid [`Message::AuthResponse`]: the scheduler's proof
    /// that it knows the token too.
    Accepted {
        /// HMAC of the worker's nonce under the token (empty without a token).
        proof: Vec<u8>,
    },
    /// Worker → scheduler: who the worker is.
    Register {
        /// `MS_NODE_ID`, if set.
        node_id: Option<String>,
        /// The rank the launcher asked for (`SHARDC_RANK`, `OMPI_COMM_WORLD_RANK`, ...).
        requested_rank: Option<u32>,
        /// The worker's host id.
        host_id: String,
        /// The worker's data-plane port.
        data_port: u16,
        /// The worker's process id.
        pid: u32,
        /// The worker's host name.
        hostname: String,
        /// The number of workers the worker was started for (`MS_WORKER_NUM`).
        worker_num: u32,
    },
    /// Scheduler → worker, once every worker joined: the worker's rank and the table.
    Assign {
        /// The worker's rank.
        rank: u32,
        /// The number of workers.
        size: u32,
        /// A random id, the same on every worker.
        job_id: String,
        /// Every rank's entry, in rank order.
        peers: Vec<PeerEntry>,
    },
    /// Either way: still alive.
    Heartbeat,
    /// Worker → scheduler: the worker is done, with its exit status.
    Finish {
        /// 0 on success.
        status: i32,
    },
    /// Scheduler → worker: the finish was recorded.
    FinishAck,
    /// Scheduler → worker: the job is aborted.
    Abort {
        /// The rank that was lost, if a rank was.
        lost_rank: Option<u32>,
        /// The full message (`rank 3 (node n3, host h, pid 1234) was lost: ...`).
        reason: String,
    },
    /// Scheduler → worker: this worker is refused; the connection closes.
    Refused {
        /// Why (`wrong cluster token`, ...).
        reason: String,
    },
}

impl Message {
    /// The kind byte of the message's frames.
    pub fn kind(&self) -> u8 {
        match self {
            Message::Hello { .. } => 1,
            Message::Challenge { .. } => 2,
            Message::AuthResponse { .. } => 3,
            Message::Register { .. } => 4,
            Message::Assign { .. } => 5,
            Message::Heartbeat => 6,
            Message::Finish { .. } => 7,
            Message::FinishAck => 8,
            Message::Abort { .. } => 9,
            Message::Refused { .. } => 10,
            Message::Accepted { .. } => 11,
        }
    }

    /// The message's name, for errors (`Hello`, `Assign`, ...).
    pub fn name(&self) -> &'static str {
        kind_name(self.kind()).unwrap_or("?")
    }
}

/// The name of a kind byte, or `None` for an unknown kind.
pub fn kind_name(kind: u8) -> Option<&'static str> {
    Some(match kind {
        1 => "Hello",
        2 => "Challenge",
        3 => "AuthResponse",
        4 => "Register",
        5 => "Assign",
        6 => "Heartbeat",
        7 => "Finish",
        8 => "FinishAck",
        9 => "Abort",
        10 => "Refused",
        11 => "Accepted",
        _ => return None,
    })
}

/// Why a frame could not be decoded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The frame does not start with [`MAGIC`] (not a shardc peer, or garbage).
    #[error(
        "bad magic {found:02x?}: expected {:02x?} (\"SHCL\"); not a shardc control connection",
        MAGIC
    )]
    BadMagic {
        /// The bytes found (as many as had arrived, up to 4).
        found: Vec<u8>,
    },
    /// The kind byte names no message.
    #[error("unknown message kind {kind}: expected 1..=11")]
    UnknownKind {
        /// The kind byte.
        kind: u8,
    },
    /// The announced payload length exceeds the limit.
    #[error("{kind} frame of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge {
        /// The message kind's name.
        kind: &'static str,
        /// The announced length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The payload does not decode as its message.
    #[error("malformed {kind} payload at byte {offset}: {reason}")]
    Malformed {
        /// The message kind's name.
        kind: &'static str,
        /// Offset in the payload.
        offset: usize,
        /// What was wrong.
        reason: String,
    },
}

/// Encodes a message as one frame.
pub fn encode(msg: &Message) -> Vec<u8> {
    let mut w = Writer(Vec::with_capacity(64));
    match msg {
        Message::Hello { protocol, nonce } => {
            w.u32(*protocol);
            w.0.extend_from_slice(nonce);
        }
        Message::Challenge {
            nonce,
            token_required,
        } => {
            w.0.extend_from_slice(nonce);
            w.u8(u8::from(*token_required));
        }
        Message::Accepted { proof } => w.bytes(proof),
        Message::AuthResponse { mac } => w.bytes(mac),
        Message::Register {
            node_id,
            requested_rank,
            host_id,
            data_port,
            pid,
            hostname,
            worker_num,
        } => {
            w.opt_str(node_id.as_deref());
            match requested_rank {
                Some(r) => {
                    w.u8(1);
                    w.u32(*r);
                }
                None => w.u8(0),
            }
            w.str(host_id);
            w.u16(*data_port);
            w.u32(*pid);
            w.str(hostname);
            w.u32(*worker_num);
        }
        Message::Assign {
            rank,
            size,
            job_id,
            peers,
        } => {
            w.u32(*rank);
            w.u32(*size);
            w.str(job_id);
            w.u32(len_u32(peers.len()));
            for p in peers {
                w.u32(p.rank);
                w.str(&p.host_id);
                match p.ip {
                    IpAddr::V4(ip) => {
                        w.u8(4);
                        w.0.extend_from_slice(&ip.octets());
                    }
                    IpAddr::V6(ip) => {
                        w.u8(6);
                        w.0.extend_from_slice(&ip.octets());
                    }
                }
                w.u16(p.data_port);
                w.str(&p.node_id);
            }
        }
        Message::Heartbeat | Message::FinishAck => {}
        Message::Finish { status } => w.0.extend_from_slice(&status.to_le_bytes()),
        Message::Abort { lost_rank, reason } => {
            match lost_rank {
                Some(r) => {
                    w.u8(1);
                    w.u32(*r);
                }
                None => w.u8(0),
            }
            w.str(reason);
        }
        Message::Refused { reason } => w.str(reason),
    }
    let payload = w.0;
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(&MAGIC);
    out.push(msg.kind());
    out.extend_from_slice(&len_u32(payload.len()).to_le_bytes());
    out.extend_from_slice(&payload);
    out
}

fn len_u32(n: usize) -> u32 {
    // Strings and tables are bounded far below 4 GiB by construction (MAX_FRAME); saturate
    // rather than wrap so that an absurd length is rejected by the decoder, never misread.
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Decodes the first frame of `buf` with the [`MAX_FRAME`] limit: `Ok(None)` when more bytes
/// are needed, `Ok(Some((message, bytes consumed)))` for a whole frame, an error for garbage.
pub fn decode(buf: &[u8]) -> Result<Option<(Message, usize)>, FrameError> {
    decode_with_limit(buf, MAX_FRAME)
}

/// [`decode`] with an explicit payload limit. A bad magic or kind is reported as soon as its
/// bytes arrive, an oversized length as soon as the header is complete (before the payload).
pub fn decode_with_limit(
    buf: &[u8],
    max_payload: usize,
) -> Result<Option<(Message, usize)>, FrameError> {
    let seen = buf.len().min(MAGIC.len());
    if buf[..seen] != MAGIC[..seen] {
        return Err(FrameError::BadMagic {
            found: buf[..seen].to_vec(),
        });
    }
    if buf.len() < HEADER_LEN {
        if let Some(&kind) = buf.get(4) {
            if kind_name(kind).is_none() {
                return Err(FrameError::UnknownKind { kind });
            }
        }
        return Ok(None);
    }
    let kind = buf[4];
    let name = kind_name(kind).ok_or(FrameError::UnknownKind { kind })?;
    let len = u32::from_le_bytes([buf[5], buf[6], buf[7], buf[8]]) as usize;
    if len > max_payload {
        return Err(FrameError::TooLarge {
            kind: name,
            len,
            max: max_payload,
        });
    }
    let total = HEADER_LEN + len;
    if buf.len() < total {
        return Ok(None);
    }
    let msg = decode_payload(kind, name, &buf[HEADER_LEN..total])?;
    Ok(Some((msg, total)))
}

fn decode_payload(kind: u8, name: &'static str, payload: &[u8]) -> Result<Message, FrameError> {
    let mut r = Reader {
        buf: payload,
        pos: 0,
        kind: name,
    };
    let msg = match kind {
        1 => Message::Hello {
            protocol: r.u32()?,
            nonce: r.array()?,
        },
        2 => Message::Challenge {
            nonce: r.array()?,
            token_required: r.bool()?,
        },
        3 => Message::AuthResponse { mac: r.bytes()? },
        4 => Message::Register {
            node_id: r.opt_str()?,
            requested_rank: if r.bool()? { Some(r.u32()?) } else { None },
            host_id: r.str()?,
            data_port: r.u16()?,
            pid: r.u32()?,
            hostname: r.str()?,
            worker_num: r.u32()?,
        },
        5 => {
            let rank = r.u32()?;
            let size = r.u32()?;
            let job_id = r.str()?;
            let count = r.u32()? as usize;
            // Every entry takes at least 4 + 4 + 1 + 4 + 2 + 4 bytes: never reserve more
            // entries than the payload could hold.
            let mut peers = Vec::with_capacity(count.min(r.remaining() / 19));
            for _ in 0..count {
                let rank = r.u32()?;
                let host_id = r.str()?;
                let ip = match r.u8()? {
                    4 => IpAddr::V4(Ipv4Addr::from(r.array::<4>()?)),
                    6 => IpAddr::V6(Ipv6Addr::from(r.array::<16>()?)),
                    tag => {
                        return Err(r.error(format!("address family tag {tag}, expected 4 or 6")))
                    }
                };
                peers.push(PeerEntry {
                    rank,
                    host_id,
                    ip,
                    data_port: r.u16()?,
                    node_id: r.str()?,
                });
            }
            Message::Assign {
                rank,
                size,
                job_id,
                peers,
            }
        }
        6 => Message::Heartbeat,
        7 => Message::Finish {
            status: i32::from_le_bytes(r.array()?),
        },
        8 => Message::FinishAck,
        9 => Message::Abort {
            lost_rank: if r.bool()? { Some(r.u32()?) } else { None },
            reason: r.str()?,
        },
        10 => Message::Refused { reason: r.str()? },
        11 => Message::Accepted { proof: r.bytes()? },
        _ => return Err(FrameError::UnknownKind { kind }),
    };
    if r.remaining() != 0 {
        return Err(r.error(format!(
            "{} trailing bytes after the message",
            r.remaining()
        )));
    }
    Ok(msg)
}

struct Writer(Vec<u8>);

impl Writer {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn bytes(&mut self, v: &[u8]) {
        self.u32(len_u32(v.len()));
        self.0.extend_from_slice(v);
    }
    fn str(&mut self, v: &str) {
        self.bytes(v.as_bytes());
    }
    fn opt_str(&mut self, v: Option<&str>) {
        match v {
            Some(s) => {
                self.u8(1);
                self.str(s);
            }
            None => self.u8(0),
        }
    }
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    kind: &'static str,
}

impl Reader<'_> {
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }
    fn error(&self, reason: String) -> FrameError {
        FrameError::Malformed {
            kind: self.kind,
            offset: self.pos,
            reason,
        }
    }
    fn take(&mut self, n: usize, what: &str) -> Result<&[u8], FrameError> {
        if self.remaining() < n {
            return Err(self.error(format!(
                "{what} needs {n} bytes but only {} remain",
                self.remaining()
            )));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], FrameError> {
        let s = self.take(N, "a fixed-size field")?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, FrameError> {
        Ok(self.array::<1>()?[0])
    }
    fn u16(&mut self) -> Result<u16, FrameError> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    fn u32(&mut self) -> Result<u32, FrameError> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    fn bool(&mut self) -> Result<bool, FrameError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            t => Err(self.error(format!("flag byte {t}, expected 0 or 1"))),
        }
    }
    fn bytes(&mut self) -> Result<Vec<u8>, FrameError> {
        let n = self.u32()? as usize;
        Ok(self.take(n, "a byte string")?.to_vec())
    }
    fn str(&mut self) -> Result<String, FrameError> {
        let n = self.u32()? as usize;
        let start = self.pos;
        let s = self.take(n, "a string")?;
        match std::str::from_utf8(s) {
            Ok(s) => Ok(s.to_string()),
            Err(e) => {
                self.pos = start;
                Err(self.error(format!("string is not UTF-8: {e}")))
            }
        }
    }
    fn opt_str(&mut self) -> Result<Option<String>, FrameError> {
        if self.bool()? {
            Ok(Some(self.str()?))
        } else {
            Ok(None)
        }
    }
}

/// Why [`FrameReader::next`] failed.
#[derive(Debug)]
pub enum ReadError {
    /// The bytes are not a valid frame.
    Frame(FrameError),
    /// The connection failed.
    Io(std::io::Error),
    /// The connection closed in the middle of a frame.
    Truncated {
        /// Bytes of the partial frame.
        buffered: usize,
    },
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Frame(e) => write!(f, "{e}"),
            ReadError::Io(e) => f.write_str(&super::io_reason(e)),
            ReadError::Truncated { buffered } => write!(
                f,
                "the connection closed in the middle of a frame ({buffered} bytes received)"
            ),
        }
    }
}

/// Reads frames from any async reader. [`FrameReader::next`] is cancel-safe (it may be a
/// branch of `tokio::select!`): bytes read are kept in the reader's buffer.
#[derive(Debug)]
pub struct FrameReader<R> {
    inner: R,
    buf: Vec<u8>,
    max_payload: usize,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    /// A reader accepting payloads up to `max_payload` bytes.
    pub fn new(inner: R, max_payload: usize) -> Self {
        FrameReader {
            inner,
            buf: Vec::with_capacity(256),
            max_payload,
        }
    }

    /// The next message; `Ok(None)` at a clean end of stream (between frames).
    pub async fn next(&mut self) -> Result<Option<Message>, ReadError> {
        loop {
            match decode_with_limit(&self.buf, self.max_payload) {
                Ok(Some((msg, used))) => {
                    self.buf.drain(..used);
                    return Ok(Some(msg));
                }
                Ok(None) => {}
                Err(e) => return Err(ReadError::Frame(e)),
            }
            // Read at most what the current frame still needs (or a header's worth), so the
            // buffer never grows past one frame.
            let want = if self.buf.len() < HEADER_LEN {
                HEADER_LEN - self.buf.len()
            } else {
                let len = u32::from_le_bytes([self.buf[5], self.buf[6], self.buf[7], self.buf[8]])
                    as usize;
                HEADER_LEN + len - self.buf.len()
            };
            let mut limited = (&mut self.inner).take(want.min(64 << 10) as u64);
            let n = limited
                .read_buf(&mut self.buf)
                .await
                .map_err(ReadError::Io)?;
            if n == 0 {
                return if self.buf.is_empty() {
                    Ok(None)
                } else {
                    Err(ReadError::Truncated {
                        buffered: self.buf.len(),
                    })
                };
            }
        }
    }
}

/// Writes one message as a frame and flushes.
pub async fn write_message<W: AsyncWrite + Unpin>(w: &mut W, msg: &Message) -> std::io::Result<()> {
    w.write_all(&encode(msg)).await?;
    w.flush().await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples() -> Vec<Message> {
        vec![
            Message::Hello {
                protocol: PROTOCOL_VERSION,
                nonce: [7; NONCE_LEN],
            },
            Message::Challenge {
                nonce: [9; NONCE_LEN],
                token_required: true,
            },
            Message::Accepted {
                proof: vec![1, 2, 3],
            },
            Message::AuthResponse { mac: vec![0; 32] },
            Message::Register {
                node_id: Some("n3".into()),
                requested_rank: Some(3),
                host_id: "boot/net:[4026531840]".into(),
                data_port: 40000,
                pid: 1234,
                hostname: "h".into(),
                worker_num: 4,
            },
            Message::Register {
                node_id: None,
                requested_rank: None,
                host_id: String::new(),
                data_port: 0,
                pid: 0,
                hostname: String::new(),
                worker_num: 1,
            },
            Message::Assign {
                rank: 1,
                size: 2,
                job_id: "abc".into(),
                peers: vec![
                    PeerEntry {
                        rank: 0,
                        host_id: "x".into(),
                        ip: "10.0.0.1".parse().unwrap(),
                        data_port: 5,
                        node_id: "n0".into(),
                    },
                    PeerEntry {
                        rank: 1,
                        host_id: "y".into(),
                        ip: "::1".parse().unwrap(),
                        data_port: 6,
                        node_id: String::new(),
                    },
                ],
            },
            Message::Heartbeat,
            Message::Finish { status: -9 },
            Message::FinishAck,
            Message::Abort {
                lost_rank: Some(3),
                reason: "rank 3 was lost".into(),
            },
            Message::Abort {
                lost_rank: None,
                reason: "timeout".into(),
            },
            Message::Refused {
                reason: "wrong cluster token".into(),
            },
        ]
    }

    #[test]
    fn every_message_round_trips() {
        for msg in samples() {
            let bytes = encode(&msg);
            assert_eq!(decode(&bytes).unwrap(), Some((msg.clone(), bytes.len())));
            // Every strict prefix asks for more bytes.
            for cut in 0..bytes.len() {
                assert_eq!(decode(&bytes[..cut]).unwrap(), None, "{msg:?} cut at {cut}");
            }
        }
    }

    #[test]
    fn garbage_is_rejected_early() {
        assert!(matches!(
            decode(b"GET / HTTP/1.1\r\n"),
            Err(FrameError::BadMagic { .. })
        ));
        assert!(matches!(decode(b"SX"), Err(FrameError::BadMagic { .. })));
        assert_eq!(
            decode(b"SHCL\x63"),
            Err(FrameError::UnknownKind { kind: 0x63 })
        );
        let mut big = MAGIC.to_vec();
        big.push(4);
        big.extend_from_slice(&u32::MAX.to_le_bytes());
        let err = decode_with_limit(&big, MAX_CONTROL_FRAME).unwrap_err();
        assert_eq!(
            err.to_string(),
            "Register frame of 4294967295 bytes exceeds the limit of 65536 bytes"
        );
    }

    #[test]
    fn malformed_payloads_are_errors() {
        // A Heartbeat with a payload byte.
        let mut f = MAGIC.to_vec();
        f.extend_from_slice(&[6, 1, 0, 0, 0, 0]);
        assert!(matches!(decode(&f), Err(FrameError::Malformed { .. })));
        // A Refused whose string length runs past the payload.
        let mut f = MAGIC.to_vec();
        f.extend_from_slice(&[10, 4, 0, 0, 0, 0xff, 0xff, 0xff, 0x7f]);
        let err = decode(&f).unwrap_err().to_string();
        assert!(err.contains("malformed Refused payload"), "{err}");
        // An Assign announcing 4 billion peers in a short payload: no huge allocation.
        let mut p = Vec::new();
        p.extend_from_slice(&0u32.to_le_bytes());
        p.extend_from_slice(&1u32.to_le_bytes());
        p.extend_from_slice(&0u32.to_le_bytes());
        p.extend_from_slice(&u32::MAX.to_le_bytes());
        let mut f = MAGIC.to_vec();
        f.push(5);
        f.extend_from_slice(&(p.len() as u32).to_le_bytes());
        f.extend_from_slice(&p);
        assert!(matches!(decode(&f), Err(FrameError::Malformed { .. })));
    }

    #[tokio::test]
    async fn reader_reads_back_to_back_frames_and_reports_truncation() {
        let mut bytes = Vec::new();
        for m in samples() {
            bytes.extend_from_slice(&encode(&m));
        }
        let mut r = FrameReader::new(&bytes[..], MAX_FRAME);
        for m in samples() {
            assert_eq!(r.next().await.unwrap(), Some(m));
        }
        assert_eq!(r.next().await.unwrap(), None);
        let cut = &bytes[..bytes.len() - 1];
        let mut r = FrameReader::new(cut, MAX_FRAME);
        let mut last = Ok(None);
        for _ in 0..samples().len() {
            last = r.next().await;
        }
        assert!(matches!(last, Err(ReadError::Truncated { .. })));
    }
}
