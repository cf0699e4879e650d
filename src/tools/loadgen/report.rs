//! What a produce run measured ([`Report`]) as text and JSON, and the histogram and
//! percentile helpers every mode's report uses.

use super::config::{LoadConfig, Via};
use super::measure::allowed_cpus;
use super::svg::latency_svg;
use hdrhistogram::Histogram;
use serde_json::{Value, json};
use std::fmt::Write as _;
use std::path::PathBuf;

/// A latency histogram in nanoseconds: 1 ns to 1 hour at 3 significant digits.
pub(super) fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000_000, 3).expect("valid histogram bounds")
}

/// `  name   us  p50=..  ...  max=..` and a newline; nothing for an empty histogram.
pub(super) fn latency_line(name: &str, h: &Histogram<u64>) -> String {
    let mut s = String::new();
    if h.is_empty() {
        return s;
    }
    let _ = write!(s, "  {name:<11} us");
    for (p, _) in PERCENTILES {
        let _ = write!(s, "  p{p}={:.1}", Report::percentile_us(h, p));
    }
    let _ = writeln!(s, "  max={:.1}", us(h.max()));
    s
}

/// What a run measured.
pub struct Report {
    pub config: LoadConfig,
    pub shards: usize,
    /// Queues each shard owns.
    pub shard_queues: Vec<usize>,
    pub data_dir: PathBuf,
    /// Whether the store was kept (`--data-dir`).
    pub kept: bool,
    pub messages: u64,
    /// Body bytes put.
    pub bytes: u64,
    /// CommitLog bytes written (records with headers and properties).
    pub log_bytes: u64,
    /// The producing window: first put to last acknowledgement.
    pub seconds: f64,
    /// From the store being open to the end of its shutdown (drain and final flush
    /// included).
    pub total_seconds: f64,
    pub consumed: u64,
    /// Messages consumed by the time the producers were done: with consumers that keep
    /// up, all but the last moment's.
    pub consumed_while_producing: u64,
    /// Puts refused or failed, and consumer problems.
    pub errors: u64,
    pub first_error: Option<String>,
    /// Nanoseconds.
    pub put_latency: Histogram<u64>,
    /// Nanoseconds a paced put began after its intended time (part of `put_latency`);
    /// empty without --rate.
    pub start_late: Histogram<u64>,
    /// Nanoseconds from each put's real start to its return: `put_latency` without the
    /// late start (the executor busy elsewhere, descheduled, or waking from a timer).
    pub service: Histogram<u64>,
    /// Nanoseconds; empty without consumers.
    pub e2e_latency: Histogram<u64>,
    pub cpu_seconds: f64,
    /// CPU time until every producer was done (what remains after it is the drain,
    /// dispatch catching up and the final flush).
    pub producing_cpu_seconds: f64,
    /// The shard threads' CPU over the same window, summed: the store's part when
    /// producers run outside the shards (`--via handle`); their io_uring workers are
    /// not in it.
    pub shard_cpu_seconds: f64,
    /// The most any shard's dispatch lagged behind its puts (sampled every 100 ms).
    pub max_dispatch_lag_bytes: u64,
    pub peak_rss_bytes: u64,
    /// `/proc/loadavg` before the run: other load on the machine skews the numbers.
    pub load_before: String,
    /// `--via handle`: a bare cross-thread round trip (futex) measured just before the
    /// run, p50 and p99 in microseconds.
    pub bare_wakeup: Option<(f64, f64)>,
}

/// The percentiles reported, with their JSON names.
pub const PERCENTILES: [(f64, &str); 5] = [
    (50.0, "p50"),
    (90.0, "p90"),
    (99.0, "p99"),
    (99.9, "p99_9"),
    (99.99, "p99_99"),
];

pub(super) fn us(ns: u64) -> f64 {
    ns as f64 / 1e3
}

impl Report {
    fn per_second(&self, v: f64) -> f64 {
        if self.seconds > 0.0 {
            v / self.seconds
        } else {
            0.0
        }
    }

    pub fn messages_per_sec(&self) -> f64 {
        self.per_second(self.messages as f64)
    }

    /// Body megabytes (10^6 bytes) per second.
    pub fn mb_per_sec(&self) -> f64 {
        self.per_second(self.bytes as f64 / 1e6)
    }

