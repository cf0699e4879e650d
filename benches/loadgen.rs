//! The load generator as a benchmark.
//!
//! * `cargo bench --bench loadgen` (cargo passes `--bench`): the full run, as
//!   `coremq bench` with its defaults (every CPU a shard, 64 queues, 1 KiB bodies,
//!   256 puts outstanding, async flush, 10 s). Extra arguments after `--` are
//!   `coremq bench` arguments, e.g. `cargo bench --bench loadgen -- --flush sync`.
//! * `cargo test --benches` (no `--bench`): tiny runs that go through every part
//!   (single puts and batches, both flush modes, keys, body ranges, pacing, tailing
//!   consumers, puts through the handle from outside threads, JSON and SVG) in a
//!   second or two each, then a two-shard kept store read back from the start,
//!   queried by key and reopened (`--mode`), so the load generator never rots.

use clap::Parser;
use coremq::tools::loadgen::{self, BodySize, Flush, LoadConfig, Mode, Via};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "loadgen",
    about = "coremq's load generator (see `coremq bench --help`)"
)]
struct BenchArgs {
    /// Set by `cargo bench`: run the full benchmark.
    #[arg(long)]
    bench: bool,
    #[command(flatten)]
    cfg: LoadConfig,
}

fn main() -> ExitCode {
    let full = std::env::args().any(|a| a == "--bench");
    let runs = if full {
        // cargo may add a name filter; only `--bench` and load options are ours.
        let args = std::env::args().filter(|a| !a.is_empty());
        match BenchArgs::try_parse_from(args) {
            Ok(a) => vec![a.cfg],
            Err(e) => e.exit(),
        }
    } else {
        // Temporary stores go under target/tmp, not the work tree.
        if let Err(e) = std::env::set_current_dir(env!("CARGO_TARGET_TMPDIR")) {
            eprintln!("loadgen: {e}");
            return ExitCode::FAILURE;
        }
        tiny_runs()
    };
    for cfg in &runs {
        match loadgen::run_mode(cfg) {
            Ok(true) => {}
            Ok(false) => {
                eprintln!("loadgen: {} found problems", cfg.label);
                return ExitCode::FAILURE;
            }
            Err(e) => {
                eprintln!("loadgen: {}: {e}", cfg.label);
                return ExitCode::FAILURE;
            }
        }
    }
    if !full {
        let _ = std::fs::remove_dir_all(kept_dir());
    }
    ExitCode::SUCCESS
}

/// Where the tiny kept-store runs keep their store.
fn kept_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("loadgen-kept")
}

/// Tiny parameters: 2000 messages per run; one shard and two queues, or two shards
/// with one queue each where the sharded layout matters.
fn tiny_runs() -> Vec<LoadConfig> {
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let single = LoadConfig {
        label: "tiny: single puts, async, tailing consumers".into(),
        body: BodySize { min: 8, max: 3000 },
        consumers: true,
        json: Some(out.join("loadgen-tiny.json")),
        svg: Some(out.join("loadgen-tiny.svg")),
        quiet: true,
        ..LoadConfig::tiny()
    };
    let batched = LoadConfig {
        label: "tiny: batches, sync flush, 20k msg/s".into(),
        batch: 8,
        keys: 3,
        flush: Flush::Sync,
        rate: Some(20_000.0),
        consumers: true,
        quiet: true,
        ..LoadConfig::tiny()
    };
    let two_shards = LoadConfig {
        shards: Some(2),
        queues_per_shard: Some(1),
        ..LoadConfig::tiny()
    };
    let outside = LoadConfig {
        label: "tiny: 2 threads through the handle, batches, 20k msg/s".into(),
        via: Via::Handle,
        producers: 2,
        batch: 4,
        rate: Some(20_000.0),
        consumers: true,
        quiet: true,
        ..two_shards.clone()
    };
    // A kept store, then the modes that work on it (scenarios 5-7), in order.
    let _ = std::fs::remove_dir_all(kept_dir());
    let kept = |label: &str, mode: Mode| LoadConfig {
        label: label.into(),
        data_dir: Some(kept_dir()),
        mode,
        quiet: true,
        queries: 200,
        ..two_shards.clone()
    };
    vec![
        single,
        batched,
        outside,
        kept("tiny: kept store", Mode::Produce),
        kept("tiny: catch-up", Mode::CatchUp),
        kept("tiny: key queries", Mode::KeyQueries),
        kept("tiny: recover", Mode::Recover),
    ]
}
