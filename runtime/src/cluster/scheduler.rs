//! The scheduler: accepts workers, authenticates them, assigns ranks, sends every worker the
//! address table, watches heartbeats, and aborts every worker naming a lost rank.
//!
//! ```no_run
//! use shardc_runtime::cluster::{Scheduler, SchedulerConfig};
//! let scheduler = Scheduler::bind("0.0.0.0:8118", 4, SchedulerConfig::default())?;
//! let report = scheduler.serve()?; // blocks until every worker finished, or a fault
//! println!("job {} done", report.job_id);
//! # Ok::<(), shardc_runtime::cluster::ClusterError>(())
//! ```
//!
//! Ranks: a worker's requested rank (`SHARDC_RANK`, `OMPI_COMM_WORLD_RANK`) is honoured; a
//! rank requested twice or out of range is refused with a message naming both workers. The
//! other workers get the remaining ranks in node-id order (numeric ids numerically), then in
//! order of arrival. Once every worker joined, later workers are refused. A peer's address in
//! the table is the IP the scheduler saw it connect from and the data port it registered.

use super::auth::{self, Token, SCHEDULER_LABEL, WORKER_LABEL};
use super::env::{ClusterEnv, Timeouts};
use super::frame::{
    write_message, FrameReader, Message, PeerEntry, MAX_CONTROL_FRAME, PROTOCOL_VERSION,
};
use super::{fmt_secs, io_reason, ClusterError};
use std::cmp::Ordering;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tokio::task::JoinSet;
use tokio::time::{sleep_until, timeout, timeout_at, Instant};

/// Where the scheduler's log lines go (one line per call, without a trailing newline).
pub type Logger = Arc<dyn Fn(&str) + Send + Sync>;

/// The default [`Logger`]: `scheduler: <line>` on standard error.
pub fn stderr_logger() -> Logger {
    Arc::new(|line: &str| eprintln!("scheduler: {line}"))
}

/// How long the scheduler keeps flushing its last messages (aborts, acks) and draining
/// connections before [`Scheduler::serve`] returns.
const LINGER: Duration = Duration::from_secs(2);

/// The scheduler's settings.
#[derive(Clone)]
pub struct SchedulerConfig {
    /// The shared token every worker must prove it knows; `None` accepts any worker.
    pub token: Option<Token>,
    /// Join timeout, heartbeat interval and heartbeat timeout (the join timeout counts from
    /// the start of [`Scheduler::serve`]).
    pub timeouts: Timeouts,
    /// TLS for every worker connection, if set.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Where joins, refusals, bad connections, departures and losses are logged.
    pub logger: Logger,
    /// The job id sent to every worker; `None` draws a random one.
    pub job_id: Option<String>,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            token: None,
            timeouts: Timeouts::default(),
            tls: None,
            logger: stderr_logger(),
            job_id: None,
        }
    }
}

impl fmt::Debug for SchedulerConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SchedulerConfig")
            .field("token", &self.token)
            .field("timeouts", &self.timeouts)
            .field("tls", &self.tls.is_some())
            .field("job_id", &self.job_id)
            .finish_non_exhaustive()
    }
}

impl SchedulerConfig {
    /// The settings named by the environment: token, timeouts and (with
    /// `SHARDC_ENABLE_SSL`) TLS.
    pub fn from_env(env: &ClusterEnv) -> Result<SchedulerConfig, ClusterError> {
        Ok(SchedulerConfig {
            token: env.token.clone(),
            timeouts: env.timeouts,
            tls: super::tls::server_tls_from_env(env)?,
            logger: stderr_logger(),
            job_id: None,
        })
    }
}

/// One worker of a finished job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerSummary {
    /// Its rank.
    pub rank: usize,
    /// Its `MS_NODE_ID`.
    pub node_id: Option<String>,
    /// Its host name.
    pub hostname: String,
    /// Its host id.
    pub host_id: String,
    /// Its process id.
    pub pid: u32,
    /// The address its control connection came from.
    pub addr: SocketAddr,
    /// Its data-plane address as sent in the table.
    pub data_addr: SocketAddr,
}

/// What [`Scheduler::serve`] returns when every worker finished with status 0.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobReport {
    /// The job id every worker got.
    pub job_id: String,
    /// The workers, by rank.
    pub workers: Vec<WorkerSummary>,
    /// Time from the start of serving to the last finish.
    pub elapsed: Duration,
}

