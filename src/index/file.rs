//! One open index file: RocketMQ's `IndexFile` (byte layout, hashing and names in
//! [`crate::format::index_file`]). Its geometry (slot and entry counts) is fixed when the
//! store is created; the header kept here is the newest one, for the current file ahead
//! of what is on disk. Pages of the current file are read and changed through the page
//! set ([`super::page_set`]); what this type does itself is direct I/O on whole pages.
//!
//! * **Names** are the creation time `yyyyMMddHHmmssSSS` in local time (the zone offset
//!   from `localtime_r`), bumped by a millisecond when needed, so names always sort in
//!   creation order.
//! * **A file created by this process knows which pages it ever wrote**: a page never
//!   written is zeros and is not read (a new file's 20 MB slot table would otherwise cost
//!   one read per page at first touch).
//! * **The last page is written whole** (direct I/O) and the file cut back to its exact
//!   size after; a stop between the two leaves padding that the open cuts
//!   ([`super::repair`]).

use crate::error::{Error, Result};
use crate::format::index_file::{self, ENTRY_LEN, Geometry, IndexEntry, IndexHeader, NAME_LEN};
use crate::io::{Disk, File, PAGE};
use glommio::io::DmaBuffer;
use std::cell::{Cell, RefCell};
use std::path::Path;
use std::rc::Rc;

use super::P;

pub(super) struct IndexFile {
    /// Unique within this process: names the file's pages in the page cache.
    pub(super) id: u64,
    pub(super) name: String,
    pub(super) file: Rc<File>,
    geo: Geometry,
    /// The newest header (for the current file, ahead of what is on disk).
    pub(super) header: Cell<IndexHeader>,
    /// For a file created by this process: a bit per page ever written (see the
    /// module docs); `None` for a file opened from disk.
    written: RefCell<Option<Vec<u64>>>,
    /// Bumped whenever one of this file's pages enters the page set (it may change
    /// from then on): a query's disk read that started before is not cached.
    pub(super) epoch: Cell<u64>,
}

impl IndexFile {
    fn new(
        name: String,
        file: Rc<File>,
        geo: Geometry,
        header: IndexHeader,
        written: Option<Vec<u64>>,
    ) -> Self {
        IndexFile {
            id: next_file_id(),
            name,
            file,
            geo,
            header: Cell::new(header),
            written: RefCell::new(written),
            epoch: Cell::new(0),
        }
    }

    /// A file found on disk with its decoded header.
    pub(super) fn opened(name: String, file: Rc<File>, geo: Geometry, header: IndexHeader) -> Self {
        IndexFile::new(name, file, geo, header, None)
    }

    /// Creates the next file in `dir`, after `prev` (whose end becomes its begin). Its
    /// header is not on disk until the first flush.
    pub(super) async fn create(
        disk: &Disk,
        dir: &Path,
        geo: Geometry,
        prev: Option<&IndexFile>,
    ) -> Result<IndexFile> {
        let now = crate::now_ms();
        let mut wall = now + local_offset_ms(now);
        if let Some(t) = prev.and_then(|p| index_file::parse_file_name(&p.name)) {
            wall = wall.max(t + 1);
        }
        let name = index_file::file_name(wall);
        debug_assert_eq!(name.len(), NAME_LEN);
        let path = dir.join(&name);
        let file = disk.create_sized(&path, geo.file_len()).await?;
        let header = match prev {
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
        tracing::debug!(path = %path.display(), "index file created");
        let written = vec![0u64; pages(geo).div_ceil(64) as usize];
        Ok(IndexFile::new(name, file, geo, header, Some(written)))
    }

    /// Whether page `page` is known to be zeros (never written by this process).
    pub(super) fn known_zero(&self, page: u64) -> bool {
        self.written.borrow().as_ref().is_some_and(|bits| {
            bits.get((page / 64) as usize)
                .is_some_and(|w| w & (1 << (page % 64)) == 0)
        })
    }

    pub(super) fn mark_written(&self, page: u64) {
        if let Some(bits) = self.written.borrow_mut().as_mut()
            && let Some(w) = bits.get_mut((page / 64) as usize)
        {
            *w |= 1 << (page % 64);
        }
    }

    /// Entry `i` as it is on disk (negative `i` reads entry 0).
    pub(super) async fn entry_on_disk(&self, i: i32) -> Result<IndexEntry> {
        let pos = self.geo.entry_pos(i.max(0) as u32);
        let r = self.file.read(pos, ENTRY_LEN).await?;
        IndexEntry::decode(&r).map_err(|kind| Error::Corrupt {
            path: self.file.path.clone(),
            offset: pos,
            kind,
            detail: Some("index entry".into()),
        })
    }

    /// Writes whole pages at aligned `pos`, cutting the file back if the last page
    /// reached past its exact size.
    pub(super) async fn write_pages(&self, pos: u64, data: &[u8]) -> Result<()> {
        debug_assert!(pos.is_multiple_of(P) && data.len().is_multiple_of(PAGE));
        self.file.write_aligned(pos, data).await?;
        self.cut_padding(pos + data.len() as u64).await
    }

    /// [`IndexFile::write_pages`] of a shared DMA buffer, written without a copy.
    pub(super) async fn write_shared_pages(&self, pos: u64, data: Rc<DmaBuffer>) -> Result<()> {
        debug_assert!(pos.is_multiple_of(P) && data.len().is_multiple_of(PAGE));
        let end = pos + data.len() as u64;
        self.file.write_rc(pos, data).await?;
        self.cut_padding(end).await
    }

    async fn cut_padding(&self, written_end: u64) -> Result<()> {
        if written_end > self.geo.file_len() {
            self.file.truncate(self.geo.file_len()).await?;
        }
        Ok(())
    }

    /// Reads `[pos, pos + len)` (aligned) with reads of at most 1 MiB, up to four in
    /// flight, and hands each page to `take` in file order (a page past the end is
    /// short or empty).
    pub(super) async fn read_pages(
        &self,
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
                .map(|from| self.file.read(from, (CHUNK.min(end - from)) as usize))
                .collect();
            for (i, r) in crate::wake::join_all(reads).await.into_iter().enumerate() {
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
}

/// Pages of a file of geometry `geo` (the last one partly past its end).
pub(super) fn pages(geo: Geometry) -> u64 {
    geo.file_len().div_ceil(P)
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
