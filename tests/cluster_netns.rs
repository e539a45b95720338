//! Two hosts for real: two network namespaces joined by a veth pair, one `shardc launch` per
//! namespace (the scheduler on node 0), every collective run across the virtual link. Each
//! namespace is its own host to shardc (its host id includes the network namespace), so
//! groups that span both go over TCP. Skips with a message where namespaces cannot be made
//! (not root, no `ip`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Runs `program args` (in `dir` when given); its standard error on failure.
fn tool(program: &str, args: &[&str], dir: Option<&Path>) -> Result<(), String> {
    let mut c = Command::new(program);
    c.args(args);
    if let Some(d) = dir {
        c.current_dir(d);
    }
    let o = c.output().map_err(|e| format!("{program}: {e}"))?;
    if o.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&o.stderr).trim()
        ))
    }
}

fn ip(args: &[&str]) -> Result<(), String> {
    tool("ip", args, None)
}

/// Two namespaces `a` and `b` with a veth pair `10.77.R.1` <-> `10.77.R.2`; removed on drop.
struct TwoHosts {
    a: String,
    b: String,
    addr_a: String,
    addr_b: String,
}

impl TwoHosts {
    fn new() -> Result<TwoHosts, String> {
        let id = std::process::id() % 100_000;
        let (a, b) = (format!("shc{id}a"), format!("shc{id}b"));
        let subnet = 16 + id % 200;
        let hosts = TwoHosts {
            addr_a: format!("10.77.{subnet}.1"),
            addr_b: format!("10.77.{subnet}.2"),
            a,
            b,
        };
        ip(&["netns", "add", &hosts.a])?;
        ip(&["netns", "add", &hosts.b])?;
        let (va, vb) = (format!("v{id}a"), format!("v{id}b"));
        ip(&["link", "add", &va, "type", "veth", "peer", "name", &vb])?;
        ip(&["link", "set", &va, "netns", &hosts.a])?;
        ip(&["link", "set", &vb, "netns", &hosts.b])?;
        for (ns, dev, addr) in [
            (&hosts.a, &va, &hosts.addr_a),
            (&hosts.b, &vb, &hosts.addr_b),
        ] {
            ip(&["-n", ns, "addr", "add", &format!("{addr}/24"), "dev", dev])?;
            ip(&["-n", ns, "link", "set", dev, "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(hosts)
    }

    /// Bytes sent by namespace `ns`'s veth end.
    fn tx_bytes(&self, ns: &str) -> u64 {
        let o = Command::new("ip")
            .args(["-n", ns, "-s", "-o", "link", "show", "type", "veth"])
            .output()
            .unwrap();
        // `... TX: bytes packets ... \    <bytes> <packets> ...`
        let t = String::from_utf8_lossy(&o.stdout).to_string();
        let after = t.split("TX:").nth(1).unwrap_or("");
        after
            .split('\\')
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for TwoHosts {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.a]);
        let _ = ip(&["netns", "del", &self.b]);
    }
}

fn tmp(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("shardc-netns-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn launch_in(
    ns: &str,
    node: usize,
    master: &str,
    token: &Path,
    log: &Path,
    tls: Option<&Path>,
) -> std::process::Child {
    let mut c = Command::new("ip");
    if let Some(config) = tls {
        c.env("SHARDC_ENABLE_SSL", "true")
            .env("SHARDC_SSL_CONFIG", config);
    }
    c.args(["netns", "exec", ns, env!("CARGO_BIN_EXE_shardc"), "launch"])
        .args(["--worker-num", "4", "--local-worker-num", "2"])
        .args(["--master-addr", master, "--master-port", "18118"])
        .args(["--node-rank", &node.to_string()])
        .arg("--token-file")
        .arg(token)
        .arg("--log-dir")
        .arg(log)
        .args(["--join", "--", "shardc", "check-collectives"])
        .env("SHARDC_CLUSTER_TIMEOUT", "60")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn finish(mut c: std::process::Child, limit: Duration) -> Output {
    let t0 = Instant::now();
    while c.try_wait().unwrap().is_none() {
        if t0.elapsed() > limit {
            let _ = c.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    c.wait_with_output().unwrap()
}

#[test]
fn two_hosts_in_network_namespaces_run_every_collective_over_tcp() {
    two_hosts("two", None);
}

/// The same with `SHARDC_ENABLE_SSL`: the control plane and the data plane run TLS with the
/// cluster's certificates (`openssl` makes them; skipped without it).
#[test]
fn two_hosts_with_tls_run_every_collective_over_sealed_connections() {
    let dir = tmp("pki");
    if let Err(e) = write_pki(&dir) {
        eprintln!("SKIP: cannot make test certificates ({e})");
        return;
    }
    two_hosts("tls", Some(&dir.join("ssl.json")));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A CA and one certificate for every node (subject alternative names: the test subnets'
/// addresses are not known in advance, so none; shardc then checks the chain only, as
/// MindSpore's clusters that share one certificate do), with `ssl.json`.
fn write_pki(dir: &Path) -> Result<(), String> {
    // `words` split at spaces, then the subject (which has spaces) when given.
    let run = |words: &str, subject: Option<&str>| {
        let mut args: Vec<&str> = words.split_whitespace().collect();
        if let Some(s) = subject {
            args.extend(["-subj", s]);
        }
        tool("openssl", &args, Some(dir))
    };
    let key = "-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes";
    run(
        &format!(
            "req -x509 {key} -keyout ca.key -out ca.pem -days 400 \
             -addext basicConstraints=critical,CA:TRUE \
             -addext keyUsage=critical,keyCertSign,cRLSign,digitalSignature"
        ),
        Some("/CN=netns test CA"),
    )?;
    run(
        &format!("req {key} -keyout node.key -out node.csr"),
        Some("/CN=shardc node"),
    )?;
    std::fs::write(
        dir.join("ext.cnf"),
        "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth,clientAuth\n",
    )
    .map_err(|e| e.to_string())?;
    run(
        "x509 -req -in node.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out node.crt \
         -days 400 -extfile ext.cnf",
        None,
    )?;
    std::fs::write(
        dir.join("ssl.json"),
        r#"{"server_cert_path": "node.crt", "server_key_path": "node.key",
            "client_cert_path": "node.crt", "client_key_path": "node.key",
            "ca_cert_path": "ca.pem"}"#,
    )
    .map_err(|e| e.to_string())
}

fn two_hosts(tag: &str, tls: Option<&Path>) {
    let hosts = match TwoHosts::new() {
        Ok(h) => h,
        Err(e) => {
            eprintln!("SKIP: cannot make network namespaces here ({e}); run as root with iproute2");
            return;
        }
    };
    let dir = tmp(tag);
    let token = dir.join("token");
    std::fs::write(&token, "a shared secret for both nodes\n").unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let (log_a, log_b) = (dir.join("node0"), dir.join("node1"));
    let tx0 = hosts.tx_bytes(&hosts.a);
    let n0 = launch_in(&hosts.a, 0, &hosts.addr_a, &token, &log_a, tls);
    let n1 = launch_in(&hosts.b, 1, &hosts.addr_a, &token, &log_b, tls);
    let (o0, o1) = (
        finish(n0, Duration::from_secs(120)),
        finish(n1, Duration::from_secs(120)),
    );
    let show = |log: &Path, ranks: std::ops::Range<usize>| -> String {
        ranks
            .map(|r| {
                let d = log.join(format!("1/rank.{r}"));
                format!(
                    "rank {r}: {}{}",
                    std::fs::read_to_string(d.join("stdout")).unwrap_or_default(),
                    std::fs::read_to_string(d.join("stderr")).unwrap_or_default()
                )
            })
            .collect()
    };
    let all = format!(
        "node 0: {}{}\n{}\nscheduler: {}\nnode 1: {}{}\n{}",
        String::from_utf8_lossy(&o0.stdout),
        String::from_utf8_lossy(&o0.stderr),
        show(&log_a, 0..2),
        std::fs::read_to_string(log_a.join("scheduler.log")).unwrap_or_default(),
        String::from_utf8_lossy(&o1.stdout),
        String::from_utf8_lossy(&o1.stderr),
        show(&log_b, 2..4),
    );
    assert!(o0.status.success() && o1.status.success(), "{all}");
    // Node 1 has no scheduler; each node logs only its own ranks.
    assert!(!log_b.join("scheduler.log").exists(), "{all}");
    for (log, ranks) in [(&log_a, 0..2), (&log_b, 2..4)] {
        for r in ranks {
            let out = std::fs::read_to_string(log.join(format!("1/rank.{r}/stdout"))).unwrap();
            assert!(out.contains("collective checks passed"), "{all}");
            assert!(out.contains("2 of 4 ranks on this host"), "{all}");
            assert_eq!(
                out.contains("(TLS, sealed records)"),
                tls.is_some(),
                "{all}"
            );
        }
    }
    // The collectives crossed the link: far more than the control plane's few kilobytes.
    let sent = hosts.tx_bytes(&hosts.a) - tx0;
    assert!(
        sent > 1_000_000,
        "only {sent} bytes crossed the link\n{all}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
