//! Delayed delivery: RocketMQ's `ScheduleMessageService`, one per shard.
//!
//! A put with a delay level is stored in `SCHEDULE_TOPIC_XXXX` queue `level - 1` of the
//! shard that took it, with its delivery time as the queue entry's tagsCode
//! (`format::schedule`, `store/scheduled.rs`). Here one task per level walks that
//! queue in order: an entry whose time has come is read and put again into its real
//! queue, on whichever shard owns it ([`deliver`]); the first entry not yet due
//! stops the walk until its time (a level's entries are due in queue order). So a
//! message is never delivered before its time, and normally within milliseconds of it.
//!
//! | file | RocketMQ | what |
//! |---|---|---|
//! | `mod.rs` | `ScheduleMessageService`, `DeliverDelayedMessageTimerTask` | a task per level |
//! | `deliver.rs` | `messageTimeUp` | the delivered message, and putting it |
//! | `host.rs` | (none) | the store and the shards around the service |
//!
//! **Progress** is the store's delivered-positions table (`store/delivered.rs`),
//! rebuilt from the log at every open and written to `config/delayOffset.json` in
//! RocketMQ's format: a task starts after the newest delivery of its level held by any
//! shard, so a crash (kill -9 or power loss, either flush mode) never makes a delayed
//! message delivered twice, nor lost (proved by `tests/schedule_crash.rs`). RocketMQ
//! persists its progress every 10 s and may deliver again what it delivered since.
//!
//! **Failures** (RocketMQ 5's rules): a put the real queue refuses for good (illegal,
//! properties too long) or a record that cannot be read skips that entry, logged at
//! error level; any other refusal (shutting down, disk full, busy) tries the same
//! entry again after 100 ms; a failed queue read after 10 s.
//!
//! A slave runs no delivery (RocketMQ's runs on masters only); its log holds the
//! deliveries its master made, so its table is current when it is promoted.

mod deliver;
mod host;

pub(crate) use deliver::{Deliverer, Outcome};
pub use host::{Host, Solo};

use crate::format::delay_offset::Lane;
use crate::format::schedule::{Position, SCHEDULE_TOPIC};
use crate::message::StoredMessage;
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::task::{Poll, Waker};
use std::time::Duration;

/// An idle level sleeps until dispatch appends to its queue (`Store::schedule_arrival`),
/// and looks anyway this often (RocketMQ polls every 100 ms: 18 levels a shard made
/// 180 wake-ups a second of an idle store, most of its idle CPU). The idle levels of a
/// shard look at one shared tick (`crate::shard::tick`), so they wake their shard
/// once per period, not once each.
pub(crate) const IDLE_POLL: Duration = Duration::from_secs(10);
/// The longest sleep towards an entry's due time (a clock step shortens it); the levels
/// of a shard end such sleeps at one shared tick.
pub(crate) const DUE_WAIT_MAX: Duration = Duration::from_secs(1);
/// After a refused put, the same entry is tried again this much later (RocketMQ: 100 ms).
const RETRY_AFTER: Duration = Duration::from_millis(100);
/// After a failed queue read (RocketMQ's `DELAY_FOR_A_PERIOD`).
const READ_FAILED_WAIT: Duration = Duration::from_secs(10);
/// Entries read from a level's queue at a time.
const BATCH: usize = 64;

/// The stop signal the services of one shard share: wakes every sleeping task.
#[derive(Default)]
pub(crate) struct Stop {
    stopped: Cell<bool>,
    wakers: RefCell<Vec<Waker>>,
}

impl Stop {
    pub(crate) fn trigger(&self) {
        self.stopped.set(true);
        for w in self.wakers.borrow_mut().drain(..) {
            w.wake();
        }
    }

    pub(crate) fn is_stopped(&self) -> bool {
        self.stopped.get()
    }

    /// Sleeps for `d`, or less when stopped; returns whether to go on.
    pub(crate) async fn sleep(&self, d: Duration) -> bool {
        let stopped = std::future::poll_fn(|cx| {
            if self.stopped.get() {
                Poll::Ready(())
            } else {
                let mut w = self.wakers.borrow_mut();
                if !w.iter().any(|x| x.will_wake(cx.waker())) {
                    w.push(cx.waker().clone());
                }
                Poll::Pending
            }
        });
        futures_lite::future::or(stopped, glommio::timer::sleep(d)).await;
        !self.stopped.get()
    }
}

/// Starts the delivery tasks of `host`'s shard (one per delay level, and the timer of
/// timed messages, `crate::timer`, when `ScheduleConfig::timer_enable` is on) on the current
/// executor, attached to its store so that its shutdown stops them. A sharded store
/// calls this on every master shard at open (`ScheduleConfig::deliver`); a single
/// [`Store`](crate::Store) user calls it with [`Solo`].
pub fn start<H: Host>(host: H) -> crate::Result<()> {
    let store = host.store().clone();
    let levels = store.delay_levels().clone();
    let stop = Rc::new(Stop::default());
    let tq = crate::shard::turns::task_queue(
        "schedule (delay levels, timer)",
        200,
        // A due message should go out within milliseconds, even while puts keep the
        // shard busy.
        glommio::Latency::Matters(Duration::from_millis(10)),
        store.config().background_turn,
    );
    for level in 1..=levels.count() {
        let delay = Duration::from_millis(levels.delay_ms(level).unwrap_or(1000));
        let task = run_level(host.clone(), level, delay, stop.clone());
        let join = glommio::spawn_local_into(task, tq)
            .map_err(|e| crate::Error::Config(format!("cannot spawn a schedule task: {e}")))?
            .detach();
        let stop = stop.clone();
        store.attach_service("schedule", move || stop.trigger(), join);
    }
    if store.config().schedule.timer_enable {
        crate::timer::start(host, tq)?;
    }
    Ok(())
}

