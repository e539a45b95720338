//! Helpers shared by the cluster tests: a scheduler with a captured log, workers on threads,
//! and a raw client that speaks the protocol by hand (to misbehave).

#![allow(dead_code)]

use shardc_runtime::cluster::auth::{SCHEDULER_LABEL, WORKER_LABEL};
use shardc_runtime::cluster::frame::{self, Message, NONCE_LEN, PROTOCOL_VERSION};
use shardc_runtime::cluster::{
    join, ClusterError, Membership, Scheduler, SchedulerConfig, SchedulerHandle, Timeouts, Token,
    WorkerConfig,
};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Timeouts for tests: short, but with room for a loaded machine.
pub fn timeouts() -> Timeouts {
    Timeouts {
        join: Duration::from_secs(20),
        heartbeat_interval: Duration::from_millis(50),
        heartbeat_timeout: Duration::from_secs(3),
    }
}

/// The scheduler's log lines.
#[derive(Clone, Default)]
pub struct Log(pub Arc<Mutex<Vec<String>>>);

impl Log {
    pub fn lines(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
    pub fn contains(&self, needle: &str) -> bool {
        self.lines().iter().any(|l| l.contains(needle))
    }
    /// Waits until a line contains `needle` (up to 10 s).
    pub fn wait_for(&self, needle: &str) -> bool {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            if self.contains(needle) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }
}

/// A scheduler on 127.0.0.1 (free port) serving on a thread, with its log captured.
pub fn start_scheduler(
    worker_num: usize,
    token: Option<&str>,
    timeouts: Timeouts,
) -> (SchedulerHandle, Log) {
    let log = Log::default();
    let sink = log.clone();
    let config = SchedulerConfig {
        token: token.map(|t| Token::new(t.as_bytes(), "test").unwrap()),
        timeouts,
        logger: Arc::new(move |line: &str| {
            eprintln!("scheduler: {line}");
            sink.0.lock().unwrap().push(line.to_string());
        }),
        ..SchedulerConfig::default()
    };
    let s = Scheduler::bind("127.0.0.1:0", worker_num, config).unwrap();
    (s.spawn().unwrap(), log)
}

/// A worker configuration for the scheduler at `addr`.
pub fn worker_config(addr: SocketAddr, worker_num: usize, token: Option<&str>) -> WorkerConfig {
    let mut c = WorkerConfig::new("127.0.0.1", addr.port(), worker_num);
    c.token = token.map(|t| Token::new(t.as_bytes(), "test").unwrap());
    c.timeouts = timeouts();
    c
}

/// Abort messages a worker received.
#[derive(Clone, Default)]
pub struct Aborts(pub Arc<Mutex<Vec<String>>>);

impl Aborts {
    pub fn handler(&self) -> Box<dyn Fn(&str) + Send + Sync> {
        let sink = self.0.clone();
        Box::new(move |why: &str| sink.lock().unwrap().push(why.to_string()))
    }
    pub fn messages(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
    /// Waits until at least one abort arrived (up to `limit`).
    pub fn wait(&self, limit: Duration) -> Option<String> {
        let start = Instant::now();
        while start.elapsed() < limit {
            if let Some(m) = self.messages().first() {
                return Some(m.clone());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }
}

/// A worker joined on a thread of its own.
pub struct JoinedWorker {
    pub membership: Membership,
    pub data: TcpListener,
    pub aborts: Aborts,
}

/// Joins a worker on a thread (binding its data listener first).
pub fn spawn_worker(config: WorkerConfig) -> JoinHandle<Result<JoinedWorker, ClusterError>> {
    std::thread::spawn(move || {
        let data = TcpListener::bind("127.0.0.1:0").unwrap();
        let aborts = Aborts::default();
        let port = data.local_addr().unwrap().port();
        let membership = join(&config, port, aborts.handler())?;
        Ok(JoinedWorker {
            membership,
            data,
            aborts,
        })
    })
}

/// A client that speaks the protocol by hand.
pub struct RawClient {
    pub stream: TcpStream,
    buf: Vec<u8>,
}

impl RawClient {
    pub fn connect(addr: SocketAddr) -> RawClient {
        Self::from_stream(TcpStream::connect(addr).unwrap())
    }

    /// Wraps an accepted connection (to play the scheduler by hand).
    pub fn from_stream(stream: TcpStream) -> RawClient {
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        RawClient {
            stream,
            buf: Vec::new(),
        }
    }

    pub fn send(&mut self, msg: &Message) {
        self.stream.write_all(&frame::encode(msg)).unwrap();
    }

    /// The next message; `None` at end of stream (or a reset).
    pub fn recv(&mut self) -> Option<Message> {
        loop {
            if let Some((m, used)) = frame::decode(&self.buf).unwrap() {
                self.buf.drain(..used);
                return Some(m);
            }
            let mut chunk = [0u8; 4096];
            match self.stream.read(&mut chunk) {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }

    /// Whether the peer closed the connection (EOF or reset) within the read timeout.
    pub fn closed_by_peer(&mut self) -> bool {
        let mut chunk = [0u8; 4096];
        loop {
            match self.stream.read(&mut chunk) {
                Ok(0) => return true,
                Ok(_) => continue,
                Err(e) => {
                    return !matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    )
                }
            }
        }
    }

    /// Hello / Challenge / AuthResponse / Accepted / Register, by hand.
    pub fn handshake(&mut self, token: Option<&str>, worker_num: u32, requested_rank: Option<u32>) {
        let my_nonce = [42u8; NONCE_LEN];
        self.send(&Message::Hello {
            protocol: PROTOCOL_VERSION,
            nonce: my_nonce,
        });
        let nonce = match self.recv() {
            Some(Message::Challenge { nonce, .. }) => nonce,
            other => panic!("expected Challenge, got {other:?}"),
        };
        let token = token.map(|t| Token::new(t.as_bytes(), "test").unwrap());
        let mac = token
            .as_ref()
            .map(|t| t.mac(&nonce, WORKER_LABEL).to_vec())
            .unwrap_or_default();
        self.send(&Message::AuthResponse { mac });
        match self.recv() {
            Some(Message::Accepted { proof }) => {
                if let Some(t) = &token {
                    assert!(t.verify(&my_nonce, SCHEDULER_LABEL, &proof));
                }
            }
            other => panic!("expected Accepted, got {other:?}"),
        }
        self.send(&Message::Register {
            node_id: Some("raw".into()),
            requested_rank,
            host_id: "raw-host".into(),
            data_port: 9,
            pid: 4242,
            hostname: "rawhost".into(),
            worker_num,
        });
    }
}
