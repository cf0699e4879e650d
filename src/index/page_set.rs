//! The current index file's pages in memory: a flat table indexed by page number, at
//! most `index_max_dirty_bytes` (4 KiB pages, at least [`crate::config::INDEX_MIN_PAGES`]).
//! RocketMQ maps the whole file; with direct I/O and no page cache, this set is what an
//! insert touches. Every insert and every slot read of the current file goes through it.
//!
//! * **The slot table stays.** At open the current file's whole slot table is loaded
//!   when it fits in 3/4 of the set (the default 20 MB table does in the default 32
//!   MiB), read with 1 MiB reads, four in flight; a new file's whole slot table is put
//!   in as zeros (known zeros, not read) when the file is created, each page touched
//!   there. Making room drops slot pages last, so every slot an insert or a query needs
//!   is in memory and a miss on an empty slot does no I/O.
//! * **Why a new file's table goes in at once** (~20 ms per shard for the default 4,883
//!   pages, in pieces): left to come in as keys first touched them, each new page cost
//!   the dispatcher an allocation and a page fault (a glibc arena `mprotect` and a fault
//!   per 4 KiB) until most pages had been touched (at 500 keys a second per shard, by
//!   arithmetic ~90% of 4,883 pages after 20 s), and a flush could not join dirty pages
//!   across absent ones: 21 writes instead of 3 for 40 keys over a 64-page table
//!   (`tests/index.rs`), ~160 a second per shard at 1,000 puts a second.
//! * **A flat table, not a hash map**: a lookup is an index. The hash map it replaced
//!   was looked up four times per key (see the index's module docs for the cost).
//! * **Making room** ([`IndexService::make_room`]) drops the clean entry pages first
//!   (into the page cache: written once, rarely read again by inserts); only when that
//!   is not enough is everything written out, then slot pages are dropped, the highest
//!   first, down to 3/4 of the set. It yields every 128 pages dropped: moving ~3,300
//!   entry pages to the page cache in one go held the shard ~3.5-4 ms.
//! * **Copy-on-write snapshots.** A flush copies the dirty pages into its write buffers a
//!   run at a time and yields between runs ([`super::flush`]); a page written before its
//!   run is copied first gives the snapshot its old content ([`PageSet::write`]), so the
//!   snapshot is exact for the instant the flush took its header. A snapshot whose
//!   future is dropped between runs leaves its pages dirty ([`SnapshotGuard`]).
//!
//! Invariant: a page is in `dirty` exactly once while its `dirty` flag is set; a page
//! marked for a snapshot (`snap`) is present until the snapshot ends.

use crate::error::Result;
use crate::io::PAGE;
use glommio::io::DmaBuffer;
use std::cell::RefCell;
use std::rc::Rc;

use super::file::IndexFile;
use super::{IndexService, P};

/// One 4 KiB page of the current file in the page set (its flags are the set's).
pub(super) struct Page {
    pub(super) data: [u8; PAGE],
}

impl Page {
    pub(super) fn zeroed() -> Box<Page> {
        Box::new(Page { data: [0u8; PAGE] })
    }

    pub(super) fn from_bytes(b: &[u8]) -> Box<Page> {
        let mut p = Page::zeroed();
        let n = b.len().min(PAGE);
        p.data[..n].copy_from_slice(&b[..n]);
        p
    }
}

/// Pages of the current file: a flat table indexed by page number, how many are
/// present, and the dirty ones.
///
/// A page's flags live in tables beside `pages`, not in the page: a flush reads the
/// flags of thousands of pages at once, and a flag behind each page's 4 KiB cost a
/// cache and TLB miss per page (taking a flush's snapshot of ~5,000 dirty pages took
/// 250-600 us).
#[derive(Default)]
pub(super) struct PageSet {
    pub(super) pages: Vec<Option<Box<Page>>>,
    pub(super) len: usize,
    /// Every page with its `is_dirty` flag set, once each.
    pub(super) dirty: Vec<u64>,
    /// Per page: changed since the last flush took its copy (it is in `dirty`).
    is_dirty: Vec<bool>,
    /// Per page: where a flush's snapshot wants its content (run, page within the
    /// run), until it is copied there (see `PageSet::begin_snapshot`).
    snap: Vec<Option<(u32, u32)>>,
    /// The buffers of a flush's snapshot being taken, one per run.
    pub(super) snapshot: Vec<DmaBuffer>,
}

