//! Retention (issue 19): the time rule, the space levels, what follows the log's new
//! minimum (queue and index files, queue minimums, `OffsetTooSmall`, key queries), the
//! limits no rule may pass (the segment being written, what the checkpoint still
//! needs, what a connected slave has not reported), manual deletion, delete topic and
//! `cleanUnusedTopic`, and reopening after each.
//!
//! Small stores: 1 MiB segments, 1000-entry queue files, 4000-entry index files.

mod common;

use coremq::io::{Disk, SimDisk};
use coremq::{FlushMode, GetStatus, Message, PutStatus, Store, StoreConfig};
use std::path::Path;
use std::time::Duration;

/// Every hour: the time rule is always met.
const ALL_HOURS: &str = "00;01;02;03;04;05;06;07;08;09;10;11;12;13;14;15;16;17;18;19;20;21;22;23";

fn cfg(root: &Path) -> StoreConfig {
    let mut c = StoreConfig::small_for_tests(root);
    c.flush_mode = FlushMode::Async;
    c.consume_queue_flush_interval = Duration::from_millis(50);
    c.retention.file_reserved_time = Duration::from_millis(1500);
    c.retention.delete_when = ALL_HOURS.into();
    // The host's disk may be over 75% full: the space levels are tested on the
    // simulated disk, with a capacity.
    c.disk_full_ratio = 1.0;
    c.retention.disk_max_used_space_ratio = 1.0;
    c.retention.disk_clean_forcibly_ratio = 1.0;
    c.retention.delete_interval = Duration::ZERO;
    // Background passes only where a test asks for them.
    c.retention.clean_interval = Duration::from_secs(3600);
    c
}

/// The hour that is not now (the time rule is never met while the test runs, unless
/// the hour turns over).
fn other_hour() -> String {
    let now = chrono_hour();
    format!("{:02}", (now + 12) % 24)
}

fn chrono_hour() -> u32 {
    let t = (coremq::now_ms() / 1000) as libc::time_t;
    unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        libc::localtime_r(&t, &mut tm);
        tm.tm_hour as u32
    }
}

/// ~2 KiB messages with keys `k<i>`, to queue `q` of `topic`; returns their ids.
async fn put_n(store: &Store, topic: &str, q: i32, from: u64, n: u64) -> Vec<String> {
    let mut ids = Vec::new();
    for i in from..from + n {
        let mut body = vec![b'x'; 2000];
        body[..8].copy_from_slice(&i.to_be_bytes());
        let r = store
            .put(Message::new(topic, q, body).with_keys(format!("k{i}")))
            .await;
        assert_eq!(r.status, PutStatus::PutOk, "put {i}");
        ids.push(r.msg_ids[0].to_string());
    }
    ids
}

/// Makes everything written durable, dispatched and checkpointed (what retention may
/// delete).
async fn settle(store: &Store) {
    store.flush().await.unwrap();
    store.wait_dispatched().await;
    store.checkpoint().await.unwrap();
}

