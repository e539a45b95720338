//! TLS for the cluster's control connections (scheduler <-> workers), configured like
//! MindSpore's `set_ps_context(enable_ssl=True, config_file_path=..., client_password=...,
//! server_password=...)`.
//!
//! # The configuration file
//!
//! A JSON object (other keys, such as MindSpore's `connection_num`, are ignored):
//!
//! | key | meaning |
//! | --- | --- |
//! | `server_cert_path` | the server's certificate and key: PKCS#12 (`.p12`/`.pfx`, opened with the server password), or a PEM/DER certificate (chain) whose key is in `server_key_path` or in the same PEM file |
//! | `server_key_path` | optional: the server's private key (PEM PKCS#8/PKCS#1/SEC1, or DER) |
//! | `client_cert_path`, `client_key_path` | the same for the client (worker) identity, opened with the client password |
//! | `ca_cert_path` | required: the CA certificate(s) (PEM, or one DER certificate) both sides are verified against |
//! | `crl_path` | optional (may be `""`): certificate revocation list(s), PEM or DER |
//! | `cipher_list` | optional: OpenSSL cipher names separated by `:` (see [`parse_cipher_list`]) |
//! | `cert_expire_warning_time_in_day` | optional integer, default 90: warn about certificates expiring within this many days |
//! | `verify_server_name` | optional boolean (see [`ServerNameCheck`]) |
//!
//! Relative paths are relative to the directory of the configuration file. At least one of
//! the server and client identities must be configured; both are loaded (and their
//! passwords checked) when the settings are built, so a wrong password or a broken file is
//! reported before any connection is made. A PKCS#12 file opened without a password is tried
//! with the empty password.
//!
//! # What is verified
//!
//! * The server ([`TlsSettings::server_config`]) requires a client certificate (mutual TLS),
//!   verified against the CA and, when `crl_path` is given, the CRL.
//! * The client ([`TlsSettings::client_config`]) verifies the server's chain against the CA
//!   (and the CRL), and presents its own certificate. The host name is checked as
//!   [`ServerNameCheck`] says: by default (`Auto`) only when the server certificate carries a
//!   subject alternative name, because MindSpore's clusters commonly use one certificate,
//!   issued without host names, on every node.
//! * With a CRL, the end-entity certificate's revocation status must be known: a CRL from
//!   the certificate's issuer must be among the configured ones (intermediates are not
//!   checked, as OpenSSL's `X509_V_FLAG_CRL_CHECK`).
//! * Certificates (identities and CAs) that are expired or not yet valid are an error when
//!   the settings are built; [`TlsSettings::expiry_warnings`] lists those expiring soon.
//!
//! Warnings found while loading (cipher names that were skipped) are returned by
//! [`TlsSettings::warnings`]; this module prints nothing, the caller logs them.
//!
//! # Use with tokio
//!
//! ```no_run
//! # async fn f(settings: &shardc_runtime::cluster::tls::TlsSettings,
//! #            tcp: tokio::net::TcpStream) -> Result<(), Box<dyn std::error::Error>> {
//! use shardc_runtime::cluster::tls;
//! let connector = settings.connector()?;
//! let stream = connector.connect(tls::server_name("10.0.0.1"), tcp).await?;
//! # drop(stream); Ok(()) }
//! ```

use super::env::ClusterEnv;
use super::ClusterError;
use std::fmt;
use std::io::{BufReader, Cursor};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{ring as ring_provider, CryptoProvider};
use rustls::server::WebPkiClientVerifier;
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig,
    SignatureScheme, SupportedCipherSuite, SupportedProtocolVersion,
};
use rustls_pki_types::pem::SectionKind;
use rustls_pki_types::{
    CertificateDer, CertificateRevocationListDer, PrivateKeyDer, PrivatePkcs1KeyDer,
    PrivatePkcs8KeyDer, PrivateSec1KeyDer, ServerName, UnixTime,
};
use serde_json::Value;
use x509_parser::prelude::{FromDer, X509Certificate};

/// The default of `cert_expire_warning_time_in_day` (MindSpore's default).
pub const DEFAULT_EXPIRE_WARNING_DAYS: u64 = 90;

const SECONDS_PER_DAY: i64 = 86_400;

