//! [`Handle`]: the `Send + Sync + Clone` way into every shard, from any thread (plain,
//! tokio, another shard's executor).
//!
//! coremq's own (RocketMQ's broker calls its one `DefaultMessageStore` directly). The
//! store's operations come from [`StoreOps`](super::StoreOps); this file is the
//! transport under them, and the only code that knows it: [`Route::run_at`] sends a
//! request, [`serve`] is the shard's end.
//!
//! * **Transport.** An operation travels in its reply slot (`reply.rs`), which holds
//!   the operation's closure and owned arguments until the shard takes them out: one
//!   allocation per hop, made and usually freed by the caller (a boxed job, freed by
//!   the shard, was a second one and took the caller's glibc arena lock). It goes
//!   through the calling thread's ring to the shard (`rings.rs`: no lock, a wake only
//!   for a parked shard, a full ring makes its pusher wait; scenario 1b 488-522 k ->
//!   526-556 k msg/s over a flume inbox). `spawn_on` (work that answers by itself)
//!   travels the same way with a reply nobody awaits. A thread without a ring (the
//!   rings closed, the thread ending) and shutdown use the shard's bounded flume
//!   inbox (`ShardedConfig::channel_capacity`, as each ring), whose sender wakes the
//!   shard's executor only when it is parked (glommio's foreign waker writes its
//!   eventfd only then). The serving task takes everything queued
//!   in its inbox and rings at each wake and polls each operation once itself; one
//!   that waits goes on as a task of its own, so it does not hold up the next (a
//!   glommio task for every request cost scenario 1b ~10%: 523-531 k -> 576-590 k
//!   msg/s). The reply comes back in the slot.
//! * **Replies woken per batch.** The callers of a batch's replies are woken
//!   together when the batch (or each [`HELD_JOBS`] of its jobs) is done, not one
//!   by one: a caller with many requests in flight wakes once per batch (scenario
//!   1b, 2 threads x 256 in flight, most runs: 455-477 k -> 540-564 k puts/s).
//! * **Waking.** Each side of a hop stays awake while the other is expected soon and
//!   parks otherwise (`wait.rs`): the shard for one awake window after requests that
//!   came close together, the caller for its reply-spin budget when replies have been
//!   coming back that fast (a shard through glommio's `stay_awake_until`, a plain
//!   thread in [`block_on`](super::block_on)).
//! * **Failure isolation.** A shard whose thread is gone (shut down, or its executor
//!   died with a panicking task) is marked dead; requests to it fail at once with
//!   [`Error::ShardUnavailable`] and the other shards go on. A request queued when the
//!   shard died is dropped with its reply sender, which its caller sees as the same
//!   error rather than waiting for ever.

use super::ops::Route;
use super::ownership::Ownership;
use super::reply::{self, ReplyReceiver, ReplySender, Slot};
use super::rings::ShardRings;
use super::wait;
use crate::error::{Error, Result};
use crate::store::Store;
use std::borrow::Borrow;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

pub(super) enum Request {
    /// An operation and its reply slot (`Handle::run_at`, `Handle::spawn_on`).
    Job(Job),
    /// Shut the shard's store down, answer, and stop serving.
    Shutdown(flume::Sender<Result<()>>),
}

/// A request's reply slot with its operation inside, as the shard's inbox carries it.
/// Dropped unstarted (the shard gone), it closes the slot so the caller hears of it.
pub(super) struct Job(Option<Arc<dyn Start>>);

