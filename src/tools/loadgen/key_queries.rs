//! Scenario 6, key queries (RocketMQ's `queryMessage` by key, what `mqadmin
//! queryMsgByKey` and the console call): `--queries` random keys, one query at a
//! time, each through the all-shard `Handle::query_by_key` (asked of every shard in
//! parallel, merged newest first), the call users make. One in 100 asks for a key
//! never put.
//!
//! The keys come from the layout of the `--messages` run that wrote the store
//! (`plan.rs`): message `seq` of producer `g` carried keys `k<g>-<seq>-<j>` and went
//! to a known queue, so a hit must include a message of that queue.

use super::config::LoadConfig;
use super::measure::now_ns;
use super::open_store;
use super::plan::Plan;
use super::produce::{Rng, push_key};
use super::progress::with_progress;
use super::report::{Report, latency_line, new_histogram};
use super::svg::latency_svg;
use crate::Handle;
use crate::StoreOps;
use hdrhistogram::Histogram;
use serde_json::{Value, json};
use std::fmt::Write as _;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// Results asked for per query (RocketMQ's default `maxNum`).
const MAX_RESULTS: usize = 32;

/// What the queries measured.
struct QueryResult {
    hits: Histogram<u64>,
    misses: Histogram<u64>,
    /// Existing keys the query did not find.
    not_found: u64,
    /// Keys never written that the query found.
    false_hits: u64,
    first_error: Option<String>,
    seconds: f64,
}

pub(super) fn run(
    cfg: &LoadConfig,
    dir: &Path,
    shards: usize,
) -> Result<(Value, String, Option<String>), String> {
    let written = cfg
        .messages
        .ok_or("--mode key-queries needs --messages: the count the store was written with")?;
    if cfg.keys == 0 {
        return Err("--mode key-queries needs --keys 1 or more".into());
    }
    let store = open_store(cfg, dir, shards, cfg.store_template(dir))?;
    let plan = Plan::new(cfg, store.handle().ownership(), shards, Vec::new())?;
    let done = [AtomicU64::new(0), AtomicU64::new(0)];
    let handle = store.handle();
    let r = with_progress("queries", &done, cfg.quiet, || {
        futures_lite::future::block_on(ask(&plan, &handle, &done[0]))
    });
    store
        .shutdown()
        .map_err(|e| format!("shutdown failed: {e}"))?;
    let (hits, misses) = (&r.hits, &r.misses);
    let mut first_error = r.first_error.clone();
    if first_error.is_none() && r.not_found + r.false_hits > 0 {
        first_error = Some(format!(
            "{} written keys not found, {} unwritten keys found",
            r.not_found, r.false_hits
        ));
    }
    let keys = written * cfg.keys as u64;
    let queries = hits.len() + misses.len();
    let secs = r.seconds;
    let report = json!({
        "ok": first_error.is_none(),
        "first_error": first_error,
        "keys": keys,
        "queries": queries,
        "hit_queries": hits.len(),
        "miss_queries": misses.len(),
        "not_found": r.not_found,
        "false_hits": r.false_hits,
        "seconds": secs,
        "queries_per_sec": if secs > 0.0 { queries as f64 / secs } else { 0.0 },
        "query_latency_us": Report::latency_json(hits),
        "miss_latency_us": Report::latency_json(misses),
    });
    let mut text = format!(
        "  keys        {keys} written ({written} messages x {} keys); {queries} queries of \
         all {shards} shards, one at a time, in {secs:.2} s\n",
        cfg.keys
    );
    text.push_str(&latency_line("hit", hits));
    text.push_str(&latency_line("miss", misses));
    if let Some(e) = report["first_error"].as_str() {
        let _ = writeln!(text, "  ERRORS      {e}");
    }
    let svg = latency_svg(
        &cfg.label,
        &format!("key queries over {keys} keys"),
        &[("hit", "#1f77b4", hits), ("miss", "#d62728", misses)],
    );
    Ok((report, text, Some(svg)))
}

/// Asks `--queries` random keys one at a time, counting each in `done`.
async fn ask(plan: &Plan, handle: &Handle, done: &AtomicU64) -> QueryResult {
    let cfg = &plan.cfg;
    let producers = plan.producers.len() as u64;
    let mut rng = Rng::new(0x6B65_7973);
    let mut out = QueryResult {
        hits: new_histogram(),
        misses: new_histogram(),
        not_found: 0,
        false_hits: 0,
        first_error: None,
        seconds: 0.0,
    };
    let start = now_ns();
    let mut key = String::with_capacity(48);
    for i in 0..cfg.queries {
        let g = (rng.next() % producers) as usize;
        let quota = plan.quota(g).unwrap_or(0);
        let miss = i % 100 == 99 || quota == 0;
        let seq = if miss {
            quota + rng.next() % 1_000_000
        } else {
            rng.next() % quota
        };
        key.clear();
        push_key(&mut key, g, seq, (rng.next() % cfg.keys as u64) as u32);
        let queue = plan.queue_of(g, seq);
        let (topic, q) = (&queue.topic, queue.id);
        let asked = now_ns();
        let found = handle
            .query_by_key(topic, &key, MAX_RESULTS, 0, i64::MAX)
            .await;
        let took = now_ns().saturating_sub(asked);
        let msgs = match found {
            Ok(msgs) => msgs,
            Err(e) => {
                out.first_error = Some(format!("query {topic} {key}: {e}"));
                break;
            }
        };
        if miss {
            out.misses.saturating_record(took);
            out.false_hits += u64::from(!msgs.is_empty());
        } else {
            out.hits.saturating_record(took);
            if !msgs.iter().any(|m| m.queue_id == q && &m.topic == topic) {
                out.not_found += 1;
                out.first_error.get_or_insert(format!(
                    "key {key} of {topic}/{q}: {} results, none in that queue",
                    msgs.len()
                ));
            }
        }
        done.fetch_add(1, Ordering::Relaxed);
    }
    out.seconds = now_ns().saturating_sub(start) as f64 / 1e9;
    out
}
