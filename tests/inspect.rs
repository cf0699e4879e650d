//! `coremq inspect` against real stores: a clean store reads back exactly as it was
//! written and checks clean; damaged records, entries and tails are reported; the
//! binary's exit codes follow the checks; `coremq run` verifies and leaves a clean store.
mod common;
use common::*;
use coremq::format::checkpoint::Checkpoint;
use coremq::format::java::tags_code;
use coremq::tools::inspect::{self, CheckReport};
use coremq::{PutStatus, Store, StoreConfig};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};

const QUEUES: [(&str, i32); 5] = [
    ("TopicA", 0),
    ("TopicA", 1),
    ("TopicB", 0),
    ("TopicB", 1),
    ("TopicB", 2),
];
const PER_QUEUE: u64 = 150;
const SEGMENT: u64 = 1 << 20;

/// What a put returned, to compare with what inspect reads.
#[derive(Debug, Clone)]
struct Put {
    topic: String,
    q: i32,
    i: u64,
    log_offset: u64,
    size: u32,
    queue_offset: u64,
    msg_id: String,
}

/// Puts `PER_QUEUE` messages into each of `QUEUES` (round robin), shuts down cleanly,
/// and returns the puts in log order.
fn populate(root: &Path, per_queue: u64) -> Vec<Put> {
    let root = root.to_path_buf();
    let puts = Arc::new(Mutex::new(Vec::new()));
    let out = puts.clone();
    run(move || async move {
        let store = Store::open(StoreConfig::small_for_tests(&root))
            .await
            .unwrap();
        for i in 0..per_queue {
            for (t, q) in QUEUES {
                let r = store.put(msg(t, q, i)).await;
                assert_eq!(r.status, PutStatus::PutOk);
                let p = Put {
                    topic: t.to_string(),
                    q,
                    i,
                    log_offset: r.log_offset,
                    size: r.wrote_bytes,
                    queue_offset: r.queue_offset,
                    msg_id: r.msg_ids[0].to_string(),
                };
                out.lock().unwrap().push(p);
            }
        }
        store.wait_dispatched().await;
        store.shutdown().await.unwrap();
    });
    let mut puts = puts.lock().unwrap().clone();
    puts.sort_by_key(|p| p.log_offset);
    puts
}

fn coremq(args: &[&str], dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_coremq"))
        .args(args)
        .arg(dir)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run coremq")
}

fn json_lines(out: &Output) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad JSON line {l:?}: {e}")))
        .collect()
}

fn segment_path(root: &Path, offset: u64) -> PathBuf {
    root.join("commitlog")
        .join(format!("{:020}", offset / SEGMENT * SEGMENT))
}

fn flip_byte(path: &Path, pos: u64) {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, pos).unwrap();
    b[0] ^= 0x40;
    f.write_all_at(&b, pos).unwrap();
}

fn has_problem(rep: &CheckReport, parts: &[&str]) -> bool {
    rep.problems
        .iter()
        .any(|p| parts.iter().all(|s| p.contains(s)))
}

