//! One shard's message store: RocketMQ's `DefaultMessageStore` for the queues this
//! shard owns, running on the current glommio executor. This file is the facade (the
//! public handle, its shared state, shutdown); the parts are named after RocketMQ's:
//! `put.rs` (`putMessage`), `get.rs` (`getMessage` and the look-ups), `dispatch.rs`
//! (`ReputMessageService`), `checkpoint.rs` (`FlushConsumeQueueService`,
//! `StoreCheckpoint`), `recovery.rs` (`load`/`recover`: `Store::open`), `space.rs`
//! (the disk-full watermark), `query.rs` (`queryMessage`), `group_transfer.rs`
//! (`GroupTransferService` and the slave's `appendToCommitLog`). The queues are a
//! `consume_queue::QueueTable`, the log a `commit_log::CommitLog`.
//!
//! Tasks, each in its own glommio task queue with shares, so background work cannot
//! starve puts:
//! * **writer** (the CommitLog's, 1000 shares): commits windows to the files and
//!   fdatasyncs them as the flush mode says;
//! * **dispatcher** (500): tails the log and appends ConsumeQueue and key-index
//!   entries (`dispatch.rs`);
//! * **queue flusher** (100): a checkpoint round every `consume_queue_flush_interval`
//!   (`checkpoint.rs`);
//! * **put deadlines** (1000): ends the waits of puts past their deadline
//!   (`deadlines.rs`);
//! * **clean** (100): retention passes (`crate::clean`, `retention.rs`).
//!
//! Durability contract, by flush mode:
//! * `FlushMode::Sync`: `PutOk` means a durable write covering the record returned
//!   (fdatasync, or a `RWF_DSYNC` write: `sync_flush_io`); a put not durable within
//!   `sync_flush_timeout` gets `FlushDiskTimeout`, never `PutOk`. Consumers see only
//!   durable records.
//! * `FlushMode::Async`: `PutOk` means the record is in the write buffer; a process
//!   kill keeps it once committed (within `commit_interval`), a power loss once flushed
//!   (within `flush_interval` while the disk keeps up); `flush()` forces both.
//! * Both: a put answers within `sync_flush_timeout` of its start (plus one tick)
//!   whatever the disk does; one that found no room by then stored nothing and says
//!   `OsPageCacheBusy` (`deadlines.rs`). No blocking file-system call runs on the
//!   shard while the store runs (`io::offload`), so a stalled disk stops no task.
//! * After a clean `shutdown()` everything acknowledged is durable and `abort` is gone.
//!
//! Measurements behind these files' figures: `docs/performance/store.md`.

mod checkpoint;
mod deadlines;
mod delivered;
mod dispatch;
mod get;
mod group_transfer;
mod put;
mod query;
mod recovery;
mod retention;
mod scheduled;
mod self_check;
mod space;
mod stats;

use crate::commit_log::CommitLog;
use crate::commit_log::read_cache::{ReadCache, ReadCacheStats};
use crate::config::{FlushMode, StoreConfig};
use crate::consume_queue::QueueTable;
use crate::error::{Error, Result};
use crate::index::IndexService;
use crate::io::{File, RootLock};
use crate::message::LogOffset;
use crate::wake::{Notify, OffsetWatch};
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Running,
    Stopping,
    Stopped,
}

/// A background task's future.
type Task = std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>;

