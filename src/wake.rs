//! The shard's single-thread wake-up primitives:
//! * [`Notify`] wakes one background task (the writer, the dispatcher); a notification
//!   that arrives while the task is busy is remembered, so none is lost;
//! * [`OffsetWatch`] is a growing offset many tasks wait on ("flushed is at least X"),
//!   with deadlines its owner expires in batches instead of a timer per wait: the
//!   CommitLog's `committed` and `flushed` positions;
//! * [`Deadline`] is when a put must have answered, read from the clock only if the
//!   put has to wait;
//! * [`join_all`] polls futures concurrently on the current task.
//!
//! Nothing here is `Send`: a shard's state is only ever touched by its own thread.
//! (An executor heartbeat thread lived here while glommio 0.9.0 could park with
//! runnable tasks; the vendored glommio fixes that at its source and bounds every park
//! to `MAX_PARK` (100 ms): `vendor/glommio/COREMQ-PATCHES.md`.)

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

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
    /// Every pending [`WaitFor`].
    waiters: RefCell<Vec<Waiter>>,
    next_id: Cell<u64>,
    /// Told when a wait with a deadline registers (the owner's expiry ticker sleeps
    /// until then instead of ticking while nothing can expire).
    deadline_hook: RefCell<Option<Rc<Notify>>>,
}

struct Waiter {
    target: u64,
    id: u64,
    waker: Waker,
    deadline: Option<Instant>,
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
        self.wake_where(|w| w.target <= v);
    }

    /// Wakes (and forgets) every waiter `f` picks.
    fn wake_where(&self, f: impl Fn(&Waiter) -> bool) {
        let mut ws = self.waiters.borrow_mut();
        let mut i = 0;
        while i < ws.len() {
            if f(&ws[i]) {
                ws.swap_remove(i).waker.wake();
            } else {
                i += 1;
            }
        }
    }

    /// Wakes every waiter; their futures resolve to `false` from now on.
    pub fn close(&self) {
        self.closed.set(true);
        for w in self.waiters.borrow_mut().drain(..) {
            w.waker.wake();
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
            deadline: None,
        }
    }

    /// [`OffsetWatch::wait_for`] with a deadline: `None` once `deadline` passed first.
    /// No timer per wait: the waiter is woken by [`OffsetWatch::expire`], which the
    /// owner calls periodically (a glommio timer per sync put was ~4% of a shard's
    /// CPU: a B-tree insert and remove each).
    pub fn wait_until(&self, target: u64, deadline: Instant) -> WaitUntil<'_> {
        WaitUntil(WaitFor {
            watch: self,
            target,
            id: None,
            deadline: Some(deadline),
        })
    }

    /// `hook` is notified whenever a wait with a deadline registers.
    pub fn on_deadline_wait(&self, hook: Rc<Notify>) {
        *self.deadline_hook.borrow_mut() = Some(hook);
    }

    /// Whether some pending wait has a deadline ([`OffsetWatch::expire`] has work).
    pub fn has_deadline_waits(&self) -> bool {
        self.waiters.borrow().iter().any(|w| w.deadline.is_some())
    }

    /// [`OffsetWatch::wait_until`] that also wakes itself at `deadline` with a timer of
    /// its own, not only through the owner's expiry: for the rare waits (a put finding
    /// no free write buffer or dispatch too far behind), so that their answer by the
    /// deadline depends on no other task. The common wait (a sync put's flush) keeps
    /// the timer-free form.
    pub async fn wait_until_timed(&self, target: u64, deadline: Instant) -> Option<bool> {
        let timer = async {
            glommio::timer::sleep(deadline.saturating_duration_since(Instant::now())).await;
            None
        };
        futures_lite::future::or(self.wait_until(target, deadline), timer).await
    }

    /// Wakes every waiter whose deadline is at or before `now`.
    pub fn expire(&self, now: Instant) {
        self.wake_where(|w| w.deadline.is_some_and(|d| d <= now));
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
    deadline: Option<Instant>,
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
            if let Some(e) = ws.iter_mut().find(|e| e.id == id) {
                if !e.waker.will_wake(cx.waker()) {
                    e.waker = cx.waker().clone();
                }
                return Poll::Pending;
            }
        }
        let id = watch.next_id.get();
        watch.next_id.set(id + 1);
        ws.push(Waiter {
            target: self.target,
            id,
            waker: cx.waker().clone(),
            deadline: self.deadline,
        });
        self.id = Some(id);
        if self.deadline.is_some()
            && let Some(hook) = &*watch.deadline_hook.borrow()
        {
            hook.notify();
        }
        Poll::Pending
    }
}

/// See [`OffsetWatch::wait_until`].
pub struct WaitUntil<'a>(WaitFor<'a>);

