//! The stall detector: RocketMQ's lock-held monitor (it reports a put lock held too
//! long) for an executor. A shard's task queue that runs without giving the executor
//! back (a blocking call on the executor, a loop that never yields) freezes every
//! other task of that shard, its puts included; this reports it, never silently.
//!
//! Two parts, each for a reason:
//! * **On the shard**, a heartbeat task in its own task queue (`stall-watch`, high
//!   shares, latency `Matters(threshold / 2)`: a task queue that yields as it should,
//!   `yield_if_needed`, gives the executor back within half the threshold once a beat
//!   is due) sleeps `tick` (a quarter of the threshold) and, on waking, measures how
//!   late it woke. This also caps the executor's preempt timer at half the threshold
//!   (glommio's default is 100 ms; `coremq bench` uses 5 ms). Woken more than `stall_threshold` late, the
//!   executor did not turn for that long: the stall is counted on the shard's thread
//!   (`Store::stats().stalls`, `/metrics`) and logged at warn with what was running:
//!   the task queue that got the most executor time since the last beat (from
//!   glommio's per-queue runtime statistics), named by the names the store gave its
//!   queues (`name_queue`).
//! * **Off the shard**, a monitor thread reads when each shard's next beat was due,
//!   every `IDLE_TICK`: a shard whose beat is later than that by more than the
//!   threshold is reported while still frozen
//!   (once per freeze, with how long so far), so a freeze that never ends (a deadlock
//!   on a blocking call) is not silent either.
//!
//! glommio's own hook (`LocalExecutorBuilder::detect_stalls`) cannot be used as is:
//! its handler's argument type is not exported, so a handler cannot be written
//! outside glommio; this needs no patch.
//!
//! Cost: while a shard works, `4 / threshold` timer wake-ups a second (400 at 10 ms);
//! each wakes a parked executor (~25-50 us of CPU on a VM). A shard whose task queues
//! ran less than a tenth of the last sleep (`BUSY_SHARE`) backs its heartbeat off,
//! doubling up to one beat every `IDLE_TICK` (100 ms, then on the shard's shared tick,
//! `super::tick`, with its other idle timers): at a 2.5 ms tick forever an
//! idle 2-shard store took 5.8% of a core against 1.1% without the detector, and a
//! node serving 1,000 sends a second (its shards busy 3-7% of the time) spent 127-149
//! us of CPU per send with the 2.5 ms tick against 81-90 us backed off (2.35 -> 1.75
//! parks per send). The price: a stall shorter than 100 ms that begins in the first
//! sleep after a lightly loaded spell can go unreported (one that overlaps a beat's
//! due time never does), and the monitor looks every 100 ms, so a freeze is reported
//! "still frozen" after 100-200 ms.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The longest heartbeat sleep of an idle shard, and the monitor thread's period.
pub(crate) const IDLE_TICK: Duration = Duration::from_millis(100);
/// The share of a heartbeat's sleep the shard's task queues must have run for the
/// next sleep to be the short tick (module docs: the cost figures).
const BUSY_SHARE: f64 = 0.1;

thread_local! {
    static STALLS: Cell<u64> = const { Cell::new(0) };
    static LAST: RefCell<Option<String>> = const { RefCell::new(None) };
    static NAMES: RefCell<Option<HashMap<usize, String>>> = const { RefCell::new(None) };
}

/// Stalls counted on this thread (a shard's executor thread) so far.
pub fn stalls_here() -> u64 {
    STALLS.with(Cell::get)
}

/// The last stall reported on this thread: how late and what ran.
pub fn last_stall_here() -> Option<String> {
    LAST.with(|l| l.borrow().clone())
}

/// Names a task queue of this thread's executor for stall reports.
pub fn name_queue(q: glommio::TaskQueueHandle, name: &str) {
    NAMES.with(|n| {
        n.borrow_mut()
            .get_or_insert_with(HashMap::new)
            .insert(q.index(), name.to_string());
    });
}

fn queue_name(index: usize) -> String {
    NAMES
        .with(|n| n.borrow().as_ref().and_then(|m| m.get(&index).cloned()))
        .unwrap_or_else(|| {
            if index == 0 {
                "default (requests, node connections)".into()
            } else {
                format!("task queue #{index}")
            }
        })
}

/// The shards' last beats, shared with the monitor thread.
pub(crate) struct Beats {
    base: Instant,
    /// Per shard: microseconds since `base` at which its next beat is due (0: not
    /// started).
    due: Vec<AtomicU64>,
    /// Per shard: the current freeze was reported by the monitor.
    reported: Vec<AtomicBool>,
    stop: AtomicBool,
    threshold: Duration,
}