fn segments(root: &Path) -> Vec<u64> {
    let mut v: Vec<u64> = std::fs::read_dir(root.join("commitlog"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    v.sort();
    v
}

fn files_in(dir: &Path) -> usize {
    std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0)
}

/// Old data in segments 0-2, young data after: a manual pass deletes exactly the
/// expired segments, oldest first, and everything that follows the new minimum does
/// (queue files, queue minimum, OffsetTooSmall with the next begin offset, key
/// queries and look-ups find nothing deleted, index files go), and so after reopening.
#[test]
fn expired_segments_go_oldest_first_and_reads_follow_the_new_minimum() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    common::run(move || async move {
        let mut c = cfg(&root);
        c.index_max_entries = 600;
        let store = Store::open(c.clone()).await.unwrap();
        // ~3.5 segments of old messages.
        let old = put_n(&store, "T", 0, 0, 1800).await;
        settle(&store).await;
        std::thread::sleep(Duration::from_millis(1600));
        let young = put_n(&store, "T", 0, 1800, 1000).await;
        settle(&store).await;
        let before = segments(&root);
        assert!(before.len() >= 5, "{before:?}");
        let cq_dir = root.join("consumequeue/T/0");
        let (cq_before, ix_before) = (files_in(&cq_dir), files_in(&root.join("index")));
        assert!(cq_before >= 2 && ix_before >= 3, "{cq_before} {ix_before}");

        let rep = store.delete_expired_files().await.unwrap();
        // A second pass finds nothing more to delete (the rest is young).
        let again = store.delete_expired_files().await.unwrap();
        assert_eq!(again.expired_segments + again.forced_segments, 0);
        let after = segments(&root);
        // Segment k is expired when segment k+1 begins with an old record: the old
        // messages fill segments 0..=2 and part of 3, whose next segment starts young.
        assert_eq!(rep.expired_segments, 3, "{rep:?} {before:?}");
        assert_eq!(rep.forced_segments, 0);
        assert_eq!(after, before[3..].to_vec(), "oldest first");
        assert_eq!(store.min_log_offset(), after[0]);
        assert_eq!(rep.log_min, after[0]);
        assert!(rep.queue_files >= 1, "{rep:?}");
        assert!(files_in(&cq_dir) < cq_before);
        assert!(rep.index_files >= 1, "{rep:?}");
        assert!(files_in(&root.join("index")) < ix_before);

        check_after_deletion(&store, &old, &young).await;
        store.shutdown().await.unwrap();

        let store = Store::open(c).await.unwrap();
        assert_eq!(segments(&root)[0], after[0]);
        check_after_deletion(&store, &old, &young).await;
        store.shutdown().await.unwrap();
    });
}

async fn check_after_deletion(store: &Store, old: &[String], young: &[String]) {
    let min = store.min_queue_offset("T", 0);
    assert!(min > 0 && min < 1800, "queue minimum {min}");
    // Every entry from the minimum on is readable; below it, OffsetTooSmall with the
    // minimum as the next begin offset (RocketMQ's rule).
    for below in [0, min / 2, min - 1] {
        let r = store.get("T", 0, below, 8, 1 << 20).await.unwrap();
        assert_eq!(r.status, GetStatus::OffsetTooSmall, "get at {below}");
        assert_eq!(r.next_begin_offset, min);
    }
    let all = common::read_all(store, "T", 0).await;
    assert_eq!(all.len() as u64, 2800 - min);
    for (k, m) in all.iter().enumerate() {
        assert_eq!(m.body[..8], (min + k as u64).to_be_bytes());
        assert!(m.log_offset >= store.min_log_offset());
    }
    // Look-ups and key queries: nothing below the log's minimum, everything above.
    for (i, id) in old.iter().enumerate() {
        let found = store.look_by_msg_id(id).await.unwrap();
        assert_eq!(found.is_some(), (i as u64) >= min, "message {i}");
    }
    for i in [0u64, 1, min.saturating_sub(1), min, 1799] {
        let hits = store
            .query_by_key("T", &format!("k{i}"), 8, 0, i64::MAX)
            .await
            .unwrap();
        assert_eq!(hits.len(), (i >= min) as usize, "key k{i}");
    }
    for id in young.iter().step_by(97) {
        assert!(store.look_by_msg_id(id).await.unwrap().is_some());
    }
}

/// The time rule needs the hour (or the disk over 75%, or a manual request): a
/// background pass at another hour deletes nothing; the same store with the hour
/// deletes what expired. Nothing young goes, whatever the hour.
#[test]
fn the_time_rule_waits_for_the_hour_and_never_takes_young_segments() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    common::run(move || async move {
        let mut c = cfg(&root);
        c.retention.delete_when = other_hour();
        c.retention.clean_interval = Duration::from_millis(30);
        let store = Store::open(c.clone()).await.unwrap();
        put_n(&store, "T", 0, 0, 1800).await;
        settle(&store).await;
        std::thread::sleep(Duration::from_millis(1600));
        put_n(&store, "T", 0, 1800, 600).await;
        settle(&store).await;
        glommio::timer::sleep(Duration::from_millis(300)).await;
        let st = store.retention_stats();
        assert!(st.passes >= 3, "background passes ran: {st:?}");
        assert_eq!(segments(&root)[0], 0, "not the hour: nothing deleted");
        store.shutdown().await.unwrap();

        // Young data only, at the hour: nothing goes either.
        let mut c2 = cfg(&root);
        c2.retention.file_reserved_time = Duration::from_secs(3600);
        c2.retention.clean_interval = Duration::from_millis(30);
        let store = Store::open(c2).await.unwrap();
        glommio::timer::sleep(Duration::from_millis(300)).await;
        assert_eq!(segments(&root)[0], 0, "young: nothing deleted");
        store.shutdown().await.unwrap();

        // At the hour, the background deletes what expired.
        let mut c3 = cfg(&root);
        c3.retention.clean_interval = Duration::from_millis(30);
        let store = Store::open(c3).await.unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while segments(&root)[0] == 0 && std::time::Instant::now() < deadline {
            glommio::timer::sleep(Duration::from_millis(20)).await;
        }
        glommio::timer::sleep(Duration::from_millis(100)).await;
        assert_eq!(segments(&root)[0], 3 << 20);
        assert_eq!(store.retention_stats().expired_segments, 3);
        store.shutdown().await.unwrap();
    });
}

