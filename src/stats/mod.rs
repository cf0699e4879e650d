//! Store statistics: RocketMQ's `StoreStatsService`, one recorder per shard.
//!
//! Counted by the store call that did the work, on the shard's thread (plain `Cell`s,
//! no atomics): puts (calls, messages, bytes, failures) with their latency
//! distribution (the whole `Store::put` call, so flush and slave waits count, as
//! RocketMQ's `putMessageEntireTime`), gets that found something or not (one per call,
//! RocketMQ's `getMessageTimesTotalFound` / `Miss`), messages and bytes they returned
//! (`getMessageTransferredMsgCount`).
//!
//! **Put latency** is the put call's time in µs, read from the clock only when the
//! call waited (`Store::put_many`): a put ready at its first poll (an async put with
//! room in its write window, ~1-2 µs of CPU) is recorded as 0 µs, RocketMQ's `[<=0ms]`
//! bucket in finer grain; one that waited counts from its first wait (its first poll's
//! own CPU time, a microsecond or two, is not in it). Without the two precise clock
//! reads per put (22 ns each here), scenario 1's CPU per message fell 1.9% on average
//! (eight interleaved pairs).
//!
//! **Rates** over 10 s, 1 min and 10 min, as RocketMQ's `putTps` and friends. RocketMQ
//! samples the counters from a thread every second; here the samples are taken lazily
//! by the next recorded call (or [`StatsRecorder::snapshot`]) once a second has passed
//! since the last one, so an idle shard costs nothing. A recorded call reads the
//! kernel's coarse monotonic clock (its last tick, 1-4 ms behind, 5.6 ns a read
//! against 22 ns here) to decide, as the one-second sampling needs no finer grain.
//! Between two samples every call happened within one second of the first (a later
//! one would have taken a sample first), so a counter's value at any time is known to
//! within one second's calls: a rate is `(count now - count at the window's start) /
//! window`, exact but for that second. A window longer than the history (just after
//! open) is measured over the history instead, and is `None` until a second has passed.
//!
//! The snapshot ([`StoreStats`]) adds what the store's positions say at that moment:
//! dispatch lag (written but not yet in the queues), commit and flush lag, and the
//! write-buffer pool's use (written but not flushed, against its size). The
//! store's `stats()` gives one shard's; `StoreOps::stats` every shard's and their sum.

pub mod process;
pub mod prometheus;

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Upper bounds (µs) of the put-latency buckets; a last bucket takes the rest. They
/// include RocketMQ's bucket bounds (10 ms ... 10 s) so its distribution can be given.
pub const LATENCY_BOUNDS_US: [u64; 17] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 50_000, 100_000, 200_000, 500_000, 1_000_000,
    2_000_000, 3_000_000, 4_000_000, 5_000_000, 10_000_000,
];

/// RocketMQ's `putMessageDistributeTime` buckets: label and upper bound (µs) in
/// [`LATENCY_BOUNDS_US`] (`u64::MAX`: the rest).
const ROCKETMQ_BUCKETS: [(&str, u64); 13] = [
    ("[<=0ms]", 0),
    ("[0~10ms]", 10_000),
    ("[10~50ms]", 50_000),
    ("[50~100ms]", 100_000),
    ("[100~200ms]", 200_000),
    ("[200~500ms]", 500_000),
    ("[500ms~1s]", 1_000_000),
    ("[1~2s]", 2_000_000),
    ("[2~3s]", 3_000_000),
    ("[3~4s]", 4_000_000),
    ("[4~5s]", 5_000_000),
    ("[5~10s]", 10_000_000),
    ("[10s~]", u64::MAX),
];

/// The rate windows, in seconds (RocketMQ's 10, 60 and 600 samples).
pub const WINDOWS_S: [u64; 3] = [10, 60, 600];

/// Samples older than the longest window plus this are dropped (one older is kept as
/// the window's start).
const KEEP_EXTRA: Duration = Duration::from_secs(60);
/// At most this many samples (a busy shard takes one a second).
const MAX_SAMPLES: usize = 720;

/// A latency distribution: counts per bucket of [`LATENCY_BOUNDS_US`] plus one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Latency {
    pub counts: [u64; LATENCY_BOUNDS_US.len() + 1],
    pub sum_us: u64,
    pub max_us: u64,
}

impl Default for Latency {
    fn default() -> Latency {
        Latency {
            counts: [0; LATENCY_BOUNDS_US.len() + 1],
            sum_us: 0,
            max_us: 0,
        }
    }
}

