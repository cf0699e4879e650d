//! `coremq inspect check`: the store's structures cross-checked, because each is only
//! as good as its agreement with the others (RocketMQ's own check is the recovery
//! walk in `CommitLog.recoverAbnormally`; this one also checks the queues).
//!
//! A ConsumeQueue entry that points at the wrong bytes serves consumers the wrong
//! message; a record without an entry is invisible; a checkpoint beyond the end of
//! the log makes recovery trust data that is gone. [`check`] verifies every record,
//! that queue offsets of each (topic, queue) are strictly consecutive in log order,
//! every entry against the record it points at (exists, size, topic, queue id, queue
//! offset, tags code), that each queue has an entry for every record of that queue
//! still in the log (only records past the checkpoint's dispatch point may lack one:
//! they are rebuilt at the next open), and that the checkpoint decodes and does not
//! point past the end of the log.
//!
//! RocketMQ details it honours: entries pointing below the first segment refer to
//! records removed by retention and are skipped; records of a topic deleted
//! (coremq's `config/deleted-topics`) below where it was deleted need no entry; tags codes of `SCHEDULE_TOPIC_XXXX`
//! (delivery times) and ConsumeQueueExt addresses (below `i32::MIN`) are not compared
//! with tag hashes; those of `rmq_sys_wheel_timer` above `i32::MAX` (coremq's due
//! times) are compared with the record's due time; prepared and rolled-back transaction records have no entry; with
//! a RocketMQ checkpoint (no coremq section) the dispatch point is its
//! logicsMsgTimestamp. LMQ multi-dispatch queues are not understood and will be
//! reported as mismatches.

use super::Root;
use super::log::{LogFiles, walk_log};
use super::queue::{QueueEntry, list_queues, walk_queue};
use crate::error::Result;
use crate::format::checkpoint::Checkpoint;
use crate::format::deleted_topics::DeletedTopics;
use crate::format::java::tags_code;
use crate::format::record::{self, Decoded, RecordView};
use crate::format::schedule::{TIMER_OUT_MS, TIMER_TOPIC, timer_tags_code};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::path::Path;

/// Problems kept in a check report; the rest are only counted.
const MAX_PROBLEMS: usize = 1000;
/// RocketMQ's delay topic: its tags codes are delivery times, not tag hashes.
const SCHEDULE_TOPIC: &str = "SCHEDULE_TOPIC_XXXX";

/// The result of [`check`] on one store root.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CheckReport {
    pub records: u64,
    pub queues: u64,
    pub entries: u64,
    pub problems: Vec<String>,
    pub log_min: u64,
    pub log_end: u64,
    /// Problems beyond [`MAX_PROBLEMS`], counted but not kept.
    pub more_problems: u64,
}

impl CheckReport {
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty() && self.more_problems == 0
    }

    fn problem(&mut self, p: String) {
        if self.problems.len() < MAX_PROBLEMS {
            self.problems.push(p);
        } else {
            self.more_problems += 1;
        }
    }

    pub fn to_json(&self) -> Value {
        let mut problems = self.problems.clone();
        if self.more_problems > 0 {
            problems.push(format!("... and {} more problems", self.more_problems));
        }
        json!({
            "records": self.records, "queues": self.queues, "entries": self.entries,
            "problems": problems, "log_min": self.log_min, "log_end": self.log_end,
        })
    }
}

/// Which records may lack a ConsumeQueue entry: those the checkpoint says were not
/// yet dispatched (coremq: at or past its dispatch-safe offset; RocketMQ: stored at
/// or after its logicsMsgTimestamp). Without a readable checkpoint, none may.
#[derive(Debug, Clone, Copy)]
enum Undispatched {
    FromOffset(u64),
    FromTime(i64),
    Nothing,
}

impl Undispatched {
    fn allows(self, offset: u64, store_ts: i64) -> bool {
        match self {
            Undispatched::FromOffset(o) => offset >= o,
            Undispatched::FromTime(t) => store_ts >= t,
            Undispatched::Nothing => false,
        }
    }
}

/// What the queues hold, by topic then queue id: `[first, end)` of real entries.
type Spans = HashMap<String, HashMap<i32, (Option<u64>, u64)>>;

/// Per-queue state while walking the log.
#[derive(Default)]
struct QueueTrack {
    next: Option<u64>,
    missing: u64,
    first_missing: Option<(u64, u64)>,
}

/// Verifies the store at `root` (see module docs). `Err` only when files cannot be
/// read at all; everything wrong with their contents is in the report.
pub fn check(root: &Path) -> Result<CheckReport> {
    check_root(&Root {
        shard: None,
        path: root.to_path_buf(),
    })
}

