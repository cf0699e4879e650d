//! Offline inspection of a store directory: the operator's `coremq inspect` tool.
//!
//! Everything here reads files with plain `std::fs` (no glommio, no lock, never a
//! write), so it works on a stopped coremq shard, on a RocketMQ store root, or on a
//! copy of either. On a store that is running the files change underneath the reader
//! and the tail may look torn; stop the store first for a trustworthy `check`.
//!
//! `DIR` is either one store root (`commitlog/`, `consumequeue/`, `checkpoint`) or a
//! directory of `shard-<i>/` store roots ([`roots`]); each shard is inspected alone.
//!
//! * [`walk_log`] walks CommitLog records in log order, verifying each one (body CRC,
//!   record CRC when present, PHYSICALOFFSET equal to where it was read, lengths). A
//!   blank record jumps to the next segment; the first header with magic 0 is the end
//!   of the log (never-written bytes); any other failure is a [`Problem`] and ends the
//!   walk, as recovery would stop there.
//! * [`walk_queue`] walks one ConsumeQueue's 20-byte entries from its first valid
//!   entry to the first invalid one, skipping (and counting) RocketMQ's pre-blank
//!   entries. File sizes are detected from the files (gap between file names, or the
//!   length of a lone file), not assumed.
//! * [`check`] cross-checks all of it, because each structure is only as good as its
//!   agreement with the others: a ConsumeQueue entry that points at the wrong bytes
//!   serves consumers the wrong message; a record without an entry is invisible; a
//!   checkpoint beyond the end of the log makes recovery trust data that is gone. It
//!   verifies every record, that queue offsets of each (topic, queue) are strictly
//!   consecutive in log order, every entry against the record it points at (exists,
//!   size, topic, queue id, queue offset, tags code), that each queue has an entry for
//!   every record of that queue still in the log (only records past the checkpoint's
//!   dispatch point may lack one: they are rebuilt at the next open), and that the
//!   checkpoint decodes and does not point past the end of the log.
//!
//! RocketMQ details `check` honours: entries pointing below the first segment refer
//! to records removed by retention and are skipped; tags codes of
//! `SCHEDULE_TOPIC_XXXX` (delivery times) and ConsumeQueueExt addresses (below
//! `i32::MIN`) are not compared with tag hashes; prepared and rolled-back transaction
//! records have no entry; with a RocketMQ checkpoint (no coremq section) the dispatch
//! point is its logicsMsgTimestamp. LMQ multi-dispatch queues are not understood and
//! will be reported as mismatches.
//!
//! Memory stays bounded: records are streamed segment chunk by chunk, queues are
//! streamed entry by entry and their records read by offset; per queue only a few
//! counters are kept.

use crate::error::{Error, Result};
use crate::format::Corruption;
use crate::format::checkpoint::Checkpoint;
use crate::format::consume_queue::{CqEntry, ENTRY_LEN};
use crate::format::java::tags_code;
use crate::format::msg_id::MessageId;
use crate::format::properties;
use crate::format::record::{self, Decoded, RecordView, Verify};
use crate::io::list_offset_files;
use serde_json::{Map, Value, json};
use std::cell::RefCell;
use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read, Write};
use std::net::SocketAddr;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Bytes read from a segment at a time while walking the log.
const READ_CHUNK: u64 = 4 << 20;
/// Problems kept in a check report; the rest are only counted.
const MAX_PROBLEMS: usize = 1000;
/// RocketMQ's delay topic: its tags codes are delivery times, not tag hashes.
const SCHEDULE_TOPIC: &str = "SCHEDULE_TOPIC_XXXX";

// ---------------------------------------------------------------------------------
// Store roots

/// One store root to inspect; `shard` is set inside a multi-shard directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Root {
    pub shard: Option<u32>,
    pub path: PathBuf,
}

/// The store roots under `dir`: its `shard-<i>/` subdirectories (by shard number)
/// when it has any, else `dir` itself.
pub fn roots(dir: &Path) -> Result<Vec<Root>> {
    let rd = std::fs::read_dir(dir).map_err(|e| Error::io("list", dir, 0, e))?;
    let mut shards = Vec::new();
    for entry in rd {
        let entry = entry.map_err(|e| Error::io("list", dir, 0, e))?;
        let name = entry.file_name();
        let shard = name
            .to_str()
            .and_then(|n| n.strip_prefix("shard-"))
            .and_then(|n| n.parse().ok());
        if let (Some(shard), true) = (shard, entry.path().is_dir()) {
            shards.push(Root {
                shard: Some(shard),
                path: entry.path(),
            });
        }
    }
    if shards.is_empty() {
        return Ok(vec![Root {
            shard: None,
            path: dir.to_path_buf(),
        }]);
    }
    shards.sort_by_key(|r| r.shard);
    Ok(shards)
}

