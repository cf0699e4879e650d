//! Sync flush's group commit: RocketMQ's `GroupCommitService`, with direct I/O and a
//! `pwritev2(RWF_DSYNC)` instead of an mmap `force()`.
//!
//! With `sync_flush_io = DsyncWrite` on the real disk, one thread per shard makes the
//! log durable as fast as the disk allows: it takes everything appended so far, writes
//! it with one `pwritev2(RWF_DSYNC)` straight from the shard's write buffers (no copy;
//! only the partial last page is copied, to pad it with zeros), publishes the new
//! flushed offset, wakes the shard, and starts the next round at once with whatever was
//! appended meanwhile. The shard never schedules a round: each sync put publishes
//! `written` ([`CommitLog::wake_sync_writer`]) and reads `flushed` back, and the writer
//! task only keeps segments open ahead of the thread and takes in its progress when the
//! shard is idle. On the simulated disk, and with `RingWriteFdatasync`, the writer task
//! runs the rounds itself (`flush.rs`).
//!
//! Decisions, each measured (`docs/performance/commit_log.md`, "Sync flush"):
//! * A thread, not the io_uring ring: glommio submits a ring request only at the
//!   executor's next I/O poll, which under load waits for a burst of puts, so rounds
//!   went lock-step with the CPU (~120,000 msg/s, 1 shard x 256 outstanding); the thread
//!   runs rounds back to back (idle between rounds: p50 1-2 us).
//! * The per-put traffic goes through atomics, and only the first publish after the
//!   thread parked notifies: one mutex cost ~940 futex calls a second and 1.5 ms put
//!   waits for 0.3 ms rounds. It notifies after releasing the lock, so the woken thread
//!   does not wait for it: one put at a time made 1.2 futex calls and 4.9 context
//!   switches per put, against 2.8 and 6.0 notifying under the lock.
//! * Puts take in finished rounds themselves ([`GroupCommit::publish`] returns the
//!   durable position): the woken writer task ran only ~760 us apart while rounds ended
//!   ~330 us apart.
//! * Gathering (at most half the last round's I/O time, at most `GATHER_MAX`) when
//!   fewer than half the last round's bytes wait: 204-245 k msg/s against 189-224 k
//!   without (2 shards x 128 outstanding).
//! * One round in flight per shard: two threads with rounds of whole pages gave
//!   207-286 k against 272-329 k msg/s. The thread inherits its shard's CPU: a wake-up
//!   on the same CPU is the cheaper one (lone put p50 288-365 us against 310-560 us).
//! * The shard leads a round when the thread waits and nothing else is ready
//!   (`sync_flush_lead_when_idle`, [`CommitLog::sync_put_appended`]): the put publishes
//!   without waking the thread, lets what is ready run once, and if the shard has
//!   nothing left to do it writes the round itself, as the classic group commit's
//!   leader does: the shard would only wait for the round, and the two hand-offs
//!   (shard to thread, thread back) go. One shard, 16 sync puts outstanding: 90-96 k
//!   against 55-59 k msg/s, p50 134-141 against 198-205 us, CPU per put 5.8-6.1 against
//!   10.1-10.9 us; 4 outstanding 28-33 k against 17.5-18.5 k msg/s; 1 outstanding
//!   within the noise (CPU per put 46-56 against 53-59 us); 2 shards x 256 no loss
//!   (383-462 k against 379-387 k msg/s); puts from an outside thread through the
//!   handle (4 outstanding) 10.0-10.9 k against 11.3-12.4 k msg/s: what arrives while
//!   the shard writes is taken in only after the round. While it writes, the shard runs
//!   nothing else: a read or timer waits up to one round, and a stalled disk stops the
//!   shard, which the durability contract otherwise rules out: off by default.
//!
//! Invariants: rounds never overlap (a round rewrites the previous round's last page,
//! and two in-flight writes of a page land in either order): the shard leads only
//! when it finds the thread parked under the lock, and the thread plans no round while
//! `leading` is set; a round ends at a
//! published `written` or a segment's end, both record boundaries, so `flushed` is one;
//! no round reaches into a range the prewriter is writing. Sharing the buffers with
//! this thread is safe because of what the shard guarantees: bytes below the published
//! `written` are never modified again, and a buffer is recycled only after `flushed`
//! (as read back from here) has passed its end, so no round in flight reads it. The
//! thread only ever reads buffer memory, and only below `written`; the shard only writes
//! at or past `written`, through references over exactly those bytes (who touches which
//! bytes, and the orderings: `transient_store_pool.rs`). The shard stops and joins the
//! thread before it frees the buffers (`Drop`).

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, VecDeque};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::{Poll, Waker};
use std::time::Duration;

