//! One shard's message store: RocketMQ's `DefaultMessageStore` for the queues this
//! shard owns, running on the current glommio executor.
//!
//! Tasks (each in its own glommio task queue, so background work cannot starve puts):
//! * **writer** (CommitLog): commit windows to files, fdatasync by the flush mode;
//! * **dispatcher** (RocketMQ's ReputMessageService): tails the CommitLog and appends
//!   ConsumeQueue entries; in sync-flush mode it stops at the flushed offset, so a
//!   consumer never sees a record that recovery could lose;
//! * **queue flusher**: writes ConsumeQueue tails every second, then the checkpoint.
//!
//! The dispatcher decodes records in place while they are in a resident write window
//! ([`Inner::dispatch_in_place`]: queue entries and key-index inserts without an
//! await; a record whose index pages must be loaded finishes through a copy), and
//! `max_dispatch_lag_bytes` (48 MiB by default, within the 64 MiB write pool) keeps
//! it there: reading the records back from disk and copying them cost ~0.4 us of the
//! ~2.5 us of CPU per 1 KiB put (profile and measurements: `loadgen.rs`, "Profile:
//! async 1 KiB puts").
//!
//! Durability contract:
//! * `FlushMode::Sync`: `PutOk` means an fdatasync that covered the record returned.
//!   A put that is not durable within `sync_flush_timeout` gets `FlushDiskTimeout`.
//! * `FlushMode::Async`: `PutOk` means the record is in the write buffer; it is
//!   durable after the next flush (at most `flush_interval` later while the disk keeps
//!   up); `flush()` forces it.
//! * After a clean `shutdown()` everything acknowledged is durable and `abort` is gone.
//!
//! Recovery (`Store::open`, timed step by step in [`OpenReport::phases`]) is one pass
//! over the log. Order, and why:
//! 1. The CommitLog's segments are opened, nothing read yet.
//! 2. The key index is opened (repaired after a crash) while every ConsumeQueue loads
//!    (16 at a time: each load is a chain of small dependent I/Os). Neither is cut to
//!    the log's end, which is not known yet; their resume points are: the queues
//!    resume at the checkpoint's dispatch point (at the log's first record when a queue
//!    is missing or shorter than the manifest says: uncut queues hold at least that),
//!    the key index at its own durable point ([`crate::index::IndexService::resume_point`]).
//! 3. The scan (`CommitLog::recover`) verifies the log and hands every record from the
//!    lower of the two resume points to a [`RecordSink`]: ConsumeQueue entries for
//!    records at or past the queues' point, key-index entries for records at or past
//!    the index's, so no record is dispatched twice to a structure. Only records below
//!    the end the scan keeps reach the sink (a torn tail is cut, damage refused: the
//!    open then fails and the queues, only changed in memory, are not written).
//! 4. Queues and index that reach past the recovered end (the log lost a tail they had
//!    taken) are cut back to it. They took nothing in step 3: every record the log kept
//!    lies below what they held. A cut index re-takes the records after its new end
//!    (a few); a replay that meets an undecodable record below the verified part, or a
//!    queue that disagrees with the log, falls back to rebuilding the queues from the
//!    log's first record (a second pass, as before one pass).
//! 5. Queues flushed (16 at a time), a new checkpoint written. The key index is not
//!    flushed by the open (it knows its own durable point; the next background round
//!    flushes it).
//!
//! Measured in scenario 7 (`coremq bench --messages 1000000 --body 1024 --queues 64
//! --kill-after-flush`, then `--mode recover` on fresh copies of the killed store; 2
//! shards, 1.17 GB of log; old and new binaries interleaved with fio's read of 1.17 GB
//! (1 MiB O_DIRECT reads, io_uring, depth 8) in the same minute, 2026-12-03 04:37-04:38
//! UTC; tests/recovery_once.rs checks the result equals a clean run's):
//!
//! | killed store | before (two passes) | one pass | fio, same minute |
//! |---|---|---|---|
//! | as killed: shard 0's queues 437 MB behind, both indexes current | 1.48, 1.45, 1.44 s | 1.17, 1.14, 1.19 s | 1.13-1.61 s (median 1.27) |
//! | index directories removed (every key re-indexed, as in the run) | 2.20, 2.06 s | 0.97, 0.83 s | 1.22-1.39 s |
//!
//! So 1.1-1.7x fio before, 0.6-0.9x now (the two shards read in parallel, which the
//! disk serves faster than fio's one job). Per shard, before: scan 0.68-1.19 s, then
//! re-dispatch 0.44-0.66 s reading the same bytes again; now scan and dispatch
//! together 0.73-0.98 s. Reordering alone first made things worse (2.5-2.6 s against
//! 1.8-2.0 s, a busier minute): the index open (0.4-0.5 s) and queue loads (0.4-0.7 s)
//! of one shard, now before its scan, waited behind the other shard's scan reads;
//! loading the queues concurrently, with the index open alongside, brought that step
//! to 0.02-0.17 s. Profile (`perf record -g`, both shards): the scan is not CPU-bound
//! (a shard's thread is busy 30-55% of its scan); CRC32 is the largest CPU item (~26%
//! of samples: `crc32fast` over every byte at ~4 GB/s, its `combine` ~4%), then the
//! index repair walk at open (~5%), `membarrier` IPIs glommio issues each time an
//! executor sleeps for I/O (~7-12%), and page faults of fresh read buffers (~3%).
//! Dispatch itself (queue lookups, entry appends, key inserts) is under 3%.
//! Left: the index repair reads the slot table once to repair it and again to load
//! it (50-130 ms at open after a crash; could repair the loaded table in memory);
//! read buffers are allocated per read (could be reused); a faster CRC32 (VPCLMULQDQ)
//! would cut the largest CPU item.

use crate::commit_log::{CommitLog, LogReader, RecordSink, RecoverPlan};
use crate::config::{FlushMode, StoreConfig};
use crate::consume_queue::{ConsumeQueue, Placed};
use crate::error::{Error, Result};
use crate::format::checkpoint::{CHECKPOINT_LEN, Checkpoint};
use crate::format::consume_queue::CqEntry;
use crate::format::java::tags_code;
use crate::format::manifest::QueueManifest;
use crate::format::msg_id::MessageId;
use crate::format::properties;
use crate::format::record::{self, Decoded, RecordFields, Verify};
use crate::io::{self, File, RootLock};
use crate::message::*;
use crate::sync::{Notify, OffsetWatch, join_all};
use ahash::AHashMap;
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::Duration;

/// Consume-queue loads or flushes in flight at once (each is a short chain of small
/// I/Os; see [`load_queues`]).
const QUEUE_IO_IN_FLIGHT: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Running,
    Stopping,
    Stopped,
}

/// A queue this shard owns: its ConsumeQueue and the next queue offset for puts
/// (RocketMQ's topicQueueTable entry).
struct Queue {
    cq: Rc<ConsumeQueue>,
    next_put: Cell<u64>,
}

/// Buffers a put fills before it knows where its records go, kept across puts.
#[derive(Default)]
struct PutScratch {
    /// Every message's encoded properties, back to back.
    props: Vec<u8>,
    /// Where each message's properties end in `props`.
    ends: Vec<usize>,
    /// Each record's encoded length.
    lens: Vec<u64>,
}

struct Inner {
    cfg: Rc<StoreConfig>,
    log: Rc<CommitLog>,
    queues: RefCell<AHashMap<String, AHashMap<i32, Rc<Queue>>>>,
    dispatched: OffsetWatch,
    dispatch_wake: Notify,
    flusher_wake: Notify,
    /// The dispatcher's read buffer, reused (see [`Inner::dispatch_range`]).
    dispatch_buf: RefCell<Vec<u8>>,
    /// Reused by every put (see [`Store::put_many`]).
    put_scratch: RefCell<PutScratch>,
    last_store_ts: Cell<i64>,
    /// Store time of the last record given a ConsumeQueue entry (logicsMsgTimestamp).
    last_dispatched_ts: Cell<i64>,
    state: Cell<State>,
    failed: RefCell<Option<String>>,
    /// Serialises checkpoint rounds (background flusher and `Store::checkpoint`).
    round_lock: glommio::sync::Semaphore,
    /// Free-space watermark state (see `Inner::disk_has_room`).
    space: RefCell<SpaceCheck>,
    checkpoint: Rc<File>,
    tasks: RefCell<Vec<glommio::task::JoinHandle<()>>>,
    /// Released by `shutdown` even while clones of the handle live on.
    lock: RefCell<Option<RootLock>>,
    /// The key index (issue 4); `None` when `index_enable` is off.
    index: Option<Rc<crate::index::IndexService>>,
    /// Large committed log blocks shared by reads that miss the windows (`read_cache`).
    read_cache: Option<Rc<crate::read_cache::ReadCache>>,
}

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
    /// Seconds each step of the open took, in order (for the recovery benchmark).
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
            inner.state.set(State::Stopping);
            inner.log.stop_writer();
            inner.dispatch_wake.notify();
            inner.flusher_wake.notify();
        }
    }
}

