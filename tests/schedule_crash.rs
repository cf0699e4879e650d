//! Delayed and timed delivery across crashes: every delayed or timed message delivered
//! exactly once, none early, whatever moment a `kill -9` (this file) or a power loss
//! (`tests/schedule_power.rs`, delay levels) picks. Lateness is reported.
//!
//! Every cycle:
//! 1. A child (this test binary as `schedule_crash_child`, active only with
//!    `COREMQ_SCHED_CHILD=<dir>`) opens a 3-shard store with short delay levels
//!    (100 ms .. 1.5 s) and delivery on, in sync-flush mode on even cycles, async on
//!    odd ones, and puts delayed messages from three threads through the handle and
//!    from a task on shard 0 straight into its own store for queues other shards own
//!    (so deliveries cross shards). One put in three is a timed message instead
//!    (`TIMER_DELAY_MS` 50..1500 ms, or `TIMER_DELIVER_MS`), with the timer's memory
//!    capped at 32 entries a shard so that most wait in its runs on disk, and a crash
//!    lands in spills, merges and manifest saves too. After each stored put it appends the message's
//!    key to its ack log (one `write(2)`, so a kill cuts at most the last line).
//!    Deliveries run all the while: the kill lands in the middle of them.
//! 2. The parent SIGKILLs the child at a seeded moment (sometimes while it opens).
//! 3. The parent opens the store itself, lets every due message be delivered, and
//!    checks, over everything the store holds:
//!    * every record in a schedule queue (any shard, any level) or timer queue was
//!      delivered exactly once: one record in the real queues carries its position,
//!      with its key;
//!    * no delivered record names a position that holds no scheduled record;
//!    * no delivery came before its time (store time of the delivered record >= store
//!      time of the scheduled one + the level's delay; for a timed one, >= its due
//!      time, `TIMER_OUT_MS` or its store time if later);
//!    * a record in a real queue without a position is a timed message whose time had
//!      passed when its put was admitted (stored as an ordinary message, as RocketMQ
//!      does), never one stored before its time;
//!    * every put the child saw stored in sync-flush mode is among the scheduled
//!      records (or those ordinary ones) (an async put a kill took may be missing: that is the flush mode's
//!      contract, not delivery's);
//!    * `coremq inspect check` finds the store clean.
//!
//! The last line printed: `cycles=N scheduled=S delivered=D duplicates=0 missing=0
//! early=0 lateness_ms p50=.. p99=.. max=.. (live, n=..) seed=..`. Lateness "live" counts
//! deliveries whose time came while a child ran and that the child made; deliveries
//! due while no process ran are late by the downtime (their count is printed).
//!
//! `COREMQ_SCHED_CYCLES` (default 6), `COREMQ_SCHED_SEED` (printed), `COREMQ_SCHED_DIR`.
//! ```sh
//! COREMQ_SCHED_CYCLES=100 cargo test --release --test schedule_crash -- --nocapture
//! ```
#[path = "common/child.rs"]
mod child;

use child::*;
use coremq::format::schedule::{POSITION, Position, SCHEDULE_TOPIC, TIMER_LANE, TIMER_TOPIC};
use coremq::prelude::*;
use futures_lite::future::block_on;
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

const CHILD_ENV: &str = "COREMQ_SCHED_CHILD";
const ACKS_ENV: &str = "COREMQ_SCHED_ACKS";
const OPENED_ENV: &str = "COREMQ_SCHED_OPENED";
const CYCLE_ENV: &str = "COREMQ_SCHED_CYCLE";
const SHARDS: usize = 3;
const LEVELS: &str = "100ms 300ms 700ms 1500ms";
const DELAYS_MS: [i64; 4] = [100, 300, 700, 1500];
const TOPICS: [&str; 2] = ["SchedA", "%RETRY%sched-group"];
const QUEUES: i32 = 6;