use super::CommitLog;
use crate::error::{Error, Result};
use crate::io::{AlignedBuf, PAGE, align_down, align_up, pwritev_dsync};
use std::rc::Rc;

/// While bytes wait for the thread, the writer task also looks this often (a
/// safety net; the thread's wake-up after each round is the way it learns).
const SAFETY_TICK: Duration = Duration::from_millis(10);

/// The longest a round waits to gather more puts (see `run`).
const GATHER_MAX: Duration = Duration::from_micros(250);

/// A write buffer's memory as the thread sees it (the shard owns it; see the module docs).
#[derive(Clone, Copy)]
struct BufPtr(*const u8);
// SAFETY: only read by the thread, below `written`, while the shard keeps the buffer
// alive and unmodified there (module docs).
unsafe impl Send for BufPtr {}

/// What changes rarely (new buffers and segments) and the parking handshake.
#[derive(Default)]
struct State {
    /// Window index (log offset / `buf_bytes`) -> its buffer's memory (entries below
    /// `flushed`'s window may be stale).
    buffers: BTreeMap<u64, BufPtr>,
    /// Segment start -> descriptor.
    segments: BTreeMap<u64, Arc<OwnedFd>>,
    /// A range being zero-filled ahead of the log: rounds must not reach into it.
    prewrite: Option<(u64, u64)>,
    /// The failed round's file position and error; the thread has stopped.
    error: Option<(u64, std::io::Error)>,
    stop: bool,
    /// The shard runs a round itself (`GroupCommit::lead_round`): the thread waits.
    leading: bool,
    /// The shard's writer task, woken after each round.
    waker: Option<Waker>,
}

/// What the shard and the thread share. The per-put traffic goes through atomics: the
/// shard publishes `written` after every put and reads `flushed` back (with both under
/// one mutex the shard blocked on it while the thread held it across its wake-ups).
struct Shared {
    /// Published by the shard: every byte below is final.
    written: AtomicU64,
    /// Published by the thread: every byte below is durable.
    flushed: AtomicU64,
    failed: AtomicBool,
    /// The thread waits on `wake` for more to write.
    parked: AtomicBool,
    state: Mutex<State>,
    wake: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records how `round` ended (the thread's or one the shard led), under the lock
    /// `st`: the new durable position, or the error that stops the thread. Returns
    /// whether it failed.
    fn finish_round(&self, st: &mut State, round: &Round, result: std::io::Result<()>) -> bool {
        match result {
            Ok(()) => {
                self.flushed.store(round.target, Ordering::Release);
                false
            }
            Err(e) => {
                st.error = Some((round.file_pos, e));
                self.failed.store(true, Ordering::Release);
                st.stop = true;
                true
            }
        }
    }
}

/// What a publish does when the thread waits for work and bytes wait to be made
/// durable.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Handoff {
    /// Wake the thread.
    Wake,
    /// Leave it waiting: the caller publishes again soon with `Lead` or `Wake`.
    Hold,
    /// Run the round on the calling thread ([`GroupCommit::lead_round`]), else wake.
    Lead,
}

/// Geometry of the log the thread writes.
#[derive(Clone, Copy)]
pub struct Layout {
    pub seg_bytes: u64,
    pub buf_bytes: u64,
}

