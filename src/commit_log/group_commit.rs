//! The sync-flush group-commit thread: RocketMQ's `GroupCommitService`, with direct
//! I/O instead of an mmap `force()`.
//!
//! One thread per shard makes the log durable as fast as the disk allows: it takes
//! everything appended so far, writes it with one `pwritev2(RWF_DSYNC)` straight
//! from the shard's write windows (no copy; only the partial last page is copied, to
//! pad it with zeros), publishes the new flushed offset, wakes the shard, and starts
//! the next round at once with whatever was appended meanwhile. The shard never
//! schedules a round: it publishes `written` after each append and reads `flushed`
//! back.
//!
//! Why a thread that takes the rounds itself (measured 2026-12-03 on this 2-CPU VM,
//! `coremq bench --flush sync --body 1024 --queues 64 --outstanding 256 --shards 1`,
//! with temporary per-round timing): when the shard's writer task started each round,
//! rounds went lock-step with the CPU. After a round's acknowledgements every
//! producer re-put before the writer task ran again (a local wake does not preempt
//! the running task queue), so a round of all 256 puts was followed by ~700-850 us of
//! encoding with the disk idle, then ~550-650 us of I/O with the CPU idle: ~120,000
//! msg/s. Letting the first put after a round yield to the writer made rounds
//! alternate between one put and all the others (the small round's completion waited
//! ~200 us for the busy executor): no better. Here rounds run back to back (the
//! thread's idle time between rounds: p50 1-2 us).
//!
//! What it took besides (same instrumentation):
//! * The per-put traffic (`written` out, `flushed` back) goes through atomics. Under
//!   one mutex the shard made ~940 futex calls a second, and puts waited 1.5 ms
//!   (p50) from publishing to their acknowledgement while rounds took ~0.3 ms.
//! * Puts pick up finished rounds themselves ([`Flusher::publish`] returns the
//!   durable position): the writer task, woken by the thread, ran only when the busy
//!   producers' task queue yielded, ~760 us apart while rounds ended ~330 us apart.
//! * Gathering (see `run`): rounds alternated between a few puts and nearly all of
//!   them, and the shard sat idle during the big ones. Four interleaved pairs, 2
//!   shards x 128 outstanding: 189-224 k msg/s without, 204-245 k with.
//!
//! Where it stands: the old and new paths interleaved (`README.md`, "Measured") are
//! within this machine's run-to-run noise at 2 shards, ahead at 1 shard. Raising
//! this thread's priority (`nice -15`) cut its write time's p90 from ~1.1 ms to
//! ~0.4 ms but not the put rate; not kept.
//!
//! What bounds 2 shards x 256 outstanding (measured 2026-12-03, second session,
//! `coremq bench --flush sync --body 1024 --queues 64`, 4 s runs interleaved, with
//! temporary per-round counters): the round trip, not the CPU alone. Each thread
//! spent ~80% of its time in `pwritev2` (rounds of 80-150 KB, p50 0.27-0.58 ms, p90
//! ~1 ms), ~10% gathering and ~5-10% parked; a put waits on average for the rest of
//! the round in flight and then its own (p50 ~1.1 ms). More outstanding puts make
//! bigger rounds for the same round trips: 512 per shard gave 376-382 k msg/s, 1024
//! gave 369-511 k (256: ~285 k in the same minutes), at less CPU per message (4.2
//! and 3.4 us against 5.2). Tried on top and dropped:
//! * two rounds in flight per shard (two threads; rounds of whole pages so they
//!   never share a page, a padded round alone): 6-8 interleaved pairs, 207-286 k
//!   against 272-329 k msg/s with one, and +0.7 us CPU per message: the rounds got
//!   smaller and more numerous (futex calls 14 k/s against 0.75 k/s, twice the
//!   context switches), and fio shows why the disk gives little back: 2 x 128 KiB
//!   `O_DSYNC` writers 690 MB/s, 4 x 64 KiB 423-617 MB/s. Whole-page rounds with
//!   one thread (the partial page left to the next round instead of rewritten):
//!   298.9 k against 297.3 k msg/s over 8 pairs, no change.
//! * waiting for the round by polling `flushed` from the writer task instead of
//!   parking the executor (saves the wake-up and glommio's `membarrier` per sleep):
//!   184-236 k against 177-288 k msg/s, with or without `sched_yield` in the loop:
//!   the spinning shards take the CPUs these threads and the interrupts need.
//! * prewrite off (`--prewrite-mib 0`), 6 pairs: 277 k against 286 k msg/s, more
//!   CPU per message; p99 a little lower.
//! * for a lone put (1 outstanding, 1 shard), spinning 50 or 150 us on `written`
//!   before parking: put p50 323-344 us without, 397-463 us with (4 interleaved
//!   runs each): the spinning thread takes a CPU the shard's wake-up needs.
//! * the thread runs on its shard's CPU (it inherits the shard thread's
//!   affinity). Allowed both CPUs, or only the other one: 2 x 256 outstanding
//!   361 k against 366 k msg/s over 5 pairs (no change); a lone put p50 310-468 and
//!   326-560 us against 288-365 us (4 interleaved runs): a wake-up on the same CPU
//!   is the cheaper one.
//!
//! What did help was CPU per put on the shard: the load generator's message reuse
//! (`loadgen` module docs), 297 k -> 318 k msg/s over 6 pairs.
//!
//! Sharing the windows with this thread is safe because of what the shard
//! guarantees: bytes below the published `written` are never modified again, and a
//! window's buffer is recycled only after `flushed` (as read back from here) has
//! passed its end, so no round in flight reads it. The thread only ever reads window
//! memory, and only below `written`; the shard only writes at or past `written`.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, VecDeque};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::{Poll, Waker};
use std::time::Duration;