/// The store's state, shared by the handles and the background tasks.
struct Inner {
    cfg: Rc<StoreConfig>,
    log: Rc<CommitLog>,
    queues: QueueTable,
    /// Records below this are visible to readers.
    dispatched: OffsetWatch,
    /// Wakes the put-deadline ticker (`deadlines.rs`).
    deadline_armed: Rc<Notify>,
    dispatch_wake: Notify,
    flusher_wake: Notify,
    /// The dispatcher's read buffer, reused.
    dispatch_buf: RefCell<Vec<u8>>,
    /// Reused by every put.
    put_scratch: RefCell<put::PutScratch>,
    last_store_ts: Cell<i64>,
    /// Store time of the last record given a ConsumeQueue entry (logicsMsgTimestamp).
    last_dispatched_ts: Cell<i64>,
    /// Dispatch passes so far: `StoreConfig::on_arrival` hears of a queue once a pass.
    dispatch_pass: Cell<u64>,
    state: Cell<State>,
    failed: RefCell<Option<String>>,
    /// Serialises checkpoint rounds (background flusher, `Store::checkpoint`, shutdown).
    round_lock: glommio::sync::Semaphore,
    /// Free-space watermark state (`space.rs`).
    space: RefCell<space::SpaceCheck>,
    checkpoint: Rc<File>,
    tasks: RefCell<Vec<glommio::task::JoinHandle<()>>>,
    /// Released by `shutdown` even while clones of the handle live on.
    lock: RefCell<Option<RootLock>>,
    /// The key index; `None` when `index_enable` is off.
    index: Option<Rc<IndexService>>,
    /// Large committed log blocks shared by reads that miss the windows.
    read_cache: Option<Rc<ReadCache>>,
    /// Slaves' acknowledgements (SYNC_MASTER waits on them).
    transfer: group_transfer::GroupTransfer,
    /// Retention (`crate::clean`, `retention.rs`).
    clean: crate::clean::Cleaner,
    /// (dispatch-safe offset, flushed offset) of the last checkpoint written: what
    /// recovery would start from, so retention deletes nothing at or past it.
    checkpointed: Cell<(u64, u64)>,
    /// The checkpoint page and queue manifest last written and made durable
    /// (`checkpoint.rs`).
    written: RefCell<checkpoint::Written>,
    /// Delay levels, delivered positions, attached services (`scheduled.rs`).
    sched: scheduled::Scheduling,
    /// StoreStatsService's counters (`crate::stats`).
    stats: crate::stats::StatsRecorder,
}

pub use group_transfer::SlaveGuard;
pub use self_check::SelfCheckReport;

/// What `open` found and did, for logs and tests.
#[derive(Debug, Clone, Default)]
pub struct OpenReport {
    pub clean_shutdown: bool,
    pub checkpoint_valid: bool,
    pub records_scanned: u64,
    pub log_end: u64,
    /// A torn tail that was cut: (offset, bytes erased).
    pub truncated: Option<(u64, u64)>,
    pub dispatched_from: u64,
    pub entries_rebuilt: u64,
    pub queues: usize,
    /// Seconds each phase of the open took, in order (for the recovery benchmark):
    /// "start", "key index and queues", "scan and dispatch", "cut", "flush".
    pub phases: Vec<(&'static str, f64)>,
}

/// A shard-local store handle (cheap to clone; not `Send`: use it on its executor).
///
/// Dropping the last handle without `shutdown` stops the background tasks after they
/// write out what they hold; `abort` stays, so the next open recovers as after a crash.
#[derive(Clone)]
pub struct Store {
    inner: Rc<Inner>,
    pub report: Rc<OpenReport>,
    _owner: Rc<Owner>,
}

/// Shared by every `Store` clone but not by the background tasks: when the last
/// clone goes, the tasks are told to stop, so nothing keeps the store alive.
struct Owner(Rc<Inner>);

impl Drop for Owner {
    fn drop(&mut self) {
        let inner = &self.0;
        if inner.state.get() == State::Running {
            tracing::warn!(root = %inner.cfg.root.display(), "store dropped without shutdown");
            inner.signal_services();
            inner.stop_tasks();
        }
    }
}

impl Store {
    pub fn config(&self) -> &StoreConfig {
        &self.inner.cfg
    }

    /// The key index, when enabled (see `crate::index`).
    pub(crate) fn index_service(&self) -> Option<&Rc<IndexService>> {
        self.inner.index.as_ref()
    }

    /// Counters of the CommitLog read cache (`None` when `read_cache_bytes` is 0).
    pub fn read_cache_stats(&self) -> Option<ReadCacheStats> {
        self.inner.read_cache.as_ref().map(|c| c.stats())
    }

    /// Every (topic, queue id) this store holds.
    pub fn queues(&self) -> Vec<(String, i32)> {
        self.inner.queues.keys()
    }

    /// Commits and fdatasyncs everything written so far; returns the flushed offset.
    pub async fn flush(&self) -> Result<LogOffset> {
        let log = &self.inner.log;
        let target = log.written();
        log.request_flush();
        if !log.flushed.wait_for(target).await {
            return Err(Error::Failed(log.failure().unwrap_or_default()));
        }
        Ok(log.flushed.get())
    }

    /// Waits until every record written so far is visible to `get`.
    pub async fn wait_dispatched(&self) {
        let target = self.inner.log.written();
        if self.inner.cfg.flush_mode == FlushMode::Sync {
            self.inner.log.request_flush();
        }
        self.inner.dispatch_wake.notify();
        self.inner.dispatched.wait_for(target).await;
    }

