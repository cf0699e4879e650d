//! Query by message key (issue 4): the IndexFile built by dispatch, queries on one
//! store and across shards, hash collisions, time ranges, rollover, rebuilding from
//! the CommitLog after the index is deleted, and crashes in the middle of indexing
//! (a dropped store, and a child process killed with SIGKILL).
#[path = "common/child.rs"]
mod child;
mod common;

use child::*;
use common::run;
use coremq::StoreOps;
use coremq::format::index_file;
use coremq::format::properties;
use coremq::{
    Error, FlushMode, Message, PutStatus, ShardedConfig, ShardedStore, Store, StoreConfig,
    StoredMessage, tools::inspect,
};
use futures_lite::future::block_on;
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

const ALL: (i64, i64) = (0, i64::MAX);

/// A config whose index files fill after a few hundred entries and whose page set
/// is the smallest allowed (16 pages), so rollover and eviction happen all the time.
fn tiny(root: &Path) -> StoreConfig {
    let mut cfg = StoreConfig::small_for_tests(root);
    cfg.index_hash_slots = 3001; // 12 KiB of slots: 3 pages
    cfg.index_max_entries = 700; // 14 KiB of entries per file
    cfg.index_max_dirty_bytes = 16 * 4096;
    cfg.query_max = 10_000;
    cfg.query_default_max = 32;
    cfg
}

fn keyed(topic: &str, q: i32, i: u64, keys: &str) -> Message {
    Message::new(topic, q, common::body(topic, q, i)).with_keys(keys)
}

fn offsets(ms: &[StoredMessage]) -> Vec<u64> {
    ms.iter().map(|m| m.log_offset).collect()
}

/// Newest first: store time, then log offset, never increasing.
fn assert_newest_first(ms: &[StoredMessage]) {
    for w in ms.windows(2) {
        assert!(
            (w[0].store_timestamp_ms, w[0].log_offset) > (w[1].store_timestamp_ms, w[1].log_offset),
            "not newest first: {} then {}",
            w[0].log_offset,
            w[1].log_offset
        );
    }
}

#[test]
fn hash_collisions_many_per_key_and_unique_keys() {
    assert_eq!(
        index_file::key_hash("T", "Aa"),
        index_file::key_hash("T", "BB")
    );
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    run(move || async move {
        let mut cfg = StoreConfig::small_for_tests(&root);
        cfg.query_max = 1000;
        let store = Store::open(cfg).await.unwrap();
        let mut aa = Vec::new();
        let mut bb = Vec::new();
        let mut uniq = BTreeMap::new();
        for i in 0..400u64 {
            let keys = match i % 4 {
                0 => "Aa".to_string(),
                1 => "BB".to_string(),
                2 => format!("Aa u{i}  BB"), // both, with an empty part
                _ => format!("other{i}"),
            };
            let id = format!("UNIQ{i:06}");
            let m = keyed("T", (i % 3) as i32, i, &keys).with_property(properties::UNIQ_KEY, &id);
            let r = store.put(m).await;
            assert_eq!(r.status, PutStatus::PutOk);
            if keys.split(' ').any(|k| k == "Aa") {
                aa.push(r.log_offset);
            }
            if keys.split(' ').any(|k| k == "BB") {
                bb.push(r.log_offset);
            }
            uniq.insert(id, r.log_offset);
        }
        // The same key on another topic must not answer.
        store.put(keyed("Other", 0, 0, "Aa")).await;
        store.wait_dispatched().await;
        aa.reverse();
        bb.reverse();
        let got = store
            .query_by_key("T", "Aa", 1000, ALL.0, ALL.1)
            .await
            .unwrap();
        assert_eq!(offsets(&got), aa, "every Aa message, newest first, no BB");
        assert_newest_first(&got);
        let got = store
            .query_by_key("T", "BB", 1000, ALL.0, ALL.1)
            .await
            .unwrap();
        assert_eq!(offsets(&got), bb);
        // Limits: max, and the configured clamp.
        let got = store
            .query_by_key("T", "Aa", 7, ALL.0, ALL.1)
            .await
            .unwrap();
        assert_eq!(offsets(&got), aa[..7]);
        for (id, off) in &uniq {
            let got = store.query_by_key("T", id, 5, ALL.0, ALL.1).await.unwrap();
            assert_eq!(offsets(&got), [*off], "unique key {id}");
        }
        assert!(
            store
                .query_by_key("T", "nope", 5, ALL.0, ALL.1)
                .await
                .unwrap()
                .is_empty()
        );
        assert!(
            store
                .query_by_key("T", "u2", 5, ALL.0, ALL.1)
                .await
                .unwrap()
                .len()
                == 1
        );
        // Bad input.
        let bad = |r: coremq::Result<Vec<StoredMessage>>| matches!(r, Err(Error::BadRequest(_)));
        assert!(bad(store.query_by_key("T", "", 5, ALL.0, ALL.1).await));
        assert!(bad(store.query_by_key("", "Aa", 5, ALL.0, ALL.1).await));
        assert!(bad(store
            .query_by_key("T", &"k".repeat(40_000), 5, ALL.0, ALL.1)
            .await));
        assert!(bad(store.query_by_key("T", "Aa", 5, 10, 9).await));
        assert!(
            store
                .query_by_key("T", "Aa", 0, ALL.0, ALL.1)
                .await
                .unwrap()
                .is_empty()
        );
        store.shutdown().await.unwrap();

        // The default clamp is RocketMQ's 64.
        let store = Store::open(StoreConfig::small_for_tests(&root))
            .await
            .unwrap();
        let got = store
            .query_by_key("T", "Aa", 1000, ALL.0, ALL.1)
            .await
            .unwrap();
        assert_eq!(offsets(&got), aa[..64], "after a restart, clamped to 64");
        store.shutdown().await.unwrap();
    });
}