impl Latency {
    fn record(&mut self, us: u64) {
        let b = LATENCY_BOUNDS_US
            .iter()
            .position(|le| us <= *le)
            .unwrap_or(LATENCY_BOUNDS_US.len());
        self.counts[b] += 1;
        self.sum_us += us;
        self.max_us = self.max_us.max(us);
    }

    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    fn add(&mut self, o: &Latency) {
        for (a, b) in self.counts.iter_mut().zip(o.counts.iter()) {
            *a += b;
        }
        self.sum_us += o.sum_us;
        self.max_us = self.max_us.max(o.max_us);
    }

    /// The upper bound (µs) of the bucket holding quantile `q` (0..=1); the largest
    /// latency seen for the last bucket; 0 when nothing was recorded.
    pub fn quantile_us(&self, q: f64) -> u64 {
        let n = self.count();
        if n == 0 {
            return 0;
        }
        let want = ((n as f64) * q).ceil().max(1.0) as u64;
        let mut cum = 0;
        for (i, c) in self.counts.iter().enumerate() {
            cum += c;
            if cum >= want {
                return LATENCY_BOUNDS_US
                    .get(i)
                    .map_or(self.max_us, |b| (*b).min(self.max_us.max(1)));
            }
        }
        self.max_us
    }

    /// RocketMQ's `putMessageDistributeTime` text: `"<label>:<count> "` per bucket.
    pub fn rocketmq_distribution(&self) -> String {
        let mut out = String::new();
        let mut i = 0;
        for (label, bound) in ROCKETMQ_BUCKETS {
            let mut n = 0;
            while i < self.counts.len()
                && LATENCY_BOUNDS_US.get(i).map_or(u64::MAX, |b| *b) <= bound
            {
                n += self.counts[i];
                i += 1;
            }
            out.push_str(&format!("{label}:{n} "));
        }
        out
    }
}

/// A rate over each of [`WINDOWS_S`] (per second); `None` before a second of history.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Rates(pub [Option<f64>; 3]);

impl Rates {
    fn add(&mut self, o: &Rates) {
        for (a, b) in self.0.iter_mut().zip(o.0.iter()) {
            *a = match (*a, *b) {
                (Some(x), Some(y)) => Some(x + y),
                (x, None) => x,
                (None, y) => y,
            };
        }
    }

