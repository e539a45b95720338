//! A worker's side of the rendezvous: [`join`] connects to the scheduler (retrying until the
//! timeout), authenticates, registers and waits for its rank and the address table; the
//! returned [`Membership`] keeps a background thread that exchanges heartbeats with the
//! scheduler and calls the abort callback when the scheduler aborts the job or is lost.
//!
//! ```no_run
//! use shardc_runtime::cluster::{join, ClusterEnv, WorkerConfig};
//! let env = ClusterEnv::from_env()?.expect("started by a launcher");
//! let data = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
//! let config = WorkerConfig::from_env(&env)?;
//! let membership = join(&config, data.local_addr().unwrap().port(), Box::new(|why: &str| {
//!     eprintln!("aborting: {why}");
//!     std::process::exit(1);
//! }))?;
//! // ... run rank `membership.rank` of `membership.size` ...
//! membership.finish(0)?;
//! # Ok::<(), shardc_runtime::cluster::ClusterError>(())
//! ```

use super::auth::{self, Token, SCHEDULER_LABEL, WORKER_LABEL};
use super::env::{self, host_port, ClusterEnv, Timeouts};
use super::frame::{write_message, FrameReader, Message, MAX_FRAME, PROTOCOL_VERSION};
use super::scheduler::{BoxStream, Scheduler, SchedulerConfig, SchedulerHandle};
use super::tls::{client_tls_from_env, WorkerTls};
use super::{fmt_secs, io_reason, ClusterError};
use std::fmt;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tokio::time::{sleep, timeout, timeout_at, Instant};

/// Called (once, from the worker's background thread) when the job is aborted: the scheduler
/// reports a lost rank (`rank 3 (node n3, host h, pid 1234) was lost: ...`) or the scheduler
/// itself is lost (`lost the scheduler at H:P: ...`). The CLI's callback prints the message
/// and exits the process.
pub type AbortHandler = Box<dyn Fn(&str) + Send + Sync>;

/// How much longer than its join timeout a worker waits for its rank, so that the
/// scheduler's own (more informative) timeout message arrives first.
const ASSIGN_GRACE: Duration = Duration::from_secs(2);

/// A worker's settings for [`join`].
#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// The scheduler's host (`MS_SCHED_HOST`).
    pub sched_host: String,
    /// The scheduler's port (`MS_SCHED_PORT`).
    pub sched_port: u16,
    /// The number of workers this worker was started for (`MS_WORKER_NUM`); the scheduler
    /// refuses a worker that disagrees.
    pub worker_num: usize,
    /// `MS_NODE_ID`.
    pub node_id: Option<String>,
    /// The rank to ask for.
    pub requested_rank: Option<usize>,
    /// This worker's host id ([`env::host_id`]).
    pub host_id: String,
    /// The shared token.
    pub token: Option<Token>,
    /// `join`: how long to try to reach the scheduler and to wait for a rank; heartbeat
    /// interval; silence after which the scheduler is lost.
    pub timeouts: Timeouts,
    /// TLS, if enabled.
    pub tls: Option<WorkerTls>,
}

impl WorkerConfig {
    /// A configuration for the scheduler at `sched_host:sched_port` and a job of
    /// `worker_num` workers: no token, no TLS, default timeouts, the detected host id.
    pub fn new(sched_host: &str, sched_port: u16, worker_num: usize) -> WorkerConfig {
        WorkerConfig {
            sched_host: sched_host.to_string(),
            sched_port,
            worker_num,
            node_id: None,
            requested_rank: None,
            host_id: env::host_id(),
            token: None,
            timeouts: Timeouts::default(),
            tls: None,
        }
    }

