//! Delayed delivery (`coremq::schedule`, RocketMQ's `ScheduleMessageService`): the
//! layout a delayed put leaves (RocketMQ's, byte for byte), delivery after the delay
//! and never before, the delivered message's properties, exactly one delivery across
//! clean restarts, deliveries that cross shards, a RocketMQ store's pending delayed
//! messages, `config/delayOffset.json`, and bad input. The crash proof is
//! `tests/schedule_crash.rs`.
mod common;
use common::run;
use coremq::format::delay_offset::DelayOffsets;
use coremq::format::schedule::{POSITION, SCHEDULE_TOPIC};
use coremq::prelude::*;
use coremq::{IllegalReason, schedule};
use futures_lite::future::block_on;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

/// Short levels so the tests run in seconds.
const LEVELS: &str = "300ms 700ms 1200ms";

fn sharded(root: &Path, shards: usize) -> ShardedStore {
    let mut cfg = ShardedConfig::new(root);
    cfg.shards = shards;
    cfg.pin = false;
    cfg.store = StoreConfig::small_for_tests(root);
    cfg.store.schedule.message_delay_level = LEVELS.into();
    ShardedStore::open(cfg).unwrap()
}

fn delayed(topic: &str, q: i32, level: i32, i: u64) -> Message {
    Message::new(topic, q, format!("{topic}/{q}/{i}"))
        .with_tags("tg")
        .with_keys(format!("k{i}"))
        .with_property("UNIQ_KEY", format!("U{topic}{q}x{i}"))
        .with_property("DELAY", level.to_string())
}

/// Every message of `topic`'s queues `0..queues`, decoded.
fn read_queues(h: &Handle, topic: &str, queues: i32) -> Vec<StoredMessage> {
    let mut out = Vec::new();
    for q in 0..queues {
        let mut off = 0;
        loop {
            let r = block_on(h.get(topic, q, off, 32, 1 << 20)).unwrap();
            if r.status != GetStatus::Found {
                break;
            }
            for raw in &r.records {
                out.push(StoredMessage::decode(raw).unwrap());
            }
            off = r.next_begin_offset;
        }
    }
    out
}

fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A delayed put is stored as RocketMQ stores it: `SCHEDULE_TOPIC_XXXX` queue
/// level - 1, `REAL_TOPIC`/`REAL_QID` added, `DELAY` kept, the delivery time as the
/// queue entry's tagsCode; the real queue stays empty until delivery.
#[test]
fn delayed_put_is_stored_in_the_schedule_queue_as_rocketmq_lays_it_out() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    run(move || async move {
        // Default levels; no delivery service runs on a bare store.
        let store = Store::open(StoreConfig::small_for_tests(&root))
            .await
            .unwrap();
        let r = store.put(delayed("Orders", 3, 3, 0)).await;
        assert_eq!(r.status, PutStatus::PutOk);
        assert_eq!(r.queue_offset, 0);
        let r2 = store.put(delayed("Orders", 1, 99, 1)).await;
        assert_eq!(r2.status, PutStatus::PutOk);
        store.wait_dispatched().await;
        assert_eq!(store.max_queue_offset("Orders", 3), 0);
        let got = store.get(SCHEDULE_TOPIC, 2, 0, 8, 1 << 20).await.unwrap();
        assert_eq!(got.records.len(), 1);
        let m = StoredMessage::decode(&got.records[0]).unwrap();
        assert_eq!((m.topic.as_str(), m.queue_id), (SCHEDULE_TOPIC, 2));
        assert_eq!(m.property("REAL_TOPIC"), Some("Orders"));
        assert_eq!(m.property("REAL_QID"), Some("3"));
        assert_eq!(m.property("DELAY"), Some("3"));
        assert_eq!(m.property("UNIQ_KEY"), Some("UOrders3x0"));
        assert_eq!(m.log_offset, r.log_offset);
        let e = store.queue_entries(SCHEDULE_TOPIC, 2, 0, 8).await.unwrap();
        assert_eq!(e.len(), 1);
        assert_eq!(
            e[0].tags_code,
            m.store_timestamp_ms + 10_000,
            "level 3 = 10 s"
        );
        // Level 99 is clamped to the last level (18, 2 h): queue 17.
        let e = store.queue_entries(SCHEDULE_TOPIC, 17, 0, 8).await.unwrap();
        assert_eq!(e.len(), 1);
        let m = store.look_by_offset(r2.log_offset).await.unwrap().unwrap();
        assert_eq!(m.property("DELAY"), Some("18"));
        assert_eq!(e[0].tags_code, m.store_timestamp_ms + 7_200_000);
        store.shutdown().await.unwrap();
    });
}

