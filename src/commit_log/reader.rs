//! Reading the log: RocketMQ's `CommitLog.getData`/`getMessage` over its mapped
//! files, here over the write buffers and the segment files.
//!
//! * [`CommitLog::read`]/[`CommitLog::read_into`] copy `[off, off + len)`: bytes in a
//!   resident write buffer from memory, the rest from the segment files (every byte not
//!   resident is committed, so it is in its file).
//! * [`CommitLog::with_resident`] lends the bytes of a resident buffer in place: the
//!   dispatcher decodes records there instead of copying them out (that copy was ~4.5%
//!   of the CPU per 1 KiB put).
//! * [`LogReader`] reads the log sequentially for recovery: [`READ_AHEAD_DEPTH`] reads
//!   of [`READ_AHEAD_BYTES`] in flight, what fio needs to reach the disk's sequential
//!   read rate here (`scripts/bench.sh` reads 1 MiB at iodepth 8), records handed out
//!   as slices of the read buffers; only a record spanning two reads is copied (one
//!   read in flight, copied into fresh memory, spent ~30% of the scan in page faults
//!   and zeroing; `docs/performance/commit_log.md`, "Recovery scan").
//!
//! Catch-up reads of older data go through the read cache (`read_cache.rs`) when the
//! store asks for it; this file never caches.

use super::CommitLog;
use crate::error::{Error, Result};
use crate::format::Corruption;
use crate::format::record;
use crate::io::{self, File, align_down, align_up};
use bytes::Bytes;
use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;

impl CommitLog {
    /// Whether `off` lies in a write buffer held in memory (a read there copies, no
    /// I/O).
    pub fn is_resident(&self, off: u64) -> bool {
        self.pool.borrow().get(off / self.buf_bytes).is_some()
    }

    /// Reads `[off, off+len)`: resident buffers from memory, the rest from files.
    pub async fn read(&self, off: u64, len: usize) -> Result<Bytes> {
        let mut out = Vec::with_capacity(len);
        self.read_into(off, len, &mut out).await?;
        Ok(Bytes::from(out))
    }

    /// [`CommitLog::read`] into `out` (cleared first), so a caller that reads again
    /// and again (the dispatcher) reuses one buffer instead of allocating 1 MiB each
    /// time.
    pub async fn read_into(&self, off: u64, len: usize, out: &mut Vec<u8>) -> Result<()> {
        out.clear();
        let end = off + len as u64;
        if end > self.written.get() || off < self.min_offset.get() {
            return Err(Error::Corrupt {
                path: self.dir.clone(),
                offset: off,
                kind: Corruption::Truncated,
                detail: Some(format!(
                    "read [{off}, {end}) outside the log [{}, {})",
                    self.min_offset.get(),
                    self.written.get()
                )),
            });
        }
        let mut pos = off;
        while pos < end {
            let idx = pos / self.buf_bytes;
            let piece_end = end.min((idx + 1) * self.buf_bytes);
            let n = (piece_end - pos) as usize;
            let resident = match self.pool.borrow().get(idx) {
                Some(buf) => {
                    let o = (pos % self.buf_bytes) as usize;
                    out.extend_from_slice(&buf.bytes()[o..o + n]);
                    true
                }
                None => false,
            };
            if !resident {
                debug_assert!(piece_end <= self.committed.get());
                let seg = self.segment_start(pos);
                let file = self.segment_file(seg).ok_or_else(|| Error::Corrupt {
                    path: self.segment_path(seg),
                    offset: pos - seg,
                    kind: Corruption::Truncated,
                    detail: Some("segment file missing".into()),
                })?;
                let r = file.read(pos - seg, n).await?;
                if r.len() < n {
                    return Err(Error::Corrupt {
                        path: file.path.clone(),
                        offset: pos - seg,
                        kind: Corruption::Truncated,
                        detail: Some("short read inside the log".into()),
                    });
                }
                out.extend_from_slice(&r[..n]);
            }
            pos = piece_end;
        }
        Ok(())
    }

    /// Runs `f` on the bytes `[off, off + len)` cut at the end of their buffer, when
    /// that buffer is resident and the bytes are written; `None` otherwise (module
    /// docs).
    pub fn with_resident<R>(&self, off: u64, len: usize, f: impl FnOnce(&[u8]) -> R) -> Option<R> {
        let end = (off + len as u64).min(self.written.get());
        if off >= end || off < self.min_offset.get() {
            return None;
        }
        let idx = off / self.buf_bytes;
        let p = self.pool.borrow();
        let b = p.get(idx)?.bytes();
        let o = (off % self.buf_bytes) as usize;
        let n = (end.min((idx + 1) * self.buf_bytes) - off) as usize;
        Some(f(&b[o..o + n]))
    }
}

/// Size of one recovery read, and how many are kept in flight (module docs).
pub const READ_AHEAD_BYTES: u64 = 1 << 20;
pub const READ_AHEAD_DEPTH: usize = 8;

type PendingRead = Pin<Box<dyn Future<Output = Result<io::ReadBuf>>>>;

/// A read of the read-ahead pipeline: submitted (glommio queues the request when the
/// future is first polled), or already finished.
enum Slot {
    Pending(PendingRead),
    Ready(Result<io::ReadBuf>),
}

/// Reads the log sequentially from `from` up to `limit` (or the first missing
/// segment) for recovery: `READ_AHEAD_DEPTH` reads of `READ_AHEAD_BYTES` in flight,
/// records handed out as slices of the read buffers. Only a record that spans two
/// reads is copied (into `stitch`). Reads never cross a segment's end.
pub struct LogReader {
    segments: BTreeMap<u64, Rc<File>>,
    seg_bytes: u64,
    /// Next log offset to request, and where requests stop.
    next: u64,
    limit: u64,
    inflight: VecDeque<(u64, Slot)>,
    /// The read holding the current position: (log offset of its first byte, bytes).
    cur: Option<(u64, io::ReadBuf)>,
    /// A record that spans reads, copied together: it starts at log offset
    /// `stitch_at`; `copied_to` is the log offset of the next byte to copy into it.
    stitch: Vec<u8>,
    stitch_at: u64,
    copied_to: u64,
}

