//! The topics deleted from a shard (RocketMQ's `DefaultMessageStore.deleteTopics` and
//! `cleanUnusedTopic` destroy the queues and leave the records to age out of the
//! CommitLog). Kept in `config/deleted-topics` (format in
//! [`crate::format::deleted_topics`]) with the commit-log offset each was deleted at,
//! because the records stay: a record of a deleted topic below that offset gets no
//! queue entry again when the queues are rebuilt from the log (dispatch asks
//! [`DeletedTopicSet::is_deleted`] before it places an entry), and key queries skip it
//! (the index entries go lazily, with their files). An entry is dropped once the log's
//! minimum passed its offset: every record it hides is gone.
//!
//! The file is replaced atomically (write, sync, rename, directory sync) off the
//! executor, before the topic's queue files are removed.

use crate::error::Result;
use crate::format::deleted_topics::DeletedTopics;
use crate::io::Disk;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The deleted topics of one shard, as loaded and changed.
pub struct DeletedTopicSet {
    path: PathBuf,
    disk: Disk,
    /// Topic -> commit-log offset below which its records are deleted.
    map: RefCell<BTreeMap<String, u64>>,
}

impl DeletedTopicSet {
    /// Where the set lives under a shard's root.
    pub fn path(root: &Path) -> PathBuf {
        root.join("config").join("deleted-topics")
    }

    /// Loads the set (empty when the file does not exist). A damaged file is an
    /// error: without it, records of deleted topics would come back.
    pub fn load(disk: &Disk, root: &Path) -> Result<DeletedTopicSet> {
        let path = Self::path(root);
        let mut map = BTreeMap::new();
        if let Some(bytes) = disk.read_file(&path)? {
            let d = DeletedTopics::decode(&bytes).map_err(|kind| crate::error::Error::Corrupt {
                path: path.clone(),
                offset: 0,
                kind,
                detail: Some("the deleted-topics file is damaged".into()),
            })?;
            map.extend(d.topics);
        }
        Ok(DeletedTopicSet {
            path,
            disk: disk.clone(),
            map: RefCell::new(map),
        })
    }

    /// Whether the record of `topic` at commit-log offset `phys` belongs to a deleted
    /// topic. Costs one branch when nothing was deleted.
    pub fn is_deleted(&self, topic: &str, phys: u64) -> bool {
        let map = self.map.borrow();
        !map.is_empty() && map.get(topic).is_some_and(|below| phys < *below)
    }

    /// The offset below which `topic`'s records are deleted, if it was.
    pub fn deleted_below(&self, topic: &str) -> Option<u64> {
        self.map.borrow().get(topic).copied()
    }

    pub fn is_empty(&self) -> bool {
        self.map.borrow().is_empty()
    }

    /// Every entry (topic, offset).
    pub fn entries(&self) -> Vec<(String, u64)> {
        self.map
            .borrow()
            .iter()
            .map(|(t, b)| (t.clone(), *b))
            .collect()
    }

    /// Records `topic` deleted below `below` in memory at once (dispatch skips its
    /// records from now on); [`DeletedTopicSet::persist`] makes it durable.
    pub fn insert(&self, topic: &str, below: u64) {
        let mut map = self.map.borrow_mut();
        let e = map.entry(topic.to_string()).or_insert(below);
        *e = (*e).max(below);
    }

    /// Drops the entries every record of which lies below `log_min`; returns whether
    /// any went (the caller persists).
    pub fn forget_below(&self, log_min: u64) -> bool {
        let mut map = self.map.borrow_mut();
        let before = map.len();
        map.retain(|_, below| *below > log_min);
        map.len() != before
    }

    /// Writes the set (atomically, durably), off the executor.
    pub async fn persist(&self) -> Result<()> {
        let bytes = DeletedTopics {
            topics: self.entries(),
        }
        .encode();
        let path = self.path.clone();
        self.disk
            .off_executor(move |d| {
                if let Some(dir) = path.parent() {
                    d.create_dir_all(dir)?;
                }
                d.replace_file(&path, &bytes)
            })
            .await
    }
}
