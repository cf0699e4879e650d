//! One shard's key index: RocketMQ's `IndexService` over `IndexFile`s (byte layout in
//! [`crate::format::index_file`]) under `<shard root>/index/`. Dispatch hands it every
//! record ([`IndexService::add_now`], [`IndexService::add`]); the store's
//! `query_by_key` looks keys up ([`IndexService::query`]). Every `KEYS` part and the
//! `UNIQ_KEY` is indexed as `topic#key`; rolled-back transaction records are skipped,
//! as in RocketMQ.
//!
//! Parts: `file.rs` one open IndexFile; `page_set.rs` the current file's pages in
//! memory; `page_cache.rs` clean pages for queries; `flush.rs` the crash-safe write of
//! dirty pages; `repair.rs` opening and repairing after a crash; `query.rs` key lookups.
//!
//! # Invariants
//!
//! * **Resumable, idempotent.** The header's `endPhyOffset` is the commit-log offset of
//!   the last record the index has taken, with or without keys; records up to it are
//!   skipped, so re-dispatch is harmless. It moves only once every key of a record is
//!   in, so a flush between two keys never marks the record done (its first keys may
//!   then be written twice; queries return each record once). At open the store
//!   re-dispatches from min(checkpoint dispatch point, [`IndexService::resume_point`]).
//! * **Durable only by a flush** (from a checkpoint round once it is due, see below; when
//!   the page set is full, when a file fills, at shutdown, by `Store::checkpoint`), which
//!   writes in steps, each ended by an
//!   fdatasync: (1) pages holding only entries; (2) the page where slots end and entries
//!   begin, first with its slots as on disk, then whole; (3) the other slot pages; (4)
//!   page 0 with the header already on disk; (5) page 0 with the new header. A power
//!   loss can tear a page's sectors apart (found by the simulated disk, tests/sim.rs),
//!   so this order is what makes it true that a slot on disk never names an entry that
//!   is not on disk, and a header on disk never counts entries that are not.
//! * **After an unclean stop** the last file is repaired at open: slots naming entries
//!   at or past the header's count are walked back along the durable chain, and entries
//!   for records the recovered CommitLog lost are cut (see `repair.rs`).
//! * **Bounded memory**: the page set holds at most `index_max_dirty_bytes` (a flush's
//!   copy makes the peak twice that, plus up to 16 MiB of writes in flight), the page
//!   cache at most `index_cache_bytes`; neither grows with the log.
//!
//! # Decisions
//!
//! * **Flushed when due, not at every checkpoint round**: once
//!   `index_flush_least_pages` pages changed (2,048, 8 MiB) or
//!   `index_flush_thorough_interval` passed (10 s). Keys land on random slot pages, so at
//!   1,000 puts a second a round every second wrote ~160 runs per shard, most of one or
//!   two pages, each through an io_uring worker and a completion worker; flushed when due,
//!   ~19 writes a second per shard averaging 136 KiB. Under load the threshold is passed
//!   every round, as before. The checkpoint claims nothing about the index, which resumes
//!   from its own durable point, so a later flush only lengthens the re-dispatch after a
//!   crash (at most the interval's records at light load).
//! * **Repair, not RocketMQ's delete of the last file** after an abnormal stop: the
//!   re-dispatch at open then covers only what the index had not made durable.
//! * **Inserts without an await** ([`IndexService::add_now`]): the dispatcher decodes
//!   records in place in a resident log window, which it cannot hold across an await. A
//!   key whose slot and entry pages are in the page set (the slot always once the table
//!   is loaded; the tail entry page almost always) is an index into a page table: no
//!   hash map, no allocation; ~0.30 us per key, of which ~0.17 us is the one cache miss
//!   on the random slot (the 20 MB table fits no CPU cache), against ~0.53 us with a
//!   hashed page set and three awaits per key. With that and the flush in runs, a 5 s
//!   run with one key per message went from 158-246 k msg/s (the dispatcher fell behind)
//!   to 243-318 k msg/s.
//! * **The slot table and the newest entries stay in memory** (page set, page cache):
//!   a key query at 10 M keys answered hits at p50 105 us / p99 3.1 ms and misses at 3 us
//!   / 16 us, against 531 us / 16.6 ms and 227 us / 12 ms with slots and chains read from
//!   disk, for 391 MiB of RSS instead of 169 MiB (two shards).
//! * **Deviations from RocketMQ, on purpose**: a new file's begin time is set before its
//!   first entry's time difference is taken (RocketMQ computes that difference against
//!   the previous file's end time; here the first entry's is 0); `endPhyOffset` and
//!   `endTimestamp` also advance for records without keys (RocketMQ: only with keys), so
//!   a store without keys does not re-read its whole log at every open.
//!
//! How these figures were taken: `docs/performance/index.md`.

