//! `--via handle`: producers on plain OS threads outside the shards, putting through
//! the `Send + Sync` [`Handle`] as an embedder's own threads do.
//!
//! Each thread drives its `--outstanding` lanes with a small executor of its own
//! ([`block_on_lanes`]): one waker per lane, so a put's reply polls that lane alone
//! (polling every lane on each wake-up, as a plain `join_all` does, would cost
//! `outstanding` polls per put), a timer heap for `--rate` pacing, and `thread::park`
//! when nothing is ready. The thread is not pinned: the scheduler places it among the
//! shards' CPUs, as it would an application's thread.

use super::measure::now_ns;
use super::plan::Plan;
use super::produce::{LaneStats, Produced, Producer, PutPath, lane};
use crate::{Handle, Message, PutStatus};
use std::cell::RefCell;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::Thread;
use std::time::Duration;

/// Puts through the handle; it takes the messages by value, so the lane builds new
/// ones for every put (allocations an embedder pays too).
struct HandlePuts(Handle);

impl PutPath for HandlePuts {
    async fn put(&self, msgs: &mut Vec<Message>) -> PutStatus {
        if msgs.len() == 1 {
            let m = msgs.pop().expect("one message");
            return self.0.put(m).await.status;
        }
        let results = self.0.put_batch(std::mem::take(msgs)).await;
        results
            .iter()
            .map(|r| r.status)
            .find(|s| !s.is_stored())
            .unwrap_or(PutStatus::PutOk)
    }

    async fn sleep_until(&self, ns: u64) {
        Sleep { until: ns }.await
    }

    async fn after_put(&self) {}
}

/// Starts one thread per outside producer of `plan`; each returns what it measured.
/// The last one to finish marks every shard produced.
pub(super) fn spawn_producers(
    plan: &Arc<Plan>,
    handle: &Handle,
) -> Result<Vec<std::thread::JoinHandle<Produced>>, String> {
    let outside = (0..plan.producers.len()).filter(|&g| plan.producers[g].shard.is_none());
    let mut threads = Vec::new();
    for g in outside {
        let (plan, handle) = (plan.clone(), handle.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("producer-{g}"))
            .spawn(move || {
                let produced = produce(&plan, g, handle);
                if plan.outside_left.fetch_sub(1, Ordering::AcqRel) == 1 {
                    (0..plan.shards).for_each(|s| plan.mark_produced(s));
                }
                produced
            });
        threads.push(spawned.map_err(|e| format!("cannot start producer thread {g}: {e}"))?);
    }
    Ok(threads)
}

/// Producer `g`'s lanes on this thread.
fn produce(plan: &Arc<Plan>, g: usize, handle: Handle) -> Produced {
    let start_ns = now_ns();
    let stats = LaneStats::new();
    let producer = Producer::new(plan, g, start_ns, &stats);
    let path = Rc::new(HandlePuts(handle));
    let lanes = (0..plan.cfg.outstanding)
        .map(|l| lane(producer.clone(), path.clone(), l as u64))
        .collect();
    let ends = block_on_lanes(lanes);
    stats.finish(start_ns, ends)
}

/// Lanes ready to be polled, filled by their wakers from any thread.
struct ReadyLanes {
    queue: Mutex<Vec<usize>>,
    thread: Thread,
}

struct LaneWaker {
    lane: usize,
    /// In `ready.queue` already: a second wake-up before the poll adds nothing.
    queued: AtomicBool,
    ready: Arc<ReadyLanes>,
}

impl Wake for LaneWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if !self.queued.swap(true, Ordering::AcqRel) {
            let mut q = self.ready.queue.lock().unwrap_or_else(|e| e.into_inner());
            q.push(self.lane);
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

/// Resolves once [`now_ns`] reaches `until` (inside [`block_on_lanes`] only).
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

/// Runs `lanes` to completion on this thread; their results in order.
fn block_on_lanes<F: Future>(lanes: Vec<F>) -> Vec<F::Output> {
    let n = lanes.len();
    let ready = Arc::new(ReadyLanes {
        queue: Mutex::new((0..n).collect()),
        thread: std::thread::current(),
    });
    let wakers: Vec<Arc<LaneWaker>> = (0..n)
        .map(|lane| {
            Arc::new(LaneWaker {
                lane,
                queued: AtomicBool::new(true),
                ready: ready.clone(),
            })
        })
        .collect();
    let handles: Vec<Waker> = wakers.iter().map(|w| Waker::from(w.clone())).collect();
    let mut lanes: Vec<Pin<Box<F>>> = lanes.into_iter().map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = (0..n).map(|_| None).collect();
    let mut left = n;
    while left > 0 {
        let batch = std::mem::take(&mut *ready.queue.lock().unwrap_or_else(|e| e.into_inner()));
        for i in batch {
            wakers[i].queued.store(false, Ordering::Release);
            if out[i].is_some() {
                continue;
            }
            if let Poll::Ready(v) = lanes[i]
                .as_mut()
                .poll(&mut Context::from_waker(&handles[i]))
            {
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
        if left > 0 && idle {
            match next_timer {
                Some(at) => std::thread::park_timeout(Duration::from_nanos(at - now_ns().min(at))),
                None => std::thread::park(),
            }
        }
    }
    out.into_iter()
        .map(|v| v.expect("every lane finished"))
        .collect()
}

/// Wakes the lanes whose timers are due; when the next one is due.
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

    #[test]
    fn lanes_finish_with_cross_thread_wakes_and_timers() {
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
                    Sleep {
                        until: start + l * 2_000_000,
                    }
                    .await;
                    let mut sum = 0;
                    for _ in 0..8 {
                        sum += rx.recv_async().await.unwrap();
                    }
                    (l, sum, now_ns() - start)
                }
            })
            .collect();
        let out = block_on_lanes(lanes);
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