/// `delete_file_batch_max` bounds a pass; the segment being written is never deleted,
/// nor anything the last checkpoint does not cover, even when everything is expired.
#[test]
fn batches_and_the_limits_no_rule_passes() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    common::run(move || async move {
        let mut c = cfg(&root);
        c.retention.delete_file_batch_max = 2;
        // No background checkpoint: the test decides what it covers.
        c.consume_queue_flush_interval = Duration::from_secs(3600);
        let store = Store::open(c.clone()).await.unwrap();
        put_n(&store, "T", 0, 0, 1500).await;
        settle(&store).await;
        let covered = store.max_log_offset();
        put_n(&store, "T", 0, 1500, 1500).await;
        store.flush().await.unwrap();
        store.wait_dispatched().await;
        std::thread::sleep(Duration::from_millis(1600));
        // Everything is expired now, but the checkpoint covers only `covered`.
        let rep = store.delete_expired_files().await.unwrap();
        assert_eq!(rep.expired_segments, 2, "batch max");
        let rep = store.delete_expired_files().await.unwrap();
        let min = store.min_log_offset();
        assert!(
            min <= covered,
            "deleted past the checkpoint: {min} > {covered} ({rep:?})"
        );
        assert_eq!(
            min,
            covered / (1 << 20) * (1 << 20),
            "up to the covered segment"
        );
        settle(&store).await;
        for _ in 0..10 {
            store.delete_expired_files().await.unwrap();
        }
        // All expired and covered: everything goes but the segment being written.
        let w = store.max_log_offset();
        assert_eq!(store.min_log_offset(), w / (1 << 20) * (1 << 20));
        assert_eq!(segments(&root)[0], store.min_log_offset());
        // Puts and reads go on.
        put_n(&store, "T", 0, 3000, 10).await;
        store.wait_dispatched().await;
        let got = common::read_all(&store, "T", 0).await;
        assert!(!got.is_empty());
        assert_eq!(got.last().unwrap().body[..8], 3009u64.to_be_bytes());
        store.shutdown().await.unwrap();
        let store = Store::open(c).await.unwrap();
        assert_eq!(common::read_all(&store, "T", 0).await.len(), got.len());
        store.shutdown().await.unwrap();
    });
}

/// With `keep_for_slaves`, nothing a connected slave has not reported is deleted; once
/// it reports further (or disconnects), it is.
#[test]
fn a_connected_slave_keeps_what_it_still_needs() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    common::run(move || async move {
        let store = Store::open(cfg(&root)).await.unwrap();
        put_n(&store, "T", 0, 0, 1500).await;
        settle(&store).await;
        std::thread::sleep(Duration::from_millis(1600));
        put_n(&store, "T", 0, 1500, 600).await;
        settle(&store).await;
        // A slave holding everything below 1 MiB - 1 still needs segment 0's last byte.
        let slave = store.slave_connected((1 << 20) - 1);
        store.delete_expired_files().await.unwrap();
        assert_eq!(store.min_log_offset(), 0, "segment 0 stays");
        // Another slave further behind holds everything back to it.
        let far = store.slave_connected(100);
        slave.report((2 << 20) + 5);
        store.delete_expired_files().await.unwrap();
        assert_eq!(store.min_log_offset(), 0, "the lowest slave counts");
        drop(far);
        store.delete_expired_files().await.unwrap();
        assert_eq!(
            store.min_log_offset(),
            2 << 20,
            "up to what the slave holds"
        );
        drop(slave);
        store.delete_expired_files().await.unwrap();
        assert_eq!(
            store.min_log_offset(),
            3 << 20,
            "no slave: expired segments go"
        );
        store.shutdown().await.unwrap();
    });
}

