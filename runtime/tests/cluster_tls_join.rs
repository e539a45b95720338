//! The rendezvous over TLS, configured from the environment as `shardc launch` does
//! (`SHARDC_ENABLE_SSL`, `SHARDC_SSL_CONFIG`): workers with the right certificates join and
//! finish; a worker speaking plain TCP is closed out while the job completes.

mod cluster_common;

use cluster_common::*;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use shardc_runtime::cluster::{ClusterEnv, ClusterError, Scheduler, SchedulerConfig, WorkerConfig};
use std::collections::HashMap;
use std::path::Path;

fn write_pki(dir: &Path) {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    ca.distinguished_name
        .push(DnType::CommonName, "cluster test CA");
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

#[test]
fn workers_join_over_tls_and_plain_tcp_is_closed_out() {
    let dir = tempfile::tempdir().unwrap();
    write_pki(dir.path());
    let config = dir.path().join("ssl.json").display().to_string();
    let vars: HashMap<&str, String> = [
        ("MS_ROLE", "MS_WORKER".to_string()),
        ("MS_WORKER_NUM", "2".to_string()),
        ("MS_SCHED_PORT", "1".to_string()),
        ("SHARDC_CLUSTER_TOKEN", "tls-token".to_string()),
        ("SHARDC_ENABLE_SSL", "true".to_string()),
        ("SHARDC_SSL_CONFIG", config),
    ]
    .into_iter()
    .collect();
    let env = ClusterEnv::from_vars(&move |k| vars.get(k).cloned())
        .unwrap()
        .unwrap();
    let log = Log::default();
    let sink = log.clone();
    let sched_config = SchedulerConfig {
        timeouts: timeouts(),
        logger: std::sync::Arc::new(move |l: &str| sink.0.lock().unwrap().push(l.to_string())),
        ..SchedulerConfig::from_env(&env).unwrap()
    };
    assert!(sched_config.tls.is_some());
    let sched = Scheduler::bind("127.0.0.1:0", 2, sched_config)
        .unwrap()
        .spawn()
        .unwrap();
    let mut wc = WorkerConfig::from_env(&env).unwrap();
    assert!(wc.tls.is_some());
    wc.sched_port = sched.local_addr().port();
    wc.timeouts = timeouts();

    let first = spawn_worker(wc.clone());
    // Plain TCP to a TLS scheduler: that connection fails, nothing else does.
    let mut plain = wc.clone();
    plain.tls = None;
    let err = spawn_worker(plain).join().unwrap().err().unwrap();
    assert!(
        matches!(
            err,
            ClusterError::SchedulerLost { .. } | ClusterError::Protocol { .. }
        ),
        "{err:?}"
    );
    assert!(log.wait_for("TLS handshake failed"), "{:?}", log.lines());

    let second = spawn_worker(wc);
    let workers = [
        first.join().unwrap().unwrap(),
        second.join().unwrap().unwrap(),
    ];
    assert_eq!(workers[0].membership.peers, workers[1].membership.peers);
    for w in workers {
        w.membership.finish(0).unwrap();
    }
    assert_eq!(sched.wait().unwrap().workers.len(), 2);
}
