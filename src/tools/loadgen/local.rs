//! What a produce run does on each shard, sent there with `Handle::run_on`: the
//! shard's producers with `--via local` (each putting to the shard's own `Store`, the
//! path with no hop), its tailing consumers, and a monitor publishing the shard's log
//! positions for the progress line and `--kill-after-flush`.
//!
//! Producers and consumers get task queues of their own with equal shares, so neither
//! starves the other nor the store's background tasks (the executor preempts a queue
//! after `PREEMPT_TIMER`).

use super::config::Via;
use super::consume::{Signal, consume, watch_dispatch};
use super::measure::{now_ns, thread_cpu_seconds};
use super::plan::{Plan, ShardCounters};
use super::produce::{LaneStats, Produced, Producer, PutPath, lane};
use super::report::new_histogram;
use crate::{Message, PutStatus, ShardContext, Store};
use glommio::{Latency, Shares, executor, spawn_local_into};
use hdrhistogram::Histogram;
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// How often the monitor publishes the store's positions.
const MONITOR_INTERVAL: Duration = Duration::from_millis(100);

/// One shard's state during a produce run, shared by its tasks.
pub(super) struct Shard {
    pub index: usize,
    pub store: Store,
    pub plan: Arc<Plan>,
    /// Whether this shard's producers run on it (`--via local`).
    pub local_producers: bool,
    pub e2e_latency: RefCell<Histogram<u64>>,
    first_error: RefCell<Option<String>>,
    /// Local producers notify after every put, for the dispatch watcher.
    pub arrival: Signal,
    /// New records of the shard's queue `i` (`plan.owned[index][i]`) are visible to
    /// `get`: its consumer's signal.
    pub visible: Vec<Signal>,
    /// The puts local producers made whose consumers were not told yet.
    untold: RefCell<Untold>,
    pub producing: Cell<bool>,
    /// Everything put is visible: consumers may stop once they have read it.
    pub drained: Cell<bool>,
    /// The drain timeout passed: consumers stop where they are.
    pub stop_consumers: Cell<bool>,
}

impl Shard {
    pub fn counters(&self) -> &ShardCounters {
        &self.plan.counters[self.index]
    }

    pub fn error(&self, what: String) {
        self.first_error.borrow_mut().get_or_insert(what);
    }

    /// A local producer's put to the shard's queue `i` (`plan.owned[index][i]`)
    /// returned: its record lies below the log's end now.
    fn mark_put(&self, i: usize) {
        let end = self.store.max_log_offset().max(1);
        self.untold.borrow_mut().put(i, end);
    }

    /// Wakes the consumers of the queues with a put below `dispatched` not told yet.
    pub fn notify_dispatched(&self, dispatched: u64) {
        self.untold
            .borrow_mut()
            .tell(dispatched, |i| self.visible[i].notify());
    }

    /// Wakes every consumer of the shard.
    pub fn notify_all(&self) {
        self.visible.iter().for_each(Signal::notify);
    }
}

/// The queues (by slot) local producers put to whose consumers were not told yet,
/// each listed once, with the log's end after the first and after the last such put
/// ((0, 0): not listed).
struct Untold {
    listed: Vec<usize>,
    ends: Vec<(u64, u64)>,
}

impl Untold {
    fn new(queues: usize) -> Untold {
        Untold {
            listed: Vec::new(),
            ends: vec![(0, 0); queues],
        }
    }

    /// A put to queue `i` returned with the log's end at `end` (> 0).
    fn put(&mut self, i: usize, end: u64) {
        if self.ends[i].0 == 0 {
            self.listed.push(i);
            self.ends[i].0 = end;
        }
        self.ends[i].1 = end;
    }

