//! The writer task and the flush: RocketMQ's `FlushRealTimeService` (async flush),
//! and the loop that drives commit and flush by the flush mode's rules.
//!
//! One writer task per log ([`CommitLog::run_writer`]) runs one of three loops:
//! * **async flush**: commits sealed buffers at once and the open one every
//!   `commit_interval`; fdatasyncs every `flush_interval` once `flush_least_pages` are
//!   committed, or whatever is committed every `flush_thorough_interval` (RocketMQ's
//!   `flushLeastPages` and `flushPhysicQueueThoroughInterval`). While everything
//!   written is committed it sleeps until the next flush is due (none while everything
//!   is flushed), and the first byte appended after that wakes it (`append`), so an
//!   idle log costs no wake-ups (it woke every `commit_interval` to find nothing: an
//!   idle node's shards 21.6 -> 16.3 wake-ups a second; with a few bytes committed
//!   and awaiting the thorough flush, 21.7-22.4 -> 18.5-19.6);
//! * **sync flush on the writer task** (the simulated disk, and `RingWriteFdatasync`):
//!   group-commit rounds run here, each round starting as the last one ends.
//!   `DsyncWrite` copies the round out of the buffers and writes it with durable
//!   writes on the shard's dsync thread ([`File::write_durable`]; `sync_round`), the
//!   round ending at `written` (a record end) like the group-commit thread's;
//!   `RingWriteFdatasync` commits, then fdatasyncs, through the io_uring ring;
//! * **sync flush with the group-commit thread** (`DsyncWrite` on the real disk): the
//!   thread runs the rounds, and this task only keeps segments ahead of it and turns its
//!   progress into `committed`/`flushed` (`group_commit.rs`).
//!
//! The flush mark (`flush_mark.rs`) is written by the async flush round and, in sync
//! mode, by its own task that this one starts and waits for.
//!
//! A write or fdatasync error ends the loop: the log stops taking writes (fail-stop,
//! never a retried fdatasync), and `committed`/`flushed` are closed so waiting puts
//! return. The writer's task queue is chosen by the store (`Latency::Matters` in sync
//! mode); the prewriter runs in its own `NotImportant` queue.

use super::CommitLog;
use crate::config::{FlushMode, StoreConfig, SyncFlushIo};
use crate::error::Result;
use crate::io::{self, AlignedBuf, File, PAGE, align_down, align_up};
use crate::wake::join_all;
use std::rc::Rc;
use std::time::{Duration, Instant};

impl CommitLog {
    /// The writer task: commits and flushes by the flush mode's rules until stopped.
    /// In sync mode it runs the flush mark's task beside it (`flush_mark.rs`) and
    /// waits for its last write before it ends.
    pub async fn run_writer(self: Rc<Self>) {
        use glommio::{Latency, Shares, executor};
        // Its helper tasks are held as join handles, not tasks: an executor torn down
        // while this task still waits (a store dropped without shutdown) drops them
        // without cancelling, which needs the executor (a `Task` aborted the process
        // there: "cannot access a scoped thread local variable").
        let prewriter = if self.cfg.prewrite_bytes() > 0 {
            let tq = executor().create_task_queue(
                Shares::Static(100),
                Latency::NotImportant,
                "commit-log-prewrite",
            );
            glommio::spawn_local_into(self.clone().run_prewriter(), tq)
                .ok()
                .map(|t| t.detach())
        } else {
            None
        };
        let zeroer = if self.cfg.commit_log_spare_segments > 0 {
            let tq = executor().create_task_queue(
                Shares::Static(100),
                Latency::NotImportant,
                "commit-log-spare-zeroer",
            );
            glommio::spawn_local_into(self.clone().run_spare_zeroer(), tq)
                .ok()
                .map(|t| t.detach())
        } else {
            None
        };
        let marker = if self.cfg.flush_mode == FlushMode::Sync {
            let tq = executor().create_task_queue(
                Shares::Static(100),
                Latency::NotImportant,
                "commit-log-flush-mark",
            );
            glommio::spawn_local_into(self.clone().run_flush_mark(), tq)
                .ok()
                .map(|t| t.detach())
        } else {
            None
        };
        let threaded = self.cfg.flush_mode == FlushMode::Sync
            && self.cfg.sync_flush_io == SyncFlushIo::DsyncWrite
            && matches!(self.cfg.disk, io::Disk::Real);
        if threaded {
            // An empty log starts its group-commit thread at its first byte: until
            // then a slave may still move where the log begins (`restart_empty_at`).
            while self.written.get() == self.min_offset.get() && !self.stopping.get() {
                self.writer_wake.wait().await;
            }
        }
        let result = if threaded {
            self.run_group_commit().await
        } else {
            self.writer_loop().await
        };
        if let Err(e) = result {
            self.fail(e);
        }
        self.writer_done.set(true);
        self.mark_wake.notify();
        if let Some(m) = marker {
            m.await;
        }
        if let Some(e) = self.mark_failed.borrow_mut().take() {
            self.fail(e);
        }
        self.stopping.set(true);
        self.prewrite_wake.notify();
        if let Some(p) = prewriter {
            p.await;
        }
        self.wake_spare_zeroer();
        if let Some(z) = zeroer {
            z.await;
        }
    }

