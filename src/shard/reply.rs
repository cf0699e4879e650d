//! A request's reply: a one-shot slot the shard fills and the caller waits on, from
//! any thread (coremq's; RocketMQ calls its store in place).
//!
//! What a hop used to take for its reply, a one-slot flume channel, allocated a
//! channel (its shared state, a wait list) per request and registered a hook on every
//! pending poll. The slot is one allocation (the `Arc` the two ends share), a state
//! word and the caller's waker behind a small lock:
//!
//! * the shard's end [`ReplySender::send`] stores the value, publishes it (`Release`)
//!   and wakes the caller's waker, if one is registered, outside the lock. A sender
//!   dropped unsent (its task dropped because the shard died) closes the slot and
//!   wakes the caller, who then sees the shard as gone.
//! * the caller's end [`ReplyReceiver`] is a future: ready once the state says sent
//!   (or closed); otherwise it registers its waker, then looks at the state again, so
//!   a value published between the two looks is not missed (the sender takes the
//!   waker under the same lock after publishing).
//! * [`ReplyReceiver::sent_at`]: when the value was published (a monotonic clock in
//!   nanoseconds), for the callers' adaptive spin (`wait.rs`): how long replies take.
//! * **The request travels in the reply's allocation** ([`request`]): a hop's job
//!   (the operation and its arguments) waits in the slot until the shard takes it out,
//!   so a hop allocates once, on the caller's thread, and the caller, who usually lets
//!   go of the slot last, frees it there (a boxed job freed by the shard took the
//!   caller's glibc arena lock on every hop).
//! * **Wakes held for a batch** ([`hold_wakes`]): while the shard
//!   runs a batch of requests taken from its inbox and rings, the callers' wakers are collected
//!   and woken once the batch is done, not one by one. A thread with many requests
//!   outstanding then wakes once per batch and finds all its replies, instead of being
//!   woken (a futex wake, a context switch on a CPU the shard shares) after every few.
//!   A lone request's batch is itself, so it is answered as soon as before.

use super::wait;
use std::cell::{RefCell, UnsafeCell};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

const EMPTY: u8 = 0;
const SENT: u8 = 1;
const CLOSED: u8 = 2;
/// The value was taken by the receiver (a second poll after `Ready` is a bug).
const TAKEN: u8 = 3;

pub(super) struct Slot<T, J = ()> {
    state: AtomicU8,
    /// Written once by the sender before `state` becomes `SENT`; read once by the
    /// receiver after it sees `SENT`.
    value: UnsafeCell<Option<T>>,
    waker: Mutex<Option<Waker>>,
    /// `wait::now_ns()` when the value was published.
    sent_at_ns: AtomicU64,
    /// The request this reply answers (`request`): put in before the slot is shared,
    /// taken out once by the sending end ([`ReplySender::take_job`]); the receiver
    /// never touches it.
    job: UnsafeCell<Option<J>>,
}

// SAFETY: `value` is written only by the one sender before it publishes `SENT`
// (Release) and read only by the one receiver after it observed `SENT` (Acquire);
// the state word hands it over, so no two threads touch it at once. `job` is written
// before the slot is shared and taken only by the sending end, which exists once
// (the request's hand-over to the shard, a channel, orders the two). `T: Send` and
// `J: Send` move them between threads.
unsafe impl<T: Send, J: Send> Sync for Slot<T, J> {}
// SAFETY: as above; the slot owns a `T` and a `J`, which may move between threads.
unsafe impl<T: Send, J: Send> Send for Slot<T, J> {}

/// The shard's end.
pub(super) struct ReplySender<T, J = ()> {
    slot: Option<Arc<Slot<T, J>>>,
}

/// The caller's end: a future of the value, or `None` when the sender was dropped
/// unsent.
pub(super) struct ReplyReceiver<T, J = ()> {
    slot: Arc<Slot<T, J>>,
}

#[cfg(test)]
fn channel<T>() -> (ReplySender<T>, ReplyReceiver<T>) {
    let (slot, receiver) = request(());
    (ReplySender::from_slot(slot), receiver)
}

/// A reply slot carrying `job`, the request it answers: the slot for the shard (made
/// its sending end there by [`ReplySender::from_slot`]) and the caller's end.
pub(super) fn request<T, J>(job: J) -> (Arc<Slot<T, J>>, ReplyReceiver<T, J>) {
    let slot = Arc::new(Slot {
        state: AtomicU8::new(EMPTY),
        value: UnsafeCell::new(None),
        waker: Mutex::new(None),
        sent_at_ns: AtomicU64::new(0),
        job: UnsafeCell::new(Some(job)),
    });
    (slot.clone(), ReplyReceiver { slot })
}