/// Everything that can go wrong while loading TLS settings or building a rustls config.
/// Every variant names the file (or field) concerned and the reason.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read (missing, unreadable).
    #[error("TLS: cannot read {what} file {}: {source}", path.display())]
    Read {
        /// Which file this is (e.g. "ca_cert_path", "TLS config").
        what: String,
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The configuration is not valid JSON, or a field has the wrong type or value.
    #[error("TLS config {}: {reason}", path.display())]
    Config {
        /// The configuration file (or `<json>` when given as a string).
        path: PathBuf,
        /// What is wrong, naming the field.
        reason: String,
    },
    /// A PEM or DER file could not be decoded.
    #[error("TLS: {what} file {} is malformed: {reason}", path.display())]
    Malformed {
        /// Which file this is.
        what: String,
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A PKCS#12 file could not be decrypted with the given password.
    #[error("TLS: wrong password for PKCS#12 file {} ({field}{})", path.display(),
        if *password_given { "" } else { "; no password was given, so the empty password was tried" })]
    WrongPassword {
        /// The config field that named the file (`server_cert_path` / `client_cert_path`).
        field: String,
        /// The file.
        path: PathBuf,
        /// Whether a password was given at all.
        password_given: bool,
    },
    /// A certificate file holds no private key (and no key file was configured).
    #[error("TLS: {field} {} holds no private key{hint}", path.display())]
    NoPrivateKey {
        /// The config field that named the file.
        field: String,
        /// The file.
        path: PathBuf,
        /// A hint on where the key may be given.
        hint: String,
    },
    /// A file that must hold a certificate holds none.
    #[error("TLS: {field} {} holds no certificate", path.display())]
    NoCertificate {
        /// The config field that named the file.
        field: String,
        /// The file.
        path: PathBuf,
    },
    /// A certificate is past its `notAfter` date.
    #[error("TLS: certificate {} in {} expired on {} (valid {} to {}; now {})",
        .0.subject, .0.path.display(), .0.not_after, .0.not_before, .0.not_after, .0.now)]
    CertificateExpired(Box<CertDates>),
    /// A certificate's `notBefore` date is in the future.
    #[error("TLS: certificate {} in {} is not valid before {} (valid {} to {}; now {})",
        .0.subject, .0.path.display(), .0.not_before, .0.not_before, .0.not_after, .0.now)]
    CertificateNotYetValid(Box<CertDates>),
    /// No cipher suite of `cipher_list` is implemented by rustls.
    #[error("TLS: no usable cipher suite in cipher_list {list:?}: rustls (ring) implements none of them; it implements {}", supported_cipher_names().join(":"))]
    NoUsableCiphers {
        /// The configured list.
        list: String,
    },
    /// The server or client identity was asked for but is not configured.
    #[error("TLS config {}: {field} is not set, so no {role} TLS config can be built", path.display())]
    MissingIdentity {
        /// The configuration file.
        path: PathBuf,
        /// The missing field.
        field: String,
        /// "server" or "client".
        role: String,
    },
    /// rustls refused the material (e.g. key does not match the certificate, bad CRL).
    #[error("TLS: {what}: {reason}")]
    Rustls {
        /// What was being built, naming the files.
        what: String,
        /// rustls' reason.
        reason: String,
    },
}

/// The certificate named by [`TlsError::CertificateExpired`] and
/// [`TlsError::CertificateNotYetValid`], with its dates (RFC 2822 text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertDates {
    /// The file holding the certificate.
    pub path: PathBuf,
    /// The certificate's subject.
    pub subject: String,
    /// Start of validity.
    pub not_before: String,
    /// End of validity.
    pub not_after: String,
    /// The time of the check.
    pub now: String,
}

/// When the client checks the server certificate's host names against the host it dialled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerNameCheck {
    /// The default: check the name when the server certificate carries a subject alternative
    /// name (DNS name or IP address); a certificate without one is accepted on its chain and
    /// CRL alone (MindSpore's clusters use certificates without host names).
    Auto,
    /// `"verify_server_name": true`: always check; a certificate without SANs is refused.
    Always,
    /// `"verify_server_name": false`: never check the name (chain and CRL are still checked).
    Never,
}

/// The result of mapping an OpenSSL cipher list to rustls suites.
#[derive(Debug, Clone)]
pub struct CipherSelection {
    /// The suites to offer, in order: TLS 1.3 first, then TLS 1.2.
    pub suites: Vec<SupportedCipherSuite>,
    /// Names from the list that rustls does not implement (or does not know), skipped.
    pub skipped: Vec<String>,
}

/// (OpenSSL name, IANA name) of every suite the ring provider implements.
fn suite_table() -> [(&'static str, &'static str, SupportedCipherSuite); 9] {
    use ring_provider::cipher_suite as cs;
    [
        (
            "TLS_AES_256_GCM_SHA384",
            "TLS13_AES_256_GCM_SHA384",
            cs::TLS13_AES_256_GCM_SHA384,
        ),
        (
            "TLS_AES_128_GCM_SHA256",
            "TLS13_AES_128_GCM_SHA256",
            cs::TLS13_AES_128_GCM_SHA256,
        ),
        (
            "TLS_CHACHA20_POLY1305_SHA256",
            "TLS13_CHACHA20_POLY1305_SHA256",
            cs::TLS13_CHACHA20_POLY1305_SHA256,
        ),
        (
            "ECDHE-ECDSA-AES256-GCM-SHA384",
            "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
            cs::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
        ),
        (
            "ECDHE-ECDSA-AES128-GCM-SHA256",
            "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
            cs::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
        ),
        (
            "ECDHE-ECDSA-CHACHA20-POLY1305",
            "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
            cs::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
        ),
        (
            "ECDHE-RSA-AES256-GCM-SHA384",
            "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
            cs::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
        ),
        (
            "ECDHE-RSA-AES128-GCM-SHA256",
            "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
            cs::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
        ),
        (
            "ECDHE-RSA-CHACHA20-POLY1305",
            "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
            cs::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
        ),
    ]
}

/// The OpenSSL names of the suites rustls (ring provider) implements.
pub fn supported_cipher_names() -> Vec<&'static str> {
    suite_table().iter().map(|(name, _, _)| *name).collect()
}

/// The OpenSSL name of a rustls suite (e.g. `ECDHE-RSA-AES128-GCM-SHA256`), for logs.
pub fn cipher_name(suite: SupportedCipherSuite) -> &'static str {
    suite_table()
        .iter()
        .find(|(_, _, s)| s.suite() == suite.suite())
        .map_or("unknown", |(name, _, _)| *name)
}

fn is_tls13(suite: &SupportedCipherSuite) -> bool {
    matches!(suite, SupportedCipherSuite::Tls13(_))
}