#[test]
fn clean_store_reads_back_and_checks_clean() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let puts = populate(root, PER_QUEUE);
    let total = puts.len() as u64;
    let segments = std::fs::read_dir(root.join("commitlog")).unwrap().count();
    assert!(
        segments >= 2,
        "the log should roll over a blank into a second segment"
    );

    let (records, walk) = inspect::records(root).unwrap();
    assert!(walk.problems.is_empty(), "{:?}", walk.problems);
    assert_eq!(records.len(), puts.len());
    for (r, p) in records.iter().zip(&puts) {
        assert_eq!((r.offset, r.size), (p.log_offset, p.size));
        assert_eq!(
            (r.topic.as_str(), r.queue_id, r.queue_offset),
            (p.topic.as_str(), p.q, p.queue_offset as i64)
        );
        assert_eq!(r.tags.as_deref(), Some(format!("tag{}", p.i % 3).as_str()));
        assert_eq!(
            r.keys.as_deref(),
            Some(format!("key-{} k{}", p.i, p.i % 10).as_str())
        );
        assert_eq!(r.body_size, body(&p.topic, p.q, p.i).len());
        assert_eq!(r.msg_id.as_deref(), Some(p.msg_id.as_str()));
        assert_eq!(r.checksum, "ok");
    }
    let last = puts.last().unwrap();
    assert_eq!(walk.log_end, last.log_offset + last.size as u64);

    for (t, q) in QUEUES {
        let (entries, w) = inspect::queue_entries(root, t, q).unwrap();
        assert_eq!(
            (w.first, w.end, w.entries, w.pre_blank),
            (Some(0), PER_QUEUE, PER_QUEUE, 0)
        );
        assert_eq!(
            w.file_bytes,
            Some(StoreConfig::small_for_tests(root).consume_queue_file_bytes())
        );
        let mine: Vec<&Put> = puts.iter().filter(|p| p.topic == t && p.q == q).collect();
        assert_eq!(entries.len(), mine.len());
        for (e, p) in entries.iter().zip(mine) {
            assert_eq!(
                (e.queue_offset, e.commit_log_offset, e.size),
                (p.queue_offset, p.log_offset, p.size)
            );
            assert_eq!(e.tags_code, tags_code(Some(&format!("tag{}", p.i % 3))));
        }
    }

    let rep = inspect::check(root).unwrap();
    assert!(rep.is_clean(), "{:?}", rep.problems);
    assert_eq!(
        (rep.records, rep.entries, rep.queues),
        (total, total, QUEUES.len() as u64)
    );
    assert_eq!((rep.log_min, rep.log_end), (0, walk.log_end));

    // The binary agrees and never writes to the directory.
    let listing = |root: &Path| {
        let mut v: Vec<_> = walkdir(root)
            .into_iter()
            .map(|p| (p.clone(), std::fs::read(&p).unwrap()))
            .collect();
        v.sort();
        v
    };
    let before = listing(root);
    let out = coremq(&["inspect", "check"], root);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary = json_lines(&out);
    assert_eq!(summary.len(), 1);
    assert_eq!(summary[0]["records"], total);
    assert_eq!(summary[0]["problems"], serde_json::json!([]));
    let out = coremq(&["inspect", "records"], root);
    assert_eq!(out.status.code(), Some(0));
    let lines = json_lines(&out);
    assert_eq!(lines.len(), puts.len());
    assert_eq!(lines[1]["offset"], puts[1].log_offset);
    assert_eq!(
        lines[1]["properties"]["TAGS"],
        format!("tag{}", puts[1].i % 3)
    );
    let out = coremq(
        &["inspect", "queue", "--topic", "TopicB", "--queue", "2"],
        root,
    );
    assert_eq!(out.status.code(), Some(0));
    let lines = json_lines(&out);
    assert_eq!(lines.len() as u64, PER_QUEUE);
    assert_eq!(lines[7]["queue_offset"], 7);
    let out = coremq(
        &["inspect", "queue", "--topic", "Nope", "--queue", "0"],
        root,
    );
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(listing(root), before, "inspect changed the store directory");
}

