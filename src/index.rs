//! One shard's key index: RocketMQ's IndexService over IndexFiles (layout in
//! [`crate::format::index_file`]) under `<shard root>/index/`, and
//! [`Store::query_by_key`].
//!
//! * **Built by dispatch, from the CommitLog.** The dispatcher hands every record to
//!   [`IndexService::add`]; every `KEYS` part and `UNIQ_KEY` is indexed as `topic#key`
//!   (rolled-back transaction records are skipped, as in RocketMQ). The header's
//!   `endPhyOffset` is the commit-log offset of the last record the index has taken
//!   (with or without keys), so the index knows how far it got: records below it are
//!   skipped, which makes re-dispatch idempotent. At open the store re-dispatches from
//!   min(checkpoint dispatch point, index durable point), so after a crash the index
//!   is complete again for everything the CommitLog kept (RocketMQ instead destroys
//!   the last, partial index file).
//! * **Bounded memory.** Pages (4 KiB) of the current file live in a page set of at
//!   most `index_max_dirty_bytes`, a flat table indexed by page number. At open the
//!   current file's whole slot table is read into it with 1 MiB reads (four in flight)
//!   when it fits in 3/4 of the set (the default 20 MB table does in the default 32
//!   MiB), and it then stays: every slot an insert or a query needs is in memory. When
//!   the set is full the clean entry pages go (to the read cache below); only when that
//!   is not enough is everything written out first, then slot pages are dropped down to
//!   3/4 of the set. A flush copies the dirty pages it writes, so the peak is twice the
//!   set (plus up to 16 MiB of I/O buffers in flight). Besides, a **read cache** of at
//!   most `index_cache_bytes` (default 128 MiB, 6.7 M entries; 0 turns it off) keeps
//!   clean pages of any file for queries (CLOCK eviction): entry pages the page set
//!   drops, the pages of a file that filled, pages queries read, and at open the newest
//!   entries (the current file's, newest first, then older files with their slot
//!   tables) read with large reads until it is full. A page of the current file leaves
//!   the cache when it enters the page set (it may change from then on), and a query's
//!   disk read that raced with that is not cached (a per-file epoch). Queries look in
//!   the page set, then the cache, then read the page with direct I/O and cache it.
//! * **Crash-consistent writes.** A flush (every second, from the queue flusher; when
//!   the page set is full; when a file fills; at shutdown) writes the pages it
//!   snapshots in steps, each followed by fdatasync (within a step adjacent pages go
//!   as one write of up to 1 MiB, 16 writes in flight): pages holding only entries,
//!   the page where slots end and entries begin (first with its slots as on disk, then
//!   whole), the other slot pages, page 0 with the header that is already on disk, and
//!   last page 0 with the new header: a power loss may tear a page's sectors apart
//!   (found by the simulated-disk tests, tests/sim.rs). So a slot on disk never names an entry that is not on disk, and
//!   a header on disk never counts entries that are not. After an unclean stop the
//!   slot table is repaired: a slot naming an entry at or past the header's count is
//!   walked back along the (durable) chain to the newest counted entry. Entries for
//!   records the recovered CommitLog lost are cut the same way. Entries of one record
//!   may be written twice when a flush falls between two of its keys; queries return
//!   each record once.
//! * **Deviations, on purpose.** RocketMQ computes a new file's first time difference
//!   against the previous file's end time before it sets the begin time; coremq sets
//!   the begin time first (first entry: 0). `endPhyOffset` and `endTimestamp` also
//!   advance for records without keys (RocketMQ: only with keys), so a store without
//!   keys does not re-read its whole log at every open.
//! * **Names.** Files are named by creation time `yyyyMMddHHmmssSSS` in local time
//!   (the zone offset from `localtime_r`), bumped by a millisecond when needed so
//!   names always sort in creation order.
//!
//! # Cost (issue 5), measured on the shared 2-CPU VM
//!
//! **Inserting a key.** [`IndexService::add`] scans the properties once for `KEYS` and
//! `UNIQ_KEY` (names compared as bytes, only the two values checked for UTF-8),
//! hashes the topic once per record and ASCII keys byte by byte, and adds each key
//! without awaiting when its slot and entry pages are in the page set (always for
//! the slot once the table is loaded; the tail entry page almost always): an index
//! into the page table, no hash map, no allocation. The old page set was a hash map
//! (looked up four times per key) and every key went through three awaits. Its
//! flush wrote one 4 KiB page per write, one at a time, while the dispatcher waited
//! for room: runs of adjacent pages with 16 writes in flight now.
//! `coremq bench --duration 5 --body 1024 --queues 64` (one key per message), before
//! (9bb65e8) and after, alternated, load average 6-8 from other jobs:
//! 158-246 k msg/s at 4.8-6.5 us CPU per message (the dispatcher fell behind and the
//! shutdown waited for it: 12 s for a 5 s run) against 243-318 k msg/s at 2.5-2.9 us.
//! `perf record` of the same runs: index insert functions (slot lookup, property
//! parsing, UTF-8 checks, hashing, page writes) ~0.53 us per key before, ~0.30 us
//! after, of which ~0.17 us is the one cache miss on the random slot (`read_i32`:
//! the 20 MB table does not fit any CPU cache); the flush's virtio notifications
//! (`iowrite16`, 9% of all samples before) are gone from the top of the profile.
//!
//! **A key query** walks dependent reads: slot, each entry of the chain (at one key
//! per slot about two, more at the tail), then the record. With the slot table in
//! memory a miss on an empty slot does no I/O, with the chain in the cache a hit reads
//! only its record, and the record is read in one read instead of two (the first read
//! takes the rest of its page). Scenario 6 at 10 M keys (5 M per shard, 100 MB of
//! entries per shard: all in the default cache), one store, queried by the old
//! (9bb65e8) and the new binary back to back:
//!
//! | load average | hits p50 / p90 / p99 | misses p50 / p99 | peak RSS |
//! |---|---|---|---|
//! | 7-8, before | 531 us / 4.8 ms / 16.6 ms | 227 us / 12.0 ms | 169 MiB |
//! | 7-8, after | 105 us / 161 us / 3.1 ms | 3 us / 16 us | 391 MiB |
//! | 11-13, before | 574 us / 4.0 ms / 27.0 ms | 245 us / 16.3 ms | |
//! | 11-13, after | 113 us / 492 us / 5.2 ms | 4 us / 17 us | 390 MiB |
//!
//! (RSS: two shards' slot tables and caches.) fio 4 KiB O_DIRECT random reads at
//! depth 1 on the same disk during the first pair: p50 40 us, p99 110 us, p99.9 4.0
//! ms. So a hit's 99th percentile is one record read on a disk and two CPUs shared
//! with other jobs (builds, benchmarks); the 1 ms target was not reached on this
//! machine. Writing the 10 M-key store took 37 s with the new index; with the old one
//! the run never finished twice (a shard's dispatch stalled at shutdown with 240 MB to
//! go, its executor parked in `io_cqring_wait`; killed after 5 and 13 minutes).

use crate::config::StoreConfig;
use crate::error::{Error, Result};
use crate::format::index_file::{
    self, ENTRY_LEN, Geometry, IndexEntry, IndexHeader, NAME_LEN, index_keys,
};
use crate::format::properties;
use crate::format::record::{self, RecordView};
use crate::io::{Disk, File, PAGE};
use crate::message::StoredMessage;
use crate::store::Store;
use ahash::{AHashMap, AHashSet};
use glommio::io::DmaBuffer;
use glommio::{allocate_dma_buffer, allocate_dma_buffer_global};
use std::cell::{Cell, RefCell};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::rc::Rc;

/// Largest single write of a flush.
const RUN_BYTES: usize = 1 << 20;
/// A flush's snapshot of at least this many runs is copied with a yield between runs.
const YIELDING_SNAPSHOT_RUNS: usize = 8;
/// The smallest page set allowed (`index_max_dirty_bytes / 4096`).
pub const MIN_PAGES: usize = 16;
/// Longest key a query accepts: no record can carry a longer one (properties are
/// limited to 32767 bytes).
pub const MAX_KEY_LEN: usize = record::MAX_PROPERTIES_LEN;
const P: u64 = PAGE as u64;