// ---------------------------------------------------------------------------------
// CommitLog files

/// Something wrong at a commit-log offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub offset: u64,
    pub reason: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "commitlog offset {}: {}", self.offset, self.reason)
    }
}

/// The segments of a CommitLog, read with positioned reads.
pub struct LogFiles {
    dir: PathBuf,
    seg_bytes: u64,
    /// (start offset, path), sorted; a zero-length last file is left out.
    segments: Vec<(u64, PathBuf)>,
    /// Segments whose name or size break the layout rules.
    pub layout_problems: Vec<String>,
    open: RefCell<Option<(u64, File)>>,
}

impl LogFiles {
    /// Lists `root/commitlog/` and detects the segment size from the files.
    pub fn open(root: &Path) -> Result<LogFiles> {
        let dir = root.join("commitlog");
        let (mut named, _) = list_offset_files(&dir)?;
        let mut lens = Vec::with_capacity(named.len());
        for (_, path) in &named {
            lens.push(
                std::fs::metadata(path)
                    .map_err(|e| Error::io("stat", path, 0, e))?
                    .len(),
            );
        }
        if lens.last() == Some(&0) {
            // A segment created but never sized; RocketMQ deletes it at load.
            named.pop();
            lens.pop();
        }
        let seg_bytes = lens.first().copied().unwrap_or(0);
        let mut log = LogFiles {
            dir,
            seg_bytes,
            segments: named,
            layout_problems: Vec::new(),
            open: RefCell::new(None),
        };
        log.check_layout(&lens);
        Ok(log)
    }