/// Every file under `dir`, recursively.
fn walkdir(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walkdir(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[test]
fn flipped_body_byte_is_reported_and_stops_the_walk() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let puts = populate(root, PER_QUEUE);
    let n = puts.len() / 3;
    let bad = &puts[n];
    let body_len = body(&bad.topic, bad.q, bad.i).len() as u64;
    // V1 record with IPv4 hosts: the body starts at byte 88.
    flip_byte(
        &segment_path(root, bad.log_offset),
        bad.log_offset % SEGMENT + 88 + body_len / 2,
    );

    let (records, walk) = inspect::records(root).unwrap();
    assert_eq!(records.len(), n + 1, "the walk stops at the damaged record");
    let last = records.last().unwrap();
    assert_eq!(
        (last.offset, last.checksum.as_str()),
        (bad.log_offset, "body_crc_mismatch")
    );
    assert_eq!(walk.problems.len(), 1);
    assert_eq!(walk.problems[0].offset, bad.log_offset);
    assert_eq!(walk.log_end, bad.log_offset);

    let rep = inspect::check(root).unwrap();
    assert!(!rep.is_clean());
    assert!(
        has_problem(
            &rep,
            &[&format!("commitlog offset {}", bad.log_offset), "body crc"]
        ),
        "{:?}",
        rep.problems
    );
    let entry = format!(
        "consumequeue {}/{} offset {}",
        bad.topic, bad.q, bad.queue_offset
    );
    assert!(
        has_problem(&rep, &[&entry, "body crc"]),
        "{:?}",
        rep.problems
    );
    assert_eq!(rep.log_end, bad.log_offset);

    let out = coremq(&["inspect", "check"], root);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        !json_lines(&out)[0]["problems"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    let out = coremq(&["inspect", "records"], root);
    let lines = json_lines(&out);
    assert_eq!(lines[n]["checksum"], "body_crc_mismatch");
    assert!(
        lines[n + 1]["problem"]
            .as_str()
            .unwrap()
            .contains("body crc")
    );
}

#[test]
fn corrupt_queue_entry_size_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let puts = populate(root, PER_QUEUE);
    let target = puts
        .iter()
        .find(|p| p.topic == "TopicA" && p.q == 0 && p.queue_offset == 3)
        .unwrap();
    let file = root.join("consumequeue/TopicA/0/00000000000000000000");
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&file)
        .unwrap();
    let size_at = 3 * 20 + 8;
    let mut b = [0u8; 4];
    f.read_exact_at(&mut b, size_at).unwrap();
    assert_eq!(i32::from_be_bytes(b) as u32, target.size);
    f.write_all_at(&(target.size as i32 + 1).to_be_bytes(), size_at)
        .unwrap();

    let rep = inspect::check(root).unwrap();
    let expect = format!(
        "size {} but the record is {} bytes",
        target.size + 1,
        target.size
    );
    assert!(
        has_problem(&rep, &["consumequeue TopicA/0 offset 3", &expect]),
        "{:?}",
        rep.problems
    );
    assert_eq!(rep.problems.len(), 1, "{:?}", rep.problems);
    assert_eq!(coremq(&["inspect", "check"], root).status.code(), Some(1));
}

#[test]
fn missing_tail_entries_are_allowed_only_past_the_dispatch_point() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let puts = populate(root, PER_QUEUE);
    // Erase the last 5 entries of TopicB/2, as if they were never flushed.
    let file = root.join("consumequeue/TopicB/2/00000000000000000000");
    let f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
    f.write_all_at(&[0u8; 5 * 20], (PER_QUEUE - 5) * 20)
        .unwrap();
    let rep = inspect::check(root).unwrap();
    assert!(
        has_problem(&rep, &["consumequeue TopicB/2: 5 records have no entry"]),
        "{:?}",
        rep.problems
    );

    // A checkpoint saying dispatch reached only the first of those records excuses them.
    let first_missing = puts
        .iter()
        .find(|p| p.topic == "TopicB" && p.q == 2 && p.queue_offset == PER_QUEUE - 5);
    let cp_path = root.join("checkpoint");
    let (mut cp, valid) = Checkpoint::decode(&std::fs::read(&cp_path).unwrap()).unwrap();
    assert!(valid);
    cp.dispatch_safe_offset = first_missing.unwrap().log_offset;
    std::fs::write(&cp_path, cp.encode()).unwrap();
    let rep = inspect::check(root).unwrap();
    assert!(rep.is_clean(), "{:?}", rep.problems);
    assert_eq!(rep.entries, puts.len() as u64 - 5);

    // A checkpoint beyond the end of the log is itself a problem.
    cp.log_flushed_offset = rep.log_end + 1;
    std::fs::write(&cp_path, cp.encode()).unwrap();
    let rep = inspect::check(root).unwrap();
    assert!(
        has_problem(&rep, &["log_flushed_offset", "beyond the end of the log"]),
        "{:?}",
        rep.problems
    );
}

#[test]
fn shard_directories_are_inspected_one_by_one() {
    let dir = tempfile::tempdir().unwrap();
    let counts = [20u64, 30];
    for (i, n) in counts.iter().enumerate() {
        populate(&dir.path().join(format!("shard-{i}")), *n);
    }
    let roots = inspect::roots(dir.path()).unwrap();
    assert_eq!(
        roots.iter().map(|r| r.shard).collect::<Vec<_>>(),
        vec![Some(0), Some(1)]
    );
    let out = coremq(&["inspect", "check"], dir.path());
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines = json_lines(&out);
    assert_eq!(lines.len(), 2);
    for (i, n) in counts.iter().enumerate() {
        assert_eq!(lines[i]["shard"], i);
        assert_eq!(lines[i]["records"], n * QUEUES.len() as u64);
    }
    let out = coremq(
        &["inspect", "queue", "--topic", "TopicA", "--queue", "1"],
        dir.path(),
    );
    let lines = json_lines(&out);
    assert_eq!(lines.len() as u64, counts.iter().sum::<u64>());
    assert_eq!(lines.last().unwrap()["shard"], 1);
}