    /// RocketMQ's text: the three values joined by spaces (an unknown one empty).
    pub fn rocketmq_text(&self) -> String {
        self.0
            .iter()
            .map(|r| r.map_or(String::new(), |v| format!("{v:.2}")))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// One shard's statistics (or, from `StoreOps::stats`, their sum).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StoreStats {
    /// Milliseconds since the store opened (the oldest shard's, in a sum).
    pub uptime_ms: u64,
    /// Put calls, messages stored, bytes stored, calls refused or failed.
    pub put_calls: u64,
    pub put_messages: u64,
    pub put_bytes: u64,
    pub put_failed: u64,
    pub put_latency: Latency,
    /// Get calls that found messages, and that did not.
    pub get_found: u64,
    pub get_miss: u64,
    /// Messages and bytes the gets returned.
    pub get_messages: u64,
    pub get_bytes: u64,
    /// Messages put per second; gets found and missed per second; messages returned
    /// by gets per second.
    pub put_tps: Rates,
    pub get_found_tps: Rates,
    pub get_miss_tps: Rates,
    pub get_transferred_tps: Rates,
    /// Written but not yet in the queues and index (bytes).
    pub dispatch_lag: u64,
    /// Written but not yet in the files, and not yet durable (bytes).
    pub commit_lag: u64,
    pub flush_lag: u64,
    /// The write-buffer pool: bytes it holds that are not yet flushed, and its size.
    pub pool_used: u64,
    pub pool_bytes: u64,
    /// The log's first and end offsets (per shard; a sum has the totals held).
    pub log_min: u64,
    pub log_max: u64,
    /// Commit-log segments created as new files, and taken from the spares
    /// (`commit_log_spare_segments`), since the store opened.
    pub segments_created: u64,
    pub segments_reused: u64,
    /// Spare segments zero-filled and ready, and still to be zero-filled.
    pub spare_segments_ready: u64,
    pub spare_segments_pending: u64,
    /// Key-index flushes that wrote something, and the writes they made (each a run
    /// of adjacent pages; when rounds flush: `StoreConfig::index_flush_least_pages`).
    pub index_flushes: u64,
    pub index_flush_writes: u64,
    /// Sync-flush rounds the shard wrote itself instead of its group-commit thread
    /// (`StoreConfig::sync_flush_lead_when_idle`).
    pub sync_rounds_led: u64,
    /// Turns of the commit-log writer's loop (each a commit or flush round, or
    /// a look that found nothing due): how often the log's writer woke the shard.
    pub writer_turns: u64,
    /// Turns of the shard's executor over the stall threshold (`crate::shard::stall`).
    pub stalls: u64,
    /// The last stall: how long and which task queues ran (per shard).
    pub last_stall: Option<String>,
    /// Self-check runs, and problems they found (`crate::store::self_check`).
    pub self_checks: u64,
    pub self_check_problems: u64,
}

impl StoreStats {
    /// The sum of shards' statistics: counters, rates and lags add up.
    pub fn total(shards: &[StoreStats]) -> StoreStats {
        let mut t = StoreStats::default();
        for s in shards {
            t.uptime_ms = t.uptime_ms.max(s.uptime_ms);
            t.put_calls += s.put_calls;
            t.put_messages += s.put_messages;
            t.put_bytes += s.put_bytes;
            t.put_failed += s.put_failed;
            t.put_latency.add(&s.put_latency);
            t.get_found += s.get_found;
            t.get_miss += s.get_miss;
            t.get_messages += s.get_messages;
            t.get_bytes += s.get_bytes;
            t.put_tps.add(&s.put_tps);
            t.get_found_tps.add(&s.get_found_tps);
            t.get_miss_tps.add(&s.get_miss_tps);
            t.get_transferred_tps.add(&s.get_transferred_tps);
            t.dispatch_lag += s.dispatch_lag;
            t.commit_lag += s.commit_lag;
            t.flush_lag += s.flush_lag;
            t.pool_used += s.pool_used;
            t.pool_bytes += s.pool_bytes;
            t.log_min += s.log_min;
            t.log_max += s.log_max;
            t.segments_created += s.segments_created;
            t.segments_reused += s.segments_reused;
            t.spare_segments_ready += s.spare_segments_ready;
            t.spare_segments_pending += s.spare_segments_pending;
            t.sync_rounds_led += s.sync_rounds_led;
            t.writer_turns += s.writer_turns;
            t.index_flushes += s.index_flushes;
            t.index_flush_writes += s.index_flush_writes;
            t.stalls += s.stalls;
            t.self_checks += s.self_checks;
            t.self_check_problems += s.self_check_problems;
        }
        t
    }

    /// The pool's use as a fraction (0 with no pool).
    pub fn pool_use(&self) -> f64 {
        if self.pool_bytes == 0 {
            0.0
        } else {
            self.pool_used as f64 / self.pool_bytes as f64
        }
    }
}

/// The counters a rate is taken of, at one time.
#[derive(Debug, Clone, Copy, Default)]
struct Counts {
    put_messages: u64,
    get_found: u64,
    get_miss: u64,
    get_messages: u64,
}

#[derive(Debug, Clone, Copy)]
struct Sample {
    at: Instant,
    c: Counts,
}

/// The kernel's coarse monotonic clock, in ns (module docs).
fn coarse_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec for the call to fill; CLOCK_MONOTONIC_COARSE
    // exists on every Linux this crate runs on (since 2.6.32).
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// A shard's recorder (module docs).
pub struct StatsRecorder {
    opened: Instant,
    /// The coarse clock's reading (ns) when `opened` was read.
    opened_coarse_ns: u64,
    counts: Cell<Counts>,
    put_calls: Cell<u64>,
    put_bytes: Cell<u64>,
    put_failed: Cell<u64>,
    get_bytes: Cell<u64>,
    latency: RefCell<Latency>,
    samples: RefCell<VecDeque<Sample>>,
}

impl Default for StatsRecorder {
    fn default() -> Self {
        Self::new()
    }
}

impl StatsRecorder {
    pub fn new() -> StatsRecorder {
        let now = Instant::now();
        StatsRecorder {
            opened: now,
            opened_coarse_ns: coarse_ns(),
            counts: Cell::new(Counts::default()),
            put_calls: Cell::new(0),
            put_bytes: Cell::new(0),
            put_failed: Cell::new(0),
            get_bytes: Cell::new(0),
            latency: RefCell::new(Latency::default()),
            samples: RefCell::new(VecDeque::from([Sample {
                at: now,
                c: Counts::default(),
            }])),
        }
    }