    /// The configuration named by the environment.
    pub fn from_env(env: &ClusterEnv) -> Result<WorkerConfig, ClusterError> {
        Ok(WorkerConfig {
            sched_host: env.sched_host.clone(),
            sched_port: env.sched_port,
            worker_num: env.worker_num,
            node_id: env.node_id.clone(),
            requested_rank: env.requested_rank,
            host_id: env.host_id.clone().unwrap_or_else(env::host_id),
            token: env.token.clone(),
            timeouts: env.timeouts,
            tls: client_tls_from_env(env)?,
        })
    }

    /// The scheduler's address, `host:port`.
    pub fn sched_addr(&self) -> String {
        host_port(&self.sched_host, self.sched_port)
    }
}

/// One rank of the job as the scheduler announced it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerInfo {
    /// The rank.
    pub rank: usize,
    /// Its host id (host and network namespace): equal ids may use shared memory.
    pub host_id: String,
    /// Its data-plane listener: the IP the scheduler saw it connect from, its data port.
    pub data_addr: SocketAddr,
    /// Its `MS_NODE_ID` (empty when not set).
    pub node_id: String,
}

/// Why the background session ended without a finish.
#[derive(Clone, Debug)]
enum Ended {
    Aborted(String),
    SchedulerLost(String),
}

enum Control {
    Finish {
        status: i32,
        reply: std::sync::mpsc::Sender<Result<(), ClusterError>>,
    },
}

/// This worker's place in the job. Dropping it without [`Membership::finish`] closes the
/// connection, which the scheduler treats as this rank being lost.
pub struct Membership {
    /// This worker's rank.
    pub rank: usize,
    /// The number of workers.
    pub size: usize,
    /// A random id, the same on every worker (names shared-memory files).
    pub job_id: String,
    /// Every rank, by rank, this one included.
    pub peers: Vec<PeerInfo>,
    /// The shared token, for the data plane's handshake.
    pub token: Option<Vec<u8>>,
    sched_addr: String,
    control: UnboundedSender<Control>,
    ended: Arc<Mutex<Option<Ended>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl fmt::Debug for Membership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Membership")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("job_id", &self.job_id)
            .field("peers", &self.peers)
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .field("scheduler", &self.sched_addr)
            .finish()
    }
}

impl Membership {
    /// The scheduler's address.
    pub fn scheduler_addr(&self) -> &str {
        &self.sched_addr
    }

    /// Tells the scheduler this worker is done with `exit_status` (0: success; anything else
    /// makes the scheduler abort the other workers) and waits for its acknowledgement.
    /// Fails when the job was aborted or the scheduler was lost before the finish was
    /// recorded.
    pub fn finish(mut self, exit_status: i32) -> Result<(), ClusterError> {
        let (reply, answer) = std::sync::mpsc::channel();
        let result = match self.control.send(Control::Finish {
            status: exit_status,
            reply,
        }) {
            Ok(()) => answer.recv().unwrap_or_else(|_| Err(self.ended_error())),
            Err(_) => Err(self.ended_error()),
        };
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        result
    }

    fn ended_error(&self) -> ClusterError {
        let ended = self.ended.lock().map(|g| g.clone()).unwrap_or(None);
        match ended {
            Some(Ended::Aborted(reason)) => ClusterError::Aborted { reason },
            Some(Ended::SchedulerLost(reason)) => ClusterError::SchedulerLost {
                addr: self.sched_addr.clone(),
                reason,
            },
            None => ClusterError::SchedulerLost {
                addr: self.sched_addr.clone(),
                reason: "the connection ended".into(),
            },
        }
    }
}

struct Assignment {
    rank: usize,
    size: usize,
    job_id: String,
    peers: Vec<PeerInfo>,
}

