//! The key index's flush: the current file's dirty pages made durable in the
//! crash-safe order of the index's module docs. RocketMQ's `IndexService` flushes
//! through `IndexFile.flush` (an msync of the mapped file, no order); here each step
//! is its own set of writes and ends with an fdatasync.
//!
//! * **Runs.** Adjacent dirty pages go as one write of up to 1 MiB ([`RUN_BYTES`]),
//!   16 writes in flight; page 0 and the page where slots end are written alone (they
//!   are written in steps). A flush that wrote one 4 KiB page at a time, one write at
//!   a time, let the dispatcher fall behind (see the module docs' figures).
//! * **One copy, straight into the writes' DMA buffers**: with one key per message
//!   nearly every slot page is dirty at every flush (~20 MB per shard per second), and
//!   a second copy (a `Vec`, then a DMA buffer in `File::write_aligned`) cost ~4% of
//!   the CPU per message.
//! * **A snapshot taken [`COPY_CHUNK_PAGES`] at a time** (64 KiB), consistent with
//!   the header the flush took (copy-on-write in the page set for pages written
//!   meanwhile), with a yield after each chunk when there is more than one: copying
//!   ~22 MB in one go held the shard 3.7-5.3 ms once a second (put p99 2.9-4.7 ms at
//!   250 k msg/s, 0.4-0.5 ms without the index); a 1 MiB run at a time still made
//!   the flush task's polls of over 250 us 76 in 6 s at 130 k msg/s (45.7 ms in all),
//!   128 KiB chunks 30-37 (17-21 ms). Those yields only end the flush's turn since its
//!   task queue's turns are bounded (`crate::shard::turns`): before, the chunks ran
//!   back to back in 5 ms turns (the preempt timer), put p99.9 5.2 ms at 60 k msg/s.
//!   A 128 KiB chunk into a fresh buffer took 70-330 us, hence 64 KiB. (Published
//!   glommio 0.9.0 could park with a yielded task runnable, and `tests/liveness.rs`
//!   hung in 2 of 5 runs with yields here; the vendored glommio fixes that.)
//! * **Whole-run buffers are reused** (at most a flush's worth): fresh ones cost a page
//!   fault per page, 11-15 ms of copying a second instead of 3.7-5.3 ms. Partial runs
//!   get fresh buffers (a 128 KiB copy into one took 32 faults, 70-330 us), so a run
//!   also takes up to [`MAX_GAP_PAGES`] clean pages between dirty ones and most runs
//!   are whole.
//!
//! Invariant: a page a flush took counts as clean from then on and is marked dirty
//! again if that flush fails or is dropped before its writes end, so no page that did
//! not reach the disk is ever dropped from the page set as clean.

use crate::error::Result;
use crate::format::index_file::{self, IndexHeader};
use crate::io::PAGE;
use glommio::io::DmaBuffer;
use glommio::{allocate_dma_buffer, allocate_dma_buffer_global};
use std::rc::Rc;

use super::file::IndexFile;
use super::page_set::SnapshotGuard;
use super::{IndexService, P};

/// Largest single write of a flush.
const RUN_BYTES: usize = 1 << 20;
/// A flush's snapshot is copied this many pages at a time (64 KiB), with a yield
/// after each when it has more.
const COPY_CHUNK_PAGES: u64 = 16;
/// Clean pages a run may take in between two dirty ones: with one key per message
/// ~97% of the slot pages are dirty at a flush, and runs cut at every clean page were
/// mostly partial, each copied into a fresh buffer (a page fault per page).
const MAX_GAP_PAGES: u64 = 8;
/// Writes of one step in flight together.
const WRITES_IN_FLIGHT: usize = 16;

/// The runs of a flush: (first page, pages), ascending.
type Spans = Vec<(u64, u64)>;

impl IndexService {
    /// Makes the current file durable up to now (see the module docs for the order).
    pub async fn flush(&self) -> Result<()> {
        let _permit = self.lock_flush().await?;
        self.flush_locked().await
    }

    /// [`IndexService::flush`] when due: at least the configured least pages
    /// changed (at most a quarter of the page set), or the thorough interval passed
    /// since the last flush (see the module docs for why).
    pub async fn flush_when_due(&self) -> Result<()> {
        if !self.flush_due(self.pages.borrow().dirty.len()) {
            return Ok(());
        }
        self.flush().await
    }

    /// Flushes that wrote something, and the writes they made.
    pub fn flush_counts(&self) -> (u64, u64) {
        (self.flushes.get(), self.flush_writes.get())
    }