use crate::io::{AlignedBuf, PAGE, align_down, align_up, pwritev_dsync};

/// The longest a round waits to gather more puts (see `run`).
const GATHER_MAX: Duration = Duration::from_micros(250);

/// A window's memory as the thread sees it (the shard owns it; see the module docs).
#[derive(Clone, Copy)]
struct WinPtr(*const u8);
// SAFETY: only read by the thread, below `written`, while the shard keeps the buffer
// alive and unmodified there (module docs).
unsafe impl Send for WinPtr {}

/// What changes rarely (new windows and segments) and the parking handshake.
#[derive(Default)]
struct State {
    /// Window index -> memory (entries below `flushed`'s window may be stale).
    windows: BTreeMap<u64, WinPtr>,
    /// Segment start -> descriptor.
    segments: BTreeMap<u64, Arc<OwnedFd>>,
    /// A range being zero-filled ahead of the log: rounds must not reach into it.
    prewrite: Option<(u64, u64)>,
    /// The failed round's file position and error; the thread has stopped.
    error: Option<(u64, std::io::Error)>,
    stop: bool,
    /// The shard's writer task, woken after each round.
    waker: Option<Waker>,
}

/// The per-put traffic goes through atomics: the shard publishes `written` after
/// every put and reads `flushed` back. (With both under one mutex the shard blocked
/// on it while the thread held it across its wake-ups: ~940 futex calls a second,
/// the shard idle half the time with puts waiting 1.5 ms for rounds of 0.3 ms.)
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
}

/// Geometry of the log the thread writes.
#[derive(Clone, Copy)]
pub struct Layout {
    pub seg_bytes: u64,
    pub win_bytes: u64,
}

/// The shard's handle on its group-commit thread.
pub struct Flusher {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
    win_bytes: u64,
    /// Highest window index registered.
    last_window: Cell<Option<u64>>,
    /// Published positions not yet known durable, with the store timestamp of the
    /// record ending there: a round always ends at one of them or at a segment's
    /// end, so the stamp of what is durable is exact.
    stamps: RefCell<VecDeque<(u64, i64)>>,
    flushed_ts: Cell<i64>,
}

impl Flusher {
    /// Starts the thread; the log is durable up to `flushed` (stamped `flushed_ts`).
    pub fn start(layout: Layout, flushed: u64, flushed_ts: i64) -> std::io::Result<Flusher> {
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
        Ok(Flusher {
            shared,
            thread: Some(thread),
            win_bytes: layout.win_bytes,
            last_window: Cell::new(None),
            stamps: RefCell::new(VecDeque::new()),
            flushed_ts: Cell::new(flushed_ts),
        })
    }