/// What the shard does with a [`Job`]; implemented by every slot that carries an
/// operation on the shard's store.
pub(super) trait Start: Send + Sync {
    /// Starts the operation on this shard, polled at once with `cx` (the serving
    /// task's); one that waits goes on as a task of its own. Its result fills the slot.
    fn start(self: Arc<Self>, store: &Store, cx: &mut Context<'_>);
    /// Closes the slot of an operation that will never start.
    fn abandon(&self);
}

impl Job {
    fn run(mut self, store: &Store, cx: &mut Context<'_>) {
        if let Some(start) = self.0.take() {
            start.start(store, cx);
        }
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        if let Some(start) = self.0.take() {
            start.abandon();
        }
    }
}

impl<T, F> Start for Slot<T, F>
where
    T: Send + 'static,
    F: AsyncFnOnce(&Store) -> T + Send + 'static,
{
    fn start(self: Arc<Self>, store: &Store, cx: &mut Context<'_>) {
        let mut reply = ReplySender::from_slot(self);
        let f = reply.take_job();
        let store = store.clone();
        let mut op = Box::pin(async move {
            // A caller that gave up dropped its end; the value goes with it.
            reply.send(f(&store).await);
        });
        // Most operations (an async put: a copy into the write window) finish at their
        // first poll: no task for them. One that waits registered the serving task's
        // waker; its task polls it again at once (glommio runs a spawned task right
        // away), which registers the task's own.
        if op.as_mut().poll(cx).is_pending() {
            glommio::spawn_local(op).detach();
        }
    }

    fn abandon(&self) {
        Slot::abandon(self);
    }
}

/// A request whose operation answers `v`, and its caller's end: for tests of the
/// transport that never run it (dropped, it answers `None`).
#[cfg(test)]
pub(super) fn test_job(v: u32) -> (Job, ReplyReceiver<u32, impl Send>) {
    let (slot, answer) = reply::request(async move |_: &Store| v);
    (Job(Some(slot)), answer)
}

/// A shard's end of its request channel.
pub(super) type Inbox = flume::Receiver<Request>;

pub(super) struct Shared {
    senders: Vec<flume::Sender<Request>>,
    /// Each shard's request rings (`rings.rs`): how operations reach it.
    rings: Vec<Arc<ShardRings>>,
    /// The store's ownership rule (`store.meta`).
    ownership: Ownership,
    /// Cleared when a shard's thread ends (even by a panic), see `sharded_store::Alive`.
    pub(super) alive: Vec<AtomicBool>,
    /// The CPU each shard's executor last ran on (`usize::MAX`: not known yet), so a
    /// caller never spins on the CPU its answer must be computed on.
    cpus: Vec<AtomicUsize>,
    /// `ShardedConfig::reply_spin`.
    reply_spin: Duration,
    closed: AtomicBool,
}

/// A `Send + Sync + Clone` handle to every shard. Its operations are [`StoreOps`]
/// methods (bring the trait into scope); [`Handle::run_on`] runs your own code on a
/// shard.
///
/// [`StoreOps`]: super::StoreOps
#[derive(Clone)]
pub struct Handle {
    pub(super) shared: Arc<Shared>,
}

impl Handle {
    /// A handle to `shards` shards whose channels hold `capacity` requests each, and the
    /// shards' ends of those channels. Callers spin up to `reply_spin` for a reply
    /// expected soon (`wait.rs`).
    pub(super) fn new(
        shards: usize,
        capacity: usize,
        ownership: Ownership,
        reply_spin: Duration,
    ) -> (Handle, Vec<Inbox>) {
        let (senders, inboxes) = (0..shards).map(|_| flume::bounded(capacity)).unzip();
        let shared = Shared {
            senders,
            rings: (0..shards)
                .map(|_| Arc::new(ShardRings::new(capacity)))
                .collect(),
            ownership,
            alive: (0..shards).map(|_| AtomicBool::new(true)).collect(),
            cpus: (0..shards).map(|_| AtomicUsize::new(usize::MAX)).collect(),
            reply_spin,
            closed: AtomicBool::new(false),
        };
        let handle = Handle {
            shared: Arc::new(shared),
        };
        (handle, inboxes)
    }

    pub fn shards(&self) -> usize {
        self.shared.senders.len()
    }

    /// Whether `shard`'s thread is still serving (false once it ended: shut down, or its
    /// executor died with a panicking task). A plain load, no hop: for watchdogs.
    pub fn is_alive(&self, shard: usize) -> bool {
        self.shared
            .alive
            .get(shard)
            .is_some_and(|a| a.load(Ordering::SeqCst))
    }

    /// The shard owning `(topic, queue_id)`.
    pub fn shard_of(&self, topic: &str, queue_id: i32) -> usize {
        self.shared
            .ownership
            .shard_of(topic, queue_id, self.shards())
    }

    /// The store's ownership rule, as its `store.meta` records it.
    pub fn ownership(&self) -> Ownership {
        self.shared.ownership
    }

    /// Refuses every later request with [`Error::ShutDown`].
    pub(super) fn close(&self) {
        self.shared.closed.store(true, Ordering::SeqCst);
    }

    /// Closes the handle and asks every shard to shut down; each answers on its
    /// receiver (or drops it when its thread is already gone).
    pub(super) fn shut_down_all(&self) -> Vec<flume::Receiver<Result<()>>> {
        self.close();
        let ask = |tx: &flume::Sender<Request>| {
            let (reply, answer) = flume::bounded(1);
            let _ = tx.send(Request::Shutdown(reply));
            answer
        };
        self.shared.senders.iter().map(ask).collect()
    }
}

impl Route for Handle {
    fn shards(&self) -> usize {
        Handle::shards(self)
    }

