//! Recovery: `Store::open`, RocketMQ's `DefaultMessageStore.load` and `recover`
//! (normal and abnormal CommitLog recovery, `recoverConsumeQueue`, the index load)
//! done as one pass over the log, in five named phases (each timed in
//! [`OpenReport::phases`]):
//!
//! 1. [`open_log`] ("start"): lock the root, read `abort` and the checkpoint, open the
//!    CommitLog's segments (nothing read yet) and read its flush mark.
//! 2. [`open_structures`] ("key index and queues"): the key index opens (repaired after
//!    a crash) while the ConsumeQueues load, 16 at a time: both are chains of small
//!    dependent I/Os, and together they took this step from 0.4-0.7 s to 0.02-0.17 s per
//!    shard (scenario 7). Nothing is cut: the log's end is not known yet. The table's
//!    first rows pick where the queues resume; the key index resumes at its own durable
//!    point ([`crate::index::IndexService::resume_point`]), which needs no row.
//! 3. [`scan_and_dispatch`] ("scan and dispatch"): `CommitLog::recover` verifies the log,
//!    judging damage against the durable flushed offset (the higher of the checkpoint's
//!    and the flush mark's: the mark is recorded as flushes happen, the checkpoint up to
//!    a second later), leaves the mark at the end it keeps, and hands every record from the lower of the two resume points to [`Replay`]:
//!    queue entries for records at or past the queues' point, key-index entries for
//!    records at or past the index's, so no structure takes a record twice. Only records
//!    below the end the scan keeps reach it (a torn tail is cut; damage refuses the open,
//!    and the queues, changed only in memory, are not written). One pass, not a scan
//!    then a re-dispatch of the same bytes: 0.83-0.97 s against 2.06-2.20 s to open
//!    2 x 587 MB of log with every key re-indexed (scenario 7; fio 1.22-1.39 s).
//! 4. [`cut_past_log_end`] ("cut"): queues and index that reach past the recovered end
//!    (the log lost a tail they had taken) are cut back to it. They took nothing in
//!    phase 3: every record the log kept lies below what they held. Then the table's
//!    other rows pick the rare second pass.
//! 5. [`flush_and_checkpoint`] ("flush"): queues flushed, a new checkpoint written, the
//!    `abort` file created. The key index is not flushed here: it knows its own durable
//!    point, the checkpoint claims nothing about it, and the first background round
//!    flushes it (after a long re-dispatch that flush took 1.4 s of a 2.7 s open).
//!
//! The runs behind these figures: `docs/performance/store.md`.
//!
//! The CommitLog's own damage rules (torn tail or refusal) are `CommitLog::recover`'s;
//! what recovery does about the ConsumeQueues and the key index is one decision table,
//! [`decision::decide`], evaluated in phase 2 (where the queues resume) and phase 4
//! (which second pass, if any).

mod decision;

use super::put::PutScratch;
use super::space::SpaceCheck;
use super::{Inner, OpenReport, Owner, State, Store};
use crate::commit_log::{CommitLog, RecordSink, RecoverPlan, ScanReport, read_cache::ReadCache};
use crate::config::StoreConfig;
use crate::consume_queue::QueueTable;
use crate::error::{Error, Result};
use crate::format::checkpoint::Checkpoint;
use crate::format::record::RecordView;
use crate::index::IndexService;
use crate::io::{File, RootLock};
use crate::wake::{Notify, OffsetWatch};
use ahash::AHashMap;
use decision::{Action, AfterScan, Facts, PastEnd, QueueFiles, decide};
use std::cell::{Cell, RefCell};
use std::rc::Rc;

impl Store {
    /// Opens (or creates) the store at `cfg.root`, recovering from whatever the last
    /// run left (module docs), and starts its background tasks on the current executor.
    pub async fn open(cfg: StoreConfig) -> Result<Store> {
        cfg.validate()?;
        let cfg = Rc::new(cfg);
        let mut phases = Phases::default();
        let opened = open_log(&cfg).await?;
        phases.lap("start");
        let (inner, mut rec) = open_structures(&cfg, opened).await?;
        phases.lap("key index and queues");
        scan_and_dispatch(&inner, &mut rec).await?;
        phases.lap("scan and dispatch");
        cut_past_log_end(&inner, &mut rec).await?;
        phases.lap("cut");
        flush_and_checkpoint(&inner, &rec).await?;
        phases.lap("flush");
        let report = OpenReport {
            clean_shutdown: rec.clean,
            checkpoint_valid: rec.cp.is_some(),
            records_scanned: rec.scan.records,
            log_end: rec.log_end,
            truncated: rec.scan.truncated.map(|(at, _, n)| (at, n)),
            dispatched_from: rec.queues_from,
            entries_rebuilt: rec.rebuilt,
            queues: inner.queues.count(),
            phases: phases.done,
        };
        tracing::info!(root = %cfg.root.display(), ?report, "store opened");
        inner.spawn_tasks()?;
        Ok(Store {
            _owner: Rc::new(Owner(inner.clone())),
            inner,
            report: Rc::new(report),
        })
    }
}