#[test]
fn time_ranges_at_the_edges() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    run(move || async move {
        let store = Store::open(StoreConfig::small_for_tests(&root))
            .await
            .unwrap();
        // Three bursts more than a second apart, so index time differences (whole
        // seconds) differ between bursts and bursts straddle second boundaries.
        let mut puts: Vec<(i64, u64)> = Vec::new();
        for burst in 0..3u64 {
            for i in 0..20u64 {
                let r = store.put(keyed("T", 0, burst * 100 + i, "K")).await;
                puts.push((r.store_timestamp_ms, r.log_offset));
                if i % 5 == 4 {
                    glommio::timer::sleep(Duration::from_millis(60)).await;
                }
            }
            glommio::timer::sleep(Duration::from_millis(1100)).await;
        }
        store.wait_dispatched().await;
        let expect = |b: i64, e: i64| -> Vec<u64> {
            let mut v: Vec<u64> = puts
                .iter()
                .filter(|(t, _)| (b..=e).contains(t))
                .map(|(_, o)| *o)
                .collect();
            v.reverse();
            v
        };
        let first = puts[0].0;
        let last = puts.last().unwrap().0;
        let mut ranges = vec![
            (first, last),
            (first, first),
            (last, last),
            (last + 1, i64::MAX),
            (i64::MIN, first - 1),
            (i64::MIN, i64::MAX),
            (first + 1, last - 1),
        ];
        for &(t, _) in puts.iter().step_by(7) {
            ranges.push((t, t));
            ranges.push((t - 999, t));
            ranges.push((t, t + 999));
            ranges.push((t + 1, t + 1500));
        }
        for (b, e) in ranges {
            let got = store.query_by_key("T", "K", 64, b, e).await.unwrap();
            assert_eq!(offsets(&got), expect(b, e), "range [{b}, {e}]");
            for m in &got {
                assert!((b..=e).contains(&m.store_timestamp_ms));
            }
        }
        store.shutdown().await.unwrap();
    });
}

/// Puts `n` messages over topics T0/T1 and 3 queues with keys `k<i>` (unique),
/// `g<i % 7>` (shared) and sometimes a UNIQ_KEY. Returns (log offset, keys) per put.
async fn put_keyed(store: &Store, from: u64, n: u64) -> Vec<(u64, String, Vec<String>)> {
    let mut out = Vec::new();
    for i in from..from + n {
        let topic = format!("T{}", i % 2);
        let mut m = keyed(&topic, (i % 3) as i32, i, &format!("k{i} g{}", i % 7));
        let mut keys = vec![format!("k{i}"), format!("g{}", i % 7)];
        if i % 5 == 0 {
            m = m.with_property(properties::UNIQ_KEY, format!("U{i}"));
            keys.push(format!("U{i}"));
        }
        let r = store.put(m).await;
        assert!(r.status.is_stored(), "{:?}", r.status);
        out.push((r.log_offset, topic, keys));
    }
    out
}

