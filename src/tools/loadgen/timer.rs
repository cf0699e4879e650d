//! Scenario 9, one million pending timed messages: coremq's timer (`crate::timer`,
//! RocketMQ 5's `TimerMessageStore`) under load, on a fresh store, in one process.
//!
//! 1. **Put cost.** `--plain` plain messages (default half of `--timed`), then as
//!    many timed ones (`TIMER_DELIVER_MS`), then the rest of the timed ones, each phase
//!    from shard-local producers (`--outstanding` puts in flight per shard, the owning
//!    shard's `Store::put`, as `--via local` produce runs do) to the `--queues` queues
//!    of one topic. A phase runs from its first put until every put returned and every
//!    shard's dispatch caught up; its process CPU (user + system, every thread: the
//!    timer reading its queue and writing sorted runs included) over the messages is
//!    its CPU per message. Timed and plain messages carry the same `TAGS` and a
//!    `UNIQ_KEY`, so the key index does the same work for both.
//! 2. **Pending.** The `--timed` messages are due at random times (not in put order)
//!    uniform over `[T0 + lead, T0 + lead + --spread-secs)`, T0 the end of the plain
//!    phase; the lead (`--lead-secs`, default four times what the plain phase's rate
//!    takes for `--timed` messages, plus 2 s) is meant to let every put finish first.
//!    A put returning after the first due time is reported as a problem.
//! 3. **Memory.** `VmRSS` and `VmHWM` (`/proc/self/status`) after the plain puts,
//!    after the timed puts and just before the first due time, next to the timer's
//!    configured bound, shards x (`timer_memory_entries` x 24 bytes + 1 MiB). RSS is the
//!    whole process: write pools, read cache, queues, key index and the timer alike.
//! 4. **Delivery.** One consumer task per shard polls its queues with `Store::get`
//!    from where they ended after the plain phase, until every timed message was seen
//!    (then one second more, for duplicates) or `--spread-secs` + 60 s after the first
//!    due time. A delivered record's lateness is its store timestamp minus its
//!    `TIMER_OUT_MS` (both epoch milliseconds, both from the delivering shard's clock),
//!    so how soon the consumer reads it does not count. Reported: percentiles, and per
//!    second of due time (does lateness grow as deliveries fall behind?); messages
//!    delivered, duplicates (a `UNIQ_KEY` twice), early (lateness < 0), missing, and
//!    misrouted (not in the queue it was put for) — all but delivered are problems.

use super::config::LoadConfig;
use super::consume::RETURNED;
use super::measure::{allowed_cpus, process_usage};
use super::open_store;
use super::plan::{Plan, QueueRef};
use super::produce::Rng;
use super::progress::with_progress;
use super::run::on_every_shard;
use crate::format::properties::{TAGS, UNIQ_KEY};
use crate::format::record::{self, Decoded};
use crate::format::schedule::{TIMER_DELIVER_MS, TIMER_OUT_MS};
use crate::{GetStatus, Message, ShardContext};
use bytes::Bytes;
use glommio::{Latency, Shares, executor, spawn_local_into};
use hdrhistogram::Histogram;
use serde_json::{Value, json};
use std::cell::{Cell, RefCell};
use std::fmt::Write as _;
use std::path::Path;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// After the last due time, how long the consumers wait for missing messages.
const DELIVERY_GRACE_MS: i64 = 60_000;
/// Once every message was seen, how long the consumers go on looking for duplicates.
const DUPLICATE_WATCH_MS: i64 = 1_000;
/// A consumer's pause when a pass over its queues found nothing.
const POLL_IDLE: Duration = Duration::from_millis(10);
/// Records per get.
const GET_BATCH: usize = 256;
/// Lateness histograms: milliseconds, up to an hour.
const LATENESS_MAX_MS: u64 = 3_600_000;

/// What one put phase puts on each shard.
struct PhaseSpec {
    timed: bool,
    /// First message index and count, per shard.
    from: Vec<u64>,
    count: Vec<u64>,
    /// Each shard's first index of this kind: message `i` goes to queue
    /// `owned[(i - base) % len]`.
    base: Vec<u64>,
    owned: Vec<Arc<Vec<QueueRef>>>,
    /// Due times: `window_start + uniform [0, spread_ms)`.
    window_start: i64,
    spread_ms: i64,
    body: Bytes,
    body_min: usize,
    body_max: usize,
    outstanding: u32,
    seed: u64,
    /// Messages and body bytes put (the progress line).
    done: Arc<[AtomicU64; 2]>,
}