/// What phase 1 opened.
struct LogOpened {
    lock: RootLock,
    clean: bool,
    cp: Option<Checkpoint>,
    log: Rc<CommitLog>,
    checkpoint_file: Rc<File>,
}

/// What the phases learn and hand on.
struct Recovery {
    /// No `abort` file: the last run shut down cleanly.
    clean: bool,
    /// The checkpoint, when present and intact.
    cp: Option<Checkpoint>,
    log_min: u64,
    /// Where the queues resume (phase 2); the log's first record after a full
    /// rebuild (phase 4).
    queues_from: u64,
    /// Where the key index resumes (`u64::MAX` without one).
    index_from: u64,
    /// Every queue's length as loaded, to tell a queue that took records in phase 3.
    loaded: AHashMap<(String, i32), u64>,
    scan: ScanReport,
    /// A queue refused an entry in phase 3 (it disagrees with the log).
    queue_failure: Option<Error>,
    log_end: u64,
    /// Queue entries appended.
    rebuilt: u64,
}

/// Phase 1: the root locked, the checkpoint read, the CommitLog's segments open.
async fn open_log(cfg: &Rc<StoreConfig>) -> Result<LogOpened> {
    let (root, disk) = (&cfg.root, &cfg.disk);
    disk.create_dir_all(root)?;
    let lock = disk.lock_root(root)?;
    disk.prime_executor(root).await?;
    let clean = !disk.exists(&root.join("abort"));
    let cp_path = root.join("checkpoint");
    let cp = match disk.read_file(&cp_path)?.map(|b| Checkpoint::decode(&b)) {
        Some(Ok((cp, true))) => Some(cp),
        Some(Err(kind)) => {
            tracing::warn!(path = %cp_path.display(), %kind, "checkpoint damaged; recovering from the whole log");
            None
        }
        Some(Ok((_, false))) | None => None,
    };
    // Which records must carry the record-CRC property: all of a coremq store's (as its
    // checkpoint says); for an adopted RocketMQ store or a lost checkpoint, only those
    // written from now on (set after the scan).
    let crc_from = cp.as_ref().map_or(u64::MAX, |cp| cp.crc_required_from);
    let log = CommitLog::open_files(cfg.clone(), crc_from).await?;
    let new_checkpoint = !disk.exists(&cp_path);
    let checkpoint_file = disk.open(&cp_path, true).await?;
    if new_checkpoint {
        // Its name durable before a checkpoint is written into it.
        disk.sync_dir(root)?;
    }
    Ok(LogOpened {
        lock,
        clean,
        cp,
        log,
        checkpoint_file,
    })
}

