//! `coremq serve`: a node speaking RocketMQ's classic remoting protocol (see
//! [`crate::node::remoting`]) over the sharded store, so existing RocketMQ clients can
//! produce, consume, commit offsets, query by key and look up by message id. [`Node`]
//! is RocketMQ's `BrokerController`: it opens the store, binds the ports, starts the
//! front end and the background services, and shuts them down in order.
//!
//! * **Ports.** The broker port (default 127.0.0.1:10911) serves every request code;
//!   the name-server port (127.0.0.1:9876) serves the same dispatcher, so route lookups
//!   (`GET_ROUTEINFO_BY_TOPIC`, `GET_BROKER_CLUSTER_INFO`) name this node as the only
//!   broker (broker id 0, read/write) of its cluster. Metrics: Prometheus text at
//!   `http://127.0.0.1:9100/metrics` (`metrics.rs`).
//! * **Where connections run** (`network` in the config):
//!   - `"shards"` (default, `shard_net.rs`): every shard executor accepts on its own
//!     `SO_REUSEPORT` socket of each port (`listen.rs`) and serves its connections as
//!     glommio tasks over io_uring sockets (thread-per-core). A request runs on the
//!     connection's shard and reaches the shard owning its queue through the store's
//!     [`Handle`] (a channel hop; sends and pulls for a queue the connection's shard
//!     owns call that store directly).
//!     Held pulls are tasks waiting on the queue's arrival signal.
//!   - `"threads"` (`thread_net.rs`): one OS thread per connection with blocking
//!     `std::net` sockets and `block_on(handle...)`, kept as a fallback and tested
//!     with the same suite. Held pulls get their own short-lived thread.
//!
//!   Both run the same request processors (`processor/`, async, front-end free).
//! * **Responses** go out through one writer per connection (a write lock, or a
//!   writer task fed by a channel), so a held pull answered later never interleaves
//!   with another response; requests may be answered out of order (by `opaque`).
//!   Requests the broker starts (transaction check-backs, consumer-ids-changed notices,
//!   offset resets: `broker2client.rs`) go through the same writer from a
//!   per-connection outbox (`state::Outboxes`).
//! * **Bad input.** A malformed frame (length outside 4..=`max_frame_bytes`, a header
//!   that does not decode, an unknown serialize type) closes only its connection.
//!   Unknown request codes get `REQUEST_CODE_NOT_SUPPORTED`; missing or malformed
//!   header fields get `SYSTEM_ERROR` with a remark. Connections beyond
//!   `max_connections` are closed on accept; silent ones after `idle_timeout_ms`.
//! * **Panics.** A request whose handler panics is answered `SYSTEM_ERROR` (remark
//!   naming its code), logged and counted; its shard and connection go on. A panic
//!   inside the store is never caught: its shard stops (fail-stop) and the node fails
//!   loudly. Details: `processor/mod.rs`.
//! * **A dead shard is never silent.** A watchdog (the housekeeping thread, every
//!   second: an idle node's wake-ups) checks that every shard's thread is alive; a shard that died (a store
//!   panic, or any task panicking on its executor) while the node was not shutting
//!   down makes the node failed: logged at error level, `coremq_node_failed` 1,
//!   [`Node::failure`] says why, and `coremq serve` shuts the other shards down
//!   cleanly and exits with status [`EXIT_NODE_FAILED`] (3), so a supervisor restarts
//!   it and recovery runs on the dead shard.
//! * **State beside the store** (`<data-dir>/config/`, `state.rs`): `topics.json`
//!   (queue counts, permissions) and `consumerOffset.json` (RocketMQ's `offsetTable`
//!   shape, written every `offset_flush_interval_ms` and at shutdown).
//! * **Shutdown** ([`Node::shutdown`], on SIGINT/SIGTERM in `coremq serve`): stops
//!   accepting, closes the read side of every connection so no new request starts,
//!   answers held pulls, waits for requests in flight (up to 10 s), writes consumer
//!   offsets, then shuts the store down (flush, checkpoint, remove `abort`).
//! * **Joining a cluster**: with `namesrv_addr` set, the node registers with those
//!   name servers every 30 s (`register.rs`).
//! * **Replication** (`role`, `ha_*`; the library's `crate::ha`): the store's HA port
//!   (10912) serves slaves; a slave node refuses sends (SERVICE_NOT_AVAILABLE, "slave
//!   mode"), serves pulls, key queries and look-ups from its replica, registers as
//!   broker id 1 with `haServerAddr`, and copies its master's topics and consumer
//!   offsets every `slave_sync_interval_ms` (`slave_sync.rs`, codes 21 and 43, which
//!   every node serves). A master's pull responses suggest the slave (broker id 1)
//!   when the pulled record lies far behind the log's end (`suggestWhichBrokerId`).
//! * Not yet: transactions, delayed delivery (messages sent back are visible in
//!   `%RETRY%group` at once), delay offsets on slaves, unregistering from name servers
//!   at shutdown.
//!
//! Checked against clients nobody here wrote: `scripts/interop.sh` (Apache RocketMQ's
//! C++ client, PyPI `rocketmq` 0.4.4; run by CI) and `scripts/interop_rust.sh`
//! (`rocketmq-client-rust` 1.0.0). What each covers and the quirks they showed:
//! `docs/performance/node.md`.