/// Checks a key query's arguments (shared by the store and the sharded handle).
pub fn check_query(topic: &str, key: &str, begin_ms: i64, end_ms: i64) -> Result<()> {
    if topic.is_empty() || topic.len() > 255 {
        return Err(Error::BadRequest(format!(
            "topic must be 1..=255 bytes, got {}",
            topic.len()
        )));
    }
    if key.is_empty() {
        return Err(Error::BadRequest("key is empty".into()));
    }
    if key.len() > MAX_KEY_LEN {
        return Err(Error::BadRequest(format!(
            "key is {} bytes; no stored key can be longer than {MAX_KEY_LEN}",
            key.len()
        )));
    }
    if begin_ms > end_ms {
        return Err(Error::BadRequest(format!(
            "begin {begin_ms} is after end {end_ms}"
        )));
    }
    Ok(())
}

/// Whether commit-log offset `phy` (as stored, may be -1) is at or past `end`.
fn past(phy: i64, end: u64) -> bool {
    phy >= 0 && phy as u64 >= end
}

/// A process-wide unique id for an open index file.
fn next_file_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// The UTC offset of local time now, in milliseconds (0 if unknown).
fn local_offset_ms(utc_ms: i64) -> i64 {
    let t = (utc_ms / 1000) as libc::time_t;
    // SAFETY: localtime_r writes only into the `tm` we own.
    unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&t, &mut tm).is_null() {
            return 0;
        }
        tm.tm_gmtoff * 1000
    }
}

struct IndexFile {
    /// Unique within this process: names the file's pages in the read cache.
    id: u64,
    name: String,
    file: Rc<File>,
    /// The newest header (for the current file, ahead of what is on disk).
    header: Cell<IndexHeader>,
    /// For a file created by this process: a bit per page ever written, so a page
    /// never written is known to be zeros and is not read (a new file's slot table
    /// would otherwise cost one read per page at first touch).
    written: RefCell<Option<Vec<u64>>>,
    /// Bumped whenever one of this file's pages enters the page set (it may change
    /// from then on): a query's disk read that started before is not cached.
    epoch: Cell<u64>,
}

impl IndexFile {
    fn known_zero(&self, page: u64) -> bool {
        self.written.borrow().as_ref().is_some_and(|bits| {
            bits.get((page / 64) as usize)
                .is_some_and(|w| w & (1 << (page % 64)) == 0)
        })
    }

    fn mark_written(&self, page: u64) {
        if let Some(bits) = self.written.borrow_mut().as_mut()
            && let Some(w) = bits.get_mut((page / 64) as usize)
        {
            *w |= 1 << (page % 64);
        }
    }
}

/// One 4 KiB page of the current file in the page set.
struct Page {
    data: [u8; PAGE],
    /// Changed since the last flush took its copy (the page is in `PageSet::dirty`).
    dirty: bool,
    /// Where a flush's snapshot wants this page's content (run, page within the
    /// run), until it is copied there (see `PageSet::begin_snapshot`).
    snap: Option<(u32, u32)>,
}

impl Page {
    fn zeroed() -> Box<Page> {
        Box::new(Page {
            data: [0u8; PAGE],
            dirty: false,
            snap: None,
        })
    }

    fn from_bytes(b: &[u8]) -> Box<Page> {
        let mut p = Page::zeroed();
        let n = b.len().min(PAGE);
        p.data[..n].copy_from_slice(&b[..n]);
        p
    }
}

/// Pages of the current file: a flat table indexed by page number (a lookup is an
/// index, not a hash), how many are present, and the dirty ones.
#[derive(Default)]
struct PageSet {
    pages: Vec<Option<Box<Page>>>,
    len: usize,
    /// Every page with `dirty` set, once each.
    dirty: Vec<u64>,
    /// The buffers of a flush's snapshot being taken, one per run.
    snapshot: Vec<DmaBuffer>,
}

impl PageSet {
    /// Empties the set for a file of `file_pages` pages.
    fn reset(&mut self, file_pages: u64) {
        self.pages.clear();
        self.pages.resize_with(file_pages as usize, || None);
        self.len = 0;
        self.dirty.clear();
    }

    fn has(&self, p: u64) -> bool {
        self.pages.get(p as usize).is_some_and(|s| s.is_some())
    }

    fn get(&self, p: u64) -> Option<&Page> {
        self.pages.get(p as usize).and_then(|s| s.as_deref())
    }

    /// Adds page `p` unless present (`p` must lie within the file).
    fn insert(&mut self, p: u64, page: Box<Page>) {
        let s = &mut self.pages[p as usize];
        if s.is_none() {
            *s = Some(page);
            self.len += 1;
        }
    }

    fn remove(&mut self, p: u64) -> Option<Box<Page>> {
        let page = self.pages.get_mut(p as usize)?.take()?;
        self.len -= 1;
        Some(page)
    }

    /// Copies `bytes` in at file position `pos`; every page touched must be present.
    fn write(&mut self, pos: u64, bytes: &[u8]) {
        let mut at = 0usize;
        while at < bytes.len() {
            let p = pos + at as u64;
            let page = self.pages[(p / P) as usize]
                .as_deref_mut()
                .expect("page loaded");
            if let Some((r, k)) = page.snap.take() {
                // Copy-on-write: the snapshot gets the content it started with.
                let k = k as usize * PAGE;
                self.snapshot[r as usize].as_bytes_mut()[k..k + PAGE].copy_from_slice(&page.data);
            }
            let o = (p % P) as usize;
            let n = (PAGE - o).min(bytes.len() - at);
            page.data[o..o + n].copy_from_slice(&bytes[at..at + n]);
            if !page.dirty {
                page.dirty = true;
                self.dirty.push(p / P);
            }
            at += n;
        }
    }

    /// Marks page `p` dirty (once) if present: its last copy did not reach the disk.
    fn mark_dirty(&mut self, p: u64) {
        if let Some(pg) = self
            .pages
            .get_mut(p as usize)
            .and_then(|s| s.as_deref_mut())
            && !pg.dirty
        {
            pg.dirty = true;
            self.dirty.push(p);
        }
    }

    /// Starts a snapshot of the runs `spans` (first page, pages; every page present)
    /// into `bufs`: each page is copied by `copy_snapshot_run` or, if written first,
    /// by `write`.
    fn begin_snapshot(&mut self, spans: &[(u64, u64)], bufs: Vec<DmaBuffer>) {
        debug_assert!(self.snapshot.is_empty());
        for (r, &(start, n)) in spans.iter().enumerate() {
            for k in 0..n {
                let pg = self.pages[(start + k) as usize]
                    .as_deref_mut()
                    .expect("snapshot page present");
                pg.snap = Some((r as u32, k as u32));
            }
        }
        self.snapshot = bufs;
    }

    /// Copies the pages of snapshot run `r` not copied yet.
    fn copy_snapshot_run(&mut self, r: usize, start: u64, n: u64) {
        let buf = self.snapshot[r].as_bytes_mut();
        for k in 0..n {
            let pg = self.pages[(start + k) as usize]
                .as_deref_mut()
                .expect("snapshot page present");
            if pg.snap.take().is_some() {
                let o = k as usize * PAGE;
                buf[o..o + PAGE].copy_from_slice(&pg.data);
            }
        }
    }

    fn read_i32(&self, pos: u64) -> i32 {
        let o = (pos % P) as usize;
        let b = &self.get(pos / P).expect("page loaded").data[o..o + 4];
        i32::from_be_bytes([b[0], b[1], b[2], b[3]])
    }
}

/// Ends a flush's snapshot that was not finished (its future dropped between runs):
/// clears the pages' marks, leaves them dirty, and drops the buffers.
struct SnapshotGuard<'a> {
    pages: &'a RefCell<PageSet>,
    spans: &'a [(u64, u64)],
}

impl Drop for SnapshotGuard<'_> {
    fn drop(&mut self) {
        let mut pages = self.pages.borrow_mut();
        for &(start, n) in self.spans {
            for p in start..start + n {
                if let Some(pg) = pages
                    .pages
                    .get_mut(p as usize)
                    .and_then(|s| s.as_deref_mut())
                {
                    pg.snap = None;
                }
                // Not written: the next flush takes it again.
                pages.mark_dirty(p);
            }
        }
        pages.snapshot.clear();
    }
}

/// Clean pages of index files kept for queries, at most `cap` (CLOCK eviction). Keyed
/// by (file id, page number); a page of the current file is only here while it is not
/// in the page set (pages entering the set leave the cache).
struct ReadCache {
    cap: usize,
    map: AHashMap<(u64, u64), usize>,
    slots: Vec<CachedPage>,
    hand: usize,
}

