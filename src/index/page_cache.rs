//! The key index's clean-page cache for queries: at most `index_cache_bytes` (default
//! 128 MiB, about 6.7 M entries; 0 turns it off) of 4 KiB pages of any index file, keyed
//! by (file id, page number), CLOCK eviction. RocketMQ reads its mmapped IndexFiles
//! through the OS page cache; with direct I/O the store keeps its own.
//!
//! * **What enters**: entry pages the page set drops, the pages of a file that filled,
//!   pages queries read, and at open the newest entries (the current file's, newest
//!   first, then older files with their slot tables) read with 4 MiB steps until the
//!   cache is full ([`IndexService::warm_cache`]): a query then walks its chains in
//!   memory and reads only the records.
//! * **Invariant: a page of the current file is here only while it is not in the page
//!   set.** It leaves the cache when it enters the set (it may change from then on), and
//!   the file's epoch moves then, so a disk read that raced with that is not cached.
//! * **CLOCK, not LRU**: a hit only sets a bit, no list to move under a query.

use crate::error::Result;
use crate::io::PAGE;
use ahash::AHashMap;
use std::rc::Rc;

use super::file::IndexFile;
use super::{IndexService, P};

/// Clean pages of index files kept for queries, at most `cap` (see the module docs).
pub(super) struct PageCache {
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

impl PageCache {
    pub(super) fn new(cap: usize) -> PageCache {
        PageCache {
            cap,
            map: AHashMap::new(),
            slots: Vec::new(),
            hand: 0,
        }
    }

    /// Drops every page (the capacity stays).
    pub(super) fn clear(&mut self) {
        *self = PageCache::new(self.cap);
    }

    /// Pages that can still be added without evicting one.
    fn room(&self) -> usize {
        self.cap.saturating_sub(self.slots.len())
    }

    pub(super) fn get(&mut self, key: (u64, u64)) -> Option<&[u8]> {
        let i = *self.map.get(&key)?;
        let s = &mut self.slots[i];
        s.hot = true;
        Some(&s.data)
    }

    pub(super) fn insert(&mut self, key: (u64, u64), data: Box<[u8]>) {
        if self.cap == 0 {
            return;
        }
        debug_assert_eq!(data.len(), PAGE);
        if let Some(&i) = self.map.get(&key) {
            self.slots[i].data = data;
            return;
        }
        let i = if self.slots.len() < self.cap {
            self.slots.push(CachedPage {
                key,
                data,
                hot: false,
            });
            self.slots.len() - 1
        } else {
            let i = self.cold_slot();
            let s = &mut self.slots[i];
            self.map.remove(&s.key);
            *s = CachedPage {
                key,
                data,
                hot: false,
            };
            i
        };
        self.map.insert(key, i);
    }

    /// CLOCK: the first slot not used since the hand last passed it (the hand moves
    /// past it; used slots it passes lose their mark).
    fn cold_slot(&mut self) -> usize {
        loop {
            let i = self.hand;
            self.hand = (self.hand + 1) % self.slots.len();
            let s = &mut self.slots[i];
            if !s.hot {
                return i;
            }
            s.hot = false;
        }
    }

    /// Drops every page of file `id` (a deleted file's pages would only take room).
    pub(super) fn forget_file(&mut self, id: u64) {
        let keys: Vec<(u64, u64)> = self.map.keys().filter(|k| k.0 == id).copied().collect();
        for k in keys {
            self.remove(k);
        }
    }

    pub(super) fn remove(&mut self, key: (u64, u64)) -> Option<Box<[u8]>> {
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

impl IndexService {
    /// Fills the page cache at open, newest first, with large reads (see the module
    /// docs), until it is full.
    pub(super) async fn warm_cache(&self) -> Result<()> {
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
                let room = self.cache.borrow().room() as u64;
                if room == 0 {
                    return Ok(());
                }
                let lo = lo.max(hi.saturating_sub(room));
                let mut got = Vec::new();
                let epoch = f.epoch.get();
                f.read_pages(lo * P, (hi - lo) * P, |p, b| {
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(b: u8) -> Box<[u8]> {
        vec![b; PAGE].into_boxed_slice()
    }

    #[test]
    fn page_cache_is_bounded_and_evicts_cold_pages_first() {
        let mut c = PageCache::new(3);
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
        assert_eq!(c.room(), 0);
        c.clear();
        assert_eq!((c.room(), c.map.len()), (3, 0));
        let mut none = PageCache::new(0);
        none.insert((1, 1), page(1));
        assert!(none.get((1, 1)).is_none());
    }
}