/// What one shard's put phase did.
struct PhaseShard {
    stored: u64,
    errors: u64,
    first_error: Option<String>,
    /// Each owned queue's end once the phase's puts were dispatched.
    queue_ends: Vec<u64>,
}

/// A put phase's figures.
struct Phase {
    name: &'static str,
    messages: u64,
    errors: u64,
    first_error: Option<String>,
    seconds: f64,
    cpu_seconds: f64,
    /// Each shard's queue ends after the phase.
    queue_ends: Vec<Vec<u64>>,
    /// Each shard's failed puts.
    shard_errors: Vec<u64>,
}

impl Phase {
    fn rate(&self) -> f64 {
        self.messages as f64 / self.seconds.max(1e-9)
    }

    fn cpu_us(&self) -> f64 {
        self.cpu_seconds * 1e6 / self.messages.max(1) as f64
    }

    fn to_json(&self) -> Value {
        json!({
            "messages": self.messages,
            "errors": self.errors,
            "seconds": self.seconds,
            "messages_per_sec": self.rate(),
            "cpu_seconds": self.cpu_seconds,
            "cpu_us_per_message": self.cpu_us(),
        })
    }

    fn line(&self) -> String {
        format!(
            "  {:<11} {} messages in {:.2} s: {:.0} msg/s, {:.2} µs CPU/msg{}\n",
            self.name,
            self.messages,
            self.seconds,
            self.rate(),
            self.cpu_us(),
            if self.errors > 0 {
                format!(", {} failed", self.errors)
            } else {
                String::new()
            }
        )
    }
}

/// What the consumers are told.
struct ConsumeSpec {
    owned: Vec<Arc<Vec<QueueRef>>>,
    /// Where each shard's queues start (after the plain phase).
    from: Vec<Vec<u64>>,
    /// Each shard's timed indices: `[base, base + count)`.
    base: Vec<u64>,
    count: Vec<u64>,
    /// Timed messages each shard stored (what it must deliver).
    expected: Vec<u64>,
    window_start: i64,
    spread_secs: u64,
    deadline_ms: i64,
    /// Delivered messages seen (the progress line).
    done: Arc<[AtomicU64; 2]>,
}

/// What one shard's consumer saw.
struct Seen {
    /// Distinct timed messages delivered.
    delivered: u64,
    duplicates: u64,
    early: u64,
    misrouted: u64,
    /// Records that are none of this run's timed messages, or do not decode.
    foreign: u64,
    first_error: Option<String>,
    /// Lateness in ms (an early record counts as 0 here and in `early`).
    lateness: Histogram<u64>,
    /// Lateness per second of due time (from the first due time).
    by_due_second: Vec<Option<Histogram<u64>>>,
    /// Deliveries per second of store time (from the first due time).
    per_second: Vec<u64>,
    first_delivery_ms: Option<i64>,
    last_delivery_ms: Option<i64>,
}

fn lateness_histogram(digits: u8) -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENESS_MAX_MS, digits).expect("valid histogram bounds")
}