fn config(root: &Path, sync: bool) -> ShardedConfig {
    let mut cfg = ShardedConfig::new(root);
    cfg.shards = SHARDS;
    cfg.pin = false;
    cfg.store = StoreConfig::small_for_tests(root);
    cfg.store.flush_mode = if sync {
        FlushMode::Sync
    } else {
        FlushMode::Async
    };
    cfg.store.schedule.message_delay_level = LEVELS.into();
    cfg.store.schedule.timer_memory_entries = 32;
    cfg.store.schedule.timer_save_interval = Duration::from_millis(100);
    cfg
}

/// A delayed message one time in three, a timed one otherwise.
fn scheduled_msg(key: &str, topic: &str, q: i32, rng: &mut Rng) -> Message {
    match rng.range(0, 2) {
        0 => delayed(key, topic, q, rng.range(1, 4) as i32),
        1 => Message::new(topic, q, format!("body of {key}"))
            .with_keys(key)
            .with_property("UNIQ_KEY", key)
            .with_property("TIMER_DELAY_MS", rng.range(50, 1500).to_string()),
        _ => Message::new(topic, q, format!("body of {key}"))
            .with_keys(key)
            .with_property("UNIQ_KEY", key)
            .with_property(
                "TIMER_DELIVER_MS",
                (coremq::now_ms() + rng.range(50, 1500) as i64).to_string(),
            ),
    }
}

fn delayed(key: &str, topic: &str, q: i32, level: i32) -> Message {
    Message::new(topic, q, format!("body of {key}"))
        .with_keys(key)
        .with_property("UNIQ_KEY", key)
        .with_property("DELAY", level.to_string())
}

/// The child: puts delayed messages until killed.
#[test]
fn schedule_crash_child() {
    let Ok(dir) = std::env::var(CHILD_ENV) else {
        return;
    };
    let acks = std::env::var(ACKS_ENV).unwrap();
    let opened = std::env::var(OPENED_ENV).unwrap();
    let cycle: u64 = std::env::var(CYCLE_ENV).unwrap().parse().unwrap();
    let store = ShardedStore::open(config(Path::new(&dir), cycle.is_multiple_of(2))).unwrap();
    std::fs::write(&opened, crate::now().to_string()).unwrap();
    let log = std::sync::Arc::new(std::sync::Mutex::new(
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&acks)
            .unwrap(),
    ));
    let ack = move |key: &str| {
        let mut f = log.lock().unwrap();
        f.write_all(format!("{key}\n").as_bytes()).unwrap();
    };
    let h = store.handle();
    let mut threads = Vec::new();
    for t in 0..3u64 {
        let (h, ack) = (h.clone(), ack.clone());
        threads.push(std::thread::spawn(move || {
            let mut rng = Rng::new(cycle * 1000 + t);
            for i in 0.. {
                let key = format!("c{cycle}-t{t}-{i}");
                let topic = TOPICS[rng.range(0, 1) as usize];
                let q = rng.range(0, QUEUES as u64 - 1) as i32;
                let r = block_on(h.put(scheduled_msg(&key, topic, q, &mut rng)));
                if r.status.is_stored() {
                    ack(&key);
                }
                std::thread::sleep(Duration::from_micros(rng.range(0, 3000)));
            }
        }));
    }
    // Shard 0 stores messages for queues other shards own: their deliveries cross.
    let foreign: Vec<(&str, i32)> = TOPICS
        .iter()
        .flat_map(|t| (0..QUEUES).map(move |q| (*t, q)))
        .filter(|(t, q)| h.shard_of(t, *q) != 0)
        .collect();
    let ack0 = ack.clone();
    let _ = block_on(h.run_on(0, move |ctx| async move {
        let mut rng = Rng::new(cycle * 1000 + 99);
        for i in 0.. {
            let key = format!("c{cycle}-x-{i}");
            let (topic, q) = foreign[rng.range(0, foreign.len() as u64 - 1) as usize];
            let m = scheduled_msg(&key, topic, q, &mut rng);
            let r = ctx.store.put(m).await;
            if r.status.is_stored() {
                ack0(&key);
            }
            glommio::timer::sleep(Duration::from_micros(rng.range(500, 5000))).await;
        }
    }));
    for t in threads {
        let _ = t.join();
    }
}