/// A bound scheduler, not yet serving.
pub struct Scheduler {
    listener: std::net::TcpListener,
    addr: SocketAddr,
    worker_num: usize,
    config: SchedulerConfig,
}

impl fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scheduler")
            .field("addr", &self.addr)
            .field("worker_num", &self.worker_num)
            .field("config", &self.config)
            .finish()
    }
}

impl Scheduler {
    /// Listens on `addr` (`host:port`; port 0 picks a free one) for a job of `worker_num`
    /// workers. A port in use or an address that is not local is an error naming `addr`.
    pub fn bind<A: ToSocketAddrs + fmt::Display>(
        addr: A,
        worker_num: usize,
        config: SchedulerConfig,
    ) -> Result<Scheduler, ClusterError> {
        if worker_num == 0 || u32::try_from(worker_num).is_err() {
            return Err(ClusterError::InvalidConfig {
                what: "the number of workers".into(),
                value: worker_num.to_string(),
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
        let name = addr.to_string();
        let listener = std::net::TcpListener::bind(&addr).map_err(|e| ClusterError::Bind {
            addr: name.clone(),
            reason: match e.kind() {
                std::io::ErrorKind::AddrInUse => "address already in use (another scheduler or \
                     program listens on this port; choose another MS_SCHED_PORT)"
                    .to_string(),
                std::io::ErrorKind::AddrNotAvailable => "address not available (MS_SCHED_HOST \
                     must name an address of this machine)"
                    .to_string(),
                _ => io_reason(&e),
            },
        })?;
        let local = listener.local_addr().map_err(|e| ClusterError::Io {
            context: format!("reading the address of the scheduler's listener on {name}"),
            source: e,
        })?;
        listener
            .set_nonblocking(true)
            .map_err(|e| ClusterError::Io {
                context: format!("configuring the scheduler's listener on {name}"),
                source: e,
            })?;
        Ok(Scheduler {
            listener,
            addr: local,
            worker_num,
            config,
        })
    }

    /// The address the scheduler listens on (with the actual port when bound to port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves the job on a runtime of its own until every worker finished (`Ok`) or the job
    /// failed: a worker lost or failed ([`ClusterError::RankLost`], after every other worker
    /// was sent an abort naming it) or not every worker joined in time
    /// ([`ClusterError::JoinTimeout`]).
    pub fn serve(self) -> Result<JobReport, ClusterError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| ClusterError::Io {
                context: "starting the scheduler's runtime".into(),
                source: e,
            })?;
        rt.block_on(self.serve_async())
    }

    /// Runs [`Scheduler::serve`] on a thread of its own.
    pub fn spawn(self) -> Result<SchedulerHandle, ClusterError> {
        let addr = self.addr;
        let thread = std::thread::Builder::new()
            .name("shardc-scheduler".into())
            .spawn(move || self.serve())
            .map_err(|e| ClusterError::Io {
                context: format!("starting the scheduler thread for {addr}"),
                source: e,
            })?;
        Ok(SchedulerHandle { addr, thread })
    }

    /// [`Scheduler::serve`] on the caller's tokio runtime (needs the `time` and `net`
    /// drivers).
    pub async fn serve_async(self) -> Result<JobReport, ClusterError> {
        let start = Instant::now();
        let addr = self.addr;
        let listener =
            tokio::net::TcpListener::from_std(self.listener).map_err(|e| ClusterError::Io {
                context: format!("registering the scheduler's listener on {addr}"),
                source: e,
            })?;
        let config = self.config;
        let shared = Arc::new(Shared {
            token: config.token.clone(),
            tls: config.tls.clone().map(tokio_rustls::TlsAcceptor::from),
            logger: config.logger.clone(),
            handshake_timeout: config.timeouts.heartbeat_timeout,
        });
        let job_id = config.job_id.clone().unwrap_or_else(random_job_id);
        let mut state = State {
            worker_num: self.worker_num,
            timeouts: config.timeouts,
            logger: config.logger.clone(),
            job_id,
            candidates: Vec::new(),
            members: Vec::new(),
            by_conn: HashMap::new(),
            arrivals: 0,
            writers: JoinSet::new(),
        };
        let (events_tx, mut events) = unbounded_channel::<Event>();
        let mut conns: JoinSet<()> = JoinSet::new();
        let mut next_conn = 0u64;
        let join_deadline = start + config.timeouts.join;
        let mut tick = tokio::time::interval(config.timeouts.heartbeat_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);

        let outcome: Result<(), ClusterError> = loop {
            let running = !state.members.is_empty();
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, peer)) => {
                        let local = stream.local_addr().unwrap_or(addr);
                        let _ = stream.set_nodelay(true);
                        next_conn += 1;
                        conns.spawn(connection(next_conn, stream, peer, local, shared.clone(), events_tx.clone()));
                    }
                    Err(e) => {
                        // Out of file descriptors and the like: report, wait, go on.
                        (state.logger)(&format!("accepting a connection on {addr} failed: {}", io_reason(&e)));
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
                Some(event) = events.recv() => {
                    match state.handle(event) {
                        Step::Continue => {}
                        Step::Done(result) => break result,
                    }
                }
                _ = sleep_until(join_deadline), if !running => {
                    break Err(state.join_timeout());
                }
                _ = tick.tick(), if running => {
                    if let Some(err) = state.heartbeat() {
                        break Err(err);
                    }
                }
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
            }
        };

