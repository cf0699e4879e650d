//! The handle's request rings: one single-producer ring per (calling thread, shard)
//! that the shard drains between its tasks (coremq's; RocketMQ calls its store in
//! place).
//!
//! A flume inbox takes a lock per send and per receive and wakes a blocked receiver per
//! message; handing 1 KiB messages between four threads on this machine's two CPUs that
//! way costs 0.68-0.77 us of CPU per message by itself, through rings like these
//! 0.14-0.24 us (`benches/handoff.rs`), against a put's ~1.4 us.
//!
//! * **A ring per calling thread and shard** ([`ShardRings::push`]): the thread's first
//!   request to a shard makes its ring and registers it with the shard (a lock, once);
//!   later requests are a slot write and a counter store. A ring's requests run in the
//!   order they were pushed.
//! * **Wakes only for a parked shard**: the shard's serving task, finding every ring
//!   empty, leaves its waker and raises `sleeping` before a last look; a pusher that
//!   sees `sleeping` takes the waker and wakes it (glommio's foreign wake). Both sides
//!   fence between their write and their read, so one of them sees the other.
//! * **A full ring makes its pusher wait** (`channel_capacity` requests per ring): it
//!   leaves its waker in the ring, which the shard wakes after it took requests out.
//! * **Closing** ([`ShardRings::close`], when the shard's thread ends): under the
//!   registry's lock the shard marks the rings closed and drops what they hold (each
//!   dropped request closes its reply slot, so its caller hears the shard is gone). A
//!   pusher that finds them closed after its push drops its own ring's requests under
//!   the same lock: a request pushed after the shard's last look is refused, not lost.
//! * **A calling thread that ends** marks its rings gone and moves the list's version;
//!   the shard's next refresh drops a gone ring that is empty.

use super::handle::Job;
use std::cell::{RefCell, UnsafeCell};
use std::future::Future;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering, fence};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll, Waker};

/// One calling thread's requests to one shard.
pub(super) struct Ring {
    slots: Box<[UnsafeCell<MaybeUninit<Job>>]>,
    /// Taken so far (written by the consumer).
    head: AtomicUsize,
    /// Pushed so far (written by the producer).
    tail: AtomicUsize,
    /// Its thread ended: dropped by the shard once empty.
    gone: AtomicBool,
    /// A pusher waiting for room.
    space: Mutex<Option<Waker>>,
    wants_space: AtomicBool,
}

// SAFETY: a slot is written only by the one producer before it publishes it through
// `tail` (Release) and read only by the one consumer after it saw it there (Acquire);
// `head` hands it back the same way. The consumer is the shard's serving task, or
// whoever holds the registry's lock once the rings are closed (`ShardRings::close`);
// the producer is the ring's thread, which after closing also consumes under that
// lock. `Job` is `Send`.
unsafe impl Sync for Ring {}
// SAFETY: as above.
unsafe impl Send for Ring {}

impl Ring {
    fn new(capacity: usize) -> Ring {
        Ring {
            slots: (0..capacity.max(1))
                .map(|_| UnsafeCell::new(MaybeUninit::uninit()))
                .collect(),
            head: AtomicUsize::new(0),
            tail: AtomicUsize::new(0),
            gone: AtomicBool::new(false),
            space: Mutex::new(None),
            wants_space: AtomicBool::new(false),
        }
    }

    /// The producer's end; gives the job back when the ring is full.
    fn push(&self, job: Job) -> Result<(), Job> {
        let tail = self.tail.load(Ordering::Relaxed);
        if tail - self.head.load(Ordering::Acquire) == self.slots.len() {
            return Err(job);
        }
        // SAFETY: the slot is free (the consumer moved past it) and only this end
        // writes slots (see `Ring`).
        unsafe { (*self.slots[tail % self.slots.len()].get()).write(job) };
        self.tail.store(tail + 1, Ordering::Release);
        Ok(())
    }

