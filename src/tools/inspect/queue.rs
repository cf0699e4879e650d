//! ConsumeQueues as the inspector reads them (RocketMQ's `ConsumeQueue`: 20-byte
//! entries, files named by their first byte position).
//!
//! [`walk_queue`] walks one queue's entries from its first valid entry to the first
//! invalid one, skipping (and counting) RocketMQ's pre-blank entries. File sizes are
//! detected from the files (gap between file names, or the length of a lone file),
//! not assumed.

use super::{entries, offset_files};
use crate::error::{Error, Result};
use crate::format::consume_queue::{CqEntry, ENTRY_LEN};
use serde_json::{Value, json};
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

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
    let files = offset_files(&queue_dir(root, topic, queue_id))?;
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
    Ok(entries(dir)?.into_iter().filter(|p| p.is_dir()).collect())
}
