//! Key lookups: RocketMQ's `IndexService.queryOffset` over `IndexFile.selectPhyOffset`.
//! The store's `query_by_key` (src/store/query.rs) checks the arguments with
//! [`check_query`] and reads back every candidate this returns.
//!
//! * **Dependent reads**: the slot, each entry of its chain (at one key per slot about
//!   two, more at the tail), then the record. Each page comes from the page set (current
//!   file), the page cache, or one direct read that is then cached: with the slot table
//!   in memory a miss on an empty slot does no I/O, and with the chain in the cache a hit
//!   reads only its record.
//! * **Files newest to oldest, each chain newest first**; a chain stops at the first
//!   entry older than `begin` (entries keep whole seconds: a store time lies in `[t, t +
//!   999]`) and at a link that does not point back (a damaged chain ends, never loops).
//! * **Candidates are verified concurrently**, in batches of as many as could still be
//!   needed; each commit-log offset once; results keep the chain's order.

use crate::error::{Error, Result};
use crate::format::index_file::{self, ENTRY_LEN, IndexEntry};
use crate::io::PAGE;
use ahash::AHashSet;
use std::future::Future;
use std::rc::Rc;

use super::file::IndexFile;
use super::{IndexService, MAX_KEY_LEN, P};

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

impl IndexService {
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
        for r in crate::wake::join_all(futs).await {
            if let Some(v) = r? {
                out.push(v);
                if out.len() >= max {
                    return Ok(true);
                }
            }
        }
        Ok(false)
    }

    /// Copies `out.len()` bytes at `pos` of file `f` (within one page or two): from
    /// the page set when `f` is the current file and the page is there, else from the
    /// page cache, else from disk (the page read whole and cached).
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
}
