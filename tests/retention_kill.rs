//! Retention and kill -9 (issue 19): a writer child puts sync messages while its
//! cleaner deletes segments, queue files and index files as fast as it can (everything
//! is expired at once, passes every few milliseconds) and it deletes and re-creates a
//! topic now and then; the parent kills it at a random moment, over and over, on one
//! store, and after every kill reopens it and checks:
//! * it opens (a kill in the middle of a deletion leaves nothing it refuses);
//! * every acknowledged message at or past the log's minimum is present and
//!   identical, by queue (each queue readable from its minimum to its end without an
//!   error), by id and by key; nothing below the minimum is found;
//! * a topic whose deletion was acknowledged holds none of the messages sent before it;
//! * `inspect check` is clean after a shutdown (with the `tools` feature).
//!
//! `COREMQ_RET_CYCLES` (default 6), `COREMQ_RET_SEED` (printed; replays within timing).

#[path = "common/child.rs"]
mod child;

use child::*;
use coremq::{FlushMode, GetStatus, Message, PutStatus, Store, StoreConfig, StoredMessage};
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

const CHILD_ENV: &str = "COREMQ_RET_CHILD";
const ACKS_ENV: &str = "COREMQ_RET_ACKS";
const START_ENV: &str = "COREMQ_RET_START";

fn cfg(root: &Path) -> StoreConfig {
    let mut c = StoreConfig::small_for_tests(root);
    c.flush_mode = FlushMode::Sync;
    c.consume_queue_flush_interval = Duration::from_millis(20);
    c.index_max_entries = 400;
    c.retention.file_reserved_time = Duration::ZERO;
    c.retention.delete_when =
        "00;01;02;03;04;05;06;07;08;09;10;11;12;13;14;15;16;17;18;19;20;21;22;23".into();
    c.retention.clean_interval = Duration::from_millis(5);
    c.retention.delete_interval = Duration::ZERO;
    c.retention.delete_file_batch_max = 2;
    // The host disk's level must not matter.
    c.disk_full_ratio = 1.0;
    c.retention.disk_max_used_space_ratio = 1.0;
    c.retention.disk_clean_forcibly_ratio = 1.0;
    c
}

/// The reopened store that is checked: its cleaner must not move the minimum while
/// the check reads (the config is otherwise the writer's).
fn verify_cfg(root: &Path) -> StoreConfig {
    let mut c = cfg(root);
    c.retention.file_reserved_time = Duration::from_secs(1 << 30);
    c.retention.clean_interval = Duration::from_secs(3600);
    c
}

fn message(topic: &str, n: u64) -> Message {
    let mut body = vec![(n % 251) as u8; 900 + (n as usize * 131) % 2000];
    body[..8].copy_from_slice(&n.to_be_bytes());
    Message::new(topic, (n % 3) as i32, body).with_keys(format!("k{n}"))
}

/// The child: puts until killed; one ack line per acknowledged put (`P topic n
/// offset id`), per topic deletion started (`d topic n`) and acknowledged (`D topic n`: messages of `topic`
/// numbered below `n` are gone).
#[test]
fn retention_kill_child() {
    let Some(root) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    let root = PathBuf::from(root);
    let acks = std::env::var(ACKS_ENV).unwrap();
    let start: u64 = std::env::var(START_ENV).unwrap().parse().unwrap();
    run_ret(move || async move {
        let store = Store::open(cfg(&root)).await.unwrap();
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&acks)
            .unwrap();
        let mut n = start;
        loop {
            let topic = if n.is_multiple_of(4) { "Tmp" } else { "Main" };
            let r = store.put(message(topic, n)).await;
            if r.status == PutStatus::PutOk {
                let line = format!("P {topic} {n} {} {}\n", r.log_offset, r.msg_ids[0]);
                log.write_all(line.as_bytes()).unwrap();
            }
            n += 1;
            if n.is_multiple_of(400) {
                // The intent first: a kill between the deletion and its ack line
                // leaves the older Tmp messages either way.
                log.write_all(format!("d Tmp {n}\n").as_bytes()).unwrap();
                store.delete_topic("Tmp").await.unwrap();
                log.write_all(format!("D Tmp {n}\n").as_bytes()).unwrap();
            }
        }
    });
}

struct Acked {
    /// topic -> n -> (offset, id)
    puts: BTreeMap<String, BTreeMap<u64, (u64, String)>>,
    /// The highest acknowledged deletion of Tmp: messages below it are gone.
    tmp_deleted_below: u64,
    /// The highest deletion of Tmp started: messages below it (and not below
    /// `tmp_deleted_below`) may be gone or not.
    tmp_maybe_below: u64,
    next: u64,
}

fn read_acks(path: &Path, acked: &mut Acked) {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    for line in text.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        match f.as_slice() {
            ["P", t, n, off, id] => {
                let n: u64 = n.parse().unwrap();
                acked.next = acked.next.max(n + 1);
                acked
                    .puts
                    .entry(t.to_string())
                    .or_default()
                    .insert(n, (off.parse().unwrap(), id.to_string()));
            }
            ["D", _, n] => {
                acked.tmp_deleted_below = acked.tmp_deleted_below.max(n.parse().unwrap())
            }
            ["d", _, n] => acked.tmp_maybe_below = acked.tmp_maybe_below.max(n.parse().unwrap()),
            _ => {} // A line cut by the kill.
        }
    }
}