mod broker2client;
pub mod config;
mod conn;
mod groups;
mod listen;
mod metrics;
mod out_queue;
mod processor;
mod register;
pub mod remoting;
mod shard_net;
pub mod shard_view;
mod shared_out;
mod slave_sync;
mod state;
mod thread_net;
mod transaction_check;

pub use config::{Network, NodeConfig};

use crate::error::{Error, Result};
use crate::shard::{Handle, ShardedConfig, ShardedStore};
use metrics::Metrics;
use state::{Arrivals, Clients, Offsets, Outboxes, Topics, lock};
use std::collections::HashMap;
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
    /// With `shard_listen`: each shard's broker address (advertised host, bound port),
    /// named in routes as broker `<broker_name>-<shard>` (`shard_view.rs`); else empty.
    pub shard_addrs: Vec<SocketAddrV4>,
    /// The HA address slaves use (advertised host, bound HA port), when listening.
    pub ha_addr: Option<SocketAddrV4>,
    /// RocketMQ's broker id: 0 for a master, 1 for a slave.
    pub broker_id: u64,
    pub topics: Topics,
    pub offsets: Offsets,
    pub clients: Clients,
    /// Subscription groups and queue locks (`groups.rs`).
    pub groups: groups::SubscriptionGroups,
    pub locks: groups::QueueLocks,
    pub client_conns: groups::Connections,
    /// When the node started (ms since the epoch), for the runtime info.
    pub started_ms: i64,
    /// Producer groups (from heartbeats), for transaction check-backs.
    pub producers: Clients,
    pub outboxes: Outboxes,
    pub arrivals: Arc<Arrivals>,
    pub metrics: Metrics,
    pub shutting: AtomicBool,
    /// Wakes the node's periodic threads (`pause`) when `shutting` is set.
    shut_lock: Mutex<()>,
    shut_cv: std::sync::Condvar,
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
    /// Why the node failed (a shard died), once it did.
    failure: Mutex<Option<String>>,
}

impl NodeState {
    /// Records that the node failed (the first reason is kept) and says so loudly.
    pub(crate) fn fail(&self, why: String) {
        let mut failure = lock(&self.failure);
        if failure.is_none() {
            tracing::error!(why = %why, "the node failed: a shard is gone; it must be restarted");
            *failure = Some(why);
        }
    }

