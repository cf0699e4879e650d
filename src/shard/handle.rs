//! [`Handle`]: the `Send + Sync + Clone` way into every shard, from any thread (plain,
//! tokio, another shard's executor).
//!
//! coremq's own (RocketMQ's broker calls its one `DefaultMessageStore` directly). The
//! store's operations come from [`StoreOps`](super::StoreOps); this file is the
//! transport under them, and the only code that knows it: [`Route::run_at`] sends a
//! request, [`serve`] is the shard's end.
//!
//! * **Transport.** Each shard reads a bounded flume channel (glommio's own dependency
//!   for cross-thread channels; glommio wakes the parked executor through its eventfd).
//!   A request is one boxed job holding the operation's closure, its owned arguments
//!   and the reply sender; on the shard it starts the work as a task, so a slow request
//!   does not hold up the next. The reply comes back on a one-slot flume channel. A
//!   full channel makes senders wait (`ShardedConfig::channel_capacity`).
//! * **Failure isolation.** A shard whose thread is gone (shut down, or its executor
//!   died with a panicking task) is marked dead; requests to it fail at once with
//!   [`Error::ShardUnavailable`] and the other shards go on. A request queued when the
//!   shard died is dropped with its reply sender, which its caller sees as the same
//!   error rather than waiting for ever.

use super::ops::Route;
use super::ownership::Ownership;
use crate::error::{Error, Result};
use crate::store::Store;
use std::borrow::Borrow;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Called on the shard's thread with its store; starts the request there as a task.
type Job = Box<dyn FnOnce(&Store) + Send>;

pub(super) enum Request {
    Job(Job),
    /// Shut the shard's store down, answer, and stop serving.
    Shutdown(flume::Sender<Result<()>>),
}

/// A shard's end of its request channel.
pub(super) type Inbox = flume::Receiver<Request>;

pub(super) struct Shared {
    senders: Vec<flume::Sender<Request>>,
    /// The store's ownership rule (`store.meta`).
    ownership: Ownership,
    /// Cleared when a shard's thread ends (even by a panic), see `sharded_store::Alive`.
    pub(super) alive: Vec<AtomicBool>,
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
    /// shards' ends of those channels.
    pub(super) fn new(
        shards: usize,
        capacity: usize,
        ownership: Ownership,
    ) -> (Handle, Vec<Inbox>) {
        let (senders, inboxes) = (0..shards).map(|_| flume::bounded(capacity)).unzip();
        let shared = Shared {
            senders,
            ownership,
            alive: (0..shards).map(|_| AtomicBool::new(true)).collect(),
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
            let (reply, answer) = flume::bounded(1);
            let job: Job = Box::new(move |store: &Store| {
                let store = store.clone();
                let task = async move {
                    // A dropped reply means the caller gave up; nothing to do then.
                    let _ = reply.send(f(&store, args.borrow()).await);
                };
                glommio::spawn_local(task).detach();
            });
            tx.send_async(Request::Job(job))
                .await
                .map_err(|_| gone(shard))?;
            reply_from(&answer, shard).await
        }
    }
}

/// The shard's end: runs each job as it arrives until asked to shut down.
pub(super) async fn serve(inbox: &Inbox, store: Store) {
    while let Ok(req) = inbox.recv_async().await {
        match req {
            Request::Job(job) => job(&store),
            Request::Shutdown(reply) => {
                let _ = reply.send(store.clone().shutdown().await);
                return;
            }
        }
    }
}

/// Waits for a shard's reply. flume 0.10's `recv_async` can answer `Disconnected`
/// while the reply sits in the channel, when the sender sends and drops between two
/// of its checks (zesterer/flume#120, fixed in flume 0.11): a request that was served
/// looked like a dead shard (found by tests/crash_loop.rs, a `query_by_key` failing
/// with "shard 1 is unavailable" while every shard was up). coremq now uses flume
/// 0.11; the second look stays as a cheap guard before calling the shard gone.
async fn reply_from<T>(rx: &flume::Receiver<T>, shard: usize) -> Result<T> {
    match rx.recv_async().await {
        Ok(v) => Ok(v),
        Err(_) => rx.try_recv().map_err(|_| gone(shard)),
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
