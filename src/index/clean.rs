//! Retention for the key index: the index part of RocketMQ's
//! `CleanConsumeQueueService` (`IndexService.deleteExpiredFile`): once the CommitLog's
//! minimum moved, every index file but the last whose newest entry (its header's
//! `endPhyOffset`) names a record below the minimum is deleted, oldest first.
//!
//! Queries need nothing from this to be right: every hit is read back from the
//! CommitLog, and a record below its minimum is not found (`Store::query_by_key`), so
//! a key query never returns a deleted record; deleting the files gives the disk and
//! the query walk back. A query already walking a deleted file keeps it open (`Rc`)
//! until it ends. Files are independent of each other (no gap rule), so a removal a
//! crash undoes only brings back a file whose hits are filtered the same way; each
//! removal is synced before the next.

use super::IndexService;
use crate::error::Result;

impl IndexService {
    /// Deletes the index files (never the last) whose every entry names a record below
    /// `log_min`; returns how many.
    pub async fn clean_below(&self, log_min: u64) -> Result<usize> {
        let mut deleted = 0;
        loop {
            let doomed = {
                let files = self.files.borrow();
                match files.first() {
                    Some(f) if files.len() >= 2 => {
                        let end = f.header.get().end_phy_offset;
                        (end < 0 || (end as u64) < log_min).then(|| f.clone())
                    }
                    _ => None,
                }
            };
            let Some(f) = doomed else { break };
            self.files.borrow_mut().remove(0);
            self.cache.borrow_mut().forget_file(f.id);
            let (path, dir) = (f.file.path.clone(), self.dir.clone());
            drop(f);
            self.disk
                .off_executor(move |d| {
                    d.remove_file(&path)?;
                    d.sync_dir(&dir)
                })
                .await?;
            tracing::debug!(path = %self.dir.display(), "index file deleted");
            deleted += 1;
        }
        Ok(deleted)
    }

    /// How many index files there are.
    pub fn file_count(&self) -> usize {
        self.files.borrow().len()
    }
}