    fn check_layout(&mut self, lens: &[u64]) {
        for ((start, path), len) in self.segments.iter().zip(lens) {
            if *len != self.seg_bytes || *len == 0 {
                self.layout_problems.push(format!(
                    "segment {} is {len} bytes; the first segment is {}",
                    path.display(),
                    self.seg_bytes
                ));
            } else if start.checked_rem(self.seg_bytes) != Some(0) {
                self.layout_problems.push(format!(
                    "segment {} starts at {start}, not a multiple of {len}",
                    path.display()
                ));
            }
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
    /// Detected segment size (0 when there are no segments).
    pub fn segment_bytes(&self) -> u64 {
        self.seg_bytes
    }
    /// Start of the first segment (0 when there are none).
    pub fn min_offset(&self) -> u64 {
        self.segments.first().map(|s| s.0).unwrap_or(0)
    }
    pub fn segments(&self) -> &[(u64, PathBuf)] {
        &self.segments
    }

    /// Reads up to `len` bytes at log offset `off`, never past the end of the segment
    /// holding `off` (empty if no segment holds it).
    pub fn read_at(&self, off: u64, len: usize) -> Result<Vec<u8>> {
        let Some((start, path)) = self.segment_of(off) else {
            return Ok(Vec::new());
        };
        let len = len.min((start + self.seg_bytes - off) as usize);
        let mut open = self.open.borrow_mut();
        if open.as_ref().map(|(s, _)| *s) != Some(start) {
            let file = File::open(&path).map_err(|e| Error::io("open", &path, 0, e))?;
            *open = Some((start, file));
        }
        let (_, file) = open.as_ref().expect("just opened");
        read_full_at(file, off - start, len).map_err(|e| Error::io("read", &path, off - start, e))
    }

    fn segment_of(&self, off: u64) -> Option<(u64, PathBuf)> {
        let i = self
            .segments
            .partition_point(|(s, _)| *s <= off)
            .checked_sub(1)?;
        let (start, path) = &self.segments[i];
        (off < start + self.seg_bytes).then(|| (*start, path.clone()))
    }

    fn verify(&self, at: u64, crc: bool) -> Verify {
        Verify {
            crc,
            at_offset: Some(at as i64),
            max_total_size: self.seg_bytes as usize,
            // Offline tools read any store, including RocketMQ's without the property.
            require_record_crc: false,
        }
    }
}

/// Reads `len` bytes at `pos`, fewer only at end of file.
fn read_full_at(file: &File, pos: u64, len: usize) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; len];
    let mut got = 0;
    while got < len {
        match file.read_at(&mut buf[got..], pos + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(got);
    Ok(buf)
}

/// A read-ahead window over one segment.
struct SegReader {
    file: File,
    path: PathBuf,
    start: u64,
    end: u64,
    buf: Vec<u8>,
    buf_at: u64,
}

impl SegReader {
    fn open(start: u64, path: &Path, seg_bytes: u64) -> Result<SegReader> {
        let file = File::open(path).map_err(|e| Error::io("open", path, 0, e))?;
        Ok(SegReader {
            file,
            path: path.to_path_buf(),
            start,
            end: start + seg_bytes,
            buf: Vec::new(),
            buf_at: start,
        })
    }

    /// `want` bytes at log offset `pos` (fewer only if the file is short).
    fn bytes(&mut self, pos: u64, want: u64) -> Result<&[u8]> {
        let want = want.min(self.end - pos);
        if pos < self.buf_at || pos + want > self.buf_at + self.buf.len() as u64 {
            let len = want.max(READ_CHUNK).min(self.end - pos) as usize;
            let at = pos - self.start;
            self.buf = read_full_at(&self.file, at, len)
                .map_err(|e| Error::io("read", &self.path, at, e))?;
            self.buf_at = pos;
        }
        let from = (pos - self.buf_at) as usize;
        let to = (from + want as usize).min(self.buf.len());
        Ok(&self.buf[from..to])
    }
}

// ---------------------------------------------------------------------------------
// Walking the log

/// Where a log walk ended and why.
#[derive(Debug, Clone, Default)]
pub struct LogWalk {
    pub log_min: u64,
    /// End of the valid records: the next byte a writer would use.
    pub log_end: u64,
    pub records: u64,
    /// At most one problem ends the walk; blank-size mismatches do not.
    pub problems: Vec<Problem>,
}

/// What the walk passes for each record: its offset, the decoded record and, for a
/// record whose checksum failed (the last one the walk reports), the failure.
pub type RecordVisit<'a, 'b> = (u64, &'a RecordView<'b>, Option<Corruption>);

impl LogWalk {
    fn problem(&mut self, offset: u64, reason: impl Into<String>) {
        let reason = reason.into();
        self.problems.push(Problem { offset, reason });
    }
}

/// Walks every record of the log in order, calling `visit` for each (see module docs).
pub fn walk_log(log: &LogFiles, mut visit: impl FnMut(RecordVisit<'_, '_>)) -> Result<LogWalk> {
    let min = log.min_offset();
    let mut w = LogWalk {
        log_min: min,
        log_end: min,
        ..Default::default()
    };
    for (start, path) in &log.segments {
        if *start != w.log_end {
            let why = format!(
                "segment {} is missing (the next one starts at {start})",
                w.log_end
            );
            w.problem(w.log_end, why);
            break;
        }
        if !walk_segment(log, *start, path, &mut w, &mut visit)? {
            break;
        }
    }
    Ok(w)
}

/// What one step of the walk found.
enum Step {
    /// A record; the next one starts at this offset.
    Record(u64),
    /// The segment's closing blank: go on in the next segment.
    Blank,
    /// The end of the log (never-written bytes) or a problem.
    End,
}

/// Walks one segment; `true` if the walk goes on into the next segment.
fn walk_segment(
    log: &LogFiles,
    start: u64,
    path: &Path,
    w: &mut LogWalk,
    visit: &mut impl FnMut(RecordVisit<'_, '_>),
) -> Result<bool> {
    let mut rd = SegReader::open(start, path, log.seg_bytes)?;
    let seg_end = start + log.seg_bytes;
    let mut pos = start;
    loop {
        w.log_end = pos;
        if pos == seg_end {
            return Ok(true);
        }
        if seg_end - pos < record::END_FILE_MIN_BLANK_LENGTH as u64 {
            w.problem(
                pos,
                "a record ends fewer than 8 bytes before the segment end",
            );
            return Ok(false);
        }
        match step(log, &mut rd, pos, w, visit)? {
            Step::Record(next) => pos = next,
            Step::Blank => {
                w.log_end = seg_end;
                return Ok(true);
            }
            Step::End => return Ok(false),
        }
    }
}

/// Decodes what starts at `pos`: a record (visited), a blank, the end, or a problem.
fn step(
    log: &LogFiles,
    rd: &mut SegReader,
    pos: u64,
    w: &mut LogWalk,
    visit: &mut impl FnMut(RecordVisit<'_, '_>),
) -> Result<Step> {
    let head = rd.bytes(pos, record::END_FILE_MIN_BLANK_LENGTH as u64)?;
    let (size, magic) = record::peek_header(head).unwrap_or((0, u32::MAX));
    if magic == 0 {
        return Ok(Step::End);
    }
    let want = if magic == record::BLANK_MAGIC || size <= 0 {
        8
    } else {
        size as u64
    };
    let buf = rd.bytes(pos, want)?;
    match record::decode(buf, log.verify(pos, true)) {
        Ok(Decoded::Record(r)) => {
            visit((pos, &r, None));
            w.records += 1;
            Ok(Step::Record(pos + r.total_size as u64))
        }
        Ok(Decoded::Blank(n)) => {
            let left = rd.end - pos;
            if n as u64 != left {
                w.problem(
                    pos,
                    format!("blank record claims {n} bytes but {left} remain in the segment"),
                );
            }
            Ok(Step::Blank)
        }
        Err(e @ (Corruption::BodyCrc { .. } | Corruption::RecordCrc { .. })) => {
            if let Ok(Decoded::Record(r)) = record::decode(buf, log.verify(pos, false)) {
                visit((pos, &r, Some(e)));
            }
            w.problem(pos, e.to_string());
            Ok(Step::End)
        }
        Err(e) => {
            w.problem(pos, e.to_string());
            Ok(Step::End)
        }
    }
}

// ---------------------------------------------------------------------------------
// Records

/// One record as `inspect records` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordInfo {
    pub offset: u64,
    pub size: u32,
    pub topic: String,
    pub queue_id: i32,
    pub queue_offset: i64,
    pub tags: Option<String>,
    pub keys: Option<String>,
    /// Stored properties in order, without the record-CRC property.
    pub properties: Vec<(String, String)>,
    pub store_timestamp: i64,
    pub born_timestamp: i64,
    pub body_size: usize,
    pub sys_flag: i32,
    /// Offset message id; `None` for an IPv6 store host.
    pub msg_id: Option<String>,
    /// `"ok"`, `"body_crc_mismatch"` or `"record_crc_mismatch"`.
    pub checksum: String,
    /// The checksum failure in words, when there is one.
    pub checksum_detail: Option<String>,
}

impl RecordInfo {
    pub fn new(offset: u64, r: &RecordView<'_>, checksum: Option<Corruption>) -> RecordInfo {
        let msg_id = match r.store_host {
            SocketAddr::V4(h) => Some(
                MessageId {
                    store_host: h,
                    offset: r.phys_offset as u64,
                }
                .to_string(),
            ),
            SocketAddr::V6(_) => None,
        };
        RecordInfo {
            offset,
            size: r.total_size,
            topic: r.topic.to_string(),
            queue_id: r.queue_id,
            queue_offset: r.queue_offset,
            tags: r.tags().map(str::to_string),
            keys: r.keys().map(str::to_string),
            properties: properties::iter(r.properties)
                .filter(|(n, _)| *n != properties::CRC32)
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect(),
            store_timestamp: r.store_timestamp,
            born_timestamp: r.born_timestamp,
            body_size: r.body.len(),
            sys_flag: r.sys_flag,
            msg_id,
            checksum: checksum_name(checksum).to_string(),
            checksum_detail: checksum.map(|c| c.to_string()),
        }
    }

