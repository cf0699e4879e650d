//! [`ShardedStore`]: N shards, one glommio executor thread each, under one root.
//!
//! RocketMQ has no sharding: a broker runs one `DefaultMessageStore`. `ShardedStore` is
//! coremq's, and each of its shards is one such store (a [`Store`] under
//! `<root>/shard-<i>/`, laid out as a RocketMQ store root) owning a disjoint set of
//! queues (see `ownership`). It holds `<root>/lock` for the whole store and checks
//! `<root>/store.meta` (see `meta`) before any shard opens.
//!
//! * **Lifecycle.** `open` starts every executor, each opening (and recovering) its
//!   store, and returns once all are open, or shuts down the ones that opened and
//!   returns the first error. `shutdown` (or drop) shuts every shard down cleanly
//!   (flush, checkpoint, remove `abort`) and joins the threads; a dead shard is
//!   reported, not waited for.
//! * **Failure isolation.** A shard whose store fails (I/O error, fail-stop) answers
//!   every put with `ServiceNotAvailable` and reports its failure in `shard_status`; a
//!   shard whose thread dies (a panicking task takes its executor down) is marked dead
//!   by [`Alive`] and refused at once. The other shards go on either way.
//! * **Spinning.** glommio's fixed `spin_before_park` is off by default: 50 us of
//!   spinning at every park cut a cross-executor round trip from ~64 us to ~6 us, but
//!   it slowed fdatasync, whose completion work runs on the executor's CPU
//!   (docs/performance/shard.md), and it burns CPU while idle. Instead a shard stays
//!   awake only while requests arrive close together (`awake_window`) or while it
//!   waits for another shard's reply that is expected soon (`reply_spin`) or for a
//!   timer due soon (`timer_spin`): `wait.rs`.
//! * **Placement** (`pin`, `cpus`): shard `i` runs on `cpus[i]` (default: the CPUs
//!   this process may use, the data disk's interrupt CPUs first when there are fewer
//!   shards than CPUs: `placement.rs`), or wherever the kernel puts it (`pin = false`).
//!   A pinned shard that is mostly idle lets the kernel place it until it is busy
//!   again (`unpin_when_idle`, `idle_unpin.rs`).
//!   A shard's io_uring workers (its file writes) go to the CPUs that hold no shard,
//!   when there are any (`io_worker_cpus`, `io_workers.rs`).

use super::handle::{self, Handle, Inbox};
use super::meta::read_or_create_meta;
use super::ops::Route;
use super::ownership::{MAX_SHARDS, SHARD_SHIFT};
use super::stall::Beats;
use crate::config::StoreConfig;
use crate::error::{Error, Result};
use crate::store::Store;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Default [`ShardedConfig::awake_window`] (README "Measured": how it was chosen).
pub const DEFAULT_AWAKE_WINDOW: Duration = Duration::from_micros(50);
/// Default [`ShardedConfig::reply_spin`].
pub const DEFAULT_REPLY_SPIN: Duration = Duration::from_micros(50);
/// Default [`ShardedConfig::timer_spin`] (README "Measured": how it was chosen).
pub const DEFAULT_TIMER_SPIN: Duration = Duration::from_micros(30);
/// Default [`ShardedConfig::preempt_timer`]: how long a task queue may keep a shard
/// while another waits. glommio's own default is 100 ms; every figure in README
/// "Measured" ran at 5 ms, which the load generator measured best (100 ms: put tail
/// 60-90 ms; 1 ms: lower throughput, higher p99.9).
pub const DEFAULT_PREEMPT_TIMER: Duration = Duration::from_millis(5);

