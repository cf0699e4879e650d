//! What the node keeps beside the store, each the counterpart of a RocketMQ broker
//! manager: [`Topics`] (`TopicConfigManager`, `config/topics.json`), [`Offsets`]
//! (`ConsumerOffsetManager`, `config/consumerOffset.json`), [`Clients`]
//! (`ConsumerManager`: the members of each consumer group) and [`Arrivals`] (the
//! arrival notices `NotifyMessageArrivingListener` gives the pull hold service).
//!
//! All of it is small and shared by every connection behind a mutex each; no lock is
//! held across an `.await` or a file write. Both JSON files are written whole
//! (temporary file, rename, directory sync), so a crash leaves the old or the new one.

use crate::error::{Error, Result};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Locks, taking the data even if a thread panicked while holding it (every value
/// here stays consistent between statements).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Writes `value` as JSON to `path` atomically and durably (temporary file, rename,
/// directory sync).
pub(crate) fn write_json(path: &Path, value: &Value) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    crate::io::Disk::Real.create_dir_all(dir)?;
    let text = serde_json::to_vec_pretty(value).unwrap_or_default();
    crate::io::Disk::Real.replace_file(path, &text)
}

pub(crate) fn read_json(path: &Path) -> Result<Option<Value>> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| Error::Config(format!("{}: {e}", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io("read", path, 0, e)),
    }
}

/// RocketMQ's topic permission bits.
pub const PERM_READ: i32 = 4;
pub const PERM_WRITE: i32 = 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopicConf {
    pub read_queue_nums: i32,
    pub write_queue_nums: i32,
    pub perm: i32,
}

/// Queue counts of a `topics.json` entry that names none (RocketMQ's
/// `TopicConfig.defaultReadQueueNums` / `defaultWriteQueueNums`).
pub const ROCKETMQ_DEFAULT_QUEUE_NUMS: i32 = 16;

/// Topics and their queue counts, persisted as `config/topics.json`
/// (RocketMQ's `topicConfigTable` shape).
///
/// An entry is read as RocketMQ's `TopicConfig` reads it: a missing field keeps
/// RocketMQ's default (16 read and 16 write queues, perm read|write), so a RocketMQ
/// broker's file means the same here. Queue counts may be 0 (RocketMQ drains a topic by
/// setting `writeQueueNums` 0; sends to it are refused). A count that is not a whole
/// number within 0..=`i32::MAX`, or an entry that is not an object, refuses the load
/// with an error naming the file, topic and field.
///
/// Every send reads its topic's entry: each thread reads a copy of its own
/// ([`TOPIC_COPIES`]) while `version`, bumped by every change, stays where it was, so the
/// shards do not take one lock (and move its cache line between their CPUs) per send.
pub struct Topics {
    path: PathBuf,
    table: Mutex<BTreeMap<String, TopicConf>>,
    /// Moves after every change of `table`, inside its lock.
    version: AtomicU64,
    /// Which table a thread's copies are of (tests run several nodes in one process).
    id: u64,
}

/// This thread's copies of topic entries: the table they came from, its version then,
/// and the entries read since.
struct TopicCopies {
    id: u64,
    version: u64,
    entries: ahash::AHashMap<String, TopicConf>,
}

thread_local! {
    static TOPIC_COPIES: std::cell::RefCell<TopicCopies> =
        std::cell::RefCell::new(TopicCopies {
            id: 0,
            version: 0,
            entries: ahash::AHashMap::new(),
        });
}

/// Ids of [`Topics`] tables, from 1 (0: no table).
static NEXT_TOPICS_ID: AtomicU64 = AtomicU64::new(1);

