//! One shard per core: N glommio executors, each owning a disjoint set of
//! topic-queues through its own [`Store`] under `<root>/shard-<i>/`.
//!
//! * **Ownership** of `(topic, queue_id)` is `crc32(topic, 0x00, queue_id as BE i32) %
//!   shards`: CRC-32 is fixed by its standard, so the mapping is stable across
//!   versions, platforms and restarts (ahash is only for in-memory maps).
//! * **Offsets name their shard.** Shard `i`'s CommitLog starts at `i << 56`, so a
//!   commit-log offset, and the RocketMQ offset message id built from it (store host,
//!   port, offset), decode to (shard, offset) with no extra field, and the ids clients
//!   compute from pulled records are the same ids. Shard 0 starts at 0, so a RocketMQ
//!   store root opens as a one-shard store.
//! * **Two ways in.** [`Handle`] is `Send + Sync + Clone`: any thread (plain, tokio,
//!   another executor) calls its async methods; each request travels over a bounded
//!   flume channel (glommio's own cross-thread channel dependency) to the owning shard
//!   and runs there as a task. [`Handle::run_on`] runs the application's own code on a
//!   shard's executor with a [`ShardContext`], whose calls for queues that shard owns
//!   go straight to the local [`Store`] with no hop.
//! * **Failure isolation.** A shard whose store fails (I/O error, fail-stop) answers
//!   every put with `ServiceNotAvailable` and reports its failure; the other shards go
//!   on. A shard thread that is gone answers with [`Error::ShardUnavailable`].
//! * `<root>/store.meta` records the format version and the shard count; opening with
//!   another count is refused. `<root>/lock` guards the whole store.
//!
//! Spinning: glommio can spin before parking an idle executor. Here a cross-executor
//! round trip took ~64 us without spinning and ~6 us with 50 us of spinning, but
//! spinning slowed fdatasync (the kernel's completion work runs on the executor's CPU),
//! so it is off by default and configurable (`spin_before_park`).

use crate::config::StoreConfig;
use crate::error::{Error, Result};
use crate::format::msg_id::MessageId;
use crate::message::*;
use crate::store::Store;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Bits of a commit-log offset below the shard number.
pub const SHARD_SHIFT: u32 = 56;
/// Most shards a store can have (offsets stay below 2^63).
pub const MAX_SHARDS: usize = 1 << (63 - SHARD_SHIFT);
pub const META_FORMAT_VERSION: u32 = 1;

/// The shard that owns `(topic, queue_id)` among `shards`.
pub fn shard_of(topic: &str, queue_id: i32, shards: usize) -> usize {
    let mut h = crc32fast::Hasher::new();
    h.update(topic.as_bytes());
    h.update(&[0]);
    h.update(&queue_id.to_be_bytes());
    (h.finalize() as usize) % shards
}

/// The shard a commit-log offset belongs to.
pub fn shard_of_offset(offset: LogOffset) -> usize {
    (offset >> SHARD_SHIFT) as usize
}

#[derive(Debug, Clone)]
pub struct ShardedConfig {
    pub root: PathBuf,
    /// Number of shards (executors); defaults to the CPUs this process may use.
    pub shards: usize,
    /// Pin shard `i` to CPU `i` (when that CPU exists).
    pub pin: bool,
    /// Template for every shard's store (root and base offset are set per shard).
    pub store: StoreConfig,
    /// Requests that may wait in a shard's queue before senders wait.
    pub channel_capacity: usize,
    /// glommio `spin_before_park` (off by default; see the module docs).
    pub spin_before_park: Option<Duration>,
    /// glommio registered I/O memory per shard.
    pub io_memory_bytes: usize,
    /// glommio `preempt_timer`: how long a task queue may run while another waits
    /// (`None`: glommio's default, 100 ms).
    pub preempt_timer: Option<Duration>,
}

impl ShardedConfig {
    pub fn new(root: impl Into<PathBuf>) -> ShardedConfig {
        let root = root.into();
        ShardedConfig {
            shards: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            pin: true,
            store: StoreConfig::new(&root),
            root,
            channel_capacity: 4096,
            spin_before_park: None,
            io_memory_bytes: 64 << 20,
            preempt_timer: None,
        }
    }

    fn shard_config(&self, i: usize) -> StoreConfig {
        StoreConfig {
            root: self.root.join(format!("shard-{i}")),
            log_base_offset: (i as u64) << SHARD_SHIFT,
            ..self.store.clone()
        }
    }
}

