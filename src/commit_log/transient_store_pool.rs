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
//! * a buffer is recycled only once `committed` passed its end and no write holds it,
//!   so any byte not resident is in its segment file. The newest buffers stay resident
//!   and serve reads of recent data;
//! * recycled buffers are not zeroed: every byte is written before it is read or
//!   committed, except the padding of a partial last page (zeroed in the commit's copy)
//!   and a segment's blank tail (zeroed by `append_blank`). Zeroing 4 MiB per buffer
//!   was 5% of the CPU of 1 KiB puts.

use super::CommitLog;
use crate::error::{Error, Result};
use crate::format::record;
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
        for _ in 0..count {
            let mut b = allocate_dma_buffer(self.buf_bytes as usize);
            b.as_bytes_mut().fill(0);
            self.free.push(b);
        }
        self.first = end / self.buf_bytes;
        self.push_new();
        if let Some(WriteBuffer::Open(b)) = self.resident.back_mut() {
            b.as_bytes_mut()[..prefix.len()].copy_from_slice(prefix);
        }
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

    /// The open buffer's bytes.
    fn open_bytes(&mut self) -> &mut [u8] {
        let Some(WriteBuffer::Open(buf)) = self.resident.back_mut() else {
            unreachable!("the last resident buffer is open")
        };
        buf.as_bytes_mut()
    }
}

impl CommitLog {
    /// Makes room in the pool for `len` more bytes, waiting for the writer to commit
    /// older buffers when the pool is exhausted. Call right before appending.
    pub async fn reserve(&self, len: u64) -> Result<()> {
        self.reserve_with(|log| log.placement(len).start + len)
            .await
    }

    /// [`CommitLog::reserve`] for bytes that go exactly at `written` (replicated
    /// bytes, placed by their master): room up to `written + len`.
    pub async fn reserve_at_written(&self, len: u64) -> Result<()> {
        self.reserve_with(|log| log.written.get() + len).await
    }

    /// Makes room up to the end `end_of` computes (again after every wait).
    async fn reserve_with(&self, end_of: impl Fn(&CommitLog) -> u64) -> Result<()> {
        loop {
            if let Some(f) = self.failure() {
                return Err(Error::Failed(f));
            }
            if self.stopping.get() {
                return Err(Error::ShutDown);
            }
            let end = end_of(self);
            if self.try_make_room(end) {
                return Ok(());
            }
            let oldest_end = (self.pool.borrow().first + 1) * self.buf_bytes;
            self.writer_wake.notify();
            if self.committed.get() >= oldest_end {
                // Committed, but its buffer is not free yet (a finished write still
                // holds it): let other tasks run rather than spin.
                futures_lite::future::yield_now().await;
            } else {
                self.committed.wait_for(oldest_end).await;
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
        let mut p = self.pool.borrow_mut();
        let mut pos = at;
        let mut src = bytes;
        while !src.is_empty() {
            if p.open_through(pos / self.buf_bytes) {
                // A buffer was sealed: there is a whole one to commit.
                self.writer_wake.notify();
            }
            let off = (pos % self.buf_bytes) as usize;
            let n = src.len().min(self.buf_bytes as usize - off);
            p.open_bytes()[off..off + n].copy_from_slice(&src[..n]);
            src = &src[n..];
            pos += n as u64;
        }
        drop(p);
        self.written.set(pos);
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
        let mut p = self.pool.borrow_mut();
        if p.open_through(at / self.buf_bytes) {
            // A buffer was sealed: there is a whole one to commit.
            self.writer_wake.notify();
        }
        fill(&mut p.open_bytes()[off..off + len]);
        drop(p);
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
        let mut p = self.pool.borrow_mut();
        let mut from = at + blank.len() as u64;
        loop {
            let win_start = (p.end_idx() - 1) * self.buf_bytes;
            let to = seg_end.min(win_start + self.buf_bytes);
            p.open_bytes()[(from - win_start) as usize..(to - win_start) as usize].fill(0);
            if to >= seg_end {
                break;
            }
            p.push_new();
            from = to;
        }
        drop(p);
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
