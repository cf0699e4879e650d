//! `coremq serve`: a node speaking RocketMQ's classic remoting protocol (see
//! [`crate::node::remoting`]) over the sharded store, so existing RocketMQ clients can
//! produce, consume, commit offsets, query by key and look up by message id.
//!
//! * **Ports.** The broker port (default 127.0.0.1:10911) serves every request code;
//!   the name-server port (127.0.0.1:9876) serves the same dispatcher, so route lookups
//!   (`GET_ROUTEINFO_BY_TOPIC`, `GET_BROKER_CLUSTER_INFO`) name this node as the only
//!   broker (broker id 0, read/write) of its cluster. Metrics: Prometheus text at
//!   `http://127.0.0.1:9100/metrics`.
//! * **Where connections run** (`network` in the config):
//!   - `"shards"` (default, `shard_net.rs`): every shard executor accepts on the shared
//!     listening sockets and serves its connections as glommio tasks over io_uring
//!     sockets (thread-per-core). A request runs on the connection's shard and reaches
//!     the shard owning its queue through the store's [`Handle`] (a channel hop; when
//!     the owner is the connection's own shard the hop is to itself: one more task,
//!     no thread switch). Held pulls are tasks waiting on the queue's arrival signal.
//!   - `"threads"`: one OS thread per connection with blocking `std::net` sockets and
//!     `block_on(handle...)`: the first, simple front end, kept as a fallback and
//!     tested with the same suite. Held pulls get their own short-lived thread.
//!
//!   Both run the same request processors (`process.rs`, async, front-end free).
//! * **Responses** go out through one writer per connection (a write lock, or a
//!   writer task fed by a channel), so a held pull answered later never interleaves
//!   with another response; requests may be answered out of order (by `opaque`).
//! * **Bad input.** A malformed frame (length outside 4..=`max_frame_bytes`, a header
//!   that does not decode, an unknown serialize type) closes only its connection.
//!   Unknown request codes get `REQUEST_CODE_NOT_SUPPORTED`; missing or malformed
//!   header fields get `SYSTEM_ERROR` with a remark. Connections beyond
//!   `max_connections` are closed on accept; silent ones after `idle_timeout_ms`.
//! * **State beside the store** (`<data-dir>/config/`): `topics.json` (queue counts,
//!   permissions) and `consumerOffset.json` (RocketMQ's `offsetTable` shape, written
//!   every `offset_flush_interval_ms` and at shutdown).
//! * **Shutdown** ([`Node::shutdown`], on SIGINT/SIGTERM in `coremq serve`): stops
//!   accepting, closes the read side of every connection so no new request starts,
//!   answers held pulls, waits for requests in flight (up to 10 s), writes consumer
//!   offsets, then shuts the store down (flush, checkpoint, remove `abort`).
//! * **Joining a cluster**: with `namesrv_addr` set, the node registers with those
//!   name servers every 30 s (`register.rs`).
//! * Failed messages sent back (`CONSUMER_SEND_MSG_BACK`) go to `%RETRY%group` at once
//!   (delay levels need scheduled delivery, not implemented), `%DLQ%group` after 16.
//! * Not yet: replication, transactions, delayed delivery,
//!   unregistering from name servers at shutdown.
//!
//! Interop, checked against clients nobody here wrote (scripts run a node themselves):
//! * `scripts/interop.sh`: Apache RocketMQ's C++ client (librocketmq, bundled in the
//!   PyPI wheel `rocketmq` 0.4.4): route lookup, `send_sync`, `send_batch` (sent as
//!   `SEND_MESSAGE` with `batch=1`), pull consumer, push consumer with long polling and
//!   committed offsets, clean SIGTERM shutdown.
//! * `scripts/interop_rust.sh`: `rocketmq-client-rust` 1.0.0 (crates.io): send with
//!   keys, query by key, view by offset message id, max offset, search offset by
//!   time, push consumer (long polling, committed offsets, a failed message
//!   redelivered through the retry topic).
//!
//! Quirks seen: the C++ client never sends `serializeTypeCurrentRPC`; the Rust client
//! requires `enableActingMaster` in route data; records carry coremq's `__CRC32#`
//! property, which clients show as an ordinary property.

