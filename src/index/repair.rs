//! Opening the index files after a stop, clean or not, and repairing what a crash or a
//! lost CommitLog tail left. RocketMQ destroys the last, partial IndexFile after an
//! abnormal stop and rebuilds it from the log; coremq keeps it and repairs it, so the
//! re-dispatch at open covers only what the index had not made durable.
//!
//! What an open finds, and does ([`open_files`]), files in name order:
//!
//! | found | action |
//! |---|---|
//! | size 0 (crash while creating) | file removed |
//! | past its size by less than a page (a stop between the last page's whole-page write and the cut back) | padding cut, synced |
//! | any other size | refused: `BadLayout` (the geometry differs from the store's) |
//! | header with indexCount 0 (created, never flushed) | file removed, and every later one |
//! | header that does not decode | file removed, and every later one (rebuilt from the log) |
//!
//! Then ([`IndexService::drop_lost_files`], [`IndexService::repair`]): files whose every
//! entry names a record at or past the recovered log end are removed; the last file is
//! repaired after an unclean stop, or when it names records past that end:
//!
//! * entries are in log order, so the first one whose record is gone is found by binary
//!   search and the count cut there; the header's end then moves to just before the
//!   last counted entry's record (that record may have more keys than were counted: it
//!   is indexed again, queries return each record once), its end time to an upper bound
//!   (entries keep whole seconds);
//! * a slot naming an entry at or past the count is walked back along the chain (which
//!   is durable: entries land before slots) to the newest counted entry;
//! * the slot table is read and fixed in 1 MiB chunks; the uncounted entries slots name
//!   were written by the flush a crash cut short, at most a page set's worth, so that
//!   much is read once instead of one read per slot walked;
//! * the fixed slot pages are written and synced before page 0 with the new header.

use crate::error::{Error, Result};
use crate::format::index_file::{self, ENTRY_LEN, Geometry, IndexEntry, IndexHeader};
use crate::io::{Disk, PAGE};
use std::path::Path;
use std::rc::Rc;

use super::file::IndexFile;
use super::{IndexService, P, past};

/// Opens the index files of `dir` in creation order (see the module docs' table).
pub(super) async fn open_files(
    disk: &Disk,
    dir: &Path,
    geo: Geometry,
) -> Result<Vec<Rc<IndexFile>>> {
    let mut names = Vec::new();
    for entry in disk.list_dir(dir)? {
        match entry.name.as_str() {
            n if index_file::parse_file_name(n).is_some() => names.push(n.to_string()),
            _ => {
                tracing::warn!(path = %entry.path.display(), "ignoring a file that is not an index file")
            }
        }
    }
    names.sort();
    let mut files = Vec::new();
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
            tracing::warn!(path = %path.display(), "removing an empty index file");
            disk.remove_file(&path)?;
            continue;
        }
        if size > geo.file_len() && size <= crate::io::align_up(geo.file_len()) {
            tracing::warn!(path = %path.display(), size, "cutting an index file's last-page padding left by an interrupted write");
            f.truncate(geo.file_len()).await?;
            f.sync().await?;
        } else if size != geo.file_len() {
            return Err(Error::BadLayout {
                path,
                why: format!(
                    "index file is {size} bytes; this store uses {} (set index_hash_slots and \
                     index_max_entries, a node's max_hash_slot_num and max_index_num, to the \
                     values the store was created with)",
                    geo.file_len()
                ),
            });
        }
        let head = f.read(0, index_file::HEADER_LEN).await?;
        match IndexHeader::decode(&head) {
            Ok(h) if h.index_count == 0 => {
                tracing::warn!(path = %path.display(), "removing an index file that was never written");
                disk.remove_file(&path)?;
                damaged = true;
            }
            Ok(h) => files.push(Rc::new(IndexFile::opened(name, f, geo, h))),
            Err(kind) => {
                tracing::warn!(path = %path.display(), %kind, "index file header damaged; it is rebuilt from the log");
                disk.remove_file(&path)?;
                damaged = true;
            }
        }
    }
    Ok(files)
}

impl IndexService {
    /// Removes the newest files whose every entry names a record at or past `log_end`
    /// (a lost log tail); returns how many entries went with them.
    pub(super) async fn drop_lost_files(&self, log_end: u64) -> Result<u64> {
        let mut cut = 0;
        while let Some(last) = self.current() {
            let h = last.header.get();
            let first_gone = if h.has_entries() {
                past(last.entry_on_disk(1).await?.phy_offset, log_end)
            } else {
                past(h.end_phy_offset, log_end) && h.end_timestamp > 0
            };
            if !first_gone {
                break;
            }
            cut += (h.index_count.max(1) - 1) as u64;
            self.disk.remove_file(&last.file.path)?;
            self.files.borrow_mut().pop();
        }
        Ok(cut)
    }

