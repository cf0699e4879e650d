//! The flush mark (`<shard>/flushmark`, format in `format::flush_mark`): how far the
//! log is durable, recorded as flushes happen, so that recovery's refuse line is where
//! the log really was durable and not where the last checkpoint (up to a second
//! earlier) said it was (`recovery`'s module docs). No RocketMQ counterpart: RocketMQ
//! truncates at the first bad record and needs no line.
//!
//! When it is written:
//! * **async flush**: in every flush round, after the segments' fdatasync and before
//!   `flushed` moves, so whatever a returned `Store::flush` covered is below a durable
//!   mark: the line is exact;
//! * **sync flush**: by its own task ([`CommitLog::run_flush_mark`]) once `flushed`
//!   moved, at most every `flush_mark_interval` (100 ms), never on the put path: the
//!   rounds are durable by themselves, and a mark write per round would double the
//!   device's durable writes per round. 100 ms, not 1: a mark write is a durable write
//!   of its own (a device cache flush, and the mark file's inode whenever its mtime
//!   moved), and every 1 ms that was ~700 writes and ~250 inode writes a second beside
//!   ~3,400 rounds of one put at a time, each round's device time up from ~90 to
//!   ~115 us at p50 (block trace, `scripts/bench.sh` scenario 3b). The mark lags the
//!   acknowledged position by about that interval (README "Recovery" states what that
//!   window means);
//! * **recovery**: at the end it keeps, once that is synced (before the checkpoint);
//! * **clean shutdown**: the async writer's last flush, or the mark task's last write,
//!   leaves it at the log's end (the checkpoint is written after it, at the same end).
//!
//! Invariants: the mark never claims more than is durable (written only after what it
//! names was made durable); writes never overlap (one writer at a time: recovery
//! before the tasks start, then the flush round in async mode or the mark task in sync
//! mode); a write never overwrites the newest valid slot (it takes the next sequence,
//! which goes to the other slot); the file is created (its first slot written durably,
//! then its directory synced) only after recovery judged the log, so a refused open
//! changes nothing.

use super::CommitLog;
use crate::error::Result;
use crate::format::flush_mark::{FlushMark, SLOT_LEN};
use crate::io::{AlignedBuf, Disk, File};
use std::cell::{Cell, RefCell};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, Instant};

/// The mark file of one log.
pub(super) struct FlushMarkFile {
    path: PathBuf,
    /// Open once the first write created it (or found it).
    file: RefCell<Option<Rc<File>>>,
    /// What open found: the durable offset of the newest valid slot.
    found: Option<u64>,
    /// Sequence of the next write.
    next_sequence: Cell<u64>,
    /// The offset the last completed write recorded (or `found`).
    recorded: Cell<u64>,
    last_write: Cell<Option<Instant>>,
    /// The slot buffer, reused.
    buf: RefCell<Option<AlignedBuf>>,
}

impl FlushMarkFile {
    /// Reads the mark of the shard at `root` (nothing is created or written). A
    /// damaged file (no valid slot) counts as no mark, with a warning: recovery then
    /// judges by the checkpoint alone, the rules for a store that never had one.
    pub(super) fn read(disk: &Disk, root: &Path) -> Result<FlushMarkFile> {
        let path = root.join("flushmark");
        let latest = match disk.read_file(&path)? {
            None => None,
            Some(bytes) => match FlushMark::latest(&bytes) {
                Ok(m) => m,
                Err(kind) => {
                    tracing::warn!(
                        path = %path.display(), %kind,
                        "flush mark damaged; recovery judges the log by the checkpoint alone"
                    );
                    None
                }
            },
        };
        Ok(FlushMarkFile {
            path,
            file: RefCell::new(None),
            found: latest.map(|m| m.flushed),
            next_sequence: Cell::new(latest.map_or(1, |m| m.sequence + 1)),
            recorded: Cell::new(latest.map_or(0, |m| m.flushed)),
            last_write: Cell::new(None),
            buf: RefCell::new(None),
        })
    }

    /// The durable offset the mark held when the log was opened.
    pub(super) fn found(&self) -> Option<u64> {
        self.found
    }

