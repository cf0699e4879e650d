//! Timed messages: RocketMQ 5's `TimerMessageStore`, one per shard.
//!
//! A put with a delivery time (`TIMER_DELAY_SEC`, `TIMER_DELAY_MS`, `TIMER_DELIVER_MS`,
//! `__STARTDELIVERTIME`) is stored in `rmq_sys_wheel_timer` queue 0 of the shard that
//! took it, with `TIMER_OUT_MS` (`format::schedule`). Its ConsumeQueue tagsCode is its
//! *due time*: `max(TIMER_OUT_MS, store timestamp)` (`store/scheduled.rs`). This service
//! reads that queue into its pending set ([`pending`], [`runs`]) and delivers each
//! message when its due time has passed, through the same [`Deliverer`] as the delay
//! levels (a re-put into the real queue on whichever shard owns it).
//!
//! | file | RocketMQ | what |
//! |---|---|---|
//! | `mod.rs` | `TimerMessageStore` (its enqueue, dequeue and deliver services) | the task |
//! | `pending.rs` | `TimerWheel` | what is due first, in bounded memory |
//! | `runs.rs` | `TimerLog`, `TimerCheckpoint` | sorted runs on disk and their manifest |
//!
//! **Exactly once, by delivery order.** Messages are delivered one at a time in *key*
//! order, key = (due time, timer-queue offset), and each delivered record carries its
//! key as its position (lane [`TIMER_LANE`], `store/delivered.rs`). After a crash the
//! service resumes after the newest key any shard's log holds: a key at or below it was
//! delivered (the log keeps a prefix, and the [`Deliverer`] flushes before it switches
//! shards), a key above it was not. For that to hold, a key is delivered only when no
//! smaller key can still appear. Store timestamps never go backwards in a shard's log
//! and are taken when a record is appended, so a record appended after the moment `N`
//! has a due time of at least `N`. The service therefore takes `N = now`, waits until
//! dispatch has caught up with everything written at that moment, reads the queue to
//! its end, and only then delivers keys due before `N` ([`Store::timer_horizon`](crate::Store::timer_horizon)).
//! RocketMQ 5's timer is at-least-once: its checkpoint is written every second or so
//! and a crash repeats what was delivered since.
//!
//! A timer-queue entry RocketMQ wrote carries a tags hash (below `2^31`, never a due
//! time in epoch ms): its due time is read from the record. RocketMQ 5 keeps its own
//! timer progress in `timerlog/` and `config/timercheck`, which coremq does not read: on
//! a RocketMQ store, timed messages RocketMQ delivered already are delivered again.
//!
//! **Restart** rebuilds the pending set from the manifest's runs plus the timer queue
//! read again from the manifest's scan offset, skipping keys at or below the resume
//! point. A save (manifest) happens every `ScheduleConfig::timer_save_interval` (10 s)
//! while something changed, after every delivery so far and this shard's log are made
//! durable: nothing leaves the manifest's cover before the log holds its delivery, and
//! the manifest never covers a queue entry a power loss can take.
//!
//! **Time.** A message is never delivered before its due time (its delivered record's
//! store timestamp is later); normally within a millisecond or two of it. Timer
//! precision is the millisecond (RocketMQ 5 rounds to its 1 s wheel slot). A due time
//! more than [`DUE_WAIT_MAX`] ahead is looked at again after that long, so a forward
//! clock step is noticed.
//!
//! **Failures** as for delay levels (`crate::schedule`): a put the real queue refuses for
//! good, or a record that cannot be read, is skipped (error log); other refusals try the
//! same message again after 100 ms, and the messages behind it wait. A failed queue or
//! run read waits 10 s. A slave runs no timer.

mod pending;
mod runs;

use crate::format::schedule::{Position, TIMER_LANE, TIMER_OUT_MS, TIMER_TOPIC, timer_tags_code};
use crate::message::StoredMessage;
use crate::schedule::{Deliverer, Host, Outcome, Stop, newest_anywhere, read_scheduled};
use crate::wake::join_all;
use pending::Pending;
pub use pending::memory_bound;
use runs::Entry;
use std::collections::VecDeque;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// The directory, under a shard's root, of the timer's runs and manifest.
pub const TIMER_DIR: &str = "coremq_timer";
/// The longest sleep towards a due time.
const DUE_WAIT_MAX: Duration = Duration::from_secs(1);
/// After a refused put, the same message is tried again this much later.
const RETRY_AFTER: Duration = Duration::from_millis(100);
/// After a failed read of the queue, a run or the manifest.
const READ_FAILED_WAIT: Duration = Duration::from_secs(10);
/// Queue entries read at a time.
const BATCH: usize = 1024;
/// Due messages whose records are read together before they go out.
const READ_AHEAD: usize = 32;
/// Deliveries between looks at the queue (so that newly arrived messages are read
/// and the manifest is saved during a long backlog).
const DELIVER_RUN: usize = 4096;

