//! A store kept by `coremq bench --data-dir` is the store users run: it opens with
//! `ShardedStore::open` (same shard count; another is refused by `store.meta`), every
//! message put by shard-local producers and by threads through the handle reads back
//! from the shard `shard_of` names, at that shard's offsets, and `coremq inspect
//! check` finds it clean.

use coremq::StoreOps;
use coremq::shard::{SHARD_SHIFT, shard_of, shard_of_offset};
use coremq::tools::{inspect, loadgen};
use coremq::{GetStatus, ShardedConfig, ShardedStore, StoredMessage};
use futures_lite::future::block_on;

const SHARDS: usize = 2;
const QUEUES: i32 = 8;
const PER_RUN: u64 = 400;

/// The paced run's timing check (consumers read while ~0.1 s of paced puts run) holds
/// this exclusively; every other test here shares it. Beside the 2 s closed loop, whose
/// two pinned shards take both CPUs, the paced run's consumers were starved until it
/// ended in about one run in three of this file (with and without glommio patch y).
static CPUS: std::sync::RwLock<()> = std::sync::RwLock::new(());

fn shared() -> std::sync::RwLockReadGuard<'static, ()> {
    CPUS.read().unwrap_or_else(|e| e.into_inner())
}

fn bench(dir: &std::path::Path, via: loadgen::Via) {
    let cfg = loadgen::LoadConfig {
        label: format!("bench_store {via:?}"),
        data_dir: Some(dir.to_path_buf()),
        shards: Some(SHARDS as u32),
        queues: QUEUES as u32,
        messages: Some(PER_RUN),
        outstanding: 8,
        producers: 2,
        via,
        quiet: true,
        ..loadgen::LoadConfig::default()
    };
    let report = loadgen::run(&cfg).expect("bench runs");
    assert!(report.ok(), "{}", report.summary());
    assert_eq!(report.messages, PER_RUN);
    assert_eq!(report.shard_queues.iter().sum::<usize>(), QUEUES as usize);
    // The shard threads did the puts (through the handle: all the store's work), and
    // their CPU is part of the process's.
    assert!(
        report.shard_cpu_seconds > 0.0 && report.shard_cpu_seconds <= report.cpu_seconds,
        "shard threads {} s of the process's {} s",
        report.shard_cpu_seconds,
        report.cpu_seconds
    );
}

fn config(dir: &std::path::Path, shards: usize) -> ShardedConfig {
    let mut cfg = ShardedConfig::new(dir);
    cfg.shards = shards;
    cfg.pin = false;
    cfg
}

#[test]
fn kept_bench_store_opens_sharded_and_checks_clean() {
    let _cpus = shared();
    let dir = tempfile::tempdir().unwrap();
    bench(dir.path(), loadgen::Via::Local);
    bench(dir.path(), loadgen::Via::Handle);

    let refused = ShardedStore::open(config(dir.path(), SHARDS + 1));
    assert!(
        refused.is_err(),
        "store.meta must refuse another shard count"
    );

    let store = ShardedStore::open(config(dir.path(), SHARDS)).unwrap();
    let h = store.handle();
    let mut read = 0;
    for q in 0..QUEUES {
        let topic = "BenchTopic0";
        let owner = shard_of(topic, q, SHARDS);
        let got = block_on(h.get(topic, q, 0, 1024, 64 << 20)).unwrap();
        if got.status == GetStatus::NoMessageInQueue {
            continue;
        }
        assert_eq!(got.status, GetStatus::Found, "{topic}/{q}");
        for raw in &got.records {
            let m = StoredMessage::decode(raw).unwrap();
            assert_eq!((m.topic.as_str(), m.queue_id), (topic, q));
            assert_eq!(shard_of_offset(m.log_offset), owner, "{topic}/{q}");
            assert!(m.property("KEYS").is_some_and(|k| k.starts_with('k')));
            read += 1;
        }
    }
    assert_eq!(read, 2 * PER_RUN, "every message put reads back");
    store.shutdown().unwrap();

    assert_eq!(inspect::SHARD_SHIFT, SHARD_SHIFT);
    let mut out = Vec::new();
    let clean = inspect::print_check(dir.path(), &mut out).unwrap();
    let lines = String::from_utf8(out).unwrap();
    assert!(clean, "inspect check: {lines}");
    assert_eq!(lines.lines().count(), SHARDS);
}

/// Scenario 8 tiny, so it cannot rot: a produce run as a SYNC_MASTER with a slave
/// (every put acknowledged by it), then the kept store replicated to a new slave.
#[test]
fn tiny_replication_bench_runs() {
    let _cpus = shared();
    let dir = tempfile::tempdir().unwrap();
    let store_dir = dir.path().join("store");
    let mut cfg = loadgen::LoadConfig {
        label: "bench_store slave".into(),
        data_dir: Some(store_dir.clone()),
        shards: Some(SHARDS as u32),
        queues: QUEUES as u32,
        messages: Some(PER_RUN),
        outstanding: 8,
        slave: true,
        quiet: true,
        ..loadgen::LoadConfig::default()
    };
    let report = loadgen::run(&cfg).expect("bench with a slave runs");
    assert!(report.ok(), "{}", report.summary());
    assert_eq!(report.messages, PER_RUN);
    cfg.slave = false;
    cfg.mode = loadgen::Mode::Replicate;
    cfg.json = Some(dir.path().join("replicate.json"));
    assert!(loadgen::run_mode(&cfg).expect("replicate mode runs"));
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("replicate.json")).unwrap()).unwrap();
    assert!(v["log_bytes"].as_u64().unwrap() > PER_RUN * 1024, "{v}");
    assert!(
        !dir.path().join("store-slave").exists(),
        "the slave's directory is removed"
    );
}