/// The space levels on a disk with a capacity: over 85% the oldest segments go even
/// though nothing is expired, only while the disk stays over the level; each crossing
/// is counted; over 75% (and under 85%) expired segments go at any hour, young ones
/// stay; under 75% at another hour nothing goes.
#[test]
fn space_levels_force_then_expire() {
    common::run(|| async {
        let disk = SimDisk::new();
        disk.set_capacity(Some(16 << 20));
        let mut c = cfg(Path::new("/sim/space"));
        c.disk = Disk::Sim(disk.clone());
        c.retention.delete_when = other_hour();
        c.retention.file_reserved_time = Duration::from_secs(3600);
        c.disk_min_free_bytes = Some(1 << 20);
        c.index_enable = false;
        c.disk_full_ratio = 0.90;
        c.retention.disk_max_used_space_ratio = 0.75;
        c.retention.disk_clean_forcibly_ratio = 0.85;
        let store = Store::open(c.clone()).await.unwrap();
        let used = |d: &SimDisk| {
            let (t, a) = d.space().unwrap();
            (t - a) as f64 / t as f64
        };
        // Fill to just over 85% (segments are allocated whole: 1 MiB each).
        let mut i = 0;
        while used(&disk) < 0.86 {
            put_n(&store, "T", 0, i, 100).await;
            i += 100;
        }
        settle(&store).await;
        let n_before = store.max_queue_offset("T", 0);
        let rep = store.delete_expired_files().await.unwrap();
        assert!(rep.forced_segments >= 1, "{rep:?}");
        assert_eq!(rep.expired_segments, 0);
        assert!(
            used(&disk) < 0.85,
            "forced only down to the level: {}",
            used(&disk)
        );
        assert!(used(&disk) > 0.75, "no more than needed: {}", used(&disk));
        let st = store.retention_stats();
        assert_eq!(st.level_rises[2], 1, "one rise into clean_forcibly: {st:?}");
        assert_eq!(st.level_rises[1], 1, "and through over_max_used");
        // Over 75%, young data: nothing goes.
        let rep = store.delete_expired_files().await.unwrap();
        assert_eq!(rep.forced_segments + rep.expired_segments, 0, "{rep:?}");
        assert_eq!(store.max_queue_offset("T", 0), n_before);
        assert!(store.min_queue_offset("T", 0) > 0);
        store.shutdown().await.unwrap();
    });
}

#[cfg(feature = "tools")]
fn inspect_clean(root: &Path) {
    let rep = coremq::tools::inspect::check(root).unwrap();
    assert!(rep.is_clean(), "inspect check: {:?}", rep.problems);
}
#[cfg(not(feature = "tools"))]
fn inspect_clean(_: &Path) {}