/// Starts the timer of `host`'s shard on the current executor, attached to its store
/// (`crate::schedule::start` calls it when `ScheduleConfig::timer_enable` is on).
pub(crate) fn start<H: Host>(host: H, tq: glommio::TaskQueueHandle) -> crate::Result<()> {
    let store = host.store().clone();
    let stop = Rc::new(Stop::default());
    let join = glommio::spawn_local_into(run(host, stop.clone()), tq)
        .map_err(|e| crate::Error::Config(format!("cannot spawn the timer task: {e}")))?
        .detach();
    store.attach_service("timer", move || stop.trigger(), join);
    Ok(())
}

/// The service's state between steps.
struct Timer<H: Host> {
    host: H,
    pending: Pending,
    /// Next timer-queue offset to read.
    scan: u64,
    /// The newest key delivered (or skipped for good).
    last: Option<(i64, u64)>,
    /// Entries that arrived with a key at or below `last` (only after a backwards
    /// jump of the clock across a restart): delivered at once, out of order.
    late: Vec<Entry>,
    /// Due messages taken from the pending set, in key order, with their records
    /// (`None`: to be read again).
    ready: VecDeque<(Entry, Option<Result<StoredMessage, Outcome>>)>,
    deliverer: Deliverer<H>,
    last_save: Instant,
    save_every: Duration,
}

async fn run<H: Host>(host: H, stop: Rc<Stop>) {
    let store = host.store().clone();
    let lane = (host.shard() as u32, TIMER_LANE);
    let last = loop {
        match newest_anywhere(&host, lane).await {
            Ok(newest) => break newest.map(|(hi, lo)| (hi as i64, lo)),
            Err(e) => {
                tracing::warn!(error = %e, "timer: cannot read its progress yet");
                if !stop.sleep(Duration::from_secs(1)).await {
                    return;
                }
            }
        }
    };
    let cfg = store.config();
    let dir = cfg.root.join(TIMER_DIR);
    let cap = cfg.schedule.timer_memory_entries;
    let (pending, scan) = loop {
        match Pending::open(&cfg.disk, dir.clone(), cap).await {
            Ok(p) => break p,
            Err(e) => {
                tracing::error!(error = %e, "timer: cannot open its runs; trying again");
                if !stop.sleep(READ_FAILED_WAIT).await {
                    return;
                }
            }
        }
    };
    let max = store.max_queue_offset(TIMER_TOPIC, 0);
    let (mut pending, mut scan) = (pending, scan);
    let cleared = scan > max;
    if cleared {
        // Cannot happen while saves flush first; if it does, the runs may describe
        // records the log no longer holds.
        tracing::error!(
            scan,
            max,
            "timer: its manifest covers more of the timer queue than the store holds; \
             dropping its runs and reading the whole queue again"
        );
        pending.clear();
        scan = 0;
    }
    let mut t = Timer {
        deliverer: Deliverer::new(host.clone()),
        host,
        pending,
        scan: scan.max(store.min_queue_offset(TIMER_TOPIC, 0)),
        last,
        late: Vec::new(),
        ready: VecDeque::new(),
        last_save: Instant::now(),
        save_every: cfg.schedule.timer_save_interval,
    };
    if cleared && let Err(e) = t.save().await {
        tracing::error!(error = %e, "timer: cannot save its emptied manifest");
    }
    // The queue read again from the manifest's scan offset: keys at or below `last`
    // were delivered (they are no late arrivals).
    while t.scan < store.max_queue_offset(TIMER_TOPIC, 0) {
        if let Err(e) = t.read_queue(false).await {
            tracing::error!(offset = t.scan, error = %e, "timer: queue read failed at open");
            if !stop.sleep(READ_FAILED_WAIT).await {
                return;
            }
        }
    }
    tracing::info!(
        shard = t.host.shard(),
        pending = t.pending.len(),
        runs = t.pending.runs(),
        memory_bound_bytes = memory_bound(cap),
        resume_after = ?t.last,
        "timer started"
    );
    while !stop.is_stopped() {
        match t.step(&stop).await {
            Ok(()) => {}
            Err(e) => {
                tracing::error!(error = %e, "timer: read failed; trying again");
                if !stop.sleep(READ_FAILED_WAIT).await {
                    break;
                }
            }
        }
    }
    // A clean stop saves what it has, so the next open reads little of the queue again.
    if t.deliverer.settle().await.is_ok()
        && let Err(e) = t.save().await
    {
        tracing::warn!(error = %e, "timer: final save failed");
    }
}