    pub fn to_json(&self) -> Value {
        let props: Map<String, Value> = self
            .properties
            .iter()
            .map(|(n, v)| (n.clone(), Value::String(v.clone())))
            .collect();
        let mut v = json!({
            "offset": self.offset, "size": self.size, "topic": self.topic,
            "queue_id": self.queue_id, "queue_offset": self.queue_offset,
            "tags": self.tags, "keys": self.keys, "properties": props,
            "store_timestamp": self.store_timestamp, "born_timestamp": self.born_timestamp,
            "body_size": self.body_size, "sys_flag": self.sys_flag, "msg_id": self.msg_id,
            "checksum": self.checksum,
        });
        if let Some(d) = &self.checksum_detail {
            v["checksum_detail"] = json!(d);
        }
        v
    }
}

fn checksum_name(c: Option<Corruption>) -> &'static str {
    match c {
        None => "ok",
        Some(Corruption::BodyCrc { .. }) => "body_crc_mismatch",
        Some(Corruption::RecordCrc { .. }) => "record_crc_mismatch",
        Some(_) => "bad",
    }
}

/// Every record of the store at `root` (use [`walk_log`] to stream instead).
pub fn records(root: &Path) -> Result<(Vec<RecordInfo>, LogWalk)> {
    let log = LogFiles::open(root)?;
    let mut out = Vec::new();
    let walk = walk_log(&log, |(off, r, c)| out.push(RecordInfo::new(off, r, c)))?;
    Ok((out, walk))
}

