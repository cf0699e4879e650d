//! Retention: RocketMQ's `CleanCommitLogService` and `CleanConsumeQueueService` (with
//! `IndexService.deleteExpiredFile`), one cleaner per shard, in its own glommio task
//! queue (100 shares).
//!
//! A **pass** runs every `clean_interval` (10 s), at once when a put is refused for a
//! full disk, and on request (`Store::delete_expired_files`, RocketMQ's
//! `executeDeleteFilesManually`):
//! 1. **Level.** The file system's use (`statvfs`: used / total, as the puts' disk-full
//!    check reads it) against `disk_max_used_space_ratio` (75%),
//!    `disk_clean_forcibly_ratio` (85%) and `disk_full_ratio` (90%, where puts are
//!    refused): [`policy::Level`]. Every change of level is logged (a rise at warn, a
//!    fall at info) and each rise counted per level.
//! 2. **Segments**, oldest first, at most `delete_file_batch_max` (10) per pass,
//!    `delete_interval` (100 ms) apart, each judged by [`policy::decide`]: expired (its
//!    newest record older than `file_reserved_time`, 72 h, bounded by the store time
//!    of the next segment's first record) and time to delete (a `delete_when` hour, the
//!    disk over 75%, or a manual request); or the disk at the force level (85%) with
//!    `clean_file_forcibly` on, while it stays there. The pass stops at the first
//!    segment kept. Whatever the table says, a segment is deleted only when it lies
//!    wholly below the store's limit ([`Owner::deletable_below`]): never the segment
//!    being written, only durable, dispatched bytes covered by the last checkpoint
//!    (recovery never needs them), and with `keep_for_slaves` nothing a connected slave
//!    has not reported. The mechanism is `CommitLog::retire_oldest`.
//! 3. **Queues and index**, when the log's minimum moved: queue files whose entries all
//!    point below it, index files whose newest entry does (never a queue's or the
//!    index's last file), every queue's minimum moved; the deleted topics whose records
//!    are all gone are forgotten (`topics.rs`).
//!
//! Reads never see a deleted file: the log's minimum moves before a segment leaves, a
//! `get` below a queue's minimum answers `OffsetTooSmall` with the minimum as next
//! begin offset, look-ups by offset or key below the log's minimum find nothing, and a
//! read already in flight keeps its file open until it ends.
//!
//! Passes never overlap (a manual pass waits for a background one). A pass that fails
//! (an I/O error removing a file) is logged and counted; retiring segments then stops
//! until the store is reopened (`commit_log/retire.rs` says why); the store keeps
//! serving.

pub mod policy;
pub mod topics;

use crate::commit_log::CommitLog;
use crate::config::RetentionConfig;
use crate::consume_queue::QueueTable;
use crate::error::{Error, Result};
use crate::index::IndexService;
use crate::wake::Notify;
use policy::{Decision, Facts, Level};
use std::cell::{Cell, RefCell};
use std::rc::Rc;

/// What a store gives its cleaner.
pub(crate) trait Owner {
    fn log(&self) -> &CommitLog;
    fn queues(&self) -> &QueueTable;
    fn index(&self) -> Option<&IndexService>;
    fn cleaner(&self) -> &Cleaner;
    /// Segments ending at or below this offset may be deleted (module docs).
    fn deletable_below(&self) -> u64;
    /// `(total, available)` bytes of the file system holding the store.
    fn disk_space(&self) -> Option<(u64, u64)>;
    /// `disk_full_ratio`, the level where puts are refused.
    fn disk_full_ratio(&self) -> f64;
    /// Free bytes below which puts are refused (`disk_min_free_bytes`): with less
    /// free the pass works at the full level, whatever the ratio.
    fn disk_reserve_bytes(&self) -> u64;
    /// Whether the store still runs.
    fn running(&self) -> bool;
    /// The store's self-check (`store/self_check.rs`), run under the pass lock.
    fn check_self(
        &self,
    ) -> impl std::future::Future<Output = Result<crate::store::SelfCheckReport>>;
}

/// What one pass did (also what `Store::delete_expired_files` returns).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PassReport {
    /// Segments deleted because they were expired, and because the disk was over the
    /// force level.
    pub expired_segments: usize,
    pub forced_segments: usize,
    pub queue_files: usize,
    pub index_files: usize,
    /// The log's minimum after the pass.
    pub log_min: u64,
    /// The disk's level when the pass started (`None`: unknown, no statvfs).
    pub level: Option<&'static str>,
}