/// Every record of the log must be found by each of its keys (what the CommitLog
/// holds is what the index must answer).
async fn assert_log_fully_indexed(store: &Store, root: &Path) -> usize {
    // The offline reader sees the files: write the log out first.
    store.flush().await.unwrap();
    store.wait_dispatched().await;
    let (records, _) = inspect::records(root).unwrap();
    let mut by_key: BTreeMap<(String, String), BTreeSet<u64>> = BTreeMap::new();
    for r in &records {
        let uniq = r
            .properties
            .iter()
            .find(|(n, _)| n == properties::UNIQ_KEY)
            .map(|(_, v)| v.as_str());
        for k in index_file::index_keys(uniq, r.keys.as_deref()) {
            by_key
                .entry((r.topic.clone(), k.to_string()))
                .or_default()
                .insert(r.offset);
        }
    }
    // 64 queries at a time (each is a chain of dependent reads).
    let items: Vec<_> = by_key.into_iter().collect();
    for chunk in items.chunks(64) {
        let tasks: Vec<_> = chunk
            .iter()
            .cloned()
            .map(|((topic, key), want)| {
                let store = store.clone();
                glommio::spawn_local(async move {
                    let got = store
                        .query_by_key(&topic, &key, 10_000, ALL.0, ALL.1)
                        .await
                        .unwrap();
                    let got_set: BTreeSet<u64> = offsets(&got).into_iter().collect();
                    assert_eq!(
                        got.len(),
                        got_set.len(),
                        "{topic}#{key}: a record came back twice"
                    );
                    if got_set != want {
                        panic!(
                            "{topic}#{key}: missing {:?}, extra {:?}",
                            want.difference(&got_set).collect::<Vec<_>>(),
                            got_set.difference(&want).collect::<Vec<_>>()
                        );
                    }
                    assert_newest_first(&got);
                })
            })
            .collect();
        for t in tasks {
            t.await;
        }
    }
    records.len()
}

