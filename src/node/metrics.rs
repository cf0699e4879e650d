//! The node's counters and their Prometheus text exposition at `/metrics` on the
//! metrics port: the counterpart of RocketMQ's `BrokerStatsManager` (RocketMQ 5's
//! `BrokerMetricsManager` also offers a Prometheus exporter).
//!
//! Counters are atomics bumped by the request that did the work (relaxed: each is read
//! alone); per-shard log positions are asked of each shard when `/metrics` is read.

use super::NodeState;
use crate::StoreOps;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds (seconds) of the put-latency histogram buckets.
pub const PUT_LATENCY_BUCKETS: [f64; 12] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 1.0,
];

/// One shard's counters, on cache lines of their own: each shard bumps its own on every
/// request, and counters of two shards side by side (with one request counter for all
/// and one arrivals lock) moved a line between the CPUs on every send: 3.77 -> 3.63 us
/// of a node's CPU per single send with these apart (docs/performance/node.md).
#[repr(align(128))]
#[derive(Default)]
pub struct ShardMetrics {
    /// Put latency (store call, as the request saw it): counts per bucket of
    /// [`PUT_LATENCY_BUCKETS`] plus one for larger, and the sum in microseconds.
    pub put_latency: [AtomicU64; PUT_LATENCY_BUCKETS.len() + 1],
    pub put_latency_sum_us: AtomicU64,
    pub puts: AtomicU64,
    pub put_bytes: AtomicU64,
    pub gets: AtomicU64,
    pub get_bytes: AtomicU64,
    /// Requests served on this shard's thread.
    requests: AtomicU64,
}

/// Counters for `/metrics`.
pub struct Metrics {
    /// Per shard, and one more for requests served on no shard's thread.
    shards: Vec<ShardMetrics>,
    pub connections_accepted: AtomicU64,
    pub connections_refused: AtomicU64,
    pub bad_frames: AtomicU64,
    /// Requests whose handler panicked (answered `SYSTEM_ERROR`, or, inside the store,
    /// failing the node).
    pub request_panics: AtomicU64,
    /// Sends put by a shard other than their connection's (a hop between shards).
    pub routed_sends: AtomicU64,
}

impl Metrics {
    pub fn new(shards: usize) -> Metrics {
        Metrics {
            shards: (0..=shards).map(|_| ShardMetrics::default()).collect(),
            connections_accepted: AtomicU64::new(0),
            connections_refused: AtomicU64::new(0),
            bad_frames: AtomicU64::new(0),
            request_panics: AtomicU64::new(0),
            routed_sends: AtomicU64::new(0),
        }
    }

    /// Shard `shard`'s counters (a shard beyond the node's: the spare set, counted
    /// nowhere in the per-shard series).
    pub fn shard(&self, shard: usize) -> &ShardMetrics {
        &self.shards[shard.min(self.shards.len() - 1)]
    }

    /// Counts a request served on `shard`'s thread (`None`: on no shard's thread).
    pub fn request(&self, shard: Option<usize>) {
        let at = shard.unwrap_or(self.shards.len() - 1);
        self.shard(at).requests.fetch_add(1, Ordering::Relaxed);
    }

    /// The node's shards' counters (the spare set left out).
    fn per_shard(&self) -> &[ShardMetrics] {
        &self.shards[..self.shards.len() - 1]
    }

    /// Records one put's latency on `shard`.
    pub fn put_took(&self, shard: usize, took: std::time::Duration) {
        let secs = took.as_secs_f64();
        let b = PUT_LATENCY_BUCKETS
            .iter()
            .position(|le| secs <= *le)
            .unwrap_or(PUT_LATENCY_BUCKETS.len());
        if shard < self.shards.len() - 1 {
            let m = &self.shards[shard];
            m.put_latency[b].fetch_add(1, Ordering::Relaxed);
            m.put_latency_sum_us
                .fetch_add(took.as_micros() as u64, Ordering::Relaxed);
        }
    }