/// Where `lane` resumes: after the newest delivery any shard holds.
pub(crate) async fn newest_anywhere<H: Host>(
    host: &H,
    lane: Lane,
) -> crate::Result<Option<(u64, u64)>> {
    let mut newest = None;
    let shards: Vec<usize> = if host.shards() == 1 {
        vec![host.shard()]
    } else {
        (0..host.shards()).collect()
    };
    for s in shards {
        newest = newest.max(host.newest_delivery(s, lane).await?);
    }
    Ok(newest)
}

async fn run_level<H: Host>(host: H, level: i32, delay: Duration, stop: Rc<Stop>) {
    let store = host.store().clone();
    let queue = level - 1;
    let lane: Lane = (host.shard() as u32, level as u32);
    let mut next = loop {
        match newest_anywhere(&host, lane).await {
            Ok(newest) => break newest.map_or(0, |(hi, _)| hi + 1),
            Err(e) => {
                tracing::warn!(level, error = %e, "schedule: cannot read the level's progress yet");
                if !stop.sleep(Duration::from_secs(1)).await {
                    return;
                }
            }
        }
    };
    let (min, max) = (
        store.min_queue_offset(SCHEDULE_TOPIC, queue),
        store.max_queue_offset(SCHEDULE_TOPIC, queue),
    );
    if next > max && max > 0 {
        tracing::error!(
            level,
            next,
            max,
            "schedule: delivered past the queue's end; resuming at its end"
        );
        next = max;
    }
    next = next.max(min);
    let mut deliverer = Deliverer::new(host.clone());
    let delay_ms = delay.as_millis() as i64;
    while !stop.is_stopped() {
        let entries = match store
            .queue_entries(SCHEDULE_TOPIC, queue, next, BATCH)
            .await
        {
            Ok(e) => e,
            Err(e) => {
                tracing::error!(level, offset = next, error = %e, "schedule: queue read failed");
                if !stop.sleep(READ_FAILED_WAIT).await {
                    return;
                }
                continue;
            }
        };
        if entries.is_empty() {
            let arrived = async {
                store.schedule_arrival(level).await;
                true
            };
            if !futures_lite::future::or(arrived, stop.sleep(crate::shard::tick::until(IDLE_POLL)))
                .await
                || stop.is_stopped()
            {
                return;
            }
            // Entries below the queue's minimum were removed (retention).
            next = next.max(store.min_queue_offset(SCHEDULE_TOPIC, queue));
            continue;
        }
        for e in entries {
            if stop.is_stopped() {
                return;
            }
            let now = crate::now_ms();
            // A time further ahead than the level's delay means the clock went back:
            // RocketMQ delivers it now.
            let due = if e.tags_code - now > delay_ms {
                now
            } else {
                e.tags_code
            };
            if due > now {
                // Up to the shared tick: the levels that wait for far entries (a
                // consumer's retries) wake their shard together.
                let wait = Duration::from_millis((due - now) as u64)
                    .min(crate::shard::tick::until(DUE_WAIT_MAX));
                if !stop.sleep(wait).await {
                    return;
                }
                break;
            }
            let pos = Position {
                shard: lane.0,
                lane: lane.1,
                hi: next,
                lo: 0,
            };
            let outcome = match read_scheduled(&store, e.phys_offset as u64).await {
                Ok(r) => deliverer.deliver(&r, pos).await,
                Err(outcome) => outcome,
            };
            match outcome {
                Outcome::Delivered => next += 1,
                Outcome::Skipped(why) => {
                    tracing::error!(
                        level,
                        offset = next,
                        why,
                        "schedule: a delayed message cannot be delivered; skipped"
                    );
                    next += 1;
                }
                Outcome::Retry(why) => {
                    tracing::warn!(
                        level,
                        offset = next,
                        why,
                        "schedule: delivery refused; trying again"
                    );
                    if !stop.sleep(RETRY_AFTER).await {
                        return;
                    }
                    break;
                }
            }
        }
    }
}

/// The scheduled record at `offset`; an outcome when it cannot be read: skipped when
/// no valid record is there (removed by retention, damaged), tried again after an
/// I/O error.
pub(crate) async fn read_scheduled(
    store: &crate::Store,
    offset: u64,
) -> Result<StoredMessage, Outcome> {
    match store.read_record(offset).await {
        Ok(Some(raw)) => StoredMessage::decode(&raw)
            .map_err(|e| Outcome::Skipped(format!("the record at {offset} does not decode: {e}"))),
        Ok(None) => Err(Outcome::Skipped(format!(
            "no record at {offset} (removed or damaged)"
        ))),
        Err(e) => Err(Outcome::Retry(format!(
            "reading the record at {offset}: {e}"
        ))),
    }
}