    /// Tells (`wake`) each queue with an untold put below `dispatched`; a queue with
    /// later puts stays listed until those are below it too. (Telling a queue only once
    /// all its puts were below `dispatched` told none while producers kept putting to
    /// every queue: dispatch, tens of MB behind the writer, never passed the latest
    /// put's end, and a closed loop's consumers read nothing until the producers
    /// stopped.)
    fn tell(&mut self, dispatched: u64, mut wake: impl FnMut(usize)) {
        let ends = &mut self.ends;
        self.listed.retain(|&i| {
            let (first, last) = ends[i];
            if first > dispatched {
                return true;
            }
            wake(i);
            if last > dispatched {
                ends[i] = (last, last);
                return true;
            }
            ends[i] = (0, 0);
            false
        });
    }
}

/// What one shard measured.
pub(super) struct ShardResult {
    /// The shard's own producers (`--via local`; none on a shard owning no queue).
    pub produced: Option<Produced>,
    /// Messages consumed by the time the producers were done.
    pub consumed_while_producing: u64,
    pub log_bytes: u64,
    pub first_error: Option<String>,
    pub e2e_latency: Histogram<u64>,
    /// The shard thread's CPU from its start to the producers' end (its own producers'
    /// work included with `--via local`; its io_uring workers not).
    pub producing_cpu_seconds: f64,
}

/// Puts on the shard that owns the queue: `Store::put` by reference, so a lane
/// refills the same messages.
struct LocalPuts(Rc<Shard>);

impl PutPath for LocalPuts {
    async fn put(&self, msgs: &mut Vec<Message>) -> PutStatus {
        if self.0.plan.cfg.pace_only {
            // The floor under a paced put (`--pace-only`): its schedule, no put.
            return PutStatus::PutOk;
        }
        if msgs.len() == 1 {
            self.0.store.put(&msgs[0]).await.status
        } else {
            self.0.store.put_batch(msgs).await.status
        }
    }

    async fn sleep_until(&self, ns: u64) {
        glommio::timer::sleep(Duration::from_nanos(ns.saturating_sub(now_ns()))).await;
    }

    /// Every outstanding put is its own request: take turns, as a broker serving
    /// requests would, rather than let one lane run until the pool is full.
    async fn after_put(&self, slot: usize) {
        if self.0.plan.cfg.consumers {
            // A local producer's queue list is its shard's `owned` list.
            self.0.mark_put(slot);
            self.0.arrival.notify();
        }
        futures_lite::future::yield_now().await;
    }
}

/// A produce run's work on shard `ctx.shard`, until its producers are done and its
/// consumers have read everything (or the drain timeout passed).
pub(super) async fn shard_job(ctx: ShardContext, plan: Arc<Plan>) -> ShardResult {
    let index = ctx.shard;
    let store = ctx.store;
    let local: Vec<usize> = plan.producers_on(index).collect();
    let shard = Rc::new(Shard {
        index,
        store: store.clone(),
        plan: plan.clone(),
        local_producers: plan.cfg.via == Via::Local,
        e2e_latency: RefCell::new(new_histogram()),
        first_error: RefCell::new(None),
        arrival: Signal::default(),
        visible: plan.owned[index]
            .iter()
            .map(|_| Signal::default())
            .collect(),
        untold: RefCell::new(Untold::new(plan.owned[index].len())),
        producing: Cell::new(true),
        drained: Cell::new(false),
        stop_consumers: Cell::new(false),
    });
    if plan.cfg.fill_segments > 0
        && let Err(e) = fill_and_retire(&store, &plan, index).await
    {
        shard.error(format!("filling and retiring segments: {e}"));
    }
    let log_start = store.max_log_offset();

    let mut consumers = Vec::new();
    if plan.cfg.consumers {
        let tq =
            executor().create_task_queue(Shares::Static(1000), Latency::NotImportant, "consumers");
        crate::shard::stall::name_queue(tq, "load generator consumers");
        for (slot, q) in plan.owned[index].iter().enumerate() {
            // Start at the end: only this run's messages are read.
            let from = store.max_queue_offset(&q.topic, q.id);
            let fut = consume(shard.clone(), slot, q.topic.clone(), q.id, from);
            consumers.push(spawn_local_into(fut, tq).expect("spawn consumer"));
        }
        consumers.push(spawn_local_into(watch_dispatch(shard.clone()), tq).expect("spawn watcher"));
    }
    // Detached: it keeps reporting while the store shuts down, until the executor ends.
    glommio::spawn_local(monitor(store.clone(), plan.clone(), index)).detach();
    let cpu_start = thread_cpu_seconds();
    plan.ready.fetch_add(1, Ordering::Release);

    let produced = if shard.local_producers {
        let p = run_producers(&shard, &local).await;
        plan.mark_produced(index);
        p
    } else {
        plan.produced(index).await;
        None
    };
    let producing_cpu_seconds = thread_cpu_seconds() - cpu_start;
    shard.producing.set(false);
    let consumed_while_producing = shard.counters().consumed.load(Ordering::Relaxed);
    shard.arrival.notify();
    drain(&shard, consumers).await;
    if plan.cfg.kill_after_flush {
        // The main thread SIGKILLs the process once every shard's log is flushed: a
        // shard done early must not shut down cleanly before then (scenario 7 then
        // timed one clean and one abnormal open).
        std::future::pending::<()>().await;
    }
    ShardResult {
        produced,
        consumed_while_producing,
        log_bytes: store.max_log_offset() - log_start,
        first_error: shard.first_error.borrow_mut().take(),
        e2e_latency: shard.e2e_latency.replace(new_histogram()),
        producing_cpu_seconds,
    }
}