pub mod config;
mod listen;
mod process;
mod register;
pub mod remoting;
mod shard_net;
mod state;

pub use config::{Network, NodeConfig};

use crate::StoreOps;
use crate::error::{Error, Result};
use crate::shard::{Handle, ShardedConfig, ShardedStore};
use process::Outcome;
use remoting::{FrameError, RemotingCommand};
use state::{Arrivals, Clients, Metrics, Offsets, Topics, lock};
use std::collections::HashMap;
use std::io::{BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Everything the connection threads share.
pub(crate) struct NodeState {
    pub cfg: NodeConfig,
    pub handle: Handle,
    pub broker_addr: SocketAddrV4,
    pub topics: Topics,
    pub offsets: Offsets,
    pub clients: Clients,
    pub arrivals: Arrivals,
    pub metrics: Metrics,
    pub shutting: AtomicBool,
    pub next_queue: AtomicU64,
    /// Pulls held right now (long polling), bounded by `max_held_pulls`.
    pub held: Arc<AtomicUsize>,
    pub(crate) next_conn: AtomicU64,
    /// Connections open (both front ends).
    pub(crate) open: AtomicUsize,
    /// The shard front end has stopped.
    net_stopped: AtomicBool,
    /// The thread front end's connections (a clone of each socket, to close their
    /// read side at shutdown).
    conns: Mutex<HashMap<u64, TcpStream>>,
    /// Connection and held-pull threads running.
    active: AtomicUsize,
}

impl NodeState {
    /// Counts a new connection in, or refuses it at the limit.
    pub(crate) fn try_open_connection(&self) -> bool {
        let n = self.open.fetch_add(1, Ordering::SeqCst);
        if n >= self.cfg.max_connections {
            self.open.fetch_sub(1, Ordering::SeqCst);
            self.metrics
                .connections_refused
                .fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                limit = self.cfg.max_connections,
                "connection limit reached; closing a new connection"
            );
            return false;
        }
        self.metrics
            .connections_accepted
            .fetch_add(1, Ordering::Relaxed);
        true
    }
}

/// Counts a running thread in `active` for as long as it lives.
struct ActiveGuard(Arc<NodeState>);

impl ActiveGuard {
    fn new(st: &Arc<NodeState>) -> ActiveGuard {
        st.active.fetch_add(1, Ordering::SeqCst);
        ActiveGuard(st.clone())
    }
}

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A running node.
pub struct Node {
    state: Arc<NodeState>,
    store: Option<ShardedStore>,
    threads: Vec<JoinHandle<()>>,
    shard_net: Option<shard_net::ShardNet>,
    /// Listeners whose accept threads must be woken at shutdown.
    wake: Vec<SocketAddr>,
    /// Addresses actually bound (useful with port 0).
    pub broker_addr: SocketAddr,
    pub namesrv_addr: Option<SocketAddr>,
    pub metrics_addr: Option<SocketAddr>,
}

/// `n` listening sockets sharing `addr` (`SO_REUSEPORT`).
fn bind(addr: SocketAddr, n: usize, what: &str) -> Result<Vec<TcpListener>> {
    listen::bind_group(addr, n)
        .map_err(|e| Error::Config(format!("cannot bind the {what} port {addr}: {e}")))
}

impl Node {
    /// Binds the ports and opens the store with `cfg`'s settings.
    pub fn start(cfg: NodeConfig) -> Result<Node> {
        let store = cfg.sharded_config();
        Node::start_with_store(cfg, store)
    }