        // Flush the last messages (acks, aborts), then let workers close their side so that
        // nothing is reset under a message they have not read yet.
        let report = state.report(start);
        state.candidates.clear();
        for m in &mut state.members {
            m.tx = None;
        }
        drop(listener);
        let linger_deadline = Instant::now() + LINGER;
        let _ = timeout_at(linger_deadline, async {
            while state.writers.join_next().await.is_some() {}
        })
        .await;
        drop(events);
        let _ = timeout_at(linger_deadline, async {
            while conns.join_next().await.is_some() {}
        })
        .await;
        state.writers.abort_all();
        conns.abort_all();
        outcome.map(|()| report)
    }
}

/// A scheduler serving on a thread of its own ([`Scheduler::spawn`]).
#[derive(Debug)]
pub struct SchedulerHandle {
    addr: SocketAddr,
    thread: std::thread::JoinHandle<Result<JobReport, ClusterError>>,
}

impl SchedulerHandle {
    /// The address the scheduler listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Whether serving ended (then [`SchedulerHandle::wait`] does not block).
    pub fn is_finished(&self) -> bool {
        self.thread.is_finished()
    }

    /// Waits for the job's end and returns [`Scheduler::serve`]'s result.
    pub fn wait(self) -> Result<JobReport, ClusterError> {
        let addr = self.addr;
        self.thread.join().unwrap_or_else(|_| {
            Err(ClusterError::Io {
                context: format!("the scheduler thread for {addr}"),
                source: std::io::Error::other("it panicked"),
            })
        })
    }
}

fn random_job_id() -> String {
    let bytes: [u8; 12] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A stream the control protocol runs on (plain TCP or TLS).
pub(crate) trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}
pub(crate) type BoxStream = Box<dyn Stream>;

struct Shared {
    token: Option<Token>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    logger: Logger,
    handshake_timeout: Duration,
}

/// What a worker registered with.
#[derive(Clone, Debug)]
struct Registration {
    node_id: Option<String>,
    requested_rank: Option<usize>,
    host_id: String,
    data_port: u16,
    pid: u32,
    hostname: String,
    worker_num: u32,
}

impl Registration {
    /// `node n3, host h, pid 1234`.
    fn who(&self) -> String {
        match &self.node_id {
            Some(n) => format!("node {n}, host {}, pid {}", self.hostname, self.pid),
            None => format!("host {}, pid {}", self.hostname, self.pid),
        }
    }
}

enum Event {
    Registered(Box<Pending>),
    Msg { conn: u64, msg: Message },
    Closed { conn: u64, reason: String },
}

struct Pending {
    conn: u64,
    reg: Registration,
    peer: SocketAddr,
    local: SocketAddr,
    writer: WriteHalf<BoxStream>,
}

struct Candidate {
    conn: u64,
    reg: Registration,
    peer: SocketAddr,
    local: SocketAddr,
    tx: UnboundedSender<Message>,
    arrival: u64,
}

struct Member {
    rank: usize,
    reg: Registration,
    peer: SocketAddr,
    data_addr: SocketAddr,
    tx: Option<UnboundedSender<Message>>,
    last_seen: Instant,
    finished: bool,
}

enum Step {
    Continue,
    Done(Result<(), ClusterError>),
}