/// Joins the job: connects to the scheduler (retrying until `config.timeouts.join`),
/// authenticates, registers with `data_port` (the port of the data-plane listener the caller
/// already bound), and waits until every worker joined. `on_abort` is called at most once,
/// from a background thread, if the job is aborted after this returns.
pub fn join(
    config: &WorkerConfig,
    data_port: u16,
    on_abort: AbortHandler,
) -> Result<Membership, ClusterError> {
    if config.worker_num == 0 || u32::try_from(config.worker_num).is_err() {
        return Err(ClusterError::InvalidConfig {
            what: "the number of workers".into(),
            value: config.worker_num.to_string(),
            reason: "expected 1 to 4294967295 workers".into(),
        });
    }
    if config.timeouts.heartbeat_timeout <= config.timeouts.heartbeat_interval {
        return Err(ClusterError::InvalidConfig {
            what: "the heartbeat timeout".into(),
            value: fmt_secs(config.timeouts.heartbeat_timeout),
            reason: format!(
                "it must exceed the heartbeat interval ({})",
                fmt_secs(config.timeouts.heartbeat_interval)
            ),
        });
    }
    let cfg = config.clone();
    let sched_addr = cfg.sched_addr();
    let (result_tx, result_rx) = std::sync::mpsc::channel::<Result<Assignment, ClusterError>>();
    let (control_tx, control_rx) = unbounded_channel();
    let ended = Arc::new(Mutex::new(None));
    let ended_bg = ended.clone();
    let thread = std::thread::Builder::new()
        .name("shardc-cluster-worker".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = result_tx.send(Err(ClusterError::Io {
                        context: "starting the worker's cluster runtime".into(),
                        source: e,
                    }));
                    return;
                }
            };
            rt.block_on(async move {
                match connect_and_join(&cfg, data_port).await {
                    Err(e) => {
                        let _ = result_tx.send(Err(e));
                    }
                    Ok((session, assignment)) => {
                        if result_tx.send(Ok(assignment)).is_ok() {
                            session.run(control_rx, on_abort, ended_bg).await;
                        }
                    }
                }
            });
        })
        .map_err(|e| ClusterError::Io {
            context: format!("starting the thread that joins the scheduler at {sched_addr}"),
            source: e,
        })?;
    let assignment = match result_rx.recv() {
        Ok(r) => r?,
        Err(_) => {
            return Err(ClusterError::SchedulerLost {
                addr: sched_addr,
                reason: "the worker's cluster thread ended unexpectedly".into(),
            })
        }
    };
    Ok(Membership {
        rank: assignment.rank,
        size: assignment.size,
        job_id: assignment.job_id,
        peers: assignment.peers,
        token: config.token.as_ref().map(|t| t.as_bytes().to_vec()),
        sched_addr,
        control: control_tx,
        ended,
        thread: Some(thread),
    })
}

/// Under `mpirun`, rank 0 runs the scheduler: binds `MS_SCHED_HOST:MS_SCHED_PORT` and serves
/// on a thread. `Ok(None)` for every other process. The process that runs it must call
/// [`SchedulerHandle::wait`] after its own [`Membership::finish`] and before exiting, or the
/// other workers lose their scheduler.
pub fn start_embedded_scheduler(env: &ClusterEnv) -> Result<Option<SchedulerHandle>, ClusterError> {
    if !env.embed_scheduler {
        return Ok(None);
    }
    let config = SchedulerConfig::from_env(env)?;
    let scheduler = Scheduler::bind(env.sched_addr().as_str(), env.worker_num, config)?;
    scheduler.spawn().map(Some)
}

struct Session {
    addr: String,
    reader: FrameReader<ReadHalf<BoxStream>>,
    writer: WriteHalf<BoxStream>,
    timeouts: Timeouts,
}

