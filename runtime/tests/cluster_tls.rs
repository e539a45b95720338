//! TLS for the cluster's control connections: configuration (PEM and PKCS#12), mutual-TLS
//! handshakes over real TCP sockets, CRLs, host-name checks, cipher lists and expiry.
//!
//! Every certificate, key and CRL is generated here (rcgen) into a temporary directory;
//! PKCS#12 files are written with p12-keystore and, where the `openssl` command exists,
//! with `openssl pkcs12 -export` (modern AES and legacy 3DES / RC2 encryption).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration as StdDuration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, CertificateRevocationListParams, DnType, IsCa, Issuer,
    KeyIdMethod, KeyPair, KeyUsagePurpose, RevocationReason, RevokedCertParams, SerialNumber,
};
use shardc_runtime::cluster::tls::{
    parse_cipher_list, server_name, ServerNameCheck, TlsError, TlsSettings,
};
use time::{Duration, OffsetDateTime};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A CA that can sign leaves and CRLs.
struct Ca {
    issuer: Issuer<'static, KeyPair>,
    pem: String,
}

fn new_ca(name: &str) -> Ca {
    let key = KeyPair::generate().expect("CA key");
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.not_before = OffsetDateTime::now_utc() - Duration::days(1);
    params.not_after = OffsetDateTime::now_utc() + Duration::days(3650);
    let cert = params.self_signed(&key).expect("CA self-signed");
    Ca {
        issuer: Issuer::new(params, key),
        pem: cert.pem(),
    }
}

/// A leaf certificate (PEM) and its key (PKCS#8 PEM).
struct Leaf {
    cert_pem: String,
    key_pem: String,
    cert_der: Vec<u8>,
    key_der: Vec<u8>,
}

struct LeafSpec<'a> {
    cn: &'a str,
    sans: Vec<String>,
    serial: u64,
    not_before: OffsetDateTime,
    not_after: OffsetDateTime,
}

impl<'a> LeafSpec<'a> {
    fn new(cn: &'a str, serial: u64) -> Self {
        LeafSpec {
            cn,
            sans: vec!["localhost".to_string(), "127.0.0.1".to_string()],
            serial,
            not_before: OffsetDateTime::now_utc() - Duration::days(1),
            not_after: OffsetDateTime::now_utc() + Duration::days(365),
        }
    }
}

fn new_leaf(ca: &Ca, spec: LeafSpec<'_>) -> Leaf {
    let key = KeyPair::generate().expect("leaf key");
    let mut params = CertificateParams::new(spec.sans).expect("leaf params");
    params.distinguished_name.push(DnType::CommonName, spec.cn);
    params.serial_number = Some(SerialNumber::from(spec.serial));
    params.not_before = spec.not_before;
    params.not_after = spec.not_after;
    let cert = params.signed_by(&key, &ca.issuer).expect("leaf signed");
    Leaf {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
        cert_der: cert.der().to_vec(),
        key_der: key.serialize_der(),
    }
}

fn crl_revoking(ca: &Ca, serials: &[u64]) -> String {
    let now = OffsetDateTime::now_utc();
    let params = CertificateRevocationListParams {
        this_update: now - Duration::days(1),
        next_update: now + Duration::days(30),
        crl_number: SerialNumber::from(1u64),
        issuing_distribution_point: None,
        revoked_certs: serials
            .iter()
            .map(|s| RevokedCertParams {
                serial_number: SerialNumber::from(*s),
                revocation_time: now - Duration::hours(1),
                reason_code: Some(RevocationReason::KeyCompromise),
                invalidity_date: None,
            })
            .collect(),
        key_identifier_method: KeyIdMethod::Sha256,
    };
    params
        .signed_by(&ca.issuer)
        .expect("CRL")
        .pem()
        .expect("CRL PEM")
}

fn write(dir: &Path, name: &str, contents: impl AsRef<[u8]>) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, contents).expect("write fixture");
    path
}

/// Writes `name.crt` and `name.key` for a leaf.
fn write_leaf(dir: &Path, name: &str, leaf: &Leaf) {
    write(dir, &format!("{name}.crt"), &leaf.cert_pem);
    write(dir, &format!("{name}.key"), &leaf.key_pem);
}

