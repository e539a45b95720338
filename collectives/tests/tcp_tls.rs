//! The TCP data plane with TLS (`SHARDC_ENABLE_SSL`): ranks with the cluster's certificates
//! pass the communicator conformance suite; the bytes on the wire (recorded by a relay in
//! front of rank 0) never show a tensor that the same relay sees in plain text without TLS;
//! a rank without TLS, or with a certificate from another CA, is refused with a message
//! that says so.

mod pki;

use pki::{tls, write_pki};
use shardc_collectives::tcp::{DataPlaneTls, TcpComm, TcpSetup};
use shardc_ir::ReduceOp;
use shardc_runtime::comm::{conformance, CommError, Communicator};
use shardc_runtime::tensor::Tensor;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn setup(
    rank: usize,
    listener: TcpListener,
    peers: &[SocketAddr],
    tls: Option<DataPlaneTls>,
    timeout: Duration,
) -> TcpSetup {
    TcpSetup {
        rank,
        size: peers.len(),
        job_id: "tls-job".into(),
        peers: peers.to_vec(),
        listener,
        token: Some(b"token".to_vec()),
        tls,
        timeout,
    }
}

/// A relay in front of `target`: every byte that passes in either direction is recorded.
fn relay(target: SocketAddr) -> (SocketAddr, Arc<Mutex<Vec<u8>>>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        for client in l.incoming() {
            let Ok(client) = client else { return };
            let Ok(server) = TcpStream::connect(target) else {
                return;
            };
            for (mut from, mut to) in [
                (client.try_clone().unwrap(), server.try_clone().unwrap()),
                (server, client),
            ] {
                let log = log.clone();
                std::thread::spawn(move || {
                    let mut buf = [0u8; 65536];
                    loop {
                        match from.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => {
                                log.lock().unwrap().extend_from_slice(&buf[..n]);
                                if to.write_all(&buf[..n]).is_err() {
                                    break;
                                }
                            }
                        }
                    }
                    let _ = to.shutdown(Shutdown::Write);
                });
            }
        }
    });
    (addr, seen)
}

/// A world of `n` ranks, each with `tls(rank)`; rank 0 is reached through a relay. Returns
/// the ranks' results and what the relay saw.
#[allow(clippy::type_complexity)]
fn world(
    n: usize,
    tls: impl Fn(usize) -> Option<DataPlaneTls>,
    timeout: Duration,
) -> (Vec<Result<TcpComm, CommError>>, Arc<Mutex<Vec<u8>>>) {
    let ls: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    let mut addrs: Vec<SocketAddr> = ls.iter().map(|l| l.local_addr().unwrap()).collect();
    let (front, seen) = relay(addrs[0]);
    addrs[0] = front;
    let hs: Vec<_> = ls
        .into_iter()
        .enumerate()
        .map(|(r, l)| {
            let s = setup(r, l, &addrs, tls(r), timeout);
            std::thread::spawn(move || TcpComm::new(s))
        })
        .collect();
    (hs.into_iter().map(|h| h.join().unwrap()).collect(), seen)
}

/// A recognisable tensor: its bytes hold a 64-byte run that random data never shows.
fn pattern(rank: usize) -> Tensor {
    let v: Vec<f32> = (0..4096)
        .map(|i| (i % 97) as f32 + rank as f32 * 1000.0)
        .collect();
    Tensor::from_f32(vec![4096], v).unwrap()
}

/// Runs one AllReduce of [`pattern`] and the conformance suite on every rank.
fn exchange(comms: &[TcpComm]) {
    let group: Vec<usize> = (0..comms.len()).collect();
    std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|c| {
                let group = &group;
                s.spawn(move || {
                    let mut t = pattern(c.rank());
                    c.all_reduce(group, ReduceOp::Sum, &mut t).unwrap();
                    let want: f32 = (0..comms.len()).map(|r| r as f32 * 1000.0 + 5.0).sum();
                    assert_eq!(t.as_f32().unwrap()[5], want);
                    conformance::run(c).unwrap();
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
    });
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn tls_ranks_pass_the_suite_and_the_wire_shows_no_tensor() {
    let dir = tempfile::tempdir().unwrap();
    write_pki(dir.path(), "cluster CA");
    let t = tls(dir.path());
    let probe: Vec<u8> = pattern(1).as_f32().unwrap()[10..26]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();

    // Without TLS the relay sees rank 1's tensor: the check below can fail.
    let (plain, seen) = world(3, |_| None, Duration::from_secs(30));
    let plain: Vec<TcpComm> = plain.into_iter().map(Result::unwrap).collect();
    exchange(&plain);
    assert!(contains(&seen.lock().unwrap(), &probe));
    drop(plain);

    let (sealed, seen) = world(3, |_| Some(t.clone()), Duration::from_secs(30));
    let sealed: Vec<TcpComm> = sealed.into_iter().map(Result::unwrap).collect();
    exchange(&sealed);
    let wire = seen.lock().unwrap().clone();
    assert!(wire.len() > 100_000, "the relay saw {} bytes", wire.len());
    assert!(!contains(&wire, &probe));
    assert!(
        !contains(&wire, b"op=sum"),
        "a frame header crossed in plain text"
    );
}

#[test]
fn a_rank_without_tls_or_with_another_ca_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    write_pki(dir.path(), "cluster CA");
    let other = tempfile::tempdir().unwrap();
    write_pki(other.path(), "some other CA");
    let (good, bad) = (tls(dir.path()), tls(other.path()));
    let t = Duration::from_millis(2500);

    // Rank 1 speaks plain TCP to a rank that requires TLS.
    let (r, _) = world(2, |r| (r == 0).then(|| good.clone()), t);
    let e1 = r[1].as_ref().unwrap_err().to_string();
    assert!(
        e1.contains("does not use TLS but this rank requires it"),
        "{e1}"
    );
    assert!(
        matches!(&r[0], Err(CommError::Timeout { missing, .. }) if missing == &[1]),
        "{:?}",
        r[0].as_ref().err()
    );

    // Rank 1's certificates come from another CA: the TLS handshake fails on both sides.
    let (r, _) = world(
        2,
        |k| Some(if k == 0 { good.clone() } else { bad.clone() }),
        t,
    );
    let e1 = r[1].as_ref().unwrap_err().to_string();
    assert!(e1.contains("TLS"), "{e1}");
    assert!(e1.contains("rank 0"), "{e1}");
    assert!(r[0].is_err());
}