/// Scenario 9 tiny, so it cannot rot: `--mode timer` on a fresh store puts plain and
/// timed messages, and every timed one is delivered once, none early; a second run on
/// the same directory is refused (the mode needs a fresh store).
#[test]
fn tiny_timer_bench_runs() {
    let _cpus = shared();
    let dir = tempfile::tempdir().unwrap();
    let cfg = loadgen::LoadConfig {
        label: "bench_store timer".into(),
        mode: loadgen::Mode::Timer,
        data_dir: Some(dir.path().join("store")),
        shards: Some(SHARDS as u32),
        queues: QUEUES as u32,
        outstanding: 8,
        body: loadgen::BodySize::fixed(64),
        timed: 2000,
        spread_secs: 1,
        lead_secs: Some(2),
        quiet: true,
        json: Some(dir.path().join("timer.json")),
        ..loadgen::LoadConfig::default()
    };
    assert!(loadgen::run_mode(&cfg).expect("timer mode runs"));
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("timer.json")).unwrap()).unwrap();
    let d = &v["delivery"];
    assert_eq!(d["delivered"], 2000, "{v}");
    assert_eq!(
        (
            d["missing"].as_u64(),
            d["duplicates"].as_u64(),
            d["early"].as_u64()
        ),
        (Some(0), Some(0), Some(0)),
        "{v}"
    );
    assert_eq!(v["plain"]["messages"], 1000, "{v}");
    assert!(
        v["memory"]["after_timed_puts"]["rss_bytes"]
            .as_u64()
            .unwrap()
            > 0
    );
    assert!(loadgen::run_mode(&cfg).is_err(), "a kept store is refused");
}

/// `PER_RUN` messages, 4 outstanding, on a store under `dir`.
fn small_run(dir: &std::path::Path, label: &str) -> loadgen::LoadConfig {
    loadgen::LoadConfig {
        label: label.into(),
        data_dir: Some(dir.join("store")),
        shards: Some(SHARDS as u32),
        queues: QUEUES as u32,
        messages: Some(PER_RUN),
        outstanding: 4,
        quiet: true,
        ..loadgen::LoadConfig::default()
    }
}

/// A paced run (`--rate`) reports, for every put, how late it began and its own time
/// from when its lane began it, beside the latency charged from its intended start;
/// each put's latency is at least its service time, so the service percentiles never
/// exceed the latency's. An unpaced run has no late starts to report. Its tailing
/// consumers read every message.
#[test]
fn a_paced_run_splits_put_latency_into_late_start_and_service() {
    let _cpus = CPUS.write().unwrap_or_else(|e| e.into_inner());
    for rate in [Some(4000.0), None] {
        let dir = tempfile::tempdir().unwrap();
        let cfg = loadgen::LoadConfig {
            rate,
            // Tailing consumers, woken per queue: every message is read back (the run
            // is not ok otherwise) within the drain timeout.
            consumers: true,
            drain_timeout: 10.0,
            ..small_run(dir.path(), "paced")
        };
        let report = loadgen::run(&cfg).expect("bench runs");
        assert!(report.ok(), "{}", report.summary());
        let j = report.to_json();
        let count = |k: &str| j[k]["count"].as_u64().unwrap_or(0);
        assert_eq!(count("put_latency_us"), PER_RUN, "{j}");
        assert_eq!(count("put_service_us"), PER_RUN, "{j}");
        if rate.is_some() {
            assert_eq!(count("put_start_late_us"), PER_RUN, "{j}");
            // Paced over ~0.1 s, the consumers keep up: woken as their queues' records
            // become visible, not only when the run ends.
            assert!(report.consumed_while_producing >= PER_RUN / 2, "{j}");
        } else {
            assert!(j["put_start_late_us"].is_null(), "{j}");
        }
        for p in ["p50", "p99", "max"] {
            let (svc, lat) = (&j["put_service_us"][p], &j["put_latency_us"][p]);
            assert!(svc.as_f64().unwrap() <= lat.as_f64().unwrap(), "{p}: {j}");
        }
    }
}

