//! The ConsumeQueues of one shard by topic and queue id: RocketMQ's `consumeQueueTable`
//! (with each queue's next put offset, its `topicQueueTable` entry), and what the store
//! does to all of them at once: load them at open, cut them back to a recovered log,
//! flush them, and the queue manifest that goes with each checkpoint.
//!
//! Only the shard's executor touches the table (`RefCell`, no lock); no borrow of the
//! map is held across an await: the async operations collect their queues first.

use super::ConsumeQueue;
use crate::config::StoreConfig;
use crate::error::{Error, Result};
use crate::format::manifest::QueueManifest;
use crate::wake::join_all;
use ahash::AHashMap;
use std::cell::{Cell, RefCell};
use std::path::{Path, PathBuf};
use std::rc::Rc;

/// Consume-queue loads or flushes in flight at once: each is a short chain of small,
/// dependent I/Os (list, open, read, rewrite the tail page, fdatasync) that waits
/// behind the other shards' recovery reads; one after another they took 0.2-0.6 s of a
/// shard's open in scenario 7 (64 queues over 2 shards).
const QUEUE_IO_IN_FLIGHT: usize = 16;

/// A queue this shard owns: its ConsumeQueue and the next queue offset for puts
/// (RocketMQ's `topicQueueTable` entry).
pub(crate) struct Queue {
    pub cq: Rc<ConsumeQueue>,
    pub next_put: Cell<u64>,
    /// The dispatch pass that last told the store's arrival hook about this queue
    /// (`StoreConfig::on_arrival`: once per queue per pass).
    pub told_in_pass: Cell<u64>,
}

type QueueMap = AHashMap<String, AHashMap<i32, Rc<Queue>>>;

/// What [`QueueTable::cut_to`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Cut {
    /// Queues that reached past the log's end and were cut back to it.
    pub queues: usize,
    /// One of them no longer had the length it was loaded with: it took records from
    /// the scan although every record the log kept lies below what it held.
    pub took_records: bool,
}

/// The shard's queues (see the module docs).
pub(crate) struct QueueTable {
    cfg: Rc<StoreConfig>,
    queues: RefCell<QueueMap>,
}

/// Where the manifest written with each checkpoint lives (`config/` is never read as
/// queues by RocketMQ's loader).
pub(crate) fn manifest_path(root: &Path) -> PathBuf {
    root.join("config").join("cq-manifest")
}