mod check;
mod clean;
mod file;
mod flush;
mod page_cache;
mod page_set;
mod query;
mod repair;

pub use query::check_query;

use crate::config::INDEX_MIN_PAGES;
use crate::config::StoreConfig;
use crate::error::{Error, Result};
use crate::format::index_file::{self, ENTRY_LEN, Geometry, IndexEntry, IndexHeader, index_keys};
use crate::format::record::{self, RecordView};
use crate::io::{Disk, PAGE};
use file::IndexFile;
use glommio::io::DmaBuffer;
use glommio::sync::{Permit, Semaphore};
use page_cache::PageCache;
use page_set::PageSet;
use std::cell::{Cell, RefCell};
use std::path::PathBuf;
use std::rc::Rc;

/// Longest key a query accepts: no record can carry a longer one (properties are
/// limited to 32767 bytes).
pub const MAX_KEY_LEN: usize = record::MAX_PROPERTIES_LEN;
const P: u64 = PAGE as u64;

/// Whether commit-log offset `phy` (as stored, may be -1) is at or past `end`.
fn past(phy: i64, end: u64) -> bool {
    phy >= 0 && phy as u64 >= end
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
    cache: RefCell<PageCache>,
    /// Records below this commit-log offset are already indexed.
    indexed_end: Cell<u64>,
    /// Set when a repair left `endPhyOffset` one byte before a record (that record's
    /// keys are to be indexed again), not at a record's start.
    end_before_record: Cell<bool>,
    /// The last file's header as last made durable (`index_count` -1: nothing yet).
    durable: Cell<IndexHeader>,
    /// End time of the last full file flushed (the checkpoint's indexMsgTimestamp).
    full_flushed_end_ts: Cell<i64>,
    /// The highest commit-log offset the index named when it was opened (-1: none).
    high_water: Cell<i64>,
    /// Serialises flushes, rollovers and evictions.
    flush_lock: Semaphore,
    /// Run buffers of earlier flushes, reused (see `flush.rs`).
    run_bufs: RefCell<Vec<DmaBuffer>>,
    /// When a checkpoint round flushes (see [`IndexService::flush_when_due`]).
    flush_least_pages: usize,
    flush_thorough_interval: std::time::Duration,
    /// When the last flush ended (or the index opened).
    last_flush: Cell<std::time::Instant>,
    /// Flushes that wrote something, and their writes (store statistics).
    flushes: Cell<u64>,
    flush_writes: Cell<u64>,
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
        let files = repair::open_files(&disk, &dir, geo).await?;
        let svc = IndexService {
            dir,
            disk,
            geo,
            cap_pages: (cfg.index_max_dirty_bytes / PAGE).max(INDEX_MIN_PAGES),
            files: RefCell::new(files),
            pages: RefCell::new(PageSet::default()),
            cache: RefCell::new(PageCache::new(cfg.index_cache_bytes / PAGE)),
            indexed_end: Cell::new(0),
            end_before_record: Cell::new(false),
            durable: Cell::new(IndexHeader::empty()),
            full_flushed_end_ts: Cell::new(0),
            high_water: Cell::new(-1),
            flush_lock: Semaphore::new(1),
            run_bufs: RefCell::new(Vec::new()),
            flush_least_pages: cfg.index_flush_least_pages,
            flush_thorough_interval: cfg.index_flush_thorough_interval,
            last_flush: Cell::new(std::time::Instant::now()),
            flushes: Cell::new(0),
            flush_writes: Cell::new(0),
        };
        // The page set's tables (a slot per page of a file, ~2 MB at the default 5 M slots
        // and 20 M entries) laid out here, at open: laid out in fresh memory by the first
        // key's `start_file` they held that dispatch poll 1.3-1.7 ms (page faults); a
        // file's layout into the same tables later takes a fraction of it.
        svc.pages.borrow_mut().reset(svc.file_pages());
        let report = svc.settle(clean, log_end).await?;
        svc.warm_cache().await?;
        Ok((svc, report))
    }

    /// Drops the files whose every entry names a record at or past `log_end`, repairs
    /// the last file when the stop was not `clean` or it names such records, makes that
    /// file the page set's, and sets the resume point from it.
    async fn settle(&self, clean: bool, log_end: u64) -> Result<IndexOpenReport> {
        let mut report = IndexOpenReport {
            entries_cut: self.drop_lost_files(log_end).await?,
            ..Default::default()
        };
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
                high = high.max(last.entry_on_disk(h.index_count - 1).await?.phy_offset);
            }
            self.high_water.set(high);
            self.load_slot_table(&last).await?;
        }
        let full_end = self
            .files
            .borrow()
            .iter()
            .rev()
            .find(|f| f.header.get().index_count as u32 >= self.geo.entries)
            .map_or(0, |full| full.header.get().end_timestamp);
        self.full_flushed_end_ts.set(full_end);
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
        self.cache.borrow_mut().clear();
        let report = self.settle(false, log_end).await?;
        tracing::warn!(dir = %self.dir.display(), log_end, ?report, "key index cut back to the recovered log");
        self.warm_cache().await?;
        Ok(true)
    }

    /// Records below this commit-log offset are already indexed (one past the start
    /// of the last record taken).
    pub fn indexed_end(&self) -> u64 {
        self.indexed_end.get()
    }

    /// A commit-log record boundary from which re-dispatching completes the index:
    /// the last record it took (records it has are skipped, so re-reading that one is
    /// harmless), or the record a repair left to index again; 0 with no index. Not
    /// `indexed_end`, which is no boundary: a dispatch started there fails and every
    /// queue was rebuilt from the whole log at every reopen.
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

    /// Indexes one dispatched record (idempotent: records below [`Self::indexed_end`]
    /// are skipped). A key whose pages are in the page set is added without awaiting.
    pub async fn add(&self, r: &RecordView<'_>) -> Result<()> {
        self.add_from(r, 0).await
    }

    /// [`IndexService::add`] without awaiting: adds the record's keys while their
    /// pages are in the page set. `None` when the record is done; `Some(k)` when it
    /// stopped after `k` keys, and [`IndexService::add_from`]`(r, k)` must finish it.
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
    /// back transaction). The topic is hashed once per record, not once per key.
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
        // endPhyOffset moves in `end_record`, once every key of the record is in.
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

    /// The file new entries go to: created when there is none; when the current one is
    /// full, it is flushed (durable before the next one takes entries) and a new one
    /// rolled.
    async fn writable(&self) -> Result<Rc<IndexFile>> {
        if let Some(f) = self.current()
            && (f.header.get().index_count as u32) < self.geo.entries
        {
            return Ok(f);
        }
        let _permit = self.lock_flush().await?;
        let prev = self.current();
        if let Some(f) = &prev {
            if (f.header.get().index_count as u32) < self.geo.entries {
                return Ok(f.clone());
            }
            self.flush_locked().await?;
            self.full_flushed_end_ts.set(f.header.get().end_timestamp);
        }
        let f = Rc::new(IndexFile::create(&self.disk, &self.dir, self.geo, prev.as_deref()).await?);
        self.start_file(prev.as_deref());
        self.durable.set(IndexHeader {
            index_count: -1,
            ..IndexHeader::empty()
        });
        self.files.borrow_mut().push(f.clone());
        self.fill_slot_table(&f).await;
        Ok(f)
    }

    /// Takes the lock that serialises flushes, rollovers and evictions.
    async fn lock_flush(&self) -> Result<Permit<'_>> {
        self.flush_lock
            .acquire_permit(1)
            .await
            .map_err(|e| Error::Failed(e.to_string()))
    }

    fn current(&self) -> Option<Rc<IndexFile>> {
        self.files.borrow().last().cloned()
    }

    fn is_current(&self, f: &IndexFile) -> bool {
        self.files
            .borrow()
            .last()
            .is_some_and(|c| std::ptr::eq(&**c, f))
    }

    fn file_pages(&self) -> u64 {
        file::pages(self.geo)
    }

    /// Pages holding the slot table (the last one also holds the first entries).
    fn slot_pages(&self) -> u64 {
        self.geo.slots_end().div_ceil(P)
    }
}
