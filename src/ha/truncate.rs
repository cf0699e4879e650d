//! Cutting a slave back to its master's end, offline: the way back after a divergence
//! (RocketMQ has no such step: its slave silently keeps the bytes its master lost).
//!
//! `coremq ha truncate --data-dir DIR --to OFFSET` (or [`truncate`]) on a stopped store:
//! finds the shard that owns `OFFSET` (`<DIR>/shard-<i>`, or `DIR` itself when it is a
//! lone store root), checks that `OFFSET` is a record boundary of its log (walking the
//! records of its segment from the segment's start), copies `[OFFSET, end)` to
//! `lost+found/commitlog-<OFFSET>` (synced), zeroes it, removes the segments past it,
//! lowers the checkpoint's positions and the flush mark to at most `OFFSET` and marks the store as not
//! cleanly shut down, so the next open recovers from there (its queues and key index
//! are cut back to the log's new end by recovery). Nothing is changed when a check
//! fails.

use crate::error::{Error, Result};
use crate::format::Corruption;
use crate::format::checkpoint::{CHECKPOINT_LEN, Checkpoint};
use crate::format::record::{self, Decoded, Verify};
use crate::io::{offset_name, parse_offset_name};
use crate::shard::shard_of_offset;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// What [`truncate`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Truncated {
    /// The store root (shard directory) that was cut.
    pub root: PathBuf,
    /// The log's end before the cut.
    pub old_end: u64,
    /// Bytes kept in `lost+found` (0 when the log already ended there).
    pub kept: u64,
    pub lost_found: Option<PathBuf>,
}

/// Cuts the log owning `to` back to `to` (module docs). The store must not be open.
pub fn truncate(data_dir: &Path, to: u64) -> Result<Truncated> {
    let shard_dir = data_dir.join(format!("shard-{}", shard_of_offset(to)));
    let root = if shard_dir.join("commitlog").is_dir() {
        shard_dir
    } else {
        data_dir.to_path_buf()
    };
    // A sharded store's root lock and the shard's own: neither may be open.
    let _outer = (root != data_dir)
        .then(|| crate::io::lock_root(data_dir))
        .transpose()?;
    let _lock = crate::io::lock_root(&root)?;
    let dir = root.join("commitlog");
    let mut segs: Vec<(u64, PathBuf)> = std::fs::read_dir(&dir)
        .map_err(|e| Error::io("read dir", &dir, 0, e))?
        .filter_map(|e| {
            let e = e.ok()?;
            Some((parse_offset_name(e.file_name().to_str()?)?, e.path()))
        })
        .collect();
    segs.sort();
    let Some((_, first_path)) = segs.first() else {
        return Err(Error::BadRequest(format!(
            "{} holds no commit log",
            root.display()
        )));
    };
    let seg_bytes = std::fs::metadata(first_path)
        .map_err(|e| Error::io("stat", first_path, 0, e))?
        .len();
    let seg_start = to / seg_bytes * seg_bytes;
    let end = log_end(&segs, seg_bytes)?;
    if to > end {
        return Err(Error::BadRequest(format!(
            "the log in {} ends at {end}, below {to}: nothing to cut",
            root.display()
        )));
    }
    check_boundary(&segs, seg_start, to)?;
    let mut kept = 0;
    let mut lost_found = None;
    if to < end {
        let bytes = read_range(&segs, seg_bytes, to, end)?;
        let lf = root.join("lost+found");
        std::fs::create_dir_all(&lf).map_err(|e| Error::io("create dir", &lf, 0, e))?;
        let path = lf.join(format!("commitlog-{}", offset_name(to)));
        crate::io::Disk::Real.write_file_durable(&path, &bytes)?;
        kept = bytes.len() as u64;
        lost_found = Some(path);
    }
    for (start, path) in &segs {
        if *start > seg_start {
            std::fs::remove_file(path).map_err(|e| Error::io("remove", path, 0, e))?;
        } else if *start == seg_start {
            zero_from(path, to - start, seg_bytes)?;
        }
    }
    crate::io::Disk::Real.sync_dir(&dir)?;
    lower_checkpoint(&root, to)?;
    lower_flush_mark(&root, to)?;
    crate::io::Disk::Real.write_file_durable(&root.join("abort"), b"truncated")?;
    tracing::warn!(root = %root.display(), to, old_end = end, kept, "commit log truncated");
    Ok(Truncated {
        root,
        old_end: end,
        kept,
        lost_found,
    })
}

fn read_at(path: &Path, pos: u64, len: usize) -> Result<Vec<u8>> {
    let mut f = std::fs::File::open(path).map_err(|e| Error::io("open", path, pos, e))?;
    f.seek(SeekFrom::Start(pos))
        .map_err(|e| Error::io("seek", path, pos, e))?;
    let mut out = Vec::with_capacity(len);
    f.take(len as u64)
        .read_to_end(&mut out)
        .map_err(|e| Error::io("read", path, pos, e))?;
    Ok(out)
}