// ---------------------------------------------------------------------------------
// ConsumeQueues

/// One real (not pre-blank) ConsumeQueue entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueEntry {
    pub queue_offset: u64,
    pub commit_log_offset: u64,
    pub size: u32,
    pub tags_code: i64,
}

impl QueueEntry {
    pub fn to_json(&self) -> Value {
        json!({
            "queue_offset": self.queue_offset, "commit_log_offset": self.commit_log_offset,
            "size": self.size, "tags_code": self.tags_code,
        })
    }
}

/// What walking a queue found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueWalk {
    /// Queue offset of the first real entry.
    pub first: Option<u64>,
    /// One past the last valid entry (RocketMQ's max offset); 0 if none is valid.
    pub end: u64,
    /// Real entries seen.
    pub entries: u64,
    /// Pre-blank entries skipped.
    pub pre_blank: u64,
    /// Detected file size in bytes (`None` without files).
    pub file_bytes: Option<u64>,
    /// Layout problems (missing files, odd names, pre-blanks after real entries).
    pub problems: Vec<String>,
}

impl QueueWalk {
    pub fn to_json(&self) -> Value {
        json!({
            "first": self.first, "end": self.end, "entries": self.entries,
            "pre_blank": self.pre_blank, "file_bytes": self.file_bytes,
        })
    }
}

/// The directory of one ConsumeQueue.
pub fn queue_dir(root: &Path, topic: &str, queue_id: i32) -> PathBuf {
    root.join("consumequeue")
        .join(topic)
        .join(queue_id.to_string())
}

/// Walks a queue's entries in order, calling `visit` for each real entry.
pub fn walk_queue(
    root: &Path,
    topic: &str,
    queue_id: i32,
    mut visit: impl FnMut(&QueueEntry),
) -> Result<QueueWalk> {
    let (files, _) = list_offset_files(&queue_dir(root, topic, queue_id))?;
    let mut w = QueueWalk {
        file_bytes: cq_file_bytes(&files)?,
        ..Default::default()
    };
    let file_bytes = w.file_bytes.unwrap_or(0);
    let mut expected = files.first().map(|f| f.0);
    for (i, (pos, path)) in files.iter().enumerate() {
        if pos % ENTRY_LEN as u64 != 0 || Some(*pos) != expected {
            let want = expected.unwrap_or(0);
            w.problems.push(format!(
                "{}: expected the next file at byte position {want}",
                path.display()
            ));
            break;
        }
        let cap = if i + 1 < files.len() {
            Some(file_bytes)
        } else {
            None
        };
        if !walk_cq_file(path, pos / ENTRY_LEN as u64, cap, &mut w, &mut visit)? {
            break;
        }
        expected = Some(pos + file_bytes);
    }
    Ok(w)
}

/// Queue files hold a fixed number of bytes: the gap between consecutive file names,
/// or, for a lone file, its length (which may include coremq's zero-padded last page
/// past the nominal size; reading those zeros is harmless).
fn cq_file_bytes(files: &[(u64, PathBuf)]) -> Result<Option<u64>> {
    let gap = files.windows(2).map(|p| p[1].0 - p[0].0).min();
    match (gap, files.first()) {
        (Some(g), _) => Ok(Some(g)),
        (None, Some((_, path))) => Ok(Some(
            std::fs::metadata(path)
                .map_err(|e| Error::io("stat", path, 0, e))?
                .len(),
        )),
        (None, None) => Ok(None),
    }
}