/// Runs the producers `local` (global indexes) on this shard until they are done.
async fn run_producers(shard: &Rc<Shard>, local: &[usize]) -> Option<Produced> {
    if local.is_empty() {
        return None;
    }
    let plan = &shard.plan;
    let start_ns = now_ns();
    let stats = LaneStats::new();
    let path = Rc::new(LocalPuts(shard.clone()));
    let tq = executor().create_task_queue(Shares::Static(1000), Latency::NotImportant, "producers");
    crate::shard::stall::name_queue(tq, "load generator producers");
    let mut lanes = Vec::new();
    for &g in local {
        let producer = Producer::new(plan, g, start_ns, &stats);
        for l in 0..plan.cfg.outstanding {
            let fut = lane(producer.clone(), path.clone(), l as u64);
            lanes.push(spawn_local_into(fut, tq).expect("spawn producer"));
        }
    }
    let mut ends = Vec::with_capacity(lanes.len());
    for l in lanes {
        ends.push(l.await);
    }
    Some(stats.finish(start_ns, ends))
}

/// Waits for the consumers to read everything put, at most `--drain-timeout` seconds;
/// then stops them where they are and reports how far behind they were.
async fn drain(shard: &Rc<Shard>, consumers: Vec<glommio::Task<()>>) {
    let cfg = &shard.plan.cfg;
    let deadline = now_ns() + (cfg.drain_timeout.max(0.0) * 1e9) as u64;
    let mut timed_out = false;
    for mut c in consumers {
        if !timed_out {
            let left = Duration::from_nanos(deadline.saturating_sub(now_ns()));
            let finished = futures_lite::future::or(
                async {
                    (&mut c).await;
                    true
                },
                async {
                    glommio::timer::sleep(left).await;
                    false
                },
            )
            .await;
            if finished {
                continue;
            }
            timed_out = true;
            shard.stop_consumers.set(true);
            shard.notify_all();
        }
        c.await;
    }
    if timed_out {
        let c = shard.counters();
        shard.error(format!(
            "shard {}: consumers were {} messages behind after the {} s drain timeout",
            shard.index,
            c.messages
                .load(Ordering::Relaxed)
                .saturating_sub(c.consumed.load(Ordering::Relaxed)),
            cfg.drain_timeout
        ));
    }
    shard.drained.set(true);
}