/// A shard that never got a record: its log and checkpoint start at the shard's base
/// offset (`i << 56`), not at 0, and that is clean (found by tests/crash_loop.rs).
#[test]
fn empty_shards_check_clean() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = coremq::ShardedConfig::new(dir.path());
    cfg.shards = 3;
    cfg.store = StoreConfig::small_for_tests(dir.path());
    coremq::ShardedStore::open(cfg).unwrap().shutdown().unwrap();
    let out = coremq(&["inspect", "check"], dir.path());
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let lines = json_lines(&out);
    assert_eq!(lines.len(), 3);
    for (i, line) in lines.iter().enumerate() {
        assert_eq!(line["log_end"], (i as u64) << 56);
    }
}

#[test]
fn run_command_verifies_and_leaves_a_clean_store() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let out = Command::new(env!("CARGO_BIN_EXE_coremq"))
        .args([
            "run",
            "--messages",
            "3000",
            "--queues",
            "3",
            "--body-bytes",
            "100",
            "--data-dir",
        ])
        .arg(&data)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary = &json_lines(&out)[0];
    assert_eq!(summary["verified"], true);
    assert_eq!(summary["messages"], 3000);
    assert_eq!(summary["bytes"], 300_000);
    let rep = inspect::check(&data).unwrap();
    assert!(rep.is_clean(), "{:?}", rep.problems);
    assert_eq!((rep.records, rep.entries, rep.queues), (3000, 3000, 3));
}

/// A RocketMQ-style store built by hand: no record CRC, a checkpoint without coremq's
/// section, a queue that starts at offset 5 behind pre-blank entries, 6,000,000-byte
/// queue files, a non-dispatched prepared-transaction record, and a first segment
/// already removed by retention.
mod rocketmq_layout {
    use super::*;
    use coremq::format::consume_queue::{CqEntry, PRE_BLANK_SIZE};
    use coremq::format::record::{RecordFields, encode, encode_blank};

    const SEG: usize = 16 << 10;
    const CQ_FILE: u64 = 6_000_000;
    const FIRST_Q: u64 = 5;
    const COUNT: u64 = 40;