struct CachedPage {
    key: (u64, u64),
    data: Box<[u8]>,
    hot: bool,
}

impl ReadCache {
    fn new(cap: usize) -> ReadCache {
        ReadCache {
            cap,
            map: AHashMap::new(),
            slots: Vec::new(),
            hand: 0,
        }
    }

    fn get(&mut self, key: (u64, u64)) -> Option<&[u8]> {
        let i = *self.map.get(&key)?;
        let s = &mut self.slots[i];
        s.hot = true;
        Some(&s.data)
    }

    fn insert(&mut self, key: (u64, u64), data: Box<[u8]>) {
        if self.cap == 0 {
            return;
        }
        debug_assert_eq!(data.len(), PAGE);
        if let Some(&i) = self.map.get(&key) {
            self.slots[i].data = data;
            return;
        }
        if self.slots.len() < self.cap {
            self.map.insert(key, self.slots.len());
            self.slots.push(CachedPage {
                key,
                data,
                hot: false,
            });
            return;
        }
        // CLOCK: the first page not used since the hand last passed it goes.
        loop {
            let i = self.hand;
            self.hand = (self.hand + 1) % self.slots.len();
            let s = &mut self.slots[i];
            if s.hot {
                s.hot = false;
                continue;
            }
            self.map.remove(&s.key);
            self.map.insert(key, i);
            *s = CachedPage {
                key,
                data,
                hot: false,
            };
            return;
        }
    }

    fn remove(&mut self, key: (u64, u64)) -> Option<Box<[u8]>> {
        let i = self.map.remove(&key)?;
        let gone = self.slots.swap_remove(i);
        if i < self.slots.len() {
            self.map.insert(self.slots[i].key, i);
        }
        if self.hand >= self.slots.len() {
            self.hand = 0;
        }
        Some(gone.data)
    }
}

/// The index of one shard (see the module docs).
pub struct IndexService {
    dir: PathBuf,
    disk: Disk,
    geo: Geometry,
    cap_pages: usize,
    /// Oldest first; only the last one takes new entries.
    files: RefCell<Vec<Rc<IndexFile>>>,
    /// Pages of the last file, by page number.
    pages: RefCell<PageSet>,
    /// Clean pages of any file, for queries (`index_cache_bytes`).
    cache: RefCell<ReadCache>,
    /// Records below this commit-log offset are already indexed.
    indexed_end: Cell<u64>,
    /// Set when a repair left `endPhyOffset` one byte before a record (that record's
    /// keys are to be indexed again), not at a record's start.
    end_before_record: Cell<bool>,
    /// The last file's header as last made durable.
    durable: Cell<IndexHeader>,
    /// End time of the last full file flushed (the checkpoint's indexMsgTimestamp).
    full_flushed_end_ts: Cell<i64>,
    /// The highest commit-log offset the index named when it was opened (-1: none).
    high_water: Cell<i64>,
    /// Serialises flushes, rollovers and evictions.
    flush_lock: glommio::sync::Semaphore,
    /// Whole-run (`RUN_BYTES`) buffers of earlier flushes, reused (see `flush_locked`).
    run_bufs: RefCell<Vec<DmaBuffer>>,
}

/// What opening the index found.
#[derive(Debug, Clone, Default)]
pub struct IndexOpenReport {
    pub files: usize,
    /// Slots whose chain was walked back to a durable entry.
    pub slots_repaired: u64,
    /// Entries cut because the recovered CommitLog no longer holds their records.
    pub entries_cut: u64,
}

impl IndexService {
    /// Loads `<root>/index/`, repairing the last file after an unclean stop and cutting
    /// entries for records at or past `log_end`.
    pub async fn open(
        cfg: &StoreConfig,
        clean: bool,
        log_end: u64,
    ) -> Result<(IndexService, IndexOpenReport)> {
        let dir = cfg.root.join("index");
        let disk = cfg.disk.clone();
        disk.create_dir_all(&dir)?;
        let geo = Geometry {
            slots: cfg.index_hash_slots,
            entries: cfg.index_max_entries,
        };
        let mut names = Vec::new();
        for entry in disk.list_dir(&dir)? {
            match entry.name.as_str() {
                n if index_file::parse_file_name(n).is_some() => names.push(n.to_string()),
                _ => {
                    tracing::warn!(path = %entry.path.display(), "ignoring a file that is not an index file")
                }
            }
        }
        names.sort();
        let mut files: Vec<Rc<IndexFile>> = Vec::new();
        let mut damaged = false;
        for name in names {
            let path = dir.join(&name);
            if damaged {
                disk.remove_file(&path)?;
                continue;
            }
            let f = disk.open(&path, false).await?;
            let size = f.size().await?;
            if size == 0 {
                // Created but never sized (crash during creation).
                tracing::warn!(path = %path.display(), "removing an empty index file");
                disk.remove_file(&path)?;
                continue;
            }
            if size > geo.file_len() && size <= crate::io::align_up(geo.file_len()) {
                // The last page is written whole (direct I/O) and the file cut back
                // after; a stop between the two leaves this padding: cut it now.
                tracing::warn!(path = %path.display(), size, "cutting an index file's last-page padding left by an interrupted write");
                f.truncate(geo.file_len()).await?;
                f.sync().await?;
            } else if size != geo.file_len() {
                return Err(Error::BadLayout {
                    path,
                    why: format!(
                        "index file is {size} bytes; this store uses {} (set index_hash_slots and \
                         index_max_entries to the values the store was created with)",
                        geo.file_len()
                    ),
                });
            }
            let head = f.read(0, index_file::HEADER_LEN).await?;
            match IndexHeader::decode(&head) {
                Ok(h) if h.index_count == 0 => {
                    // Created, never flushed (crash right after a rollover): holds nothing.
                    tracing::warn!(path = %path.display(), "removing an index file that was never written");
                    disk.remove_file(&path)?;
                    damaged = true;
                }
                Ok(h) => files.push(Rc::new(IndexFile {
                    id: next_file_id(),
                    name,
                    file: f,
                    header: Cell::new(h),
                    written: RefCell::new(None),
                    epoch: Cell::new(0),
                })),
                Err(kind) => {
                    // The index is rebuilt from the log: drop this file and the later ones.
                    tracing::warn!(path = %path.display(), %kind, "index file header damaged; it is rebuilt from the log");
                    disk.remove_file(&path)?;
                    damaged = true;
                }
            }
        }
        let svc = IndexService {
            dir,
            disk,
            geo,
            cap_pages: (cfg.index_max_dirty_bytes / PAGE).max(MIN_PAGES),
            files: RefCell::new(Vec::new()),
            pages: RefCell::new(PageSet::default()),
            cache: RefCell::new(ReadCache::new(cfg.index_cache_bytes / PAGE)),
            indexed_end: Cell::new(0),
            end_before_record: Cell::new(false),
            durable: Cell::new(IndexHeader::empty()),
            full_flushed_end_ts: Cell::new(0),
            high_water: Cell::new(-1),
            flush_lock: glommio::sync::Semaphore::new(1),
            run_bufs: RefCell::new(Vec::new()),
        };
        *svc.files.borrow_mut() = files;
        let report = svc.settle(clean, log_end).await?;
        svc.warm_cache().await?;
        Ok((svc, report))
    }