fn valid_topic_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'%' | b'|' | b'_' | b'-')
}

impl Store {
    /// Opens (or creates) the store at `cfg.root`, recovering from whatever the last
    /// run left, and starts its background tasks on the current executor.
    pub async fn open(cfg: StoreConfig) -> Result<Store> {
        cfg.validate()?;
        let cfg = Rc::new(cfg);
        let mut phases = Phases::default();
        let root = cfg.root.clone();
        let disk = cfg.disk.clone();
        disk.create_dir_all(&root)?;
        let lock = disk.lock_root(&root)?;
        disk.prime_executor(&root).await?;
        let abort_path = root.join("abort");
        let clean = !disk.exists(&abort_path);
        let cp_path = root.join("checkpoint");
        let (cp, cp_valid) = match disk.read_file(&cp_path)? {
            Some(bytes) => match Checkpoint::decode(&bytes) {
                Ok(v) => v,
                Err(kind) => {
                    tracing::warn!(path = %cp_path.display(), %kind, "checkpoint damaged; recovering from the whole log");
                    (Checkpoint::default(), false)
                }
            },
            None => (Checkpoint::default(), false),
        };
        let (scan_from, durable_below) = if cp_valid {
            (
                cp.dispatch_safe_offset.min(cp.log_flushed_offset),
                cp.log_flushed_offset,
            )
        } else {
            (0, 0)
        };
        // Which records must carry the record-CRC property: all of a coremq store's
        // (as its checkpoint says); for an adopted RocketMQ store or a lost
        // checkpoint, only those written from now on.
        let crc_from = if cp_valid {
            cp.crc_required_from
        } else {
            u64::MAX
        };
        phases.lap("start");
        let log = CommitLog::open_files(cfg.clone(), crc_from).await?;
        let checkpoint = disk.open(&cp_path, true).await?;
        // One pass (see the module docs): the key index and the queues are opened
        // before the log is scanned, so the scan hands them the records it verifies.
        // The log's end is not known yet: nothing is cut here (`u64::MAX`); what lies
        // past the recovered end is cut once the scan has found it.
        let log_min = log.min_offset();
        // The key index opens while the queues load: both are chains of small I/Os.
        let open_index = async {
            if !cfg.index_enable {
                return Ok(None);
            }
            let (ix, rep) = crate::index::IndexService::open(&cfg, clean, u64::MAX).await?;
            tracing::debug!(?rep, "key index opened");
            Ok::<_, Error>(Some(Rc::new(ix)))
        };
        let (index, queues) =
            futures_lite::future::zip(open_index, load_queues(&cfg, log_min, u64::MAX)).await;
        let (index, (queues, queues_damaged)) = (index?, queues?);
        phases.lap("key index and queues");
        let inner = Rc::new(Inner {
            cfg: cfg.clone(),
            log: log.clone(),
            queues: RefCell::new(queues),
            dispatched: OffsetWatch::new(0),
            dispatch_wake: Notify::default(),
            flusher_wake: Notify::default(),
            put_scratch: RefCell::new(PutScratch::default()),
            dispatch_buf: RefCell::new(Vec::new()),
            last_store_ts: Cell::new(0),
            last_dispatched_ts: Cell::new(0),
            state: Cell::new(State::Running),
            failed: RefCell::new(None),
            round_lock: glommio::sync::Semaphore::new(1),
            space: RefCell::new(SpaceCheck::default()),
            checkpoint,
            tasks: RefCell::new(Vec::new()),
            lock: RefCell::new(Some(lock)),
            index,
            read_cache: crate::read_cache::ReadCache::new(&cfg),
        });
        let loaded = inner.manifest(0).queues.len();
        // Queues not yet cut to the log's end hold at least what the manifest says
        // they held at the checkpoint, whatever the scan finds: fewer means lost.
        let queues_lost = queues_damaged
            || (cp_valid && (loaded as u32) < cp.queue_count)
            || (cp_valid && inner.queues_shorter_than_manifest(&cp, u64::MAX));
        if queues_lost {
            tracing::warn!(
                loaded,
                recorded = cp.queue_count,
                "consume queues are missing; rebuilding them from the whole log"
            );
        }
        // Queues resume at the checkpoint's dispatch point; if they disagree with it
        // (files lost or damaged), every queue is rebuilt from the log's first record.
        // The key index resumes at its own durable point (it may lag the checkpoint).
        let mut from = if cp_valid && !queues_lost {
            cp.dispatch_safe_offset
        } else {
            log_min
        }
        .max(log_min);
        let index_from = inner
            .index
            .as_ref()
            .map_or(u64::MAX, |ix| ix.resume_point().max(log_min));
        let loaded_max = inner.queue_lengths();
        let mut replay = Replay {
            inner: &inner,
            queues_from: from,
            index_from,
            rebuild: from == log_min,
            placed: 0,
            queue_failure: None,
        };
        let plan = RecoverPlan {
            scan_from,
            durable_below,
            trust_end: clean && cp_valid,
            replay_from: from.min(index_from),
        };
        let scan = log.recover(plan, &mut replay).await?;
        let mut rebuilt = replay.placed;
        let queue_failure = replay.queue_failure.take();
        let log_end = log.written();
        if log.crc_required_from() == u64::MAX {
            // Nothing told us (no checkpoint, no record carried the property): require
            // it of everything written from now on.
            log.set_crc_required_from(log_end);
        }
        phases.lap("scan and dispatch");
        // Structures ahead of the recovered log (it lost a tail they had taken) are
        // cut back to it. They took nothing from the scan: every record it kept lies
        // below what they already held.
        let queues_inconsistent = inner.trim_queues(log_min, log_end, &loaded_max).await?;
        let index_cut = match &inner.index {
            Some(ix) => ix.cut_to(log_end).await?,
            None => false,
        };
        // The rare second passes: the replay or the queues disagreed with the log
        // (rebuild every queue from the log's first record, as before one pass), or
        // the key index was cut and takes again the records after its new end.
        let mut fallback = scan
            .replay_failed
            .map(|(at, kind)| format!("the replay met an undecodable record at {at} ({kind})"));
        if let Some(e) = queue_failure {
            if from == log_min {
                // Already rebuilding from the first record: nothing else to try.
                return Err(e);
            }
            fallback.get_or_insert(e.to_string());
        }
        if queues_inconsistent {
            fallback.get_or_insert("a queue ahead of the log took records too".into());
        }
        if let Some(why) = fallback {
            tracing::warn!(
                why,
                "dispatch from the checkpoint failed; rebuilding queues from the whole log"
            );
            from = log_min;
            rebuilt += inner.redispatch(log_min, log_end, true).await?;
        } else if index_cut && let Some(ix) = &inner.index {
            let resume = ix.resume_point().max(log_min);
            rebuilt += inner.redispatch(resume, log_end, from == log_min).await?;
        }
        phases.lap("cut");
        inner.dispatched.set(log_end);
        for qs in inner.queues.borrow().values() {
            for q in qs.values() {
                q.next_put.set(q.cq.max_offset());
            }
        }
        inner.flush_queues().await?;
        // The key index is not flushed here: it knows its own durable point (open
        // re-dispatches from there), the checkpoint below claims nothing about it, and
        // the first background round (`consume_queue_flush_interval` later) flushes
        // it. After a long re-dispatch that flush writes thousands of pages and took
        // longer than the rest of the open (1.4 s of 2.7 s in scenario 7).
        inner
            .write_checkpoint(log_end, inner.manifest(log_end))
            .await?;
        disk.write_file_durable(&abort_path, std::process::id().to_string().as_bytes())?;
        phases.lap("flush");
        let report = OpenReport {
            clean_shutdown: clean,
            checkpoint_valid: cp_valid,
            records_scanned: scan.records,
            log_end,
            truncated: scan.truncated.map(|(at, _, n)| (at, n)),
            dispatched_from: from,
            entries_rebuilt: rebuilt,
            queues: inner.queues.borrow().values().map(|m| m.len()).sum(),
            phases: phases.done,
        };
        tracing::info!(root = %root.display(), ?report, "store opened");
        inner.spawn_tasks()?;
        Ok(Store {
            _owner: Rc::new(Owner(inner.clone())),
            inner,
            report: Rc::new(report),
        })
    }