/// `--pace-only` (the floor under a paced put, scenario 11) keeps and times the
/// producers' schedule like a paced run but puts nothing: every slot is counted and
/// timed, and the store's log stays empty.
#[test]
fn a_pace_only_run_times_the_schedule_and_puts_nothing() {
    let _cpus = shared();
    let dir = tempfile::tempdir().unwrap();
    let cfg = loadgen::LoadConfig {
        rate: Some(4000.0),
        pace_only: true,
        ..small_run(dir.path(), "pace only")
    };
    let report = loadgen::run(&cfg).expect("bench runs");
    assert!(report.ok(), "{}", report.summary());
    let j = report.to_json();
    assert_eq!(report.messages, PER_RUN, "{j}");
    assert_eq!(
        j["put_start_late_us"]["count"].as_u64(),
        Some(PER_RUN),
        "{j}"
    );
    assert_eq!(j["log_bytes"].as_u64(), Some(0), "{j}");
    assert_eq!(j["config"]["pace_only"].as_bool(), Some(true), "{j}");
    assert!(
        report.summary().contains("nothing put"),
        "{}",
        report.summary()
    );
    // The store it ran on holds nothing.
    let store = ShardedStore::open(config(&dir.path().join("store"), SHARDS)).unwrap();
    let h = store.handle();
    for q in 0..QUEUES {
        assert_eq!(block_on(h.queue_offsets("BenchTopic0", q)).unwrap(), (0, 0));
    }
    for shard in 0..SHARDS {
        let st = block_on(h.shard_status(shard)).unwrap();
        assert_eq!(st.max_log_offset, st.min_log_offset, "shard {shard}");
    }
    store.shutdown().unwrap();
    // Without a rate there is no schedule to keep.
    let unpaced = loadgen::LoadConfig { rate: None, ..cfg };
    assert!(loadgen::run(&unpaced).is_err());
}

/// A closed loop (no `--rate`) with tailing consumers: the consumers are woken and
/// read while the producers run, not only once they stop (the rule that tells them is
/// unit-tested in `loadgen::local`; this is the wiring, end to end). When a queue's
/// consumer was woken only after every put to it was dispatched, a 2 s release run read
/// 0 of 1,758,976 messages while producing.
#[test]
fn a_closed_loops_consumers_read_while_it_produces() {
    let _cpus = shared();
    let dir = tempfile::tempdir().unwrap();
    let cfg = loadgen::LoadConfig {
        label: "closed loop with consumers".into(),
        data_dir: Some(dir.path().to_path_buf()),
        shards: Some(SHARDS as u32),
        queues: 64,
        duration: 2.0,
        outstanding: 256,
        consumers: true,
        drain_timeout: 60.0,
        quiet: true,
        ..loadgen::LoadConfig::default()
    };
    let report = loadgen::run(&cfg).expect("bench runs");
    assert!(report.ok(), "{}", report.summary());
    // A debug build under parallel tests read 12% while producing, a release build
    // alone ~90%: the bar only asks that they read.
    assert!(
        report.consumed_while_producing > 0,
        "{} of {} messages consumed while producing",
        report.consumed_while_producing,
        report.messages
    );
}

/// `--warm-up`: through the handle, the same load runs first for the given time and
/// is left out of the report (its messages, its log bytes, the shard threads' CPU);
/// its messages are in the store all the same. Elsewhere it is refused.
#[test]
fn a_warm_up_is_put_but_not_measured() {
    let _cpus = shared();
    let dir = tempfile::tempdir().unwrap();
    let cfg = loadgen::LoadConfig {
        producers: 1,
        via: loadgen::Via::Handle,
        rate: Some(2000.0),
        warm_up: 0.3,
        ..small_run(dir.path(), "bench_store warm-up")
    };
    let report = loadgen::run(&cfg).expect("bench runs");
    assert!(report.ok(), "{}", report.summary());
    assert_eq!(report.messages, PER_RUN);

    let store = ShardedStore::open(config(&dir.path().join("store"), SHARDS)).unwrap();
    let h = store.handle();
    let mut read = 0u64;
    let mut log_bytes = 0u64;
    for q in 0..QUEUES {
        let got = block_on(h.get("BenchTopic0", q, 0, 100_000, 256 << 20)).unwrap();
        for raw in &got.records {
            read += 1;
            log_bytes += raw.len() as u64;
        }
    }
    store.shutdown().unwrap();
    // 0.3 s at 2,000 a second: ~600 more by the schedule (put late, not fewer, on a slow
    // machine); a third of that is asked.
    assert!(
        read >= PER_RUN + 200,
        "{read} messages in the store for {PER_RUN} measured: no warm-up put"
    );
    // The measured run's records only (within 10%: record sizes vary with their keys).
    let measured = log_bytes as f64 / read as f64 * PER_RUN as f64;
    assert!(
        report.log_bytes > 0 && (report.log_bytes as f64) < measured * 1.1,
        "the report's {} log bytes for {PER_RUN} messages: the warm-up's counted too \
         (the store holds {log_bytes} bytes in {read} records)",
        report.log_bytes
    );

    let refused = loadgen::run(&loadgen::LoadConfig {
        via: loadgen::Via::Local,
        warm_up: 1.0,
        ..loadgen::LoadConfig::tiny()
    });
    assert!(
        refused.is_err_and(|e| e.contains("--warm-up")),
        "--warm-up refused with --via local"
    );
}