/// Delete topic: its queues go at once (gets answer no queue, key queries find
/// nothing), other topics stay, its records stay in the log (a look-up by id still
/// finds them, as in RocketMQ) until retention; after reopening, also with the
/// queues rebuilt from the whole log (checkpoint lost), it stays deleted; made again,
/// it starts at queue offset 0.
#[test]
fn delete_topic_removes_its_queues_for_good() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    common::run(move || async move {
        let c = cfg(&root);
        let store = Store::open(c.clone()).await.unwrap();
        let t1 = put_n(&store, "T1", 0, 0, 300).await;
        put_n(&store, "T1", 1, 300, 300).await;
        let t2 = put_n(&store, "T2", 0, 0, 300).await;
        assert_eq!(store.delete_topic("T1").await.unwrap(), 2);
        assert_eq!(store.delete_topic("T1").await.unwrap(), 0, "already gone");
        assert!(!root.join("consumequeue/T1").exists());
        let check = |store: Store| async move {
            for q in [0, 1] {
                let r = store.get("T1", q, 0, 8, 1 << 20).await.unwrap();
                assert_eq!(r.status, GetStatus::NoMatchedLogicQueue);
            }
            let hits = store
                .query_by_key("T1", "k5", 8, 0, i64::MAX)
                .await
                .unwrap();
            assert!(hits.is_empty(), "deleted topic's key found");
            assert_eq!(common::read_all(&store, "T2", 0).await.len(), 300);
            assert_eq!(
                store
                    .query_by_key("T2", "k5", 8, 0, i64::MAX)
                    .await
                    .unwrap()
                    .len(),
                1
            );
            store
        };
        let store = check(store).await;
        assert!(store.look_by_msg_id(&t1[3]).await.unwrap().is_some());
        assert_eq!(store.deleted_topics().len(), 1);
        store.shutdown().await.unwrap();
        inspect_clean(&root);

        let store = check(Store::open(c.clone()).await.unwrap()).await;
        store.shutdown().await.unwrap();
        // The queues rebuilt from the whole log: T1's records stay out.
        std::fs::remove_file(root.join("checkpoint")).unwrap();
        std::fs::remove_dir_all(root.join("consumequeue/T2")).unwrap();
        let store = check(Store::open(c.clone()).await.unwrap()).await;
        // Made again: new queues from offset 0.
        let r = store
            .put(Message::new("T1", 0, "again").with_keys("k5"))
            .await;
        assert_eq!((r.status, r.queue_offset), (PutStatus::PutOk, 0));
        store.wait_dispatched().await;
        let got = common::read_all(&store, "T1", 0).await;
        assert_eq!(got.len(), 1);
        assert_eq!(&got[0].body[..], b"again");
        let hits = store
            .query_by_key("T1", "k5", 8, 0, i64::MAX)
            .await
            .unwrap();
        assert_eq!(hits.len(), 1, "only the new message");
        store.shutdown().await.unwrap();
        inspect_clean(&root);
        let store = Store::open(c.clone()).await.unwrap();
        assert_eq!(common::read_all(&store, "T1", 0).await.len(), 1);
        assert!(store.look_by_msg_id(&t2[0]).await.unwrap().is_some());
        store.shutdown().await.unwrap();
    });
}

/// Retention forgets a deleted topic once every record it hid is gone.
#[test]
fn deleted_topics_are_forgotten_once_their_records_are_gone() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    common::run(move || async move {
        let store = Store::open(cfg(&root)).await.unwrap();
        put_n(&store, "Gone", 0, 0, 1000).await;
        store.delete_topic("Gone").await.unwrap();
        put_n(&store, "Old", 0, 0, 1000).await;
        settle(&store).await;
        std::thread::sleep(Duration::from_millis(1600));
        put_n(&store, "Live", 0, 0, 700).await;
        settle(&store).await;
        assert_eq!(store.deleted_topics().len(), 1);
        let rep = store.delete_expired_files().await.unwrap();
        assert!(rep.log_min > 1000 * 2100, "{rep:?}");
        assert!(store.deleted_topics().is_empty());
        store.shutdown().await.unwrap();
        inspect_clean(&root);
    });
}

/// `cleanUnusedTopic`: topics not kept go, system, retry and dead-letter topics stay.
#[test]
fn clean_unused_topics_keeps_what_is_listed_and_system_topics() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    common::run(move || async move {
        let store = Store::open(cfg(&root)).await.unwrap();
        for t in [
            "Keep",
            "Drop1",
            "Drop2",
            "%RETRY%G",
            "%DLQ%G",
            "SCHEDULE_TOPIC_XXXX",
        ] {
            put_n(&store, t, 0, 0, 3).await;
        }
        let keep = ["Keep".to_string()].into_iter().collect();
        let gone = store.clean_unused_topics(&keep).await.unwrap();
        assert_eq!(gone, vec!["Drop1".to_string(), "Drop2".to_string()]);
        let mut left = store.queues();
        left.sort();
        let names: Vec<&str> = left.iter().map(|(t, _)| t.as_str()).collect();
        assert_eq!(names, ["%DLQ%G", "%RETRY%G", "Keep", "SCHEDULE_TOPIC_XXXX"]);
        store.shutdown().await.unwrap();
        inspect_clean(&root);
    });
}
