//! The write buffers: RocketMQ's `TransientStorePool`. Puts encode records into an
//! aligned in-memory buffer (the **written** position) and the commit service writes
//! the filled, aligned range to the segment file, as RocketMQ's `writeBuffer` path
//! does; here it is the only path.
//!
//! | RocketMQ | here |
//! |---|---|
//! | `TransientStorePool` (`transientStorePoolSize` buffers) | [`WriteBufferPool`] (`write_buffer_count`) |
//! | a pooled `ByteBuffer` (`writeBuffer`), one per mapped file | [`WriteBuffer`], `write_buffer_bytes` of the log (4 MiB) |
//! | `borrowBuffer` / `returnBuffer` | opening a free buffer / recycling a committed one |
//!
//! Unlike RocketMQ's, a buffer holds one aligned *window* of the log (offsets
//! `[i * write_buffer_bytes, (i+1) * write_buffer_bytes)`), not a whole segment, and a
//! segment's size is a multiple of it, so a buffer never spans two segments. Buffers
//! are glommio `DmaBuffer`s allocated once, at recovery's end, and never freed before
//! the log.
//!
//! Invariants:
//! * only the newest resident buffer is open for appends; the others are sealed
//!   (`Rc<DmaBuffer>`, immutable), so the commit writes a sealed buffer whole, uncopied;
//! * bytes below `written` are never modified again (the group-commit thread reads
//!   them with no lock);
//! * the shard writes a buffer only through [`WriteBufferPool::window_mut`]: a `&mut`
//!   over exactly the bytes being written (`[at, at + len)`, at or past `written`),
//!   made from the buffer's raw pointer, never a reference over the whole window while
//!   the group-commit thread may read its lower part (that would alias the thread's
//!   reads, undefined behaviour under Rust's aliasing rules even with no byte shared);
//! * a buffer is recycled only once `committed` passed its end and no write holds it,
//!   so any byte not resident is in its segment file. The newest buffers stay resident
//!   and serve reads of recent data;
//! * recycled buffers are not zeroed: every byte is written before it is read or
//!   committed, except the padding of a partial last page (zeroed in the commit's copy)
//!   and a segment's blank tail (zeroed by `append_blank`). Zeroing 4 MiB per buffer
//!   was 5% of the CPU of 1 KiB puts.
//!
//! # Sharing with the group-commit thread
//!
//! | side | may write | may read |
//! |---|---|---|
//! | the shard | `[written, window end)` of the open buffer, through `window_mut` | anything resident |
//! | the group-commit thread | nothing | `[align_down(flushed), published written)`, through raw pointers |
//!
//! The shard writes the bytes, then publishes `written` with a release store (a
//! `SeqCst` store in `GroupCommit::publish`); the thread loads it with acquire before
//! it reads below it, so it sees every byte written before the publish. The thread
//! publishes `flushed` with a release store once its round's write returned; the shard
//! recycles a buffer only after an acquire load of `flushed` passed the buffer's end,
//! so every read of the thread happens before the shard writes the buffer again.
//! `tests::appends_and_a_reading_thread_never_alias` runs this protocol under Miri.

use super::CommitLog;
use crate::error::{Error, Result};
use crate::format::record;
use crate::wake::Deadline;
use glommio::allocate_dma_buffer;
use glommio::io::DmaBuffer;
use std::collections::VecDeque;
use std::rc::Rc;

/// One write buffer: the last resident one is open for appends, the others sealed.
pub(super) enum WriteBuffer {
    Open(DmaBuffer),
    Sealed(Rc<DmaBuffer>),
}

impl WriteBuffer {
    pub(super) fn bytes(&self) -> &[u8] {
        match self {
            WriteBuffer::Open(b) => b.as_bytes(),
            WriteBuffer::Sealed(b) => b.as_bytes(),
        }
    }

    pub(super) fn ptr(&self) -> *const u8 {
        match self {
            WriteBuffer::Open(b) => b.as_ptr(),
            WriteBuffer::Sealed(b) => b.as_ptr(),
        }
    }
}