impl PageSet {
    /// Empties the set for a file of `file_pages` pages.
    pub(super) fn reset(&mut self, file_pages: u64) {
        self.pages.clear();
        self.pages.resize_with(file_pages as usize, || None);
        self.is_dirty.clear();
        self.is_dirty.resize(file_pages as usize, false);
        self.snap.clear();
        self.snap.resize(file_pages as usize, None);
        self.len = 0;
        self.dirty.clear();
    }

    /// Whether page `p` is present and changed since the last flush took its copy.
    pub(super) fn is_dirty(&self, p: u64) -> bool {
        self.is_dirty.get(p as usize).copied().unwrap_or(false)
    }

    /// Takes page `p` for a flush (clean from here on, until written again); returns
    /// whether it is present.
    pub(super) fn take_for_flush(&mut self, p: u64) -> bool {
        if !self.has(p) {
            return false;
        }
        self.is_dirty[p as usize] = false;
        true
    }

    pub(super) fn has(&self, p: u64) -> bool {
        self.pages.get(p as usize).is_some_and(|s| s.is_some())
    }

    pub(super) fn get(&self, p: u64) -> Option<&Page> {
        self.pages.get(p as usize).and_then(|s| s.as_deref())
    }

    /// Adds page `p` unless present (`p` must lie within the file), clean.
    pub(super) fn insert(&mut self, p: u64, page: Box<Page>) {
        let s = &mut self.pages[p as usize];
        if s.is_none() {
            *s = Some(page);
            self.len += 1;
        }
    }

    /// Removes page `p` and its flags (callers remove clean pages outside a snapshot).
    pub(super) fn remove(&mut self, p: u64) -> Option<Box<Page>> {
        let page = self.pages.get_mut(p as usize)?.take()?;
        self.is_dirty[p as usize] = false;
        self.snap[p as usize] = None;
        self.len -= 1;
        Some(page)
    }

    /// Copies `bytes` in at file position `pos`; every page touched must be present.
    pub(super) fn write(&mut self, pos: u64, bytes: &[u8]) {
        let mut at = 0usize;
        while at < bytes.len() {
            let p = pos + at as u64;
            let i = (p / P) as usize;
            let page = self.pages[i].as_deref_mut().expect("page loaded");
            if let Some((r, k)) = self.snap[i].take() {
                // Copy-on-write: the snapshot gets the content it started with.
                let k = k as usize * PAGE;
                self.snapshot[r as usize].as_bytes_mut()[k..k + PAGE].copy_from_slice(&page.data);
            }
            let o = (p % P) as usize;
            let n = (PAGE - o).min(bytes.len() - at);
            page.data[o..o + n].copy_from_slice(&bytes[at..at + n]);
            if !self.is_dirty[i] {
                self.is_dirty[i] = true;
                self.dirty.push(p / P);
            }
            at += n;
        }
    }

    /// Marks page `p` dirty (once) if present: its last copy did not reach the disk.
    pub(super) fn mark_dirty(&mut self, p: u64) {
        if self.has(p) && !self.is_dirty[p as usize] {
            self.is_dirty[p as usize] = true;
            self.dirty.push(p);
        }
    }

