//! The handshake that opens a TCP data connection: the connecting (higher) rank's
//! [`Hello`] (magic, ranks, world size, job id, a nonce, whether it holds a token and wants
//! TLS), the acceptor's status (accepted with its nonce and proof, or refused with a
//! reason), and the connector's proof: HMAC-SHA256 under the cluster token over the
//! connection's identity and both nonces, compared in constant time.

use crate::wire::{bad, MAX_REASON};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::io::{self, Read, Write};
use subtle::ConstantTimeEq;

/// Opens every handshake message.
pub(super) const HELLO_MAGIC: [u8; 8] = *b"SHDCTCP1";
/// The longest job id.
pub(super) const MAX_JOB_ID: usize = 255;

/// The first handshake message, from the connecting (higher) rank.
#[derive(Clone, Debug)]
pub(super) struct Hello {
    pub from: u32,
    pub to: u32,
    pub size: u32,
    pub has_token: bool,
    /// The connection continues with TLS and sealed records (see `seal.rs`).
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
