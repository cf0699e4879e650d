//! Retiring the oldest segment: RocketMQ's `MappedFileQueue.deleteExpiredFileByTime`
//! and `MappedFile.destroy`, one segment at a time. Which segment and when is the
//! cleaner's policy (`crate::clean`); this is the mechanism.
//!
//! Steps, in this order, each for a reason:
//! 1. `min_offset` moves past the segment: from here every read below it answers
//!    "removed" (a `get` says `OffsetTooSmall`, a look-up by offset finds nothing)
//!    instead of reaching for the file.
//! 2. The segment leaves the map, and the group-commit thread drops its descriptor:
//!    the last `Rc<File>` is then held only by reads already in flight, which finish
//!    on the open file (an unlinked file stays readable while open), and its blocks are
//!    freed when the last one ends.
//! 3. The file is unlinked (or moved to `spare/` for reuse, `spare.rs`), then its
//!    directory synced, off the executor. One segment
//!    at a time with the sync in between: after a crash at most the last removal is
//!    undone, so the segments stay contiguous (a removal lost behind a later one would
//!    leave a gap, which open refuses).
//!
//! A failed removal (the file may or may not still be there) retires nothing more in
//! this run: a later retirement that succeeded would leave the failed one as a gap
//! after a restart.

use super::CommitLog;
use crate::error::{Error, Result};
use crate::format::be_i64;
use crate::format::record;

/// Bytes read from a segment's start to find its first record's store timestamp
/// (the header fields before the topic: at most 64 bytes with IPv6 hosts).
const HEAD: usize = 128;

impl CommitLog {
    /// The start offsets of the segments, oldest first.
    pub fn segment_starts(&self) -> Vec<u64> {
        self.segments.borrow().keys().copied().collect()
    }

    /// Store timestamp of the record at the start of the segment starting at `start`,
    /// `None` when no record has been written there yet (or `start` is not a segment
    /// of the log). The first record of the next segment bounds a segment's newest
    /// record from above: store timestamps never go back in log order.
    pub async fn first_record_timestamp(&self, start: u64) -> Result<Option<i64>> {
        if start < self.min_offset() || start + HEAD as u64 > self.written() {
            return Ok(None);
        }
        let head = self.read(start, HEAD).await?;
        let Ok((size, magic)) = record::peek_header(&head) else {
            return Ok(None);
        };
        if (magic != record::MAGIC_V1 && magic != record::MAGIC_V2) || size <= 0 {
            return Ok(None);
        }
        let sys_flag = crate::format::be_i32(&head, record::SYSFLAG_AT).unwrap_or(0);
        let born_v6 = sys_flag & record::SYSFLAG_BORNHOST_V6 != 0;
        let at = record::BORN_HOST_AT + if born_v6 { 20 } else { 8 };
        Ok(be_i64(&head, at))
    }

    /// Retires the oldest segment (module docs) when it ends at or below `limit`; the
    /// segment holding `written` is never retired, whatever `limit` says. Returns the
    /// retired segment's start, or `None` when nothing qualified.
    /// Kept as a spare for reuse (`spare.rs`) when recycling is on, fewer spares than
    /// allowed exist and not `space_pressure`; deleted otherwise.
    pub async fn retire_oldest(&self, limit: u64, space_pressure: bool) -> Result<Option<u64>> {
        if let Some(why) = self.retire_failed.borrow().clone() {
            return Err(Error::Failed(why));
        }
        let Some(seg) = self.segments.borrow().keys().next().copied() else {
            return Ok(None);
        };
        let end = seg + self.seg_bytes;
        if end > limit || end > self.segment_start(self.written()) {
            return Ok(None);
        }
        debug_assert_eq!(seg, self.min_offset(), "segments are contiguous from min");
        self.min_offset.set(end);
        let file = self
            .segments
            .borrow_mut()
            .remove(&seg)
            .expect("the first segment");
        if let Some(gc) = &*self.group_commit.borrow() {
            gc.remove_segments_below(end);
        }
        let path = file.path.clone();
        drop(file);
        let dir = self.dir.clone();
        let spare = self.keeps_spare(space_pressure);
        let removed = if spare {
            self.retire_to_spare(seg, path).await
        } else {
            self.cfg
                .disk
                .off_executor(move |d| {
                    d.remove_file(&path)?;
                    d.sync_dir(&dir)
                })
                .await
        };
        if let Err(e) = removed {
            let why = format!(
                "retiring segment {seg} failed: {e}; no more segments are retired until reopened"
            );
            tracing::error!(segment = seg, error = %e, "{why}");
            *self.retire_failed.borrow_mut() = Some(why);
            return Err(e);
        }
        tracing::info!(
            segment = seg,
            min_offset = end,
            kept_as_spare = spare,
            "commit-log segment deleted"
        );
        Ok(Some(seg))
    }
}