/// Walks one queue file (at most `cap` bytes); `true` if it was full of valid entries
/// and the queue continues in the next file.
fn walk_cq_file(
    path: &Path,
    first_q: u64,
    cap: Option<u64>,
    w: &mut QueueWalk,
    visit: &mut impl FnMut(&QueueEntry),
) -> Result<bool> {
    let file = File::open(path).map_err(|e| Error::io("open", path, 0, e))?;
    let len = file
        .metadata()
        .map_err(|e| Error::io("stat", path, 0, e))?
        .len();
    let n = cap.unwrap_or(len).min(len) / ENTRY_LEN as u64;
    let mut rd = BufReader::with_capacity(1 << 20, file);
    let mut raw = [0u8; ENTRY_LEN];
    for i in 0..n {
        rd.read_exact(&mut raw)
            .map_err(|e| Error::io("read", path, i * ENTRY_LEN as u64, e))?;
        let e = CqEntry::decode(&raw).expect("20 bytes");
        let q = first_q + i;
        let started = w.end > 0 || w.pre_blank > 0 || w.first.is_some();
        if !e.is_valid() {
            if started {
                return Ok(false);
            }
            continue;
        }
        w.end = q + 1;
        if e.is_pre_blank() {
            w.pre_blank += 1;
            if w.first.is_some() {
                w.problems.push(format!(
                    "pre-blank entry at queue offset {q} follows real entries"
                ));
            }
            continue;
        }
        w.first.get_or_insert(q);
        w.entries += 1;
        let entry = QueueEntry {
            queue_offset: q,
            commit_log_offset: e.phys_offset as u64,
            size: e.size as u32,
            tags_code: e.tags_code,
        };
        visit(&entry);
    }
    Ok(cap.is_some_and(|c| len >= c))
}

/// Every real entry of a queue (use [`walk_queue`] to stream instead).
pub fn queue_entries(
    root: &Path,
    topic: &str,
    queue_id: i32,
) -> Result<(Vec<QueueEntry>, QueueWalk)> {
    let mut out = Vec::new();
    let walk = walk_queue(root, topic, queue_id, |e| out.push(*e))?;
    Ok((out, walk))
}