    fn owner(&self, topic: &str, queue_id: i32) -> usize {
        self.shard_of(topic, queue_id)
    }

    fn run_at<A, T, F>(&self, shard: usize, args: &A, f: F) -> impl Future<Output = Result<T>>
    where
        A: ?Sized + ToOwned,
        A::Owned: Send + 'static,
        T: Send + 'static,
        F: AsyncFnOnce(&Store, &A) -> T + Send + 'static,
    {
        let args = args.to_owned();
        async move {
            let call = async move |store: &Store| f(store, args.borrow()).await;
            let (slot, answer) = reply::request(call);
            self.queue(shard, Job(Some(slot))).await?;
            let cpu = self.shared.cpus[shard].load(Ordering::Relaxed);
            let answer = Awaiting {
                answer,
                since_ns: None,
                spin: self.shared.reply_spin,
                answer_cpu: (cpu != usize::MAX).then_some(cpu),
            };
            answer.await.ok_or_else(|| gone(shard))
        }
    }
}

/// A caller waiting for its reply: tells `wait` how long it may spin first, and
/// records how long the reply took (`wait.rs`). `None`: the shard dropped the
/// request (its thread is gone).
struct Awaiting<T, J> {
    answer: ReplyReceiver<T, J>,
    /// When it first went pending (`wait::now_ns`).
    since_ns: Option<u64>,
    spin: Duration,
    answer_cpu: Option<usize>,
}

impl<T, J> Future for Awaiting<T, J> {
    type Output = Option<T>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        match Pin::new(&mut self.answer).poll(cx) {
            Poll::Ready(v) => {
                if let Some(since) = self.since_ns {
                    wait::reply_took(since, self.answer.sent_at_ns());
                }
                Poll::Ready(v)
            }
            Poll::Pending => {
                if self.since_ns.is_none() {
                    self.since_ns = Some(wait::now_ns());
                }
                wait::expect_reply(self.spin, self.answer_cpu);
                Poll::Pending
            }
        }
    }
}

/// Jobs whose reply wakes one batch holds at most: a caller with many requests in
/// flight is woken once per this many instead of once per reply, and a reply waits at
/// most this many jobs (~2 us each for a put) for its wake.
const HELD_JOBS: usize = 256;

/// The shard's end: runs each job as it arrives until asked to shut down. Each wake
/// of this task takes everything queued meanwhile (one batch), notes the arrival for
/// the awake window and where this executor runs (`wait.rs`).
pub(super) async fn serve(shard: usize, handle: &Handle, inbox: &Inbox, store: Store) {
    let cpu = &handle.shared.cpus[shard];
    let rings = &handle.shared.rings[shard];
    // This shard's copy of its ring list (`rings.rs`), refreshed as rings come.
    let (mut mine, mut seen) = (Vec::new(), usize::MAX);
    // Operations are first polled here, with this task's waker (`Start::start`).
    let waker = std::future::poll_fn(|cx| Poll::Ready(cx.waker().clone())).await;
    let run = |job: Job| job.run(&store, &mut Context::from_waker(&waker));
    loop {
        // A request in the inbox (`None`: every sender is gone) or in a ring.
        let first = {
            let from_inbox = async { Some(inbox.recv_async().await.ok()) };
            let from_rings = async {
                rings.ready(&mut mine, &mut seen).await;
                None
            };
            futures_lite::future::or(from_inbox, from_rings).await
        };
        let mut next = match first {
            Some(None) => return,
            Some(Some(req)) => Some(req),
            None => None,
        };
        wait::note_arrival();
        if let Some(now) = wait::current_cpu() {
            cpu.store(now, Ordering::Relaxed);
        }
        // The batch's reply wakes, released when it ends or every `HELD_JOBS` jobs
        // (`reply.rs`).
        let mut held = Some(reply::hold_wakes());
        let mut jobs = 0;
        let mut counted = |held: &mut Option<reply::HeldWakes>| {
            jobs += 1;
            if jobs % HELD_JOBS == 0 {
                // Released first, then held anew.
                drop(held.take());
                *held = Some(reply::hold_wakes());
            }
        };
        loop {
            let mut took = 0;
            while let Some(req) = next.take().or_else(|| inbox.try_recv().ok()) {
                match req {
                    Request::Job(job) => run(job),
                    Request::Shutdown(reply) => {
                        // Requests queued in the rings before the shutdown are started
                        // first, as they were when they shared the inbox with it.
                        rings.refresh(&mut mine, &mut seen);
                        rings.drain(&mine, run);
                        drop(held);
                        let _ = reply.send(store.clone().shutdown().await);
                        return;
                    }
                }
                took += 1;
                counted(&mut held);
            }
            rings.refresh(&mut mine, &mut seen);
            took += rings.drain(&mine, |job| {
                run(job);
                counted(&mut held);
            });
            if took == 0 {
                break;
            }
        }
        drop(held);
    }
}