    /// The consumer's end (see `Ring` for who that is).
    fn pop(&self) -> Option<Job> {
        let head = self.head.load(Ordering::Relaxed);
        if head == self.tail.load(Ordering::Acquire) {
            return None;
        }
        // SAFETY: published by the producer (`tail` seen past it) and read once here.
        let job = unsafe { (*self.slots[head % self.slots.len()].get()).assume_init_read() };
        self.head.store(head + 1, Ordering::Release);
        Some(job)
    }

    fn is_empty(&self) -> bool {
        self.head.load(Ordering::Acquire) == self.tail.load(Ordering::Acquire)
    }

    /// After the consumer took requests out: wakes a pusher waiting for room.
    fn made_room(&self) {
        fence(Ordering::SeqCst);
        if self.wants_space.load(Ordering::Relaxed)
            && self.wants_space.swap(false, Ordering::AcqRel)
        {
            let waker = self.space.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(w) = waker {
                w.wake();
            }
        }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // Whatever is left is refused: each dropped job closes its reply slot.
        while self.pop().is_some() {}
    }
}

/// A shard's rings, shared by the shard and every thread that sends to it.
pub(super) struct ShardRings {
    registry: Mutex<Vec<Arc<Ring>>>,
    /// Moves when a ring is added or its thread ends, so the shard refreshes its copy of
    /// the list.
    version: AtomicUsize,
    closed: AtomicBool,
    /// The serving task found nothing and left its waker.
    sleeping: AtomicBool,
    waker: Mutex<Option<Waker>>,
    capacity: usize,
}

thread_local! {
    /// This thread's rings: the shard's rings they belong to, and the ring.
    static MINE: RefCell<Mine> = const { RefCell::new(Mine(Vec::new())) };
}

struct Mine(Vec<(Weak<ShardRings>, Arc<Ring>)>);

impl Drop for Mine {
    fn drop(&mut self) {
        for (owner, ring) in &self.0 {
            ring.gone.store(true, Ordering::Release);
            // The shard's next refresh drops the ring once it is empty.
            if let Some(owner) = owner.upgrade() {
                owner.version.fetch_add(1, Ordering::Release);
            }
        }
    }
}

