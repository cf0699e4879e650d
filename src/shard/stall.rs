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
//! * **Off the shard**, a monitor thread reads when each shard's next beat is due: a
//!   shard whose beat is later than that by more than the threshold is reported while
//!   still frozen (once per freeze, with how long so far), so a freeze that never ends
//!   (a deadlock on a blocking call) is not silent either. It looks every `IDLE_TICK`,
//!   or, while every beat is due later, when the first could be overdue (at most
//!   `IDLE_LOOK` on).
//!
//! glommio's own hook (`LocalExecutorBuilder::detect_stalls`) cannot be used as is:
//! its handler's argument type is not exported, so a handler cannot be written
//! outside glommio.
//!
//! Cost: while a shard works, `4 / threshold` timer wake-ups a second (400 at 10 ms);
//! each wakes a parked executor (~25-50 us of CPU on a VM). A shard whose task queues
//! ran less than a tenth of the last sleep (`BUSY_SHARE`) backs its heartbeat off,
//! doubling up to one beat every `IDLE_TICK` (100 ms, then on the shard's shared tick,
//! `super::tick`, with its other idle timers): at a 2.5 ms tick forever an
//! idle 2-shard store took 5.8% of a core against 1.1% without the detector, and a
//! node serving 1,000 sends a second (its shards busy 3-7% of the time) spent 127-149
//! us of CPU per send with the 2.5 ms tick against 81-90 us backed off (2.35 -> 1.75
//! parks per send).
//!
//! **Idle** (queues busy under `IDLE_SHARE` of a 100 ms beat), the heartbeat does not
//! beat on a timer: a parked executor cannot stall, and a stall can only begin once the
//! executor has something to do, which ends its park. So the heartbeat waits for the
//! end of the executor's next park (glommio's `wake_after_next_park`, coremq's patch
//! ac), which makes a beat due at once: the hook stamps the moment for the beat's
//! lateness and for the monitor, and a 100 ms beat follows. At most it waits for the
//! idle look (`IDLE_LOOK`, 1 s, on the shard's tick), for an executor that went from
//! idle to busy without parking. Deciding figure: an idle node's shards woke 11 times a
//! second each, 10 of them the 100 ms beat, and the monitor 10 times; now 2.2 and 3.1
//! (docs/performance/node.md, "An idle shard's heartbeat waits for its executor").
//!
//! The price: a stall shorter than 100 ms that begins within a beat after a lightly
//! loaded or idle spell can go unreported (one that overlaps a due beat never does);
//! a shard that goes from idle to busy without its executor parking in between (its
//! awake window or timer spin) gets its next beat at the idle look, up to 1 s on; and
//! a freeze is reported "still frozen" 100 ms to 1 s after it began.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The longest timer beat of a lightly loaded shard (an idle one's waits for its
/// executor, module docs), and the monitor thread's shortest period.
pub(crate) const IDLE_TICK: Duration = Duration::from_millis(100);
/// The share of a heartbeat's sleep the shard's task queues must have run for the
/// next sleep to be the short tick (module docs: the cost figures).
const BUSY_SHARE: f64 = 0.1;
/// Below this share of a light beat (`IDLE_TICK`) the shard is idle: its heartbeat
/// waits for the executor's next park to end instead of a timer (module docs).
const IDLE_SHARE: f64 = 0.01;
/// The longest wait of an idle heartbeat, on the shard's tick (`super::tick`).
pub(crate) const IDLE_LOOK: Duration = Duration::from_secs(1);

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
        let light = IDLE_TICK.max(tick);
        let mut sleep = Beat::Every(tick);
        let hook = Arc::new(ParkHook {
            beats: self.clone(),
            shard,
            armed: AtomicBool::new(false),
            fired_us: AtomicU64::new(0),
            task: Mutex::new(None),
        });
        loop {
            let slept_from = Instant::now();
            let (woke, due_at) = match sleep {
                Beat::Every(d) => {
                    // Backed off all the way, the beat ends on the shard's tick
                    // (`super::tick`), with the idle shard's other timers.
                    let d = if d == IDLE_TICK {
                        super::tick::until(IDLE_TICK)
                    } else {
                        d
                    };
                    self.due[shard].store(self.now_us() + d.as_micros() as u64, Ordering::Relaxed);
                    self.reported[shard].store(false, Ordering::Relaxed);
                    glommio::timer::sleep(d).await;
                    (Woke::Timer, slept_from + d)
                }
                Beat::AfterPark => {
                    // Idle: the next beat is due when the executor next wakes from a
                    // park (the hook then sets `due`), or at the idle look.
                    let look = super::tick::until(IDLE_LOOK);
                    self.due[shard]
                        .store(self.now_us() + look.as_micros() as u64, Ordering::Relaxed);
                    self.reported[shard].store(false, Ordering::Relaxed);
                    let fired = futures_lite::future::or(hook.next(), async {
                        glommio::timer::sleep(look).await;
                        None
                    })
                    .await;
                    hook.disarm();
                    match fired {
                        Some(at_us) => (Woke::Park, self.base + Duration::from_micros(at_us)),
                        None => (Woke::Timer, slept_from + look),
                    }
                }
            };
            if self.stop.load(Ordering::Relaxed) {
                // No beat is due any more: the monitor must not take the last one,
                // never followed, for a freeze.
                self.due[shard].store(0, Ordering::Relaxed);
                return;
            }
            let now = Instant::now();
            let slept = now.duration_since(slept_from);
            let late = now.saturating_duration_since(due_at);
            sample(&mut runtimes);
            // A lightly loaded shard backs off (doubling up to IDLE_TICK): it cannot
            // stall while nothing runs, and each beat wakes it (module docs). An idle
            // one (its queues ran under `IDLE_SHARE` of a light beat) waits for its
            // executor's next park to end. Work (task queues busy for `BUSY_SHARE` of
            // the sleep) restores the tick; a park's end brings a light beat.
            let ran: Duration = runtimes.values().sum();
            let share = ran.as_secs_f64() / slept.as_secs_f64().max(1e-9);
            sleep = match (woke, sleep) {
                _ if share >= BUSY_SHARE => Beat::Every(tick),
                (Woke::Park, _) => Beat::Every(light),
                (Woke::Timer, Beat::Every(d)) if d >= light && share < IDLE_SHARE => {
                    Beat::AfterPark
                }
                (Woke::Timer, Beat::Every(d)) => Beat::Every((d * 2).min(light)),
                (Woke::Timer, Beat::AfterPark) => Beat::AfterPark,
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

    /// The monitor thread's loop (module docs), until [`Beats::stop`] (and an unpark of
    /// the thread, which ends its sleep).
    pub(crate) fn run_monitor(self: Arc<Self>) {
        let limit = self.threshold.as_micros() as u64;
        let mut next_look = IDLE_TICK.max(self.tick());
        while !self.stop.load(Ordering::Relaxed) {
            let until = Instant::now() + next_look;
            while !self.stop.load(Ordering::Relaxed) && Instant::now() < until {
                std::thread::park_timeout(until.saturating_duration_since(Instant::now()));
            }
            // Stopped while it slept: the heartbeats end without a last beat
            // (a "still frozen" report of each shard at every clean shutdown).
            if self.stop.load(Ordering::Relaxed) {
                break;
            }
            let now = self.now_us();
            // No shard can be overdue before its beat's due time plus the threshold:
            // the next look is then (idle shards' beats are up to `IDLE_LOOK` away),
            // but at least `IDLE_TICK` on (a late or busy shard's).
            let mut first_possible = u64::MAX;
            for (shard, due) in self.due.iter().enumerate() {
                let at = due.load(Ordering::Relaxed);
                if at == 0 {
                    continue;
                }
                first_possible = first_possible.min(at + limit);
                if now <= at + limit {
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
            next_look = Duration::from_micros(first_possible.saturating_sub(now))
                .clamp(IDLE_TICK.max(self.tick()), IDLE_LOOK.max(self.tick()));
        }
    }

    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// What a heartbeat sleeps until.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Beat {
    /// A timer this long (the tick, doubling up to `IDLE_TICK` while lightly loaded).
    Every(Duration),
    /// Idle: the end of the executor's next park, or the idle look (`IDLE_LOOK`).
    AfterPark,
}

/// What ended a heartbeat's sleep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Woke {
    Timer,
    Park,
}

/// An idle heartbeat's hook on the end of its executor's next park (glommio's
/// `wake_after_next_park`, coremq's patch ac): the park's end is when the next beat is
/// due, so it stamps that for the beat's lateness and for the monitor.
struct ParkHook {
    beats: Arc<Beats>,
    shard: usize,
    /// A wait is armed; cleared by the park's end or by the wait giving up (a stale
    /// hook must not stamp a later beat's due time).
    armed: AtomicBool,
    /// When the park ended (`Beats::now_us`; 0: not yet).
    fired_us: AtomicU64,
    task: Mutex<Option<std::task::Waker>>,
}

impl ParkHook {
    /// Arms the hook and waits for the park's end: its time (`Beats::now_us`).
    fn next(self: &Arc<Self>) -> impl std::future::Future<Output = Option<u64>> + use<> {
        self.fired_us.store(0, Ordering::Relaxed);
        self.armed.store(true, Ordering::Relaxed);
        glommio::executor().wake_after_next_park(std::task::Waker::from(self.clone()));
        let hook = self.clone();
        futures_lite::future::poll_fn(move |cx| {
            *hook.task.lock().expect("the hook's lock") = Some(cx.waker().clone());
            match hook.fired_us.load(Ordering::Relaxed) {
                0 => std::task::Poll::Pending,
                at => std::task::Poll::Ready(Some(at)),
            }
        })
    }

    fn disarm(&self) {
        self.armed.store(false, Ordering::Relaxed);
        self.task.lock().expect("the hook's lock").take();
    }
}

impl std::task::Wake for ParkHook {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // Called on the shard's own thread, by its executor.
        if !self.armed.swap(false, Ordering::Relaxed) {
            return;
        }
        let now = self.beats.now_us();
        self.beats.due[self.shard].store(now, Ordering::Relaxed);
        self.fired_us.store(now, Ordering::Relaxed);
        if let Some(w) = self.task.lock().expect("the hook's lock").take() {
            w.wake();
        }
    }
}