    /// Starts a snapshot of the runs `spans` (first page, pages; every page present)
    /// into `bufs`: each page is copied by `copy_snapshot_pages` or, if written first,
    /// by `write`.
    pub(super) fn begin_snapshot(&mut self, spans: &[(u64, u64)], bufs: Vec<DmaBuffer>) {
        debug_assert!(self.snapshot.is_empty());
        for (r, &(start, n)) in spans.iter().enumerate() {
            for k in 0..n {
                debug_assert!(self.has(start + k), "snapshot page present");
                self.snap[(start + k) as usize] = Some((r as u32, k as u32));
            }
        }
        self.snapshot = bufs;
    }

    /// Copies pages `from..from + n` of snapshot run `r` (which starts at page
    /// `start`) into the run's buffer, those not already copied by a write meanwhile.
    pub(super) fn copy_snapshot_pages(&mut self, r: usize, start: u64, from: u64, n: u64) {
        let buf = self.snapshot[r].as_bytes_mut();
        for k in from..from + n {
            let i = (start + k) as usize;
            if self.snap[i].take().is_some() {
                let pg = self.pages[i].as_deref().expect("snapshot page present");
                let o = k as usize * PAGE;
                buf[o..o + PAGE].copy_from_slice(&pg.data);
            }
        }
    }

    pub(super) fn read_i32(&self, pos: u64) -> i32 {
        let o = (pos % P) as usize;
        let b = &self.get(pos / P).expect("page loaded").data[o..o + 4];
        i32::from_be_bytes([b[0], b[1], b[2], b[3]])
    }
}

/// Ends a flush's snapshot that was not finished (its future dropped between runs):
/// clears the pages' marks, leaves them dirty, and drops the buffers. A finished
/// snapshot forgets its guard.
pub(super) struct SnapshotGuard<'a> {
    pub(super) pages: &'a RefCell<PageSet>,
    pub(super) spans: &'a [(u64, u64)],
}

impl Drop for SnapshotGuard<'_> {
    fn drop(&mut self) {
        let mut pages = self.pages.borrow_mut();
        for &(start, n) in self.spans {
            for p in start..start + n {
                if let Some(s) = pages.snap.get_mut(p as usize) {
                    *s = None;
                }
                // Not written: the next flush takes it again.
                pages.mark_dirty(p);
            }
        }
        pages.snapshot.clear();
    }
}

impl IndexService {
    /// Makes `f` the file of the page set: page 0, and the whole slot table when it
    /// fits in three quarters of the set (it then stays, see the module docs).
    pub(super) async fn load_slot_table(&self, f: &Rc<IndexFile>) -> Result<()> {
        self.pages.borrow_mut().reset(self.file_pages());
        let upto = if self.slot_table_stays() {
            self.slot_pages()
        } else {
            1
        };
        let mut loaded = Vec::with_capacity(upto as usize);
        f.read_pages(0, upto * P, |p, b| {
            loaded.push((p, Page::from_bytes(b)));
        })
        .await?;
        f.epoch.set(f.epoch.get() + 1);
        let mut pages = self.pages.borrow_mut();
        let mut cache = self.cache.borrow_mut();
        for (p, page) in loaded {
            cache.remove((f.id, p));
            pages.insert(p, page);
        }
        Ok(())
    }

    /// Makes the page set the new file's after a rollover: the full file `prev`'s
    /// pages (all written and durable) go to the page cache, and the new file starts
    /// with page 0 dirty, so the first flush writes it.
    pub(super) fn start_file(&self, prev: Option<&IndexFile>) {
        let mut pages = self.pages.borrow_mut();
        if let Some(prev) = prev {
            let mut cache = self.cache.borrow_mut();
            for (n, slot) in pages.pages.iter_mut().enumerate() {
                if let Some(pg) = slot.take() {
                    cache.insert((prev.id, n as u64), Box::new(pg.data));
                }
            }
        }
        pages.reset(self.file_pages());
        pages.insert(0, Page::zeroed());
        pages.write(0, &[0u8; 4]);
    }

    /// Whether the whole slot table stays in the page set (it fits in three quarters).
    fn slot_table_stays(&self) -> bool {
        (self.slot_pages() as usize) + 4 <= self.cap_pages - self.cap_pages / 4
    }

