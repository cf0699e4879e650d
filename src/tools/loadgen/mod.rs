//! The load generator behind `coremq bench` and `benches/loadgen.rs` (RocketMQ's
//! counterpart is the `benchmark` module's `Producer`/`Consumer` tools, run against a
//! broker; this one also drives the store embedded).
//!
//! # What runs
//!
//! The store users run: a [`ShardedStore`](crate::ShardedStore) opened on `--data-dir`
//! with `--shards` shards, where `(topic, queue)` belongs to shard
//! [`shard_of`](crate::shard::shard_of) (CRC-32 of topic and queue id, so some shards
//! may own more queues than others; the report gives each shard's count, and
//! `--queues-per-shard` picks queue ids so that every shard owns the same number).
//!
//! * **producers** (`produce.rs`): each keeps `--outstanding` puts in flight (one
//!   "lane" per outstanding put), cycling through its queues; a put is one message or
//!   a batch of `--batch` to one queue. `--via local` (default) runs `--producers` per
//!   shard on the shard itself (`Handle::run_on`, then the owning shard's
//!   `Store::put`: the fast path); `--via handle` runs `--producers` OS threads outside
//!   the shards, each putting through the `Send + Sync` [`Handle`](crate::Handle) to
//!   every queue (what most embedders do first). Unlimited (closed loop) by default;
//!   with `--rate` (messages/s, all producers together) every send has an intended
//!   time and producers pace themselves to it (open loop);
//! * **tailing consumers** (`--consumers`, `consume.rs`): one per queue, on the owning
//!   shard, starting at the queue's end and reading with `Store::get` as soon as a
//!   record is dispatched.
//!
//! With `--data-dir` the store is kept (it opens with `ShardedStore::open`, `coremq
//! serve` and `coremq inspect`), and `--mode` works on it afterwards ([`run_mode`],
//! scenarios 5-7 of `scripts/bench.sh`): `catch_up.rs` reads every queue from its
//! first offset on its shard; `key_queries.rs` asks the all-shard
//! `Handle::query_by_key` for keys the producing run put; `recover.rs` times
//! `ShardedStore::open` (recovery included) and reports each shard's open phases.
//! `--kill-after-flush` makes a produce run SIGKILL itself once its log is flushed,
//! leaving the abort files as `kill -9` does. `replica.rs` (scenario 8): `--slave` puts
//! to a SYNC_MASTER with an in-process slave following it; `--mode replicate` times a
//! new slave's catch-up on a kept store. `timer.rs` (`--mode timer`, scenario 9) starts
//! from a fresh store: plain puts against timed ones, a million timed messages pending
//! at once, and how late the timer delivers them.
//!
//! # What is measured (`report.rs`)
//!
//! * throughput: messages and body bytes put per second over the producing window
//!   (first put to last acknowledgement), and CommitLog bytes per second (records
//!   with headers and properties: what the disk really takes);
//! * put latency: from the send time to the put's return, where the send time is the
//!   intended one under `--rate`, so a put that starts late because every lane was busy
//!   is charged the wait (no coordinated omission);
//! * end-to-end latency: from that same send time, carried in the first 8 bytes of the
//!   body as nanoseconds of a process-wide monotonic clock ([`now_ns`]), to the moment
//!   a consumer's `get` returns the record;
//! * CPU time per message (`getrusage`, the whole process from the store open to its
//!   shutdown, final flush included; also up to the last put) and peak RSS.
//!
//! Latencies go to HDR histograms (1 ns to 1 h, 3 significant digits), reported in
//! microseconds as p50/p90/p99/p99.9/p99.99/max, as text, JSON (`--json`) and an SVG
//! of the percentile curves (`--svg`). A progress line goes to stderr every second
//! (`progress.rs`); when nothing moved for a second it also shows each shard's log
//! positions and whether its executor still runs tasks.
//!
//! # Reading the numbers
//!
//! * With `--via local` the load generator runs on the shards it measures (as the
//!   node's request handlers do): building messages is part of the CPU per message.
//!   With `--via handle` every put also pays the hop to the shard and back (a flume
//!   channel each way, a wake-up of the shard and of the producer thread) and a new
//!   `Message` (the handle takes it by value); the producer threads compete with the
//!   shards for the CPUs.
//! * Every local lane yields after each put, so outstanding puts take turns like
//!   separate requests (without it one lane ran until the window pool was full and a
//!   put waited up to 4.9 s).
//! * Under `--rate`, latencies include how late a paced send wakes: about 0.1 ms at
//!   p50, and up to [`PREEMPT_TIMER`] when another task queue holds the CPU.
//! * At low rates the CPU per message is dominated by parking idle executors (every
//!   glommio park issues a `membarrier` and arms an io_uring timeout).
//! * The machine may be shared: the JSON report records the load average before the
//!   run. Profiles, dated runs and what they found: `docs/performance/loadgen.md`.