    /// Publishes `written` (every byte below it final; `ts` is the store timestamp
    /// of the record ending there) and the memory of the windows up to it (`window`
    /// maps a window index to its buffer), waking the thread if it waits for work.
    /// Returns how far the log is durable as of now (offset, store timestamp), so a
    /// busy shard learns of finished rounds without being woken.
    pub fn publish(&self, written: u64, ts: i64, window: impl Fn(u64) -> *const u8) -> (u64, i64) {
        let sh = &*self.shared;
        let win_bytes = self.win_bytes;
        let mut stamps = self.stamps.borrow_mut();
        let published = stamps
            .back()
            .map_or(sh.written.load(Ordering::Relaxed), |s| s.0);
        if written > published {
            let last = (written - 1) / win_bytes;
            let first = match self.last_window.get() {
                Some(l) if l >= last => None,
                Some(l) => Some(l + 1),
                None => Some(published / win_bytes),
            };
            if let Some(first) = first {
                let mut st = sh.lock();
                for idx in first..=last {
                    st.windows.insert(idx, WinPtr(window(idx)));
                }
                // Windows wholly below the flushed position are never read again.
                let keep = sh.flushed.load(Ordering::Acquire) / win_bytes;
                st.windows = st.windows.split_off(&keep);
                self.last_window.set(Some(last));
            }
            stamps.push_back((written, ts));
            sh.written.store(written, Ordering::SeqCst);
            // Only the first publish after the thread parked notifies: until the
            // thread ran again, every later one made a futex call of its own and took
            // the lock the waking thread wanted (~1,700 futex calls a second per shard
            // at 256 outstanding; 350-680 with the swap; the put rate within noise).
            if sh.parked.swap(false, Ordering::SeqCst) {
                let _st = sh.lock();
                sh.wake.notify_one();
            }
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

    /// Registers the segment starting at `start` (its file exists at full size).
    pub fn add_segment(&self, start: u64, fd: Arc<OwnedFd>) {
        let mut st = self.shared.lock();
        st.segments.insert(start, fd);
        self.shared.wake.notify_one();
    }

    /// Sets (or clears) the range being zero-filled ahead of the log (at or past
    /// the page of `written` when set): no round reaches into it while it is set.
    pub fn set_prewrite(&self, range: Option<(u64, u64)>) {
        let mut st = self.shared.lock();
        st.prewrite = range;
        self.shared.wake.notify_one();
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

impl Drop for Flusher {
    /// Stops the thread after the round in flight (the shard stops it only once
    /// everything is flushed, or after a failure) and waits for it, so no round
    /// reads a window after the shard freed it.
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
    /// Whole pages straight from the windows.
    parts: Vec<(WinPtr, usize)>,
    /// Bytes of the partial last page (the rest of the page is written as zeros).
    tail: usize,
    tail_src: Option<WinPtr>,
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
        let idx = pos / layout.win_bytes;
        let off = pos % layout.win_bytes;
        let n = (whole_end - pos).min(layout.win_bytes - off);
        let base = st.windows.get(&idx)?;
        // SAFETY: inside the window's buffer (off + n <= win_bytes).
        parts.push((WinPtr(unsafe { base.0.add(off as usize) }), n as usize));
        pos += n;
    }
    let tail = (target - whole_end) as usize;
    let tail_src = if tail > 0 {
        let base = st.windows.get(&(whole_end / layout.win_bytes))?;
        // SAFETY: a page inside the window's buffer.
        Some(WinPtr(unsafe {
            base.0.add((whole_end % layout.win_bytes) as usize)
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
                if let Some(r) = plan(&st, start, written, layout) {
                    break r;
                }
                // Park; `publish` notifies (under the lock) if it finds `parked` set
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
            match result {
                Ok(()) => sh.flushed.store(round.target, Ordering::Release),
                Err(e) => {
                    st.error = Some((round.file_pos, e));
                    sh.failed.store(true, Ordering::Release);
                    st.stop = true;
                }
            }
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
        // SAFETY: below `written`, in a live window (module docs).
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