impl Future for WaitUntil<'_> {
    type Output = Option<bool>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<bool>> {
        if let Poll::Ready(reached) = Pin::new(&mut self.0).poll(cx) {
            return Poll::Ready(Some(reached));
        }
        if self.0.deadline.is_some_and(|d| Instant::now() >= d) {
            return Poll::Ready(None);
        }
        Poll::Pending
    }
}

impl Drop for WaitFor<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id
            && let Ok(mut ws) = self.watch.waiters.try_borrow_mut()
            && let Some(i) = ws.iter().position(|e| e.id == id)
        {
            ws.swap_remove(i);
        }
    }
}

/// When an operation must have answered: `timeout` after it started. Started at once
/// ([`Deadline::started_now`]) or at the first [`Deadline::at`]
/// ([`Deadline::lazy`]: for an operation that awaits nothing before it may first
/// wait, that is the same instant, and one that never waits never reads the clock).
pub struct Deadline {
    timeout: Duration,
    at: Cell<Option<Instant>>,
}

impl Deadline {
    pub fn started_now(timeout: Duration) -> Deadline {
        Deadline {
            timeout,
            at: Cell::new(Some(Instant::now() + timeout)),
        }
    }

    pub fn lazy(timeout: Duration) -> Deadline {
        Deadline {
            timeout,
            at: Cell::new(None),
        }
    }

    /// The deadline (the clock is read here the first time, for a lazy one).
    pub fn at(&self) -> Instant {
        match self.at.get() {
            Some(at) => at,
            None => {
                let at = Instant::now() + self.timeout;
                self.at.set(Some(at));
                at
            }
        }
    }

    /// Whether the deadline has passed.
    pub fn passed(&self) -> bool {
        Instant::now() >= self.at()
    }
}