    pub fn config(&self) -> &StoreConfig {
        &self.inner.cfg
    }

    /// The key index, when enabled (see `crate::index`).
    pub(crate) fn index_service(&self) -> Option<&Rc<crate::index::IndexService>> {
        self.inner.index.as_ref()
    }

    /// Counters of the CommitLog read cache (`None` when `read_cache_bytes` is 0).
    pub fn read_cache_stats(&self) -> Option<crate::read_cache::ReadCacheStats> {
        self.inner.read_cache.as_ref().map(|c| c.stats())
    }

    /// Stores one message. Never fails with an error: refusals and failures are
    /// statuses (see [`PutStatus`]).
    /// Takes the message or a reference to it (a caller that reuses its message
    /// saves its allocations).
    pub async fn put(&self, msg: impl std::borrow::Borrow<Message>) -> PutResult {
        self.put_many(std::slice::from_ref(msg.borrow())).await
    }

    /// Stores a classic batch: every message has the same topic and queue, the records
    /// are consecutive in one segment and get consecutive queue offsets.
    pub async fn put_batch(&self, msgs: &[Message]) -> PutResult {
        let Some(first) = msgs.first() else {
            return PutResult::refused(PutStatus::MessageIllegal(IllegalReason::BatchInvalid));
        };
        if msgs.len() > self.inner.cfg.max_batch_messages
            || msgs
                .iter()
                .any(|m| m.topic != first.topic || m.queue_id != first.queue_id)
        {
            return PutResult::refused(PutStatus::MessageIllegal(IllegalReason::BatchInvalid));
        }
        if msgs
            .iter()
            .any(|m| m.sys_flag & record::SYSFLAG_TRANSACTION_MASK != 0)
        {
            return PutResult::refused(PutStatus::MessageIllegal(IllegalReason::BatchTransaction));
        }
        self.put_many(msgs).await
    }

    async fn put_many(&self, msgs: &[Message]) -> PutResult {
        let inner = &self.inner;
        for m in msgs {
            if let Some(status) = inner.check_message(m) {
                return PutResult::refused(status);
            }
        }
        // Encode properties once to learn each record's exact length. The encoded
        // properties and lengths go to scratch buffers kept across puts: a 1 KiB put
        // costs about 1 us of CPU, and three fresh Vecs per put were 10% of it
        // (perf, `coremq bench --body 1024`, key index off).
        let mut ps = std::mem::take(&mut *inner.put_scratch.borrow_mut());
        ps.props.clear();
        ps.ends.clear();
        ps.lens.clear();
        for m in msgs {
            let start = ps.props.len();
            if !properties::encode_into(&m.properties, &mut ps.props) {
                *inner.put_scratch.borrow_mut() = ps;
                return PutResult::refused(PutStatus::MessageIllegal(
                    IllegalReason::PropertyInvalid,
                ));
            }
            let f = inner.fields(m, &ps.props[start..], 0, 0, 0);
            if f.stored_properties_len() > record::MAX_PROPERTIES_LEN {
                *inner.put_scratch.borrow_mut() = ps;
                return PutResult::refused(PutStatus::PropertiesSizeExceeded);
            }
            ps.lens.push(f.encoded_len() as u64);
            ps.ends.push(ps.props.len());
        }
        let placed = self.put_encoded(msgs, &ps).await;
        *inner.put_scratch.borrow_mut() = ps;
        let (mut result, end) = match placed {
            Ok(placed) => placed,
            Err(refused) => return refused,
        };
        // An async put never waits for I/O; yield when this task queue's slice is
        // used up so a tight put loop cannot starve the writer and dispatcher.
        glommio::yield_if_needed().await;
        let wait = msgs[0].property(properties::WAIT) != Some("false");
        match inner.cfg.flush_mode {
            FlushMode::Async => {
                // The writer wakes itself when a window seals or its interval passes.
                inner.dispatch_wake.notify();
            }
            FlushMode::Sync => {
                let log = &inner.log;
                log.wake_sync_writer();
                if wait {
                    // Timed out by the writer (`CommitLog::expire_sync_waits`), not a
                    // timer per put.
                    let deadline = std::time::Instant::now() + inner.cfg.sync_flush_timeout;
                    result.status = match log.flushed.wait_until(end, deadline).await {
                        Some(true) => PutStatus::PutOk,
                        Some(false) => PutStatus::ServiceNotAvailable,
                        None => PutStatus::FlushDiskTimeout,
                    };
                }
            }
        }
        result
    }

    /// The rest of [`Store::put_many`], with every message's properties encoded
    /// (`ps.props[ends[i-1]..ends[i]]`) and its record length known.
    async fn put_encoded(
        &self,
        msgs: &[Message],
        ps: &PutScratch,
    ) -> std::result::Result<(PutResult, u64), PutResult> {
        let inner = &self.inner;
        let lens = &ps.lens;
        let props_of = |i: usize| {
            let start = if i == 0 { 0 } else { ps.ends[i - 1] };
            &ps.props[start..ps.ends[i]]
        };
        let total: u64 = lens.iter().sum();
        if total as usize > inner.cfg.max_record_bytes() {
            return Err(PutResult::refused(PutStatus::MessageIllegal(
                IllegalReason::BodyTooLarge,
            )));
        }
        if inner.state.get() != State::Running || inner.failed.borrow().is_some() {
            return Err(PutResult::refused(PutStatus::ServiceNotAvailable));
        }
        if inner.cfg.disk_space_check && !inner.disk_has_room(total) {
            return Err(PutResult::refused(PutStatus::DiskFull));
        }
        // Backpressure: when dispatch (queues, key index) falls too far behind the log,
        // puts wait for it, so consumers see messages within a bounded lag and a
        // shutdown never has a long backlog to work off.
        let max_lag = inner.cfg.max_dispatch_lag_bytes;
        let written = inner.log.written();
        if max_lag > 0 && written.saturating_sub(inner.dispatched.get()) > max_lag {
            inner.dispatch_wake.notify();
            if !inner.dispatched.wait_for(written - max_lag / 2).await
                || inner.state.get() != State::Running
            {
                return Err(PutResult::refused(PutStatus::ServiceNotAvailable));
            }
        }
        if let Err(e) = inner.log.reserve(total).await {
            tracing::debug!(error = %e, "put refused");
            return Err(PutResult::refused(PutStatus::ServiceNotAvailable));
        }
        // From here to the append nothing awaits: offsets are assigned and bytes
        // placed in one step, so records land in queue-offset order.
        if inner.state.get() != State::Running {
            return Err(PutResult::refused(PutStatus::ServiceNotAvailable));
        }
        let log = &inner.log;
        let placement = log.placement(total);
        if let Some(at) = placement.blank_at {
            log.append_blank(at);
        }
        let first = &msgs[0];
        let queue = inner.queue(&first.topic, first.queue_id);
        // Prepared and rolled-back transaction records get no ConsumeQueue entry, so
        // (as in RocketMQ) they carry queue offset 0 and do not advance the queue.
        let tx_type = first.sys_flag & record::SYSFLAG_TRANSACTION_MASK;
        let in_queue = tx_type != record::SYSFLAG_TRANSACTION_PREPARED
            && tx_type != record::SYSFLAG_TRANSACTION_ROLLBACK;
        let base_q = if in_queue { queue.next_put.get() } else { 0 };
        let ts = inner.store_timestamp();
        let mut phys = placement.start;
        let mut ids = Vec::with_capacity(msgs.len());
        // Records are encoded straight into the write window.
        log.append_with(placement.start, total as usize, ts, |out| {
            let mut at = 0usize;
            for (i, m) in msgs.iter().enumerate() {
                let q = if in_queue { base_q + i as u64 } else { 0 };
                let f = inner.fields(m, props_of(i), q, phys, ts);
                let len = lens[i] as usize;
                record::encode_to(&f, &mut out[at..at + len]);
                ids.push(MessageId {
                    store_host: inner.cfg.store_host,
                    offset: phys,
                });
                phys += lens[i];
                at += len;
            }
            debug_assert_eq!(at as u64, total);
        });
        if in_queue {
            queue.next_put.set(base_q + msgs.len() as u64);
        }
        let end = placement.start + total;
        let result = PutResult {
            status: PutStatus::PutOk,
            log_offset: placement.start,
            wrote_bytes: total as u32,
            queue_offset: base_q,
            msg_ids: ids,
            store_timestamp_ms: ts,
        };
        Ok((result, end))
    }

