//! A small executor for plain threads: runs a set of futures to completion on the
//! calling thread, for the `--via handle` producers and for waiting on every shard's
//! `run_on` job.
//!
//! One waker per future, so a wake-up polls that future alone (a plain `join_all`
//! polls every future on each wake-up: with 256 lanes, 256 polls per put); a timer
//! heap for [`sleep_until`]; `thread::park` when nothing is ready, after spinning
//! briefly when a reply is expected soon (`shard::wait`, as `coremq::block_on`).

use super::measure::now_ns;
use std::cell::RefCell;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::Thread;
use std::time::Duration;

/// Futures ready to be polled, filled by their wakers from any thread.
struct Ready {
    queue: Mutex<Vec<usize>>,
    thread: Thread,
}

struct TaskWaker {
    task: usize,
    /// In `ready.queue` already: a second wake-up before the poll adds nothing.
    queued: AtomicBool,
    ready: Arc<Ready>,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if !self.queued.swap(true, Ordering::AcqRel) {
            let mut q = self.ready.queue.lock().unwrap_or_else(|e| e.into_inner());
            q.push(self.task);
            drop(q);
            self.ready.thread.unpark();
        }
    }
}

/// A timer of this thread's executor: when it fires, and whom it wakes.
struct Timer(u64, Waker);

impl PartialEq for Timer {
    fn eq(&self, other: &Timer) -> bool {
        self.0 == other.0
    }
}
impl Eq for Timer {}
impl PartialOrd for Timer {
    fn partial_cmp(&self, other: &Timer) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Timer {
    fn cmp(&self, other: &Timer) -> std::cmp::Ordering {
        self.0.cmp(&other.0)
    }
}

thread_local! {
    /// The timers of the executor running on this thread, soonest first.
    static TIMERS: RefCell<BinaryHeap<Reverse<Timer>>> = const { RefCell::new(BinaryHeap::new()) };
}

/// Resolves once [`now_ns`] reaches `ns`; only inside [`block_on_all`].
pub(super) fn sleep_until(ns: u64) -> impl Future<Output = ()> {
    Sleep { until: ns }
}

struct Sleep {
    until: u64,
}

impl Future for Sleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if now_ns() >= self.until {
            return Poll::Ready(());
        }
        let timer = Timer(self.until, cx.waker().clone());
        TIMERS.with(|t| t.borrow_mut().push(Reverse(timer)));
        Poll::Pending
    }
}

/// Runs `futs` to completion on this thread; their results in order.
pub(super) fn block_on_all<F: Future>(futs: Vec<F>) -> Vec<F::Output> {
    let n = futs.len();
    let ready = Arc::new(Ready {
        queue: Mutex::new((0..n).collect()),
        thread: std::thread::current(),
    });
    let wakers: Vec<Arc<TaskWaker>> = (0..n)
        .map(|task| {
            Arc::new(TaskWaker {
                task,
                queued: AtomicBool::new(true),
                ready: ready.clone(),
            })
        })
        .collect();
    let handles: Vec<Waker> = wakers.iter().map(|w| Waker::from(w.clone())).collect();
    let mut futs: Vec<Pin<Box<F>>> = futs.into_iter().map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = (0..n).map(|_| None).collect();
    let mut left = n;
    while left > 0 {
        crate::shard::wait::clear_spin_hint();
        let batch = std::mem::take(&mut *ready.queue.lock().unwrap_or_else(|e| e.into_inner()));
        for i in batch {
            wakers[i].queued.store(false, Ordering::Release);
            if out[i].is_some() {
                continue;
            }
            if let Poll::Ready(v) = futs[i].as_mut().poll(&mut Context::from_waker(&handles[i])) {
                out[i] = Some(v);
                left -= 1;
            }
        }
        let next_timer = fire_timers();
        let idle = ready
            .queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty();
        // A lane's reply expected soon (one request in flight, fast replies): spin
        // for it as `coremq::block_on` does instead of paying this thread's wake-up.
        let woken = || {
            !ready
                .queue
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_empty()
        };
        if left > 0
            && idle
            && next_timer.is_none_or(|at| at > now_ns())
            && !crate::shard::wait::spin_before_park(woken)
        {
            match next_timer {
                Some(at) => std::thread::park_timeout(Duration::from_nanos(at - now_ns().min(at))),
                None => std::thread::park(),
            }
        }
    }
    out.into_iter()
        .map(|v| v.expect("every future finished"))
        .collect()
}

/// Wakes the futures whose timers are due; when the next one is due.
fn fire_timers() -> Option<u64> {
    TIMERS.with(|t| {
        let mut t = t.borrow_mut();
        let now = now_ns();
        while t.peek().is_some_and(|Reverse(timer)| timer.0 <= now) {
            let Reverse(Timer(_, waker)) = t.pop().expect("peeked");
            waker.wake();
        }
        t.peek().map(|Reverse(timer)| timer.0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::rc::Rc;

    #[test]
    fn futures_finish_with_cross_thread_wakes_and_timers() {
        let (tx, rx) = flume::bounded::<u64>(64);
        let sender = std::thread::spawn(move || {
            for i in 0..32 {
                tx.send(i).unwrap();
            }
        });
        let rx = Rc::new(rx);
        let start = now_ns();
        let lanes: Vec<_> = (0..4u64)
            .map(|l| {
                let rx = rx.clone();
                async move {
                    sleep_until(start + l * 2_000_000).await;
                    let mut sum = 0;
                    for _ in 0..8 {
                        sum += rx.recv_async().await.unwrap();
                    }
                    (l, sum, now_ns() - start)
                }
            })
            .collect();
        let out = block_on_all(lanes);
        sender.join().unwrap();
        assert_eq!(
            out.iter().map(|(_, s, _)| s).sum::<u64>(),
            (0..32u64).sum::<u64>()
        );
        for (l, _, took) in out {
            assert!(took >= l * 2_000_000, "lane {l} woke before its timer");
        }
    }
}