type Reply<T> = flume::Sender<T>;
type LocalJob = Box<dyn FnOnce(ShardContext) -> Pin<Box<dyn Future<Output = ()>>> + Send>;

enum Request {
    Put(Box<Message>, Reply<PutResult>),
    PutBatch(Vec<Message>, Reply<PutResult>),
    Get {
        topic: String,
        queue_id: i32,
        offset: u64,
        max_count: usize,
        max_bytes: usize,
        reply: Reply<Result<GetResult>>,
    },
    LookByOffset(LogOffset, Reply<Result<Option<StoredMessage>>>),
    QueueOffsets(String, i32, Reply<(QueueOffset, QueueOffset)>),
    OffsetByTime(String, i32, i64, Reply<Result<QueueOffset>>),
    EarliestTime(String, i32, Reply<Result<i64>>),
    QueryByKey {
        topic: String,
        key: String,
        max: usize,
        begin_ms: i64,
        end_ms: i64,
        reply: Reply<Result<Vec<StoredMessage>>>,
    },
    LogOffsets(Reply<ShardStatus>),
    WaitDispatched(Reply<()>),
    Flush(Reply<Result<LogOffset>>),
    Run(LocalJob),
    Shutdown(Reply<Result<()>>),
}

/// A shard's positions and health.
#[derive(Debug, Clone)]
pub struct ShardStatus {
    pub shard: usize,
    pub min_log_offset: LogOffset,
    pub max_log_offset: LogOffset,
    pub committed_log_offset: LogOffset,
    pub flushed_log_offset: LogOffset,
    pub dispatched_log_offset: LogOffset,
    pub failure: Option<String>,
}

struct Shared {
    senders: Vec<flume::Sender<Request>>,
    /// Cleared when a shard's thread ends (even by a panic), see [`Alive`].
    alive: Vec<AtomicBool>,
    closed: AtomicBool,
    /// Most results a key query returns (`StoreConfig::query_max`).
    query_max: usize,
}

/// A `Send + Sync + Clone` handle to every shard.
#[derive(Clone)]
pub struct Handle {
    shared: Arc<Shared>,
}

/// What a task running on a shard gets: the local store and a way to everything else.
#[derive(Clone)]
pub struct ShardContext {
    pub shard: usize,
    pub store: Store,
    pub handle: Handle,
}

/// The running sharded store: owns the shard threads and the store-wide lock.
pub struct ShardedStore {
    handle: Handle,
    threads: Vec<glommio::ExecutorJoinHandle<()>>,
    _lock: std::fs::File,
    root: PathBuf,
}

fn read_or_create_meta(root: &Path, shards: usize) -> Result<()> {
    let path = root.join("store.meta");
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let field = |k: &str| {
                text.lines()
                    .find_map(|l| l.strip_prefix(k).and_then(|v| v.strip_prefix('=')))
                    .and_then(|v| v.trim().parse::<u64>().ok())
            };
            let (Some(format), Some(found)) = (field("format"), field("shards")) else {
                return Err(Error::BadLayout {
                    path,
                    why: "store.meta is unreadable".into(),
                });
            };
            if format != META_FORMAT_VERSION as u64 {
                return Err(Error::BadLayout {
                    path,
                    why: format!("unknown store format {format}"),
                });
            }
            if found as usize != shards {
                return Err(Error::Config(format!(
                    "the store at {} was created with {found} shards; open it with shards = {found} \
                     (changing the count would move queues to shards that do not hold their data)",
                    root.display()
                )));
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let text = format!("format={META_FORMAT_VERSION}\nshards={shards}\n");
            crate::io::Disk::Real.replace_file(&path, text.as_bytes())
        }
        Err(e) => Err(Error::io("read", &path, 0, e)),
    }
}

