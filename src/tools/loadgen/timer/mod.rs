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
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | the scenario's order, its problems and its report |
//! | `put.rs` | the put phases (shard-local producers, time and CPU) |
//! | `deliver.rs` | the consumers and what they saw, merged over the shards |

mod deliver;
mod put;

use super::config::LoadConfig;
use super::measure::{allowed_cpus, memory_status, process_usage};
use super::open_store;
use super::plan::Plan;
use super::produce::Rng;
use super::progress::with_progress;
use super::run::on_every_shard;
use bytes::Bytes;
use deliver::{ConsumeSpec, Delivery, consume_shard, lateness_histogram};
use hdrhistogram::Histogram;
use put::{Phase, PhaseSpec, put_phase, split, starts};
use serde_json::{Value, json};
use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

/// After the last due time, how long the consumers wait for missing messages.
pub(super) const DELIVERY_GRACE_MS: i64 = 60_000;
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
    let Delivery {
        lateness,
        by_due,
        per_second,
        delivered,
        duplicates,
        early,
        misrouted,
        foreign,
        first_delivery,
        last_delivery,
        first_error: consumer_error,
    } = Delivery::merge(seen, cfg.spread_secs)?;
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