impl Topics {
    pub fn load(config_dir: &Path) -> Result<Topics> {
        let path = config_dir.join("topics.json");
        let mut table = BTreeMap::new();
        if let Some(v) = read_json(&path)?
            && let Some(t) = v.get("topicConfigTable").and_then(Value::as_object)
        {
            {
                for (name, c) in t {
                    table.insert(name.clone(), topic_entry(&path, name, c)?);
                }
            }
        }
        Ok(Topics {
            path,
            table: Mutex::new(table),
            version: AtomicU64::new(0),
            id: NEXT_TOPICS_ID.fetch_add(1, Ordering::Relaxed),
        })
    }

    pub fn get(&self, topic: &str) -> Option<TopicConf> {
        // Read before the table: a change after this moves the version past it, so a
        // copy taken now is dropped at the next read.
        let version = self.version.load(Ordering::Acquire);
        TOPIC_COPIES.with(|c| {
            let mut c = c.borrow_mut();
            if c.id != self.id || c.version != version {
                c.id = self.id;
                c.version = version;
                c.entries.clear();
            }
            if let Some(conf) = c.entries.get(topic) {
                return Some(*conf);
            }
            let conf = lock(&self.table).get(topic).copied();
            if let Some(conf) = conf {
                c.entries.insert(topic.to_string(), conf);
            }
            conf
        })
    }

    /// Marks the table changed (inside its lock, after the change).
    fn changed(&self) {
        self.version.fetch_add(1, Ordering::Release);
    }

    /// Creates or replaces a topic's settings and persists the table.
    pub fn put(&self, topic: &str, conf: TopicConf) -> Result<()> {
        let snapshot = {
            let mut t = lock(&self.table);
            t.insert(topic.to_string(), conf);
            self.changed();
            self.to_json(&t)
        };
        write_json(&self.path, &snapshot)
    }

    /// Removes a topic's settings (delete topic) and persists the table; whether it
    /// was there.
    pub fn remove(&self, topic: &str) -> Result<bool> {
        let snapshot = {
            let mut t = lock(&self.table);
            if t.remove(topic).is_none() {
                return Ok(false);
            }
            self.changed();
            self.to_json(&t)
        };
        write_json(&self.path, &snapshot)?;
        Ok(true)
    }

    /// Every topic and its settings.
    pub fn snapshot(&self) -> Vec<(String, TopicConf)> {
        lock(&self.table)
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect()
    }

    /// Replaces the whole table (a slave copying its master's) and persists it when it
    /// changed.
    pub fn replace_all(&self, table: BTreeMap<String, TopicConf>) -> Result<()> {
        let snapshot = {
            let mut t = lock(&self.table);
            if *t == table {
                return Ok(());
            }
            *t = table;
            self.changed();
            self.to_json(&t)
        };
        write_json(&self.path, &snapshot)
    }

    fn to_json(&self, t: &BTreeMap<String, TopicConf>) -> Value {
        let table: serde_json::Map<String, Value> = t
            .iter()
            .map(|(name, c)| {
                (
                    name.clone(),
                    json!({"topicName": name, "readQueueNums": c.read_queue_nums,
                           "writeQueueNums": c.write_queue_nums, "perm": c.perm}),
                )
            })
            .collect();
        json!({ "topicConfigTable": table })
    }
}

/// One `topicConfigTable` entry, read as RocketMQ's `TopicConfig` (see [`Topics`]).
fn topic_entry(path: &Path, name: &str, entry: &Value) -> Result<TopicConf> {
    let bad = |why: String| Error::Config(format!("{}: topic {name:?}: {why}", path.display()));
    if !entry.is_object() {
        return Err(bad(format!("the entry is not an object: {entry}")));
    }
    let field = |key: &str, default: i32, min: i64| match entry.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => v
            .as_i64()
            .filter(|n| (min..=i32::MAX as i64).contains(n))
            .map(|n| n as i32)
            .ok_or_else(|| {
                bad(format!(
                    "{key} must be a whole number within {min}..={}, not {v}",
                    i32::MAX
                ))
            }),
    };
    Ok(TopicConf {
        read_queue_nums: field("readQueueNums", ROCKETMQ_DEFAULT_QUEUE_NUMS, 0)?,
        write_queue_nums: field("writeQueueNums", ROCKETMQ_DEFAULT_QUEUE_NUMS, 0)?,
        perm: field("perm", PERM_READ | PERM_WRITE, i32::MIN as i64)?,
    })
}