impl Beats {
    pub(crate) fn new(shards: usize, threshold: Duration) -> Arc<Beats> {
        Arc::new(Beats {
            base: Instant::now(),
            due: (0..shards).map(|_| AtomicU64::new(0)).collect(),
            reported: (0..shards).map(|_| AtomicBool::new(false)).collect(),
            stop: AtomicBool::new(false),
            threshold,
        })
    }

    pub(crate) fn threshold(&self) -> Duration {
        self.threshold
    }

    fn tick(&self) -> Duration {
        (self.threshold / 4).max(Duration::from_millis(1))
    }

    fn now_us(&self) -> u64 {
        (self.base.elapsed().as_micros() as u64).max(1)
    }

    /// The heartbeat task of `shard` (module docs), until the shard's executor ends.
    pub(crate) async fn run_heartbeat(self: Arc<Self>, shard: usize) {
        let ex = glommio::executor();
        let mut runtimes: HashMap<usize, Duration> = HashMap::new();
        let sample = |runtimes: &mut HashMap<usize, Duration>| {
            // glommio hands each queue's runtime since the last call (and resets it).
            runtimes.clear();
            for s in ex.all_task_queue_stats(Vec::new()) {
                runtimes.insert(s.index().index(), s.runtime());
            }
        };
        sample(&mut runtimes);
        let tick = self.tick();
        let mut sleep = tick;
        loop {
            let slept_from = Instant::now();
            // Backed off all the way, the beat ends on the shard's tick (`super::tick`),
            // with the idle shard's other timers.
            let sleep_for = if sleep == IDLE_TICK {
                super::tick::until(IDLE_TICK)
            } else {
                sleep
            };
            self.due[shard].store(
                self.now_us() + sleep_for.as_micros() as u64,
                Ordering::Relaxed,
            );
            self.reported[shard].store(false, Ordering::Relaxed);
            glommio::timer::sleep(sleep_for).await;
            if self.stop.load(Ordering::Relaxed) {
                // No beat is due any more: the monitor must not take the last one,
                // never followed, for a freeze.
                self.due[shard].store(0, Ordering::Relaxed);
                return;
            }
            let slept = slept_from.elapsed();
            let late = slept.saturating_sub(sleep_for);
            sample(&mut runtimes);
            // A lightly loaded shard backs off (doubling up to IDLE_TICK): it cannot
            // stall while nothing runs, and each beat wakes it (module docs). Work
            // (task queues busy for `BUSY_SHARE` of the sleep) restores the tick.
            let ran: Duration = runtimes.values().sum();
            sleep = if ran.as_secs_f64() >= slept.as_secs_f64() * BUSY_SHARE {
                tick
            } else {
                (sleep * 2).min(IDLE_TICK.max(tick))
            };
            if late <= self.threshold {
                continue;
            }
            STALLS.with(|s| s.set(s.get() + 1));
            let mut ran: Vec<(usize, Duration)> = runtimes.iter().map(|(q, d)| (*q, *d)).collect();
            ran.sort_by_key(|(_, d)| std::cmp::Reverse(*d));
            let what: Vec<String> = ran
                .iter()
                .take(3)
                .filter(|(_, d)| !d.is_zero())
                .map(|(q, d)| format!("{} ran {d:?}", queue_name(*q)))
                .collect();
            tracing::warn!(
                shard,
                stalled_for = ?late,
                threshold = ?self.threshold,
                running = ?what,
                "a shard's executor stalled: no task queue turned for longer than the threshold"
            );
            LAST.with(|l| *l.borrow_mut() = Some(format!("stalled {late:?}; {}", what.join(", "))));
        }
    }

    /// The monitor thread's loop (module docs), until [`Beats::stop`].
    pub(crate) fn run_monitor(self: Arc<Self>) {
        let limit = self.threshold.as_micros() as u64;
        while !self.stop.load(Ordering::Relaxed) {
            std::thread::sleep(IDLE_TICK.max(self.tick()));
            // Stopped while it slept: the heartbeats end without a last beat
            // (a "still frozen" report of each shard at every clean shutdown).
            if self.stop.load(Ordering::Relaxed) {
                break;
            }
            let now = self.now_us();
            for (shard, due) in self.due.iter().enumerate() {
                let at = due.load(Ordering::Relaxed);
                if at == 0 || now <= at + limit {
                    continue;
                }
                if !self.reported[shard].swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        shard,
                        frozen_for = ?Duration::from_micros(now - at),
                        "a shard's executor has not turned for longer than the stall threshold \
                         and is still frozen"
                    );
                }
            }
        }
    }

    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