    /// Takes a sample when a second has passed since the last one.
    fn tick(&self, now: Instant) {
        let mut s = self.samples.borrow_mut();
        if s.back()
            .is_some_and(|last| now.duration_since(last.at) < Duration::from_secs(1))
        {
            return;
        }
        s.push_back(Sample {
            at: now,
            c: self.counts.get(),
        });
        let horizon = Duration::from_secs(WINDOWS_S[2]) + KEEP_EXTRA;
        while s.len() > 2 && (s.len() > MAX_SAMPLES || now.duration_since(s[1].at) > horizon) {
            s.pop_front();
        }
    }

    /// Now, from the coarse clock (module docs): at most a tick behind `Instant::now`.
    fn coarse_now(&self) -> Instant {
        let since_open = coarse_ns().saturating_sub(self.opened_coarse_ns);
        self.opened + Duration::from_nanos(since_open)
    }

    /// A put call that took `latency_us` (module docs) and stored `messages` messages
    /// of `bytes` bytes (0 and `failed` when refused).
    pub fn put(&self, latency_us: u64, messages: u64, bytes: u64, failed: bool) {
        self.tick(self.coarse_now());
        self.put_calls.set(self.put_calls.get() + 1);
        if failed {
            self.put_failed.set(self.put_failed.get() + 1);
        } else {
            let mut c = self.counts.get();
            c.put_messages += messages;
            self.counts.set(c);
            self.put_bytes.set(self.put_bytes.get() + bytes);
        }
        self.latency.borrow_mut().record(latency_us);
    }

    /// A get call that returned `messages` messages of `bytes` bytes (0: a miss).
    pub fn get(&self, messages: u64, bytes: u64) {
        self.tick(self.coarse_now());
        let mut c = self.counts.get();
        if messages > 0 {
            c.get_found += 1;
            c.get_messages += messages;
            self.get_bytes.set(self.get_bytes.get() + bytes);
        } else {
            c.get_miss += 1;
        }
        self.counts.set(c);
    }