    /// As [`Node::start`], with the store's settings given (its root and store host
    /// are taken from `cfg` and the bound address).
    pub fn start_with_store(cfg: NodeConfig, mut store_cfg: ShardedConfig) -> Result<Node> {
        cfg.validate()?;
        // One socket per shard on each protocol port (shard front end), else one.
        let per_port = match cfg.network {
            Network::Shards => store_cfg.shards.max(1),
            Network::Threads => 1,
        };
        let broker = bind(cfg.listen, per_port, "broker")?;
        let broker_addr = broker[0]
            .local_addr()
            .map_err(|e| Error::Config(e.to_string()))?;
        let namesrv = if cfg.namesrv_enable {
            Some(bind(cfg.namesrv_listen, per_port, "name server")?)
        } else {
            None
        };
        let metrics = if cfg.metrics_enable {
            Some(bind(cfg.metrics_listen, 1, "metrics")?.remove(0))
        } else {
            None
        };
        let advertised = match (cfg.advertised_addr, broker_addr) {
            (Some(a), _) => a,
            (None, SocketAddr::V4(a)) if !a.ip().is_unspecified() => a,
            (None, a) => SocketAddrV4::new([127, 0, 0, 1].into(), a.port()),
        };
        store_cfg.root = cfg.data_dir.clone();
        store_cfg.store.root = cfg.data_dir.clone();
        store_cfg.store.store_host = advertised;
        let config_dir = cfg.data_dir.join("config");
        let topics = Topics::load(&config_dir)?;
        let offsets = Offsets::load(&config_dir)?;
        let store = ShardedStore::open(store_cfg)?;
        let handle = store.handle();
        let state = Arc::new(NodeState {
            metrics: Metrics::new(handle.shards()),
            handle,
            broker_addr: advertised,
            topics,
            offsets,
            clients: Clients::default(),
            arrivals: Arrivals::default(),
            shutting: AtomicBool::new(false),
            next_queue: AtomicU64::new(0),
            held: Arc::new(AtomicUsize::new(0)),
            next_conn: AtomicU64::new(1),
            open: AtomicUsize::new(0),
            net_stopped: AtomicBool::new(false),
            conns: Mutex::new(HashMap::new()),
            active: AtomicUsize::new(0),
            cfg,
        });
        let mut node = Node {
            state: state.clone(),
            store: Some(store),
            threads: Vec::new(),
            shard_net: None,
            wake: Vec::new(),
            broker_addr,
            namesrv_addr: None,
            metrics_addr: None,
        };
        node.namesrv_addr = namesrv.as_ref().and_then(|l| l[0].local_addr().ok());
        let groups: Vec<Vec<TcpListener>> = std::iter::once(broker).chain(namesrv).collect();
        if state.cfg.network == Network::Shards {
            node.shard_net = Some(shard_net::ShardNet::start(&state, groups)?);
        } else {
            for l in groups.into_iter().flatten() {
                node.wake.extend(l.local_addr().ok());
                let st = state.clone();
                node.spawn("coremq-accept", move || accept_loop(st, l))?;
            }
        }
        if let Some(l) = metrics {
            node.metrics_addr = l.local_addr().ok();
            node.wake.extend(node.metrics_addr);
            let st = state.clone();
            node.spawn("coremq-metrics", move || metrics_loop(st, l))?;
        }
        let st = state.clone();
        node.spawn("coremq-housekeeping", move || housekeeping(st))?;
        if !state.cfg.namesrv_addr.is_empty() {
            let st = state.clone();
            node.spawn("coremq-register", move || register::register_loop(st))?;
        }
        tracing::info!(
            broker = %node.broker_addr,
            namesrv = ?node.namesrv_addr,
            metrics = ?node.metrics_addr,
            advertised = %advertised,
            shards = state.handle.shards(),
            "node serving"
        );
        Ok(node)
    }

    fn spawn(&mut self, name: &str, f: impl FnOnce() + Send + 'static) -> Result<()> {
        let t = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(f)
            .map_err(|e| Error::Config(format!("cannot start thread {name}: {e}")))?;
        self.threads.push(t);
        Ok(())
    }

    /// The store handle (for embedding and tests).
    pub fn handle(&self) -> Handle {
        self.state.handle.clone()
    }

