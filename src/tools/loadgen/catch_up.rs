//! Scenario 5, catch-up reads (a RocketMQ consumer group starting from the first
//! offset of a topic with a backlog): on each shard, one reader per queue it holds,
//! all at once, each reading its queue from the first offset with `Store::get` of
//! `--pull-batch` messages. Reports MB/s and msg/s against what the queues held, get
//! latency and the read cache's counters.

use super::config::LoadConfig;
use super::consume::RETURNED;
use super::measure::{now_ns, process_usage};
use super::open_store;
use super::progress::with_progress;
use super::report::{Report, latency_line, new_histogram};
use super::run::on_every_shard;
use super::svg::latency_svg;
use crate::format::record::{self, Decoded};
use crate::{GetStatus, Store};
use hdrhistogram::Histogram;
use serde_json::{Value, json};
use std::cell::{Cell, RefCell};
use std::fmt::Write as _;
use std::path::Path;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// What one shard read in catch-up mode.
struct ReadResult {
    start_ns: u64,
    end_ns: u64,
    /// Entries in the shard's queues when it started: what it should read.
    expected: u64,
    queues: u64,
    messages: u64,
    body_bytes: u64,
    log_bytes: u64,
    log_size: u64,
    gets: u64,
    first_error: Option<String>,
    get_latency: Histogram<u64>,
    /// The shard's read-cache counters at the end (zeros when it is off).
    cache: crate::commit_log::read_cache::ReadCacheStats,
}

/// One shard's readers' shared tallies.
#[derive(Default)]
struct ReadTally {
    messages: Cell<u64>,
    body_bytes: Cell<u64>,
    log_bytes: Cell<u64>,
    gets: Cell<u64>,
    first_error: RefCell<Option<String>>,
}

/// Scenario 5: every queue of every shard read from its first offset by one reader
/// per queue, all at once, `--pull-batch` messages per get.
pub(super) fn run(
    cfg: &LoadConfig,
    dir: &Path,
    shards: usize,
) -> Result<(Value, String, Option<String>), String> {
    let store = open_store(cfg, dir, shards, cfg.store_template(dir))?;
    let done = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
    let batch = cfg.pull_batch as usize;
    let done2 = done.clone();
    let (cpu_start, _) = process_usage();
    let results = with_progress("read msg", &done, cfg.quiet, || {
        on_every_shard(&store.handle(), move |ctx| {
            catch_up_job(ctx.store, batch, done2)
        })
    });
    let (cpu_end, _) = process_usage();
    store
        .shutdown()
        .map_err(|e| format!("shutdown failed: {e}"))?;
    let results = results?;
    let start = results.iter().map(|r| r.start_ns).min().unwrap_or(0);
    let end = results.iter().map(|r| r.end_ns).max().unwrap_or(0);
    let secs = end.saturating_sub(start) as f64 / 1e9;
    let sum = |f: fn(&ReadResult) -> u64| results.iter().map(f).sum::<u64>();
    let (messages, expected) = (sum(|r| r.messages), sum(|r| r.expected));
    let (body, log, size) = (
        sum(|r| r.body_bytes),
        sum(|r| r.log_bytes),
        sum(|r| r.log_size),
    );
    let mut hist = new_histogram();
    for r in &results {
        hist.add(&r.get_latency)
            .map_err(|e| format!("merging histograms: {e}"))?;
    }
    let mut first_error = results.iter().find_map(|r| r.first_error.clone());
    if first_error.is_none() && messages != expected {
        first_error = Some(format!("read {messages} of {expected} messages"));
    }
    let rate = |v: f64| if secs > 0.0 { v / secs } else { 0.0 };
    let report = json!({
        "ok": first_error.is_none(),
        "first_error": first_error,
        "pull_batch": batch,
        "queues": sum(|r| r.queues),
        "messages": messages,
        "expected": expected,
        "bytes": body,
        "log_bytes_read": log,
        "log_size_bytes": size,
        "gets": sum(|r| r.gets),
        "read_cache": {
            "block_reads": sum(|r| r.cache.reads),
            "read_ahead": sum(|r| r.cache.read_ahead),
            "bytes_read": sum(|r| r.cache.bytes_read),
            "hits": sum(|r| r.cache.hits),
            "shared": sum(|r| r.cache.shared),
            "misses": sum(|r| r.cache.misses),
            "evictions": sum(|r| r.cache.evictions),
            "failed": sum(|r| r.cache.failed),
        },
        "seconds": secs,
        "messages_per_sec": rate(messages as f64),
        "mb_per_sec": rate(body as f64 / 1e6),
        "log_mb_per_sec": rate(log as f64 / 1e6),
        "get_latency_us": Report::latency_json(&hist),
        "cpu_seconds": cpu_end - cpu_start,
        "cpu_us_per_message": if messages > 0 {
            (cpu_end - cpu_start) * 1e6 / messages as f64
        } else {
            0.0
        },
    });
    let mut text = format!(
        "  read        {:>12.0} msg/s  {:>9.1} MB/s body  {:>9.1} MB/s log  ({messages} of \
         {expected} messages, {:.1} MB of records, in {secs:.2} s; log {:.1} MB)\n",
        rate(messages as f64),
        rate(body as f64 / 1e6),
        rate(log as f64 / 1e6),
        log as f64 / 1e6,
        size as f64 / 1e6,
    );
    let gets = latency_line("get", &hist);
    let _ = writeln!(
        text,
        "{}  ({} gets of up to {batch})",
        gets.trim_end(),
        hist.len()
    );
    let _ = writeln!(text, "  cpu         {:.2} s", cpu_end - cpu_start);
    let _ = writeln!(
        text,
        "  read cache  {:.1} MB read in {} block reads ({} ahead); lookups: {} hits, {} \
         shared reads, {} misses; {} evictions",
        sum(|r| r.cache.bytes_read) as f64 / 1e6,
        sum(|r| r.cache.reads),
        sum(|r| r.cache.read_ahead),
        sum(|r| r.cache.hits),
        sum(|r| r.cache.shared),
        sum(|r| r.cache.misses),
        sum(|r| r.cache.evictions),
    );
    if let Some(e) = report["first_error"].as_str() {
        let _ = writeln!(text, "  ERRORS      {e}");
    }
    let svg = latency_svg(
        &cfg.label,
        &format!("catch-up gets of up to {batch} messages"),
        &[("get", "#1f77b4", &hist)],
    );
    Ok((report, text, Some(svg)))
}