/// Where the records end: the walk of the last segment (and of the one before it, when
/// the last holds nothing).
fn log_end(segs: &[(u64, PathBuf)], seg_bytes: u64) -> Result<u64> {
    for (start, path) in segs.iter().rev() {
        let bytes = read_at(path, 0, seg_bytes as usize)?;
        let mut pos = 0usize;
        while pos < bytes.len() {
            match record::decode(
                &bytes[pos..],
                Verify::framing(start + pos as u64, usize::MAX),
            ) {
                Ok(Decoded::Record(r)) => pos += r.total_size as usize,
                Ok(Decoded::Blank(n)) => {
                    pos += n as usize;
                    break;
                }
                Err(_) => break,
            }
        }
        if pos > 0 {
            return Ok(start + pos as u64);
        }
    }
    Ok(segs.first().map_or(0, |s| s.0))
}

/// `to` must be a record's first byte (or the end of the records) in its segment.
fn check_boundary(segs: &[(u64, PathBuf)], seg_start: u64, to: u64) -> Result<()> {
    let Some((_, path)) = segs.iter().find(|(s, _)| *s == seg_start) else {
        return Err(Error::BadRequest(format!(
            "no commit-log segment holds offset {to}"
        )));
    };
    let bytes = read_at(path, 0, (to - seg_start) as usize)?;
    let mut pos = 0usize;
    while (pos as u64) < to - seg_start {
        match record::decode(
            &bytes[pos..],
            Verify::checksums(seg_start + pos as u64, usize::MAX, false),
        ) {
            Ok(Decoded::Record(r)) => pos += r.total_size as usize,
            // The record at `pos` runs past `to`.
            Err(Corruption::Truncated) => break,
            other => {
                let kind = other
                    .err()
                    .unwrap_or(Corruption::BadMagic(record::BLANK_MAGIC));
                return Err(Error::Corrupt {
                    path: path.clone(),
                    offset: pos as u64,
                    kind,
                    detail: Some(format!("offset {to} is not a record boundary of this log")),
                });
            }
        }
    }
    if pos as u64 != to - seg_start {
        return Err(Error::BadRequest(format!(
            "offset {to} falls inside the record at {}",
            seg_start + pos as u64
        )));
    }
    Ok(())
}

fn read_range(segs: &[(u64, PathBuf)], seg_bytes: u64, from: u64, to: u64) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut pos = from;
    while pos < to {
        let seg = pos / seg_bytes * seg_bytes;
        let n = (to.min(seg + seg_bytes) - pos) as usize;
        if let Some((_, path)) = segs.iter().find(|(s, _)| *s == seg) {
            out.extend(read_at(path, pos - seg, n)?);
        }
        pos += n as u64;
    }
    Ok(out)
}

fn zero_from(path: &Path, at: u64, seg_bytes: u64) -> Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| Error::io("open", path, at, e))?;
    f.seek(SeekFrom::Start(at))
        .map_err(|e| Error::io("seek", path, at, e))?;
    let zeros = vec![0u8; 1 << 20];
    let mut pos = at;
    while pos < seg_bytes {
        let n = (seg_bytes - pos).min(zeros.len() as u64) as usize;
        f.write_all(&zeros[..n])
            .map_err(|e| Error::io("write zeros", path, pos, e))?;
        pos += n as u64;
    }
    f.sync_data()
        .map_err(|e| Error::io("fdatasync", path, at, e))
}

/// Nor may the flush mark: recovery would refuse the cut bytes as damaged durable data.
/// The lowered mark goes in as the next write (the other slot), so the newest valid
/// slot is the lowered one.
fn lower_flush_mark(root: &Path, to: u64) -> Result<()> {
    use crate::format::flush_mark::FlushMark;
    use std::os::unix::fs::FileExt;
    let path = root.join("flushmark");
    let Ok(bytes) = std::fs::read(&path) else {
        return Ok(());
    };
    let Ok(Some(mark)) = FlushMark::latest(&bytes) else {
        return Ok(());
    };
    if mark.flushed <= to {
        return Ok(());
    }
    let lowered = FlushMark {
        sequence: mark.sequence + 1,
        flushed: to,
    };
    let at = FlushMark::slot_offset(lowered.sequence);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .map_err(|e| Error::io("open", &path, 0, e))?;
    f.write_all_at(&lowered.encode(), at)
        .map_err(|e| Error::io("write", &path, at, e))?;
    f.sync_data()
        .map_err(|e| Error::io("fdatasync", &path, at, e))
}

/// The checkpoint may not vouch for bytes past the cut.
fn lower_checkpoint(root: &Path, to: u64) -> Result<()> {
    let path = root.join("checkpoint");
    let Ok(bytes) = std::fs::read(&path) else {
        return Ok(());
    };
    let Ok((mut cp, trusted)) = Checkpoint::decode(&bytes) else {
        return Ok(());
    };
    if !trusted {
        return Ok(());
    }
    cp.log_flushed_offset = cp.log_flushed_offset.min(to);
    cp.dispatch_safe_offset = cp.dispatch_safe_offset.min(to);
    let out = cp.encode();
    debug_assert_eq!(out.len(), CHECKPOINT_LEN);
    crate::io::Disk::Real.replace_file(&path, &out)
}
