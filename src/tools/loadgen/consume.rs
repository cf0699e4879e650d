//! Tailing consumers (RocketMQ's benchmark `Consumer`, reading as a long-polling pull
//! would): one per queue, on the shard owning it, reading every record from the
//! queue's end at the start of the run as soon as it is visible, and timing each from
//! the send time its body carries.
//!
//! A watcher task per shard wakes them when dispatch made new records visible (what
//! the node's "message arriving" hook does for held pulls). With `--via local` the
//! shard's own producers tell it a put arrived and to which queue, and only that
//! queue's consumer is woken, as the node signals a held pull per queue (waking every
//! consumer of the shard for each record, as it did, cost 32 task wakes and queue
//! lookups per put at moderate rates: ~28% of the shards' samples at 25% of the
//! closed loop, and put p50 8.6 us there against 1.9 since). With `--via handle` the
//! puts arrive as requests the watcher cannot see, so once dispatch has caught up it
//! waits for dispatch to go further (`Store::wait_dispatched_past`; it looked every
//! 100 us before, 10,000 wakes a second) and wakes every consumer.

use super::local::Shard;
use super::measure::now_ns;
use crate::GetStatus;
use crate::format::record::{self, Decoded, Verify};
use std::cell::{Cell, RefCell};
use std::future::Future;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::task::{Poll, Waker};

/// Records a consumer asks for per `get` (RocketMQ's default pull batch).
const PULL_BATCH: usize = 32;

/// Decoding records `get` returned: it verified them already, and where each lies is
/// not known here, so only the framing is decoded.
pub(super) const RETURNED: Verify = Verify {
    crc: false,
    at_offset: None,
    max_total_size: usize::MAX,
    require_record_crc: false,
};

/// A one-shard broadcast: every waiter wakes on the next `notify`.
#[derive(Default)]
pub(super) struct Signal {
    generation: Cell<u64>,
    wakers: RefCell<Vec<Waker>>,
}

impl Signal {
    pub fn notify(&self) {
        self.generation.set(self.generation.get() + 1);
        let wakers = std::mem::take(&mut *self.wakers.borrow_mut());
        for w in wakers {
            w.wake();
        }
    }

    /// Resolves at the first `notify` after this call.
    pub fn changed(&self) -> impl Future<Output = ()> + '_ {
        let seen = self.generation.get();
        std::future::poll_fn(move |cx| {
            if self.generation.get() != seen {
                Poll::Ready(())
            } else {
                self.wakers.borrow_mut().push(cx.waker().clone());
                Poll::Pending
            }
        })
    }
}

/// Wakes the consumers whenever newly written records have been dispatched, and marks
/// the shard drained once the producers are done and everything is visible.
pub(super) async fn watch_dispatch(shard: Rc<Shard>) {
    let store = &shard.store;
    let mut announced = store.dispatched_log_offset();
    loop {
        if let Some(f) = store.failure() {
            shard.error(format!("store failed: {f}"));
            break;
        }
        // The dispatcher may have run before this task: announce whatever it
        // dispatched since the last round, waited for or not.
        let dispatched = store.dispatched_log_offset();
        if shard.local_producers {
            shard.notify_dispatched(dispatched);
        } else if dispatched > announced {
            shard.notify_all();
        }
        announced = announced.max(dispatched);
        if dispatched < store.max_log_offset() {
            store.wait_dispatched().await;
            continue;
        }
        if !shard.producing.get() || shard.stop_consumers.get() {
            break;
        }
        if shard.local_producers {
            shard.arrival.changed().await;
        } else {
            // Puts through the handle are not seen here: wake when dispatch goes past
            // what was announced, or when the producers are done.
            futures_lite::future::or(
                async {
                    store.wait_dispatched_past(announced).await;
                },
                shard.arrival.changed(),
            )
            .await;
        }
    }
    shard.drained.set(true);
    shard.notify_all();
}

/// A tailing consumer of one queue: reads every record from `from` on as soon as it
/// is visible and records its end-to-end latency.
pub(super) async fn consume(shard: Rc<Shard>, slot: usize, topic: String, q: i32, from: u64) {
    let store = &shard.store;
    let mut offset = from;
    loop {
        if shard.stop_consumers.get() {
            return;
        }
        if offset >= store.max_queue_offset(&topic, q) {
            if shard.drained.get() {
                return;
            }
            shard.visible[slot].changed().await;
            continue;
        }
        let got = match store.get(&topic, q, offset, PULL_BATCH, 1 << 20).await {
            Ok(got) => got,
            Err(e) => {
                shard.error(format!("get {topic}/{q} at {offset}: {e}"));
                return;
            }
        };
        if got.status != GetStatus::Found {
            shard.error(format!(
                "get {topic}/{q} at {offset}: {:?} (queue {}..{})",
                got.status, got.min_offset, got.max_offset
            ));
            return;
        }
        let seen = now_ns();
        {
            let mut hist = shard.e2e_latency.borrow_mut();
            for raw in &got.records {
                let sent = match record::decode(raw, RETURNED) {
                    Ok(Decoded::Record(r)) if r.body.len() >= 8 => {
                        u64::from_le_bytes(r.body[..8].try_into().expect("8 bytes"))
                    }
                    _ => {
                        shard.error(format!("{topic}/{q}: a record does not decode"));
                        continue;
                    }
                };
                hist.saturating_record(seen.saturating_sub(sent));
            }
        }
        shard
            .counters()
            .consumed
            .fetch_add(got.records.len() as u64, Ordering::Relaxed);
        offset = got.next_begin_offset;
        glommio::yield_if_needed().await;
    }
}