/// Delivered into the real queue after the delay, never before, exactly once, with
/// the message's properties (its `UNIQ_KEY` among them) and its position first.
#[test]
fn delivered_after_the_delay_never_before_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = sharded(dir.path(), 2);
    let h = store.handle();
    let mut sent = BTreeMap::new();
    for i in 0..60u64 {
        let (q, level) = ((i % 4) as i32, (i % 3) as i32 + 1);
        let r = block_on(h.put(delayed("Delayed", q, level, i)));
        assert_eq!(r.status, PutStatus::PutOk);
        sent.insert(format!("UDelayed{q}x{i}"), (level, r.store_timestamp_ms));
    }
    wait_for("every delivery", Duration::from_secs(20), || {
        read_queues(&h, "Delayed", 4).len() >= sent.len()
    });
    std::thread::sleep(Duration::from_millis(300));
    let got = read_queues(&h, "Delayed", 4);
    assert_eq!(got.len(), sent.len(), "no message delivered twice");
    let delays = [300, 700, 1200];
    for m in &got {
        let key = m.property("UNIQ_KEY").unwrap();
        let (level, stored_at) = sent[key];
        assert_eq!(m.property("DELAY"), Some(level.to_string().as_str()));
        assert_eq!(m.property("REAL_TOPIC"), Some("Delayed"));
        assert!(m.property(POSITION).is_some());
        assert_eq!(m.property("TAGS"), Some("tg"));
        let due = stored_at + delays[level as usize - 1];
        assert!(
            m.store_timestamp_ms >= due,
            "{key} delivered {} ms early",
            due - m.store_timestamp_ms
        );
    }
    // The key index and the message id find the delivered copy.
    let hits = block_on(h.query_by_key("Delayed", "k7", 8, 0, i64::MAX)).unwrap();
    assert!(hits.iter().any(|m| m.topic == "Delayed"));
    store.shutdown().unwrap();
}

/// A clean restart in the middle of the delays: what was delivered is not delivered
/// again, the rest is; `config/delayOffset.json` holds RocketMQ's `offsetTable`.
#[test]
fn restart_resumes_without_delivering_twice() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let store = sharded(root, 2);
    let h = store.handle();
    for i in 0..40u64 {
        let level = if i < 20 { 1 } else { 3 };
        assert!(
            block_on(h.put(delayed("Resume", (i % 2) as i32, level, i)))
                .status
                .is_stored()
        );
    }
    wait_for("level 1", Duration::from_secs(10), || {
        read_queues(&h, "Resume", 2).len() >= 20
    });
    store.shutdown().unwrap();
    let mut table = BTreeMap::new();
    for s in 0..2 {
        let path = root.join(format!("shard-{s}/config/delayOffset.json"));
        if let Ok(text) = std::fs::read(&path) {
            for (l, n) in DelayOffsets::decode(&text).unwrap().offset_table {
                *table.entry(l).or_insert(0) += n;
            }
        }
    }
    assert_eq!(
        table.get(&1),
        Some(&20),
        "level 1 delivered up to offset 20: {table:?}"
    );
    let store = sharded(root, 2);
    let h = store.handle();
    wait_for("level 3", Duration::from_secs(10), || {
        read_queues(&h, "Resume", 2).len() >= 40
    });
    std::thread::sleep(Duration::from_millis(500));
    let got = read_queues(&h, "Resume", 2);
    let mut keys: Vec<_> = got
        .iter()
        .map(|m| m.property("UNIQ_KEY").unwrap().to_string())
        .collect();
    keys.sort();
    keys.dedup();
    assert_eq!((got.len(), keys.len()), (40, 40));
    store.shutdown().unwrap();
}

/// A delayed message stored on a shard that does not own its real queue (a direct
/// put on that shard's store) is delivered to the owner, once, also across a restart
/// right after (the owner's log says it was delivered).
#[test]
fn delivery_crosses_shards_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let store = sharded(root, 2);
    let h = store.handle();
    // Queues of "Cross" owned by shard 1, put on shard 0's store.
    let foreign: Vec<i32> = (0..8).filter(|q| h.shard_of("Cross", *q) == 1).collect();
    assert!(!foreign.is_empty());
    let puts = foreign.clone();
    let n = block_on(h.run_on(0, move |ctx| async move {
        let mut n = 0;
        for (i, q) in puts.iter().enumerate() {
            for k in 0..5u64 {
                let r = ctx
                    .store
                    .put(delayed("Cross", *q, 1, i as u64 * 10 + k))
                    .await;
                assert_eq!(r.status, PutStatus::PutOk);
                n += 1;
            }
        }
        n
    }))
    .unwrap();
    wait_for("cross-shard deliveries", Duration::from_secs(10), || {
        read_queues(&h, "Cross", 8).len() >= n
    });
    store.shutdown().unwrap();
    let store = sharded(root, 2);
    let h = store.handle();
    std::thread::sleep(Duration::from_millis(800));
    assert_eq!(read_queues(&h, "Cross", 8).len(), n);
    let newest = block_on(h.run_at(1, &(), async |s, _| s.newest_delivery((0, 1)))).unwrap();
    assert_eq!(
        newest,
        Some((n as u64 - 1, 0)),
        "shard 1 holds shard 0's level-1 deliveries"
    );
    store.shutdown().unwrap();
}