/// [`check`] for one root of [`roots`]. A shard's log starts at its base offset
/// ([`Root::base_offset`]), so an empty shard's checkpoint rightly points there.
pub fn check_root(root: &Root) -> Result<CheckReport> {
    let base = root.base_offset();
    let root = root.path.as_path();
    let log = LogFiles::open(root)?;
    let mut rep = CheckReport {
        log_min: log.min_offset(),
        ..Default::default()
    };
    for p in &log.layout_problems {
        rep.problem(p.clone());
    }
    let cp = read_checkpoint(root, &mut rep);
    let spans = check_queues(root, &log, &mut rep)?;
    let tail = match cp {
        Some((c, true)) => Undispatched::FromOffset(c.dispatch_safe_offset),
        Some((c, false)) => Undispatched::FromTime(c.logics_msg_timestamp),
        None => Undispatched::Nothing,
    };
    let deleted = read_deleted_topics(root, &mut rep);
    check_log(&log, &spans, tail, &deleted, &mut rep)?;
    if log.segments().is_empty() {
        // No segment yet: the log is empty where this root's log begins.
        rep.log_min = base;
        rep.log_end = base;
    }
    if let Some((c, true)) = cp {
        check_checkpoint(&c, &spans, &mut rep);
    }
    Ok(rep)
}

/// `config/deleted-topics`: topic -> commit-log offset below which its records are
/// deleted (their queues are gone; the records wait for retention).
fn read_deleted_topics(root: &Path, rep: &mut CheckReport) -> HashMap<String, u64> {
    let path = root.join("config").join("deleted-topics");
    match std::fs::read(&path) {
        Ok(bytes) => match DeletedTopics::decode(&bytes) {
            Ok(d) => d.topics.into_iter().collect(),
            Err(e) => {
                rep.problem(format!("{}: {e}", path.display()));
                HashMap::new()
            }
        },
        Err(_) => HashMap::new(),
    }
}

fn read_checkpoint(root: &Path, rep: &mut CheckReport) -> Option<(Checkpoint, bool)> {
    let path = root.join("checkpoint");
    match std::fs::read(&path) {
        Ok(bytes) => match Checkpoint::decode(&bytes) {
            Ok(cp) => Some(cp),
            Err(e) => {
                rep.problem(format!("checkpoint: {e}"));
                None
            }
        },
        Err(e) => {
            rep.problem(format!("checkpoint: cannot read {}: {e}", path.display()));
            None
        }
    }
}

/// Walks every queue, checking each entry against its record.
fn check_queues(root: &Path, log: &LogFiles, rep: &mut CheckReport) -> Result<Spans> {
    let mut spans = Spans::new();
    for (topic, qid) in list_queues(root)? {
        let walk = walk_queue(root, &topic, qid, |e| {
            if let Some(p) = check_entry(log, &topic, qid, e) {
                rep.problem(format!(
                    "consumequeue {topic}/{qid} offset {}: {p}",
                    e.queue_offset
                ));
            }
        })?;
        for p in &walk.problems {
            rep.problem(format!("consumequeue {topic}/{qid}: {p}"));
        }
        rep.queues += 1;
        rep.entries += walk.entries;
        spans
            .entry(topic)
            .or_default()
            .insert(qid, (walk.first, walk.end));
    }
    Ok(spans)
}

/// What is wrong with one entry, if anything. Entries below the log's first segment
/// point at removed (expired) records and are not checked.
fn check_entry(log: &LogFiles, topic: &str, qid: i32, e: &QueueEntry) -> Option<String> {
    let at = e.commit_log_offset;
    if at < log.min_offset() {
        return None;
    }
    let record = match log.read_record(at) {
        Ok(r) => r,
        Err(why) => return Some(format!("commit-log offset {at}: {why}")),
    };
    // `read_record` verified the checksums already.
    let Decoded::Record(r) = record::decode(&record, log.verify(at, false)).ok()? else {
        return None;
    };
    let mut bad = Vec::new();
    if r.total_size != e.size {
        bad.push(format!(
            "size {} but the record is {} bytes",
            e.size, r.total_size
        ));
    }
    if r.topic != topic || r.queue_id != qid {
        bad.push(format!("record belongs to {}/{}", r.topic, r.queue_id));
    }
    if r.queue_offset != e.queue_offset as i64 {
        bad.push(format!("record has queue offset {}", r.queue_offset));
    }
    // The timer queue's tags codes are due times when coremq wrote them (above any
    // tags hash), tags hashes when RocketMQ did.
    let due = (topic == TIMER_TOPIC && e.tags_code > i32::MAX as i64)
        .then(|| timer_tags_code(r.property(TIMER_OUT_MS), r.store_timestamp));
    if let Some(due) = due
        && due != Some(e.tags_code)
    {
        bad.push(format!(
            "tags code {} but the record is due at {due:?} (TIMER_OUT_MS or its store time)",
            e.tags_code
        ));
    }
    let tags_checked = topic != SCHEDULE_TOPIC && due.is_none() && e.tags_code >= i32::MIN as i64;
    if tags_checked && tags_code(r.tags()) != e.tags_code {
        bad.push(format!(
            "tags code {} but the record's tags hash to {}",
            e.tags_code,
            tags_code(r.tags())
        ));
    }
    (!bad.is_empty()).then(|| format!("commit-log offset {at}: {}", bad.join("; ")))
}