struct State {
    worker_num: usize,
    timeouts: Timeouts,
    logger: Logger,
    job_id: String,
    candidates: Vec<Candidate>,
    members: Vec<Member>,
    by_conn: HashMap<u64, usize>,
    arrivals: u64,
    writers: JoinSet<()>,
}

impl State {
    fn log(&self, line: &str) {
        (self.logger)(line);
    }

    fn handle(&mut self, event: Event) -> Step {
        match event {
            Event::Registered(p) => {
                self.register(*p);
                Step::Continue
            }
            Event::Msg { conn, msg } => self.message(conn, msg),
            Event::Closed { conn, reason } => self.closed(conn, reason),
        }
    }

    fn register(&mut self, p: Pending) {
        let (tx, rx) = unbounded_channel();
        self.writers.spawn(write_loop(p.writer, rx));
        let refuse = |state: &Self, reason: String| {
            state.log(&format!(
                "refused a worker from {} ({}): {reason}",
                p.peer,
                p.reg.who()
            ));
            let _ = tx.send(Message::Refused { reason });
        };
        if !self.members.is_empty() {
            return refuse(
                self,
                format!(
                    "the job already has all {} workers; this worker is one too many",
                    self.worker_num
                ),
            );
        }
        if p.reg.worker_num as usize != self.worker_num {
            return refuse(
                self,
                format!(
                    "this worker was started for {} workers but the job has {} (MS_WORKER_NUM \
                     differs between this worker and the scheduler)",
                    p.reg.worker_num, self.worker_num
                ),
            );
        }
        if let Some(r) = p.reg.requested_rank {
            if r >= self.worker_num {
                return refuse(
                    self,
                    format!(
                        "requested rank {r} is out of range: the job has {} workers (ranks 0 to {})",
                        self.worker_num,
                        self.worker_num - 1
                    ),
                );
            }
            if let Some(other) = self
                .candidates
                .iter()
                .find(|c| c.reg.requested_rank == Some(r))
            {
                return refuse(
                    self,
                    format!(
                        "rank {r} was requested by this worker (from {}, {}) but already by \
                         another worker (from {}, {})",
                        p.peer,
                        p.reg.who(),
                        other.peer,
                        other.reg.who()
                    ),
                );
            }
        }
        self.arrivals += 1;
        self.log(&format!(
            "a worker from {} ({}) joined ({} of {})",
            p.peer,
            p.reg.who(),
            self.candidates.len() + 1,
            self.worker_num
        ));
        self.candidates.push(Candidate {
            conn: p.conn,
            reg: p.reg,
            peer: p.peer,
            local: p.local,
            tx,
            arrival: self.arrivals,
        });
        if self.candidates.len() == self.worker_num {
            self.assign();
        }
    }

    /// Ranks for the candidates (same order as `self.candidates`), and the ranks left over.
    fn ranks(&self) -> (Vec<usize>, Vec<usize>) {
        let mut ranks = vec![usize::MAX; self.candidates.len()];
        let mut taken = vec![false; self.worker_num];
        for (i, c) in self.candidates.iter().enumerate() {
            if let Some(r) = c.reg.requested_rank {
                ranks[i] = r;
                taken[r] = true;
            }
        }
        let mut free = (0..self.worker_num).filter(|&r| !taken[r]);
        let mut rest: Vec<usize> = (0..self.candidates.len())
            .filter(|&i| self.candidates[i].reg.requested_rank.is_none())
            .collect();
        rest.sort_by(|&a, &b| {
            let (a, b) = (&self.candidates[a], &self.candidates[b]);
            node_order(a.reg.node_id.as_deref(), b.reg.node_id.as_deref())
                .then(a.arrival.cmp(&b.arrival))
        });
        for i in rest {
            // `register` keeps at most `worker_num` candidates with distinct requested ranks,
            // so a free rank is always left.
            if let Some(r) = free.next() {
                ranks[i] = r;
            }
        }
        (ranks, free.collect())
    }