    /// Stops accepting, finishes requests in flight, writes consumer offsets and shuts
    /// the store down cleanly.
    pub fn shutdown(mut self) -> Result<()> {
        self.stop()
    }

    fn stop(&mut self) -> Result<()> {
        let Some(store) = self.store.take() else {
            return Ok(());
        };
        let st = &self.state;
        tracing::info!("node shutting down");
        st.shutting.store(true, Ordering::SeqCst);
        // Wake the accept threads (each sees the flag on its next accept).
        for addr in &self.wake {
            let _ = TcpStream::connect_timeout(&wake_addr(*addr), Duration::from_secs(1));
        }
        if let Some(mut net) = self.shard_net.take() {
            // Held pulls answer once signalled; the shards wait for their connections.
            let waker = {
                let st = st.clone();
                std::thread::spawn(move || {
                    while st.open.load(Ordering::SeqCst) > 0
                        && !st.net_stopped.load(Ordering::SeqCst)
                    {
                        st.arrivals.wake_all();
                        std::thread::sleep(Duration::from_millis(20));
                    }
                })
            };
            net.stop();
            st.net_stopped.store(true, Ordering::SeqCst);
            let _ = waker.join();
        }
        for (_, c) in lock(&st.conns).iter() {
            let _ = c.shutdown(Shutdown::Read);
        }
        st.arrivals.wake_all();
        let deadline = Instant::now() + Duration::from_secs(10);
        while st.active.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        for (_, c) in lock(&st.conns).drain() {
            let _ = c.shutdown(Shutdown::Both);
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        let offsets = st.offsets.persist();
        let stored = store.shutdown();
        tracing::info!("node shut down");
        offsets.and(stored)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            tracing::error!(error = %e, "node shutdown on drop failed");
        }
    }
}

/// Where to connect to reach a listener bound to `addr` (0.0.0.0 means loopback).
fn wake_addr(addr: SocketAddr) -> SocketAddr {
    if addr.ip().is_unspecified() {
        SocketAddr::from(([127, 0, 0, 1], addr.port()))
    } else {
        addr
    }
}