/// Maps an OpenSSL cipher list (`NAME:NAME:...`, also `,` or blanks as separators; IANA
/// names such as `TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256` are accepted too) to the suites
/// of rustls' ring provider, in the list's order of preference.
///
/// * An empty list selects every suite rustls implements.
/// * Names rustls does not implement (`DHE-*`, PSK and CCM suites, CBC suites, keywords such
///   as `HIGH` or `!aNULL`) are skipped and returned in [`CipherSelection::skipped`].
/// * TLS 1.3 suites stay enabled (all three) unless the list names TLS 1.3 suites
///   explicitly (`TLS_AES_128_GCM_SHA256`, ...): then only those named are offered, as with
///   OpenSSL's separate `ciphersuites` setting. TLS 1.2 is enabled only when the list (or an
///   empty list) selects a TLS 1.2 suite.
/// * A non-empty list of which no name is implemented is [`TlsError::NoUsableCiphers`].
pub fn parse_cipher_list(list: &str) -> Result<CipherSelection, TlsError> {
    let table = suite_table();
    let names: Vec<&str> = list
        .split([':', ',', ' ', '\t', '\n'])
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    if names.is_empty() {
        return Ok(CipherSelection {
            suites: table.iter().map(|(_, _, s)| *s).collect(),
            skipped: Vec::new(),
        });
    }
    let mut named = Vec::<SupportedCipherSuite>::new();
    let mut skipped = Vec::new();
    let mut tls13_named = false;
    for name in names {
        let upper = name.to_ascii_uppercase();
        if upper.starts_with("TLS_AES_")
            || upper.starts_with("TLS_CHACHA20_")
            || upper.starts_with("TLS13_")
        {
            tls13_named = true;
        }
        match table
            .iter()
            .find(|(ossl, iana, _)| upper == *ossl || upper == *iana)
        {
            Some((_, _, suite)) => {
                if !named.iter().any(|s| s.suite() == suite.suite()) {
                    named.push(*suite);
                }
            }
            None => skipped.push(name.to_string()),
        }
    }
    if named.is_empty() {
        return Err(TlsError::NoUsableCiphers {
            list: list.to_string(),
        });
    }
    let mut suites: Vec<SupportedCipherSuite> = if tls13_named {
        named.iter().copied().filter(is_tls13).collect()
    } else {
        table.iter().map(|(_, _, s)| *s).filter(is_tls13).collect()
    };
    suites.extend(named.iter().copied().filter(|s| !is_tls13(s)));
    Ok(CipherSelection { suites, skipped })
}

/// The [`ServerName`] to pass to `TlsConnector::connect` for a host (the scheduler's
/// `MS_SCHED_HOST`): an IP address, or a DNS name. A string that is neither (which no
/// certificate could name) becomes the unspecified address `0.0.0.0`, so that a name
/// check, when one is made, fails rather than this function.
pub fn server_name(host: &str) -> ServerName<'static> {
    let host = host.trim();
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    ServerName::try_from(host.to_string()).unwrap_or_else(|_| {
        ServerName::IpAddress(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED).into())
    })
}

/// One certificate with the facts needed for validity checks and messages.
#[derive(Clone)]
struct CertInfo {
    path: PathBuf,
    subject: String,
    not_before: i64,
    not_after: i64,
    not_before_text: String,
    not_after_text: String,
}

impl CertInfo {
    fn dates(&self, now_s: i64) -> CertDates {
        CertDates {
            path: self.path.clone(),
            subject: self.subject.clone(),
            not_before: self.not_before_text.clone(),
            not_after: self.not_after_text.clone(),
            now: unix_text(now_s),
        }
    }
}

/// A certificate chain with its private key.
struct Identity {
    field: &'static str,
    cert_path: PathBuf,
    key_path: Option<PathBuf>,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
}

impl Identity {
    fn key_error(&self, role: &str, e: &rustls::Error) -> TlsError {
        let files = match &self.key_path {
            Some(k) => format!("{} and key {}", self.cert_path.display(), k.display()),
            None => format!("{} (certificate and key)", self.cert_path.display()),
        };
        let reason = match e {
            rustls::Error::InconsistentKeys(_) => {
                "the private key does not belong to the certificate".to_string()
            }
            other => other.to_string(),
        };
        TlsError::Rustls {
            what: format!("{role} identity {files}"),
            reason,
        }
    }
}

/// TLS settings loaded from MindSpore's SSL configuration file; builds the rustls configs
/// of both ends of the cluster's control connections. See the module documentation.
pub struct TlsSettings {
    config_path: PathBuf,
    ca_path: PathBuf,
    roots: Arc<RootCertStore>,
    crl_path: Option<PathBuf>,
    crls: Vec<CertificateRevocationListDer<'static>>,
    server: Option<Identity>,
    client: Option<Identity>,
    suites: Vec<SupportedCipherSuite>,
    warnings: Vec<String>,
    warn_days: u64,
    name_check: ServerNameCheck,
    certs: Vec<CertInfo>,
}

impl fmt::Debug for TlsSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsSettings")
            .field("config_path", &self.config_path)
            .field("ca_path", &self.ca_path)
            .field("crl_path", &self.crl_path)
            .field(
                "server_cert",
                &self.server.as_ref().map(|i| i.cert_path.clone()),
            )
            .field(
                "client_cert",
                &self.client.as_ref().map(|i| i.cert_path.clone()),
            )
            .field("cipher_suites", &self.cipher_suite_names())
            .field("warn_days", &self.warn_days)
            .field("name_check", &self.name_check)
            .finish_non_exhaustive()
    }
}