    /// The counters and rates now; the store fills in its positions.
    pub fn snapshot(&self) -> StoreStats {
        let now = Instant::now();
        self.tick(now);
        let c = self.counts.get();
        let s = self.samples.borrow();
        let rate = |pick: fn(&Counts) -> u64, w: u64| -> Option<f64> {
            let start = now.checked_sub(Duration::from_secs(w));
            let base = match start {
                // The last sample at or before the window's start; the count then is
                // the next sample's if a second had passed since (module docs).
                Some(start) => match s.iter().rposition(|x| x.at <= start) {
                    Some(i) => {
                        let settled = start.duration_since(s[i].at) >= Duration::from_secs(1);
                        match s.get(i + 1) {
                            Some(next) if settled => Some((start, pick(&next.c))),
                            _ => Some((start, pick(&s[i].c))),
                        }
                    }
                    None => None,
                },
                None => None,
            };
            // A window longer than the history: over the history.
            let (from, base) = base.unwrap_or_else(|| (s[0].at, pick(&s[0].c)));
            let secs = now.duration_since(from).as_secs_f64();
            (secs >= 1.0).then(|| pick(&c).saturating_sub(base) as f64 / secs)
        };
        let rates = |pick: fn(&Counts) -> u64| {
            Rates([
                rate(pick, WINDOWS_S[0]),
                rate(pick, WINDOWS_S[1]),
                rate(pick, WINDOWS_S[2]),
            ])
        };
        StoreStats {
            uptime_ms: now.duration_since(self.opened).as_millis() as u64,
            put_calls: self.put_calls.get(),
            put_messages: c.put_messages,
            put_bytes: self.put_bytes.get(),
            put_failed: self.put_failed.get(),
            put_latency: self.latency.borrow().clone(),
            get_found: c.get_found,
            get_miss: c.get_miss,
            get_messages: c.get_messages,
            get_bytes: self.get_bytes.get(),
            put_tps: rates(|c| c.put_messages),
            get_found_tps: rates(|c| c.get_found),
            get_miss_tps: rates(|c| c.get_miss),
            get_transferred_tps: rates(|c| c.get_messages),
            ..StoreStats::default()
        }
    }
}

/// Runs `fut` and says how long it waited, in µs: 0 when it was ready at its first
/// poll (no clock read), else from the end of its first poll to its end (the store's
/// put latency, the node's `coremq_put_latency_seconds`).
///
/// A plain future rather than an `async fn`: an `async fn` holds `fut` as its argument
/// and pins it in a second slot, so a put's future (hundreds of bytes) was copied once
/// more per call (~1.2% of a node's samples under single sends).
pub(crate) fn timed<F: std::future::Future>(fut: F) -> Timed<F> {
    Timed {
        fut,
        waiting_since: None,
    }
}

/// The future of [`timed`].
pub(crate) struct Timed<F> {
    fut: F,
    waiting_since: Option<std::time::Instant>,
}

impl<F: std::future::Future> std::future::Future for Timed<F> {
    type Output = (F::Output, u64);

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        // SAFETY: `fut` is pinned structurally: it is never moved out of `self`, and
        // `Timed` has no `Drop` of its own and is `Unpin` only when `F` is.
        let this = unsafe { self.get_unchecked_mut() };
        let fut = unsafe { std::pin::Pin::new_unchecked(&mut this.fut) };
        match fut.poll(cx) {
            std::task::Poll::Ready(v) => {
                let us = this
                    .waiting_since
                    .map_or(0, |t| t.elapsed().as_micros() as u64);
                std::task::Poll::Ready((v, us))
            }
            std::task::Poll::Pending => {
                this.waiting_since
                    .get_or_insert_with(std::time::Instant::now);
                std::task::Poll::Pending
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_buckets_quantiles_and_rocketmq_text() {
        let mut l = Latency::default();
        for us in [50, 90, 300, 20_000, 20_000_000] {
            l.record(us);
        }
        assert_eq!(l.count(), 5);
        assert_eq!(l.counts[0], 2);
        assert_eq!(l.counts[2], 1);
        assert_eq!(l.counts[7], 1);
        assert_eq!(*l.counts.last().unwrap(), 1);
        assert_eq!(l.quantile_us(0.4), 100);
        assert_eq!(l.quantile_us(0.6), 500);
        assert_eq!(l.quantile_us(1.0), 20_000_000);
        let text = l.rocketmq_distribution();
        assert!(
            text.starts_with("[<=0ms]:0 [0~10ms]:3 [10~50ms]:1 "),
            "{text}"
        );
        assert!(text.ends_with("[5~10s]:0 [10s~]:1 "), "{text}");
        assert_eq!(text.matches(':').count(), 13);
    }

    #[test]
    fn rates_need_a_second_then_follow_the_counts() {
        let r = StatsRecorder::new();
        r.put(3, 10, 1000, false);
        r.put(0, 0, 0, true);
        r.get(3, 300);
        r.get(0, 0);
        let s = r.snapshot();
        assert_eq!(
            (s.put_calls, s.put_messages, s.put_failed, s.put_bytes),
            (2, 10, 1, 1000)
        );
        assert_eq!(
            (s.get_found, s.get_miss, s.get_messages, s.get_bytes),
            (1, 1, 3, 300)
        );
        assert_eq!(
            s.put_tps,
            Rates([None, None, None]),
            "no second of history yet"
        );
        std::thread::sleep(Duration::from_millis(1100));
        let s = r.snapshot();
        for w in s.put_tps.0 {
            let v = w.expect("a second passed");
            assert!(v > 5.0 && v <= 10.0, "{v}");
        }
        assert!(s.get_found_tps.0[0].unwrap() > 0.5);
        assert_eq!(s.put_tps.rocketmq_text().split(' ').count(), 3);
        let total = StoreStats::total(&[s.clone(), s.clone()]);
        assert_eq!(total.put_messages, 20);
        assert_eq!(total.put_latency.count(), 4);
        assert!((total.put_tps.0[0].unwrap() - 2.0 * s.put_tps.0[0].unwrap()).abs() < 1e-9);
    }

    #[test]
    fn timed_reads_the_clock_only_for_a_future_that_waits() {
        use futures_lite::future::block_on;
        assert_eq!(block_on(timed(async { 7 })), (7, 0), "ready at once: 0 us");
        // Pending once, woken by another thread 3 ms later.
        let mut woken = false;
        let waits = std::future::poll_fn(|cx| {
            if woken {
                return std::task::Poll::Ready(8);
            }
            woken = true;
            let waker = cx.waker().clone();
            std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(3));
                waker.wake();
            });
            std::task::Poll::Pending
        });
        let (v, us) = block_on(timed(waits));
        assert_eq!(v, 8);
        assert!(us >= 3_000, "a wait of 3 ms timed as {us} us");
    }
}