/// The timer-queue record of `e`; skipped when the log holds another record there (a
/// run or manifest that outlived what it described).
async fn read_entry(store: &crate::Store, e: Entry) -> Result<StoredMessage, Outcome> {
    let r = read_scheduled(store, e.phys).await?;
    if r.topic != TIMER_TOPIC || r.queue_offset != e.offset {
        return Err(Outcome::Skipped(format!(
            "the record at {} is {}/{} offset {}, not timer entry {}",
            e.phys, r.topic, r.queue_id, r.queue_offset, e.offset
        )));
    }
    Ok(r)
}

impl<H: Host> Timer<H> {
    /// Reads the timer queue from `scan` to its end into the pending set (at most
    /// [`BATCH`] entries a call). `live`: a key at or below `last` is a late arrival.
    async fn read_queue(&mut self, live: bool) -> crate::Result<()> {
        let store = self.host.store();
        let entries = store
            .queue_entries(TIMER_TOPIC, 0, self.scan, BATCH)
            .await?;
        for (i, c) in entries.iter().enumerate() {
            let offset = self.scan + i as u64;
            let due = if c.tags_code > i32::MAX as i64 {
                c.tags_code
            } else {
                // RocketMQ wrote this entry (its tagsCode is a tags hash): the due time
                // comes from the record.
                match read_scheduled(store, c.phys_offset as u64).await {
                    Ok(r) => timer_tags_code(r.property(TIMER_OUT_MS), r.store_timestamp_ms)
                        .unwrap_or(r.store_timestamp_ms),
                    Err(Outcome::Retry(why)) => {
                        return Err(crate::Error::Failed(format!("timer: {why}")));
                    }
                    Err(_) => {
                        tracing::error!(offset, "timer: no readable record; skipped");
                        continue;
                    }
                }
            };
            let e = Entry {
                due,
                offset,
                phys: c.phys_offset as u64,
            };
            if self.last.is_some_and(|l| (e.due, e.offset) <= l) {
                if live {
                    tracing::error!(
                        offset = e.offset,
                        due = e.due,
                        "timer: a message arrived due before one already delivered; \
                         delivering it now"
                    );
                    self.late.push(e);
                }
                continue;
            }
            self.pending.insert(e).await?;
        }
        self.scan += entries.len() as u64;
        Ok(())
    }

    /// Reads the queue to its end.
    async fn read_all(&mut self, stop: &Stop) -> crate::Result<()> {
        while !stop.is_stopped() && self.scan < self.host.store().max_queue_offset(TIMER_TOPIC, 0) {
            self.read_queue(true).await?;
            glommio::yield_if_needed().await;
        }
        // Entries below the queue's minimum were removed (retention).
        self.scan = self
            .scan
            .max(self.host.store().min_queue_offset(TIMER_TOPIC, 0));
        Ok(())
    }

    /// The scan offset a save writes: the next entry to read, lowered to the smallest
    /// entry held in memory or in `ready` (those are in no run).
    fn save_scan(&self) -> u64 {
        self.pending
            .memory_min_offset()
            .into_iter()
            .chain(self.ready.iter().map(|(e, _)| e.offset))
            .fold(self.scan, u64::min)
    }

    /// Saves the manifest (after making every delivery durable).
    async fn save(&mut self) -> crate::Result<()> {
        let scan = self.save_scan();
        if !self.pending.needs_save(scan) {
            self.last_save = Instant::now();
            return Ok(());
        }
        self.deliverer
            .settle()
            .await
            .map_err(|why| crate::Error::Failed(format!("timer: before a save: {why}")))?;
        // The entries below `scan`, and those in runs, must outlive a power loss: in
        // async flush mode they may be dispatched before they are durable, and a log
        // that lost them would give their queue offsets to other messages.
        self.host.store().flush().await?;
        self.pending.save(scan).await?;
        self.last_save = Instant::now();
        tracing::debug!(
            pending = self.pending.len(),
            in_memory = self.pending.in_memory(),
            runs = self.pending.runs(),
            scan,
            "timer: saved"
        );
        Ok(())
    }

