//! kill -9 crash tests, sled style.
//!
//! The test re-runs its own binary as a child (`crash_child`, which only does
//! anything when `COREMQ_CRASH_CHILD=<store dir>` is set). The child opens the store
//! and runs many concurrent put loops over several topics and queues; after every
//! `PutOk` it appends `topic queue queue_offset log_offset body_hash` to an ack file
//! with one unbuffered write (the page cache survives SIGKILL, so no fsync is
//! needed for the parent to read it). The parent waits a random 200-1500 ms after the
//! child reports it is ready, SIGKILLs it, reopens the store in-process and checks:
//!
//! * sync flush: every acknowledged message is present at its queue offset with its
//!   log offset and identical body, and `look_by_offset` finds it; every queue is
//!   contiguous from 0; offsets continue across cycles (no queue offset is ever
//!   acknowledged twice);
//! * async flush: the store opens, every queue is contiguous and every record
//!   decodes with valid checksums; whatever survived matches what was acknowledged.
//!
//! Knobs: `COREMQ_CRASH_SEED` (replay), `COREMQ_CRASH_CYCLES` (sync cycles, default
//! 3), `COREMQ_CRASH_ASYNC_CYCLES` (default 1), `COREMQ_CRASH_DELAY_MS` (fixed delay
//! before the kill), `COREMQ_TEST_LOG` (print the store's tracing output).
#[path = "common/child.rs"]
mod child;
mod common;

use child::*;
use common::run;
use coremq::{
    FlushMode, GetStatus, Message, PutStatus, Store, StoreConfig, StoredMessage, SyncFlushIo,
};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, Instant};

const CHILD_ENV: &str = "COREMQ_CRASH_CHILD";
const ACKS_ENV: &str = "COREMQ_CRASH_ACKS";
const READY_ENV: &str = "COREMQ_CRASH_READY";
const MODE_ENV: &str = "COREMQ_CRASH_MODE";
const CHILD_SEED_ENV: &str = "COREMQ_CRASH_CHILD_SEED";
/// `ring`: the child's sync flush uses `SyncFlushIo::RingWriteFdatasync`.
const SYNC_IO_ENV: &str = "COREMQ_CRASH_SYNC_IO";

const TOPICS: [&str; 3] = ["CrashA", "CrashB", "%RETRY%crash-group"];
const QUEUES_PER_TOPIC: i32 = 3;
/// Put loops in the child: one per queue, plus two that share a queue with another
/// loop (so one queue sees concurrent puts), one of them putting batches.
const WORKERS: usize = 11;

fn worker_queue(w: usize) -> (&'static str, i32) {
    let i = w % (TOPICS.len() * QUEUES_PER_TOPIC as usize);
    (
        TOPICS[i / QUEUES_PER_TOPIC as usize],
        (i % QUEUES_PER_TOPIC as usize) as i32,
    )
}

fn mode_name(mode: FlushMode) -> &'static str {
    match mode {
        FlushMode::Sync => "sync",
        FlushMode::Async => "async",
    }
}

fn config(root: &Path, mode: FlushMode) -> StoreConfig {
    let mut cfg = StoreConfig::small_for_tests(root);
    cfg.flush_mode = mode;
    cfg
}

/// Mostly small bodies, sometimes tens of KiB, rarely the largest allowed, so records
/// straddle windows, pages and segment ends.
fn body_len(rng: &mut Rng, max: usize) -> usize {
    match rng.range(0, 999) {
        0..=1 => max,
        2..=9 => rng.range(20_000, 60_000) as usize,
        31..=40 => 0,
        _ => rng.range(1, 2_000) as usize,
    }
}

// ---------------------------------------------------------------------------------
// The child.