    /// CommitLog megabytes (10^6 bytes) per second.
    pub fn log_mb_per_sec(&self) -> f64 {
        self.per_second(self.log_bytes as f64 / 1e6)
    }

    pub fn cpu_us_per_message(&self) -> f64 {
        self.per_message_us(self.cpu_seconds)
    }

    /// CPU per message counting only the producing window.
    pub fn producing_cpu_us_per_message(&self) -> f64 {
        self.per_message_us(self.producing_cpu_seconds)
    }

    fn per_message_us(&self, cpu_seconds: f64) -> f64 {
        if self.messages == 0 {
            0.0
        } else {
            cpu_seconds * 1e6 / self.messages as f64
        }
    }

    /// Whether every put was stored and (with consumers) every message read back.
    pub fn ok(&self) -> bool {
        self.errors == 0
            && self.first_error.is_none()
            && (!self.config.consumers || self.consumed == self.messages)
    }

    /// Latency at a percentile, in microseconds.
    pub fn percentile_us(hist: &Histogram<u64>, p: f64) -> f64 {
        us(hist.value_at_quantile(p / 100.0))
    }

    pub(super) fn latency_json(hist: &Histogram<u64>) -> Value {
        if hist.is_empty() {
            return Value::Null;
        }
        let mut m = serde_json::Map::new();
        for (p, name) in PERCENTILES {
            m.insert(name.into(), json!(Report::percentile_us(hist, p)));
        }
        m.insert("max".into(), json!(us(hist.max())));
        m.insert("mean".into(), json!(hist.mean() / 1e3));
        m.insert("count".into(), json!(hist.len()));
        Value::Object(m)
    }

    pub fn to_json(&self) -> Value {
        json!({
            "label": self.config.label,
            "config": self.config.to_json(),
            "shard_queues": self.shard_queues,
            "machine": {
                "cpus": allowed_cpus().len(),
                "kernel": std::fs::read_to_string("/proc/sys/kernel/osrelease")
                    .map(|s| s.trim().to_string())
                    .unwrap_or_default(),
                "loadavg_before": self.load_before,
            },
            "ok": self.ok(),
            "messages": self.messages,
            "bytes": self.bytes,
            "log_bytes": self.log_bytes,
            "seconds": self.seconds,
            "total_seconds": self.total_seconds,
            "messages_per_sec": self.messages_per_sec(),
            "mb_per_sec": self.mb_per_sec(),
            "log_mb_per_sec": self.log_mb_per_sec(),
            "consumed": self.consumed,
            "consumed_while_producing": self.consumed_while_producing,
            "errors": self.errors,
            "first_error": self.first_error,
            "put_latency_us": Report::latency_json(&self.put_latency),
            "put_start_late_us": Report::latency_json(&self.start_late),
            "put_service_us": Report::latency_json(&self.service),
            "e2e_latency_us": Report::latency_json(&self.e2e_latency),
            "cpu_seconds": self.cpu_seconds,
            "cpu_us_per_message": self.cpu_us_per_message(),
            "producing_cpu_seconds": self.producing_cpu_seconds,
            "producing_cpu_us_per_message": self.producing_cpu_us_per_message(),
            "shard_cpu_seconds": self.shard_cpu_seconds,
            "shard_cpu_us_per_message": self.per_message_us(self.shard_cpu_seconds),
            "shard_core_share": if self.seconds > 0.0 {
                self.shard_cpu_seconds / self.seconds
            } else {
                0.0
            },
            "max_dispatch_lag_bytes": self.max_dispatch_lag_bytes,
            "cpu_utilisation": if self.total_seconds > 0.0 {
                self.cpu_seconds / (self.total_seconds * self.shards as f64)
            } else {
                0.0
            },
            "peak_rss_bytes": self.peak_rss_bytes,
            "bare_wakeup_us": self.bare_wakeup.map(|(p50, p99)| json!({"p50": p50, "p99": p99})),
            "put_p50_ratio_to_bare_wakeup": self.put_p50_to_bare_wakeup(),
            "data_dir": self.data_dir.display().to_string(),
            "kept": self.kept,
        })
    }

    /// Put latency p50 over the bare wake-up's p50 (`--via handle`).
    fn put_p50_to_bare_wakeup(&self) -> Option<f64> {
        let put_p50_us = self.put_latency.value_at_quantile(0.5) as f64 / 1e3;
        self.bare_wakeup.map(|(p50, _)| put_p50_us / p50.max(1e-3))
    }