/// The shard's write buffers: the resident ones, holding consecutive windows of the
/// log up to `written`, and the free ones.
pub(super) struct WriteBufferPool {
    buf_bytes: u64,
    /// Window index (log offset / `buf_bytes`) of `resident[0]`.
    pub(super) first: u64,
    pub(super) resident: VecDeque<WriteBuffer>,
    /// Buffers ready for use.
    free: Vec<DmaBuffer>,
}

impl WriteBufferPool {
    /// An empty pool; [`WriteBufferPool::start_at`] fills it once recovery is done.
    pub(super) fn new(buf_bytes: u64) -> WriteBufferPool {
        WriteBufferPool {
            buf_bytes,
            first: 0,
            resident: VecDeque::new(),
            free: Vec::new(),
        }
    }

    /// Allocates `count` zeroed buffers and opens the one holding `end`, its first
    /// bytes set to `prefix` (what the log holds between that window's start and
    /// `end`, so the next commit can rewrite their page).
    pub(super) fn start_at(&mut self, count: usize, end: u64, prefix: &[u8]) {
        let bufs = (0..count)
            .map(|_| allocate_dma_buffer(self.buf_bytes as usize))
            .collect();
        self.start_with(bufs, end, prefix);
    }

    /// [`WriteBufferPool::start_at`] with the buffers given (each `buf_bytes` long).
    fn start_with(&mut self, bufs: Vec<DmaBuffer>, end: u64, prefix: &[u8]) {
        for mut b in bufs {
            assert_eq!(b.len() as u64, self.buf_bytes);
            // Not shared with anyone yet.
            b.as_bytes_mut().fill(0);
            self.free.push(b);
        }
        self.first = end / self.buf_bytes;
        self.push_new();
        self.window_mut(0, prefix.len()).copy_from_slice(prefix);
    }

    /// Moves an empty pool's open buffer to the window holding `start` (a window's
    /// first byte): the log, still empty, now begins there.
    pub(super) fn restart_at(&mut self, start: u64) {
        debug_assert_eq!(start % self.buf_bytes, 0);
        while let Some(b) = self.resident.pop_front() {
            match b {
                WriteBuffer::Open(b) => self.free.push(b),
                WriteBuffer::Sealed(rc) => {
                    let b = Rc::try_unwrap(rc)
                        .unwrap_or_else(|_| unreachable!("an empty log has no write in flight"));
                    self.free.push(b);
                }
            }
        }
        self.first = start / self.buf_bytes;
        self.push_new();
    }

    /// Window index one past the newest resident buffer.
    pub(super) fn end_idx(&self) -> u64 {
        self.first + self.resident.len() as u64
    }

    /// The resident buffer of window `idx`, if any.
    pub(super) fn get(&self, idx: u64) -> Option<&WriteBuffer> {
        let i = idx.checked_sub(self.first)?;
        self.resident.get(usize::try_from(i).ok()?)
    }

    /// Seals the open buffer and opens a free one after it.
    fn push_new(&mut self) {
        if let Some(WriteBuffer::Open(_)) = self.resident.back() {
            let Some(WriteBuffer::Open(b)) = self.resident.pop_back() else {
                unreachable!()
            };
            self.resident.push_back(WriteBuffer::Sealed(Rc::new(b)));
        }
        let buf = self.free.pop().expect("reserve() made room");
        self.resident.push_back(WriteBuffer::Open(buf));
    }

    /// Opens buffers until window `idx` is resident; returns whether one was sealed.
    fn open_through(&mut self, idx: u64) -> bool {
        let mut sealed = false;
        while self.end_idx() <= idx {
            self.push_new();
            sealed = true;
        }
        sealed
    }