/// Acts as the crash child only when `COREMQ_CRASH_CHILD` is set; otherwise a no-op.
#[test]
fn crash_child() {
    let Some(root) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    let root = PathBuf::from(root);
    let acks = PathBuf::from(std::env::var_os(ACKS_ENV).expect("acks path"));
    let ready = PathBuf::from(std::env::var_os(READY_ENV).expect("ready path"));
    let mode = match std::env::var(MODE_ENV).as_deref() {
        Ok("async") => FlushMode::Async,
        _ => FlushMode::Sync,
    };
    let seed: u64 = std::env::var(CHILD_SEED_ENV)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(7);
    let io = match std::env::var(SYNC_IO_ENV).as_deref() {
        Ok("ring") => SyncFlushIo::RingWriteFdatasync,
        _ => SyncFlushIo::DsyncWrite,
    };
    run(move || async move {
        let mut cfg = config(&root, mode);
        cfg.sync_flush_io = io;
        let max_body = cfg.max_message_bytes;
        let store = match Store::open(cfg).await {
            Ok(s) => s,
            Err(e) => {
                eprintln!("CHILD OPEN FAILED: {e}");
                std::process::exit(2);
            }
        };
        eprintln!("child opened ({}): {:?}", mode_name(mode), store.report);
        let ack_file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&acks)
            .expect("open ack file");
        let ack_file = Rc::new(RefCell::new(ack_file));
        std::fs::write(&ready, b"ready").expect("write ready file");
        let mut tasks = Vec::new();
        for w in 0..WORKERS {
            let store = store.clone();
            let ack_file = ack_file.clone();
            let mut rng = Rng::new(seed.wrapping_add(w as u64 * 0x1000_0001));
            let batches = w == WORKERS - 1;
            tasks.push(glommio::spawn_local(async move {
                let (topic, q) = worker_queue(w);
                loop {
                    let n = if batches { rng.range(1, 4) as usize } else { 1 };
                    let msgs: Vec<Message> = (0..n)
                        .map(|_| {
                            let mut b = vec![0u8; body_len(&mut rng, max_body)];
                            rng.fill(&mut b);
                            Message::new(topic, q, b)
                                .with_tags(format!("t{}", rng.range(0, 3)))
                                .with_keys(format!("w{w}"))
                        })
                        .collect();
                    let r = if batches {
                        store.put_batch(&msgs).await
                    } else {
                        store.put(msgs[0].clone()).await
                    };
                    if r.status != PutStatus::PutOk {
                        eprintln!("worker {w}: put status {:?} (not acknowledged)", r.status);
                        glommio::timer::sleep(Duration::from_millis(5)).await;
                        continue;
                    }
                    assert_eq!(r.msg_ids.len(), n, "one message id per record");
                    let mut lines = String::new();
                    for (i, m) in msgs.iter().enumerate() {
                        lines.push_str(&format!(
                            "{topic} {q} {} {} {:016x}\n",
                            r.queue_offset + i as u64,
                            r.msg_ids[i].offset,
                            fnv1a(&m.body)
                        ));
                    }
                    // One write(2) per put: a kill can cut at most the last line.
                    ack_file
                        .borrow_mut()
                        .write_all(lines.as_bytes())
                        .expect("write ack");
                    // An async-flush put that finds room never awaits; without this one
                    // loop would run alone until the write pool fills.
                    futures_lite::future::yield_now().await;
                }
            }));
        }
        // Safety net: never outlive a parent that died without killing us.
        glommio::timer::sleep(Duration::from_secs(60)).await;
        eprintln!("child: not killed within 60 s; exiting");
        std::process::exit(3);
    });
}

// ---------------------------------------------------------------------------------
// The parent.

type Key = (String, i32, u64);
/// (topic, queue, queue offset) -> (log offset, body hash).
type Acks = BTreeMap<Key, (u64, u64)>;