    /// Drops the files whose every entry names a record at or past `log_end` (a lost
    /// log tail), repairs the last file when the stop was not `clean` or it names
    /// such records, and makes that file the page set's.
    async fn settle(&self, clean: bool, log_end: u64) -> Result<IndexOpenReport> {
        let mut report = IndexOpenReport::default();
        // Files made stale by a lost log tail: drop those whose every entry is gone.
        while let Some(last) = self.current() {
            let h = last.header.get();
            let first_gone = if h.has_entries() {
                past(self.entry_on_disk(&last.file, 1).await?.phy_offset, log_end)
            } else {
                past(h.end_phy_offset, log_end) && h.end_timestamp > 0
            };
            if !first_gone {
                break;
            }
            report.entries_cut += (h.index_count.max(1) - 1) as u64;
            self.disk.remove_file(&last.file.path)?;
            self.files.borrow_mut().pop();
        }
        self.end_before_record.set(false);
        if let Some(last) = self.current() {
            let h = last.header.get();
            if !clean || (past(h.end_phy_offset, log_end) && h.end_timestamp > 0) {
                let (repaired, cut) = self.repair(&last, log_end).await?;
                report.slots_repaired = repaired;
                report.entries_cut += cut;
            }
        }
        self.disk.sync_dir(&self.dir)?;
        report.files = self.files.borrow().len();
        self.indexed_end.set(0);
        self.durable.set(IndexHeader::empty());
        self.high_water.set(-1);
        self.pages.borrow_mut().reset(0);
        if let Some(last) = self.current() {
            let h = last.header.get();
            self.durable.set(h);
            if h.has_entries() || h.end_timestamp > 0 {
                self.indexed_end.set((h.end_phy_offset.max(-1) + 1) as u64);
            }
            // The highest log offset the index names: its end, or the record of its
            // last entry (a flush between two keys of a record counts entries before
            // the end moves to that record).
            let mut high = h.end_phy_offset;
            if h.has_entries() {
                let last_entry = self.entry_on_disk(&last.file, h.index_count - 1).await?;
                high = high.max(last_entry.phy_offset);
            }
            self.high_water.set(high);
            self.load_slot_table(&last).await?;
        }
        self.full_flushed_end_ts.set(0);
        if let Some(full) = self
            .files
            .borrow()
            .iter()
            .rev()
            .find(|f| f.header.get().index_count as u32 >= self.geo.entries)
        {
            self.full_flushed_end_ts
                .set(full.header.get().end_timestamp);
        }
        Ok(report)
    }

    /// After recovery found the log's end (the index was opened before, with no end
    /// to cut at): when the index names a record at or past `log_end` (the log lost a
    /// tail the index had taken), cuts those entries as [`IndexService::open`] would
    /// have with this `log_end`, and returns `true` (the caller then re-dispatches
    /// from [`IndexService::resume_point`]). Such an index took nothing since it was
    /// opened: every record the log kept lies below what it had already taken.
    pub async fn cut_to(&self, log_end: u64) -> Result<bool> {
        if !past(self.high_water.get(), log_end) {
            return Ok(false);
        }
        if !self.pages.borrow().dirty.is_empty() {
            return Err(Error::Failed(format!(
                "key index {}: took records after it was opened although it names records \
                 past the recovered log end {log_end}",
                self.dir.display()
            )));
        }
        // Pages of the files about to change may be cached: start the cache afresh.
        {
            let mut cache = self.cache.borrow_mut();
            *cache = ReadCache::new(cache.cap);
        }
        let report = self.settle(false, log_end).await?;
        tracing::warn!(dir = %self.dir.display(), log_end, ?report, "key index cut back to the recovered log");
        self.warm_cache().await?;
        Ok(true)
    }

    /// Records below this commit-log offset are already indexed; re-dispatch at
    /// open must start no later than this.
    pub fn indexed_end(&self) -> u64 {
        self.indexed_end.get()
    }

    /// A commit-log record boundary from which re-dispatching completes the index:
    /// the last record it took (records it has are skipped, so re-reading that one is
    /// harmless), or the record a repair left to index again; 0 with no index.
    /// (`indexed_end` itself is one past a record's start, not a boundary: starting a
    /// dispatch there failed and rebuilt every queue from the whole log at every
    /// reopen, found by `scripts/bench.sh` scenario 7.)
    pub fn resume_point(&self) -> u64 {
        let end = self.indexed_end.get();
        if end == 0 || self.end_before_record.get() {
            end
        } else {
            end - 1
        }
    }

    /// End time of the last full index file flushed (checkpoint indexMsgTimestamp).
    pub fn full_flushed_end_ts(&self) -> i64 {
        self.full_flushed_end_ts.get()
    }

    pub fn file_count(&self) -> usize {
        self.files.borrow().len()
    }

    async fn entry_on_disk(&self, f: &File, i: i32) -> Result<IndexEntry> {
        let pos = self.geo.entry_pos(i.max(0) as u32);
        let r = f.read(pos, ENTRY_LEN).await?;
        IndexEntry::decode(&r).map_err(|kind| Error::Corrupt {
            path: f.path.clone(),
            offset: pos,
            kind,
            detail: Some("index entry".into()),
        })
    }

    /// Brings the last file to a consistent state: entries for records at or past
    /// `log_end` are cut, and slots naming entries past the count are walked back.
    /// Returns (slots repaired, entries cut).
    async fn repair(&self, f: &Rc<IndexFile>, log_end: u64) -> Result<(u64, u64)> {
        let geo = self.geo;
        let mut h = f.header.get();
        let old_count = h.index_count.clamp(1, geo.entries as i32);
        // Entries are in log order: binary search the first one whose record is gone.
        let (mut lo, mut hi) = (1i32, old_count);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if !past(self.entry_on_disk(&f.file, mid).await?.phy_offset, log_end) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        let count = lo;
        let cut = (old_count - count) as u64;
        if past(h.end_phy_offset, log_end) || count < old_count {
            if count > 1 {
                // The last counted entry's record may have more keys than were
                // counted: mark only the records before it done (it is indexed again;
                // queries return each record once).
                let last = self.entry_on_disk(&f.file, count - 1).await?;
                h.end_phy_offset = last.phy_offset - 1;
                self.end_before_record.set(true);
                // Entries keep whole seconds: an upper bound keeps range checks right.
                h.end_timestamp = last.time(&h).saturating_add(999);
            } else {
                h.end_phy_offset = h.begin_phy_offset;
                h.end_timestamp = h.begin_timestamp;
            }
        }
        h.index_count = count;
        // Walk the slot table in chunks; fix slots naming uncounted entries.
        let slots_end = geo.slots_end();
        let chunk_bytes: u64 = 1 << 20;
        let mut repaired = 0u64;
        let mut used = 0i32;
        let mut pos = 0u64;
        let mut page0 = vec![0u8; PAGE];
        // Entries past the count that slots name were written by the flush that a
        // crash cut short, which wrote at most a page set's worth: read that much
        // once instead of one read per slot.
        let mut block: Option<(u64, Vec<u8>)> = None;
        while pos < slots_end {
            let len = chunk_bytes.min(crate::io::align_up(slots_end) - pos);
            let r = f.file.read(pos, len as usize).await?;
            let mut buf = vec![0u8; len as usize];
            buf[..r.len().min(len as usize)].copy_from_slice(&r[..r.len().min(len as usize)]);
            let mut changed = false;
            let first_slot_byte = (index_file::HEADER_LEN as u64).max(pos);
            let mut at = first_slot_byte;
            while at + 4 <= (pos + len).min(slots_end) {
                let o = (at - pos) as usize;
                let v = i32::from_be_bytes(buf[o..o + 4].try_into().expect("4 bytes"));
                let mut u = v;
                let mut steps = 0u32;
                while u != 0 && !geo.valid_link(u, count) {
                    if u < 0 || u as u32 >= geo.entries || steps > geo.entries {
                        u = 0;
                        break;
                    }
                    if block.is_none() {
                        let from = crate::io::align_down(geo.entry_pos(count as u32));
                        let len = (self.cap_pages as u64 * P + P).min(geo.file_len() - from);
                        let r = f.file.read(from, len as usize).await?;
                        block = Some((from, r[..].to_vec()));
                    }
                    let epos = geo.entry_pos(u as u32);
                    let e = match &block {
                        Some((from, b))
                            if epos >= *from
                                && epos + ENTRY_LEN as u64 <= from + b.len() as u64 =>
                        {
                            let o = (epos - from) as usize;
                            IndexEntry::decode(&b[o..o + ENTRY_LEN]).unwrap_or_default()
                        }
                        _ => self.entry_on_disk(&f.file, u).await?,
                    };
                    u = if e.prev_index < u { e.prev_index } else { 0 };
                    steps += 1;
                }
                if u != v {
                    buf[o..o + 4].copy_from_slice(&u.to_be_bytes());
                    changed = true;
                    repaired += 1;
                }
                if u != 0 {
                    used += 1;
                }
                at += 4;
            }
            if pos == 0 {
                // Page 0 holds the header: it is written last, once the rest is durable.
                page0 = buf[..PAGE].to_vec();
                if changed && buf.len() > PAGE {
                    self.write_page_run(&f.file, P, &buf[PAGE..]).await?;
                }
            } else if changed {
                self.write_page_run(&f.file, pos, &buf).await?;
            }
            pos += len;
        }
        h.hash_slot_count = used;
        f.file.sync().await?;
        page0[..index_file::HEADER_LEN].copy_from_slice(&h.encode());
        self.write_page_run(&f.file, 0, &page0).await?;
        f.file.sync().await?;
        f.header.set(h);
        if repaired > 0 || cut > 0 {
            tracing::warn!(file = %f.name, repaired, cut, count, "index file repaired after an unclean stop");
        }
        Ok((repaired, cut))
    }

