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
//!   most `index_max_dirty_bytes`; older files are full and entirely on disk. When the
//!   set is full it is written out and the clean pages are dropped: every entry page
//!   but the tail, then slot pages (the hot, random part) down to 3/4 of the set.
//!   A flush copies the dirty pages it writes, so the peak is twice the set. Queries consult the set first, then read
//!   the file with direct I/O.
//! * **Crash-consistent writes.** A flush (every second, from the queue flusher; when
//!   the page set is full; when a file fills; at shutdown) writes the pages it
//!   snapshots in steps, each followed by fdatasync: pages holding only entries,
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
use std::cell::{Cell, RefCell};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::rc::Rc;

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
    name: String,
    file: Rc<File>,
    /// The newest header (for the current file, ahead of what is on disk).
    header: Cell<IndexHeader>,
    /// For a file created by this process: a bit per page ever written, so a page
    /// never written is known to be zeros and is not read (a new file's slot table
    /// would otherwise cost one read per page at first touch).
    written: RefCell<Option<Vec<u64>>>,
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

struct Page {
    data: Box<[u8]>,
    /// Bumped at each change; the page is dirty while `version != flushed`.
    version: u64,
    flushed: u64,
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
    pages: RefCell<AHashMap<u64, Page>>,
    version: Cell<u64>,
    /// Records below this commit-log offset are already indexed.
    indexed_end: Cell<u64>,
    /// Set when a repair left `endPhyOffset` one byte before a record (that record's
    /// keys are to be indexed again), not at a record's start.
    end_before_record: Cell<bool>,
    /// The last file's header as last made durable.
    durable: Cell<IndexHeader>,
    /// End time of the last full file flushed (the checkpoint's indexMsgTimestamp).
    full_flushed_end_ts: Cell<i64>,
    /// Serialises flushes, rollovers and evictions.
    flush_lock: glommio::sync::Semaphore,
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
            if size != geo.file_len() {
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
                    name,
                    file: f,
                    header: Cell::new(h),
                    written: RefCell::new(None),
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
            pages: RefCell::new(AHashMap::new()),
            version: Cell::new(0),
            indexed_end: Cell::new(0),
            end_before_record: Cell::new(false),
            durable: Cell::new(IndexHeader::empty()),
            full_flushed_end_ts: Cell::new(0),
            flush_lock: glommio::sync::Semaphore::new(1),
        };
        let mut report = IndexOpenReport::default();
        // Files made stale by a lost log tail: drop those whose every entry is gone.
        while let Some(last) = files.last().cloned() {
            let h = last.header.get();
            let first_gone = if h.has_entries() {
                past(svc.entry_on_disk(&last.file, 1).await?.phy_offset, log_end)
            } else {
                past(h.end_phy_offset, log_end) && h.end_timestamp > 0
            };
            if !first_gone {
                break;
            }
            report.entries_cut += (h.index_count.max(1) - 1) as u64;
            svc.disk.remove_file(&last.file.path)?;
            files.pop();
        }
        if let Some(last) = files.last().cloned() {
            let h = last.header.get();
            if !clean || (past(h.end_phy_offset, log_end) && h.end_timestamp > 0) {
                let (repaired, cut) = svc.repair(&last, log_end).await?;
                report.slots_repaired = repaired;
                report.entries_cut += cut;
            }
        }
        svc.disk.sync_dir(&svc.dir)?;
        report.files = files.len();
        if let Some(last) = files.last() {
            let h = last.header.get();
            svc.durable.set(h);
            if h.has_entries() || h.end_timestamp > 0 {
                svc.indexed_end.set((h.end_phy_offset.max(-1) + 1) as u64);
            }
            let page0 = svc.page_from_disk(&last.file, 0).await?;
            svc.pages.borrow_mut().insert(
                0,
                Page {
                    data: page0,
                    version: 0,
                    flushed: 0,
                },
            );
        }
        if let Some(full) = files
            .iter()
            .rev()
            .find(|f| f.header.get().index_count as u32 >= geo.entries)
        {
            svc.full_flushed_end_ts.set(full.header.get().end_timestamp);
        }
        *svc.files.borrow_mut() = files;
        Ok((svc, report))
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