fn read_file(what: &str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        what: what.to_string(),
        path: path.to_path_buf(),
        source,
    })
}

fn malformed(what: &str, path: &Path, reason: impl Into<String>) -> TlsError {
    TlsError::Malformed {
        what: what.to_string(),
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

fn looks_like_pem(bytes: &[u8]) -> bool {
    bytes.windows(11).any(|w| w == b"-----BEGIN ")
}

fn pem_error_text(e: &rustls_pki_types::pem::Error) -> String {
    use rustls_pki_types::pem::Error as E;
    match e {
        E::MissingSectionEnd { end_marker } => format!(
            "bad PEM: no -----END {}----- line",
            String::from_utf8_lossy(end_marker)
        ),
        E::IllegalSectionStart { line } => format!(
            "bad PEM: malformed line {:?}",
            String::from_utf8_lossy(line).trim_end()
        ),
        E::Base64Decode(reason) => format!("bad PEM: invalid base64 ({reason})"),
        other => format!("bad PEM: {other}"),
    }
}

/// All PEM sections of a file, in order.
fn pem_sections(
    what: &str,
    path: &Path,
    bytes: &[u8],
) -> Result<Vec<(SectionKind, Vec<u8>)>, TlsError> {
    let mut reader = BufReader::new(Cursor::new(bytes));
    let mut out = Vec::new();
    loop {
        match rustls_pki_types::pem::from_buf(&mut reader) {
            Ok(Some(section)) => out.push(section),
            Ok(None) => return Ok(out),
            Err(e) => return Err(malformed(what, path, pem_error_text(&e))),
        }
    }
}

fn key_from_section(kind: SectionKind, der: Vec<u8>) -> Option<PrivateKeyDer<'static>> {
    match kind {
        SectionKind::PrivateKey => Some(PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(der))),
        SectionKind::RsaPrivateKey => Some(PrivateKeyDer::Pkcs1(PrivatePkcs1KeyDer::from(der))),
        SectionKind::EcPrivateKey => Some(PrivateKeyDer::Sec1(PrivateSec1KeyDer::from(der))),
        _ => None,
    }
}

fn check_encrypted_pem(what: &str, path: &Path, bytes: &[u8]) -> Result<(), TlsError> {
    let text = String::from_utf8_lossy(bytes);
    if text.contains("-----BEGIN ENCRYPTED PRIVATE KEY-----")
        || text.contains("Proc-Type: 4,ENCRYPTED")
    {
        return Err(malformed(
            what,
            path,
            "the private key is encrypted; give an unencrypted PEM key or a PKCS#12 file with a password",
        ));
    }
    Ok(())
}

/// Certificates of a PEM file (or one DER certificate). Returns the certificates and any
/// private key found in the same PEM file.
fn load_cert_file(
    what: &str,
    path: &Path,
) -> Result<(Vec<CertificateDer<'static>>, Option<PrivateKeyDer<'static>>), TlsError> {
    let bytes = read_file(what, path)?;
    if !looks_like_pem(&bytes) {
        if bytes.first() != Some(&0x30) {
            return Err(malformed(
                what,
                path,
                "neither PEM (no -----BEGIN line) nor a DER certificate",
            ));
        }
        return Ok((vec![CertificateDer::from(bytes)], None));
    }
    check_encrypted_pem(what, path, &bytes)?;
    let mut certs = Vec::new();
    let mut key = None;
    for (kind, der) in pem_sections(what, path, &bytes)? {
        if kind == SectionKind::Certificate {
            certs.push(CertificateDer::from(der));
        } else if key.is_none() {
            key = key_from_section(kind, der);
        }
    }
    Ok((certs, key))
}

fn load_key_file(what: &str, path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let bytes = read_file(what, path)?;
    if !looks_like_pem(&bytes) {
        return PrivateKeyDer::try_from(bytes)
            .map_err(|e| malformed(what, path, format!("not a PEM or DER private key: {e}")));
    }
    check_encrypted_pem(what, path, &bytes)?;
    pem_sections(what, path, &bytes)?
        .into_iter()
        .find_map(|(kind, der)| key_from_section(kind, der))
        .ok_or_else(|| malformed(what, path, "no PRIVATE KEY section"))
}

fn load_pkcs12(
    field: &'static str,
    path: &Path,
    bytes: &[u8],
    password: Option<&str>,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), TlsError> {
    let store = p12_keystore::KeyStore::from_pkcs12(bytes, password.unwrap_or("")).map_err(
        |e| match e {
            p12_keystore::error::Error::MacError(_) => TlsError::WrongPassword {
                field: field.to_string(),
                path: path.to_path_buf(),
                password_given: password.is_some(),
            },
            other => malformed(field, path, format!("not a readable PKCS#12 file: {other}")),
        },
    )?;
    let (_, chain) = store
        .private_key_chain()
        .ok_or_else(|| TlsError::NoPrivateKey {
            field: field.to_string(),
            path: path.to_path_buf(),
            hint: " (the PKCS#12 file has no key bag matching a certificate)".to_string(),
        })?;
    let certs: Vec<CertificateDer<'static>> = chain
        .chain()
        .iter()
        .map(|c| CertificateDer::from(c.as_der().to_vec()))
        .collect();
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            field: field.to_string(),
            path: path.to_path_buf(),
        });
    }
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(chain.key().to_vec()));
    Ok((certs, key))
}