/// Walks the log: record validity, consecutive queue offsets, entries for records.
fn check_log(
    log: &LogFiles,
    spans: &Spans,
    tail: Undispatched,
    deleted: &HashMap<String, u64>,
    rep: &mut CheckReport,
) -> Result<()> {
    let mut tracks = Tracks::new();
    let walk = walk_log(log, |(off, r, checksum)| {
        // A deleted topic's records below where it was deleted have no queue (a
        // topic made again after starts its queues at 0).
        let gone = deleted.get(r.topic).is_some_and(|below| off < *below);
        if checksum.is_none() && r.is_dispatched_to_queue() && !gone {
            track_record(&mut tracks, spans, tail, (off, r), rep);
        }
    })?;
    rep.records = walk.records;
    rep.log_end = walk.log_end;
    for p in &walk.problems {
        rep.problem(p.to_string());
    }
    report_missing(tracks, rep);
    Ok(())
}

type Tracks = HashMap<String, HashMap<i32, QueueTrack>>;

/// Follows one record of its queue: consecutive queue offsets, and an entry for it.
fn track_record(
    tracks: &mut Tracks,
    spans: &Spans,
    tail: Undispatched,
    (off, r): (u64, &RecordView<'_>),
    rep: &mut CheckReport,
) {
    if !tracks.contains_key(r.topic) {
        tracks.insert(r.topic.to_string(), HashMap::new());
    }
    let t = tracks
        .get_mut(r.topic)
        .expect("inserted")
        .entry(r.queue_id)
        .or_default();
    let q = r.queue_offset as u64;
    if let Some(next) = t.next.filter(|n| *n != q) {
        let (topic, id) = (r.topic, r.queue_id);
        rep.problem(format!(
            "commitlog offset {off}: {topic}/{id} queue offset {q}, expected {next}"
        ));
    }
    t.next = Some(q + 1);
    let span = spans.get(r.topic).and_then(|m| m.get(&r.queue_id)).copied();
    let (first, end) = span.unwrap_or((None, 0));
    let covered = first.is_some_and(|f| q >= f) && q < end;
    // Past the queue's end, a record may wait for dispatch (see `Undispatched`).
    let excused = q >= end && tail.allows(off, r.store_timestamp);
    if !(covered || excused) {
        t.missing += 1;
        t.first_missing.get_or_insert((q, off));
    }
}

fn report_missing(tracks: Tracks, rep: &mut CheckReport) {
    let mut missing: Vec<_> = tracks
        .into_iter()
        .flat_map(|(topic, qs)| qs.into_iter().map(move |(q, t)| (topic.clone(), q, t)))
        .filter(|(_, _, t)| t.missing > 0)
        .collect();
    missing.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
    for (topic, q, t) in missing {
        let (qo, off) = t.first_missing.unwrap_or_default();
        rep.problem(format!(
            "consumequeue {topic}/{q}: {} records have no entry (first: queue offset {qo} at commit-log offset {off})",
            t.missing
        ));
    }
}

/// The coremq checkpoint must not claim more than the log and queues hold.
fn check_checkpoint(cp: &Checkpoint, spans: &Spans, rep: &mut CheckReport) {
    let end = rep.log_end;
    if cp.log_flushed_offset > end {
        rep.problem(format!(
            "checkpoint: log_flushed_offset {} is beyond the end of the log {end}",
            cp.log_flushed_offset
        ));
    }
    if cp.dispatch_safe_offset > end {
        rep.problem(format!(
            "checkpoint: dispatch_safe_offset {} is beyond the end of the log {end}",
            cp.dispatch_safe_offset
        ));
    }
    let holding = spans
        .values()
        .flat_map(|m| m.values())
        .filter(|(_, end)| *end > 0)
        .count();
    if (holding as u64) < cp.queue_count as u64 {
        rep.problem(format!(
            "checkpoint: {} consume queues held entries but only {holding} do now",
            cp.queue_count
        ));
    }
}