/// Counters of a shard's cleaner (for stats and metrics).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CleanStats {
    pub passes: u64,
    pub failed_passes: u64,
    pub expired_segments: u64,
    pub forced_segments: u64,
    pub queue_files: u64,
    pub index_files: u64,
    /// Rises into each level (`Level::ALL` order; the first, normal, is always 0).
    pub level_rises: [u64; 4],
    /// The level the last pass saw.
    pub level: &'static str,
    /// Disk use the last pass saw (used / total), 0 when unknown.
    pub disk_ratio: f64,
    /// Self-checks run in this task, and the problems they found.
    pub self_checks: u64,
    pub self_check_problems: u64,
}

/// A shard's cleaner: its settings, state and counters (module docs).
pub struct Cleaner {
    /// The settings and `delete_when`'s hours; replaced at run time by
    /// [`Cleaner::set_config`] (a pass uses the ones it started with).
    cfg: RefCell<(RetentionConfig, Vec<u8>)>,
    wake: Notify,
    /// Serialises passes.
    lock: glommio::sync::Semaphore,
    level: Cell<Level>,
    /// The log's minimum when the queues and index were last cleaned.
    cleaned_min: Cell<u64>,
    stats: RefCell<CleanStats>,
    /// The deleted topics (`topics.rs`).
    pub deleted: topics::DeletedTopicSet,
}

impl Cleaner {
    pub fn new(cfg: RetentionConfig, deleted: topics::DeletedTopicSet) -> Result<Cleaner> {
        let hours = cfg.delete_hours()?;
        Ok(Cleaner {
            cfg: RefCell::new((cfg, hours)),
            wake: Notify::default(),
            lock: glommio::sync::Semaphore::new(1),
            level: Cell::new(Level::Normal),
            cleaned_min: Cell::new(0),
            stats: RefCell::new(CleanStats {
                level: Level::Normal.name(),
                ..Default::default()
            }),
            deleted,
        })
    }

    /// Starts a pass now (a put found the disk full; the store stops).
    pub fn wake(&self) {
        self.wake.notify();
    }

    /// The settings in use.
    pub fn config(&self) -> RetentionConfig {
        self.cfg.borrow().0.clone()
    }

    /// Replaces the settings (the next pass uses them), after checking them as
    /// opening a store does.
    pub fn set_config(&self, cfg: RetentionConfig, disk_full_ratio: f64) -> Result<()> {
        cfg.validate(disk_full_ratio)?;
        let hours = cfg.delete_hours()?;
        tracing::info!(?cfg, "retention settings changed");
        *self.cfg.borrow_mut() = (cfg, hours);
        self.wake();
        Ok(())
    }

    pub fn stats(&self) -> CleanStats {
        self.stats.borrow().clone()
    }

    /// Notes the level of this pass: logs and counts a change.
    fn note_level(&self, level: Level, ratio: Option<f64>) {
        let old = self.level.replace(level);
        let mut st = self.stats.borrow_mut();
        st.level = level.name();
        st.disk_ratio = ratio.unwrap_or(0.0);
        if level == old {
            return;
        }
        let ratio = ratio.unwrap_or(0.0);
        if level > old {
            for l in Level::ALL.iter().filter(|l| **l > old && **l <= level) {
                st.level_rises[*l as usize] += 1;
            }
            tracing::warn!(
                from = old.name(),
                to = level.name(),
                ratio,
                "disk use crossed a retention level"
            );
        } else {
            tracing::info!(
                from = old.name(),
                to = level.name(),
                ratio,
                "disk use fell below a retention level"
            );
        }
    }
}

/// The disk's use: used / total, as the puts' disk-full check reads it.
pub fn usage(space: Option<(u64, u64)>) -> Option<f64> {
    match space {
        Some((total, avail)) if total > 0 => {
            Some(total.saturating_sub(avail) as f64 / total as f64)
        }
        _ => None,
    }
}

/// The local hour (0..=23) at `utc_ms`.
fn local_hour(utc_ms: i64) -> u8 {
    let t = (utc_ms / 1000) as libc::time_t;
    // SAFETY: localtime_r writes only into the `tm` we own.
    unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&t, &mut tm).is_null() {
            return ((utc_ms / 3_600_000) % 24) as u8;
        }
        tm.tm_hour as u8
    }
}

/// The cleaner task: a pass every `clean_interval`, or when woken, until the store
/// stops.
pub(crate) async fn run<O: Owner>(owner: Rc<O>) {
    let mut last_check = std::time::Instant::now();
    loop {
        let interval = owner.cleaner().cfg.borrow().0.clean_interval;
        futures_lite::future::or(owner.cleaner().wake.wait(), glommio::timer::sleep(interval))
            .await;
        if !owner.running() {
            return;
        }
        if let Err(e) = pass(&*owner, false).await {
            tracing::error!(error = %e, "retention pass failed; the store keeps serving");
        }
        let every = owner.cleaner().cfg.borrow().0.self_check_interval;
        if !every.is_zero() && last_check.elapsed() >= every && owner.running() {
            last_check = std::time::Instant::now();
            if let Err(e) = self_check(&*owner).await {
                tracing::error!(error = %e, "self-check failed to run");
            }
        }
    }
}