fn load_identity(
    field: &'static str,
    key_field: &'static str,
    cert_path: &Path,
    key_path: Option<&Path>,
    password: Option<&str>,
) -> Result<Identity, TlsError> {
    let bytes = read_file(field, cert_path)?;
    let ext = cert_path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    // PKCS#12 when no key file is given and the file is named .p12/.pfx, or is neither PEM
    // nor named like a certificate file.
    let cert_like = matches!(ext.as_deref(), Some("crt" | "cer" | "der" | "pem"));
    let pkcs12 = key_path.is_none()
        && (matches!(ext.as_deref(), Some("p12" | "pfx"))
            || (!looks_like_pem(&bytes) && !cert_like));
    let (chain, key) = if pkcs12 {
        load_pkcs12(field, cert_path, &bytes, password)?
    } else {
        let (certs, inline_key) = load_cert_file(field, cert_path)?;
        let key = match key_path {
            Some(kp) => load_key_file(key_field, kp)?,
            None => inline_key.ok_or_else(|| TlsError::NoPrivateKey {
                field: field.to_string(),
                path: cert_path.to_path_buf(),
                hint: format!(" (set {key_field}, or use a PKCS#12 file)"),
            })?,
        };
        (certs, key)
    };
    if chain.is_empty() {
        return Err(TlsError::NoCertificate {
            field: field.to_string(),
            path: cert_path.to_path_buf(),
        });
    }
    Ok(Identity {
        field,
        cert_path: cert_path.to_path_buf(),
        key_path: key_path.map(Path::to_path_buf),
        chain,
        key,
    })
}

fn load_ca(path: &Path) -> Result<(Arc<RootCertStore>, Vec<CertificateDer<'static>>), TlsError> {
    let what = "ca_cert_path";
    let (certs, _) = load_cert_file(what, path)?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            field: what.to_string(),
            path: path.to_path_buf(),
        });
    }
    let mut roots = RootCertStore::empty();
    for cert in &certs {
        roots
            .add(cert.clone())
            .map_err(|e| malformed(what, path, format!("not a usable CA certificate: {e}")))?;
    }
    Ok((Arc::new(roots), certs))
}

fn load_crls(path: &Path) -> Result<Vec<CertificateRevocationListDer<'static>>, TlsError> {
    let what = "crl_path";
    let bytes = read_file(what, path)?;
    if !looks_like_pem(&bytes) {
        if bytes.first() != Some(&0x30) {
            return Err(malformed(what, path, "neither PEM nor a DER CRL"));
        }
        return Ok(vec![CertificateRevocationListDer::from(bytes)]);
    }
    let crls: Vec<_> = pem_sections(what, path, &bytes)?
        .into_iter()
        .filter(|(kind, _)| *kind == SectionKind::Crl)
        .map(|(_, der)| CertificateRevocationListDer::from(der))
        .collect();
    if crls.is_empty() {
        return Err(malformed(what, path, "no X509 CRL section"));
    }
    Ok(crls)
}

fn asn1_text(t: &x509_parser::time::ASN1Time) -> String {
    t.to_rfc2822().unwrap_or_else(|_| t.to_string())
}

fn unix_text(secs: i64) -> String {
    x509_parser::time::ASN1Time::from_timestamp(secs)
        .map(|t| asn1_text(&t))
        .unwrap_or_else(|_| format!("{secs} s since 1970"))
}

fn cert_info(path: &Path, what: &str, der: &CertificateDer<'_>) -> Result<CertInfo, TlsError> {
    let (_, cert) = X509Certificate::from_der(der.as_ref())
        .map_err(|e| malformed(what, path, format!("bad X.509 certificate: {e}")))?;
    let validity = cert.validity();
    Ok(CertInfo {
        path: path.to_path_buf(),
        subject: cert.subject().to_string(),
        not_before: validity.not_before.timestamp(),
        not_after: validity.not_after.timestamp(),
        not_before_text: asn1_text(&validity.not_before),
        not_after_text: asn1_text(&validity.not_after),
    })
}

fn unix_seconds(t: SystemTime) -> i64 {
    match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_secs()).unwrap_or(i64::MAX),
    }
}

/// Reads an optional string field; `""` counts as absent.
fn opt_str(
    obj: &serde_json::Map<String, Value>,
    key: &str,
    cfg: &Path,
) -> Result<Option<String>, TlsError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.trim().is_empty() => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.trim().to_string())),
        Some(other) => Err(TlsError::Config {
            path: cfg.to_path_buf(),
            reason: format!("field {key} must be a string, found {other}"),
        }),
    }
}

