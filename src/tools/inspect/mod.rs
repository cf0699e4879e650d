//! Offline inspection of a store directory: the operator's `coremq inspect` tool, and
//! the oracle the tests check the store against (RocketMQ has no such class: its
//! operators read the files with `mqadmin` and hex dumps).
//!
//! Everything here reads files with plain `std::fs` (no glommio, no lock, never a
//! write), so it works on a stopped coremq shard, on a RocketMQ store root, or on a
//! copy of either. On a store that is running the files change underneath the reader
//! and the tail may look torn; stop the store first for a trustworthy `check`.
//!
//! **Independent of the store's code.** It uses the pure codecs of [`crate::format`]
//! and [`crate::error`], never `store`, `commit_log`, `consume_queue`, `index`, `io` or
//! `shard`: a bug in the store's readers must not hide itself by being shared with
//! the checker. Where it needs a layout rule (the 20-digit file names, a shard's base
//! offset) it restates the documented rule ([`SHARD_SHIFT`]).
//!
//! `DIR` is either one store root (`commitlog/`, `consumequeue/`, `checkpoint`) or a
//! directory of `shard-<i>/` store roots ([`roots`]); each shard is inspected alone.
//!
//! * [`log`]: the CommitLog's segments and a verifying walk over its records;
//! * [`records`]: one record as `inspect records` shows it;
//! * [`queue`]: a ConsumeQueue's entries;
//! * [`check`]: everything cross-checked (records, queues, checkpoint);
//! * [`key`]: index-file lookups by message key.
//!
//! Memory stays bounded: records are streamed segment chunk by chunk, queues are
//! streamed entry by entry and their records read by offset; per queue only a few
//! counters are kept.

pub mod check;
pub mod key;
pub mod log;
pub mod queue;
pub mod records;

pub use check::{CheckReport, check, check_root};
pub use key::{KeyHit, KeyQuery, key_hits};
pub use log::{LogFiles, LogWalk, Problem, RecordVisit, walk_log};
pub use queue::{QueueEntry, QueueWalk, list_queues, queue_dir, queue_entries, walk_queue};
pub use records::{RecordInfo, records};

use crate::error::{Error, Result};
use serde_json::{Value, json};
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Bits of a commit-log offset below the shard number: shard `i`'s log starts at
/// `i << SHARD_SHIFT` (the documented layout, restated here rather than taken from
/// the sharding code this tool checks).
pub const SHARD_SHIFT: u32 = 56;

// ---------------------------------------------------------------------------------
// Store roots and files

/// One store root to inspect; `shard` is set inside a multi-shard directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Root {
    pub shard: Option<u32>,
    pub path: PathBuf,
}

impl Root {
    /// Where this root's CommitLog begins: its shard's base offset (0 for a lone root).
    pub fn base_offset(&self) -> u64 {
        self.shard.map_or(0, |s| u64::from(s) << SHARD_SHIFT)
    }
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

/// The paths in `dir`; nothing when `dir` does not exist.
fn entries(dir: &Path) -> Result<Vec<PathBuf>> {
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io("list", dir, 0, e)),
    };
    rd.map(|e| {
        e.map(|e| e.path())
            .map_err(|e| Error::io("list", dir, 0, e))
    })
    .collect()
}

/// The files of `dir` named by a 20-digit offset (CommitLog segments, ConsumeQueue
/// files), sorted by it; nothing when `dir` does not exist.
fn offset_files(dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let mut out: Vec<(u64, PathBuf)> = entries(dir)?
        .into_iter()
        .filter_map(|path| {
            let name = path.file_name()?.to_str()?;
            let named = name.len() == 20 && name.bytes().all(|b| b.is_ascii_digit());
            let offset = name.parse().ok().filter(|_| named && !path.is_dir())?;
            Some((offset, path))
        })
        .collect();
    out.sort();
    Ok(out)
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