/// Publishes the store's log positions for the progress thread, until the executor
/// ends (after the store's shutdown).
async fn monitor(store: Store, plan: Arc<Plan>, index: usize) {
    loop {
        let positions = [
            store.max_log_offset(),
            store.committed_log_offset(),
            store.flushed_log_offset(),
            store.dispatched_log_offset(),
        ];
        let c = &plan.counters[index];
        for (a, v) in c.log.iter().zip(positions) {
            a.store(v, Ordering::Relaxed);
        }
        c.heartbeat.fetch_add(1, Ordering::Relaxed);
        c.max_dispatch_lag
            .fetch_max(positions[0] - positions[3], Ordering::Relaxed);
        glommio::timer::sleep(MONITOR_INTERVAL).await;
    }
}

/// `--fill-segments`: writes that many segments of 64 KiB filler messages to the
/// shard's first queue, retires them (kept as spares with `--spare-segments`), and
/// waits until the spares are zero-filled, so the measured run writes into recycled
/// (or, without spares, new) segments.
async fn fill_and_retire(store: &Store, plan: &Plan, index: usize) -> crate::Result<()> {
    let Some(q) = plan.owned[index].first() else {
        return Ok(());
    };
    let seg = store.config().commit_log_segment_bytes;
    let target = store.max_log_offset() + plan.cfg.fill_segments * seg;
    let body = vec![b'f'; 64 << 10];
    let msgs: Vec<Message> = (0..8)
        .map(|_| Message::new(q.topic.clone(), q.id, body.clone()))
        .collect();
    while store.max_log_offset() < target {
        let r = store.put_batch(&msgs).await;
        if r.status != PutStatus::PutOk {
            return Err(crate::Error::Failed(format!("filler put: {:?}", r.status)));
        }
    }
    store.wait_dispatched().await;
    store.checkpoint().await?;
    let old = store.retention_config();
    let mut now = old.clone();
    now.file_reserved_time = Duration::ZERO;
    now.delete_file_batch_max = plan.cfg.fill_segments as usize + 1;
    now.delete_interval = Duration::ZERO;
    store.set_retention_config(now)?;
    glommio::timer::sleep(Duration::from_millis(2)).await;
    let pass = store.delete_expired_files().await;
    store.set_retention_config(old)?;
    pass?;
    for _ in 0..60_000 {
        if store.stats().spare_segments_pending == 0 {
            break;
        }
        glommio::timer::sleep(Duration::from_millis(1)).await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::Untold;

    fn told(u: &mut Untold, dispatched: u64) -> Vec<usize> {
        let mut woken = Vec::new();
        u.tell(dispatched, |i| woken.push(i));
        woken
    }

    #[test]
    fn a_queue_is_told_while_puts_to_it_go_on() {
        let mut u = Untold::new(3);
        // Puts to every queue, the log growing; dispatch behind the latest put of
        // each queue at every look, as in a closed loop.
        let mut end = 0;
        let mut woken = Vec::new();
        for round in 0..10u64 {
            for q in 0..3 {
                end += 100;
                u.put(q, end);
            }
            woken.extend(told(&mut u, end - 250 + round % 2));
        }
        for q in 0..3 {
            assert!(
                woken.iter().filter(|&&w| w == q).count() >= 9,
                "{q}: {woken:?}"
            );
        }
        // Everything dispatched: each told once more, then none listed.
        assert_eq!(told(&mut u, end), vec![0, 1, 2]);
        assert!(told(&mut u, end + 1000).is_empty());
    }

    #[test]
    fn a_queue_is_not_told_before_its_put_is_dispatched() {
        let mut u = Untold::new(2);
        u.put(1, 500);
        assert!(told(&mut u, 499).is_empty());
        assert_eq!(told(&mut u, 500), vec![1]);
        assert!(told(&mut u, 10_000).is_empty());
        // A later put is told again.
        u.put(1, 700);
        assert_eq!(told(&mut u, 700), vec![1]);
    }
}