async fn connect_and_join(
    cfg: &WorkerConfig,
    data_port: u16,
) -> Result<(Session, Assignment), ClusterError> {
    let addr = cfg.sched_addr();
    let start = Instant::now();
    let deadline = start + cfg.timeouts.join;

    // Connect, retrying until the deadline.
    let mut backoff = Duration::from_millis(50);
    let mut last_error: Option<String> = None;
    let tcp = loop {
        let reason = match timeout_at(
            deadline,
            tokio::net::TcpStream::connect((cfg.sched_host.as_str(), cfg.sched_port)),
        )
        .await
        {
            Ok(Ok(s)) => break s,
            Ok(Err(e)) => io_reason(&e),
            // Cut short by the deadline: the previous attempt's error says more.
            Err(_) => last_error
                .take()
                .unwrap_or_else(|| "the connection attempt timed out".to_string()),
        };
        let now = Instant::now();
        let next = now + backoff;
        if next >= deadline {
            return Err(ClusterError::Connect {
                addr,
                timeout: cfg.timeouts.join,
                reason,
            });
        }
        last_error = Some(reason);
        sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(1));
    };
    let _ = tcp.set_nodelay(true);
    let handshake_timeout = cfg.timeouts.heartbeat_timeout.max(Duration::from_secs(1));
    let stream: BoxStream = match &cfg.tls {
        Some(tls) => {
            let connector = tokio_rustls::TlsConnector::from(tls.config.clone());
            match timeout(
                handshake_timeout,
                connector.connect(tls.server_name.clone(), tcp),
            )
            .await
            {
                Ok(Ok(s)) => Box::new(s),
                Ok(Err(e)) => {
                    return Err(ClusterError::Tls {
                        peer: format!("the scheduler at {addr}"),
                        reason: format!("the handshake failed: {e}"),
                    })
                }
                Err(_) => {
                    return Err(ClusterError::Tls {
                        peer: format!("the scheduler at {addr}"),
                        reason: format!("no handshake within {}", fmt_secs(handshake_timeout)),
                    })
                }
            }
        }
        None => Box::new(tcp),
    };
    let (rd, wr) = tokio::io::split(stream);
    let mut s = Session {
        addr: addr.clone(),
        reader: FrameReader::new(rd, MAX_FRAME),
        writer: wr,
        timeouts: cfg.timeouts,
    };

    // Authenticate both ways.
    let my_nonce = auth::nonce();
    s.send(&Message::Hello {
        protocol: PROTOCOL_VERSION,
        nonce: my_nonce,
    })
    .await?;
    let hs_deadline = Instant::now() + handshake_timeout;
    let (nonce, token_required) = match s.recv_until(hs_deadline, "Challenge").await? {
        Message::Challenge {
            nonce,
            token_required,
        } => (nonce, token_required),
        other => return Err(s.unexpected("Challenge", &other)),
    };
    if cfg.token.is_some() && !token_required {
        return Err(ClusterError::SchedulerAuth {
            addr,
            reason: "it requires no cluster token but this worker has one; give the scheduler \
                     the same SHARDC_CLUSTER_TOKEN"
                .into(),
        });
    }
    let mac = match &cfg.token {
        Some(token) => token.mac(&nonce, WORKER_LABEL).to_vec(),
        None => Vec::new(),
    };
    s.send(&Message::AuthResponse { mac }).await?;
    // A wrong token is refused here (`recv` turns `Refused` into the error).
    let proof = match s.recv_until(hs_deadline, "Accepted").await? {
        Message::Accepted { proof } => proof,
        other => return Err(s.unexpected("Accepted", &other)),
    };
    if let Some(token) = &cfg.token {
        if !token.verify(&my_nonce, SCHEDULER_LABEL, &proof) {
            return Err(ClusterError::SchedulerAuth {
                addr,
                reason: "it accepted this worker but could not prove that it knows the cluster \
                         token"
                    .into(),
            });
        }
    }
    s.send(&Message::Register {
        node_id: cfg.node_id.clone(),
        requested_rank: cfg.requested_rank.map(|r| r as u32),
        host_id: cfg.host_id.clone(),
        data_port,
        pid: std::process::id(),
        hostname: env::hostname(),
        worker_num: cfg.worker_num as u32,
    })
    .await?;

    // Wait for the rank.
    let assign_deadline = deadline.max(Instant::now()) + ASSIGN_GRACE;
    loop {
        let msg = match timeout_at(assign_deadline, s.recv("Assign")).await {
            Ok(m) => m?,
            Err(_) => {
                return Err(ClusterError::AssignTimeout {
                    addr,
                    timeout: cfg.timeouts.join,
                })
            }
        };
        match msg {
            Message::Heartbeat => continue,
            Message::Assign {
                rank,
                size,
                job_id,
                peers,
            } => {
                let assignment = s.check_assignment(cfg, data_port, rank, size, job_id, peers)?;
                return Ok((s, assignment));
            }
            other => return Err(s.unexpected("Assign", &other)),
        }
    }
}

