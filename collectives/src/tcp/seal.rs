//! Encryption of the TCP data plane when the cluster runs with TLS (`SHARDC_ENABLE_SSL`,
//! MindSpore's `enable_ssl`).
//!
//! # Handshake
//! After the plain handshake (job id, ranks, token proofs), the two ends run a TLS handshake
//! with the cluster's certificates: the accepting (lower) rank is the TLS server, the
//! connecting (higher) rank the client, and both sides present and verify certificates
//! against the cluster's CA (and CRL). The records of the handshake are read one at a time,
//! exactly, so TLS never consumes a byte that follows it. The server ends with a one-byte
//! confirmation inside TLS, so a client whose certificate the server refused reads the
//! server's alert instead of going on.
//!
//! # Records
//! Both sides then derive their keys from the TLS session with the standard exporter
//! (RFC 8446 §7.5; [`EXPORTER_LABEL`], the job id and both ranks as context) and HKDF-SHA256:
//! one AES-256-GCM key per direction and *epoch* of [`RECORDS_PER_KEY`] records, so no key
//! seals more than 2^24 records of at most [`MAX_RECORD`] bytes. A record is
//!
//! ```text
//! u32 length (little-endian; ciphertext + 16-byte tag) | ciphertext | tag
//! ```
//!
//! with the length as associated data and the record's number within its epoch as nonce, so
//! records that are altered, reordered, replayed or moved between directions or connections
//! fail to open. A record that fails to open breaks the connection (its peer is then lost,
//! as when the connection closes). The frames of `wire.rs` travel inside the records
//! unchanged; [`SealedWriter`] seals what is written when it is flushed (or a record fills),
//! and [`OpenedReader`] serves the opened bytes.

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
use ring::hkdf::{Prk, HKDF_SHA256};
use rustls::pki_types::ServerName;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;

/// The exporter label the keys are derived with.
pub const EXPORTER_LABEL: &[u8] = b"EXPORTER-shardc-data-plane-v1";
/// The most plaintext bytes in one record.
pub const MAX_RECORD: usize = 64 * 1024;
/// Records sealed under one key before both sides move to the next.
pub const RECORDS_PER_KEY: u64 = 1 << 24;
/// Bytes of an AES-GCM tag.
const TAG: usize = 16;
/// The largest TLS record a handshake may send (2^14 plus expansion).
const MAX_TLS_RECORD: usize = (1 << 14) + 2048;

/// The certificates a rank's data plane uses when the cluster runs with TLS: every rank
/// accepts connections from higher ranks (as a TLS server) and connects to lower ones (as a
/// client), so it needs both identities.
#[derive(Clone, Debug)]
pub struct DataPlaneTls {
    /// The server side (verifies the connecting rank's client certificate).
    pub server: Arc<rustls::ServerConfig>,
    /// The client side (verifies the accepting rank's server certificate).
    pub client: Arc<rustls::ClientConfig>,
}

impl DataPlaneTls {
    /// The two configurations; the server's is copied with session tickets off (a ticket
    /// would follow the handshake on the wire, where the sealed records start).
    pub fn new(server: Arc<rustls::ServerConfig>, client: Arc<rustls::ClientConfig>) -> Self {
        let mut s = (*server).clone();
        s.send_tls13_tickets = 0;
        DataPlaneTls {
            server: Arc::new(s),
            client,
        }
    }
}

