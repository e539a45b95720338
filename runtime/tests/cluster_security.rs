//! Security of the control plane: the shared token (both ways), and connections that send
//! garbage, oversized or no frames are closed while the scheduler keeps serving the others.

mod cluster_common;

use cluster_common::*;
use shardc_runtime::cluster::frame::{Message, MAGIC, PROTOCOL_VERSION};
use shardc_runtime::cluster::ClusterError;
use std::io::Write;
use std::time::Duration;

fn finish_all(workers: Vec<std::thread::JoinHandle<Result<JoinedWorker, ClusterError>>>) {
    for w in workers {
        w.join().unwrap().unwrap().membership.finish(0).unwrap();
    }
}

#[test]
fn a_wrong_token_is_refused_and_logged_while_the_others_complete() {
    let (sched, log) = start_scheduler(2, Some("right"), timeouts());
    let addr = sched.local_addr();
    let good: Vec<_> = (0..2)
        .map(|_| spawn_worker(worker_config(addr, 2, Some("right"))))
        .collect();
    // A wrong token races with the good workers: it never takes their place.
    let err = spawn_worker(worker_config(addr, 2, Some("wrong")))
        .join()
        .unwrap()
        .err()
        .unwrap();
    assert!(matches!(err, ClusterError::Refused { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        format!(
            "the scheduler at 127.0.0.1:{} refused this worker: wrong cluster token",
            addr.port()
        )
    );
    let err = spawn_worker(worker_config(addr, 2, None))
        .join()
        .unwrap()
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("refused this worker: no cluster token"),
        "{err}"
    );
    assert!(log.wait_for("refused a worker from 127.0.0.1:"));
    assert!(log.contains(": wrong cluster token"), "{:?}", log.lines());
    finish_all(good);
    assert_eq!(sched.wait().unwrap().workers.len(), 2);
}

#[test]
fn a_worker_with_a_token_does_not_trust_a_scheduler_without_one() {
    let (sched, _log) = start_scheduler(1, None, timeouts());
    let addr = sched.local_addr();
    let err = spawn_worker(worker_config(addr, 1, Some("secret")))
        .join()
        .unwrap()
        .err()
        .unwrap();
    assert!(matches!(err, ClusterError::SchedulerAuth { .. }), "{err:?}");
    assert!(err
        .to_string()
        .contains("requires no cluster token but this worker has one"));
    finish_all(vec![spawn_worker(worker_config(addr, 1, None))]);
    sched.wait().unwrap();
}

#[test]
fn garbage_and_oversized_frames_close_that_connection_only() {
    let (sched, log) = start_scheduler(3, Some("t"), timeouts());
    let addr = sched.local_addr();
    let first = spawn_worker(worker_config(addr, 3, Some("t")));

    // Not a shardc peer at all.
    let mut garbage = RawClient::connect(addr);
    garbage
        .stream
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    assert!(
        garbage.closed_by_peer(),
        "garbage: the scheduler closes the connection"
    );
    assert!(log.wait_for("bad magic"), "{:?}", log.lines());

    // A valid header announcing a 100 MiB Hello: closed before any payload is read.
    let mut big = RawClient::connect(addr);
    let mut header = MAGIC.to_vec();
    header.push(1);
    header.extend_from_slice(&(100u32 << 20).to_le_bytes());
    big.stream.write_all(&header).unwrap();
    assert!(big.closed_by_peer());
    assert!(
        log.wait_for("Hello frame of 104857600 bytes exceeds the limit of 65536 bytes"),
        "{:?}",
        log.lines()
    );

    // An unknown message kind.
    let mut unknown = RawClient::connect(addr);
    unknown
        .stream
        .write_all(b"SHCL\xee\x00\x00\x00\x00")
        .unwrap();
    assert!(unknown.closed_by_peer());
    assert!(log.wait_for("unknown message kind 238"));

    // A registered worker that then sends garbage leaves the job before it starts.
    let mut late = RawClient::connect(addr);
    late.handshake(Some("t"), 3, None);
    assert!(log.wait_for("(node raw, host rawhost, pid 4242) joined"));
    late.stream.write_all(b"\x00\x01\x02\x03garbage").unwrap();
    assert!(late.closed_by_peer());
    assert!(log.wait_for("left before the job started: its connection failed: bad magic"));

    // The job still completes with real workers.
    let second = spawn_worker(worker_config(addr, 3, Some("t")));
    let third = spawn_worker(worker_config(addr, 3, Some("t")));
    finish_all(vec![first, second, third]);
    let report = sched.wait().unwrap();
    assert!(report.workers.iter().all(|w| w.pid == std::process::id()));
}

#[test]
fn a_silent_connection_is_closed_after_the_handshake_timeout() {
    let mut t = timeouts();
    t.heartbeat_timeout = Duration::from_millis(500);
    let (sched, log) = start_scheduler(1, None, t);
    let addr = sched.local_addr();
    let mut silent = RawClient::connect(addr);
    assert!(silent.closed_by_peer());
    assert!(
        log.wait_for("no complete handshake within 0.5 s"),
        "{:?}",
        log.lines()
    );
    // A client of another protocol version is refused with the reason.
    let mut old = RawClient::connect(addr);
    old.send(&Message::Hello {
        protocol: PROTOCOL_VERSION + 1,
        nonce: [0; 32],
    });
    match old.recv() {
        Some(Message::Refused { reason }) => {
            assert!(reason.contains("protocol version 2"), "{reason}")
        }
        other => panic!("expected Refused, got {other:?}"),
    }
    let mut c = worker_config(addr, 1, None);
    c.timeouts = t;
    finish_all(vec![spawn_worker(c)]);
    sched.wait().unwrap();
}