impl ShardRings {
    pub(super) fn new(capacity: usize) -> ShardRings {
        ShardRings {
            registry: Mutex::new(Vec::new()),
            version: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
            sleeping: AtomicBool::new(false),
            waker: Mutex::new(None),
            capacity,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Arc<Ring>>> {
        self.registry.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// This thread's ring to this shard, made and registered on first use; `None` once
    /// the rings are closed.
    fn ring(self: &Arc<Self>) -> Option<Arc<Ring>> {
        MINE.try_with(|mine| {
            let mut mine = mine.borrow_mut();
            if let Some((_, ring)) = mine
                .0
                .iter()
                .find(|(owner, _)| std::ptr::eq(owner.as_ptr(), Arc::as_ptr(self)))
            {
                return Some(ring.clone());
            }
            let ring = Arc::new(Ring::new(self.capacity));
            {
                let mut registry = self.lock();
                if self.closed.load(Ordering::SeqCst) {
                    return None;
                }
                registry.push(ring.clone());
                self.version.fetch_add(1, Ordering::SeqCst);
            }
            // Rings of stores gone since are forgotten as this thread adds one.
            mine.0.retain(|(owner, _)| owner.strong_count() > 0);
            mine.0.push((Arc::downgrade(self), ring.clone()));
            Some(ring)
        })
        .ok()
        .flatten()
    }

    /// Queues `job` on this thread's ring to the shard, waiting while the ring is full,
    /// and wakes the shard if it parked. `Err(job)`: no ring (the rings are closed, or
    /// this thread is ending): the caller sends it another way or refuses it.
    pub(super) async fn push(self: &Arc<Self>, job: Job) -> Result<(), Job> {
        let Some(ring) = self.ring() else {
            return Err(job);
        };
        Pushing {
            ring: &ring,
            job: Some(job),
        }
        .await;
        fence(Ordering::SeqCst);
        if self.closed.load(Ordering::Relaxed) {
            // The shard may have taken its last look before this push: refuse what is
            // left in this ring (this thread's own requests) under the closing lock.
            let _registry = self.lock();
            while ring.pop().is_some() {}
            return Ok(());
        }
        if self.sleeping.load(Ordering::Relaxed) && self.sleeping.swap(false, Ordering::AcqRel) {
            let waker = self.waker.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(w) = waker {
                w.wake();
            }
        }
        Ok(())
    }

    /// The shard's copy of the ring list, refreshed when rings were added or their
    /// threads ended (or a gone thread's ring was emptied); drops the empty rings of
    /// threads that ended.
    pub(super) fn refresh(&self, rings: &mut Vec<Arc<Ring>>, seen: &mut usize) {
        if self.version.load(Ordering::Acquire) == *seen {
            return;
        }
        let mut registry = self.lock();
        registry.retain(|r| !(r.gone.load(Ordering::Acquire) && r.is_empty()));
        rings.clone_from(&registry);
        *seen = self.version.load(Ordering::Acquire);
    }

    /// Takes every request queued in `rings` (the shard's copy), in each ring's order,
    /// handing each to `run`; returns how many.
    pub(super) fn drain(&self, rings: &[Arc<Ring>], mut run: impl FnMut(Job)) -> usize {
        let mut n = 0;
        for ring in rings {
            let mut took = false;
            while let Some(job) = ring.pop() {
                run(job);
                n += 1;
                took = true;
            }
            if took {
                ring.made_room();
                if ring.gone.load(Ordering::Acquire) {
                    // Emptied after its thread ended: the next refresh drops it.
                    self.version.fetch_add(1, Ordering::Release);
                }
            }
        }
        n
    }

    /// Resolves once a request is queued in `rings` (refreshed as rings are added);
    /// leaves the task's waker for pushers meanwhile.
    pub(super) fn ready<'a>(
        self: &'a Arc<Self>,
        rings: &'a mut Vec<Arc<Ring>>,
        seen: &'a mut usize,
    ) -> impl Future<Output = ()> + 'a {
        std::future::poll_fn(move |cx| {
            self.refresh(rings, seen);
            if rings.iter().any(|r| !r.is_empty()) {
                return Poll::Ready(());
            }
            *self.waker.lock().unwrap_or_else(|e| e.into_inner()) = Some(cx.waker().clone());
            self.sleeping.store(true, Ordering::SeqCst);
            fence(Ordering::SeqCst);
            self.refresh(rings, seen);
            if rings.iter().any(|r| !r.is_empty()) {
                self.sleeping.store(false, Ordering::SeqCst);
                return Poll::Ready(());
            }
            Poll::Pending
        })
    }

    /// The shard's thread ends: refuses everything queued and everything pushed later.
    pub(super) fn close(&self) {
        let registry = self.lock();
        self.closed.store(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        for ring in registry.iter() {
            while ring.pop().is_some() {}
            ring.made_room();
        }
    }
}

/// Waits for room in a full ring.
struct Pushing<'a> {
    ring: &'a Ring,
    job: Option<Job>,
}

impl Future for Pushing<'_> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let job = self.job.take().expect("polled after it pushed");
        let job = match self.ring.push(job) {
            Ok(()) => return Poll::Ready(()),
            Err(job) => job,
        };
        *self.ring.space.lock().unwrap_or_else(|e| e.into_inner()) = Some(cx.waker().clone());
        self.ring.wants_space.store(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        match self.ring.push(job) {
            Ok(()) => Poll::Ready(()),
            Err(job) => {
                self.job = Some(job);
                Poll::Pending
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::handle::test_job;
    use super::*;
    use futures_lite::future::block_on;
    use std::sync::atomic::AtomicUsize;
    use std::task::Wake;

    /// A waker that counts its wakes.
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn poll<F: Future + Unpin>(f: &mut F, waker: &Waker) -> Poll<F::Output> {
        Pin::new(f).poll(&mut Context::from_waker(waker))
    }

    /// What the shard takes from its rings, in order.
    fn take_all(rings: &Arc<ShardRings>, mine: &mut Vec<Arc<Ring>>, seen: &mut usize) -> Vec<Job> {
        rings.refresh(mine, seen);
        let mut jobs = Vec::new();
        rings.drain(mine, |j| jobs.push(j));
        jobs
    }

    #[test]
    fn a_threads_requests_come_out_in_order() {
        let rings = Arc::new(ShardRings::new(8));
        let (mut mine, mut seen) = (Vec::new(), usize::MAX);
        let mut answers = Vec::new();
        for v in 0..3 {
            let (job, answer) = test_job(v);
            assert!(block_on(rings.push(job)).is_ok());
            answers.push(answer);
        }
        let mut jobs = take_all(&rings, &mut mine, &mut seen);
        assert_eq!(jobs.len(), 3);
        let waker = Waker::from(Arc::new(Count(AtomicUsize::new(0))));
        // Dropping the second job taken answers the second request, and only it.
        drop(jobs.remove(1));
        assert!(poll(&mut answers[0], &waker).is_pending());
        assert_eq!(poll(&mut answers[1], &waker), Poll::Ready(None));
        assert!(poll(&mut answers[2], &waker).is_pending());
        assert!(take_all(&rings, &mut mine, &mut seen).is_empty());
    }

    #[test]
    fn a_full_ring_waits_for_room() {
        let rings = Arc::new(ShardRings::new(2));
        let (mut mine, mut seen) = (Vec::new(), usize::MAX);
        for v in 0..2 {
            assert!(block_on(rings.push(test_job(v).0)).is_ok());
        }
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let mut third = Box::pin(rings.push(test_job(2).0));
        assert!(
            third
                .as_mut()
                .poll(&mut Context::from_waker(&waker))
                .is_pending()
        );
        assert_eq!(take_all(&rings, &mut mine, &mut seen).len(), 2);
        assert_eq!(
            count.0.load(Ordering::SeqCst),
            1,
            "the waiting pusher is woken"
        );
        assert!(matches!(
            third.as_mut().poll(&mut Context::from_waker(&waker)),
            Poll::Ready(Ok(()))
        ));
        assert_eq!(take_all(&rings, &mut mine, &mut seen).len(), 1);
    }

    #[test]
    fn a_parked_shard_is_woken_by_a_push_from_another_thread() {
        let rings = Arc::new(ShardRings::new(8));
        let (mut mine, mut seen) = (Vec::new(), usize::MAX);
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        {
            let mut ready = Box::pin(rings.ready(&mut mine, &mut seen));
            assert!(
                ready
                    .as_mut()
                    .poll(&mut Context::from_waker(&waker))
                    .is_pending()
            );
        }
        let pusher = rings.clone();
        std::thread::spawn(move || {
            let (job, _answer) = test_job(1);
            assert!(block_on(pusher.push(job)).is_ok());
            // The thread ends: its ring is gone once empty.
        })
        .join()
        .unwrap();
        assert_eq!(count.0.load(Ordering::SeqCst), 1, "woken once");
        assert_eq!(take_all(&rings, &mut mine, &mut seen).len(), 1);
        rings.refresh(&mut mine, &mut seen);
        assert!(mine.is_empty(), "an ended thread's empty ring is dropped");
    }

    #[test]
    fn closed_rings_refuse_what_they_hold_and_what_comes_later() {
        let rings = Arc::new(ShardRings::new(8));
        let waker = Waker::from(Arc::new(Count(AtomicUsize::new(0))));
        let (job, mut queued) = test_job(1);
        assert!(block_on(rings.push(job)).is_ok());
        rings.close();
        assert_eq!(
            poll(&mut queued, &waker),
            Poll::Ready(None),
            "refused at the close"
        );
        // This thread's ring, pushed to after the close: refused by the pusher itself.
        let (job, mut late) = test_job(2);
        assert!(block_on(rings.push(job)).is_ok());
        assert_eq!(poll(&mut late, &waker), Poll::Ready(None));
        // A thread with no ring yet gets its request back, to send another way.
        let pusher = rings.clone();
        let refused = std::thread::spawn(move || block_on(pusher.push(test_job(3).0)).is_err());
        assert!(refused.join().unwrap());
    }
}