#[derive(Debug, Clone)]
pub struct ShardedConfig {
    pub root: PathBuf,
    /// Number of shards (executors); defaults to the CPUs this process may use.
    pub shards: usize,
    /// Pin each shard's executor to one CPU (see `cpus`); `false`: the kernel places
    /// them.
    pub pin: bool,
    /// With `pin`: shard `i` runs on CPU `cpus[i]`. `None` (default): the CPUs this
    /// process may use, in order, except that with fewer shards than CPUs the CPUs
    /// taking the data disk's interrupts come first (a sync put's round is woken
    /// there: `placement.rs`); shards beyond the CPUs are not pinned.
    pub cpus: Option<Vec<usize>>,
    /// The CPUs each shard's io_uring workers (its file writes and fdatasyncs) may run
    /// on. `None` (default): with `pin`, the CPUs this process may use that hold no
    /// shard, when there are any, else the kernel's default (the shard's own CPU);
    /// `Some(list)`: those CPUs, an empty list keeping the kernel's default.
    /// `io_workers.rs`.
    pub io_worker_cpus: Option<Vec<usize>>,
    /// After requests that arrived closer together than this, a shard keeps its
    /// executor awake (polling, not parked) for this long, so the next request finds
    /// it awake; zero: always park when idle. `wait.rs`.
    pub awake_window: Duration,
    /// A caller (a plain thread in [`block_on`](super::block_on), or a shard waiting
    /// for another shard) spins up to this long for a reply before parking, while
    /// replies have been coming back within it; never on the answering shard's CPU.
    /// Zero: always park. `wait.rs`.
    pub reply_spin: Duration,
    /// A shard with nothing to run keeps its executor awake (polling, not parked)
    /// while its next timer is due within this; zero: park whatever the next timer.
    /// `wait.rs`.
    pub timer_spin: Duration,
    /// Template for every shard's store (root and base offset are set per shard).
    pub store: StoreConfig,
    /// Requests that may wait in a shard's queue before senders wait.
    pub channel_capacity: usize,
    /// With `pin` (default: on): a shard busy less than a tenth of a CPU over a
    /// quarter second lets the kernel place its thread on any of the shards' CPUs, and
    /// pins itself again above a quarter of a CPU (`idle_unpin.rs`: at light load
    /// it is woken where its waker runs).
    pub unpin_when_idle: bool,
    /// glommio `spin_before_park` (off by default; see the module docs).
    pub spin_before_park: Option<Duration>,
    /// glommio registered I/O memory per shard.
    pub io_memory_bytes: usize,
    /// glommio `preempt_timer`: how long a task queue may run while another waits
    /// ([`DEFAULT_PREEMPT_TIMER`]; `None`: glommio's default, 100 ms).
    pub preempt_timer: Option<Duration>,
    /// Report a shard whose executor did not turn for longer than this as stalled
    /// (`stall.rs`); `None`: no stall detection. 10 ms.
    pub stall_threshold: Option<Duration>,
}

impl ShardedConfig {
    pub fn new(root: impl Into<PathBuf>) -> ShardedConfig {
        let root = root.into();
        ShardedConfig {
            shards: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            pin: true,
            cpus: None,
            io_worker_cpus: None,
            awake_window: DEFAULT_AWAKE_WINDOW,
            reply_spin: DEFAULT_REPLY_SPIN,
            timer_spin: DEFAULT_TIMER_SPIN,
            store: StoreConfig::new(&root),
            root,
            channel_capacity: 4096,
            unpin_when_idle: true,
            spin_before_park: None,
            io_memory_bytes: 64 << 20,
            preempt_timer: Some(DEFAULT_PREEMPT_TIMER),
            stall_threshold: Some(Duration::from_millis(10)),
        }
    }

    fn shard_config(&self, i: usize) -> StoreConfig {
        StoreConfig {
            root: self.root.join(format!("shard-{i}")),
            log_base_offset: (i as u64) << SHARD_SHIFT,
            ..self.store.clone()
        }
    }

    fn validate(&self) -> Result<()> {
        if self.shards == 0 || self.shards > MAX_SHARDS {
            return Err(Error::Config(format!(
                "shards must be within 1..={MAX_SHARDS}"
            )));
        }
        if self.channel_capacity == 0 {
            return Err(Error::Config("channel_capacity must be positive".into()));
        }
        if let Some(list) = &self.cpus {
            if list.len() < self.shards {
                return Err(Error::Config(format!(
                    "cpus names {} CPUs for {} shards",
                    list.len(),
                    self.shards
                )));
            }
            allowed_only("cpus", list)?;
        }
        if let Some(list) = &self.io_worker_cpus {
            allowed_only("io_worker_cpus", list)?;
        }
        (0..self.shards).try_for_each(|i| self.shard_config(i).validate())
    }

    /// The CPUs the shards' io_uring workers go to (empty: the kernel's default).
    fn io_worker_cpus(&self, shard_cpus: &[Option<usize>]) -> Vec<usize> {
        match &self.io_worker_cpus {
            Some(list) => list.clone(),
            None => super::io_workers::default_worker_cpus(
                &crate::shard::wait::allowed_cpus(),
                shard_cpus,
            ),
        }
    }