fn index_files(root: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(root.join("index"))
        .map(|rd| rd.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

#[test]
fn rollover_eviction_restart_and_rebuild() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    run(move || async move {
        let store = Store::open(tiny(&root)).await.unwrap();
        put_keyed(&store, 0, 1500).await;
        store.wait_dispatched().await;
        let n = assert_log_fully_indexed(&store, &root).await;
        assert_eq!(n, 1500);
        store.shutdown().await.unwrap();
        let files = index_files(&root);
        // 1500 messages x 2.2 keys / 699 entries per file.
        assert!(files.len() >= 5, "expected rollovers, got {files:?}");
        let geo = index_file::Geometry {
            slots: 3001,
            entries: 700,
        };
        for f in &files {
            let name = f.file_name().unwrap().to_str().unwrap();
            assert!(index_file::parse_file_name(name).is_some(), "{name}");
            assert_eq!(std::fs::metadata(f).unwrap().len(), geo.file_len());
        }
        let names: Vec<_> = files
            .iter()
            .map(|f| f.file_name().unwrap().to_owned())
            .collect();
        let mut sorted = names.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(names, sorted);

        // Clean restart: same answers, and more puts go on in the last file.
        let store = Store::open(tiny(&root)).await.unwrap();
        put_keyed(&store, 1500, 300).await;
        store.wait_dispatched().await;
        assert_log_fully_indexed(&store, &root).await;
        store.shutdown().await.unwrap();

        // Delete the whole index: it is rebuilt from the CommitLog at open.
        std::fs::remove_dir_all(root.join("index")).unwrap();
        let store = Store::open(tiny(&root)).await.unwrap();
        assert_eq!(assert_log_fully_indexed(&store, &root).await, 1800);
        store.shutdown().await.unwrap();

        // Delete only the newest files: rebuilt from the older files' end.
        let files = index_files(&root);
        for f in &files[files.len() - 2..] {
            std::fs::remove_file(f).unwrap();
        }
        let store = Store::open(tiny(&root)).await.unwrap();
        assert_eq!(assert_log_fully_indexed(&store, &root).await, 1800);
        store.shutdown().await.unwrap();

        // A newest file whose header was never written (crash right after a
        // rollover), and a damaged header in the middle (negative count): those files
        // and the later ones are dropped and rebuilt.
        let files = index_files(&root);
        write_at(files.last().unwrap(), 0, &[0u8; 40]);
        mark_unclean(&root);
        let store = Store::open(tiny(&root)).await.unwrap();
        assert_eq!(assert_log_fully_indexed(&store, &root).await, 1800);
        store.shutdown().await.unwrap();
        let files = index_files(&root);
        write_at(&files[files.len() / 2], 36, &(-5i32).to_be_bytes());
        let store = Store::open(tiny(&root)).await.unwrap();
        assert_eq!(assert_log_fully_indexed(&store, &root).await, 1800);
        store.shutdown().await.unwrap();
        assert!(index_files(&root).len() >= files.len() - 1);
    });
}

/// Opens the store once a dropped instance's background tasks have finished and
/// released the directory lock (a dropped store lets them write out what they hold).
async fn open_after_drop(root: &Path) -> Store {
    let started = std::time::Instant::now();
    loop {
        match Store::open(tiny(root)).await {
            Ok(s) => return s,
            Err(Error::Locked(_)) if started.elapsed() < Duration::from_secs(20) => {
                glommio::timer::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("reopen failed: {e}"),
        }
    }
}

#[test]
fn dropped_store_mid_indexing_recovers_every_key() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    run(move || async move {
        let mut total = 0;
        for round in 0..4u64 {
            let store = open_after_drop(&root).await;
            if round > 0 {
                assert!(!store.report.clean_shutdown);
                assert_eq!(
                    assert_log_fully_indexed(&store, &root).await,
                    total as usize
                );
            }
            // Some flushes happen (periodic, evictions, rollovers), then more puts
            // that only live in memory when the store is dropped.
            put_keyed(&store, round * 1000, 400).await;
            glommio::timer::sleep(Duration::from_millis(1200)).await;
            put_keyed(&store, round * 1000 + 400, 150 + round * 50).await;
            store.flush().await.unwrap();
            store.wait_dispatched().await;
            total += 550 + round * 50;
            drop(store);
            assert!(root.join("abort").exists());
        }
        let store = open_after_drop(&root).await;
        assert_eq!(
            assert_log_fully_indexed(&store, &root).await,
            total as usize
        );
        store.shutdown().await.unwrap();
    });
}

#[test]
fn index_slots_pointing_past_the_count_are_repaired() {
    // Forge what a crash between a flush's slot pages and its header page leaves:
    // slots and entries on disk beyond the header's count.
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let r2 = root.clone();
    run(move || async move {
        let store = Store::open(tiny(&r2)).await.unwrap();
        put_keyed(&store, 0, 200).await;
        store.shutdown().await.unwrap();
    });
    let last = index_files(&root).pop().unwrap();
    let bytes = std::fs::read(&last).unwrap();
    let h = index_file::IndexHeader::decode(&bytes).unwrap();
    assert!(h.index_count > 50);
    // Roll the header back by 40 entries (as if its page was not written).
    let entry = |i: i32| {
        let geo = index_file::Geometry {
            slots: 3001,
            entries: 700,
        };
        let p = geo.entry_pos(i as u32) as usize;
        index_file::IndexEntry::decode(&bytes[p..p + 20]).unwrap()
    };
    let back = h.index_count - 40;
    let forged = index_file::IndexHeader {
        index_count: back,
        // What a flush writes: the records before the last counted entry's are done.
        end_phy_offset: entry(back - 1).phy_offset - 1,
        ..h
    };
    write_at(&last, 0, &forged.encode());
    mark_unclean(&root);
    run(move || async move {
        let store = Store::open(tiny(&root)).await.unwrap();
        assert_eq!(assert_log_fully_indexed(&store, &root).await, 200);
        store.shutdown().await.unwrap();
    });
}

#[test]
fn keys_spread_over_shards() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = ShardedConfig::new(dir.path());
    cfg.shards = 4;
    cfg.pin = false;
    cfg.store = StoreConfig::small_for_tests(dir.path());
    cfg.store.query_max = 500;
    let store = ShardedStore::open(cfg).unwrap();
    let h = store.handle();
    let mut shared = Vec::new();
    let mut shards_used = BTreeSet::new();
    for i in 0..240u64 {
        let q = (i % 16) as i32;
        let m = keyed("Spread", q, i, &format!("shared one{i}"));
        let r = block_on(h.put(m));
        assert_eq!(r.status, PutStatus::PutOk);
        shared.push((r.store_timestamp_ms, r.log_offset));
        shards_used.insert(h.shard_of("Spread", q));
    }
    assert!(shards_used.len() >= 3, "{shards_used:?}");
    block_on(h.wait_dispatched()).unwrap();
    shared.sort();
    shared.reverse();
    let want: Vec<u64> = shared.iter().map(|(_, o)| *o).collect();
    let got = block_on(h.query_by_key("Spread", "shared", 1000, ALL.0, ALL.1)).unwrap();
    assert_eq!(offsets(&got), want, "all shards merged, newest first");
    let got = block_on(h.query_by_key("Spread", "shared", 10, ALL.0, ALL.1)).unwrap();
    assert_eq!(offsets(&got), want[..10]);
    for i in (0..240u64).step_by(17) {
        let got = block_on(h.query_by_key("Spread", &format!("one{i}"), 5, ALL.0, ALL.1)).unwrap();
        assert_eq!(got.len(), 1, "one{i}");
        assert_eq!(
            got[0].property(properties::KEYS).unwrap(),
            format!("shared one{i}")
        );
    }
    assert!(
        block_on(h.query_by_key("Spread", "shared", 0, ALL.0, ALL.1))
            .unwrap()
            .is_empty()
    );
    assert!(matches!(
        block_on(h.query_by_key("Spread", "", 5, ALL.0, ALL.1)),
        Err(Error::BadRequest(_))
    ));
    assert!(matches!(
        block_on(h.query_by_key("Spread", "x", 5, 2, 1)),
        Err(Error::BadRequest(_))
    ));
    store.shutdown().unwrap();

    // Offline: `coremq inspect key` over the shard directories.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_coremq"))
        .args(["inspect", "key"])
        .arg(dir.path())
        .args([
            "--topic",
            "Spread",
            "--key",
            "shared",
            "--index-slots",
            "1024",
            "--index-entries",
            "4000",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 240);
    let got: BTreeSet<u64> = lines
        .iter()
        .map(|v| v["offset"].as_u64().unwrap())
        .collect();
    assert_eq!(got, want.iter().copied().collect());
    assert!(
        lines
            .iter()
            .all(|v| v["shard"].is_u64() && v["index_file"].is_string())
    );
    // A time range, and a key nobody has (exit 1).
    let t = shared[100].0;
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_coremq"))
        .args(["inspect", "key"])
        .arg(dir.path())
        .args([
            "--topic",
            "Spread",
            "--key",
            "shared",
            "--begin",
            &t.to_string(),
            "--end",
            &t.to_string(),
        ])
        .args(["--index-slots", "1024", "--index-entries", "4000"])
        .output()
        .unwrap();
    let n = String::from_utf8(out.stdout).unwrap().lines().count();
    assert_eq!(n, shared.iter().filter(|(ts, _)| *ts == t).count());
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_coremq"))
        .args(["inspect", "key"])
        .arg(dir.path())
        .args([
            "--topic",
            "Spread",
            "--key",
            "absent",
            "--index-slots",
            "1024",
            "--index-entries",
            "4000",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn disabled_index_answers_bad_request() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    run(move || async move {
        let mut cfg = StoreConfig::small_for_tests(&root);
        cfg.index_enable = false;
        let store = Store::open(cfg).await.unwrap();
        store.put(keyed("T", 0, 0, "k")).await;
        store.wait_dispatched().await;
        assert!(matches!(
            store.query_by_key("T", "k", 5, ALL.0, ALL.1).await,
            Err(Error::BadRequest(_))
        ));
        store.shutdown().await.unwrap();
        assert!(index_files(&root).is_empty());
    });
    let mut cfg = StoreConfig::small_for_tests("/nonexistent");
    cfg.index_max_entries = 1;
    assert!(cfg.validate().is_err());
    cfg.index_max_entries = 2;
    cfg.index_hash_slots = 0;
    assert!(cfg.validate().is_err());
    cfg.index_hash_slots = 1;
    cfg.index_max_dirty_bytes = 4096;
    assert!(cfg.validate().is_err());
}

// ---------------------------------------------------------------------------------
// kill -9 in the middle of indexing.

const CHILD_ENV: &str = "COREMQ_INDEX_CHILD";
const MODE_ENV: &str = "COREMQ_INDEX_MODE";
const READY_ENV: &str = "COREMQ_INDEX_READY";

fn kill_config(root: &Path, mode: FlushMode) -> StoreConfig {
    let mut cfg = tiny(root);
    // Fewer, larger files than `tiny` (queries read every file's slot); the page set
    // stays at its 16-page minimum, so evictions still happen.
    cfg.index_max_entries = 5000;
    cfg.flush_mode = mode;
    cfg
}

/// The child: puts keyed messages from several tasks until killed.
#[test]
fn index_crash_child() {
    let Some(root) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    let root = PathBuf::from(root);
    let ready = PathBuf::from(std::env::var_os(READY_ENV).unwrap());
    let mode = match std::env::var(MODE_ENV).as_deref() {
        Ok("sync") => FlushMode::Sync,
        _ => FlushMode::Async,
    };
    run(move || async move {
        let store = Store::open(kill_config(&root, mode))
            .await
            .expect("child open");
        std::fs::write(&ready, b"ready").unwrap();
        let base = store.max_log_offset();
        let mut tasks = Vec::new();
        for w in 0..4u64 {
            let store = store.clone();
            tasks.push(glommio::spawn_local(async move {
                let mut i = 0u64;
                loop {
                    let n = base.wrapping_add(w << 40).wrapping_add(i);
                    let mut m = keyed(&format!("C{w}"), (i % 2) as i32, i, &format!("k{n} w{w}"));
                    if i.is_multiple_of(3) {
                        m = m.with_property(properties::UNIQ_KEY, format!("U{n}"));
                    }
                    store.put(m).await;
                    i += 1;
                    glommio::timer::sleep(Duration::from_millis(2)).await;
                }
            }));
        }
        glommio::timer::sleep(Duration::from_secs(60)).await;
        std::process::exit(3);
    });
}

#[test]
fn kill_during_indexing_then_every_key_is_found() {
    let seed = seed_from_env("COREMQ_INDEX_SEED");
    let mut rng = Rng::new(seed);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    for (cycle, mode) in [FlushMode::Async, FlushMode::Sync, FlushMode::Async]
        .into_iter()
        .enumerate()
    {
        let ready = dir.path().join(format!("ready{cycle}"));
        let log = dir.path().join(format!("child{cycle}.log"));
        let mode_s = if mode == FlushMode::Sync {
            "sync"
        } else {
            "async"
        };
        let mut child = spawn_self(
            "index_crash_child",
            &[
                (CHILD_ENV, OsString::from(&root)),
                (READY_ENV, OsString::from(&ready)),
                (MODE_ENV, OsString::from(mode_s)),
            ],
            &log,
        );
        let started = std::time::Instant::now();
        while !ready.exists() {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "child never ready: {}",
                log_tail(&log, 4000)
            );
            if let Some(st) = child.try_wait().unwrap() {
                panic!("child exited early ({st}): {}", log_tail(&log, 4000));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        std::thread::sleep(Duration::from_millis(rng.range(300, 1500)));
        child.kill().unwrap();
        child.wait().unwrap();
        let r = root.clone();
        let n = common_run_ret(move || async move {
            let store = Store::open(kill_config(&r, mode))
                .await
                .expect("reopen after kill");
            assert!(!store.report.clean_shutdown);
            let n = assert_log_fully_indexed(&store, &r).await;
            // Crash again without a clean stop half the time: drop the store and let
            // its tasks wind down. (Ending the executor at once would leak the store,
            // root lock included, for the life of this process: glommio keeps a task
            // whose I/O is in flight when its executor ends. README, "One shard, on your own glommio executor".)
            if cycle % 2 == 0 {
                store.shutdown().await.unwrap();
            } else {
                drop(store);
                glommio::timer::sleep(Duration::from_millis(300)).await;
            }
            n
        });
        eprintln!("cycle {cycle} ({mode_s}): {n} records, all found by every key");
        assert!(n > 0);
        if cycle % 2 == 1 {
            mark_unclean(&root);
        }
    }
}

fn common_run_ret<T: Send + 'static, F, Fut>(f: F) -> T
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = T> + 'static,
{
    run_ret(f)
}

/// Query latency with RocketMQ's default geometry (5,000,000 slots, 20,000,000
/// entries per file) and `n` messages with unique keys. Run with
/// `cargo test --release --test index -- --ignored --nocapture query_latency`
/// (`COREMQ_INDEX_BENCH_N` sets n, default 200,000).
#[test]
#[ignore]
fn query_latency() {
    let n: u64 = std::env::var("COREMQ_INDEX_BENCH_N")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200_000);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    run(move || async move {
        // Puts n keyed messages (256 puts outstanding) and waits until all are
        // dispatched (and indexed); returns the seconds taken.
        async fn load(store: &Store, n: u64) -> f64 {
            let started = std::time::Instant::now();
            let mut window = std::collections::VecDeque::new();
            for i in 0..n {
                let s = store.clone();
                let m = Message::new("Bench", (i % 8) as i32, vec![b'x'; 256])
                    .with_keys(format!("key-{i} g{}", i % 1000));
                window.push_back(glommio::spawn_local(async move { s.put(m).await.status }));
                if window.len() >= 256 {
                    assert!(window.pop_front().unwrap().await.is_stored());
                }
            }
            for t in window {
                assert!(t.await.is_stored());
            }
            store.wait_dispatched().await;
            started.elapsed().as_secs_f64()
        }
        let mut off = StoreConfig::new(root.join("no-index"));
        off.index_enable = false;
        let store = Store::open(off).await.unwrap();
        let no_index_s = load(&store, n).await;
        store.shutdown().await.unwrap();
        let root = root.join("index");
        let store = Store::open(StoreConfig::new(&root)).await.unwrap();
        let put_s = load(&store, n).await;
        eprintln!(
            "put+dispatch: {:.0}/s without the index, {:.0}/s with it",
            n as f64 / no_index_s,
            n as f64 / put_s
        );
        // A clean restart, so queries read the index from disk, not from memory.
        store.shutdown().await.unwrap();
        let store = Store::open(StoreConfig::new(&root)).await.unwrap();
        let mut rng = Rng::new(42);
        let mut lat = Vec::new();
        for _ in 0..5000 {
            let i = rng.range(0, n - 1);
            let t = std::time::Instant::now();
            let got = store
                .query_by_key("Bench", &format!("key-{i}"), 32, 0, i64::MAX)
                .await
                .unwrap();
            lat.push(t.elapsed().as_micros() as u64);
            assert_eq!(got.len(), 1);
        }
        lat.sort_unstable();
        let p = |q: f64| lat[((lat.len() as f64 - 1.0) * q) as usize];
        let mut lat64 = Vec::new();
        for _ in 0..500 {
            let g = rng.range(0, 999);
            let t = std::time::Instant::now();
            let got = store
                .query_by_key("Bench", &format!("g{g}"), 64, 0, i64::MAX)
                .await
                .unwrap();
            lat64.push(t.elapsed().as_micros() as u64);
            assert_eq!(got.len() as u64, (n / 1000).min(64));
        }
        lat64.sort_unstable();
        let p64 = |q: f64| lat64[((lat64.len() as f64 - 1.0) * q) as usize];
        eprintln!(
            "{n} messages ({:.0}/s put+index); unique-key query p50 {} us p99 {} us max {} us; \
             64-hit query p50 {} us p99 {} us",
            n as f64 / put_s,
            p(0.5),
            p(0.99),
            lat.last().unwrap(),
            p64(0.5),
            p64(0.99)
        );
        store.shutdown().await.unwrap();
    });
}

/// A clean restart re-dispatches nothing: the index's resume point is a record
/// boundary. (It used to be one byte past the last record's start, so every reopen
/// failed to dispatch there and rebuilt every queue from the whole log.)
#[test]
fn clean_restart_rebuilds_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    run(move || async move {
        for round in 0..3u64 {
            let store = Store::open(tiny(&root)).await.unwrap();
            if round > 0 {
                let rep = &store.report;
                assert_eq!(rep.entries_rebuilt, 0, "round {round}: {rep:?}");
                assert_eq!(rep.dispatched_from, rep.log_end, "round {round}: {rep:?}");
            }
            for i in 0..500 {
                let keys = if i % 7 == 0 {
                    String::new()
                } else {
                    format!("r{round}-{i}")
                };
                let r = store.put(keyed("Resume", (i % 3) as i32, i, &keys)).await;
                assert_eq!(r.status, coremq::PutStatus::PutOk);
            }
            store.shutdown().await.unwrap();
        }
        let store = Store::open(tiny(&root)).await.unwrap();
        for round in 0..3 {
            let hits = store
                .query_by_key("Resume", &format!("r{round}-499"), 10, ALL.0, ALL.1)
                .await
                .unwrap();
            assert_eq!(hits.len(), 1, "round {round}");
        }
        store.shutdown().await.unwrap();
    });
}

/// The read cache (`index_cache_bytes`) never changes an answer: with no cache, a
/// one-page cache (evicting on every read), a few pages and the default, every key of
/// the log is found, across rollovers, reopens (the cache is filled at open, the tail
/// page then takes new entries) and more puts evicting cached pages.
#[test]
fn read_cache_of_any_size_answers_like_the_disk() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    run(move || async move {
        let sizes = [0usize, 4096, 5 * 4096, 128 << 20];
        let cfg = |cache: usize| {
            let mut c = tiny(&root);
            c.index_cache_bytes = cache;
            c
        };
        let mut from = 0;
        for (round, &cache) in sizes.iter().chain(sizes.iter().rev()).enumerate() {
            let store = Store::open(cfg(cache)).await.unwrap();
            // Answers right after open (from the cache filled at open, or the disk).
            if round > 0 {
                assert_log_fully_indexed(&store, &root).await;
            }
            put_keyed(&store, from, 350).await;
            from += 350;
            store.wait_dispatched().await;
            assert_log_fully_indexed(&store, &root).await;
            // Twice: the second pass is answered from what the first one cached.
            assert_log_fully_indexed(&store, &root).await;
            store.shutdown().await.unwrap();
        }
        assert!(index_files(&root).len() >= 8, "{:?}", index_files(&root));
    });
}

/// Unclean stops with every cache size: the repaired file (slots walked back, entries
/// cut and then overwritten by new keys) answers like the log, whether its pages come
/// from the cache filled at open or from the disk.
#[test]
fn read_cache_after_unclean_stops() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    run(move || async move {
        let mut from = 0;
        for (round, cache) in [0usize, 4096, 128 << 20, 8192].into_iter().enumerate() {
            let mut cfg = tiny(&root);
            cfg.index_cache_bytes = cache;
            let store = if round == 0 {
                Store::open(cfg).await.unwrap()
            } else {
                open_after_drop_with(cfg).await
            };
            assert_log_fully_indexed(&store, &root).await;
            put_keyed(&store, from, 300).await;
            from += 300;
            store.wait_dispatched().await;
            assert_log_fully_indexed(&store, &root).await;
            drop(store);
        }
        let store = open_after_drop_with(tiny(&root)).await;
        assert_log_fully_indexed(&store, &root).await;
        store.shutdown().await.unwrap();
    });
}

