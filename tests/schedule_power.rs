//! Delayed and timed delivery across power losses, on the simulated disk
//! (`coremq::io::sim`): a store in async-flush mode (the mode where a power loss takes
//! the most) puts delayed messages (levels 1-2) and timed ones (`TIMER_DELAY_MS` 20..300,
//! the timer's memory capped at 4 so its runs and manifest are on the simulated disk
//! too) while it delivers others; at a seeded moment the disk "loses
//! power" (`SimDisk::crash_image`: every unsynced sector old or new, every unsynced
//! directory entry kept or lost); the image is opened (for some seeds losing power
//! again while it opens), every due message is let go, and then:
//! * every record in a schedule or timer queue is delivered exactly once (one record in the
//!   real queues carries its position, with its key), none before its time;
//! * no delivery names a position without a scheduled record (a delivery whose
//!   scheduled record the power loss took would show here).
//!
//! Two layouts: one shard (a single `Store` with `schedule::Solo`), and two shards
//! (a `ShardedStore` whose shards live on the simulated disk) with deliveries that
//! cross shards. `COREMQ_SCHED_POWER_SEEDS=<n>` (default 6 each), `COREMQ_SIM_SEED=<s>`
//! replays one seed.
mod common;
use coremq::format::schedule::{POSITION, Position, SCHEDULE_TOPIC, TIMER_LANE, TIMER_TOPIC};
use coremq::io::{Disk, SimDisk};
use coremq::prelude::*;
use coremq::schedule;
use futures_lite::future::block_on;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

const LEVELS: &str = "50ms 150ms 300ms";
const DELAYS_MS: [i64; 3] = [50, 150, 300];
const TOPIC: &str = "Power";
const QUEUES: i32 = 4;

fn cfg(root: &std::path::Path, disk: &Arc<SimDisk>) -> StoreConfig {
    let mut c = StoreConfig::small_for_tests(root);
    c.disk = Disk::Sim(disk.clone());
    c.flush_mode = FlushMode::Async;
    c.commit_interval = Duration::from_millis(10);
    c.flush_interval = Duration::from_millis(30);
    c.flush_least_pages = 1;
    c.flush_thorough_interval = Duration::from_millis(200);
    c.consume_queue_flush_interval = Duration::from_millis(80);
    c.schedule.message_delay_level = LEVELS.into();
    c.schedule.timer_memory_entries = 4;
    // Saves (manifest, run removal) happen while the power goes.
    c.schedule.timer_save_interval = Duration::from_millis(30);
    c.disk_space_check = false;
    c
}

