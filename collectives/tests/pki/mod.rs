//! Test certificates for the TLS data plane (shared by the tests that need them).

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use shardc_collectives::tcp::DataPlaneTls;
use shardc_runtime::cluster::tls::TlsSettings;
use std::path::Path;

/// Writes a CA, server and client certificates (for 127.0.0.1) and `ssl.json` into `dir`.
pub fn write_pki(dir: &Path, ca_name: &str) {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    ca.distinguished_name.push(DnType::CommonName, ca_name);
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    std::fs::write(dir.join("ca.pem"), ca_cert.pem()).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    for name in ["server", "client"] {
        let key = KeyPair::generate().unwrap();
        let mut p =
            CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
        p.distinguished_name.push(DnType::CommonName, name);
        let cert = p.signed_by(&key, &issuer).unwrap();
        std::fs::write(dir.join(format!("{name}.crt")), cert.pem()).unwrap();
        std::fs::write(dir.join(format!("{name}.key")), key.serialize_pem()).unwrap();
    }
    std::fs::write(
        dir.join("ssl.json"),
        r#"{"server_cert_path": "server.crt", "server_key_path": "server.key",
            "client_cert_path": "client.crt", "client_key_path": "client.key",
            "ca_cert_path": "ca.pem"}"#,
    )
    .unwrap();
}

/// The data-plane TLS of a PKI written by [`write_pki`].
pub fn tls(dir: &Path) -> DataPlaneTls {
    let s = TlsSettings::from_config_file(&dir.join("ssl.json"), None, None).unwrap();
    DataPlaneTls::new(s.server_config().unwrap(), s.client_config().unwrap())
}