/// The secret both ends of one connection derive their keys from.
pub(super) struct Secret {
    prk: Prk,
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// The exporter's context: the job and both ranks (sender-independent).
fn context(job_id: &str, lower: usize, higher: usize) -> Vec<u8> {
    let mut c = Vec::with_capacity(job_id.len() + 16);
    c.extend_from_slice(&(job_id.len() as u32).to_le_bytes());
    c.extend_from_slice(job_id.as_bytes());
    c.extend_from_slice(&(lower as u64).to_le_bytes());
    c.extend_from_slice(&(higher as u64).to_le_bytes());
    c
}

/// Reads exactly one TLS record from `s` and hands it to `conn`.
fn read_one_record(conn: &mut rustls::Connection, s: &mut TcpStream) -> Result<(), String> {
    let mut head = [0u8; 5];
    s.read_exact(&mut head)
        .map_err(|e| format!("reading the TLS handshake: {e}"))?;
    let len = u16::from_be_bytes([head[3], head[4]]) as usize;
    if len > MAX_TLS_RECORD {
        return Err(format!(
            "the peer did not answer with TLS (a record of {len} bytes)"
        ));
    }
    let mut rec = vec![0u8; 5 + len];
    rec[..5].copy_from_slice(&head);
    s.read_exact(&mut rec[5..])
        .map_err(|e| format!("reading the TLS handshake: {e}"))?;
    let mut rest: &[u8] = &rec;
    while !rest.is_empty() {
        conn.read_tls(&mut rest).map_err(|e| format!("TLS: {e}"))?;
    }
    if let Err(e) = conn.process_new_packets() {
        // Tell the peer why (the alert), then fail.
        let _ = conn.write_tls(s);
        return Err(format!("TLS: {e}"));
    }
    Ok(())
}

fn flush_tls(conn: &mut rustls::Connection, s: &mut TcpStream) -> Result<(), String> {
    while conn.wants_write() {
        conn.write_tls(s)
            .map_err(|e| format!("writing the TLS handshake: {e}"))?;
    }
    Ok(())
}

/// The exporter secret of a finished handshake.
fn secret(
    conn: &rustls::Connection,
    job_id: &str,
    lower: usize,
    higher: usize,
) -> Result<Secret, String> {
    let out = conn
        .export_keying_material(
            [0u8; 32],
            EXPORTER_LABEL,
            Some(&context(job_id, lower, higher)),
        )
        .map_err(|e| format!("TLS key export: {e}"))?;
    Ok(Secret {
        prk: Prk::new_less_safe(HKDF_SHA256, &out),
    })
}

/// The accepting side: a TLS server on `s`; `lower` is this rank, `higher` the peer.
pub(super) fn accept(
    tls: &DataPlaneTls,
    s: &mut TcpStream,
    job_id: &str,
    lower: usize,
    higher: usize,
) -> Result<Secret, String> {
    let mut conn: rustls::Connection = rustls::ServerConnection::new(tls.server.clone())
        .map_err(|e| format!("TLS: {e}"))?
        .into();
    loop {
        flush_tls(&mut conn, s)?;
        if !conn.is_handshaking() {
            break;
        }
        read_one_record(&mut conn, s)?;
    }
    let secret = secret(&conn, job_id, lower, higher)?;
    conn.writer()
        .write_all(&[1])
        .map_err(|e| format!("TLS: {e}"))?;
    flush_tls(&mut conn, s)?;
    Ok(secret)
}

/// The connecting side: a TLS client on `s` to the server at `name`; `higher` is this
/// rank, `lower` the peer.
pub(super) fn connect(
    tls: &DataPlaneTls,
    s: &mut TcpStream,
    name: ServerName<'static>,
    job_id: &str,
    lower: usize,
    higher: usize,
) -> Result<Secret, String> {
    let mut conn: rustls::Connection = rustls::ClientConnection::new(tls.client.clone(), name)
        .map_err(|e| format!("TLS: {e}"))?
        .into();
    loop {
        flush_tls(&mut conn, s)?;
        let mut ok = [0u8; 1];
        match conn.reader().read(&mut ok) {
            Ok(1) if ok[0] == 1 && !conn.is_handshaking() => break,
            Ok(0) => return Err("TLS: the peer closed the connection".into()),
            Ok(_) => return Err("TLS: unexpected data after the handshake".into()),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(format!("TLS: {e}")),
        }
        read_one_record(&mut conn, s)?;
    }
    secret(&conn, job_id, lower, higher)
}

/// The key sequence of one direction.
struct Keys {
    prk: Prk,
    from: usize,
    to: usize,
    epoch: u64,
    key: LessSafeKey,
    /// Records sealed (or opened) under `key`.
    count: u64,
}

impl Keys {
    fn new(secret: &Secret, from: usize, to: usize) -> io::Result<Keys> {
        let prk = secret.prk.clone();
        let key = derive(&prk, from, to, 0)?;
        Ok(Keys {
            prk,
            from,
            to,
            epoch: 0,
            key,
            count: 0,
        })
    }