    fn assign(&mut self) {
        let (ranks, _) = self.ranks();
        let candidates = std::mem::take(&mut self.candidates);
        // Workers that reached the scheduler over loopback are on the scheduler's host: when
        // other workers are remote, advertise this host's address as seen by them instead.
        let host_ip: Option<IpAddr> = candidates
            .iter()
            .find(|c| !c.peer.ip().to_canonical().is_loopback())
            .map(|c| c.local.ip().to_canonical());
        let now = Instant::now();
        let mut members: BTreeMap<usize, Member> = BTreeMap::new();
        for (c, rank) in candidates.into_iter().zip(ranks) {
            let mut ip = c.peer.ip().to_canonical();
            if ip.is_loopback() {
                if let Some(h) = host_ip {
                    ip = h;
                }
            }
            self.by_conn.insert(c.conn, rank);
            members.insert(
                rank,
                Member {
                    rank,
                    data_addr: SocketAddr::new(ip, c.reg.data_port),
                    reg: c.reg,
                    peer: c.peer,
                    tx: Some(c.tx),
                    last_seen: now,
                    finished: false,
                },
            );
        }
        self.members = members.into_values().collect();
        let peers: Vec<PeerEntry> = self
            .members
            .iter()
            .map(|m| PeerEntry {
                rank: m.rank as u32,
                host_id: m.reg.host_id.clone(),
                ip: m.data_addr.ip(),
                data_port: m.data_addr.port(),
                node_id: m.reg.node_id.clone().unwrap_or_default(),
            })
            .collect();
        for m in &self.members {
            if let Some(tx) = &m.tx {
                let _ = tx.send(Message::Assign {
                    rank: m.rank as u32,
                    size: self.worker_num as u32,
                    job_id: self.job_id.clone(),
                    peers: peers.clone(),
                });
            }
        }
    }

    fn message(&mut self, conn: u64, msg: Message) -> Step {
        let Some(&rank) = self.by_conn.get(&conn) else {
            // A worker still waiting for the others: only heartbeats are expected.
            if let Some(i) = self.candidates.iter().position(|c| c.conn == conn) {
                if msg != Message::Heartbeat {
                    let c = self.candidates.remove(i);
                    let reason = format!("it sent a {} message before the job started", msg.name());
                    self.log(&format!(
                        "refused a worker from {} ({}): {reason}",
                        c.peer,
                        c.reg.who()
                    ));
                    let _ = c.tx.send(Message::Refused { reason });
                }
            }
            return Step::Continue;
        };
        let m = &mut self.members[rank];
        if m.finished {
            return Step::Continue;
        }
        m.last_seen = Instant::now();
        match msg {
            Message::Heartbeat => Step::Continue,
            Message::Finish { status } => {
                m.finished = true;
                if let Some(tx) = m.tx.take() {
                    let _ = tx.send(Message::FinishAck);
                }
                if status != 0 {
                    return Step::Done(Err(
                        self.lose(rank, format!("it finished with exit status {status}"))
                    ));
                }
                if self.members.iter().all(|m| m.finished) {
                    return Step::Done(Ok(()));
                }
                Step::Continue
            }
            other => {
                m.finished = true;
                m.tx = None;
                let reason = format!("it sent an unexpected {} message", other.name());
                Step::Done(Err(self.lose(rank, reason)))
            }
        }
    }

    fn closed(&mut self, conn: u64, reason: String) -> Step {
        if let Some(&rank) = self.by_conn.get(&conn) {
            let m = &mut self.members[rank];
            if m.finished {
                return Step::Continue;
            }
            m.finished = true;
            m.tx = None;
            return Step::Done(Err(self.lose(rank, reason)));
        }
        if let Some(i) = self.candidates.iter().position(|c| c.conn == conn) {
            let c = self.candidates.remove(i);
            self.log(&format!(
                "a worker from {} ({}) left before the job started: {reason}",
                c.peer,
                c.reg.who()
            ));
        }
        Step::Continue
    }

    /// Sends heartbeats; the first worker silent for longer than the timeout is lost.
    fn heartbeat(&mut self) -> Option<ClusterError> {
        let now = Instant::now();
        let limit = self.timeouts.heartbeat_timeout;
        let silent = self
            .members
            .iter()
            .find(|m| !m.finished && now.duration_since(m.last_seen) > limit)
            .map(|m| m.rank);
        if let Some(rank) = silent {
            self.members[rank].finished = true;
            self.members[rank].tx = None;
            return Some(self.lose(
                rank,
                format!("it sent no heartbeat for {}", fmt_secs(limit)),
            ));
        }
        for m in &self.members {
            if let Some(tx) = &m.tx {
                let _ = tx.send(Message::Heartbeat);
            }
        }
        None
    }