/// Polls every future to completion, concurrently, on the current task; results in
/// input order. (No executor-specific spawning: works for `Send` and `!Send` futures.)
///
/// Each future has a waker of its own, and a wake-up polls only the futures woken
/// since the last poll. Polling all of them at every wake-up made the consume-queue
/// flush (16 queues at once, about five I/Os each) one of the long polls that delay a
/// shard's puts: at 40,000 paced puts a second on one shard, its turns over 100 us of
/// CPU went from 28-31 (6.8-8.8 ms) to 18-20 (3.8-4.4 ms) per 5 s run.
pub async fn join_all<F: Future>(futs: Vec<F>) -> Vec<F::Output> {
    let n = futs.len();
    let mut futs: Vec<Pin<Box<F>>> = futs.into_iter().map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = futs.iter().map(|_| None).collect();
    let shared = std::sync::Arc::new(JoinShared {
        woken: std::sync::Mutex::new((vec![true; n], None)),
    });
    let wakers: Vec<Waker> = (0..n)
        .map(|index| {
            Waker::from(std::sync::Arc::new(JoinChild {
                shared: shared.clone(),
                index,
            }))
        })
        .collect();
    let mut left = n;
    let mut ready = Vec::with_capacity(n);
    std::future::poll_fn(|cx| {
        {
            let mut w = shared.lock();
            ready.extend((0..n).filter(|&i| std::mem::take(&mut w.0[i])));
            match &w.1 {
                Some(parent) if parent.will_wake(cx.waker()) => {}
                _ => w.1 = Some(cx.waker().clone()),
            }
        }
        for i in ready.drain(..) {
            if out[i].is_none()
                && let Poll::Ready(v) = futs[i].as_mut().poll(&mut Context::from_waker(&wakers[i]))
            {
                out[i] = Some(v);
                left -= 1;
            }
        }
        if left == 0 {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    out.into_iter()
        .map(|v| v.expect("every future completed"))
        .collect()
}

/// What [`join_all`]'s wakers share: which futures were woken, and the joining
/// task's waker.
struct JoinShared {
    woken: std::sync::Mutex<(Vec<bool>, Option<Waker>)>,
}

impl JoinShared {
    fn lock(&self) -> std::sync::MutexGuard<'_, (Vec<bool>, Option<Waker>)> {
        self.woken.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The waker of one future of a [`join_all`].
struct JoinChild {
    shared: std::sync::Arc<JoinShared>,
    index: usize,
}

impl std::task::Wake for JoinChild {
    fn wake(self: std::sync::Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &std::sync::Arc<Self>) {
        let parent = {
            let mut w = self.shared.lock();
            w.0[self.index] = true;
            w.1.clone()
        };
        if let Some(p) = parent {
            p.wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::Wake;

    struct Count(std::sync::atomic::AtomicUsize);
    impl Wake for Count {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    fn poll<F: Future + Unpin>(f: &mut F, waker: &Waker) -> Poll<F::Output> {
        Pin::new(f).poll(&mut Context::from_waker(waker))
    }

    #[test]
    fn wait_until_times_out_only_when_expired_past_its_deadline() {
        let count = std::sync::Arc::new(Count(Default::default()));
        let waker = Waker::from(count.clone());
        let w = OffsetWatch::new(0);
        let now = Instant::now();
        let deadline = now + Duration::from_secs(3600);
        let mut f = w.wait_until(10, deadline);
        assert!(poll(&mut f, &waker).is_pending());
        w.expire(now);
        assert_eq!(
            count.0.load(std::sync::atomic::Ordering::Relaxed),
            0,
            "not due yet"
        );
        w.set(5);
        assert!(poll(&mut f, &waker).is_pending());
        w.expire(deadline);
        assert_eq!(
            count.0.load(std::sync::atomic::Ordering::Relaxed),
            1,
            "woken at the deadline"
        );
        // Polled after the deadline: timed out (the clock is past a deadline in the past).
        let mut g = w.wait_until(10, now);
        assert_eq!(poll(&mut g, &waker), Poll::Ready(None));
        drop(f);
        drop(g);
        assert!(w.waiters.borrow().is_empty());
        // Reached before the deadline.
        let mut h = w.wait_until(10, deadline);
        assert!(poll(&mut h, &waker).is_pending());
        w.set(10);
        assert_eq!(poll(&mut h, &waker), Poll::Ready(Some(true)));
    }

    #[test]
    fn dropped_waits_leave_no_waker_behind() {
        let count = std::sync::Arc::new(Count(Default::default()));
        let waker = Waker::from(count.clone());
        let w = OffsetWatch::new(0);
        for i in 0..1000 {
            let mut f = w.wait_for(100 + i);
            assert!(poll(&mut f, &waker).is_pending());
        }
        assert!(w.waiters.borrow().is_empty());
        let mut kept = w.wait_for(7);
        assert!(poll(&mut kept, &waker).is_pending());
        assert!(
            poll(&mut kept, &waker).is_pending(),
            "a second poll keeps one entry"
        );
        assert_eq!(w.waiters.borrow().len(), 1);
        w.set(7);
        assert_eq!(count.0.load(std::sync::atomic::Ordering::Relaxed), 1);
        assert_eq!(poll(&mut kept, &waker), Poll::Ready(true));
    }

    /// The timed form answers at its deadline on its own: no owner calls `expire`
    /// here, so the plain form would wait until the value came.
    #[test]
    fn a_timed_wait_answers_at_its_deadline_without_expiry() {
        glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .spawn(|| async {
                let w = OffsetWatch::new(0);
                let t0 = Instant::now();
                let deadline = t0 + Duration::from_millis(30);
                assert_eq!(w.wait_until_timed(10, deadline).await, None);
                assert!(Instant::now() >= deadline);
                assert!(
                    w.waiters.borrow().is_empty(),
                    "the wait left its entry behind"
                );
                let reached = async {
                    glommio::timer::sleep(Duration::from_millis(5)).await;
                    w.set(10);
                };
                let far = Instant::now() + Duration::from_secs(60);
                let (got, ()) =
                    futures_lite::future::zip(w.wait_until_timed(10, far), reached).await;
                assert_eq!(got, Some(true));
            })
            .unwrap()
            .join()
            .unwrap();
    }

    /// A wake-up polls only the futures that were woken: one future yielding 100
    /// times does not poll the others 100 times; each is polled again once woken, and
    /// the results come back in input order.
    #[test]
    fn join_all_polls_only_what_was_woken() {
        let polls: Vec<Rc<Cell<usize>>> = (0..4).map(|_| Rc::new(Cell::new(0))).collect();
        // Per future: released yet, and the waker it left.
        type Slot = Rc<RefCell<(bool, Option<Waker>)>>;
        let slots: Vec<Slot> = (0..3)
            .map(|_| Rc::new(RefCell::new((false, None))))
            .collect();
        let mut futs: Vec<Pin<Box<dyn Future<Output = usize>>>> = Vec::new();
        for (i, slot) in slots.iter().enumerate() {
            let (polls, slot) = (polls[i].clone(), slot.clone());
            futs.push(Box::pin(std::future::poll_fn(move |cx| {
                polls.set(polls.get() + 1);
                let mut s = slot.borrow_mut();
                if s.0 {
                    Poll::Ready(i)
                } else {
                    s.1 = Some(cx.waker().clone());
                    Poll::Pending
                }
            })));
        }
        let (yielder, slots2) = (polls[3].clone(), slots.clone());
        futs.push(Box::pin(async move {
            for _ in 0..100 {
                yielder.set(yielder.get() + 1);
                futures_lite::future::yield_now().await;
            }
            // Then lets the others finish, each woken once.
            for s in &slots2 {
                let w = {
                    let mut s = s.borrow_mut();
                    s.0 = true;
                    s.1.take()
                };
                w.expect("polled once already").wake();
            }
            3
        }));
        let out = futures_lite::future::block_on(join_all(futs));
        assert_eq!(out, vec![0, 1, 2, 3]);
        assert_eq!(polls[3].get(), 100);
        for p in &polls[..3] {
            assert_eq!(p.get(), 2, "polled at the start and once woken");
        }
    }
}