async fn catch_up_job(store: Store, batch: usize, done: Arc<[AtomicU64; 2]>) -> ReadResult {
    let tally = Rc::new(ReadTally::default());
    let hist = Rc::new(RefCell::new(new_histogram()));
    let queues = store.queues();
    let queue_count = queues.len() as u64;
    let expected = queues
        .iter()
        .map(|(t, q)| store.max_queue_offset(t, *q) - store.min_queue_offset(t, *q))
        .sum();
    let start_ns = now_ns();
    let mut readers = Vec::new();
    for (topic, q) in queues {
        let (store, tally, hist, done) = (store.clone(), tally.clone(), hist.clone(), done.clone());
        readers.push(glommio::spawn_local(async move {
            read_queue_from_start(&store, &topic, q, batch, &tally, &hist, &done).await;
        }));
    }
    for r in readers {
        r.await;
    }
    let end_ns = now_ns();
    ReadResult {
        start_ns,
        end_ns,
        expected,
        queues: queue_count,
        messages: tally.messages.get(),
        body_bytes: tally.body_bytes.get(),
        log_bytes: tally.log_bytes.get(),
        log_size: store.max_log_offset() - store.min_log_offset(),
        gets: tally.gets.get(),
        first_error: tally.first_error.borrow_mut().take(),
        get_latency: hist.replace(new_histogram()),
        cache: store.read_cache_stats().unwrap_or_default(),
    }
}

async fn read_queue_from_start(
    store: &Store,
    topic: &str,
    q: i32,
    batch: usize,
    tally: &ReadTally,
    hist: &RefCell<Histogram<u64>>,
    done: &[AtomicU64; 2],
) {
    let fail = |why: String| {
        tally.first_error.borrow_mut().get_or_insert(why);
    };
    let mut offset = store.min_queue_offset(topic, q);
    loop {
        let asked = now_ns();
        let got = match store.get(topic, q, offset, batch, 64 << 20).await {
            Ok(got) => got,
            Err(e) => return fail(format!("get {topic}/{q} at {offset}: {e}")),
        };
        hist.borrow_mut()
            .saturating_record(now_ns().saturating_sub(asked));
        tally.gets.set(tally.gets.get() + 1);
        match got.status {
            GetStatus::Found => {}
            GetStatus::OffsetOverflowOne | GetStatus::NoMessageInQueue => return,
            GetStatus::OffsetFoundNull => {
                offset = got.next_begin_offset;
                continue;
            }
            other => {
                return fail(format!(
                    "get {topic}/{q} at {offset}: {other:?} (queue {}..{})",
                    got.min_offset, got.max_offset
                ));
            }
        }
        let (mut body, mut log) = (0, 0);
        for raw in &got.records {
            log += raw.len() as u64;
            match record::decode(raw, RETURNED) {
                Ok(Decoded::Record(r)) => body += r.body.len() as u64,
                _ => fail(format!("{topic}/{q}: a record does not decode")),
            }
        }
        let n = got.records.len() as u64;
        tally.messages.set(tally.messages.get() + n);
        tally.body_bytes.set(tally.body_bytes.get() + body);
        tally.log_bytes.set(tally.log_bytes.get() + log);
        done[0].fetch_add(n, Ordering::Relaxed);
        done[1].fetch_add(body, Ordering::Relaxed);
        offset = got.next_begin_offset;
        glommio::yield_if_needed().await;
    }
}
