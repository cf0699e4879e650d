//! A per-shard cache of large, aligned CommitLog blocks for reads that miss the write
//! buffers (catch-up consumers): what the OS page cache gives RocketMQ's mmapped
//! `CommitLog` for free. It is the log's `ReadCache`; the key index's page cache is a
//! different type.
//!
//! The CommitLog is read with O_DIRECT, so there is no page cache under it: without
//! this cache a consumer reading an old queue fetches each of its records from the
//! disk on its own. When queues are interleaved in the log (scenario 5b: 32 queues per
//! shard, every queue's records are every 32nd record of the log), each `get` turns
//! into hundreds of ~4 KiB reads, and 32 readers walking the same region read the
//! same disk blocks 32 times over in small pieces (~62,000 4 KiB reads per shard
//! against 242 block reads with the cache; 5b from 0.23-0.28 of fio to 0.50-0.65).
//!
//! The cache holds `read_cache_bytes` of `read_cache_block_bytes` blocks (1 MiB by
//! default, aligned to the block size and never crossing a segment). A block is read
//! with one large O_DIRECT read, at most `read_cache_inflight` at once per shard;
//! every `get` that needs a block being read waits for that one read (no duplicate
//! reads). Records are **copied** out of the blocks into one buffer per `get` holding
//! only the records returned, so a returned message never pins a cache block, and the
//! cache's memory is its configured size (plus the reads in flight and, per waiting
//! `get`, the one block it is copying from).
//!
//! What may be cached: only whole blocks below the CommitLog's **committed** position.
//! Bytes below it are in the segment files and never change while the store is open
//! (a commit rewrites only the page holding the committed position, which lies past
//! any cacheable block); recovery truncates a torn tail before the store, and so this
//! cache, exists. Newer bytes are read from the write buffers or straight from the
//! file, as before. The store verifies every record it returns (checksums, topic,
//! queue and queue offset) whichever way its bytes came.
//!
//! Read-ahead: a `get` names the blocks its records lie in up front, so it asks for
//! the next `read_cache_readahead_blocks` of them while it copies from the current
//! one; and an access to block `b` while block `b - 1` is cached (sequential access)
//! asks for the blocks after `b` too, so the next `get` finds them loaded. Read-ahead
//! never takes more than half the cache's slots while in flight, never evicts a block
//! being read, and a failed read-ahead is dropped (the reader that needs the block
//! reads it itself). Defaults (64 MiB, 8 in flight, read-ahead 16): within the noise
//! of 128 MiB or 16 in flight; 2 or 4 in flight stayed at 0.39-0.60 of fio, and
//! read-ahead 8 or 32 did no better than 16.
//!
//! Eviction is least-recently-used over the blocks loaded (a block being read is not
//! evictable). A reader that finds its block evicted before it got to it reads it
//! again, so a tiny cache stays correct, only slower. When a block read fails, the
//! `get` reads the records of that block straight from the files, which returns the
//! error (or the bytes, if the failure was passing).
//!
//! Which gets use it: a `get` whose records fill at least half of the log span they
//! lie in (one queue written alone, scenario 5a) reads its own merged spans as before;
//! only sparse gets (interleaved queues) go through the cache. Through the cache a lone
//! reader's `get` waited for its ConsumeQueue read behind the cache's 1 MiB read-ahead
//! (5a fell from 0.61-0.75 to 0.42-0.55 of fio), and the dense reader gains nothing
//! from sharing.
//!
//! Measured runs: `docs/performance/commit_log.md`, "Read cache".

use crate::commit_log::CommitLog;
use crate::config::StoreConfig;
use crate::error::Result;
use crate::io::ReadBuf;
use ahash::AHashMap;
use bytes::{Bytes, BytesMut};
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::rc::Rc;
use std::task::{Poll, Waker};