    fn fields<'a>(
        k: u64,
        q: u64,
        phys: usize,
        body: &'a [u8],
        props: &'a [u8],
    ) -> RecordFields<'a> {
        RecordFields {
            topic: "RmqTopic",
            queue_id: 0,
            flag: 0,
            queue_offset: q as i64,
            phys_offset: phys as i64,
            sys_flag: if q == 0 { 0x4 } else { 0 },
            born_timestamp: 1000 + k as i64,
            born_host: "10.0.0.1:5555".parse().unwrap(),
            store_timestamp: 2000 + k as i64,
            store_host: "192.168.0.1:10911".parse().unwrap(),
            reconsume_times: 0,
            prepared_transaction_offset: 0,
            body,
            properties: props,
            record_crc: false,
        }
    }

    /// Writes the store; returns (offset, size, queue offset) of each queued record.
    fn build(root: &Path) -> Vec<(u64, u32, u64)> {
        let mut log: Vec<u8> = Vec::new();
        let mut placed = Vec::new();
        let props = b"TAGS\x01rmq\x02KEYS\x01k1 k2\x02";
        for k in 0..COUNT + 1 {
            // Record 20 is a prepared transaction half: queue offset 0, no entry.
            let q = if k == 20 {
                0
            } else {
                FIRST_Q + k - (k > 20) as u64
            };
            let body = vec![k as u8; 1000];
            let len = fields(k, q, 0, &body, props).encoded_len();
            let used = log.len() % SEG;
            if used + len + 8 > SEG {
                log.extend_from_slice(&encode_blank((SEG - used) as u32));
                log.resize(log.len() + SEG - used - 8, 0);
            }
            let at = log.len();
            encode(&fields(k, q, at, &body, props), &mut log);
            if q != 0 {
                placed.push((at as u64, len as u32, q));
            }
        }
        log.resize(log.len().div_ceil(SEG) * SEG, 0);
        std::fs::create_dir_all(root.join("commitlog")).unwrap();
        for (i, seg) in log.chunks(SEG).enumerate() {
            let name = format!("{:020}", i * SEG);
            std::fs::write(root.join("commitlog").join(name), seg).unwrap();
        }
        write_queue(root, &placed);
        let mut cp = vec![0u8; 4096];
        cp[..8].copy_from_slice(&(2000 + COUNT as i64).to_be_bytes());
        cp[8..16].copy_from_slice(&(2000 + COUNT as i64).to_be_bytes());
        std::fs::write(root.join("checkpoint"), cp).unwrap();
        placed
    }

    fn write_queue(root: &Path, placed: &[(u64, u32, u64)]) {
        let dir = root.join("consumequeue/RmqTopic/0");
        std::fs::create_dir_all(&dir).unwrap();
        let blank = CqEntry {
            phys_offset: 0,
            size: PRE_BLANK_SIZE,
            tags_code: 0,
        };
        let mut bytes: Vec<u8> = (0..FIRST_Q).flat_map(|_| blank.encode()).collect();
        for (at, size, _) in placed {
            let e = CqEntry {
                phys_offset: *at as i64,
                size: *size as i32,
                tags_code: tags_code(Some("rmq")),
            };
            bytes.extend_from_slice(&e.encode());
        }
        bytes.resize(CQ_FILE as usize, 0);
        std::fs::write(dir.join(format!("{:020}", 0)), bytes).unwrap();
        // A pre-created, still empty next file (sparse).
        let next = std::fs::File::create(dir.join(format!("{CQ_FILE:020}"))).unwrap();
        next.set_len(CQ_FILE).unwrap();
    }

    #[test]
    fn rocketmq_store_checks_clean() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let placed = build(root);
        assert!(std::fs::read_dir(root.join("commitlog")).unwrap().count() >= 3);

        let (entries, w) = inspect::queue_entries(root, "RmqTopic", 0).unwrap();
        assert_eq!(
            (w.first, w.end, w.pre_blank),
            (Some(FIRST_Q), FIRST_Q + COUNT, FIRST_Q)
        );
        assert_eq!(w.file_bytes, Some(CQ_FILE));
        assert_eq!(entries.len() as u64, COUNT);
        assert_eq!(entries[3].commit_log_offset, placed[3].0);

        let (records, walk) = inspect::records(root).unwrap();
        assert!(walk.problems.is_empty(), "{:?}", walk.problems);
        assert_eq!(records.len() as u64, COUNT + 1);
        assert!(records.iter().all(|r| r.checksum == "ok"));
        assert_eq!(
            records[0].msg_id.as_deref(),
            Some("C0A8000100002A9F0000000000000000")
        );
        let rep = inspect::check(root).unwrap();
        assert!(rep.is_clean(), "{:?}", rep.problems);
        assert_eq!(
            (rep.records, rep.entries, rep.queues),
            (COUNT + 1, COUNT, 1)
        );

        // Retention removed the first segment: its entries point below the log.
        std::fs::remove_file(root.join("commitlog").join(format!("{:020}", 0))).unwrap();
        let rep = inspect::check(root).unwrap();
        assert!(rep.is_clean(), "{:?}", rep.problems);
        assert_eq!(rep.log_min, SEG as u64);
        assert!(rep.records < COUNT);
    }

    #[test]
    fn rocketmq_tail_rule_uses_the_logics_timestamp() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        build(root);
        // Drop the last 3 entries: records stored at 2038, 2039, 2040.
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(root.join("consumequeue/RmqTopic/0/00000000000000000000"))
            .unwrap();
        f.write_all_at(&[0u8; 60], (FIRST_Q + COUNT - 3) * 20)
            .unwrap();
        // logicsMsgTimestamp 2040 excuses only the record stored at 2040.
        let rep = inspect::check(root).unwrap();
        let expect = ["RmqTopic/0: 2 records have no entry", "queue offset 42"];
        assert!(has_problem(&rep, &expect), "{:?}", rep.problems);
        let mut cp = std::fs::read(root.join("checkpoint")).unwrap();
        cp[8..16].copy_from_slice(&2038i64.to_be_bytes());
        std::fs::write(root.join("checkpoint"), &cp).unwrap();
        let rep = inspect::check(root).unwrap();
        assert!(rep.is_clean(), "{:?}", rep.problems);
        assert_eq!(rep.entries, COUNT - 3);
    }
}