/// Phase 2: the key index and the queues opened, uncut, and where each resumes.
async fn open_structures(
    cfg: &Rc<StoreConfig>,
    opened: LogOpened,
) -> Result<(Rc<Inner>, Recovery)> {
    let LogOpened {
        lock,
        clean,
        cp,
        log,
        checkpoint_file,
    } = opened;
    let log_min = log.min_offset();
    let open_index = async {
        if !cfg.index_enable {
            return Ok(None);
        }
        let (ix, rep) = IndexService::open(cfg, clean, u64::MAX).await?;
        tracing::debug!(?rep, "key index opened");
        Ok::<_, Error>(Some(Rc::new(ix)))
    };
    let load_queues = QueueTable::load(cfg.clone(), log_min, u64::MAX);
    let (index, queues) = futures_lite::future::zip(open_index, load_queues).await;
    let (index, (queues, damaged)) = (index?, queues?);
    // What a crash left of a topic deletion goes now (`store/retention.rs`).
    let deleted = crate::clean::topics::DeletedTopicSet::load(&cfg.disk, &cfg.root)?;
    let dropped = queues.drop_deleted(|t| deleted.deleted_below(t)).await?;
    let cleaner = crate::clean::Cleaner::new(cfg.retention.clone(), deleted)?;
    let inner = Rc::new(Inner {
        cfg: cfg.clone(),
        log,
        queues,
        dispatched: OffsetWatch::new(0),
        deadline_armed: Rc::new(Notify::default()),
        dispatch_wake: Notify::default(),
        flusher_wake: Notify::default(),
        put_scratch: RefCell::new(PutScratch::default()),
        dispatch_buf: RefCell::new(Vec::new()),
        last_store_ts: Cell::new(0),
        last_dispatched_ts: Cell::new(0),
        dispatch_pass: Cell::new(0),
        state: Cell::new(State::Running),
        failed: RefCell::new(None),
        round_lock: glommio::sync::Semaphore::new(1),
        space: RefCell::new(SpaceCheck::default()),
        checkpoint: checkpoint_file,
        tasks: RefCell::new(Vec::new()),
        lock: RefCell::new(Some(lock)),
        index,
        read_cache: ReadCache::new(cfg),
        transfer: Default::default(),
        clean: cleaner,
        checkpointed: Cell::new((0, 0)),
        written: Default::default(),
        sched: super::scheduled::Scheduling::load(cfg)?,
        stats: crate::stats::StatsRecorder::new(),
    });
    let files = queue_files(&inner, cp.as_ref(), damaged, dropped);
    let queues_from = match decide(Facts::Loaded {
        checkpoint: cp.is_some(),
        queues: files,
    }) {
        Action::ResumeAtCheckpoint => cp.as_ref().map_or(0, |cp| cp.dispatch_safe_offset),
        Action::RebuildQueues => log_min,
        a @ (Action::Refuse | Action::ReindexTail | Action::Keep) => {
            unreachable!("{a:?} is decided after the scan")
        }
    }
    .max(log_min);
    let index_from = inner
        .index
        .as_ref()
        .map_or(u64::MAX, |ix| ix.resume_point().max(log_min));
    let rec = Recovery {
        clean,
        cp,
        log_min,
        queues_from,
        index_from,
        loaded: inner.queues.lengths(),
        scan: ScanReport::default(),
        queue_failure: None,
        log_end: 0,
        rebuilt: 0,
    };
    Ok((inner, rec))
}

/// The queues as loaded against the checkpoint: the first problem found, in the
/// order of the table's rows. Queues not yet cut to the log's end hold at least what
/// the checkpoint and its manifest say they held, whatever the scan finds: fewer
/// means files were lost.
///
/// Queues of a deleted topic taken out at open (`dropped` of them held entries) count
/// as present: the checkpoint may predate the deletion.
fn queue_files(
    inner: &Inner,
    cp: Option<&Checkpoint>,
    damaged: bool,
    dropped: usize,
) -> QueueFiles {
    let queues = &inner.queues;
    // The checkpoint counts the queues holding entries, as its manifest lists them.
    let holding = queues.manifest(0).queues.len() + dropped;
    let deleted = |t: &str| inner.clean.deleted.deleted_below(t).is_some();
    let files = match cp {
        _ if damaged => QueueFiles::Damaged,
        Some(cp) if (holding as u32) < cp.queue_count => QueueFiles::Missing,
        Some(cp) if queues.shorter_than_manifest(cp.dispatch_safe_offset, u64::MAX, deleted) => {
            QueueFiles::ShortOfManifest
        }
        _ => QueueFiles::AsCheckpointed,
    };
    if files != QueueFiles::AsCheckpointed {
        tracing::warn!(
            loaded = holding,
            recorded = cp.map_or(0, |cp| cp.queue_count),
            "consume queues are missing; rebuilding them from the whole log"
        );
    }
    files
}