/// The store's self-check under the pass lock (no deletion meanwhile), counted.
pub(crate) async fn self_check<O: Owner>(o: &O) -> Result<crate::store::SelfCheckReport> {
    let c = o.cleaner();
    let _pass = c
        .lock
        .acquire_permit(1)
        .await
        .map_err(|e| Error::Failed(e.to_string()))?;
    let rep = o.check_self().await?;
    let mut st = c.stats.borrow_mut();
    st.self_checks += 1;
    st.self_check_problems += rep.problems.len() as u64;
    Ok(rep)
}

/// One pass (module docs); `manual`: RocketMQ's `executeDeleteFilesManually`.
pub(crate) async fn pass<O: Owner>(o: &O, manual: bool) -> Result<PassReport> {
    let c = o.cleaner();
    let _pass = c
        .lock
        .acquire_permit(1)
        .await
        .map_err(|e| Error::Failed(e.to_string()))?;
    let r = pass_locked(o, manual).await;
    let mut st = c.stats.borrow_mut();
    st.passes += 1;
    match &r {
        Ok(rep) => {
            st.expired_segments += rep.expired_segments as u64;
            st.forced_segments += rep.forced_segments as u64;
            st.queue_files += rep.queue_files as u64;
            st.index_files += rep.index_files as u64;
        }
        Err(_) => st.failed_passes += 1,
    }
    r
}

async fn pass_locked<O: Owner>(o: &O, manual: bool) -> Result<PassReport> {
    let c = o.cleaner();
    let (cfg, hours) = c.cfg.borrow().clone();
    let cfg = &cfg;
    let level_now = || {
        let space = o.disk_space();
        let ratio = usage(space);
        let mut level = Level::of(
            ratio,
            cfg.disk_max_used_space_ratio,
            cfg.disk_clean_forcibly_ratio,
            o.disk_full_ratio(),
        );
        if space.is_some_and(|(total, avail)| total > 0 && avail < o.disk_reserve_bytes()) {
            level = Level::Full;
        }
        (level, ratio)
    };
    let (mut level, ratio) = level_now();
    c.note_level(level, ratio);
    let mut rep = PassReport {
        level: ratio.map(|_| level.name()),
        ..Default::default()
    };
    let log = o.log();
    if level != Level::Normal {
        // Spares hold disk space the puts may need: they go first.
        log.drop_spares().await?;
    }
    let seg_bytes = log.segment_bytes();
    let reserved_ms = cfg.file_reserved_time.as_millis().min(i64::MAX as u128) as i64;
    for i in 0..cfg.delete_file_batch_max {
        if !o.running() {
            break;
        }
        let starts = log.segment_starts();
        let (Some(&oldest), Some(&next)) = (starts.first(), starts.get(1)) else {
            break;
        };
        let limit = o.deletable_below();
        if oldest + seg_bytes > limit {
            break;
        }
        let now = crate::now_ms();
        let expired = match log.first_record_timestamp(next).await? {
            Some(ts) => now.saturating_sub(ts) > reserved_ms,
            None => false,
        };
        let facts = Facts {
            hour: hours.contains(&local_hour(now)),
            level,
            manual,
            forcibly: cfg.clean_file_forcibly,
            expired,
        };
        let decision = policy::decide(facts);
        if decision == Decision::Keep {
            break;
        }
        if log
            .retire_oldest(limit, level != Level::Normal)
            .await?
            .is_none()
        {
            break;
        }
        match decision {
            Decision::DeleteExpired => rep.expired_segments += 1,
            Decision::DeleteForced => rep.forced_segments += 1,
            Decision::Keep => unreachable!(),
        }
        if i + 1 < cfg.delete_file_batch_max && !cfg.delete_interval.is_zero() {
            glommio::timer::sleep(cfg.delete_interval).await;
        }
        // Forcing goes on only while the disk stays over the force level.
        let (l, r) = level_now();
        c.note_level(l, r);
        level = l;
    }
    let log_min = log.min_offset();
    rep.log_min = log_min;
    if log_min > c.cleaned_min.get() {
        rep.queue_files = o.queues().clean_below(log_min).await?;
        if let Some(ix) = o.index() {
            rep.index_files = ix.clean_below(log_min).await?;
        }
        if c.deleted.forget_below(log_min) {
            c.deleted.persist().await?;
        }
        c.cleaned_min.set(log_min);
    }
    if rep.expired_segments + rep.forced_segments > 0 {
        tracing::info!(?rep, "retention pass deleted files");
    }
    Ok(rep)
}