/// Scenario 9 (module docs).
pub(super) fn run(
    cfg: &LoadConfig,
    dir: &Path,
    shards: usize,
) -> Result<(Value, String, Option<String>), String> {
    cfg.validate()?;
    let timed = cfg.timed;
    let plain = cfg.plain.unwrap_or((timed / 2).max(1));
    let first_timed = plain.min(timed);
    let spread_ms = (cfg.spread_secs * 1000) as i64;
    let template = cfg.store_template(dir);
    let entries = template.schedule.timer_memory_entries as u64;
    let bound = shards as u64 * crate::timer::memory_bound(entries as usize) as u64;
    let store = open_store(cfg, dir, shards, template)?;
    let handle = store.handle();
    let plan = Plan::new(cfg, handle.ownership(), shards, Vec::new())?;
    let owned = plan.owned.clone();
    let weights: Vec<u64> = owned.iter().map(|q| q.len() as u64).collect();
    let mut rng = Rng::new(0x7469_6D65);
    let body: Bytes = (0..cfg.body.max + 64 * 1024)
        .map(|_| rng.next() as u8)
        .collect::<Vec<u8>>()
        .into();
    let done = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
    let spec = |timed_kind: bool, from: Vec<u64>, count: Vec<u64>, base: Vec<u64>, window: i64| {
        Arc::new(PhaseSpec {
            timed: timed_kind,
            from,
            count,
            base,
            owned: owned.clone(),
            window_start: window,
            spread_ms,
            body: body.clone(),
            body_min: cfg.body.min,
            body_max: cfg.body.max,
            outstanding: cfg.outstanding,
            seed: if timed_kind {
                0x7469_6D65_6400
            } else {
                0x706C_6169_6E00
            },
            done: done.clone(),
        })
    };

    // 1. Plain messages, then the first `first_timed` timed ones.
    let mem_start = memory_status();
    let plain_counts = split(plain, &weights);
    let plain_base = starts(&plain_counts);
    let p = put_phase(
        "plain",
        &handle,
        spec(false, plain_base.clone(), plain_counts, plain_base, 0),
        &done,
        cfg.quiet,
    )?;
    let mem_after_plain = memory_status();
    let lead_ms = match cfg.lead_secs {
        Some(s) => s as i64 * 1000,
        None => {
            let est = timed as f64 / p.rate().max(1.0);
            ((4.0 * est + 2.0).max(3.0) * 1000.0).ceil() as i64
        }
    };
    let window_start = crate::now_ms() + lead_ms;
    let window_end = window_start + spread_ms;
    let timed_counts = split(timed, &weights);
    let timed_base = starts(&timed_counts);
    let first_counts = split(first_timed, &weights);
    // Each shard's share of the first phase is at most its share of all (same
    // weights, fewer messages); the rest follow on from there.
    let first_counts: Vec<u64> = first_counts
        .iter()
        .zip(&timed_counts)
        .map(|(a, b)| *a.min(b))
        .collect();
    let rest_from: Vec<u64> = timed_base
        .iter()
        .zip(&first_counts)
        .map(|(b, n)| b + n)
        .collect();
    let rest_counts: Vec<u64> = timed_counts
        .iter()
        .zip(&first_counts)
        .map(|(t, n)| t - n)
        .collect();
    let t1 = put_phase(
        "timed",
        &handle,
        spec(
            true,
            timed_base.clone(),
            first_counts.clone(),
            timed_base.clone(),
            window_start,
        ),
        &done,
        cfg.quiet,
    )?;
    let t2 = put_phase(
        "timed rest",
        &handle,
        spec(
            true,
            rest_from,
            rest_counts.clone(),
            timed_base.clone(),
            window_start,
        ),
        &done,
        cfg.quiet,
    )?;
    let puts_done_ms = crate::now_ms();
    let mem_after_puts = memory_status();

    // 4. Delivery (memory just before the first due time sampled meanwhile).
    let expected: Vec<u64> = (0..shards)
        .map(|s| first_counts[s] + rest_counts[s] - t1.shard_errors[s] - t2.shard_errors[s])
        .collect();
    let stored_timed: u64 = expected.iter().sum();
    let delivered_done = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
    let cspec = Arc::new(ConsumeSpec {
        owned: owned.clone(),
        from: p.queue_ends.clone(),
        base: timed_base,
        count: timed_counts,
        expected,
        window_start,
        spread_secs: cfg.spread_secs,
        deadline_ms: window_end + DELIVERY_GRACE_MS,
        done: delivered_done.clone(),
    });
    let mut mem_before_due = None;
    let mut cpu_at_window = None;
    let consumed = with_progress("delivered", &delivered_done, cfg.quiet, || {
        std::thread::scope(|s| {
            let h = handle.clone();
            let job = s.spawn(move || on_every_shard(&h, move |ctx| consume_shard(ctx, cspec)));
            let before = window_start - 200;
            while !job.is_finished() {
                let now = crate::now_ms();
                if mem_before_due.is_none() && now >= before {
                    mem_before_due = Some(memory_status());
                }
                if cpu_at_window.is_none() && now >= window_start {
                    cpu_at_window = Some((process_usage().0, Instant::now()));
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            let r = job
                .join()
                .unwrap_or_else(|_| Err("the consumers' thread panicked".into()));
            (r, process_usage().0, Instant::now())
        })
    });
    let (consumed, cpu_end, consumed_at) = consumed;
    store
        .shutdown()
        .map_err(|e| format!("shutdown failed: {e}"))?;
    let mem_end = memory_status();
    let seen = consumed?;

    // Merge what the shards saw.
    let mut lateness = lateness_histogram(3);
    let mut by_due: Vec<Option<Histogram<u64>>> = vec![None; cfg.spread_secs as usize];
    let mut per_second = vec![0u64; per_second_len(cfg.spread_secs)];
    let (mut delivered, mut duplicates, mut early, mut misrouted, mut foreign) = (0, 0, 0, 0, 0);
    let (mut first_delivery, mut last_delivery) = (None::<i64>, None::<i64>);
    let mut consumer_error = None;
    for s in seen {
        lateness
            .add(&s.lateness)
            .map_err(|e| format!("merging histograms: {e}"))?;
        for (into, h) in by_due.iter_mut().zip(s.by_due_second) {
            if let Some(h) = h {
                match into {
                    Some(i) => i.add(&h).map_err(|e| format!("merging histograms: {e}"))?,
                    None => *into = Some(h),
                }
            }
        }
        for (a, b) in per_second.iter_mut().zip(&s.per_second) {
            *a += b;
        }
        delivered += s.delivered;
        duplicates += s.duplicates;
        early += s.early;
        misrouted += s.misrouted;
        foreign += s.foreign;
        first_delivery = min_opt(first_delivery, s.first_delivery_ms);
        last_delivery = last_delivery.max(s.last_delivery_ms);
        consumer_error = consumer_error.or(s.first_error);
    }
    let missing = stored_timed.saturating_sub(delivered);

    // Problems.
    let mut problems: Vec<String> = Vec::new();
    for ph in [&p, &t1, &t2] {
        if let Some(e) = &ph.first_error {
            problems.push(format!(
                "{} puts: {} failed, first: {e}",
                ph.name, ph.errors
            ));
        }
    }
    if puts_done_ms >= window_start {
        problems.push(format!(
            "the timed puts ended {} ms after the first due time (raise --lead-secs)",
            puts_done_ms - window_start
        ));
    }
    if missing > 0 {
        problems.push(format!(
            "{missing} of {stored_timed} timed messages not delivered by {} s after the last \
             due time",
            DELIVERY_GRACE_MS / 1000
        ));
    }
    if duplicates > 0 {
        problems.push(format!("{duplicates} duplicate deliveries"));
    }
    if early > 0 {
        problems.push(format!("{early} delivered before their due time"));
    }
    if misrouted > 0 {
        problems.push(format!(
            "{misrouted} delivered to another queue than put for"
        ));
    }
    if foreign > 0 {
        problems.push(format!(
            "{foreign} records in the queues that are none of the timed messages"
        ));
    }
    if let Some(e) = consumer_error {
        problems.push(e);
    }

    let timed_all = Phase {
        name: "timed, all",
        messages: t1.messages + t2.messages,
        errors: t1.errors + t2.errors,
        first_error: None,
        seconds: t1.seconds + t2.seconds,
        cpu_seconds: t1.cpu_seconds + t2.cpu_seconds,
        queue_ends: Vec::new(),
        shard_errors: Vec::new(),
    };
    let span_s = last_delivery.map_or(0.0, |l| (l - window_start).max(1) as f64 / 1e3);
    let delivery_rate = if span_s > 0.0 {
        delivered as f64 / span_s
    } else {
        0.0
    };
    let (delivery_cpu, delivery_secs) = match cpu_at_window {
        Some((c, at)) => (cpu_end - c, consumed_at.duration_since(at).as_secs_f64()),
        None => (0.0, 0.0),
    };
    let pct = |h: &Histogram<u64>, q: f64| {
        if h.is_empty() {
            0
        } else {
            h.value_at_percentile(q)
        }
    };
    let lateness_json = |h: &Histogram<u64>| {
        json!({
            "count": h.len(),
            "p50": pct(h, 50.0),
            "p90": pct(h, 90.0),
            "p99": pct(h, 99.0),
            "p99_9": pct(h, 99.9),
            "max": h.max(),
            "mean": if h.is_empty() { 0.0 } else { h.mean() },
        })
    };
    let timeline: Vec<Value> = by_due
        .iter()
        .enumerate()
        .map(|(sec, h)| match h {
            Some(h) => json!({"due_second": sec, "count": h.len(), "p50": pct(h, 50.0),
                              "p99": pct(h, 99.0), "max": h.max()}),
            None => json!({"due_second": sec, "count": 0}),
        })
        .collect();
    let mem_json = |(rss, hwm): (u64, u64)| json!({"rss_bytes": rss, "hwm_bytes": hwm});
    let ok = problems.is_empty();
    let report = json!({
        "ok": ok,
        "first_error": problems.first(),
        "problems": problems,
        "topic": owned.iter().flat_map(|q| q.iter()).next().map(|q| q.topic.clone()),
        "queues": owned.iter().map(|q| q.len()).sum::<usize>(),
        "shard_queues": plan.queue_counts(),
        "body_bytes": cfg.body.to_string(),
        "outstanding_per_shard": cfg.outstanding,
        "plain": p.to_json(),
        "timed_first": t1.to_json(),
        "timed_rest": t2.to_json(),
        "timed_all": timed_all.to_json(),
        "timed_to_plain": {
            "messages_per_sec_ratio": t1.rate() / p.rate().max(1e-9),
            "cpu_per_message_ratio": t1.cpu_us() / p.cpu_us().max(1e-9),
            "all_timed_messages_per_sec_ratio": timed_all.rate() / p.rate().max(1e-9),
            "all_timed_cpu_per_message_ratio": timed_all.cpu_us() / p.cpu_us().max(1e-9),
        },
        "timed": timed,
        "timed_stored": stored_timed,
        "spread_secs": cfg.spread_secs,
        "lead_ms": lead_ms,
        "first_due_epoch_ms": window_start,
        "puts_done_ms_before_first_due": window_start - puts_done_ms,
        "memory": {
            "start": mem_json(mem_start),
            "after_plain_puts": mem_json(mem_after_plain),
            "after_timed_puts": mem_json(mem_after_puts),
            "before_first_due": mem_before_due.map(mem_json),
            "after_shutdown": mem_json(mem_end),
            "timer_memory_entries": entries,
            "timer_bound_bytes": bound,
            "note": "RSS is the whole process (write pools, read cache, queues, key index, \
                     timer); the bound is the timer's pending sets alone",
        },
        "delivery": {
            "delivered": delivered,
            "missing": missing,
            "duplicates": duplicates,
            "early": early,
            "misrouted": misrouted,
            "foreign": foreign,
            "first_delivery_ms_after_first_due": first_delivery.map(|f| f - window_start),
            "last_delivery_ms_after_last_due": last_delivery.map(|l| l - window_end),
            "messages_per_sec": delivery_rate,
            "offered_per_sec": timed as f64 / cfg.spread_secs as f64,
            "peak_per_sec": per_second.iter().max(),
            "cpu_seconds": delivery_cpu,
            "seconds": delivery_secs,
            "cpu_us_per_delivery": delivery_cpu * 1e6 / delivered.max(1) as f64,
            "lateness_ms": lateness_json(&lateness),
            "lateness_ms_by_due_second": timeline,
            "delivered_per_second": per_second,
        },
        "cpus": allowed_cpus().len(),
    });

    // Text.
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let mut text = String::new();
    text.push_str(&p.line());
    text.push_str(&t1.line());
    text.push_str(&t2.line());
    let _ = writeln!(
        text,
        "  timed/plain {:.2}x msg/s, {:.2}x CPU/msg (same count); all {} timed: {:.2}x msg/s, \
         {:.2}x CPU/msg",
        t1.rate() / p.rate().max(1e-9),
        t1.cpu_us() / p.cpu_us().max(1e-9),
        timed_all.messages,
        timed_all.rate() / p.rate().max(1e-9),
        timed_all.cpu_us() / p.cpu_us().max(1e-9),
    );
    let _ = writeln!(
        text,
        "  pending     {stored_timed} timed messages due over {} s from {:.1} s after the plain \
         puts; puts done {:.1} s before the first",
        cfg.spread_secs,
        lead_ms as f64 / 1e3,
        (window_start - puts_done_ms) as f64 / 1e3
    );
    let _ = writeln!(
        text,
        "  memory      RSS {:.1} MiB after the timed puts (HWM {:.1}), {:.1} MiB before the first \
         due time, {:.1} MiB after the plain puts; timer bound {:.1} MiB ({shards} x ({entries} \
         x 24 B + 1 MiB)); RSS is the whole process",
        mib(mem_after_puts.0),
        mib(mem_after_puts.1),
        mib(mem_before_due.map_or(0, |m| m.0)),
        mib(mem_after_plain.0),
        mib(bound),
    );
    let _ = writeln!(
        text,
        "  delivery    {delivered} delivered, {missing} missing, {duplicates} duplicates, {early} \
         early; {delivery_rate:.0} msg/s (due {:.0}), peak {} in a second; {:.2} µs process CPU \
         per delivery (timer, re-puts, consumers' polling)",
        timed as f64 / cfg.spread_secs as f64,
        per_second.iter().max().unwrap_or(&0),
        delivery_cpu * 1e6 / delivered.max(1) as f64,
    );
    if !lateness.is_empty() {
        let _ = writeln!(
            text,
            "  lateness    ms  p50={}  p90={}  p99={}  p99.9={}  max={}",
            pct(&lateness, 50.0),
            pct(&lateness, 90.0),
            pct(&lateness, 99.0),
            pct(&lateness, 99.9),
            lateness.max()
        );
        let _ = writeln!(text, "  by due time {}", segments(&by_due));
    }
    if !ok {
        let _ = writeln!(text, "  PROBLEMS    {}", problems.join("; "));
    }
    Ok((report, text, None))
}

/// Lateness p99 (and max) over ten equal segments of the window, as text.
fn segments(by_due: &[Option<Histogram<u64>>]) -> String {
    let n = by_due.len();
    let parts = n.min(10);
    let mut out = Vec::new();
    for k in 0..parts {
        let (a, b) = (k * n / parts, (k + 1) * n / parts);
        let mut h = lateness_histogram(2);
        for x in by_due[a..b].iter().flatten() {
            let _ = h.add(x);
        }
        if h.is_empty() {
            out.push(format!("{a}-{b}s -"));
        } else {
            out.push(format!(
                "{a}-{b}s p99 {} max {}",
                h.value_at_percentile(99.0),
                h.max()
            ));
        }
    }
    out.join(", ")
}

fn min_opt(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Deliveries are counted per second from the first due time to the consumers'
/// deadline.
fn per_second_len(spread_secs: u64) -> usize {
    spread_secs as usize + (DELIVERY_GRACE_MS / 1000) as usize + 2
}

/// `n` split over shards in proportion to `weights` (a shard of weight 0 gets none).
fn split(n: u64, weights: &[u64]) -> Vec<u64> {
    let total: u64 = weights.iter().sum();
    if total == 0 {
        return vec![0; weights.len()];
    }
    let mut out: Vec<u64> = weights.iter().map(|w| n * w / total).collect();
    let mut left = n - out.iter().sum::<u64>();
    for (o, w) in out.iter_mut().zip(weights) {
        if left == 0 {
            break;
        }
        if *w > 0 {
            *o += 1;
            left -= 1;
        }
    }
    out
}

/// Where each shard's range starts when they follow one another.
fn starts(counts: &[u64]) -> Vec<u64> {
    let mut at = 0;
    counts
        .iter()
        .map(|c| {
            let s = at;
            at += c;
            s
        })
        .collect()
}

/// `VmRSS` and `VmHWM` of this process in bytes (0 when unknown).
fn memory_status() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Runs one put phase on every shard: its time (first put to every shard's puts
/// returned and dispatched) and CPU.
fn put_phase(
    name: &'static str,
    handle: &crate::Handle,
    spec: Arc<PhaseSpec>,
    done: &Arc<[AtomicU64; 2]>,
    quiet: bool,
) -> Result<Phase, String> {
    let what = format!("{name} put");
    // Timed inside: `with_progress` returns once its progress thread saw the stop (up to
    // 50 ms later).
    let (results, seconds, cpu0, cpu1) = with_progress(&what, done, quiet, || {
        let (cpu0, _) = process_usage();
        let started = Instant::now();
        let r = on_every_shard(handle, move |ctx| put_shard(ctx, spec));
        (r, started.elapsed().as_secs_f64(), cpu0, process_usage().0)
    });
    let results = results?;
    let mut phase = Phase {
        name,
        messages: 0,
        errors: 0,
        first_error: None,
        seconds,
        cpu_seconds: cpu1 - cpu0,
        queue_ends: Vec::new(),
        shard_errors: Vec::new(),
    };
    for r in results {
        phase.messages += r.stored;
        phase.errors += r.errors;
        phase.first_error = phase.first_error.or(r.first_error);
        phase.queue_ends.push(r.queue_ends);
        phase.shard_errors.push(r.errors);
    }
    Ok(phase)
}

/// A shard's part of a put phase: `--outstanding` lanes taking message indices in turn.
async fn put_shard(ctx: ShardContext, spec: Arc<PhaseSpec>) -> PhaseShard {
    let s = ctx.shard;
    let store = ctx.store;
    let (from, count) = (spec.from[s], spec.count[s]);
    let next = Rc::new(Cell::new(from));
    let end = from + count;
    let stored = Rc::new(Cell::new(0u64));
    let errors = Rc::new(Cell::new(0u64));
    let first_error = Rc::new(RefCell::new(None::<String>));
    if count > 0 {
        let tq = executor().create_task_queue(
            Shares::Static(1000),
            Latency::NotImportant,
            "timer-bench",
        );
        let mut lanes = Vec::new();
        for l in 0..spec.outstanding.min(count as u32) {
            let (store, spec, next) = (store.clone(), spec.clone(), next.clone());
            let (stored, errors, first_error) =
                (stored.clone(), errors.clone(), first_error.clone());
            let lane = async move {
                let mut rng = Rng::new(spec.seed ^ ((s as u64) << 32) ^ l as u64);
                let queues = &spec.owned[s];
                let mut msg = Message::new(queues[0].topic.as_str(), 0, Bytes::new());
                msg.properties = vec![
                    (TAGS.into(), "bench".into()),
                    (UNIQ_KEY.into(), String::new()),
                ];
                if spec.timed {
                    msg.properties
                        .push((TIMER_DELIVER_MS.into(), String::new()));
                }
                loop {
                    let i = next.get();
                    if i >= end {
                        break;
                    }
                    next.set(i + 1);
                    let q = &queues[((i - spec.base[s]) % queues.len() as u64) as usize];
                    msg.queue_id = q.id;
                    let len = spec.body_min
                        + (rng.next() % (spec.body_max - spec.body_min + 1) as u64) as usize;
                    let at = (rng.next() % (64 * 1024)) as usize;
                    msg.body = spec.body.slice(at..at + len);
                    msg.born_timestamp_ms = crate::now_ms();
                    let key = &mut msg.properties[1].1;
                    key.clear();
                    let _ = write!(key, "{}{i}", if spec.timed { 'T' } else { 'P' });
                    if spec.timed {
                        let due = spec.window_start + (rng.next() % spec.spread_ms as u64) as i64;
                        let v = &mut msg.properties[2].1;
                        v.clear();
                        let _ = write!(v, "{due}");
                    }
                    let r = store.put(&msg).await;
                    if r.status.is_stored() {
                        stored.set(stored.get() + 1);
                        spec.done[0].fetch_add(1, Ordering::Relaxed);
                        spec.done[1].fetch_add(len as u64, Ordering::Relaxed);
                    } else {
                        errors.set(errors.get() + 1);
                        first_error
                            .borrow_mut()
                            .get_or_insert(format!("put to {}/{}: {:?}", q.topic, q.id, r.status));
                    }
                    futures_lite::future::yield_now().await;
                }
            };
            lanes.push(spawn_local_into(lane, tq).expect("spawn a put lane"));
        }
        for l in lanes {
            l.await;
        }
    }
    store.wait_dispatched().await;
    let queue_ends = spec.owned[s]
        .iter()
        .map(|q| store.max_queue_offset(&q.topic, q.id))
        .collect();
    let first_error = first_error.borrow_mut().take();
    PhaseShard {
        stored: stored.get(),
        errors: errors.get(),
        first_error,
        queue_ends,
    }
}

/// A shard's consumer: polls its queues until every timed message it stored was
/// delivered (and a second more), or the deadline.
async fn consume_shard(ctx: ShardContext, spec: Arc<ConsumeSpec>) -> Seen {
    let s = ctx.shard;
    let store = ctx.store;
    let queues = spec.owned[s].clone();
    let mut offsets = spec.from[s].clone();
    let (base, count) = (spec.base[s], spec.count[s]);
    let mut bits = vec![0u64; count.div_ceil(64) as usize];
    let mut seen = Seen {
        delivered: 0,
        duplicates: 0,
        early: 0,
        misrouted: 0,
        foreign: 0,
        first_error: None,
        lateness: lateness_histogram(3),
        by_due_second: (0..spec.spread_secs).map(|_| None).collect(),
        per_second: vec![0; per_second_len(spec.spread_secs)],
        first_delivery_ms: None,
        last_delivery_ms: None,
    };
    let mut all_seen_at = None;
    'poll: loop {
        let mut got_any = false;
        for (qi, q) in queues.iter().enumerate() {
            while offsets[qi] < store.max_queue_offset(&q.topic, q.id) {
                let got = match store
                    .get(&q.topic, q.id, offsets[qi], GET_BATCH, 4 << 20)
                    .await
                {
                    Ok(g) => g,
                    Err(e) => {
                        seen.first_error = Some(format!("get {}/{}: {e}", q.topic, q.id));
                        break 'poll;
                    }
                };
                if got.status != GetStatus::Found {
                    seen.first_error = Some(format!(
                        "get {}/{} at {}: {:?}",
                        q.topic, q.id, offsets[qi], got.status
                    ));
                    break 'poll;
                }
                got_any = true;
                for raw in &got.records {
                    take(&spec, &mut seen, &mut bits, base, count, &queues, q, raw);
                }
                offsets[qi] = got.next_begin_offset;
                glommio::yield_if_needed().await;
            }
        }
        let now = crate::now_ms();
        if seen.delivered >= spec.expected[s] {
            let at = *all_seen_at.get_or_insert(now);
            if now - at >= DUPLICATE_WATCH_MS {
                break;
            }
        }
        if now >= spec.deadline_ms {
            break;
        }
        if !got_any {
            glommio::timer::sleep(POLL_IDLE).await;
        }
    }
    seen
}

/// Accounts one record read from queue `q` of this shard.
#[allow(clippy::too_many_arguments)]
fn take(
    spec: &ConsumeSpec,
    seen: &mut Seen,
    bits: &mut [u64],
    base: u64,
    count: u64,
    queues: &[QueueRef],
    q: &QueueRef,
    raw: &[u8],
) {
    let Ok(Decoded::Record(r)) = record::decode(raw, RETURNED) else {
        seen.foreign += 1;
        return;
    };
    let index = r
        .property(UNIQ_KEY)
        .and_then(|k| k.strip_prefix('T'))
        .and_then(|k| k.parse::<u64>().ok())
        .filter(|i| (base..base + count).contains(i));
    let due = r.property(TIMER_OUT_MS).and_then(|v| v.parse::<i64>().ok());
    let (Some(i), Some(due)) = (index, due) else {
        seen.foreign += 1;
        return;
    };
    let k = i - base;
    let (word, bit) = ((k / 64) as usize, 1u64 << (k % 64));
    if bits[word] & bit != 0 {
        seen.duplicates += 1;
        return;
    }
    bits[word] |= bit;
    seen.delivered += 1;
    spec.done[0].fetch_add(1, Ordering::Relaxed);
    spec.done[1].fetch_add(r.body.len() as u64, Ordering::Relaxed);
    if queues[(k % queues.len() as u64) as usize].id != q.id {
        seen.misrouted += 1;
    }
    let stored = r.store_timestamp;
    let late = stored - due;
    if late < 0 {
        seen.early += 1;
    }
    let late = late.max(0) as u64;
    seen.lateness.saturating_record(late);
    let sec = (due - spec.window_start).max(0) as usize / 1000;
    if let Some(slot) = seen.by_due_second.get_mut(sec) {
        slot.get_or_insert_with(|| lateness_histogram(2))
            .saturating_record(late);
    }
    let at = ((stored - spec.window_start).max(0) / 1000) as usize;
    let last = seen.per_second.len() - 1;
    seen.per_second[at.min(last)] += 1;
    seen.first_delivery_ms = min_opt(seen.first_delivery_ms, Some(stored));
    seen.last_delivery_ms = seen.last_delivery_ms.max(Some(stored));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_follows_the_weights_exactly() {
        assert_eq!(split(10, &[1, 1]), vec![5, 5]);
        assert_eq!(split(11, &[1, 0, 1]), vec![6, 0, 5]);
        assert_eq!(split(7, &[0, 0]), vec![0, 0]);
        let s = split(1_000_001, &[33, 31]);
        assert_eq!(s.iter().sum::<u64>(), 1_000_001);
        assert_eq!(starts(&[3, 0, 4]), vec![0, 3, 3]);
    }

    #[test]
    fn memory_status_reads_this_process() {
        let (rss, hwm) = memory_status();
        assert!(rss > 0 && hwm >= rss, "{rss} {hwm}");
    }
}