    /// Brings the last file `f` to a consistent state (see the module docs): entries
    /// for records at or past `log_end` are cut, and slots naming entries past the
    /// count are walked back. Returns (slots repaired, entries cut).
    pub(super) async fn repair(&self, f: &IndexFile, log_end: u64) -> Result<(u64, u64)> {
        let geo = self.geo;
        let mut h = f.header.get();
        let old_count = h.index_count.clamp(1, geo.entries as i32);
        let count = Self::first_lost_entry(f, old_count, log_end).await?;
        let cut = (old_count - count) as u64;
        if past(h.end_phy_offset, log_end) || count < old_count {
            if count > 1 {
                let last = f.entry_on_disk(count - 1).await?;
                h.end_phy_offset = last.phy_offset - 1;
                self.end_before_record.set(true);
                h.end_timestamp = last.time(&h).saturating_add(999);
            } else {
                h.end_phy_offset = h.begin_phy_offset;
                h.end_timestamp = h.begin_timestamp;
            }
        }
        h.index_count = count;
        let mut walk = Uncounted {
            f,
            geo,
            count,
            block_len: self.cap_pages as u64 * P + P,
            block: None,
        };
        let (repaired, used, mut page0) = self.repair_slots(&mut walk).await?;
        h.hash_slot_count = used;
        f.file.sync().await?;
        page0[..index_file::HEADER_LEN].copy_from_slice(&h.encode());
        f.write_pages(0, &page0).await?;
        f.file.sync().await?;
        f.header.set(h);
        if repaired > 0 || cut > 0 {
            tracing::warn!(file = %f.name, repaired, cut, count, "index file repaired after an unclean stop");
        }
        Ok((repaired, cut))
    }

    /// The first entry (of `1..count`) whose record is at or past `log_end`, or `count`.
    async fn first_lost_entry(f: &IndexFile, count: i32, log_end: u64) -> Result<i32> {
        let (mut lo, mut hi) = (1i32, count);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if !past(f.entry_on_disk(mid).await?.phy_offset, log_end) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        Ok(lo)
    }

    /// Walks the slot table in 1 MiB chunks, walking back slots that name uncounted
    /// entries and writing the chunks it changed (page 0 excepted). Returns (slots
    /// repaired, slots used, page 0 with its fixed slots).
    async fn repair_slots(&self, walk: &mut Uncounted<'_>) -> Result<(u64, i32, Vec<u8>)> {
        const CHUNK: u64 = 1 << 20;
        let f = walk.f;
        let slots_end = self.geo.slots_end();
        let mut repaired = 0u64;
        let mut used = 0i32;
        let mut pos = 0u64;
        let mut page0 = vec![0u8; PAGE];
        while pos < slots_end {
            let len = CHUNK.min(crate::io::align_up(slots_end) - pos);
            let r = f.file.read(pos, len as usize).await?;
            let mut buf = vec![0u8; len as usize];
            let got = r.len().min(len as usize);
            buf[..got].copy_from_slice(&r[..got]);
            let mut changed = false;
            let mut at = (index_file::HEADER_LEN as u64).max(pos);
            while at + 4 <= (pos + len).min(slots_end) {
                let o = (at - pos) as usize;
                let v = i32::from_be_bytes(buf[o..o + 4].try_into().expect("4 bytes"));
                let u = walk.back(v).await?;
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
                    f.write_pages(P, &buf[PAGE..]).await?;
                }
            } else if changed {
                f.write_pages(pos, &buf).await?;
            }
            pos += len;
        }
        Ok((repaired, used, page0))
    }
}

/// Walks slots back to counted entries, reading the uncounted entries once.
struct Uncounted<'a> {
    f: &'a IndexFile,
    geo: Geometry,
    /// The repaired entry count: entries below it are durable.
    count: i32,
    /// Bytes read at the first walk: a page set's worth from the first uncounted
    /// entry's page, and a page.
    block_len: u64,
    /// (file position, bytes) of the uncounted entries, once read.
    block: Option<(u64, Vec<u8>)>,
}

impl Uncounted<'_> {
    /// Slot value `v` walked back along its chain to the newest counted entry (0 when
    /// the chain has none or is broken).
    async fn back(&mut self, v: i32) -> Result<i32> {
        let geo = self.geo;
        let mut u = v;
        let mut steps = 0u32;
        while u != 0 && !geo.valid_link(u, self.count) {
            if u < 0 || u as u32 >= geo.entries || steps > geo.entries {
                return Ok(0);
            }
            let e = self.entry(u).await?;
            u = if e.prev_index < u { e.prev_index } else { 0 };
            steps += 1;
        }
        Ok(u)
    }

    /// Entry `i` (past the count), from the block of uncounted entries when it lies
    /// there, else read from disk.
    async fn entry(&mut self, i: i32) -> Result<IndexEntry> {
        if self.block.is_none() {
            let from = crate::io::align_down(self.geo.entry_pos(self.count as u32));
            let len = self.block_len.min(self.geo.file_len() - from);
            let r = self.f.file.read(from, len as usize).await?;
            self.block = Some((from, r[..].to_vec()));
        }
        let epos = self.geo.entry_pos(i as u32);
        match &self.block {
            Some((from, b))
                if epos >= *from && epos + ENTRY_LEN as u64 <= from + b.len() as u64 =>
            {
                let o = (epos - from) as usize;
                Ok(IndexEntry::decode(&b[o..o + ENTRY_LEN]).unwrap_or_default())
            }
            _ => self.f.entry_on_disk(i).await,
        }
    }
}