    /// The report as text, for people.
    pub fn summary(&self) -> String {
        let c = &self.config;
        let mut s = String::new();
        let producers = match c.via {
            Via::Local => "producers/shard",
            Via::Handle => "threads through the handle",
        };
        let _ = writeln!(
            s,
            "{}: {} shards (queues {:?}), {} topics, body {} B, batch {}, {} outstanding x {} \
             {producers}, flush {}, {}{}",
            c.label,
            self.shards,
            self.shard_queues,
            c.topics,
            c.body,
            c.batch,
            c.outstanding,
            c.producers,
            c.flush.name(),
            c.rate.map_or("unlimited rate".to_string(), |r| format!(
                "{r:.0} msg/s target"
            )),
            if c.consumers {
                ", tailing consumers"
            } else if c.pace_only {
                ", pace only: the schedule kept and timed, nothing put"
            } else {
                ""
            },
        );
        let _ = writeln!(
            s,
            "  throughput  {:>12.0} msg/s  {:>9.1} MB/s body  {:>9.1} MB/s log  \
             ({} messages in {:.2} s)",
            self.messages_per_sec(),
            self.mb_per_sec(),
            self.log_mb_per_sec(),
            self.messages,
            self.seconds
        );
        s.push_str(&latency_line("put", &self.put_latency));
        s.push_str(&latency_line("late start", &self.start_late));
        s.push_str(&latency_line("put service", &self.service));
        s.push_str(&latency_line("end-to-end", &self.e2e_latency));
        let _ = writeln!(
            s,
            "  cpu         {:.3} us/message ({:.3} while producing, {:.3} of it the shard \
             threads'; {:.2} s cpu over {:.2} s with {} shards)  peak RSS {:.1} MiB",
            self.cpu_us_per_message(),
            self.producing_cpu_us_per_message(),
            self.per_message_us(self.shard_cpu_seconds),
            self.cpu_seconds,
            self.total_seconds,
            self.shards,
            self.peak_rss_bytes as f64 / (1 << 20) as f64
        );
        let _ = writeln!(
            s,
            "  dispatch    lagged up to {:.1} MB behind puts (records not yet visible to gets)",
            self.max_dispatch_lag_bytes as f64 / 1e6
        );
        if let (Some((p50, p99)), Some(ratio)) = (self.bare_wakeup, self.put_p50_to_bare_wakeup()) {
            let _ = writeln!(
                s,
                "  baseline    bare thread wake-up round trip p50 {p50:.1} us, p99 {p99:.1} us \
                 (put p50 {ratio:.2}x it)"
            );
        }
        if c.consumers {
            let _ = writeln!(
                s,
                "  consumed    {} of {} ({} while producing)",
                self.consumed, self.messages, self.consumed_while_producing
            );
        }
        if self.errors > 0 || self.first_error.is_some() {
            let _ = writeln!(
                s,
                "  ERRORS      {} failed puts; first problem: {}",
                self.errors,
                self.first_error.as_deref().unwrap_or("-")
            );
        }
        let _ = writeln!(
            s,
            "  data        {} ({})",
            self.data_dir.display(),
            if self.kept { "kept" } else { "removed" }
        );
        s
    }

    /// The latency percentile curves as an SVG picture: x is the percentile on a log
    /// scale (0 to 99.999), y the latency on a log scale.
    pub fn svg(&self) -> String {
        let curves: Vec<(&str, &str, &Histogram<u64>)> = [
            ("put", "#1f77b4", &self.put_latency),
            ("end-to-end", "#d62728", &self.e2e_latency),
        ]
        .into_iter()
        .filter(|(_, _, h)| !h.is_empty())
        .collect();
        let subtitle = format!(
            "{:.0} msg/s, {:.1} MB/s; {} B bodies, flush {}, {} shards, {}",
            self.messages_per_sec(),
            self.mb_per_sec(),
            self.config.body,
            self.config.flush.name(),
            self.shards,
            self.config
                .rate
                .map_or("unlimited rate".to_string(), |r| format!(
                    "{r:.0} msg/s offered"
                ))
        );
        latency_svg(&self.config.label, &subtitle, &curves)
    }
}