    /// Exactly `[off, off + len)` of the open buffer, to write: made from the buffer's
    /// raw pointer, so no reference covers the bytes below `written` that the
    /// group-commit thread may be reading (module docs). `off` must be at or past the
    /// written position's offset in the window.
    fn window_mut(&mut self, off: usize, len: usize) -> &mut [u8] {
        let Some(WriteBuffer::Open(buf)) = self.resident.back_mut() else {
            unreachable!("the last resident buffer is open")
        };
        assert!(off + len <= buf.len(), "write past the window's end");
        // SAFETY: `[off, off + len)` lies inside the allocation (checked above), which
        // lives as long as `buf` (borrowed mutably for the slice's lifetime); the pool
        // hands out one such slice at a time (`&mut self`), and the group-commit thread
        // reads only below `written`, where the shard never writes (module docs).
        unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr().add(off), len) }
    }

    /// Copies `src` to log offset `pos` (the written position), opening buffers as
    /// needed; returns whether one was sealed.
    fn write(&mut self, pos: u64, src: &[u8]) -> bool {
        let mut sealed = false;
        let mut pos = pos;
        let mut src = src;
        while !src.is_empty() {
            sealed |= self.open_through(pos / self.buf_bytes);
            let off = (pos % self.buf_bytes) as usize;
            let n = src.len().min(self.buf_bytes as usize - off);
            self.window_mut(off, n).copy_from_slice(&src[..n]);
            src = &src[n..];
            pos += n as u64;
        }
        sealed
    }

    /// `f` writes `len` bytes at log offset `pos` (the written position) in place;
    /// they must fit in one window. Returns whether a buffer was sealed.
    fn fill(&mut self, pos: u64, len: usize, f: impl FnOnce(&mut [u8])) -> bool {
        let sealed = self.open_through(pos / self.buf_bytes);
        f(self.window_mut((pos % self.buf_bytes) as usize, len));
        sealed
    }

    /// Zeroes `[from, to)` of the log (at or past the written position, within the
    /// open buffer or after it), opening buffers as needed.
    fn zero(&mut self, from: u64, to: u64) {
        let mut from = from;
        while from < to {
            self.open_through(from / self.buf_bytes);
            let win_start = from / self.buf_bytes * self.buf_bytes;
            let end = to.min(win_start + self.buf_bytes);
            self.window_mut((from - win_start) as usize, (end - from) as usize)
                .fill(0);
            from = end;
        }
    }
}

impl CommitLog {
    /// Makes room in the pool for `len` more bytes, waiting for the writer to commit
    /// older buffers when the pool is exhausted, at most until `deadline`. Call right
    /// before appending. `Ok(false)`: the deadline passed first (nothing reserved: the
    /// disk is too slow or stalled; the waits end by the store's deadline ticker).
    pub async fn reserve(&self, len: u64, deadline: &Deadline) -> Result<bool> {
        self.reserve_with(|log| log.placement(len).start + len, deadline)
            .await
    }

    /// [`CommitLog::reserve`] for bytes that go exactly at `written` (replicated
    /// bytes, placed by their master): room up to `written + len`, waiting as long as
    /// it takes (the replica's applier has nobody to answer by a deadline).
    pub async fn reserve_at_written(&self, len: u64) -> Result<()> {
        loop {
            let deadline = Deadline::lazy(self.cfg.sync_flush_timeout);
            if self
                .reserve_with(|log| log.written.get() + len, &deadline)
                .await?
            {
                return Ok(());
            }
        }
    }

    /// Makes room up to the end `end_of` computes (again after every wait).
    async fn reserve_with(
        &self,
        end_of: impl Fn(&CommitLog) -> u64,
        deadline: &Deadline,
    ) -> Result<bool> {
        loop {
            if let Some(f) = self.failure() {
                return Err(Error::Failed(f));
            }
            if self.stopping.get() {
                return Err(Error::ShutDown);
            }
            let end = end_of(self);
            if self.try_make_room(end) {
                return Ok(true);
            }
            let oldest_end = (self.pool.borrow().first + 1) * self.buf_bytes;
            self.writer_wake.notify();
            if self.committed.get() >= oldest_end {
                // Committed, but its buffer is not free yet (a finished write still
                // holds it): let other tasks run rather than spin.
                if deadline.passed() {
                    return Ok(false);
                }
                futures_lite::future::yield_now().await;
            } else if self
                .committed
                .wait_until_timed(oldest_end, deadline.at())
                .await
                .is_none()
            {
                return Ok(false);
            }
        }
    }

