//! Rendezvous: workers join a scheduler, get ranks and one consistent address table, and
//! finish; requested ranks are honoured; misfit workers are refused with a clear reason.

mod cluster_common;

use cluster_common::*;
use shardc_runtime::cluster::{ClusterError, Membership};
use std::collections::BTreeSet;

fn join_all(
    handles: Vec<std::thread::JoinHandle<Result<JoinedWorker, ClusterError>>>,
) -> Vec<JoinedWorker> {
    handles
        .into_iter()
        .map(|h| h.join().unwrap().unwrap())
        .collect()
}

fn check_consistent(workers: &[JoinedWorker], n: usize) {
    let first: &Membership = &workers[0].membership;
    let ranks: BTreeSet<usize> = workers.iter().map(|w| w.membership.rank).collect();
    assert_eq!(
        ranks,
        (0..n).collect::<BTreeSet<_>>(),
        "ranks are a permutation"
    );
    for w in workers {
        let m = &w.membership;
        assert_eq!(m.size, n);
        assert_eq!(m.job_id, first.job_id);
        assert!(!m.job_id.is_empty());
        assert_eq!(m.peers, first.peers, "every worker gets the same table");
        assert_eq!(m.peers.len(), n);
        let me = &m.peers[m.rank];
        assert_eq!(me.rank, m.rank);
        assert_eq!(
            me.data_addr,
            w.data.local_addr().unwrap(),
            "own entry is own listener"
        );
        assert_eq!(me.host_id, shardc_runtime::cluster::env::host_id());
    }
}

#[test]
fn four_workers_join_and_get_one_table() {
    let (sched, log) = start_scheduler(4, None, timeouts());
    let addr = sched.local_addr();
    let handles = (0..4)
        .map(|_| spawn_worker(worker_config(addr, 4, None)))
        .collect();
    let workers = join_all(handles);
    check_consistent(&workers, 4);
    let job_id = workers[0].membership.job_id.clone();
    for w in workers {
        assert!(w.aborts.messages().is_empty());
        w.membership.finish(0).unwrap();
    }
    let report = sched.wait().unwrap();
    assert_eq!(report.job_id, job_id);
    assert_eq!(report.workers.len(), 4);
    for (r, w) in report.workers.iter().enumerate() {
        assert_eq!(w.rank, r);
        assert_eq!(w.pid, std::process::id());
    }
    let lines = log.lines();
    assert_eq!(
        lines.iter().filter(|l| l.contains(" joined (")).count(),
        4,
        "{lines:?}"
    );
    assert!(
        !lines
            .iter()
            .any(|l| l.contains("refused") || l.contains("lost")),
        "{lines:?}"
    );
}

#[test]
fn requested_ranks_are_honoured_and_the_rest_go_by_node_id() {
    let (sched, _log) = start_scheduler(4, Some("tok"), timeouts());
    let addr = sched.local_addr();
    let mut handles = Vec::new();
    // Two workers ask for ranks 3 and 0; two give node ids "b" and "a" (in that order).
    for (rank, node) in [(Some(3), "x"), (None, "b"), (Some(0), "y"), (None, "a")] {
        let mut c = worker_config(addr, 4, Some("tok"));
        c.requested_rank = rank;
        c.node_id = Some(node.to_string());
        handles.push(spawn_worker(c));
        // Arrival order matters only as a tie-break; keep it deterministic anyway.
        std::thread::sleep(std::time::Duration::from_millis(30));
    }
    let workers = join_all(handles);
    check_consistent(&workers, 4);
    let node_of_rank: Vec<String> = workers[0]
        .membership
        .peers
        .iter()
        .map(|p| p.node_id.clone())
        .collect();
    assert_eq!(node_of_rank, ["y", "a", "b", "x"]);
    assert_eq!(workers[0].membership.rank, 3);
    assert_eq!(workers[2].membership.rank, 0);
    assert_eq!(workers[0].membership.token.as_deref(), Some(&b"tok"[..]));
    for w in workers {
        w.membership.finish(0).unwrap();
    }
    sched.wait().unwrap();
}

#[test]
fn duplicate_and_out_of_range_ranks_and_wrong_sizes_are_refused() {
    let (sched, log) = start_scheduler(2, None, timeouts());
    let addr = sched.local_addr();
    let mut c0 = worker_config(addr, 2, None);
    c0.requested_rank = Some(1);
    c0.node_id = Some("first".into());
    let first = spawn_worker(c0);
    // Wait until the first worker is registered before sending its rival.
    assert!(log.wait_for("node first"), "{:?}", log.lines());

    let mut dup = worker_config(addr, 2, None);
    dup.requested_rank = Some(1);
    dup.node_id = Some("second".into());
    let err = spawn_worker(dup).join().unwrap().err().unwrap().to_string();
    assert!(
        err.starts_with(&format!("the scheduler at 127.0.0.1:{} refused this worker: rank 1 was requested by this worker", addr.port())),
        "{err}"
    );
    assert!(
        err.contains("node second") && err.contains("node first"),
        "{err}"
    );

    let mut out = worker_config(addr, 2, None);
    out.requested_rank = Some(5);
    // The worker's own config allows any rank; the scheduler checks the range.
    let err = spawn_worker(out).join().unwrap().err().unwrap().to_string();
    assert!(
        err.ends_with("refused this worker: requested rank 5 is out of range: the job has 2 workers (ranks 0 to 1)"),
        "{err}"
    );

    let err = spawn_worker(worker_config(addr, 3, None))
        .join()
        .unwrap()
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("this worker was started for 3 workers but the job has 2"),
        "{err}"
    );
    assert!(log.contains("refused a worker from 127.0.0.1:"));

    // The job still completes with the right workers, and a third is one too many.
    let second = spawn_worker(worker_config(addr, 2, None));
    let workers = vec![
        first.join().unwrap().unwrap(),
        second.join().unwrap().unwrap(),
    ];
    check_consistent(&workers, 2);
    assert_eq!(workers[0].membership.rank, 1);
    let err = spawn_worker(worker_config(addr, 2, None))
        .join()
        .unwrap()
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("the job already has all 2 workers"), "{err}");
    for w in workers {
        w.membership.finish(0).unwrap();
    }
    sched.wait().unwrap();
}