impl TlsSettings {
    /// Loads the settings from MindSpore's SSL configuration file. Relative paths in it are
    /// relative to the file's directory. The passwords open PKCS#12 files (MindSpore's
    /// `server_password` / `client_password`).
    pub fn from_config_file(
        path: &Path,
        server_password: Option<&str>,
        client_password: Option<&str>,
    ) -> Result<TlsSettings, TlsError> {
        let bytes = read_file("TLS config", path)?;
        let text = String::from_utf8(bytes).map_err(|_| TlsError::Config {
            path: path.to_path_buf(),
            reason: "not UTF-8 text".to_string(),
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        Self::load(&text, base, path, server_password, client_password)
    }

    /// Loads the settings from the text of a configuration file; relative paths are relative
    /// to `base_dir`.
    pub fn from_config_json(
        json: &str,
        base_dir: &Path,
        server_password: Option<&str>,
        client_password: Option<&str>,
    ) -> Result<TlsSettings, TlsError> {
        Self::load(
            json,
            base_dir,
            Path::new("<json>"),
            server_password,
            client_password,
        )
    }

    fn load(
        json: &str,
        base_dir: &Path,
        cfg: &Path,
        server_password: Option<&str>,
        client_password: Option<&str>,
    ) -> Result<TlsSettings, TlsError> {
        let config_err = |reason: String| TlsError::Config {
            path: cfg.to_path_buf(),
            reason,
        };
        let value: Value =
            serde_json::from_str(json).map_err(|e| config_err(format!("not valid JSON: {e}")))?;
        let Value::Object(obj) = value else {
            return Err(config_err("expected a JSON object".to_string()));
        };
        let resolve = |p: String| {
            let p = PathBuf::from(p);
            if p.is_absolute() {
                p
            } else {
                base_dir.join(p)
            }
        };
        let server_cert = opt_str(&obj, "server_cert_path", cfg)?.map(resolve);
        let server_key = opt_str(&obj, "server_key_path", cfg)?.map(resolve);
        let client_cert = opt_str(&obj, "client_cert_path", cfg)?.map(resolve);
        let client_key = opt_str(&obj, "client_key_path", cfg)?.map(resolve);
        let ca_path = opt_str(&obj, "ca_cert_path", cfg)?
            .map(resolve)
            .ok_or_else(|| config_err("field ca_cert_path is missing or empty: the CA certificate is required to verify peers".to_string()))?;
        let crl_path = opt_str(&obj, "crl_path", cfg)?.map(resolve);
        let cipher_list = opt_str(&obj, "cipher_list", cfg)?.unwrap_or_default();
        let warn_days = match obj.get("cert_expire_warning_time_in_day") {
            None | Some(Value::Null) => DEFAULT_EXPIRE_WARNING_DAYS,
            Some(v) => v.as_u64().ok_or_else(|| {
                config_err(format!(
                    "field cert_expire_warning_time_in_day must be a non-negative integer (days), found {v}"
                ))
            })?,
        };
        let name_check = match obj.get("verify_server_name") {
            None | Some(Value::Null) => ServerNameCheck::Auto,
            Some(Value::Bool(true)) => ServerNameCheck::Always,
            Some(Value::Bool(false)) => ServerNameCheck::Never,
            Some(v) => {
                return Err(config_err(format!(
                    "field verify_server_name must be true or false, found {v}"
                )))
            }
        };
        if server_key.is_some() && server_cert.is_none() {
            return Err(config_err(
                "server_key_path is set but server_cert_path is not".to_string(),
            ));
        }
        if client_key.is_some() && client_cert.is_none() {
            return Err(config_err(
                "client_key_path is set but client_cert_path is not".to_string(),
            ));
        }
        if server_cert.is_none() && client_cert.is_none() {
            return Err(config_err(
                "neither server_cert_path nor client_cert_path is set".to_string(),
            ));
        }

        let selection = parse_cipher_list(&cipher_list)?;
        let mut warnings = Vec::new();
        if !selection.skipped.is_empty() {
            warnings.push(format!(
                "TLS config {}: cipher_list: skipped {} name(s) that rustls does not implement: {}",
                cfg.display(),
                selection.skipped.len(),
                selection.skipped.join(":")
            ));
        }

        let (roots, ca_certs) = load_ca(&ca_path)?;
        let crls = match &crl_path {
            Some(p) => load_crls(p)?,
            None => Vec::new(),
        };
        let server = match &server_cert {
            Some(p) => Some(load_identity(
                "server_cert_path",
                "server_key_path",
                p,
                server_key.as_deref(),
                server_password,
            )?),
            None => None,
        };
        let client = match &client_cert {
            Some(p) => Some(load_identity(
                "client_cert_path",
                "client_key_path",
                p,
                client_key.as_deref(),
                client_password,
            )?),
            None => None,
        };

        let mut certs = Vec::new();
        for der in &ca_certs {
            certs.push(cert_info(&ca_path, "ca_cert_path", der)?);
        }
        for id in server.iter().chain(client.iter()) {
            for der in &id.chain {
                certs.push(cert_info(&id.cert_path, id.field, der)?);
            }
        }

        let settings = TlsSettings {
            config_path: cfg.to_path_buf(),
            ca_path,
            roots,
            crl_path,
            crls,
            server,
            client,
            suites: selection.suites,
            warnings,
            warn_days,
            name_check,
            certs,
        };
        settings.check_validity(SystemTime::now())?;
        // Build the configs once so that a key that does not match its certificate, or a
        // CRL rustls cannot use, is reported now.
        if settings.server.is_some() {
            settings.server_config()?;
        }
        if settings.client.is_some() {
            settings.client_config()?;
        }
        Ok(settings)
    }

    fn provider(&self) -> Arc<CryptoProvider> {
        Arc::new(CryptoProvider {
            cipher_suites: self.suites.clone(),
            ..ring_provider::default_provider()
        })
    }

    fn versions(&self) -> Vec<&'static SupportedProtocolVersion> {
        let mut versions = Vec::new();
        if self.suites.iter().any(is_tls13) {
            versions.push(&rustls::version::TLS13);
        }
        if self.suites.iter().any(|s| !is_tls13(s)) {
            versions.push(&rustls::version::TLS12);
        }
        versions
    }

    fn crl_text(&self) -> String {
        match &self.crl_path {
            Some(p) => format!(", CRL {}", p.display()),
            None => String::new(),
        }
    }

    /// The rustls config of the server end (the scheduler): presents the server certificate
    /// and requires a client certificate verified against the CA (and the CRL).
    pub fn server_config(&self) -> Result<Arc<ServerConfig>, TlsError> {
        let id = self
            .server
            .as_ref()
            .ok_or_else(|| TlsError::MissingIdentity {
                path: self.config_path.clone(),
                field: "server_cert_path".to_string(),
                role: "server".to_string(),
            })?;
        let provider = self.provider();
        let mut builder =
            WebPkiClientVerifier::builder_with_provider(self.roots.clone(), provider.clone());
        if !self.crls.is_empty() {
            builder = builder
                .with_crls(self.crls.iter().cloned())
                .only_check_end_entity_revocation();
        }
        let verifier = builder.build().map_err(|e| TlsError::Rustls {
            what: format!(
                "client certificate verifier (CA {}{})",
                self.ca_path.display(),
                self.crl_text()
            ),
            reason: e.to_string(),
        })?;
        let config = ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&self.versions())
            .map_err(|e| TlsError::Rustls {
                what: "server protocol versions".to_string(),
                reason: e.to_string(),
            })?
            .with_client_cert_verifier(verifier)
            .with_single_cert(id.chain.clone(), id.key.clone_key())
            .map_err(|e| id.key_error("server", &e))?;
        Ok(Arc::new(config))
    }