    /// Stops the log taking writes after `e` (fail-stop): puts and tasks waiting on
    /// `committed` or `flushed` return.
    fn fail(&self, e: crate::error::Error) {
        tracing::error!(error = %e, "commit log writer failed; the shard stops taking writes");
        self.failed.borrow_mut().get_or_insert(e.to_string());
        self.committed.close();
        self.flushed.close();
    }

    /// The error of a failed flush-mark write, once (the writer's loops end with it).
    pub(super) fn check_mark(&self) -> Result<()> {
        match self.mark_failed.borrow_mut().take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    async fn writer_loop(&self) -> Result<()> {
        let cfg = self.cfg.clone();
        let mut last_commit = Instant::now();
        let mut last_flush = Instant::now();
        let mut last_thorough = Instant::now();
        loop {
            self.writer_turns.set(self.writer_turns.get() + 1);
            self.check_mark()?;
            let stopping = self.stopping.get();
            let flush_now = self.flush_now.replace(false);
            let commit_now = self.commit_now.replace(false);
            let sync = cfg.flush_mode == FlushMode::Sync;
            let now = Instant::now();
            // Sealed buffers are committed at once; the open buffer's partial
            // content when a sync put waits, on the commit interval, or for a flush.
            let flush_time = now - last_flush >= cfg.flush_interval;
            let partial = sync
                || stopping
                || flush_now
                || commit_now
                || flush_time
                || now - last_commit >= cfg.commit_interval;
            if sync && cfg.sync_flush_io == SyncFlushIo::DsyncWrite {
                // Group commit: one durable write per round, the next round at once
                // with everything appended meanwhile.
                if self.sync_round().await? {
                    continue;
                }
                if stopping && self.flushed.get() == self.written.get() {
                    return Ok(());
                }
                futures_lite::future::or(
                    self.writer_wake.wait(),
                    glommio::timer::sleep(Duration::from_millis(10)),
                )
                .await;
                continue;
            }
            let commit_due = self.commit_once(partial).await?;
            if commit_due {
                last_commit = Instant::now();
            }
            let unflushed = self.committed.get() - self.flushed.get();
            let thorough = now - last_thorough >= cfg.flush_thorough_interval;
            let flush_at = timed_flush_at(&cfg, unflushed, last_flush, last_thorough);
            let flush_due = unflushed > 0 && (sync || stopping || flush_now || flush_at <= now);
            if flush_due {
                self.flush_once().await?;
                last_flush = Instant::now();
                if thorough {
                    last_thorough = last_flush;
                }
            }
            if stopping && self.flushed.get() == self.written.get() {
                return Ok(());
            }
            if !commit_due && !flush_due {
                if !sync && self.written.get() == self.committed.get() {
                    // Nothing to commit: until the next append (which wakes an idle
                    // writer, `append`), only time can make a flush due, so no timer
                    // before then (an idle writer woke every commit interval, 5 times a
                    // second per shard, to find nothing); none at all once everything
                    // written is flushed.
                    self.writer_idle.set(true);
                    if unflushed == 0 {
                        self.writer_wake.wait().await;
                    } else {
                        let left = flush_at.saturating_duration_since(Instant::now());
                        futures_lite::future::or(
                            self.writer_wake.wait(),
                            glommio::timer::sleep(left),
                        )
                        .await;
                    }
                    self.writer_idle.set(false);
                    continue;
                }
                let wait = if sync {
                    Duration::from_millis(10)
                } else {
                    cfg.commit_interval.min(cfg.flush_interval)
                };
                futures_lite::future::or(self.writer_wake.wait(), glommio::timer::sleep(wait))
                    .await;
            }
        }
    }

    /// One flush round: fdatasync every segment holding committed, unflushed bytes.
    /// In async mode the flush mark then records the new position before `flushed`
    /// moves (so what a returned `Store::flush` covered is below the mark); in sync
    /// mode (`RingWriteFdatasync`) the mark task does that, off the put path.
    async fn flush_once(&self) -> Result<()> {
        let start = self.flushed.get();
        let target = self.committed.get();
        if target == start {
            return Ok(());
        }
        let ts = self.committed_ts.get();
        let mut s = self.segment_start(start);
        while s < target {
            if let Some(f) = self.segment_file(s) {
                f.sync().await?;
            }
            s += self.seg_bytes;
        }
        if self.cfg.flush_mode == FlushMode::Async {
            self.write_flush_mark(target).await?;
        }
        self.flushed_ts.set(ts);
        self.flushed.set(target);
        Ok(())
    }

    /// One sync-flush round on the writer task ([`SyncFlushIo::DsyncWrite`] without
    /// the group-commit thread, i.e. on the simulated disk): makes `[align_down(committed),
    /// target)` durable, where `target` is `written` (or the end of a segment), so a
    /// round, like the group-commit thread's, ends on a record end and `flushed` is
    /// always one (recovery's refuse line is a record boundary: a round that ended inside
    /// a record put that record's torn tail below the line, and open refused). The
    /// bytes go as pieces of at most `commit_chunk_bytes` copied out of the buffers, at
    /// most `commit_max_inflight` in flight, each made durable by one
    /// [`File::write_durable`]; then committed and flushed move together. Pieces are
    /// page-aligned, so no two write the same page; rounds never overlap (a round
    /// rewrites the previous round's last page, and two in-flight writes of a page may
    /// land in either order). Returns whether anything was written.
    async fn sync_round(&self) -> Result<bool> {
        let start = self.committed.get();
        debug_assert_eq!(start, self.flushed.get());
        if self.written.get() <= start {
            return Ok(false);
        }
        let last_seg = self.segment_start(self.written.get() - 1);
        self.ensure_segments(start, last_seg).await?;
        // Puts may have appended while a segment was created: take them too, up to
        // the last segment ensured (its end is a record end: a blank ends there).
        let target = self.written.get().min(last_seg + self.seg_bytes);
        self.wait_prewrite_clear(target).await;
        let ts = self.last_put_ts.get();
        let chunk = self.cfg.commit_chunk_bytes as u64;
        let mut pieces = Vec::new();
        let mut pos = align_down(start);
        while pos < target {
            let seg = self.segment_start(pos);
            let end = target.min(seg + self.seg_bytes).min(pos + chunk);
            pieces.push((seg, pos, end));
            pos = end;
        }
        for batch in pieces.chunks(self.cfg.commit_max_inflight) {
            let mut writes = Vec::with_capacity(batch.len());
            for &(seg, pos, end) in batch {
                let len = align_up(end - pos) as usize;
                let mut buf = self.take_round_buf(len);
                let data = (end - pos) as usize;
                let bytes = buf.as_mut_slice();
                self.copy_from_buffers(pos, &mut bytes[..data]);
                // The padding of a partial last page: zeros, whatever the (recycled)
                // buffer holds there; the next round rewrites the page.
                bytes[data..].fill(0);
                let file: Rc<File> = self
                    .segment_file(seg)
                    .expect("segments ensured before planning");
                writes.push(async move { file.write_durable(pos - seg, buf).await });
            }
            for r in join_all(writes).await {
                self.round_bufs.borrow_mut().push(r?);
            }
        }
        self.advance(target, ts, true);
        // Keep one segment ahead so rounds rarely create files.
        self.ensure_segment(last_seg + self.seg_bytes).await?;
        Ok(true)
    }

    /// A reused round buffer of exactly `len` bytes (the caller zeroes its tail past
    /// the written position: the partial last page is written padded).
    fn take_round_buf(&self, len: usize) -> AlignedBuf {
        let mut bufs = self.round_bufs.borrow_mut();
        let mut buf = match bufs.iter().position(|b| b.capacity() >= len) {
            Some(i) => bufs.swap_remove(i),
            None => AlignedBuf::new(len.max(256 << 10)),
        };
        buf.set_len(len);
        buf
    }
}

/// When the async flush rules make a flush of `unflushed` committed bytes due: a
/// `flush_interval` after the last flush once `flush_least_pages` pages wait, else not
/// before a `flush_thorough_interval` after the last thorough one either.
fn timed_flush_at(
    cfg: &StoreConfig,
    unflushed: u64,
    last_flush: Instant,
    last_thorough: Instant,
) -> Instant {
    let at = last_flush + cfg.flush_interval;
    if unflushed >= cfg.flush_least_pages * PAGE as u64 {
        at
    } else {
        at.max(last_thorough + cfg.flush_thorough_interval)
    }
}