fn seeds() -> Vec<u64> {
    if let Ok(s) = std::env::var("COREMQ_SIM_SEED") {
        return vec![s.parse().expect("COREMQ_SIM_SEED is a u64")];
    }
    let n = std::env::var("COREMQ_SCHED_POWER_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(6);
    (0..n).map(|i| 0x5C4E_D000 + i).collect()
}

/// Levels 1 and 2 are delay levels; "level" 3 is a timed message due 20..300 ms after
/// the put (the spread taken from the key, so due order differs from put order).
fn delayed(key: &str, q: i32, level: i32) -> Message {
    let m = Message::new(TOPIC, q, format!("body {key}")).with_property("UNIQ_KEY", key);
    if level == 3 {
        let spread = key
            .bytes()
            .fold(7u64, |h, b| h.wrapping_mul(31).wrapping_add(b as u64));
        m.with_property("TIMER_DELAY_MS", (20 + spread % 280).to_string())
    } else {
        m.with_property("DELAY", level.to_string())
    }
}

/// A delivery position: (shard, level, offset, 0) or (shard, timer lane, due, offset).
type Pos = (u32, u32, u64, u64);
/// Scheduled records of one store: position -> (key, due).
type Scheduled = BTreeMap<Pos, (String, i64)>;
/// Delivered copies: position -> [(key, store time)].
type Delivered = BTreeMap<Pos, Vec<(String, i64)>>;

async fn scheduled_of(store: &Store) -> Scheduled {
    let mut out = Scheduled::new();
    for level in 1..=3 {
        let mut off = store.min_queue_offset(SCHEDULE_TOPIC, level - 1);
        loop {
            let r = store
                .get(SCHEDULE_TOPIC, level - 1, off, 32, 1 << 20)
                .await
                .unwrap();
            if r.status != GetStatus::Found {
                break;
            }
            for raw in &r.records {
                let m = StoredMessage::decode(raw).unwrap();
                let due = m.store_timestamp_ms + DELAYS_MS[level as usize - 1];
                let key = m.property("UNIQ_KEY").unwrap().to_string();
                out.insert(
                    (store.shard_index(), level as u32, m.queue_offset, 0),
                    (key, due),
                );
            }
            off = r.next_begin_offset;
        }
    }
    let mut off = store.min_queue_offset(TIMER_TOPIC, 0);
    loop {
        let r = store.get(TIMER_TOPIC, 0, off, 32, 1 << 20).await.unwrap();
        if r.status != GetStatus::Found {
            break;
        }
        for raw in &r.records {
            let m = StoredMessage::decode(raw).unwrap();
            let at: i64 = m.property("TIMER_OUT_MS").unwrap().parse().unwrap();
            let due = at.max(m.store_timestamp_ms);
            let key = m.property("UNIQ_KEY").unwrap().to_string();
            out.insert(
                (store.shard_index(), TIMER_LANE, due as u64, m.queue_offset),
                (key, due),
            );
        }
        off = r.next_begin_offset;
    }
    out
}

async fn delivered_of(store: &Store, out: &mut Delivered) {
    for q in 0..QUEUES {
        let mut off = store.min_queue_offset(TOPIC, q);
        loop {
            let r = store.get(TOPIC, q, off, 32, 1 << 20).await.unwrap();
            if r.status != GetStatus::Found {
                break;
            }
            for raw in &r.records {
                let m = StoredMessage::decode(raw).unwrap();
                let p = Position::parse(m.property(POSITION).unwrap()).unwrap();
                let key = m.property("UNIQ_KEY").unwrap().to_string();
                out.entry((p.shard, p.lane, p.hi, p.lo))
                    .or_default()
                    .push((key, m.store_timestamp_ms));
            }
            off = r.next_begin_offset;
        }
    }
}

/// The checks of the module docs; `Err` lists what failed.
fn check(seed: u64, scheduled: &Scheduled, delivered: &Delivered) -> Result<(), String> {
    let mut problems = Vec::new();
    for (pos, copies) in delivered {
        if copies.len() != 1 {
            problems.push(format!("{pos:?} delivered {} times", copies.len()));
        }
        match scheduled.get(pos) {
            None => problems.push(format!("delivery {pos:?} has no scheduled record")),
            Some((key, due)) => {
                for (k, at) in copies {
                    if k != key {
                        problems.push(format!("{pos:?}: delivered {k}, scheduled {key}"));
                    }
                    if at < due {
                        problems.push(format!("{key} delivered {} ms early", due - at));
                    }
                }
            }
        }
    }
    for (pos, (key, _)) in scheduled {
        if !delivered.contains_key(pos) {
            problems.push(format!("{key} at {pos:?} never delivered"));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "seed {seed} (replay with COREMQ_SIM_SEED={seed}): {:#?}",
            &problems[..problems.len().min(10)]
        ))
    }
}

/// One shard: a `Store` delivering through `schedule::Solo`.
#[test]
fn one_shard_power_loss_delivers_each_delayed_message_once() {
    for seed in seeds() {
        let root = std::path::PathBuf::from("/sim/sched");
        let disk = SimDisk::new();
        let (d, r) = (disk.clone(), root.clone());
        let image = common_run(move || async move {
            let store = Store::open(cfg(&r, &d)).await.unwrap();
            schedule::start(schedule::Solo(store.clone())).unwrap();
            let mut rng = seed;
            let crash_after = Duration::from_millis(100 + seed % 700);
            let start = Instant::now();
            let mut i = 0u64;
            let image = loop {
                if start.elapsed() >= crash_after {
                    break d.crash_image(seed);
                }
                rng = rng
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let level = ((rng >> 33) % 3) as i32 + 1;
                let q = ((rng >> 40) % QUEUES as u64) as i32;
                let r = store.put(delayed(&format!("s{seed}-{i}"), q, level)).await;
                assert_eq!(r.status, PutStatus::PutOk);
                i += 1;
                glommio::timer::sleep(Duration::from_millis(1 + (rng >> 50) % 3)).await;
            };
            store.shutdown().await.unwrap();
            image
        });
        let reopen_crash = seed % 3 == 0;
        let (img, r) = (image.clone(), root.clone());
        let image = if reopen_crash {
            // Power lost again while the image recovers and starts delivering.
            common_run(move || async move {
                let store = Store::open(cfg(&r, &img)).await.unwrap();
                schedule::start(schedule::Solo(store.clone())).unwrap();
                glommio::timer::sleep(Duration::from_millis(40 + seed % 60)).await;
                let again = img.crash_image(seed ^ 0xA5A5);
                store.shutdown().await.unwrap();
                again
            })
        } else {
            image
        };
        let outcome = common_run(move || async move {
            let store = Store::open(cfg(&root, &image)).await.unwrap();
            let mut before = Delivered::new();
            delivered_of(&store, &mut before).await;
            schedule::start(schedule::Solo(store.clone())).unwrap();
            let scheduled = scheduled_of(&store).await;
            let start = Instant::now();
            let mut delivered = Delivered::new();
            while start.elapsed() < Duration::from_secs(10) {
                delivered.clear();
                delivered_of(&store, &mut delivered).await;
                if scheduled.keys().all(|p| delivered.contains_key(p)) {
                    break;
                }
                glommio::timer::sleep(Duration::from_millis(30)).await;
            }
            glommio::timer::sleep(Duration::from_millis(200)).await;
            delivered.clear();
            delivered_of(&store, &mut delivered).await;
            store.shutdown().await.unwrap();
            (
                scheduled.len(),
                before.len(),
                check(seed, &scheduled, &delivered),
            )
        });
        let (n, before, result) = outcome;
        result.unwrap();
        eprintln!(
            "seed {seed}: {n} scheduled ({before} delivered before the power loss), each delivered once (second loss while reopening: {reopen_crash})"
        );
        assert!(n > 0);
    }
}