    /// Waits until records past log offset `offset` are visible to `get` (dispatch went
    /// past it): a reader on the shard tailing the log waits here rather than looking
    /// again on a timer. `false` when the store stopped first.
    pub async fn wait_dispatched_past(&self, offset: LogOffset) -> bool {
        self.inner
            .dispatched
            .wait_for(offset.saturating_add(1))
            .await
    }

    /// Why the store stopped taking writes, if it did.
    pub fn failure(&self) -> Option<String> {
        self.inner
            .failed
            .borrow()
            .clone()
            .or_else(|| self.inner.log.failure())
    }

    /// Clean shutdown: refuse new puts, write and flush everything, bring the queues
    /// and checkpoint up to date, remove `abort`, release the lock.
    pub async fn shutdown(self) -> Result<()> {
        let inner = self.inner.clone();
        if inner.state.get() != State::Running {
            return Ok(());
        }
        // Services first: they put into this store (`scheduled.rs`).
        self.stop_services().await;
        inner.stop_tasks();
        let tasks: Vec<_> = inner.tasks.borrow_mut().drain(..).collect();
        for t in tasks {
            t.await;
        }
        let failure = self.failure();
        inner.state.set(State::Stopped);
        inner.deadline_armed.notify();
        if let Some(f) = failure {
            inner.lock.borrow_mut().take();
            return Err(Error::Failed(f));
        }
        let end = inner.log.written();
        inner.last_checkpoint_round(end).await?;
        let root = inner.cfg.root.clone();
        inner
            .cfg
            .disk
            .off_executor(move |d| {
                d.remove_file(&root.join("abort"))?;
                d.sync_dir(&root)
            })
            .await?;
        inner.lock.borrow_mut().take();
        tracing::info!(root = %inner.cfg.root.display(), end, "store shut down cleanly");
        Ok(())
    }
}

impl Inner {
    /// Starts the writer, the dispatcher and the queue flusher (module docs).
    fn spawn_tasks(self: &Rc<Self>) -> Result<()> {
        use glommio::Latency;
        let sync = self.cfg.flush_mode == FlushMode::Sync;
        let tq = |name: &str, shares: usize| {
            // A sync-flush writer's I/O completions preempt other task queues, so the
            // next group-commit round starts at once (see `commit_log`'s docs); it is
            // foreground work, the rest is background (`crate::shard::turns`).
            let (latency, turn) = if sync && name == "commit-log-writer" {
                (Latency::Matters(Duration::from_millis(1)), Duration::ZERO)
            } else {
                (Latency::NotImportant, self.cfg.background_turn)
            };
            crate::shard::turns::task_queue(name, shares, latency, turn)
        };
        let tasks: [(&str, usize, Task); 4] = [
            (
                "commit-log-writer",
                1000,
                Box::pin(self.log.clone().run_writer()),
            ),
            ("dispatch", 500, Box::pin(self.clone().run_dispatcher())),
            ("cq-flush", 100, Box::pin(self.clone().run_queue_flusher())),
            ("clean", 100, Box::pin(crate::clean::run(self.clone()))),
        ];
        let mut tasks: Vec<(&str, usize, Task)> = tasks.into();
        if self.cfg.ha.role == crate::config::HaRole::SyncMaster {
            tasks.push((
                "group-transfer",
                100,
                Box::pin(self.clone().run_transfer_expiry()),
            ));
        }
        for (name, shares, fut) in tasks {
            let task = glommio::spawn_local_into(fut, tq(name, shares))
                .map_err(|e| Error::Config(format!("cannot spawn {name}: {e}")))?;
            self.tasks.borrow_mut().push(task.detach());
        }
        // Not among `tasks`: it times puts out until the store is stopped or gone,
        // during a shutdown too.
        let tick = deadlines::tick(self.cfg.sync_flush_timeout);
        deadlines::arm(self, &self.deadline_armed);
        let ticker = deadlines::run_ticker(Rc::downgrade(self), tick, self.deadline_armed.clone());
        glommio::spawn_local_into(ticker, tq("put-deadlines", 1000))
            .map_err(|e| Error::Config(format!("cannot spawn put-deadlines: {e}")))?
            .detach();
        Ok(())
    }

    /// Refuses new puts and tells every task to finish what it holds and stop.
    fn stop_tasks(&self) {
        self.state.set(State::Stopping);
        self.log.stop_writer();
        self.dispatch_wake.notify();
        self.flusher_wake.notify();
        self.clean.wake();
    }
}