    /// The CPU each shard is pinned to, if any (`placement.rs` when `cpus` is not
    /// given; the root must exist: its disk decides).
    fn shard_cpus(&self) -> Vec<Option<usize>> {
        if !self.pin {
            return vec![None; self.shards];
        }
        match &self.cpus {
            Some(list) => (0..self.shards).map(|i| list.get(i).copied()).collect(),
            None => super::placement::shard_cpus(
                &crate::shard::wait::allowed_cpus(),
                self.shards,
                &self.root,
            ),
        }
    }

    fn executor(&self, i: usize, cpu: Option<usize>) -> glommio::LocalExecutorBuilder {
        let placement = match cpu {
            Some(cpu) => glommio::Placement::Fixed(cpu),
            None => glommio::Placement::Unbound,
        };
        let mut builder = glommio::LocalExecutorBuilder::new(placement)
            .name(&format!("coremq-shard-{i}"))
            .io_memory(self.io_memory_bytes);
        if let Some(spin) = self.spin_before_park {
            builder = builder.spin_before_park(spin);
        }
        if let Some(t) = self.preempt_timer {
            builder = builder.preempt_timer(t);
        }
        builder
    }
}

/// Refuses a CPU in `list` (the field `what`) that this process may not run on.
fn allowed_only(what: &str, list: &[usize]) -> Result<()> {
    let allowed = crate::shard::wait::allowed_cpus();
    match list.iter().find(|c| !allowed.contains(c)) {
        Some(c) => Err(Error::Config(format!(
            "{what}: CPU {c} is not one this process may run on ({allowed:?})"
        ))),
        None => Ok(()),
    }
}

/// How a shard's thread waits and where its io_uring workers run (`shard_main`).
struct ThreadSetup {
    awake_window: Duration,
    timer_spin: Duration,
    /// The shard's CPU and the CPUs of all shards, when it unpins itself while idle.
    unpin_when_idle: Option<(usize, Vec<usize>)>,
    /// Empty: the kernel's default.
    io_worker_cpus: Vec<usize>,
}

/// The running sharded store: owns the shard threads and the store-wide lock.
pub struct ShardedStore {
    handle: Handle,
    /// Replication (`crate::ha`), when configured: stopped before the shards.
    ha: Option<crate::ha::HaService>,
    threads: Vec<glommio::ExecutorJoinHandle<()>>,
    _lock: std::fs::File,
    root: PathBuf,
    /// The stall detector's beats and monitor thread (`stall.rs`), when on.
    stall: Option<(Arc<Beats>, std::thread::JoinHandle<()>)>,
}