    /// Puts a new file's slot table (zeros) in the page set when it stays there, as
    /// [`IndexService::load_slot_table`] does for a file opened from disk, touching
    /// each page so that its page fault is taken here, with a yield every 256 pages,
    /// rather than in the dispatcher by the key that first lands on it (see the module
    /// docs).
    pub(super) async fn fill_slot_table(&self, f: &Rc<IndexFile>) {
        if !self.slot_table_stays() {
            return;
        }
        let started = std::time::Instant::now();
        for p in 1..self.slot_pages() {
            if p % 256 == 0 {
                futures_lite::future::yield_now().await;
                if !self.is_current(f) {
                    return;
                }
            }
            let mut pages = self.pages.borrow_mut();
            if !pages.has(p) {
                let mut page = Page::zeroed();
                // The allocator hands out zeroed memory it has not touched yet; a
                // write the compiler cannot drop takes the page fault now.
                std::hint::black_box(&mut page.data[..])[0] = 0;
                pages.insert(p, page);
            }
        }
        tracing::debug!(
            file = %f.name,
            pages = self.slot_pages(),
            ms = started.elapsed().as_secs_f64() * 1e3,
            "key index: new file's slot table in memory"
        );
    }

    /// Loads the pages `need` of the current file `f` into the page set, making room
    /// first when it is full.
    pub(super) async fn ensure_pages(&self, f: &Rc<IndexFile>, need: &[u64]) -> Result<()> {
        let missing: Vec<u64> = {
            let pages = self.pages.borrow();
            let mut m: Vec<u64> = need.iter().copied().filter(|p| !pages.has(*p)).collect();
            m.sort_unstable();
            m.dedup();
            m
        };
        if missing.is_empty() {
            return Ok(());
        }
        if self.pages.borrow().len + missing.len() > self.cap_pages {
            self.make_room(need).await?;
        }
        for p in missing {
            // From now on the page may change: queries no longer cache it.
            f.epoch.set(f.epoch.get() + 1);
            let cached = self.cache.borrow_mut().remove((f.id, p));
            let page = match cached {
                Some(b) => Page::from_bytes(&b),
                None if f.known_zero(p) => Page::zeroed(),
                None => Page::from_bytes(&f.file.read(p * P, PAGE).await?),
            };
            if !self.is_current(f) {
                return Ok(());
            }
            self.pages.borrow_mut().insert(p, page);
        }
        Ok(())
    }