    /// Up to `max_count` raw records of a queue from queue offset `offset`, stopping
    /// before `max_bytes` once at least one is taken, with RocketMQ's statuses and
    /// next-begin-offset rules.
    pub async fn get(
        &self,
        topic: &str,
        queue_id: i32,
        offset: QueueOffset,
        max_count: usize,
        max_bytes: usize,
    ) -> Result<GetResult> {
        let inner = &self.inner;
        let mut r = GetResult {
            status: GetStatus::NoMatchedLogicQueue,
            next_begin_offset: 0,
            min_offset: 0,
            max_offset: 0,
            records: Vec::new(),
        };
        let Some(q) = inner.find_queue(topic, queue_id) else {
            return Ok(r);
        };
        let (min, max) = (q.cq.min_offset(), q.cq.max_offset());
        r.min_offset = min;
        r.max_offset = max;
        if max == 0 {
            r.status = GetStatus::NoMessageInQueue;
            return Ok(r);
        }
        if offset < min {
            r.status = GetStatus::OffsetTooSmall;
            r.next_begin_offset = min;
            return Ok(r);
        }
        if offset == max {
            r.status = GetStatus::OffsetOverflowOne;
            r.next_begin_offset = offset;
            return Ok(r);
        }
        if offset > max {
            r.status = GetStatus::OffsetOverflowBadly;
            r.next_begin_offset = max;
            return Ok(r);
        }
        let count = max_count.clamp(1, inner.cfg.max_get_count);
        let entries = q.cq.entries(offset, count).await?;
        if entries.is_empty() {
            let epf = inner.cfg.consume_queue_entries_per_file;
            r.status = GetStatus::OffsetFoundNull;
            r.next_begin_offset = offset + epf - offset % epf;
            return Ok(r);
        }
        // Take entries while the byte budget allows (at least one), then read their
        // records with as few log reads as possible: entries of one queue usually sit
        // close together in the log, so nearby records share one read.
        let log_min = inner.log.min_offset();
        let mut taken = Vec::with_capacity(entries.len());
        let mut bytes = 0usize;
        let mut next = offset;
        for e in entries {
            if !taken.is_empty() && bytes + e.size as usize > max_bytes {
                break;
            }
            next += 1;
            if (e.phys_offset as u64) < log_min {
                continue;
            }
            bytes += e.size as usize;
            taken.push((next - 1, e));
        }
        r.next_begin_offset = next;
        if taken.is_empty() {
            r.status = GetStatus::MessageWasRemoving;
            return Ok(r);
        }
        r.records = inner.read_records(topic, queue_id, &taken).await?;
        r.status = GetStatus::Found;
        Ok(r)
    }

    /// Decodes the record at commit-log offset `offset`; `None` if no record starts there.
    pub async fn look_by_offset(&self, offset: LogOffset) -> Result<Option<StoredMessage>> {
        let raw = match self.read_record(offset).await? {
            Some(raw) => raw,
            None => return Ok(None),
        };
        Ok(StoredMessage::decode(&raw).ok())
    }

    /// The raw record at `offset`, verified; `None` if no valid record starts there.
    pub async fn read_record(&self, offset: LogOffset) -> Result<Option<bytes::Bytes>> {
        let log = &self.inner.log;
        // Offsets come from clients (message ids): no arithmetic may overflow.
        let visible = self.visible_end();
        let fits = |len: u64| offset.checked_add(len).is_some_and(|end| end <= visible);
        if offset < log.min_offset() || !fits(record::MIN_RECORD_LEN as u64) {
            return Ok(None);
        }
        // A direct read costs whole blocks anyway: the first read takes the rest of
        // the page (at least 1 KiB), which usually holds the whole record.
        let first = (4096 - offset % 4096).max(1024).min(visible - offset);
        let head = log.read(offset, first as usize).await?;
        let Ok((size, _)) = record::peek_header(&head) else {
            return Ok(None);
        };
        if size < record::MIN_RECORD_LEN as i32
            || size as usize > self.inner.cfg.max_record_bytes()
            || !fits(size as u64)
        {
            return Ok(None);
        }
        let raw = if size as usize <= head.len() {
            head.slice(..size as usize)
        } else {
            log.read(offset, size as usize).await?
        };
        let verify = Verify {
            crc: true,
            at_offset: Some(offset as i64),
            max_total_size: self.inner.cfg.max_record_bytes(),
            require_record_crc: log.requires_crc(offset),
        };
        match record::decode(&raw, verify) {
            Ok(Decoded::Record(_)) => Ok(Some(raw)),
            _ => Ok(None),
        }
    }

    /// Looks a message up by its 32-character offset message id.
    pub async fn look_by_msg_id(&self, id: &str) -> Result<Option<StoredMessage>> {
        match MessageId::parse(id) {
            Some(id) => self.look_by_offset(id.offset).await,
            None => Ok(None),
        }
    }

    /// Records become visible to readers once dispatched.
    fn visible_end(&self) -> u64 {
        self.inner.dispatched.get()
    }

    pub fn min_queue_offset(&self, topic: &str, queue_id: i32) -> QueueOffset {
        self.inner
            .find_queue(topic, queue_id)
            .map(|q| q.cq.min_offset())
            .unwrap_or(0)
    }

    /// The next queue offset to be consumed-visible (RocketMQ's max offset).
    pub fn max_queue_offset(&self, topic: &str, queue_id: i32) -> QueueOffset {
        self.inner
            .find_queue(topic, queue_id)
            .map(|q| q.cq.max_offset())
            .unwrap_or(0)
    }

    pub fn min_log_offset(&self) -> LogOffset {
        self.inner.log.min_offset()
    }

    pub fn max_log_offset(&self) -> LogOffset {
        self.inner.log.written()
    }

    pub fn flushed_log_offset(&self) -> LogOffset {
        self.inner.log.flushed.get()
    }

    pub fn committed_log_offset(&self) -> LogOffset {
        self.inner.log.committed.get()
    }

    pub fn dispatched_log_offset(&self) -> LogOffset {
        self.inner.dispatched.get()
    }

    /// Store time of the message at queue offset `q`.
    async fn store_time_at(&self, cq: &ConsumeQueue, q: u64) -> Result<Option<i64>> {
        let Some(e) = cq.entry(q).await? else {
            return Ok(None);
        };
        let raw = self
            .inner
            .log
            .read(e.phys_offset as u64, e.size as usize)
            .await?;
        let born_v6 = crate::format::be_i32(&raw, record::SYSFLAG_AT).unwrap_or(0)
            & record::SYSFLAG_BORNHOST_V6
            != 0;
        let at = record::BORN_HOST_AT + if born_v6 { 20 } else { 8 };
        Ok(crate::format::be_i64(&raw, at))
    }

    /// The first queue offset whose message was stored at or after `timestamp_ms`
    /// (RocketMQ 5's LOWER boundary), clamped to [min, max].
    pub async fn queue_offset_by_time(
        &self,
        topic: &str,
        queue_id: i32,
        timestamp_ms: i64,
    ) -> Result<QueueOffset> {
        let Some(q) = self.inner.find_queue(topic, queue_id) else {
            return Ok(0);
        };
        let (mut lo, mut hi) = (q.cq.min_offset(), q.cq.max_offset());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.store_time_at(&q.cq, mid).await? {
                Some(t) if t < timestamp_ms => lo = mid + 1,
                _ => hi = mid,
            }
        }
        Ok(lo)
    }

    /// Store time of the queue's first message, or -1 when it has none.
    pub async fn earliest_message_time(&self, topic: &str, queue_id: i32) -> Result<i64> {
        let Some(q) = self.inner.find_queue(topic, queue_id) else {
            return Ok(-1);
        };
        if q.cq.min_offset() >= q.cq.max_offset() {
            return Ok(-1);
        }
        Ok(self
            .store_time_at(&q.cq, q.cq.min_offset())
            .await?
            .unwrap_or(-1))
    }

    /// Every (topic, queue id) this store holds.
    pub fn queues(&self) -> Vec<(String, i32)> {
        let mut v: Vec<(String, i32)> = self
            .inner
            .queues
            .borrow()
            .iter()
            .flat_map(|(t, qs)| qs.keys().map(move |q| (t.clone(), *q)))
            .collect();
        v.sort();
        v
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

    /// Flushes the consume queues and key index and writes the checkpoint now, instead
    /// of waiting for `consume_queue_flush_interval` (less to re-dispatch after a
    /// crash). A failure here stops the store taking writes, as in the background.
    pub async fn checkpoint(&self) -> Result<()> {
        if self.inner.state.get() != State::Running {
            return Err(Error::ShutDown);
        }
        let r = self.inner.checkpoint_round().await;
        if let Err(e) = &r
            && !matches!(e, Error::Failed(_))
        {
            tracing::error!(error = %e, "checkpoint failed; the shard stops taking writes");
            *self.inner.failed.borrow_mut() = Some(e.to_string());
        }
        r
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
        inner.state.set(State::Stopping);
        inner.log.stop_writer();
        inner.dispatch_wake.notify();
        inner.flusher_wake.notify();
        let tasks: Vec<_> = inner.tasks.borrow_mut().drain(..).collect();
        for t in tasks {
            t.await;
        }
        let failure = self.failure();
        inner.state.set(State::Stopped);
        if let Some(f) = failure {
            inner.lock.borrow_mut().take();
            return Err(Error::Failed(f));
        }
        let end = inner.log.written();
        let _round = inner
            .round_lock
            .acquire_permit(1)
            .await
            .map_err(|e| Error::Failed(e.to_string()))?;
        inner.flush_queues().await?;
        if let Some(ix) = &inner.index {
            ix.flush().await?;
        }
        inner.write_checkpoint(end, inner.manifest(end)).await?;
        let abort = inner.cfg.root.join("abort");
        inner.cfg.disk.remove_file(&abort)?;
        inner.cfg.disk.sync_dir(&inner.cfg.root)?;
        inner.lock.borrow_mut().take();
        tracing::info!(root = %inner.cfg.root.display(), end, "store shut down cleanly");
        Ok(())
    }
}