impl Session {
    async fn send(&mut self, msg: &Message) -> Result<(), ClusterError> {
        match timeout(
            self.timeouts.heartbeat_timeout,
            write_message(&mut self.writer, msg),
        )
        .await
        {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(ClusterError::SchedulerLost {
                addr: self.addr.clone(),
                reason: format!("sending {} failed: {}", msg.name(), io_reason(&e)),
            }),
            Err(_) => Err(ClusterError::SchedulerLost {
                addr: self.addr.clone(),
                reason: format!(
                    "sending {} did not complete within {}",
                    msg.name(),
                    fmt_secs(self.timeouts.heartbeat_timeout)
                ),
            }),
        }
    }

    /// The next message while joining; `Refused` and `Abort` become errors.
    async fn recv(&mut self, expected: &str) -> Result<Message, ClusterError> {
        match self.reader.next().await {
            Ok(Some(Message::Refused { reason })) => Err(ClusterError::Refused {
                addr: self.addr.clone(),
                reason,
            }),
            Ok(Some(Message::Abort { reason, .. })) => Err(ClusterError::Aborted { reason }),
            Ok(Some(m)) => Ok(m),
            Ok(None) => Err(ClusterError::SchedulerLost {
                addr: self.addr.clone(),
                reason: format!("the connection closed while waiting for {expected}"),
            }),
            Err(e) => Err(ClusterError::SchedulerLost {
                addr: self.addr.clone(),
                reason: format!("{e} (while waiting for {expected})"),
            }),
        }
    }

    async fn recv_until(
        &mut self,
        deadline: Instant,
        expected: &str,
    ) -> Result<Message, ClusterError> {
        match timeout_at(deadline, self.recv(expected)).await {
            Ok(r) => r,
            Err(_) => Err(ClusterError::Protocol {
                peer: format!("the scheduler at {}", self.addr),
                reason: format!(
                    "no {expected} within {}; is a shardc scheduler listening there?",
                    fmt_secs(self.timeouts.heartbeat_timeout.max(Duration::from_secs(1)))
                ),
            }),
        }
    }

    fn unexpected(&self, expected: &str, got: &Message) -> ClusterError {
        ClusterError::Protocol {
            peer: format!("the scheduler at {}", self.addr),
            reason: format!("expected {expected}, got {}", got.name()),
        }
    }

    fn check_assignment(
        &self,
        cfg: &WorkerConfig,
        data_port: u16,
        rank: u32,
        size: u32,
        job_id: String,
        peers: Vec<super::frame::PeerEntry>,
    ) -> Result<Assignment, ClusterError> {
        let bad = |reason: String| ClusterError::Protocol {
            peer: format!("the scheduler at {}", self.addr),
            reason,
        };
        let (rank, size) = (rank as usize, size as usize);
        if size != cfg.worker_num {
            return Err(bad(format!(
                "it assigned a job of {size} workers, this worker expects {}",
                cfg.worker_num
            )));
        }
        if rank >= size || peers.len() != size {
            return Err(bad(format!(
                "it assigned rank {rank} of {size} with a table of {} entries",
                peers.len()
            )));
        }
        if let Some(r) = cfg.requested_rank {
            if r != rank {
                return Err(bad(format!(
                    "it assigned rank {rank}, this worker asked for {r}"
                )));
            }
        }
        let mut out = Vec::with_capacity(size);
        for (i, p) in peers.into_iter().enumerate() {
            if p.rank as usize != i {
                return Err(bad(format!(
                    "entry {i} of the address table names rank {}",
                    p.rank
                )));
            }
            out.push(PeerInfo {
                rank: i,
                host_id: p.host_id,
                data_addr: SocketAddr::new(p.ip, p.data_port),
                node_id: p.node_id,
            });
        }
        if out[rank].data_addr.port() != data_port {
            return Err(bad(format!(
                "its table gives this worker (rank {rank}) data port {}, not {data_port}",
                out[rank].data_addr.port()
            )));
        }
        Ok(Assignment {
            rank,
            size,
            job_id,
            peers: out,
        })
    }