mod bare;
mod catch_up;
mod config;
mod consume;
mod executor;
mod key_queries;
mod local;
mod measure;
mod outside;
mod plan;
mod produce;
mod progress;
mod recover;
pub mod remote;
mod replica;
mod report;
mod run;
mod svg;
mod timer;

pub use config::{BodySize, Flush, HeaderFormat, LoadConfig, Mode, RemoteRequest, SyncIo, Via};
pub use measure::{allowed_cpus, now_ns};
pub use report::{PERCENTILES, Report};
pub use run::{run, run_and_report};

use crate::{ShardedStore, StoreConfig};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The shards' preempt timer in a run unless `--preempt-us` says otherwise: the
/// store's default, [`crate::shard::DEFAULT_PREEMPT_TIMER`] (measured here: 100 ms let
/// the producers keep the CommitLog writer off the CPU for tens of milliseconds).
pub const PREEMPT_TIMER: Duration = crate::shard::DEFAULT_PREEMPT_TIMER;

/// `--io-worker-cpus`: a comma-separated list of CPUs, or `shard` (none: the kernel
/// puts a shard's workers on the shard's CPU).
fn parse_cpus(list: &str) -> Result<Vec<usize>, String> {
    if list == "shard" {
        return Ok(Vec::new());
    }
    list.split(',')
        .map(|c| {
            c.trim()
                .parse()
                .map_err(|_| format!("--io-worker-cpus: {c:?} is not a CPU number"))
        })
        .collect()
}

/// Opens the sharded store of a run (recovering it when it exists).
fn open_store(
    cfg: &LoadConfig,
    root: &Path,
    shards: usize,
    template: StoreConfig,
) -> Result<ShardedStore, String> {
    let mut sc = crate::ShardedConfig::new(root);
    sc.shards = shards;
    sc.pin = !cfg.no_pin;
    sc.unpin_when_idle = !cfg.always_pin;
    sc.store = template;
    sc.spin_before_park = cfg.spin_us.map(Duration::from_micros);
    if let Some(us) = cfg.awake_window_us {
        sc.awake_window = Duration::from_micros(us);
    }
    if let Some(us) = cfg.reply_spin_us {
        sc.reply_spin = Duration::from_micros(us);
    }
    if let Some(us) = cfg.timer_spin_us {
        sc.timer_spin = Duration::from_micros(us);
    }
    if let Some(list) = &cfg.io_worker_cpus {
        sc.io_worker_cpus = Some(parse_cpus(list)?);
    }
    sc.preempt_timer = Some(Duration::from_micros(cfg.preempt_us.max(1)));
    sc.stall_threshold = (cfg.stall_ms > 0).then(|| Duration::from_millis(cfg.stall_ms));
    ShardedStore::open(sc).map_err(|e| format!("cannot open the store in {}: {e}", root.display()))
}

