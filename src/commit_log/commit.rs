//! The commit: RocketMQ's `CommitRealTimeService`, which moves the write buffers'
//! bytes to the segment files and advances **committed**.
//!
//! A round writes `[align_down(committed), target)`: a sealed buffer not yet touched
//! goes whole, with no copy (`write_rc`); any other range (the open buffer, or a sealed
//! one whose head was committed already) is copied page-aligned into a fresh DMA buffer,
//! because puts keep appending to the open buffer while the write is in flight. The
//! partial last page is written padded with zeros and rewritten by the next round.
//! Copying every commit was the bottleneck this shape removed (411 MB/s with 16 KiB
//! bodies, most of it page faults and memmove).
//!
//! Async mode commits only sealed buffers until `commit_interval` passes (or a flush is
//! due), so a busy log is written in whole 4 MiB buffers instead of rewriting the open
//! buffer's partial page every few KiB: this replaces RocketMQ's "commit least pages".
//! At most `commit_max_inflight` writes of `commit_chunk_bytes` are in flight. A
//! commit never writes where the prewriter is writing (`wait_prewrite_clear`).

use super::CommitLog;
use crate::commit_log::transient_store_pool::WriteBuffer;
use crate::error::Result;
use crate::io::{File, align_down, align_up};
use crate::wake::join_all;
use glommio::allocate_dma_buffer;
use glommio::io::DmaBuffer;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;

/// One write of a commit round.
enum CommitJob {
    /// `data` bytes of window `idx` from `off`, copied into a page-aligned buffer of
    /// `len` bytes (zero-padded) when the write is about to start.
    Copy {
        idx: u64,
        off: usize,
        data: usize,
        len: usize,
    },
    Whole(Rc<DmaBuffer>),
}

/// A commit's copy goes in pieces of this size, with a yield between them (a bounded
/// background turn ends there: `crate::shard::turns`). Copying all of a round's chunks
/// in one poll, before any write began, held the shard for 1.3-1.5 ms of CPU when the
/// open buffer was committed on the interval (40,000 paced puts a second on one shard);
/// in pieces its longest turn was 0.2-0.3 ms (three runs each, instrumented glommio).
const COPY_PIECE: usize = 128 << 10;

type Write<'a> = Pin<Box<dyn Future<Output = Result<()>> + 'a>>;

impl CommitLog {
    /// One commit round: writes `[align_down(committed), target)` to the files, where
    /// `target` is `written` if `partial`, else the end of the sealed buffers.
    /// Returns whether anything was written.
    pub(super) async fn commit_once(&self, partial: bool) -> Result<bool> {
        let start = self.committed.get();
        let limit = |log: &CommitLog| {
            if partial {
                log.written.get()
            } else {
                log.written.get().min(log.sealed_end())
            }
        };
        let target = limit(self);
        if target <= start {
            return Ok(false);
        }
        let last_seg = self.segment_start(target - 1);
        self.ensure_segments(start, last_seg).await?;
        let target = limit(self).min(last_seg + self.seg_bytes);
        self.wait_prewrite_clear(target).await;
        let ts = self.last_put_ts.get();
        let mut writes = self.plan_commit(start, target).into_iter();
        loop {
            let batch: Vec<Write<'_>> = writes
                .by_ref()
                .take(self.cfg.commit_max_inflight)
                .map(|(file, at, job)| {
                    Box::pin(async move {
                        match job {
                            CommitJob::Copy {
                                idx,
                                off,
                                data,
                                len,
                            } => {
                                let buf = self.copy_out(idx, off, data, len).await;
                                file.write_buf(at, buf).await
                            }
                            CommitJob::Whole(rc) => file.write_rc(at, rc).await,
                        }
                    }) as Write
                })
                .collect();
            if batch.is_empty() {
                break;
            }
            for r in join_all(batch).await {
                r?;
            }
        }
        self.advance(target, ts, false);
        // Keep one segment ahead so the commit path rarely creates files.
        self.ensure_segment(last_seg + self.seg_bytes).await?;
        Ok(true)
    }

    /// The writes that move `[align_down(start), target)` to the files: sealed buffers
    /// not yet touched go whole and uncopied; other ranges are copied page-aligned.
    fn plan_commit(&self, start: u64, target: u64) -> Vec<(Rc<File>, u64, CommitJob)> {
        let chunk = self.cfg.commit_chunk_bytes as u64;
        let p = self.pool.borrow();
        let mut writes = Vec::new();
        let mut pos = align_down(start);
        while pos < target {
            let idx = pos / self.buf_bytes;
            let win_start = idx * self.buf_bytes;
            let win_end = win_start + self.buf_bytes;
            let seg = self.segment_start(pos);
            let file = self
                .segment_file(seg)
                .expect("segments ensured before planning");
            let buf = p.get(idx).expect("uncommitted bytes are resident");
            if let (WriteBuffer::Sealed(rc), true) = (buf, pos == win_start && target >= win_end) {
                writes.push((file, pos - seg, CommitJob::Whole(rc.clone())));
                pos = win_end;
                continue;
            }
            let end = target.min(win_end).min(pos + chunk);
            let job = CommitJob::Copy {
                idx,
                off: (pos - win_start) as usize,
                data: (end - pos) as usize,
                len: align_up(end - pos) as usize,
            };
            writes.push((file, pos - seg, job));
            pos = end;
        }
        writes
    }

    /// `data` bytes of window `idx` from `off` in a new DMA buffer of `len` bytes, the
    /// rest zeros (the padding of a partial last page, whatever a recycled buffer holds
    /// there; the next commit rewrites the page). Copied in `COPY_PIECE`s with a yield
    /// between: the bytes below `written` do not change, and the window stays resident
    /// until committed.
    async fn copy_out(&self, idx: u64, off: usize, data: usize, len: usize) -> DmaBuffer {
        let mut copy = allocate_dma_buffer(len);
        let mut done = 0;
        while done < data {
            glommio::yield_if_needed().await;
            let n = (data - done).min(COPY_PIECE);
            let p = self.pool.borrow();
            let buf = p.get(idx).expect("uncommitted bytes are resident");
            copy.as_bytes_mut()[done..done + n]
                .copy_from_slice(&buf.bytes()[off + done..off + done + n]);
            done += n;
        }
        copy.as_bytes_mut()[data..].fill(0);
        copy
    }
}