/// A config JSON with PEM identities `server.crt`/`server.key`, `client.crt`/`client.key`
/// and `ca.pem`, all relative to the config file, plus extra fields.
fn pem_config(extra: &str) -> String {
    format!(
        r#"{{
  "server_cert_path": "server.crt", "server_key_path": "server.key",
  "client_cert_path": "client.crt", "client_key_path": "client.key",
  "ca_cert_path": "ca.pem"{extra}
}}"#
    )
}

/// A directory with a CA and good server and client PEM identities.
fn good_pki() -> (tempfile::TempDir, Ca) {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = new_ca("shardc test CA");
    write(dir.path(), "ca.pem", &ca.pem);
    write_leaf(
        dir.path(),
        "server",
        &new_leaf(&ca, LeafSpec::new("scheduler", 10)),
    );
    write_leaf(
        dir.path(),
        "client",
        &new_leaf(&ca, LeafSpec::new("worker", 11)),
    );
    (dir, ca)
}

fn load(dir: &Path, json: &str) -> Result<TlsSettings, TlsError> {
    let path = write(dir, "ssl_config.json", json);
    TlsSettings::from_config_file(&path, None, None)
}

/// The outcome of one handshake + ping/pong: (server side, client side), with the cipher
/// suite the server negotiated.
struct Outcome {
    server: Result<String, String>,
    client: Result<(), String>,
}

/// Runs a TLS handshake over a real loopback TCP connection, then one message each way.
async fn handshake(server: &TlsSettings, client: &TlsSettings, host: &str) -> Outcome {
    let acceptor = server.acceptor().expect("acceptor");
    let connector = client.connector().expect("connector");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let server_task = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.map_err(|e| e.to_string())?;
        let mut tls = acceptor.accept(tcp).await.map_err(|e| e.to_string())?;
        let suite = tls
            .get_ref()
            .1
            .negotiated_cipher_suite()
            .map(|s| format!("{:?}", s.suite()))
            .unwrap_or_default();
        let mut buf = [0u8; 4];
        tls.read_exact(&mut buf).await.map_err(|e| e.to_string())?;
        if &buf != b"ping" {
            return Err(format!("server read {buf:?}"));
        }
        tls.write_all(b"pong").await.map_err(|e| e.to_string())?;
        tls.flush().await.map_err(|e| e.to_string())?;
        Ok::<String, String>(suite)
    });
    let name = server_name(host);
    let client_result = async {
        let tcp = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| e.to_string())?;
        let mut tls = connector
            .connect(name, tcp)
            .await
            .map_err(|e| e.to_string())?;
        tls.write_all(b"ping").await.map_err(|e| e.to_string())?;
        tls.flush().await.map_err(|e| e.to_string())?;
        let mut buf = [0u8; 4];
        tls.read_exact(&mut buf).await.map_err(|e| e.to_string())?;
        if &buf != b"pong" {
            return Err(format!("client read {buf:?}"));
        }
        Ok::<(), String>(())
    };
    let client = tokio::time::timeout(StdDuration::from_secs(20), client_result)
        .await
        .unwrap_or_else(|_| Err("client timed out".to_string()));
    let server = match tokio::time::timeout(StdDuration::from_secs(20), server_task).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => Err(format!("server task: {e}")),
        Err(_) => Err("server timed out".to_string()),
    };
    Outcome { server, client }
}

#[tokio::test]
async fn pem_mutual_tls_handshake_succeeds() {
    let (dir, _ca) = good_pki();
    let settings = load(dir.path(), &pem_config("")).expect("settings");
    assert!(settings.has_server_identity() && settings.has_client_identity());
    assert!(settings.warnings().is_empty(), "{:?}", settings.warnings());
    assert_eq!(settings.server_name_check(), ServerNameCheck::Auto);
    let out = handshake(&settings, &settings, "127.0.0.1").await;
    assert!(out.server.is_ok(), "server: {:?}", out.server);
    assert!(out.client.is_ok(), "client: {:?}", out.client);
    // By host name too (the certificate names localhost).
    let out = handshake(&settings, &settings, "localhost").await;
    assert!(
        out.server.is_ok() && out.client.is_ok(),
        "{:?} {:?}",
        out.server,
        out.client
    );
}