impl ShardedStore {
    /// Opens every shard (recovering each) and starts its executor thread. Blocks the
    /// calling thread until all shards are open; call it outside any executor.
    pub fn open(cfg: ShardedConfig) -> Result<ShardedStore> {
        cfg.validate()?;
        // Durable with its parents: the shards' directories are entries in it.
        crate::io::Disk::Real.create_dir_all(&cfg.root)?;
        let lock = crate::io::lock_root(&cfg.root)?;
        let ownership = read_or_create_meta(&cfg.root, cfg.shards)?;
        let (handle, inboxes) =
            Handle::new(cfg.shards, cfg.channel_capacity, ownership, cfg.reply_spin);
        let beats = cfg.stall_threshold.map(|t| Beats::new(cfg.shards, t));
        let cpus = cfg.shard_cpus();
        // Where an idle shard may go: the shards' CPUs, not the ones left to io_uring
        // workers or to the application.
        let mut shards_cpus: Vec<usize> = cpus.iter().flatten().copied().collect();
        shards_cpus.sort_unstable();
        shards_cpus.dedup();
        let worker_cpus = cfg.io_worker_cpus(&cpus);
        if !worker_cpus.is_empty() {
            tracing::info!(cpus = ?worker_cpus, "the shards' io_uring workers (file writes) run on these CPUs");
        }
        let mut threads = Vec::new();
        let mut ready = Vec::new();
        for (i, inbox) in inboxes.into_iter().enumerate() {
            let (ready_tx, ready_rx) = flume::bounded(1);
            let store_cfg = cfg.shard_config(i);
            let h = handle.clone();
            let b = beats.clone();
            let setup = ThreadSetup {
                awake_window: cfg.awake_window,
                timer_spin: cfg.timer_spin,
                unpin_when_idle: cpus[i]
                    .filter(|_| cfg.unpin_when_idle)
                    .map(|c| (c, shards_cpus.clone())),
                io_worker_cpus: worker_cpus.clone(),
            };
            let spawned = cfg
                .executor(i, cpus[i])
                .spawn(move || shard_main(i, store_cfg, inbox, h, setup, ready_tx, b));
            match spawned {
                Ok(t) => threads.push(t),
                Err(e) => {
                    handle.close();
                    return Err(Error::Config(format!("cannot start shard {i}: {e}")));
                }
            }
            ready.push(ready_rx);
        }
        let mut first_err = None;
        for (i, r) in ready.into_iter().enumerate() {
            let outcome = r.recv().unwrap_or_else(|_| {
                Err(Error::ShardUnavailable {
                    shard: i,
                    why: "shard thread died while opening".into(),
                })
            });
            if let Err(e) = outcome {
                first_err.get_or_insert(e);
            }
        }
        let mut store = ShardedStore {
            handle,
            ha: None,
            threads,
            _lock: lock,
            root: cfg.root.clone(),
            stall: None,
        };
        if let Some(b) = beats {
            let monitor = b.clone();
            match std::thread::Builder::new()
                .name("coremq-stall-monitor".into())
                .spawn(move || monitor.run_monitor())
            {
                Ok(t) => store.stall = Some((b, t)),
                Err(e) => tracing::warn!(error = %e, "no stall monitor thread"),
            }
        }
        if let Some(e) = first_err {
            let _ = store.stop();
            return Err(e);
        }
        // The calls up the module list: scheduled delivery (`crate::schedule`) runs on
        // every master shard, reaching the others through its context; the HA service
        // reaches the shards only through the public handle (`crate::ha`).
        if let Err(e) = start_services(&store.handle, &cfg.store) {
            let _ = store.stop();
            return Err(e);
        }
        match crate::ha::HaService::start(&store.handle, &cfg.store.ha) {
            Ok(ha) => store.ha = ha,
            Err(e) => {
                let _ = store.stop();
                return Err(e);
            }
        }
        tracing::info!(root = %cfg.root.display(), shards = cfg.shards, "sharded store open");
        Ok(store)
    }

    pub fn handle(&self) -> Handle {
        self.handle.clone()
    }

    /// The HA service, when replication is configured (`StoreConfig::ha`).
    pub fn ha(&self) -> Option<&crate::ha::HaService> {
        self.ha.as_ref()
    }

    /// Shuts every shard down cleanly (flush, checkpoint, remove `abort`) and joins the
    /// threads. Returns the first failure; every shard is stopped either way.
    pub fn shutdown(mut self) -> Result<()> {
        self.stop()
    }

    fn stop(&mut self) -> Result<()> {
        if let Some(mut ha) = self.ha.take() {
            ha.stop();
        }
        if let Some((beats, monitor)) = self.stall.take() {
            beats.stop();
            // Its sleep may be an idle look long: ended now.
            monitor.thread().unpark();
            let _ = monitor.join();
        }
        if self.threads.is_empty() {
            return Ok(());
        }
        // Services first, on every shard, while every shard still serves: a service
        // may wait on a put to another shard (`Store::stop_services`).
        let stops: Vec<_> = (0..self.handle.shards())
            .filter(|&i| self.handle.is_alive(i))
            .map(|i| {
                self.handle
                    .run_at(i, &(), async |s, _| s.stop_services().await)
            })
            .collect();
        let _ = futures_lite::future::block_on(crate::wake::join_all(stops));
        let alive = &self.handle.shared.alive;
        let mut first_err = None;
        for (i, answer) in self.handle.shut_down_all().into_iter().enumerate() {
            // Polled, so that a shard whose thread dies meanwhile is not waited for.
            let reply = loop {
                match answer.recv_timeout(Duration::from_millis(100)) {
                    Err(flume::RecvTimeoutError::Timeout) if alive[i].load(Ordering::SeqCst) => {}
                    Err(_) => break Err(handle::gone(i)),
                    Ok(r) => break r,
                }
            };
            if let Err(e) = reply {
                first_err.get_or_insert(e);
            }
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        tracing::info!(root = %self.root.display(), "sharded store shut down");
        first_err.map_or(Ok(()), Err)
    }
}

impl Drop for ShardedStore {
    /// Dropping without `shutdown` still shuts down cleanly (errors are logged).
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            tracing::error!(error = %e, "shutdown on drop failed");
        }
    }
}

