//! Tiny single-threaded wake-up primitives for tasks on one shard executor, and the
//! executor heartbeat that keeps glommio from sleeping with runnable tasks. Nothing
//! here is `Send`: a shard's state is only ever touched by its own thread.
//!
//! # Executor heartbeat: what hung and why
//!
//! Under load (load average 7-13 on 2 CPUs) stores hung for good with the executor
//! thread parked in `io_cqring_wait`: about 3 in 20 `coremq bench --mode catch-up`
//! runs inside `Store::open`, and a 10M-key `coremq bench` whose dispatcher stopped
//! with 240 MB to go at shutdown. Nothing in our wake-ups was lost: the tasks had been
//! woken and were runnable. glommio 0.9 (the latest release) put the executor to sleep
//! with them still queued. Its loop is: poll I/O and arm the preemption timer, run
//! the task queues, and park when they ran nothing. But `run_task_queues` checks for
//! preemption *before* running the first queue and then reports "ran nothing" exactly
//! as if no queue was active, so when the thread lost the CPU for longer than the
//! preemption timer between arming it and that first check (5 ms under `coremq bench`,
//! 1 ms with a sync-flush store's `Latency::Matters` writer, easily exceeded on a
//! loaded machine), the executor parked with runnable tasks. It then sleeps until an
//! I/O completion, a timer or a wake from another thread comes. While a store runs,
//! its background tasks' timers end such a stall within 100 ms to 1 s; during an open
//! (and at the end of a shutdown) nothing is pending between two steps, so it never
//! woke. The glommio fix (do not park after a preemption that ran nothing) is not in
//! any release.
//!
//! [`heartbeat`] bounds it from our side: a thread wakes a task of the executor every
//! [`HEARTBEAT`], which ends any sleep of the executor, and the next loop runs the
//! stranded tasks: an unlucky preemption now costs about one heartbeat. (Glommio
//! timers are not enough: a fired timer is re-armed only when its task runs, and that
//! task can be the one stranded: with one timer 2 of 3 runs of the test below still
//! hung, with four kept registered 1 of 6 under extra load.) `Store::open` starts one
//! before its first I/O and the store keeps it until its last task ends. Idle, it
//! costs one wake per [`HEARTBEAT`] and a sleeping thread per store.
//!
//! `tests/liveness.rs` deschedules the executor thread at such moments on purpose (a
//! SCHED_FIFO thread on its CPU takes it for 3 ms, longer than its 1 ms preemption
//! timer, shortly after it used some CPU): without the heartbeat the first open or
//! shutdown hung in 8 of 8 runs, after 29-133 bursts; with it, 6 of 6 runs did their
//! 30 open/shutdown cycles (3 of them with an extra CPU hog).

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

/// The longest an executor can sleep with runnable tasks while a [`Heartbeat`] lives
/// (see the module docs).
pub const HEARTBEAT: Duration = Duration::from_millis(10);

/// What a [`Heartbeat`]'s task and its thread share.
#[derive(Default)]
struct Beat {
    stop: std::sync::atomic::AtomicBool,
    /// The waker of the heartbeat task, woken from the thread.
    waker: std::sync::Mutex<Option<Waker>>,
}