#[tokio::test]
async fn client_cert_from_another_ca_is_refused() {
    let (dir, _ca) = good_pki();
    let server = load(dir.path(), &pem_config("")).expect("server settings");
    // The rogue client trusts the real CA (so it accepts the server) but its own
    // certificate is signed by another CA.
    let rogue = new_ca("rogue CA");
    write_leaf(
        dir.path(),
        "rogue",
        &new_leaf(&rogue, LeafSpec::new("rogue", 12)),
    );
    let client = load(
        dir.path(),
        r#"{"client_cert_path": "rogue.crt", "client_key_path": "rogue.key", "ca_cert_path": "ca.pem"}"#,
    )
    .expect("rogue client settings");
    assert!(!client.has_server_identity());
    let out = handshake(&server, &client, "127.0.0.1").await;
    let err = out
        .server
        .expect_err("the server must refuse the rogue client");
    assert!(err.contains("UnknownIssuer"), "{err}");
    assert!(out.client.is_err(), "the client must see the refusal");
}

#[tokio::test]
async fn server_cert_from_another_ca_is_refused_by_the_client() {
    let (dir, _ca) = good_pki();
    let client = load(dir.path(), &pem_config("")).expect("client settings");
    let rogue = new_ca("rogue CA");
    write(dir.path(), "rogue_ca.pem", &rogue.pem);
    write_leaf(
        dir.path(),
        "rogue",
        &new_leaf(&rogue, LeafSpec::new("rogue", 13)),
    );
    let server = load(
        dir.path(),
        r#"{"server_cert_path": "rogue.crt", "server_key_path": "rogue.key", "ca_cert_path": "ca.pem"}"#,
    )
    .expect("rogue server settings");
    let out = handshake(&server, &client, "127.0.0.1").await;
    let err = out
        .client
        .expect_err("the client must refuse the rogue server");
    assert!(err.contains("UnknownIssuer"), "{err}");
    assert!(out.server.is_err());
}