async fn open_after_drop_with(cfg: StoreConfig) -> Store {
    for _ in 0..500 {
        match Store::open(cfg.clone()).await {
            Ok(s) => return s,
            Err(Error::Locked(_)) => glommio::timer::sleep(Duration::from_millis(10)).await,
            Err(e) => panic!("open: {e}"),
        }
    }
    panic!("the dropped store never released its lock");
}

/// A flush writes an index file's last page whole (direct I/O) and then cuts the file
/// back to its exact size; a stop between the two leaves up to a page of padding past
/// the end. The next open cuts it and answers every key (it used to refuse the store
/// with `BadLayout`, found by `kill_during_indexing_then_every_key_is_found`).
#[test]
fn last_page_padding_left_by_an_interrupted_flush_is_cut_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    run(move || async move {
        let cfg = tiny(&root);
        let store = Store::open(cfg.clone()).await.unwrap();
        put_keyed(&store, 0, 300).await;
        store.shutdown().await.unwrap();
        let files = index_files(&root);
        assert!(!files.is_empty());
        let exact = std::fs::metadata(&files[0]).unwrap().len();
        let padded = exact.div_ceil(4096) * 4096;
        assert!(padded > exact, "the test needs a file that ends mid-page");
        for f in &files {
            std::fs::OpenOptions::new()
                .write(true)
                .open(f)
                .unwrap()
                .set_len(padded)
                .unwrap();
        }
        let store = Store::open(cfg)
            .await
            .expect("open with padded index files");
        for f in &files {
            assert_eq!(
                std::fs::metadata(f).unwrap().len(),
                exact,
                "{}",
                f.display()
            );
        }
        assert!(assert_log_fully_indexed(&store, &root).await > 0);
        store.shutdown().await.unwrap();
    });
}