    /// Writes whole pages at aligned `pos`, cutting the file back if the last page
    /// reached past its exact size.
    async fn write_page_run(&self, f: &File, pos: u64, data: &[u8]) -> Result<()> {
        debug_assert!(pos.is_multiple_of(P) && data.len().is_multiple_of(PAGE));
        f.write_aligned(pos, data).await?;
        if pos + data.len() as u64 > self.geo.file_len() {
            f.truncate(self.geo.file_len()).await?;
        }
        Ok(())
    }

    /// [`IndexService::write_page_run`] of a shared DMA buffer, written without a copy.
    async fn write_shared_run(&self, f: &File, pos: u64, data: Rc<DmaBuffer>) -> Result<()> {
        debug_assert!(pos.is_multiple_of(P) && data.len().is_multiple_of(PAGE));
        let end = pos + data.len() as u64;
        f.write_rc(pos, data).await?;
        if end > self.geo.file_len() {
            f.truncate(self.geo.file_len()).await?;
        }
        Ok(())
    }

    fn current(&self) -> Option<Rc<IndexFile>> {
        self.files.borrow().last().cloned()
    }

    fn is_current(&self, f: &Rc<IndexFile>) -> bool {
        self.files.borrow().last().is_some_and(|c| Rc::ptr_eq(c, f))
    }

    fn file_pages(&self) -> u64 {
        self.geo.file_len().div_ceil(P)
    }

    /// Pages holding the slot table (the last one also holds the first entries).
    fn slot_pages(&self) -> u64 {
        self.geo.slots_end().div_ceil(P)
    }

    /// Reads `[pos, pos + len)` of `f` (aligned) with reads of at most 1 MiB, up to
    /// four in flight, and hands each page to `take` in file order.
    async fn read_pages(
        f: &File,
        pos: u64,
        len: u64,
        mut take: impl FnMut(u64, &[u8]),
    ) -> Result<()> {
        const CHUNK: u64 = 1 << 20;
        const IN_FLIGHT: u64 = 4;
        let end = pos + len;
        let mut at = pos;
        while at < end {
            let reads: Vec<_> = (0..IN_FLIGHT)
                .map(|i| at + i * CHUNK)
                .filter(|&from| from < end)
                .map(|from| f.read(from, (CHUNK.min(end - from)) as usize))
                .collect();
            for (i, r) in crate::sync::join_all(reads).await.into_iter().enumerate() {
                let r = r?;
                let from = at + i as u64 * CHUNK;
                let want = CHUNK.min(end - from);
                for k in 0..want.div_ceil(P) {
                    let o = (k * P) as usize;
                    let b = if o < r.len() {
                        &r[o..(o + PAGE).min(r.len())]
                    } else {
                        &[][..]
                    };
                    take(from / P + k, b);
                }
            }
            at += IN_FLIGHT * CHUNK;
        }
        Ok(())
    }