/// A RocketMQ store root with pending delayed messages (records, queue entries and
/// RocketMQ's `delayOffset.json` with unquoted keys, as RocketMQ writes them): after
/// coremq opens it, the messages past RocketMQ's progress are delivered, once; those
/// before it are not.
#[test]
fn rocketmq_store_pending_delayed_messages_are_delivered() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    // Write the store with a bare coremq store (identical layout), then replace the
    // progress with RocketMQ's file: level 1 delivered up to offset 2.
    let r2 = root.clone();
    run(move || async move {
        let mut cfg = StoreConfig::small_for_tests(&r2);
        cfg.record_crc = false;
        let store = Store::open(cfg).await.unwrap();
        for i in 0..5 {
            let m = delayed("Legacy", 0, 1, i);
            assert!(store.put(m).await.status.is_stored());
        }
        store.shutdown().await.unwrap();
    });
    std::fs::write(
        root.join("config/delayOffset.json"),
        "{\n\t\"dataVersion\":{\n\t\t\"counter\":3,\n\t\t\"stateVersion\":0,\n\t\t\"timestamp\":1700000000000\n\t},\n\t\"offsetTable\":{1:2\n\t}\n}",
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(1100));
    run(move || async move {
        let mut cfg = StoreConfig::small_for_tests(&root);
        cfg.record_crc = false;
        let store = Store::open(cfg).await.unwrap();
        schedule::start(schedule::Solo(store.clone())).unwrap();
        let start = Instant::now();
        while store.max_queue_offset("Legacy", 0) < 3 && start.elapsed() < Duration::from_secs(10) {
            glommio::timer::sleep(Duration::from_millis(20)).await;
        }
        glommio::timer::sleep(Duration::from_millis(500)).await;
        let got = common::read_all(&store, "Legacy", 0).await;
        let keys: Vec<_> = got
            .iter()
            .map(|m| m.property("UNIQ_KEY").unwrap().to_string())
            .collect();
        assert_eq!(keys, ["ULegacy0x2", "ULegacy0x3", "ULegacy0x4"]);
        store.shutdown().await.unwrap();
        let file = std::fs::read(root.join("config/delayOffset.json")).unwrap();
        let d = DelayOffsets::decode(&file).unwrap();
        assert_eq!(d.offset_table.get(&1), Some(&5));
        assert!(
            String::from_utf8(file).unwrap().contains("{1:5"),
            "bare keys, as RocketMQ writes"
        );
    });
}

/// Bad scheduling input gets a clear status and stores nothing; a position property
/// a client sends is dropped (only the store writes it).
#[test]
fn bad_schedule_input_is_refused_or_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    run(move || async move {
        let store = Store::open(StoreConfig::small_for_tests(&root))
            .await
            .unwrap();
        let bad = Message::new("T", 0, "x").with_property("DELAY", "soon");
        assert_eq!(
            store.put(bad).await.status,
            PutStatus::MessageIllegal(IllegalReason::ScheduleInvalid)
        );
        let batch = vec![
            Message::new("T", 0, "a"),
            Message::new("T", 0, "b").with_property("DELAY", "1"),
        ];
        assert_eq!(
            store.put_batch(&batch).await.status,
            PutStatus::MessageIllegal(IllegalReason::BatchScheduled)
        );
        let forged = Message::new("T", 0, "x").with_property(POSITION, "0,1,99999,0");
        let r = store.put(forged).await;
        assert_eq!(r.status, PutStatus::PutOk);
        let m = store.look_by_offset(r.log_offset).await.unwrap().unwrap();
        assert_eq!(m.property(POSITION), None);
        store.wait_dispatched().await;
        assert_eq!(store.newest_delivery((0, 1)), None);
        assert_eq!(store.max_queue_offset("T", 0), 1);
        let mut cfg = StoreConfig::small_for_tests(&root);
        cfg.schedule.message_delay_level = "1x".into();
        store.shutdown().await.unwrap();
        assert!(
            Store::open(cfg).await.is_err(),
            "bad levels refuse the open"
        );
    });
}