thread_local! {
    /// `Some` while this thread holds its reply wakes ([`hold_wakes`]).
    static HELD: RefCell<Option<Vec<Waker>>> = const { RefCell::new(None) };
}

/// Holds the reply wakes of this thread until the returned guard is dropped (then
/// wakes them): replies published meanwhile keep their callers' wakers instead of
/// waking them. The guard also releases when a panic unwinds through its owner (a job
/// that panics takes the shard down; its callers must still hear of it).
pub(super) fn hold_wakes() -> HeldWakes {
    HELD.with(|h| {
        let mut h = h.borrow_mut();
        if h.is_none() {
            *h = Some(Vec::new());
        }
    });
    HeldWakes(())
}

/// See [`hold_wakes`].
pub(super) struct HeldWakes(());

impl Drop for HeldWakes {
    fn drop(&mut self) {
        release_wakes();
    }
}

/// Wakes every caller whose reply was published since [`hold_wakes`], and stops
/// holding.
fn release_wakes() {
    // Taken out first: a waker may run code that publishes again (not held then).
    let held = HELD.with(|h| h.borrow_mut().take());
    if let Some(held) = held {
        held.into_iter().for_each(Waker::wake);
    }
}

impl<T, J> Slot<T, J> {
    /// Closes a slot whose request was dropped unstarted (the shard gone): its caller
    /// sees the shard as gone. Only for a slot no sending end was made of.
    pub(super) fn abandon(&self) {
        self.publish(CLOSED);
    }

    /// Publishes `state` (SENT or CLOSED) and wakes the receiver if it waits (or
    /// holds its waker, see [`hold_wakes`]).
    fn publish(&self, state: u8) {
        self.sent_at_ns.store(wait::now_ns(), Ordering::Relaxed);
        self.state.store(state, Ordering::Release);
        let waker = self.waker.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(w) = waker {
            // Held, unless this thread holds none; or its thread-locals are being
            // destroyed (a shard thread ending after a panic, its `Alive` closing the
            // rings): then woken at once, as a panic there would abort the process.
            let mut w = Some(w);
            let _ = HELD.try_with(|h| {
                if let Some(held) = &mut *h.borrow_mut() {
                    held.extend(w.take());
                }
            });
            if let Some(w) = w {
                w.wake();
            }
        }
    }
}

impl<T, J> ReplySender<T, J> {
    /// The sending end of a slot made by [`request`]; one per slot.
    pub(super) fn from_slot(slot: Arc<Slot<T, J>>) -> ReplySender<T, J> {
        ReplySender { slot: Some(slot) }
    }

    /// The request the slot carries; taken once.
    pub(super) fn take_job(&mut self) -> J {
        let slot = self.slot.as_ref().expect("taken before the reply is sent");
        // SAFETY: only this end touches `job`, and there is one (see `Slot`).
        unsafe { (*slot.job.get()).take() }.expect("a request's job is taken once")
    }

    /// Hands `value` to the caller (a caller that gave up drops it with the slot).
    pub(super) fn send(mut self, value: T) {
        let slot = self.slot.take().expect("a reply is sent once");
        // SAFETY: the only write, before the state publishes it (see `Slot`).
        unsafe { *slot.value.get() = Some(value) };
        slot.publish(SENT);
    }
}

impl<T, J> Drop for ReplySender<T, J> {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            slot.publish(CLOSED);
        }
    }
}

impl<T, J> ReplyReceiver<T, J> {
    /// When the reply was published (`wait::now_ns`), once it was.
    pub(super) fn sent_at_ns(&self) -> u64 {
        self.slot.sent_at_ns.load(Ordering::Relaxed)
    }

    fn take(&self) -> Option<Poll<Option<T>>> {
        match self.slot.state.load(Ordering::Acquire) {
            EMPTY => None,
            SENT => {
                self.slot.state.store(TAKEN, Ordering::Relaxed);
                // SAFETY: `SENT` was observed with Acquire: the sender's write is
                // visible and it no longer touches the value (see `Slot`).
                Some(Poll::Ready(unsafe { (*self.slot.value.get()).take() }))
            }
            CLOSED => Some(Poll::Ready(None)),
            _ => panic!("a reply polled after it was taken"),
        }
    }
}