/// A checkpoint round flushes the key index only once enough of its pages changed
/// (`index_flush_least_pages`) or its thorough interval passed; `Store::checkpoint`
/// flushes it whatever it holds. Keys spread over a new file's slot table are written
/// in a few runs, not a write per page (the new file's slot pages are all in the page
/// set, so a run takes the clean pages between dirty ones).
#[test]
fn index_flushes_when_due() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    run(move || async move {
        let mut cfg = StoreConfig::small_for_tests(&root);
        cfg.index_hash_slots = 64 * 1024; // 256 KiB of slots: 64 pages
        cfg.index_max_entries = 100_000;
        cfg.index_max_dirty_bytes = 1 << 20; // 256 pages: the slot table stays
        cfg.index_flush_least_pages = 48;
        cfg.index_flush_thorough_interval = Duration::from_secs(3600);
        cfg.consume_queue_flush_interval = Duration::from_millis(20);
        let put = |store: Store, from: u64, n: u64| async move {
            for i in from..from + n {
                let r = store.put(keyed("Due", 0, i, &spread_key(i))).await;
                assert!(r.status.is_stored(), "{:?}", r.status);
            }
            store.wait_dispatched().await;
        };
        // Waits (at most 10 s) until the rounds have flushed the index `n` times.
        let flushed = |store: Store, n: u64| async move {
            let t0 = std::time::Instant::now();
            while store.stats().index_flushes < n {
                assert!(
                    t0.elapsed() < Duration::from_secs(10),
                    "{:?}",
                    store.stats()
                );
                glommio::timer::sleep(Duration::from_millis(20)).await;
            }
        };
        let store = Store::open(cfg.clone()).await.unwrap();
        // 40 keys change fewer than 48 pages: ~15 rounds leave the index alone.
        put(store.clone(), 0, 40).await;
        glommio::timer::sleep(Duration::from_millis(300)).await;
        assert_eq!(store.stats().index_flushes, 0, "{:?}", store.stats());
        store.checkpoint().await.unwrap();
        let s = store.stats();
        assert_eq!(s.index_flushes, 1, "{s:?}");
        // Page 0, the slot runs, the page where the slots end: a handful, where a
        // write per changed page would be ~30.
        assert!(s.index_flush_writes <= 8, "{s:?}");
        // Enough keys to change every slot page: a round flushes without being asked.
        put(store.clone(), 40, 1000).await;
        flushed(store.clone(), 2).await;
        store.shutdown().await.unwrap();

        // Few changes but a short thorough interval: flushed by the rounds too.
        cfg.index_flush_thorough_interval = Duration::from_millis(200);
        let store = Store::open(cfg.clone()).await.unwrap();
        assert_eq!(store.stats().index_flushes, 0);
        put(store.clone(), 1040, 1).await;
        flushed(store.clone(), 1).await;
        let hits = store
            .query_by_key("Due", &spread_key(1040), 10, ALL.0, ALL.1)
            .await
            .unwrap();
        assert_eq!(hits.len(), 1);
        store.shutdown().await.unwrap();
    });
}

/// A key whose every character varies with `i`: RocketMQ's key hash (Java's
/// `String.hashCode`) puts keys that differ only in their last characters, such as
/// `k1`, `k2`, in neighbouring slots.
fn spread_key(i: u64) -> String {
    format!("{:016x}", (i + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15))
}