fn accept_loop(st: Arc<NodeState>, listener: TcpListener) {
    for conn in listener.incoming() {
        if st.shutting.load(Ordering::SeqCst) {
            return;
        }
        let stream = match conn {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        if !st.try_open_connection() {
            continue;
        }
        let id = st.next_conn.fetch_add(1, Ordering::Relaxed);
        let Ok(clone) = stream.try_clone() else {
            st.open.fetch_sub(1, Ordering::SeqCst);
            continue;
        };
        lock(&st.conns).insert(id, clone);
        let guard = ActiveGuard::new(&st);
        let st2 = st.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("coremq-conn-{id}"))
            .spawn(move || {
                let _guard = guard;
                serve_connection(&st2, id, stream);
                lock(&st2.conns).remove(&id);
                st2.clients.connection_closed(id);
                st2.open.fetch_sub(1, Ordering::SeqCst);
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start a connection thread");
            lock(&st.conns).remove(&id);
            st.open.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Reads one frame; `Ok(None)` at a clean end of stream.
fn read_frame(
    r: &mut impl Read,
    max: usize,
) -> std::result::Result<Option<RemotingCommand>, ReadError> {
    let mut prefix = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match r.read(&mut prefix[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(ReadError::Io(std::io::ErrorKind::UnexpectedEof.into())),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(ReadError::Io(e)),
        }
    }
    let len = remoting::check_length(prefix, max).map_err(ReadError::Frame)?;
    // Memory grows with the bytes that arrive, not with the length a peer declares.
    let mut payload = Vec::with_capacity(len.min(remoting::INITIAL_FRAME_BUFFER));
    r.take(len as u64)
        .read_to_end(&mut payload)
        .map_err(ReadError::Io)?;
    if payload.len() != len {
        return Err(ReadError::Io(std::io::ErrorKind::UnexpectedEof.into()));
    }
    remoting::decode_payload(payload.into())
        .map(Some)
        .map_err(ReadError::Frame)
}

enum ReadError {
    Io(std::io::Error),
    Frame(FrameError),
}

type Writer = Arc<Mutex<TcpStream>>;

fn send_response(w: &Writer, resp: &RemotingCommand) {
    let bytes = resp.encode();
    let _ = lock(w).write_all(&bytes);
}

fn serve_connection(st: &Arc<NodeState>, id: u64, stream: TcpStream) {
    let peer = stream
        .peer_addr()
        .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
    let _ = stream.set_nodelay(true);
    let _ = stream.set_read_timeout(Some(st.cfg.idle_timeout()));
    let Ok(w) = stream.try_clone() else {
        return;
    };
    let writer: Writer = Arc::new(Mutex::new(w));
    let mut reader = BufReader::with_capacity(64 << 10, stream);
    tracing::debug!(%peer, conn = id, "connection open");
    loop {
        let req = match read_frame(&mut reader, st.cfg.max_frame_bytes) {
            Ok(Some(req)) => req,
            Ok(None) => break,
            Err(ReadError::Io(e)) => {
                tracing::debug!(%peer, conn = id, error = %e, "connection closed");
                break;
            }
            Err(ReadError::Frame(e)) => {
                st.metrics.bad_frames.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%peer, conn = id, error = %e, "malformed frame; closing the connection");
                let _ = lock(&writer).shutdown(Shutdown::Both);
                break;
            }
        };
        if req.is_response() {
            continue; // This side sends no requests yet.
        }
        match futures_lite::future::block_on(process::process(st, req, id, peer)) {
            Outcome::Reply(resp) => send_response(&writer, &resp),
            Outcome::NoReply => {}
            Outcome::Hold(hold) => {
                let guard = ActiveGuard::new(st);
                let (st2, w2) = (st.clone(), writer.clone());
                let spawned = std::thread::Builder::new()
                    .name(format!("coremq-hold-{id}"))
                    .spawn(move || {
                        let _guard = guard;
                        let resp = futures_lite::future::block_on(process::serve_hold(
                            &st2,
                            hold,
                            process::Waiting::Blocking,
                        ));
                        send_response(&w2, &resp);
                    });
                if let Err(e) = spawned {
                    tracing::error!(error = %e, "cannot start a pull-hold thread");
                }
            }
        }
    }
    // The socket closes when the last clone goes: held pulls of this connection still
    // answer (at shutdown the read side is closed first, then the holds reply).
}

/// Writes consumer offsets and expires silent clients, until shutdown.
fn housekeeping(st: Arc<NodeState>) {
    let every = Duration::from_millis(st.cfg.offset_flush_interval_ms.max(10));
    let mut last = Instant::now();
    while !st.shutting.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(50));
        if last.elapsed() < every {
            continue;
        }
        last = Instant::now();
        if let Err(e) = st.offsets.persist() {
            tracing::error!(error = %e, "cannot write consumer offsets");
        }
        st.clients
            .expire(Duration::from_millis(st.cfg.client_expiry_ms));
    }
}

/// A minimal HTTP/1.0 responder: `GET /metrics` (any path) gets the counters.
fn metrics_loop(st: Arc<NodeState>, listener: TcpListener) {
    for conn in listener.incoming() {
        if st.shutting.load(Ordering::SeqCst) {
            return;
        }
        let Ok(mut s) = conn else { continue };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        let mut buf = [0u8; 2048];
        let _ = s.read(&mut buf);
        let shards: Vec<Option<crate::ShardStatus>> = (0..st.handle.shards())
            .map(|i| futures_lite::future::block_on(st.handle.shard_status(i)).ok())
            .collect();
        let body = st.metrics.render(st.open.load(Ordering::SeqCst), &shards);
        let head = format!(
            "HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        let _ = s
            .write_all(head.as_bytes())
            .and_then(|_| s.write_all(body.as_bytes()));
    }
}