    /// Recycles fully committed buffers until the pool can hold bytes up to `end`.
    fn try_make_room(&self, end: u64) -> bool {
        let mut p = self.pool.borrow_mut();
        let last_idx = p.end_idx() - 1;
        let need_idx = (end.max(1) - 1) / self.buf_bytes;
        let needed = need_idx.saturating_sub(last_idx) as usize;
        let committed = self.committed.get();
        while p.free.len() < needed
            && p.resident.len() > 1
            && (p.first + 1) * self.buf_bytes <= committed
        {
            let Some(WriteBuffer::Sealed(rc)) = p.resident.pop_front() else {
                unreachable!("only the last buffer is open")
            };
            match Rc::try_unwrap(rc) {
                Ok(buf) => {
                    // Not zeroed (module docs).
                    p.free.push(buf);
                    p.first += 1;
                }
                Err(rc) => {
                    // Still referenced by a write that has not been dropped yet.
                    p.resident.push_front(WriteBuffer::Sealed(rc));
                    break;
                }
            }
        }
        p.free.len() >= needed
    }

    /// Copies `bytes` into the buffers at `written` (which must equal `at`). The caller
    /// reserved room and encoded `bytes` for this exact offset.
    pub fn append(&self, at: u64, bytes: &[u8], store_ts: i64) {
        assert_eq!(
            at,
            self.written.get(),
            "append must continue at the written position"
        );
        // The first byte after the async writer went idle wakes it (it waits without a
        // timer then, `flush.rs`), as a sealed buffer does.
        let idle = self.writer_idle.replace(false);
        if self.pool.borrow_mut().write(at, bytes) || idle {
            self.writer_wake.notify();
        }
        self.written.set(at + bytes.len() as u64);
        self.last_put_ts.set(store_ts);
    }

    /// Appends `len` bytes at `at` (the written position) that `fill` writes: straight
    /// into the open buffer when they fit in it, else through a buffer and
    /// [`CommitLog::append`]. `fill` gets exactly `len` bytes (not zeroed).
    pub fn append_with(&self, at: u64, len: usize, store_ts: i64, fill: impl FnOnce(&mut [u8])) {
        assert_eq!(
            at,
            self.written.get(),
            "append must continue at the written position"
        );
        let off = (at % self.buf_bytes) as usize;
        if off + len > self.buf_bytes as usize {
            let mut buf = vec![0u8; len];
            fill(&mut buf);
            self.append(at, &buf, store_ts);
            return;
        }
        let idle = self.writer_idle.replace(false);
        if self.pool.borrow_mut().fill(at, len, fill) || idle {
            // A buffer was sealed (or the writer idles, as in `append`): the writer
            // has something to do.
            self.writer_wake.notify();
        }
        self.written.set(at + len as u64);
        self.last_put_ts.set(store_ts);
    }

    /// Writes the blank record that ends the current segment and moves `written` to
    /// the next segment's start. The buffers of the skipped bytes are zero-filled.
    pub fn append_blank(&self, at: u64) {
        let seg_end = self.segment_start(at) + self.seg_bytes;
        let remaining = seg_end - at;
        assert!(remaining >= record::END_FILE_MIN_BLANK_LENGTH as u64);
        let blank = record::encode_blank(remaining as u32);
        self.append(at, &blank, self.last_put_ts.get());
        // The rest of the segment is zeros on disk: recycled buffers are not zeroed,
        // so write the zeros here, once per segment.
        self.pool
            .borrow_mut()
            .zero(at + blank.len() as u64, seg_end);
        self.written.set(seg_end);
    }

    /// Start of the open buffer's window: every byte below it sits in a sealed buffer
    /// (or is committed).
    pub(super) fn sealed_end(&self) -> u64 {
        (self.pool.borrow().end_idx() - 1) * self.buf_bytes
    }

