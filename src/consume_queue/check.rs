//! What the store's self-check (`store/self_check.rs`) reads of a queue: its
//! directory, the files it holds open and its bounds. Reads only.

use super::ConsumeQueue;
use std::path::PathBuf;

/// One queue's layout as this process holds it.
pub struct QueueLayout {
    pub dir: PathBuf,
    /// First queue offset of each file, oldest first.
    pub file_starts: Vec<u64>,
    pub entries_per_file: u64,
    /// Bytes each file must have.
    pub file_bytes: u64,
    pub min: u64,
    pub max: u64,
}

impl ConsumeQueue {
    pub fn layout(&self) -> QueueLayout {
        QueueLayout {
            dir: self.dir.clone(),
            file_starts: self.files.borrow().keys().copied().collect(),
            entries_per_file: self.entries_per_file,
            file_bytes: self.file_bytes,
            min: self.min.get(),
            max: self.max.get(),
        }
    }
}