impl ShardedStore {
    /// Opens every shard (recovering each) and starts its executor thread. Blocks the
    /// calling thread until all shards are open; call it outside any executor.
    pub fn open(cfg: ShardedConfig) -> Result<ShardedStore> {
        if cfg.shards == 0 || cfg.shards > MAX_SHARDS {
            return Err(Error::Config(format!(
                "shards must be within 1..={MAX_SHARDS}"
            )));
        }
        if cfg.channel_capacity == 0 {
            return Err(Error::Config("channel_capacity must be positive".into()));
        }
        for i in 0..cfg.shards {
            cfg.shard_config(i).validate()?;
        }
        std::fs::create_dir_all(&cfg.root).map_err(|e| Error::io("create dir", &cfg.root, 0, e))?;
        let lock = crate::io::lock_root(&cfg.root)?;
        read_or_create_meta(&cfg.root, cfg.shards)?;
        let (senders, receivers): (Vec<_>, Vec<_>) = (0..cfg.shards)
            .map(|_| flume::bounded(cfg.channel_capacity))
            .unzip();
        let handle = Handle {
            shared: Arc::new(Shared {
                senders,
                alive: (0..cfg.shards).map(|_| AtomicBool::new(true)).collect(),
                closed: AtomicBool::new(false),
                query_max: cfg.store.query_max,
            }),
        };
        let cpus = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        let mut threads = Vec::new();
        let mut ready = Vec::new();
        for (i, rx) in receivers.into_iter().enumerate() {
            let placement = if cfg.pin && i < cpus {
                glommio::Placement::Fixed(i)
            } else {
                glommio::Placement::Unbound
            };
            let mut builder = glommio::LocalExecutorBuilder::new(placement)
                .name(&format!("coremq-shard-{i}"))
                .io_memory(cfg.io_memory_bytes);
            if let Some(spin) = cfg.spin_before_park {
                builder = builder.spin_before_park(spin);
            }
            if let Some(t) = cfg.preempt_timer {
                builder = builder.preempt_timer(t);
            }
            let (ready_tx, ready_rx) = flume::bounded(1);
            let store_cfg = cfg.shard_config(i);
            let h = handle.clone();
            let spawned = builder.spawn(move || shard_main(i, store_cfg, rx, h, ready_tx));
            match spawned {
                Ok(t) => threads.push(t),
                Err(e) => {
                    handle.shared.closed.store(true, Ordering::SeqCst);
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
            threads,
            _lock: lock,
            root: cfg.root.clone(),
        };
        if let Some(e) = first_err {
            let _ = store.stop();
            return Err(e);
        }
        tracing::info!(root = %cfg.root.display(), shards = cfg.shards, "sharded store open");
        Ok(store)
    }

    pub fn handle(&self) -> Handle {
        self.handle.clone()
    }

    /// Shuts every shard down cleanly (flush, checkpoint, remove `abort`) and joins the
    /// threads. Returns the first failure; every shard is stopped either way.
    pub fn shutdown(mut self) -> Result<()> {
        self.stop()
    }

    fn stop(&mut self) -> Result<()> {
        if self.threads.is_empty() {
            return Ok(());
        }
        let h = &self.handle;
        h.shared.closed.store(true, Ordering::SeqCst);
        let waits: Vec<_> = h
            .shared
            .senders
            .iter()
            .map(|tx| {
                let (rtx, rrx) = flume::bounded(1);
                let _ = tx.send(Request::Shutdown(rtx));
                rrx
            })
            .collect();
        let mut first_err = None;
        for (i, w) in waits.into_iter().enumerate() {
            let reply = loop {
                match w.recv_timeout(Duration::from_millis(100)) {
                    Err(flume::RecvTimeoutError::Timeout)
                        if h.shared.alive[i].load(Ordering::SeqCst) => {}
                    Err(_) => break Err(()),
                    Ok(r) => break Ok(r),
                }
            };
            match reply {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    first_err.get_or_insert(e);
                }
                Err(_) => {
                    first_err.get_or_insert(gone(i));
                }
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

/// Lives as long as a shard's main task. When the task ends (returns, or is dropped
/// while its thread unwinds from a panic) it marks the shard dead and drops queued
/// requests, so their callers get an error instead of waiting for ever.
struct Alive {
    shard: usize,
    handle: Handle,
    rx: flume::Receiver<Request>,
}

impl Drop for Alive {
    fn drop(&mut self) {
        self.handle.shared.alive[self.shard].store(false, Ordering::SeqCst);
        while let Ok(req) = self.rx.try_recv() {
            drop(req);
        }
    }
}

async fn shard_main(
    shard: usize,
    cfg: StoreConfig,
    rx: flume::Receiver<Request>,
    handle: Handle,
    ready: flume::Sender<Result<()>>,
) {
    let _alive = Alive {
        shard,
        handle: handle.clone(),
        rx: rx.clone(),
    };
    let store = match Store::open(cfg).await {
        Ok(s) => {
            let _ = ready.send(Ok(()));
            s
        }
        Err(e) => {
            tracing::error!(shard, error = %e, "shard failed to open");
            let _ = ready.send(Err(e));
            return;
        }
    };
    let ctx = ShardContext {
        shard,
        store,
        handle,
    };
    while let Ok(req) = rx.recv_async().await {
        if let Request::Shutdown(reply) = req {
            let r = ctx.store.clone().shutdown().await;
            let _ = reply.send(r);
            return;
        }
        glommio::spawn_local(serve(ctx.clone(), req)).detach();
    }
}

async fn serve(ctx: ShardContext, req: Request) {
    let s = &ctx.store;
    // A dropped reply means the caller gave up; nothing to do then.
    match req {
        Request::Put(m, r) => {
            let _ = r.send(s.put(*m).await);
        }
        Request::PutBatch(ms, r) => {
            let _ = r.send(s.put_batch(&ms).await);
        }
        Request::Get {
            topic,
            queue_id,
            offset,
            max_count,
            max_bytes,
            reply,
        } => {
            let _ = reply.send(s.get(&topic, queue_id, offset, max_count, max_bytes).await);
        }
        Request::LookByOffset(o, r) => {
            let _ = r.send(s.look_by_offset(o).await);
        }
        Request::QueueOffsets(t, q, r) => {
            let _ = r.send((s.min_queue_offset(&t, q), s.max_queue_offset(&t, q)));
        }
        Request::OffsetByTime(t, q, ts, r) => {
            let _ = r.send(s.queue_offset_by_time(&t, q, ts).await);
        }
        Request::EarliestTime(t, q, r) => {
            let _ = r.send(s.earliest_message_time(&t, q).await);
        }
        Request::QueryByKey {
            topic,
            key,
            max,
            begin_ms,
            end_ms,
            reply,
        } => {
            let _ = reply.send(s.query_by_key(&topic, &key, max, begin_ms, end_ms).await);
        }
        Request::LogOffsets(r) => {
            let _ = r.send(ShardStatus {
                shard: ctx.shard,
                min_log_offset: s.min_log_offset(),
                max_log_offset: s.max_log_offset(),
                committed_log_offset: s.committed_log_offset(),
                flushed_log_offset: s.flushed_log_offset(),
                dispatched_log_offset: s.dispatched_log_offset(),
                failure: s.failure(),
            });
        }
        Request::WaitDispatched(r) => {
            s.wait_dispatched().await;
            let _ = r.send(());
        }
        Request::Flush(r) => {
            let _ = r.send(s.flush().await);
        }
        Request::Run(job) => job(ctx.clone()).await,
        Request::Shutdown(_) => unreachable!("handled by the shard loop"),
    }
}

impl Handle {
    pub fn shards(&self) -> usize {
        self.shared.senders.len()
    }

    /// The shard owning `(topic, queue_id)`.
    pub fn shard_of(&self, topic: &str, queue_id: i32) -> usize {
        shard_of(topic, queue_id, self.shards())
    }

    /// Queues `req` on `shard`.
    async fn send(&self, shard: usize, req: Request) -> Result<()> {
        if self.shared.closed.load(Ordering::SeqCst) {
            return Err(Error::ShutDown);
        }
        let tx = self.shared.senders.get(shard).ok_or_else(|| {
            Error::BadRequest(format!(
                "shard {shard} does not exist (this store has {})",
                self.shards()
            ))
        })?;
        if !self.shared.alive[shard].load(Ordering::SeqCst) {
            return Err(gone(shard));
        }
        tx.send_async(req).await.map_err(|_| gone(shard))
    }

    /// Sends `make(reply)` to `shard` and waits for the answer.
    async fn ask<T>(&self, shard: usize, make: impl FnOnce(Reply<T>) -> Request) -> Result<T> {
        let (rtx, rrx) = flume::bounded(1);
        self.send(shard, make(rtx)).await?;
        reply_from(&rrx, shard).await
    }

    /// Stores one message on the shard that owns its queue.
    pub async fn put(&self, msg: Message) -> PutResult {
        let shard = self.shard_of(&msg.topic, msg.queue_id);
        self.ask(shard, |r| Request::Put(Box::new(msg), r))
            .await
            .unwrap_or_else(|_| PutResult::refused(PutStatus::ServiceNotAvailable))
    }

    /// Stores messages that may span queues and shards: each run of one queue is put
    /// as a RocketMQ batch on its shard, the shards work in parallel, and the result
    /// has one entry per message, in input order.
    pub async fn put_batch(&self, msgs: Vec<Message>) -> Vec<PutResult> {
        let n = msgs.len();
        // One group per queue: (queue, input positions, messages).
        type Group = ((String, i32), Vec<usize>, Vec<Message>);
        let mut groups: Vec<Group> = Vec::new();
        for (i, m) in msgs.into_iter().enumerate() {
            let key = (m.topic.clone(), m.queue_id);
            match groups.iter_mut().find(|(k, _, _)| *k == key) {
                Some((_, idx, ms)) => {
                    idx.push(i);
                    ms.push(m);
                }
                None => groups.push((key, vec![i], vec![m])),
            }
        }
        let futs = groups.into_iter().map(|((topic, q), idx, ms)| {
            let shard = self.shard_of(&topic, q);
            async move {
                let r = self
                    .ask(shard, |r| Request::PutBatch(ms, r))
                    .await
                    .unwrap_or_else(|_| PutResult::refused(PutStatus::ServiceNotAvailable));
                (idx, r)
            }
        });
        let mut out = vec![PutResult::refused(PutStatus::ServiceNotAvailable); n];
        for (idx, r) in crate::wake::join_all(futs.collect()).await {
            for (k, i) in idx.into_iter().enumerate() {
                let mut one = r.clone();
                if r.status.is_stored() {
                    one.queue_offset = r.queue_offset + k as u64;
                    one.msg_ids = vec![r.msg_ids[k]];
                    one.log_offset = r.msg_ids[k].offset;
                }
                out[i] = one;
            }
        }
        out
    }

    pub async fn get(
        &self,
        topic: &str,
        queue_id: i32,
        offset: QueueOffset,
        max_count: usize,
        max_bytes: usize,
    ) -> Result<GetResult> {
        let shard = self.shard_of(topic, queue_id);
        let topic = topic.to_string();
        self.ask(shard, |reply| Request::Get {
            topic,
            queue_id,
            offset,
            max_count,
            max_bytes,
            reply,
        })
        .await?
    }

    /// Decodes the record at a commit-log offset (which names its shard).
    pub async fn look_by_offset(&self, offset: LogOffset) -> Result<Option<StoredMessage>> {
        self.ask(shard_of_offset(offset), |r| {
            Request::LookByOffset(offset, r)
        })
        .await?
    }

    /// Looks a message up by its 32-character offset message id.
    pub async fn look_by_msg_id(&self, id: &str) -> Result<Option<StoredMessage>> {
        let parsed = MessageId::parse(id).ok_or_else(|| {
            Error::BadRequest(format!(
                "malformed message id {id:?} (want 32 hex characters)"
            ))
        })?;
        let shard = shard_of_offset(parsed.offset);
        if shard >= self.shards() {
            return Err(Error::BadRequest(format!(
                "message id {id} names shard {shard}, but this store has {} shards",
                self.shards()
            )));
        }
        self.look_by_offset(parsed.offset).await
    }

    /// (min, max) queue offsets; max is the next offset to be written.
    pub async fn queue_offsets(
        &self,
        topic: &str,
        queue_id: i32,
    ) -> Result<(QueueOffset, QueueOffset)> {
        let t = topic.to_string();
        self.ask(self.shard_of(topic, queue_id), |r| {
            Request::QueueOffsets(t, queue_id, r)
        })
        .await
    }

    pub async fn queue_offset_by_time(
        &self,
        topic: &str,
        queue_id: i32,
        ts_ms: i64,
    ) -> Result<QueueOffset> {
        let t = topic.to_string();
        self.ask(self.shard_of(topic, queue_id), |r| {
            Request::OffsetByTime(t, queue_id, ts_ms, r)
        })
        .await?
    }

    pub async fn earliest_message_time(&self, topic: &str, queue_id: i32) -> Result<i64> {
        let t = topic.to_string();
        self.ask(self.shard_of(topic, queue_id), |r| {
            Request::EarliestTime(t, queue_id, r)
        })
        .await?
    }

    /// Messages of `topic` carrying `key` stored within `[begin_ms, end_ms]`, from every
    /// shard (a key can be on any shard: ownership is by queue), asked in parallel and
    /// merged newest first by store time, at most `max` (clamped to `query_max`). Same
    /// rules as [`Store::query_by_key`]; a shard that fails makes the query fail.
    pub async fn query_by_key(
        &self,
        topic: &str,
        key: &str,
        max: usize,
        begin_ms: i64,
        end_ms: i64,
    ) -> Result<Vec<StoredMessage>> {
        crate::index::check_query(topic, key, begin_ms, end_ms)?;
        let max = max.min(self.shared.query_max);
        if max == 0 {
            return Ok(Vec::new());
        }
        let asks = (0..self.shards()).map(|shard| {
            let (topic, key) = (topic.to_string(), key.to_string());
            self.ask(shard, move |reply| Request::QueryByKey {
                topic,
                key,
                max,
                begin_ms,
                end_ms,
                reply,
            })
        });
        let mut all = Vec::new();
        for r in crate::wake::join_all(asks.collect()).await {
            all.extend(r??);
        }
        all.sort_by_key(|m: &StoredMessage| {
            std::cmp::Reverse((m.store_timestamp_ms, m.log_offset))
        });
        all.truncate(max);
        Ok(all)
    }

    /// Positions and health of one shard.
    pub async fn shard_status(&self, shard: usize) -> Result<ShardStatus> {
        self.ask(shard, Request::LogOffsets).await
    }

    /// Waits until every shard has made everything written so far visible to `get`.
    pub async fn wait_dispatched(&self) -> Result<()> {
        for shard in 0..self.shards() {
            self.ask(shard, Request::WaitDispatched).await?;
        }
        Ok(())
    }

    /// Commits and fdatasyncs every shard.
    pub async fn flush(&self) -> Result<()> {
        for shard in 0..self.shards() {
            self.ask(shard, Request::Flush).await??;
        }
        Ok(())
    }

    /// Runs `f` on `shard`'s executor with that shard's [`ShardContext`] and returns
    /// its result. The future `f` builds may be `!Send`: it never leaves that thread.
    pub async fn run_on<T, F, Fut>(&self, shard: usize, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(ShardContext) -> Fut + Send + 'static,
        Fut: Future<Output = T> + 'static,
    {
        let (tx, rx) = flume::bounded(1);
        let job: LocalJob = Box::new(move |ctx| {
            Box::pin(async move {
                let _ = tx.send(f(ctx).await);
            })
        });
        self.send(shard, Request::Run(job)).await?;
        reply_from(&rx, shard).await
    }
}

/// Waits for a shard's reply. flume 0.10's `recv_async` can answer `Disconnected`
/// while the reply sits in the channel, when the sender sends and drops between two
/// of its checks (zesterer/flume#120, fixed in flume 0.11): a request that was served
/// looked like a dead shard (found by tests/crash_loop.rs, a `query_by_key` failing
/// with "shard 1 is unavailable" while every shard was up). coremq now uses flume
/// 0.11; the second look stays as a cheap guard before calling the shard gone.
async fn reply_from<T>(rx: &flume::Receiver<T>, shard: usize) -> Result<T> {
    match rx.recv_async().await {
        Ok(v) => Ok(v),
        Err(_) => rx.try_recv().map_err(|_| gone(shard)),
    }
}

fn gone(shard: usize) -> Error {
    Error::ShardUnavailable {
        shard,
        why: "the shard's thread stopped (shut down or failed)".into(),
    }
}

impl ShardContext {
    /// Whether this shard owns `(topic, queue_id)`.
    pub fn owns(&self, topic: &str, queue_id: i32) -> bool {
        self.handle.shard_of(topic, queue_id) == self.shard
    }

    /// Puts locally when this shard owns the queue, else routes to the owner.
    pub async fn put(&self, msg: Message) -> PutResult {
        if self.owns(&msg.topic, msg.queue_id) {
            self.store.put(msg).await
        } else {
            self.handle.put(msg).await
        }
    }

    /// Gets locally when this shard owns the queue, else routes to the owner.
    pub async fn get(
        &self,
        topic: &str,
        queue_id: i32,
        offset: QueueOffset,
        max_count: usize,
        max_bytes: usize,
    ) -> Result<GetResult> {
        if self.owns(topic, queue_id) {
            self.store
                .get(topic, queue_id, offset, max_count, max_bytes)
                .await
        } else {
            self.handle
                .get(topic, queue_id, offset, max_count, max_bytes)
                .await
        }
    }
}
