//! Retention for one queue: RocketMQ's `ConsumeQueue.deleteExpiredFile` and
//! `correctMinOffset`, run by the cleaner (`crate::clean`) after the CommitLog's
//! minimum moved.
//!
//! * A file is deleted when its last entry points below the log's minimum, oldest
//!   first, never the queue's last file (it holds the queue's end: `max_offset` must
//!   survive a restart), one file at a time with its directory synced in between, so
//!   that a crash undoes at most the last removal and the files stay contiguous (a
//!   gap makes the queue "damaged" at load, rebuilt from the log).
//! * `min_offset` then moves to the first entry that points at or past the log's
//!   minimum, found by binary search (entries point at increasing offsets), so a get
//!   below it answers `OffsetTooSmall` with it as the next begin offset.

use super::ConsumeQueue;
use crate::error::Result;

impl ConsumeQueue {
    /// Deletes the files whose entries all point below `log_min` (module docs) and
    /// moves the minimum; returns how many files were deleted.
    pub async fn clean_below(&self, log_min: u64) -> Result<usize> {
        let mut deleted = 0;
        loop {
            let (first, count) = {
                let files = self.files.borrow();
                (files.keys().next().copied(), files.len())
            };
            let Some(first) = first.filter(|_| count >= 2) else {
                break;
            };
            let last_q = first + self.entries_per_file - 1;
            let below = match self.entry(last_q).await? {
                Some(e) => e.is_pre_blank() || (e.phys_offset as u64) < log_min,
                None => false,
            };
            if !below {
                break;
            }
            let next = first + self.entries_per_file;
            if self.min.get() < next {
                self.min.set(next.min(self.max.get()));
            }
            let file = self.files.borrow_mut().remove(&first);
            self.tails.borrow_mut().remove(&first);
            let Some(file) = file else { break };
            let (path, dir) = (file.path.clone(), self.dir.clone());
            drop(file);
            self.disk
                .off_executor(move |d| {
                    d.remove_file(&path)?;
                    d.sync_dir(&dir)
                })
                .await?;
            tracing::debug!(topic = %self.topic, queue = self.queue_id, first_entry = first, "consume-queue file deleted");
            deleted += 1;
        }
        self.correct_min(log_min).await?;
        Ok(deleted)
    }

    /// Moves `min_offset` to the first entry pointing at or past `log_min` (never
    /// back, never past the end).
    pub async fn correct_min(&self, log_min: u64) -> Result<()> {
        let (mut lo, mut hi) = (self.min.get(), self.max.get());
        let first_file = self.files.borrow().keys().next().copied();
        if let Some(f) = first_file {
            lo = lo.max(f);
        }
        // The first q in [lo, hi) whose entry is real and at or past `log_min`.
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let below = match self.entry(mid).await? {
                Some(e) => e.is_pre_blank() || (e.phys_offset as u64) < log_min,
                // Unreadable (a short file): leave the minimum where it is.
                None => return Ok(()),
            };
            if below {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        if lo > self.min.get() {
            self.min.set(lo);
        }
        Ok(())
    }

    /// Removes the queue's directory with every file in it (delete topic), off the
    /// executor; the parent is synced. The queue must be out of its table already.
    pub async fn destroy(&self) -> Result<()> {
        self.files.borrow_mut().clear();
        self.tails.borrow_mut().clear();
        let dir = self.dir.clone();
        self.disk
            .off_executor(move |d| {
                if d.exists(&dir) {
                    d.remove_dir_all(&dir)?;
                }
                // The topic's directory goes with its last queue.
                if let Some(topic_dir) = dir.parent()
                    && d.list_dir(topic_dir)?.is_empty()
                    && d.exists(topic_dir)
                {
                    d.remove_dir_all(topic_dir)?;
                }
                Ok(())
            })
            .await
    }
}