/// Phase 3: the log verified (a torn tail cut, damage refused) while its records go to
/// the queues and the key index from their resume points.
async fn scan_and_dispatch(inner: &Inner, rec: &mut Recovery) -> Result<()> {
    let (scan_from, cp_flushed) = rec.cp.as_ref().map_or((0, 0), |cp| {
        let flushed = cp.log_flushed_offset;
        (cp.dispatch_safe_offset.min(flushed), flushed)
    });
    // The refuse line: the durable flushed offset, as the flush mark recorded it while
    // the log was flushed (up to a second past the checkpoint's), or the checkpoint's.
    let mark = inner.log.flush_mark();
    let plan = RecoverPlan {
        scan_from,
        durable_below: cp_flushed.max(mark.unwrap_or(0)),
        marked: mark.is_some(),
        trust_end: rec.clean && rec.cp.is_some(),
        // From the scan's start at least: the delivered positions resume there
        // (`store/delivered.rs`); the queues and the index skip what is below their
        // own points.
        replay_from: rec.queues_from.min(rec.index_from).min(scan_from),
    };
    let mut replay = Replay {
        inner,
        queues_from: rec.queues_from,
        index_from: rec.index_from,
        // A log that begins past its base (a slave that started at its master's last
        // segment) has queues that begin past 0.
        rebuild: rec.queues_from == rec.log_min || rec.log_min > inner.cfg.log_base_offset,
        placed: 0,
        queue_failure: None,
    };
    rec.scan = inner.log.recover(plan, &mut replay).await?;
    rec.rebuilt = replay.placed;
    rec.queue_failure = replay.queue_failure.take();
    rec.log_end = inner.log.written();
    if inner.log.crc_required_from() == u64::MAX {
        // Nothing told us (no checkpoint, no record carried the property): require it
        // of everything written from now on.
        inner.log.set_crc_required_from(rec.log_end);
    }
    Ok(())
}

/// Phase 4: queues and index cut back to the recovered end, then the second pass the
/// table asks for, if any.
async fn cut_past_log_end(inner: &Inner, rec: &mut Recovery) -> Result<()> {
    let (log_min, log_end) = (rec.log_min, rec.log_end);
    let cut = inner.queues.cut_to(log_min, log_end, &rec.loaded).await?;
    let index_cut = match &inner.index {
        Some(ix) => ix.cut_to(log_end).await?,
        None => false,
    };
    let facts = Facts::Scanned(AfterScan {
        from_log_start: rec.queues_from == log_min,
        queue_disagreed: rec.queue_failure.is_some(),
        replay_undecodable: rec.scan.replay_failed.is_some(),
        queues_past_end: match cut {
            _ if cut.took_records => PastEnd::TookRecords,
            _ if cut.queues > 0 => PastEnd::CutBack,
            _ => PastEnd::Within,
        },
        index_past_end: index_cut,
    });
    match decide(facts) {
        Action::Keep => {}
        Action::Refuse => {
            return Err(rec
                .queue_failure
                .take()
                .expect("refused only for a queue's failure"));
        }
        Action::RebuildQueues => {
            let why = match (&rec.scan.replay_failed, &rec.queue_failure) {
                (Some((at, kind)), _) => {
                    format!("the replay met an undecodable record at {at} ({kind})")
                }
                (None, Some(e)) => e.to_string(),
                (None, None) => "a queue ahead of the log took records too".into(),
            };
            tracing::warn!(
                why,
                "dispatch from the checkpoint failed; rebuilding queues from the whole log"
            );
            rec.queues_from = log_min;
            rec.rebuilt += inner.redispatch(log_min, log_end, true).await?;
        }
        Action::ReindexTail => {
            if let Some(ix) = &inner.index {
                let resume = ix.resume_point().max(log_min);
                let rebuild = rec.queues_from == log_min;
                rec.rebuilt += inner.redispatch(resume, log_end, rebuild).await?;
            }
        }
        Action::ResumeAtCheckpoint => unreachable!("decided before the scan"),
    }
    Ok(())
}

/// Phase 5: the queues flushed and a checkpoint written at the recovered end; `abort`
/// created (removed again by a clean shutdown).
async fn flush_and_checkpoint(inner: &Inner, rec: &Recovery) -> Result<()> {
    inner.dispatched.set(rec.log_end);
    inner.queues.put_at_ends();
    inner.queues.flush().await?;
    inner
        .write_checkpoint(rec.log_end, inner.queues.manifest(rec.log_end))
        .await?;
    let abort = inner.cfg.root.join("abort");
    inner
        .cfg
        .disk
        .write_file_durable(&abort, std::process::id().to_string().as_bytes())
}

/// Recovery's [`RecordSink`]: builds ConsumeQueue entries and key-index entries for
/// the records the scan reads, each structure from its own resume point (records
/// below it are never dispatched again to it).
struct Replay<'a> {
    inner: &'a Inner,
    /// Records at or after this get queue entries.
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
    async fn record(&mut self, pos: u64, r: &RecordView<'_>) -> Result<()> {
        // Every replayed record: the delivered positions resume below the queues.
        self.inner.note_delivered(r);
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

/// Times the phases of `Store::open`.
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
