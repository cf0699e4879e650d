//! The log's segment files: RocketMQ's `MappedFileQueue` of `MappedFile`s, without the
//! mmap. A segment is `commit_log_segment_bytes` long, starts at a multiple of that
//! size and is named by its start offset in 20 digits, as RocketMQ names them.
//!
//! Invariants: the segments are contiguous (no gap between the first and the last),
//! every one has exactly the configured size (created sparse at full size, or a
//! zero-filled spare renamed into place, and synced with its directory entry before
//! anything is written to it), and a record never
//! spans two (the last bytes of a segment are a blank record). Segments are created by
//! the writer, one ahead of the write position, so no put waits for a file creation.

use super::CommitLog;
use crate::config::StoreConfig;
use crate::error::{Error, Result};
use crate::io::{self, File};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;

/// Opens the segments in `dir` (creating the directory), checking their names, sizes
/// and contiguity. A last segment of length 0 (a crash while creating it) is removed.
pub(super) async fn open_segments(
    cfg: &StoreConfig,
    dir: &Path,
) -> Result<BTreeMap<u64, Rc<File>>> {
    cfg.disk.create_dir_all(dir)?;
    let seg_bytes = cfg.commit_log_segment_bytes;
    let (files, other) = cfg.disk.list_offset_files(dir)?;
    if let Some(p) = other.first() {
        return Err(Error::BadLayout {
            path: p.clone(),
            why: "unexpected file in commitlog/ (segments are named by 20-digit offsets)".into(),
        });
    }
    let mut segments = BTreeMap::new();
    let mut expected: Option<u64> = None;
    let count = files.len();
    for (i, (start, path)) in files.into_iter().enumerate() {
        let len = cfg.disk.file_len(&path)?;
        if len == 0 && i + 1 == count {
            // A segment created but never sized (crash during creation).
            cfg.disk.remove_file(&path)?;
            cfg.disk.sync_dir(dir)?;
            continue;
        }
        if start % seg_bytes != 0 || len != seg_bytes {
            return Err(Error::BadLayout {
                path,
                why: format!(
                    "segment is {len} bytes at offset {start}; this store uses {seg_bytes}-byte \
                     segments (set commit_log_segment_bytes to the size the store was created with)"
                ),
            });
        }
        if let Some(exp) = expected.filter(|exp| *exp != start) {
            return Err(Error::BadLayout {
                path,
                why: format!("gap in the commit log: expected a segment at {exp}"),
            });
        }
        expected = Some(start + seg_bytes);
        segments.insert(start, cfg.disk.open(&path, false).await?);
    }
    Ok(segments)
}

impl CommitLog {
    pub(super) fn segment_start(&self, off: u64) -> u64 {
        off / self.seg_bytes * self.seg_bytes
    }

    /// The segment file and the position in it of commit-log offset `off`.
    pub fn locate(&self, off: u64) -> (PathBuf, u64) {
        let seg = self.segment_start(off);
        (self.segment_path(seg), off - seg)
    }

    pub(super) fn segment_path(&self, start: u64) -> PathBuf {
        self.dir.join(io::offset_name(start))
    }

    /// The segment file holding commit-log offset `off` and the position in it (for
    /// the read cache, which reads whole committed blocks itself).
    pub(crate) fn file_at(&self, off: u64) -> Option<(Rc<File>, u64)> {
        let seg = self.segment_start(off);
        self.segment_file(seg).map(|f| (f, off - seg))
    }

    pub(super) fn segment_file(&self, start: u64) -> Option<Rc<File>> {
        self.segments.borrow().get(&start).cloned()
    }

    /// Start of the last segment, if any.
    pub(super) fn last_segment(&self) -> Option<u64> {
        self.segments.borrow().keys().next_back().copied()
    }

    /// The segment file starting at `start`, if missing a spare renamed into place
    /// (`spare.rs`) or else created (sized, sparse).
    pub(super) async fn ensure_segment(&self, start: u64) -> Result<Rc<File>> {
        if let Some(f) = self.segment_file(start) {
            return Ok(f);
        }
        let f = match self.take_spare(start).await {
            Some(f) => f,
            None => {
                let path = self.segment_path(start);
                let f = self.cfg.disk.create_sized(&path, self.seg_bytes).await?;
                tracing::debug!(path = %path.display(), "created commit-log segment");
                self.spares.created.set(self.spares.created.get() + 1);
                f
            }
        };
        Ok(self.segments.borrow_mut().entry(start).or_insert(f).clone())
    }

    /// Ensures the segments from the one holding `start` through `last_seg` exist.
    pub(super) async fn ensure_segments(&self, start: u64, last_seg: u64) -> Result<()> {
        let mut s = self.segment_start(start);
        while s <= last_seg {
            self.ensure_segment(s).await?;
            s += self.seg_bytes;
        }
        Ok(())
    }

    /// Reads `len` bytes at `off` straight from the segment files (no write buffers);
    /// fewer at a missing segment or the end of a file.
    pub(super) async fn read_files(&self, off: u64, len: usize) -> Result<Vec<u8>> {
        let mut out = Vec::with_capacity(len);
        let mut pos = off;
        while out.len() < len {
            let seg = self.segment_start(pos);
            let Some(file) = self.segment_file(seg) else {
                break;
            };
            let want = (len - out.len()).min((seg + self.seg_bytes - pos) as usize);
            let r = file.read(pos - seg, want).await?;
            out.extend_from_slice(&r[..]);
            if r.len() < want {
                break;
            }
            pos += want as u64;
        }
        Ok(out)
    }

    /// Removes the segments that start past the one holding `end` (recovery's cut)
    /// and syncs the directory.
    pub(super) fn remove_segments_past(&self, end: u64) -> Result<()> {
        let keep_until = self.segment_start(end);
        let doomed: Vec<u64> = self
            .segments
            .borrow()
            .range(keep_until + 1..)
            .map(|(s, _)| *s)
            .collect();
        for s in doomed {
            let f = self.segments.borrow_mut().remove(&s).unwrap();
            self.cfg.disk.remove_file(&f.path)?;
            tracing::warn!(path = %f.path.display(), "removed commit-log segment past the recovered end");
        }
        self.cfg.disk.sync_dir(&self.dir)
    }
}