    /// The rustls config of the client end (a worker): verifies the server's chain against
    /// the CA (and the CRL), checks its name as [`ServerNameCheck`] says, and presents the
    /// client certificate.
    pub fn client_config(&self) -> Result<Arc<ClientConfig>, TlsError> {
        let id = self
            .client
            .as_ref()
            .ok_or_else(|| TlsError::MissingIdentity {
                path: self.config_path.clone(),
                field: "client_cert_path".to_string(),
                role: "client".to_string(),
            })?;
        let provider = self.provider();
        let mut builder =
            WebPkiServerVerifier::builder_with_provider(self.roots.clone(), provider.clone());
        if !self.crls.is_empty() {
            builder = builder
                .with_crls(self.crls.iter().cloned())
                .only_check_end_entity_revocation();
        }
        let inner = builder.build().map_err(|e| TlsError::Rustls {
            what: format!(
                "server certificate verifier (CA {}{})",
                self.ca_path.display(),
                self.crl_text()
            ),
            reason: e.to_string(),
        })?;
        let verifier = Arc::new(ClusterServerVerifier {
            inner,
            check: self.name_check,
        });
        let config = ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&self.versions())
            .map_err(|e| TlsError::Rustls {
                what: "client protocol versions".to_string(),
                reason: e.to_string(),
            })?
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_client_auth_cert(id.chain.clone(), id.key.clone_key())
            .map_err(|e| id.key_error("client", &e))?;
        Ok(Arc::new(config))
    }

    /// A `tokio_rustls::TlsAcceptor` over [`TlsSettings::server_config`].
    pub fn acceptor(&self) -> Result<tokio_rustls::TlsAcceptor, TlsError> {
        Ok(tokio_rustls::TlsAcceptor::from(self.server_config()?))
    }

    /// A `tokio_rustls::TlsConnector` over [`TlsSettings::client_config`]; connect with
    /// [`server_name`]`(scheduler_host)`.
    pub fn connector(&self) -> Result<tokio_rustls::TlsConnector, TlsError> {
        Ok(tokio_rustls::TlsConnector::from(self.client_config()?))
    }

    /// Warnings found while loading (cipher names skipped), for the caller to log.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// The OpenSSL names of the cipher suites offered, in order.
    pub fn cipher_suite_names(&self) -> Vec<&'static str> {
        self.suites.iter().map(|s| cipher_name(*s)).collect()
    }

    /// How the client checks the server's name.
    pub fn server_name_check(&self) -> ServerNameCheck {
        self.name_check
    }

    /// `cert_expire_warning_time_in_day`.
    pub fn expire_warning_days(&self) -> u64 {
        self.warn_days
    }

    /// Whether a server identity is configured.
    pub fn has_server_identity(&self) -> bool {
        self.server.is_some()
    }

    /// Whether a client identity is configured.
    pub fn has_client_identity(&self) -> bool {
        self.client.is_some()
    }

    /// Warnings for the certificates (identities and CAs) that expire within
    /// `cert_expire_warning_time_in_day` days of `now`, naming the file, the subject and the
    /// date; certificates already expired at `now` are listed too (see
    /// [`TlsSettings::check_validity`] for the error).
    pub fn expiry_warnings(&self, now: SystemTime) -> Vec<String> {
        let now_s = unix_seconds(now);
        let window = i64::try_from(self.warn_days)
            .unwrap_or(i64::MAX / SECONDS_PER_DAY)
            .saturating_mul(SECONDS_PER_DAY);
        let mut out = Vec::new();
        for c in &self.certs {
            let left = c.not_after.saturating_sub(now_s);
            if left < 0 {
                out.push(format!(
                    "TLS: certificate {} in {} expired on {}",
                    c.subject,
                    c.path.display(),
                    c.not_after_text
                ));
            } else if left <= window {
                out.push(format!(
                    "TLS: certificate {} in {} expires on {}, in {} day(s) (warning threshold {} days)",
                    c.subject,
                    c.path.display(),
                    c.not_after_text,
                    left / SECONDS_PER_DAY,
                    self.warn_days
                ));
            }
        }
        out
    }

    /// An error for the first certificate that is expired or not yet valid at `now`
    /// (checked at `SystemTime::now()` when the settings are built).
    pub fn check_validity(&self, now: SystemTime) -> Result<(), TlsError> {
        let now_s = unix_seconds(now);
        for c in &self.certs {
            if now_s > c.not_after {
                return Err(TlsError::CertificateExpired(Box::new(c.dates(now_s))));
            }
            if now_s < c.not_before {
                return Err(TlsError::CertificateNotYetValid(Box::new(c.dates(now_s))));
            }
        }
        Ok(())
    }
}

