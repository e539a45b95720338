//! The shared cluster token and the challenge-response built on it.
//!
//! The scheduler sends a random nonce; the worker answers `HMAC-SHA256(token, nonce ||
//! "shardc-cluster-v1")`, which the scheduler compares in constant time. The scheduler also
//! proves that it knows the token: it answers the worker's nonce with `HMAC-SHA256(token,
//! nonce || "shardc-cluster-v1/scheduler")`, so a worker never takes a rank table from an
//! impostor. The token itself never crosses the wire.

use super::frame::NONCE_LEN;
use super::ClusterError;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::path::Path;
use subtle::ConstantTimeEq;

/// The label appended to the scheduler's nonce in a worker's answer.
pub const WORKER_LABEL: &[u8] = b"shardc-cluster-v1";

/// The label appended to the worker's nonce in the scheduler's proof.
pub const SCHEDULER_LABEL: &[u8] = b"shardc-cluster-v1/scheduler";

/// Length of a MAC (SHA-256).
pub const MAC_LEN: usize = 32;

/// The shared secret that workers and the scheduler of one job know. `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(Vec<u8>);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Token(<{} bytes>)", self.0.len())
    }
}

impl Token {
    /// A token from its bytes; `source_name` (e.g. `SHARDC_CLUSTER_TOKEN`) names it in
    /// errors. Surrounding whitespace is trimmed; an empty token is refused.
    pub fn new(bytes: &[u8], source_name: &str) -> Result<Token, ClusterError> {
        let trimmed = bytes.trim_ascii();
        if trimmed.is_empty() {
            return Err(ClusterError::Token {
                source_name: source_name.to_string(),
                reason:
                    "the token is empty; use a long random string (e.g. `openssl rand -hex 32`)"
                        .to_string(),
            });
        }
        Ok(Token(trimmed.to_vec()))
    }

    /// Reads a token file (contents trimmed). Refused: an unreadable or empty file, and on
    /// Unix a file that users other than its owner may read or write (`chmod 600` it).
    pub fn from_file(path: &Path) -> Result<Token, ClusterError> {
        let name = path.display().to_string();
        let fail = |reason: String| ClusterError::Token {
            source_name: format!("file {name}"),
            reason,
        };
        let meta = std::fs::metadata(path)
            .map_err(|e| fail(format!("cannot read it: {}", super::io_reason(&e))))?;
        if !meta.is_file() {
            return Err(fail("it is not a regular file".to_string()));
        }
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = meta.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                return Err(fail(format!(
                    "it is accessible by other users (mode {mode:04o}); run `chmod 600 {name}`"
                )));
            }
        }
        let bytes = std::fs::read(path)
            .map_err(|e| fail(format!("cannot read it: {}", super::io_reason(&e))))?;
        Token::new(&bytes, &format!("file {name}"))
    }

    /// The token's bytes (for the data plane's handshake).
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// `HMAC-SHA256(token, nonce || label)`.
    pub fn mac(&self, nonce: &[u8], label: &[u8]) -> [u8; MAC_LEN] {
        // HMAC accepts keys of any length: `new_from_slice` cannot fail for it.
        let mut m = match <Hmac<Sha256> as Mac>::new_from_slice(&self.0) {
            Ok(m) => m,
            Err(_) => unreachable!("HMAC-SHA256 takes keys of any length"),
        };
        m.update(nonce);
        m.update(label);
        m.finalize().into_bytes().into()
    }

    /// Whether `mac` is `HMAC-SHA256(token, nonce || label)`, compared in constant time.
    pub fn verify(&self, nonce: &[u8], label: &[u8], mac: &[u8]) -> bool {
        let expected = self.mac(nonce, label);
        // Length is public (always MAC_LEN for an honest peer); the bytes are compared in
        // constant time.
        mac.len() == MAC_LEN && bool::from(expected.ct_eq(mac))
    }
}

/// A fresh random nonce.
pub fn nonce() -> [u8; NONCE_LEN] {
    rand::random()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs_verify_only_with_the_same_token_nonce_and_label() {
        let t = Token::new(b"  secret\n", "test").unwrap();
        assert_eq!(t.as_bytes(), b"secret");
        let n = nonce();
        let mac = t.mac(&n, WORKER_LABEL);
        assert!(t.verify(&n, WORKER_LABEL, &mac));
        assert!(!t.verify(&n, SCHEDULER_LABEL, &mac));
        assert!(!t.verify(&nonce(), WORKER_LABEL, &mac));
        assert!(!t.verify(&n, WORKER_LABEL, &mac[..31]));
        let other = Token::new(b"secret2", "test").unwrap();
        assert!(!other.verify(&n, WORKER_LABEL, &mac));
        assert_eq!(format!("{t:?}"), "Token(<6 bytes>)");
    }

    #[test]
    fn empty_tokens_are_refused() {
        let e = Token::new(b" \n", "SHARDC_CLUSTER_TOKEN").unwrap_err();
        assert!(e
            .to_string()
            .starts_with("cluster token SHARDC_CLUSTER_TOKEN: the token is empty"));
    }

    #[cfg(unix)]
    #[test]
    fn token_files_must_be_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "abc\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = Token::from_file(&path).unwrap_err().to_string();
        assert!(e.contains("mode 0644") && e.contains("chmod 600"), "{e}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(Token::from_file(&path).unwrap().as_bytes(), b"abc");
        let e = Token::from_file(&dir.path().join("missing"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("cannot read it: no such file or directory"),
            "{e}"
        );
    }
}