    pub(crate) fn failure(&self) -> Option<String> {
        lock(&self.failure).clone()
    }

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

/// A running node.
pub struct Node {
    state: Arc<NodeState>,
    store: Option<ShardedStore>,
    threads: Vec<JoinHandle<()>>,
    shard_net: Option<shard_net::ShardNet>,
    /// Descriptors of the listeners whose accept threads must be woken at shutdown
    /// ([`wake_accept`]).
    wake: Vec<TcpListener>,
    /// Addresses actually bound (useful with port 0).
    pub broker_addr: SocketAddr,
    pub namesrv_addr: Option<SocketAddr>,
    pub metrics_addr: Option<SocketAddr>,
    /// The HA port bound (useful with port 0), when listening.
    pub ha_addr: Option<SocketAddr>,
    /// With `shard_listen`: each shard's own broker port, bound (useful with port 0).
    pub shard_addrs: Vec<SocketAddr>,
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
        // Shard ports: one socket each, shard i's on the base port + i (or each a
        // free port with port 0).
        let shards_listening = match cfg.shard_listen {
            Some(base) => (0..store_cfg.shards.max(1))
                .map(|i| {
                    let port = match base.port() {
                        0 => 0,
                        p => p.checked_add(i as u16).ok_or_else(|| {
                            Error::Config(format!(
                                "shard_listen {base}: port {p} + {i} is past 65535"
                            ))
                        })?,
                    };
                    let mut addr = base;
                    addr.set_port(port);
                    bind(addr, 1, "shard").map(|mut l| l.remove(0))
                })
                .collect::<Result<Vec<_>>>()?,
            None => Vec::new(),
        };
        let shard_bound: Vec<SocketAddr> = shards_listening
            .iter()
            .map(|l| l.local_addr().map_err(|e| Error::Config(e.to_string())))
            .collect::<Result<_>>()?;
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
        store_cfg.store.ha = cfg.ha_config();
        store_cfg.store.schedule = cfg.schedule_config();
        // Whatever dispatch makes visible in a queue (a send, a delayed delivery, a
        // transaction's commit, a put through the handle, a slave's replicated
        // records) wakes the pulls held there.
        let arrivals = Arc::new(Arrivals::default());
        let woken = arrivals.clone();
        store_cfg.store.on_arrival = Some(crate::config::ArrivalHook(Arc::new(
            move |topic: &str, queue_id: i32| woken.arrived(topic, queue_id),
        )));
        let config_dir = cfg.data_dir.join("config");
        let topics = Topics::load(&config_dir)?;
        let offsets = Offsets::load(&config_dir)?;
        let groups = groups::SubscriptionGroups::load(&config_dir)?;
        let store = ShardedStore::open(store_cfg)?;
        let handle = store.handle();
        arrivals.count_for(handle.ownership(), handle.shards());
        if !shards_listening.is_empty()
            && shard_view::ShardView::new(0, handle.shards(), handle.ownership()).is_none()
        {
            return Err(Error::Config(format!(
                "shard_listen: the store in {} spreads queues by the old rule (store.meta \
                 format 1), which shard ports cannot number; leave shard_listen off for it",
                cfg.data_dir.display()
            )));
        }
        let ha_bound = store.ha().and_then(|h| h.listen_addr);
        let is_slave = cfg.ha_role() == Some(crate::config::HaRole::Slave);
        let state = Arc::new(NodeState {
            metrics: Metrics::new(handle.shards()),
            handle,
            broker_addr: advertised,
            shard_addrs: shard_bound
                .iter()
                .map(|a| SocketAddrV4::new(*advertised.ip(), a.port()))
                .collect(),
            ha_addr: ha_bound.map(|a| SocketAddrV4::new(*advertised.ip(), a.port())),
            broker_id: if is_slave { 1 } else { 0 },
            topics,
            offsets,
            clients: Clients::default(),
            groups,
            locks: groups::QueueLocks::default(),
            client_conns: groups::Connections::default(),
            started_ms: crate::now_ms(),
            producers: Clients::default(),
            outboxes: Outboxes::default(),
            arrivals,
            shutting: AtomicBool::new(false),
            shut_lock: Mutex::new(()),
            shut_cv: std::sync::Condvar::new(),
            next_queue: AtomicU64::new(0),
            held: Arc::new(AtomicUsize::new(0)),
            next_conn: AtomicU64::new(1),
            open: AtomicUsize::new(0),
            net_stopped: AtomicBool::new(false),
            conns: Mutex::new(HashMap::new()),
            active: AtomicUsize::new(0),
            failure: Mutex::new(None),
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
            ha_addr: ha_bound,
            shard_addrs: shard_bound,
        };
        node.namesrv_addr = namesrv.as_ref().and_then(|l| l[0].local_addr().ok());
        let groups: Vec<Vec<TcpListener>> = std::iter::once(broker).chain(namesrv).collect();
        if state.cfg.network == Network::Shards {
            node.shard_net = Some(shard_net::ShardNet::start(
                &state,
                groups,
                shards_listening,
            )?);
        } else {
            for l in groups.into_iter().flatten() {
                node.wake.extend(l.try_clone().ok());
                let st = state.clone();
                node.spawn("coremq-accept", move || thread_net::accept_loop(st, l))?;
            }
        }
        if let Some(l) = metrics {
            node.metrics_addr = l.local_addr().ok();
            node.wake.extend(l.try_clone().ok());
            let st = state.clone();
            node.spawn("coremq-metrics", move || metrics::serve(st, l))?;
        }
        let st = state.clone();
        node.spawn("coremq-housekeeping", move || housekeeping(st))?;
        if !is_slave {
            let st = state.clone();
            node.spawn("coremq-tx-check", move || transaction_check::check_loop(st))?;
        }
        if !state.cfg.namesrv_addr.is_empty() {
            let st = state.clone();
            node.spawn("coremq-register", move || register::register_loop(st))?;
        }
        if is_slave && let Some(master) = state.cfg.master_broker_address() {
            let st = state.clone();
            node.spawn("coremq-slave-sync", move || {
                slave_sync::sync_loop(st, master)
            })?;
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

    /// Why the node failed, once it did: a shard's thread died while the node was
    /// serving (a panic inside the store, or any task panicking on a shard). Its
    /// queues are unavailable until the node is restarted (recovery runs on that shard);
    /// the other shards go on. `coremq serve` checks this and exits with
    /// [`EXIT_NODE_FAILED`].
    pub fn failure(&self) -> Option<String> {
        self.state.failure()
    }

    /// Serves one request in this process, as a connection on `shard`'s front end
    /// would (`network = "shards"`: on that shard's executor, `shard` taken modulo the
    /// shard count; `"threads"`: on the calling thread), and returns its response, or
    /// `None` for a one-way request. A held pull is waited for here. Blocks the
    /// calling thread: call it outside any executor. Errors only when the shard is
    /// gone. For embedding without a socket, and for driving the processors in tests
    /// and fuzzing.
    pub fn serve_request(
        &self,
        shard: usize,
        req: remoting::RemotingCommand,
    ) -> Result<Option<remoting::RemotingCommand>> {
        let st = self.state.clone();
        match st.cfg.network {
            Network::Shards => {
                let shard = shard % st.handle.shards();
                let handle = st.handle.clone();
                let job = handle.run_on(shard, move |_| async move {
                    serve_in_process(&st, req, processor::Waiting::Glommio).await
                });
                futures_lite::future::block_on(job)
            }
            Network::Threads => Ok(futures_lite::future::block_on(serve_in_process(
                &st,
                req,
                processor::Waiting::Blocking,
            ))),
        }
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
        {
            let _g = lock(&st.shut_lock);
            st.shut_cv.notify_all();
        }
        // Wake the accept threads (each sees the flag on its next accept).
        for l in &self.wake {
            wake_accept(l);
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
            net.stop(&st.handle);
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

/// The status `coremq serve` exits with when the node failed ([`Node::failure`]).
pub const EXIT_NODE_FAILED: u8 = 3;

/// The connection id of requests served by [`Node::serve_request`] (sockets count
/// from 1).
const IN_PROCESS_CONN: u64 = 0;

async fn serve_in_process(
    st: &NodeState,
    req: remoting::RemotingCommand,
    how: processor::Waiting,
) -> Option<remoting::RemotingCommand> {
    let peer = SocketAddr::from(([127, 0, 0, 1], 0));
    let to = processor::ReplyTo::of(&req);
    match processor::process(st, req, IN_PROCESS_CONN, peer).await {
        processor::Outcome::Reply(resp) => Some(resp.into_command(to)),
        processor::Outcome::NoReply => None,
        processor::Outcome::Hold(hold) => {
            Some(processor::serve_hold(st, hold, how).await.into_command(to))
        }
    }
}

/// Wakes a thread blocked in `accept` on `l` (another descriptor of the same socket):
/// `shutdown(2)` on a listening socket makes a blocked `accept` fail at once (Linux).
/// Connecting to the listener's address instead can reach another process when the
/// address is shared (0.0.0.0 against 127.0.0.1 on the default metrics port), and the
/// shutdown then waited for ever.
fn wake_accept(l: &TcpListener) {
    use std::os::fd::AsRawFd;
    // SAFETY: `l` owns an open socket descriptor for the duration of the call.
    let rc = unsafe { libc::shutdown(l.as_raw_fd(), libc::SHUT_RDWR) };
    if rc != 0 {
        tracing::warn!(
            error = %std::io::Error::last_os_error(),
            addr = ?l.local_addr().ok(),
            "shutdown of a listening socket failed; its accept thread may not wake"
        );
    }
}

/// Writes consumer offsets, expires silent clients and watches the shards, until
/// shutdown.
fn housekeeping(st: Arc<NodeState>) {
    let every = Duration::from_millis(st.cfg.offset_flush_interval_ms.max(10));
    let mut last = Instant::now();
    while st.pause(WATCH_INTERVAL.min(every)) {
        watch_shards(&st);
        if last.elapsed() < every {
            continue;
        }
        last = Instant::now();
        if let Err(e) = st.offsets.persist() {
            tracing::error!(error = %e, "cannot write consumer offsets");
        }
        let silent = st
            .clients
            .expire(Duration::from_millis(st.cfg.client_expiry_ms));
        broker2client::consumer_ids_changed(&st, &silent, "a client went silent");
        st.producers
            .expire(Duration::from_millis(st.cfg.client_expiry_ms));
    }
}

/// How often the watchdog looks at the shards' threads: each look is a wake-up of an
/// idle node (at 250 ms they were 4 of its ~12 a second; `coremq serve`'s main thread
/// looks for a failed node once a second too, so a dead shard stops it within ~2 s).
const WATCH_INTERVAL: Duration = Duration::from_secs(1);

impl NodeState {
    /// Sleeps `d`, or less when the node starts shutting down; returns whether it is
    /// still serving. The node's periodic threads sleep here, not in polling loops.
    pub(crate) fn pause(&self, d: Duration) -> bool {
        let g = lock(&self.shut_lock);
        let _ = self
            .shut_cv
            .wait_timeout_while(g, d, |_| !self.shutting.load(Ordering::SeqCst));
        !self.shutting.load(Ordering::SeqCst)
    }
}

/// The watchdog: a shard whose thread ended while the node is serving makes the node
/// failed (see the module docs).
fn watch_shards(st: &NodeState) {
    for shard in 0..st.handle.shards() {
        if !st.handle.is_alive(shard) && !st.shutting.load(Ordering::SeqCst) {
            st.fail(format!(
                "shard {shard} stopped: its executor died (a task panicked on it); \
                 its queues are unavailable until the node restarts"
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A thread blocked in `accept` wakes when another descriptor of its socket is shut
    /// down, without any connection (which could reach another process).
    #[test]
    fn a_blocked_accept_wakes_on_shutdown_of_the_listener() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let other = l.try_clone().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let t = std::thread::spawn(move || {
            let r = l.accept().map(|_| ());
            let _ = tx.send(r.is_err());
        });
        std::thread::sleep(Duration::from_millis(100));
        wake_accept(&other);
        let failed = rx
            .recv_timeout(Duration::from_secs(5))
            .expect("the accept thread woke");
        assert!(failed, "accept returned an error, not a connection");
        t.join().unwrap();
    }
}