/// Consumer offsets by `topic@group` and queue, persisted as
/// `config/consumerOffset.json` (RocketMQ's `offsetTable` shape).
pub struct Offsets {
    path: PathBuf,
    table: Mutex<BTreeMap<String, BTreeMap<i32, u64>>>,
    dirty: AtomicBool,
}

impl Offsets {
    pub fn load(config_dir: &Path) -> Result<Offsets> {
        let path = config_dir.join("consumerOffset.json");
        let mut table = BTreeMap::new();
        if let Some(v) = read_json(&path)?
            && let Some(t) = v.get("offsetTable").and_then(Value::as_object)
        {
            {
                for (key, queues) in t {
                    let mut m = BTreeMap::new();
                    for (q, o) in queues.as_object().into_iter().flatten() {
                        if let (Ok(q), Some(o)) = (q.parse::<i32>(), o.as_u64()) {
                            m.insert(q, o);
                        }
                    }
                    table.insert(key.clone(), m);
                }
            }
        }
        Ok(Offsets {
            path,
            table: Mutex::new(table),
            dirty: AtomicBool::new(false),
        })
    }

    fn key(topic: &str, group: &str) -> String {
        format!("{topic}@{group}")
    }

    pub fn get(&self, group: &str, topic: &str, queue_id: i32) -> Option<u64> {
        lock(&self.table)
            .get(&Self::key(topic, group))
            .and_then(|m| m.get(&queue_id).copied())
    }

    pub fn set(&self, group: &str, topic: &str, queue_id: i32, offset: u64) {
        lock(&self.table)
            .entry(Self::key(topic, group))
            .or_default()
            .insert(queue_id, offset);
        self.dirty.store(true, Ordering::SeqCst);
    }

    /// Forgets every group's offsets of `topic` (delete topic); written at the next
    /// persist.
    pub fn remove_topic(&self, topic: &str) {
        let prefix = format!("{topic}@");
        let mut t = lock(&self.table);
        let before = t.len();
        t.retain(|k, _| !k.starts_with(&prefix));
        if t.len() != before {
            self.dirty.store(true, Ordering::SeqCst);
        }
    }

    /// Forgets a group's offsets of every topic (delete subscription group with
    /// `cleanOffset`); written at the next persist.
    pub fn remove_group(&self, group: &str) {
        let suffix = format!("@{group}");
        let mut t = lock(&self.table);
        let before = t.len();
        t.retain(|k, _| !k.ends_with(&suffix));
        if t.len() != before {
            self.dirty.store(true, Ordering::SeqCst);
        }
    }

    /// Every offset: `topic@group` -> queue -> offset.
    pub fn snapshot(&self) -> BTreeMap<String, BTreeMap<i32, u64>> {
        lock(&self.table).clone()
    }

    /// Replaces the whole table (a slave copying its master's); written at the next
    /// persist when it changed.
    pub fn replace_all(&self, table: BTreeMap<String, BTreeMap<i32, u64>>) {
        let mut t = lock(&self.table);
        if *t != table {
            *t = table;
            self.dirty.store(true, Ordering::SeqCst);
        }
    }

    /// Writes the table when it changed since the last write.
    pub fn persist(&self) -> Result<()> {
        if !self.dirty.swap(false, Ordering::SeqCst) {
            return Ok(());
        }
        let snapshot = {
            let t = lock(&self.table);
            let table: serde_json::Map<String, Value> = t
                .iter()
                .map(|(k, m)| {
                    let qs: serde_json::Map<String, Value> =
                        m.iter().map(|(q, o)| (q.to_string(), json!(o))).collect();
                    (k.clone(), Value::Object(qs))
                })
                .collect();
            json!({ "offsetTable": table })
        };
        let r = write_json(&self.path, &snapshot);
        if r.is_err() {
            self.dirty.store(true, Ordering::SeqCst);
        }
        r
    }
}