/// Counters of one shard's read cache, for tests and reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadCacheStats {
    /// Block lookups served from a loaded block.
    pub hits: u64,
    /// Block lookups that waited for a read already in flight (shared reads).
    pub shared: u64,
    /// Block lookups that found nothing and read the block.
    pub misses: u64,
    /// Block reads issued, demanded or read ahead.
    pub reads: u64,
    /// Of `reads`, those issued ahead of need (a get's next blocks, sequential access).
    pub read_ahead: u64,
    /// Bytes read from the disk into the cache.
    pub bytes_read: u64,
    /// Block reads that failed or came back short (their records were read directly).
    pub failed: u64,
    /// Blocks dropped to make room.
    pub evictions: u64,
    /// Blocks loaded now.
    pub blocks: u64,
}

/// One block read in flight: the readers waiting for it keep it, so a block evicted
/// right after it arrived still reaches them.
struct Load {
    /// `None` while in flight; `Some(None)` when the read failed.
    result: RefCell<Option<Option<Rc<ReadBuf>>>>,
    waiters: RefCell<Vec<Waker>>,
}

impl Load {
    fn finish(&self, r: Option<Rc<ReadBuf>>) {
        *self.result.borrow_mut() = Some(r);
        for w in self.waiters.take() {
            w.wake();
        }
    }

    async fn wait(&self) -> Option<Rc<ReadBuf>> {
        std::future::poll_fn(|cx| match &*self.result.borrow() {
            Some(r) => Poll::Ready(r.clone()),
            None => {
                let mut ws = self.waiters.borrow_mut();
                if !ws.iter().any(|w| w.will_wake(cx.waker())) {
                    ws.push(cx.waker().clone());
                }
                Poll::Pending
            }
        })
        .await
    }
}

enum Slot {
    Ready { data: Rc<ReadBuf>, tick: u64 },
    Loading(Rc<Load>),
}

pub struct ReadCache {
    /// Block size in bytes: a power of two dividing the segment size.
    block: u64,
    /// Most blocks held (loaded plus being read).
    capacity: usize,
    readahead: u64,
    /// Block index (log offset / block) to its slot.
    slots: RefCell<AHashMap<u64, Slot>>,
    /// Loaded blocks by last use (tick to block index), for eviction.
    lru: RefCell<BTreeMap<u64, u64>>,
    loading: Cell<usize>,
    tick: Cell<u64>,
    inflight: glommio::sync::Semaphore,
    stats: Cell<ReadCacheStats>,
}

impl ReadCache {
    /// The cache `cfg` asks for, or `None` when `read_cache_bytes` is 0.
    pub fn new(cfg: &StoreConfig) -> Option<Rc<ReadCache>> {
        if cfg.read_cache_bytes == 0 {
            return None;
        }
        let block = Self::block_bytes(cfg);
        Some(Rc::new(ReadCache {
            block,
            capacity: ((cfg.read_cache_bytes as u64 / block) as usize).max(1),
            readahead: cfg.read_cache_readahead_blocks as u64,
            slots: RefCell::new(AHashMap::new()),
            lru: RefCell::new(BTreeMap::new()),
            loading: Cell::new(0),
            tick: Cell::new(0),
            inflight: glommio::sync::Semaphore::new(cfg.read_cache_inflight.max(1) as u64),
            stats: Cell::new(ReadCacheStats::default()),
        }))
    }

    /// The block size used: `read_cache_block_bytes`, or the largest power of two that
    /// divides the segment size if that is smaller (a block never spans two segments).
    pub fn block_bytes(cfg: &StoreConfig) -> u64 {
        let seg = cfg.commit_log_segment_bytes;
        let seg_pow2 = 1u64 << seg.trailing_zeros().min(63);
        (cfg.read_cache_block_bytes as u64).min(seg_pow2)
    }

    pub fn stats(&self) -> ReadCacheStats {
        let mut s = self.stats.get();
        s.blocks = self.lru.borrow().len() as u64;
        s
    }

