//! Two tiny single-threaded wake-up primitives for tasks on one shard executor.
//! Nothing here is `Send`: a shard's state is only ever touched by its own thread.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

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
    waiters: RefCell<Vec<(u64, Waker)>>,
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
                ws.swap_remove(i).1.wake();
            } else {
                i += 1;
            }
        }
    }

    /// Wakes every waiter; their futures resolve to `false` from now on.
    pub fn close(&self) {
        self.closed.set(true);
        for (_, w) in self.waiters.borrow_mut().drain(..) {
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
        }
    }
}

pub struct WaitFor<'a> {
    watch: &'a OffsetWatch,
    target: u64,
}

impl Future for WaitFor<'_> {
    type Output = bool;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<bool> {
        if self.watch.value.get() >= self.target {
            return Poll::Ready(true);
        }
        if self.watch.closed.get() {
            return Poll::Ready(false);
        }
        let mut ws = self.watch.waiters.borrow_mut();
        // One entry per task, at the lowest target it waits for: repeated waits cannot
        // pile up wakers (that overflowed glommio's waker count under paced load), and
        // a task waiting on several targets wakes at the first and polls them all.
        match ws.iter_mut().find(|(_, w)| w.will_wake(cx.waker())) {
            Some(entry) => entry.0 = entry.0.min(self.target),
            None => ws.push((self.target, cx.waker().clone())),
        }
        Poll::Pending
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