    fn flush_due(&self, dirty_pages: usize) -> bool {
        let least = self.flush_least_pages.min(self.cap_pages / 4);
        dirty_pages >= least || self.last_flush.get().elapsed() >= self.flush_thorough_interval
    }

    /// [`IndexService::flush`] with the flush lock held.
    pub(super) async fn flush_locked(&self) -> Result<()> {
        let Some(f) = self.current() else {
            return Ok(());
        };
        let h = f.header.get();
        let boundary = self.boundary_page();
        let Some((spans, taken)) = self.begin_snapshot(h, boundary) else {
            self.last_flush.set(std::time::Instant::now());
            return Ok(());
        };
        // Should this future be dropped between runs, no page may keep a mark into
        // buffers the next flush would reuse.
        let guard = SnapshotGuard {
            pages: &self.pages,
            spans: &spans,
        };
        let snapshot_pages: u64 = spans.iter().map(|&(_, n)| n).sum();
        let yields = snapshot_pages > COPY_CHUNK_PAGES;
        for (r, &(start, n)) in spans.iter().enumerate() {
            let mut k = 0;
            while k < n {
                let m = (n - k).min(COPY_CHUNK_PAGES);
                self.pages.borrow_mut().copy_snapshot_pages(r, start, k, m);
                k += m;
                if yields {
                    futures_lite::future::yield_now().await;
                }
            }
        }
        std::mem::forget(guard);
        let bufs = std::mem::take(&mut self.pages.borrow_mut().snapshot);
        let mut runs: Vec<(u64, DmaBuffer)> =
            spans.iter().map(|&(start, _)| start).zip(bufs).collect();
        runs[0].1.as_bytes_mut()[..index_file::HEADER_LEN].copy_from_slice(&h.encode());
        let runs: Vec<(u64, Rc<DmaBuffer>)> =
            runs.into_iter().map(|(p, b)| (p, Rc::new(b))).collect();
        self.flushes.set(self.flushes.get() + 1);
        self.flush_writes
            .set(self.flush_writes.get() + runs.len() as u64);
        let r = self.write_snapshot(&f, &runs, boundary).await;
        self.keep_run_bufs(runs);
        if r.is_err() {
            // Not written: still dirty (never dropped as clean).
            if self.is_current(&f) {
                let mut pages = self.pages.borrow_mut();
                for p in taken {
                    pages.mark_dirty(p);
                }
            }
            return r;
        }
        if self.is_current(&f) {
            self.durable.set(h);
        }
        self.last_flush.set(std::time::Instant::now());
        Ok(())
    }

    /// The page where the slot table ends and the entries begin.
    fn boundary_page(&self) -> u64 {
        (self.geo.slots_end() - 1) / P
    }

    /// Takes the dirty pages (clean from here on) and starts the snapshot of them
    /// joined into runs, page 0 always first (it carries the header `h`); returns the
    /// runs and the pages taken, or `None` when there is nothing to write.
    fn begin_snapshot(&self, h: IndexHeader, boundary: u64) -> Option<(Spans, Vec<u64>)> {
        let alone = |q: u64| q == 0 || q == boundary;
        let mut pages = self.pages.borrow_mut();
        let mut dirty = std::mem::take(&mut pages.dirty);
        dirty.sort_unstable();
        let mut taken = Vec::with_capacity(dirty.len());
        let mut spans: Spans = Vec::new();
        for p in dirty {
            if !pages.take_for_flush(p) {
                continue;
            }
            taken.push(p);
            match spans.last_mut() {
                // The next dirty page joins the run, across a small gap of clean pages
                // present in the set (written again as they are on disk), so that most
                // runs are whole and take a kept buffer.
                Some((start, n))
                    if !alone(p)
                        && !alone(*start)
                        && p - (*start + *n) <= MAX_GAP_PAGES
                        && ((p - *start + 1) as usize) * PAGE <= RUN_BYTES
                        && (*start + *n..p).all(|q| !alone(q) && pages.has(q)) =>
                {
                    *n = p - *start + 1
                }
                _ => spans.push((p, 1)),
            }
        }
        if spans.is_empty() && h == self.durable.get() {
            return None;
        }
        if spans.first().is_none_or(|(p, _)| *p != 0) {
            // Page 0 holds the header (replaced by `h`) and the first slots.
            spans.insert(0, (0, 1));
        }
        let bufs: Vec<DmaBuffer> = spans
            .iter()
            .map(|&(_, n)| self.run_buf(n as usize * PAGE))
            .collect();
        pages.begin_snapshot(&spans, bufs);
        Some((spans, taken))
    }