fn now() -> i64 {
    coremq::now_ms()
}

/// What the verifier found.
#[derive(Default)]
struct Tally {
    scheduled: u64,
    delivered: u64,
    duplicates: u64,
    missing: u64,
    early: u64,
    orphans: u64,
    lost_acks: u64,
    /// Timed messages whose time had passed at their put (stored as ordinary ones).
    due_at_put: u64,
    /// (due, delivered store time, crossed shards) of every delivery.
    times: Vec<(i64, i64, bool)>,
}

/// Opens the store, lets every due message go, and checks it (module docs).
fn verify(root: &Path, acked_sync: &BTreeSet<String>, problems: &mut Vec<String>) -> Tally {
    let store = ShardedStore::open(config(root, true)).expect("reopen");
    let h = store.handle();
    // Every scheduled record: its position (shard, level, offset, 0) or (shard, timer
    // lane, due, offset) -> (key, due).
    let mut scheduled: BTreeMap<Pos, (String, i64)> = BTreeMap::new();
    for shard in 0..SHARDS {
        for level in 1..=DELAYS_MS.len() as i32 {
            let got = block_on(h.run_at(shard, &(), async move |s, _| {
                let mut out = Vec::new();
                let mut off = s.min_queue_offset(SCHEDULE_TOPIC, level - 1);
                loop {
                    let r = s
                        .get(SCHEDULE_TOPIC, level - 1, off, 32, 1 << 20)
                        .await
                        .unwrap();
                    if r.status != GetStatus::Found {
                        return out;
                    }
                    for raw in &r.records {
                        out.push(StoredMessage::decode(raw).unwrap());
                    }
                    off = r.next_begin_offset;
                }
            }))
            .unwrap();
            for m in got {
                let due = m.store_timestamp_ms + DELAYS_MS[level as usize - 1];
                let key = m.property("UNIQ_KEY").unwrap().to_string();
                scheduled.insert((shard as u32, level as u32, m.queue_offset, 0), (key, due));
            }
        }
        let timed = block_on(h.run_at(shard, &(), async move |s, _| {
            let mut out = Vec::new();
            let mut off = s.min_queue_offset(TIMER_TOPIC, 0);
            loop {
                let r = s.get(TIMER_TOPIC, 0, off, 32, 1 << 20).await.unwrap();
                if r.status != GetStatus::Found {
                    return out;
                }
                for raw in &r.records {
                    out.push(StoredMessage::decode(raw).unwrap());
                }
                off = r.next_begin_offset;
            }
        }))
        .unwrap();
        for m in timed {
            let out: i64 = m.property("TIMER_OUT_MS").unwrap().parse().unwrap();
            let due = out.max(m.store_timestamp_ms);
            let key = m.property("UNIQ_KEY").unwrap().to_string();
            scheduled.insert(
                (shard as u32, TIMER_LANE, due as u64, m.queue_offset),
                (key, due),
            );
        }
    }
    // Wait until every lane has delivered its whole queue.
    let start = Instant::now();
    let delivered = loop {
        let delivered = read_delivered(&h);
        let done = scheduled.keys().all(|p| delivered.contains_key(p));
        if done || start.elapsed() > Duration::from_secs(30) {
            break delivered;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    // A little longer: a duplicate would show up now.
    std::thread::sleep(Duration::from_millis(300));
    let delivered_again = read_delivered(&h);
    let mut t = Tally {
        scheduled: scheduled.len() as u64,
        ..Tally::default()
    };
    for (pos, copies) in &delivered_again {
        t.delivered += 1;
        if copies.len() > 1 {
            t.duplicates += 1;
            problems.push(format!("{pos:?} delivered {} times", copies.len()));
        }
        match scheduled.get(pos) {
            None => {
                t.orphans += 1;
                problems.push(format!("delivery {pos:?} has no scheduled record"));
            }
            Some((key, due)) => {
                for (k, at) in copies {
                    if k != key {
                        problems.push(format!("{pos:?} delivered {k}, scheduled {key}"));
                    }
                    if at < due {
                        t.early += 1;
                        problems.push(format!("{key} delivered {} ms early", due - at));
                    }
                    t.times.push((*due, *at, k.contains("-x-")));
                }
            }
        }
    }
    for (pos, (key, _)) in &scheduled {
        if !delivered.contains_key(pos) {
            t.missing += 1;
            problems.push(format!("{key} at {pos:?} never delivered"));
        }
    }
    let due_at_put = read_real_queues(&h).1;
    t.due_at_put = due_at_put.len() as u64;
    let keys: BTreeSet<&String> = scheduled
        .values()
        .map(|(k, _)| k)
        .chain(due_at_put.iter())
        .collect();
    for k in acked_sync {
        if !keys.contains(k) {
            t.lost_acks += 1;
            problems.push(format!("{k} was stored (sync flush) but is not scheduled"));
        }
    }
    store.shutdown().expect("clean shutdown");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_coremq"))
        .args(["inspect", "check"])
        .arg(root)
        .output()
        .expect("run coremq inspect check");
    if !out.status.success() {
        problems.push(format!(
            "inspect check: {}",
            String::from_utf8_lossy(&out.stdout)
        ));
    }
    t
}

/// A delivery position: (shard, lane, hi, lo).
type Pos = (u32, u32, u64, u64);

/// position -> every delivered copy: (key, store time).
type Deliveries = BTreeMap<Pos, Vec<(String, i64)>>;

fn read_delivered(h: &Handle) -> Deliveries {
    read_real_queues(h).0
}

/// What the real queues hold: deliveries by position, and the keys of timed messages
/// whose time had passed when their put was admitted (stored as ordinary messages, as
/// RocketMQ does: the child computes `TIMER_DELIVER_MS` before a put that can wait).
fn read_real_queues(h: &Handle) -> (Deliveries, BTreeSet<String>) {
    let mut out = Deliveries::new();
    let mut due_at_put = BTreeSet::new();
    for topic in TOPICS {
        for q in 0..QUEUES {
            let mut off = 0;
            loop {
                let r = block_on(h.get(topic, q, off, 32, 1 << 20)).unwrap();
                if r.status != GetStatus::Found {
                    break;
                }
                for raw in &r.records {
                    let m = StoredMessage::decode(raw).unwrap();
                    let key = m.property("UNIQ_KEY").unwrap().to_string();
                    let Some(pos) = m.property(POSITION) else {
                        let at: i64 = m
                            .property("TIMER_DELIVER_MS")
                            .unwrap_or_else(|| {
                                panic!("{key} in {topic}/{q} is neither delivered nor timed")
                            })
                            .parse()
                            .unwrap();
                        assert!(
                            at <= m.store_timestamp_ms,
                            "{key} stored as an ordinary message {} ms before its time",
                            at - m.store_timestamp_ms
                        );
                        due_at_put.insert(key);
                        continue;
                    };
                    let p = Position::parse(pos).expect("a valid position");
                    out.entry((p.shard, p.lane, p.hi, p.lo))
                        .or_default()
                        .push((key, m.store_timestamp_ms));
                }
                off = r.next_begin_offset;
            }
        }
    }
    (out, due_at_put)
}

fn percentile(sorted: &[i64], p: f64) -> i64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * p) as usize]
}