/// Reads whole lines of an ack file (a kill may leave half a line at the end).
fn read_acks(path: &Path) -> Vec<(Key, (u64, u64))> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let complete = match text.rfind('\n') {
        Some(i) => &text[..=i],
        None => "",
    };
    complete
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            assert_eq!(f.len(), 5, "bad ack line {l:?}");
            (
                (
                    f[0].to_string(),
                    f[1].parse().unwrap(),
                    f[2].parse().unwrap(),
                ),
                (
                    f[3].parse().unwrap(),
                    u64::from_str_radix(f[4], 16).unwrap(),
                ),
            )
        })
        .collect()
}

/// What a recovered store holds, checked queue by queue.
struct Recovered {
    /// Next queue offset of every queue after the parent's own probe put.
    max: BTreeMap<(String, i32), u64>,
    messages: usize,
}

/// Reopens the store after the kill and checks it against the acknowledgements.
/// `strict`: every acknowledged message must be there (sync flush).
fn verify(
    root: &Path,
    mode: FlushMode,
    acks: &Acks,
    strict: bool,
    cycle: usize,
    clean_stop: bool,
) -> Recovered {
    let root = root.to_path_buf();
    let acks = acks.clone();
    run_ret(move || async move {
        if std::env::var_os("COREMQ_TEST_LOG").is_some() {
            let _ = tracing_subscriber::fmt()
                .with_writer(std::io::stderr)
                .try_init();
        }
        eprintln!("checkpoint before reopen: {:?}", read_checkpoint(&root));
        let store = Store::open(config(&root, mode))
            .await
            .unwrap_or_else(|e| panic!("cycle {cycle}: reopen after kill -9 failed: {e}"));
        eprintln!("cycle {cycle}: parent reopened: {:?}", store.report);
        assert!(
            !store.report.clean_shutdown,
            "a killed store must be seen as not cleanly shut down"
        );
        let mut found: BTreeMap<Key, (u64, u64)> = BTreeMap::new();
        let mut max = BTreeMap::new();
        for (topic, q) in store.queues() {
            let qmin = store.min_queue_offset(&topic, q);
            let qmax = store.max_queue_offset(&topic, q);
            assert_eq!(qmin, 0, "cycle {cycle}: {topic}/{q} does not start at 0");
            let mut off = 0;
            while off < qmax {
                let r = store.get(&topic, q, off, 32, 1 << 20).await.unwrap();
                assert_eq!(
                    r.status,
                    GetStatus::Found,
                    "cycle {cycle}: {topic}/{q} at {off} of {qmax}"
                );
                assert!(!r.records.is_empty());
                for raw in &r.records {
                    let m = StoredMessage::decode(raw).unwrap_or_else(|e| {
                        panic!("cycle {cycle}: {topic}/{q} queue offset {off}: record does not decode: {e}")
                    });
                    assert_eq!(
                        (m.topic.as_str(), m.queue_id),
                        (topic.as_str(), q),
                        "cycle {cycle}: wrong queue"
                    );
                    assert_eq!(
                        m.queue_offset, off,
                        "cycle {cycle}: {topic}/{q} is not contiguous"
                    );
                    found.insert((topic.clone(), q, off), (m.log_offset, fnv1a(&m.body)));
                    off += 1;
                }
                assert_eq!(r.next_begin_offset, off, "cycle {cycle}: next_begin_offset");
            }
            let past = store.get(&topic, q, qmax, 32, 1 << 20).await.unwrap();
            assert_eq!(
                past.status,
                GetStatus::OffsetOverflowOne,
                "cycle {cycle}: {topic}/{q} past the end"
            );
            max.insert((topic.clone(), q), qmax);
        }
        let mut lost = Vec::new();
        for (n, (key, &(log_off, hash))) in acks.iter().enumerate() {
            let (topic, q, qoff) = key;
            let qmax = max.get(&(topic.clone(), *q)).copied().unwrap_or(0);
            match found.get(key) {
                Some(&(got_off, got_hash)) => {
                    assert_eq!(
                        (got_off, got_hash),
                        (log_off, hash),
                        "cycle {cycle}: {topic}/{q} queue offset {qoff} holds a different message than was acknowledged \
                         (acked log offset {log_off} hash {hash:016x})"
                    );
                }
                None => {
                    assert!(
                        *qoff >= qmax,
                        "cycle {cycle}: {topic}/{q} queue offset {qoff} is inside the queue (max {qmax}) but was not read"
                    );
                    lost.push(key.clone());
                    continue;
                }
            }
            // Every acknowledged message was found through get() above; look_by_offset
            // and look_by_msg_id (slower in debug builds) on a sample: every 8th ack and
            // the last 16 of each queue, where a crash does its damage.
            if n % 8 != 0 && qoff + 16 < qmax {
                continue;
            }
            let m = store
                .look_by_offset(log_off)
                .await
                .unwrap()
                .unwrap_or_else(|| panic!("cycle {cycle}: look_by_offset({log_off}) found nothing for {topic}/{q}/{qoff}"));
            assert_eq!(
                (m.topic.as_str(), m.queue_id, m.queue_offset),
                (topic.as_str(), *q, *qoff)
            );
            assert_eq!(m.log_offset, log_off);
            assert_eq!(
                fnv1a(&m.body),
                hash,
                "cycle {cycle}: look_by_offset({log_off}) body differs"
            );
            let id = m
                .msg_id
                .expect("ipv4 store host gives an offset id")
                .to_string();
            let by_id = store
                .look_by_msg_id(&id)
                .await
                .unwrap()
                .expect("look_by_msg_id");
            assert_eq!(by_id.log_offset, log_off);
        }
        if strict && !lost.is_empty() {
            panic!(
                "cycle {cycle}: {} acknowledged (PutOk, sync flush) messages are missing after kill -9, e.g. {:?}",
                lost.len(),
                &lost[..lost.len().min(5)]
            );
        }
        if !lost.is_empty() {
            eprintln!(
                "cycle {cycle}: {} acknowledged async puts were lost (allowed)",
                lost.len()
            );
        }
        // The store takes writes again, continuing every queue where it ended.
        let (topic, q) = (TOPICS[0], 0);
        let before = max.get(&(topic.to_string(), q)).copied().unwrap_or(0);
        let r = store
            .put(Message::new(
                topic,
                q,
                format!("parent probe after cycle {cycle}"),
            ))
            .await;
        assert_eq!(
            r.status,
            PutStatus::PutOk,
            "cycle {cycle}: put after recovery"
        );
        assert_eq!(
            r.queue_offset, before,
            "cycle {cycle}: queue offsets must continue after recovery"
        );
        store.wait_dispatched().await;
        let g = store.get(topic, q, before, 1, 1 << 20).await.unwrap();
        assert_eq!(g.status, GetStatus::Found);
        max.insert((topic.to_string(), q), before + 1);
        let messages = found.len() + 1;
        store
            .shutdown()
            .await
            .unwrap_or_else(|e| panic!("cycle {cycle}: shutdown: {e}"));
        if !clean_stop {
            // As if killed right after the shutdown's checkpoint: the next child
            // recovers from an unclean state (whole-tail scan). Dropping the store
            // without shutdown would be the natural way, but that leaks the directory
            // lock for the life of this process (see tests/recovery.rs).
            mark_unclean(&root);
        }
        Recovered { max, messages }
    })
}