/// A group's members: client id -> (connection id, last heartbeat).
type Members = HashMap<String, (u64, Instant)>;

/// Consumer group members, by the connection that registered them.
#[derive(Default)]
pub struct Clients {
    /// group -> client id -> (connection id, last heartbeat).
    groups: Mutex<HashMap<String, Members>>,
}

/// Each method that changes who is in a group returns the groups whose member set
/// changed, for RocketMQ's consumer-ids-changed notice (`broker2client.rs`).
impl Clients {
    /// Registers `client_id` in `groups` through `conn`; the groups it joined (new
    /// there, or now through another connection).
    pub fn heartbeat(&self, conn: u64, client_id: &str, groups: &[String]) -> Vec<String> {
        let now = Instant::now();
        let mut g = lock(&self.groups);
        let mut joined = Vec::new();
        for group in groups {
            let before = g
                .entry(group.clone())
                .or_default()
                .insert(client_id.to_string(), (conn, now));
            if before.is_none_or(|(c, _)| c != conn) {
                joined.push(group.clone());
            }
        }
        joined
    }

    /// Removes `client_id` from `group`; whether it was there.
    pub fn unregister(&self, client_id: &str, group: &str) -> bool {
        let mut g = lock(&self.groups);
        let Some(m) = g.get_mut(group) else {
            return false;
        };
        let was = m.remove(client_id).is_some();
        if m.is_empty() {
            g.remove(group);
        }
        was
    }

    /// Forgets every client registered through connection `conn`; the groups that
    /// lost a member.
    pub fn connection_closed(&self, conn: u64) -> Vec<String> {
        self.retain(|c, _| c != conn)
    }

    /// Forgets clients silent for longer than `expiry`; the groups that lost a member.
    pub fn expire(&self, expiry: Duration) -> Vec<String> {
        self.retain(|_, seen| seen.elapsed() <= expiry)
    }

    fn retain(&self, keep: impl Fn(u64, Instant) -> bool) -> Vec<String> {
        let mut g = lock(&self.groups);
        let mut changed = Vec::new();
        for (name, m) in g.iter_mut() {
            let before = m.len();
            m.retain(|_, (c, seen)| keep(*c, *seen));
            if m.len() != before {
                changed.push(name.clone());
            }
        }
        g.retain(|_, m| !m.is_empty());
        changed.sort();
        changed
    }

    /// The connections the group's clients registered through, sorted.
    pub fn connections(&self, group: &str) -> Vec<u64> {
        let g = lock(&self.groups);
        let mut conns: Vec<u64> = g
            .get(group)
            .map(|m| m.values().map(|(c, _)| *c).collect())
            .unwrap_or_default();
        conns.sort_unstable();
        conns.dedup();
        conns
    }

    /// The group's client ids, sorted (every member must see the same order).
    pub fn members(&self, group: &str) -> Vec<String> {
        let g = lock(&self.groups);
        let mut ids: Vec<String> = g
            .get(group)
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default();
        ids.sort();
        ids
    }
}

/// Encoded requests the broker sends on its own, waiting per connection.
const OUTBOX_FRAMES: usize = 256;

/// Each open connection's way out for requests the broker starts
/// (CHECK_TRANSACTION_STATE, NOTIFY_CONSUMER_IDS_CHANGED, RESET_CONSUMER_CLIENT_OFFSET;
/// `broker2client.rs`): a bounded channel its front end drains into the
/// connection's writer, so they never interleave with responses.
#[derive(Default)]
pub struct Outboxes {
    boxes: Mutex<HashMap<u64, flume::Sender<Vec<u8>>>>,
}