    fn count(&self, f: impl FnOnce(&mut ReadCacheStats)) {
        let mut s = self.stats.get();
        f(&mut s);
        self.stats.set(s);
    }

    /// The end of the bytes that may be cached: whole blocks below `committed`.
    pub fn cacheable_below(&self, committed: u64) -> u64 {
        committed / self.block * self.block
    }

    fn next_tick(&self) -> u64 {
        let t = self.tick.get() + 1;
        self.tick.set(t);
        t
    }

    /// Drops least recently used loaded blocks while more than `capacity` are held.
    fn make_room(&self, slots: &mut AHashMap<u64, Slot>) {
        let mut lru = self.lru.borrow_mut();
        while slots.len() > self.capacity {
            let Some((_, idx)) = lru.pop_first() else {
                break;
            };
            slots.remove(&idx);
            self.count(|s| s.evictions += 1);
        }
    }

    /// Starts reading block `idx` unless it is held; returns its read when one was
    /// started. `None` when the block is not cacheable (not wholly committed, no
    /// segment) or, for read-ahead, when half the slots are already being read.
    fn start_read(self: &Rc<Self>, log: &CommitLog, idx: u64, ahead: bool) -> Option<Rc<Load>> {
        let start = idx.checked_mul(self.block)?;
        if start < log.min_offset()
            || start + self.block > self.cacheable_below(log.committed.get())
        {
            return None;
        }
        if ahead && self.loading.get() * 2 >= self.capacity.max(2) {
            return None;
        }
        let (file, pos) = log.file_at(start)?;
        let load = Rc::new(Load {
            result: RefCell::new(None),
            waiters: RefCell::new(Vec::new()),
        });
        {
            let mut slots = self.slots.borrow_mut();
            if slots.contains_key(&idx) {
                return None;
            }
            slots.insert(idx, Slot::Loading(load.clone()));
            self.make_room(&mut slots);
        }
        self.loading.set(self.loading.get() + 1);
        self.count(|s| {
            s.reads += 1;
            s.read_ahead += ahead as u64;
        });
        let me = self.clone();
        let l = load.clone();
        let len = self.block as usize;
        glommio::spawn_local(async move {
            let data = match me.inflight.acquire_permit(1).await {
                Ok(_permit) => match file.read(pos, len).await {
                    Ok(b) if b.len() == len => Some(Rc::new(b)),
                    Ok(b) => {
                        tracing::warn!(path = %file.path.display(), pos, got = b.len(), len, "read cache: short block read");
                        None
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "read cache: block read failed; readers read directly");
                        None
                    }
                },
                Err(_) => None,
            };
            me.finish_read(idx, &l, data);
        })
        .detach();
        Some(load)
    }

    fn finish_read(&self, idx: u64, load: &Rc<Load>, data: Option<Rc<ReadBuf>>) {
        self.loading.set(self.loading.get() - 1);
        {
            let mut slots = self.slots.borrow_mut();
            if matches!(slots.get(&idx), Some(Slot::Loading(l)) if Rc::ptr_eq(l, load)) {
                match &data {
                    Some(d) => {
                        let tick = self.next_tick();
                        slots.insert(
                            idx,
                            Slot::Ready {
                                data: d.clone(),
                                tick,
                            },
                        );
                        self.lru.borrow_mut().insert(tick, idx);
                        self.make_room(&mut slots);
                    }
                    None => {
                        slots.remove(&idx);
                    }
                }
            }
        }
        match &data {
            Some(d) => self.count(|s| s.bytes_read += d.len() as u64),
            None => self.count(|s| s.failed += 1),
        }
        load.finish(data);
    }

    /// Asks for block `idx` ahead of need (nothing happens when it is held).
    fn hint(self: &Rc<Self>, log: &CommitLog, idx: u64) {
        if !self.slots.borrow().contains_key(&idx) {
            self.start_read(log, idx, true);
        }
    }

    /// Sequential access (block `idx - 1` is held): ask for the blocks after `idx`.
    fn read_ahead(self: &Rc<Self>, log: &CommitLog, idx: u64) {
        if idx == 0 || !self.slots.borrow().contains_key(&(idx - 1)) {
            return;
        }
        for next in idx + 1..=idx.saturating_add(self.readahead) {
            self.hint(log, next);
        }
    }

    /// Block `idx`, from the cache or read now (shared with every reader waiting for
    /// it); `None` when it cannot be cached or its read failed.
    async fn block(self: &Rc<Self>, log: &CommitLog, idx: u64) -> Option<Rc<ReadBuf>> {
        let held = {
            let mut slots = self.slots.borrow_mut();
            match slots.get_mut(&idx) {
                Some(Slot::Ready { data, tick }) => {
                    let new = self.next_tick();
                    let mut lru = self.lru.borrow_mut();
                    lru.remove(tick);
                    lru.insert(new, idx);
                    *tick = new;
                    Some(Ok(data.clone()))
                }
                Some(Slot::Loading(l)) => Some(Err(l.clone())),
                None => None,
            }
        };
        let load = match held {
            Some(Ok(data)) => {
                self.count(|s| s.hits += 1);
                self.read_ahead(log, idx);
                return Some(data);
            }
            Some(Err(load)) => {
                self.count(|s| s.shared += 1);
                load
            }
            None => {
                self.count(|s| s.misses += 1);
                self.start_read(log, idx, false)?
            }
        };
        self.read_ahead(log, idx);
        load.wait().await
    }

    /// Copies the log ranges `(offset, len)` (ascending, each wholly below
    /// `cacheable_below(committed)`) out of cached blocks, one `Bytes` per range, all
    /// in one allocation holding just these ranges. A range whose block could not be
    /// read is read straight from the log.
    pub async fn read_ranges(
        self: &Rc<Self>,
        log: &CommitLog,
        ranges: &[(u64, usize)],
    ) -> Result<Vec<Bytes>> {
        let b = self.block;
        let mut blocks: Vec<u64> = Vec::new();
        for &(start, len) in ranges {
            for idx in start / b..=(start + len.max(1) as u64 - 1) / b {
                if blocks.last() != Some(&idx) {
                    blocks.push(idx);
                }
            }
        }
        let mut buf = BytesMut::with_capacity(ranges.iter().map(|r| r.1).sum());
        let mut out = Vec::with_capacity(ranges.len());
        let mut cur: Option<(u64, Rc<ReadBuf>)> = None;
        let (mut at, mut hinted) = (0usize, 0usize);
        for &(start, len) in ranges {
            let end = start + len as u64;
            let mut pos = start;
            let mut whole = true;
            while pos < end {
                let idx = pos / b;
                if cur.as_ref().map(|c| c.0) != Some(idx) {
                    cur = None;
                    while at < blocks.len() && blocks[at] != idx {
                        at += 1;
                    }
                    // Ask for this get's next blocks while copying from this one.
                    let ahead = (at + 1 + self.readahead as usize).min(blocks.len());
                    hinted = hinted.max(at + 1);
                    while hinted < ahead {
                        self.hint(log, blocks[hinted]);
                        hinted += 1;
                    }
                    match self.block(log, idx).await {
                        Some(d) => cur = Some((idx, d)),
                        None => {
                            whole = false;
                            break;
                        }
                    }
                }
                let data = &cur.as_ref().expect("set above").1;
                let o = (pos - idx * b) as usize;
                let n = (end.min((idx + 1) * b) - pos) as usize;
                buf.extend_from_slice(&data[o..o + n]);
                pos += n as u64;
            }
            if whole {
                out.push(buf.split().freeze());
            } else {
                buf.clear();
                out.push(log.read(start, len).await?);
            }
        }
        Ok(out)
    }
}