    /// Prometheus text exposition; `shards` gives each shard's log positions, `failed`
    /// whether the node failed.
    pub fn render(
        &self,
        connections_open: usize,
        failed: bool,
        shards: &[Option<crate::ShardStatus>],
    ) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        let name = "coremq_put_latency_seconds";
        let _ = writeln!(
            out,
            "# HELP {name} Time a send's put waited in the store (0 when answered in its first poll; a routed send from its hand-off).\n# TYPE {name} histogram"
        );
        for (i, m) in self.per_shard().iter().enumerate() {
            let mut cum = 0;
            for (b, c) in m.put_latency.iter().enumerate() {
                cum += c.load(Ordering::Relaxed);
                let le = PUT_LATENCY_BUCKETS
                    .get(b)
                    .map_or("+Inf".to_string(), |v| v.to_string());
                let _ = writeln!(out, "{name}_bucket{{shard=\"{i}\",le=\"{le}\"}} {cum}");
            }
            let sum = m.put_latency_sum_us.load(Ordering::Relaxed) as f64 / 1e6;
            let _ = writeln!(out, "{name}_sum{{shard=\"{i}\"}} {sum}");
            let _ = writeln!(out, "{name}_count{{shard=\"{i}\"}} {cum}");
        }
        type Pick = fn(&crate::ShardStatus) -> u64;
        let positions: [(&str, &str, Pick); 5] = [
            (
                "coremq_log_min_offset",
                "First commit-log offset kept.",
                |s| s.min_log_offset,
            ),
            (
                "coremq_log_written_offset",
                "Commit-log end (written to the write buffer).",
                |s| s.max_log_offset,
            ),
            (
                "coremq_log_committed_offset",
                "Commit-log bytes written to the files.",
                |s| s.committed_log_offset,
            ),
            (
                "coremq_log_flushed_offset",
                "Commit-log bytes made durable (fdatasync).",
                |s| s.flushed_log_offset,
            ),
            (
                "coremq_log_dispatched_offset",
                "Commit-log bytes visible to consumers.",
                |s| s.dispatched_log_offset,
            ),
        ];
        for (name, help, pick) in positions {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
            for (i, s) in shards.iter().enumerate() {
                if let Some(s) = s {
                    let _ = writeln!(out, "{name}{{shard=\"{i}\"}} {}", pick(s));
                }
            }
        }
        let name = "coremq_shard_failed";
        let _ = writeln!(
            out,
            "# HELP {name} 1 when the shard stopped taking writes after a failure.\n# TYPE {name} gauge"
        );
        for (i, s) in shards.iter().enumerate() {
            let failed = s.as_ref().is_none_or(|s| s.failure.is_some());
            let _ = writeln!(out, "{name}{{shard=\"{i}\"}} {}", failed as u8);
        }
        let per_shard = |out: &mut String, name: &str, help: &str, v: fn(&ShardMetrics) -> u64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for (i, m) in self.per_shard().iter().enumerate() {
                let _ = writeln!(out, "{name}{{shard=\"{i}\"}} {}", v(m));
            }
        };
        per_shard(&mut out, "coremq_puts_total", "Messages stored.", |m| {
            m.puts.load(Ordering::Relaxed)
        });
        per_shard(
            &mut out,
            "coremq_put_bytes_total",
            "Body bytes stored.",
            |m| m.put_bytes.load(Ordering::Relaxed),
        );
        per_shard(
            &mut out,
            "coremq_gets_total",
            "Messages returned by pulls.",
            |m| m.gets.load(Ordering::Relaxed),
        );
        per_shard(
            &mut out,
            "coremq_get_bytes_total",
            "Record bytes returned by pulls.",
            |m| m.get_bytes.load(Ordering::Relaxed),
        );
        let one = |out: &mut String, name: &str, kind: &str, help: &str, v: u64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}"
            );
        };
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        one(
            &mut out,
            "coremq_requests_total",
            "counter",
            "Requests served.",
            self.shards.iter().map(|m| load(&m.requests)).sum(),
        );
        one(
            &mut out,
            "coremq_connections_accepted_total",
            "counter",
            "Connections accepted.",
            load(&self.connections_accepted),
        );
        one(
            &mut out,
            "coremq_connections_refused_total",
            "counter",
            "Connections refused at the limit.",
            load(&self.connections_refused),
        );
        one(
            &mut out,
            "coremq_bad_frames_total",
            "counter",
            "Connections closed for a malformed frame.",
            load(&self.bad_frames),
        );
        one(
            &mut out,
            "coremq_request_panics_total",
            "counter",
            "Requests whose handler panicked (answered SYSTEM_ERROR; inside the store: the node failed).",
            load(&self.request_panics),
        );
        one(
            &mut out,
            "coremq_routed_sends_total",
            "counter",
            "Sends put by a shard other than their connection's (a hop between shards; none on shard ports).",
            load(&self.routed_sends),
        );
        one(
            &mut out,
            "coremq_node_failed",
            "gauge",
            "1 once a shard died while serving: the node must be restarted.",
            failed as u64,
        );
        one(
            &mut out,
            "coremq_connections_open",
            "gauge",
            "Connections open.",
            connections_open as u64,
        );
        // The Prometheus client libraries' standard name, from getrusage (microseconds):
        // `/proc/<pid>/stat` counts 10 ms ticks.
        let name = "process_cpu_seconds_total";
        let cpu = crate::stats::process::process_cpu_seconds();
        let _ = writeln!(
            out,
            "# HELP {name} Total user and system CPU time spent in seconds.\n# TYPE {name} counter\n{name} {cpu:.6}"
        );
        out
    }
}

/// A minimal HTTP/1.0 responder: `GET /metrics` (any path) gets the counters.
pub(super) fn serve(st: Arc<NodeState>, listener: TcpListener) {
    for conn in listener.incoming() {
        if st.shutting.load(Ordering::SeqCst) {
            return;
        }
        let Ok(mut s) = conn else { continue };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        let mut buf = [0u8; 2048];
        let _ = s.read(&mut buf);
        let shards: Vec<Option<crate::ShardStatus>> = (0..st.handle.shards())
            .map(|i| futures_lite::future::block_on(st.handle.shard_status(i)).ok())
            .collect();
        let failed = st.failure().is_some();
        let mut body = st
            .metrics
            .render(st.open.load(Ordering::SeqCst), failed, &shards);
        // The store's statistics and retention counters (`crate::stats`).
        let stats = futures_lite::future::block_on(st.handle.stats());
        let clean = futures_lite::future::block_on(st.handle.retention_stats());
        if let (Ok(stats), Ok(clean)) = (stats, clean) {
            crate::stats::prometheus::render(&mut body, &stats.shards, &clean);
        }
        let head = format!(
            "HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        let _ = s
            .write_all(head.as_bytes())
            .and_then(|_| s.write_all(body.as_bytes()));
    }
}