    /// Heartbeats until the membership finishes or is dropped, the job is aborted, or the
    /// scheduler is lost.
    async fn run(
        mut self,
        mut control: UnboundedReceiver<Control>,
        on_abort: AbortHandler,
        ended: Arc<Mutex<Option<Ended>>>,
    ) {
        let hb_timeout = self.timeouts.heartbeat_timeout;
        let mut tick = tokio::time::interval(self.timeouts.heartbeat_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_heard = Instant::now();
        let mut finishing: Option<std::sync::mpsc::Sender<Result<(), ClusterError>>> = None;
        // Why the scheduler was lost, if it was.
        let lost: String = loop {
            tokio::select! {
                r = self.reader.next() => match r {
                    Ok(Some(Message::Heartbeat)) => last_heard = Instant::now(),
                    Ok(Some(Message::FinishAck)) => {
                        if let Some(reply) = finishing.take() {
                            let _ = reply.send(Ok(()));
                            break String::new();
                        }
                        break "it acknowledged a finish that was never sent".into();
                    }
                    Ok(Some(Message::Abort { reason, .. })) => {
                        match finishing.take() {
                            Some(reply) => {
                                let _ = reply.send(Err(ClusterError::Aborted { reason }));
                            }
                            None => {
                                if let Ok(mut e) = ended.lock() {
                                    *e = Some(Ended::Aborted(reason.clone()));
                                }
                                on_abort(&reason);
                            }
                        }
                        break String::new();
                    }
                    Ok(Some(other)) => break format!("it sent an unexpected {} message", other.name()),
                    Ok(None) => break "the connection closed".into(),
                    Err(e) => break format!("the connection failed: {e}"),
                },
                _ = tick.tick() => {
                    if last_heard.elapsed() > hb_timeout {
                        break format!("no heartbeat for {}", fmt_secs(hb_timeout));
                    }
                    if finishing.is_none() {
                        if let Err(e) = self.send(&Message::Heartbeat).await {
                            break scheduler_reason(e);
                        }
                    }
                }
                c = control.recv(), if finishing.is_none() => match c {
                    Some(Control::Finish { status, reply }) => {
                        if let Err(e) = self.send(&Message::Finish { status }).await {
                            let _ = reply.send(Err(e));
                            break String::new();
                        }
                        finishing = Some(reply);
                    }
                    // The membership was dropped without finishing: close the connection.
                    None => break String::new(),
                },
            }
        };
        if !lost.is_empty() {
            match finishing.take() {
                Some(reply) => {
                    let _ = reply.send(Err(ClusterError::SchedulerLost {
                        addr: self.addr.clone(),
                        reason: lost,
                    }));
                }
                None => {
                    let message = ClusterError::SchedulerLost {
                        addr: self.addr.clone(),
                        reason: lost.clone(),
                    }
                    .to_string();
                    if let Ok(mut e) = ended.lock() {
                        *e = Some(Ended::SchedulerLost(lost));
                    }
                    on_abort(&message);
                }
            }
        }
        let _ = timeout(Duration::from_secs(1), self.writer.shutdown()).await;
    }
}

fn scheduler_reason(e: ClusterError) -> String {
    match e {
        ClusterError::SchedulerLost { reason, .. } => reason,
        other => other.to_string(),
    }
}