/// Recovery's [`RecordSink`]: builds ConsumeQueue entries and key-index entries for
/// the records the scan reads, each structure from its own resume point (records
/// below it are never dispatched again to it).
struct Replay<'a> {
    inner: &'a Inner,
    /// Records at or after this get queue entries (the checkpoint's dispatch point).
    queues_from: u64,
    /// Records at or after this go to the key index (its resume point).
    index_from: u64,
    /// Queues are rebuilt from the log's first record (an empty queue may start late).
    rebuild: bool,
    /// Queue entries appended.
    placed: u64,
    /// Set when a queue refused an entry (a gap): the queues take nothing more.
    queue_failure: Option<Error>,
}

impl RecordSink for Replay<'_> {
    async fn record(&mut self, pos: u64, r: &record::RecordView<'_>) -> Result<()> {
        if pos >= self.queues_from && self.queue_failure.is_none() && r.is_dispatched_to_queue() {
            match self.inner.place_entry(r, self.rebuild) {
                Ok(appended) => self.placed += appended as u64,
                Err(e) => {
                    tracing::warn!(error = %e, "recovery dispatch: a queue disagrees with the log");
                    self.queue_failure = Some(e);
                }
            }
        }
        if pos >= self.index_from
            && let Some(ix) = &self.inner.index
        {
            ix.add(r).await?;
        }
        Ok(())
    }
}

/// The queues of a shard, by topic and queue id.
type QueueMap = AHashMap<String, AHashMap<i32, Rc<Queue>>>;

/// Loads every ConsumeQueue under `cfg.root`. A queue whose files are damaged (a file
/// missing between others) is discarded; the flag says that happened, so the caller
/// rebuilds the queues from the whole log.
async fn load_queues(cfg: &StoreConfig, log_min: u64, log_end: u64) -> Result<(QueueMap, bool)> {
    let mut damaged = false;
    let cq_root = cfg.root.join("consumequeue");
    let disk = &cfg.disk;
    let mut found = Vec::new();
    for t in disk.list_dir(&cq_root)? {
        if !t.is_dir {
            continue;
        }
        for qd in disk.list_dir(&t.path)? {
            let Some(qid) = qd.name.parse::<i32>().ok().filter(|_| qd.is_dir) else {
                continue;
            };
            let cq = ConsumeQueue::new(
                &cfg.root,
                &t.name,
                qid,
                cfg.consume_queue_entries_per_file,
                disk.clone(),
            );
            found.push((Rc::new(cq), qd.path));
        }
    }
    // Several loads at once: each is a chain of small dependent I/Os (list, open, read,
    // rewrite the tail page, fdatasync) that waits behind the other shards' recovery
    // reads; one after another they took 0.2-0.6 s of a shard's open in scenario 7 (64
    // queues over 2 shards).
    let mut queues = QueueMap::new();
    for group in found.chunks(QUEUE_IO_IN_FLIGHT) {
        let loads = group
            .iter()
            .map(|(cq, _)| cq.load(log_min, log_end))
            .collect();
        for (r, (cq, path)) in join_all(loads).await.into_iter().zip(group) {
            match r {
                Ok(()) => {
                    let q = Rc::new(Queue {
                        cq: cq.clone(),
                        next_put: Cell::new(0),
                    });
                    queues
                        .entry(cq.topic.clone())
                        .or_default()
                        .insert(cq.queue_id, q);
                }
                Err(e @ Error::Corrupt { .. }) => {
                    tracing::warn!(error = %e, "discarding a damaged consume queue; it is rebuilt from the log");
                    disk.remove_dir_all(path)?;
                    damaged = true;
                }
                Err(e) => return Err(e),
            }
        }
    }
    Ok((queues, damaged))
}