    /// Aborts every other worker naming `rank`; the error `serve` returns.
    fn lose(&mut self, rank: usize, reason: String) -> ClusterError {
        let err = ClusterError::RankLost {
            rank,
            who: self.members[rank].reg.who(),
            reason,
        };
        let text = err.to_string();
        self.log(&format!("{text}; aborting the job"));
        for m in &mut self.members {
            if m.rank != rank && !m.finished {
                if let Some(tx) = m.tx.take() {
                    let _ = tx.send(Message::Abort {
                        lost_rank: Some(rank as u32),
                        reason: text.clone(),
                    });
                }
            }
        }
        err
    }

    fn join_timeout(&mut self) -> ClusterError {
        let (_, missing) = self.ranks();
        let err = ClusterError::JoinTimeout {
            joined: self.candidates.len(),
            expected: self.worker_num,
            timeout: self.timeouts.join,
            missing,
        };
        let text = err.to_string();
        self.log(&text);
        for c in self.candidates.drain(..) {
            let _ = c.tx.send(Message::Abort {
                lost_rank: None,
                reason: text.clone(),
            });
        }
        err
    }

    fn report(&self, start: Instant) -> JobReport {
        JobReport {
            job_id: self.job_id.clone(),
            workers: self
                .members
                .iter()
                .map(|m| WorkerSummary {
                    rank: m.rank,
                    node_id: m.reg.node_id.clone(),
                    hostname: m.reg.hostname.clone(),
                    host_id: m.reg.host_id.clone(),
                    pid: m.reg.pid,
                    addr: m.peer,
                    data_addr: m.data_addr,
                })
                .collect(),
            elapsed: start.elapsed(),
        }
    }
}

/// Node ids in order: numeric ids numerically, before other ids in string order; workers
/// without an id last.
fn node_order(a: Option<&str>, b: Option<&str>) -> Ordering {
    match (a, b) {
        (Some(a), Some(b)) => match (a.parse::<u64>(), b.parse::<u64>()) {
            (Ok(x), Ok(y)) => x.cmp(&y),
            (Ok(_), Err(_)) => Ordering::Less,
            (Err(_), Ok(_)) => Ordering::Greater,
            (Err(_), Err(_)) => a.cmp(b),
        },
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => Ordering::Equal,
    }
}

async fn write_loop(mut writer: WriteHalf<BoxStream>, mut rx: UnboundedReceiver<Message>) {
    while let Some(msg) = rx.recv().await {
        if write_message(&mut writer, &msg).await.is_err() {
            return;
        }
    }
    let _ = writer.shutdown().await;
}

