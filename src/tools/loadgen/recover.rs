//! Scenario 7, recovery (RocketMQ's `DefaultMessageStore.load` after a crash): the
//! time `ShardedStore::open` takes on a kept store, what users wait for when a node
//! restarts, and each shard's `OpenReport`: records scanned, queue entries rebuilt,
//! where dispatch resumed, and the seconds of each open phase.

use super::config::LoadConfig;
use super::open_store;
use super::run::on_every_shard;
use serde_json::{Value, json};
use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

/// Scenario 7: the time `ShardedStore::open` takes (every shard recovering in
/// parallel, each on its own CPU), then a clean shutdown, timed apart.
pub(super) fn run(
    cfg: &LoadConfig,
    dir: &Path,
    shards: usize,
) -> Result<(Value, String, Option<String>), String> {
    let abnormal: Vec<bool> = (0..shards)
        .map(|i| dir.join(format!("shard-{i}")).join("abort").exists())
        .collect();
    let started = Instant::now();
    let store = open_store(cfg, dir, shards, cfg.store_template(dir))?;
    let open_secs = started.elapsed().as_secs_f64();
    let results = on_every_shard(&store.handle(), |ctx| async move {
        let s = ctx.store;
        ((*s.report).clone(), s.min_log_offset(), s.max_log_offset())
    });
    let asked = started.elapsed().as_secs_f64();
    store
        .shutdown()
        .map_err(|e| format!("shutdown failed: {e}"))?;
    let total_secs = started.elapsed().as_secs_f64();
    let results = results?;
    let log_bytes: u64 = results.iter().map(|(_, min, max)| max - min).sum();
    let per_shard: Vec<Value> = results
        .iter()
        .zip(&abnormal)
        .map(|((r, min, max), abort)| {
            json!({
                "abort_file_found": abort,
                "clean_shutdown": r.clean_shutdown,
                "checkpoint_valid": r.checkpoint_valid,
                "records_scanned": r.records_scanned,
                "log_bytes": max - min,
                "log_end": r.log_end,
                "truncated": r.truncated,
                "dispatched_from": r.dispatched_from,
                "entries_rebuilt": r.entries_rebuilt,
                "queues": r.queues,
                "open_phases_seconds": r.phases.iter().map(|(n, s)| json!([n, s])).collect::<Vec<_>>(),
            })
        })
        .collect();
    let all_abnormal = abnormal.iter().all(|a| *a);
    let report = json!({
        "ok": true,
        "first_error": None::<String>,
        "abnormal": all_abnormal,
        "open_seconds": open_secs,
        "shutdown_seconds": total_secs - asked,
        "log_bytes": log_bytes,
        "records_scanned": results.iter().map(|(r, _, _)| r.records_scanned).sum::<u64>(),
        "entries_rebuilt": results.iter().map(|(r, _, _)| r.entries_rebuilt).sum::<u64>(),
        "per_shard": per_shard,
    });
    let mut text = format!(
        "  recovery    open {open_secs:.3} s ({} after a {}) of {:.1} MB of log; shutdown {:.3} s\n",
        if all_abnormal { "abnormal" } else { "normal" },
        if all_abnormal {
            "crash: abort files found"
        } else {
            "clean shutdown"
        },
        log_bytes as f64 / 1e6,
        total_secs - asked
    );
    for (i, (r, _, _)) in results.iter().enumerate() {
        let _ = writeln!(
            text,
            "  shard {i}     scanned {} records, rebuilt {} queue entries from {}, log end {}{}\n              open steps: {}",
            r.records_scanned,
            r.entries_rebuilt,
            r.dispatched_from,
            r.log_end,
            r.truncated
                .map_or(String::new(), |(at, n)| format!(", cut {n} bytes at {at}")),
            r.phases
                .iter()
                .map(|(n, s)| format!("{n} {s:.3} s"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok((report, text, None))
}