impl LogReader {
    pub fn new(log: &CommitLog, from: u64, limit: u64) -> LogReader {
        LogReader {
            segments: log.segments.borrow().clone(),
            seg_bytes: log.seg_bytes,
            next: align_down(from),
            limit,
            inflight: VecDeque::new(),
            cur: None,
            stitch: Vec::new(),
            stitch_at: 0,
            copied_to: 0,
        }
    }

    /// Issues reads until `READ_AHEAD_DEPTH` are in flight.
    async fn refill(&mut self) {
        while self.inflight.len() < READ_AHEAD_DEPTH && self.next < self.limit {
            let seg = self.next / self.seg_bytes * self.seg_bytes;
            let Some(file) = self.segments.get(&seg).cloned() else {
                self.limit = self.next;
                break;
            };
            let seg_end = seg + self.seg_bytes;
            let end = (self.next / READ_AHEAD_BYTES + 1)
                .saturating_mul(READ_AHEAD_BYTES)
                .min(seg_end)
                .min(align_up(self.limit));
            let (pos, len) = (self.next - seg, (end - self.next) as usize);
            let mut fut: PendingRead = Box::pin(async move { file.read(pos, len).await });
            let slot = match futures_lite::future::poll_once(&mut fut).await {
                Some(r) => Slot::Ready(r),
                None => Slot::Pending(fut),
            };
            self.inflight.push_back((self.next, slot));
            self.next = end;
        }
    }

    /// Waits for the reads still in flight (their results are not needed).
    pub async fn finish(mut self) {
        while let Some((_, slot)) = self.inflight.pop_front() {
            if let Slot::Pending(f) = slot {
                let _ = f.await;
            }
        }
    }

    /// Makes the next read current; `false` when there is none (the end of `limit`,
    /// or a missing segment).
    async fn advance(&mut self) -> Result<bool> {
        self.refill().await;
        let Some((at, slot)) = self.inflight.pop_front() else {
            self.cur = None;
            return Ok(false);
        };
        self.refill().await;
        let buf = match slot {
            Slot::Ready(r) => r?,
            Slot::Pending(f) => f.await?,
        };
        self.cur = Some((at, buf));
        Ok(true)
    }

    /// The bytes of the record at `pos`, at most `room` of them (the rest of its
    /// segment or range): as many as its header says when that is a record's size
    /// (`MIN_RECORD_LEN..=max_total`), else the 8 header bytes (a blank, or junk for
    /// `record::decode` to name).
    pub async fn record(&mut self, pos: u64, room: usize, max_total: usize) -> Result<&[u8]> {
        let want = match record::peek_header(self.bytes(pos, 8.min(room)).await?) {
            Ok((size, magic))
                if (magic == record::MAGIC_V1 || magic == record::MAGIC_V2)
                    && size as usize >= record::MIN_RECORD_LEN
                    && size as usize <= max_total =>
            {
                (size as usize).min(room)
            }
            _ => 8.min(room),
        };
        let buf = self.bytes(pos, want).await?;
        Ok(&buf[..buf.len().min(room)])
    }

    /// The bytes at `pos`: at least `want` of them when the log holds them (fewer at
    /// the end of what can be read), more when the current read has them. Positions
    /// must not go backwards between calls (asking again at the same position for
    /// more bytes is fine).
    pub async fn bytes(&mut self, pos: u64, want: usize) -> Result<&[u8]> {
        let stitch_end = self.stitch_at + self.stitch.len() as u64;
        if self.stitch.is_empty() || pos < self.stitch_at || pos >= stitch_end {
            self.stitch.clear();
            loop {
                if let Some((at, b)) = &self.cur {
                    if pos < *at || b.is_empty() {
                        return Ok(&[]);
                    }
                    if pos < at + b.len() as u64 {
                        break;
                    }
                }
                if !self.advance().await? {
                    return Ok(&[]);
                }
            }
            let (at, len) = match &self.cur {
                Some((at, b)) => (*at, b.len()),
                None => unreachable!("positioned on a read"),
            };
            let off = (pos - at) as usize;
            if len - off >= want {
                let Some((_, b)) = &self.cur else {
                    unreachable!()
                };
                return Ok(&b[off..]);
            }
            // The record spans reads: copy it together (the last read stays current).
            if let Some((_, b)) = &self.cur {
                self.stitch.extend_from_slice(&b[off..]);
            }
            self.stitch_at = pos;
            self.copied_to = at + len as u64;
        } else {
            self.stitch.drain(..(pos - self.stitch_at) as usize);
            self.stitch_at = pos;
            if self.stitch.len() >= want {
                return Ok(&self.stitch);
            }
        }
        loop {
            if let Some((at, b)) = &self.cur {
                let end = at + b.len() as u64;
                if (*at..end).contains(&self.copied_to) {
                    let from = (self.copied_to - at) as usize;
                    let n = (want - self.stitch.len()).min(b.len() - from);
                    self.stitch.extend_from_slice(&b[from..from + n]);
                    self.copied_to += n as u64;
                }
            }
            if self.stitch.len() >= want || !self.advance().await? {
                break;
            }
            match &self.cur {
                // Not contiguous (a segment boundary) or nothing read: stop here.
                Some((at, b)) if *at == self.copied_to && !b.is_empty() => {}
                _ => break,
            }
        }
        Ok(&self.stitch)
    }
}