    /// Makes `f` the file of the page set: page 0, and the whole slot table read with
    /// large reads when it fits in three quarters of the set (it then stays: queries
    /// and inserts find every slot in memory).
    async fn load_slot_table(&self, f: &Rc<IndexFile>) -> Result<()> {
        self.pages.borrow_mut().reset(self.file_pages());
        let slot_pages = self.slot_pages();
        let upto = if (slot_pages as usize) + 4 <= self.cap_pages - self.cap_pages / 4 {
            slot_pages
        } else {
            1
        };
        let mut loaded = Vec::with_capacity(upto as usize);
        Self::read_pages(&f.file, 0, upto * P, |p, b| {
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

    /// Fills the read cache at open, newest first, with large reads: the entries of
    /// the current file, then of older files with their slot tables, until it is
    /// full (a query then walks chains in memory and reads only the records).
    async fn warm_cache(&self) -> Result<()> {
        const STEP: u64 = 4 << 20;
        let files: Vec<Rc<IndexFile>> = self.files.borrow().clone();
        for (n, f) in files.iter().rev().enumerate() {
            let h = f.header.get();
            if !h.has_entries() {
                continue;
            }
            let first = self.geo.entry_pos(1) / P;
            let last = (self.geo.entry_pos(h.index_count as u32) - 1) / P;
            let mut ranges = Vec::new();
            // Newest entries first, in steps of STEP bytes.
            let mut hi = last + 1;
            while hi > first {
                let lo = hi.saturating_sub(STEP / P).max(first);
                ranges.push((lo, hi));
                hi = lo;
            }
            if n > 0 {
                ranges.push((0, self.slot_pages()));
            }
            for (lo, hi) in ranges {
                let room = {
                    let c = self.cache.borrow();
                    c.cap.saturating_sub(c.slots.len()) as u64
                };
                if room == 0 {
                    return Ok(());
                }
                let lo = lo.max(hi.saturating_sub(room));
                let mut got = Vec::new();
                let epoch = f.epoch.get();
                Self::read_pages(&f.file, lo * P, (hi - lo) * P, |p, b| {
                    got.push((p, b.to_vec().into_boxed_slice()));
                })
                .await?;
                let current = self.is_current(f);
                let pages = self.pages.borrow();
                let mut cache = self.cache.borrow_mut();
                for (p, mut data) in got {
                    if data.len() < PAGE {
                        let mut v = data.into_vec();
                        v.resize(PAGE, 0);
                        data = v.into_boxed_slice();
                    }
                    if !(current && (pages.has(p) || f.epoch.get() != epoch)) {
                        cache.insert((f.id, p), data);
                    }
                }
            }
        }
        Ok(())
    }

    /// The file new entries go to: created when there is none, rolled when full.
    async fn writable(&self) -> Result<Rc<IndexFile>> {
        if let Some(f) = self.current()
            && (f.header.get().index_count as u32) < self.geo.entries
        {
            return Ok(f);
        }
        let _permit = self
            .flush_lock
            .acquire_permit(1)
            .await
            .map_err(|e| Error::Failed(e.to_string()))?;
        let prev = self.current();
        if let Some(f) = &prev {
            if (f.header.get().index_count as u32) < self.geo.entries {
                return Ok(f.clone());
            }
            // Full: make it durable before the next one takes entries.
            self.flush_locked().await?;
            self.full_flushed_end_ts.set(f.header.get().end_timestamp);
        }
        let now = crate::now_ms();
        let mut wall = now + local_offset_ms(now);
        if let Some(last) = self.files.borrow().last()
            && let Some(t) = index_file::parse_file_name(&last.name)
        {
            wall = wall.max(t + 1);
        }
        let name = index_file::file_name(wall);
        debug_assert_eq!(name.len(), NAME_LEN);
        let path = self.dir.join(&name);
        let file = self.disk.create_sized(&path, self.geo.file_len()).await?;
        let header = match &prev {
            Some(p) => {
                let ph = p.header.get();
                IndexHeader {
                    begin_timestamp: ph.end_timestamp,
                    end_timestamp: ph.end_timestamp,
                    begin_phy_offset: ph.end_phy_offset,
                    end_phy_offset: ph.end_phy_offset,
                    hash_slot_count: 0,
                    index_count: 1,
                }
            }
            None => IndexHeader::empty(),
        };
        let f = Rc::new(IndexFile {
            id: next_file_id(),
            name,
            file,
            header: Cell::new(header),
            written: RefCell::new(Some(vec![0u64; self.file_pages().div_ceil(64) as usize])),
            epoch: Cell::new(0),
        });
        // The full file's pages (all written and durable) go to the read cache.
        if let Some(p) = &prev {
            let mut pages = self.pages.borrow_mut();
            let mut cache = self.cache.borrow_mut();
            for (n, slot) in pages.pages.iter_mut().enumerate() {
                if let Some(pg) = slot.take() {
                    cache.insert((p.id, n as u64), Box::new(pg.data));
                }
            }
        }
        {
            let mut pages = self.pages.borrow_mut();
            pages.reset(self.file_pages());
            pages.insert(0, Page::zeroed());
            // Page 0 is new: dirty, so the first flush writes it.
            pages.write(0, &[0u8; 4]);
        }
        self.durable.set(IndexHeader {
            index_count: -1,
            ..IndexHeader::empty()
        });
        self.files.borrow_mut().push(f.clone());
        tracing::debug!(path = %path.display(), "index file created");
        Ok(f)
    }

    /// Indexes one dispatched record (idempotent: records below [`Self::indexed_end`]
    /// are skipped). A key whose pages are in the page set is added without awaiting.
    pub async fn add(&self, r: &RecordView<'_>) -> Result<()> {
        self.add_from(r, 0).await
    }

    /// [`IndexService::add`] without awaiting: adds the record's keys while their
    /// pages are in the page set. `None` when the record is done; `Some(k)` when it
    /// stopped after `k` keys, and [`IndexService::add_from`]`(r, k)` must finish it.
    /// The dispatcher decodes records in place in a resident log window, which it
    /// cannot hold across an await; this lets it stay there for almost every record.
    pub fn add_now(&self, r: &RecordView<'_>) -> Option<usize> {
        if r.phys_offset < 0 || (r.phys_offset as u64) < self.indexed_end.get() {
            return None;
        }
        let mut added = 0;
        for hash in self.key_hashes(r) {
            if !self.put_key_now(hash, r.phys_offset as u64, r.store_timestamp) {
                return Some(added);
            }
            added += 1;
        }
        let Some(f) = self.current() else {
            return Some(added);
        };
        self.end_record(&f, r);
        None
    }

    /// [`IndexService::add`] after the first `skip` keys were added.
    pub async fn add_from(&self, r: &RecordView<'_>, skip: usize) -> Result<()> {
        if r.phys_offset < 0 || (r.phys_offset as u64) < self.indexed_end.get() {
            return Ok(());
        }
        let phys = r.phys_offset as u64;
        for hash in self.key_hashes(r).skip(skip) {
            if !self.put_key_now(hash, phys, r.store_timestamp) {
                self.put_key(hash, phys, r.store_timestamp).await?;
            }
        }
        let f = match self.current() {
            Some(f) => f,
            None => self.writable().await?,
        };
        self.end_record(&f, r);
        Ok(())
    }

    /// The key hashes of a record, in the order they are added (none for a rolled
    /// back transaction).
    fn key_hashes<'r>(&self, r: &RecordView<'r>) -> impl Iterator<Item = i32> + 'r {
        let (uniq, keys) = if r.sys_flag & record::SYSFLAG_TRANSACTION_MASK
            != record::SYSFLAG_TRANSACTION_ROLLBACK
        {
            index_file::index_properties(r.properties)
        } else {
            (None, None)
        };
        let topic = r.topic;
        let mut prefix = None;
        index_keys(uniq, keys).map(move |key| {
            let prefix = *prefix.get_or_insert_with(|| index_file::topic_prefix_hash(topic));
            index_file::key_hash_with(prefix, key)
        })
    }

    /// Marks record `r` (all its keys in) as indexed: the header's end moves to it.
    fn end_record(&self, f: &IndexFile, r: &RecordView<'_>) {
        let phys = r.phys_offset as u64;
        let mut h = f.header.get();
        h.end_phy_offset = phys as i64;
        h.end_timestamp = r.store_timestamp;
        f.header.set(h);
        self.indexed_end.set(phys + 1);
        self.end_before_record.set(false);
    }

    /// Adds one entry when the current file has room and its pages (slot, entry) are
    /// in the page set; `false` (nothing changed) otherwise.
    fn put_key_now(&self, hash: i32, phys: u64, ts: i64) -> bool {
        let geo = self.geo;
        let files = self.files.borrow();
        let Some(f) = files.last() else {
            return false;
        };
        let mut h = f.header.get();
        let idx = h.index_count;
        if idx as u32 >= geo.entries {
            return false;
        }
        let slot_pos = geo.slot_pos(geo.slot_of(hash));
        let epos = geo.entry_pos(idx as u32);
        let mut pages = self.pages.borrow_mut();
        if !(pages.has(slot_pos / P)
            && pages.has(epos / P)
            && pages.has((epos + ENTRY_LEN as u64 - 1) / P))
        {
            return false;
        }
        let v = pages.read_i32(slot_pos);
        let prev = if geo.valid_link(v, idx) { v } else { 0 };
        if !h.has_entries() {
            h.begin_timestamp = ts;
            h.begin_phy_offset = phys as i64;
        }
        let e = IndexEntry {
            key_hash: hash,
            phy_offset: phys as i64,
            time_diff: index_file::time_diff(ts, h.begin_timestamp),
            prev_index: prev,
        };
        pages.write(epos, &e.encode());
        pages.write(slot_pos, &idx.to_be_bytes());
        if prev == 0 {
            h.hash_slot_count = h.hash_slot_count.saturating_add(1);
        }
        // endPhyOffset moves in `add` once every key of the record is in, so a
        // flush between two keys never marks the record as done.
        h.index_count += 1;
        f.header.set(h);
        true
    }

    /// Adds one entry, first creating or rolling the file and loading its pages.
    async fn put_key(&self, hash: i32, phys: u64, ts: i64) -> Result<()> {
        let geo = self.geo;
        let slot_pos = geo.slot_pos(geo.slot_of(hash));
        loop {
            let f = self.writable().await?;
            let idx = f.header.get().index_count;
            let epos = geo.entry_pos(idx as u32);
            let need = [0, slot_pos / P, epos / P, (epos + ENTRY_LEN as u64 - 1) / P];
            self.ensure_pages(&f, &need).await?;
            // Something awaited above may have rolled the file or moved the count;
            // then (or if the pages are still missing) go round again.
            if self.put_key_now(hash, phys, ts) {
                return Ok(());
            }
        }
    }

    /// Loads the pages `need` of the current file into the page set, making room
    /// first when it is full.
    async fn ensure_pages(&self, f: &Rc<IndexFile>, need: &[u64]) -> Result<()> {
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
    /// pages (entry pages first, into the read cache) down to 3/4 of the page set,
    /// keeping page 0 and `keep`.
    async fn make_room(&self, keep: &[u64]) -> Result<()> {
        let _permit = self
            .flush_lock
            .acquire_permit(1)
            .await
            .map_err(|e| Error::Failed(e.to_string()))?;
        let Some(f) = self.current() else {
            return Ok(());
        };
        let slot_pages = self.slot_pages();
        let target = self.cap_pages - self.cap_pages / 4;
        // Clean entry pages alone may make room; else write everything out first.
        let droppable = {
            let pages = self.pages.borrow();
            (slot_pages.max(1)..pages.pages.len() as u64)
                .filter(|p| !keep.contains(p) && pages.get(*p).is_some_and(|pg| !pg.dirty))
                .count()
        };
        if self.pages.borrow().len.saturating_sub(droppable) > target {
            self.flush_locked().await?;
        }
        // Entry pages (above the slot table) are written once and rarely read again
        // by inserts: drop them all (queries find them in the read cache). Slot pages
        // are the hot, random part: drop only down to 3/4, the highest first. A yield
        // every 128 pages dropped: dropping ~3,300 entry pages in one go held the
        // shard ~3.5-4 ms (each page moves into the read cache).
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
            if keep.contains(&p) || pages.get(p).is_none_or(|pg| pg.dirty) {
                continue;
            }
            let pg = pages.remove(p).expect("present");
            self.cache.borrow_mut().insert((f.id, p), Box::new(pg.data));
            dropped += 1;
        }
        Ok(())
    }

    /// Makes the current file durable up to now (see the module docs for the order).
    pub async fn flush(&self) -> Result<()> {
        let _permit = self
            .flush_lock
            .acquire_permit(1)
            .await
            .map_err(|e| Error::Failed(e.to_string()))?;
        self.flush_locked().await
    }

    async fn flush_locked(&self) -> Result<()> {
        let Some(f) = self.current() else {
            return Ok(());
        };
        let h = f.header.get();
        // Copies of the dirty pages, adjacent ones joined into runs of up to 1 MiB
        // (the page where slots end and page 0 alone: they are written in steps). They
        // count as clean from here on (a change made while this flush runs marks its
        // page dirty again). Pages are copied once, straight into the DMA buffers the
        // writes take: with one key per message nearly every slot page is dirty at
        // every flush (20 MB per second per shard), and copying it twice (a `Vec`,
        // then a DMA buffer in `File::write_aligned`) was ~4% of the CPU per message.
        let boundary = (self.geo.slots_end() - 1) / P;
        let alone = |q: u64| q == 0 || q == boundary;
        // The copy is a snapshot of this instant (consistent with `h`), taken a run
        // at a time with a yield between runs: a page written meanwhile is copied
        // first (copy-on-write, `PageSet::write`). Copying ~22 MB in one go held the
        // shard for 3.7-5.3 ms (11-15 ms with fresh buffers) once a second: put p99
        // 2.9-4.7 ms at 250 k msg/s against 0.4-0.5 ms with `--no-index`.
        let (spans, taken) = {
            let mut pages = self.pages.borrow_mut();
            let mut dirty = std::mem::take(&mut pages.dirty);
            dirty.sort_unstable();
            let mut taken = Vec::with_capacity(dirty.len());
            // (first page, pages) of each run.
            let mut spans: Vec<(u64, u64)> = Vec::new();
            for p in dirty {
                let Some(pg) = pages.pages[p as usize].as_deref_mut() else {
                    continue;
                };
                pg.dirty = false;
                taken.push(p);
                match spans.last_mut() {
                    Some((start, n))
                        if !alone(p)
                            && !alone(*start)
                            && *start + *n == p
                            && (*n as usize) * PAGE < RUN_BYTES =>
                    {
                        *n += 1
                    }
                    _ => spans.push((p, 1)),
                }
            }
            if spans.is_empty() && h == self.durable.get() {
                return Ok(());
            }
            if spans.first().is_none_or(|(p, _)| *p != 0) {
                // Page 0 holds the header (replaced by `h` below) and the first slots.
                spans.insert(0, (0, 1));
            }
            let bufs: Vec<DmaBuffer> = spans
                .iter()
                .map(|&(_, n)| {
                    let len = n as usize * PAGE;
                    if len == RUN_BYTES {
                        self.run_bufs
                            .borrow_mut()
                            .pop()
                            .unwrap_or_else(|| allocate_dma_buffer_global(RUN_BYTES))
                    } else {
                        allocate_dma_buffer(len)
                    }
                })
                .collect();
            pages.begin_snapshot(&spans, bufs);
            (spans, taken)
        };
        // Should this future be dropped between runs, no page may keep a mark into
        // buffers the next flush would reuse.
        let guard = SnapshotGuard {
            pages: &self.pages,
            spans: &spans,
        };
        // Small snapshots (an open's, a light load's) are copied without yielding:
        // a bare yield has no I/O or timer behind it, and glommio 0.9.0 could park
        // with the yielded task runnable (fixed in vendor/glommio, COREMQ-PATCHES.md);
        // with yields here `tests/liveness.rs` hung in its first open in 2 of 5 runs.
        let yields = spans.len() >= YIELDING_SNAPSHOT_RUNS;
        for (r, &(start, n)) in spans.iter().enumerate() {
            self.pages.borrow_mut().copy_snapshot_run(r, start, n);
            if yields {
                futures_lite::future::yield_now().await;
            }
        }
        std::mem::forget(guard);
        let bufs = std::mem::take(&mut self.pages.borrow_mut().snapshot);
        let mut runs: Vec<(u64, DmaBuffer)> =
            spans.iter().map(|&(start, _)| start).zip(bufs).collect();
        runs[0].1.as_bytes_mut()[..index_file::HEADER_LEN].copy_from_slice(&h.encode());
        let runs: Vec<(u64, Rc<DmaBuffer>)> =
            runs.into_iter().map(|(p, b)| (p, Rc::new(b))).collect();
        let r = self.write_snapshot(&f, &runs, boundary).await;
        // Keep the whole-run buffers for the next flush (at most a flush's worth):
        // fresh ones cost a page fault per page (the 11-15 ms above), and most runs
        // are whole (~20 MB of slot pages per shard per second with one key per
        // message).
        {
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
        Ok(())
    }

    /// Writes a flush's runs of page copies (ascending; page 0 and the page where
    /// slots end alone) in the crash-safe order of the module docs. The writes of a
    /// step are in flight together (up to 16); each step ends with an fdatasync.
    async fn write_snapshot(
        &self,
        f: &Rc<IndexFile>,
        runs: &[(u64, Rc<DmaBuffer>)],
        boundary: u64,
    ) -> Result<()> {
        // Step 1: pages holding only entries.
        if self
            .write_runs(f, runs.iter().filter(|(p, _)| *p > boundary))
            .await?
        {
            f.file.sync().await?;
        }
        if let Some((p, data)) = runs.iter().find(|(p, _)| *p == boundary) {
            // This page holds the last slots and the first entries: land the
            // entries first (slots as on disk), so no slot ever names an entry
            // whose sector did not make it. (When it is page 0 the rest follows
            // with page 0 below.)
            let slot_bytes = (self.geo.slots_end() - p * P) as usize;
            let on_disk = f.file.read(p * P, PAGE).await?;
            if on_disk.len() >= slot_bytes {
                let mut first = data.as_bytes().to_vec();
                first[..slot_bytes].copy_from_slice(&on_disk[..slot_bytes]);
                if first[..] != data.as_bytes()[..] {
                    self.write_page_run(&f.file, p * P, &first).await?;
                    f.file.sync().await?;
                }
            }
            if boundary != 0 {
                self.write_page_run(&f.file, p * P, data.as_bytes()).await?;
                f.mark_written(*p);
                f.file.sync().await?;
            }
        }
        // Step 3: the other slot pages.
        if self
            .write_runs(f, runs.iter().filter(|(p, _)| *p < boundary && *p != 0))
            .await?
        {
            f.file.sync().await?;
        }
        // Last, page 0 (header and slots, and with a small slot table entries): a
        // power loss can tear its sectors apart. Written first with the header that
        // is on disk and synced, so the new header then changes only its own sector:
        // it never lands without the slots and entries it counts.
        let (_, data) = runs
            .iter()
            .find(|(p, _)| *p == 0)
            .expect("page 0 is in every flush");
        let durable = self.durable.get();
        let mut first = data.as_bytes().to_vec();
        if durable.index_count < 0 {
            first[..index_file::HEADER_LEN].fill(0);
        } else {
            first[..index_file::HEADER_LEN].copy_from_slice(&durable.encode());
        }
        if first[..] != data.as_bytes()[..] {
            self.write_page_run(&f.file, 0, &first).await?;
            f.file.sync().await?;
        }
        self.write_page_run(&f.file, 0, data.as_bytes()).await?;
        f.mark_written(0);
        f.file.sync().await?;
        Ok(())
    }

    /// Writes runs of pages, at most 16 writes in flight. `true` if anything was
    /// written.
    async fn write_runs<'a>(
        &self,
        f: &Rc<IndexFile>,
        runs: impl Iterator<Item = &'a (u64, Rc<DmaBuffer>)>,
    ) -> Result<bool> {
        const IN_FLIGHT: usize = 16;
        let runs: Vec<&(u64, Rc<DmaBuffer>)> = runs.collect();
        for group in runs.chunks(IN_FLIGHT) {
            let writes: Vec<_> = group
                .iter()
                .map(|(start, buf)| self.write_shared_run(&f.file, start * P, buf.clone()))
                .collect();
            for r in crate::sync::join_all(writes).await {
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

    /// Copies `out.len()` bytes at `pos` of file `f` (within one page or two): from
    /// the page set when `f` is the current file and the page is there, else from the
    /// read cache, else from disk (the page read whole and cached).
    async fn read_into(&self, f: &Rc<IndexFile>, pos: u64, out: &mut [u8]) -> Result<()> {
        let end = pos + out.len() as u64;
        let mut at = pos;
        while at < end {
            let page = at / P;
            let o = (at % P) as usize;
            let n = (((page + 1) * P).min(end) - at) as usize;
            let dst = &mut out[(at - pos) as usize..(at - pos) as usize + n];
            at += n as u64;
            let current = self.is_current(f);
            if current && let Some(pg) = self.pages.borrow().get(page) {
                dst.copy_from_slice(&pg.data[o..o + n]);
                continue;
            }
            if let Some(b) = self.cache.borrow_mut().get((f.id, page)) {
                dst.copy_from_slice(&b[o..o + n]);
                continue;
            }
            if f.known_zero(page) {
                dst.fill(0);
                continue;
            }
            let epoch = f.epoch.get();
            let r = f.file.read(page * P, PAGE).await?;
            let mut data = vec![0u8; PAGE].into_boxed_slice();
            let got = r.len().min(PAGE);
            data[..got].copy_from_slice(&r[..got]);
            dst.copy_from_slice(&data[o..o + n]);
            // A page of the current file that entered the page set meanwhile may have
            // changed since this read started: not cached.
            if !(self.is_current(f) && (f.epoch.get() != epoch || self.pages.borrow().has(page))) {
                self.cache.borrow_mut().insert((f.id, page), data);
            }
        }
        Ok(())
    }

    /// Walks the chains of `topic#key`, newest first (files newest to oldest), and
    /// calls `verify` with each candidate commit-log offset whose approximate store
    /// time may lie in `[begin, end]` (each offset once). Stops after `max` results.
    pub async fn query<T, F, Fut>(
        &self,
        topic: &str,
        key: &str,
        begin: i64,
        end: i64,
        max: usize,
        mut verify: F,
    ) -> Result<Vec<T>>
    where
        F: FnMut(u64) -> Fut,
        Fut: Future<Output = Result<Option<T>>>,
    {
        let geo = self.geo;
        let hash = index_file::key_hash(topic, key);
        let slot_pos = geo.slot_pos(geo.slot_of(hash));
        let files: Vec<Rc<IndexFile>> = self.files.borrow().clone();
        let mut out = Vec::new();
        let mut seen = AHashSet::new();
        if max == 0 {
            return Ok(out);
        }
        // Candidates are verified (their records read) concurrently, in batches of
        // as many as could still be needed; results keep the chain's order.
        let mut pending: Vec<u64> = Vec::new();
        for f in files.iter().rev() {
            let h = f.header.get();
            if !h.has_entries() || h.begin_timestamp > end {
                continue;
            }
            if h.end_timestamp < begin {
                break;
            }
            let mut head = [0u8; 4];
            self.read_into(f, slot_pos, &mut head).await?;
            let mut i = i32::from_be_bytes(head);
            let mut b = [0u8; ENTRY_LEN];
            while geo.valid_link(i, f.header.get().index_count) {
                self.read_into(f, geo.entry_pos(i as u32), &mut b).await?;
                let Ok(e) = IndexEntry::decode(&b) else { break };
                // The real store time lies in [t, t + 999].
                let t = e.time(&f.header.get());
                if t.saturating_add(999) < begin {
                    break;
                }
                if e.key_hash == hash && t <= end && e.phy_offset >= 0 && seen.insert(e.phy_offset)
                {
                    pending.push(e.phy_offset as u64);
                    if pending.len() >= max - out.len()
                        && Self::verify_batch(&mut pending, &mut verify, &mut out, max).await?
                    {
                        return Ok(out);
                    }
                }
                if e.prev_index >= i {
                    break;
                }
                i = e.prev_index;
            }
            if Self::verify_batch(&mut pending, &mut verify, &mut out, max).await? {
                return Ok(out);
            }
        }
        Ok(out)
    }

    /// Verifies the pending candidates concurrently; `true` once `out` holds `max`.
    async fn verify_batch<T, F, Fut>(
        pending: &mut Vec<u64>,
        verify: &mut F,
        out: &mut Vec<T>,
        max: usize,
    ) -> Result<bool>
    where
        F: FnMut(u64) -> Fut,
        Fut: Future<Output = Result<Option<T>>>,
    {
        let futs: Vec<Fut> = pending.drain(..).map(&mut *verify).collect();
        for r in crate::sync::join_all(futs).await {
            if let Some(v) = r? {
                out.push(v);
                if out.len() >= max {
                    return Ok(true);
                }
            }
        }
        Ok(false)
    }
}

impl Store {
    /// Messages of `topic` carrying `key` (a `KEYS` part or the `UNIQ_KEY`) stored
    /// within `[begin_ms, end_ms]` (inclusive, store time), newest first, at most
    /// `max` (clamped to `query_max`, 64 by default). Each hit is read from the
    /// CommitLog and verified: checksums, topic, the real key (hashes collide) and
    /// the exact store time, so only true matches come back.
    ///
    /// Bad input: an empty topic or key, a key longer than 32767 bytes (no record can
    /// carry one), or `begin_ms > end_ms` is `Error::BadRequest`; `max == 0` is an
    /// empty answer. With the index disabled (`index_enable = false`) every query is
    /// `Error::BadRequest`.
    pub async fn query_by_key(
        &self,
        topic: &str,
        key: &str,
        max: usize,
        begin_ms: i64,
        end_ms: i64,
    ) -> Result<Vec<StoredMessage>> {
        check_query(topic, key, begin_ms, end_ms)?;
        let Some(ix) = self.index_service() else {
            return Err(Error::BadRequest(
                "the key index is disabled on this store".into(),
            ));
        };
        let max = max.min(self.config().query_max);
        ix.query(topic, key, begin_ms, end_ms, max, |offset| async move {
            let Some(m) = self.look_by_offset(offset).await? else {
                return Ok(None);
            };
            let ok = m.topic == topic
                && (begin_ms..=end_ms).contains(&m.store_timestamp_ms)
                && index_file::has_key(
                    m.property(properties::UNIQ_KEY),
                    m.property(properties::KEYS),
                    key,
                );
            Ok(ok.then_some(m))
        })
        .await
    }
}

/// The index directory of a store root.
pub fn index_dir(root: &Path) -> PathBuf {
    root.join("index")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(b: u8) -> Box<[u8]> {
        vec![b; PAGE].into_boxed_slice()
    }

    #[test]
    fn read_cache_is_bounded_and_evicts_cold_pages_first() {
        let mut c = ReadCache::new(3);
        for p in 0..3 {
            c.insert((1, p), page(p as u8));
        }
        // Page 0 and 2 used: the CLOCK hand passes them and takes page 1.
        assert_eq!(c.get((1, 0)).unwrap()[0], 0);
        assert_eq!(c.get((1, 2)).unwrap()[0], 2);
        c.insert((2, 7), page(9));
        assert_eq!(c.slots.len(), 3);
        assert!(c.get((1, 1)).is_none());
        assert_eq!(c.get((2, 7)).unwrap()[0], 9);
        // Replacing keeps the count; removing moves the last slot and keeps the map right.
        c.insert((1, 0), page(5));
        assert_eq!(c.get((1, 0)).unwrap()[0], 5);
        assert_eq!(c.remove((1, 0)).unwrap()[0], 5);
        assert!(c.remove((1, 0)).is_none());
        assert_eq!(c.slots.len(), 2);
        for (k, v) in [((1, 2), 2), ((2, 7), 9)] {
            assert_eq!(c.get(k).unwrap()[0], v);
        }
        for i in 0..100 {
            c.insert((3, i), page(i as u8));
            assert!(c.slots.len() <= 3 && c.map.len() == c.slots.len());
            assert_eq!(c.get((3, i)).unwrap()[0], i as u8);
        }
        let mut none = ReadCache::new(0);
        none.insert((1, 1), page(1));
        assert!(none.get((1, 1)).is_none());
    }

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
        s.copy_snapshot_run(0, 0, 1);
        // Written after its run was copied: no effect on the snapshot.
        s.write(0, &[7; 4]);
        s.copy_snapshot_run(1, 1, 3);
        s.write(3 * P, &[8; 4]);
        let snap = std::mem::take(&mut s.snapshot);
        assert_eq!(snap[0].as_bytes()[..8], [1; 8]);
        assert_eq!(snap[1].as_bytes()[..8], [2; 8]);
        assert_eq!(snap[1].as_bytes()[PAGE..PAGE + 8], [3; 8]);
        assert_eq!(snap[1].as_bytes()[2 * PAGE..2 * PAGE + 8], [4; 8]);
        // The pages themselves have the new bytes, and no copy is pending.
        assert_eq!(s.get(2).unwrap().data[..5], [9, 9, 9, 9, 3]);
        assert_eq!(s.get(0).unwrap().data[..5], [7, 7, 7, 7, 1]);
        assert!((0..4).all(|p| s.get(p).unwrap().snap.is_none()));
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
            s.copy_snapshot_run(0, 1, 2);
        }
        // As `flush_locked` takes them: not dirty while the snapshot is out.
        drop(SnapshotGuard {
            pages: &cell,
            spans: &[(1, 2), (3, 1)],
        });
        let s = cell.borrow();
        assert!(s.snapshot.is_empty());
        assert!((0..4).all(|p| s.get(p).unwrap().snap.is_none()));
        let mut dirty = s.dirty.clone();
        dirty.sort_unstable();
        assert_eq!(dirty, vec![1, 2, 3]);
    }
}