impl Handle {
    /// `shard`'s thread ended: its rings refuse what they hold and what comes later.
    pub(super) fn close_rings(&self, shard: usize) {
        self.shared.rings[shard].close();
    }

    /// The inbox of `shard`, when a request may go there: the store is not shut, the
    /// shard exists and its thread is alive.
    fn inbox_of(&self, shard: usize) -> Result<&flume::Sender<Request>> {
        if self.shared.closed.load(Ordering::SeqCst) {
            return Err(Error::ShutDown);
        }
        let tx = self.shared.senders.get(shard).ok_or_else(|| {
            Error::BadRequest(format!(
                "shard {shard} does not exist (this store has {})",
                self.shards()
            ))
        })?;
        if !self.shared.alive[shard].load(Ordering::SeqCst) {
            return Err(gone(shard));
        }
        Ok(tx)
    }

    /// Starts `f`'s future on `shard` and returns once the job is queued there (a
    /// full ring or inbox makes this wait), not when it ends: for work that answers by
    /// itself (the node's routed sends answer their client on the connection,
    /// `node::shared_out`). It travels as a [`Handle::run_at`] operation does (the
    /// calling thread's ring, a first poll on the shard, a task only if it waits)
    /// whose reply nobody awaits. Refused (the shard gone, the store shut), `f` is
    /// dropped unrun.
    #[cfg_attr(not(feature = "node"), allow(dead_code))]
    pub(crate) async fn spawn_on<F, Fut>(&self, shard: usize, f: F) -> Result<()>
    where
        F: FnOnce(Store) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + 'static,
    {
        let (slot, answer) = reply::request(async move |store: &Store| f(store.clone()).await);
        drop(answer);
        self.queue(shard, Job(Some(slot))).await
    }

    /// Queues `job` for `shard`: through the calling thread's ring, or, for a thread
    /// without one (the rings closed, or the thread ending), through the inbox, which
    /// refuses it as the rings would.
    async fn queue(&self, shard: usize, job: Job) -> Result<()> {
        let tx = self.inbox_of(shard)?;
        if let Err(job) = self.shared.rings[shard].push(job).await {
            tx.send_async(Request::Job(job))
                .await
                .map_err(|_| gone(shard))?;
        }
        Ok(())
    }
}

pub(super) fn gone(shard: usize) -> Error {
    Error::ShardUnavailable {
        shard,
        why: "the shard's thread stopped (shut down or failed)".into(),
    }
}

/// Hosts call a `Handle` from tokio's multi-thread runtime and from plain threads, so
/// every operation's future must be `Send`. `StoreOps`'s `async fn`s cannot promise it
/// in the trait; this fails to compile the day one of them stops being `Send`.
#[allow(dead_code)]
fn handle_futures_are_send(h: &Handle, msg: crate::message::Message) {
    use super::ops::StoreOps;
    fn assert_send<T: Send>(_: T) {}
    assert_send(h.put(msg.clone()));
    assert_send(h.put_batch(vec![msg]));
    assert_send(h.get("t", 0, 0, 1, 1));
    assert_send(h.look_by_offset(0));
    assert_send(h.look_by_msg_id(""));
    assert_send(h.queue_offsets("t", 0));
    assert_send(h.queue_offset_by_time("t", 0, 0));
    assert_send(h.earliest_message_time("t", 0));
    assert_send(h.query_by_key("t", "k", 1, 0, 0));
    assert_send(h.shard_status(0));
    assert_send(h.wait_dispatched());
    assert_send(h.flush());
    assert_send(h.delete_expired_files());
    assert_send(h.delete_topic("t"));
    assert_send(h.clean_unused_topics(vec![]));
    assert_send(h.run_at(0, "t", async |s, t| s.max_queue_offset(t, 0)));
    assert_send(h.run_on(0, |ctx| async move { ctx.store.max_log_offset() }));
}