/// The shard's handle on its group-commit thread.
pub struct GroupCommit {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
    buf_bytes: u64,
    /// Highest window index whose buffer is registered.
    last_window: Cell<Option<u64>>,
    /// Published positions not yet known durable, with the store timestamp of the
    /// record ending there: a round always ends at one of them or at a segment's
    /// end, so the stamp of what is durable is exact.
    stamps: RefCell<VecDeque<(u64, i64)>>,
    flushed_ts: Cell<i64>,
    layout: Layout,
    /// The padded last page of a round the shard runs itself.
    lead_page: RefCell<AlignedBuf>,
    /// Rounds the shard ran itself.
    led: Cell<u64>,
}

impl GroupCommit {
    /// Starts the thread; the log is durable up to `flushed` (stamped `flushed_ts`).
    pub fn start(layout: Layout, flushed: u64, flushed_ts: i64) -> std::io::Result<GroupCommit> {
        let shared = Arc::new(Shared {
            written: AtomicU64::new(flushed),
            flushed: AtomicU64::new(flushed),
            failed: AtomicBool::new(false),
            parked: AtomicBool::new(false),
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("coremq-flush".into())
            .spawn(move || run(&s, layout))?;
        Ok(GroupCommit {
            shared,
            thread: Some(thread),
            buf_bytes: layout.buf_bytes,
            last_window: Cell::new(None),
            stamps: RefCell::new(VecDeque::new()),
            flushed_ts: Cell::new(flushed_ts),
            layout,
            lead_page: RefCell::new({
                let mut page = AlignedBuf::new(PAGE);
                page.set_len(PAGE);
                page
            }),
            led: Cell::new(0),
        })
    }

    /// Publishes `written` (every byte below it final; `ts` is the store timestamp
    /// of the record ending there) and the memory of the buffers up to it (`buffer`
    /// maps a window index to its buffer's memory); `handoff` says what happens when
    /// the thread waits for work and bytes wait to be made durable.
    /// Returns how far the log is durable as of now (offset, store timestamp), so a
    /// busy shard learns of finished rounds without being woken.
    pub fn publish(
        &self,
        written: u64,
        ts: i64,
        buffer: impl Fn(u64) -> *const u8,
        handoff: Handoff,
    ) -> (u64, i64) {
        let sh = &*self.shared;
        let buf_bytes = self.buf_bytes;
        let mut stamps = self.stamps.borrow_mut();
        let published = stamps
            .back()
            .map_or(sh.written.load(Ordering::Relaxed), |s| s.0);
        if written > published {
            let last = (written - 1) / buf_bytes;
            let first = match self.last_window.get() {
                Some(l) if l >= last => None,
                Some(l) => Some(l + 1),
                None => Some(published / buf_bytes),
            };
            if let Some(first) = first {
                let mut st = sh.lock();
                for idx in first..=last {
                    st.buffers.insert(idx, BufPtr(buffer(idx)));
                }
                // Buffers wholly below the flushed position are never read again.
                let keep = sh.flushed.load(Ordering::Acquire) / buf_bytes;
                st.buffers = st.buffers.split_off(&keep);
                self.last_window.set(Some(last));
            }
            stamps.push_back((written, ts));
            sh.written.store(written, Ordering::SeqCst);
        }
        // Only the first publish after the thread parked notifies: until the thread
        // ran again, every later one made a futex call of its own and took the lock
        // the waking thread wanted (~1,700 futex calls a second per shard at 256
        // outstanding; 350-680 with the swap; the put rate within noise).
        let waiting = sh.written.load(Ordering::SeqCst) > sh.flushed.load(Ordering::Acquire);
        if waiting
            && handoff != Handoff::Hold
            && !(handoff == Handoff::Lead && self.lead_round())
            && sh.parked.swap(false, Ordering::SeqCst)
        {
            // Taking the lock waits until the thread is inside its wait (or past its
            // check of `written`); notifying once it is released spares the woken
            // thread a wait for the lock (a futex wait and wake more).
            drop(sh.lock());
            sh.wake.notify_one();
        }
        let flushed = sh.flushed.load(Ordering::Acquire);
        while let Some(&(at, ts)) = stamps.front() {
            if at > flushed {
                break;
            }
            self.flushed_ts.set(ts);
            stamps.pop_front();
        }
        (flushed, self.flushed_ts.get())
    }

    /// Runs the round for everything published on the calling (shard) thread, when the
    /// group-commit thread waits for work (no round in flight): one `pwritev2` on the
    /// thread that waits for it, as fio's own writes, instead of two hand-offs between
    /// threads. Returns whether it ran (a failure ran too: the thread is stopped and
    /// [`GroupCommit::take_error`] has it).
    fn lead_round(&self) -> bool {
        let sh = &*self.shared;
        let round = {
            let mut st = sh.lock();
            if st.leading || st.stop || !sh.parked.load(Ordering::SeqCst) {
                return false;
            }
            let start = sh.flushed.load(Ordering::Relaxed);
            let written = sh.written.load(Ordering::SeqCst);
            match plan(&st, start, written, self.layout) {
                Some(r) => {
                    st.leading = true;
                    r
                }
                None => return false,
            }
        };
        let result = write_round(&round, &mut self.lead_page.borrow_mut());
        self.led.set(self.led.get() + 1);
        let mut st = sh.lock();
        st.leading = false;
        if sh.finish_round(&mut st, &round, result) {
            // The thread waits: let it see `stop` and end.
            sh.wake.notify_one();
        }
        true
    }

    /// Registers the segment starting at `start` (its file exists at full size).
    pub fn add_segment(&self, start: u64, fd: Arc<OwnedFd>) {
        let mut st = self.shared.lock();
        st.segments.insert(start, fd);
        self.shared.wake.notify_one();
    }

    /// Drops the descriptors of the segments starting below `start` (retired: the
    /// thread only writes at or past the durable end, which lies past them).
    pub fn remove_segments_below(&self, start: u64) {
        let mut st = self.shared.lock();
        st.segments = st.segments.split_off(&start);
    }

    /// Sets (or clears) the range being zero-filled ahead of the log (at or past
    /// the page of `written` when set): no round reaches into it while it is set.
    pub fn set_prewrite(&self, range: Option<(u64, u64)>) {
        let mut st = self.shared.lock();
        st.prewrite = range;
        self.shared.wake.notify_one();
    }

    /// Whether the thread waits for work (no round in flight, none about to start).
    pub fn thread_waits(&self) -> bool {
        self.shared.parked.load(Ordering::SeqCst)
    }

    /// Whether a round failed (the thread's or one the shard ran).
    pub fn failed(&self) -> bool {
        self.shared.failed.load(Ordering::Acquire)
    }

    /// The error that stopped the thread (once): the file position of the failed
    /// round in its segment, and the I/O error.
    pub fn take_error(&self) -> Option<(u64, std::io::Error)> {
        if !self.shared.failed.load(Ordering::Acquire) {
            return None;
        }
        self.shared.lock().error.take()
    }

    /// Completes once the durable position passes `seen` or the thread failed.
    pub async fn progress(&self, seen: u64) {
        std::future::poll_fn(|cx| {
            let sh = &*self.shared;
            let mut st = sh.lock();
            if sh.flushed.load(Ordering::Acquire) > seen || sh.failed.load(Ordering::Acquire) {
                Poll::Ready(())
            } else {
                st.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        })
        .await
    }
}

impl Drop for GroupCommit {
    /// Stops the thread after the round in flight (the shard stops it only once
    /// everything is flushed, or after a failure) and waits for it, so no round
    /// reads a buffer after the shard freed it.
    fn drop(&mut self) {
        {
            let mut st = self.shared.lock();
            st.stop = true;
            self.shared.wake.notify_one();
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One round's plan, taken under the lock.
struct Round {
    fd: Arc<OwnedFd>,
    /// File position of the first byte written (page aligned).
    file_pos: u64,
    /// Whole pages straight from the write buffers.
    parts: Vec<(BufPtr, usize)>,
    /// Bytes of the partial last page (the rest of the page is written as zeros).
    tail: usize,
    tail_src: Option<BufPtr>,
    start: u64,
    target: u64,
}

fn plan(st: &State, start: u64, written: u64, layout: Layout) -> Option<Round> {
    let seg = start / layout.seg_bytes * layout.seg_bytes;
    let fd = st.segments.get(&seg)?.clone();
    let from = align_down(start);
    // Everything published, up to the segment's end: both are record boundaries
    // (`flushed` must be one: dispatch and the checkpoint take it as such).
    let target = written.min(seg + layout.seg_bytes);
    if target <= start {
        return None;
    }
    if let Some((p_from, _)) = st.prewrite
        && align_up(target) > p_from
    {
        // Two in-flight writes of a page land in any order: wait for the prewrite.
        return None;
    }
    let whole_end = align_down(target);
    let mut parts = Vec::new();
    let mut pos = from;
    while pos < whole_end {
        let idx = pos / layout.buf_bytes;
        let off = pos % layout.buf_bytes;
        let n = (whole_end - pos).min(layout.buf_bytes - off);
        let base = st.buffers.get(&idx)?;
        // SAFETY: inside the buffer (off + n <= buf_bytes).
        parts.push((BufPtr(unsafe { base.0.add(off as usize) }), n as usize));
        pos += n;
    }
    let tail = (target - whole_end) as usize;
    let tail_src = if tail > 0 {
        let base = st.buffers.get(&(whole_end / layout.buf_bytes))?;
        // SAFETY: a page inside the buffer.
        Some(BufPtr(unsafe {
            base.0.add((whole_end % layout.buf_bytes) as usize)
        }))
    } else {
        None
    };
    Some(Round {
        fd,
        file_pos: from - seg,
        parts,
        tail,
        tail_src,
        start,
        target,
    })
}

fn run(sh: &Shared, layout: Layout) {
    let mut page = AlignedBuf::new(PAGE);
    page.set_len(PAGE);
    let mut prev_bytes = 0u64;
    let mut prev_io = Duration::ZERO;
    loop {
        // Gather: when less than half of the last round's bytes are waiting, give
        // the puts being acknowledged a moment to come back (at most half a round's
        // I/O time, at most GATHER_MAX). Without it rounds alternated between a few
        // puts and nearly all of them, and the shard sat idle during the big ones
        // (module docs). A lone put is never held: it is the whole last round.
        let pending = sh.written.load(Ordering::SeqCst) - sh.flushed.load(Ordering::Relaxed);
        if pending > 0 && pending < prev_bytes / 2 {
            std::thread::sleep((prev_io / 2).min(GATHER_MAX));
        }
        let round = {
            let mut st = sh.lock();
            loop {
                if st.stop {
                    return;
                }
                let start = sh.flushed.load(Ordering::Relaxed);
                let written = sh.written.load(Ordering::SeqCst);
                if !st.leading
                    && let Some(r) = plan(&st, start, written, layout)
                {
                    break r;
                }
                // Park; `publish` takes the lock and notifies if it finds `parked` set
                // after storing `written` (and clears it), so re-check `written` once
                // `parked` is visible.
                sh.parked.store(true, Ordering::SeqCst);
                if sh.written.load(Ordering::SeqCst) == written {
                    // The timeout is only a safety net.
                    st = sh
                        .wake
                        .wait_timeout(st, Duration::from_millis(100))
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
                sh.parked.store(false, Ordering::SeqCst);
            }
        };
        let t0 = std::time::Instant::now();
        let result = write_round(&round, &mut page);
        prev_io = t0.elapsed();
        prev_bytes = round.target - round.start;
        let waker = {
            let mut st = sh.lock();
            sh.finish_round(&mut st, &round, result);
            st.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

fn write_round(round: &Round, page: &mut AlignedBuf) -> std::io::Result<()> {
    let mut slices: Vec<&[u8]> = Vec::with_capacity(round.parts.len() + 1);
    for &(p, n) in &round.parts {
        // SAFETY: below `written`, in a live buffer (module docs).
        slices.push(unsafe { std::slice::from_raw_parts(p.0, n) });
    }
    if let Some(src) = round.tail_src {
        let buf = page.as_mut_slice();
        // SAFETY: the first `tail` bytes of the page are below `written`.
        buf[..round.tail].copy_from_slice(unsafe { std::slice::from_raw_parts(src.0, round.tail) });
        buf[round.tail..].fill(0);
        slices.push(page.as_slice());
    }
    pwritev_dsync(round.fd.as_raw_fd(), round.file_pos, &mut slices)
}

/// The shard's side: publishing puts to the thread and following its progress.
impl CommitLog {
    /// Bytes were appended in sync mode (a replica's): hands them to the group-commit
    /// thread, or wakes the writer that runs the rounds itself.
    pub fn wake_sync_writer(&self) {
        let gc = self.group_commit.borrow().clone();
        match gc {
            Some(gc) => self.publish(&gc, Handoff::Wake),
            None => self.writer_wake.notify(),
        }
    }

    /// A sync put was appended: as [`CommitLog::wake_sync_writer`], except that with
    /// `sync_flush_lead_when_idle` a round the thread would start from waiting is run
    /// by the shard itself when nothing else is ready to run on it, after letting what
    /// is ready run once (the dispatcher the last round woke, usually). Awaits at most
    /// one yield, then that round when the shard leads it.
    pub async fn sync_put_appended(&self) {
        let gc = self.group_commit.borrow().clone();
        let Some(gc) = gc else {
            self.writer_wake.notify();
            return;
        };
        if !self.cfg.sync_flush_lead_when_idle {
            self.publish(&gc, Handoff::Wake);
            return;
        }
        self.publish(&gc, Handoff::Hold);
        if !gc.thread_waits() || self.flushed.get() >= self.written.get() {
            return;
        }
        let ex = glommio::executor();
        if ex.other_tasks_ready() {
            ex.yield_task_queue_now().await;
        }
        let handoff = if ex.other_tasks_ready() {
            Handoff::Wake
        } else {
            Handoff::Lead
        };
        self.publish(&gc, handoff);
    }

    /// Sync-flush rounds the shard wrote itself (`sync_flush_lead_when_idle`) since the
    /// group-commit thread started.
    pub fn sync_rounds_led(&self) -> u64 {
        self.group_commit
            .borrow()
            .as_ref()
            .map_or(0, |gc| gc.led.get())
    }

    /// Hands `written` and the buffers below it to the group-commit thread, and takes
    /// in the rounds it finished meanwhile: while puts keep the shard busy, this is
    /// where their acknowledgements come from (module docs).
    fn publish(&self, gc: &GroupCommit, handoff: Handoff) {
        let (flushed, ts) = {
            let p = self.pool.borrow();
            let buffer = |idx| p.get(idx).expect("published bytes are resident").ptr();
            gc.publish(self.written.get(), self.last_put_ts.get(), buffer, handoff)
        };
        if flushed > self.flushed.get() {
            self.advance(flushed, ts, true);
        }
        // The writer only keeps segments ahead for the thread; it also ends the log
        // when a round the shard ran failed.
        let seg = self.segment_start(self.written.get());
        if self.group_commit_segs.get().is_none_or(|s| s <= seg) || gc.failed() {
            self.writer_wake.notify();
        }
    }

    /// The writer task with a group-commit thread: it keeps the segments the thread
    /// writes open and one ahead, and turns the thread's progress into
    /// `committed`/`flushed` (waking the puts that wait for them).
    pub(super) async fn run_group_commit(&self) -> Result<()> {
        let layout = Layout {
            seg_bytes: self.seg_bytes,
            buf_bytes: self.buf_bytes,
        };
        debug_assert_eq!(self.committed.get(), self.flushed.get());
        let gc = GroupCommit::start(layout, self.flushed.get(), self.flushed_ts.get())
            .map(Rc::new)
            .map_err(|e| Error::io("start the group-commit thread", &self.dir, 0, e))?;
        *self.group_commit.borrow_mut() = Some(gc.clone());
        // A prewrite chunk may already be in flight (the prewriter starts first).
        gc.set_prewrite(self.prewrite_inflight.get());
        let result = self.follow_group_commit(&gc).await;
        // Stops and joins the thread (after its round in flight) before the buffers
        // can go away.
        self.group_commit.borrow_mut().take();
        drop(gc);
        result
    }

    async fn follow_group_commit(&self, gc: &GroupCommit) -> Result<()> {
        loop {
            self.check_mark()?;
            // Segments: the one being written and the next, so rounds never wait
            // for a file to be created.
            let first = self.segment_start(self.flushed.get());
            let last = self.segment_start(self.written.get()) + self.seg_bytes;
            let mut s = match self.group_commit_segs.get() {
                Some(done) => first.max(done + self.seg_bytes),
                None => first,
            };
            while s <= last {
                let file = self.ensure_segment(s).await?;
                let fd = file
                    .shared_fd()?
                    .expect("the group-commit thread runs on real files");
                gc.add_segment(s, fd);
                self.group_commit_segs.set(Some(s));
                s += self.seg_bytes;
            }
            self.publish(gc, Handoff::Wake);
            if let Some((pos, e)) = gc.take_error() {
                let seg = self.segment_start(self.flushed.get());
                return Err(Error::io("write+fdatasync", self.segment_path(seg), pos, e));
            }
            if self.stopping.get() && self.flushed.get() == self.written.get() {
                return Ok(());
            }
            // Woken by an append that needs a segment ahead (puts and replica
            // appends both publish through `wake_sync_writer`), a stop, or the
            // thread's next round. The 10 ms timer is a safety net for
            // a lost cross-thread wake, only while bytes wait to be made durable: an
            // idle shard's writer sleeps (it woke 100 times a second).
            let seen = self.flushed.get();
            let woken = futures_lite::future::or(self.writer_wake.wait(), gc.progress(seen));
            if seen < self.written.get() {
                futures_lite::future::or(woken, glommio::timer::sleep(SAFETY_TICK)).await;
            } else {
                woken.await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    /// A publish that leads runs the round on the calling thread: the bytes are in the
    /// file and the durable position is the published one when it returns, without
    /// the thread. A later `Wake` publish hands the next bytes to the thread.
    #[test]
    fn a_leading_publish_makes_the_bytes_durable_before_it_returns() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("segment");
        let layout = Layout {
            seg_bytes: 1 << 20,
            buf_bytes: 64 << 10,
        };
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        file.set_len(layout.seg_bytes).unwrap();
        let mut buf = AlignedBuf::new(layout.buf_bytes as usize);
        buf.set_len(layout.buf_bytes as usize);
        for (i, b) in buf.as_mut_slice().iter_mut().enumerate() {
            *b = (i % 251) as u8 + 1;
        }
        let ptr = buf.as_slice().as_ptr();
        let gc = GroupCommit::start(layout, 0, 0).unwrap();
        gc.add_segment(0, Arc::new(OwnedFd::from(file.try_clone().unwrap())));
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !gc.thread_waits() {
            assert!(
                std::time::Instant::now() < deadline,
                "the thread never waited"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        let (flushed, ts) = gc.publish(5000, 7, |_| ptr, Handoff::Lead);
        assert_eq!(
            (flushed, ts),
            (5000, 7),
            "durable when the leading publish returns"
        );
        assert!(gc.thread_waits(), "the thread was not woken");
        let mut back = vec![0u8; 12288];
        file.read_exact_at(&mut back, 0).unwrap();
        assert_eq!(&back[..5000], &buf.as_slice()[..5000]);
        assert!(
            back[5000..].iter().all(|&b| b == 0),
            "the page's rest padded"
        );
        // Handed to the thread instead: it gets there too.
        gc.publish(9000, 8, |_| ptr, Handoff::Wake);
        loop {
            if gc.publish(9000, 8, |_| ptr, Handoff::Wake).0 == 9000 {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the thread never wrote"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        file.read_exact_at(&mut back, 0).unwrap();
        assert_eq!(&back[..9000], &buf.as_slice()[..9000]);
        assert!(!gc.failed());
        drop(gc);
    }
}