async fn read_queue(store: &Store, topic: &str, q: i32) -> Vec<StoredMessage> {
    let mut out = Vec::new();
    let mut off = store.min_queue_offset(topic, q);
    loop {
        let r = store.get(topic, q, off, 32, 1 << 20).await.expect("get");
        match r.status {
            GetStatus::Found => {
                out.extend(
                    r.records
                        .iter()
                        .map(|raw| StoredMessage::decode(raw).unwrap()),
                );
                off = r.next_begin_offset;
            }
            GetStatus::OffsetOverflowOne
            | GetStatus::NoMessageInQueue
            | GetStatus::NoMatchedLogicQueue => return out,
            s => panic!("{topic}/{q}: {s:?} at {off}"),
        }
    }
}

async fn verify(store: &Store, acked: &Acked, ctx: &str) -> usize {
    let min = store.min_log_offset();
    let mut checked = 0;
    for (topic, puts) in &acked.puts {
        let gone = |n: u64| topic == "Tmp" && n < acked.tmp_deleted_below;
        let unsure = |n: u64| topic == "Tmp" && !gone(n) && n < acked.tmp_maybe_below;
        let mut have: BTreeMap<u64, StoredMessage> = BTreeMap::new();
        for q in 0..3 {
            for m in read_queue(store, topic, q).await {
                let n = u64::from_be_bytes(m.body[..8].try_into().unwrap());
                assert_eq!(m.body, message(topic, n).body, "{ctx}: {topic} {n} differs");
                assert!(
                    !gone(n),
                    "{ctx}: {topic} {n} came back after its topic was deleted"
                );
                have.insert(n, m);
            }
        }
        for (n, (off, id)) in puts {
            if unsure(*n) {
                continue;
            }
            let should = *off >= min && !gone(*n);
            if should {
                assert!(
                    have.contains_key(n),
                    "{ctx}: acknowledged {topic} {n} at {off} missing (min {min})"
                );
                checked += 1;
            }
            if n % 13 == 0 {
                let by_id = store.look_by_msg_id(id).await.unwrap();
                assert_eq!(by_id.is_some(), *off >= min, "{ctx}: {topic} {n} by id");
                let hits = store
                    .query_by_key(topic, &format!("k{n}"), 4, 0, i64::MAX)
                    .await
                    .unwrap();
                assert_eq!(hits.len(), should as usize, "{ctx}: {topic} {n} by key");
            }
        }
    }
    checked
}

#[test]
fn kill_during_retention_reopens_and_keeps_what_the_rules_keep() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return;
    }
    let cycles: usize = std::env::var("COREMQ_RET_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6);
    let seed = seed_from_env("COREMQ_RET_SEED");
    let mut rng = Rng::new(seed);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    let acks = dir.path().join("acks");
    let mut acked = Acked {
        puts: BTreeMap::new(),
        tmp_deleted_below: 0,
        tmp_maybe_below: 0,
        next: 0,
    };
    let mut total_checked = 0;
    let mut last_min = 0;
    for cycle in 0..cycles {
        let log = dir.path().join(format!("child-{cycle}.log"));
        let envs = [
            (CHILD_ENV, OsString::from(&root)),
            (ACKS_ENV, OsString::from(&acks)),
            // Numbers never repeat across children.
            (START_ENV, OsString::from((acked.next + 1000).to_string())),
        ];
        let acked_lines_before = std::fs::read_to_string(&acks)
            .unwrap_or_default()
            .lines()
            .count();
        let mut child = spawn_self("retention_kill_child", &envs, &log);
        std::thread::sleep(Duration::from_millis(rng.range(300, 1500)));
        if cycle + 1 == cycles {
            // The last child runs until it wrote a few segments (retention must have
            // had something to delete by the end, however loaded the machine is).
            let t0 = std::time::Instant::now();
            while t0.elapsed() < Duration::from_secs(60) {
                let lines = std::fs::read_to_string(&acks).unwrap_or_default();
                if lines.lines().count() >= acked_lines_before + 2000 {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("child exited early ({status}): {}", log_tail(&log, 3000));
        }
        child.kill().unwrap();
        child.wait().unwrap();
        read_acks(&acks, &mut acked);
        let ctx = format!("cycle {cycle} seed {seed}");
        let root2 = root.clone();
        let snapshot = Acked {
            puts: acked.puts.clone(),
            tmp_deleted_below: acked.tmp_deleted_below,
            tmp_maybe_below: acked.tmp_maybe_below,
            next: acked.next,
        };
        let (checked, min) = run_ret(move || async move {
            let store = Store::open(verify_cfg(&root2))
                .await
                .unwrap_or_else(|e| panic!("{ctx}: reopen failed: {e}"));
            let checked = verify(&store, &snapshot, &ctx).await;
            let min = store.min_log_offset();
            store.shutdown().await.unwrap();
            (checked, min)
        });
        total_checked += checked;
        #[cfg(feature = "tools")]
        {
            let rep = coremq::tools::inspect::check(&root).unwrap();
            assert!(
                rep.is_clean(),
                "cycle {cycle}: inspect check: {:?}",
                rep.problems
            );
        }
        eprintln!(
            "cycle {cycle}: {} acked so far, {checked} present and checked, log min {min}",
            acked.puts.values().map(|m| m.len()).sum::<usize>()
        );
        last_min = min;
    }
    assert!(total_checked > 0);
    // How far a child gets before its kill depends on the machine's load: the
    // deletion is required by the end, not by any one cycle.
    assert!(last_min > 0, "retention deleted nothing in {cycles} cycles");
}