/// Times the steps of `Store::open`.
struct Phases {
    last: std::time::Instant,
    done: Vec<(&'static str, f64)>,
}

impl Default for Phases {
    fn default() -> Self {
        Phases {
            last: std::time::Instant::now(),
            done: Vec::new(),
        }
    }
}

impl Phases {
    fn lap(&mut self, name: &'static str) {
        let now = std::time::Instant::now();
        self.done.push((name, (now - self.last).as_secs_f64()));
        self.last = now;
    }
}

/// The monotonic clock at its coarse resolution (a few milliseconds), as the free
/// space check needs it on every put: `Instant::now` there was ~1% of the CPU per
/// 1 KiB put (perf, scenario 1), the coarse clock reads a value the kernel keeps.
fn coarse_now() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime only writes the timespec it is given.
    if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) } != 0 {
        return Duration::MAX;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// What [`Inner::dispatch_in_place`] did.
struct InPlace {
    /// Bytes of whole records (and a blank) dispatched.
    consumed: u64,
    /// Queue entries appended.
    appended: u64,
    /// The record at `consumed` whose keys need an awaiting index insert: its size
    /// and how many of its keys are in.
    pending: Option<(usize, usize)>,
}

/// The last reading of the file system's free space.
#[derive(Default)]
struct SpaceCheck {
    /// When `avail` was read, on the [`coarse_now`] clock.
    at: Option<Duration>,
    total: u64,
    avail: u64,
    /// Commit-log end when `avail` was read.
    log_end: u64,
    full: bool,
}

impl Inner {
    /// Whether a put of `incoming` bytes leaves the file system within its watermarks
    /// (RocketMQ refuses puts once the disk is over `diskSpaceWarningLevelRatio`).
    /// Free space is re-read every `disk_check_interval`, and on every put once the
    /// estimate (last reading minus the log bytes written since, doubled for queue
    /// and index overhead) comes near the reserve.
    fn disk_has_room(&self, incoming: u64) -> bool {
        let reserve = self.cfg.disk_reserve_bytes();
        let written = self.log.written();
        let mut sc = self.space.borrow_mut();
        let since = written.saturating_sub(sc.log_end).saturating_mul(2);
        let estimate = sc.avail.saturating_sub(since);
        let now = coarse_now();
        let stale = sc
            .at
            .is_none_or(|t| now.saturating_sub(t) >= self.cfg.disk_check_interval);
        if stale || sc.full || estimate < reserve + incoming * 2 {
            match self.cfg.disk.space(&self.cfg.root) {
                Ok(Some((total, avail))) => {
                    sc.total = total;
                    sc.avail = avail;
                }
                Ok(None) => {
                    sc.total = 0;
                    sc.avail = u64::MAX;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read free space; not refusing puts");
                    sc.total = 0;
                    sc.avail = u64::MAX;
                }
            }
            sc.at = Some(now);
            sc.log_end = written;
            let used = sc.total.saturating_sub(sc.avail);
            let ratio = if sc.total == 0 {
                0.0
            } else {
                used as f64 / sc.total as f64
            };
            let full =
                sc.avail < reserve.saturating_add(incoming) || ratio >= self.cfg.disk_full_ratio;
            if full != sc.full {
                if full {
                    tracing::error!(
                        root = %self.cfg.root.display(), avail = sc.avail, total = sc.total, reserve,
                        ratio = self.cfg.disk_full_ratio, "disk full: refusing puts until space is freed"
                    );
                } else {
                    tracing::warn!(root = %self.cfg.root.display(), avail = sc.avail, "disk has room again: taking puts");
                }
                sc.full = full;
            }
            return !full;
        }
        true
    }

    fn check_message(&self, m: &Message) -> Option<PutStatus> {
        use IllegalReason::*;
        let illegal = |r| Some(PutStatus::MessageIllegal(r));
        if m.topic.is_empty() {
            return illegal(TopicEmpty);
        }
        let max_topic = if m.topic.starts_with("%RETRY%") {
            255
        } else {
            self.cfg.max_topic_len
        };
        if m.topic.len() > max_topic {
            return illegal(TopicTooLong);
        }
        if !m.topic.bytes().all(valid_topic_char) {
            return illegal(TopicInvalidChars);
        }
        if m.queue_id < 0 || m.queue_id >= self.cfg.max_queue_id_exclusive {
            return illegal(QueueIdOutOfRange);
        }
        if m.body.len() > self.cfg.max_message_bytes {
            return illegal(BodyTooLarge);
        }
        None
    }

    fn fields<'a>(
        &self,
        m: &'a Message,
        props: &'a [u8],
        q: u64,
        phys: u64,
        ts: i64,
    ) -> RecordFields<'a> {
        RecordFields {
            topic: &m.topic,
            queue_id: m.queue_id,
            flag: m.flag,
            queue_offset: q as i64,
            phys_offset: phys as i64,
            sys_flag: m.sys_flag,
            born_timestamp: m.born_timestamp_ms,
            born_host: m.born_host,
            store_timestamp: ts,
            store_host: std::net::SocketAddr::V4(self.cfg.store_host),
            reconsume_times: m.reconsume_times,
            prepared_transaction_offset: m.prepared_transaction_offset,
            body: &m.body,
            properties: props,
            record_crc: self.cfg.record_crc,
        }
    }

    /// Store timestamps never go backwards in log order.
    fn store_timestamp(&self) -> i64 {
        let ts = crate::now_ms().max(self.last_store_ts.get());
        self.last_store_ts.set(ts);
        ts
    }

    fn find_queue(&self, topic: &str, queue_id: i32) -> Option<Rc<Queue>> {
        self.queues.borrow().get(topic)?.get(&queue_id).cloned()
    }

    fn queue(&self, topic: &str, queue_id: i32) -> Rc<Queue> {
        if let Some(q) = self.find_queue(topic, queue_id) {
            return q;
        }
        let cq = Rc::new(ConsumeQueue::new(
            &self.cfg.root,
            topic,
            queue_id,
            self.cfg.consume_queue_entries_per_file,
            self.cfg.disk.clone(),
        ));
        let q = Rc::new(Queue {
            cq,
            next_put: Cell::new(0),
        });
        self.queues
            .borrow_mut()
            .entry(topic.to_string())
            .or_default()
            .insert(queue_id, q.clone());
        q
    }

    /// Every queue's length now, by (topic, queue id).
    fn queue_lengths(&self) -> AHashMap<(String, i32), u64> {
        self.queues
            .borrow()
            .iter()
            .flat_map(|(t, m)| {
                m.iter()
                    .map(move |(q, v)| ((t.clone(), *q), v.cq.max_offset()))
            })
            .collect()
    }

    /// After recovery found the log's end: loads again, cut to `log_end`, every queue
    /// whose entries reach past it (the log lost a tail they had taken). Such a queue
    /// took nothing from the scan (its entries for the kept records were all there);
    /// returns `true` if one did all the same (it no longer had the length it was
    /// loaded with), so the caller rebuilds the queues from the whole log.
    async fn trim_queues(
        &self,
        log_min: u64,
        log_end: u64,
        loaded: &AHashMap<(String, i32), u64>,
    ) -> Result<bool> {
        let ahead: Vec<Rc<Queue>> = self
            .queues
            .borrow()
            .values()
            .flat_map(|m| m.values())
            .filter(|q| q.cq.max_phys_end() > log_end)
            .cloned()
            .collect();
        let mut inconsistent = false;
        for q in ahead {
            let (topic, qid) = (q.cq.topic.clone(), q.cq.queue_id);
            if loaded.get(&(topic.clone(), qid)) != Some(&q.cq.max_offset()) {
                inconsistent = true;
            }
            let cq = Rc::new(ConsumeQueue::new(
                &self.cfg.root,
                &topic,
                qid,
                self.cfg.consume_queue_entries_per_file,
                self.cfg.disk.clone(),
            ));
            cq.load(log_min, log_end).await?;
            tracing::warn!(
                topic,
                queue = qid,
                from = q.cq.max_offset(),
                to = cq.max_offset(),
                "consume queue cut back to the recovered log"
            );
            let fresh = Rc::new(Queue {
                cq,
                next_put: Cell::new(0),
            });
            self.queues
                .borrow_mut()
                .entry(topic)
                .or_default()
                .insert(qid, fresh);
        }
        Ok(inconsistent)
    }

    /// Builds ConsumeQueue entries for the records in `[from, to)`, reading the log.
    /// Returns how many entries were appended (duplicates are skipped).
    async fn dispatch_range(&self, from: u64, to: u64, rebuild: bool) -> Result<u64> {
        let mut pos = from;
        let mut appended = 0;
        let seg = self.log.segment_bytes();
        let max_total = self.cfg.max_record_bytes();
        let mut buf = std::mem::take(&mut *self.dispatch_buf.borrow_mut());
        let result = async {
            while pos < to {
                let seg_end = pos / seg * seg + seg;
                let mut len = (to.min(seg_end) - pos).min(1 << 20).max(8.min(to - pos)) as usize;
                // Records in a resident window are decoded where they lie (no copy).
                let in_place = self.log.with_resident(pos, len, |bytes| {
                    self.dispatch_in_place(bytes, pos, rebuild)
                });
                if let Some(done) = in_place {
                    let done = done?;
                    appended += done.appended;
                    pos += done.consumed;
                    if let Some((size, skip)) = done.pending {
                        // That record's queue entry is placed; the index must await
                        // for its keys from `skip` on: finish it from a copy.
                        self.log.read_into(pos, size, &mut buf).await?;
                        let verify = Verify {
                            crc: false,
                            at_offset: Some(pos as i64),
                            max_total_size: max_total,
                            require_record_crc: false,
                        };
                        let Ok(Decoded::Record(r)) = record::decode(&buf, verify) else {
                            unreachable!("the record was decoded in place")
                        };
                        if let Some(ix) = &self.index {
                            ix.add_from(&r, skip).await?;
                        }
                        pos += size as u64;
                    }
                    if done.consumed > 0 || done.pending.is_some() {
                        self.dispatched.set(pos.max(self.dispatched.get()));
                        continue;
                    }
                    // The first record runs past its window: copy just that record
                    // out below (its header first, then all of it).
                    len = len.min(8);
                }
                self.log.read_into(pos, len, &mut buf).await?;
                let (size, _) = record::peek_header(&buf).unwrap_or((0, 0));
                if size as usize > buf.len() && (size as usize) <= max_total {
                    if pos + size as u64 > to {
                        // A sync round may end inside a record: the rest of it is not
                        // durable yet, so it is dispatched with a later range.
                        break;
                    }
                    self.log.read_into(pos, size as usize, &mut buf).await?;
                }
                let mut at = 0usize;
                while at < buf.len() {
                    let verify = Verify {
                        crc: false,
                        at_offset: Some((pos + at as u64) as i64),
                        max_total_size: max_total,
                        require_record_crc: false,
                    };
                    match record::decode(&buf[at..], verify) {
                        Ok(Decoded::Record(r)) => {
                            if r.is_dispatched_to_queue() {
                                appended += self.place_entry(&r, rebuild)? as u64;
                            }
                            if let Some(ix) = &self.index {
                                ix.add(&r).await?;
                            }
                            at += r.total_size as usize;
                        }
                        Ok(Decoded::Blank(n)) => {
                            at += n as usize;
                            break;
                        }
                        Err(crate::format::Corruption::Truncated) if at > 0 => break,
                        Err(kind) => {
                            return Err(Error::Corrupt {
                                path: self.log.dir().to_path_buf(),
                                offset: pos + at as u64,
                                kind,
                                detail: Some("dispatch met an invalid record".into()),
                            });
                        }
                    }
                }
                pos += at as u64;
                self.dispatched.set(pos.max(self.dispatched.get()));
            }
            Ok(appended)
        }
        .await;
        *self.dispatch_buf.borrow_mut() = buf;
        result
    }

    /// Dispatches the whole records at the start of `bytes` (log offset `pos`, in a
    /// resident window) without awaiting. Stops at the first record that does not
    /// end in `bytes`, after a blank, or at a record whose keys need the index to
    /// await (`pending`: its size and the keys already added; its queue entry is
    /// placed).
    fn dispatch_in_place(&self, bytes: &[u8], pos: u64, rebuild: bool) -> Result<InPlace> {
        let max_total = self.cfg.max_record_bytes();
        let mut done = InPlace {
            consumed: 0,
            appended: 0,
            pending: None,
        };
        let decode_at = |at: usize| {
            let verify = Verify {
                crc: false,
                at_offset: Some((pos + at as u64) as i64),
                max_total_size: max_total,
                require_record_crc: false,
            };
            record::decode(&bytes[at..], verify)
        };
        let mut at = 0usize;
        while at < bytes.len() {
            match decode_at(at) {
                Ok(Decoded::Record(r)) => {
                    let after = at + r.total_size as usize;
                    if r.is_dispatched_to_queue() {
                        done.appended += self.place_entry(&r, rebuild)? as u64;
                    }
                    if let Some(ix) = &self.index
                        && let Some(skip) = ix.add_now(&r)
                    {
                        done.pending = Some((r.total_size as usize, skip));
                        break;
                    }
                    at = after;
                }
                Ok(Decoded::Blank(n)) => {
                    at += n as usize;
                    break;
                }
                Err(crate::format::Corruption::Truncated) => break,
                Err(kind) => {
                    return Err(Error::Corrupt {
                        path: self.log.dir().to_path_buf(),
                        offset: pos + at as u64,
                        kind,
                        detail: Some("dispatch met an invalid record".into()),
                    });
                }
            }
        }
        done.consumed = at as u64;
        Ok(done)
    }

    /// [`Inner::dispatch_range`] for recovery, before the store runs: reads `[from, to)`
    /// through a read-ahead [`LogReader`] (several 1 MiB reads in flight, records
    /// decoded in the read buffers) instead of one 1 MiB read and copy at a time.
    async fn redispatch(&self, from: u64, to: u64, rebuild: bool) -> Result<u64> {
        let mut reader = LogReader::new(&self.log, from, to);
        let seg = self.log.segment_bytes();
        let max_total = self.cfg.max_record_bytes();
        let mut pos = from;
        let mut appended = 0;
        let result = async {
            while pos < to {
                let seg_end = pos / seg * seg + seg;
                let room = (to.min(seg_end) - pos) as usize;
                let buf = reader.record(pos, room, max_total).await?;
                let verify = Verify {
                    crc: false,
                    at_offset: Some(pos as i64),
                    max_total_size: max_total,
                    require_record_crc: false,
                };
                match record::decode(buf, verify) {
                    Ok(Decoded::Record(r)) => {
                        if r.is_dispatched_to_queue() {
                            appended += self.place_entry(&r, rebuild)? as u64;
                        }
                        if let Some(ix) = &self.index {
                            ix.add(&r).await?;
                        }
                        pos += r.total_size as u64;
                    }
                    Ok(Decoded::Blank(_)) => pos = seg_end,
                    Err(kind) => {
                        return Err(Error::Corrupt {
                            path: self.log.dir().to_path_buf(),
                            offset: pos,
                            kind,
                            detail: Some("dispatch met an invalid record".into()),
                        });
                    }
                }
            }
            Ok(appended)
        }
        .await;
        reader.finish().await;
        result
    }

    fn place_entry(&self, r: &record::RecordView<'_>, rebuild: bool) -> Result<bool> {
        let q = self.queue(r.topic, r.queue_id);
        let entry = CqEntry {
            phys_offset: r.phys_offset,
            size: r.total_size as i32,
            tags_code: tags_code(r.tags()),
        };
        self.last_dispatched_ts.set(r.store_timestamp);
        match q.cq.put(r.queue_offset as u64, entry, rebuild) {
            Placed::Appended => Ok(true),
            Placed::Duplicate => Ok(false),
            Placed::Gap { expected } => Err(Error::Corrupt {
                path: self
                    .cfg
                    .root
                    .join("consumequeue")
                    .join(r.topic)
                    .join(r.queue_id.to_string()),
                offset: expected,
                kind: crate::format::Corruption::BadLength(r.queue_offset),
                detail: Some(format!(
                    "record at {} has queue offset {} but the queue ends at {expected}",
                    r.phys_offset, r.queue_offset
                )),
            }),
        }
    }

    async fn flush_queues(&self) -> Result<()> {
        let dirty: Vec<Rc<Queue>> = self
            .queues
            .borrow()
            .values()
            .flat_map(|m| m.values().cloned())
            .filter(|q| q.cq.is_dirty())
            .collect();
        // Each flush is a write and an fdatasync: several at once, not one after another.
        for group in dirty.chunks(QUEUE_IO_IN_FLIGHT) {
            let flushes = group.iter().map(|q| q.cq.flush()).collect();
            for r in join_all(flushes).await {
                r?;
            }
        }
        Ok(())
    }

    /// Reads the records of `entries` (queue offset, entry) and verifies each one:
    /// checksums, and that it is the record of this queue position, so damaged bytes
    /// or a damaged queue entry give `Error::Corrupt`, never another message.
    async fn read_records(
        &self,
        topic: &str,
        queue_id: i32,
        entries: &[(QueueOffset, CqEntry)],
    ) -> Result<Vec<bytes::Bytes>> {
        // Plan the reads: a record joins the previous read only when the bytes between
        // them are few (MERGE_GAP) and the read stays small, so a queue interleaved
        // with many others never drags their records along (scenario 5b read 32 bytes
        // per byte kept, and the returned records pinned those spans: 2.6 GiB RSS).
        // Records in memory are copied alone.
        const MERGE_GAP: u64 = 8 << 10;
        const MAX_SPAN: u64 = 1 << 20;
        const IN_FLIGHT: usize = 16;
        // Records wholly inside committed blocks and not in a window come through the
        // read cache (large shared reads, copied out); they are the leading entries,
        // since windows hold the newest bytes and committed only grows.
        let max_record = self.cfg.max_record_bytes() as u64;
        let cached = match &self.read_cache {
            Some(cache) => {
                let below = cache.cacheable_below(self.log.committed.get());
                let k = entries
                    .iter()
                    .take_while(|(_, e)| {
                        let (start, size) = (e.phys_offset as u64, e.size as u64);
                        e.size > 0
                            && size <= max_record
                            && start.checked_add(size).is_some_and(|end| end <= below)
                            && !self.log.is_resident(start)
                    })
                    .count();
                // A get whose records fill most of their span (one queue written alone:
                // scenario 5a) reads its own large spans below, as fast as the disk,
                // without waiting behind read-ahead; sparse gets (interleaved queues)
                // share cached blocks.
                let span = entries[..k].last().map_or(0, |(_, e)| {
                    e.phys_offset as u64 + e.size as u64 - entries[0].1.phys_offset as u64
                });
                let bytes: u64 = entries[..k].iter().map(|(_, e)| e.size as u64).sum();
                let k = if bytes * 2 >= span { 0 } else { k };
                let ranges: Vec<(u64, usize)> = entries[..k]
                    .iter()
                    .map(|(_, e)| (e.phys_offset as u64, e.size as usize))
                    .collect();
                cache.read_ranges(&self.log, &ranges).await?
            }
            None => Vec::new(),
        };
        for ((qoff, e), raw) in entries.iter().zip(&cached) {
            self.verify_entry_record(topic, queue_id, *qoff, e, raw)?;
        }
        let mut out = cached;
        let first = out.len();
        let mut spans: Vec<(u64, u64, std::ops::Range<usize>)> = Vec::new();
        let mut i = first;
        while i < entries.len() {
            let start = entries[i].1.phys_offset as u64;
            let mut end = start + entries[i].1.size as u64;
            let mut j = i + 1;
            if !self.log.is_resident(start) {
                while j < entries.len() {
                    let e = &entries[j].1;
                    let (e_start, e_end) =
                        (e.phys_offset as u64, e.phys_offset as u64 + e.size as u64);
                    if e_start < end || e_start - end > MERGE_GAP || e_end - start > MAX_SPAN {
                        break;
                    }
                    end = e_end;
                    j += 1;
                }
            }
            spans.push((start, end, i..j));
            i = j;
        }
        // Disk reads go out together (up to IN_FLIGHT at once), not one after another.
        out.reserve(entries.len() - first);
        for group in spans.chunks(IN_FLIGHT) {
            let reads = group
                .iter()
                .map(|(start, end, _)| self.log.read(*start, (end - start) as usize))
                .collect();
            for (data, (start, _, range)) in join_all(reads).await.into_iter().zip(group) {
                let span = data?;
                for (qoff, e) in &entries[range.clone()] {
                    let at = (e.phys_offset as u64 - start) as usize;
                    let raw = span.slice(at..at + e.size as usize);
                    self.verify_entry_record(topic, queue_id, *qoff, e, &raw)?;
                    out.push(raw);
                }
            }
        }
        Ok(out)
    }

    fn verify_entry_record(
        &self,
        topic: &str,
        queue_id: i32,
        qoff: QueueOffset,
        e: &CqEntry,
        raw: &[u8],
    ) -> Result<()> {
        let phys = e.phys_offset as u64;
        let verify = Verify {
            crc: true,
            at_offset: Some(phys as i64),
            max_total_size: self.cfg.max_record_bytes(),
            require_record_crc: self.log.requires_crc(phys),
        };
        let kind = match record::decode(raw, verify) {
            Ok(Decoded::Record(v))
                if v.topic == topic
                    && v.queue_id == queue_id
                    && v.queue_offset == qoff as i64
                    && v.total_size == e.size as u32 =>
            {
                return Ok(());
            }
            Ok(_) => crate::format::Corruption::QueueMismatch,
            Err(k) => k,
        };
        let (path, offset) = self.log.locate(phys);
        tracing::error!(path = %path.display(), offset, %kind, topic, queue_id, qoff, "damaged record on read");
        Err(Error::Corrupt {
            path,
            offset,
            kind,
            detail: Some(format!(
                "record for {topic}/{queue_id} at queue offset {qoff}"
            )),
        })
    }

    /// Every queue holding entries and its length, taken when `dispatched` read
    /// `dispatch_safe` (call with no await in between).
    fn manifest(&self, dispatch_safe: u64) -> QueueManifest {
        let mut queues: Vec<(String, i32, u64)> = self
            .queues
            .borrow()
            .iter()
            .flat_map(|(t, m)| {
                m.iter()
                    .map(move |(q, v)| (t.clone(), *q, v.cq.max_offset()))
            })
            .filter(|(_, _, max)| *max > 0)
            .collect();
        queues.sort();
        QueueManifest {
            dispatch_safe,
            queues,
        }
    }

    /// Whether a queue holds fewer entries than the manifest written with the
    /// checkpoint says it had (a lost or damaged queue file). Only meaningful when
    /// the recovered log reaches the manifest's dispatch point.
    fn queues_shorter_than_manifest(&self, cp: &Checkpoint, log_end: u64) -> bool {
        let path = self.cfg.root.join("config").join("cq-manifest");
        let Ok(Some(bytes)) = self.cfg.disk.read_file(&path) else {
            return false;
        };
        let Ok(m) = QueueManifest::decode(&bytes) else {
            tracing::warn!(path = %path.display(), "queue manifest unreadable; not used");
            return false;
        };
        if m.dispatch_safe != cp.dispatch_safe_offset || log_end < m.dispatch_safe {
            return false;
        }
        m.queues.iter().any(|(t, q, max)| {
            let have = self.find_queue(t, *q).map_or(0, |x| x.cq.max_offset());
            if have < *max {
                tracing::warn!(topic = %t, queue = q, have, expected = max, "consume queue lost entries");
            }
            have < *max
        })
    }

    /// Writes the checkpoint, then the queue manifest that goes with it.
    async fn write_checkpoint(&self, log_flushed: u64, manifest: QueueManifest) -> Result<()> {
        let dispatch_safe = manifest.dispatch_safe;
        let queue_count = manifest.queues.len();
        let cp = Checkpoint {
            queue_count: queue_count as u32,
            crc_required_from: self.log.crc_required_from(),
            physic_msg_timestamp: self.log.flushed_timestamp(),
            logics_msg_timestamp: self.last_dispatched_ts.get(),
            index_msg_timestamp: self.index.as_ref().map_or(0, |ix| ix.full_flushed_end_ts()),
            log_flushed_offset: log_flushed,
            dispatch_safe_offset: dispatch_safe,
        };
        debug_assert!(dispatch_safe <= self.log.written() || dispatch_safe == log_flushed);
        self.checkpoint.write_aligned(0, &cp.encode()).await?;
        self.checkpoint.sync().await?;
        const _: () = assert!(CHECKPOINT_LEN == io::PAGE);
        let dir = self.cfg.root.join("config");
        let path = dir.join("cq-manifest");
        self.cfg.disk.create_dir_all(&dir)?;
        self.cfg.disk.replace_file(&path, &manifest.encode())
    }

    fn spawn_tasks(self: &Rc<Self>) -> Result<()> {
        use glommio::{Latency, Shares, executor};
        let sync = self.cfg.flush_mode == FlushMode::Sync;
        let tq = |name: &str, shares: usize| {
            // A sync-flush writer's I/O completions preempt other task queues, so the
            // next group-commit round starts at once (see `commit_log`'s docs).
            let latency = if sync && name == "commit-log-writer" {
                Latency::Matters(Duration::from_millis(1))
            } else {
                Latency::NotImportant
            };
            executor().create_task_queue(Shares::Static(shares), latency, name)
        };
        let spawn =
            |name: &str,
             shares: usize,
             fut: std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>| {
                glommio::spawn_local_into(fut, tq(name, shares))
                    .map(|t| t.detach())
                    .map_err(|e| Error::Config(format!("cannot spawn {name}: {e}")))
            };
        let writer = spawn(
            "commit-log-writer",
            1000,
            Box::pin(self.log.clone().run_writer()),
        )?;
        let me = self.clone();
        let dispatcher = spawn(
            "dispatch",
            500,
            Box::pin(async move { me.run_dispatcher().await }),
        )?;
        let me = self.clone();
        let flusher = spawn(
            "cq-flush",
            100,
            Box::pin(async move { me.run_queue_flusher().await }),
        )?;
        self.tasks
            .borrow_mut()
            .extend([writer, dispatcher, flusher]);
        Ok(())
    }

    fn confirm_offset(&self) -> u64 {
        match self.cfg.flush_mode {
            FlushMode::Sync => self.log.flushed.get(),
            FlushMode::Async => self.log.written(),
        }
    }

    async fn run_dispatcher(self: Rc<Self>) {
        loop {
            let from = self.dispatched.get();
            let to = self.confirm_offset();
            if from < to {
                if let Err(e) = self.dispatch_range(from, to, false).await {
                    tracing::error!(error = %e, "dispatch failed; the shard stops taking writes");
                    *self.failed.borrow_mut() = Some(e.to_string());
                    self.dispatched.close();
                    return;
                }
                glommio::yield_if_needed().await;
                continue;
            }
            if self.log.failure().is_some() {
                // The writer failed: nothing more becomes durable or visible.
                return;
            }
            // Stopping: exit once everything written is flushed and dispatched.
            let log_done =
                self.log.failure().is_some() || self.log.flushed.get() >= self.log.written();
            if self.state.get() != State::Running && log_done && to >= self.log.written() {
                return;
            }
            let flushed = self.log.flushed.wait_for(to + 1);
            futures_lite::future::or(
                futures_lite::future::or(self.dispatch_wake.wait(), async {
                    flushed.await;
                }),
                glommio::timer::sleep(std::time::Duration::from_millis(100)),
            )
            .await;
        }
    }

    /// Flushes the consume queues and the key index, then writes the checkpoint that
    /// says how far they go. Rounds never overlap.
    async fn checkpoint_round(&self) -> Result<()> {
        let _round = self
            .round_lock
            .acquire_permit(1)
            .await
            .map_err(|e| Error::Failed(e.to_string()))?;
        if let Some(f) = self.failed.borrow().clone() {
            return Err(Error::Failed(f));
        }
        let dispatch_safe = self.dispatched.get();
        let log_flushed = self.log.flushed.get();
        let manifest = self.manifest(dispatch_safe);
        self.flush_queues().await?;
        if let Some(ix) = &self.index {
            ix.flush().await?;
        }
        self.write_checkpoint(log_flushed, manifest).await
    }

    async fn run_queue_flusher(self: Rc<Self>) {
        loop {
            futures_lite::future::or(
                self.flusher_wake.wait(),
                glommio::timer::sleep(self.cfg.consume_queue_flush_interval),
            )
            .await;
            if self.state.get() != State::Running {
                return;
            }
            if let Err(e) = self.checkpoint_round().await {
                tracing::error!(error = %e, "consume-queue flush failed; the shard stops taking writes");
                *self.failed.borrow_mut() = Some(e.to_string());
                return;
            }
        }
    }
}