#[test]
fn delayed_messages_delivered_exactly_once_across_kill_9() {
    if std::env::var(CHILD_ENV).is_ok() {
        return;
    }
    let cycles: u64 = std::env::var("COREMQ_SCHED_CYCLES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(6);
    let seed = seed_from_env("COREMQ_SCHED_SEED");
    let mut rng = Rng::new(seed);
    let base = std::env::var_os("COREMQ_SCHED_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let work = tempfile::Builder::new()
        .prefix("coremq-sched-crash")
        .tempdir_in(base)
        .unwrap();
    let root = work.path().join("store");
    let mut acked_sync = BTreeSet::new();
    // Child lifetimes: (opened at, killed at).
    let mut lives: Vec<(i64, i64)> = Vec::new();
    let mut problems = Vec::new();
    let mut last = Tally::default();
    for cycle in 0..cycles {
        let acks = work.path().join(format!("acks-{cycle}"));
        let opened = work.path().join(format!("opened-{cycle}"));
        let log = work.path().join(format!("child-{cycle}.log"));
        let envs = [
            (CHILD_ENV, OsString::from(&root)),
            (ACKS_ENV, OsString::from(&acks)),
            (OPENED_ENV, OsString::from(&opened)),
            (CYCLE_ENV, OsString::from(cycle.to_string())),
        ];
        let mut child = spawn_self("schedule_crash_child", &envs, &log);
        let spawned = Instant::now();
        let early_kill = rng.range(0, 9) < 3;
        let wait = Duration::from_millis(rng.range(0, if early_kill { 400 } else { 1800 }));
        if !early_kill {
            while !opened.exists() {
                assert!(
                    spawned.elapsed() < Duration::from_secs(60),
                    "child never opened: {}",
                    log_tail(&log, 3000)
                );
                if let Ok(Some(st)) = child.try_wait() {
                    panic!("child exited ({st}): {}", log_tail(&log, 3000));
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        std::thread::sleep(wait);
        child.kill().expect("SIGKILL the child");
        let killed = now();
        let _ = child.wait();
        if let Ok(t) = std::fs::read_to_string(&opened) {
            lives.push((t.trim().parse().unwrap_or(killed), killed));
        }
        let text = std::fs::read_to_string(&acks).unwrap_or_default();
        let complete = text.rsplit_once('\n').map_or("", |(done, _)| done);
        if cycle % 2 == 0 {
            acked_sync.extend(complete.lines().map(str::to_string));
        }
        last = verify(&root, &acked_sync, &mut problems);
        eprintln!(
            "cycle {cycle} ({}): scheduled={} delivered={} acks={} problems={}",
            if cycle % 2 == 0 { "sync" } else { "async" },
            last.scheduled,
            last.delivered,
            complete.lines().count(),
            problems.len()
        );
        if !problems.is_empty() {
            break;
        }
    }
    // Lateness of deliveries a child made while alive, for messages due then.
    let (mut live, mut cross) = (Vec::new(), Vec::new());
    let mut downtime = 0;
    for (due, at, crossed) in &last.times {
        let in_life = lives
            .iter()
            .any(|(open, kill)| *due >= *open && *at < *kill && *due < *kill);
        match (in_life, crossed) {
            (true, false) => live.push(at - due),
            (true, true) => cross.push(at - due),
            (false, _) => downtime += 1,
        }
    }
    live.sort();
    cross.sort();
    let stats = |v: &[i64]| {
        format!(
            "p50={} p99={} max={} n={}",
            percentile(v, 0.5),
            percentile(v, 0.99),
            v.last().copied().unwrap_or(0),
            v.len()
        )
    };
    println!(
        "cycles={cycles} scheduled={} delivered={} duplicates={} missing={} early={} orphans={} lost_acks={} due_at_put={} \
         lateness_ms live: same shard {}, crossing shards {}; {downtime} due while no process ran; seed={seed}",
        last.scheduled,
        last.delivered,
        last.duplicates,
        last.missing,
        last.early,
        last.orphans,
        last.lost_acks,
        last.due_at_put,
        stats(&live),
        stats(&cross),
    );
    if !problems.is_empty() {
        let keep = work.keep();
        panic!(
            "store kept at {}; first problems: {:#?}",
            keep.display(),
            &problems[..problems.len().min(20)]
        );
    }
    assert!(last.scheduled > 0, "the children scheduled nothing");
}