impl Outboxes {
    /// Opens connection `conn`'s outbox; the front end drains the receiver until
    /// [`Outboxes::close`].
    pub fn open(&self, conn: u64) -> flume::Receiver<Vec<u8>> {
        let (tx, rx) = flume::bounded(OUTBOX_FRAMES);
        lock(&self.boxes).insert(conn, tx);
        rx
    }

    pub fn close(&self, conn: u64) {
        lock(&self.boxes).remove(&conn);
    }

    /// Queues `frame` for connection `conn`.
    pub fn send(&self, conn: u64, frame: Vec<u8>) -> Sent {
        match lock(&self.boxes).get(&conn) {
            None => Sent::Closed,
            Some(tx) => match tx.try_send(frame) {
                Ok(()) => Sent::Queued,
                Err(flume::TrySendError::Full(_)) => Sent::Full,
                Err(flume::TrySendError::Disconnected(_)) => Sent::Closed,
            },
        }
    }
}

/// What became of a frame given to [`Outboxes::send`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sent {
    Queued,
    /// The connection is gone (or was never a socket: `Node::serve_request`).
    Closed,
    /// Its outbox is full: a peer that does not read.
    Full,
}

/// A queue's arrival counter and the held pulls waiting for it to move.
type QueueWaiters = (u64, Vec<flume::Sender<()>>);

/// Arrival counters per queue, and the held pulls waiting on each: a held pull
/// subscribes with the counter it saw and is signalled when it moves.
///
/// Every send counts its arrival, so the counters are found by topic (`&str`) and
/// queue id without building a key: a `(String, i32)` key cost a string allocation and
/// a SipHash per send (1.4% of a node's samples under single sends).
///
/// Kept in one part per shard, each on cache lines of its own, a queue's counter in
/// the part of the shard that owns the queue: a shard's sends to its own queues lock
/// only its part (one lock for all moved its line between the CPUs on every send,
/// docs/performance/node.md). Counting starts when the store is open
/// ([`Arrivals::count_for`]); an arrival before counts nowhere, as no pull can wait yet.
#[derive(Default)]
pub struct Arrivals {
    parts: std::sync::OnceLock<(crate::shard::Ownership, Vec<ArrivalsPart>)>,
}

type ArrivalsMap = ahash::AHashMap<String, ahash::AHashMap<i32, QueueWaiters>>;

/// One shard's arrival counters, alone on their cache lines.
#[repr(align(128))]
#[derive(Default)]
struct ArrivalsPart(Mutex<ArrivalsMap>);

impl Arrivals {
    /// Starts counting, one part per shard of a store of `shards` shards whose queues
    /// `ownership` places (the first call counts; a later one changes nothing).
    pub fn count_for(&self, ownership: crate::shard::Ownership, shards: usize) {
        let parts = (0..shards.max(1))
            .map(|_| ArrivalsPart::default())
            .collect();
        let _ = self.parts.set((ownership, parts));
    }