/// Every (topic, queue id) with a directory under `consumequeue/`, sorted. Non-numeric
/// queue directories are ignored, as RocketMQ does.
pub fn list_queues(root: &Path) -> Result<Vec<(String, i32)>> {
    let cq = root.join("consumequeue");
    let mut out = Vec::new();
    for topic in read_dirs(&cq)? {
        let Some(name) = topic
            .file_name()
            .and_then(|n| n.to_str())
            .map(str::to_string)
        else {
            continue;
        };
        for q in read_dirs(&topic)? {
            if let Some(id) = q
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.parse().ok())
            {
                out.push((name.clone(), id));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Subdirectories of `dir` (none if it does not exist).
fn read_dirs(dir: &Path) -> Result<Vec<PathBuf>> {
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io("list", dir, 0, e)),
    };
    let mut out = Vec::new();
    for entry in rd {
        let path = entry.map_err(|e| Error::io("list", dir, 0, e))?.path();
        if path.is_dir() {
            out.push(path);
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------
// Check

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
/// (`shard << SHARD_SHIFT`), so an empty shard's checkpoint rightly points there.
pub fn check_root(root: &Root) -> Result<CheckReport> {
    let base = root
        .shard
        .map_or(0, |s| (s as u64) << crate::shard::SHARD_SHIFT);
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
    check_log(&log, &spans, tail, &mut rep)?;
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
    let record = match read_record(log, at) {
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
    let tags_checked = topic != SCHEDULE_TOPIC && e.tags_code >= i32::MIN as i64;
    if tags_checked && tags_code(r.tags()) != e.tags_code {
        bad.push(format!(
            "tags code {} but the record's tags hash to {}",
            e.tags_code,
            tags_code(r.tags())
        ));
    }
    (!bad.is_empty()).then(|| format!("commit-log offset {at}: {}", bad.join("; ")))
}

/// The verified bytes of the record at `at`, or why there is none.
fn read_record(log: &LogFiles, at: u64) -> std::result::Result<Vec<u8>, String> {
    let head = log.read_at(at, 8).map_err(|e| e.to_string())?;
    let (size, magic) =
        record::peek_header(&head).map_err(|_| "beyond the commit log".to_string())?;
    if magic != record::MAGIC_V1 && magic != record::MAGIC_V2 {
        return Err(format!("no record starts there (magic {magic:#010x})"));
    }
    if size <= 0 || size as u64 > log.seg_bytes {
        return Err(format!("record length {size} out of range"));
    }
    let raw = log.read_at(at, size as usize).map_err(|e| e.to_string())?;
    match record::decode(&raw, log.verify(at, true)) {
        Ok(Decoded::Record(_)) => Ok(raw),
        Ok(Decoded::Blank(_)) => Err("a blank record".into()),
        Err(e) => Err(format!("invalid record: {e}")),
    }
}

/// Walks the log: record validity, consecutive queue offsets, entries for records.
fn check_log(
    log: &LogFiles,
    spans: &Spans,
    tail: Undispatched,
    rep: &mut CheckReport,
) -> Result<()> {
    let mut tracks = Tracks::new();
    let walk = walk_log(log, |(off, r, checksum)| {
        if checksum.is_none() && r.is_dispatched_to_queue() {
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

// ---------------------------------------------------------------------------------
// Printing (used by `coremq inspect`)

/// Writes one JSON value as a line, adding `"shard"` when inspecting a shard.
fn emit(out: &mut impl Write, shard: Option<u32>, mut v: Value) -> std::io::Result<()> {
    if let (Some(s), Some(obj)) = (shard, v.as_object_mut()) {
        obj.insert("shard".into(), json!(s));
    }
    serde_json::to_writer(&mut *out, &v)?;
    out.write_all(b"\n")
}

fn out_err(e: std::io::Error) -> Error {
    Error::io("write", "<stdout>", 0, e)
}

/// `inspect records`: one line per record, then a `{"problem"}` line for whatever
/// ended the walk early. Returns `true` if the walk met no problem.
pub fn print_records(dir: &Path, out: &mut impl Write) -> Result<bool> {
    let mut clean = true;
    for root in roots(dir)? {
        let log = LogFiles::open(&root.path)?;
        let mut write_err = None;
        let walk = walk_log(&log, |(off, r, c)| {
            if write_err.is_none() {
                write_err = emit(out, root.shard, RecordInfo::new(off, r, c).to_json()).err();
            }
        })?;
        if let Some(e) = write_err {
            return Err(out_err(e));
        }
        for p in log
            .layout_problems
            .iter()
            .cloned()
            .chain(walk.problems.iter().map(|p| p.to_string()))
        {
            clean = false;
            emit(out, root.shard, json!({ "problem": p })).map_err(out_err)?;
        }
    }
    Ok(clean)
}

/// `inspect queue`: one line per real entry; a summary (pre-blank count, first, end,
/// file size) goes to `summary`. Returns `true` if the queue exists in some root.
pub fn print_queue(
    dir: &Path,
    topic: &str,
    queue_id: i32,
    out: &mut impl Write,
    summary: &mut impl Write,
) -> Result<bool> {
    let mut found = false;
    for root in roots(dir)? {
        if !queue_dir(&root.path, topic, queue_id).is_dir() {
            continue;
        }
        found = true;
        let mut write_err = None;
        let walk = walk_queue(&root.path, topic, queue_id, |e| {
            if write_err.is_none() {
                write_err = emit(out, root.shard, e.to_json()).err();
            }
        })?;
        if let Some(e) = write_err {
            return Err(out_err(e));
        }
        for p in &walk.problems {
            emit(out, root.shard, json!({ "problem": p })).map_err(out_err)?;
        }
        let mut s = walk.to_json();
        s["topic"] = json!(topic);
        s["queue"] = json!(queue_id);
        emit(summary, root.shard, s).map_err(out_err)?;
    }
    Ok(found)
}

/// `inspect check`: one summary line per store root. Returns `true` if all are clean.
pub fn print_check(dir: &Path, out: &mut impl Write) -> Result<bool> {
    let mut clean = true;
    for root in roots(dir)? {
        let rep = check_root(&root)?;
        clean &= rep.is_clean();
        emit(out, root.shard, rep.to_json()).map_err(out_err)?;
    }
    Ok(clean)
}

// ---------------------------------------------------------------------------------
// Key index (`inspect key`)

/// An `inspect key` lookup: the key, the store-time range (inclusive) and the index
/// geometry the files were written with (RocketMQ's files do not record it).
#[derive(Debug, Clone)]
pub struct KeyQuery {
    pub topic: String,
    pub key: String,
    pub begin: i64,
    pub end: i64,
    pub slots: u32,
    pub entries: u32,
}

/// One record found through an index file.
#[derive(Debug, Clone)]
pub struct KeyHit {
    pub index_file: String,
    pub record: RecordInfo,
}

/// The records of `q.topic` carrying `q.key` (a `KEYS` part or `UNIQ_KEY`) stored
/// within the range, found through the index files of the store at `root`, newest
/// first, each verified against the record itself. Both index-key forms are tried
/// (`topic#key`, and `topic#U#key` for stores written by newer RocketMQ). Returns
/// the hits and the problems met (files of another size, unreadable records).
pub fn key_hits(root: &Path, q: &KeyQuery) -> Result<(Vec<KeyHit>, Vec<String>)> {
    use crate::format::index_file::{self as ixf, Geometry, IndexEntry, IndexHeader};
    let geo = Geometry {
        slots: q.slots,
        entries: q.entries,
    };
    let dir = root.join("index");
    let mut problems = Vec::new();
    let mut names: Vec<String> = match std::fs::read_dir(&dir) {
        Ok(rd) => rd
            .filter_map(|e| e.ok()?.file_name().to_str().map(str::to_string))
            .filter(|n| ixf::parse_file_name(n).is_some())
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((Vec::new(), problems)),
        Err(e) => return Err(Error::io("list", &dir, 0, e)),
    };
    names.sort_unstable_by(|a, b| b.cmp(a));
    let log = LogFiles::open(root)?;
    let mut hashes = vec![ixf::key_hash(&q.topic, &q.key)];
    let typed = ixf::typed_uniq_key_hash(&q.topic, &q.key);
    if typed != hashes[0] {
        hashes.push(typed);
    }
    let mut seen = std::collections::HashSet::new();
    let mut hits = Vec::new();
    for name in names {
        let path = dir.join(&name);
        let file = File::open(&path).map_err(|e| Error::io("open", &path, 0, e))?;
        let len = file
            .metadata()
            .map_err(|e| Error::io("stat", &path, 0, e))?
            .len();
        if len != geo.file_len() {
            problems.push(format!(
                "{}: {len} bytes, not {} (pass the store's --index-slots and --index-entries)",
                path.display(),
                geo.file_len()
            ));
            continue;
        }
        let read = |pos: u64, n: usize| {
            read_full_at(&file, pos, n).map_err(|e| Error::io("read", &path, pos, e))
        };
        let Ok(h) = IndexHeader::decode(&read(0, ixf::HEADER_LEN)?) else {
            problems.push(format!("{}: damaged header", path.display()));
            continue;
        };
        if !h.has_entries() || h.begin_timestamp > q.end || h.end_timestamp < q.begin {
            continue;
        }
        for &hash in &hashes {
            let slot = read(geo.slot_pos(geo.slot_of(hash)), 4)?;
            let mut i = crate::format::be_i32(&slot, 0).unwrap_or(0);
            while geo.valid_link(i, h.index_count) {
                let Ok(e) = IndexEntry::decode(&read(geo.entry_pos(i as u32), ixf::ENTRY_LEN)?)
                else {
                    break;
                };
                let t = e.time(&h);
                if t.saturating_add(999) < q.begin {
                    break;
                }
                if e.key_hash == hash
                    && t <= q.end
                    && e.phy_offset >= 0
                    && seen.insert(e.phy_offset)
                {
                    let at = e.phy_offset as u64;
                    match read_record(&log, at) {
                        Ok(raw) => {
                            if let Ok(Decoded::Record(r)) =
                                record::decode(&raw, log.verify(at, true))
                            {
                                let key_ok = ixf::has_key(
                                    r.property(properties::UNIQ_KEY),
                                    r.keys(),
                                    &q.key,
                                );
                                if r.topic == q.topic
                                    && key_ok
                                    && (q.begin..=q.end).contains(&r.store_timestamp)
                                {
                                    hits.push(KeyHit {
                                        index_file: name.clone(),
                                        record: RecordInfo::new(at, &r, None),
                                    });
                                }
                            }
                        }
                        Err(why) => {
                            // Removed by retention or lost with a torn tail: not a hit.
                            if at >= log.min_offset() {
                                problems.push(format!(
                                    "{name}: entry {i} -> commit-log offset {at}: {why}"
                                ));
                            }
                        }
                    }
                }
                if e.prev_index >= i {
                    break;
                }
                i = e.prev_index;
            }
        }
    }
    hits.sort_by_key(|h| std::cmp::Reverse((h.record.store_timestamp, h.record.offset)));
    Ok((hits, problems))
}

/// `inspect key`: one JSON line per hit (the record as `inspect records` shows it,
/// plus `index_file`), then one `{"problem"}` line per problem. Returns `true` if
/// some root had a hit.
pub fn print_key(dir: &Path, q: &KeyQuery, out: &mut impl Write) -> Result<bool> {
    let mut found = false;
    for root in roots(dir)? {
        let (hits, problems) = key_hits(&root.path, q)?;
        for h in hits {
            found = true;
            let mut v = h.record.to_json();
            v["index_file"] = json!(h.index_file);
            emit(out, root.shard, v).map_err(out_err)?;
        }
        for p in problems {
            emit(out, root.shard, json!({ "problem": p })).map_err(out_err)?;
        }
    }
    Ok(found)
}