/// Runs what `cfg.mode` says, prints the summary on stdout and writes the JSON (and
/// SVG) files asked for. Whether the run found no problem.
pub fn run_mode(cfg: &LoadConfig) -> Result<bool, String> {
    if cfg.mode == Mode::Produce {
        return run_and_report(cfg).map(|r| r.ok());
    }
    let (dir, shards, _temp) = if cfg.mode == Mode::Timer {
        fresh_dir(cfg)?
    } else {
        let dir = cfg
            .data_dir
            .clone()
            .ok_or_else(|| format!("--mode {} needs --data-dir", cfg.mode.name()))?;
        let shards = kept_shards(&dir)?;
        if let Some(s) = cfg.shards
            && s as usize != shards
        {
            return Err(format!("{} holds {shards} shards, not {s}", dir.display()));
        }
        (dir, shards, TempDir(None))
    };
    let _ = now_ns();
    let load_before = measure::load_average();
    let (mut report, text, svg) = match cfg.mode {
        Mode::Produce => unreachable!("handled above"),
        Mode::CatchUp => catch_up::run(cfg, &dir, shards)?,
        Mode::KeyQueries => key_queries::run(cfg, &dir, shards)?,
        Mode::Recover => recover::run(cfg, &dir, shards)?,
        Mode::Replicate => replica::run(cfg, &dir, shards)?,
        Mode::Timer => timer::run(cfg, &dir, shards)?,
    };
    let ok = report["ok"].as_bool().unwrap_or(false);
    let peak_rss = measure::process_usage().1;
    if let Value::Object(m) = &mut report {
        m.insert("label".into(), json!(cfg.label));
        m.insert("mode".into(), json!(cfg.mode.name()));
        m.insert("shards".into(), json!(shards));
        m.insert(
            "machine".into(),
            json!({
                "cpus": allowed_cpus().len(),
                "loadavg_before": load_before,
            }),
        );
        m.insert("peak_rss_bytes".into(), json!(peak_rss));
        m.insert("data_dir".into(), json!(dir.display().to_string()));
    }
    print!(
        "{}: {} mode, {shards} shards\n{text}",
        cfg.label,
        cfg.mode.name()
    );
    println!(
        "  memory      peak RSS {:.1} MiB",
        peak_rss as f64 / (1 << 20) as f64
    );
    if let Some(path) = &cfg.json {
        let text = serde_json::to_string_pretty(&report).expect("JSON of numbers");
        std::fs::write(path, text + "\n")
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    if let (Some(path), Some(svg)) = (&cfg.svg, svg) {
        std::fs::write(path, svg).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(ok)
}

/// The directory and shard count of a mode that starts from a fresh store: `--data-dir`
/// (which must hold no store yet) or a temporary directory, removed when the guard
/// drops.
fn fresh_dir(cfg: &LoadConfig) -> Result<(PathBuf, usize, TempDir), String> {
    let shards = cfg.shard_count();
    match &cfg.data_dir {
        Some(d) if d.join("store.meta").exists() => Err(format!(
            "--mode {} needs a fresh store; {} holds one",
            cfg.mode.name(),
            d.display()
        )),
        Some(d) => Ok((d.clone(), shards, TempDir(None))),
        None => {
            let d = std::env::current_dir()
                .map_err(|e| format!("current directory: {e}"))?
                .join(format!(
                    "coremq-bench-{}-{}",
                    std::process::id(),
                    crate::now_ms()
                ));
            Ok((d.clone(), shards, TempDir(Some(d))))
        }
    }
}

/// The shard count recorded in `dir/store.meta` (`shards=<n>`, written by
/// `ShardedStore::open`).
fn kept_shards(dir: &Path) -> Result<usize, String> {
    let path = dir.join("store.meta");
    let text = std::fs::read_to_string(&path).map_err(|e| {
        format!(
            "{}: {e} (write a store with `coremq bench --data-dir`)",
            path.display()
        )
    })?;
    text.lines()
        .find_map(|l| l.strip_prefix("shards="))
        .and_then(|v| v.trim().parse().ok())
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("{}: no shard count", path.display()))
}

/// Removes a temporary data directory when the run ends, however it ends.
struct TempDir(Option<PathBuf>);

impl Drop for TempDir {
    fn drop(&mut self) {
        if let Some(dir) = self.0.take()
            && let Err(e) = std::fs::remove_dir_all(&dir)
        {
            eprintln!("coremq bench: cannot remove {}: {e}", dir.display());
        }
    }
}