    /// The key and nonce of the next record (moving to the next epoch's key when due).
    fn next(&mut self) -> io::Result<(&LessSafeKey, Nonce)> {
        if self.count == RECORDS_PER_KEY {
            self.key = derive(&self.prk, self.from, self.to, self.epoch + 1)?;
            self.epoch += 1;
            self.count = 0;
        }
        let mut n = [0u8; 12];
        n[4..].copy_from_slice(&self.count.to_be_bytes());
        self.count += 1;
        Ok((&self.key, Nonce::assume_unique_for_key(n)))
    }
}

/// The AES-256-GCM key of direction `from -> to`, epoch `epoch`.
fn derive(prk: &Prk, from: usize, to: usize, epoch: u64) -> io::Result<LessSafeKey> {
    let (f, t, e) = (
        (from as u64).to_le_bytes(),
        (to as u64).to_le_bytes(),
        epoch.to_le_bytes(),
    );
    let info: [&[u8]; 4] = [b"shardc data plane key", &f, &t, &e];
    let mut bytes = [0u8; 32];
    prk.expand(&info, &AES_256_GCM)
        .and_then(|okm| okm.fill(&mut bytes))
        .and_then(|()| UnboundKey::new(&AES_256_GCM, &bytes))
        .map(LessSafeKey::new)
        .map_err(|_| io::Error::other("deriving a data-plane key failed"))
}

/// Seals what is written into records on a stream (see the module doc). A frame must be
/// followed by [`Write::flush`].
pub(super) struct SealedWriter<W: Write> {
    inner: W,
    keys: Keys,
    /// The record being filled: 4 bytes of length, then plaintext.
    buf: Vec<u8>,
}

impl<W: Write> SealedWriter<W> {
    /// Seals the direction `from -> to` of the connection whose secret is `secret`.
    pub(super) fn new(inner: W, secret: &Secret, from: usize, to: usize) -> io::Result<Self> {
        Ok(SealedWriter {
            inner,
            keys: Keys::new(secret, from, to)?,
            buf: Vec::with_capacity(4 + MAX_RECORD + TAG),
        })
    }

    /// The underlying stream.
    pub(super) fn get_ref(&self) -> &W {
        &self.inner
    }

    fn seal(&mut self) -> io::Result<()> {
        if self.buf.len() <= 4 {
            return Ok(());
        }
        let len = (self.buf.len() - 4 + TAG) as u32;
        self.buf[..4].copy_from_slice(&len.to_le_bytes());
        let head = [self.buf[0], self.buf[1], self.buf[2], self.buf[3]];
        let (key, nonce) = self.keys.next()?;
        let tag = key
            .seal_in_place_separate_tag(nonce, Aad::from(head), &mut self.buf[4..])
            .map_err(|_| io::Error::other("sealing a record failed"))?;
        self.buf.extend_from_slice(tag.as_ref());
        let r = self.inner.write_all(&self.buf);
        self.buf.clear();
        r
    }
}

impl<W: Write> Write for SealedWriter<W> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.buf.is_empty() {
            self.buf.extend_from_slice(&[0; 4]);
        }
        let room = 4 + MAX_RECORD - self.buf.len();
        let n = data.len().min(room);
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() == 4 + MAX_RECORD {
            self.seal()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.seal()?;
        self.inner.flush()
    }
}

/// Opens the records of a stream sealed by the peer's [`SealedWriter`] and serves their
/// plaintext.
pub(super) struct OpenedReader<R: Read> {
    inner: R,
    keys: Keys,
    buf: Vec<u8>,
    /// The unread plaintext of the current record: `buf[pos..end]`.
    pos: usize,
    end: usize,
}

impl<R: Read> OpenedReader<R> {
    /// Opens the direction `from -> to` of the connection whose secret is `secret`.
    pub(super) fn new(inner: R, secret: &Secret, from: usize, to: usize) -> io::Result<Self> {
        Ok(OpenedReader {
            inner,
            keys: Keys::new(secret, from, to)?,
            buf: Vec::new(),
            pos: 0,
            end: 0,
        })
    }

    /// Reads and opens the next record; `Ok(false)` when the stream ended between records.
    fn fill(&mut self) -> io::Result<bool> {
        let mut head = [0u8; 4];
        if !crate::wire::read_head(&mut self.inner, &mut head, "a sealed record")? {
            return Ok(false);
        }
        let len = u32::from_le_bytes(head) as usize;
        if !(TAG + 1..=MAX_RECORD + TAG).contains(&len) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "a sealed record of {len} bytes (expected {}..={}): the stream is corrupt",
                    TAG + 1,
                    MAX_RECORD + TAG
                ),
            ));
        }
        self.buf.resize(len, 0);
        self.inner.read_exact(&mut self.buf)?;
        let (key, nonce) = self.keys.next()?;
        let plain = key
            .open_in_place(nonce, Aad::from(head), &mut self.buf)
            .map_err(|_| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    "a sealed record failed authentication: the data was altered in transit or \
                     does not come from the peer",
                )
            })?;
        self.pos = 0;
        self.end = plain.len();
        Ok(true)
    }
}