/// One worker connection: TLS, authentication, registration, then forwarding its messages.
async fn connection(
    conn: u64,
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    local: SocketAddr,
    shared: Arc<Shared>,
    events: UnboundedSender<Event>,
) {
    let log = |line: String| (shared.logger)(&line);
    let handshake = async {
        let stream: BoxStream = match &shared.tls {
            Some(acceptor) => match acceptor.accept(stream).await {
                Ok(s) => Box::new(s),
                Err(e) => return Err(format!("TLS handshake failed: {e}")),
            },
            None => Box::new(stream),
        };
        let (rd, mut wr) = tokio::io::split(stream);
        let mut reader = FrameReader::new(rd, MAX_CONTROL_FRAME);
        let worker_nonce = match next(&mut reader).await? {
            Message::Hello { protocol, nonce } if protocol == PROTOCOL_VERSION => nonce,
            Message::Hello { protocol, .. } => {
                let reason = format!(
                    "it speaks control protocol version {protocol}, this scheduler speaks \
                     version {PROTOCOL_VERSION}"
                );
                refuse_and_close(&mut reader, &mut wr, &reason).await;
                return Err(reason);
            }
            other => return Err(format!("expected Hello, got {}", other.name())),
        };
        let nonce = auth::nonce();
        let challenge = Message::Challenge {
            nonce,
            token_required: shared.token.is_some(),
        };
        write_message(&mut wr, &challenge)
            .await
            .map_err(|e| io_reason(&e))?;
        let mac = match next(&mut reader).await? {
            Message::AuthResponse { mac } => mac,
            other => return Err(format!("expected AuthResponse, got {}", other.name())),
        };
        if let Some(token) = &shared.token {
            if !token.verify(&nonce, WORKER_LABEL, &mac) {
                let reason = if mac.is_empty() {
                    "no cluster token (set SHARDC_CLUSTER_TOKEN or SHARDC_CLUSTER_TOKEN_FILE \
                     to the scheduler's token)"
                } else {
                    "wrong cluster token"
                };
                refuse_and_close(&mut reader, &mut wr, reason).await;
                return Err(reason.to_string());
            }
        }
        let proof = match &shared.token {
            Some(t) => t.mac(&worker_nonce, SCHEDULER_LABEL).to_vec(),
            None => Vec::new(),
        };
        write_message(&mut wr, &Message::Accepted { proof })
            .await
            .map_err(|e| io_reason(&e))?;
        let reg = match next(&mut reader).await? {
            Message::Register {
                node_id,
                requested_rank,
                host_id,
                data_port,
                pid,
                hostname,
                worker_num,
            } => Registration {
                node_id,
                requested_rank: requested_rank.map(|r| r as usize),
                host_id,
                data_port,
                pid,
                hostname,
                worker_num,
            },
            other => return Err(format!("expected Register, got {}", other.name())),
        };
        Ok((reader, wr, reg))
    };
    let (mut reader, writer, reg) = match timeout(shared.handshake_timeout, handshake).await {
        Ok(Ok(parts)) => parts,
        Ok(Err(reason)) => {
            if reason.starts_with("wrong cluster token") || reason.starts_with("no cluster token") {
                log(format!("refused a worker from {peer}: {reason}"));
            } else {
                log(format!("closed the connection from {peer}: {reason}"));
            }
            return;
        }
        Err(_) => {
            log(format!(
                "closed the connection from {peer}: no complete handshake within {}",
                fmt_secs(shared.handshake_timeout)
            ));
            return;
        }
    };
    let pending = Pending {
        conn,
        reg,
        peer,
        local,
        writer,
    };
    if events.send(Event::Registered(Box::new(pending))).is_err() {
        return;
    }
    loop {
        // Keep reading until the worker closes even when nobody listens any more, so that the
        // socket is never reset under a message the worker has not read.
        let event = match reader.next().await {
            Ok(Some(msg)) => Event::Msg { conn, msg },
            Ok(None) => Event::Closed {
                conn,
                reason: "its connection closed without finishing".into(),
            },
            Err(e) => Event::Closed {
                conn,
                reason: format!("its connection failed: {e}"),
            },
        };
        let last = matches!(event, Event::Closed { .. });
        let _ = events.send(event);
        if last {
            return;
        }
    }
}

/// The next message of a handshake; EOF and bad frames are errors.
async fn next(reader: &mut FrameReader<ReadHalf<BoxStream>>) -> Result<Message, String> {
    match reader.next().await {
        Ok(Some(m)) => Ok(m),
        Ok(None) => Err("the connection closed during the handshake".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// Sends `Refused`, closes the write side, and waits briefly for the peer to close.
async fn refuse_and_close(
    reader: &mut FrameReader<ReadHalf<BoxStream>>,
    wr: &mut WriteHalf<BoxStream>,
    reason: &str,
) {
    let _ = write_message(
        wr,
        &Message::Refused {
            reason: reason.to_string(),
        },
    )
    .await;
    let _ = wr.shutdown().await;
    let _ = timeout(LINGER, async {
        while let Ok(Some(_)) = reader.next().await {}
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_ids_sort_numerically_then_by_name_then_missing() {
        let mut ids = vec![None, Some("b"), Some("10"), Some("2"), Some("a")];
        ids.sort_by(|a, b| node_order(*a, *b));
        assert_eq!(ids, vec![Some("2"), Some("10"), Some("a"), Some("b"), None]);
    }

    #[test]
    fn bind_refuses_zero_workers_and_busy_ports() {
        let e = Scheduler::bind("127.0.0.1:0", 0, SchedulerConfig::default()).unwrap_err();
        assert!(e.to_string().contains("the number of workers is 0"), "{e}");
        let s = Scheduler::bind("127.0.0.1:0", 1, SchedulerConfig::default()).unwrap();
        let addr = s.local_addr();
        let e = Scheduler::bind(addr, 1, SchedulerConfig::default()).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "the scheduler cannot listen on {addr}: address already in use (another \
                 scheduler or program listens on this port; choose another MS_SCHED_PORT)"
            )
        );
    }
}