    /// A buffer for a run of `len` bytes: a kept whole-run buffer for a whole run.
    fn run_buf(&self, len: usize) -> DmaBuffer {
        if len == RUN_BYTES {
            self.run_bufs
                .borrow_mut()
                .pop()
                .unwrap_or_else(|| allocate_dma_buffer_global(RUN_BYTES))
        } else {
            allocate_dma_buffer(len)
        }
    }

    /// Keeps a flush's whole-run buffers for the next flush, at most a flush's worth.
    fn keep_run_bufs(&self, runs: Vec<(u64, Rc<DmaBuffer>)>) {
        let mut pool = self.run_bufs.borrow_mut();
        let cap = self.cap_pages * PAGE / RUN_BYTES + 1;
        for (_, b) in runs {
            if let Ok(b) = Rc::try_unwrap(b)
                && b.len() == RUN_BYTES
                && pool.len() < cap
            {
                pool.push(b);
            }
        }
    }

    /// Writes a flush's runs of page copies (ascending; page 0 and the `boundary` page
    /// alone) in the crash-safe order of the index's module docs, each step ending
    /// with an fdatasync.
    async fn write_snapshot(
        &self,
        f: &IndexFile,
        runs: &[(u64, Rc<DmaBuffer>)],
        boundary: u64,
    ) -> Result<()> {
        // Step 1: pages holding only entries.
        if Self::write_runs(f, runs.iter().filter(|(p, _)| *p > boundary)).await? {
            f.file.sync().await?;
        }
        // Step 2: the page holding the last slots and the first entries. Its entries
        // land first (slots as on disk), so no slot ever names an entry whose sector
        // did not make it. (When it is page 0, the rest goes with page 0 below.)
        if let Some((p, data)) = runs.iter().find(|(p, _)| *p == boundary) {
            let slot_bytes = (self.geo.slots_end() - p * P) as usize;
            let on_disk = f.file.read(p * P, PAGE).await?;
            if on_disk.len() >= slot_bytes {
                let head = &on_disk[..slot_bytes];
                Self::write_changed_head(f, p * P, head, data.as_bytes()).await?;
            }
            if boundary != 0 {
                f.write_pages(p * P, data.as_bytes()).await?;
                f.mark_written(*p);
                f.file.sync().await?;
            }
        }
        // Step 3: the other slot pages.
        if Self::write_runs(f, runs.iter().filter(|(p, _)| *p < boundary && *p != 0)).await? {
            f.file.sync().await?;
        }
        // Steps 4 and 5: page 0 (header and slots, with a small slot table entries
        // too), whose sectors a power loss can tear apart. First with the header that
        // is on disk, so the new header then changes only its own sector: it never
        // lands without the slots and entries it counts.
        let (_, data) = runs
            .iter()
            .find(|(p, _)| *p == 0)
            .expect("page 0 is in every flush");
        let durable = self.durable.get();
        let old_header = if durable.index_count < 0 {
            [0u8; index_file::HEADER_LEN]
        } else {
            durable.encode()
        };
        Self::write_changed_head(f, 0, &old_header, data.as_bytes()).await?;
        f.write_pages(0, data.as_bytes()).await?;
        f.mark_written(0);
        f.file.sync().await?;
        Ok(())
    }

    /// Writes `page` at `pos` with its first bytes replaced by `head`, and syncs,
    /// unless that is `page` itself.
    async fn write_changed_head(f: &IndexFile, pos: u64, head: &[u8], page: &[u8]) -> Result<()> {
        if page[..head.len()] == *head {
            return Ok(());
        }
        let mut first = page.to_vec();
        first[..head.len()].copy_from_slice(head);
        f.write_pages(pos, &first).await?;
        f.file.sync().await
    }

    /// Writes runs of pages, [`WRITES_IN_FLIGHT`] at a time. `true` if anything was
    /// written.
    async fn write_runs<'a>(
        f: &IndexFile,
        runs: impl Iterator<Item = &'a (u64, Rc<DmaBuffer>)>,
    ) -> Result<bool> {
        let runs: Vec<&(u64, Rc<DmaBuffer>)> = runs.collect();
        for group in runs.chunks(WRITES_IN_FLIGHT) {
            let writes: Vec<_> = group
                .iter()
                .map(|(start, buf)| f.write_shared_pages(start * P, buf.clone()))
                .collect();
            for r in crate::wake::join_all(writes).await {
                r?;
            }
            for (start, buf) in group {
                for k in 0..(buf.len() / PAGE) as u64 {
                    f.mark_written(start + k);
                }
            }
        }
        Ok(!runs.is_empty())
    }
}