#[tokio::test]
async fn revoked_client_cert_is_refused_and_good_one_accepted() {
    let (dir, ca) = good_pki();
    write_leaf(
        dir.path(),
        "revoked",
        &new_leaf(&ca, LeafSpec::new("revoked worker", 66)),
    );
    write(dir.path(), "ca.crl", crl_revoking(&ca, &[66]));
    let server = load(dir.path(), &pem_config(r#", "crl_path": "ca.crl""#)).expect("server");
    let good_client = load(dir.path(), &pem_config("")).expect("good client");
    let out = handshake(&server, &good_client, "127.0.0.1").await;
    assert!(
        out.server.is_ok() && out.client.is_ok(),
        "{:?} {:?}",
        out.server,
        out.client
    );

    let revoked = load(
        dir.path(),
        r#"{"client_cert_path": "revoked.crt", "client_key_path": "revoked.key", "ca_cert_path": "ca.pem"}"#,
    )
    .expect("revoked client settings load (revocation is checked by the peer)");
    let out = handshake(&server, &revoked, "127.0.0.1").await;
    let err = out.server.expect_err("revoked client must be refused");
    assert!(err.contains("Revoked"), "{err}");
}

#[tokio::test]
async fn revoked_server_cert_is_refused_by_the_client() {
    let (dir, ca) = good_pki();
    write_leaf(
        dir.path(),
        "server",
        &new_leaf(&ca, LeafSpec::new("scheduler", 77)),
    );
    write(dir.path(), "ca.crl", crl_revoking(&ca, &[77]));
    let settings = load(dir.path(), &pem_config(r#", "crl_path": "ca.crl""#)).expect("settings");
    let out = handshake(&settings, &settings, "127.0.0.1").await;
    let err = out.client.expect_err("revoked server must be refused");
    assert!(err.contains("Revoked"), "{err}");
}

#[tokio::test]
async fn server_name_checks_follow_the_setting() {
    let (dir, ca) = good_pki();
    // The certificate names localhost and 127.0.0.1: another name fails under Auto.
    let auto = load(dir.path(), &pem_config("")).expect("auto");
    let out = handshake(&auto, &auto, "10.11.12.13").await;
    let err = out.client.expect_err("name mismatch with SANs present");
    assert!(err.contains("not valid for name"), "{err}");
    // ... and passes with "verify_server_name": false.
    let never = load(dir.path(), &pem_config(r#", "verify_server_name": false"#)).expect("never");
    assert_eq!(never.server_name_check(), ServerNameCheck::Never);
    let out = handshake(&never, &never, "10.11.12.13").await;
    assert!(
        out.server.is_ok() && out.client.is_ok(),
        "{:?} {:?}",
        out.server,
        out.client
    );

    // A server certificate without SANs (MindSpore's usual case): accepted under Auto,
    // refused under "verify_server_name": true.
    let mut spec = LeafSpec::new("scheduler", 20);
    spec.sans = Vec::new();
    write_leaf(dir.path(), "server", &new_leaf(&ca, spec));
    let auto = load(dir.path(), &pem_config("")).expect("auto, no SAN");
    let out = handshake(&auto, &auto, "127.0.0.1").await;
    assert!(
        out.server.is_ok() && out.client.is_ok(),
        "{:?} {:?}",
        out.server,
        out.client
    );
    let always = load(dir.path(), &pem_config(r#", "verify_server_name": true"#)).expect("always");
    assert_eq!(always.server_name_check(), ServerNameCheck::Always);
    let out = handshake(&always, &always, "127.0.0.1").await;
    assert!(out.client.is_err(), "no SAN must fail under Always");
}

#[test]
fn server_name_parses_ips_and_dns_names() {
    assert_eq!(
        format!("{:?}", server_name("127.0.0.1")),
        "IpAddress(V4(Ipv4Addr([127, 0, 0, 1])))"
    );
    assert!(format!("{:?}", server_name("[::1]")).starts_with("IpAddress(V6"));
    assert!(format!("{:?}", server_name("node-3.cluster")).starts_with("DnsName"));
    // Not a valid name: no panic, an address no certificate names.
    assert!(
        format!("{:?}", server_name("bad host!")).starts_with("IpAddress(V4(Ipv4Addr([0, 0, 0, 0")
    );
}

/// Writes a PKCS#12 file with p12-keystore (PBES2 / AES-256, HMAC-SHA256).
fn write_p12_keystore(
    dir: &Path,
    name: &str,
    leaf: &Leaf,
    ca_pem: &str,
    password: &str,
) -> PathBuf {
    let ca_der = rustls_pki_types_ca_der(ca_pem);
    let chain = vec![
        p12_keystore::Certificate::from_der(&leaf.cert_der).expect("leaf der"),
        p12_keystore::Certificate::from_der(&ca_der).expect("ca der"),
    ];
    let mut store = p12_keystore::KeyStore::new();
    store.add_entry(
        name,
        p12_keystore::KeyStoreEntry::PrivateKeyChain(p12_keystore::PrivateKeyChain::new(
            leaf.key_der.clone(),
            [1u8, 2, 3, 4],
            chain,
        )),
    );
    let bytes = store.writer(password).write().expect("write p12");
    write(dir, &format!("{name}.p12"), bytes)
}

fn rustls_pki_types_ca_der(pem: &str) -> Vec<u8> {
    use rustls_pki_types::pem::PemObject;
    rustls_pki_types::CertificateDer::from_pem_slice(pem.as_bytes())
        .expect("CA PEM")
        .to_vec()
}

#[tokio::test]
async fn pkcs12_identities_from_p12_keystore() {
    let (dir, ca) = good_pki();
    let server_leaf = new_leaf(&ca, LeafSpec::new("scheduler", 30));
    let client_leaf = new_leaf(&ca, LeafSpec::new("worker", 31));
    write_p12_keystore(dir.path(), "server", &server_leaf, &ca.pem, "server-secret");
    write_p12_keystore(dir.path(), "client", &client_leaf, &ca.pem, "client-secret");
    let json = r#"{"server_cert_path": "server.p12", "client_cert_path": "client.p12",
                   "ca_cert_path": "ca.pem", "crl_path": ""}"#;
    let cfg = write(dir.path(), "ssl_config.json", json);
    let settings =
        TlsSettings::from_config_file(&cfg, Some("server-secret"), Some("client-secret"))
            .expect("p12 settings");
    let out = handshake(&settings, &settings, "127.0.0.1").await;
    assert!(
        out.server.is_ok() && out.client.is_ok(),
        "{:?} {:?}",
        out.server,
        out.client
    );

    // Wrong password: a clear error naming the file.
    let err = TlsSettings::from_config_file(&cfg, Some("wrong"), Some("client-secret"))
        .expect_err("wrong password");
    assert!(
        matches!(
            err,
            TlsError::WrongPassword {
                password_given: true,
                ..
            }
        ),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("wrong password") && msg.contains("server.p12"),
        "{msg}"
    );
    // No password at all.
    let err = TlsSettings::from_config_file(&cfg, Some("server-secret"), None).expect_err("none");
    let msg = err.to_string();
    assert!(
        msg.contains("client.p12") && msg.contains("no password was given"),
        "{msg}"
    );
}

#[test]
fn pkcs12_without_key_is_a_clear_error() {
    let (dir, ca) = good_pki();
    let mut store = p12_keystore::KeyStore::new();
    store.add_entry(
        "ca",
        p12_keystore::KeyStoreEntry::Certificate(
            p12_keystore::Certificate::from_der(&rustls_pki_types_ca_der(&ca.pem)).expect("der"),
        ),
    );
    write(
        dir.path(),
        "nokey.p12",
        store.writer("pw").write().expect("p12"),
    );
    let cfg = write(
        dir.path(),
        "ssl_config.json",
        r#"{"server_cert_path": "nokey.p12", "ca_cert_path": "ca.pem"}"#,
    );
    let err = TlsSettings::from_config_file(&cfg, Some("pw"), None).expect_err("no key");
    assert!(matches!(err, TlsError::NoPrivateKey { .. }), "{err:?}");
    assert!(err.to_string().contains("nokey.p12"), "{err}");
}

fn openssl_available() -> bool {
    Command::new("openssl")
        .arg("version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// `openssl pkcs12 -export` with extra options; false when openssl refuses them.
fn openssl_p12(dir: &Path, name: &str, password: &str, extra: &[&str]) -> bool {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(["pkcs12", "-export", "-in", &format!("{name}.crt"), "-inkey"])
        .arg(format!("{name}.key"))
        .args([
            "-certfile",
            "ca.pem",
            "-out",
            &format!("{name}.p12"),
            "-passout",
        ])
        .arg(format!("pass:{password}"))
        .args(extra)
        .output();
    match out {
        Ok(o) if o.status.success() => true,
        Ok(o) => {
            eprintln!(
                "openssl pkcs12 {extra:?} failed: {}",
                String::from_utf8_lossy(&o.stderr)
            );
            false
        }
        Err(e) => {
            eprintln!("openssl could not run: {e}");
            false
        }
    }
}

#[tokio::test]
async fn pkcs12_identities_from_openssl_modern_and_legacy() {
    if !openssl_available() {
        eprintln!("SKIPPED pkcs12_identities_from_openssl_modern_and_legacy: no `openssl` command");
        return;
    }
    let (dir, _ca) = good_pki();
    // OpenSSL 3's default (PBES2, AES-256-CBC, HMAC-SHA256), legacy 3DES with SHA-1 MAC,
    // and `-legacy` (RC2-40 for the certificates) which needs OpenSSL's legacy provider.
    let variants: [(&str, &[&str]); 3] = [
        ("default", &[]),
        (
            "3des",
            &[
                "-certpbe",
                "PBE-SHA1-3DES",
                "-keypbe",
                "PBE-SHA1-3DES",
                "-macalg",
                "sha1",
            ],
        ),
        ("legacy-rc2", &["-legacy"]),
    ];
    let mut tested = 0;
    for (label, extra) in variants {
        if !openssl_p12(dir.path(), "server", "s-pass", extra)
            || !openssl_p12(dir.path(), "client", "c-pass", extra)
        {
            eprintln!("SKIPPED openssl p12 variant {label}: openssl could not write it");
            continue;
        }
        let cfg = write(
            dir.path(),
            "ssl_config.json",
            r#"{"server_cert_path": "server.p12", "client_cert_path": "client.p12", "ca_cert_path": "ca.pem"}"#,
        );
        let settings = TlsSettings::from_config_file(&cfg, Some("s-pass"), Some("c-pass"))
            .unwrap_or_else(|e| panic!("openssl p12 variant {label}: {e}"));
        let out = handshake(&settings, &settings, "127.0.0.1").await;
        assert!(
            out.server.is_ok() && out.client.is_ok(),
            "{label}: {:?} {:?}",
            out.server,
            out.client
        );
        let err = TlsSettings::from_config_file(&cfg, Some("nope"), Some("c-pass"))
            .expect_err("wrong password");
        assert!(
            matches!(err, TlsError::WrongPassword { .. }),
            "{label}: {err:?}"
        );
        tested += 1;
    }
    assert!(
        tested >= 2,
        "the default and 3DES variants must be readable"
    );
}

#[test]
fn combined_pem_file_with_cert_and_key() {
    let (dir, ca) = good_pki();
    let leaf = new_leaf(&ca, LeafSpec::new("worker", 40));
    write(
        dir.path(),
        "both.pem",
        format!("{}{}", leaf.cert_pem, leaf.key_pem),
    );
    let settings = load(
        dir.path(),
        r#"{"client_cert_path": "both.pem", "ca_cert_path": "ca.pem"}"#,
    )
    .expect("combined PEM");
    assert!(settings.has_client_identity());
    let err = settings.server_config().expect_err("no server identity");
    assert!(matches!(err, TlsError::MissingIdentity { .. }), "{err:?}");
    assert!(err.to_string().contains("server_cert_path"), "{err}");

    // A PEM certificate alone, without a key: the error says where a key may go.
    write(dir.path(), "only.crt", &leaf.cert_pem);
    let err = load(
        dir.path(),
        r#"{"client_cert_path": "only.crt", "ca_cert_path": "ca.pem"}"#,
    )
    .expect_err("no key");
    let msg = err.to_string();
    assert!(
        msg.contains("only.crt") && msg.contains("client_key_path"),
        "{msg}"
    );

    // DER certificate and DER (PKCS#8) key files.
    write(dir.path(), "c.der", &leaf.cert_der);
    write(dir.path(), "c.key.der", &leaf.key_der);
    let settings = load(
        dir.path(),
        r#"{"client_cert_path": "c.der", "client_key_path": "c.key.der", "ca_cert_path": "ca.pem"}"#,
    )
    .expect("DER files");
    assert!(settings.client_config().is_ok());
    // A DER certificate without a key is reported as such, not as a bad PKCS#12 file.
    let err = load(
        dir.path(),
        r#"{"client_cert_path": "c.der", "ca_cert_path": "ca.pem"}"#,
    )
    .expect_err("DER without key");
    assert!(matches!(err, TlsError::NoPrivateKey { .. }), "{err:?}");
}

#[test]
fn expiry_warning_for_a_certificate_expiring_in_ten_days() {
    let (dir, ca) = good_pki();
    let mut spec = LeafSpec::new("short-lived worker", 50);
    spec.not_after = OffsetDateTime::now_utc() + Duration::days(10);
    write_leaf(dir.path(), "client", &new_leaf(&ca, spec));
    let settings = load(dir.path(), &pem_config("")).expect("settings");
    assert_eq!(settings.expire_warning_days(), 90);
    let warnings = settings.expiry_warnings(SystemTime::now());
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("client.crt"), "{}", warnings[0]);
    assert!(
        warnings[0].contains("short-lived worker"),
        "{}",
        warnings[0]
    );
    assert!(
        warnings[0].contains("in 9 day(s)") || warnings[0].contains("in 10 day(s)"),
        "{}",
        warnings[0]
    );

    // A threshold of 5 days: no warning now, one 6 days later, and an error 11 days later.
    let settings = load(
        dir.path(),
        &pem_config(r#", "cert_expire_warning_time_in_day": 5"#),
    )
    .expect("5 days");
    assert!(settings.expiry_warnings(SystemTime::now()).is_empty());
    let later = SystemTime::now() + StdDuration::from_secs(6 * 86_400);
    assert_eq!(settings.expiry_warnings(later).len(), 1);
    assert!(settings.check_validity(later).is_ok());
    let much_later = SystemTime::now() + StdDuration::from_secs(11 * 86_400);
    let err = settings
        .check_validity(much_later)
        .expect_err("expired by then");
    assert!(matches!(err, TlsError::CertificateExpired(_)), "{err:?}");
}

#[test]
fn expired_and_not_yet_valid_certificates_are_errors() {
    let (dir, ca) = good_pki();
    let mut spec = LeafSpec::new("old worker", 60);
    spec.not_before = OffsetDateTime::now_utc() - Duration::days(30);
    spec.not_after = OffsetDateTime::now_utc() - Duration::days(2);
    write_leaf(dir.path(), "client", &new_leaf(&ca, spec));
    let err = load(dir.path(), &pem_config("")).expect_err("expired");
    assert!(matches!(err, TlsError::CertificateExpired(_)), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains("client.crt") && msg.contains("expired on"),
        "{msg}"
    );

    let mut spec = LeafSpec::new("future worker", 61);
    spec.not_before = OffsetDateTime::now_utc() + Duration::days(3);
    write_leaf(dir.path(), "client", &new_leaf(&ca, spec));
    let err = load(dir.path(), &pem_config("")).expect_err("not yet valid");
    assert!(
        matches!(err, TlsError::CertificateNotYetValid(_)),
        "{err:?}"
    );
    assert!(err.to_string().contains("not valid before"), "{err}");
}

#[test]
fn cipher_list_maps_openssl_names() {
    // MindSpore's default list: DHE, PSK and CCM suites are skipped.
    let mindspore = "ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES128-GCM-SHA256:\
ECDHE-RSA-AES256-GCM-SHA384:ECDHE-ECDSA-AES256-GCM-SHA384:DHE-RSA-AES128-GCM-SHA256:\
DHE-DSS-AES128-GCM-SHA256:DHE-RSA-AES256-GCM-SHA384:DHE-DSS-AES256-GCM-SHA384:\
DHE-PSK-AES128-GCM-SHA256:DHE-PSK-AES256-GCM-SHA384:DHE-PSK-CHACHA20-POLY1305:\
ECDHE-RSA-CHACHA20-POLY1305:ECDHE-PSK-CHACHA20-POLY1305:DHE-RSA-AES128-CCM:DHE-RSA-AES256-CCM:\
DHE-RSA-CHACHA20-POLY1305:DHE-PSK-AES128-CCM:DHE-PSK-AES256-CCM:ECDHE-ECDSA-AES128-CCM:\
ECDHE-ECDSA-AES256-CCM:ECDHE-ECDSA-CHACHA20-POLY1305";
    let sel = parse_cipher_list(mindspore).expect("mindspore list");
    let names: Vec<&str> = sel
        .suites
        .iter()
        .map(|s| shardc_runtime::cluster::tls::cipher_name(*s))
        .collect();
    assert_eq!(
        names,
        [
            "TLS_AES_256_GCM_SHA384",
            "TLS_AES_128_GCM_SHA256",
            "TLS_CHACHA20_POLY1305_SHA256",
            "ECDHE-RSA-AES128-GCM-SHA256",
            "ECDHE-ECDSA-AES128-GCM-SHA256",
            "ECDHE-RSA-AES256-GCM-SHA384",
            "ECDHE-ECDSA-AES256-GCM-SHA384",
            "ECDHE-RSA-CHACHA20-POLY1305",
            "ECDHE-ECDSA-CHACHA20-POLY1305",
        ]
    );
    assert_eq!(sel.skipped.len(), 15, "{:?}", sel.skipped);
    assert!(sel
        .skipped
        .iter()
        .all(|n| n.contains("DHE-") || n.contains("CCM") || n.contains("PSK")));

    // Naming TLS 1.3 suites restricts TLS 1.3 to them (and without TLS 1.2 names, no 1.2).
    let sel =
        parse_cipher_list("TLS_CHACHA20_POLY1305_SHA256:TLS_AES_128_CCM_8_SHA256").expect("1.3");
    assert_eq!(sel.suites.len(), 1);
    assert_eq!(sel.skipped, ["TLS_AES_128_CCM_8_SHA256"]);
    // IANA names are accepted; an empty list means everything.
    assert_eq!(
        parse_cipher_list("TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256")
            .expect("iana")
            .suites
            .len(),
        4
    );
    assert_eq!(parse_cipher_list("").expect("empty").suites.len(), 9);

    // Nothing usable: an error naming the list.
    let err =
        parse_cipher_list("DHE-RSA-AES128-GCM-SHA256:TLS_AES_128_CCM_SHA256").expect_err("none");
    let msg = err.to_string();
    assert!(
        msg.contains("DHE-RSA-AES128-GCM-SHA256:TLS_AES_128_CCM_SHA256"),
        "{msg}"
    );
}

#[tokio::test]
async fn cipher_list_restricts_the_negotiated_suite() {
    let (dir, _ca) = good_pki();
    // Only TLS 1.2 (a TLS 1.3 name that rustls lacks turns TLS 1.3 off) with one suite.
    let settings = load(
        dir.path(),
        &pem_config(r#", "cipher_list": "TLS_AES_128_CCM_SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:DHE-RSA-AES128-GCM-SHA256""#),
    )
    .expect("settings");
    assert_eq!(
        settings.cipher_suite_names(),
        ["ECDHE-ECDSA-AES256-GCM-SHA384"]
    );
    assert_eq!(settings.warnings().len(), 1);
    assert!(
        settings.warnings()[0].contains("TLS_AES_128_CCM_SHA256:DHE-RSA-AES128-GCM-SHA256"),
        "{:?}",
        settings.warnings()
    );
    let out = handshake(&settings, &settings, "127.0.0.1").await;
    assert_eq!(
        out.server.as_deref(),
        Ok("TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384"),
        "{:?}",
        out.client
    );

    let chacha = load(
        dir.path(),
        &pem_config(r#", "cipher_list": "TLS_CHACHA20_POLY1305_SHA256""#),
    )
    .expect("chacha");
    let out = handshake(&chacha, &chacha, "127.0.0.1").await;
    assert_eq!(
        out.server.as_deref(),
        Ok("TLS13_CHACHA20_POLY1305_SHA256"),
        "{:?}",
        out.client
    );

    let err = load(
        dir.path(),
        &pem_config(r#", "cipher_list": "DHE-RSA-AES128-GCM-SHA256""#),
    )
    .expect_err("none");
    assert!(matches!(err, TlsError::NoUsableCiphers { .. }), "{err:?}");
}

#[test]
fn configuration_errors_name_the_file_or_field() {
    let (dir, ca) = good_pki();
    let msg = load(dir.path(), "{ not json")
        .expect_err("bad json")
        .to_string();
    assert!(
        msg.contains("ssl_config.json") && msg.contains("not valid JSON"),
        "{msg}"
    );

    let msg = load(
        dir.path(),
        &pem_config(r#", "cert_expire_warning_time_in_day": "ninety""#),
    )
    .expect_err("bad type")
    .to_string();
    assert!(msg.contains("cert_expire_warning_time_in_day"), "{msg}");

    let msg = load(dir.path(), &pem_config(r#", "verify_server_name": "yes""#))
        .expect_err("bad bool")
        .to_string();
    assert!(msg.contains("verify_server_name"), "{msg}");

    let msg = load(
        dir.path(),
        r#"{"server_cert_path": "server.crt", "server_key_path": "server.key"}"#,
    )
    .expect_err("no CA")
    .to_string();
    assert!(msg.contains("ca_cert_path"), "{msg}");

    let msg = load(dir.path(), r#"{"ca_cert_path": "ca.pem"}"#)
        .expect_err("no identity")
        .to_string();
    assert!(
        msg.contains("server_cert_path") && msg.contains("client_cert_path"),
        "{msg}"
    );

    let err = load(
        dir.path(),
        &pem_config("").replace("ca.pem", "missing-ca.pem"),
    )
    .expect_err("missing CA");
    assert!(matches!(err, TlsError::Read { .. }), "{err:?}");
    assert!(err.to_string().contains("missing-ca.pem"), "{err}");

    let missing = TlsSettings::from_config_file(&dir.path().join("absent.json"), None, None)
        .expect_err("absent");
    assert!(missing.to_string().contains("absent.json"), "{missing}");

    write(
        dir.path(),
        "broken.pem",
        "-----BEGIN CERTIFICATE-----\nMIIB\n",
    );
    let err = load(
        dir.path(),
        &pem_config("").replace("\"ca.pem\"", "\"broken.pem\""),
    )
    .expect_err("malformed");
    assert!(matches!(err, TlsError::Malformed { .. }), "{err:?}");
    assert!(err.to_string().contains("broken.pem"), "{err}");

    write(dir.path(), "garbage.crl", "not a crl");
    let err = load(dir.path(), &pem_config(r#", "crl_path": "garbage.crl""#)).expect_err("bad crl");
    assert!(err.to_string().contains("garbage.crl"), "{err}");

    // A key that does not belong to the certificate.
    let other = new_leaf(&ca, LeafSpec::new("other", 90));
    write(dir.path(), "server.key", &other.key_pem);
    let err = load(dir.path(), &pem_config("")).expect_err("key mismatch");
    assert!(err.to_string().contains("server.crt"), "{err}");

    // An encrypted PEM key is named as such.
    write(
        dir.path(),
        "server.key",
        "-----BEGIN ENCRYPTED PRIVATE KEY-----\nMIIB\n-----END ENCRYPTED PRIVATE KEY-----\n",
    );
    let err = load(dir.path(), &pem_config("")).expect_err("encrypted key");
    assert!(err.to_string().contains("encrypted"), "{err}");
}

#[test]
fn from_config_json_resolves_relative_paths_against_base_dir() {
    let (dir, _ca) = good_pki();
    let settings =
        TlsSettings::from_config_json(&pem_config(""), dir.path(), None, None).expect("json");
    assert!(settings.server_config().is_ok() && settings.client_config().is_ok());
    let err =
        TlsSettings::from_config_json(&pem_config(""), Path::new("/nonexistent-dir"), None, None)
            .expect_err("wrong base");
    assert!(err.to_string().contains("/nonexistent-dir/ca.pem"), "{err}");
}