impl Beat {
    fn waker(&self) -> std::sync::MutexGuard<'_, Option<Waker>> {
        self.waker.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Wakes the current glommio executor every [`HEARTBEAT`] while it lives (see the
/// module docs); dropping it ends its task and its thread.
pub struct Heartbeat {
    beat: std::sync::Arc<Beat>,
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.beat
            .stop
            .store(true, std::sync::atomic::Ordering::SeqCst);
        // The task ends when it sees `stop`; this also drops the waker it left (a
        // reference to itself).
        if let Some(w) = self.beat.waker().take() {
            w.wake();
        }
    }
}

/// Starts a [`Heartbeat`] on the current executor (see the module docs for why).
///
/// A thread wakes a parked task of this executor every [`HEARTBEAT`]: a wake from
/// another thread always ends the executor's sleep (glommio writes its eventfd) and
/// needs nothing from the executor to be armed again. (A first version kept glommio
/// timers registered from a task; a fired timer is gone until its task runs again,
/// and that task can be stranded like any other: `tests/liveness.rs` still hung with
/// it, about 1 run in 5 under extra load.)
pub fn heartbeat() -> Heartbeat {
    use std::sync::atomic::Ordering::SeqCst;
    let beat = std::sync::Arc::new(Beat::default());
    let task = beat.clone();
    glommio::spawn_local(std::future::poll_fn(move |cx| {
        if task.stop.load(SeqCst) {
            task.waker().take();
            return Poll::Ready(());
        }
        *task.waker() = Some(cx.waker().clone());
        Poll::Pending
    }))
    .detach();
    let ticker = beat.clone();
    let spawned = std::thread::Builder::new()
        .name("coremq-heartbeat".into())
        .spawn(move || {
            while !ticker.stop.load(SeqCst) {
                std::thread::sleep(HEARTBEAT);
                if let Some(w) = ticker.waker().as_ref() {
                    w.wake_by_ref();
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "no heartbeat thread: the executor may stall under load");
    }
    Heartbeat { beat }
}

/// Wakes one background task (the writer, the dispatcher). A notification that
/// arrives while the task is busy is remembered, so none is lost.
#[derive(Default)]
pub struct Notify {
    pending: Cell<bool>,
    waker: RefCell<Option<Waker>>,
}

impl Notify {
    pub fn notify(&self) {
        self.pending.set(true);
        if let Some(w) = self.waker.borrow_mut().take() {
            w.wake();
        }
    }

    /// Completes once `notify` has been called since the last completion.
    pub fn wait(&self) -> impl Future<Output = ()> + '_ {
        std::future::poll_fn(move |cx| {
            if self.pending.replace(false) {
                Poll::Ready(())
            } else {
                *self.waker.borrow_mut() = Some(cx.waker().clone());
                Poll::Pending
            }
        })
    }
}

/// A monotonically increasing offset that many tasks can wait on ("flushed is at
/// least X"). Closing it releases every waiter with an error.
#[derive(Default)]
pub struct OffsetWatch {
    value: Cell<u64>,
    closed: Cell<bool>,
    /// (target, waiter id, waker) of every pending [`WaitFor`].
    waiters: RefCell<Vec<(u64, u64, Waker)>>,
    next_id: Cell<u64>,
}

impl OffsetWatch {
    pub fn new(v: u64) -> OffsetWatch {
        OffsetWatch {
            value: Cell::new(v),
            ..Default::default()
        }
    }

    pub fn get(&self) -> u64 {
        self.value.get()
    }

    pub fn set(&self, v: u64) {
        debug_assert!(v >= self.value.get(), "offset watch went backwards");
        self.value.set(v);
        let mut ws = self.waiters.borrow_mut();
        let mut i = 0;
        while i < ws.len() {
            if ws[i].0 <= v {
                ws.swap_remove(i).2.wake();
            } else {
                i += 1;
            }
        }
    }

    /// Wakes every waiter; their futures resolve to `false` from now on.
    pub fn close(&self) {
        self.closed.set(true);
        for (_, _, w) in self.waiters.borrow_mut().drain(..) {
            w.wake();
        }
    }

    pub fn is_closed(&self) -> bool {
        self.closed.get()
    }

    /// Resolves to `true` once the value reaches `target`, `false` if closed first.
    pub fn wait_for(&self, target: u64) -> WaitFor<'_> {
        WaitFor {
            watch: self,
            target,
            id: None,
        }
    }
}

/// One entry per pending future, removed when the value passes its target or when
/// the future is dropped first: a task that waits again and again (the dispatcher
/// selects on `flushed` after every wake-up) cannot pile up wakers. (It once did,
/// and overflowed glommio's 16-bit waker count under paced load.) The first poll
/// pushes without looking for an older entry: with a few hundred puts waiting on
/// `flushed` in sync mode, a search on every poll was a scan per put.
pub struct WaitFor<'a> {
    watch: &'a OffsetWatch,
    target: u64,
    /// Set while an entry is registered.
    id: Option<u64>,
}

impl Future for WaitFor<'_> {
    type Output = bool;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<bool> {
        let watch = self.watch;
        if watch.value.get() >= self.target {
            self.id = None;
            return Poll::Ready(true);
        }
        if watch.closed.get() {
            self.id = None;
            return Poll::Ready(false);
        }
        let mut ws = watch.waiters.borrow_mut();
        if let Some(id) = self.id {
            // Polled again before the value got there: refresh the waker (the entry
            // may be gone if `set` woke us for a lower target of this task).
            if let Some(e) = ws.iter_mut().find(|e| e.1 == id) {
                if !e.2.will_wake(cx.waker()) {
                    e.2 = cx.waker().clone();
                }
                return Poll::Pending;
            }
        }
        let id = watch.next_id.get();
        watch.next_id.set(id + 1);
        ws.push((self.target, id, cx.waker().clone()));
        self.id = Some(id);
        Poll::Pending
    }
}

impl Drop for WaitFor<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id
            && let Ok(mut ws) = self.watch.waiters.try_borrow_mut()
            && let Some(i) = ws.iter().position(|e| e.1 == id)
        {
            ws.swap_remove(i);
        }
    }
}

/// Polls every future to completion, concurrently, on the current task; results in
/// input order. (No executor-specific spawning: works for `Send` and `!Send` futures.)
pub async fn join_all<F: Future>(futs: Vec<F>) -> Vec<F::Output> {
    let mut futs: Vec<Pin<Box<F>>> = futs.into_iter().map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = futs.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut done = true;
        for (f, slot) in futs.iter_mut().zip(out.iter_mut()) {
            if slot.is_none() {
                match f.as_mut().poll(cx) {
                    Poll::Ready(v) => *slot = Some(v),
                    Poll::Pending => done = false,
                }
            }
        }
        if done { Poll::Ready(()) } else { Poll::Pending }
    })
    .await;
    out.into_iter()
        .map(|v| v.expect("every future completed"))
        .collect()
}