fn env_usize(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn crash_cycles(mode: FlushMode, io: SyncFlushIo, cycles: usize) {
    let seed = seed_from_env("COREMQ_CRASH_SEED");
    let mut rng = Rng::new(seed);
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("store");
    let strict = mode == FlushMode::Sync;
    let mut acks: Acks = BTreeMap::new();
    let mut floor: BTreeMap<(String, i32), u64> = BTreeMap::new();
    for cycle in 0..cycles {
        let ack_path = tmp.path().join(format!("acks-{cycle}"));
        let ready = tmp.path().join(format!("ready-{cycle}"));
        let log = tmp.path().join(format!("child-{cycle}.log"));
        let envs: Vec<(&str, OsString)> = vec![
            (CHILD_ENV, root.clone().into()),
            (ACKS_ENV, ack_path.clone().into()),
            (READY_ENV, ready.clone().into()),
            (MODE_ENV, mode_name(mode).into()),
            (CHILD_SEED_ENV, rng.next_u64().to_string().into()),
            (
                SYNC_IO_ENV,
                match io {
                    SyncFlushIo::RingWriteFdatasync => "ring",
                    SyncFlushIo::DsyncWrite => "dsync",
                }
                .into(),
            ),
        ];
        let mut child = spawn_self("crash_child", &envs, &log);
        let started = Instant::now();
        while !ready.exists() {
            if let Some(status) = child.try_wait().unwrap() {
                panic!(
                    "cycle {cycle}: child exited ({status}) before it was ready:\n{}",
                    log_tail(&log, 4000)
                );
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "cycle {cycle}: child never got ready"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let delay = rng.range(200, 1500);
        let delay = std::env::var("COREMQ_CRASH_DELAY_MS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(delay);
        std::thread::sleep(Duration::from_millis(delay));
        // On a loaded machine the first acknowledgement can take longer than the delay:
        // kill only once the child has acknowledged something (a child that
        // acknowledges nothing for 30 s fails below).
        while read_acks(&ack_path).is_empty() && started.elapsed() < Duration::from_secs(30) {
            if child.try_wait().unwrap().is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!(
                "cycle {cycle}: child died on its own ({status}):\n{}",
                log_tail(&log, 4000)
            );
        }
        child.kill().unwrap();
        child.wait().unwrap();
        let new = read_acks(&ack_path);
        for (key, val) in &new {
            let fl = floor.get(&(key.0.clone(), key.1)).copied().unwrap_or(0);
            assert!(
                key.2 >= fl,
                "cycle {cycle}: {}/{} queue offset {} acknowledged again after recovery ended the queue at {fl}",
                key.0,
                key.1,
                key.2
            );
            if let Some(prev) = acks.insert(key.clone(), *val) {
                panic!("cycle {cycle}: {key:?} acknowledged twice: {prev:?} and {val:?}");
            }
        }
        assert!(
            !new.is_empty(),
            "cycle {cycle}: the child acknowledged nothing in {delay} ms:\n{}",
            log_tail(&log, 4000)
        );
        // Odd cycles leave the parent's store open-and-dropped, so the next child
        // recovers from an unclean state too.
        let clean_stop = cycle % 2 == 0;
        let rec = verify(&root, mode, &acks, strict, cycle, clean_stop);
        eprintln!(
            "cycle {cycle} ({}): killed after {delay} ms, {} new acks, {} acks total, {} messages in the store",
            mode_name(mode),
            new.len(),
            acks.len(),
            rec.messages
        );
        floor = rec.max;
    }
}

/// The default sync flush: one `pwritev2(RWF_DSYNC)` per round on the sync-write
/// thread, with the log zero-filled ahead (prewrite).
#[test]
fn kill9_sync_flush_keeps_every_acknowledged_put() {
    crash_cycles(
        FlushMode::Sync,
        SyncFlushIo::DsyncWrite,
        env_usize("COREMQ_CRASH_CYCLES", 3),
    );
}

/// The other sync-flush path: an io_uring write, then an io_uring fdatasync.
#[test]
fn kill9_sync_flush_ring_io_keeps_every_acknowledged_put() {
    crash_cycles(
        FlushMode::Sync,
        SyncFlushIo::RingWriteFdatasync,
        env_usize("COREMQ_CRASH_CYCLES", 3).div_ceil(2),
    );
}

#[test]
fn kill9_async_flush_recovers_a_consistent_store() {
    crash_cycles(
        FlushMode::Async,
        SyncFlushIo::DsyncWrite,
        env_usize("COREMQ_CRASH_ASYNC_CYCLES", 1),
    );
}