    async fn page_from_disk(&self, f: &File, page_no: u64) -> Result<Box<[u8]>> {
        let mut data = vec![0u8; PAGE].into_boxed_slice();
        let r = f.read(page_no * P, PAGE).await?;
        let n = r.len().min(PAGE);
        data[..n].copy_from_slice(&r[..n]);
        Ok(data)
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

    fn bump(&self) -> u64 {
        let v = self.version.get() + 1;
        self.version.set(v);
        v
    }

    fn current(&self) -> Option<Rc<IndexFile>> {
        self.files.borrow().last().cloned()
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
        let pages_in_file = self.geo.file_len().div_ceil(P);
        let f = Rc::new(IndexFile {
            name,
            file,
            header: Cell::new(header),
            written: RefCell::new(Some(vec![0u64; pages_in_file.div_ceil(64) as usize])),
        });
        let v = self.bump();
        let mut pages = self.pages.borrow_mut();
        pages.clear();
        pages.insert(
            0,
            Page {
                data: vec![0u8; PAGE].into_boxed_slice(),
                version: v,
                flushed: 0,
            },
        );
        drop(pages);
        self.durable.set(IndexHeader {
            index_count: -1,
            ..IndexHeader::empty()
        });
        self.files.borrow_mut().push(f.clone());
        tracing::debug!(path = %path.display(), "index file created");
        Ok(f)
    }

    /// Indexes one dispatched record (idempotent: records below [`Self::indexed_end`]
    /// are skipped).
    pub async fn add(&self, r: &RecordView<'_>) -> Result<()> {
        if r.phys_offset < 0 || (r.phys_offset as u64) < self.indexed_end.get() {
            return Ok(());
        }
        let phys = r.phys_offset as u64;
        if r.sys_flag & record::SYSFLAG_TRANSACTION_MASK != record::SYSFLAG_TRANSACTION_ROLLBACK {
            let uniq = r.property(properties::UNIQ_KEY);
            for key in index_keys(uniq, r.keys()) {
                self.put_key(r.topic, key, phys, r.store_timestamp).await?;
            }
        }
        let f = self.writable_or_current().await?;
        let mut h = f.header.get();
        h.end_phy_offset = phys as i64;
        h.end_timestamp = r.store_timestamp;
        f.header.set(h);
        self.indexed_end.set(phys + 1);
        self.end_before_record.set(false);
        Ok(())
    }

    async fn writable_or_current(&self) -> Result<Rc<IndexFile>> {
        match self.current() {
            Some(f) => Ok(f),
            None => self.writable().await,
        }
    }

    async fn put_key(&self, topic: &str, key: &str, phys: u64, ts: i64) -> Result<()> {
        let geo = self.geo;
        let hash = index_file::key_hash(topic, key);
        let slot_pos = geo.slot_pos(geo.slot_of(hash));
        loop {
            let f = self.writable().await?;
            let idx = f.header.get().index_count;
            let epos = geo.entry_pos(idx as u32);
            let need = [0, slot_pos / P, epos / P, (epos + ENTRY_LEN as u64 - 1) / P];
            self.ensure_pages(&f, &need).await?;
            // Something awaited above may have rolled the file or moved the count.
            let still = self.current().is_some_and(|c| Rc::ptr_eq(&c, &f))
                && f.header.get().index_count == idx
                && need.iter().all(|p| self.pages.borrow().contains_key(p));
            if !still {
                continue;
            }
            let mut h = f.header.get();
            let v = self.cached_slot(slot_pos);
            let prev = if geo.valid_link(v, h.index_count) {
                v
            } else {
                0
            };
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
            self.write_cached(epos, &e.encode());
            self.write_cached(slot_pos, &idx.to_be_bytes());
            if prev == 0 {
                h.hash_slot_count = h.hash_slot_count.saturating_add(1);
            }
            // endPhyOffset moves in `add` once every key of the record is in, so a
            // flush between two keys never marks the record as done.
            h.index_count += 1;
            f.header.set(h);
            return Ok(());
        }
    }

    /// The slot at `pos` (4-aligned, so within one page) from the page set.
    fn cached_slot(&self, pos: u64) -> i32 {
        let pages = self.pages.borrow();
        let o = (pos % P) as usize;
        let b = &pages[&(pos / P)].data[o..o + 4];
        i32::from_be_bytes([b[0], b[1], b[2], b[3]])
    }

    fn write_cached(&self, pos: u64, bytes: &[u8]) {
        let v = self.bump();
        let mut pages = self.pages.borrow_mut();
        let mut at = 0usize;
        while at < bytes.len() {
            let p = pos + at as u64;
            let page = pages.get_mut(&(p / P)).expect("page loaded");
            let o = (p % P) as usize;
            let n = (PAGE - o).min(bytes.len() - at);
            page.data[o..o + n].copy_from_slice(&bytes[at..at + n]);
            page.version = v;
            at += n;
        }
    }

    /// Loads the pages `need` of the current file into the page set, making room
    /// first when it is full.
    async fn ensure_pages(&self, f: &Rc<IndexFile>, need: &[u64]) -> Result<()> {
        if need.iter().all(|p| self.pages.borrow().contains_key(p)) {
            return Ok(());
        }
        let missing: Vec<u64> = {
            let pages = self.pages.borrow();
            let mut m: Vec<u64> = need
                .iter()
                .copied()
                .filter(|p| !pages.contains_key(p))
                .collect();
            m.sort_unstable();
            m.dedup();
            m
        };
        if missing.is_empty() {
            return Ok(());
        }
        if self.pages.borrow().len() + missing.len() > self.cap_pages {
            self.make_room(need).await?;
        }
        for p in missing {
            let data = if f.known_zero(p) {
                vec![0u8; PAGE].into_boxed_slice()
            } else {
                self.page_from_disk(&f.file, p).await?
            };
            if !self.current().is_some_and(|c| Rc::ptr_eq(&c, f)) {
                return Ok(());
            }
            self.pages.borrow_mut().entry(p).or_insert(Page {
                data,
                version: 0,
                flushed: 0,
            });
        }
        Ok(())
    }

    /// Writes everything out, then drops clean pages (entry pages first) down to half
    /// the page set, keeping page 0 and `keep`.
    async fn make_room(&self, keep: &[u64]) -> Result<()> {
        let _permit = self
            .flush_lock
            .acquire_permit(1)
            .await
            .map_err(|e| Error::Failed(e.to_string()))?;
        self.flush_locked().await?;
        let slot_pages = self.geo.slots_end().div_ceil(P);
        let mut pages = self.pages.borrow_mut();
        let mut victims: Vec<u64> = pages
            .iter()
            .filter(|(p, pg)| **p != 0 && !keep.contains(p) && pg.version == pg.flushed)
            .map(|(p, _)| *p)
            .collect();
        // Entry pages (above the slot table) are written once and rarely read again:
        // drop them all. Slot pages are the hot, random part: drop only down to 3/4.
        victims.sort_unstable_by_key(|p| std::cmp::Reverse((*p >= slot_pages, *p)));
        let target = self.cap_pages - self.cap_pages / 4;
        for p in victims {
            if p < slot_pages && pages.len() <= target {
                break;
            }
            pages.remove(&p);
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
        let mut snap: Vec<(u64, u64, Box<[u8]>)> = self
            .pages
            .borrow()
            .iter()
            .filter(|(_, pg)| pg.version != pg.flushed)
            .map(|(p, pg)| (*p, pg.version, pg.data.clone()))
            .collect();
        if snap.is_empty() && h == self.durable.get() {
            return Ok(());
        }
        if !snap.iter().any(|(p, _, _)| *p == 0) {
            let pages = self.pages.borrow();
            let p0 = pages.get(&0).expect("page 0 is always loaded");
            snap.push((0, p0.version, p0.data.clone()));
        }
        for (p, _, data) in snap.iter_mut() {
            if *p == 0 {
                data[..index_file::HEADER_LEN].copy_from_slice(&h.encode());
            }
        }
        snap.sort_unstable_by_key(|(p, _, _)| std::cmp::Reverse(*p));
        let boundary = (self.geo.slots_end() - 1) / P;
        let phases: [&dyn Fn(u64) -> bool; 4] = [
            &|p| p > boundary,
            &|p| p == boundary && p != 0,
            &|p| p < boundary && p != 0,
            &|p| p == 0,
        ];
        for phase in phases {
            let mut wrote = false;
            for (p, _, data) in snap.iter().filter(|(p, _, _)| phase(*p)) {
                if *p == boundary {
                    // This page holds the last slots and the first entries: land the
                    // entries first (slots as on disk), so no slot ever names an entry
                    // whose sector did not make it.
                    let slot_bytes = (self.geo.slots_end() - p * P) as usize;
                    let on_disk = f.file.read(p * P, PAGE).await?;
                    if on_disk.len() >= slot_bytes {
                        let mut first = data.clone();
                        first[..slot_bytes].copy_from_slice(&on_disk[..slot_bytes]);
                        if first != *data {
                            self.write_page_run(&f.file, p * P, &first).await?;
                            f.file.sync().await?;
                        }
                    }
                }
                if *p == 0 {
                    // Page 0 holds the header and slots (and, with a small slot table,
                    // entries): a power loss can tear its sectors apart. Write it first
                    // with the header that is on disk and sync, so the new header then
                    // changes only its own sector: it never lands without the slots
                    // and entries it counts.
                    let durable = self.durable.get();
                    let mut first = data.clone();
                    if durable.index_count < 0 {
                        first[..index_file::HEADER_LEN].fill(0);
                    } else {
                        first[..index_file::HEADER_LEN].copy_from_slice(&durable.encode());
                    }
                    if first != *data {
                        self.write_page_run(&f.file, 0, &first).await?;
                        f.file.sync().await?;
                    }
                }
                self.write_page_run(&f.file, p * P, data).await?;
                f.mark_written(*p);
                wrote = true;
            }
            if wrote {
                f.file.sync().await?;
            }
        }
        if self.current().is_some_and(|c| Rc::ptr_eq(&c, &f)) {
            let mut pages = self.pages.borrow_mut();
            for (p, v, _) in &snap {
                if let Some(pg) = pages.get_mut(p)
                    && pg.version == *v
                {
                    pg.flushed = *v;
                }
            }
            self.durable.set(h);
        }
        Ok(())
    }

    /// Reads `len` bytes of file `f`: from the page set when `f` is the current file
    /// and the page is there, else from disk.
    async fn read(&self, f: &Rc<IndexFile>, pos: u64, len: usize) -> Result<Vec<u8>> {
        let mut out = Vec::with_capacity(len);
        let mut at = pos;
        let end = pos + len as u64;
        while at < end {
            let n = ((at / P + 1) * P).min(end) - at;
            let cached = if self.current().is_some_and(|c| Rc::ptr_eq(&c, f)) {
                self.pages.borrow().get(&(at / P)).map(|pg| {
                    let o = (at % P) as usize;
                    pg.data[o..o + n as usize].to_vec()
                })
            } else {
                None
            };
            match cached {
                Some(b) => out.extend_from_slice(&b),
                None => {
                    let r = f.file.read(at, n as usize).await?;
                    out.extend_from_slice(&r[..]);
                    out.resize(out.len() + n as usize - r.len().min(n as usize), 0);
                }
            }
            at += n;
        }
        Ok(out)
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
            let head = self.read(f, slot_pos, 4).await?;
            let mut i = i32::from_be_bytes(head[..4].try_into().expect("4 bytes"));
            while geo.valid_link(i, f.header.get().index_count) {
                let b = self.read(f, geo.entry_pos(i as u32), ENTRY_LEN).await?;
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