/// Two shards on the simulated disk; shard 0 also stores messages for queues shard 1
/// owns, so deliveries cross shards when the power goes.
#[test]
fn two_shards_power_loss_delivers_each_delayed_message_once() {
    for seed in seeds() {
        let meta_dir = tempfile::tempdir().unwrap();
        let root = meta_dir.path().to_path_buf();
        let disk = SimDisk::new();
        let open = |disk: &Arc<SimDisk>| {
            let mut c = ShardedConfig::new(&root);
            c.shards = 2;
            c.pin = false;
            c.store = cfg(&root, disk);
            ShardedStore::open(c).unwrap()
        };
        let store = open(&disk);
        let h = store.handle();
        let foreign: Vec<i32> = (0..QUEUES).filter(|q| h.shard_of(TOPIC, *q) == 1).collect();
        let local: Vec<i32> = (0..QUEUES).filter(|q| h.shard_of(TOPIC, *q) == 0).collect();
        assert!(!foreign.is_empty() && !local.is_empty());
        let crash_after = Duration::from_millis(150 + seed % 600);
        let d = disk.clone();
        let image = block_on(h.run_on(0, move |ctx| async move {
            let start = Instant::now();
            let mut i = 0u64;
            loop {
                if start.elapsed() >= crash_after {
                    return d.crash_image(seed);
                }
                let level = (i % 3) as i32 + 1;
                // Half go to queues of shard 1 through this shard's own store.
                let q = if i.is_multiple_of(2) {
                    foreign[(i / 2) as usize % foreign.len()]
                } else {
                    local[(i / 2) as usize % local.len()]
                };
                let r = ctx
                    .store
                    .put(delayed(&format!("t{seed}-{i}"), q, level))
                    .await;
                assert_eq!(r.status, PutStatus::PutOk);
                i += 1;
                glommio::timer::sleep(Duration::from_millis(2)).await;
            }
        }))
        .unwrap();
        store.shutdown().unwrap();
        let store = open(&image);
        let h = store.handle();
        let scheduled: Scheduled = (0..2)
            .flat_map(|s| block_on(h.run_at(s, &(), async |st, _| scheduled_of(st).await)).unwrap())
            .collect();
        let collect = || {
            let mut delivered = Delivered::new();
            for s in 0..2 {
                let part = block_on(h.run_at(s, &(), async |st, _| {
                    let mut out = Delivered::new();
                    delivered_of(st, &mut out).await;
                    out
                }))
                .unwrap();
                for (k, v) in part {
                    delivered.entry(k).or_default().extend(v);
                }
            }
            delivered
        };
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10)
            && !scheduled.keys().all(|p| collect().contains_key(p))
        {
            std::thread::sleep(Duration::from_millis(30));
        }
        std::thread::sleep(Duration::from_millis(200));
        let delivered = collect();
        store.shutdown().unwrap();
        check(seed, &scheduled, &delivered).unwrap();
        eprintln!(
            "seed {seed}: {} scheduled on 2 shards, each delivered once",
            scheduled.len()
        );
        assert!(!scheduled.is_empty());
    }
}

/// Runs `f` on a fresh executor and returns its output.
fn common_run<T, F, Fut>(f: F) -> T
where
    T: Send + 'static,
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = T> + 'static,
{
    glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
        .spawn(f)
        .expect("spawn executor")
        .join()
        .expect("executor panicked")
}