impl<T, J> Future for ReplyReceiver<T, J> {
    type Output = Option<T>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        if let Some(ready) = self.take() {
            return ready;
        }
        {
            let mut w = self.slot.waker.lock().unwrap_or_else(|e| e.into_inner());
            match &mut *w {
                Some(old) if old.will_wake(cx.waker()) => {}
                w => *w = Some(cx.waker().clone()),
            }
        }
        // Published between the first look and the registration: the sender may
        // have found no waker to wake.
        self.take().unwrap_or(Poll::Pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_lite::future::block_on;

    /// A slot abandoned by a thread-local's destructor after this thread's held wakes
    /// are gone (a shard thread ending after a panic: its `Alive` closes the rings)
    /// still wakes its caller. Reading `HELD` there panicked, which aborts the process
    /// ("thread local panicked on drop"; this test binary, without the fix).
    #[test]
    fn a_slot_abandoned_while_its_thread_ends_wakes_the_caller() {
        struct AbandonOnExit(Option<Arc<Slot<u32, ()>>>);
        impl Drop for AbandonOnExit {
            fn drop(&mut self) {
                if let Some(slot) = self.0.take() {
                    slot.abandon();
                }
            }
        }
        thread_local! {
            static ON_EXIT: RefCell<AbandonOnExit> = const { RefCell::new(AbandonOnExit(None)) };
        }
        let (slot, mut rx) = request::<u32, ()>(());
        let (waiting, wait) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            // Registered first, destroyed last: thread-locals go in reverse order.
            ON_EXIT.with(|e| e.borrow_mut().0 = Some(slot));
            drop(hold_wakes());
            wait.recv().expect("caller gone");
        });
        let mut waiting = Some(waiting);
        let got = block_on(futures_lite::future::poll_fn(|cx| {
            let p = std::pin::Pin::new(&mut rx).poll(cx);
            // The caller's waker is in the slot: the thread may end.
            if let Some(w) = waiting.take() {
                w.send(()).expect("thread gone");
            }
            p
        }));
        assert_eq!(got, None, "abandoned: the shard is gone");
        t.join().expect("the thread ended without a panic");
    }

    #[test]
    fn value_crosses_threads() {
        for _ in 0..200 {
            let (tx, rx) = channel();
            let t = std::thread::spawn(move || tx.send(vec![1u8, 2, 3]));
            assert_eq!(block_on(rx), Some(vec![1, 2, 3]));
            t.join().unwrap();
        }
    }

    #[test]
    fn dropped_sender_closes() {
        let (tx, rx) = channel::<u32>();
        let t = std::thread::spawn(move || drop(tx));
        assert_eq!(block_on(rx), None);
        t.join().unwrap();
    }

    /// A waker that counts its wakes.
    struct Count(std::sync::atomic::AtomicUsize);

    impl std::task::Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn held_wakes_wait_for_the_release() {
        let count = Arc::new(Count(Default::default()));
        let waker = Waker::from(count.clone());
        let mut cx = Context::from_waker(&waker);
        let woken = || count.0.load(Ordering::SeqCst);
        let (tx, mut rx) = channel();
        assert!(Pin::new(&mut rx).poll(&mut cx).is_pending());
        let (tx2, mut rx2) = channel::<u8>();
        assert!(Pin::new(&mut rx2).poll(&mut cx).is_pending());
        let held = hold_wakes();
        tx.send(5u8);
        drop(tx2);
        assert_eq!(woken(), 0, "held while the batch runs");
        drop(held);
        assert_eq!(woken(), 2, "both woken at the release");
        assert_eq!(Pin::new(&mut rx).poll(&mut cx), Poll::Ready(Some(5)));
        assert_eq!(Pin::new(&mut rx2).poll(&mut cx), Poll::Ready(None));
        // Not holding: a reply wakes its caller at once.
        let (tx, mut rx) = channel();
        assert!(Pin::new(&mut rx).poll(&mut cx).is_pending());
        tx.send(6u8);
        assert_eq!(woken(), 3);
        // A panic while holding still wakes the callers whose replies were dropped.
        let (tx, mut rx) = channel::<u8>();
        assert!(Pin::new(&mut rx).poll(&mut cx).is_pending());
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            let _held = hold_wakes();
            let _tx = tx;
            panic!("a job panics");
        }));
        assert!(unwound.is_err());
        assert_eq!(woken(), 4, "released by the unwinding");
        assert_eq!(Pin::new(&mut rx).poll(&mut cx), Poll::Ready(None));
    }

    #[test]
    fn dropped_receiver_drops_the_value() {
        let (tx, rx) = channel();
        let v = Arc::new(());
        drop(rx);
        tx.send(v.clone());
        assert_eq!(Arc::strong_count(&v), 1, "the slot went with both ends");
    }
}