    /// The part holding `(topic, queue_id)`, locked (`None`: not counting yet).
    fn part(&self, topic: &str, queue_id: i32) -> Option<MutexGuard<'_, ArrivalsMap>> {
        let (ownership, parts) = self.parts.get()?;
        Some(lock(
            &parts[ownership.shard_of(topic, queue_id, parts.len())].0,
        ))
    }

    pub fn seq(&self, topic: &str, queue_id: i32) -> u64 {
        self.part(topic, queue_id)
            .as_ref()
            .and_then(|q| q.get(topic))
            .and_then(|t| t.get(&queue_id))
            .map_or(0, |(seq, _)| *seq)
    }

    /// The queue's entry, made when missing (a string allocation, once per topic).
    fn entry<'m>(queues: &'m mut ArrivalsMap, topic: &str, queue_id: i32) -> &'m mut QueueWaiters {
        if !queues.contains_key(topic) {
            queues.insert(topic.to_string(), Default::default());
        }
        queues
            .get_mut(topic)
            .expect("inserted above")
            .entry(queue_id)
            .or_default()
    }

    /// A receiver signalled at the next arrival, or at once when the counter has
    /// already moved past `seen`.
    pub fn subscribe(&self, topic: &str, queue_id: i32, seen: u64) -> flume::Receiver<()> {
        let (tx, rx) = flume::bounded(1);
        let Some(mut q) = self.part(topic, queue_id) else {
            // Not counting yet: look again at once.
            let _ = tx.try_send(());
            return rx;
        };
        let (seq, waiters) = Self::entry(&mut q, topic, queue_id);
        if *seq != seen {
            let _ = tx.try_send(());
        } else {
            // Waiters that gave up (timed out) are dropped here.
            waiters.retain(|w| !w.is_disconnected());
            waiters.push(tx);
        }
        rx
    }

    /// The queue has new entries (`StoreConfig::on_arrival`): its held pulls wake.
    pub fn arrived(&self, topic: &str, queue_id: i32) {
        let Some(mut q) = self.part(topic, queue_id) else {
            return;
        };
        let (seq, waiters) = Self::entry(&mut q, topic, queue_id);
        *seq += 1;
        for w in waiters.drain(..) {
            let _ = w.try_send(());
        }
    }

    /// Signals every waiter (shutdown).
    pub fn wake_all(&self) {
        let Some((_, parts)) = self.parts.get() else {
            return;
        };
        for part in parts {
            for (_, waiters) in lock(&part.0).values_mut().flat_map(|t| t.values_mut()) {
                for w in waiters.drain(..) {
                    let _ = w.try_send(());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counters per topic and queue; a held pull is signalled by the next arrival in its
    /// own queue only, or at once when it saw an older counter; shutdown signals all.
    #[test]
    fn arrivals_count_per_queue_and_signal_their_waiters() {
        let a = Arrivals::default();
        // Before the store is open nothing counts, and a pull looks again at once.
        a.arrived("T", 1);
        assert!(a.subscribe("T", 1, 0).try_recv().is_ok());
        let ownership = crate::shard::Ownership::CURRENT;
        a.count_for(ownership, 2);
        // Queues of both shards' parts below.
        let owners: Vec<usize> = [("T", 1), ("T", 2), ("U", 1), ("U", 2)]
            .iter()
            .map(|(t, q)| ownership.shard_of(t, *q, 2))
            .collect();
        assert!(owners.contains(&0) && owners.contains(&1), "{owners:?}");
        assert_eq!(a.seq("T", 1), 0);
        let held = a.subscribe("T", 1, 0);
        let other = a.subscribe("U", 1, 0);
        a.arrived("T", 2);
        a.arrived("U", 2);
        assert!(held.try_recv().is_err(), "another queue's arrival");
        a.arrived("T", 1);
        assert!(held.try_recv().is_ok());
        assert_eq!((a.seq("T", 1), a.seq("T", 2), a.seq("U", 1)), (1, 1, 0));
        assert!(
            a.subscribe("T", 1, 0).try_recv().is_ok(),
            "saw an older counter"
        );
        assert!(other.try_recv().is_err());
        a.wake_all();
        assert!(other.try_recv().is_ok());
    }

    /// A thread reads its own copy of an entry, and every change (put, remove, a
    /// master's table) shows at the next read on every thread; two tables in one
    /// process keep apart.
    #[test]
    fn topic_reads_see_every_change() {
        let dir = tempfile::tempdir().unwrap();
        let t = Topics::load(dir.path()).unwrap();
        let other = Topics::load(tempfile::tempdir().unwrap().path()).unwrap();
        let conf = |n| TopicConf {
            read_queue_nums: n,
            write_queue_nums: n,
            perm: 6,
        };
        assert_eq!(t.get("T"), None);
        t.put("T", conf(4)).unwrap();
        other.put("T", conf(9)).unwrap();
        assert_eq!(t.get("T"), Some(conf(4)));
        assert_eq!(other.get("T"), Some(conf(9)));
        assert_eq!(
            t.get("T"),
            Some(conf(4)),
            "a copy of the other table's entry"
        );
        std::thread::scope(|s| {
            s.spawn(|| assert_eq!(t.get("T"), Some(conf(4))));
        });
        t.put("T", conf(8)).unwrap();
        assert_eq!(t.get("T"), Some(conf(8)));
        std::thread::scope(|s| {
            s.spawn(|| assert_eq!(t.get("T"), Some(conf(8))));
        });
        assert!(t.remove("T").unwrap());
        assert_eq!(t.get("T"), None);
        t.replace_all(BTreeMap::from([("T".to_string(), conf(2))]))
            .unwrap();
        assert_eq!(t.get("T"), Some(conf(2)));
        assert_eq!(other.get("T"), Some(conf(9)));
    }

    fn load(table: Value) -> Result<Topics> {
        let dir = tempfile::tempdir().unwrap();
        let text = serde_json::to_vec(&json!({ "topicConfigTable": table })).unwrap();
        std::fs::write(dir.path().join("topics.json"), text).unwrap();
        Topics::load(dir.path())
    }

    /// RocketMQ's `TopicConfig` defaults fill missing fields; 0 queues is kept (a
    /// drained topic).
    #[test]
    fn topic_entries_read_as_rocketmq_does() {
        let t = load(json!({
            "Bare": {"topicName": "Bare"},
            "Drained": {"readQueueNums": 4, "writeQueueNums": 0, "perm": 6},
            "NullPerm": {"readQueueNums": 2, "writeQueueNums": 2, "perm": null},
        }))
        .unwrap();
        let conf = |r, w, p| TopicConf {
            read_queue_nums: r,
            write_queue_nums: w,
            perm: p,
        };
        assert_eq!(t.get("Bare"), Some(conf(16, 16, 6)));
        assert_eq!(t.get("Drained"), Some(conf(4, 0, 6)));
        assert_eq!(t.get("NullPerm"), Some(conf(2, 2, 6)));
    }

    /// What RocketMQ's consumer-ids-changed notice is sent on: a join (or a move to
    /// another connection), never a repeated heartbeat; a leave by unregister, close
    /// or silence.
    #[test]
    fn member_changes_name_their_groups() {
        let c = Clients::default();
        let g = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(c.heartbeat(1, "a", &g(&["G", "H"])), g(&["G", "H"]));
        assert!(c.heartbeat(1, "a", &g(&["G", "H"])).is_empty());
        assert_eq!(
            c.heartbeat(2, "a", &g(&["G"])),
            g(&["G"]),
            "another connection"
        );
        assert_eq!(c.heartbeat(3, "b", &g(&["G"])), g(&["G"]));
        assert!(c.unregister("b", "G"));
        assert!(!c.unregister("b", "G"));
        assert_eq!(c.connection_closed(1), g(&["H"]));
        assert!(c.connection_closed(1).is_empty());
        assert_eq!(c.expire(Duration::ZERO), g(&["G"]));
        assert!(c.members("G").is_empty() && c.members("H").is_empty());
    }

    #[test]
    fn bad_topic_entries_refuse_the_load_naming_topic_and_field() {
        for (entry, field) in [
            (json!({"writeQueueNums": -1}), "writeQueueNums"),
            (json!({"readQueueNums": 4_294_967_296u64}), "readQueueNums"),
            (json!({"writeQueueNums": "8"}), "writeQueueNums"),
            (json!({"writeQueueNums": 1.5}), "writeQueueNums"),
            (json!({"perm": 1u64 << 40}), "perm"),
            (json!(5), "not an object"),
        ] {
            let e = load(json!({ "T1": entry })).err().expect("refused");
            let text = e.to_string();
            assert!(
                text.contains("topics.json") && text.contains("\"T1\"") && text.contains(field),
                "{text}"
            );
        }
    }
}