    /// Copies the buffered bytes at `[pos, pos + dst.len())` into `dst` (callers copy
    /// only up to `written`: recycled buffers are not zeroed).
    pub(super) fn copy_from_buffers(&self, pos: u64, dst: &mut [u8]) {
        let p = self.pool.borrow();
        let mut at = pos;
        let mut out = 0;
        while out < dst.len() {
            let idx = at / self.buf_bytes;
            let off = (at % self.buf_bytes) as usize;
            let n = (dst.len() - out).min(self.buf_bytes as usize - off);
            if idx >= p.end_idx() {
                // Past the open buffer: nothing written there yet.
                dst[out..].fill(0);
                return;
            }
            let buf = p
                .get(idx)
                .expect("a resident buffer holds every uncommitted byte");
            dst[out..out + n].copy_from_slice(&buf.bytes()[off..off + n]);
            out += n;
            at += n as u64;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};

    /// A window's memory as the reading thread sees it (as `group_commit`'s `BufPtr`).
    #[derive(Clone, Copy)]
    struct Ptr(*const u8);
    // SAFETY: read only below the published `written`; the test joins the thread
    // before the pool (and its buffers) goes away.
    unsafe impl Send for Ptr {}

    const BUF: u64 = 512;
    const WINDOWS: usize = 4;
    /// Bytes each append writes: within a window, across one, exactly one.
    const APPENDS: [usize; 9] = [1, 100, 411, 300, 512, 7, 200, 5, 12];
    /// `[ZERO_FROM, TOTAL)` is zeroed like a segment's blank tail.
    const ZERO_FROM: u64 = 1548;
    const TOTAL: u64 = 2048;

    fn expected(pos: u64) -> u8 {
        if pos >= ZERO_FROM {
            0
        } else {
            (pos % 251) as u8 + 1
        }
    }

    /// The group-commit thread's protocol (module docs) with a plain thread, since
    /// glommio does not run under Miri: the shard appends through the pool's own
    /// paths (`write`, `fill`, `zero`) and publishes each new `written` with a
    /// release store after the windows' pointers; the thread loads it with acquire
    /// and reads everything below it through raw pointers, as `write_round` does,
    /// while the shard goes on writing above. Natively this checks the bytes; under
    /// Miri (`cargo +nightly miri test --lib transient_store_pool`) also the aliasing
    /// model and data races.
    #[test]
    fn appends_and_a_reading_thread_never_alias() {
        let mut pool = WriteBufferPool::new(BUF);
        let bufs = (0..WINDOWS)
            .map(|_| glommio::allocate_dma_buffer_global(BUF as usize))
            .collect();
        pool.start_with(bufs, 0, &[]);
        let written = Arc::new(AtomicU64::new(0));
        let windows: Arc<Mutex<Vec<Ptr>>> = Arc::default();
        let reader = {
            let (written, windows) = (written.clone(), windows.clone());
            std::thread::spawn(move || {
                let mut seen = 0;
                while seen < TOTAL {
                    let w = written.load(Ordering::Acquire);
                    if w == seen {
                        std::thread::yield_now();
                        continue;
                    }
                    let ptrs = windows.lock().unwrap().clone();
                    let mut pos = seen;
                    while pos < w {
                        let off = pos % BUF;
                        let n = (w - pos).min(BUF - off);
                        // SAFETY: below the published `written`, in a live buffer.
                        let bytes = unsafe {
                            std::slice::from_raw_parts(
                                ptrs[(pos / BUF) as usize].0.add(off as usize),
                                n as usize,
                            )
                        };
                        for (i, b) in bytes.iter().enumerate() {
                            assert_eq!(*b, expected(pos + i as u64), "byte {}", pos + i as u64);
                        }
                        pos += n;
                    }
                    seen = w;
                }
            })
        };
        let publish = |pool: &WriteBufferPool, end: u64| {
            let mut ptrs = windows.lock().unwrap();
            while (ptrs.len() as u64) * BUF < end {
                let idx = ptrs.len() as u64;
                ptrs.push(Ptr(pool.get(idx).unwrap().ptr()));
            }
            drop(ptrs);
            written.store(end, Ordering::Release);
        };
        let mut pos = 0;
        for (i, len) in APPENDS.into_iter().enumerate() {
            let data: Vec<u8> = (pos..pos + len as u64).map(expected).collect();
            let fits = pos % BUF + len as u64 <= BUF;
            if i % 2 == 0 && fits {
                pool.fill(pos, len, |out| out.copy_from_slice(&data));
            } else {
                pool.write(pos, &data);
            }
            pos += len as u64;
            publish(&pool, pos);
        }
        assert_eq!(pos, ZERO_FROM);
        pool.zero(pos, TOTAL);
        publish(&pool, TOTAL);
        reader.join().unwrap();
        assert_eq!(pool.end_idx(), WINDOWS as u64);
        assert!(matches!(pool.resident[0], WriteBuffer::Sealed(_)));
    }
}