/// Whether a certificate carries a subject alternative name extension with any name.
fn has_subject_alt_names(der: &CertificateDer<'_>) -> bool {
    X509Certificate::from_der(der.as_ref())
        .ok()
        .and_then(|(_, cert)| {
            cert.subject_alternative_name()
                .ok()
                .flatten()
                .map(|ext| !ext.value.general_names.is_empty())
        })
        .unwrap_or(false)
}

/// The client's verifier: webpki's chain and CRL checks, then the name check as configured.
#[derive(Debug)]
struct ClusterServerVerifier {
    inner: Arc<WebPkiServerVerifier>,
    check: ServerNameCheck,
}

impl ServerCertVerifier for ClusterServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        // webpki checks the chain, validity and revocation before the name, so a name error
        // means everything else passed.
        match self.inner.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) if self.check == ServerNameCheck::Never
                || (self.check == ServerNameCheck::Auto && !has_subject_alt_names(end_entity)) =>
            {
                Ok(ServerCertVerified::assertion())
            }
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

// ---- The configurations a cluster environment names (`SHARDC_ENABLE_SSL`). ----

/// TLS for a worker's connection to the scheduler.
#[derive(Clone)]
pub struct WorkerTls {
    /// The client configuration (CA, client certificate, ciphers).
    pub config: Arc<rustls::ClientConfig>,
    /// The name the scheduler's certificate is checked against.
    pub server_name: rustls::pki_types::ServerName<'static>,
    /// The server identity of the same file, for the data-plane connections this worker
    /// accepts from higher ranks (`None` when the file names none; the data plane then
    /// cannot run with TLS).
    pub data_server: Option<Arc<rustls::ServerConfig>>,
}

impl fmt::Debug for WorkerTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkerTls")
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

/// Both sides' TLS configurations as named by the environment.
#[derive(Clone)]
pub struct TlsConfigs {
    /// The scheduler's configuration (`None` when the file names no server identity).
    pub server: Option<Arc<rustls::ServerConfig>>,
    /// The workers' configuration (`None` when the file names no client identity).
    pub client: Option<WorkerTls>,
}

/// The TLS configurations of `env` (`SHARDC_ENABLE_SSL` with `SHARDC_SSL_CONFIG`, loaded by
/// [`TlsSettings`]), or `None` without TLS. The loader's warnings (skipped
/// ciphers, certificates expiring soon) are printed to standard error.
pub fn tls_from_env(env: &ClusterEnv) -> Result<Option<TlsConfigs>, ClusterError> {
    let Some(t) = &env.tls else {
        return Ok(None);
    };
    let file = t.config_file.display().to_string();
    let fail = |e: TlsError| ClusterError::Tls {
        peer: format!("configuration {file}"),
        reason: e.to_string(),
    };
    let settings = TlsSettings::from_config_file(
        &t.config_file,
        t.server_password.as_deref(),
        t.client_password.as_deref(),
    )
    .map_err(fail)?;
    for w in settings
        .warnings()
        .iter()
        .cloned()
        .chain(settings.expiry_warnings(std::time::SystemTime::now()))
    {
        eprintln!("warning: TLS ({file}): {w}");
    }
    let server = if settings.has_server_identity() {
        Some(settings.server_config().map_err(fail)?)
    } else {
        None
    };
    let client = if settings.has_client_identity() {
        Some(WorkerTls {
            config: settings.client_config().map_err(fail)?,
            server_name: server_name(&env.sched_host),
            data_server: server.clone(),
        })
    } else {
        None
    };
    Ok(Some(TlsConfigs { server, client }))
}

fn missing_identity(env: &ClusterEnv, which: &str, key: &str) -> ClusterError {
    ClusterError::Tls {
        peer: format!(
            "configuration {}",
            env.tls
                .as_ref()
                .map(|t| t.config_file.display().to_string())
                .unwrap_or_default()
        ),
        reason: format!(
            "SHARDC_ENABLE_SSL is on but the file names no {which} certificate ({key})"
        ),
    }
}

/// The scheduler's TLS configuration from `env`, if TLS is enabled; an error when the file
/// names no server identity.
pub(crate) fn server_tls_from_env(
    env: &ClusterEnv,
) -> Result<Option<Arc<rustls::ServerConfig>>, ClusterError> {
    match tls_from_env(env)? {
        None => Ok(None),
        Some(TlsConfigs {
            server: Some(s), ..
        }) => Ok(Some(s)),
        Some(_) => Err(missing_identity(env, "server", "server_cert_path")),
    }
}

pub(crate) fn client_tls_from_env(env: &ClusterEnv) -> Result<Option<WorkerTls>, ClusterError> {
    match tls_from_env(env)? {
        None => Ok(None),
        Some(TlsConfigs {
            client: Some(c), ..
        }) => Ok(Some(c)),
        Some(_) => Err(missing_identity(env, "client", "client_cert_path")),
    }
}