impl QueueTable {
    /// Loads every ConsumeQueue under `cfg.root`, entries cut to `[log_min, log_end)`.
    /// A queue whose files are damaged (a file missing between others) is removed from
    /// disk and left out; the flag says that happened, so the caller rebuilds the
    /// queues from the whole log.
    pub async fn load(cfg: Rc<StoreConfig>, log_min: u64, log_end: u64) -> Result<(Self, bool)> {
        let table = QueueTable {
            cfg,
            queues: RefCell::new(QueueMap::new()),
        };
        let disk = &table.cfg.disk;
        let mut found = Vec::new();
        for t in disk.list_dir(&table.cfg.root.join("consumequeue"))? {
            if !t.is_dir {
                continue;
            }
            for qd in disk.list_dir(&t.path)? {
                let Some(qid) = qd.name.parse::<i32>().ok().filter(|_| qd.is_dir) else {
                    continue;
                };
                found.push((table.new_queue(&t.name, qid), qd.path));
            }
        }
        let mut damaged = false;
        for group in found.chunks(QUEUE_IO_IN_FLIGHT) {
            let loads = group
                .iter()
                .map(|(q, _)| q.cq.load(log_min, log_end))
                .collect();
            for (r, (q, path)) in join_all(loads).await.into_iter().zip(group) {
                match r {
                    Ok(()) => table.insert(q.clone()),
                    Err(e @ Error::Corrupt { .. }) => {
                        tracing::warn!(error = %e, "discarding a damaged consume queue; it is rebuilt from the log");
                        disk.remove_dir_all(path)?;
                        damaged = true;
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        Ok((table, damaged))
    }

    /// An empty queue handle for `(topic, queue_id)`, not in the table.
    fn new_queue(&self, topic: &str, queue_id: i32) -> Rc<Queue> {
        let cq = ConsumeQueue::new(
            &self.cfg.root,
            topic,
            queue_id,
            self.cfg.consume_queue_entries_per_file,
            self.cfg.disk.clone(),
        );
        Rc::new(Queue {
            cq: Rc::new(cq),
            next_put: Cell::new(0),
            told_in_pass: Cell::new(0),
        })
    }

    fn insert(&self, q: Rc<Queue>) {
        self.queues
            .borrow_mut()
            .entry(q.cq.topic.clone())
            .or_default()
            .insert(q.cq.queue_id, q);
    }

    pub fn find(&self, topic: &str, queue_id: i32) -> Option<Rc<Queue>> {
        self.queues.borrow().get(topic)?.get(&queue_id).cloned()
    }

    /// The queue, created (empty, in memory) on first use.
    pub fn get_or_create(&self, topic: &str, queue_id: i32) -> Rc<Queue> {
        if let Some(q) = self.find(topic, queue_id) {
            return q;
        }
        let q = self.new_queue(topic, queue_id);
        self.insert(q.clone());
        q
    }

    pub(crate) fn all(&self) -> Vec<Rc<Queue>> {
        self.queues
            .borrow()
            .values()
            .flat_map(|m| m.values().cloned())
            .collect()
    }

    /// How many queues the table holds.
    pub fn count(&self) -> usize {
        self.queues.borrow().values().map(|m| m.len()).sum()
    }

    /// Every (topic, queue id), sorted.
    pub fn keys(&self) -> Vec<(String, i32)> {
        let mut v: Vec<(String, i32)> = self
            .queues
            .borrow()
            .iter()
            .flat_map(|(t, qs)| qs.keys().map(move |q| (t.clone(), *q)))
            .collect();
        v.sort();
        v
    }

    /// Every queue's length now, by (topic, queue id).
    pub fn lengths(&self) -> AHashMap<(String, i32), u64> {
        self.queues
            .borrow()
            .iter()
            .flat_map(|(t, m)| {
                m.iter()
                    .map(move |(q, v)| ((t.clone(), *q), v.cq.max_offset()))
            })
            .collect()
    }

    /// Puts continue every queue at its end (after recovery).
    pub fn put_at_ends(&self) {
        for q in self.all() {
            q.next_put.set(q.cq.max_offset());
        }
    }

    /// Loads again, cut to `log_end`, every queue whose entries reach past it (the log
    /// lost a tail they had taken). `loaded` holds the lengths the queues had before
    /// the scan, to tell whether one took records all the same.
    pub async fn cut_to(
        &self,
        log_min: u64,
        log_end: u64,
        loaded: &AHashMap<(String, i32), u64>,
    ) -> Result<Cut> {
        let ahead: Vec<Rc<Queue>> = self
            .all()
            .into_iter()
            .filter(|q| q.cq.max_phys_end() > log_end)
            .collect();
        let mut cut = Cut {
            queues: ahead.len(),
            took_records: false,
        };
        for q in ahead {
            let (topic, qid) = (&q.cq.topic, q.cq.queue_id);
            if loaded.get(&(topic.clone(), qid)) != Some(&q.cq.max_offset()) {
                cut.took_records = true;
            }
            let fresh = self.new_queue(topic, qid);
            fresh.cq.load(log_min, log_end).await?;
            tracing::warn!(
                topic,
                queue = qid,
                from = q.cq.max_offset(),
                to = fresh.cq.max_offset(),
                "consume queue cut back to the recovered log"
            );
            self.insert(fresh);
        }
        Ok(cut)
    }

    /// Retention after the log's minimum moved to `log_min` (`clean.rs`): every
    /// queue's files wholly below it deleted and its minimum moved. Returns the files
    /// deleted. Yields between queues (a shard may hold thousands).
    pub async fn clean_below(&self, log_min: u64) -> Result<usize> {
        let mut deleted = 0;
        for q in self.all() {
            deleted += q.cq.clean_below(log_min).await?;
            glommio::yield_if_needed().await;
        }
        Ok(deleted)
    }

    /// Takes every queue of `topic` out of the table (delete topic); the caller
    /// destroys their files.
    pub fn remove_topic(&self, topic: &str) -> Vec<Rc<Queue>> {
        self.queues
            .borrow_mut()
            .remove(topic)
            .map(|m| m.into_values().collect())
            .unwrap_or_default()
    }

    /// At open: takes out and removes the files of every queue of a deleted topic that
    /// holds nothing at or past the offset it was deleted at (`deleted_below`), i.e.
    /// what a crash left of a topic deletion. Returns how many of them held entries.
    pub async fn drop_deleted(&self, deleted_below: impl Fn(&str) -> Option<u64>) -> Result<usize> {
        let doomed: Vec<Rc<Queue>> = self
            .all()
            .into_iter()
            .filter(|q| deleted_below(&q.cq.topic).is_some_and(|b| q.cq.max_phys_end() <= b))
            .collect();
        let mut held = 0;
        for q in doomed {
            if let Some(m) = self.queues.borrow_mut().get_mut(&q.cq.topic) {
                m.remove(&q.cq.queue_id);
            }
            self.queues.borrow_mut().retain(|_, m| !m.is_empty());
            held += (q.cq.max_offset() > 0) as usize;
            tracing::warn!(topic = %q.cq.topic, queue = q.cq.queue_id, "removing a queue of a deleted topic");
            q.cq.destroy().await?;
        }
        Ok(held)
    }

    /// The queues of `topic` in the table.
    pub fn find_topic(&self, topic: &str) -> Vec<Rc<Queue>> {
        self.queues
            .borrow()
            .get(topic)
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Every topic the table holds.
    pub fn topics(&self) -> Vec<String> {
        let mut t: Vec<String> = self.queues.borrow().keys().cloned().collect();
        t.sort();
        t
    }

    /// Writes every queue's tail and fdatasyncs it, several queues at once.
    pub async fn flush(&self) -> Result<()> {
        let dirty: Vec<Rc<Queue>> = self.all().into_iter().filter(|q| q.cq.is_dirty()).collect();
        for group in dirty.chunks(QUEUE_IO_IN_FLIGHT) {
            let flushes = group.iter().map(|q| q.cq.flush()).collect();
            for r in join_all(flushes).await {
                r?;
            }
        }
        Ok(())
    }

    /// Every queue holding entries and its length, taken when dispatch had reached
    /// `dispatch_safe` (call with no await since reading it).
    pub fn manifest(&self, dispatch_safe: u64) -> QueueManifest {
        let mut queues: Vec<(String, i32, u64)> = self
            .lengths()
            .into_iter()
            .filter(|(_, max)| *max > 0)
            .map(|((t, q), max)| (t, q, max))
            .collect();
        queues.sort();
        QueueManifest {
            dispatch_safe,
            queues,
        }
    }

    /// Whether a queue holds fewer entries than the manifest written with the
    /// checkpoint (whose dispatch point is `dispatch_safe`) says it had: a lost or
    /// damaged queue file. Only meaningful while the queues are not cut below the
    /// manifest's dispatch point (`log_end` at or past it).
    pub fn shorter_than_manifest(
        &self,
        dispatch_safe: u64,
        log_end: u64,
        deleted: impl Fn(&str) -> bool,
    ) -> bool {
        let path = manifest_path(&self.cfg.root);
        let Ok(Some(bytes)) = self.cfg.disk.read_file(&path) else {
            return false;
        };
        let Ok(m) = QueueManifest::decode(&bytes) else {
            tracing::warn!(path = %path.display(), "queue manifest unreadable; not used");
            return false;
        };
        if m.dispatch_safe != dispatch_safe || log_end < m.dispatch_safe {
            return false;
        }
        m.queues.iter().filter(|(t, _, _)| !deleted(t)).any(|(t, q, max)| {
            let have = self.find(t, *q).map_or(0, |x| x.cq.max_offset());
            if have < *max {
                tracing::warn!(topic = %t, queue = q, have, expected = max, "consume queue lost entries");
            }
            have < *max
        })
    }
}
