//! Faults: a lost or failing worker aborts every other worker naming its rank; a silent
//! worker or scheduler is detected by heartbeats; timeouts for joining and connecting; a
//! port in use. Plus the `mpirun` path (rank 0 embeds the scheduler).

mod cluster_common;

use cluster_common::*;
use shardc_runtime::cluster::frame::{Message, PeerEntry};
use shardc_runtime::cluster::{
    join, start_embedded_scheduler, ClusterEnv, ClusterError, Scheduler, SchedulerConfig,
    WorkerConfig,
};
use std::collections::HashMap;
use std::net::TcpListener;
use std::time::{Duration, Instant};

fn spawn_n(addr: std::net::SocketAddr, n: usize) -> Vec<JoinedWorker> {
    let handles: Vec<_> = (0..n)
        .map(|_| spawn_worker(worker_config(addr, n, None)))
        .collect();
    let mut workers: Vec<JoinedWorker> = handles
        .into_iter()
        .map(|h| h.join().unwrap().unwrap())
        .collect();
    workers.sort_by_key(|w| w.membership.rank);
    workers
}

#[test]
fn a_worker_that_drops_its_connection_aborts_the_others_naming_its_rank() {
    let (sched, log) = start_scheduler(4, None, timeouts());
    let mut workers = spawn_n(sched.local_addr(), 4);
    let lost = workers.remove(2);
    assert_eq!(lost.membership.rank, 2);
    let start = Instant::now();
    drop(lost);
    let expected = format!(
        "rank 2 (host {}, pid {}) was lost: its connection closed without finishing",
        shardc_runtime::cluster::env::hostname(),
        std::process::id()
    );
    for w in &workers {
        let why = w
            .aborts
            .wait(Duration::from_secs(5))
            .expect("abort callback fired");
        assert_eq!(why, expected);
    }
    assert!(start.elapsed() < Duration::from_secs(5));
    let err = sched.wait().unwrap_err();
    assert!(
        matches!(err, ClusterError::RankLost { rank: 2, .. }),
        "{err:?}"
    );
    assert_eq!(err.to_string(), expected);
    assert!(log.contains(&format!("{expected}; aborting the job")));
    for w in workers {
        assert_eq!(w.aborts.messages().len(), 1, "called once");
        let err = w.membership.finish(0).unwrap_err();
        assert_eq!(err.to_string(), format!("the job was aborted: {expected}"));
    }
}

#[test]
fn a_non_zero_finish_aborts_the_others() {
    let (sched, _log) = start_scheduler(3, None, timeouts());
    let mut workers = spawn_n(sched.local_addr(), 3);
    let failing = workers.remove(1);
    failing.membership.finish(3).unwrap();
    for w in &workers {
        let why = w.aborts.wait(Duration::from_secs(5)).unwrap();
        assert!(why.starts_with("rank 1 (host "), "{why}");
        assert!(
            why.ends_with("was lost: it finished with exit status 3"),
            "{why}"
        );
    }
    let err = sched.wait().unwrap_err().to_string();
    assert!(err.ends_with("it finished with exit status 3"), "{err}");
    assert!(failing.aborts.messages().is_empty());
}

#[test]
fn a_silent_worker_is_lost_after_the_heartbeat_timeout() {
    let mut t = timeouts();
    t.heartbeat_timeout = Duration::from_secs(1);
    let (sched, _log) = start_scheduler(2, None, t);
    let addr = sched.local_addr();
    let mut raw = RawClient::connect(addr);
    raw.handshake(None, 2, Some(1));
    let real = spawn_worker(worker_config(addr, 2, None))
        .join()
        .unwrap()
        .unwrap();
    assert_eq!(real.membership.rank, 0);
    match raw.recv() {
        Some(Message::Assign {
            rank: 1, size: 2, ..
        }) => {}
        other => panic!("expected Assign, got {other:?}"),
    }
    // The raw worker now stays silent (but keeps its connection open).
    let why = real.aborts.wait(Duration::from_secs(6)).unwrap();
    assert_eq!(
        why,
        "rank 1 (node raw, host rawhost, pid 4242) was lost: it sent no heartbeat for 1 s"
    );
    assert!(matches!(
        sched.wait().unwrap_err(),
        ClusterError::RankLost { rank: 1, .. }
    ));
    drop(raw);
}

#[test]
fn too_few_workers_time_out_naming_the_missing_ranks() {
    let mut t = timeouts();
    t.join = Duration::from_secs(1);
    let (sched, log) = start_scheduler(4, None, t);
    let addr = sched.local_addr();
    let handles: Vec<_> = [Some(0), Some(2), None]
        .into_iter()
        .map(|r| {
            let mut c = worker_config(addr, 4, None);
            c.requested_rank = r;
            spawn_worker(c)
        })
        .collect();
    let expected = "only 3 of 4 workers joined within 1 s (ranks missing: 3)";
    let err = sched.wait().unwrap_err();
    assert!(matches!(
        err,
        ClusterError::JoinTimeout {
            joined: 3,
            expected: 4,
            ..
        }
    ));
    assert_eq!(err.to_string(), expected);
    assert!(log.contains(expected));
    for h in handles {
        let err = h.join().unwrap().err().unwrap();
        assert_eq!(err.to_string(), format!("the job was aborted: {expected}"));
    }
}

