//! The store's statistics in Prometheus text form, per shard (`shard` label), for the
//! node's `/metrics` (and anyone embedding the store).

use super::{LATENCY_BOUNDS_US, StoreStats, WINDOWS_S};
use crate::clean::CleanStats;
use crate::clean::policy::Level;
use std::fmt::Write;

/// Appends the metrics of `shards` (and their retention counters, when given, in
/// shard order) to `out`.
pub fn render(out: &mut String, shards: &[StoreStats], clean: &[CleanStats]) {
    type Pick = fn(&StoreStats) -> u64;
    let counters: [(&str, &str, Pick); 16] = [
        ("coremq_store_put_calls_total", "Store put calls.", |s| {
            s.put_calls
        }),
        ("coremq_store_put_messages_total", "Messages stored.", |s| {
            s.put_messages
        }),
        (
            "coremq_store_put_bytes_total",
            "Record bytes stored.",
            |s| s.put_bytes,
        ),
        (
            "coremq_store_put_failed_total",
            "Put calls refused or failed.",
            |s| s.put_failed,
        ),
        (
            "coremq_store_get_found_total",
            "Get calls that found messages.",
            |s| s.get_found,
        ),
        (
            "coremq_store_get_miss_total",
            "Get calls that found none.",
            |s| s.get_miss,
        ),
        (
            "coremq_store_get_messages_total",
            "Messages returned by gets.",
            |s| s.get_messages,
        ),
        (
            "coremq_store_get_bytes_total",
            "Record bytes returned by gets.",
            |s| s.get_bytes,
        ),
        (
            "coremq_store_stalls_total",
            "Executor task-queue turns over the stall threshold.",
            |s| s.stalls,
        ),
        (
            "coremq_store_self_check_problems_total",
            "Problems the periodic self-check found.",
            |s| s.self_check_problems,
        ),
        (
            "coremq_store_segments_created_total",
            "Commit-log segments created as new files.",
            |s| s.segments_created,
        ),
        (
            "coremq_store_segments_reused_total",
            "Commit-log segments taken from the spares (recycled).",
            |s| s.segments_reused,
        ),
        (
            "coremq_store_index_flushes_total",
            "Key-index flushes that wrote something.",
            |s| s.index_flushes,
        ),
        (
            "coremq_store_index_flush_writes_total",
            "Writes the key-index flushes made (runs of adjacent pages).",
            |s| s.index_flush_writes,
        ),
        (
            "coremq_store_sync_rounds_led_total",
            "Sync-flush rounds a shard wrote itself instead of its group-commit thread.",
            |s| s.sync_rounds_led,
        ),
        (
            "coremq_store_writer_turns_total",
            "Turns of the commit-log writer (rounds, and looks that found nothing due).",
            |s| s.writer_turns,
        ),
    ];
    for (name, help, pick) in counters {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
        for (i, s) in shards.iter().enumerate() {
            let _ = writeln!(out, "{name}{{shard=\"{i}\"}} {}", pick(s));
        }
    }
    let gauges: [(&str, &str, Pick); 6] = [
        (
            "coremq_store_dispatch_lag_bytes",
            "Written but not yet dispatched to queues and index.",
            |s| s.dispatch_lag,
        ),
        (
            "coremq_store_commit_lag_bytes",
            "Written but not yet in the files.",
            |s| s.commit_lag,
        ),
        (
            "coremq_store_flush_lag_bytes",
            "Written but not yet durable.",
            |s| s.flush_lag,
        ),
        (
            "coremq_store_pool_used_bytes",
            "Write-buffer pool bytes holding unflushed data.",
            |s| s.pool_used,
        ),
        ("coremq_store_pool_bytes", "Write-buffer pool size.", |s| {
            s.pool_bytes
        }),
        (
            "coremq_store_spare_segments",
            "Retired commit-log segments kept zero-filled for reuse.",
            |s| s.spare_segments_ready,
        ),
    ];
    for (name, help, pick) in gauges {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        for (i, s) in shards.iter().enumerate() {
            let _ = writeln!(out, "{name}{{shard=\"{i}\"}} {}", pick(s));
        }
    }
    type Rate = fn(&StoreStats) -> &super::Rates;
    let rates: [(&str, &str, Rate); 4] = [
        (
            "coremq_store_put_tps",
            "Messages stored per second over the window.",
            |s| &s.put_tps,
        ),
        (
            "coremq_store_get_found_tps",
            "Get calls that found messages per second.",
            |s| &s.get_found_tps,
        ),
        (
            "coremq_store_get_miss_tps",
            "Get calls that found none per second.",
            |s| &s.get_miss_tps,
        ),
        (
            "coremq_store_get_transferred_tps",
            "Messages returned by gets per second.",
            |s| &s.get_transferred_tps,
        ),
    ];
    for (name, help, pick) in rates {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        for (i, s) in shards.iter().enumerate() {
            for (w, v) in WINDOWS_S.iter().zip(pick(s).0.iter()) {
                if let Some(v) = v {
                    let _ = writeln!(out, "{name}{{shard=\"{i}\",window=\"{w}s\"}} {v}");
                }
            }
        }
    }
    let name = "coremq_store_put_latency_seconds";
    let _ = writeln!(
        out,
        "# HELP {name} Store put call latency (flush and slave waits included; a put that never waited counts 0).\n# TYPE {name} histogram"
    );
    for (i, s) in shards.iter().enumerate() {
        let mut cum = 0;
        for (b, c) in s.put_latency.counts.iter().enumerate() {
            cum += c;
            let le = LATENCY_BOUNDS_US
                .get(b)
                .map_or("+Inf".to_string(), |us| (*us as f64 / 1e6).to_string());
            let _ = writeln!(out, "{name}_bucket{{shard=\"{i}\",le=\"{le}\"}} {cum}");
        }
        let _ = writeln!(
            out,
            "{name}_sum{{shard=\"{i}\"}} {}",
            s.put_latency.sum_us as f64 / 1e6
        );
        let _ = writeln!(out, "{name}_count{{shard=\"{i}\"}} {cum}");
    }
    if clean.is_empty() {
        return;
    }
    type CPick = fn(&CleanStats) -> u64;
    let cc: [(&str, &str, CPick); 6] = [
        ("coremq_retention_passes_total", "Retention passes.", |c| {
            c.passes
        }),
        (
            "coremq_retention_failed_passes_total",
            "Retention passes that failed.",
            |c| c.failed_passes,
        ),
        (
            "coremq_retention_expired_segments_total",
            "Log segments deleted as expired.",
            |c| c.expired_segments,
        ),
        (
            "coremq_retention_forced_segments_total",
            "Log segments deleted over the force level.",
            |c| c.forced_segments,
        ),
        (
            "coremq_retention_queue_files_total",
            "Consume-queue files deleted.",
            |c| c.queue_files,
        ),
        (
            "coremq_retention_index_files_total",
            "Index files deleted.",
            |c| c.index_files,
        ),
    ];
    for (name, help, pick) in cc {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
        for (i, c) in clean.iter().enumerate() {
            let _ = writeln!(out, "{name}{{shard=\"{i}\"}} {}", pick(c));
        }
    }
    let name = "coremq_retention_level_rises_total";
    let _ = writeln!(
        out,
        "# HELP {name} Rises of disk use into each retention level.\n# TYPE {name} counter"
    );
    for (i, c) in clean.iter().enumerate() {
        for l in Level::ALL.iter().skip(1) {
            let _ = writeln!(
                out,
                "{name}{{shard=\"{i}\",level=\"{}\"}} {}",
                l.name(),
                c.level_rises[*l as usize]
            );
        }
    }
    let name = "coremq_retention_disk_ratio";
    let _ = writeln!(
        out,
        "# HELP {name} Disk use the last retention pass saw.\n# TYPE {name} gauge"
    );
    for (i, c) in clean.iter().enumerate() {
        let _ = writeln!(out, "{name}{{shard=\"{i}\"}} {}", c.disk_ratio);
    }
}