    /// The offset the last write recorded.
    pub(super) fn recorded(&self) -> u64 {
        self.recorded.get()
    }

    /// How long ago the last write completed (`None`: none yet in this run).
    fn since_last_write(&self) -> Option<Duration> {
        self.last_write.get().map(|t| t.elapsed())
    }

    /// Records `flushed` (every log byte below it is durable now) in the next slot,
    /// durably: one direct-I/O page written with `RWF_DSYNC` (write + fdatasync on the
    /// simulated disk). The first write of a new file also syncs its directory before
    /// it returns (what it records may be relied on at once).
    pub(super) async fn write(&self, disk: &Disk, flushed: u64) -> Result<()> {
        let (file, created) = self.file(disk).await?;
        let sequence = self.next_sequence.get();
        let mut buf = self
            .buf
            .borrow_mut()
            .take()
            .unwrap_or_else(|| AlignedBuf::new(SLOT_LEN));
        buf.set_len(SLOT_LEN);
        buf.as_mut_slice()
            .copy_from_slice(&FlushMark { sequence, flushed }.encode());
        let buf = file
            .write_durable(FlushMark::slot_offset(sequence), buf)
            .await?;
        *self.buf.borrow_mut() = Some(buf);
        if created {
            disk.sync_dir(self.path.parent().unwrap_or(Path::new(".")))?;
        }
        self.next_sequence.set(sequence + 1);
        self.recorded.set(flushed);
        self.last_write.set(Some(Instant::now()));
        Ok(())
    }

    /// The open file, and whether it was created just now (it grows to its two
    /// slots as they are written; the write that creates it syncs its name).
    async fn file(&self, disk: &Disk) -> Result<(Rc<File>, bool)> {
        if let Some(f) = &*self.file.borrow() {
            return Ok((f.clone(), false));
        }
        let created = !disk.exists(&self.path);
        let f = disk.open(&self.path, created).await?;
        *self.file.borrow_mut() = Some(f.clone());
        Ok((f, created))
    }

    /// Whether the mark already says `flushed` (as found at open, or last written).
    pub(super) fn says(&self, flushed: u64) -> bool {
        (self.found.is_some() || self.last_write.get().is_some()) && self.recorded() == flushed
    }
}

impl CommitLog {
    /// The durable offset the flush mark held when the log was opened (`None`: no
    /// mark, or a damaged one).
    pub fn flush_mark(&self) -> Option<u64> {
        self.mark.found()
    }

    /// Records that the log is durable below `flushed` (see the module docs for who
    /// calls this when).
    pub(super) async fn write_flush_mark(&self, flushed: u64) -> Result<()> {
        self.mark.write(&self.cfg.disk, flushed).await
    }

    /// Sync flush's mark task (module docs): follows `flushed`, writing the mark when
    /// it moved, at most every `flush_mark_interval`, until the writer ended (then
    /// once more, so a clean stop leaves the mark at the end) or the log failed. A
    /// failed write stops the log taking writes (`mark_failed`, taken by the writer).
    pub(super) async fn run_flush_mark(self: Rc<Self>) {
        let interval = self.cfg.flush_mark_interval;
        loop {
            if self.flushed.is_closed() {
                return;
            }
            let flushed = self.flushed.get();
            if flushed > self.mark.recorded() {
                if let Some(wait) = self
                    .mark
                    .since_last_write()
                    .and_then(|since| interval.checked_sub(since))
                    .filter(|w| !w.is_zero() && !self.writer_done.get())
                {
                    glommio::timer::sleep(wait).await;
                    continue;
                }
                // Whatever moved meanwhile: the newest durable position.
                if let Err(e) = self.write_flush_mark(self.flushed.get()).await {
                    tracing::error!(error = %e, "flush mark write failed; the shard stops taking writes");
                    *self.mark_failed.borrow_mut() = Some(e);
                    self.writer_wake.notify();
                    return;
                }
                continue;
            }
            if self.writer_done.get() {
                return;
            }
            futures_lite::future::or(
                async {
                    self.flushed.wait_for(flushed + 1).await;
                },
                self.mark_wake.wait(),
            )
            .await;
        }
    }
}