    /// Writes everything out when clean pages alone cannot make room, then drops clean
    /// pages (entry pages first, into the page cache) down to 3/4 of the page set,
    /// keeping page 0 and `keep` (see the module docs).
    async fn make_room(&self, keep: &[u64]) -> Result<()> {
        let _permit = self.lock_flush().await?;
        let Some(f) = self.current() else {
            return Ok(());
        };
        let slot_pages = self.slot_pages();
        let target = self.cap_pages - self.cap_pages / 4;
        let droppable = {
            let pages = self.pages.borrow();
            (slot_pages.max(1)..pages.pages.len() as u64)
                .filter(|p| !keep.contains(p) && pages.has(*p) && !pages.is_dirty(*p))
                .count()
        };
        if self.pages.borrow().len.saturating_sub(droppable) > target {
            self.flush_locked().await?;
        }
        // From the highest page down: every clean entry page, then slot pages until
        // the set is down to the target.
        let mut p = self.pages.borrow().pages.len() as u64;
        let mut dropped = 0;
        while p > 1 {
            p -= 1;
            if dropped == 128 {
                dropped = 0;
                futures_lite::future::yield_now().await;
            }
            let mut pages = self.pages.borrow_mut();
            if p < slot_pages && pages.len <= target {
                break;
            }
            if keep.contains(&p) || !pages.has(p) || pages.is_dirty(p) {
                continue;
            }
            let pg = pages.remove(p).expect("present");
            self.cache.borrow_mut().insert((f.id, p), Box::new(pg.data));
            dropped += 1;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_set_tracks_dirty_pages_once() {
        let mut s = PageSet::default();
        s.reset(4);
        s.insert(0, Page::zeroed());
        s.insert(1, Page::zeroed());
        assert_eq!(s.len, 2);
        // Straddles pages 0 and 1.
        s.write(P - 2, &[1, 2, 3, 4]);
        s.write(P - 2, &[5, 6]);
        assert_eq!(s.dirty, vec![0, 1]);
        assert_eq!(s.get(0).unwrap().data[PAGE - 2..], [5, 6]);
        assert_eq!(s.get(1).unwrap().data[..2], [3, 4]);
        s.write(8, &7i32.to_be_bytes());
        assert_eq!(s.read_i32(8), 7);
        assert_eq!(s.dirty, vec![0, 1]);
        assert!(s.has(1) && !s.has(2) && !s.has(9));
        assert!(s.remove(1).is_some() && s.remove(1).is_none());
        assert_eq!(s.len, 1);
    }

    #[test]
    fn snapshot_keeps_the_content_of_its_start_when_pages_change_meanwhile() {
        let mut s = PageSet::default();
        s.reset(4);
        for p in 0..4 {
            s.insert(p, Page::zeroed());
            s.write(p * P, &[p as u8 + 1; 8]);
        }
        let spans = [(0u64, 1u64), (1, 3)];
        let bufs = vec![
            glommio::allocate_dma_buffer_global(PAGE),
            glommio::allocate_dma_buffer_global(3 * PAGE),
        ];
        s.begin_snapshot(&spans, bufs);
        // Written before its run is copied: the snapshot must get the old bytes.
        s.write(2 * P, &[9; 4]);
        s.copy_snapshot_pages(0, 0, 0, 1);
        // Written after its run was copied: no effect on the snapshot.
        s.write(0, &[7; 4]);
        s.copy_snapshot_pages(1, 1, 0, 3);
        s.write(3 * P, &[8; 4]);
        let snap = std::mem::take(&mut s.snapshot);
        assert_eq!(snap[0].as_bytes()[..8], [1; 8]);
        assert_eq!(snap[1].as_bytes()[..8], [2; 8]);
        assert_eq!(snap[1].as_bytes()[PAGE..PAGE + 8], [3; 8]);
        assert_eq!(snap[1].as_bytes()[2 * PAGE..2 * PAGE + 8], [4; 8]);
        // The pages themselves have the new bytes, and no copy is pending.
        assert_eq!(s.get(2).unwrap().data[..5], [9, 9, 9, 9, 3]);
        assert_eq!(s.get(0).unwrap().data[..5], [7, 7, 7, 7, 1]);
        assert!((0..4).all(|p| s.snap[p as usize].is_none()));
    }

    #[test]
    fn an_unfinished_snapshot_leaves_no_marks_and_its_pages_dirty() {
        let cell = RefCell::new(PageSet::default());
        {
            let mut s = cell.borrow_mut();
            s.reset(4);
            for p in 0..4 {
                s.insert(p, Page::zeroed());
            }
            let spans = [(1u64, 2u64), (3, 1)];
            let bufs = vec![
                glommio::allocate_dma_buffer_global(2 * PAGE),
                glommio::allocate_dma_buffer_global(PAGE),
            ];
            s.begin_snapshot(&spans, bufs);
            s.copy_snapshot_pages(0, 1, 0, 2);
        }
        // As `flush_locked` takes them: not dirty while the snapshot is out.
        drop(SnapshotGuard {
            pages: &cell,
            spans: &[(1, 2), (3, 1)],
        });
        let s = cell.borrow();
        assert!(s.snapshot.is_empty());
        assert!((0..4).all(|p| s.snap[p as usize].is_none()));
        let mut dirty = s.dirty.clone();
        dirty.sort_unstable();
        assert_eq!(dirty, vec![1, 2, 3]);
    }
}