impl<R: Read> Read for OpenedReader<R> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if out.is_empty() {
            return Ok(0);
        }
        if self.pos == self.end && !self.fill()? {
            return Ok(0);
        }
        let n = out.len().min(self.end - self.pos);
        out[..n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(byte: u8) -> Secret {
        Secret {
            prk: Prk::new_less_safe(HKDF_SHA256, &[byte; 32]),
        }
    }

    fn read_all(r: &mut impl Read) -> io::Result<Vec<u8>> {
        let mut v = Vec::new();
        r.read_to_end(&mut v)?;
        Ok(v)
    }

    #[test]
    fn records_round_trip_and_hide_the_plaintext() {
        let s = secret(7);
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let mut w = SealedWriter::new(Vec::new(), &s, 1, 0).unwrap();
        w.write_all(b"frame one").unwrap();
        w.flush().unwrap();
        w.write_all(&data).unwrap();
        w.flush().unwrap();
        let wire = w.inner;
        // Four records: the short frame, then 64 KiB, 64 KiB, 64 KiB and the rest.
        assert_eq!(wire.len(), 9 + data.len() + 5 * (4 + TAG));
        assert!(!wire.windows(9).any(|x| x == b"frame one"));
        assert!(!wire.windows(64).any(|x| x == &data[1000..1064]));
        let mut r = OpenedReader::new(&wire[..], &s, 1, 0).unwrap();
        let got = read_all(&mut r).unwrap();
        assert_eq!(&got[..9], b"frame one");
        assert_eq!(&got[9..], &data[..]);
    }

    #[test]
    fn altered_reordered_or_misdirected_records_fail() {
        let s = secret(9);
        let mut w = SealedWriter::new(Vec::new(), &s, 2, 5).unwrap();
        w.write_all(b"first").unwrap();
        w.flush().unwrap();
        w.write_all(b"second").unwrap();
        w.flush().unwrap();
        let wire = w.inner;
        let first = 4 + 5 + TAG;
        let fails = |bytes: &[u8], sec: &Secret, from: usize, to: usize| {
            let mut r = OpenedReader::new(bytes, sec, from, to).unwrap();
            let e = read_all(&mut r).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
        };
        // A flipped bit in the ciphertext.
        let mut altered = wire.clone();
        altered[6] ^= 1;
        fails(&altered, &s, 2, 5);
        // The second record first (a replay or reordering).
        let swapped = [&wire[first..], &wire[..first]].concat();
        fails(&swapped, &s, 2, 5);
        // The other direction's keys, and another connection's secret.
        fails(&wire, &s, 5, 2);
        fails(&wire, &secret(10), 2, 5);
        // A corrupt length.
        let mut long = wire.clone();
        long[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        fails(&long, &s, 2, 5);
        // Cut in the middle of a record: an unexpected end, not a clean close.
        let mut r = OpenedReader::new(&wire[..first + 3], &s, 2, 5).unwrap();
        let e = read_all(&mut r).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn keys_change_every_epoch_on_both_sides() {
        let s = secret(3);
        let mut a = Keys::new(&s, 0, 1).unwrap();
        let mut b = Keys::new(&s, 0, 1).unwrap();
        a.count = RECORDS_PER_KEY - 1;
        b.count = RECORDS_PER_KEY - 1;
        let seal = |k: &mut Keys, data: &mut Vec<u8>| {
            let (key, nonce) = k.next().unwrap();
            let tag = key
                .seal_in_place_separate_tag(nonce, Aad::empty(), data)
                .unwrap();
            data.extend_from_slice(tag.as_ref());
        };
        let open = |k: &mut Keys, data: &mut Vec<u8>| -> bool {
            let (key, nonce) = k.next().unwrap();
            key.open_in_place(nonce, Aad::empty(), data).is_ok()
        };
        // The last record of epoch 0, then the first of epoch 1: both sides follow.
        for _ in 0..2 {
            let mut d = b"x".to_vec();
            seal(&mut a, &mut d);
            assert!(open(&mut b, &mut d));
        }
        assert_eq!((a.epoch, a.count), (1, 1));
        // A record sealed under epoch 1's key does not open under epoch 0's.
        let mut fresh = Keys::new(&s, 0, 1).unwrap();
        let mut d = b"y".to_vec();
        seal(&mut a, &mut d);
        fresh.count = 1;
        assert!(!open(&mut fresh, &mut d));
    }
}