/// Starts the delivery services (`crate::schedule`) on every shard of a master whose
/// configuration asks for them.
fn start_services(handle: &Handle, cfg: &StoreConfig) -> Result<()> {
    if !cfg.schedule.deliver || cfg.ha.role == crate::config::HaRole::Slave {
        return Ok(());
    }
    for shard in 0..handle.shards() {
        let job = handle.run_on(shard, |ctx| async move { crate::schedule::start(ctx) });
        futures_lite::future::block_on(job)??;
    }
    Ok(())
}

/// Lives as long as a shard's main task. When the task ends, or its thread does (a
/// panicking task unwinds out of the executor), it marks the shard dead and drops queued
/// requests, so their callers get an error instead of waiting for ever.
struct Alive {
    shard: usize,
    handle: Handle,
    inbox: Inbox,
}

impl Drop for Alive {
    fn drop(&mut self) {
        self.handle.shared.alive[self.shard].store(false, Ordering::SeqCst);
        while let Ok(req) = self.inbox.try_recv() {
            drop(req);
        }
        self.handle.close_rings(self.shard);
    }
}

thread_local! {
    /// This shard thread's [`Alive`], kept by the thread rather than by the main task:
    /// when a panic unwinds out of the executor, glommio drops the panicking task but
    /// leaks the sleeping ones (the main task among them, waiting on its inbox), so a
    /// guard inside the task was never dropped and the dead shard looked alive (issue
    /// 16: the node's watchdog, `shard_status` and `shutdown` waited on it for ever).
    /// Thread-local destructors run when the thread ends, however it ends.
    static ALIVE: std::cell::RefCell<Option<Alive>> = const { std::cell::RefCell::new(None) };
}

async fn shard_main(
    shard: usize,
    cfg: StoreConfig,
    inbox: Inbox,
    handle: Handle,
    setup: ThreadSetup,
    ready: flume::Sender<Result<()>>,
    beats: Option<Arc<Beats>>,
) {
    // Before the store opens: workers take the mask when they are created.
    let workers = &setup.io_worker_cpus;
    if !workers.is_empty()
        && let Err(e) = super::io_workers::confine_this_threads_workers(workers)
    {
        tracing::warn!(shard, cpus = ?workers, error = %e, "the shard's io_uring workers stay on its CPU");
    }
    let alive = Alive {
        shard,
        handle: handle.clone(),
        inbox: inbox.clone(),
    };
    ALIVE.with(|a| *a.borrow_mut() = Some(alive));
    crate::shard::wait::enter_shard(setup.awake_window, setup.timer_spin);
    if let Some((cpu, all)) = setup.unpin_when_idle {
        glommio::spawn_local(super::idle_unpin::follow_load(shard, cpu, all)).detach();
    }
    shard_serve(shard, cfg, &handle, inbox, ready, beats).await;
    // A normal end: dead from here (a panic's end is the thread-local's destructor).
    ALIVE.with(|a| drop(a.borrow_mut().take()));
}

async fn shard_serve(
    shard: usize,
    cfg: StoreConfig,
    handle: &Handle,
    inbox: Inbox,
    ready: flume::Sender<Result<()>>,
    beats: Option<Arc<Beats>>,
) {
    match Store::open(cfg).await {
        Ok(store) => {
            // Watched from here: opening blocks on file-system calls by design.
            if let Some(b) = beats {
                use glommio::{Latency, Shares, executor};
                // Other queues yield within half the threshold once a beat is due
                // (`stall.rs`): only code that never yields is late by more.
                let latency = (b.threshold() / 2).max(Duration::from_millis(1));
                let tq = executor().create_task_queue(
                    Shares::Static(1000),
                    Latency::Matters(latency),
                    "stall-watch",
                );
                super::stall::name_queue(tq, "stall-watch");
                if let Ok(t) = glommio::spawn_local_into(b.run_heartbeat(shard), tq) {
                    t.detach();
                }
            }
            let _ = ready.send(Ok(()));
            handle::serve(shard, handle, &inbox, store).await;
        }
        Err(e) => {
            tracing::error!(shard, error = %e, "shard failed to open");
            let _ = ready.send(Err(e));
        }
    }
}