    /// One round: read what arrived, deliver what is due, save when it is time, sleep
    /// until the next due time or arrival.
    async fn step(&mut self, stop: &Stop) -> crate::Result<()> {
        let store = self.host.store().clone();
        self.read_all(stop).await?;
        while let Some(&e) = self.late.first() {
            let record = read_entry(&store, e).await;
            if self.deliver_one(e, &record, stop).await.is_err() {
                return Ok(());
            }
            self.late.remove(0);
        }
        if self.last_save.elapsed() >= self.save_every {
            self.save().await?;
        }
        // Drop keys already delivered (a run read again after a restart).
        while let Some(e) = self.pending.peek()
            && self.last.is_some_and(|l| (e.due, e.offset) <= l)
        {
            self.pending.pop().await?;
        }
        let now = crate::now_ms();
        if let Some(&(e, _)) = self.ready.front() {
            // Taken under an earlier horizon; still first in key order.
            return self.deliver_due(e.due + 1, stop).await;
        }
        match self.pending.peek() {
            Some(first) if first.due < now => {
                // Everything due before `horizon` is in the queue now (module docs).
                let horizon = store.timer_horizon().await;
                self.read_all(stop).await?;
                self.deliver_due(horizon, stop).await
            }
            first => {
                let save_in = if self.pending.needs_save(self.save_scan()) {
                    self.save_every.saturating_sub(self.last_save.elapsed())
                } else {
                    Duration::MAX
                };
                let due_in = first.map_or(Duration::MAX, |f| {
                    Duration::from_millis((f.due + 1 - now).max(1) as u64).min(DUE_WAIT_MAX)
                });
                let wait = due_in.min(save_in);
                let arrived = async {
                    store.timer_arrival().await;
                    true
                };
                if wait == Duration::MAX {
                    futures_lite::future::or(arrived, async {
                        stop.sleep(Duration::from_secs(3600)).await
                    })
                    .await;
                } else {
                    futures_lite::future::or(arrived, stop.sleep(wait)).await;
                }
                Ok(())
            }
        }
    }

    fn position(&self, e: Entry) -> Position {
        Position {
            shard: self.host.shard() as u32,
            lane: TIMER_LANE,
            hi: e.due as u64,
            lo: e.offset,
        }
    }

    /// Delivers, in key order, the pending messages due before `horizon`: up to
    /// [`READ_AHEAD`] at a time leave the pending set for `ready`, their records read
    /// together, then go out one by one.
    async fn deliver_due(&mut self, horizon: i64, stop: &Stop) -> crate::Result<()> {
        let mut budget = DELIVER_RUN;
        while budget > 0 && !stop.is_stopped() {
            if self.ready.is_empty() {
                self.take_ready(horizon).await?;
                if self.ready.is_empty() {
                    return Ok(());
                }
            }
            while let Some((e, record)) = self.ready.pop_front() {
                let record = match record {
                    Some(r) => r,
                    None => read_entry(self.host.store(), e).await,
                };
                match self.deliver_one(e, &record, stop).await {
                    Ok(()) => {
                        budget = budget.saturating_sub(1);
                        // A local put may finish without waiting: give the shard back
                        // when its time slice is up (a backlog ran 150 ms in one go).
                        glommio::yield_if_needed().await;
                    }
                    Err(read_again) => {
                        let keep = (!read_again).then_some(record);
                        self.ready.push_front((e, keep));
                        return Ok(());
                    }
                }
            }
        }
        Ok(())
    }

    /// Moves the next messages due before `horizon` (at most [`READ_AHEAD`]) to
    /// `ready`, with their records.
    async fn take_ready(&mut self, horizon: i64) -> crate::Result<()> {
        let mut take = Vec::new();
        while take.len() < READ_AHEAD
            && let Some(e) = self.pending.peek()
            && e.due < horizon
        {
            self.pending.pop().await?;
            if self.last.is_some_and(|l| (e.due, e.offset) <= l)
                || take
                    .last()
                    .is_some_and(|t: &Entry| (t.due, t.offset) == (e.due, e.offset))
            {
                continue;
            }
            take.push(e);
        }
        let store = self.host.store();
        let reads = take.iter().map(|e| read_entry(store, *e)).collect();
        let records = join_all(reads).await;
        self.ready
            .extend(take.into_iter().zip(records).map(|(e, r)| (e, Some(r))));
        Ok(())
    }

    /// Delivers one message (its record read, or why not). `Err` when it must be tried
    /// again after a pause: `true` when its record must be read again.
    async fn deliver_one(
        &mut self,
        e: Entry,
        record: &Result<StoredMessage, Outcome>,
        stop: &Stop,
    ) -> Result<(), bool> {
        let pos = self.position(e);
        let outcome = match record {
            Ok(r) => self.deliverer.deliver(r, pos).await,
            Err(o) => o.clone(),
        };
        match outcome {
            Outcome::Delivered => {}
            Outcome::Skipped(why) => tracing::error!(
                offset = e.offset,
                due = e.due,
                why,
                "timer: a timed message cannot be delivered; skipped"
            ),
            Outcome::Retry(why) => {
                tracing::warn!(
                    offset = e.offset,
                    why,
                    "timer: delivery refused; trying again"
                );
                stop.sleep(RETRY_AFTER).await;
                return Err(record.is_err());
            }
        }
        let key = (e.due, e.offset);
        self.last = Some(self.last.map_or(key, |l| l.max(key)));
        Ok(())
    }
}