#[test]
fn a_worker_gives_up_when_no_scheduler_listens() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut c = WorkerConfig::new("127.0.0.1", port, 2);
    c.timeouts.join = Duration::from_millis(500);
    let start = Instant::now();
    let err = join(&c, 1, Box::new(|_| {})).unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(3));
    assert_eq!(
        err.to_string(),
        format!(
            "could not reach the scheduler at 127.0.0.1:{port} within 0.5 s: connection refused"
        )
    );
}

#[test]
fn a_worker_gives_up_waiting_for_its_rank() {
    let (sched, _log) = start_scheduler(2, None, timeouts());
    let mut c = worker_config(sched.local_addr(), 2, None);
    c.timeouts.join = Duration::from_millis(300);
    let err = join(&c, 1, Box::new(|_| {})).unwrap_err();
    assert!(matches!(err, ClusterError::AssignTimeout { .. }), "{err:?}");
    assert!(err
        .to_string()
        .ends_with("assigned no rank within 0.3 s: the job is still waiting for other workers"));
    drop(sched);
}

#[test]
fn a_port_in_use_is_a_clear_error() {
    let busy = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap();
    let err = Scheduler::bind(addr, 2, SchedulerConfig::default()).unwrap_err();
    assert!(err.to_string().starts_with(&format!(
        "the scheduler cannot listen on {addr}: address already in use"
    )));
}

/// Plays the scheduler by hand for one worker: handshake, table, then `after`.
fn fake_scheduler(after_assign: fn(RawClient)) -> (u16, std::thread::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let thread = std::thread::spawn(move || {
        let (stream, peer) = listener.accept().unwrap();
        let mut c = RawClient::from_stream(stream);
        assert!(matches!(c.recv(), Some(Message::Hello { .. })));
        c.send(&Message::Challenge {
            nonce: [1; 32],
            token_required: false,
        });
        assert!(matches!(c.recv(), Some(Message::AuthResponse { .. })));
        c.send(&Message::Accepted { proof: vec![] });
        let data_port = match c.recv() {
            Some(Message::Register { data_port, .. }) => data_port,
            other => panic!("expected Register, got {other:?}"),
        };
        c.send(&Message::Assign {
            rank: 0,
            size: 1,
            job_id: "j".into(),
            peers: vec![PeerEntry {
                rank: 0,
                host_id: "h".into(),
                ip: peer.ip(),
                data_port,
                node_id: String::new(),
            }],
        });
        after_assign(c);
    });
    (port, thread)
}

#[test]
fn a_worker_notices_a_scheduler_that_closes_or_goes_silent() {
    let (port, fake) = fake_scheduler(drop);
    let mut cfg = WorkerConfig::new("127.0.0.1", port, 1);
    cfg.timeouts.heartbeat_interval = Duration::from_millis(50);
    cfg.timeouts.heartbeat_timeout = Duration::from_millis(500);
    let aborts = Aborts::default();
    let m = join(&cfg, 7, aborts.handler()).unwrap();
    assert_eq!((m.rank, m.size, m.job_id.as_str()), (0, 1, "j"));
    fake.join().unwrap();
    let why = aborts.wait(Duration::from_secs(5)).unwrap();
    assert!(
        why.starts_with(&format!(
            "lost the scheduler at 127.0.0.1:{port}: the connection"
        )),
        "{why}"
    );
    assert!(m
        .finish(0)
        .unwrap_err()
        .to_string()
        .starts_with("lost the scheduler"));

    let (port, fake) = fake_scheduler(|c| {
        std::thread::sleep(Duration::from_secs(3));
        drop(c)
    });
    cfg.sched_port = port;
    let aborts = Aborts::default();
    let m = join(&cfg, 7, aborts.handler()).unwrap();
    let why = aborts.wait(Duration::from_secs(3)).unwrap();
    assert_eq!(
        why,
        format!("lost the scheduler at 127.0.0.1:{port}: no heartbeat for 0.5 s")
    );
    drop(m);
    fake.join().unwrap();
}

#[test]
fn under_mpirun_rank_zero_embeds_the_scheduler() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string();
    let env_of = |rank: &str| {
        let vars: HashMap<&str, String> = [
            ("OMPI_COMM_WORLD_RANK", rank.to_string()),
            ("OMPI_COMM_WORLD_SIZE", "2".to_string()),
            ("MS_SCHED_PORT", port.clone()),
            ("SHARDC_CLUSTER_TOKEN", "mpi-token".to_string()),
            ("SHARDC_HEARTBEAT_INTERVAL_MS", "50".to_string()),
        ]
        .into_iter()
        .collect();
        ClusterEnv::from_vars(&move |k| vars.get(k).cloned())
            .unwrap()
            .unwrap()
    };
    let (e0, e1) = (env_of("0"), env_of("1"));
    assert!(e0.embed_scheduler && !e1.embed_scheduler);
    assert!(start_embedded_scheduler(&e1).unwrap().is_none());
    let sched = start_embedded_scheduler(&e0).unwrap().unwrap();
    let workers: Vec<_> = [e1, e0]
        .iter()
        .map(|e| spawn_worker(WorkerConfig::from_env(e).unwrap()))
        .collect();
    let mut ranks = Vec::new();
    for w in workers {
        let w = w.join().unwrap().unwrap();
        ranks.push(w.membership.rank);
        w.membership.finish(0).unwrap();
    }
    assert_eq!(ranks, [1, 0]);
    assert_eq!(sched.wait().unwrap().workers.len(), 2);
}
